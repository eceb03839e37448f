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
``k`` and *pattern* ``p`` (a set of slices that fits one device, e.g. 1/2 + 1/4 + 1/4) an
integer count ``h_{k,p}`` of physical devices cut that way, with the slices of each
fraction covering the virtual devices that use it and ``sum_p h_{k,p} <= N_k`` (eq. 23,
exact packing: every plan can be laid out on real devices; see ``packing``). The
objective is the largest ``lambda`` with every model served at ``>= w_m lambda`` (the
offered mix scaled), plus a small reward for any further rate.

PPipe's rules, as parameters of :func:`plan_cluster` (docs/pipeline.md, "PPipe's rules"):

* ``server_link_sharing``: a feature map leaves and enters through its *server's* link,
  shared by every virtual device of every GPU on that server, so one virtual device of a
  ``1/v`` split on a server of ``s`` GPUs gets ``1/(v s)`` of it (PPipe's reference MILP;
  off: ``1/v``, the GPU's own slices only);
* ``batch_fill_factor`` (PPipe: 1.3): the time to fill a batch, ``factor (b - 1) / rate``
  with ``rate`` the model's expected arrival rate, counts against the latency budget;
* per-fraction batch lists: a (fraction, batch) cell that was not measured is never used;
* ``packing``: ``"mixed"`` (default): a device is cut into slices of any fractions that
  fit it (1/2 + 1/4 + 1/4), serving any partitions. ``"ppipe"``: a device serves one
  partition index (first, second, ... partition of its pipelines) of one type; PPipe's
  reference counts ``sum g / v`` per type and partition index rounded up, and these plans
  always fit that count while staying realisable. ``"pure"``: a device is cut into ``v``
  equal slices for one ``v`` (the planner before issue 32);
* ``same_type_partitions``: consecutive partitions on one device type at *different*
  fractions (A 1/1 -> A 1/2) are planned; same type and same fraction is always dominated
  by merging the two partitions (block latencies add; the merged pool's rate is the
  mediant) and is skipped.

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
from av_infer.pipeline.profile_files import batches_at
from av_infer.profiles import BlockProfile

#: PPipe §7.1: 40 % of the SLO is kept back for batching, queueing and contention delays
DEFAULT_MARGIN = 0.4
#: PPipe §7.1: an SLO of 5x the model's batch-1 latency on the fastest device
SLO_FACTOR = 5.0
DEFAULT_MAX_PARTITIONS = 3
#: wall-time budget of one plan (enumeration + MILP); HiGHS stops at what is left of it
#: with its best solution and the gap it proved (the issue asks <= 5 s)
DEFAULT_TIME_LIMIT_S = 4.5
#: PPipe's reference MILP: a batch of b takes about 1.3 (b - 1) / rate to fill
PPIPE_BATCH_FILL_FACTOR = 1.3
PACKINGS = ("ppipe", "mixed", "pure")
#: HiGHS stops once its solution is proven within this of the optimum (or at the time
#: limit); 0.1 %: the 1 % it had before issue 32 is as large as the target margin
MIP_REL_GAP = 1e-3


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
    fill_us: float = 0.0  # batch-fill time the plan counted in the budget

    @property
    def latency_us(self) -> float:
        """Compute plus transfers (the batch-fill time is ``fill_us``, apart)."""
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
    #: type -> each device's cut: v (v equal slices) or the list of its slices' v
    physical: dict[str, list[Any]] = field(default_factory=dict)
    fp16_boundaries: bool = False  # feature maps between stages travel as float16
    rules: dict[str, Any] = field(default_factory=dict)  # the PPipe rules in force
    device_types: dict[str, Any] = field(default_factory=dict)  # source, links per type

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
    fill: float = 0.0  # batch-fill time counted in the budget (us)


def standalone_us(profile: BlockProfile) -> float:
    """Batch-1 latency of the whole model on a whole device (the smallest split and
    batch measured when 1/1 at batch 1 was not)."""
    v = 1 if 1 in profile.vfracs else min(profile.vfracs)
    return float(sum(profile.latency(v, min(batches_at(profile, v)))))


def default_slos(profiles: Mapping[str, Mapping[str, BlockProfile]],
                 factor: float = SLO_FACTOR) -> dict[str, float]:
    """SLO (ms) per model: ``factor`` x its batch-1 latency on its fastest type."""
    return {m: factor * min(standalone_us(p) for p in by_type.values()) / 1e3
            for m, by_type in profiles.items()}


def allowed_vfracs(profile: BlockProfile, dtype: Any, vfracs: Sequence[int] | None = None
                   ) -> list[int]:
    """The fractions of ``profile`` the planner may use on ``dtype``: profiled, listed in
    the type's ``fractions`` (cluster file) and in ``vfracs`` (the planner's argument)."""
    out = list(profile.vfracs)
    if getattr(dtype, "fractions", None):
        out = [v for v in out if v in dtype.fractions]
    if vfracs is not None:
        out = [v for v in out if v in vfracs]
    return out


def fill_us(factor: float, b: int, rate: float) -> float:
    """PPipe's batch-fill time (us) of a batch of ``b`` at ``rate`` requests/s."""
    if factor <= 0 or b <= 1 or not rate > 0 or math.isinf(rate):
        return 0.0
    return factor * 1e6 * (b - 1) / rate


def enumerate_columns(model: str, by_type: Mapping[str, BlockProfile], cluster: Cluster,
                      budget_us: float, max_partitions: int, fp16_boundaries: bool,
                      min_partitions: int = 1, *, server_link_sharing: bool = True,
                      batch_fill_factor: float = 0.0, fill_rate: float = math.inf,
                      same_type_partitions: bool = True,
                      vfracs: Sequence[int] | None = None) -> tuple[list[_Column], float]:
    """Every latency-feasible column of ``model`` that no other column dominates in
    devices-per-rate, and the best latency seen (for the infeasibility message).

    A column's latency is its partitions' compute plus the feature-map transfers plus,
    with ``batch_fill_factor``, the time to fill its batch at ``fill_rate``; a stage may
    only use a (fraction, batch) cell its type's profile measured."""
    types = [t for t in cluster.types if t.name in by_type]
    first = by_type[types[0].name]
    nb = len(first.blocks)
    opts = {t.name: allowed_vfracs(by_type[t.name], t, vfracs) for t in types}
    batches = sorted({b for t in types for v in opts[t.name]
                      for b in batches_at(by_type[t.name], v)})
    scale = 0.5 if fp16_boundaries else 1.0
    tix = {t.name: i for i, t in enumerate(types)}
    best_lat = math.inf
    # feasible candidates, vectorised over the fraction choices of one (batch, types,
    # cuts); _Column objects are made only for the Pareto-optimal ones
    found: list[tuple[Any, ...]] = []
    outb = np.asarray(first.out_bytes, dtype=float)
    for b in batches:
        fill = fill_us(batch_fill_factor, b, fill_rate)
        # prefix sums per (type, v) measured at b: lat of blocks [i, j) = pre[j] - pre[i]
        pre = {(t.name, v): np.concatenate(([0.0], np.cumsum(by_type[t.name].latency(v, b))))
               for t in types for v in opts[t.name] if b in batches_at(by_type[t.name], v)}
        for d in range(min_partitions, max_partitions + 1):
            for seq in itertools.product(types, repeat=d):
                same = [a.name == c.name for a, c in zip(seq, seq[1:])]
                if min_partitions == 1 and not same_type_partitions and any(same):
                    continue  # the rule is off: one type per run of partitions
                vopts = [[v for v in opts[t.name] if (t.name, v) in pre] for t in seq]
                if any(not o for o in vopts):
                    continue
                grid = np.array(list(itertools.product(*(range(len(o)) for o in vopts))),
                                dtype=np.int64).reshape(-1, d)
                vs = np.array([[vopts[s][k] for s, k in enumerate(row)] for row in grid],
                              dtype=np.int64).reshape(-1, d)
                keep = np.ones(len(grid), dtype=bool)
                if min_partitions == 1:
                    for s, sm in enumerate(same):
                        if sm:  # same type, same fraction: merging them is no worse
                            keep &= vs[:, s] != vs[:, s + 1]
                if not keep.any():
                    continue
                grid, vs = grid[keep], vs[keep]
                share = vs * np.array([t.gpus_per_server if server_link_sharing else 1
                                       for t in seq])
                prs = [np.stack([pre[(t.name, v)] for v in vopts[s]]) for s, t in enumerate(seq)]
                names = tuple(t.name for t in seq)
                # every cut combination at once: cutm[k] = (0, c1, ..., N)
                combos = list(itertools.combinations(range(1, nb), d - 1))
                if not combos:
                    continue  # fewer blocks than partitions
                inner = np.array(combos, dtype=np.int64).reshape(len(combos), d - 1)
                nk = len(inner)
                cutm = np.concatenate([np.zeros((nk, 1), np.int64), inner,
                                       np.full((nk, 1), nb, np.int64)], axis=1)
                xf = np.zeros((nk, d))  # transfer after each stage (the last: none)
                for s in range(d - 1):
                    xf[:, s] = (max(seq[s].link_us, seq[s + 1].link_us)
                                + outb[cutm[:, s + 1] - 1] * b * scale * 8
                                / (min(seq[s].link_gbps, seq[s + 1].link_gbps) * 1e3))
                lat = np.stack([(pr[:, cutm[:, s + 1]] - pr[:, cutm[:, s]]).T[:, grid[:, s]]
                                for s, pr in enumerate(prs)], axis=2)  # (cuts, choices, d)
                total = lat.sum(axis=2) + xf.sum(axis=1)[:, None] + fill
                best_lat = min(best_lat, float(total.min()))
                ki, ci = np.nonzero(total <= budget_us)
                if not len(ki):
                    continue
                lat_ok, vs_ok, sh_ok, xf_ok = lat[ki, ci], vs[ci], share[ci], xf[ki]
                rate = b * 1e6 / np.maximum(lat_ok, 1e-9)
                for s in range(d - 1):  # the links a transfer leaves and enters by
                    for st in (s, s + 1):
                        den = sh_ok[:, st] * xf_ok[:, s]
                        cap = np.where(den > 0, b * 1e6 / np.maximum(den, 1e-300), np.inf)
                        rate[:, st] = np.minimum(rate[:, st], cap)
                cost = np.zeros((len(ki), len(types)))
                for s, t in enumerate(names):
                    cost[:, tix[t]] += 1.0 / (vs_ok[:, s] * rate[:, s])
                found.append(((b, names, fill), cutm[ki], lat_ok, vs_ok, rate, cost, xf_ok))
    if not found:
        return [], best_lat
    costs = np.concatenate([f[5] for f in found])
    where = np.concatenate([np.stack([np.full(len(f[5]), i), np.arange(len(f[5]))], axis=1)
                            for i, f in enumerate(found)])
    cols = []
    for r in sorted(_pareto_rows(costs)):
        gi, k = where[r]
        (b, names, fill), cutm, lat_ok, vs_ok, rate, _, xf_ok = found[gi]
        cols.append(_Column(model, b, tuple(int(c) for c in cutm[k]), names,
                            tuple(int(v) for v in vs_ok[k]),
                            tuple(float(x) for x in lat_ok[k]),
                            tuple(float(x) for x in xf_ok[k]),
                            tuple(float(x) for x in rate[k]), fill))
    return cols, best_lat


def _pareto_rows(cost: np.ndarray, chunk: int = 256) -> list[int]:
    """Rows of ``cost`` (one per candidate: devices of each type per unit of rate) that no
    other row is <= in every coordinate (of equal rows the first is kept), vectorised in
    chunks of the lexicographic order: a dominator always comes first in it."""
    cost = np.round(cost, 12)
    order = np.lexsort(cost.T[::-1])
    front = np.empty((0, cost.shape[1]))
    keep: list[int] = []
    for a in range(0, len(order), chunk):
        idx = order[a:a + chunk]
        pts = cost[idx]
        if front.shape[0]:
            dom = np.all(front[:, None, :] <= pts[None, :, :], axis=2).any(axis=0)
            idx, pts = idx[~dom], pts[~dom]
        if not len(idx):
            continue
        # within the chunk: dominated by an earlier point (transitively, a kept one)
        le = np.all(pts[None, :, :] <= pts[:, None, :], axis=2)  # le[i, j]: pts[j] <= pts[i]
        dom = np.tril(le, k=-1).any(axis=1)
        front = np.vstack([front, pts[~dom]])
        keep.extend(int(i) for i in idx[~dom])
    return keep


def plan_cluster(profiles: Mapping[str, Mapping[str, BlockProfile]], cluster: Cluster,
                 slo_ms: Mapping[str, float] | None = None,
                 margin: float = DEFAULT_MARGIN,
                 max_partitions: int = DEFAULT_MAX_PARTITIONS,
                 weights: Mapping[str, float] | None = None,
                 fp16_boundaries: bool = False,
                 time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                 min_partitions: int = 1, slo_factor: float = SLO_FACTOR, *,
                 server_link_sharing: bool = True, batch_fill_factor: float = 0.0,
                 fill_rate: Mapping[str, float] | None = None,
                 same_type_partitions: bool = True,
                 vfracs: Sequence[int] | None = None, packing: str = "mixed") -> ClusterPlan:
    """Solve the MILP for ``profiles`` (``{model: {type: profile}}``: stored
    BlockProfile or :class:`~.profile_files.MeasuredProfile`) on ``cluster``.

    ``min_partitions`` > 1 plans only pipelines of at least that many stages (to run a
    pipeline on purpose, e.g. the cross-process demo). PPipe's rules (module docstring):
    ``server_link_sharing``, ``batch_fill_factor`` with ``fill_rate`` (requests/s per
    model; by default each model's rate in the no-partition plan, whole devices only, as
    PPipe's reference estimates it), ``same_type_partitions``; ``vfracs`` limits the
    fractions used (``(1,)``: whole devices); ``packing`` how slices share physical
    devices (module docstring). Raises InfeasibleSloError naming the model
    when no column meets its SLO minus ``margin``, or when the cluster cannot give every
    model a pipeline; the arguments are validated before any work.
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
    unknown_w = [m for m in (weights or {}) if m not in profiles]
    if unknown_w:
        raise InvalidParameterError(f"weights given for {unknown_w}, not planned models")
    w = {m: float((weights or {}).get(m, 1.0)) for m in profiles}
    if any(not (x > 0 and math.isfinite(x)) for x in w.values()):
        raise InvalidParameterError(f"weights must be finite and > 0, got {w}")
    if isinstance(batch_fill_factor, bool) or not isinstance(batch_fill_factor, (int, float)) \
            or not (math.isfinite(batch_fill_factor) and batch_fill_factor >= 0):
        raise InvalidParameterError(
            f"batch_fill_factor must be a finite number >= 0, got {batch_fill_factor!r}")
    for m, r in (fill_rate or {}).items():
        if m not in profiles:
            raise InvalidParameterError(f"fill_rate given for {m!r}, not a planned model")
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not r > 0:
            raise InvalidParameterError(f"fill_rate of {m!r} must be a number > 0, got {r!r}")
    if packing not in PACKINGS:
        raise InvalidParameterError(f"packing must be one of {PACKINGS}, got {packing!r}")
    if vfracs is not None and (not vfracs or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in vfracs)):
        raise InvalidParameterError(f"vfracs must list integers >= 1, got {vfracs!r}")
    t0 = time.perf_counter()
    rates_in = dict(fill_rate or {})
    fill_src = "given" if fill_rate else None
    if batch_fill_factor > 0 and any(m not in rates_in for m in profiles):
        est, fill_src = _estimate_rates(profiles, cluster, slos, margin, w,
                                        fp16_boundaries, time_limit_s, server_link_sharing,
                                        packing)
        for m in profiles:
            rates_in.setdefault(m, est[m])
    rules = {"server_link_sharing": bool(server_link_sharing),
             "batch_fill_factor": float(batch_fill_factor),
             "fill_rate": {m: rates_in.get(m) for m in profiles} if batch_fill_factor else {},
             "fill_rate_source": fill_src if batch_fill_factor else None,
             "same_type_partitions": bool(same_type_partitions),
             "per_fraction_batches": True,
             "vfracs": list(vfracs) if vfracs is not None else "all profiled",
             "packing": packing}
    columns: list[_Column] = []
    for m, by_type in profiles.items():
        budget = slos[m] * 1e3 * (1 - margin)
        cols, best = enumerate_columns(
            m, by_type, cluster, budget, max_partitions, fp16_boundaries, min_partitions,
            server_link_sharing=server_link_sharing, batch_fill_factor=batch_fill_factor,
            fill_rate=rates_in.get(m, math.inf), same_type_partitions=same_type_partitions,
            vfracs=vfracs)
        if not cols:
            raise InfeasibleSloError(
                f"model {m!r}: no partitioning, pool and batch size on {cluster.spec()} "
                f"finishes within its SLO {slos[m]:.4g} ms minus the {margin:.0%} margin "
                f"({budget / 1e3:.4g} ms); the fastest takes {best / 1e3:.4g} ms")
        columns.extend(cols)
    start = None
    base_plan = None
    if any(len(c.types) > 1 for c in columns):
        # warm start from the best whole-model plan (a quick, small MILP); the answer is
        # never below it: if the time-limited full solve ends lower, the whole-model plan
        # is returned (status says so)
        single = [c for c in columns if len(c.types) == 1]
        if single and {c.model for c in single} == set(profiles):
            base, bstatus = _solve(single, cluster, w, max(0.2, float(time_limit_s) / 4),
                                   packing=packing)
            start = {id(c): (x, g) for c, x, g in zip(single, base["x"], base["g"])}
            start["h"] = base["h"]
            start["lam"] = base["lam"]
            base_plan = (single, base, bstatus)
    left = max(0.5, float(time_limit_s) - (time.perf_counter() - t0))
    sol, status = _solve(columns, cluster, w, left, start, packing)
    pipelines, rate = _read(columns, sol, profiles)
    if base_plan is not None:
        single, base, bstatus = base_plan
        b_pipes, b_rate = _read(single, base, profiles)

        def lam(r: Mapping[str, float]) -> float:
            return min(r.get(m, 0.0) / w[m] for m in profiles)

        if lam(b_rate) > lam(rate) * (1 + 1e-9):
            sol, status = base, f"whole-model plan kept ({status}: less in {left:.1f} s)"
            pipelines, rate = b_pipes, b_rate
    solve_s = time.perf_counter() - t0
    starved = [m for m in profiles if rate.get(m, 0.0) <= 0]
    if starved:
        raise InfeasibleSloError(
            f"cluster {cluster.spec()} cannot give every model a pipeline within its SLO: "
            f"no rate for {', '.join(starved)} (MILP status {status}; a virtual device "
            f"serves one partition, so {len(profiles)} models need at least "
            f"{len(profiles)} of them)")
    physical = _assign(pipelines, sol["h"], cluster, packing)
    return ClusterPlan(cluster.spec(), slos, float(margin), max_partitions, pipelines, rate,
                       solve_s, len(columns), status, sol["gap"], physical,
                       bool(fp16_boundaries), rules, cluster.describe())


def _estimate_rates(profiles: Mapping[str, Mapping[str, BlockProfile]], cluster: Cluster,
                    slos: Mapping[str, float], margin: float, w: Mapping[str, float],
                    fp16: bool, time_limit_s: float, server_link_sharing: bool,
                    packing: str) -> tuple[dict[str, float], str]:
    """Each model's expected rate for the batch-fill rule: its rate in the no-partition
    plan on whole devices without the rule (PPipe's estimate); where that plan is
    infeasible, in the partitioned plan without the rule."""
    kw = dict(margin=margin, weights=w, fp16_boundaries=fp16, packing=packing,
              time_limit_s=max(0.5, time_limit_s / 4), server_link_sharing=server_link_sharing)
    try:
        base = plan_cluster(profiles, cluster, dict(slos), max_partitions=1, vfracs=(1,), **kw)
        return dict(base.rate), "no-partition plan, whole devices, no batch-fill rule"
    except InfeasibleSloError:
        base = plan_cluster(profiles, cluster, dict(slos), **kw)
        return dict(base.rate), "partitioned plan without the batch-fill rule"


def patterns(vs: Sequence[int], pure: bool = False) -> list[tuple[tuple[int, int], ...]]:
    """Ways to cut one device into slices of fractions ``1/v`` (``v`` in ``vs``): the
    maximal ``((v, count), ...)`` with ``sum count / v <= 1`` (no slice of any ``v`` in
    ``vs`` fits beside them; a cut with fewer slices is never needed: unused slices cost
    nothing); ``pure``: ``((v, v),)``."""
    vs = sorted(set(int(v) for v in vs))
    if pure:
        return [((v, v),) for v in vs]
    lcm = math.lcm(*vs)
    out: list[tuple[tuple[int, int], ...]] = []

    def rec(k: int, left: int, cur: list[tuple[int, int]]) -> None:
        if k == len(vs):
            if cur:
                out.append(tuple(cur))
            return
        unit = lcm // vs[k]
        for n in range(left // unit + 1):
            rec(k + 1, left - n * unit, cur + ([(vs[k], n)] if n else []))

    rec(0, lcm, [])
    smallest = lcm // vs[-1]
    return [p for p in out if lcm - sum(n * lcm // v for v, n in p) < smallest]


def _group(t: str, d: int, packing: str) -> tuple[str, int]:
    """Which physical devices a partition's slices come from: per type, and per partition
    index under ``ppipe`` packing (-1: any index)."""
    return (t, d if packing == "ppipe" else -1)


def _solve(columns: list[_Column], cluster: Cluster, w: Mapping[str, float],
           time_limit_s: float, start: Mapping[Any, Any] | None = None,
           packing: str = "mixed") -> tuple[dict[str, Any], str]:
    """Build and run the MILP of the module docstring; ``start``: a feasible solution
    (``{id(column): (x, g)}`` plus ``"h"`` and ``"lam"``) to begin from."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", MIP_REL_GAP)
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
    # virtual devices per (group, v), and the device cuts (patterns) of each group
    users: dict[tuple[tuple[str, int], int], list[int]] = {}
    for ci, c in enumerate(columns):
        for d, (t, v) in enumerate(zip(c.types, c.vs)):
            users.setdefault((_group(t, d, packing), v), []).append(g[ci][d])
    gvs: dict[tuple[str, int], set[int]] = {}
    for grp, v in users:
        gvs.setdefault(grp, set()).add(v)
    hv = {(grp, pat): var(0.0, cluster.count(grp[0]), 0.0, True)
          for grp in sorted(gvs) for pat in patterns(gvs[grp], pure=packing == "pure")}
    rows: list[tuple[float, float, list[int], list[float]]] = []
    for ci, c in enumerate(columns):
        for d, rp in enumerate(c.rate_per):  # x_c <= X_{c,d} g_{c,d}
            rows.append((-inf, 0.0, [x[ci], g[ci][d]], [1.0, -rp]))
    for (grp, v), idx in users.items():  # the group's devices supply the slices used
        supply = [(hi, float(dict(pat).get(v, 0))) for (gg, pat), hi in hv.items()
                  if gg == grp and dict(pat).get(v, 0)]
        rows.append((-inf, 0.0, [*idx, *(hi for hi, _ in supply)],
                     [1.0] * len(idx) + [-k for _, k in supply]))
    for t, n in cluster.counts:
        idx = [hi for (grp, _), hi in hv.items() if grp[0] == t]
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
        for (grp, pat), n_dev in start["h"].items():
            # the same cut, or one with more slices (a cut maximal among fewer fractions
            # may not be maximal here)
            have = dict(pat)
            for (gg, pp), i in hv.items():
                if gg == grp and all(dict(pp).get(v, 0) >= k for v, k in have.items()):
                    init[i] += n_dev
                    break
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
        pipelines.append(PipelinePlan(c.model, c.batch, stages, r, c.fill))
        rate[c.model] += r
    return pipelines, rate


def _assign(pipelines: Sequence[PipelinePlan], hv: Mapping[Any, int], cluster: Cluster,
            packing: str = "mixed") -> dict[str, list[Any]]:
    """Name the virtual devices: slice ``s`` of fraction ``1/v`` on physical device
    ``type#i`` is ``type#i/v.s``; pools take them in order. Returns each physical
    device's cut: ``v`` for ``v`` equal slices, else the list of its slices' ``v``."""
    free: dict[tuple[tuple[str, int], int], list[str]] = {}
    physical: dict[str, list[Any]] = {t: [] for t, _ in cluster.counts}
    for (grp, pat), n in sorted(hv.items()):
        t = grp[0]
        for _ in range(n):
            i = len(physical[t])
            pure = len(pat) == 1 and pat[0][0] == pat[0][1]
            physical[t].append(pat[0][0] if pure else [v for v, k in pat for _ in range(k)])
            for v, k in pat:
                free.setdefault((grp, v), []).extend(f"{t}#{i}/{v}.{s}" for s in range(k))
    for p in pipelines:
        for d, s in enumerate(p.stages):
            key = (_group(s.device_type, d, packing), s.v)
            pool = free.get(key, [])
            s.members, free[key] = pool[:s.count], pool[s.count:]
    return physical
