"""Memory-side contention between co-running kernels in the simulator (issue 13).

Why: SM sharing alone (the packing model of :func:`profiles.packing`) lets two kernels on
different SMs run as if the other did not exist. On a GPU they still share DRAM bandwidth
and the L2: REEF measured GPUStreams on DISB A at 1.84x the RT latency of RT-only, while
SM sharing alone gives +15 % here. This module adds a bandwidth share per resident kernel.

The model (one number per kernel, one running sum on the device):

* A kernel's *memory share* ``q`` is the fraction of the device's DRAM bandwidth it uses
  while running alone: ``q = min(1, traffic / (duration * bandwidth))`` with ``traffic =
  beta * compulsory bytes`` (the kernel's buffers: what its plan says it reads and writes).
* A batch of ``n`` of its blocks holds ``q * n / footprint`` of the bandwidth, where
  ``footprint`` is how many of its blocks are resident when it runs alone (so a kernel
  alone holds exactly ``q``). The device keeps the sum over resident batches.
* A batch placed while other kernels hold ``Q`` of the bandwidth runs
  ``(1 - q) + q * max(1, q + Q)`` times longer: its memory-bound part gets its fair share
  ``q / (q + Q)`` of an oversubscribed bus (no slowdown while ``q + Q <= 1``).

Named models (``SimDevice(contention=...)``):

* ``"none"``: SM sharing only (the simulator before issue 13; the unit tests' model).
* ``"bandwidth"``: ``beta = 1``, compulsory bytes only: the uncalibrated physics. The DISB
  kernels are compute bound by that measure (median ``q`` 0.01-0.03 on MI50 for the CNNs),
  so it predicts almost no contention: a lower bound.
* ``"calibrated"``, also named ``"paper"``: ``beta`` fitted so that ``streams`` on DISB A
  (``--gpu h100``) slows RT to REEF's measured 1.84x of ``rt_only`` (p50; docs/bench.md
  "Contention calibration" has the command and the fit). ``beta`` stands for the traffic
  compulsory bytes do not count: re-reads of tiles the L2 no longer holds once another
  kernel shares it.
* a *parameter file* (any name ending in ``.json``): ``beta`` fitted to measured GPU rows
  by ``av-infer sim refit-contention`` (:mod:`av_infer.bench.contention_fit`; format in
  :func:`load_params`, docs/sim_fidelity.md). It holds for the GPU it was fitted on only.

Limits, said plainly: batches are timed at placement (a snapshot, like the packing
model); batches already running are not re-timed when others arrive. A padded launch is
the exception that matters for DKP: its RT blocks are charged the bandwidth of the BE
blocks launched in the same grid (they arrive together by construction).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from av_infer.devices import sim_params
from av_infer.profiles import GpuSpec, gpu_spec

#: The traffic multiplier of the ``"calibrated"`` model per GPU, each fitted so that
#: ``streams`` on DISB A gives REEF's 1.84x RT p50 (docs/bench.md "Contention
#: calibration": h100 1.83x, mi50 1.84x). Both are the same memory shares ``q`` (beta is
#: proportional to the bandwidth: the REEF traces' durations are the same on every GPU).
CALIBRATED_BETA = {"mi50": 55.0, "h100": 180.0}

#: The named models (see the module docstring); "paper" is "calibrated" (REEF's figure).
MODELS = ("none", "bandwidth", "calibrated", "paper")

#: ``format`` of a contention parameter file (:func:`load_params`).
PARAMS_FORMAT = sim_params.FORMAT


def calibrated_beta(gpu: GpuSpec) -> float:
    """``beta`` of the calibrated model on ``gpu``: its fit, else MI50's memory shares."""
    if gpu.name in CALIBRATED_BETA:
        return CALIBRATED_BETA[gpu.name]
    return CALIBRATED_BETA["mi50"] * gpu.bandwidth_gbs / gpu_spec("mi50").bandwidth_gbs


def check_model(name: str, gpu: GpuSpec | str = "mi50") -> float | None:
    """The ``beta`` of contention model ``name`` on ``gpu`` (None: no contention): a name
    of :data:`MODELS`, or ``"beta=X"``: the bandwidth model with traffic multiplier X,
    what the calibration sweeps. ValueError for anything else."""
    if name == "none":
        return None
    if name == "bandwidth":
        return 1.0
    if name in ("calibrated", "paper"):
        return calibrated_beta(gpu_spec(gpu))
    if str(name).endswith(".json"):
        params = load_params(name)
        if params["gpu"] != gpu_spec(gpu).name:
            raise ValueError(f"contention parameters {name} were fitted on {params['gpu']}, "
                             f"the simulated GPU is {gpu_spec(gpu).name}")
        return float(params["beta"])
    key, sep, val = str(name).partition("=")
    if sep and key.strip() == "beta":
        try:
            beta = float(val)
        except ValueError:
            beta = math.nan
        if math.isfinite(beta) and beta > 0:
            return beta
    raise ValueError(f"unknown contention model {name!r}; choose one of "
                     f"{', '.join(MODELS)}, beta=X (X > 0) or a parameter FILE.json")


def load_params(path: str | Path) -> dict[str, Any]:
    """A contention parameter file: a JSON object ``{"format": 1, "kind": "contention",
    "model": "bandwidth-share", "gpu": GPUS key, "beta": X > 0, "fit": {...}}`` (``fit``:
    how it was obtained; informative). ValueError naming the file and the field when it is
    not one; FileNotFoundError when it does not exist."""
    p = Path(path)
    doc = sim_params.read(p, "contention", "bandwidth-share")
    beta = doc.get("beta")
    if not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"{p}: beta must be a number > 0, got {beta!r}")
    try:
        doc["gpu"] = gpu_spec(str(doc.get("gpu"))).name
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None
    return doc


def save_params(path: str | Path, gpu: str, beta: float, fit: dict[str, Any]) -> Path:
    """Write a parameter file :func:`load_params` reads (atomic)."""
    return sim_params.write(path, "contention", "bandwidth-share", gpu,
                            {"beta": float(beta)}, fit)


def describe(name: str, gpu: GpuSpec | str = "mi50") -> dict[str, Any]:
    """What a contention model name means on ``gpu``: ``{"name", "beta", "source"}``."""
    beta = check_model(name, gpu)
    if name == "none":
        src = "SM sharing only"
    elif name == "bandwidth":
        src = "compulsory bytes, uncalibrated"
    elif name in ("calibrated", "paper"):
        src = "paper: fitted to REEF's streams 1.84x on DISB A"
    elif str(name).endswith(".json"):
        fit = load_params(name).get("fit") or {}
        frm = fit.get("from", name)  # a path, or the list of paths of a multi-file fit
        frm = ", ".join(map(str, frm)) if isinstance(frm, list) else frm
        src = f"fitted to GPU measurements ({frm})"
    else:
        src = "explicit beta"
    return {"name": str(name), "beta": beta, "source": src}


def kernel_bytes(plan: Any, k: int) -> int:
    """Compulsory bytes of kernel ``k``: ``bytes_moved`` where the compiler recorded it,
    else the buffers a REEF trace kernel names (``args["storage"]``)."""
    kern = plan.kernels[k]
    b = int(getattr(kern, "bytes_moved", 0) or 0)
    if b > 0:
        return b
    storage = (getattr(kern, "args", None) or {}).get("storage", ())
    bufs = plan.buffers
    return sum(bufs[i].nbytes for i in storage if i in bufs)


def memory_shares(plan: Any, durations_us: list[float], bandwidth_gbs: float,
                  beta: float) -> list[float]:
    """Per kernel its memory share ``q`` alone (0..1) for traffic ``beta`` x compulsory."""
    bw = bandwidth_gbs * 1e9
    out = []
    for k, dur in enumerate(durations_us):
        t = max(dur, 1e-3) * 1e-6
        out.append(min(1.0, beta * kernel_bytes(plan, k) / (t * bw)))
    return out


def slowdown(q: float, other: float) -> float:
    """Time factor of a batch with memory share ``q`` beside ``other`` held by others."""
    tot = q + other
    return 1.0 - q + q * tot if tot > 1.0 else 1.0
