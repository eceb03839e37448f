"""Launches av_infer: the runtime host with a perception (RT) and a monitoring (BE) node.

``composed:=true`` (default) runs them in one process (``av_infer_container``: the nodes
share the Runtime object); ``composed:=false`` runs one node per process, the clients
reaching the host over /av_infer/request|response. Parameters come from ``params_file``.

Topics follow Autoware's convention: the image nodes subscribe ``~/input/image`` and
``~/input/camera_info``; this file remaps them to ``camera_topic``/``cabin_topic`` and
``camera_info_topic``/``cabin_info_topic``, whose defaults are the topics the nodes used
before the convention (``/camera/image_raw``, ``/cabin/image_raw``, ``/camera_info``), so a
deployment launched with the same arguments subscribes the same topics. Outputs keep their
names (``~/output``, ``~/output/detections``, ``~/output/camera_info``, ``~/errors``).

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
    camera_topic = LaunchConfiguration("camera_topic")
    cabin_topic = LaunchConfiguration("cabin_topic")
    camera_info_topic = LaunchConfiguration("camera_info_topic")
    cabin_info_topic = LaunchConfiguration("cabin_info_topic")
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
        # one process: runtime host + perception + monitoring sharing the Runtime
        # (no `name`: it would rename every node in the process; node-scoped remaps instead)
        Node(package="av_infer", executable="av_infer_container",
             parameters=[params_file],
             remappings=[("av_infer_perception:~/input/image", camera_topic),
                         ("av_infer_monitoring:~/input/image", cabin_topic),
                         ("av_infer_perception:~/input/camera_info", camera_info_topic),
                         ("av_infer_monitoring:~/input/camera_info", cabin_info_topic)],
             condition=IfCondition(composed), **common),
        # one process per node
        Node(package="av_infer", executable="av_infer_runtime", name="av_infer_runtime",
             parameters=[params_file], condition=UnlessCondition(composed), **common),
        Node(package="av_infer", executable="av_infer_perception", name="av_infer_perception",
             parameters=[params_file, {"runtime": "remote"}],
             remappings=[("~/input/image", camera_topic),
                         ("~/input/camera_info", camera_info_topic)],
             condition=UnlessCondition(composed), **common),
        Node(package="av_infer", executable="av_infer_monitoring", name="av_infer_monitoring",
             parameters=[params_file, {"runtime": "remote"}],
             remappings=[("~/input/image", cabin_topic),
                         ("~/input/camera_info", cabin_info_topic)],
             condition=UnlessCondition(composed), **common),
    ])
