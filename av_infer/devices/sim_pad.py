"""What a padded (DKP) launch costs the RT kernel in the simulator, per model (issue 33).

Why: the simulator charged every padded launch REEF's figure, ``GpuSpec.pad_overhead``
(0.8 %, REEF Fig. 18a: the dispatcher's branch on the block index). On the H200 our padded
dispatcher is much slower than that, and the cost differs by model: with no BE part at all
(REEF Fig. 18a's shape, ``scripts/gpu_pad_select_check.py``, docs/gpu_results.md "The
padded dispatcher's cost") vgg19 +21.6 %, resnet152 +21.9 %, densenet201 +17.7 %,
inception_v3 +23.4 %, distilbert -15.0 % under ``pad_select=parts``. Every fit of the
contention and host models missed the ``reef_dkp`` cells by that much
(docs/bench.md "The second H200 lease"). This module makes the cost a parameter of the
simulator, the way :mod:`devices.sim_contention` and :mod:`devices.sim_host` are.

The model: a padded launch of kernel ``k`` of a plan named ``m`` runs its RT blocks
``1 + overhead[m]`` times longer than the kernel's block time (where the simulator charged
``1 + gpu.pad_overhead``: ``SimDevice``, point 6); a model the file does not name gets
``default`` (None: ``gpu.pad_overhead``, REEF's figure). ``overhead`` is a fraction and may
be negative (> -1): distilbert's padded kernels ran faster on the H200.

Sources of a parameter file (``av-infer bench --refit-pad``, :mod:`bench.pad_fit`):
the GPU's no-BE padded overhead per model read from ``gpu_pad_select_check.py``'s output
(its JSON document or the ``gpu_check.log`` that prints it), or one multiplier fitted to
the ``reef_dkp`` rows of DISB runs measured on a GPU.

Off by default (``pad=None``/``"none"``: every timeline as before this module). On with a
parameter file (``SimDevice(pad="FILE.json")``, ``av-infer bench --pad FILE.json``) or a
:class:`PadModel`.

Limits, said plainly: one factor per model, on every padded kernel of it alike (the GPU
measured the model's whole request, not each kernel); the BE parts' blocks of a padded grid
are not charged it (they already run at the grid's occupancy); the numbers hold for the GPU,
the tree and the ``pad_select`` they were measured with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from av_infer.devices import sim_params
from av_infer.profiles import gpu_spec

__all__ = ["PARAMS_FORMAT", "PadModel", "check_pad", "describe", "load_params",
           "save_params"]

#: ``format`` of a pad parameter file (:func:`load_params`).
PARAMS_FORMAT = sim_params.FORMAT

_KIND, _MODEL = "pad", "per-model-overhead"


def _check_overhead(what: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or v <= -1.0:
        raise ValueError(f"pad model: {what} must be a number > -1, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class PadModel:
    """Per model name the relative slowdown of its RT kernels in a padded launch
    (``overhead``), ``default`` for the others (None: the GPU's ``pad_overhead``);
    ``gpu``: the GPUS key it was measured on (None: any)."""

    overhead: Mapping[str, float] = field(default_factory=dict)
    default: float | None = None
    gpu: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.overhead, Mapping):
            raise ValueError("pad model: overhead must map model names to numbers")
        clean = {str(m): _check_overhead(f"overhead[{m!r}]", v)
                 for m, v in self.overhead.items()}
        object.__setattr__(self, "overhead", clean)
        if self.default is not None:
            object.__setattr__(self, "default", _check_overhead("default", self.default))

    def factor(self, model: str, gpu: Any) -> float:
        """Time factor of ``model``'s RT blocks in a padded launch on ``gpu``."""
        ov = self.overhead.get(model)
        if ov is None:
            ov = self.default if self.default is not None else gpu_spec(gpu).pad_overhead
        return 1.0 + ov

    def scaled(self, s: float) -> PadModel:
        """Every overhead (and ``default`` where set) times ``s``."""
        return PadModel({m: v * s for m, v in self.overhead.items()},
                        None if self.default is None else self.default * s, self.gpu)


def check_pad(pad: str | PadModel | None, gpu: str | Any = "mi50") -> PadModel | None:
    """The pad model ``pad`` names on ``gpu`` (None: REEF's figure, ``gpu.pad_overhead``,
    for every model): ``None``/``"none"``/``"paper"``, a :class:`PadModel` or a parameter
    file ``FILE.json``. ValueError for anything else and for a file measured on another
    GPU, before anything is set up; FileNotFoundError for a missing file."""
    if pad is None or pad in ("none", "paper"):
        return None
    return sim_params.resolve(pad, PadModel, load_params, gpu, "pad",
                              "paper (REEF's GpuSpec.pad_overhead) or a parameter FILE.json "
                              "(av-infer bench --refit-pad)", "measured")


def load_params(path: str | Path) -> PadModel:
    """A pad parameter file: ``{"format": 1, "kind": "pad", "model":
    "per-model-overhead", "gpu": GPUS key, "overhead": {model: x > -1}, "default": x or
    null, "fit": {...}}`` (``fit``: how it was obtained; informative). ValueError naming
    the file and the field when it is not one; FileNotFoundError when it does not exist."""
    p = Path(path)
    doc = sim_params.read(p, _KIND, _MODEL)
    try:
        gpu = gpu_spec(str(doc.get("gpu"))).name
        ov = doc.get("overhead")
        if not isinstance(ov, dict):
            raise ValueError(f"overhead must be an object of model: number, got {ov!r}")
        return PadModel(ov, doc.get("default"), gpu)
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None


def save_params(path: str | Path, model: PadModel, fit: dict[str, Any]) -> Path:
    """Write a parameter file :func:`load_params` reads (atomic)."""
    if model.gpu is None:
        raise ValueError("a pad parameter file names the GPU it was measured on")
    return sim_params.write(path, _KIND, _MODEL, model.gpu,
                            {"overhead": dict(model.overhead), "default": model.default},
                            fit)


def describe(pad: str | PadModel | None, gpu: str | Any = "mi50") -> dict[str, Any]:
    """What a pad setting means on ``gpu``: ``{"name", "overhead", "default"}``
    (``default``: what models not named get, the GPU's ``pad_overhead`` when unset)."""
    model = check_pad(pad, gpu)
    name = "paper" if pad in (None, "none") else (
        str(pad) if not isinstance(pad, PadModel) else "explicit")
    if model is None:
        return {"name": name, "overhead": {}, "default": gpu_spec(gpu).pad_overhead}
    return {"name": name, "overhead": dict(model.overhead),
            "default": model.default if model.default is not None
            else gpu_spec(gpu).pad_overhead}
