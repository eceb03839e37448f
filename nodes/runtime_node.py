"""Runtime host node ``av_infer_runtime``: owns the av_infer Runtime.

* its parameters configure the runtime; live ones are validated as a batch and applied
  atomically (all or nothing, with a reason when rejected);
* it serves the tensor request/response endpoint on /av_infer/request -> /av_infer/response
  (every request answered exactly once, see ``av_infer.tensor_codec``);
* it publishes the loaded models' input/output specs on /av_infer/models (latched) so
  nodes in other processes can preprocess for them;
* it publishes diagnostic_msgs/DiagnosticArray on /diagnostics every
  ``diagnostics_period_s``.
"""

from __future__ import annotations

import json
import math
import threading
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
from av_infer_nodes.common import (
    LATCHED_QOS,
    MODELS_TOPIC,
    REQUEST_QOS,
    REQUEST_TOPIC,
    RESPONSE_TOPIC,
    declare,
    describe_model,
    from_msg,
    response_msg,
    spin_nodes,
    submit_to_runtime,
)
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.node import Node
from rclpy.parameter import Parameter
from std_msgs.msg import String, UInt8MultiArray

import av_infer
from av_infer import DEVICE_NAMES, POLICIES, DeviceUnavailableError, InvalidParameterError
from av_infer import tensor_codec as codec

DEVICES = ("auto", *DEVICE_NAMES)


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
    cpu = {"device_options": dict(cpu_options)} if cpu_options else {}
    if device != "auto":
        extra = cpu if device == "cpu" else {}
        return av_infer.Runtime(device=device, **kwargs, **extra), device, "requested"
    try:
        return av_infer.Runtime(device="cuda", **kwargs), "cuda", "auto: a CUDA GPU is usable"
    except DeviceUnavailableError as exc:
        why = f"auto: no usable GPU ({exc}); fell back to cpu"
    return av_infer.Runtime(device="cpu", **kwargs, **cpu), "cpu", why


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


def readable_id(label: Any) -> str:
    """The request id in a header the codec failed on unexpectedly (an exception other than
    ``CodecError``), so that the answer still reaches its client; ``""`` if unreadable."""
    try:
        header = json.loads(label)
    except Exception:  # noqa: BLE001 - unreadable: no id
        return ""
    rid = header.get("id") if isinstance(header, dict) else None
    return rid if isinstance(rid, str) and 0 < len(rid) <= codec.MAX_ID_LEN else ""


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


class RuntimeNode(Node):
    """Owns the Runtime; see the module docstring. ``runtime`` is public for the container."""

    def __init__(self, node_name: str = "av_infer_runtime", *, runtime: Any = None,
                 **node_kwargs: Any):
        super().__init__(node_name, **node_kwargs)
        p = self._declare_parameters()
        self._lock = threading.Lock()
        #: why the runtime runs on ``device``; ``device_fallback``: ``device=auto`` found no
        #: usable GPU and fell back to cpu (a WARN in the log and in /diagnostics)
        self.device_reason = "given by the container"
        self.device_fallback = False
        if runtime is None:
            try:
                self.runtime, self.device, self.device_reason = make_runtime(
                    p["device"], policy=p["policy"], c=p["c"],
                    max_be_streams=p["max_be_streams"], edf_preempt=p["edf_preempt"])
            except Exception as exc:  # a configuration error: refuse to start, say why
                self.get_logger().error(
                    f"cannot create the runtime (device={p['device']!r}, policy="
                    f"{p['policy']!r}, c={p['c']}): {type(exc).__name__}: {exc}")
                super().destroy_node()  # nothing of ours to free yet
                raise
            self._owns_runtime = True
            self.device_fallback = p["device"] == "auto" and self.device != "cuda"
        else:
            self.runtime, self.device = runtime, p["device"]
            self._owns_runtime = False
        text = (f"runtime on device {self.device!r} ({self.device_reason}), policy "
                f"{self.runtime.policy}, c={self.runtime.c}")
        if self.device_fallback:
            self.get_logger().warning(text)
        else:
            self.get_logger().info(text)
        self._startup_settings(p)
        self.model_info: dict[str, Any] = {}
        for entry in p["models"]:
            self.load_model(entry, p["model_variant"], pin=entry in p["pinned_models"])
        self._group = ReentrantCallbackGroup()
        self._resp_pub = self.create_publisher(UInt8MultiArray, RESPONSE_TOPIC, REQUEST_QOS)
        self._req_sub = self.create_subscription(UInt8MultiArray, REQUEST_TOPIC,
                                                 self._on_request, REQUEST_QOS,
                                                 callback_group=self._group)
        self._models_pub = self.create_publisher(String, MODELS_TOPIC, LATCHED_QOS)
        self._published_models: tuple[str, ...] = ()
        self._publish_models()
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._diag_group = MutuallyExclusiveCallbackGroup()
        self._diag_timer = self.create_timer(p["diagnostics_period_s"], self.publish_diagnostics,
                                             callback_group=self._diag_group)
        self._last_misses: dict[str, int] = {}
        self.model_latency = ModelLatency()
        try:
            self.runtime.add_listener(self.model_latency.on_event)
        except Exception as exc:  # a runtime without listeners: counters only
            self.get_logger().warning(f"no per-model latency: {exc}")
        self.add_on_set_parameters_callback(self._on_set_parameters)

    # -- parameters ----------------------------------------------------------------------
    def _declare_parameters(self) -> dict[str, Any]:
        pol = ", ".join(policy_names())
        return {
            "device": declare(self, "device", "auto",
                              "Device: auto (cuda when a GPU is usable; without one, cpu, "
                              "with a warning in the log and /diagnostics) or one of "
                              + ", ".join(DEVICE_NAMES) + ".",
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
            "diagnostics_period_s": declare(self, "diagnostics_period_s", 1.0,
                                            "Period of /diagnostics publications (s).",
                                            float_range=(0.05, 60.0)),
        }

    @staticmethod
    def _effective_policy(policy: str, padding: bool) -> str:
        """``padding`` is the policy reef_dkp: reef with padding on."""
        if padding and policy == "reef":
            return "reef_dkp"
        return policy

    def _set_cache_budget(self, mb: int) -> None:
        self.runtime.set_cache_budget(int(mb) * 2**20 if mb else None)  # 0: unlimited

    def _set_batching(self, batch_max: int, quantum_ms: float) -> None:
        """batch_max 1 turns batching off; quantum 0 keeps the runtime's."""
        self.runtime.set_batching(int(batch_max) > 1, max_batch=int(batch_max),
                                  quantum=float(quantum_ms) * 1e-3 if quantum_ms else None)

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
        if p["batch_max"] > 1 or p["batch_quantum_ms"] > 0:
            self._set_batching(p["batch_max"], p["batch_quantum_ms"])

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
        if self.has_parameter(name) and self.describe_parameter(name).read_only:
            return f"{name} is read-only (a restart is needed)"
        return None

    def _on_set_parameters(self, params: list[Parameter]) -> SetParametersResult:
        merged = {n: self.get_parameter(n).value for n in
                  ("policy", "padding", "c", "edf_preempt", "max_queue_depth", "be_min_share",
                   "cache_budget_mb", "batch_max", "batch_quantum_ms",
                   "diagnostics_period_s")}
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
        try:
            if "policy" in changed or "padding" in changed:
                target = self._effective_policy(merged["policy"], merged["padding"])
                if target != rt.policy:
                    undo.append((rt.set_policy, (rt.policy,)))
                    rt.set_policy(target)
            if "c" in changed and changed["c"] != rt.c:
                undo.append((rt.set_c, (rt.c,)))
                rt.set_c(int(changed["c"]))
            if "edf_preempt" in changed:
                old = bool(self.get_parameter("edf_preempt").value)
                undo.append((rt.set_edf_preempt, (old,)))
                rt.set_edf_preempt(bool(changed["edf_preempt"]))
            if "max_queue_depth" in changed:
                undo.append((rt.set_max_queue_depth, (rt.max_queue_depth,)))
                rt.set_max_queue_depth(int(changed["max_queue_depth"]) or None)
            if "be_min_share" in changed:
                undo.append((rt.set_be_min_share, (rt.be_min_share,)))
                rt.set_be_min_share(float(changed["be_min_share"]))
            if "cache_budget_mb" in changed:
                undo.append((self._set_cache_budget,
                             (self.get_parameter("cache_budget_mb").value,)))
                self._set_cache_budget(changed["cache_budget_mb"])
            if "batch_max" in changed or "batch_quantum_ms" in changed:
                undo.append((self._set_batching, (self.get_parameter("batch_max").value,
                                                  self.get_parameter("batch_quantum_ms").value)))
                self._set_batching(merged["batch_max"], merged["batch_quantum_ms"])
        except Exception:
            for fn, args in reversed(undo):
                try:
                    fn(*args)
                except Exception as exc:  # pragma: no cover - best effort
                    self.get_logger().error(f"rollback of {fn.__name__} failed: {exc}")
            raise
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
        return name

    def _publish_models(self) -> None:
        names = tuple(sorted(self.runtime.models()))
        if names == self._published_models:
            return
        table = {"device": self.device,
                 "models": {n: describe_model(self.runtime, n) for n in names}}
        self._models_pub.publish(String(data=json.dumps(table)))
        self._published_models = names

    # -- request/response endpoint -------------------------------------------------------
    def _on_request(self, msg: UInt8MultiArray) -> None:
        """Decodes, submits, and answers every request exactly once (even malformed ones)."""
        label: Any = ""
        try:
            label, data = from_msg(msg)
            req = codec.decode_request(label, data)
        except codec.CodecError as exc:
            self._respond(codec.error_response(exc.request_id, exc.code, str(exc)))
            return
        except Exception as exc:  # never let a bad message kill the callback
            self._respond(codec.error_response(readable_id(label), codec.MALFORMED,
                                               f"undecodable: {type(exc).__name__}: {exc}"))
            return
        now = self.get_clock().now().nanoseconds * 1e-9
        fut = submit_to_runtime(self.runtime, req, now)
        fut.add_done_callback(lambda f: self._respond(f.result()))

    def _respond(self, resp: codec.TensorResponse) -> None:
        try:
            msg = response_msg(resp)
        except Exception as exc:  # e.g. an output dtype the wire cannot carry
            msg = response_msg(codec.error_response(resp.id, "internal_error", str(exc)))
        try:
            self._resp_pub.publish(msg)
        except Exception as exc:  # context already shut down
            if rclpy.ok(context=self.context):
                self.get_logger().error(f"cannot publish response {resp.id}: {exc}")

    # -- diagnostics ---------------------------------------------------------------------
    def publish_diagnostics(self) -> None:
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
                                         device_fallback=self.device_fallback)
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
        try:
            self.runtime.remove_listener(self.model_latency.on_event)
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        if self._owns_runtime:
            try:
                self.runtime.close(drain=False)
            except Exception as exc:  # pragma: no cover
                self.get_logger().warning(f"runtime close: {exc}")
        super().destroy_node()


def ros_text(text: str) -> str:
    """``text`` as a ROS string can carry it: lone surrogates (a client name sent as JSON
    ``"\\ud800"`` decodes to one) cannot be UTF-8 encoded and would make ``publish`` raise,
    so they are written as backslash escapes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


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
                        device_fallback: bool = False) -> list[DiagnosticStatus]:
    """Runtime.stats() -> one status for the runtime, one per client, one per model.

    The runtime's status names the device and why it was chosen (``device_reason``); it is
    WARN while ``device_fallback`` (device=auto found no usable GPU and runs on cpu). A
    client's status is WARN when it missed deadlines since the previous publication.
    """
    statuses: list[DiagnosticStatus] = []
    policy = getattr(rt, "policy", "?")
    head: list[KeyValue] = [_kv("device", device), _kv("device_reason", device_reason),
                            _kv("device_fallback", device_fallback), _kv("policy", policy),
                            _kv("c", getattr(rt, "c", "?"))]
    for key, value in stats.items():
        if key not in ("clients", "models"):
            _flatten(key, value, head)
    text = f"{device}, policy {policy}"
    if device_fallback:
        text += f"; {device_reason}"
    level = DiagnosticStatus.WARN if device_fallback else DiagnosticStatus.OK
    statuses.append(DiagnosticStatus(level=level, name="av_infer: runtime", message=text,
                                     hardware_id=device, values=head))
    for name, cs in sorted((stats.get("clients") or {}).items()):
        values: list[KeyValue] = []
        _flatten("", cs, values)
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
        statuses.append(DiagnosticStatus(level=level, name=ros_text(f"av_infer: client {name}"),
                                         message=text, hardware_id=device, values=values))
    for name, ms in sorted((stats.get("models") or {}).items()):
        values = []
        _flatten("", ms, values)
        statuses.append(DiagnosticStatus(level=DiagnosticStatus.OK, name=f"av_infer: model {name}",
                                         message="loaded", hardware_id=device, values=values))
    return statuses


def main(args: list[str] | None = None) -> None:
    """``av_infer_runtime``: the runtime host alone in its process."""
    spin_nodes(lambda: [RuntimeNode()], args)


if __name__ == "__main__":
    main()
