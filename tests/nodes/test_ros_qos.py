"""Issue 12's QoS features (paper 001, docs/qos.md) through the ROS layer.

One process (as in the container): a runtime host on the cpu with a variant group ``det``
(two copies of tiny_cnn, ``full`` κ=1 and ``fast`` κ=0.5) declared in parameters, a tester
node, and image nodes that name the group. Covered: a request naming the group through
/av_infer/request is served and its response names the variant, κ and the quality; a hard
deadline in a request (relative to header.stamp) gives the quality κ·V and, already past,
a typed STATUS_DEADLINE_MISSED; the typed statuses of a bad group, a model outside the
group and a hard deadline before the soft one; live batch_mode changes and refused ones
(nothing changes); bad variant-group parameters refused at configure with typed errors;
/diagnostics per group; image nodes (in-process and remote) with ``variant_group``.

Every wait is on a condition bounded by ``WAIT_S`` only against hangs.
Run inside scripts/netns_run.sh (make test does): LOCALHOST discovery, fresh netns.
"""

from __future__ import annotations

import shutil
import uuid

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")

from av_infer_msgs.msg import InferRequest, InferResponse, TensorList  # noqa: E402
from av_infer_nodes.common import (  # noqa: E402
    REQUEST_QOS,
    REQUEST_TOPIC,
    RESPONSE_QOS_CLIENT,
    request_msg,
    response_topic,
)
from av_infer_nodes.image_node import IMAGE_QOS  # noqa: E402
from av_infer_nodes.monitoring_node import MonitoringNode  # noqa: E402
from av_infer_nodes.perception_node import PerceptionNode  # noqa: E402
from av_infer_nodes.runtime_node import RuntimeNode  # noqa: E402
from av_infer_nodes.testing import (  # noqa: E402
    WAIT_S,
    Collector,
    RosHarness,
    make_image,
    wait_for,
    wait_matched,
)
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from av_infer import InvalidParameterError, UnknownModelError, zoo_path  # noqa: E402
from av_infer import tensor_codec as codec  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(600)]  # a hang guard

KAPPA = {"full": 1.0, "fast": 0.5}



def _group_params(models: list[str], kappas: list[float], name: str = "det") -> list:
    return [Parameter("variant_groups", value=[name]),
            Parameter(f"variant_group.{name}.models", value=models),
            Parameter(f"variant_group.{name}.kappas", value=kappas)]


@pytest.fixture(scope="module")
def qos(tmp_path_factory):
    """Runtime host with group ``det`` = {full: 1.0, fast: 0.5} (same tensors), a tester."""
    d = tmp_path_factory.mktemp("variants")
    for name in KAPPA:
        shutil.copy(zoo_path("tiny_cnn", "scaled"), d / f"{name}.onnx")
    paths = [str(d / f"{n}.onnx") for n in KAPPA]
    with RosHarness(executor="single") as h:
        host = h.add(RuntimeNode(context=h.context, parameter_overrides=[
            Parameter("device", value="cpu"), Parameter("models", value=paths),
            Parameter("diagnostics_period_s", value=0.2),
            *_group_params(list(KAPPA), list(KAPPA.values()))]))
        tester = h.node("qos_tester")
        resps = Collector()
        sub = tester.create_subscription(InferResponse, response_topic("qos_tester"), resps,
                                         RESPONSE_QOS_CLIENT)
        pub = tester.create_publisher(InferRequest, REQUEST_TOPIC, REQUEST_QOS)
        wait_matched(pub)
        assert sub.topic_name == "/av_infer/response/qos_tester"
        yield h, host, tester, pub, resps, paths


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 32, 32)).astype(np.float32)


def _request(stamp: tuple[int, int] = (0, 0), **kw) -> InferRequest:
    ctrl = dict(id=str(uuid.uuid4()), model="det", client="qos_tester", priority="BE",
                stamp=stamp, frame_id="f", deadline_s=None, drop_late=False)
    ctrl.update(kw)
    return request_msg(codec.RequestControl(**ctrl), {"input": _x()})


def _ask(qos, *msgs: InferRequest) -> list[InferResponse]:
    """Publishes ``msgs``; returns their one answer each, in order."""
    h, host, tester, pub, resps, _ = qos
    for m in msgs:
        pub.publish(m)
    ids = [m.id for m in msgs]
    wait_for(lambda: {r.id for r in resps.snapshot()} >= set(ids),
             what=f"answers to {len(ids)} requests")
    got = resps.snapshot()
    out = []
    for rid in ids:
        mine = [r for r in got if r.id == rid]
        assert len(mine) == 1, (rid, [r.code for r in mine])  # exactly one answer
        out.append(mine[0])
    return out


def _stamp_ago(node, seconds: float) -> tuple[int, int]:
    ns = node.get_clock().now().nanoseconds - int(seconds * 1e9)
    return divmod(ns, 1_000_000_000)


def test_request_naming_a_group_is_served_by_a_variant(qos):
    h, host, tester, pub, resps, _ = qos
    assert host.runtime.variant_groups() == {"det": KAPPA}
    by_group, by_variant, by_field = _ask(
        qos, _request(), _request(model="full", variant_group="det"),
        _request(model="det", variant_group="det"))
    direct = host.runtime.submit("full", {"input": _x()}).result(WAIT_S).outputs["logits"]
    for r in (by_group, by_variant, by_field):
        assert r.status == InferResponse.STATUS_OK, r.message
        assert r.served_model in KAPPA and r.kappa == KAPPA[r.served_model]
        assert r.quality == r.kappa  # no deadline: quality is κ
        # both variants are tiny_cnn: the same logits whichever ran
        np.testing.assert_allclose(codec.tensors_dict(r.tensors)["logits"], direct, rtol=1e-6)
    assert by_group.model == "det" and by_variant.model == "full"  # the name asked, echoed
    plain = _ask(qos, _request(model="fast"))[0]  # no group: the model itself, κ 1
    assert plain.status == InferResponse.STATUS_OK
    assert (plain.served_model, plain.kappa) == ("fast", 1.0)
    stats = host.runtime.stats()["variant_groups"]["det"]
    assert stats["requests"] >= 3 and sum(stats["served"].values()) >= 3


def test_bad_group_fields_get_typed_statuses(qos):
    h, host, tester, pub, resps, _ = qos
    unknown, outside, soft_after_hard = _ask(
        qos, _request(variant_group="nope"),
        _request(model="no_such_model", variant_group="det"),
        _request(deadline_s=2.0, hard_deadline_s=1.0))
    S = InferResponse
    assert (unknown.status, unknown.code) == (S.STATUS_UNKNOWN_MODEL, "unknown_model")
    assert "nope" in unknown.message
    assert (outside.status, outside.code) == (S.STATUS_INVALID_PARAMETER, "invalid_parameter")
    assert soft_after_hard.status == S.STATUS_INVALID_PARAMETER
    assert "hard_deadline" in soft_after_hard.message
    for r in (unknown, outside, soft_after_hard):
        assert not r.tensors and r.served_model == "" and np.isnan(r.quality)


def test_hard_deadline_relative_to_the_stamp(qos):
    """Stamped 10 s ago: a soft deadline 5 s after the stamp has passed, a hard one 1000 s
    after it has not, so the quality is κ·(hard - end)/(hard - soft) ≈ κ·990/995 (seconds
    of slack: no wall-clock expectation); a BE request whose hard deadline has already
    passed is answered STATUS_DEADLINE_MISSED without running (no drop_late needed)."""
    h, host, tester, pub, resps, _ = qos
    stamp = _stamp_ago(tester, 10.0)
    partial, missed = _ask(
        qos, _request(stamp, deadline_s=5.0, hard_deadline_s=1000.0),
        _request(stamp, hard_deadline_s=1.0))
    assert partial.status == InferResponse.STATUS_OK, partial.message
    assert partial.timings.has_deadline and not partial.timings.deadline_met
    assert 0 < partial.quality < partial.kappa
    assert partial.quality == pytest.approx(partial.kappa * 990 / 995, abs=0.02)
    assert (missed.status, missed.code) == (InferResponse.STATUS_DEADLINE_MISSED,
                                            "deadline_missed")
    assert not missed.tensors


def test_live_batch_mode_change_and_refusals(qos):
    h, host, tester, pub, resps, _ = qos
    rt = host.runtime

    def mode() -> str:
        return rt.stats()["batching"]["mode"]

    assert mode() == "rafiqi"
    res = host.set_parameters_atomically([Parameter("batch_mode", value="eq2"),
                                          Parameter("eq2_alpha", value=0.25),
                                          Parameter("rate_window_ms", value=20.0)])
    assert res.successful, res.reason
    assert mode() == "eq2"
    assert _ask(qos, _request())[0].status == InferResponse.STATUS_OK  # still served
    # refused, each alone and in a batch with a good value: nothing changes
    for bad in ([Parameter("batch_mode", value="fastest")],
                [Parameter("batch_mode", value="fixed"), Parameter("eq2_beta", value=0.0)],
                [Parameter("batch_mode", value="qos_rl"),
                 Parameter("qos_policy", value="/no/such/policy.json")],
                [Parameter("eq2_b_thrd", value=0)]):
        res = host.set_parameters_atomically(bad)
        assert not res.successful and res.reason, bad
        assert mode() == "eq2" and host.get_parameter("batch_mode").value == "eq2"
    res = host.set_parameters([Parameter("batch_mode", value="fastest")])[0]
    assert "fastest" in res.reason and "eq2" in res.reason  # the reason names the modes
    # the committed policy ('' qos_policy) drives the group; then back to the default
    res = host.set_parameters([Parameter("batch_mode", value="qos_rl")])[0]
    assert res.successful, res.reason
    assert mode() == "qos_rl"
    assert _ask(qos, _request())[0].status == InferResponse.STATUS_OK
    res = host.set_parameters_atomically([Parameter("batch_mode", value="rafiqi"),
                                          Parameter("eq2_alpha", value=0.5),
                                          Parameter("rate_window_ms", value=50.0)])
    assert res.successful and mode() == "rafiqi"


def test_bad_variant_group_parameters_refused(qos):
    h, host, tester, pub, resps, paths = qos

    def host_with(name: str, *group) -> None:
        node = RuntimeNode(name, context=h.context, parameter_overrides=[
            Parameter("device", value="cpu"), Parameter("models", value=paths),
            Parameter("diagnostics_period_s", value=60.0), *group])
        node.destroy_node()  # not reached when configure refuses

    with pytest.raises(InvalidParameterError, match="kappa|κ|\\(0, 1\\]"):
        host_with("bad_kappa", *_group_params(["full", "fast"], [1.0, 1.5]))
    with pytest.raises(UnknownModelError, match="nope"):
        host_with("bad_model", *_group_params(["full", "nope"], [1.0, 0.5]))
    with pytest.raises(InvalidParameterError, match="one kappa per model"):
        host_with("bad_count", *_group_params(["full", "fast"], [1.0]))
    with pytest.raises(InvalidParameterError, match="not a group name"):
        host_with("bad_name", Parameter("variant_groups", value=["9 lives"]))
    with pytest.raises(InvalidParameterError, match="batch mode"):
        host_with("bad_mode", Parameter("batch_mode", value="fastest"))
    # groups are read-only: defined at configure
    res = host.set_parameters([Parameter("variant_group.det.kappas", value=[1.0, 0.9])])[0]
    assert not res.successful and "read-only" in res.reason
    assert host.runtime.variant_groups() == {"det": KAPPA}


def test_diagnostics_per_variant_group(qos):
    h, host, tester, pub, resps, _ = qos
    _ask(qos, _request())
    diags = Collector()
    sub = tester.create_subscription(DiagnosticArray, "/diagnostics", diags, 10)
    try:
        def group_status():
            return [s for m in diags.snapshot() for s in m.status
                    if s.name == "av_infer: variant group det"
                    and "mean utility" in s.message]

        status = wait_for(group_status, what="the variant group's diagnostics")[-1]
        keys = {kv.key for kv in status.values}
        assert {"share.full", "share.fast", "mean_utility", "variants.full",
                "variants.fast", "requests"} <= keys
        assert "%" in status.message
        head = next(s for m in diags.snapshot() for s in m.status
                    if s.name == "av_infer: runtime")
        values = {kv.key: kv.value for kv in head.values}
        assert values["batch_mode"] == host.runtime.stats()["batching"]["mode"]
        assert "batch mode" in head.message
        assert not any(k.startswith("variant_groups.") for k in values)  # its own status
    finally:
        tester.destroy_subscription(sub)


@pytest.mark.parametrize("where", ["local", "remote"])
def test_image_node_names_the_group(qos, where):
    """Perception in-process (configure_client validates) and monitoring over the topics
    (the host's model table lists the group) both serve images by the group."""
    h, host, tester, pub, resps, _ = qos
    name = f"qos_{where}"
    params = [Parameter("model", value="full"), Parameter("variant_group", value="det"),
              Parameter("relative_deadline_ms", value=10_000.0),
              Parameter("hard_deadline_ms", value=20_000.0)]
    if where == "local":
        node = h.add(PerceptionNode(name, context=h.context, runtime=host.runtime,
                                    parameter_overrides=params,
                                    cli_args=["--ros-args", "-r", f"image:=/{name}/image"]))
    else:
        node = h.add(MonitoringNode(name, context=h.context, parameter_overrides=[
            Parameter("runtime", value="remote"), *params],
            cli_args=["--ros-args", "-r", f"image:=/{name}/image"]))
    outs = Collector()
    sub = tester.create_subscription(TensorList, f"/{name}/output/tensors", outs, 10)
    img_pub = tester.create_publisher(Image, f"/{name}/image", IMAGE_QOS)
    try:
        wait_matched(img_pub, sub)
        wait_for(lambda: node.client is not None and node.client.ready("full")
                 and node.client.variant_groups() == {"det": KAPPA},
                 what=f"the {where} node to see the group")

        def one_output():
            img_pub.publish(make_image(tester, name))  # depth 1: resend until one is served
            return outs.snapshot()

        wait_for(one_output, period=0.2, what=f"an output of the {where} node")
        assert node.counters["failed"] == 0
        if where == "local":
            util = host.runtime.stats()["utility"][name]  # configure_client: utility kept
            assert util
        # refused live: an unknown group, a hard deadline before the soft one
        res = node.set_parameters([Parameter("variant_group", value="nope")])[0]
        assert not res.successful and "nope" in res.reason
        res = node.set_parameters([Parameter("hard_deadline_ms", value=5_000.0)])[0]
        assert not res.successful and "before" in res.reason
        assert node.p["variant_group"] == "det" and node.p["hard_deadline_ms"] == 20_000.0
        assert node.set_parameters([Parameter("variant_group", value="")])[0].successful
    finally:
        tester.destroy_subscription(sub)
        tester.destroy_publisher(img_pub)
        h.nodes.remove(node)
        h.executor.remove_node(node)
        node.destroy_node()
