"""DISB A on the simulator reproduces REEF §7.2's qualitative result (virtual time, so
timing assertions are valid here), deterministically for a seed."""

from __future__ import annotations

import json

import pytest

from av_infer.bench.harness import Bench, BenchConfig, available_policies
from av_infer.bench.report import build_report
from av_infer.bench.workload import load_workload
from av_infer.cli import main

DURATION = 2.0


@pytest.fixture(scope="module")
def report_a() -> dict:
    cfg = BenchConfig(device="sim", duration=DURATION, seed=0, progress=False, standalone_n=5)
    bench = Bench(load_workload("A"), cfg)
    runs = [bench.run_policy(p) for p in available_policies()]
    return build_report(bench, runs)


def test_reef_keeps_rt_latency_within_2pct_of_rt_only(report_a: dict) -> None:
    pol = report_a["policies"]
    ref, reef = pol["rt_only"]["rt"], pol["reef"]["rt"]
    assert reef["count"] == ref["count"] > 0
    assert reef["p50_ms"] <= ref["p50_ms"] * 1.02
    assert reef["p99_ms"] <= ref["p99_ms"] * 1.02
    assert reef["deadline_misses"] <= ref["deadline_misses"]


def test_reef_throughput_well_above_rt_only(report_a: dict) -> None:
    pol = report_a["policies"]
    assert pol["rt_only"]["be"]["count"] == 0
    assert pol["reef"]["be"]["throughput_rps"] > 0
    assert pol["reef"]["throughput_rps"] >= 1.2 * pol["rt_only"]["throughput_rps"]
    # Without padding, BE can only use the time RT leaves idle: reef must use (nearly) all
    # of it (work conserving): idle fraction / resnet152's standalone latency.
    m = report_a["models"]
    rt_busy = pol["rt_only"]["rt"]["throughput_rps"] * m["vgg19"]["standalone_p50_ms"] / 1e3
    be_capacity = (1.0 - rt_busy) / (m["resnet152"]["standalone_p50_ms"] / 1e3)
    assert pol["reef"]["be"]["throughput_rps"] >= 0.85 * be_capacity
    assert pol["reef"]["preemptions"] > 0


def _clearly_worse(report: dict, name: str) -> None:
    pol = report["policies"]
    ref, rt = pol["rt_only"]["rt"], pol[name]["rt"]
    assert rt["p99_ms"] >= 1.2 * ref["p99_ms"], name
    assert rt["p50_ms"] >= 1.05 * ref["p50_ms"], name


def test_seq_is_clearly_worse_on_rt_latency(report_a: dict) -> None:
    _clearly_worse(report_a, "seq")


# Calibrated (docs/dkp.md "Simulator calibration"): trace kernels have their hardware
# occupancy, blocks spread breadth-first from SM 0 so RT and BE share CUs, and every
# co-resident block slows a block by its packing-curve pressure.
def test_streams_is_clearly_worse_on_rt_latency(report_a: dict) -> None:
    _clearly_worse(report_a, "streams")


def test_reef_preempts_faster_than_wait(report_a: dict) -> None:
    pol = report_a["policies"]
    assert pol["reef"]["dispatch_latency_us"]["count"] > 0
    assert pol["reef"]["dispatch_latency_us"]["p99"] < pol["wait"]["dispatch_latency_us"]["p99"]
    pre, wait = pol["reef"]["preemption_latency_us"], pol["wait"]["preemption_latency_us"]
    assert pre["applicable"] and pre["grain"] == "block batch" and pre["count"] > 0
    assert pre["p99"] <= wait["p99"]


def test_preemption_latency_is_not_dispatch_latency(report_a: dict) -> None:
    # Starting RT takes a few us; the BE blocks resident at its arrival leave much later
    # (running blocks cannot be killed): the two metrics differ by an order of magnitude.
    pol = report_a["policies"]
    pre, disp = pol["reef"]["preemption_latency_us"], pol["reef"]["dispatch_latency_us"]
    assert pre["p50"] > 5 * disp["p50"]
    for name in ("streams", "prio_streams", "seq", "rt_only"):
        assert pol[name]["preemption_latency_us"] == {
            "applicable": False, "why": "the policy never preempts BE work"}, name
    assert pol["rt_only"]["rt_slowdown"]["p50"] == pytest.approx(1.0, abs=1e-3)
    assert pol["streams"]["rt_slowdown"]["p50"] > 1.2  # calibrated contention


def test_models_say_their_source(report_a: dict) -> None:
    assert report_a["models"]["vgg19"]["source"].startswith("reef-trace:vgg")
    assert report_a["models"]["resnet152"]["source"].startswith("reef-trace:resnet152")


def _num(x: object) -> bool:
    return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))


def test_json_schema(report_a: dict) -> None:
    doc = json.loads(json.dumps(report_a))
    for key, typ in [("workload", str), ("device", str), ("duration_s", float), ("seed", int),
                     ("models", dict), ("policies", dict), ("tasks", list)]:
        assert isinstance(doc[key], typ), key
    assert set(doc["policies"]) == set(available_policies())
    for m in doc["models"].values():
        assert isinstance(m["source"], str) and isinstance(m["kernels"], int)
    for name, p in doc["policies"].items():
        rt = p["rt"]
        for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "mean_ms", "max_ms",
                  "standalone_p50_ms", "increase_pct", "increase_p99_pct"):
            assert _num(rt[k]) and rt[k] is not None, (name, k)
        for k in ("deadline_misses", "count"):
            assert isinstance(rt[k], int), (name, k)
        assert isinstance(rt["clients"], dict) and "vgg19_rt" in rt["clients"]
        assert _num(p["be"]["throughput_rps"]) and isinstance(p["be"]["count"], int)
        assert _num(p["throughput_rps"])
        assert set(p["dispatch_latency_us"]) >= {"p50", "p99", "max", "count"}
        assert all(_num(v) for v in p["dispatch_latency_us"].values())
        assert set(p["rt_slowdown"]) >= {"p50", "p99", "max", "count"}
        pl = p["preemption_latency_us"]
        if pl["applicable"]:
            assert set(pl) >= {"p50", "p99", "max", "count", "grain"}, name
            assert all(_num(pl[k]) for k in ("p50", "p99", "max", "count")), name
        assert _num(p["padded_fraction"])


def test_cli_is_deterministic_and_writes_outputs(tmp_path) -> None:
    def run(tag: str) -> dict:
        out = tmp_path / tag
        rc = main(["bench", "--workload", "A", "--policy", "rt_only,reef", "--device", "sim",
                   "--duration", "0.5", "--seed", "3", "--standalone-n", "3",
                   "--no-progress", "--json", str(out / "a.json"), "--plot",
                   str(out / "a.png")])
        assert rc == 0
        for name in ("a.png", "a_throughput.png", "a_timeline.png"):
            assert (out / name).stat().st_size > 0
        doc = json.loads((out / "a.json").read_text())
        for p in doc["policies"].values():
            p.pop("wall_s")
        return doc

    assert run("one") == run("two")


def test_sweep_c(tmp_path) -> None:
    rc = main(["bench", "--workload", "A", "--sweep", "c=1,4", "--device", "sim",
               "--duration", "0.5", "--standalone-n", "3", "--no-progress", "--out",
               str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / "A_sweep_c.json").read_text())
    res = doc["sweep"]["results"]
    assert [r["c"] for r in res] == [1, 4] and doc["sweep"]["policy"] == "reef"
    assert (tmp_path / "A_sweep_c.png").stat().st_size > 0


def test_trace_driven_run(tmp_path) -> None:
    trace = tmp_path / "apollo_like.json"
    trace.write_text(json.dumps([0, 7, 30, 31, 90, 200]))
    out = tmp_path / "t.json"
    rc = main(["bench", "--workload", "A", "--trace", str(trace), "--policy", "rt_only,reef",
               "--device", "sim", "--duration", "0.5", "--standalone-n", "3", "--no-progress",
               "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["workload"] == "A+apollo_like"
    assert doc["tasks"][0]["load"] == "trace" and doc["tasks"][0]["deadline_ms"] == 40.0
    for p in doc["policies"].values():
        assert p["rt"]["count"] == 6
    assert doc["policies"]["reef"]["be"]["count"] > 0


def test_forecast_keeps_be_off_the_device_across_periodic_rt_arrivals() -> None:
    # DISB A at H100 scale, calibrated contention: BE blocks resident at an RT arrival
    # slow its first kernels (reef ~ +2 % p99). With the forecast quiet windows, BE kernels
    # that would still run at the (periodic) arrival wait: RT p99 within 1 % of rt_only.
    cfg = BenchConfig(device="sim", duration=1.0, gpu="h100", progress=False, standalone_n=3,
                      timeline=False)
    bench = Bench(load_workload("A"), cfg)
    runs = [bench.run_policy("rt_only"), bench.run_policy("streams"),
            bench.run_policy("reef"), bench.run_policy("reef", rt_forecast=True)]
    pol = build_report(bench, runs)["policies"]
    assert set(pol) == {"rt_only", "streams", "reef", "reef+forecast"}
    ref = pol["rt_only"]["rt"]["p99_ms"]
    fc, reef = pol["reef+forecast"], pol["reef"]
    assert fc["rt_forecast"] and not reef["rt_forecast"]
    assert fc["rt"]["p99_ms"] <= 1.01 * ref < reef["rt"]["p99_ms"]
    assert fc["preemption_latency_us"]["count"] < reef["preemption_latency_us"]["count"]
    assert fc["throughput_rps"] >= 0.9 * pol["streams"]["throughput_rps"]


def test_json_dash_prints_the_report_on_stdout(capsys) -> None:
    rc = main(["bench", "--workload", "A", "--policy", "rt_only,streams,reef,reef_dkp",
               "--device", "sim", "--gpu", "h100", "--duration", "0.3", "--standalone-n", "3",
               "--no-progress", "--json", "-"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["contention"] == "calibrated" and doc["dkp_placement"] == "faithful"
    for name, p in doc["policies"].items():
        assert {"dispatch_latency_us", "preemption_latency_us", "rt_slowdown"} <= set(p)
        assert p["preemption_latency_us"]["applicable"] is (name in ("reef", "reef_dkp"))


def test_json_dest_dash_prints_to_stdout_and_a_path_writes_the_file(tmp_path, capsys):
    """``--json -`` keeps stdout machine-readable (the JSON alone; text goes to stderr), a
    path gets the same document, no destination writes nothing."""
    import json
    import sys

    from av_infer.bench.report import emit_json, human_stream

    doc = {"a": 1, "rows": [{"b": 2.5}]}
    assert emit_json(doc, "-") is None and human_stream("-") is sys.stderr
    assert json.loads(capsys.readouterr().out) == doc
    out = emit_json(doc, tmp_path / "sub" / "x.json")
    assert json.loads(out.read_text()) == doc and human_stream(str(out)) is sys.stdout
    assert emit_json(doc, None) is None and capsys.readouterr().out == ""


def test_sim_counts_kernel_events_from_the_device_not_a_listener_call_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On sim the harness's listener does not take the per-completion "kernel" event (its
    ``event_kinds``); the run's "kernel" count is the device's launches, the same number
    of "kernel" events a listener of every kind sees, and every other count is the same."""
    from av_infer.runtime import Runtime
    from av_infer.sched.scheduler import EVENT_KINDS

    every: dict[str, int] = {}
    kinds: list = []
    add = Runtime.add_listener

    def add_beside(rt: Runtime, fn) -> None:  # noqa: ANN001
        kinds.append(getattr(fn, "event_kinds", None))
        add(rt, fn)
        add(rt, lambda k, p: every.__setitem__(k, every.get(k, 0) + 1))

    monkeypatch.setattr(Runtime, "add_listener", add_beside)
    cfg = BenchConfig(device="sim", duration=0.3, gpu="h100", progress=False,
                      standalone_n=3, timeline=False)
    run = Bench(load_workload("A"), cfg).run_policy("reef")
    assert kinds == [EVENT_KINDS - {"kernel"}]
    assert run.events["kernel"] == run.device["kernels"] == every["kernel"] > 0
    assert run.events == every and run.events["preempt"] > 0
