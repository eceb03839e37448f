"""Compile a model, run it on the CPU executor and compare with ONNX Runtime (the oracle)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

#: Float32 agreement av_infer promises against ONNX Runtime on the CPU.
CPU_TOLERANCE = 1e-4


def max_rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| (floored at 1e-6): a scale-aware float32 error.

    Exact comparison for non-float outputs (1.0 on any mismatch).
    """
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    if not np.issubdtype(want.dtype, np.floating):
        return 0.0 if np.array_equal(got, want) else 1.0
    if want.size == 0:
        return 0.0
    scale = max(float(np.max(np.abs(want))), 1e-6)
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale


@dataclass
class CheckReport:
    """What ``av-infer models check`` prints and writes as JSON."""

    model: str
    kernels: int
    kernels_unoptimized: int
    onnx_nodes: int
    weight_bytes: int
    activation_bytes: int
    compile_s: float
    run_s: float
    ort_s: float
    max_rel_err: float
    per_output: dict[str, float]

    @property
    def ok(self) -> bool:
        return self.max_rel_err <= CPU_TOLERANCE

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        d["tolerance"] = CPU_TOLERANCE
        return d


def ort_session(path: str | os.PathLike | bytes, threads: int | None = None):
    """An ONNX Runtime CPU session with all graph optimisations (the reference)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    src = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])


def random_inputs(spec: dict[str, tuple[tuple[int, ...], str]], seed: int = 0) -> dict:
    """Inputs of the right shape and dtype: N(0,1) floats, small non-negative integers."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in spec.items():
        if np.issubdtype(np.dtype(dtype), np.floating):
            out[name] = rng.standard_normal(shape).astype(dtype)
        elif np.dtype(dtype) == np.bool_:
            out[name] = np.ones(shape, dtype=bool)
        else:
            out[name] = rng.integers(0, 2, size=shape).astype(dtype)
    return out


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def check_model(
    source: str | os.PathLike,
    input_shapes: dict[str, Sequence[int]] | Sequence[int] | None = None,
    inputs: dict[str, np.ndarray] | None = None,
    name: str | None = None,
    repeats: int = 3,
) -> CheckReport:
    """Compile ``source``, run it on the CPU and against ONNX Runtime; time both.

    ``inputs`` defaults to random inputs of the compiled input spec; the timings are the
    median of ``repeats`` runs after one warm-up.
    """
    from av_infer.kernels.cpu import CpuPlanRunner
    from av_infer.model.compiler import compile_model

    t0 = time.perf_counter()
    plan = compile_model(source, input_shapes=input_shapes, name=name)
    compile_s = time.perf_counter() - t0
    unopt = compile_model(source, input_shapes=input_shapes, name=name, optimize=False)

    if inputs is None:
        inputs = random_inputs(plan.input_spec())
    runner = CpuPlanRunner(plan)
    arena = runner.new_arena()
    kernels = runner.bind(arena)

    def run_once() -> None:
        runner.write_inputs(arena, inputs)
        for k in kernels:
            k()

    run_once()
    run_s = _median_time(run_once, repeats)
    got = runner.read_outputs(arena)

    sess = ort_session(source)
    feed = {i.name: inputs[i.name] for i in sess.get_inputs()}
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
    ort_s = _median_time(lambda: sess.run(None, feed), repeats)

    per_output = {k: max_rel_err(got[k], want[k]) for k in want}
    return CheckReport(
        model=name or plan.name or Path(str(source)).stem,
        kernels=len(plan.kernels),
        kernels_unoptimized=len(unopt.kernels),
        onnx_nodes=int(plan.stats.get("nodes", 0)),
        weight_bytes=plan.weight_bytes,
        activation_bytes=plan.activation_bytes,
        compile_s=compile_s,
        run_s=run_s,
        ort_s=ort_s,
        max_rel_err=max(per_output.values()) if per_output else 0.0,
        per_output=per_output,
    )
