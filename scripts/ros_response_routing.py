#!/usr/bin/env python3
"""Round trip of a remote client, per-client response topic against the shared one.

A runtime host (``av_infer_runtime``, cpu, tiny_cnn) in its own process, started once per
routing (``response_routing`` shared, then per_client); in this process one measured
``RemoteRuntimeClient`` sends ``--n`` requests one at a time (submit -> its answer in the
client's callback) and ``--others`` further clients keep one request each in flight
meanwhile (their answers are what a client on the shared topic also receives). Prints
p50/p90/p99 of the measured round trip and the messages the measured client was
delivered, per routing. Wall clock on a possibly shared machine: compare the rows of one
run.

    scripts/netns_run.sh .venv/bin/python scripts/ros_response_routing.py [--json -]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
from av_infer_nodes.common import RemoteRuntimeClient
from av_infer_nodes.testing import NodeProcess, RosHarness, wait_for

from av_infer import tensor_codec as codec


class Counted(RemoteRuntimeClient):
    """Counts what its subscription delivered (its own answers and, shared, others')."""

    delivered = 0

    def _received(self, msg: codec.WireResponse) -> None:
        self.delivered += 1
        super()._received(msg)


def _ctrl(client: str) -> codec.RequestControl:
    return codec.RequestControl(id=str(uuid.uuid4()), model="tiny_cnn", client=client,
                                priority="RT", stamp=(0, 0), frame_id="f", deadline_s=None,
                                drop_late=False)


def run(routing: str, n: int, others: int, warmup: int) -> dict:
    x = {"input": np.random.default_rng(0).standard_normal((1, 3, 32, 32))
         .astype(np.float32)}
    logs = Path(tempfile.mkdtemp(prefix="routing_bench_"))
    proc = NodeProcess("av_infer_nodes.runtime_node", log_dir=logs, ros_args=[
        "-p", "device:=cpu", "-p", "models:=[tiny_cnn]", "-p", f"response_routing:={routing}"])
    h = RosHarness(num_threads=1, executor="single")
    stop = threading.Event()
    try:
        me = Counted(h.node("measured"), timeout_s=30.0, client="measured")
        bg = [RemoteRuntimeClient(h.node(f"other{i}"), timeout_s=30.0, client=f"other{i}")
              for i in range(others)]
        wait_for(lambda: all(c.ready("tiny_cnn") for c in (me, *bg)), timeout=60.0,
                 what="the host")

        def keep_busy(c: RemoteRuntimeClient) -> None:
            if not stop.is_set():
                c.submit(_ctrl(c.client), x).add_done_callback(lambda f: keep_busy(c))

        for c in bg:
            keep_busy(c)
        rtts = []
        for i in range(warmup + n):
            t0 = time.perf_counter()
            reply = me.submit(_ctrl("measured"), x).result(30.0)
            dt = time.perf_counter() - t0
            assert reply.code == "ok", reply.message
            if i >= warmup:
                rtts.append(dt * 1e3)
        stop.set()
        a = np.asarray(rtts)
        return {"routing": routing, "n": n, "others": others,
                "rtt_ms": {q: float(np.percentile(a, int(q[1:]))) for q in ("p50", "p90",
                                                                            "p99")},
                "delivered_to_measured": me.delivered, "own_requests": warmup + n}
    finally:
        stop.set()
        h.close()
        proc.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--others", type=int, nargs="*", default=[0, 3])
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat, alternating which routing runs first (order effects)")
    ap.add_argument("--json", metavar="PATH", help="'-' prints JSON to stdout")
    args = ap.parse_args(argv)
    rows = []
    for i in range(args.rounds):
        order = ("shared", "per_client") if i % 2 == 0 else ("per_client", "shared")
        rows += [dict(run(r, args.n, k, args.warmup), round=i) for k in args.others
                 for r in order]
    if args.json == "-":
        json.dump(rows, sys.stdout, indent=1)
        print()
        return
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"{'round':>5} {'routing':<11} {'others':>6} {'p50 ms':>7} {'p90 ms':>7} "
          f"{'p99 ms':>7} {'delivered/own':>14}")
    for r in rows:
        q = r["rtt_ms"]
        print(f"{r['round']:>5} {r['routing']:<11} {r['others']:>6} {q['p50']:7.3f} "
              f"{q['p90']:7.3f} {q['p99']:7.3f} {r['delivered_to_measured']:>7}/"
              f"{r['own_requests']}")


if __name__ == "__main__":
    main()
