#!/usr/bin/env python3
"""A/B the runtime's own cost per request against an older ``runtime.py``, in one process.

Why one process: on a shared, busy machine two processes run minutes apart see different
loads; here both runtimes load the same model on the same device kind and their rounds
alternate (base, new, new, base, ...), measured in the caller's thread CPU time. The base
module is loaded from a file beside the current package (it imports the same
``av_infer`` dependencies), so it must be a ``runtime.py`` that still imports against
today's tree, e.g. the one before the split of issue 31::

    git show eec1b4d^:av_infer/runtime.py > /tmp/runtime_base.py
    .venv/bin/python scripts/runtime_ab.py /tmp/runtime_base.py            # whole requests
    .venv/bin/python scripts/runtime_ab.py /tmp/runtime_base.py --front --device sim

``--front`` stubs the driver's post, so only the path up to the scheduler is timed (API,
options, registry look-up, validation, request and future).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from typing import Any

from av_infer.bench.peer import resolve_model
from av_infer.runtime import Runtime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="path of the older runtime.py")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="tiny_mlp")
    ap.add_argument("--front", action="store_true")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("runtime_base", args.base)
    base = importlib.util.module_from_spec(spec)
    sys.modules["runtime_base"] = base
    spec.loader.exec_module(base)
    m = resolve_model(args.model)
    rts: dict[str, Any] = {}
    for name, cls in (("base", base.Runtime), ("new", Runtime)):
        r = cls(args.device, max_be_streams=1)
        r.load_model("rt", m.source, m.shapes, pin=True)
        r.load_model("be", m.source, m.shapes)
        r.configure_client("rt", "RT", relative_deadline=1.0)
        if args.front:
            r._driver.post = lambda ev: None
        rts[name] = r

    def calls(r: Any) -> dict[str, Any]:
        if args.front:
            return {"submit_rt": lambda: r.submit("rt", m.inputs, client="rt"),
                    "submit_be": lambda: r.submit("be", m.inputs, client="be")}
        return {"infer_rt": lambda: r.infer("rt", m.inputs, client="rt"),
                "submit_be": lambda: r.submit("be", m.inputs, client="be").result()}

    fns = {n: calls(r) for n, r in rts.items()}
    for per in fns.values():
        for f in per.values():
            for _ in range(300):
                f()
    res: dict[tuple[str, str], list[float]] = {(n, k): [] for n in fns for k in fns[n]}
    for i in range(args.rounds):
        for n in ("base", "new") if i % 2 == 0 else ("new", "base"):
            for k, f in fns[n].items():
                t0 = time.thread_time()
                for _ in range(args.requests):
                    f()
                res[(n, k)].append((time.thread_time() - t0) / args.requests * 1e6)
    for (n, k), v in sorted(res.items(), key=lambda x: (x[0][1], x[0][0])):
        print(f"{k:10s} {n:5s} thread CPU us/request: min {min(v):7.2f} "
              f"median {statistics.median(v):7.2f}  rounds {[round(x, 1) for x in v]}")
    for r in rts.values():
        if args.front:
            del r._driver.post
        r.close(drain=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
