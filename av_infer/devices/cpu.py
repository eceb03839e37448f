"""The CPU device: worker lanes running plans launch by launch, ONNX Runtime as the engine.

Why it exists: the default device on a machine without a GPU, and the one every user has.
Each stream is a *lane*: a worker thread with a device queue (a deque of transmitted
launches) fed from the stream's vHQ (``av_infer._cy.vhq.VHQ``) while fewer than ``c``
launches are in flight. Before each launch the worker reads the lane's preemption flag: set,
the launch evicts itself (``Completion(executed=False)``, REEF's lazy eviction); clear, it
runs.

Two engines, one lane loop (``engine=``):

* ``"ort"`` (default): models compile to *segment plans* (``model.segments``): a launch is
  one segment, run by ONNX Runtime on the task's arena without the GIL. Raising a lane's
  flag also **kills** the segment it is running (``RunOptions.terminate``: ORT stops between
  two of its kernels), unless its estimated remaining time is below ``kill_below_ms``
  ("auto", the default: ORT's measured cost of a killed run, within 0.2-1 ms); a
  killed launch completes as evicted and restore-from-c re-runs it from its start (segments
  are idempotent). RT models (``whole=True``) are one segment: full ORT speed.
* ``"numpy"``: av_infer's own kernel plans on the numpy executor (the reference; kernel
  granularity, never killed). Plans handed in ready-made run on the engine they were
  compiled for.

Stream priorities are OS priorities (``devices.os_priority``): BE lanes run at nice +10 by
default (``be_nice``; always permitted), so a waking RT thread gets a core at once; where the
process may raise a thread's priority back, only a BE lane's model runs are niced and the
Python around them (which holds the GIL an RT thread may be waiting for) runs at the thread's
own priority, and a killed run drops to nice 19 until ORT stops it. RT lanes may be raised
(``rt_priority`` "nice" or "fifo", where permitted; off by default). Shown in
``telemetry``.

Callers that wait run their request's launches themselves when the lane is idle
(``run_pending``, used by ``Runtime.infer`` and ``Future.result``): no thread hand-off.

A lane's thread that dies (an exception outside the per-launch handler: a bug, or the
``"lane"`` fault of ``devices.faults``) is noticed on its way out: the launch it held
completes with its task marked failed (``read_outputs`` raises DeviceFaultError), and a new
thread takes the lane over and runs what is queued, so every other request is still served
(``telemetry()["streams"][i]["restarts"]``). Fault hook points (``devices.faults``):
``"kernel"`` where a launch runs, ``"lane"`` just before it (outside the handler),
``"load"``/``"oom"`` in ``load_plan``.
"""

from __future__ import annotations

import logging
import os
import platform
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from av_infer._cy.vhq import MAX_C, VHQ
from av_infer.devices import os_priority
from av_infer.devices.base import Completion, CompletionCallback, Device, ResetInfo
from av_infer.errors import (
    DeviceFaultError,
    InvalidParameterError,
)
from av_infer.kernels.cpu import CpuPlanRunner
from av_infer.kernels.ort_segments import (
    SegmentRunner,
    is_kill,
    is_segment_plan,
    measure_kill_cost,
)
from av_infer.latency import LatencyRecorder, summarize_ms
from av_infer.model.plan import Plan

log = logging.getLogger(__name__)

#: Largest per-stream capacity the vHQ supports (its in-flight ring).
MAX_CAPACITY = MAX_C  # the vHQ in-flight ring bounds c
ENGINES = ("ort", "numpy")
#: the least "auto" sets kill_below_ms to (s): the fixed default before it was measured
KILL_BELOW_FLOOR_S = 0.2e-3
#: the most "auto" sets it to (s): a measurement far above ORT's ~0.3 ms would otherwise
#: stop kills of whole segments (target ``segment_ms`` 4) and lengthen preemption
KILL_BELOW_CAP_S = 1e-3
#: Arenas (with their bound launches) kept per model for reuse by the next task.
_POOL = 4
#: Segment plans: inputs and outputs at least this large are bound in place (the request's
#: own arrays, no copy); smaller ones are copied (a re-binding costs more than the copy).
ZERO_COPY_BYTES = 64 * 1024


@dataclass(eq=False)
class _Model:
    plan: Plan
    runner: Any  # CpuPlanRunner | SegmentRunner
    weight_bytes: int
    killable: bool
    est_s: list[float]  # per launch: estimated duration (s), for the kill rule
    pool: list[_Bound] = field(default_factory=list)


@dataclass(eq=False)
class _Bound:
    """An arena with everything bound to it once: the launches and the input/output views
    (reused by the model's next task, so a request builds nothing per launch)."""

    arena: np.ndarray
    #: what launch k calls: the runner's C-level callable where it has one
    #: (``_SegmentFn.call``, a partial over ORT's pybind run: no Python frame per launch),
    #: else the bound launch itself
    fns: list
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    #: the runner's bound launches (``runner.bind``), what ``runner.rebind`` re-points
    binds: list = field(default_factory=list)
    #: segment plans, tensors of ``ZERO_COPY_BYTES`` or more (fixed per model, shapes are
    #: static): inputs bound to the request's own arrays, outputs to a fresh array per task
    #: that is handed to the caller without a copy
    zero_in: frozenset[str] = frozenset()
    zero_out: frozenset[str] = frozenset()
    #: the arrays the zero-copy inputs are bound to now (kept alive while bound)
    held: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(eq=False)
class _Task:
    model: _Model
    bound: _Bound
    error: BaseException | None = None
    error_kernel: int = -1


_NAN = float("nan")
_clocks = threading.local()


def _thread_ids() -> tuple[int, int]:
    """The calling thread's CPU-time clock id (0 where unsupported) and native id, read once
    per thread and cached (a lane's drain reads both at every entry)."""
    ids = getattr(_clocks, "ids", None)
    if ids is None:
        try:
            clk = time.pthread_getcpuclockid(threading.get_ident())
        except (AttributeError, OSError):
            clk = 0
        ids = _clocks.ids = (clk, threading.get_native_id())
    return ids


def _cpu_time(clk: int) -> float:
    """CPU seconds of the thread whose clock is ``clk`` (any thread may read it)."""
    if not clk:
        return 0.0
    try:
        return time.clock_gettime(clk)
    except OSError:  # the thread is gone
        return 0.0


def _locked() -> threading.Lock:
    lk = threading.Lock()
    lk.acquire()
    return lk


def _signal(ev: threading.Lock) -> None:
    """Set a binary event made of a lock (released = signalled); idempotent."""
    try:
        ev.release()
    except RuntimeError:  # already signalled
        pass


@dataclass(eq=False)
class _Lane:
    """A stream: its vHQ, its device queue and its worker.

    ``dq`` holds transmitted launches in stream order; ``lock`` orders transmissions
    (vHQ -> dq) and makes the flag check and the kill handshake atomic. ``token`` is held by
    the one thread running the stream's launches: the lane's worker, or a caller helping
    (``run_pending``). ``wake`` is a binary event (a lock that is *released* to signal) the
    worker blocks on without the GIL."""

    id: int
    priority: int
    vhq: VHQ
    lock: threading.Lock = field(default_factory=threading.Lock)
    dq: deque = field(default_factory=deque)
    token: threading.Lock = field(default_factory=threading.Lock)
    wake: threading.Lock = field(default_factory=_locked)
    flag: bool = False
    capacity: int | None = None  # per-stream override of the device capacity
    thread: threading.Thread | None = None
    # the launch running now: its RunOptions (killable engines), start time, estimate
    running: Any = None
    #: the last launch's RunOptions when nothing terminated it (the next launch reuses it;
    #: a terminated one is sticky, so a kill always costs a fresh one)
    ro_spare: Any = None
    run_t0: float = 0.0
    run_est: float = 0.0
    busy: bool = False  # a launch is executing (any engine)
    run_clk: int = 0  # CPU-time clock of the thread running the launch
    run_tid: int = 0  # native id of that thread
    #: (wall time, that thread's CPU time) when the flag went up during the running launch
    flag_mark: tuple[float, float] | None = None
    executed: int = 0
    evicted: int = 0
    killed: int = 0
    nice: int | None = None  # the worker's nice value where it was changed
    #: the nice value of this lane's model runs where only the runs are niced (the thread
    #: keeps its own priority for the Python around them: os_priority.nice_during_runs)
    run_nice: int | None = None
    #: the launch running now was reniced to ``run_nice`` (a kill drops it further, to nice
    #: 19); the thread's own priority comes back under ``lock`` after the run. Runs shorter
    #: than ``kill_below`` are neither reniced nor killed
    niced: bool = False
    prio_desc: str = ""  # what was done to the worker's OS priority (telemetry)
    #: callers may run this lane's launches (``run_pending``): the worker has set its
    #: priority, and a helper can take it and give it back (never SCHED_FIFO)
    helpable: bool = False
    #: the launch taken from ``dq`` and not yet completed: (task, kernel, start time); what
    #: a thread that dies running the lane leaves to be answered (``_fail_hand``)
    hand: tuple[int, int, float] | None = None
    restarts: int = 0  # worker threads that died and were replaced


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"

class CpuDevice(Device):
    """Worker-lane device; see the module docstring."""

    name = "cpu"
    virtual = False
    #: with the defaults (be_nice 10, one thread per RT task): padding needs a spare core;
    #: each instance decides for its own settings (``__init__``)
    supports_padding = (os.cpu_count() or 1) > 1

    def __init__(self, c: int = 4, blas_threads: int | None = 1, engine: str = "ort",
                 threads: int = 1, segment_ms: float = 4.0, kill: bool = True,
                 kill_below_ms: float | str = "auto", be_nice: int = 10,
                 rt_priority: str = "off", rt_parallel: int | None = None) -> None:
        """``engine``: "ort" (ONNX Runtime segments) or "numpy" (the reference kernels).
        ``threads``: ORT intra-op threads per session (fixed: deterministic results).
        ``segment_ms``: target segment duration of models that are cut (BE models).
        ``kill``/``kill_below_ms``: kill the running segment on preemption unless less than
        ``kill_below_ms`` of it is estimated to remain; "auto": what a killed run costs its
        thread after ORT stops, measured at start (``ort_segments.measure_kill_cost``; 0.3
        ms on a slow 2-core VM), within 0.2-1 ms: a segment with less left finishes sooner
        than a kill stops it, and keeps its work. ``blas_threads``: BLAS threads of
        the numpy engine (None: the library's default; more than one oversubscribes the
        lanes). ``be_nice``: nice increment of BE lanes (0: default priority);
        ``rt_priority``: "off", "nice" or "fifo" for RT lanes (see devices.os_priority).
        ``rt_parallel``: RT requests that may run at once, each on an RT lane of its own
        (None: one per ``threads`` cores; 1: REEF's one RT task at a time)."""
        if engine not in ENGINES:
            raise InvalidParameterError(f"engine must be one of {ENGINES}, got {engine!r}")
        if rt_priority not in os_priority.RT_PRIORITIES:
            raise InvalidParameterError(
                f"rt_priority must be one of {os_priority.RT_PRIORITIES}, got {rt_priority!r}")
        if isinstance(be_nice, bool) or not isinstance(be_nice, int) or not 0 <= be_nice <= 19:
            raise InvalidParameterError(f"be_nice must be an int in 0..19, got {be_nice!r}")
        if not isinstance(threads, int) or not 1 <= threads <= 256:
            raise InvalidParameterError(f"threads must be an int in 1..256, got {threads!r}")
        cores = os.cpu_count() or 1
        if rt_parallel is None:
            rt_parallel = max(1, cores // threads)
        if isinstance(rt_parallel, bool) or not isinstance(rt_parallel, int) \
                or not 1 <= rt_parallel <= 64:
            raise InvalidParameterError(
                f"rt_parallel must be an int in 1..64, got {rt_parallel!r}")
        auto_kill = kill_below_ms == "auto"
        if not auto_kill and (isinstance(kill_below_ms, bool)
                              or not isinstance(kill_below_ms, (int, float))
                              or not kill_below_ms >= 0):
            raise InvalidParameterError(
                f"kill_below_ms must be 'auto' or a number >= 0, got {kill_below_ms!r}")
        if not segment_ms > 0:
            raise InvalidParameterError(f"segment_ms must be > 0, got {segment_ms!r}")
        self.engine = engine
        self.threads = threads
        self.segment_ms = float(segment_ms)
        self.kill = bool(kill)
        #: "auto" (measured at start) or "set"
        self.kill_below_source = "auto" if auto_kill else "set"
        self.kill_below_s = KILL_BELOW_FLOOR_S if auto_kill else float(kill_below_ms) / 1e3
        #: what a killed ORT run cost its thread, measured at start ("auto" only; None if not)
        self.kill_cost_s: float | None = None
        self.be_nice = be_nice
        self.rt_priority = rt_priority
        # Padding on a CPU (``reef_dkp``): an RT task runs on one core (``threads``); BE lanes
        # keep the other cores, at a lower OS priority so they cannot take RT's (DKP rule 2
        # by the OS). Without BE nice there is no such guarantee: no padding.
        self.be_beside_rt = max(0, cores - threads) if be_nice > 0 else 0
        self.rt_parallel = rt_parallel
        self.rt_task_cores = threads
        self.supports_padding = self.be_beside_rt > 0
        self.padding_reason = (
            f"padding keeps BE on the cores an RT task leaves free ({cores} cores, "
            f"{threads} per RT task); it needs a spare core and be_nice > 0")
        #: helpers may take a niced lane's priority and give it back (probed at start)
        self._renice_helpers = False
        #: kill -> the killed launch gave its core back (its thread's CPU clock), all lanes
        self._kill_latency = LatencyRecorder(4096)
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
        #: the device clock as the C function itself: the scheduler reads it several times
        #: a request, and the method below would add a Python frame to each read
        self.now = time.perf_counter  # type: ignore[method-assign]

    # -- clock ----------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter()

    # -- models and tasks -----------------------------------------------------------------
    def compile(self, source: Any, input_shapes: Any = None, name: str | None = None,
                whole: bool = False) -> Plan:
        if self.engine == "numpy":
            return super().compile(source, input_shapes, name, whole)
        from av_infer.model.segments import compile_segments

        return compile_segments(source, input_shapes, name=name,
                                segment_ms=None if whole else self.segment_ms)

    def compile_key(self, whole: bool = False) -> dict[str, Any]:
        """The ORT engine cuts by time profiled on this CPU at ``segment_ms``."""
        if self.engine == "numpy":
            return {"engine": "numpy"}
        return {"engine": self.engine, "segment_ms": None if whole else float(self.segment_ms),
                "cpu": f"{platform.machine()} {cpu_model()}"}

    def load_plan(self, plan: Plan) -> _Model:
        if self.faults is not None:
            self.faults.check_load(plan.name, self.name)
        if is_segment_plan(plan):
            runner: Any = SegmentRunner(plan, self.threads)
            est = [float(k.args.get("est_ms", 0.0)) / 1e3 for k in plan.kernels]
            return _Model(plan, runner, runner.weight_bytes, True, est)
        runner = CpuPlanRunner(plan)
        wb = sum(int(np.asarray(w).nbytes) for w in plan.weights.values())
        return _Model(plan, runner, wb, False, [0.0] * len(plan.kernels))

    def unload_plan(self, handle: Any) -> None:
        handle.runner = None
        handle.pool.clear()

    def resident_bytes(self, handle: Any) -> int:
        return handle.weight_bytes

    def new_task(self, handle: Any, task: int) -> None:
        with self._lock:
            b = handle.pool.pop() if handle.pool else None
        if b is None:
            r = handle.runner
            arena = r.new_arena()
            binds = r.bind(arena)
            b = _Bound(arena, [getattr(f, "call", f) for f in binds],
                       {n: r.view(arena, n) for n in handle.plan.inputs},
                       {n: r.view(arena, n) for n in handle.plan.outputs}, binds)
            if handle.killable:
                b.zero_in = frozenset(n for n, v in b.inputs.items()
                                      if v.nbytes >= ZERO_COPY_BYTES)
                b.zero_out = frozenset(n for n, v in b.outputs.items()
                                       if v.nbytes >= ZERO_COPY_BYTES)
        for name in b.zero_out:  # the previous task's arrays were handed over
            v = b.outputs[name] = np.empty(b.outputs[name].shape, b.outputs[name].dtype)
            handle.runner.rebind(b.binds, name, v)
        self._tasks[task] = _Task(handle, b)

    def release_task(self, task: int) -> None:
        t = self._tasks.pop(task, None)
        if t is not None and t.error is None and t.model.runner is not None:
            with self._lock:
                if len(t.model.pool) < _POOL:
                    t.model.pool.append(t.bound)

    def write_inputs(self, task: int, inputs: dict[str, np.ndarray]) -> None:
        t = self._tasks[task]
        b = t.bound
        views = b.inputs
        # exact: what Runtime.submit lets through for these regions (the same names,
        # C-contiguous arrays of the exact shape and dtype); checked inline, once a request
        exact = inputs.keys() == views.keys()
        if exact:
            for n, v in inputs.items():
                dst = views[n]
                if not (isinstance(v, np.ndarray) and v.shape == dst.shape
                        and v.dtype == dst.dtype and v.flags.c_contiguous):
                    exact = False
                    break
        if not exact:
            # not what Runtime.submit validates: the runner's checks raise the typed error
            # or copy with a safe cast into the arena, whose regions the task then reads
            t.model.runner.write_inputs(b.arena, inputs)
            inputs = b.inputs
        for name, v in inputs.items():
            if name in b.zero_in:  # the segments read the request's (private) array
                if b.held.get(name) is not v:
                    t.model.runner.rebind(b.binds, name, v)
                    b.held[name] = v
            elif v is not b.inputs[name]:
                b.inputs[name][...] = v  # np.copyto of an exact match, without its wrapper

    def read_outputs(self, task: int) -> dict[str, np.ndarray]:
        t = self._tasks[task]
        if t.error is not None:
            raise DeviceFaultError(
                f"{'segment' if t.model.killable else 'kernel'} {t.error_kernel} of "
                f"{t.model.plan.name} failed on the cpu device: "
                f"{type(t.error).__name__}: {t.error}"
            ) from t.error
        # zero-copy outputs are fresh per task (new_task): handed over as they are; the
        # rest are arena views: copied
        zero = t.bound.zero_out
        out = {}
        for name, v in t.bound.outputs.items():  # a loop, not a comprehension: no frame
            out[name] = v if name in zero else v.copy()
        return out

    # -- streams --------------------------------------------------------------------------
    def open_stream(self, priority: int) -> int:
        with self._lock:
            lane = _Lane(len(self._lanes), int(priority), VHQ(min(self._c, MAX_CAPACITY)))
            self._lanes.append(lane)
            if self._started:
                self._spawn(lane)
        return lane.id

    def enqueue(self, stream: int, task: int, first: int, last: int,
                wake: bool = True) -> None:
        lane = self._lanes[stream]
        with lane.lock:
            lane.vhq.push(task, first, last)
            if lane.vhq.transmit_into(lane.dq) and wake:  # _transmit, inline
                _signal(lane.wake)

    def reset(self, stream: int) -> ResetInfo | None:
        lane = self._lanes[stream]
        with lane.lock:
            r = lane.vhq.reset()
            return None if r is None else ResetInfo(*r, running=lane.busy)

    def set_preempt(self, stream: int, flag: bool) -> None:
        lane = self._lanes[stream]
        with lane.lock:
            lane.flag = bool(flag)
            if flag and lane.busy and lane.flag_mark is None:
                now = time.perf_counter()
                lane.flag_mark = (now, _cpu_time(lane.run_clk))
                ro = lane.running
                if ro is not None and self.kill:
                    if self._worth_killing(lane.run_est, now - lane.run_t0):
                        ro.terminate = True  # ORT stops at its next kernel boundary
                        if lane.niced:
                            # what it still runs (to ORT's next node) is lost work: the
                            # lowest priority, so it takes no time from RT's cores (the
                            # thread's own comes back under this lock after the run)
                            os_priority.set_thread_nice(lane.run_tid, os_priority.KILLED_NICE)

    def _worth_killing(self, est: float, elapsed: float = 0.0) -> bool:
        """A run estimated at ``est`` seconds, ``elapsed`` into it, has enough left to be
        worth killing (``kill_below_ms``); no estimate (``est`` <= 0, a whole model compiled
        without a profile): always. A run not worth killing is not reniced either."""
        return est <= 0 or est - elapsed >= self.kill_below_s

    def set_capacity(self, c: int) -> None:
        if not 1 <= c <= MAX_CAPACITY:
            raise ValueError(f"capacity must be in 1..{MAX_CAPACITY}, got {c}")
        self._c = int(c)
        for lane in self._lanes:
            with lane.lock:
                lane.capacity = None
                lane.vhq.c = self._c
                self._transmit(lane, True)

    def set_stream_capacity(self, stream: int, c: int) -> None:
        if not 1 <= c <= MAX_CAPACITY:
            raise ValueError(f"capacity must be in 1..{MAX_CAPACITY}, got {c}")
        lane = self._lanes[stream]
        with lane.lock:
            lane.capacity = int(c)
            lane.vhq.c = int(c)
            self._transmit(lane, True)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, on_complete: CompletionCallback) -> None:
        with self._lock:
            if self._started:
                raise RuntimeError("cpu device already started")
            self._on_complete = on_complete
            self._started = True
            if self._blas_threads is not None:
                self._blas_limit = threadpool_limits(self._blas_threads, user_api="blas")
            self._renice_helpers = os_priority.supported() and os_priority.can_restore()
            if self.kill_below_source == "auto" and self.kill and self.engine == "ort":
                self._measure_kill_cost()
            for lane in self._lanes:
                self._spawn(lane)

    def _measure_kill_cost(self) -> None:
        """``kill_below_ms="auto"``: the threshold is the measured kill cost (at least the
        floor, at most the cap). A failed measurement keeps the floor and says so (log,
        ``kill_cost_ms`` None in ``telemetry``)."""
        try:
            self.kill_cost_s = measure_kill_cost(self.threads)
        except Exception as e:  # noqa: BLE001 - the floor still applies
            log.warning("cpu device: measuring ORT's kill cost failed (%s: %s); "
                        "kill_below_ms stays %.2f", type(e).__name__, e,
                        self.kill_below_s * 1e3)
            return
        self.kill_below_s = min(KILL_BELOW_CAP_S, max(KILL_BELOW_FLOOR_S, self.kill_cost_s))

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
            with lane.lock:
                if lane.running is not None:
                    lane.running.terminate = True
            _signal(lane.wake)  # the worker sees _stopping
        me = threading.current_thread()
        for lane in lanes:
            if lane.thread is not None and lane.thread is not me:
                lane.thread.join()
        self._tasks.clear()

    def _kill_ms(self) -> dict[str, Any]:
        with self._lock:
            sample = self._kill_latency.sample()
        return {**summarize_ms(sample), "count": sample[1]}

    def telemetry(self) -> dict[str, Any]:
        return {
            "device": self.name,
            "engine": self.engine,
            "threads_per_session": self.threads,
            "segment_ms": self.segment_ms,
            "kill": self.kill,
            "kill_below_ms": self.kill_below_s * 1e3,
            "kill_below": self.kill_below_source,
            "kill_cost_ms": None if self.kill_cost_s is None else self.kill_cost_s * 1e3,
            "be_nice": self.be_nice,
            "rt_priority": self.rt_priority,
            "rt_parallel": self.rt_parallel,
            "helpers_reniced": self._renice_helpers,
            "streams": [
                {"id": ln.id, "priority": ln.priority, "queued": ln.vhq.queued,
                 "in_flight": ln.vhq.in_flight, "flag": ln.flag,
                 "capacity": ln.vhq.c, "executed": ln.executed, "evicted": ln.evicted,
                 "killed": ln.killed, "restarts": ln.restarts,
                 "os_priority": ln.prio_desc}
                for ln in self._lanes
            ],
            "tasks": len(self._tasks),
            # kill -> the killed launch gave its core back (CPU clock of its thread)
            "kill_ms": self._kill_ms(),
            "stream_priorities_honoured": any(ln.prio_desc not in ("default", "")
                                              for ln in self._lanes),
        }

    # -- the lanes ------------------------------------------------------------------------
    def _spawn(self, lane: _Lane) -> None:
        lane.thread = threading.Thread(
            target=self._run_lane, args=(lane,), name=f"av_infer-cpu-lane{lane.id}", daemon=True
        )
        lane.thread.start()

    def _respawn(self, lane: _Lane, err: BaseException) -> None:
        """The lane's worker is dying of ``err`` (its launch in hand was answered by
        ``_fail_hand``): a new thread takes the lane over and runs what is queued."""
        log.error("cpu device: lane %d worker died (%s: %s); restarting it",
                  lane.id, type(err).__name__, err)
        with self._lock:
            if self._stopping:
                return
            lane.restarts += 1
            self._spawn(lane)
        _signal(lane.wake)  # launches left in the device queue

    def _fail_hand(self, lane: _Lane, err: BaseException) -> None:
        """A thread running ``lane`` died outside the per-launch handler: complete the
        launch it held (in stream order: it was the queue's head) with its task marked
        failed, so the request is answered with DeviceFaultError and the stream goes on.
        The caller still holds ``lane.token``, so no launch overtakes it."""
        comp = None
        with lane.lock:
            hand, lane.hand = lane.hand, None
            lane.running = None
            lane.busy = False
            lane.niced = False
            lane.flag_mark = None
            if hand is not None:
                task, k, t0 = hand
                rec = self._tasks.get(task)
                if rec is not None and rec.error is None:
                    rec.error = RuntimeError(
                        f"the thread running cpu lane {lane.id} died: "
                        f"{type(err).__name__}: {err}")
                    rec.error_kernel = k
                lane.vhq.complete()
                self._transmit(lane, False)  # the caller signals what it leaves
                comp = Completion(lane.id, task, k, True, t0, time.perf_counter())
        cb = self._on_complete
        if comp is not None and cb is not None and not self._stopping:
            cb(comp)

    def _apply_os_priority(self, lane: _Lane) -> None:
        """The worker's OS priority (devices.os_priority): BE lanes niced (only while a model
        runs where the priority can be restored), RT optional."""
        if lane.priority <= 0:
            run_nice = os_priority.nice_during_runs(self.be_nice)
            if run_nice is not None:
                lane.nice, lane.run_nice, lane.helpable = None, run_nice, True
                lane.prio_desc = (f"nice {run_nice} while a model runs (runs estimated under "
                                  "kill_below_ms: own priority)")
                return
        nice, desc = os_priority.apply(lane.priority > 0, self.be_nice, self.rt_priority)
        lane.nice, lane.prio_desc = nice, desc
        lane.helpable = (not desc.startswith("SCHED_FIFO")
                         and (nice is None or self._renice_helpers))

    @staticmethod
    def _transmit(lane: _Lane, wake: bool) -> None:
        """Move launches from the vHQ to the device queue while fewer than c are in flight
        (caller holds ``lane.lock``, so launches reach the queue in vHQ order); ``wake``:
        signal the worker (not needed when the thread running the lane will go on, or a
        caller is about to: whoever gives up ``lane.token`` signals what it leaves)."""
        if lane.vhq.transmit_into(lane.dq) and wake:
            _signal(lane.wake)

    def run_pending(self, stream: int, until: Any) -> bool:
        """Caller-runs (``Device.run_pending``): run the lane's transmitted launches on this
        thread while no other thread runs them, until ``until()`` or none are left, at the
        lane's OS priority (a niced lane is helped only where the thread may take its own
        priority back: devices.os_priority)."""
        lane = self._lanes[stream]
        if not lane.dq:
            return False
        if not lane.helpable or self._stopping or not lane.token.acquire(blocking=False):
            # left to the worker (or to the thread running the lane, which re-checks the
            # queue when it lets go): launches enqueued for a helper were not signalled
            _signal(lane.wake)
            return False
        own = None if lane.nice is None else os_priority.enter_lane(lane.nice)
        try:
            ran = self._drain_loop(lane, until)
        except BaseException as e:
            self._fail_hand(lane, e)  # its launch is answered first
            if not isinstance(e, Exception):
                raise
            # the caller's thread survives a death while it ran the lane (the worker
            # takes over); it must not raise out of Future.result
            log.error("cpu device: lane %d failed while a caller ran it (%s: %s)",
                      lane.id, type(e).__name__, e)
            ran = True
        finally:
            if own is not None:
                os_priority.leave_lane(own)
            lane.token.release()
        if lane.dq:  # left for the worker (the token was ours when it was signalled)
            _signal(lane.wake)
        return ran

    def _run_lane(self, lane: _Lane) -> None:
        """The worker. Whatever escapes the loop kills this thread; the lane does not die
        with it (``_respawn``)."""
        try:
            self._lane_loop(lane)
        except BaseException as e:  # noqa: BLE001 - the lane lives on in a new thread
            self._respawn(lane, e)

    def _lane_loop(self, lane: _Lane) -> None:
        self._apply_os_priority(lane)
        wake, token = lane.wake, lane.token
        while True:
            wake.acquire()  # blocks without the GIL
            if self._stopping:
                return
            if not token.acquire(blocking=False):
                continue  # a caller is helping: it signals again if it leaves work
            try:
                self._drain_loop(lane, None)
            except BaseException as e:
                self._fail_hand(lane, e)  # its launch is answered; the thread dies
                raise
            finally:
                token.release()
            if lane.dq:
                _signal(wake)

    def _drain_loop(self, lane: _Lane, until: Any) -> bool:
        """Run transmitted launches in order (caller holds ``lane.token``). Its callers
        answer the launch in hand (``_fail_hand``) before anything that escapes it
        (outside the per-launch handler) goes on."""
        lock, dq, vhq = lane.lock, lane.dq, lane.vhq
        now, clock_gettime = time.perf_counter, time.clock_gettime
        tasks = self._tasks
        ran = False
        clk, tid = getattr(_clocks, "ids", None) or _thread_ids()
        # RT launches report their thread's CPU time (Completion.cpu_s): two clock reads,
        # kept off the BE lanes' many short launches
        measure = lane.priority > 0 and clk != 0
        run_nice = lane.run_nice  # niced only while a model runs: back to `own` after it
        own = 0  # the thread's own nice value, read before its first reniced run
        read_own = run_nice is not None
        renice: Any = None  # os_priority.nice_setter(tid), made at the first reniced run
        while dq and not self._stopping and (until is None or not until()):
            with lock:
                if not dq:
                    break
                task, k = dq.popleft()
                t0 = now()
                lane.hand = (task, k, t0)
                rec = tasks.get(task)
                # the flag check at the start of every launch
                executed = not lane.flag and rec is not None
                ro = None
                if executed and rec.error is None and rec.model.killable:
                    ro = lane.ro_spare or rec.model.runner.run_options()
                    lane.ro_spare = None
                    lane.running, lane.run_t0, lane.run_est = ro, t0, rec.model.est_s[k]
                lane.busy, lane.run_clk, lane.run_tid, lane.flag_mark = executed, clk, tid, None
            ran = True
            cpu0 = -1.0  # set where the launch runs and is measured
            if executed and rec.error is None:
                faults = self.faults
                if faults is not None:
                    # outside the per-launch handler: the thread running the lane dies
                    faults.check("lane", rec.model.plan.name, k)
                if measure:  # this thread's own clock (clk != 0): it cannot be gone
                    cpu0 = clock_gettime(clk)
                if run_nice is not None and self._worth_killing(rec.model.est_s[k]):
                    # a run too short to kill is not reniced either: two setpriority calls
                    # (3-7 µs) would cost more than it can keep a core from a waking RT thread
                    if read_own:
                        own, read_own = os_priority.current_nice(), False
                        renice = os_priority.nice_setter(tid)
                    # not under `lock`: a thread that lowers its own priority may be switched
                    # out at once, and set_preempt (RT's arrival) must not wait for it. A
                    # kill sets `terminate`, then renices the run to 19 if `niced` is up; one
                    # landing before our renice is caught by the check after it
                    lane.niced = True
                    renice(run_nice)  # own priority back under `lock` below
                    if ro is not None and ro.terminate:
                        renice(os_priority.KILLED_NICE)
                try:
                    if faults is not None:
                        faults.check("kernel", rec.model.plan.name, k)
                    if ro is None:
                        rec.bound.fns[k]()
                    else:
                        rec.bound.fns[k](ro)
                except BaseException as e:  # noqa: BLE001 - reported at read_outputs
                    if ro is not None and ro.terminate and is_kill(e):
                        executed = False  # killed: evicted, restored from its start
                    else:
                        rec.error, rec.error_kernel = e, k
            t1 = now()
            cpu_s = clock_gettime(clk) - cpu0 if executed and cpu0 >= 0.0 else _NAN
            t_stop = _NAN
            with lock:
                if lane.niced:
                    # under the lock set_preempt renices a killed run in: nothing after this
                    renice(own)
                    lane.niced = False
                lane.running = None
                if ro is not None and not ro.terminate:  # never killed: reusable
                    lane.ro_spare = ro
                lane.busy = False
                mark, lane.flag_mark = lane.flag_mark, None
                if mark is not None:  # preempted while it ran: when it gave the core back
                    t_stop = min(t1, mark[0] + max(0.0, _cpu_time(clk) - mark[1]))
                if executed:
                    lane.executed += 1
                elif ro is not None:
                    lane.killed += 1
                    if mark is not None:
                        with self._lock:
                            self._kill_latency.add(t_stop - mark[0])
                else:
                    lane.evicted += 1
                vhq.complete()
                lane.hand = None
                vhq.transmit_into(dq)  # _transmit without a wake: this thread goes on
            cb = self._on_complete
            if cb is not None and not self._stopping:
                cb(Completion(lane.id, task, k, executed, t0, t1, t_stop=t_stop, cpu_s=cpu_s))
        return ran
