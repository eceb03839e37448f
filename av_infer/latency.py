"""Latency recorders: raw samples in a bounded ring, percentiles computed from them.

Why a module of its own at the bottom of the package: the scheduler's statistics
(``sched.stats``) and the devices (the cpu device's kill latencies) both record latencies,
and a device must not import from the scheduler's floor above it.

Why keep raw samples: tail percentiles (p99, p99.9) of a few thousand requests are only
honest when computed from the samples, not from a histogram; a capped window keeps memory
bounded on long runs.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["SAMPLE_CAP", "LatencyRecorder", "quantiles", "summarize_ms"]

#: Samples kept per recorder (the most recent ones): enough for a p99.9 with 16 samples
#: above it, small enough (128 kB) that a runtime's memory stops growing within minutes.
SAMPLE_CAP = 16_384

class LatencyRecorder:
    """The last ``cap`` samples (seconds, in a numpy ring) plus all-time count/sum/max.

    ``add`` is O(1); ``sample`` copies the ring (a memcpy) so callers holding the stats lock
    keep it for microseconds and compute percentiles after releasing it. Compiled where
    built (``latency.pxd``: ``add`` a C method storing through a typed view of the ring);
    the same code runs interpreted elsewhere (``_view`` is then the ring itself)."""

    def __init__(self, cap: int = SAMPLE_CAP) -> None:
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap!r}")
        self._cap = int(cap)
        self._ring = np.empty(0, dtype=np.float64)  # grows to cap
        self._view = self._ring
        self._size = 0  # len(self._ring), kept (add reads it on every sample)
        self.count = 0
        self.total = 0.0
        self.max = -math.inf

    def add(self, seconds: float) -> None:
        n = self.count
        if n < self._size:
            self._view[n] = seconds  # filling (the common case: one store, no modulo)
        elif n >= self._cap:
            self._view[n % self._cap] = seconds
        else:  # full below the cap: grow (doubling, at most to the cap)
            grown = np.empty(min(self._cap, max(64, 2 * n)), dtype=np.float64)
            grown[:n] = self._ring[:n]
            grown[n] = seconds
            self._ring = grown
            self._view = grown
            self._size = len(grown)
        self.count = n + 1
        self.total += seconds
        if seconds > self.max:
            self.max = seconds

    def sample(self) -> tuple[np.ndarray, int, float, float]:
        """(samples copy, count, total, max): cheap, take it under the stats lock."""
        return self._ring[: min(self.count, self._cap)].copy(), self.count, self.total, self.max

    def summary_ms(self) -> dict[str, float | None]:
        """p50/p90/p99/p999/mean/max in milliseconds (None when there are no samples)."""
        return summarize_ms(self.sample())


#: ``summarize_ms``'s quantiles, as ``np.percentile`` derives them from 50, 90, 99, 99.9.
_SUMMARY_QS = tuple(q / 100 for q in (50, 90, 99, 99.9))


def summarize_ms(sample: tuple[np.ndarray, int, float, float]) -> dict[str, float | None]:
    """Percentiles of a ``LatencyRecorder.sample()`` (call it outside any lock)."""
    a, count, total, mx = sample
    if not len(a):
        return {k: None for k in ("p50", "p90", "p99", "p999", "mean", "max")}
    p50, p90, p99, p999 = quantiles(a * 1e3, _SUMMARY_QS)
    return {
        "p50": p50,
        "p90": p90,
        "p99": p99,
        "p999": p999,
        "mean": total / count * 1e3,
        "max": mx * 1e3,
    }


def quantiles(a: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """``np.quantile(a, qs)`` (its default "linear" method), bit-identical, as floats
    (``np.percentile(a, p)`` is ``np.quantile(a, p / 100)``); ``a`` (a non-empty float64
    array) is reordered in place.

    Why not ``np.percentile``: its Python layers cost ~80 µs a call on the dev VM, and a
    ``Runtime.stats()`` summarises every client's and model's recorders (the ROS host
    publishes it once a second with the GIL held, docs/ros.md); here one ``partition``
    call (the same introselect numpy runs) and a few float operations, done as numpy's
    ``_quantile``/``_lerp`` do them: virtual index ``(n - 1) * q``, its floor and the next
    element, the weight ``t``, ``a + (b - a) * t`` below 0.5 and ``b - (b - a) * (1 - t)``
    from it, the last element from index ``n - 1`` on, NaN everywhere when ``a`` holds one
    (numpy's rule)."""
    n = len(a)
    last = n - 1
    kth = {last}
    where = []
    for q in qs:
        v = last * q
        lo = math.floor(v)
        if v >= last:
            where.append((last, last, 0.0))
        else:
            where.append((lo, lo + 1, v - lo))
            kth.add(lo)
            kth.add(lo + 1)
    a.partition(sorted(kth))
    if math.isnan(a[last]):
        return [math.nan] * len(qs)
    out = []
    for lo, hi, t in where:
        x = float(a[lo])
        y = float(a[hi])
        d = y - x
        out.append(y - d * (1 - t) if t >= 0.5 else x + d * t)
    return out
