#!/usr/bin/env python3
"""av_infer's own instructions per request, counted by callgrind (docs/request_path.md,
"av_infer's own instructions per request").

Wall time and even thread CPU swing ±20 % on the shared 2-core VM; instruction counts do
not. This script is the loop the counts are taken over: tiny_mlp loaded twice into
``Runtime("cpu", max_be_streams=1)`` ("rt" pinned, client "rt" configured RT with a 1 s
relative deadline; "be"), warmed up, then ``N`` requests of one kind:

* ``rt``: ``r.infer("rt", m.inputs, client="rt")`` (RT; the caller runs its own launch,
  so the main thread's count is the whole request)
* ``be``: ``r.submit("be", m.inputs, client="be").result()`` (BE)
* ``bare``: ``InferenceSession.run`` of the same file, one intra-op thread (the oracle)

Counted as (N = 100 and N = 1100; per request = difference / 1000, which cancels start-up
and warm-up)::

    valgrind --tool=callgrind --trace-children=yes --separate-threads=yes \\
        --callgrind-out-file=/tmp/cg.%p .venv/bin/python scripts/request_instructions.py rt 100
    # the main thread's file (/tmp/cg.PID-01) "summary:" line

``--count`` runs both sizes under valgrind itself and prints the per-request figure.
``--calls`` instead counts Python and C calls per request on the main thread with
``sys.setprofile`` (no valgrind; the same two sizes, the difference / 1000).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from functools import reduce

MODES = ("rt", "be", "bare", "noop")


def _step(one, _i):  # noqa: ANN001, ANN202 - reduce's step: one request
    one()
    return one


def _loop(mode: str, n: int, profile_calls: bool = False) -> dict[str, float]:
    """Set up, warm up, run ``n`` requests of ``mode``; with ``profile_calls`` the calls
    made during the ``n`` requests, by kind."""
    from av_infer.bench.peer import resolve_model

    m = resolve_model("tiny_mlp")
    inputs = m.inputs
    close = None
    if mode == "noop":  # the loop alone (what --count subtracts)
        def one() -> None:
            return None
    elif mode == "bare":
        from av_infer.bench.peer import _ort_session

        sess = _ort_session(m.source, 1)

        def one() -> None:
            sess.run(None, inputs)
    else:
        from av_infer import Runtime

        r = Runtime("cpu", max_be_streams=1)
        r.load_model("rt", m.source, m.shapes, pin=True)
        r.load_model("be", m.source, m.shapes)
        r.configure_client("rt", "RT", relative_deadline=1.0)
        if mode == "rt":
            def one() -> None:
                r.infer("rt", inputs, client="rt")
        else:
            def one() -> None:
                r.submit("be", inputs, client="be").result()
        close = r.close
    for _ in range(50):
        one()
    counts: dict[str, float] = {"python": 0, "c": 0}
    if profile_calls:
        def prof(frame, event, arg) -> None:  # noqa: ANN001
            if event == "call":
                counts["python"] += 1
                co = frame.f_code
                key = f"py {os.path.basename(co.co_filename)}:{co.co_firstlineno} {co.co_qualname}"
            elif event == "c_call":
                counts["c"] += 1
                key = f"c {getattr(arg, '__qualname__', repr(arg))}"
            else:
                return
            counts[key] = counts.get(key, 0) + 1

        sys.setprofile(prof)  # this (the main) thread only
    # the measured loop runs inside functools.reduce, a C function nothing else on this
    # path calls: callgrind's --toggle-collect=functools_reduce counts exactly this loop
    reduce(_step, range(n), one)
    if profile_calls:
        sys.setprofile(None)
    if close is not None:
        close()
    return counts


def _callgrind(mode: str, n: int) -> dict[str, int]:
    """Instructions of the measured loop (``functools.reduce``, see ``_loop``) of ``n``
    requests, per thread (thread 1: the main thread)."""
    with tempfile.TemporaryDirectory() as d:
        cmd = ["valgrind", "--tool=callgrind", "--trace-children=yes",
               "--separate-threads=yes", "--collect-atstart=no",
               "--toggle-collect=functools_reduce", f"--callgrind-out-file={d}/cg.%p",
               sys.executable, os.path.abspath(__file__), mode, str(n)]
        for attempt in range(1, 6):
            for stale in glob.glob(f"{d}/cg.*"):  # a failed try's files
                os.remove(stale)
            # valgrind 3.19 can die of SIGBUS while ORT builds its sessions ("brk segment
            # overflow": the process's heap outgrew valgrind's brk segment; two ORT copies
            # are loaded since the C API path). It depends on where the heap was placed,
            # not on the code counted: run again, and say so
            r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode == 0:
                break
            print(f"valgrind exited {r.returncode} (try {attempt}); running it again",
                  file=sys.stderr)
        else:
            # where it placed the heap depends on the loaded libraries' sizes: with the
            # extensions built with -g0 (the default since 2026-11-27) it overflowed every
            # time on this VM; with debug information (same machine code) it did not
            print("valgrind kept dying (brk segment overflow?): count in a build with "
                  "debug information, e.g. a worktree built with AV_INFER_CFLAGS='-O3 -g' "
                  "python setup.py build_ext --inplace", file=sys.stderr)
            raise subprocess.CalledProcessError(r.returncode, cmd)
        out = {}
        for path in sorted(glob.glob(f"{d}/cg.*-*")):
            with open(path) as f:
                for line in f:
                    if line.startswith("summary:"):
                        out[path.rsplit("-", 1)[1]] = int(line.split()[1])
                        break
    return out


def _count(mode: str, n: int) -> dict[str, float]:
    """Main-thread instructions per request of ``mode`` less the loop's own (``noop``)."""
    loop = _callgrind("noop", n)
    got = _callgrind(mode, n)
    main, base = got.get("01", 0), loop.get("01", 0)
    return {"mode": mode, "n": n, "main_thread": main, "loop_alone": base,
            "other_threads": sum(v for k, v in got.items() if k != "01"),
            "per_request": (main - base) / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=MODES)
    ap.add_argument("n", nargs="?", type=int, default=100)
    ap.add_argument("--count", action="store_true",
                    help="run the loop of N requests under callgrind (and the loop alone), "
                         "print the main thread's instructions per request")
    ap.add_argument("--calls", action="store_true",
                    help="Python and C calls per request (sys.setprofile), no valgrind")
    ap.add_argument("--by-function", action="store_true",
                    help="with --calls: the calls per request of each function")
    a = ap.parse_args()
    if a.count:
        print(json.dumps(_count(a.mode, a.n)))
    elif a.calls:
        small = _loop(a.mode, 100, True)
        large = _loop(a.mode, 1100, True)
        per = {k: (large[k] - small.get(k, 0)) / 1000 for k in large}
        out = {"mode": a.mode, "python": per.pop("python"), "c": per.pop("c")}
        if a.by_function:
            out["calls"] = {k: v for k, v in sorted(per.items(), key=lambda kv: -kv[1])
                            if v >= 0.01}
        print(json.dumps(out, indent=1 if a.by_function else None))
    else:
        _loop(a.mode, a.n)


if __name__ == "__main__":
    main()
