"""Detections out: detector-head decoders, per-class NMS and the image <-> input geometry.

Pure numpy (importable without ROS); the perception node (``nodes/image_node.py``) turns
:class:`Detections` into ``vision_msgs/Detection2DArray`` (``nodes/detections.py``).
See docs/ros.md, "Detections".
"""

from av_infer.detect.decoders import (
    BOX_FORMATS,
    DECODERS,
    DecodeError,
    Decoder,
    DecoderConfig,
    Detections,
    SsdDecoder,
    YoloDecoder,
    load_class_names,
    make_decoder,
)
from av_infer.detect.geometry import FIT_MODES, Fit, fit
from av_infer.detect.nms import BACKENDS as NMS_BACKENDS
from av_infer.detect.nms import box_iou, nms

__all__ = ["BOX_FORMATS", "DECODERS", "FIT_MODES", "NMS_BACKENDS", "DecodeError", "Decoder",
           "DecoderConfig", "Detections", "Fit", "SsdDecoder", "YoloDecoder", "box_iou", "fit",
           "load_class_names", "make_decoder", "nms"]
