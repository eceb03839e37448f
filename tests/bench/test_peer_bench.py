"""``av-infer bench --peer ort``: structure of the side-by-side report (never its numbers)."""

from __future__ import annotations

import json

import pytest

from av_infer.bench.peer import PeerConfig, format_peer, host_busy_s, peer_command, run_peer
from av_infer.cli import main

KEYS = ("rt_p50_ms", "rt_p99_ms", "rt_p999_ms", "be_rps", "rt_n", "be_done")


def test_run_peer_reports_the_three_systems_on_one_load():
    cfg = PeerConfig(rt_model="tiny_mlp", be_model="tiny_cnn", rt_rate=40.0, be_clients=2,
                     duration=0.5, warmup=0.1, progress=False)
    doc = run_peer(cfg)
    for system in ("avi", "ort_threads", "ort_rt_alone"):
        assert all(k in doc[system] for k in KEYS), system
        assert doc[system]["rt_n"] >= 1
    assert doc["avi"]["be_done"] > 0 and doc["ort_threads"]["be_done"] > 0
    assert doc["ort_rt_alone"]["be_done"] == 0
    assert set(doc["ratios"]) == {"rt_p99", "rt_p50", "be_rps"}
    assert {"p50", "p99", "max", "count"} <= set(doc["avi"]["preemption_ms"])
    text = format_peer(doc)
    assert "avi / ort_threads" in text
    # how late the RT client called, for every system (the part of the preemption figure
    # before the runtime knew of the request)
    assert "late p99" in text
    assert all(doc[s]["rt_late_p99_ms"] >= 0 for s in ("avi", "ort_threads", "ort_rt_alone"))


def test_cli_peer_json_to_stdout(capsys):
    rc = main(["bench", "--peer", "ort", "--rt-model", "tiny_mlp", "--be-model", "tiny_cnn",
               "--be-clients", "1", "--duration", "0.3", "--warmup", "0.1", "--no-progress",
               "--policy", "reef", "--rounds", "1", "--json", "-"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["policy"] == "reef" and doc["command"].startswith("av-infer bench")


def test_cli_switch_interval_is_applied_recorded_and_repeated(capsys):
    """``--switch-interval-us`` sets CPython's GIL switch interval for the run; the report
    records the interval the run had, and its command repeats the flag."""
    import sys

    before = sys.getswitchinterval()
    try:
        rc = main(["bench", "--peer", "ort", "--rt-model", "tiny_mlp", "--be-model",
                   "tiny_cnn", "--be-clients", "1", "--duration", "0.2", "--warmup", "0.05",
                   "--no-progress", "--switch-interval-us", "250", "--rounds", "1", "--json",
                   "-"])
        assert rc == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["machine"]["gil_switch_interval_s"] == pytest.approx(250e-6)
        assert "--switch-interval-us 250" in doc["command"]
        with pytest.raises(SystemExit):
            main(["bench", "--peer", "ort", "--switch-interval-us", "0"])
    finally:
        sys.setswitchinterval(before)


def test_cli_rt_graphs_is_refused_where_it_would_be_ignored(capsys):
    """``--rt-graphs`` (the cuda device's RT-as-one-graph, ``--peer torch``): out of range
    is refused at parse time, and a run it does not apply to refuses it instead of running
    without it."""
    for bad in ("9", "-1", "two"):
        with pytest.raises(SystemExit) as e:
            main(["bench", "--peer", "torch", "--rt-graphs", bad])
        assert e.value.code == 2
    assert "0..8" in capsys.readouterr().err
    for argv in (["bench", "--peer", "ort", "--rt-graphs", "2"],
                 ["bench", "--device", "sim", "--rt-graphs", "1"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert "--rt-graphs applies to --peer torch" in str(e.value.code)


def test_peer_command_repeats_the_load():
    """The command printed beside a peer figure (``make demo``'s line, the CLI's JSON)
    parses back into the same load."""
    import argparse
    import shlex

    from av_infer.cli import build_parser

    cfg = PeerConfig(rt_model="inception_v3", be_model="densenet201", rt_rate=30.0,
                     be_clients=1, policy="reef", c=2, duration=5.0, warmup=0.5, rounds=2)
    line = peer_command(cfg, ["--device-option", "be_nice=5"])
    argv = shlex.split(line)
    assert argv[:4] == ["av-infer", "bench", "--peer", "ort"]
    args = build_parser().parse_args(argv[1:])
    assert isinstance(args, argparse.Namespace)
    assert (args.rt_model, args.be_model, args.rt_rate, args.be_clients, args.policy, args.c,
            args.duration, args.warmup, args.rounds, args.device_option) == (
        "inception_v3", "densenet201", 30.0, 1, "reef", 2, 5.0, 0.5, 2, ["be_nice=5"])


def test_cli_peer_rejects_bad_settings():
    with pytest.raises(SystemExit):
        main(["bench", "--peer", "ort", "--be-clients", "0"])
    with pytest.raises(SystemExit):
        main(["bench", "--peer", "ort", "--policy", "nope"])


def test_rounds_take_turns_and_pool_every_round():
    """Interleaved rounds: each round has every system's figures, the order reverses every
    round (ABBA), and the pooled RT sample is every round's samples together."""
    cfg = PeerConfig(rt_model="tiny_mlp", be_model="tiny_cnn", rt_rate=40.0, be_clients=1,
                     duration=0.75, warmup=0.05, progress=False, rounds=3,
                     systems=("ort_threads", "avi"))
    doc = run_peer(cfg)
    assert doc["rounds"] == 3 and len(doc["per_round"]) == 3
    for row in doc["per_round"]:
        assert set(row) == {"round", "avi", "ort_threads", "ratios"}
        assert row["avi"]["be_rps"] > 0 and row["ort_threads"]["be_rps"] > 0
    # 0.25 s per turn at 40 Hz: 10 samples a turn, pooled over the 3 rounds
    assert doc["avi"]["rt_n"] == doc["ort_threads"]["rt_n"] == 3 * 10
    lo, hi = doc["ratios_range"]["be_rps"]
    assert lo <= hi
    assert "interleaved rounds" in format_peer(doc) and "per round:" in format_peer(doc)


def test_each_system_reports_its_cores_and_the_rt_clients_lateness():
    """CPU seconds over wall seconds while measuring, and how late the RT client called:
    what tells an idle core from per-request cost, and the client's delay from the
    runtime's (values are machine-dependent: only their presence and sign are checked)."""
    cfg = PeerConfig(rt_model="tiny_mlp", be_model="tiny_cnn", rt_rate=40.0, be_clients=1,
                     duration=0.5, warmup=0.05, progress=False, systems=("ort_threads", "avi"))
    doc = run_peer(cfg)
    for system in ("avi", "ort_threads"):
        r = doc[system]
        assert r["cores_used"] > 0
        assert 0 <= r["rt_late_p50_ms"] <= r["rt_late_p99_ms"]
    assert "cores" in format_peer(doc)


def test_rounds_must_be_positive():
    with pytest.raises(SystemExit):
        main(["bench", "--peer", "ort", "--rounds", "0"])


@pytest.mark.skipif(host_busy_s() < 0, reason="this host has no /proc/stat: other_cores "
                    "is None there (the next test checks that case)")
def test_a_comparison_beside_other_processes_says_how_many_cores_they_took():
    """``other_cores``: the host's busy time less the process's own over the measured
    window. Beside a busy process it is well above zero and the report says so (BE lanes
    yield to other processes by design: the reader must know they were there)."""
    import subprocess
    import sys

    from av_infer.bench.peer import OTHERS_NOTE_CORES, beside_others

    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        cfg = PeerConfig(rt_model="tiny_mlp", be_model="tiny_cnn", rt_rate=40.0,
                         be_clients=1, duration=1.0, warmup=0.05, progress=False,
                         systems=("ort_threads", "avi"))
        doc = run_peer(cfg)
    finally:
        loop.kill()
        loop.wait()
    for system in ("avi", "ort_threads"):
        assert doc[system]["other_cores"] > 0.05
    if doc["avi"]["other_cores"] >= OTHERS_NOTE_CORES:
        assert beside_others(doc) == doc["avi"]["other_cores"]
        assert "other processes used" in format_peer(doc)


def test_other_cores_is_unknown_not_zero_where_the_host_cannot_say():
    from av_infer.bench.peer import _Raw, _summary, beside_others

    raw = _Raw([0.001], 10, 1.0, [0.0], 0.5, 0.7)
    assert _summary(raw)["other_cores"] == pytest.approx(0.2)
    raw.add(_Raw([0.001], 10, 1.0, [0.0], 0.5, -1.0))  # one window the host did not report
    assert _summary(raw)["other_cores"] is None
    assert beside_others({"avi": {"other_cores": None}}) is None
    assert beside_others({"avi": {"other_cores": 0.1}}) is None


def test_a_round_shorter_than_two_rt_periods_is_refused_before_anything_runs():
    """The measured window is a whole number of RT periods: a round of fewer than two
    measures a moment (0.5 Hz, 6 s in 2 rounds: one RT call and its 50 ms), so it is
    refused, naming the durations that would do."""
    from av_infer.bench.peer import check_load

    cfg = PeerConfig(rt_model="tiny_mlp", be_model="tiny_cnn", rt_rate=0.5, duration=6.0,
                     rounds=2, progress=False)
    with pytest.raises(ValueError, match="1.5 RT periods.*8 s or more"):
        run_peer(cfg)
    with pytest.raises(SystemExit, match="1.5 RT periods"):  # the CLI, before loading
        main(["bench", "--peer", "ort", "--rt-rate", "20", "--duration", "0.3"])
    check_load(PeerConfig(rt_rate=0.5, duration=8.0, rounds=2))
    with pytest.raises(ValueError, match="> 0"):
        check_load(PeerConfig(rt_rate=0.0))
