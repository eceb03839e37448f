"""The cpu device's request path in ``devices/cpu_lanes.py`` (a ``cdef class`` engine when
built, Cython's pure-Python mode): it runs compiled in the suite, it is the one owner of the
state the path reads (``CpuDevice`` reads and writes through), the device's hot methods are
the engine's (a subclass's override still runs), and the interpreted form
(``AV_INFER_INTERPRETED=1``, the same ``.py``) answers RT and BE requests with ONNX
Runtime's outputs, typed errors for injected faults included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

from av_infer._cy.compiled import PURE_MODULES, is_compiled
from av_infer.devices import cpu_lanes
from av_infer.devices.cpu import _ENGINE_METHODS, CpuDevice
from av_infer.model import zoo

ROOT = Path(__file__).resolve().parents[2]


def test_the_lane_engine_runs_compiled_in_the_suite() -> None:
    assert "devices.cpu_lanes" in PURE_MODULES
    assert is_compiled(cpu_lanes), cpu_lanes.__file__
    dev = CpuDevice(be_nice=0)
    try:
        eng = dev._lanes_engine
        assert type(eng) is cpu_lanes.LaneEngine
        for name in _ENGINE_METHODS:  # the engine's C methods, no Python frame between
            assert getattr(dev, name) == getattr(eng, name), name
            assert not isinstance(getattr(type(eng), name), types.FunctionType), name
    finally:
        dev.close()


def test_the_engine_owns_the_request_path_state() -> None:
    """One owner: what the device, telemetry and tests read by their old names is the
    engine's, and a write through the device lands there."""
    dev = CpuDevice(be_nice=0, kill_below_ms=0.5)
    try:
        eng = dev._lanes_engine
        s = dev.open_stream(0)
        assert dev._lanes is eng.lanes and dev._lanes[s] is eng.lanes[s]
        assert dev._tasks is eng.tasks and dev._lock is eng.lock
        assert dev._kill_latency is eng.kill_latency
        assert dev.faults is None and eng.faults is None
        inj = dev.inject_faults()
        assert eng.faults is inj and dev.faults is inj
        assert dev.kill is True and dev.kill_below_s == eng.kill_below_s == 0.5e-3
        dev.kill, dev.kill_below_s = False, 2e-3
        assert eng.kill is False and eng.kill_below_s == 2e-3
        assert not dev._worth_killing(1.5e-3) and dev._worth_killing(0.0)
        # 3 ms estimated, kill_below 2 ms: 2.5 ms left is worth it, 1.5 ms left not, 1 ms
        # past the estimate not (about done), 2.5 ms past it is (the estimate no longer
        # says what is left)
        assert dev._worth_killing(3e-3, 0.5e-3) and not dev._worth_killing(3e-3, 1.5e-3)
        assert not dev._worth_killing(3e-3, 4e-3) and dev._worth_killing(3e-3, 5.5e-3)
        assert dev._on_complete is None and not dev._stopping
        seen = []
        dev.start(seen.append)
        assert eng.on_complete is not None and dev._on_complete is eng.on_complete
    finally:
        dev.close()
    assert eng.stopping and dev._stopping


def test_a_subclass_override_of_a_hot_method_still_runs() -> None:
    seen: list[int] = []

    class Seen(CpuDevice):
        def write_inputs(self, task, inputs):  # noqa: ANN001
            seen.append(task)
            super().write_inputs(task, inputs)

    dev = Seen(be_nice=0)
    try:
        assert dev.enqueue == dev._lanes_engine.enqueue
        h = dev.load_plan(dev.compile(str(zoo.path("tiny_cnn")), whole=True))
        dev.new_task(h, 7)
        dev.write_inputs(7, zoo.sample_inputs("tiny_cnn"))
        assert seen == [7]
    finally:
        dev.close()


def test_the_scheduler_calls_the_engine_where_the_device_is_the_engines() -> None:
    """The C-level table (docs/request_path.md section 2): a plain cpu device offers its
    lane engine (``lane_engine``) and the scheduler holds it (``_port``) and calls its
    request-path methods directly; a device whose subclass overrides one of them, or with
    one replaced on the instance, offers none, so the scheduler calls the device's
    methods (the override runs) and every request is still answered with ORT's outputs."""
    from av_infer import Runtime
    from av_infer.devices.cpu import _PORT_METHODS
    from av_infer.devices.sim import SimDevice

    assert set(_PORT_METHODS) <= set(_ENGINE_METHODS)
    x = zoo.sample_inputs("tiny_mlp")
    seen: list[int] = []

    class Seen(CpuDevice):
        def read_outputs(self, task):  # noqa: ANN001
            seen.append(task)
            return super().read_outputs(task)

    with Runtime("cpu", max_be_streams=1, device_options={"be_nice": 0}) as rt:
        dev = rt.device
        assert dev.lane_engine is dev._lanes_engine is rt._sched._port
        rt.load_model("m", zoo.path("tiny_mlp"))
        want = rt.infer("m", x).outputs
        got = rt.submit("m", x).result().outputs
        assert want.keys() == got.keys() and all((want[k] == got[k]).all() for k in want)
        dev.enqueue = dev.enqueue  # an instance attribute that is still the engine's
        assert dev.lane_engine is dev._lanes_engine
        dev.enqueue = lambda *a: None  # replaced: no table
        assert dev.lane_engine is None
    with Runtime(device=Seen(be_nice=0), max_be_streams=1) as rt:
        assert rt.device.lane_engine is None and rt._sched._port is None
        rt.load_model("m", zoo.path("tiny_mlp"))
        got = rt.infer("m", x).outputs
        rid = rt.submit("m", x).result().request_id
        assert got.keys() == want.keys() and all((want[k] == got[k]).all() for k in want)
        assert len(seen) == 2 and rid > 0
    assert SimDevice().lane_engine is None


_INTERPRETED_RUN = r"""
import json, sys
import numpy as np
import av_infer
from av_infer import Runtime
from av_infer._cy.compiled import is_compiled
from av_infer.devices import cpu_lanes
from av_infer.errors import DeviceFaultError
from av_infer.model import zoo
from av_infer.model.check import ort_session

assert not is_compiled(cpu_lanes), cpu_lanes.__file__


def ort(path, x):
    s = ort_session(str(path), threads=1)
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, x)))


def close(got, want):
    return all(np.allclose(got[k], want[k], rtol=1e-4, atol=1e-5) for k in want)


out = {}
with Runtime("cpu", device_options={"be_nice": 0}) as rt:
    dev = rt.device
    assert type(dev._lanes_engine).__module__ == "av_infer.devices.cpu_lanes"
    assert dev.enqueue == dev._lanes_engine.enqueue
    small, big = zoo.path("tiny_cnn"), zoo.path("resnet152", "scaled")
    xs, xb = zoo.sample_inputs("tiny_cnn"), zoo.sample_inputs("resnet152", "scaled")
    rt.load_model("rt", small, pin=True)
    rt.load_model("be", big)
    want_s, want_b = ort(small, xs), ort(big, xb)
    out["rt"] = all(close(rt.infer("rt", xs, priority="RT").outputs, want_s)
                    for _ in range(20))
    out["be"] = all(close(rt.submit("be", xb).result(60).outputs, want_b) for _ in range(3))
    futs = [rt.submit("be", xb) for _ in range(3)] + [rt.submit("rt", xs, priority="RT")
                                                      for _ in range(3)]
    got = [f.result(60).outputs for f in futs]
    out["mixed"] = (all(close(g, want_b) for g in got[:3])
                    and all(close(g, want_s) for g in got[3:]))
    inj = dev.inject_faults()
    for point in ("kernel", "lane"):
        inj.add(point, times=1)
        try:
            rt.infer("rt", xs, priority="RT")
            out[point] = "answered"
        except DeviceFaultError:
            out[point] = "DeviceFaultError"
    out["after"] = close(rt.infer("rt", xs, priority="RT").outputs, want_s)
    streams = dev.telemetry()["streams"]
    out["executed"] = sum(s["executed"] for s in streams)
json.dump(out, open(sys.argv[1], "w"))
"""


def test_the_interpreted_lane_engine_answers_rt_and_be_like_onnx_runtime(tmp_path) -> None:
    res = tmp_path / "interpreted.json"
    env = {**os.environ, "AV_INFER_INTERPRETED": "1"}
    proc = subprocess.run([sys.executable, "-c", _INTERPRETED_RUN, str(res)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(res.read_text())
    assert out["rt"] and out["be"] and out["mixed"] and out["after"], out
    assert out["kernel"] == out["lane"] == "DeviceFaultError", out
    assert out["executed"] > 0
