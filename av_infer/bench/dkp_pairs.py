"""Padding pairs on the simulated MI50 (REEF §7.4, Fig. 16): an RT model closed loop next to
a closed-loop BE model, under ``reef`` and ``reef_dkp``.

    .venv/bin/python -m av_infer.bench.dkp_pairs [--seconds 1] [--json out/dkp_pairs.json]

Per pair: RT latency change of ``reef_dkp`` vs ``reef`` (p50 / p99) and the overall
normalized throughput ratio, REEF's normalization: RT requests completed plus the BE work
done as padding, as BE requests (kernels padded / kernels per request) weighted by the BE
model's standalone latency over the RT model's. Deterministic (virtual time).
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import Future

import numpy as np

from av_infer.devices.sim import SimDevice
from av_infer.model.plan import Plan
from av_infer.profiles import ModelProfile, load_reef_trace
from av_infer.runtime import Runtime
from av_infer.sched.request import Priority, Result

#: REEF trace models that stand for the DISB models (inception_v3 has no trace).
TRACE_MODELS = ("vgg", "resnet152", "densenet", "bert")


def pair(rt_model: str, be_model: str | tuple[Plan, ModelProfile], policy: str,
         seconds: float = 1.0) -> dict[str, float]:
    """RT ``rt_model`` closed loop (high contention, REEF §7.4) next to a closed-loop BE
    client; RT latencies in µs, BE requests completed, BE kernels completed by padding."""
    plans = {"rt": load_reef_trace(rt_model),
             "be": load_reef_trace(be_model) if isinstance(be_model, str) else be_model}
    dev = SimDevice("mi50", {plan.name: prof for plan, prof in plans.values()})
    rt = Runtime(device=dev, policy=policy, c=4)
    for role, (plan, _) in plans.items():
        rt.load_model(role, plan)
    rts: list[Future[Result]] = []
    bes: list[Future[Result]] = []

    def loop(role: str, out: list, prio: Priority) -> None:
        if dev.now() < seconds:
            f = rt.submit(role, {}, priority=prio)
            out.append(f)
            f.add_done_callback(lambda _: loop(role, out, prio))

    dev.call_at(0.0, lambda: loop("be", bes, Priority.BE))
    dev.call_at(1e-3, lambda: loop("rt", rts, Priority.RT))
    dev.run()
    lat = np.array([f.result().timings.latency for f in rts]) / 1e-6
    out = {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
           "rt": len(rts), "be": sum(1 for f in bes if f.result().timings.end <= seconds),
           "padded": rt.stats()["padding"]["kernels"]}
    rt.close()
    return out


def normalized_throughput(run: dict[str, float], rt_model: str, be_model: str) -> float:
    """RT requests + the BE work done as padding, in RT-request equivalents (REEF §7.4).
    With RT in a closed loop, BE gets no idle time: padding is all it gets (both policies
    give BE the same first millisecond before RT starts, left out of both)."""
    _, p_rt = load_reef_trace(rt_model)
    be_plan, p_be = load_reef_trace(be_model)
    be_requests = run["padded"] / max(len(be_plan.kernels), 1)
    return run["rt"] + be_requests * p_be.total_us / p_rt.total_us


def table(seconds: float = 1.0) -> list[dict[str, float | str]]:
    rows = []
    for rt_m in TRACE_MODELS:
        for be_m in TRACE_MODELS:
            reef, dkp = pair(rt_m, be_m, "reef", seconds), pair(rt_m, be_m, "reef_dkp", seconds)
            rows.append({
                "rt": rt_m, "be": be_m,
                "rt_p50_change_pct": 100 * (dkp["p50"] / reef["p50"] - 1),
                "rt_p99_change_pct": 100 * (dkp["p99"] / reef["p99"] - 1),
                "throughput_ratio": normalized_throughput(dkp, rt_m, be_m)
                / normalized_throughput(reef, rt_m, be_m),
                "be_padded_kernels": dkp["padded"],
            })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1.0, help="virtual seconds per run")
    ap.add_argument("--json", help="write the rows as JSON")
    args = ap.parse_args()
    rows = table(args.seconds)
    cells = {(r["rt"], r["be"]): r for r in rows}
    print("RT \\ BE     " + "".join(f"{b:>24}" for b in TRACE_MODELS))
    for rt_m in TRACE_MODELS:
        line = f"{rt_m:<12}"
        for be_m in TRACE_MODELS:
            r = cells[(rt_m, be_m)]
            line += (f"{r['rt_p50_change_pct']:+6.2f}%/{r['rt_p99_change_pct']:+6.2f}% "
                     f"{r['throughput_ratio']:5.2f}x")
        print(line)
    print("cells: RT p50 / p99 change of reef_dkp vs reef, normalized throughput ratio")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
