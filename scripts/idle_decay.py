#!/usr/bin/env python3
"""What time away costs a tiny piece of Python on this host: a 50-element list comprehension
timed right after ``time.sleep(gap)``, for gaps of 0, 0.5, 2 and 10 ms (p50 and p90 of 300).

On a VM whose cores are shared with other work (other processes here, other guests on the
host), what a thread touched is evicted while it sleeps; the next frame's code runs from cold
caches. A camera pipeline runs once per frame, so its per-frame cost on such a host scales
with how much code and data it touches, not only with its instruction count (docs/ros.md,
"Why the ROS path costs more here between frames").

    .venv/bin/python scripts/idle_decay.py [--json -]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def measure(gap: float, n: int = 300) -> tuple[float, float]:
    """p50/p90 in µs of the list comprehension after sleeping ``gap`` seconds."""
    ts = []
    for _ in range(n):
        if gap:
            time.sleep(gap)
        t1 = time.perf_counter()
        _ = [j for j in range(50)]
        ts.append((time.perf_counter() - t1) * 1e6)
    return float(np.percentile(ts, 50)), float(np.percentile(ts, 90))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the rows as JSON ('-': stdout)")
    args = ap.parse_args()
    rows = []
    for gap_ms in (0.0, 0.5, 2.0, 10.0):
        p50, p90 = measure(gap_ms * 1e-3)
        rows.append({"gap_ms": gap_ms, "p50_us": round(p50, 2), "p90_us": round(p90, 2)})
    doc = {"rows": rows, "load_average": os.getloadavg()[0]}
    if args.json == "-":
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    for r in rows:
        print(f"after {r['gap_ms']:>4g} ms away: p50 {r['p50_us']:6.1f} us, "
              f"p90 {r['p90_us']:6.1f} us")
    print(f"(load average {doc['load_average']:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
