"""Greedy non-maximum suppression in numpy, per class, vectorised.

How: the ``pre_nms_top_k`` (default 1000) best candidates, best first. Up to
``MATRIX_MAX`` of them: their IoU matrix at once, then one boolean row operation per
candidate. More: each kept box's IoU with the candidates still alive is one vectorised step
that drops the ones it suppresses, so that loop runs once per *kept* box (at most
``max_detections``), not per candidate. All
classes go through one pass, each moved to its own region of the plane (torchvision's
``batched_nms`` offset), where boxes of different classes cannot overlap. Measured
against ONNX Runtime's NonMaxSuppression in docs/ros.md ("Detections").

Guaranteed: the result is exactly greedy NMS (ONNX ``NonMaxSuppression`` semantics: a box
is dropped when its IoU with a kept box of the same class is *greater than* the
threshold), in descending score order, at most ``max_detections`` boxes; boxes of
different classes never suppress each other (unless ``class_agnostic``). Ties in score keep
the lower index first (a stable sort).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

#: ``numpy`` (this module) or ``onnxruntime`` (ONNX Runtime's NonMaxSuppression operator,
#: one cached session): the same boxes (tests/detect/test_detect.py), measured in docs/ros.md.
BACKENDS = ("numpy", "onnxruntime")

#: Up to this many candidates one IoU matrix is cheaper than a step per kept box
#: (scripts/bench_detect.py: 100 candidates 0.8 ms as a matrix, 2.5 ms stepwise; 1000
#: candidates 29 ms as a matrix, 4.4 ms stepwise).
MATRIX_MAX = 256


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in ``a`` [N, 4] with every box in ``b`` [M, 4] (xyxy) -> [N, M].

    Degenerate boxes (zero or negative area) have IoU 0 with everything."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    iw = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    ih = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    inter = np.clip(iw, 0, None) * np.clip(ih, 0, None)
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(union > 0, inter / union, 0.0)
    return iou


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray | None = None, *,
        iou_threshold: float = 0.45, max_detections: int = 100,
        pre_nms_top_k: int = 1000, class_agnostic: bool = False,
        backend: str = "numpy") -> np.ndarray:
    """Indices into ``boxes`` [N, 4] (xyxy) of the boxes kept, best score first.

    ``scores`` [N]; ``classes`` [N] integer class ids (None: one class). Only the
    ``pre_nms_top_k`` best-scoring candidates take part (as Isaac ROS and TensorRT's
    EfficientNMS do); the caller applies its score threshold first.
    """
    boxes = np.asarray(boxes)
    scores = np.asarray(scores)
    n = scores.shape[0]
    if boxes.shape != (n, 4):
        raise ValueError(f"boxes must be [N, 4] for N={n} scores, got {boxes.shape}")
    if not 0.0 <= iou_threshold <= 1.0:
        raise ValueError(f"iou_threshold must be in [0, 1], got {iou_threshold}")
    if max_detections < 1 or pre_nms_top_k < 1:
        raise ValueError("max_detections and pre_nms_top_k must be >= 1")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if n == 0:
        return np.empty(0, dtype=np.intp)
    order = np.argsort(-scores, kind="stable")[:pre_nms_top_k]
    if backend == "onnxruntime":
        cls = (np.zeros(len(order), np.intp) if classes is None or class_agnostic
               else np.asarray(classes)[order])
        return order[_nms_onnxruntime(boxes[order], scores[order], cls, iou_threshold,
                                      max_detections)]
    b = boxes[order].astype(np.float64)
    if classes is not None and not class_agnostic:
        # each class in its own region of the plane: boxes of different classes never
        # overlap, so one pass serves every class (torchvision's batched_nms trick)
        span = float(np.max(np.abs(b))) * 2.0 + 1.0 if b.size else 1.0
        b = b + (np.asarray(classes)[order].astype(np.float64) * span)[:, None]
    if len(order) <= MATRIX_MAX:  # small: one IoU matrix, then a pass over its rows
        over = box_iou(b, b) > iou_threshold
        alive = np.ones(len(order), dtype=bool)
        keep = []
        for i in range(len(order)):
            if alive[i]:
                keep.append(i)
                if len(keep) == max_detections:
                    break
                alive &= ~over[i]
        return order[np.asarray(keep, dtype=np.intp)]
    x1, y1, x2, y2 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    area = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    rest = np.arange(len(order))
    keep = []
    while rest.size and len(keep) < max_detections:
        i, rest = rest[0], rest[1:]
        keep.append(int(i))
        if not rest.size:
            break
        iw = np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest])
        ih = np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest])
        inter = np.clip(iw, 0, None) * np.clip(ih, 0, None)
        union = area[i] + area[rest] - inter
        with np.errstate(divide="ignore", invalid="ignore"):
            over = np.where(union > 0, inter / union, 0.0) > iou_threshold
        rest = rest[~over]
    return order[np.asarray(keep, dtype=np.intp)]


@lru_cache(maxsize=1)
def ort_nms_session() -> Any:
    """A one-operator ONNX Runtime session: NonMaxSuppression over [1, N, 4] boxes and
    [1, C, N] scores (one thread: it runs on the node's executor thread)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max", "iou", "thr"],
                            ["selected"])
    g = helper.make_graph(
        [node], "nms",
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, None, 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, None, None]),
         helper.make_tensor_value_info("max", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("iou", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("thr", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("selected", TensorProto.INT64, [None, 3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)], ir_version=8)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


_FLOOR = np.float32(np.finfo(np.float32).min)


def _nms_onnxruntime(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray,
                     iou_threshold: float, max_detections: int) -> np.ndarray:
    """Indices into the (score-sorted) candidates that ONNX Runtime's operator keeps: one
    score row per class present (-inf elsewhere, below the threshold), each class's
    selection capped at ``max_detections``, merged best first (stable), then capped."""
    present, col = np.unique(classes, return_inverse=True)
    k = len(scores)
    s = np.full((1, len(present), k), -np.inf, np.float32)
    s[0, col, np.arange(k)] = scores
    sel = ort_nms_session().run(None, {
        "boxes": np.ascontiguousarray(boxes, np.float32)[None], "scores": s,
        "max": np.array([max_detections], np.int64),
        "iou": np.array([iou_threshold], np.float32),
        "thr": np.array([_FLOOR], np.float32)})[0]
    idx = np.sort(sel[:, 2])  # candidates are score-sorted: index order is score order
    return idx[:max_detections].astype(np.intp)
