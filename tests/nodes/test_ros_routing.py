"""Answers only to their caller (issue 34, item 4): per-client response topics and the
runtime host's ``client_models`` allow-list.

The host runs in its own process (``NodeProcess``); two ``RemoteRuntimeClient``s, as the
perception node uses them, talk to it from this one. Run inside scripts/netns_run.sh.
"""

from __future__ import annotations

import json
import threading
import uuid

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")

from av_infer_msgs.msg import InferResponse, Tensor, TensorShape  # noqa: E402
from av_infer_nodes.common import (  # noqa: E402
    LATCHED_QOS,
    MODELS_TOPIC,
    REQUEST_QOS,
    RESPONSE_QOS_CLIENT,
    RESPONSE_TOPIC,
    RemoteRuntimeClient,
    response_topic,
)
from av_infer_nodes.runtime_node import (  # noqa: E402
    RuntimeNode,
    allow_list_refusal,
    parse_client_models,
)
from av_infer_nodes.testing import (  # noqa: E402
    WAIT_S,
    NodeProcess,
    RosHarness,
    wait_for,
)
from rclpy.parameter import Parameter  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from av_infer import InvalidParameterError, error_from_code  # noqa: E402
from av_infer import tensor_codec as codec  # noqa: E402
from av_infer.errors import NotAllowedError, RejectedError  # noqa: E402


# -- the naming and the allow-list, without a graph ---------------------------------------
def test_response_topic_names():
    assert response_topic("front_cam") == "/av_infer/response/front_cam"
    assert response_topic("") == RESPONSE_TOPIC  # no client id: the shared topic
    weird = [response_topic(c) for c in ("a b", "1x", "a/b", "über", "~", "c" * 5000)]
    for t in weird:  # ids a topic name cannot carry: a hash of the id, still per client
        assert t.startswith("/av_infer/response/id_") and len(t) == len(weird[0])
    assert len(set(weird)) == len(weird)
    assert response_topic("a b") == weird[0]  # the same id always names the same topic


def test_client_models_parse_and_refusals():
    allow = parse_client_models(["front=yolo, det", "*=tiny_cnn"])
    assert allow == {"front": frozenset({"yolo", "det"}), "*": frozenset({"tiny_cnn"})}
    assert allow_list_refusal(allow, "front", "det", None) is None
    assert "may not run 'tiny_cnn'" in allow_list_refusal(allow, "front", "tiny_cnn", None)
    assert allow_list_refusal(allow, "rear", "tiny_cnn", None) is None  # under *
    assert allow_list_refusal(allow, "rear", "det", None) is not None
    # a variant group named by the request must be allowed too
    assert "'grp'" in allow_list_refusal(allow, "front", "det", "grp")
    only = parse_client_models(["front=det"])
    assert "not in the runtime host's allow-list" in allow_list_refusal(only, "rear", "det",
                                                                        None)
    assert allow_list_refusal({}, "anyone", "anything", "g") is None  # none configured
    for bad in (["front"], ["=det"], ["front="], ["front=det,"], ["a=x", "a=y"]):
        with pytest.raises(InvalidParameterError):
            parse_client_models(bad)
    assert issubclass(NotAllowedError, RejectedError)
    assert codec.status_of(NotAllowedError.code) == InferResponse.STATUS_REJECTED


def test_client_models_parameter_validated_with_rollback():
    """A malformed allow-list is refused and changes nothing; a valid one applies at once."""
    with RosHarness() as h:
        host = h.add(RuntimeNode(context=h.context, parameter_overrides=[
            Parameter("device", value="cpu"),
            Parameter("client_models", value=["alpha=tiny_cnn"])]))
        assert host.allow == {"alpha": frozenset({"tiny_cnn"})}
        r = host.set_parameters([Parameter("client_models", value=["alpha=tiny_cnn", "beta"])])
        assert not r[0].successful and "CLIENT=MODEL" in r[0].reason
        assert host.allow == {"alpha": frozenset({"tiny_cnn"})}
        assert list(host.get_parameter("client_models").value) == ["alpha=tiny_cnn"]
        # one batch: a refused entry refuses the whole batch
        r = host.set_parameters_atomically([Parameter("client_models", value=["*=x"]),
                                            Parameter("be_min_share", value=2.0)])
        assert not r.successful and host.allow == {"alpha": frozenset({"tiny_cnn"})}
        r = host.set_parameters([Parameter("client_models", value=["*=tiny_cnn"])])
        assert r[0].successful and host.allow == {"*": frozenset({"tiny_cnn"})}
        assert host.p["response_routing"] == "per_client"  # the default


def test_routing_parameter_validated():
    with RosHarness() as h, pytest.raises(InvalidParameterError, match="response_routing"):
        h.add(RuntimeNode(context=h.context, parameter_overrides=[
            Parameter("device", value="cpu"), Parameter("response_routing", value="all")]))


# -- two clients, the host in another process ---------------------------------------------
class Counted(RemoteRuntimeClient):
    """A RemoteRuntimeClient that counts every message its subscription delivered (what
    it had to deserialise), its own or not."""

    def __init__(self, *a, **kw):
        self.delivered: list[str] = []
        self._dlock = threading.Lock()
        super().__init__(*a, **kw)

    def _received(self, msg: codec.WireResponse) -> None:
        with self._dlock:
            self.delivered.append(msg.id)
        super()._received(msg)


def _ctrl(client: str, model: str = "tiny_cnn") -> codec.RequestControl:
    return codec.RequestControl(id=str(uuid.uuid4()), model=model, client=client,
                                priority="RT", stamp=(0, 0), frame_id="f", deadline_s=None,
                                drop_late=False)


def _x(seed: int) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(seed).standard_normal((1, 3, 32, 32))
            .astype(np.float32)}


def test_least_recently_used_topic_is_remade_and_still_answers():
    """Runs before the module's host process starts (``graph``), the only host then.
    ``max_response_topics`` 1: each client's request destroys the other's publisher
    and makes its own again; every answer still arrives (transient local: kept until the
    client's reader matches the new publisher)."""
    with RosHarness() as h:
        host = h.add(RuntimeNode(context=h.context, parameter_overrides=[
            Parameter("device", value="cpu"), Parameter("max_response_topics", value=1)]))
        a = Counted(h.node("lru_a"), timeout_s=60.0, client="lru_a")
        b = Counted(h.node("lru_b"), timeout_s=60.0, client="lru_b")
        wait_for(lambda: a.ready("tiny_cnn") and b.ready("tiny_cnn"), what="the host")
        for i in range(3):
            for c in (a, b):
                r = c.submit(_ctrl(c.client), _x(i)).result(WAIT_S)
                assert r.code == "ok", r.message
                assert host.response_topics() == [f"/av_infer/response/{c.client}"]
        with a._dlock, b._dlock:
            assert len(a.delivered) == len(set(a.delivered)) == 3
            assert len(b.delivered) == len(set(b.delivered)) == 3


def test_responses_a_client_cannot_read_are_answered_or_counted():
    """A remote client reads its answers from their bytes (``read_infer_response_cdr``):
    a response whose outputs fail the checks answers its request with ``internal_error``
    naming why; bytes that are no response are counted (``unreadable``), and a good
    response after them still resolves its request, the outputs as read-only arrays and
    the host's timings by their ``InferTimings`` names. A stand-in host here publishes the
    model table and the responses (no runtime)."""
    with RosHarness() as h:
        host = h.node("stand_in_host")
        table = host.create_publisher(String, MODELS_TOPIC, LATCHED_QOS)
        table.publish(String(data=json.dumps({
            "models": {"tiny_cnn": {"inputs": {}, "outputs": {}}},
            "response_routing": "per_client"})))
        client = RemoteRuntimeClient(h.node("reader"), timeout_s=60.0, client="reader")
        wait_for(lambda: client.response_topic == response_topic("reader"),
                 what="the model table")
        answers = host.create_publisher(InferResponse, response_topic("reader"),
                                        RESPONSE_QOS_CLIENT)
        wait_for(lambda: answers.get_subscription_count() > 0, what="the client's reader")
        y = np.arange(4, dtype=np.float32)

        def response(rid: str, strides: list[int]) -> InferResponse:
            msg = InferResponse(id=rid, code="ok", model="tiny_cnn", kappa=1.0, quality=1.0)
            msg.timings.compute_ms, msg.timings.has_deadline = 0.5, True
            msg.tensors = [Tensor(name="y", shape=TensorShape(rank=1, dims=[4]),
                                  data_type=9, strides=strides, data=y.tobytes())]
            return msg

        bad_ctrl, good_ctrl = _ctrl("reader"), _ctrl("reader")
        bad = client.submit(bad_ctrl, _x(0))
        good = client.submit(good_ctrl, _x(1))
        answers.publish(response(bad_ctrl.id, [3]))  # strides that lie about the layout
        r = bad.result(WAIT_S)
        assert r.code == "internal_error" and "cannot be read" in r.message, r.message
        assert r.outputs is None
        answers.publish(b"\x00\x01\x00\x00 no response")
        wait_for(lambda: client.unreadable == 1, what="the unreadable bytes counted")
        assert not good.done()
        answers.publish(response(good_ctrl.id, [4]))
        r = good.result(WAIT_S)
        assert r.code == "ok", r.message
        assert r.outputs["y"].tobytes() == y.tobytes() and not r.outputs["y"].flags.writeable
        assert r.timings.compute_ms == 0.5 and r.timings.has_deadline
        assert client.pending() == 0
        client.destroy()


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    logs = tmp_path_factory.mktemp("ros_routing_logs")
    proc = NodeProcess("av_infer_nodes.runtime_node", log_dir=logs, ros_args=[
        "-p", "device:=cpu", "-p", "models:=[tiny_cnn]",
        "-p", "client_models:=[alpha=tiny_cnn, beta=tiny_cnn, gamma=other_model]"])
    h = RosHarness()
    try:
        shared: list[str] = []
        spy = h.node("spy")
        spy.create_subscription(InferResponse, RESPONSE_TOPIC, lambda m: shared.append(m.id),
                                REQUEST_QOS)
        clients = {name: Counted(h.node(f"client_{name}"), timeout_s=60.0, client=name)
                   for name in ("alpha", "beta", "gamma", "delta")}
        wait_for(lambda: all(c.ready("tiny_cnn") for c in clients.values())
                 or not proc.alive(), what="the host's model table and request topic")
        assert proc.alive(), proc.output()[-3000:]
        yield clients, shared
    finally:
        h.close()
        code = proc.stop()
        print(f"--- runtime host ---\n{proc.output()[-3000:]}")
        assert code == 0, code


def test_each_client_receives_only_its_own_answers(graph):
    clients, shared = graph
    alpha, beta = clients["alpha"], clients["beta"]
    assert alpha.routing == "per_client"
    assert alpha.response_topic == "/av_infer/response/alpha"
    assert beta.response_topic == "/av_infer/response/beta"
    futs = [alpha.submit(_ctrl("alpha"), _x(i)) for i in range(5)]
    replies = [f.result(WAIT_S) for f in futs]
    assert [r.code for r in replies] == ["ok"] * 5, [r.message for r in replies]
    b = beta.submit(_ctrl("beta"), _x(9)).result(WAIT_S)
    assert b.code == "ok", b.message
    ids_a = {f.result().id for f in futs}
    # beta was delivered its one answer and none of alpha's (it never deserialised them)
    with beta._dlock:
        assert beta.delivered == [b.id]
    with alpha._dlock:
        assert set(alpha.delivered) == ids_a and b.id not in alpha.delivered
    assert not shared  # nothing on the shared topic
    assert alpha.pending() == beta.pending() == 0


def test_allow_list_refuses_with_a_typed_error(graph):
    clients, _ = graph
    gamma, delta = clients["gamma"], clients["delta"]
    r = gamma.submit(_ctrl("gamma"), _x(1)).result(WAIT_S)  # gamma may run other_model only
    assert r.code == "not_allowed" and "other_model" in r.message, (r.code, r.message)
    r = delta.submit(_ctrl("delta"), _x(2)).result(WAIT_S)  # not in the allow-list at all
    assert r.code == "not_allowed" and "delta" in r.message, (r.code, r.message)
    assert isinstance(error_from_code(r.code, r.message), NotAllowedError)
    with gamma._dlock, delta._dlock:  # each refusal went to its own caller only
        assert len(gamma.delivered) == 1 and len(delta.delivered) == 1
