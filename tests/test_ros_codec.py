"""The ROS layer's wire format and image preprocessing (plain pytest, no ROS context)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from av_infer import tensor_codec as codec


def _request(**kw):
    base = dict(id="1b4e28ba-2fa1-11d2-883f-0016d3cca427", model="tiny_cnn", priority="RT",
                inputs={"input": np.arange(12, dtype=np.float32).reshape(1, 3, 2, 2),
                        "mask": np.array([[1, 0]], dtype=np.int64)},
                deadline_s=0.033, client="cam", stamp=(12, 345), frame_id="cam0")
    base.update(kw)
    return codec.TensorRequest(**base)


def test_request_round_trip():
    req = _request()
    label, data = codec.encode_request(req)
    header = json.loads(label)
    assert header["v"] == 1 and header["id"] == req.id and header["priority"] == "RT"
    assert [t["name"] for t in header["tensors"]] == ["input", "mask"]
    back = codec.decode_request(label, data)
    assert (back.id, back.model, back.priority, back.deadline_s, back.client, back.stamp,
            back.frame_id) == (req.id, "tiny_cnn", "RT", 0.033, "cam", (12, 345), "cam0")
    for name, arr in req.inputs.items():
        np.testing.assert_array_equal(back.inputs[name], arr)
        assert back.inputs[name].dtype == arr.dtype
        assert back.inputs[name].flags.writeable


def test_big_endian_and_unaligned_inputs_decode_to_native():
    arr = np.arange(5, dtype=">f4")
    label, data = codec.encode_request(_request(inputs={"a": np.zeros(1, np.uint8), "b": arr}))
    back = codec.decode_request(label, data)  # "b" starts at offset 1: unaligned
    np.testing.assert_array_equal(back.inputs["b"], np.arange(5, dtype=np.float32))
    assert back.inputs["b"].dtype.isnative


def test_response_round_trip_and_error_response():
    out = {"logits": np.random.default_rng(0).standard_normal((1, 10)).astype(np.float32)}
    resp = codec.TensorResponse(id="x", ok=True, outputs=out,
                                timings={"latency": 0.01, "start": float("nan")},
                                model="m", stamp=(1, 2), frame_id="f")
    back = codec.decode_response(*codec.encode_response(resp))
    assert back.ok and back.code == "ok" and back.stamp == (1, 2) and back.frame_id == "f"
    np.testing.assert_array_equal(back.outputs["logits"], out["logits"])
    assert back.timings["start"] is None  # NaN is not JSON
    err = codec.decode_response(*codec.encode_response(
        codec.error_response("x", "unknown_model", "no such model")))
    assert not err.ok and err.code == "unknown_model" and err.outputs == {}


def _header(**kw):
    label, data = codec.encode_request(_request(inputs={"input": np.ones((2, 2), np.float32)}))
    h = json.loads(label)
    h.update(kw)
    return h, data


def _tensor(**kw):
    t = {"name": "input", "dtype": "float32", "shape": [2, 2], "offset": 0, "nbytes": 16}
    t.update(kw)
    return [t]


@pytest.mark.parametrize("mutate, rid, words", [
    (lambda h: "{not json", "", "not valid JSON"),
    (lambda h: "[1, 2]", "", "JSON object"),
    (lambda h: "", "", "missing JSON header"),
    (lambda h: {k: v for k, v in h.items() if k != "id"}, "", "'id'"),
    (lambda h: {**h, "id": 7}, "", "'id'"),
    (lambda h: {**h, "v": 2}, "RID", "version"),
    (lambda h: {k: v for k, v in h.items() if k != "model"}, "RID", "model"),
    (lambda h: {k: v for k, v in h.items() if k != "tensors"}, "RID", "tensors"),
    (lambda h: {**h, "priority": "urgent"}, "RID", "priority"),
    (lambda h: {**h, "deadline_s": -1}, "RID", "deadline_s"),
    (lambda h: {**h, "deadline_s": "soon"}, "RID", "deadline_s"),
    (lambda h: {**h, "stamp": [1]}, "RID", "stamp"),
    (lambda h: {**h, "tensors": {"a": 1}}, "RID", "list"),
    (lambda h: {**h, "tensors": _tensor(dtype="complex64")}, "RID", "unknown dtype"),
    (lambda h: {**h, "tensors": _tensor(nbytes=12)}, "RID", "nbytes"),
    (lambda h: {**h, "tensors": _tensor(shape=[2, -2])}, "RID", "shape"),
    (lambda h: {**h, "tensors": _tensor(offset=4)}, "RID", "outside"),
    (lambda h: {**h, "tensors": _tensor(offset=-1)}, "RID", "non-negative"),
    (lambda h: {**h, "tensors": [{"name": "input"}]}, "RID", "misses"),
    (lambda h: {**h, "tensors": _tensor() + _tensor()}, "RID", "twice"),
])
def test_malformed_requests_raise_codec_error_with_id(mutate, rid, words):
    h, data = _header(id="RID")
    bad = mutate(h)
    label = bad if isinstance(bad, str) else json.dumps(bad)
    with pytest.raises(codec.CodecError) as info:
        codec.decode_request(label, data)
    assert info.value.code == "malformed_request"
    assert info.value.request_id == rid
    assert words in str(info.value)


def test_decode_defaults_for_optional_fields():
    h, data = _header()
    for k in ("deadline_s", "client", "stamp", "frame_id", "drop_late"):
        h.pop(k)
    req = codec.decode_request(json.dumps(h), data)
    assert (req.deadline_s, req.client, req.stamp, req.frame_id, req.drop_late) == (
        None, "remote", (0, 0), "", False)


def test_unsupported_dtype_cannot_be_encoded():
    with pytest.raises(codec.CodecError):
        codec.pack_tensors({"s": np.array(["a"])})


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
