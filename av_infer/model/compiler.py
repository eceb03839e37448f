"""``compile_model``: ONNX -> Plan, the one entry point of the model compiler.

Pipeline: load + check -> bind input shapes -> static shape inference and constant
folding (``onnx_import``) -> lowering to kernel nodes (``lower``) -> fusion passes
(``passes``, skipped when ``optimize=False``) -> dead-code elimination -> output
materialisation, geometry and memory planning (``assemble.build_plan``, ``geometry``,
``memplan``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import onnx

from av_infer.errors import InvalidParameterError
from av_infer.model import passes
from av_infer.model.assemble import build_plan, eliminate_dead
from av_infer.model.lower import Lowerer
from av_infer.model.onnx_import import import_model, load_model
from av_infer.model.plan import Plan

__all__ = ["compile_model"]


def compile_model(
    source: str | os.PathLike | bytes | onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | Sequence[int] | None = None,
    name: str | None = None,
    reuse_guard: int = 16,
    optimize: bool = True,
) -> Plan:
    """Compile an ONNX model into a :class:`Plan`.

    ``input_shapes`` binds dynamic dims (a bare sequence for a single-input model).
    ``reuse_guard`` is the idempotency window of the memory planner (see ``plan.py``).
    ``optimize=False`` skips fusion passes (constant folding and views always happen);
    ``plan.stats`` counts what the passes did.

    Raises ModelLoadError (and its subclasses UnsupportedModelError,
    UnboundDimensionError) with a message saying what is wrong.
    """
    if int(reuse_guard) < 0:
        raise InvalidParameterError(f"reuse_guard must be >= 0, got {reuse_guard}")
    model = load_model(source)
    if name is None and isinstance(source, (str, os.PathLike)):
        name = os.path.splitext(os.path.basename(os.fspath(source)))[0]
    g = import_model(model, input_shapes, name)
    knodes = Lowerer(g).run()
    stats = dict(g.stats)
    stats.update(folded_bn=0, fused_epilogue=0, merged_unary=0, fused_gelu=0)
    knodes = eliminate_dead(g, knodes)
    if optimize:
        knodes, stats["fused_gelu"] = passes.fuse_gelu(g, knodes)
        knodes, stats["folded_bn"] = passes.fold_batchnorm(g, knodes)
        knodes, stats["fused_epilogue"] = passes.fuse_epilogues(g, knodes)
        knodes, stats["merged_unary"] = passes.merge_unary(g, knodes)
        knodes = eliminate_dead(g, knodes)
    stats["views"] = sum(1 for k in knodes if k.kind == "view")
    plan = build_plan(g, knodes, int(reuse_guard))
    stats["kernels"] = len(plan.kernels)
    stats["copies"] = sum(1 for k in plan.kernels if k.kind == "copy")
    stats["optimize"] = bool(optimize)
    plan.stats = stats
    return plan
