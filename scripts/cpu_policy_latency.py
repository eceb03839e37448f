#!/usr/bin/env python3
"""RT latency on the CPU device, per policy, with and without a closed-loop BE load.

RT: scaled resnet152 submitted periodically (default 20 Hz for 5 s) by one RT client with
a relative deadline of one period; latency = completion - *scheduled* arrival (docs/design.md).
BE: ``--be-clients`` closed-loop clients running scaled vgg19 (each submits its next request
when the previous one completes). Prints one row per (policy, load).

    .venv/bin/python scripts/cpu_policy_latency.py            # the release-note table
    .venv/bin/python scripts/cpu_policy_latency.py --duration 2 --policies reef,streams

Numbers are wall-clock on a shared CPU: compare rows of one run, not across machines.
"""

from __future__ import annotations

import argparse
import os
import platform
import threading
import time

import numpy as np

from av_infer import InvalidParameterError, Runtime
from av_infer.devices.cpu import CpuDevice
from av_infer.model import zoo
from av_infer.sched.policies import POLICIES


def run_one(policy: str, with_be: bool, args: argparse.Namespace, plans: dict) -> dict:
    rt = Runtime("cpu", policy=policy, c=args.c, max_be_streams=args.be_clients,
                 device_options={"engine": args.engine})
    rt.load_model("rt", plans["rt"])
    rt.load_model("be", plans["be"])
    x_rt = zoo.sample_inputs(args.rt_model, "scaled")
    x_be = zoo.sample_inputs(args.be_model, "scaled")
    period = 1.0 / args.rate
    rt.configure_client("rt", "RT", relative_deadline=period)
    for _ in range(3):  # warm up both models (RT priority: rt_only accepts it)
        rt.submit("rt", x_rt, priority="RT", client="warm").result()
        rt.submit("be", x_be, priority="RT", client="warm").result()
    stop = threading.Event()
    be_done = [0]
    lock = threading.Lock()

    def be_loop(client: str):
        def again(fut):
            if fut.exception() is None:
                with lock:
                    be_done[0] += 1
            if not stop.is_set():
                rt.submit("be", x_be, client=client).add_done_callback(again)
        rt.submit("be", x_be, client=client).add_done_callback(again)

    run_be = with_be and POLICIES[policy].accepts_be
    t_be0 = time.perf_counter()
    if run_be:
        for i in range(args.be_clients):
            be_loop(f"be{i}")
        time.sleep(0.2)  # let the BE load reach steady state
    futs = []
    t0 = rt.now() + 0.01
    n = int(args.duration * args.rate)
    for i in range(n):
        at = t0 + i * period
        delay = at - rt.now()
        if delay > 0:
            time.sleep(delay)
        futs.append(rt.submit("rt", x_rt, client="rt", arrival=at))
    results = [f.result(timeout=60) for f in futs]
    stop.set()
    t_be = time.perf_counter() - t_be0
    rt.close(drain=True)
    lat = np.array([r.timings.latency for r in results]) * 1e3
    st = rt.stats()
    return {
        "policy": policy,
        "load": f"BE x{args.be_clients}" if with_be else "RT alone",
        "n": len(results),
        "p50": float(np.percentile(lat, 50)),
        "p99": float(np.percentile(lat, 99)),
        "max": float(lat.max()),
        "misses": sum(not r.deadline_met for r in results),
        "be_rps": (be_done[0] / t_be) if run_be else None,
        "preemptions": st["preemptions"],
        "note": "" if run_be or not with_be else "BE rejected by policy",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of RT arrivals")
    ap.add_argument("--rate", type=float, default=20.0, help="RT arrivals per second")
    ap.add_argument("--rt-model", default="resnet152")
    ap.add_argument("--be-model", default="vgg19")
    ap.add_argument("--be-clients", type=int, default=2)
    ap.add_argument("--c", type=int, default=4)
    ap.add_argument("--engine", choices=["ort", "numpy"], default="ort",
                    help="cpu engine: ONNX Runtime segments (default) or the numpy reference")
    ap.add_argument("--policies", default=",".join(p for p, s in POLICIES.items()
                                                   if s.available))
    args = ap.parse_args()
    dev = CpuDevice(engine=args.engine)
    plans = {  # the engine's own plans: ORT segments (RT whole), or numpy kernels
        "rt": dev.compile(str(zoo.path(args.rt_model, "scaled")), name="rt", whole=True),
        "be": dev.compile(str(zoo.path(args.be_model, "scaled")), name="be"),
    }
    print(f"# cpu device ({args.engine} engine), {os.cpu_count()} cpus, "
          f"{platform.processor() or platform.machine()}; RT {args.rt_model}-scaled "
          f"({len(plans['rt'].kernels)} launches) at {args.rate:g} Hz for {args.duration:g} s; "
          f"BE {args.be_model}-scaled ({len(plans['be'].kernels)} launches) closed loop "
          f"x{args.be_clients}; c={args.c}; load average at start {os.getloadavg()[0]:.2f}")
    hdr = (f"{'policy':<13}{'load':<10}{'n':>5}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
           f"{'misses':>8}{'BE req/s':>10}{'preempt':>9}  note")
    print(hdr)
    print("-" * len(hdr))
    for pol in args.policies.split(","):
        for with_be in (False, True):
            try:
                r = run_one(pol.strip(), with_be, args, plans)
            except InvalidParameterError as e:  # e.g. reef_dkp: no padding on the CPU
                print(f"{pol.strip():<13}refused by the cpu device: {e}")
                break
            be = f"{r['be_rps']:.1f}" if r["be_rps"] is not None else "-"
            print(f"{r['policy']:<13}{r['load']:<10}{r['n']:>5}{r['p50']:>9.2f}{r['p99']:>9.2f}"
                  f"{r['max']:>9.2f}{r['misses']:>8}{be:>10}{r['preemptions']:>9}  {r['note']}",
                  flush=True)


if __name__ == "__main__":
    main()
