"""DISB E end to end in the simulator, this tree against another checkout (issue 31).

Why a script of its own: the base the issue names (``439ab05``) predates ``sim_speed`` and
most ``BenchConfig`` options, so both trees run the one configuration both have: DISB E on
a simulated h100, contention ``none``, padded blocks on reserved SMs
(what 439ab05's simulator always does), BE minimum share 0.1 (439ab05's runtime
default), ``standalone_n`` 5, no timeline. Each run is a
fresh process (``PYTHONPATH`` at its tree, the interpreter of this venv), the trees
alternate, and every run is printed: wall and process CPU of ``Bench.run_policy`` alone
(start-up, imports and the standalone runs excluded), requests, kernels, and a digest of
the request end times (the same digest: the same timeline).

``python scripts/sim_e2e_ab.py --base /path/to/worktree [--seconds 10] [--rounds 3]
[--policies streams,reef] [--json OUT]``

(``--one TREE POLICY SECONDS``: the child, one run, one JSON line.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def one(policy: str, seconds: float) -> dict:
    import hashlib
    import time

    from av_infer.bench.harness import Bench, BenchConfig
    from av_infer.bench.workload import load_workload

    kw = dict(device="sim", duration=seconds, gpu="h100", progress=False, standalone_n=5,
              timeline=False)
    fields = getattr(BenchConfig, "__dataclass_fields__", {})
    if "contention" in fields:  # later trees: what 439ab05's simulator always does
        kw.update(contention="none", dkp_placement="reserved", be_min_share=0.1)
    bench = Bench(load_workload("E"), BenchConfig(**kw))
    bench.standalone()
    t0, c0 = time.perf_counter(), time.process_time()
    run = bench.run_policy(policy)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ends = repr(sorted(round(r.end, 9) for r in run.records if r.ok))
    dev = getattr(run, "device", None) or {}
    return {"policy": policy, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "requests": len(run.records), "kernels": dev.get("kernels"),
            "digest": hashlib.sha1(ends.encode()).hexdigest()[:12]}


def child(tree: str, policy: str, seconds: float) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    env.pop("AV_INFER_INTERPRETED", None)
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", tree,
                          policy, str(seconds)], env=env, cwd=tree, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", nargs=3, metavar=("TREE", "POLICY", "SECONDS"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--base", help="the other checkout (e.g. a git worktree of 439ab05)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--policies", default="streams,reef")
    ap.add_argument("--json", help="write every run to this file")
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.one[1], float(a.one[2]))))
        return 0
    if not a.base:
        ap.error("--base is required")
    trees = {"base": str(Path(a.base).resolve()), "this": str(HERE)}
    runs = []
    for r in range(a.rounds):
        for p in [p for p in a.policies.split(",") if p]:
            order = ("base", "this") if r % 2 == 0 else ("this", "base")
            for name in order:
                res = child(trees[name], p, a.seconds) | {"tree": name, "round": r}
                runs.append(res)
                print(f"round {r} {p:<8} {name:<4} wall {res['wall_s']:8.3f} s  cpu "
                      f"{res['cpu_s']:8.3f} s  {res['requests']} requests  "
                      f"{res['kernels']} kernels  digest {res['digest']}", flush=True)
    for p in [p for p in a.policies.split(",") if p]:
        def med(name: str, key: str, p: str = p) -> float:
            return statistics.median(x[key] for x in runs
                                     if x["tree"] == name and x["policy"] == p)
        print(f"{p}: median wall {med('base', 'wall_s'):.3f} -> {med('this', 'wall_s'):.3f} s "
              f"({med('base', 'wall_s') / med('this', 'wall_s'):.2f}x), cpu "
              f"{med('base', 'cpu_s'):.3f} -> {med('this', 'cpu_s'):.3f} s "
              f"({med('base', 'cpu_s') / med('this', 'cpu_s'):.2f}x)")
    if a.json:
        Path(a.json).write_text(json.dumps({"base": trees["base"], "this": trees["this"],
                                            "seconds": a.seconds, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
