"""REEF Fig. 18a's no-BE padded overhead under both proxy-variant selections, side by side
(issue 30 item 3; docs/cuda.md "Register and shared-memory use, padded vs plain").

    .venv/bin/python scripts/gpu_pad_select_check.py [--models vgg19,resnet152,...]
        [--scale full] [--reps 10] [--levels 1,2,3,4,5,6,8] [--out FILE] [--emulate]

Per model, on one device, one padded module over all models (compiled once, before
anything is timed; by default the five DISB models at full size, the same module source as
gpu_bench's ``padding_overhead``, so whichever runs second finds it in the disk cache),
runs rotate between three configurations: plain kernels; every kernel through the padded
dispatcher kernel with no BE part under ``pad_select=parts`` (the first design: proxy
level 1, the registers of the module's largest body); the same under ``pad_select=regs``
(the fewest registers that hold the kernel). Reported per model: the
median enqueue-to-last-kernel ms of each, the overhead of each padded configuration over
plain in %, which variants each selection launched, whether every output is bit-identical
to the plain run's; and the variants' registers and spill bytes as the driver reports them.
Prints one JSON document (into gpu_check.log under scripts/gpu_check.sh: $OUT holds its
ten files already) and writes it to ``--out`` if given. Exit 1 if an output differed or a
model failed, 2 without a GPU (or emulator).

``--levels``: the proxy variants' occupancy levels (``CudaDevice(pad_levels=...)``;
default 1,2,4,8, the module gpu_bench compiles too; more levels let ``regs`` match more
plain kernels, docs/cuda.md, and cost a compile of their own).

``--emulate``: the CPU emulator with scaled models: checks that the step runs and outputs
stay bit-identical; no number is GPU speed (the emulator reports 32 registers for every
function, so ``regs`` always picks the highest level there).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SELECTS = ("plain", "parts", "regs")


def _pad_all(dev: Any, s: int, h: Any, task: int, sel: str, padded_n: dict[str, int],
             used: dict[str, int]) -> None:
    """Every kernel of ``task`` padded with no BE part under selection ``sel``; counts the
    kernels padded and the variants launched."""
    from av_infer.bench.gpu_bench import _pad_no_be

    dev.pad_select = sel
    before = dict(dev.telemetry()["padding"]["launches_by_variant"])
    padded_n[sel] = _pad_no_be(dev, s, h, task)
    for v, n in dev.telemetry()["padding"]["launches_by_variant"].items():
        if n - before.get(v, 0):
            used[v] = used.get(v, 0) + n - before.get(v, 0)


def measure(dev: Any, models: list[str], scale: str, reps: int) -> dict[str, Any]:
    from av_infer.bench.gpu_bench import _driver, _identical, _run_window, _zoo_plan

    s, q = _driver(dev)
    loaded = {m: dev.load_plan(_zoo_plan(m, scale)[0]) for m in models}
    t0 = time.perf_counter()
    dev.prepare_padding(list(loaded.values()))
    out: dict[str, Any] = {"scale": scale, "reps": reps, "models": models,
                           "pad_compile_s": round(time.perf_counter() - t0, 3), "rows": []}
    print(f"pad_select: padded module ready in {out['pad_compile_s']} s", file=sys.stderr,
          flush=True)
    task = 500_000
    for name, h in loaded.items():
        plan, x = _zoo_plan(name, scale)
        row: dict[str, Any] = {"model": name, "kernels": len(plan.kernels)}
        try:
            times: dict[str, list[float]] = {k: [] for k in SELECTS}
            used: dict[str, dict[str, int]] = {k: {} for k in SELECTS[1:]}
            ref, _ = _run_window(dev, s, q, h, plan, x, task)
            same = True
            padded_n = {}
            for r in range(reps + 1):  # round 0 warms every configuration up, untimed
                order = SELECTS[r % 3:] + SELECTS[:r % 3]  # rotate: no order bias
                for sel in order:
                    task += 1
                    setup = None if sel == "plain" else functools.partial(
                        _pad_all, dev, s, h, task, sel, padded_n, used[sel])
                    got, dt = _run_window(dev, s, q, h, plan, x, task, setup)
                    same = same and _identical(got, ref)
                    if r:
                        times[sel].append(dt)
            med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
            row.update({f"{k}_ms": med[k] for k in SELECTS})
            row.update({f"{k}_overhead_pct": 100 * (med[k] / med["plain"] - 1)
                        for k in SELECTS[1:]})
            row.update(padded_kernels=padded_n, variants_used=used, bit_identical=bool(same),
                       ok=bool(same))
        except Exception as e:  # noqa: BLE001 - reported per model
            row.update(ok=False, error=f"{type(e).__name__}: {e}"[:300])
        out["rows"].append(row)
        # each row as soon as it is measured: a step cut short by its timeout keeps them
        print("pad_select row: " + json.dumps(row), file=sys.stderr, flush=True)
    out["variants"] = dev.telemetry()["padding"]["variants"]
    for h in loaded.values():
        dev.unload_plan(h)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=None,
                    help="comma list (default the five DISB models; emulated: distilbert)")
    ap.add_argument("--scale", default=None, help="default full on a GPU, scaled emulated")
    ap.add_argument("--reps", type=int, default=None, help="default 10 (emulated 2)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--levels", default=None, help="proxy occupancy levels, e.g. 1,2,3,4,5,6,8")
    ap.add_argument("--emulate", action="store_true")
    a = ap.parse_args(argv)
    from av_infer.devices.cuda import CudaDevice, availability

    ok, why = availability(emulate=a.emulate)
    if not ok:
        print(f"no {'CUDA emulator' if a.emulate else 'GPU'}: {why}", file=sys.stderr)
        return 2
    from av_infer.bench.gpu_bench import DISB_ZOO

    models = [m.strip() for m in (a.models or (
        "distilbert" if a.emulate else ",".join(DISB_ZOO))).split(",") if m.strip()]
    scale = a.scale or ("scaled" if a.emulate else "full")
    reps = a.reps if a.reps is not None else (2 if a.emulate else 10)
    dev = CudaDevice(c=4, emulate=a.emulate, pad_levels=a.levels)
    try:
        doc = {"what": "REEF Fig. 18a no-BE padded overhead, pad_select parts vs regs "
                       "(issue 30 item 3)", "emulated": a.emulate,
               "levels": dev.telemetry()["padding"]["levels"],
               "gpu": dev.telemetry()["gpu"].get("name"), **measure(dev, models, scale, reps)}
    finally:
        dev.close()
    text = json.dumps(doc, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    for r in doc["rows"]:
        if r.get("ok"):
            print(f"{r['model']}: plain {r['plain_ms']:.3f} ms, parts "
                  f"{r['parts_overhead_pct']:+.1f} %, regs {r['regs_overhead_pct']:+.1f} %",
                  file=sys.stderr)
    return 0 if all(r.get("ok") for r in doc["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
