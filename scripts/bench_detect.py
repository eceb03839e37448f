"""Micro-benchmark of av_infer.detect: its NMS backends (numpy; ONNX Runtime's operator
behind ``nms(backend="onnxruntime")``) and the bare operator on the same candidates, and a
whole YOLO decode of the real detector's output size with each backend.

    .venv/bin/python scripts/bench_detect.py [--repeat 200] [--json -]

Candidates: random boxes in a 640x640 input, 80 classes, scores uniform in [0, 1] (the
case after a score threshold: every candidate takes part). Prints p50/p90 in ms.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial

import numpy as np


def _time(fn, repeat: int) -> dict[str, float]:
    fn()  # warm
    t = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t.append((time.perf_counter() - t0) * 1e3)
    return {"p50_ms": round(float(np.percentile(t, 50)), 4),
            "p90_ms": round(float(np.percentile(t, 90)), 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--json", default=None, help="write JSON here ('-': stdout)")
    a = ap.parse_args(argv)

    from av_infer.detect import DecoderConfig, YoloDecoder, fit, nms
    from av_infer.detect.nms import ort_nms_session

    rng = np.random.default_rng(0)
    nc = 80
    rows = []
    for n in (100, 1000, 5000):
        xy = rng.uniform(0, 640, (n, 2))
        wh = rng.uniform(8, 160, (n, 2))
        boxes = np.concatenate([xy, xy + wh], axis=1).astype(np.float32)
        scores = rng.uniform(0, 1, n).astype(np.float32)
        cls = rng.integers(0, nc, n)
        r = {"candidates": n, "pre_nms_top_k": 1000,
             "numpy": _time(partial(nms, boxes, scores, cls, iou_threshold=0.45,
                                    max_detections=100), a.repeat),
             "nms_backend_onnxruntime": _time(partial(nms, boxes, scores, cls,
                                                      iou_threshold=0.45, max_detections=100,
                                                      backend="onnxruntime"), a.repeat)}
        sess = ort_nms_session()  # the backend's own session, called bare
        s = np.full((1, nc, n), -1.0, np.float32)
        s[0, cls, np.arange(n)] = scores
        feed = {"boxes": boxes[None], "scores": s, "max": np.array([100], np.int64),
                "iou": np.array([0.45], np.float32), "thr": np.array([0.0], np.float32)}
        r["onnxruntime_1thread_all_candidates"] = _time(partial(sess.run, None, feed),
                                                        a.repeat)
        rows.append(r)
    # a whole decode: YOLOv8 layout, the real detector's size (10105 candidates, 10 classes)
    n, nc = 10105, 10
    out = np.zeros((1, 4 + nc, n), np.float32)
    out[0, :2] = rng.uniform(0, 608, (2, n))
    out[0, 2:4] = rng.uniform(8, 120, (2, n))
    out[0, 4:] = rng.uniform(0, 1, (nc, n)) ** 8  # mostly low scores, as a detector's are
    f = fit(720, 1280, 800, 608, "letterbox")
    kept = int((out[0, 4:].max(axis=0) >= 0.25).sum())
    row = {"yolo_decode": "[1, 14, 10105]", "above_threshold": kept}
    for backend in ("numpy", "onnxruntime"):
        dec = YoloDecoder(DecoderConfig(score_threshold=0.25, nms_backend=backend))
        row[backend] = _time(partial(dec.decode, {"o": out}, f), a.repeat)
    rows.append(row)
    text = json.dumps(rows, indent=1)
    if a.json == "-":
        print(text)
    else:
        for r in rows:
            print(r)
        if a.json:
            with open(a.json, "w") as fh:
                fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
