"""Launches av_infer: the runtime host with a perception (RT) and a monitoring (BE) node.

``composed:=true`` (default) runs them in one process (``av_infer_container``: the nodes
share the Runtime object); ``composed:=false`` runs one node per process, the clients
reaching the host over /av_infer/request|response. Parameters come from ``params_file``.

Topics follow Autoware's convention: the image nodes subscribe ``~/input/image`` and
``~/input/camera_info`` and publish ``~/output/tensors``, ``~/output/detections``,
``~/output/camera_info`` and ``~/output/errors`` (``image_node.TOPICS``); this file remaps
every one to a topic argument (``camera_topic`` ... ``cabin_errors_topic``) whose default
is the topic the node used before the convention (inputs ``/camera/image_raw``,
``/cabin/image_raw``, ``/camera_info``; outputs ``/<node>/output`` and ``/<node>/errors``,
the old unremapped ``~/output`` and ``~/errors``), so a deployment launched with the same
arguments uses the same topics. ``~/debug/*`` and ``/diagnostics`` are not remapped.

    ros2 launch av_infer av_infer.launch.py composed:=false params_file:=my.param.yaml
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition, UnlessCondition
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from launch import LaunchDescription


def generate_launch_description() -> LaunchDescription:
    default_params = os.path.join(get_package_share_directory("av_infer"), "param",
                                  "av_infer.param.yaml")
    composed = LaunchConfiguration("composed")
    params_file = LaunchConfiguration("params_file")
    log_level = LaunchConfiguration("log_level")
    #: (node, its topic, the launch argument it is remapped to): every image-node topic
    #: (image_node.TOPICS) of both nodes; node-scoped rules in the container
    topics = [
        ("av_infer_perception", "~/input/image", "camera_topic"),
        ("av_infer_perception", "~/input/camera_info", "camera_info_topic"),
        ("av_infer_perception", "~/output/tensors", "tensors_topic"),
        ("av_infer_perception", "~/output/detections", "detections_topic"),
        ("av_infer_perception", "~/output/camera_info", "output_info_topic"),
        ("av_infer_perception", "~/output/errors", "errors_topic"),
        ("av_infer_monitoring", "~/input/image", "cabin_topic"),
        ("av_infer_monitoring", "~/input/camera_info", "cabin_info_topic"),
        ("av_infer_monitoring", "~/output/tensors", "cabin_tensors_topic"),
        ("av_infer_monitoring", "~/output/detections", "cabin_detections_topic"),
        ("av_infer_monitoring", "~/output/camera_info", "cabin_output_info_topic"),
        ("av_infer_monitoring", "~/output/errors", "cabin_errors_topic"),
    ]

    def remaps(node: str | None) -> list[tuple]:
        """``node``'s remap rules; None: both nodes' rules, node-scoped (the container)."""
        return [(t if node else f"{n}:{t}", LaunchConfiguration(to)) for n, t, to in topics
                if node in (None, n)]

    common = {"output": "screen", "emulate_tty": True,
              "arguments": ["--ros-args", "--log-level", log_level]}
    return LaunchDescription([
        DeclareLaunchArgument("composed", default_value="true",
                              description="true: all nodes in one process (av_infer_container);"
                                          " false: one process per node"),
        DeclareLaunchArgument("params_file", default_value=default_params,
                              description="ROS parameters YAML for all av_infer nodes"),
        DeclareLaunchArgument("log_level", default_value="info",
                              description="Logging level: debug, info, warn, error"),
        DeclareLaunchArgument("camera_topic", default_value="/camera/image_raw",
                              description="sensor_msgs/Image topic of the perception node"),
        DeclareLaunchArgument("cabin_topic", default_value="/cabin/image_raw",
                              description="sensor_msgs/Image topic of the monitoring node"),
        DeclareLaunchArgument("camera_info_topic", default_value="/camera_info",
                              description="sensor_msgs/CameraInfo topic of the perception node "
                                          "(read with use_camera_info)"),
        DeclareLaunchArgument("cabin_info_topic", default_value="/camera_info",
                              description="sensor_msgs/CameraInfo topic of the monitoring node "
                                          "(read with use_camera_info)"),
        DeclareLaunchArgument("tensors_topic", default_value="/av_infer_perception/output",
                              description="av_infer_msgs/TensorList topic the perception node "
                                          "publishes (its ~/output/tensors)"),
        DeclareLaunchArgument("detections_topic",
                              default_value="/av_infer_perception/output/detections",
                              description="vision_msgs/Detection2DArray topic of the "
                                          "perception node (its ~/output/detections)"),
        DeclareLaunchArgument("output_info_topic",
                              default_value="/av_infer_perception/output/camera_info",
                              description="sensor_msgs/CameraInfo of the perception node's "
                                          "model input (its ~/output/camera_info)"),
        DeclareLaunchArgument("errors_topic", default_value="/av_infer_perception/errors",
                              description="av_infer_msgs/InferResponse topic of the perception "
                                          "node's failed images (its ~/output/errors)"),
        DeclareLaunchArgument("cabin_tensors_topic", default_value="/av_infer_monitoring/output",
                              description="av_infer_msgs/TensorList topic the monitoring node "
                                          "publishes (its ~/output/tensors)"),
        DeclareLaunchArgument("cabin_detections_topic",
                              default_value="/av_infer_monitoring/output/detections",
                              description="vision_msgs/Detection2DArray topic of the "
                                          "monitoring node (its ~/output/detections)"),
        DeclareLaunchArgument("cabin_output_info_topic",
                              default_value="/av_infer_monitoring/output/camera_info",
                              description="sensor_msgs/CameraInfo of the monitoring node's "
                                          "model input (its ~/output/camera_info)"),
        DeclareLaunchArgument("cabin_errors_topic", default_value="/av_infer_monitoring/errors",
                              description="av_infer_msgs/InferResponse topic of the monitoring "
                                          "node's failed images (its ~/output/errors)"),
        # one process: runtime host + perception + monitoring sharing the Runtime
        # (no `name`: it would rename every node in the process; node-scoped remaps instead)
        Node(package="av_infer", executable="av_infer_container",
             parameters=[params_file],
             remappings=remaps(None),
             condition=IfCondition(composed), **common),
        # one process per node
        Node(package="av_infer", executable="av_infer_runtime", name="av_infer_runtime",
             parameters=[params_file], condition=UnlessCondition(composed), **common),
        Node(package="av_infer", executable="av_infer_perception", name="av_infer_perception",
             parameters=[params_file, {"runtime": "remote"}],
             remappings=remaps("av_infer_perception"),
             condition=UnlessCondition(composed), **common),
        Node(package="av_infer", executable="av_infer_monitoring", name="av_infer_monitoring",
             parameters=[params_file, {"runtime": "remote"}],
             remappings=remaps("av_infer_monitoring"),
             condition=UnlessCondition(composed), **common),
    ])
