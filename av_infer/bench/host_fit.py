"""Fit the simulator's host model to a DISB run measured on a GPU (issue 33).

Why: on the H200 run of 2026-11-27 the simulator was off whatever the contention
parameter, because the GPU's requests start ~1 ms after arrival alone and several ms
after it under BE load, on the host (docs/sim_fidelity.md §6). :mod:`devices.sim_host`
models that with three numbers; this module takes them from the GPU's own rows, as
:mod:`bench.contention_fit` takes ``beta``. ``av-infer bench --refit-host GPU_JSON
--params-out FILE.json``.

The fit, in two steps (each from rows the other does not use):

1. **Start work** ``start_us + per_kernel_us x kernels``: a line, both >= 0, through
   (a) each model's standalone p50 on the GPU minus the simulator's (host model off: the
   simulator's is the kernels, the GPU's the kernels plus the host start), and (b) each
   single-RT-model workload's ``rt_only`` ``first_kernel_us`` p50 on the GPU (arrival to
   first kernel with nothing else running) minus the launch latency, which replaces (a)'s
   point of that model in that document (a direct measurement of the start; the standalone
   gap also holds the in-stream kernels' difference from their profile, -0.2 to -0.4 ms
   for vgg19 on the H200). Kernel counts are the GPU document's
   (``models.<m>.kernels``). Closed form.
   Least absolute deviations (:func:`_l1_line`): on the H200 run one standalone p50
   (resnet152 on C: 0.3 ms over its kernels, 1.5 ms on A) is far from the others.
2. **Completion work** ``complete_us`` (the host-contention term): with step 1's start
   work on the one FIFO host, the value whose simulated RT ``first_kernel_us`` p50 and p99
   under the policies that co-run BE (default ``streams,reef,reef_dkp``) are nearest the
   GPU's (mean ``log(sim/gpu)^2``). Search: a grid over ``[0, hi]`` (0 and log-spaced
   points), then golden-section steps around the grid's best. RT latency and throughput are
   not in the loss: they are what the model is judged on.

The contention model of the options (``--contention``) is used as given; a host model is
fitted before ``beta`` (``--refit-contention ... --host FILE.json`` then fits ``beta`` with
it).

Limits, said plainly: the host model is one FIFO server with fixed costs; what it does not
explain (jitter, GIL switching, several host threads) stays in the loss, which the file
records with every evaluation.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from av_infer.bench.compare_sim import (
    CompareOptions,
    GpuFiles,
    files_label,
    fit_documents,
    gpu_of,
    run_twin,
    short_name,
    twin_bench,
)
from av_infer.bench.contention_fit import _command, grid_then_golden, twin_benches
from av_infer.devices import sim_host

__all__ = ["FIT_POLICIES", "fit_complete", "fit_start", "format_fit", "refit_host"]

#: Policies whose first-kernel delays fit ``complete_us`` (BE runs beside RT in them).
FIT_POLICIES = ("streams", "reef", "reef_dkp")

#: Search interval of ``complete_us``, µs.
COMPLETE_RANGE = (0.5, 200.0)

_MISSING = math.log(1000.0)


def _l1_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """``(a, b)`` >= 0 minimising ``sum |a + b x - y|`` over ``points`` (least absolute
    deviations: one noisy standalone p50 does not pull the line, as it does a least-squares
    one). An optimum passes through two points (or is a median with ``b = 0`` or a line
    through the origin), so the candidates are those; ties: the smaller ``b``."""
    if not points:
        raise ValueError("no point to fit the host start work to")
    ys = sorted(y for _, y in points)
    cands = [(max(0.0, ys[(len(ys) - 1) // 2]), 0.0)]
    for i, (x1, y1) in enumerate(points):
        if x1 > 0:
            cands.append((0.0, max(0.0, y1 / x1)))
        for x2, y2 in points[i + 1:]:
            if x2 != x1:
                b = (y2 - y1) / (x2 - x1)
                a = y1 - b * x1
                if a >= 0 and b >= 0:
                    cands.append((a, b))

    def sad(ab: tuple[float, float]) -> float:
        return sum(abs(ab[0] + ab[1] * x - y) for x, y in points)

    return min(cands, key=lambda ab: (round(sad(ab), 6), ab[1]))


def fit_start(docs: list[dict[str, Any]], opts: CompareOptions, gpu: str
              ) -> dict[str, Any]:
    """Step 1 (module docstring): ``{"start_us", "per_kernel_us", "points": [...]}``;
    each point ``{"workload", "model", "what", "kernels", "gap_us"}``."""
    from av_infer.profiles import gpu_spec

    launch_us = gpu_spec(gpu).launch_us
    points: list[dict[str, Any]] = []
    for doc in docs:
        wl = short_name(str(doc["workload"]))
        gmodels = doc.get("models", {})
        bench, _ = twin_bench(doc, replace(opts, host=None, policies=[]), gpu)
        ref = bench.standalone()
        rt_models = {t.get("model") for t in doc.get("tasks", [])
                     if str(t.get("priority", "")).upper() == "RT"}
        fk = ((doc["policies"].get("rt_only") or {}).get("first_kernel_us") or {}).get("p50")
        direct = next(iter(rt_models)) if len(rt_models) == 1 and isinstance(
            fk, (int, float)) else None
        for m, g in gmodels.items():
            if m == direct:
                continue
            n = int((g or {}).get("kernels") or 0)
            gms = (g or {}).get("standalone_p50_ms")
            if n <= 0 or not gms or m not in ref:
                continue
            points.append({"workload": wl, "model": m, "what": "standalone_p50",
                           "kernels": n, "gap_us": round((gms - ref[m]["p50_s"] * 1e3)
                                                         * 1e3, 3)})
        if direct is not None:
            m = direct
            n = int((gmodels.get(m) or {}).get("kernels") or 0)
            if n > 0:
                points.append({"workload": wl, "model": m, "what": "rt_only first_kernel_p50",
                               "kernels": n, "gap_us": round(fk - launch_us, 3)})
    if not points:
        raise ValueError("the GPU results have no standalone p50 with a kernel count and no "
                         "rt_only first_kernel_us: nothing to fit the start work to")
    a, b = _l1_line([(p["kernels"], p["gap_us"]) for p in points])
    for p in points:
        p["model_us"] = round(a + b * p["kernels"], 3)
    return {"start_us": round(a, 4), "per_kernel_us": round(b, 5), "points": points}


def _fk_rows(doc: dict[str, Any], twin: dict[str, Any], policies: list[str]
             ) -> list[dict[str, Any]]:
    wl = short_name(str(doc["workload"]))
    rows = []
    for pol in policies:
        g = (doc["policies"].get(pol) or {}).get("first_kernel_us") or {}
        s = (twin["policies"].get(pol) or {}).get("first_kernel_us") or {}
        for q in ("p50", "p99"):
            if isinstance(g.get(q), (int, float)) and g[q] > 0:
                sv = s.get(q)
                rows.append({"workload": wl, "policy": pol, "metric": f"first_kernel_{q}_us",
                             "sim": None if sv is None else round(float(sv), 3),
                             "gpu": round(float(g[q]), 3)})
    return rows


def _loss(rows: list[dict[str, Any]]) -> float:
    errs = [_MISSING if r["sim"] is None or r["sim"] <= 0 else math.log(r["sim"] / r["gpu"])
            for r in rows]
    if not errs:
        raise ValueError("no measured first_kernel_us row to fit complete_us to")
    return sum(e * e for e in errs) / len(errs)


def fit_complete(docs: list[dict[str, Any]], opts: CompareOptions, gpu: str,
                 start_us: float, per_kernel_us: float, policies: list[str], *,
                 hi: float = COMPLETE_RANGE[1], grid: int = 9, refine: int = 6
                 ) -> dict[str, Any]:
    """Step 2 (module docstring): ``{"complete_us", "loss", "rows", "evaluations"}``."""
    benches = twin_benches(docs, opts, gpu, policies, "complete_us")
    evals: dict[float, tuple[float, list[dict[str, Any]]]] = {}

    def evaluate(k: float) -> float:
        key = float(f"{k:.5g}")
        if key not in evals:
            model = sim_host.HostModel(start_us, per_kernel_us, key, gpu)
            rows: list[dict[str, Any]] = []
            for doc, bench, labels, pols in benches:
                bench.cfg = replace(bench.cfg, host=model)
                rows += _fk_rows(doc, run_twin(bench, labels), pols)
            evals[key] = (_loss(rows), rows)
            if opts.progress:
                print(f"  complete_us={key:<9g} loss={evals[key][0]:.6g}", file=sys.stderr)
        return evals[key][0]

    lo = COMPLETE_RANGE[0]
    xs = [0.0] + [math.exp(math.log(lo) + i * (math.log(hi) - math.log(lo)) / (grid - 2))
                  for i in range(grid - 1)]
    grid_then_golden(evaluate, xs, refine)
    best = min(evals, key=lambda k: (evals[k][0], k))
    return {"complete_us": best, "loss": evals[best][0], "rows": evals[best][1],
            "evaluations": [[k, round(v[0], 8)] for k, v in sorted(evals.items())]}


def refit_host(gpu_file: GpuFiles, opts: CompareOptions, out: str | Path, *,
               policies: list[str] | None = None, workloads: list[str] | None = None,
               complete: bool = True, **kw: Any) -> dict[str, Any]:
    """Fit the host model to ``gpu_file`` (one GPU result file or several read as one;
    both steps) and write the parameter file ``out`` (``--host FILE.json``); the fit's
    document. ``workloads`` (short names; None:
    all) restricts the fit to those workloads so the others can be judged held out;
    ``complete=False`` skips step 2 (``complete_us`` = 0: start work on the FIFO host only).
    ValueError, before anything runs, when the file has none of them."""
    docs = fit_documents(gpu_file, workloads)
    gpu = gpu_of(docs, opts, gpu_file)
    pols = list(policies or FIT_POLICIES)
    st = fit_start(docs, opts, gpu)
    if complete:
        comp = fit_complete(docs, opts, gpu, st["start_us"], st["per_kernel_us"], pols, **kw)
    else:
        comp = {"complete_us": 0.0, "loss": 0.0, "rows": [], "evaluations": [],
                "skipped": True}
    model = sim_host.HostModel(st["start_us"], st["per_kernel_us"], comp["complete_us"], gpu)
    info = {"from": files_label(gpu_file),
            "workloads": [short_name(str(d["workload"])) for d in docs],
            "profiles_dir": opts.profiles, "calibrate": opts.calibrate,
            "contention": opts.contention,
            "start": {"points": st["points"], "method": "least absolute deviations, a, b >= 0"},
            "complete": {"policies": pols, "metrics": ["first_kernel_p50_us",
                                                       "first_kernel_p99_us"],
                         "fitted": not comp.get("skipped", False),
                         "loss_mean_sq_log": round(comp["loss"], 8),
                         "rms_factor": round(math.exp(math.sqrt(comp["loss"])), 6),
                         "evaluations": comp["evaluations"], "rows": comp["rows"]},
            "command": _command()}
    sim_host.save_params(out, model, info)
    return {"params_file": str(out), "gpu": gpu, "start_us": model.start_us,
            "per_kernel_us": model.per_kernel_us, "complete_us": model.complete_us, **info}


def format_fit(doc: dict[str, Any]) -> str:
    """A few lines: the fitted numbers, the start points, the first-kernel rows."""
    c = doc["complete"]
    src = doc["from"] if isinstance(doc["from"], str) else ", ".join(doc["from"])
    lines = [f"host refit on {doc['gpu']} from {src} ({', '.join(doc['workloads'])}):"
             f" start {doc['start_us']:g} us + {doc['per_kernel_us']:g} us/kernel, "
             f"complete {doc['complete_us']:g} us/kernel -> {doc['params_file']}",
             "  start work points (gpu gap vs model, us):"]
    for p in doc["start"]["points"]:
        lines.append(f"    {p['workload']:<8}{p['model']:<14}{p['what']:<26}"
                     f"n={p['kernels']:<5} {p['gap_us']:>9.1f}  model {p['model_us']:.1f}")
    if not c.get("fitted", True):
        lines.append("  complete_us not fitted (--host-no-complete): 0")
        return "\n".join(lines)
    lines.append(f"  first-kernel rows at the optimum (typical error factor "
                 f"{c['rms_factor']:.3f}, {len(c['evaluations'])} evaluations):")
    for r in c["rows"]:
        lines.append(f"    {r['workload']:<8}{r['policy']:<12}{r['metric']:<22}"
                     f"sim {r['sim']}  gpu {r['gpu']}")
    return "\n".join(lines)
