# cython: annotation_typing=False, language_level=3
"""Requests, their priorities, timings and results: what flows through the scheduler.

Compiled with request.pxd where built (Cython's pure-Python mode, av_infer/_cy/compiled.py):
``Timings`` and ``Request`` are then ``cdef class``es whose fields the compiled scheduler
reads as C struct members; this file stays the one source and runs interpreted elsewhere."""

from __future__ import annotations

import enum
import math
from concurrent.futures import Future
from typing import Any

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


def _fields_equal(a: Any, b: object) -> bool:
    """The dataclasses' ``==`` for the hand-written value records (``Timings``,
    ``Result``): same class, then field by field (``_astuple``)."""
    if b.__class__ is not a.__class__:
        return NotImplemented
    return a._astuple() == b._astuple()  # type: ignore[attr-defined]


class Timings:
    """Timestamps on the device clock (seconds) and preemption counters of one request.

    ``arrival`` is the scheduled arrival (what latency is measured from, docs/design.md);
    ``start`` when the scheduler first gave it to a stream; ``first_kernel_start`` when its
    first kernel started on the device (preemption latency = this - arrival, for RT);
    ``end`` when its last kernel completed; ``preempted`` how often it was preempted;
    ``kernels_padded`` its BE kernel launches that ran as padding (DKP); ``received`` when
    the runtime took the request (``submit``: later than ``arrival`` by whatever delayed
    the caller, a client thread waking late, before it could submit); ``run_cpu`` the CPU
    seconds its launches used on the threads that ran them, where the device measures it
    (``Completion.cpu_s``: the cpu device's RT lanes), NaN otherwise.

    Written by hand, not a dataclass, with the dataclass's constructor, ``repr`` and
    field-wise ``==``: compiled, it is a ``cdef class`` with C double/integer fields
    (request.pxd, docs/request_path.md "Requests compiled") that the scheduler reads as
    struct members; interpreted, a plain class with the same names.
    """

    def __init__(self, arrival: float, start: float = math.nan,
                 first_kernel_start: float = math.nan, end: float = math.nan,
                 preempted: int = 0, kernels_padded: int = 0, received: float = math.nan,
                 run_cpu: float = math.nan) -> None:
        self.arrival = arrival
        self.start = start
        self.first_kernel_start = first_kernel_start
        self.end = end
        self.preempted = preempted
        self.kernels_padded = kernels_padded
        self.received = received
        self.run_cpu = run_cpu

    def _astuple(self) -> tuple:
        return (self.arrival, self.start, self.first_kernel_start, self.end, self.preempted,
                self.kernels_padded, self.received, self.run_cpu)

    def __eq__(self, other: object) -> bool:
        return _fields_equal(self, other)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value (as the dataclass)

    def __repr__(self) -> str:
        return (f"Timings(arrival={self.arrival!r}, start={self.start!r}, "
                f"first_kernel_start={self.first_kernel_start!r}, end={self.end!r}, "
                f"preempted={self.preempted!r}, kernels_padded={self.kernels_padded!r}, "
                f"received={self.received!r}, run_cpu={self.run_cpu!r})")

    @property
    def latency(self) -> float:
        return self.end - self.arrival

    @property
    def queueing(self) -> float:
        return self.start - self.arrival


class Result:
    """What a successful request's future resolves to.

    ``deadline`` is the soft deadline (absolute, device clock); ``hard_deadline`` the hard
    one (absolute; inf: none) and ``kappa`` the accuracy factor κ of the model that served
    it (a variant group's variant; 1 otherwise): paper 001's quality inputs.

    Written by hand as ``Timings`` is (the dataclass's constructor, ``repr`` and field-wise
    ``==``; unhashable): compiled, a ``cdef class`` (request.pxd) built once a request
    without a Python frame; interpreted, a plain class with the same names."""

    def __init__(self, request_id: int, model: str, client: str, priority: Priority,
                 outputs: dict[str, np.ndarray], timings: Timings,
                 deadline: float = math.inf, hard_deadline: float = math.inf,
                 kappa: float = 1.0) -> None:
        self.request_id = request_id
        self.model = model
        self.client = client
        self.priority = priority
        self.outputs = outputs
        self.timings = timings
        self.deadline = deadline
        self.hard_deadline = hard_deadline
        self.kappa = kappa

    def _astuple(self) -> tuple:
        return (self.request_id, self.model, self.client, self.priority, self.outputs,
                self.timings, self.deadline, self.hard_deadline, self.kappa)

    def __eq__(self, other: object) -> bool:
        return _fields_equal(self, other)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value (as the dataclass)

    def __repr__(self) -> str:
        return (f"Result(request_id={self.request_id!r}, model={self.model!r}, "
                f"client={self.client!r}, priority={self.priority!r}, "
                f"outputs={self.outputs!r}, timings={self.timings!r}, "
                f"deadline={self.deadline!r}, hard_deadline={self.hard_deadline!r}, "
                f"kappa={self.kappa!r})")

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


#: ``Request(future=...)`` left out: a new ``Future`` (``None`` given stays ``None``: the
#: runtime sets its own future after building the request)
_NEW_FUTURE = object()


class Request:
    """One inference call as the scheduler holds it. Users never build these directly.

    ``deadline`` is absolute on the device clock (``math.inf``: none); ``stream`` the
    stream the scheduler last enqueued it on (-1: none yet), written by the scheduler only
    and read by a waiting caller as a hint of which lane to help (``Device.run_pending``);
    ``caller_runs`` (``Runtime.infer``) the thread (ident) that waits for this request and
    runs its launches itself (0: none): an enqueue made *on that thread* while it handles
    the arrival need not wake a lane worker, the thread helps right after;
    ``hard_deadline`` the absolute hard deadline (device clock; inf: none): a BE request
    still unanswered then is dropped wherever it is (DeadlineMissedError).

    Written by hand (compared by identity, as the ``eq=False`` dataclass it was): compiled,
    a ``cdef class`` with C fields (request.pxd) that the scheduler reads as struct members.
    """

    def __init__(self, id: int, model: str, inputs: dict[str, np.ndarray],
                 priority: Priority, client: str, deadline: float, drop_late: bool,
                 timings: Timings, future: Future | None = _NEW_FUTURE,  # type: ignore[assignment]
                 stream: int = -1, caller_runs: int = 0,
                 hard_deadline: float = math.inf) -> None:
        self.id = id
        self.model = model
        self.inputs = inputs
        self.priority = priority
        self.client = client
        self.deadline = deadline
        self.drop_late = drop_late
        self.timings = timings
        self.future = Future() if future is _NEW_FUTURE else future
        self.stream = stream
        self.caller_runs = caller_runs
        self.hard_deadline = hard_deadline

    def __repr__(self) -> str:
        return (f"Request(id={self.id!r}, model={self.model!r}, inputs={self.inputs!r}, "
                f"priority={self.priority!r}, client={self.client!r}, "
                f"deadline={self.deadline!r}, drop_late={self.drop_late!r}, "
                f"timings={self.timings!r}, future={self.future!r}, stream={self.stream!r}, "
                f"caller_runs={self.caller_runs!r}, hard_deadline={self.hard_deadline!r})")
