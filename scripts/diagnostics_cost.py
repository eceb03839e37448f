#!/usr/bin/env python3
"""Cost of one ``/diagnostics`` publication of the runtime host (``RuntimeNode.
publish_diagnostics``), by step, beside what it cost as message objects, in one run.

The host runs it once a second on its executor with the GIL held; the data path's
callbacks wait for it (docs/ros.md, "The host's /diagnostics"). A runtime with the zoo's
``--models`` and ``--clients`` clients (each client a few requests of every model, half
RT) gives the statistics; then, in alternating rounds:

* ``stats()``: ``Runtime.stats()`` (its percentiles: ``latency.quantiles``), beside
  ``np.percentile`` over the same sample arrays (what ``summarize_ms`` called before);
* ``statuses``: ``diagnostic_statuses`` (``Status``/``KV`` tuples) beside the same values
  built as ``DiagnosticStatus``/``KeyValue`` messages (with ``ros_text`` on each text, as
  the builder did);
* ``serialise``: ``health.diagnostics_cdr`` beside ``rclpy.serialization.
  serialize_message`` of those messages (what ``Publisher.publish(msg)`` does in C).

No ROS context (serialisation needs none). Wall clock on a shared machine: compare the
rows of one run, medians of ``--rounds``.

    .venv/bin/python scripts/diagnostics_cost.py [--models 4] [--clients 24] [--json -]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from av_infer_nodes.common import ros_text
from av_infer_nodes.health import diagnostics_cdr
from av_infer_nodes.runtime_diagnostics import diagnostic_statuses
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.serialization import serialize_message

from av_infer import Runtime
from av_infer.bench.peer import resolve_model
from av_infer.bench.report import emit_json, human_stream
from av_infer.latency import _SUMMARY_QS, quantiles

ZOO = ("tiny_mlp", "resnet152", "densenet201", "inception_v3", "vgg19", "distilbert")


def _as_messages(statuses: list) -> DiagnosticArray:
    msg = DiagnosticArray()
    msg.status = [DiagnosticStatus(level=s.level, name=ros_text(s.name), message=s.message,
                                   hardware_id=s.hardware_id,
                                   values=[KeyValue(key=ros_text(k), value=ros_text(v))
                                           for k, v in s.values])
                  for s in statuses]
    return msg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=4, help=f"zoo models, of {len(ZOO)}")
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--json", metavar="PATH", help="write the figures (- for stdout)")
    args = ap.parse_args()
    rt = Runtime("cpu")
    models = {n: resolve_model(n) for n in ZOO[: args.models]}
    for n, m in models.items():
        rt.load_model(n, m.source)
    for c in range(args.clients):
        for n, m in models.items():
            for _ in range(3):
                rt.submit(n, m.inputs, client=f"client_{c}",
                          priority="RT" if c % 2 else "BE").result()
    # the recorders' sample arrays summarize_ms reads (as stats() copies them)
    stats = rt._sched.stats  # noqa: SLF001 - the recorders themselves
    recorders = [stats.preemption_stop, stats.preemption_observed,
                 stats.preemption_stop_submit]
    for cs in stats.clients.values():
        recorders += [cs.latency, cs.preemption_latency]
    samples = [r.sample()[0] for r in recorders]
    rows: dict[str, list[float]] = {k: [] for k in (
        "stats", "percentiles_numpy", "percentiles_quantiles", "statuses_tuples",
        "statuses_messages", "serialise_cdr", "serialise_rclpy")}
    kvs = size = 0
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        st = rt.stats()
        t1 = time.perf_counter()
        for a in samples:
            if len(a):
                np.percentile(a * 1e3, [50, 90, 99, 99.9])
        t2 = time.perf_counter()
        for a in samples:
            if len(a):
                quantiles(a * 1e3, _SUMMARY_QS)
        t3 = time.perf_counter()
        statuses = diagnostic_statuses(st, "cpu", rt, {})
        t4 = time.perf_counter()
        msg = _as_messages(statuses)
        t5 = time.perf_counter()
        raw = diagnostics_cdr(statuses, (1, 2))
        t6 = time.perf_counter()
        ref = serialize_message(msg)
        t7 = time.perf_counter()
        for k, v in zip(rows, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6)):
            rows[k].append(v * 1e3)
        kvs, size = sum(len(s.values) for s in statuses), (len(raw), len(ref))
    rt.close()
    out = {"models": len(models), "clients": args.clients, "statuses": len(statuses),
           "key_values": kvs, "bytes_cdr_rclpy": size, "recorders": len(samples),
           "median_ms": {k: statistics.median(v) for k, v in rows.items()}}
    m = out["median_ms"]
    before = (m["stats"] - m["percentiles_quantiles"] + m["percentiles_numpy"]
              + m["statuses_tuples"] + m["statuses_messages"] + m["serialise_rclpy"])
    text = (f"{len(statuses)} statuses, {kvs} values, {len(samples)} recorders; median of "
            f"{args.rounds} rounds (ms): stats() {m['stats']:.3f} (its percentiles: "
            f"np.percentile {m['percentiles_numpy']:.3f} vs quantiles "
            f"{m['percentiles_quantiles']:.3f}); statuses as tuples "
            f"{m['statuses_tuples']:.3f} vs messages {m['statuses_messages']:.3f}; "
            f"serialised by diagnostics_cdr {m['serialise_cdr']:.3f} vs rclpy "
            f"{m['serialise_rclpy']:.3f}; published now "
            f"{m['stats'] + m['statuses_tuples'] + m['serialise_cdr']:.2f}, as messages "
            f"with np.percentile ~{before:.2f}")
    print(text, file=human_stream(args.json))  # stderr when the JSON goes to stdout
    emit_json(out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
