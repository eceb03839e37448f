"""Adaptive-batching benchmark: heavy closed-loop BE load with and without batching.

Why: Rafiqi §3.3 batches to raise throughput under load; av_infer must get that for BE
work without hurting RT latency (RT is never batched and still preempts BE batches).
Workload: ``--be-clients`` closed-loop BE clients on ``dynamic_cnn`` (dynamic batch dim;
plans compiled for batch 1, 2, 4, 8), one periodic RT client on ``tiny_cnn`` (pinned),
``reef`` policy. Reports BE throughput and RT latency p50/p99, batching off vs on.

* ``--device sim``: virtual time, deterministic (the default GPU model of the simulator);
* ``--device cpu``: wall clock on this machine (noisy on shared cores).

    python -m av_infer.bench.batching_bench --device sim
    python -m av_infer.bench.batching_bench --device cpu --seconds 5
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import numpy as np

from av_infer import Runtime
from av_infer.model import zoo

BE_SHAPE = (1, 3, 32, 32)


def _pct(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50_ms": None, "p99_ms": None, "n": 0}
    a = np.asarray(xs) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "max_ms": float(a.max()), "n": len(xs)}


def run(device: str, batching: bool, seconds: float, be_clients: int,
        rt_period: float) -> dict[str, Any]:
    virtual = device == "sim"
    rt = Runtime(device, policy="reef", batching=batching, max_be_streams=2)
    rt.load_model("rt", zoo.path("tiny_cnn"), pin=True)
    rt.load_model("dyn", zoo.path("dynamic_cnn"), {"input": BE_SHAPE})
    rt.configure_client("cam", "RT", relative_deadline=rt_period)
    xb = {"input": np.random.default_rng(0).standard_normal(BE_SHAPE).astype(np.float32)}
    xr = zoo.sample_inputs("tiny_cnn")
    be_done = [0]
    rt_lat: list[float] = []
    lock = threading.Lock()
    t_start = rt.now()
    t_end = t_start + seconds
    stop = threading.Event()

    def be_loop(i: int) -> None:
        def again(f: Any) -> None:
            if f.exception() is None:
                with lock:
                    be_done[0] += rt.now() <= t_end
            if rt.now() < t_end and not stop.is_set():
                be_loop(i)
        rt.submit("dyn", xb, client=f"be{i}").add_done_callback(again)

    def rt_one() -> None:
        def rec(f: Any) -> None:
            if f.exception() is None:
                with lock:
                    rt_lat.append(f.result().timings.latency)
        rt.submit("rt", xr, client="cam").add_done_callback(rec)

    if virtual:
        dev = rt.device
        for i in range(be_clients):
            dev.call_at(t_start, lambda i=i: be_loop(i))
        k = 1
        while t_start + k * rt_period < t_end:
            dev.call_at(t_start + k * rt_period, rt_one)
            k += 1
        dev.run()
    else:
        for i in range(be_clients):
            be_loop(i)
        nxt = t_start + rt_period
        while nxt < t_end:
            time.sleep(max(0.0, nxt - rt.now()))
            rt_one()
            nxt += rt_period
        stop.set()
    rt.close()
    st = rt.stats()
    return {
        "device": device, "batching": batching, "seconds": seconds,
        "be_clients": be_clients, "be_throughput_rps": be_done[0] / seconds,
        "rt": _pct(rt_lat),
        "batches": st["batching"]["models"].get("dyn", {}).get("batches", {}),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("sim", "cpu"), default="sim")
    ap.add_argument("--seconds", type=float, default=None,
                    help="run length (virtual s for sim; default sim 0.5, cpu 5)")
    ap.add_argument("--be-clients", type=int, default=16)
    ap.add_argument("--rt-period", type=float, default=None,
                    help="RT period in s (default sim 0.005, cpu 0.02)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    sim = args.device == "sim"
    seconds = args.seconds or (0.5 if sim else 5.0)
    period = args.rt_period or (0.005 if sim else 0.02)
    rows = [run(args.device, b, seconds, args.be_clients, period) for b in (False, True)]
    print(f"device={args.device} seconds={seconds} be_clients={args.be_clients} "
          f"rt_period={period * 1e3:.1f} ms")
    print(f"{'batching':<9}{'BE req/s':>10}{'RT p50 ms':>11}{'RT p99 ms':>11}{'RT n':>6}  batches")
    for r in rows:
        print(f"{'on' if r['batching'] else 'off':<9}{r['be_throughput_rps']:>10.1f}"
              f"{r['rt']['p50_ms']:>11.3f}{r['rt']['p99_ms']:>11.3f}{r['rt']['n']:>6}  "
              f"{r['batches']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
