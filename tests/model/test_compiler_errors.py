"""Compiler error paths: every failure is a typed ModelLoadError subclass with a message
that says what is wrong (and, for unsupported ops, every offending node at once)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from av_infer.errors import (
    InvalidInputError,
    InvalidParameterError,
    ModelLoadError,
    UnboundDimensionError,
    UnsupportedModelError,
)
from av_infer.model.compiler import compile_model


def _model(nodes, inputs, outputs, inits=(), opset=13, extra_opsets=()):
    g = h.make_graph(
        nodes, "t",
        [h.make_tensor_value_info(n, T.FLOAT, s) for n, s in inputs],
        [h.make_tensor_value_info(n, T.FLOAT, s) for n, s in outputs],
        [nh.from_array(np.asarray(a), n) for n, a in dict(inits).items()],
    )
    ops = [h.make_opsetid("", opset)] + [h.make_opsetid(d, 1) for d in extra_opsets]
    return h.make_model(g, opset_imports=ops, ir_version=8)


def _relu_model(shape):
    return _model([h.make_node("Relu", ["x"], ["y"])], [("x", shape)], [("y", None)])


def test_corrupt_bytes():
    with pytest.raises(ModelLoadError, match="ONNX"):
        compile_model(b"\x08\x07this is definitely not a protobuf \xff\xfe\x00\x01")


def test_empty_bytes():
    with pytest.raises(ModelLoadError):
        compile_model(b"")


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.onnx"
    with pytest.raises(ModelLoadError, match="not found") as ei:
        compile_model(missing)
    assert str(missing) in str(ei.value)


def test_corrupt_file(tmp_path):
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"garbage" * 10)
    with pytest.raises(ModelLoadError):
        compile_model(str(p))


def test_wrong_source_type():
    with pytest.raises(ModelLoadError):
        compile_model(12345)  # type: ignore[arg-type]


def test_all_unsupported_ops_reported_at_once():
    nodes = [
        h.make_node("Relu", ["x"], ["r"], name="ok"),
        h.make_node("NonMaxSuppression", ["boxes", "scores"], ["sel"], name="nms1"),
        h.make_node("MyOp", ["r"], ["c"], domain="com.example", name="custom1"),
        h.make_node("MyOp", ["c"], ["c2"], domain="com.example", name="custom2"),
        h.make_node("Relu", ["c2"], ["y"], name="after"),
    ]
    m = _model(nodes, [("x", [1, 4]), ("boxes", [1, 3, 4]), ("scores", [1, 1, 3])],
               [("y", None)], extra_opsets=["com.example"])
    with pytest.raises(UnsupportedModelError) as ei:
        compile_model(m)
    e = ei.value
    assert e.unsupported == {"MyOp": ["custom1", "custom2"], "NonMaxSuppression": ["nms1"]}
    assert "nms1" in str(e) and "custom2" in str(e)
    assert isinstance(e, ModelLoadError) and e.code == "unsupported_model"


def test_unsupported_attribute_use_reported():
    nodes = [
        h.make_node("Conv", ["x", "w"], ["c"], name="conv3d"),
        h.make_node("Pad", ["c", "pads"], ["y"], mode="wrap", name="padwrap"),
    ]
    inits = dict(w=np.ones((1, 1, 1, 1, 1), np.float32),
                 pads=np.zeros(10, np.int64))
    m = _model(nodes, [("x", [1, 1, 2, 2, 2])], [("y", None)], inits, opset=19)
    with pytest.raises(UnsupportedModelError) as ei:
        compile_model(m)
    assert ei.value.unsupported == {"Conv": ["conv3d"], "Pad": ["padwrap"]}


def test_unbound_dynamic_dim():
    with pytest.raises(UnboundDimensionError) as ei:
        compile_model(_relu_model(["batch", 3]))
    assert "'x'" in str(ei.value) and "dim 0" in str(ei.value) and "batch" in str(ei.value)


def test_symbolic_dim_bound_through_another_input():
    nodes = [h.make_node("Add", ["a", "b"], ["y"])]
    m = _model(nodes, [("a", ["n", 3]), ("b", ["n", 3])], [("y", None)])
    p = compile_model(m, {"a": [4, 3]})
    assert p.tensors["b"].shape == (4, 3) and p.tensors["y"].shape == (4, 3)


def test_shape_contradicts_static_dim():
    with pytest.raises(ModelLoadError, match="contradicts") as ei:
        compile_model(_relu_model([2, 3]), {"x": [2, 4]})
    assert isinstance(ei.value, InvalidInputError)


def test_wrong_rank_and_unknown_input_name():
    with pytest.raises(ModelLoadError, match="rank"):
        compile_model(_relu_model(["n", 3]), {"x": [2, 3, 1]})
    with pytest.raises(ModelLoadError, match="not a model input"):
        compile_model(_relu_model(["n", 3]), {"nope": [2, 3]})


def test_bare_shape_needs_single_input():
    m = _model([h.make_node("Add", ["a", "b"], ["y"])], [("a", [2]), ("b", [2])],
               [("y", None)])
    with pytest.raises(ModelLoadError, match="single-input"):
        compile_model(m, [2])


def test_negative_reuse_guard():
    with pytest.raises(InvalidParameterError):
        compile_model(_relu_model([2, 3]), reuse_guard=-1)


def test_output_never_produced():
    m = _model([h.make_node("Relu", ["x"], ["y"])], [("x", [2])], [("zzz", None)])
    with pytest.raises(ModelLoadError, match="zzz"):
        compile_model(m)


def test_fold_only_op_on_runtime_input_is_unsupported():
    nodes = [h.make_node("NonZero", ["x"], ["y"], name="nz")]
    g = h.make_graph(nodes, "t", [h.make_tensor_value_info("x", T.FLOAT, [3])],
                     [h.make_tensor_value_info("y", T.INT64, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=8)
    with pytest.raises(UnsupportedModelError) as ei:
        compile_model(m)
    assert ei.value.unsupported == {"NonZero": ["nz"]}


def test_model_proto_roundtrip_bytes_ok():
    m = _relu_model([2, 3])
    assert compile_model(onnx.load_from_string(m.SerializeToString())).kernels


def test_runtime_dependent_shape_is_unsupported():
    nodes = [h.make_node("Expand", ["x", "shp"], ["y"], name="exp")]
    g = h.make_graph(nodes, "t", [h.make_tensor_value_info("x", T.FLOAT, [1, 3]),
                                  h.make_tensor_value_info("shp", T.INT64, [2])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=8)
    with pytest.raises(UnsupportedModelError, match="runtime data") as ei:
        compile_model(m)
    assert ei.value.unsupported == {"Expand": ["exp"]}
