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
  ("auto", the default: ORT's measured cost of a killed run, within 0.2-1 ms; a run past
  its estimate by as much has an unknown remainder and is killed); a
  killed launch completes as evicted and restore-from-c re-runs it from its start (segments
  are idempotent); with ``kill=False`` it is *parked* instead (kept, at nice 19 until it
  ends: the OS's own preemption, no work lost). RT models (``whole=True``) are one
  segment: full ORT speed.
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

The per-request path (the lanes' drain loop, enqueue, the flag and kill handshake, task
arenas, inputs and outputs, caller-runs) lives in ``devices/cpu_lanes.py``: a
``LaneEngine`` that owns the state it reads (tasks, lanes, completion callback, stopping
flag, fault injector, kill settings) and is compiled as a ``cdef class`` (this class stays
Python: it derives from the ``Device`` ABC). ``CpuDevice`` validates, configures, starts
and stops; its hot methods are bound to the engine's (docs/request_path.md, "The lane,
typed").
"""

from __future__ import annotations

import logging
import os
import platform
import threading
import time
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from av_infer._cy.vhq import MAX_C, VHQ
from av_infer.devices import os_priority
from av_infer.devices.base import CompletionCallback, Device, ResetInfo
from av_infer.devices.cpu_lanes import (  # noqa: F401 - _POOL, _Task: the lane's records
    _POOL,
    LaneEngine,
    _Bound,
    _Lane,
    _Model,
    _signal,
    _Task,
    transmit,
)
from av_infer.errors import InvalidParameterError, UnsupportedModelError
from av_infer.kernels.cpu import CpuPlanRunner
from av_infer.kernels.ort_segments import (
    ORT_APIS,
    SegmentRunner,
    is_segment_plan,
    measure_cut_cost,
    measure_kill_cost,
    resolve_api,
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
#: Segment plans: inputs and outputs at least this large are bound in place (the request's
#: own arrays, no copy); smaller ones are copied (a re-binding costs more than the copy).
ZERO_COPY_BYTES = 64 * 1024


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
                 rt_priority: str = "off", rt_parallel: int | None = None,
                 ort_api: str | None = None,
                 max_cut_cost: float | None = None) -> None:
        """``engine``: "ort" (ONNX Runtime segments) or "numpy" (the reference kernels).
        ``ort_api``: how the ort engine calls ONNX Runtime, "auto" (the C API where the
        wheel's libonnxruntime loads, else the Python binding, saying why: log and
        ``telemetry()["ort_api_reason"]``), "c" (refused here when it cannot load) or
        "python"; None: ``AV_INFER_ORT_API`` or "auto" (``kernels.ort_segments``).
        ``threads``: ORT intra-op threads per session (fixed: deterministic results).
        ``segment_ms``: target segment duration of models that are cut (BE models).
        ``max_cut_cost``: what the cuts may add to a cut model's run (a fraction; 0.05,
        ``model.segments.DEFAULT_MAX_CUT_COST``, is the measured setting), measured at load
        on this CPU (``ort_segments.measure_cut_cost``); a model whose cuts at
        ``segment_ms`` cost more is cut into fewer segments, none longer than 2 x
        ``segment_ms`` (``model.segments.compile_segments``). None (the default): cut at
        ``segment_ms`` without measuring. Opt-in because it pays under ``reef_dkp`` (one
        BE lane gives way to RT: BE +0.02-0.10 of ORT threads' on the detector rows) and not
        under ``reef`` at 30 Hz (every BE lane killed per RT arrival: BE equal, preemption
        p99 8 ms against 5; docs/cpu_engine.md "What a cut costs").
        ``kill``/``kill_below_ms``: kill the running segment on preemption unless less than
        ``kill_below_ms`` of it is estimated to remain (a run past its estimate by as much
        is killed: ``LaneEngine.worth_killing``); "auto": what a killed run costs its
        thread after ORT stops, measured at start (``ort_segments.measure_kill_cost``; 0.3
        ms on a slow 2-core VM), within 0.2-1 ms: a segment with less left finishes sooner
        than a kill stops it, and keeps its work. ``kill=False`` *parks* it instead: the
        run keeps its work and finishes at nice 19 (where BE runs are niced and it was
        estimated at ``kill_below_ms`` or more), so the OS gives a waking RT thread its
        core at once; nothing is re-run. ``blas_threads``: BLAS threads of
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
        if max_cut_cost is not None and (isinstance(max_cut_cost, bool)
                                         or not isinstance(max_cut_cost, (int, float))
                                         or not 0 <= max_cut_cost <= 1):
            raise InvalidParameterError(
                f"max_cut_cost must be None or a number in 0..1, got {max_cut_cost!r}")
        api_asked = ort_api if ort_api is not None else os.environ.get("AV_INFER_ORT_API",
                                                                          "auto")
        if api_asked not in ORT_APIS:
            raise InvalidParameterError(f"ort_api must be one of {ORT_APIS}, got {api_asked!r}"
                                        + ("" if ort_api is not None else
                                           " (from AV_INFER_ORT_API)"))
        #: the API the ort engine calls ONNX Runtime through ("c" or "python"; None for the
        #: numpy engine) and why "auto" did not take the C API (None when it did)
        self.ort_api: str | None = None
        self.ort_api_reason: str | None = None
        if engine == "ort":
            try:
                self.ort_api, self.ort_api_reason = resolve_api(api_asked)
            except UnsupportedModelError as e:
                raise InvalidParameterError(str(e.args[-1] if e.args else e)) from e
            if self.ort_api_reason is not None:
                log.warning("cpu device: ONNX Runtime through its Python binding: %s",
                            self.ort_api_reason)
        self.engine = engine
        self.threads = threads
        self.segment_ms = float(segment_ms)
        self.max_cut_cost = None if max_cut_cost is None else float(max_cut_cost)
        #: the request path's state and hot methods (devices/cpu_lanes.py): the tasks, the
        #: lanes, the completion callback, the stopping flag, the fault injector and the
        #: kill settings are the engine's, read and written here through properties
        self._lanes_engine = LaneEngine(
            _make_bound, bool(kill),
            KILL_BELOW_FLOOR_S if auto_kill else float(kill_below_ms) / 1e3,
            # kill -> the killed launch gave its core back (its thread's CPU clock)
            LatencyRecorder(4096))
        #: "auto" (measured at start) or "set"
        self.kill_below_source = "auto" if auto_kill else "set"
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
        self._c = int(c)
        self._blas_threads = blas_threads
        self._blas_limit: Any = None
        self._started = False
        self._closed = False
        #: the device clock as the C function itself: the scheduler reads it several times
        #: a request, and the method below would add a Python frame to each read
        self.now = time.perf_counter  # type: ignore[method-assign]
        # the hot methods as the engine's own (compiled: C methods, no Python frame per
        # call), unless a subclass overrides one (it then runs, and calls these by super())
        for name in _ENGINE_METHODS:
            if getattr(type(self), name) is getattr(CpuDevice, name):
                setattr(self, name, getattr(self._lanes_engine, name))

    @property
    def lane_engine(self) -> LaneEngine | None:
        """The lane engine when this device's request-path methods (``_PORT_METHODS``)
        are all the engine's own, else None (a subclass overrides one, or one was
        replaced on the instance). The scheduler reads it once, when it is built, and then
        calls those methods on the engine as C methods (its typed ``_port``; the C-level
        table of docs/request_path.md section 2); with None it calls the device's."""
        eng = self._lanes_engine
        own = vars(self)
        for name in _PORT_METHODS:
            if own.get(name) != getattr(eng, name):
                return None
        return eng

    # -- the engine's state, read and written through ---------------------------------------
    @property
    def _lanes(self) -> list[_Lane]:
        return self._lanes_engine.lanes

    @property
    def _tasks(self) -> dict[int, _Task]:
        return self._lanes_engine.tasks

    @property
    def _on_complete(self) -> CompletionCallback | None:
        return self._lanes_engine.on_complete

    @property
    def _stopping(self) -> bool:
        return self._lanes_engine.stopping

    @property
    def _lock(self) -> threading.Lock:
        """The device's lock (lifecycle, arena pools, the kill latency recorder)."""
        return self._lanes_engine.lock

    @property
    def _kill_latency(self) -> LatencyRecorder:
        return self._lanes_engine.kill_latency

    @property  # type: ignore[override]
    def faults(self) -> Any:
        """The fault injector (``Device.faults``; None in production), held by the engine."""
        return self._lanes_engine.faults

    @faults.setter
    def faults(self, value: Any) -> None:
        self._lanes_engine.faults = value

    @property
    def kill(self) -> bool:
        """Kill the running segment on preemption (``kill``)."""
        return self._lanes_engine.kill

    @kill.setter
    def kill(self, value: bool) -> None:
        self._lanes_engine.kill = bool(value)

    @property
    def kill_below_s(self) -> float:
        """Runs estimated to have less than this left are neither killed nor reniced (s)."""
        return self._lanes_engine.kill_below_s

    @kill_below_s.setter
    def kill_below_s(self, value: float) -> None:
        self._lanes_engine.kill_below_s = float(value)

    # -- clock ----------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter()

    # -- models and tasks -----------------------------------------------------------------
    def compile(self, source: Any, input_shapes: Any = None, name: str | None = None,
                whole: bool = False) -> Plan:
        if self.engine == "numpy":
            return super().compile(source, input_shapes, name, whole)
        from av_infer.model.segments import compile_segments

        if whole:
            return compile_segments(source, input_shapes, name=name, segment_ms=None)
        if self.max_cut_cost is None:
            return compile_segments(source, input_shapes, name=name, segment_ms=self.segment_ms)
        return compile_segments(source, input_shapes, name=name, segment_ms=self.segment_ms,
                                cut_cost=self._cut_cost, max_cut_cost=self.max_cut_cost)

    def _cut_cost(self, cut: Plan, whole: Plan) -> float:
        """``compile_segments``'s ``cut_cost``: measured on this device's threads and API."""
        return measure_cut_cost(cut, whole, self.threads, self.ort_api or "auto")

    def compile_key(self, whole: bool = False) -> dict[str, Any]:
        """The ORT engine cuts by time profiled on this CPU at ``segment_ms`` (and by the
        cost of its cuts measured here, under ``max_cut_cost``)."""
        if self.engine == "numpy":
            return {"engine": "numpy"}
        key = {"engine": self.engine, "segment_ms": None if whole else float(self.segment_ms),
               "cpu": f"{platform.machine()} {cpu_model()}"}
        if not whole:
            key["max_cut_cost"] = self.max_cut_cost
        return key

    def load_plan(self, plan: Plan) -> _Model:
        if self.faults is not None:
            self.faults.check_load(plan.name, self.name)
        if is_segment_plan(plan):
            runner: Any = SegmentRunner(plan, self.threads, self.ort_api or "python")
            est = [float(k.args.get("est_ms", 0.0)) / 1e3 for k in plan.kernels]
            return _Model(plan, runner, runner.weight_bytes, True, est,
                          nice_in_run=runner.nice_in_run)
        runner = CpuPlanRunner(plan)
        wb = sum(int(np.asarray(w).nbytes) for w in plan.weights.values())
        return _Model(plan, runner, wb, False, [0.0] * len(plan.kernels))

    def unload_plan(self, handle: Any) -> None:
        handle.runner = None
        handle.pool.clear()

    def resident_bytes(self, handle: Any) -> int:
        return handle.weight_bytes

    def new_task(self, handle: Any, task: int) -> None:
        self._lanes_engine.new_task(handle, task)

    def release_task(self, task: int) -> None:
        self._lanes_engine.release_task(task)

    def write_inputs(self, task: int, inputs: dict[str, np.ndarray]) -> None:
        self._lanes_engine.write_inputs(task, inputs)

    def read_outputs(self, task: int) -> dict[str, np.ndarray]:
        return self._lanes_engine.read_outputs(task)

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
        self._lanes_engine.enqueue(stream, task, first, last, wake)

    def reset(self, stream: int) -> ResetInfo | None:
        return self._lanes_engine.reset(stream)

    def set_preempt(self, stream: int, flag: bool) -> None:
        self._lanes_engine.set_preempt(stream, flag)

    def _worth_killing(self, est: float, elapsed: float = 0.0) -> bool:
        """``LaneEngine.worth_killing``: the kill rule (``kill_below_ms``)."""
        return self._lanes_engine.worth_killing(est, elapsed)

    def set_capacity(self, c: int) -> None:
        if not 1 <= c <= MAX_CAPACITY:
            raise ValueError(f"capacity must be in 1..{MAX_CAPACITY}, got {c}")
        self._c = int(c)
        for lane in self._lanes:
            with lane.lock:
                lane.capacity = None
                lane.vhq.c = self._c
                transmit(lane, True)

    def set_stream_capacity(self, stream: int, c: int) -> None:
        if not 1 <= c <= MAX_CAPACITY:
            raise ValueError(f"capacity must be in 1..{MAX_CAPACITY}, got {c}")
        lane = self._lanes[stream]
        with lane.lock:
            lane.capacity = int(c)
            lane.vhq.c = int(c)
            transmit(lane, True)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, on_complete: CompletionCallback) -> None:
        with self._lock:
            if self._started:
                raise RuntimeError("cpu device already started")
            self._lanes_engine.on_complete = on_complete
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
            self.kill_cost_s = measure_kill_cost(self.threads, api=self.ort_api or "python")
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
            self._lanes_engine.stopping = True
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
            "ort_api": self.ort_api,
            "ort_api_reason": self.ort_api_reason,
            "threads_per_session": self.threads,
            "segment_ms": self.segment_ms,
            "max_cut_cost": self.max_cut_cost,
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
                 "killed": ln.killed, "kill_lowered": ln.kill_lowered,
                 "parked": ln.parked,
                 "restarts": ln.restarts,
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
        ``LaneEngine.fail_hand``): a new thread takes the lane over and runs what is queued."""
        log.error("cpu device: lane %d worker died (%s: %s); restarting it",
                  lane.id, type(err).__name__, err)
        with self._lock:
            if self._stopping:
                return
            lane.restarts += 1
            self._spawn(lane)
        _signal(lane.wake)  # launches left in the device queue

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

    def run_pending(self, stream: int, until: Any) -> bool:
        """Caller-runs (``Device.run_pending``, ``LaneEngine.run_pending``)."""
        return self._lanes_engine.run_pending(stream, until)

    def _run_lane(self, lane: _Lane) -> None:
        """The worker: its OS priority, then the engine's loop. Whatever escapes the loop
        kills this thread; the lane does not die with it (``_respawn``)."""
        try:
            self._apply_os_priority(lane)
            self._lanes_engine.lane_loop(lane)
        except BaseException as e:  # noqa: BLE001 - the lane lives on in a new thread
            self._respawn(lane, e)


def _make_bound(handle: _Model) -> _Bound:
    """A new arena for ``handle`` with its launches and views bound (``LaneEngine.new_task``
    on a pool miss; the engine re-points the zero-copy outputs)."""
    r = handle.runner
    arena = r.new_arena()
    binds = r.bind(arena)
    b = _Bound(arena, [getattr(f, "call", f) for f in binds],
               {n: r.view(arena, n) for n in handle.plan.inputs},
               {n: r.view(arena, n) for n in handle.plan.outputs}, binds)
    if handle.killable:
        b.zero_in = frozenset(n for n, v in b.inputs.items() if v.nbytes >= ZERO_COPY_BYTES)
        b.zero_out = frozenset(n for n, v in b.outputs.items() if v.nbytes >= ZERO_COPY_BYTES)
    return b


#: the methods a CpuDevice binds to its engine's (``__init__``)
_ENGINE_METHODS = ("enqueue", "run_pending", "new_task", "write_inputs", "read_outputs",
                   "release_task", "set_preempt", "reset")
#: the engine's methods the scheduler calls per request (``lane_engine``)
_PORT_METHODS = ("new_task", "write_inputs", "enqueue", "run_pending", "release_task",
                 "read_outputs")
