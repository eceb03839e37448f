"""The control plane (PPipe §3, §5.3, App. A.2): a MILP over pool pipelines, on HiGHS.

For each model it chooses partition points among the blocks, the device type and virtual
fraction (1/1 .. 1/4) of each partition's pool, the unified batch size of the pipeline and
how many virtual devices each pool gets, maximising the served rate under each model's
SLO minus a margin.

Formulation. The paper's binaries ``p[l,d,v,b,i,j]`` select one (cut, fraction, batch) per
partition of a pipeline template; an equivalent and much smaller model enumerates those
choices as *columns* up front (a column: one model, cut points, a type and fraction per
partition, one batch size) and keeps only the columns that (a) fit the latency budget
(eq. 27: compute plus feature-map transfers) and (b) are Pareto-optimal in the physical
devices of each type they need per unit of rate: a dominated column can always be
replaced by its dominator in any solution. The MILP then has, per kept column ``c``, a
rate ``x_c >= 0`` and an integer count ``g_{c,d}`` of virtual devices per partition with
``x_c <= X_{c,d} g_{c,d}`` (eq. 24/28: a pipeline runs at its slowest pool); per type
``k`` and fraction ``v`` an integer count ``h_{k,v}`` of physical devices split ``v``
ways, ``sum g <= v h_{k,v}`` and ``sum_v h_{k,v} <= N_k`` (eq. 23, exact packing). The
objective is the largest ``lambda`` with every model served at ``>= w_m lambda`` (the
offered mix scaled), plus a small reward for any further rate.

It runs off the request path: the data plane (:mod:`.reservation`) keeps serving the old
plan until a migration switches (see :mod:`.executor`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from av_infer.errors import InvalidParameterError
from av_infer.pipeline.cluster import Cluster
from av_infer.pipeline.errors import InfeasibleSloError
from av_infer.profiles import BlockProfile

#: PPipe §7.1: 40 % of the SLO is kept back for batching, queueing and contention delays
DEFAULT_MARGIN = 0.4
#: PPipe §7.1: an SLO of 5x the model's batch-1 latency on the fastest device
SLO_FACTOR = 5.0
DEFAULT_MAX_PARTITIONS = 3
#: wall-time budget of one plan (enumeration + MILP); HiGHS stops at what is left of it
#: with its best solution and the gap it proved (the issue asks <= 5 s)
DEFAULT_TIME_LIMIT_S = 4.5


@dataclass
class StagePlan:
    """One partition of a pipeline: blocks ``[first, end)`` on a pool of ``count``
    virtual devices, each ``1/v`` of a device of ``device_type``."""

    first: int
    end: int
    device_type: str
    v: int
    count: int
    latency_us: float  # one batch through this partition
    rate_per_member: float  # requests/s one virtual device sustains at the batch size
    transfer_us: float = 0.0  # feature map to the next stage (0 for the last)
    members: list[str] = field(default_factory=list)  # virtual device ids


@dataclass
class PipelinePlan:
    """A pooled pipeline of one model at one unified batch size."""

    model: str
    batch: int
    stages: list[StagePlan]
    rate: float  # planned requests/s

    @property
    def latency_us(self) -> float:
        return sum(s.latency_us + s.transfer_us for s in self.stages)


@dataclass
class ClusterPlan:
    """The MILP's answer: pipelines per model, SLOs, predicted rates, solve time."""

    cluster: str
    slo_ms: dict[str, float]
    margin: float
    max_partitions: int
    pipelines: list[PipelinePlan]
    rate: dict[str, float]
    solve_s: float
    columns: int
    status: str
    mip_gap: float
    physical: dict[str, list[int]] = field(default_factory=dict)  # type -> v of each device
    fp16_boundaries: bool = False  # feature maps between stages travel as float16

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for p, pd in zip(self.pipelines, d["pipelines"]):
            pd["latency_ms"] = p.latency_us / 1e3
        d["total_rate"] = sum(self.rate.values())
        return d


@dataclass
class _Column:
    model: str
    batch: int
    cuts: tuple[int, ...]  # 0 = c0 < c1 < ... < cD = N
    types: tuple[str, ...]
    vs: tuple[int, ...]
    lat: tuple[float, ...]
    xfer: tuple[float, ...]
    rate_per: tuple[float, ...]  # req/s per virtual device of each partition


def standalone_us(profile: BlockProfile) -> float:
    """Batch-1 latency of the whole model on a whole device."""
    return float(sum(profile.latency(1, 1)))


def default_slos(profiles: Mapping[str, Mapping[str, BlockProfile]],
                 factor: float = SLO_FACTOR) -> dict[str, float]:
    """SLO (ms) per model: ``factor`` x its batch-1 latency on its fastest type."""
    return {m: factor * min(standalone_us(p) for p in by_type.values()) / 1e3
            for m, by_type in profiles.items()}


def _transfer_us(nbytes: float, gbps: float, link_us: float) -> float:
    return link_us + nbytes * 8 / (gbps * 1e3)


def enumerate_columns(model: str, by_type: Mapping[str, BlockProfile], cluster: Cluster,
                      budget_us: float, max_partitions: int, fp16_boundaries: bool,
                      min_partitions: int = 1) -> tuple[list[_Column], float]:
    """Every latency-feasible column of ``model`` that no other column dominates in
    devices-per-rate, and the best latency seen (for the infeasibility message)."""
    types = [t for t in cluster.types if t.name in by_type]
    first = by_type[types[0].name]
    nb = len(first.blocks)
    batches = sorted(set.intersection(*(set(by_type[t.name].batches) for t in types)))
    scale = 0.5 if fp16_boundaries else 1.0
    best_lat = math.inf
    cols: list[_Column] = []
    for b in batches:
        # prefix sums per (type, v): lat of blocks [i, j) = pre[j] - pre[i]
        pre = {(t.name, v): np.concatenate(([0.0], np.cumsum(by_type[t.name].latency(v, b))))
               for t in types for v in by_type[t.name].vfracs}
        for d in range(min_partitions, max_partitions + 1):
            for seq in itertools.product(types, repeat=d):
                if min_partitions == 1 and any(a.name == c.name for a, c in zip(seq, seq[1:])):
                    continue  # two pools of one type in a row are no better than one
                for inner in itertools.combinations(range(1, nb), d - 1):
                    cuts = (0, *inner, nb)
                    xfer = tuple(
                        _transfer_us(first.out_bytes[cuts[s + 1] - 1] * b * scale,
                                     min(seq[s].link_gbps, seq[s + 1].link_gbps),
                                     max(seq[s].link_us, seq[s + 1].link_us))
                        for s in range(d - 1)) + (0.0,)
                    options = [[(v, float(pre[(t.name, v)][cuts[s + 1]]
                                          - pre[(t.name, v)][cuts[s]]))
                                for v in by_type[t.name].vfracs] for s, t in enumerate(seq)]
                    for choice in itertools.product(*options):
                        lat = tuple(x[1] for x in choice)
                        total = sum(lat) + sum(xfer)
                        best_lat = min(best_lat, total)
                        if total > budget_us:
                            continue
                        vs = tuple(x[0] for x in choice)
                        cols.append(_Column(model, b, cuts, tuple(t.name for t in seq), vs,
                                            lat, xfer, _rates(b, lat, xfer, vs)))
    return _pareto(cols, [t.name for t in types]), best_lat


def _rates(b: int, lat: Sequence[float], xfer: Sequence[float], vs: Sequence[int]
           ) -> tuple[float, ...]:
    """Requests/s one virtual device of each partition sustains: its compute, capped by
    its physical device's links, which its ``v`` co-tenants share (uplink: sending to the
    next stage; downlink: receiving from the previous one)."""
    out = []
    for d, (li, v) in enumerate(zip(lat, vs)):
        r = b * 1e6 / max(1e-9, li)
        if d + 1 < len(lat) and xfer[d] > 0:
            r = min(r, b * 1e6 / (v * xfer[d]))
        if d > 0 and xfer[d - 1] > 0:
            r = min(r, b * 1e6 / (v * xfer[d - 1]))
        out.append(r)
    return tuple(out)


def _pareto(cols: list[_Column], type_names: list[str]) -> list[_Column]:
    """Columns not dominated in physical devices of each type per unit of rate."""
    if not cols:
        return cols
    idx = {t: i for i, t in enumerate(type_names)}
    cost = np.zeros((len(cols), len(type_names)))
    for r, c in enumerate(cols):
        for t, v, x in zip(c.types, c.vs, c.rate_per):
            cost[r, idx[t]] += 1.0 / (v * x)
    cost = np.round(cost, 12)
    order = np.lexsort(cost.T[::-1])
    front = np.empty((0, cost.shape[1]))
    keep = []
    for r in order:
        p = cost[r]
        if front.shape[0] and np.any(np.all(front <= p, axis=1)):
            continue
        front = np.vstack([front, p])
        keep.append(r)
    return [cols[r] for r in sorted(keep)]


def plan_cluster(profiles: Mapping[str, Mapping[str, BlockProfile]], cluster: Cluster,
                 slo_ms: Mapping[str, float] | None = None,
                 margin: float = DEFAULT_MARGIN,
                 max_partitions: int = DEFAULT_MAX_PARTITIONS,
                 weights: Mapping[str, float] | None = None,
                 fp16_boundaries: bool = False,
                 time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                 min_partitions: int = 1, slo_factor: float = SLO_FACTOR) -> ClusterPlan:
    """Solve the MILP for ``profiles`` (``{model: {type: BlockProfile}}``) on ``cluster``.

    ``min_partitions`` > 1 plans only pipelines of at least that many stages (to run a
    pipeline on purpose, e.g. the cross-process demo). Raises InfeasibleSloError naming
    the model when no column meets its SLO minus ``margin``, or when the cluster cannot
    give every model a pipeline; the arguments are validated before any work.
    """
    if not (isinstance(margin, (int, float)) and 0 <= margin < 1):
        raise InvalidParameterError(f"margin must be in [0, 1), got {margin!r}")
    if isinstance(max_partitions, bool) or not isinstance(max_partitions, int) \
            or max_partitions < 1:
        raise InvalidParameterError(f"max_partitions must be an int >= 1, got {max_partitions!r}")
    if isinstance(min_partitions, bool) or not isinstance(min_partitions, int) \
            or not 1 <= min_partitions <= max_partitions:
        raise InvalidParameterError(
            f"min_partitions must be an int in 1..max_partitions, got {min_partitions!r}")
    if not profiles:
        raise InvalidParameterError("no models to plan")
    if not (isinstance(slo_factor, (int, float)) and math.isfinite(slo_factor)
            and slo_factor > 0):
        raise InvalidParameterError(f"slo_factor must be a number > 0, got {slo_factor!r}")
    slos = dict(default_slos(profiles, slo_factor))
    for m, s in (slo_ms or {}).items():
        if m not in profiles:
            raise InvalidParameterError(f"SLO given for {m!r}, which is not a planned model")
        if not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0):
            raise InvalidParameterError(f"SLO of {m!r} must be a number of ms > 0, got {s!r}")
        slos[m] = float(s)
    w = {m: float((weights or {}).get(m, 1.0)) for m in profiles}
    if any(not (x > 0 and math.isfinite(x)) for x in w.values()):
        raise InvalidParameterError(f"weights must be finite and > 0, got {w}")
    t0 = time.perf_counter()
    columns: list[_Column] = []
    for m, by_type in profiles.items():
        budget = slos[m] * 1e3 * (1 - margin)
        cols, best = enumerate_columns(m, by_type, cluster, budget, max_partitions,
                                       fp16_boundaries, min_partitions)
        if not cols:
            raise InfeasibleSloError(
                f"model {m!r}: no partitioning, pool and batch size on {cluster.spec()} "
                f"finishes within its SLO {slos[m]:.2f} ms minus the {margin:.0%} margin "
                f"({budget / 1e3:.2f} ms); the fastest takes {best / 1e3:.2f} ms")
        columns.extend(cols)
    start = None
    if any(len(c.types) > 1 for c in columns):
        # warm start from the best whole-model plan (a quick, small MILP): a time-limited
        # solve then never returns less than no partitioning would
        single = [c for c in columns if len(c.types) == 1]
        if single and {c.model for c in single} == set(profiles):
            base, _ = _solve(single, cluster, w, max(0.2, float(time_limit_s) / 4))
            start = {id(c): (x, g) for c, x, g in zip(single, base["x"], base["g"])}
            start["h"] = base["h"]
            start["lam"] = base["lam"]
    left = max(0.5, float(time_limit_s) - (time.perf_counter() - t0))
    sol, status = _solve(columns, cluster, w, left, start)
    solve_s = time.perf_counter() - t0
    pipelines, rate = _read(columns, sol, profiles)
    starved = [m for m in profiles if rate.get(m, 0.0) <= 0]
    if starved:
        raise InfeasibleSloError(
            f"cluster {cluster.spec()} cannot give every model a pipeline within its SLO: "
            f"no rate for {', '.join(starved)} (MILP status {status}; a virtual device "
            f"serves one partition, so {len(profiles)} models need at least "
            f"{len(profiles)} of them)")
    physical = _assign(pipelines, sol["h"], cluster)
    return ClusterPlan(cluster.spec(), slos, float(margin), max_partitions, pipelines, rate,
                       solve_s, len(columns), status, sol["gap"], physical,
                       bool(fp16_boundaries))


def _solve(columns: list[_Column], cluster: Cluster, w: Mapping[str, float],
           time_limit_s: float, start: Mapping[Any, Any] | None = None
           ) -> tuple[dict[str, Any], str]:
    """Build and run the MILP of the module docstring; ``start``: a feasible solution
    (``{id(column): (x, g)}`` plus ``"h"`` and ``"lam"``) to begin from."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", 1e-2)
    h.setOptionValue("threads", 1)
    inf = highspy.kHighsInf
    lb: list[float] = []
    ub: list[float] = []
    cost: list[float] = []
    integer: list[int] = []

    def var(lo: float, hi: float, c: float, is_int: bool) -> int:
        lb.append(lo)
        ub.append(hi)
        cost.append(c)
        if is_int:
            integer.append(len(lb) - 1)
        return len(lb) - 1

    lam = var(0.0, inf, 1.0, False)
    eps = 1e-3 / max(1.0, len(w))
    x = [var(0.0, inf, eps / sum(w.values()), False) for _ in columns]
    g = [[var(0.0, cluster.count(t) * v, 0.0, True) for t, v in zip(c.types, c.vs)]
         for c in columns]
    pairs = sorted({(t, v) for c in columns for t, v in zip(c.types, c.vs)})
    hv = {p: var(0.0, cluster.count(p[0]), 0.0, True) for p in pairs}
    rows: list[tuple[float, float, list[int], list[float]]] = []
    for ci, c in enumerate(columns):
        for d, rp in enumerate(c.rate_per):  # x_c <= X_{c,d} g_{c,d}
            rows.append((-inf, 0.0, [x[ci], g[ci][d]], [1.0, -rp]))
    for (t, v), hi in hv.items():  # virtual devices fit the physical ones split v ways
        idx = [g[ci][d] for ci, c in enumerate(columns)
               for d, (tt, vv) in enumerate(zip(c.types, c.vs)) if (tt, vv) == (t, v)]
        rows.append((-inf, 0.0, [*idx, hi], [1.0] * len(idx) + [-float(v)]))
    for t, n in cluster.counts:
        idx = [hi for (tt, _), hi in hv.items() if tt == t]
        if idx:
            rows.append((-inf, float(n), idx, [1.0] * len(idx)))
    for m, wm in w.items():  # every model at >= w_m lambda
        idx = [x[ci] for ci, c in enumerate(columns) if c.model == m]
        rows.append((0.0, inf, [*idx, lam], [1.0] * len(idx) + [-wm]))
    n = len(lb)
    h.addVars(n, np.array(lb), np.array(ub))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(cost))
    if integer:
        h.changeColsIntegrality(len(integer), np.array(integer, dtype=np.int32),
                                np.array([highspy.HighsVarType.kInteger] * len(integer)))
    starts, index, value = [], [], []
    for _, _, ix, vals in rows:
        starts.append(len(index))
        index.extend(ix)
        value.extend(vals)
    h.addRows(len(rows), np.array([r[0] for r in rows]), np.array([r[1] for r in rows]),
              len(index), np.array(starts, dtype=np.int32), np.array(index, dtype=np.int32),
              np.array(value))
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    if start is not None:
        init = np.zeros(n)
        init[lam] = start["lam"]
        for ci, c in enumerate(columns):
            if id(c) in start:
                xv, gv = start[id(c)]
                init[x[ci]] = xv
                for j, gd in zip(g[ci], gv):
                    init[j] = gd
        for p, i in hv.items():
            init[i] = start["h"].get(p, 0)
        hs = highspy.HighsSolution()
        hs.col_value = list(init)
        hs.value_valid = True
        h.setSolution(hs)
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    vals = np.array(h.getSolution().col_value) if h.getInfo().primal_solution_status else \
        np.zeros(n)
    return {"x": [vals[i] for i in x], "g": [[int(round(vals[j])) for j in gs] for gs in g],
            "h": {p: int(round(vals[i])) for p, i in hv.items()}, "lam": float(vals[lam]),
            "gap": float(h.getInfo().mip_gap)}, status


def _read(columns: list[_Column], sol: dict[str, Any],
          profiles: Mapping[str, Mapping[str, BlockProfile]]
          ) -> tuple[list[PipelinePlan], dict[str, float]]:
    pipelines = []
    rate: dict[str, float] = {m: 0.0 for m in profiles}
    for c, xc, gs in zip(columns, sol["x"], sol["g"]):
        if xc <= 1e-6 or min(gs) < 1:
            continue
        r = min(rp * gd for rp, gd in zip(c.rate_per, gs))
        stages = [StagePlan(c.cuts[d], c.cuts[d + 1], c.types[d], c.vs[d], gs[d], c.lat[d],
                            c.rate_per[d], c.xfer[d]) for d in range(len(c.types))]
        pipelines.append(PipelinePlan(c.model, c.batch, stages, r))
        rate[c.model] += r
    return pipelines, rate


def _assign(pipelines: Sequence[PipelinePlan], hv: Mapping[tuple[str, int], int],
            cluster: Cluster) -> dict[str, list[int]]:
    """Name the virtual devices: physical device ``type#i`` split ``v`` ways gives
    ``type#i/v.s``; pools take them in order. Returns each physical device's split."""
    free: dict[tuple[str, int], list[str]] = {}
    physical: dict[str, list[int]] = {t: [] for t, _ in cluster.counts}
    for (t, v), n in sorted(hv.items()):
        for _ in range(n):
            i = len(physical[t])
            physical[t].append(v)
            free.setdefault((t, v), []).extend(f"{t}#{i}/{v}.{s}" for s in range(v))
    for p in pipelines:
        for s in p.stages:
            pool = free.get((s.device_type, s.v), [])
            s.members, free[(s.device_type, s.v)] = pool[:s.count], pool[s.count:]
    return physical
