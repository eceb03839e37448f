#!/usr/bin/env python3
"""ORT threads against av_infer with the running BE segment killed or parked, interleaved.

One load (``bench --peer``'s: a periodic RT client, closed-loop BE clients), several
systems opened once and taking turns in ``rounds`` rounds of ``seconds`` each (the order
reverses every round): ORT threads, av_infer with ``kill=True`` (the default), av_infer
with ``kill=False`` (the running segment parked at nice 19, its work kept), and any
further av_infer device options given as JSON ``{"name": {option: value}}``. Prints each
system's pooled RT p50/p99, BE req/s, preemption p99 (flag to the BE run's end) and kills,
then the ratios to ORT threads with the per-round BE ratios (docs/cpu_engine.md, "Kill or
park").

    .venv/bin/python scripts/kill_mode_ab.py ocr_rec ocr_det 10 2 --policy reef_dkp \\
        --rounds 6 --seconds 5 --extra '{"park12": {"kill": false, "segment_ms": 12}}'
    .venv/bin/python scripts/kill_mode_ab.py ocr_rec ocr_det 10 2 --skip park \\
        --extra '{"measured": {"max_cut_cost": 0.05}}'   # cuts measured (opt-in) or not
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from contextlib import ExitStack

from av_infer.bench import peer as P


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rt_model")
    ap.add_argument("be_model")
    ap.add_argument("rt_hz", type=float)
    ap.add_argument("be_clients", type=int)
    ap.add_argument("--policy", default="reef_dkp")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--extra", default="{}", help="JSON: more av_infer variants")
    ap.add_argument("--skip", action="append", default=[], metavar="NAME",
                    help="leave out a built-in variant (kill, park)")
    a = ap.parse_args()
    cfg = P.PeerConfig(rt_model=a.rt_model, be_model=a.be_model, rt_rate=a.rt_hz,
                       be_clients=a.be_clients, policy=a.policy, progress=False)
    rt, be = P.resolve_model(a.rt_model, None), P.resolve_model(a.be_model, None)
    variants = {"ort_threads": None, "kill": {"kill": True}, "park": {"kill": False},
                **json.loads(a.extra)}
    for k in a.skip:
        if k not in ("kill", "park"):
            ap.error(f"--skip takes kill or park, not {k!r}")
        variants.pop(k)
    names = list(variants)
    raw = {k: P._Raw() for k in names}
    per: dict[str, list] = {k: [] for k in names}
    with ExitStack() as stack:
        opened = {k: P._open_ort(rt, be, cfg, stack) if opt is None else
                  P._open_avi(rt, be, dataclasses.replace(cfg, device_options=opt), stack)
                  for k, opt in variants.items()}
        for i in range(a.rounds):
            for k in names if i % 2 == 0 else names[::-1]:
                rt_infer, be_fns, _ = opened[k]
                got = P._drive(rt_infer, be_fns, cfg, k, duration=a.seconds)
                raw[k].add(got)
                per[k].append(P._summary(got))
        sums = {}
        for k in names:
            s = sums[k] = P._summary(raw[k])
            opened[k][2](s)
            pre = (s.get("preemption_ms") or {}).get("p99")
            print(f"{k:12s} RT p50 {s['rt_p50_ms']:.2f} p99 {s['rt_p99_ms']:.2f}  BE "
                  f"{s['be_rps']:.1f}  preemption p99 {P.fmt_num(pre)}  killed "
                  f"{s.get('killed')}")
    o = sums["ort_threads"]
    for k in names[1:]:
        s = sums[k]
        rounds = " ".join(f"{x['be_rps'] / y['be_rps']:.2f}"
                          for x, y in zip(per[k], per["ort_threads"]))
        print(f"{k:12s} / ORT threads: RT p99 {s['rt_p99_ms'] / o['rt_p99_ms']:.2f}  BE "
              f"{s['be_rps'] / o['be_rps']:.2f}  (rounds {rounds})")


if __name__ == "__main__":
    main()
