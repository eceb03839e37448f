#!/usr/bin/env python3
"""Where the ROS path's time goes for one 320x240 rgb8 image -> inception_v3 (scaled).

One runtime, one PerceptionNode and a camera/consumer node on one single-threaded executor
(the demo's layout, minus the other clients); 400 images one at a time (the first 50 are
warm-up). Prints p50/p90 of: image transport to the callback, preprocessing, submit +
inference inside the callback, building and publishing the output, and the output's hop to
the consumer; then a direct ``submit`` of the same tensor (the alternative), with the same
3 ms pause between requests as between images (back to back, a direct submit ran 0.6-0.9
ms against 1.0-1.4 ms with the pause: warm caches, no idle wake-up). Wall clock on a
possibly shared machine: compare the rows of one run.

    scripts/netns_run.sh .venv/bin/python scripts/ros_path_breakdown.py [EXECUTOR|-] [PAUSE_MS]

(the executor: single, lean or multi; default, or ``-``: ``av_infer_nodes.common.
DEFAULT_EXECUTOR``; ``PAUSE_MS``: the pause
between images and between direct submits, default 3; 0 runs both back to back, where the
caches still hold what the last frame touched: the difference between the two is what the
time away costs on this host, docs/ros.md)
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
from av_infer_msgs.msg import TensorList
from av_infer_nodes import image_node as imn
from av_infer_nodes.image_node import IMAGE_QOS, ImageInferenceNode
from av_infer_nodes.perception_node import PerceptionNode
from av_infer_nodes.testing import RosHarness, make_image, wait_for
from rclpy.parameter import Parameter
from sensor_msgs.msg import Image

from av_infer import Runtime, zoo_path

MODEL = "inception_v3"


def main() -> None:
    rt = Runtime("cpu", policy="reef")
    rt.load_model(MODEL, zoo_path(MODEL), pin=True)
    from av_infer_nodes.common import DEFAULT_EXECUTOR

    executor = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else DEFAULT_EXECUTOR
    pause = float(sys.argv[2]) * 1e-3 if len(sys.argv) > 2 else 0.003
    h = RosHarness(num_threads=2, executor=executor, start=False)
    marks: dict[str, float] = {}
    on_image, publish, to_tensor = (ImageInferenceNode._on_image, ImageInferenceNode._publish,
                                    imn.image_to_tensor)

    def timed_on_image(self, msg):  # noqa: ANN001, ANN202
        marks["cb"] = time.perf_counter()
        on_image(self, msg)
        marks["cb_end"] = time.perf_counter()

    def timed_publish(self, reply, image, t, *rest):  # noqa: ANN001, ANN002, ANN202
        marks["pub"] = time.perf_counter()
        publish(self, reply, image, t, *rest)
        marks["pub_end"] = time.perf_counter()

    def timed_to_tensor(*a, **k):  # noqa: ANN002, ANN003, ANN202
        marks["pre"] = time.perf_counter()
        r = to_tensor(*a, **k)
        marks["pre_end"] = time.perf_counter()
        return r

    ImageInferenceNode._on_image, ImageInferenceNode._publish = timed_on_image, timed_publish
    imn.image_to_tensor = timed_to_tensor
    h.add(PerceptionNode("perception_front", context=h.context, runtime=rt,
                         cli_args=["--ros-args", "-r", "~/input/image:=/front/image_raw"],
                         parameter_overrides=[Parameter("model", value=MODEL),
                                              Parameter("relative_deadline_ms", value=33.0)]))
    cams = h.node("cams")
    pub = cams.create_publisher(Image, "/front/image_raw", IMAGE_QOS)
    got, arrived = threading.Event(), [0.0]

    def on_output(_msg: TensorList) -> None:
        arrived[0] = time.perf_counter()
        got.set()

    cams.create_subscription(TensorList, "/perception_front/output/tensors", on_output, 10)
    h.start()
    wait_for(lambda: pub.get_subscription_count() > 0, 10, what="the image subscription")
    img = make_image(cams, "front_camera", 240, 320, "rgb8", seed=1)
    rows = []
    for i in range(400):
        got.clear()
        t0 = time.perf_counter()
        img.header.stamp = cams.get_clock().now().to_msg()
        pub.publish(img)
        if got.wait(2) and i >= 50:
            m = dict(marks)
            rows.append([m["cb"] - t0, m["pre_end"] - m["pre"], m["pub"] - m["pre_end"],
                         m["pub_end"] - m["pub"], arrived[0] - m["cb_end"], arrived[0] - t0])
        time.sleep(pause)
    a = np.array(rows) * 1e3
    for j, n in enumerate(["image transport", "preprocess", "submit+infer", "build+publish",
                           "output hop", "ROS path total"]):
        print(f"{n:16s} p50 {np.percentile(a[:, j], 50):.3f}  p90 "
              f"{np.percentile(a[:, j], 90):.3f} ms")
    (name, (shape, _)), = rt.input_spec(MODEL).items()
    x = {name: np.zeros(shape, np.float32)}
    d = []
    for _ in range(300):
        t0 = time.perf_counter()
        rt.submit(MODEL, x, priority="RT").result()
        d.append((time.perf_counter() - t0) * 1e3)
        time.sleep(pause)  # the same pause as between images: back to back is cache-warm
    print(f"{'direct submit':16s} p50 {np.percentile(d, 50):.3f} ms  (executor {executor}, "
          f"pause {pause * 1e3:g} ms, load average {os.getloadavg()[0]:.2f})")
    os._exit(0)  # the harness' executor thread: no orderly teardown needed for a probe


if __name__ == "__main__":
    main()
