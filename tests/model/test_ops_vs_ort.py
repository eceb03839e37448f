"""Operator tests: tiny ONNX models through ``compile_model`` + ``CpuPlanRunner`` against
onnxruntime. Each model runs with and without the compiler's fusion passes; float32
results must be within ``max_rel_err`` 1e-4 of onnxruntime, other dtypes exact.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from av_infer.errors import UnsupportedModelError
from av_infer.kernels.cpu import CpuPlanRunner
from av_infer.model.compiler import compile_model
from tests.ort_util import TOL, graph_model, max_rel_err, node_model, run_ort

RNG_SEED = 1234


def rnd(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(RNG_SEED + seed)
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def check(model, feeds: dict[str, np.ndarray], tol: float = TOL) -> None:
    """Compare every graph output of ``model`` with onnxruntime, optimised and not."""
    ref = run_ort(model, feeds)
    for optimize in (True, False):
        plan = compile_model(model, optimize=optimize)
        got = CpuPlanRunner(plan).run(feeds)
        assert set(got) == set(ref), f"outputs {sorted(got)} != {sorted(ref)}"
        for name, r in ref.items():
            g = got[name]
            assert g.shape == r.shape, f"{name}: shape {g.shape} != onnxruntime {r.shape}"
            assert g.dtype == r.dtype, f"{name}: dtype {g.dtype} != onnxruntime {r.dtype}"
            if r.dtype.kind == "f":
                err = max_rel_err(g, r)
                assert err <= tol, f"{name} (optimize={optimize}): max_rel_err {err:.3g}"
            else:
                np.testing.assert_array_equal(g, r, err_msg=f"{name} (optimize={optimize})")


# -- conv -----------------------------------------------------------------------------------

CONV_CASES = {
    "basic_bias": ((1, 3, 8, 8), (4, 3, 3, 3), dict(pads=[1, 1, 1, 1]), True),
    "no_bias": ((2, 3, 7, 9), (5, 3, 3, 3), dict(), False),
    "groups": ((1, 8, 7, 7), (6, 4, 3, 3), dict(group=2, pads=[1, 1, 1, 1]), True),
    "depthwise": ((1, 6, 9, 9), (6, 1, 3, 3), dict(group=6, pads=[1, 1, 1, 1]), True),
    "depthwise_s2": ((1, 4, 10, 10), (4, 1, 3, 3), dict(group=4, strides=[2, 2],
                                                        pads=[1, 1, 1, 1]), True),
    "stride2": ((1, 3, 11, 11), (4, 3, 3, 3), dict(strides=[2, 2]), True),
    "pads_asym": ((1, 2, 8, 8), (3, 2, 3, 3), dict(pads=[0, 1, 2, 1]), True),
    "dilation2": ((1, 3, 12, 12), (4, 3, 3, 3), dict(dilations=[2, 2], pads=[2, 2, 2, 2]), True),
    "same_upper": ((1, 3, 9, 8), (4, 3, 3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2]), True),
    "same_lower": ((1, 3, 9, 8), (4, 3, 4, 4), dict(auto_pad="SAME_LOWER"), True),
    "valid": ((1, 3, 9, 8), (4, 3, 3, 2), dict(auto_pad="VALID"), False),
    "pointwise": ((2, 8, 5, 5), (4, 8, 1, 1), dict(), True),
    "conv1d": ((2, 3, 16), (4, 3, 3), dict(pads=[1, 1], strides=[2]), True),
    "7x7_s2": ((1, 3, 16, 16), (8, 3, 7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3]), True),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv(case):
    xs, ws, attrs, bias = CONV_CASES[case]
    x, w = rnd(*xs), rnd(*ws, seed=1)
    inits = {"w": w}
    if bias:
        inits["b"] = rnd(ws[0], seed=2)
    attrs = dict(attrs, kernel_shape=list(ws[2:]))
    check(node_model("Conv", {"x": x}, attrs, inits), {"x": x})


CONVT_CASES = {
    "stride2": ((1, 4, 5, 5), (4, 3, 3, 3), dict(strides=[2, 2])),
    "stride2_outpad": ((1, 4, 5, 5), (4, 3, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1],
                                                       output_padding=[1, 1])),
    "k2s2": ((2, 3, 4, 6), (3, 2, 2, 2), dict(strides=[2, 2])),
    "group": ((1, 4, 5, 4), (4, 2, 3, 3), dict(group=2, pads=[1, 0, 1, 0])),
    "dilation": ((1, 2, 4, 4), (2, 3, 3, 3), dict(dilations=[2, 2], strides=[2, 2])),
    "output_shape": ((1, 2, 4, 4), (2, 3, 3, 3), dict(strides=[2, 2], output_shape=[8, 8])),
}


@pytest.mark.parametrize("case", sorted(CONVT_CASES))
def test_conv_transpose(case):
    xs, ws, attrs = CONVT_CASES[case]
    x, w, b = rnd(*xs), rnd(*ws, seed=1), rnd(ws[1] * attrs.get("group", 1), seed=2)
    attrs = dict(attrs, kernel_shape=list(ws[2:]))
    check(node_model("ConvTranspose", {"x": x}, attrs, {"w": w, "b": b}), {"x": x})


# -- gemm / matmul --------------------------------------------------------------------------

GEMM_CASES = {
    "plain": ((4, 5), (5, 3), None, {}),
    "transA": ((5, 4), (5, 3), (3,), dict(transA=1)),
    "transB": ((4, 5), (3, 5), (4, 3), dict(transB=1)),
    "both_alpha_beta": ((5, 4), (3, 5), (1, 3), dict(transA=1, transB=1, alpha=0.5, beta=2.0)),
    "scalar_c": ((4, 5), (5, 3), (1,), dict(beta=0.3)),
    "col_c": ((4, 5), (5, 3), (4, 1), dict(alpha=1.5)),
}


@pytest.mark.parametrize("case", sorted(GEMM_CASES))
@pytest.mark.parametrize("b_const", [True, False])
def test_gemm(case, b_const):
    sa, sb, sc, attrs = GEMM_CASES[case]
    a, b = rnd(*sa), rnd(*sb, seed=1)
    inputs, inits = {"a": a}, {}
    (inits if b_const else inputs)["b"] = b
    order = ["a", "b"]
    if sc is not None:
        inits["c"] = rnd(*sc, seed=2)
        order.append("c")
    check(node_model("Gemm", inputs, attrs, inits, input_order=order), inputs)


MATMUL_CASES = {
    "2d": ((4, 5), (5, 3)),
    "3d_batched": ((2, 4, 5), (2, 5, 3)),
    "3d_x_2d": ((2, 4, 5), (5, 3)),
    "4d_broadcast": ((2, 1, 4, 5), (3, 5, 6)),
    "4d_full": ((2, 3, 4, 5), (2, 3, 5, 2)),
    "vec_mat": ((5,), (2, 5, 3)),
    "mat_vec": ((2, 4, 5), (5,)),
}


@pytest.mark.parametrize("case", sorted(MATMUL_CASES))
def test_matmul(case):
    sa, sb = MATMUL_CASES[case]
    a, b = rnd(*sa), rnd(*sb, seed=1)
    check(node_model("MatMul", {"a": a, "b": b}), {"a": a, "b": b})


def test_matmul_const_weight():
    a = rnd(3, 4, 8)
    check(node_model("MatMul", {"a": a}, initializers={"w": rnd(8, 6, seed=1)}), {"a": a})


# -- elementwise ----------------------------------------------------------------------------

BCAST_SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (2, 3))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow"])
@pytest.mark.parametrize("shapes", BCAST_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_binary(op, shapes):
    a, b = rnd(*shapes[0]), rnd(*shapes[1], seed=1)
    if op == "Pow":
        a = np.abs(a) + 0.5
    if op == "Div":
        b = np.where(np.abs(b) < 0.2, 0.7, b).astype(np.float32)
    check(node_model(op, {"a": a, "b": b}), {"a": a, "b": b})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_const_operand(op):
    a = rnd(2, 3, 4)
    c = (np.abs(rnd(3, 1, seed=1)) + 0.5).astype(np.float32)
    check(node_model(op, {"a": a}, initializers={"c": c}), {"a": a})
    check(node_model(op, {"a": a}, initializers={"c": c}, input_order=["c", "a"]), {"a": a})


def test_pow_scalar_exponent():
    a = np.abs(rnd(2, 5)) + 0.1
    check(node_model("Pow", {"a": a}, initializers={"e": np.array(2.0, np.float32)}), {"a": a})


def test_int_binary():
    a = np.arange(-6, 6, dtype=np.int64).reshape(3, 4)
    b = np.array([1, 2, 3, 4], dtype=np.int64)
    for op in ("Add", "Sub", "Mul"):
        check(node_model(op, {"a": a, "b": b}), {"a": a, "b": b})


UNARY_CASES = {
    "Relu": ({}, 17, None),
    "LeakyRelu": ({"alpha": 0.2}, 17, None),
    "Sigmoid": ({}, 17, None),
    "Tanh": ({}, 17, None),
    "HardSigmoid": ({"alpha": 0.3, "beta": 0.4}, 17, None),
    "HardSwish": ({}, 17, None),
    "Erf": ({}, 17, None),
    "Sqrt": ({}, 17, "positive"),
    "Exp": ({}, 17, None),
    "Abs": ({}, 17, None),
    "Neg": ({}, 17, None),
    "Log": ({}, 17, "positive"),
    "Reciprocal": ({}, 17, "positive"),
    "Clip_opset7": ({"min": -0.5, "max": 0.8}, 7, None),
}


@pytest.mark.parametrize("case", sorted(UNARY_CASES))
def test_unary(case):
    attrs, opset, domain = UNARY_CASES[case]
    op = case.split("_")[0]
    x = rnd(2, 3, 16, scale=3.0)
    if domain == "positive":
        x = np.abs(x) + 0.05
    check(node_model(op, {"x": x}, attrs, opset=opset), {"x": x})


@pytest.mark.parametrize("opset", [11, 13, 17])
@pytest.mark.parametrize("bounds", [(-0.5, 0.8), (None, 0.3), (-0.2, None), (None, None)])
def test_clip(opset, bounds):
    x = rnd(3, 10, scale=2.0)
    inits = {}
    order = ["x"]
    lo, hi = bounds
    order.append("lo" if lo is not None else "")
    if lo is not None:
        inits["lo"] = np.array(lo, np.float32)
    if hi is not None:
        order.append("hi")
        inits["hi"] = np.array(hi, np.float32)
    while order and order[-1] == "":
        order.pop()
    check(node_model("Clip", {"x": x}, {}, inits, opset=opset, input_order=order), {"x": x})


def test_clip_dynamic_bounds_are_rejected_clearly():
    """Bounds fed at run time are not compiled (the compiler wants constants): the model is
    rejected with a typed error naming the node, never run wrongly."""
    x = rnd(3, 10, scale=2.0)
    feeds = {"x": x, "lo": np.array(-0.3, np.float32), "hi": np.array(0.4, np.float32)}
    with pytest.raises(UnsupportedModelError, match="Clip"):
        compile_model(node_model("Clip", feeds, opset=13))


def test_activation_chain_fused_into_conv():
    x = rnd(1, 3, 8, 8)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["c"], ["h"]),
        helper.make_node("Add", ["h", "r"], ["s"]),
        helper.make_node("LeakyRelu", ["s"], ["y"], alpha=0.1),
    ]
    feeds = {"x": x, "r": rnd(1, 4, 8, 8, seed=3)}
    model = graph_model(nodes, feeds, ["y"], {"w": rnd(4, 3, 3, 3, seed=1), "b": rnd(4, seed=2)})
    check(model, feeds)


def test_gelu_pattern_erf():
    x = rnd(2, 16, scale=2.0)
    sq2 = np.array(np.sqrt(2.0), np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Div", ["m", "sq2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["m", "e1"], ["p"]),
        helper.make_node("Mul", ["p", "half"], ["y"]),
    ]
    inits = {"w": rnd(16, 8, seed=1), "sq2": sq2, "one": np.array(1.0, np.float32),
             "half": np.array(0.5, np.float32)}
    check(graph_model(nodes, {"x": x}, ["y"], inits), {"x": x})


# -- pooling ------------------------------------------------------------------------------

POOL_CASES = {
    "max_basic": ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2])),
    "max_pads": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    "max_ceil": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    "max_ceil_pads": ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1],
                                      ceil_mode=1)),
    "max_dilation": ("MaxPool", dict(kernel_shape=[2, 2], dilations=[2, 2])),
    "max_same_upper": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                       auto_pad="SAME_UPPER")),
    "avg_excl_pad": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                         pads=[1, 1, 1, 1], count_include_pad=0)),
    "avg_incl_pad": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                         pads=[1, 1, 1, 1], count_include_pad=1)),
    "avg_ceil": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    "avg_ceil_incl": ("AveragePool", dict(kernel_shape=[3, 2], strides=[2, 2],
                                          pads=[1, 0, 1, 1], ceil_mode=1, count_include_pad=1)),
    "avg_plain": ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2])),
}


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pool(case):
    op, attrs = POOL_CASES[case]
    x = rnd(2, 3, 11, 10)
    check(node_model(op, {"x": x}, attrs), {"x": x})


def test_maxpool_1d():
    x = rnd(2, 3, 15)
    check(node_model("MaxPool", {"x": x}, dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
          {"x": x})


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(op):
    x = rnd(2, 5, 7, 6)
    check(node_model(op, {"x": x}), {"x": x})


# -- reductions and normalisation -----------------------------------------------------------


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([2, 3], 1), ([-1], 0), ([0, 2], 0),
                                           (None, 1)])
def test_reduce_mean(opset, axes, keepdims):
    x = rnd(2, 3, 4, 5)
    attrs = {"keepdims": keepdims}
    inits = {}
    if axes is not None:
        if opset >= 18:
            inits["axes"] = np.array(axes, np.int64)
        else:
            attrs["axes"] = axes
    check(node_model("ReduceMean", {"x": x}, attrs, inits, opset=opset), {"x": x})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin"])
def test_other_reductions(op):
    x = rnd(2, 3, 4)
    inits = {"axes": np.array([1], np.int64)} if op == "ReduceSum" else {}
    attrs = {"keepdims": 0} if op == "ReduceSum" else {"axes": [1], "keepdims": 0}
    check(node_model(op, {"x": x}, attrs, inits, opset=13), {"x": x})


def _bn_inits(c: int) -> dict[str, np.ndarray]:
    return {"s": rnd(c, seed=5), "bb": rnd(c, seed=6), "m": rnd(c, seed=7),
            "v": (np.abs(rnd(c, seed=8)) + 0.2).astype(np.float32)}


def test_batchnorm_standalone():
    x = rnd(2, 4, 5, 6)
    check(node_model("BatchNormalization", {"x": x}, {"epsilon": 1e-3}, _bn_inits(4)), {"x": x})


def test_batchnorm_2d_input():
    x = rnd(3, 4)
    check(node_model("BatchNormalization", {"x": x}, {}, _bn_inits(4)), {"x": x})


def test_batchnorm_after_conv():
    x = rnd(1, 3, 8, 8)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"], epsilon=1e-5),
        helper.make_node("Relu", ["n"], ["y"]),
    ]
    check(graph_model(nodes, {"x": x}, ["y"], {"w": rnd(4, 3, 3, 3, seed=1), **_bn_inits(4)}),
          {"x": x})


@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
def test_softmax(axis):
    x = rnd(2, 3, 5, scale=5.0)
    check(node_model("Softmax", {"x": x}, {"axis": axis}, opset=13), {"x": x})


@pytest.mark.parametrize("axis", [1, 2, -1])
def test_softmax_opset11(axis):
    x = rnd(2, 3, 4, scale=3.0)
    check(node_model("Softmax", {"x": x}, {"axis": axis}, opset=11), {"x": x})


@pytest.mark.parametrize("axis,bias", [(-1, True), (-1, False), (1, True)])
def test_layernorm(axis, bias):
    x = rnd(2, 3, 8) + 2
    shp = x.shape[axis:]
    inits = {"s": rnd(*shp, seed=1)}
    if bias:
        inits["b"] = rnd(*shp, seed=2)
    check(node_model("LayerNormalization", {"x": x}, {"axis": axis, "epsilon": 1e-5}, inits),
          {"x": x})


# -- shape and data movement ----------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = {0: [(1, 3, 4), (2, 3, 4)], 1: [(2, 1, 4), (2, 3, 4)], -1: [(2, 3, 2), (2, 3, 5)]}
    a, b = rnd(*shapes[axis][0]), rnd(*shapes[axis][1], seed=1)
    model = node_model("Concat", {"a": a, "b": b}, {"axis": axis},
                       initializers={"c": rnd(*shapes[axis][0], seed=2)})
    check(model, {"a": a, "b": b})


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_flatten(axis):
    x = rnd(2, 3, 4, 5)
    check(node_model("Flatten", {"x": x}, {"axis": axis}), {"x": x})


@pytest.mark.parametrize("shape", [[6, -1], [0, 3, 4], [-1], [2, 0, 2, 2]])
def test_reshape(shape):
    x = rnd(2, 3, 4)
    check(node_model("Reshape", {"x": x}, initializers={"s": np.array(shape, np.int64)}),
          {"x": x})


def test_reshape_between_kernels():
    x = rnd(2, 3, 4)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Reshape", ["r", "s"], ["v"]),
        helper.make_node("Sigmoid", ["v"], ["y"]),
    ]
    check(graph_model(nodes, {"x": x}, ["y", "v"], {"s": np.array([4, 6], np.int64)}),
          {"x": x})


@pytest.mark.parametrize("perm", [[0, 2, 1], [2, 0, 1], [1, 0, 2], None])
def test_transpose(perm):
    x = rnd(2, 3, 4)
    attrs = {"perm": perm} if perm is not None else {}
    check(node_model("Transpose", {"x": x}, attrs), {"x": x})


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [[0], [0, 2], [-1], None])
def test_squeeze(opset, axes):
    x = rnd(1, 3, 1, 4, 1)
    if axes == [-1]:
        x = rnd(2, 3, 1)
    elif axes == [0, 2]:
        x = rnd(1, 3, 1, 4)
    attrs, inits = {}, {}
    if axes is not None:
        if opset >= 13:
            inits["axes"] = np.array(axes, np.int64)
        else:
            attrs["axes"] = axes
    check(node_model("Squeeze", {"x": x}, attrs, inits, opset=opset), {"x": x})


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [[0], [1, -1], [0, 3]])
def test_unsqueeze(opset, axes):
    x = rnd(3, 4)
    attrs, inits = {}, {}
    if opset >= 13:
        inits["axes"] = np.array(axes, np.int64)
    else:
        attrs["axes"] = axes
    check(node_model("Unsqueeze", {"x": x}, attrs, inits, opset=opset), {"x": x})


SLICE_CASES = {
    "basic": ([1, 0], [3, 4], [0, 2], None),
    "steps2": ([0, 1], [4, 6], [1, 2], [2, 2]),
    "negative_steps": ([-1], [-100], [1], [-1]),
    "negative_step2": ([4, 3], [0, -10], [1, 2], [-2, -1]),
    "negative_idx": ([-3], [-1], [2], None),
    "clamped": ([0], [1000], [0], None),
    "no_axes": ([0, 1, 1], [2, 5, 4], None, None),
}


@pytest.mark.parametrize("opset", [10, 11, 13])
@pytest.mark.parametrize("case", sorted(SLICE_CASES))
def test_slice(opset, case):
    starts, ends, axes, steps = SLICE_CASES[case]
    x = rnd(4, 6, 5)
    inits = {"starts": np.array(starts, np.int64), "ends": np.array(ends, np.int64)}
    order = ["x", "starts", "ends"]
    if axes is not None or steps is not None:
        inits["axes"] = np.array(axes if axes is not None else list(range(len(starts))),
                                 np.int64)
        order.append("axes")
    if steps is not None:
        inits["steps"] = np.array(steps, np.int64)
        order.append("steps")
    check(node_model("Slice", {"x": x}, {}, inits, opset=opset, input_order=order), {"x": x})


def test_slice_opset1_attrs():
    x = rnd(4, 6)
    check(node_model("Slice", {"x": x}, {"starts": [1, 2], "ends": [3, 100], "axes": [0, 1]},
                     opset=9), {"x": x})


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_split(opset):
    x = rnd(2, 7, 3)
    outs = ["y0", "y1"]
    attrs, inits = {"axis": 1}, {}
    if opset >= 13:
        inits["split"] = np.array([3, 4], np.int64)
    else:
        attrs["split"] = [3, 4]
    check(node_model("Split", {"x": x}, attrs, inits, outputs=outs, opset=opset), {"x": x})


@pytest.mark.parametrize("opset", [11, 13])
def test_split_equal(opset):
    x = rnd(2, 6, 3)
    check(node_model("Split", {"x": x}, {"axis": -2}, outputs=["a", "b", "c"], opset=opset),
          {"x": x})


def test_split_num_outputs_opset18():
    x = rnd(2, 7, 3)
    check(node_model("Split", {"x": x}, {"axis": 1, "num_outputs": 3}, outputs=["a", "b", "c"],
                     opset=18), {"x": x})


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", [[0, 1, 1, 0, 2, 1], [1, 0, 2, 0, 0, 2]])
def test_pad(opset, mode, pads):
    x = rnd(3, 4, 5)
    inits = {"pads": np.array(pads, np.int64)}
    if mode == "constant":
        inits["v"] = np.array(0.75, np.float32)
    check(node_model("Pad", {"x": x}, {"mode": mode}, inits, opset=opset), {"x": x})


def test_pad_opset7_attrs():
    x = rnd(2, 3)
    check(node_model("Pad", {"x": x}, {"pads": [1, 0, 0, 2], "mode": "constant", "value": 2.0},
                     opset=7), {"x": x})


@pytest.mark.parametrize("axis,idx", [(0, [[0, -1], [2, 1]]), (1, [-2, 0, 3]), (2, -1),
                                      (-1, [4, -5])])
def test_gather(axis, idx):
    data = rnd(3, 4, 5)
    ind = np.array(idx, dtype=np.int64)
    check(node_model("Gather", {"data": data}, {"axis": axis}, {"i": ind}), {"data": data})


def test_gather_dynamic_indices():
    data = rnd(6, 4)
    ind = np.array([[5, -1, 0], [-6, 2, 2]], dtype=np.int64)
    check(node_model("Gather", {"data": data, "i": ind}, {"axis": 0}), {"data": data, "i": ind})


def test_gather_int32_indices_embedding():
    ind = np.array([[1, 0, 3]], dtype=np.int32)
    check(node_model("Gather", {"i": ind}, {"axis": 0}, {"table": rnd(5, 4)},
                     input_order=["table", "i"], out_dtype=np.float32), {"i": ind})


RESIZE_CASES = {
    "nearest_asym_floor": ("nearest", "asymmetric", "floor", [1, 1, 2, 2]),
    "nearest_half_pixel": ("nearest", "half_pixel", "round_prefer_floor", [1, 1, 1.5, 2]),
    "nearest_align_ceil": ("nearest", "align_corners", "round_prefer_ceil", [1, 1, 2, 2.5]),
    "nearest_down": ("nearest", "asymmetric", "floor", [1, 1, 0.5, 0.5]),
    "linear_half_pixel": ("linear", "half_pixel", None, [1, 1, 2, 2]),
    "linear_half_pixel_frac": ("linear", "half_pixel", None, [1, 1, 1.5, 0.75]),
    "linear_align_corners": ("linear", "align_corners", None, [1, 1, 2, 2]),
    "linear_pytorch": ("linear", "pytorch_half_pixel", None, [1, 1, 2, 0.5]),
    "linear_asymmetric": ("linear", "asymmetric", None, [1, 1, 2, 3]),
}


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("case", sorted(RESIZE_CASES))
def test_resize_scales(opset, case):
    mode, ctm, nmode, scales = RESIZE_CASES[case]
    x = rnd(1, 2, 6, 8)
    attrs = dict(mode=mode, coordinate_transformation_mode=ctm)
    if nmode:
        attrs["nearest_mode"] = nmode
    inits = {"roi": np.zeros(0, np.float32), "scales": np.array(scales, np.float32)}
    check(node_model("Resize", {"x": x}, attrs, inits, opset=opset), {"x": x})


@pytest.mark.parametrize("mode,ctm", [("nearest", "asymmetric"), ("linear", "align_corners"),
                                      ("linear", "half_pixel")])
def test_resize_sizes(mode, ctm):
    x = rnd(1, 3, 5, 7)
    inits = {"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32),
             "sizes": np.array([1, 3, 9, 12], np.int64)}
    attrs = dict(mode=mode, coordinate_transformation_mode=ctm)
    check(node_model("Resize", {"x": x}, attrs, inits, opset=13), {"x": x})


def test_upsample_nearest_opset9():
    x = rnd(1, 2, 3, 4)
    check(node_model("Upsample", {"x": x}, {"mode": "nearest"},
                     {"scales": np.array([1, 1, 2, 2], np.float32)}, opset=9), {"x": x})


@pytest.mark.parametrize(
    "src,to",
    [(np.float32, TensorProto.INT64), (np.float32, TensorProto.INT32),
     (np.int64, TensorProto.FLOAT), (np.float32, TensorProto.BOOL),
     (np.int32, TensorProto.INT64)],
)
def test_cast(src, to):
    x = (rnd(3, 5, scale=4.0)).astype(src)
    out_dtype = helper.tensor_dtype_to_np_dtype(to)
    check(node_model("Cast", {"x": x}, {"to": to}, out_dtype=out_dtype), {"x": x})


def test_identity():
    x = rnd(2, 3)
    check(node_model("Identity", {"x": x}), {"x": x})


@pytest.mark.parametrize("opset", [11, 13])
def test_dropout(opset):
    x = rnd(2, 3)
    attrs = {"ratio": 0.3} if opset < 12 else {}
    check(node_model("Dropout", {"x": x}, attrs, opset=opset), {"x": x})


def test_dropout_inside_graph():
    x = rnd(2, 8)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Dropout", ["m"], ["d"]),
        helper.make_node("Relu", ["d"], ["y"]),
    ]
    check(graph_model(nodes, {"x": x}, ["y"], {"w": rnd(8, 4, seed=1)}), {"x": x})


def test_where():
    c = np.random.default_rng(0).random((2, 3)) > 0.5
    a, b = rnd(2, 3), rnd(3, seed=1)
    check(node_model("Where", {"c": c, "a": a, "b": b}, out_dtype=np.float32),
          {"c": c, "a": a, "b": b})


def test_residual_block():
    """conv-bn-relu-conv-bn + skip, relu: exercises fusion, residual epilogue, reuse."""
    x = rnd(1, 4, 8, 8)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s", "bb", "m", "v"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c2", "s", "bb", "m", "v"], ["n2"]),
        helper.make_node("Add", ["n2", "x"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    inits = {"w1": rnd(4, 4, 3, 3, seed=1), "w2": rnd(4, 4, 3, 3, seed=2), **_bn_inits(4)}
    check(graph_model(nodes, {"x": x}, ["y"], inits), {"x": x})
