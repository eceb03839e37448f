"""Monitoring node ``av_infer_monitoring``: cabin/driver images -> best-effort inference.

BE client: no deadline by default; its requests use what RT work leaves of the device and
are preempted when RT work arrives.
"""

from __future__ import annotations

from typing import Any

from av_infer_nodes.common import spin_nodes
from av_infer_nodes.image_node import ImageInferenceNode


class MonitoringNode(ImageInferenceNode):
    """BE image inference (see ``image_node``)."""

    default_priority = "BE"
    default_deadline_ms = 0.0

    def __init__(self, node_name: str = "av_infer_monitoring", **kwargs: Any):
        super().__init__(node_name, **kwargs)


def main(args: list[str] | None = None) -> None:
    """Runs one monitoring node in its own process (reaches the runtime host remotely)."""
    spin_nodes(lambda: [MonitoringNode()], args)


if __name__ == "__main__":
    main()
