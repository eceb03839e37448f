"""Kernel profiles: the format, estimates from geometry, and the REEF traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from av_infer.model.plan import KERNEL_KINDS, Geometry, Kernel, Plan
from av_infer.profiles import (
    GPUS,
    KernelProfile,
    ModelProfile,
    default_trace_dir,
    derive_profile,
    gpu_spec,
    load_reef_trace,
    occupancy,
    reef_models,
)

TRACES = default_trace_dir()
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason=f"no REEF traces at {TRACES}")


def test_profile_round_trips_through_json_and_disk(tmp_path: Path) -> None:
    p = ModelProfile("m", "h100", 132, [
        KernelProfile(0, "a", 12.5, 264, 256, 40, 1024, 6, [12.5, 14.0]),
        KernelProfile(1, "b", 3.0, 1, 32),
    ])
    assert ModelProfile.from_json(p.to_json()) == p
    path = tmp_path / "sub" / "m.profile.json"
    p.save(path)
    assert ModelProfile.load(path) == p
    assert [f.name for f in path.parent.iterdir()] == ["m.profile.json"]  # no temp left
    doc = json.loads(path.read_text())
    doc["format"] = 99
    with pytest.raises(ValueError, match="format"):
        ModelProfile.from_json(json.dumps(doc))


def test_occupancy_calculator_limits() -> None:
    h100 = GPUS["h100"]
    assert occupancy(Geometry((1, 1, 1), (256, 1, 1), regs=32), h100) == 8  # threads
    assert occupancy(Geometry((1, 1, 1), (256, 1, 1), regs=64), h100) == 4  # registers
    assert occupancy(Geometry((1, 1, 1), (64, 1, 1), regs=16), h100) == 32  # block limit
    assert occupancy(Geometry((1, 1, 1), (128, 1, 1), smem=48 * 1024, regs=16), h100) == 4
    assert occupancy(Geometry((1, 1, 1), (1024, 1, 1), regs=255), h100) == 1  # never 0
    with pytest.raises(ValueError, match="unknown GPU"):
        gpu_spec("tpu")


def test_derive_profile_gives_sensible_numbers() -> None:
    big = Geometry((132 * 8 * 4, 1, 1), (256, 1, 1), regs=32)  # 4 full waves on H100
    small = Geometry((4, 1, 1), (64, 1, 1))
    kernels = [
        Kernel(0, "gemm", "big", (), (), {}, big, flops=2 * 4096**3, bytes_moved=3 * 4096**2 * 4),
        Kernel(1, "unary", "small", (), (), {}, small, flops=1024, bytes_moved=8192),
        Kernel(2, "binary", "mem", (), (), {}, big, flops=0, bytes_moved=1 << 30),
    ]
    plan = Plan("p", kernels, {}, {}, [], [])
    prof = derive_profile(plan, "h100")
    big_p, small_p, mem_p = prof.kernels
    assert (big_p.blocks_per_sm, small_p.blocks_per_sm) == (8, 32)
    assert big_p.blocks == 132 * 32 and small_p.threads == 64
    # Compute bound: ~137 GFLOP at 67 TFLOPS ~ 2 ms, full waves: no tail correction.
    assert big_p.duration_us == pytest.approx(2 + 2 * 4096**3 / 67e12 * 1e6, rel=1e-6)
    # Memory bound: 1 GiB at 3.35 TB/s ~ 320 us.
    assert mem_p.duration_us == pytest.approx(2 + (1 << 30) / 3350e9 * 1e6, rel=1e-6)
    # A tiny kernel costs about the floor.
    assert 2.0 <= small_p.duration_us < 3.0
    # The same plan is slower on Orin.
    assert derive_profile(plan, "orin").kernels[0].duration_us > 10 * big_p.duration_us


def test_trace_kind_is_registered() -> None:
    assert "trace" in KERNEL_KINDS


@needs_traces
def test_every_reef_trace_loads() -> None:
    models = reef_models()
    assert {"vgg", "resnet152", "alexnet", "bert", "densenet", "mobilenet", "resnet",
            "resnet18"} <= set(models)
    for m in models:
        plan, prof = load_reef_trace(m)
        assert len(plan.kernels) == len(prof.kernels) > 0
        assert all(k.kind == "trace" for k in plan.kernels)
        assert plan.weight_bytes > 0 and plan.arena_bytes > 0
        assert plan.inputs == [] and plan.outputs == []
        for k, kp in zip(plan.kernels, prof.kernels, strict=True):
            assert kp.name == k.name and kp.blocks == k.geometry.blocks > 0
            assert kp.duration_us > 0 and kp.latency_by_bps is not None
            # Occupancy from the block's shape (threads, LDS), not the curve's length.
            assert kp.blocks_per_sm == occupancy(k.geometry, GPUS["mi50"]) >= 1
        assert prof.sms == 60 and prof.device == "mi50"


@needs_traces
def test_vgg_profile_is_consistent_with_its_model_latency() -> None:
    # The trace's per-kernel totals (measured one kernel at a time, each with its own
    # launch overhead) sum to ~10% over the end-to-end model latency (4824 us).
    plan, prof = load_reef_trace("vgg")
    model_latency = plan.stats["model_latency_us"]
    assert model_latency == 4824
    assert prof.total_us == pytest.approx(5294)
    assert 1.0 <= prof.total_us / model_latency <= 1.15
    conv = next(k for k in prof.kernels if k.name.endswith("conv2d_add_nn_relu_6_kernel0"))
    # 9988 B of LDS per block: 6 fit a CU's 64 KB, which is where REEF's packing curve
    # goes flat (7 levels measured, the 7th = the 6th: no 7th block became resident).
    assert conv.blocks == 32 and conv.blocks_per_sm == 6
    lat = conv.latency_by_bps
    assert lat is not None and lat[-1] == lat[-2] > lat[0]
    # Plain 256-thread blocks: 40 wavefronts per CU / 4 = 10 blocks (the traces carry no
    # register counts), though REEF measured only 8 levels of this flat curve.
    add = prof.kernels[0]
    assert add.threads == 256 and add.blocks_per_sm == 10
    assert occupancy(plan.kernels[0].geometry, GPUS["mi50"]) == 10


@needs_traces
def test_trace_dir_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AV_INFER_REEF_TRACES", str(tmp_path))
    assert default_trace_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match="no REEF trace"):
        load_reef_trace("vgg")
    for name in ("vgg.json", "vgg.profile.json"):
        (tmp_path / name).write_text((TRACES / name).read_text())
    assert reef_models() == ["vgg"]
    assert len(load_reef_trace("vgg")[0].kernels) == 71
