"""``av-infer bench --peer ort``: structure of the side-by-side report (never its numbers)."""

from __future__ import annotations

import json

import pytest

from av_infer.bench.peer import PeerConfig, format_peer, run_peer
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
    assert "avi / ort_threads" in format_peer(doc)


def test_cli_peer_json_to_stdout(capsys):
    rc = main(["bench", "--peer", "ort", "--rt-model", "tiny_mlp", "--be-model", "tiny_cnn",
               "--be-clients", "1", "--duration", "0.3", "--warmup", "0.1", "--no-progress",
               "--policy", "reef", "--json", "-"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["policy"] == "reef" and doc["command"].startswith("av-infer bench")


def test_cli_peer_rejects_bad_settings():
    with pytest.raises(SystemExit):
        main(["bench", "--peer", "ort", "--be-clients", "0"])
    with pytest.raises(SystemExit):
        main(["bench", "--peer", "ort", "--policy", "nope"])
