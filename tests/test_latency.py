"""``LatencyRecorder`` keeps the last ``cap`` samples and all-time count/total/max, as
it fills, grows and wraps (``add`` takes a store per sample on the request path); its
percentiles are numpy's, bit for bit (``quantiles``)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from av_infer.latency import LatencyRecorder, quantiles, summarize_ms


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


def test_compiled_and_interpreted_recorders_agree() -> None:
    """The recorder is compiled where built (av_infer/latency.pxd); the same source run by
    the interpreter (``AV_INFER_INTERPRETED=1``) keeps the same samples and figures through
    filling, growing and wrapping, and both refuse a cap below 1."""
    import json
    import os
    import subprocess
    import sys

    from av_infer import latency
    from av_infer._cy.compiled import is_compiled

    code = ("import json, sys; import av_infer; from av_infer import latency as L; "
            "from av_infer._cy.compiled import is_compiled; "
            "assert is_compiled(L) == (sys.argv[1] == '1'), L.__file__; "
            "out = []\n"
            "for cap in (1, 5, 64, 100):\n"
            "    r = L.LatencyRecorder(cap)\n"
            "    for i in range(3 * cap + 70):\n"
            "        r.add((i * 7919 % 1000) / 1e3)\n"
            "    a, n, t, m = r.sample(); out.append([a.tolist(), n, t, m])\n"
            "try:\n    L.LatencyRecorder(0)\nexcept ValueError:\n    out.append('refused')\n"
            "print(json.dumps(out))")
    runs = {}
    for interpreted in ("", "1"):
        env = {**os.environ, "AV_INFER_INTERPRETED": interpreted}
        if not interpreted:
            env.pop("AV_INFER_INTERPRETED")
        flag = "0" if interpreted else ("1" if is_compiled(latency) else "0")
        runs[interpreted] = json.loads(subprocess.run(
            [sys.executable, "-c", code, flag], env=env, check=True, capture_output=True,
            text=True).stdout)
    assert runs[""] == runs["1"]
    assert runs[""][-1] == "refused"


_finite = st.floats(0, 1e3, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(_finite, min_size=1, max_size=300) | st.lists(
           st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=1, max_size=40),
       qs=st.lists(st.floats(0, 1), min_size=1, max_size=6), nan_at=st.none() | st.integers(0))
def test_quantiles_are_numpys_percentiles_bit_for_bit(values, qs, nan_at) -> None:
    """``quantiles`` returns exactly ``np.quantile``'s default ("linear") figures:
    ties, one sample, the quantiles 0 and 1, and NaN for every quantile once a sample is
    NaN (numpy's rule)."""
    a = np.array(values, dtype=np.float64)
    if nan_at is not None:
        a[nan_at % len(a)] = np.nan
    want = np.quantile(a, qs).tolist()
    got = quantiles(a.copy(), tuple(qs))
    assert all(g == w or (math.isnan(g) and math.isnan(w)) for g, w in zip(got, want)), (
        got, want)


def test_summary_percentiles_are_numpys() -> None:
    r = LatencyRecorder(cap=5000)
    rng = random.Random(7)
    for _ in range(4321):
        r.add(rng.lognormvariate(-7, 1))
    a = r.sample()[0] * 1e3
    s = summarize_ms(r.sample())
    assert [s["p50"], s["p90"], s["p99"], s["p999"]] == np.percentile(
        a, [50, 90, 99, 99.9]).tolist()
