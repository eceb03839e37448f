"""Pre-partitioning (PPipe §5.2): a plan's kernels grouped into N contiguous blocks.

Blocks have roughly equal latency on a reference device and end where few bytes cross:
the planner then only chooses partition points among N blocks (PPipe: N = 10 balances
plan quality and MILP time), and the bytes crossing a block boundary are the feature map a
stage hands to the next one.

Guarantees: blocks cover every kernel once, in order; ``Block.out_tensors`` is exactly
what later kernels (or the caller) read of what this block and the ones before produced, so
:func:`extract_stage` can cut the ONNX model there into runnable sub-models whose chain
computes what the whole model does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx
import onnx.utils

from av_infer.model.plan import Plan
from av_infer.pipeline.errors import UncuttableModelError

#: PPipe §5.2: "N = 10 provides a good balance between plan optimality and MILP time".
DEFAULT_BLOCKS = 10
#: a cut may move this fraction of one block's target latency to cross fewer bytes
CUT_SLACK = 0.25


@dataclass(frozen=True)
class Block:
    """Kernels ``[start, end)`` of a plan; ``in_tensors``/``out_tensors`` cross its
    boundaries (graph inputs for the first block, graph outputs for the last);
    ``out_bytes`` counts each crossing buffer once at batch size 1."""

    index: int
    start: int
    end: int
    in_tensors: tuple[str, ...]
    out_tensors: tuple[str, ...]
    out_bytes: int
    ref_us: float


def crossings(plan: Plan) -> list[tuple[tuple[str, ...], int]]:
    """For each cut ``c`` in ``0..len(kernels)``: the tensors live across it and their
    bytes. Cut 0 is the graph inputs, the last cut the graph outputs."""
    n = len(plan.kernels)
    if n == 0 or not plan.tensors:
        raise UncuttableModelError(
            f"model {plan.name!r}: the plan has no kernels or no tensor graph (a trace?); "
            "blocks need the tensors that cross each cut")
    produced: dict[str, int] = {name: -1 for name in plan.inputs}
    writers: dict[int, list[int]] = {}  # buffer -> kernels writing it, for views
    for k in plan.kernels:
        for t in k.outputs:
            produced[t] = k.index
            writers.setdefault(plan.tensors[t].buffer, []).append(k.index)
    last_use: dict[str, int] = {}
    for k in plan.kernels:
        for t in k.inputs:
            last_use[t] = k.index
    for t in plan.outputs:
        last_use[t] = n
    weight_bufs = {b.id for b in plan.buffers.values() if b.role == "weight"}

    def producer(t: str) -> int | None:
        if t in produced:
            return produced[t]
        tensor = plan.tensors.get(t)
        if tensor is None or tensor.buffer in weight_bufs:
            return None
        first_read = min((k.index for k in plan.kernels if t in k.inputs), default=n)
        ws = [i for i in writers.get(tensor.buffer, []) if i < first_read]
        return max(ws) if ws else None  # a view of an earlier kernel's output

    spans = []
    for t in last_use:
        p = producer(t)
        if p is not None:
            spans.append((t, p, last_use[t]))
    out = []
    for c in range(n + 1):
        if c == 0:
            live = list(plan.inputs)
        elif c == n:
            live = list(plan.outputs)
        else:
            live = [t for t, p, u in spans if p < c <= u]
        by_buf: dict[int, int] = {}
        for t in live:
            tt = plan.tensors[t]
            by_buf[tt.buffer] = max(by_buf.get(tt.buffer, 0), tt.nbytes)
        out.append((tuple(sorted(live)), sum(by_buf.values())))
    return out


def prepartition(plan: Plan, kernel_us: Sequence[float], n_blocks: int = DEFAULT_BLOCKS
                 ) -> list[Block]:
    """Group ``plan``'s kernels into ``n_blocks`` blocks (fewer if it has fewer kernels).

    PPipe's greedy: walk the kernels and close a block when its latency (``kernel_us`` on
    the reference device) is closest to ``total / n_blocks``; among the cuts within
    ``CUT_SLACK`` of a block's target we take the one with the fewest crossing bytes.
    """
    if isinstance(n_blocks, bool) or not isinstance(n_blocks, int) or n_blocks < 1:
        raise UncuttableModelError(f"n_blocks must be an int >= 1, got {n_blocks!r}")
    k = len(plan.kernels)
    if len(kernel_us) != k:
        raise UncuttableModelError(
            f"model {plan.name!r}: {len(kernel_us)} kernel latencies for {k} kernels")
    cross = crossings(plan)
    if k < 2 and n_blocks > 1:
        raise UncuttableModelError(
            f"model {plan.name!r} has {k} kernel(s): nothing to cut between")
    n = min(n_blocks, k)
    cum = [0.0]
    for us in kernel_us:
        cum.append(cum[-1] + max(0.0, float(us)))
    total = cum[-1] or 1.0
    step = total / n
    cuts = [0]
    for m in range(1, n):
        lo, hi = cuts[-1] + 1, k - (n - m)
        target = m * step
        cands = [c for c in range(lo, hi + 1) if abs(cum[c] - target) <= CUT_SLACK * step]
        if not cands:
            cands = [min(range(lo, hi + 1), key=lambda c: abs(cum[c] - target))]
        cuts.append(min(cands, key=lambda c: (cross[c][1], abs(cum[c] - target))))
    cuts.append(k)
    return [
        Block(i, a, b, cross[a][0], cross[b][0], cross[b][1], cum[b] - cum[a])
        for i, (a, b) in enumerate(zip(cuts, cuts[1:]))
    ]


def extract_stage(model: onnx.ModelProto, blocks: Sequence[Block], first: int, end: int
                  ) -> onnx.ModelProto:
    """The ONNX sub-model of blocks ``[first, end)``: its inputs are what crosses into
    block ``first``, its outputs what crosses out of block ``end - 1``."""
    if not (0 <= first < end <= len(blocks)):
        raise UncuttableModelError(f"stage blocks [{first}, {end}) outside 0..{len(blocks)}")
    ins, outs = list(blocks[first].in_tensors), list(blocks[end - 1].out_tensors)
    if first == 0 and end == len(blocks):
        return model
    try:
        if not model.graph.value_info:  # the extractor types the cut tensors from these
            model = onnx.shape_inference.infer_shapes(model)
        sub = onnx.utils.Extractor(model).extract_model(ins, outs)
    except Exception as e:  # noqa: BLE001 - onnx raises several kinds; all mean "cannot cut"
        raise UncuttableModelError(
            f"cannot cut {model.graph.name or 'model'} at blocks [{first}, {end}) "
            f"(inputs {ins}, outputs {outs}): {e}") from None
    sub.graph.name = f"{model.graph.name}_b{first}_{end}"
    return sub
