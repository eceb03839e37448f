"""PPipe's MILP rules as planner parameters (issue 32), each on a small instance whose
exact optimum is derived by hand in the test's comments; the profiles and the cluster go
through the documented file formats (av_infer.pipeline.profile_files, cluster files).

Units: latencies in us, rates in requests/s. With ``margin=0`` the latency budget is the
SLO itself; one model at weight 1 makes the planned rate the MILP's lambda.
"""

from __future__ import annotations

import json

import pytest

from av_infer.pipeline.cluster import load_cluster_file
from av_infer.pipeline.errors import InfeasibleSloError
from av_infer.pipeline.planner import plan_cluster
from av_infer.pipeline.profile_files import load_profiles

pytest.importorskip("highspy")


def _profile(model: str, dtype: str, cut_bytes: list[float],
             fractions: dict[int, dict[int, list[float]]]) -> dict:
    return {"format": "av_infer.block_profile", "version": 1, "model": model,
            "device_type": dtype, "source": "measured", "latency_unit": "us",
            "bytes_unit": "B", "n_blocks": len(next(iter(next(iter(fractions.values()))
                                                          .values()))),
            "cut_bytes": cut_bytes,
            "fractions": {str(v): {"batches": sorted(rows),
                                   "latency": [rows[b] for b in sorted(rows)]}
                          for v, rows in fractions.items()},
            "provenance": {"command": "hand-written test instance"}}


def _setup(tmp_path, profiles: list[dict], types: list[dict]):
    d = tmp_path / "profiles"
    d.mkdir()
    for p in profiles:
        (d / f"{p['model']}.{p['device_type']}.blocks.json").write_text(json.dumps(p))
    cf = tmp_path / "cluster.json"
    cf.write_text(json.dumps({"format": "av_infer.cluster", "version": 1,
                              "device_types": types}))
    profs = load_profiles(d)
    return profs, load_cluster_file(cf, profs)


def _type(name: str, count: int, gps: int = 1, gbps: float = 80.0, lat: float = 0.0) -> dict:
    return {"name": name, "count": count, "gpus_per_server": gps, "link_gbps": gbps,
            "link_latency_us": lat}


# -- server-level link sharing ---------------------------------------------------------


def _link_instance(tmp_path):
    # Model m, 2 blocks. Type a runs block 0 in 1 us and block 1 in 100 us; type b the
    # reverse. SLO 50 us: the whole model on one type (101 us) is infeasible, so the only
    # pipelines are a[0,1) -> b[1,2): 1 + transfer + 1 us. The cut carries 40 000 B; an
    # 80 Gbit/s link moves 10 000 B/us, so the transfer takes 4 us (6 us in all: fits).
    # Compute allows 1e6 req/s per device; the link allows 1e6 / 4 = 250 000 req/s when
    # a device has its link to itself. a: 2 GPUs, b: 2 GPUs, both on one 2-GPU server.
    return _setup(tmp_path, [
        _profile("m", "a", [40000], {1: {1: [1.0, 100.0]}}),
        _profile("m", "b", [40000], {1: {1: [100.0, 1.0]}}),
    ], [_type("a", 2, gps=2), _type("b", 2, gps=2)])


def test_server_link_sharing_halves_the_rate_of_two_gpus_on_one_nic(tmp_path):
    profs, cluster = _link_instance(tmp_path)
    # Rule off (each GPU its own link): 2 a's -> 2 b's, each at min(1e6, 250 000):
    # 2 x 250 000 = 500 000 req/s.
    off = plan_cluster(profs, cluster, {"m": 0.05}, margin=0.0, max_partitions=2,
                       server_link_sharing=False)
    assert off.rate["m"] == pytest.approx(500_000, rel=1e-6)
    # Rule on: the two GPUs of a server share its 10 000 B/us link: 10 000 / 40 000 B per
    # request = 250 000 req/s for the whole server, 125 000 per GPU; 2 x 125 000.
    on = plan_cluster(profs, cluster, {"m": 0.05}, margin=0.0, max_partitions=2)
    assert on.rate["m"] == pytest.approx(250_000, rel=1e-6)
    assert on.rules["server_link_sharing"] is True
    (p,) = on.pipelines
    assert [(s.device_type, s.first, s.end, s.count) for s in p.stages] == \
        [("a", 0, 1, 2), ("b", 1, 2, 2)]
    assert p.stages[0].transfer_us == pytest.approx(4.0)
    assert on.device_types["a"]["gpus_per_server"] == 2
    assert on.device_types["a"]["source"] == "measured"


def test_link_latency_comes_from_the_cluster_file(tmp_path):
    # Same instance with a 50 us link latency on b: transfer 4 + 50 = 54 us, the
    # pipeline takes 56 us > the 50 us SLO, and nothing else fits: infeasible.
    profs, _ = _link_instance(tmp_path)
    (tmp_path / "c2.json").write_text(json.dumps({
        "format": "av_infer.cluster", "version": 1,
        "device_types": [_type("a", 2, gps=2), _type("b", 2, gps=2, lat=50.0)]}))
    cluster = load_cluster_file(tmp_path / "c2.json", profs)
    with pytest.raises(InfeasibleSloError, match="0.056 ms"):
        plan_cluster(profs, cluster, {"m": 0.05}, margin=0.0, max_partitions=2)


# -- batch-fill time in the budget -----------------------------------------------------


def _fill_instance(tmp_path):
    # One block; one device of type a; batch 1 takes 10 us, batch 2 takes 12 us. SLO 20.
    return _setup(tmp_path, [_profile("m", "a", [], {1: {1: [10.0], 2: [12.0]}})],
                  [_type("a", 1)])


def test_batch_fill_time_counts_against_the_budget(tmp_path):
    profs, cluster = _fill_instance(tmp_path)
    # Rule off: batch 2 fits (12 <= 20): 2 / 12 us = 166 666.7 req/s.
    off = plan_cluster(profs, cluster, {"m": 0.02}, margin=0.0)
    assert off.rate["m"] == pytest.approx(2e6 / 12, rel=1e-6)
    # Rule on at an expected 100 000 req/s: filling batch 2 takes 1.3 x 1 / 1e5 s = 13 us,
    # 12 + 13 = 25 > 20, so only batch 1 fits: 1 / 10 us = 100 000 req/s.
    on = plan_cluster(profs, cluster, {"m": 0.02}, margin=0.0, batch_fill_factor=1.3,
                      fill_rate={"m": 100_000.0})
    assert on.rate["m"] == pytest.approx(100_000, rel=1e-6)
    assert on.pipelines[0].batch == 1 and on.pipelines[0].fill_us == 0.0


def test_batch_fill_rate_defaults_to_the_no_partition_plan(tmp_path):
    profs, cluster = _fill_instance(tmp_path)
    # No fill_rate: the estimate is the no-partition plan's rate without the rule,
    # 166 666.7 req/s (above); batch 2 then fills in 1.3 / 166 666.7 s = 7.8 us and
    # 12 + 7.8 = 19.8 <= 20: batch 2 stays, 166 666.7 req/s.
    on = plan_cluster(profs, cluster, {"m": 0.02}, margin=0.0, batch_fill_factor=1.3)
    assert on.rate["m"] == pytest.approx(2e6 / 12, rel=1e-6)
    assert on.pipelines[0].batch == 2
    assert on.pipelines[0].fill_us == pytest.approx(7.8, rel=1e-6)
    assert on.rules["fill_rate"]["m"] == pytest.approx(2e6 / 12, rel=1e-6)
    assert "no-partition" in on.rules["fill_rate_source"]


# -- per-fraction batch lists ----------------------------------------------------------


def test_per_fraction_batch_lists_use_only_measured_cells(tmp_path):
    # One device of type a, one block. Whole device: only batch 1 measured (10 us).
    # Half a device: batch 1 (12 us) and batch 4 (20 us). SLO 30 us.
    # Whole, b=1: 100 000. Two halves, b=1: 2 x 1e6 / 12 = 166 666.7. Two halves, b=4:
    # 2 x 4e6 / 20 = 400 000: the optimum. Batch 4 on the whole device was not measured
    # and must not be invented (nor batch 2 anywhere).
    profs, cluster = _setup(tmp_path, [
        _profile("m", "a", [], {1: {1: [10.0]}, 2: {1: [12.0], 4: [20.0]}})],
        [_type("a", 1)])
    plan = plan_cluster(profs, cluster, {"m": 0.03}, margin=0.0)
    assert plan.rate["m"] == pytest.approx(400_000, rel=1e-6)
    (p,) = plan.pipelines
    assert p.batch == 4 and [(s.v, s.count) for s in p.stages] == [(2, 2)]
    assert plan.physical == {"a": [2]}
    # limit the planner to whole devices: batch 1 only, 100 000
    whole = plan_cluster(profs, cluster, {"m": 0.03}, margin=0.0, vfracs=(1,))
    assert whole.rate["m"] == pytest.approx(100_000, rel=1e-6)
    assert whole.pipelines[0].batch == 1


# -- same-type consecutive partitions at different fractions ---------------------------


def test_same_type_partitions_at_different_fractions(tmp_path):
    # Five devices of type a; model m of 2 blocks, batch 1, no bytes cross the cut.
    # Whole device: blocks take 10 and 10 us. Half a device: 40 and 5 us (block 1 keeps
    # its speed on half the device, block 0 does not).
    # Device-seconds per request: whole on 1/1: 20e-6; whole on 1/2: 45e-6 / 2 = 22.5e-6;
    # 1/1 [0,1) -> 1/2 [1,2): 10e-6 + 5e-6 / 2 = 12.5e-6 (the cheapest); 1/2 -> 1/1:
    # 20e-6 + 10e-6. So no plan exceeds 5 / 12.5e-6 = 400 000 req/s, and 4 whole devices
    # on block 0 (4 x 100 000) + 1 device split in 2 on block 1 (2 x 200 000) reach it.
    # Without the rule the best is 5 whole devices whole-model: 5 x 50 000 = 250 000
    # (5 x 2 halves: 10 x 22 222 = 222 222).
    profs, cluster = _setup(tmp_path, [
        _profile("m", "a", [0], {1: {1: [10.0, 10.0]}, 2: {1: [40.0, 5.0]}})],
        [_type("a", 5)])
    on = plan_cluster(profs, cluster, {"m": 1.0}, margin=0.0, max_partitions=2)
    assert on.rate["m"] == pytest.approx(400_000, rel=1e-6)
    (p,) = on.pipelines
    assert [(s.device_type, s.v, s.first, s.end, s.count) for s in p.stages] == \
        [("a", 1, 0, 1, 4), ("a", 2, 1, 2, 2)]
    assert sorted(on.physical["a"]) == [1, 1, 1, 1, 2]
    off = plan_cluster(profs, cluster, {"m": 1.0}, margin=0.0, max_partitions=2,
                       same_type_partitions=False)
    assert off.rate["m"] == pytest.approx(250_000, rel=1e-6)


def test_the_data_plane_shares_one_link_per_server(tmp_path):
    # The link instance's plan: 2 a's and 2 b's, each type one 2-GPU server. The
    # reservation tables get one uplink/downlink per server (a@0, b@0), not per GPU.
    from av_infer.pipeline.reservation import build_routes

    profs, cluster = _link_instance(tmp_path)
    plan = plan_cluster(profs, cluster, {"m": 0.05}, margin=0.0, max_partitions=2)
    links = {t.name: (t.link_gbps, t.link_us) for t in cluster.types}
    _, compute, phys = build_routes(plan, profs, links,
                                    {t.name: t.gpus_per_server for t in cluster.types})
    assert len(compute) == 4 and sorted(phys) == ["a@0", "b@0"]
    _, _, per_gpu = build_routes(plan, profs, links)
    assert len(per_gpu) == 4


def test_batch_fill_estimate_falls_back_when_no_partitioning_cannot_serve(tmp_path):
    # The link instance cannot run whole on one type (101 us > 50 us), so the
    # no-partition estimate is infeasible and the estimate is the partitioned plan's rate
    # without the rule (250 000 req/s); at batch 1 the fill time is 0 and the plan is the
    # one of the server-sharing test.
    profs, cluster = _link_instance(tmp_path)
    plan = plan_cluster(profs, cluster, {"m": 0.05}, margin=0.0, max_partitions=2,
                        batch_fill_factor=1.3)
    assert plan.rules["fill_rate_source"].startswith("partitioned plan")
    assert plan.rules["fill_rate"]["m"] == pytest.approx(250_000, rel=1e-6)
    assert plan.rate["m"] == pytest.approx(250_000, rel=1e-6)


# -- packing slices onto physical devices ----------------------------------------------


def test_a_device_may_carry_slices_of_different_fractions(tmp_path):
    # One device of type a. Model m1 was profiled only on half a device (one block, 10 us
    # at batch 1), m2 only on a quarter (20 us). Pure packing cuts a device into equal
    # slices, so it can serve one of the two models and the plan is refused. Mixed
    # (and ppipe: both are first partitions) cuts it 1/2 + 1/4 + 1/4: m1 gets 1e6 / 10 =
    # 100 000 req/s, m2 2 x 1e6 / 20 = 100 000; no cut serves both better (1/2 + 1/4
    # leaves m2 50 000), so lambda = 100 000.
    profs, cluster = _setup(tmp_path, [
        _profile("m1", "a", [], {2: {1: [10.0]}}),
        _profile("m2", "a", [], {4: {1: [20.0]}})], [_type("a", 1)])
    slo = {"m1": 1.0, "m2": 1.0}
    for packing in ("ppipe", "mixed"):
        plan = plan_cluster(profs, cluster, slo, margin=0.0, packing=packing)
        assert plan.rate["m1"] == pytest.approx(100_000, rel=1e-6)
        assert plan.rate["m2"] == pytest.approx(100_000, rel=1e-6)
        assert plan.physical == {"a": [[2, 4, 4]]} and plan.rules["packing"] == packing
        members = sorted(m for p in plan.pipelines for s in p.stages for m in s.members)
        assert members == ["a#0/2.0", "a#0/4.0", "a#0/4.1"]
    with pytest.raises(InfeasibleSloError, match="no rate for"):
        plan_cluster(profs, cluster, slo, margin=0.0, packing="pure")


def test_first_fit_equals_the_conflict_walk():
    """The one-resource slot search finds what repeated conflict() jumps find."""
    import numpy as np

    from av_infer.pipeline.reservation import _Timeline

    rng = np.random.default_rng(7)
    for _ in range(200):
        line = _Timeline()
        t = 0.0
        for _ in range(int(rng.integers(0, 30))):
            t += float(rng.exponential(1.0))
            d = float(rng.exponential(1.0))
            line.add(t, t + d)
            t += d
        for _ in range(10):
            t0, dur = float(rng.uniform(0, t + 1)), float(rng.exponential(1.0))
            want = t0
            while (e := line.conflict(want, dur)) is not None:
                want = e
            assert line.first_fit(t0, dur) == want


def test_earliest_slot_over_two_links_is_free_on_both():
    """Algorithm 2's earliestSlot over an uplink and a downlink: the slot found is free on
    both, and no earlier start on a grid of candidates is."""
    import numpy as np

    from av_infer.pipeline.reservation import DOWNLINK, UPLINK, ReservationTables

    rng = np.random.default_rng(11)
    for _ in range(100):
        tab = ReservationTables(1, 2)
        for kind, idx in ((UPLINK, 0), (DOWNLINK, 1)):
            t = 0.0
            for _ in range(int(rng.integers(0, 15))):
                t += float(rng.exponential(1.0))
                d = float(rng.exponential(1.0))
                tab.lines[kind][idx].add(t, t + d)
                tab.until[kind][idx] = t + d
                t += d
        t0, dur = float(rng.uniform(0, 10)), float(rng.exponential(0.8))
        res = ((UPLINK, 0), (DOWNLINK, 1))
        got = tab.earliest_slot(res, t0, dur)

        def free(x, tab=tab, dur=dur, res=res):
            return all(tab.lines[k][i].conflict(x, dur) is None for k, i in res)

        assert got >= t0 and free(got)
        assert not any(free(x) for x in np.linspace(t0, got, 200)[:-1] if x < got - 1e-9)
