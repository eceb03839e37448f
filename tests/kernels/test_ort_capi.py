"""ONNX Runtime through its C API (``av_infer._cy.ort_capi``) against its Python binding.

The two ways into ORT must be one behaviour: the same numbers bit for bit, the same kill,
the same zero-copy rebinding, typed refusals, and a said reason where "auto" cannot take
the C API. Behaviour only, no timings.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

from av_infer import Runtime
from av_infer._cy import ort_capi
from av_infer.devices import os_priority
from av_infer.devices.cpu import CpuDevice
from av_infer.errors import InvalidParameterError
from av_infer.kernels.ort_segments import (
    SegmentRunner,
    is_kill,
    measure_kill_cost,
    resolve_api,
)
from av_infer.model import zoo
from av_infer.model.segments import compile_segments

pytestmark = pytest.mark.skipif(
    ort_capi.available() is not None,
    reason=f"ORT's C API cannot load here: {ort_capi.available()}")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _relu_model(dtype: int = TensorProto.FLOAT, n: int = 4) -> bytes:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", dtype, [n])],
                          [helper.make_tensor_value_info("y", dtype, [n])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    return m.SerializeToString()


def test_the_library_is_the_python_packages_release():
    path, version = ort_capi.load()
    assert version == onnxruntime.__version__
    assert os.path.exists(path)
    assert resolve_api("auto") == ("c", None)
    assert resolve_api("python") == ("python", None)
    with pytest.raises(ValueError):
        resolve_api("cuda")


@pytest.mark.parametrize("name,segment_ms", [("tiny_mlp", None), ("resnet152", 0.05),
                                              ("densenet201", 0.05), ("distilbert", None)])
def test_c_api_and_python_binding_give_the_same_bits(name, segment_ms):
    variant = "scaled" if name != "tiny_mlp" else "full"
    path = zoo.path(name, variant)
    plan = compile_segments(path, segment_ms=segment_ms, name=name)
    x = zoo.sample_inputs(name, variant, seed=3)
    c, py = SegmentRunner(plan, api="c"), SegmentRunner(plan, api="python")
    assert (c.api, py.api) == ("c", "python")
    got, want = c.run(x), py.run(x)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k


def test_a_terminated_run_is_a_kill_and_the_segment_reruns_to_the_same_bits():
    plan = compile_segments(zoo.path("resnet152", "scaled"), segment_ms=0.05)
    r = SegmentRunner(plan, api="c")
    x = zoo.sample_inputs("resnet152", "scaled", seed=2)
    ref = r.run(x)
    arena = r.new_arena()
    fns = r.bind(arena)
    r.write_inputs(arena, x)
    killed = r.run_options()
    killed.terminate = True
    assert killed.terminate
    with pytest.raises(ort_capi.Terminated) as e:
        fns[0](killed)
    assert is_kill(e.value)
    killed.terminate = False  # unset: the same options run again
    for f in fns:
        f(killed)
    out = r.read_outputs(arena)
    assert all(np.array_equal(out[k], ref[k]) for k in ref)


@pytest.fixture(scope="module")
def long_segment() -> tuple[ort_capi.BoundSegment, tuple[np.ndarray, np.ndarray]]:
    """A bound 200-MatMul chain (tens of ms a run; its session takes seconds to make: one
    for the module) and its arrays (kept alive with it)."""
    from tests.devices.test_cpu_engine import _chain_model

    seg = ort_capi.BoundSegment(ort_capi.Session(_chain_model(200, 256).SerializeToString()),
                                ("x",), ("y",))
    x = np.ones((64, 256), np.float32)
    y = np.zeros((64, 256), np.float32)
    seg.bind_input("x", x.dtype, x.shape, x.ctypes.data)
    seg.bind_output("y", y.dtype, y.shape, y.ctypes.data)
    return seg, (x, y)


def test_terminate_from_another_thread_stops_a_long_run(long_segment):
    seg, _arrays = long_segment
    ro = ort_capi.RunOptions()
    started, result = threading.Event(), []

    def run():
        started.set()
        try:
            while True:  # runs until a terminate lands inside (or before) one run
                seg(ro)
        except BaseException as e:  # noqa: BLE001 - the kill is the point
            result.append(e)

    t = threading.Thread(target=run)
    t.start()
    started.wait()
    ro.terminate = True  # another thread: the GIL is released while ORT runs
    t.join(60)
    assert not t.is_alive() and len(result) == 1 and is_kill(result[0])


def _watch_runs(seg, ro, arm, want: int) -> tuple[set[int], list[int], list[bool]]:
    """Run ``seg`` on a thread, ``arm(ro, tid)`` before each run, until a watcher sees the
    thread at nice ``want`` (or 2000 runs); returns (nice values seen while it ran, the
    thread's nice after each run, whether ``ro`` was still armed after each run)."""
    seen: set[int] = set()
    after: list[int] = []
    armed_after: list[bool] = []
    stop = threading.Event()

    def run():
        tid = threading.get_native_id()
        for _ in range(2000):
            if stop.is_set():
                break
            arm(ro, tid)
            seg(ro)
            after.append(os_priority.current_nice())
            armed_after.append(ro.armed_nice is not None)
        stop.set()

    t = threading.Thread(target=run)
    t.start()
    while not stop.is_set():
        try:
            n = os.getpriority(os.PRIO_PROCESS, t.native_id)
        except OSError:  # the thread has ended
            break
        seen.add(n)
        if n == want:
            stop.set()
        time.sleep(0.0002)  # the GIL to the runner between its runs
    t.join(120)
    assert not t.is_alive()
    return seen, after, armed_after


@pytest.mark.skipif(not os_priority.can_restore(),
                    reason="this process may not raise a thread's priority back")
def test_an_armed_run_renices_its_thread_only_while_ort_runs(long_segment):
    """``RunOptions.nice_next_run``: the thread runs the model at the armed nice (seen from
    another thread while ORT runs) and has its own back when the call returns; the arming
    holds for one run."""
    seg, _arrays = long_segment
    own = os_priority.current_nice()
    low = min(19, own + 5)
    seen, after, armed_after = _watch_runs(
        seg, ort_capi.RunOptions(), lambda ro, tid: ro.nice_next_run(tid, low, own, 19), low)
    assert low in seen
    assert after and set(after) == {own}
    assert not any(armed_after)


@pytest.mark.skipif(not os_priority.can_restore(),
                    reason="this process may not raise a thread's priority back")
def test_a_kill_lowers_an_armed_run_only_while_it_is_inside_ort(long_segment):
    """``lower_in_run``: the thread of an armed run inside ORT drops to the armed ``killed``
    nice (and the run gives its own back when it returns); once the run has returned, a
    kill lowers nothing, so a kill landing as a run ends never leaves its thread low."""
    seg, _arrays = long_segment
    own = os_priority.current_nice()
    low, killed = min(19, own + 5), 19
    ro = ort_capi.RunOptions()
    after: list[int] = []
    tid: list[int] = []
    go, done = threading.Event(), threading.Event()

    def run():
        tid.append(threading.get_native_id())
        go.set()
        while not done.is_set():
            ro.nice_next_run(tid[0], low, own, killed)
            try:
                seg(ro)
            except ort_capi.OrtRunError:
                pass  # terminated: the watcher's kill (or its retry's leftover)
            after.append(os_priority.current_nice())

    t = threading.Thread(target=run)
    t.start()
    go.wait()
    lowered = False
    for _ in range(100_000):  # until a kill lands while a run is inside ORT
        if os.getpriority(os.PRIO_PROCESS, tid[0]) != low:
            time.sleep(0.0002)  # the GIL to the runner between its runs
            continue
        ro.terminate = True
        lowered = ro.lower_in_run()
        if lowered:
            break
        ro.terminate = False  # the run had returned in between: again
    done.set()
    t.join(120)
    assert not t.is_alive() and lowered
    assert after and set(after) == {own}  # every run gave the thread its own back
    assert ro.lower_in_run() is False  # no run inside ORT: nothing to lower


@pytest.mark.skipif(not os_priority.can_restore(),
                    reason="this process may not raise a thread's priority back")
def test_a_lowering_before_the_armed_run_enters_makes_it_run_at_the_killed_nice(
        long_segment):
    """A preempted run the lane keeps (kill off) may be lowered before it has entered ORT:
    ``lower_in_run`` then finds no run to lower (False) and the run enters at ``killed``
    instead of its armed nice; the next arming clears that (it runs at its armed nice)."""
    seg, _arrays = long_segment
    own = os_priority.current_nice()
    low, killed = min(18, own + 5), 19
    returned: list[bool] = []

    def arm_and_lower(ro, tid):
        ro.nice_next_run(tid, low, own, killed)
        returned.append(ro.lower_in_run())

    ro = ort_capi.RunOptions()
    seen, after, _ = _watch_runs(seg, ro, arm_and_lower, killed)
    assert killed in seen and low not in seen
    assert returned and not any(returned)
    assert after and set(after) == {own}
    seen, after, _ = _watch_runs(
        seg, ro, lambda r, tid: r.nice_next_run(tid, low, own, killed), low)
    assert low in seen and killed not in seen
    assert set(after) == {own}


def test_rebinding_reads_the_new_array():
    seg = ort_capi.BoundSegment(ort_capi.Session(_relu_model()), ("x",), ("y",))
    a = np.array([-1, 2, -3, 4], np.float32)
    b = np.array([5, -6, 7, -8], np.float32)
    y = np.zeros(4, np.float32)
    seg.bind_output("y", y.dtype, y.shape, y.ctypes.data)
    ro = ort_capi.RunOptions()
    seg.bind_input("x", a.dtype, a.shape, a.ctypes.data)
    seg(ro)
    assert y.tolist() == [0, 2, 0, 4]
    seg.bind_input("x", b.dtype, b.shape, b.ctypes.data)
    seg(ro)
    assert y.tolist() == [5, 0, 7, 0]


@pytest.mark.parametrize("dtype,np_dtype", [(TensorProto.INT32, np.int32),
                                            (TensorProto.DOUBLE, np.float64),
                                            (TensorProto.FLOAT16, np.float16),
                                            (TensorProto.INT8, np.int8)])
def test_element_types_map_to_their_onnx_codes(dtype, np_dtype):
    seg = ort_capi.BoundSegment(ort_capi.Session(_relu_model(dtype)), ("x",), ("y",))
    x = np.array([-1, 2, -3, 4], np_dtype)
    y = np.zeros(4, np_dtype)
    seg.bind_input("x", x.dtype, x.shape, x.ctypes.data)
    seg.bind_output("y", y.dtype, y.shape, y.ctypes.data)
    seg(ort_capi.RunOptions())
    assert y.tolist() == [0, 2, 0, 4]


def test_orts_errors_are_typed_with_orts_message():
    with pytest.raises(ort_capi.OrtRunError, match="protobuf"):
        ort_capi.Session(b"not a model")
    seg = ort_capi.BoundSegment(ort_capi.Session(_relu_model()), ("x",), ("y",))
    x = np.zeros(3, np.float32)  # the model takes 4: ORT refuses the run, the thread lives
    y = np.zeros(4, np.float32)
    seg.bind_input("x", x.dtype, x.shape, x.ctypes.data)
    seg.bind_output("y", y.dtype, y.shape, y.ctypes.data)
    with pytest.raises(ort_capi.OrtRunError) as e:
        seg(ort_capi.RunOptions())
    assert not isinstance(e.value, ort_capi.Terminated) and not is_kill(e.value)
    with pytest.raises(ort_capi.OrtRunError, match="dtype"):
        seg.bind_input("x", np.dtype("complex64"), (4,), x.ctypes.data)
    with pytest.raises(ValueError):
        ort_capi.Session(_relu_model(), level="fast")


def test_kill_cost_is_measured_on_either_api():
    assert measure_kill_cost(api="c") > 0
    assert measure_kill_cost(api="python") > 0


def test_the_cpu_device_says_which_api_it_took():
    d = CpuDevice(ort_api="c")
    t = d.telemetry()
    assert (t["ort_api"], t["ort_api_reason"]) == ("c", None)
    assert CpuDevice(ort_api="python").telemetry()["ort_api"] == "python"
    assert CpuDevice(engine="numpy").telemetry()["ort_api"] is None
    with pytest.raises(InvalidParameterError, match="ort_api"):
        CpuDevice(ort_api="cuda")


@pytest.mark.parametrize("api", ["c", "python"])
def test_a_runtime_serves_through_either_api_with_the_same_answers(api):
    m = zoo.path("tiny_mlp", "full")
    x = zoo.sample_inputs("tiny_mlp", "full", seed=4)
    with Runtime(CpuDevice(ort_api=api), max_be_streams=1) as rt:
        rt.load_model("m", m)
        got = rt.infer("m", x, priority="RT").outputs
        be = rt.submit("m", x, priority="BE").result(60).outputs
        assert rt.device.telemetry()["ort_api"] == api
    ref = SegmentRunner(compile_segments(m, segment_ms=None), api="python").run(x)
    for k in ref:
        assert np.array_equal(got[k], ref[k]) and np.array_equal(be[k], ref[k])


def _in_subprocess(code: str, **env: str) -> str:
    e = dict(os.environ, PYTHONPATH=ROOT, **env)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize("lib,why", [("/nonexistent/libonnxruntime.so", "dlopen failed"),
                                     ("libm.so.6", "no OrtGetApiBase")])
def test_auto_says_why_it_took_the_python_binding(lib, why):
    out = _in_subprocess(
        "from av_infer.devices.cpu import CpuDevice\n"
        "from av_infer.errors import InvalidParameterError\n"
        "d = CpuDevice()\n"
        "print(d.ort_api, '|', d.ort_api_reason)\n"
        "try:\n"
        "    CpuDevice(ort_api='c')\n"
        "except InvalidParameterError as e:\n"
        "    print('refused |', e)\n",
        AV_INFER_ORT_LIB=lib)
    first, second = out.splitlines()[-2:]
    assert first.startswith("python |") and why in first
    assert second.startswith("refused |") and why in second


def test_the_environment_picks_the_api_and_c_is_never_a_silent_fallback():
    out = _in_subprocess("from av_infer.devices.cpu import CpuDevice\n"
                         "print(CpuDevice().ort_api)", AV_INFER_ORT_API="python")
    assert out.splitlines()[-1] == "python"
    out = _in_subprocess(
        "from av_infer.errors import UnsupportedModelError\n"
        "from av_infer.kernels.ort_segments import resolve_api\n"
        "try:\n"
        "    resolve_api('c')\n"
        "except UnsupportedModelError as e:\n"
        "    print('refused |', e)\n", AV_INFER_ORT_LIB="/nonexistent.so")
    assert out.splitlines()[-1].startswith("refused |") and "dlopen failed" in out


def test_an_ort_error_in_a_c_api_run_answers_the_request_typed_and_the_next_one_runs():
    """ORT refusing a run on the C API path (here: an input rebound to the wrong length)
    answers that request with DeviceFaultError carrying ORT's message; the failed task's
    buffers are not pooled, so the next request runs clean."""
    from av_infer.errors import DeviceFaultError

    m = _relu_model()
    with Runtime(CpuDevice(ort_api="c"), max_be_streams=1) as rt:
        rt.load_model("relu", m)
        runner = rt._reg.models["relu"].handle.runner
        assert runner.api == "c"
        short = np.zeros(3, np.float32)
        bind = runner.bind

        def bad_bind(arena):
            fns = bind(arena)
            fns[0].bind_input("x", short.dtype, short.shape, short.ctypes.data)
            return fns

        runner.bind = bad_bind
        x = {"x": np.array([-1, 2, -3, 4], np.float32)}
        with pytest.raises(DeviceFaultError, match="ONNXRuntimeError"):
            rt.infer("relu", x, priority="RT")
        runner.bind = bind
        out = rt.infer("relu", x, priority="RT").outputs
        assert next(iter(out.values())).tolist() == [0, 2, 0, 4]
