"""``av-infer pipeline plan|sim``: the MILP's plan of a cluster, and the simulator's
comparison of pool pipelines against one whole-model pool per device type; ``av-infer
profile --blocks``: measured block profiles (:mod:`.block_measure`).

``--profiles DIR`` plans on measured block-profile files (:mod:`.profile_files`) instead of
the built-in derived/measured ones; ``--cluster`` takes a cluster file or a SPEC;
``--weights`` the workload mix; PPipe's rules have one flag each."""

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


def _pairs(text: str | None, what: str) -> dict[str, float]:
    """``m1=0.3,m2=0.7`` -> {m1: 0.3, m2: 0.7}; InvalidParameterError otherwise."""
    from av_infer.errors import InvalidParameterError

    out: dict[str, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        k, sep, v = part.partition("=")
        try:
            x = float(v)
        except ValueError:
            x = float("nan")
        if not sep or not k.strip() or not (x > 0 and x < float("inf")):
            raise InvalidParameterError(f"{what} must look like 'model=number,...' with "
                                        f"numbers > 0, got {part!r}")
        out[k.strip()] = x
    return out


def _setup(args: argparse.Namespace) -> tuple[Any, dict, dict[str, float] | None]:
    from av_infer.errors import InvalidParameterError
    from av_infer.model import zoo
    from av_infer.pipeline.block_profiles import block_profiles
    from av_infer.pipeline.cluster import resolve_cluster

    args.weight_map = _pairs(getattr(args, "weights", None), "--weights")
    args.fill_map = _pairs(getattr(args, "fill_rate", None), "--fill-rate")
    if args.slo_ms is not None and not args.slo_ms > 0:
        raise InvalidParameterError(f"--slo-ms must be > 0, got {args.slo_ms}")
    if getattr(args, "profiles", None):
        from av_infer.pipeline.profile_files import load_profiles, require_types

        models = [m.strip() for m in args.models.split(",") if m.strip()] \
            if args.models else None
        profiles = load_profiles(args.profiles, models)
        cluster = resolve_cluster(args.cluster, profiles)
        require_types(profiles, [t.name for t in cluster.types])
        profiles = {m: {t.name: by_type[t.name] for t in cluster.types}
                    for m, by_type in profiles.items()}
        slos = {m: float(args.slo_ms) for m in profiles} if args.slo_ms is not None else None
        return cluster, profiles, slos
    cluster = resolve_cluster(args.cluster)
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models \
        else DEFAULT_MODELS
    unknown = [m for m in models if m not in zoo.names()]
    if unknown:
        from av_infer.errors import UnknownModelError

        raise UnknownModelError(f"unknown model(s) {unknown}; zoo: {', '.join(zoo.names())}")
    profiles = block_profiles(models, cluster.types, n_blocks=args.blocks)
    slos = {m: float(args.slo_ms) for m in models} if args.slo_ms is not None else None
    return cluster, profiles, slos


def _plan(args: argparse.Namespace, cluster: Any, profiles: dict, slos: Any,
          max_partitions: int) -> Any:
    from av_infer.pipeline.planner import plan_cluster

    return plan_cluster(profiles, cluster, slos, margin=args.margin,
                        max_partitions=max_partitions, fp16_boundaries=args.fp16_boundaries,
                        slo_factor=args.slo_factor, weights=args.weight_map or None,
                        server_link_sharing=not args.no_server_link_sharing,
                        batch_fill_factor=args.batch_fill_factor,
                        fill_rate=args.fill_map or None,
                        same_type_partitions=not args.no_same_type_partitions,
                        vfracs=args.fractions, time_limit_s=args.time_limit,
                        packing=args.packing)


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
        for t, d in plan.device_types.items():
            print(f"  type {t}: {d['count']} x, {d['source']} profiles, link "
                  f"{d['link_gbps']:g} Gbit/s + {d['link_latency_us']:g} us, "
                  f"{d['gpus_per_server']} per server")
        for p in plan.pipelines:
            stages = " -> ".join(f"[{s.first},{s.end}) {s.device_type} 1/{s.v} x{s.count}"
                                 for s in p.stages)
            print(f"  {p.model:<14} bs {p.batch:<2} {p.rate:>9.0f} req/s "
                  f"{p.latency_us / 1e3:6.2f} ms (+{p.fill_us / 1e3:.2f} fill)  {stages}")
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
                           "device_types": cluster.describe(),
                           "rules": plans["pipeline"].rules,
                           "weights": args.weight_map or "equal",
                           "plans": {k: p.to_dict() for k, p in plans.items()},
                           "slo_ms": plans["pipeline"].slo_ms,
                           "slo_rule": "given by --slo-ms" if slos else
                           f"{args.slo_factor:g}x batch-1 latency on the fastest device type",
                           "target_attainment": 0.99, "duration_s": args.duration,
                           "loads": {}}
    for load in loads:
        row: dict[str, Any] = {}
        for name, plan in plans.items():
            rate, run, _ = max_rate(plan, profiles, cluster, load, args.duration,
                                    weights=args.weight_map or None,
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
        sp.add_argument("--cluster", required=True, metavar="FILE|SPEC",
                        help="a cluster file (docs/pipeline.md) or device counts, e.g. "
                             "h100:25,orin:75 (simulated) or cpu:2")
        sp.add_argument("--profiles", metavar="DIR",
                        help="plan on the measured block profiles (*.blocks.json) in DIR; "
                             "their device types need no built-in definition")
        sp.add_argument("--weights", metavar="M=W,...",
                        help="workload mix: each model served at >= W x lambda (default "
                             "equal)")
        sp.add_argument("--batch-fill-factor", type=float, default=0.0, metavar="F",
                        help="count F (b-1)/rate of batch-fill time in the budget "
                             "(PPipe's reference: 1.3; default 0: off)")
        sp.add_argument("--fill-rate", metavar="M=R,...",
                        help="expected req/s per model for the batch-fill rule (default: "
                             "its rate in the no-partition plan)")
        sp.add_argument("--no-server-link-sharing", action="store_true",
                        help="a GPU's link is its own (default: the GPUs of a server share "
                             "its link, gpus_per_server from the cluster file)")
        sp.add_argument("--no-same-type-partitions", action="store_true",
                        help="never put consecutive partitions on one device type")
        sp.add_argument("--fractions", type=lambda t: tuple(int(x) for x in t.split(",")),
                        metavar="V1,V2", help="fractions 1/v the planner may use "
                        "(default: every profiled one)")
        sp.add_argument("--packing", choices=["mixed", "ppipe", "pure"], default="mixed",
                        help="how slices share a physical device: mixed (any fractions "
                             "and partitions), ppipe (one partition index per device; "
                             "fits PPipe's per-partition GPU count), pure (one fraction)")
        sp.add_argument("--time-limit", type=float, default=4.5, metavar="S",
                        help="seconds for enumeration + MILP (default 4.5)")
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


def cmd_profile(args: argparse.Namespace) -> int:
    """Measure block profiles of zoo models into ``--out`` (one file per model)."""
    from av_infer.errors import InvalidParameterError, UnknownModelError
    from av_infer.model import zoo
    from av_infer.pipeline.block_measure import measure_blocks
    from av_infer.pipeline.block_profiles import partition_model

    if not args.blocks:
        raise InvalidParameterError("av-infer profile measures block profiles: pass --blocks "
                                    "(kernel profiles: av-infer models profile)")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in zoo.names()]
    if unknown:
        raise UnknownModelError(f"unknown model(s) {unknown}; zoo: {', '.join(zoo.names())}")
    try:
        batches = [int(x) for x in args.batches.split(",")]
        fractions = [int(x) for x in args.fractions.split(",")]
    except ValueError:
        raise InvalidParameterError("--batches and --fractions take integers like 1,2,4"
                                    ) from None
    out_dir = Path(args.out)
    command = (f"av-infer profile --blocks --models {args.models} --device {args.device}"
               + (f" --gpu {args.gpu}" if args.device == "derived" else "")
               + f" --variant {args.variant} --n-blocks {args.n_blocks} --batches "
               f"{args.batches} --fractions {args.fractions} --repeats {args.repeats} "
               f"--warmup {args.warmup} --threads {args.threads} --out {args.out}")
    docs = []
    for m in models:
        pm = partition_model(m, args.variant, args.n_blocks)
        if args.device == "derived":  # a built-in simulated GPU's roofline estimate
            from av_infer.pipeline.block_profiles import derive_block_profile
            from av_infer.pipeline.profile_files import from_block_profile

            prof = from_block_profile(derive_block_profile(pm, args.gpu, batches, fractions))
            prof.provenance.update(command=command, estimate="roofline + occupancy "
                                   "(av_infer.profiles), not a measurement")
        else:
            prof = measure_blocks(pm, args.device, batches, fractions, repeats=args.repeats,
                                  warmup=args.warmup, threads=args.threads,
                                  type_name=args.type_name, command=command)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / prof.file_name()
        prof.save(path)
        docs.append({"file": str(path), **prof.to_doc()})
        if args.json != "-":
            whole = {b: sum(r) / 1e3 for b, r in prof.table.get(1, {}).items()}
            print(f"{m} on {prof.device_type}: {prof.n_blocks} blocks, whole model "
                  + ", ".join(f"b{b} {ms:.2f} ms" for b, ms in whole.items()) + f" -> {path}")
    _emit(args, {"profiles": docs})
    return 0


def add_profile_parser(sub: Any) -> None:
    """Register ``profile --blocks`` on the ``av-infer`` parser."""
    p = sub.add_parser("profile", help="measure block profiles for the pipeline planner "
                       "(docs/pipeline.md, measured profiles)")
    p.add_argument("--blocks", action="store_true", required=True,
                   help="per-block latencies per batch and fraction (the only mode)")
    p.add_argument("--models", required=True, metavar="M1,M2", help="zoo models")
    p.add_argument("--device", choices=["cpu", "cuda", "derived"], default="cpu",
                   help="cpu/cuda: measured with ONNX Runtime; derived: the roofline "
                        "estimate of the built-in simulated GPU --gpu (named 'derived')")
    p.add_argument("--gpu", default="orin", help="built-in GPU for --device derived")
    p.add_argument("--variant", choices=["scaled", "full"], default="scaled")
    p.add_argument("--n-blocks", type=int, default=DEFAULT_BLOCKS,
                   help="pre-partitioning blocks per model (default 10)")
    p.add_argument("--batches", default="1,2,4,8", help="batch sizes to try (default 1,2,4,8)")
    p.add_argument("--fractions", default="1",
                   help="1/v splits to measure (cuda > 1 needs MPS; cpu: 1 only)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per cell (median)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    p.add_argument("--type-name", help="device type name in the files (default: cpu, or the "
                   "GPU's name from nvidia-smi)")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the files")
    p.add_argument("--json", metavar="OUT", help="write the profiles as JSON ('-': stdout)")
    p.set_defaults(func=cmd_profile)
