"""The Isaac ROS bridge against an ``isaac_ros_tensor_list_interfaces`` built with Isaac's
message types (``ros/isaac_ros_tensor_list_interfaces``, definitions written for av_infer
field for field as Isaac ROS 4.4's, ``make setup``; its RIHS01 type hashes are pinned to
Isaac's own here, so the wire types are Isaac's): a ``TensorList``
with a tensor of every data type passes both ways bit-identical, and the two packages'
messages have the same CDR layout (same fields, types and order): each reads the other's
serialised bytes as its own.

Run inside scripts/netns_run.sh: LOCALHOST discovery, fresh netns.
"""

from __future__ import annotations

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
isaac = pytest.importorskip("isaac_ros_tensor_list_interfaces.msg")

from av_infer_msgs.msg import Tensor, TensorList  # noqa: E402
from av_infer_nodes.isaac_bridge import IsaacBridgeNode, convert_list  # noqa: E402
from av_infer_nodes.testing import (  # noqa: E402
    Collector,
    RosHarness,
    wait_for,
    wait_matched,
)
from rclpy.serialization import deserialize_message, serialize_message  # noqa: E402

from av_infer import tensor_codec as codec  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(600)]

#: RIHS01 type hashes of Isaac ROS 4.4's own definitions (isaac_ros_common tag v4.4-0,
#: commit d716470), as the venv's rosidl generates them (measured on a build of NVIDIA's
#: files before ours replaced them; docs/licences.md): a topic matches Isaac's nodes only
#: with these
ISAAC_HASHES = {
    "Tensor": "RIHS01_4f84320fd44d2c4f4bfa5562a6c47c4403be8bdb7d25fe5df37f4e2786fcd66d",
    "TensorList": "RIHS01_498b4418eed651d1eb843a154ac3dd6b7612b3fa851e1bd930f9f0c2e862cf6c",
    "TensorShape": "RIHS01_3e0d2f347cd48e20550029e8754bb509be05e11d073ed43888fded7fb686cd60",
}


def test_built_types_are_isaacs_on_the_wire():
    """Field names, types and order as Isaac's, and the same RIHS01 type hashes."""
    import json
    import sys
    from pathlib import Path

    assert isaac.TensorShape.get_fields_and_field_types() == {"rank": "uint8",
                                                              "dims": "sequence<uint32>"}
    assert isaac.Tensor.get_fields_and_field_types() == {
        "name": "string", "shape": "isaac_ros_tensor_list_interfaces/TensorShape",
        "data_type": "int32", "strides": "sequence<uint64>", "data": "sequence<uint8>"}
    assert isaac.TensorList.get_fields_and_field_types() == {
        "header": "std_msgs/Header",
        "tensors": "sequence<isaac_ros_tensor_list_interfaces/Tensor>"}
    share = Path(sys.prefix) / "share" / "isaac_ros_tensor_list_interfaces" / "msg"
    for name, want in ISAAC_HASHES.items():
        desc = json.loads((share / f"{name}.json").read_text())
        got = {h["type_name"]: h["hash_string"] for h in desc["type_hashes"]}
        assert got[f"isaac_ros_tensor_list_interfaces/msg/{name}"] == want, name



def every_dtype() -> dict[str, np.ndarray]:
    """One array per data type, random bytes (NaN payloads and all), ranks 0..4."""
    rng = np.random.default_rng(3)
    shapes = [(2, 3), (4,), (1, 2, 3, 2), (), (3, 1, 2)]
    out = {}
    for i, (code, dt) in enumerate(sorted(codec.DATA_TYPES.items())):
        shape = shapes[i % len(shapes)]
        raw = rng.integers(0, 256, int(np.prod(shape)) * dt.itemsize, np.uint8)
        if dt == np.dtype(bool):
            raw = raw % 2
        out[f"t{code}_{dt.name}"] = raw.view(dt).reshape(shape)
    return out


def av_list(arrays: dict[str, np.ndarray], frame: str) -> TensorList:
    msg = TensorList(tensors=[codec.fill_tensor(Tensor(check_fields=True), n, a)
                              for n, a in arrays.items()])
    msg.header.frame_id, msg.header.stamp.sec, msg.header.stamp.nanosec = frame, 17, 42
    return msg


def fields(msg) -> tuple:
    return (msg.header.frame_id, msg.header.stamp.sec, msg.header.stamp.nanosec,
            [(t.name, t.shape.rank, list(t.shape.dims), t.data_type, list(t.strides),
              bytes(t.data)) for t in msg.tensors])


def test_same_fields_same_cdr_bytes():
    """A field copy is the whole conversion: both messages have one CDR layout."""
    av = av_list(every_dtype(), "cam")
    ic = convert_list(av, isaac.TensorList, isaac.Tensor)
    assert [f for f in isaac.Tensor.get_fields_and_field_types()] == \
        [f for f in Tensor.get_fields_and_field_types()]
    assert isaac.TensorShape.get_fields_and_field_types() == {"rank": "uint8",
                                                              "dims": "sequence<uint32>"}
    assert fields(ic) == fields(av)
    # the same layout: each type reads the other's bytes. (Not a comparison of the raw
    # bytes: the serializer leaves CDR alignment padding, e.g. the 3 bytes after
    # TensorShape.rank, unwritten, so they hold whatever the buffer held: after other
    # tests had run in the process, the two messages' bytes differed there and only there.)
    wire_av, wire_ic = serialize_message(av), serialize_message(ic)
    assert len(wire_av) == len(wire_ic)
    assert fields(deserialize_message(wire_av, isaac.TensorList)) == fields(av)
    assert fields(deserialize_message(wire_ic, TensorList)) == fields(av)
    # Isaac's float32 is 9 and float64 10 (isaac_ros_tensor_list_interfaces/Tensor.msg)
    codes = {t.name.split("_", 1)[1]: t.data_type for t in ic.tensors}
    assert (codes["float32"], codes["float64"], codes["uint8"]) == (9, 10, 2)


def test_bridge_both_ways_bit_identical_every_dtype():
    arrays = every_dtype()
    with RosHarness(executor="single") as h:
        bridge = h.add(IsaacBridgeNode(context=h.context, cli_args=[
            "--ros-args", "-r", "~/input/av_infer:=/perception/output",
            "-r", "~/input/isaac:=/isaac/tensor_pub"]))
        tester = h.node("bridge_tester")
        to_isaac, to_av = Collector(), Collector()
        subs = [tester.create_subscription(isaac.TensorList,
                                           "/av_infer_isaac_bridge/output/isaac", to_isaac, 10),
                tester.create_subscription(TensorList, "/av_infer_isaac_bridge/output/av_infer",
                                           to_av, 10)]
        pubs = [tester.create_publisher(TensorList, "/perception/output", 10),
                tester.create_publisher(isaac.TensorList, "/isaac/tensor_pub", 10)]
        wait_matched(*subs, *pubs)
        sent_av = av_list(arrays, "from_av")
        pubs[0].publish(sent_av)
        got_isaac = wait_for(to_isaac.snapshot, what="isaac TensorList")[0]
        assert fields(got_isaac) == fields(sent_av)
        # and back: Isaac's message in, av_infer's out, still the same bits
        sent_isaac = convert_list(av_list(arrays, "from_isaac"), isaac.TensorList,
                                  isaac.Tensor)
        pubs[1].publish(sent_isaac)
        got_av = wait_for(to_av.snapshot, what="av_infer TensorList")[0]
        assert fields(got_av) == fields(sent_isaac)
        views = codec.tensors_dict(got_av.tensors)
        for name, arr in arrays.items():
            assert views[name].dtype == arr.dtype and views[name].shape == arr.shape
            assert views[name].tobytes() == arr.tobytes()  # NaN payloads included
        assert bridge.counters == {"to_isaac": 1, "to_av_infer": 1, "dropped": 0}
        # bytes that are no TensorList are dropped (counted), not passed on
        pubs[0].publish(b"\x00\x01\x00\x00 no tensor list")
        wait_for(lambda: bridge.counters["dropped"] == 1, what="the junk dropped")
        assert bridge.counters["to_isaac"] == 1 and len(to_isaac.snapshot()) == 1
        assert h.spin_error is None
