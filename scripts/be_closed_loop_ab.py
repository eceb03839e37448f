#!/usr/bin/env python3
"""One closed-loop BE client, nothing else running: ``InferenceSession.run`` (one intra-op
thread, the peer's session) against ``Runtime.infer`` of the same model (BE, one lane),
on the same thread, alternating in short slots so that the host's drift falls on both
alike (docs/request_path.md, "A BE client alone").

Prints requests per second, wall and thread CPU microseconds per request of each, their
ratio, and av_infer's own ``start -> end`` of the launch (the ORT run inside it) from the
results' ``Timings``: what is left of av_infer's wall time per request is its own path
(admission, scheduling, completion, answer) around the same run.

    .venv/bin/python scripts/be_closed_loop_ab.py [--model densenet201] [--slot 0.2] [--seconds 16]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="densenet201", help="zoo name (default densenet201)")
    ap.add_argument("--slot", type=float, default=0.2, help="seconds per turn (0.2)")
    ap.add_argument("--seconds", type=float, default=16.0, help="total (16)")
    ap.add_argument("--json", metavar="PATH", help="write the figures (- for stdout)")
    args = ap.parse_args()

    from av_infer import Runtime
    from av_infer.bench.peer import _ort_session, resolve_model
    from av_infer.bench.report import emit_json, human_stream

    m = resolve_model(args.model)
    sess = _ort_session(m.source, 1)
    rt = Runtime("cpu", max_be_streams=1)
    rt.load_model("be", m.source)
    x = m.inputs
    for _ in range(50):  # warm both
        sess.run(None, x)
        rt.infer("be", x, client="be")
    tot = {"ort": [0, 0.0, 0.0], "avi": [0, 0.0, 0.0]}
    launch_us: list[float] = []

    def ort() -> None:
        sess.run(None, x)

    def avi() -> None:
        t = rt.infer("be", x, client="be").timings
        launch_us.append((t.end - t.start) * 1e6)

    end = time.perf_counter() + args.seconds
    turn = 0
    while time.perf_counter() < end:
        order = [("ort", ort), ("avi", avi)]
        if turn % 2:
            order.reverse()
        for key, fn in order:
            n, t0, c0 = 0, time.perf_counter(), time.thread_time()
            while time.perf_counter() - t0 < args.slot:
                fn()
                n += 1
            row = tot[key]
            row[0] += n
            row[1] += time.perf_counter() - t0
            row[2] += time.thread_time() - c0
        turn += 1
    rt.close()
    out = {"model": args.model, "turns": turn, "slot_s": args.slot}
    for key, (n, wall, cpu) in tot.items():
        out[key] = {"requests": n, "rps": n / wall, "wall_us": wall / n * 1e6,
                    "cpu_us": cpu / n * 1e6}
    out["ratio_rps"] = out["avi"]["rps"] / out["ort"]["rps"]
    out["avi_launch_p50_us"] = statistics.median(launch_us)
    text = human_stream(args.json)  # stderr when the JSON goes to stdout
    for key in ("ort", "avi"):
        r = out[key]
        print(f"{key}: {r['rps']:.0f} req/s, {r['wall_us']:.0f} us wall and "
              f"{r['cpu_us']:.0f} us thread CPU per request", file=text)
    print(f"av_infer / ORT: {out['ratio_rps']:.3f}; av_infer's launch (the ORT run inside) "
          f"p50 {out['avi_launch_p50_us']:.0f} us", file=text)
    emit_json(out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
