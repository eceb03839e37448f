"""The public Runtime: load models, submit requests, get futures; everything else is inside.

Why a thin shell around the scheduler: the ROS nodes, the CLI and the benches all talk to
this one API (docs/design.md: ROS code never reaches past it). The Runtime validates everything
a caller can get wrong *before* anything is queued (a bad request becomes an already-failed
future, never an exception and never a queue entry), copies inputs so callers can reuse
their buffers, and owns the *driver* of the synchronous :class:`Scheduler`
(``sched.driver``): the thread that submits a request or completes a launch handles that
event itself, one thread inside the scheduler at a time and never blocking on another.
Futures' done-callbacks run on the runtime's callback thread (wall-clock devices) or
inline in the simulator's single-threaded event loop (virtual devices, deterministic).
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from av_infer.cache import ModelCache
from av_infer.devices import make_device
from av_infer.devices.base import Completion, Device
from av_infer.errors import (
    AvInferError,
    InvalidInputError,
    InvalidParameterError,
    ModelNameInUseError,
    RuntimeClosedError,
    UnknownModelError,
)
from av_infer.model.plan import Plan
from av_infer.model.plan_store import PlanStore, open_plan_store
from av_infer.profiles import ModelProfile
from av_infer.qos import GroupStats, UtilityTracker, VariantGroup, check_deadlines
from av_infer.qos.deciders import check_mode
from av_infer.qos.policy import PolicyNet, load_policy
from av_infer.sched.driver import Driver, RequestFuture
from av_infer.sched.model_services import ModelServices, batch_name, compile_batch_plans
from av_infer.sched.policies import device_refuses, get_policy
from av_infer.sched.request import Priority, Request, Result, Timings
from av_infer.sched.scheduler import ModelEntry, Scheduler, check_capacity

__all__ = ["InputBuffers", "ModelInfo", "Runtime"]

Spec = dict[str, tuple[tuple[int, ...], str]]

#: a request's ``arrival`` (``submit``/``infer``) must lie on ``now()``'s clock: at most this
#: long before ``now()`` and no later than ``ARRIVAL_AHEAD_S`` after it. Latency, EDF order
#: and the RT forecast are all measured from it; an arrival from another clock or a bad
#: value (the reliability fuzz sends -1e308) would otherwise give absurd latencies that
#: overflow the latency statistics every client of the model shares.
ARRIVAL_MAX_AGE_S = 3600.0
#: the clock reads of a caller that waits for its scheduled time (``time.sleep``) may land
#: a hair before it
ARRIVAL_AHEAD_S = 1e-3


@dataclass(frozen=True)
class ModelInfo:
    """What ``load_model`` made resident."""

    name: str
    plan: Plan
    input_spec: Spec
    output_spec: Spec
    weight_bytes: int
    activation_bytes: int
    kernels: int
    resident_bytes: int = 0
    pinned: bool = False
    #: how ``load_model`` got the plan (on the info it returns): "hit" (the on-disk plan
    #: cache, no compile), "miss" (compiled and stored), "bypass" (compiled, not storable),
    #: None (no plan cache, or a ready Plan)
    plan_cache: str | None = None


@dataclass(frozen=True)
class _ClientConfig:
    priority: Priority = Priority.BE
    relative_deadline: float | None = None  # the soft deadline, relative to arrival
    drop_late: bool = False
    hard_deadline: float | None = None  # relative to arrival; None: none
    variant_group: str | None = None  # its requests are served by this group


#: what an unconfigured client's requests get (read-only; shared)
_DEFAULT_CLIENT = _ClientConfig()


class Runtime:
    """A real-time inference runtime on one device. Thread-safe; see the module docstring.

    ``device``: ``"cpu"``, ``"sim"``, ``"cuda"`` or a :class:`Device`; ``device_options``
    go to its constructor. ``policy``: see :mod:`av_infer.sched.policies`. ``c``: device
    queue capacity (REEF's DQ bound). ``max_be_streams``: BE tasks that run concurrently.
    ``edf_preempt``: a more urgent RT request takes over the RT stream at a kernel boundary.
    ``max_queue_depth``: queued (not yet started) requests per priority class beyond which
    arrivals fail at once with RejectedError (None: unbounded), so overload cannot grow
    the queues without bound. ``be_min_share`` (0 <= share < 1; 0: strict RT priority):
    BE's share of the device while RT is over capacity: BE work that waited
    ``sched.scheduler.BE_SHARE_WINDOW`` (50 ms) without progress because of RT runs for
    ``share / (1 - share)`` of that window while new RT work waits. ``preempt_drain``
    (reef): start RT only after the <= c launched BE kernels finished or evicted
    themselves, REEF-N's literal order (§4.4). Off by default: RT goes at once to the
    highest-priority stream, where the block scheduler gives it SMs as BE blocks end, so
    RT never waits for a whole running BE kernel (in-order BE streams would make it).

    QoS (paper 001, ``av_infer.qos``): ``batch_mode`` picks how batch sizes are chosen
    when ``batching`` is on: ``"rafiqi"`` (adaptive threshold), ``"eq2"`` (paper 001 eq. 2),
    ``"fixed"`` (everything queued, at most 32) or ``"qos_rl"`` (the learned policy in
    ``qos_policy``, a file written by ``av-infer qos train``; default: the committed one).
    ``define_variant_group`` names alternative models of one task with accuracy factors
    κ; requests naming the group get the variant (and batch) of highest expected quality.

    ``plan_cache``: compiled plans on disk (``model.plan_store``, docs/plan_cache.md), so a
    restart loads models without compiling: None/False off (default), True the default
    directory (``$AV_INFER_PLAN_CACHE`` or ``$XDG_CACHE_HOME/av_infer/plans``), a
    directory, or a ``PlanStore``.
    """

    def __init__(
        self,
        device: str | Device = "cpu",
        policy: str = "reef",
        c: int = 4,
        max_be_streams: int = 2,
        edf_preempt: bool = False,
        preempt_drain: bool = False,
        device_options: Mapping[str, Any] | None = None,
        cache_budget: int | None = None,
        cache_max_models: int | None = None,
        batching: bool = False,
        batch_quantum: float = 0.005,
        max_batch: int = 8,
        max_queue_depth: int | None = None,
        be_min_share: float = 0.1,
        batch_mode: str = "rafiqi",
        qos_policy: str | os.PathLike | None = None,
        plan_cache: PlanStore | str | os.PathLike | bool | None = None,
    ) -> None:
        pol = get_policy(policy)
        batch_mode = check_mode(batch_mode)
        net = load_policy(qos_policy) if batch_mode == "qos_rl" or qos_policy else None
        max_queue_depth = _check_depth(max_queue_depth)
        be_min_share = _check_share(be_min_share)
        #: compiled plans on disk (``model.plan_store``): a restart loads without compiling
        self._plans = open_plan_store(plan_cache)
        if isinstance(max_be_streams, bool) or not isinstance(max_be_streams, int) \
                or max_be_streams < 1:
            raise InvalidParameterError(
                f"max_be_streams must be an int >= 1, got {max_be_streams!r}")
        self._device = make_device(device, **dict(device_options or {}))
        try:  # everything the device decides is checked before anything else is built
            c = check_capacity(c, self._device)
            why = device_refuses(pol, self._device)
            if why:
                raise InvalidParameterError(why)
            self._sched = Scheduler(self._device, pol.name, c, max_be_streams, edf_preempt,
                                    preempt_drain)
            self._sched.max_queue_depth = max_queue_depth
            self._sched.be_min_share = be_min_share
        except BaseException:
            self._device.close()
            raise
        # the one place the device's clock kind matters: who drives the scheduler and the
        # cache's loads (the caller's thread in virtual time, threads on a wall clock)
        virtual = self._device.virtual
        # -- model cache, adaptive batching, utility (av_infer.cache/batching/qos) --------
        # cache_budget None: the device's free memory if it reports one, else unlimited.
        self._cache = ModelCache(self._device, cache_budget, cache_max_models,
                                 mode="inline" if virtual else "thread")
        self._services = ModelServices(self._cache, self._wake, self._sched.resume_parked,
                                       batching, batch_quantum)
        self._services.set_mode(batch_mode, net)
        self._sched.ext = self._services
        self._utility = UtilityTracker()
        self._groups: dict[str, tuple[VariantGroup, ModelEntry, GroupStats]] = {}
        self._sources: dict[str, tuple[Any, Any]] = {}  # ONNX sources, for batch plans
        self._batch_max = _check_max_batch(max_batch)
        self._batch_info: dict[str, str] = {}  # model -> batch sizes or why unavailable
        self._lock = threading.RLock()
        self._models: dict[str, ModelEntry] = {}
        self._clients: dict[str, _ClientConfig] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self._submit_errors: dict[str, int] = {}
        self._driver = Driver(self._sched, "inline" if virtual else "thread",
                              on_stop=self._device.close)
        self._device.start(self._on_complete)

    # -- the driver -------------------------------------------------------------------------
    def _on_complete(self, comp: Completion) -> None:
        self._driver.post(("complete", comp))

    def _post(self, event: tuple) -> None:
        self._driver.post(event)

    def _control(self, fn: Callable[[], Any], wait: bool = True) -> Any:
        """Run ``fn`` on the scheduler (between events) and return its result."""
        return self._driver.call(fn, wait)

    # -- models -----------------------------------------------------------------------------
    def load_model(
        self,
        name: str,
        source: str | os.PathLike | bytes | Any,
        input_shapes: Mapping[str, Any] | Any = None,
        pin: bool = False,
        profile: str | os.PathLike | ModelProfile | None = None,
        whole: bool | None = None,
        precision: str | None = None,
    ) -> ModelInfo:
        """Compile ``source`` (ONNX path/bytes/ModelProto, or a ready Plan) with the
        device's compiler (``Device.compile``) and make it resident on the device under
        ``name``.

        ``whole``: run the model as one launch where the device's engine can (cpu: one ORT
        session, no cuts); default: ``pin`` (pinned models are the RT ones, never
        preempted). BE models are cut into launches short enough to preempt.

        ``profile``: a kernel profile (``profiles.ModelProfile`` or a file written by
        ``av-infer models profile``) of this plan on this device. Padding selection (DKP)
        needs one; the simulator also times the plan with it. Without it the device's own
        (the simulator's derived or registered one) is used, where it has one.

        With a plan cache (``plan_cache=`` of the constructor, ``model.plan_store``), a plan
        compiled before from the same bytes, input shapes, compiler and device is read from
        disk instead of compiled (``ModelInfo.plan_cache`` says which happened).

        ``precision``: ``fp32`` | ``tf32`` | ``fp16`` (``Plan.precision``; default: the
        plan's own, fp32); a device runs those in its ``precisions`` (cpu: fp32 only)."""
        self._check_open()
        prof = _load_profile(name, profile)
        if not isinstance(name, str) or not name:
            raise InvalidParameterError(f"model name must be a non-empty string, got {name!r}")
        runs = tuple(self._device.precisions)
        if precision is not None and precision not in runs:
            raise InvalidParameterError(
                f"model {name!r}: precision {precision!r}; device {self._device.name} runs "
                f"{', '.join(runs)}")
        with self._lock:
            if name in self._models:
                raise ModelNameInUseError(f"model {name!r} is already loaded; unload it first")
        whole = bool(pin) if whole is None else bool(whole)
        how = None
        if isinstance(source, Plan):
            plan = source
        else:
            if isinstance(source, Path):
                source = str(source)
            if self._plans is not None:
                plan, how = self._plans.compile(self._device, source, input_shapes, name,
                                                whole)
            else:
                plan = self._device.compile(source, input_shapes, name=name, whole=whole)
        if precision is not None and precision != plan.precision:
            plan = replace(plan, precision=precision)  # a copy: cached plans stay as they are
        if self._sched.c + 1 > plan.reuse_guard:
            raise InvalidParameterError(
                f"model {name!r}: plan reuse_guard={plan.reuse_guard} cannot restore with "
                f"c={self._sched.c} (needs c + 1 <= reuse_guard): lower c or recompile"
            )
        if prof is not None:
            if len(prof.kernels) != len(plan.kernels):
                raise InvalidParameterError(
                    f"model {name!r}: profile has {len(prof.kernels)} kernels, plan has "
                    f"{len(plan.kernels)}")
            self._device.set_profile(plan.name, prof)
        handle = self._cache_load(name, plan, bool(pin))
        entry = ModelEntry(name, plan, handle, pinned=bool(pin))
        if prof is None and handle is not None:
            prof = self._device.profile_of(handle)
        entry.profile = prof
        with self._lock:
            if name in self._models:
                self._cache.unregister(name)
                raise ModelNameInUseError(f"model {name!r} is already loaded")
            self._models[name] = entry
            if not isinstance(source, Plan):
                self._sources[name] = (source, input_shapes, whole)
        if self._services.batching:
            self._add_batch_plans(name)
        return replace(self._info(entry), plan_cache=how)

    # -- cache and batching (av_infer.cache, av_infer.batching) ----------------------------
    def _wake(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the scheduler soon (a cache load finished)."""
        if not self._driver.stopped.is_set():
            self._control(fn, wait=False)

    def _cache_load(self, name: str, plan: Plan, pin: bool) -> Any:
        """Register with the cache and make resident (pinned: never evicted); the handle."""
        self._cache.register(name, plan, pin=pin)
        try:
            if pin:
                return self._cache.handle(name)
            return self._cache.ensure_resident(name, count=False).result()
        except BaseException:
            self._cache.unregister(name)
            raise

    def _add_batch_plans(self, name: str) -> None:
        """Compile (off the RT path) and register the plans of ``name`` for batch sizes."""
        with self._lock:
            entry, src = self._models.get(name), self._sources.get(name)
        if entry is None:
            return
        have = set(self._services.batch_entries.get(name, {}))
        sizes = [b for b in _pow2(self._batch_max) if b > 1 and b not in have]
        if not sizes:
            return
        plans, why = compile_batch_plans(self._device, name, src[0] if src else None,
                                         src[1] if src else None, entry.plan, sizes,
                                         whole=src[2] if src else False)
        if not plans:
            self._batch_info[name] = f"unavailable: {why}"
            return
        ents = {}
        for b, p in plans.items():
            self._cache.register(batch_name(name, b), p, preload=True)  # evictable
            ents[b] = ModelEntry(batch_name(name, b), p, None)
        self._batch_info[name] = "batch sizes " + ", ".join(
            str(b) for b in sorted({1, *have, *plans}))
        self._control(lambda: self._services.add_batch_entries(name, ents))
        self._prime_latency([name])

    def set_cache_budget(self, budget: int | None) -> None:
        """Device-memory budget of the model cache in bytes (None: unlimited). Shrinking
        evicts least-recently-used BE models not in use; below pinned bytes: refused."""
        self._check_open()
        self._cache.set_budget(budget)

    def set_cache_max_models(self, cap: int | None) -> None:
        self._check_open()
        self._cache.set_max_models(cap)

    def set_batching(self, enabled: bool, max_batch: int | None = None,
                     quantum: float | None = None, mode: str | None = None,
                     policy: str | os.PathLike | PolicyNet | None = None,
                     params: Mapping[str, float] | None = None) -> None:
        """Adaptive batching of BE requests on/off (Rafiqi §3.3). Enabling compiles batch
        plans (sizes 2, 4, ... up to ``max_batch``) for models whose ONNX batch dim is
        dynamic; it runs the compiler in the caller's thread.

        ``mode``: ``rafiqi`` | ``eq2`` | ``fixed`` | ``qos_rl`` (see the class docstring);
        ``policy``: qos_rl's policy (a file or a PolicyNet; default: the one loaded, else
        the committed one); ``params``: eq. 2's ``alpha``, ``beta``, ``b_thrd``, the
        arrival-rate window ``rate_window`` (s) and fixed's ``fixed_max``. Everything is
        validated (the policy against every model and group) before anything changes."""
        self._check_open()
        if max_batch is not None:
            max_batch = _check_max_batch(max_batch)
        if quantum is not None and not (isinstance(quantum, (int, float)) and quantum > 0):
            raise InvalidParameterError(f"batch quantum must be seconds > 0, got {quantum!r}")
        if mode is not None or policy is not None or params:
            m = check_mode(mode if mode is not None else self._services.mode)
            net = policy if isinstance(policy, PolicyNet) else (
                load_policy(policy) if policy is not None or (
                    m == "qos_rl" and self._services.policy is None) else None)
            prm = dict(params or {})
            self._control(lambda: self._services.set_mode(m, net, prm))
        if max_batch is not None:
            self._batch_max = max_batch
        if enabled:
            for name in self.models():
                self._add_batch_plans(name)
        mb = self._batch_max
        self._control(lambda: self._services.set_batching(bool(enabled), quantum, mb))

    def _info(self, e: ModelEntry) -> ModelInfo:
        try:
            resident = int(self._cache.stats()["models"][e.name]["bytes"] or 0)
        except Exception:  # noqa: BLE001 - diagnostics only
            resident = 0
        return ModelInfo(e.name, e.plan, e.plan.input_spec(), e.plan.output_spec(),
                         e.plan.weight_bytes, e.plan.activation_bytes, len(e.plan.kernels),
                         resident, e.pinned)

    def unload_model(self, name: str) -> None:
        """Forget ``name``: new submits fail; accepted requests still complete, then its
        device memory is freed."""
        with self._lock:
            used = [g for g, (grp, _, _) in self._groups.items() if name in grp.models]
            if used:
                raise InvalidParameterError(
                    f"model {name!r} is a variant of group(s) {used}; remove them first")
            entry = self._models.pop(name, None)
        if entry is None:
            raise UnknownModelError(f"unknown model {name!r}; loaded: {self.models()}")
        if self._closed:
            return
        self._control(lambda: self._sched.unload(entry))

    def models(self) -> list[str]:
        with self._lock:
            return list(self._models)

    def model_info(self, name: str) -> ModelInfo:
        return self._info(self._entry(name))

    def _find(self, name: str) -> ModelEntry | None:
        """The entry a request names: a loaded model, or a variant group's (caller holds
        ``_lock``)."""
        e = self._models.get(name)
        if e is None and name in self._groups:
            e = self._groups[name][1]
        return e

    def _entry(self, name: str) -> ModelEntry:
        with self._lock:
            e = self._find(name)
        if e is None:
            raise UnknownModelError(f"unknown model {name!r}; loaded: {self.models()}")
        return e

    def input_spec(self, name: str) -> Spec:
        return dict(self._entry(name).input_spec)

    def output_spec(self, name: str) -> Spec:
        return self._entry(name).plan.output_spec()

    def input_buffers(self, name: str) -> InputBuffers:
        """Fresh, uninitialised input arrays of model ``name`` for the caller to fill in
        place (e.g. the ROS node copies a message payload, or writes a preprocessed image,
        straight into them); ``submit`` then takes them over without the copy it makes of
        ordinary inputs. See :class:`InputBuffers`."""
        return InputBuffers(name, {n: np.empty(shape, dtype) for n, (shape, dtype)
                                   in self.input_spec(name).items()})

    # -- clients ----------------------------------------------------------------------------
    def configure_client(
        self,
        client: str,
        priority: Priority | str = Priority.BE,
        relative_deadline: float | None = None,
        drop_late: bool = False,
        soft_deadline: float | None = None,
        hard_deadline: float | None = None,
        variant_group: str | None = None,
    ) -> None:
        """Defaults for ``client``'s requests: priority, deadline relative to arrival
        (seconds), and whether requests that can only start after their deadline are
        dropped (DeadlineMissedError) rather than run late. ``soft_deadline``/
        ``hard_deadline`` (relative seconds) turn on the client's mean deadline utility in
        ``stats()["utility"]`` (1 until soft, linear to 0 at hard; av_infer.qos); the soft
        one is the deadline (EDF for RT) unless ``relative_deadline`` is given, and a BE
        request still unanswered at its hard deadline is dropped wherever it is
        (DeadlineMissedError). ``variant_group``: the client's requests (naming the group
        or one of its models) are served by the group's best variant. Everything is
        validated first; a refusal changes nothing."""
        if variant_group is not None:
            with self._lock:
                known = variant_group in self._groups
            if not known:
                raise UnknownModelError(
                    f"unknown variant group {variant_group!r}; defined: {self.variant_groups()}")
        if soft_deadline is not None or hard_deadline is not None:
            try:
                sd = float(hard_deadline if soft_deadline is None else soft_deadline)
                hd = float(soft_deadline if hard_deadline is None else hard_deadline)
            except (TypeError, ValueError):
                raise InvalidParameterError(
                    f"soft/hard deadlines must be seconds, got {soft_deadline!r}, "
                    f"{hard_deadline!r}") from None
            check_deadlines(sd, hd)
        if not isinstance(client, str) or not client:
            raise InvalidParameterError(f"client must be a non-empty string, got {client!r}")
        try:
            prio = Priority.parse(priority)
        except (ValueError, TypeError) as e:
            raise InvalidParameterError(str(e)) from None
        if relative_deadline is not None:
            try:
                rd = float(relative_deadline)
            except (TypeError, ValueError):
                raise InvalidParameterError(
                    f"relative_deadline must be seconds > 0, got {relative_deadline!r}") from None
            if not rd > 0 or math.isnan(rd):
                raise InvalidParameterError(
                    f"relative_deadline must be seconds > 0 (or None), got {relative_deadline!r}")
            relative_deadline = rd
        soft = hard = None
        if soft_deadline is not None or hard_deadline is not None:
            soft, hard = sd, hd
            if not hd > 0:
                raise InvalidParameterError(f"hard deadline must be > 0 s, got {hd}")
        with self._lock:
            self._clients[client] = _ClientConfig(
                prio, relative_deadline if relative_deadline is not None else (soft or None),
                bool(drop_late), hard, variant_group)
        self._utility.configure(client, soft_deadline, hard_deadline)

    # -- variant groups (paper 001 §2.3, av_infer.qos) ---------------------------------------
    def define_variant_group(self, name: str, variants: Mapping[str, float]) -> None:
        """Alternative models of one task: ``variants`` maps loaded model -> accuracy factor
        κ in (0, 1] (e.g. ``{"full": 1.0, "fast": 0.5}``). Requests naming ``name`` (or
        from a client configured with it) run on the variant, and batch size, of highest
        expected quality κ·V (``stats()["variant_groups"]``). The variants must take and
        return the same tensors. Validated first (InvalidParameterError /
        UnknownModelError); a refusal changes nothing."""
        self._check_open()
        group = VariantGroup.build(name, variants)
        with self._lock:
            if name in self._models or name in self._groups:
                raise InvalidParameterError(f"{name!r} is already a model or variant group")
            missing = [m for m in group.models if m not in self._models]
            bases = [self._models.get(m) for m in group.models]
        if missing:
            raise UnknownModelError(f"variant group {name!r}: models {missing} are not "
                                    f"loaded; loaded: {self.models()}")
        first = bases[0]
        for e in bases[1:]:
            for what, a, b in (("inputs", first.plan.input_spec(), e.plan.input_spec()),
                               ("outputs", first.plan.output_spec(), e.plan.output_spec())):
                if a != b:
                    raise InvalidParameterError(
                        f"variant group {name!r}: {e.name!r} {what} {_fmt_spec(b)} differ from "
                        f"{first.name!r}'s {_fmt_spec(a)}")
        entry = ModelEntry(name, first.plan, first.handle, variants=group)
        self._control(lambda: self._services.add_group(group, bases))
        with self._lock:
            self._groups[name] = (group, entry, GroupStats(group))
        self._prime_latency(group.models)

    def remove_variant_group(self, name: str) -> None:
        """Forget a group; requests already accepted still complete."""
        with self._lock:
            if self._groups.pop(name, None) is None:
                raise UnknownModelError(f"unknown variant group {name!r}")
            for c in self._clients.values():
                if c.variant_group == name:
                    c.variant_group = None
        self._control(lambda: self._services.remove_group(name))

    def variant_groups(self) -> dict[str, dict[str, float]]:
        """Group name -> {model: κ}, most accurate first."""
        with self._lock:
            return {n: {v.model: v.kappa for v in g.variants}
                    for n, (g, _, _) in self._groups.items()}

    def _prime_latency(self, models: Any) -> None:
        """Seed the decisions' latency table with the device's profile of each plan (base
        and batch plans that are resident); observed run times take over later."""
        ents = self._services.batch_entries  # read on the driver: it alone writes them
        names = self._control(lambda: [n for m in models for n in (
            m, *(e.name for e in ents.get(m, {}).values()))]) or []
        est = {}
        for n in names:
            h = self._cache.handle(n)
            if h is None:
                continue
            try:
                est[n] = self._device.profile_of(h).total_us * 1e-6
            except Exception:  # noqa: BLE001 - no profile on this device: observe instead
                continue
        if est:
            self._control(lambda: [self._services.latency.prime(n, v) for n, v in est.items()])

    def _record_quality(self, group: str, fut: Future) -> None:
        with self._lock:
            g = self._groups.get(group)
        if g is None:
            return
        try:
            r = fut.result()
        except AvInferError as e:
            g[2].record(None, 0.0, e.code)
        except BaseException:  # noqa: BLE001 - a failed request is worth 0
            g[2].record(None, 0.0, "error")
        else:
            g[2].record(r.model, r.quality)

    # -- requests ---------------------------------------------------------------------------
    def submit(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        priority: Priority | str | None = None,
        deadline: float | None = None,
        client: str = "default",
        arrival: float | None = None,
        drop_late: bool | None = None,
        hard_deadline: float | None = None,
        variant_group: str | None = None,
    ) -> Future[Result]:
        """Queue one inference; returns its future. Never raises for a bad request: the
        future is already failed with the typed error (nothing was queued).

        ``priority`` defaults to the client's configured one (BE if unconfigured);
        ``deadline`` (the soft deadline) is absolute on ``now()``'s clock, default arrival +
        the client's relative deadline (inf if none); ``hard_deadline`` likewise (default:
        the client's; must not be before ``deadline``); ``arrival`` defaults to ``now()``
        (given, it must lie on that clock, at most ``ARRIVAL_MAX_AGE_S`` before it);
        ``drop_late`` (this request only) defaults to the client's configured one;
        ``variant_group`` (default: the client's) serves ``model`` (the group or one of its
        variants) by the group. Per-request values never change the client's configuration.
        """
        return self._submit(model, inputs, priority, deadline, client, arrival, False,
                            drop_late, hard_deadline, variant_group)

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        priority: Priority | str | None = None,
        deadline: float | None = None,
        client: str = "default",
        arrival: float | None = None,
        timeout: float | None = None,
        drop_late: bool | None = None,
        hard_deadline: float | None = None,
        variant_group: str | None = None,
    ) -> Result:
        """Submit and wait: the result, or the typed error raised. The same request as
        ``submit`` (same queues, priorities and preemption), but the calling thread, which
        waits anyway, runs the request's launches itself when its lane is idle, so a
        request costs no thread hand-off (the synchronous call for a thread per client).

        Without a ``timeout`` the input arrays are *borrowed*, not copied: the request reads
        them in place until ``infer`` returns (ONNX Runtime's ``InferenceSession.run``
        contract: do not change them from another thread meanwhile). With a ``timeout`` the
        request may outlive the call, so they are copied as ``submit`` copies them."""
        fut = self._submit(model, inputs, priority, deadline, client, arrival, True,
                           drop_late, hard_deadline, variant_group, borrow=timeout is None)
        return fut.result(timeout)

    def _submit(self, model: str, inputs: Any, priority: Any, deadline: Any, client: Any,
                arrival: Any, caller_runs: bool, drop_late: Any = None,
                hard_deadline: Any = None, variant_group: Any = None,
                borrow: bool = False) -> Future[Result]:
        fut: RequestFuture = RequestFuture(self._driver)
        try:
            req, entry = self._make_request(model, inputs, priority, deadline, client,
                                            arrival, drop_late, hard_deadline,
                                            variant_group, borrow)
        except AvInferError as e:
            self._count_submit_error(e)
            fut.set_exception(e)
            return fut
        req.future = fut
        if self._utility.deadlines(req.client) is not None:
            fut.add_done_callback(lambda f, c=req.client: self._record_utility(c, f))
        if entry.variants is not None:
            fut.add_done_callback(lambda f, g=req.model: self._record_quality(g, f))
        fut.helper = lambda f, r=req: self._help(r, f)
        # caller_runs: an enqueue made on this thread while it handles its own arrival skips
        # the worker's wake-up, since this thread runs the launches right after (a start on
        # any other thread, or later, wakes a worker: nothing is left unrun)
        req.caller_runs = threading.get_ident() if caller_runs else 0
        self._post(("arrival", req, entry))
        req.caller_runs = 0
        return fut

    def _help(self, req: Request, fut: Future) -> None:
        """A caller blocks on ``fut``: run its request's launches on this thread while no
        lane thread is (``Device.run_pending``), instead of waking one."""
        run = self._device.run_pending

        def done() -> bool:
            return fut.resolved

        while not fut.resolved:
            s = req.stream
            if s < 0 or not run(s, done):
                return

    def _record_utility(self, client: str, fut: Future) -> None:
        try:
            lat: float | None = fut.result().timings.latency
        except BaseException:  # noqa: BLE001 - a failed request is worth 0
            lat = None
        self._utility.record(client, lat)

    def _count_submit_error(self, e: AvInferError) -> None:
        with self._lock:
            self._submit_errors[e.code] = self._submit_errors.get(e.code, 0) + 1

    def _make_request(self, model: str, inputs: Any, priority: Any, deadline: Any,
                      client: Any, arrival: Any, drop_late: Any = None,
                      hard_deadline: Any = None, variant_group: Any = None,
                      borrow: bool = False) -> tuple[Request, ModelEntry]:
        """The validated request (its future not yet attached) and the entry it runs on;
        raises the typed error of the first thing wrong. One look at the registry, under
        one acquisition of the runtime's lock (this runs on every submit)."""
        if self._closed:
            raise RuntimeClosedError("runtime is closed")
        if not isinstance(client, str) or not client:
            raise InvalidParameterError(f"client must be a non-empty string, got {client!r}")
        with self._lock:
            cfg = self._clients.get(client) or _DEFAULT_CLIENT
            gname = cfg.variant_group if variant_group is None else variant_group
            if gname is None:
                grp = None
                entry = self._models.get(model)
                if entry is None and model in self._groups:
                    entry = self._groups[model][1]
            else:
                grp = self._groups.get(gname)
                entry = None if grp is None else grp[1]
        if gname is not None:
            if grp is None:
                raise UnknownModelError(f"unknown variant group {gname!r}; defined: "
                                        f"{self.variant_groups()}")
            if model != gname and model not in grp[0].models:
                raise InvalidParameterError(
                    f"model {model!r} is not in variant group {gname!r} {grp[0].models}")
            model = gname
        if entry is None:
            raise UnknownModelError(f"unknown model {model!r}; loaded: {self.models()}")
        if priority is None:
            prio = cfg.priority
        else:
            try:
                prio = Priority.parse(priority)
            except (ValueError, TypeError) as e:
                raise InvalidParameterError(str(e)) from None
        copied = _validate_inputs(model, entry.input_spec, inputs, borrow)
        received = self._device.now()
        if arrival is None:
            arrival = received
        else:
            arrival = _number("arrival", arrival)
            if not received - ARRIVAL_MAX_AGE_S <= arrival <= received + ARRIVAL_AHEAD_S:
                raise InvalidParameterError(
                    f"arrival must be on now()'s clock, within {ARRIVAL_MAX_AGE_S:g} s before "
                    f"now() ({received:.6f}) and not after it (+{ARRIVAL_AHEAD_S * 1e3:g} ms); "
                    f"got {arrival!r}")
        if deadline is None:
            deadline = arrival + cfg.relative_deadline if cfg.relative_deadline else math.inf
        else:
            deadline = _number("deadline", deadline, allow_inf=True)
        if hard_deadline is None:
            hard = arrival + cfg.hard_deadline if cfg.hard_deadline else math.inf
            hard = max(hard, deadline)  # a per-request soft deadline may pass the client's hard
        else:
            hard = _number("hard_deadline", hard_deadline, allow_inf=True)
            if deadline == math.inf:  # a hard deadline alone: a step utility (soft = hard)
                deadline = hard
            if hard < deadline:
                raise InvalidParameterError(
                    f"hard_deadline {hard} is before the (soft) deadline {deadline}")
        if drop_late is None:
            drop_late = cfg.drop_late
        elif not isinstance(drop_late, (bool, np.bool_)):
            raise InvalidParameterError(f"drop_late must be a bool, got {drop_late!r}")
        return Request(next(self._ids), model, copied, prio, client, deadline, bool(drop_late),
                       Timings(arrival, received=received), None,
                       hard_deadline=hard), entry

    # -- settings ---------------------------------------------------------------------------
    def now(self) -> float:
        """The device clock (seconds): what deadlines and timings are measured on."""
        return self._device.now()

    @property
    def device(self) -> Device:
        return self._device

    @property
    def policy(self) -> str:
        return self._sched.policy.name

    def set_policy(self, name: str) -> None:
        """Switch policy; it applies to the next decisions (running work is not undone,
        except that ``rt_only`` rejects queued BE and fails running BE)."""
        self._check_open()
        pol = get_policy(name)
        why = device_refuses(pol, self._device)
        if why:
            raise InvalidParameterError(why)
        self._control(lambda: self._sched.set_policy(pol.name))

    def policy_unavailable(self, name: str) -> str | None:
        """Why ``name`` cannot be used on this runtime's device (None if it can)."""
        try:
            return device_refuses(get_policy(name), self._device)
        except InvalidParameterError as e:
            return str(e)

    @property
    def c(self) -> int:
        return self._sched.c

    @property
    def c_range(self) -> tuple[int, int]:
        """The values ``set_c`` accepts now: 1 up to the device's ``max_capacity`` and below
        every loaded plan's reuse guard (restore needs ``c + 1 <= reuse_guard``)."""
        with self._lock:
            guards = [e.plan.reuse_guard for e in self._models.values()]
        hi = int(self._device.max_capacity)
        return 1, min([hi, *(g - 1 for g in guards)])

    def set_c(self, c: int) -> None:
        """Device queue capacity, in ``c_range``. Validated first: a refused value raises
        InvalidParameterError and changes nothing."""
        self._check_open()
        with self._lock:
            guards = [e.plan.reuse_guard for e in self._models.values()]
        c = _check_c(c, guards, self._device)
        self._control(lambda: self._sched.set_c(c))

    @property
    def max_queue_depth(self) -> int | None:
        return self._sched.max_queue_depth

    def set_max_queue_depth(self, depth: int | None) -> None:
        """Queued requests per priority class beyond which arrivals are rejected (None: no
        bound); requests already queued stay. Validated first."""
        self._check_open()
        depth = _check_depth(depth)
        self._control(lambda: self._sched.set_max_queue_depth(depth))

    @property
    def be_min_share(self) -> float:
        return self._sched.be_min_share

    def set_be_min_share(self, share: float) -> None:
        """BE's minimum share under RT overload (see the class docstring). Validated
        first."""
        self._check_open()
        share = _check_share(share)
        self._control(lambda: self._sched.set_be_min_share(share))

    @property
    def edf_preempt(self) -> bool:
        return self._sched.edf_preempt

    def set_edf_preempt(self, flag: bool) -> None:
        self._check_open()
        self._control(lambda: self._sched.set_edf_preempt(flag))

    @property
    def preempt_drain(self) -> bool:
        return self._sched.preempt_drain

    def set_preempt_drain(self, flag: bool) -> None:
        self._check_open()
        self._control(lambda: self._sched.set_preempt_drain(flag))

    def add_listener(self, fn: Callable[[str, dict], None]) -> None:
        """Call ``fn(event, payload)`` on arrival/dispatch/preempt/restore/kernel/complete/
        fail, from the scheduler (keep it short; no cost when none is registered)."""
        def add() -> None:
            self._sched.listeners = [*self._sched.listeners, fn]
        self._control(add)

    def remove_listener(self, fn: Callable[[str, dict], None]) -> None:
        def rm() -> None:
            self._sched.listeners = [f for f in self._sched.listeners if f is not fn]
        self._control(rm)

    # -- diagnostics ------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """A JSON-able snapshot: per client/model counters and latency percentiles,
        preemptions, queue depths, mode, policy, c and device telemetry."""
        sched = self._sched
        snap = sched.stats.snapshot()
        depths: Any = None
        if not self._driver.stopped.is_set() and not self._driver.holds():
            fut: Future = Future()
            self._post(("control", sched.queue_depths, fut))
            try:
                depths = fut.result(timeout=2.0)
            except Exception:  # noqa: BLE001 - fall back to an unsynchronised read
                depths = None
        if depths is None:
            try:
                depths = sched.queue_depths()
            except RuntimeError:
                depths = {}
        snap["queues"] = depths
        snap["mode"] = "real-time" if (sched.rt_queue or sched.rt_active) else "normal"
        snap["policy"] = sched.policy.name
        snap["c"] = sched.c
        snap["edf_preempt"] = sched.edf_preempt
        snap["preempt_drain"] = sched.preempt_drain
        snap["max_queue_depth"] = sched.max_queue_depth
        snap["be_min_share"] = sched.be_min_share
        dev = self._device
        supported = bool(dev.supports_padding)
        snap["padding"] = {
            "supported": supported,
            "reason": None if supported else dev.padding_reason,
            "active": bool(sched.policy.padding and supported),
            "launches": snap.pop("padded_launches", 0),
            "blocks": snap.pop("padded_blocks", 0),
            "kernels": snap.pop("padded_kernels", 0),
        }
        snap["closed"] = self._closed
        if self._plans is not None:
            snap["plan_cache"] = self._plans.stats()
        with self._lock:
            snap["submit_errors"] = dict(self._submit_errors)
            snap["loaded_models"] = list(self._models)
        snap["cache"] = _jsonable(self._cache.stats())
        for _ in range(3):  # the scheduler thread may be updating the batchers
            try:
                snap["batching"] = _jsonable({**self._services.batching_stats(),
                                              "availability": dict(self._batch_info)})
                break
            except RuntimeError:
                continue
        utility = self._utility.summary()
        if utility:
            snap["utility"] = _jsonable(utility)
        with self._lock:
            groups = {n: g[2] for n, g in self._groups.items()}
        if groups:
            snap["variant_groups"] = _jsonable({n: g.summary() for n, g in groups.items()})
        try:
            snap["device"] = _jsonable(self._device.telemetry())
        except Exception as e:  # noqa: BLE001
            snap["device"] = {"device": self._device.name, "error": str(e)}
        return snap

    # -- lifecycle --------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeClosedError("runtime is closed")

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop. ``drain``: finish everything queued or running first (up to ``timeout``
        seconds, then fail the rest); otherwise fail queued and running requests with
        RuntimeClosedError at once. Idempotent; every future is answered on return."""
        with self._lock:
            already = self._closed
            self._closed = True
        sched, driver = self._sched, self._driver
        if already:
            if not driver.holds():
                driver.stopped.wait(timeout)
            return
        if self._device.virtual:  # the caller's thread is the driver: run the events now
            if drain:
                self._device.run()
            self._post(("control", lambda: sched.shutdown(False), None))
        else:
            self._post(("control", lambda: sched.shutdown(drain), None))
            if driver.holds():
                return  # called inside the scheduler: it stops once idle (on_stop closes)
            if not driver.stopped.wait(timeout):
                self._post(("control", lambda: sched.shutdown(False), None))
                driver.stopped.wait()
        self._device.close()
        self._cache.close(unload=False)
        driver.close_callbacks()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- helpers ----------------------------------------------------------------------------------
def _check_depth(d: Any) -> int | None:
    if d is None:
        return None
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or int(d) < 1:
        raise InvalidParameterError(f"max_queue_depth must be an int >= 1 or None, got {d!r}")
    return int(d)


def _check_share(x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)) \
            or not 0.0 <= float(x) < 1.0:
        raise InvalidParameterError(f"be_min_share must be a number in [0, 1), got {x!r}")
    return float(x)


def _check_max_batch(b: Any) -> int:
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 1 <= int(b) <= 256:
        raise InvalidParameterError(f"max_batch must be an int in 1..256, got {b!r}")
    return int(b)


def _pow2(n: int) -> list[int]:
    """1, 2, 4, ... up to n: the batch sizes plans are compiled for."""
    out, b = [], 1
    while b <= n:
        out.append(b)
        b *= 2
    return out


def _check_c(c: Any, guards: list[int], device: Device) -> int:
    c = check_capacity(c, device)
    if guards and c + 1 > min(guards):
        raise InvalidParameterError(
            f"c={c} too large: restore needs c + 1 <= reuse_guard, and a loaded plan has "
            f"reuse_guard={min(guards)}")
    return c


def _load_profile(name: str, profile: Any) -> ModelProfile | None:
    """A ModelProfile, a path to one, or None; InvalidParameterError if unreadable."""
    if profile is None or isinstance(profile, ModelProfile):
        return profile
    if isinstance(profile, (str, os.PathLike)):
        try:
            return ModelProfile.load(profile)
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise InvalidParameterError(
                f"model {name!r}: cannot read profile {str(profile)!r}: {e}") from None
    raise InvalidParameterError(
        f"model {name!r}: profile must be a ModelProfile or a path, got {type(profile).__name__}")


def _number(what: str, v: Any, allow_inf: bool = False) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{what} must be a number (seconds), got {v!r}") from None
    if math.isnan(x) or (math.isinf(x) and not (allow_inf and x > 0)):
        raise InvalidParameterError(f"{what} must be a finite number of seconds, got {v!r}")
    return x


def _validate_inputs(model: str, spec: Spec, inputs: Any,
                     borrow: bool = False) -> dict[str, np.ndarray]:
    """Exact names, shapes and dtypes (no silent casts); returns private copies, or with
    ``borrow`` (``Runtime.infer``: the caller waits) the C-contiguous arrays themselves."""
    if not isinstance(inputs, Mapping):
        raise InvalidInputError(
            f"model {model!r}: inputs must be a dict of name -> numpy array, "
            f"got {type(inputs).__name__}")
    missing = [n for n in spec if n not in inputs]
    extra = [n for n in inputs if n not in spec] if len(inputs) != len(spec) or missing else []
    if missing or extra:
        want = _fmt_spec(spec)
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if extra:
            parts.append(f"unexpected {extra}")
        raise InvalidInputError(f"model {model!r}: {', '.join(parts)}; expects {want}")
    out: dict[str, np.ndarray] = {}
    for name, (shape, dtype) in spec.items():
        v = inputs[name]
        if not isinstance(v, np.ndarray):
            raise InvalidInputError(
                f"model {model!r} input {name!r}: expected a numpy array {dtype}{list(shape)}, "
                f"got {type(v).__name__}")
        if v.shape != tuple(shape) or v.dtype != dtype:
            raise InvalidInputError(
                f"model {model!r} input {name!r}: expected {dtype}{list(shape)}, "
                f"got {v.dtype}{list(v.shape)}")
        if isinstance(inputs, InputBuffers):
            out[name] = inputs.take(name, v)
        elif borrow and v.flags.c_contiguous:
            out[name] = v
        else:
            out[name] = v.copy(order="C")
    return out


class InputBuffers(dict):
    """Input arrays a caller filled in place, handed to ``Runtime.submit`` without a copy.

    ``Runtime.input_buffers(model)`` makes them; the caller writes into the arrays (never
    replaces them: a replaced or foreign array is copied as usual) and submits the mapping
    once. On submit the runtime owns the arrays: they become read-only, so a late write by
    the caller fails loudly instead of changing a queued request. Submitting the same
    mapping again copies (the arrays are the first request's).
    """

    def __init__(self, model: str, arrays: dict[str, np.ndarray]):
        super().__init__(arrays)
        self.model = model
        self._own = dict(arrays)
        self._taken = False

    def take(self, name: str, value: np.ndarray) -> np.ndarray:
        """``value`` itself if it is this mapping's untaken own array, else a copy."""
        if self._taken or self._own.get(name) is not value or not value.flags.c_contiguous:
            return value.copy(order="C")
        value.flags.writeable = False
        if all(not a.flags.writeable for a in self.values()):
            self._taken = True
        return value


def _fmt_spec(spec: Spec) -> str:
    return ", ".join(f"{n}: {dt}{list(sh)}" for n, (sh, dt) in spec.items())


def _jsonable(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if o is None or isinstance(o, (bool, int, float, str)):
        return o
    return str(o)
