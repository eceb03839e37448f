"""Model-cache benchmark: Rafiqi's access patterns over 5 models with room for 4.

Why: Rafiqi §3.4 / Fig. 2 measure request latency when more models are asked for than the
device holds. Here: the cpu device (real loads: ``load_plan`` re-binds the kept plan),
the five scaled DISB models, a cache budget that fits exactly the 4 largest, one
closed-loop client going through the full Runtime (cache integrated in the scheduler),
and access patterns sequential (round robin: LRU's worst case), uniform and Zipf
(α = 1.1). The same run with an unlimited budget is the all-resident reference.

    python -m av_infer.bench.cache_bench [--requests 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from av_infer import Runtime
from av_infer.model import zoo
from av_infer.model.compiler import compile_model

MODELS = ("vgg19", "resnet152", "densenet201", "inception_v3", "distilbert")


def pattern(kind: str, n: int, k: int, seed: int = 0) -> list[int]:
    """Model indices of ``n`` requests over ``k`` models."""
    rng = np.random.default_rng(seed)
    if kind == "sequential":
        return [i % k for i in range(n)]
    if kind == "uniform":
        return [int(x) for x in rng.integers(0, k, n)]
    if kind == "zipf":
        w = 1.0 / np.arange(1, k + 1) ** 1.1
        return [int(x) for x in rng.choice(k, n, p=w / w.sum())]
    raise ValueError(kind)


def run(kind: str, n: int, budget: int | None, plans: dict[str, Any],
        inputs: dict[str, Any], warm: int = 5) -> dict[str, Any]:
    names = list(plans)
    seq = pattern(kind, n + warm, len(names))
    with Runtime("cpu", cache_budget=budget, max_be_streams=1) as rt:
        for nm in names:
            rt.load_model(nm, plans[nm])
        for i in seq[:warm]:  # warm-up (not measured)
            rt.submit(names[i], inputs[names[i]]).result(timeout=120)
        s0 = rt.stats()["cache"]
        lat = []
        t0 = time.perf_counter()
        for i in seq[warm:]:
            t = time.perf_counter()
            rt.submit(names[i], inputs[names[i]]).result(timeout=120)
            lat.append(time.perf_counter() - t)
        wall = time.perf_counter() - t0
        s1 = rt.stats()["cache"]
    hits, misses = s1["hits"] - s0["hits"], s1["misses"] - s0["misses"]
    a = np.asarray(lat) * 1e3
    return {
        "pattern": kind, "budget_bytes": budget, "requests": n,
        "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
        "mean_ms": float(a.mean()), "max_ms": float(a.max()),
        "throughput_rps": n / wall,
        "hit_rate": hits / max(1, hits + misses),
        "loads": s1["loads"] - s0["loads"], "evictions": s1["evictions"] - s0["evictions"],
        "load_p50_ms": (s1["load_time_s"]["p50"] or 0) * 1e3,
        "load_max_ms": (s1["load_time_s"]["max"] or 0) * 1e3,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    plans = {m: compile_model(zoo.path(m), name=m) for m in MODELS}
    inputs = {m: zoo.sample_inputs(m) for m in MODELS}
    sizes = sorted((p.weight_bytes for p in plans.values()), reverse=True)
    budget = sum(sizes[:4])  # exactly 4 fit, never 5
    print("models (weight MiB): " + ", ".join(
        f"{m} {p.weight_bytes / 2**20:.2f}" for m, p in plans.items()))
    print(f"budget {budget / 2**20:.2f} MiB (4 largest), total {sum(sizes) / 2**20:.2f} MiB")
    rows = []
    hdr = (f"{'pattern':<11}{'budget':>9}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>8}"
           f"{'hit':>7}{'loads':>7}{'load p50/max ms':>17}")
    print(hdr)
    for kind in ("sequential", "uniform", "zipf"):
        for b in (budget, None):
            r = run(kind, args.requests, b, plans, inputs)
            rows.append(r)
            print(f"{kind:<11}{'4 of 5' if b else 'all':>9}{r['p50_ms']:>9.2f}"
                  f"{r['p99_ms']:>9.2f}{r['throughput_rps']:>8.1f}{r['hit_rate']:>7.2f}"
                  f"{r['loads']:>7}{r['load_p50_ms']:>9.2f}/{r['load_max_ms']:<7.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"budget_bytes": budget, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
