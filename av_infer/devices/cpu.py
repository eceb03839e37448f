"""The CPU device: numpy kernels run kernel by kernel by one worker thread per stream.

Why it exists: the default device on a machine without a GPU, and the one that proves the
scheduler's preemption gives real, bit-identical results (DESIGN.md). Each stream is a
*lane*: a worker thread with a device queue (a deque of transmitted launches) fed from the
stream's vHQ (``av_infer._cy.vhq.VHQ``) while fewer than ``c`` launches are in flight.
Before each kernel the worker reads the lane's preemption flag: set, the launch evicts
itself (``Completion(executed=False)``, REEF's lazy eviction); clear, the kernel runs.
Preemption is real and at kernel granularity; a running numpy kernel is never interrupted.

Limits: stream priorities are recorded but not honoured (the OS schedules the lanes'
threads; ``prio_streams`` therefore behaves like ``streams`` here); lanes share the GIL
outside numpy's GIL-free sections.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from av_infer._cy.vhq import MAX_C, VHQ
from av_infer.devices.base import Completion, CompletionCallback, Device, ResetInfo
from av_infer.errors import DeviceFaultError
from av_infer.kernels.cpu import CpuPlanRunner
from av_infer.model.plan import Plan

#: Largest per-stream capacity the vHQ supports (its in-flight ring).
MAX_CAPACITY = MAX_C  # the vHQ in-flight ring bounds c


@dataclass(eq=False)
class _Model:
    plan: Plan
    runner: CpuPlanRunner
    weight_bytes: int


@dataclass(eq=False)
class _Task:
    model: _Model
    arena: np.ndarray
    fns: list
    error: BaseException | None = None
    error_kernel: int = -1


@dataclass(eq=False)
class _Lane:
    id: int
    priority: int
    vhq: VHQ
    cond: threading.Condition = field(default_factory=threading.Condition)
    dq: deque = field(default_factory=deque)  # transmitted launches, oldest first
    flag: bool = False
    capacity: int | None = None  # per-stream override of the device capacity
    thread: threading.Thread | None = None
    executed: int = 0
    evicted: int = 0


class CpuDevice(Device):
    """Worker-lane device; see the module docstring."""

    name = "cpu"
    padding_reason = ("numpy kernels run whole, one per worker lane: there are no free SMs "
                      "for a padded launch to give BE blocks")
    virtual = False

    def __init__(self, c: int = 4, blas_threads: int | None = 1) -> None:
        """``blas_threads``: BLAS threads per kernel while the device runs (None: leave the
        library's default). The lanes are the parallelism; BLAS threads on top of them
        oversubscribe the cores (measured on 2 cores: scaled resnet152 3.7 ms with one BLAS
        thread, 15-19 ms with OpenBLAS's default while another process was busy)."""
        self._c = int(c)
        self._blas_threads = blas_threads
        self._blas_limit: Any = None
        self._lanes: list[_Lane] = []
        self._tasks: dict[int, _Task] = {}
        self._on_complete: CompletionCallback | None = None
        self._stopping = False
        self._started = False
        self._closed = False
        self._lock = threading.Lock()

    # -- clock ----------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter()

    # -- models and tasks -----------------------------------------------------------------
    def load_plan(self, plan: Plan) -> _Model:
        runner = CpuPlanRunner(plan)
        wb = sum(int(np.asarray(w).nbytes) for w in plan.weights.values())
        return _Model(plan, runner, wb)

    def unload_plan(self, handle: Any) -> None:
        handle.runner = None

    def resident_bytes(self, handle: Any) -> int:
        return handle.weight_bytes

    def new_task(self, handle: Any, task: int) -> None:
        arena = handle.runner.new_arena()
        self._tasks[task] = _Task(handle, arena, handle.runner.bind(arena))

    def release_task(self, task: int) -> None:
        self._tasks.pop(task, None)

    def write_inputs(self, task: int, inputs: dict[str, np.ndarray]) -> None:
        t = self._tasks[task]
        t.model.runner.write_inputs(t.arena, inputs)

    def read_outputs(self, task: int) -> dict[str, np.ndarray]:
        t = self._tasks[task]
        if t.error is not None:
            raise DeviceFaultError(
                f"kernel {t.error_kernel} of {t.model.plan.name} failed on the cpu device: "
                f"{type(t.error).__name__}: {t.error}"
            ) from t.error
        return t.model.runner.read_outputs(t.arena)

    # -- streams --------------------------------------------------------------------------
    def open_stream(self, priority: int) -> int:
        with self._lock:
            lane = _Lane(len(self._lanes), int(priority), VHQ(min(self._c, MAX_CAPACITY)))
            self._lanes.append(lane)
            if self._started:
                self._spawn(lane)
        return lane.id

    def enqueue(self, stream: int, task: int, first: int, last: int) -> None:
        lane = self._lanes[stream]
        with lane.cond:
            lane.vhq.push(task, first, last)
            self._transmit(lane)
            lane.cond.notify()

    def reset(self, stream: int) -> ResetInfo | None:
        lane = self._lanes[stream]
        with lane.cond:
            r = lane.vhq.reset()
            return None if r is None else ResetInfo(*r, restore_c=lane.vhq.restore_c)

    def in_flight(self, stream: int) -> int:
        return self._lanes[stream].vhq.in_flight

    def set_preempt(self, stream: int, flag: bool) -> None:
        lane = self._lanes[stream]
        with lane.cond:
            lane.flag = bool(flag)
            lane.cond.notify()

    def set_capacity(self, c: int) -> None:
        if not 1 <= c <= MAX_CAPACITY:
            raise ValueError(f"capacity must be in 1..{MAX_CAPACITY}, got {c}")
        self._c = int(c)
        for lane in self._lanes:
            with lane.cond:
                lane.capacity = None
                lane.vhq.c = self._c
                self._transmit(lane)
                lane.cond.notify()

    def set_stream_capacity(self, stream: int, c: int) -> None:
        if not 1 <= c <= MAX_CAPACITY:
            raise ValueError(f"capacity must be in 1..{MAX_CAPACITY}, got {c}")
        lane = self._lanes[stream]
        with lane.cond:
            lane.capacity = int(c)
            lane.vhq.c = int(c)
            self._transmit(lane)
            lane.cond.notify()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, on_complete: CompletionCallback) -> None:
        with self._lock:
            if self._started:
                raise RuntimeError("cpu device already started")
            self._on_complete = on_complete
            self._started = True
            if self._blas_threads is not None:
                self._blas_limit = threadpool_limits(self._blas_threads, user_api="blas")
            for lane in self._lanes:
                self._spawn(lane)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stopping = True
            lanes = list(self._lanes)
            if self._blas_limit is not None:
                self._blas_limit.restore_original_limits()
                self._blas_limit = None
        for lane in lanes:
            with lane.cond:
                lane.cond.notify_all()
        me = threading.current_thread()
        for lane in lanes:
            if lane.thread is not None and lane.thread is not me:
                lane.thread.join()
        self._tasks.clear()

    def telemetry(self) -> dict[str, Any]:
        return {
            "device": self.name,
            "streams": [
                {"id": ln.id, "priority": ln.priority, "queued": ln.vhq.queued,
                 "in_flight": ln.vhq.in_flight, "flag": ln.flag,
                 "capacity": ln.vhq.c, "executed": ln.executed, "evicted": ln.evicted}
                for ln in self._lanes
            ],
            "tasks": len(self._tasks),
            "stream_priorities_honoured": False,
        }

    # -- the lanes ------------------------------------------------------------------------
    def _spawn(self, lane: _Lane) -> None:
        lane.thread = threading.Thread(
            target=self._run_lane, args=(lane,), name=f"av_infer-cpu-lane{lane.id}", daemon=True
        )
        lane.thread.start()

    @staticmethod
    def _transmit(lane: _Lane) -> None:
        """Move launches from the vHQ to the device queue while fewer than c are in flight
        (caller holds ``lane.cond``)."""
        vhq, dq = lane.vhq, lane.dq
        while True:
            x = vhq.transmit()
            if x is None:
                return
            dq.append(x)

    def _run_lane(self, lane: _Lane) -> None:
        cond = lane.cond
        now = time.perf_counter
        while True:
            with cond:
                while not lane.dq and not self._stopping:
                    cond.wait()
                if self._stopping:
                    return
                task, k = lane.dq.popleft()
            t0 = now()
            executed = not lane.flag  # the flag check at the start of every kernel
            if executed:
                rec = self._tasks.get(task)
                if rec is None:
                    executed = False
                elif rec.error is None:
                    try:
                        rec.fns[k]()
                    except BaseException as e:  # noqa: BLE001 - reported at read_outputs
                        rec.error, rec.error_kernel = e, k
                lane.executed += executed
            else:
                lane.evicted += 1
            t1 = now()
            with cond:
                lane.vhq.complete()
                self._transmit(lane)
            cb = self._on_complete
            if cb is not None and not self._stopping:
                cb(Completion(lane.id, task, k, executed, t0, t1))
