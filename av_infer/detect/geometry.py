"""Where an image lands in a detector's input, and back: boxes in the camera's pixels.

A detector sees the camera image resized to its input H x W, either stretched (each axis
scaled on its own, what ``nodes/preprocess.py`` does by default) or letterboxed (one scale
for both axes, the rest padded, what YOLO-family detectors are trained with). Decoders give
boxes in input pixels; :meth:`Fit.to_source` maps them back to the image's pixels, so a
``Detection2D`` box can be drawn on the image the camera published.

Guaranteed: ``to_source(to_input(b)) == b`` up to float rounding, and boxes come back
clipped to the image (``0 <= x <= width``, ``0 <= y <= height``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FIT_MODES = ("stretch", "letterbox")


@dataclass(frozen=True)
class Fit:
    """An image of ``src_h x src_w`` placed in an input of ``dst_h x dst_w``: input pixel
    ``x_in = x_src * scale_x + pad_x`` (likewise y). Pixel coordinates are continuous (the
    image spans ``[0, width] x [0, height]``), as OpenCV and ``vision_msgs`` use them."""

    src_h: int
    src_w: int
    dst_h: int
    dst_w: int
    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float

    @property
    def content_hw(self) -> tuple[int, int]:
        """The image's size inside the input (the rest is padding)."""
        return (int(round(self.src_h * self.scale_y)), int(round(self.src_w * self.scale_x)))

    def to_source(self, boxes: np.ndarray) -> np.ndarray:
        """``[..., 4]`` xyxy boxes in input pixels -> the image's pixels, clipped to it."""
        b = np.asarray(boxes, dtype=np.float64).copy()
        b[..., 0::2] = np.clip((b[..., 0::2] - self.pad_x) / self.scale_x, 0.0, self.src_w)
        b[..., 1::2] = np.clip((b[..., 1::2] - self.pad_y) / self.scale_y, 0.0, self.src_h)
        return b

    def to_input(self, boxes: np.ndarray) -> np.ndarray:
        """``[..., 4]`` xyxy boxes in the image's pixels -> input pixels (no clipping)."""
        b = np.asarray(boxes, dtype=np.float64).copy()
        b[..., 0::2] = b[..., 0::2] * self.scale_x + self.pad_x
        b[..., 1::2] = b[..., 1::2] * self.scale_y + self.pad_y
        return b


def fit(src_h: int, src_w: int, dst_h: int, dst_w: int, mode: str = "stretch") -> Fit:
    """The placement of an ``src_h x src_w`` image in a ``dst_h x dst_w`` input.

    ``letterbox``: scale ``min(dst_h/src_h, dst_w/src_w)``, the content rounded to whole
    pixels and centred (padding split as ``(total // 2, total - total // 2)``, like
    Ultralytics' ``LetterBox(center=True)``)."""
    if min(src_h, src_w, dst_h, dst_w) <= 0:
        raise ValueError(f"sizes must be positive: {src_w}x{src_h} -> {dst_w}x{dst_h}")
    if mode == "stretch":
        return Fit(src_h, src_w, dst_h, dst_w, dst_w / src_w, dst_h / src_h, 0.0, 0.0)
    if mode != "letterbox":
        raise ValueError(f"fit must be one of {FIT_MODES}, got {mode!r}")
    s = min(dst_h / src_h, dst_w / src_w)
    new_h = min(dst_h, max(1, int(round(src_h * s))))
    new_w = min(dst_w, max(1, int(round(src_w * s))))
    # the content's exact scale per axis (rounding to whole pixels may differ by < 1 px)
    return Fit(src_h, src_w, dst_h, dst_w, new_w / src_w, new_h / src_h,
               float((dst_w - new_w) // 2), float((dst_h - new_h) // 2))
