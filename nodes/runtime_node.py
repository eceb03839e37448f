"""Runtime host node ``av_infer_runtime``: a managed (lifecycle) node that owns the Runtime.

Lifecycle (``rclpy.lifecycle``; driven through ``~/change_state`` as for any managed node,
or at start with ``autostart``, the default):

* configure: create the runtime (``device``, ``policy``, ...), load ``models``, from the
  on-disk plan cache (``plan_cache``) when a plan is there, define the ``variant_groups``
  (paper 001) and apply the batching settings (``batch_max``, ``batch_mode``, ...);
* activate: accept requests; deactivate: refuse new ones (``STATUS_INACTIVE``) and wait
  until the accepted ones are answered; cleanup: unload the models and close the runtime;
  shutdown (from any state): cleanup if needed.

Endpoints, all present in every state (a request to an inactive node is answered, never
dropped):

* /av_infer/request (``av_infer_msgs/InferRequest``) -> ``response_topic(client)``, i.e.
  /av_infer/response/<client> (``InferResponse``; ``response_routing`` ``per_client``,
  the default: each client receives only its own answers; a request without a client id,
  and every request with ``shared``, is answered on /av_infer/response): every request
  answered exactly once. ``client_models`` (an allow-list) refuses a client's requests
  for other models (``not_allowed``, on that client's topic). The split control/data path:
  control fields are read and validated first (``tensor_codec.read_control``), tensor
  metadata is checked against ``max_request_tensors``/``max_request_mb`` and the model's
  input spec before anything is allocated, then each payload is copied once, straight into
  the task's input buffers (``Runtime.input_buffers``). Responses are encoded and published
  on the node's executor (``Handoff``), never on the runtime's threads;
* /av_infer/load_model, /av_infer/unload_model, /av_infer/list_models (``av_infer_msgs``
  services, off unless ``model_services``): ``av_infer.model_admin`` confines loads to
  ``model_dirs`` and bounds them; each failure answers its typed error's code; a load
  compiles on the loader thread, so requests and the other services are answered meanwhile;
* /av_infer/models (latched ``std_msgs/String``, JSON): loaded models' input/output specs,
  precision, pinned, weight_bytes and kernels, for nodes in other processes to preprocess
  for (and check the precision they ask for);
* /diagnostics every ``diagnostics_period_s`` (the runtime with its batch mode, each client,
  each model, each variant group: share per variant, mean utility);
  ``~/debug/processing_time_ms`` and
  ``~/debug/pipeline_latency_ms`` when ``debug_topics``.

Where the code lives (one module per job; this one keeps the lifecycle and the wiring):
``runtime_params`` (the parameter table: names, defaults, ranges, read-only flags,
descriptions; declaration and the live validator), ``runtime_build`` (devices, the
Runtime's construction, ``models`` entries), ``runtime_requests`` (the request/response
endpoint and the allow-list), ``runtime_services`` (the model services),
``runtime_diagnostics`` (client health, per-model latency, /diagnostics statuses).
The names they define are importable from here as before.
"""

from __future__ import annotations

import gc
import json
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import rclpy
from av_infer_msgs.msg import InferRequest, InferResponse
from av_infer_msgs.srv import ListModels, LoadModel, UnloadModel
from av_infer_nodes.common import (
    LATCHED_QOS,
    MODELS_TOPIC,
    PUB_EVENTS,
    REQUEST_QOS,
    REQUEST_TOPIC,
    RESPONSE_TOPIC,
    ROUTINGS,
    SUB_EVENTS,
    debug_publishers,
    describe_loaded_model,
    describe_model,
    spin_nodes,
)
from av_infer_nodes.handoff import Handoff
from av_infer_nodes.health import diagnostics_cdr
from av_infer_nodes.runtime_build import (  # noqa: F401 - re-exported (tests, nodes)
    DEVICES,
    check_live_device,
    check_policy,
    check_precisions,
    cpu_options,
    make_runtime,
    model_source,
    policy_names,
)
from av_infer_nodes.runtime_diagnostics import (  # noqa: F401 - re-exported
    MAX_HEALTH_CLIENTS,
    ClientHealth,
    ModelLatency,
    diagnostic_statuses,
)
from av_infer_nodes.runtime_params import (  # noqa: F401 - re-exported
    BATCH_PARAMS,
    BATCHING,
    CLIENT_HEALTH_PARAMS,
    GROUP_NAME,
    LIVE,
    declare_parameters,
    defaults,
    model_precisions,
    parse_client_models,
    parse_client_rates,
    validate,
)
from av_infer_nodes.runtime_requests import (  # noqa: F401 - re-exported
    ANY_CLIENT,
    RequestEndpoint,
    allow_list_refusal,
)
from av_infer_nodes.runtime_services import (  # noqa: F401 - re-exported
    LIST_MODELS_SERVICE,
    LOAD_MODEL_SERVICE,
    UNLOAD_MODEL_SERVICE,
    ModelServices,
    model_info_msg,
    parse_input_shapes,
)
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from std_msgs.msg import String

from av_infer import DEFAULT_QOS_POLICY, InvalidParameterError, UnknownModelError
from av_infer import tensor_codec as codec


class RuntimeNode(RequestEndpoint, ModelServices, LifecycleNode):
    """Owns the Runtime; see the module docstring. ``runtime`` is public for the container
    (None while unconfigured). A ``runtime`` passed in is shared, not owned: cleanup then
    unloads only the models this node loaded and never closes it."""

    def __init__(self, node_name: str = "av_infer_runtime", *, runtime: Any = None,
                 **node_kwargs: Any):
        super().__init__(node_name, **node_kwargs)
        self.p = p = self._declare_parameters()
        self._lock = threading.Lock()
        self._given_runtime = runtime
        self.runtime: Any = None
        self.device = p["device"]
        self.admin: Any = None
        #: why the runtime runs on ``device``; ``device_fallback``: ``device=auto`` found no
        #: usable GPU and fell back to cpu (a WARN in the log and in /diagnostics)
        self.device_reason = ""
        self.device_fallback = False
        #: objects ``gc_freeze`` exempted from cycle collection at the last activation
        self.gc_frozen = 0
        self.model_info: dict[str, Any] = {}
        self._loaded_here: list[str] = []
        #: variant groups this node defined (removed at cleanup from a shared runtime)
        self._groups_here: list[str] = []
        #: requests accepted and not yet answered (deactivate waits for them)
        self._in_flight = 0
        self._idle = threading.Condition(self._lock)
        self.active = False
        self.limits = codec.Limits(max_tensors=p["max_request_tensors"],
                                   max_tensor_bytes=p["max_request_mb"] * 2**20,
                                   max_request_bytes=p["max_request_mb"] * 2**20)
        self.model_latency = ModelLatency()
        try:
            self.client_health = ClientHealth(p, time.monotonic())
        except InvalidParameterError as exc:
            self.client_health = ClientHealth({**p, "client_rates": [],
                                               "deadline_miss_warn": 1,
                                               "deadline_miss_error": 1}, time.monotonic())
            self._param_errors.append(str(exc))
        self._last_request: float | None = None  # monotonic, for ~/debug/cyclic_time_ms
        self._last_misses: dict[str, int] = {}
        self._handoff = Handoff(self)
        self._debug = debug_publishers(self, p["debug_topics"])
        self._resp_pub = self.create_publisher(InferResponse, RESPONSE_TOPIC, REQUEST_QOS,
                                               event_callbacks=PUB_EVENTS)
        #: per-client response publishers (client id -> publisher), least recently used first;
        #: at most ``max_response_topics`` (the oldest is destroyed to make room)
        self._client_pubs: OrderedDict[str, Any] = OrderedDict()
        self._pubs_lock = threading.Lock()
        try:
            self.allow = parse_client_models(p["client_models"])
        except InvalidParameterError as exc:
            self.allow = {}
            self._param_errors.append(str(exc))
        if p["response_routing"] not in ROUTINGS:
            self._param_errors.append(f"response_routing must be one of {', '.join(ROUTINGS)}"
                                      f", got {p['response_routing']!r}")
        # raw: the request is read from its bytes (runtime_requests.WireRequest)
        self._req_sub = self.create_subscription(InferRequest, REQUEST_TOPIC,
                                                 self._on_request, REQUEST_QOS,
                                                 event_callbacks=SUB_EVENTS, raw=True)
        self._models_pub = self.create_publisher(String, MODELS_TOPIC, LATCHED_QOS,
                                                 event_callbacks=PUB_EVENTS)
        self._published_models: tuple[Any, ...] | None = None
        #: reentrant: a load awaits its compile (``_on_load_model``) while list and unload
        #: are answered; ModelAdmin runs one load at a time and is thread-safe
        self._svc_group = ReentrantCallbackGroup()
        #: the thread that compiles loads (``_on_load_model``; started by the first load)
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model_load")
        self._model_srvs = [
            self.create_service(LoadModel, LOAD_MODEL_SERVICE, self._on_load_model,
                                callback_group=self._svc_group),
            self.create_service(UnloadModel, UNLOAD_MODEL_SERVICE, self._on_unload_model,
                                callback_group=self._svc_group),
            self.create_service(ListModels, LIST_MODELS_SERVICE, self._on_list_models,
                                callback_group=self._svc_group),
        ]
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10,
                                               event_callbacks=PUB_EVENTS)
        self._diag_group = MutuallyExclusiveCallbackGroup()
        self._diag_timer = self.create_timer(p["diagnostics_period_s"], self.publish_diagnostics,
                                             callback_group=self._diag_group)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self._configure_error: BaseException | None = None
        if p["autostart"]:
            self.trigger_configure()
            if self._configure_error is not None:
                err = self._configure_error
                self.destroy_node()
                raise err
            self.trigger_activate()

    # -- lifecycle -----------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Creates the runtime and loads ``models``; FAILURE (staying unconfigured, the
        reason logged) on any error, with nothing left half-made."""
        p = self._current_parameters()
        self._configure_error = None
        try:
            if self._param_errors:
                raise InvalidParameterError("; ".join(self._param_errors))
            precisions = model_precisions(p)
            self._create_runtime(p)
            check_precisions(self.runtime, precisions, p["model_variant"],  # before loads
                             pinned=p["pinned_models"])
            for entry in p["models"]:
                self.load_model(entry, p["model_variant"], pin=entry in p["pinned_models"],
                                precision=precisions[entry])
            self._define_groups(p)
            default = defaults()
            if self._given_runtime is None or any(  # a shared one: only if set
                    p[k] != default[k] for k in ("batch_max", "batch_quantum_ms",
                                                 "batch_mode", "qos_policy")):
                self._set_batching(p)  # after the groups: a qos_rl policy must fit them
            if p["model_services"]:
                from av_infer.model_admin import ModelAdmin

                if any(not str(d).strip() for d in p["model_dirs"]):
                    raise InvalidParameterError("model_dirs entries must be directories, "
                                                "not empty strings (the working directory)")

                self.admin = ModelAdmin(self.runtime, p["model_dirs"],
                                        max_file_bytes=p["max_model_file_mb"] * 2**20,
                                        max_models=p["max_models"])
        except Exception as exc:  # a configuration error: refuse, say why, undo
            self.get_logger().error(
                f"configure failed (device={p['device']!r}, policy={p['policy']!r}, "
                f"c={p['c']}): {type(exc).__name__}: {exc}")
            self._configure_error = exc
            self._release_runtime()
            return TransitionCallbackReturn.FAILURE
        self._publish_models()
        return TransitionCallbackReturn.SUCCESS

    def _current_parameters(self) -> dict[str, Any]:
        """Every declared parameter's current value (unset arrays: their empty default)."""
        from rclpy.exceptions import ParameterUninitializedException

        out: dict[str, Any] = {}
        for name, default in self.p.items():
            try:
                out[name] = self.get_parameter(name).value
            except ParameterUninitializedException:
                out[name] = default
        return out

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        if self.p["gc_freeze"]:
            self._freeze_gc()
        self.active = True
        self.get_logger().info("active: accepting requests")
        return TransitionCallbackReturn.SUCCESS

    def _freeze_gc(self) -> None:
        """``gc_freeze``: what exists at activation (models, nodes, modules) leaves Python's
        cycle collection. A full (gen2) collection holds the GIL while it walks every
        tracked object, about 10 ms under the peer load (``scripts/gc_pauses.py``), and an
        RT request that needs the GIL waits for it; once these are frozen it walks only what
        came after (about 1.6 ms there). Runs before requests are accepted: the collection
        here holds the GIL too."""
        t0 = time.perf_counter()
        gc.collect()
        gc.freeze()
        self.gc_frozen = gc.get_freeze_count()
        self.get_logger().info(f"gc_freeze: {self.gc_frozen} objects exempt from cycle "
                               f"collection ({(time.perf_counter() - t0) * 1e3:.0f} ms)")

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stops accepting, then waits (bounded by ``drain_timeout_s``) until every accepted
        request was answered; the executor keeps running the answers meanwhile only if it
        has another thread, so the wait also drains the handoff here."""
        with self._lock:
            self.active = False
        deadline = time.monotonic() + float(self.get_parameter("drain_timeout_s").value)
        while True:
            self._handoff.drain()  # one executor thread: the guard callback cannot run
            with self._lock:
                if self._in_flight == 0:
                    break
                if time.monotonic() > deadline:
                    self.get_logger().warning(f"deactivate: {self._in_flight} requests still "
                                              "running after drain_timeout_s")
                    break
                self._idle.wait(0.01)
        self.get_logger().info("inactive: requests are answered STATUS_INACTIVE")
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release_runtime()
        self._publish_models()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        if self.active:
            self.on_deactivate(state)
        self._release_runtime()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.active = False
        self._release_runtime()
        return TransitionCallbackReturn.SUCCESS

    def _create_runtime(self, p: dict[str, Any]) -> None:
        plan_cache: Any = p["plan_cache"] or None
        if plan_cache == "default":
            plan_cache = True
        if self._given_runtime is None:
            self.runtime, self.device, self.device_reason = make_runtime(
                p["device"], cpu_options=cpu_options(p), policy=p["policy"], c=p["c"],
                max_be_streams=p["max_be_streams"], edf_preempt=p["edf_preempt"],
                plan_cache=plan_cache)
            self._owns_runtime = True
            self.device_fallback = p["device"] == "auto" and self.device != "cuda"
        else:
            self.runtime, self.device = self._given_runtime, p["device"]
            self.device_reason = "given by the container"
            self._owns_runtime = False
        text = (f"runtime on device {self.device!r} ({self.device_reason}), policy "
                f"{self.runtime.policy}, c={self.runtime.c}")
        (self.get_logger().warning if self.device_fallback else self.get_logger().info)(text)
        self._startup_settings(p)
        try:
            self.runtime.add_listener(self.model_latency.on_event)
            self.runtime.add_listener(self._on_runtime_event)
        except Exception as exc:  # a runtime without listeners: counters only
            self.get_logger().warning(f"no per-model latency: {exc}")

    def _release_runtime(self) -> None:
        """Unloads what this node loaded (a shared runtime) or closes its own runtime."""
        rt, self.runtime = self.runtime, None
        self.admin = None
        if rt is None:
            return
        try:
            rt.remove_listener(self.model_latency.on_event)
            rt.remove_listener(self._on_runtime_event)
        except Exception:  # noqa: BLE001 - releasing anyway
            pass
        if self._owns_runtime:
            try:
                rt.close(drain=False)
            except Exception as exc:  # pragma: no cover
                self.get_logger().warning(f"runtime close: {exc}")
        else:
            for name in self._groups_here:
                try:
                    rt.remove_variant_group(name)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            for name in self._loaded_here:
                try:
                    rt.unload_model(name)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        self._groups_here.clear()
        self._loaded_here.clear()
        self.model_info.clear()

    # -- parameters ----------------------------------------------------------------------
    def _declare_parameters(self) -> dict[str, Any]:
        """Declares the table's parameters (``runtime_params``); ``_param_errors``: those
        that cannot even be declared (a bad group name): configure refuses them."""
        p, self._param_errors = declare_parameters(self)
        return p

    @staticmethod
    def _effective_policy(policy: str, padding: bool) -> str:
        """``padding`` is the policy reef_dkp: reef with padding on."""
        if padding and policy == "reef":
            return "reef_dkp"
        return policy

    def _set_cache_budget(self, mb: int) -> None:
        self.runtime.set_cache_budget(int(mb) * 2**20 if mb else None)  # 0: unlimited

    def _set_batching(self, p: dict[str, Any]) -> None:
        """Applies every ``BATCHING`` parameter of ``p`` in one ``Runtime.set_batching``,
        which validates all of them (the mode's policy against every model and variant
        group) before it changes anything. batch_max 1 turns batching off (a group's variant
        is then the best at batch 1, whatever the mode); quantum 0 keeps the runtime's;
        qos_policy '' is the committed policy."""
        mode = p["batch_mode"]
        policy = p["qos_policy"] or (DEFAULT_QOS_POLICY if mode == "qos_rl" else None)
        self.runtime.set_batching(
            int(p["batch_max"]) > 1, max_batch=int(p["batch_max"]),
            quantum=float(p["batch_quantum_ms"]) * 1e-3 if p["batch_quantum_ms"] else None,
            mode=mode, policy=policy,
            params={key: p[name] * scale for name, (key, scale) in BATCH_PARAMS.items()})

    def _define_groups(self, p: dict[str, Any]) -> None:
        """``variant_groups`` -> ``Runtime.define_variant_group`` (which checks that the
        models are loaded, take the same tensors and have κ in (0, 1])."""
        for name in p["variant_groups"]:
            models = list(p[f"variant_group.{name}.models"])
            kappas = [float(k) for k in p[f"variant_group.{name}.kappas"]]
            if not models or len(models) != len(kappas) or len(set(models)) != len(models):
                raise InvalidParameterError(
                    f"variant group {name!r}: variant_group.{name}.models ({models}) and "
                    f".kappas ({kappas}) need one kappa per model, distinct models, at "
                    "least one")
            self.runtime.define_variant_group(name, dict(zip(models, kappas, strict=True)))
            self._groups_here.append(name)
            self.get_logger().info(f"variant group {name}: " + ", ".join(
                f"{m} (kappa {k:g})" for m, k in zip(models, kappas, strict=True)))

    def _startup_settings(self, p: dict[str, Any]) -> None:
        """Applies start-up values the constructor does not take; warns about refused ones."""
        if p["padding"]:
            try:
                if p["policy"] != "reef":
                    raise ValueError("padding needs policy reef")
                self.runtime.set_policy("reef_dkp")
            except Exception as exc:
                self.get_logger().warning(f"padding=true ignored: {exc}")
        self.runtime.set_max_queue_depth(p["max_queue_depth"] or None)
        self.runtime.set_be_min_share(float(p["be_min_share"]))
        if p["cache_budget_mb"]:
            self._set_cache_budget(p["cache_budget_mb"])

    def _validate(self, name: str, value: Any, merged: dict[str, Any]) -> str | None:
        """None if ``name=value`` may be applied, else the reason it may not
        (``runtime_params.validate``)."""
        return validate(name, value, merged, getattr(self, "runtime", None),
                        lambda n: self.has_parameter(n) and self.describe_parameter(n).read_only)

    def _on_set_parameters(self, params: list[Parameter]) -> SetParametersResult:
        current = self._current_parameters()  # unset arrays (client_rates): their default
        merged = {n: current[n] for n in LIVE}
        changed: dict[str, Any] = {}
        for prm in params:
            merged[prm.name] = prm.value
            changed[prm.name] = prm.value
        errors = [r for n, v in changed.items() if (r := self._validate(n, v, merged))]
        if "padding" not in changed and "policy" in changed and merged["padding"]:
            if (r := self._validate("padding", True, merged)):
                errors.append(r)
        if errors:
            return SetParametersResult(successful=False, reason="; ".join(errors))
        try:
            self._apply(changed, merged)
        except Exception as exc:  # the runtime refused: _apply rolled back
            return SetParametersResult(successful=False, reason=str(exc))
        return SetParametersResult(successful=True)

    def _apply(self, changed: dict[str, Any], merged: dict[str, Any]) -> None:
        """Applies a validated batch; on a runtime refusal undoes what was applied."""
        rt = self.runtime
        undo: list[tuple[Any, tuple[Any, ...]]] = []
        if rt is None:  # unconfigured: configure reads the parameters
            changed = {k: v for k, v in changed.items()
                       if k in ("diagnostics_period_s", "client_models",
                                *CLIENT_HEALTH_PARAMS)}
        try:
            if rt is None:
                pass
            elif "policy" in changed or "padding" in changed:
                target = self._effective_policy(merged["policy"], merged["padding"])
                if target != rt.policy:
                    undo.append((rt.set_policy, (rt.policy,)))
                    rt.set_policy(target)
            if rt is not None and "c" in changed and changed["c"] != rt.c:
                undo.append((rt.set_c, (rt.c,)))
                rt.set_c(int(changed["c"]))
            if rt is not None and "edf_preempt" in changed:
                old = bool(self.get_parameter("edf_preempt").value)
                undo.append((rt.set_edf_preempt, (old,)))
                rt.set_edf_preempt(bool(changed["edf_preempt"]))
            if rt is not None and "max_queue_depth" in changed:
                undo.append((rt.set_max_queue_depth, (rt.max_queue_depth,)))
                rt.set_max_queue_depth(int(changed["max_queue_depth"]) or None)
            if rt is not None and "be_min_share" in changed:
                undo.append((rt.set_be_min_share, (rt.be_min_share,)))
                rt.set_be_min_share(float(changed["be_min_share"]))
            if rt is not None and "cache_budget_mb" in changed:
                undo.append((self._set_cache_budget,
                             (self.get_parameter("cache_budget_mb").value,)))
                self._set_cache_budget(changed["cache_budget_mb"])
            if rt is not None and any(k in changed for k in BATCHING):
                undo.append((self._set_batching,
                             ({k: self.get_parameter(k).value for k in BATCHING},)))
                self._set_batching(merged)
        except Exception:
            for fn, args in reversed(undo):
                try:
                    fn(*args)
                except Exception as exc:  # pragma: no cover - best effort
                    self.get_logger().error(f"rollback of {fn.__name__} failed: {exc}")
            raise
        if "client_models" in changed:  # validated: cannot fail, so nothing to roll back
            self.allow = parse_client_models(list(changed["client_models"] or []))
        if any(k in changed for k in CLIENT_HEALTH_PARAMS):  # validated likewise
            self.client_health = ClientHealth(merged, time.monotonic())
        if "diagnostics_period_s" in changed:
            self._diag_timer.cancel()
            self.destroy_timer(self._diag_timer)
            self._diag_timer = self.create_timer(float(changed["diagnostics_period_s"]),
                                                 self.publish_diagnostics,
                                                 callback_group=self._diag_group)
        self.get_logger().info("parameters set: " + ", ".join(f"{k}={v}" for k, v in
                                                               changed.items()))

    # -- models --------------------------------------------------------------------------
    def load_model(self, entry: str, variant: str = "scaled", pin: bool = False,
                   precision: str | None = None) -> str:
        """Loads a zoo name or ONNX path unless already loaded; returns the model name.
        ``precision``: ``Runtime.load_model``'s (None: the plan's own, fp32)."""
        name, source = model_source(entry, variant)
        with self._lock:
            if name not in self.runtime.models():
                self.get_logger().info(f"loading model {name} from {source}"
                                       + (f" at {precision}" if precision else ""))
                self.model_info[name] = self.runtime.load_model(name, source, pin=pin,
                                                                precision=precision)
                self._loaded_here.append(name)
        return name

    def _publish_models(self) -> None:
        """The latched model table: each model's specs and what it was loaded with
        (``describe_loaded_model``: precision, pinned, weight_bytes, kernels), and each
        variant group's variants (model -> kappa) and specs, so remote clients can name a
        group."""
        rt = self.runtime
        names = tuple(sorted(rt.models())) if rt is not None else ()
        groups = rt.variant_groups() if rt is not None else {}
        models = {}
        for n in names:
            try:
                models[n] = describe_loaded_model(rt, n)
            except UnknownModelError:  # unloaded since models(): not in this table
                continue
        # a model unloaded and loaded again under its name with other settings republishes
        key = (tuple((n, m["precision"], m["pinned"]) for n, m in models.items()),
               tuple(sorted((g, tuple(v.items())) for g, v in groups.items())))
        if key == self._published_models:
            return
        table = {"device": self.device, "response_routing": self.p["response_routing"],
                 "models": models,
                 "variant_groups": {g: {"variants": v, **describe_model(rt, g)}
                                    for g, v in groups.items()}}
        self._models_pub.publish(String(data=json.dumps(table)))
        self._published_models = key

    def _on_runtime_event(self, kind: str, payload: dict[str, Any]) -> None:
        self.client_health.on_event(kind, payload)  # the current one (parameters swap it)

    # -- diagnostics ---------------------------------------------------------------------
    def publish_diagnostics(self) -> None:
        if self.runtime is None:  # unconfigured: nothing to report
            return
        try:
            self._publish_models()
            stats = self.runtime.stats()
        except Exception as exc:
            self.get_logger().warning(f"stats unavailable: {exc}")
            return
        stamp = self.get_clock().now().seconds_nanoseconds()
        stats["models"] = self._model_stats(stats.get("models") or {})
        statuses = diagnostic_statuses(stats, self.device, self.runtime, self._last_misses,
                                       device_reason=self.device_reason,
                                       device_fallback=self.device_fallback,
                                       client_findings=self.client_health.findings(
                                           time.monotonic()),
                                       gc_frozen=self.gc_frozen)
        try:  # serialised here, no message objects (health.diagnostics_cdr)
            self._diag_pub.publish(diagnostics_cdr(statuses, stamp))
        except Exception as exc:  # a diagnostics problem must never stop the node
            if rclpy.ok(context=self.context):
                self.get_logger().warning(f"diagnostics not published: {exc!r}")

    def _model_stats(self, counters: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        lat = self.model_latency.snapshot()
        for name in sorted(set(counters) | set(lat) | set(self.model_info)):
            entry = dict(counters.get(name, {}))
            entry.update(lat.get(name, {}))
            info = self.model_info.get(name)
            if info is not None:
                for key in ("weight_bytes", "activation_bytes", "kernels", "resident_bytes",
                            "pinned"):
                    if hasattr(info, key):
                        entry[key] = getattr(info, key)
            out[name] = entry
        return out

    def destroy_node(self) -> None:
        """Answers what is still queued, then releases the runtime (closing an owned one
        answers its pending requests ``shutdown``, which are published here too)."""
        self.active = False
        rt = self.runtime
        if rt is not None and self._owns_runtime:
            try:
                rt.close(drain=False)
            except Exception as exc:  # pragma: no cover
                self.get_logger().warning(f"runtime close: {exc}")
        for fn in self._handoff.close():
            fn()
        self._loader.shutdown(wait=False, cancel_futures=True)  # a compile under way ends
        # on its own thread; its answer is moot
        self._release_runtime()
        super().destroy_node()


def main(args: list[str] | None = None) -> None:
    """``av_infer_runtime``: the runtime host alone in its process."""
    spin_nodes(lambda: [RuntimeNode()], args)


if __name__ == "__main__":
    main()
