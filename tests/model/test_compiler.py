"""Compiler tests: ONNX graphs built with onnx.helper -> compile_model -> assertions on the plan
(kinds, args, fusion, views, folding, memory guard) and, where the CPU runner exists,
end-to-end numerics against onnxruntime."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

from av_infer.model.compiler import compile_model  # noqa: E402
from av_infer.model.memplan import check_guard  # noqa: E402
from av_infer.model.plan import KERNEL_KINDS, Plan  # noqa: E402

try:
    from av_infer.kernels.cpu import CpuPlanRunner
except Exception:  # pragma: no cover - the CPU kernels are another module
    CpuPlanRunner = None

RNG = np.random.default_rng(0)
F = T.FLOAT


def rnd(*shape: int, pos: bool = False) -> np.ndarray:
    a = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(a) + 0.5 if pos else a


def model(nodes, inputs, outputs, inits=(), opset=13) -> onnx.ModelProto:
    """inputs/outputs: list of (name, shape or None[, elem type])."""

    def vi(spec):
        name, shape, *et = spec
        return h.make_tensor_value_info(name, et[0] if et else F, shape)

    g = h.make_graph(
        nodes, "t", [vi(i) for i in inputs], [vi(o) for o in outputs],
        [nh.from_array(np.asarray(a), n) for n, a in dict(inits).items()],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8)


def ort_run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def sound(plan: Plan) -> None:
    """Invariants every plan must satisfy."""
    assert check_guard(plan) == []
    for k in plan.kernels:
        assert k.kind in KERNEL_KINDS, k.kind
        assert k.geometry.blocks >= 1 and k.geometry.threads >= 1
        for t in list(k.inputs) + list(k.outputs):
            assert t in plan.tensors
    for t in plan.tensors.values():
        assert all(isinstance(d, int) and d >= 0 for d in t.shape), t
        b = plan.buffers[t.buffer]
        assert t.byte_offset + t.nbytes <= b.nbytes
        if b.role != "weight":
            assert b.offset % 64 == 0 and b.offset + b.nbytes <= plan.arena_bytes
    for bid, arr in plan.weights.items():
        assert plan.buffers[bid].role == "weight" and arr.flags.c_contiguous
    # inputs / outputs have dedicated, distinct buffers
    io = [plan.tensors[n].buffer for n in plan.inputs + plan.outputs]
    assert len(io) == len(set(io))
    for n in plan.outputs:
        assert plan.buffers[plan.tensors[n].buffer].role == "output"
    plan.to_json()


def check(m: onnx.ModelProto, feeds: dict[str, np.ndarray], shapes=None, rtol=1e-4,
          **kw) -> Plan:
    """Compile (optimised and not), check invariants and compare with onnxruntime."""
    shapes = shapes or {k: list(v.shape) for k, v in feeds.items()}
    plans = [compile_model(m, shapes, **kw), compile_model(m, shapes, optimize=False, **kw)]
    for p in plans:
        sound(p)
    if CpuPlanRunner is not None:
        ref = ort_run(m, feeds)
        for p in plans:
            out = CpuPlanRunner(p).run(feeds)
            for name, r in zip(p.outputs, ref):
                got = out[name]
                assert got.shape == r.shape, (name, got.shape, r.shape)
                if r.dtype.kind == "f":
                    scale = max(1.0, float(np.abs(r).max()))
                    np.testing.assert_allclose(got, r, rtol=rtol, atol=rtol * scale)
                else:
                    np.testing.assert_array_equal(got, r)
    return plans[0]


def kinds(p: Plan) -> list[str]:
    return [k.kind for k in p.kernels]


# -- fusion --------------------------------------------------------------------------------
def conv_bn_res_model(opset=13):
    nodes = [
        h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        h.make_node("BatchNormalization", ["c", "g", "be", "m", "v"], ["bn"], name="bn"),
        h.make_node("Add", ["bn", "x"], ["s"], name="add"),
        h.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    inits = dict(w=rnd(4, 4, 3, 3), b=rnd(4), g=rnd(4, pos=True), be=rnd(4), m=rnd(4),
                 v=rnd(4, pos=True))
    return model(nodes, [("x", ["N", 4, 8, 8])], [("y", None)], inits, opset)


def test_conv_bn_add_relu_is_one_kernel():
    m = conv_bn_res_model()
    p = check(m, {"x": rnd(2, 4, 8, 8)})
    assert kinds(p) == ["conv"]
    k = p.kernels[0]
    assert k.args["epilogue"] == [["add", "x"], ["relu", {}]]
    assert k.inputs[0] == "x" and k.inputs[2] == "x"
    assert isinstance(k.args["bias"], str) and k.args["bias"] in p.tensors
    assert p.stats["folded_bn"] == 1 and p.stats["fused_epilogue"] == 2
    assert p.stats["nodes"] == 4 and p.stats["kernels"] == 1
    assert p.buffers[p.tensors[k.args["bias"]].buffer].role == "weight"
    assert k.geometry.block == (256, 1, 1) and k.geometry.smem == 2 * (64 * 16 + 16 * 64) * 4
    assert k.flops > 0 and k.bytes_moved > 0
    p0 = compile_model(m, {"x": [2, 4, 8, 8]}, optimize=False)
    assert kinds(p0) == ["conv", "batchnorm", "binary", "unary"]
    assert p0.stats["kernels"] - p.stats["kernels"] == 3


def test_residual_produced_after_conv_keeps_order():
    nodes = [
        h.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        h.make_node("Sigmoid", ["x"], ["r"], name="res"),
        h.make_node("Add", ["r", "c"], ["s"], name="add"),
        h.make_node("LeakyRelu", ["s"], ["y"], alpha=0.2, name="act"),
    ]
    m = model(nodes, [("x", [1, 3, 5, 5])], [("y", None)], dict(w=rnd(3, 3, 1, 1)))
    p = check(m, {"x": rnd(1, 3, 5, 5)})
    assert kinds(p) == ["unary", "conv"]
    assert p.kernels[1].args["epilogue"] == [["add", "r"], ["leaky_relu", {"alpha": 0.2}]]


def test_matmul_add_is_gemm_with_bias_and_tanh():
    nodes = [
        h.make_node("MatMul", ["x", "w"], ["mm"]),
        h.make_node("Add", ["mm", "b"], ["a"]),
        h.make_node("Tanh", ["a"], ["y"]),
    ]
    m = model(nodes, [("x", ["B", 3, 6])], [("y", None)], dict(w=rnd(6, 5), b=rnd(5)))
    p = check(m, {"x": rnd(2, 3, 6)})
    assert kinds(p) == ["gemm"]
    a = p.kernels[0].args
    assert a["trans_a"] == 0 and a["trans_b"] == 0 and a["alpha"] == 1.0
    assert a["bias"] is not None and a["epilogue"] == [["tanh", {}]]
    assert p.kernels[0].geometry.grid[1] == 2  # batch


def test_gemm_bn_fold_and_transb():
    nodes = [
        h.make_node("Gemm", ["x", "w", "c"], ["g"], transB=1, alpha=0.5, beta=2.0),
        h.make_node("BatchNormalization", ["g", "s", "b", "m", "v"], ["y"]),
    ]
    inits = dict(w=rnd(5, 6), c=rnd(5), s=rnd(5, pos=True), b=rnd(5), m=rnd(5),
                 v=rnd(5, pos=True))
    p = check(model(nodes, [("x", [3, 6])], [("y", None)], inits), {"x": rnd(3, 6)})
    assert kinds(p) == ["gemm"] and p.stats["folded_bn"] == 1


def test_standalone_batchnorm_and_unary_chain_merge():
    nodes = [
        h.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"]),
        h.make_node("Abs", ["bn"], ["a"]),
        h.make_node("Sqrt", ["a"], ["q"]),
        h.make_node("Neg", ["q"], ["y"]),
    ]
    inits = dict(s=rnd(3, pos=True), b=rnd(3), m=rnd(3), v=rnd(3, pos=True))
    p = check(model(nodes, [("x", [2, 3, 4, 4])], [("y", None)], inits), {"x": rnd(2, 3, 4, 4)})
    assert kinds(p) == ["batchnorm", "unary"]
    assert [o[0] for o in p.kernels[1].args["ops"]] == ["abs", "sqrt", "neg"]


def test_erf_gelu_pattern_fused():
    nodes = [
        h.make_node("Div", ["x", "sq2"], ["d"]),
        h.make_node("Erf", ["d"], ["e"]),
        h.make_node("Add", ["e", "one"], ["a"]),
        h.make_node("Mul", ["x", "a"], ["m"]),
        h.make_node("Mul", ["m", "half"], ["y"]),
    ]
    inits = dict(sq2=np.array(1.4142135, np.float32), one=np.array(1.0, np.float32),
                 half=np.array(0.5, np.float32))
    p = check(model(nodes, [("x", [2, 8])], [("y", None)], inits), {"x": rnd(2, 8)})
    assert kinds(p) == ["unary"] and p.kernels[0].args["ops"] == [["gelu_erf", {}]]


# -- views and folding ---------------------------------------------------------------------
def test_reshape_chain_is_views():
    nodes = [
        h.make_node("Relu", ["x"], ["r"]),
        h.make_node("Reshape", ["r", "shp"], ["a"]),
        h.make_node("Flatten", ["a"], ["b"], axis=1),
        h.make_node("Unsqueeze", ["b", "ax"], ["c"]),
        h.make_node("Squeeze", ["c", "ax"], ["d"]),
        h.make_node("Identity", ["d"], ["e"]),
        h.make_node("Dropout", ["e"], ["y"]),
    ]
    inits = dict(shp=np.array([0, -1], np.int64), ax=np.array([1], np.int64))
    p = check(model(nodes, [("x", [2, 3, 4])], [("y", None)], inits), {"x": rnd(2, 3, 4)})
    assert kinds(p) == ["unary"]
    assert p.tensors["y"].shape == (2, 12)
    assert p.tensors["y"].buffer == p.tensors["r"].buffer
    assert p.stats["views"] == 6


def test_dynamic_reshape_pattern_folds():
    # y = Reshape(x, Concat(Shape(x)[0], -1)) the way exporters write flatten
    nodes = [
        h.make_node("Relu", ["x"], ["r"]),
        h.make_node("Shape", ["r"], ["s"]),
        h.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        h.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        h.make_node("Cast", ["n1"], ["n2"], to=T.INT64),
        h.make_node("Concat", ["n2", "m1"], ["shape"], axis=0),
        h.make_node("Reshape", ["r", "shape"], ["f"]),
        h.make_node("MatMul", ["f", "w"], ["y"]),
    ]
    inits = dict(zero=np.array(0, np.int64), ax0=np.array([0], np.int64),
                 m1=np.array([-1], np.int64), w=rnd(12, 2))
    m = model(nodes, [("x", ["N", 3, 4])], [("y", None)], inits)
    p = check(m, {"x": rnd(5, 3, 4)})
    assert kinds(p) == ["unary", "gemm"]
    assert p.stats["const_folded"] >= 5
    assert p.tensors["f"].shape == (5, 12)
    assert "gather" not in kinds(p)


def test_constant_nodes_and_constant_subgraph_fold():
    nodes = [
        h.make_node("Constant", [], ["c"], value=nh.from_array(np.arange(6, dtype=np.float32))),
        h.make_node("Reshape", ["c", "shp"], ["c2"]),
        h.make_node("Transpose", ["c2"], ["ct"], perm=[1, 0]),
        h.make_node("Mul", ["ct", "two"], ["ct2"]),
        h.make_node("Add", ["x", "ct2"], ["y"]),
    ]
    inits = dict(shp=np.array([2, 3], np.int64), two=np.array(2.0, np.float32))
    p = check(model(nodes, [("x", [3, 2])], [("y", None)], inits), {"x": rnd(3, 2)})
    assert kinds(p) == ["binary"]
    w = [t for t in p.kernels[0].inputs if t != "x"][0]
    np.testing.assert_array_equal(p.weights[p.tensors[w].buffer],
                                  np.arange(6, dtype=np.float32).reshape(2, 3).T * 2)


def test_attention_mask_pattern_where_expand():
    # DistilBERT-like: mask (B,S) int -> Equal 0 -> reshape -> Expand -> Where(-inf)
    nodes = [
        h.make_node("MatMul", ["q", "kt"], ["sc"]),
        h.make_node("Equal", ["mask", "zero"], ["eq"]),
        h.make_node("Reshape", ["eq", "mshape"], ["eq4"]),
        h.make_node("Shape", ["sc"], ["scs"]),
        h.make_node("Expand", ["eq4", "scs"], ["eqx"]),
        h.make_node("Where", ["eqx", "ninf", "sc"], ["msk"]),
        h.make_node("Softmax", ["msk"], ["y"], axis=-1),
    ]
    inits = dict(zero=np.array(0, np.int64), mshape=np.array([2, 1, 1, 4], np.int64),
                 ninf=np.array(-1e9, np.float32))
    m = model(nodes, [("q", [2, 2, 4, 3]), ("kt", [2, 2, 3, 4]), ("mask", [2, 4], T.INT64)],
              [("y", None)], inits)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int64)
    p = check(m, {"q": rnd(2, 2, 4, 3), "kt": rnd(2, 2, 3, 4), "mask": mask})
    assert "where" in kinds(p) and "softmax" in kinds(p)
    assert p.kernels[-1].args["axis"] == 3


# -- opset variants ------------------------------------------------------------------------
@pytest.mark.parametrize("opset", [9, 13])
def test_slice_variants(opset):
    if opset < 10:
        node = h.make_node("Slice", ["x"], ["y"], starts=[1, -3], ends=[100, -1], axes=[0, 2])
        inits = {}
    else:
        node = h.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])
        inits = dict(st=np.array([1, -1], np.int64), en=np.array([100, -100], np.int64),
                     ax=np.array([0, -1], np.int64), sp=np.array([1, -2], np.int64))
    p = check(model([node], [("x", [3, 4, 5])], [("y", None)], inits, opset),
              {"x": rnd(3, 4, 5)})
    k = p.kernels[0]
    assert k.kind == "slice" and all(a >= 0 for a in k.args["axes"])
    assert all(s >= 0 for s in k.args["starts"])


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_unsqueeze_split_variants(opset):
    if opset < 13:
        nodes = [
            h.make_node("Unsqueeze", ["x"], ["u"], axes=[0]),
            h.make_node("Squeeze", ["u"], ["s"], axes=[0]),
            h.make_node("Split", ["s"], ["a", "b"], axis=-1, split=[2, 4]),
        ]
        inits = {}
    else:
        nodes = [
            h.make_node("Unsqueeze", ["x", "ax"], ["u"]),
            h.make_node("Squeeze", ["u", "ax"], ["s"]),
            h.make_node("Split", ["s", "sp"], ["a", "b"], axis=-1),
        ]
        inits = dict(ax=np.array([0], np.int64), sp=np.array([2, 4], np.int64))
    nodes.append(h.make_node("Relu", ["b"], ["rb"]))
    m = model(nodes, [("x", [2, 6])], [("a", None), ("rb", None)], inits, opset)
    p = check(m, {"x": rnd(2, 6)})
    assert kinds(p) == ["split", "unary"]
    assert p.kernels[0].args == {"axis": 1, "sizes": [2, 4]}


def test_split_opset18_num_outputs():
    n = h.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3)
    p = check(model([n], [("x", [2, 7])], [("a", None), ("b", None), ("c", None)], {}, 18),
              {"x": rnd(2, 7)})
    assert p.kernels[0].args["sizes"] == [3, 3, 1]


@pytest.mark.parametrize("opset", [10, 13, 18])
def test_pad_clip_reducemean_variants(opset):
    if opset < 11:
        nodes = [
            h.make_node("Pad", ["x"], ["p"], pads=[0, 0, 1, 2, 0, 0, 1, 0], value=0.5),
            h.make_node("Clip", ["p"], ["c"], min=-0.5, max=0.7),
            h.make_node("ReduceMean", ["c"], ["y"], axes=[2, -1], keepdims=1),
        ]
        inits = {}
    else:
        nodes = [
            h.make_node("Pad", ["x", "pads", "val"], ["p"], mode="constant"),
            h.make_node("Clip", ["p", "lo", "hi"], ["c"]),
            h.make_node("ReduceMean", ["c", "axes"] if opset >= 18 else ["c"], ["y"],
                        **({} if opset >= 18 else {"axes": [2, -1]})),
        ]
        inits = dict(pads=np.array([0, 0, 1, 2, 0, 0, 1, 0], np.int64),
                     val=np.array(0.5, np.float32), lo=np.array(-0.5, np.float32),
                     hi=np.array(0.7, np.float32), axes=np.array([2, -1], np.int64))
    p = check(model(nodes, [("x", [1, 2, 3, 4])], [("y", None)], inits, opset),
              {"x": rnd(1, 2, 3, 4)})
    assert kinds(p) == ["pad", "unary", "reduce"]
    assert p.kernels[2].args["axes"] == [2, 3]
    assert p.kernels[1].args["ops"] == [["clip", {"min": -0.5, "max": pytest.approx(0.7)}]]


def test_pad_reflect_and_edge():
    nodes = [
        h.make_node("Pad", ["x", "pads"], ["a"], mode="reflect"),
        h.make_node("Pad", ["a", "pads"], ["y"], mode="edge"),
    ]
    inits = dict(pads=np.array([0, 0, 1, 1, 0, 0, 2, 1], np.int64))
    check(model(nodes, [("x", [1, 2, 4, 4])], [("y", None)], inits), {"x": rnd(1, 2, 4, 4)})


def test_softmax_opset11_coerced_2d():
    n = h.make_node("Softmax", ["x"], ["y"], axis=1)
    p = check(model([n], [("x", [2, 3, 4])], [("y", None)], {}, 11), {"x": rnd(2, 3, 4)})
    assert kinds(p) == ["softmax"]
    assert p.tensors[p.kernels[0].inputs[0]].shape == (2, 12)


# -- operators -----------------------------------------------------------------------------
def test_conv_variants_and_pools():
    nodes = [
        h.make_node("Conv", ["x", "w1"], ["a"], auto_pad="SAME_UPPER", strides=[2, 2]),
        h.make_node("Conv", ["a", "wd", "bd"], ["b"], group=4, pads=[1, 1, 1, 1],
                    dilations=[1, 1]),
        h.make_node("Conv", ["b", "w3"], ["c"], dilations=[2, 2], pads=[2, 2, 2, 2], group=2),
        h.make_node("HardSwish", ["c"], ["c2"]),
        h.make_node("MaxPool", ["c2"], ["d"], kernel_shape=[3, 3], strides=[2, 2],
                    pads=[1, 1, 1, 1], ceil_mode=1),
        h.make_node("AveragePool", ["d"], ["e"], kernel_shape=[2, 2], pads=[0, 0, 1, 1],
                    count_include_pad=0),
        h.make_node("GlobalAveragePool", ["e"], ["y"]),
    ]
    inits = dict(w1=rnd(4, 3, 3, 3), wd=rnd(4, 1, 3, 3), bd=rnd(4), w3=rnd(6, 2, 3, 3))
    p = check(model(nodes, [("x", [1, 3, 11, 11])], [("y", None), ("d", None)], inits, 14),
              {"x": rnd(1, 3, 11, 11)})
    convs = [k for k in p.kernels if k.kind == "conv"]
    assert convs[0].args["pads"] == [1, 1, 1, 1]  # SAME_UPPER, 11 -> 6 with stride 2
    assert convs[2].args["epilogue"] == [["hard_swish", {}]]
    assert kinds(p)[-3:] == ["pool", "pool", "global_pool"]


def test_resolve_pads_auto_pad():
    from av_infer.model.lower import resolve_pads

    assert resolve_pads("SAME_UPPER", [12, 12], [3, 3], [2, 2], [1, 1], None) == [0, 0, 1, 1]
    assert resolve_pads("SAME_LOWER", [12, 12], [3, 3], [2, 2], [1, 1], None) == [1, 1, 0, 0]
    assert resolve_pads("VALID", [12], [3], [1], [1], [5, 5]) == [0, 0]
    assert resolve_pads("NOTSET", [12], [3], [1], [1], [2, 1]) == [2, 1]


def test_conv1d_and_pool1d_via_views():
    nodes = [
        h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1]),
        h.make_node("Relu", ["c"], ["r"]),
        h.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2], strides=[2]),
        h.make_node("GlobalAveragePool", ["p"], ["y"]),
    ]
    inits = dict(w=rnd(4, 2, 3), b=rnd(4))
    p = check(model(nodes, [("x", [2, 2, 9])], [("y", None)], inits), {"x": rnd(2, 2, 9)})
    assert kinds(p) == ["conv", "unary", "pool", "global_pool"]
    assert p.tensors[p.kernels[0].inputs[0]].shape == (2, 2, 1, 9)
    assert p.kernels[0].args["pads"] == [0, 1, 0, 1]


def test_conv_transpose_with_bn():
    nodes = [
        h.make_node("ConvTranspose", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1],
                    output_padding=[1, 1], group=2),
        h.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
        h.make_node("Sigmoid", ["n"], ["y"]),
    ]
    inits = dict(w=rnd(4, 3, 3, 3), b=rnd(6), s=rnd(6, pos=True), bb=rnd(6), m=rnd(6),
                 v=rnd(6, pos=True))
    p = check(model(nodes, [("x", [1, 4, 5, 5])], [("y", None)], inits), {"x": rnd(1, 4, 5, 5)})
    assert kinds(p) == ["conv_transpose"]
    assert p.kernels[0].args["output_padding"] == [1, 1]


def test_elementwise_broadcast_and_misc_ops():
    nodes = [
        h.make_node("Sub", ["x", "b"], ["a"]),
        h.make_node("Mul", ["a", "x"], ["m"]),
        h.make_node("Div", ["m", "c"], ["d"]),
        h.make_node("Pow", ["d", "two"], ["pw"]),
        h.make_node("Max", ["pw", "x", "d"], ["mx"]),
        h.make_node("Min", ["mx", "c"], ["mn"]),
        h.make_node("HardSigmoid", ["mn"], ["hs"], alpha=0.3),
        h.make_node("Exp", ["hs"], ["ex"]),
        h.make_node("Log", ["ex"], ["lg"]),
        h.make_node("Reciprocal", ["c"], ["rc"]),
        h.make_node("Add", ["lg", "rc"], ["y"]),
    ]
    inits = dict(b=rnd(4), c=rnd(3, 1, pos=True), two=np.array(2.0, np.float32))
    p = check(model(nodes, [("x", [2, 3, 4])], [("y", None)], inits), {"x": rnd(2, 3, 4)})
    assert "reciprocal" not in str([k.args for k in p.kernels])  # folded (constant input)


def test_transpose_concat_gather_cast_where_resize_layernorm():
    nodes = [
        h.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
        h.make_node("Concat", ["t", "t"], ["c"], axis=-1),
        h.make_node("Gather", ["c", "idx"], ["g"], axis=1),
        h.make_node("LayerNormalization", ["g", "sc", "bi"], ["ln"], axis=-1, epsilon=1e-5),
        h.make_node("Gather", ["emb", "ids"], ["e"], axis=0),
        h.make_node("Cast", ["ids"], ["idf"], to=T.FLOAT),
        h.make_node("Greater", ["ln", "zero"], ["gt"]),
        h.make_node("Where", ["gt", "ln", "zero"], ["w"]),
        h.make_node("Unsqueeze", ["w", "ax"], ["w4"]),
        h.make_node("Resize", ["w4", "", "scales"], ["rs"], mode="nearest"),
        h.make_node("Resize", ["w4", "", "", "sizes"], ["rl"], mode="linear"),
    ]
    inits = dict(idx=np.array([2, -1], np.int64), sc=rnd(6), bi=rnd(6),
                 emb=rnd(10, 5), zero=np.array(0.0, np.float32), ax=np.array([0], np.int64),
                 scales=np.array([1, 1, 2, 2], np.float32), sizes=np.array([1, 2, 5, 9], np.int64))
    m = model(nodes, [("x", [2, 3, 4]), ("ids", [2, 3], T.INT64)],
              [("rs", None), ("rl", None), ("e", None), ("idf", None)], inits, 13)
    feeds = {"x": rnd(2, 3, 4), "ids": np.array([[1, 2, 3], [9, 0, 4]], np.int64)}
    p = check(m, feeds)
    assert kinds(p).count("resize") == 2
    g = [k for k in p.kernels if k.kind == "gather"]
    assert g[0].args["axis"] == 1
    np.testing.assert_array_equal(p.weights[p.tensors[g[0].inputs[1]].buffer], [2, 3])


def test_upsample_opset9_and_reduce_ops():
    nodes = [
        h.make_node("Upsample", ["x", "sc"], ["u"], mode="nearest"),
        h.make_node("ReduceSum", ["u"], ["s"], axes=[1], keepdims=0),
        h.make_node("ReduceMax", ["s"], ["y"], axes=[-1], keepdims=1),
    ]
    inits = dict(sc=np.array([1, 1, 2, 3], np.float32))
    check(model(nodes, [("x", [1, 2, 2, 3])], [("y", None)], inits, 9), {"x": rnd(1, 2, 2, 3)})


def test_matmul_1d_and_gemm_activation_bias():
    nodes = [
        h.make_node("MatMul", ["v", "w"], ["a"]),
        h.make_node("Gemm", ["x", "w2", "c"], ["b"], transA=1),
    ]
    inits = dict(w=rnd(4, 3), w2=rnd(2, 5))
    m = model(nodes, [("v", [4]), ("x", [2, 3]), ("c", [3, 5])], [("a", None), ("b", None)],
              inits)
    p = check(m, {"v": rnd(4), "x": rnd(2, 3), "c": rnd(3, 5)})
    assert p.tensors["a"].shape == (3,)
    gemm = [k for k in p.kernels if k.name.startswith("Gemm") or k.args.get("bias") == "c"]
    assert gemm and gemm[0].args["trans_a"] == 1


# -- outputs -------------------------------------------------------------------------------
def test_outputs_that_alias_get_copies():
    nodes = [
        h.make_node("Identity", ["x"], ["same"]),
        h.make_node("Relu", ["x"], ["r"]),
        h.make_node("Reshape", ["r", "shp"], ["r2"]),
        h.make_node("Identity", ["k"], ["kc"]),
    ]
    inits = dict(shp=np.array([-1], np.int64), k=rnd(3))
    m = model(nodes, [("x", [2, 3])], [("same", None), ("r", None), ("r2", None),
                                       ("kc", None)], inits)
    p = check(m, {"x": rnd(2, 3)})
    assert kinds(p).count("copy") == 3  # input alias, second view of r, constant
    assert p.outputs == ["same", "r", "r2", "kc"]


# -- memory planning -----------------------------------------------------------------------
def chain_model(n: int, skips: list[int]) -> onnx.ModelProto:
    """MatMul chain with Relu or residual Adds reaching back ``skips[i]`` tensors."""
    nodes, names, inits = [], ["x"], {}
    for i in range(n):
        inits[f"w{i}"] = rnd(4, 4)
        nodes.append(h.make_node("MatMul", [names[-1], f"w{i}"], [f"m{i}"]))
        s = skips[i % len(skips)]
        if s and len(names) > s:
            nodes.append(h.make_node("Add", [f"m{i}", names[-s]], [f"t{i}"]))
        else:
            nodes.append(h.make_node("Relu", [f"m{i}"], [f"t{i}"]))
        names.append(f"t{i}")
    return model(nodes, [("x", [2, 4])], [(names[-1], None)], inits)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 24), skips=st.lists(st.integers(0, 5), min_size=1, max_size=4),
       guard=st.integers(0, 8), optimize=st.booleans())
def test_arena_guard_property(n, skips, guard, optimize):
    m = chain_model(n, skips)
    p = compile_model(m, reuse_guard=guard, optimize=optimize)
    assert p.reuse_guard == guard
    assert check_guard(p) == []
    # brute force, independently of check_guard: regions of kernel j's outputs vs reads of k
    def reg(name):
        t = p.tensors[name]
        b = p.buffers[t.buffer]
        return None if b.role == "weight" else (b.offset, b.offset + t.nbytes)

    for k in p.kernels:
        rin = [reg(t) for t in k.inputs if reg(t)]
        for j in range(k.index, min(len(p.kernels), k.index + guard + 1)):
            for o in p.kernels[j].outputs:
                a = reg(o)
                assert all(not (a[0] < r[1] and r[0] < a[1]) for r in rin)


def test_activation_reuse_happens_without_guard():
    m = chain_model(30, [0])
    p0 = compile_model(m, reuse_guard=0, optimize=False)
    p16 = compile_model(m, reuse_guard=16, optimize=False)
    assert p0.arena_bytes < p16.arena_bytes
    assert check_guard(p0) == [] and check_guard(p16) == []
    assert p16.activation_bytes == p16.arena_bytes and p16.weight_bytes > 0


def test_compile_from_file_and_bytes(tmp_path):
    m = conv_bn_res_model()
    path = tmp_path / "res.onnx"
    onnx.save(m, str(path))
    p1 = compile_model(str(path), [1, 4, 8, 8])
    p2 = compile_model(m.SerializeToString(), {"x": (1, 4, 8, 8)}, name="n")
    assert p1.name == "res" and p2.name == "n"
    assert kinds(p1) == kinds(p2) == ["conv"]
    assert p1.input_spec() == {"x": ((1, 4, 8, 8), "float32")}
