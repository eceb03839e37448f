"""``av-infer bench --precision`` (issue 30 item 4): every model of the DISB harness is
loaded at the precision asked for (``Runtime.load_model(precision=)``) and the report says
which; a precision the device does not run is refused with its reason before anything
runs (exit 2, nothing written). cuda-emu (the cuda device on the CPU emulator) runs fp32,
tf32 and fp16; cpu and sim fp32 only. No timing is asserted."""

from __future__ import annotations

import json

import pytest

from av_infer.bench.harness import Bench, BenchConfig
from av_infer.bench.workload import load_workload
from av_infer.cli import main
from tests.checks import require


@pytest.fixture
def emulator():
    from av_infer.devices.cuda import availability

    ok, why = availability(emulate=True)
    require("ok" if ok else None, f"the CUDA emulator cannot run: {why}")


@pytest.mark.parametrize("argv", [
    ["--device", "cpu", "--precision", "fp16"],
    ["--device", "sim", "--precision", "tf32"],
    ["--peer", "ort", "--precision", "fp16"],
])
def test_precision_the_device_cannot_run_is_refused_first(tmp_path, capsys, argv):
    out = tmp_path / "never.json"
    rc = main(["bench", "--workload", "A", "--no-progress", "--json", str(out), *argv])
    assert rc == 2
    err = capsys.readouterr().err
    assert "InvalidParameterError" in err and "runs fp32" in err, err
    assert not out.exists()


def test_unknown_precision_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--precision", "int8"])
    assert e.value.code == 2 and "int8" in capsys.readouterr().err


def test_harness_loads_every_model_at_the_precision(emulator):
    bench = Bench(load_workload("A"), BenchConfig(device="cuda-emu", precision="fp16",
                                                  progress=False))
    rt, _ = bench._runtime("rt_only", 4)
    try:
        assert sorted(rt.models()) == sorted(bench.wl.models)
        assert {rt.model_info(m).plan.precision for m in rt.models()} == {"fp16"}
    finally:
        rt.close()


def test_cli_flag_reaches_the_report(tmp_path, emulator):
    out = tmp_path / "fp16.json"
    rc = main(["bench", "--workload", "A", "--policy", "rt_only", "--device", "cuda-emu",
               "--precision", "fp16", "--duration", "0.5", "--rate-scale", "0.1",
               "--standalone-n", "2", "--no-progress", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["precision"] == "fp16" and doc["device"] == "cuda-emu"
    assert doc["policies"]["rt_only"]["rt"]["count"] > 0
    assert doc["policies"]["rt_only"]["rt"]["failed"] == 0


# -- av-infer models profile --precision ---------------------------------------------------
def test_models_profile_refuses_before_compiling(tmp_path, capsys):
    out = tmp_path / "never.json"
    rc = main(["models", "profile", "tiny_cnn", "--device", "cpu", "--precision", "fp16",
               "--out", str(out)])
    assert rc == 2 and not out.exists()
    assert "models profile: --precision fp16: device cpu runs fp32" in capsys.readouterr().err


def test_models_profile_profiles_the_plan_at_the_precision(tmp_path, monkeypatch, emulator):
    import av_infer.profiler as profiler

    seen = []
    real = profiler.profile_plan

    def spy(plan, *a, **kw):  # the real profiler, noting the plan's precision
        seen.append(plan.precision)
        return real(plan, *a, **kw)

    monkeypatch.setattr(profiler, "profile_plan", spy)
    out = tmp_path / "tiny.fp16.json"
    rc = main(["models", "profile", "tiny_cnn", "--device", "cuda-emu", "--precision", "fp16",
               "--repeats", "1", "--out", str(out)])
    assert rc == 0 and seen == ["fp16"]
    assert json.loads(out.read_text())["kernels"]
