"""``LatencyRecorder`` keeps the last ``cap`` samples and all-time count/total/max, as
it fills, grows and wraps (``add`` takes a store per sample on the request path)."""

from __future__ import annotations

import math
import random

import pytest

from av_infer.latency import LatencyRecorder, summarize_ms


@pytest.mark.parametrize("cap", [1, 63, 64, 100, 1000])
def test_keeps_the_last_cap_samples_and_all_time_figures(cap: int) -> None:
    rng = random.Random(cap)
    r = LatencyRecorder(cap=cap)
    seen: list[float] = []
    for i in range(3 * cap + 70):
        v = rng.random()
        r.add(v)
        seen.append(v)
        ring, count, total, mx = r.sample()
        assert count == len(seen)
        assert sorted(ring.tolist()) == sorted(seen[-cap:]), i
        assert math.isclose(total, math.fsum(seen), rel_tol=1e-12)
        assert mx == max(seen)


def test_empty_and_summary() -> None:
    r = LatencyRecorder()
    assert r.summary_ms()["p50"] is None
    for v in (0.001, 0.002, 0.003):
        r.add(v)
    s = summarize_ms(r.sample())
    assert math.isclose(s["p50"], 2.0) and math.isclose(s["max"], 3.0)
    assert math.isclose(s["mean"], 2.0)
