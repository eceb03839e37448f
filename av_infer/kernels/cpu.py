"""The numpy implementation of every plan kernel kind, and the executor that runs plans.

``CpuPlanRunner`` is what the cpu device (and tests, and the reference checks of other
devices) use to execute a plan: it prepares each kernel once per plan, then binds the
kernels to an activation arena as zero-argument closures whose tensor views are already
resolved, so running kernel k is one Python call into vectorised numpy/BLAS.

Contract every kernel keeps (the plan's idempotence guarantee relies on it): a kernel
writes only into its preallocated output views (never rebinding them), never writes its
inputs, and fully overwrites its outputs, so re-running it gives bit-identical results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from av_infer.model.plan import ENGINE_KINDS, KERNEL_KINDS, Kernel, Plan

from . import cpu_spatial
from .cpu_base import (
    ArenaIO,
    KernelFn,
    PlanContext,
    Prepared,
    ScratchLayout,
    ViewFn,
    aligned_empty,
    bind_epilogue,
    tensor_view,
)
from .cpu_ops import BINARY, ELEMENTWISE, act_params

__all__ = ["KERNELS", "NOT_EXECUTABLE_KINDS", "CpuPlanRunner", "KernelFactory", "missing_kinds"]

KernelFactory = Callable[[Kernel, PlanContext], Prepared]


def _norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy.matmul's result shape (1-D operands promoted then squeezed)."""
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ValueError(f"matmul inner dims differ: {a} @ {b}")
    batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


# -- dense ----------------------------------------------------------------------------------


def _gemm(k: Kernel, ctx: PlanContext) -> Prepared:
    """y = alpha * op(a) @ op(b) + beta * bias, then the epilogue; BLAS via np.matmul."""
    a = k.args
    ta, tb = bool(a.get("trans_a", 0)), bool(a.get("trans_b", 0))
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    sa, sb, sy = ctx.shape(k.inputs[0]), ctx.shape(k.inputs[1]), ctx.shape(k.outputs[0])

    def op_shape(s: tuple[int, ...], t: bool) -> tuple[int, ...]:
        return (*s[:-2], s[-1], s[-2]) if t and len(s) >= 2 else s

    res_shape = _matmul_shape(op_shape(sa, ta), op_shape(sb, tb))
    if int(np.prod(res_shape)) != int(np.prod(sy)):
        raise ValueError(f"{k.name}: gemm result {res_shape} does not fit output {sy}")
    direct = tuple(res_shape) == tuple(sy)
    layout = ScratchLayout()
    i_tmp = -1 if direct else layout.add(res_shape, ctx.dtype(k.outputs[0]))
    bias_name = a.get("bias")
    static_bias = ctx.static(bias_name)
    scaled_bias = None
    if static_bias is not None:
        scaled_bias = (
            (static_bias * beta).astype(ctx.dtype(k.outputs[0])) if beta != 1.0 else static_bias
        )
    steps = a.get("epilogue") or []

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        xa, xb, y = view(k.inputs[0]), view(k.inputs[1]), view(k.outputs[0])
        if ta and xa.ndim >= 2:
            xa = np.swapaxes(xa, -1, -2)
        if tb and xb.ndim >= 2:
            xb = np.swapaxes(xb, -1, -2)
        target = y if direct else layout.carve(scratch)[i_tmp]
        bias = None
        if bias_name:
            bias = scaled_bias if scaled_bias is not None else view(bias_name)
        post = bind_epilogue(steps, y, view)
        dyn_beta = beta if (bias is not None and scaled_bias is None and beta != 1.0) else None

        def run() -> None:
            np.matmul(xa, xb, out=target)
            if not direct:
                np.copyto(y, target.reshape(y.shape))
            if alpha != 1.0:
                np.multiply(y, alpha, out=y, casting="unsafe")
            if bias is not None:
                if dyn_beta is not None:
                    np.add(y, bias * dyn_beta, out=y, casting="unsafe")
                else:
                    np.add(y, bias, out=y)
            for f in post:
                f()

        return run

    return Prepared(bind, layout.nbytes)


# -- elementwise ----------------------------------------------------------------------------


def _binary(k: Kernel, ctx: PlanContext) -> Prepared:
    op = k.args["op"]
    fn = BINARY.get(op)
    if fn is None:
        raise NotImplementedError(f"binary op {op!r}")

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        xa, xb, y = view(k.inputs[0]), view(k.inputs[1]), view(k.outputs[0])
        shape = np.broadcast_shapes(xa.shape, xb.shape)
        if shape != y.shape:
            y = y.reshape(shape)

        def run() -> None:
            fn(xa, xb, y)

        return run

    return Prepared(bind)


def _unary(k: Kernel, ctx: PlanContext) -> Prepared:
    ops = []
    for step in k.args.get("ops") or []:
        name = step[0] if isinstance(step, (list, tuple)) else step
        params = step[1] if isinstance(step, (list, tuple)) and len(step) > 1 else None
        if name not in ELEMENTWISE:
            raise NotImplementedError(f"unary op {name!r}")
        ops.append((ELEMENTWISE[name], act_params(name, params)))

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        x, y = view(k.inputs[0]), view(k.outputs[0])
        if x.shape != y.shape:
            x = x.reshape(y.shape)
        if not ops:
            return lambda: np.copyto(y, x, casting="unsafe")
        first, rest = ops[0], ops[1:]

        def run() -> None:
            first[0](x, y, first[1])
            for fn, p in rest:
                fn(y, y, p)

        return run

    return Prepared(bind)


def _where(k: Kernel, ctx: PlanContext) -> Prepared:
    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        c, xa, xb, y = (view(n) for n in (*k.inputs[:3], k.outputs[0]))

        def run() -> None:
            np.copyto(y, xb, casting="unsafe")
            np.copyto(y, xa, casting="unsafe", where=c)

        return run

    return Prepared(bind)


def _batchnorm(k: Kernel, ctx: PlanContext) -> Prepared:
    """y = (x - mean) / sqrt(var + eps) * scale + bias per channel (axis 1)."""
    eps = float(k.args.get("epsilon", 1e-5))
    xs = ctx.shape(k.inputs[0])
    pshape = (xs[1],) + (1,) * (len(xs) - 2) if len(xs) > 1 else (xs[0],)
    dtype = ctx.dtype(k.outputs[0])
    names = k.inputs[1:5]

    def fold(sc: np.ndarray, b: np.ndarray, m: np.ndarray, v: np.ndarray):
        mul = sc.astype(np.float64) / np.sqrt(v.astype(np.float64) + eps)
        add = b.astype(np.float64) - m.astype(np.float64) * mul
        return mul.astype(dtype).reshape(pshape), add.astype(dtype).reshape(pshape)

    static = [ctx.static(n) for n in names]
    folded = fold(*static) if all(s is not None for s in static) else None

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        x, y = view(k.inputs[0]), view(k.outputs[0])
        params = [view(n) for n in names]

        def run() -> None:
            mul, add = folded if folded is not None else fold(*params)
            np.multiply(x, mul, out=y)
            np.add(y, add, out=y)

        return run

    return Prepared(bind)


# -- reductions and normalisation -----------------------------------------------------------

_REDUCERS: dict[str, Callable[..., Any]] = {
    "mean": np.mean,
    "sum": np.sum,
    "max": np.max,
    "min": np.min,
    "prod": np.prod,
}


def _reduce_identity(op: str, dtype: np.dtype) -> Any:
    """What ONNX's max/min reductions give over an empty set (numpy raises instead)."""
    dtype = np.dtype(dtype)
    if op not in ("max", "min"):
        return None
    if dtype == np.bool_:
        return op == "min"
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min if op == "max" else info.max
    return -np.inf if op == "max" else np.inf


def _reduce(k: Kernel, ctx: PlanContext) -> Prepared:
    op = k.args.get("op", "mean")
    xs = ctx.shape(k.inputs[0])
    axes_arg = k.args.get("axes")
    if axes_arg is None or len(axes_arg) == 0:
        axes = tuple(range(len(xs)))
        if k.args.get("noop_with_empty_axes"):
            axes = ()
    else:
        axes = tuple(sorted(_norm_axis(int(a), len(xs)) for a in axes_arg))
    keep = tuple(1 if i in axes else s for i, s in enumerate(xs))
    empty = bool(axes) and any(xs[a] == 0 for a in axes)
    identity = _reduce_identity(op, ctx.dtype(k.outputs[0])) if empty else None

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        x = view(k.inputs[0])
        y = view(k.outputs[0]).reshape(keep)
        if not axes:
            return lambda: np.copyto(y, x)
        if identity is not None:  # ONNX: reducing an empty set gives the op's identity
            return lambda: y.fill(identity)
        if op in _REDUCERS:
            f = _REDUCERS[op]
            return lambda: f(x, axis=axes, keepdims=True, out=y)
        if op == "sum_square":
            return lambda: np.sum(np.square(x), axis=axes, keepdims=True, out=y)
        if op == "l1":
            return lambda: np.sum(np.abs(x), axis=axes, keepdims=True, out=y)
        if op == "l2":

            def l2() -> None:
                np.sum(np.square(x), axis=axes, keepdims=True, out=y)
                np.sqrt(y, out=y)

            return l2
        if op == "log_sum":

            def log_sum() -> None:
                np.sum(x, axis=axes, keepdims=True, out=y)
                np.log(y, out=y)

            return log_sum
        if op == "log_sum_exp":

            def lse() -> None:
                m = np.max(x, axis=axes, keepdims=True)
                np.sum(np.exp(x - m), axis=axes, keepdims=True, out=y)
                np.log(y, out=y)
                np.add(y, m, out=y)

            return lse
        raise NotImplementedError(f"reduce op {op!r}")

    return Prepared(bind)


def _softmax(k: Kernel, ctx: PlanContext) -> Prepared:
    """Numerically stable softmax (or log-softmax with ``log``) along ``axis``.

    ``coerce_2d`` (opset < 13 semantics) normalises over all axes from ``axis`` on.
    """
    xs = ctx.shape(k.inputs[0])
    axis = _norm_axis(int(k.args.get("axis", -1)), len(xs))
    if k.args.get("coerce_2d") or k.args.get("legacy"):
        axes: tuple[int, ...] = tuple(range(axis, len(xs)))
    else:
        axes = (axis,)
    log = bool(k.args.get("log", False))

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        x, y = view(k.inputs[0]), view(k.outputs[0])

        def run() -> None:
            np.subtract(x, np.max(x, axis=axes, keepdims=True), out=y)
            if log:
                np.subtract(y, np.log(np.sum(np.exp(y), axis=axes, keepdims=True)), out=y)
            else:
                np.exp(y, out=y)
                np.divide(y, np.sum(y, axis=axes, keepdims=True), out=y)

        return run

    return Prepared(bind)


def _layernorm(k: Kernel, ctx: PlanContext) -> Prepared:
    """ONNX LayerNormalization: normalise over axes axis..rank-1, then scale and bias."""
    xs = ctx.shape(k.inputs[0])
    axis = _norm_axis(int(k.args.get("axis", -1)), len(xs))
    axes = tuple(range(axis, len(xs)))
    eps = float(k.args.get("epsilon", 1e-5))
    has_bias = len(k.inputs) > 2 and bool(k.inputs[2])

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        x, y = view(k.inputs[0]), view(k.outputs[0])
        scale = view(k.inputs[1])
        bias = view(k.inputs[2]) if has_bias else None

        def run() -> None:
            np.subtract(x, np.mean(x, axis=axes, keepdims=True), out=y)
            var = np.mean(np.square(y), axis=axes, keepdims=True)
            var += eps
            np.sqrt(var, out=var)
            np.divide(y, var, out=y)
            np.multiply(y, scale, out=y)
            if bias is not None:
                np.add(y, bias, out=y)

        return run

    return Prepared(bind)


# -- data movement --------------------------------------------------------------------------


def _concat(k: Kernel, ctx: PlanContext) -> Prepared:
    axis = _norm_axis(int(k.args.get("axis", 0)), len(ctx.shape(k.outputs[0])))

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        xs = [view(n) for n in k.inputs]
        y = view(k.outputs[0])
        xs = [x for x in xs if x.size or x.ndim == y.ndim]

        def run() -> None:
            np.concatenate(xs, axis=axis, out=y)

        return run

    return Prepared(bind)


def _split(k: Kernel, ctx: PlanContext) -> Prepared:
    xs = ctx.shape(k.inputs[0])
    axis = _norm_axis(int(k.args.get("axis", 0)), len(xs))
    sizes = k.args.get("sizes") or [ctx.shape(o)[axis] for o in k.outputs]
    if sum(sizes) != xs[axis]:
        raise ValueError(f"{k.name}: split sizes {sizes} do not sum to {xs[axis]}")
    bounds = np.cumsum([0, *sizes])
    slices = []
    for i in range(len(sizes)):
        sl = [slice(None)] * len(xs)
        sl[axis] = slice(int(bounds[i]), int(bounds[i + 1]))
        slices.append(tuple(sl))

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        x = view(k.inputs[0])
        pairs = [(view(o), x[sl]) for o, sl in zip(k.outputs, slices)]

        def run() -> None:
            for y, src in pairs:
                np.copyto(y, src)

        return run

    return Prepared(bind)


def _transpose(k: Kernel, ctx: PlanContext) -> Prepared:
    perm = k.args.get("perm")

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        x, y = view(k.inputs[0]), view(k.outputs[0])
        src = x.transpose(perm) if perm is not None else x.T
        return lambda: np.copyto(y, src)

    return Prepared(bind)


def slice_index(args: dict[str, Any], shape: tuple[int, ...]) -> tuple[slice, ...]:
    """A ``slice`` kernel's args as one numpy index (shared with the CUDA generator)."""
    starts, ends = list(args["starts"]), list(args["ends"])
    axes = list(args.get("axes") or range(len(starts)))
    steps = list(args.get("steps") or [1] * len(starts))
    sl: list[slice] = [slice(None)] * len(shape)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax = _norm_axis(int(ax), len(shape))
        st, en, sp = int(st), int(en), int(sp)
        if sp > 0:
            sl[ax] = slice(max(st, 0), max(min(en, shape[ax]), 0), sp)
        else:
            # ends of -1 (or below) mean "through index 0" for negative steps.
            sl[ax] = slice(min(st, shape[ax] - 1), en if en >= 0 else None, sp)
    return tuple(sl)


def _slice(k: Kernel, ctx: PlanContext) -> Prepared:
    xs = ctx.shape(k.inputs[0])
    index = slice_index(k.args, xs)
    got = tuple(len(range(*s.indices(d))) for s, d in zip(index, xs))
    if got != ctx.shape(k.outputs[0]):
        raise ValueError(
            f"{k.name}: slice of {xs} gives {got}, plan says {ctx.shape(k.outputs[0])}"
        )

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        x, y = view(k.inputs[0]), view(k.outputs[0])
        src = x[index]
        return lambda: np.copyto(y, src)

    return Prepared(bind)


def _pad(k: Kernel, ctx: PlanContext) -> Prepared:
    a = k.args
    xs = ctx.shape(k.inputs[0])
    r = len(xs)
    pads = [int(p) for p in a["pads"]]
    if len(pads) != 2 * r:
        raise ValueError(f"{k.name}: pads {pads} for rank {r}")
    mode = a.get("mode", "constant")
    value = a.get("value", 0.0)
    value = 0.0 if value is None else value
    crop = tuple(slice(max(-pads[i], 0), xs[i] - max(-pads[i + r], 0)) for i in range(r))
    begin = [max(pads[i], 0) for i in range(r)]
    end = [max(pads[i + r], 0) for i in range(r)]
    cropped = [c.stop - c.start for c in crop]
    interior = tuple(slice(begin[i], begin[i] + cropped[i]) for i in range(r))
    np_mode = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}
    if mode not in np_mode:
        raise NotImplementedError(f"pad mode {mode!r}")

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        x, y = view(k.inputs[0]), view(k.outputs[0])
        src = x[crop]
        if mode == "constant":
            dst = y[interior]
            fill = np.asarray(value).astype(y.dtype)

            def run_const() -> None:
                y.fill(fill)
                np.copyto(dst, src)

            return run_const
        widths = list(zip(begin, end))

        def run() -> None:
            np.copyto(y, np.pad(src, widths, mode=np_mode[mode]))

        return run

    return Prepared(bind)


def _gather(k: Kernel, ctx: PlanContext) -> Prepared:
    ds = ctx.shape(k.inputs[0])
    axis = _norm_axis(int(k.args.get("axis", 0)), len(ds))
    static_idx = ctx.static(k.inputs[1])
    if static_idx is not None:
        static_idx = np.where(static_idx < 0, static_idx + ds[axis], static_idx).astype(np.intp)

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        data, y = view(k.inputs[0]), view(k.outputs[0])
        idx = static_idx if static_idx is not None else view(k.inputs[1])
        out_shape = ds[:axis] + tuple(idx.shape) + ds[axis + 1 :]
        yv = y.reshape(out_shape) if tuple(y.shape) != out_shape else y

        def run() -> None:
            np.take(data, idx, axis=axis, out=yv)

        return run

    return Prepared(bind)


def _copy(k: Kernel, ctx: PlanContext) -> Prepared:
    """copy and cast: the output's dtype decides (numpy's unsafe casting = ONNX Cast)."""

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        x, y = view(k.inputs[0]), view(k.outputs[0])
        if x.shape != y.shape:
            x = x.reshape(y.shape)
        return lambda: np.copyto(y, x, casting="unsafe")

    return Prepared(bind)


#: kind -> factory. Every kind of ``KERNEL_KINDS`` has one (checked at import).
KERNELS: dict[str, KernelFactory] = {
    "conv": cpu_spatial.conv,
    "conv_transpose": cpu_spatial.conv_transpose,
    "gemm": _gemm,
    "binary": _binary,
    "unary": _unary,
    "pool": cpu_spatial.pool,
    "global_pool": cpu_spatial.global_pool,
    "reduce": _reduce,
    "softmax": _softmax,
    "layernorm": _layernorm,
    "concat": _concat,
    "split": _split,
    "transpose": _transpose,
    "slice": _slice,
    "pad": _pad,
    "gather": _gather,
    "resize": cpu_spatial.resize,
    "cast": _copy,
    "copy": _copy,
    "batchnorm": _batchnorm,
    "where": _where,
}

#: Kinds no device executes (simulator workloads built from measured REEF traces).
NOT_EXECUTABLE_KINDS: frozenset[str] = frozenset({"trace"})


def missing_kinds() -> list[str]:
    """Kinds of ``KERNEL_KINDS`` this module cannot run (should be empty; tested)."""
    return sorted(set(KERNEL_KINDS) - set(KERNELS) - NOT_EXECUTABLE_KINDS - ENGINE_KINDS)


class CpuPlanRunner(ArenaIO):
    """Runs a plan kernel by kernel with numpy on preallocated buffers.

    Construction prepares every kernel once (shape checks, index tables, folded weights);
    :meth:`bind` turns them into closures over one arena. Any number of arenas may be bound
    to one runner (one per task); a bound list must be run by one thread at a time.
    """

    def __init__(self, plan: Plan):
        self.plan = plan
        self._ctx = PlanContext(plan)
        self._prepared: list[Prepared] = []
        for k in plan.kernels:
            factory = KERNELS.get(k.kind)
            if factory is None:
                why = (
                    "simulator-only kind, no device executes it"
                    if k.kind in NOT_EXECUTABLE_KINDS
                    else "a segment plan: ONNX Runtime runs it (kernels.ort_segments)"
                    if k.kind in ENGINE_KINDS
                    else "no CPU implementation"
                )
                raise NotImplementedError(f"kernel {k.index} ({k.name}): kind {k.kind!r}: {why}")
            try:
                self._prepared.append(factory(k, self._ctx))
            except (ValueError, KeyError, NotImplementedError, TypeError, IndexError) as e:
                raise type(e)(f"kernel {k.index} {k.kind} ({k.name}): {e}") from e
        #: Bytes of scratch each bound arena carries (largest kernel's need).
        self.scratch_bytes = max((p.scratch_bytes for p in self._prepared), default=0)

    # -- arenas ---------------------------------------------------------------------------
    def new_arena(self) -> np.ndarray:
        """A fresh, 64-byte aligned uint8 activation arena of ``plan.arena_bytes``."""
        return aligned_empty(max(int(self.plan.arena_bytes), 1))

    def view(self, arena: np.ndarray, name: str) -> np.ndarray:
        """The array of tensor ``name`` on ``arena`` (weights come from the plan)."""
        t = self._ctx.tensor(name)
        buf = self.plan.buffers[t.buffer]
        if buf.role == "weight":
            return self._ctx.weight(name)
        return tensor_view(arena, t, buf.offset)

    def bind(self, arena: np.ndarray) -> list[Callable[[], None]]:
        """One zero-argument closure per kernel; calling ``[k]()`` runs kernel k on ``arena``."""
        if arena.dtype != np.uint8 or arena.ndim != 1 or arena.size < self.plan.arena_bytes:
            raise ValueError(
                f"arena must be a 1-D uint8 array of >= {self.plan.arena_bytes} bytes, "
                f"got {arena.dtype} {arena.shape}"
            )
        scratch = aligned_empty(self.scratch_bytes)
        cache: dict[str, np.ndarray] = {}

        def view(name: str) -> np.ndarray:
            v = cache.get(name)
            if v is None:
                v = cache[name] = self.view(arena, name)
            return v

        fns = []
        for k, p in zip(self.plan.kernels, self._prepared):
            try:
                fns.append(p.bind(view, scratch))
            except (ValueError, KeyError, TypeError, IndexError) as e:
                raise type(e)(f"kernel {k.index} {k.kind} ({k.name}): {e}") from e
        return fns

    # -- I/O: write_inputs / read_outputs from ArenaIO ------------------------------------
    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Convenience: new arena, write inputs, run every kernel, return outputs."""
        arena = self.new_arena()
        fns = self.bind(arena)
        self.write_inputs(arena, inputs)
        for f in fns:
            f()
        return self.read_outputs(arena)
