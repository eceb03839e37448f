"""The cpu device's ONNX Runtime engine: segment plans, kill, restore, helping, faults.

Behaviour only (no timing assertions): waits are on conditions, never on elapsed time.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from av_infer import Runtime
from av_infer.devices import os_priority
from av_infer.devices.base import Completion
from av_infer.devices.cpu import CpuDevice
from av_infer.errors import DeviceFaultError, UnknownModelError, UnsupportedModelError
from av_infer.kernels.ort_segments import SegmentRunner, is_kill, is_segment_plan, resolve_api
from av_infer.model import exported, zoo
from av_infer.model.check import ort_session
from av_infer.model.segments import SEGMENT_KIND, compile_segments
from tests.sched.test_golden_preemption import GateDevice


def _allclose(got: dict, want: dict) -> bool:
    return all(np.allclose(got[k], want[k], rtol=1e-4, atol=1e-5) for k in want)


def _ort(path, x: dict) -> dict:
    s = ort_session(str(path), threads=1)
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, x)))


def _chain_model(n: int = 60, size: int = 256) -> onnx.ModelProto:
    """A long single-thread model (n MatMul+Tanh pairs): long enough to be killed mid-run."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    cur = "x"
    for i in range(n):
        w = helper.make_tensor(f"w{i}", TensorProto.FLOAT, [size, size],
                               (rng.standard_normal((size, size)) * 0.05).astype(np.float32)
                               .ravel().tolist())
        inits.append(w)
        nodes.append(helper.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"t{i}"]))
        cur = f"t{i}"
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [64, size])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [64, size])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


# -- compiling and running segment plans -------------------------------------------------------
@pytest.mark.parametrize("name", ["resnet152", "densenet201", "distilbert"])
def test_segment_plan_matches_ort_and_is_cut(name):
    path = zoo.path(name, "scaled")
    whole = compile_segments(path, segment_ms=None, name=name)
    cut = compile_segments(path, segment_ms=0.05, name=name)
    assert is_segment_plan(whole) and len(whole.kernels) == 1
    assert len(cut.kernels) >= 2 and all(k.kind == SEGMENT_KIND for k in cut.kernels)
    x = zoo.sample_inputs(name, "scaled", seed=1)
    ref = _ort(path, x)
    assert _allclose(SegmentRunner(whole).run(x), ref)
    assert _allclose(SegmentRunner(cut).run(x), ref)
    # every crossing tensor has its own arena region: nothing is ever reused
    regions = sorted((b.offset, b.offset + b.nbytes) for b in cut.buffers.values())
    assert all(a[1] <= b[0] for a, b in zip(regions, regions[1:]))
    assert cut.weight_bytes > 0


def test_segments_are_idempotent_and_restore_after_a_kill():
    """Re-running any segment, after a complete run or after a killed partial run of it,
    gives bit-identical outputs: the precondition of restore (and of kill)."""
    plan = compile_segments(zoo.path("resnet152", "scaled"), segment_ms=0.05)
    r = SegmentRunner(plan)
    x = zoo.sample_inputs("resnet152", "scaled", seed=2)
    ref = r.run(x)
    n = len(plan.kernels)
    for k in range(n):
        arena = r.new_arena()
        fns = r.bind(arena)
        r.write_inputs(arena, x)
        for i in range(k + 1):
            fns[i](r.run_options())
        killed = r.run_options()
        killed.terminate = True  # set before the run: ORT stops at its first kernel
        with pytest.raises(Exception) as e:
            fns[k](killed)
        assert is_kill(e.value)
        for i in range(k, n):  # restore from the killed segment
            fns[i](r.run_options())
        out = r.read_outputs(arena)
        for o in ref:
            assert np.array_equal(out[o], ref[o]), (k, o)


def test_ort_refusing_a_model_is_a_typed_load_error():
    g = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example")],
                          "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.example", 1)])
    m.ir_version = 8
    with pytest.raises(UnsupportedModelError, match="ONNX Runtime refused"):
        compile_segments(m)
    with Runtime("cpu") as rt, pytest.raises(UnsupportedModelError):
        rt.load_model("bad", m.SerializeToString())


# -- the device: kill, flag, faults -------------------------------------------------------------
def _start_chain(dev: CpuDevice) -> tuple[int, list[Completion], threading.Event]:
    """Start ``dev`` with task 1 of the chain model loaded and its input written; returns
    (stream, completions seen, set on each completion)."""
    h = dev.load_plan(compile_segments(_chain_model(), segment_ms=None))
    done = threading.Event()
    comps: list[Completion] = []

    def on_complete(c: Completion) -> None:
        comps.append(c)
        done.set()

    s = dev.open_stream(0)
    dev.start(on_complete)
    dev.new_task(h, 1)
    dev.write_inputs(1, {"x": np.ones((64, 256), np.float32)})
    return s, comps, done


def _kill_while_running(dev: CpuDevice, s: int, comps: list, done: threading.Event) -> None:
    """Launch task 1's segment 0 on stream ``s`` and raise the flag while it runs; returns
    when the launch has completed. On a busy machine this thread may not run before the
    segment ends: then it is simply run again (the bound is only a hang guard)."""
    lane = dev._lanes[s]
    for _attempt in range(200):
        comps.clear()
        done.clear()
        dev.enqueue(s, 1, 0, 0)
        while not (lane.busy or done.is_set()):  # wait until the segment is running
            threading.Event().wait(0.0005)
        if not done.is_set():
            dev.reset(s)
            dev.set_preempt(s, True)
            break
        assert comps[-1].executed is True
    else:
        pytest.fail("the chain model always finished before it could be killed")
    assert done.wait(60)


def test_raising_the_flag_kills_the_running_segment_and_reports_when_it_stopped():
    # kill_below_ms=0: always kill (the "almost done" estimate uses wall time, which a busy
    # machine stretches: the segment would be left to finish)
    dev = CpuDevice(c=1, be_nice=0, kill_below_ms=0.0)
    try:
        s, comps, done = _start_chain(dev)
        _kill_while_running(dev, s, comps, done)
        c = comps[0]
        assert c.executed is False  # killed: counts as evicted, restored from its start
        assert c.t_start <= c.t_stop <= c.t_end
        tel = dev.telemetry()
        assert tel["streams"][s]["killed"] == 1 and tel["kill_ms"]["count"] == 1
        # restored: the same launch runs to completion and gives the reference outputs
        dev.set_preempt(s, False)
        done.clear()
        dev.enqueue(s, 1, 0, 0)
        assert done.wait(60) and comps[1].executed is True
        want = _ort_model(_chain_model(), {"x": np.ones((64, 256), np.float32)})
        assert _allclose(dev.read_outputs(1), want)
    finally:
        dev.close()


_C_API_WHY = resolve_api("auto")[1]


#: Where only BE runs are niced (the process may raise a thread's priority back), on
#: both ORT APIs (the C one where it loads).
needs_renice_back = pytest.mark.skipif(
    not os_priority.can_restore(),
    reason="this process may not raise a thread's priority back: BE lane workers stay "
           "niced as a whole, and preempted runs are not reniced")
both_apis = pytest.mark.parametrize("api", [
    pytest.param("c", marks=pytest.mark.skipif(
        _C_API_WHY is not None, reason=f"ORT's C API cannot load here: {_C_API_WHY}")),
    "python"])


@pytest.fixture
def reniced(monkeypatch) -> list[tuple[int, int]]:
    """Every ``os_priority.set_thread_nice`` call (thread id, nice), still made."""
    calls: list[tuple[int, int]] = []
    real = os_priority.set_thread_nice

    def record(tid: int, nice: int) -> bool:
        calls.append((tid, nice))
        return real(tid, nice)

    monkeypatch.setattr(os_priority, "set_thread_nice", record)
    return calls


@needs_renice_back
@both_apis
def test_a_killed_run_drops_to_the_lowest_priority_until_it_stops(reniced, api):
    """Where only BE runs are niced, the flag that kills a running segment also drops its
    thread to nice 19 for what ORT still runs (lost work); once the run has returned, the
    thread has its own priority back. On the C API the run's own renices and the kill's
    are ordered inside the run options (``RunOptions.lower_in_run``); on the Python
    binding the lane renices the thread (recorded here)."""
    dev = CpuDevice(c=1, be_nice=10, kill_below_ms=0.0, ort_api=api)
    try:
        s, comps, done = _start_chain(dev)
        _kill_while_running(dev, s, comps, done)
        assert comps[0].executed is False
        worker = dev._lanes[s].thread
        lowered = dev.telemetry()["streams"][s]["kill_lowered"]
        # a kill landing between the lane's arming and the C run's start is read by the run
        # itself (it starts at 19 and no one lowers it): 0 or 1 there, 1 on the binding
        if api == "python":
            assert reniced == [(worker.native_id, os_priority.KILLED_NICE)] and lowered == 1
        else:
            assert reniced == [] and lowered in (0, 1)
        assert "while a model runs" in dev.telemetry()["streams"][s]["os_priority"]
        own = os_priority.current_nice()  # the worker's own: inherited from this thread
        assert os.getpriority(os.PRIO_PROCESS, worker.native_id) == own
    finally:
        dev.close()


@needs_renice_back
@both_apis
def test_with_kill_off_a_preempted_run_finishes_at_the_lowest_priority(reniced, api):
    """``kill=False``: the flag that preempts a running segment leaves it running (its work
    kept: it completes as executed, nothing is restored) and drops its thread to nice 19
    until it ends, so a waking RT thread takes the core at once; then the thread has its
    own priority back. On the Python binding the lane renices the thread (recorded here);
    on the C API the run options do (``lower_in_run``: counted only when the run was
    already inside ORT)."""
    dev = CpuDevice(c=1, be_nice=10, kill=False, kill_below_ms=0.0, ort_api=api)
    try:
        s, comps, done = _start_chain(dev)
        _kill_while_running(dev, s, comps, done)
        assert comps[0].executed is True  # kept: not evicted, not re-run
        tel = dev.telemetry()["streams"][s]
        assert tel["killed"] == 0 and tel["kill_lowered"] == 0
        worker = dev._lanes[s].thread
        if api == "python":
            assert reniced == [(worker.native_id, os_priority.KILLED_NICE)]
            assert tel["parked"] == 1
        else:
            assert reniced == [] and tel["parked"] in (0, 1)
        assert os.getpriority(os.PRIO_PROCESS, worker.native_id) == os_priority.current_nice()
        out = dev.read_outputs(1)
        want = _ort_model(_chain_model(), {"x": np.ones((64, 256), np.float32)})
        np.testing.assert_array_equal(out["y"], want["y"])
    finally:
        dev.close()


def _ort_model(m: onnx.ModelProto, x: dict) -> dict:
    s = ort_session(m.SerializeToString(), threads=1)
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, x)))


def test_flag_raised_before_a_segment_starts_evicts_it_without_running():
    dev = CpuDevice(c=4, be_nice=0)
    plan = compile_segments(zoo.path("resnet152", "scaled"), segment_ms=0.05)
    h = dev.load_plan(plan)
    comps: list[Completion] = []
    all_done = threading.Event()
    n = len(plan.kernels)

    def on_complete(c: Completion) -> None:
        comps.append(c)
        if len(comps) == n:
            all_done.set()

    s = dev.open_stream(0)
    dev.set_preempt(s, True)
    dev.start(on_complete)
    try:
        dev.new_task(h, 7)
        dev.write_inputs(7, zoo.sample_inputs("resnet152", "scaled"))
        dev.enqueue(s, 7, 0, n - 1)
        assert all_done.wait(60)
        assert [c.executed for c in comps] == [False] * n
        assert dev.telemetry()["streams"][s]["evicted"] == n
    finally:
        dev.close()


def test_a_failing_segment_fails_only_its_request():
    dev = GateDevice(be_nice=0)
    path = zoo.path("resnet152", "scaled")
    with Runtime(dev) as rt:
        rt.load_model("m", path)

        def boom() -> None:
            raise FloatingPointError("injected segment fault")

        plan = rt.model_info("m").plan
        dev.hook_next(plan.name, len(plan.kernels) - 1, boom)
        x = zoo.sample_inputs("resnet152", "scaled")
        with pytest.raises(DeviceFaultError, match="injected segment fault"):
            rt.infer("m", x, timeout=60)
        assert _allclose(rt.infer("m", x, timeout=60).outputs, _ort(path, x))
        assert rt.stats()["clients"]["default"]["errors"] == {"device_fault": 1}


# -- the runtime on the engine: golden preemption, helping, callbacks ----------------------------
def test_infer_runs_on_the_calling_thread_and_submit_on_a_lane():
    """``infer`` (and ``result()``) help: the launch runs on the waiting thread when its lane
    is idle; a request nobody waits for runs on a lane worker."""
    threads: list[str] = []
    with Runtime("cpu", device_options={"be_nice": 0}) as rt:
        rt.load_model("m", zoo.path("tiny_cnn"))
        rt.add_listener(lambda kind, p: threads.append(threading.current_thread().name)
                        if kind == "kernel" else None)
        x = zoo.sample_inputs("tiny_cnn")
        rt.infer("m", x)
        assert threads[-1] == threading.current_thread().name
        fut = rt.submit("m", x)
        got = threading.Event()
        fut.add_done_callback(lambda f: got.set())
        assert got.wait(60)  # nobody waited on it: a lane worker ran it
        assert threads[-1].startswith("av_infer-cpu-lane")


def test_submit_run_here_runs_on_the_calling_thread_and_returns_it_resolved():
    """``submit(run_here=True)`` on an idle lane: the launches run on this thread, as under
    ``infer``, and the future comes back resolved with the same outputs; the inputs are
    copied (the request may outlive the call) and a bad request is a failed future."""
    threads: list[str] = []
    dev = _InputsSeen(be_nice=0)
    with Runtime(dev) as rt:
        rt.load_model("m", zoo.path("tiny_cnn"))
        rt.add_listener(lambda kind, p: threads.append(threading.current_thread().name)
                        if kind == "kernel" else None)
        x = zoo.sample_inputs("tiny_cnn")
        want = rt.infer("m", {k: v.copy() for k, v in x.items()}).outputs
        for prio in ("BE", "RT"):
            fut = rt.submit("m", x, priority=prio, run_here=True)
            assert fut.done(), prio
            assert threads[-1] == threading.current_thread().name, prio
            name = next(iter(x))
            assert dev.seen[-1][name] is not x[name]  # copied, as by submit
            got = fut.result(0).outputs
            assert all(np.array_equal(got[k], want[k]) for k in want), prio
        bad = rt.submit("nope", x, run_here=True)
        assert bad.done() and isinstance(bad.exception(0), UnknownModelError)


def test_rt_launches_report_their_threads_cpu_time_and_be_launches_do_not():
    """An RT request's ``timings.run_cpu`` is the CPU time its launch used on the thread
    that ran it (here the waiting caller, which helps): measured, positive, and
    not more than the launch's wall time (one intra-op thread). BE launches are not
    measured (NaN): the clock reads stay off their many short launches."""
    with Runtime("cpu") as rt:
        rt.load_model("m", zoo.path("tiny_cnn"), pin=True)
        x = zoo.sample_inputs("tiny_cnn")
        for res in (rt.infer("m", x, priority="RT"),
                    rt.submit("m", x, priority="RT").result(60)):
            tm = res.timings
            launch = tm.end - tm.first_kernel_start
            assert 0.0 < tm.run_cpu <= launch + 1e-4  # clock granularity
        assert np.isnan(rt.infer("m", x).timings.run_cpu)


class _InputsSeen(CpuDevice):
    """Records the arrays each task's inputs are written from (test only)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.seen: list[dict[str, np.ndarray]] = []

    def write_inputs(self, task: int, inputs: dict[str, np.ndarray]) -> None:
        self.seen.append(dict(inputs))
        super().write_inputs(task, inputs)


def test_infer_borrows_the_callers_arrays_and_submit_copies_them():
    """``infer`` without a timeout reads the caller's C-contiguous arrays in place (no copy,
    like ``InferenceSession.run``); ``submit`` and ``infer`` with a timeout (the request may
    outlive the call) take private copies, so a caller changing its array afterwards
    changes nothing; a non-contiguous array is copied. Every result is the same."""
    dev = _InputsSeen()
    with Runtime(dev) as rt:
        rt.load_model("m", zoo.path("tiny_cnn"))
        x = zoo.sample_inputs("tiny_cnn")
        name = next(iter(x))
        want = rt.infer("m", {k: v.copy() for k, v in x.items()}).outputs

        got = rt.infer("m", x).outputs
        assert dev.seen[-1][name] is x[name]

        got_t = rt.infer("m", x, timeout=60).outputs
        assert dev.seen[-1][name] is not x[name]

        fut = rt.submit("m", x)
        out_s = fut.result(60).outputs
        assert dev.seen[-1][name] is not x[name]

        nc = {name: np.asfortranarray(x[name])}
        assert not nc[name].flags.c_contiguous
        got_nc = rt.infer("m", nc).outputs
        assert dev.seen[-1][name] is not nc[name]
    for out in (got, got_t, out_s, got_nc):
        assert out.keys() == want.keys()
        assert all(np.array_equal(out[k], want[k]) for k in want)


def test_done_callbacks_run_on_the_callback_thread():
    with Runtime("cpu") as rt:
        rt.load_model("m", zoo.path("tiny_mlp"))
        names, got = [], threading.Event()

        def cb(f) -> None:
            names.append(threading.current_thread().name)
            got.set()

        rt.submit("m", zoo.sample_inputs("tiny_mlp")).add_done_callback(cb)
        assert got.wait(60)
        assert names == ["av_infer-callbacks"]


def test_many_threads_infer_and_submit_every_request_answered_once():
    """Helping and lane workers together: 6 threads x 40 requests (infer, submit+result,
    submit+callback, submit(run_here=True)+callback) with RT interleaved; every request is
    answered exactly once (a run_here request whose lane was busy is run by its holder
    or worker)."""
    answers: dict[int, int] = {}
    lock = threading.Lock()
    with Runtime("cpu", policy="reef", max_be_streams=2) as rt:
        rt.load_model("be", zoo.path("resnet152"))
        rt.load_model("rt", zoo.path("tiny_mlp"), pin=True)
        xb, xr = zoo.sample_inputs("resnet152"), zoo.sample_inputs("tiny_mlp")
        cb_done = threading.Semaphore(0)

        def count(r) -> None:
            with lock:
                answers[r.request_id] = answers.get(r.request_id, 0) + 1

        def worker(i: int) -> None:
            for j in range(40):
                mode = (i + j) % 4
                if i == 0:
                    count(rt.infer("rt", xr, priority="RT", client="rt"))
                elif mode == 3:
                    f = rt.submit("be", xb, client=f"c{i}", run_here=True)
                    f.add_done_callback(lambda f: (count(f.result()), cb_done.release()))
                    assert cb_done.acquire(timeout=60)
                elif mode == 0:
                    count(rt.infer("be", xb, client=f"c{i}"))
                elif mode == 1:
                    count(rt.submit("be", xb, client=f"c{i}").result(timeout=60))
                else:
                    f = rt.submit("be", xb, client=f"c{i}")
                    f.add_done_callback(lambda f: (count(f.result()), cb_done.release()))
                    assert cb_done.acquire(timeout=60)

        ths = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(120)
        assert not any(t.is_alive() for t in ths)
    assert len(answers) == 6 * 40 and set(answers.values()) == {1}


@pytest.mark.skipif(not exported.available(), reason=str(exported.why_unavailable()))
@pytest.mark.parametrize("name", exported.names())
def test_exported_paddleocr_models_match_ort(name):
    """Real exports (Paddle2ONNX), whole and cut: the engine matches ONNX Runtime."""
    path, shape = exported.path(name), exported.input_shape(name)
    x = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    ref = _ort(path, x)
    for seg in (None, 2.0):
        plan = compile_segments(path, list(shape), segment_ms=seg, name=name)
        assert _allclose(SegmentRunner(plan).run(x), ref), (name, seg)


@pytest.mark.parametrize("opts", [{"engine": "tensorrt"}, {"be_nice": 20}, {"be_nice": True},
                                  {"rt_priority": "max"}, {"threads": 0},
                                  {"segment_ms": 0}, {"kill_below_ms": -1},
                                  {"kill_below_ms": "soon"}, {"kill_below_ms": True},
                                  {"rt_parallel": 0}, {"rt_parallel": 65},
                                  {"rt_parallel": True}, {"rt_parallel": 1.5},
                                  {"max_cut_cost": -0.01}, {"max_cut_cost": 1.5},
                                  {"max_cut_cost": True}, {"max_cut_cost": "5%"}])
def test_bad_cpu_device_options_are_typed_errors(opts):
    from av_infer.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError):
        Runtime("cpu", device_options=opts)


@pytest.mark.parametrize("max_cut_cost", [0.05, None])
def test_the_device_measures_what_its_cuts_cost_unless_told_not_to(max_cut_cost):
    """With ``max_cut_cost`` the cut plan carries the cost measured on this device (and is
    cut again when over it); None cuts by the profile alone. Either way the plan runs and
    agrees with ORT, and the setting is in the compile key and the telemetry."""
    dev = CpuDevice(segment_ms=0.05, max_cut_cost=max_cut_cost)
    path = zoo.path("densenet201", "scaled")
    plan = dev.compile(str(path), name="d")
    assert dev.compile_key()["max_cut_cost"] == max_cut_cost
    assert dev.telemetry()["max_cut_cost"] == max_cut_cost
    assert "max_cut_cost" not in dev.compile_key(whole=True)
    assert len(plan.segments) >= 2  # 4 x 0.05 ms segments at most: still cut
    if max_cut_cost is None:
        assert plan.stats["cut_cost"] is None
    else:
        assert isinstance(plan.stats["cut_cost"], float)
    x = zoo.sample_inputs("densenet201", "scaled", seed=4)
    assert _allclose(SegmentRunner(plan).run(x), _ort(path, x))


def test_kill_below_auto_is_the_measured_kill_cost_with_a_floor_and_shown():
    """``kill_below_ms="auto"`` (the default): at start the device measures what a killed
    ORT run costs its thread (CPU) and kills only segments with more than that (within
    0.2-1 ms) left; a set value is used as given and nothing is measured."""
    from av_infer.devices.cpu import KILL_BELOW_CAP_S, KILL_BELOW_FLOOR_S
    from av_infer.kernels.ort_segments import measure_kill_cost

    assert measure_kill_cost() > 0
    with Runtime("cpu") as r:
        dev = r.stats()["device"]
        assert dev["kill_below"] == "auto" and dev["kill_cost_ms"] > 0
        assert dev["kill_below_ms"] == pytest.approx(
            min(KILL_BELOW_CAP_S, max(KILL_BELOW_FLOOR_S, dev["kill_cost_ms"] / 1e3)) * 1e3)
    with Runtime("cpu", device_options={"kill_below_ms": 0.5}) as r:
        dev = r.stats()["device"]
        assert dev["kill_below"] == "set" and dev["kill_cost_ms"] is None
        assert dev["kill_below_ms"] == 0.5
    with Runtime("cpu", device_options={"engine": "numpy"}) as r:  # never kills
        assert r.stats()["device"]["kill_cost_ms"] is None


def test_a_failed_kill_cost_measurement_keeps_the_floor_and_says_so(monkeypatch, caplog):
    """The device still starts and serves; the threshold stays at the floor and
    ``kill_cost_ms`` is None, with a warning in the log (never a silent fallback)."""
    from av_infer.devices import cpu as cpu_mod

    def broken(threads: int = 1) -> float:
        raise RuntimeError("no ORT today")

    monkeypatch.setattr(cpu_mod, "measure_kill_cost", broken)
    with caplog.at_level("WARNING", logger="av_infer.devices.cpu"), Runtime("cpu") as r:
        dev = r.stats()["device"]
        assert dev["kill_below"] == "auto" and dev["kill_cost_ms"] is None
        assert dev["kill_below_ms"] == pytest.approx(cpu_mod.KILL_BELOW_FLOOR_S * 1e3)
        r.load_model("tiny_cnn", str(zoo.path("tiny_cnn")))
        assert r.infer("tiny_cnn", zoo.sample_inputs("tiny_cnn")).outputs
    assert "measuring ORT's kill cost failed" in caplog.text


@pytest.mark.parametrize("zero_copy", [False, True])
def test_device_write_inputs_outside_the_runtime_checks_and_casts(zero_copy, monkeypatch):
    """What Runtime.submit validates is copied (or, from ZERO_COPY_BYTES, bound in place);
    anything else goes through the runner's checks: a typed error, or a safe cast into the
    arena, which the segments then read in both cases."""
    from av_infer.devices import cpu as cpu_mod
    from av_infer.errors import InvalidInputError

    if zero_copy:
        monkeypatch.setattr(cpu_mod, "ZERO_COPY_BYTES", 0)
    dev = CpuDevice(be_nice=0)
    path = zoo.path("resnet152", "scaled")
    plan = compile_segments(path, segment_ms=None)
    h = dev.load_plan(plan)
    dev.new_task(h, 1)
    (name, (shape, _)), = plan.input_spec().items()
    assert (name in dev._tasks[1].bound.zero_in) is zero_copy
    with pytest.raises(InvalidInputError):
        dev.write_inputs(1, {name: np.zeros((1, 2), np.float32)})
    with pytest.raises(InvalidInputError):
        dev.write_inputs(1, {"nope": np.zeros(shape, np.float32)})
    x = zoo.sample_inputs("resnet152", "scaled")[name]
    fns = dev._tasks[1].bound.fns
    ro = h.runner.run_options()
    for given in (x, x.astype(np.float16)):  # what submit sends; a safe cast
        dev.write_inputs(1, {name: given})
        for f in fns:
            f(ro)
        want = _ort(path, {name: given.astype(np.float32)})
        assert _allclose(dev.read_outputs(1), want)
    dev.close()
