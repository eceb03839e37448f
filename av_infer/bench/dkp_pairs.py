"""Padding pairs on the simulated MI50 (REEF §7.4, Fig. 16): an RT model closed loop next to
a closed-loop BE model, under ``reef`` and ``reef_dkp``.

    .venv/bin/python -m av_infer.bench.dkp_pairs [--seconds 1] [--json out/dkp_pairs.json]

Per pair: RT latency change of ``reef_dkp`` vs ``reef`` (p50 / p99) and the overall
normalized throughput ratio, REEF's normalization: RT requests completed plus the BE work
done, as BE requests weighted by the BE model's standalone latency over the RT model's.
Deterministic (virtual time).

The table's math (:func:`pct_change`, :func:`normalized_throughput`, :func:`pair_row`,
:func:`format_table`) is shared with the same table measured on a real CUDA device
(``av_infer.bench.gpu_bench.dkp_pairs``), so the two read the same way.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from av_infer.devices.sim import SimDevice
from av_infer.model.plan import Plan
from av_infer.profiles import ModelProfile, load_reef_trace
from av_infer.runtime import Runtime
from av_infer.sched.request import Priority, Result

#: REEF trace models that stand for the DISB models (inception_v3 has no trace).
TRACE_MODELS = ("vgg", "resnet152", "densenet", "bert")


# -- shared math (simulator and device tables) ------------------------------------------------
def pct_change(new: float, old: float) -> float | None:
    """``new`` relative to ``old`` in percent (None when ``old`` is 0 or not finite)."""
    if not old or not np.isfinite(old) or not np.isfinite(new):
        return None
    return 100 * (new / old - 1)


def normalized_throughput(rt_done: float, be_done: float, rt_alone: float,
                          be_alone: float) -> float:
    """RT requests + BE requests in RT-request equivalents (REEF §7.4): BE work counts
    as much as the RT time it stands for, ``be_alone / rt_alone`` (standalone latencies,
    any one unit) per BE request. Fractional ``be_done`` is fine (padded BE kernels over
    kernels per request, as the simulator counts it)."""
    return rt_done + be_done * be_alone / rt_alone


def pair_row(rt_m: str, be_m: str, reef: Mapping[str, float], dkp: Mapping[str, float],
             rt_alone: float, be_alone: float) -> dict[str, Any]:
    """One cell of the pair table from the ``reef`` and ``reef_dkp`` runs of a pair.

    Each run: ``p50``/``p99`` RT latency (any one unit), ``rt`` RT requests completed,
    ``be_work`` BE work done in BE requests, ``padded`` BE kernels completed by padding.
    """
    n_reef = normalized_throughput(reef["rt"], reef["be_work"], rt_alone, be_alone)
    n_dkp = normalized_throughput(dkp["rt"], dkp["be_work"], rt_alone, be_alone)
    return {
        "rt": rt_m, "be": be_m,
        "rt_p50_change_pct": pct_change(dkp["p50"], reef["p50"]),
        "rt_p99_change_pct": pct_change(dkp["p99"], reef["p99"]),
        "throughput_ratio": n_dkp / n_reef if n_reef else None,
        "be_padded_kernels": dkp["padded"],
    }


def _fmt(v: float | None, spec: str, width: int) -> str:
    return format(v, spec) if v is not None else "n/a".rjust(width)


def format_table(rows: Sequence[Mapping[str, Any]], models: Sequence[str]) -> str:
    """The 5x5 (or NxN) table: rows RT model, columns BE model; each cell
    ``p50 change / p99 change  normalized throughput ratio``."""
    cells = {(r["rt"], r["be"]): r for r in rows}
    w = max(12, *(len(m) + 1 for m in models))
    lines = ["RT \\ BE".ljust(w) + "".join(f"{b:>24}" for b in models)]
    for rt_m in models:
        line = rt_m.ljust(w)
        for be_m in models:
            r = cells.get((rt_m, be_m))
            if r is None:
                line += f"{'(not run)':>24}"
                continue
            line += (f"{_fmt(r['rt_p50_change_pct'], '+6.2f', 6)}%/"
                     f"{_fmt(r['rt_p99_change_pct'], '+6.2f', 6)}% "
                     f"{_fmt(r['throughput_ratio'], '5.2f', 5)}x")
        lines.append(line)
    lines.append("cells: RT p50 / p99 change of reef_dkp vs reef, normalized throughput ratio")
    return "\n".join(lines)


# -- the simulator ------------------------------------------------------------------------------
def pair(rt_model: str, be_model: str | tuple[Plan, ModelProfile], policy: str,
         seconds: float = 1.0, dkp_placement: str = "faithful",
         contention: str = "none") -> dict[str, float]:
    """RT ``rt_model`` closed loop (high contention, REEF §7.4) next to a closed-loop BE
    client; RT latencies in µs, BE requests completed, BE kernels completed by padding.
    ``dkp_placement``/``contention``: the simulator's (``SimDevice``)."""
    plans = {"rt": load_reef_trace(rt_model),
             "be": load_reef_trace(be_model) if isinstance(be_model, str) else be_model}
    dev = SimDevice("mi50", {plan.name: prof for plan, prof in plans.values()},
                    dkp_placement=dkp_placement, contention=contention)
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


def sim_be_work(run: Mapping[str, float], be_model: str) -> float:
    """BE work of a simulated pair run, in BE requests: the kernels padded over the kernels
    per request. With RT in a closed loop on the simulator BE gets no idle time: padding is
    all it gets (both policies give BE the same first millisecond before RT starts, left
    out of both)."""
    be_plan, _ = load_reef_trace(be_model)
    return run["padded"] / max(len(be_plan.kernels), 1)


def table(seconds: float = 1.0, dkp_placement: str = "faithful",
          contention: str = "none") -> list[dict[str, float | str]]:
    """The simulated table over :data:`TRACE_MODELS` (REEF trace latencies as standalone)."""
    rows = []
    kw = {"dkp_placement": dkp_placement, "contention": contention}
    for rt_m in TRACE_MODELS:
        for be_m in TRACE_MODELS:
            reef = pair(rt_m, be_m, "reef", seconds, **kw)
            dkp = pair(rt_m, be_m, "reef_dkp", seconds, **kw)
            for run in (reef, dkp):
                run["be_work"] = sim_be_work(run, be_m)
            rows.append(pair_row(rt_m, be_m, reef, dkp, load_reef_trace(rt_m)[1].total_us,
                                 load_reef_trace(be_m)[1].total_us))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1.0, help="virtual seconds per run")
    ap.add_argument("--json", help="write the rows as JSON")
    ap.add_argument("--dkp-placement", choices=["faithful", "reserved"], default="faithful",
                    help="the simulator's padded-grid placement ('reserved': the what-if "
                    "CUDA cannot do, the model before issue 13)")
    ap.add_argument("--contention", default="none",
                    help="the simulator's contention model (none, bandwidth, calibrated)")
    args = ap.parse_args()
    rows = table(args.seconds, args.dkp_placement, args.contention)
    print(format_table(rows, TRACE_MODELS))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
