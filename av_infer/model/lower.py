"""Lowering: ONNX nodes (static shapes) -> kernel nodes (``KNode``) with normalised args.

Normalisation rules (so every device implements one convention):
negative axes made positive; Slice starts/ends clamped as numpy does; conv/pool pads as
(top, left, bottom, right) with ``auto_pad`` resolved; 1-D conv/pool lowered as 2-D with
H=1 through views; MatMul as ``gemm`` (1-D operands through views); opset<13 Softmax as
views around a 2-D softmax; pure reshapes (Reshape, Flatten, Squeeze, Unsqueeze,
Identity, Dropout, no-op Transpose/Slice/Pad/Cast) as ``view`` nodes (no kernel).

What comes after lowering lives elsewhere: fusion (``passes``), plan assembly
(``assemble``), launch geometry (``geometry``), the cost model (``cost``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from av_infer.errors import UnsupportedModelError
from av_infer.model.graph import Graph, KNode, Node

F32_MAX = float(np.finfo(np.float32).max)


class _Unsupported(Exception):
    """A supported op type used with attributes/inputs this compiler cannot lower."""


UNARY = {
    "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "HardSwish": "hard_swish",
    "Erf": "erf", "Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Neg": "neg", "Abs": "abs",
    "Reciprocal": "reciprocal", "Not": "not", "Floor": "floor", "Ceil": "ceil",
    "Round": "round", "Sign": "sign", "Sin": "sin", "Cos": "cos", "Softsign": "softsign",
}
BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Max": "max",
    "Min": "min", "Sum": "add", "Mod": "mod", "Equal": "equal", "Less": "less",
    "LessOrEqual": "less_equal", "Greater": "greater", "GreaterOrEqual": "greater_equal",
    "And": "and", "Or": "or", "Xor": "xor",
}
VIEW_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"}


def _norm_axis(a: int, rank: int) -> int:
    a = int(a)
    if a < 0:
        a += rank
    if not 0 <= a < max(rank, 1):
        raise _Unsupported(f"axis {a} out of range for rank {rank}")
    return a


def resolve_pads(
    auto_pad: str, in_sp: Sequence[int], k: Sequence[int], s: Sequence[int],
    d: Sequence[int], pads: Sequence[int] | None,
) -> list[int]:
    """Explicit ONNX-order pads (begins..., ends...) for conv/pool, auto_pad resolved."""
    nd = len(in_sp)
    auto_pad = auto_pad or "NOTSET"
    if auto_pad == "NOTSET":
        return [int(p) for p in pads] if pads else [0] * (2 * nd)
    if auto_pad == "VALID":
        return [0] * (2 * nd)
    begins, ends = [], []
    for i in range(nd):
        out = -(-in_sp[i] // s[i])
        total = max((out - 1) * s[i] + (k[i] - 1) * d[i] + 1 - in_sp[i], 0)
        lo = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        begins.append(lo)
        ends.append(total - lo)
    return begins + ends


def _to4(pads: Sequence[int]) -> list[int]:
    """ONNX 2-D pads (x1_b, x2_b, x1_e, x2_e) are already (top, left, bottom, right)."""
    return [int(p) for p in pads]


class Lowerer:
    """Turns each ONNX node of a Graph into KNodes; collects every unsupported use."""

    def __init__(self, g: Graph):
        self.g = g
        self.out: list[KNode] = []
        self.unsupported: dict[str, list[str]] = {}
        self.details: list[str] = []

    # -- helpers -----------------------------------------------------------------------
    def shape(self, t: str) -> tuple[int, ...]:
        return self.g.shape(t)

    def dtype(self, t: str) -> str:
        return self.g.dtype(t)

    def const(self, t: str | None) -> np.ndarray | None:
        return self.g.consts.get(t) if t else None

    def emit(self, kind: str, name: str, inputs: Sequence[str], outputs: Sequence[str],
             **args: Any) -> KNode:
        k = KNode(kind, name, list(inputs), list(outputs), args)
        self.out.append(k)
        return k

    def view(self, name: str, src: str, dst: str) -> None:
        self.emit("view", name, [src], [dst])

    def inp(self, n: Node, i: int) -> str | None:
        return n.inputs[i] if i < len(n.inputs) and n.inputs[i] else None

    def param(self, n: Node, attr: str, idx: int, default: Any = None) -> Any:
        """A parameter that is an attribute in old opsets and an input in newer ones."""
        t = self.inp(n, idx)
        if t is not None:
            c = self.const(t)
            if c is None:
                raise _Unsupported(f"input {idx} ({attr}) must be constant")
            return c.tolist()
        return n.attrs.get(attr, default)

    def used(self, t: str | None) -> bool:
        if not t:
            return False
        if t in self.g.outputs:
            return True
        return any(t in m.inputs for m in self.g.nodes)

    # -- driver ------------------------------------------------------------------------
    def run(self) -> list[KNode]:
        for n in self.g.nodes:
            fn: Callable[[Node], None] | None = getattr(self, f"op_{n.op}", None)
            if n.op in UNARY:
                fn = self.op_unary
            elif n.op in BINARY:
                fn = self.op_binary
            elif n.op in VIEW_OPS:
                fn = self.op_view
            if fn is None:
                self.unsupported.setdefault(n.op, []).append(n.name)
                continue
            mark = len(self.out)
            try:
                fn(n)
            except _Unsupported as e:
                del self.out[mark:]
                self.unsupported.setdefault(n.op, []).append(n.name)
                self.details.append(f"{n.name}: {e}")
        if self.unsupported:
            raise UnsupportedModelError(self.unsupported, "; ".join(self.details))
        return self.out

    # -- elementwise -------------------------------------------------------------------
    def op_unary(self, n: Node) -> None:
        self.emit("unary", n.name, [n.inputs[0]], [n.outputs[0]], ops=[[UNARY[n.op], {}]])

    def _act(self, n: Node, act: str, params: dict[str, Any]) -> None:
        self.emit("unary", n.name, [n.inputs[0]], [n.outputs[0]], ops=[[act, params]])

    def op_LeakyRelu(self, n: Node) -> None:
        self._act(n, "leaky_relu", {"alpha": float(n.attrs.get("alpha", 0.01))})

    def op_HardSigmoid(self, n: Node) -> None:
        self._act(n, "hard_sigmoid", {"alpha": float(n.attrs.get("alpha", 0.2)),
                                      "beta": float(n.attrs.get("beta", 0.5))})

    def op_Elu(self, n: Node) -> None:
        self._act(n, "elu", {"alpha": float(n.attrs.get("alpha", 1.0))})

    def op_Selu(self, n: Node) -> None:
        self._act(n, "selu", {"alpha": float(n.attrs.get("alpha", 1.67326319217681884765625)),
                              "gamma": float(n.attrs.get("gamma", 1.05070102214813232421875))})

    def op_Softplus(self, n: Node) -> None:
        self._act(n, "softplus", {})

    def op_Gelu(self, n: Node) -> None:
        approx = n.attrs.get("approximate", "none")
        self._act(n, "gelu_tanh" if approx == "tanh" else "gelu_erf", {})

    def op_Clip(self, n: Node) -> None:
        if self.g.opset < 11:
            lo, hi = n.attrs.get("min", -F32_MAX), n.attrs.get("max", F32_MAX)
        else:
            lo = self.param(n, "min", 1, -F32_MAX)
            hi = self.param(n, "max", 2, F32_MAX)
        lo = max(float(lo), -F32_MAX)
        hi = min(float(hi), F32_MAX)
        self._act(n, "clip", {"min": lo, "max": hi})

    def op_binary(self, n: Node) -> None:
        op = BINARY[n.op]
        ins = [i for i in n.inputs if i]
        if len(ins) == 1:
            self.view(n.name, ins[0], n.outputs[0])
            return
        acc = ins[0]
        for j, b in enumerate(ins[1:]):
            last = j == len(ins) - 2
            if last:
                dst = n.outputs[0]
            else:
                shp = np.broadcast_shapes(self.shape(acc), self.shape(b))
                dst = self.g.new_value(n.outputs[0], shp, self.dtype(n.outputs[0]))
            self.emit("binary", n.name if last else f"{n.name}/{j}", [acc, b], [dst], op=op)
            acc = dst

    op_Max = op_Min = op_Sum = op_binary

    def op_Where(self, n: Node) -> None:
        self.emit("where", n.name, n.inputs[:3], [n.outputs[0]])

    def op_Cast(self, n: Node) -> None:
        x, y = n.inputs[0], n.outputs[0]
        if self.dtype(x) == self.dtype(y):
            self.view(n.name, x, y)
        else:
            self.emit("cast", n.name, [x], [y], to=self.dtype(y))

    def op_Expand(self, n: Node) -> None:
        x, y = n.inputs[0], n.outputs[0]
        xs, ys = self.shape(x), self.shape(y)
        if xs == ys:
            self.view(n.name, x, y)
            return
        pad = (1,) * (len(ys) - len(xs)) + tuple(xs)
        zshape = tuple(1 if p == d else d for p, d in zip(pad, ys))
        dt = np.dtype(self.dtype(y))
        z = self.g.new_const(f"{n.name}_zeros", np.zeros(zshape, dt))
        self.emit("binary", n.name, [x, z], [y], op="or" if dt == np.bool_ else "add")

    # -- views -------------------------------------------------------------------------
    def op_view(self, n: Node) -> None:
        if n.op == "Dropout" and len(n.outputs) > 1 and self.used(n.outputs[1]):
            raise _Unsupported("Dropout mask output is used")
        self.view(n.name, n.inputs[0], n.outputs[0])

    def op_Transpose(self, n: Node) -> None:
        x, y = n.inputs[0], n.outputs[0]
        xs = self.shape(x)
        perm = [_norm_axis(p, len(xs)) for p in n.attrs.get("perm", range(len(xs))[::-1])]
        moved = [p for p in perm if xs[p] != 1]
        if moved == sorted(moved):  # only unit dims move: memory order unchanged
            self.view(n.name, x, y)
        else:
            self.emit("transpose", n.name, [x], [y], perm=perm)

    # -- conv / gemm -------------------------------------------------------------------
    def _conv_common(self, n: Node) -> tuple[str, str, tuple[int, ...], tuple[int, ...]]:
        x, w = n.inputs[0], n.inputs[1]
        xs, ws = self.shape(x), self.shape(w)
        if len(xs) not in (3, 4):
            raise _Unsupported(f"{len(xs) - 2}-D {n.op} (only 1-D and 2-D)")
        return x, w, xs, ws

    def _as_2d(self, n: Node, x: str, w: str, y: str) -> tuple[str, str, str]:
        """1-D conv -> 2-D with H=1 (views on x, y; reshaped or viewed weight)."""
        xs, ws, ys = self.shape(x), self.shape(w), self.shape(y)
        x4 = self.g.new_value(x, (xs[0], xs[1], 1, xs[2]), self.dtype(x))
        self.view(f"{n.name}/x2d", x, x4)
        wc = self.const(w)
        if wc is not None:
            w4 = self.g.new_const(w, wc.reshape(ws[0], ws[1], 1, ws[2]))
        else:
            w4 = self.g.new_value(w, (ws[0], ws[1], 1, ws[2]), self.dtype(w))
            self.view(f"{n.name}/w2d", w, w4)
        y4 = self.g.new_value(y, (ys[0], ys[1], 1, ys[2]), self.dtype(y))
        return x4, w4, y4

    def op_Conv(self, n: Node) -> None:
        x, w, xs, ws = self._conv_common(n)
        y = n.outputs[0]
        nd = len(xs) - 2
        k = list(n.attrs.get("kernel_shape", ws[2:]))
        s = list(n.attrs.get("strides", [1] * nd))
        d = list(n.attrs.get("dilations", [1] * nd))
        pads = resolve_pads(n.attrs.get("auto_pad", "NOTSET"), xs[2:], k, s, d,
                            n.attrs.get("pads"))
        if nd == 1:
            x, w, y4 = self._as_2d(n, x, w, y)
            s, d, k = [1] + s, [1] + d, [1] + k
            pads = [0, pads[0], 0, pads[1]]
        else:
            y4 = y
        self.emit("conv", n.name, [x, w], [y4], strides=s, pads=_to4(pads), dilations=d,
                  group=int(n.attrs.get("group", 1)), bias=self.inp(n, 2), epilogue=[])
        if y4 != y:
            self.view(f"{n.name}/y1d", y4, y)

    def op_ConvTranspose(self, n: Node) -> None:
        x, w, xs, ws = self._conv_common(n)
        y = n.outputs[0]
        ys = self.shape(y)
        nd = len(xs) - 2
        k = list(n.attrs.get("kernel_shape", ws[2:]))
        s = list(n.attrs.get("strides", [1] * nd))
        d = list(n.attrs.get("dilations", [1] * nd))
        op_ = list(n.attrs.get("output_padding", [0] * nd))
        auto = n.attrs.get("auto_pad", "NOTSET") or "NOTSET"
        if "output_shape" in n.attrs or auto in ("SAME_UPPER", "SAME_LOWER"):
            out_sp = ys[2:]
            begins, ends = [], []
            for i in range(nd):
                total = s[i] * (xs[2 + i] - 1) + op_[i] + (k[i] - 1) * d[i] + 1 - out_sp[i]
                if total < 0:
                    op_[i] -= total
                    total = 0
                lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
                begins.append(lo)
                ends.append(total - lo)
            pads = begins + ends
        elif auto == "VALID":
            pads = [0] * (2 * nd)
        else:
            pads = list(n.attrs.get("pads", [0] * (2 * nd)))
        if nd == 1:
            x, w, y4 = self._as_2d(n, x, w, y)
            s, d, op_ = [1] + s, [1] + d, [0] + op_
            pads = [0, pads[0], 0, pads[1]]
        else:
            y4 = y
        self.emit("conv_transpose", n.name, [x, w], [y4], strides=s, pads=_to4(pads),
                  dilations=d, group=int(n.attrs.get("group", 1)), output_padding=op_,
                  bias=self.inp(n, 2), epilogue=[])
        if y4 != y:
            self.view(f"{n.name}/y1d", y4, y)

    def op_Gemm(self, n: Node) -> None:
        self.emit("gemm", n.name, n.inputs[:2], [n.outputs[0]],
                  trans_a=int(n.attrs.get("transA", 0)), trans_b=int(n.attrs.get("transB", 0)),
                  alpha=float(n.attrs.get("alpha", 1.0)), bias=self.inp(n, 2),
                  beta=float(n.attrs.get("beta", 1.0)), epilogue=[])

    def op_MatMul(self, n: Node) -> None:
        a, b, y = n.inputs[0], n.inputs[1], n.outputs[0]
        as_, bs = self.shape(a), self.shape(b)
        if len(as_) == 1:
            a2 = self.g.new_value(a, (1, as_[0]), self.dtype(a))
            self.view(f"{n.name}/a2d", a, a2) if self.const(a) is None else None
            if self.const(a) is not None:
                a2 = self.g.new_const(a, self.const(a).reshape(1, -1))
            a = a2
        if len(bs) == 1:
            if self.const(b) is not None:
                b = self.g.new_const(b, self.const(b).reshape(-1, 1))
            else:
                b2 = self.g.new_value(b, (bs[0], 1), self.dtype(b))
                self.view(f"{n.name}/b2d", b, b2)
                b = b2
        sa, sb = self.shape(a), self.shape(b)
        batch = np.broadcast_shapes(sa[:-2], sb[:-2])
        ys2 = tuple(batch) + (sa[-2], sb[-1])
        if ys2 == self.shape(y):
            y2 = y
        else:
            y2 = self.g.new_value(y, ys2, self.dtype(y))
        self.emit("gemm", n.name, [a, b], [y2], trans_a=0, trans_b=0, alpha=1.0, bias=None,
                  beta=1.0, epilogue=[])
        if y2 != y:
            self.view(f"{n.name}/y", y2, y)

    # -- pooling / reductions ----------------------------------------------------------
    def _pool(self, n: Node, mode: str) -> None:
        x, y = n.inputs[0], n.outputs[0]
        xs = self.shape(x)
        if len(n.outputs) > 1 and self.used(n.outputs[1]):
            raise _Unsupported("MaxPool Indices output")
        nd = len(xs) - 2
        if nd not in (1, 2):
            raise _Unsupported(f"{nd}-D pooling")
        k = list(n.attrs["kernel_shape"])
        s = list(n.attrs.get("strides", [1] * nd))
        d = list(n.attrs.get("dilations", [1] * nd))
        pads = resolve_pads(n.attrs.get("auto_pad", "NOTSET"), xs[2:], k, s, d,
                            n.attrs.get("pads"))
        y4 = y
        if nd == 1:
            x4 = self.g.new_value(x, (xs[0], xs[1], 1, xs[2]), self.dtype(x))
            self.view(f"{n.name}/x2d", x, x4)
            ys = self.shape(y)
            y4 = self.g.new_value(y, (ys[0], ys[1], 1, ys[2]), self.dtype(y))
            x, k, s, d, pads = x4, [1] + k, [1] + s, [1] + d, [0, pads[0], 0, pads[1]]
        self.emit("pool", n.name, [x], [y4], mode=mode, kernel=k, strides=s, pads=_to4(pads),
                  dilations=d, ceil_mode=int(n.attrs.get("ceil_mode", 0)),
                  count_include_pad=int(n.attrs.get("count_include_pad", 0)))
        if y4 != y:
            self.view(f"{n.name}/y1d", y4, y)

    def op_MaxPool(self, n: Node) -> None:
        if int(n.attrs.get("storage_order", 0)) not in (0, 1):
            raise _Unsupported("storage_order")
        self._pool(n, "max")

    def op_AveragePool(self, n: Node) -> None:
        self._pool(n, "avg")

    def _global(self, n: Node, mode: str) -> None:
        x, y = n.inputs[0], n.outputs[0]
        xs = self.shape(x)
        if len(xs) < 3:
            raise _Unsupported("global pool needs rank >= 3")
        if len(xs) == 4:
            self.emit("global_pool", n.name, [x], [y], mode=mode)
            return
        sp = int(np.prod(xs[2:]))
        x4 = self.g.new_value(x, (xs[0], xs[1], 1, sp), self.dtype(x))
        y4 = self.g.new_value(y, (xs[0], xs[1], 1, 1), self.dtype(y))
        self.view(f"{n.name}/x4d", x, x4)
        self.emit("global_pool", n.name, [x4], [y4], mode=mode)
        self.view(f"{n.name}/y", y4, y)

    def op_GlobalAveragePool(self, n: Node) -> None:
        self._global(n, "avg")

    def op_GlobalMaxPool(self, n: Node) -> None:
        self._global(n, "max")

    def _reduce(self, n: Node, op: str) -> None:
        x, y = n.inputs[0], n.outputs[0]
        rank = len(self.shape(x))
        # axes: attribute before opset 18 (13 for ReduceSum), input after
        axes = self.param(n, "axes", 1, None)
        keep = int(n.attrs.get("keepdims", 1))
        if not axes:
            if int(n.attrs.get("noop_with_empty_axes", 0)):
                self.view(n.name, x, y)
                return
            axes = list(range(rank))
        axes = sorted({_norm_axis(a, rank) for a in axes})
        self.emit("reduce", n.name, [x], [y], op=op, axes=axes, keepdims=keep)

    def op_ReduceMean(self, n: Node) -> None:
        self._reduce(n, "mean")

    def op_ReduceSum(self, n: Node) -> None:
        self._reduce(n, "sum")

    def op_ReduceMax(self, n: Node) -> None:
        self._reduce(n, "max")

    def op_ReduceMin(self, n: Node) -> None:
        self._reduce(n, "min")

    def op_BatchNormalization(self, n: Node) -> None:
        if any(self.used(o) for o in n.outputs[1:]) or int(n.attrs.get("training_mode", 0)):
            raise _Unsupported("training-mode BatchNormalization")
        self.emit("batchnorm", n.name, n.inputs[:5], [n.outputs[0]],
                  epsilon=float(n.attrs.get("epsilon", 1e-5)))

    def op_Softmax(self, n: Node) -> None:
        x, y = n.inputs[0], n.outputs[0]
        xs = self.shape(x)
        rank = len(xs)
        if self.g.opset >= 13:
            self.emit("softmax", n.name, [x], [y], axis=_norm_axis(n.attrs.get("axis", -1), rank))
            return
        axis = _norm_axis(n.attrs.get("axis", 1), rank)
        if axis == rank - 1:
            self.emit("softmax", n.name, [x], [y], axis=axis)
            return
        rows, cols = int(np.prod(xs[:axis])), int(np.prod(xs[axis:]))
        x2 = self.g.new_value(x, (rows, cols), self.dtype(x))
        y2 = self.g.new_value(y, (rows, cols), self.dtype(y))
        self.view(f"{n.name}/x2d", x, x2)
        self.emit("softmax", n.name, [x2], [y2], axis=1)
        self.view(f"{n.name}/y", y2, y)

    def op_LayerNormalization(self, n: Node) -> None:
        if any(self.used(o) for o in n.outputs[1:]):
            raise _Unsupported("LayerNormalization Mean/InvStdDev outputs")
        rank = len(self.shape(n.inputs[0]))
        self.emit("layernorm", n.name, [i for i in n.inputs[:3] if i], [n.outputs[0]],
                  axis=_norm_axis(n.attrs.get("axis", -1), rank),
                  epsilon=float(n.attrs.get("epsilon", 1e-5)))

    # -- data movement -----------------------------------------------------------------
    def op_Concat(self, n: Node) -> None:
        ins = [i for i in n.inputs if i]
        rank = len(self.shape(n.outputs[0]))
        axis = _norm_axis(n.attrs["axis"], rank)
        ins = [i for i in ins if self.shape(i)[axis] > 0] or ins[:1]
        if len(ins) == 1:
            self.view(n.name, ins[0], n.outputs[0])
            return
        self.emit("concat", n.name, ins, [n.outputs[0]], axis=axis)

    def op_Split(self, n: Node) -> None:
        x = n.inputs[0]
        rank = len(self.shape(x))
        axis = _norm_axis(n.attrs.get("axis", 0), rank)
        outs = [o for o in n.outputs]
        sizes = [self.shape(o)[axis] for o in outs]
        self.emit("split", n.name, [x], outs, axis=axis, sizes=sizes)

    def op_Slice(self, n: Node) -> None:
        x, y = n.inputs[0], n.outputs[0]
        xs = self.shape(x)
        rank = len(xs)
        if self.g.opset < 10:
            starts, ends = n.attrs["starts"], n.attrs["ends"]
            axes = n.attrs.get("axes", list(range(len(starts))))
            steps = [1] * len(starts)
        else:
            starts, ends = self.param(n, "starts", 1), self.param(n, "ends", 2)
            axes = self.param(n, "axes", 3, None) or list(range(len(starts)))
            steps = self.param(n, "steps", 4, None) or [1] * len(starts)
        na, ns, ne, nst = [], [], [], []
        for a, st, en, sp in zip(axes, starts, ends, steps):
            a = _norm_axis(a, rank)
            dim, st, en, sp = xs[a], int(st), int(en), int(sp)
            if sp == 0:
                raise _Unsupported("Slice step 0")
            st = st + dim if st < 0 else st
            en = en + dim if en < 0 else en
            if sp > 0:
                st, en = min(max(st, 0), dim), min(max(en, 0), dim)
            else:
                st, en = min(max(st, 0), dim - 1), min(max(en, -1), dim - 1)
            if sp == 1 and st == 0 and en == dim:
                continue  # full range: nothing to do on this axis
            na.append(a)
            ns.append(st)
            ne.append(en)
            nst.append(sp)
        if not na:
            self.view(n.name, x, y)
            return
        self.emit("slice", n.name, [x], [y], starts=ns, ends=ne, axes=na, steps=nst)

    def op_Pad(self, n: Node) -> None:
        x, y = n.inputs[0], n.outputs[0]
        rank = len(self.shape(x))
        mode = n.attrs.get("mode", "constant")
        if mode not in ("constant", "reflect", "edge"):
            raise _Unsupported(f"Pad mode {mode}")
        if self.g.opset < 11:
            pads = list(n.attrs.get("pads") or n.attrs.get("paddings"))
            value = float(n.attrs.get("value", 0.0))
        else:
            pads = list(self.param(n, "pads", 1))
            v = self.param(n, "constant_value", 2, 0.0)
            value = float(np.asarray(v).reshape(-1)[0]) if np.asarray(v).size else 0.0
            axes = self.param(n, "axes", 3, None)
            if axes is not None:
                full = [0] * (2 * rank)
                na = len(axes)
                for j, a in enumerate(axes):
                    a = _norm_axis(a, rank)
                    full[a], full[a + rank] = pads[j], pads[j + na]
                pads = full
        pads = [int(p) for p in pads]
        if not any(pads):
            self.view(n.name, x, y)
            return
        self.emit("pad", n.name, [x], [y], pads=pads, mode=mode, value=value)

    def op_Gather(self, n: Node) -> None:
        data, idx, y = n.inputs[0], n.inputs[1], n.outputs[0]
        rank = len(self.shape(data))
        axis = _norm_axis(n.attrs.get("axis", 0), rank)
        ic = self.const(idx)
        if ic is not None and (ic < 0).any():
            idx = self.g.new_const(idx, np.where(ic < 0, ic + self.shape(data)[axis], ic))
        self.emit("gather", n.name, [data, idx], [y], axis=axis)

    def op_Resize(self, n: Node) -> None:
        x, y = n.inputs[0], n.outputs[0]
        xs, ys = self.shape(x), self.shape(y)
        rank = len(xs)
        mode = n.attrs.get("mode", "nearest")
        if mode not in ("nearest", "linear", "bilinear"):
            raise _Unsupported(f"Resize mode {mode}")
        mode = "linear" if mode == "bilinear" else mode
        if int(n.attrs.get("antialias", 0)):
            raise _Unsupported("Resize antialias")
        if n.op == "Upsample" or self.g.opset < 11:
            ctm, nearest = "asymmetric", "floor"
            scales = n.attrs.get("scales") or self.param(n, "scales", 1)
        else:
            ctm = n.attrs.get("coordinate_transformation_mode", "half_pixel")
            nearest = n.attrs.get("nearest_mode", "round_prefer_floor")
            sc = self.const(self.inp(n, 2))
            scales = sc.tolist() if sc is not None and sc.size else None
            if self.inp(n, 2) and sc is None:
                raise _Unsupported("non-constant scales")
        if ctm == "tf_crop_and_resize":
            raise _Unsupported("tf_crop_and_resize")
        axes = n.attrs.get("axes")
        if scales is None:
            scales = [ys[i] / xs[i] if xs[i] else 1.0 for i in range(rank)]
        elif axes is not None:
            full = [1.0] * rank
            for a, s in zip(axes, scales):
                full[_norm_axis(a, rank)] = s
            scales = full
        scales = [float(s) for s in scales]
        if xs == ys and all(s == 1.0 for s in scales):
            self.view(n.name, x, y)
            return
        self.emit("resize", n.name, [x], [y], mode=mode, coordinate_transformation_mode=ctm,
                  nearest_mode=nearest, scales=scales)

    op_Upsample = op_Resize

    def op_ConstantOfShape(self, n: Node) -> None:
        raise _Unsupported("non-constant shape")

    op_Range = op_ConstantOfShape
