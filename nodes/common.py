"""Pieces every av_infer node shares: parameter descriptors, message <-> codec glue, time
conversion and the two ways to reach a runtime (in-process or over the request topics).
"""

from __future__ import annotations

import array
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
from builtin_interfaces.msg import Time as TimeMsg
from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    ParameterType,
)
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import MultiArrayDimension, String, UInt8MultiArray

from av_infer import AvInferError
from av_infer import tensor_codec as codec

REQUEST_TOPIC = "/av_infer/request"
RESPONSE_TOPIC = "/av_infer/response"
MODELS_TOPIC = "/av_infer/models"

#: Requests and responses: reliable, a queue deep enough for bursts of many clients.
REQUEST_QOS = QoSProfile(depth=64, history=HistoryPolicy.KEEP_LAST,
                         reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.VOLATILE)
#: The host's model table: latched, so late joiners get it.
LATCHED_QOS = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST,
                         reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)

_TYPES = {
    bool: ParameterType.PARAMETER_BOOL, int: ParameterType.PARAMETER_INTEGER,
    float: ParameterType.PARAMETER_DOUBLE, str: ParameterType.PARAMETER_STRING,
}

_ARRAY_TYPES = {str: Parameter.Type.STRING_ARRAY, float: Parameter.Type.DOUBLE_ARRAY,
                int: Parameter.Type.INTEGER_ARRAY}


def declare(node: Node, name: str, default: Any, description: str, *,
            read_only: bool = False, int_range: tuple[int, int] | None = None,
            float_range: tuple[float, float] | None = None,
            array_of: type | None = None, constraints: str = "") -> Any:
    """Declares one parameter with a full ParameterDescriptor; returns its value."""
    if array_of is not None:
        ptype = {str: ParameterType.PARAMETER_STRING_ARRAY,
                 float: ParameterType.PARAMETER_DOUBLE_ARRAY,
                 int: ParameterType.PARAMETER_INTEGER_ARRAY}[array_of]
    else:
        ptype = _TYPES[type(default)]
    desc = ParameterDescriptor(name=name, type=ptype, description=description,
                               read_only=read_only, additional_constraints=constraints)
    if int_range is not None:
        desc.integer_range = [IntegerRange(from_value=int_range[0], to_value=int_range[1],
                                           step=1)]
    if float_range is not None:
        desc.floating_point_range = [FloatingPointRange(from_value=float(float_range[0]),
                                                        to_value=float(float_range[1]),
                                                        step=0.0)]
    if array_of is not None and not default:
        # an empty list would be typed BYTE_ARRAY; declare typed-but-unset instead
        value = node.declare_parameter(name, _ARRAY_TYPES[array_of], desc).value
        return [] if value is None else value
    return node.declare_parameter(name, default, desc).value


# -- messages ------------------------------------------------------------------------------
def to_msg(label: str, data: bytes) -> UInt8MultiArray:
    """(JSON label, bytes) -> UInt8MultiArray (label in layout.dim[0].label)."""
    msg = UInt8MultiArray()
    msg.layout.dim = [MultiArrayDimension(label=label, size=len(data), stride=len(data))]
    buf = array.array("B")
    buf.frombytes(data)
    msg.data = buf
    return msg


def from_msg(msg: UInt8MultiArray) -> tuple[str, memoryview]:
    """UInt8MultiArray -> (label, data); a message without dims has label ``""``."""
    label = msg.layout.dim[0].label if len(msg.layout.dim) else ""
    data = msg.data
    view = memoryview(data) if isinstance(data, array.array) else memoryview(bytes(data))
    return label, view


def response_msg(resp: codec.TensorResponse) -> UInt8MultiArray:
    return to_msg(*codec.encode_response(resp))


def stamp_tuple(stamp: TimeMsg) -> tuple[int, int]:
    return (int(stamp.sec), int(stamp.nanosec))


def stamp_seconds(stamp: tuple[int, int]) -> float:
    return stamp[0] + stamp[1] * 1e-9


def runtime_deadline(rt_now: float, node_now: float, stamp: tuple[int, int],
                     relative_s: float | None) -> float | None:
    """Absolute runtime-clock deadline of ``stamp + relative_s`` (ROS time).

    ``deadline_rt = rt.now() + (stamp + rel - node_clock_now)``; a zero stamp means "now".
    """
    if relative_s is None or relative_s <= 0 or not math.isfinite(relative_s):
        return None
    start = stamp_seconds(stamp) if stamp != (0, 0) else node_now
    return rt_now + (start + relative_s - node_now)


def describe_model(rt: Any, name: str) -> dict[str, Any]:
    """JSON-able input/output spec of a loaded model."""

    def spec(s: dict[str, Any]) -> dict[str, Any]:
        return {k: {"shape": [int(d) for d in v[0]], "dtype": str(v[1])} for k, v in s.items()}

    return {"inputs": spec(rt.input_spec(name)), "outputs": spec(rt.output_spec(name))}


def error_code(exc: BaseException) -> str:
    return str(getattr(exc, "code", None) or "internal_error")


# -- reaching a runtime --------------------------------------------------------------------
class RuntimeClient:
    """Submits one tensor request, returns a Future[TensorResponse] that never raises.

    ``LocalRuntimeClient`` calls ``Runtime.submit`` in-process (the container);
    ``RemoteRuntimeClient`` talks to a runtime host over /av_infer/request|response.
    """

    def ready(self, model: str) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def input_spec(self, model: str) -> dict[str, tuple[list[int], str]] | None:
        raise NotImplementedError  # pragma: no cover

    def submit(self, req: codec.TensorRequest) -> Future:
        raise NotImplementedError  # pragma: no cover

    def close(self) -> None:
        pass


class LocalRuntimeClient(RuntimeClient):
    """In-process: converts the request's ROS-time deadline to the runtime clock."""

    def __init__(self, node: Node, runtime: Any):
        self._node = node
        self.runtime = runtime

    def ready(self, model: str) -> bool:
        return model in self.runtime.models()

    def input_spec(self, model: str) -> dict[str, tuple[list[int], str]] | None:
        if model not in self.runtime.models():
            return None
        return {k: (list(v[0]), str(v[1])) for k, v in self.runtime.input_spec(model).items()}

    def submit(self, req: codec.TensorRequest) -> Future:
        return submit_to_runtime(self.runtime, req,
                                 self._node.get_clock().now().nanoseconds * 1e-9)


def submit_to_runtime(rt: Any, req: codec.TensorRequest, node_now: float) -> Future:
    """``Runtime.submit`` for a decoded request; the returned future resolves to a response.

    The request's priority, deadline and ``drop_late`` go with this request only: the
    client's configuration in the runtime (``Runtime.configure_client``, owned by whoever
    configured it) is never changed, so concurrent callbacks cannot race on it. A request
    without a deadline gets the client's configured relative deadline, if any.
    """
    out: Future = Future()
    base = {"model": req.model, "client": req.client, "stamp": req.stamp,
            "frame_id": req.frame_id}
    try:
        deadline = runtime_deadline(rt.now(), node_now, req.stamp, req.deadline_s)
        fut = rt.submit(req.model, req.inputs, priority=req.priority, deadline=deadline,
                        client=req.client, drop_late=bool(req.drop_late))
    except Exception as exc:  # submit should not raise; answer anyway if it does
        out.set_result(codec.error_response(req.id, error_code(exc), str(exc), **base))
        return out

    def done(f: Future) -> None:
        exc = f.exception()
        if exc is not None:
            out.set_result(codec.error_response(req.id, error_code(exc), str(exc), **base))
            return
        res = f.result()
        dl = getattr(res, "deadline", None)
        out.set_result(codec.TensorResponse(
            id=req.id, ok=True, outputs=dict(res.outputs),
            timings=codec.timings_dict(res.timings, dl), **base))

    fut.add_done_callback(done)
    return out


class RemoteRuntimeClient(RuntimeClient):
    """Over topics: publishes requests, matches responses by id, times out lost ones.

    Ready once the host's model table names the model and both topics are matched (DDS
    drops what is published before discovery, so nothing is sent before that).
    """

    def __init__(self, node: Node, timeout_s: float = 5.0,
                 on_models: Callable[[dict[str, Any]], None] | None = None):
        self._node = node
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[Future, float]] = {}
        self._models: dict[str, Any] = {}
        self._on_models = on_models
        self._pub = node.create_publisher(UInt8MultiArray, REQUEST_TOPIC, REQUEST_QOS)
        self._sub = node.create_subscription(UInt8MultiArray, RESPONSE_TOPIC,
                                             self._on_response, REQUEST_QOS)
        self._models_sub = node.create_subscription(String, MODELS_TOPIC, self._on_models_msg,
                                                    LATCHED_QOS)
        self._timer = node.create_timer(0.25, self._expire)

    def _on_models_msg(self, msg: String) -> None:
        import json

        try:
            table = json.loads(msg.data)
            self._models = dict(table.get("models", {}))
        except (ValueError, AttributeError, TypeError):
            self._node.get_logger().warning("ignoring a malformed model table")
            return
        if self._on_models is not None:
            self._on_models(self._models)

    def ready(self, model: str) -> bool:
        return (model in self._models and self._pub.get_subscription_count() > 0
                and self._sub.get_publisher_count() > 0)

    def input_spec(self, model: str) -> dict[str, tuple[list[int], str]] | None:
        m = self._models.get(model)
        if m is None:
            return None
        return {k: (list(v["shape"]), str(v["dtype"])) for k, v in m["inputs"].items()}

    def submit(self, req: codec.TensorRequest) -> Future:
        fut: Future = Future()
        try:
            msg = to_msg(*codec.encode_request(req))
        except codec.CodecError as exc:
            fut.set_result(codec.error_response(req.id, exc.code, str(exc), model=req.model,
                                                client=req.client, stamp=req.stamp,
                                                frame_id=req.frame_id))
            return fut
        with self._lock:
            self._pending[req.id] = (fut, time.monotonic())
        self._pub.publish(msg)
        return fut

    def _on_response(self, msg: UInt8MultiArray) -> None:
        label, data = from_msg(msg)
        try:
            resp = codec.decode_response(label, data)
        except codec.CodecError as exc:
            self._node.get_logger().warning(f"malformed response dropped: {exc}")
            return
        with self._lock:
            entry = self._pending.pop(resp.id, None)
        if entry is not None:  # responses to other clients are not ours
            entry[0].set_result(resp)

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [k for k, (_, t0) in self._pending.items() if now - t0 > self.timeout_s]
            entries = [(k, self._pending.pop(k)[0]) for k in late]
        for rid, fut in entries:
            fut.set_result(codec.error_response(
                rid, "timeout", f"no response from the runtime host within {self.timeout_s} s"))

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        with self._lock:
            entries = list(self._pending.items())
            self._pending.clear()
        for rid, (fut, _) in entries:
            fut.set_result(codec.error_response(rid, "shutdown", "node shut down"))


def as_float_list(value: Any) -> list[float]:
    return [float(v) for v in np.asarray(value, dtype=np.float64).reshape(-1)]


#: Executors a process can spin its nodes on. ``single`` is the default: the runtime does
#: the heavy work on its own threads and node callbacks are short, while rclpy's
#: MultiThreadedExecutor busy-loops (ros2/rclpy#1223) and takes the GIL from the runtime:
#: measured with the demo on 2 cores (2 cameras at 30 Hz + a BE client), ~1-2 frames/s per
#: camera with ``multi`` (1 or 2 threads) against ~28 with ``single``.
EXECUTORS = ("single", "multi")


def make_executor(kind: str | None = None, num_threads: int | None = None,
                  context: Any = None) -> Any:
    """The executor to spin on: ``kind`` or $AV_INFER_EXECUTOR, else ``single``."""
    import os

    from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor

    kind = (kind or os.environ.get("AV_INFER_EXECUTOR") or "single").strip().lower()
    if kind == "single":
        return SingleThreadedExecutor(context=context)
    if kind == "multi":
        return MultiThreadedExecutor(num_threads=num_threads, context=context)
    raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {kind!r}")


def spin_nodes(make_nodes: Callable[[], list[Node]], args: list[str] | None = None,
               num_threads: int | None = None, executor_kind: str | None = None) -> None:
    """``main()`` body: init, build nodes, spin them (see ``make_executor``), clean up on
    Ctrl-C."""
    import sys

    import rclpy
    from rclpy.executors import ExternalShutdownException

    args = sys.argv if args is None else args
    rclpy.init(args=args)
    nodes: list[Node] = []
    executor = None
    refused: AvInferError | None = None
    try:
        try:
            nodes = make_nodes()
        except AvInferError as exc:  # a configuration error the node logged: no traceback
            refused = exc
        if refused is None:
            executor = make_executor(executor_kind, num_threads)
            for node in nodes:
                executor.add_node(node)
            executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception:
        if rclpy.ok():
            raise
        # Ctrl-C already shut the context down: a callback raced the teardown. Say so and
        # stop cleanly (a stop is not a failure); anything while running still propagates.
        import logging

        logging.getLogger("av_infer_nodes").warning(
            "exception while shutting down (after Ctrl-C)", exc_info=True)
    finally:
        if executor is not None:
            executor.shutdown(timeout_sec=2.0)
        for node in reversed(nodes):  # clients before the runtime host
            node.destroy_node()
        rclpy.try_shutdown()
    if refused is not None:
        raise SystemExit(f"av_infer: cannot start: {type(refused).__name__}: {refused}")
