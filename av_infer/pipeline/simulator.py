"""The cluster simulator: discrete events at stage granularity, in virtual time.

It runs a :class:`~.planner.ClusterPlan` through the real data plane
(:class:`~.batcher.ReservationBatcher` over :class:`~.reservation.ReservationTables`) on
simulated devices whose stage times are the block profiles times a log-normal jitter, so
reservations and reality drift apart and feedback correction has work to do. Devices run
their stages in dispatch order, as soon as input and device are ready (work conserving);
transfers need the sender's uplink and the receiver's downlink at once.

It exists to compare plans like PPipe §7 at scales no machine here has: pool pipelines
against one whole-model pool per device type, on Poisson or bursty (gamma, CV 2) arrivals,
reporting the highest rate served at 99 % SLO attainment and device utilisation per type.
It never stands in for a result about real hardware.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from av_infer.pipeline.batcher import Dispatch, ReservationBatcher
from av_infer.pipeline.cluster import Cluster
from av_infer.pipeline.planner import ClusterPlan
from av_infer.pipeline.reservation import COMPUTE, ReservationTables, build_routes
from av_infer.profiles import BlockProfile

#: PPipe §7: a system "serves" a rate when >= 99 % of its requests meet the SLO
TARGET_ATTAINMENT = 0.99
LOADS = ("poisson", "bursty")
BURSTY_CV = 2.0


@dataclass
class SimResult:
    """One run at one offered rate."""

    offered: float
    duration_s: float
    requests: int
    served: int  # completed within their deadline
    dropped: int
    late: int
    attainment: float
    goodput: float  # requests/s completed within their deadline
    utilisation: dict[str, float]
    probes_per_batch: float
    batches: int
    mean_batch: float
    p99_latency_ms: float
    per_model: dict[str, dict[str, float]] = field(default_factory=dict)


def _arrivals(rng: np.random.Generator, rate: float, horizon: float, load: str
              ) -> np.ndarray:
    if rate <= 0:
        return np.empty(0)
    n = int(rate * horizon * 1.3 + 50)
    if load == "poisson":
        gaps = rng.exponential(1.0 / rate, n)
    elif load == "bursty":  # gamma inter-arrivals of mean 1/rate and CV BURSTY_CV
        k = 1.0 / BURSTY_CV**2
        gaps = rng.gamma(k, 1.0 / (rate * k), n)
    else:
        raise ValueError(f"load must be one of {LOADS}, got {load!r}")
    t = np.cumsum(gaps)
    while t[-1] < horizon:
        t = np.concatenate([t, t[-1] + np.cumsum(rng.exponential(1.0 / rate, n))])
    return t[t < horizon]


def simulate(plan: ClusterPlan, profiles: Mapping[str, Mapping[str, BlockProfile]],
             cluster: Cluster, rate: float, duration_s: float = 2.0, load: str = "poisson",
             weights: Mapping[str, float] | None = None, jitter: float = 0.05,
             seed: int = 0, warmup_s: float | None = None) -> SimResult:
    """Offer ``rate`` requests/s (split over the models by ``weights``) for
    ``duration_s`` of virtual time and count what meets its SLO."""
    rng = np.random.default_rng(seed)
    link_of = {t.name: (t.link_gbps, t.link_us) for t in cluster.types}
    routes, compute_ids, phys_ids = build_routes(
        plan, profiles, link_of, {t.name: t.gpus_per_server for t in cluster.types})
    tables = ReservationTables(len(compute_ids), len(phys_ids))
    batcher = ReservationBatcher(routes, tables)
    models = batcher.models()
    w = {m: float((weights or {}).get(m, 1.0)) for m in models}
    wsum = sum(w.values())
    warm = duration_s * 0.1 if warmup_s is None else warmup_s
    horizon = duration_s + warm
    # the simulated reality the tables try to track: each compute member runs the stage
    # jobs whose input has arrived, in arrival order; a transfer takes the sender's uplink
    # and the receiver's downlink at once, in the order transfers become ready
    busy = [False] * len(compute_ids)
    waiting: list[deque] = [deque() for _ in compute_ids]
    up_until = np.zeros(len(phys_ids))
    down_until = np.zeros(len(phys_ids))
    vfrac = np.array([1.0 / int(c.rsplit("/", 1)[1].split(".")[0]) for c in compute_ids])
    ctype = [c.split("#")[0] for c in compute_ids]
    busy_time = np.zeros(len(compute_ids))
    events: list[tuple[float, int, int, Any]] = []  # (time, seq, kind, payload)
    seq = 0
    ARRIVE, WAKE, FEEDBACK, READY, DONE = 0, 1, 2, 3, 4

    def push(t: float, kind: int, payload: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, payload))

    for m in models:
        for t in _arrivals(rng, rate * w[m] / wsum, horizon, load):
            push(float(t), ARRIVE, m)
    slo_s = {m: plan.slo_ms[m] / 1e3 for m in models}
    stats = {m: {"n": 0, "ok": 0, "drop": 0, "late": 0} for m in models}
    lat_ok: list[float] = []
    wake_at: dict[str, float] = {}
    n_batches = 0
    batch_sum = 0
    inflight: dict[int, Dispatch] = {}  # dispatched, not finished

    def count(m: str, arrival: float, key: str, latency: float | None = None) -> None:
        if arrival < warm:
            return
        stats[m]["n"] += 1
        stats[m][key] += 1
        if latency is not None:
            lat_ok.append(latency)

    def factor() -> float:
        return float(rng.lognormal(0.0, jitter)) if jitter > 0 else 1.0

    def start_job(job: list, now: float) -> None:
        d, s = job[0], job[1]
        member = d.probe.path[s]
        busy[member] = True
        dur = d.probe.route.stage_s[d.probe.batch][s] * factor()
        busy_time[member] += min(now + dur, horizon) - min(now, horizon)
        push(now + dur, DONE, job)

    def ready(job: list, now: float) -> None:
        member = job[0].probe.path[job[1]]
        if busy[member]:
            waiting[member].append(job)
        else:
            start_job(job, now)

    def done(job: list, now: float) -> None:
        nonlocal n_batches, batch_sum
        d, s = job[0], job[1]
        p = d.probe
        r = p.route
        member = p.path[s]
        comp = job[2][s]  # this stage's compute reservation
        tables.correct(comp[0], comp[1], comp[3], now)
        busy[member] = False
        if waiting[member]:
            start_job(waiting[member].popleft(), now)
        if s + 1 < len(p.path):
            src = int(r.phys[s][list(r.members[s]).index(member)])
            nxt = p.path[s + 1]
            dst = int(r.phys[s + 1][list(r.members[s + 1]).index(nxt)])
            t0 = max(now, up_until[src], down_until[dst])
            t1 = t0 + r.xfer_s[p.batch][s] * factor()
            up_until[src] = down_until[dst] = t1
            for kind, idx, rend in job[3][s]:  # the link reservations of this hand-over
                push(t1, FEEDBACK, (kind, idx, rend, t1))
            push(t1, READY, [d, s + 1, job[2], job[3]])
            return
        n_batches += 1
        batch_sum += len(d.requests)
        inflight.pop(id(d), None)
        for q in d.requests:
            if now <= q.deadline:
                count(r.model, q.arrival, "ok", now - q.arrival)
            else:
                count(r.model, q.arrival, "late")

    def run(d: Dispatch, now: float) -> None:
        inflight[id(d)] = d
        comp = [x for x in d.probe.resv if x[0] == COMPUTE]
        links = [[(k, i, e) for k, i, _, e in d.probe.resv if k != COMPUTE][2 * s: 2 * s + 2]
                 for s in range(len(d.probe.path))]
        ready([d, 0, comp, links], now)

    rid = 0
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if now > horizon + 10 * max(slo_s.values()):
            break
        if kind == FEEDBACK:
            tables.correct(*payload)
            continue
        if kind == READY:
            ready(payload, now)
            continue
        if kind == DONE:
            done(payload, now)
            continue
        if kind == ARRIVE:
            m = payload
            rid += 1
            if now < horizon:
                batcher.submit(m, rid, now, now + slo_s[m])
        else:
            m = payload
            if wake_at.get(m) != now:
                continue  # a stale wake-up
            del wake_at[m]
        actions, wake = batcher.step(m, now)
        for a in actions:
            if isinstance(a, Dispatch):
                run(a, now)
            else:
                count(m, a.request.arrival, "drop")
        if wake is not None and wake_at.get(m) != wake:
            wake_at[m] = wake
            push(wake, WAKE, m)
    for m in models:  # whatever is still queued missed its SLO
        for q in batcher.drain(m):
            count(m, q.arrival, "drop")
    for d in inflight.values():  # still running long after its deadline: late
        for q in d.requests:
            count(d.probe.route.model, q.arrival, "late")
    n = sum(s["n"] for s in stats.values())
    ok = sum(s["ok"] for s in stats.values())
    util: dict[str, float] = {}
    for t, cnt in cluster.counts:
        util[t] = float(sum(busy_time[i] * vfrac[i] for i in range(len(compute_ids))
                            if ctype[i] == t) / (cnt * horizon))
    return SimResult(
        offered=rate, duration_s=duration_s, requests=n, served=ok,
        dropped=sum(s["drop"] for s in stats.values()),
        late=sum(s["late"] for s in stats.values()),
        attainment=ok / n if n else 1.0, goodput=ok / duration_s, utilisation=util,
        probes_per_batch=batcher.probes / max(1, n_batches), batches=n_batches,
        mean_batch=batch_sum / max(1, n_batches),
        p99_latency_ms=float(np.percentile(lat_ok, 99) * 1e3) if lat_ok else math.nan,
        per_model={m: {"requests": s["n"], "attainment": s["ok"] / s["n"] if s["n"] else 1.0}
                   for m, s in stats.items()})


def max_rate(plan: ClusterPlan, profiles: Mapping[str, Mapping[str, BlockProfile]],
             cluster: Cluster, load: str = "poisson", duration_s: float = 2.0,
             weights: Mapping[str, float] | None = None, seed: int = 0, iters: int = 8,
             target: float = TARGET_ATTAINMENT, progress: Any = None
             ) -> tuple[float, SimResult | None, list[SimResult]]:
    """The highest offered rate served at ``target`` SLO attainment: bisection between 0
    and 1.5x the plan's predicted rate. Returns it, the run at it, and every run."""
    hi = 1.5 * sum(plan.rate.values())
    lo, best = 0.0, None
    runs = []
    r = simulate(plan, profiles, cluster, hi, duration_s, load, weights, seed=seed)
    runs.append(r)
    if progress is not None:
        progress.update(1)
    if r.attainment >= target:
        return hi, r, runs
    for _ in range(iters):
        mid = (lo + hi) / 2
        r = simulate(plan, profiles, cluster, mid, duration_s, load, weights, seed=seed)
        runs.append(r)
        if progress is not None:
            progress.update(1)
        if r.attainment >= target:
            lo, best = mid, r
        else:
            hi = mid
    return lo, best, runs


__all__ = ["LOADS", "SimResult", "max_rate", "simulate"]
