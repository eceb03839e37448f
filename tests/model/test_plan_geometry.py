"""Launch geometry has one owner: ``model.geometry.geometry_for`` decides it into the plan,
and the CUDA generator (``kernels.cuda.sources``) only applies it (``cuda_launch``).

The simulator, DKP and the profiles read blocks and threads from the plan, so a CUDA
launch that decided its own geometry would make them model a different kernel than the
one that runs. Pure Python: no CUDA needed.
"""

from __future__ import annotations

import functools
import pathlib

import numpy as np
import pytest

from av_infer.kernels.cuda import sources
from av_infer.kernels.cuda.sources import build_plan_source
from av_infer.model import geometry, zoo
from av_infer.model.compiler import compile_model
from av_infer.model.geometry import GEMM_THREADS, GRID_MAX, Launch, cuda_launch, geometry_for
from av_infer.model.plan import Geometry, Plan
from av_infer.model.plan_builder import PlanBuilder

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "torch"


def _hand_plan() -> Plan:
    """Kinds the zoo plans lack (slice, pad, split, copy, reduce) through the PlanBuilder."""
    b = PlanBuilder("movement")
    x = b.tensor("x", (1, 4, 10, 10), role="input")
    s = b.tensor("s", (1, 4, 6, 10))
    b.kernel("slice", [x], [s], starts=[2], ends=[8], axes=[2], steps=[1])
    p = b.tensor("p", (1, 4, 8, 12))
    b.kernel("pad", [s], [p], pads=[0, 0, 1, 1, 0, 0, 1, 1], mode="constant", value=0.0)
    y0, y1 = b.tensor("y0", (1, 1, 8, 12)), b.tensor("y1", (1, 3, 8, 12))
    b.kernel("split", [p], [y0, y1], axis=1, sizes=[1, 3])
    out = b.tensor("out", (1, 3, 8, 12), role="output")
    b.kernel("copy", [y1], [out])
    m = b.tensor("m", (1, 4, 1, 1), role="output")
    b.kernel("reduce", [p], [m], op="mean", axes=[2, 3], keepdims=1)
    return b.build()


@functools.cache
def _plans() -> dict[str, Plan]:
    plans = {}
    for name in zoo.names():
        shapes = {k: a.shape for k, a in zoo.sample_inputs(name).items()}
        plans[name] = compile_model(zoo.path(name), shapes, name=name)
    for f in ("tiny_unet_opset13.onnx", "tiny_bert_opset17.onnx"):  # conv_transpose, bert
        plans[f] = compile_model(FIXTURES / f)
    plans["movement"] = _hand_plan()
    return plans


def _n_out(plan: Plan, k) -> int:
    return sum(int(np.prod(plan.tensors[t].shape)) for t in k.outputs)


@pytest.mark.parametrize("name", [*zoo.names(), "tiny_unet_opset13.onnx",
                                  "tiny_bert_opset17.onnx", "movement"])
def test_cuda_launches_the_plans_geometry(name: str) -> None:
    """Every CUDA launch has the plan's threads and the plan's block count, laid out as a
    1-D grid; the one exception is the documented clamp (``pool``: the plan counts one
    block per output row, the elementwise CUDA kernel at most one per ``threads``
    outputs), which is exactly what ``cuda_launch`` gives for the plan's geometry."""
    plan = _plans()[name]
    specs = build_plan_source(plan).specs
    assert len(specs) == len(plan.kernels)
    for k, spec in zip(plan.kernels, specs):
        g = k.geometry
        assert g == geometry_for(k.kind, [plan.tensors[t].shape for t in k.inputs if t],
                                 [plan.tensors[t].shape for t in k.outputs], k.args), k.name
        assert spec.block == g.block, k.name
        assert spec.grid == (min(spec.nblk, GRID_MAX), 1, 1), k.name
        if k.kind == "pool":
            assert spec.nblk == cuda_launch(g, "elem", _n_out(plan, k)).nblk <= g.blocks
        else:
            assert spec.nblk == g.blocks, k.name


def test_every_kernel_kind_of_the_plans_is_covered() -> None:
    kinds = {k.kind for p in _plans().values() for k in p.kernels}
    assert {"conv", "conv_transpose", "gemm", "pool", "global_pool", "reduce", "softmax",
            "layernorm", "unary", "binary", "concat", "split", "slice", "pad", "copy",
            "transpose", "gather", "resize", "batchnorm"} <= kinds


def test_sources_keeps_no_geometry_of_its_own() -> None:
    """The generator's tile and block constants are the owner's, and it has no geometry
    function besides ``cuda_launch``."""
    assert not hasattr(sources, "_geometry")
    assert not hasattr(sources, "GRID_MAX") and not hasattr(sources, "MM_THREADS")
    assert sources.TILE is geometry.TILE and sources.GEMM_THREADS is geometry.GEMM_THREADS
    assert sources.cuda_launch is geometry.cuda_launch


def test_cuda_launch_rules() -> None:
    gemm = Geometry((4, 2, 1), (GEMM_THREADS, 1, 1))
    assert cuda_launch(gemm, "mm", 8) == Launch((8, 1, 1), (256, 1, 1), 8)
    row = Geometry((10, 1, 1), (64, 1, 1))
    assert cuda_launch(row, "row", 10) == Launch((10, 1, 1), (64, 1, 1), 10)
    assert cuda_launch(Geometry((10, 1, 1), (48, 1, 1)), "row", 10).block == (256, 1, 1)
    ew = Geometry((3, 1, 1), (256, 1, 1))
    assert cuda_launch(ew, "elem", 3000) == Launch((3, 1, 1), (256, 1, 1), 3, 1000)
    # more planned blocks than thread-sized chunks: clamped to ceil(count / threads)
    assert cuda_launch(Geometry((100, 1, 1), (64, 1, 1)), "elem", 640).nblk == 10
    # threads outside 32..1024: 256 threads, the default ceil(count / 1024) blocks
    assert cuda_launch(Geometry((7, 1, 1), (2048, 1, 1)), "elem", 5000) == Launch(
        (5, 1, 1), (256, 1, 1), 5, 1000)
    # logical blocks beyond one grid dimension loop inside the wrapper
    big = cuda_launch(Geometry((GRID_MAX, 1, 1), (256, 1, 1)), "mm", GRID_MAX + 5)
    assert big.grid == (GRID_MAX, 1, 1) and big.nblk == GRID_MAX + 5
    with pytest.raises(ValueError, match="unknown kernel work"):
        cuda_launch(ew, "tile", 1)
