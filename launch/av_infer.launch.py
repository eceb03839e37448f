"""Launches av_infer: the runtime host with a perception (RT) and a monitoring (BE) node.

``composed:=true`` (default) runs them in one process (``av_infer_container``: the nodes
share the Runtime object); ``composed:=false`` runs one node per process, the clients
reaching the host over /av_infer/request|response. Parameters come from ``params_file``.

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
        # one process: runtime host + perception + monitoring sharing the Runtime
        # (no `name`: it would rename every node in the process; node-scoped remaps instead)
        Node(package="av_infer", executable="av_infer_container",
             parameters=[params_file],
             remappings=[("av_infer_perception:image", camera_topic),
                         ("av_infer_monitoring:image", cabin_topic)],
             condition=IfCondition(composed), **common),
        # one process per node
        Node(package="av_infer", executable="av_infer_runtime", name="av_infer_runtime",
             parameters=[params_file], condition=UnlessCondition(composed), **common),
        Node(package="av_infer", executable="av_infer_perception", name="av_infer_perception",
             parameters=[params_file, {"runtime": "remote"}],
             remappings=[("image", camera_topic)],
             condition=UnlessCondition(composed), **common),
        Node(package="av_infer", executable="av_infer_monitoring", name="av_infer_monitoring",
             parameters=[params_file, {"runtime": "remote"}],
             remappings=[("image", cabin_topic)],
             condition=UnlessCondition(composed), **common),
    ])
