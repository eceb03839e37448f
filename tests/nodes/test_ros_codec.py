"""The ROS layer's tensor codec and image preprocessing (plain pytest, no ROS context).

``av_infer.tensor_codec`` works on any object with the ``av_infer_msgs`` fields, so these
tests use plain namespaces: the split control/data path's guarantees (control read without
the payload, metadata bounded before allocation, views without copies, one copy out).
"""

from __future__ import annotations

import array
from types import SimpleNamespace as NS

import numpy as np
import pytest

from av_infer import tensor_codec as codec
from av_infer.errors import InvalidInputError


def _tensor(name="input", arr=None, **kw):
    t = codec.fill_tensor(NS(), name, np.arange(12, dtype=np.float32).reshape(1, 3, 2, 2)
                          if arr is None else arr)
    for k, v in kw.items():
        setattr(t, k, v)
    return t


def _request(tensors=None, **kw):
    base = dict(id="r-1", model="tiny_cnn", client="cam", priority=0, drop_late=False,
                header=NS(stamp=NS(sec=12, nanosec=345), frame_id="cam0"),
                deadline=NS(sec=0, nanosec=33_000_000),
                tensors=[_tensor()] if tensors is None else tensors)
    base.update(kw)
    return NS(**base)


def test_fill_tensor_and_views_round_trip_every_dtype():
    for code, dtype in codec.DATA_TYPES.items():
        arr = (np.arange(24) % 2).astype(dtype).reshape(2, 3, 4)
        t = codec.fill_tensor(NS(), "x", arr)
        assert t.data_type == code and list(t.shape.dims) == [2, 3, 4] and t.shape.rank == 3
        assert list(t.strides) == list(arr.strides)
        assert isinstance(t.data, array.array) and t.data.typecode == "B"
        view = codec.check_tensors([t])["x"]
        np.testing.assert_array_equal(view, arr)
        assert not view.flags.writeable  # a view of the message, never written
        assert np.shares_memory(view, np.frombuffer(t.data, np.uint8))  # no copy


def test_fill_tensor_refills_a_reused_message_in_place_and_resets_a_changed_one():
    t = codec.fill_tensor(NS(), "y", np.zeros((1, 4), np.float32))
    data = t.data
    again = codec.fill_tensor(t, "y", np.arange(4, dtype=np.float32).reshape(1, 4))
    assert again is t and t.data is data  # same tensor: bytes copied into the buffer
    np.testing.assert_array_equal(codec.check_tensors([t])["y"], [[0, 1, 2, 3]])
    for name, arr in (("z", np.ones((1, 4), np.float32)),      # another name
                      ("z", np.ones((2, 2), np.float32)),      # another shape, same size
                      ("z", np.ones((1, 4), np.int32)),        # another dtype, same size
                      ("z", np.ones((1, 8), np.float32))):     # another size
        codec.fill_tensor(t, name, arr)
        assert t.data is not data and list(t.shape.dims) == list(arr.shape)
        assert t.data_type == codec.DATA_TYPE_OF[arr.dtype.name]
        np.testing.assert_array_equal(codec.check_tensors([t])[name], arr)
        data = t.data


def test_fill_tensor_makes_big_endian_and_strided_arrays_contiguous():
    t = codec.fill_tensor(NS(), "b", np.arange(6, dtype=">f4").reshape(2, 3)[:, ::2])
    view = codec.check_tensors([t])["b"]
    np.testing.assert_array_equal(view, [[0, 2], [3, 5]])
    assert view.dtype == np.float32 and view.dtype.isnative
    with pytest.raises(codec.CodecError, match="no Tensor data_type"):
        codec.fill_tensor(NS(), "s", np.array(["a"]))


def test_read_control_reads_fields_not_payload():
    req = _request(tensors=[NS(name="poison")])  # any access to tensor fields would fail
    ctrl = codec.read_control(req)
    assert (ctrl.id, ctrl.model, ctrl.client, ctrl.priority, ctrl.stamp, ctrl.frame_id,
            ctrl.drop_late) == ("r-1", "tiny_cnn", "cam", "RT", (12, 345), "cam0", False)
    assert ctrl.deadline_s == pytest.approx(0.033)
    no_deadline = codec.read_control(_request(deadline=NS(sec=0, nanosec=0), priority=1,
                                              client=""))
    assert no_deadline.deadline_s is None and no_deadline.priority == "BE"
    assert no_deadline.client == "remote"
    assert ctrl.hard_deadline_s is None and ctrl.variant_group is None  # absent: none
    qos = codec.read_control(_request(hard_deadline=NS(sec=1, nanosec=500_000_000),
                                      variant_group="det"))
    assert qos.hard_deadline_s == pytest.approx(1.5) and qos.variant_group == "det"
    zero = codec.read_control(_request(hard_deadline=NS(sec=0, nanosec=0), variant_group=""))
    assert zero.hard_deadline_s is None and zero.variant_group is None


@pytest.mark.parametrize("field, value, words, rid", [
    ("id", "", "'id'", ""),
    ("id", "x" * 129, "'id'", ""),
    ("model", "", "'model'", "r-1"),
    ("priority", 7, "priority", "r-1"),
    ("deadline", NS(sec=-1, nanosec=0), "deadline", "r-1"),
    ("hard_deadline", NS(sec=-1, nanosec=0), "hard_deadline", "r-1"),
    ("hard_deadline", NS(sec=0, nanosec=10**9), "hard_deadline", "r-1"),
    ("variant_group", "g" * 129, "variant_group", "r-1"),
])
def test_bad_control_fields_raise_with_the_id(field, value, words, rid):
    with pytest.raises(codec.CodecError, match=words) as ei:
        codec.read_control(_request(**{field: value}))
    assert ei.value.request_id == rid and ei.value.code == codec.MALFORMED


@pytest.mark.parametrize("mutate, words", [
    (lambda t: setattr(t, "name", ""), "name must be"),
    (lambda t: setattr(t, "data_type", 99), "unknown data_type"),
    (lambda t: (setattr(t, "shape", array.array("I", [1, 3, 2, 3])),
                setattr(t, "strides", array.array("Q"))), "data has 48"),
    (lambda t: setattr(t, "data", array.array("B", b"\0" * 47)), "data has 47"),
    (lambda t: setattr(t, "strides", array.array("Q", [4, 4, 4, 4])), "not C-contiguous"),
    (lambda t: setattr(t.shape, "rank", 3), "rank 3 but 4 dims"),
])
def test_bad_tensor_metadata_raises_with_the_id(mutate, words):
    t = _tensor()
    mutate(t)
    with pytest.raises(codec.CodecError, match=words) as ei:
        codec.check_tensors([t], request_id="r-9")
    assert ei.value.request_id == "r-9" and ei.value.code == codec.MALFORMED


def test_duplicate_names_are_malformed():
    with pytest.raises(codec.CodecError, match="twice"):
        codec.check_tensors([_tensor(), _tensor()])


def test_limits_are_checked_before_the_payload():
    small = codec.Limits(max_tensors=2, max_tensor_bytes=800, max_request_bytes=1000,
                         max_rank=3)
    # a huge declared shape is refused by its metadata alone: data is never looked at
    huge = NS(name="h", shape=array.array("I", [2**31, 2**31]), data_type=10,
              strides=array.array("Q"), data=None)
    for tensors, words in (([_tensor("a"), _tensor("b"), _tensor("c")], "too many"),
                           ([huge], "bytes > the limit"),
                           ([_tensor("a", np.zeros((12, 12), np.float32)),
                             _tensor("b", np.zeros((12, 12), np.float32))], "exceed"),
                           ([_tensor("r", np.zeros((1,) * 4, np.uint8))], "rank")):
        with pytest.raises(codec.TooLargeError, match=words) as ei:
            codec.check_tensors(tensors, small, "r-2")
        assert ei.value.code == "request_too_large" and ei.value.request_id == "r-2"
    with pytest.raises(ValueError):
        codec.Limits(max_tensors=0)


def test_check_spec_names_what_differs():
    views = codec.check_tensors([_tensor()])
    spec = {"input": ((1, 3, 2, 2), "float32")}
    codec.check_spec("m", spec, views)
    with pytest.raises(InvalidInputError, match=r"missing \['other'\]"):
        codec.check_spec("m", {**spec, "other": ((1,), "float32")}, views)
    with pytest.raises(InvalidInputError, match=r"expected float32\[1, 3, 2, 3\]"):
        codec.check_spec("m", {"input": ((1, 3, 2, 3), "float32")}, views)


def test_status_codes_match_the_message_constants():
    msgs = pytest.importorskip("av_infer_msgs.msg")
    R = msgs.InferResponse
    from av_infer import error_from_code

    for code, status in codec.STATUS.items():
        const = {"ok": "STATUS_OK", codec.MALFORMED: "STATUS_MALFORMED_REQUEST"}.get(
            code, "STATUS_" + code.upper())
        if not hasattr(R, const):  # a refinement (not_allowed: a rejection) has its
            parent = type(error_from_code(code, "")).__mro__[1]  # parent's status
            const = "STATUS_" + parent.code.upper()
        assert getattr(R, const) == status, code
    assert codec.status_of("something_new") == R.STATUS_INTERNAL_ERROR == 255
    T = msgs.Tensor
    for code, dtype in codec.DATA_TYPES.items():
        assert getattr(T, "DATA_TYPE_" + dtype.name.upper()) == code


def test_data_type_codes_are_isaac_ros_codes():
    """isaac_ros_tensor_list_interfaces/Tensor.msg documents 1 int8 ... 8 uint64, 9 float32,
    10 float64; GXF's PrimitiveType continues 11 complex64, 12 complex128, 13 float16."""
    isaac = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
             "float32", "float64", "complex64", "complex128", "float16"]
    assert {codec.DATA_TYPE_OF[n]: n for n in isaac} == dict(enumerate(isaac, start=1))
    assert codec.DATA_TYPE_OF["bool"] == 128 and 128 not in codec.ISAAC_DATA_TYPES
    assert codec.ISAAC_DATA_TYPES == frozenset(range(1, 11))


def test_fill_timings():
    tm = NS(arrival=1.0, start=1.002, end=1.005, preempted=1,
            kernels_padded=0)
    m = codec.fill_timings(NS(), tm, deadline=1.01, received=0.999, now=1.006)
    assert m.queueing_ms == pytest.approx(2.0) and m.compute_ms == pytest.approx(3.0)
    assert m.total_ms == pytest.approx(7.0) and m.has_deadline and m.deadline_met
    assert m.preempted == 1
    missed = codec.fill_timings(NS(), tm, deadline=1.004)
    assert missed.has_deadline and not missed.deadline_met and np.isnan(missed.total_ms)
    none = codec.fill_timings(NS(), None, None)
    assert np.isnan(none.compute_ms) and not none.has_deadline


# -- preprocessing -------------------------------------------------------------------------
pre = pytest.importorskip("av_infer_nodes.preprocess")


def test_encodings_agree_and_normalise():
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    shape = (1, 3, 6, 8)
    a = pre.image_to_tensor("rgb8", 6, 8, 24, rgb.tobytes(), shape, mean=[0.0], std=[1.0])
    b = pre.image_to_tensor("bgr8", 6, 8, 24, rgb[:, :, ::-1].tobytes(), shape,
                            mean=[0.0], std=[1.0])
    assert a.shape == shape and a.dtype == np.float32
    np.testing.assert_allclose(a, b)
    np.testing.assert_allclose(a[0], rgb.transpose(2, 0, 1) / 255.0, rtol=1e-6)


def test_step_padding_mono_and_resize():
    img = np.arange(4 * 5, dtype=np.uint8).reshape(4, 5)
    padded = np.zeros((4, 8), np.uint8)
    padded[:, :5] = img
    t = pre.image_to_tensor("mono8", 4, 5, 8, padded.tobytes(), (1, 3, 4, 5),
                            mean=[0.0], std=[1.0])
    np.testing.assert_allclose(t[0, 1], img / 255.0, rtol=1e-6)
    for method in pre.RESIZE_METHODS:
        r = pre.image_to_tensor("mono8", 4, 5, 8, padded.tobytes(), (1, 3, 8, 10), method)
        assert r.shape == (1, 3, 8, 10) and np.isfinite(r).all()
    up = pre.resize(np.full((2, 2, 1), 7, np.uint8), 5, 3, "bilinear")
    np.testing.assert_allclose(up, 7.0)


def test_bad_images_rejected():
    with pytest.raises(pre.ImageFormatError, match="encoding"):
        pre.image_to_tensor("yuv422", 2, 2, 4, bytes(8), (1, 3, 2, 2))
    with pytest.raises(pre.ImageFormatError, match="needs"):
        pre.image_to_tensor("rgb8", 2, 2, 6, bytes(5), (1, 3, 2, 2))
    with pytest.raises(pre.ImageFormatError, match="step"):
        pre.image_to_tensor("rgb8", 2, 2, 3, bytes(12), (1, 3, 2, 2))


def test_preprocess_writes_into_the_given_buffer():
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
    shape = (2, 3, 10, 12)
    fresh = pre.image_to_tensor("rgb8", 24, 32, 96, img.tobytes(), shape)
    out = np.empty(shape, np.float32)
    got = pre.image_to_tensor("rgb8", 24, 32, 96, img.tobytes(), shape, out=out)
    assert got is out
    np.testing.assert_allclose(out, fresh, rtol=1e-6)
    np.testing.assert_array_equal(out[0], out[1])
    with pytest.raises(ValueError, match="out must be"):
        pre.image_to_tensor("rgb8", 24, 32, 96, img.tobytes(), shape,
                            out=np.empty((1, 3, 10, 12), np.float32))


def test_bilinear_matches_a_direct_formula():
    """Pixel-centre aligned bilinear (OpenCV's convention), computed point by point."""
    rng = np.random.default_rng(2)
    img = rng.integers(0, 256, (7, 9, 1), dtype=np.uint8)
    got = pre.resize(img, 4, 5, "bilinear")[:, :, 0]
    want = np.empty((4, 5))
    for i in range(4):
        for j in range(5):
            fy = min(max((i + 0.5) * 7 / 4 - 0.5, 0), 6)
            fx = min(max((j + 0.5) * 9 / 5 - 0.5, 0), 8)
            y0, x0 = int(fy), int(fx)
            y1, x1 = min(y0 + 1, 6), min(x0 + 1, 8)
            a, b = img[y0, x0, 0] * (1 - fx + x0) + img[y0, x1, 0] * (fx - x0), 0
            b = img[y1, x0, 0] * (1 - fx + x0) + img[y1, x1, 0] * (fx - x0)
            want[i, j] = a * (1 - fy + y0) + b * (fy - y0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)


def test_input_buffers_are_taken_over_not_copied():
    """``Runtime.input_buffers``: filled in place and handed to ``submit`` without its usual
    copy (the arrays become read-only: the request owns them); a replaced (foreign) array
    is copied as usual and stays the caller's."""
    from av_infer import Runtime
    from av_infer.model import zoo

    with Runtime(device="cpu") as rt:
        rt.load_model("tiny_cnn", zoo.path("tiny_cnn"))
        x = zoo.sample_inputs("tiny_cnn")["input"]
        bufs = rt.input_buffers("tiny_cnn")
        assert set(bufs) == {"input"} and bufs["input"].shape == x.shape
        np.copyto(bufs["input"], x)
        got = rt.submit("tiny_cnn", bufs).result(120)
        assert not bufs["input"].flags.writeable  # taken over
        want = rt.submit("tiny_cnn", {"input": x}).result(120)
        np.testing.assert_array_equal(got.outputs["logits"], want.outputs["logits"])
        other = rt.input_buffers("tiny_cnn")
        foreign = x.copy()
        other["input"] = foreign
        rt.submit("tiny_cnn", other).result(120)
        assert foreign.flags.writeable  # copied, not taken


def test_message_buffers_become_tensor_data_without_a_copy():
    common = pytest.importorskip("av_infer_nodes.common")
    bufs = common.MessageBuffers({"input": ([1, 3, 4, 5], "float32"), "m": ([2], "int64")})
    bufs["input"][...] = 1.5  # e.g. preprocessing writes here
    bufs["m"] = np.array([7, 8])  # replaced: copied as usual
    ctrl = codec.RequestControl(id="r", model="m", client="c", priority="BE", stamp=(0, 0),
                                frame_id="", deadline_s=None, drop_late=False)
    msg = common.request_msg(ctrl, bufs)
    t = {x.name: x for x in msg.tensors}
    assert t["input"].data is bufs.raw["input"]  # the very buffer: no copy
    views = codec.check_tensors(msg.tensors)
    np.testing.assert_array_equal(views["input"], np.full((1, 3, 4, 5), 1.5, np.float32))
    np.testing.assert_array_equal(views["m"], [7, 8])


@pytest.mark.parametrize("stamp", [(0, 0), (1_795_000_000, 999_999_999), (-5, 7)])
@pytest.mark.parametrize("encoding,h,w", [("rgb8", 240, 320), ("mono8", 3, 5)])
def test_camera_frame_is_the_image_restamped(stamp, encoding, h, w) -> None:
    """The demo's cameras publish ``testing.CameraFrame`` bytes: serialised once, each
    publication with its own stamp; they deserialise to the very ``Image`` with that
    stamp (header frame id, size, encoding, step, pixels unchanged)."""
    pytest.importorskip("rclpy")
    from av_infer_nodes.testing import CameraFrame, make_image
    from builtin_interfaces.msg import Time
    from rclpy.serialization import deserialize_message
    from sensor_msgs.msg import Image

    msg = make_image(NS(get_clock=None), "cam", h, w, encoding, seed=3, stamp=Time(sec=1))
    frame = CameraFrame(msg)
    got = deserialize_message(frame.stamped(*stamp), Image)
    assert (got.header.stamp.sec, got.header.stamp.nanosec) == stamp
    msg.header.stamp = Time(sec=stamp[0], nanosec=stamp[1])
    assert got == msg
