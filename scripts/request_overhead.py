#!/usr/bin/env python3
"""What a request costs av_infer beyond the model, and what a kill costs ORT, beside the
plain ONNX Runtime call (docs/cpu_engine.md, "a much slower VM host").

1. Per request: ``Runtime.infer`` (BE, then RT) and ``submit(...).result()`` (BE,
   ``avi_submit``: issue 31's second figure) against ``InferenceSession.run`` of the same
   model, one thread, back to back, in turn within each round; wall time and the calling
   thread's CPU time per request (the caller runs its own launch, so the difference is
   av_infer's Python).
2. Per kill: ``ort_segments.measure_kill_cost`` (a run terminated before it starts), and
   ``RunOptions.terminate`` set at a random point of a running ``--kill-model`` run: how
   long its thread keeps running (wall and CPU) after the flag.

    .venv/bin/python scripts/request_overhead.py                      # tiny_mlp, vgg19
    .venv/bin/python scripts/request_overhead.py --model densenet201 --json -
"""

from __future__ import annotations

import argparse
import random
import threading
import time

import numpy as np

from av_infer import Runtime
from av_infer.bench.peer import _ort_session, resolve_model
from av_infer.bench.report import emit_json, human_stream
from av_infer.devices.cpu import CpuDevice
from av_infer.kernels.ort_segments import (
    ORT_APIS,
    SegmentRunner,
    is_kill,
    measure_kill_cost,
    resolve_api,
)


def _per_call(fn, n: int) -> tuple[float, float]:
    """(wall, thread CPU) microseconds per call of ``fn``."""
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6, (time.thread_time() - c0) / n * 1e6


def _paired(calls, requests: int, block: int) -> dict[str, dict[str, float]]:  # noqa: ANN001
    """``requests // block`` turns; in each, every call runs ``block`` times (the order
    rotates by turn); per call the median over turns of its wall µs per request, and of
    that minus the same turn's bare ORT (the first call)."""
    turns = max(requests // block, 1)
    per: dict[str, list[float]] = {k: [] for k, _ in calls}
    for t in range(turns):
        order = calls[t % len(calls):] + calls[:t % len(calls)]
        for k, fn in order:
            per[k].append(_per_call(fn, block)[0])
    base = np.array(per[calls[0][0]])
    return {k: {"wall_us": float(np.median(v)), "turns": turns,
                "over_ort_us": float(np.median(np.array(v) - base))} for k, v in per.items()}


def _random_kills(model: str, n: int, api: str) -> dict[str, float]:
    """Terminate ``n`` runs of ``model`` (whole, one segment, through ``api``) at a random
    point; ms its thread ran after."""
    from av_infer.model.segments import compile_segments

    m = resolve_model(model)
    runner = SegmentRunner(compile_segments(m.source, m.shapes, name=model, segment_ms=None),
                           threads=1, api=api)
    arena = runner.new_arena()
    fn, = runner.bind(arena)
    runner.write_inputs(arena, m.inputs)
    t0 = time.perf_counter()
    fn(runner.run_options())
    run_s = time.perf_counter() - t0
    wall, cpu = [], []
    for _ in range(n):
        ro, box = runner.run_options(), {}
        started = threading.Event()

        def run(ro=ro, box=box, started=started) -> None:
            box["clk"] = time.pthread_getcpuclockid(threading.get_ident())
            started.set()
            try:
                fn(ro)
            except Exception as e:  # noqa: BLE001 - a kill is expected
                box["killed"] = is_kill(e)
            box["t1"], box["c1"] = time.perf_counter(), time.clock_gettime(box["clk"])

        th = threading.Thread(target=run)
        th.start()
        started.wait()
        time.sleep(random.uniform(0.1, 0.9) * run_s)
        try:
            c0 = time.clock_gettime(box["clk"])
        except OSError:  # the run ended first
            th.join()
            continue
        t0 = time.perf_counter()
        ro.terminate = True
        th.join()
        if box.get("killed"):
            wall.append((box["t1"] - t0) * 1e3)
            cpu.append((box["c1"] - c0) * 1e3)
    return {"model": model, "api": runner.api, "run_ms": run_s * 1e3, "kills": len(wall),
            "wall_p50_ms": float(np.median(wall)), "wall_p99_ms": float(np.percentile(wall, 99)),
            "cpu_p50_ms": float(np.median(cpu)), "cpu_p99_ms": float(np.percentile(cpu, 99))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny_mlp")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kill-model", default="vgg19")
    ap.add_argument("--kills", type=int, default=200)
    ap.add_argument("--api", choices=ORT_APIS, default="auto",
                    help="how av_infer's cpu device calls ONNX Runtime (CpuDevice ort_api)")
    ap.add_argument("--block", type=int, default=0,
                    help="paired blocks: each round runs the four calls in turn, BLOCK "
                         "requests each, REQUESTS/BLOCK times, and reports the median over "
                         "those turns of each call's µs over the same turn's bare ORT block "
                         "(a host whose speed moves within seconds: docs/request_path.md)")
    ap.add_argument("--be-nice", type=int, default=10,
                    help="CpuDevice be_nice (10, the default: a BE run worth killing is "
                         "reniced, two setpriority calls; 0: never)")
    ap.add_argument("--json", help="write the figures here ('-': stdout)")
    args = ap.parse_args()
    out = human_stream(args.json)
    m = resolve_model(args.model)
    sess = _ort_session(m.source, 1)
    rows = []
    with Runtime(CpuDevice(ort_api=args.api, be_nice=args.be_nice), max_be_streams=1) as r:
        print(f"av_infer's cpu device calls ONNX Runtime through: {r.device.ort_api}",
              file=out)
        r.load_model("be", m.source, m.shapes)
        r.load_model("rt", m.source, m.shapes, pin=True)
        r.configure_client("rt", "RT", relative_deadline=1.0)
        for _ in range(50):
            sess.run(None, m.inputs)
            r.infer("be", m.inputs, client="be")
            r.infer("rt", m.inputs, client="rt")
        calls = (("ort", lambda: sess.run(None, m.inputs)),
                 ("avi_be", lambda: r.infer("be", m.inputs, client="be")),
                 ("avi_rt", lambda: r.infer("rt", m.inputs, client="rt")),
                 ("avi_submit", lambda: r.submit("be", m.inputs, client="be").result()))
        for _ in range(args.rounds):
            if args.block:
                rows.append(_paired(calls, args.requests, args.block))
                print("  ".join(f"{k} +{v['over_ort_us']:.1f}" for k, v in rows[-1].items()
                                if k != "ort")
                      + f" us over bare ORT ({rows[-1]['ort']['wall_us']:.0f} us), median of "
                      f"{rows[-1]['ort']['turns']} paired turns of {args.block}", file=out,
                      flush=True)
                continue
            row = {k: _per_call(fn, args.requests) for k, fn in calls}
            rows.append({k: {"wall_us": w, "cpu_us": c} for k, (w, c) in row.items()})
            print("  ".join(f"{k} {w:.0f}/{c:.0f} us" for k, (w, c) in row.items())
                  + "  (wall/thread CPU per request)", file=out, flush=True)
    api = resolve_api(args.api)[0]
    pre = [measure_kill_cost(api=api) * 1e3 for _ in range(3)]
    print(f"[{api} API] a run terminated before it starts: {', '.join(f'{v:.3f}' for v in pre)} ms "
          "of its thread's CPU", file=out)
    kills = _random_kills(args.kill_model, args.kills, api)
    print(f"{kills['model']} ({kills['run_ms']:.2f} ms a run) terminated at a random point, "
          f"{kills['kills']} kills: its thread ran on p50 {kills['wall_p50_ms']:.3f} / p99 "
          f"{kills['wall_p99_ms']:.3f} ms (CPU p50 {kills['cpu_p50_ms']:.3f} / p99 "
          f"{kills['cpu_p99_ms']:.3f})", file=out)
    emit_json({"config": vars(args), "per_request": rows, "pre_terminated_ms": pre,
               "random_kills": kills}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
