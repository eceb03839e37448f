"""Python thread CPU per kernel on the cuda device's completion path, by batch size.

The path: the completion thread polls the dispatcher's ring, books each record
(``CudaDevice._completed``) and hands it to the driver (``Driver.complete``, the devices'
completion entry -> compiled ``Scheduler.on_complete`` -> ``_schedule``), holding the GIL
throughout. Coalescing (docs/request_path.md, "Coalesced completions") makes that once per
record of ``count`` consecutive kernels instead of once per kernel.

Runs on the CPU emulator (``CudaDevice(emulate=True)``), densenet201 (scaled), BE requests
through the real Runtime (reef; one BE stream unless ``--be-streams``). Batch size B is
forced: before each poll the completion thread waits (sleeping: no CPU) until B completions
are in the ring (or ``--wait-ms`` passed: a task's end) and then takes at most B, so every
record stands for up to B kernels. B=1 is the path as it runs when the thread keeps up (one
record per kernel, what every kernel cost before coalescing). Thread CPU
(``time.thread_time``) is summed over ``_completed`` and the engine callback, per run,
divided by the kernels completed. Runs of the batch sizes are interleaved (round 1:
B=1,4,16, round 2: ...); every run is printed.

    .venv/bin/python scripts/completion_cost.py --rounds 3 --requests 20 [--json -]

``--no-coalesce``: the device is started without coalescing (single records whatever B),
which is what the completion path cost before it existed; also runs on a checkout from
before it (the script only wraps what both have).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from typing import Any


class _Poller:
    """Stands in for the device's dispatcher (every call forwarded) and makes ``poll``
    wait for B completions in the ring, then take at most B (test and measurement only)."""

    def __init__(self, disp: Any, dev: Any, batch: int, wait_s: float) -> None:
        self._d = disp
        self._dev = dev
        self.batch = batch
        self.wait_s = wait_s
        self.taken = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._d, name)

    def _pushed(self) -> int:
        return sum(self._d.stream_stats(i)["completed"] for i in range(len(self._dev._vhqs)))

    def poll(self, max_n: int, timeout: float, *a: Any, **kw: Any) -> list:
        until = time.perf_counter() + self.wait_s
        while self._pushed() - self.taken < self.batch and time.perf_counter() < until:
            time.sleep(0)  # spin (keeps this core and its caches warm, as a busy thread)
        out = self._d.poll(min(max_n, self.batch), timeout, *a, **kw)
        self.taken += sum(x[7] if len(x) > 7 else 1 for x in out)
        return out


def _device_class() -> type:
    from av_infer.devices.cuda import CudaDevice

    class Timed(CudaDevice):
        """Sums the completion thread's CPU in the booking and in the engine callback."""

        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            self.book_s = 0.0
            #: per record (kernel, count, booking s, engine s), in order
            self.log: list[tuple[int, int, float, float]] = []

        def start(self, on_complete: Any, **kw: Any) -> None:
            def timed(c: Any) -> None:
                t = time.thread_time()
                on_complete(c)
                self.log.append((c.kernel, getattr(c, "count", 1), self.book_s,
                                 time.thread_time() - t))

            super().start(timed, **kw)

        def _completed(self, *a: Any, **kw: Any) -> Any:
            t = time.thread_time()
            r = super()._completed(*a, **kw)
            self.book_s = time.thread_time() - t
            return r

    return Timed


def run_once(batch: int, requests: int, coalesce: bool, wait_s: float,
             plan: Any, x: dict, be_streams: int = 1) -> dict[str, Any]:
    from av_infer import Runtime

    cls = _device_class()
    if not coalesce:
        cls.coalesces = False  # the engine starts it for single records
    dev = cls(emulate=True, c=4)
    poller = _Poller(dev._disp, dev, batch, wait_s)
    dev._disp = poller
    with Runtime(dev, policy="reef", c=4, max_be_streams=be_streams) as rt:
        rt.load_model("be", plan)
        rt.submit("be", x, client="be").result(timeout=600)  # warm: compile, first run
        log0 = len(dev.log)
        t0 = time.perf_counter()
        futs = [rt.submit("be", x, client="be") for _ in range(requests)]
        for f in futs:
            f.result(timeout=600)
        wall = time.perf_counter() - t0
        sched = rt._sched
        applied = getattr(sched, "coalesced_applied", 0)
    log = dev.log[log0:]
    n = len(plan.kernels)
    kernels = sum(c for _, c, _, _ in log)
    records = len(log)
    book = sum(b for _, _, b, _ in log) / kernels * 1e6
    cb = sum(e for _, _, _, e in log) / kernels * 1e6
    # records inside a task (not its first or last kernel): the per-kernel path alone; the
    # rest also finishes a request (outputs, answer) and starts the next (arena, inputs)
    mid = [r for r in log if r[0] > 0 and r[0] + r[1] < n]
    mid_k = sum(c for _, c, _, _ in mid)
    mid_us = sum(b + e for _, _, b, e in mid) / mid_k * 1e6
    edge_us = (sum(b + e for _, _, b, e in log) - sum(b + e for _, _, b, e in mid)) * 1e6
    return {"batch": batch, "coalesce": coalesce, "be_streams": be_streams,
            "requests": requests, "kernels": kernels,
            "records": records, "kernels_per_record": round(kernels / records, 2),
            "scheduler_applied_at_once": applied,
            "book_us_per_kernel": round(book, 2), "engine_us_per_kernel": round(cb, 2),
            "python_us_per_kernel": round(book + cb, 2),
            "mid_task_us_per_kernel": round(mid_us, 2),
            "mid_task_kernels_per_record": round(mid_k / max(1, len(mid)), 2),
            "request_edges_us_per_request": round(edge_us / requests, 1),
            "wall_s": round(wall, 2), "threads": threading.active_count()}


def replay_once(batch: int, requests: int, coalesce: bool, plan: Any,
                x: dict) -> dict[str, Any]:
    """``--mode replay``: the device's threads are not started (its launches wait in the
    vHQs); this thread plays the completion thread, feeding the real ``_completed`` and
    the engine callback the records of the running task's kernels, ``batch`` at a time,
    as ``_drain`` does (one record of ``batch`` kernels, or ``batch`` single records
    without ``coalesce``). No emulator work runs in between: the figures are the Python
    itself, caches warm."""
    from av_infer import Runtime
    from av_infer.devices.cuda import CudaDevice

    class Idle(CudaDevice):
        coalesces = coalesce

        def start(self, on_complete: Any, **kw: Any) -> None:
            self.cb = on_complete  # no dispatcher, no completion thread

    dev = Idle(emulate=True, c=4)
    n = len(plan.kernels)
    now = time.perf_counter
    book = eng = mid_s = 0.0
    kernels = records = mid_k = mid_r = 0
    with Runtime(dev, policy="reef", c=4, max_be_streams=1) as rt:
        rt.load_model("be", plan)
        sched = rt._sched
        futs = [rt.submit("be", x, client="be") for _ in range(requests + 1)]
        first = True
        while not all(f.done() for f in futs):
            (task, t), = [(tid, t) for tid, t in sched.tasks.items() if t.outstanding > 0]
            measure = not first  # the first request warms up
            k = t.done
            while k < n:
                m = min(batch, n - k)
                times = tuple(v for _ in range(m) for v in (now(), now()))
                items = ([(t.stream, task, k, 0, times[0], times[-1], None, m, times)]
                         if coalesce and m > 1 else
                         [(t.stream, task, k + i, 0, times[2 * i], times[2 * i + 1], None)
                          for i in range(m)])
                for item in items:
                    a = time.thread_time()
                    done = dev._completed(*item)
                    b = time.thread_time()
                    dev.cb(done)
                    c = time.thread_time()
                    if measure:
                        book += b - a
                        eng += c - b
                        records += 1
                        kk, cnt = item[2], item[7] if len(item) > 7 else 1
                        if kk > 0 and kk + cnt < n:  # inside the task (not its edges)
                            mid_s += c - a
                            mid_k += cnt
                            mid_r += 1
                k += m
            if measure:
                kernels += n
            first = False
    return {"mode": "replay", "batch": batch, "coalesce": coalesce, "requests": requests,
            "kernels": kernels, "records": records,
            "kernels_per_record": round(kernels / records, 2),
            "book_us_per_kernel": round(book / kernels * 1e6, 2),
            "engine_us_per_kernel": round(eng / kernels * 1e6, 2),
            "python_us_per_kernel": round((book + eng) / kernels * 1e6, 2),
            "python_us_per_record": round((book + eng) / records * 1e6, 2),
            "mid_task_us_per_kernel": round(mid_s / mid_k * 1e6, 2),
            "mid_task_us_per_record": round(mid_s / mid_r * 1e6, 2),
            "request_edges_us_per_request": round(
                (book + eng - mid_s) / requests * 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["replay", "live"], default="replay",
                    help="replay: this thread feeds the real completion path (no emulator "
                         "work between records); live: the emulator runs the kernels")
    ap.add_argument("--model", default="densenet201")
    ap.add_argument("--variant", default="scaled")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--wait-ms", type=float, default=200.0,
                    help="longest wait for B completions before a poll (a task's end)")
    ap.add_argument("--no-coalesce", action="store_true")
    ap.add_argument("--be-streams", type=int, default=1,
                    help="BE streams (1: one task's kernels fill the ring, batches are B; "
                         "more: streams interleave in the ring and records get shorter)")
    ap.add_argument("--json", default=None, help="write the rows as JSON (- = stdout)")
    a = ap.parse_args(argv)

    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    plan = compile_model(zoo.path(a.model, a.variant), name=a.model)
    x = zoo.sample_inputs(a.model, a.variant, seed=0)
    batches = [int(b) for b in a.batches.split(",")]
    rows = []
    for rnd in range(a.rounds):
        for b in batches:
            if a.mode == "replay":
                r = replay_once(b, a.requests, not a.no_coalesce, plan, x)
                r["round"] = rnd + 1
                rows.append(r)
                print(f"round {rnd + 1} B={b:>2} coalesce={r['coalesce']!s:5} kernels "
                      f"{r['kernels']} records {r['records']}: book "
                      f"{r['book_us_per_kernel']:.2f} + engine {r['engine_us_per_kernel']:.2f}"
                      f" = {r['python_us_per_kernel']:.2f} us per kernel; inside a task "
                      f"{r['mid_task_us_per_kernel']:.2f} us per kernel "
                      f"({r['mid_task_us_per_record']:.1f} per record), first+last records "
                      f"{r['request_edges_us_per_request']:.0f} us per request", file=sys.stderr)
                continue
            r = run_once(b, a.requests, not a.no_coalesce, a.wait_ms / 1e3, plan, x,
                         a.be_streams)
            r["round"] = rnd + 1
            rows.append(r)
            print(f"round {rnd + 1} B={b:>2} coalesce={r['coalesce']!s:5} kernels "
                  f"{r['kernels']} records {r['records']} ({r['kernels_per_record']}/record): "
                  f"book {r['book_us_per_kernel']:.2f} + engine {r['engine_us_per_kernel']:.2f}"
                  f" = {r['python_us_per_kernel']:.2f} us per kernel; inside a task "
                  f"{r['mid_task_us_per_kernel']:.2f} us per kernel "
                  f"({r['mid_task_kernels_per_record']}/record), first+last records "
                  f"{r['request_edges_us_per_request']:.0f} us per request", file=sys.stderr)
    summary = {}
    for b in batches:
        vals = [r["python_us_per_kernel"] for r in rows if r["batch"] == b]
        mids = [r.get("mid_task_us_per_kernel", r["python_us_per_kernel"])
                for r in rows if r["batch"] == b]
        summary[str(b)] = {"median_python_us_per_kernel": statistics.median(vals),
                           "runs": vals, "median_mid_task_us_per_kernel":
                           statistics.median(mids), "mid_task_runs": mids}
        print(f"B={b:>2}: median {statistics.median(vals):.2f} us/kernel (all records), "
              f"{statistics.median(mids):.2f} inside a task; runs {vals} / {mids}",
              file=sys.stderr)
    out = {"model": f"{a.model}/{a.variant}", "mode": a.mode, "rows": rows,
           "summary": summary}
    if a.json == "-":
        json.dump(out, sys.stdout, indent=1)
        print()
    elif a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
