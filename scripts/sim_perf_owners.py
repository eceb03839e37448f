"""Where a simulated DISB run's CPU goes, by compiled function (issue 31): ``perf`` samples of
``Bench.run_policy`` alone, each charged to the nearest compiled frame above it.

Why this attribution: the scheduler, the driver and the simulator are Cython; their
functions are C symbols ``perf`` sees, but most samples land in libpython (attribute
lookups, allocation, calls) on behalf of one of them. Each sample's stack (DWARF
unwinding, a few KiB are enough) is walked from the leaf up to the first frame in a
compiled av_infer module (``sim_core``, ``scheduler``, ``driver``, ``vhq``, ``request``,
``latency``, ``completion``, ...) or ``_heapq``, or the interpreter's eval loop ("Python
code": the benchmark harness, the runtime's Python, any interpreted module), and counted
there: its own time plus the C-API work it called. Samples whose stack was lost are
"(no owner)".

``python scripts/sim_perf_owners.py [--workload E] [--seconds 10] [--policy reef]
[--freq 400] [--top 40]`` (needs ``perf`` with access to its own process; start-up,
imports and the standalone runs are outside the recording: ``perf record --control``).
It profiles the checkout it is in (``PYTHONPATH`` set to it).
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: shared objects whose functions own the samples below them
OWNERS = ("sim_core.cpython", "scheduler.cpython", "driver.cpython", "vhq.cpython",
          "request.cpython", "latency.cpython", "completion.cpython", "cpu_lanes.cpython",
          "dkp_select.cpython", "edf_heap.cpython", "be_queues.cpython", "_heapq")


def child(workload: str, seconds: float, policy: str) -> None:
    """The profiled process: one run_policy between perf's enable and disable."""
    import time

    from av_infer.bench.harness import Bench, BenchConfig
    from av_infer.bench.workload import load_workload

    cfg = BenchConfig(device="sim", duration=seconds, gpu="h100", progress=False,
                      standalone_n=5, contention="none", dkp_placement="reserved",
                      be_min_share=0.1, timeline=False)
    bench = Bench(load_workload(workload), cfg)
    bench.standalone()

    def perf(cmd: str) -> None:
        with open(os.environ["SIM_PERF_CTL"], "w") as f:
            f.write(cmd + "\n")
        with open(os.environ["SIM_PERF_ACK"]) as f:
            f.read(5)

    perf("enable")
    c0 = time.process_time()
    run = bench.run_policy(policy)
    cpu = time.process_time() - c0
    perf("disable")
    k = run.device.get("kernels") or 1
    print(f"{workload} {policy} {seconds:g} virtual s: {cpu:.2f} s CPU, {k} completions, "
          f"{cpu / k * 1e6:.2f} us a completion (under perf)", flush=True)


def owners(data: str) -> tuple[int, collections.Counter]:
    out = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym,dso"],
                         capture_output=True, text=True, check=True).stdout
    cnt: collections.Counter = collections.Counter()
    total = 0
    for sample in out.split("\n\n"):
        lines = sample.strip().splitlines()
        if not lines:
            continue
        total += 1
        owner = None
        for line in lines:
            parts = line.split(None, 1)
            if len(parts) < 2:
                continue
            sym = parts[1].split(" (")[0].split("+0x")[0]
            if any(m in parts[1] for m in OWNERS):
                owner = sym
                break
            if "_PyEval_EvalFrameDefault" in sym:
                owner = "(Python code)"
                break
        cnt[owner or "(no owner)"] += 1
    return total, cnt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="E")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--policy", default="reef")
    ap.add_argument("--freq", type=int, default=400)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a.workload, a.seconds, a.policy)
        return 0
    with tempfile.TemporaryDirectory() as d:
        ctl, ack, data = (str(Path(d) / n) for n in ("ctl", "ack", "perf.data"))
        os.mkfifo(ctl)
        os.mkfifo(ack)
        root = str(Path(__file__).resolve().parents[1])  # profile this checkout
        env = dict(os.environ, SIM_PERF_CTL=ctl, SIM_PERF_ACK=ack,
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        subprocess.run(["perf", "record", "-q", "-F", str(a.freq), "--call-graph",
                        "dwarf,4096", "-D", "-1", f"--control=fifo:{ctl},{ack}", "-o", data,
                        sys.executable, str(Path(__file__).resolve()), "--child",
                        "--workload", a.workload, "--seconds", str(a.seconds),
                        "--policy", a.policy], env=env, check=True)
        total, cnt = owners(data)
    print(f"{total} samples, by owner (own time + the C-API work it called):")
    for name, n in cnt.most_common(a.top):
        print(f"{100 * n / total:6.2f} %  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
