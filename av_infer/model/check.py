"""Compile a model, run it on the CPU executor and compare with ONNX Runtime (the oracle)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

#: Bound on :func:`max_rel_err` that the op-level tests hold av_infer to against ONNX Runtime
#: on the CPU. ``models check`` itself decides with :func:`allclose_report` (rtol/atol below).
CPU_TOLERANCE = 1e-4

#: Default ``numpy.allclose`` tolerances of ``check_model`` / ``av-infer models check``:
#: an output passes when every element has ``|cpu - ort| <= DEFAULT_ATOL + DEFAULT_RTOL * |ort|``.
#: Chosen from ONNX Runtime against itself: its own optimisation levels differ by up to
#: 1.4e-4 absolute on the scaled inception_v3 logits, so a tighter atol fails ORT too.
DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 5e-4


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


def _check_tolerances(rtol: float, atol: float) -> None:
    for label, v in (("rtol", rtol), ("atol", atol)):
        if not (np.isfinite(v) and v >= 0):
            raise ValueError(f"{label} must be a finite number >= 0, got {v!r}")


def allclose_report(got: np.ndarray, want: np.ndarray, rtol: float = DEFAULT_RTOL,
                    atol: float = DEFAULT_ATOL) -> dict:
    """Compare one output ``got`` with the reference ``want`` as ``numpy.allclose`` does.

    Returns a dict with

    * ``ok`` (bool): the shapes are equal and, for a floating-point ``want``, exactly
      ``numpy.allclose(got, want, rtol=rtol, atol=atol)`` (element-wise
      ``|got - want| <= atol + rtol * |want|``; NaN never passes, equal infinities do);
      for any other dtype of ``want`` (integers, bool, ...) ``numpy.array_equal`` — the
      tolerances do not apply. No broadcasting: a shape mismatch is never ok.
    * ``max_abs_err`` (float): ``max |got - want|`` in float64 (0 for equal elements,
      infinities included; NaN if an element is NaN; ``inf`` on a shape mismatch).
    * ``max_rel_err`` (float): :func:`max_rel_err`, the older scale-aware metric
      ``max |got - want| / max |want|`` (informational only).
    * ``worst_excess`` (float): ``max(|got - want| - (atol + rtol * |want|))`` over the
      elements, in float64; ``<= 0`` means every element is within tolerance (it agrees
      with ``ok`` up to float rounding exactly at the boundary). For non-float outputs the
      tolerance is 0, so it is ``max_abs_err``. 0.0 for empty outputs, ``inf`` on a shape
      mismatch, NaN if an element is NaN.

    Raises ``ValueError`` if ``rtol`` or ``atol`` is negative or not finite.
    """
    _check_tolerances(rtol, atol)
    got = np.asarray(got)
    want = np.asarray(want)
    with np.errstate(invalid="ignore", over="ignore"):
        rel = max_rel_err(got, want)
    if got.shape != want.shape:
        inf = float("inf")
        return {"ok": False, "max_abs_err": inf, "max_rel_err": rel, "worst_excess": inf}
    if want.size == 0:
        return {"ok": True, "max_abs_err": 0.0, "max_rel_err": rel, "worst_excess": 0.0}
    a = got.astype(np.float64)
    b = want.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(a == b, 0.0, np.abs(a - b))  # inf == inf: no inf - inf = NaN
        max_abs = float(np.max(diff))
        if np.issubdtype(want.dtype, np.floating):
            ok = bool(np.allclose(got, want, rtol=rtol, atol=atol))
            excess = float(np.max(diff - (atol + rtol * np.abs(b))))
        else:
            ok = bool(np.array_equal(got, want))
            excess = max_abs
    return {"ok": ok, "max_abs_err": max_abs, "max_rel_err": rel, "worst_excess": excess}


@dataclass
class CheckReport:
    """What ``av-infer models check`` prints and writes as JSON.

    ``per_output_detail`` maps each ONNX Runtime output name to its :func:`allclose_report`
    under ``rtol``/``atol``; ``per_output`` maps it to :func:`max_rel_err` alone.
    """

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
    rtol: float
    atol: float
    per_output_detail: dict[str, dict]

    @property
    def ok(self) -> bool:
        """Every output is allclose to ONNX Runtime's (``per_output_detail[...]["ok"]``)."""
        return all(d["ok"] for d in self.per_output_detail.values())

    @property
    def max_abs_err(self) -> float:
        """The largest ``max_abs_err`` over the outputs (0.0 when there are none)."""
        return max((d["max_abs_err"] for d in self.per_output_detail.values()), default=0.0)

    def to_dict(self) -> dict:
        """All fields plus ``ok``, ``max_abs_err`` and ``tolerance`` (= ``rtol``, the old key)."""
        d = asdict(self)
        d["ok"] = self.ok
        d["max_abs_err"] = self.max_abs_err
        d["tolerance"] = self.rtol
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


def median_time(fn, repeats: int) -> float:
    """Median wall time (s) of ``repeats`` calls of ``fn``."""
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
    *,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
) -> CheckReport:
    """Compile ``source``, run it on the CPU and against ONNX Runtime; time both.

    ``inputs`` defaults to random inputs of the compiled input spec; the timings are the
    median of ``repeats`` runs after one warm-up. The report is ``ok`` iff every ONNX
    Runtime output passes :func:`allclose_report` with ``rtol``/``atol`` (``ValueError``
    before any work if either is negative or not finite).
    """
    _check_tolerances(rtol, atol)
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
    run_s = median_time(run_once, repeats)
    got = runner.read_outputs(arena)

    sess = ort_session(source)
    feed = {i.name: inputs[i.name] for i in sess.get_inputs()}
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
    ort_s = median_time(lambda: sess.run(None, feed), repeats)

    detail = {k: allclose_report(got[k], want[k], rtol=rtol, atol=atol) for k in want}
    per_output = {k: d["max_rel_err"] for k, d in detail.items()}
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
        rtol=rtol,
        atol=atol,
        per_output_detail=detail,
    )
