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
  for nodes in other processes to preprocess for;
* /diagnostics every ``diagnostics_period_s`` (the runtime with its batch mode, each client,
  each model, each variant group: share per variant, mean utility);
  ``~/debug/processing_time_ms`` and
  ``~/debug/pipeline_latency_ms`` when ``debug_topics``.
"""

from __future__ import annotations

import gc
import json
import math
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
from av_infer_msgs.msg import InferRequest, InferResponse, ModelInfo, Tensor
from av_infer_msgs.srv import ListModels, LoadModel, UnloadModel
from av_infer_nodes.common import (
    LATCHED_QOS,
    MODELS_TOPIC,
    PUB_EVENTS,
    REQUEST_QOS,
    REQUEST_TOPIC,
    RESPONSE_QOS_CLIENT,
    RESPONSE_TOPIC,
    ROUTINGS,
    SUB_EVENTS,
    Reply,
    debug_publishers,
    declare,
    describe_model,
    error_reply,
    publish_cyclic,
    publish_debug,
    response_msg,
    response_topic,
    ros_text,
    spin_nodes,
    submit_to_runtime,
)
from av_infer_nodes.handoff import Handoff
from av_infer_nodes.health import OK, ConsecutiveCheck, Finding, RateCheck, combine
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.task import Future as RosFuture
from std_msgs.msg import String

import av_infer
from av_infer import (
    BATCH_MODES,
    DEFAULT_QOS_POLICY,
    DEVICE_NAMES,
    POLICIES,
    AvInferError,
    DeviceUnavailableError,
    InvalidParameterError,
    NotAllowedError,
    UnknownModelError,
    check_batch_mode,
    device_class,
    load_qos_policy,
)
from av_infer import tensor_codec as codec

LOAD_MODEL_SERVICE = "/av_infer/load_model"
UNLOAD_MODEL_SERVICE = "/av_infer/unload_model"
LIST_MODELS_SERVICE = "/av_infer/list_models"


def _wall_clock(name: str) -> bool:
    """A device whose time passes by itself. The simulator runs in virtual time that only
    its caller advances (``av-infer bench --device sim``): a node on it would never answer
    a request. A device that cannot load here (no CUDA build) is still a wall-clock one."""
    try:
        return not device_class(name).virtual
    except AvInferError:
        return True


#: what the ``device`` parameter accepts: auto and the wall-clock devices
DEVICES = ("auto", *(d for d in DEVICE_NAMES if _wall_clock(d)))

#: Batching parameters -> ``Runtime.set_batching``'s ``params`` keys (and unit scale).
BATCH_PARAMS = {"eq2_alpha": ("alpha", 1.0), "eq2_beta": ("beta", 1.0),
                "eq2_b_thrd": ("b_thrd", 1), "rate_window_ms": ("rate_window", 1e-3),
                "fixed_max": ("fixed_max", 1)}
#: Every parameter ``_set_batching`` applies together.
BATCHING = ("batch_max", "batch_quantum_ms", "batch_mode", "qos_policy", *BATCH_PARAMS)
#: A variant group's parameter names are ``variant_group.<name>.models|kappas``.
GROUP_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


def policy_names() -> tuple[str, ...]:
    """The runtime's policy table (``av_infer.POLICIES``)."""
    return tuple(POLICIES)


def check_policy(name: str, runtime: Any = None) -> str | None:
    """None if ``name`` is a usable policy (on ``runtime``'s device, when given: reef_dkp
    needs padded launches, which the cpu device refuses), else the reason it is not."""
    if runtime is not None:
        return runtime.policy_unavailable(name)
    try:
        av_infer.get_policy(name)
    except InvalidParameterError as exc:
        return str(exc)
    return None


def check_live_device(device: str) -> None:
    """InvalidParameterError with the reason for a device a live ROS graph cannot run on
    (one in virtual time); unknown names are left to ``Runtime``, which names the choices."""
    if device != "auto" and not _wall_clock(device):
        raise InvalidParameterError(
            f"device {device!r} runs in virtual time, advanced only by its caller, so a ROS "
            f"node on it would never answer; choose one of {', '.join(DEVICES)} (the "
            "simulator is for benchmarks: av-infer bench --device sim)")


def make_runtime(device: str, cpu_options: dict[str, Any] | None = None,
                 **kwargs: Any) -> tuple[Any, str, str]:
    """Builds a Runtime; returns (runtime, device name, why that device).

    ``device="auto"`` takes cuda when a GPU is usable and falls back to cpu only when it
    is not (``DeviceUnavailableError``: no GPU, driver, CuPy or built dispatcher); the
    reason says so. Any other error (a bad policy, c, option: ``InvalidParameterError``
    and the rest) propagates, so a configuration error is never hidden behind a cpu
    fallback. ``cpu_options``: device options used when the device is the cpu (e.g.
    rt_priority).
    """
    check_live_device(device)
    cpu = {"device_options": dict(cpu_options)} if cpu_options else {}
    if device != "auto":
        extra = cpu if device == "cpu" else {}
        return av_infer.Runtime(device=device, **kwargs, **extra), device, "requested"
    try:
        return av_infer.Runtime(device="cuda", **kwargs), "cuda", "auto: a CUDA GPU is usable"
    except DeviceUnavailableError as exc:
        why = f"auto: no usable GPU ({exc}); fell back to cpu"
    return av_infer.Runtime(device="cpu", **kwargs, **cpu), "cpu", why


def cpu_options(p: dict[str, Any]) -> dict[str, Any]:
    """The ``cpu_*`` parameters as cpu device options (``CpuDevice``; used when the
    device is the cpu, validated there: a refused value fails configure with its reason).
    ``cpu_rt_parallel`` 0 leaves the device's default (one RT lane per core)."""
    out: dict[str, Any] = {"rt_priority": p["cpu_rt_priority"], "be_nice": p["cpu_be_nice"]}
    if p["cpu_rt_parallel"] != 0:
        out["rt_parallel"] = p["cpu_rt_parallel"]
    return out


def model_source(entry: str, variant: str) -> tuple[str, Any]:
    """A ``models`` entry -> (runtime model name, source): zoo names or ONNX paths."""
    p = Path(entry).expanduser()
    if entry.endswith(".onnx") or p.suffix == ".onnx" or p.exists():
        return p.stem, str(p)
    from av_infer import zoo_names, zoo_path

    if entry not in zoo_names():
        raise ValueError(f"{entry!r} is neither an ONNX file nor a zoo model "
                         f"({', '.join(zoo_names())})")
    return entry, zoo_path(entry, variant)


#: ``client_models`` entries: ``CLIENT=MODEL[,MODEL...]``; ``*`` as CLIENT: every client
#: without an entry of its own.
ANY_CLIENT = "*"


def parse_client_models(entries: list[str]) -> dict[str, frozenset[str]]:
    """The ``client_models`` allow-list: ``["front=yolo,det", "*=tiny_cnn"]`` -> client ->
    the models (and variant groups) it may name. Empty: no allow-list (every client may
    name every model). InvalidParameterError for a malformed entry or a client listed
    twice, so a refused value changes nothing."""
    out: dict[str, frozenset[str]] = {}
    for e in entries:
        client, sep, models = str(e).partition("=")
        client = client.strip()
        names = [m.strip() for m in models.split(",")] if sep else []
        if not client or not names or any(not m for m in names):
            raise InvalidParameterError(
                f"client_models entries are CLIENT=MODEL[,MODEL...] (CLIENT * for every "
                f"other client); got {e!r}")
        if client in out:
            raise InvalidParameterError(f"client_models names client {client!r} twice")
        out[client] = frozenset(names)
    return out


def allow_list_refusal(allow: dict[str, frozenset[str]], client: str, model: str,
                       variant_group: str | None) -> str | None:
    """None if ``client`` may run ``model`` (and ``variant_group``) under ``allow`` (see
    ``parse_client_models``), else why not. A client with no entry falls under ``*``; with
    neither, it is refused: once an allow-list is configured, what it does not name is
    not allowed."""
    if not allow:
        return None
    allowed = allow.get(client, allow.get(ANY_CLIENT))
    if allowed is None:
        return (f"client {client!r} is not in the runtime host's allow-list "
                "(parameter client_models)")
    for name in (model, variant_group):
        if name and name not in allowed:
            return (f"client {client!r} may not run {name!r}: its allow-list (parameter "
                    f"client_models) names {', '.join(sorted(allowed))}")
    return None


#: Parameters of the per-client health checks (``ClientHealth``), applied together.
CLIENT_HEALTH_PARAMS = ("client_rates", "rate_tolerance", "stale_timeout_s",
                        "deadline_miss_warn", "deadline_miss_error")


#: Clients ``ClientHealth`` tracks one by one (as the runtime's statistics do).
MAX_HEALTH_CLIENTS = 256


def parse_client_rates(entries: list[str]) -> dict[str, float]:
    """``client_rates``: ``["front=30", "rear=10"]`` -> client -> expected Hz (0: only
    staleness); InvalidParameterError for a malformed entry or a client named twice."""
    out: dict[str, float] = {}
    for e in entries:
        client, sep, hz = str(e).partition("=")
        client = client.strip()
        try:
            rate = float(hz) if sep else math.nan
        except ValueError:
            rate = math.nan
        if not client or not (0.0 <= rate <= 1000.0):
            raise InvalidParameterError(f"client_rates entries are CLIENT=HZ with HZ in "
                                        f"[0, 1000]; got {e!r}")
        if client in out:
            raise InvalidParameterError(f"client_rates names client {client!r} twice")
        out[client] = rate
    return out


class ClientHealth:
    """Per client, from the runtime's ``complete`` events (every client: in-process and
    remote): consecutive deadline misses (WARN from ``deadline_miss_warn``, ERROR from
    ``deadline_miss_error``); and for the clients ``client_rates`` names, the rate of their
    answers against the expected Hz ± ``rate_tolerance`` and STALE once none came for
    ``stale_timeout_s``. Times are monotonic seconds, passed in (``now``), so tests drive
    the levels. Thread-safe: events come on the runtime's thread."""

    def __init__(self, p: dict[str, Any], start: float):
        if p["deadline_miss_warn"] > p["deadline_miss_error"]:
            raise InvalidParameterError(
                f"deadline_miss_warn ({p['deadline_miss_warn']}) must not be above "
                f"deadline_miss_error ({p['deadline_miss_error']})")
        rates = parse_client_rates(list(p["client_rates"] or []))
        self._warn, self._error = int(p["deadline_miss_warn"]), int(p["deadline_miss_error"])
        self._lock = threading.Lock()
        self.rates = {c: RateCheck(hz, float(p["rate_tolerance"]), float(p["stale_timeout_s"]),
                                   window_s=max(2.0, 5.0 / hz) if hz else 2.0, start=start)
                      for c, hz in rates.items()}
        self.misses: dict[str, ConsecutiveCheck] = {}

    def tick(self, client: str, deadline_met: bool | None, now: float) -> None:
        with self._lock:
            rate = self.rates.get(client)
            if rate is not None:
                rate.tick(now)
            if deadline_met is not None:
                if client not in self.misses and len(self.misses) >= MAX_HEALTH_CLIENTS:
                    client = "(other clients)"  # invented names cannot grow the table
                check = self.misses.get(client)
                if check is None:
                    check = self.misses[client] = ConsecutiveCheck(self._warn, self._error)
                check.tick(not deadline_met)

    def on_event(self, kind: str, payload: dict[str, Any]) -> None:
        """A Runtime listener."""
        if kind == "complete":
            met = payload.get("deadline_met")
            self.tick(str(payload.get("client")), None if met is None else bool(met),
                      time.monotonic())

    def findings(self, now: float) -> dict[str, Finding]:
        """Client -> its combined finding (expected clients that never answered too)."""
        with self._lock:
            out: dict[str, Finding] = {}
            for c in sorted(set(self.rates) | set(self.misses)):
                parts = []
                if c in self.rates:
                    parts.append(self.rates[c].check(now))
                if c in self.misses:
                    parts.append(self.misses[c].check())
                out[c] = combine(parts)
            return out


class ModelLatency:
    """Per-model latency samples and deadline misses, fed by a Runtime listener."""

    def __init__(self, cap: int = 4096):
        self._lock = threading.Lock()
        self._cap = cap
        self._lat: dict[str, deque[float]] = {}
        self._misses: dict[str, int] = {}
        self._preempted: dict[str, int] = {}

    def on_event(self, kind: str, payload: dict[str, Any]) -> None:
        if kind != "complete":
            return
        model = str(payload.get("model"))
        with self._lock:
            self._lat.setdefault(model, deque(maxlen=self._cap)).append(
                float(payload.get("latency", math.nan)))
            if payload.get("deadline_met") is False:
                self._misses[model] = self._misses.get(model, 0) + 1
            self._preempted[model] = (self._preempted.get(model, 0)
                                      + int(payload.get("preempted", 0) or 0))

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            items = {k: list(v) for k, v in self._lat.items()}
            misses, pre = dict(self._misses), dict(self._preempted)
        out: dict[str, dict[str, Any]] = {}
        for model, samples in items.items():
            a = np.asarray(samples) * 1e3
            p50, p99 = (np.percentile(a, [50, 99]) if a.size else (math.nan, math.nan))
            out[model] = {"latency_ms": {"p50": float(p50), "p99": float(p99)},
                          "deadline_misses": misses.get(model, 0),
                          "preemptions": pre.get(model, 0)}
        return out


class RuntimeNode(LifecycleNode):
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
        self._req_sub = self.create_subscription(InferRequest, REQUEST_TOPIC,
                                                 self._on_request, REQUEST_QOS,
                                                 event_callbacks=SUB_EVENTS)
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
            self._create_runtime(p)
            for entry in p["models"]:
                self.load_model(entry, p["model_variant"], pin=entry in p["pinned_models"])
            self._define_groups(p)
            if self._given_runtime is None or p["batch_max"] > 1 or p["batch_quantum_ms"] \
                    or p["batch_mode"] != "rafiqi" or p["qos_policy"]:  # a shared one: if set
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
        pol = ", ".join(policy_names())
        #: parameters that cannot even be declared (a bad group name): configure refuses
        self._param_errors: list[str] = []
        p = {
            "device": declare(self, "device", "auto",
                              "Device: auto (cuda when a GPU is usable; without one, cpu, "
                              "with a warning in the log and /diagnostics) or one of "
                              + ", ".join(DEVICES[1:]) + ".",
                              read_only=True, constraints="one of " + ", ".join(DEVICES)),
            "models": declare(self, "models", ["tiny_cnn"],
                              "Models to load at start: zoo names or ONNX file paths.",
                              read_only=True, array_of=str),
            "model_variant": declare(self, "model_variant", "scaled",
                                     "Zoo variant for zoo names: scaled or full.",
                                     read_only=True, constraints="scaled or full"),
            "pinned_models": declare(self, "pinned_models", [],
                                     "Models (entries of `models`) pinned in the model cache.",
                                     read_only=True, array_of=str),
            "max_be_streams": declare(self, "max_be_streams", 2,
                                      "BE tasks running concurrently (one stream each).",
                                      read_only=True, int_range=(1, 8)),
            "cpu_rt_parallel": declare(self, "cpu_rt_parallel", 0,
                                       "cpu device: RT requests running at once, each on a "
                                       "lane of its own (0: one per core; 1: REEF's one at "
                                       "a time).", read_only=True, int_range=(0, 64)),
            "cpu_rt_priority": declare(self, "cpu_rt_priority", "off",
                                       "cpu device: OS priority of RT lanes: off, nice or "
                                       "fifo (where the OS permits; what was done, or why "
                                       "not, is in the device telemetry of /diagnostics).",
                                       read_only=True,
                                       constraints="off, nice or fifo"),
            "cpu_be_nice": declare(self, "cpu_be_nice", 10,
                                   "cpu device: nice increment of BE lanes (0: default "
                                   "priority; reef_dkp needs > 0).", read_only=True,
                                   int_range=(0, 19)),
            "policy": declare(self, "policy", "reef", f"Scheduling policy: one of {pol}.",
                              constraints="one of " + pol),
            "padding": declare(self, "padding", False,
                               "Dynamic kernel padding (REEF DKP) on top of policy reef."),
            "c": declare(self, "c", 4, "Device-queue capacity: kernels in flight per stream.",
                         constraints="in the runtime's c_range: 1..the device's max_capacity "
                         "(cpu/sim 4096, cuda 64), below every plan's reuse guard"),
            "edf_preempt": declare(self, "edf_preempt", False,
                                   "Switch RT tasks at kernel boundaries when a more urgent "
                                   "one arrives (limited-preemptive EDF)."),
            "max_queue_depth": declare(self, "max_queue_depth", 0,
                                       "Queued requests per priority class beyond which "
                                       "arrivals are rejected (RejectedError; 0: unbounded).",
                                       int_range=(0, 1_000_000)),
            "be_min_share": declare(self, "be_min_share", 0.1,
                                    "BE's share of the device while RT is over capacity (0: "
                                    "strict RT priority): BE starved 50 ms by queued RT runs "
                                    "for share/(1-share) of that while new RT waits.",
                                    float_range=(0.0, 0.9)),
            "cache_budget_mb": declare(self, "cache_budget_mb", 0,
                                       "Device memory budget of the model cache in MiB "
                                       "(0: unlimited).", int_range=(0, 1_048_576)),
            "batch_max": declare(self, "batch_max", 1,
                                 "Adaptive batching of BE requests: largest batch (1: off).",
                                 int_range=(1, 64)),
            "batch_quantum_ms": declare(self, "batch_quantum_ms", 0.0,
                                        "Adaptive batching: period of the threshold update "
                                        "in ms (Rafiqi's quantum; 0: the runtime's 5 ms). "
                                        "Nothing ever waits for a batch to fill.",
                                        float_range=(0.0, 1000.0)),
            "batch_mode": declare(self, "batch_mode", "rafiqi",
                                  "How batch sizes and a variant group's variant are chosen "
                                  "(paper 001, docs/qos.md): rafiqi (adaptive threshold), "
                                  "eq2 (eq. 2), fixed (everything queued, at most fixed_max) "
                                  "or qos_rl (the learned policy qos_policy).",
                                  constraints="one of " + ", ".join(BATCH_MODES)),
            "qos_policy": declare(self, "qos_policy", "",
                                  "qos_rl's policy file (written by av-infer qos train); '' "
                                  "the committed one. Checked against every model and group."),
            "eq2_alpha": declare(self, "eq2_alpha", 0.5,
                                 "eq. 2's alpha: weight of D_B*R_t against the queue length.",
                                 float_range=(0.0, 1.0)),
            "eq2_beta": declare(self, "eq2_beta", 1.0, "eq. 2's beta (> 0): scales B.",
                                float_range=(0.0, 1000.0), constraints="> 0"),
            "eq2_b_thrd": declare(self, "eq2_b_thrd", 8,
                                  "eq2: batches of at least this many compare variants (below, "
                                  "the most accurate runs).", int_range=(1, 1024)),
            "rate_window_ms": declare(self, "rate_window_ms", 50.0,
                                      "eq2: window of the arrival rate R_t in ms.",
                                      float_range=(0.0, 60000.0), constraints="> 0"),
            "fixed_max": declare(self, "fixed_max", 32,
                                 "fixed: the largest batch (the paper's baseline: 32).",
                                 int_range=(1, 1024)),
            "variant_groups": declare(self, "variant_groups", [],
                                      "Variant groups (paper 001) defined at configure: names "
                                      "(letters, digits, _), each with variant_group.<name>."
                                      "models (loaded model names, most accurate first) and "
                                      "variant_group.<name>.kappas (accuracy factors in (0, 1]).",
                                      read_only=True, array_of=str),
            "diagnostics_period_s": declare(self, "diagnostics_period_s", 1.0,
                                            "Period of /diagnostics publications (s).",
                                            float_range=(0.05, 60.0)),
            "autostart": declare(self, "autostart", True,
                                 "Configure and activate at start (false: wait for "
                                 "~/change_state, as a lifecycle manager drives it).",
                                 read_only=True),
            "drain_timeout_s": declare(self, "drain_timeout_s", 10.0,
                                       "Deactivate waits at most this long for accepted "
                                       "requests to be answered.", float_range=(0.0, 600.0)),
            "plan_cache": declare(self, "plan_cache", "",
                                  "On-disk plan cache: '' off, 'default' "
                                  "($AV_INFER_PLAN_CACHE or ~/.cache/av_infer/plans) or a "
                                  "directory; a restart then loads without compiling.",
                                  read_only=True),
            "model_services": declare(self, "model_services", False,
                                      "Serve /av_infer/load_model, unload_model and "
                                      "list_models (anyone on the graph can call them).",
                                      read_only=True),
            "model_dirs": declare(self, "model_dirs", [],
                                  "Directories load_model may read from (resolved; no '..' "
                                  "or symlink escape). Required with model_services.",
                                  read_only=True, array_of=str),
            "max_model_file_mb": declare(self, "max_model_file_mb", 512,
                                         "Largest model file load_model reads (MiB).",
                                         read_only=True, int_range=(1, 65536)),
            "max_models": declare(self, "max_models", 16,
                                  "Most models loaded at once (load_model refuses more).",
                                  read_only=True, int_range=(1, 1024)),
            "max_request_tensors": declare(self, "max_request_tensors", 16,
                                           "Most tensors in one request.", read_only=True,
                                           int_range=(1, 1024)),
            "max_request_mb": declare(self, "max_request_mb", 64,
                                      "Most tensor bytes in one request (MiB); checked "
                                      "before anything is allocated.", read_only=True,
                                      int_range=(1, 4096)),
            "client_rates": declare(self, "client_rates", [],
                                    "Expected clients and their rates: entries CLIENT=HZ "
                                    "(0: no rate check). /diagnostics WARNs outside HZ ± "
                                    "rate_tolerance and is STALE once a client's answers "
                                    "stopped for stale_timeout_s.", array_of=str),
            "rate_tolerance": declare(self, "rate_tolerance", 0.1,
                                      "Accepted rate deviation, a fraction of the expected.",
                                      float_range=(0.0, 0.99)),
            "stale_timeout_s": declare(self, "stale_timeout_s", 1.0,
                                       "A client of client_rates is STALE once no answer "
                                       "went to it for this long (s).",
                                       float_range=(0.01, 3600.0)),
            "deadline_miss_warn": declare(self, "deadline_miss_warn", 1,
                                          "A client's status WARNs from this many "
                                          "consecutive deadline misses.",
                                          int_range=(1, 100000)),
            "deadline_miss_error": declare(self, "deadline_miss_error", 3,
                                           "...and is ERROR from this many (not below "
                                           "deadline_miss_warn).", int_range=(1, 100000)),
            "response_routing": declare(self, "response_routing", "per_client",
                                        "Where answers go: per_client (each client's own "
                                        "topic /av_infer/response/<client>; no client "
                                        "receives another's) or shared (every answer on "
                                        "/av_infer/response, as before routing existed).",
                                        read_only=True, constraints="per_client or shared"),
            "max_response_topics": declare(self, "max_response_topics", 256,
                                           "per_client: most per-client response publishers "
                                           "kept (the least recently used one is destroyed "
                                           "to make room).", read_only=True,
                                           int_range=(1, 65536)),
            "client_models": declare(self, "client_models", [],
                                     "Allow-list: entries CLIENT=MODEL[,MODEL...] (CLIENT * "
                                     "for every client without its own entry); requests "
                                     "for anything else are refused not_allowed. Empty: "
                                     "no allow-list.", array_of=str),
            "debug_topics": declare(self, "debug_topics", False,
                                    "Publish ~/debug/processing_time_ms and "
                                    "~/debug/pipeline_latency_ms.", read_only=True),
            "gc_freeze": declare(self, "gc_freeze", True,
                                 "At activate, collect then gc.freeze() what exists: "
                                 "Python's full collections (which hold the GIL, so RT "
                                 "requests wait) then skip it. Process-wide.",
                                 read_only=True),
        }
        for name in p["variant_groups"]:
            key = f"variant_group.{name}"
            if not GROUP_NAME.fullmatch(name):
                self._param_errors.append(
                    f"variant_groups: {name!r} is not a group name (a letter, then letters, "
                    "digits or _; at most 64)")
                continue
            if self.has_parameter(f"{key}.models"):
                self._param_errors.append(f"variant_groups names {name!r} twice")
                continue
            p[f"{key}.models"] = declare(
                self, f"{key}.models", [], f"Variant group {name}: its models, most accurate "
                "first.", read_only=True, array_of=str)
            p[f"{key}.kappas"] = declare(
                self, f"{key}.kappas", [], f"Variant group {name}: accuracy factor kappa in "
                "(0, 1] of each model.", read_only=True, array_of=float)
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
        """None if ``name=value`` may be applied, else the reason it may not."""
        if name == "policy":
            if not isinstance(value, str):
                return "policy must be a string"
            return check_policy(value, self.runtime)
        if name == "padding":
            if not isinstance(value, bool):
                return "padding must be a bool"
            if value:
                if merged["policy"] not in ("reef", "reef_dkp"):
                    return "padding needs policy reef"
                return check_policy("reef_dkp", self.runtime)
            return None
        if name == "c":  # the runtime's one range (Runtime.c_range), not a copy of it
            rt = getattr(self, "runtime", None)  # None while the node is being built
            lo, hi = rt.c_range if rt is not None else (1, 1 << 30)
            ok = isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi
            return None if ok else f"c must be an integer in {lo}..{hi}, got {value!r}"
        if name == "edf_preempt":
            return None if isinstance(value, bool) else "edf_preempt must be a bool"
        if name == "max_queue_depth":
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            return None if ok else f"max_queue_depth must be an integer >= 0, got {value!r}"
        if name == "be_min_share":
            ok = isinstance(value, float) and 0.0 <= value < 1.0
            return None if ok else f"be_min_share must be in [0, 1), got {value!r}"
        if name == "diagnostics_period_s":
            ok = isinstance(value, float) and 0.05 <= value <= 60.0
            return None if ok else "diagnostics_period_s must be in [0.05, 60] s"
        if name == "batch_mode":
            try:
                check_batch_mode(value)
            except InvalidParameterError as exc:
                return str(exc)
            return None
        if name == "qos_policy":
            if not isinstance(value, str):
                return "qos_policy must be a path (string)"
            if value and getattr(self, "runtime", None) is None:  # else set_batching checks
                try:
                    load_qos_policy(value)
                except InvalidParameterError as exc:
                    return str(exc)
            return None
        if name == "client_models":
            try:
                parse_client_models(list(value or []))
            except InvalidParameterError as exc:
                return str(exc)
            except TypeError:
                return "client_models must be a string array"
            return None
        if name == "client_rates":
            try:
                parse_client_rates(list(value or []))
            except InvalidParameterError as exc:
                return str(exc)
            except TypeError:
                return "client_rates must be a string array"
            return None
        if name in ("rate_tolerance", "stale_timeout_s"):
            lo, hi = (0.0, 0.99) if name == "rate_tolerance" else (0.01, 3600.0)
            ok = isinstance(value, float) and lo <= value <= hi
            return None if ok else f"{name} must be in [{lo:g}, {hi:g}]"
        if name in ("deadline_miss_warn", "deadline_miss_error"):
            ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 100000
            if not ok:
                return f"{name} must be in 1..100000"
            if merged["deadline_miss_warn"] > merged["deadline_miss_error"]:
                return (f"deadline_miss_warn ({merged['deadline_miss_warn']}) must not be "
                        f"above deadline_miss_error ({merged['deadline_miss_error']})")
            return None
        if name in ("eq2_b_thrd", "fixed_max"):
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            return None if ok else f"{name} must be an integer >= 1, got {value!r}"
        if name in ("eq2_alpha", "eq2_beta", "rate_window_ms"):
            ok = isinstance(value, float) and math.isfinite(value) and (
                0.0 <= value <= 1.0 if name == "eq2_alpha" else value > 0.0)
            return None if ok else (f"{name} must be in [0, 1]" if name == "eq2_alpha"
                                    else f"{name} must be > 0, got {value!r}")
        if self.has_parameter(name) and self.describe_parameter(name).read_only:
            return f"{name} is read-only (a restart is needed)"
        return None

    def _on_set_parameters(self, params: list[Parameter]) -> SetParametersResult:
        current = self._current_parameters()  # unset arrays (client_rates): their default
        merged = {n: current[n] for n in
                  ("policy", "padding", "c", "edf_preempt", "max_queue_depth", "be_min_share",
                   "cache_budget_mb", *BATCHING, "diagnostics_period_s",
                   *CLIENT_HEALTH_PARAMS)}
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
    def load_model(self, entry: str, variant: str = "scaled", pin: bool = False) -> str:
        """Loads a zoo name or ONNX path unless already loaded; returns the model name."""
        name, source = model_source(entry, variant)
        with self._lock:
            if name not in self.runtime.models():
                self.get_logger().info(f"loading model {name} from {source}")
                self.model_info[name] = self.runtime.load_model(name, source, pin=pin)
                self._loaded_here.append(name)
        return name

    def _publish_models(self) -> None:
        """The latched model table: each model's specs, and each variant group's variants
        (model -> kappa) and specs, so remote clients can name a group."""
        rt = self.runtime
        names = tuple(sorted(rt.models())) if rt is not None else ()
        groups = rt.variant_groups() if rt is not None else {}
        key = (names, tuple(sorted((g, tuple(v.items())) for g, v in groups.items())))
        if key == self._published_models:
            return
        table = {"device": self.device, "response_routing": self.p["response_routing"],
                 "models": {n: describe_model(rt, n) for n in names},
                 "variant_groups": {g: {"variants": v, **describe_model(rt, g)}
                                    for g, v in groups.items()}}
        self._models_pub.publish(String(data=json.dumps(table)))
        self._published_models = key

    def _service_refusal(self) -> tuple[str, str] | None:
        if not self.p["model_services"]:
            return ("services_disabled", "model services are off (parameter model_services)")
        if self.runtime is None or self.admin is None or not self.active:
            return ("inactive", "the runtime host is not active (lifecycle state)")
        return None

    def _serve(self, resp: Any, body: Callable[[Any], None]) -> Any:
        """One model service call, answered exactly once: refused with a typed code while
        the services are off or the host is inactive; ``body(resp)`` fills a success; an
        av_infer error becomes its code (and an unsupported model its operators), anything
        else ``internal_error`` (never raised into rclpy)."""
        refusal = self._service_refusal()
        if refusal is not None:
            resp.code, resp.message = refusal
            return resp
        try:
            body(resp)
        except AvInferError as exc:
            resp.code, resp.message = exc.code, ros_text(str(exc))
            unsupported = getattr(exc, "unsupported", None) or {}
            if hasattr(resp, "unsupported"):
                resp.unsupported = [ros_text(f"{op}: {', '.join(nodes)}")
                                    for op, nodes in unsupported.items()]
        except Exception as exc:  # noqa: BLE001 - answered, never raised into rclpy
            resp.code, resp.message = "internal_error", ros_text(f"{type(exc).__name__}: {exc}")
        return resp

    async def _on_load_model(self, req: LoadModel.Request, resp: LoadModel.Response
                             ) -> LoadModel.Response:
        """Compiles on the loader thread, not the executor's: while a load (seconds of
        compile) runs, requests, images and the other services are still answered. The
        call is answered once, when the load is done: the model's info or its typed error.
        A host cleaned up meanwhile answers ``inactive`` and drops what the load added."""
        refusal = self._service_refusal()
        if refusal is not None:
            resp.code, resp.message = refusal
            return resp
        admin = self.admin
        done: RosFuture = RosFuture()

        def load() -> None:  # on the loader thread
            try:
                shapes = parse_input_shapes(list(req.input_shapes))
                name = req.name or Path(req.path).stem
                outcome: Any = admin.load(name, req.path, shapes, pin=bool(req.pin))
            except Exception as exc:  # noqa: BLE001 - answered by _serve below
                outcome = exc
            if not self._handoff.post(lambda: done.set_result(outcome)):
                done.set_result(outcome)  # destroyed meanwhile: nobody waits on the answer

        self._loader.submit(load)
        # the executor polls this task on every wake-up; the handoff's post wakes it once
        # the result is set (on the executor thread), so nothing spins meanwhile
        outcome = await done
        if self.admin is not admin:  # cleaned up (or reconfigured) while compiling
            if not isinstance(outcome, BaseException):
                try:
                    admin.unload(outcome.name)
                except Exception:  # noqa: BLE001 - the runtime went with the cleanup
                    pass
            resp.code, resp.message = "inactive", "the runtime host was cleaned up during the load"
            return resp

        def answer(resp: LoadModel.Response) -> None:
            if isinstance(outcome, BaseException):
                raise outcome
            resp.success, resp.code, resp.message = True, "ok", f"loaded {outcome.name}"
            resp.model = model_info_msg(outcome)
            self._publish_models()
        return self._serve(resp, answer)

    def _on_unload_model(self, req: UnloadModel.Request, resp: UnloadModel.Response
                         ) -> UnloadModel.Response:
        def unload(resp: UnloadModel.Response) -> None:
            self.admin.unload(req.name)
            with self._lock:
                self.model_info.pop(req.name, None)
                if req.name in self._loaded_here:
                    self._loaded_here.remove(req.name)
            resp.success, resp.code, resp.message = True, "ok", f"unloaded {req.name}"
            self._publish_models()
        return self._serve(resp, unload)

    def _on_list_models(self, req: ListModels.Request, resp: ListModels.Response
                        ) -> ListModels.Response:
        def listing(resp: ListModels.Response) -> None:
            resp.models = [model_info_msg(m) for m in self.admin.list()]
            resp.success, resp.code, resp.device = True, "ok", str(self.device)
        return self._serve(resp, listing)

    # -- request/response endpoint -------------------------------------------------------
    def _on_request(self, msg: InferRequest) -> None:
        """Validates control, then metadata, then copies each payload once into the task's
        input buffers and submits; answers every request exactly once (even malformed)."""
        t_recv = time.monotonic()
        if self._debug is not None and self._last_request is not None:
            publish_cyclic(self._debug, self, (t_recv - self._last_request) * 1e3)
        self._last_request = t_recv
        rid = codec.read_id(msg, self.limits)
        rt = self.runtime
        if not self.active or rt is None:
            self._respond(Reply(id=rid, code="inactive", model=ros_text(str(msg.model)),
                                message="the runtime host is not active (lifecycle state)"),
                          msg, t_recv)
            return
        try:
            ctrl = codec.read_control(msg, self.limits)
            refusal = allow_list_refusal(self.allow, str(msg.client), ctrl.model,
                                         ctrl.variant_group)
            if refusal is not None:
                raise NotAllowedError(refusal)
            views = codec.check_tensors(msg.tensors, self.limits, ctrl.id)
            inputs: Any = views
            try:
                spec = rt.input_spec(ctrl.model)
            except UnknownModelError:
                spec = None  # a variant group, or unknown: submit validates and answers
            if spec is not None:
                codec.check_spec(ctrl.model, spec, views)
                inputs = rt.input_buffers(ctrl.model)
                for name, view in views.items():
                    np.copyto(inputs[name], view)  # the one copy of the payload
        except Exception as exc:  # noqa: BLE001 - a bad message never kills the callback
            self._respond(error_reply(rid, exc, ros_text(str(msg.model))), msg, t_recv)
            return
        with self._lock:  # with deactivate's check: accepted requests are all waited for
            accepted = self.active
            if accepted:
                self._in_flight += 1
        if not accepted:
            self._respond(Reply(id=ctrl.id, code="inactive", model=ctrl.model,
                                message="the runtime host is not active (lifecycle state)"),
                          msg, t_recv)
            return
        fut = submit_to_runtime(rt, ctrl, inputs, self.get_clock().now().nanoseconds * 1e-9)
        fut.add_done_callback(lambda f: self._post_response(f.result(), msg, t_recv))

    def _post_response(self, reply: Reply, request: InferRequest, t_recv: float) -> None:
        """On the runtime's thread: hand the answer to the executor (``Handoff``)."""
        if not self._handoff.post(lambda: self._finish(reply, request, t_recv)):
            self._finish(reply, request, t_recv)  # closing: answer here rather than never

    def _finish(self, reply: Reply, request: InferRequest, t_recv: float) -> None:
        self._respond(reply, request, t_recv)
        with self._lock:
            self._in_flight -= 1
            self._idle.notify_all()

    def _respond(self, reply: Reply, request: InferRequest, t_recv: float) -> None:
        rt = self.runtime
        now = rt.now() if rt is not None else None
        received = None if now is None else now - (time.monotonic() - t_recv)
        try:
            msg = response_msg(reply, request.header, received, now)
        except Exception as exc:  # e.g. an output dtype the wire cannot carry
            msg = response_msg(Reply(id=reply.id, code="internal_error", message=str(exc),
                                     model=reply.model), request.header)
        try:
            self._response_publisher(request).publish(msg)
            publish_debug(self._debug, self, t_recv, request.header.stamp)
        except Exception as exc:  # context already shut down
            if rclpy.ok(context=self.context):
                self.get_logger().error(f"cannot publish response {reply.id}: {exc}")


    def _response_publisher(self, request: InferRequest) -> Any:
        """The publisher for ``request``'s answer: its client's own topic (made on the
        client's first request; ``RESPONSE_QOS_CLIENT`` keeps what it publishes until the
        client's reader matches), or the shared topic (``shared`` routing, or no client id)."""
        client = request.client if isinstance(request.client, str) else ""
        if self.p["response_routing"] != "per_client" or not client:
            return self._resp_pub
        with self._pubs_lock:
            pub = self._client_pubs.get(client)
            if pub is not None:
                self._client_pubs.move_to_end(client)
                return pub
            while len(self._client_pubs) >= self.p["max_response_topics"]:
                _, old = self._client_pubs.popitem(last=False)
                self.destroy_publisher(old)
            pub = self.create_publisher(InferResponse, response_topic(client),
                                        RESPONSE_QOS_CLIENT, event_callbacks=PUB_EVENTS)
            self._client_pubs[client] = pub
            return pub

    def response_topics(self) -> list[str]:
        """The per-client response topics this host publishes now (least recently used
        first)."""
        with self._pubs_lock:
            return [p.topic_name for p in self._client_pubs.values()]

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
        msg = DiagnosticArray()
        msg.header.stamp = self.get_clock().now().to_msg()
        stats["models"] = self._model_stats(stats.get("models") or {})
        msg.status = diagnostic_statuses(stats, self.device, self.runtime, self._last_misses,
                                         device_reason=self.device_reason,
                                         device_fallback=self.device_fallback,
                                         client_findings=self.client_health.findings(
                                             time.monotonic()))
        try:
            self._diag_pub.publish(msg)
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


def parse_input_shapes(entries: list[str]) -> dict[str, list[int]] | None:
    """``["input=1,3,224,224", ...]`` -> ``{"input": [1, 3, 224, 224]}`` (None if empty);
    InvalidParameterError for anything else."""
    if not entries:
        return None
    out: dict[str, list[int]] = {}
    for e in entries:
        name, sep, dims = e.partition("=")
        try:
            shape = [int(d) for d in dims.split(",")] if sep else []
        except ValueError:
            shape = []
        if not name or not shape:
            raise InvalidParameterError(f"input_shapes entries are NAME=D1,D2,...; got {e!r}")
        out[name.strip()] = shape
    return out


def model_info_msg(m: Any) -> ModelInfo:
    """A ``model_admin.LoadedModel`` as an ``av_infer_msgs/ModelInfo``."""
    def tensors(spec: dict[str, Any]) -> list[Tensor]:
        return [codec.spec_tensor(Tensor(), n, s, d) for n, (s, d) in spec.items()]

    return ModelInfo(name=m.name, path=m.path or "", inputs=tensors(m.inputs),
                     outputs=tensors(m.outputs), weight_bytes=int(m.weight_bytes),
                     resident_bytes=int(m.resident_bytes), kernels=int(m.kernels),
                     pinned=bool(m.pinned), sha256=m.sha256 or "",
                     plan_cache=m.plan_cache or "")


def _kv(key: str, value: Any) -> KeyValue:
    if isinstance(value, float):
        value = f"{value:.3f}" if math.isfinite(value) else str(value)
    elif isinstance(value, dict | list):
        value = json.dumps(value, separators=(",", ":"), default=str)
    return KeyValue(key=ros_text(key), value=ros_text(str(value)))


def _flatten(prefix: str, value: Any, out: list[KeyValue]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out.append(_kv(prefix, value))


def diagnostic_statuses(stats: dict[str, Any], device: str, rt: Any,
                        last_misses: dict[str, int], device_reason: str = "",
                        device_fallback: bool = False,
                        client_findings: dict[str, Finding] | None = None
                        ) -> list[DiagnosticStatus]:
    """Runtime.stats() -> one status for the runtime, one per client, one per model, one
    per variant group.

    The runtime's status names the device and why it was chosen (``device_reason``) and the
    batch mode; it is WARN while ``device_fallback`` (device=auto found no usable GPU and
    runs on cpu). A client's status is WARN when it missed deadlines since the previous
    publication, and at least the level of its ``client_findings`` entry (``ClientHealth``:
    consecutive misses up to ERROR, rate WARN, STALE); an expected client with no
    statistics yet is reported too (STALE until its first answer). A variant group's says
    which share of its answers each variant served
    and their mean utility κ·V (paper 001; ``stats()["variant_groups"]``).
    """
    statuses: list[DiagnosticStatus] = []
    policy = getattr(rt, "policy", "?")
    batch_mode = (stats.get("batching") or {}).get("mode", "?")
    head: list[KeyValue] = [_kv("device", device), _kv("device_reason", device_reason),
                            _kv("device_fallback", device_fallback), _kv("policy", policy),
                            _kv("c", getattr(rt, "c", "?")), _kv("batch_mode", batch_mode),
                            _kv("gc_frozen_objects", gc.get_freeze_count())]
    for key, value in stats.items():
        if key not in ("clients", "models", "variant_groups"):
            _flatten(key, value, head)
    text = f"{device}, policy {policy}, batch mode {batch_mode}"
    if device_fallback:
        text += f"; {device_reason}"
    level = DiagnosticStatus.WARN if device_fallback else DiagnosticStatus.OK
    statuses.append(DiagnosticStatus(level=level, name="av_infer: runtime", message=text,
                                     hardware_id=device, values=head))
    findings = dict(client_findings or {})
    clients = dict(stats.get("clients") or {})
    for name in findings:
        clients.setdefault(name, {})
    for name, cs in sorted(clients.items()):
        values: list[KeyValue] = []
        _flatten("", cs, values)
        finding = findings.get(name, Finding())
        for k, v in finding.values.items():
            values.append(_kv(f"health.{k}", v))
        misses = int(cs.get("deadline_misses", 0) or 0)
        new = misses - last_misses.get(name, 0)
        last_misses[name] = misses
        lat = cs.get("latency_ms") or {}
        p50, p99 = lat.get("p50"), lat.get("p99")
        text = (f"p50 {p50:.2f} ms, p99 {p99:.2f} ms" if p50 is not None and p99 is not None
                else "no completed requests")
        level = DiagnosticStatus.WARN if new > 0 else DiagnosticStatus.OK
        if new > 0:
            text += f", {new} deadline misses"
        if finding.level != OK:
            text += f"; {finding.message}"
        level = bytes([max(level[0], finding.level)])
        statuses.append(DiagnosticStatus(level=level, name=ros_text(f"av_infer: client {name}"),
                                         message=text, hardware_id=device, values=values))
    for name, ms in sorted((stats.get("models") or {}).items()):
        values = []
        _flatten("", ms, values)
        statuses.append(DiagnosticStatus(level=DiagnosticStatus.OK, name=f"av_infer: model {name}",
                                         message="loaded", hardware_id=device, values=values))
    for name, gs in sorted((stats.get("variant_groups") or {}).items()):
        values = []
        _flatten("", gs, values)
        shares = gs.get("share") or {}
        mean = gs.get("mean_utility")
        text = ", ".join(f"{m} {100 * v:.1f} %" for m, v in shares.items() if v is not None)
        text = (f"{text or 'none served'}; mean utility {mean:.3f}" if mean is not None
                else "no completed requests")
        statuses.append(DiagnosticStatus(level=DiagnosticStatus.OK,
                                         name=ros_text(f"av_infer: variant group {name}"),
                                         message=text, hardware_id=device, values=values))
    return statuses


def main(args: list[str] | None = None) -> None:
    """``av_infer_runtime``: the runtime host alone in its process."""
    spin_nodes(lambda: [RuntimeNode()], args)


if __name__ == "__main__":
    main()
