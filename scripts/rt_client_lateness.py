#!/usr/bin/env python3
"""How late the RT client thread calls, av_infer against ORT threads (docs/cpu_engine.md).

``bench --peer``'s preemption latency is measured from the *scheduled* arrival; part of it is
the RT client thread waking from its sleep (and taking the GIL) before it can submit. This
drives the peer's load with the peer's own driver (``bench.peer._drive``: one periodic RT
client, closed-loop BE clients that keep no results, 0.5 s of unmeasured warm-up) through
both systems, in turn, and prints the lateness (call time minus scheduled arrival) and the
RT latency, p50/p99/max in ms.

    .venv/bin/python scripts/rt_client_lateness.py                       # zoo pair x 2
    .venv/bin/python scripts/rt_client_lateness.py --rt-model ocr_cls --be-model ocr_det \\
        --rt-rate 30 --json -
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack

import numpy as np

from av_infer.bench.peer import PeerConfig, _drive, _open, add_load_args, resolve_model
from av_infer.bench.report import emit_json, human_stream


def _dist(seconds: list[float]) -> dict[str, float]:
    a = np.asarray(seconds) * 1e3
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_load_args(ap, be_clients=2)
    ap.add_argument("--requests", type=int, default=200, help="RT requests per turn")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    # half a period over: the driver measures int(duration * rate) requests
    cfg = PeerConfig(rt_model=args.rt_model, be_model=args.be_model, rt_rate=args.rt_rate,
                     be_clients=args.be_clients, policy=args.policy, progress=False,
                     warmup=0.5, duration=(args.requests + 0.5) / args.rt_rate)
    rt, be = resolve_model(cfg.rt_model), resolve_model(cfg.be_model)
    rows = []
    with ExitStack() as stack:
        systems = {s: _open(s, rt, be, cfg, stack) for s in ("ort_threads", "avi")}
        for i in range(args.rounds):
            for name, (rt_infer, be_fns, _) in systems.items():
                raw = _drive(rt_infer, be_fns, cfg, name)
                rows.append({"round": i, "system": name, "lateness_ms": _dist(raw.late),
                             "rt_latency_ms": _dist(raw.lat)})
                a, b = rows[-1]["lateness_ms"], rows[-1]["rt_latency_ms"]
                print(f"{name:12s} late p50 {a['p50']:.3f} p99 {a['p99']:.3f} max "
                      f"{a['max']:.3f} | RT p50 {b['p50']:.3f} p99 {b['p99']:.3f} ms",
                      file=human_stream(args.json), flush=True)
    emit_json({"config": vars(args), "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
