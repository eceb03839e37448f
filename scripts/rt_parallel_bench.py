#!/usr/bin/env python3
"""Two RT clients in phase plus closed-loop BE clients: RT lanes side by side or one at a time.

Why: on a CPU two RT requests arriving together (two cameras in phase) can each have a core;
REEF's one-RT-task-at-a-time order makes the second wait for the first. This runs the same
load (RT A = inception_v3 and RT B = resnet152, scaled, periodic at ``--hz`` in phase; BE =
``--be-clients`` closed-loop clients on scaled vgg19) through (a) one ONNX Runtime session
per model with a thread per client, (b) av_infer with ``rt_parallel=1`` and (c) av_infer
with ``rt_parallel=2`` (the cpu default on two cores), one after the other in one process.
RT latency is measured from the scheduled arrival.

    .venv/bin/python scripts/rt_parallel_bench.py --duration 20 [--json out/rt_parallel.json]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from av_infer import Runtime
from av_infer.bench.peer import _ort_session, resolve_model
from av_infer.bench.report import emit_json


def drive(fa: Callable[[float], Any], fb: Callable[[float], Any],
          fbe: Callable[[int], Any], duration: float, hz: float,
          be_clients: int) -> dict[str, Any]:
    """Run the load; RT p50/p99 per client (ms) and BE req/s."""
    stop = threading.Event()
    lat: dict[str, list[float]] = {"A": [], "B": []}
    cnt = [0] * be_clients
    t0 = time.perf_counter() + 0.5
    n = int(duration * hz)

    def rt_loop(key: str, fn: Callable[[float], Any]) -> None:
        for i in range(n):
            s = t0 + i / hz
            d = s - time.perf_counter()
            if d > 0:
                time.sleep(d)
            fn(s)
            lat[key].append(time.perf_counter() - s)

    def be_loop(i: int) -> None:
        while not stop.is_set():
            fbe(i)
            cnt[i] += 1

    bts = [threading.Thread(target=be_loop, args=(i,)) for i in range(be_clients)]
    rts = [threading.Thread(target=rt_loop, args=("A", fa)),
           threading.Thread(target=rt_loop, args=("B", fb))]
    for t in bts + rts:
        t.start()
    t_start = time.perf_counter()
    for t in rts:
        t.join()
    t_end = time.perf_counter()
    stop.set()
    for t in bts:
        t.join()
    out: dict[str, Any] = {
        f"rt_{k}_{q}_ms": float(np.percentile(v, p) * 1e3)
        for k, v in lat.items() for q, p in (("p50", 50), ("p99", 99))}
    out["be_rps"] = sum(cnt) / (t_end - t_start)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--hz", type=float, default=30.0)
    ap.add_argument("--be-clients", type=int, default=2)
    ap.add_argument("--json", help="also write the results as JSON ('-': stdout)")
    args = ap.parse_args()
    a, b, be = (resolve_model(m) for m in ("inception_v3", "resnet152", "vgg19"))
    res: dict[str, Any] = {"rt_A": a.label, "rt_B": b.label, "be": be.label,
                           "hz": args.hz, "duration": args.duration,
                           "be_clients": args.be_clients}
    sa, sb, sbe = (_ort_session(m.source, 1) for m in (a, b, be))
    res["ort_threads"] = drive(lambda s: sa.run(None, a.inputs), lambda s: sb.run(None, b.inputs),
                               lambda i: sbe.run(None, be.inputs), args.duration, args.hz,
                               args.be_clients)
    for rp in (1, 2):
        with Runtime("cpu", policy="reef", max_be_streams=min(2, args.be_clients),
                     device_options={"rt_parallel": rp}) as r:
            r.load_model("a", a.source, pin=True)
            r.load_model("b", b.source, pin=True)
            r.load_model("be", be.source)
            for _ in range(5):
                r.infer("a", a.inputs, priority="RT")
                r.infer("b", b.inputs, priority="RT")
                r.infer("be", be.inputs)
            res[f"avi_rt_parallel_{rp}"] = drive(
                lambda s: r.infer("a", a.inputs, priority="RT", client="a", arrival=s),
                lambda s: r.infer("b", b.inputs, priority="RT", client="b", arrival=s),
                lambda i: r.infer("be", be.inputs, client=f"be{i}"),
                args.duration, args.hz, args.be_clients)
    for k in ("ort_threads", "avi_rt_parallel_1", "avi_rt_parallel_2"):
        o = res[k]
        print(f"{k:18s} RT A ({a.label}) p50/p99 {o['rt_A_p50_ms']:.2f}/{o['rt_A_p99_ms']:.2f} "
              f"ms  RT B ({b.label}) {o['rt_B_p50_ms']:.2f}/{o['rt_B_p99_ms']:.2f} ms  "
              f"BE {o['be_rps']:.0f} req/s")
    emit_json(res, args.json)


if __name__ == "__main__":
    main()
