"""The ``av-infer`` command: models list|check|show|profile, bench (see av_infer/bench/cli.py),
pipeline plan|sim and profile --blocks (av_infer/pipeline/cli.py)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from av_infer.devices import DEVICE_NAMES
from av_infer.errors import AvInferError
from av_infer.model.shape_args import parse_input_shapes


def resolve_model(name_or_path: str, variant: str) -> tuple[str, Path]:
    """A zoo name (built on first use) or a path to an ONNX file."""
    from av_infer.model import zoo

    if name_or_path in zoo.names():
        return name_or_path, zoo.path(name_or_path, variant=variant)
    p = Path(name_or_path)
    if not p.exists():
        raise SystemExit(
            f"{name_or_path!r} is neither a zoo model ({', '.join(zoo.names())}) nor a file"
        )
    return p.stem, p


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cmd_models_list(args: argparse.Namespace) -> int:
    from av_infer.model import zoo

    for name in zoo.names():
        print(name)
    return 0


def cmd_models_check(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from av_infer.model import zoo
    from av_infer.model.check import check_model

    targets = list(zoo.names()) if args.all else args.model
    if not targets:
        raise SystemExit("models check: give NAME_OR_PATH (or --all)")
    for flag, value in (("--rtol", args.rtol), ("--atol", args.atol)):
        if not (math.isfinite(value) and value >= 0):  # argparse's type= already rejects
            raise SystemExit(f"models check: {flag} must be a finite number >= 0, got {value!r}")
    shapes = parse_input_shapes(args.input_shape)
    reports, failed = [], []
    bar = tqdm(targets, desc="check", unit="model", disable=args.json == "-" or len(targets) < 2)
    for target in bar:
        bar.set_postfix_str(target)
        try:
            name, path = resolve_model(target, args.variant)
            target_shapes, inputs = shapes, None
            if shapes is None and target in zoo.names():
                inputs = zoo.sample_inputs(target, args.variant)  # binds dynamic dims too
                target_shapes = {k: list(v.shape) for k, v in inputs.items()}
            reports.append(check_model(path, target_shapes, inputs=inputs, name=name,
                                       rtol=args.rtol, atol=args.atol))
        except AvInferError as e:
            failed.append({"model": target, "error": e.code, "message": str(e)})
            print(f"{target}: {type(e).__name__}: {e}", file=sys.stderr)
    rows = [r.to_dict() for r in reports]
    if args.json:
        doc = rows[0] if len(rows) == 1 and not args.all and not failed else {
            "models": rows, "errors": failed}
        text = json.dumps(doc, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text)
    if args.json != "-":
        print_check_table(rows)
        print(f"tolerance: numpy.allclose(cpu, ort, rtol={args.rtol:g}, atol={args.atol:g}), "
              "i.e. |cpu - ort| <= atol + rtol * |ort| per element vs ONNX Runtime (CPU)")
        for r in rows:
            for out, d in r["per_output_detail"].items():
                if not d["ok"]:
                    print(f"FAIL {r['model']}/{out}: max abs err {d['max_abs_err']:.3g}, "
                          f"worst excess over atol + rtol*|ort| {d['worst_excess']:.3g}")
    bad = failed or [r for r in reports if not r.ok]
    return 1 if bad else 0


def print_check_table(rows: list[dict]) -> None:
    hdr = (f"{'model':<18}{'kernels':>8}{'unopt':>7}{'weights':>11}{'activ.':>11}"
           f"{'compile s':>10}{'cpu ms':>9}{'ort ms':>9}{'max abs err':>13}{'max rel err':>13}"
           "  ok")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['model']:<18}{r['kernels']:>8}{r['kernels_unoptimized']:>7}"
              f"{_fmt_bytes(r['weight_bytes']):>11}{_fmt_bytes(r['activation_bytes']):>11}"
              f"{r['compile_s']:>10.2f}{r['run_s'] * 1e3:>9.1f}{r['ort_s'] * 1e3:>9.1f}"
              f"{r['max_abs_err']:>13.2e}{r['max_rel_err']:>13.2e}"
              f"  {'ok' if r['ok'] else 'FAIL'}")


def cmd_models_show(args: argparse.Namespace) -> int:
    from av_infer.model.compiler import compile_model

    name, path = resolve_model(args.model, args.variant)
    plan = compile_model(path, input_shapes=parse_input_shapes(args.input_shape), name=name)
    print(f"{plan.name}: {len(plan.kernels)} kernels, weights {_fmt_bytes(plan.weight_bytes)}, "
          f"activations {_fmt_bytes(plan.activation_bytes)}, reuse guard {plan.reuse_guard}")
    for n, (shape, dtype) in plan.input_spec().items():
        print(f"  input  {n}: {dtype}{list(shape)}")
    for n, (shape, dtype) in plan.output_spec().items():
        print(f"  output {n}: {dtype}{list(shape)}")
    print(f"{'#':>4} {'kind':<14}{'name':<34}{'grid':>16}{'block':>7}{'smem':>7}  output")
    for k in plan.kernels:
        out = plan.tensors[k.outputs[0]] if k.outputs else None
        grid = "x".join(str(g) for g in k.geometry.grid)
        extra = ""
        if k.args.get("epilogue"):
            extra = " +" + "+".join(str(s[0]) for s in k.args["epilogue"])
        print(f"{k.index:>4} {k.kind + extra:<14.14}{k.name:<34.34}{grid:>16}"
              f"{k.geometry.threads:>7}{k.geometry.smem:>7}  "
              f"{out.dtype + str(list(out.shape)) if out else ''}")
    return 0


def cmd_models_profile(args: argparse.Namespace) -> int:
    """Profile a plan's kernels on a device and save the profile (DKP reads it)."""
    from av_infer.bench.cli import check_precision
    from av_infer.model.compiler import compile_model
    from av_infer.profiler import profile_plan

    check_precision(args.device, args.precision, "models profile")  # before compiling
    name, path = resolve_model(args.model, args.variant)
    plan = compile_model(path, input_shapes=parse_input_shapes(args.input_shape), name=name)
    plan.precision = args.precision  # what the device loads (Plan.precision)
    try:
        prof = profile_plan(plan, args.device, repeats=args.repeats, gpu=args.gpu)
    except NotImplementedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out or f"{name}.{args.device}.profile.json")  # prof.device: GPU name
    prof.save(out)
    print(f"{name} on {args.device} ({prof.device}, {args.precision}): "
          f"{len(prof.kernels)} kernels, {prof.total_us:.1f} us in all -> {out}")
    return 0


def _tolerance(text: str) -> float:
    """argparse type of --rtol/--atol: a finite float >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from av_infer import __version__
    from av_infer.model.check import DEFAULT_ATOL, DEFAULT_RTOL

    p = argparse.ArgumentParser(prog="av-infer", description=__doc__)
    p.add_argument("--version", action="version", version=f"av-infer {__version__}")
    sub = p.add_subparsers(dest="command")

    models = sub.add_parser("models", help="the model zoo and the compiler")
    msub = models.add_subparsers(dest="models_command", required=True)
    m_list = msub.add_parser("list", help="list zoo models")
    m_list.set_defaults(func=cmd_models_list)

    def model_args(sp: argparse.ArgumentParser, many: bool) -> None:
        sp.add_argument("model", nargs="*" if many else None, metavar="NAME_OR_PATH")
        sp.add_argument("--variant", choices=["scaled", "full"], default="scaled",
                        help="zoo variant (default: scaled)")
        sp.add_argument("--input-shape", action="append", metavar="[NAME=]D0,D1,...",
                        help="bind dynamic dimensions; NAME= per input for multi-input models")

    m_check = msub.add_parser("check", help="compile, run on the CPU, compare with ONNX Runtime")
    model_args(m_check, many=True)
    m_check.add_argument("--all", action="store_true", help="every zoo model")
    m_check.add_argument("--json", metavar="OUT", help="write the report as JSON ('-': stdout)")
    m_check.add_argument("--rtol", type=_tolerance, default=DEFAULT_RTOL, metavar="R",
                         help="relative tolerance: ok iff |cpu - ort| <= atol + rtol * |ort| "
                              f"for every element (numpy.allclose; default {DEFAULT_RTOL:g})")
    m_check.add_argument("--atol", type=_tolerance, default=DEFAULT_ATOL, metavar="A",
                         help=f"absolute tolerance (default {DEFAULT_ATOL:g})")
    m_check.set_defaults(func=cmd_models_check)

    m_show = msub.add_parser("show", help="print the kernel table of the compiled plan")
    model_args(m_show, many=False)
    m_show.set_defaults(func=cmd_models_show)

    m_prof = msub.add_parser("profile", help="per-kernel durations and occupancy on a device "
                             "(for padding selection and the simulator)")
    model_args(m_prof, many=False)
    m_prof.add_argument("--device", choices=list(DEVICE_NAMES), default="cpu",
                        help="cuda-emu: the cuda device on the CPU emulator (docs/cuda_emu.md)")
    m_prof.add_argument("--gpu", default="mi50", help="simulated GPU (--device sim)")
    m_prof.add_argument("--repeats", type=int, default=5, help="runs per kernel (median)")
    m_prof.add_argument("--precision", choices=["fp32", "tf32", "fp16"], default="fp32",
                        help="the plan's precision (cuda, cuda-emu; cpu and sim: fp32 only; "
                        "%(default)s)")
    m_prof.add_argument("--out", metavar="FILE",
                        help="profile JSON (default NAME.DEVICE.profile.json)")
    m_prof.set_defaults(func=cmd_models_profile)

    from av_infer.bench.cli import add_bench_parser

    add_bench_parser(sub)
    from av_infer.pipeline.cli import add_pipeline_parser, add_profile_parser

    add_pipeline_parser(sub)
    add_profile_parser(sub)
    from av_infer.qos.cli import add_qos_parser

    add_qos_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; a bare ``av-infer`` prints the help (exit 0), like ``ros2``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:  # no subcommand given
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except AvInferError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
