"""Detector heads -> boxes, scores and classes in the camera image's pixels.

A decoder turns one inference's outputs (a name -> numpy array mapping, batch 1) into
:class:`Detections`: the score threshold, then per-class greedy NMS (``nms.py``), then the
inverse of the image's placement in the input (``geometry.Fit``). Two heads:

* ``yolo``: the anchor-free YOLOv8/v11 export, one output ``[1, 4 + nc, N]`` (``cx, cy, w,
  h`` in input pixels, then ``nc`` class scores already through a sigmoid); ``[1, N, 4 +
  nc]`` is accepted too (told apart by the class names' count, else the longer axis is N).
* ``ssd``: decoded boxes plus scores, two outputs ``[1, N, 4]`` and ``[1, N, nc]`` (SSD,
  PicoDet, RetinaNet exports with their box decoding in the graph): boxes ``xyxy`` or
  ``cxcywh``, in input pixels or normalised to [0, 1]; an optional background class
  (SSD's class 0) is never reported.

Pure numpy, importable without ROS. Anything the outputs do not fit (a missing output, a
wrong rank, a class count different from the class names) raises :class:`DecodeError`
(code ``invalid_input``) naming what is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from av_infer.detect.geometry import Fit
from av_infer.detect.nms import BACKENDS, nms
from av_infer.errors import InvalidInputError

DECODERS = ("none", "yolo", "ssd")
BOX_FORMATS = ("xyxy", "cxcywh")


class DecodeError(InvalidInputError):
    """The model's outputs do not have the layout the decoder needs."""


@dataclass(frozen=True)
class Detections:
    """Kept detections, best first: ``boxes`` [K, 4] xyxy in the image's pixels, ``scores``
    [K], ``classes`` [K] class indices and ``labels`` (class names, or the index as text)."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    labels: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.scores.shape[0])


@dataclass
class DecoderConfig:
    """Thresholds and names every decoder takes (the node's parameters of the same names)."""

    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    max_detections: int = 100
    pre_nms_top_k: int = 1000
    class_agnostic: bool = False
    class_names: Sequence[str] = field(default_factory=tuple)
    #: ``nms.BACKENDS``: ONNX Runtime's operator by default (measured 20-100x faster than
    #: the numpy one, docs/ros.md "Detections"); both keep the same boxes
    nms_backend: str = "onnxruntime"

    def __post_init__(self) -> None:
        for name in ("score_threshold", "iou_threshold"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v!r}")
        for name in ("max_detections", "pre_nms_top_k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 100_000:
                raise ValueError(f"{name} must be an integer in [1, 100000], got {v!r}")
        self.class_names = tuple(str(c) for c in self.class_names)
        if self.nms_backend not in BACKENDS:
            raise ValueError(f"nms_backend must be one of {BACKENDS}, got {self.nms_backend!r}")


def load_class_names(path: str | Path) -> list[str]:
    """Class names, one per line (blank lines and ``#`` comments skipped), as the
    ``coco.names`` / ``labels.txt`` files detectors ship with."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [s.strip() for s in lines if s.strip() and not s.lstrip().startswith("#")]


class Decoder:
    """Base: ``decode(outputs, fit)`` -> :class:`Detections`."""

    kind = ""

    def __init__(self, config: DecoderConfig | None = None):
        self.config = config or DecoderConfig()

    def candidates(self, outputs: Mapping[str, np.ndarray], fit: Fit
                   ) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - interface
        """``(boxes [N, 4] xyxy input pixels, scores [N, nc])`` of batch item 0."""
        raise NotImplementedError

    def decode(self, outputs: Mapping[str, np.ndarray], fit: Fit) -> Detections:
        cfg = self.config
        boxes, scores = self.candidates(outputs, fit)
        nc = scores.shape[1]
        if nc < 1:
            raise DecodeError(f"{self.kind} head has no class scores")
        if cfg.class_names and len(cfg.class_names) != nc:
            raise DecodeError(f"{self.kind} head has {nc} classes, the class names file "
                              f"{len(cfg.class_names)}")
        cls = scores.argmax(axis=1)
        best = scores[np.arange(len(scores)), cls]
        mask = best >= cfg.score_threshold  # NaN scores never pass
        boxes, best, cls = boxes[mask], best[mask], cls[mask]
        keep = nms(boxes, best, cls, iou_threshold=cfg.iou_threshold,
                   max_detections=cfg.max_detections, pre_nms_top_k=cfg.pre_nms_top_k,
                   class_agnostic=cfg.class_agnostic, backend=cfg.nms_backend)
        names = cfg.class_names
        cls = cls[keep].astype(np.int64)
        return Detections(boxes=fit.to_source(boxes[keep]), scores=best[keep].astype(np.float64),
                          classes=cls, labels=tuple(names[c] if names else str(int(c))
                                                    for c in cls))


def _batch0(name: str, arr: Any, rank: int) -> np.ndarray:
    a = np.asarray(arr)
    if a.ndim == rank + 1:
        if a.shape[0] != 1:
            raise DecodeError(f"output {name!r}: batch {a.shape[0]}; decoders take batch 1")
        a = a[0]
    if a.ndim != rank:
        raise DecodeError(f"output {name!r}: shape {list(np.shape(arr))}, expected rank "
                          f"{rank} (or {rank + 1} with batch 1)")
    if not np.issubdtype(a.dtype, np.floating):
        raise DecodeError(f"output {name!r}: dtype {a.dtype}, expected a float type")
    return a


def _pick(outputs: Mapping[str, np.ndarray], name: str, what: str) -> tuple[str, np.ndarray]:
    if name:
        if name not in outputs:
            raise DecodeError(f"no output {name!r} for the {what}; outputs: {sorted(outputs)}")
        return name, outputs[name]
    if len(outputs) == 0:
        raise DecodeError("the model has no outputs")
    first = next(iter(outputs))
    return first, outputs[first]


def cxcywh_to_xyxy(b: np.ndarray) -> np.ndarray:
    half = b[:, 2:4] * 0.5
    return np.concatenate([b[:, 0:2] - half, b[:, 0:2] + half], axis=1)


class YoloDecoder(Decoder):
    """The YOLOv8-style anchor-free head ``[1, 4 + nc, N]`` (see the module doc)."""

    kind = "yolo"

    def __init__(self, config: DecoderConfig | None = None, output: str = ""):
        super().__init__(config)
        self.output = output  # "" = the model's first output

    def candidates(self, outputs: Mapping[str, np.ndarray], fit: Fit
                   ) -> tuple[np.ndarray, np.ndarray]:
        name, arr = _pick(outputs, self.output, "yolo head")
        a = _batch0(name, arr, 2)
        nc = len(self.config.class_names)
        if nc and 4 + nc in a.shape:  # the class count tells the orientation
            transposed = a.shape[0] == 4 + nc and a.shape[1] != 4 + nc or a.shape == (
                4 + nc, 4 + nc)
        else:  # else the longer axis holds the candidates
            transposed = a.shape[0] < a.shape[1]
        if transposed:  # [4 + nc, N] -> [N, 4 + nc]
            a = a.T
        if a.shape[1] < 5:
            raise DecodeError(f"output {name!r}: {a.shape[1]} values per candidate, a yolo "
                              "head has 4 box values and at least one class")
        return cxcywh_to_xyxy(a[:, :4].astype(np.float64)), a[:, 4:]


class SsdDecoder(Decoder):
    """Decoded boxes ``[1, N, 4]`` plus scores ``[1, N, nc]`` (see the module doc)."""

    kind = "ssd"

    def __init__(self, config: DecoderConfig | None = None, boxes_output: str = "",
                 scores_output: str = "", box_format: str = "xyxy",
                 normalized: bool = False, background_class: int = -1):
        super().__init__(config)
        if box_format not in BOX_FORMATS:
            raise ValueError(f"box_format must be one of {BOX_FORMATS}, got {box_format!r}")
        self.boxes_output, self.scores_output = boxes_output, scores_output
        self.box_format, self.normalized = box_format, normalized
        self.background_class = background_class

    def _find(self, outputs: Mapping[str, np.ndarray]) -> tuple[str, str]:
        """The boxes and scores outputs: by name, else the one whose last dim is 4."""
        b, s = self.boxes_output, self.scores_output
        for n in (b, s):
            if n and n not in outputs:
                raise DecodeError(f"no output {n!r}; outputs: {sorted(outputs)}")
        if not b:
            fours = [n for n, v in outputs.items() if n != s and np.shape(v)[-1:] == (4,)]
            if len(fours) != 1:
                raise DecodeError("cannot tell the boxes output (last dim 4) among "
                                  f"{ {n: list(np.shape(v)) for n, v in outputs.items()} }; "
                                  "set boxes_output")
            b = fours[0]
        if not s:
            rest = [n for n in outputs if n != b]
            if len(rest) != 1:
                raise DecodeError(f"cannot tell the scores output among {sorted(rest)}; "
                                  "set scores_output")
            s = rest[0]
        return b, s

    def candidates(self, outputs: Mapping[str, np.ndarray], fit: Fit
                   ) -> tuple[np.ndarray, np.ndarray]:
        bn, sn = self._find(outputs)
        boxes = _batch0(bn, outputs[bn], 2).astype(np.float64)
        scores = _batch0(sn, outputs[sn], 2)
        if boxes.shape[1] != 4 or boxes.shape[0] != scores.shape[0]:
            raise DecodeError(f"boxes {list(boxes.shape)} and scores {list(scores.shape)} "
                              "must be [N, 4] and [N, nc]")
        if self.box_format == "cxcywh":
            boxes = cxcywh_to_xyxy(boxes)
        if self.normalized:  # [0, 1] of the model input
            w, h = fit.dst_w, fit.dst_h
            boxes = boxes * np.array([w, h, w, h], dtype=np.float64)
        if 0 <= self.background_class < scores.shape[1]:
            scores = scores.copy()
            scores[:, self.background_class] = -math.inf
        return boxes, scores


def make_decoder(kind: str, config: DecoderConfig | None = None, **options: Any
                 ) -> Decoder | None:
    """The decoder named ``kind`` (``DECODERS``; ``none`` -> None) with its options."""
    if kind == "none":
        return None
    if kind == "yolo":
        return YoloDecoder(config, **options)
    if kind == "ssd":
        return SsdDecoder(config, **options)
    raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {kind!r}")
