"""Deadline utility (seed paper 001 §2.3): how much a response is still worth.

Why: a miss/no-miss count treats a response 1 µs late like one a second late. Paper 001's
time-utility function gives each request a *soft* and a *hard* deadline: utility is 1 up to
the soft deadline and falls linearly to 0 at the hard one. Mean utility per client is a
single figure of merit for benchmarks and diagnostics next to the latency percentiles.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from av_infer.errors import InvalidParameterError


def check_deadlines(soft: float, hard: float) -> None:
    """Reject a soft/hard pair that makes no sense (negative, NaN, hard before soft)."""
    if math.isnan(soft) or math.isnan(hard) or soft < 0 or hard < 0:
        raise InvalidParameterError(f"deadlines must be >= 0 s, got soft={soft}, hard={hard}")
    if hard < soft:
        raise InvalidParameterError(
            f"hard deadline {hard} s is before the soft deadline {soft} s"
        )


def quality(t_end: float, soft: float, hard: float, kappa: float = 1.0) -> float:
    """Paper 001 eq. 1: ``Q = κ_M · V(t_end; soft, hard)`` (absolute times, one clock)."""
    return kappa * utility(t_end, soft, hard)


def utility(t: float, soft: float, hard: float) -> float:
    """Utility of a response at ``t`` (a latency, or an end time: same origin as the
    deadlines): 1 until ``soft``, linear to 0 at ``hard``, 0 after; soft == hard is a step."""
    if math.isnan(t):
        return 0.0
    if t <= soft:
        return 1.0
    if t >= hard:
        return 0.0
    return (hard - t) / (hard - soft)


@dataclass
class UtilityAccumulator:
    """Running mean utility of one client (plus how many met the soft/hard deadline)."""

    soft: float
    hard: float
    count: int = 0
    total: float = 0.0
    soft_met: int = 0
    hard_met: int = 0

    def __post_init__(self) -> None:
        check_deadlines(self.soft, self.hard)

    def add(self, latency: float) -> float:
        """Record one response by its latency (s); returns its utility."""
        u = utility(latency, self.soft, self.hard)
        self.count += 1
        self.total += u
        self.soft_met += latency <= self.soft
        self.hard_met += latency <= self.hard
        return u

    def add_failure(self) -> None:
        """A request that got no result (dropped, error) is worth 0."""
        self.count += 1

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def summary(self) -> dict[str, float | int | None]:
        return {
            "soft_deadline_s": self.soft,
            "hard_deadline_s": self.hard,
            "count": self.count,
            "mean_utility": self.mean,
            "soft_met": self.soft_met,
            "hard_met": self.hard_met,
        }


class UtilityTracker:
    """Utility accumulators by client, thread-safe (completions come from device threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._acc: dict[str, UtilityAccumulator] = {}

    def configure(self, client: str, soft: float | None, hard: float | None) -> None:
        """Track ``client`` with relative deadlines (s); both None stops tracking.

        Only one given: the other equals it (a step utility).
        """
        with self._lock:
            if soft is None and hard is None:
                self._acc.pop(client, None)
                return
            s = float(hard if soft is None else soft)
            h = float(soft if hard is None else hard)
            old = self._acc.get(client)
            if old is not None and (old.soft, old.hard) == (s, h):
                return
            self._acc[client] = UtilityAccumulator(s, h)

    def deadlines(self, client: str) -> tuple[float, float] | None:
        if not self._acc:  # nobody tracked (the common case): no lock on the submit path
            return None
        with self._lock:
            a = self._acc.get(client)
            return None if a is None else (a.soft, a.hard)

    def record(self, client: str, latency: float | None) -> float | None:
        """Record a response (None latency: a failure); no-op for untracked clients."""
        with self._lock:
            a = self._acc.get(client)
            if a is None:
                return None
            if latency is None:
                a.add_failure()
                return 0.0
            return a.add(latency)

    def summary(self) -> dict[str, dict[str, float | int | None]]:
        with self._lock:
            return {c: a.summary() for c, a in sorted(self._acc.items())}

    def reset(self) -> None:
        with self._lock:
            for c, a in self._acc.items():
                self._acc[c] = UtilityAccumulator(a.soft, a.hard)
