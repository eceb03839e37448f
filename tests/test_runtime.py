"""The public Runtime API: models, clients, validation, stats, listeners, devices, lifecycle,
and the inline (virtual-time) driver on the simulator."""

from __future__ import annotations

import json
import math
import threading

import numpy as np
import onnx
import pytest

from av_infer import Priority, Runtime
from av_infer.devices import make_device
from av_infer.errors import (
    DeviceUnavailableError,
    InvalidParameterError,
    RuntimeClosedError,
    UnknownModelError,
)
from av_infer.kernels.cpu import CpuPlanRunner
from av_infer.model import zoo
from av_infer.model.check import CPU_TOLERANCE, max_rel_err
from av_infer.model.compiler import compile_model
from av_infer.runtime import ARRIVAL_MAX_AGE_S, ModelInfo

pytestmark = pytest.mark.usefixtures("scheduler_never_errs")



@pytest.fixture(scope="module")
def cnn_plan():
    return compile_model(zoo.path("tiny_cnn"), name="cnn")


@pytest.fixture(scope="module")
def x():
    return zoo.sample_inputs("tiny_cnn")


def test_load_model_sources_and_info(cnn_plan, x):
    p = zoo.path("tiny_cnn")
    with Runtime("cpu") as rt:
        infos = [
            rt.load_model("from_path", p),
            rt.load_model("from_str", str(p)),
            rt.load_model("from_bytes", p.read_bytes()),
            rt.load_model("from_proto", onnx.load(str(p))),
            rt.load_model("from_plan", cnn_plan, pin=True),
        ]
        for info in infos:
            assert isinstance(info, ModelInfo)
            assert info.input_spec == {"input": ((1, 3, 32, 32), "float32")}
            assert info.kernels == len(info.plan.kernels) > 0
            assert info.weight_bytes > 0 and info.activation_bytes > 0
            assert info.resident_bytes == info.weight_bytes
        assert infos[-1].pinned
        assert rt.models() == ["from_path", "from_str", "from_bytes", "from_proto",
                               "from_plan"]
        assert rt.output_spec("from_plan") == cnn_plan.output_spec()
        ref = CpuPlanRunner(cnn_plan).run(x)
        for name in rt.models():
            out = rt.submit(name, x).result(timeout=30).outputs
            if name == "from_plan":  # a kernel plan: the numpy engine, bit for bit
                assert all(np.array_equal(out[k], ref[k]) for k in ref)
            else:  # ONNX sources: ONNX Runtime segments, float32 agreement
                assert all(max_rel_err(out[k], ref[k]) <= CPU_TOLERANCE for k in ref)
        with pytest.raises(InvalidParameterError, match="already loaded"):
            rt.load_model("from_plan", cnn_plan)
        with pytest.raises(UnknownModelError):
            rt.input_spec("nope")
        with pytest.raises(UnknownModelError):
            rt.unload_model("nope")


def test_unload_model_lets_accepted_requests_finish(cnn_plan, x):
    with Runtime("cpu") as rt:
        rt.load_model("cnn", cnn_plan)
        futs = [rt.submit("cnn", x) for _ in range(5)]
        rt.unload_model("cnn")
        assert rt.models() == []
        for f in futs:
            f.result(timeout=30)
        with pytest.raises(UnknownModelError):
            rt.submit("cnn", x).result(timeout=1)


def test_reuse_guard_limits_c(x):
    plan = compile_model(zoo.path("tiny_cnn"), name="g", reuse_guard=3)
    with Runtime("cpu", c=4) as rt:
        with pytest.raises(InvalidParameterError, match="reuse_guard"):
            rt.load_model("g", plan)
        rt.set_c(2)
        rt.load_model("g", plan)
        with pytest.raises(InvalidParameterError):
            rt.set_c(3)
        rt.submit("g", x).result(timeout=30)


def test_constructor_and_client_validation():
    with pytest.raises(InvalidParameterError):
        Runtime("cpu", policy="reef_dkp", device_options={"be_nice": 0})
    with pytest.raises(InvalidParameterError):
        Runtime("cpu", policy="fifo")
    with pytest.raises(InvalidParameterError):
        Runtime("cpu", c=0)
    with pytest.raises(InvalidParameterError):
        Runtime("cpu", max_be_streams=0)
    with pytest.raises(InvalidParameterError):
        Runtime("tpu")
    with Runtime("cpu") as rt:
        for kw in ({"priority": "urgent"}, {"relative_deadline": 0},
                   {"relative_deadline": -1.0}, {"relative_deadline": math.nan},
                   {"relative_deadline": "soon"}):
            with pytest.raises(InvalidParameterError):
                rt.configure_client("c", **kw)
        with pytest.raises(InvalidParameterError):
            rt.configure_client("", "RT")
        rt.configure_client("c", Priority.RT, relative_deadline=0.1, drop_late=True)


def test_make_device():
    from av_infer.devices.cpu import CpuDevice

    d = make_device("cpu")
    assert isinstance(d, CpuDevice) and make_device(d) is d
    with pytest.raises(DeviceUnavailableError, match="cuda"):
        make_device("cuda")
    with pytest.raises(InvalidParameterError):
        make_device("quantum")
    with pytest.raises(InvalidParameterError):
        make_device(d, c=3)


def test_bad_deadline_and_arrival_fail_the_future(cnn_plan, x):
    with Runtime("cpu") as rt:
        rt.load_model("cnn", cnn_plan)
        now = rt.now()
        for kw in ({"deadline": math.nan}, {"deadline": "x"}, {"arrival": math.inf},
                   {"client": ""}, {"priority": 7},
                   # an arrival off now()'s clock (the fuzz's -1e308 overflowed the model's
                   # latency statistics): refused at the boundary
                   {"arrival": -1e308}, {"arrival": now - 2 * ARRIVAL_MAX_AGE_S},
                   {"arrival": now + 10.0}):
            f = rt.submit("cnn", x, **kw)
            assert isinstance(f.exception(timeout=1), InvalidParameterError), kw
        # on the clock, in the past: accepted, and its latency counts from it
        r = rt.submit("cnn", x, arrival=now - 0.5).result(timeout=30)
        assert r.timings.latency >= 0.5
        lat = rt.stats()["clients"]["default"]["latency_ms"]
        assert all(v is None or math.isfinite(v) for v in lat.values())


def test_stats_are_json_and_listeners_see_the_lifecycle(cnn_plan, x):
    with Runtime("cpu", policy="reef") as rt:
        rt.load_model("cnn", cnn_plan)
        events: list[str] = []
        lock = threading.Lock()

        def listener(kind: str, payload: dict) -> None:
            with lock:
                events.append(kind)

        def broken(kind: str, payload: dict) -> None:
            raise RuntimeError("listener bug must not break the runtime")

        rt.add_listener(listener)
        rt.add_listener(broken)
        rt.configure_client("cam", "RT", relative_deadline=1.0)
        for _ in range(3):
            rt.submit("cnn", x, client="cam").result(timeout=30)
            rt.submit("cnn", x, client="mon").result(timeout=30)
        rt.remove_listener(broken)
        st = rt.stats()
        json.dumps(st, allow_nan=False)
        cam = st["clients"]["cam"]
        assert cam["priority"] == "RT" and cam["completed"] == 3
        assert set(cam["latency_ms"]) == {"p50", "p90", "p99", "p999", "mean", "max"}
        assert cam["latency_ms"]["p50"] > 0
        assert st["clients"]["mon"]["priority"] == "BE"
        assert st["models"]["cnn"]["completed"] == 6
        assert st["policy"] == "reef" and st["c"] == 4 and st["mode"] == "normal"
        assert st["device"]["device"] == "cpu"
        with lock:
            kinds = set(events)
        assert {"arrival", "dispatch", "kernel", "complete"} <= kinds


def test_future_callbacks_may_submit_again(cnn_plan, x):
    """Callbacks run on the scheduler thread: re-entrant submits must not deadlock."""
    with Runtime("cpu") as rt:
        rt.load_model("cnn", cnn_plan)
        chained = []
        done = threading.Event()

        def again(f):
            if len(chained) < 5:
                nf = rt.submit("cnn", x)
                chained.append(nf)
                nf.add_done_callback(again)
            else:
                done.set()

        rt.submit("cnn", x).add_done_callback(again)
        assert done.wait(30)
        assert all(f.result(timeout=30) for f in chained)


def test_cancelled_future_is_not_answered_twice(cnn_plan, x):
    with Runtime("cpu", max_be_streams=1) as rt:
        rt.load_model("cnn", cnn_plan)
        futs = [rt.submit("cnn", x) for _ in range(8)]
        futs[-1].cancel()
        for f in futs[:-1]:
            f.result(timeout=30)
    assert futs[-1].cancelled()


def test_context_manager_closes(cnn_plan, x):
    with Runtime("cpu") as rt:
        rt.load_model("cnn", cnn_plan)
        f = rt.submit("cnn", x)
    assert f.done() and f.exception() is None
    with pytest.raises(RuntimeClosedError):
        rt.submit("cnn", x).result(timeout=1)
    assert rt.stats()["closed"]


# -- the inline driver on the simulator ------------------------------------------------------
def _sim_run(policy: str):
    plan_be = compile_model(zoo.path("resnet152"), name="be")
    plan_rt = compile_model(zoo.path("tiny_cnn"), name="rt")
    rt = Runtime("sim", policy=policy, c=4)
    rt.load_model("be", plan_be)
    rt.load_model("rt", plan_rt)
    xb, xr = zoo.sample_inputs("resnet152"), zoo.sample_inputs("tiny_cnn")
    dev = rt.device
    futs = [rt.submit("be", xb, client=f"b{i % 2}") for i in range(6)]
    for i in range(6):
        dev.call_at(1e-4 + i * 3e-4,
                    lambda: futs.append(rt.submit("rt", xr, priority="RT")))
    dev.run()
    rt.close()
    results = [f.result(timeout=0) for f in futs]
    return results, rt.stats()


def test_sim_driver_is_inline_and_deterministic():
    pytest.importorskip("av_infer.devices.sim")
    r1, st1 = _sim_run("reef")
    r2, _ = _sim_run("reef")
    assert [(r.request_id, r.timings.end) for r in r1] == \
           [(r.request_id, r.timings.end) for r in r2]
    assert st1["preemptions"] > 0 and st1["restores"] > 0
    assert sum(r.timings.preempted for r in r1 if r.priority == Priority.BE) > 0
    assert len(r1) == 12
    for policy in ("seq", "streams", "prio_streams", "wait"):
        res, _ = _sim_run(policy)
        assert len(res) == 12
