# cython: annotation_typing=False, language_level=3
"""``Completion``: the record every device hands the scheduler when a launch leaves it.

Why a module of its own, compiled: one record is built per launch (per request on the cpu
device, per kernel in the simulator) and the compiled scheduler reads eight of its fields
each time. As a frozen dataclass it cost ~9 k instructions to build (one ``__dict__``
write) and its fields were read through the interpreter's generic attribute lookup; with
``completion.pxd`` beside it (Cython's pure-Python mode, listed in
``av_infer/_cy/compiled.py``) it is a ``cdef class`` with C fields that the scheduler
(``sched/scheduler.pxd`` cimports it) reads as struct members (docs/request_path.md).

Guarantees, the same in both forms (``AV_INFER_INTERPRETED=1`` runs this file as it is):
the dataclass's constructor (positions, defaults), value equality over every field (a NaN
time equals a NaN time, so records built by different devices compare as the dataclass's
did), hashing, its ``repr``, assignment refused with ``dataclasses.FrozenInstanceError``,
pickling. Not kept: ``dataclasses.fields``/``replace``/``asdict`` (nothing used them;
``FIELDS`` names the fields in order).
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import cython

__all__ = ["FIELDS", "Completion"]

_NAN = float("nan")
_set = object.__setattr__

#: the record's fields, in constructor order
FIELDS = ("stream", "task", "kernel", "executed", "t_start", "t_end", "parts", "t_stop",
          "cpu_s", "count", "times")


class Completion:
    """One launch left the device: it ran (``executed``) or evicted itself at its flag check.

    ``executed`` is ``None`` where the device cannot tell (CUDA kernels that return at the
    flag check look like completed ones).

    Fields (read-only):

    * ``stream``, ``task``, ``kernel``: which launch; ``t_start``, ``t_end``: when it ran.
    * ``parts``: a padded launch's (``Device.enqueue_padded``) BE parts that ran with it,
      each ``(task, kernel, first_block, n_blocks, blocks_per_sm)``; () for a plain launch.
      The device owns the parts as part of its launch record from ``enqueue_padded`` on;
      they leave it here (the launch completed) or in ``ResetInfo.dropped_parts`` (a reset
      dropped the launch), exactly once.
    * ``t_stop``: a launch that was running when its stream's flag went up (cpu): when it
      gave its core back, i.e. the flag time plus the CPU time it used after it (its
      thread's CPU clock), so the wait of that thread for the GIL or a core before it could
      report is not counted; NaN otherwise (then ``t_end`` is the stop).
    * ``cpu_s``: CPU seconds the launch used on the thread that ran it, where the device
      measures it (cpu, RT lanes); NaN otherwise. Beside ``t_end - t_start`` it tells a
      launch slowed by the machine (CPU time grows with it) from one that waited (for a
      core or the GIL: CPU time does not grow).
    * ``count``: launches this record stands for: kernels ``kernel .. kernel + count - 1``
      of ``task``, consecutive on ``stream`` (a *coalesced* record, only from a device
      started with ``coalesce=True``, see ``Device.coalesces``). ``t_start`` is the first
      one's, ``t_end`` the last one's; the status is success for all, ``executed`` the same
      for all, no padded launch among them (``parts`` is ()), ``t_stop`` and ``cpu_s`` NaN.
      ``Scheduler.on_complete`` applies it exactly as ``count`` single records.
    * ``times``: per launch of a coalesced record, ``(t_start, t_end)`` of each, flattened
      (``2 * count`` values); () when ``count`` is 1: what a single record per launch would
      have carried (preemption latency, "kernel" listener events, a first kernel's start).
    """

    def __init__(self, stream: int, task: int, kernel: int, executed: bool | None,
                 t_start: float, t_end: float,
                 parts: tuple[tuple[int, int, int, int, int], ...] = (),
                 t_stop: float = _NAN, cpu_s: float = _NAN, count: int = 1,
                 times: tuple[float, ...] = ()) -> None:
        if cython.compiled:  # C fields: written here, read-only from Python
            self.stream = stream
            self.task = task
            self.kernel = kernel
            self.executed = executed
            self.t_start = t_start
            self.t_end = t_end
            self.parts = parts
            self.t_stop = t_stop
            self.cpu_s = cpu_s
            self.count = count
            self.times = times
        else:  # interpreted: one __dict__ write past the refusing __setattr__
            _set(self, "__dict__", {"stream": stream, "task": task, "kernel": kernel,
                                    "executed": executed, "t_start": float(t_start),
                                    "t_end": float(t_end), "parts": tuple(parts),
                                    "t_stop": float(t_stop), "cpu_s": float(cpu_s),
                                    "count": count, "times": tuple(times)})

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def _key(self) -> tuple:
        """Every field, NaN times as None (so that equal records compare equal)."""
        t_stop, cpu_s = self.t_stop, self.cpu_s
        return (self.stream, self.task, self.kernel, self.executed, self.t_start, self.t_end,
                self.parts, None if t_stop != t_stop else t_stop,
                None if cpu_s != cpu_s else cpu_s, self.count, self.times)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Completion):
            return NotImplemented
        return self._key() == other._key()

    def __ne__(self, other: object) -> bool:
        if not isinstance(other, Completion):
            return NotImplemented
        return self._key() != other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"Completion(stream={self.stream!r}, task={self.task!r}, "
                f"kernel={self.kernel!r}, executed={self.executed!r}, "
                f"t_start={self.t_start!r}, t_end={self.t_end!r}, parts={self.parts!r}, "
                f"t_stop={self.t_stop!r}, cpu_s={self.cpu_s!r}, count={self.count!r}, "
                f"times={self.times!r})")

    def __reduce__(self) -> tuple:
        return (Completion, (self.stream, self.task, self.kernel, self.executed,
                             self.t_start, self.t_end, self.parts, self.t_stop, self.cpu_s,
                             self.count, self.times))

    def singles(self) -> list[Completion]:
        """The single records this one stands for, in stream order ([self] if count 1)."""
        if self.count == 1:
            return [self]
        tt = self.times
        return [Completion(self.stream, self.task, self.kernel + i, self.executed,
                           tt[2 * i], tt[2 * i + 1]) for i in range(self.count)]
