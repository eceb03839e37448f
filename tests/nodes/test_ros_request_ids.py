"""Image nodes' request ids (a uuid4 per node instance and a counter, not a uuid4 per image:
docs/ros.md, "ROS path cost"): every image is answered exactly once, and no two requests
share an id, within one node, between two nodes, or between a node and its successor.

Run inside scripts/netns_run.sh: LOCALHOST discovery, fresh netns.
"""

from __future__ import annotations

import threading
import time

import pytest

rclpy = pytest.importorskip("rclpy")

from av_infer_msgs.msg import TensorList  # noqa: E402
from av_infer_nodes.image_node import IMAGE_QOS  # noqa: E402
from av_infer_nodes.perception_node import PerceptionNode  # noqa: E402
from av_infer_nodes.testing import Collector, RosHarness, make_image, wait_for  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from av_infer import Runtime, zoo_path  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(300)]

N = 12  # images per node, one at a time


def _node(h: RosHarness, rt: Runtime, name: str) -> PerceptionNode:
    return h.add(PerceptionNode(name, context=h.context, runtime=rt,
                                cli_args=["--ros-args", "-r", f"~/input/image:=/{name}/image"],
                                parameter_overrides=[Parameter("model", value="tiny_cnn"),
                                                     Parameter("relative_deadline_ms",
                                                               value=0.0)]))


def _answered(ids: list, n: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while len(ids) < n:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _drive(h: RosHarness, node: PerceptionNode, ids: list, tag: str) -> None:
    """N images to ``node`` one at a time; each answer's (id, code) goes to ``ids``."""
    lock = threading.Lock()

    def listen(reply, image, t_recv):  # noqa: ANN001
        with lock:
            ids.append((reply.id, reply.code))

    node.add_result_listener(listen)
    name = node.get_name()
    tester = h.node(f"{tag}_tester")
    pub = tester.create_publisher(Image, f"/{name}/image", IMAGE_QOS)
    outputs = Collector()
    tester.create_subscription(TensorList, f"/{name}/output/tensors", outputs, 10)
    wait_for(lambda: pub.get_subscription_count() > 0, 60, what="the image subscription")
    img = make_image(tester, "cam", 48, 64, "rgb8", seed=3)
    for i in range(N):
        # best effort, depth 1: re-published until an answer is in (a hang guard, not a
        # timed assertion: a slow answer only means one more request)
        for _ in range(60):
            img.header.stamp = tester.get_clock().now().to_msg()
            pub.publish(img)
            if _answered(ids, i + 1):
                break
        else:
            raise TimeoutError(f"{name}: no answer to image {i}")
    wait_for(lambda: len(outputs.snapshot()) >= len(ids), 60, what="the outputs")


def test_request_ids_unique_and_answered_once():
    rt = Runtime("cpu", policy="reef")
    rt.load_model("tiny_cnn", zoo_path("tiny_cnn"))
    try:
        with RosHarness(executor="lean") as h:
            a, b = _node(h, rt, "ids_a"), _node(h, rt, "ids_b")
            got = {"a": [], "b": []}
            _drive(h, a, got["a"], "a")
            _drive(h, b, got["b"], "b")
            # a successor of node a (a restart): its ids are new too
            h.executor.remove_node(a)
            h.nodes.remove(a)
            a.destroy_node()
            a2 = _node(h, rt, "ids_a")
            got["a2"] = []
            _drive(h, a2, got["a2"], "a2")
            for k, rows in got.items():
                assert all(code == "ok" for _, code in rows), (k, rows)
            # each request answered once: as many answers as requests submitted
            for k, node in (("a", a), ("b", b), ("a2", a2)):
                c = node.counters
                assert c["completed"] == c["submitted"] == len(got[k]), (k, c)
            every = [rid for rows in got.values() for rid, _ in rows]
            assert len(set(every)) == len(every)
            prefixes = {k: {rid.rsplit("-", 1)[0] for rid, _ in rows} for k, rows in got.items()}
            assert all(len(p) == 1 for p in prefixes.values()), prefixes
            assert len({next(iter(p)) for p in prefixes.values()}) == 3, prefixes
    finally:
        rt.close(drain=False)
