#!/usr/bin/env python3
"""Cost of the Autoware-style debug topics per input (``debug_topics``): the three
publishes an image node makes per image (``~/debug/cyclic_time_ms``,
``processing_time_ms``, ``pipeline_latency_ms``; ``common.publish_cyclic`` +
``publish_debug``): without subscribers (``DebugTopics`` then publishes nothing), the same
with every value published regardless, and with a subscriber on each; and the input health checks
every image runs (``image_node.InputHealth``: a ROS clock read, the rate and stamp ticks,
the deadline verdict, as ``_on_image``/``_done`` make them). Wall clock on a possibly
shared machine: compare the rows of one run.

    scripts/netns_run.sh .venv/bin/python scripts/debug_topics_cost.py
"""

from __future__ import annotations

import statistics
import threading
import time

import rclpy
from av_infer_msgs.msg import Float64Stamped
from av_infer_nodes.common import Reply, debug_publishers, publish_cyclic, publish_debug
from av_infer_nodes.image_node import InputHealth, missed_deadline
from rclpy.node import Node

TOPICS = ("processing_time_ms", "pipeline_latency_ms", "cyclic_time_ms")


def main(n: int = 2000, reps: int = 5) -> None:
    rclpy.init()
    node = Node("debug_cost")
    pubs = debug_publishers(node, True)
    stamp = node.get_clock().now().to_msg()
    known = pubs.counts
    # without subscribers as the node runs them (nothing published), the same with every
    # value published (what a middleware without matched events gets), and with one
    # subscriber on each topic (its match handled by spinning the node)
    for mode in ("no subscribers", "no subscribers, published regardless",
                 "a subscriber on each"):
        pubs.counts = None if mode.endswith("regardless") else known
        if mode == "a subscriber on each":
            for t in TOPICS:
                node.create_subscription(Float64Stamped, f"/debug_cost/debug/{t}",
                                         lambda m: None, 10)
            deadline = time.monotonic() + 10.0
            while min(known) < 1 and time.monotonic() < deadline:
                rclpy.spin_once(node, timeout_sec=0.1)  # the matched events
            print(f"subscribers counted from matched events: {known}")
        rows = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n):
                t = time.monotonic()
                publish_cyclic(pubs, node, 33.0)
                publish_debug(pubs, node, t, stamp)
            rows.append((time.perf_counter() - t0) / n * 1e6)
        print(f"{mode}: us per image (3 publishes), {reps} x {n}: "
              f"{[round(r, 1) for r in rows]}, median {statistics.median(rows):.1f}")
    p = dict(expected_hz=30.0, rate_tolerance=0.1, stale_timeout_s=1.0, max_stamp_age_ms=100.0,
             max_stamp_future_ms=50.0, deadline_miss_warn=1, deadline_miss_error=3)
    health, lock = InputHealth(p, time.monotonic()), threading.Lock()

    class Timings:
        end = 1.0

    reply = Reply(id="x", timings=Timings(), deadline=2.0)
    rows = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n * 10):
            t = time.monotonic()
            now_ros = node.get_clock().now().nanoseconds * 1e-9
            with lock:
                health.rate.tick(t)
                health.stamps.tick(now_ros - 0.01, now_ros)
            missed = missed_deadline(reply)
            with lock:
                health.misses.tick(bool(missed))
        rows.append((time.perf_counter() - t0) / (n * 10) * 1e6)
    print(f"health checks: us per image, {reps} x {n * 10}: {[round(r, 1) for r in rows]}, "
          f"median {statistics.median(rows):.1f}")
    node.destroy_node()
    rclpy.shutdown()


if __name__ == "__main__":
    main()
