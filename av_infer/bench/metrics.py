"""Per-request records and the docs/design.md metrics computed from them.

Definitions (docs/design.md, Metrics; docs/bench.md spells out every JSON field):

* RT latency = ``end - arrival`` with ``arrival`` the *scheduled* arrival.
* Dispatch latency (``dispatch_latency_us``) = RT arrival -> start of the RT task's first
  kernel on the device, where "arrival" is when the request became runnable:
  ``max(arrival, completion of the RT request before it)`` (RT requests run one at a time;
  waiting behind another RT request is RT queueing, not preemption). Over RT requests that
  became runnable while best-effort work was in progress (a BE request dispatched and not
  finished). ``first_kernel_us``: the same over every RT request. (Before issue 13 this
  was called ``preemption_us``; it says when RT started, not when BE had left.)
* Preemption latency (``preemption_latency_us``) = RT arrival (as above) -> the moment the
  last BE work *resident on the device at that arrival* has left it (evicted or done):
  REEF's, XSched's and GPreempt's meaning. Resident work comes from
  :class:`Residency` (block batches on ``sim``, BE kernels/segments elsewhere). Over the
  arrivals that had BE resident; only for policies that preempt (``streams`` never does:
  ``{"applicable": false}``).
* RT slowdown (``rt_slowdown``) = an RT request's device time (first kernel start ->
  completion) over its model's standalone device time (p50 of the same alone).
* Latency increase = ``(p50_load - p50_standalone) / p50_standalone`` (and the same with
  p99 for ``increase_p99_pct``), per client against its model's standalone latency; for
  several RT clients, each request's latency is first divided by its own model's standalone
  p50 (p99), then ``p50(ratio) - 1`` (``p99(ratio) - 1``): equal to the per-client formula
  when there is one client.
* Throughput = requests completed inside the measured window / window length.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p999": 99.9}


@dataclass
class Record:
    """One request as the harness saw it (times in seconds on the runtime clock)."""

    client: str
    model: str
    rt: bool
    arrival: float
    start: float = math.nan
    first_kernel_start: float = math.nan
    end: float = math.nan
    deadline: float = math.inf  # absolute; inf when the client has none
    preempted: int = 0
    kernels_padded: int = 0
    kernels: int = 0  # kernels in the model's plan
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not math.isnan(self.end)

    @property
    def latency(self) -> float:
        return self.end - self.arrival

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Residency:
    """When BE work occupied the device: ``[start, end)`` intervals (any order, overlaps
    allowed), at the finest grain the device reports: block batches (sim), kernels
    (cuda: completion events), segments (cpu: ``t_stop`` of a killed segment)."""

    starts: np.ndarray
    ends: np.ndarray
    grain: str = "kernel"

    @classmethod
    def of(cls, starts: Sequence[float], ends: Sequence[float], grain: str) -> Residency:
        """Intervals with a finite start and end (a device that cannot time a launch
        reports NaN: it says nothing about residency)."""
        st = np.asarray(starts, dtype=float)
        en = np.asarray(ends, dtype=float)
        ok = np.isfinite(st) & np.isfinite(en)
        return cls(st[ok], en[ok], grain)

    def drain_after(self, times: np.ndarray) -> np.ndarray:
        """Per time ``t``: when the last interval resident at ``t`` (``start <= t < end``)
        ended, minus ``t``; NaN where nothing was resident. ``O((n + m) log n)``."""
        out = np.full(times.shape, np.nan)
        if self.starts.size == 0 or times.size == 0:
            return out
        order = np.argsort(self.starts, kind="stable")
        st = self.starts[order]
        last_end = np.maximum.accumulate(self.ends[order])  # latest end among starts <= t
        i = np.searchsorted(st, times, side="right") - 1
        ok = i >= 0
        drain = np.full(times.shape, -np.inf)
        drain[ok] = last_end[i[ok]]
        hit = drain > times
        out[hit] = drain[hit] - times[hit]
        return out


def pct(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    """The q-th percentile (linear interpolation), None for no samples."""
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def dist(values: Sequence[float] | np.ndarray, scale: float = 1.0) -> dict[str, float | None]:
    """p50/p90/p99/p99.9/mean/max of ``values * scale`` (None when empty)."""
    arr = np.asarray(values, dtype=float) * scale
    out: dict[str, float | None] = {k: pct(arr, q) for k, q in PERCENTILES.items()}
    out["mean"] = float(arr.mean()) if arr.size else None
    out["max"] = float(arr.max()) if arr.size else None
    return out


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), nd) + 0.0  # no -0.0


def busy_intervals(records: Iterable[Record]) -> tuple[np.ndarray, np.ndarray]:
    """Merged ``[start, end)`` intervals during which some BE request was in progress."""
    iv = sorted((r.start, r.end) for r in records
                if not r.rt and not math.isnan(r.start) and not math.isnan(r.end))
    starts: list[float] = []
    ends: list[float] = []
    for s, e in iv:
        if starts and s <= ends[-1]:
            ends[-1] = max(ends[-1], e)
        else:
            starts.append(s)
            ends.append(e)
    return np.asarray(starts), np.asarray(ends)


def contended(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Mask of ``times`` that fall inside one of the merged intervals."""
    if starts.size == 0 or times.size == 0:
        return np.zeros(times.shape, dtype=bool)
    i = np.searchsorted(starts, times, side="right") - 1
    ok = i >= 0
    inside = np.zeros(times.shape, dtype=bool)
    inside[ok] = times[ok] < ends[i[ok]]
    return inside


def rt_ready_times(rt: Sequence[Record]) -> np.ndarray:
    """When each RT request could start: ``max(arrival, last RT completion before its first
    kernel)``. RT requests run one at a time, so this takes queueing behind other RT
    requests out of the preemption latency (it is in the RT latency already)."""
    arr = np.array([r.arrival for r in rt], dtype=float)
    if arr.size == 0:
        return arr
    ends = np.sort(np.array([r.end for r in rt], dtype=float))
    fk = np.array([r.first_kernel_start for r in rt], dtype=float)
    i = np.searchsorted(ends, np.nan_to_num(fk, nan=-np.inf), side="right") - 1
    prior = np.where(i >= 0, ends[np.clip(i, 0, None)], -np.inf)
    return np.maximum(arr, prior)


def _latency_block(lat_s: np.ndarray) -> dict[str, float | None]:
    d = dist(lat_s, 1e3)
    return {f"{k}_ms": _r(v) for k, v in d.items()}


def _increase(lat_s: np.ndarray, ref_s: np.ndarray, q: float) -> float | None:
    if lat_s.size == 0 or not np.all(ref_s > 0):
        return None
    return _r((float(np.percentile(lat_s / ref_s, q)) - 1.0) * 100.0, 3)


def summarize(
    records: Sequence[Record],
    duration: float,
    standalone: dict[str, dict[str, float]],
    t0: float = 0.0,
    preemptions: int = 0,
    residency: Residency | None = None,
    preempts: bool = True,
) -> dict[str, Any]:
    """The ``policies.<name>`` section of the report (see docs/bench.md).

    ``standalone[model]`` holds ``p50_s`` and ``p99_s`` (and ``device_p50_s`` for
    ``rt_slowdown``); ``t0`` is the window's start on the runtime clock; ``preemptions``
    the number of "preempt" events the runtime emitted; ``residency`` when BE work was on
    the device (None: ``preemption_latency_us`` not measured); ``preempts``: whether the
    policy preempts BE work at all (else the preemption latency is not applicable).
    """
    t_end = t0 + duration
    rt = [r for r in records if r.rt]
    be = [r for r in records if not r.rt]
    rt_ok = [r for r in rt if r.ok]
    lat = np.array([r.latency for r in rt_ok], dtype=float)
    s50 = np.array([standalone.get(r.model, {}).get("p50_s", math.nan) for r in rt_ok])
    s99 = np.array([standalone.get(r.model, {}).get("p99_s", math.nan) for r in rt_ok])

    rt_sec: dict[str, Any] = _latency_block(lat)
    rt_sec["standalone_p50_ms"] = _r(float(np.median(s50)) * 1e3) if s50.size else None
    rt_sec["standalone_p99_ms"] = _r(float(np.median(s99)) * 1e3) if s99.size else None
    rt_sec["increase_pct"] = _increase(lat, s50, 50)
    rt_sec["increase_p99_pct"] = _increase(lat, s99, 99)
    rt_sec["deadline_misses"] = sum(1 for r in rt if not r.ok or r.end > r.deadline)
    rt_sec["failed"] = sum(1 for r in rt if not r.ok)
    rt_sec["count"] = len(rt)
    rt_sec["throughput_rps"] = _r(sum(1 for r in rt_ok if r.end <= t_end) / duration, 3)

    clients: dict[str, Any] = {}
    for name in dict.fromkeys(r.client for r in rt):
        recs = [r for r in rt if r.client == name]
        ok = [r for r in recs if r.ok]
        cl = np.array([r.latency for r in ok])
        sa = standalone.get(recs[0].model, {})
        c: dict[str, Any] = {"model": recs[0].model, **_latency_block(cl)}
        c["standalone_p50_ms"] = _r(sa.get("p50_s", math.nan) * 1e3)
        c["standalone_p99_ms"] = _r(sa.get("p99_s", math.nan) * 1e3)
        c["increase_pct"] = _increase(cl, np.full(cl.shape, sa.get("p50_s", math.nan)), 50)
        c["increase_p99_pct"] = _increase(cl, np.full(cl.shape, sa.get("p99_s", math.nan)), 99)
        dl = recs[0].deadline - recs[0].arrival
        c["deadline_ms"] = _r(dl * 1e3) if math.isfinite(dl) else None
        c["deadline_misses"] = sum(1 for r in recs if not r.ok or r.end > r.deadline)
        c["count"] = len(recs)
        clients[name] = c
    rt_sec["clients"] = clients

    be_done = [r for r in be if r.ok and r.end <= t_end]
    be_clients = {}
    for name in dict.fromkeys(r.client for r in be):
        n = sum(1 for r in be_done if r.client == name)
        be_clients[name] = {"model": next(r.model for r in be if r.client == name),
                            "count": n, "throughput_rps": _r(n / duration, 3)}
    be_sec = {"throughput_rps": _r(len(be_done) / duration, 3), "count": len(be_done),
              "submitted": len(be), "failed": sum(1 for r in be if r.error is not None),
              "clients": be_clients}

    starts, ends = busy_intervals(be)
    ready = rt_ready_times(rt_ok)
    fk = np.array([r.first_kernel_start for r in rt_ok], dtype=float) - ready
    fk_valid = ~np.isnan(fk)
    mask = contended(ready, starts, ends) & fk_valid
    pre = fk[mask] * 1e6
    allfk = fk[fk_valid] * 1e6

    def _pdist(x: np.ndarray) -> dict[str, Any]:
        d = dist(x)
        return {"p50": _r(d["p50"], 2), "p99": _r(d["p99"], 2), "max": _r(d["max"], 2),
                "mean": _r(d["mean"], 2), "count": int(x.size)}

    if not preempts:
        pl: dict[str, Any] = {"applicable": False,
                              "why": "the policy never preempts BE work"}
    elif residency is None:
        pl = {"applicable": True, "measured": False,
              "why": "the device reported no BE residency"}
    else:
        drain = residency.drain_after(ready) * 1e6
        pl = {"applicable": True, "grain": residency.grain,
              **_pdist(drain[~np.isnan(drain)]), "arrivals": int(ready.size)}

    dev_t = np.array([r.end - r.first_kernel_start for r in rt_ok], dtype=float)
    dev_ref = np.array([standalone.get(r.model, {}).get("device_p50_s", math.nan)
                        for r in rt_ok], dtype=float)
    ratio = dev_t / dev_ref
    ratio = ratio[np.isfinite(ratio)]
    sd = dist(ratio)
    slowdown = {"p50": _r(sd["p50"]), "p99": _r(sd["p99"]), "max": _r(sd["max"]),
                "mean": _r(sd["mean"]), "count": int(ratio.size)}

    be_kernels = sum(r.kernels for r in be if r.ok)
    padded = sum(r.kernels_padded for r in be)
    total_done = sum(1 for r in rt_ok if r.end <= t_end) + len(be_done)
    return {
        "rt": rt_sec,
        "be": be_sec,
        "throughput_rps": _r(total_done / duration, 3),
        "dispatch_latency_us": _pdist(pre),
        "preemption_latency_us": pl,
        "rt_slowdown": slowdown,
        "first_kernel_us": _pdist(allfk),
        "preemptions": int(preemptions),
        "preempted_requests": sum(1 for r in be if r.preempted),
        "padded_fraction": _r(padded / be_kernels if be_kernels else 0.0, 6),
    }


def standalone_stats(latencies_s: Sequence[float],
                     device_s: Sequence[float] | None = None) -> dict[str, float]:
    """Reference numbers of one model measured alone (seconds); ``device_s``: its device
    times (first kernel start -> completion), the reference of ``rt_slowdown``."""
    arr = np.asarray(latencies_s, dtype=float)
    out = {"p50_s": float(np.percentile(arr, 50)), "p99_s": float(np.percentile(arr, 99)),
           "mean_s": float(arr.mean()), "n": int(arr.size)}
    if device_s is not None and len(device_s):
        out["device_p50_s"] = float(np.percentile(np.asarray(device_s, dtype=float), 50))
    return out
