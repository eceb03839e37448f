"""``av_infer._cy.ros_cdr`` against rclpy's own CDR (``rclpy.serialization``): what it reads
from a serialised ``Image``/``CompressedImage`` is what rclpy deserialises, what it writes
as a ``TensorList`` rclpy deserialises into the same message, field for field, and a
damaged buffer is a ``ValueError``, never a read past its end. No ROS context is started
(serialisation needs none)."""

from __future__ import annotations

import array
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("rclpy")

from av_infer_msgs.msg import (  # noqa: E402
    InferRequest,
    InferResponse,
    InferTimings,
    Tensor,
    TensorList,
    TensorShape,
)
from builtin_interfaces.msg import Duration  # noqa: E402
from rclpy.serialization import deserialize_message, serialize_message  # noqa: E402
from sensor_msgs.msg import CompressedImage, Image  # noqa: E402
from std_msgs.msg import Header  # noqa: E402

from av_infer import tensor_codec as codec  # noqa: E402
from av_infer._cy import ros_cdr  # noqa: E402

texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                max_size=12)


def _plain(arrays: dict) -> bool:
    """Every array one the byte writers take (native-order, C-contiguous, a wire dtype)."""
    return all(isinstance(v, np.ndarray) and v.flags.c_contiguous and v.dtype.isnative
               and v.dtype.num in codec._TYPE_CODES for v in arrays.values())


def _header(sec: int, nanosec: int, frame: str) -> Header:
    h = Header(frame_id=frame)
    h.stamp.sec, h.stamp.nanosec = sec, nanosec
    return h


def _image(sec: int, nanosec: int, frame: str, h: int, w: int, enc: str, big: int,
           step: int, data: bytes) -> Image:
    msg = Image(height=h, width=w, encoding=enc, is_bigendian=big, step=step,
                data=array.array("B", data))
    msg.header.stamp.sec, msg.header.stamp.nanosec, msg.header.frame_id = sec, nanosec, frame
    return msg


@settings(max_examples=150, deadline=None)
@given(sec=st.integers(-2**31, 2**31 - 1), nanosec=st.integers(0, 2**32 - 1), frame=texts,
       h=st.integers(0, 2**32 - 1), w=st.integers(0, 2**32 - 1), enc=texts,
       big=st.integers(0, 1), step=st.integers(0, 2**32 - 1), data=st.binary(max_size=64))
def test_read_image_is_what_rclpy_deserialises(sec, nanosec, frame, h, w, enc, big, step,
                                               data) -> None:
    raw = serialize_message(_image(sec, nanosec, frame, h, w, enc, big, step, data))
    back = deserialize_message(raw, Image)
    got = ros_cdr.read_image(raw)
    assert got[:8] == (back.header.stamp.sec, back.header.stamp.nanosec,
                       back.header.frame_id, back.height, back.width, back.encoding,
                       back.is_bigendian, back.step)
    assert isinstance(got[8], memoryview) and bytes(got[8]) == bytes(back.data)


def test_image_pixels_are_a_view_of_the_buffer() -> None:
    raw = bytearray(serialize_message(_image(1, 2, "cam", 2, 3, "rgb8", 0, 9, bytes(range(18)))))
    pixels = ros_cdr.read_image(raw)[8]
    raw[-1] = 77
    assert pixels[-1] == 77 and pixels.readonly is False and len(pixels) == 18


@settings(max_examples=80, deadline=None)
@given(sec=st.integers(-2**31, 2**31 - 1), frame=texts, fmt=texts, data=st.binary(max_size=64))
def test_read_compressed_image_is_what_rclpy_deserialises(sec, frame, fmt, data) -> None:
    msg = CompressedImage(format=fmt, data=array.array("B", data))
    msg.header.stamp.sec, msg.header.stamp.nanosec, msg.header.frame_id = sec, 5, frame
    raw = serialize_message(msg)
    assert ros_cdr.read_compressed_image(raw)[:4] == (sec, 5, frame, fmt)
    assert bytes(ros_cdr.read_compressed_image(raw)[4]) == data


def test_big_endian_image() -> None:
    """A big-endian writer's image (encapsulation ``00 00``), laid out by hand."""
    body = struct.pack(">iI", -3, 9) + struct.pack(">I", 4) + b"cam\0"
    body += struct.pack(">II", 1, 2) + struct.pack(">I", 6) + b"mono8\0" + b"\x01"
    body += b"\0" * (-len(body) % 4) + struct.pack(">I", 2) + struct.pack(">I", 2) + b"\x05\x06"
    got = ros_cdr.read_image(b"\x00\x00\x00\x00" + body)
    assert got[:8] == (-3, 9, "cam", 1, 2, "mono8", 1, 2) and bytes(got[8]) == b"\x05\x06"


def test_every_truncation_and_a_foreign_encapsulation_are_value_errors() -> None:
    raw = serialize_message(_image(1, 2, "front", 2, 3, "rgb8", 0, 9, bytes(range(18))))
    for n in range(len(raw)):
        with pytest.raises(ValueError, match="sensor_msgs/Image"):
            ros_cdr.read_image(raw[:n])
    for head in (b"\x00\x02\x00\x00", b"\x01\x01\x00\x00", b"\x00\x07\x00\x00"):
        with pytest.raises(ValueError, match="encapsulation"):
            ros_cdr.read_image(head + raw[4:])
    bad = bytearray(raw)
    bad[4 + 12 + len("front")] = ord("x")  # frame_id "front\0" loses its NUL
    with pytest.raises(ValueError, match="NUL"):
        ros_cdr.read_image(bytes(bad))
    huge = bytearray(raw)
    huge[-18 - 4:-18] = struct.pack("<I", 2**31)  # data claims 2 GB
    with pytest.raises(ValueError, match="data runs past"):
        ros_cdr.read_image(bytes(huge))


dtypes = st.sampled_from(sorted(codec.DATA_TYPES))


def _array(draw) -> tuple[int, np.ndarray]:  # noqa: ANN001
    """A ``data_type`` code and a C-order array of it, up to rank 4, random bytes."""
    code = draw(dtypes)
    dims = tuple(draw(st.lists(st.integers(0, 4), max_size=4)))
    dt = codec.DATA_TYPES[code]
    n = int(np.prod(dims)) * dt.itemsize
    return code, np.frombuffer(draw(st.binary(min_size=n, max_size=n)), np.uint8).view(
        dt).reshape(dims)


@st.composite
def tensors(draw):  # noqa: ANN001, ANN201
    code, arr = _array(draw)
    strides = draw(st.sampled_from([(), tuple(codec.contiguous_strides(list(arr.shape),
                                                                       arr.itemsize))]))
    return draw(texts), arr.shape, code, strides, arr.reshape(-1).view(np.uint8)


@settings(max_examples=150, deadline=None)
@given(sec=st.integers(-2**31, 2**31 - 1), nanosec=st.integers(0, 2**32 - 1), frame=texts,
       ts=st.lists(tensors(), max_size=4))
def test_write_tensor_list_is_what_rclpy_reads(sec, nanosec, frame, ts) -> None:
    raw = ros_cdr.write_tensor_list(sec, nanosec, frame.encode(),
                                    [(n.encode(), d, c, s, x) for n, d, c, s, x in ts])
    back = deserialize_message(raw, TensorList)
    assert (back.header.stamp.sec, back.header.stamp.nanosec, back.header.frame_id) == (
        sec, nanosec, frame)
    assert len(back.tensors) == len(ts)
    want = TensorList(tensors=[Tensor(name=n, shape=TensorShape(rank=len(d), dims=list(d)),
                                      data_type=c, strides=list(s),
                                      data=array.array("B", x.tobytes()))
                               for n, d, c, s, x in ts])
    want.header = back.header
    for got, exp in zip(back.tensors, want.tensors, strict=True):
        assert (got.name, got.shape.rank, list(got.shape.dims), got.data_type,
                list(got.strides), bytes(got.data)) == (
            exp.name, exp.shape.rank, list(exp.shape.dims), exp.data_type,
            list(exp.strides), bytes(exp.data))
    # (not the byte count: rclpy sizes its buffer by an estimate that pads every empty
    # uint64[] to 8 and leaves those bytes after the last field)
    assert len(raw) <= len(serialize_message(want))


@st.composite
def tensor_msgs(draw):  # noqa: ANN001, ANN201
    """A ``Tensor`` message as a publisher may send it: any name (empty or repeated ones
    too), a known or unknown ``data_type``, empty or C strides, a rank field that may lie."""
    code, arr = _array(draw)
    code = draw(st.sampled_from([code, code, code, 0, 77]))
    strides = draw(st.sampled_from([(), tuple(codec.contiguous_strides(
        list(arr.shape), arr.itemsize)), (3,) * arr.ndim]))
    rank = draw(st.sampled_from([arr.ndim, arr.ndim, (arr.ndim + 1) % 256]))
    return Tensor(name=draw(st.sampled_from(["x", "", draw(texts)])),
                  shape=TensorShape(rank=rank, dims=list(arr.shape)), data_type=code,
                  strides=list(strides), data=array.array("B", arr.tobytes()))


@settings(max_examples=200, deadline=None)
@given(sec=st.integers(-2**31, 2**31 - 1), nanosec=st.integers(0, 2**32 - 1), frame=texts,
       ts=st.lists(tensor_msgs(), max_size=4))
def test_read_tensor_list_cdr_is_tensors_dict_of_what_rclpy_deserialises(
        sec, nanosec, frame, ts) -> None:
    """Read from the bytes rclpy serialises: the same stamp, frame and arrays as
    ``tensors_dict`` gives for the message rclpy deserialises, or the same refusal."""
    raw = serialize_message(TensorList(header=_header(sec, nanosec, frame), tensors=ts))
    back = deserialize_message(raw, TensorList)
    try:
        want = codec.tensors_dict(back.tensors)
    except codec.CodecError as exc:
        with pytest.raises(codec.CodecError) as got:
            codec.read_tensor_list_cdr(raw)
        assert str(got.value) == str(exc)
        return
    stamp, fid, arrays = codec.read_tensor_list_cdr(raw)
    assert (stamp, fid) == ((sec, nanosec), frame)
    assert list(arrays) == list(want)
    for name, arr in arrays.items():
        assert arr.dtype == want[name].dtype and arr.shape == want[name].shape
        assert arr.tobytes() == want[name].tobytes() and not arr.flags.writeable


def test_read_tensor_list_cdr_reads_what_the_image_node_writes() -> None:
    outs = {"logits": np.arange(12, dtype=np.float32).reshape(3, 4),
            "boxes": np.arange(8, dtype=np.int64).reshape(2, 4), "flag": np.array([True])}
    raw = codec.tensor_list_cdr((5, 6), "cam", outs)
    stamp, fid, arrays = codec.read_tensor_list_cdr(raw)
    assert (stamp, fid) == ((5, 6), "cam") and list(arrays) == list(outs)
    for name, arr in arrays.items():
        np.testing.assert_array_equal(arr, outs[name])
        assert arr.dtype == outs[name].dtype
    # views of the bytes, no copy
    assert arrays["logits"].base is not None and not arrays["logits"].flags.owndata


def test_read_tensor_list_big_endian_metadata_by_hand() -> None:
    """A big-endian message: counts, dims, data_type and strides swapped; the data bytes
    (a ``uint8[]``) as they are."""
    body = (struct.pack(">iI", 3, 4) + struct.pack(">I", 2) + b"f\x00\x00\x00"  # frame "f"
            + struct.pack(">I", 1)  # one tensor
            + struct.pack(">I", 2) + b"y\x00" + b"\x02" + b"\x00"  # name, rank 2, pad
            + struct.pack(">III", 2, 1, 2)  # dims [1, 2]
            + struct.pack(">i", 9)  # float32
            + struct.pack(">I", 2) + struct.pack(">QQ", 8, 4)  # strides (at 48: aligned)
            + struct.pack(">I", 8) + np.array([1.5, -2.0], "<f4").tobytes())
    stamp, fid, arrays = codec.read_tensor_list_cdr(ros_cdr.CDR_BE + b"\x00\x00" + body)
    assert (stamp, fid) == ((3, 4), "f")
    np.testing.assert_array_equal(arrays["y"], np.array([[1.5, -2.0]], np.float32))


def test_every_truncation_of_a_tensor_list_is_a_value_error() -> None:
    raw = codec.tensor_list_cdr((1, 2), "cam", {"a": np.ones((2, 3), np.float32),
                                                "b": np.zeros(4, np.uint8)})
    for cut in range(len(raw)):
        with pytest.raises(ValueError):
            codec.read_tensor_list_cdr(raw[:cut])
    huge = bytearray(raw)
    huge[20:24] = struct.pack("<I", 2**32 - 1)  # the tensor count, then junk
    with pytest.raises(ValueError, match="tensors runs past"):
        codec.read_tensor_list_cdr(bytes(huge))


@settings(max_examples=150, deadline=None)
@given(sec=st.integers(-2**31, 2**31 - 1), nanosec=st.integers(0, 2**32 - 1), frame=texts,
       rid=texts, model=texts, client=texts, group=texts,
       prio=st.integers(-128, 127), drop=st.booleans(),
       d=st.tuples(st.integers(-2**31, 2**31 - 1), st.integers(0, 2**32 - 1)),
       hard=st.tuples(st.integers(-2**31, 2**31 - 1), st.integers(0, 2**32 - 1)),
       ts=st.lists(tensor_msgs(), max_size=3))
def test_read_infer_request_is_what_rclpy_deserialises(sec, nanosec, frame, rid, model,
                                                       client, group, prio, drop, d, hard,
                                                       ts) -> None:
    msg = InferRequest(header=_header(sec, nanosec, frame), id=rid, model=model,
                       client=client, priority=prio, drop_late=drop, variant_group=group,
                       deadline=Duration(sec=d[0], nanosec=d[1]),
                       hard_deadline=Duration(sec=hard[0], nanosec=hard[1]), tensors=ts)
    raw = serialize_message(msg)
    back = deserialize_message(raw, InferRequest)
    (gsec, gns, gframe, gid, gmodel, gclient, gprio, gd, gdrop, ghard, ggroup,
     gts) = ros_cdr.read_infer_request(raw)
    assert (gsec, gns, gframe, gid, gmodel, gclient, gprio, gd, gdrop, ghard, ggroup) == (
        back.header.stamp.sec, back.header.stamp.nanosec, back.header.frame_id, back.id,
        back.model, back.client, back.priority, (back.deadline.sec, back.deadline.nanosec),
        back.drop_late, (back.hard_deadline.sec, back.hard_deadline.nanosec),
        back.variant_group)
    assert [(n, r, list(dims), c, list(st_), bytes(data))
            for n, r, dims, c, st_, data in gts] == [
        (t.name, t.shape.rank, list(t.shape.dims), t.data_type, list(t.strides),
         bytes(t.data)) for t in back.tensors]
    # a cut is a ValueError naming the message, unless it removed only the bytes rclpy's
    # size estimate leaves after the last field (then nothing read changes)
    full = ros_cdr.read_infer_request(raw)
    for cut in range(0, len(raw), max(1, len(raw) // 16)):
        try:
            part = ros_cdr.read_infer_request(raw[:cut])
        except ValueError as exc:
            assert "InferRequest" in str(exc)
        else:
            assert part[:11] == full[:11] and [t[:5] for t in part[11]] == [
                t[:5] for t in full[11]]
            assert [bytes(t[5]) for t in part[11]] == [bytes(t[5]) for t in full[11]]


def test_write_tensor_list_refuses_a_rank_the_wire_cannot_carry() -> None:
    with pytest.raises(ValueError, match="rank 256"):
        ros_cdr.write_tensor_list(0, 0, b"", [(b"x", (1,) * 256, 9, (), b"")])


@st.composite
def output_arrays(draw):  # noqa: ANN001, ANN201
    code, arr = _array(draw)
    dt = arr.dtype
    form = draw(st.sampled_from(["plain", "fortran", "bigendian", "list"]))
    if form == "fortran":
        arr = np.asfortranarray(arr)
    elif form == "bigendian" and dt.itemsize > 1:
        arr = arr.astype(dt.newbyteorder(">"))
    elif form == "list" and code != 128:
        arr = arr.tolist()
    return arr


@settings(max_examples=150, deadline=None)
@given(outs=st.dictionaries(texts, output_arrays(), max_size=4), frame=texts)
def test_tensor_list_cdr_is_fill_tensor_on_the_wire(outs, frame) -> None:
    """Whichever path writes them (numpy's C API for plain arrays, Python otherwise), the
    outputs arrive as ``fill_tensor`` puts them in a ``TensorList``; both paths write the
    same bytes where both apply."""
    raw = codec.tensor_list_cdr((7, 8), frame, outs)
    back = deserialize_message(raw, TensorList)
    assert (back.header.stamp.sec, back.header.stamp.nanosec, back.header.frame_id) == (
        7, 8, frame)
    assert [t.name for t in back.tensors] == list(outs)
    for got, (name, value) in zip(back.tensors, outs.items(), strict=True):
        exp = codec.fill_tensor(Tensor(), name, np.asarray(value))
        assert (got.shape.rank, list(got.shape.dims), got.data_type, list(got.strides),
                bytes(got.data)) == (exp.shape.rank, list(exp.shape.dims), exp.data_type,
                                     list(exp.strides), bytes(exp.data))
    plain = {n: np.ascontiguousarray(v, dtype=np.asarray(v).dtype.newbyteorder("="))
             for n, v in outs.items()}
    fast = ros_cdr.write_outputs(7, 8, frame.encode(), plain, codec._TYPE_CODES)
    general = ros_cdr.write_tensor_list(7, 8, frame.encode(), [
        (n.encode(), v.shape, codec.DATA_TYPE_OF[v.dtype.name],
         tuple(codec.contiguous_strides(list(v.shape), v.dtype.itemsize)),
         v.reshape(-1).view(np.uint8)) for n, v in plain.items()])
    if all(v.dtype.num in codec._TYPE_CODES for v in plain.values()):
        assert fast == general
    else:  # e.g. a uint64 numpy made with another type number: the general path writes it
        assert fast is None


def test_write_outputs_leaves_what_it_cannot_write_to_the_general_path() -> None:
    codes = codec._TYPE_CODES
    for odd in (np.zeros((2, 3), np.float32).T, np.zeros(3, ">f4"), [1.0],
                np.zeros(2, np.longlong) if np.dtype(np.longlong).num not in codes else [0],
                np.array(["a"])):
        assert ros_cdr.write_outputs(0, 0, b"", {"x": odd}, codes) is None
    with pytest.raises(codec.CodecError, match="has no Tensor data_type"):
        codec.tensor_list_cdr((0, 0), "", {"x": np.array(["a"])})


@settings(max_examples=100, deadline=None)
@given(sec=st.integers(-2**31, 2**31 - 1), nanosec=st.integers(0, 2**32 - 1),
       value=st.floats(allow_nan=False))
def test_write_float64_stamped_is_what_rclpy_reads(sec, nanosec, value) -> None:
    from av_infer_msgs.msg import Float64Stamped

    raw = ros_cdr.write_float64_stamped(sec, nanosec, value)
    back = deserialize_message(raw, Float64Stamped)
    assert (back.stamp.sec, back.stamp.nanosec, back.data) == (sec, nanosec, value)
    msg = Float64Stamped(data=value)
    msg.stamp.sec, msg.stamp.nanosec = sec, nanosec
    assert raw == serialize_message(msg)  # no padding: the same bytes


codes = st.sampled_from(sorted(codec.STATUS))
floats = st.floats(allow_nan=True, allow_infinity=True)
u32 = st.integers(0, 2**32 - 1)


@st.composite
def timings_tuples(draw):  # noqa: ANN001, ANN201
    return codec.WireTimings(draw(floats), draw(floats), draw(floats), draw(u32), draw(u32),
                             draw(st.booleans()), draw(st.booleans()))


def _same_float(a: float, b: float) -> bool:
    return (a != a and b != b) or a == b


@settings(max_examples=150, deadline=None)
@given(sec=st.integers(-2**31, 2**31 - 1), nanosec=u32, frame=texts, rid=texts,
       code=codes, message=texts, model=texts, served=texts, kappa=floats, quality=floats,
       timings=timings_tuples(),
       outs=st.dictionaries(texts.filter(bool), output_arrays(), max_size=3))
def test_infer_response_cdr_is_what_rclpy_reads_and_reads_back(
        sec, nanosec, frame, rid, code, message, model, served, kappa, quality, timings,
        outs) -> None:
    """The host's response written as bytes is the message rclpy deserialises (every field,
    the outputs as ``fill_tensor`` puts them), and ``read_infer_response_cdr`` reads it back;
    an output the fast path cannot write leaves the message to the caller (None)."""
    raw = codec.infer_response_cdr((sec, nanosec), frame, rid, code, message, model, served,
                                   kappa, quality, timings, outs)
    if not _plain(outs):
        assert raw is None
        return
    back = deserialize_message(raw, InferResponse)
    assert (back.header.stamp.sec, back.header.stamp.nanosec, back.header.frame_id) == (
        sec, nanosec, frame)
    assert (back.id, back.status, back.code, back.message, back.model, back.served_model) == (
        rid, codec.status_of(code), code, message, model, served)
    assert _same_float(back.kappa, kappa) and _same_float(back.quality, quality)
    t = back.timings
    assert all(_same_float(getattr(t, f), getattr(timings, f))
               for f in ("queueing_ms", "compute_ms", "total_ms"))
    assert (t.preempted, t.kernels_padded, t.has_deadline, t.deadline_met) == (
        timings.preempted, timings.kernels_padded, timings.has_deadline, timings.deadline_met)
    assert [x.name for x in back.tensors] == list(outs)
    for got, (name, value) in zip(back.tensors, outs.items(), strict=True):
        exp = codec.fill_tensor(Tensor(), name, value)
        assert (got.shape.rank, list(got.shape.dims), got.data_type, list(got.strides),
                bytes(got.data)) == (exp.shape.rank, list(exp.shape.dims), exp.data_type,
                                     list(exp.strides), bytes(exp.data))
    r = codec.read_infer_response_cdr(raw)
    assert (r.stamp, r.frame_id, r.id, r.status, r.code, r.message, r.model,
            r.served_model) == ((sec, nanosec), frame, rid, codec.status_of(code), code,
                                message, model, served)
    assert _same_float(r.kappa, kappa) and _same_float(r.quality, quality)
    assert all(_same_float(a, b) for a, b in zip(r.timings, timings, strict=True))
    arrays = r.outputs()
    assert list(arrays) == list(outs)
    for name, value in outs.items():
        assert arrays[name].dtype == value.dtype and arrays[name].shape == value.shape
        assert arrays[name].tobytes() == value.tobytes() and not arrays[name].flags.writeable


@settings(max_examples=150, deadline=None)
@given(sec=st.integers(-2**31, 2**31 - 1), nanosec=u32, frame=texts, rid=texts, code=codes,
       message=texts, kappa=floats, timings=timings_tuples(),
       ts=st.lists(tensor_msgs(), max_size=3))
def test_read_infer_response_cdr_is_what_rclpy_deserialises(
        sec, nanosec, frame, rid, code, message, kappa, timings, ts) -> None:
    """Read from the bytes rclpy serialises (outputs a publisher may send: lying ranks,
    unknown types, foreign strides): the same fields, and ``outputs()`` the arrays
    ``tensors_dict`` gives for the deserialised message, or the same refusal."""
    msg = InferResponse(header=_header(sec, nanosec, frame), id=rid, status=3, code=code,
                        message=message, model="m", served_model="s", kappa=kappa,
                        quality=1.5, timings=InferTimings(**timings._asdict()), tensors=ts)
    raw = serialize_message(msg)
    back = deserialize_message(raw, InferResponse)
    r = codec.read_infer_response_cdr(raw)
    assert (r.stamp, r.frame_id, r.id, r.status, r.code, r.message, r.model,
            r.served_model, r.quality) == ((sec, nanosec), frame, rid, 3, code, message, "m",
                                           "s", 1.5)
    assert _same_float(r.kappa, kappa)
    assert all(_same_float(getattr(back.timings, f), v)
               for f, v in r.timings._asdict().items())
    try:
        want = codec.tensors_dict(back.tensors)
    except codec.CodecError as exc:
        with pytest.raises(codec.CodecError) as got:
            r.outputs()
        assert str(got.value) == str(exc)
        return
    arrays = r.outputs()
    assert list(arrays) == list(want)
    for name, arr in arrays.items():
        assert arr.tobytes() == want[name].tobytes() and arr.shape == want[name].shape


def test_every_truncation_of_an_infer_response_is_a_value_error() -> None:
    raw = codec.infer_response_cdr((1, 2), "cam", "id-1", "ok", "", "m", "m", 1.0, 0.9,
                                   codec.WireTimings(0.1, 0.2, 0.3, 1, 2, True, True),
                                   {"a": np.ones((2, 3), np.float32)})
    assert raw is not None
    for cut in range(len(raw)):
        with pytest.raises(ValueError):
            codec.read_infer_response_cdr(raw[:cut])


def test_infer_response_cdr_leaves_a_nul_in_a_string_to_the_message() -> None:
    t = codec.WireTimings(0.0, 0.0, 0.0, 0, 0, False, False)
    assert codec.infer_response_cdr((0, 0), "f", "a\x00b", "ok", "", "m", "", 1.0, 1.0, t,
                                    None) is None
    assert codec.infer_response_cdr((0, 0), "f", "ab", "ok", "", "m", "", 1.0, 1.0, t,
                                    None) is not None


durations = st.one_of(st.none(), st.floats(1e-9, 1e6), st.floats(-1e6, -1e-9))


@settings(max_examples=150, deadline=None)
@given(sec=st.integers(-2**31, 2**31 - 1), nanosec=u32, frame=texts, rid=texts,
       model=texts, client=texts, prio=st.sampled_from(["RT", "BE"]), deadline=durations,
       drop=st.booleans(), hard=durations, group=st.one_of(st.none(), texts),
       ins=st.dictionaries(texts.filter(bool), output_arrays(), max_size=3))
def test_infer_request_cdr_is_request_msg_on_the_wire(sec, nanosec, frame, rid, model,
                                                      client, prio, deadline, drop, hard,
                                                      group, ins) -> None:
    """A remote client's request written as bytes is the message ``request_msg`` builds
    (rclpy deserialises the same fields and tensors from both), and the host's reader reads
    it; an input the fast path cannot write leaves the message to the caller (None)."""
    from av_infer_nodes.common import request_msg

    ctrl = codec.RequestControl(id=rid, model=model, client=client, priority=prio,
                                stamp=(sec, nanosec), frame_id=frame, deadline_s=deadline,
                                drop_late=drop, hard_deadline_s=hard, variant_group=group)
    raw = codec.infer_request_cdr(ctrl, ins)
    if not _plain(ins):
        assert raw is None
        return
    got = deserialize_message(raw, InferRequest)
    want = deserialize_message(serialize_message(request_msg(ctrl, ins)), InferRequest)
    for f in ("id", "model", "client", "priority", "drop_late", "variant_group"):
        assert getattr(got, f) == getattr(want, f), f
    assert (got.header.stamp.sec, got.header.stamp.nanosec, got.header.frame_id) == (
        want.header.stamp.sec, want.header.stamp.nanosec, want.header.frame_id)
    for f in ("deadline", "hard_deadline"):
        assert (getattr(got, f).sec, getattr(got, f).nanosec) == (
            getattr(want, f).sec, getattr(want, f).nanosec), f
    assert [(t.name, t.shape.rank, list(t.shape.dims), t.data_type, list(t.strides),
             bytes(t.data)) for t in got.tensors] == [
        (t.name, t.shape.rank, list(t.shape.dims), t.data_type, list(t.strides),
         bytes(t.data)) for t in want.tensors]
    back = ros_cdr.read_infer_request(raw)
    assert back[:7] == (sec, nanosec, frame, rid, model, client, codec.PRIORITY_OF[prio])


@settings(max_examples=100, deadline=None)
@given(sec=st.integers(-2**31, 2**31 - 1), nanosec=u32, frame=texts,
       rows=st.lists(st.tuples(st.lists(st.floats(-1e4, 1e4, width=32), min_size=4,
                                        max_size=4),
                               st.floats(0, 1, width=32), texts), max_size=12))
def test_detections_cdr_is_detections_msg_on_the_wire(sec, nanosec, frame, rows) -> None:
    """An image node's detections written as bytes deserialise to the very message
    ``detections_msg`` builds (every field: header on the array and on each detection, the
    box centre and size, the hypothesis, the identity pose, the zero covariance, the empty
    id)."""
    pytest.importorskip("vision_msgs.msg")
    from av_infer_nodes.detections import detections_cdr, detections_msg
    from vision_msgs.msg import Detection2DArray

    from av_infer.detect import Detections

    n = len(rows)
    dets = Detections(boxes=np.array([r[0] for r in rows], np.float32).reshape(n, 4),
                      scores=np.array([r[1] for r in rows], np.float32),
                      classes=np.zeros(n, np.int64), labels=tuple(r[2] for r in rows))
    raw = detections_cdr(dets, (sec, nanosec), frame)
    assert raw is not None
    assert deserialize_message(raw, Detection2DArray) == detections_msg(
        dets, _header(sec, nanosec, frame))


def test_detections_cdr_leaves_a_nul_to_the_message() -> None:
    pytest.importorskip("vision_msgs.msg")
    from av_infer_nodes.detections import detections_cdr

    from av_infer.detect import Detections

    dets = Detections(boxes=np.zeros((1, 4), np.float32), scores=np.ones(1, np.float32),
                      classes=np.zeros(1, np.int64), labels=("a\x00b",))
    assert detections_cdr(dets, (0, 0), "cam") is None
    with pytest.raises(ValueError, match="2 boxes"):
        ros_cdr.write_detections(0, 0, b"", np.zeros((2, 4)), np.zeros(1), [b"x"])


_statuses = st.lists(st.tuples(st.integers(0, 255), texts, texts, texts,
                               st.lists(st.tuples(texts, texts), max_size=6)), max_size=6)


@settings(max_examples=150, deadline=None)
@given(sec=st.integers(-2**31, 2**31 - 1), nanosec=u32, frame=texts, rows=_statuses)
def test_diagnostics_written_as_bytes_are_the_message(sec, nanosec, frame, rows) -> None:
    """``write_diagnostics`` (what the nodes publish on /diagnostics) deserialises to the
    ``DiagnosticArray`` of the same header and statuses, every field and level."""
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

    raw = ros_cdr.write_diagnostics(sec, nanosec, frame.encode(),
                                    [(bytes([lv]), n, m, h, kvs) for lv, n, m, h, kvs in rows])
    want = DiagnosticArray(header=_header(sec, nanosec, frame), status=[
        DiagnosticStatus(level=bytes([lv]), name=n, message=m, hardware_id=h,
                         values=[KeyValue(key=k, value=v) for k, v in kvs])
        for lv, n, m, h, kvs in rows])
    assert deserialize_message(raw, DiagnosticArray) == want


def test_diagnostics_refuse_what_a_ros_string_cannot_carry_and_the_node_escapes_it() -> None:
    """The writer refuses a NUL inside a text, a lone surrogate, a level that is not one
    byte; ``health.diagnostics_cdr`` (the nodes' publisher) writes such texts escaped."""
    pytest.importorskip("av_infer_nodes")
    from av_infer_nodes.health import KV, Status, diagnostics_cdr
    from diagnostic_msgs.msg import DiagnosticArray

    def one(name: str, level: bytes = b"\x01") -> list:
        return [Status(level, name, "m", "hw", [KV("k", name)])]

    with pytest.raises(ValueError, match="NUL"):
        ros_cdr.write_diagnostics(0, 0, b"", one("a\x00b"))
    with pytest.raises(UnicodeEncodeError):
        ros_cdr.write_diagnostics(0, 0, b"", one("a\udc80b"))
    with pytest.raises(ValueError, match="one byte"):
        ros_cdr.write_diagnostics(0, 0, b"", one("a", b"\x01\x02"))
    for bad in ((b"\x00", 1, "m", "h", []), (b"\x00", "n", "m", "h", ()),
                (0, "n", "m", "h", []), (b"\x00", "n", "m", "h", [("k", 2)])):
        with pytest.raises(TypeError):
            ros_cdr.write_diagnostics(0, 0, b"", [bad])
    got = deserialize_message(diagnostics_cdr(one("a\x00b\udc80c"), (3, 4), "f\x00"),
                              DiagnosticArray)
    assert (got.header.stamp.sec, got.header.stamp.nanosec, got.header.frame_id) == (
        3, 4, "f\\x00")
    (s,) = got.status
    assert (s.level, s.name, s.message, s.hardware_id) == (b"\x01", "a\\x00b\\udc80c", "m",
                                                           "hw")
    assert [(kv.key, kv.value) for kv in s.values] == [("k", "a\\x00b\\udc80c")]
