#!/usr/bin/env python3
"""The CPU peer matrix: av_infer against one ORT session per model with a thread per client.

Runs ``av-infer bench --peer ort`` for each (RT model, BE model, RT rate) pair with 2 and 4
closed-loop BE clients, writes ``out/peer/<pair>_be<N>.json`` and prints one markdown table
(the one in docs/cpu_engine.md). ``--table-only`` re-prints it from the JSON.

    .venv/bin/python scripts/peer_matrix.py                  # ~7 min on the 2-core VM
    .venv/bin/python scripts/peer_matrix.py --policy reef_dkp --out out/peer_dkp
    .venv/bin/python scripts/peer_matrix.py --policy reef_dkp --device-option kill=false \
        --device-option segment_ms=12 --out out/peer_park    # docs/cpu_engine.md "Kill or park"

Each run interleaves the systems in ``--rounds`` turns (``bench --peer``'s ``--rounds``); the
spread of the per-round BE ratios is in brackets beside the BE ratio.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from av_infer.bench.cli import parse_device_options
from av_infer.bench.peer import PeerConfig, fmt_num, run_peer

PAIRS = [  # (label, RT model, BE model, RT Hz)
    ("zoo", "resnet152", "vgg19", 20.0),
    ("cls_det", "ocr_cls", "ocr_det", 30.0),
    ("rec_det", "ocr_rec", "ocr_det", 10.0),
]


def table(docs: list[dict]) -> str:
    """The markdown table of docs/cpu_engine.md: ratios are av_infer / ORT threads;
    preemption from the scheduled arrival (from the submit call in brackets); the RT client's
    lateness p99 (scheduled arrival to its call) under av_infer (under ORT threads); the
    killed BE runs' ``kill_ms`` p99."""
    rows = ["| RT model @ Hz | BE model × clients | policy | RT p50 / p99 ms: av_infer | ORT "
            "threads | RT alone | BE req/s: av_infer | ORT threads | RT p99 ratio | BE ratio "
            "(rounds) | preemption p50 / p99 ms (p99 from submit) | RT lateness p99 ms "
            "(ORT threads) | kill p99 ms |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for d in docs:
        a, o, s, c = d["avi"], d["ort_threads"], d["ort_rt_alone"], d["config"]
        pre = a.get("preemption_ms") or {}
        sub = a.get("preemption_from_submit_ms") or {}
        rr = (d.get("ratios_range") or {}).get("be_rps")
        spread = "" if not rr else f" ({rr[0]:.2f}-{rr[1]:.2f})"
        rows.append(
            f"| {d['rt_model']} @ {c['rt_rate']:g} | {d['be_model']} × {c['be_clients']} | "
            f"{c['policy']}{_options(c)} | {fmt_num(a['rt_p50_ms'])} / {fmt_num(a['rt_p99_ms'])} | "
            f"{fmt_num(o['rt_p50_ms'])} / {fmt_num(o['rt_p99_ms'])} | "
            f"{fmt_num(s['rt_p50_ms'])} / {fmt_num(s['rt_p99_ms'])} | {a['be_rps']:.1f} | "
            f"{o['be_rps']:.1f} | {fmt_num(d['ratios']['rt_p99'])} | "
            f"{fmt_num(d['ratios']['be_rps'])}{spread} | {fmt_num(pre.get('p50'))} / "
            f"{fmt_num(pre.get('p99'))} ({fmt_num(sub.get('p99'))}) | "
            f"{fmt_num(a.get('rt_late_p99_ms'))} ({fmt_num(o.get('rt_late_p99_ms'))}) | "
            f"{fmt_num((a.get('kill_ms') or {}).get('p99'))} |")
    return "\n".join(rows)


def _options(cfg: dict) -> str:
    """The row's non-default cpu device options, as the policy column shows them."""
    opts = cfg.get("device_options") or {}
    return "".join(f" {k}={v}" for k, v in sorted(opts.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--policy", default="reef")
    ap.add_argument("--clients", default="2,4")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default="out/peer")
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--progress", action="store_true", help="progress bars (stderr)")
    ap.add_argument("--device-option", action="append", default=[], metavar="KEY=VALUE",
                    help="cpu device option for av_infer, as bench's (e.g. kill=false)")
    args = ap.parse_args()
    opts = parse_device_options(args.device_option)
    out = Path(args.out)
    docs = []
    for n in [int(v) for v in args.clients.split(",")]:
        for label, rt, be, hz in PAIRS:
            path = out / f"{label}_be{n}.json"
            if args.table_only:
                if path.exists():
                    docs.append(json.loads(path.read_text()))
                continue
            doc = run_peer(PeerConfig(rt_model=rt, be_model=be, rt_rate=hz, be_clients=n,
                                      policy=args.policy, duration=args.duration,
                                      device_options=opts, progress=args.progress,
                                      rounds=args.rounds))
            doc["command"] = (f"av-infer bench --peer ort --rt-model {rt} --be-model {be} "
                              f"--rt-rate {hz:g} --be-clients {n} --policy {args.policy} "
                              f"--duration {args.duration:g} --rounds {args.rounds}"
                              + "".join(f" --device-option {kv}" for kv in args.device_option))
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(doc, indent=2) + "\n")
            docs.append(doc)
            print(f"wrote {path}", flush=True)
    print(table(docs))


if __name__ == "__main__":
    main()
