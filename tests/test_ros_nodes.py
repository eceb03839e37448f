"""The nodes in one process (as in the container): image in -> output out with the same
header, the request/response endpoint (every request answered once, errors included),
/diagnostics, and live parameters validated as a batch.

Every wait is on a condition (matched endpoints, a received message) bounded by
``WAIT_S`` only against hangs, so a busy machine makes the tests slower, not red.

Run inside scripts/netns_run.sh (make test does): LOCALHOST discovery, fresh netns.
"""

from __future__ import annotations

import json
import threading
import uuid

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")

from av_infer_nodes.common import (  # noqa: E402
    REQUEST_QOS,
    REQUEST_TOPIC,
    RESPONSE_TOPIC,
    from_msg,
    to_msg,
)
from av_infer_nodes.image_node import IMAGE_QOS  # noqa: E402
from av_infer_nodes.monitoring_node import MonitoringNode  # noqa: E402
from av_infer_nodes.perception_node import PerceptionNode  # noqa: E402
from av_infer_nodes.runtime_node import RuntimeNode  # noqa: E402
from av_infer_nodes.testing import (  # noqa: E402
    WAIT_S,
    RosHarness,
    make_image,
    wait_for,
    wait_matched,
)
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from std_msgs.msg import UInt8MultiArray  # noqa: E402

from av_infer import InvalidParameterError  # noqa: E402
from av_infer import tensor_codec as codec  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(600)]  # a hang guard


class Collector:
    """Thread-safe list of received messages."""

    def __init__(self) -> None:
        self.items: list = []
        self._lock = threading.Lock()

    def __call__(self, msg) -> None:
        with self._lock:
            self.items.append(msg)

    def snapshot(self) -> list:
        with self._lock:
            return list(self.items)


@pytest.fixture(scope="module", params=["single", "multi"])
def graph(request):
    """Runtime host + RT perception (local) + BE monitoring (local) + a tester node, all in
    one process on each executor the container offers."""
    with RosHarness(executor=request.param) as h:
        host = h.add(RuntimeNode(context=h.context, parameter_overrides=[
            Parameter("device", value="cpu"), Parameter("models", value=["tiny_cnn"]),
            Parameter("diagnostics_period_s", value=0.2)]))
        per = h.add(PerceptionNode(context=h.context, runtime=host.runtime,
                                   parameter_overrides=[Parameter("model", value="tiny_cnn")],
                                   cli_args=["--ros-args", "-r", "image:=/cam_front/image"]))
        mon = h.add(MonitoringNode(context=h.context, runtime=host.runtime,
                                   parameter_overrides=[Parameter("model", value="tiny_cnn")],
                                   cli_args=["--ros-args", "-r", "image:=/cabin/image"]))
        tester = h.node("tester")
        yield h, host, per, mon, tester


def _decode(msg) -> codec.TensorResponse:
    return codec.decode_response(*from_msg(msg))


def test_image_in_output_out_same_header(graph):
    h, host, per, mon, tester = graph
    outs, mon_outs = Collector(), Collector()
    sub = tester.create_subscription(UInt8MultiArray, "/av_infer_perception/output", outs, 10)
    sub2 = tester.create_subscription(UInt8MultiArray, "/av_infer_monitoring/output",
                                      mon_outs, 10)
    pub = tester.create_publisher(Image, "/cam_front/image", IMAGE_QOS)
    pub2 = tester.create_publisher(Image, "/cabin/image", IMAGE_QOS)
    try:
        wait_matched(pub, sub, pub2, sub2)
        sent = {}
        for i, enc in enumerate(["rgb8", "bgr8", "mono8", "rgb8"]):
            img = make_image(tester, f"cam{i}", 40 + i, 50, enc, seed=i)
            sent[f"cam{i}"] = (img.header.stamp.sec, img.header.stamp.nanosec)
            pub.publish(img)
            pub2.publish(make_image(tester, f"cabin{i}", 24, 24, "mono8"))
            wait_for(lambda i=i: len(outs.snapshot()) > i, what=f"output {i}")
        got = {r.frame_id: r for r in map(_decode, outs.snapshot())}
        assert set(got) == set(sent)
        for fid, resp in got.items():
            assert resp.ok, resp.message
            assert resp.stamp == sent[fid]
            assert resp.outputs["logits"].shape == (1, 10)
            assert resp.timings["latency"] > 0
        wait_for(mon_outs.snapshot, what="monitoring output")
        assert _decode(mon_outs.snapshot()[0]).frame_id.startswith("cabin")
        assert per.counters["completed"] == 4
    finally:
        for ent in (sub, sub2):
            tester.destroy_subscription(ent)
        for ent in (pub, pub2):
            tester.destroy_publisher(ent)


def test_bad_image_answered_with_error(graph):
    h, host, per, mon, tester = graph
    outs = Collector()
    sub = tester.create_subscription(UInt8MultiArray, "/av_infer_perception/output", outs, 10)
    pub = tester.create_publisher(Image, "/cam_front/image", IMAGE_QOS)
    try:
        wait_matched(pub, sub)
        img = make_image(tester, "weird", encoding="rgb8")
        img.encoding = "yuv422"
        pub.publish(img)
        msg = wait_for(outs.snapshot, what="error output")[0]
        resp = _decode(msg)
        assert not resp.ok and resp.code == "invalid_input" and resp.frame_id == "weird"
        assert "yuv422" in resp.message
    finally:
        tester.destroy_subscription(sub)
        tester.destroy_publisher(pub)


def _raw(label: str, data: bytes = b"") -> UInt8MultiArray:
    return to_msg(label, data)


def test_request_response_ids_and_errors(graph):
    h, host, per, mon, tester = graph
    resps = Collector()
    sub = tester.create_subscription(UInt8MultiArray, RESPONSE_TOPIC, resps, REQUEST_QOS)
    pub = tester.create_publisher(UInt8MultiArray, REQUEST_TOPIC, REQUEST_QOS)
    try:
        wait_matched(pub, sub)
        x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
        ids = {k: str(uuid.uuid4()) for k in ("ok", "be", "unknown", "shape", "dtype")}

        def req(key, **kw):
            # a deadline no busy machine misses: deadline_met is checked below
            base = dict(id=ids[key], model="tiny_cnn", priority="RT", inputs={"input": x},
                        deadline_s=WAIT_S, client="tester", stamp=(0, 0), frame_id=key)
            base.update(kw)
            return to_msg(*codec.encode_request(codec.TensorRequest(**base)))

        pub.publish(req("ok"))
        pub.publish(req("be", priority="BE", deadline_s=None, stamp=(5, 6)))
        pub.publish(req("unknown", model="no_such_model"))
        pub.publish(req("shape", inputs={"input": x[:, :, :16]}))
        pub.publish(req("dtype", inputs={"input": x.astype(np.float64)}))
        # malformed: bad JSON, no dims at all, a lying tensor spec with a readable id
        pub.publish(_raw("{nope"))
        pub.publish(UInt8MultiArray())
        bad_id = str(uuid.uuid4())
        label, data = codec.encode_request(codec.TensorRequest(
            id=bad_id, model="tiny_cnn", priority="RT", inputs={"input": x}))
        hdr = json.loads(label)
        hdr["tensors"][0]["nbytes"] += 4
        pub.publish(_raw(json.dumps(hdr), data))
        hdr["tensors"][0].update(nbytes=x.nbytes, dtype="bfloat13")
        bad_id2 = str(uuid.uuid4())
        hdr["id"] = bad_id2
        pub.publish(_raw(json.dumps(hdr), data))
        wait_for(lambda: len(resps.snapshot()) >= 9, what="9 responses")
        # wait for the answer to one more request (answered at once: unknown model) rather
        # than for a fixed time; a duplicate answer to the 9 would show up meanwhile
        sentinel = str(uuid.uuid4())
        pub.publish(to_msg(*codec.encode_request(codec.TensorRequest(
            id=sentinel, model="no_such_model", priority="RT", inputs={"input": x}))))
        wait_for(lambda: any(_decode(m).id == sentinel for m in resps.snapshot()),
                 what="the sentinel's answer")
        got = [r for r in map(_decode, resps.snapshot()) if r.id != sentinel]
        by_id: dict[str, list] = {}
        for r in got:
            by_id.setdefault(r.id, []).append(r)
        assert len(got) == 9, [(r.id, r.code) for r in got]
        for key in ids:
            assert len(by_id[ids[key]]) == 1, key  # exactly one answer each
        ok = by_id[ids["ok"]][0]
        assert ok.ok and ok.outputs["logits"].shape == (1, 10)
        assert ok.frame_id == "ok"
        assert ok.timings["deadline_met"] is True  # zero stamp: due WAIT_S after receipt
        be = by_id[ids["be"]][0]
        assert be.ok and be.stamp == (5, 6) and be.frame_id == "be"  # header echoed
        assert by_id[ids["unknown"]][0].code == "unknown_model"
        assert by_id[ids["shape"]][0].code == "invalid_input"
        assert by_id[ids["dtype"]][0].code == "invalid_input"
        assert [r.code for r in by_id[""]] == ["malformed_request"] * 2
        assert by_id[bad_id][0].code == "malformed_request"
        assert "nbytes" in by_id[bad_id][0].message
        assert "unknown dtype" in by_id[bad_id2][0].message
        # the same result as a direct submit
        direct = host.runtime.submit("tiny_cnn", {"input": x}).result(WAIT_S)
        np.testing.assert_allclose(ok.outputs["logits"], direct.outputs["logits"], rtol=1e-6)
    finally:
        tester.destroy_subscription(sub)
        tester.destroy_publisher(pub)


def test_diagnostics_published(graph):
    h, host, per, mon, tester = graph
    diags = Collector()
    sub = tester.create_subscription(DiagnosticArray, "/diagnostics", diags, 10)
    try:
        host.runtime.submit("tiny_cnn", {"input": np.zeros((1, 3, 32, 32), np.float32)},
                            client="diag_probe").result(WAIT_S)
        msg = wait_for(lambda: [m for m in diags.snapshot()
                                if any("diag_probe" in s.name for s in m.status)],
                       what="diagnostics naming the client")[-1]
        names = [s.name for s in msg.status]
        assert "av_infer: runtime" in names and "av_infer: model tiny_cnn" in names
        runtime = next(s for s in msg.status if s.name == "av_infer: runtime")
        keys = {kv.key: kv.value for kv in runtime.values}
        assert keys["policy"] == "reef" and keys["device"] == "cpu" and "preemptions" in keys
        client = next(s for s in msg.status if s.name == "av_infer: client diag_probe")
        ckeys = {kv.key for kv in client.values}
        assert {"latency_ms.p50", "latency_ms.p99", "deadline_misses"} <= ckeys
        model = next(s for s in msg.status if s.name == "av_infer: model tiny_cnn")
        assert {"latency_ms.p50", "latency_ms.p99"} <= {kv.key for kv in model.values}
    finally:
        tester.destroy_subscription(sub)


def _host(h, name: str, **params) -> RuntimeNode:
    """A runtime host that is never spun: only its constructor and ``publish_diagnostics``
    are under test."""
    overrides = [Parameter("models", value=["tiny_cnn"]),
                 Parameter("diagnostics_period_s", value=60.0)]
    overrides += [Parameter(k, value=v) for k, v in params.items()]
    return RuntimeNode(name, context=h.context, parameter_overrides=overrides)


def test_device_auto_says_why_and_never_hides_a_configuration_error(graph):
    h, host, per, mon, tester = graph
    with pytest.raises(InvalidParameterError, match="nonsense"):
        _host(h, "auto_bad_policy", device="auto", policy="nonsense")
    assert host.device_reason == "requested" and not host.device_fallback
    diags = Collector()
    sub = tester.create_subscription(DiagnosticArray, "/diagnostics", diags, 10)
    auto = _host(h, "auto_host", device="auto")
    try:
        assert auto.device in ("cpu", "cuda")
        expected = "no usable GPU" if auto.device == "cpu" else "usable"
        assert expected in auto.device_reason and auto.device_fallback == (auto.device == "cpu")
        wait_matched(sub, what="the auto host's /diagnostics")

        def auto_status():
            auto.publish_diagnostics()  # each call publishes one array
            return [st for m in diags.snapshot() for st in m.status
                    if st.name == "av_infer: runtime"
                    and any(kv.key == "device_reason" and kv.value == auto.device_reason
                            for kv in st.values)]

        status = wait_for(auto_status, period=0.2, what="the auto host's runtime status")[0]
        values = {kv.key: kv.value for kv in status.values}
        assert values["device"] == auto.device
        if auto.device_fallback:
            assert status.level == DiagnosticStatus.WARN
            assert auto.device_reason in status.message
    finally:
        tester.destroy_subscription(sub)
        auto.destroy_node()


def test_live_parameters_validated_as_a_batch(graph):
    h, host, per, mon, tester = graph
    rt = host.runtime
    res = host.set_parameters_atomically([Parameter("policy", value="seq"),
                                          Parameter("c", value=2)])
    assert res.successful and rt.policy == "seq" and rt.c == 2
    # one bad value: nothing in the batch changes
    res = host.set_parameters_atomically([Parameter("c", value=3),
                                          Parameter("policy", value="fastest")])
    assert not res.successful and "fastest" in res.reason
    assert rt.c == 2 and rt.policy == "seq" and host.get_parameter("c").value == 2
    for bad in (Parameter("c", value=rt.c_range[1] + 1), Parameter("c", value="four"),
                Parameter("device", value="sim"), Parameter("models", value=["vgg19"])):
        res = host.set_parameters([bad])[0]
        assert not res.successful and res.reason, bad.name
    res = host.set_parameters_atomically([Parameter("max_queue_depth", value=5),
                                          Parameter("be_min_share", value=0.0)])
    assert res.successful and rt.max_queue_depth == 5 and rt.be_min_share == 0.0
    res = host.set_parameters([Parameter("max_queue_depth", value=0)])[0]
    assert res.successful and rt.max_queue_depth is None
    res = host.set_parameters([Parameter("be_min_share", value=0.95)])[0]
    assert not res.successful and rt.be_min_share == 0.0
    res = host.set_parameters([Parameter("cache_budget_mb", value=64)])[0]
    assert res.successful and rt.stats()["cache"]["budget_bytes"] == 64 * 2**20
    res = host.set_parameters_atomically([Parameter("batch_max", value=4),
                                          Parameter("batch_quantum_ms", value=10.0)])
    batching = rt.stats()["batching"]
    assert res.successful and batching["enabled"] and batching["quantum_s"] == 0.01
    res = host.set_parameters([Parameter("batch_max", value=1),
                               Parameter("cache_budget_mb", value=0)])
    assert all(r.successful for r in res)
    assert not rt.stats()["batching"]["enabled"] and rt.stats()["cache"]["budget_bytes"] is None
    res = host.set_parameters([Parameter("padding", value=True)])[0]
    assert not res.successful and res.reason  # policy seq cannot pad (and DKP may be absent)
    res = host.set_parameters_atomically([Parameter("policy", value="reef"),
                                          Parameter("c", value=4),
                                          Parameter("edf_preempt", value=True)])
    assert res.successful and rt.policy == "reef" and rt.c == 4 and rt.edf_preempt
    host.set_parameters([Parameter("edf_preempt", value=False)])
    # perception: deadline and resize are live, priority is read-only
    assert per.set_parameters([Parameter("relative_deadline_ms", value=50.0)])[0].successful
    assert per.p["relative_deadline_ms"] == 50.0
    assert not per.set_parameters([Parameter("resize", value="cubic")])[0].successful
    assert not per.set_parameters([Parameter("priority", value="BE")])[0].successful
    assert not per.set_parameters([Parameter("std", value=[0.0, 1.0, 1.0])])[0].successful
    assert per.set_parameters([Parameter("relative_deadline_ms", value=33.0)])[0].successful
