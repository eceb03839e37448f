"""The nodes in one process (as in the container): image in -> TensorList out with the same
header, the typed request/response endpoint (every request answered once, every error
status included), the lifecycle's inactive answer, a recorded request/response pair
through ``rclpy.serialization``, /diagnostics, and live parameters validated as a batch.

Every wait is on a condition (matched endpoints, a received message) bounded by
``WAIT_S`` only against hangs, so a busy machine makes the tests slower, not red.

Run inside scripts/netns_run.sh (make test does): LOCALHOST discovery, fresh netns.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")

from av_infer_msgs.msg import (  # noqa: E402
    Float64Stamped,
    InferRequest,
    InferResponse,
    TensorList,
)
from av_infer_nodes.common import (  # noqa: E402
    REQUEST_QOS,
    REQUEST_TOPIC,
    RESPONSE_QOS_CLIENT,
    RESPONSE_TOPIC,
    request_msg,
    response_topic,
)
from av_infer_nodes.image_node import IMAGE_QOS  # noqa: E402
from av_infer_nodes.monitoring_node import MonitoringNode  # noqa: E402
from av_infer_nodes.perception_node import PerceptionNode  # noqa: E402
from av_infer_nodes.preprocess import image_to_tensor  # noqa: E402
from av_infer_nodes.runtime_node import RuntimeNode, diagnostic_statuses  # noqa: E402
from av_infer_nodes.testing import (  # noqa: E402
    WAIT_S,
    Collector,
    RosHarness,
    make_image,
    wait_for,
    wait_matched,
)
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.serialization import deserialize_message, serialize_message  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from av_infer import InvalidParameterError  # noqa: E402
from av_infer import tensor_codec as codec  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(600)]  # a hang guard



@pytest.fixture(scope="module", params=["single", "multi", "lean"])
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
        assert h.spin_error is None, f"the executor stopped: {h.spin_error!r}"


def test_tester_endpoints_add_no_waitables(graph):
    """The harness's tester endpoints carry no QoS-event waitables (``TesterNode``): rclpy's
    executor stops for good when one is destroyed mid-spin, which every test here does."""
    h, host, per, mon, tester = graph
    before = len(list(tester.waitables))
    sub = tester.create_subscription(InferResponse, RESPONSE_TOPIC, lambda m: None,
                                     REQUEST_QOS)
    pub = tester.create_publisher(InferRequest, REQUEST_TOPIC, REQUEST_QOS)
    try:
        assert len(list(tester.waitables)) == before
    finally:
        tester.destroy_subscription(sub)
        tester.destroy_publisher(pub)


def test_activation_freezes_the_gc_and_diagnostics_say_so(graph):
    """``gc_freeze`` (default on): the host collected and froze what existed when it was
    activated, so Python's full collections skip it; /diagnostics reports the count frozen
    then (recorded at activation: counting again walks every frozen object)."""
    h, host, per, mon, tester = graph
    assert host.p["gc_freeze"] is True and host.gc_frozen > 0
    head = diagnostic_statuses(host.runtime.stats(), "cpu", host.runtime, {},
                               gc_frozen=host.gc_frozen)[0]
    values = {kv.key: kv.value for kv in head.values}
    assert int(values["gc_frozen_objects"]) == host.gc_frozen


def _views(msg) -> dict[str, np.ndarray]:
    return codec.tensors_dict(msg.tensors)


def test_image_in_tensorlist_out_same_header(graph):
    h, host, per, mon, tester = graph
    outs, mon_outs = Collector(), Collector()
    sub = tester.create_subscription(TensorList, "/av_infer_perception/output/tensors", outs, 10)
    sub2 = tester.create_subscription(TensorList, "/av_infer_monitoring/output/tensors",
                                      mon_outs, 10)
    pub = tester.create_publisher(Image, "/cam_front/image", IMAGE_QOS)
    pub2 = tester.create_publisher(Image, "/cabin/image", IMAGE_QOS)
    try:
        wait_matched(pub, sub, pub2, sub2)
        sent = {}
        for i, enc in enumerate(["rgb8", "bgr8", "mono8", "rgb8"]):
            img = make_image(tester, f"cam{i}", 40 + i, 50, enc, seed=i)
            sent[f"cam{i}"] = img
            pub.publish(img)
            pub2.publish(make_image(tester, f"cabin{i}", 24, 24, "mono8"))
            wait_for(lambda i=i: len(outs.snapshot()) > i, what=f"output {i}")
        got = {m.header.frame_id: m for m in outs.snapshot()}
        assert set(got) == set(sent)
        for fid, msg in got.items():
            assert msg.header.stamp == sent[fid].header.stamp  # the input's header
            logits = _views(msg)["logits"]
            assert logits.shape == (1, 10) and logits.dtype == np.float32
            assert list(msg.tensors[0].strides) == [40, 4]
        # the same numbers as preprocessing + a direct submit, for every image (the node
        # fills one reused output message: none may carry another image's numbers)
        spec = host.runtime.input_spec("tiny_cnn")
        for fid, img in sent.items():
            x = image_to_tensor(img.encoding, img.height, img.width, img.step, img.data,
                                list(spec["input"][0]))
            direct = host.runtime.submit("tiny_cnn", {"input": x}).result(WAIT_S)
            np.testing.assert_allclose(_views(got[fid])["logits"], direct.outputs["logits"],
                                       rtol=1e-5, atol=1e-6)
        wait_for(mon_outs.snapshot, what="monitoring output")
        assert mon_outs.snapshot()[0].header.frame_id.startswith("cabin")
        assert per.counters["completed"] == 4
    finally:
        for ent in (sub, sub2):
            tester.destroy_subscription(ent)
        for ent in (pub, pub2):
            tester.destroy_publisher(ent)


def test_bad_image_answered_on_the_error_topic(graph):
    h, host, per, mon, tester = graph
    errs = Collector()
    sub = tester.create_subscription(InferResponse, "/av_infer_perception/output/errors", errs, 10)
    pub = tester.create_publisher(Image, "/cam_front/image", IMAGE_QOS)
    try:
        wait_matched(pub, sub)
        img = make_image(tester, "weird", encoding="rgb8")
        img.encoding = "16UC1"  # (yuv422 is converted since the camera-input work)
        pub.publish(img)
        resp = wait_for(errs.snapshot, what="error output")[0]
        assert resp.status == InferResponse.STATUS_INVALID_INPUT
        assert resp.code == "invalid_input" and resp.header.frame_id == "weird"
        assert "16UC1" in resp.message and not resp.tensors
    finally:
        tester.destroy_subscription(sub)
        tester.destroy_publisher(pub)


def test_bytes_that_are_no_image_are_answered_and_the_next_image_still_runs(graph):
    """The node reads images in their serialised form (a raw subscription): a publisher
    that sends bytes which are no ``Image`` (here: truncated ones, published raw) gets one
    ``invalid_input`` answer with an empty header, counted, and the next real image is
    answered as ever."""
    h, host, per, mon, tester = graph
    errs, outs = Collector(), Collector()
    sub = tester.create_subscription(InferResponse, "/av_infer_perception/output/errors", errs, 10)
    sub2 = tester.create_subscription(TensorList, "/av_infer_perception/output/tensors", outs, 10)
    pub = tester.create_publisher(Image, "/cam_front/image", IMAGE_QOS)
    try:
        wait_matched(pub, sub)
        wait_matched(pub, sub2)
        invalid = per.counters["invalid"]
        raw = serialize_message(make_image(tester, "cut", encoding="rgb8"))
        pub.publish(raw[: len(raw) // 2])
        resp = wait_for(errs.snapshot, what="error output")[0]
        assert (resp.status, resp.code) == (InferResponse.STATUS_INVALID_INPUT, "invalid_input")
        assert "sensor_msgs/Image" in resp.message and resp.header.frame_id == ""
        assert per.counters["invalid"] == invalid + 1
        pub.publish(make_image(tester, "whole", encoding="rgb8"))
        got = wait_for(lambda: [m for m in outs.snapshot() if m.header.frame_id == "whole"],
                       what="the next image's output")
        assert got[0].tensors[0].name == "logits"
    finally:
        for ent in (sub, sub2):
            tester.destroy_subscription(ent)
        tester.destroy_publisher(pub)


def test_outputs_the_wire_cannot_carry_are_answered_on_the_error_topic(graph):
    """An answer whose outputs no ``Tensor`` can carry (a string array, as a custom model
    could return) is the image's one message on ``~/output/errors`` (``internal_error``),
    counted ``encode_failed``, instead of a log line and no message."""
    from av_infer_nodes.common import Reply
    from av_infer_nodes.image_node import Frame

    h, host, per, mon, tester = graph
    errs = Collector()
    sub = tester.create_subscription(InferResponse, "/av_infer_perception/output/errors", errs, 10)
    try:
        wait_matched(per._err_pub, sub)
        before = per.counters["encode_failed"]
        per._publish(Reply(id="strs", model="tiny_cnn", outputs={"names": np.array(["a"])}),
                     Frame(3, 4, "strs_frame"), 0.0)
        resp = wait_for(errs.snapshot, what="error output")[0]
        assert (resp.id, resp.code, resp.status) == (
            "strs", "internal_error", InferResponse.STATUS_INTERNAL_ERROR)
        assert "names" in resp.message and resp.header.frame_id == "strs_frame"
        assert per.counters["encode_failed"] == before + 1
    finally:
        tester.destroy_subscription(sub)


def _request(rid: str, x: np.ndarray | None, **kw) -> InferRequest:
    ctrl = dict(id=rid, model="tiny_cnn", client="tester", priority="RT", stamp=(0, 0),
                frame_id=rid, deadline_s=WAIT_S, drop_late=False)
    ctrl.update(kw)
    return request_msg(codec.RequestControl(**ctrl), {} if x is None else {"input": x})


def test_request_response_ids_and_errors(graph):
    h, host, per, mon, tester = graph
    resps = Collector()
    # client "tester"'s answers come on its own topic; the id-less request's (no client)
    # on the shared one
    sub = tester.create_subscription(InferResponse, response_topic("tester"), resps,
                                     RESPONSE_QOS_CLIENT)
    shared = tester.create_subscription(InferResponse, RESPONSE_TOPIC, resps, REQUEST_QOS)
    pub = tester.create_publisher(InferRequest, REQUEST_TOPIC, REQUEST_QOS)
    try:
        wait_matched(pub, shared)
        x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
        ids = {k: str(uuid.uuid4()) for k in ("ok", "be", "unknown", "shape", "dtype",
                                              "lying", "big", "dup")}
        # a deadline no busy machine misses: deadline_met is checked below
        pub.publish(_request(ids["ok"], x))
        be = _request(ids["be"], x, priority="BE", deadline_s=None, stamp=(5, 6))
        pub.publish(be)
        pub.publish(_request(ids["unknown"], x, model="no_such_model"))
        pub.publish(_request(ids["shape"], x[:, :, :16]))
        pub.publish(_request(ids["dtype"], x.astype(np.float64)))
        lying = _request(ids["lying"], x)
        lying.tensors[0].shape.dims = [1, 3, 32, 33]  # metadata that does not match the bytes
        lying.tensors[0].strides = []
        pub.publish(lying)
        big = _request(ids["big"], x)
        big.tensors[0].shape.rank, big.tensors[0].shape.dims = 2, [1 << 16, 1 << 16]  # 16 GiB
        # declared: refused unread
        big.tensors[0].strides = []
        pub.publish(big)
        dup = _request(ids["dup"], x)
        dup.tensors = [dup.tensors[0], dup.tensors[0]]
        pub.publish(dup)
        pub.publish(InferRequest())  # no id at all
        n = len(ids) + 1
        wait_for(lambda: len(resps.snapshot()) >= n, what=f"{n} responses")
        # wait for the answer to one more request (answered at once: unknown model) rather
        # than for a fixed time; a duplicate answer to the others would show up meanwhile
        sentinel = str(uuid.uuid4())
        pub.publish(_request(sentinel, x, model="no_such_model"))
        wait_for(lambda: any(m.id == sentinel for m in resps.snapshot()),
                 what="the sentinel's answer")
        got = [r for r in resps.snapshot() if r.id != sentinel]
        by_id: dict[str, list] = {}
        for r in got:
            by_id.setdefault(r.id, []).append(r)
        assert len(got) == n, [(r.id, r.code) for r in got]
        for key in ids:
            assert len(by_id[ids[key]]) == 1, key  # exactly one answer each
        ok = by_id[ids["ok"]][0]
        assert ok.status == InferResponse.STATUS_OK and ok.code == "ok"
        assert _views(ok)["logits"].shape == (1, 10) and ok.header.frame_id == ids["ok"]
        assert ok.timings.has_deadline and ok.timings.deadline_met  # zero stamp: from receipt
        assert ok.timings.compute_ms > 0 and ok.timings.total_ms >= ok.timings.compute_ms
        b = by_id[ids["be"]][0]
        assert b.code == "ok" and (b.header.stamp.sec, b.header.stamp.nanosec) == (5, 6)
        assert not b.timings.has_deadline
        S = InferResponse
        assert by_id[ids["unknown"]][0].status == S.STATUS_UNKNOWN_MODEL
        assert by_id[ids["shape"]][0].status == S.STATUS_INVALID_INPUT
        assert by_id[ids["dtype"]][0].status == S.STATUS_INVALID_INPUT
        assert by_id[ids["lying"]][0].status == S.STATUS_MALFORMED_REQUEST
        assert "data has" in by_id[ids["lying"]][0].message
        assert by_id[ids["big"]][0].status == S.STATUS_REQUEST_TOO_LARGE
        assert by_id[ids["dup"]][0].status == S.STATUS_MALFORMED_REQUEST
        assert [r.status for r in by_id[""]] == [S.STATUS_MALFORMED_REQUEST]
        for r in got:
            assert r.code == "ok" or not r.tensors  # errors carry no tensors
        direct = host.runtime.submit("tiny_cnn", {"input": x}).result(WAIT_S)
        np.testing.assert_allclose(_views(ok)["logits"], direct.outputs["logits"], rtol=1e-6)
    finally:
        tester.destroy_subscription(sub)
        tester.destroy_subscription(shared)
        tester.destroy_publisher(pub)


def test_inactive_host_answers_inactive_and_comes_back(graph):
    """deactivate: new requests are answered STATUS_INACTIVE (never silence); activate:
    served again. Driven here by the node's own transitions; test_ros_multiprocess drives
    them over ~/change_state from another process."""
    h, host, per, mon, tester = graph
    resps = Collector()
    sub = tester.create_subscription(InferResponse, response_topic("tester"), resps,
                                     RESPONSE_QOS_CLIENT)
    pub = tester.create_publisher(InferRequest, REQUEST_TOPIC, REQUEST_QOS)
    x = np.zeros((1, 3, 32, 32), np.float32)
    try:
        wait_matched(pub)
        host.trigger_deactivate()
        pub.publish(_request("while-inactive", x))
        r = wait_for(lambda: [m for m in resps.snapshot() if m.id == "while-inactive"],
                     what="the inactive answer")[0]
        assert r.status == InferResponse.STATUS_INACTIVE and r.code == "inactive"
        host.trigger_activate()
        pub.publish(_request("active-again", x))
        r = wait_for(lambda: [m for m in resps.snapshot() if m.id == "active-again"],
                     what="the answer after activate")[0]
        assert r.code == "ok", r.message
    finally:
        if not host.active:
            host.trigger_activate()
        tester.destroy_subscription(sub)
        tester.destroy_publisher(pub)


def test_recorded_pair_round_trips_through_serialization(graph):
    """A request and its response, as a recorder stores them (CDR bytes), deserialize to
    equal messages: no C++ and no codec of ours needed to read a recording."""
    h, host, per, mon, tester = graph
    resps = Collector()
    sub = tester.create_subscription(InferResponse, response_topic("tester"), resps,
                                     RESPONSE_QOS_CLIENT)
    pub = tester.create_publisher(InferRequest, REQUEST_TOPIC, REQUEST_QOS)
    try:
        wait_matched(pub)
        req = _request("recorded", np.ones((1, 3, 32, 32), np.float32))
        pub.publish(req)
        resp = wait_for(lambda: [m for m in resps.snapshot() if m.id == "recorded"],
                        what="the recorded response")[0]
        for msg, typ in ((req, InferRequest), (resp, InferResponse)):
            raw = serialize_message(msg)
            back = deserialize_message(raw, typ)
            assert back == msg  # (CDR padding bytes are not specified: compare messages)
        back = deserialize_message(serialize_message(resp), InferResponse)
        np.testing.assert_array_equal(_views(back)["logits"], _views(resp)["logits"])
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


def test_cpu_device_parameters_reach_the_device(graph):
    """cpu_rt_parallel / cpu_be_nice / cpu_rt_priority configure the cpu device (read-only,
    at configure); a combination the device refuses fails configure with the reason."""
    h, host, per, mon, tester = graph
    node = _host(h, "cpu_params_host", device="cpu", cpu_rt_parallel=1, cpu_be_nice=5)
    try:
        dev = node.runtime.stats()["device"]
        assert (dev["rt_parallel"], dev["be_nice"], dev["rt_priority"]) == (1, 5, "off")
        statuses = diagnostic_statuses(node.runtime.stats(), node.device, node.runtime, {})
        values = {kv.key: kv.value for kv in statuses[0].values}
        assert values["device.rt_parallel"] == "1" and values["device.be_nice"] == "5"
    finally:
        node.destroy_node()
    with pytest.raises(InvalidParameterError, match="reef_dkp"):
        _host(h, "cpu_no_nice_host", device="cpu", cpu_be_nice=0, policy="reef_dkp")


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


def test_debug_topics_when_enabled(graph):
    """``debug_topics``: ~/debug/processing_time_ms and ~/debug/pipeline_latency_ms per
    output and ~/debug/cyclic_time_ms from the second image on (av_infer_msgs/
    Float64Stamped, written as serialised bytes), as Autoware's perception nodes publish
    them, to each topic while it has a subscriber: the node counts them from its
    publishers' matched events (``DebugTopics``), up when one subscribes and back to 0
    when it leaves."""
    h, host, per, mon, tester = graph
    dbg = h.add(PerceptionNode("dbg_perception", context=h.context, runtime=host.runtime,
                               parameter_overrides=[Parameter("model", value="tiny_cnn"),
                                                    Parameter("debug_topics", value=True)],
                               cli_args=["--ros-args", "-r", "image:=/dbg_cam/image"]))
    proc, lat, cyc = Collector(), Collector(), Collector()
    subs = [tester.create_subscription(Float64Stamped, f"/dbg_perception/debug/{t}", c, 10)
            for t, c in (("processing_time_ms", proc), ("pipeline_latency_ms", lat),
                         ("cyclic_time_ms", cyc))]
    pub = tester.create_publisher(Image, "/dbg_cam/image", IMAGE_QOS)
    try:
        wait_matched(pub, *subs)
        # the matched events, handled by the executor (no publish before: none listened)
        wait_for(lambda: dbg._debug.counts == [1, 1, 1], what="the debug topics' matches")
        pub.publish(make_image(tester, "dbg"))
        p = wait_for(proc.snapshot, what="processing time")[0]
        q = wait_for(lat.snapshot, what="pipeline latency")[0]
        assert 0 < p.data < WAIT_S * 1e3 and 0 < q.data < WAIT_S * 1e3
        assert p.stamp.sec > 0 and (p.stamp.sec, p.stamp.nanosec) == (q.stamp.sec,
                                                                       q.stamp.nanosec)
        assert not cyc.snapshot()  # the first image has no period yet
        pub.publish(make_image(tester, "dbg2"))
        c = wait_for(cyc.snapshot, what="cyclic time")[0]
        wait_for(lambda: len(proc.snapshot()) == 2, what="the second processing time")
        assert 0 < c.data < WAIT_S * 1e3 and c.stamp.sec > 0
        names = {e[0] for e in per.get_topic_names_and_types()}
        assert "/av_infer_perception/debug/processing_time_ms" in names  # on by default
        off = PerceptionNode("nodbg_perception", context=h.context, runtime=host.runtime,
                             parameter_overrides=[Parameter("model", value="tiny_cnn"),
                                                  Parameter("debug_topics", value=False)])
        try:
            assert not [n for n, _ in off.get_publisher_names_and_types_by_node(
                "nodbg_perception", "/") if "/debug/" in n]
        finally:
            off.destroy_node()
        for s in subs:
            tester.destroy_subscription(s)
        subs = []
        wait_for(lambda: dbg._debug.counts == [0, 0, 0], what="the debug topics' unmatches")
    finally:
        for s in subs:
            tester.destroy_subscription(s)
        tester.destroy_publisher(pub)
        h.executor.remove_node(dbg)
        h.nodes.remove(dbg)
        dbg.destroy_node()


def test_wait_reply_sends_again_until_an_answer_arrives():
    """A lost response (rmw_fastrtps drops it while discovery of the client's response
    reader is unfinished) only costs a re-send: the first answer to any copy is returned."""
    from concurrent.futures import Future

    from av_infer_nodes.testing import wait_reply

    sent: list[Future] = []

    def send() -> Future:
        f: Future = Future()
        if len(sent) == 2:  # the first two requests are never answered
            f.set_result("answer")
        sent.append(f)
        return f

    assert wait_reply(send, resend_s=0.05, what="test") == "answer"
    assert len(sent) == 3
    with pytest.raises(TimeoutError):
        wait_reply(Future, timeout=0.2, resend_s=0.05, what="never answered")
