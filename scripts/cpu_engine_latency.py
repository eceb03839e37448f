#!/usr/bin/env python3
"""Latency of the cpu device's ONNX Runtime segment engine against plain ONNX Runtime.

For every model (the zoo's scaled and full variants, the exporter fixtures
``tests/fixtures/torch/*.onnx`` and the three PaddleOCR models shipped in the
``rapidocr_onnxruntime`` wheel, if installed), at one intra-op thread everywhere, the median
wall-clock latency of one inference by four systems:

1. **ORT**: a plain ``onnxruntime.InferenceSession`` on the original file with the options
   every av_infer session uses (``model.segments.ort_options(1)``); one ``sess.run``.
2. **engine whole**: ``compile_segments(..., segment_ms=None)`` (one segment) run by
   ``SegmentRunner``; one call = ``write_inputs`` + every segment + ``read_outputs`` on an
   arena allocated and bound once.
3. **engine cut**: the same with ``segment_ms=4.0`` (the cut a BE model gets); the number of
   segments is reported.
4. **Runtime.infer**: the public API end to end (``Runtime("cpu", policy="reef")``, model
   loaded ``pin=True``, i.e. whole), one request at a time.

The systems' runs are interleaved: after two warm-up runs each, rounds run a block of
consecutive runs per system (block ~ 50 ms, the order rotated every round) until each system
has at least 3 measured runs and has spent ``--budget-s`` seconds (or ``--max-runs`` runs),
so machine drift affects all alike. Every engine output (2, 3, 4) is checked against ORT's
with ``numpy.allclose(rtol=1e-4, atol=1e-5)``. Ratios are system / ORT (> 1: slower).

    .venv/bin/python scripts/cpu_engine_latency.py                    # markdown table
    .venv/bin/python scripts/cpu_engine_latency.py --json /tmp/lat.json > /tmp/lat.md
    .venv/bin/python scripts/cpu_engine_latency.py --models resnet152-scaled,tiny_cnn
    .venv/bin/python scripts/cpu_engine_latency.py --skip-full --budget-s 1 --json -

``--models`` takes labels as printed (``vgg19-scaled``, ``vgg19-full``, ``tiny_cnn``,
``tiny_bert_opset13``, ``ch_PP-OCRv4_det_infer``) or bare zoo names (both variants).
Numbers are wall-clock on a possibly shared CPU: compare columns of one run, not machines.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import pathlib
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort
from tqdm import tqdm

from av_infer import Runtime
from av_infer.kernels.ort_segments import SegmentRunner
from av_infer.model import zoo
from av_infer.model.check import random_inputs
from av_infer.model.segments import compile_segments, ort_options

REPO = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "torch"
#: input shapes of the fixtures whose npz does not fix a symbolic dimension by itself
FIXTURE_SHAPES = {"tiny_resnet_dynbatch_opset17": {"input": [1, 3, 32, 32]}}
OCR_MODELS = {
    "ch_PP-OCRv4_det_infer": [1, 3, 320, 320],
    "ch_PP-OCRv4_rec_infer": [1, 3, 48, 320],
    "ch_ppocr_mobile_v2.0_cls_infer": [1, 3, 48, 192],
}
SYSTEMS = ("ort", "whole", "cut", "runtime")
RTOL, ATOL = 1e-4, 1e-5
WARMUP = 2
BLOCK_S = 0.05


@dataclass
class ModelSpec:
    label: str
    group: str  # zoo-scaled | zoo-full | zoo-test | fixture | ocr
    path: Callable[[], str]  # lazy: full zoo variants are built on first use
    input_shapes: Any = None  # for compile_segments / load_model
    inputs: dict[str, np.ndarray] | None = None  # None: random_inputs(plan.input_spec())


@dataclass
class Row:
    label: str
    group: str
    input: str = ""
    ms: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(SYSTEMS))
    runs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SYSTEMS, 0))
    spread_ms: dict[str, list[float]] = field(default_factory=dict)  # p10, p90
    segments: int | None = None
    match: dict[str, bool | None] = field(
        default_factory=lambda: dict.fromkeys(SYSTEMS[1:]))
    max_abs_diff: dict[str, float | None] = field(
        default_factory=lambda: dict.fromkeys(SYSTEMS[1:]))
    errors: dict[str, str] = field(default_factory=dict)
    setup_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0


# -- models -----------------------------------------------------------------------------------
def zoo_specs(skip_full: bool) -> list[ModelSpec]:
    specs: list[ModelSpec] = []
    for name in zoo.names():
        single = "-default-" in zoo.path(name, "scaled").name  # test models: one variant
        variants = ["scaled"] if single or skip_full else ["scaled", "full"]
        for v in variants:
            x = zoo.sample_inputs(name, v)
            specs.append(ModelSpec(
                name if single else f"{name}-{v}",
                "zoo-test" if single else f"zoo-{v}",
                lambda n=name, v=v: str(zoo.path(n, v)),
                {k: list(a.shape) for k, a in x.items()}, x))
    return specs


def fixture_specs() -> list[ModelSpec]:
    specs = []
    for f in sorted(FIXTURES.glob("*.onnx")):
        npz = f.with_suffix(".npz")
        x = None
        if npz.exists():
            with np.load(npz) as z:
                x = {k: z[k] for k in z.files if k != "expected_output"}
        shapes = FIXTURE_SHAPES.get(f.stem) or (
            {k: list(a.shape) for k, a in x.items()} if x else None)
        specs.append(ModelSpec(f.stem, "fixture", lambda f=f: str(f), shapes, x))
    return specs


def ocr_specs(notes: list[str]) -> list[ModelSpec]:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")  # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        notes.append("OCR models skipped: package rapidocr_onnxruntime is not installed")
        return []
    d = pathlib.Path(list(spec.submodule_search_locations)[0]) / "models"
    specs = []
    for stem, shape in OCR_MODELS.items():
        p = d / f"{stem}.onnx"
        if not p.exists():
            notes.append(f"OCR model {stem} skipped: {p} not found")
            continue
        specs.append(ModelSpec(stem, "ocr", lambda p=p: str(p), shape, None))
    return specs


def select(specs: list[ModelSpec], wanted: str | None) -> list[ModelSpec]:
    if not wanted:
        return specs
    keys = [w.strip() for w in wanted.split(",") if w.strip()]
    out = [s for s in specs if s.label in keys or s.label.rsplit("-", 1)[0] in keys]
    known = {s.label for s in specs} | {s.label.rsplit("-", 1)[0] for s in specs}
    unknown = [k for k in keys if k not in known]
    if unknown:
        sys.exit(f"unknown model(s) {unknown}; known: {', '.join(s.label for s in specs)}")
    return out


# -- measurement ------------------------------------------------------------------------------
def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"[:300]


def _compare(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> tuple[bool, float]:
    ok, worst = set(ref) == set(got), 0.0
    for k, r in ref.items():
        if k not in got:
            continue
        g = np.asarray(got[k])
        r = np.asarray(r)
        if g.shape != r.shape:
            ok, worst = False, float("inf")
            continue
        if r.size:
            worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - r.astype(np.float64)))))
        ok = ok and bool(np.allclose(g, r, rtol=RTOL, atol=ATOL))
    return ok, worst


class _EngineCall:
    """One engine inference as a callable: inputs in, every segment, outputs out."""

    def __init__(self, runner: SegmentRunner, inputs: dict[str, np.ndarray]) -> None:
        self.r, self.inputs = runner, inputs
        self.arena = runner.new_arena()
        self.fns = runner.bind(self.arena)

    def __call__(self) -> dict[str, np.ndarray]:
        r = self.r
        r.write_inputs(self.arena, self.inputs)
        ro = r.run_options()
        for f in self.fns:
            f(ro)
        return r.read_outputs(self.arena)


def measure(calls: dict[str, Callable[[], Any]], budget_s: float, min_runs: int,
            max_runs: int, bar: tqdm) -> dict[str, list[float]]:
    """Interleaved timing of ``calls`` (name -> callable): seconds per measured run."""
    names = list(calls)
    one: dict[str, float] = {}
    for _ in range(WARMUP):  # warm-ups, interleaved too
        for n in names:
            t0 = time.perf_counter()
            calls[n]()
            one[n] = time.perf_counter() - t0
    block = {n: max(1, min(20, int(BLOCK_S / max(one[n], 1e-6)))) for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    spent = dict.fromkeys(names, 0.0)

    def done(n: str) -> bool:
        k = len(times[n])
        return k >= min_runs and (spent[n] >= budget_s or k >= max_runs)

    rnd = 0
    while not all(done(n) for n in names):
        order = names[rnd % len(names):] + names[: rnd % len(names)]
        rnd += 1
        for n in order:
            if done(n):
                continue
            fn = calls[n]
            for _ in range(block[n]):
                t0 = time.perf_counter()
                fn()
                dt = time.perf_counter() - t0
                times[n].append(dt)
                spent[n] += dt
        bar.set_postfix_str(" ".join(f"{n}:{len(times[n])}" for n in names), refresh=False)
    return times


def bench_model(spec: ModelSpec, args: argparse.Namespace, bar: tqdm) -> Row:
    row = Row(spec.label, spec.group)
    t_start = time.perf_counter()

    def stage(s: str) -> None:
        bar.set_description_str(f"{spec.label}: {s}")

    stage("build")
    try:
        path = spec.path()
    except Exception as e:  # noqa: BLE001 - report and go on
        row.errors["model"] = _short(e)
        return row
    calls: dict[str, Callable[[], Any]] = {}
    inputs = spec.inputs
    plans: dict[str, Any] = {}
    runners: dict[str, SegmentRunner] = {}
    for system, seg_ms in (("whole", None), ("cut", 4.0)):
        stage(f"compile {system}")
        t0 = time.perf_counter()
        try:
            plan = compile_segments(path, spec.input_shapes, name=spec.label, segment_ms=seg_ms)
            runners[system] = SegmentRunner(plan, threads=1)
            plans[system] = plan
        except Exception as e:  # noqa: BLE001
            row.errors[system] = _short(e)
        row.setup_s[system] = round(time.perf_counter() - t0, 3)
    if inputs is None:
        if not plans:
            row.errors.setdefault("inputs", "no plan to take the input spec from")
            return row
        inputs = random_inputs(next(iter(plans.values())).input_spec(), seed=0)
    row.input = ", ".join(f"{k} {list(a.shape)} {a.dtype}" for k, a in inputs.items())
    if "cut" in plans:
        row.segments = len(plans["cut"].kernels)

    stage("ort session")
    t0 = time.perf_counter()
    ref: dict[str, np.ndarray] | None = None
    try:
        sess = ort.InferenceSession(path, ort_options(1), providers=["CPUExecutionProvider"])
        out_names = [o.name for o in sess.get_outputs()]
        ref = dict(zip(out_names, sess.run(None, inputs)))
        calls["ort"] = lambda: sess.run(None, inputs)
    except Exception as e:  # noqa: BLE001
        row.errors["ort"] = _short(e)
    row.setup_s["ort"] = round(time.perf_counter() - t0, 3)

    for system, runner in runners.items():
        try:
            call = _EngineCall(runner, inputs)
            got = call()
            if ref is not None:
                row.match[system], row.max_abs_diff[system] = _compare(ref, got)
            calls[system] = call
        except Exception as e:  # noqa: BLE001
            row.errors[system] = _short(e)

    stage("Runtime.load_model")
    rt = None
    t0 = time.perf_counter()
    try:
        rt = Runtime("cpu", policy="reef", device_options={"threads": 1})
        rt.load_model("m", path, spec.input_shapes, pin=True)
        got = rt.infer("m", inputs).outputs
        if ref is not None:
            row.match["runtime"], row.max_abs_diff["runtime"] = _compare(ref, got)
        calls["runtime"] = lambda: rt.infer("m", inputs)
    except Exception as e:  # noqa: BLE001
        row.errors["runtime"] = _short(e)
    row.setup_s["runtime"] = round(time.perf_counter() - t0, 3)

    stage("timing")
    calls = {s: calls[s] for s in SYSTEMS if s in calls}
    try:
        times = measure(calls, args.budget_s, args.min_runs, args.max_runs, bar)
        for s, ts in times.items():
            a = np.asarray(ts) * 1e3
            row.ms[s] = float(np.median(a))
            row.runs[s] = len(ts)
            row.spread_ms[s] = [float(np.percentile(a, 10)), float(np.percentile(a, 90))]
    except Exception as e:  # noqa: BLE001
        row.errors["timing"] = _short(e)
        if args.verbose:
            traceback.print_exc()
    finally:
        if rt is not None:
            try:
                rt.close(drain=True)
            except Exception as e:  # noqa: BLE001
                row.errors["runtime close"] = _short(e)
    row.wall_s = round(time.perf_counter() - t_start, 2)
    return row


# -- output -----------------------------------------------------------------------------------
def _fmt_ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 10 else f"{v:.2f}" if v < 100 else f"{v:.1f}"


def _cell(row: Row, s: str, extra: str = "") -> str:
    v, base = row.ms.get(s), row.ms.get("ort")
    if v is None:
        return "failed" if s in row.errors else "-"
    parts = [extra] if extra else []
    if base:
        parts.append(f"{v / base:.2f}x")
    return f"{_fmt_ms(v)} ({', '.join(parts)})" if parts else _fmt_ms(v)


def _match(row: Row) -> str:
    bad = [s for s, m in row.match.items() if m is False]
    failed = [s for s in SYSTEMS[1:] if s in row.errors]
    checked = [s for s, m in row.match.items() if m is not None]
    if not checked:
        return "not checked" + (f" ({', '.join(failed)} failed)" if failed else "")
    if bad:
        return "MISMATCH: " + ", ".join(
            f"{s} (max abs diff {row.max_abs_diff[s]:.3g})" for s in bad)
    s = "yes"
    if failed:
        s += f" ({', '.join(failed)} failed)"
    return s


def table(rows: list[Row]) -> str:
    lines = [
        "| model | input | ORT ms | engine whole ms (ratio) | engine cut ms (segments, ratio) "
        "| Runtime.infer ms (ratio) | outputs match |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        seg = f"{r.segments} seg" if r.segments is not None else ""
        ort_cell = "failed" if "ort" in r.errors else _fmt_ms(r.ms["ort"])
        lines.append(
            f"| {r.label} | {r.input or '-'} | {ort_cell} | {_cell(r, 'whole')} "
            f"| {_cell(r, 'cut', seg)} | {_cell(r, 'runtime')} | {_match(r)} |")
    return "\n".join(lines)


def _cpu_name() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--json", metavar="FILE",
                    help="also write the results as JSON ('-': stdout; the table then goes "
                         "to stderr)")
    ap.add_argument("--models", help="comma-separated labels or zoo names to run (default: all)")
    ap.add_argument("--skip-full", action="store_true", help="leave out the full zoo variants")
    ap.add_argument("--budget-s", type=float, default=3.0,
                    help="timing budget per model per system, seconds (default 3)")
    ap.add_argument("--min-runs", type=int, default=3,
                    help="measured runs per system at least (default 3), after 2 warm-ups")
    ap.add_argument("--max-runs", type=int, default=2000,
                    help="measured runs per system at most (default 2000)")
    ap.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    args = ap.parse_args()
    if args.min_runs < 1 or args.budget_s < 0 or args.max_runs < args.min_runs:
        ap.error("need min-runs >= 1, budget-s >= 0 and max-runs >= min-runs")
    table_out = sys.stderr if args.json == "-" else sys.stdout

    t_all = time.perf_counter()
    notes: list[str] = []
    specs = select(zoo_specs(args.skip_full) + fixture_specs() + ocr_specs(notes), args.models)
    rows: list[Row] = []
    with tqdm(specs, unit="model", file=sys.stderr, dynamic_ncols=True) as bar:
        for spec in bar:
            row = bench_model(spec, args, bar)
            rows.append(row)
            for s, e in row.errors.items():
                bar.write(f"{spec.label}: {s}: {e}", file=sys.stderr)
            gc.collect()
    total_s = time.perf_counter() - t_all

    for r in rows:
        for s, e in r.errors.items():
            notes.append(f"{r.label}: {s} failed: {e}")
        for s, m in r.match.items():
            if m is False:
                notes.append(f"{r.label}: {s} outputs differ from ORT "
                             f"(max abs diff {r.max_abs_diff[s]:.3g}, rtol={RTOL}, atol={ATOL})")
    header = (f"# cpu engine latency: {os.cpu_count()} cpus, "
              f"{_cpu_name()}, onnxruntime {ort.__version__}, "
              f"1 intra-op thread; median of >= {args.min_runs} runs after {WARMUP} warm-ups, "
              f"budget {args.budget_s:g} s per model per system, interleaved; ratios vs ORT; "
              f"load average at end {os.getloadavg()[0]:.2f}; total {total_s:.0f} s")
    print(header, file=table_out)
    print(file=table_out)
    print(table(rows), file=table_out)
    if notes:
        print(file=table_out)
        for n in notes:
            print(f"- {n}", file=table_out)
    table_out.flush()

    if args.json:
        doc = {
            "machine": {"cpus": os.cpu_count(), "processor": _cpu_name(),
                        "machine": platform.machine(), "python": platform.python_version(),
                        "onnxruntime": ort.__version__, "numpy": np.__version__},
            "settings": {"threads": 1, "budget_s": args.budget_s, "min_runs": args.min_runs,
                         "max_runs": args.max_runs, "warmup": WARMUP, "rtol": RTOL,
                         "atol": ATOL, "segment_ms_cut": 4.0, "skip_full": args.skip_full},
            "total_s": round(total_s, 1),
            "notes": notes,
            "models": [r.__dict__ for r in rows],
        }
        text = json.dumps(doc, indent=2, default=str, allow_nan=True)
        if args.json == "-":
            sys.stdout.write(text + "\n")
        else:
            pathlib.Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
