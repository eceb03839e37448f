"""Renders tests/fixtures/layout_page.jpg: a document page for the layout detector.

The page (a title, paragraphs, a photograph with a caption, a table) is drawn with
matplotlib; the photograph is matplotlib's own sample ``grace_hopper.jpg``. Committed as a
fixture (the tests and the demo read the JPEG, they do not run this); kept here so the
fixture can be made again: ``.venv/bin/python scripts/make_layout_fixture.py``.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.cbook as cbook  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "layout_page.jpg"

TEXT = ("Real-time inference for automated driving shares one accelerator between "
        "perception models with deadlines and best-effort monitoring work. The runtime "
        "orders requests by deadline, preempts best-effort kernels and pads launches so "
        "that the camera pipeline keeps its frame rate while the remaining capacity serves "
        "everything else. This page is a test image for the document layout detector.")


def main(out: Path = OUT) -> Path:
    fig = plt.figure(figsize=(6.08, 8.0), dpi=100)  # 608 x 800 px, the detector's input
    fig.text(0.08, 0.93, "Deadline-aware inference on a shared GPU", fontsize=15,
             weight="bold")
    y = 0.88
    for para in (TEXT, TEXT):
        for line in textwrap.wrap(para, 92):
            fig.text(0.08, y, line, fontsize=7.2)
            y -= 0.018
        y -= 0.012
    with cbook.get_sample_data("grace_hopper.jpg") as f:
        img = plt.imread(f)
    ax = fig.add_axes((0.25, 0.36, 0.5, 0.3))
    ax.imshow(img)
    ax.axis("off")
    fig.text(0.28, 0.335, "Figure 1. A photograph placed in the page.", fontsize=7.5)
    rows = [["model", "p50 (ms)", "p99 (ms)"], ["resnet50", "2.1", "3.4"],
            ["yolo", "4.8", "6.0"], ["bert", "7.3", "9.9"]]
    tax = fig.add_axes((0.2, 0.1, 0.6, 0.16))
    tax.axis("off")
    tax.table(cellText=rows, loc="center", cellLoc="center")
    fig.text(0.33, 0.275, "Table 1. Latency per model.", fontsize=7.5)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, pil_kwargs={"quality": 90})
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
