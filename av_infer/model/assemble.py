"""Plan assembly: a lowered kernel-node list -> a :class:`~av_infer.model.plan.Plan`.

What happens here, after lowering (``lower``) and the fusion passes (``passes``):
dead-node elimination; output materialisation (every graph output gets its own region,
``copy`` kernels where it would alias an input, a constant or another output); one buffer
per root tensor (views share their base's); each kernel's launch geometry
(:func:`~av_infer.model.geometry.geometry_for`) and cost (``cost``); buffer liveness and
the arena offsets under the idempotency guard (``memplan.plan_memory``); weight-store
offsets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from av_infer.errors import ModelLoadError
from av_infer.model.cost import bytes_for, flops_for
from av_infer.model.geometry import geometry_for
from av_infer.model.graph import Graph, KNode
from av_infer.model.plan import Buffer, Kernel, Plan, Tensor

__all__ = ["build_plan", "eliminate_dead", "materialise_outputs"]


def _root_map(knodes: Sequence[KNode]) -> dict[str, str]:
    root: dict[str, str] = {}
    for k in knodes:
        if k.kind == "view":
            src = k.inputs[0]
            root[k.outputs[0]] = root.get(src, src)
    return root


def _rename(knodes: list[KNode], old: str, new: str) -> None:
    for k in knodes:
        k.inputs = [new if t == old else t for t in k.inputs]
        k.outputs = [new if t == old else t for t in k.outputs]
        if k.args.get("bias") == old:
            k.args["bias"] = new
        if k.args.get("epilogue"):
            k.args["epilogue"] = [[s[0], new if s[0] == "add" and s[1] == old else s[1]]
                                  for s in k.args["epilogue"]]


def materialise_outputs(g: Graph, knodes: list[KNode]) -> tuple[list[KNode], set[str]]:
    """Give every graph output its own region: ``copy`` kernels where it would alias an
    input, a constant or another output. Returns the nodes and the claimed root tensors.

    A graph input listed as an output is renamed ``<name>:out`` (a tensor has one name)."""
    from av_infer.model.graph import Value

    claimed: set[str] = set()
    for pos, o in enumerate(list(g.outputs)):
        root = _root_map(knodes)
        r = root.get(o, o)
        if r not in g.inputs and r not in g.consts and r not in claimed:
            claimed.add(r)
            continue
        if o in g.inputs:
            src = o
            o = g.fresh(f"{o}:out")
            g.outputs[pos] = o
            g.values[o] = g.values[src]
        elif o in g.consts:
            src = g.fresh(o)
            g.consts[src] = g.consts.pop(o)
            g.values[o] = Value(tuple(g.consts[src].shape), str(g.consts[src].dtype))
            for k in knodes:
                k.inputs = [src if t == o else t for t in k.inputs]
                if k.args.get("bias") == o:
                    k.args["bias"] = src
        else:
            src = g.fresh(o)
            g.values[src] = g.values[o]
            _rename(knodes, o, src)
        knodes.append(KNode("copy", f"{o}/copy", [src], [o], {}))
        claimed.add(o)
    return knodes, claimed


def eliminate_dead(g: Graph, knodes: list[KNode]) -> list[KNode]:
    """Drop nodes none of whose outputs is read (transitively) or is a graph output."""
    live = set(g.outputs)
    keep: list[KNode] = []
    for k in reversed(knodes):
        if any(o in live for o in k.outputs):
            keep.append(k)
            live.update(k.reads())
            for s in k.args.get("epilogue") or []:
                if s[0] == "add":
                    live.add(s[1])
    return keep[::-1]


def build_plan(g: Graph, knodes: list[KNode], reuse_guard: int) -> Plan:
    """KNodes -> Plan: tensors, buffers (memory-planned), weights, kernels with geometry."""
    from av_infer.model.memplan import plan_memory

    knodes, claimed = materialise_outputs(g, knodes)
    root = _root_map(knodes)
    kernels_kn = [k for k in knodes if k.kind != "view"]

    # buffers: one per root tensor
    tensors: dict[str, Tensor] = {}
    buffers: dict[int, Buffer] = {}
    weights: dict[int, np.ndarray] = {}
    buf_of_root: dict[str, int] = {}
    roles: dict[str, str] = {}
    read_consts: list[str] = []
    for k in kernels_kn:
        for t in k.reads():
            r = root.get(t, t)
            if r in g.consts and r not in read_consts:
                read_consts.append(r)

    def new_root(r: str, role: str) -> int:
        bid = len(buf_of_root)
        buf_of_root[r] = bid
        roles[r] = role
        return bid

    for i in g.inputs:
        new_root(i, "input")
    for o in g.outputs:
        r = root.get(o, o)
        if r not in buf_of_root:
            new_root(r, "output")
    for k in kernels_kn:
        for o in k.outputs:
            if o not in buf_of_root:
                new_root(o, "activation")
    for c in read_consts:
        new_root(c, "weight")

    def nbytes_of(name: str) -> int:
        shp, dt = g.shape(name), g.dtype(name)
        return int(np.prod(shp, dtype=np.int64)) * np.dtype(dt).itemsize

    # tensors (roots and views)
    all_names = list(buf_of_root)
    for k in knodes:
        if k.kind == "view":
            all_names.append(k.outputs[0])
    for t in all_names:
        r = root.get(t, t)
        if r not in buf_of_root:
            continue
        tensors[t] = Tensor(t, buf_of_root[r], tuple(int(d) for d in g.shape(t)), g.dtype(t))
        if tensors[t].nbytes != nbytes_of(r):
            raise ModelLoadError(f"view {t!r} of {r!r} changes the byte size")

    # kernels
    kernels: list[Kernel] = []
    for idx, k in enumerate(kernels_kn):
        ins = [g.shape(t) for t in k.inputs]
        outs = [g.shape(t) for t in k.outputs]
        moved = bytes_for(k.reads(), k.outputs, nbytes_of)
        kernels.append(Kernel(
            index=idx, kind=k.kind, name=k.name, inputs=tuple(k.inputs),
            outputs=tuple(k.outputs), args=k.args,
            geometry=geometry_for(k.kind, ins, outs, k.args),
            flops=int(flops_for(k.kind, ins, outs, k.args)), bytes_moved=int(moved),
        ))

    # memory plan
    sizes = {buf_of_root[r]: nbytes_of(r) for r in buf_of_root}
    role_by_id = {buf_of_root[r]: roles[r] for r in buf_of_root}
    first_def: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for k in kernels:
        rd = [root.get(t, t) for t in KNode(k.kind, k.name, list(k.inputs), [], k.args).reads()]
        for r in rd:
            if r in buf_of_root:
                b = buf_of_root[r]
                last_use[b] = max(last_use.get(b, -1), k.index)
        for o in k.outputs:
            b = buf_of_root[root.get(o, o)]
            first_def.setdefault(b, k.index)
            last_use[b] = max(last_use.get(b, -1), k.index)
    offsets, arena = plan_memory(sizes, role_by_id, first_def, last_use, reuse_guard)
    woff = 0
    for r, bid in buf_of_root.items():
        role = roles[r]
        if role == "weight":
            arr = np.asarray(g.consts[r], order="C")
            weights[bid] = arr
            sizes[bid] = arr.nbytes
            buffers[bid] = Buffer(bid, arr.nbytes, "weight", woff)
            woff += -(-max(arr.nbytes, 1) // 64) * 64
        else:
            buffers[bid] = Buffer(bid, sizes[bid], role, offsets[bid])  # type: ignore[arg-type]
    plan = Plan(
        name=g.name, kernels=kernels, tensors=tensors, buffers=buffers,
        inputs=list(g.inputs), outputs=list(g.outputs), weights=weights,
        arena_bytes=arena, reuse_guard=reuse_guard,
    )
    return plan
