"""Small hand-built plans covering every kernel kind (and the tricky variants of some).

Why here: the nvcc compile test (no GPU), the GPU-vs-numpy device test and the GPU
benchmarks all need the same coverage, and a plan built by hand reaches variants (int
gathers, negative slice steps, broadcast residuals, TF32) a zoo model may not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from av_infer.model.plan import Plan
from av_infer.model.plan_builder import PlanBuilder


def _r(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


Sample = tuple[Plan, dict[str, np.ndarray]]


def _one(kind: str, ins: dict[str, np.ndarray], outs: dict[str, tuple[tuple[int, ...], str]],
         weights: dict[str, np.ndarray] | None = None, order: list[str] | None = None,
         name: str | None = None, **args: Any) -> Sample:
    b = PlanBuilder(name or kind)
    for n, a in ins.items():
        b.tensor(n, a.shape, a.dtype.name, "input")
    for n, a in (weights or {}).items():
        b.weight(n, a)
    for n, (shape, dt) in outs.items():
        b.tensor(n, shape, dt, "output")
    b.kernel(kind, order or [*ins, *(weights or {})], list(outs), **args)
    return b.build(), ins


def samples(seed: int = 0) -> dict[str, Sample]:
    """name -> (single-kernel plan, inputs). Covers every kind of KERNEL_KINDS but trace."""
    rng = np.random.default_rng(seed)
    r = lambda *s: _r(rng, *s)  # noqa: E731
    S: dict[str, Callable[[], Sample]] = {
        "conv3x3_bias_relu": lambda: _one(
            "conv", {"x": r(2, 8, 13, 11)}, {"y": ((2, 16, 13, 11), "float32")},
            {"w": r(16, 8, 3, 3), "b": r(16)}, order=["x", "w"], strides=[1, 1],
            pads=[1, 1, 1, 1], dilations=[1, 1], group=1, bias="b", epilogue=[["relu", {}]]),
        "conv_stride2_group2_residual": lambda: _one(
            "conv", {"x": r(1, 8, 17, 17), "res": r(1, 8, 8, 8)}, {"y": ((1, 8, 8, 8), "float32")},
            {"w": r(8, 4, 3, 3)}, order=["x", "w", "res"], strides=[2, 2], pads=[0, 0, 0, 0],
            dilations=[1, 1], group=2, bias=None,
            epilogue=[["add", "res"], ["clip", {"min": 0.0, "max": 6.0}]]),
        "conv_depthwise_dilated": lambda: _one(
            "conv", {"x": r(1, 6, 9, 9)}, {"y": ((1, 12, 9, 9), "float32")},
            {"w": r(12, 1, 3, 3), "b": r(12)}, order=["x", "w"], strides=[1, 1],
            pads=[2, 2, 2, 2], dilations=[2, 2], group=6, bias="b",
            epilogue=[["leaky_relu", {"alpha": 0.1}]]),
        "conv_1x1_big": lambda: _one(
            "conv", {"x": r(1, 70, 9, 15)}, {"y": ((1, 130, 9, 15), "float32")},
            {"w": r(130, 70, 1, 1)}, order=["x", "w"], strides=[1, 1], pads=[0, 0, 0, 0],
            dilations=[1, 1], group=1, bias=None, epilogue=[["hard_swish", {}]]),
        "conv_transpose": lambda: _one(
            "conv_transpose", {"x": r(1, 4, 5, 6)}, {"y": ((1, 6, 11, 12), "float32")},
            {"w": r(4, 3, 3, 3), "b": r(6)}, order=["x", "w"], strides=[2, 2],
            pads=[1, 1, 1, 0], dilations=[1, 1], group=2, output_padding=[1, 0], bias="b",
            epilogue=[["sigmoid", {}]]),
        "gemm_trans_b_bias": lambda: _one(
            "gemm", {"a": r(37, 70)}, {"y": ((37, 66), "float32")},
            {"b": r(66, 70), "c": r(66)}, order=["a", "b"], trans_a=0, trans_b=1,
            alpha=0.5, beta=2.0, bias="c", epilogue=[["gelu_erf", {}]]),
        "gemm_batched_broadcast_residual": lambda: _one(
            "gemm", {"a": r(2, 3, 17, 9), "b": r(3, 9, 20), "res": r(1, 20)},
            {"y": ((2, 3, 17, 20), "float32")}, order=["a", "b", "res"], trans_a=0, trans_b=0,
            alpha=1.0, beta=1.0, bias=None, epilogue=[["add", "res"], ["tanh", {}]]),
        "gemm_trans_a_vec": lambda: _one(
            "gemm", {"a": r(9, 5), "b": r(9)}, {"y": ((5,), "float32")}, trans_a=1,
            trans_b=0, alpha=1.0, beta=1.0, bias=None, epilogue=[]),
        "binary_add_bcast": lambda: _one(
            "binary", {"a": r(2, 3, 4, 5), "b": r(3, 1, 5)}, {"y": ((2, 3, 4, 5), "float32")},
            op="add"),
        "binary_div_int": lambda: _one(
            "binary", {"a": rng.integers(-50, 50, (4, 6)).astype(np.int64),
                       "b": rng.integers(1, 7, (6,)).astype(np.int64)},
            {"y": ((4, 6), "int64")}, op="div"),
        "binary_less_bool": lambda: _one(
            "binary", {"a": r(4, 6), "b": r(4, 1)}, {"y": ((4, 6), "bool")}, op="less"),
        "binary_pow_mod": lambda: _one(
            "binary", {"a": np.abs(r(5, 7)) + 0.1, "b": r(7)}, {"y": ((5, 7), "float32")},
            op="mod"),
        "unary_chain": lambda: _one(
            "unary", {"x": r(3, 50)}, {"y": ((3, 50), "float32")},
            ops=[["abs", None], ["sqrt", None], ["clip", {"min": 0.2, "max": None}],
                 ["elu", {"alpha": 0.5}], ["softplus", None], ["mish", None]]),
        "unary_not": lambda: _one(
            "unary", {"x": rng.integers(0, 2, (17,)).astype(bool)}, {"y": ((17,), "bool")},
            ops=[["not", None]]),
        "pool_max_ceil": lambda: _one(
            "pool", {"x": r(1, 3, 10, 10)}, {"y": ((1, 3, 5, 5), "float32")}, mode="max",
            kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], dilations=[1, 1], ceil_mode=1,
            count_include_pad=0),
        "pool_avg_incl": lambda: _one(
            "pool", {"x": r(2, 4, 7, 7)}, {"y": ((2, 4, 4, 4), "float32")}, mode="avg",
            kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], dilations=[1, 1], ceil_mode=0,
            count_include_pad=1),
        "global_pool_avg": lambda: _one(
            "global_pool", {"x": r(2, 5, 7, 9)}, {"y": ((2, 5, 1, 1), "float32")}, mode="avg"),
        "reduce_sum_mid": lambda: _one(
            "reduce", {"x": r(3, 4, 5, 6)}, {"y": ((3, 1, 5, 1), "float32")}, op="sum",
            axes=[1, 3], keepdims=1),
        "reduce_lse": lambda: _one(
            "reduce", {"x": r(4, 300)}, {"y": ((4,), "float32")}, op="log_sum_exp", axes=[-1],
            keepdims=0),
        "softmax_axis1": lambda: _one(
            "softmax", {"x": r(2, 7, 3)}, {"y": ((2, 7, 3), "float32")}, axis=1),
        "softmax_last_log": lambda: _one(
            "softmax", {"x": r(5, 1000)}, {"y": ((5, 1000), "float32")}, axis=-1, log=True),
        "layernorm": lambda: _one(
            "layernorm", {"x": r(2, 5, 48)}, {"y": ((2, 5, 48), "float32")},
            {"s": r(48), "bb": r(48)}, axis=-1, epsilon=1e-5),
        "concat": lambda: _one(
            "concat", {"a": r(2, 3, 4), "b": r(2, 5, 4), "c": r(2, 1, 4)},
            {"y": ((2, 9, 4), "float32")}, axis=1),
        "split": lambda: _one(
            "split", {"x": r(3, 10)}, {"y0": ((3, 4), "float32"), "y1": ((3, 6), "float32")},
            axis=1, sizes=[4, 6]),
        "transpose": lambda: _one(
            "transpose", {"x": r(2, 3, 4, 5)}, {"y": ((5, 2, 4, 3), "float32")},
            perm=[3, 0, 2, 1]),
        "slice_neg_step": lambda: _one(
            "slice", {"x": r(6, 8)}, {"y": ((3, 4), "float32")}, starts=[1, 7], ends=[6, -1],
            axes=[0, 1], steps=[2, -2]),
        "pad_reflect": lambda: _one(
            "pad", {"x": r(1, 2, 4, 5)}, {"y": ((1, 2, 7, 6), "float32")},
            pads=[0, 0, 2, 1, 0, 0, 1, 0], mode="reflect"),
        "pad_const_crop": lambda: _one(
            "pad", {"x": r(3, 5)}, {"y": ((4, 4), "float32")}, pads=[1, -1, 0, 0],
            mode="constant", value=1.5),
        "gather_int64": lambda: _one(
            "gather", {"d": r(5, 4, 3), "i": np.array([[0, -1], [2, 3]], np.int64)},
            {"y": ((5, 2, 2, 3), "float32")}, axis=1),
        "resize_nearest": lambda: _one(
            "resize", {"x": r(1, 2, 3, 4)}, {"y": ((1, 2, 6, 8), "float32")}, mode="nearest",
            coordinate_transformation_mode="asymmetric", nearest_mode="floor",
            scales=[1.0, 1.0, 2.0, 2.0]),
        "resize_linear": lambda: _one(
            "resize", {"x": r(1, 2, 5, 4)}, {"y": ((1, 2, 8, 9), "float32")}, mode="linear",
            coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_floor",
            scales=[]),
        "cast_f2i": lambda: _one(
            "cast", {"x": r(4, 5) * 10}, {"y": ((4, 5), "int32")}, to="int32"),
        "copy": lambda: _one("copy", {"x": r(3, 7)}, {"y": ((21,), "float32")}),
        "batchnorm": lambda: _one(
            "batchnorm", {"x": r(2, 3, 4, 4)}, {"y": ((2, 3, 4, 4), "float32")},
            {"s": r(3), "bb": r(3), "m": r(3), "v": np.abs(r(3)) + 0.5}, epsilon=1e-5),
        "where": lambda: _one(
            "where", {"c": rng.integers(0, 2, (4, 1)).astype(bool), "a": r(4, 6), "b": r(6)},
            {"y": ((4, 6), "float32")}),
    }
    return {n: f() for n, f in S.items()}


def chain_plan(seed: int = 0) -> Sample:
    """A 12-kernel chain (conv, pool, gemm, softmax, ...) for dispatch and preemption tests."""
    rng = np.random.default_rng(seed)
    b = PlanBuilder("chain")
    x = b.tensor("x", (1, 3, 32, 32), role="input")
    w1 = b.weight("w1", _r(rng, 16, 3, 3, 3))
    b1 = b.weight("b1", _r(rng, 16))
    h1 = b.tensor("h1", (1, 16, 32, 32))
    b.kernel("conv", [x, w1], [h1], strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1],
             group=1, bias=b1, epilogue=[["relu", {}]])
    h2 = b.tensor("h2", (1, 16, 16, 16))
    b.kernel("pool", [h1], [h2], mode="max", kernel=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0],
             dilations=[1, 1], ceil_mode=0, count_include_pad=0)
    prev = h2
    for i in range(6):
        w = b.weight(f"w{i + 2}", _r(rng, 16, 16, 3, 3) * 0.2)
        h = b.tensor(f"c{i}", (1, 16, 16, 16))
        b.kernel("conv", [prev, w, prev], [h], strides=[1, 1], pads=[1, 1, 1, 1],
                 dilations=[1, 1], group=1, bias=None, epilogue=[["add", prev], ["relu", {}]])
        prev = h
    g = b.tensor("g", (1, 16, 1, 1))
    b.kernel("global_pool", [prev], [g], mode="avg")
    wf = b.weight("wf", _r(rng, 16, 10))
    logits = b.tensor("logits", (1, 10))
    gv = b.tensor("gv", (1, 16))
    b.kernel("copy", [g], [gv])
    b.kernel("gemm", [gv, wf], [logits], trans_a=0, trans_b=0, alpha=1.0, beta=1.0, bias=None,
             epilogue=[])
    out = b.tensor("prob", (1, 10), role="output")
    b.kernel("softmax", [logits], [out], axis=-1)
    return b.build(), {"x": _r(rng, 1, 3, 32, 32)}
