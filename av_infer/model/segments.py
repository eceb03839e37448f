"""Segment plans: an ONNX model cut into a few consecutive subgraphs that ONNX Runtime runs.

Why: on the CPU, ONNX Runtime's kernels (MLAS, NCHWc layouts, fused epilogues) are 2.5-8x
faster than av_infer's numpy kernels, but one ``InferenceSession.run`` is not preemptible at
REEF's kernel granularity. A *segment plan* is an ordinary :class:`~av_infer.model.plan.Plan`
whose kernels are ``ort_segment`` launches: each runs one ONNX subgraph in its own ORT session
on the task's arena buffers. The scheduler, the vHQ, ``c`` and restore-from-c work on
segments unchanged; the cpu device checks the preemption flag before each segment and can
also *kill* a running one (``RunOptions.terminate``, REEF's reset of running kernels, safe
because segments are idempotent).

How the cuts are made (measured in ``../shared/experiments/ort_segments``): the model is
first saved optimised at ORT's *basic* level, so constants are folded and ORT can still
re-lay out convolutions inside each segment; cutting the raw export instead makes Constant
outputs segment inputs and costs +46..94 % for two segments. Per-node costs come from ORT's
own profiler on that model; cuts go near equal shares of the total cost, at the position of
the window that moves the fewest bytes between segments. Models shorter than about 1.5
``segment_ms`` run whole (one segment: full ORT speed, no cut at all). What the cuts cost is
measured where the caller can run the plan (``cut_cost``): a model whose cuts cost more
than ``max_cut_cost`` of its run is cut into fewer, longer segments.

Guarantees: every tensor that crosses a cut has its own arena region (no reuse), a segment
writes only its outputs and never its inputs, so re-running a segment, or running it after
a killed partial run, gives bit-identical results (``reuse_guard`` is unlimited). Shapes and
dtypes in the plan are the ones ORT produced on a probe run, not guesses.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from av_infer.errors import ModelLoadError, UnsupportedModelError
from av_infer.model.onnx_import import bind_inputs, load_model
from av_infer.model.plan import Buffer, Geometry, Kernel, Plan, Tensor

__all__ = ["DEFAULT_MAX_CUT_COST", "SEGMENT_KIND", "SegmentProgram", "compile_segments",
           "fewer_segments", "ort_options"]

#: Kernel kind of a segment launch.
SEGMENT_KIND = "ort_segment"
#: No arena region is ever reused: any c is restorable.
UNLIMITED_GUARD = 1 << 30
#: Default target duration of one segment (ms) for models that are cut: the experiments
#: measured +3 % over the whole model at ~5 ms, +7 % at ~2 ms per segment.
DEFAULT_SEGMENT_MS = 4.0
#: Default ``max_cut_cost`` of :func:`compile_segments`: the cuts may make a model's run this
#: much longer (a fraction) before it is cut into fewer segments (when the caller measures)
DEFAULT_MAX_CUT_COST = 0.05
#: ``max_segment_ms`` of :func:`compile_segments` when not given: this many ``segment_ms``.
#: A cut costs a share ``p`` of the run, a kill throws away half a segment on average, so
#: with ``k`` kills a second of a model of ``T`` seconds the overhead ``(n - 1) p + k T / 2n``
#: is least at ``n = sqrt(k T / 2p)``: for the PaddleOCR detector (T ~30 ms, p ~1.75 %) 3 to
#: 5 segments at 10-30 kills/s, i.e. ~6-10 ms each. At 4x (16 ms) `reef` at 30 Hz lost BE
#: (0.69 against 0.73 of ORT threads, docs/cpu_engine.md "What a cut costs").
MAX_SEGMENT_FACTOR = 2.0
_ALIGN = 64


@dataclass(frozen=True)
class SegmentProgram:
    """One segment: a standalone ONNX model (static shapes) and the plan tensors it reads
    and writes, in the order of its graph inputs and outputs."""

    onnx: bytes
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    est_ms: float
    weight_bytes: int = 0  # bytes of the initializers it holds


def ort_options(threads: int, level: str = "all"):
    """Session options every av_infer ORT session uses: ``threads`` intra-op threads (fixed,
    so results are deterministic), no spinning (an idle pool thread must not steal a core
    from another lane), sequential execution."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


def _ort_error(e: Exception, what: str) -> UnsupportedModelError:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return UnsupportedModelError({}, f"ONNX Runtime refused {what}: {msg}")


def _bound_model(model: onnx.ModelProto,
                 input_shapes: Mapping[str, Sequence[int]] | Sequence[int] | None
                 ) -> tuple[onnx.ModelProto, dict[str, tuple[tuple[int, ...], str]]]:
    """A copy of ``model`` with static input shapes and initializers no longer listed as
    (overridable) inputs, so ORT can fold them."""
    values = bind_inputs(model, input_shapes)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name for i in m.graph.initializer}
    keep = [i for i in m.graph.input if i.name not in inits]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    for i in m.graph.input:
        shape = values[i.name].shape
        tt = i.type.tensor_type
        tt.ClearField("shape")
        for v in shape:
            tt.shape.dim.add().dim_value = int(v)
    spec = {n: (tuple(v.shape), str(v.dtype)) for n, v in values.items()}
    return m, spec


def _basic_optimised(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model as ORT saves it after its basic (graph-level, ONNX-only) optimisations."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="av_infer_seg_") as d:
        out = os.path.join(d, "basic.onnx")
        so = ort_options(1, "basic")
        so.optimized_model_filepath = out
        try:
            ort.InferenceSession(model.SerializeToString(), so,
                                 providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
            raise _ort_error(e, "the model") from e
        m = onnx.load(out)
    for i, n in enumerate(m.graph.node):  # unique names: the profiler reports by name
        n.name = f"n{i}"
    _rename_initializers(m)
    return m


def _rename_initializers(m: onnx.ModelProto) -> None:
    """Give the initializers neutral names. ORT's basic transformers add initializers with
    fixed names (``gemm_input_shape``...); optimising a segment of the saved model again
    makes them add the same name twice and the session fails ("Attempt to replace the
    existing tensor"). Models with subgraphs (If/Loop) keep their names."""
    g = m.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for n in g.node for a in n.attribute):
        return
    keep = {o.name for o in g.output} | {i.name for i in g.input}
    ren = {i.name: f"avi_c{k}" for k, i in enumerate(g.initializer) if i.name not in keep}
    for i in g.initializer:
        i.name = ren.get(i.name, i.name)
    for n in g.node:
        for k, t in enumerate(n.input):
            if t in ren:
                n.input[k] = ren[t]
    for vi in g.value_info:
        vi.name = ren.get(vi.name, vi.name)


def _probe(model: onnx.ModelProto, feeds: dict[str, np.ndarray], profile_runs: int
           ) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict[str, float]]:
    """Run ``model`` with every node output exposed: the exact shape and dtype of each
    tensor, and (``profile_runs`` > 0) each node's mean kernel time in ms."""
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    names = [o for n in m.graph.node for o in n.output if o and o not in have]
    m.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in names)
    with tempfile.TemporaryDirectory(prefix="av_infer_prof_") as d:
        so = ort_options(1, "basic")
        if profile_runs > 0:
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(d, "prof")
        try:
            sess = ort.InferenceSession(m.SerializeToString(), so,
                                        providers=["CPUExecutionProvider"])
            outs = [o.name for o in sess.get_outputs()]
            vals = sess.run(outs, feeds)
            for _ in range(profile_runs):
                sess.run(outs, feeds)
        except Exception as e:  # noqa: BLE001
            raise _ort_error(e, "the model on a probe run") from e
        shapes = {n: (tuple(int(s) for s in np.shape(v)), str(np.asarray(v).dtype))
                  for n, v in zip(outs, vals)}
        cost: dict[str, float] = {}
        if profile_runs > 0:
            with open(sess.end_profiling()) as f:
                events = json.load(f)
            # the first run (warm-up, allocations) is profiled too: skip it
            per_node: dict[str, list[float]] = {}
            for ev in events:
                name = ev.get("name", "")
                if ev.get("cat") == "Node" and name.endswith("_kernel_time"):
                    per_node.setdefault(name[: -len("_kernel_time")], []).append(
                        float(ev.get("dur", 0.0)))
            for node, durs in per_node.items():
                runs = durs[1:] if len(durs) > 1 else durs
                cost[node] = sum(runs) / len(runs) / 1e3
    return shapes, cost


def _whole_ms(model: onnx.ModelProto, feeds: dict[str, np.ndarray], runs: int = 5) -> float:
    """Median time (ms) of the whole model at ORT's full optimisation, one thread."""
    import onnxruntime as ort

    from av_infer.model.check import median_time

    sess = ort.InferenceSession(model.SerializeToString(), ort_options(1, "all"),
                                providers=["CPUExecutionProvider"])
    sess.run(None, feeds)
    return median_time(lambda: sess.run(None, feeds), runs) * 1e3


def _choose_cuts(costs: list[float], cross: list[float], n_seg: int) -> list[int]:
    """Cut positions (node indices where a segment starts, ascending, excluding 0): near
    equal shares of the cost, each at the cheapest crossing of a window of +-25 % of one
    share around its ideal place. ``cross[k]`` is the bytes crossing a cut before node k
    (inf where no cut is possible)."""
    n = len(costs)
    cum = np.concatenate([[0.0], np.cumsum(costs)])
    total = float(cum[-1])
    if n_seg <= 1 or n < 2 or total <= 0:
        return []
    share = total / n_seg
    cuts: list[int] = []
    for q in range(1, n_seg):
        lo_c, hi_c = (q - 0.25) * share, (q + 0.25) * share
        lo = max(int(np.searchsorted(cum, lo_c)), (cuts[-1] + 1) if cuts else 1)
        hi = min(int(np.searchsorted(cum, hi_c, side="right")), n - 1)
        window = [k for k in range(lo, hi + 1) if np.isfinite(cross[k])]
        if not window:
            continue
        cuts.append(min(window, key=lambda k: (cross[k], abs(cum[k] - q * share))))
    return cuts


def compile_segments(
    source: str | os.PathLike | bytes | onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | Sequence[int] | None = None,
    name: str | None = None,
    segment_ms: float | None = DEFAULT_SEGMENT_MS,
    profile_runs: int = 3,
    max_segments: int = 16,
    cut_cost: Callable[[Plan, Plan], float] | None = None,
    max_cut_cost: float = DEFAULT_MAX_CUT_COST,
    max_segment_ms: float | None = None,
) -> Plan:
    """Compile ``source`` into a segment plan (``plan.segments`` holds the programs).

    ``segment_ms``: target duration of one segment on this CPU at one thread; ``None`` or
    ``0`` runs the model whole. ``max_segments`` caps the cuts of long models (a kill makes
    long segments cheap to preempt; only the work a kill throws away grows with them).

    ``cut_cost``: how much longer the cut plan runs than the same model whole, as a fraction
    (``cut_cost(cut, whole)``: 0.12 for 12 % more), measured by the caller on the executor
    that will run it (``kernels.ort_segments.measure_cut_cost``; the executor lives above
    this module). Each cut costs a model-dependent share of its time (on a 2-core VM 1.4-2.2 %
    per cut of the PaddleOCR detector and recogniser, 2-5 % of the sub-millisecond scaled
    zoo models; docs/cpu_engine.md "What a cut costs"), so a fixed ``segment_ms`` over-cuts
    some models. When the cuts measured at
    ``segment_ms`` cost more than ``max_cut_cost``, the model is cut again into as many
    segments as that budget pays for at the measured cost per cut, but never into segments
    longer than ``max_segment_ms`` (default 2 x ``segment_ms``: the work a kill throws away,
    and how often a segment is hit by an RT arrival before it completes, grow with the
    length). ``stats``: ``segments_target`` (the count ``segment_ms`` asked for),
    ``cut_cost`` (measured at the first cut) and ``max_cut_cost``, these two None without
    ``cut_cost``.

    Raises ModelLoadError / UnsupportedModelError / UnboundDimensionError (what ORT or the
    input binding refused, with its message); ValueError for a ``max_cut_cost`` below 0 or a
    ``max_segment_ms`` not above 0.
    """
    if not max_cut_cost >= 0:
        raise ValueError(f"max_cut_cost must be >= 0, got {max_cut_cost!r}")
    if max_segment_ms is not None and not max_segment_ms > 0:
        raise ValueError(f"max_segment_ms must be > 0, got {max_segment_ms!r}")
    model = load_model(source)
    if name is None and isinstance(source, (str, os.PathLike)):
        name = os.path.splitext(os.path.basename(os.fspath(source)))[0]
    name = name or "model"
    bound, in_spec = _bound_model(model, input_shapes)
    basic = _basic_optimised(bound)
    g = basic.graph
    from av_infer.model.check import random_inputs

    feeds = random_inputs(in_spec, seed=0)
    want_profile = bool(segment_ms) and segment_ms > 0
    shapes, node_ms = _probe(basic, feeds, profile_runs if want_profile else 0)
    shapes.update(in_spec)
    nodes = list(g.node)
    graph_inputs = [i.name for i in g.input]
    graph_outputs = [o.name for o in g.output]
    for o in graph_outputs:
        if o not in shapes:
            raise ModelLoadError(f"graph output {o!r} was not produced by ONNX Runtime")
    costs = [node_ms.get(n.name, 0.0) for n in nodes]
    total_ms = 0.0
    if want_profile:  # profiled times are relative (basic level, every output kept):
        total_ms = _whole_ms(basic, feeds)  # scale them to the real whole-model time
        prof = float(sum(costs))
        costs = [c * total_ms / prof for c in costs] if prof > 0 else costs

    # bytes crossing a cut before node k: tensors produced before k (or graph inputs)
    # read at or after k
    inits = {i.name for i in g.initializer}
    produced_at = {t: -1 for t in graph_inputs}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o:
                produced_at[o] = i
    last_use: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for t in n.input:
            if t and t not in inits:
                last_use[t] = i
    for o in graph_outputs:
        last_use[o] = len(nodes)

    diff = np.zeros(len(nodes) + 2)
    for t, p in produced_at.items():
        lu = last_use.get(t, -2)
        if lu > p:  # crosses every cut k with p < k <= lu
            diff[p + 1] += _nbytes(shapes, t)
            diff[min(lu, len(nodes)) + 1] -= _nbytes(shapes, t)
    cross = list(np.cumsum(diff)[: len(nodes)])
    cross[0] = float("inf")
    n_seg = 1
    if want_profile and total_ms >= 1.5 * float(segment_ms):
        n_seg = min(max(1, int(round(total_ms / float(segment_ms)))), int(max_segments))

    info: dict[str, Any] = {"profiled_ms": round(total_ms, 3), "segment_ms": segment_ms or 0.0,
                            "segments_target": n_seg, "cut_cost": None,
                            "max_cut_cost": None if cut_cost is None else float(max_cut_cost)}

    def cut(n: int) -> Plan:
        return _cut_plan(basic, name, nodes, shapes, costs, cross, last_use, n, info)

    plan = cut(n_seg)
    n_made = len(plan.segments)
    if cut_cost is None or n_made < 2:
        return plan
    info["cut_cost"] = round(float(cut_cost(plan, cut(1))), 4)
    n_new = fewer_segments(n_made, info["cut_cost"], max_cut_cost, total_ms,
                           max_segment_ms if max_segment_ms is not None
                           else MAX_SEGMENT_FACTOR * float(segment_ms))
    if n_new < n_made:
        return cut(n_new)
    plan.stats["cut_cost"] = info["cut_cost"]
    return plan


def fewer_segments(n: int, cost: float, budget: float, total_ms: float,
                   max_segment_ms: float) -> int:
    """How many segments a model cut into ``n`` whose cuts measured ``cost`` (a fraction of
    its whole run) should have to keep them within ``budget``: the cuts the budget pays for
    at the measured cost per cut, plus one; at least enough that no segment exceeds
    ``max_segment_ms`` of the model's ``total_ms``; never more than ``n``."""
    if n < 2 or cost <= budget:
        return n
    per_cut = cost / (n - 1)  # > budget / (n - 1): the budget pays for fewer than n - 1
    afford = 1 + int(budget / per_cut) if per_cut > 0 else n  # (0: ``cost`` underflowed)
    floor = max(1, math.ceil(total_ms / max_segment_ms - 1e-9)) if max_segment_ms > 0 else n
    return max(1, min(n, max(afford, floor)))


def _cut_plan(basic: onnx.ModelProto, name: str, nodes: list, shapes: dict,
              costs: list[float], cross: list[float], last_use: dict[str, int],
              n_seg: int, stats: dict[str, Any]) -> Plan:
    """The plan of ``basic`` cut into (at most) ``n_seg`` segments (``_choose_cuts``)."""
    g = basic.graph
    inits = {i.name for i in g.initializer}
    graph_inputs = [i.name for i in g.input]
    graph_outputs = [o.name for o in g.output]
    cuts = _choose_cuts(costs, cross, n_seg)
    bounds = [0, *cuts, len(nodes)]

    programs: list[SegmentProgram] = []
    crossing: list[str] = []  # tensors that live in the arena, in first-use order
    for si, (a, b) in enumerate(zip(bounds, bounds[1:])):
        seg_nodes = nodes[a:b]
        made = {o for n in seg_nodes for o in n.output if o}
        ins: list[str] = []
        for n in seg_nodes:
            for t in n.input:
                if t and t not in made and t not in inits and t not in ins:
                    ins.append(t)
        outs = [t for n in seg_nodes for t in n.output
                if t and (last_use.get(t, -1) >= b or t in graph_outputs)]
        if len(bounds) == 2:  # whole model: the exact graph signature
            ins, outs = list(graph_inputs), list(graph_outputs)
        used_inits = {t for n in seg_nodes for t in n.input if t in inits}
        sub = helper.make_graph(
            seg_nodes, f"{name}_seg{si}",
            [helper.make_tensor_value_info(t, _elem(shapes[t][1]), shapes[t][0]) for t in ins],
            [helper.make_tensor_value_info(t, _elem(shapes[t][1]), shapes[t][0])
             for t in outs],
            [i for i in g.initializer if i.name in used_inits],
        )
        sm = helper.make_model(sub, opset_imports=list(basic.opset_import),
                               producer_name="av_infer.segments")
        sm.ir_version = basic.ir_version
        wb = sum(int(np.prod(i.dims, dtype=np.int64)) * _itemsize(i.data_type)
                 for i in sub.initializer)
        programs.append(SegmentProgram(sm.SerializeToString(), tuple(ins), tuple(outs),
                                       float(sum(costs[a:b])), wb))
        for t in (*ins, *outs):
            if t not in crossing:
                crossing.append(t)
    for t in (*graph_inputs, *graph_outputs):
        if t not in crossing:
            crossing.append(t)

    # arena: one region per crossing tensor, never reused
    tensors: dict[str, Tensor] = {}
    buffers: dict[int, Buffer] = {}
    off = 0
    for bid, t in enumerate(crossing):
        shp, dt = shapes[t]
        nb = int(np.prod(shp, dtype=np.int64)) * np.dtype(dt).itemsize
        role = ("input" if t in graph_inputs else "output" if t in graph_outputs
                else "activation")
        buffers[bid] = Buffer(bid, nb, role, off)
        tensors[t] = Tensor(t, bid, tuple(shp), dt)
        off += -(-max(nb, 1) // _ALIGN) * _ALIGN
    one = Geometry((1, 1, 1), (1, 1, 1))
    kernels = [
        Kernel(i, SEGMENT_KIND, f"{name}/seg{i}", p.inputs, p.outputs,
               {"segment": i, "nodes": [bounds[i], bounds[i + 1]], "est_ms": p.est_ms},
               one, 0, int(sum(_nbytes(shapes, t) for t in (*p.inputs, *p.outputs))))
        for i, p in enumerate(programs)
    ]
    plan = Plan(name, kernels, tensors, buffers, list(graph_inputs), list(graph_outputs),
                {}, off, UNLIMITED_GUARD,
                {"engine": "ort", "segments": len(programs), "onnx_nodes": len(nodes),
                 **stats, "crossing_bytes": [int(cross[c]) for c in cuts]},
                segments=programs)
    return plan


def _nbytes(shapes: Mapping[str, tuple[tuple[int, ...], str]], t: str) -> float:
    """Bytes of tensor ``t`` (inf for one the probe did not see: never cut there)."""
    if t not in shapes:
        return float("inf")
    shp, dt = shapes[t]
    return float(int(np.prod(shp, dtype=np.int64)) * np.dtype(dt).itemsize)


def _itemsize(elem_type: int) -> int:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize


def _elem(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
