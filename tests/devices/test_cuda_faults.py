"""Fault injection on the cuda device (``devices.faults`` hook points), through the runtime
on the CPU emulator: a failed kernel fails its request only; a completion thread that dies
fails the launch it held and is replaced; a failed load or an out-of-memory load is a
typed error and leaves the runtime serving."""

from __future__ import annotations

import numpy as np
import pytest

from av_infer.devices.cuda import availability
from av_infer.errors import DeviceFaultError, ModelLoadError, ModelTooLargeError
from tests.checks import require

EMU_OK, EMU_WHY = availability(emulate=True)
MODEL = ("tiny_mlp", "default")


@pytest.fixture(scope="module")
def rt():
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer import Runtime
    from av_infer.model import zoo

    with Runtime("cuda-emu") as r:
        r.load_model("mlp", zoo.path(*MODEL))
        r.load_model("other", zoo.path(*MODEL))
        yield r


def _x() -> dict:
    from av_infer.model import zoo

    return zoo.sample_inputs(*MODEL)


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_kernel_fault_fails_only_that_request(rt):
    x = _x()
    ref = rt.submit("mlp", x).result(timeout=60).outputs
    faults = rt.device.inject_faults()
    faults.add("kernel", model="mlp", kernel=1)
    try:
        bad = rt.submit("mlp", x)
        beside = rt.submit("other", x)
        with pytest.raises(DeviceFaultError, match="injected kernel fault"):
            bad.result(timeout=60)
        _same(beside.result(timeout=60).outputs, ref)
        _same(rt.submit("mlp", x).result(timeout=60).outputs, ref)  # the next one succeeds
        assert faults.fired() == {"kernel": 1}
    finally:
        faults.clear()


def test_completion_thread_death_fails_the_held_launch_and_a_new_thread_serves(rt):
    x = _x()
    ref = rt.submit("mlp", x).result(timeout=60).outputs
    before = rt.device.drain_restarts
    faults = rt.device.inject_faults()
    faults.add("lane", model="mlp", kernel=0)
    try:
        with pytest.raises(DeviceFaultError, match="died"):
            rt.submit("mlp", x).result(timeout=60)
        for _ in range(3):  # served by the thread that took over
            _same(rt.submit("mlp", x).result(timeout=60).outputs, ref)
        assert rt.device.drain_restarts == before + 1
        assert faults.fired() == {"lane": 1}
    finally:
        faults.clear()


@pytest.mark.parametrize("point, error", [("load", ModelLoadError),
                                          ("oom", ModelTooLargeError)])
def test_load_faults_are_typed_and_the_model_loads_next_time(rt, point, error):
    from av_infer.model import zoo

    faults = rt.device.inject_faults()
    faults.add(point, model=f"m_{point}")
    try:
        with pytest.raises(error, match="injected"):
            rt.load_model(f"m_{point}", zoo.path(*MODEL))
        rt.load_model(f"m_{point}", zoo.path(*MODEL))  # the rule is spent
        x = _x()
        _same(rt.submit(f"m_{point}", x).result(timeout=60).outputs,
              rt.submit("mlp", x).result(timeout=60).outputs)
    finally:
        faults.clear()
        rt.unload_model(f"m_{point}")
