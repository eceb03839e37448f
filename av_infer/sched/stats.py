"""Counters and latency recorders for diagnostics (``Runtime.stats()``).

Why keep raw samples: tail percentiles (p99, p99.9) of a few thousand requests are only
honest when computed from the samples, not from a histogram; a capped window keeps memory
bounded on long runs. Only the scheduler writes; readers take a snapshot under a lock.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from typing import Any

import numpy as np

#: Samples kept per recorder (the most recent ones).
SAMPLE_CAP = 100_000


class LatencyRecorder:
    """The last ``cap`` samples (seconds) plus all-time count/sum/max."""

    __slots__ = ("_samples", "count", "total", "max")

    def __init__(self, cap: int = SAMPLE_CAP) -> None:
        self._samples: deque[float] = deque(maxlen=cap)
        self.count = 0
        self.total = 0.0
        self.max = -math.inf

    def add(self, seconds: float) -> None:
        self._samples.append(seconds)
        self.count += 1
        self.total += seconds
        if seconds > self.max:
            self.max = seconds

    def summary_ms(self) -> dict[str, float | None]:
        """p50/p90/p99/p999/mean/max in milliseconds (None when there are no samples)."""
        if not self._samples:
            return {k: None for k in ("p50", "p90", "p99", "p999", "mean", "max")}
        a = np.fromiter(self._samples, dtype=np.float64) * 1e3
        p50, p90, p99, p999 = np.percentile(a, [50, 90, 99, 99.9])
        return {
            "p50": float(p50),
            "p90": float(p90),
            "p99": float(p99),
            "p999": float(p999),
            "mean": self.total / self.count * 1e3,
            "max": self.max * 1e3,
        }


class ClientStats:
    __slots__ = ("priority", "submitted", "completed", "failed", "deadline_misses",
                 "latency", "preemption_latency", "errors")

    def __init__(self, priority: str) -> None:
        self.priority = priority
        self.submitted = 0
        self.completed = 0
        self.failed = 0
        self.deadline_misses = 0
        self.latency = LatencyRecorder()
        self.preemption_latency = LatencyRecorder()  # arrival -> first kernel start
        self.errors: dict[str, int] = {}


class Stats:
    """Everything ``Runtime.stats()`` reports that the scheduler counts."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clients: dict[str, ClientStats] = {}
        self.models: dict[str, dict[str, int]] = {}
        self.preemptions = 0
        self.restores = 0
        self.kernels_reexecuted = 0
        self.rt_switches = 0  # edf_preempt take-overs of the RT stream
        self.padded_launches = 0  # RT launches that carried BE blocks (DKP)
        self.padded_blocks = 0  # BE blocks that ran inside padded launches
        self.padded_kernels = 0  # BE kernels completed by padding

    def client(self, name: str, priority: str) -> ClientStats:
        cs = self.clients.get(name)
        if cs is None:
            cs = self.clients[name] = ClientStats(priority)
        return cs

    def model(self, name: str) -> dict[str, int]:
        m = self.models.get(name)
        if m is None:
            m = self.models[name] = {"submitted": 0, "completed": 0, "failed": 0}
        return m

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "clients": {
                    name: {
                        "priority": cs.priority,
                        "submitted": cs.submitted,
                        "completed": cs.completed,
                        "failed": cs.failed,
                        "deadline_misses": cs.deadline_misses,
                        "errors": dict(cs.errors),
                        "latency_ms": cs.latency.summary_ms(),
                        "preemption_latency_ms": cs.preemption_latency.summary_ms(),
                    }
                    for name, cs in self.clients.items()
                },
                "models": {k: dict(v) for k, v in self.models.items()},
                "preemptions": self.preemptions,
                "restores": self.restores,
                "kernels_reexecuted": self.kernels_reexecuted,
                "rt_switches": self.rt_switches,
                "padded_launches": self.padded_launches,
                "padded_blocks": self.padded_blocks,
                "padded_kernels": self.padded_kernels,
            }
