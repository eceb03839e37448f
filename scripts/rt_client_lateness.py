#!/usr/bin/env python3
"""How late the RT client thread calls, av_infer against ORT threads (docs/cpu_engine.md).

``bench --peer``'s preemption latency is measured from the *scheduled* arrival; part of it is
the RT client thread waking from its sleep (and taking the GIL) before it can submit. This
drives the peer's load (one periodic RT client, closed-loop BE clients that keep no results)
through both systems, in turn, and prints the lateness (call time minus scheduled arrival)
and the RT latency, p50/p99/max in ms.

    .venv/bin/python scripts/rt_client_lateness.py                       # zoo pair x 2
    .venv/bin/python scripts/rt_client_lateness.py --rt-model ocr_cls --be-model ocr_det \\
        --rt-rate 30 --json -
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from contextlib import ExitStack

import numpy as np

from av_infer.bench.peer import PeerConfig, _open, resolve_model


def _drive(rt_infer, be_fns, rate: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    stop = threading.Event()

    def loop(fn) -> None:
        while not stop.is_set():
            fn()  # the result is dropped: a client that keeps them feeds the GC

    ths = [threading.Thread(target=loop, args=(f,), daemon=True) for f in be_fns]
    for th in ths:
        th.start()
    time.sleep(0.5)
    late, lat = [], []
    t0 = time.perf_counter() + 0.05
    try:
        for i in range(n):
            sched = t0 + i / rate
            dt = sched - time.perf_counter()
            if dt > 0:
                time.sleep(dt)
            late.append(time.perf_counter() - sched)
            rt_infer(sched)
            lat.append(time.perf_counter() - sched)
    finally:
        stop.set()
        for th in ths:
            th.join()
    return np.asarray(late) * 1e3, np.asarray(lat) * 1e3


def _dist(a: np.ndarray) -> dict[str, float]:
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rt-model", default="resnet152")
    ap.add_argument("--be-model", default="vgg19")
    ap.add_argument("--rt-rate", type=float, default=20.0)
    ap.add_argument("--be-clients", type=int, default=2)
    ap.add_argument("--policy", default="reef_dkp")
    ap.add_argument("--requests", type=int, default=200, help="RT requests per turn")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", help="write the figures here ('-': stdout)")
    args = ap.parse_args()
    cfg = PeerConfig(rt_model=args.rt_model, be_model=args.be_model, rt_rate=args.rt_rate,
                     be_clients=args.be_clients, policy=args.policy, progress=False)
    rt, be = resolve_model(cfg.rt_model), resolve_model(cfg.be_model)
    rows = []
    with ExitStack() as stack:
        systems = {s: _open(s, rt, be, cfg, stack) for s in ("ort_threads", "avi")}
        for i in range(args.rounds):
            for name, (rt_infer, be_fns, _) in systems.items():
                late, lat = _drive(rt_infer, be_fns, cfg.rt_rate, args.requests)
                rows.append({"round": i, "system": name, "lateness_ms": _dist(late),
                             "rt_latency_ms": _dist(lat)})
                a, b = rows[-1]["lateness_ms"], rows[-1]["rt_latency_ms"]
                print(f"{name:12s} late p50 {a['p50']:.3f} p99 {a['p99']:.3f} max "
                      f"{a['max']:.3f} | RT p50 {b['p50']:.3f} p99 {b['p99']:.3f} ms",
                      file=sys.stderr if args.json == "-" else sys.stdout, flush=True)
    doc = {"config": vars(args), "rows": rows}
    if args.json == "-":
        print(json.dumps(doc, indent=2))
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
