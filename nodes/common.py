"""Pieces every av_infer node shares: parameter descriptors, ``av_infer_msgs`` message
glue, time conversion, debug topics, the executors, and the two ways to reach a runtime
(in-process or over the request topics).
"""

from __future__ import annotations

import array
import hashlib
import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
from av_infer_msgs.msg import (
    Float64Stamped,
    InferRequest,
    InferResponse,
    InferTimings,
    Tensor,
)
from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    ParameterType,
)
from rclpy.event_handler import (
    PublisherEventCallbacks,
    SubscriptionEventCallbacks,
    UnsupportedEventTypeError,
)
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import Header, String

from av_infer import AvInferError, UnknownModelError
from av_infer import tensor_codec as codec
from av_infer.tensor_codec import ros_text  # noqa: F401 - the nodes' name for it

REQUEST_TOPIC = "/av_infer/request"
RESPONSE_TOPIC = "/av_infer/response"
MODELS_TOPIC = "/av_infer/models"

#: Requests and responses: reliable, a queue deep enough for bursts of many clients.
REQUEST_QOS = QoSProfile(depth=64, history=HistoryPolicy.KEEP_LAST,
                         reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.VOLATILE)
#: A client's own response topic (``response_topic``): reliable and transient-local, so the
#: answers the host publishes on a topic it just created (on that client's first request,
#: before discovery matched the client's reader) are delivered once it matches: a volatile
#: writer would drop them. The depth bounds what the host keeps per client (the same 64 as
#: the shared topic, which all clients shared). Request ids must be unique per process run
#: (an image node's are its own uuid4 and a counter): a restarted client may be handed the
#: last answers of its previous run, whose ids match nothing pending and are ignored.
RESPONSE_QOS_CLIENT = QoSProfile(depth=64, history=HistoryPolicy.KEEP_LAST,
                                 reliability=ReliabilityPolicy.RELIABLE,
                                 durability=DurabilityPolicy.TRANSIENT_LOCAL)
#: How the runtime host answers (its ``response_routing`` parameter, announced in the model
#: table): ``per_client`` on ``response_topic(client)``, ``shared`` on ``RESPONSE_TOPIC``.
ROUTINGS = ("per_client", "shared")
#: The host's model table: latched, so late joiners get it.
LATCHED_QOS = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST,
                         reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)

#: QoS events of the endpoints av_infer creates: none handled on our side. rclpy's default
#: (``use_default_callbacks``) adds two ``EventHandler`` waitables per publisher and
#: subscription (incompatible QoS / type: a logged warning), and a single-threaded executor
#: rebuilds its wait set, every waitable included, on every iteration, including the one
#: between publishing an output and a subscriber in the same executor receiving it. Measured
#: in the demo's graph: an idle iteration 390-460 us with them, 240-260 us without
#: (docs/ros.md, "Executor iteration"). The peer of a mismatched endpoint (rclpy or rclcpp
#: with its defaults) still logs the incompatibility, and ``ros2 topic info -v`` shows both
#: sides' QoS.
PUB_EVENTS = PublisherEventCallbacks(use_default_callbacks=False)
SUB_EVENTS = SubscriptionEventCallbacks(use_default_callbacks=False)

_TYPES = {
    bool: ParameterType.PARAMETER_BOOL, int: ParameterType.PARAMETER_INTEGER,
    float: ParameterType.PARAMETER_DOUBLE, str: ParameterType.PARAMETER_STRING,
}

_ARRAY_TYPES = {str: Parameter.Type.STRING_ARRAY, float: Parameter.Type.DOUBLE_ARRAY,
                int: Parameter.Type.INTEGER_ARRAY}


def response_topic(client: str) -> str:
    """The topic a runtime host answers ``client``'s requests on (``per_client`` routing):
    ``/av_infer/response/<client>`` when the client id is a valid topic-name token (the
    perception node's default id, its node name, is), else ``/av_infer/response/id_`` and
    16 hex digits of the id's SHA-256 (ids with characters a topic name cannot carry).
    An empty id has no topic of its own: those requests are answered on ``RESPONSE_TOPIC``.
    Host and clients both name topics through this one function."""
    from rclpy.exceptions import InvalidTopicNameException
    from rclpy.validate_full_topic_name import validate_full_topic_name

    if not client:
        return RESPONSE_TOPIC
    name = f"{RESPONSE_TOPIC}/{client}"
    if "/" not in client and "~" not in client and "{" not in client and len(client) <= 128:
        try:
            validate_full_topic_name(name)
            return name
        except InvalidTopicNameException:
            pass
    digest = hashlib.sha256(client.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{RESPONSE_TOPIC}/id_{digest}"


def declare(node: Node, name: str, default: Any, description: str, *,
            read_only: bool = False, int_range: tuple[int, int] | None = None,
            float_range: tuple[float, float] | None = None,
            array_of: type | None = None, constraints: str = "") -> Any:
    """Declares one parameter with a full ParameterDescriptor; returns its value. The
    default is kept in ``declared_defaults(node)`` (the parameter schema is generated from
    the declarations: ``param_schema``)."""
    node.__dict__.setdefault("_av_declared_defaults", {})[name] = (
        list(default) if array_of is not None else default)
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


def declared_defaults(node: Node) -> dict[str, Any]:
    """Name -> default of every parameter ``declare`` declared on ``node``, in order."""
    return dict(node.__dict__.get("_av_declared_defaults", {}))


# -- messages ------------------------------------------------------------------------------
def new_tensor() -> Tensor:
    """An empty ``Tensor`` whose ``data`` setter keeps an ``array.array('B')`` as it is.

    rosidl's Python setters copy a sequence (``array.array('B', value)``) unless the message
    checks its fields (``check_fields``, default: $ROS_PYTHON_CHECK_FIELDS); with the check
    on, an ``array.array`` of the right type code is stored without a copy. So every tensor
    we fill is made here: the payload is copied once (``tensor_codec.fill_tensor``) or not
    at all (``MessageBuffers``), never again by the setter."""
    return Tensor(check_fields=True)


@dataclass
class Reply:
    """The answer to one request, before it becomes a message.

    ``outputs`` carries the outputs when ``code == "ok"``: numpy arrays from an in-process
    runtime, or read-only views of a runtime host's response bytes (``RemoteRuntimeClient``
    reads every answer from its bytes since 2026-11-28; ``Tensor`` messages no longer
    travel in a ``Reply``); ``tensor_msgs`` turns them into messages (one copy each), on
    the thread that publishes.
    """

    id: str
    code: str = "ok"
    message: str = ""
    model: str = ""
    outputs: Mapping[str, np.ndarray] | None = None
    #: a runtime ``Timings`` (local) or a host's ``InferTimings`` (remote: a
    #: ``tensor_codec.WireTimings`` read from the wire, or the message)
    timings: Any = None
    #: absolute runtime-clock deadline (local), for ``InferTimings.deadline_met``
    deadline: float | None = None
    #: the model that ran it (a variant group's choice; "" unless ok), its accuracy factor
    #: κ and the quality κ·V (paper 001; NaN unless ok)
    served_model: str = ""
    kappa: float = math.nan
    quality: float = math.nan

    @property
    def ok(self) -> bool:
        return self.code == "ok"

    def tensor_msgs(self) -> list[Tensor]:
        return [codec.fill_tensor(new_tensor(), n, v) for n, v in (self.outputs or {}).items()]

    def timings_msg(self, received: float | None = None, now: float | None = None
                    ) -> InferTimings:
        if isinstance(self.timings, InferTimings):
            return self.timings
        if isinstance(self.timings, codec.WireTimings):  # a host's, read from the wire
            return InferTimings(**self.timings._asdict())
        return codec.fill_timings(InferTimings(), self.timings, self.deadline, received, now)


def error_reply(rid: str, exc: BaseException, model: str = "") -> Reply:
    return Reply(id=rid, code=codec.error_code(exc), message=str(exc), model=model)


def response_msg(reply: Reply, header: Header, received: float | None = None,
                 now: float | None = None) -> InferResponse:
    """``reply`` as an ``InferResponse`` with the request's ``header``; outputs only when
    ok (one copy each, see ``Reply``)."""
    msg = InferResponse(header=header, id=ros_text(reply.id), code=reply.code,
                        status=codec.status_of(reply.code), message=ros_text(reply.message),
                        model=ros_text(reply.model), served_model=ros_text(reply.served_model),
                        kappa=float(reply.kappa), quality=float(reply.quality),
                        timings=reply.timings_msg(received, now))
    if reply.ok:
        msg.tensors = reply.tensor_msgs()
    return msg


def response_cdr(reply: Reply, stamp: tuple[int, int], frame_id: str,
                 received: float | None = None, now: float | None = None) -> bytes | None:
    """``reply`` as the serialised ``InferResponse`` :func:`response_msg` would make (the
    request's ``stamp``/``frame_id`` as its header), written without message objects
    (``tensor_codec.infer_response_cdr``: one copy of each output); None where an output
    is not a plain array of a wire dtype: the caller then builds the message, whose
    conversion raises what the wire refuses."""
    t = reply.timings
    timings = t if isinstance(t, InferTimings | codec.WireTimings) else codec.fill_timings(
        _TimingsFields(), t, reply.deadline, received, now)
    return codec.infer_response_cdr(
        stamp, ros_text(frame_id), ros_text(reply.id), reply.code, ros_text(reply.message),
        ros_text(reply.model), ros_text(reply.served_model), reply.kappa, reply.quality,
        timings, reply.outputs if reply.ok else None)


def answer_to(reply: Reply, request: WireRequest, received: float | None = None,
              now: float | None = None) -> bytes | InferResponse:
    """What a response publisher sends for ``reply`` to ``request``: the serialised
    ``InferResponse`` (:func:`response_cdr`, the request's header), the message where the
    bytes cannot be written, and where the wire refuses the answer itself (an output dtype
    it cannot carry) an ``internal_error`` answer saying why, so the request still gets
    exactly one. The runtime host's and the pipeline stage's answers."""
    frame = request.frame
    try:
        return (response_cdr(reply, (frame.sec, frame.nanosec), frame.frame_id, received, now)
                or response_msg(reply, request.header, received, now))
    except Exception as exc:  # noqa: BLE001 - e.g. an output the wire cannot carry
        return response_msg(Reply(id=reply.id, code="internal_error", message=str(exc),
                                  model=reply.model), request.header)


class _TimingsFields:
    """What ``tensor_codec.fill_timings`` sets (``InferTimings``' fields), without the
    message object (``response_cdr``)."""

    __slots__ = ("queueing_ms", "compute_ms", "total_ms", "preempted", "kernels_padded",
                 "has_deadline", "deadline_met")

    def __init__(self) -> None:
        self.preempted = self.kernels_padded = 0


class Every:
    """At most once every ``period_s`` (monotonic): what a node's repeated complaint (bytes
    that are no message, a decoder failing on every image) is logged through, so a stream
    of bad input costs one log line per period, not one per message."""

    __slots__ = ("period_s", "_last")

    def __init__(self, period_s: float = 5.0) -> None:
        self.period_s = period_s
        self._last = -math.inf

    def due(self) -> bool:
        """True (and the period starts again) when the last true answer is ``period_s``
        or more ago."""
        now = time.monotonic()
        if now - self._last < self.period_s:
            return False
        self._last = now
        return True


def stamp_seconds(stamp: tuple[int, int]) -> float:
    return stamp[0] + stamp[1] * 1e-9


def ros_now_ns(node: Node) -> int:
    """``node``'s ROS clock now (ns), as ``node.get_clock().now().nanoseconds`` reads it,
    without building the ``Time`` object (7 us warm, ~70 after a sleep on the dev VM, read
    once per image)."""
    handle = node.get_clock().handle
    with handle:
        return handle.get_now().nanoseconds


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


def describe_loaded_model(rt: Any, name: str) -> dict[str, Any]:
    """``describe_model`` of a loaded model (not a variant group) with what it was loaded
    with (``Runtime.model_info``): ``precision`` (``Plan.precision``), ``pinned``,
    ``weight_bytes`` and ``kernels``, as a ``ModelInfo`` message gives them. All fixed at
    load, so the latched table stays true until the model is unloaded."""
    info = rt.model_info(name)
    return {**describe_model(rt, name), "precision": str(info.plan.precision),
            "pinned": bool(info.pinned), "weight_bytes": int(info.weight_bytes),
            "kernels": int(info.kernels)}


def error_code(exc: BaseException) -> str:
    return codec.error_code(exc)


#: the debug topics, in ``DebugTopics.pubs`` order
DEBUG_TOPICS = ("processing_time_ms", "pipeline_latency_ms", "cyclic_time_ms")


class DebugTopics:
    """``~/debug/processing_time_ms``, ``~/debug/pipeline_latency_ms`` and
    ``~/debug/cyclic_time_ms`` (Autoware's perception-node debug topics, as
    ``av_infer_msgs/Float64Stamped``), each published only while it has a subscriber.

    Why: from Python the three publishes cost ~55 µs per input after an idle moment on the
    dev VM even with nobody listening (Fast DDS writes into the topic's history either way;
    rclpy's call is the cost), inside the ROS path that is held to ≤ 1 ms (docs/ros.md,
    "Diagnostics"); checking ``get_subscription_count()`` per input costs ~28 µs for three.
    So each publisher counts its subscribers from its ``matched`` events (delivered by the
    executor, like every other event: no call per input), starting from the count at its
    creation. Guaranteed: a topic with a subscriber gets a value for every input from the
    moment the executor has handled the subscriber's match (a subscriber that connects
    meanwhile misses at most the inputs of that moment, as one that connects a moment
    later would); on a middleware without matched events (``UnsupportedEventTypeError``)
    every value is published, as before."""

    __slots__ = ("pubs", "counts")

    def __init__(self, node: Node) -> None:
        #: subscribers per topic, from the matched events; None: not known, publish always
        self.counts: list[int] | None = [0, 0, 0]
        try:
            self.pubs = self._create(node, True)
        except UnsupportedEventTypeError:
            self.counts = None
            self.pubs = self._create(node, False)
            node.get_logger().info("debug topics: the middleware reports no matched "
                                   "events; every value is published")
            return
        for i, pub in enumerate(self.pubs):  # the matches made before the handlers were
            self.counts[i] = max(self.counts[i], pub.get_subscription_count())

    def _create(self, node: Node, matched: bool) -> tuple[Any, Any, Any]:
        """The three publishers, with matched-event handlers when ``matched``; a refusal
        on any of them destroys those already made before it propagates."""
        def events(i: int) -> PublisherEventCallbacks:
            if not matched:
                return PUB_EVENTS
            return PublisherEventCallbacks(matched=lambda info: self._matched(i, info),
                                           use_default_callbacks=False)

        pubs: list[Any] = []
        try:
            for i, name in enumerate(DEBUG_TOPICS):
                pubs.append(node.create_publisher(Float64Stamped, f"~/debug/{name}", 10,
                                                  event_callbacks=events(i)))
        except BaseException:
            for pub in pubs:
                node.destroy_publisher(pub)
            raise
        return tuple(pubs)  # type: ignore[return-value]

    def _matched(self, i: int, info: Any) -> None:
        self.counts[i] = max(0, int(info.current_count))  # type: ignore[index]

    def wanted(self, i: int) -> bool:
        """Topic ``i`` (``DEBUG_TOPICS`` order) has a subscriber (or that is not known)."""
        counts = self.counts
        return counts is None or counts[i] > 0

    @property
    def listened(self) -> bool:
        """Any of the three has a subscriber (or that is not known)."""
        counts = self.counts
        return counts is None or counts[0] > 0 or counts[1] > 0 or counts[2] > 0


def debug_publishers(node: Node, enabled: bool) -> DebugTopics | None:
    """The node's :class:`DebugTopics`, or None when ``debug_topics`` is off."""
    return DebugTopics(node) if enabled else None


def publish_cyclic(dbg: DebugTopics | None, node: Node, ms: float | None) -> None:
    """``~/debug/cyclic_time_ms``: the time between the starts of two consecutive input
    callbacks (Autoware's cyclic time: the node's actual period; None: the first input,
    nothing published). Published as serialised bytes
    (``tensor_codec.write_float64_stamped``), as the other two, while it has a subscriber."""
    if dbg is None or ms is None or not dbg.wanted(2):
        return
    dbg.pubs[2].publish(codec.write_float64_stamped(*_now_stamp(node), float(ms)))


def _now_stamp(node: Node) -> tuple[int, int]:
    """``node``'s ROS clock now as ``(sec, nanosec)``, from one read."""
    return divmod(ros_now_ns(node), 1_000_000_000)


def publish_debug(dbg: DebugTopics | None, node: Node, t_recv: float,
                  stamp: Any, cycle_ms: float | None = None) -> None:
    """Processing time (receipt -> now, monotonic) and pipeline latency (header stamp ->
    now, ROS time; skipped for a zero stamp), and ``cycle_ms`` on the cyclic-time topic
    when given (an image node publishes it with the image's answer, after the output, not
    in the callback's head before the inference), each to a topic with a subscriber
    (:class:`DebugTopics`; nothing is read or written while none has one). ``stamp``:
    anything with ``sec`` and ``nanosec`` (a ``Time`` message, an image node's ``Frame``).
    One ROS clock read, no message objects: each ``Float64Stamped`` is written as its 20
    serialised bytes (``Publisher.publish(bytes)``): the three publishes per input took
    43.9 µs with message objects and 19.3 as bytes, back to back on the dev VM
    (docs/ros.md, "Diagnostics")."""
    if dbg is None or not dbg.listened:
        return
    pubs = dbg.pubs
    sec, ns = _now_stamp(node)
    if dbg.wanted(0):
        pubs[0].publish(codec.write_float64_stamped(sec, ns,
                                                    (time.monotonic() - t_recv) * 1e3))
    if (stamp.sec or stamp.nanosec) and dbg.wanted(1):
        lat = ((sec - stamp.sec) * 1_000_000_000 + ns - stamp.nanosec) * 1e-6
        pubs[1].publish(codec.write_float64_stamped(sec, ns, float(lat)))
    if cycle_ms is not None and dbg.wanted(2):
        pubs[2].publish(codec.write_float64_stamped(sec, ns, float(cycle_ms)))


# -- reaching a runtime --------------------------------------------------------------------
class RuntimeClient:
    """Submits one request, returns a Future[Reply] that never raises (in-process, a
    request that ran to its end on the calling thread comes back as an :class:`Answered`,
    a resolved stand-in with the same ``done``/``result``/``add_done_callback``).

    ``LocalRuntimeClient`` calls ``Runtime.submit`` in-process (the container);
    ``RemoteRuntimeClient`` talks to a runtime host over /av_infer/request|response.
    ``input_buffers`` gives the arrays to preprocess into (the runtime's own task input
    buffers in-process: the only copy of the input on the way to the device).
    """

    def ready(self, model: str) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def input_spec(self, model: str) -> dict[str, tuple[list[int], str]] | None:
        raise NotImplementedError  # pragma: no cover

    def variant_groups(self) -> dict[str, dict[str, float]] | None:
        """The runtime's variant groups (name -> {model: κ}); None while not known."""
        raise NotImplementedError  # pragma: no cover

    def input_buffers(self, model: str) -> dict[str, np.ndarray]:
        spec = self.input_spec(model) or {}
        return {n: np.empty([max(int(d), 1) if isinstance(d, int) else 1 for d in s], dt)
                for n, (s, dt) in spec.items()}

    def submit(self, ctrl: codec.RequestControl, inputs: Mapping[str, np.ndarray],
               run_here: bool = False, clocks: tuple[float, float] | None = None) -> Future:
        """``run_here``: see ``submit_to_runtime`` (in-process only; ignored remotely).
        ``clocks``: ``(node ROS time, runtime clock)`` read together by the caller (the
        request's deadline is placed with them); None: read here."""
        raise NotImplementedError  # pragma: no cover

    def close(self) -> None:
        pass


class LocalRuntimeClient(RuntimeClient):
    """In-process: converts the request's ROS-time deadline to the runtime clock."""

    def __init__(self, node: Node, runtime: Any):
        self._node = node
        self.runtime = runtime

    def ready(self, model: str) -> bool:
        return model in self.runtime.models() or model in self.runtime.variant_groups()

    def input_spec(self, model: str) -> dict[str, tuple[list[int], str]] | None:
        try:  # one registry look-up (a model or a variant group), not ``ready`` then this
            spec = self.runtime.input_spec(model)
        except UnknownModelError:
            return None
        return {k: (list(v[0]), str(v[1])) for k, v in spec.items()}

    def variant_groups(self) -> dict[str, dict[str, float]] | None:
        return self.runtime.variant_groups()

    def input_buffers(self, model: str) -> dict[str, np.ndarray]:
        return self.runtime.input_buffers(model)

    def submit(self, ctrl: codec.RequestControl, inputs: Mapping[str, np.ndarray],
               run_here: bool = False, clocks: tuple[float, float] | None = None) -> Future:
        if clocks is None:
            return submit_to_runtime(self.runtime, ctrl, inputs,
                                     ros_now_ns(self._node) * 1e-9, run_here)
        return submit_to_runtime(self.runtime, ctrl, inputs, clocks[0], run_here, clocks[1])

    def now(self) -> float:
        """The runtime's clock (seconds)."""
        return self.runtime.now()


class Answered:
    """A future already resolved with ``reply``: what :func:`submit_to_runtime` returns
    for a request that ran to its end on the calling thread (``run_here``). Why not a
    resolved ``concurrent.futures.Future``: making, resolving and reading one (its
    ``Condition`` and lock) took ~40 µs per image after an idle moment on the dev VM, this
    ~8 (a `/tmp` loop, 2 ms sleep and an 8 MB touch between calls, 2026-11-28; on the
    perception node's path, docs/ros.md "ROS path cost"). What the nodes use of a future:
    ``done()`` (True), ``result()``, ``exception()`` (None), ``add_done_callback(fn)``
    (``fn(self)`` at once, as a done ``Future`` does), ``cancel()`` (False)."""

    __slots__ = ("_reply",)

    def __init__(self, reply: Reply):
        self._reply = reply

    def done(self) -> bool:
        return True

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> Reply:
        return self._reply

    def exception(self, timeout: float | None = None) -> None:
        return None

    def add_done_callback(self, fn: Callable[[Any], Any]) -> None:
        fn(self)


def submit_to_runtime(rt: Any, ctrl: codec.RequestControl, inputs: Mapping[str, np.ndarray],
                      node_now: float, run_here: bool = False,
                      rt_now: float | None = None) -> Future | Answered:
    """``Runtime.submit`` for a validated request; the future resolves to a ``Reply`` (an
    :class:`Answered` when it ran to its end here, ``run_here``).

    The request's priority, deadlines (soft and hard), variant group and ``drop_late`` go
    with this request only: the client's configuration in the runtime
    (``Runtime.configure_client``, owned by whoever configured it) is never changed. The
    future is resolved on the runtime's callback thread: whoever turns it into a message
    hands that to its node (``Handoff``). ``rt_now``: the runtime clock read together with
    ``node_now`` (None: read here); the deadline is ``rt_now + (stamp + relative -
    node_now)``, so the pair only needs to be read at one moment.

    ``run_here``: the calling thread runs the request's launches itself while its lane is
    idle (what a thread blocked in ``Runtime.infer`` does; the scheduler still decides
    what runs, and a busy lane is never waited for), so a request that finishes that way
    is resolved before this returns, on this thread, without the lane and callback thread
    hand-offs. The caller's thread is busy for that inference.
    """
    try:
        if rt_now is None:
            rt_now = rt.now()
        deadline = runtime_deadline(rt_now, node_now, ctrl.stamp, ctrl.deadline_s)
        hard = runtime_deadline(rt_now, node_now, ctrl.stamp, ctrl.hard_deadline_s)
        fut = rt.submit(ctrl.model, inputs, priority=ctrl.priority, deadline=deadline,
                        client=ctrl.client, drop_late=ctrl.drop_late, hard_deadline=hard,
                        variant_group=ctrl.variant_group, run_here=run_here)
    except Exception as exc:  # submit should not raise; answer anyway if it does
        return Answered(error_reply(ctrl.id, exc, ctrl.model))

    def reply_of(f: Future) -> Reply:
        exc = f.exception()
        if exc is not None:
            return error_reply(ctrl.id, exc, ctrl.model)
        res = f.result()
        return Reply(id=ctrl.id, model=ctrl.model, outputs=res.outputs, timings=res.timings,
                     deadline=getattr(res, "deadline", None), served_model=res.model,
                     kappa=res.kappa, quality=res.quality)

    if run_here and fut.done():  # ran here (Runtime.submit(run_here=True))
        return Answered(reply_of(fut))
    out: Future = Future()
    # once: the done-callback runs once, here if ``fut`` finished meanwhile
    fut.add_done_callback(lambda f: out.set_result(reply_of(f)))
    return out


class MessageBuffers(dict):
    """Input arrays that live in ``uint8[]`` message buffers (``array.array``): filled in
    place (e.g. by preprocessing), they become ``Tensor.data`` without a copy
    (``request_msg``). A replaced entry is copied as usual."""

    def __init__(self, spec: Mapping[str, tuple[list[int], str]]):
        self.raw: dict[str, array.array] = {}
        arrays = {}
        for name, (shape, dtype) in spec.items():
            dims = [max(int(d), 1) if isinstance(d, int) else 1 for d in shape]
            dt = np.dtype(dtype)
            raw = array.array("B", bytes(math.prod(dims) * dt.itemsize))
            self.raw[name] = raw
            arrays[name] = np.frombuffer(raw, dtype=dt).reshape(dims)
        super().__init__(arrays)
        self._own = dict(arrays)

    def tensor(self, name: str) -> Tensor | None:
        """A ``Tensor`` over the buffer of ``name`` if it is still this mapping's own."""
        view = self.get(name)
        if view is None or view is not self._own.get(name):
            return None
        t = new_tensor()
        t.data = self.raw[name]  # kept as it is: no copy (see new_tensor)
        return codec.spec_tensor(t, name, view.shape, view.dtype)


def request_msg(ctrl: codec.RequestControl, inputs: Mapping[str, np.ndarray]
                ) -> InferRequest:
    """An ``InferRequest`` for ``ctrl`` and ``inputs``: one copy of each input, none for
    the arrays of a ``MessageBuffers``."""
    msg = InferRequest(id=ctrl.id, model=ctrl.model, client=ctrl.client,
                       priority=codec.PRIORITY_OF[ctrl.priority], drop_late=ctrl.drop_late,
                       variant_group=ctrl.variant_group or "")
    msg.header.stamp.sec, msg.header.stamp.nanosec = ctrl.stamp
    msg.header.frame_id = ctrl.frame_id
    for field, rel in (("deadline", ctrl.deadline_s), ("hard_deadline", ctrl.hard_deadline_s)):
        if rel:
            ns = int(round(rel * 1e9))
            d = getattr(msg, field)
            d.sec, d.nanosec = divmod(ns, 1_000_000_000)
    own = inputs.tensor if isinstance(inputs, MessageBuffers) else (lambda n: None)
    msg.tensors = [own(n) or codec.fill_tensor(new_tensor(), n, v) for n, v in inputs.items()]
    return msg


class RemoteRuntimeClient(RuntimeClient):
    """Over topics: publishes requests, matches responses by id, times out lost ones.

    Where answers come from follows the host's ``response_routing``, which its model table
    announces: ``per_client``: only this client's own topic (``response_topic(client)``),
    so it never receives, nor deserialises, another client's answers; ``shared`` (and a
    host whose table does not say: before routing existed): ``RESPONSE_TOPIC``, every
    client's answers, matched here by id. Ready once the host's model table names the
    model (or variant group) and the request topic is matched (DDS drops what is published
    before discovery, so nothing is sent before that); on the shared topic the response
    topic must be matched too. A per-client topic's publisher is made by the host on this
    client's first request and keeps its answers until this reader matches
    (``RESPONSE_QOS_CLIENT``). Answers are read from their serialised bytes (a raw
    subscription, :meth:`_on_response`): outputs as checked read-only arrays, no message
    objects (docs/ros.md, "Responses (and requests) as bytes, both ends").
    """

    def __init__(self, node: Node, timeout_s: float = 5.0,
                 on_models: Callable[[dict[str, Any]], None] | None = None,
                 client: str = ""):
        self._node = node
        self.timeout_s = timeout_s
        #: the client id of this client's requests (its per-client topic's name)
        self.client = client
        #: the host's routing, from its model table (None until the table arrived)
        self.routing: str | None = None
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[Future, float, str]] = {}
        self._models: dict[str, Any] = {}
        #: the host's variant groups (name -> {model: κ}); None until its table arrived
        self._groups: dict[str, dict[str, float]] | None = None
        self._on_models = on_models
        self._pub = node.create_publisher(InferRequest, REQUEST_TOPIC, REQUEST_QOS,
                                          event_callbacks=PUB_EVENTS)
        self._sub: Any = None
        self._models_sub = node.create_subscription(String, MODELS_TOPIC, self._on_models_msg,
                                                    LATCHED_QOS, event_callbacks=SUB_EVENTS)
        self._timer = node.create_timer(0.25, self._expire)
        #: messages on the response topic that were no ``InferResponse`` (ignored)
        self.unreadable = 0
        self._unreadable_log = Every()

    def _on_models_msg(self, msg: String) -> None:
        import json

        try:
            table = json.loads(msg.data)
            models = dict(table.get("models", {}))
            groups = dict(table.get("variant_groups") or {})
            # a group takes its variants' tensors: requests may name it like a model
            self._models = {**{g: {"inputs": v["inputs"], "outputs": v["outputs"]}
                               for g, v in groups.items()}, **models}
            self._groups = {g: dict(v["variants"]) for g, v in groups.items()}
            routing = table.get("response_routing") or "shared"
        except (ValueError, AttributeError, TypeError, KeyError):
            self._node.get_logger().warning("ignoring a malformed model table")
            return
        self._follow_routing(routing if routing in ROUTINGS else "shared")
        if self._on_models is not None:
            self._on_models(self._models)

    def _follow_routing(self, routing: str) -> None:
        """Subscribes to where the host answers this client (on the executor thread)."""
        per_client = routing == "per_client" and bool(self.client)
        topic = response_topic(self.client) if per_client else RESPONSE_TOPIC
        if self._sub is not None and self._sub.topic_name == topic:
            self.routing = routing
            return
        if self._sub is not None:
            self._node.destroy_subscription(self._sub)
        self._sub = self._node.create_subscription(
            InferResponse, topic, self._on_response,
            RESPONSE_QOS_CLIENT if per_client else REQUEST_QOS, event_callbacks=SUB_EVENTS,
            raw=True)
        self.routing = routing

    @property
    def response_topic(self) -> str | None:
        """The topic this client's answers come on (None until the host's table arrived)."""
        return None if self._sub is None else self._sub.topic_name

    def ready(self, model: str) -> bool:
        if self._sub is None or model not in self._models:
            return False
        if self._pub.get_subscription_count() == 0:
            return False
        # per client: the host makes the topic's publisher on the first request
        return self._sub.topic_name != RESPONSE_TOPIC or self._sub.get_publisher_count() > 0

    def variant_groups(self) -> dict[str, dict[str, float]] | None:
        return self._groups

    def input_buffers(self, model: str) -> dict[str, np.ndarray]:
        """Arrays inside the request message's own buffers (``MessageBuffers``)."""
        return MessageBuffers(self.input_spec(model) or {})

    def input_spec(self, model: str) -> dict[str, tuple[list[int], str]] | None:
        m = self._models.get(model)
        if m is None:
            return None
        return {k: (list(v["shape"]), str(v["dtype"])) for k, v in m["inputs"].items()}

    def model_precision(self, model: str) -> str | None:
        """The precision the host's model table gives ``model`` (None: not in the table,
        a variant group, or a host whose table names no precision)."""
        prec = (self._models.get(model) or {}).get("precision")
        return prec if isinstance(prec, str) else None

    def model_pinned(self, model: str) -> bool | None:
        """Whether the host's model table gives ``model`` as pinned (None: not in the
        table, a variant group, or a host whose table does not say)."""
        pinned = (self._models.get(model) or {}).get("pinned")
        return pinned if isinstance(pinned, bool) else None

    def held_settings(self, model: str) -> list[tuple[str, str | None, bool | None]]:
        """(model, precision, pinned) the host's table gives ``model``, or each variant of
        the variant group ``model`` names (None where the table does not say): what a
        remote image node compares its ``precision`` and ``pin`` with."""
        names = list((self._groups or {}).get(model) or ()) or [model]
        return [(n, self.model_precision(n), self.model_pinned(n)) for n in names]

    def submit(self, ctrl: codec.RequestControl, inputs: Mapping[str, np.ndarray],
               run_here: bool = False, clocks: tuple[float, float] | None = None) -> Future:
        fut: Future = Future()
        try:  # as bytes, no message objects; the message where the bytes cannot be written
            msg = codec.infer_request_cdr(ctrl, inputs) or request_msg(ctrl, inputs)
        except codec.CodecError as exc:
            fut.set_result(error_reply(ctrl.id, exc, ctrl.model))
            return fut
        with self._lock:
            self._pending[ctrl.id] = (fut, time.monotonic(), ctrl.model)
        self._pub.publish(msg)
        return fut

    def _on_response(self, data: bytes) -> None:
        """A response's serialised bytes (a ``raw=True`` subscription: no message objects;
        ``tensor_codec.read_infer_response_cdr``): bytes that are no response are counted
        (``unreadable``) and logged at most every 5 s (no request can be matched to them:
        it times out); others are :meth:`_received`."""
        try:
            resp = codec.read_infer_response_cdr(data)
        except ValueError as exc:
            self.unreadable += 1
            if self._unreadable_log.due():
                self._node.get_logger().error(f"ignoring bytes that are no response: {exc}")
            return
        self._received(resp)

    def _received(self, resp: codec.WireResponse) -> None:
        """Resolves the request ``resp`` answers, if it is one of this client's: its
        outputs as read-only arrays over the received bytes, checked as any received
        tensors are (a response whose outputs fail the checks answers the request with
        ``internal_error`` naming why)."""
        with self._lock:
            entry = self._pending.pop(resp.id, None)
        if entry is None:  # responses to other clients are not ours
            return
        code, message, outputs = resp.code or "internal_error", resp.message, None
        if code == "ok":
            try:
                outputs = resp.outputs()
            except (codec.CodecError, ValueError) as exc:
                code, message = "internal_error", f"the host's outputs cannot be read: {exc}"
        entry[0].set_result(Reply(id=resp.id, code=code, message=message, model=resp.model,
                                  outputs=outputs, timings=resp.timings,
                                  served_model=resp.served_model, kappa=resp.kappa,
                                  quality=resp.quality))

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [k for k, (_, t0, _) in self._pending.items() if now - t0 > self.timeout_s]
            entries = [(k, self._pending.pop(k)) for k in late]
        for rid, (fut, _, model) in entries:
            fut.set_result(Reply(id=rid, code="timeout", model=model, message=(
                f"no response from the runtime host within {self.timeout_s} s")))

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def destroy(self) -> None:
        """Answers what is pending (``close``) and removes the topics and timer."""
        self.close()
        self._node.destroy_publisher(self._pub)
        if self._sub is not None:
            self._node.destroy_subscription(self._sub)
        self._node.destroy_subscription(self._models_sub)
        self._node.destroy_timer(self._timer)

    def close(self) -> None:
        with self._lock:
            entries = list(self._pending.items())
            self._pending.clear()
        for rid, (fut, _, model) in entries:
            fut.set_result(Reply(id=rid, code="shutdown", message="node shut down",
                                 model=model))


def as_float_list(value: Any) -> list[float]:
    return [float(v) for v in np.asarray(value, dtype=np.float64).reshape(-1)]


#: Executors a process can spin its nodes on: ``lean`` (``lean_executor.LeanExecutor``,
#: the default, by measurement), rclpy's SingleThreadedExecutor, MultiThreadedExecutor and
#: ``rclpy.experimental.EventsExecutor``. The demo graph measured under each (docs/ros.md,
#: "Executor"): ``lean`` is rclpy's single-threaded executor with a cheaper iteration and
#: the data path (subscriptions, guard conditions) waited on by a thread of its own, one
#: callback at a time: the output's hop to a subscriber in the same process 0.4 ms instead
#: of 1.1-1.2, the demo's ROS overhead lower in every alternating pair; ``single`` keeps
#: both cameras at their 30 frames/s with no deadline miss; ``multi`` busy-loops
#: (ros2/rclpy#1223) and takes the GIL from the runtime (fewer frames/s, deadline misses,
#: more ROS overhead); ``events`` (rclpy 7.1.6) cannot run these nodes: its spin raises
#: "Guard conditions not supported" (the nodes' ``Handoff`` is a guard condition) and
#: adding a node or creating a subscription blocks while it spins. It stays selectable so
#: that can be re-measured.
EXECUTORS = ("single", "multi", "events", "lean")
DEFAULT_EXECUTOR = "lean"


def make_executor(kind: str | None = None, num_threads: int | None = None,
                  context: Any = None) -> Any:
    """The executor to spin on: ``kind`` or $AV_INFER_EXECUTOR, else ``DEFAULT_EXECUTOR``."""
    import os

    from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor

    kind = (kind or os.environ.get("AV_INFER_EXECUTOR") or DEFAULT_EXECUTOR).strip().lower()
    if kind == "single":
        return SingleThreadedExecutor(context=context)
    if kind == "multi":
        return MultiThreadedExecutor(num_threads=num_threads, context=context)
    if kind == "events":
        from rclpy.experimental import EventsExecutor

        return EventsExecutor(context=context)
    if kind == "lean":
        from av_infer_nodes.lean_executor import LeanExecutor

        return LeanExecutor(context=context)
    raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {kind!r}")


def spin_nodes(make_nodes: Callable[[], list[Node]], args: list[str] | None = None,
               num_threads: int | None = None, executor_kind: str | None = None) -> None:
    """``main()`` body: init, build nodes, spin them (see ``make_executor``), clean up on
    Ctrl-C, and end the process there (``_exit_after_cleanup``)."""
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
    _exit_after_cleanup()


def _exit_after_cleanup() -> None:
    """End a node process once its nodes are destroyed and rclpy is shut down, without
    interpreter finalization. Finalization races the DDS library's own threads: on a busy
    machine about one Ctrl-C in twenty ended a node process with SIGSEGV there, after our
    cleanup, in a thread that is not Python's (tests/nodes/test_ros_multiprocess.py, the
    perception node beside two busy loops; the workaround rmw_fastrtps issue 761 names).
    What our code writes is flushed first; nothing it holds needs a finalizer."""
    import logging
    import os
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


class Frame:
    """A received message's header as a node keeps it past its callback (an image's: what
    the outputs, errors, detections and listeners carry of it; a request's, in
    :class:`WireRequest`). ``header`` is the ``std_msgs/Header``, built on first use: what
    is written as bytes needs none."""

    __slots__ = ("sec", "nanosec", "frame_id", "_header", "cycle_ms")

    def __init__(self, sec: int, nanosec: int, frame_id: str):
        self.sec, self.nanosec, self.frame_id = sec, nanosec, frame_id
        self._header: Header | None = None
        #: ms since the previous image's callback began (None: the first image): published
        #: on ``~/debug/cyclic_time_ms`` with the image's answer, not before its inference
        self.cycle_ms: float | None = None

    @property
    def header(self) -> Header:
        if self._header is None:
            h = Header(frame_id=self.frame_id)
            h.stamp.sec, h.stamp.nanosec = self.sec, self.nanosec
            self._header = h
        return self._header


class WireRequest:
    """An ``InferRequest`` read from its serialised bytes (the host's raw subscription:
    ``tensor_codec.read_infer_request``), with the fields the host reads under the
    message's names: ``header`` (built on first use), ``id``, ``model``, ``client``,
    ``priority``, ``deadline``/``hard_deadline`` (``.sec``, ``.nanosec``), ``drop_late``,
    ``variant_group`` and ``tensors`` (``tensor_codec.WireTensor``: their ``data`` views of
    the bytes, no copy). ValueError (naming the field) if the bytes are not one."""

    __slots__ = ("frame", "id", "model", "client", "priority", "deadline", "drop_late",
                 "hard_deadline", "variant_group", "tensors")

    def __init__(self, data: bytes) -> None:
        (sec, nanosec, frame_id, self.id, self.model, self.client, self.priority,
         deadline, self.drop_late, hard, self.variant_group,
         tensors) = codec.read_infer_request(data)
        self.frame = Frame(sec, nanosec, frame_id)
        self.deadline, self.hard_deadline = codec.Duration(*deadline), codec.Duration(*hard)
        self.tensors = codec.wire_tensors(tensors)

    @classmethod
    def nothing(cls) -> WireRequest:
        """What the host answers bytes that are no request as: no id, no client (the
        shared response topic), an empty header."""
        r = cls.__new__(cls)
        r.frame, r.id, r.model, r.client, r.variant_group = Frame(0, 0, ""), "", "", "", ""
        r.priority, r.drop_late, r.tensors = 0, False, []
        r.deadline = r.hard_deadline = codec.Duration(0, 0)
        return r

    @property
    def header(self) -> Header:
        return self.frame.header
