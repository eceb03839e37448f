"""Requests, their priorities, timings and results: what flows through the scheduler."""

from __future__ import annotations

import enum
import math
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np


class Priority(enum.IntEnum):
    """RT requests are ordered by deadline and preempt BE work; BE uses what RT leaves."""

    RT = 0
    BE = 1

    @classmethod
    def parse(cls, value: Priority | str | int) -> Priority:
        if isinstance(value, Priority):
            return value
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                raise ValueError(f"priority must be 'RT' or 'BE', got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"priority must be 'RT', 'BE', 0 or 1, got {value!r}")
        return cls(int(value))


@dataclass
class Timings:
    """Timestamps on the device clock (seconds) and preemption counters of one request.

    ``arrival`` is the scheduled arrival (what latency is measured from, docs/design.md);
    ``start`` when the scheduler first gave it to a stream; ``first_kernel_start`` when its
    first kernel started on the device (preemption latency = this - arrival, for RT);
    ``end`` when its last kernel completed.
    """

    arrival: float
    start: float = math.nan
    first_kernel_start: float = math.nan
    end: float = math.nan
    preempted: int = 0
    kernels_padded: int = 0  # BE kernel launches that ran as padding (DKP)
    #: when the runtime took the request (``submit``): later than ``arrival`` by whatever
    #: delayed the caller (a client thread waking late) before it could submit
    received: float = math.nan
    #: CPU seconds its launches used on the threads that ran them, where the device
    #: measures it (``Completion.cpu_s``: the cpu device's RT lanes); NaN otherwise
    run_cpu: float = math.nan

    @property
    def latency(self) -> float:
        return self.end - self.arrival

    @property
    def queueing(self) -> float:
        return self.start - self.arrival


@dataclass
class Result:
    """What a successful request's future resolves to."""

    request_id: int
    model: str
    client: str
    priority: Priority
    outputs: dict[str, np.ndarray]
    timings: Timings
    deadline: float = math.inf  # the soft deadline (absolute, device clock)
    #: the hard deadline (absolute; inf: none) and the accuracy factor κ of the model that
    #: served it (a variant group's variant; 1 otherwise): paper 001's quality inputs
    hard_deadline: float = math.inf
    kappa: float = 1.0

    @property
    def deadline_met(self) -> bool:
        return self.timings.end <= self.deadline

    @property
    def quality(self) -> float:
        """Paper 001 eq. 1: κ · V(end; soft, hard) (κ when it has no deadline)."""
        end, soft = self.timings.end, self.deadline
        if end <= soft:
            return self.kappa
        hard = max(self.hard_deadline, soft)
        if end >= hard:
            return 0.0
        return self.kappa * (hard - end) / (hard - soft)


@dataclass(eq=False)
class Request:
    """One inference call as the scheduler holds it. Users never build these directly."""

    id: int
    model: str
    inputs: dict[str, np.ndarray]
    priority: Priority
    client: str
    deadline: float  # absolute, device clock; math.inf when none
    drop_late: bool
    timings: Timings
    future: Future = field(default_factory=Future)
    #: the stream the scheduler last enqueued it on (-1: none yet); written by the scheduler
    #: only, read by a waiting caller as a hint of which lane to help (``Device.run_pending``)
    stream: int = -1
    #: ``Runtime.infer``: the thread (ident) that waits for this request and runs its
    #: launches itself (0: none). An enqueue made *on that thread* while it handles the
    #: arrival need not wake a lane worker: the thread helps right after.
    caller_runs: int = 0
    #: absolute hard deadline (device clock; inf: none): a BE request still unanswered then
    #: is dropped wherever it is (DeadlineMissedError); ``deadline`` is the soft one
    hard_deadline: float = math.inf
