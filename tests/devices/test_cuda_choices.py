"""Recorded per-op choices of ``vendor="auto"`` (av_infer/devices/cuda_choices.py): the
decision rule, the key, the record's round trip, and on the CUDA emulator that a second load
runs exactly the recorded paths without timing anything."""

from __future__ import annotations

import numpy as np
import pytest

from av_infer.devices import cuda_choices
from av_infer.devices.cuda import availability
from av_infer.kernels.cuda_compile import CompileCache
from tests.checks import require

EMU_OK, EMU_WHY = availability(emulate=True)


def _zoo(name: str):
    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    p = zoo.path(name, "scaled")
    return compile_model(p, name=name), zoo.sample_inputs(name, "scaled", seed=3)


def test_decide_keeps_the_vendor_within_the_margin():
    m = cuda_choices.AUTO_MARGIN
    assert cuda_choices.decide(100.0, 100.0) == "vendor"
    assert cuda_choices.decide(100.0 * (1 - m) + 0.01, 100.0) == "vendor"
    assert cuda_choices.decide(100.0 * (1 - m) - 0.01, 100.0) == "own"
    assert cuda_choices.decide(200.0, 100.0) == "vendor"


def test_key_changes_with_every_input():
    base = dict(source="src", precision="fp32", gpu={"arch": "sm_90", "sms": 132},
                versions={"cudnn": 91900, "cublaslt": 130100}, workspace_bytes=1 << 25)
    k0 = cuda_choices.choice_key(**base)
    assert k0 == cuda_choices.choice_key(**base)
    for change in (dict(source="src2"), dict(precision="fp16"),
                   dict(gpu={"arch": "sm_90", "sms": 114}),
                   dict(versions={"cudnn": 91901, "cublaslt": 130100}),
                   dict(workspace_bytes=1 << 20)):
        assert cuda_choices.choice_key(**{**base, **change}) != k0, change


def test_record_round_trip_and_refusals(tmp_path):
    cache = CompileCache(tmp_path)
    ops = {3: {"path": "own", "own_us": 1.5, "vendor_us": 2.0},
           7: {"path": "vendor", "own_us": 9.0, "vendor_us": 4.25}}
    cuda_choices.store(cache, "k" * 64, ops, "m")
    assert cuda_choices.load(cache, "k" * 64, {3, 7, 9}) == ops
    # a record naming a kernel the model does not have is a miss
    assert cuda_choices.load(cache, "k" * 64, {3}) is None
    assert cuda_choices.load(cache, "x" * 64, {3, 7}) is None
    # a record that does not decode is a miss, never an error
    cache.store("b" * 64, b"{not json")
    assert cuda_choices.load(cache, "b" * 64, {3}) is None
    cache.store("c" * 64, b'{"ops": {"3": {"path": "fast", "own_us": 1, "vendor_us": 2}}}')
    assert cuda_choices.load(cache, "c" * 64, {3}) is None


def test_invalid_mode_is_refused_before_anything_starts():
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer.devices.cuda import CudaDevice

    with pytest.raises(ValueError, match="vendor_choices must be one of"):
        CudaDevice(emulate=True, vendor="auto", vendor_choices="sometimes")


def _report(d, h):
    return [(r["kernel"], r["path"], r.get("own_us"), r.get("vendor_us"))
            for r in d.vendor_report(h)]


def test_second_load_runs_the_recorded_paths_without_timing(tmp_path, monkeypatch):
    """The first load measures and records; a second device on the same cache runs the
    same paths with the same recorded times, and times nothing (timing would raise)."""
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer.devices.cuda import CudaDevice
    from av_infer.kernels.cpu import CpuPlanRunner
    from tests.devices.test_cuda_vendor import Runner

    plan, x = _zoo("tiny_cnn")
    d = CudaDevice(emulate=True, vendor="auto", cache_dir=str(tmp_path))
    try:
        first = _report(d, d.load_plan(plan))
        assert first and all(r[2] is not None for r in first)
        for _, path, own, ven in first:
            assert path == cuda_choices.decide(own, ven)
        assert d.telemetry()["vendor"]["models_by_choice"]["measured"] == 1
    finally:
        d.close()

    def no_timing(*a, **k):
        raise AssertionError("a recorded model was timed again")

    d = CudaDevice(emulate=True, vendor="auto", cache_dir=str(tmp_path))
    try:
        monkeypatch.setattr(d, "time_kernel", no_timing)
        monkeypatch.setattr(d, "_time_vendor", no_timing)
        h = d.load_plan(plan)
        assert _report(d, h) == first
        assert all(r["chosen"] == "cached" for r in d.vendor_report(h))
        assert d.telemetry()["vendor"]["models_by_choice"] == {"cached": 1, "measured": 0}
        got = Runner(d).run(h, x)
        want = CpuPlanRunner(plan).run(x)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)
    finally:
        d.close()


def test_measure_mode_times_every_load_and_records_nothing(tmp_path):
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer.devices.cuda import CudaDevice

    plan, _ = _zoo("tiny_cnn")
    for _ in range(2):
        d = CudaDevice(emulate=True, vendor="auto", vendor_choices="measure",
                       cache_dir=str(tmp_path))
        try:
            m = d.load_plan(plan)
            rows = d.vendor_report(m)
            assert rows and all(r["chosen"] == "measured" for r in rows)
            key = cuda_choices.choice_key(m.src.source, m.precision, d._gpu_identity(),
                                          d._vendor.versions(), d._ws_bytes)
            assert cuda_choices.load(CompileCache(tmp_path), key,
                                     {r["kernel"] for r in rows}) is None
        finally:
            d.close()


def test_a_bad_record_is_measured_over(tmp_path):
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer.devices.cuda import CudaDevice

    plan, _ = _zoo("tiny_cnn")
    d = CudaDevice(emulate=True, vendor="auto", cache_dir=str(tmp_path))
    try:
        m = d.load_plan(plan)
        key = cuda_choices.choice_key(m.src.source, m.precision, d._gpu_identity(),
                                      d._vendor.versions(), d._ws_bytes)
        CompileCache(tmp_path).store(key, b"\xff\xfe garbage")
        rows = d.vendor_report(d.load_plan(plan))
        assert rows and all(r["chosen"] == "measured" for r in rows)
        assert cuda_choices.load(CompileCache(tmp_path), key,
                                 {r["kernel"] for r in rows}) is not None
    finally:
        d.close()
