#!/usr/bin/env python3
"""Python's garbage collector under the peer load: how often it runs and how long it holds
the GIL, beside av_infer's RT tail (docs/cpu_engine.md).

A collection runs on whichever thread allocated last and holds the GIL throughout; an RT
request that needs the GIL meanwhile (to submit, or to take its result after its ORT run)
waits. This runs ``bench --peer``'s av_infer system alone (``bench.peer._open``/``_drive``:
one periodic RT client, closed-loop BE clients) with ``gc.callbacks`` timing every
collection, and prints per generation the count and p50/max duration, and RT p50/p99/max.
``--freeze``: ``gc.freeze()`` once the runtime is set up (what a process owner could do).

    .venv/bin/python scripts/gc_pauses.py                          # zoo pair x 4, 12 s
    .venv/bin/python scripts/gc_pauses.py --freeze --json -
"""

from __future__ import annotations

import argparse
import gc
import time
from contextlib import ExitStack

import numpy as np

from av_infer.bench.peer import PeerConfig, _drive, _open, add_load_args, resolve_model
from av_infer.bench.report import emit_json, human_stream


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_load_args(ap, be_clients=4)
    ap.add_argument("--duration", type=float, default=12.0)
    ap.add_argument("--freeze", action="store_true", help="gc.freeze() after setup")
    args = ap.parse_args()
    cfg = PeerConfig(rt_model=args.rt_model, be_model=args.be_model, rt_rate=args.rt_rate,
                     be_clients=args.be_clients, policy=args.policy, progress=False,
                     duration=args.duration)
    rt, be = resolve_model(cfg.rt_model), resolve_model(cfg.be_model)
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    start = [0.0]

    def timer(phase: str, info: dict) -> None:
        if phase == "start":
            start[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append((time.perf_counter() - start[0]) * 1e3)

    with ExitStack() as stack:
        rt_infer, be_fns, _ = _open("avi", rt, be, cfg, stack)
        if args.freeze:
            gc.collect()
            gc.freeze()
        gc.callbacks.append(timer)
        try:
            raw = _drive(rt_infer, be_fns, cfg, "avi")
        finally:
            gc.callbacks.remove(timer)
    lat = np.asarray(raw.lat) * 1e3
    doc = {"config": vars(args), "wall_s": raw.window, "be_requests": raw.be_done,
           "rt_ms": {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
                     "max": float(lat.max())},
           "gc": {str(g): {"count": len(d), "p50_ms": float(np.median(d)) if d else None,
                           "max_ms": max(d) if d else None} for g, d in pauses.items()}}
    out = human_stream(args.json)
    r = doc["rt_ms"]
    print(f"RT p50 {r['p50']:.2f} p99 {r['p99']:.2f} max {r['max']:.2f} ms; "
          f"{raw.be_done} BE requests in {raw.window:.1f} s", file=out)
    for g, d in doc["gc"].items():
        if d["count"]:
            print(f"gen{g}: {d['count']} collections, p50 {d['p50_ms']:.3f} ms, max "
                  f"{d['max_ms']:.3f} ms", file=out)
    emit_json(doc, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
