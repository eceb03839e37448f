"""CPU kernels over NCHW feature maps: conv, conv_transpose, pool, global_pool, resize.

All are vectorised over pixels and channels; the only Python loops run over kernel taps
(kh * kw) or axes. Convolution is im2col (a strided window view copied into scratch) and
one batched BLAS matmul over groups; 1x1 stride-1 convs skip im2col; depthwise convs
accumulate taps with broadcasting multiplies (a matmul with K=9 would waste BLAS).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from av_infer.model.plan import Kernel

from .cpu_base import KernelFn, PlanContext, Prepared, ScratchLayout, ViewFn, bind_epilogue


def _as_2d_args(args: dict[str, Any], spatial: int) -> tuple[tuple[int, int], ...]:
    """(strides, pads_begin, pads_end, dilations) as 2-D tuples; 1-D args get H=1 prepended."""
    strides = list(args.get("strides") or [1] * spatial)
    dil = list(args.get("dilations") or [1] * spatial)
    pads = list(args.get("pads") or [0] * (2 * spatial))
    if len(strides) == 1:
        strides = [1, *strides]
    if len(dil) == 1:
        dil = [1, *dil]
    if len(pads) == 2:
        pads = [0, pads[0], 0, pads[1]]
    return (
        (int(strides[0]), int(strides[1])),
        (int(pads[0]), int(pads[1])),
        (int(pads[2]), int(pads[3])),
        (int(dil[0]), int(dil[1])),
    )


def _to4d(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """NCHW shape; NCW (1-D) becomes NC1W."""
    if len(shape) == 3:
        return (shape[0], shape[1], 1, shape[2])
    if len(shape) != 4:
        raise NotImplementedError(f"spatial kernels support 1-D/2-D maps, got shape {shape}")
    return tuple(int(s) for s in shape)  # type: ignore[return-value]


def _fill_border(xp: np.ndarray, top: int, left: int, h: int, w: int, value: float) -> None:
    """Set everything of ``xp`` outside the [top:top+h, left:left+w] interior to ``value``."""
    if top:
        xp[:, :, :top] = value
    if top + h < xp.shape[2]:
        xp[:, :, top + h :] = value
    if left:
        xp[:, :, top : top + h, :left] = value
    if left + w < xp.shape[3]:
        xp[:, :, top : top + h, left + w :] = value


def _tap(
    xp: np.ndarray, i: int, j: int, d: tuple[int, int], s: tuple[int, int], ho: int, wo: int
) -> np.ndarray:
    """The (N, C, ho, wo) strided view of input pixels under kernel tap (i, j)."""
    r0, c0 = i * d[0], j * d[1]
    return xp[:, :, r0 : r0 + (ho - 1) * s[0] + 1 : s[0], c0 : c0 + (wo - 1) * s[1] + 1 : s[1]]


def _mm_operands(
    w: np.ndarray, x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Drop all-singleton batch dims (n = g = 1) so np.matmul makes one plain 2-D sgemm."""
    if w.shape[0] == 1 and x.shape[:2] == (1, 1):
        return w[0], x[0, 0], y[0, 0]
    return w, x, y


class _Padder:
    """Plan-time description of the zero/-inf padded copy a sliding-window kernel reads."""

    def __init__(
        self,
        xshape: tuple[int, int, int, int],
        pb: tuple[int, int],
        pe: tuple[int, int],
        k: tuple[int, int],
        s: tuple[int, int],
        d: tuple[int, int],
        out_hw: tuple[int, int],
        fill: float,
    ) -> None:
        n, c, h, w = xshape
        need_h = (out_hw[0] - 1) * s[0] + d[0] * (k[0] - 1) + 1
        need_w = (out_hw[1] - 1) * s[1] + d[1] * (k[1] - 1) + 1
        self.top, self.left = pb
        self.h, self.w = h, w
        self.hp = max(h + pb[0] + pe[0], need_h)
        self.wp = max(w + pb[1] + pe[1], need_w)
        self.fill = fill
        self.needed = not (self.top == 0 and self.left == 0 and self.hp == h and self.wp == w)
        self.shape = (n, c, self.hp, self.wp)

    def run(self, x: np.ndarray, xp: np.ndarray) -> None:
        _fill_border(xp, self.top, self.left, self.h, self.w, self.fill)
        xp[:, :, self.top : self.top + self.h, self.left : self.left + self.w] = x


def conv(k: Kernel, ctx: PlanContext) -> Prepared:
    """NCHW conv, any group count, strides/dilations/pads; bias and epilogue fused."""
    a = k.args
    xs, ws, ys = ctx.shape(k.inputs[0]), ctx.shape(k.inputs[1]), ctx.shape(k.outputs[0])
    n, c, h, w = _to4d(xs)
    ws4 = _to4d(ws)
    cout, cg, kh, kw = ws4
    _, _, ho, wo = _to4d(ys)
    g = int(a.get("group", 1))
    if c != cg * g or cout % g:
        raise ValueError(f"{k.name}: channels {c} / weights {ws} do not match group {g}")
    s, pb, pe, d = _as_2d_args(a, len(xs) - 2)
    coutg = cout // g
    kk = cg * kh * kw
    dtype = ctx.dtype(k.outputs[0])
    bias_name = a.get("bias")
    steps = a.get("epilogue") or []

    pad = _Padder((n, c, h, w), pb, pe, (kh, kw), s, d, (ho, wo), 0.0)
    layout = ScratchLayout()
    pointwise = kh == kw == 1 and s == (1, 1) and not pad.needed and (ho, wo) == (h, w)
    depthwise = g == c == cout and cg == 1 and not pointwise
    i_pad = layout.add(pad.shape, dtype) if pad.needed and not pointwise else -1
    i_tmp = i_col = -1
    if depthwise:
        i_tmp = layout.add((n, c, ho, wo), dtype)
    elif not pointwise:
        i_col = layout.add((n, g, kk, ho * wo), dtype)

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        x = view(k.inputs[0]).reshape(n, c, h, w)
        wt = view(k.inputs[1]).reshape(ws4)
        y = view(k.outputs[0]).reshape(n, cout, ho, wo)
        parts = layout.carve(scratch)
        bias = view(bias_name).reshape(cout, 1, 1) if bias_name else None
        post = bind_epilogue(steps, y, view, bias)
        xp = parts[i_pad] if i_pad >= 0 else x
        fill = pad.run if i_pad >= 0 else None

        if pointwise:
            wm, xm, ym = _mm_operands(
                wt.reshape(g, coutg, cg), x.reshape(n, g, cg, h * w), y.reshape(n, g, coutg, h * w)
            )

            def core() -> None:
                np.matmul(wm, xm, out=ym)

        elif depthwise:
            tmp = parts[i_tmp]
            wd = wt.reshape(c, kh * kw, 1, 1)
            taps = [(i, j) for i in range(kh) for j in range(kw)]

            def core() -> None:
                if fill is not None:
                    fill(x, xp)
                for t, (i, j) in enumerate(taps):
                    src = _tap(xp, i, j, d, s, ho, wo)
                    if t == 0:
                        np.multiply(src, wd[:, 0], out=y)
                    else:
                        np.multiply(src, wd[:, t], out=tmp)
                        np.add(y, tmp, out=y)

        else:
            col = parts[i_col]
            sn, sc, sh, sw = xp.strides
            win = as_strided(
                xp,
                shape=(n, g, cg, kh, kw, ho, wo),
                strides=(sn, cg * sc, sc, d[0] * sh, d[1] * sw, s[0] * sh, s[1] * sw),
                writeable=False,
            )
            col7 = col.reshape(n, g, cg, kh, kw, ho, wo)
            wm, colm, ym = _mm_operands(
                wt.reshape(g, coutg, kk), col, y.reshape(n, g, coutg, ho * wo)
            )

            def core() -> None:
                if fill is not None:
                    fill(x, xp)
                np.copyto(col7, win)
                np.matmul(wm, colm, out=ym)

        if not post:
            return core

        def run() -> None:
            core()
            for f in post:
                f()

        return run

    return Prepared(bind, layout.nbytes)


def conv_transpose(k: Kernel, ctx: PlanContext) -> Prepared:
    """Transposed conv: one batched gemm to per-tap columns, then col2im over kh*kw taps."""
    a = k.args
    xs, ws, ys = ctx.shape(k.inputs[0]), ctx.shape(k.inputs[1]), ctx.shape(k.outputs[0])
    n, c, h, w = _to4d(xs)
    ws4 = _to4d(ws)
    cin, coutg, kh, kw = ws4
    _, cout, ho, wo = _to4d(ys)
    g = int(a.get("group", 1))
    if cin != c or coutg * g != cout:
        raise ValueError(f"{k.name}: input {xs} / weights {ws} / output {ys} mismatch (group {g})")
    s, pb, pe, d = _as_2d_args(a, len(xs) - 2)
    cing = c // g
    dtype = ctx.dtype(k.outputs[0])
    bias_name = a.get("bias")
    steps = a.get("epilogue") or []
    span_h = (h - 1) * s[0] + 1
    span_w = (w - 1) * s[1] + 1
    hf = max(span_h + d[0] * (kh - 1), pb[0] + ho)
    wf = max(span_w + d[1] * (kw - 1), pb[1] + wo)

    layout = ScratchLayout()
    layout.add((n, g, coutg * kh * kw, h * w), dtype)  # columns
    layout.add((n, cout, hf, wf), dtype)  # uncropped output

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        x = view(k.inputs[0]).reshape(n, g, cing, h * w)
        wt = view(k.inputs[1]).reshape(g, cing, coutg * kh * kw)
        wm = np.swapaxes(wt, 1, 2)  # (g, coutg*kh*kw, cing): BLAS reads it transposed
        y = view(k.outputs[0]).reshape(n, cout, ho, wo)
        col, full = layout.carve(scratch)
        col6 = col.reshape(n, cout, kh, kw, h, w)
        bias = view(bias_name).reshape(cout, 1, 1) if bias_name else None
        post = bind_epilogue(steps, y, view, bias)
        crop = full[:, :, pb[0] : pb[0] + ho, pb[1] : pb[1] + wo]
        dst = [
            (
                full[
                    :, :, i * d[0] : i * d[0] + span_h : s[0], j * d[1] : j * d[1] + span_w : s[1]
                ],
                col6[:, :, i, j],
            )
            for i in range(kh)
            for j in range(kw)
        ]

        def run() -> None:
            np.matmul(wm, x, out=col)
            full.fill(0)
            for dv, src in dst:
                dv += src
            np.copyto(y, crop)
            for f in post:
                f()

        return run

    return Prepared(bind, layout.nbytes)


def pool(k: Kernel, ctx: PlanContext) -> Prepared:
    """Max/avg pooling as a reduction over kh*kw strided tap views of a padded copy.

    Avg divisors follow onnxruntime: with ``count_include_pad`` the window is clipped to the
    explicitly padded extent (never the extra ceil_mode margin), else to the real input.
    """
    a = k.args
    xs, ys = ctx.shape(k.inputs[0]), ctx.shape(k.outputs[0])
    n, c, h, w = _to4d(xs)
    _, _, ho, wo = _to4d(ys)
    kern = list(a["kernel"])
    if len(kern) == 1:
        kern = [1, *kern]
    kh, kw = int(kern[0]), int(kern[1])
    s, pb, pe, d = _as_2d_args(a, len(xs) - 2)
    mode = a.get("mode", "max")
    if mode not in ("max", "avg"):
        raise NotImplementedError(f"pool mode {mode!r}")
    dtype = ctx.dtype(k.outputs[0])
    fill = -np.inf if mode == "max" else 0.0
    if mode == "max" and dtype.kind in "iu":
        fill = np.iinfo(dtype).min
    pad = _Padder((n, c, h, w), pb, pe, (kh, kw), s, d, (ho, wo), fill)
    layout = ScratchLayout()
    i_pad = layout.add(pad.shape, dtype) if pad.needed else -1
    inv = None
    if mode == "avg":
        inc = bool(a.get("count_include_pad", 0))

        def counts(o: int, st: int, dl: int, kn: int, lo: int, hi: int) -> np.ndarray:
            pos = np.arange(o)[:, None] * st + np.arange(kn)[None, :] * dl
            return ((pos >= lo) & (pos < hi)).sum(axis=1)

        if inc:
            ch = counts(ho, s[0], d[0], kh, 0, h + pb[0] + pe[0])
            cw = counts(wo, s[1], d[1], kw, 0, w + pb[1] + pe[1])
        else:
            ch = counts(ho, s[0], d[0], kh, pb[0], pb[0] + h)
            cw = counts(wo, s[1], d[1], kw, pb[1], pb[1] + w)
        cnt = (ch[:, None] * cw[None, :]).astype(np.float64)
        inv = np.where(cnt > 0, 1.0 / np.maximum(cnt, 1), 0.0).astype(dtype)
    taps = [(i, j) for i in range(kh) for j in range(kw)]
    combine = np.maximum if mode == "max" else np.add

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        x = view(k.inputs[0]).reshape(n, c, h, w)
        y = view(k.outputs[0]).reshape(n, c, ho, wo)
        xp = layout.carve(scratch)[i_pad] if i_pad >= 0 else x
        srcs = [_tap(xp, i, j, d, s, ho, wo) for i, j in taps]

        def run() -> None:
            if i_pad >= 0:
                pad.run(x, xp)
            np.copyto(y, srcs[0])
            for src in srcs[1:]:
                combine(y, src, out=y)
            if inv is not None:
                np.multiply(y, inv, out=y)

        return run

    return Prepared(bind, layout.nbytes)


def global_pool(k: Kernel, ctx: PlanContext) -> Prepared:
    """Mean/max over every spatial axis (2..rank-1), keeping dims."""
    mode = k.args.get("mode", "avg")
    xs = ctx.shape(k.inputs[0])
    axes = tuple(range(2, len(xs)))
    keep = tuple(xs[:2]) + (1,) * len(axes)
    reducer = {"avg": np.mean, "mean": np.mean, "max": np.max, "min": np.min}.get(mode)
    if reducer is None:
        raise NotImplementedError(f"global_pool mode {mode!r}")

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        x = view(k.inputs[0])
        y = view(k.outputs[0]).reshape(keep)

        def run() -> None:
            reducer(x, axis=axes, keepdims=True, out=y)

        return run

    return Prepared(bind)


# -- resize ---------------------------------------------------------------------------------


def _source_coords(mode: str, n_out: int, n_in: int, scale: float) -> np.ndarray:
    """ONNX Resize coordinate_transformation_mode: output index -> input coordinate."""
    xo = np.arange(n_out, dtype=np.float64)
    if mode == "half_pixel":
        return (xo + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (xo + 0.5) / scale - 0.5 if n_out > 1 else np.zeros(n_out)
    if mode == "align_corners":
        return xo * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros(n_out)
    if mode == "asymmetric":
        return xo / scale
    if mode == "tf_half_pixel_for_nn":
        return (xo + 0.5) / scale
    if mode == "half_pixel_symmetric":
        adj = n_out / (scale * n_in)
        center = n_in / 2
        offset = center * (1 - adj)
        return offset + (xo + 0.5) / scale - 0.5
    raise NotImplementedError(f"resize coordinate_transformation_mode {mode!r}")


def _nearest(coords: np.ndarray, mode: str, n_in: int) -> np.ndarray:
    if mode == "round_prefer_floor":
        idx = np.ceil(coords - 0.5)
    elif mode == "round_prefer_ceil":
        idx = np.floor(coords + 0.5)
    elif mode == "floor":
        idx = np.floor(coords)
    elif mode == "ceil":
        idx = np.ceil(coords)
    else:
        raise NotImplementedError(f"resize nearest_mode {mode!r}")
    return np.clip(idx, 0, n_in - 1).astype(np.intp)


def _cubic_weights(t: np.ndarray, a: float) -> np.ndarray:
    """Keys cubic convolution weights for offsets t in [0, 1): columns for taps -1, 0, 1, 2."""

    def w(z: np.ndarray) -> np.ndarray:
        z = np.abs(z)
        return np.where(
            z <= 1,
            ((a + 2) * z - (a + 3)) * z * z + 1,
            np.where(z < 2, ((a * z - 5 * a) * z + 8 * a) * z - 4 * a, 0.0),
        )

    return np.stack([w(t + 1), w(t), w(1 - t), w(2 - t)], axis=1)


def resize_taps(mode: str, ctm: str, nearest_mode: str, n_in: int, n_out: int,
                scale: float, cubic_a: float = -0.75,
                exclude_outside: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """One axis of ONNX Resize as taps: input indices and weights, both (n_out, taps).

    The one definition of Resize's sampling, shared by the numpy kernel and the CUDA
    generator (which uploads the tables)."""
    co = _source_coords(ctm, n_out, n_in, scale)
    if mode == "nearest":
        idx = _nearest(co, nearest_mode, n_in)[:, None]
        return idx, np.ones_like(idx, dtype=np.float64)
    if mode == "linear":
        co = np.clip(co, 0, n_in - 1)
        i0 = np.floor(co).astype(np.intp)
        t = co - i0
        idx = np.stack([i0, np.minimum(i0 + 1, n_in - 1)], axis=1)
        return idx, np.stack([1 - t, t], axis=1)
    if mode != "cubic":
        raise NotImplementedError(f"resize mode {mode!r}")
    base = np.floor(co).astype(np.intp)
    t = co - base
    idx = base[:, None] + np.arange(-1, 3)[None, :]
    wts = _cubic_weights(t, cubic_a)
    if exclude_outside:
        wts = np.where((idx >= 0) & (idx < n_in), wts, 0.0)
        wts = wts / wts.sum(axis=1, keepdims=True)
    return np.clip(idx, 0, n_in - 1), wts


def resize(k: Kernel, ctx: PlanContext) -> Prepared:
    """ONNX Resize: nearest (one fancy-index gather) or separable linear/cubic per axis."""
    a = k.args
    xs, ys = ctx.shape(k.inputs[0]), ctx.shape(k.outputs[0])
    if len(xs) != len(ys):
        raise ValueError(f"{k.name}: resize rank mismatch {xs} -> {ys}")
    mode = a.get("mode", "nearest")
    ctm = a.get("coordinate_transformation_mode", "half_pixel")
    nmode = a.get("nearest_mode", "round_prefer_floor")
    scales = list(a.get("scales") or [])
    dtype = ctx.dtype(k.outputs[0])
    exclude_outside = bool(a.get("exclude_outside", 0))
    cubic_a = float(a.get("cubic_coeff_a", -0.75))

    def scale_of(ax: int) -> float:
        if ax < len(scales) and scales[ax] and float(scales[ax]) > 0:
            return float(scales[ax])
        return ys[ax] / xs[ax]

    axes = [ax for ax in range(len(xs)) if xs[ax] != ys[ax] or scale_of(ax) != 1.0]

    if mode == "nearest":
        index: list[Any] = []
        for ax in range(len(xs)):
            if ax in axes:
                co = _source_coords(ctm, ys[ax], xs[ax], scale_of(ax))
                idx = _nearest(co, nmode, xs[ax])
            else:
                idx = np.arange(xs[ax], dtype=np.intp)
            shape = [1] * len(xs)
            shape[ax] = idx.size
            index.append(idx.reshape(shape))
        ix = tuple(index)

        def bind_nn(view: ViewFn, scratch: np.ndarray) -> KernelFn:
            x, y = view(k.inputs[0]), view(k.outputs[0])

            def run() -> None:
                y[...] = x[ix]

            return run

        return Prepared(bind_nn)

    if mode not in ("linear", "cubic"):
        raise NotImplementedError(f"resize mode {mode!r}")

    # Per axis: (axis, index table (n_out, taps), weight table (n_out, taps)).
    plans: list[tuple[int, np.ndarray, np.ndarray]] = []
    for ax in axes:
        idx, wts = resize_taps(mode, ctm, nmode, xs[ax], ys[ax], scale_of(ax), cubic_a,
                               exclude_outside)
        plans.append((ax, idx, wts.astype(dtype if dtype.kind == "f" else np.float32)))

    def bind(view: ViewFn, scratch: np.ndarray) -> KernelFn:
        x, y = view(k.inputs[0]), view(k.outputs[0])
        rank = len(xs)

        def run() -> None:
            cur = x
            for ax, idx, wts in plans:
                shape = [1] * rank
                shape[ax] = idx.shape[0]
                acc = None
                for tap in range(idx.shape[1]):
                    term = np.take(cur, idx[:, tap], axis=ax)
                    term *= wts[:, tap].reshape(shape)
                    acc = term if acc is None else np.add(acc, term, out=acc)
                cur = acc
            np.copyto(y, cur, casting="unsafe")

        return run

    return Prepared(bind)
