"""Measured kernel profiles of the zoo models on the cuda device, as files the simulator
loads (``av-infer bench --device sim --profiles DIR``; issue 33).

Why: the simulator's zoo models are timed by profiles derived from geometry (a roofline),
which on the first H100 run were 4-9x off our own kernels (docs/sim_fidelity.md). The
cuda device can time each kernel of a loaded plan alone (CUDA events, median of
``repeats``) and ask the occupancy API for its blocks per SM (``av_infer.profiler``); this
command does that for every model asked and writes ``DIR/<model>.profile.json`` in the
one profile format (``profiles.ModelProfile``) with

* ``source: "measured"``, ``variant`` (the zoo variant compiled), ``device`` (the GPU's
  name), ``sms``;
* ``gpu``: the device's telemetry of the GPU (name, driver, SM and memory clocks at the
  time, ...; ``emulated: true`` on the CPU emulator, whose times are not GPU speed);
* per kernel: duration, blocks and threads of the launch as the device makes it, blocks
  per SM, the op ``kind`` and, for the kernels the device runs as vendor-library ops
  (``vendor=auto|force``, docs/cuda_vendor.md), ``vendor``: ``cudnn`` or ``cublaslt``
  (``CudaDevice.vendor_report``); such an op is timed by the device like any launch
  (``time_kernel`` times the vendor call), its blocks and occupancy are those of our
  kernel it replaces (the library does not say).

The plan is the device's own compile of the zoo ONNX file (``Device.compile``), so the
kernel list is the one the cuda device runs; the simulator compiles the same file and
refuses a profile whose kernel count differs (another compiler build).

Usage on a GPU (``scripts/gpu_sim_steps.sh`` runs it; ``--bundle`` writes every profile into
one file, rewritten after each model, which ``--profiles FILE.json`` reads as well)::

    python -m av_infer.bench.gpu_profiles --device cuda --variant full --out DIR
    python -m av_infer.bench.gpu_profiles --device cuda --bundle sim_profiles.json

``--device cuda-emu`` runs the same code on the CPU emulator (tested in
tests/bench/test_sim_fidelity.py with a small model).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from av_infer.profiles import ModelProfile, save_profile_bundle, save_profile_dir

__all__ = ["FULL_MODELS", "measure", "main"]

#: The full-size zoo models (DISB's five).
FULL_MODELS = ("vgg19", "resnet152", "densenet201", "inception_v3", "distilbert")


def _vendor_map(device: Any, handle: Any) -> dict[int, str]:
    """Kernel index -> the library that runs it, for the kernels the device runs as vendor
    ops (``CudaDevice.vendor_report``: path ``vendor``; op ``conv`` is cuDNN's, ``matmul``
    cuBLASLt's). Empty for a device without vendor ops."""
    fn = getattr(device, "vendor_report", None)
    if fn is None:
        return {}
    return {int(r["kernel"]): ("cudnn" if r.get("op") == "conv" else "cublaslt")
            for r in fn(handle) if r.get("path") == "vendor"}


def measure(device: Any, model: str, variant: str = "full", repeats: int = 3) -> ModelProfile:
    """Compile ``model`` (zoo, ``variant``) with ``device``'s compiler, load it, time every
    kernel (``devices.cuda_profiling.profile_loaded``), unload it; the annotated measured
    profile."""
    from av_infer.devices.cuda_profiling import profile_loaded
    from av_infer.model import zoo

    plan = device.compile(str(zoo.path(model, variant=variant)), name=model)
    handle = device.load_plan(plan)
    try:
        prof = profile_loaded(plan, device, handle, repeats)
        vendor = _vendor_map(device, handle)
        for kp, k in zip(prof.kernels, plan.kernels, strict=True):
            kp.kind = k.kind
            kp.vendor = vendor.get(k.index, "")
    finally:
        device.unload_plan(handle)
    tele = device.telemetry() if hasattr(device, "telemetry") else {}
    gpu = tele.get("gpu")
    info: dict[str, Any] = dict(gpu) if isinstance(gpu, dict) else {"name": str(gpu or "")}
    info["sms"] = prof.sms
    info["emulated"] = bool(tele.get("emulated", False))
    info["vendor_mode"] = getattr(device, "vendor_mode", None)
    for k in ("arch", "tf32"):
        if k in tele:
            info[k] = tele[k]
    prof.source = "measured"
    prof.gpu = info
    prof.variant = variant
    return prof


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m av_infer.bench.gpu_profiles",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cuda-emu"], default="cuda")
    ap.add_argument("--variant", choices=["full", "scaled"], default="full")
    ap.add_argument("--models", default=",".join(FULL_MODELS),
                    help="comma list of zoo models (default: the five full-size DISB models)")
    ap.add_argument("--repeats", type=int, default=3, help="timed launches per kernel")
    ap.add_argument("--vendor", choices=["off", "auto", "force"], default=None,
                    help="the cuda device's vendor ops (default: $AV_INFER_CUDA_VENDOR, else "
                    "off: the same default as av-infer bench --device cuda)")
    ap.add_argument("--out", metavar="DIR", help="writes DIR/<model>.profile.json")
    ap.add_argument("--bundle", metavar="FILE.json",
                    help="writes every profile into one file (--profiles FILE.json reads it)")
    ap.add_argument("--json", metavar="OUT", help="summary as JSON ('-': stdout)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if not (args.out or args.bundle):
        ap.error("give --out DIR, --bundle FILE.json or both")
    from av_infer.devices import make_device

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    device = make_device(args.device, **({"vendor": args.vendor} if args.vendor else {}))
    summary: dict[str, Any] = {"device": args.device, "variant": args.variant,
                               "out": args.out, "bundle": args.bundle, "models": [],
                               "failures": []}
    done: list[ModelProfile] = []
    human = sys.stderr if args.json == "-" else sys.stdout
    try:
        for m in models:
            t0 = time.perf_counter()
            try:
                prof = measure(device, m, args.variant, args.repeats)
            except Exception as e:  # noqa: BLE001 - reported per model, the others go on
                summary["failures"].append({"model": m, "error": f"{type(e).__name__}: {e}"})
                print(f"{m}: FAILED {type(e).__name__}: {e}", file=human)
                continue
            done.append(prof)
            path = (save_profile_dir([prof], args.out)[0] if args.out
                    else save_profile_bundle(done, args.bundle))
            if args.out and args.bundle:
                save_profile_bundle(done, args.bundle)
            row = {"model": m, "kernels": len(prof.kernels),
                   "total_ms": round(prof.total_us / 1e3, 4),
                   "vendor_ops": sum(1 for k in prof.kernels if k.vendor),
                   "gpu": (prof.gpu or {}).get("name"), "file": str(path),
                   "seconds": round(time.perf_counter() - t0, 2)}
            summary["models"].append(row)
            print(f"{m}: {row['kernels']} kernels, {row['total_ms']} ms summed alone, on "
                  f"{row['gpu']} -> {path} ({row['seconds']} s)", file=human)
    finally:
        close = getattr(device, "close", None)
        if close is not None:
            close()
    if args.json == "-":
        print(json.dumps(summary, indent=1))
    elif args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
