"""av_infer's rclpy nodes (installed as ``av_infer_nodes``).

* ``runtime_node``: ``av_infer_runtime``, owns the Runtime, /diagnostics, request endpoint;
  its jobs in ``runtime_params`` (the parameter table), ``runtime_build``,
  ``runtime_requests``, ``runtime_services`` and ``runtime_diagnostics``;
* ``perception_node``: ``av_infer_perception``, RT image inference;
* ``monitoring_node``: ``av_infer_monitoring``, BE image inference;
* ``container``: ``av_infer_container``, all of them in one process;
* ``lean_executor``: the default executor (``common.make_executor``: rclpy's
  single-threaded one with a cheaper iteration, the data path waited on apart);
* ``sros2_policy``: an SROS2 policy file from a deployment's own topics and services.

Messages and services: the ``av_infer_msgs`` interface package (ros/av_infer_msgs). All
nodes are managed (``rclpy.lifecycle``) and autostart by default. ROS-free logic lives in
``preprocess``, ``av_infer.tensor_codec`` and ``av_infer.model_admin``. See docs/ros.md.
"""
