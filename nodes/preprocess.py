"""Camera image -> model input tensor, in numpy (ROS-free, so plain pytest covers it).

``image_to_tensor`` takes the raw fields of a ``sensor_msgs/Image`` (encoding, height,
width, step, data) and returns float32 NCHW resized to the model's input H x W (nearest or
bilinear), scaled to [0, 1] and normalised per channel: ``(x - mean) / std``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from av_infer.tensor_codec import GatherPlan, ResizePlan

#: encoding -> (channels, channel order to reach RGB)
ENCODINGS: dict[str, tuple[int, tuple[int, ...]]] = {
    "rgb8": (3, (0, 1, 2)),
    "bgr8": (3, (2, 1, 0)),
    "mono8": (1, (0,)),
}
RESIZE_METHODS = ("nearest", "bilinear")
#: How the image fills the model input: ``stretch`` (each axis scaled on its own) or
#: ``letterbox`` (one scale, centred, the rest ``LETTERBOX_PAD``); av_infer.detect.geometry
#: maps boxes back for both.
FIT_MODES = ("stretch", "letterbox")
#: The grey that letterboxing pads with (Ultralytics' value, in 0..255 pixel units).
LETTERBOX_PAD = 114


class ImageFormatError(ValueError):
    """The image cannot be converted (unknown encoding, inconsistent sizes)."""

    code = "invalid_input"


def _check_fields(encoding: str, height: int, width: int, step: int, nbytes: int) -> int:
    """The image's channel count; ImageFormatError for fields that do not describe an image
    of ``nbytes`` bytes. Integer checks only: the data path validates each frame with this,
    without building the strided array ``image_to_array`` returns."""
    enc = ENCODINGS.get(encoding)
    if enc is None:
        raise ImageFormatError(f"unsupported encoding {encoding!r} "
                               f"(supported: {', '.join(ENCODINGS)})")
    channels = enc[0]
    if height <= 0 or width <= 0:
        raise ImageFormatError(f"empty image {width}x{height}")
    row = width * channels
    if step < row:
        raise ImageFormatError(f"step {step} is shorter than a row ({row} bytes)")
    if nbytes < step * (height - 1) + row:
        raise ImageFormatError(f"data has {nbytes} bytes, a {width}x{height} {encoding} "
                               f"image with step {step} needs {step * (height - 1) + row}")
    return channels


def image_to_array(encoding: str, height: int, width: int, step: int,
                   data: bytes | bytearray | memoryview) -> np.ndarray:
    """Raw image fields -> uint8 HxWxC array in RGB (or HxWx1 for mono8); no copy if possible."""
    buf = _raw_bytes(data)
    channels = _check_fields(encoding, height, width, step, buf.size)
    order = ENCODINGS[encoding][1]
    row = width * channels
    rows = np.lib.stride_tricks.as_strided(buf, shape=(height, row), strides=(step, 1))
    img = rows.reshape(height, width, channels)
    if order != tuple(range(channels)):
        img = img[:, :, list(order)]
    return img


def _raw_bytes(data: Any) -> np.ndarray:
    """``data`` (bytes, bytearray, ``array.array('B')``, a uint8 array, any buffer) as a
    flat uint8 array without a copy."""
    try:
        raw = np.frombuffer(data, dtype=np.uint8)
    except (TypeError, ValueError):  # a buffer of another item size or shape
        raw = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    return raw


@lru_cache(maxsize=64)
def _taps(n_in: int, n_out: int, method: str) -> tuple[np.ndarray, ...]:
    """Source indices (and bilinear weights) along one axis, pixel-centre aligned like
    OpenCV's resize; cached per size pair (cameras keep their size)."""
    if method == "nearest":
        return (np.minimum(((np.arange(n_out) + 0.5) * n_in / n_out).astype(np.intp),
                           n_in - 1),)
    if method != "bilinear":
        raise ValueError(f"resize method must be one of {RESIZE_METHODS}, got {method!r}")
    f = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
    i0 = np.floor(f).astype(np.intp)
    i1 = np.minimum(i0 + 1, n_in - 1)
    return i0, i1, (f - i0).astype(np.float32)


def resize(img: np.ndarray, out_h: int, out_w: int, method: str = "bilinear") -> np.ndarray:
    """HxWxC -> out_h x out_w x C float32 (pixel-centre aligned, like OpenCV's resize).

    Only the source pixels a tap reads are gathered and converted to float (not the whole
    image): the cost scales with the output, not the camera resolution."""
    h, w = img.shape[:2]
    if (h, w) == (out_h, out_w):
        return img.astype(np.float32)
    if method == "nearest":
        (ys,), (xs,) = _taps(h, out_h, method), _taps(w, out_w, method)
        return img[ys[:, None], xs[None, :]].astype(np.float32)
    y0, y1, wy = _taps(h, out_h, method)
    x0, x1, wx = _taps(w, out_w, method)
    r0, r1 = img[y0], img[y1]  # out_h rows each
    a = r0[:, x0].astype(np.float32)
    b = r0[:, x1].astype(np.float32)
    c = r1[:, x0].astype(np.float32)
    d = r1[:, x1].astype(np.float32)
    wxc = wx[None, :, None]
    b -= a
    b *= wxc
    a += b  # top row blend
    d -= c
    d *= wxc
    c += d  # bottom row blend
    c -= a
    c *= wy[:, None, None]
    a += c
    return a


@lru_cache(maxsize=32)
def _gather_plan(encoding: str, height: int, width: int, step: int, c: int, h: int, w: int,
                 method: str, mean: tuple[float, ...], std: tuple[float, ...],
                 fit_mode: str = "stretch") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Resize, channel order/count, scaling, normalisation and the NCHW transpose of one
    camera -> model pair as ONE weighted gather over the raw bytes: ``out[i] =
    sum_k weight[k, i] * raw[index[k, i]] - offset[i]`` (``i`` over C x H x W).

    Built once per pair (cameras keep their size) and cached; per frame only the gather and
    a multiply-add over the *output* elements remain, whatever the camera resolution.

    ``letterbox``: the image is resized into the centred content window of
    ``geometry.fit`` and the padding gets weight 0 and the offset that makes it
    ``LETTERBOX_PAD`` after normalisation.
    """
    from av_infer.detect import fit as fit_geometry

    ch_in, order = ENCODINGS[encoding]
    g = fit_geometry(height, width, h, w, fit_mode)
    ch, cw = g.content_hw if fit_mode == "letterbox" else (h, w)
    py, px = int(g.pad_y), int(g.pad_x)
    same = (height, width) == (ch, cw)
    if same or method == "nearest":
        ys = np.arange(ch) if same else _taps(height, ch, "nearest")[0]
        xs = np.arange(cw) if same else _taps(width, cw, "nearest")[0]
        spatial = [(ys[:, None], xs[None, :], np.ones((ch, cw), np.float32))]
    else:
        y0, y1, wy = _taps(height, ch, method)
        x0, x1, wx = _taps(width, cw, method)
        wy, wx = wy[:, None], wx[None, :]
        spatial = [(y0[:, None], x0[None, :], (1 - wy) * (1 - wx)),
                   (y0[:, None], x1[None, :], (1 - wy) * wx),
                   (y1[:, None], x0[None, :], wy * (1 - wx)),
                   (y1[:, None], x1[None, :], wy * wx)]
    content = np.zeros((h, w), bool)
    content[py:py + ch, px:px + cw] = True
    if (ch, cw) != (h, w):  # embed the content taps in the input; padding reads byte 0
        embedded = []
        for yy, xx, sw in spatial:
            fy, fx, fw = (np.zeros((h, w), np.intp), np.zeros((h, w), np.intp),
                          np.zeros((h, w), np.float32))
            fy[content] = np.broadcast_to(yy, (ch, cw)).ravel()
            fx[content] = np.broadcast_to(xx, (ch, cw)).ravel()
            fw[content] = np.broadcast_to(sw, (ch, cw)).ravel()
            embedded.append((fy, fx, fw))
        spatial = embedded
    if ch_in == c:
        sources = [[(order[co], 1.0)] for co in range(c)]
    elif ch_in == 1:  # grey feeds every channel
        sources = [[(0, 1.0)] for _ in range(c)]
    else:  # c == 1: the mean of RGB
        sources = [[(order[k], 1.0 / ch_in) for k in range(ch_in)]]
    m = np.broadcast_to(np.asarray(mean, np.float64), (c,))
    sd = np.broadcast_to(np.asarray(std, np.float64), (c,))
    idx, wts = [], []
    for co in range(c):
        taps_i, taps_w = [], []
        for src, cw in sources[co]:
            for yy, xx, sw in spatial:
                taps_i.append((yy * step + xx * ch_in + src).reshape(-1))
                taps_w.append((sw * (cw / (255.0 * sd[co]))).reshape(-1))
        idx.append(np.stack(taps_i))
        wts.append(np.stack(taps_w))
    # int32 indices gather faster than intp; a camera frame is far below 2 GiB
    index = np.concatenate(idx, axis=1).astype(np.int32 if step * height < 2**31 else np.intp)
    weight = np.concatenate(wts, axis=1).astype(np.float32)
    pad = (m - LETTERBOX_PAD / 255.0) / sd  # what -offset must be where there is no image
    offset = np.concatenate([np.where(content.ravel(), m[co] / sd[co], pad[co])
                             for co in range(c)]).astype(np.float32)
    for a in (index, weight, offset):
        a.flags.writeable = False
    return index, weight, offset


@lru_cache(maxsize=64)
def _normalisation(c: int, mean: tuple[Any, ...], std: tuple[Any, ...]
                   ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``mean``/``std`` as float32-rounded tuples (the plan's key), checked: 1 or ``c``
    values each, std non-zero. Cached: a node passes the same parameters every frame."""
    m = np.asarray(mean, dtype=np.float32).reshape(-1)
    s = np.asarray(std, dtype=np.float32).reshape(-1)
    if m.size not in (1, c) or s.size not in (1, c) or np.any(s == 0):
        raise ImageFormatError(f"mean/std need 1 or {c} values (std non-zero)")
    return tuple(float(v) for v in m), tuple(float(v) for v in s)


@lru_cache(maxsize=32)
def _compiled_plan(*key: Any) -> GatherPlan | None:
    """``_gather_plan`` as a checked ``GatherPlan`` (one C loop without the GIL, ~3x faster
    than numpy's gather + einsum); None where the indices need more than 32 bits."""
    index, weight, offset = _gather_plan(*key)
    if index.dtype != np.int32:
        return None
    return GatherPlan(index, weight, offset)


@lru_cache(maxsize=32)
def _resize_plan(encoding: str, height: int, width: int, step: int, c: int, h: int, w: int,
                 method: str, mean: tuple[float, ...], std: tuple[float, ...],
                 fit_mode: str = "stretch") -> ResizePlan | None:
    """The ``_gather_plan`` pair as a separable ``ResizePlan`` (per-row and per-column taps,
    8 KB instead of the gather's megabytes of tables: 3x299x299 bilinear reads 8.6 MB of
    index and weights per frame), where each model channel reads one image channel
    (rgb8/bgr8 -> 3 channels, mono8 -> any); None otherwise (RGB -> 1 channel: the gather).
    Same taps, scaling, offsets and letterbox padding as ``_gather_plan``: nearest taps and
    the padding give the same floats, bilinear agrees to float32 rounding."""
    from av_infer.detect import fit as fit_geometry

    ch_in, order = ENCODINGS[encoding]
    if ch_in != c and ch_in != 1:
        return None
    g = fit_geometry(height, width, h, w, fit_mode)
    ch, cw = g.content_hw if fit_mode == "letterbox" else (h, w)
    py, px = int(g.pad_y), int(g.pad_x)

    def axis(n_in: int, n_content: int, n_out: int, start: int) -> tuple[np.ndarray, ...]:
        i0 = np.zeros(n_out, np.int32)
        i1 = np.zeros(n_out, np.int32)
        wt = np.zeros(n_out, np.float32)
        sl = slice(start, start + n_content)
        if n_in == n_content:
            i0[sl] = i1[sl] = np.arange(n_content)
        elif method == "nearest":
            i0[sl] = i1[sl] = _taps(n_in, n_content, "nearest")[0]
        else:
            a, b, f = _taps(n_in, n_content, method)
            i0[sl], i1[sl], wt[sl] = a, b, f
        return i0, i1, wt

    y0, y1, wy = axis(height, ch, h, py)
    x0, x1, wx = axis(width, cw, w, px)
    m = np.broadcast_to(np.asarray(mean, np.float64), (c,))
    sd = np.broadcast_to(np.asarray(std, np.float64), (c,))
    src = [order[co] if ch_in == c else 0 for co in range(c)]
    scale = [1.0 / (255.0 * sd[co]) for co in range(c)]
    offset = [m[co] / sd[co] for co in range(c)]
    # the gather's padding: weight 0 and -offset (float32) where there is no image
    pad = -np.asarray((m - LETTERBOX_PAD / 255.0) / sd, np.float32)
    return ResizePlan(y0, y1, wy, x0, x1, wx, src, scale, offset, pad, step, ch_in,
                      rows=(py, py + ch), cols=(px, px + cw))


def image_to_tensor(encoding: str, height: int, width: int, step: int,
                    data: bytes | bytearray | memoryview, input_shape: Sequence[int],
                    method: str = "bilinear", mean: Sequence[float] = (0.485, 0.456, 0.406),
                    std: Sequence[float] = (0.229, 0.224, 0.225),
                    out: np.ndarray | None = None, fit: str = "stretch") -> np.ndarray:
    """Raw image -> float32 tensor of ``input_shape`` (N, C, H, W); N copies of the image.

    Grey images feed 3-channel models by repeating the channel and vice versa by the mean
    of RGB. ``mean``/``std`` have one value per model channel (or one for all). ``out``: a
    C-contiguous float32 array of ``input_shape`` written in place and returned (the
    runtime's task input buffer, ``Runtime.input_buffers``: no further copy); otherwise a
    new array is returned.
    """
    if len(input_shape) != 4:
        raise ImageFormatError(f"model input must be NCHW, got shape {tuple(input_shape)}")
    n, c, h, w = (int(d) for d in input_shape)
    if out is not None and (out.shape != (n, c, h, w) or out.dtype != np.float32
                            or not out.flags.c_contiguous or not out.flags.writeable):
        raise ValueError(f"out must be a writable C-contiguous float32{[n, c, h, w]} array")
    if method not in RESIZE_METHODS:
        raise ValueError(f"resize method must be one of {RESIZE_METHODS}, got {method!r}")
    if fit not in FIT_MODES:
        raise ValueError(f"fit must be one of {FIT_MODES}, got {fit!r}")
    raw = _raw_bytes(data)
    ch_in = _check_fields(encoding, height, width, step, raw.size)
    if ch_in != c and ch_in != 1 and c != 1:
        raise ImageFormatError(f"cannot feed a {ch_in}-channel image to a "
                               f"{c}-channel model")
    try:  # hashable as given (lists from ROS parameters become tuples), checked once each
        norm = _normalisation(c, tuple(mean), tuple(std))
    except TypeError:  # not hashable (an ndarray): its values
        norm = _normalisation(c, tuple(np.ravel(mean).tolist()), tuple(np.ravel(std).tolist()))
    key = (encoding, int(height), int(width), int(step), c, h, w, method, *norm)
    if fit != "stretch":  # (the stretch key stays as it was: cached plans keep hitting)
        key = (*key, fit)
    if out is None:
        out = np.empty((max(n, 1), c, h, w), np.float32)
    acc = out[0].reshape(-1)  # a view: out is C-contiguous
    sep = _resize_plan(*key)
    fast = _compiled_plan(*key) if sep is None else None
    if sep is not None:  # the image and 8 KB of taps the only reads, out[0] the only write
        sep.apply(raw, acc)
    elif fast is not None:  # the image is the only read, out[0] the only write
        fast.apply(raw, acc)
    else:
        index, weight, offset = _gather_plan(*key)
        taps = raw.take(index)  # (k, C*H*W) uint8: the only read of the image
        np.einsum("kn,kn->n", taps, weight, out=acc)
        acc -= offset
    if out.shape[0] > 1:
        out[1:] = out[0]
    return out
