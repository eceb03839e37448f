"""``av-infer qos train|eval``: paper 001's learned policy and its evaluation.

    av-infer qos train [--episodes 100] [--seed 0] [--out av_infer/qos/data/qos_rl_default.json]
    av-infer qos eval [--trace FILE_MS] [--device sim|cpu] [--seed 1] [--json -] [--plot PNG]

``train`` runs on the simulator only (virtual time is what makes training fast and exactly
reproducible from ``--seed``); ``eval`` runs fixed, heuristic (eq. 2) and rl (the policy
file, default the committed one) on one trace and prints the paper's Table 2/3 shape.
JSON: ``schedulers.{fixed,heuristic,rl}.{mean_utility, sd_utility, p_fast, misses, drops,
windows}`` plus ``workload`` (deadlines, rates, the latency table).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from av_infer.errors import InvalidParameterError


def _workload(args: argparse.Namespace) -> Any:
    from av_infer.qos.evaluate import Workload

    kw: dict[str, Any] = {"device": args.device}
    if args.device == "cpu":  # the scaled models at their own size; a day of ~12 s
        kw.update(size=64, hour_s=1.0)
    if args.hour_s is not None:
        kw["hour_s"] = args.hour_s
    if args.load is not None:
        kw["load"] = args.load
    if args.gpu and args.device == "sim":
        kw["device_options"] = {"gpu": args.gpu}
    return Workload(**kw)


def _emit(res: dict[str, Any], dest: str | None) -> None:
    if dest is None:
        return
    text = json.dumps(res, indent=2, default=float)
    if dest == "-":
        print(text)
    else:
        Path(dest).write_text(text + "\n")


def cmd_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from av_infer.qos.policy import DEFAULT_POLICY
    from av_infer.qos.train import TrainConfig, train

    if args.device != "sim":
        raise InvalidParameterError("qos train runs on the simulator only (--device sim)")
    cfg = TrainConfig(episodes=args.episodes, seed=args.seed)
    bar = tqdm(total=cfg.episodes, desc="qos train", unit="ep", file=sys.stderr,
               disable=args.quiet)

    def step(ep: int, info: dict[str, Any]) -> None:
        bar.update(1)
        bar.set_postfix(phase=info["phase"], mean_q=f"{info['mean_utility']:.3f}")

    net = train(_workload(args), cfg, step)
    bar.close()
    out = Path(args.out or DEFAULT_POLICY)
    net.save(out)
    print(f"wrote {out} ({out.stat().st_size} bytes, {cfg.episodes} episodes, seed {cfg.seed},"
          f" {net.meta['train_wall_s']} s)", file=sys.stderr)
    _emit({"policy": str(out), **net.meta}, args.json)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from av_infer.qos.evaluate import SCHEDULERS, evaluate, format_table, load_trace
    from av_infer.qos.policy import load_policy

    w = _workload(args)
    trace = load_trace(args.trace) if args.trace else None
    policy = load_policy(args.policy)  # a bad file fails here, before any run
    bar = tqdm(total=len(SCHEDULERS), desc="qos eval", unit="scheduler", file=sys.stderr,
               disable=args.quiet)
    res = evaluate(w, seed=args.seed, trace=trace, policy=policy,
                   on_progress=lambda name: (bar.update(1), bar.set_postfix(done=name)))
    bar.close()
    wl = res["workload"]
    head = (f"device={res['device']} requests={wl['requests']} soft={wl['soft_deadline_ms']:.3f}"
            f" ms hard={wl['hard_deadline_ms']:.3f} ms peak={wl['peak_rate_rps']:.0f} req/s")
    print(head + "\n" + format_table(res), file=sys.stderr if args.json == "-" else sys.stdout)
    _emit(res, args.json)
    if args.plot:
        plot(res, args.plot)
    return 0


def plot(res: dict[str, Any], path: str) -> None:
    """Mean quality per window and scheduler (the paper's Table 2 as bars) and P_fast."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = res["schedulers"]
    wins = list(next(iter(rows.values())).get("windows") or {}) or ["all"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(wins))
    wd = 0.8 / max(1, len(rows))
    for i, (name, r) in enumerate(rows.items()):
        cells = [r["windows"][c] for c in wins] if r.get("windows") else [r]
        a1.bar(x + i * wd, [c["mean_utility"] for c in cells], wd, label=name,
               yerr=[c["sd_utility"] for c in cells], capsize=2)
        a2.bar(x + i * wd, [100 * (c["p_fast"] or 0) for c in cells], wd, label=name)
    for a, t in ((a1, "mean (SD) quality κ·V"), (a2, "P_fast %")):
        a.set_xticks(x + wd * (len(rows) - 1) / 2, wins)
        a.set_title(t)
        a.legend()
    a1.set_ylim(0, 1.05)
    a2.set_ylim(0, max(5.0, a2.get_ylim()[1]))
    fig.suptitle(f"av-infer qos eval ({res['device']}, {res['workload']['requests']} requests)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_qos_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``qos`` on the ``av-infer`` sub-command parser."""
    p = subparsers.add_parser("qos", help="QoS-aware scheduling (paper 001): train, eval",
                              description=__doc__)
    sub = p.add_subparsers(dest="qos_command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--device", choices=("sim", "cpu"), default="sim")
        sp.add_argument("--gpu", default=None, help="simulated GPU (sim; default mi50)")
        sp.add_argument("--hour-s", type=float, default=None,
                        help="device seconds per trace hour (sim 0.25, cpu 1.0)")
        sp.add_argument("--load", type=float, default=None,
                        help="peak rate / the full variant's batch-32 throughput (0.85)")
        sp.add_argument("--json", metavar="OUT", help="JSON result ('-': stdout)")
        sp.add_argument("--quiet", action="store_true", help="no progress bar")

    t = sub.add_parser("train", help="train the policy by REINFORCE on the simulator")
    common(t)
    t.add_argument("--episodes", type=int, default=100)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", help="policy file (default: the committed one)")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="fixed vs heuristic vs rl on an arrival trace")
    common(e)
    e.add_argument("--trace", help="arrival offsets in ms, one per line (default: a diurnal "
                   "trace generated from --seed)")
    e.add_argument("--seed", type=int, default=1)
    e.add_argument("--policy", help="policy file (default: the committed one)")
    e.add_argument("--plot", metavar="PNG", help="bar chart of quality and P_fast")
    e.set_defaults(func=cmd_eval)
    return p
