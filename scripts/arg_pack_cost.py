"""Host time to make one task's kernel argument structs on the cuda device, per model:
packing every ``LaunchSpec`` in Python (``CudaDevice.new_task`` until 2026-11-27) vs the
plan's ``ArgTemplate`` (one vectorised add per task). Runs on the CPU (no GPU: only the
bytes are made); the structs are the same bytes either way (tests/kernels/test_arg_template.py).

    .venv/bin/python scripts/arg_pack_cost.py --variant full --rounds 5 [--json -]

Rounds alternate the two ways; each round is the median of ``--reps`` tasks; every round is
printed, then the median of the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=["full", "scaled"], default="full")
    ap.add_argument("--models", default="vgg19,resnet152,densenet201,inception_v3,distilbert")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=None, help="write the rows as JSON (- = stdout)")
    a = ap.parse_args(argv)

    from av_infer.kernels.cuda.sources import ArgTemplate, build_plan_source, slot_address
    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    rows = []
    for name in a.models.split(","):
        plan = compile_model(zoo.path(name, a.variant), name=name)
        src = build_plan_source(plan)
        weights, aux = 1 << 40, [(1 << 41) + 4096 * i for i in range(len(src.aux))]
        tmpl = ArgTemplate.build(plan, src.specs, weights, aux)
        arena = 1 << 42

        def packed() -> bytes:
            def resolve(ref: object) -> int:
                return slot_address(plan, ref, weights, arena, aux)  # noqa: B023

            return b"".join(s.pack(resolve) for s in src.specs)  # noqa: B023

        def templated() -> bytes:
            return tmpl.for_arena(arena)  # noqa: B023

        assert packed() == templated()
        per: dict[str, list[float]] = {"pack_us": [], "template_us": []}
        for _ in range(a.rounds):
            for key, fn in (("pack_us", packed), ("template_us", templated)):
                ts = []
                for _ in range(a.reps):
                    t = time.perf_counter()
                    fn()
                    ts.append((time.perf_counter() - t) * 1e6)
                per[key].append(statistics.median(ts))
        row = {"model": name, "variant": a.variant, "kernels": len(src.specs),
               "arena_slots": int(tmpl.arena_slots.size), **per,
               "pack_us_median": statistics.median(per["pack_us"]),
               "template_us_median": statistics.median(per["template_us"])}
        rows.append(row)
        print(f"{name:13s} {row['kernels']:4d} kernels  pack "
              + " ".join(f"{v:8.1f}" for v in per["pack_us"])
              + "  template " + " ".join(f"{v:6.1f}" for v in per["template_us"])
              + "  (us per task)", file=sys.stderr)
    if a.json:
        text = json.dumps({"rows": rows}, indent=1)
        if a.json == "-":
            print(text)
        else:
            with open(a.json, "w") as f:
                f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
