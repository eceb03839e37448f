"""Per-request cost of ``Runtime.submit(...).result()`` with and without ``run_here``, beside
``Runtime.infer`` and the bare ``InferenceSession.run`` of the same model file (the user's
alternative), in alternating rounds in one process (docs/request_path.md, "submit(...,
run_here=True)").

    .venv/bin/python scripts/submit_run_here.py [--model tiny_mlp] [--rounds 5] [--n 2000]

Prints, per round and way, the wall time and the process CPU time per request (µs): every
round, not the best. The runtime is ``Runtime("cpu", max_be_streams=1)`` with BE lanes not
niced (``be_nice=0``: a niced lane is helped only where the thread may take its priority
back); the client is BE; ORT runs with one intra-op thread like the lane.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny_mlp")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=2000, help="requests per round and way")
    ap.add_argument("--json", default=None, help="write every round here ('-': stdout)")
    args = ap.parse_args(argv)

    import onnxruntime as ort

    from av_infer import Runtime
    from av_infer.model import zoo

    path = str(zoo.path(args.model))
    x = zoo.sample_inputs(args.model)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    rt = Runtime("cpu", max_be_streams=1, device_options={"be_nice": 0})
    rt.load_model("m", path)
    ways = {
        "submit().result()": lambda: rt.submit("m", x, client="be").result(),
        "submit(run_here=True).result()":
            lambda: rt.submit("m", x, client="be", run_here=True).result(),
        "infer()": lambda: rt.infer("m", x, client="be"),
        "bare ORT run": lambda: sess.run(None, x),
    }
    for fn in ways.values():  # warm-up
        for _ in range(200):
            fn()
    runs: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
    try:
        for _ in range(args.rounds):
            for way, fn in ways.items():
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(args.n):
                    fn()
                runs[way].append(((time.perf_counter() - t0) / args.n * 1e6,
                                  (time.process_time() - c0) / args.n * 1e6))
    finally:
        rt.close()
    for way, r in runs.items():
        print(f"{way:32s} wall us {' / '.join(f'{a:.0f}' for a, _ in r):40s} "
              f"process CPU us {' / '.join(f'{b:.0f}' for _, b in r)}")
    if args.json:
        doc = json.dumps({"model": args.model, "n": args.n, "rounds": runs}, indent=1)
        if args.json == "-":
            print(doc)
        else:
            with open(args.json, "w") as f:
                f.write(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
