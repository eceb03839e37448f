"""Metrics of the benchmark report on hand-made records (docs/design.md definitions)."""

from __future__ import annotations

import math

import pytest

from av_infer.bench.metrics import Record, Residency, standalone_stats, summarize


def _rt(arrival: float, lat: float, fk: float = 0.0001, client: str = "cam",
        model: str = "m", deadline: float = math.inf) -> Record:
    return Record(client=client, model=model, rt=True, arrival=arrival, start=arrival,
                  first_kernel_start=arrival + fk, end=arrival + lat,
                  deadline=arrival + deadline, kernels=10)


def _be(start: float, end: float, **kw: int) -> Record:
    return Record(client="bg", model="b", rt=False, arrival=start, start=start,
                  first_kernel_start=start, end=end, kernels=10, **kw)


def test_latency_increase_and_deadlines() -> None:
    ref = {"m": {"p50_s": 0.010, "p99_s": 0.010}}
    recs = [_rt(i * 0.1, 0.011, deadline=0.0105) for i in range(10)]
    recs[0] = _rt(0.0, 0.010, deadline=0.0105)
    out = summarize(recs, 1.0, ref)
    rt = out["rt"]
    assert rt["p50_ms"] == pytest.approx(11.0)
    assert rt["standalone_p50_ms"] == pytest.approx(10.0)
    assert rt["increase_pct"] == pytest.approx(10.0)
    assert rt["deadline_misses"] == 9 and rt["count"] == 10
    assert rt["clients"]["cam"]["deadline_ms"] == pytest.approx(10.5)
    assert rt["clients"]["cam"]["increase_pct"] == pytest.approx(10.0)


def test_multi_client_increase_normalises_per_model() -> None:
    ref = {"a": {"p50_s": 0.01, "p99_s": 0.01}, "b": {"p50_s": 0.1, "p99_s": 0.1}}
    recs = [_rt(i, 0.01, model="a", client="ca") for i in range(5)]
    recs += [_rt(i, 0.2, model="b", client="cb") for i in range(5)]
    out = summarize(recs, 10.0, ref)
    assert out["rt"]["clients"]["ca"]["increase_pct"] == pytest.approx(0.0)
    assert out["rt"]["clients"]["cb"]["increase_pct"] == pytest.approx(100.0)
    assert out["rt"]["increase_pct"] == pytest.approx(50.0)  # median of ratios {1, 2} - 1


def test_throughput_counts_window_completions() -> None:
    recs = [_rt(0.1 * i, 0.01) for i in range(10)]
    recs += [_be(0.0, 0.5), _be(0.5, 0.99), _be(0.99, 1.2)]  # last ends after the window
    out = summarize(recs, 1.0, {"m": {"p50_s": 0.01, "p99_s": 0.01}})
    assert out["be"]["count"] == 2 and out["be"]["submitted"] == 3
    assert out["be"]["throughput_rps"] == pytest.approx(2.0)
    assert out["throughput_rps"] == pytest.approx(12.0)


def test_dispatch_latency_only_counts_contended_arrivals() -> None:
    recs = [_rt(0.1, 0.01, fk=50e-6), _rt(0.7, 0.01, fk=5e-6)]
    recs.append(_be(0.0, 0.5, preempted=1))
    out = summarize(recs, 1.0, {"m": {"p50_s": 0.01, "p99_s": 0.01}}, preemptions=1)
    assert out["dispatch_latency_us"]["count"] == 1
    assert out["dispatch_latency_us"]["p50"] == pytest.approx(50.0)
    assert out["first_kernel_us"]["count"] == 2
    assert out["preemptions"] == 1 and out["preempted_requests"] == 1
    assert out["padded_fraction"] == 0.0


def test_failed_requests_are_misses_and_empty_is_null() -> None:
    bad = Record(client="cam", model="m", rt=True, arrival=0.0, error="DeadlineMissedError: x")
    out = summarize([bad], 1.0, {"m": {"p50_s": 0.01, "p99_s": 0.01}})
    assert out["rt"]["deadline_misses"] == 1 and out["rt"]["failed"] == 1
    assert out["rt"]["p50_ms"] is None and out["dispatch_latency_us"]["p50"] is None


def test_standalone_stats() -> None:
    s = standalone_stats([0.01] * 9 + [0.02])
    assert s["p50_s"] == pytest.approx(0.01) and s["n"] == 10


def test_dispatch_latency_excludes_queueing_behind_rt() -> None:
    # The second RT request arrives while the first runs: it becomes runnable when the
    # first completes (0.02), its first kernel starts 30 us later.
    first = _rt(0.0, 0.02, fk=10e-6)
    second = Record(client="cam", model="m", rt=True, arrival=0.01, start=0.02,
                    first_kernel_start=0.02003, end=0.04, kernels=10)
    out = summarize([first, second, _be(0.0, 0.5)], 1.0, {"m": {"p50_s": 0.02, "p99_s": 0.02}})
    assert out["dispatch_latency_us"]["count"] == 2
    assert out["dispatch_latency_us"]["max"] == pytest.approx(30.0)


def test_preemption_latency_is_until_the_last_resident_be_work_left() -> None:
    # RT runnable at 0.1 and 0.7; BE batches [0.05, 0.10012) and [0.09, 0.10020) are
    # resident at 0.1 (the later one leaves 200 us after), [0.2, 0.3) is not; nothing is
    # resident at 0.7.
    recs = [_rt(0.1, 0.01), _rt(0.7, 0.01), _be(0.0, 0.9)]
    res = Residency.of([0.05, 0.09, 0.2, 0.69], [0.10012, 0.10020, 0.3, 0.7], "block batch")
    out = summarize(recs, 1.0, {"m": {"p50_s": 0.01, "p99_s": 0.01}}, residency=res)
    pl = out["preemption_latency_us"]
    assert pl["applicable"] and pl["grain"] == "block batch"
    assert pl["count"] == 1 and pl["arrivals"] == 2
    assert pl["max"] == pytest.approx(200.0)


def test_preemption_latency_not_applicable_without_preemption() -> None:
    res = Residency.of([0.0], [1.0], "kernel")
    out = summarize([_rt(0.1, 0.01)], 1.0, {"m": {"p50_s": 0.01, "p99_s": 0.01}},
                    residency=res, preempts=False)
    assert out["preemption_latency_us"]["applicable"] is False
    assert "p99" not in out["preemption_latency_us"]


def test_rt_slowdown_is_device_time_over_standalone_device_time() -> None:
    ref = {"m": standalone_stats([0.0101] * 5, device_s=[0.01] * 5)}
    recs = [_rt(0.0, 0.0201, fk=0.0001), _rt(0.1, 0.0101, fk=0.0001)]  # device 20 and 10 ms
    out = summarize(recs, 1.0, ref)
    assert out["rt_slowdown"]["max"] == pytest.approx(2.0)
    assert out["rt_slowdown"]["p50"] == pytest.approx(1.5)
    assert out["rt_slowdown"]["count"] == 2
