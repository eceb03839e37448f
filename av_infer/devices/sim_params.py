"""The simulator's fitted parameter files (``--contention FILE``, ``--host FILE``, ``--pad
FILE``): one JSON envelope, read and written here so every kind refuses the same mistakes
the same way, and one resolution of a model named by an option (:func:`resolve`).

``{"format": 1, "kind": K, "model": M, "gpu": GPUS key, <the model's fields>, "fit": {...}}``
(``fit``: how the numbers were obtained; informative). The model's own fields are checked
by its module (``sim_contention``, ``sim_host``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from av_infer.profiles import atomic_write_text, gpu_spec

__all__ = ["FORMAT", "read", "resolve", "write"]

FORMAT = 1


def read(path: str | Path, kind: str, model: str) -> dict[str, Any]:
    """The document of a ``kind`` parameter file for ``model``. FileNotFoundError when it
    does not exist; ValueError naming the file and the field when it is not one."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{kind} parameter file {p} does not exist")
    try:
        doc = json.loads(p.read_text())
    except ValueError as e:
        raise ValueError(f"{p}: not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        raise ValueError(f"{p}: not a {kind} parameter file (kind must be {kind!r})")
    if doc.get("format") != FORMAT:
        raise ValueError(f"{p}: format {doc.get('format')!r} is not {FORMAT}")
    if doc.get("model") != model:
        raise ValueError(f"{p}: model {doc.get('model')!r} is not {model!r}")
    return doc


def write(path: str | Path, kind: str, model: str, gpu: str, fields: dict[str, Any],
          fit: dict[str, Any]) -> Path:
    """Write a file :func:`read` reads (atomic); ``gpu`` is stored as its GPUS key."""
    doc = {"format": FORMAT, "kind": kind, "model": model, "gpu": gpu_spec(gpu).name,
           **fields, "fit": fit}
    atomic_write_text(path, json.dumps(doc, indent=1))
    return Path(path)


def resolve(value: Any, cls: type, load: Callable[[Any], Any], gpu: Any, what: str,
            choices: str, verb: str) -> Any:
    """The model an option names: an instance of ``cls`` as it is, or a parameter file
    ``FILE.json`` read by ``load``; ValueError (before anything is set up) for anything
    else, naming ``choices``, and for a model whose ``gpu`` is not the simulated ``gpu``
    (``what`` parameters ... were ``verb`` on ...)."""
    if isinstance(value, cls):
        model = value
    elif str(value).endswith(".json"):
        model = load(value)
    else:
        raise ValueError(f"unknown {what} model {value!r}; choose {choices}")
    name = gpu_spec(gpu).name
    if model.gpu is not None and model.gpu != name:
        raise ValueError(f"{what} parameters {value} were {verb} on {model.gpu}, the "
                         f"simulated GPU is {name}")
    return model
