#!/usr/bin/env python3
"""Where one image's ROS path spends its time, executor steps included.

The demo's graph (runtime host, two perception nodes, a monitoring node and a camera
node that also subscribes the front output; ``--graph small``: the front perception node
and the camera node only), one 320x240 rgb8 image to inception_v3 (scaled) at a time,
``-n`` images after 50 warm-up, 4 ms apart. Timestamps (``perf_counter``) from wrapping
rclpy's ``WaitSet.wait`` and ``Executor._take_subscription`` and the image node's
callback and ``_publish``; printed as p50/p90 ms:

* ``publish() call``: the camera's ``Publisher.publish`` of the image (serialisation and
  the intra-process DDS delivery, on the publishing thread);
* ``to wake``: its return to the executor's wait returning (the first wait return after
  it; n/a when the wait had returned before the publish call ended);
* ``wake to take``: the executor's work between the wait and taking the message;
* ``take``: ``take_message`` (deserialisation into a Python message);
* ``take to callback``; ``callback``: the image callback (preprocessing, the inference
  run in it, building and publishing the output: ``of it build+publish``);
* ``output hop``: the image callback's end to the output subscriber's callback.

Then a direct ``submit`` of the same tensor with the same pause. Wall clock on a shared
machine: compare executors in alternating runs.

    scripts/netns_run.sh .venv/bin/python scripts/ros_executor_hops.py --executor single
    scripts/netns_run.sh .venv/bin/python scripts/ros_executor_hops.py --executor lean
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np
import rclpy.executors as rclpy_executors
from rclpy.impl.implementation_singleton import rclpy_implementation as _real

EV: list[tuple[str, float]] = []


class _WaitSet:
    """rclpy's WaitSet, recording when each wait returns."""

    def __init__(self, *a):  # noqa: ANN002
        self._w = _real.WaitSet(*a)

    def wait(self, timeout):  # noqa: ANN001, ANN201
        r = self._w.wait(timeout)
        EV.append(("woke", time.perf_counter()))
        return r

    def __getattr__(self, name):  # noqa: ANN001, ANN204
        return getattr(self._w, name)


class _Impl:
    WaitSet = _WaitSet

    def __getattr__(self, name):  # noqa: ANN001, ANN204
        return getattr(_real, name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--executor", default=None, help="lean, single (default: the default)")
    ap.add_argument("--graph", default="demo", choices=("demo", "small"))
    ap.add_argument("-n", type=int, default=250, help="measured images (250)")
    args = ap.parse_args()
    from av_infer_nodes import lean_executor

    rclpy_executors._rclpy = lean_executor._rclpy = _Impl()
    take = rclpy_executors.Executor._take_subscription

    def timed_take(self, sub):  # noqa: ANN001, ANN202
        EV.append(("take", time.perf_counter()))
        r = take(self, sub)
        EV.append(("taken", time.perf_counter()))
        return r

    rclpy_executors.Executor._take_subscription = timed_take

    from av_infer_msgs.msg import TensorList
    from av_infer_nodes.common import DEFAULT_EXECUTOR
    from av_infer_nodes.image_node import IMAGE_QOS, ImageInferenceNode
    from av_infer_nodes.monitoring_node import MonitoringNode
    from av_infer_nodes.perception_node import PerceptionNode
    from av_infer_nodes.runtime_node import RuntimeNode
    from av_infer_nodes.testing import RosHarness, make_image, wait_for
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import Image

    from av_infer import Runtime, zoo_path

    model = "inception_v3"
    executor = args.executor or DEFAULT_EXECUTOR
    on_image, publish = ImageInferenceNode._on_image, ImageInferenceNode._publish

    def timed_on_image(self, msg):  # noqa: ANN001, ANN202
        EV.append(("cb", time.perf_counter()))
        on_image(self, msg)
        EV.append(("cb_end", time.perf_counter()))

    def timed_publish(self, *a):  # noqa: ANN001, ANN002, ANN202
        EV.append(("pub", time.perf_counter()))
        publish(self, *a)
        EV.append(("pub_end", time.perf_counter()))

    ImageInferenceNode._on_image, ImageInferenceNode._publish = timed_on_image, timed_publish
    rt = Runtime("cpu", policy="reef")
    rt.load_model(model, zoo_path(model), pin=True)
    h = RosHarness(num_threads=2, executor=executor, start=False)
    m = [Parameter("model", value=model)]
    if args.graph == "demo":
        h.add(RuntimeNode(context=h.context, runtime=rt, parameter_overrides=[
            Parameter("device", value="cpu"), Parameter("models", value=[model])]))
    h.add(PerceptionNode("perception_front", context=h.context, runtime=rt,
                         cli_args=["--ros-args", "-r", "~/input/image:=/front/image_raw"],
                         parameter_overrides=[*m, Parameter("relative_deadline_ms", value=33.0)]))
    if args.graph == "demo":
        h.add(PerceptionNode("perception_rear", context=h.context, runtime=rt,
                             cli_args=["--ros-args", "-r", "~/input/image:=/rear/image_raw"],
                             parameter_overrides=m))
        h.add(MonitoringNode("monitoring_cabin", context=h.context, runtime=rt,
                             cli_args=["--ros-args", "-r", "~/input/image:=/cabin/image_raw"],
                             parameter_overrides=m))
    cams = h.node("cams")
    pub = cams.create_publisher(Image, "/front/image_raw", IMAGE_QOS)
    got, arrived = threading.Event(), [0.0]

    def on_output(_msg: TensorList) -> None:
        arrived[0] = time.perf_counter()
        got.set()

    cams.create_subscription(TensorList, "/perception_front/output/tensors", on_output, 10)
    h.start()
    wait_for(lambda: pub.get_subscription_count() > 0, 30, what="the image subscription")
    img = make_image(cams, "front_camera", 240, 320, "rgb8", seed=1)
    rows = []
    for i in range(args.n + 50):
        time.sleep(0.004)
        got.clear()
        EV.clear()
        t0 = time.perf_counter()
        img.header.stamp = cams.get_clock().now().to_msg()
        pub.publish(img)
        t_ret = time.perf_counter()
        if not got.wait(5) or i < 50:
            continue
        ev = list(EV)
        first = {}
        for k, t in ev:
            first.setdefault(k, t)
        cb, cb_end = first["cb"], first["cb_end"]
        woke = next((t for k, t in ev if k == "woke" and t_ret <= t <= cb), None)
        take_t = next((t for k, t in ev if k == "take" and t <= cb), None)
        taken = next((t for k, t in ev if k == "taken" and t <= cb), None)
        nan = float("nan")
        rows.append([t_ret - t0, (woke - t_ret) if woke else nan,
                     (take_t - (woke or t_ret)) if take_t else nan,
                     (taken - take_t) if take_t and taken else nan,
                     (cb - taken) if taken else nan, cb_end - cb,
                     first["pub_end"] - first["pub"], arrived[0] - cb_end, arrived[0] - t0])
    a = np.array(rows) * 1e3
    names = ["publish() call", "to wake", "wake to take", "take", "take to callback",
             "callback", "  of it build+publish", "output hop", "ROS path total"]
    for j, name in enumerate(names):
        col = a[:, j][~np.isnan(a[:, j])]
        print(f"{name:22s} p50 {np.percentile(col, 50):.3f}  p90 {np.percentile(col, 90):.3f}"
              if len(col) else f"{name:22s} n/a")
    (name, (shape, _)), = rt.input_spec(model).items()
    x = {name: np.zeros(shape, np.float32)}
    d = []
    for _ in range(200):
        time.sleep(0.004)
        t0 = time.perf_counter()
        rt.submit(model, x, priority="RT").result()
        d.append((time.perf_counter() - t0) * 1e3)
    print(f"{'direct submit':22s} p50 {np.percentile(d, 50):.3f}  (executor {executor}, graph "
          f"{args.graph}, n {len(rows)}, load average {os.getloadavg()[0]:.2f})")
    os._exit(0)  # a probe: no orderly teardown needed


if __name__ == "__main__":
    main()
