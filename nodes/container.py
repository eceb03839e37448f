"""``av_infer_container``: the runtime host and its client nodes in ONE process.

The ROS user's component container, for av_infer: the nodes share the Runtime object
(perception/monitoring call it directly, no serialisation) and one executor (``lean`` by
default, chosen by measurement: ``av_infer_nodes.common.EXECUTORS``).
``--ros-args`` (params files, remaps, ``-p``) apply to every node as usual; the non-ROS
options pick which client nodes to compose.
"""

from __future__ import annotations

import argparse
import sys

from av_infer_nodes.common import EXECUTORS, spin_nodes
from av_infer_nodes.monitoring_node import MonitoringNode
from av_infer_nodes.perception_node import PerceptionNode
from av_infer_nodes.runtime_node import RuntimeNode
from rclpy.node import Node
from rclpy.utilities import remove_ros_args


def compose(perception: bool = True, monitoring: bool = True) -> list[Node]:
    """Runtime host first (it owns the Runtime), then the clients that share it."""
    host = RuntimeNode()
    nodes: list[Node] = [host]
    if perception:
        nodes.append(PerceptionNode(runtime=host.runtime))
    if monitoring:
        nodes.append(MonitoringNode(runtime=host.runtime))
    return nodes


def main(args: list[str] | None = None) -> None:
    args = sys.argv if args is None else args
    parser = argparse.ArgumentParser(prog="av_infer_container", description=__doc__)
    parser.add_argument("--no-perception", action="store_true",
                        help="do not compose the perception node")
    parser.add_argument("--no-monitoring", action="store_true",
                        help="do not compose the monitoring node")
    parser.add_argument("--executor", choices=EXECUTORS, default=None,
                        help="executor (default: $AV_INFER_EXECUTOR or lean; "
                        "see av_infer_nodes.common.EXECUTORS for why)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads of the multi executor")
    opts = parser.parse_args(remove_ros_args(args)[1:])
    spin_nodes(lambda: compose(not opts.no_perception, not opts.no_monitoring), args,
               num_threads=opts.threads, executor_kind=opts.executor)


if __name__ == "__main__":
    main()
