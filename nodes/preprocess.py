"""Camera image -> model input tensor, in numpy (ROS-free, so plain pytest covers it).

``image_to_tensor`` takes the raw fields of a ``sensor_msgs/Image`` (encoding, height,
width, step, data) and returns float32 NCHW resized to the model's input H x W (nearest or
bilinear), scaled to [0, 1] and normalised per channel: ``(x - mean) / std``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: encoding -> (channels, channel order to reach RGB)
ENCODINGS: dict[str, tuple[int, tuple[int, ...]]] = {
    "rgb8": (3, (0, 1, 2)),
    "bgr8": (3, (2, 1, 0)),
    "mono8": (1, (0,)),
}
RESIZE_METHODS = ("nearest", "bilinear")


class ImageFormatError(ValueError):
    """The image cannot be converted (unknown encoding, inconsistent sizes)."""

    code = "invalid_input"


def image_to_array(encoding: str, height: int, width: int, step: int,
                   data: bytes | bytearray | memoryview) -> np.ndarray:
    """Raw image fields -> uint8 HxWxC array in RGB (or HxWx1 for mono8); no copy if possible."""
    if encoding not in ENCODINGS:
        raise ImageFormatError(f"unsupported encoding {encoding!r} "
                               f"(supported: {', '.join(ENCODINGS)})")
    channels, order = ENCODINGS[encoding]
    if height <= 0 or width <= 0:
        raise ImageFormatError(f"empty image {width}x{height}")
    row = width * channels
    if step < row:
        raise ImageFormatError(f"step {step} is shorter than a row ({row} bytes)")
    buf = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    if buf.size < step * (height - 1) + row:
        raise ImageFormatError(f"data has {buf.size} bytes, a {width}x{height} {encoding} "
                               f"image with step {step} needs {step * (height - 1) + row}")
    rows = np.lib.stride_tricks.as_strided(buf, shape=(height, row), strides=(step, 1))
    img = rows.reshape(height, width, channels)
    if order != tuple(range(channels)):
        img = img[:, :, list(order)]
    return img


def resize(img: np.ndarray, out_h: int, out_w: int, method: str = "bilinear") -> np.ndarray:
    """HxWxC -> out_h x out_w x C float32 (pixel-centre aligned, like OpenCV's resize)."""
    h, w = img.shape[:2]
    if (h, w) == (out_h, out_w):
        return img.astype(np.float32)
    if method == "nearest":
        ys = np.minimum(((np.arange(out_h) + 0.5) * h / out_h).astype(np.int64), h - 1)
        xs = np.minimum(((np.arange(out_w) + 0.5) * w / out_w).astype(np.int64), w - 1)
        return img[ys][:, xs].astype(np.float32)
    if method != "bilinear":
        raise ValueError(f"resize method must be one of {RESIZE_METHODS}, got {method!r}")
    fy = np.clip((np.arange(out_h) + 0.5) * h / out_h - 0.5, 0, h - 1)
    fx = np.clip((np.arange(out_w) + 0.5) * w / out_w - 0.5, 0, w - 1)
    y0 = np.floor(fy).astype(np.int64)
    x0 = np.floor(fx).astype(np.int64)
    y1 = np.minimum(y0 + 1, h - 1)
    x1 = np.minimum(x0 + 1, w - 1)
    wy = (fy - y0).astype(np.float32)[:, None, None]
    wx = (fx - x0).astype(np.float32)[None, :, None]
    src = img.astype(np.float32)
    top = src[y0][:, x0] * (1 - wx) + src[y0][:, x1] * wx
    bottom = src[y1][:, x0] * (1 - wx) + src[y1][:, x1] * wx
    return top * (1 - wy) + bottom * wy


def image_to_tensor(encoding: str, height: int, width: int, step: int,
                    data: bytes | bytearray | memoryview, input_shape: Sequence[int],
                    method: str = "bilinear", mean: Sequence[float] = (0.485, 0.456, 0.406),
                    std: Sequence[float] = (0.229, 0.224, 0.225)) -> np.ndarray:
    """Raw image -> float32 tensor of ``input_shape`` (N, C, H, W); N copies of the image.

    Grey images feed 3-channel models by repeating the channel and vice versa by the mean
    of RGB. ``mean``/``std`` have one value per model channel (or one for all).
    """
    if len(input_shape) != 4:
        raise ImageFormatError(f"model input must be NCHW, got shape {tuple(input_shape)}")
    n, c, h, w = (int(d) for d in input_shape)
    img = image_to_array(encoding, height, width, step, data)
    x = resize(img, h, w, method) * np.float32(1.0 / 255.0)
    if x.shape[2] != c:
        if x.shape[2] == 1:
            x = np.repeat(x, c, axis=2)
        elif c == 1:
            x = x.mean(axis=2, keepdims=True)
        else:
            raise ImageFormatError(f"cannot feed a {x.shape[2]}-channel image to a "
                                   f"{c}-channel model")
    m = np.asarray(mean, dtype=np.float32).reshape(-1)
    s = np.asarray(std, dtype=np.float32).reshape(-1)
    if m.size not in (1, c) or s.size not in (1, c) or np.any(s == 0):
        raise ImageFormatError(f"mean/std need 1 or {c} values (std non-zero)")
    if m.size == 1:
        m = np.repeat(m, c)
    if s.size == 1:
        s = np.repeat(s, c)
    x = (x - m[:c]) / s[:c]
    chw = np.ascontiguousarray(x.transpose(2, 0, 1), dtype=np.float32)
    return np.broadcast_to(chw, (max(n, 1), c, h, w)).copy()
