"""The engine behind one Runtime: device, scheduler, model cache, model services and the
driver, built together, and the one place each engine setting is validated and applied.

Why a separate assembly: ``Runtime`` is the API (what a caller may ask), the registry
holds what is loaded (``registry.ModelRegistry``), and this module holds how requests
get run: which device, which scheduler with which ``c``, policy, queue bound and BE share,
which cache and batching. Each setting has one validator here (``check_*``), used both
when the engine is built and when the setting changes later; a setter validates first,
then applies the value on the scheduler (between events, through the driver), so a refused
value raises ``InvalidParameterError`` and changes nothing. The scheduler holds the live
value and the device reads it from there (``Scheduler._apply_capacity``); ``Runtime``
reads it back through the properties below. Nothing below the runtime imports this
module (``av_infer/sched`` and ``av_infer/devices`` stay below it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np

from av_infer.cache import ModelCache
from av_infer.devices import make_device
from av_infer.devices.base import Device
from av_infer.errors import InvalidParameterError
from av_infer.model.plan import Plan
from av_infer.model.plan_store import PlanStore, open_plan_store
from av_infer.qos.deciders import check_mode
from av_infer.qos.policy import PolicyNet, load_policy
from av_infer.sched.driver import Driver
from av_infer.sched.model_services import ModelServices, batch_name, compile_batch_plans
from av_infer.sched.policies import Policy, device_refuses, get_policy
from av_infer.sched.scheduler import ModelEntry, Scheduler

__all__ = ["Engine", "check_be_streams", "check_c", "check_depth", "check_max_batch",
           "check_policy", "check_quantum", "check_share"]


# -- one validator per setting ------------------------------------------------------------------
def check_policy(name: str, device: Device) -> Policy:
    """The policy ``name`` if ``device`` can run it, else InvalidParameterError."""
    pol = get_policy(name)
    why = device_refuses(pol, device)
    if why:
        raise InvalidParameterError(why)
    return pol


def check_c(c: Any, device: Device, guards: Iterable[int] = ()) -> int:
    """``c`` as a device queue capacity: an int in ``1..device.max_capacity`` (the one range
    every layer reads, ``Runtime.c_range``) and below every loaded plan's reuse guard
    (restore needs ``c + 1 <= reuse_guard``); else InvalidParameterError."""
    hi = int(device.max_capacity)
    if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 1 <= int(c) <= hi:
        raise InvalidParameterError(
            f"c must be an int in 1..{hi} (device {device.name!r}), got {c!r}")
    c = int(c)
    guards = list(guards)
    if guards and c + 1 > min(guards):
        raise InvalidParameterError(
            f"c={c} too large: restore needs c + 1 <= reuse_guard, and a loaded plan has "
            f"reuse_guard={min(guards)}")
    return c


def check_depth(d: Any) -> int | None:
    """``max_queue_depth``: an int >= 1, or None (unbounded)."""
    if d is None:
        return None
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or int(d) < 1:
        raise InvalidParameterError(f"max_queue_depth must be an int >= 1 or None, got {d!r}")
    return int(d)


def check_share(x: Any) -> float:
    """``be_min_share``: a number in [0, 1)."""
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)) \
            or not 0.0 <= float(x) < 1.0:
        raise InvalidParameterError(f"be_min_share must be a number in [0, 1), got {x!r}")
    return float(x)


def check_max_batch(b: Any) -> int:
    """``max_batch``: an int in 1..256."""
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 1 <= int(b) <= 256:
        raise InvalidParameterError(f"max_batch must be an int in 1..256, got {b!r}")
    return int(b)


def check_quantum(q: Any) -> float:
    """``batch_quantum``: seconds > 0."""
    if not (isinstance(q, (int, float)) and q > 0):
        raise InvalidParameterError(f"batch quantum must be seconds > 0, got {q!r}")
    return q


def check_be_streams(n: Any) -> int:
    """``max_be_streams``: an int >= 1."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidParameterError(f"max_be_streams must be an int >= 1, got {n!r}")
    return n


def pow2(n: int) -> list[int]:
    """1, 2, 4, ... up to n: the batch sizes plans are compiled for."""
    out, b = [], 1
    while b <= n:
        out.append(b)
        b *= 2
    return out


class Engine:
    """Device + scheduler + cache + services + driver of one runtime (see the module
    docstring). Everything is validated before the device is made; if building fails
    after that, the device is closed again."""

    def __init__(
        self,
        device: str | Device,
        policy: str,
        c: int,
        max_be_streams: int,
        edf_preempt: bool,
        preempt_drain: bool,
        device_options: Mapping[str, Any] | None,
        cache_budget: int | None,
        cache_max_models: int | None,
        batching: bool,
        batch_quantum: float,
        max_batch: int,
        max_queue_depth: int | None,
        be_min_share: float,
        batch_mode: str,
        qos_policy: str | os.PathLike | None,
        plan_cache: PlanStore | str | os.PathLike | bool | None,
    ) -> None:
        """The settings as ``Runtime`` takes them (its signature holds the defaults and
        documents each one; this one has none, so they live in one place)."""
        get_policy(policy)  # the name first; what the device can run once it exists
        batch_mode = check_mode(batch_mode)
        net = load_policy(qos_policy) if batch_mode == "qos_rl" or qos_policy else None
        max_queue_depth = check_depth(max_queue_depth)
        be_min_share = check_share(be_min_share)
        #: compiled plans on disk (``model.plan_store``): a restart loads without compiling
        self.plans = open_plan_store(plan_cache)
        max_be_streams = check_be_streams(max_be_streams)
        #: batch plans are compiled for 2, 4, ... up to this
        self.batch_max = check_max_batch(max_batch)
        self.device: Device = make_device(device, **dict(device_options or {}))
        try:  # everything the device decides is checked before anything else is built
            c = check_c(c, self.device)
            pol = check_policy(policy, self.device)
            self.sched = Scheduler(self.device, pol, c, max_be_streams, edf_preempt,
                                   preempt_drain)
            self.sched.max_queue_depth = max_queue_depth
            self.sched.be_min_share = be_min_share
        except BaseException:
            self.device.close()
            raise
        # the one place the device's clock kind matters: who drives the scheduler and the
        # cache's loads (the caller's thread in virtual time, threads on a wall clock)
        virtual = self.device.virtual
        # cache_budget None: the device's free memory if it reports one, else unlimited.
        self.cache = ModelCache(self.device, cache_budget, cache_max_models,
                                mode="inline" if virtual else "thread")
        self.services = ModelServices(self.cache, self.wake, self.sched.resume_parked,
                                      batching, batch_quantum)
        self.services.set_mode(batch_mode, net)
        self.sched.ext = self.services
        self.batch_info: dict[str, str] = {}  # model -> batch sizes or why unavailable
        self.driver = Driver(self.sched, "inline" if virtual else "thread",
                             on_stop=self.device.close)
        # completions go to the driver's entry directly (a compiled call where built)
        if self.device.coalesces:  # the scheduler applies Completion.count exactly
            self.device.start(self.driver.complete, coalesce=True)
        else:
            self.device.start(self.driver.complete)

    # -- the driver -------------------------------------------------------------------------
    def control(self, fn: Callable[[], Any], wait: bool = True) -> Any:
        """Run ``fn`` on the scheduler (between events) and return its result."""
        return self.driver.call(fn, wait)

    def wake(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the scheduler soon (a cache load finished)."""
        if not self.driver.stopped.is_set():
            self.control(fn, wait=False)

    # -- settings: validated here, held by the scheduler, read back from it ----------------------
    def set_policy(self, name: str) -> None:
        pol = check_policy(name, self.device)
        self.control(lambda: self.sched.set_policy(pol))

    def policy_unavailable(self, name: str) -> str | None:
        """Why ``name`` cannot be used on this device (None if it can)."""
        try:
            check_policy(name, self.device)
        except InvalidParameterError as e:
            return str(e)
        return None

    def c_range(self, guards: Iterable[int]) -> tuple[int, int]:
        hi = int(self.device.max_capacity)
        return 1, min([hi, *(g - 1 for g in guards)])

    def set_c(self, c: Any, guards: Iterable[int]) -> None:
        c = check_c(c, self.device, guards)
        self.control(lambda: self.sched.set_c(c))

    def check_plan(self, name: str, plan: Plan) -> None:
        """A plan to load must restore under the current ``c`` (``c + 1 <= reuse_guard``),
        the same rule ``check_c`` applies to a new ``c`` against the loaded plans."""
        c = self.sched.c
        if c + 1 > plan.reuse_guard:
            raise InvalidParameterError(
                f"model {name!r}: plan reuse_guard={plan.reuse_guard} cannot restore with "
                f"c={c} (needs c + 1 <= reuse_guard): lower c or recompile")

    def set_max_queue_depth(self, depth: Any) -> None:
        depth = check_depth(depth)
        self.control(lambda: self.sched.set_max_queue_depth(depth))

    def set_be_min_share(self, share: Any) -> None:
        share = check_share(share)
        self.control(lambda: self.sched.set_be_min_share(share))

    def set_edf_preempt(self, flag: bool) -> None:
        self.control(lambda: self.sched.set_edf_preempt(flag))

    def set_preempt_drain(self, flag: bool) -> None:
        self.control(lambda: self.sched.set_preempt_drain(flag))

    def set_batching(self, enabled: bool, max_batch: int | None, quantum: float | None,
                     mode: str | None, policy: str | os.PathLike | PolicyNet | None,
                     params: Mapping[str, float] | None, models: Iterable[str],
                     lookup: Callable[[str], tuple[ModelEntry | None, Any]]) -> None:
        """Validate every batching setting, then apply (``Runtime.set_batching``); enabling
        compiles the batch plans of ``models`` (``lookup``: name -> (entry, source))."""
        if max_batch is not None:
            max_batch = check_max_batch(max_batch)
        if quantum is not None:
            quantum = check_quantum(quantum)
        if mode is not None or policy is not None or params:
            m = check_mode(mode if mode is not None else self.services.mode)
            net = policy if isinstance(policy, PolicyNet) else (
                load_policy(policy) if policy is not None or (
                    m == "qos_rl" and self.services.policy is None) else None)
            prm = dict(params or {})
            self.control(lambda: self.services.set_mode(m, net, prm))
        if max_batch is not None:
            self.batch_max = max_batch
        if enabled:
            for name in models:
                self.add_batch_plans(name, *lookup(name))
        mb = self.batch_max
        self.control(lambda: self.services.set_batching(bool(enabled), quantum, mb))

    def add_listener(self, fn: Callable[[str, dict], None]) -> None:
        def add() -> None:
            self.sched.listeners = [*self.sched.listeners, fn]
        self.control(add)

    def remove_listener(self, fn: Callable[[str, dict], None]) -> None:
        def rm() -> None:
            self.sched.listeners = [f for f in self.sched.listeners if f is not fn]
        self.control(rm)

    # -- models on the device: cache and batch plans ------------------------------------------
    def cache_load(self, name: str, plan: Plan, pin: bool) -> Any:
        """Register with the cache and make resident (pinned: never evicted); the handle."""
        self.cache.register(name, plan, pin=pin)
        try:
            if pin:
                return self.cache.handle(name)
            return self.cache.ensure_resident(name, count=False).result()
        except BaseException:
            self.cache.unregister(name)
            raise

    def add_batch_plans(self, name: str, entry: ModelEntry | None, src: Any) -> None:
        """Compile (off the RT path) and register the plans of ``name`` for batch sizes."""
        if entry is None:
            return
        have = set(self.services.batch_entries.get(name, {}))
        sizes = [b for b in pow2(self.batch_max) if b > 1 and b not in have]
        if not sizes:
            return
        plans, why = compile_batch_plans(self.device, name, src[0] if src else None,
                                         src[1] if src else None, entry.plan, sizes,
                                         whole=src[2] if src else False)
        if not plans:
            self.batch_info[name] = f"unavailable: {why}"
            return
        ents = {}
        for b, p in plans.items():
            self.cache.register(batch_name(name, b), p, preload=True)  # evictable
            ents[b] = ModelEntry(batch_name(name, b), p, None)
        self.batch_info[name] = "batch sizes " + ", ".join(
            str(b) for b in sorted({1, *have, *plans}))
        self.control(lambda: self.services.add_batch_entries(name, ents))
        self.prime_latency([name])

    def prime_latency(self, models: Any) -> None:
        """Seed the decisions' latency table with the device's profile of each plan (base
        and batch plans that are resident); observed run times take over later."""
        ents = self.services.batch_entries  # read on the driver: it alone writes them
        names = self.control(lambda: [n for m in models for n in (
            m, *(e.name for e in ents.get(m, {}).values()))]) or []
        est = {}
        for n in names:
            h = self.cache.handle(n)
            if h is None:
                continue
            try:
                est[n] = self.device.profile_of(h).total_us * 1e-6
            except Exception:  # noqa: BLE001 - no profile on this device: observe instead
                continue
        if est:
            self.control(lambda: [self.services.latency.prime(n, v) for n, v in est.items()])

    # -- diagnostics ------------------------------------------------------------------------
    def queue_depths(self) -> Any:
        """The scheduler's queue depths, read between events where possible."""
        sched, driver = self.sched, self.driver
        depths: Any = None
        if not driver.stopped.is_set() and not driver.holds():
            fut: Future = Future()
            driver.post(("control", sched.queue_depths, fut))
            try:
                depths = fut.result(timeout=2.0)
            except Exception:  # noqa: BLE001 - fall back to an unsynchronised read
                depths = None
        if depths is None:
            try:
                depths = sched.queue_depths()
            except RuntimeError:
                depths = {}
        return depths

    def settings(self, snap: dict[str, Any]) -> None:
        """Add the live settings and the padding state to a stats snapshot."""
        sched = self.sched
        snap["queues"] = self.queue_depths()
        snap["mode"] = "real-time" if (sched.rt_queue or sched.rt_active) else "normal"
        snap["policy"] = sched.policy.name
        snap["c"] = sched.c
        snap["edf_preempt"] = sched.edf_preempt
        snap["preempt_drain"] = sched.preempt_drain
        snap["max_queue_depth"] = sched.max_queue_depth
        snap["be_min_share"] = sched.be_min_share
        dev = self.device
        supported = bool(dev.supports_padding)
        snap["padding"] = {
            "supported": supported,
            "reason": None if supported else dev.padding_reason,
            "active": bool(sched.policy.padding and supported),
            "launches": snap.pop("padded_launches", 0),
            "blocks": snap.pop("padded_blocks", 0),
            "kernels": snap.pop("padded_kernels", 0),
        }

    def batching_stats(self) -> dict[str, Any] | None:
        for _ in range(3):  # the scheduler thread may be updating the batchers
            try:
                return {**self.services.batching_stats(), "availability": dict(self.batch_info)}
            except RuntimeError:
                continue
        return None

    # -- shutdown ---------------------------------------------------------------------------
    def close(self, drain: bool, timeout: float | None, already: bool) -> None:
        """The one shutdown path (``Runtime.close``): stop the scheduler (draining or
        failing what is queued and running), then the device, the cache and the callback
        thread. ``already``: a second close only waits for the first."""
        sched, driver = self.sched, self.driver
        if already:
            if not driver.holds():
                driver.stopped.wait(timeout)
            return
        if self.device.virtual:  # the caller's thread is the driver: run the events now
            if drain:
                self.device.run()
            driver.post(("control", lambda: sched.shutdown(False), None))
        else:
            driver.post(("control", lambda: sched.shutdown(drain), None))
            if driver.holds():
                return  # called inside the scheduler: it stops once idle (on_stop closes)
            if not driver.stopped.wait(timeout):
                driver.post(("control", lambda: sched.shutdown(False), None))
                driver.stopped.wait()
        self.device.close()
        self.cache.close(unload=False)
        driver.close_callbacks()
