#!/usr/bin/env python3
"""Where av_infer's own cost per request goes, step by step (issue 31, "measure first").

Two measurements of the same requests, repeatable on any machine:

1. **Overhead, unprofiled**: wall time per request of ``Runtime.infer`` (RT, caller's
   thread), ``submit(...).result()`` (BE) and the bare ``InferenceSession.run`` of the same
   model file, one intra-op thread, rounds interleaved; overhead = av_infer - bare.
2. **Attribution, profiled**: the same loop under ``cProfile``; each function's own time
   (``tottime``) is assigned to one step of the request path (``STEPS`` below: validation,
   request objects, driver, scheduler decision, device enqueue, lane, engine, completion,
   answer, futures and locks); each step's share of the profiled non-engine time is then
   applied to the unprofiled overhead. cProfile inflates every Python call by a similar
   constant, so shares are a fair split of a cost that is almost all Python calls; the
   absolute step figures are estimates, the overhead total is measured.

    .venv/bin/python scripts/request_breakdown.py                       # tiny_mlp
    .venv/bin/python scripts/request_breakdown.py --model densenet201 --json -

A function the table does not know lands in "other" and is listed, so the mapping can be
kept up to date as the code moves (docs/request_path.md keeps the figures). cProfile sees
Python frames and the C functions they call directly: the compiled modules' work (the
scheduler, the driver, the requests; av_infer/_cy/compiled.py) lands in the own time of
the Python function that called into them, and the lanes' ORT call, made through a C
partial, is made visible while profiling (``_visible_engine``). For a count that does not
depend on what is compiled, use scripts/request_instructions.py (callgrind).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from av_infer import Runtime
from av_infer.bench.peer import _ort_session, resolve_model
from av_infer.bench.report import emit_json, human_stream

#: step -> (file suffix, function name) patterns; a function name "*" takes the whole file
STEPS: dict[str, list[tuple[str, str]]] = {
    "validate inputs": [("runtime.py", "_validate_inputs"), ("runtime.py", "_number"),
                        ("request.py", "parse"), ("inputs.py", "*")],
    "request objects": [("runtime.py", "_make_request"), ("request.py", "*"),
                        ("<string>", "__init__"), ("driver.py", "__init__"),
                        ("runtime.py", "_submit"), ("runtime.py", "submit"),
                        ("runtime.py", "infer"), ("runtime.py", "_find"),
                        ("runtime.py", "_entry"), ("<built-in method _thread.get_ident>", ""),
                        ("registry.py", "*"), ("request_options.py", "*"), ("runtime.py", "*")],
    "driver (event queue)": [("driver.py", "post"), ("driver.py", "step"),
                             ("driver.py", "holds"), ("scheduler.py", "post"),
                             ("scheduler.py", "_handle"), ("scheduler.py", "next_timer")],
    "scheduler decision": [("scheduler.py", "*"), ("queues.py", "*"), ("policies.py", "*"),
                           ("rt_forecast.py", "*"), ("model_services.py", "*"),
                           ("cache.py", "*"), ("enum.py", "*"),
                           ("<built-in method builtins.len>", ""),
                           ("<built-in method builtins.max>", ""),
                           ("<built-in method builtins.min>", ""),
                           ("<built-in method builtins.isinstance>", "")],
    "device enqueue": [("cpu.py", "new_task"), ("cpu.py", "write_inputs"),
                       ("cpu.py", "enqueue"), ("cpu.py", "_transmit"), ("cpu.py", "_exact"),
                       ("cpu.py", "_signal"), ("vhq", ""),
                       ("<method 'copy' of 'numpy.ndarray'", "")],
    "lane (caller runs)": [("cpu_lanes.py", "*"), ("cpu.py", "run_pending"), ("cpu.py", "_drain"),
                           ("cpu.py", "_drain_loop"), ("os_priority.py", "*"),
                           ("runtime.py", "_help"), ("runtime.py", "done"),
                           ("cpu.py", "_worth_killing"), ("cpu.py", "_cpu_time"),
                           ("<built-in method time.clock_gettime>", ""),
                           ("<built-in method time.perf_counter>", ""),
                           ("<built-in method _thread.get_native_id>", "")],
    "engine (ORT)": [("run_with_iobinding", ""), ("<method 'run' of", ""),
                     ("request_breakdown.py", "_engine_call"),
                     ("ort_segments.py", "*"), ("segments.py", "*")],
    "completion": [("completion.py", "*"), ("cpu.py", "read_outputs"),
                   ("cpu.py", "release_task"),
                   ("cpu.py", "*"), ("stats.py", "*"), ("base.py", "*")],
    "answer (future)": [("_base.py", "*"), ("threading.py", "*"),
                        ("driver.py", "*"), ("<method 'acquire'", ""),
                        ("<method 'release'", ""), ("<method '__exit__'", ""),
                        ("<method '__enter__'", ""), ("runtime.py", "_on_complete"),
                        ("runtime.py", "_post")],
}
ORDER = list(STEPS)


def _step_of(path: str, fn: str) -> str | None:
    for step, pats in STEPS.items():
        for suffix, name in pats:
            if not name:  # a built-in: matched on its description
                if suffix in fn or suffix in path:
                    return step
            elif path.endswith(suffix) and (name == "*" or name == fn):
                return step
    return None


def _attribute(prof: cProfile.Profile, n: int) -> tuple[dict[str, float], dict[str, float]]:
    """Microseconds of own time per request per step (profiled), and the unknown ones."""
    st = pstats.Stats(prof)
    steps = dict.fromkeys(ORDER, 0.0)
    other: dict[str, float] = {}
    # two passes: exact (file, function) patterns before a file's "*"
    for (path, _line, fn), (_cc, _nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        us = tt / n * 1e6
        step = None
        for s, pats in STEPS.items():
            if any(name not in ("", "*") and path.endswith(suffix) and name == fn
                   for suffix, name in pats):
                step = s
                break
        if step is None:
            step = _step_of(path, fn)
        if step is None:
            key = f"{path.rsplit('/', 1)[-1]}:{fn}"
            other[key] = other.get(key, 0.0) + us
        else:
            steps[step] += us
    return steps, other


def _visible_engine(on: bool) -> int:
    """Make the cpu lanes' ORT calls visible to cProfile (``on``) or put them back.

    A lane calls each segment through a ``functools.partial`` over ORT's pybind
    ``run_with_iobinding`` (no Python frame of ours in between, devices/cpu.py): cProfile
    records no C call for it, so the run's whole time would land in the lane's own time
    and the split would charge the model to the lane. While profiling, each bound task's
    partial is swapped for a small Python function making the same call (``_engine_call``,
    counted as the engine, with the C call it makes); the unprofiled rounds run the real
    path. Returns how many launches were swapped."""
    import gc

    from av_infer.devices import cpu as cpu_mod

    n = 0
    for b in (o for o in gc.get_objects() if type(o) is cpu_mod._Bound):
        if on:
            b.__dict__.setdefault("_real_fns", list(b.fns))
            b.fns[:] = [_engine_call_of(f) for f in b._real_fns]
        elif "_real_fns" in b.__dict__:
            b.fns[:] = b.__dict__.pop("_real_fns")
        n += len(b.fns)
    return n


def _engine_call_of(f: Any) -> Callable[..., Any]:
    func, args = getattr(f, "func", None), getattr(f, "args", ())
    if func is None or len(args) != 1:  # not a partial over the pybind call: leave it
        return f
    io = args[0]

    def _engine_call(ro: Any = None) -> Any:
        return func(io, ro) if ro is not None else func(io)

    return _engine_call


def _per_call(fn: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny_mlp")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the figures here ('-': stdout)")
    args = ap.parse_args()
    out = human_stream(args.json)
    m = resolve_model(args.model)
    sess = _ort_session(m.source, 1)
    doc: dict[str, Any] = {"config": vars(args), "python": sys.version.split()[0]}
    with Runtime("cpu", max_be_streams=1) as r:
        r.load_model("be", m.source, m.shapes)
        r.load_model("rt", m.source, m.shapes, pin=True)
        r.configure_client("rt", "RT", relative_deadline=1.0)
        calls = {
            "ort": lambda: sess.run(None, m.inputs),
            "infer_rt": lambda: r.infer("rt", m.inputs, client="rt"),
            "submit_be": lambda: r.submit("be", m.inputs, client="be").result(),
        }
        for _ in range(100):
            for fn in calls.values():
                fn()
        rounds: dict[str, list[float]] = {k: [] for k in calls}
        for i in range(args.rounds):
            for k, fn in calls.items():
                rounds[k].append(_per_call(fn, args.requests))
            print(f"round {i + 1}: " + "  ".join(f"{k} {v[-1]:.1f} us" for k, v in
                                                 rounds.items()), file=out, flush=True)
        med = {k: statistics.median(v) for k, v in rounds.items()}
        doc["rounds_us"] = rounds
        doc["median_us"] = med
        doc["paths"] = {}
        for k in ("infer_rt", "submit_be"):
            swapped = _visible_engine(True)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.requests):
                calls[k]()
            prof.disable()
            _visible_engine(False)
            doc.setdefault("engine_calls_made_visible", {})[k] = swapped
            steps, other = _attribute(prof, args.requests)
            own = sum(v for s, v in steps.items() if s != "engine (ORT)") + sum(other.values())
            overhead = med[k] - med["ort"]
            scaled = {s: (v / own * overhead if s != "engine (ORT)" else None)
                      for s, v in steps.items()}
            scaled["other"] = sum(other.values()) / own * overhead if own else 0.0
            doc["paths"][k] = {"overhead_us": overhead, "profiled_us": steps,
                               "profiled_other_us": dict(sorted(other.items(),
                                                                key=lambda x: -x[1])[:15]),
                               "estimated_us": scaled}
            print(f"\n{k}: {med[k]:.1f} us a request, bare ORT {med['ort']:.1f} us, "
                  f"av_infer's own {overhead:.1f} us (medians of {args.rounds} rounds)",
                  file=out)
            print(f"  {'step':24s} {'est. us':>8s} {'share':>6s}", file=out)
            for s in [*ORDER, "other"]:
                if s == "engine (ORT)":
                    continue
                v = scaled[s] or 0.0
                print(f"  {s:24s} {v:8.1f} {v / overhead * 100 if overhead else 0:5.0f}%",
                      file=out)
            if other:
                top = ", ".join(f"{k2} {v:.1f}" for k2, v in
                                sorted(other.items(), key=lambda x: -x[1])[:6])
                print(f"  other (profiled us): {top}", file=out)
    emit_json(doc, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
