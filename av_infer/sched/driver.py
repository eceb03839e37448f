# cython: annotation_typing=False, language_level=3
"""The driver of the synchronous Scheduler: who calls ``Scheduler.post``, and when.

Why no scheduler thread: on a CPU the runtime's own cost is thread hand-offs. A dedicated
scheduler thread costs two wake-ups per request (submit -> scheduler -> lane, lane ->
scheduler -> caller), 50-150 us each on a busy 2-core machine, which is a large share of a
1 ms model. Here the thread that posts an event handles it (flat combining): ``submit``
starts the task on the caller's thread and a lane's completion is handled on the lane,
so a request costs one hand-off each way, the irreducible ones (caller -> lane -> caller).

Guarantees:

* the scheduler is entered by one thread at a time, never re-entered (events posted while
  one is handled, from any thread, are handled by the thread already inside before it
  leaves);
* ``post`` never blocks on another thread's handler: it queues the event and returns when
  another thread is inside (that thread handles it), so a lane is never held up by a
  caller and vice versa;
* no event is lost: a thread leaving re-checks the queue after releasing the lock;
* futures' done-callbacks run on one callback thread per runtime (``callbacks="thread"``),
  never inside the scheduler or on a lane, so user code (a ROS publish) cannot delay a
  decision or a launch; the simulator delivers them inline (``"inline"``), in virtual time;
* time-driven decisions happen on time, not at the next unrelated event: after handling,
  the driver asks ``sched.next_timer()`` (device time of the next one, inf if none) and
  arms one timer for it, a thread waiting on a condition (wall clock) or an event of the
  virtual device (``Device.call_at``); when it fires it posts ``("timer",)``.

Compiled where built (``driver.pxd``, Cython's pure-Python mode, as the scheduler): the
devices hand every completion to :meth:`Driver.complete` (``Device.start``), a C
function that calls the compiled scheduler; in the simulator that is the cost of each
kernel completion (docs/bench.md, "Simulator speed").
"""

from __future__ import annotations

import concurrent.futures._base as _fb
import logging
import math
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from queue import SimpleQueue
from typing import Any

from av_infer._cy.fastlock import FastLock, thread_ident

log = logging.getLogger(__name__)

__all__ = ["Driver", "RequestFuture"]


#: ``concurrent.futures.Future``'s own attributes (CPython 3.8-3.13), which
#: ``RequestFuture`` sets itself; if a Python changes them it falls back to
#: ``Future.__init__`` and ``Future``'s own methods (slower, the same behaviour)
_FUTURE_FIELDS = frozenset({"_condition", "_done_callbacks", "_exception", "_result",
                            "_state", "_waiters"})
_LEAN = frozenset(vars(Future())) == _FUTURE_FIELDS and all(
    hasattr(_fb, n) for n in ("PENDING", "FINISHED", "InvalidStateError"))
_PENDING, _FINISHED = _fb.PENDING, _fb.FINISHED
_DONE_STATES = frozenset({_fb.CANCELLED, _fb.CANCELLED_AND_NOTIFIED, _fb.FINISHED})
#: guards the creation of a future's condition against its resolution (see
#: ``RequestFuture``); held for a few attribute operations, never while waiting or
#: running callbacks
_COND_LOCK = FastLock()


class RequestFuture(Future):
    """A Future whose done-callbacks run where the driver delivers them (its callback
    thread), not on whichever thread resolved it.

    A thread that blocks on it (``result``/``exception``) first *helps*: it runs the
    request's queued launches itself (``request``; the device's ``run_pending``) while no
    lane thread is running them, so a caller that waits anyway costs no thread hand-off.

    Lean (one per request, docs/request_path.md): a ``Future`` makes a
    ``threading.Condition`` over an ``RLock`` when it is built and takes it on every
    ``set_result``, ``result`` and ``done``, about 29 k instructions per request. Most
    requests are resolved before anyone waits on them (``infer``'s caller runs its own
    launch), so the condition is made only when something needs it: a thread that waits
    (``result``/``exception`` before it is done, ``concurrent.futures.wait``,
    ``as_completed``), ``add_done_callback``, ``cancel``, ``set_running_or_notify_cancel``
    or ``repr`` (every ``Future`` method that reads ``_condition`` makes it).
    ``_COND_LOCK`` orders its creation against the resolution: a resolver that finds no
    condition resolves under that lock, so a condition made later sees the result (and
    nobody can be waiting on one that does not exist yet); one that finds a condition
    resolves as ``Future`` does (waiters, ``notify_all``, callbacks). ``done``,
    ``result`` and ``exception`` of a resolved future read its state without the lock
    (the result is written before the state). Everything else is ``Future``'s own, so
    ``concurrent.futures.wait``/``as_completed`` and ``asyncio.wrap_future`` work on it
    (tests/sched/test_request_future.py)."""

    #: the request whose launches a waiting thread runs (``_help``; set by the runtime when
    #: it posts the request). It holds this future: dropped once resolved, so a request is
    #: freed when its last reference goes instead of by the cycle collector (whose
    #: collections, every few hundred requests, cost about 12 k instructions a request)
    request: Any = None
    #: set once a result or an exception is in (a plain read, unlike ``done()``, which
    #: takes the future's lock: helpers poll it between launches)
    resolved = False

    if _LEAN:
        # ``Future``'s fields as class-level defaults of a pending future without a
        # condition: a new future sets only ``_driver`` (each attribute set on an instance
        # is a generic setattr, ~200 instructions, nine of them a request before), and an
        # instance attribute written later (``Future``'s methods, ``_condition``,
        # ``set_result``) shadows its default. ``_waiters``/``_done_callbacks`` are made
        # with the condition (every ``Future`` method that reads them holds it first); a
        # missed one fails loudly (a tuple has no ``append``)
        _cond: threading.Condition | None = None
        _state = _PENDING
        _result: Any = None
        _exception: BaseException | None = None
        _waiters: list | tuple = ()
        _done_callbacks: list | tuple = ()

    def __init__(self, driver: Driver) -> None:
        if not _LEAN:
            super().__init__()
        self._driver = driver

    if _LEAN:
        @property  # type: ignore[override]
        def _condition(self) -> threading.Condition:
            c = self._cond
            if c is None:
                _COND_LOCK.acquire()
                try:
                    c = self._cond
                    if c is None:
                        self._waiters, self._done_callbacks = [], []
                        c = self._cond = threading.Condition()
                finally:
                    _COND_LOCK.release()
            return c

        def set_result(self, result: Any) -> None:
            if self._cond is None:
                _COND_LOCK.acquire()  # a FastLock: a C call compiled (_cy/fastlock.pyx)
                try:
                    if self._cond is None and self._state not in _DONE_STATES:
                        # nobody waits, no callbacks: resolved here (see the class)
                        self._result = result
                        self._state = _FINISHED
                        self.resolved = True
                        self.request = None
                        return
                finally:
                    _COND_LOCK.release()
            super().set_result(result)  # waiters, callbacks; or InvalidStateError
            self.resolved = True
            self.request = None

        def done(self) -> bool:
            return self._state in _DONE_STATES

        def result(self, timeout: float | None = None) -> Any:
            req = self.request  # ``_help`` inline: no method call per request
            if req is not None and not self.resolved:
                _help_run(self, self._driver, req)
            if self._state == _FINISHED:
                exc = self._exception
                if exc is None:
                    return self._result
                try:
                    raise exc
                finally:  # no reference cycle through the traceback
                    exc = None
                    self = None  # noqa: PLW0642
            return super().result(timeout)

        def exception(self, timeout: float | None = None) -> BaseException | None:
            self._help()
            if self._state == _FINISHED:
                return self._exception
            return super().exception(timeout)
    else:
        def set_result(self, result: Any) -> None:
            super().set_result(result)
            self.resolved = True
            self.request = None

        def result(self, timeout: float | None = None) -> Any:
            self._help()
            return super().result(timeout)

        def exception(self, timeout: float | None = None) -> BaseException | None:
            self._help()
            return super().exception(timeout)

    def set_exception(self, exception: BaseException | None) -> None:
        # ``Future``'s own resolution in both forms: failures are the rare path, so the
        # lean form makes its condition here (``_condition``) rather than keep a second
        # lock-free copy of ``set_result``'s
        super().set_exception(exception)  # waiters, callbacks; or InvalidStateError
        self.resolved = True
        self.request = None

    def add_done_callback(self, fn: Callable[[Future], Any]) -> None:
        deliver = self._driver.deliver
        super().add_done_callback(lambda f: deliver(fn, f))

    def _help(self) -> None:
        """Run the request's launches on this thread while no lane thread is
        (``Device.run_pending``), until it is resolved or nothing is left to run here
        (a busy lane is left to its holder or worker). Not on the thread inside the
        scheduler (``Driver.holds``, inline)."""
        req = self.request
        if req is not None and not self.resolved:
            _help_run(self, self._driver, req)


class Driver:
    """Serialises every entry into ``sched`` (see the module docstring)."""

    def __init__(self, sched: Any, callbacks: str = "thread",
                 on_stop: Callable[[], None] | None = None) -> None:
        """``callbacks="inline"``: the virtual-clock driver (callbacks and timers run in the
        device's event loop); ``"thread"``: wall clock (a callback thread, a timer
        thread)."""
        if callbacks not in ("thread", "inline"):
            raise ValueError(f"callbacks must be 'thread' or 'inline', got {callbacks!r}")
        self.sched = sched
        self.device = sched.device
        self._armed = math.inf  # device time the armed timer fires at (inf: none)
        self._tcv = threading.Condition(threading.Lock())
        self._t_thread: threading.Thread | None = None
        self.inline_callbacks = callbacks == "inline"
        self.on_stop = on_stop
        self.stopped = threading.Event()
        self._pending: deque[tuple] = deque()
        # taken twice a request (a post and a completion) with acquire(False): a FastLock,
        # C calls where this module is compiled (_cy/fastlock.pyx)
        self._lock = FastLock()
        self._holder = 0
        self._cbq: SimpleQueue | None = None
        self._cb_thread: threading.Thread | None = None
        self._cb_lock = threading.Lock()
        self._cb_closed = False
        self.callback_errors = 0

    # -- entering the scheduler ---------------------------------------------------------
    def post(self, event: tuple) -> None:
        """Handle ``event`` now on this thread, or leave it to the thread inside."""
        self._drain(event, None)

    def complete(self, comp: Any) -> None:
        """One launch (or a coalesced record of several) left the device:
        ``post(("complete", comp))``, the devices' completion entry (the engine starts
        them with ``Device.start(driver.complete)``). The event tuple is made only where
        the record is queued (``_drain``): handled at once, it goes to the scheduler's
        ``complete`` as it is (one a kernel completion in the simulator)."""
        self._drain(None, comp)

    def _drain(self, first: tuple | None, comp: Any) -> None:
        """Handle ``first`` (an event not yet queued, or None) or ``comp`` (a completion
        record not yet queued, or None: the event ``("complete", comp)``, the tuple not
        made unless queued) and every queued event on this thread, or leave them to the
        thread inside. Either skips the queue only when the queue is empty and this thread
        got in (every ``post`` and ``complete`` when nothing waits: no append and pop);
        otherwise it is queued like any event (so events are handled in the order they
        were posted)."""
        pending = self._pending
        lock = self._lock
        sched = self.sched
        if (first is not None or comp is not None) and (pending or not lock.acquire(False)):
            pending.append(first if comp is None else ("complete", comp))
            first = comp = None
        while True:
            if first is None and comp is None:  # (with either, this thread is already in)
                if not pending:
                    break
                if not lock.acquire(False):
                    return  # the thread inside handles it before it leaves (re-check below)
            self._holder = thread_ident()
            try:
                # do what is due: every queued event (the scheduler's non-blocking
                # handlers), then arm a timer for the next timed decision (inf: none)
                if comp is not None:
                    c, comp = comp, None
                    sched.complete(c)
                elif first is not None:
                    ev, first = first, None
                    sched.post(ev)
                while pending:
                    sched.post(pending.popleft())
                due = sched.next_timer()
                if due < self._armed and not sched.stopped:
                    self._arm(due)
            finally:
                self._holder = 0
                lock.release()
            if sched.stopped and not self.stopped.is_set():
                self.stopped.set()
                with self._tcv:
                    self._tcv.notify()
                if self.on_stop is not None:
                    try:
                        self.on_stop()
                    except Exception:
                        log.exception("driver: on_stop failed")

    # -- the timer --------------------------------------------------------------------------
    def _arm(self, due: float) -> None:
        """Fire ``("timer",)`` just after device time ``due`` (called inside the
        scheduler): decisions due "after t" (a deadline passed) are due then."""
        due = math.nextafter(due, math.inf)
        self._armed = due
        if self.inline_callbacks:
            self.device.call_at(due, lambda: self._fire(due))
            return
        with self._tcv:
            if self._t_thread is None:
                self._t_thread = threading.Thread(target=self._timer_loop,
                                                  name="av_infer-timer", daemon=True)
                self._t_thread.start()
            self._tcv.notify()

    def _fire(self, due: float | None = None) -> None:
        """The armed timer is due. A virtual device cannot cancel an event: one armed
        earlier and since replaced (``due`` is not the armed time) is ignored, or each stale
        event would arm another and timers would multiply."""
        if due is not None and due != self._armed:
            return
        self._armed = math.inf
        self.post(("timer",))

    def _timer_loop(self) -> None:
        now = self.device.now
        while not self.stopped.is_set():
            with self._tcv:
                due = self._armed
                wait = due - now()
                if wait > 0:
                    self._tcv.wait(None if math.isinf(wait) else min(wait, 3600.0))
                    continue
            if not math.isinf(due):
                self._fire()

    def holds(self) -> bool:
        """True on the thread that is inside the scheduler now."""
        return self._holder == thread_ident()

    def call(self, fn: Callable[[], Any], wait: bool = True) -> Any:
        """Run ``fn`` inside the scheduler (between events) and return its result.

        From the thread already inside (a listener, a scheduler hook) ``fn`` runs after the
        event being handled and ``None`` is returned; its exception, if any, is logged."""
        fut: Future = Future()
        self.post(("control", fn, fut))
        if fut.done():
            return fut.result()
        if not wait:
            return None
        if self.holds():  # applied after this event; a failure is logged and counted
            fut.add_done_callback(self._control_failed)
            return None
        return fut.result()

    def _control_failed(self, fut: Future) -> None:
        exc = fut.exception()
        if exc is None:
            return
        log.error("control call made inside the scheduler failed", exc_info=exc)
        stats = self.sched.stats
        with stats.lock:
            stats.handler_errors["control"] = stats.handler_errors.get("control", 0) + 1

    # -- callbacks ------------------------------------------------------------------------
    def deliver(self, fn: Callable[[Future], Any], fut: Future) -> None:
        """Run a future's done-callback where callbacks run (see the module docstring)."""
        if self.inline_callbacks:
            _run_callback(self, fn, fut)
            return
        with self._cb_lock:
            if self._cb_closed:  # after close: nobody else would run it
                q = None
            else:
                if self._cbq is None:
                    self._cbq = SimpleQueue()
                    self._cb_thread = threading.Thread(
                        target=self._callback_loop, args=(self._cbq,),
                        name="av_infer-callbacks", daemon=True)
                    self._cb_thread.start()
                q = self._cbq
                q.put((fn, fut))
        if q is None:
            _run_callback(self, fn, fut)

    def _callback_loop(self, q: SimpleQueue) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            _run_callback(self, *item)

    def close_callbacks(self, timeout: float | None = 10.0) -> None:
        """Run the callbacks already queued, then stop the callback thread."""
        with self._cb_lock:
            self._cb_closed = True
            q, th = self._cbq, self._cb_thread
            if q is None or th is None:
                return
            q.put(None)
        if th is not threading.current_thread():
            th.join(timeout)


class _Resolved:
    """``until`` of a helping wait (``Device.run_pending(stream, until)``): ``until()``
    is true once ``fut`` is resolved (its ``resolved``), read between launches.

    One is made per wait (per request a caller waits on). Compiled (``driver.pxd``), a
    ``cdef class`` with one C field, from a free list: made, called and freed as C,
    where ``functools.partial(getattr, fut, "resolved")`` cost about 1,000 instructions
    a request (the partial, its call through ``getattr`` and its deallocation). The
    same answer at every call as that partial: the future's attribute, read each time."""

    __slots__ = ("fut",)

    def __init__(self, fut: Future) -> None:
        self.fut = fut

    def __call__(self) -> bool:
        return self.fut.resolved


def _help_run(fut: RequestFuture, driver: Driver, req: Any) -> None:
    """``RequestFuture._help``'s loop (compiled: a C function with ``driver`` and ``req``
    typed, so the driver's fields and the request's stream are C reads, driver.pxd; on
    the cpu device ``run_pending`` is the lane engine's, a C call: ``Scheduler._port``)."""
    if driver._holder == thread_ident():
        return
    until = _Resolved(fut)  # ``until()``: a C call, no Python frame
    port = driver.sched._port
    if port is not None:
        while not fut.resolved:
            s = req.stream
            if s < 0 or not port.run_pending(s, until):
                return
        return
    run = driver.device.run_pending
    while not fut.resolved:
        s = req.stream
        if s < 0 or not run(s, until):
            return


def _run_callback(driver: Driver, fn: Callable[[Future], Any], fut: Future) -> None:
    try:
        fn(fut)
    except Exception:
        driver.callback_errors += 1
        log.exception("future callback %r failed", fn)
