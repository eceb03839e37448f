"""A pool-pipeline stage process (paper 004 across processes), and the lane that reaches it.

``PipelineStageNode`` hosts one av_infer ``Runtime`` (one pool member). Under
``/av_infer/pipeline/<stage_id>/`` it

* takes ``load`` orders (``std_msgs/String`` JSON ``{"stage", "model", "variant",
  "n_blocks", "first", "end"}`` or ``{"unload": stage}``), cuts the zoo model itself
  (partitioning is deterministic, no ONNX crosses the wire) and latches the loaded stage
  names on ``ready``;
* answers every ``request`` (``av_infer_msgs/InferRequest``: the stage name and the
  feature maps as typed tensors; read from its serialised bytes) with exactly one
  ``response`` (``av_infer_msgs/InferResponse``, written as bytes), outputs or a typed
  error; a malformed feature-map message, or bytes that are no request, is answered
  (``malformed_request`` / ``malformed_feature_map``), never crashes it;
* publishes a heartbeat on ``alive`` (``av_infer_msgs/Float64Stamped``, seconds up).

The feature maps ride the request's priority and deadline, so the stage's runtime orders
them with its own policy: RT work on that device still preempts pipeline work.

``RemoteLane`` is the executor's side (``av_infer.pipeline.executor.Lane``): it publishes
orders and requests and resolves futures from responses. A lane whose heartbeat stops for
``dead_after_s`` is dead: its in-flight requests fail with ``stage_failed`` and the
executor re-plans onto the lanes left.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np
from av_infer_msgs.msg import Float64Stamped, InferRequest, InferResponse
from av_infer_nodes.common import (
    LATCHED_QOS,
    REQUEST_QOS,
    Reply,
    WireRequest,
    answer_to,
    declare,
    error_reply,
    request_msg,
    ros_text,
    spin_nodes,
)
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from av_infer import AvInferError, InvalidInputError, error_from_code
from av_infer import tensor_codec as codec
from av_infer.pipeline import MalformedFeatureMapError, StageFailedError, StageSpec, widen

PREFIX = "/av_infer/pipeline"
#: load orders: reliable and kept for a stage that starts late; deep enough that a burst
#: of orders (a migration's unloads) is not overwritten before delivery
ORDER_QOS = QoSProfile(depth=64, history=HistoryPolicy.KEEP_LAST,
                       reliability=ReliabilityPolicy.RELIABLE,
                       durability=DurabilityPolicy.TRANSIENT_LOCAL)


def topic(stage_id: str, leaf: str) -> str:
    return f"{PREFIX}/{stage_id}/{leaf}"


class PipelineStageNode(Node):
    """One pool member in its own process (see the module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("pipeline_stage", **kwargs)
        self.stage_id = declare(self, "stage_id", "stage0",
                                "topics live under /av_infer/pipeline/<stage_id>/",
                                read_only=True)
        device = declare(self, "device", "cpu", "the av_infer device of this member: "
                         "auto or a wall-clock device (runtime_node.DEVICES)", read_only=True)
        self.max_lifetime_s = declare(
            self, "max_lifetime_s", 0.0, "exit after this many seconds (0: run until "
            "stopped); bounds test and demo processes", read_only=True,
            float_range=(0.0, 1e6))
        hb = declare(self, "heartbeat_s", 0.1, "period of the alive heartbeat",
                     read_only=True, float_range=(0.01, 10.0))
        from av_infer_nodes.runtime_node import make_runtime

        self.runtime = make_runtime(device)[0]  # refuses the simulator's virtual time
        self._lock = threading.Lock()
        self._loaded: list[str] = []
        self._t0 = time.monotonic()
        self._ready = self.create_publisher(String, topic(self.stage_id, "ready"), LATCHED_QOS)
        self._resp = self.create_publisher(InferResponse, topic(self.stage_id, "response"),
                                           REQUEST_QOS)
        self._alive = self.create_publisher(Float64Stamped, topic(self.stage_id, "alive"),
                                            REQUEST_QOS)
        self.create_subscription(String, topic(self.stage_id, "load"), self._on_load,
                                 ORDER_QOS)
        self.create_subscription(InferRequest, topic(self.stage_id, "request"),
                                 self._on_request, REQUEST_QOS, raw=True)
        self.create_timer(hb, self._beat)
        self._publish_ready()

    # -- orders -----------------------------------------------------------------------------
    def _on_load(self, msg: String) -> None:
        try:
            order = json.loads(msg.data)
            if "unload" in order:
                name = str(order["unload"])
                with self._lock:
                    if name in self._loaded:
                        self.runtime.unload_model(name)
                        self._loaded.remove(name)
            else:
                name = str(order["stage"])
                spec = StageSpec(str(order["model"]), str(order["variant"]),
                                 int(order["n_blocks"]), int(order["first"]), int(order["end"]))
                with self._lock:
                    if name not in self._loaded:
                        self.runtime.load_model(name, spec.build(), whole=True)
                        self._loaded.append(name)
        except (ValueError, KeyError, TypeError, AvInferError) as e:
            self.get_logger().error(f"load order {msg.data[:200]!r} refused: {e}")
        self._publish_ready()

    def _publish_ready(self) -> None:
        with self._lock:
            names = list(self._loaded)
        self._ready.publish(String(data=json.dumps({"loaded": names})))

    def _beat(self) -> None:
        up = time.monotonic() - self._t0
        msg = Float64Stamped(data=up)
        msg.stamp = self.get_clock().now().to_msg()
        self._alive.publish(msg)
        if self.max_lifetime_s and up > self.max_lifetime_s:
            self.get_logger().info(f"max_lifetime_s={self.max_lifetime_s} reached; exiting")
            raise SystemExit(0)

    # -- requests ---------------------------------------------------------------------------
    def _on_request(self, raw: bytes) -> None:
        """Answer the request in ``raw`` (its serialised bytes: ``WireRequest``, the feature
        maps views of the bytes, copied once by ``submit``) exactly once, whatever it
        holds; the answer written as bytes where it can be (``answer_to``). Bytes that are
        no request are answered ``malformed_request`` without an id."""
        try:
            msg = WireRequest(raw)
        except ValueError as exc:
            self._answer(Reply(id="", code=codec.MALFORMED,
                               message=f"not an InferRequest: {exc}"), WireRequest.nothing())
            return
        rid = codec.read_id(msg)
        try:
            ctrl = codec.read_control(msg)
            spec = self.runtime.input_spec(ctrl.model)
            views = widen(codec.check_tensors(msg.tensors, request_id=ctrl.id), spec)
            try:
                codec.check_spec(ctrl.model, spec, views)
            except InvalidInputError as e:
                raise MalformedFeatureMapError(str(e)) from None
            deadline = (self.runtime.now() + ctrl.deadline_s) if ctrl.deadline_s else None
            fut = self.runtime.submit(ctrl.model, views, priority=ctrl.priority,
                                      deadline=deadline, client=ctrl.client)
        except (codec.CodecError, AvInferError) as e:
            self._answer(error_reply(rid, e, ros_text(str(msg.model))), msg)
            return
        except Exception as e:  # noqa: BLE001 - anything else is still answered
            self._answer(error_reply(rid, e, ""), msg)
            return
        model = ctrl.model

        def done(f: Future) -> None:
            exc = f.exception()
            if exc is not None:
                reply = error_reply(rid, exc, model)
            else:
                reply = Reply(id=rid, model=model, outputs=f.result().outputs,
                              timings=f.result().timings, deadline=deadline)
            self._answer(reply, msg)

        fut.add_done_callback(done)

    def _answer(self, reply: Reply, request: WireRequest) -> None:
        """``reply`` on ``response`` with ``request``'s header, as bytes where they can be
        written; an answer the wire refuses (an output dtype) as ``internal_error``."""
        self._resp.publish(answer_to(reply, request))

    def destroy_node(self) -> None:
        self.runtime.close(drain=False)
        super().destroy_node()


class RemoteLane:
    """A :class:`PipelineStageNode` as a pool member of an executor in this process."""

    def __init__(self, node: Node, stage_id: str, dead_after_s: float = 3.0,
                 wait_s: float = 120.0, window: int = 8) -> None:
        self.name = stage_id
        self.node = node
        self.dead_after_s = float(dead_after_s)
        self.wait_s = float(wait_s)
        self._cv = threading.Condition()
        self._loaded: set[str] = set()
        self._inflight: dict[str, Future] = {}
        #: request id -> when it is failed if still unanswered (its deadline, else wait_s,
        #: plus dead_after_s): a request or response lost on the wire is still answered
        self._expiry: dict[str, float] = {}
        self.expired = 0
        # at most `window` requests on the wire: the request/response topics keep the last
        # REQUEST_QOS.depth samples, so a larger burst could overwrite unacknowledged ones;
        # and with 32 (half the depth) the lane's reliable writer stopped delivering to a
        # live stage after bursts (docs/pipeline.md, "Request stream stall"): 8 (the default)
        # keeps a stage busy (it runs one or two requests at a time) without that
        self.window = max(1, min(int(window), REQUEST_QOS.depth // 2))
        self._backlog: deque[tuple[str, InferRequest | bytes, Future]] = deque()
        self._ids = itertools.count(1)
        self._last_beat: float | None = None
        self._dead = False
        self.on_death: list[Any] = []
        self.unmatched = 0  # responses matching no request in flight
        self._load_pub = node.create_publisher(String, topic(stage_id, "load"), ORDER_QOS)
        self._req_pub = node.create_publisher(InferRequest, topic(stage_id, "request"),
                                              REQUEST_QOS)
        node.create_subscription(String, topic(stage_id, "ready"), self._on_ready, LATCHED_QOS)
        node.create_subscription(InferResponse, topic(stage_id, "response"), self._on_response,
                                 REQUEST_QOS, raw=True)
        node.create_subscription(Float64Stamped, topic(stage_id, "alive"), self._on_beat,
                                 REQUEST_QOS)
        node.create_timer(min(0.5, self.dead_after_s / 4), self._watch)

    @property
    def alive(self) -> bool:
        return not self._dead

    @property
    def loaded(self) -> set[str]:
        """Stage names the process last reported loaded."""
        with self._cv:
            return set(self._loaded)

    def wait_alive(self) -> None:
        """Block until the stage's heartbeat and request subscription are seen."""
        deadline = time.monotonic() + self.wait_s
        with self._cv:
            while (self._last_beat is None or self._req_pub.get_subscription_count() == 0):
                if time.monotonic() > deadline:
                    raise StageFailedError(f"stage {self.name} did not come up")
                self._cv.wait(0.05)

    # -- Lane ---------------------------------------------------------------------------
    def load(self, stage: str, spec: StageSpec) -> None:
        self._order({"stage": stage, "model": spec.model, "variant": spec.variant,
                     "n_blocks": spec.n_blocks, "first": spec.first, "end": spec.end})
        deadline = time.monotonic() + self.wait_s
        with self._cv:
            while stage not in self._loaded:
                if self._dead or time.monotonic() > deadline:
                    raise StageFailedError(f"stage {self.name} did not load {stage}")
                self._cv.wait(0.05)

    def unload(self, stage: str) -> None:
        self._order({"unload": stage})

    def _order(self, doc: Mapping[str, Any]) -> None:
        self._load_pub.publish(String(data=json.dumps(doc)))

    def run(self, stage: str, inputs: Mapping[str, np.ndarray], priority: str,
            deadline_in_s: float) -> Future:
        fut: Future = Future()
        rid = f"{self.name}-{next(self._ids)}"
        finite = deadline_in_s != float("inf") and deadline_in_s > 0
        expiry = time.monotonic() + (deadline_in_s if finite else self.wait_s) \
            + self.dead_after_s
        feature_maps = {n: np.ascontiguousarray(v) for n, v in inputs.items()}
        ctrl = codec.RequestControl(id=rid, model=stage, client="pipeline", priority=priority,
                                    stamp=(0, 0), frame_id="",
                                    deadline_s=deadline_in_s if finite else None,
                                    drop_late=False)
        # as bytes, the message where they cannot be written (as RemoteRuntimeClient.submit)
        msg = codec.infer_request_cdr(ctrl, feature_maps) or request_msg(ctrl, feature_maps)
        with self._cv:  # the death check under the lock: _watch fails what it finds here
            if self._dead:
                fut.set_exception(StageFailedError(f"stage {self.name} is dead"))
                return fut
            self._expiry[rid] = expiry
            if len(self._inflight) >= self.window:
                self._backlog.append((rid, msg, fut))
                return fut
            self._inflight[rid] = fut
        self._req_pub.publish(msg)
        return fut

    def _send_backlog(self) -> None:
        while True:
            with self._cv:
                if self._dead or not self._backlog or len(self._inflight) >= self.window:
                    return
                rid, msg, fut = self._backlog.popleft()
                self._inflight[rid] = fut
            self._req_pub.publish(msg)

    # -- callbacks ----------------------------------------------------------------------
    def _on_ready(self, msg: String) -> None:
        try:
            names = set(json.loads(msg.data).get("loaded", []))
        except (ValueError, AttributeError):
            return
        with self._cv:
            self._loaded = names
            self._cv.notify_all()

    def _on_beat(self, _msg: Float64Stamped) -> None:
        with self._cv:
            self._last_beat = time.monotonic()
            self._cv.notify_all()

    def _on_response(self, raw: bytes) -> None:
        """A stage's answer from its serialised bytes (``read_infer_response_cdr``): the
        outputs copied out of the bytes (writable arrays the executor owns), or the typed
        error; an answer whose outputs fail the checks fails its request
        (``MalformedFeatureMapError``); bytes that are no response are counted with
        ``unmatched`` (their request, if any, expires)."""
        try:
            msg = codec.read_infer_response_cdr(raw)
        except ValueError:
            with self._cv:
                self.unmatched += 1
            return
        with self._cv:
            fut = self._inflight.pop(msg.id, None)
            if fut is None:  # not ours, a duplicate, or failed already (death, expiry)
                self.unmatched += 1
                return
            self._expiry.pop(msg.id, None)
        self._send_backlog()
        if msg.code != "ok":
            fut.set_exception(error_from_code(msg.code, msg.message))
            return
        try:
            outputs = msg.outputs()
        except (codec.CodecError, ValueError) as exc:
            fut.set_exception(MalformedFeatureMapError(
                f"stage {self.name} answered outputs that cannot be read: {exc}"))
            return
        fut.set_result({k: np.array(v) for k, v in outputs.items()})

    def _watch(self) -> None:
        now = time.monotonic()
        with self._cv:
            overdue = [rid for rid, t in self._expiry.items() if t < now and rid in self._inflight]
            late = {rid: self._inflight.pop(rid) for rid in overdue}
            for rid in overdue:
                self._expiry.pop(rid, None)
            self.expired += len(late)
        for rid, fut in late.items():  # lost on the wire (or the stage lost it): answered
            fut.set_exception(StageFailedError(
                f"stage {self.name}: no response to {rid} by its deadline"))
        if late:
            self._send_backlog()
        with self._cv:
            beat = self._last_beat
            if self._dead or beat is None or now - beat < self.dead_after_s:
                return
            self._dead = True
            lost, self._inflight = self._inflight, {}
            lost.update({rid: f for rid, _, f in self._backlog})
            self._backlog.clear()
            self._expiry.clear()
            self._cv.notify_all()
        err = StageFailedError(f"stage {self.name}: no heartbeat for {self.dead_after_s:g} s")
        for fut in lost.values():
            fut.set_exception(err)
        for cb in list(self.on_death):
            cb(self)


def main(args: list[str] | None = None) -> None:
    """One stage process: ``python -m av_infer_nodes.pipeline_stage_node --ros-args -p
    stage_id:=stage0``."""
    spin_nodes(lambda: [PipelineStageNode()], args)


if __name__ == "__main__":
    main()
