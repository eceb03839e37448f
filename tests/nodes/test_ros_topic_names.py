"""Image nodes' topics: Autoware's ``~/input/image`` and ``~/input/camera_info`` in,
``~/output/tensors``, ``~/output/detections``, ``~/output/camera_info`` and
``~/output/errors`` out, remapped as the launch file remaps them, and the remap rules
deployments wrote before the convention (``image:=...``, ``camera_info:=...``,
``~/output:=...``, ``~/errors:=...``, node-scoped too) still deciding the topic.
"""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")

from av_infer_nodes.image_node import (  # noqa: E402
    CAMERA_INFO_TOPIC,
    DETECTIONS_TOPIC,
    ERRORS_TOPIC,
    IMAGE_TOPIC,
    LEGACY_NAMES,
    OUTPUT_CAMERA_INFO_TOPIC,
    TENSORS_TOPIC,
    TOPICS,
)
from av_infer_nodes.monitoring_node import MonitoringNode  # noqa: E402
from av_infer_nodes.perception_node import PerceptionNode  # noqa: E402
from av_infer_nodes.testing import RosHarness, wait_for  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(300)]

CASES = [
    ([], "{ns}/av_infer_perception/input/image", "{ns}/av_infer_perception/input/camera_info"),
    (["-r", "~/input/image:=/camera/image_raw", "-r", "~/input/camera_info:=/camera_info"],
     "/camera/image_raw", "/camera_info"),
    # the launch file's container rules: node-scoped
    (["-r", "av_infer_perception:~/input/image:=/camera/image_raw",
      "-r", "av_infer_monitoring:~/input/image:=/cabin/image_raw"],
     "/camera/image_raw", "{ns}/av_infer_perception/input/camera_info"),
    # rules written before ~/input/*: still apply
    (["-r", "image:=/front/image_raw", "-r", "camera_info:=/front/camera_info"],
     "/front/image_raw", "/front/camera_info"),
    (["-r", "av_infer_perception:image:=/rear/image_raw", "-r", "other_node:image:=/x"],
     "/rear/image_raw", "{ns}/av_infer_perception/input/camera_info"),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_input_topics(case):
    # a namespace per case: a previous case's node may linger in the graph a while
    rules, image, info = CASES[case]
    ns = f"/names_case{case}"
    image, info = image.format(ns=ns), info.format(ns=ns)
    params = [Parameter("model", value="tiny_cnn"), Parameter("runtime", value="remote"),
              Parameter("use_camera_info", value=True)]
    with RosHarness(executor="single") as h:
        node = h.add(PerceptionNode(
            context=h.context, cli_args=["--ros-args", "-r", f"__ns:={ns}", *rules],
            parameter_overrides=params))
        assert (node._sub.topic_name, node._info_sub.topic_name) == (image, info)
        # and the graph says so (what `ros2 node info` shows)
        tester = h.node("names_tester")
        wait_for(lambda: {image, info} <= {
            n for n, _ in tester.get_subscriber_names_and_types_by_node(
                "av_infer_perception", ns)}, 60, what="the node's subscriptions in the graph")


#: rules -> (tensors, errors, detections, output camera_info)
OUTPUT_CASES = [
    ([], "{ns}/av_infer_perception/output/tensors", "{ns}/av_infer_perception/output/errors",
     "{ns}/av_infer_perception/output/detections",
     "{ns}/av_infer_perception/output/camera_info"),
    # the launch file's container rules (node-scoped), with its defaults: the old names
    (["-r", "av_infer_perception:~/output/tensors:=/av_infer_perception/output",
      "-r", "av_infer_perception:~/output/errors:=/av_infer_perception/errors",
      "-r", "av_infer_perception:~/output/detections:=/perception/objects",
      "-r", "av_infer_monitoring:~/output/tensors:=/elsewhere"],
     "/av_infer_perception/output", "/av_infer_perception/errors", "/perception/objects",
     "{ns}/av_infer_perception/output/camera_info"),
    # rules written before ~/output/*: still apply, plain and node-scoped
    (["-r", "~/output:=/front/tensors", "-r", "av_infer_perception:~/errors:=/front/errors",
      "-r", "~/output/camera_info:=/front/model_info"],
     "/front/tensors", "/front/errors", "{ns}/av_infer_perception/output/detections",
     "/front/model_info"),
]


@pytest.mark.parametrize("case", range(len(OUTPUT_CASES)))
def test_output_topics(case):
    rules, *want = OUTPUT_CASES[case]
    ns = f"/out_names_case{case}"
    want = [w.format(ns=ns) for w in want]
    params = [Parameter("model", value="tiny_cnn"), Parameter("runtime", value="remote"),
              Parameter("use_camera_info", value=True), Parameter("decoder", value="yolo")]
    with RosHarness(executor="single") as h:
        node = h.add(PerceptionNode(
            context=h.context, cli_args=["--ros-args", "-r", f"__ns:={ns}", *rules],
            parameter_overrides=params))
        got = [p.topic_name for p in (node._pub, node._err_pub, node._det_pub, node._info_pub)]
        assert got == want
        tester = h.node("out_names_tester")
        wait_for(lambda: set(want) <= {
            n for n, _ in tester.get_publisher_names_and_types_by_node(
                "av_infer_perception", ns)}, 60, what="the node's publishers in the graph")


def test_monitoring_node_and_constants():
    assert (IMAGE_TOPIC, CAMERA_INFO_TOPIC) == ("~/input/image", "~/input/camera_info")
    assert TOPICS == (IMAGE_TOPIC, CAMERA_INFO_TOPIC, TENSORS_TOPIC, DETECTIONS_TOPIC,
                      OUTPUT_CAMERA_INFO_TOPIC, ERRORS_TOPIC)
    assert all(t.startswith(("~/input/", "~/output/")) for t in TOPICS)
    assert LEGACY_NAMES[TENSORS_TOPIC] == "~/output" and LEGACY_NAMES[ERRORS_TOPIC] == "~/errors"
    with RosHarness(executor="single") as h:
        node = h.add(MonitoringNode(context=h.context, parameter_overrides=[
            Parameter("model", value="tiny_cnn"), Parameter("runtime", value="remote")]))
        assert node._sub.topic_name == "/av_infer_monitoring/input/image"
        assert node._pub.topic_name == "/av_infer_monitoring/output/tensors"
        assert node._err_pub.topic_name == "/av_infer_monitoring/output/errors"
        assert node._info_sub is None  # use_camera_info off: no CameraInfo subscription
