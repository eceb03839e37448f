"""The host side of a request in the simulator: start work and one busy host (issue 33).

Why: the simulator times kernels and launches (``GpuSpec.launch_us``, 4 µs on h100/h200)
but not the host work around them. On the H200 run of 2026-11-27 (tree c082c73) a
request's first kernel started ~1 ms after its arrival even with nothing else running, and
up to 3.4-11 ms after it at p99 under BE load, while the GPU's device-side RT slowdown
under ``reef`` was 1.00-1.02 (docs/sim_fidelity.md §6). That is the cuda device's host
path: at that tree ``CudaDevice.new_task`` packed every kernel's argument struct in Python
(one ``LaunchSpec.pack`` per kernel, in the scheduler's thread, the GIL held), and the
completion thread handled every kernel's completion in Python. This module models it with
three numbers fitted to GPU measurements (``av-infer bench --refit-host``,
:mod:`av_infer.bench.host_fit`):

* ``start_us + per_kernel_us * kernels``: the host work a request does before its first
  launch can be transmitted (``SimDevice.new_task``, i.e. when the scheduler starts it; a
  resumed request does not do it again);
* ``complete_us``: host work per kernel completion (any stream);
* both on **one host**: work is served in the order it is asked for, one piece at a time
  (one scheduler thread, one GIL). A request started while other requests' start work or
  completions are still being handled waits for them; that is how BE load delays RT
  starts here, with no term of its own.

Off by default (``host="none"``: the simulator before this module, every timeline
unchanged). On with a parameter file (``SimDevice(host="FILE.json")``, ``av-infer bench
--host FILE.json``) or a :class:`HostModel`.

Limits, said plainly: the host is one FIFO server with fixed costs (no jitter, no GIL
switch interval, no priority of RT work on the host); the cost is charged before the first
transmit, not spread over the request; a preemption decision is not delayed by host work.
The fitted numbers describe the tree they were measured on (c082c73, before the
argument-packing fix of 1ac6b47): a newer tree needs a new GPU run and fit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from av_infer.devices import sim_params
from av_infer.profiles import gpu_spec

__all__ = ["PARAMS_FORMAT", "HostModel", "check_host", "describe", "load_params",
           "save_params"]

#: ``format`` of a host parameter file (:func:`load_params`).
PARAMS_FORMAT = sim_params.FORMAT

_FIELDS = ("start_us", "per_kernel_us", "complete_us")


@dataclass(frozen=True)
class HostModel:
    """Host costs in µs (see the module docstring); ``gpu``: the GPUS key it was fitted
    on (None: any)."""

    start_us: float = 0.0
    per_kernel_us: float = 0.0
    complete_us: float = 0.0
    gpu: str | None = None

    def __post_init__(self) -> None:
        for f in _FIELDS:
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"host model: {f} must be a number >= 0, got {v!r}")

    def start_s(self, kernels: int) -> float:
        """Host start work of a request of ``kernels`` kernels, seconds."""
        return (self.start_us + self.per_kernel_us * kernels) * 1e-6


def check_host(host: str | HostModel | None, gpu: str | Any = "mi50") -> HostModel | None:
    """The host model ``host`` names on ``gpu`` (None: off): ``None``/``"none"``, a
    :class:`HostModel` or a parameter file ``FILE.json``. ValueError for anything else and
    for a file fitted on another GPU, before anything is set up."""
    if host is None or host == "none":
        return None
    return sim_params.resolve(host, HostModel, load_params, gpu, "host",
                              "none or a parameter FILE.json (av-infer bench --refit-host)",
                              "fitted")


def load_params(path: str | Path) -> HostModel:
    """A host parameter file: ``{"format": 1, "kind": "host", "model": "fifo-host", "gpu":
    GPUS key, "start_us": x, "per_kernel_us": y, "complete_us": z, "fit": {...}}`` (``fit``:
    how it was obtained; informative). ValueError naming the file and the field when it is
    not one; FileNotFoundError when it does not exist."""
    p = Path(path)
    doc = sim_params.read(p, "host", "fifo-host")
    try:
        gpu = gpu_spec(str(doc.get("gpu"))).name
        return HostModel(**{f: doc.get(f) for f in _FIELDS}, gpu=gpu)
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None


def save_params(path: str | Path, model: HostModel, fit: dict[str, Any]) -> Path:
    """Write a parameter file :func:`load_params` reads (atomic)."""
    if model.gpu is None:
        raise ValueError("a host parameter file names the GPU it was fitted on")
    return sim_params.write(path, "host", "fifo-host", model.gpu,
                            {k: v for k, v in asdict(model).items() if k in _FIELDS}, fit)


def describe(host: str | HostModel | None, gpu: str | Any = "mi50") -> dict[str, Any]:
    """What a host model setting means: ``{"name", "start_us", "per_kernel_us",
    "complete_us"}`` (all None when off)."""
    model = check_host(host, gpu)
    name = "none" if host is None else (str(host) if not isinstance(host, HostModel)
                                        else "explicit")
    if model is None:
        return {"name": name, **{f: None for f in _FIELDS}}
    return {"name": name, **{f: getattr(model, f) for f in _FIELDS}}
