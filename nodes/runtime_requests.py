"""The runtime host's request endpoint: /av_infer/request in, each answer on its
client's /av_infer/response/<client> (``response_routing`` per_client) or the shared
/av_infer/response; every request answered exactly once (even malformed, even while
inactive; bytes that are no request too). The request is read from its serialised bytes
(``WireRequest``: a raw subscription, no message objects, payloads views of the bytes).
The split control/data path: control fields are read and validated first
(``tensor_codec.read_control``), the client's allow-list (``client_models``) is applied,
tensor metadata is checked against the limits and the model's input spec before anything
is allocated, then each payload is copied once into the task's input buffers. Answers are
encoded and published on the node's executor (``Handoff``), never on the runtime's
threads. ``RequestEndpoint`` holds the handlers; ``RuntimeNode`` (which inherits them)
creates the subscription and publishers and owns the in-flight count.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import rclpy
from av_infer_msgs.msg import InferResponse
from av_infer_nodes.common import (
    PUB_EVENTS,
    RESPONSE_QOS_CLIENT,
    Reply,
    WireRequest,
    answer_to,
    error_reply,
    publish_cyclic,
    publish_debug,
    response_topic,
    ros_text,
    submit_to_runtime,
)

from av_infer import NotAllowedError, UnknownModelError
from av_infer import tensor_codec as codec

#: ``client_models`` entries: ``CLIENT=MODEL[,MODEL...]``; ``*`` as CLIENT: every client
#: without an entry of its own.
ANY_CLIENT = "*"


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


class RequestEndpoint:
    """The request/response handlers, a part of ``RuntimeNode`` (they use its ``p``,
    ``runtime``, ``active``, ``limits``, ``allow``, ``_lock``, ``_in_flight``, ``_idle``,
    ``_handoff``, ``_debug`` and the response publishers)."""

    def _on_request(self, raw: bytes) -> None:
        """Reads the request from its serialised bytes (``WireRequest``: no message
        objects, the payloads views of the bytes), validates control, then metadata, then
        copies each payload once into the task's input buffers and submits; answers every
        request exactly once (even malformed; bytes that are no request too, without an id
        on the shared topic)."""
        t_recv = time.monotonic()
        if self._debug is not None and self._last_request is not None:
            publish_cyclic(self._debug, self, (t_recv - self._last_request) * 1e3)
        self._last_request = t_recv
        try:
            msg = WireRequest(raw)
        except ValueError as exc:
            self._respond(Reply(id="", code=codec.MALFORMED, model="",
                                message=f"not an InferRequest: {exc}"),
                          WireRequest.nothing(), t_recv)
            return
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

    def _post_response(self, reply: Reply, request: WireRequest, t_recv: float) -> None:
        """On the runtime's thread: hand the answer to the executor (``Handoff``)."""
        if not self._handoff.post(lambda: self._finish(reply, request, t_recv)):
            self._finish(reply, request, t_recv)  # closing: answer here rather than never

    def _finish(self, reply: Reply, request: WireRequest, t_recv: float) -> None:
        self._respond(reply, request, t_recv)
        with self._lock:
            self._in_flight -= 1
            self._idle.notify_all()

    def _respond(self, reply: Reply, request: WireRequest, t_recv: float) -> None:
        rt = self.runtime
        now = rt.now() if rt is not None else None
        received = None if now is None else now - (time.monotonic() - t_recv)
        msg = answer_to(reply, request, received, now)
        try:
            self._response_publisher(request).publish(msg)
            publish_debug(self._debug, self, t_recv, request.frame)
        except Exception as exc:  # context already shut down
            if rclpy.ok(context=self.context):
                self.get_logger().error(f"cannot publish response {reply.id}: {exc}")


    def _response_publisher(self, request: WireRequest) -> Any:
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
