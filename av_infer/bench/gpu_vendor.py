"""The vendor-path GPU bench (``scripts/gpu_check.sh`` step ``vendor``; issue 30 items 1, 4).

Per full-size DISB model and precision (fp32, fp16): the plan through ``CudaDevice`` with
vendor ops (``vendor="auto"``: per op the faster of cuDNN/cuBLASLt and ours, measured at
load), checked against ONNX Runtime (CPU) with the precision's tolerance
(``cuda_vendor.TOLERANCE``, printed beside the error), its median latency end to end
(``ours_ms``: inputs in, outputs out, as a client sees it) and enqueue to last kernel,
how many conv/gemm kernels run on vendor ops (``vendor_calls``: how many per library call
path, fused | conv | conv+bias | matmul) and why the rest stay ours, and the same
architecture in PyTorch at the same precision, eager and with a CUDA graph
(``torch_eager_ms``, ``torch_graphs_ms``; fp16: ``half()`` + channels_last).
``host_cost``: µs per launched op of a chain of tiny vendor GEMMs (``vendor="force"``) and
of our tiny kernels: wall time per op (amortised, with ``c`` = 4 in flight: what
``gpu_summary.launch_host_us`` reports, comparable with the 9.5 µs of docs/gpu_results.md),
the dispatcher thread's CPU time per op, and the host time of one transmission itself
(``host_us_per_launch``: table lookup + ``cuLaunchKernel`` or the vendor call + event).

Writes ``gpu_vendor.json`` under ``--out`` after every model (a budget cut keeps what is
done). ``--emulate`` runs it on the CPU emulator with scaled models: every figure is then
labelled ``emulated`` and is not speed. Exit 0 when every row is within its tolerance,
1 otherwise, 2 where there is no GPU (or emulator).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from av_infer.bench.gpu_bench import DISB_ZOO, _driver, _run_task, _run_window, _zoo_plan

__all__ = ["host_cost", "main", "model_rows", "torch_latency_ms"]


def _thread_cpu_s(name: str) -> float | None:
    """CPU seconds of the live thread called ``name`` (None where it cannot be read)."""
    for th in threading.enumerate():
        if th.name == name and th.ident is not None:
            try:
                return time.clock_gettime(time.pthread_getcpuclockid(th.ident))
            except (OSError, AttributeError):
                return None
    return None


def _tiny_gemm_chain(n: int) -> tuple[Any, dict[str, np.ndarray]]:
    """A plan of ``n`` 16x16x16 GEMMs with bias + ReLU, each reading the previous output."""
    from av_infer.model.plan_builder import PlanBuilder

    rng = np.random.default_rng(0)
    b = PlanBuilder("vendor_chain")
    prev = b.tensor("x", (16, 16), role="input")
    w = b.weight("w", (rng.standard_normal((16, 16)) * 0.1).astype(np.float32))
    bias = b.weight("b", np.zeros(16, np.float32))
    for i in range(n):
        y = b.tensor(f"h{i}", (16, 16), role="output" if i == n - 1 else "activation")
        b.kernel("gemm", [prev, w], [y], trans_a=0, trans_b=0, alpha=1.0, beta=1.0, bias=bias,
                 epilogue=[["relu", {}]])
        prev = y
    return b.build(), {"x": rng.standard_normal((16, 16)).astype(np.float32)}


def host_cost(emulate: bool, n_ops: int = 2000, c: int = 4) -> dict[str, Any]:
    """µs per launched op on a chain of ``n_ops`` tiny GEMMs: vendor ops and ours (plain
    kernels), wall per op and dispatcher CPU per op (median of 3 runs each)."""
    from av_infer.devices.cuda import CudaDevice

    plan, x = _tiny_gemm_chain(n_ops)
    out: dict[str, Any] = {"ops": n_ops, "c": c, "emulated": emulate}
    for path, mode in (("vendor", "force"), ("own", "off")):
        dev = CudaDevice(c=c, emulate=emulate, vendor=mode)
        try:
            s, q = _driver(dev)
            h = dev.load_plan(plan)
            nv = sum(1 for v in (h.vendor or []) if v is not None)
            _run_task(dev, s, q, h, plan, x, 1)  # warm-up
            walls, cpus = [], []
            for r in range(3):
                c0 = _thread_cpu_s("av_infer-cuda-dispatch")
                _, dt = _run_window(dev, s, q, h, plan, x, 10 + r)
                c1 = _thread_cpu_s("av_infer-cuda-dispatch")
                walls.append(dt / n_ops * 1e6)
                if c0 is not None and c1 is not None:
                    cpus.append((c1 - c0) / n_ops * 1e6)
            st = dev._disp.stream_stats(s)  # every transmission of the 4 runs
            out[path] = {"vendor_ops": nv, "wall_us_per_op": statistics.median(walls),
                         "dispatcher_cpu_us_per_op": statistics.median(cpus) if cpus else None,
                         "host_us_per_launch": st["host_us_per_launch"],
                         "vendor_host_us_per_launch": st["vendor_host_us_per_launch"]}
        finally:
            dev.close()
    return out


def torch_latency_ms(name: str, precision: str, reps: int = 20
                     ) -> tuple[float | None, float | None]:
    """(eager, CUDA graph) median ms of one batch-1 forward of the zoo model's torch twin at
    ``precision`` (fp32: TF32 off; fp16: half + channels_last), one model instance for
    both; (None, None) without torch / CUDA / a twin."""
    try:
        import torch
    except ImportError:
        return None, None
    if not torch.cuda.is_available():
        return None, None
    from av_infer.bench.gpu_bench import _torch_model

    got = _torch_model(name)
    if got is None:
        return None, None
    m, make = got
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    m = m.cuda().eval()
    x = make("cuda")
    if precision == "fp16":
        m = m.half().to(memory_format=torch.channels_last)
        x = {k: (v.half().contiguous(memory_format=torch.channels_last) if v.dim() == 4 else v)
             for k, v in x.items()}
    s = torch.cuda.Stream()

    def timed(fn: Any) -> float:
        ts = []
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                s.synchronize()
                ts.append(time.perf_counter() - t0)
        return float(np.median(ts)) * 1e3

    try:
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(3):
                m(**x)
        s.synchronize()
        eager = timed(lambda: m(**x))
        graphs = None
        try:  # a model with host-side control flow cannot be captured: eager only
            g = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(g, stream=s):
                m(**x)
            s.synchronize()
            graphs = timed(g.replay)
            del g
        except Exception as e:  # noqa: BLE001 - reported as a missing graph figure
            print(f"[gpu_vendor] {name}: CUDA graph capture failed: {e}", file=sys.stderr)
    finally:
        torch.cuda.synchronize()
    return eager, graphs


def model_rows(emulate: bool, models: list[str], precisions: list[str], scale: str, reps: int,
               vendor: str, save: Any) -> list[dict[str, Any]]:
    """One row per (model, precision); ``save(rows)`` after each."""
    from av_infer.devices.cuda import CudaDevice
    from av_infer.devices.cuda_vendor import TOLERANCE, max_error
    from av_infer.model import zoo
    from av_infer.model.check import ort_session

    rows: list[dict[str, Any]] = []
    refs: dict[str, dict[str, np.ndarray]] = {}
    task = 100
    for precision in precisions:
        dev = CudaDevice(emulate=emulate, vendor=vendor)
        try:
            s, q = _driver(dev)
            for name in models:
                row: dict[str, Any] = {"model": name, "precision": precision, "scale": scale,
                                       "tolerance": TOLERANCE[precision]}
                rows.append(row)
                try:
                    plan, x = _zoo_plan(name, scale)
                    plan.precision = precision
                    if name not in refs:
                        sess = ort_session(str(zoo.path(name, scale)))
                        refs[name] = dict(zip([o.name for o in sess.get_outputs()],
                                              sess.run(None, x), strict=True))
                    t0 = time.perf_counter()
                    h = dev.load_plan(plan)
                    row["load_s"] = round(time.perf_counter() - t0, 2)
                    rep = dev.vendor_report(h)
                    row["vendor_ops"] = sum(1 for r in rep if r["path"] == "vendor")
                    # per library call path (docs/cuda_vendor.md): fused | conv | conv+bias |
                    # matmul, so a run shows how many convs left the fused identity call
                    row["vendor_calls"] = dict(sorted(Counter(
                        r.get("call", "?") for r in rep if r["path"] == "vendor").items()))
                    # which cuDNN algorithm (cudnnConvolutionFwdAlgo_t) per call path
                    row["vendor_conv_algos"] = dict(sorted(Counter(
                        f"{r.get('call', '?')}/{r.get('algo')}" for r in rep
                        if r["path"] == "vendor" and r.get("op") == "conv").items()))
                    # auto mode: the load-time µs of those ops summed per call path
                    us: Counter[str] = Counter()
                    for r in rep:
                        if r["path"] == "vendor" and "vendor_us" in r:
                            us[r.get("call", "?")] += r["vendor_us"]
                    if us:
                        row["vendor_us_by_call"] = {k: round(v, 1) for k, v in sorted(us.items())}
                    # auto mode: ops whose path was measured at this load / read from the
                    # recorded choices (devices/cuda_choices.py)
                    chosen = Counter(r["chosen"] for r in rep if "chosen" in r)
                    if chosen:
                        row["vendor_chosen"] = dict(sorted(chosen.items()))
                    row["own_conv_gemm"] = sorted({r["reason"] for r in rep
                                                   if r["path"] == "own"})
                    row["kernels"] = len(plan.kernels)
                    task += 1
                    got = _run_task(dev, s, q, h, plan, x, task)
                    err = max(max_error(got[k], refs[name][k]) for k in plan.outputs)
                    row.update(max_error=err, ok=bool(err <= TOLERANCE[precision]))
                    e2e, win = [], []
                    for _ in range(reps):
                        task += 1
                        t1 = time.perf_counter()
                        _, dt = _run_window(dev, s, q, h, plan, x, task)
                        e2e.append(time.perf_counter() - t1)
                        win.append(dt)
                    row["ours_ms"] = float(np.median(e2e)) * 1e3
                    row["ours_ms_kernels"] = float(np.median(win)) * 1e3
                    dev.unload_plan(h)
                    print(f"[gpu_vendor] {name} {precision}: max error {err:.2e} (tolerance "
                          f"{TOLERANCE[precision]:.0e}) {'ok' if row['ok'] else 'FAILED'}; "
                          f"ours {row['ours_ms']:.3f} ms, {row['vendor_ops']} vendor ops",
                          file=sys.stderr, flush=True)
                    if not emulate:
                        try:
                            row["torch_eager_ms"], row["torch_graphs_ms"] = torch_latency_ms(
                                name, precision, reps)
                        except Exception as e:  # noqa: BLE001 - a reference may fail
                            row["torch_error"] = f"{type(e).__name__}: {e}"[:200]
                except Exception as e:  # noqa: BLE001 - reported per row
                    row.update(ok=False, error=f"{type(e).__name__}: {e}"[:400])
                save(rows)
        finally:
            dev.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or "out")
    ap.add_argument("--emulate", action="store_true", help="the CPU emulator: no speed")
    ap.add_argument("--scale", choices=["scaled", "full"], default=None)
    ap.add_argument("--models", default=",".join(DISB_ZOO))
    ap.add_argument("--precisions", default="fp32,fp16")
    ap.add_argument("--reps", type=int, default=None, help="runs per latency (20 / 2 emulated)")
    ap.add_argument("--chain-ops", type=int, default=None, help="host-cost chain (2000 / 20)")
    ap.add_argument("--vendor", choices=["auto", "force"], default=None,
                    help="vendor mode for the model rows (auto on a GPU, force emulated)")
    ap.add_argument("--skip-host-cost", action="store_true")
    a = ap.parse_args(argv)
    from av_infer.devices.cuda import availability
    from av_infer.devices.cuda_vendor import PRECISIONS

    emu = a.emulate
    ok, why = availability(emulate=emu)
    if not ok:
        print(f"no {'CUDA emulator' if emu else 'GPU'}: {why}", file=sys.stderr)
        return 2
    precisions = [p.strip() for p in a.precisions.split(",") if p.strip()]
    if set(precisions) - set(PRECISIONS):
        ap.error(f"--precisions: from {PRECISIONS}")
    scale = a.scale or ("scaled" if emu else "full")
    reps = a.reps or (2 if emu else 20)
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"emulated": emu, "scale": scale, "reps": reps,
                           "vendor": a.vendor or ("force" if emu else "auto"),
                           "note": "EMULATED: not speed" if emu else "measured on the GPU",
                           "failures": []}

    def save(rows: Any = None) -> None:
        if rows is not None:
            doc["models"] = rows
        tmp = out_dir / "gpu_vendor.json.tmp"
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        tmp.replace(out_dir / "gpu_vendor.json")

    if not a.skip_host_cost:
        try:
            doc["host_cost"] = host_cost(emu, a.chain_ops or (20 if emu else 2000))
        except Exception as e:  # noqa: BLE001 - the model rows still run
            doc["host_cost"] = {"error": f"{type(e).__name__}: {e}"[:400]}
            doc["failures"].append("host_cost")
        save()
        print(f"[gpu_vendor] host cost per op: {json.dumps(doc['host_cost'])}", file=sys.stderr)
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    rows = model_rows(emu, models, precisions, scale, reps, doc["vendor"], save)
    doc["failures"] += [f"{r['model']}:{r['precision']}" for r in rows if not r.get("ok")]
    save(rows)
    print(f"{'model':<14}{'prec':<6}{'ok':<4}{'max err':>9}{'ours ms':>10}{'torch eager':>12}"
          f"{'torch graphs':>13}{'vendor ops':>11}")
    for r in rows:
        def f(v: Any) -> str:
            return "-" if v is None else f"{v:.3f}"
        print(f"{r['model']:<14}{r['precision']:<6}{'y' if r.get('ok') else 'n':<4}"
              f"{r.get('max_error', float('nan')):>9.1e}{f(r.get('ours_ms')):>10}"
              f"{f(r.get('torch_eager_ms')):>12}{f(r.get('torch_graphs_ms')):>13}"
              f"{r.get('vendor_ops', 0):>11}")
    if doc["failures"]:
        print(f"FAILURES: {doc['failures']}", file=sys.stderr)
    return 1 if doc["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
