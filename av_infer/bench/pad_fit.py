"""The simulator's padded-launch cost from GPU measurements (issue 33): ``--refit-pad``.

Why: the simulator charged a padded (DKP) launch REEF's 0.8 % (``GpuSpec.pad_overhead``)
while our padded dispatcher costs the RT kernel +17-23 % on the H200 (-15 % for
distilbert), so every contention and host fit missed the ``reef_dkp`` cells
(docs/bench.md "The second H200 lease"). :mod:`devices.sim_pad` makes the cost a per-model
parameter; this module writes its file from either of two sources, as
:mod:`bench.contention_fit` writes ``beta`` and :mod:`bench.host_fit` the host model:

1. **Measured, no BE** (REEF Fig. 18a's shape): the output of
   ``scripts/gpu_pad_select_check.py``, its JSON document (``--out``) or the
   ``gpu_check.log`` its ``pad_select`` step printed into (the whole document, else the
   ``pad_select row: {...}`` line each model prints as soon as it is measured).
   ``overhead[m] = <select>_overhead_pct / 100`` per model (``select``: the ``pad_select``
   the DISB runs used, ``parts`` on both H200 leases). Nothing is simulated.
2. **Fitted on DISB rows**: GPU DISB result files (what ``--compare-sim`` reads); one
   multiplier ``s`` on a base model (``--pad FILE.json``: the measured overheads, so
   ``s`` says how much more a padded launch costs beside BE than alone; without ``--pad``
   a uniform overhead ``s`` for every model) that brings the simulator's ``reef_dkp`` RT
   p50, RT p99 and throughput nearest the GPU's (mean ``log(sim/gpu)^2``, the loss of
   :mod:`bench.contention_fit`). Search: a linear grid over ``[0, hi]``, then golden-section
   steps around the grid's best. The contention and host models of the options are used
   as given.

Limits, said plainly: one number per model (source 1) or one multiplier (source 2); the
no-BE figure is a whole request's slowdown spread evenly over its padded kernels; a fit on
DISB rows also absorbs whatever else the simulator misses under ``reef_dkp``.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from av_infer.bench.compare_sim import (
    CompareOptions,
    GpuFiles,
    compare_docs,
    files_label,
    fit_documents,
    gpu_file_list,
    gpu_of,
    run_twin,
    short_name,
)
from av_infer.bench.contention_fit import (
    FIT_METRICS,
    _command,
    _loss,
    grid_then_golden,
    twin_benches,
)
from av_infer.devices import sim_pad

__all__ = ["FIT_POLICIES", "SELECTS", "fit_per_model", "fit_scale", "format_fit",
           "from_pad_select", "read_pad_select", "refit_pad", "rt_models"]

#: Policies whose rows a DISB fit uses (the only one with padded launches).
FIT_POLICIES = ("reef_dkp",)

#: ``pad_select`` modes whose overhead a pad_select measurement reports.
SELECTS = ("parts", "regs")

#: Search interval of the multiplier ``s`` (source 2).
SCALE_RANGE = (0.0, 4.0)

_ROW = re.compile(r"^pad_select row: (\{.*\})\s*$")


def read_pad_select(path: str | Path) -> dict[str, Any] | None:
    """``{"gpu": name or None, "rows": [...]}`` of a pad_select measurement: its JSON
    document, or a log it printed into (the whole document where the log has it, else the
    per-model ``pad_select row:`` lines). None when ``path`` holds neither (e.g. a DISB
    result file); OSError when it cannot be read."""
    text = Path(path).read_text()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and _is_pad_rows(doc.get("rows")):
        return {"gpu": doc.get("gpu"), "rows": doc["rows"]}
    if doc is not None:
        return None
    lines = text.splitlines()
    for i, ln in enumerate(lines):  # the printed document: from a "{" line to its "}"
        if ln != "{":
            continue
        for j in range(i + 1, len(lines)):
            if lines[j] == "}":
                try:
                    d = json.loads("\n".join(lines[i:j + 1]))
                except ValueError:
                    break
                if isinstance(d, dict) and _is_pad_rows(d.get("rows")):
                    return {"gpu": d.get("gpu"), "rows": d["rows"]}
                break
    rows = []
    for ln in lines:
        m = _ROW.match(ln.strip())
        if m:
            try:
                rows.append(json.loads(m.group(1)))
            except ValueError:
                continue
    return {"gpu": None, "rows": rows} if _is_pad_rows(rows) else None


def _is_pad_rows(rows: Any) -> bool:
    return isinstance(rows, list) and any(
        isinstance(r, dict) and "model" in r
        and any(f"{s}_overhead_pct" in r for s in SELECTS) for r in rows)


def from_pad_select(paths: list[Path], select: str, gpu: str | None
                    ) -> tuple[sim_pad.PadModel, dict[str, Any]]:
    """Source 1 (module docstring): the pad model of pad_select measurements ``paths``
    (a model measured in several: the mean of its overheads) and the fit's record.
    ValueError when ``select`` is not one of :data:`SELECTS`, when no row has its figure,
    when the measurements name different GPUs or none names one and ``gpu`` is None."""
    from av_infer.profiles import gpu_key, gpu_spec

    if select not in SELECTS:
        raise ValueError(f"pad select must be one of {', '.join(SELECTS)}, got {select!r}")
    seen: dict[str, list[float]] = {}
    gpus: dict[str, str] = {}
    points = []
    for p in paths:
        doc = read_pad_select(p)
        if doc is None:
            raise ValueError(f"{p}: not a pad_select measurement")
        if doc.get("gpu"):
            key = gpu_key(str(doc["gpu"]))
            if key:
                gpus.setdefault(key, str(p))
        for r in doc["rows"]:
            v = r.get(f"{select}_overhead_pct")
            if not r.get("ok", True) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            seen.setdefault(str(r["model"]), []).append(v / 100.0)
            points.append({"file": str(p), "model": r["model"],
                           "overhead_pct": round(float(v), 4),
                           "plain_ms": r.get("plain_ms"),
                           f"{select}_ms": r.get(f"{select}_ms")})
    if not seen:
        raise ValueError(f"{', '.join(map(str, paths))}: no model with a "
                         f"{select}_overhead_pct figure")
    if len(gpus) > 1:
        raise ValueError("the pad_select measurements name different GPUs ("
                         + ", ".join(f"{k}: {f}" for k, f in gpus.items()) + ")")
    if gpu is not None:
        name = gpu_spec(gpu).name
        if gpus and name not in gpus:
            raise ValueError(f"the pad_select measurement was made on {next(iter(gpus))}, "
                             f"not {name}")
    elif gpus:
        name = next(iter(gpus))
    else:
        raise ValueError(f"{', '.join(map(str, paths))}: the measurement does not name its "
                         "GPU (rows cut from the log); pass --gpu")
    model = sim_pad.PadModel({m: round(sum(v) / len(v), 6) for m, v in seen.items()},
                             None, name)
    return model, {"source": "pad_select (no BE, REEF Fig. 18a)", "select": select,
                   "points": points}


def _benches(docs: list[dict[str, Any]], opts: CompareOptions, gpu: str,
             policies: list[str]) -> list[tuple[dict[str, Any], Any, list[tuple[str, int]]]]:
    return [b[:3] for b in twin_benches(docs, opts, gpu, policies,
                                        "the padded launch's cost")]


def _rows_with(benches: list[tuple[dict[str, Any], Any, list[tuple[str, int]]]],
               model: sim_pad.PadModel) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for doc, bench, labels in benches:
        bench.cfg = replace(bench.cfg, pad=model)
        twin = run_twin(bench, labels)
        rows += [r for r in compare_docs(doc, twin) if r["metric"] in FIT_METRICS]
    return rows


def _search(evaluate: Any, hi: float, grid: int, refine: int) -> None:
    """A linear grid over ``[0, hi]``, then golden-section steps around its best point
    (``evaluate`` records every point)."""
    grid_then_golden(evaluate, [hi * i / (grid - 1) for i in range(grid)], refine)


def fit_scale(docs: list[dict[str, Any]], opts: CompareOptions, gpu: str,
              base: sim_pad.PadModel, policies: list[str], *, hi: float = SCALE_RANGE[1],
              grid: int = 9, refine: int = 8) -> dict[str, Any]:
    """Source 2 (module docstring): ``{"scale", "loss", "rows", "evaluations"}``."""
    benches = _benches(docs, opts, gpu, policies)
    evals: dict[float, tuple[float, list[dict[str, Any]]]] = {}

    def evaluate(s: float) -> float:
        key = float(f"{max(0.0, s):.5g}")
        if key not in evals:
            rows = _rows_with(benches, base.scaled(key))
            evals[key] = (_loss(rows), rows)
            if opts.progress:
                print(f"  pad scale={key:<9g} loss={evals[key][0]:.6g}", file=sys.stderr)
        return evals[key][0]

    _search(evaluate, hi, grid, refine)
    best = min(evals, key=lambda k: (evals[k][0], k))
    return {"scale": best, "loss": evals[best][0], "rows": evals[best][1],
            "evaluations": [[k, round(v[0], 8)] for k, v in sorted(evals.items())]}


def rt_models(docs: list[dict[str, Any]]) -> list[str]:
    """The models RT clients run in ``docs`` (first seen first): the ones whose padded
    launches the rows measure."""
    out: list[str] = []
    for doc in docs:
        for t in doc.get("tasks", []):
            m = t.get("model")
            if str(t.get("priority", "")).upper() == "RT" and m and m not in out:
                out.append(str(m))
    return out


def fit_per_model(docs: list[dict[str, Any]], opts: CompareOptions, gpu: str,
                  base: sim_pad.PadModel, policies: list[str], start: float, *,
                  sweeps: int = 2, hi: float = SCALE_RANGE[1], grid: int = 9,
                  refine: int = 8) -> dict[str, Any]:
    """Per RT model its own multiplier on ``base`` (coordinate descent from ``start``,
    every model's 1-D search with the others held, ``sweeps`` rounds; the loss is over all
    rows each time). Models no RT client runs keep ``start``. ``{"scales", "loss", "rows",
    "evaluations": [[model, s, loss]...]}``."""
    benches = _benches(docs, opts, gpu, policies)
    models = rt_models(docs)
    scales = dict.fromkeys(models, start)

    def model_of(sc: dict[str, float]) -> sim_pad.PadModel:
        rest = base.scaled(start)
        ov = dict(rest.overhead)
        for m, s in sc.items():
            ov[m] = base.overhead.get(m, 1.0 if base.default is None else base.default) * s
        return sim_pad.PadModel(ov, rest.default, base.gpu)

    evals: list[list[Any]] = []
    best = (_loss(rows0 := _rows_with(benches, model_of(scales))), rows0)
    for _ in range(sweeps):
        for m in models:
            seen: dict[float, tuple[float, list[dict[str, Any]]]] = {}

            def evaluate(s: float, m: str = m, seen: dict = seen) -> float:
                key = float(f"{max(0.0, s):.5g}")
                if key not in seen:
                    rows = _rows_with(benches, model_of({**scales, m: key}))
                    seen[key] = (_loss(rows), rows)
                    evals.append([m, key, round(seen[key][0], 8)])
                    if opts.progress:
                        print(f"  pad {m} scale={key:<9g} loss={seen[key][0]:.6g}",
                              file=sys.stderr)
                return seen[key][0]

            _search(evaluate, hi, grid, refine)
            k = min(seen, key=lambda x: (seen[x][0], abs(x - scales[m])))
            if seen[k][0] < best[0]:
                scales[m] = k
                best = seen[k]
    return {"scales": scales, "loss": best[0], "rows": best[1], "evaluations": evals,
            "model": model_of(scales)}


def refit_pad(sources: GpuFiles, opts: CompareOptions, out: str | Path, *,
              select: str = "parts", policies: list[str] | None = None,
              workloads: list[str] | None = None, per_model: bool = False,
              **kw: Any) -> dict[str, Any]:
    """Write the pad parameter file ``out`` (``--pad FILE.json``) from ``sources``: every
    one a pad_select measurement (source 1) or every one a GPU DISB result file (source 2,
    on the base ``opts.pad``; ``workloads`` restricts the fit so the others can be judged
    held out; ``per_model``: after the one multiplier, one per RT model,
    :func:`fit_per_model`). The fit's document. ValueError, before anything runs, for a
    mix of both."""
    paths = gpu_file_list(sources)
    kinds = [read_pad_select(p) is not None if p.is_file() else False for p in paths]
    if any(kinds) and not all(kinds):
        raise ValueError("--refit-pad takes pad_select measurements or DISB result files, "
                         "not both: " + ", ".join(
                             f"{p} ({'pad_select' if k else 'DISB'})"
                             for p, k in zip(paths, kinds, strict=True)))
    if all(kinds):
        model, info = from_pad_select(paths, select, opts.gpu)
        info = {"from": files_label(sources), **info, "command": _command()}
        sim_pad.save_params(out, model, info)
        return {"params_file": str(out), "gpu": model.gpu, "overhead": dict(model.overhead),
                "default": model.default, **info}
    docs = fit_documents(sources, workloads)
    gpu = gpu_of(docs, opts, sources)
    base = sim_pad.check_pad(opts.pad, gpu) or sim_pad.PadModel({}, 1.0, gpu)
    base = replace(base, gpu=gpu)
    pols = list(policies or FIT_POLICIES)
    fit = fit_scale(docs, replace(opts, pad=None), gpu, base, pols, **kw)
    model = base.scaled(fit["scale"])
    per: dict[str, Any] = {}
    if per_model:
        pm = fit_per_model(docs, replace(opts, pad=None), gpu, base, pols, fit["scale"], **kw)
        if pm["loss"] < fit["loss"]:
            model = pm["model"]
            fit = {**fit, "loss": pm["loss"], "rows": pm["rows"]}
        per = {"per_model": {"scales": pm["scales"], "evaluations": pm["evaluations"],
                             "loss_mean_sq_log": round(pm["loss"], 8)}}
    info = {"from": files_label(sources), "source": "fit on DISB rows",
            "base": str(opts.pad) if opts.pad not in (None, "none")
            else "uniform (every model the same overhead)",
            "scale": fit["scale"],
            "workloads": [short_name(str(d["workload"])) for d in docs],
            "policies": pols, "metrics": list(FIT_METRICS),
            "profiles_dir": opts.profiles, "calibrate": opts.calibrate,
            "contention": opts.contention,
            **({"host": str(opts.host)} if opts.host not in (None, "none") else {}),
            "loss_mean_sq_log": round(fit["loss"], 8),
            "rms_factor": round(math.exp(math.sqrt(fit["loss"])), 6),
            "evaluations": fit["evaluations"], **per, "rows": fit["rows"],
            "command": _command()}
    sim_pad.save_params(out, model, info)
    return {"params_file": str(out), "gpu": gpu, "overhead": dict(model.overhead),
            "default": model.default, **info}


def format_fit(doc: dict[str, Any]) -> str:
    """A few lines: the overheads written, and the fit's rows where one was run."""
    src = doc["from"] if isinstance(doc["from"], str) else ", ".join(doc["from"])
    ov = ", ".join(f"{m} {v * 100:+.1f} %" for m, v in doc["overhead"].items())
    dflt = "" if doc.get("default") is None else f"; others {doc['default'] * 100:+.1f} %"
    lines = [f"pad refit on {doc['gpu']} from {src} ({doc['source']}): "
             f"{ov or '(no model named)'}{dflt} -> {doc['params_file']}"]
    if "scale" in doc:
        lines.append(f"  scale {doc['scale']:g} on {doc['base']}, typical error factor "
                     f"{doc['rms_factor']:.3f}, {len(doc['evaluations'])} evaluations")
        if "per_model" in doc:
            lines.append("  per RT model: " + ", ".join(
                f"{m} x{v:g}" for m, v in doc["per_model"]["scales"].items())
                + f" ({len(doc['per_model']['evaluations'])} evaluations)")
        for r in doc["rows"]:
            err = "-" if r["rel_err"] is None else f"{r['rel_err'] * 100:+.1f}%"
            lines.append(f"  {r['workload']:<11}{r['policy']:<12}{r['metric']:<16}"
                         f"sim {r['sim']}  gpu {r['gpu']}  ({err})")
    return "\n".join(lines)
