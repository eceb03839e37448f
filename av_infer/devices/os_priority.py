"""OS scheduling priority of the threads that run launches (Linux per-thread nice, SCHED_FIFO).

Why: on a CPU the device *is* the OS scheduler. Measured on the 2-core VM (docs/cpu_engine.md):
with best-effort work running on threads at the default priority, a periodic RT client
thread that wakes from its sleep waits for a core up to ~4 ms behind them (CFS wake-up
granularity), which is most of its p99; with the BE lanes at nice +10 the same wake-up
takes ~0.5 ms at p90. Lowering a thread's own priority is always permitted, so BE lanes are
niced by default (``be_nice``); raising the RT lanes (nice -5 or SCHED_FIFO) needs
CAP_SYS_NICE or an RLIMIT_NICE/RLIMIT_RTPRIO grant and is off by default (``rt_priority``).

A thread that *helps* (runs a lane's launches while it waits, ``Device.run_pending``) takes
the lane's priority for those launches and returns to its own afterwards; returning means
raising it again, so helpers are reniced only where the process may raise priority
(``can_restore``), and otherwise leave niced lanes to their own workers.

Where the process may raise priority back, a niced BE lane is niced **only while its model
runs** (``nice_during_runs``): the ORT run releases the GIL, but the Python around it (taking
the launch, answering it, the scheduler's completion handling) holds the GIL, and a niced
thread holding the GIL behind a core shared with other niced threads keeps a waking RT thread
waiting for the GIL for a whole CFS slice (a priority inversion). Measured on the zoo pair
(docs/cpu_engine.md, "BE lanes niced only while a model runs"): the RT client's lateness p99
fell from 2.2-2.7 ms to 1.5-1.6 ms. Where it may not, the whole worker thread stays niced.
In that mode a killed run's thread is also dropped to ``KILLED_NICE`` until ORT stops it
(what it still runs is thrown away) and takes its own priority back after the run.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["RT_PRIORITIES", "apply", "as_lane", "can_restore", "current_nice", "enter_lane",
           "leave_lane", "nice_during_runs", "nice_setter", "set_nice", "set_thread_nice"]

#: ``rt_priority`` values: leave RT lanes alone, nice -5, or SCHED_FIFO priority 10.
RT_PRIORITIES = ("off", "nice", "fifo")
RT_NICE = -5
RT_FIFO = 10
#: a killed BE run's thread until ORT stops it (only where priority can be restored)
KILLED_NICE = 19

_restore_ok: bool | None = None


def supported() -> bool:
    return hasattr(os, "setpriority") and hasattr(threading, "get_native_id")


def current_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def can_restore() -> bool:
    """Whether a thread may lower its nice value again after raising it (probed once, on a
    throwaway thread, so no thread is left at a lower priority)."""
    global _restore_ok
    if _restore_ok is None:
        result = [False]

        def probe() -> None:
            try:
                tid = threading.get_native_id()
                cur = os.getpriority(os.PRIO_PROCESS, tid)
                if cur >= 19:
                    return
                os.setpriority(os.PRIO_PROCESS, tid, cur + 1)
                os.setpriority(os.PRIO_PROCESS, tid, cur)
                result[0] = True
            except OSError:
                result[0] = False

        if supported():
            th = threading.Thread(target=probe, name="av_infer-nice-probe")
            th.start()
            th.join()
        _restore_ok = result[0]
    return _restore_ok


def apply(rt: bool, be_nice: int, rt_priority: str) -> tuple[int | None, str]:
    """Set the calling (lane worker) thread's priority; returns (nice or None, what was
    done, for telemetry). Never raises: refusals are reported."""
    if not supported():
        return None, "unsupported on this OS"
    tid = threading.get_native_id()
    if not rt:
        if be_nice <= 0:
            return None, "default"
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, current_nice() + be_nice))
        except OSError as e:
            return None, f"nice refused: {e}"
        return current_nice(), f"nice {current_nice()}"
    if rt_priority == "off":
        return None, "default"
    if rt_priority == "fifo":
        try:
            os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(RT_FIFO))
            return None, f"SCHED_FIFO {RT_FIFO}"
        except (OSError, AttributeError) as e:
            return None, f"SCHED_FIFO refused: {e}"
    try:
        os.setpriority(os.PRIO_PROCESS, tid, RT_NICE)
    except OSError as e:
        return None, f"nice {RT_NICE} refused: {e}"
    return current_nice(), f"nice {current_nice()}"


def nice_during_runs(be_nice: int) -> int | None:
    """A BE lane niced only while its model runs (module docstring): the nice value its
    runs take (``set_nice`` around each run), or None where it cannot be done (``be_nice``
    0, no per-thread nice, or the process may not raise priority back: then ``apply``
    nices the whole worker thread)."""
    if be_nice <= 0 or not supported() or not can_restore():
        return None
    return min(19, current_nice() + be_nice)


def set_nice(nice: int) -> None:
    """Set the calling thread's nice value (one syscall; the caller knows it may)."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def nice_setter(tid: int) -> Callable[[int], None]:
    """``set(nice)`` for thread ``tid`` (native id) as one C call: what a lane running on
    that thread calls around each run, without a Python frame or a thread-id read per
    call. Raises OSError as ``set_nice`` does."""
    return functools.partial(os.setpriority, os.PRIO_PROCESS, tid)


def set_thread_nice(tid: int, nice: int) -> bool:
    """Set another thread's nice value (lowering is always permitted); False if refused."""
    try:
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError:
        return False
    return True


def enter_lane(nice: int) -> int | None:
    """Take the lane's nice value on this thread (the caller checked ``can_restore``);
    returns the thread's own value for ``leave_lane``, or None when it already had it.
    (A pair of calls, not a context manager: this is on every helped launch.)"""
    tid = threading.get_native_id()
    own = os.getpriority(os.PRIO_PROCESS, tid)
    if own == nice:
        return None
    os.setpriority(os.PRIO_PROCESS, tid, nice)
    return own


def leave_lane(own: int | None) -> None:
    """Give the thread its own nice value back (``enter_lane``'s result)."""
    if own is not None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), own)


@contextmanager
def as_lane(nice: int) -> Iterator[None]:
    """Run the body at the lane's nice value, then restore the thread's own (the caller
    checked ``can_restore``)."""
    own = enter_lane(nice)
    try:
        yield
    finally:
        leave_lane(own)
