"""Gated CUDA graphs vs plain vHQ launches on one BE stream (docs/cuda_graphs.md).

Why: issue 30 item 2 keeps the finer preemption design only if numbers say so. Per mode
(``graphs=off`` then ``be``) on a fresh device: outputs against ONNX Runtime (fp32
tolerance), the median end-to-end latency of one BE request (all kernels enqueued at once,
until the last completion), the dispatcher's host µs per launch, and preemption trials:
at a random kernel the stream is reset and its flag raised (the scheduler's protocol);
``stop_us`` = flag raised -> last in-flight launch completed; the launches the flag caught
are counted as ran / skipped / unknown (plain launches cannot tell), then the task is
restored (gated: from the gate record's progress; plain: from the vHQ's done) and must
equal the unpreempted outputs bit for bit. ``--graph-ops 1,4``: the gated mode once per
k, graphs of k ops per launch (``CudaDevice(graph_ops=k)``; one vHQ entry each).
``--vendor-graphs N`` (default 0): the BE modes run with ``--vendor``'s vendor ops, and
the gated modes with ``CudaDevice(vendor_graphs=N)``: the vendor ops captured into their
gates' IF bodies (docs/cuda_graphs.md, "Vendor ops inside gated graphs"); the plain mode
keeps them on the host flag check. Each mode then reports ``vendor_graphs`` (telemetry:
ops gated, fallbacks and why) and the stream's ``graph_vendor_ops``.

RT mode (``--rt-graphs N``, run first; docs/cuda_graphs.md "RT as one graph"): the model
as RT requests on the highest-priority stream, plain (``rt_graphs=0``) then as one graph
launch per request (``rt_graphs=N``), each on a fresh device with ``--vendor``: outputs
against ONNX Runtime and bit-identical between the two, RT latency (median, p99) alone and
beside a closed-loop BE client on a low-priority stream (``--be-model``; no scheduler, no
preemption: the GPU's stream priorities only), the dispatcher's host µs per request and
per kernel, and the graph launches / refusals. Printed whole as ``gpu_graphs_rt: {...}``
as soon as it is done (before the BE modes).

    python scripts/gpu_graphs_check.py --out DIR                 # GPU, full-size resnet152
    python scripts/gpu_graphs_check.py --out DIR --rt-graphs 2 --vendor auto   # + RT mode
    python scripts/gpu_graphs_check.py --emulate --variant scaled --model tiny_cnn --out DIR
    python scripts/gpu_graphs_check.py --out DIR --vendor force --vendor-graphs 2 --graph-ops 1,4
    python scripts/gpu_graphs_check.py --emulate --variant scaled --model tiny_cnn \
        --rt-graphs 2 --rt-only --vendor force --out DIR

Writes ``DIR/gpu_graphs.json`` and prints it whole as the last line (``gpu_graphs: {...}``:
``scripts/gpu_check.sh`` keeps it in gpu_check.log, its $OUT holds at most ten files);
exit 1 if a check failed, 2 without a device.
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np


def _ort(path: Path, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, x), strict=True))


def run_mode(mode: str, args: argparse.Namespace, plan: Any, x: dict[str, np.ndarray],
             want: dict[str, np.ndarray], graph_ops: int = 1) -> dict[str, Any]:
    from av_infer.devices.cuda import CudaDevice
    from av_infer.devices.cuda_vendor import TOLERANCE, max_error

    vg = args.vendor_graphs if mode == "be" else 0
    dev = CudaDevice(emulate=args.emulate, graphs=mode, c=args.c, graph_ops=graph_ops,
                     vendor=args.vendor if args.vendor_graphs else "off", vendor_graphs=vg)
    q: queue.Queue = queue.Queue()
    s = dev.open_stream(0)
    dev.start(q.put)
    last: dict[int, int] = {}
    comps: dict[tuple[int, int], Any] = {}
    out: dict[str, Any] = {"mode": mode, "graph_ops": graph_ops}
    try:
        h = dev.load_plan(plan)
        n = len(plan.kernels)
        out["graphs"] = dev.telemetry()["graphs"]
        if args.vendor_graphs:
            out["vendor_graphs"] = dev.telemetry()["vendor_graphs"]

        def wait(t: int, k: int) -> None:
            while last.get(t, -1) < k:
                c = q.get(timeout=600)
                comps[(c.task, c.kernel)] = c
                last[c.task] = max(last.get(c.task, -1), c.kernel)

        def run(t: int) -> dict[str, np.ndarray]:
            dev.new_task(h, t)
            dev.write_inputs(t, x)
            dev.enqueue(s, t, 0, n - 1)
            wait(t, n - 1)
            r = dev.read_outputs(t)
            dev.release_task(t)
            return r

        ref = run(1)  # warm-up and reference
        out["max_error"] = max(float(max_error(ref[k], w)) for k, w in want.items())
        out["ok"] = out["max_error"] <= TOLERANCE["fp32"]
        times = []
        for i in range(args.repeats):
            t0 = time.perf_counter()
            r = run(10 + i)
            times.append((time.perf_counter() - t0) * 1e3)
            out["ok"] &= all(np.array_equal(r[k], ref[k]) for k in ref)
        out["e2e_ms_median"] = statistics.median(times)
        st = dev._disp.stream_stats(s)
        out["host_us_per_launch"] = st["host_us_per_launch"]
        rng = random.Random(0)
        stops, caught = [], {"ran": 0, "skipped": 0, "unknown": 0}
        identical = True
        for i in range(args.trials):
            t = 1000 + i
            dev.new_task(h, t)
            dev.write_inputs(t, x)
            dev.enqueue(s, t, 0, n - 1)
            wait(t, rng.randrange(0, n - 1))
            t_flag = time.perf_counter()
            info = dev.reset(s)
            dev.set_preempt(s, True)
            if info is not None:
                wait(info.task, info.last_sent)
            stops.append((time.perf_counter() - t_flag) * 1e6)
            dev.set_preempt(s, False)
            if info is not None and info.task == t:
                for k in range(info.done, info.last_sent + 1):
                    e = comps[(t, k)].executed
                    caught["unknown" if e is None else "ran" if e else "skipped"] += 1
                done = info.done
                while done < n and comps.get((t, done)) is not None \
                        and comps[(t, done)].executed:
                    done += 1  # gated: known to have run (the record's progress)
                if done < n:
                    last[t] = done - 1
                    dev.enqueue(s, t, done, n - 1)
                    wait(t, n - 1)
            r = dev.read_outputs(t)
            identical &= all(np.array_equal(r[k], ref[k]) for k in ref)
            dev.release_task(t)
        out["preempt"] = {"trials": args.trials, "stop_us_p50": float(np.percentile(stops, 50)),
                          "stop_us_p99": float(np.percentile(stops, 99)), "caught": caught,
                          "restored_bit_identical": bool(identical)}
        out["ok"] = bool(out["ok"] and identical)
        out["stream"] = dev._disp.stream_stats(s)
    finally:
        dev.close()
    return out


def _rt_requests(dev: Any, stream: int, handle: Any, x: dict[str, np.ndarray], first_task: int,
                 count: int, waits: dict[int, tuple[int, threading.Event]],
                 gap_s: float = 0.0) -> tuple[list[float], list[dict[str, np.ndarray]]]:
    """``count`` whole requests of ``handle`` on ``stream`` one after another: end-to-end ms
    each (new_task .. read_outputs, as the runtime does them) and the outputs."""
    n = len(handle.plan.kernels)
    times, outs = [], []
    for i in range(count):
        t = first_task + i
        ev = threading.Event()
        waits[t] = (n, ev)
        t0 = time.perf_counter()
        dev.new_task(handle, t)
        dev.write_inputs(t, x)
        dev.enqueue(stream, t, 0, n - 1)
        if not ev.wait(600):
            raise TimeoutError(f"request {t} did not complete")
        outs.append(dev.read_outputs(t))
        dev.release_task(t)
        times.append((time.perf_counter() - t0) * 1e3)
        del waits[t]
        if gap_s:
            time.sleep(gap_s)
    return times, outs


def run_rt(args: argparse.Namespace, plan: Any, x: dict[str, np.ndarray],
           want: dict[str, np.ndarray], be_plan: Any, be_x: dict[str, np.ndarray],
           rt_graphs: int, vendor: str) -> dict[str, Any]:
    """RT requests plain (rt_graphs=0) or as one graph launch each, alone and beside BE."""
    from av_infer.devices.cuda import CudaDevice
    from av_infer.devices.cuda_vendor import TOLERANCE, max_error

    dev = CudaDevice(emulate=args.emulate, c=args.c, rt_graphs=rt_graphs, vendor=vendor)
    waits: dict[int, tuple[int, threading.Event]] = {}

    def on(c: Any) -> None:  # coalesced records, as the engine takes them
        w = waits.get(c.task)
        if w is not None and c.kernel + c.count >= w[0]:
            w[1].set()

    rt_s, be_s = dev.open_stream(1), dev.open_stream(0)
    dev.start(on, coalesce=True)
    out: dict[str, Any] = {"rt_graphs": rt_graphs, "vendor": vendor}
    stop = threading.Event()
    be_done = [0]
    try:
        h = dev.load_plan(plan)
        hb = dev.load_plan(be_plan)
        n = len(plan.kernels)
        out["kernels"] = n
        out["vendor_ops"] = sum(1 for v in (h.vendor or []) if v is not None)
        _, (ref,) = _rt_requests(dev, rt_s, h, x, 1, 1, waits)  # warm-up and reference
        out["max_error"] = max(float(max_error(ref[k], w)) for k, w in want.items())
        out["ok"] = out["max_error"] <= TOLERANCE[plan.precision or "fp32"]
        st0 = dev._disp.stream_stats(rt_s)
        times, outs = _rt_requests(dev, rt_s, h, x, 10, args.repeats, waits)
        st1 = dev._disp.stream_stats(rt_s)
        out["ok"] &= all(np.array_equal(o[k], ref[k]) for o in outs for k in ref)

        def host_s(st: dict[str, Any]) -> float:
            return (st["host_us_per_launch"] or 0.0) * st["launched"] / 1e6

        hs = host_s(st1) - host_s(st0)
        out["alone"] = {"requests": args.repeats, "ms_p50": float(np.percentile(times, 50)),
                        "ms_p99": float(np.percentile(times, 99)),
                        "host_us_per_request": hs / args.repeats * 1e6,
                        "host_us_per_kernel": hs / (st1["launched"] - st0["launched"]) * 1e6}

        def be_loop() -> None:  # closed loop on the low-priority stream, never preempted
            t = 10_000_000
            while not stop.is_set():
                _rt_requests(dev, be_s, hb, be_x, t, 1, waits)
                t += 1
                be_done[0] += 1

        th = threading.Thread(target=be_loop, daemon=True)
        th.start()
        try:
            times, outs = _rt_requests(dev, rt_s, h, x, 1000, args.repeats, waits,
                                       gap_s=args.rt_gap_ms / 1e3)
        finally:
            stop.set()
            th.join(timeout=600)
        out["ok"] &= all(np.array_equal(o[k], ref[k]) for o in outs for k in ref)
        out["beside_be"] = {"requests": args.repeats, "be_model": args.be_model,
                            "ms_p50": float(np.percentile(times, 50)),
                            "ms_p99": float(np.percentile(times, 99)),
                            "be_requests_done": be_done[0]}
        out["ok"] = bool(out["ok"])
        out["rt_stream"] = dev._disp.stream_stats(rt_s)
        out["telemetry_rt_graphs"] = dev.telemetry()["rt_graphs"]
        out["_ref"] = ref
    finally:
        stop.set()
        dev.close()
    return out


def rt_mode(args: argparse.Namespace, plan: Any, x: dict[str, np.ndarray],
            want: dict[str, np.ndarray]) -> dict[str, Any]:
    """Plain vs RT graphs, outputs compared bit for bit; the vendor libraries as asked,
    else our kernels only (said in the result)."""
    from av_infer.devices.cuda_vendor import VendorLibraryError
    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    be_path = zoo.path(args.be_model, args.variant)
    be_plan = compile_model(be_path, name=args.be_model)
    be_x = zoo.sample_inputs(args.be_model, args.variant, seed=4)
    vendor = args.vendor
    res: dict[str, Any] = {"model": args.model, "variant": args.variant, "c": args.c,
                           "emulated": args.emulate, "vendor_asked": vendor}
    try:
        modes = [run_rt(args, plan, x, want, be_plan, be_x, n, vendor)
                 for n in (0, args.rt_graphs)]
    except VendorLibraryError as e:  # raised when the device is made: nothing ran yet
        if vendor == "off":
            raise
        res["vendor_note"] = f"vendor={vendor} refused ({e}); ran vendor=off"
        modes = [run_rt(args, plan, x, want, be_plan, be_x, n, "off")
                 for n in (0, args.rt_graphs)]
    plain, graph = modes
    ref_p, ref_g = plain.pop("_ref"), graph.pop("_ref")
    res["identical_to_plain"] = all(np.array_equal(ref_p[k], ref_g[k]) for k in ref_p)
    res["modes"] = modes
    g_st = graph["rt_stream"]
    res["graph_launches_per_request"] = (g_st["rt_graph_launched"]
                                         / (1 + 2 * args.repeats))
    res["ok"] = bool(plain["ok"] and graph["ok"] and res["identical_to_plain"])
    for part in ("alone", "beside_be"):
        res[f"{part}_ms_p50_graph_over_plain"] = (graph[part]["ms_p50"]
                                                  / plain[part]["ms_p50"])
    res["host_us_per_request"] = {"plain": plain["alone"]["host_us_per_request"],
                                  "graph": graph["alone"]["host_us_per_request"]}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out")
    ap.add_argument("--emulate", action="store_true", help="the CPU emulator (no GPU)")
    ap.add_argument("--model", default="resnet152")
    ap.add_argument("--variant", default="full")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("-c", dest="c", type=int, default=4)
    ap.add_argument("--graph-ops", default="1",
                    help="comma list: run the gated mode with graphs of k ops for each k")
    ap.add_argument("--rt-graphs", type=int, default=0,
                    help="RT mode first: plain vs CudaDevice(rt_graphs=N) (0: no RT mode)")
    ap.add_argument("--rt-only", action="store_true", help="the RT mode only")
    ap.add_argument("--vendor", default="off",
                    help="RT mode (and the BE modes with --vendor-graphs): off | auto | force")
    ap.add_argument("--vendor-graphs", type=int, default=0,
                    help="BE modes with --vendor's ops; gated modes: CudaDevice(vendor_graphs=N)")
    ap.add_argument("--be-model", default="resnet152", help="RT mode: the BE client's model")
    ap.add_argument("--rt-gap-ms", type=float, default=1.0,
                    help="RT mode beside BE: pause between RT requests")
    args = ap.parse_args(argv)
    from av_infer.devices.cuda import availability
    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    ok, why = availability(emulate=args.emulate)
    if not ok:
        print(f"gpu_graphs_check: no device: {why}", file=sys.stderr)
        return 2
    path = zoo.path(args.model, args.variant)
    plan = compile_model(path, name=args.model)
    x = zoo.sample_inputs(args.model, args.variant, seed=3)
    want = _ort(path, x)
    res: dict[str, Any] = {"model": args.model, "variant": args.variant, "c": args.c,
                           "emulated": args.emulate, "modes": []}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.rt_graphs:
        res["rt"] = rt_mode(args, plan, x, want)
        print("gpu_graphs_rt: " + json.dumps(res["rt"], default=str), flush=True)
    runs = [] if args.rt_only else (
        [("off", 1)] + [("be", int(k)) for k in args.graph_ops.split(",") if k.strip()])
    for mode, k in runs:
        res["modes"].append(run_mode(mode, args, plan, x, want, k))
        print(json.dumps(res["modes"][-1], default=str)[:600], flush=True)
    (Path(args.out) / "gpu_graphs.json").write_text(json.dumps(res, indent=1, default=str))
    print("gpu_graphs: " + json.dumps(res, default=str))  # whole, for logs that keep stdout only
    ok = all(m["ok"] for m in res["modes"]) and res.get("rt", {}).get("ok", True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
