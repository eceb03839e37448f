"""The pipeline executor in one process: stages on two cpu Runtimes, exactly-once answers,
a migration that loses nothing, and a dead lane failing its requests then re-planned."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from av_infer import Runtime
from av_infer.errors import DeadlineMissedError, UnknownModelError
from av_infer.model import zoo
from av_infer.pipeline.block_profiles import block_profiles
from av_infer.pipeline.cluster import parse_cluster
from av_infer.pipeline.errors import StageFailedError
from av_infer.pipeline.executor import PipelineExecutor
from av_infer.pipeline.lanes import LocalLane
from av_infer.pipeline.planner import plan_cluster

MODEL = "resnet152"
SLO = {MODEL: 10000.0}  # generous: these tests check answers, not speed
WAIT_S = 120.0


@pytest.fixture(scope="module")
def profiles():
    return block_profiles([MODEL], parse_cluster("cpu:2").types)


@pytest.fixture(scope="module")
def reference():
    x = zoo.sample_inputs(MODEL)
    return x, ort.InferenceSession(str(zoo.path(MODEL, "scaled"))).run(None, x)[0]


@pytest.fixture
def lanes():
    rts = [Runtime("cpu") for _ in range(2)]
    yield [LocalLane(f"cpu{i}", rt) for i, rt in enumerate(rts)]
    for rt in rts:
        rt.close(drain=False)


def _executor(profiles, lanes, fp16=False, **kw):
    cluster = parse_cluster("cpu:2")
    plan = plan_cluster(profiles, cluster, SLO, min_partitions=2, max_partitions=2,
                        fp16_boundaries=fp16)
    return PipelineExecutor(plan, profiles, cluster, lanes, **kw)


def test_two_stages_in_process_answer_every_request_once(profiles, lanes, reference):
    x, ref = reference
    ex = _executor(profiles, lanes)
    try:
        assert [len(p.stages) for p in ex.plan.pipelines] == [2]
        futs = [ex.submit(MODEL, x) for _ in range(40)]
        for f in futs:
            np.testing.assert_allclose(f.result(WAIT_S)["logits"], ref, rtol=1e-4, atol=1e-5)
        assert ex.stats()["answered"] == 40 and ex.stats()["late"] == 0
        assert isinstance(ex.submit("vgg19", x).exception(WAIT_S), UnknownModelError)
        # an impossible deadline: dropped by the batcher with a typed error, still answered
        late = ex.submit(MODEL, x, deadline_s=1e-9)
        assert isinstance(late.exception(WAIT_S), DeadlineMissedError)
    finally:
        ex.close()


def test_fp16_boundaries_halve_the_feature_maps_and_keep_the_answer(profiles, lanes,
                                                                     reference):
    x, ref = reference
    ex = _executor(profiles, lanes, fp16=True)
    try:
        out = ex.submit(MODEL, x).result(WAIT_S)["logits"]
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2)
    finally:
        ex.close()


def test_migration_preloads_flushes_switches_and_loses_nothing(profiles, lanes, reference):
    x, ref = reference
    ex = _executor(profiles, lanes)
    try:
        before = [ex.submit(MODEL, x) for _ in range(30)]
        ex.migrate(plan_cluster(profiles, parse_cluster("cpu:2"), SLO, max_partitions=1))
        after = [ex.submit(MODEL, x) for _ in range(30)]
        for f in before + after:
            np.testing.assert_allclose(f.result(WAIT_S)["logits"], ref, rtol=1e-4, atol=1e-5)
        assert ex.stats()["generation"] == 2
        assert all(len(p.stages) == 1 for p in ex.plan.pipelines)
    finally:
        ex.close()


def test_a_dead_lane_fails_its_requests_and_the_plan_moves_to_what_remains(
        profiles, lanes, reference):
    x, ref = reference
    ex = _executor(profiles, lanes, replan=lambda c, weights=None: plan_cluster(
        profiles, c, SLO, max_partitions=1, weights=weights))
    try:
        lanes[1].runtime.close(drain=False)  # the second stage's device goes away
        failed = ex.submit(MODEL, x)
        assert isinstance(failed.exception(WAIT_S), StageFailedError)
        _wait_for(lambda: ex.stats()["replans"] == 1)
        assert ex.plan.cluster == "cpu:1"
        f = ex.submit(MODEL, x)
        np.testing.assert_allclose(f.result(WAIT_S)["logits"], ref, rtol=1e-4, atol=1e-5)
    finally:
        ex.close()


def test_a_load_change_replans_and_migrates_without_loss(lanes, reference):
    models = [MODEL, "tiny_cnn"]
    cluster = parse_cluster("cpu:2")
    profs = block_profiles(models, cluster.types)
    slo = {m: 10000.0 for m in models}

    def planner(c, weights=None):
        return plan_cluster(profs, c, slo, max_partitions=1, weights=weights)

    ex = PipelineExecutor(planner(cluster), profs, cluster, lanes, replan=planner)
    try:
        x, ref = reference
        assert not ex.replan_for_load()  # nothing seen yet
        futs = [ex.submit(MODEL, x) for _ in range(20)]  # all of one model: the mix moved
        assert ex.replan_for_load(min_change=0.25)
        futs += [ex.submit(MODEL, x) for _ in range(10)]
        for f in futs:
            np.testing.assert_allclose(f.result(WAIT_S)["logits"], ref, rtol=1e-4, atol=1e-5)
        assert ex.stats()["generation"] == 2 and ex.stats()["answered"] == 30
        assert not ex.replan_for_load(min_change=1.0)  # a distance never exceeds 1
    finally:
        ex.close()


def _wait_for(pred, timeout=WAIT_S):
    import time

    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.01)
