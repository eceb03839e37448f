"""Segment plans cut by what their cuts cost (``model.segments``: ``cut_cost``,
``max_cut_cost``, ``fewer_segments``); running segment plans is tested in
tests/devices/test_cpu_engine.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from av_infer.kernels.ort_segments import SegmentRunner, measure_cut_cost
from av_infer.model import zoo
from av_infer.model.segments import compile_segments, fewer_segments


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 16), cost=st.floats(0, 2), budget=st.floats(0, 0.5),
       total=st.floats(0.1, 500), max_seg=st.floats(0.1, 100))
def test_fewer_segments_keeps_the_budget_the_length_cap_and_never_adds(n, cost, budget, total,
                                                                       max_seg):
    m = fewer_segments(n, cost, budget, total, max_seg)
    assert 1 <= m <= n
    if n < 2 or cost <= budget:
        assert m == n  # within budget (or nothing cut): the plan stays as it is
        return
    per_cut = cost / (n - 1)
    floor = max(1, math.ceil(total / max_seg - 1e-9))
    # the budget pays for m - 1 cuts, unless the length cap needs more segments than that
    assert (m - 1) * per_cut <= budget + 1e-12 or m == min(n, floor)
    # and no fewer segments than the cap allows (while n had that many)
    assert m >= min(n, floor)


def test_a_costly_cut_is_cut_again_into_fewer_segments_with_the_same_results():
    path = zoo.path("resnet152", "scaled")
    seen = []

    def costly(cut, whole):
        seen.append((len(cut.segments), len(whole.segments)))
        return 0.30  # 30 % for the cuts made: far over the 5 % budget

    target = compile_segments(path, segment_ms=0.1, name="r")
    cut = compile_segments(path, segment_ms=0.1, name="r", cut_cost=costly,
                           max_cut_cost=0.05, max_segment_ms=10.0)
    n0 = seen[0][0]
    assert seen == [(n0, 1)] and n0 >= 2  # measured once, against the model in one segment
    per_cut = 0.30 / (n0 - 1)
    assert len(cut.segments) <= max(1, min(n0, 1 + int(0.05 / per_cut))) < n0
    assert cut.stats["cut_cost"] == 0.3 and cut.stats["segments_target"] >= n0
    assert cut.stats["max_cut_cost"] == 0.05 and target.stats["cut_cost"] is None
    x = zoo.sample_inputs("resnet152", "scaled", seed=3)
    ref = SegmentRunner(target).run(x)
    out = SegmentRunner(cut).run(x)  # other cuts, other ORT fusions: equal within rounding
    assert all(np.allclose(out[k], ref[k], rtol=1e-4, atol=1e-5) for k in ref)


def test_cuts_within_budget_and_whole_models_are_left_as_they_are():
    path = zoo.path("resnet152", "scaled")
    calls = []
    cheap = compile_segments(path, segment_ms=0.1, name="r", max_cut_cost=0.05,
                             cut_cost=lambda c, w: calls.append(len(c.segments)) or 0.01)
    assert len(calls) == 1 and cheap.stats["cut_cost"] == 0.01
    assert len(cheap.segments) == calls[0] >= 2  # the plan measured is the plan returned
    # nothing cut: nothing to measure
    whole = compile_segments(path, segment_ms=None, name="r",
                             cut_cost=lambda c, w: calls.append(-1) or 1.0)
    assert len(calls) == 1 and len(whole.segments) == 1 and whole.stats["cut_cost"] is None


def test_the_length_cap_keeps_segments_however_costly_the_cuts():
    path = zoo.path("resnet152", "scaled")
    capped = compile_segments(path, segment_ms=0.1, name="r", cut_cost=lambda c, w: 5.0,
                              max_cut_cost=0.0, max_segment_ms=0.2)
    free = compile_segments(path, segment_ms=0.1, name="r", cut_cost=lambda c, w: 5.0,
                            max_cut_cost=0.0, max_segment_ms=1e6)
    assert len(free.segments) == 1  # no cut is affordable and no length limit: whole
    assert capped.stats["profiled_ms"] > 0.4  # so a 0.2 ms cap needs at least two
    assert len(capped.segments) >= 2


@pytest.mark.parametrize("bad", [{"max_cut_cost": -0.1}, {"max_segment_ms": 0}])
def test_bad_cut_settings_are_refused_before_any_work(bad):
    with pytest.raises(ValueError):
        compile_segments(zoo.path("resnet152", "scaled"), segment_ms=0.1, **bad)


def test_measure_cut_cost_runs_both_plans_and_returns_a_fraction():
    path = zoo.path("densenet201", "scaled")
    cut = compile_segments(path, segment_ms=0.05, name="d")
    whole = compile_segments(path, segment_ms=None, name="d")
    assert len(cut.segments) >= 2
    frac = measure_cut_cost(cut, whole, threads=1, budget_s=0.05, min_rounds=3, max_rounds=3)
    assert isinstance(frac, float) and math.isfinite(frac) and frac > -1.0
