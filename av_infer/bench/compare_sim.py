"""Simulated vs measured: the simulator re-runs a GPU benchmark and says how far it is off.

Why: the simulator is how this project reasons past the hardware it can reach; that is only
worth something where it agrees with the hardware (issue 33). ``av-infer bench
--compare-sim GPU_JSON`` reads a DISB result measured on the ``cuda`` device, runs the same
workloads, policies, rates, durations, seed and ``c`` on the ``sim`` device, and reports
per workload and policy the simulated and measured values of

* ``throughput_rps`` (RT + BE requests completed in the window per second),
* ``rt_p50_ms``, ``rt_p99_ms`` (RT latency over all RT clients),
* ``be_throughput_rps`` (reported, no target),
* ``rt_first_kernel_p50_us``, ``rt_first_kernel_p99_us`` (RT arrival to its first kernel;
  reported, no target: what the host model, ``host``, is fitted to),

with ``rel_err = (sim - gpu) / gpu`` (None where the GPU value is 0) and ``within``: the
issue's targets, |rel_err| <= 10 % for throughput and RT p50, <= 20 % for RT p99.

What the simulator runs: the zoo plans the cuda device ran (``sim_models="zoo"``, the
variant of the GPU run), timed by measured kernel profiles where ``profiles`` (a directory
of ``<model>.profile.json``) has them, else by profiles derived from the plans' geometry
for the simulated GPU; with ``calibrate="standalone"`` a derived profile's durations are
scaled per model so that its standalone latency in the simulator equals the GPU run's
standalone p50 (one number per model, from the same GPU file: the shape of the kernel
list stays derived). The document says which profile each model used.

Input (``load_gpu_results``): a bench JSON document (``schema`` 1), a list of them, or the
bundle ``scripts/gpu_check.sh`` writes (``disb_cuda.json``: ``{"policies": {W: doc},
"sweep_c": ...}``; the sweeps are not compared). Several files (``load_gpu_files``; the
CLI's ``--compare-sim F1 F2 ...``) are read as one result: the windows of one GPU lease
that wrote its workloads in several calls, or of several leases of the same GPU model.
Each row says which file it came from (``gpu_file``); a workload measured in more than one
file keeps one row set per file (its twin is keyed ``W@FILE`` in ``sim``). Files naming
different GPUs are refused unless ``--gpu`` says which one to simulate.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from av_infer.bench.harness import Bench, BenchConfig, available_policies
from av_infer.bench.workload import Workload, WorkloadError, load_workload

__all__ = ["METRICS", "CompareOptions", "compare_docs", "fit_documents", "format_table",
           "load_gpu_files", "load_gpu_results",
           "run_compare", "sim_twin"]

#: One GPU result file or several read as one (``load_gpu_files``).
GpuFiles = str | Path | Sequence[str | Path]

#: Key under which ``load_gpu_files`` records a document's file (not part of the schema).
SOURCE_KEY = "_gpu_file"

#: metric -> (how to read it from a policy section, the issue's |rel_err| limit or None)
METRICS: dict[str, tuple[tuple[str, ...], float | None]] = {
    "throughput_rps": (("throughput_rps",), 0.10),
    "rt_p50_ms": (("rt", "p50_ms"), 0.10),
    "rt_p99_ms": (("rt", "p99_ms"), 0.20),
    "be_throughput_rps": (("be", "throughput_rps"), None),
    "rt_first_kernel_p50_us": (("first_kernel_us", "p50"), None),
    "rt_first_kernel_p99_us": (("first_kernel_us", "p99"), None),
}

SCHEMA_VERSION = 1


@dataclass
class CompareOptions:
    """How the simulator twin of a GPU run is set up (``av-infer bench --compare-sim``)."""

    gpu: str | None = None  # simulated GPU; None: from the profiles or the GPU file
    contention: str = "calibrated"  # sim_contention model name or parameter file
    host: str | None = None  # sim_host parameter file (None: no host model)
    pad: str | None = None  # sim_pad parameter file (None: REEF's GpuSpec.pad_overhead)
    profiles: str | None = None  # directory of measured profiles
    calibrate: str = "none"  # "none" | "standalone"
    standalone_n: int | None = None  # None: the GPU run's own
    progress: bool = False
    policies: list[str] | None = None  # subset of the GPU run's policies


def gpu_file_list(files: GpuFiles) -> list[Path]:
    """``files`` as a list of paths (one path or several). ValueError for none or a file
    named twice (its rows would count twice)."""
    paths = [Path(files)] if isinstance(files, (str, Path)) else [Path(f) for f in files]
    if not paths:
        raise ValueError("no GPU result file given")
    seen = [str(p.resolve()) for p in paths]
    dup = sorted({str(p) for p, r in zip(paths, seen, strict=True) if seen.count(r) > 1})
    if dup:
        raise ValueError(f"GPU result file named twice: {', '.join(dup)}")
    return paths


def files_label(files: GpuFiles) -> str | list[str]:
    """How a document names its GPU files: the path for one file (the form written before
    several were accepted), the list of paths for several."""
    paths = gpu_file_list(files)
    return str(paths[0]) if len(paths) == 1 else [str(p) for p in paths]


def load_gpu_files(files: GpuFiles) -> list[dict[str, Any]]:
    """The bench documents of one GPU result file or several (:func:`load_gpu_results` on
    each, in order), each marked with its file under :data:`SOURCE_KEY`. Every file is
    read before anything runs; ValueError names the first one that holds no result."""
    docs: list[dict[str, Any]] = []
    for p in gpu_file_list(files):
        for d in load_gpu_results(p):
            docs.append({**d, SOURCE_KEY: str(p)})
    return docs


def fit_documents(files: GpuFiles, workloads: list[str] | None = None
                  ) -> list[dict[str, Any]]:
    """The documents of one GPU result file or several a fit reads (``--refit-contention``,
    ``--refit-host``): all of them, or only those of ``workloads`` (short names; a
    workload in several files is taken from each) so the others can be judged held out.
    ValueError, before anything runs, naming what the files have when a workload is not
    in them."""
    docs = load_gpu_files(files)
    if workloads is None:
        return docs
    have = [short_name(str(d["workload"])) for d in docs]
    missing = [w for w in workloads if w not in have]
    if missing or not workloads:
        where = ", ".join(str(p) for p in gpu_file_list(files))
        raise ValueError(f"{where}: no workload {', '.join(missing) or '(none named)'}"
                         f" in it (it has {', '.join(have)})")
    return [d for d, w in zip(docs, have, strict=True) if w in workloads]


def load_gpu_results(path: str | Path) -> list[dict[str, Any]]:
    """The bench documents of a GPU result file (see the module docstring). ValueError with
    the file's name when it holds none."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as e:
        raise ValueError(f"{p}: {e.strerror or e}") from None
    except ValueError as e:
        raise ValueError(f"{p}: not JSON ({e})") from None
    if isinstance(doc, list):
        docs = doc
    elif isinstance(doc, dict) and "schema" in doc:
        docs = [doc]
    elif isinstance(doc, dict) and isinstance(doc.get("policies"), dict):
        docs = list(doc["policies"].values())  # gpu_check.sh's bundle
    else:
        docs = []
    docs = [d for d in docs if isinstance(d, dict) and isinstance(d.get("policies"), dict)
            and d["policies"] and "workload" in d and "duration_s" in d]
    if not docs:
        raise ValueError(f"{p}: no DISB result in it (expected an `av-infer bench` JSON "
                         "document, a list of them, or gpu_check.sh's disb_cuda.json)")
    return docs


def _workload(doc: dict[str, Any]) -> Workload:
    """The workload a GPU document ran, at its rate scale. A file recorded with another
    machine's path is looked up by its name in this checkout (the repository's
    ``av_infer/bench/workloads`` and shared/disb's workloads)."""
    from av_infer.bench.workload import BUILTIN, shared_dir

    name = str(doc["workload"])
    if "+" in name and not name.endswith(".json"):
        raise WorkloadError(f"workload {name!r} was run with --trace; not reproducible from "
                            "the result file alone")
    if name in BUILTIN:
        wl = load_workload(name)
    else:
        base = Path(name).name
        cands = [Path(name), Path(__file__).resolve().parent / "workloads" / base,
                 shared_dir() / "disb" / "workloads" / base]
        path = next((c for c in cands if c.is_file()), None)
        if path is None:
            raise WorkloadError(f"workload {name!r} of the GPU file is not in this checkout "
                                f"(looked at {', '.join(str(c) for c in cands)})")
        wl = load_workload(str(path))
    rs = float(doc.get("rate_scale") or 1.0)
    return wl.scaled(rs) if rs != 1.0 else wl


def gpu_of(docs: list[dict[str, Any]], opts: CompareOptions, gpu_file: GpuFiles) -> str:
    """The simulated GPU: ``opts.gpu``, else the measured profiles' GPU, else the GPU named
    in the result files or in ``gpu_check.json`` beside them. ValueError when none says,
    or when the result files name different GPUs (one simulated GPU cannot twin both)."""
    from av_infer import profiles

    if opts.gpu:
        return profiles.gpu_spec(opts.gpu).name
    names: list[str] = []
    if opts.profiles:
        for prof in profiles.load_profile_dir(opts.profiles).values():
            names.append(str((prof.gpu or {}).get("name") or prof.device))
    measured: dict[str, str] = {}  # GPU key -> the file that names it
    for f in gpu_file_list(gpu_file):
        found: list[str] = []
        for d in docs:
            if d.get(SOURCE_KEY, str(f)) != str(f):
                continue
            g = d.get("gpu")
            found.append(str(g.get("name") if isinstance(g, dict) else g or ""))
        beside = f.with_name("gpu_check.json")
        if beside.is_file():
            try:
                tele = json.loads(beside.read_text()).get("telemetry", {})
                g = tele.get("gpu", {})
                found.append(str(g.get("name", "") if isinstance(g, dict) else g))
            except (ValueError, AttributeError):
                pass
        for n in found:
            key = profiles.gpu_key(n) if n else None
            if key:
                measured.setdefault(key, str(f))
        names += found
    if len(measured) > 1:
        raise ValueError("the GPU result files were measured on different GPUs ("
                         + ", ".join(f"{k}: {f}" for k, f in measured.items())
                         + "); compare them one at a time or pass --gpu")
    for n in names:
        key = profiles.gpu_key(n) if n else None
        if key:
            return key
    where = ", ".join(str(p) for p in gpu_file_list(gpu_file))
    raise ValueError(f"{where}: cannot tell which GPU it was measured on; pass --gpu")


def twin_bench(doc: dict[str, Any], opts: CompareOptions, gpu: str
               ) -> tuple[Bench, list[tuple[str, int]]]:
    """The simulator :class:`Bench` that re-runs GPU document ``doc`` and the
    ``(label, c)`` of each of its policies the simulator can run (``opts.policies``
    filters them). Its standalone reference is not run yet."""
    wl = _workload(doc)
    sim_pols = set(available_policies("sim"))
    cfg = BenchConfig(
        device="sim", duration=float(doc["duration_s"]), seed=int(doc.get("seed") or 0),
        scale=doc.get("scale") or "full", c=int(doc.get("c") or 4),
        preempt_drain=bool(doc.get("preempt_drain")), gpu=gpu,
        deadline_ms=doc.get("deadline_ms"),
        standalone_n=opts.standalone_n or _standalone_n(doc), progress=opts.progress,
        contention=opts.contention, host=opts.host, pad=opts.pad, profiles=opts.profiles,
        sim_models="zoo")
    if opts.calibrate == "standalone":
        cfg = replace(cfg, profile_scale=_standalone_scale(wl, cfg, doc))
    elif opts.calibrate != "none":
        raise ValueError(f"calibrate must be 'none' or 'standalone', got {opts.calibrate!r}")
    labels = [(lab, int(sec.get("c") or cfg.c)) for lab, sec in doc["policies"].items()
              if (opts.policies is None or lab in opts.policies)
              and lab.partition("+")[0] in sim_pols]
    return Bench(wl, cfg), labels


def run_twin(bench: Bench, labels: list[tuple[str, int]]) -> dict[str, Any]:
    """Run the policies ``labels`` on ``bench``; its bench report (``build_report``) with
    ``contention_model`` (what ``bench.cfg.contention`` means) added."""
    from av_infer.bench.report import build_report

    bench.standalone()
    runs = []
    for label, c in labels:
        pol, _, extra = label.partition("+")
        if bench.cfg.progress:
            print(f"[sim {bench.wl.name}] {label}", file=sys.stderr)
        runs.append(bench.run_policy(pol, c=c, rt_forecast=extra == "forecast"))
    out = build_report(bench, runs)
    out["contention_model"] = _contention_desc(bench.cfg.contention, bench.cfg.gpu)
    if bench.cfg.host not in (None, "none"):
        from av_infer.devices import sim_host

        out["host_model"] = sim_host.describe(bench.cfg.host, bench.cfg.gpu)
    if bench.cfg.pad not in (None, "none"):
        from av_infer.devices import sim_pad

        out["pad_model"] = sim_pad.describe(bench.cfg.pad, bench.cfg.gpu)
    return out


def sim_twin(doc: dict[str, Any], opts: CompareOptions, gpu: str) -> dict[str, Any]:
    """Run the simulator twin of one GPU document; its bench report."""
    bench, labels = twin_bench(doc, opts, gpu)
    return run_twin(bench, labels)


def _standalone_n(doc: dict[str, Any]) -> int:
    ns = [int(m.get("standalone_n") or 0) for m in doc.get("models", {}).values()]
    return max([n for n in ns if n > 0] or [20])


def _standalone_scale(wl: Workload, cfg: BenchConfig, doc: dict[str, Any],
                      rounds: int = 3, tol: float = 0.002) -> dict[str, float]:
    """Per model with a derived profile: the factor on its kernel durations that makes its
    standalone p50 in the simulator the GPU run's (``models.<m>.standalone_p50_ms``).
    Launch costs do not scale, so the factor is refined (``rounds`` at most, until every
    model is within ``tol``)."""
    gpu_ms = {m: float(v["standalone_p50_ms"]) for m, v in doc.get("models", {}).items()
              if (v or {}).get("standalone_p50_ms")}
    scale: dict[str, float] = {}
    for _ in range(rounds):
        probe = Bench(wl, replace(cfg, profile_scale=dict(scale) or None, standalone_n=3,
                                  warmup=1))
        ref = probe.standalone()
        worst = 0.0
        for m, src in probe.sources.items():
            if src.profile_source not in ("derived", "derived-scaled") or m not in gpu_ms:
                continue  # measured profiles are not rescaled
            sim_ms = ref[m]["p50_s"] * 1e3
            if sim_ms <= 0:
                continue
            ratio = gpu_ms[m] / sim_ms
            worst = max(worst, abs(ratio - 1.0))
            scale[m] = scale.get(m, 1.0) * ratio
        if worst <= tol:
            break
    return scale


def _contention_desc(name: str, gpu: str) -> dict[str, Any]:
    from av_infer.devices import sim_contention

    return sim_contention.describe(name, gpu)


def _get(sec: dict[str, Any], path: tuple[str, ...]) -> float | None:
    v: Any = sec
    for k in path:
        if not isinstance(v, dict):
            return None
        v = v.get(k)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def short_name(workload: str) -> str:
    """A builtin workload's name, a file's stem (``trace_cams``)."""
    return Path(workload).stem if workload.endswith(".json") else workload


def rel_err(sim: float | None, gpu: float | None) -> float | None:
    """``(sim - gpu) / gpu``; None where either is missing or the GPU value is 0."""
    if sim is None or gpu is None or gpu == 0:
        return None
    return (sim - gpu) / abs(gpu)


def compare_docs(gpu_doc: dict[str, Any], sim_doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows {workload, policy, metric, sim, gpu, rel_err, limit, within} per policy the
    simulator ran and per metric of :data:`METRICS`, plus one ``standalone_p50_ms`` row per
    model (policy ``standalone``)."""
    wl = short_name(str(gpu_doc["workload"]))
    rows: list[dict[str, Any]] = []
    for m, d in sim_doc.get("models", {}).items():
        g = (gpu_doc.get("models", {}).get(m) or {}).get("standalone_p50_ms")
        s = d.get("standalone_p50_ms")
        rows.append(_row(wl, "standalone", f"standalone_p50_ms:{m}", s, g, None))
    for label, ssec in sim_doc["policies"].items():
        gsec = gpu_doc["policies"].get(label)
        if gsec is None:
            continue
        for metric, (path, limit) in METRICS.items():
            rows.append(_row(wl, label, metric, _get(ssec, path), _get(gsec, path), limit))
    return rows


def _row(wl: str, policy: str, metric: str, sim: float | None, gpu: float | None,
         limit: float | None) -> dict[str, Any]:
    err = rel_err(sim, gpu)
    return {"workload": wl, "policy": policy, "metric": metric,
            "sim": None if sim is None else round(sim, 4),
            "gpu": None if gpu is None else round(gpu, 4),
            "rel_err": None if err is None else round(err, 4), "limit": limit,
            "within": None if limit is None or err is None else abs(err) <= limit}


def run_compare(gpu_file: GpuFiles, opts: CompareOptions) -> dict[str, Any]:
    """Everything: the GPU documents of one result file or several (read as one, see the
    module docstring), their simulator twins, the rows (``sim_fidelity``)."""
    docs = load_gpu_files(gpu_file)
    gpu = gpu_of(docs, opts, gpu_file)
    rows: list[dict[str, Any]] = []
    twins: dict[str, Any] = {}
    skipped: list[str] = []
    sim_pols = set(available_policies("sim"))
    names = [short_name(str(d["workload"])) for d in docs]
    for doc, wl in zip(docs, names, strict=True):
        skipped += [f"{doc['workload']}:{p}" for p in doc["policies"]
                    if p.partition("+")[0] not in sim_pols]
        twin = sim_twin(doc, opts, gpu)
        key = wl if names.count(wl) == 1 else f"{wl}@{doc[SOURCE_KEY]}"
        twins[key] = {
            "gpu_file": doc[SOURCE_KEY],
            "profiles": twin.get("profiles"), "models": twin.get("models"),
            "contention_model": twin.get("contention_model"),
            "host_model": twin.get("host_model"),
            **({"pad_model": twin["pad_model"]} if "pad_model" in twin else {}),
            "duration_s": twin["duration_s"], "rate_scale": twin["rate_scale"]}
        rows += [{**r, "gpu_file": doc[SOURCE_KEY]} for r in compare_docs(doc, twin)]
    judged = [r for r in rows if r["within"] is not None]
    return {
        "schema": SCHEMA_VERSION,
        "gpu_file": files_label(gpu_file),
        "gpu": gpu,
        "contention": opts.contention,
        "host": opts.host,
        **({"pad": opts.pad} if opts.pad not in (None, "none") else {}),
        "profiles_dir": opts.profiles,
        "calibrate": opts.calibrate,
        "limits": {m: lim for m, (_, lim) in METRICS.items()},
        "within": sum(1 for r in judged if r["within"]),
        "judged": len(judged),
        "not_simulated": skipped,
        "sim": twins,
        "rows": rows,
    }


def format_table(doc: dict[str, Any]) -> str:
    """One line per (workload, policy): sim / gpu / rel_err of each metric."""
    files = doc["gpu_file"] if isinstance(doc["gpu_file"], list) else [doc["gpu_file"]]
    tag = {f: (f"[{i}]" if len(files) > 1 else "") for i, f in enumerate(files, 1)}
    by: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in doc["rows"]:
        wl = r["workload"] + tag.get(r.get("gpu_file", files[0]), "")
        by.setdefault((wl, r["policy"]), {})[r["metric"]] = r
    host = f", host {doc['host']}" if doc.get("host") not in (None, "none") else ""
    if doc.get("pad") not in (None, "none"):
        host += f", pad {doc['pad']}"
    lines = [f"simulator ({doc['gpu']}, contention {doc['contention']}{host}, calibrate "
             f"{doc['calibrate']}) vs GPU ({', '.join(files)}); cells: sim / gpu (rel err)"]
    if len(files) > 1:
        lines += [f"  {tag[f]} {f}" for f in files]
    for wl, tw in doc["sim"].items():
        profs = (tw.get("profiles") or {}).get("by_model", {})
        name = wl.partition("@")[0] + tag.get(tw.get("gpu_file", files[0]), "")
        lines.append(f"  {name}: profiles "
                     + ", ".join(f"{m}={s}" for m, s in profs.items()))
    mets = list(METRICS)
    w = max([8] + [len(wl) + 1 for wl, _ in by])
    head = f"{'wl':<{w}}{'policy':<16}" + "".join(f"{m:>30}" for m in mets)
    lines += [head, "-" * len(head)]
    for (wl, pol), cells in by.items():
        if pol == "standalone":
            txt = "  ".join(f"{k.split(':', 1)[1]} {_cell(r)}" for k, r in cells.items())
            lines.append(f"{wl:<{w}}{'standalone p50':<16}{txt}")
            continue
        lines.append(f"{wl:<{w}}{pol:<16}" + "".join(f"{_cell(cells.get(m)):>30}"
                                                      for m in mets))
    lines.append(f"within the issue's limits: {doc['within']} of {doc['judged']} judged cells")
    return "\n".join(lines)


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.4g}"

    err = "-" if r["rel_err"] is None else f"{r['rel_err'] * 100:+.1f}%"
    mark = "" if r.get("within") is None else (" ok" if r["within"] else " !")
    return f"{f(r['sim'])} / {f(r['gpu'])} ({err}){mark}"
