# cython: annotation_typing=False, language_level=3
"""ModelCache: device memory as an LRU cache of compiled models (Rafiqi §3.4).

Why: more models than fit on the device must still be served, and a model's first use must
not cost a re-compilation. The cache keeps every registered model's compiled :class:`Plan`
(its weights stay in host memory: "pinned host memory" on a GPU), so making a model
resident again is ``device.load_plan(plan)``: a copy, never a compile.

Rules:

* A **budget** in bytes of device memory and an optional **cap** on resident models.
  Sizes are *measured* (``device.resident_bytes(handle)`` after ``load_plan``); before a
  model's first load the plan's weight bytes serve as the estimate (Rafiqi samples memory
  before and after a load for the same reason). The cache's accounted bytes never exceed
  the budget: a load whose measured size turns out larger evicts more, or is undone.
* **Pinned** models (RT) are loaded at registration and never evicted. Best-effort models
  are evicted least-recently-used. A model **in use** (``retain``/``release`` refcount,
  held while a task runs) is never evicted either.
* Loads and evictions happen **off the RT path**: one background loader thread (the
  "low-priority copy stream" on a GPU) performs at most one load at a time, as in
  Rafiqi. Requests for a model that is loading or not resident get a
  :class:`concurrent.futures.Future` (``ensure_resident``) the scheduler can wait on
  without blocking its own thread; every such future resolves (handle or typed error).
* A model that cannot fit even with everything evictable gone (the budget minus pinned
  bytes, or the cap minus pinned models) is refused with :class:`ModelTooLargeError`. One
  that only lacks room because other models are in use waits for their release.

Modes: ``"thread"`` (default, the background loader), ``"inline"`` (loads run in the
caller's thread: the simulator, whose load_plan takes no virtual time), ``"manual"`` (loads
run only when :meth:`ModelCache.run_pending` is called: deterministic tests).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Literal

import numpy as np

from av_infer.devices.base import Device
from av_infer.errors import (
    InvalidParameterError,
    ModelTooLargeError,
    RuntimeClosedError,
    UnknownModelError,
)
from av_infer.model.plan import Plan

Mode = Literal["thread", "inline", "manual"]
_MODES = ("thread", "inline", "manual")


class _Entry:
    """One registered model: its plan (host copy) and where it is now.

    Written by hand (compared by identity, as the ``eq=False`` dataclass it was):
    compiled, a ``cdef class`` with C fields (cache.pxd) that ``retain``/``release`` read
    as struct members on every request."""

    def __init__(self, name: str, plan: Plan, pinned: bool = False, state: str = "host",
                 gone: bool = False, handle: Any = None, size: int | None = None,
                 refs: int = 0, loads: int = 0, waiters: list[Future] | None = None) -> None:
        self.name = name
        self.plan = plan
        self.pinned = pinned
        self.state = state  # host | loading | resident
        self.gone = gone  # unregistered (a load running then is undone)
        self.handle = handle
        self.size = size  # measured resident bytes (None before the first load)
        self.refs = refs
        self.loads = loads
        self.waiters = [] if waiters is None else waiters

    def __repr__(self) -> str:
        return (f"_Entry(name={self.name!r}, plan={self.plan!r}, pinned={self.pinned!r}, "
                f"state={self.state!r}, gone={self.gone!r}, handle={self.handle!r}, "
                f"size={self.size!r}, refs={self.refs!r}, loads={self.loads!r}, "
                f"waiters={self.waiters!r})")

    @property
    def expected(self) -> int:
        """Bytes the next load will take: measured if known, else the plan's weights."""
        return self.size if self.size is not None else int(self.plan.weight_bytes)


def _fmt(n: float | None) -> str:
    if n is None:
        return "unlimited"
    return f"{n / 2**20:.2f} MiB ({int(n)} B)"


class ModelCache:
    """LRU cache of models in device memory; see the module docstring."""

    def __init__(
        self,
        device: Device,
        budget: int | None = None,
        max_models: int | None = None,
        *,
        mode: Mode = "thread",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if mode not in _MODES:
            raise InvalidParameterError(f"cache mode must be one of {_MODES}, got {mode!r}")
        self._device = device
        if budget is None:
            try:
                free = device.telemetry().get("memory_free_bytes")
            except Exception:  # noqa: BLE001 - telemetry is best effort
                free = None
            budget = int(free) if free else None
        self._budget: int | None = self._check_budget(budget)
        self._max_models: int | None = self._check_cap(max_models)
        self._mode: Mode = mode
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._lru: OrderedDict[str, None] = OrderedDict()  # resident models, oldest first
        self._pending: OrderedDict[str, None] = OrderedDict()  # loads asked for, FIFO
        self._loading: _Entry | None = None
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._dirty = False
        self._draining = False
        self._closed = False
        # counters
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._loads = 0
        self._load_times: list[float] = []
        self._load_errors = 0
        self._thread: threading.Thread | None = None
        if mode == "thread":
            self._thread = threading.Thread(
                target=self._loader, name="av_infer-cache-loader", daemon=True
            )
            self._thread.start()

    # -- validation -------------------------------------------------------------------------
    @staticmethod
    def _check_budget(budget: int | None) -> int | None:
        if budget is None:
            return None
        if int(budget) < 0:
            raise InvalidParameterError(f"cache budget must be >= 0 bytes, got {budget}")
        return int(budget)

    @staticmethod
    def _check_cap(cap: int | None) -> int | None:
        if cap is None:
            return None
        if int(cap) < 1:
            raise InvalidParameterError(f"cache max_models must be >= 1, got {cap}")
        return int(cap)

    # -- registration -------------------------------------------------------------------------
    def register(self, name: str, plan: Plan, pin: bool = False, preload: bool = False) -> None:
        """Add a compiled model. ``pin`` loads it now and never evicts it (RT models);
        ``preload`` starts loading a best-effort model in the background.

        Raises ModelTooLargeError when a pinned model cannot fit next to the other pinned
        ones, InvalidParameterError when the name is taken.
        """
        with self._lock:
            self._check_open()
            if name in self._entries:
                raise InvalidParameterError(f"model {name!r} is already registered")
            e = _Entry(name, plan)
            self._entries[name] = e
        if pin:
            try:
                self.pin(name)
            except BaseException:
                with self._lock:
                    self._entries.pop(name, None)
                    self._pending.pop(name, None)
                raise
        elif preload:
            self.ensure_resident(name, count=False)

    def unregister(self, name: str) -> None:
        """Forget a model (unloading it). Refused while tasks hold it. Never waits: a load
        of it that is running is undone by the loader when it finishes (the scheduler's
        thread calls this and must not stall behind a cold compile)."""
        with self._lock:
            e = self._get(name)
            if e.refs:
                raise InvalidParameterError(
                    f"model {name!r} is in use by {e.refs} task(s); release them first"
                )
            e.gone = True  # a running load sees it and unloads what it made
            self._entries.pop(name, None)
            self._pending.pop(name, None)
            self._lru.pop(name, None)
            handle, e.handle, e.state = e.handle, None, "host"
            waiters, e.waiters = e.waiters, []
        if handle is not None:
            self._device.unload_plan(handle)
        for f in waiters:
            _fail(f, UnknownModelError(f"model {name!r} was unloaded"))

    def pin(self, name: str, timeout: float | None = None) -> Any:
        """Make ``name`` resident and never evict it; returns its handle."""
        with self._lock:
            e = self._get(name)
            if not e.pinned:
                self._check_pin_fits(e)
                e.pinned = True
        try:
            f = self.ensure_resident(name, count=False)
            if self._mode == "manual":
                self.run_pending()
            return f.result(timeout)
        except BaseException:
            with self._lock:
                e.pinned = False
                self._mark()
            self._after_change()
            raise

    def unpin(self, name: str) -> None:
        """Let ``name`` be evicted (LRU) again."""
        with self._lock:
            self._get(name).pinned = False
            self._mark()
        self._after_change()

    def _check_pin_fits(self, e: _Entry) -> None:
        others = [x for x in self._entries.values() if x.pinned and x is not e]
        pinned = sum(x.expected for x in others)
        if self._budget is not None and pinned + e.expected > self._budget:
            raise ModelTooLargeError(
                f"cannot pin model {e.name!r}: {_fmt(e.expected)} next to "
                f"{_fmt(pinned)} of pinned models exceeds the cache budget {_fmt(self._budget)}"
            )
        if self._max_models is not None and len(others) + 1 > self._max_models:
            raise ModelTooLargeError(
                f"cannot pin model {e.name!r}: {len(others)} pinned models already fill the "
                f"cap of {self._max_models} resident models"
            )

    # -- the request path ------------------------------------------------------------------
    def ensure_resident(self, name: str, count: bool = True) -> Future:
        """A future of the model's handle: done at once on a hit (touching the LRU order),
        else resolved by the loader. ``count`` False leaves hit/miss counters alone."""
        f: Future = Future()
        with self._lock:
            self._check_open()
            e = self._get(name)
            if e.state == "resident":
                self._lru.move_to_end(name)
                self._hits += count
                f.set_result(e.handle)
                return f
            self._misses += count
            e.waiters.append(f)
            if e.state == "host" and name not in self._pending:
                self._pending[name] = None
            self._mark()
        self._after_change()
        return f

    def retain(self, name: str, count: bool = False) -> Any | None:
        """Hold a resident model for a task: returns its handle (refcount +1, LRU touched),
        or None, retaining nothing, when it is not resident (ask ``ensure_resident``).
        ``count`` records the hit or miss (the scheduler's one look per task start)."""
        # the lock taken by its methods, not by ``with``: compiled, a ``with`` looks up and
        # binds ``__enter__`` and ``__exit__`` on every pass (half of this call's cost)
        lock = self._lock
        lock.acquire()
        try:
            # the table read directly (once per request); ``_get`` only to raise
            e = self._entries.get(name)
            if e is None:
                e = self._get(name)
            if e.state != "resident":
                self._misses += count
                return None
            self._hits += count
            e.refs += 1
            self._lru.move_to_end(name)
            return e.handle
        finally:
            lock.release()

    def release(self, name: str) -> None:
        """Drop one hold taken by ``retain``/``acquire``; the model becomes evictable at 0."""
        lock = self._lock  # taken as in ``retain`` (once per request)
        lock.acquire()
        try:
            e = self._entries.get(name)
            if e is None or e.refs <= 0:
                raise InvalidParameterError(f"release of model {name!r} that is not retained")
            e.refs -= 1
            # the loader has work only if a load waits for room or the cache is over its
            # limits (waking it on every request costs a thread hand-off per request), and
            # only if this model may now go: a pinned one is never evicted, so its release
            # frees no room (an RT model's releases never wake the loader, even while BE
            # loads wait)
            work = e.refs == 0 and not e.pinned and (bool(self._pending) or (
                (self._budget is not None or self._max_models is not None)
                and self._over_limits()))  # no limits (the default): nothing to trim
            if work:
                self._mark()
        finally:
            lock.release()
        if work:
            self._after_change()

    def acquire(self, name: str, timeout: float | None = None) -> Any:
        """Blocking: wait until ``name`` is resident and retain it; returns the handle.
        A hit returns at once. The caller must ``release(name)`` when done."""
        deadline = None if timeout is None else time.monotonic() + timeout
        count = True
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self.ensure_resident(name, count=count).result(left)
            count = False
            h = self.retain(name)
            if h is not None:
                return h

    def is_resident(self, name: str) -> bool:
        with self._lock:
            return self._get(name).state == "resident"

    def handle(self, name: str) -> Any | None:
        """The current handle of a resident model (None otherwise); does not touch LRU."""
        with self._lock:
            e = self._get(name)
            return e.handle if e.state == "resident" else None

    # -- settings -----------------------------------------------------------------------------
    def set_budget(self, budget: int | None) -> None:
        """New budget in bytes (None: unlimited). Shrinking evicts LRU best-effort models
        not in use (models in use go when released). Below pinned bytes: refused."""
        b = self._check_budget(budget)
        with self._lock:
            pinned = self._pinned_bytes()
            if b is not None and b < pinned:
                raise InvalidParameterError(
                    f"cache budget {_fmt(b)} is below the {_fmt(pinned)} of pinned models; "
                    "unpin or unload RT models first"
                )
            self._budget = b
            self._mark()
        self._after_change()

    def set_max_models(self, cap: int | None) -> None:
        """New cap on resident models (None: no cap). Refused below the pinned count."""
        c = self._check_cap(cap)
        with self._lock:
            n = sum(1 for e in self._entries.values() if e.pinned)
            if c is not None and c < n:
                raise InvalidParameterError(
                    f"cache max_models {c} is below the {n} pinned models"
                )
            self._max_models = c
            self._mark()
        self._after_change()

    @property
    def budget(self) -> int | None:
        return self._budget

    @property
    def max_models(self) -> int | None:
        return self._max_models

    # -- diagnostics --------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters for diagnostics (``rt.stats()["cache"]``)."""
        with self._lock:
            lt = np.asarray(self._load_times, dtype=float)
            req = self._hits + self._misses
            return {
                "hits": self._hits,
                "misses": self._misses,
                "hit_rate": (self._hits / req) if req else None,
                "loads": self._loads,
                "load_errors": self._load_errors,
                "evictions": self._evictions,
                "load_time_s": {
                    "p50": float(np.median(lt)) if lt.size else None,
                    "max": float(lt.max()) if lt.size else None,
                    "total": float(lt.sum()),
                },
                "resident_bytes": self._resident_bytes(),
                "resident_models": list(self._lru),
                "pinned_bytes": self._pinned_bytes(),
                "budget_bytes": self._budget,
                "max_models": self._max_models,
                "pending_loads": list(self._pending),
                "loading": self._loading.name if self._loading else None,
                "models": {
                    e.name: {"state": e.state, "bytes": e.size, "pinned": e.pinned,
                             "in_use": e.refs, "loads": e.loads}
                    for e in self._entries.values()
                },
            }

    def resident_bytes(self) -> int:
        with self._lock:
            return self._resident_bytes()

    # -- lifecycle ----------------------------------------------------------------------------
    def run_pending(self) -> int:
        """Run loads/evictions that are due now in the caller's thread (``manual`` mode;
        harmless otherwise); returns how many steps did something."""
        n = 0
        while self._step():
            n += 1
        return n

    def close(self, unload: bool = True) -> None:
        """Stop the loader, fail waiting futures with RuntimeClosedError, unload models."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            waiters = [f for e in self._entries.values() for f in e.waiters]
            handles = [e.handle for e in self._entries.values() if e.handle is not None]
            for e in self._entries.values():
                e.waiters, e.handle, e.state = [], None, "host"
            self._lru.clear()
            self._pending.clear()
        for f in waiters:
            _fail(f, RuntimeClosedError("the model cache was closed"))
        if unload:
            for h in handles:
                try:
                    self._device.unload_plan(h)
                except Exception:  # noqa: BLE001 - the device may be closed already
                    pass

    # -- internals (callers hold the lock where noted) ----------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeClosedError("the model cache is closed")

    def _get(self, name: str) -> _Entry:
        e = self._entries.get(name)
        if e is None:
            raise UnknownModelError(f"model {name!r} is not registered with the cache")
        return e

    def _resident_bytes(self) -> int:
        return sum(self._entries[n].size or 0 for n in self._lru)

    def _pinned_bytes(self) -> int:
        return sum(e.expected for e in self._entries.values() if e.pinned)

    def _mark(self) -> None:
        """Something changed that may let the loader do work (lock held)."""
        self._dirty = True
        if self._mode == "thread":
            self._cv.notify_all()

    def _after_change(self) -> None:
        """Inline mode: do the due work now, in the caller's thread (lock not held)."""
        if self._mode == "inline":
            with self._lock:
                if self._draining:
                    return
                self._draining = True
            try:
                while self._step():
                    pass
            finally:
                with self._lock:
                    self._draining = False

    def _loader(self) -> None:
        while True:
            with self._lock:
                while not self._dirty and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
            while self._step():
                pass

    def _evictable(self, exclude: _Entry | None = None) -> list[_Entry]:
        """Resident models that may go, least recently used first (lock held)."""
        out = []
        for n in self._lru:
            e = self._entries[n]
            if not e.pinned and e.refs == 0 and e is not exclude:
                out.append(e)
        return out

    def _victims_for(self, extra_bytes: int, extra_models: int,
                     exclude: _Entry | None = None) -> list[_Entry] | None:
        """LRU victims so that ``extra`` more fits; None if in-use models block it."""
        over_b = (0 if self._budget is None
                  else self._resident_bytes() + extra_bytes - self._budget)
        over_n = (0 if self._max_models is None
                  else len(self._lru) + extra_models - self._max_models)
        victims: list[_Entry] = []
        for e in self._evictable(exclude):
            if over_b <= 0 and over_n <= 0:
                break
            victims.append(e)
            over_b -= e.size or 0
            over_n -= 1
        if over_b > 0 or over_n > 0:
            return None
        return victims

    def _too_large(self, e: _Entry) -> ModelTooLargeError | None:
        """Why ``e`` can never fit (lock held), or None."""
        others = [x for x in self._entries.values() if x.pinned and x is not e]
        pinned = sum(x.expected for x in others)
        if self._budget is not None and e.expected + pinned > self._budget:
            return ModelTooLargeError(
                f"model {e.name!r} needs {_fmt(e.expected)} of device memory; the cache "
                f"budget is {_fmt(self._budget)} of which {_fmt(pinned)} is held by pinned "
                f"models ({', '.join(x.name for x in others) or 'none'}); raise the budget "
                "(set_cache_budget) or unpin models"
            )
        if self._max_models is not None and len(others) + 1 > self._max_models:
            return ModelTooLargeError(
                f"model {e.name!r} cannot be made resident: the {len(others)} pinned models "
                f"fill the cap of {self._max_models} resident models"
            )
        return None

    def _evict_locked(self, victims: list[_Entry]) -> list[Any]:
        handles = []
        for v in victims:
            self._lru.pop(v.name, None)
            handles.append(v.handle)
            v.handle, v.state = None, "host"
            self._evictions += 1
        return handles

    def _step(self) -> bool:
        """One unit of loader work: excess evictions, then at most one load."""
        failed: list[tuple[Future, BaseException]] = []
        with self._lock:
            if self._closed or self._loading is not None:
                return False
            self._dirty = False
            # 1. over budget/cap (after set_budget, set_max_models, a release)
            #    (if in-use models keep it over, all that may go goes; the rest on release)
            unload = self._evict_locked(self._trim_excess(self._evictable()))
            # 2. the first pending load that can be placed now
            job: _Entry | None = None
            for name in list(self._pending):
                e = self._entries[name]
                err = self._too_large(e)
                if err is not None:
                    del self._pending[name]
                    failed += [(f, err) for f in e.waiters]
                    e.waiters = []
                    continue
                victims = self._victims_for(e.expected, 1)
                if victims is None:
                    continue  # waits for in-use models to be released
                del self._pending[name]
                unload += self._evict_locked(victims)
                e.state = "loading"
                self._loading = job = e
                break
        for f, err in failed:
            _fail(f, err)
        for h in unload:
            self._device.unload_plan(h)
        if job is None:
            return bool(unload or failed)
        self._load(job)
        return True

    def _over_limits(self) -> bool:
        """Resident models exceed the budget or the model cap (lock held)."""
        return ((self._budget is not None and self._resident_bytes() > self._budget)
                or (self._max_models is not None and len(self._lru) > self._max_models))

    def _trim_excess(self, cands: list[_Entry]) -> list[_Entry]:
        """Of LRU-ordered candidates, the shortest prefix that ends the excess, or all."""
        over_b = (0 if self._budget is None else self._resident_bytes() - self._budget)
        over_n = (0 if self._max_models is None else len(self._lru) - self._max_models)
        out = []
        for e in cands:
            if over_b <= 0 and over_n <= 0:
                break
            out.append(e)
            over_b -= e.size or 0
            over_n -= 1
        return out

    def _load(self, e: _Entry) -> None:
        """Load ``e`` (lock not held), then commit it or undo it."""
        t0 = self._clock()
        try:
            handle = self._device.load_plan(e.plan)
            size = int(self._device.resident_bytes(handle))
        except BaseException as err:  # noqa: BLE001 - every waiter gets the error
            with self._lock:
                e.state, self._loading = "host", None
                self._load_errors += 1
                waiters, e.waiters = e.waiters, []
                self._cv.notify_all()
            for f in waiters:
                _fail(f, err)
            return
        dt = self._clock() - t0
        undo = False
        failed: list[Future] = []
        err: ModelTooLargeError | None = None
        with self._lock:
            self._loads += 1
            e.loads += 1
            self._load_times.append(dt)
            e.size = size
            more = self._victims_for(size, 1, exclude=e)
            if self._closed or e.gone:
                undo, unload = True, []
                if e.gone:
                    failed, e.waiters = e.waiters, []
                    err = None
            elif more is None:
                # measured larger than estimated and the room is not there: undo
                undo, unload = True, []
                err = self._too_large(e)
                if err is None:
                    self._pending[e.name] = None  # retry once in-use models are released
                else:
                    failed, e.waiters = e.waiters, []
            else:
                unload = self._evict_locked(more)
            if undo:
                e.state = "host"
            else:
                e.state, e.handle = "resident", handle
                self._lru[e.name] = None
                waiters, e.waiters = e.waiters, []
            self._loading = None
            self._dirty = True
            self._cv.notify_all()
        for h in unload:
            self._device.unload_plan(h)
        if undo:
            self._device.unload_plan(handle)
            for f in failed:
                _fail(f, err or (UnknownModelError(f"model {e.name!r} was unloaded") if e.gone
                                 else RuntimeClosedError("the model cache was closed")))
            return
        for f in waiters:
            if not f.done():
                f.set_result(handle)


def _fail(f: Future, err: BaseException) -> None:
    if not f.done():
        f.set_exception(err)
