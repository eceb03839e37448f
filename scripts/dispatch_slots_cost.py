"""Cost of one task's register + unregister in the CUDA dispatcher's task table, at first and
after many tasks came and went (issue 16, defect 2: a tombstone table degraded from 0.33 µs
to 22.8 µs after 60k tasks, under the lock the nogil launch loop takes on every launch and
completion). Runs on the CPU emulator's driver: the table is host code either way.

    .venv/bin/python scripts/dispatch_slots_cost.py            # prints JSON
    .venv/bin/python scripts/dispatch_slots_cost.py --cycles 100000 --live 8

``--module`` measures another build of the dispatcher (e.g. one of an older commit built
out of tree) with the same loop; it must define ``Dispatcher``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time

from av_infer.devices.cuda_emu.driver import build_driver

GEOM = b"\0" * 28  # one kernel: 7 uint32 geometry words


def _batch_us(disp, first_id: int, n: int) -> float:
    """Mean µs of one register + unregister over ``n`` fresh task ids."""
    clock = time.perf_counter
    t0 = clock()
    for t in range(first_id, first_id + n):
        disp.register_task(t, [0], GEOM, b"\0" * 64, [0])
        disp.unregister_task(t)
    return (clock() - t0) / n * 1e6


def main(cycles: int = 100_000, live: int = 8, batch: int = 1000, repeats: int = 5,
         module: str = "av_infer._cy.cuda_dispatch") -> dict:
    mod = importlib.import_module(module)
    disp = mod.Dispatcher(str(build_driver()))
    for t in range(live):  # resident tasks that stay registered throughout
        disp.register_task(1 << 40 | t, [0], GEOM, b"\0" * 64, [0])
    next_id = 0
    first = []
    for _ in range(repeats):
        first.append(_batch_us(disp, next_id, batch))
        next_id += batch
    while next_id < cycles:
        n = min(10_000, cycles - next_id)
        _batch_us(disp, next_id, n)
        next_id += n
    after = []
    for _ in range(repeats):
        after.append(_batch_us(disp, next_id, batch))
        next_id += batch
    stats = disp.table_stats() if hasattr(disp, "table_stats") else None
    return {"module": module, "live_tasks": live, "cycles": next_id,
            "register_unregister_us_first": round(statistics.median(first), 3),
            "register_unregister_us_after": round(statistics.median(after), 3),
            "table": stats}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=100_000)
    ap.add_argument("--live", type=int, default=8)
    ap.add_argument("--module", default="av_infer._cy.cuda_dispatch")
    a = ap.parse_args()
    print(json.dumps(main(a.cycles, a.live, module=a.module), indent=1))
