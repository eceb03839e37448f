"""The ONNX Runtime executor of segment plans (``model.segments``): the cpu device's fast engine.

``SegmentRunner`` has the executor contract of :class:`~av_infer.kernels.cpu.CpuPlanRunner`
(``new_arena``/``bind``/``write_inputs``/``read_outputs``/``run``), so the cpu device runs
both kinds of plan through one lane loop. Differences that matter to the device:

* one ORT session per segment, built once per plan with a fixed intra-op thread count
  (deterministic results: golden preemption tests stay bit-identical);
* ``bind`` returns per segment a callable taking an ``onnxruntime.RunOptions``: the run
  reads and writes the task's arena in place through I/O binding (no copies between
  segments) and releases the GIL for its whole duration; setting ``terminate`` on those
  options from another thread aborts it between two ORT kernels (``killable``), after which
  ``is_kill(exc)`` recognises the exception it raised;
* a killed segment may have written part of its outputs; nothing else. Re-running it
  overwrites them entirely (segment outputs have their own arena regions).

Two ways into ONNX Runtime, one behaviour (``api=``, ``ORT_APIS``): "c" calls ORT's C API
(``av_infer._cy.ort_capi``: the ``libonnxruntime`` the wheel ships, one ``RunWithBinding``
call a launch, a kill returned as a status), "python" its Python binding
(``run_with_iobinding``); "auto" takes "c" where that library loads (same release as the
Python package) and says why not otherwise (``resolve_api``). Same sessions options, same
kernels, the same numbers (``tests/kernels/test_ort_capi.py`` compares them bit for bit).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from av_infer.errors import UnsupportedModelError
from av_infer.kernels.cpu_base import ArenaIO, aligned_empty, tensor_view
from av_infer.model.plan import Plan
from av_infer.model.segments import SEGMENT_KIND, SegmentProgram, ort_options

__all__ = ["ORT_APIS", "SegmentRunner", "is_kill", "is_segment_plan", "measure_cut_cost",
           "measure_kill_cost", "resolve_api"]

_KILL_TEXT = "terminate flag"

#: the ways into ONNX Runtime a segment runner can take (module docstring)
ORT_APIS = ("auto", "c", "python")


def resolve_api(api: str = "auto") -> tuple[str, str | None]:
    """``(api, why)``: the API a runner asked for ``api`` uses, "c" or "python", and, when
    "auto" could not take the C API, why (None otherwise). ``api="c"`` where the C API
    cannot be used raises ``UnsupportedModelError`` with the reason; an unknown name
    ``ValueError``."""
    if api not in ORT_APIS:
        raise ValueError(f"ort api must be one of {ORT_APIS}, got {api!r}")
    if api == "python":
        return "python", None
    from av_infer._cy import ort_capi

    why = ort_capi.available()
    if why is None:
        return "c", None
    if api == "c":
        raise UnsupportedModelError({}, f"ONNX Runtime's C API cannot be used: {why}")
    return "python", why


def measure_kill_cost(threads: int = 1, runs: int = 7, api: str = "auto") -> float:
    """CPU seconds a run aborted by ``RunOptions.terminate`` costs its thread after ORT stops
    (median of ``runs`` runs of a one-node graph, terminated before they start, through
    I/O binding like a segment, on the ``api`` the segments use). Through the Python
    binding: 0.25-0.30 ms whatever the model on a slow 2-core VM (C++ exception unwinding
    and message formatting in the binding, not kernel work; docs/cpu_engine.md); through the
    C API a fraction of that. A segment with less than this left finishes sooner than a kill
    stops it, and keeps its work."""
    import time

    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "kill_cost",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what every ONNX Runtime release reads
    x, y = np.zeros(1, np.float32), np.zeros(1, np.float32)
    engine = _Engine(resolve_api(api)[0], threads)
    fn = engine.bound(engine.session(model.SerializeToString()), ("x",), ("y",))
    fn.bind_input("x", x.dtype, [1], x.ctypes.data)
    fn.bind_output("y", y.dtype, [1], y.ctypes.data)
    times = []
    for _ in range(runs):
        ro = engine.run_options()
        ro.terminate = True
        t0 = time.thread_time()  # this thread's CPU: other processes' load is not its cost
        try:
            fn(ro)
        except Exception as e:  # noqa: BLE001 - the kill is the point
            if not is_kill(e):
                raise
        times.append(time.thread_time() - t0)
    return float(np.median(times))


def measure_cut_cost(cut: Plan, whole: Plan, threads: int = 1, api: str = "auto",
                     budget_s: float = 1.0, min_rounds: int = 3, max_rounds: int = 9) -> float:
    """How much longer ``cut`` runs than ``whole`` (the same model in one segment), as a
    fraction: the median over rounds of (cut's time / whole's time) - 1, each round one run
    of each in alternating order, time as this thread's CPU time (another process's load
    is not the plans' cost), both on fresh arenas bound like the device binds them, with
    the same inputs (random, seeded). Rounds: at least ``min_rounds``, then more while the
    measuring has taken less than ``budget_s``, at most ``max_rounds``. Used by the cpu
    device at load (``compile_segments(cut_cost=...)``): a few runs of the model, on the
    machine and API that will run it."""
    import time

    from av_infer.model.check import random_inputs

    spec = {n: (whole.tensors[n].shape, whole.tensors[n].dtype) for n in whole.inputs}
    feeds = random_inputs(spec, seed=0)
    runs = []
    for plan in (cut, whole):
        r = SegmentRunner(plan, threads=threads, api=api)
        arena = r.new_arena()
        fns = r.bind(arena)
        r.write_inputs(arena, feeds)
        runs.append((fns, r.run_options(), arena))  # the arena lives while fns run

    def once(k: int) -> float:
        fns, ro, _ = runs[k]
        t0 = time.thread_time()
        for f in fns:
            f(ro)
        return time.thread_time() - t0

    once(0), once(1)  # warm: first runs allocate
    ratios: list[float] = []
    start = time.perf_counter()
    while len(ratios) < max_rounds and (len(ratios) < min_rounds
                                        or time.perf_counter() - start < budget_s):
        t = {k: once(k) for k in ((1, 0) if len(ratios) % 2 else (0, 1))}
        if t[1] > 0:
            ratios.append(t[0] / t[1])
    return float(np.median(ratios)) - 1.0 if ratios else 0.0


class _Engine:
    """One way into ONNX Runtime ("c" or "python"): how its sessions, bound segments and
    run options are made (the one place that differs between the two APIs)."""

    def __init__(self, api: str, threads: int) -> None:
        self.api, self.threads = api, int(threads)
        if api == "c":
            from av_infer._cy import ort_capi

            self._capi: Any = ort_capi
            self.run_options: Callable[[], Any] = ort_capi.RunOptions
            #: runs renice their own thread with the GIL released: their run options'
            #: ``nice_next_run`` and ``lower_in_run`` (``ort_capi.RunOptions``); False where
            #: the API cannot (the Python binding takes the GIL back inside its own call):
            #: the device renices around the run instead
            self.nice_in_run = True
        else:
            import onnxruntime as ort

            self._capi, self._ort = None, ort
            self.run_options = ort.RunOptions
            self.nice_in_run = False

    def session(self, onnx_bytes: bytes) -> Any:
        if self._capi is not None:
            return self._capi.Session(onnx_bytes, self.threads)
        return self._ort.InferenceSession(onnx_bytes, ort_options(self.threads),
                                          providers=["CPUExecutionProvider"])

    def bound(self, sess: Any, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> Any:
        """A segment of ``sess`` with nothing bound yet: ``bind_input``/``bind_output``,
        then ``fn(run_options)``."""
        if self._capi is not None:
            return self._capi.BoundSegment(sess, tuple(inputs), tuple(outputs))
        return _SegmentFn(sess, sess.io_binding(), inputs, outputs)


def is_segment_plan(plan: Plan) -> bool:
    """True for plans made by ``model.segments.compile_segments``."""
    return bool(plan.kernels) and all(k.kind == SEGMENT_KIND for k in plan.kernels)


def is_kill(exc: BaseException) -> bool:
    """The exception a run raises when its ``RunOptions.terminate`` was set (ORT's message,
    through either API)."""
    return _KILL_TEXT in str(exc)


class SegmentRunner(ArenaIO):
    """Runs a segment plan segment by segment with ONNX Runtime on preallocated arenas."""

    #: runs accept RunOptions whose ``terminate`` aborts them (the device's kill)
    killable = True

    def __init__(self, plan: Plan, threads: int = 1, api: str = "auto") -> None:
        """``api``: "auto", "c" or "python" (module docstring; ``resolve_api``). ``api`` then
        reads the one taken, ``api_reason`` why "auto" did not take the C API (or None)."""
        if not is_segment_plan(plan) or len(plan.segments) != len(plan.kernels):
            raise UnsupportedModelError({}, f"plan {plan.name!r} is not a segment plan")
        self.plan = plan
        self.threads = int(threads)
        self.api, self.api_reason = resolve_api(api)
        self._engine = _Engine(self.api, self.threads)
        #: the engine's ``nice_in_run`` (its runs renice their thread without the GIL)
        self.nice_in_run = self._engine.nice_in_run
        self.sessions: list[Any] = []
        for k in plan.kernels:
            prog: SegmentProgram = plan.segments[k.args["segment"]]
            try:
                self.sessions.append(self._engine.session(prog.onnx))
            except Exception as e:  # noqa: BLE001 - ORT's own exception types
                raise UnsupportedModelError(
                    {}, f"ONNX Runtime refused segment {k.index} of {plan.name!r}: "
                    f"{str(e).strip().splitlines()[0] if str(e).strip() else e}") from e
        #: bytes of the initializers the sessions hold (what the model keeps resident)
        self.weight_bytes = plan.weight_bytes
        self._views = {n: (plan.tensors[n], plan.buffers[plan.tensors[n].buffer].offset)
                       for n in plan.tensors}

    # -- arenas ---------------------------------------------------------------------------
    def new_arena(self) -> np.ndarray:
        return aligned_empty(max(int(self.plan.arena_bytes), 1))

    def view(self, arena: np.ndarray, name: str) -> np.ndarray:
        t, off = self._views[name]
        return tensor_view(arena, t, off)

    def bind(self, arena: np.ndarray) -> list[Callable[[Any], None]]:
        """Per segment ``fn(run_options)``: runs it on ``arena`` (I/O bound in place)."""
        if arena.dtype != np.uint8 or arena.ndim != 1 or arena.size < self.plan.arena_bytes:
            raise ValueError(f"arena must be a 1-D uint8 array of >= "
                             f"{self.plan.arena_bytes} bytes")
        fns = []
        for k, sess in zip(self.plan.kernels, self.sessions):
            fn = self._engine.bound(sess, k.inputs, k.outputs)
            for name in k.inputs:
                v = self.view(arena, name)
                fn.bind_input(name, v.dtype, list(v.shape), v.ctypes.data)
            for name in k.outputs:
                v = self.view(arena, name)
                fn.bind_output(name, v.dtype, list(v.shape), v.ctypes.data)
            fns.append(fn)
        return fns

    @staticmethod
    def rebind(fns: list[Any], name: str, array: np.ndarray) -> None:
        """Point every segment that reads or writes tensor ``name`` at ``array`` (C-contiguous,
        the tensor's shape and dtype; the caller keeps it alive while ``fns`` may run).
        Zero-copy inputs and outputs: a request's own arrays become the task's buffers."""
        shape, ptr = list(array.shape), array.ctypes.data
        for f in fns:
            if name in f.inputs:
                f.bind_input(name, array.dtype, shape, ptr)
            if name in f.outputs:
                f.bind_output(name, array.dtype, shape, ptr)

    # -- I/O: write_inputs / read_outputs from ArenaIO ------------------------------------
    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Convenience: new arena, write inputs, run every segment, return outputs."""
        arena = self.new_arena()
        fns = self.bind(arena)
        self.write_inputs(arena, inputs)
        ro = self._engine.run_options()
        for f in fns:
            f(ro)
        return self.read_outputs(arena)

    def run_options(self) -> Any:
        """Fresh options for one launch (the device sets ``terminate`` on them to kill)."""
        return self._engine.run_options()


class _SegmentFn:
    """One bound segment: ``fn(run_options)`` runs it (GIL released for the whole run).

    Calls the pybind layer of the pinned ORT (``InferenceSession._sess``,
    ``IOBinding._iobinding``) when present: the public wrappers cost ~20 us of Python per
    call, a large share of a 1 ms model; the public API is used where those are missing."""

    __slots__ = ("_run", "_io", "_bin", "_bout", "_cdev", "io", "inputs", "outputs", "call")

    def __init__(self, sess: Any, io: Any, inputs: tuple[str, ...],
                 outputs: tuple[str, ...]) -> None:
        self.io, self.inputs, self.outputs = io, inputs, outputs
        raw_sess, raw_io = getattr(sess, "_sess", None), getattr(io, "_iobinding", None)
        try:
            from onnxruntime.capi.onnxruntime_inference_collection import OrtDevice

            self._cdev = OrtDevice.make("cpu", 0)._get_c_device()
        except (ImportError, AttributeError):
            raw_sess = None
        if raw_sess is not None and raw_io is not None and hasattr(raw_sess, "run_with_iobinding"):
            self._run, self._io = raw_sess.run_with_iobinding, raw_io
            self._bin, self._bout = raw_io.bind_input, raw_io.bind_output
        else:  # public API
            self._run, self._io, self._cdev = sess.run_with_iobinding, io, None
            self._bin, self._bout = io.bind_input, io.bind_output
        #: ``call(run_options)`` runs the segment with no Python frame of ours in between
        #: (a C partial over the pybind call; what the cpu device's lanes call per launch).
        #: Re-binding mutates the same IOBinding, so it stays valid after ``rebind``
        self.call = functools.partial(self._run, self._io)

    def bind_input(self, name: str, dtype: Any, shape: list[int], ptr: int) -> None:
        if self._cdev is None:
            self._bin(name, "cpu", 0, dtype, shape, ptr)
        else:
            self._bin(name, self._cdev, dtype, shape, ptr)

    def bind_output(self, name: str, dtype: Any, shape: list[int], ptr: int) -> None:
        if self._cdev is None:
            self._bout(name, "cpu", 0, dtype, shape, ptr)
        else:
            self._bout(name, self._cdev, dtype, shape, ptr)

    def __call__(self, ro: Any) -> None:
        self._run(self._io, ro)
