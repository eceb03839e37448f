"""ONNX's own backend node tests for every operator av_infer claims, run through av_infer.

Each case of ``onnx.backend.test.case.node`` (the generator of onnx's
``backend/test/data/node`` directory; the wheel ships the generator, not the files) whose
graph is one node of a claimed operator (``onnx_import.SUPPORTED``) is compiled with
:func:`compile_model` and run by :class:`CpuPlanRunner`, av_infer's own numpy kernels (what
``Runtime(device="cpu", device_options={"engine": "numpy"})`` executes; the default "ort"
engine would only test ONNX Runtime). Outputs must match onnx's expected outputs as onnx's
backend runner checks them: same dtype and shape, ``assert_allclose(rtol=1e-3, atol=1e-7)``.

Inputs that the cases feed as graph inputs but real exports give as constants (shapes,
axes, scales, sizes, pads, clip bounds, dropout flags: ``CONST_INPUTS``) become
initializers first; fold-only operators (``FOLD_ONLY``, claimed only on constant inputs)
get every input as an initializer, so the compiler folds them.

Cases refused on purpose are listed in ``REFUSED`` with their reason; they must fail at
compile time with a typed ``ModelLoadError`` (``UnsupportedModelError`` for operators used
in ways av_infer does not implement) whose message names that reason. A refused case that
compiles, or any other case that fails, fails the test: nothing is skipped.

Rerun: ``.venv/bin/python -m pytest tests/model/test_onnx_backend.py -q -p no:cacheprovider``.
"""

from __future__ import annotations

import functools
import re
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from av_infer.errors import ModelLoadError, UnsupportedModelError
from av_infer.kernels.cpu import CpuPlanRunner
from av_infer.model.compiler import compile_model
from av_infer.model.onnx_import import FOLD_ONLY, SUPPORTED

#: Input positions real exporters write as initializers/Constants (per operator).
CONST_INPUTS: dict[str, set[int]] = {
    "Reshape": {1}, "Expand": {1}, "Slice": {1, 2, 3, 4}, "Pad": {1, 2, 3},
    "Resize": {1, 2, 3}, "Upsample": {1}, "Squeeze": {1}, "Unsqueeze": {1},
    "ReduceMean": {1}, "ReduceSum": {1}, "ReduceMax": {1}, "ReduceMin": {1},
    "Split": {1}, "Clip": {1, 2}, "Dropout": {1, 2},
}
#: Weight positions: exports have them constant, but they may be activations too (attention
#: MatMuls), so the cases run both ways (``test_backend_node_case_constant_weights``).
WEIGHT_INPUTS: dict[str, set[int]] = {
    "Conv": {1, 2}, "ConvTranspose": {1, 2}, "Gemm": {1, 2}, "MatMul": {1},
    "BatchNormalization": {1, 2, 3, 4}, "LayerNormalization": {1, 2},
}

# -- refused on purpose: reason -> what the compiler's error message must contain ----------
R_3D = "3-D pooling/convolution: av_infer lowers 1-D and 2-D spatial ops only"
R_OPSET1 = "opset 1 model: av_infer imports ONNX opsets 7 and newer"
R_BN_TRAIN = "BatchNormalization training_mode (batch statistics, running-stat outputs)"
R_LN_STATS = "LayerNormalization Mean/InvStdDev outputs are used (training outputs)"
R_POOL_IDX = "MaxPool Indices output is used"
R_DROP_MASK = "Dropout mask output is used"
R_DROP_TRAIN = "Dropout training_mode=True with ratio > 0 (random masking is training)"
R_CUBIC = "Resize mode cubic is not lowered"
R_ANTIALIAS = "Resize antialias is not implemented"
R_TF_CROP = "Resize tf_crop_and_resize (roi) is not implemented"
R_ALIGN_FRAC = ("Resize align_corners with scales giving a fractional output length: "
                "ONNX's reference uses the fractional length (onnx/onnx#2462), ONNX Runtime "
                "and PyTorch the integer one; ambiguous, so refused (sizes work)")
R_PAD_WRAP = "Pad mode wrap is not lowered"
R_FMOD = "Mod fmod=1 (C fmod) is not implemented; av_infer's mod is Python-style"
R_FLOAT8 = "Cast to float8 with saturate=1 (numpy's cast does not saturate)"
R_E8M0 = "Cast to FLOAT8E8M0 (round-up exponent format)"
R_STRING = "STRING tensors: av_infer runs numeric tensors only"
R_NOT_TENSOR = "sequence/optional inputs: av_infer runs tensor inputs only"

EXPECT_MESSAGE: dict[str, str] = {
    R_3D: r"3-D (pooling|ConvTranspose)",
    R_OPSET1: r"opset1 .*opsets 7",
    R_BN_TRAIN: r"training-mode BatchNormalization",
    R_LN_STATS: r"Mean/InvStdDev outputs",
    R_POOL_IDX: r"MaxPool Indices output",
    R_DROP_MASK: r"Dropout mask output is used",
    R_DROP_TRAIN: r"training_mode=True",
    R_CUBIC: r"Resize mode cubic",
    R_ANTIALIAS: r"Resize antialias",
    R_TF_CROP: r"tf_crop_and_resize",
    R_ALIGN_FRAC: r"align_corners with scales: the output length .* is fractional",
    R_PAD_WRAP: r"Pad mode wrap",
    R_FMOD: r"fmod=1",
    R_FLOAT8: r"Cast to float8 with saturate=1",
    R_E8M0: r"Cast to FLOAT8E8M0",
    R_STRING: r"string tensor",
    R_NOT_TENSOR: r"is not a tensor",
}

REFUSED: dict[str, str] = {
    **{f"test_averagepool_3d_{s}": R_3D for s in (
        "default", "dilations_small",
        "dilations_large_count_include_pad_is_0_ceil_mode_is_False",
        "dilations_large_count_include_pad_is_0_ceil_mode_is_True",
        "dilations_large_count_include_pad_is_1_ceil_mode_is_False",
        "dilations_large_count_include_pad_is_1_ceil_mode_is_True")},
    **{f"test_maxpool_3d_{s}": R_3D for s in (
        "default", "dilations", "dilations_use_ref_impl", "dilations_use_ref_impl_large")},
    "test_convtranspose_3d": R_3D,
    "test_not_2d": R_OPSET1, "test_not_3d": R_OPSET1, "test_not_4d": R_OPSET1,
    "test_batchnorm_epsilon_training_mode": R_BN_TRAIN,
    "test_batchnorm_example_training_mode": R_BN_TRAIN,
    **{f"test_layer_normalization_{s}": R_LN_STATS for s in (
        "2d_axis0", "2d_axis1", "2d_axis_negative_1", "2d_axis_negative_2",
        "3d_axis0_epsilon", "3d_axis1_epsilon", "3d_axis2_epsilon",
        "3d_axis_negative_1_epsilon", "3d_axis_negative_2_epsilon",
        "3d_axis_negative_3_epsilon", "4d_axis0", "4d_axis1", "4d_axis2", "4d_axis3",
        "4d_axis_negative_1", "4d_axis_negative_2", "4d_axis_negative_3",
        "4d_axis_negative_4", "default_axis")},
    "test_maxpool_with_argmax_2d_precomputed_pads": R_POOL_IDX,
    "test_maxpool_with_argmax_2d_precomputed_strides": R_POOL_IDX,
    "test_dropout_default_mask": R_DROP_MASK,
    "test_dropout_default_mask_ratio": R_DROP_MASK,
    "test_training_dropout_zero_ratio_mask": R_DROP_MASK,
    "test_training_dropout": R_DROP_TRAIN,
    "test_training_dropout_default": R_DROP_TRAIN,
    "test_training_dropout_default_mask": R_DROP_TRAIN,
    "test_training_dropout_mask": R_DROP_TRAIN,
    **{f"test_resize_{s}": R_CUBIC for s in (
        "downsample_scales_cubic", "downsample_scales_cubic_A_n0p5_exclude_outside",
        "downsample_scales_cubic_antialias", "downsample_sizes_cubic",
        "downsample_sizes_cubic_antialias", "upsample_scales_cubic",
        "upsample_scales_cubic_A_n0p5_exclude_outside", "upsample_scales_cubic_align_corners",
        "upsample_scales_cubic_asymmetric", "upsample_sizes_cubic")},
    # cubic as well, but the fractional length is found first (at import)
    "test_resize_downsample_scales_cubic_align_corners": R_ALIGN_FRAC,
    "test_resize_downsample_scales_linear_antialias": R_ANTIALIAS,
    "test_resize_downsample_sizes_linear_antialias": R_ANTIALIAS,
    **{f"test_resize_tf_crop_and_resize{s}": R_TF_CROP for s in (
        "", "_axes_2_3", "_axes_3_2", "_extrapolation_value")},
    "test_resize_downsample_scales_linear_align_corners": R_ALIGN_FRAC,
    "test_wrap_pad": R_PAD_WRAP,
    "test_mod_int64_fmod": R_FMOD,
    "test_mod_mixed_sign_float16": R_FMOD,
    "test_mod_mixed_sign_float32": R_FMOD,
    "test_mod_mixed_sign_float64": R_FMOD,
    **{f"test_cast_{src}_to_{dst}": R_FLOAT8 for src in ("FLOAT", "FLOAT16")
       for dst in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ")},
    "test_cast_e8m0_FLOAT_to_FLOAT8E8M0": R_E8M0,
    "test_cast_e8m0_FLOAT16_to_FLOAT8E8M0": R_E8M0,
    "test_equal_string": R_STRING,
    "test_equal_string_broadcast": R_STRING,
    "test_identity_opt": R_NOT_TENSOR,
    "test_identity_sequence": R_NOT_TENSOR,
}


@functools.lru_cache(maxsize=1)
def backend_cases() -> dict[str, Any]:
    """Every one-node backend case of a claimed operator, by name (generated once)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():  # the generators overflow casts on purpose
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    out = {}
    for c in cases:
        nodes = c.model.graph.node
        if "_expanded" in c.name or len(nodes) != 1:
            continue  # function expansions test the decomposition, not the operator
        if (nodes[0].domain or "") in ("", "ai.onnx") and nodes[0].op_type in SUPPORTED:
            out[c.name] = c
    return out


CASES = sorted(backend_cases())


def _array(v: Any) -> np.ndarray:
    return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)


def prepare(case: Any, weights: bool = False, first_output: bool = False,
            ) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]:
    """(model with constant-like inputs (and ``weights``) as initializers, feeds, outputs);
    ``first_output``: only the node's first output is a graph output, as in exports."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    if first_output:
        del model.graph.output[1:]
    node = model.graph.node[0]
    inputs, outputs = case.data_sets[0]
    if node.op_type in FOLD_ONLY:
        const_pos = set(range(len(node.input)))
    else:
        const_pos = CONST_INPUTS.get(node.op_type, set())
    if weights:
        const_pos = const_pos | WEIGHT_INPUTS.get(node.op_type, set())
    const_names = {node.input[i] for i in const_pos if i < len(node.input) and node.input[i]}
    feeds: dict[str, np.ndarray] = {}
    for name, value in zip([n for n in node.input if n], inputs):
        if name not in const_names:
            feeds[name] = _array(value)
        elif isinstance(value, onnx.TensorProto):
            t = onnx.TensorProto()
            t.CopyFrom(value)
            t.name = name
            model.graph.initializer.append(t)
        else:
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    kept = [i for i in model.graph.input if i.name not in const_names]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    expected = [_array(o) for o in outputs][: len(model.graph.output)]
    return model, feeds, expected


def check_case(name: str, weights: bool = False, first_output: bool = False) -> None:
    model, feeds, expected = prepare(backend_cases()[name], weights, first_output)
    if name in REFUSED and not first_output:
        reason = REFUSED[name]
        with pytest.raises(ModelLoadError) as ei:
            compile_model(model)
        assert type(ei.value) is not ModelLoadError, (
            f"refused with the generic ModelLoadError, not a typed subclass: {ei.value}")
        assert re.search(EXPECT_MESSAGE[reason], str(ei.value)), (
            f"refused for another reason than {reason!r}: {ei.value}")
        return
    plan = compile_model(model)
    got = CpuPlanRunner(plan).run(feeds)
    names = [o.name for o in model.graph.output]
    assert sorted(got) == sorted(names)
    for out_name, ref in zip(names, expected):
        g = got[out_name]
        assert g.dtype == ref.dtype, f"{out_name}: dtype {g.dtype}, expected {ref.dtype}"
        assert g.shape == ref.shape, f"{out_name}: shape {g.shape}, expected {ref.shape}"
        np.testing.assert_allclose(g, ref, rtol=1e-3, atol=1e-7, err_msg=out_name)


@pytest.mark.parametrize("name", CASES)
def test_backend_node_case(name: str) -> None:
    check_case(name)


@pytest.mark.parametrize("name", [n for n in CASES if backend_cases()[n].model.graph.node[0]
                                  .op_type in WEIGHT_INPUTS])
def test_backend_node_case_constant_weights(name: str) -> None:
    check_case(name, weights=True)


@pytest.mark.parametrize("name", sorted(n for n, r in REFUSED.items() if r == R_LN_STATS))
def test_layer_normalization_cases_with_y_only(name: str) -> None:
    """The refused LayerNormalization cases, as exports use the op (Y only), must pass."""
    check_case(name, first_output=True)


def test_refused_list_is_current() -> None:
    """Every refused name is a case that exists (a renamed case must not hide here)."""
    assert sorted(set(REFUSED) - set(CASES)) == []
    assert set(REFUSED.values()) <= set(EXPECT_MESSAGE)


def test_every_claimed_operator_has_backend_cases() -> None:
    ops = {backend_cases()[n].model.graph.node[0].op_type for n in CASES}
    assert sorted(SUPPORTED - ops) == []


def test_refusals_are_unsupported_model_errors() -> None:
    """Operator-use refusals name the operator and node (UnsupportedModelError's contract)."""
    model, _, _ = prepare(backend_cases()["test_training_dropout"])
    with pytest.raises(UnsupportedModelError) as ei:
        compile_model(model)
    assert list(ei.value.unsupported) == ["Dropout"]


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "int32", "uint32",
                                   "int64", "uint64", "float16", "float64"])
def test_clip_every_dtype_with_and_without_bounds(dtype: str) -> None:
    """The backend cases clip int8 and float32 only; Clip is claimed for every numeric type.
    An absent bound (the plan's +-FLT_MAX) must neither overflow nor clip anything."""
    from onnx import helper

    dt = np.dtype(dtype)
    elem = helper.np_dtype_to_tensor_dtype(dt)
    lim = np.iinfo(dt) if dt.kind in "iu" else np.finfo(dt)
    x = np.array([lim.min, lim.min + 1 if dt.kind in "iu" else -1, 0, 1, 3, 7, 50, lim.max],
                 dt)
    for lo, hi in [(None, None), (3, None), (None, 7), (1, 50), (7, 3)]:
        inits = [numpy_helper.from_array(np.array(v, dt), n)
                 for n, v in (("lo", lo), ("hi", hi)) if v is not None]
        node = helper.make_node("Clip", ["x", "lo" if lo is not None else "",
                                         "hi" if hi is not None else ""], ["y"])
        graph = helper.make_graph([node], "clip", [helper.make_tensor_value_info("x", elem, [8])],
                                  [helper.make_tensor_value_info("y", elem, [8])], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                                  ir_version=8)
        got = CpuPlanRunner(compile_model(model)).run({"x": x})["y"]
        want = x.copy()
        if lo is not None:
            want = np.maximum(want, np.array(lo, dt))
        if hi is not None:
            want = np.minimum(want, np.array(hi, dt))  # min > max: every value is max (ONNX)
        np.testing.assert_array_equal(got, want, err_msg=f"{dtype} clip({lo}, {hi})")


# -- the CUDA kernels share Clip's semantics: the int8 cases through the CUDA emulator -------
CUDA_CLIP_CASES = ["test_clip_default_int8_inbounds", "test_clip_default_int8_max",
                   "test_clip_default_int8_min"]


@pytest.mark.parametrize("name", CUDA_CLIP_CASES)
def test_clip_int8_cases_on_cuda_emulator(name: str) -> None:
    """The generated CUDA C (built for the host by the emulator) clips int8 like ONNX: a
    missing bound (+-FLT_MAX in the plan) must not be converted to int8 (undefined, 0)."""
    from av_infer.devices.cuda_emu.kernels import HostKernelCompiler, find_cxx, run_plan_emulated
    from av_infer.kernels.cuda_compile import CompileCache
    from tests.checks import require
    from tests.kernels.test_cuda_compile import ROOT

    compiler = HostKernelCompiler(require(find_cxx(), "no host C++ compiler for the emulator"))
    model, feeds, expected = prepare(backend_cases()[name])
    plan = compile_model(model)
    got = run_plan_emulated(plan, feeds, compiler=compiler,
                            cache=CompileCache(ROOT / ".pytest_cache" / "av_infer_emu"))
    for out, ref in zip([o.name for o in model.graph.output], expected):
        np.testing.assert_array_equal(got[out], ref, err_msg=out)
