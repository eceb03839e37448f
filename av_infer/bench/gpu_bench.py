"""CUDA benchmarks and checks for ``scripts/gpu_check.sh``: every GPU figure of issues 4 and 8
that is not a DISB run (those come from ``av-infer bench --device cuda``).

Sections (keys of ``gpu_check.json``; each is written as soon as it is done, so a run cut
short keeps what it finished):

* ``dispatch``: µs per launch of a tiny kernel chain through the Cython dispatcher.
* ``conv_gemm``: our conv/gemm end to end vs PyTorch (cuDNN/cuBLAS) when installed.
* ``zoo_full_vs_ort``: every zoo model vs ONNX Runtime (max relative error <= 1e-3), the
  latency of our plan (end to end and enqueue-to-last-kernel) and, where present, the same
  architecture in PyTorch (torchvision / transformers, FP32, TF32 off) and ONNX Runtime's
  CUDA provider.
* ``padding_overhead`` (REEF Fig. 18a): per model, the plan run plainly vs with every kernel
  launched through the padded dispatcher kernel with no BE blocks; outputs bit-identical.
* ``dkp_pairs`` (REEF Fig. 16): the RT x BE table of ``reef_dkp`` vs ``reef`` through the
  runtime on the device, with :mod:`av_infer.bench.dkp_pairs`' math.
* ``selection_cost``: where the DKP selection micro-benchmark lives (CPU, not measured here).

``--emulate`` runs all of it on ``CudaDevice(emulate=True)`` (docs/cuda_emu.md) with scaled
models and tiny counts, so CI proves the bench code runs; its numbers are labelled
``"emulated": true`` and say nothing about speed. Prints tables, writes
``<out>/gpu_check.json``, returns non-zero on failures (2: no device).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: The five DISB models (REEF's evaluation set): padding and pair tables use these.
DISB_ZOO = ("vgg19", "resnet152", "densenet201", "inception_v3", "distilbert")
SECTIONS = ("dispatch", "conv_gemm", "zoo", "padding", "pairs")
_PLANS: dict[tuple[str, str], tuple[Any, dict[str, np.ndarray]]] = {}


def _zoo_plan(name: str, scale: str) -> tuple[Any, dict[str, np.ndarray]]:
    """(plan, sample inputs) of a zoo model, compiled once per process."""
    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    key = (name, scale)
    if key not in _PLANS:
        x = zoo.sample_inputs(name, scale, seed=0)
        shapes = {k: list(v.shape) for k, v in x.items()}  # binds symbolic dims (dynamic_cnn)
        _PLANS[key] = (compile_model(zoo.path(name, scale), shapes, name=name), x)
    return _PLANS[key]


def _driver(dev: Any) -> tuple[int, queue.Queue]:
    q: queue.Queue = queue.Queue()
    s = dev.open_stream(0)
    dev.start(q.put)
    return s, q


def _wait_last(q: queue.Queue, task: int, last: int) -> None:
    while True:
        c = q.get(timeout=300)
        if c.task == task and c.kernel == last:
            return


def _run_task(dev: Any, s: int, q: queue.Queue, h: Any, plan: Any, x: dict, task: int) -> dict:
    return _run_window(dev, s, q, h, plan, x, task)[0]


def _run_window(dev: Any, s: int, q: queue.Queue, h: Any, plan: Any, x: dict, task: int,
                before_enqueue: Callable[[], Any] | None = None) -> tuple[dict, float]:
    """One request of ``plan``: outputs and seconds from the enqueue to the completion of
    the last kernel (kernels + dispatch; input/output copies left out)."""
    dev.new_task(h, task)
    dev.write_inputs(task, x)
    if before_enqueue is not None:
        before_enqueue()
    n = len(plan.kernels)
    t0 = time.perf_counter()
    dev.enqueue(s, task, 0, n - 1)
    _wait_last(q, task, n - 1)
    dt = time.perf_counter() - t0
    out = dev.read_outputs(task)
    dev.release_task(task)
    return out, dt


def _identical(got: dict, want: dict) -> bool:
    return set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)


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


def conv_gemm_speed(dev: Any, s: int, q: queue.Queue, small: bool = False,
                    reps: int = 20) -> list[dict]:
    """Our conv/gemm vs torch (cuDNN/cuBLAS) when installed; end-to-end single-kernel plans
    (``small``: emulator-sized shapes)."""
    from av_infer.kernels.cuda.samples import _one

    rng = np.random.default_rng(0)
    r = lambda *sh: rng.standard_normal(sh).astype(np.float32)  # noqa: E731
    ch, hw, n = (16, 14, 128) if small else (64, 56, 1024)
    cases = {
        f"conv {ch}x{hw}x{hw} 3x3 ->{ch}": _one(
            "conv", {"x": r(1, ch, hw, hw)}, {"y": ((1, ch, hw, hw), "float32")},
            {"w": r(ch, ch, 3, 3)}, order=["x", "w"], strides=[1, 1], pads=[1, 1, 1, 1],
            dilations=[1, 1], group=1, bias=None, epilogue=[]),
        f"gemm {n}x{n}x{n}": _one(
            "gemm", {"a": r(n, n)}, {"y": ((n, n), "float32")},
            {"b": r(n, n)}, order=["a", "b"], trans_a=0, trans_b=0, alpha=1.0, beta=1.0,
            bias=None, epilogue=[]),
    }
    flops = {name: 2 * ch * ch * 9 * hw * hw if name.startswith("conv") else 2 * n ** 3
             for name in cases}  # the plan's kernel records none for single-kernel samples
    rows = []
    torch = None
    if not getattr(dev, "emulated", False):
        try:
            import torch
        except ImportError:
            torch = None
    for name, (plan, x) in cases.items():
        ours = _time_plan(dev, s, q, plan, x, reps)
        row = {"case": name, "ours_ms_end_to_end": ours * 1e3,
               "flops": plan.kernels[0].flops or flops[name]}
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


# -- zoo: correctness and latency ------------------------------------------------------------
def _torch_model(name: str) -> tuple[Any, Callable[[Any], Any]] | None:
    """The zoo model's architecture in PyTorch at full size (random weights: latency only),
    and a function making its inputs on the GPU; None where there is none."""
    import torch

    if name == "distilbert":
        from transformers import DistilBertConfig, DistilBertModel

        m = DistilBertModel(DistilBertConfig())

        def make(dev: Any) -> Any:
            return {"input_ids": torch.zeros((1, 128), dtype=torch.long, device=dev),
                    "attention_mask": torch.ones((1, 128), dtype=torch.long, device=dev)}
        return m, make
    import torchvision.models as tvm

    size = 224
    if name == "inception_v3":
        m, size = tvm.inception_v3(weights=None, aux_logits=False, init_weights=False), 299
    elif name in ("vgg19", "resnet152", "densenet201"):
        m = getattr(tvm, name)(weights=None)
    else:
        return None

    def make_img(dev: Any) -> Any:
        return {"x": torch.randn((1, 3, size, size), device=dev)}
    return m, make_img


def torch_reference_ms(name: str, reps: int = 20) -> float | None:
    """Median ms of one batch-1 FP32 forward pass (TF32 off, cuDNN/cuBLAS) of the zoo
    model's architecture in PyTorch; None without torch/CUDA or a torch twin."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    got = _torch_model(name)
    if got is None:
        return None
    m, make = got
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    m = m.cuda().eval()
    x = make("cuda")
    with torch.no_grad():
        for _ in range(3):
            m(**x)
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            m(**x)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
    del m
    torch.cuda.empty_cache()
    return float(np.median(ts)) * 1e3


def ort_cuda_ms(path: str, x: dict, reps: int = 20) -> float | None:
    """Median ms of ONNX Runtime's CUDA provider on the model (None without it)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None
    sess = ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
    for _ in range(3):
        sess.run(None, x)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sess.run(None, x)
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e3


def _references(row: dict[str, Any], name: str, path: str, x: dict, reps: int) -> None:
    """Add ``torch_ms`` / ``ort_cuda_ms`` where this machine has them (else ``*_error`` or
    nothing)."""
    for key, fn in (("torch_ms", lambda: torch_reference_ms(name, reps)),
                    ("ort_cuda_ms", lambda: ort_cuda_ms(path, x, reps))):
        try:
            v = fn()
            if v is not None:
                row[key] = v
        except Exception as e:  # noqa: BLE001 - a reference may be missing
            row[key + "_error"] = f"{type(e).__name__}: {e}"[:200]


def zoo_full_vs_ort(dev: Any, s: int, q: queue.Queue, tol: float = 1e-3,
                    models: Sequence[str] | None = None, scale: str = "full",
                    reps: int = 10) -> list[dict]:
    """Every zoo model vs ONNX Runtime (CPU) within ``tol``, plus our plan's latency and the
    reference latencies that this machine can measure (torch twin, ORT CUDA)."""
    from av_infer.model import zoo
    from av_infer.model.check import max_rel_err, ort_session

    emulated = bool(getattr(dev, "emulated", False))
    rows = []
    for i, name in enumerate(models if models is not None else zoo.names()):
        row: dict[str, Any] = {"model": name, "scale": scale}
        try:
            path = zoo.path(name, scale)
            plan, x = _zoo_plan(name, scale)
            sess = ort_session(str(path))
            want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, x)))
            h = dev.load_plan(plan)
            base = 700_000 + 1000 * i
            got = _run_task(dev, s, q, h, plan, x, base)
            err = max(max_rel_err(got[k], want[k]) for k in plan.outputs)
            row.update(max_rel_err=float(err), ok=bool(err <= tol), kernels=len(plan.kernels))
            e2e, win = [], []
            for r in range(reps):
                t0 = time.perf_counter()
                _, dt = _run_window(dev, s, q, h, plan, x, base + 1 + r)
                e2e.append(time.perf_counter() - t0)
                win.append(dt)
            row.update(ours_ms_e2e=float(np.median(e2e)) * 1e3,
                       ours_ms_kernels=float(np.median(win)) * 1e3)
            dev.unload_plan(h)
            if not emulated and scale == "full":
                _references(row, name, str(path), x, reps)
        except Exception as e:  # noqa: BLE001 - reported per model
            row.update(ok=False, error=f"{type(e).__name__}: {e}"[:300])
        rows.append(row)
    return rows


# -- DKP: the padded dispatcher kernel with no BE blocks (REEF Fig. 18a) ----------------------
def _pad_no_be(dev: Any, s: int, h: Any, task: int) -> int:
    """Make every kernel of ``task`` that can be padded launch as the padded dispatcher
    kernel with the RT part only (``CudaDevice.pad_kernel`` with no parts); returns how
    many kernels that is."""
    return sum(bool(dev.pad_kernel(s, task, k)) for k in range(len(h.src.specs)))


def padding_overhead(dev: Any, s: int, q: queue.Queue, models: Sequence[str] = DISB_ZOO,
                     scale: str = "full", reps: int = 10) -> dict[str, Any]:
    """Per model: median enqueue-to-last-kernel time of the plan run plainly vs every
    kernel through the padded dispatcher with no BE blocks (REEF Fig. 18a: < 1.2%); runs
    alternate, and every output is compared bit for bit with the plain run's.

    One padded module over all ``models`` (REEF's one dispatcher for the resident models;
    one compile, before anything is timed, and the same source the pair table uses)."""
    rows: list[dict[str, Any]] = []
    loaded: dict[str, Any] = {}
    for name in models:
        try:
            loaded[name] = dev.load_plan(_zoo_plan(name, scale)[0])
        except Exception as e:  # noqa: BLE001 - reported per model
            rows.append({"model": name, "scale": scale, "ok": False,
                         "error": f"{type(e).__name__}: {e}"[:300]})
    out: dict[str, Any] = {"scale": scale, "reps": reps, "module_models": list(loaded),
                           "rows": rows}
    try:
        if not loaded:
            return out
        t0 = time.perf_counter()
        dev.prepare_padding(list(loaded.values()))
        out["pad_compile_s"] = time.perf_counter() - t0
        for i, (name, h) in enumerate(loaded.items()):
            row: dict[str, Any] = {"model": name, "scale": scale}
            try:
                x = _zoo_plan(name, scale)[1]
                row.update(_padding_rows(dev, s, q, h, x, 600_000 + 1000 * i, reps))
            except Exception as e:  # noqa: BLE001 - reported per model
                row.update(ok=False, error=f"{type(e).__name__}: {e}"[:300])
            rows.append(row)
    except Exception as e:  # noqa: BLE001 - the module itself failed: every model fails
        rows += [{"model": n, "scale": scale, "ok": False,
                  "error": f"{type(e).__name__}: {e}"[:300]} for n in loaded]
    finally:
        for h in loaded.values():
            dev.unload_plan(h)
    return out


def _padding_rows(dev: Any, s: int, q: queue.Queue, h: Any, x: dict, base: int,
                  reps: int) -> dict[str, Any]:
    """Plain vs padded-no-BE runs of one loaded plan (alternating), bit identity."""
    plan = h.plan
    info: dict[str, Any] = {}

    def pad(task: int) -> Callable[[], None]:
        def go() -> None:
            info["n"] = _pad_no_be(dev, s, h, task)
        return go

    ref, _ = _run_window(dev, s, q, h, plan, x, base)  # warm-ups
    got, _ = _run_window(dev, s, q, h, plan, x, base + 1, pad(base + 1))
    same = _identical(got, ref)
    plain, padded = [], []
    for r in range(reps):
        task = base + 2 + 2 * r
        got, dt = _run_window(dev, s, q, h, plan, x, task)
        plain.append(dt)
        same = same and _identical(got, ref)
        got, dt = _run_window(dev, s, q, h, plan, x, task + 1, pad(task + 1))
        padded.append(dt)
        same = same and _identical(got, ref)
    p, d = float(np.median(plain)), float(np.median(padded))
    return {"kernels": len(plan.kernels), "padded_kernels": info["n"],
            "plain_ms": p * 1e3, "padded_ms": d * 1e3,
            "plain_min_ms": min(plain) * 1e3, "padded_min_ms": min(padded) * 1e3,
            "overhead_pct": 100 * (d / p - 1), "bit_identical": bool(same), "ok": bool(same)}


# -- DKP: the pair table through the runtime (REEF Fig. 16) -----------------------------------
def _closed_pair(rt: Any, rt_m: str, be_m: str, inputs: dict, seconds: float,
                 ref: dict) -> dict[str, Any]:
    """An RT closed loop next to a BE closed loop (BE first, RT 1 ms later) for ``seconds``
    of wall time; both stop resubmitting at the end and are awaited (bounded)."""
    from av_infer.sched.request import Priority

    st0 = rt.stats()
    lock = threading.Lock()
    live = [0]
    idle = threading.Event()
    futs: dict[str, list] = {"rt": [], "be": []}
    errors: list[str] = []
    t_end = [float("inf")]

    def loop(role: str) -> None:
        model, prio = (rt_m, Priority.RT) if role == "rt" else (be_m, Priority.BE)
        f = rt.submit(model, inputs[model], priority=prio, client=f"pair_{role}")
        with lock:
            futs[role].append(f)
            live[0] += 1

        def done(f: Any) -> None:
            exc = f.exception()
            if exc is not None:
                errors.append(f"{role}: {type(exc).__name__}: {exc}"[:200])
            elif rt.now() < t_end[0]:
                loop(role)
            with lock:
                live[0] -= 1
                if live[0] == 0:
                    idle.set()
        f.add_done_callback(done)

    t0 = rt.now()
    t_end[0] = t0 + seconds
    loop("be")
    time.sleep(1e-3)
    loop("rt")
    drained = idle.wait(timeout=max(60.0, 20 * seconds))
    st1 = rt.stats()
    res = {role: [f.result() for f in fs if f.done() and f.exception() is None]
           for role, fs in futs.items()}
    lat = np.array([r.timings.latency for r in res["rt"]]) * 1e3
    identical = all(_identical(r.outputs, ref[rt_m]) for r in res["rt"]) and all(
        _identical(r.outputs, ref[be_m]) for r in res["be"])
    be_done = sum(1 for r in res["be"] if r.timings.end <= t_end[0])
    return {
        "p50": float(np.percentile(lat, 50)) if lat.size else float("nan"),
        "p99": float(np.percentile(lat, 99)) if lat.size else float("nan"),
        "rt": sum(1 for r in res["rt"] if r.timings.end <= t_end[0]),
        "be": be_done, "be_work": be_done,
        "padded": st1["padding"]["kernels"] - st0["padding"]["kernels"],
        "padded_launches": st1["padding"]["launches"] - st0["padding"]["launches"],
        "preemptions": st1.get("preemptions", 0) - st0.get("preemptions", 0),
        "outputs_identical": bool(identical), "drained": bool(drained), "errors": errors,
    }


def dkp_pairs(dev_name: str, models: Sequence[str] = DISB_ZOO, seconds: float = 0.5,
              scale: str = "full", c: int = 4, standalone_n: int = 10,
              budget_s: float | None = None) -> dict[str, Any]:
    """The RT x BE table of ``reef_dkp`` vs ``reef`` on a real (or emulated) device through
    ``Runtime``: per pair an RT closed loop next to a BE closed loop for ``seconds`` under
    each policy; RT latency in ms; BE work = BE requests completed in the window (a device
    gives BE the gaps between RT requests too, so padding is not all it gets, unlike the
    simulator); standalone latencies from ``standalone_n`` requests alone. The padded
    module over all ``models`` is compiled before anything is measured (one dispatcher for
    the resident plans, as REEF's); pairs left when ``budget_s`` runs out are skipped."""
    from av_infer.bench.dkp_pairs import pair_row, pct_change
    from av_infer.runtime import Runtime
    from av_infer.sched.request import Priority

    start = time.perf_counter()
    out: dict[str, Any] = {"device": dev_name, "scale": scale, "seconds": seconds, "c": c,
                           "models": list(models), "rows": [], "skipped": []}
    with Runtime(device=dev_name, policy="reef", c=c) as rt:
        inputs = {}
        for m in models:
            plan, inputs[m] = _zoo_plan(m, scale)
            rt.load_model(m, plan)
        handles = [rt._cache.handle(m) for m in models]
        t0 = time.perf_counter()
        rt.device.prepare_padding(handles)
        out["pad_compile_s"] = time.perf_counter() - t0
        alone, ref = {}, {}
        for m in models:
            r = rt.submit(m, inputs[m], priority=Priority.RT).result(timeout=600)  # warm-up
            ref[m] = r.outputs
            lats = []
            for _ in range(max(1, standalone_n)):
                r = rt.submit(m, inputs[m], priority=Priority.RT).result(timeout=600)
                lats.append(r.timings.latency)
                if not _identical(r.outputs, ref[m]) and m not in out.get("nondeterministic", []):
                    out.setdefault("nondeterministic", []).append(m)
            alone[m] = float(np.median(lats))
        out["standalone_ms"] = {m: v * 1e3 for m, v in alone.items()}
        for rt_m in models:
            for be_m in models:
                if budget_s is not None and time.perf_counter() - start > budget_s:
                    out["skipped"].append([rt_m, be_m])
                    continue
                runs = {}
                for pol in ("reef", "reef_dkp"):
                    rt.set_policy(pol)
                    runs[pol] = _closed_pair(rt, rt_m, be_m, inputs, seconds, ref)
                row = pair_row(rt_m, be_m, runs["reef"], runs["reef_dkp"], alone[rt_m],
                               alone[be_m])
                gain = pct_change(runs["reef_dkp"]["be"], runs["reef"]["be"])
                row["be_throughput_ratio"] = None if gain is None else 1 + gain / 100
                row["outputs_identical"] = all(r["outputs_identical"] for r in runs.values())
                row["reef"], row["reef_dkp"] = runs["reef"], runs["reef_dkp"]
                out["rows"].append(row)
        out["device_padding"] = rt.device.telemetry().get("padding")
    out["wall_s"] = time.perf_counter() - start
    return out


# -- main ------------------------------------------------------------------------------------
def _print_report(res: dict[str, Any]) -> None:
    from av_infer.bench.dkp_pairs import format_table

    if res.get("emulated"):
        print("== EMULATED (CPU emulator, docs/cuda_emu.md): structure and bit identity only; "
              "the times below are NOT GPU speed ==")
    if not _failed(res, "dispatch", "dispatch"):
        d = res["dispatch"]
        print(f"dispatch: {d['us_per_kernel']:.2f} us/kernel (c={d['c']}, {d['kernels']} kernels)")
    for r in [] if _failed(res, "conv_gemm", "conv/gemm") else res["conv_gemm"]:
        print(f"{r['case']:28s} ours {r['ours_ms_end_to_end']:8.3f} ms   "
              f"torch {r.get('torch_ms_kernel', float('nan')):8.3f} ms")
    nan = float("nan")
    if not _failed(res, "zoo_full_vs_ort", "zoo"):
        print(f"\nzoo vs ONNX Runtime ({res['scale']}): ok, max rel err; latency ms: ours end to "
              "end / ours enqueue-to-last-kernel / torch / ORT CUDA")
        for r in res["zoo_full_vs_ort"]:
            if "error" in r:
                print(f"  {r['model']:18s} FAIL {r['error']}")
                continue
            print(f"  {r['model']:18s} {'ok ' if r['ok'] else 'FAIL'} {r['max_rel_err']:9.2e}"
                  f"  {r.get('ours_ms_e2e', nan):9.3f} {r.get('ours_ms_kernels', nan):9.3f}"
                  f" {r.get('torch_ms', nan):9.3f} {r.get('ort_cuda_ms', nan):9.3f}")
    if not _failed(res, "padding_overhead", "padding overhead"):
        po = res["padding_overhead"]
        print("\npadded dispatcher, no BE blocks vs plain (REEF Fig. 18a), enqueue-to-last-kernel "
              f"(one module over {len(po['module_models'])} models, compiled in "
              f"{po.get('pad_compile_s', float('nan')):.1f} s):")
        for r in po["rows"]:
            if "error" in r:
                print(f"  {r['model']:18s} FAIL {r['error']}")
                continue
            print(f"  {r['model']:18s} {r['padded_kernels']:4d}/{r['kernels']:<4d} padded  plain "
                  f"{r['plain_ms']:9.3f} ms  padded {r['padded_ms']:9.3f} ms  "
                  f"{r['overhead_pct']:+7.2f}%  bit-identical {r['bit_identical']}")
    p = res.get("dkp_pairs")
    if not _failed(res, "dkp_pairs", "DKP pairs"):
        print(f"\nDKP pairs on {p['device']} ({p['scale']}, {p['seconds']} s per run; "
              "REEF Fig. 16):")
        print(format_table(p["rows"], p["models"]))
        print("BE requests in the window, reef -> reef_dkp (outputs bit-identical):")
        for r in p["rows"]:
            print(f"  {r['rt']:>12} + {r['be']:<12} {r['reef']['be']:5d} -> "
                  f"{r['reef_dkp']['be']:5d}   padded kernels {r['be_padded_kernels']:6d}  "
                  f"{r['outputs_identical']}")
        if p["skipped"]:
            print(f"  skipped (budget): {len(p['skipped'])} pairs")
    print(f"\nDKP selection cost: {res['selection_cost']['command']} (CPU)")


def _rows(sec: Any) -> list[dict[str, Any]]:
    """The rows of a section's result (a list, or a dict with ``rows``; none on error)."""
    if isinstance(sec, list):
        return sec
    return sec.get("rows", []) if isinstance(sec, dict) else []


def _failed(res: dict[str, Any], key: str, title: str) -> bool:
    sec = res.get(key)
    if isinstance(sec, dict) and "error" in sec:
        print(f"{title}: FAIL {sec['error']}")
        return True
    return sec is None


def _save(out: Path, res: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "gpu_check.json.tmp"
    tmp.write_text(json.dumps(res, indent=2, default=str))
    tmp.replace(out / "gpu_check.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or "out")
    ap.add_argument("--emulate", action="store_true",
                    help="run on the CPU emulator (cuda-emu): proves the code, measures nothing")
    ap.add_argument("--scale", choices=["scaled", "full"], default=None,
                    help="zoo variant (default: full on a GPU, scaled emulated)")
    ap.add_argument("--models", default=None,
                    help="comma list of zoo models for every section (default: all zoo "
                    "models for the ORT check, the five DISB models for padding and pairs)")
    ap.add_argument("--reps", type=int, default=None,
                    help="timed runs per measurement (default 20 on a GPU, 3 emulated)")
    ap.add_argument("--pair-seconds", type=float, default=None,
                    help="seconds per pair and policy (default 0.5 on a GPU, 0.3 emulated)")
    ap.add_argument("--pairs-budget-s", type=float, default=None,
                    help="stop starting pairs after this many seconds (default 180 / 40)")
    ap.add_argument("--dispatch-kernels", type=int, default=None,
                    help="kernels of the dispatch chain (default 2000 on a GPU, 200 emulated)")
    ap.add_argument("--c", type=int, default=4, help="in-flight kernels per stream")
    ap.add_argument("--skip", default="", help=f"comma list of sections to skip: {SECTIONS}")
    ap.add_argument("--skip-zoo", action="store_true", help="same as --skip zoo")
    a = ap.parse_args(argv)
    from av_infer.devices.cuda import CudaDevice, availability

    emu = a.emulate
    ok, why = availability(emulate=emu)
    if not ok:
        print(f"no {'CUDA emulator' if emu else 'GPU'}: {why}", file=sys.stderr)
        return 2
    skip = {x.strip() for x in a.skip.split(",") if x.strip()} | ({"zoo"} if a.skip_zoo else set())
    if skip - set(SECTIONS):
        ap.error(f"--skip: unknown sections {sorted(skip - set(SECTIONS))}")
    scale = a.scale or ("scaled" if emu else "full")
    reps = a.reps or (3 if emu else 20)
    models = [m.strip() for m in a.models.split(",") if m.strip()] if a.models else None
    pair_models = models or list(DISB_ZOO)
    out = Path(a.out)
    res: dict[str, Any] = {
        "emulated": emu, "scale": scale, "reps": reps, "c": a.c,
        "note": ("EMULATED on the CPU (docs/cuda_emu.md): checks structure and bit identity; "
                 "no number here is GPU speed") if emu else "measured on the GPU",
        "selection_cost": {
            "what": "DKP selection per RT kernel (REEF Fig. 19a: 0.2-0.4 us); CPU Cython "
                    "micro-benchmark, no GPU needed; docs/dkp.md 'Selection cost'",
            "command": ".venv/bin/python -m pytest tests/cy/test_bench_dkp.py --benchmark-enable"},
        "section_s": {}, "failures": [],
    }
    fails: list[str] = res["failures"]

    def section(name: str, key: str, fn: Callable[[], Any]) -> Any:
        """Run one section, store its result under ``key`` (``{"error": ...}`` if it
        raised: the other sections still run) and save the JSON at once."""
        t0 = time.perf_counter()
        print(f"[gpu_bench] {name} ...", file=sys.stderr, flush=True)
        try:
            res[key] = fn()
        except Exception as e:  # noqa: BLE001 - reported, the rest still counts
            res[key] = {"error": f"{type(e).__name__}: {e}"[:300]}
            fails.append(name)
        finally:
            res["section_s"][name] = round(time.perf_counter() - t0, 3)
            _save(out, res)
        return res[key]

    dev = CudaDevice(c=a.c, emulate=emu)
    try:
        res["telemetry"] = dev.telemetry()
        s, q = _driver(dev)
        if "dispatch" not in skip:
            n = a.dispatch_kernels or (200 if emu else 2000)
            section("dispatch", "dispatch", lambda: dispatch_overhead(dev, s, q, n))
        if "conv_gemm" not in skip:
            section("conv_gemm", "conv_gemm",
                    lambda: conv_gemm_speed(dev, s, q, small=emu, reps=reps))
        if "zoo" not in skip:
            zr = section("zoo", "zoo_full_vs_ort", lambda: zoo_full_vs_ort(
                dev, s, q, models=models, scale=scale, reps=reps))
            fails += [f"zoo:{r['model']}" for r in _rows(zr) if not r.get("ok")]
        if "padding" not in skip:
            pr = section("padding", "padding_overhead", lambda: padding_overhead(
                dev, s, q, pair_models, scale, reps))
            fails += [f"padding:{r['model']}" for r in _rows(pr) if not r.get("ok")]
    finally:
        dev.close()
    if "pairs" not in skip:
        p = section("pairs", "dkp_pairs", lambda: dkp_pairs(
            "cuda-emu" if emu else "cuda", pair_models, a.pair_seconds or (0.3 if emu else 0.5),
            scale, a.c, standalone_n=2 if emu else 10,
            budget_s=a.pairs_budget_s or (40.0 if emu else 180.0)))
        fails += [f"pairs:{r['rt']}+{r['be']}" for r in _rows(p) if not r["outputs_identical"]]
        fails += [f"pairs:nondeterministic:{m}" for m in p.get("nondeterministic", [])]
    _save(out, res)
    _print_report(res)
    if fails:
        print(f"FAILURES: {fails}", file=sys.stderr)
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
