"""Expected device time D_{B,M} of each plan: what utility-driven decisions predict with.

Why observed rather than only profiled: a kernel profile (sim: exact; cuda: measured; cpu:
often none) misses launch overheads and contention. The table starts from the profile's
total where the runtime has one (``prime``) and then follows what unpreempted runs took
on the device (an exponentially weighted mean), so the estimate converges to what the
scheduler really sees on every device.
"""

from __future__ import annotations

#: Weight of a new observation in the running estimate.
EWMA = 0.2


class LatencyTable:
    """Plan name -> expected device seconds of one unpreempted run. Not thread-safe: only
    the scheduler's driver calls it."""

    def __init__(self) -> None:
        self._est: dict[str, float] = {}

    def prime(self, plan: str, seconds: float) -> None:
        """A first estimate (a profile's total); ignored once the plan was observed."""
        if plan not in self._est and seconds > 0:
            self._est[plan] = float(seconds)

    def observe(self, plan: str, seconds: float) -> None:
        if not seconds > 0:
            return
        old = self._est.get(plan)
        self._est[plan] = seconds if old is None else old + EWMA * (seconds - old)

    def get(self, plan: str) -> float | None:
        return self._est.get(plan)

    def forget(self, plan: str) -> None:
        self._est.pop(plan, None)

    def snapshot(self) -> dict[str, float]:
        return dict(sorted(self._est.items()))
