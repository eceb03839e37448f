"""Instructions the simulator's completion entry costs, per kernel completion (callgrind).

``python scripts/completion_instructions.py [POLICY] [VIRTUAL_SECONDS]`` (default reef 0.5)

Runs ``Bench.run_policy(POLICY)`` in ``sim_speed --completion-cost``'s configuration (DISB
E, h100, contention none, reserved placement, ``be_min_share`` 0.1, the standalone runs
first) under ``valgrind --tool=callgrind`` collecting only inside ``Driver.complete`` (the
devices' completion entry: the driver, the scheduler's handling and decision, the device
calls and the answers it makes, the listeners it calls), and divides by the calls of that
entry, counted in a second, uninstrumented run of the same deterministic simulation.
Instruction counts do not move with the machine's load, where ``--completion-cost``'s
CPU times do (docs/request_path.md, "Policy and statistics compiled"). Prints one JSON
line; the callgrind file it names can be read with ``callgrind_annotate --tree=calling``.
Needs valgrind and the compiled extensions (the toggle names the compiled entry).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

TOGGLE = "__pyx_pw_8av_infer_5sched_6driver_6Driver_5complete"


def _run(policy: str, seconds: float) -> None:
    from av_infer.bench.harness import Bench, BenchConfig
    from av_infer.bench.workload import load_workload
    from av_infer.devices.sim import SimDevice

    n = [0]
    if os.environ.get("_COUNT_COMPLETIONS"):  # every call, the standalone runs' included
        start = SimDevice.start

        def counted(dev: SimDevice, cb: object) -> None:
            def f(c: object) -> None:
                n[0] += 1
                cb(c)  # type: ignore[operator]

            start(dev, f)

        SimDevice.start = counted  # type: ignore[method-assign]
    cfg = BenchConfig(device="sim", duration=seconds, gpu="h100", progress=False,
                      standalone_n=5, contention="none", dkp_placement="reserved",
                      be_min_share=0.1, timeline=False)
    bench = Bench(load_workload("E"), cfg)
    bench.standalone()
    bench.run_policy(policy)
    print("completions", n[0])


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "--run":
        _run(args[1], float(args[2]))
        return
    policy = args[0] if args else "reef"
    seconds = float(args[1]) if len(args) > 1 else 0.5
    me = [sys.executable, __file__, "--run", policy, str(seconds)]
    out = subprocess.run(me, env={**os.environ, "_COUNT_COMPLETIONS": "1"},
                         capture_output=True, text=True, check=True).stdout
    n = int(re.search(r"completions (\d+)", out).group(1))  # type: ignore[union-attr]
    d = tempfile.mkdtemp()
    cg = f"{d}/callgrind.out"
    subprocess.run(["valgrind", "--tool=callgrind", f"--toggle-collect={TOGGLE}",
                    f"--callgrind-out-file={cg}", *me], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    total = 0
    with open(cg) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
    print(json.dumps({"policy": policy, "virtual_s": seconds, "completions": n,
                      "instructions": total, "per_completion": round(total / n, 1),
                      "callgrind_file": cg}))


if __name__ == "__main__":
    main()
