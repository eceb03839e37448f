"""``av-infer pipeline plan|sim``: the MILP's plan of a cluster, and the simulator's
comparison of pool pipelines against one whole-model pool per device type."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from av_infer.model.zoo import DISB_MODELS
from av_infer.pipeline.partition import DEFAULT_BLOCKS
from av_infer.pipeline.planner import DEFAULT_MARGIN, DEFAULT_MAX_PARTITIONS, SLO_FACTOR

DEFAULT_MODELS = list(dict.fromkeys(DISB_MODELS.values()))


def _setup(args: argparse.Namespace) -> tuple[Any, dict, dict[str, float] | None]:
    from av_infer.errors import InvalidParameterError
    from av_infer.model import zoo
    from av_infer.pipeline.block_profiles import block_profiles
    from av_infer.pipeline.cluster import parse_cluster

    cluster = parse_cluster(args.cluster)
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models \
        else DEFAULT_MODELS
    unknown = [m for m in models if m not in zoo.names()]
    if unknown:
        from av_infer.errors import UnknownModelError

        raise UnknownModelError(f"unknown model(s) {unknown}; zoo: {', '.join(zoo.names())}")
    if args.slo_ms is not None and not args.slo_ms > 0:
        raise InvalidParameterError(f"--slo-ms must be > 0, got {args.slo_ms}")
    profiles = block_profiles(models, cluster.types, n_blocks=args.blocks)
    slos = {m: float(args.slo_ms) for m in models} if args.slo_ms is not None else None
    return cluster, profiles, slos


def _plan(args: argparse.Namespace, cluster: Any, profiles: dict, slos: Any,
          max_partitions: int) -> Any:
    from av_infer.pipeline.planner import plan_cluster

    return plan_cluster(profiles, cluster, slos, margin=args.margin,
                        max_partitions=max_partitions, fp16_boundaries=args.fp16_boundaries,
                        slo_factor=args.slo_factor)


def _emit(args: argparse.Namespace, doc: dict) -> None:
    if args.json == "-":
        print(json.dumps(doc, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))


def cmd_plan(args: argparse.Namespace) -> int:
    cluster, profiles, slos = _setup(args)
    plan = _plan(args, cluster, profiles, slos, args.max_partitions)
    doc = plan.to_dict()
    doc["slo_rule"] = ("given by --slo-ms" if slos else
                       f"{args.slo_factor:g}x each model's batch-1 latency on its fastest "
                       "device type")
    _emit(args, doc)
    if args.json != "-":
        print(f"cluster {plan.cluster}: {doc['total_rate']:.0f} req/s planned, MILP "
              f"{plan.solve_s:.2f} s ({plan.status}, gap {plan.mip_gap:.2%}), "
              f"{plan.columns} columns")
        for p in plan.pipelines:
            stages = " -> ".join(f"[{s.first},{s.end}) {s.device_type} 1/{s.v} x{s.count}"
                                 for s in p.stages)
            print(f"  {p.model:<14} bs {p.batch:<2} {p.rate:>9.0f} req/s "
                  f"{p.latency_us / 1e3:6.2f} ms  {stages}")
        for m, s in plan.slo_ms.items():
            print(f"  SLO {m}: {s:.2f} ms ({doc['slo_rule']})")
    return 0


def cmd_sim(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from av_infer.pipeline.simulator import LOADS, max_rate

    cluster, profiles, slos = _setup(args)
    loads = list(LOADS) if args.load == "both" else [args.load]
    systems = {"pipeline": args.max_partitions, "no_partition": 1}
    plans = {name: _plan(args, cluster, profiles, slos, mp) for name, mp in systems.items()}
    bar = tqdm(total=len(loads) * len(systems) * (args.iters + 1), desc="sim", unit="run",
               disable=args.json == "-" or not sys.stderr.isatty())
    out: dict[str, Any] = {"cluster": cluster.spec(), "models": list(profiles),
                           "slo_ms": plans["pipeline"].slo_ms,
                           "slo_rule": "given by --slo-ms" if slos else
                           f"{args.slo_factor:g}x batch-1 latency on the fastest device type",
                           "target_attainment": 0.99, "duration_s": args.duration,
                           "loads": {}}
    for load in loads:
        row: dict[str, Any] = {}
        for name, plan in plans.items():
            rate, run, _ = max_rate(plan, profiles, cluster, load, args.duration,
                                    seed=args.seed, iters=args.iters, progress=bar)
            row[name] = {
                "rate": rate, "planned_rate": sum(plan.rate.values()),
                "slo_attainment": run.attainment if run else None,
                "utilisation": run.utilisation if run else {},
                "probes_per_batch": run.probes_per_batch if run else None,
                "mean_batch": run.mean_batch if run else None,
                "p99_latency_ms": run.p99_latency_ms if run else None,
                "solve_s": plan.solve_s, "pipelines": len(plan.pipelines),
                "partitioned_pipelines": sum(len(p.stages) > 1 for p in plan.pipelines),
            }
        np_rate = row["no_partition"]["rate"]
        row["ratio"] = row["pipeline"]["rate"] / np_rate if np_rate else None
        out["loads"][load] = row
    bar.close()
    first = out["loads"][loads[0]]
    out.update(pipeline=first["pipeline"], no_partition=first["no_partition"],
               ratio=first["ratio"], load=loads[0])
    _emit(args, out)
    if args.json != "-":
        print(f"cluster {cluster.spec()}, rate served at 99% SLO attainment (req/s):")
        print(f"{'load':<9}{'pipeline':>11}{'no_partition':>14}{'ratio':>8}  utilisation")
        for load, row in out["loads"].items():
            u = " ".join(f"{k}:{v:.2f}/{row['no_partition']['utilisation'].get(k, 0):.2f}"
                         for k, v in row["pipeline"]["utilisation"].items())
            print(f"{load:<9}{row['pipeline']['rate']:>11.0f}{row['no_partition']['rate']:>14.0f}"
                  f"{(row['ratio'] or 0):>8.2f}  {u} (pipeline/no_partition)")
    if args.plot:
        _plot(out, args.plot)
    return 0


def _plot(out: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = list(out["loads"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(loads))
    for i, name in enumerate(("pipeline", "no_partition")):
        ax.bar([x + 0.38 * i for x in xs], [out["loads"][ld][name]["rate"] for ld in loads],
               0.38, label=name)
    ax.set_xticks([x + 0.19 for x in xs], loads)
    ax.set_ylabel("req/s at 99% SLO attainment")
    ax.set_title(f"{out['cluster']}: {', '.join(out['models'])}", fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_pipeline_parser(sub: Any) -> None:
    """Register ``pipeline plan`` and ``pipeline sim`` on the ``av-infer`` parser."""
    p = sub.add_parser("pipeline", help="pool pipelines across heterogeneous devices (PPipe)")
    psub = p.add_subparsers(dest="pipeline_command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--cluster", required=True, metavar="SPEC",
                        help="device counts, e.g. h100:25,orin:75 (simulated) or cpu:2")
        sp.add_argument("--models", metavar="M1,M2",
                        help=f"zoo models (default: the DISB five: {','.join(DEFAULT_MODELS)})")
        sp.add_argument("--slo-ms", type=float, metavar="S",
                        help=f"one SLO for every model (default: {SLO_FACTOR:g}x its batch-1 "
                             "latency on the fastest device type, stated in the output)")
        sp.add_argument("--slo-factor", type=float, default=SLO_FACTOR, metavar="F",
                        help=f"default SLO = F x batch-1 latency on the fastest type "
                             f"(default {SLO_FACTOR:g}, PPipe §7.1; §7.6 sweeps 2..10)")
        sp.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                        help="fraction of the SLO the plan keeps back (default 0.4, PPipe)")
        sp.add_argument("--max-partitions", type=int, default=DEFAULT_MAX_PARTITIONS)
        sp.add_argument("--blocks", type=int, default=DEFAULT_BLOCKS,
                        help="pre-partitioning blocks per model (default 10)")
        sp.add_argument("--fp16-boundaries", action="store_true",
                        help="send feature maps between stages as float16 (half the bytes)")
        sp.add_argument("--json", metavar="OUT", help="write JSON ('-': stdout)")

    pp = psub.add_parser("plan", help="solve the MILP: partitions, pools, batch sizes")
    common(pp)
    pp.set_defaults(func=cmd_plan)
    ps = psub.add_parser("sim", help="simulate: rate at 99%% SLO attainment, pipeline vs "
                         "no_partition")
    common(ps)
    ps.add_argument("--load", choices=["poisson", "bursty", "both"], default="both")
    ps.add_argument("--duration", type=float, default=1.0, help="virtual seconds per run")
    ps.add_argument("--iters", type=int, default=7, help="bisection steps per system")
    ps.add_argument("--seed", type=int, default=0)
    ps.add_argument("--plot", metavar="PNG", help="bar chart of the served rates")
    ps.set_defaults(func=cmd_sim)
