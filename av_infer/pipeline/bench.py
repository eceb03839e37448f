"""Micro-benchmarks of the control and data planes (the issue's 5 s and 50 us budgets).

``python -m av_infer.pipeline.bench [--cluster SPEC] [--json -]`` times the MILP on the
DISB models and one batch decision (``probe()`` + ``reserve()``, and a whole Algorithm 1
step) on the planned cluster's largest pipelines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from av_infer.pipeline.batcher import ReservationBatcher
from av_infer.pipeline.block_profiles import block_profiles
from av_infer.pipeline.cli import DEFAULT_MODELS
from av_infer.pipeline.cluster import parse_cluster
from av_infer.pipeline.planner import plan_cluster
from av_infer.pipeline.reservation import ReservationTables, build_routes


def run(spec: str = "h100:10,mi50:20,orin:70", decisions: int = 20000) -> dict[str, Any]:
    cluster = parse_cluster(spec)
    profiles = block_profiles(DEFAULT_MODELS, cluster.types)
    solves = []
    for _ in range(3):
        plan = plan_cluster(profiles, cluster)
        solves.append(plan.solve_s)
    link_of = {t.name: (t.link_gbps, t.link_us) for t in cluster.types}
    routes, cids, pids = build_routes(plan, profiles, link_of)
    picks = {
        "widest": max(routes, key=lambda r: (sum(len(m) for m in r.members), len(r.members))),
        "deepest": max(routes, key=lambda r: (len(r.members), sum(len(m) for m in r.members))),
    }
    probe_us: dict[str, Any] = {}
    for label, route in picks.items():
        tables = ReservationTables(len(cids), len(pids))
        # offer batches at 2x what the route's slowest pool sustains, so tables fill up
        # and probes of later stages search (and back-fill) the timelines
        cap = min(len(m) * route.batch / lat for m, lat in
                  zip(route.members, route.stage_s[route.batch]))
        step = route.batch / (2 * cap)
        now, per = 0.0, []
        for _ in range(decisions):
            t0 = time.perf_counter()
            p = tables.probe(route, route.batch, now)
            tables.reserve(p, now)
            per.append(time.perf_counter() - t0)
            now += step
        probe_us[label] = {"median": statistics.median(per) * 1e6,
                           "p99": sorted(per)[int(0.99 * len(per))] * 1e6,
                           "model": route.model, "stages": len(route.members),
                           "members": [len(m) for m in route.members]}
    route = picks["deepest"]
    batcher = ReservationBatcher(routes, ReservationTables(len(cids), len(pids)))
    steps = []
    model = route.model
    now = 0.0
    for i in range(decisions // 10):
        for _ in range(route.batch):
            batcher.submit(model, i, now, now + plan.slo_ms[model] / 1e3)
        t0 = time.perf_counter()
        batcher.step(model, now)
        steps.append(time.perf_counter() - t0)
        now += 1e-3
    return {
        "cluster": spec, "models": DEFAULT_MODELS,
        "milp_solve_s": {"median": statistics.median(solves), "max": max(solves),
                         "columns": plan.columns, "status": plan.status,
                         "mip_gap": plan.mip_gap, "device_types": len(cluster.counts)},
        "probe_reserve_us": probe_us,
        "batch_decision_us": {"median": statistics.median(steps) * 1e6,
                              "p99": sorted(steps)[int(0.99 * len(steps))] * 1e6,
                              "probes_per_decision": batcher.probes / max(1, len(steps))},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cluster", default="h100:10,mi50:20,orin:70")
    ap.add_argument("--decisions", type=int, default=20000)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    doc = run(args.cluster, args.decisions)
    text = json.dumps(doc, indent=2)
    if args.json and args.json != "-":
        open(args.json, "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
