"""Refit the simulator's contention model to rows measured on a GPU (issue 33).

Why: the ``calibrated`` (``paper``) model's one parameter, ``beta`` (the traffic multiplier
of :mod:`av_infer.devices.sim_contention`), was fitted to one figure of REEF's paper
(``streams`` costs RT 1.84x on DISB A). Once a GPU has measured DISB under policies that
co-run RT and BE work (``streams``, ``reef_dkp``), ``beta`` can come from those rows.

What the fit does (:func:`fit_beta`): for a candidate ``beta`` the simulator re-runs every
GPU document's fitted policies (:mod:`av_infer.bench.compare_sim`'s twins: same
workload, rates, duration, seed, ``c``, the same profiles and calibration) and the loss is
the mean over rows of ``log(sim / gpu)^2`` for RT p50, RT p99 and total throughput
(:data:`FIT_METRICS`; a row whose simulated value is 0 or missing counts as a factor of
1000 off). The search is a log-spaced grid over ``[lo, hi]`` followed by golden-section
refinement around the grid's best point; the simulator is deterministic, so the loss is a
function of ``beta`` alone. Each document's standalone reference is run once (contention
does not change a model alone: one stream runs in order).

Output (:func:`refit`): a parameter file ``sim_contention.load_params`` reads
(``--contention FILE.json``), whose ``fit`` says where it came from, the loss, every
evaluation and the rows at the optimum. The ``paper`` model stays available by name.

Limits, said plainly: ``beta`` is one number per GPU; if the GPU's rows are not explained
by the bandwidth-share model at any ``beta`` (e.g. a GPU run dominated by host overhead or
by overload), the fit returns the least-bad ``beta`` and a large loss, and says so.
"""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from av_infer.bench.compare_sim import (
    CompareOptions,
    GpuFiles,
    compare_docs,
    files_label,
    fit_documents,
    gpu_of,
    run_twin,
    short_name,
    twin_bench,
)

__all__ = ["FIT_METRICS", "fit_beta", "format_fit", "refit"]

#: Metrics the loss compares (compare_sim.METRICS names).
FIT_METRICS = ("rt_p50_ms", "rt_p99_ms", "throughput_rps")

#: Default search interval of ``beta`` (the paper fits are 55 on mi50 and 180 on h100).
BETA_RANGE = (1.0, 2000.0)

#: log-ratio charged for a row the simulator did not produce (a factor of 1000).
_MISSING = math.log(1000.0)



def grid_then_golden(evaluate: Callable[[float], float], xs: list[float], refine: int) -> None:
    """The one-parameter search of every refit here (contention, host, pad): ``evaluate``
    at each grid point ``xs`` (ascending, in the search's coordinate: the caller maps it to
    the parameter, e.g. through ``exp`` for a log grid), then ``refine`` golden-section
    steps inside the bracket of the grid's best point and its neighbours. ``evaluate``
    records what it sees (the callers keep every point and pick the best of all)."""
    losses = [evaluate(x) for x in xs]
    i = min(range(len(xs)), key=lambda j: (losses[j], j))
    a, b = xs[max(0, i - 1)], xs[min(len(xs) - 1, i + 1)]
    phi = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = b - phi * (b - a), a + phi * (b - a)
    fc, fd = evaluate(c), evaluate(d)
    for _ in range(refine):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - phi * (b - a)
            fc = evaluate(c)
        else:
            a, c, fc = c, d, fd
            d = a + phi * (b - a)
            fd = evaluate(d)

def twin_benches(docs: list[dict[str, Any]], opts: CompareOptions, gpu: str,
                 policies: list[str], what: str
                 ) -> list[tuple[dict[str, Any], Any, Any, list[str]]]:
    """Per GPU document with rows of ``policies``: (the document cut to them, its simulated
    twin, the twin's labels, those policies), for the host and pad refits. ValueError naming
    ``what`` when no document has such a row the simulator can run."""
    benches = []
    for doc in docs:
        pols = [p for p in policies if p in doc["policies"]]
        if not pols:
            continue
        sub = {**doc, "policies": {k: doc["policies"][k] for k in pols}}
        bench, labels = twin_bench(sub, replace(opts, policies=pols), gpu)
        if labels:
            benches.append((sub, bench, labels, pols))
    if not benches:
        raise ValueError(f"the GPU results have no row of {', '.join(policies)} the "
                         f"simulator can run: nothing to fit {what} to")
    return benches

def _loss(rows: list[dict[str, Any]]) -> float:
    errs = []
    for r in rows:
        g, s = r["gpu"], r["sim"]
        if g is None or g <= 0:
            continue
        errs.append(_MISSING if s is None or s <= 0 else math.log(s / g))
    if not errs:
        raise ValueError("no measured row to fit (every GPU value is missing or 0)")
    return sum(e * e for e in errs) / len(errs)


def fit_beta(docs: list[dict[str, Any]], opts: CompareOptions, gpu: str,
             policies: list[str], *, lo: float = BETA_RANGE[0], hi: float = BETA_RANGE[1],
             grid: int = 12, refine: int = 12) -> dict[str, Any]:
    """Fit ``beta`` to the rows of ``policies`` in the GPU documents ``docs``.

    Returns ``{"beta", "loss", "rows" (at the optimum), "evaluations": [[beta, loss]...],
    "policies", "metrics"}``. ValueError when no document has a row of ``policies``."""
    if not (0 < lo < hi) or grid < 3:
        raise ValueError(f"need 0 < lo < hi and grid >= 3, got {lo}, {hi}, {grid}")
    benches = []
    for doc in docs:
        sub = {**doc, "policies": {k: v for k, v in doc["policies"].items()
                                   if k in policies}}
        if not sub["policies"]:
            continue
        bench, labels = twin_bench(sub, replace(opts, policies=list(policies)), gpu)
        if labels:
            benches.append((sub, bench, labels))
    if not benches:
        raise ValueError(f"the GPU results have no row of {', '.join(policies)} the "
                         "simulator can run: nothing to fit")
    evals: dict[float, tuple[float, list[dict[str, Any]]]] = {}

    def evaluate(beta: float) -> float:
        key = float(f"{beta:.6g}")
        if key not in evals:
            rows: list[dict[str, Any]] = []
            for doc, bench, labels in benches:
                bench.cfg = replace(bench.cfg, contention=f"beta={key}")
                twin = run_twin(bench, labels)
                rows += [r for r in compare_docs(doc, twin) if r["metric"] in FIT_METRICS]
            evals[key] = (_loss(rows), rows)
            if opts.progress:
                print(f"  beta={key:<10g} loss={evals[key][0]:.6g}", file=sys.stderr)
        return evals[key][0]

    xs = [math.log(lo) + i * (math.log(hi) - math.log(lo)) / (grid - 1) for i in range(grid)]
    grid_then_golden(lambda x: evaluate(math.exp(x)), xs, refine)
    best = min(evals, key=lambda k: (evals[k][0], k))
    return {"beta": best, "loss": evals[best][0], "rows": evals[best][1],
            "evaluations": [[k, round(v[0], 8)] for k, v in sorted(evals.items())],
            "policies": list(policies), "metrics": list(FIT_METRICS)}


def refit(gpu_file: GpuFiles, opts: CompareOptions, policies: list[str],
          out: str | Path, *, workloads: list[str] | None = None,
          **kw: Any) -> dict[str, Any]:
    """Fit ``beta`` to the rows of ``policies`` in ``gpu_file`` (one GPU result file, or
    several fitted as one: every row of every file counts once) and write the parameter
    file ``out``; the fit's document (``params_file``, ``gpu``, ``beta``, ``loss``, ...;
    ``from`` is the path, or the list of paths for several files).

    ``workloads`` (short names, e.g. ``["A"]``; None: all) restricts the fit to those
    workloads of the file, so the others can be judged held out (``--compare-sim`` with
    the parameter file). ValueError, before anything runs, when the file has none of them."""
    from av_infer.devices import sim_contention

    docs = fit_documents(gpu_file, workloads)
    gpu = gpu_of(docs, opts, gpu_file)
    fit = fit_beta(docs, opts, gpu, policies, **kw)
    rms = math.sqrt(fit["loss"])
    info = {"from": files_label(gpu_file),
            "workloads": [short_name(str(d["workload"])) for d in docs],
            "policies": fit["policies"], "metrics": fit["metrics"],
            "profiles_dir": opts.profiles, "calibrate": opts.calibrate,
            **({"host": str(opts.host)} if opts.host not in (None, "none") else {}),
            "loss_mean_sq_log": round(fit["loss"], 8),
            "rms_factor": round(math.exp(rms), 6), "evaluations": fit["evaluations"],
            "rows": fit["rows"], "command": _command()}
    sim_contention.save_params(out, gpu, fit["beta"], info)
    return {"params_file": str(out), "gpu": gpu, "beta": fit["beta"], **info}


def _command() -> str:
    """The command line that ran the fit, as ``av-infer bench ...`` (the CLI's ``argv``
    already starts with the ``bench`` subcommand); "" when called from Python."""
    args = sys.argv[1:]
    if not args:
        return ""
    if args[0] == "bench":
        args = args[1:]
    return "av-infer bench " + " ".join(shlex.quote(a) for a in args)


def format_fit(doc: dict[str, Any]) -> str:
    """A few lines: the fitted beta, the loss, the rows at the optimum."""
    src = doc["from"] if isinstance(doc["from"], str) else ", ".join(doc["from"])
    lines = [f"contention refit on {doc['gpu']} from {src} "
             f"({', '.join(doc.get('workloads') or [])}; {', '.join(doc['policies'])}): "
             f"beta = {doc['beta']:g}, typical error factor "
             f"{doc['rms_factor']:.3f} (exp of the RMS log error), "
             f"{len(doc['evaluations'])} evaluations -> {doc['params_file']}"]
    for r in doc["rows"]:
        err = "-" if r["rel_err"] is None else f"{r['rel_err'] * 100:+.1f}%"
        lines.append(f"  {r['workload']:<8}{r['policy']:<12}{r['metric']:<16}"
                     f"sim {r['sim']}  gpu {r['gpu']}  ({err})")
    return "\n".join(lines)
