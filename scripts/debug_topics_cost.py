#!/usr/bin/env python3
"""Cost of the Autoware-style debug topics per input (``debug_topics``): the three
publishes an image node makes per image (``~/debug/cyclic_time_ms``,
``processing_time_ms``, ``pipeline_latency_ms``; ``common.publish_cyclic`` +
``publish_debug``), without and with a subscriber on each. Wall clock on a possibly shared
machine: compare the rows of one run.

    scripts/netns_run.sh .venv/bin/python scripts/debug_topics_cost.py
"""

from __future__ import annotations

import statistics
import time

import rclpy
from av_infer_msgs.msg import Float64Stamped
from av_infer_nodes.common import debug_publishers, publish_cyclic, publish_debug
from rclpy.node import Node

TOPICS = ("processing_time_ms", "pipeline_latency_ms", "cyclic_time_ms")


def main(n: int = 2000, reps: int = 5) -> None:
    rclpy.init()
    node = Node("debug_cost")
    pubs = debug_publishers(node, True)
    stamp = node.get_clock().now().to_msg()
    for with_subs in (False, True):
        if with_subs:
            for t in TOPICS:
                node.create_subscription(Float64Stamped, f"/debug_cost/debug/{t}",
                                         lambda m: None, 10)
            time.sleep(1.0)  # discovery
        rows = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n):
                t = time.monotonic()
                publish_cyclic(pubs, node, 33.0)
                publish_debug(pubs, node, t, stamp)
            rows.append((time.perf_counter() - t0) / n * 1e6)
        print(f"subscribers={with_subs}: us per image (3 publishes), {reps} x {n}: "
              f"{[round(r, 1) for r in rows]}, median {statistics.median(rows):.1f}")
    node.destroy_node()
    rclpy.shutdown()


if __name__ == "__main__":
    main()
