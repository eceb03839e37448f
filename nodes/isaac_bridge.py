"""Isaac ROS bridge ``av_infer_isaac_bridge``: ``av_infer_msgs/TensorList`` <->
``isaac_ros_tensor_list_interfaces/TensorList``, both ways, by a field copy.

Why a bridge and not NITROS: Isaac ROS keeps tensors on the GPU between composable C++
nodes (NITROS type adaptation); a Python process cannot join that, so av_infer meets Isaac
ROS on the plain ROS message, and both messages have the same fields, types and data-type
codes (``ros/av_infer_msgs/msg/Tensor.msg``), hence one CDR layout. The bridge passes
header, names, rank, dims, data_type, strides and data on unchanged (the serialised bytes
themselves, checked for a ``TensorList``'s structure: ``IsaacBridgeNode._forward``;
``convert_list`` is the same conversion on message objects): bit-identical both ways,
every dtype (including the
codes Isaac nodes do not convert: 11-13 and av_infer's 128 bool pass as they are; an Isaac
node refuses them, see ``tensor_codec.ISAAC_DATA_TYPES``).

Topics (remap them): ``~/input/av_infer`` (``av_infer_msgs/TensorList``, e.g. a perception
node's ``~/output/tensors``) -> ``~/output/isaac`` (Isaac's ``TensorList``), and ``~/input/isaac``
(e.g. an Isaac DNN encoder's ``tensor_pub``) -> ``~/output/av_infer``. Reliable, depth 10
(an Isaac ROS publisher's default is reliable too).

Runs only where ``isaac_ros_tensor_list_interfaces`` is importable (an Isaac ROS
workspace, or the package ``make setup`` builds with Isaac's message types: definitions
written field for field as Isaac ROS 4.4's, same type hashes; docs/licences.md); otherwise
``main`` exits saying so.
"""

from __future__ import annotations

import importlib
from typing import Any

from av_infer_msgs.msg import TensorList as AvTensorList
from av_infer_nodes.common import PUB_EVENTS, SUB_EVENTS, Every, spin_nodes
from rclpy.node import Node

from av_infer.tensor_codec import read_tensor_list

ISAAC_PACKAGE = "isaac_ros_tensor_list_interfaces"


def isaac_msgs() -> Any | None:
    """``isaac_ros_tensor_list_interfaces.msg`` if it is importable, else None."""
    try:
        return importlib.import_module(ISAAC_PACKAGE + ".msg")
    except ImportError:
        return None


def copy_tensor(src: Any, dst: Any) -> Any:
    """``src``'s fields into ``dst`` (either message type). The ``data`` and ``strides``
    arrays are handed over as they are when ``dst`` keeps them (``check_fields=True``
    messages: no copy of the payload), else rosidl's setter copies them once."""
    dst.name = src.name
    dst.shape.rank = src.shape.rank
    dst.shape.dims = src.shape.dims
    dst.data_type = src.data_type
    dst.strides = src.strides
    dst.data = src.data
    return dst


def convert_list(src: Any, list_type: type, tensor_type: type) -> Any:
    """A ``TensorList`` of one package as the other's, field for field."""
    return list_type(header=src.header,
                     tensors=[copy_tensor(t, tensor_type(check_fields=True))
                              for t in src.tensors])


class IsaacBridgeNode(Node):
    """Both directions in one node (see the module doc)."""

    def __init__(self, node_name: str = "av_infer_isaac_bridge", **kwargs: Any):
        super().__init__(node_name, **kwargs)
        isaac = isaac_msgs()
        if isaac is None:
            raise RuntimeError(f"{ISAAC_PACKAGE} is not importable: source an Isaac ROS "
                               "workspace, or `make setup` (builds it from Isaac's "
                               "definitions)")
        self._isaac = isaac
        #: forwarded each way, and messages dropped as no TensorList (see ``_forward``)
        self.counters = {"to_isaac": 0, "to_av_infer": 0, "dropped": 0}
        self._drop_log = Every()
        self._to_isaac = self.create_publisher(isaac.TensorList, "~/output/isaac", 10,
                                               event_callbacks=PUB_EVENTS)
        self._to_av = self.create_publisher(AvTensorList, "~/output/av_infer", 10,
                                            event_callbacks=PUB_EVENTS)
        self._from_av = self.create_subscription(AvTensorList, "~/input/av_infer",
                                                 self._on_av, 10, event_callbacks=SUB_EVENTS,
                                                 raw=True)
        self._from_isaac = self.create_subscription(isaac.TensorList, "~/input/isaac",
                                                    self._on_isaac, 10,
                                                    event_callbacks=SUB_EVENTS, raw=True)

    def _on_av(self, data: bytes) -> None:
        self._forward(data, self._to_isaac, "to_isaac")

    def _on_isaac(self, data: bytes) -> None:
        self._forward(data, self._to_av, "to_av_infer")

    def _forward(self, data: bytes, pub: Any, key: str) -> None:
        """The message's serialised bytes, published as they are on the other package's
        topic: both ``TensorList``s have one CDR layout (``convert_list`` is the same
        conversion field by field), so the bytes are the converted message, bit-identical,
        with no message objects and no copy in Python (a typed take and publish of a 1 MB
        tensor list cost milliseconds). Checked first for a ``TensorList``'s structure
        (``ros_cdr.read_tensor_list``: every count against the bytes, ~1 µs): bytes that are
        none are dropped, counted (``dropped``) and logged at most every 5 s, so the bridge
        never passes on what the other side could not read."""
        try:
            read_tensor_list(data)
        except ValueError as exc:
            self.counters["dropped"] += 1
            if self._drop_log.due():
                self.get_logger().error(f"dropping bytes that are no TensorList: {exc}")
            return
        pub.publish(data)
        self.counters[key] += 1


def main(args: list[str] | None = None) -> None:
    """Runs the bridge in its own process."""
    if isaac_msgs() is None:
        raise SystemExit(f"av_infer_isaac_bridge: {ISAAC_PACKAGE} is not importable (an "
                         "Isaac ROS workspace, or `make setup`)")
    spin_nodes(lambda: [IsaacBridgeNode()], args)


if __name__ == "__main__":
    main()
