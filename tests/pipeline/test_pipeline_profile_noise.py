"""The block profiler's noise rule (av_infer/pipeline/profile_noise.py, docs/pipeline.md
"Timing noise"): a row non-monotone only within the measurement's noise is made monotone
(running max, recorded), one beyond it is refused. The timings are injected: no wall
clock, so every outcome here is deterministic."""

from __future__ import annotations

import pytest

from av_infer.cli import main
from av_infer.pipeline import block_measure
from av_infer.pipeline.block_profiles import partition_model
from av_infer.pipeline.errors import NonMonotoneProfileError
from av_infer.pipeline.profile_files import load_profiles
from av_infer.pipeline.profile_noise import (
    NOISE_FLOOR_US,
    Cell,
    Timing,
    allowed_drop_us,
    drops,
    settle_row,
)


class Script:
    """``time_cell`` for settle_row: per batch, the timings to hand out in turn (the last
    one repeats), and every call recorded."""

    def __init__(self, per_batch: dict[int, list[Timing | None]]) -> None:
        self.per_batch = per_batch
        self.calls: list[int] = []

    def __call__(self, b: int) -> Timing | None:
        self.calls.append(b)
        seq = self.per_batch[b]
        return seq[min(self.calls.count(b), len(seq)) - 1]


def test_timing_of_samples_is_median_and_mad():
    t = Timing.of([8.0, 7.0, 9.0, 30.0, 8.0])
    assert t.median_us == 8.0 and t.mad_us == 1.0


def test_flat_block_with_jitter_under_the_floor_is_made_monotone():
    # tiny_cnn's last block is per-call overhead only (7.8 / 7.5 / 7.7 us); load while
    # batch 1 is timed stretches it to 12 us: 4.5 us "faster" at batch 2, 37 % of the
    # cell (the old 10 % rule refused this), under the floor
    s = Script({1: [Timing(12.0, 0.1)], 2: [Timing(7.5, 0.1)], 4: [Timing(7.7, 0.1)]})
    row, raised = settle_row(s, [1, 2, 4], where="tiny_cnn block 4")
    assert s.calls == [1, 2, 4]  # within the noise: accepted without re-timing
    assert row == {1: 12.0, 2: 12.0, 4: 12.0}  # running max: never lowered
    assert raised == [
        {"batch": 2, "measured_us": 7.5, "written_us": 12.0, "from_batch": 1},
        {"batch": 4, "measured_us": 7.7, "written_us": 12.0, "from_batch": 1}]


def test_real_inversion_beyond_the_floor_is_refused_after_retimings():
    # a block twice as fast at batch 2, every timing alike: no noise explains 200 us
    s = Script({1: [Timing(400.0, 2.0)], 2: [Timing(200.0, 2.0)], 4: [Timing(700.0, 3.0)]})
    with pytest.raises(NonMonotoneProfileError,
                       match=r"m block 3: 200\.0 us at batch 2 is 200\.0 us faster than "
                             r"400\.0 us at batch 1 after 3 re-timings"):
        settle_row(s, [1, 2, 4], where="m block 3")
    assert sorted(s.calls) == [1] * 4 + [2] * 4 + [4] * 4  # timed once, re-timed 3 times


def test_a_retiming_that_is_not_stretched_settles_the_row():
    # batch 1 stretched 2.5x on its first timing (60 us, MAD small): beyond every bound,
    # so the row is re-timed and the minimum median (25 us) kept: monotone, nothing raised
    s = Script({1: [Timing(60.0, 0.5), Timing(25.0, 0.5)], 2: [Timing(38.0, 0.4)]})
    row, raised = settle_row(s, [1, 2], where="b0")
    assert row == {1: 25.0, 2: 38.0} and raised == []
    assert s.calls == [1, 2, 1, 2]


def test_the_cells_own_spread_widens_the_noise():
    # 30 us faster (30 %) but the repeats' MADs say the cells move by 3 x (10 + 2) us
    small, large = Cell.first(Timing(100.0, 10.0)), Cell.first(Timing(70.0, 2.0))
    assert allowed_drop_us(small, large) == pytest.approx(36.0)
    row, raised = settle_row(Script({1: [Timing(100.0, 10.0)], 2: [Timing(70.0, 2.0)]}),
                             [1, 2], where="b")
    assert row == {1: 100.0, 2: 100.0} and raised[0]["measured_us"] == 70.0
    # the range of a cell's medians over its re-timings counts as its spread too
    c = Cell.first(Timing(20.0, 0.1))
    c.add(Timing(8.0, 0.1))
    assert c.us == 8.0 and c.noise_us == pytest.approx(12.0)


def test_small_drops_cannot_add_up_past_the_noise():
    # 5 % per step is within 10 %, but each cell is compared with the running max (the
    # value it would be raised to): 80 is 20 % under 100
    cells = {b: Cell.first(Timing(x, 0.0)) for b, x in zip((1, 2, 4, 8, 16),
                                                           (100.0, 95.0, 90.0, 85.0, 80.0))}
    bad = [d for d in drops(cells, floor_us=0.0) if not d.within_noise]
    assert [(d.batch_small, d.batch_large) for d in bad] == [(1, 8), (1, 16)]
    s = Script({b: [Timing(c.us, 0.0)] for b, c in cells.items()})
    with pytest.raises(NonMonotoneProfileError, match="at batch 16"):
        settle_row(s, sorted(cells), where="b", floor_us=0.0)


def test_a_batch_that_cannot_run_is_left_out():
    s = Script({1: [Timing(10.0, 0.1)], 2: [None], 4: [Timing(9.0, 0.1)]})
    row, raised = settle_row(s, [1, 2, 4], where="b")
    assert row == {1: 10.0, 4: 10.0} and [r["batch"] for r in raised] == [4]


def test_the_floor_is_what_the_docs_say():
    # docs/pipeline.md and the profiler's provenance quote it
    assert NOISE_FLOOR_US == 15.0


def _inject(monkeypatch, per_batch: dict[int, Timing]) -> None:
    """Every block of the real sub-models is 'timed' as ``per_batch`` says (the sessions
    are built and run once each; only the clock is replaced)."""
    real = block_measure._BlockRunner.time

    def fake(self, values, b, repeats, warmup):
        got = real(self, values, b, 1, 0)  # the batch really runs (or cannot: None)
        return None if got is None else per_batch[b]

    monkeypatch.setattr(block_measure._BlockRunner, "time", fake)


def test_profiler_writes_the_adjusted_profile_and_it_loads(monkeypatch, tmp_path, capsys):
    _inject(monkeypatch, {1: Timing(12.0, 0.1), 2: Timing(7.5, 0.1)})
    rc = main(["profile", "--blocks", "--models", "tiny_cnn", "--device", "cpu",
               "--batches", "1,2", "--out", str(tmp_path), "--json", "-"])
    assert rc == 0
    prof = load_profiles(tmp_path)["tiny_cnn"]["cpu"]
    n = prof.n_blocks
    assert prof.latency(1, 1) == prof.latency(1, 2) == [12.0] * n
    assert prof.provenance["monotone_adjusted"] == [
        {"fraction": 1, "block": i, "batch": 2, "measured_us": 7.5, "written_us": 12.0,
         "from_batch": 1} for i in range(n)]
    assert "running max" in prof.provenance["monotone"]


def test_profiler_refuses_a_real_inversion_and_writes_nothing(monkeypatch, tmp_path, capsys):
    _inject(monkeypatch, {1: Timing(500.0, 1.0), 2: Timing(100.0, 1.0)})
    pm = partition_model("tiny_cnn", "scaled")
    with pytest.raises(NonMonotoneProfileError, match="tiny_cnn block 0 on cpu"):
        block_measure.measure_blocks(pm, "cpu", [1, 2])
    assert main(["profile", "--blocks", "--models", "tiny_cnn", "--device", "cpu",
                 "--batches", "1,2", "--out", str(tmp_path)]) == 2
    assert "NonMonotoneProfileError" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
