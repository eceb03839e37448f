"""The simulator-speed and GPU-sharing benchmarks' own checks (issue 13), kept short."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from av_infer.bench import sharing, sim_speed
from av_infer.bench.harness import BenchConfig

SIM_PY = str(Path(sim_speed.__file__).parents[1] / "devices" / "sim.py")


def test_device_speed_reports_batches_and_a_digest() -> None:
    from av_infer.devices.sim import SimDevice

    a = sim_speed.device_speed(SimDevice, "h100", 0.01)
    b = sim_speed.device_speed(SimDevice, "h100", 0.01)
    assert a["batches"] > 0 and a["batches"] == b["batches"] and a["digest"] == b["digest"]


def test_equivalence_of_a_build_with_its_own_source_finds_no_difference(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the same model loaded twice (this build, and sim.py as another module) gives the
    # same records: what the check compares an older simulator against
    monkeypatch.setattr(sim_speed, "EQUIV_WORKLOADS", ("A",))
    monkeypatch.setattr(sim_speed, "EQUIV_POLICIES", ("streams", "reef"))
    eq = sim_speed.equivalence(SIM_PY, 0.05, ["issue13"])
    assert eq["runs"] == 3 * 2 and eq["requests"] > 0 and eq["differ"] == []


def test_digests_against_a_file_name_the_runs_that_differ(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--digests OUT --against FILE`` (a scheduler change checked in two checkouts): the
    same checkout matches its own file; a changed digest is named and exits 1."""
    monkeypatch.setattr(sim_speed, "EQUIV_WORKLOADS", ("A",))
    monkeypatch.setattr(sim_speed, "EQUIV_POLICIES", ("streams", "reef"))
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    args = ["--seconds", "0.05", "--equiv-configs", "legacy"]
    assert sim_speed.main(["--digests", str(first), *args]) == 0
    assert sim_speed.main(["--digests", str(second), "--against", str(first), *args]) == 0
    assert "0 differ" in capsys.readouterr().out
    runs = json.loads(first.read_text())
    key = sorted(runs)[0]
    runs[key][0] = "0" * 16
    first.write_text(json.dumps(runs))
    assert sim_speed.main(["--digests", str(second), "--against", str(first), *args]) == 1
    assert key in capsys.readouterr().out


def test_completion_cost_counts_every_completion_and_restores_the_device() -> None:
    """``--completion-cost`` wraps the simulator's completion callback for its runs only:
    it sees every kernel completion of the run (the device's own count) and puts
    ``SimDevice.start`` back afterwards."""
    from av_infer.devices.sim import SimDevice

    start = SimDevice.start
    rows = sim_speed.completion_cost("A", "h100", 0.05, ["reef"])
    assert SimDevice.start is start
    (r,) = rows
    assert r["policy"] == "reef" and r["requests"] > 0
    assert r["completions"] == r["kernels"] > 0
    assert r["cpu_per_completion_us"] > 0 and r["clock_pair_us"] > 0
    assert r["clock_pair_p50_us"] > 0 and isinstance(r["callback_p50_us"], float)


def test_equivalence_refuses_an_unknown_configuration() -> None:
    with pytest.raises(SystemExit):
        sim_speed.main(["--equivalence", SIM_PY, "--equiv-configs", "nope"])


def test_time_sharing_ceiling_is_rt_plus_be_alone_in_the_time_rt_leaves() -> None:
    cfg = BenchConfig(device="sim", gpu="h100", duration=0.3, progress=False,
                      timeline=False, standalone_n=3)
    c = sharing.time_sharing_ceiling("A", cfg)
    assert 0 < c["rt_busy"] < 1 and c["be_alone_rps"] > 0
    # A: VGG-19 RT at 100/s, so RT's req/s in the window is about 100
    rt_rps = c["ceiling_rps"] - c["be_alone_rps"] * (1 - c["rt_busy"])
    assert rt_rps == pytest.approx(100, abs=5)
