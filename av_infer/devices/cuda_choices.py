"""Recorded per-op choices of ``vendor="auto"``: the same model runs the same ops the same
way after every load.

Why: under ``CudaDevice(vendor="auto")`` each eligible conv/gemm kernel is timed both ways
at load (ours and the vendor library's) and the faster path runs. Timed afresh on every
load, near-ties flip: on the H200's second lease (docs/gpu_results.md, 2026-11-27) the
same tree chose 89 vs 97 vendor ops for resnet152 FP32 and 79 vs 69 for inception_v3
FP16 between two loads, which moved resnet152 FP16's kernel time from 8.64 to 13.38 ms and
inception_v3 FP16's error against ONNX Runtime from 9.4e-3 to 1.9e-2. A deployment cannot
certify numerics and speed that a load-time race decides. TensorRT answers the same
problem with a timing cache; this is ours.

**What is recorded**: per kernel index, the path chosen (``vendor`` | ``own``) and the two
medians it was chosen by. **Key** (:func:`choice_key`): everything that can change the
answer: the model's CUDA source (its kernels, shapes and tiles), its precision, the GPU
(architecture, SM count and name), the vendor libraries' versions, the vendor workspace
per stream (the algorithms allowed depend on it) and the decision rule's version. Another
GPU, library or model is another key, so a record never crosses them.

**Where**: in the device's compile cache (``kernels.cuda_compile.CompileCache``: the same
directory, ``$AV_INFER_CUDA_CACHE`` else ``~/.cache/av_infer/cuda``; checksummed files
written atomically; a bad file is a miss). A deployment that wants the choices fixed ships
that directory, as it ships the compiled modules.

**Guarantees**: with ``choices="cache"`` (the default) a model whose key is recorded runs
exactly the recorded paths (the report says ``chosen: cached`` and repeats the recorded
times); a miss measures, decides and records. ``choices="measure"`` measures at every load
and records nothing (the old behaviour). A record that does not decode, or names kernels
the model does not have, is ignored and measured over.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from av_infer.kernels.cuda_compile import CompileCache

log = logging.getLogger(__name__)

__all__ = ["AUTO_MARGIN", "AUTO_REPEATS", "CHOICE_MODES", "choice_key", "decide", "load", "store"]

#: ``CudaDevice(vendor_choices=...)``: ``cache`` reuse a recorded choice, else measure and
#: record; ``measure`` measure at every load, record nothing
CHOICE_MODES = ("cache", "measure")
#: timed launches per path and op at load (after one warm-up), compared by their medians
AUTO_REPEATS = 5
#: ours runs an op only when its median is at least this much below the vendor's: within
#: the timing's noise the library's pinned, deterministic algorithm is kept
AUTO_MARGIN = 0.05
#: bump when the decision rule changes: old records then miss instead of serving the old rule
RULE_VERSION = 1


def decide(own_us: float, vendor_us: float) -> str:
    """``own`` when ours is faster than the vendor's op by more than :data:`AUTO_MARGIN`,
    else ``vendor``."""
    return "own" if own_us < vendor_us * (1.0 - AUTO_MARGIN) else "vendor"


def choice_key(source: str, precision: str, gpu: Mapping[str, Any],
               versions: Mapping[str, int], workspace_bytes: int) -> str:
    """SHA-256 over every input that can change a choice (module docstring)."""
    h = hashlib.sha256()
    parts = ("vendor-choices", f"rule{RULE_VERSION}", f"r{AUTO_REPEATS}m{AUTO_MARGIN}",
             precision, json.dumps(dict(gpu), sort_keys=True),
             json.dumps(dict(versions), sort_keys=True), str(int(workspace_bytes)), source)
    for p in parts:
        h.update(p.encode())
        h.update(b"\0\1")
    return h.hexdigest()


def load(cache: CompileCache, key: str, kernels: set[int]) -> dict[int, dict[str, Any]] | None:
    """The recorded choices of ``key`` (kernel index -> {"path", "own_us", "vendor_us"}), or
    None for a miss (no record, a record that does not decode, or one naming kernels outside
    ``kernels``, the model's eligible ones)."""
    raw = cache.load(key)
    if raw is None:
        return None
    try:
        doc = json.loads(raw.decode())
        out = {int(k): {"path": str(v["path"]), "own_us": float(v["own_us"]),
                        "vendor_us": float(v["vendor_us"])}
               for k, v in doc["ops"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("vendor choice record %s does not decode (%s): measuring again", key[:12], e)
        return None
    if not set(out) <= kernels or any(v["path"] not in ("vendor", "own") for v in out.values()):
        log.warning("vendor choice record %s does not fit the model: measuring again", key[:12])
        return None
    return out


def store(cache: CompileCache, key: str, ops: Mapping[int, Mapping[str, Any]],
          model: str) -> None:
    """Record ``ops`` under ``key``; a failed write is logged and costs the next load a
    measurement, nothing else."""
    doc = {"format": 1, "model": model,
           "ops": {str(k): {"path": v["path"], "own_us": v["own_us"],
                            "vendor_us": v["vendor_us"]} for k, v in sorted(ops.items())}}
    try:
        cache.store(key, json.dumps(doc, sort_keys=True).encode())
    except OSError as e:
        log.warning("vendor choices of %s not recorded (%s): the next load measures again",
                    model, e)
