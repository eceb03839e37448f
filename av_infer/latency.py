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

__all__ = ["SAMPLE_CAP", "LatencyRecorder", "summarize_ms"]

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


def summarize_ms(sample: tuple[np.ndarray, int, float, float]) -> dict[str, float | None]:
    """Percentiles of a ``LatencyRecorder.sample()`` (call it outside any lock)."""
    a, count, total, mx = sample
    if not len(a):
        return {k: None for k in ("p50", "p90", "p99", "p999", "mean", "max")}
    p50, p90, p99, p999 = np.percentile(a * 1e3, [50, 90, 99, 99.9])
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "p999": float(p999),
        "mean": total / count * 1e3,
        "max": mx * 1e3,
    }
