"""Real exported models that a registry package ships: PaddleOCR v4 (det, rec) and v2 (cls).

Why: the zoo is built by our own code; a runtime is only credible on models other
toolchains exported (Paddle2ONNX here: Constant-heavy graphs, HardSigmoid/HardSwish,
ConvTranspose and Resize in the detector, MatMul/ReduceMean attention in the recognizer).
The ONNX files come inside the PyPI wheel ``rapidocr_onnxruntime==1.4.4``, which ``make
setup`` installs without its dependencies (nothing is downloaded at run time, and the package
itself is never imported: only its data files are read).

Names: ``ocr_det`` (text detector, 1x3x320x320), ``ocr_rec`` (recognizer, 1x3x48x320),
``ocr_cls`` (direction classifier, depthwise, 1x3x48x192): the shapes of the CPU table in
issue 17.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

__all__ = ["PACKAGE", "available", "input_shape", "names", "path", "why_unavailable"]

PACKAGE = "rapidocr_onnxruntime"
_FILES = {
    "ocr_det": ("ch_PP-OCRv4_det_infer.onnx", (1, 3, 320, 320)),
    "ocr_rec": ("ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320)),
    "ocr_cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192)),
}


def names() -> list[str]:
    return list(_FILES)


def _models_dir() -> Path | None:
    spec = importlib.util.find_spec(PACKAGE)  # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "models"


def why_unavailable() -> str | None:
    """None when every model file is present, else what is missing and how to get it."""
    d = _models_dir()
    if d is None:
        return (f"the wheel {PACKAGE} is not installed: `make setup` installs it "
                f"(pip install --no-deps {PACKAGE}==1.4.4)")
    missing = [f for f, _ in _FILES.values() if not (d / f).is_file()]
    return f"missing in {d}: {missing}" if missing else None


def available() -> bool:
    return why_unavailable() is None


def path(name: str) -> Path:
    """The ONNX file of ``name``; FileNotFoundError saying how to install it."""
    if name not in _FILES:
        raise KeyError(f"unknown exported model {name!r}; known: {names()}")
    why = why_unavailable()
    if why:
        raise FileNotFoundError(why)
    d = _models_dir()
    assert d is not None
    return d / _FILES[name][0]


def input_shape(name: str) -> tuple[int, ...]:
    """The input shape the CPU figures use (the models' spatial dims are dynamic)."""
    return _FILES[name][1]


def as_path_str(name: str) -> str:
    return os.fspath(path(name))
