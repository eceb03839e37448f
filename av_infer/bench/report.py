"""The benchmark report: one JSON document per workload and a text table per run.

The JSON schema is documented field by field in docs/bench.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from av_infer.bench.harness import Bench, PolicyRun
from av_infer.bench.metrics import summarize
from av_infer.sched.policies import get_policy

SCHEMA_VERSION = 1


def build_report(bench: Bench, runs: list[PolicyRun]) -> dict[str, Any]:
    """Everything about one workload on one device under each policy run."""
    cfg = bench.cfg
    ref = bench.standalone()
    models: dict[str, Any] = {}
    for m, src in bench.sources.items():
        d = src.describe()
        if m in ref:
            d["standalone_p50_ms"] = round(ref[m]["p50_s"] * 1e3, 4)
            d["standalone_p99_ms"] = round(ref[m]["p99_s"] * 1e3, 4)
            d["standalone_n"] = ref[m]["n"]
        models[m] = d
    tasks = []
    for t in bench.wl.tasks:
        dl = (cfg.deadline_ms / 1e3 if cfg.deadline_ms else t.period_s) if t.rt else None
        tasks.append({"id": t.id, "model": t.model, "model_name": t.model_name,
                      "priority": "RT" if t.rt else "BE", "load": t.load_type,
                      "frequency": t.frequency or None,
                      "deadline_ms": round(dl * 1e3, 4) if dl else None})
    policies: dict[str, Any] = {}
    for run in runs:
        sec = _summary(run, ref)
        sec["c"] = run.c
        sec["wall_s"] = round(run.wall_s, 3)
        sec["rt_forecast"] = run.rt_forecast
        policies[run.label or run.policy] = sec
    doc: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "workload": bench.wl.name,
        "workload_file": bench.wl.source,
        "device": cfg.device,
        "gpu": cfg.gpu if cfg.device == "sim" else None,
        "duration_s": cfg.duration,
        "seed": cfg.seed,
        "c": cfg.c,
        "precision": cfg.precision,
        "preempt_drain": cfg.preempt_drain,
        "contention": cfg.contention if cfg.device == "sim" else None,
        **({"host": _host_desc(cfg)} if cfg.device == "sim" and cfg.host not in (None, "none")
           else {}),
        **({"pad": _pad_desc(cfg)} if cfg.device == "sim"
           and getattr(cfg, "pad", None) not in (None, "none") else {}),
        "dkp_placement": cfg.dkp_placement if cfg.device == "sim" else None,
        "scale": cfg.variant if cfg.device != "sim" else cfg.scale,
        "deadline_ms": cfg.deadline_ms,
        "rate_scale": bench.wl.rate_scale,
        "profiles": _profiles_used(bench),
        "models": models,
        "tasks": tasks,
        "policies": policies,
    }
    return doc


def _profiles_used(bench: Bench) -> dict[str, Any] | None:
    """sim: which timing profile each model used (measured, derived, ...), the
    ``--profiles`` directory and ``sim_models``; None on other devices."""
    cfg = bench.cfg
    if cfg.device != "sim":
        return None
    return {"dir": cfg.profiles, "sim_models": cfg.sim_models,
            "by_model": {m: s.profile_source for m, s in bench.sources.items()}}


def _host_desc(cfg: Any) -> dict[str, Any]:
    """The sim's host model of a run (devices.sim_host): its name and costs."""
    from av_infer.devices import sim_host

    return sim_host.describe(cfg.host, cfg.gpu)


def _pad_desc(cfg: Any) -> dict[str, Any]:
    """The sim's padded-launch cost per model of a run (devices.sim_pad)."""
    from av_infer.devices import sim_pad

    return sim_pad.describe(cfg.pad, cfg.gpu)


def _summary(run: PolicyRun, ref: dict[str, dict[str, float]]) -> dict[str, Any]:
    sec = summarize(run.records, run.duration, ref, t0=run.t0, preemptions=run.preemptions,
                    residency=run.residency,
                    preempts=get_policy(run.policy).preempt != "none")
    if run.device:
        sec["device"] = {k: run.device.get(k) for k in (
            "contention", "dkp_placement", "batches", "padded_launches", "padded_blocks")}
    return sec


def sweep_report(bench: Bench, param: str, values: list[int], runs: list[PolicyRun]
                 ) -> dict[str, Any]:
    """A ``--sweep`` document: the usual report plus ``sweep.results[i]`` per value."""
    doc = build_report(bench, [])
    ref = bench.standalone()
    results = []
    for v, run in zip(values, runs):
        sec = _summary(run, ref)
        results.append({param: v, "policy": run.policy, **sec})
    doc["sweep"] = {"param": param, "policy": runs[0].policy if runs else None,
                    "values": values, "results": results}
    return doc


def _f(x: Any, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def table(doc: dict[str, Any]) -> str:
    """A plain-text table, one row per policy."""
    head = (f"{'policy':<18}{'RT p50':>9}{'p99':>9}{'p99.9':>9}{'max':>9}{'+p50%':>8}"
            f"{'+p99%':>8}{'miss':>10}{'RT/s':>8}{'BE/s':>8}{'tot/s':>8}{'disp p99':>9}"
            f"{'pre p50us':>10}{'p99us':>9}{'slow p99':>9}{'#pre':>7}")
    lines = [head, "-" * len(head)]
    for name, p in doc["policies"].items():
        r = p["rt"]
        pre = p["preemption_latency_us"]
        na = "n/a" if not pre.get("applicable", True) else None
        lines.append(
            f"{name:<18}{_f(r['p50_ms']):>9}{_f(r['p99_ms']):>9}{_f(r['p999_ms']):>9}"
            f"{_f(r['max_ms']):>9}{_f(r['increase_pct'], '{:.1f}'):>8}"
            f"{_f(r['increase_p99_pct'], '{:.1f}'):>8}"
            f"{str(r['deadline_misses']) + '/' + str(r['count']):>10}"
            f"{_f(r['throughput_rps'], '{:.1f}'):>8}{_f(p['be']['throughput_rps'], '{:.1f}'):>8}"
            f"{_f(p['throughput_rps'], '{:.1f}'):>8}"
            f"{_f(p['dispatch_latency_us']['p99'], '{:.1f}'):>9}"
            f"{na or _f(pre.get('p50'), '{:.1f}'):>10}{na or _f(pre.get('p99'), '{:.1f}'):>9}"
            f"{_f(p['rt_slowdown']['p99'], '{:.3f}'):>9}"
            f"{p['preemptions']:>7}")
    return "\n".join(lines)


def header(doc: dict[str, Any]) -> str:
    """What was run, and where each model came from."""
    dev = doc["device"] + (f" ({doc['gpu']})" if doc.get("gpu") else "")
    rate = f", RT rates x{doc['rate_scale']:g}" if doc.get("rate_scale", 1.0) != 1.0 else ""
    out = [f"workload {doc['workload']} on {dev}, {doc['duration_s']:g} s, seed {doc['seed']}, "
           f"c={doc['c']}{rate}  (latencies in ms; +p50%/+p99%: increase over standalone)"]
    for m, d in doc["models"].items():
        sa = (f", standalone p50 {d['standalone_p50_ms']:.3f} ms"
              if d.get("standalone_p50_ms") is not None else "")
        prof = f" [{d['profile']} profile]" if d.get("profile") else ""
        out.append(f"  {m:<13} {d['source']}, {d['kernels']} kernels{sa}{prof}")
    return "\n".join(out)


def sweep_table(doc: dict[str, Any]) -> str:
    """One row per swept value."""
    sw = doc["sweep"]
    param = sw["param"]
    head = (f"{param:>4}{'RT p50':>9}{'RT p99':>9}{'pre p50us':>11}{'pre p99us':>11}"
            f"{'pre max':>9}{'BE/s':>9}{'tot/s':>9}")
    lines = [f"sweep of {param} under {sw['policy']}", head, "-" * len(head)]
    for r in sw["results"]:
        pre = r["preemption_latency_us"]
        lines.append(
            f"{r[param]:>4}{_f(r['rt']['p50_ms']):>9}{_f(r['rt']['p99_ms']):>9}"
            f"{_f(pre.get('p50'), '{:.1f}'):>11}{_f(pre.get('p99'), '{:.1f}'):>11}"
            f"{_f(pre.get('max'), '{:.1f}'):>9}{_f(r['be']['throughput_rps'], '{:.1f}'):>9}"
            f"{_f(r['throughput_rps'], '{:.1f}'):>9}")
    return "\n".join(lines)


def write_json(doc: dict[str, Any], path: str | Path) -> Path:
    """Write ``doc`` (indent 2, keys in insertion order)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def human_stream(json_dest: str | Path | None) -> TextIO:
    """Where a command's text goes: stderr when its JSON goes to stdout (``--json -``, so
    stdout stays machine-readable), stdout otherwise."""
    return sys.stderr if json_dest == "-" else sys.stdout


def emit_json(doc: dict[str, Any], json_dest: str | Path | None) -> Path | None:
    """A command's ``--json`` DEST: ``-`` prints ``doc`` to stdout, a path writes it there
    (``write_json``), None does nothing. Returns the path written, if any."""
    if json_dest == "-":
        print(json.dumps(doc, indent=2))
        return None
    return write_json(doc, json_dest) if json_dest else None
