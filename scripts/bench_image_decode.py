"""Decode time of a 1280x720 camera frame (JPEG and PNG) with the libraries the image nodes
could use for ``sensor_msgs/CompressedImage``: OpenCV (opencv-python-headless), simplejpeg
and Pillow. The choice in ``nodes/compressed.py`` follows these numbers (docs/ros.md).

    .venv/bin/python scripts/bench_image_decode.py [--repeat 200] [--json -]

The frame: matplotlib's sample photograph stretched to 1280x720 with sensor-like noise,
JPEG quality 90 (4:2:0) and PNG (level 1, as image_transport's png plugin defaults to 1..9).
Each decoder returns an RGB uint8 HxWx3 array; the results are checked to agree.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time

import numpy as np


def frame() -> np.ndarray:
    import matplotlib.cbook as cbook
    from PIL import Image

    with cbook.get_sample_data("grace_hopper.jpg") as f:
        img = Image.open(f).convert("RGB").resize((1280, 720), Image.BILINEAR)
    rng = np.random.default_rng(0)
    arr = np.asarray(img).astype(np.int16) + rng.integers(-6, 7, (720, 1280, 3))
    return np.clip(arr, 0, 255).astype(np.uint8)


def _time(fn, repeat: int) -> dict[str, float]:
    fn()
    t = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t.append((time.perf_counter() - t0) * 1e3)
    return {"p50_ms": round(float(np.percentile(t, 50)), 3),
            "p90_ms": round(float(np.percentile(t, 90)), 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--json", default=None, help="'-': JSON to stdout")
    a = ap.parse_args(argv)

    import cv2
    from PIL import Image

    try:  # measured once for the choice; not a dependency (pip install simplejpeg==1.9.0)
        import simplejpeg
    except ImportError:
        simplejpeg = None

    cv2.setNumThreads(1)
    rgb = frame()
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=90)
    jpeg = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG", compress_level=1)
    png = buf.getvalue()

    def cv(data: bytes) -> np.ndarray:
        return cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR),
                            cv2.COLOR_BGR2RGB)

    def pil(data: bytes) -> np.ndarray:
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

    def sj(data: bytes) -> np.ndarray:
        return simplejpeg.decode_jpeg(data, colorspace="RGB")

    ref = pil(jpeg)
    for fn in (cv, sj) if simplejpeg else (cv,):  # the same image (libjpeg builds differ)
        assert np.abs(fn(jpeg).astype(int) - ref).max() <= 8
    assert np.array_equal(cv(png), pil(png))
    rows = {"jpeg_bytes": len(jpeg), "png_bytes": len(png),
            "jpeg": {"opencv": _time(lambda: cv(jpeg), a.repeat),
                     **({"simplejpeg": _time(lambda: sj(jpeg), a.repeat)} if simplejpeg
                        else {}),
                     "pillow": _time(lambda: pil(jpeg), a.repeat)},
            "png": {"opencv": _time(lambda: cv(png), a.repeat // 4 or 1),
                    "pillow": _time(lambda: pil(png), a.repeat // 4 or 1)},
            "versions": {"opencv": cv2.__version__,
                         "simplejpeg": simplejpeg.__version__ if simplejpeg else None,
                         "pillow": Image.__version__}}
    text = json.dumps(rows, indent=1)
    print(text)
    if a.json and a.json != "-":
        with open(a.json, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
