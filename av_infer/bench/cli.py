"""``av-infer bench``: DISB workloads under the scheduling policies, tables, JSON, plots."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from av_infer.bench import plots
from av_infer.bench.harness import Bench, BenchConfig, PolicyRun, available_policies
from av_infer.bench.report import build_report, header, sweep_report, sweep_table, table, write_json
from av_infer.bench.workload import WorkloadError, expand, load_workload, read_trace, with_trace
from av_infer.devices import DEVICE_NAMES


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on the ``av-infer`` sub-command parser."""
    p = subparsers.add_parser(
        "bench", help="run DISB workloads under scheduling policies (REEF §7.2)",
        description=__doc__ + "  JSON schema: docs/bench.md.")
    p.add_argument("--workload", default="A",
                   help="A|B|C|D|E, a DISB JSON file, a comma list, or 'all' (A-E); default A")
    p.add_argument("--policy", default="all",
                   help="a policy, a comma list, or 'all' (%(default)s): "
                   + ", ".join(available_policies()))
    p.add_argument("--device", choices=list(DEVICE_NAMES), default="sim",
                   help="sim: virtual-time GPU model (default); cpu: real numpy kernels; cuda; "
                   "cuda-emu: the cuda code on the CPU emulator (checks the path, not speed)")
    p.add_argument("--duration", type=float, default=10.0,
                   help="seconds of the measured window (virtual on sim); default 10")
    p.add_argument("--seed", type=int, default=0, help="seed of poisson arrivals and the sim")
    p.add_argument("--scale", choices=["scaled", "full"], default=None,
                   help="zoo variant (default: scaled on cpu, full on cuda; on sim only for "
                   "models without a REEF trace, default full)")
    p.add_argument("--c", type=int, default=4, help="in-flight kernels per stream (default 4)")
    p.add_argument("--preempt-drain", action="store_true",
                   help="reef: start RT only after the <= c launched BE kernels drained "
                   "(REEF-N's literal order; Runtime(preempt_drain=True))")
    p.add_argument("--gpu", default=None,
                   help="simulated GPU (sim only): mi50 (default), h100, h200, orin; with "
                   "--compare-sim the default is the GPU the results were measured on")
    p.add_argument("--contention", default="calibrated",
                   help="sim: memory-side contention model: calibrated or paper (default; "
                   "streams on DISB A at REEF's 1.84x), bandwidth (uncalibrated), none (SM "
                   "sharing only), beta=X, or a parameter FILE.json from "
                   "--refit-contention (docs/bench.md, docs/sim_fidelity.md)")
    p.add_argument("--host", default=None, metavar="FILE.json",
                   help="sim: host model (per-request start work and one busy host, "
                   "devices/sim_host.py) from a parameter FILE.json of --refit-host; "
                   "default none (launches cost GpuSpec.launch_us only)")
    p.add_argument("--pad", default=None, metavar="FILE.json",
                   help="sim: what a padded (DKP) launch costs the RT kernel per model "
                   "(devices/sim_pad.py), a parameter FILE.json of --refit-pad; default "
                   "REEF's 0.8 %% (GpuSpec.pad_overhead); with --refit-pad on DISB files: "
                   "the base the fitted multiplier scales")
    p.add_argument("--profiles", metavar="DIR",
                   help="sim: measured kernel profiles (DIR of <model>.profile.json or a "
                   "bundle FILE.json, e.g. from "
                   "python -m av_infer.bench.gpu_profiles); models without one use the "
                   "REEF trace or a derived profile (models.<m>.profile says which)")
    p.add_argument("--sim-models", choices=["reef", "zoo"], default="reef",
                   help="sim: REEF traces where one exists (default) or the zoo plans for "
                   "every model (what the cuda device runs)")
    g2 = p.add_argument_group(
        "simulator vs GPU (docs/sim_fidelity.md)",
        "--compare-sim: re-run a GPU DISB result in the simulator and write sim_fidelity "
        "rows (--json OUT, default sim_fidelity.json; '-': stdout); --refit-contention: "
        "fit the contention model's beta to the GPU's streams/reef_dkp rows")
    g2.add_argument("--compare-sim", metavar="GPU_JSON", nargs="+",
                    help="a bench JSON measured on cuda, or gpu_check.sh's disb_cuda.json; "
                    "several files are read as one result (rows name their gpu_file)")
    g2.add_argument("--calibrate", choices=["none", "standalone"], default="none",
                    help="derived profiles scaled per model to the GPU run's standalone p50 "
                    "(default none)")
    g2.add_argument("--refit-contention", metavar="GPU_JSON", nargs="+",
                    help="write the fitted contention parameters to --params-out (several "
                    "files: one fit over all their rows)")
    g2.add_argument("--refit-host", metavar="GPU_JSON", nargs="+",
                    help="fit the host model (start work from standalone and rt_only "
                    "first_kernel_us, completion work from the co-running policies' "
                    "first_kernel_us) and write it to --params-out")
    g2.add_argument("--refit-pad", metavar="SRC", nargs="+",
                    help="write the padded launch's per-model cost to --params-out: from "
                    "pad_select measurements (scripts/gpu_pad_select_check.py's JSON or the "
                    "gpu_check.log it printed into), or one multiplier on --pad (default: a "
                    "uniform overhead) fitted to the reef_dkp rows of GPU DISB files")
    g2.add_argument("--pad-select", choices=["parts", "regs"], default="parts",
                    help="--refit-pad from pad_select: whose overhead (the pad_select the "
                    "DISB runs used; default parts, as on both H200 leases)")
    g2.add_argument("--pad-per-model", action="store_true",
                    help="--refit-pad on DISB files: after the one multiplier, one per model "
                    "an RT client runs (coordinate descent over all fitted rows)")
    g2.add_argument("--host-no-complete", action="store_true",
                    help="--refit-host: fit the start work only (complete_us = 0)")
    g2.add_argument("--params-out", metavar="FILE.json", default=None,
                    help="parameter file of --refit-contention (default "
                    "contention_fit.json), --refit-host (default host_fit.json) or "
                    "--refit-pad (default pad_fit.json)")
    g2.add_argument("--fit-policies", default=None,
                    help="policies whose rows the refit uses (default streams,reef_dkp; "
                    "--refit-host: streams,reef,reef_dkp)")
    g2.add_argument("--fit-workloads", default=None, metavar="W1,W2",
                    help="workloads of GPU_JSON the refit uses (default: all); judge the "
                    "others held out with --compare-sim --contention FILE.json")
    p.add_argument("--dkp-placement", choices=["faithful", "reserved"], default="faithful",
                   help="sim: padded grids placed as CUDA places any grid (default), or the "
                   "'reserved' what-if (BE blocks on SMs the RT kernel leaves free)")
    p.add_argument("--be-min-share", type=float, default=0.0,
                   help="Runtime be_min_share (default 0: REEF's strict RT priority)")
    p.add_argument("--rt-forecast", action="store_true",
                   help="policies that preempt: hold BE kernels across forecast RT arrivals "
                   "(sched.rt_forecast; report rows named POLICY+forecast)")
    p.add_argument("--deadline-ms", type=float, default=None,
                   help="relative deadline of every RT client (default: its period)")
    p.add_argument("--standalone-n", type=int, default=20,
                   help="requests per model in the standalone reference (default 20)")
    p.add_argument("--rate-scale", type=float, default=1.0, metavar="F",
                   help="multiply open-loop (RT) arrival rates by F, e.g. 0.25 on cpu where "
                   "DISB's 100 req/s overloads the host (default 1)")
    p.add_argument("--trace", metavar="FILE",
                   help="JSON list of ms offsets (or {'trace': [...]}): drives every RT client")
    p.add_argument("--sweep", metavar="c=1,2,4,8",
                   help="run --sweep-policy once per value of c instead of the policy list")
    p.add_argument("--sweep-policy", default="reef", help="policy of --sweep (default reef)")
    p.add_argument("--json", metavar="OUT", help="write the report as JSON")
    p.add_argument("--plot", metavar="OUT.png",
                   help="latency CDF at OUT.png, plus OUT_throughput.png, OUT_timeline.png")
    p.add_argument("--out", metavar="DIR",
                   help="write <W>.json and <W>_{cdf,throughput,timeline}.png under DIR")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--switch-interval-us", type=float, default=None, metavar="US",
                   help="CPython's GIL switch interval for this run (sys.setswitchinterval; "
                   "Python's default 5000 us): how long a thread that wants the GIL waits "
                   "before the holder is asked to drop it. Peer reports record it "
                   "(machine.gil_switch_interval_s); docs/gpu_results.md says why")
    g = p.add_argument_group(
        "peer comparison (--peer ort)",
        "the same load through av_infer (cpu), one ORT session per model with a thread per "
        "client, and the RT model alone in ORT; --policy, --c, --duration, --json apply")
    g.add_argument("--peer", choices=["ort", "torch"],
                   help="run the side-by-side comparison (torch: on a GPU, av_infer cuda vs "
                   "torch streams with priorities, eager and CUDA graphs, and the RT model "
                   "alone; --workload A|C, --rate-scale, --precision, --vendor apply)")
    p.add_argument("--precision", choices=["fp32", "tf32", "fp16"], default="fp32",
                   help="every model at this precision (Runtime.load_model(precision=)), "
                   "also under --peer ort|torch; the device must run it: cpu and sim "
                   "fp32 only, cuda and cuda-emu all three (%(default)s)")
    g.add_argument("--vendor", choices=["off", "auto", "force"], default="auto",
                   help="--peer torch: av_infer's cuda vendor ops (cuDNN/cuBLASLt; "
                   "%(default)s)")
    g.add_argument("--rt-graphs", type=_rt_graphs_arg, default=0, metavar="N",
                   help="--peer torch: av_infer's RT model as one CUDA graph launch per "
                   "request, N graph instances per model (0..8; 0: per-op launches; "
                   "docs/cuda_graphs.md; %(default)s)")
    g.add_argument("--rt-model", default="resnet152",
                   help="zoo name, exported model (ocr_det, ocr_rec, ocr_cls) or ONNX path "
                   "(%(default)s)")
    g.add_argument("--be-model", default="vgg19",
                   help="zoo name, exported model or ONNX path (%(default)s)")
    g.add_argument("--rt-input-shape", action="append", metavar="[NAME=]DIMS",
                   help="input shape of an ONNX --rt-model with dynamic dims")
    g.add_argument("--be-input-shape", action="append", metavar="[NAME=]DIMS",
                   help="input shape of an ONNX --be-model with dynamic dims")
    g.add_argument("--rt-rate", type=float, default=20.0, help="RT requests/s (%(default)s)")
    g.add_argument("--be-clients", type=int, default=None,
                   help="closed-loop BE clients (--peer ort: 2; --peer torch: one per BE "
                        "model of the workload)")
    g.add_argument("--threads", type=int, default=1,
                   help="intra-op threads per ORT session, both systems (%(default)s)")
    g.add_argument("--warmup", type=float, default=1.0,
                   help="seconds before measuring, in every turn of every round")
    g.add_argument("--rounds", type=int, default=4,
                   help="the systems take turns in this many rounds (ABBA order), the "
                   "measured --duration split between them: each system sees the same "
                   "drift of a shared machine (%(default)s; 1: one run each)")
    g.add_argument("--device-option", action="append", default=[], metavar="KEY=VALUE",
                   help="cpu device option for av_infer (e.g. segment_ms=4, kill=false, "
                   "os_priority=nice)")
    p.set_defaults(func=cmd_bench)
    return p


def _policies(spec: str, device: str) -> list[str]:
    avail = available_policies(device)
    if spec.lower() == "all":
        return avail
    names = [s.strip().lower() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in avail]
    if bad:
        raise SystemExit(f"bench: unknown policy {bad}, or one {device!r} cannot run; choose from "
                         f"{', '.join(avail)} or 'all'")
    return names


def _parse_sweep(spec: str) -> tuple[str, list[int]]:
    param, sep, vals = spec.partition("=")
    if not sep or param.strip() != "c":
        raise SystemExit("bench: --sweep takes c=V1,V2,... (only c can be swept)")
    try:
        values = [int(v) for v in vals.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"bench: --sweep values must be integers: {vals!r}") from None
    if not values or min(values) < 1:
        raise SystemExit("bench: --sweep values must be >= 1")
    return "c", values


def _suffixed(path: str, tag: str | None, extra: str = "") -> Path:
    p = Path(path)
    stem = p.stem + (f"_{tag}" if tag else "") + extra
    return p.with_name(stem + (p.suffix or ".png"))


def _tag(wl_name: str) -> str:
    return Path(wl_name).stem if wl_name.endswith(".json") else wl_name


def write_plots(doc: dict[str, Any], runs: list[PolicyRun], cdf_path: Path) -> list[Path]:
    """CDF at ``cdf_path``; throughput and timeline beside it."""
    lat = {(r.label or r.policy): [rec.latency * 1e3 for rec in r.records if rec.rt and rec.ok]
           for r in runs}
    base = cdf_path.with_suffix("")
    name = base.name[:-4] if base.name.endswith("_cdf") else base.name
    title = f"DISB {doc['workload']} on {doc['device']}"
    out = [plots.latency_cdf(lat, cdf_path, title=f"{title}: RT latency CDF")]
    out.append(plots.throughput_bars(doc["policies"], base.with_name(name + "_throughput.png"),
                                     title=f"{title}: throughput"))
    tl_run = next((r for r in runs if r.policy == "reef" and r.timeline), None) or next(
        (r for r in runs if r.timeline), None)
    out.append(plots.timeline(tl_run.timeline if tl_run else None,
                              base.with_name(name + "_timeline.png")))
    return out


def parse_device_options(items: list[str]) -> dict[str, Any]:
    """``--device-option KEY=VALUE`` arguments as device options (values: true/false, int,
    float, else the string); SystemExit naming a malformed one."""
    opts = {}
    for kv in items:
        k, sep, v = kv.partition("=")
        if not sep:
            raise SystemExit(f"--device-option: expected KEY=VALUE, got {kv!r}")
        opts[k.strip()] = _option_value(v)
    return opts


def _option_value(v: str) -> Any:
    low = v.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def _rt_graphs_arg(v: str) -> int:
    """``--rt-graphs``: the range ``CudaDevice(rt_graphs=)`` accepts, refused at parse time."""
    from av_infer.devices.cuda import MAX_RT_GRAPHS

    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an integer 0..{MAX_RT_GRAPHS}, got {v!r}") from None
    if not 0 <= n <= MAX_RT_GRAPHS:
        raise argparse.ArgumentTypeError(f"an integer 0..{MAX_RT_GRAPHS}, got {v!r}")
    return n


def cmd_peer(args: argparse.Namespace) -> int:
    """``av-infer bench --peer ort``: av_infer beside plain ORT threads, one run."""
    import json

    from av_infer.bench.peer import (
        PeerConfig,
        check_load,
        format_peer,
        peer_command,
        run_peer,
    )
    from av_infer.model.shape_args import parse_input_shapes

    if args.device != "cpu" and "--device" in sys.argv:
        raise SystemExit("bench --peer: the comparison runs on the cpu device")
    check_precision("cpu", args.precision)
    policy = "reef" if args.policy == "all" else args.policy
    if policy not in available_policies("cpu"):
        raise SystemExit(f"bench --peer: policy {policy!r} is not available on cpu")
    opts = parse_device_options(args.device_option)
    be_clients = 2 if args.be_clients is None else args.be_clients
    if be_clients < 1 or args.rt_rate <= 0 or args.threads < 1 or args.rounds < 1:
        raise SystemExit("bench --peer: --be-clients >= 1, --rt-rate > 0, --threads >= 1, "
                         "--rounds >= 1")
    cfg = PeerConfig(rt_model=args.rt_model, be_model=args.be_model,
                     rt_shape=parse_input_shapes(args.rt_input_shape),
                     be_shape=parse_input_shapes(args.be_input_shape),
                     rt_rate=args.rt_rate, be_clients=be_clients, policy=policy,
                     c=args.c, duration=args.duration, warmup=args.warmup,
                     threads=args.threads, device_options=opts,
                     progress=not args.no_progress, rounds=args.rounds)
    try:
        check_load(cfg)
    except ValueError as exc:
        raise SystemExit(f"bench --peer: {exc}") from None
    doc = run_peer(cfg)
    extra: list[str] = []
    for flag, vals in (("--rt-input-shape", args.rt_input_shape),
                       ("--be-input-shape", args.be_input_shape),
                       ("--device-option", args.device_option)):
        for v in vals or []:
            extra += [flag, v]
    if args.switch_interval_us is not None:
        extra += ["--switch-interval-us", f"{args.switch_interval_us:g}"]
    doc["command"] = peer_command(cfg, extra)  # repeats this run
    if args.json == "-":
        print(json.dumps(doc, indent=2))
        print(format_peer(doc), file=sys.stderr)
        return 0
    print(format_peer(doc))
    if args.json:
        print(f"wrote {write_json(doc, args.json)}", file=sys.stderr)
    return 0


def cmd_peer_torch(args: argparse.Namespace) -> int:
    """``av-infer bench --peer torch`` (av_infer/bench/peer_torch.py); exit 2 where it
    cannot run (no GPU, no torch), with the reason."""
    import json

    from av_infer.bench.peer_torch import (
        WORKLOADS,
        PeerUnavailable,
        TorchPeerConfig,
        format_torch_peer,
        run_torch_peer,
    )

    if args.workload not in WORKLOADS:
        raise SystemExit(f"bench --peer torch: --workload {sorted(WORKLOADS)}")
    policy = "reef" if args.policy == "all" else args.policy
    be_clients = args.be_clients or 0  # 0: one per BE model of the workload
    cfg = TorchPeerConfig.for_workload(
        args.workload, args.rate_scale, be_clients=be_clients, precision=args.precision,
        policy=policy, c=args.c, duration=args.duration, warmup=args.warmup,
        scale=args.scale or "full", vendor=args.vendor, progress=not args.no_progress,
        rt_graphs=args.rt_graphs)
    try:
        doc = run_torch_peer(cfg)
    except PeerUnavailable as e:
        print(f"bench --peer torch: cannot run here: {e}", file=sys.stderr)
        return 2
    if args.json == "-":
        print(json.dumps(doc, indent=2))
        print(format_torch_peer(doc), file=sys.stderr)
        return 0
    print(format_torch_peer(doc))
    if args.json:
        print(f"wrote {write_json(doc, args.json)}", file=sys.stderr)
    return 0


def cmd_compare_sim(args: argparse.Namespace) -> int:
    """``--compare-sim GPU_JSON`` (sim_fidelity rows) and ``--refit-contention GPU_JSON``."""
    import json

    from av_infer.bench import compare_sim, contention_fit

    gpu = args.gpu  # None: the GPU the results name
    pols = None if args.policy == "all" else [x.strip() for x in args.policy.split(",")]
    opts = compare_sim.CompareOptions(
        gpu=gpu, contention=args.contention, host=args.host, pad=args.pad,
        profiles=args.profiles, calibrate=args.calibrate, progress=not args.no_progress,
        policies=pols)
    fit_wls = None if args.fit_workloads is None else [
        x.strip() for x in args.fit_workloads.split(",") if x.strip()]
    fit_pols = None if args.fit_policies is None else [
        x.strip() for x in args.fit_policies.split(",") if x.strip()]
    try:
        if args.refit_pad:
            from av_infer.bench import pad_fit

            args.params_out = args.params_out or "pad_fit.json"
            doc = pad_fit.refit_pad(args.refit_pad, opts, args.params_out,
                                    select=args.pad_select, policies=fit_pols,
                                    workloads=fit_wls, per_model=args.pad_per_model)
            text = pad_fit.format_fit(doc)
        elif args.refit_host:
            from av_infer.bench import host_fit

            args.params_out = args.params_out or "host_fit.json"
            doc = host_fit.refit_host(args.refit_host, opts, args.params_out,
                                      policies=fit_pols, workloads=fit_wls,
                                      complete=not args.host_no_complete)
            text = host_fit.format_fit(doc)
        elif args.refit_contention:
            args.params_out = args.params_out or "contention_fit.json"
            doc = contention_fit.refit(args.refit_contention, opts,
                                       fit_pols or ["streams", "reef_dkp"],
                                       out=args.params_out, workloads=fit_wls)
            text = contention_fit.format_fit(doc)
        else:
            doc = compare_sim.run_compare(args.compare_sim, opts)
            text = compare_sim.format_table(doc)
    except (ValueError, FileNotFoundError, WorkloadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json == "-":
        print(json.dumps(doc, indent=1))
        print(text, file=sys.stderr)
        return 0
    print(text)
    if args.compare_sim:
        print(f"wrote {write_json(doc, args.json or 'sim_fidelity.json')}", file=sys.stderr)
    else:
        print(f"wrote {args.params_out}", file=sys.stderr)
        if args.json:
            print(f"wrote {write_json(doc, args.json)}", file=sys.stderr)
    return 0


def check_precision(device: str, precision: str, what: str = "bench") -> None:
    """InvalidParameterError (exit 2 with its reason) before anything runs when
    ``device`` does not run ``precision`` (``Device.precisions``, the list
    ``Runtime.load_model`` checks); a device that cannot load here is left to the
    Runtime, which says why."""
    from av_infer.devices import device_class
    from av_infer.errors import AvInferError, InvalidParameterError

    try:
        runs = tuple(device_class(device).precisions)
    except AvInferError:
        return
    if precision not in runs:
        raise InvalidParameterError(
            f"{what}: --precision {precision}: device {device} runs {', '.join(runs)}")


def cmd_bench(args: argparse.Namespace) -> int:
    """Entry point of ``av-infer bench``."""
    if args.switch_interval_us is not None:
        if not 0 < args.switch_interval_us <= 1e6:
            raise SystemExit("bench: --switch-interval-us must be in (0, 1000000]")
        sys.setswitchinterval(args.switch_interval_us * 1e-6)
    if args.peer == "torch":
        return cmd_peer_torch(args)
    if args.rt_graphs:  # a cuda device option of the torch comparison only: never ignored
        raise SystemExit("bench: --rt-graphs applies to --peer torch (the cuda device); for "
                         "other runs on the cuda device set AV_INFER_CUDA_RT_GRAPHS=N")
    if args.peer:
        return cmd_peer(args)
    if args.compare_sim or args.refit_contention or args.refit_host or args.refit_pad:
        return cmd_compare_sim(args)
    args.gpu = args.gpu or "mi50"
    cfg = BenchConfig(device=args.device, duration=args.duration, seed=args.seed,
                      scale=args.scale, c=args.c, preempt_drain=args.preempt_drain,
                      gpu=args.gpu, deadline_ms=args.deadline_ms,
                      standalone_n=args.standalone_n, progress=not args.no_progress,
                      contention=args.contention, host=args.host, pad=args.pad,
                      dkp_placement=args.dkp_placement,
                      be_min_share=args.be_min_share, rt_forecast=args.rt_forecast,
                      profiles=args.profiles, sim_models=args.sim_models,
                      precision=args.precision)
    check_precision(args.device, args.precision)
    if args.profiles and args.device != "sim":
        raise SystemExit("bench: --profiles applies to --device sim only")
    if args.c < 1:
        raise SystemExit("bench: --c must be >= 1")
    if not 0.0 <= args.be_min_share < 1.0:
        raise SystemExit("bench: --be-min-share must be in [0, 1)")
    if args.device == "sim":
        from av_infer.devices.sim_contention import check_model
        from av_infer.devices.sim_host import check_host

        try:
            check_model(args.contention, args.gpu)
        except ValueError as e:
            raise SystemExit(f"bench: --contention: {e}") from None
        try:
            check_host(args.host, args.gpu)
        except (ValueError, FileNotFoundError) as e:
            raise SystemExit(f"bench: --host: {e}") from None
        from av_infer.devices.sim_pad import check_pad

        try:
            check_pad(args.pad, args.gpu)
        except (ValueError, FileNotFoundError) as e:
            raise SystemExit(f"bench: --pad: {e}") from None
    elif args.host not in (None, "none"):
        raise SystemExit("bench: --host applies to --device sim only")
    elif args.pad not in (None, "none"):
        raise SystemExit("bench: --pad applies to --device sim only")
    sweep = _parse_sweep(args.sweep) if args.sweep else None
    policies = _policies(args.sweep_policy if sweep else args.policy, args.device)
    try:
        workloads = [load_workload(w) for w in expand(args.workload)]
        if args.trace:
            tr = read_trace(args.trace)
            workloads = [with_trace(wl, tr, label=Path(args.trace).stem) for wl in workloads]
        if args.rate_scale != 1.0:
            workloads = [wl.scaled(args.rate_scale) for wl in workloads]
    except WorkloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    several = len(workloads) > 1
    to_stdout = args.json == "-"  # JSON on stdout, tables on stderr
    tables = sys.stderr if to_stdout else sys.stdout
    docs: list[dict[str, Any]] = []
    for wl in workloads:
        tag = _tag(wl.name)
        try:
            bench = Bench(wl, cfg)
        except (ValueError, FileNotFoundError) as e:  # --profiles: unreadable or mismatched
            print(f"error: {e}", file=sys.stderr)
            return 2
        bench.standalone()
        if sweep:
            param, values = sweep
            runs = []
            for v in values:
                print(f"[{wl.name}] {policies[0]} c={v}", file=sys.stderr)
                runs.append(bench.run_policy(policies[0], c=v))
            doc = sweep_report(bench, param, values, runs)
            print(header(doc), file=tables)
            print(sweep_table(doc), file=tables)
        else:
            runs = []
            for pol in policies:
                if cfg.progress:
                    print(f"[{wl.name}] {pol}", file=sys.stderr)
                runs.append(bench.run_policy(pol))
            doc = build_report(bench, runs)
            print(header(doc), file=tables)
            print(table(doc), file=tables)
        print(file=tables)
        written: list[Path] = []
        jtag = tag if several else None
        if to_stdout:
            docs.append(doc)
        elif args.json:
            written.append(write_json(doc, _suffixed(args.json, jtag)))
        if args.out:
            out = Path(args.out)
            kind = f"_sweep_{sweep[0]}" if sweep else ""
            written.append(write_json(doc, out / f"{tag}{kind}.json"))
            if sweep:
                written.append(plots.sweep_plot(doc["sweep"]["values"], doc["sweep"]["results"],
                                                out / f"{tag}_sweep_{sweep[0]}.png"))
            else:
                written += write_plots(doc, runs, out / f"{tag}_cdf.png")
        if args.plot:
            if sweep:
                written.append(plots.sweep_plot(doc["sweep"]["values"], doc["sweep"]["results"],
                                                _suffixed(args.plot, jtag)))
            else:
                written += write_plots(doc, runs, _suffixed(args.plot, jtag))
        for p in written:
            print(f"wrote {p}", file=sys.stderr)
    if to_stdout:
        import json

        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    return 0
