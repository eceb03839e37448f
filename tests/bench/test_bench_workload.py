"""DISB workload parsing and arrival schedules (no runtime needed)."""

from __future__ import annotations

import json

import pytest

from av_infer.bench.workload import (
    WorkloadError,
    expand,
    load_workload,
    parse_workload,
    read_trace,
    with_trace,
)


def _task(tid: str, load: dict, model: str = "vgg19-imagenet") -> dict:
    return {"id": tid, "load": load, "client": {"name": tid, "model_name": model,
                                                "batch_size": 1}}


@pytest.mark.parametrize("name,n_rt,n_be", [("A", 1, 1), ("B", 1, 1), ("C", 1, 5),
                                            ("D", 5, 5), ("E", 5, 5)])
def test_builtin_workloads_parse(name: str, n_rt: int, n_be: int) -> None:
    wl = load_workload(name)
    assert wl.name == name
    assert len(wl.rt_tasks) == n_rt and len(wl.be_tasks) == n_be
    assert all(t.load_type == "continuous" for t in wl.be_tasks)
    assert set(wl.models) <= {"vgg19", "resnet152", "densenet201", "inception_v3", "distilbert"}


def test_expand_all() -> None:
    assert expand("all") == ["A", "B", "C", "D", "E"]
    assert expand("A,C") == ["A", "C"]


def test_periodic_arrivals_and_period() -> None:
    t = load_workload("A").rt_tasks[0]
    arr = t.arrivals(2.0)
    assert len(arr) == 200 and arr[0] == 0.0
    assert arr[1] == pytest.approx(0.01)
    assert t.period_s == pytest.approx(0.01)
    assert t.arrivals(1.0, offset=0.005)[0] == pytest.approx(0.005)


def test_poisson_is_deterministic_per_seed() -> None:
    wl = load_workload("E")
    a = wl.rt_tasks[0].arrivals(10.0, seed=1)
    assert a == wl.rt_tasks[0].arrivals(10.0, seed=1)
    assert a != wl.rt_tasks[0].arrivals(10.0, seed=2)
    assert a != wl.rt_tasks[1].arrivals(10.0, seed=1)  # independent streams per task
    assert 120 < len(a) < 280  # ~20 req/s
    assert all(0 <= x < 10 for x in a) and a == sorted(a)


def test_disb_coordinator_staggers_periodic_loads() -> None:
    wl = load_workload("D")
    ref = {m: 0.01 for m in wl.models}
    off = wl.periodic_offsets(ref)
    assert [off[t.id] for t in wl.rt_tasks] == pytest.approx([0.0, 0.01, 0.02, 0.03, 0.04])


def test_trace_load_and_trace_file(tmp_path) -> None:
    doc = {"tasks": [_task("cam_rt", {"type": "trace", "trace": [30, 10, 20, 5000]}),
                     _task("bg_be", {"type": "continuous"}, "resnet152-imagenet")]}
    wl = parse_workload(doc)
    assert wl.rt_tasks[0].arrivals(1.0) == pytest.approx([0.01, 0.02, 0.03])
    p = tmp_path / "trace.json"
    p.write_text(json.dumps([0, 25, 50]))
    tr = read_trace(p)
    wl2 = with_trace(load_workload("A"), tr)
    assert wl2.rt_tasks[0].load_type == "trace"
    assert wl2.rt_tasks[0].arrivals(1.0) == pytest.approx([0.0, 0.025, 0.05])
    assert wl2.be_tasks[0].load_type == "continuous"


def test_rt_be_classification() -> None:
    doc = {"tasks": [_task("a", {"type": "periodic", "frequency": 10}),
                     _task("b", {"type": "continuous"}),
                     _task("c", {"type": "continuous", "rt": True}),
                     _task("d_be", {"type": "poisson", "frequency": 5})]}
    wl = parse_workload(doc)
    assert [t.rt for t in wl.tasks] == [True, False, True, False]


@pytest.mark.parametrize("task,msg", [
    (_task("x", {"type": "dependent", "prev_task_ids": ["y"]}), "dependent"),
    (_task("x", {"type": "bursty"}), "unknown load type"),
    (_task("x", {"type": "periodic"}), "frequency"),
    (_task("x", {"type": "continuous"}, "alexnet-imagenet"), "unknown model"),
    (_task("x", {"type": "trace", "trace": []}), "trace"),
])
def test_bad_workloads_are_rejected_clearly(task: dict, msg: str) -> None:
    with pytest.raises(WorkloadError, match=msg):
        parse_workload({"tasks": [task]})


def test_unknown_workload_name() -> None:
    with pytest.raises(WorkloadError, match="unknown workload"):
        load_workload("Z")


def test_rate_scale() -> None:
    wl = load_workload("A").scaled(0.25)
    assert wl.rate_scale == 0.25
    assert wl.rt_tasks[0].frequency == 25.0 and len(wl.rt_tasks[0].arrivals(1.0)) == 25
    assert wl.be_tasks[0].load_type == "continuous"
    with pytest.raises(WorkloadError):
        wl.scaled(0)
