"""Deadline utility of seed paper 001 §3."""

from __future__ import annotations

import math

import pytest

from av_infer.errors import InvalidParameterError
from av_infer.qos import UtilityAccumulator, UtilityTracker, utility


def test_utility_values() -> None:
    assert utility(0.005, 0.010, 0.030) == 1.0
    assert utility(0.010, 0.010, 0.030) == 1.0
    assert utility(0.020, 0.010, 0.030) == pytest.approx(0.5)
    assert utility(0.030, 0.010, 0.030) == 0.0
    assert utility(1.0, 0.010, 0.030) == 0.0
    assert utility(math.nan, 0.010, 0.030) == 0.0


def test_soft_equals_hard_is_a_step() -> None:
    assert utility(0.010, 0.010, 0.010) == 1.0
    assert utility(0.0100001, 0.010, 0.010) == 0.0


def test_accumulator_and_tracker() -> None:
    a = UtilityAccumulator(0.01, 0.03)
    for lat in (0.0, 0.02, 0.05):
        a.add(lat)
    a.add_failure()
    assert a.count == 4 and a.mean == pytest.approx(1.5 / 4)
    assert (a.soft_met, a.hard_met) == (1, 2)
    with pytest.raises(InvalidParameterError):
        UtilityAccumulator(0.03, 0.01)
    t = UtilityTracker()
    assert t.record("cam", 0.0) is None  # untracked client
    t.configure("cam", 0.01, 0.02)
    t.record("cam", 0.015)
    t.configure("dms", 0.05, None)  # step utility
    t.record("dms", 0.06)
    s = t.summary()
    assert s["cam"]["mean_utility"] == pytest.approx(0.5)
    assert s["dms"]["mean_utility"] == 0.0 and s["dms"]["hard_deadline_s"] == 0.05
    t.reset()
    assert t.summary()["cam"]["count"] == 0
