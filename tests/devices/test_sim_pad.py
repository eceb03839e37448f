"""What a padded launch costs the RT kernel in the simulator (devices.sim_pad, issue 33).

Virtual time only: every duration asserted here is the simulator's, so exact."""

from __future__ import annotations

import json

import pytest

from av_infer.devices import sim_host, sim_pad
from av_infer.devices.base import Completion
from av_infer.devices.sim import SimDevice
from av_infer.model.plan import Geometry, Kernel, Plan
from av_infer.profiles import GPUS, KernelProfile, ModelProfile

US = 1e-6


def plan_of(name: str, blocks: int) -> Plan:
    g = Geometry(grid=(blocks, 1, 1), block=(256, 1, 1))
    return Plan(name=name, kernels=[Kernel(0, "trace", "k0", (), (), {}, g)], tensors={},
                buffers={}, inputs=[], outputs=[])


def prof_of(name: str, dur_us: float, blocks: int) -> ModelProfile:
    return ModelProfile(model=name, device="mi50", sms=60,
                        kernels=[KernelProfile(0, "k0", dur_us, blocks, 256, blocks_per_sm=2)])


def rt_launch(pad: object = None, padded: bool = True) -> tuple[Completion, SimDevice]:
    """RT kernel "rt" (30 blocks, 100 us alone) padded with 30 blocks of "be" (30 SMs of
    their own under the reserved placement, so only the dispatcher's cost is timed)."""
    dev = SimDevice("mi50", {"rt": prof_of("rt", 100.0, 30), "be": prof_of("be", 50.0, 60)},
                    dkp_placement="reserved", pad=pad)
    done: list[Completion] = []
    dev.start(done.append)
    dev.new_task(dev.load_plan(plan_of("rt", 30)), 1)
    dev.new_task(dev.load_plan(plan_of("be", 60)), 2)
    s = dev.open_stream(1)
    if padded:
        dev.enqueue_padded(s, 1, 0, [(2, 0, 0, 30, 2)])
    else:
        dev.enqueue(s, 1, 0, 0)
    dev.run()
    (c,) = done
    return c, dev


def dur(c: Completion) -> float:
    return c.t_end - c.t_start


def test_default_is_reefs_figure_for_every_model() -> None:
    paper = 100 * US * (1 + GPUS["mi50"].pad_overhead)
    for pad in (None, "none", "paper"):
        c, dev = rt_launch(pad)
        assert dur(c) == pytest.approx(paper)
        assert "pad" not in dev.telemetry()


def test_a_padded_launch_takes_its_models_measured_overhead() -> None:
    c, dev = rt_launch(sim_pad.PadModel({"rt": 0.5}))
    assert dur(c) == pytest.approx(150 * US)
    assert dev.telemetry()["pad"]["overhead"] == {"rt": 0.5}
    # a faster padded kernel (distilbert on the H200: -15 %)
    c, _ = rt_launch(sim_pad.PadModel({"rt": -0.15}))
    assert dur(c) == pytest.approx(85 * US)
    # a model the file does not name: its default, else the GPU's figure
    c, _ = rt_launch(sim_pad.PadModel({"be": 0.5}, default=0.25))
    assert dur(c) == pytest.approx(125 * US)
    c, _ = rt_launch(sim_pad.PadModel({"be": 0.5}))
    assert dur(c) == pytest.approx(100 * US * (1 + GPUS["mi50"].pad_overhead))


def test_unpadded_launches_do_not_pay_it() -> None:
    c, _ = rt_launch(sim_pad.PadModel({"rt": 0.5}), padded=False)
    assert dur(c) == pytest.approx(100 * US)


def test_parameter_file_round_trips_and_scales(tmp_path) -> None:
    f = tmp_path / "pad.json"
    sim_pad.save_params(f, sim_pad.PadModel({"rt": 0.4}, None, "mi50"), {"from": "test"})
    model = sim_pad.load_params(f)
    assert model.overhead == {"rt": 0.4} and model.default is None and model.gpu == "mi50"
    assert model.scaled(2.0).overhead == {"rt": 0.8}
    c, dev = rt_launch(str(f))
    assert dur(c) == pytest.approx(140 * US)
    assert dev.telemetry()["pad"]["name"] == str(f)


def test_a_file_measured_on_another_gpu_is_refused_before_anything_is_set_up(tmp_path) -> None:
    f = tmp_path / "pad_h200.json"
    sim_pad.save_params(f, sim_pad.PadModel({"rt": 0.2}, None, "h200"), {})
    with pytest.raises(ValueError, match="measured on h200, the simulated GPU is mi50"):
        SimDevice("mi50", pad=str(f))
    with pytest.raises(ValueError, match="measured on h200"):
        sim_pad.check_pad(str(f), "h100")
    assert sim_pad.check_pad(str(f), "h200").overhead == {"rt": 0.2}
    # the same as the other parameter files (host, contention) do
    h = tmp_path / "host_h200.json"
    sim_host.save_params(h, sim_host.HostModel(1.0, 0.0, 0.0, "h200"), {})
    with pytest.raises(ValueError, match="fitted on h200"):
        SimDevice("mi50", host=str(h))


def test_bad_settings_and_files_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown pad model"):
        SimDevice("mi50", pad="fast")
    with pytest.raises(FileNotFoundError):
        SimDevice("mi50", pad=str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="> -1"):
        sim_pad.PadModel({"rt": -1.0})
    with pytest.raises(ValueError, match="> -1"):
        sim_pad.PadModel({"rt": 0.1}, default=float("nan"))
    h = tmp_path / "host.json"  # another kind of parameter file
    sim_host.save_params(h, sim_host.HostModel(1.0, 0.0, 0.0, "mi50"), {})
    with pytest.raises(ValueError, match="not a pad parameter file"):
        sim_pad.load_params(h)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": 1, "kind": "pad", "model": "per-model-overhead",
                               "gpu": "mi50", "overhead": [0.2], "default": None}))
    with pytest.raises(ValueError, match="bad.json: overhead must be"):
        sim_pad.load_params(bad)
