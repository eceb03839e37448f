#!/usr/bin/env python3
"""What one idle iteration of a single-threaded rclpy executor costs on the demo's graph.

rclpy's executors rebuild the wait set, every entity of every node (services, subscriptions,
timers, guard conditions, waitables such as QoS-event handlers), on each iteration, in
Python; on the ROS path one such iteration lies between publishing an output and a
subscriber on the same executor receiving it. This builds the demo's node set (runtime host,
two perception nodes, one monitoring node, a camera node; tiny_cnn, nothing published) and
times ``spin_once(timeout_sec=0)`` with nothing ready. ``--default-events`` gives av_infer's
endpoints rclpy's default QoS-event handlers again (``PUB_EVENTS``/``SUB_EVENTS`` off), the
A/B for docs/ros.md ("Executor iteration"). Wall clock: run under the quiet lock.

    scripts/netns_run.sh .venv/bin/python scripts/executor_iteration_cost.py [--default-events]
        [--executor lean]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--default-events", action="store_true",
                    help="rclpy's default QoS-event handlers on av_infer's endpoints")
    ap.add_argument("-n", type=int, default=3000, help="timed iterations (3000)")
    ap.add_argument("--executor", default="single",
                    help="single (rclpy's SingleThreadedExecutor) or lean (LeanExecutor)")
    args = ap.parse_args()
    from av_infer_nodes import common

    if args.default_events:  # before the nodes import the constants
        common.PUB_EVENTS = common.SUB_EVENTS = None
    from av_infer_nodes import image_node, runtime_node

    if args.default_events:
        for mod in (image_node, runtime_node):
            mod.PUB_EVENTS = mod.SUB_EVENTS = None
    from av_infer_nodes.monitoring_node import MonitoringNode
    from av_infer_nodes.perception_node import PerceptionNode
    from av_infer_nodes.runtime_node import RuntimeNode
    from av_infer_nodes.testing import RosHarness
    from rclpy.parameter import Parameter

    from av_infer import Runtime

    rt = Runtime("cpu", policy="reef")
    h = RosHarness(num_threads=1, executor=args.executor, start=False)
    h.add(RuntimeNode(context=h.context, runtime=rt, parameter_overrides=[
        Parameter("device", value="cpu"), Parameter("models", value=["tiny_cnn"])]))
    for cam in ("front", "rear"):
        h.add(PerceptionNode(f"perception_{cam}", context=h.context, runtime=rt,
                             parameter_overrides=[Parameter("model", value="tiny_cnn")]))
    h.add(MonitoringNode("monitoring_cabin", context=h.context, runtime=rt,
                         parameter_overrides=[Parameter("model", value="tiny_cnn")]))
    h.node("demo_cameras")
    ex = h.executor
    entities = sum(len(list(getattr(n, kind))) for n in ex.get_nodes()
                   for kind in ("services", "subscriptions", "timers", "guards", "clients",
                                "waitables"))
    for _ in range(50):
        ex.spin_once(timeout_sec=0)
    d = []
    for _ in range(args.n):
        t0 = time.perf_counter()
        ex.spin_once(timeout_sec=0)
        d.append((time.perf_counter() - t0) * 1e6)
    print(f"executor {args.executor}, nodes {len(ex.get_nodes())}, wait-set entities "
          f"{entities}, default_events "
          f"{args.default_events}: idle spin_once p50 {np.percentile(d, 50):.1f} / p90 "
          f"{np.percentile(d, 90):.1f} us (load average {os.getloadavg()[0]:.2f})")
    os._exit(0)  # a probe: no orderly teardown needed


if __name__ == "__main__":
    main()
