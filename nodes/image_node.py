"""Image in -> tensor out: the shared body of the perception (RT) and monitoring (BE) nodes.

Subscribes ``sensor_msgs/Image`` on ``image`` (SensorDataQoS, depth 1: a late frame is
replaced, never queued), preprocesses it for the model's input (``preprocess.py``), submits
it with ``deadline = header.stamp + relative_deadline_ms`` and publishes the response on
``~/output`` (``std_msgs/UInt8MultiArray``, tensor encoding of ``av_infer.tensor_codec``)
with the image's stamp and frame_id. Every image that is submitted gets exactly one output
message: the model outputs, or ``ok: false`` with an error code (e.g. ``deadline_missed``).
Images arriving while ``max_in_flight`` requests are pending, or before the runtime is
reachable, are dropped and counted.

``runtime``: ``local`` calls an in-process Runtime (the container), ``remote`` reaches a
runtime host in another process over /av_infer/request|response; ``auto`` picks local when
the container hands the node a Runtime.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from av_infer_nodes.common import (
    LocalRuntimeClient,
    RemoteRuntimeClient,
    RuntimeClient,
    as_float_list,
    declare,
    response_msg,
    stamp_tuple,
)
from av_infer_nodes.preprocess import RESIZE_METHODS, ImageFormatError, image_to_tensor
from rcl_interfaces.msg import SetParametersResult
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, qos_profile_sensor_data
from sensor_msgs.msg import Image
from std_msgs.msg import UInt8MultiArray

from av_infer import tensor_codec as codec

#: SensorDataQoS with depth 1 (best effort, volatile, keep last 1).
IMAGE_QOS = QoSProfile(depth=1, history=qos_profile_sensor_data.history,
                       reliability=qos_profile_sensor_data.reliability,
                       durability=qos_profile_sensor_data.durability)

ResultListener = Callable[[codec.TensorResponse, Image, float], None]


class ImageInferenceNode(Node):
    """Base of PerceptionNode and MonitoringNode; ``priority`` is their default class."""

    default_priority = "BE"
    default_deadline_ms = 0.0
    default_model = "tiny_cnn"

    def __init__(self, node_name: str, *, runtime: Any = None, **node_kwargs: Any):
        super().__init__(node_name, **node_kwargs)
        self.p = self._declare_parameters()
        mode = self.p["runtime"]
        if mode == "auto":
            mode = "local" if runtime is not None else "remote"
        if mode == "local" and runtime is None:
            raise RuntimeError("runtime:=local needs an in-process Runtime (use the "
                               "av_infer_container executable) or runtime:=remote")
        self.mode = mode
        self._lock = threading.Lock()
        self.counters = {"received": 0, "submitted": 0, "completed": 0, "failed": 0,
                         "dropped_not_ready": 0, "dropped_busy": 0, "invalid": 0}
        self._in_flight = 0
        self._listeners: list[ResultListener] = []
        self._last_not_ready_log = 0.0
        self.client: RuntimeClient
        if mode == "local":
            self.client = LocalRuntimeClient(self, runtime)
            self._ensure_local_model(self.p["model"])
        else:
            self.client = RemoteRuntimeClient(self, timeout_s=self.p["request_timeout_s"])
        self._pub = self.create_publisher(UInt8MultiArray, "~/output", 10)
        self._sub = self.create_subscription(Image, "image", self._on_image, IMAGE_QOS)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.get_logger().info(
            f"{self.p['priority']} client {self.p['client']!r}: model {self.p['model']} via "
            f"{mode} runtime, deadline {self.p['relative_deadline_ms']} ms")

    # -- parameters ----------------------------------------------------------------------
    def _declare_parameters(self) -> dict[str, Any]:
        return {
            "runtime": declare(self, "runtime", "auto",
                               "How to reach the runtime: local (in-process, container), "
                               "remote (/av_infer/request topics) or auto.", read_only=True,
                               constraints="auto, local or remote"),
            "model": declare(self, "model", self.default_model,
                             "Model to run: a zoo name or the name of a model the runtime "
                             "host loaded."),
            "model_variant": declare(self, "model_variant", "scaled",
                                     "Zoo variant loaded on demand in local mode.",
                                     read_only=True),
            "client": declare(self, "client", self.get_name(),
                              "Client id in runtime statistics.", read_only=True),
            "priority": declare(self, "priority", self.default_priority,
                                "Request priority: RT (deadline-ordered, preempts BE) or BE.",
                                read_only=True, constraints="RT or BE"),
            "relative_deadline_ms": declare(self, "relative_deadline_ms",
                                            float(self.default_deadline_ms),
                                            "Deadline after the image stamp in ms (0: none).",
                                            float_range=(0.0, 60000.0)),
            "drop_late": declare(self, "drop_late", False,
                                 "Drop requests whose deadline passed before they ran."),
            "resize": declare(self, "resize", "bilinear",
                              "Resize to the model input: nearest or bilinear.",
                              constraints="nearest or bilinear"),
            "mean": declare(self, "mean", [0.485, 0.456, 0.406],
                            "Per-channel mean subtracted from pixels scaled to [0, 1].",
                            array_of=float),
            "std": declare(self, "std", [0.229, 0.224, 0.225],
                           "Per-channel standard deviation the pixels are divided by.",
                           array_of=float),
            "max_in_flight": declare(self, "max_in_flight", 2,
                                     "Pending requests at most; newer images are dropped.",
                                     int_range=(1, 64)),
            "request_timeout_s": declare(self, "request_timeout_s", 5.0,
                                         "Remote mode: give up on a response after this long.",
                                         float_range=(0.1, 600.0)),
        }

    def _validate(self, name: str, value: Any) -> str | None:
        if name == "model":
            if not isinstance(value, str) or not value:
                return "model must be a non-empty string"
            if self.mode == "local":
                try:
                    self._ensure_local_model(value)
                except Exception as exc:
                    return f"cannot load model {value!r}: {exc}"
                return None
            spec = self.client.input_spec(value)
            return None if spec is not None else (
                f"model {value!r} is not loaded by the runtime host")
        if name == "resize":
            return None if value in RESIZE_METHODS else (
                f"resize must be one of {', '.join(RESIZE_METHODS)}")
        if name in ("mean", "std"):
            vals = as_float_list(value) if value is not None else []
            if len(vals) not in (1, 3):
                return f"{name} needs 1 or 3 values"
            if name == "std" and any(v == 0 for v in vals):
                return "std values must be non-zero"
            return None
        if name == "relative_deadline_ms":
            ok = isinstance(value, float) and 0.0 <= value <= 60000.0
            return None if ok else "relative_deadline_ms must be in [0, 60000]"
        if name == "max_in_flight":
            ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 64
            return None if ok else "max_in_flight must be in 1..64"
        if name == "request_timeout_s":
            ok = isinstance(value, float) and 0.1 <= value <= 600.0
            return None if ok else "request_timeout_s must be in [0.1, 600]"
        if name == "drop_late":
            return None if isinstance(value, bool) else "drop_late must be a bool"
        if self.has_parameter(name) and self.describe_parameter(name).read_only:
            return f"{name} is read-only (a restart is needed)"
        return None

    def _on_set_parameters(self, params: list[Parameter]) -> SetParametersResult:
        errors = [r for prm in params if (r := self._validate(prm.name, prm.value))]
        if errors:
            return SetParametersResult(successful=False, reason="; ".join(errors))
        for prm in params:  # all valid: take effect from the next image
            if prm.name in self.p:
                self.p[prm.name] = prm.value
            if prm.name == "request_timeout_s" and isinstance(self.client, RemoteRuntimeClient):
                self.client.timeout_s = float(prm.value)
        return SetParametersResult(successful=True)

    def _ensure_local_model(self, model: str) -> None:
        rt = self.client.runtime  # type: ignore[attr-defined]
        if model in rt.models():
            return
        from av_infer_nodes.runtime_node import model_source

        name, source = model_source(model, self.p["model_variant"])
        if name not in rt.models():
            self.get_logger().info(f"loading model {name} from {source}")
            rt.load_model(name, source)
        if name != model:
            raise ValueError(f"use the model name {name!r} (file stem), not {model!r}")

    # -- data path -----------------------------------------------------------------------
    def add_result_listener(self, fn: ResultListener) -> None:
        """``fn(response, image, t_received_monotonic)`` after each output is published."""
        self._listeners.append(fn)

    def _not_ready(self, why: str) -> None:
        self.counters["dropped_not_ready"] += 1
        now = time.monotonic()
        if now - self._last_not_ready_log > 5.0:
            self._last_not_ready_log = now
            self.get_logger().warning(f"dropping images: {why}")

    def _on_image(self, msg: Image) -> None:
        t_recv = time.monotonic()
        p = self.p
        model = p["model"]
        with self._lock:
            self.counters["received"] += 1
            if self._in_flight >= p["max_in_flight"]:
                self.counters["dropped_busy"] += 1
                return
        if not self.client.ready(model):
            self._not_ready(f"runtime not reachable or model {model!r} not loaded yet")
            return
        spec = self.client.input_spec(model) or {}
        stamp = stamp_tuple(msg.header.stamp)
        rid = str(uuid.uuid4())
        base = {"model": model, "client": p["client"], "stamp": stamp,
                "frame_id": msg.header.frame_id}
        try:
            if len(spec) != 1:
                raise ImageFormatError(f"model {model!r} has {len(spec)} inputs; image nodes "
                                       "feed single-input models")
            (input_name, (shape, _dtype)), = spec.items()
            tensor = image_to_tensor(msg.encoding, msg.height, msg.width, msg.step, msg.data,
                                     _concrete_shape(shape, msg), p["resize"], p["mean"],
                                     p["std"])
        except (ImageFormatError, ValueError) as exc:
            self.counters["invalid"] += 1
            self._publish(codec.error_response(rid, "invalid_input", str(exc), **base), msg,
                          t_recv)
            return
        deadline_s = p["relative_deadline_ms"] * 1e-3 or None
        req = codec.TensorRequest(id=rid, model=model, priority=p["priority"],
                                  inputs={input_name: tensor}, deadline_s=deadline_s,
                                  client=p["client"], stamp=stamp,
                                  frame_id=msg.header.frame_id, drop_late=p["drop_late"])
        with self._lock:
            self._in_flight += 1
            self.counters["submitted"] += 1
        fut = self.client.submit(req)
        fut.add_done_callback(lambda f: self._done(f, msg, t_recv))

    def _done(self, fut: Future, image: Image, t_recv: float) -> None:
        resp: codec.TensorResponse = fut.result()
        with self._lock:
            self._in_flight -= 1
            self.counters["completed" if resp.ok else "failed"] += 1
        self._publish(resp, image, t_recv)

    def _publish(self, resp: codec.TensorResponse, image: Image, t_recv: float) -> None:
        resp.stamp = stamp_tuple(image.header.stamp)
        resp.frame_id = image.header.frame_id
        try:
            self._pub.publish(response_msg(resp))
        except Exception as exc:  # shut down meanwhile, or outputs the wire cannot carry
            if self.context.ok():
                self.get_logger().error(f"cannot publish output: {exc}")
        for fn in self._listeners:
            fn(resp, image, t_recv)

    def destroy_node(self) -> None:
        self.client.close()
        super().destroy_node()


def _concrete_shape(shape: list[Any], image: Image) -> list[int]:
    """Model input shape with dynamic dims bound: N=1, C=3, H/W from the image."""
    if len(shape) != 4:
        return [int(d) if isinstance(d, int) else 1 for d in shape]
    fill = [1, 3, int(image.height), int(image.width)]
    return [int(d) if isinstance(d, int) and d > 0 else f for d, f in zip(shape, fill)]
