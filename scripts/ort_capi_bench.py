#!/usr/bin/env python3
"""Micro-benchmark of one ORT launch: the C API (``av_infer._cy.ort_capi``) against the
Python binding's raw ``run_with_iobinding`` and ``InferenceSession.run``, on a model small
enough that the call is the cost (docs/cpu_engine.md, "The C API path").

Rounds alternate the three, so each sees the same machine state; every round is printed.

    .venv/bin/python scripts/ort_capi_bench.py [--size 4] [--calls 10000] [--rounds 5] [--json -]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from av_infer._cy import ort_capi
from av_infer.bench.report import emit_json, human_stream
from av_infer.model.segments import ort_options


def _model(n: int) -> bytes:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    return m.SerializeToString()


def _per_call_us(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=4, help="floats in and out")
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="write the figures here ('-': stdout)")
    args = ap.parse_args()
    out = human_stream(args.json)
    onnx_bytes = _model(args.size)
    x = np.linspace(-1, 1, args.size, dtype=np.float32)
    y = np.zeros(args.size, np.float32)

    seg = ort_capi.BoundSegment(ort_capi.Session(onnx_bytes, 1), ("x",), ("y",))
    seg.bind_input("x", x.dtype, x.shape, x.ctypes.data)
    seg.bind_output("y", y.dtype, y.shape, y.ctypes.data)
    c_ro = ort_capi.RunOptions()

    sess = ort.InferenceSession(onnx_bytes, ort_options(1), providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    io.bind_input("x", "cpu", 0, np.float32, [args.size], x.ctypes.data)
    io.bind_output("y", "cpu", 0, np.float32, [args.size], y.ctypes.data)
    raw_run, raw_io, py_ro = sess._sess.run_with_iobinding, io._iobinding, ort.RunOptions()
    feeds = {"x": x}

    fns = {"c_api": lambda: seg(c_ro),
           "binding_raw": lambda: raw_run(raw_io, py_ro),
           "session_run": lambda: sess.run(None, feeds)}
    for fn in fns.values():  # warm-up
        _per_call_us(fn, 200)
    rounds = []
    for i in range(args.rounds):
        row = {k: _per_call_us(fn, args.calls) for k, fn in fns.items()}
        rounds.append(row)
        print(f"round {i + 1}: " + "  ".join(f"{k} {v:.2f} us" for k, v in row.items()),
              file=out, flush=True)
    med = {k: float(np.median([r[k] for r in rounds])) for k in fns}
    print("median: " + "  ".join(f"{k} {v:.2f} us" for k, v in med.items()), file=out)
    emit_json({"config": vars(args), "library": list(ort_capi.load()), "rounds": rounds,
               "median_us": med}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
