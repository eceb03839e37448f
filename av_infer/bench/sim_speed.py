"""How fast the simulator runs (issue 13): block batches per wall second, device alone and
end to end through the runtime.

``python -m av_infer.bench.sim_speed [--sim-module FILE] [--device-seconds 2]
[--workload E --seconds 60 --policies streams,reef]``

* ``device``: the device model alone (no scheduler): three streams of REEF-trace models
  (resnet152, densenet, bert) in closed loops on ``--gpu`` (h100) for ``--device-seconds``
  virtual seconds; reports batches and kernels per wall second.
* ``bench``: one DISB workload through ``Bench.run_policy`` per policy, wall seconds and
  batches per second (contention ``none``, placement ``reserved``, ``be_min_share`` 0.1:
  the configuration an older simulator can run too, so results can be compared).

``--sim-module FILE`` runs another implementation of ``av_infer/devices/sim.py`` (e.g.
``git show <rev>:av_infer/devices/sim.py > /tmp/sim_old.py``), to measure before/after on
the same machine; the report says which file ran and a digest of the results (the same
digest means the same timeline).

``--equivalence FILE [--seconds S]``: the check that a faster simulator is the same model:
every DISB workload and the trace workload under ``rt_only,streams,reef,reef_dkp,wait``
with this build and with ``FILE``, each run's request records (every time, preemption
and padding count), preemption and event counts compared exactly. Configurations an older
simulator lacks options for are skipped for it (``--equiv-configs``): ``legacy``
(contention ``none``, ``reserved`` placement, ``be_min_share`` 0.1, mi50 and h100) runs
on any ``sim.py``; ``issue13`` (calibrated contention, faithful grids, quiet windows,
c = 1) needs one with those options.

``--digests OUT [--against FILE]``: the same runs' digests with this checkout's simulator
*and scheduler*, written to ``OUT``; run it in two checkouts (e.g. a ``git worktree`` of
the base, with ``PYTHONPATH`` at it) and compare with ``--against``: a scheduler change
that must not change any decision is checked this way.

``--completion-cost``: what one kernel completion costs in the ``bench`` runs (issue 31):
process CPU of ``Bench.run_policy`` per completion, and the thread CPU spent inside the
device's completion callback (the driver, the scheduler's handling and decision, the
device calls and answers it makes), per completion, less the cost of the two clock reads
around it (calibrated in the same process). The rest is the device model's event loop and
the harness's arrivals. Repeat it (``--rounds``): one 2-core VM shared with other work
varies by ±20 %. The mean in the callback also carries, spread over every completion,
what a request's last completion does once (its answer, the harness's callback on its
future and, in closed loops, the next request's whole submission path); the *median*
completion's time (``callback_p50_us``, less the median clock pair) is a kernel
completion that answers nothing: the driver, the scheduler's bookkeeping and decision,
and the device calls that decision makes.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import inspect
import json
import sys
import time
from typing import Any


def _load_sim(path: str | None) -> Any:
    """The SimDevice class to measure, installed as ``av_infer.devices.sim``."""
    if path is None:
        from av_infer.devices.sim import SimDevice

        return SimDevice
    spec = importlib.util.spec_from_file_location("av_infer_sim_under_test", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"sim_speed: cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    base = mod.SimDevice
    params = inspect.signature(base.__init__).parameters
    #: what a simulator without the option does (pre issue 13: no contention model,
    #: padded blocks on reserved SMs)
    implied = {"contention": "none", "dkp_placement": "reserved"}

    class Compat(base):  # type: ignore[misc, valid-type]
        """Passes the options ``base`` has; one it lacks must be what it does anyway
        (else ValueError: the runs would not be comparable), except
        ``record_residency`` (then no batch residency: empty lists)."""

        def __init__(self, *a: Any, **kw: Any) -> None:
            for name, value in list(kw.items()):
                if name in params:
                    continue
                del kw[name]
                if name in implied and value != implied[name]:
                    raise ValueError(f"{path} has no {name} option (it always does "
                                     f"{implied[name]!r}), asked for {value!r}")
            super().__init__(*a, **kw)

        def residency(self, stream: int) -> tuple[list[float], list[float]]:
            if "record_residency" in params:
                return base.residency(self, stream)
            return [], []

    mod.SimDevice = Compat
    sys.modules["av_infer.devices.sim"] = mod
    return Compat


def device_speed(sim_cls: Any, gpu: str, seconds: float) -> dict[str, Any]:
    from av_infer import profiles

    models = ["resnet152", "densenet", "bert"]
    plans = {m: profiles.load_reef_trace(m, gpu=gpu) for m in models}
    dev = sim_cls(gpu, {m: p[1] for m, p in plans.items()})
    handles = {m: dev.load_plan(plans[m][0]) for m in models}
    streams = [dev.open_stream(0) for _ in models]
    n_k = {m: len(plans[m][0].kernels) for m in models}
    nxt = [0]
    ends: list[float] = []

    def start(i: int) -> None:
        nxt[0] += 1
        m = models[i]
        dev.new_task(handles[m], nxt[0])
        dev.enqueue(streams[i], nxt[0], 0, n_k[m] - 1)

    def on_complete(c: Any) -> None:
        i = streams.index(c.stream)
        if c.kernel == n_k[models[i]] - 1:
            ends.append(c.t_end)
            dev.release_task(c.task)
            start(i)

    dev.start(on_complete)
    for i in range(len(models)):
        start(i)
    t0 = time.perf_counter()
    dev.run(until=seconds)
    wall = time.perf_counter() - t0
    st = dev.stats
    return {"virtual_s": seconds, "wall_s": round(wall, 3), "batches": st["batches"],
            "kernels": st["kernels"], "batches_per_s": round(st["batches"] / wall),
            "kernels_per_s": round(st["kernels"] / wall),
            "digest": hashlib.sha1(repr(ends).encode()).hexdigest()[:12]}


def completion_cost(workload: str, gpu: str, seconds: float, policies: list[str]) -> list[dict]:
    """Per policy: completions, process CPU per completion of the run, thread CPU per
    completion inside the completion callback (see the module docstring)."""
    from array import array

    from av_infer.bench.harness import Bench, BenchConfig
    from av_infer.bench.workload import load_workload
    from av_infer.devices.sim import SimDevice

    clock = time.thread_time_ns
    each = array("q")  # every completion's callback time, ns (clock pair included)
    put = each.append

    def timed_start(dev: Any, on_complete: Any) -> None:
        def timed(comp: Any) -> None:
            t = clock()
            on_complete(comp)
            put(clock() - t)

        start(dev, timed)

    def nop(comp: Any) -> None:
        pass

    cal = array("q")  # two clock reads and a Python call, as around the callback
    for _ in range(100_000):
        t = clock()
        nop(None)
        cal.append(clock() - t)
    cal_us = sum(cal) / len(cal) / 1e3
    cal_p50_us = sorted(cal)[len(cal) // 2] / 1e3
    cfg = BenchConfig(device="sim", duration=seconds, gpu=gpu, progress=False, standalone_n=5,
                      contention="none", dkp_placement="reserved", be_min_share=0.1,
                      timeline=False)
    bench = Bench(load_workload(workload), cfg)
    bench.standalone()
    start = SimDevice.start
    rows = []
    SimDevice.start = timed_start  # type: ignore[method-assign]
    try:
        for p in policies:
            del each[:]
            c0 = time.process_time()
            run = bench.run_policy(p)
            cpu = time.process_time() - c0
            n = max(1, len(each))
            srt = sorted(each)
            rows.append({"workload": workload, "policy": p, "virtual_s": seconds,
                         "completions": len(each), "kernels": run.device.get("kernels"),
                         "cpu_s": round(cpu, 3),
                         "cpu_per_completion_us": round(cpu / n * 1e6, 2),
                         "callback_us": round(sum(each) / n / 1e3 - cal_us, 2),
                         "callback_p50_us": round(srt[len(srt) // 2] / 1e3 - cal_p50_us, 2)
                         if srt else 0.0,
                         "clock_pair_us": round(cal_us, 2),
                         "clock_pair_p50_us": round(cal_p50_us, 2),
                         "requests": len(run.records)})
    finally:
        SimDevice.start = start  # type: ignore[method-assign]
    return rows


def bench_speed(workload: str, gpu: str, seconds: float, policies: list[str]) -> list[dict]:
    from av_infer.bench.harness import Bench, BenchConfig
    from av_infer.bench.workload import load_workload

    cfg = BenchConfig(device="sim", duration=seconds, gpu=gpu, progress=False, standalone_n=5,
                      contention="none", dkp_placement="reserved", be_min_share=0.1,
                      timeline=False)
    bench = Bench(load_workload(workload), cfg)
    bench.standalone()
    rows = []
    for p in policies:
        t0 = time.perf_counter()
        run = bench.run_policy(p)
        wall = time.perf_counter() - t0
        ends = repr(sorted(round(r.end, 9) for r in run.records if r.ok))
        rows.append({"workload": workload, "policy": p, "virtual_s": seconds,
                     "wall_s": round(wall, 2), "requests": len(run.records),
                     "digest": hashlib.sha1(ends.encode()).hexdigest()[:12]})
    return rows


#: --equivalence configurations: name -> [(gpu, BenchConfig overrides)]
EQUIV_CONFIGS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "legacy": [("h100", {"contention": "none", "dkp_placement": "reserved",
                         "be_min_share": 0.1}),
               ("mi50", {"contention": "none", "dkp_placement": "reserved", "c": 1})],
    "issue13": [("h100", {"contention": "calibrated", "dkp_placement": "faithful"}),
                ("h100", {"contention": "calibrated", "dkp_placement": "faithful",
                          "rt_forecast": True}),
                ("mi50", {"contention": "bandwidth", "dkp_placement": "reserved", "c": 1})],
}
EQUIV_WORKLOADS = ("A", "B", "C", "D", "E", "av_infer/bench/workloads/trace_cams.json")
EQUIV_POLICIES = ("rt_only", "streams", "reef", "reef_dkp", "wait")


def _digests(seconds: float, configs: list[str], label: str) -> dict[str, tuple[str, int]]:
    """Per run ``(digest of its records, preemptions and events, request count)``, with
    whichever ``av_infer.devices.sim`` is installed now."""
    from tqdm import tqdm

    from av_infer.bench.harness import Bench, BenchConfig
    from av_infer.bench.workload import load_workload

    out = {}
    runs = [(name, i, gpu, kw) for name in configs
            for i, (gpu, kw) in enumerate(EQUIV_CONFIGS[name])]
    todo = [(r, w) for r in runs for w in EQUIV_WORKLOADS]
    for (name, i, gpu, kw), wl in tqdm(todo, desc=label, unit="workload", file=sys.stderr):
        cfg = BenchConfig(device="sim", duration=seconds, gpu=gpu, progress=False,
                          standalone_n=3, **kw)
        bench = Bench(load_workload(wl), cfg)
        bench.standalone()
        for p in EQUIV_POLICIES:
            run = bench.run_policy(p)
            text = repr([r.to_dict() for r in run.records]) + repr(run.preemptions) + \
                repr(sorted(run.events.items()))
            key = f"{name}[{i}] {gpu} {wl.rsplit('/', 1)[-1]} {p}"
            out[key] = (hashlib.sha1(text.encode()).hexdigest()[:16], len(run.records))
    return out


def equivalence(other: str, seconds: float, configs: list[str]) -> dict[str, Any]:
    """Run :data:`EQUIV_CONFIGS` with this build and with the ``sim.py`` at ``other``;
    the runs that differ (none: the same model)."""
    mine = _digests(seconds, configs, "this build")
    saved = sys.modules.get("av_infer.devices.sim")
    try:
        _load_sim(other)
        theirs = _digests(seconds, configs, other)
    finally:
        if saved is not None:
            sys.modules["av_infer.devices.sim"] = saved
    return _compare(mine, theirs, other, configs, seconds)


def _compare(mine: dict, theirs: dict, other: str, configs: list[str],
             seconds: float) -> dict[str, Any]:
    """The runs of ``mine`` whose digest ``theirs`` lacks or has otherwise (read from JSON,
    a digest is a list: compared as one)."""
    differ = [k for k in mine if list(mine[k]) != list(theirs.get(k, ()))]
    return {"other": other, "configs": configs, "virtual_s": seconds, "runs": len(mine),
            "requests": sum(n for _, n in mine.values()), "differ": differ}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sim-module", help="another sim.py to measure (default: this build's)")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--device-seconds", type=float, default=2.0)
    ap.add_argument("--workload", default="E")
    ap.add_argument("--seconds", type=float, default=10.0, help="virtual s of the bench run")
    ap.add_argument("--policies", default="streams,reef")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--json", help="'-': JSON on stdout")
    ap.add_argument("--equivalence", metavar="FILE",
                    help="compare every run's records with the sim.py at FILE, then exit")
    ap.add_argument("--equiv-configs", default="legacy",
                    help="comma list of " + ",".join(EQUIV_CONFIGS) + " (default legacy)")
    ap.add_argument("--digests", metavar="OUT",
                    help="write every --equiv-configs run's digest with this checkout (a "
                         "scheduler change is compared by running this in two checkouts), "
                         "then exit")
    ap.add_argument("--against", metavar="FILE",
                    help="with --digests: the runs that differ from FILE (exit 1 if any)")
    ap.add_argument("--completion-cost", action="store_true",
                    help="CPU per kernel completion of the bench runs, and inside the "
                         "completion callback (driver + scheduler), then exit")
    ap.add_argument("--rounds", type=int, default=1, help="with --completion-cost")
    a = ap.parse_args(argv)
    names = [n for n in a.equiv_configs.split(",") if n]
    bad = [n for n in names if n not in EQUIV_CONFIGS]
    if bad:
        ap.error(f"unknown --equiv-configs {bad}; choose from {list(EQUIV_CONFIGS)}")
    eq = None
    if a.completion_cost:
        pols = [p for p in a.policies.split(",") if p]
        rows = [r | {"round": i} for i in range(a.rounds)
                for r in completion_cost(a.workload, a.gpu, a.seconds, pols)]
        if a.json == "-":
            print(json.dumps(rows, indent=2))
            return 0
        for r in rows:
            print(f"round {r['round']} {r['workload']} {r['policy']:<8} {r['virtual_s']:g} "
                  f"virtual s: {r['completions']} completions, run {r['cpu_s']} s CPU = "
                  f"{r['cpu_per_completion_us']} us a completion, of which "
                  f"{r['callback_us']} us in the completion callback (clock pair "
                  f"{r['clock_pair_us']} us subtracted); median completion "
                  f"{r['callback_p50_us']} us in the callback (median clock pair "
                  f"{r['clock_pair_p50_us']} us subtracted)")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=2)
        return 0
    if a.digests:
        mine = _digests(a.seconds, names, "this checkout")
        with open(a.digests, "w") as f:
            json.dump(mine, f, indent=1)
        if not a.against:
            return 0
        with open(a.against) as f:
            eq = _compare(mine, json.load(f), a.against, names, a.seconds)
    elif a.equivalence:
        eq = equivalence(a.equivalence, a.seconds, names)
    if eq is not None:
        if a.json == "-":
            print(json.dumps(eq, indent=2))
        else:
            print(f"{eq['runs']} runs, {eq['requests']} requests, {a.seconds:g} virtual s "
                  f"each: {len(eq['differ'])} differ from {eq['other']}"
                  + (f": {eq['differ']}" if eq["differ"] else ""))
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(eq, f, indent=2)
        return 1 if eq["differ"] else 0
    sim_cls = _load_sim(a.sim_module)
    res: dict[str, Any] = {"sim_module": a.sim_module or "av_infer/devices/sim.py",
                           "device": device_speed(sim_cls, a.gpu, a.device_seconds)}
    if not a.skip_bench:
        res["bench"] = bench_speed(a.workload, a.gpu, a.seconds,
                                   [p for p in a.policies.split(",") if p])
    if a.json == "-":
        print(json.dumps(res, indent=2))
        return 0
    d = res["device"]
    print(f"{res['sim_module']}: device model {d['batches_per_s']:,} batches/s "
          f"({d['batches']} batches, {d['wall_s']} s wall, digest {d['digest']})")
    for r in res.get("bench", []):
        print(f"  bench {r['workload']} {r['policy']:<9} {r['virtual_s']:g} virtual s in "
              f"{r['wall_s']} s wall ({r['requests']} requests, digest {r['digest']})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
