"""Paper 001's evaluation (§4, Table 2-3) on av_infer: fixed vs eq. 2 vs the learned policy.

Why this shape: the paper compares schedulers by mean (SD) response quality and the share
of requests served by the fast model (P_tiny) over a day-shaped arrival trace. Here the
*real* scheduler runs the requests (``Runtime`` with ``batch_mode`` fixed / eq2 / qos_rl),
on the simulator (virtual time: deterministic, exact) or on the CPU (wall clock).

Workload (defaults, all scaled to the device so the figures mean the same on any one):

* a variant group of two zoo models with the batch dimension made dynamic
  (:func:`variant_onnx`): ``resnet152`` (full, κ=1) and ``densenet201`` (fast, κ=0.5),
  the same input and output tensors (224x224 images on the sim, the scaled 64x64 on cpu);
* one BE client; soft deadline = the full variant's batch-32 latency (as in the paper:
  ~1 s against ~0.94 s), hard = 2 x soft;
* arrivals: :func:`diurnal_trace`, a day of Poisson arrivals whose rate follows a
  web-traffic curve like the paper's Fig. 5 (night trough, morning rise, evening peak),
  compressed to ``hour_s`` device seconds per hour, peak = ``load`` x the full variant's
  batch-32 throughput. Hours 12-24 are evaluated in four 3-hour windows (Table 2's
  columns); training uses hours 9-12 of traces with other seeds.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from av_infer.errors import AvInferError, InvalidParameterError

#: Relative arrival rate per hour of day (0..24, 25 points, last = first): web traffic
#: shaped like paper 001's Fig. 5 (SogouQ): a night trough, a morning rise, a lunch dip,
#: an afternoon plateau and the day's peak in the evening.
DAY_SHAPE = (0.30, 0.20, 0.13, 0.10, 0.09, 0.10, 0.16, 0.30, 0.52, 0.72, 0.82, 0.86,
             0.80, 0.78, 0.84, 0.86, 0.84, 0.80, 0.78, 0.84, 0.93, 1.00, 0.92, 0.62, 0.30)

SCHEDULERS = {"fixed": "fixed", "heuristic": "eq2", "rl": "qos_rl"}
GROUP = "detector"


@dataclass(frozen=True)
class Workload:
    """What one evaluation runs; see the module docstring for the defaults."""

    device: str = "sim"
    full: str = "resnet152"
    fast: str = "densenet201"
    kappa_fast: float = 0.5
    size: int = 224  # image side (cpu default: 64, the scaled models' own)
    hour_s: float = 0.25  # device seconds per trace hour
    load: float = 0.85  # peak rate / the full variant's batch-32 throughput
    soft_factor: float = 1.5  # soft deadline / the full variant's batch-32 latency
    hard_factor: float = 2.0  # hard deadline / soft deadline
    max_batch: int = 32
    device_options: dict[str, Any] = field(default_factory=dict)


@functools.lru_cache(maxsize=8)
def variant_onnx(name: str, size: int | None = None) -> bytes:
    """The zoo's scaled ``name`` with a symbolic batch dim (and image side, when ``size``
    differs from the model's own) so that plans compile for batch sizes 1..32. The zoo
    builds static batch-1 files; the CNNs here end in global pooling, so neither the batch
    nor the side is baked into a weight (``compile_batch_plans`` checks the result)."""
    import onnx

    from av_infer.model import zoo

    m = onnx.load(str(zoo.path(name)))
    for vi in [*m.graph.input, *m.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        free = [0]
        if vi in m.graph.input and size is not None and len(dims) == 4 \
                and dims[2].dim_value != size:
            free += [2, 3]
        for i in free:
            dims[i].ClearField("dim_value")
            dims[i].dim_param = ("N", "C", "H", "W")[i]
    del m.graph.value_info[:]
    return m.SerializeToString()


def diurnal_trace(seed: int, peak_rate: float, hour_s: float, start_h: float = 12.0,
                  end_h: float = 24.0, bin_s: float | None = None) -> np.ndarray:
    """Arrival offsets (s, ascending, from ``start_h``) of a Poisson process whose rate is
    ``peak_rate`` x :data:`DAY_SHAPE` (linear between hours), hours ``start_h..end_h``
    of a day compressed to ``hour_s`` seconds each."""
    if not (peak_rate > 0 and hour_s > 0 and 0 <= start_h < end_h <= 24):
        raise InvalidParameterError(
            f"trace needs peak_rate > 0, hour_s > 0, 0 <= start_h < end_h <= 24; got "
            f"{peak_rate}, {hour_s}, {start_h}, {end_h}")
    rng = np.random.default_rng(seed)
    dur = (end_h - start_h) * hour_s
    bin_s = bin_s or hour_s / 600.0  # the paper: queries every 10 ms of a day (1/360 h)
    edges = np.arange(0.0, dur, bin_s)
    hours = start_h + (edges + bin_s / 2) / hour_s
    rate = peak_rate * np.interp(hours, np.arange(25), DAY_SHAPE)
    counts = rng.poisson(rate * bin_s)
    t = np.repeat(edges, counts) + rng.random(int(counts.sum())) * bin_s
    return np.sort(t)


def load_trace(path: str) -> np.ndarray:
    """A trace file: one arrival offset in milliseconds per line (``#`` comments)."""
    try:
        vals = [float(x.split("#")[0]) for x in open(path, encoding="utf-8")
                if x.split("#")[0].strip()]
    except (OSError, ValueError) as e:
        raise InvalidParameterError(f"cannot read trace {path!r}: {e}") from None
    a = np.asarray(vals) * 1e-3
    if not len(a) or not np.isfinite(a).all() or (a < 0).any():
        raise InvalidParameterError(f"trace {path!r}: need finite offsets >= 0 ms")
    return np.sort(a - a.min())


# -- the runtime under test ---------------------------------------------------------------------
def make_runtime(w: Workload, mode: str, policy: Any = None) -> Any:
    """A Runtime with the workload's group loaded and the client configured (deadlines are
    set by :func:`configure_deadlines`)."""
    from av_infer import Runtime

    rt = Runtime(w.device, policy="reef", batching=True, max_batch=w.max_batch,
                 max_be_streams=1, batch_mode="fixed" if mode == "qos_rl" else mode,
                 device_options=w.device_options or None)
    try:
        shape = {"input": (1, 3, w.size, w.size)}
        for name in (w.full, w.fast):
            rt.load_model(name, variant_onnx(name, w.size), shape)
        rt.define_variant_group(GROUP, {w.full: 1.0, w.fast: w.kappa_fast})
        if mode == "qos_rl":
            rt.set_batching(True, mode="qos_rl", policy=policy)
    except BaseException:
        rt.close(drain=False)
        raise
    return rt


def latency_table(w: Workload) -> dict[str, dict[int, float]]:
    """Standalone device seconds of each variant at batch sizes 1, 2, 4, ... max_batch:
    one batch each (the median of 5 on a wall-clock device) on a runtime holding that
    model alone (``fixed`` mode: the B requests queued behind a first one run as one
    batch)."""
    from av_infer import Runtime

    x = _inputs(w)
    out: dict[str, dict[int, float]] = {}
    for name in (w.full, w.fast):
        rt = Runtime(w.device, policy="reef", batching=True, max_batch=w.max_batch,
                     max_be_streams=1, batch_mode="fixed",
                     device_options=w.device_options or None)
        out[name] = {}
        try:
            rt.load_model(name, variant_onnx(name, w.size), {"input": (1, 3, w.size, w.size)})
            reps = 1 if rt.device.virtual else 5  # wall clock: the median of 5 (noise)
            b = 1
            while b <= w.max_batch:
                took = []
                for _ in range(reps):
                    blocker = rt.submit(name, x, client="blocker")  # holds the stream
                    futs = [rt.submit(name, x, client="probe") for _ in range(b)]
                    _drain(rt, [blocker, *futs])
                    tm = futs[-1].result().timings
                    took.append(tm.end - tm.start)
                out[name][b] = float(np.median(took))
                b *= 2
        finally:
            rt.close()
    return out


def _inputs(w: Workload) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"input": rng.standard_normal((1, 3, w.size, w.size)).astype(np.float32)}


def _drain(rt: Any, futs: Sequence[Any]) -> None:
    if rt.device.virtual:
        rt.device.run()
    for f in futs:
        f.exception(timeout=600)


@dataclass
class Outcome:
    """Per-request results of one run, in arrival order."""

    arrival: np.ndarray
    quality: np.ndarray
    fast: np.ndarray  # served by a variant other than the most accurate
    missed: np.ndarray  # answered after its soft deadline
    dropped: np.ndarray  # failed with deadline_missed
    end: np.ndarray
    stats: dict[str, Any]
    t0: float = 0.0  # device time of offset 0

    def summary(self, mask: np.ndarray | None = None) -> dict[str, Any]:
        m = np.ones(len(self.quality), bool) if mask is None else mask
        q = self.quality[m]
        served = m & ~np.isnan(self.end)
        return {
            "requests": int(m.sum()),
            "mean_utility": float(q.mean()) if len(q) else None,
            "sd_utility": float(q.std()) if len(q) else None,
            "p_fast": float(self.fast[served].mean()) if served.any() else None,
            "misses": int(self.missed[m].sum()),
            "drops": int(self.dropped[m].sum()),
        }


def run_trace(w: Workload, mode: str, trace: np.ndarray, deadlines: tuple[float, float],
              policy: Any = None, progress: Callable[[int], None] | None = None) -> Outcome:
    """Submit ``trace`` (offsets, s) to a fresh runtime in ``mode``; every request's
    quality κ·V (0 when dropped or failed)."""
    rt = make_runtime(w, mode, policy)
    soft, hard = deadlines
    rt.configure_client("app", "BE", soft_deadline=soft, hard_deadline=hard,
                        variant_group=GROUP)
    n = len(trace)
    quality = np.zeros(n)
    end = np.full(n, np.nan)
    fast = np.zeros(n, bool)
    missed = np.zeros(n, bool)
    dropped = np.zeros(n, bool)
    x = _inputs(w)
    lock = threading.Lock()
    done = [0]

    def record(i: int, f: Any) -> None:
        try:
            r = f.result()
        except AvInferError as e:
            dropped[i] = e.code == "deadline_missed"
        else:
            quality[i] = r.quality
            end[i] = r.timings.end
            fast[i] = r.model != w.full
            missed[i] = r.timings.end > r.deadline
        with lock:
            done[0] += 1

    def submit(i: int, t_arr: float) -> None:
        f = rt.submit(w.full, x, client="app", arrival=t_arr)
        f.add_done_callback(lambda f, i=i: record(i, f))

    try:
        t0 = rt.now() + 1e-3
        arrivals = t0 + np.asarray(trace)
        if rt.device.virtual:
            dev = rt.device
            for i, t in enumerate(arrivals):
                dev.call_at(float(t), functools.partial(submit, i, float(t)))
            dev.run()
        else:
            for i, t in enumerate(arrivals):
                wait = t - rt.now()
                if wait > 0:
                    time.sleep(wait)
                submit(i, float(t))
                if progress is not None and i % 256 == 0:
                    progress(i)
    finally:
        rt.close()
    stats = rt.stats()
    return Outcome(arrivals - t0, quality, fast, missed, dropped, end - t0, stats, t0)


def deadlines_for(w: Workload, table: dict[str, dict[int, float]]) -> tuple[float, float]:
    soft = w.soft_factor * table[w.full][w.max_batch]
    return soft, w.hard_factor * soft


def peak_rate_for(w: Workload, table: dict[str, dict[int, float]]) -> float:
    return w.load * w.max_batch / table[w.full][w.max_batch]


def evaluate(w: Workload, seed: int = 1, trace: np.ndarray | None = None,
             policy: Any = None, schedulers: Sequence[str] = tuple(SCHEDULERS),
             on_progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run each scheduler on the same trace; the paper's Table 2/3 figures as a dict."""
    from av_infer.qos.policy import load_policy

    table = latency_table(w)
    soft, hard = deadlines_for(w, table)
    peak = peak_rate_for(w, table)
    windows: list[tuple[str, float, float]] = []
    if trace is None:
        trace = diurnal_trace(seed, peak, w.hour_s)
        windows = [(f"{h}-{h + 3}h", (h - 12) * w.hour_s, (h - 9) * w.hour_s)
                   for h in (12, 15, 18, 21)]
    net = policy if policy is not None and not isinstance(policy, str) else \
        load_policy(policy)
    out: dict[str, Any] = {
        "device": w.device, "workload": {
            "group": {w.full: 1.0, w.fast: w.kappa_fast}, "size": w.size,
            "soft_deadline_ms": soft * 1e3, "hard_deadline_ms": hard * 1e3,
            "peak_rate_rps": peak, "requests": int(len(trace)),
            "duration_s": float(trace[-1]) if len(trace) else 0.0, "seed": seed,
            "hour_s": w.hour_s, "load": w.load,
            "latency_ms": {m: {b: d * 1e3 for b, d in t.items()} for m, t in table.items()},
            "policy": net.meta,
        },
        "schedulers": {},
    }
    for name in schedulers:
        mode = SCHEDULERS[name]
        t_wall = time.perf_counter()
        res = run_trace(w, mode, trace, (soft, hard), net if mode == "qos_rl" else None)
        row = res.summary()
        row["windows"] = {lbl: res.summary((res.arrival >= a) & (res.arrival < b))
                          for lbl, a, b in windows}
        row["wall_s"] = time.perf_counter() - t_wall
        row["deciders"] = res.stats.get("batching", {}).get("deciders", {})
        out["schedulers"][name] = row
        if on_progress is not None:
            on_progress(name)
    return out


def format_table(res: dict[str, Any]) -> str:
    """Table 2 / Table 3 of the paper, from :func:`evaluate`'s result."""
    rows = res["schedulers"]
    wins = next(iter(rows.values()), {}).get("windows") or {}
    cols = list(wins) or ["all"]
    lines = ["Mean (SD) response quality", f"{'scheduler':<10}" + "".join(
        f"{c:>16}" for c in [*cols, "all"] if c != "all" or wins) + "   P_fast %   misses   drops"]
    for name, r in rows.items():
        cells = [r["windows"][c] for c in cols] if wins else []
        cells.append(r)
        txt = "".join(f"{c['mean_utility']:>9.3f} ({c['sd_utility']:.3f})" for c in cells)
        pf = r["p_fast"]
        lines.append(f"{name:<10}{txt}   {pf * 100 if pf is not None else math.nan:>8.1f}"
                     f"   {r['misses']:>6}   {r['drops']:>5}")
    return "\n".join(lines)
