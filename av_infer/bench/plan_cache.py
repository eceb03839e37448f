"""Cold compile vs warm load through the on-disk plan cache (``model.plan_store``).

What it measures, per model, on one device (default cpu, its ORT engine):

* ``cold_s``: ``Runtime.load_model`` with an empty plan cache: compile, write the plan,
  make it resident (the cpu device builds its ORT sessions);
* ``warm_s``: the same call in a fresh Runtime on the filled cache (a restart): read the
  plan, make it resident; median of ``--repeat`` restarts;
* ``compile_s`` / ``read_s``: the two parts that differ, alone (``Device.compile`` once;
  ``PlanStore.get``, median), and the plan file's size.

Usage::

    python -m av_infer.bench.plan_cache [MODEL ...] [--pin] [--repeat N] [--json PATH|-]
                                        [--plot out.png]

MODEL: a zoo name (``NAME:full`` for the full-size variant), an exported name
(``ocr_det`` ...) or an ``.onnx`` path; default: a few of each (zoo, exported, the torch
fixtures). Plans go to a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_MODELS = ("tiny_cnn", "distilbert", "inception_v3", "resnet152", "ocr_det", "ocr_rec",
                  "ocr_cls", "tests/fixtures/torch/tiny_resnet_opset13.onnx",
                  "tests/fixtures/torch/tiny_bert_opset17.onnx",
                  "tests/fixtures/torch/mobilenet_block_opset17.onnx",
                  "tests/fixtures/torch/tiny_unet_opset13.onnx")


def _resolve(target: str) -> tuple[str, Path, dict[str, list[int]] | None]:
    """(name, path, input shapes) of a zoo name, an exported name or a path."""
    import onnx

    from av_infer.model import exported, zoo

    base, _, variant = target.partition(":")
    if base in zoo.names():
        variant = variant or "scaled"
        shapes = {k: list(v.shape) for k, v in zoo.sample_inputs(base, variant).items()}
        return target.replace(":", "_"), zoo.path(base, variant), shapes
    if target in exported.names():
        p = exported.path(target)
        first = onnx.load(str(p), load_external_data=False).graph.input[0].name
        return target, p, {first: list(exported.input_shape(target))}
    p = Path(target)
    if not p.is_file():
        raise SystemExit(f"plan_cache bench: {target!r} is no zoo/exported name or file")
    return p.stem, p, None


def measure(target: str, device: str = "cpu", pin: bool = False, repeat: int = 3
            ) -> dict[str, Any]:
    """One row of the table (see the module docstring)."""
    from av_infer.devices import make_device
    from av_infer.model.plan_store import PlanStore, plan_key
    from av_infer.runtime import Runtime

    name, path, shapes = _resolve(target)
    with tempfile.TemporaryDirectory(prefix="avi_plans_") as d:
        store = PlanStore(d)
        with Runtime(device=device, plan_cache=store) as rt:
            t0 = time.perf_counter()
            info = rt.load_model(name, path, shapes, pin=pin)
            cold = time.perf_counter() - t0
        assert info.plan_cache == "miss", info.plan_cache
        warm = []
        for _ in range(repeat):
            with Runtime(device=device, plan_cache=store) as rt:
                t0 = time.perf_counter()
                info = rt.load_model(name, path, shapes, pin=pin)
                warm.append(time.perf_counter() - t0)
            assert info.plan_cache == "hit", info.plan_cache
        dev = make_device(device)
        try:
            data = path.read_bytes()
            t0 = time.perf_counter()
            dev.compile(data, shapes, name=name, whole=pin)
            compile_s = time.perf_counter() - t0
            key = plan_key(data, shapes, dev, pin)
            reads = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                plan = store.get(key, name)
                reads.append(time.perf_counter() - t0)
            assert plan is not None
        finally:
            dev.close()
        return {"model": name, "device": device, "pin": pin, "model_bytes": len(data),
                "plan_bytes": store.path(key).stat().st_size,
                "launches": len(plan.kernels), "cold_s": cold,
                "warm_s": statistics.median(warm), "compile_s": compile_s,
                "read_s": statistics.median(reads),
                "speedup": cold / statistics.median(warm)}


def _table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'model':<26} {'launches':>8} {'model MB':>8} {'plan MB':>8} {'cold s':>8} "
            f"{'warm s':>8} {'x':>6} {'compile s':>9} {'read s':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['model']:<26} {r['launches']:>8} {r['model_bytes'] / 1e6:>8.2f} "
            f"{r['plan_bytes'] / 1e6:>8.2f} {r['cold_s']:>8.3f} {r['warm_s']:>8.3f} "
            f"{r['speedup']:>6.1f} {r['compile_s']:>9.3f} {r['read_s']:>8.4f}")
    return "\n".join(lines)


def _plot(rows: list[dict[str, Any]], out: str) -> Path:
    from av_infer.bench.plots import _plt, _save

    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["cold_s"] for r in rows], 0.4, label="cold (compile)")
    ax.bar([x + 0.2 for x in xs], [r["warm_s"] for r in rows], 0.4, label="warm (plan cache)")
    ax.set_xticks(list(xs), [r["model"] for r in rows], rotation=30, ha="right")
    ax.set_ylabel("Runtime.load_model (s)")
    ax.set_yscale("log")
    ax.set_title(f"load_model on {rows[0]['device']}: cold compile vs plan cache")
    ax.legend()
    fig.tight_layout()
    return _save(fig, out)


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    ap = argparse.ArgumentParser(prog="python -m av_infer.bench.plan_cache",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="*", help="zoo/exported name or .onnx path")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--pin", action="store_true", help="load as RT models (whole)")
    ap.add_argument("--repeat", type=int, default=3, help="warm restarts per model")
    ap.add_argument("--json", metavar="PATH", help="write rows as JSON ('-': stdout only)")
    ap.add_argument("--plot", metavar="PNG", help="bar chart of cold vs warm")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        raise SystemExit("--repeat must be >= 1")
    targets = args.model or list(DEFAULT_MODELS)
    rows = []
    for t in tqdm(targets, desc="plan cache", unit="model", disable=args.json == "-"):
        rows.append(measure(t, args.device, args.pin, args.repeat))
    if args.json:
        text = json.dumps({"rows": rows}, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text)
    if args.json != "-":
        print(_table(rows))
    if args.plot:
        print(f"wrote {_plot(rows, args.plot)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
