"""av_infer's rclpy nodes (installed as ``av_infer_nodes``).

* ``runtime_node``: ``av_infer_runtime``, owns the Runtime, /diagnostics, request endpoint;
* ``perception_node``: ``av_infer_perception``, RT image inference;
* ``monitoring_node``: ``av_infer_monitoring``, BE image inference;
* ``container``: ``av_infer_container``, all of them in one process.

ROS-free logic lives in ``preprocess`` and ``av_infer.tensor_codec``. See docs/ros.md.
"""
