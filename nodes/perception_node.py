"""Perception node ``av_infer_perception``: camera images -> RT inference with deadlines.

Real-time client: each image is submitted as an RT request due at
``header.stamp + relative_deadline_ms`` (default 33 ms, one frame at 30 Hz).
"""

from __future__ import annotations

from typing import Any

from av_infer_nodes.common import spin_nodes
from av_infer_nodes.image_node import ImageInferenceNode


class PerceptionNode(ImageInferenceNode):
    """RT image inference (see ``image_node``)."""

    default_priority = "RT"
    default_deadline_ms = 33.0
    default_run_in_callback = True

    def __init__(self, node_name: str = "av_infer_perception", **kwargs: Any):
        super().__init__(node_name, **kwargs)


def main(args: list[str] | None = None) -> None:
    """Runs one perception node in its own process (reaches the runtime host remotely)."""
    spin_nodes(lambda: [PerceptionNode()], args)


if __name__ == "__main__":
    main()
