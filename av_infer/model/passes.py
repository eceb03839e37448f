"""Fusion passes on lowered kernel nodes (run when ``optimize=True``).

* :func:`fold_batchnorm`: BatchNormalization after conv / conv_transpose / gemm with a
  constant weight is folded into new weights and bias (inference-time BN is affine).
* :func:`fuse_epilogues`: bias adds (constant, per output channel), one residual add of a
  same-shape tensor, and activations become the producer's ``bias`` / ``epilogue``. The
  fused kernel takes the position of the last fused node, so a residual computed after the
  conv in graph order is still ready. This is also what turns MatMul + Add(const) into a
  gemm with bias.
* :func:`merge_unary`: chains of unary kernels become one kernel with several ops.
* :func:`fuse_gelu`: x * 0.5 * (1 + erf(x / sqrt 2)) -> unary gelu_erf.

Every pass requires the intermediate tensor to have exactly one reader and not to be a
graph output, so no observable tensor changes.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from av_infer.model.graph import Graph, KNode
from av_infer.model.plan import ACTIVATIONS

_FUSABLE = ("conv", "conv_transpose", "gemm")


def _readers(g: Graph, knodes: list[KNode]) -> Counter[str]:
    c: Counter[str] = Counter()
    for k in knodes:
        for t in k.reads():
            c[t] += 1
        for s in k.args.get("epilogue") or []:
            if s[0] == "add" and s[1] not in k.inputs:
                c[s[1]] += 1
    for o in g.outputs:
        c[o] += 1
    return c


def _producers(knodes: list[KNode]) -> dict[str, int]:
    return {o: i for i, k in enumerate(knodes) for o in k.outputs}


def _is_float(g: Graph, t: str) -> bool:
    return np.dtype(g.dtype(t)).kind == "f"


def fold_batchnorm(g: Graph, knodes: list[KNode]) -> tuple[list[KNode], int]:
    """Fold batchnorm kernels into a producing conv/conv_transpose/gemm (see module doc)."""
    folded = 0
    while True:
        readers = _readers(g, knodes)
        prod = _producers(knodes)
        done = False
        for bi, bn in enumerate(knodes):
            if bn.kind != "batchnorm":
                continue
            x = bn.inputs[0]
            params = [g.consts.get(t) for t in bn.inputs[1:5]]
            pi = prod.get(x)
            if pi is None or readers[x] != 1 or any(p is None for p in params):
                continue
            p = knodes[pi]
            if p.kind not in _FUSABLE or p.args.get("epilogue") or len(p.inputs) > 2:
                continue
            w = g.consts.get(p.inputs[1])
            if w is None or not _is_float(g, p.inputs[1]):
                continue
            gamma, beta, mean, var = (np.asarray(a, np.float64) for a in params)
            scale = gamma / np.sqrt(var + bn.args["epsilon"])
            shift = beta - mean * scale
            nc = scale.shape[0]
            bias_name = p.args.get("bias")
            bias = None if bias_name is None else g.consts.get(bias_name)
            if bias_name is not None and bias is None:
                continue
            ys = g.shape(x)
            if p.kind == "conv":
                if ys[1] != nc:
                    continue
                w2 = w * scale.reshape(-1, *([1] * (w.ndim - 1)))
                b2 = (0.0 if bias is None else bias) * scale + shift
            elif p.kind == "conv_transpose":
                grp = int(p.args["group"])
                if ys[1] != nc:
                    continue
                cg = w.shape[0] // grp
                wr = w.reshape(grp, cg, w.shape[1], *w.shape[2:])
                sc = scale.reshape(grp, 1, w.shape[1], *([1] * (w.ndim - 2)))
                w2 = (wr * sc).reshape(w.shape)
                b2 = (0.0 if bias is None else bias) * scale + shift
            else:  # gemm: BN over axis 1 of a 2-D output == output columns
                if len(ys) != 2 or ys[1] != nc or w.ndim != 2:
                    continue
                w2 = w * (scale[:, None] if p.args.get("trans_b") else scale[None, :])
                beta_g = float(p.args.get("beta", 1.0))
                b2 = (0.0 if bias is None else beta_g * bias) * scale + shift
                p.args["beta"] = 1.0
            dt = np.dtype(g.dtype(p.inputs[1]))
            p.inputs[1] = g.new_const(f"{p.inputs[1]}_bn", np.asarray(w2, dt))
            p.args["bias"] = g.new_const(f"{bn.name}_bias", np.asarray(b2, dt).reshape(-1))
            p.outputs = [bn.outputs[0]]
            del knodes[bi]
            folded += 1
            done = True
            break
        if not done:
            return knodes, folded


def _conv_bias_vector(c: np.ndarray, ys: tuple[int, ...]) -> np.ndarray | None:
    """A constant added to a conv output as a per-channel vector, or None."""
    rank = len(ys)
    if c.ndim > rank:
        return None
    shp = (1,) * (rank - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(shp) if i != 1) or shp[1] not in (1, ys[1]):
        return None
    return np.broadcast_to(c.reshape(shp), (1, ys[1]) + (1,) * (rank - 2)).reshape(ys[1])


def fuse_epilogues(g: Graph, knodes: list[KNode]) -> tuple[list[KNode], int]:
    """Fuse bias / residual add / activations into conv and gemm kernels."""
    fused = 0
    while True:
        readers = _readers(g, knodes)
        prod = _producers(knodes)
        hit = None
        for ci, c in enumerate(knodes):
            if c.kind == "unary" and all(op[0] in ACTIVATIONS for op in c.args["ops"]):
                pass
            elif c.kind == "binary" and c.args["op"] in ("add", "sub", "mul", "div"):
                pass
            else:
                continue
            for pos, x in enumerate(c.inputs[:2]):
                pi = prod.get(x)
                if pi is None or readers[x] != 1 or knodes[pi].kind not in _FUSABLE:
                    continue
                if not _is_float(g, x) or g.shape(c.outputs[0]) != g.shape(x):
                    continue
                p = knodes[pi]
                if _try_fuse(g, p, c, pos):
                    hit = (pi, ci)
                    break
            if hit:
                break
        if hit is None:
            return knodes, fused
        pi, ci = hit
        p = knodes[pi]
        p.outputs = list(knodes[ci].outputs)
        knodes[ci] = p
        del knodes[pi]
        fused += 1


def _try_fuse(g: Graph, p: KNode, c: KNode, pos: int) -> bool:
    """Merge consumer c (input ``pos`` is p's output) into p's args; False if impossible."""
    epi = p.args.setdefault("epilogue", [])
    if c.kind == "unary":
        epi.extend([list(op) for op in c.args["ops"]])
        return True
    other = c.inputs[1 - pos]
    op = c.args["op"]
    if op == "sub" and pos != 0:
        return False  # other - y: not a bias
    y = p.outputs[0]
    ys = g.shape(y)
    oc = g.consts.get(other)
    if op in ("mul", "div"):
        if op == "div" and pos != 0:
            return False
        return oc is not None and _fold_scale(g, p, oc, op == "div")
    if oc is not None and not epi and np.dtype(oc.dtype).kind == "f":
        oc = -oc if op == "sub" else oc
        old = p.args.get("bias")
        if old is not None and old not in g.consts:
            return False
        if p.kind in ("conv", "conv_transpose"):
            vec = _conv_bias_vector(oc, ys)
            if vec is None:
                return False
            new = vec if old is None else g.consts[old] + vec
        else:
            try:
                if np.broadcast_shapes(oc.shape, ys) != tuple(ys):
                    return False
            except ValueError:
                return False
            beta = float(p.args.get("beta", 1.0))
            new = oc if old is None else beta * g.consts[old] + oc
            if np.broadcast_shapes(np.shape(new), ys) != tuple(ys):
                return False
            p.args["beta"] = 1.0
        p.args["bias"] = g.new_const(f"{c.name}_bias", np.asarray(new, g.dtype(y)))
        return True
    if op != "add" or oc is not None or p.kind == "conv_transpose":
        return False
    if len(p.inputs) > 2 or g.shape(other) != ys or g.dtype(other) != g.dtype(y):
        return False
    epi.append(["add", other])
    p.inputs.append(other)
    return True


def _fold_scale(g: Graph, p: KNode, c: np.ndarray, divide: bool) -> bool:
    """y * c with c constant per output channel: scale the weights (and bias) instead."""
    if p.args.get("epilogue") or len(p.inputs) > 2 or np.dtype(c.dtype).kind != "f":
        return False
    w = g.consts.get(p.inputs[1])
    bname = p.args.get("bias")
    bias = None if bname is None else g.consts.get(bname)
    if w is None or (bname is not None and bias is None):
        return False
    ys = g.shape(p.outputs[0])
    if p.kind in ("conv", "conv_transpose"):
        vec = _conv_bias_vector(c, ys)
    else:
        if c.ndim > len(ys) or any(d != 1 for d in c.shape[:-1]) or w.ndim != 2:
            return False
        vec = np.broadcast_to(c.reshape(-1), (ys[-1],)) if c.size in (1, ys[-1]) else None
    if vec is None:
        return False
    vec = vec.astype(np.float64)
    if divide:
        vec = 1.0 / vec
    if p.kind == "conv":
        w2 = w * vec.reshape(-1, *([1] * (w.ndim - 1)))
    elif p.kind == "conv_transpose":
        grp = int(p.args["group"])
        sc = vec.reshape(grp, 1, w.shape[1], *([1] * (w.ndim - 2)))
        w2 = (w.reshape(grp, w.shape[0] // grp, *w.shape[1:]) * sc).reshape(w.shape)
    else:
        w2 = w * (vec[:, None] if p.args.get("trans_b") else vec[None, :])
    dt = np.dtype(g.dtype(p.inputs[1]))
    p.inputs[1] = g.new_const(f"{p.inputs[1]}_scaled", np.asarray(w2, dt))
    if bias is not None:
        b2 = bias * (float(p.args.get("beta", 1.0)) if p.kind == "gemm" else 1.0)
        p.args["bias"] = g.new_const(f"{bname}_scaled", np.asarray(b2 * vec, dt))
        if p.kind == "gemm":
            p.args["beta"] = 1.0
    return True


def merge_unary(g: Graph, knodes: list[KNode]) -> tuple[list[KNode], int]:
    """Merge chains of unary kernels into one kernel (ops applied in order)."""
    merged = 0
    while True:
        readers = _readers(g, knodes)
        prod = _producers(knodes)
        hit = None
        for ci, c in enumerate(knodes):
            if c.kind != "unary":
                continue
            pi = prod.get(c.inputs[0])
            if pi is not None and knodes[pi].kind == "unary" and readers[c.inputs[0]] == 1:
                if g.dtype(c.inputs[0]) == g.dtype(c.outputs[0]):
                    hit = (pi, ci)
                    break
        if hit is None:
            return knodes, merged
        pi, ci = hit
        p, c = knodes[pi], knodes[ci]
        c.args["ops"] = [list(o) for o in p.args["ops"]] + [list(o) for o in c.args["ops"]]
        c.inputs = list(p.inputs)
        del knodes[pi]
        merged += 1


def _scalar(g: Graph, t: str) -> float | None:
    c = g.consts.get(t)
    if c is None or c.size != 1:
        return None
    return float(c.reshape(-1)[0])


def fuse_gelu(g: Graph, knodes: list[KNode]) -> tuple[list[KNode], int]:
    """x * 0.5 * (1 + erf(x / sqrt2)) (any association of the final muls) -> gelu_erf."""
    n_fused = 0
    while True:
        readers = _readers(g, knodes)
        hit = None
        for di, d in enumerate(knodes):
            # d: x / sqrt2  (div by 1.4142 or mul by 0.7071)
            if d.kind != "binary" or d.args["op"] not in ("div", "mul"):
                continue
            s = _scalar(g, d.inputs[1])
            if s is None:
                continue
            if not np.isclose(s if d.args["op"] == "div" else 1.0 / s if s else 0, np.sqrt(2),
                              rtol=1e-4):
                continue
            x = d.inputs[0]
            chain = _follow(knodes, d.outputs[0], readers)
            if chain is None:
                continue
            ei, ai, m1i, m2i = chain
            e, a, m1, m2 = (knodes[i] for i in chain)
            if e.kind != "unary" or e.args["ops"] != [["erf", {}]]:
                continue
            if a.kind != "binary" or a.args["op"] != "add":
                continue
            one = [t for t in a.inputs if t != e.outputs[0]]
            if len(one) != 1 or _scalar(g, one[0]) != 1.0:
                continue
            # m1, m2: the two muls combining (1+erf), x and 0.5 in any order
            ins = [t for t in m1.inputs + m2.inputs if t not in (a.outputs[0], m1.outputs[0])]
            halves = [t for t in ins if _scalar(g, t) == 0.5]
            xs = [t for t in ins if t == x]
            if len(ins) != 2 or len(halves) != 1 or len(xs) != 1:
                continue
            if m1.kind != "binary" or m2.kind != "binary" or "mul" != m1.args["op"] or \
                    m2.args["op"] != "mul":
                continue
            hit = (di, ei, ai, m1i, m2i, x)
            break
        if hit is None:
            return knodes, n_fused
        di, ei, ai, m1i, m2i, x = hit
        out = knodes[m2i].outputs[0]
        g_node = KNode("unary", knodes[m2i].name, [x], [out], {"ops": [["gelu_erf", {}]]})
        knodes[m2i] = g_node
        for i in sorted((di, ei, ai, m1i), reverse=True):
            del knodes[i]
        n_fused += 1


def _follow(knodes: list[KNode], t: str, readers: Counter[str]) -> tuple[int, ...] | None:
    """Indices of the 4 single-reader nodes following tensor t in the GELU pattern."""
    chain = []
    cur = t
    for _ in range(4):
        users = [i for i, k in enumerate(knodes) if cur in k.inputs]
        if len(users) != 1 or readers[cur] != 1:
            return None
        chain.append(users[0])
        cur = knodes[users[0]].outputs[0]
    return tuple(chain)
