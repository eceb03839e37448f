"""Detections out: the image nodes' decoder settings and ``vision_msgs/Detection2DArray``.

The decoding itself is ROS-free (``av_infer.detect``); this module holds what ties it to a
node: building a decoder from the node's parameters (so a refused setting changes nothing)
and the message, laid out as Isaac ROS's decoders publish it: one ``Detection2D`` per box
with the image's header, the box centre and size in the camera image's pixels
(``bbox.center.theta`` 0), one ``ObjectHypothesisWithPose`` whose ``class_id`` is the class
name (the class index as text without a names file) and ``score`` the detector's score.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
from av_infer_nodes.common import ros_text
from std_msgs.msg import Header
from vision_msgs.msg import Detection2D, Detection2DArray, ObjectHypothesisWithPose

from av_infer.detect import (
    BOX_FORMATS,
    DECODERS,
    Decoder,
    DecoderConfig,
    Detections,
    load_class_names,
    make_decoder,
)
from av_infer.tensor_codec import write_detections

#: Node parameters read by :func:`decoder_from_params` (the image node declares them).
DECODER_PARAMS = ("decoder", "score_threshold", "iou_threshold", "max_detections",
                  "class_names_file", "box_format", "boxes_normalized", "background_class",
                  "nms_backend")


def decoder_from_params(p: Mapping[str, Any]) -> Decoder | None:
    """The decoder the parameters describe (None for ``decoder: none``); raises
    ``ValueError``/``OSError`` naming the bad value, before anything changes."""
    kind = p["decoder"]
    if kind not in DECODERS:
        raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {kind!r}")
    if p["box_format"] not in BOX_FORMATS:
        raise ValueError(f"box_format must be one of {', '.join(BOX_FORMATS)}")
    names: list[str] = []
    if p["class_names_file"]:
        try:
            names = load_class_names(p["class_names_file"])
        except OSError as exc:
            raise ValueError(f"cannot read class_names_file {p['class_names_file']!r}: "
                             f"{exc.strerror or exc}") from None
        if not names:
            raise ValueError(f"class_names_file {p['class_names_file']!r} names no class")
    cfg = DecoderConfig(score_threshold=float(p["score_threshold"]),
                        iou_threshold=float(p["iou_threshold"]),
                        max_detections=int(p["max_detections"]), class_names=names,
                        nms_backend=p["nms_backend"])
    if kind == "ssd":
        return make_decoder(kind, cfg, box_format=p["box_format"],
                            normalized=bool(p["boxes_normalized"]),
                            background_class=int(p["background_class"]))
    return make_decoder(kind, cfg)


def detections_cdr(dets: Detections, stamp: tuple[int, int], frame_id: str) -> bytes | None:
    """``dets`` as the serialised ``Detection2DArray`` :func:`detections_msg` builds (the
    header ``stamp``/``frame_id``), written without message objects
    (``ros_cdr.write_detections``): the bytes ``Publisher.publish`` sends as they are. Why:
    built as messages, each detection costs ~57 µs of Python on the dev VM (a ``Detection2D``,
    its ``ObjectHypothesisWithPose`` with a 36-double covariance, rclpy's conversion), i.e.
    5.3 ms a frame for 100 boxes; written here, a few µs for all of them (docs/ros.md,
    "Detections"). None where a label or the frame id holds a NUL (the message then)."""
    labels = [_label_bytes(lab) for lab in dets.labels]
    if "\x00" in frame_id or None in labels:
        return None
    boxes = np.ascontiguousarray(dets.boxes, dtype=np.float64).reshape(-1, 4)
    scores = np.ascontiguousarray(dets.scores, dtype=np.float64).reshape(-1)
    return write_detections(int(stamp[0]), int(stamp[1]), ros_text(frame_id).encode(),
                            boxes, scores, labels)


@functools.lru_cache(maxsize=4096)
def _label_bytes(label: str) -> bytes | None:
    """A class label as ``class_id``'s UTF-8 bytes (``ros_text``), None if it holds a NUL;
    cached: a detector's labels are its few class names."""
    text = ros_text(str(label))
    return None if "\x00" in text else text.encode()


def detections_msg(dets: Detections, header: Header) -> Detection2DArray:
    """``dets`` (boxes in the image's pixels) as a ``Detection2DArray`` with ``header``."""
    out = []
    for (x1, y1, x2, y2), score, label in zip(dets.boxes.tolist(), dets.scores.tolist(),
                                              dets.labels):
        d = Detection2D(header=header)
        d.bbox.center.position.x = (x1 + x2) * 0.5
        d.bbox.center.position.y = (y1 + y2) * 0.5
        d.bbox.size_x = x2 - x1
        d.bbox.size_y = y2 - y1
        hyp = ObjectHypothesisWithPose()
        hyp.hypothesis.class_id = label
        hyp.hypothesis.score = float(score)
        d.results = [hyp]
        out.append(d)
    return Detection2DArray(header=header, detections=out)
