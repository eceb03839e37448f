"""Does the GIL make av_infer's RT client late on the GPU? (docs/gpu_results.md, 2026-11-27)

Why: on the H200 (2026-11-27) ``bench --peer torch`` found av_infer's RT client late by
1.96-1.99 ms p99 (DISB A) and 9.63 ms (C) before av_infer knew of the request, against
0.12-0.20 ms under torch, in the same process with the same client code. The hypothesis:
the client thread waits for the GIL, held by av_infer's Python per kernel completion (the
cuda device's completion thread, ``devices/cuda.py`` ``_drain``), which never blocks while
completions keep coming, so a waiting thread gets the GIL only when CPython's switch
interval (5 ms by default) asks the holder to drop it. If so, a shorter interval shrinks
the lateness (and the RT p99 and preemption p99 with it) at some cost in BE throughput.

What it runs: the avi system of ``bench --peer torch`` (DISB A or C at REEF's rates, one
precision), alternating the switch interval between the values of ``--switch-us`` (default
5000, Python's own, and 200), ``--rounds`` times each (ABAB...), each run on a fresh
Runtime. Prints one line per run and a table; writes ``--out DIR/gpu_gil.json`` and prints
it whole as the last line (``gpu_gil: {...}``) for ``scripts/gpu_check.sh``'s log.

    python scripts/gpu_gil_check.py --workload A --out DIR             # GPU
    python scripts/gpu_gil_check.py --emulate --scale scaled --rate-scale 0.02 --duration 1

``--emulate`` runs the avi side on the CPU emulator: it proves the wiring only (the
emulator's kernels are CPU code and slower than any rate here). Exit 2 without a device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

KEYS = ("rt_p50_ms", "rt_p99_ms", "rt_late_p50_ms", "rt_late_p99_ms", "be_rps", "cores_used")


def run(a: argparse.Namespace) -> dict[str, Any]:
    from av_infer.bench.peer_torch import PeerUnavailable, TorchPeerConfig, run_torch_peer

    values = [float(v) for v in a.switch_us.split(",")]
    before = sys.getswitchinterval()
    runs: list[dict[str, Any]] = []
    try:
        for r in range(a.rounds):
            for us in values:
                sys.setswitchinterval(us * 1e-6)
                cfg = TorchPeerConfig.for_workload(
                    a.workload, rate_scale=a.rate_scale, systems=("avi",),
                    precision=a.precision, duration=a.duration, warmup=a.warmup,
                    scale=a.scale, vendor=a.vendor, emulate=a.emulate, progress=False)
                try:
                    avi = run_torch_peer(cfg)["avi"]
                except PeerUnavailable as e:
                    raise SystemExit(2) from e
                if "error" in avi:
                    raise RuntimeError(f"avi failed: {avi['error']}")
                row = {"round": r, "switch_us": us, **{k: avi.get(k) for k in KEYS},
                       "preemption_us": avi.get("preemption_us")}
                runs.append(row)
                print(json.dumps(row), flush=True)
    finally:
        sys.setswitchinterval(before)
    by = {us: [x for x in runs if x["switch_us"] == us] for us in values}
    summary = {str(us): {k: statistics.median(x[k] for x in xs) for k in KEYS}
               for us, xs in by.items() if xs}
    return {"what": "RT client lateness vs CPython's GIL switch interval (avi, peer torch)",
            "workload": a.workload, "precision": a.precision, "scale": a.scale,
            "rate_scale": a.rate_scale, "duration": a.duration, "rounds": a.rounds,
            "emulated": a.emulate, "runs": runs, "median_by_switch_us": summary}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=["A", "C"], default="A")
    ap.add_argument("--precision", choices=["fp32", "tf32", "fp16"], default="fp32")
    ap.add_argument("--switch-us", default="5000,200",
                    help="switch intervals in µs, alternated in this order (%(default)s)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--scale", choices=["full", "scaled"], default="full")
    ap.add_argument("--vendor", choices=["off", "auto", "force"], default="auto")
    ap.add_argument("--emulate", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.rounds < 1 or any(float(v) <= 0 for v in a.switch_us.split(",")):
        ap.error("--rounds must be >= 1 and every --switch-us > 0")
    doc = run(a)
    print(f"{'switch us':>10} " + " ".join(f"{k:>15}" for k in KEYS))
    for us, med in doc["median_by_switch_us"].items():
        print(f"{us:>10} " + " ".join(f"{med[k]:15.3f}" for k in KEYS))
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_gil.json").write_text(json.dumps(doc, indent=1))
    print("gpu_gil: " + json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
