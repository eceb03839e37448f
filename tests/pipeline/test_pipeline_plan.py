"""Pool pipelines (paper 004): partitioning, block profiles, the MILP, the data plane and
the cluster simulator. Everything here is ROS-free and runs in virtual time."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from av_infer.errors import AvInferError, DeadlineMissedError, InvalidParameterError
from av_infer.model import zoo
from av_infer.model.compiler import compile_model
from av_infer.pipeline.batcher import Dispatch, Drop, ReservationBatcher
from av_infer.pipeline.block_profiles import derive_block_profile, partition_model
from av_infer.pipeline.cluster import parse_cluster
from av_infer.pipeline.errors import (
    InfeasibleSloError,
    UncuttableModelError,
    UnknownDeviceTypeError,
)
from av_infer.pipeline.partition import crossings, extract_stage, prepartition
from av_infer.pipeline.planner import plan_cluster
from av_infer.pipeline.reservation import COMPUTE, ReservationTables, build_routes
from av_infer.pipeline.simulator import simulate
from av_infer.profiles import BlockProfile

SIM = "h100:2,orin:6"


@pytest.fixture(scope="module")
def sim_profiles():
    """Derived block profiles of two scaled zoo models on the simulated h100 and orin."""
    out = {}
    for m in ("resnet152", "vgg19"):
        pm = partition_model(m, "scaled")
        out[m] = {g: derive_block_profile(pm, g) for g in ("h100", "orin")}
    return out


# -- cluster specs --------------------------------------------------------------------------
def test_cluster_spec_parses_and_refuses_with_reasons():
    c = parse_cluster("h100:25, orin:75")
    assert c.counts == (("h100", 25), ("orin", 75)) and c.total == 100 and c.simulated
    assert parse_cluster("cpu:2").counts == (("cpu", 2),)
    with pytest.raises(UnknownDeviceTypeError, match="tpu"):
        parse_cluster("h100:2,tpu:3")
    with pytest.raises(InvalidParameterError, match="integer"):
        parse_cluster("h100:x")
    with pytest.raises(InvalidParameterError, match="mixes"):
        parse_cluster("h100:1,cpu:1")


# -- partitioning -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["resnet152", "distilbert"])
def test_blocks_cover_the_plan_and_their_chain_computes_the_model(name):
    path = zoo.path(name, "scaled")
    plan = compile_model(path, name=name)
    blocks = prepartition(plan, [1.0] * len(plan.kernels), 10)
    assert len(blocks) == 10 and blocks[0].start == 0 and blocks[-1].end == len(plan.kernels)
    assert all(a.end == b.start for a, b in zip(blocks, blocks[1:]))
    # roughly equal latency: no block is more than ~3x the mean on uniform kernel times
    sizes = [b.end - b.start for b in blocks]
    assert max(sizes) <= 3 * len(plan.kernels) / 10 + 1
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    feeds = zoo.sample_inputs(name, "scaled")
    whole = ort.InferenceSession(model.SerializeToString())
    ref = whole.run(None, feeds)
    values = dict(feeds)
    for first, end in ((0, 4), (4, 10)):  # a two-stage pipeline
        sess = ort.InferenceSession(extract_stage(model, blocks, first, end).SerializeToString())
        outs = sess.run(None, {i.name: values[i.name] for i in sess.get_inputs()})
        values.update({o.name: v for o, v in zip(sess.get_outputs(), outs)})
    for o, r in zip(whole.get_outputs(), ref):
        np.testing.assert_allclose(values[o.name], r, rtol=1e-4, atol=1e-5)


def test_cuts_prefer_few_crossing_bytes():
    plan = compile_model(zoo.path("resnet152", "scaled"), name="resnet152")
    cross = crossings(plan)
    blocks = prepartition(plan, [1.0] * len(plan.kernels), 4)
    for b in blocks[:-1]:  # inside a residual unit two tensors cross; cuts avoid that
        neighbours = [cross[c][1] for c in (b.end - 1, b.end + 1) if 0 < c < len(plan.kernels)]
        assert b.out_bytes <= max(neighbours)


def test_a_model_that_cannot_be_cut_is_a_typed_error(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "one", [x], [y])
    path = tmp_path / "one.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    plan = compile_model(path, name="one")
    with pytest.raises(UncuttableModelError, match="nothing to cut") as e:
        prepartition(plan, [1.0] * len(plan.kernels), 10)
    assert e.value.code == "uncuttable_model" and isinstance(e.value, AvInferError)


def test_block_profiles_round_trip_through_the_profile_store(tmp_path, sim_profiles):
    prof = sim_profiles["vgg19"]["orin"]
    prof.save(tmp_path / "p.json")
    again = BlockProfile.load(tmp_path / "p.json")
    assert again == prof
    # more work per batch and slower on a quarter device; the embedded GPU slower overall
    assert sum(prof.latency(1, 8)) > sum(prof.latency(1, 1))
    assert sum(prof.latency(4, 1)) >= sum(prof.latency(1, 1))
    assert sum(prof.latency(1, 1)) > sum(sim_profiles["vgg19"]["h100"].latency(1, 1))


# -- the MILP -----------------------------------------------------------------------------
def test_plan_respects_slo_devices_and_unified_batches(sim_profiles):
    cluster = parse_cluster(SIM)
    plan = plan_cluster(sim_profiles, cluster)
    assert plan.status in ("Optimal", "Time limit reached")
    assert set(plan.rate) == set(sim_profiles) and all(r > 0 for r in plan.rate.values())
    used: dict[str, float] = {}
    for p in plan.pipelines:
        budget_us = plan.slo_ms[p.model] * 1e3 * (1 - plan.margin)
        assert p.latency_us <= budget_us + 1e-6
        assert [s.first for s in p.stages][0] == 0 and p.stages[-1].end == 10
        assert all(a.end == b.start for a, b in zip(p.stages, p.stages[1:]))
        for s in p.stages:
            assert len(s.members) == s.count and s.v in (1, 2, 3, 4)
            used[s.device_type] = used.get(s.device_type, 0) + s.count / s.v
    for t, n in cluster.counts:
        assert used.get(t, 0) <= n + 1e-9
    json.dumps(plan.to_dict())  # the CLI's output is plain JSON


def test_no_partition_plan_uses_whole_models(sim_profiles):
    plan = plan_cluster(sim_profiles, parse_cluster(SIM), max_partitions=1)
    assert all(len(p.stages) == 1 for p in plan.pipelines)


def test_infeasible_slo_and_bad_settings_are_refused_before_any_work(sim_profiles):
    with pytest.raises(InfeasibleSloError, match="resnet152.*fastest takes") as e:
        plan_cluster(sim_profiles, parse_cluster(SIM), {"resnet152": 0.001})
    assert e.value.code == "infeasible_slo"
    for kwargs in ({"margin": 1.5}, {"max_partitions": 0}, {"slo_ms": {"nope": 5.0}},
                   {"slo_ms": {"vgg19": -1.0}}):
        with pytest.raises(InvalidParameterError):
            plan_cluster(sim_profiles, parse_cluster(SIM), **kwargs)


# -- the data plane -----------------------------------------------------------------------
def _tiny_plan(sim_profiles):
    plan = plan_cluster({"vgg19": sim_profiles["vgg19"]}, parse_cluster(SIM))
    routes, cids, pids = build_routes(plan, {"vgg19": sim_profiles["vgg19"]},
                                      {"h100": (100.0, 20.0), "orin": (10.0, 20.0)})
    return plan, routes, ReservationTables(len(cids), len(pids))


def test_probe_is_pure_and_reserve_books_the_earliest_member(sim_profiles):
    _, routes, tables = _tiny_plan(sim_profiles)
    r = routes[0]
    before = tables.compute.copy()
    p1 = tables.probe(r, r.batch, 1.0)
    assert np.array_equal(tables.compute, before)  # probe changes nothing
    tables.reserve(p1)
    p2 = tables.probe(r, r.batch, 1.0)
    if len(r.members[0]) > 1:  # the next batch goes to another, free member
        assert p2.path[0] != p1.path[0] and p2.finish == pytest.approx(p1.finish)
    else:
        assert p2.finish > p1.finish and p2.wait > 0
    # feedback: the first stage ran 1 ms late -> its device is free 1 ms later
    kind, idx, _, end = p1.resv[0]
    assert kind == COMPUTE
    tables.correct(kind, idx, end, end + 1e-3)
    assert tables.compute[idx] == pytest.approx(end + 1e-3)


def test_batcher_drops_waits_and_dispatches(sim_profiles):
    plan, routes, tables = _tiny_plan(sim_profiles)
    b = ReservationBatcher(routes, tables)
    slo = plan.slo_ms["vgg19"] / 1e3
    # 1. an already hopeless request is dropped (answered deadline_missed by the caller)
    b.submit("vgg19", "late", 0.0, 1e-6)
    acts, wake = b.step("vgg19", 0.0)
    assert [type(a) for a in acts] == [Drop] and acts[0].request.rid == "late"
    assert issubclass(DeadlineMissedError, AvInferError)
    # 2. one request, a unified batch > 1: wait until the last safe moment
    b.submit("vgg19", "a", 0.0, slo)
    acts, wake = b.step("vgg19", 0.0)
    big = max(r.batch for r in routes)
    if big > 1:
        assert acts == [] and wake is not None and 0.0 < wake < slo
        # 3. at that moment it goes alone, and still meets its deadline
        acts, wake = b.step("vgg19", wake)
    assert len(acts) == 1 and isinstance(acts[0], Dispatch) and wake is None
    assert acts[0].probe.finish <= slo and [q.rid for q in acts[0].requests] == ["a"]
    # 4. a full batch goes at once
    for i in range(big):
        b.submit("vgg19", i, 0.0, slo)
    acts, _ = b.step("vgg19", 0.0)
    assert sum(len(a.requests) for a in acts if isinstance(a, Dispatch)) == big


# -- the simulator ------------------------------------------------------------------------
@pytest.mark.parametrize("load", ["poisson", "bursty"])
def test_simulator_counts_every_request_once_and_meets_slo_at_low_load(sim_profiles, load):
    cluster = parse_cluster(SIM)
    plan = plan_cluster(sim_profiles, cluster)
    rate = 0.3 * sum(plan.rate.values())
    r = simulate(plan, sim_profiles, cluster, rate, duration_s=0.2, load=load, seed=1)
    assert r.requests == r.served + r.dropped + r.late
    assert r.requests > 100 and r.attainment >= 0.99
    assert set(r.utilisation) == {"h100", "orin"}
    assert all(0 <= u <= 1 for u in r.utilisation.values())
    # a tenth of the low-load horizon: at 3x the planned rate as many requests (~42,000)
    # as the low-load run, and the shedding shows from the start (attainment ~0.14 at
    # 0.02 s as at 0.2 s, which cost ten times as long to simulate)
    over = simulate(plan, sim_profiles, cluster, 3 * sum(plan.rate.values()),
                    duration_s=0.02, load=load, seed=1)
    assert over.requests > 100
    assert over.requests == over.served + over.dropped + over.late
    assert over.attainment < 0.99 and over.dropped > 0  # overload sheds, does not hang


# -- the CLI ------------------------------------------------------------------------------
def test_cli_plan_prints_json_and_refuses_bad_input_with_typed_errors(capsys):
    from av_infer.cli import main

    assert main(["pipeline", "plan", "--cluster", "cpu:2", "--models", "tiny_cnn",
                 "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rate"]["tiny_cnn"] > 0 and doc["solve_s"] >= 0 and doc["pipelines"]
    assert doc["slo_ms"]["tiny_cnn"] > 0 and "5x" in doc["slo_rule"]
    for argv, why in ((["--cluster", "tpu:4"], "unknown device type"),
                      (["--cluster", "cpu:1", "--models", "tiny_cnn", "--slo-ms", "1e-6"],
                       "InfeasibleSloError"),
                      (["--cluster", "cpu:1", "--models", "nope"], "unknown model")):
        assert main(["pipeline", "plan", *argv]) == 2
        assert why in capsys.readouterr().err
