# cython: annotation_typing=False, nonecheck=True, language_level=3
# cython: boundscheck=True, wraparound=True, binding=False
"""The cpu device's lanes and the per-request path over them, as typed compiled code.

Why a module of its own: ``CpuDevice`` (``devices/cpu.py``) derives from the ``Device``
ABC, so it stays a Python class, and compiled code reads a Python instance's attributes
through the generic lookup, slower than CPython 3.11's specialised one (compiling
``cpu.py`` as it is made a request *dearer*: docs/request_path.md, "The lane, typed").
What a request touches is therefore held here, by :class:`LaneEngine`, a final ``cdef
class`` when built (``cpu_lanes.pxd``, Cython's pure-Python mode; listed in
``av_infer/_cy/compiled.py``): the task table, the lanes, the completion callback, the
stopping flag, the fault injector and the kill settings, each owned here once
(``CpuDevice`` reads and writes them through properties), and the records it reads
(:class:`_Lane`, :class:`_Task`, :class:`_Bound`, :class:`_Model`) are ``cdef class``es
with C fields. ``CpuDevice`` binds its hot methods (``enqueue``, ``run_pending``,
``new_task``, ``write_inputs``, ``read_outputs``, ``release_task``, ``set_preempt``,
``reset``) to the engine's ``cpdef`` methods, so the compiled scheduler's
``device.enqueue(...)`` is a C call with no Python frame.

Guaranteed as before (the code is ``cpu.py``'s, moved line for line): the flag check at
the start of every launch, the kill handshake under ``lane.lock``, renicing only around
runs worth killing, the launch in hand answered by :meth:`LaneEngine.fail_hand` before
anything escapes a drain, every transmitted launch completed exactly once, the same
``Completion`` fields. This file is the one source: it runs interpreted wherever it is
not built, and with ``AV_INFER_INTERPRETED=1``. Compiled with ``binding=False``: the
``cpdef`` methods are plain C methods, so the device's bound hot methods are builtin
methods, called without a Cython function's bound-method layer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from av_infer._cy.fastlock import FastLock
from av_infer._cy.ndcheck import copy_into, exact_array, fresh_copy
from av_infer._cy.vhq import VHQ
from av_infer.devices import os_priority
from av_infer.devices.base import Completion, ResetInfo
from av_infer.errors import DeviceFaultError

log = logging.getLogger("av_infer.devices.cpu")

#: Arenas (with their bound launches) kept per model for reuse by the next task.
_POOL = 4
_NAN = float("nan")
_clocks = threading.local()
#: the clocks a lane's drain reads, as module globals (compiled: no ``time.<name>``
#: attribute read per drain)
_perf_counter = time.perf_counter
_clock_gettime = time.clock_gettime


def _is_kill(exc: BaseException) -> bool:
    """``kernels.ort_segments.is_kill``, imported at the first kill: that module loads
    ONNX (~0.4 s), and the scheduler imports this one for ``LaneEngine`` (its typed
    reference to the cpu device's engine, sched/scheduler.py ``_port_of``), simulator
    included."""
    from av_infer.kernels.ort_segments import is_kill

    return is_kill(exc)


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


def _locked() -> FastLock:
    lk = FastLock()
    lk.acquire()
    return lk


def _signal(ev: FastLock) -> None:
    """Set a binary event made of a lock (released = signalled); idempotent."""
    ev.release_if_locked()


class _Model:
    """A loaded plan: its runner, weight size, whether its launches can be killed, the
    per-launch estimates (s, for the kill rule), the pool of reusable arenas and
    ``nice_in_run``: its runner's engine's runs renice their own thread without the GIL
    (``ort_segments._Engine.nice_in_run``: their run options' ``nice_next_run`` and
    ``lower_in_run``)."""

    def __init__(self, plan: Any, runner: Any, weight_bytes: int, killable: bool,
                 est_s: list, pool: list | None = None, nice_in_run: bool = False) -> None:
        self.plan = plan
        self.runner = runner  # CpuPlanRunner | SegmentRunner; None once unloaded
        self.weight_bytes = weight_bytes
        self.killable = killable
        self.est_s = est_s
        self.pool = [] if pool is None else pool
        self.nice_in_run = nice_in_run

    def __repr__(self) -> str:
        return (f"_Model(plan={self.plan.name!r}, killable={self.killable!r}, "
                f"pool={len(self.pool)})")


class _Bound:
    """An arena with everything bound to it once: the launches and the input/output views
    (reused by the model's next task, so a request builds nothing per launch).

    ``fns``: what launch k calls (the runner's C-level callable where it has one, else the
    bound launch); ``binds``: the runner's bound launches (what ``runner.rebind``
    re-points); ``zero_in``/``zero_out``: segment plans' tensors bound in place (the
    request's own arrays; a fresh output array per task handed over without a copy);
    ``held``: the arrays the zero-copy inputs are bound to now (kept alive while bound)."""

    def __init__(self, arena: Any, fns: list, inputs: dict, outputs: dict,
                 binds: list | None = None, zero_in: Any = frozenset(),
                 zero_out: Any = frozenset(), held: dict | None = None) -> None:
        self.arena = arena
        self.fns = fns
        self.inputs = inputs
        self.outputs = outputs
        self.binds = [] if binds is None else binds
        self.zero_in = zero_in
        self.zero_out = zero_out
        self.held = {} if held is None else held


class _Task:
    """A task on the device: its model, its arena, and the first error of its launches."""

    def __init__(self, model: _Model, bound: _Bound, error: BaseException | None = None,
                 error_kernel: int = -1) -> None:
        self.model = model
        self.bound = bound
        self.error = error
        self.error_kernel = error_kernel


class _Lane:
    """A stream: its vHQ, its device queue and its worker.

    ``dq`` holds transmitted launches in stream order; ``lock`` orders transmissions
    (vHQ -> dq) and makes the flag check and the kill handshake atomic. ``token`` is held by
    the one thread running the stream's launches: the lane's worker, or a caller helping
    (``run_pending``). ``wake`` is a binary event (a lock that is *released* to signal) the
    worker blocks on without the GIL.

    ``running``/``run_t0``/``run_est``: the launch running now (its RunOptions on killable
    engines, start, estimate); ``ro_spare``: the last launch's RunOptions when nothing
    terminated it (reused; a terminated one is sticky); ``busy``: a launch is executing;
    ``run_clk``/``run_tid``: CPU-time clock and native id of the thread running it;
    ``flag_mark``: (wall time, that thread's CPU time) when the flag went up during the
    running launch; ``nice``: the worker's nice value where it was changed; ``run_nice``:
    the nice value of the lane's model runs where only the runs are niced; ``niced``: the
    running launch was reniced (the thread's own priority comes back under ``lock`` after
    the run); ``armed``: the running launch was reniced by the run itself, with the GIL
    released, which also gives the priority back (``RunOptions.nice_next_run``; a kill
    lowers it with ``lower_in_run``);
    ``kill_lowered``: kills that dropped a running launch's thread to ``KILLED_NICE``;
    ``parked``: with ``kill`` off, preemptions that dropped the running launch's thread to
    ``KILLED_NICE`` (it runs to its end there, its work kept);
    ``helpable``: callers may run the lane (``run_pending``); ``hand``: the
    launch taken from ``dq`` and not yet completed, (task, kernel, start time), what a
    thread that dies running the lane leaves to be answered (``fail_hand``)."""

    def __init__(self, id: int, priority: int, vhq: VHQ) -> None:  # noqa: A002
        self.id = id
        self.priority = priority
        self.vhq = vhq
        # the lane's locks are FastLocks (``_cy/fastlock``): the hot paths below take them
        # with ``acquire()``/``release()``, C calls where this module is compiled
        self.lock = FastLock()
        self.dq = deque()
        self.token = FastLock()
        self.wake = _locked()
        self.flag = False
        self.capacity = None  # per-stream override of the device capacity
        self.thread = None
        self.running = None
        self.ro_spare = None
        self.ro_killed = False  # set_preempt terminated ``running`` (its RunOptions)
        self.run_t0 = 0.0
        self.run_est = 0.0
        self.busy = False
        self.run_clk = 0
        self.run_tid = 0
        self.flag_mark = None
        self.executed = 0
        self.evicted = 0
        self.killed = 0
        self.nice = None
        self.run_nice = None
        self.niced = False
        self.armed = False  # the niced run renices itself (RunOptions.nice_next_run)
        self.kill_lowered = 0  # kills that dropped a running launch's thread to KILLED_NICE
        self.parked = 0  # preemptions (kill off) that dropped a running launch to KILLED_NICE
        self.prio_desc = ""  # what was done to the worker's OS priority (telemetry)
        self.helpable = False
        self.hand = None
        self.restarts = 0  # worker threads that died and were replaced

    def __repr__(self) -> str:
        return f"_Lane(id={self.id}, priority={self.priority}, flag={self.flag!r})"


def _terminated(engine: LaneEngine, lane: _Lane, ro: Any) -> bool:
    """``ro.terminate`` of the lane's running launch ``ro``, read without the ORT property
    (~1 k instructions through pybind11) where it cannot be set: its writers are
    ``set_preempt``, which sets ``lane.ro_killed`` with it (before it reads ``niced``),
    and the device's close, which sets ``stopping`` before it sets ``terminate``."""
    return lane.ro_killed or (engine.stopping and ro.terminate)


def _lower(lane: _Lane, ro: Any) -> bool:
    """Drop the running launch's thread to ``KILLED_NICE`` (caller holds ``lane.lock``,
    ``lane.niced`` is up). A run that renices itself drops only while inside ORT, or as it
    enters (``RunOptions.lower_in_run``; it has its own priority back when it returns);
    otherwise the thread's own comes back under ``lane.lock`` after the run."""
    if lane.armed:
        return ro.lower_in_run()
    return os_priority.set_thread_nice(lane.run_tid, os_priority.KILLED_NICE)


def transmit(lane: _Lane, wake: bool) -> None:
    """Move launches from the vHQ to the device queue while fewer than c are in flight
    (caller holds ``lane.lock``, so launches reach the queue in vHQ order); ``wake``:
    signal the worker (not needed when the thread running the lane will go on, or a
    caller is about to: whoever gives up ``lane.token`` signals what it leaves)."""
    if lane.vhq.transmit_into(lane.dq) and wake:
        _signal(lane.wake)


class LaneEngine:
    """What the cpu device's per-request path reads and runs (see the module docstring).

    ``make_bound(model) -> _Bound`` builds a new arena with its launches bound (a pool
    miss; ``devices/cpu.py``). ``lock`` is the device's lock (arena pools, the kill
    latency recorder, lifecycle); ``kill_latency`` records kill -> the killed launch gave
    its core back."""

    def __init__(self, make_bound: Any, kill: bool, kill_below_s: float,
                 kill_latency: Any) -> None:
        self.tasks = {}
        self.lanes = []
        self.on_complete = None
        self.stopping = False
        self.faults = None
        self.kill = kill
        self.kill_below_s = kill_below_s
        self.lock = FastLock()
        self.kill_latency = kill_latency
        self.make_bound = make_bound

    # -- tasks ----------------------------------------------------------------------------
    def new_task(self, handle: _Model, task: int) -> None:
        self.lock.acquire()
        try:
            b = handle.pool.pop() if handle.pool else None
        finally:
            self.lock.release()
        if b is None:
            b = self.make_bound(handle)
        for name in b.zero_out:  # the previous task's arrays were handed over
            v = b.outputs[name] = np.empty(b.outputs[name].shape, b.outputs[name].dtype)
            handle.runner.rebind(b.binds, name, v)
        self.tasks[task] = _Task(handle, b)

    def release_task(self, task: int) -> None:
        t = self.tasks.pop(task, None)
        if t is not None and t.error is None and t.model.runner is not None:
            self.lock.acquire()
            try:
                if len(t.model.pool) < _POOL:
                    t.model.pool.append(t.bound)
            finally:
                self.lock.release()

    def write_inputs(self, task: int, inputs: dict) -> None:
        t = self.tasks[task]
        b = t.bound
        views = b.inputs
        # exact: what Runtime.submit lets through for these regions (the same names,
        # C-contiguous arrays of the exact shape and dtype); checked inline, once a request
        # (as many names, each one of the regions': the same names, without key views)
        exact = len(inputs) == len(views)
        if exact:
            for n, v in inputs.items():
                # a C-contiguous array of the region's shape and dtype (numpy's C API:
                # ``_cy/ndcheck.pyx``, no attribute reads)
                dst = views.get(n)
                if dst is None or not exact_array(v, dst):
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
                copy_into(b.inputs[name], v)  # ``[...] = v`` of an exact match, in C

    def read_outputs(self, task: int) -> dict:
        t = self.tasks[task]
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
            out[name] = v if name in zero else fresh_copy(v)
        return out

    # -- streams --------------------------------------------------------------------------
    def enqueue(self, stream: int, task: int, first: int, last: int,
                wake: bool = True) -> None:
        lane: _Lane = self.lanes[stream]
        lane.lock.acquire()
        try:
            lane.vhq.push(task, first, last)
            if lane.vhq.transmit_into(lane.dq) and wake:  # transmit, inline
                _signal(lane.wake)
        finally:
            lane.lock.release()

    def reset(self, stream: int) -> ResetInfo | None:
        lane: _Lane = self.lanes[stream]
        with lane.lock:
            r = lane.vhq.reset()
            return None if r is None else ResetInfo(*r, running=lane.busy)

    def set_preempt(self, stream: int, flag: bool) -> None:
        lane: _Lane = self.lanes[stream]
        with lane.lock:
            lane.flag = bool(flag)
            if flag and lane.busy and lane.flag_mark is None:
                now = time.perf_counter()
                lane.flag_mark = (now, _cpu_time(lane.run_clk))
                ro = lane.running
                if ro is not None and self.kill:
                    if self.worth_killing(lane.run_est, now - lane.run_t0):
                        ro.terminate = True  # ORT stops at its next kernel boundary
                        lane.ro_killed = True
                        # what it still runs (to ORT's next node) is lost work: the
                        # lowest priority, so it takes no time from RT's cores
                        if lane.niced and _lower(lane, ro):
                            lane.kill_lowered += 1
                elif ro is not None and lane.niced and _lower(lane, ro):
                    # kill off: the run keeps its work and finishes at the lowest priority
                    # (the OS's preemption: a waking RT thread takes its core at once)
                    lane.parked += 1

    def worth_killing(self, est: float, elapsed: float = 0.0) -> bool:
        """A run estimated at ``est`` seconds, ``elapsed`` into it, has enough left to be
        worth killing (``kill_below_ms``); no estimate (``est`` <= 0, a whole model compiled
        without a profile): always. A run past its estimate by ``kill_below_ms`` or more
        is killed too: its remainder is unknown (a loaded machine stretches runs beyond
        the profile made at load), and sparing it kept RT waiting for whole segments
        (preemption p99 ~10 ms beside ocr_det's 9 ms segments, docs/cpu_engine.md "What a
        cut costs"). A run not worth killing is not reniced either."""
        if est <= 0:
            return True
        left = est - elapsed
        return left >= self.kill_below_s or left <= -self.kill_below_s

    # -- running the lanes ----------------------------------------------------------------
    def run_pending(self, stream: int, until: Any) -> bool:
        """Caller-runs (``Device.run_pending``): run the lane's transmitted launches on this
        thread while no other thread runs them, until ``until()`` or none are left, at the
        lane's OS priority (a niced lane is helped only where the thread may take its own
        priority back: devices.os_priority)."""
        lane: _Lane = self.lanes[stream]
        if not lane.dq:
            return False
        if not lane.helpable or self.stopping or not lane.token.acquire(False):
            # left to the worker (or to the thread running the lane, which re-checks the
            # queue when it lets go): launches enqueued for a helper were not signalled
            _signal(lane.wake)
            return False
        own = None if lane.nice is None else os_priority.enter_lane(lane.nice)
        try:
            ran = self._drain_loop(lane, until)
        except BaseException as e:
            self.fail_hand(lane, e)  # its launch is answered first
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

    def lane_loop(self, lane: _Lane) -> None:
        """The worker's loop (its OS priority already applied). Whatever escapes kills the
        thread; the device replaces it (``CpuDevice._respawn``)."""
        wake, token = lane.wake, lane.token
        while True:
            wake.acquire()  # blocks without the GIL
            if self.stopping:
                return
            if not token.acquire(False):
                continue  # a caller is helping: it signals again if it leaves work
            try:
                self._drain_loop(lane, None)
            except BaseException as e:
                self.fail_hand(lane, e)  # its launch is answered; the thread dies
                raise
            finally:
                token.release()
            if lane.dq:
                _signal(wake)

    def fail_hand(self, lane: _Lane, err: BaseException) -> None:
        """A thread running ``lane`` died outside the per-launch handler: complete the
        launch it held (in stream order: it was the queue's head) with its task marked
        failed, so the request is answered with DeviceFaultError and the stream goes on.
        The caller still holds ``lane.token``, so no launch overtakes it."""
        comp = None
        with lane.lock:
            hand, lane.hand = lane.hand, None
            lane.running = None
            lane.busy = False
            lane.niced = lane.armed = False
            lane.flag_mark = None
            if hand is not None:
                task, k, t0 = hand
                rec = self.tasks.get(task)
                if rec is not None and rec.error is None:
                    rec.error = RuntimeError(
                        f"the thread running cpu lane {lane.id} died: "
                        f"{type(err).__name__}: {err}")
                    rec.error_kernel = k
                lane.vhq.complete()
                transmit(lane, False)  # the caller signals what it leaves
                comp = Completion(lane.id, task, k, True, t0, time.perf_counter())
        cb = self.on_complete
        if comp is not None and cb is not None and not self.stopping:
            cb(comp)

    def _drain_loop(self, lane: _Lane, until: Any) -> bool:
        """Run transmitted launches in order (caller holds ``lane.token``). Its callers
        answer the launch in hand (``fail_hand``) before anything that escapes it
        (outside the per-launch handler) goes on."""
        lock, dq, vhq = lane.lock, lane.dq, lane.vhq
        now, clock_gettime = _perf_counter, _clock_gettime
        tasks = self.tasks
        ran = False
        clk, tid = getattr(_clocks, "ids", None) or _thread_ids()
        # RT launches report their thread's CPU time (Completion.cpu_s): two clock reads,
        # kept off the BE lanes' many short launches
        measure = lane.priority > 0 and clk != 0
        run_nice = lane.run_nice  # niced only while a model runs: back to `own` after it
        own = 0  # the thread's own nice value, read before its first reniced run
        read_own = run_nice is not None
        renice: Any = None  # os_priority.nice_setter(tid), made at the first reniced run
        while dq and not self.stopping and (until is None or not until()):
            lock.acquire()
            try:
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
                    lane.ro_killed = False
                lane.busy, lane.run_clk, lane.run_tid, lane.flag_mark = executed, clk, tid, None
            finally:
                lock.release()
            ran = True
            cpu0 = -1.0  # set where the launch runs and is measured
            if executed and rec.error is None:
                faults = self.faults
                if faults is not None:
                    # outside the per-launch handler: the thread running the lane dies
                    faults.check("lane", rec.model.plan.name, k)
                if measure:  # this thread's own clock (clk != 0): it cannot be gone
                    cpu0 = clock_gettime(clk)
                if run_nice is not None and self.worth_killing(rec.model.est_s[k]):
                    # a run too short to kill is not reniced either: two setpriority calls
                    # (3-7 µs) would cost more than it can keep a core from a waking RT thread
                    if read_own:
                        own, read_own = os_priority.current_nice(), False
                        renice = os_priority.nice_setter(tid)
                    # not under `lock`: a thread that lowers its own priority may be switched
                    # out at once, and set_preempt (RT's arrival) must not wait for it. A
                    # kill (or, kill off, a park) renices the run to 19 if `niced` is up; one
                    # landing before our renice is caught by the flag check after it (the
                    # flag goes up before set_preempt reads `niced`)
                    lane.niced = True
                    if ro is not None and rec.model.nice_in_run:
                        # the run renices itself once the GIL is released and gives the
                        # priority back before it takes the GIL again: at nice 10-19 beside
                        # other processes this thread must never hold the GIL (and then
                        # `lock`) while they take its core (docs/cpu_engine.md)
                        ro.nice_next_run(tid, run_nice, own, os_priority.KILLED_NICE)
                        lane.armed = True
                        if lane.flag:  # arming cleared a lowering that came before it
                            ro.lower_in_run()
                    else:
                        renice(run_nice)  # own priority back under `lock` below
                        if lane.flag or (ro is not None and _terminated(self, lane, ro)):
                            renice(os_priority.KILLED_NICE)
                try:
                    if faults is not None:
                        faults.check("kernel", rec.model.plan.name, k)
                    if ro is None:
                        rec.bound.fns[k]()
                    else:
                        rec.bound.fns[k](ro)
                except BaseException as e:  # noqa: BLE001 - reported at read_outputs
                    if lane.armed:
                        # a fault before the run left it armed: the options are the lane's
                        # spare, and the next run may be another thread's, unniced
                        ro.nice_next_run(0, 0, 0, 0)
                    if ro is not None and ro.terminate and _is_kill(e):
                        executed = False  # killed: evicted, restored from its start
                    else:
                        rec.error, rec.error_kernel = e, k
            t1 = now()
            cpu_s = clock_gettime(clk) - cpu0 if executed and cpu0 >= 0.0 else _NAN
            t_stop = _NAN
            lock.acquire()
            try:
                if lane.niced:
                    # under the lock set_preempt renices a killed run in: nothing after this.
                    # A run that reniced itself has its priority back (a kill lowers it only
                    # while inside ORT: RunOptions.lower_in_run)
                    if not lane.armed:
                        renice(own)
                    lane.niced = lane.armed = False
                lane.running = None
                if ro is not None and not _terminated(self, lane, ro):  # never killed: reusable
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
                        with self.lock:
                            self.kill_latency.add(t_stop - mark[0])
                else:
                    lane.evicted += 1
                vhq.complete()
                lane.hand = None
                vhq.transmit_into(dq)  # transmit without a wake: this thread goes on
            finally:
                lock.release()
            cb = self.on_complete
            if cb is not None and not self.stopping:
                cb(Completion(lane.id, task, k, executed, t0, t1, (), t_stop, cpu_s))
        return ran
