#!/usr/bin/env python3
"""Kernel counts of every DISB zoo model (full and scaled), with and without the passes.

    .venv/bin/python scripts/kernel_counts.py [--json out/kernel_counts.json]

Builds the full-size models on first use (about 20 s, ~1.3 GB in the zoo cache).
"""

from __future__ import annotations

import argparse
import json
import time

from av_infer.model import zoo
from av_infer.model.compiler import compile_model

DISB = ["vgg19", "resnet152", "densenet201", "inception_v3", "distilbert"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", help="write the rows as JSON")
    args = ap.parse_args()
    rows = []
    print(f"{'model':<14}{'variant':<8}{'onnx nodes':>11}{'kernels':>9}{'no passes':>10}"
          f"{'removed':>9}{'weights MiB':>12}{'arena MiB':>10}{'compile s':>10}")
    for name in DISB:
        for variant in ("full", "scaled"):
            path = zoo.path(name, variant)
            t0 = time.perf_counter()
            plan = compile_model(path)
            dt = time.perf_counter() - t0
            raw = compile_model(path, optimize=False)
            row = {"model": name, "variant": variant, "onnx_nodes": plan.stats.get("nodes"),
                   "kernels": len(plan.kernels), "kernels_no_passes": len(raw.kernels),
                   "removed": len(raw.kernels) - len(plan.kernels),
                   "weight_mib": plan.weight_bytes / 2**20,
                   "arena_mib": plan.activation_bytes / 2**20, "compile_s": dt}
            rows.append(row)
            print(f"{name:<14}{variant:<8}{row['onnx_nodes']:>11}{row['kernels']:>9}"
                  f"{row['kernels_no_passes']:>10}{row['removed']:>9}{row['weight_mib']:>12.1f}"
                  f"{row['arena_mib']:>10.2f}{dt:>10.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
