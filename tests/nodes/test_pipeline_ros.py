"""A two-stage pipeline of a zoo model across two stage processes over ROS 2
(``av_infer_msgs`` tensors), this test process running the executor (the batcher).

Bounded: two stage processes that exit by themselves after ``max_lifetime_s``; every wait
is on a condition bounded by ``WAIT_S`` only against hangs; no timed assertions (the SLO
is generous: the test checks that deadlines travel and are met, not a latency).

Run inside scripts/netns_run.sh (make test does): LOCALHOST discovery, fresh netns.
"""

from __future__ import annotations

import array
import threading

import numpy as np
import onnxruntime as ort
import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("av_infer_msgs.msg")

from av_infer_msgs.msg import InferRequest, InferResponse, Tensor, TensorShape  # noqa: E402
from av_infer_nodes.common import REQUEST_QOS  # noqa: E402
from av_infer_nodes.pipeline_stage_node import RemoteLane, topic  # noqa: E402
from av_infer_nodes.testing import WAIT_S, NodeProcess, RosHarness, wait_for  # noqa: E402

from av_infer import tensor_codec as codec  # noqa: E402
from av_infer.errors import DeadlineMissedError  # noqa: E402
from av_infer.model import zoo  # noqa: E402
from av_infer.pipeline.block_profiles import block_profiles  # noqa: E402
from av_infer.pipeline.cluster import parse_cluster  # noqa: E402
from av_infer.pipeline.errors import MalformedFeatureMapError, StageFailedError  # noqa: E402
from av_infer.pipeline.executor import PipelineExecutor  # noqa: E402
from av_infer.pipeline.planner import plan_cluster  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(600)]  # a hang guard
MODEL = "resnet152"
SLO_MS = 10000.0  # generous on purpose (see the module docstring)


def _wait_all(futs, timeout=WAIT_S):
    done = threading.Event()
    left = [len(futs)]
    lock = threading.Lock()

    def one(_f):
        with lock:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    for f in futs:
        f.add_done_callback(one)
    if futs:
        assert done.wait(timeout), f"{left[0]} of {len(futs)} requests never answered"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    logs = tmp_path_factory.mktemp("pipeline_logs")
    procs = [NodeProcess("av_infer_nodes.pipeline_stage_node", log_dir=logs, ros_args=[
        "-r", f"__node:=pipeline_stage_{i}", "-p", f"stage_id:=s{i}",
        "-p", "max_lifetime_s:=400.0"]) for i in range(2)]
    harness = RosHarness(start=False)
    node = harness.node("pipeline_coordinator")
    lanes = [RemoteLane(node, f"s{i}", dead_after_s=3.0, wait_s=WAIT_S) for i in range(2)]
    replies: dict[str, InferResponse] = {}
    node.create_subscription(InferResponse, topic("s0", "response"),
                             lambda m: replies.__setitem__(m.id, m), REQUEST_QOS)
    raw = node.create_publisher(InferRequest, topic("s0", "request"), REQUEST_QOS)
    harness.start()
    try:
        for lane in lanes:
            lane.wait_alive()
        cluster = parse_cluster("cpu:2")
        profiles = block_profiles([MODEL], cluster.types)
        slo = {MODEL: SLO_MS}
        plan = plan_cluster(profiles, cluster, slo, min_partitions=2, max_partitions=2)
        ex = PipelineExecutor(
            plan, profiles, cluster, lanes,
            replan=lambda c: plan_cluster(profiles, c, slo, max_partitions=1))
        yield {"ex": ex, "lanes": lanes, "procs": procs, "replies": replies, "raw": raw,
               "plan": plan}
        ex.close()
    finally:
        harness.close()
        for p in procs:
            p.stop()


def _reference():
    x = zoo.sample_inputs(MODEL)
    return x, ort.InferenceSession(str(zoo.path(MODEL, "scaled"))).run(None, x)[0]


def test_a_lane_reads_its_answers_from_bytes():
    """``RemoteLane`` reads a stage's answers from their serialised bytes: good outputs
    arrive as writable arrays of their own, outputs that fail the tensor checks fail their
    request with ``malformed_feature_map``, bytes that are no response count as
    ``unmatched``. A stand-in stage here (no process) publishes the answers."""
    with RosHarness() as h:
        node = h.node("lane_reader")
        lane = RemoteLane(node, "fake", dead_after_s=60.0, wait_s=WAIT_S)
        stage = h.node("fake_stage")
        answers = stage.create_publisher(InferResponse, topic("fake", "response"),
                                         REQUEST_QOS)
        wait_for(lambda: answers.get_subscription_count() > 0, what="the lane's reader")
        x = {"input": np.zeros((1, 3, 8, 8), np.float32)}
        y = np.arange(6, dtype=np.float32).reshape(2, 3)

        def answer(rid: str, strides: list[int]) -> InferResponse:
            msg = InferResponse(id=rid, code="ok", model="st")
            msg.tensors = [Tensor(name="y", shape=TensorShape(rank=2, dims=[2, 3]),
                                  data_type=9, strides=strides, data=y.tobytes())]
            return msg

        good, bad = lane.run("st", x, "BE", 0.0), lane.run("st", x, "BE", 0.0)
        answers.publish(answer("fake-1", [12, 4]))
        answers.publish(answer("fake-2", [4, 4]))  # strides that lie about the layout
        out = good.result(WAIT_S)
        assert np.array_equal(out["y"], y) and out["y"].flags.writeable
        with pytest.raises(MalformedFeatureMapError, match="cannot be read"):
            bad.result(WAIT_S)
        answers.publish(b"\x00\x01\x00\x00 no response")
        wait_for(lambda: lane.unmatched == 1, what="the unreadable bytes counted")


def test_two_stage_pipeline_across_processes_meets_its_slo(setup):
    ex, plan = setup["ex"], setup["plan"]
    (p,) = plan.pipelines
    assert [s.members for s in p.stages] == [["cpu#0/1.0"], ["cpu#1/1.0"]]
    x, ref = _reference()
    futs = [ex.submit(MODEL, x) for _ in range(20)]
    _wait_all(futs)
    for f in futs:
        np.testing.assert_allclose(f.result()["logits"], ref, rtol=1e-4, atol=1e-5)
    st = ex.stats()
    assert st["late"] == 0 and st["answered"] == 20
    assert all(lane.unmatched == 0 for lane in setup["lanes"])  # no duplicate answers


def test_malformed_feature_map_is_answered_and_the_stage_lives_on(setup):
    """Feature maps of the wrong shape, type or size, and bytes that are no request, are
    each answered (the last without an id), and the stage goes on serving."""
    stage = next(iter(setup["lanes"][0].loaded))
    raw, replies = setup["raw"], setup["replies"]
    bad_shape = InferRequest(id="bad-shape", model=stage, priority=1)
    t = codec.fill_tensor(Tensor(), "input", np.zeros((1, 3, 7, 7), np.float32))
    bad_shape.tensors = [t]
    bad_type = InferRequest(id="bad-type", model=stage, priority=1)
    t2 = Tensor(name="input", data_type=99)
    t2.shape.rank, t2.shape.dims = 1, array.array("I", [1])  # TensorShape (Isaac's layout)
    t2.data = array.array("B", [0, 0, 0, 0])
    bad_type.tensors = [t2]
    bad_bytes = InferRequest(id="bad-bytes", model=stage, priority=1)
    t3 = codec.fill_tensor(Tensor(), "input", np.zeros((1, 3, 64, 64), np.float32))
    t3.data = array.array("B", [1, 2, 3])
    bad_bytes.tensors = [t3]
    for m in (bad_shape, bad_type, bad_bytes):
        raw.publish(m)
    raw.publish(b"\x00\x01\x00\x00 no request")  # the stage reads requests from bytes
    wait_for(lambda: {"bad-shape", "bad-type", "bad-bytes", ""} <= set(replies),
             what="answers to malformed feature maps")
    assert replies[""].code == "malformed_request" and "not an InferRequest" in (
        replies[""].message)
    assert replies["bad-shape"].code == "malformed_feature_map"
    assert replies["bad-type"].code == "malformed_request"
    assert replies["bad-bytes"].code == "malformed_request"
    x, ref = _reference()
    f = setup["ex"].submit(MODEL, x)
    _wait_all([f])
    np.testing.assert_allclose(f.result()["logits"], ref, rtol=1e-4, atol=1e-5)


def test_killed_stage_fails_its_requests_and_the_planner_replans(setup):
    ex, procs = setup["ex"], setup["procs"]
    x, ref = _reference()
    futs = [ex.submit(MODEL, x) for _ in range(300)]
    wait_for(lambda: sum(f.done() for f in futs) >= 5, what="the first answers")
    procs[1].proc.kill()  # SIGKILL mid-run: no goodbye on the wire
    _wait_all(futs)
    outcomes = {"ok": 0, "stage_failed": 0, "deadline_missed": 0}
    for f in futs:
        e = f.exception()
        if e is None:
            np.testing.assert_allclose(f.result()["logits"], ref, rtol=1e-4, atol=1e-5)
            outcomes["ok"] += 1
        else:
            assert isinstance(e, (StageFailedError, DeadlineMissedError)), repr(e)
            outcomes[e.code] += 1
    print("outcomes after the kill:", outcomes)
    assert outcomes["ok"] >= 5 and outcomes["stage_failed"] >= 1, outcomes
    wait_for(lambda: ex.stats()["replans"] == 1, what="the re-plan")
    (p,) = ex.plan.pipelines
    assert len(p.stages) == 1 and ex.plan.cluster == "cpu:1"
    after = [ex.submit(MODEL, x) for _ in range(10)]
    _wait_all(after)
    for f in after:  # served by the survivor (docs/pipeline.md, "Request stream stall")
        np.testing.assert_allclose(f.result()["logits"], ref, rtol=1e-4, atol=1e-5)
