"""Detections out: the image nodes' decoder settings and ``vision_msgs/Detection2DArray``.

The decoding itself is ROS-free (``av_infer.detect``); this module holds what ties it to a
node: building a decoder from the node's parameters (so a refused setting changes nothing)
and the message, laid out as Isaac ROS's decoders publish it: one ``Detection2D`` per box
with the image's header, the box centre and size in the camera image's pixels
(``bbox.center.theta`` 0), one ``ObjectHypothesisWithPose`` whose ``class_id`` is the class
name (the class index as text without a names file) and ``score`` the detector's score.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
