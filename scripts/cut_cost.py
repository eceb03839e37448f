#!/usr/bin/env python3
"""What cutting a model into segments costs on this CPU: the cut plan's run against the same
model in one segment, for several ``segment_ms`` (docs/cpu_engine.md, "What a cut costs").

For each model and target: the segments made, the measured cost (``ort_segments.
measure_cut_cost``: median over alternating rounds of cut time / whole time - 1, this
thread's CPU time, both plans on arenas bound as the cpu device binds them), the cost per
cut, and the segment count the cpu device's default ``max_cut_cost`` would keep
(``model.segments.fewer_segments``).

    .venv/bin/python scripts/cut_cost.py ocr_det ocr_rec [--segment-ms 2,4,12] [--json -]
"""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="zoo or exported model names, or ONNX paths")
    ap.add_argument("--segment-ms", default="2,4,12", help="targets, comma-separated")
    ap.add_argument("--budget-s", type=float, default=3.0, help="measuring time per plan")
    ap.add_argument("--json", metavar="PATH", help="write the rows (- for stdout)")
    args = ap.parse_args()

    from av_infer.bench.peer import resolve_model
    from av_infer.bench.report import emit_json, human_stream
    from av_infer.kernels.ort_segments import measure_cut_cost
    from av_infer.model.segments import (
        DEFAULT_MAX_CUT_COST,
        MAX_SEGMENT_FACTOR,
        compile_segments,
        fewer_segments,
    )

    out = human_stream(args.json)
    targets = [float(x) for x in args.segment_ms.split(",") if x.strip()]
    rows = []
    bar = tqdm(total=len(args.models) * len(targets), desc="cut cost", file=sys.stderr)
    for spec in args.models:
        m = resolve_model(spec)
        whole = compile_segments(m.source, m.shapes, name=m.label, segment_ms=None)
        for seg_ms in targets:
            cut = compile_segments(m.source, m.shapes, name=m.label, segment_ms=seg_ms)
            n = len(cut.segments)
            cost = (measure_cut_cost(cut, whole, budget_s=args.budget_s, max_rounds=1000)
                    if n > 1 else 0.0)
            total = float(cut.stats["profiled_ms"])
            keep = fewer_segments(n, cost, DEFAULT_MAX_CUT_COST, total,
                                  MAX_SEGMENT_FACTOR * seg_ms)
            rows.append({"model": m.label, "segment_ms": seg_ms, "profiled_ms": total,
                         "segments": n, "cut_cost": cost,
                         "per_cut": cost / (n - 1) if n > 1 else None,
                         "segments_kept": keep})
            bar.update()
    bar.close()
    print(f"{'model':14s} {'seg_ms':>6s} {'whole ms':>8s} {'segs':>4s} {'cost':>7s} "
          f"{'per cut':>7s} {'kept':>4s}", file=out)
    for r in rows:
        per = "-" if r["per_cut"] is None else f"{100 * r['per_cut']:.2f}%"
        print(f"{r['model']:14s} {r['segment_ms']:6g} {r['profiled_ms']:8.2f} "
              f"{r['segments']:4d} {100 * r['cut_cost']:6.1f}% {per:>7s} "
              f"{r['segments_kept']:4d}", file=out)
    if args.json:
        emit_json({"kind": "cut_cost", "max_cut_cost": DEFAULT_MAX_CUT_COST, "rows": rows},
                  args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
