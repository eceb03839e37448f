#!/usr/bin/env python3
"""Does the BE model slow the RT model's own ORT run? Plain ONNX Runtime, no av_infer.

``make demo`` splits each RT client's p50 into the model's launch (wall, and its thread's
CPU time) and the rest (docs/cpu_engine.md). Under the demo's load the launch itself takes
longer than back to back, with CPU time equal to wall time. This isolates the candidates
with two plain ORT sessions (one intra-op thread each, as the cpu device runs them) and
times the RT model's ``run`` (p50 of wall and thread CPU time, ms) in each situation:

* ``back_to_back``: RT runs in a loop (warm caches; the demo's "standalone");
* ``after_be_same_thread``: each RT run follows ``--be-runs`` BE runs on the same thread
  (the BE model's cache footprint on the RT run's core);
* ``be_on_other_thread``: a second thread runs BE in a loop meanwhile (the other core busy
  with the BE model: shared caches and memory);
* ``after_sleep``: each RT run follows a sleep of one camera period (idle cores);
* ``after_spin_<ms>``: each RT run follows ``<ms>`` of spinning on the same thread (the core
  kept busy with a loop that touches almost no memory), for each of ``--spin-ms``: if the
  run still slows with the gap, time away from the model, not the BE model nor an idle
  core, is what makes it slower (on a cloud VM: the host and other tenants).

    .venv/bin/python scripts/rt_launch_interference.py                 # demo's front pair
    .venv/bin/python scripts/rt_launch_interference.py --rt-model vgg19 --json -
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import numpy as np

from av_infer.bench.peer import _ort_session, resolve_model
from av_infer.bench.report import emit_json, human_stream


def _session(model: str) -> tuple[Any, dict[str, np.ndarray]]:
    """The peer's own ORT session (one intra-op thread) and inputs for ``model``."""
    m = resolve_model(model)
    return _ort_session(m.source, 1), m.inputs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rt-model", default="inception_v3")
    ap.add_argument("--be-model", default="densenet201")
    ap.add_argument("--be-runs", type=int, default=30, help="BE runs before each RT run")
    ap.add_argument("--period-ms", type=float, default=33.3, help="after_sleep's sleep")
    ap.add_argument("--spin-ms", default="1,5,33.3",
                    help="after_spin's gaps, ms, comma-separated ('' for none)")
    ap.add_argument("--n", type=int, default=200, help="RT runs per situation")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", help="write the figures here ('-': stdout)")
    args = ap.parse_args()
    rt, xr = _session(args.rt_model)
    be, xb = _session(args.be_model)
    for _ in range(20):
        rt.run(None, xr)
        be.run(None, xb)

    def timed() -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.thread_time()
        rt.run(None, xr)
        return (time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3

    def back_to_back() -> list[tuple[float, float]]:
        return [timed() for _ in range(args.n)]

    def after_be_same_thread() -> list[tuple[float, float]]:
        out = []
        for _ in range(args.n):
            for _ in range(args.be_runs):
                be.run(None, xb)
            out.append(timed())
        return out

    def be_on_other_thread() -> list[tuple[float, float]]:
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                be.run(None, xb)

        th = threading.Thread(target=loop, daemon=True)
        th.start()
        time.sleep(0.1)
        try:
            return [timed() for _ in range(args.n)]
        finally:
            stop.set()
            th.join()

    def after_sleep() -> list[tuple[float, float]]:
        out = []
        for _ in range(args.n):
            time.sleep(args.period_ms / 1e3)
            out.append(timed())
        return out

    def after_spin(ms: float):
        def case() -> list[tuple[float, float]]:
            out = []
            for _ in range(args.n):
                end = time.perf_counter() + ms / 1e3
                while time.perf_counter() < end:
                    pass
                out.append(timed())
            return out
        return case

    cases = {"back_to_back": back_to_back, "after_be_same_thread": after_be_same_thread,
             "be_on_other_thread": be_on_other_thread, "after_sleep": after_sleep}
    for ms in (float(x) for x in args.spin_ms.split(",") if x.strip()):
        cases[f"after_spin_{ms:g}"] = after_spin(ms)
    rows = []
    for i in range(args.rounds):
        for name, fn in cases.items():
            a = np.asarray(fn())
            row = {"round": i, "case": name, "wall_p50_ms": float(np.median(a[:, 0])),
                   "cpu_p50_ms": float(np.median(a[:, 1]))}
            rows.append(row)
            print(f"{args.rt_model} {name:22s} wall p50 {row['wall_p50_ms']:.3f} ms, "
                  f"thread CPU p50 {row['cpu_p50_ms']:.3f} ms", file=human_stream(args.json),
                  flush=True)
    emit_json({"config": vars(args), "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
