# cython: annotation_typing=False, nonecheck=True, language_level=3
"""The scheduler core: REEF-N reset-based preemption with EDF ordering of RT requests.

Why one synchronous core: the same decisions must run against wall-clock devices (cpu,
cuda: one scheduler thread fed by an event queue) and against the simulator (virtual time,
handlers called inline from its event loop). So this class never blocks and never starts
threads; a *driver* (``Runtime``) decides who calls :meth:`Scheduler.post`. Events are
processed one at a time; events posted while one is being handled (a future's callback
submitting again, a simulator completing inline) wait in the driver's queue (the one event
queue) and are handled after it, so the handlers are never re-entered.

Decisions follow docs/design.md and REEF §3-4: RT requests in EDF order, one RT task fed at a
time; BE requests round-robin across clients, one BE stream per running BE task. What an
RT arrival does to running BE work is the policy's ``preempt`` kind (see policies.py):

* ``reset`` (REEF-N): ``device.reset(s)`` first (so the vHQ's ``done`` counts only
  kernels that really executed), then ``set_preempt(s, True)``; the RT task starts at once
  on the RT stream. When no RT work is left and a preempted stream has drained, its flag
  is cleared and the task restored from the first kernel not known to have run (REEF's
  ``max(done, k_l - c)``, observed: see ``_restore``).
* ``wait``: reset the BE vHQs without a flag (launched kernels run on), start RT once every
  BE stream drained, resume BE tasks from where they stopped.
* ``none``: BE keeps running beside RT (or, ``exclusive``, nothing runs beside anything).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from heapq import heappop, heappush
from threading import get_ident
from typing import Any

from av_infer._cy.dkp_select import Selector
from av_infer.devices.base import Device, ResetInfo
from av_infer.devices.completion import Completion
from av_infer.devices.cpu_lanes import LaneEngine
from av_infer.errors import (
    AvInferError,
    DeadlineMissedError,
    DeviceFaultError,
    RejectedError,
    RuntimeClosedError,
    UnknownModelError,
)
from av_infer.model.plan import Plan
from av_infer.profiles import round_times_us
from av_infer.sched.policies import Policy
from av_infer.sched.queues import BeQueues, RtQueue
from av_infer.sched.request import Priority, Request, Result
from av_infer.sched.stats import Stats

log = logging.getLogger(__name__)

Listener = Callable[[str, dict], None]

#: every event kind the scheduler emits to its listeners (``Scheduler.listeners``): a
#: listener with an ``event_kinds`` attribute is called for the kinds it names only
EVENT_KINDS = frozenset(("arrival", "dispatch", "preempt", "restore", "kernel", "complete",
                         "fail", "be_grant"))

#: BE starvation window (device seconds): BE work waiting this long without a BE launch
#: completing, while RT holds the device, gets a grant (``Scheduler.be_min_share``).
BE_SHARE_WINDOW = 0.05
#: the same, read by the decisions (compiled: a C double, scheduler.pxd; no float boxed
#: and added as Python objects in ``next_timer`` and ``_be_granted``)
_BE_WINDOW = BE_SHARE_WINDOW

# Task states.
QUEUED, RUNNING, PAUSED, PREEMPTED, ABORTING, DONE = range(6)
_STATE_NAMES = ("queued", "running", "paused", "preempted", "aborting", "done")
#: ``Priority(...).name`` by ``Task.rt`` (the enum's ``name`` is a Python-level property:
#: a call per read on the request path)
_PRIO = ("BE", "RT")
#: constants the decisions compare with, read as module globals (compiled: C doubles,
#: scheduler.pxd), not as ``math.inf`` / ``Priority.RT`` attribute reads on every event
_INF = math.inf
_NINF = -math.inf
_RT = Priority.RT


class ModelEntry:
    """A plan loaded on the device. ``refs`` counts requests accepted and not answered.

    Compiled, a ``cdef class`` (scheduler.pxd): the scheduler reads ``refs``, ``handle``,
    ``unloading``, ``variants`` and ``n_kernels`` on every request as C fields; Python
    code reads and writes the same names. Equality is identity (as the ``eq=False``
    dataclass it was)."""

    def __init__(self, name: str, plan: Plan, handle: Any, pinned: bool = False,
                 refs: int = 0, unloading: bool = False, profile: Any = None,
                 variants: Any = None,
                 _dkp: list[tuple[float, int, int, float, float]] | None = None) -> None:
        self.name = name
        self.plan = plan
        self.handle = handle
        self.pinned = pinned
        self.refs = refs
        self.unloading = unloading
        #: kernel profile (profiles.ModelProfile) for padding selection; None: never padded
        self.profile = profile
        #: a variant group's entry (qos.VariantGroup): requests naming it get their
        #: variant (and batch) from ``ext.maybe_batch`` before they start, RT ones included
        self.variants = variants
        self._dkp = _dkp
        #: kernels of the plan (read on every arrival; the plan never changes)
        self.n_kernels = len(plan.kernels)
        self._input_spec: dict[str, tuple[tuple[int, ...], str]] | None = None

    def __repr__(self) -> str:
        return (f"ModelEntry(name={self.name!r}, plan={self.plan!r}, handle={self.handle!r}, "
                f"pinned={self.pinned!r}, refs={self.refs!r}, unloading={self.unloading!r}, "
                f"profile={self.profile!r}, variants={self.variants!r}, _dkp={self._dkp!r})")

    @property
    def input_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """The plan's input name -> (shape, dtype), built once (checked on every submit)."""
        spec = self._input_spec
        if spec is None:
            spec = self._input_spec = self.plan.input_spec()
        return spec

    def dkp_numbers(self, sms: int) -> list[tuple[float, int, int, float, float]] | None:
        """Per kernel ``(duration_us, blocks, blocks_per_sm, round_us, one_us)`` for DKP
        selection, from the profile: a round of blocks packed ``blocks_per_sm`` / one per
        SM (``profiles.round_times_us``: REEF's ``latency`` curve scaled to the profiled
        duration)."""
        if self._dkp is None and self.profile is not None:
            if len(self.profile.kernels) != self.n_kernels:
                return None
            out = []
            for kp in self.profile.kernels:
                one, rnd = round_times_us(kp, sms)
                out.append((float(kp.duration_us), max(1, kp.blocks), max(1, kp.blocks_per_sm),
                            rnd, one))
            self._dkp = out
        return self._dkp


class Task:
    """A request the scheduler holds: a plan instance with a cursor. Compiled, a ``cdef
    class`` with C fields (scheduler.pxd); the names are the same either way."""

    def __init__(self, req: Request, entry: ModelEntry, n: int,
                 members: list[Task] | None = None) -> None:
        self.req = req
        self.entry = entry
        self.n = n
        self.state = QUEUED
        self.stream = -1
        self.allocated = False
        self.answered = False
        self.done = 0  # leading kernels known to have executed
        self.outstanding = 0  # launches enqueued and not yet completed or dropped
        self.resume_from = 0  # next kernel to enqueue when (re)started
        self.enq_from = 0  # first kernel of the latest enqueue
        #: kernels known to have run at its last reset (the vHQ's done); None: no reset
        self.reset_done: int | None = None
        # DKP (BE tasks): next kernel/block to pad (-1: not padding), completed padded
        # blocks per kernel, kernels completed by padding, and parts of this task in padded
        # launches the device took and has not yet reported (completed, or dropped by a
        # reset): which parts ride in which launch is the device's record, not ours.
        self.pad_k = -1
        self.pad_b = 0
        self.pad_blocks: dict[int, int] = {}
        self.pad_full: set[int] = set()
        self.pad_in_flight = 0
        #: handle of the task's RT queue entry (removal when it expires while queued)
        self.qh = 0
        #: a batch task (model_services.maybe_batch): the requests it answers; else None
        self.members = members
        #: a member of a batch task: that task (a hard-deadline drop answers it alone)
        self.batch: Task | None = None
        # fixed at creation (read on every event)
        # (read through the typed field: compiled, C reads of the Request's fields)
        self.tid = self.req.id
        self.rt = self.req.priority == _RT

    def __repr__(self) -> str:
        return (f"Task(tid={self.tid}, model={self.req.model!r}, rt={self.rt}, "
                f"state={_STATE_NAMES[self.state]}, done={self.done}/{self.n}, "
                f"outstanding={self.outstanding}, stream={self.stream})")


class StreamState:
    """The scheduler's view of one device stream (compiled: a ``cdef class``)."""

    def __init__(self, id: int, kind: str) -> None:
        self.id = id
        self.kind = kind  # "rt_hi" | "rt" | "be"
        #: ``kind == "be"``, read on every completion (compiled: a C flag, no string compare)
        self.is_be = kind == "be"
        self.owner: Task | None = None  # BE: the task owning the stream (running/preempted)
        self.outstanding = 0  # launches of every task on it, enqueued and not completed
        self.flagged = False  # its preemption flag (published by Scheduler._flag)
        #: arrival time of the RT request that preempted this BE stream while a launch was
        #: on it; the stream's next completion is that launch leaving (evicted, killed, done)
        self.stop_from: float | None = None
        #: the same RT request's ``timings.received`` (nan: unknown)
        self.stop_from_received = math.nan

    def __repr__(self) -> str:
        return (f"StreamState(id={self.id}, kind={self.kind!r}, outstanding="
                f"{self.outstanding}, flagged={self.flagged}, owner={self.owner!r})")


class Scheduler:
    """Synchronous scheduling core; see the module docstring. Not thread-safe by design:
    exactly one driver calls :meth:`post` at a time."""

    def __init__(
        self,
        device: Device,
        policy: Policy,
        c: int,
        max_be_streams: int = 2,
        edf_preempt: bool = False,
        preempt_drain: bool = False,
    ) -> None:
        """``policy`` and ``c`` arrive validated (``engine.check_policy``/``check_c``, the
        one validator of each); the scheduler holds the live values."""
        self.device = device
        #: the device's per-request methods as a C-level table where it offers one: the
        #: cpu device's lane engine (``_port_of``), whose ``new_task``/``write_inputs``/
        #: ``enqueue``/``release_task``/``read_outputs`` the compiled scheduler (and the
        #: driver's ``run_pending``) call as C methods; None: the device's Python methods
        #: (simulator, cuda, a device that overrides one). Read-only compiled
        self._port = _port_of(device)
        # the live policy: the decisions read its fields (compiled: C fields of a typed
        # ``Policy``, no copies here); ``set_policy`` is its one writer
        self._policy = policy
        self.c = c
        self.edf_preempt = bool(edf_preempt)
        self.preempt_drain = bool(preempt_drain)
        #: the statistics (compiled: a typed ``Stats``, its lock, tables and counters C
        #: fields); set here only (read-only compiled)
        self.stats = Stats()
        #: the listeners (``listeners``, a property: its setter routes them by kind)
        self._listeners: tuple = ()
        #: the listeners the "kernel" event goes to (one per completion: its payload is
        #: built only when one wants it)
        self._kernel_listeners: tuple = ()
        #: kind -> the listeners of that kind (filled on first use after each assignment)
        self._routes: dict = {}
        self.rt_queue = RtQueue()
        self.be_queues = BeQueues()
        self.tasks: dict[int, Task] = {}  # allocated or running tasks (not queued ones)
        self.rt_active: set[Task] = set()  # RT tasks started and not finished
        self.rt_fed: Task | None = None  # the RT task whose kernels are being fed
        self.closing = False  # no more arrivals; stop once idle
        self.stopped = False
        #: queued requests per priority class beyond which arrivals are rejected (None: no
        #: bound); checked on arrival, so queues stay bounded under overload
        self.max_queue_depth: int | None = None
        #: (deadline, id, task) of queued drop_late requests: the driver's timer fails them
        #: at their deadline, not at the next unrelated event (lazily pruned)
        self._late: list[tuple[float, int, Task]] = []
        #: BE's minimum share under RT overload (0: none, pure REEF priority): when BE work
        #: has waited BE_SHARE_WINDOW without progress while RT was over capacity (RT
        #: requests queued the whole time), BE runs and new RT waits for
        #: ``share / (1 - share) * BE_SHARE_WINDOW`` (a *grant*), so BE gets at least about
        #: ``share`` of the device while RT is over capacity and nothing when RT leaves
        #: gaps (BE progresses in them and never starves)
        self.be_min_share = 0.1
        self._be_wait = False  # BE work is held back by RT (as of the last decision)
        self._be_seen = 0.0  # device time BE last progressed or started waiting
        self._grant_until = _NINF
        self._answers: list[tuple[Future, Any, bool]] = []
        self._busy = False
        #: cache/batching hooks (av_infer.sched.model_services.ModelServices), set by Runtime
        self.ext: Any = None
        # Streams: RT on the device's high priority, one plain RT stream for the policies
        # that give RT no priority, and the BE streams.
        self.rt_hi = StreamState(device.open_stream(1), "rt_hi")
        self.rt_plain = StreamState(device.open_stream(0), "rt")
        self.be_streams = [StreamState(device.open_stream(0), "be") for _ in range(max_be_streams)]
        #: RT streams for requests that run side by side (``Device.rt_parallel`` > 1, the
        #: CPU): ``rt_hi`` and more of its priority; with one, RT tasks queue on ``rt_hi``
        self.rt_par = [self.rt_hi] + [StreamState(device.open_stream(1), "rt_hi")
                                      for _ in range(max(1, device.rt_parallel) - 1)]
        self.streams: dict[int, StreamState] = {
            s.id: s for s in (*self.rt_par, self.rt_plain, *self.be_streams)
        }
        self._apply_capacity(self.c, self._policy)
        # DKP: candidate slots (one per BE stream). Which BE parts ride in which RT launch
        # is the device's launch record (Completion.parts, ResetInfo.dropped_parts).
        self.sms = _device_sms(device)
        self._dkp: Selector | None = None
        if device.supports_padding and self.sms:
            self._dkp = Selector(self.sms, max(16, len(self.be_streams)))
        #: BE models whose padding the device refused (their profile does not match what
        #: it launches): never offered as padding again
        self._dkp_off: set[str] = set()
        #: coalesced completion records (``Completion.count`` > 1) applied at once, and
        #: those split into their single records (``_coalescible`` did not hold)
        self.coalesced_applied = 0
        self.coalesced_split = 0

    # -- driver entry point ---------------------------------------------------------------
    def post(self, event: tuple) -> None:
        """Handle ``event`` now, then answer the futures it resolved. One event queue
        exists, the driver's (``sched.driver.Driver``): events posted while one is handled
        wait there, so this is never re-entered (a re-entry is a bug and raises)."""
        if event[0] == "complete":
            self.complete(event[1])
            return
        self._enter(event, None)

    def complete(self, comp: Completion) -> None:
        """``post(("complete", comp))`` without the tuple: the driver's entry for a
        record it did not queue (``Driver.complete``, once a kernel completion in the
        simulator). The same guarantees as ``post``'s; the tuple is made only where a
        handler fails (``_handler_failed`` reads the event)."""
        if comp.count != 1 and not self._coalescible(comp):
            self.coalesced_split += 1
            for one in comp.singles():  # exactly as if the device had sent them so
                self.complete(one)
            return
        self._enter(None, comp)

    def _enter(self, event: tuple | None, comp: Completion | None) -> None:
        """Handle ``event``, or the completion ``comp`` (``event`` None), then answer the
        futures it resolved (``post``'s body, shared by ``complete``)."""
        if self._busy:
            raise RuntimeError("Scheduler.post re-entered: post events through the Driver")
        self._busy = True
        try:
            try:
                if comp is not None:
                    self.on_complete(comp)
                else:
                    self._handle(event)
            except Exception as e:  # the scheduler survives; the requests do not
                self._handler_failed(("complete", comp) if comp is not None else event, e)
            if self.closing and not self.stopped and self.idle():
                self.stopped = True
            if self._answers:
                self._flush_answers()
        finally:
            self._busy = False

    def _handle(self, ev: tuple) -> None:
        kind = ev[0]  # ("complete" goes to ``complete``: ``post``)
        if kind == "arrival":
            self.on_arrival(ev[1], ev[2])
        elif kind == "timer":
            self._expire_late()
            self._schedule()
        elif kind == "control":
            fn, fut = ev[1], ev[2]
            try:
                res = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                if fut is not None and not fut.done():
                    fut.set_exception(e)
            else:
                if fut is not None and not fut.done():
                    fut.set_result(res)
            self._schedule()
        else:
            raise ValueError(f"unknown event {kind!r}")

    def idle(self) -> bool:
        """Nothing queued, nothing on the device, nothing waiting for a model load."""
        return (not self.rt_queue and not self.be_queues and not self.tasks
                and (self.ext is None or not self.ext.parked()))

    # -- failures inside a handler ------------------------------------------------------------
    def _handler_failed(self, ev: tuple, exc: Exception) -> None:
        """A handler raised: the requests of its event fail with the cause (typed) or a
        DeviceFaultError, leave every queue and table, and the scheduler keeps serving.
        Logged and counted (``stats()["handler_errors"]``), never swallowed."""
        kind = ev[0]
        log.error("scheduler: %s handler failed", kind, exc_info=exc)
        with self.stats.lock:
            self.stats.handler_errors[kind] = self.stats.handler_errors.get(kind, 0) + 1
        err = exc if isinstance(exc, AvInferError) else DeviceFaultError(
            f"scheduler: handling {kind} failed: {type(exc).__name__}: {exc}")
        if kind == "arrival":
            req = ev[1]
            t = self.tasks.get(req.id) or self._queued_task(req.id)
            if t is not None:
                self._evict(t, err)
            elif not req.future.done():  # failed before it was queued
                self._answers.append((req.future, err, True))
        elif kind == "complete":
            t = self.tasks.get(ev[1].task)
            if t is not None:
                self._evict(t, err)
        try:
            self._schedule()
        except Exception:  # noqa: BLE001 - the next event tries again
            log.exception("scheduler: scheduling after a failed %s handler failed", kind)

    def _queued_task(self, tid: int) -> Task | None:
        for t in self.rt_queue.items():
            if t.tid == tid:
                return t
        for t in self.be_queues:
            if t.tid == tid:
                return t
        return None

    def _unqueue(self, t: Task) -> None:
        if t.rt:
            self.rt_queue.remove(t.qh)
        else:
            self.be_queues.remove_if(lambda x: x is t)

    def _evict(self, t: Task, err: AvInferError) -> None:
        """Answer ``t`` with ``err`` and drop it from every structure, whatever state it is
        in; if the device refuses the clean way (abort), forget it by force."""
        self._unqueue(t)
        try:
            if t.allocated and t.state != DONE:
                self._abort(t, err)
            else:
                self._fail(t, err)
                self._detach(t)
                self.tasks.pop(t.tid, None)
        except Exception:  # noqa: BLE001 - the device is in trouble: forget the task
            log.exception("scheduler: evicting request %d failed", t.tid)
            if not t.answered:
                t.answered = True
                self._answers.append((t.req.future, err, True))
            t.state = DONE
            self._detach(t)
            self.tasks.pop(t.tid, None)

    # -- timers (the driver arms one for next_timer()) ------------------------------------------
    def next_timer(self) -> float:
        """Device time of the next timed decision (a queued drop_late request's deadline,
        the end of a BE grant, the moment waiting BE work starves); inf if none."""
        due = _INF
        late = self._late
        while late:
            _, _, hard, t = late[0]
            if t.answered or (t.allocated and not hard):
                heappop(late)
                continue
            due = late[0][0]
            break
        if self.be_min_share > 0 and self._policy.preempts:
            if self._grant_until > _NINF:
                due = min(due, self._grant_until)
            elif self._be_wait:
                due = min(due, self._be_seen + _BE_WINDOW)
        return due

    # -- BE's minimum share under RT overload --------------------------------------------------
    def _be_waiting(self) -> bool:
        """RT is over capacity (RT requests queued behind the one running) and BE work is
        held back by it (queued, or preempted/paused on its stream). A single long RT
        request, or RT waiting for BE launches to drain (``wait``), is not overload."""
        if not self.rt_queue:
            return False
        # plain loops, not any() over a generator: this runs on every decision, and a
        # generator is a closure object and a frame each time (compiled, these are C loops)
        for s in self.be_streams:
            if s.flagged and s.outstanding > 0:
                return False  # RT waits for BE launches to leave: BE is not the one starved
        if self.be_queues:
            return True
        for s in self.be_streams:
            if s.owner is not None and s.owner.state in (PREEMPTED, PAUSED):
                return True
        return False

    def _be_granted(self) -> bool:
        """Is BE in a grant now (see ``be_min_share``); starts one when BE starved."""
        if self.be_min_share <= 0 or not self._policy.preempts or not self._policy.accepts_be:
            return False
        if self._grant_until == _NINF and not self._be_waiting():
            self._be_wait = False  # the common case, every decision: no clock read
            return False
        now = self.device.now()
        if now < self._grant_until:
            return True
        if self._grant_until > _NINF:  # a grant ended: starvation counts from here
            self._grant_until = _NINF
            self._be_seen = now
        if not self._be_waiting():
            self._be_wait = False
            return False
        if not self._be_wait:  # BE starts waiting now
            self._be_wait, self._be_seen = True, now
            return False
        if now - self._be_seen < _BE_WINDOW:
            return False
        share = self.be_min_share
        self._grant_until = now + _BE_WINDOW * share / (1.0 - share)
        with self.stats.lock:
            self.stats.be_grants += 1
        if self._listeners:
            self._emit("be_grant", {"until": self._grant_until, "t": now})
        return True

    def _expire_late(self) -> None:
        """Fail queued, never-started drop_late requests whose deadline has passed, and BE
        requests past their hard deadline wherever they are (queued, parked, batched,
        running or preempted: paper 001, a response after the hard deadline is worth 0)."""
        now = self.device.now()
        late = self._late
        while late and late[0][0] < now:
            deadline, _, hard, t = heappop(late)
            if t.answered or (t.allocated and not hard):
                continue
            if not hard:
                self._unqueue(t)
                self._miss(t, now)
                continue
            where = "while queued"
            b = t.batch
            if b is not None:  # a member of a batch: it alone is answered; the batch runs on
                where = "in a batch"
                self._miss(t, now, deadline, where)
                if all(m.answered for m in b.members or ()) and not b.answered:
                    self._evict(b, DeadlineMissedError(
                        f"every request of batch {b.tid} passed its hard deadline"))
                continue
            if t.allocated:
                where = "while preempted" if t.state in (PREEMPTED, PAUSED) else "while running"
            self._evict(t, self._miss_error(t, now, deadline, where))
            with self.stats.lock:
                cs = self.stats.client(t.req.client, _PRIO[t.rt])
                cs.deadline_misses += 1

    def _miss_error(self, t: Task, now: float, deadline: float,
                    where: str) -> DeadlineMissedError:
        req = t.req
        kind = "hard deadline" if deadline != req.deadline else "deadline"
        return DeadlineMissedError(
            f"request {req.id} ({req.model}) missed its {kind} by "
            f"{(now - deadline) * 1e3:.3f} ms {where}; dropped")

    def _miss(self, t: Task, now: float, deadline: float | None = None,
              where: str = "before it could start") -> None:
        req = t.req
        with self.stats.lock:
            cs = self.stats.client(req.client, _PRIO[t.rt])
            cs.deadline_misses += 1
        self._fail(t, self._miss_error(t, now, req.deadline if deadline is None else deadline,
                                       where))

    def _queue(self, t: Task, front: bool = False) -> None:
        """Put ``t`` in its ready queue (RT: EDF; BE: its client's FIFO)."""
        if t.rt:
            t.qh = self.rt_queue.push(t.req.deadline, t)
        elif front:
            self.be_queues.push_front(t.req.client, t)
        else:
            self.be_queues.push(t.req.client, t)

    def resume_parked(self, tasks: list[Task], err: BaseException | None) -> None:
        """The model the ``tasks`` waited for is loaded (``err`` None) or failed to load:
        queue them again (BE at the head of their FIFO) or fail them."""
        for t in tasks:
            if t.answered:
                continue
            if err is not None:
                self._fail(t, err if isinstance(err, AvInferError) else DeviceFaultError(
                    f"model {t.entry.name!r} could not be loaded: {err}"))
            else:
                self._queue(t, front=True)
        self._schedule()

    # -- listeners --------------------------------------------------------------------------
    @property
    def listeners(self) -> tuple:
        """The listeners, ``fn(kind, payload)``, in the order they are called (a tuple:
        assign a new sequence to change them, as ``Engine.add_listener`` does). A listener
        with an ``event_kinds`` attribute (a collection of ``EVENT_KINDS``) is called for
        those kinds only; one without, for every kind. So the per-completion "kernel"
        event costs nothing (no payload built, no call) unless a listener wants it."""
        return self._listeners

    @listeners.setter
    def listeners(self, fns: Sequence[Listener]) -> None:
        fns = tuple(fns)
        for fn in fns:
            kinds = getattr(fn, "event_kinds", None)
            if kinds is not None and not EVENT_KINDS.issuperset(kinds):
                raise ValueError(f"listener {fn!r}: unknown event kinds "
                                 f"{sorted(set(kinds) - EVENT_KINDS)}")
        self._listeners = fns
        self._routes = {}
        self._kernel_listeners = self._route("kernel")

    def _route(self, kind: str) -> tuple:
        """The listeners of ``kind`` (see ``listeners``), cached until the next assignment."""
        fns = self._routes.get(kind)
        if fns is None:
            fns = tuple(fn for fn in self._listeners
                        if getattr(fn, "event_kinds", None) is None or kind in fn.event_kinds)
            self._routes[kind] = fns
        return fns

    def _emit(self, kind: str, payload: dict) -> None:
        for fn in self._route(kind):
            try:
                fn(kind, payload)
            except Exception:
                log.exception("listener %r failed on %s", fn, kind)

    # -- handlers -----------------------------------------------------------------------------
    def on_arrival(self, req: Request, entry: ModelEntry) -> None:
        """A validated request arrives: queue it (RT: EDF; BE: its client's FIFO)."""
        task = Task(req, entry, entry.n_kernels)
        entry.refs += 1
        if entry.handle is None:
            self._fail(task, UnknownModelError(f"model {req.model!r} was unloaded"))
            return
        lock = self.stats.lock  # a FastLock: acquire/release are C calls (stats.pxd)
        lock.acquire()
        try:
            cs = self.stats.client(req.client, _PRIO[task.rt])
            cs.submitted += 1
            self.stats.model(req.model)["submitted"] += 1
        finally:
            lock.release()
        if self._listeners:
            self._emit("arrival", {"request_id": req.id, "model": req.model,
                                   "client": req.client, "priority": _PRIO[task.rt],
                                   "deadline": req.deadline, "t": req.timings.arrival})
        if self.closing:
            self._fail(task, RuntimeClosedError("runtime is closing"))
            return
        if not task.rt and not self._policy.accepts_be:
            self._fail(task, RejectedError(
                f"BE request rejected: policy {self._policy.name!r} serves RT only"))
            return
        depth = self.max_queue_depth
        if depth is not None:
            queued = len(self.rt_queue) if task.rt else len(self.be_queues)
            if queued >= depth:
                self._fail(task, RejectedError(
                    f"{_PRIO[task.rt]} request rejected: {queued} {_PRIO[task.rt]} "
                    f"requests already queued (max_queue_depth={depth})"))
                return
        self._queue(task)
        if req.drop_late and req.deadline < _INF:
            heappush(self._late, (req.deadline, task.tid, False, task))
        if req.hard_deadline < _INF and not task.rt:
            heappush(self._late, (req.hard_deadline, task.tid, True, task))
        # batching observes BE arrivals (ModelServices.on_arrival does nothing else, so
        # without batching neither it nor the clock read is called)
        if not task.rt and self.ext is not None and self.ext.batching:
            self.ext.on_arrival(task, self.device.now())
        self._schedule()

    def on_complete(self, comp: Completion) -> None:
        """One launch left the device (ran or evicted itself), or ``comp.count`` launches
        of one task, consecutive on one stream (a coalesced record, which ``post`` has
        checked with ``_coalescible`` and otherwise split into its single records).

        Applied at once, each launch's counts, "kernel" event and progress are done in
        order, as single records do them, then the last one's tail (``_finish`` or a
        decision) once: the launches but the last take no decision of their own, each
        would repeat the one before it (the settled path)."""
        if comp.count != 1:
            self.coalesced_applied += 1
            s = self.streams[comp.stream]  # (neither missing: ``_coalescible``)
            task = self._task_of(s, comp.task)
            tt = comp.times
            k0 = comp.kernel
            be = s.is_be
            tm = task.req.timings
            for i in range(comp.count):
                s.outstanding -= 1
                if be:
                    self._be_seen = tt[2 * i + 1]  # BE progressed
                if self._kernel_listeners:
                    self._emit("kernel", _kernel_payload(
                        comp.stream, comp.task, k0 + i, comp.executed, tt[2 * i],
                        tt[2 * i + 1], math.nan))
                task.outstanding -= 1
                if k0 + i == task.done:
                    if task.done == 0 and tm.first_kernel_start != tm.first_kernel_start:
                        tm.first_kernel_start = tt[2 * i]
                    task.done += 1
                    while task.pad_full and task.done in task.pad_full:  # ran as padding
                        task.done += 1
            # the last launch's tail, as a single record's below (running, executed, unpadded)
            if task.done >= task.n and not task.answered:
                self._finish(task, comp.t_end)
            elif task.done < task.n and task.outstanding > 0 and s.outstanding > 0:
                self._schedule(settled=True)
                return
            self._schedule()
            return
        s = self.streams.get(comp.stream)
        if s is not None:
            s.outstanding -= 1
            if s.is_be and comp.executed is not False:
                self._be_seen = comp.t_end  # BE progressed
            if s.stop_from is not None:  # preemption latency (docs/design.md, Metrics)
                stop = comp.t_stop if comp.t_stop == comp.t_stop else comp.t_end
                with self.stats.lock:
                    self.stats.preemption_stop.add(max(0.0, stop - s.stop_from))
                    self.stats.preemption_observed.add(comp.t_end - s.stop_from)
                    if s.stop_from_received == s.stop_from_received:
                        self.stats.preemption_stop_submit.add(
                            max(0.0, stop - s.stop_from_received))
                s.stop_from = None
        if self._kernel_listeners:
            self._emit("kernel", _kernel_payload(comp.stream, comp.task, comp.kernel,
                                                 comp.executed, comp.t_start, comp.t_end,
                                                 comp.t_stop))
        if comp.parts:
            self._dkp_credit(comp)
        task = self._task_of(s, comp.task)
        if task is None:
            self._schedule()
            return
        task.outstanding -= 1
        executed = comp.executed
        if executed is None:  # the device cannot tell: trust it unless the flag was up
            executed = not (s is not None and s.flagged)
        if executed and comp.kernel == task.done:
            tm = task.req.timings
            # (``x != x``: x is nan, compiled a C comparison, no ``math.isnan`` lookup)
            if task.done == 0 and tm.first_kernel_start != tm.first_kernel_start:
                tm.first_kernel_start = comp.t_start
            if comp.cpu_s == comp.cpu_s:  # measured (cpu device, RT lanes)
                tm.run_cpu = comp.cpu_s + (0.0 if tm.run_cpu != tm.run_cpu else tm.run_cpu)
            task.done += 1
            while task.pad_full and task.done in task.pad_full:  # ran as padding
                task.done += 1
        if task.state == ABORTING:
            if task.outstanding <= 0:
                self._release(task)
        elif task.done >= task.n and not task.answered:
            self._finish(task, comp.t_end)
        elif task.state == DONE and task.outstanding <= 0:
            self._release(task)
        elif (executed and not comp.parts and s is not None and task.state == RUNNING
              and task.done < task.n and task.outstanding > 0 and s.outstanding > 0):
            # an executed, unpadded launch of a running task, not its last, with more of
            # the task and of its stream still in flight: nothing a decision compares
            # changed here (launches in flight against 0, a task's end, padding credit)
            self._schedule(settled=True)
            return
        self._schedule()

    def _coalescible(self, comp: Completion) -> bool:
        """A coalesced record of n launches can be applied at once: one by one, each
        launch but the last would take ``on_complete``'s settled path (an executed,
        unpadded launch of a running task, not its last, with more of the task and of its
        stream in flight: no decision compares what it changed, so the decision after it
        is the one before it) and none would record a preemption latency. Then the n
        records leave the same state as one pass over their counts followed by the last
        one's decision, which is what ``on_complete`` then does. Reads, changes nothing."""
        n = comp.count
        s = self.streams.get(comp.stream)
        if s is None or comp.parts or s.stop_from is not None:
            return False
        task = self._task_of(s, comp.task)
        if task is None or task.state != RUNNING or task.outstanding < n or s.outstanding < n:
            return False
        if comp.executed is False or (comp.executed is None and s.flagged):
            return False
        k0 = comp.kernel
        done = task.done
        for i in range(n - 1):  # the task's end is not before the last launch
            if k0 + i == done:
                done += 1
                while task.pad_full and done in task.pad_full:
                    done += 1
            if done >= task.n:
                return False
        return True

    # -- control (called through post(("control", fn, fut))) ----------------------------------
    @property
    def policy(self) -> Policy:
        """The live policy, read-only: ``set_policy`` changes it (and applies it to the
        device first)."""
        return self._policy

    def set_policy(self, pol: Policy) -> None:
        """Apply ``pol`` (validated by ``engine.check_policy``) to the device, then publish:
        a device refusal changes nothing."""
        if self._policy.be_unbounded != pol.be_unbounded:
            self._apply_capacity(self.c, pol)
        self._policy = pol
        if not pol.accepts_be:
            err = RejectedError(f"BE request rejected: policy switched to {pol.name!r}")
            for t in self.be_queues.clear():
                self._fail(t, err)
            for s in self.be_streams:
                if s.owner is not None and not s.owner.answered:
                    self._abort(s.owner, err)

    def set_c(self, c: int) -> None:
        """Apply ``c`` (validated by ``engine.check_c``) to the device, then publish: a
        device refusal changes nothing."""
        self._apply_capacity(c, self._policy)
        self.c = c

    def set_edf_preempt(self, flag: bool) -> None:
        self.edf_preempt = bool(flag)

    def set_preempt_drain(self, flag: bool) -> None:
        self.preempt_drain = bool(flag)

    def set_max_queue_depth(self, depth: int | None) -> None:
        self.max_queue_depth = depth

    def set_be_min_share(self, share: float) -> None:
        self.be_min_share = float(share)

    def shutdown(self, drain: bool) -> None:
        """Stop accepting arrivals; without ``drain`` fail everything queued or running."""
        self.closing = True
        if drain:
            return
        try:
            err = RuntimeClosedError("runtime closed before the request completed")
            parked = self.ext.take_parked() if self.ext is not None else []
            for t in self.rt_queue.clear() + self.be_queues.clear() + parked:
                self._fail(t, err)
            for t in list(self.tasks.values()):
                if not t.answered:
                    self._fail(t, err)
        finally:
            self.tasks.clear()
            self.rt_active.clear()
            self.rt_fed = None
            for s in self.streams.values():
                s.owner = None
            self.stopped = True

    def queue_depths(self) -> dict[str, Any]:
        return {"rt": len(self.rt_queue), "be": self.be_queues.depths(),
                "running": len(self.tasks)}

    # -- capacity ---------------------------------------------------------------------------
    def _apply_capacity(self, c: int, policy: Policy) -> None:
        """Give the device capacity ``c`` (the ``wait`` policy's BE streams: the device's
        largest). A device that refuses raises a typed error; what it had applied is put
        back, so a refusal changes nothing."""
        dev = self.device
        try:
            dev.set_capacity(c)
            if policy.be_unbounded:
                for s in self.be_streams:
                    try:
                        dev.set_stream_capacity(s.id, dev.max_capacity)
                    except NotImplementedError:
                        log.warning("device %s has no per-stream capacity: 'wait' runs its "
                                    "BE streams with c=%d", dev.name, c)
                        break
        except Exception as e:
            try:  # put the published setting back on the device
                dev.set_capacity(self.c)
                if self._policy.be_unbounded:
                    for s in self.be_streams:
                        dev.set_stream_capacity(s.id, dev.max_capacity)
            except Exception:  # noqa: BLE001
                log.exception("device %s: restoring capacity %d failed", dev.name, self.c)
            if isinstance(e, AvInferError):
                raise
            raise DeviceFaultError(
                f"device {dev.name!r} refused capacity {c}: {type(e).__name__}: {e}") from e

    # -- the decision routine ---------------------------------------------------------------
    def _schedule(self, settled: bool = False) -> None:
        """The decision routine, run at the end of every event. ``settled``: the event
        changed nothing ``_schedule_be`` compares (``on_complete``'s launch of a running
        task, not its last, with launches of the task and of its stream still in flight),
        and the previous decision left BE settled; then only BE's share and RT are decided
        (the BE pass would do nothing). Most completions on a GPU are such (one per
        kernel): skipping the BE pass for them made a 60 s DISB-E simulator run 9-13 %
        faster, with every decision the same (docs/bench.md)."""
        if self.stopped:
            return
        granted = self._be_granted()
        if not granted:
            if settled and self._rt_idle():
                return
            self._schedule_rt()
        self._schedule_be(granted)

    def _rt_width(self) -> int:
        """RT tasks that may run at once: the device's ``rt_parallel`` where RT has its
        high-priority streams and no EDF take-over (which assumes one fed RT task)."""
        if self.edf_preempt or not self._policy.rt_high_priority or self._policy.exclusive:
            return 1
        return len(self.rt_par)

    def _rt_stream_for(self, task: Task) -> StreamState | None:
        """The stream ``task`` starts on; None when every parallel RT stream is taken."""
        if task.outstanding > 0 and task.stream in self.streams:
            return self.streams[task.stream]  # launches still there: keep stream order
        if not self._policy.rt_high_priority:
            return self.rt_plain
        if self._rt_width() == 1:
            return self.rt_hi
        busy = {t.stream for t in self.rt_active}
        for s in self.rt_par:
            if s.outstanding <= 0 and s.id not in busy:
                return s
        return None

    def _be_running_count(self) -> int:
        """BE streams whose task is running (not preempted, paused or finished)."""
        n = 0
        for s in self.be_streams:  # a plain loop: no generator (a closure and a frame)
            if s.owner is not None and s.owner.state == RUNNING:
                n += 1
        return n

    def _be_running(self) -> bool:
        return self._be_running_count() > 0

    def _be_in_flight(self) -> bool:
        """A BE stream with a task has launches on the device (plain loops here and in
        ``_be_owned``, not ``any()`` over a generator: the wait policy asks on every
        decision while RT is queued)."""
        for s in self.be_streams:
            if s.owner is not None and s.outstanding > 0:
                return True
        return False

    def _be_owned(self) -> bool:
        """A BE stream has a task (running, preempted or paused)."""
        for s in self.be_streams:
            if s.owner is not None:
                return True
        return False

    def _rt_idle(self) -> bool:
        """``_schedule_rt`` would do nothing: no RT request is queued, or the fed RT task
        keeps every RT stream it may (one at a time, or all parallel ones taken) and no
        more urgent one is due to take over (``edf_preempt``)."""
        if not self.rt_queue:
            return True
        cur = self.rt_fed
        if cur is None:
            return False
        width = self._rt_width()
        if not (width == 1 or len(self.rt_active) >= width):
            return False
        if not self.edf_preempt:
            return True
        top = self.rt_queue.peek()
        return top is None or not top[0] < cur.req.deadline

    def _schedule_rt(self) -> None:
        if self._rt_idle():
            return
        cur = self.rt_fed
        width = self._rt_width()
        if cur is not None and (width == 1 or len(self.rt_active) >= width):
            self._rt_switch(cur)  # a more urgent RT request takes over (_rt_idle)
        while self.rt_queue:
            if self._policy.exclusive and (self._be_running() or self.rt_active):
                return
            if width > 1 and (len(self.rt_active) >= width
                              or self._rt_stream_for(self.rt_queue.peek()[1]) is None):
                return  # every parallel RT stream runs a task: EDF order on the next one
            if self._policy.preempts:
                self._preempt_be()
                if (self._policy.waits or self.preempt_drain) and self._be_in_flight():
                    return  # what BE launched finishes or self-evicts first
            task = self.rt_queue.pop()
            if task.entry.variants is not None and self.ext is not None and not task.allocated:
                task = self.ext.maybe_batch(task, self.device.now(), self._be_queued_of,
                                            self._be_take_of)
            if self._start(task, self._rt_stream_for(task)) and width == 1:
                return

    def _rt_switch(self, cur: Task) -> None:
        """edf_preempt: a more urgent RT request takes the RT stream at a kernel boundary."""
        s = self.streams[cur.stream]
        info = self.device.reset(s.id)
        self.rt_fed = None
        if info is None:
            return  # fully transmitted: it drains and completes on its own
        self._account_dropped(cur, s, info)
        resume = max(info.last_sent + 1, info.done) if info.task == cur.tid else cur.enq_from
        if resume >= cur.n:
            return  # nothing was dropped: it completes on its own
        cur.resume_from = resume
        cur.state = PAUSED
        self.rt_active.discard(cur)
        self._queue(cur)
        cur.req.timings.preempted += 1
        with self.stats.lock:
            self.stats.rt_switches += 1
        if self._listeners:
            self._emit("preempt", {"request_id": cur.tid, "stream": s.id, "kind": "edf",
                                   "last_sent": info.last_sent, "done": info.done,
                                   "t": self.device.now()})

    def _account_dropped(self, task: Task, s: StreamState, info: ResetInfo) -> None:
        """What a reset dropped: the launches, and the BE parts of padded ones (the one
        place a reset's padding is handled)."""
        self._count(task, s, -info.dropped)
        if info.dropped_parts:
            self._dkp_forget(info.dropped_parts)

    def _preempt_be(self) -> None:
        """Reset every BE stream that is feeding a task, then raise its flag: launches still
        in flight (<= c under reef, everything under wait) run or evict themselves."""
        top = self.rt_queue.peek()
        if top is not None:
            head = top[1]  # (typed: C reads of the task's request timings)
            tm = head.req.timings
            arrival, received = tm.arrival, tm.received
        else:
            arrival = received = self.device.now()
        # padding without padded launches (cpu): BE streams beside RT keep running, less
        # the cores the arriving RT task takes when others already run
        keep = self._be_room_beside_rt(len(self.rt_active) + 1)
        for s in self.be_streams:
            t = s.owner
            if t is None or t.state != RUNNING:
                continue
            if keep > 0:
                keep -= 1
                continue
            info = self.device.reset(s.id)  # before the flag: ``done`` counts executed only
            if info is None:
                continue  # nothing queued or in flight: its completions are on the way
            self._account_dropped(t, s, info)
            mine = info.task == t.tid
            self._flag(s, True)
            if s.outstanding > 0 and s.stop_from is None and info.running is not False:
                s.stop_from, s.stop_from_received = arrival, received
            t.state = PREEMPTED
            t.reset_done = info.done if mine else t.enq_from
            t.req.timings.preempted += 1
            with self.stats.lock:
                self.stats.preemptions += 1
            if self._listeners:
                self._emit("preempt", {"request_id": t.tid, "stream": s.id,
                                       "kind": self._policy.preempt,
                                       "last_sent": info.last_sent, "done": info.done,
                                       "dropped": info.dropped, "t": self.device.now()})

    def _be_room_beside_rt(self, rt_tasks: int) -> int:
        """BE streams that may run while ``rt_tasks`` (>= 1) RT tasks run: with padding but
        no padded launches (cpu), BE keeps the cores RT leaves free (``be_beside_rt``
        beside the first RT task, ``rt_task_cores`` fewer for each further one); 0 for
        every other policy and device (BE waits for RT, or pads RT's launches)."""
        if not (self._policy.padding and self._dkp is None):
            return 0
        dev = self.device
        return max(0, dev.be_beside_rt - max(0, rt_tasks - 1) * dev.rt_task_cores)

    def _schedule_be(self, granted: bool = False) -> None:
        rt_mode = (bool(self.rt_queue) or bool(self.rt_active)) and not granted
        # Idle flagged streams (aborted or finished tasks) get their flag back down.
        for s in self.be_streams:
            if s.flagged and s.owner is None and s.outstanding <= 0:
                self._flag(s, False)
        if not self._policy.accepts_be:
            return
        # BE streams allowed to run now (None: no bound). While RT runs, only the room RT
        # leaves (cpu padding): a BE task ending beside RT is followed by the next one
        # (or a preempted one resumes) instead of leaving its core idle until RT ends.
        room: int | None = None
        if rt_mode and not self._policy.be_concurrent_with_rt:
            room = self._be_room_beside_rt(max(1, len(self.rt_active)))
            if room <= 0:
                return
        # Resume preempted / paused tasks first (they own their streams).
        for s in self.be_streams:
            t = s.owner
            if t is None or t.state not in (PREEMPTED, PAUSED):
                continue
            if room is not None and self._be_running_count() >= room:
                return
            if self._policy.exclusive and (self._be_running() or self.rt_active):
                return
            if t.state == PREEMPTED:
                if s.outstanding > 0:
                    continue  # wait until every launch of the reset stream completed
                if t.pad_in_flight > 0:
                    continue  # its blocks still run inside RT launches (a BE grant)
                self._restore(t, s)
            else:
                self._enqueue(t, s, t.resume_from)
                if self._listeners:
                    self._emit("restore", {"request_id": t.tid, "stream": s.id,
                                           "from": t.resume_from, "t": self.device.now()})
        # Start new BE tasks on free streams.
        for s in self.be_streams:
            if not self.be_queues:
                return
            if s.owner is not None or s.outstanding > 0 or s.flagged:
                continue
            if room is not None and self._be_running_count() >= room:
                return
            if self._policy.exclusive and (self._be_running() or self.rt_active or
                                           self._be_owned()):
                return
            while self.be_queues:
                t = self.be_queues.pop()
                now = self.device.now()
                if _past_hard_deadline(t, now):
                    self._miss(t, now, t.req.hard_deadline)
                    continue
                # batching or a variant group: a request transform ahead of dispatch
                # (ModelServices.maybe_batch returns a BE task unchanged without either)
                if self.ext is not None and (self.ext.batching or self.ext.groups):
                    t = self.ext.maybe_batch(t, now, self._be_queued_of, self._be_take_of)
                if self._start(t, s):
                    break

    def _restore(self, t: Task, s: StreamState) -> None:
        # Restore from the first kernel not known to have run: the later of the vHQ's
        # ``done`` at the reset (completions the device saw before the flag rose) and
        # ``t.done`` (executed completions reported since); every launch of the reset stream
        # has completed, in order, by now. REEF's max(done, k_l - c) is the same kernel (at
        # most c launches are in flight), observed here rather than inferred. ``t.done``
        # alone is not enough where the device cannot tell executed from evicted (CUDA:
        # nothing counts while the flag is up): completions that ran before the reset can
        # reach this thread after the flag, and restoring from ``t.done`` then re-ran
        # kernels beyond the plan's reuse guard, whose inputs were overwritten (wrong BE
        # outputs on an H100, docs/gpu_results.md). So no kernel known to have run is ever
        # re-run (re-sent launches were not known to run), and nothing counts re-runs.
        rp = max(t.done, t.reset_done or 0)
        t.done = rp
        t.reset_done = None
        if t.pad_k >= 0:  # padded meanwhile: completions of padded launches are certain
            t.pad_k, t.pad_b = -1, 0
            t.pad_blocks.clear()
        self._flag(s, False)
        with self.stats.lock:
            self.stats.restores += 1
        self._enqueue(t, s, rp)
        if self._listeners:
            self._emit("restore", {"request_id": t.tid, "stream": s.id, "from": rp,
                                   "t": self.device.now()})

    # -- the BE queue as batching sees it (model_services.maybe_batch) -------------------------
    def _be_queued_of(self, model: str) -> list[Task]:
        """Queued, never-started BE requests of ``model`` in dispatch order (FIFO per
        client, clients in turn approximated by queue order), none past its hard
        deadline."""
        now = self.device.now()
        return [x for x in self.be_queues if self._batchable(x, model, now)]

    def _be_take_of(self, model: str, n: int) -> list[Task]:
        """Remove and return up to ``n`` of ``_be_queued_of(model)``."""
        left = [n]
        now = self.device.now()

        def pick(x: Task) -> bool:
            if left[0] > 0 and self._batchable(x, model, now):
                left[0] -= 1
                return True
            return False

        return self.be_queues.remove_if(pick)

    def _batchable(self, x: Task, model: str, now: float) -> bool:
        """A queued BE request batching may take for ``model``: never started, not past its
        hard deadline."""
        return (x.req.model == model and not x.allocated
                and not _past_hard_deadline(x, now))

    # -- task lifecycle ---------------------------------------------------------------------
    def _start(self, t: Task, s: StreamState) -> bool:
        """Give ``t`` a stream; False if it was answered instead (late, fault)."""
        req = t.req
        now = self.device.now()
        if req.drop_late and not t.allocated and now > req.deadline:  # never-started only
            self._miss(t, now)
            return False
        if not t.allocated:
            handle = t.entry.handle
            if self.ext is not None:  # cache hook: retain the model, or park t until loaded
                handle = self.ext.acquire(t)
                if handle is None:  # parked: resume_parked queues it again once loaded
                    return False
            try:
                port = self._port
                if port is not None:  # C calls (the cpu device's lane engine)
                    port.new_task(handle, t.tid)
                    t.allocated = True
                    self.tasks[t.tid] = t
                    port.write_inputs(t.tid, req.inputs)
                else:
                    self.device.new_task(handle, t.tid)
                    t.allocated = True
                    self.tasks[t.tid] = t
                    self.device.write_inputs(t.tid, req.inputs)
            except Exception as e:  # noqa: BLE001
                self._fail(t, DeviceFaultError(f"could not start request {req.id}: {e}"))
                if t.allocated:
                    self._release(t)
                elif self.ext is not None:
                    self.ext.release(t)
                return False
            req.inputs = {}
            req.timings.start = now
            first = 0
        else:
            first = t.resume_from
        if t.rt:
            self.rt_fed = t
            self.rt_active.add(t)
        else:
            s.owner = t
        if self._listeners:
            self._emit("dispatch", {"request_id": t.tid, "stream": s.id, "first": first,
                                    "priority": _PRIO[t.rt], "t": now})
        # no wake-up only where the waiting caller itself is handling this (it helps next)
        self._enqueue(t, s, first, wake=req.caller_runs != get_ident())
        return True

    def _enqueue(self, t: Task, s: StreamState, first: int, wake: bool = True) -> None:
        """Launch ``t`` from kernel ``first`` on ``s``. A device refusing the launches
        fails ``t`` (typed) and nothing else: what it took completes or is reset."""
        try:
            self._enqueue_from(t, s, first, wake)
        except Exception as e:  # noqa: BLE001 - the device refused the launches
            req = t.req
            self._evict(t, e if isinstance(e, AvInferError) else DeviceFaultError(
                f"could not launch request {req.id} ({req.model}): {type(e).__name__}: {e}"))

    def _enqueue_from(self, t: Task, s: StreamState, first: int, wake: bool) -> None:
        t.state = RUNNING
        t.stream = t.req.stream = s.id
        if first >= t.n:
            return
        t.enq_from = first
        if t.rt and self._policy.padding and self._dkp is not None:
            self._enqueue_padded(t, s, first)
        else:
            self._launch(t, s, first, t.n - 1, wake)

    def _count(self, t: Task, s: StreamState, n: int) -> None:
        """``n`` launches of ``t`` enqueued on ``s`` (negative: dropped by a reset). The one
        writer of both counts besides a completion (``on_complete``): ``s.outstanding`` is
        the stream's total over every task with launches on it, ``t.outstanding`` the
        task's share (the device's own in-flight window, at most ``c``, is the vHQ's)."""
        t.outstanding += n
        s.outstanding += n

    def _flag(self, s: StreamState, flag: bool) -> None:
        """Raise or lower ``s``'s preemption flag: held here (``s.flagged``, what the
        decisions read) and published to the device (``set_preempt``: the word its
        launches check, a lane's flag on the CPU, device memory on a GPU); the only
        writer of either."""
        self.device.set_preempt(s.id, flag)
        s.flagged = flag

    def _launch(self, t: Task, s: StreamState, first: int, last: int,
                wake: bool = True) -> None:
        """Enqueue kernels ``first..last`` of ``t``; counted as outstanding only once the
        device took them (a refusal leaves the counts matching what is on the device; the
        completions of what it took are handled after this handler, never during it)."""
        port = self._port
        if port is not None:
            port.enqueue(s.id, t.tid, first, last, wake)
        else:
            self.device.enqueue(s.id, t.tid, first, last, wake)
        self._count(t, s, last - first + 1)

    # -- dynamic kernel padding (REEF §5) -----------------------------------------------------
    def _enqueue_padded(self, t: Task, s: StreamState, first: int) -> None:
        """Enqueue RT kernels ``first..`` asking the selector, kernel by kernel, for blocks of
        preempted BE tasks (as REEF's launch loop does); runs without padding stay ranges."""
        sel = self._dkp
        rt_nums = t.entry.dkp_numbers(self.sms)
        cands = self._dkp_refresh() if rt_nums is not None else {}
        if not cands:
            self._launch(t, s, first, t.n - 1)
            return
        dev = self.device
        run_from = first
        for k in range(first, t.n):
            dur, blocks, bps, _, _ = rt_nums[k]
            parts = sel.select(dur, blocks, bps)
            if not parts:
                continue
            if run_from < k:
                self._launch(t, s, run_from, k - 1)
            run_from = k + 1
            try:
                padded = dev.enqueue_padded(s.id, t.tid, k, parts)
            except Exception:  # noqa: BLE001 - the BE parts are wrong, not the RT kernel
                log.warning("padded launch of %s kernel %d refused; padding with %s is off",
                            t.entry.name, k, sorted({cands[p[0]][0].entry.name
                                                     for p in parts}), exc_info=True)
                for p in parts:
                    self._dkp_off.add(cands[p[0]][0].entry.name)
                self._launch(t, s, k, k)
                continue
            self._count(t, s, 1)
            if not padded:
                continue  # queued unpadded (e.g. the padded module still compiles)
            with self.stats.lock:
                self.stats.padded_launches += 1
                self.stats.padded_blocks += sum(p[3] for p in parts)
            for tid, kern, b0, nb, _occ in parts:  # move the cursors past what was issued
                bt, slot = cands[tid]
                bt.pad_in_flight += 1  # until the device reports the launch's end
                nums = bt.entry.dkp_numbers(self.sms)
                kb = nums[kern][1]
                if b0 + nb >= kb:
                    bt.pad_k, bt.pad_b = kern + 1, 0
                else:
                    bt.pad_k, bt.pad_b = kern, b0 + nb
                self._dkp_offer(bt, slot, nums)
        if run_from < t.n:
            self._launch(t, s, run_from, t.n - 1)

    def _dkp_refresh(self) -> dict[int, tuple[Task, int]]:
        """Offer the next kernel of every preempted BE task (one selector slot per BE
        stream); returns task id -> (task, slot) of the candidates."""
        sel = self._dkp
        out: dict[int, tuple[Task, int]] = {}
        for slot, bs in enumerate(self.be_streams):
            t = bs.owner
            nums = t.entry.dkp_numbers(self.sms) if t is not None else None
            if t is None or t.state != PREEMPTED or t.answered or nums is None \
                    or t.entry.name in self._dkp_off:
                sel.clear(slot)
                continue
            if t.pad_k < 0:
                t.pad_k, t.pad_b = t.done, 0
            if self._dkp_offer(t, slot, nums):
                out[t.tid] = (t, slot)
        return out

    def _dkp_offer(self, t: Task, slot: int,
                   nums: list[tuple[float, int, int, float, float]]) -> bool:
        if t.pad_k >= t.n:
            self._dkp.clear(slot)
            return False
        dur, blocks, bps, rnd, one = nums[t.pad_k]
        self._dkp.set(slot, t.tid, t.pad_k, dur, blocks, bps, min(t.pad_b, blocks), rnd, one)
        return True

    def _dkp_credit(self, comp: Completion) -> None:
        """A padded launch completed: its BE blocks ran; kernels whose every block ran count
        as executed (in order, so ``done`` stays a prefix)."""
        for tid, kern, _b0, nb, _occ in comp.parts:
            bt = self.tasks.get(tid)
            if bt is None:
                continue
            bt.pad_in_flight -= 1
            if bt.answered:
                continue
            nums = bt.entry.dkp_numbers(self.sms)
            got = bt.pad_blocks.get(kern, 0) + nb
            bt.pad_blocks[kern] = got
            if nums is None or got < nums[kern][1]:
                continue
            bt.pad_full.add(kern)
            bt.req.timings.kernels_padded += 1
            with self.stats.lock:
                self.stats.padded_kernels += 1
            while bt.done in bt.pad_full:
                bt.done += 1
            if bt.done >= bt.n:
                self._finish(bt, comp.t_end)

    def _dkp_forget(self, dropped: Sequence[tuple[int, int, Sequence[tuple]]]) -> None:
        """A reset dropped these padded launches (``ResetInfo.dropped_parts``, in queue
        order): their BE blocks never ran, so each BE task's cursor goes back to its first
        dropped part, and those parts are no longer in flight."""
        back: dict[int, tuple[int, int]] = {}
        for _rt_tid, _rt_kernel, parts in dropped:
            for tid, kern, b0, _nb, _occ in parts:
                bt = self.tasks.get(tid)
                if bt is not None:
                    bt.pad_in_flight -= 1
                if tid not in back:
                    back[tid] = (kern, b0)
        for tid, (kern, b0) in back.items():
            bt = self.tasks.get(tid)
            if bt is not None and bt.pad_k >= 0:
                bt.pad_k, bt.pad_b = kern, b0

    def _task_of(self, s: StreamState | None, tid: Any) -> Task | None:
        """``tasks.get(tid)`` for a completion on ``s`` (None: no such stream), the same
        answer, most often without the dict look-up: the stream's current task (a BE
        stream's ``owner``, an RT stream's ``rt_fed``) is the one asked for in most
        completions, and it is in ``tasks`` as long as it is current: ``_start`` makes it
        current after adding it, and whatever takes a task out of ``tasks`` makes it
        not current first (``_detach``: ``_finish``, ``_abort``, ``_evict``, a DONE
        task's release) or at once (``_release`` of an aborting task, ``close``)."""
        if s is not None:
            t = s.owner if s.is_be else self.rt_fed
            if t is not None and t.tid == tid:
                return t
        return self.tasks.get(tid)

    def _detach(self, t: Task) -> None:
        if t.rt:
            self.rt_active.discard(t)
            if self.rt_fed is t:
                self.rt_fed = None
        else:
            s = self.streams.get(t.stream)
            if s is not None and s.owner is t:
                s.owner = None

    def _release(self, t: Task) -> None:
        self.tasks.pop(t.tid, None)
        if t.allocated:
            t.allocated = False
            try:
                port = self._port
                if port is not None:
                    port.release_task(t.tid)
                else:
                    self.device.release_task(t.tid)
            except Exception:
                log.exception("release_task(%d) failed", t.tid)
            if self.ext is not None:  # cache hook: the model may be evicted again
                self.ext.release(t)
        if t.state == ABORTING:
            t.state = DONE
            s = self.streams.get(t.stream)
            if s is not None and s.owner is t:
                s.owner = None

    def _finish(self, t: Task, t_end: float) -> None:
        req = t.req
        try:
            port = self._port
            if port is not None:
                outputs = port.read_outputs(t.tid)
            else:
                outputs = self.device.read_outputs(t.tid)
        except Exception as e:  # noqa: BLE001
            err = e if isinstance(e, AvInferError) else DeviceFaultError(
                f"request {req.id} ({req.model}) failed on the device: {e}")
            self._detach(t)
            self._fail(t, err)
            t.state = DONE
            if t.outstanding <= 0:
                self._release(t)
            return
        req.timings.end = t_end
        self._detach(t)
        t.state = DONE
        if t.outstanding <= 0:
            self._release(t)
        self._answer(t, Result(req.id, req.model, req.client, req.priority, outputs,
                               req.timings, req.deadline, req.hard_deadline))

    def _abort(self, t: Task, err: AvInferError) -> None:
        """Answer a running task with ``err`` and evict its launches."""
        self._fail(t, err)
        if t.rt:
            self._detach(t)
        s = self.streams.get(t.stream)
        if t.outstanding > 0 and s is not None:
            info = self.device.reset(s.id)
            if info is not None:
                self._account_dropped(t, s, info)
            if t.outstanding > 0 and s.is_be:
                self._flag(s, True)
        if t.outstanding > 0:
            t.state = ABORTING
        else:
            t.state = DONE
            self._detach(t)
            self._release(t)

    # -- answering (deferred until the handler is done, so callbacks never re-enter) -------
    def _answer(self, t: Task, result: Result) -> None:
        if t.answered:
            return
        if t.members is not None:  # a batch task: each member gets its rows (or an error)
            t.answered = True
            for m, res in self.ext.split_result(t, result):
                if isinstance(res, AvInferError):
                    self._fail(m, res)
                else:
                    self._answer(m, res)
            return
        t.answered = True
        req = t.req
        tm = req.timings
        lock = self.stats.lock  # a FastLock: acquire/release are C calls (stats.pxd)
        lock.acquire()
        try:
            cs = self.stats.client(req.client, _PRIO[t.rt])
            cs.completed += 1
            cs.latency.add(tm.end - tm.arrival)
            if tm.first_kernel_start == tm.first_kernel_start:  # not nan
                cs.preemption_latency.add(tm.first_kernel_start - tm.arrival)
            if tm.end > req.deadline:
                cs.deadline_misses += 1
            self.stats.model(req.model)["completed"] += 1
        finally:
            lock.release()
        self._unref(t.entry)
        self._answers.append((req.future, result, False))
        if self._listeners:
            self._emit("complete", {"request_id": req.id, "model": req.model,
                                    "client": req.client, "priority": _PRIO[t.rt],
                                    "latency": tm.end - tm.arrival,
                                    "preempted": tm.preempted,
                                    "deadline_met": tm.end <= req.deadline, "t": tm.end})

    def _fail(self, t: Task, err: AvInferError) -> None:
        if t.answered:
            return
        if t.members is not None:  # a batch task: every member fails
            t.answered = True
            for m in t.members:
                self._fail(m, err)
            return
        t.answered = True
        req = t.req
        req.inputs = {}
        with self.stats.lock:
            cs = self.stats.client(req.client, _PRIO[t.rt])
            cs.failed += 1
            code = err.code
            cs.errors[code] = cs.errors.get(code, 0) + 1
            self.stats.model(req.model)["failed"] += 1
        self._unref(t.entry)
        self._answers.append((req.future, err, True))
        if self._listeners:
            self._emit("fail", {"request_id": req.id, "model": req.model, "client": req.client,
                                "priority": _PRIO[t.rt],
                                "error": err.code, "message": str(err),
                                "t": self.device.now()})

    def _unref(self, entry: ModelEntry) -> None:
        entry.refs -= 1
        if entry.refs <= 0 and entry.unloading:
            self._unload(entry)

    def _unload(self, entry: ModelEntry) -> None:
        if self.ext is not None:  # cache hook: the cache owns the device memory
            entry.handle = None
            self.ext.unload(entry)
            return
        if entry.handle is not None:
            handle, entry.handle = entry.handle, None
            try:
                self.device.unload_plan(handle)
            except Exception:
                log.exception("unload_plan(%s) failed", entry.name)

    def unload(self, entry: ModelEntry) -> None:
        """Free the model's device memory once no accepted request uses it."""
        entry.unloading = True
        if entry.refs <= 0:
            self._unload(entry)

    def _flush_answers(self) -> None:
        """Resolve the futures of the answers the handler made, each once. No ``done()``
        call first (a Python method call an answer): a future already done (a caller
        cancelled it) refuses the resolution itself (``Future.set_result``/
        ``set_exception`` raise ``InvalidStateError``, which leaves it as it was)."""
        answers, self._answers = self._answers, []
        for fut, value, is_err in answers:
            try:
                if is_err:
                    fut.set_exception(value)
                else:
                    fut.set_result(value)
            except Exception:  # InvalidStateError: someone cancelled it meanwhile
                log.debug("future already resolved", exc_info=True)


#: the "kernel" listener event's keys, in order (``_kernel_payload`` copies it)
_KERNEL_KEYS = dict.fromkeys(("stream", "task", "kernel", "executed", "t_start", "t_end",
                              "t_stop"))


def _kernel_payload(stream: int, task: Any, kernel: int, executed: Any, t_start: float,
                    t_end: float, t_stop: float) -> dict:
    """The "kernel" event's payload (one per completion while a listener listens): a
    copy of ``_KERNEL_KEYS`` with the values set, the same dict (keys, order, values) as
    the display it replaces, made without growing a new dict key by key."""
    p = _KERNEL_KEYS.copy()
    p["stream"] = stream
    p["task"] = task
    p["kernel"] = kernel
    p["executed"] = executed
    p["t_start"] = t_start
    p["t_end"] = t_end
    p["t_stop"] = t_stop
    return p


def _past_hard_deadline(t: Task, now: float) -> bool:
    """A never-started BE request past its hard deadline (worth 0, paper 001): it is
    answered missed, never dispatched nor batched, whether or not the late heap's timer
    has fired yet (a stream freeing at once, or a batch formed meanwhile, would serve it
    before). Compiled, a C function of a typed task (scheduler.pxd)."""
    return (not t.rt and not t.allocated and t.members is None
            and now > t.req.hard_deadline)


def _port_of(device: Device) -> LaneEngine | None:
    """The device's C-level table (``Device.lane_engine``, docs/request_path.md section
    2): the cpu device's lane engine where its request-path methods are the engine's own
    (``CpuDevice.lane_engine`` says; read once, here), else None (every other device:
    Python calls)."""
    port = device.lane_engine
    return port if isinstance(port, LaneEngine) else None


def _device_sms(device: Device) -> int:
    """SM count of the device (0 if it is not a GPU): DKP counts slots per SM."""
    sms = device.sms
    return int(sms) if isinstance(sms, int) and sms > 0 else 0
