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

Layout (issue 31, docs/request_path.md): this module is the API; ``engine.Engine``
builds and holds the device, scheduler, cache, services and driver and validates every
engine setting (one ``check_*`` per setting); ``registry.ModelRegistry`` holds models,
sources, variant groups and client configurations under one lock;
``request_options.RequestOptions`` carries one request's options; ``admission.Admission``
(compiled) validates, builds and posts each request; ``inputs`` validates input tensors.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from av_infer.admission import Admission
from av_infer.devices.base import Device
from av_infer.engine import Engine
from av_infer.errors import (
    AvInferError,
    InvalidParameterError,
    RuntimeClosedError,
    UnknownModelError,
)
from av_infer.inputs import InputBuffers, Spec, fmt_spec
from av_infer.model.plan import Plan
from av_infer.model.plan_store import PlanStore
from av_infer.profiles import ModelProfile
from av_infer.qos import UtilityTracker, VariantGroup, check_deadlines
from av_infer.qos.policy import PolicyNet
from av_infer.registry import ClientConfig, ModelRegistry
from av_infer.request_options import (
    ARRIVAL_AHEAD_S,
    ARRIVAL_MAX_AGE_S,
    RequestOptions,
    check_client,
    parse_priority,
)
from av_infer.sched.request import Priority, Result
from av_infer.sched.scheduler import ModelEntry

__all__ = ["ARRIVAL_AHEAD_S", "ARRIVAL_MAX_AGE_S", "InputBuffers", "ModelInfo",
           "RequestOptions", "Runtime"]

_options = RequestOptions


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
        eng = Engine(device, policy, c, max_be_streams, edf_preempt, preempt_drain,
                     device_options, cache_budget, cache_max_models, batching, batch_quantum,
                     max_batch, max_queue_depth, be_min_share, batch_mode, qos_policy,
                     plan_cache)
        #: the engine (device, scheduler, cache, services, driver; every engine setting)
        self._engine = eng
        #: the registry (models, sources, variant groups, clients; one lock)
        self._reg = ModelRegistry()
        # the engine's parts and the registry's tables, by the names the request path,
        # the benches and the tests use (each is one object for the runtime's life)
        self._device = eng.device
        self._sched = eng.sched
        self._cache = eng.cache
        self._services = eng.services
        self._driver = eng.driver
        self._plans = eng.plans
        self._lock = self._reg.lock
        self._models = self._reg.models
        self._utility = UtilityTracker()
        #: validates, builds and posts every request (compiled; owns the closed flag and
        #: the request ids)
        self._admit = Admission(self._reg, self._device, self._driver,
                                self._record_utility, self._record_quality)

    @property
    def _closed(self) -> bool:
        """New submits are refused (``close`` was called); the flag's owner is the
        admission, which refuses them."""
        return self._admit.closed

    # -- the driver -------------------------------------------------------------------------
    def _control(self, fn: Callable[[], Any], wait: bool = True) -> Any:
        """Run ``fn`` on the scheduler (between events) and return its result."""
        return self._engine.control(fn, wait)

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
        if precision is not None and (why := self.precision_unavailable(precision)):
            raise InvalidParameterError(f"model {name!r}: {why}")
        self._reg.check_free(name)
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
        self._engine.check_plan(name, plan)
        if prof is not None:
            if len(prof.kernels) != len(plan.kernels):
                raise InvalidParameterError(
                    f"model {name!r}: profile has {len(prof.kernels)} kernels, plan has "
                    f"{len(plan.kernels)}")
            self._device.set_profile(plan.name, prof)
        handle = self._engine.cache_load(name, plan, bool(pin))
        entry = ModelEntry(name, plan, handle, pinned=bool(pin))
        if prof is None and handle is not None:
            prof = self._device.profile_of(handle)
        entry.profile = prof
        try:
            self._reg.add(entry, None if isinstance(source, Plan)
                          else (source, input_shapes, whole))
        except BaseException:
            self._cache.unregister(name)
            raise
        if self._services.batching:
            self._engine.add_batch_plans(name, *self._reg.with_source(name))
        return replace(self._info(entry), plan_cache=how)

    # -- cache and batching (av_infer.cache, av_infer.batching) ----------------------------
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
        self._engine.set_batching(enabled, max_batch, quantum, mode, policy, params,
                                  self.models(), self._reg.with_source)

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
        entry = self._reg.remove(name)
        if entry is None:
            raise UnknownModelError(f"unknown model {name!r}; loaded: {self.models()}")
        if self._closed:
            return
        self._control(lambda: self._sched.unload(entry))

    def models(self) -> list[str]:
        return self._reg.names()

    def model_info(self, name: str) -> ModelInfo:
        return self._info(self._reg.entry(name))

    def input_spec(self, name: str) -> Spec:
        return dict(self._reg.entry(name).input_spec)

    def output_spec(self, name: str) -> Spec:
        return self._reg.entry(name).plan.output_spec()

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
            if self._reg.group(variant_group) is None:
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
        check_client(client)
        prio = parse_priority(priority)
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
        tracked = soft_deadline is not None or hard_deadline is not None
        self._reg.set_client(client, ClientConfig(
            prio, relative_deadline if relative_deadline is not None else (soft or None),
            bool(drop_late), hard, variant_group, tracked))
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
        bases = self._reg.group_bases(group)
        first = bases[0]
        for e in bases[1:]:
            for what, a, b in (("inputs", first.plan.input_spec(), e.plan.input_spec()),
                               ("outputs", first.plan.output_spec(), e.plan.output_spec())):
                if a != b:
                    raise InvalidParameterError(
                        f"variant group {name!r}: {e.name!r} {what} {fmt_spec(b)} differ from "
                        f"{first.name!r}'s {fmt_spec(a)}")
        entry = ModelEntry(name, first.plan, first.handle, variants=group)
        self._control(lambda: self._services.add_group(group, bases))
        self._reg.add_group(group, entry)
        self._engine.prime_latency(group.models)

    def remove_variant_group(self, name: str) -> None:
        """Forget a group; requests already accepted still complete. Clients configured
        with it are served by the model their requests name from then on."""
        self._reg.remove_group(name)
        self._control(lambda: self._services.remove_group(name))

    def variant_groups(self) -> dict[str, dict[str, float]]:
        """Group name -> {model: κ}, most accurate first."""
        return self._reg.variant_groups()

    def _record_quality(self, group: str, fut: Future) -> None:
        g = self._reg.group(group)
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
        run_here: bool = False,
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

        ``run_here``: this thread runs the request's launches now, while its lane is idle,
        as a thread blocked in ``infer`` does (the scheduler still decides what runs; a busy
        lane is never waited for: its holder or worker runs them), then returns the future,
        already resolved when the request ran here. For a caller that would wait anyway but
        wants a future (an executor callback answering through it): the launches it runs
        itself skip the worker's wake-up that a plain ``submit`` signals (20-90 µs a request
        on the 2-core VM, docs/request_path.md). The inputs are copied as by ``submit``.
        """
        fut = self._admit.submit(model, inputs, _options(priority, deadline, client, arrival,
                                                         drop_late, hard_deadline,
                                                         variant_group, False), run_here)
        if run_here:
            fut._help()  # what result() does first: runs its idle-lane launches here
        return fut

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
        fut = self._admit.submit(model, inputs, _options(priority, deadline, client, arrival,
                                                         drop_late, hard_deadline,
                                                         variant_group, timeout is None), True)
        return fut.result(timeout)

    def _record_utility(self, client: str, fut: Future) -> None:
        try:
            lat: float | None = fut.result().timings.latency
        except BaseException:  # noqa: BLE001 - a failed request is worth 0
            lat = None
        self._utility.record(client, lat)

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
        self._engine.set_policy(name)

    def policy_unavailable(self, name: str) -> str | None:
        """Why ``name`` cannot be used on this runtime's device (None if it can)."""
        return self._engine.policy_unavailable(name)

    @property
    def precisions(self) -> tuple[str, ...]:
        """The precisions ``load_model(precision=...)`` accepts here: the device's
        ``Device.precisions`` (cpu and sim: fp32 only; cuda and cuda-emu: fp32, tf32, fp16)."""
        return tuple(self._device.precisions)

    def precision_unavailable(self, precision: Any) -> str | None:
        """Why ``load_model`` would refuse ``precision`` on this device (None if it runs
        it), so a caller can check every model's before loading any."""
        runs = self.precisions
        if isinstance(precision, str) and precision in runs:
            return None
        return f"precision {precision!r}; device {self._device.name} runs {', '.join(runs)}"

    @property
    def c(self) -> int:
        return self._sched.c

    @property
    def c_range(self) -> tuple[int, int]:
        """The values ``set_c`` accepts now: 1 up to the device's ``max_capacity`` and below
        every loaded plan's reuse guard (restore needs ``c + 1 <= reuse_guard``)."""
        return self._engine.c_range(self._reg.reuse_guards())

    def set_c(self, c: int) -> None:
        """Device queue capacity, in ``c_range``. Validated first: a refused value raises
        InvalidParameterError and changes nothing."""
        self._check_open()
        self._engine.set_c(c, self._reg.reuse_guards())

    @property
    def max_queue_depth(self) -> int | None:
        return self._sched.max_queue_depth

    def set_max_queue_depth(self, depth: int | None) -> None:
        """Queued requests per priority class beyond which arrivals are rejected (None: no
        bound); requests already queued stay. Validated first."""
        self._check_open()
        self._engine.set_max_queue_depth(depth)

    @property
    def be_min_share(self) -> float:
        return self._sched.be_min_share

    def set_be_min_share(self, share: float) -> None:
        """BE's minimum share under RT overload (see the class docstring). Validated
        first."""
        self._check_open()
        self._engine.set_be_min_share(share)

    @property
    def edf_preempt(self) -> bool:
        return self._sched.edf_preempt

    def set_edf_preempt(self, flag: bool) -> None:
        self._check_open()
        self._engine.set_edf_preempt(flag)

    @property
    def preempt_drain(self) -> bool:
        return self._sched.preempt_drain

    def set_preempt_drain(self, flag: bool) -> None:
        self._check_open()
        self._engine.set_preempt_drain(flag)

    def add_listener(self, fn: Callable[[str, dict], None]) -> None:
        """Call ``fn(event, payload)`` on arrival/dispatch/preempt/restore/kernel/complete/
        fail, from the scheduler (keep it short; no cost when none is registered)."""
        self._engine.add_listener(fn)

    def remove_listener(self, fn: Callable[[str, dict], None]) -> None:
        self._engine.remove_listener(fn)

    # -- diagnostics ------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """A JSON-able snapshot: per client/model counters and latency percentiles,
        preemptions, queue depths, mode, policy, c and device telemetry."""
        snap = self._sched.stats.snapshot()
        self._engine.settings(snap)
        snap["closed"] = self._closed
        if self._plans is not None:
            snap["plan_cache"] = self._plans.stats()
        with self._lock:
            snap["submit_errors"] = dict(self._reg.submit_errors)
            snap["loaded_models"] = list(self._models)
        snap["cache"] = _jsonable(self._cache.stats())
        batching = self._engine.batching_stats()
        if batching is not None:
            snap["batching"] = _jsonable(batching)
        utility = self._utility.summary()
        if utility:
            snap["utility"] = _jsonable(utility)
        groups = self._reg.group_stats()
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
            self._admit.closed = True
        self._engine.close(drain, timeout, already)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- helpers ----------------------------------------------------------------------------------
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
