"""The bench harness on the real CPU device with scaled models: it completes and writes
valid JSON. No timing is asserted (shared machine)."""

from __future__ import annotations

import json

from av_infer.cli import main


def test_cpu_tiny_run_writes_valid_json(tmp_path) -> None:
    out = tmp_path / "cpu.json"
    rc = main(["bench", "--workload", "A", "--policy", "rt_only,reef", "--device", "cpu",
               "--duration", "1", "--standalone-n", "3", "--no-progress",
               "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and doc["scale"] == "scaled"
    assert doc["models"]["vgg19"]["source"] == "zoo:vgg19/scaled"
    assert set(doc["policies"]) == {"rt_only", "reef"}
    for p in doc["policies"].values():
        assert p["rt"]["count"] > 0 and p["rt"]["failed"] == 0
    assert doc["policies"]["rt_only"]["be"]["count"] == 0
    # the same metrics at segment grain (cpu): applicable under reef, not under rt_only
    pre = doc["policies"]["reef"]["preemption_latency_us"]
    assert pre["applicable"] and pre["grain"] == "segment" and "p99" in pre
    assert doc["policies"]["rt_only"]["preemption_latency_us"]["applicable"] is False
    assert doc["policies"]["reef"]["rt_slowdown"]["count"] > 0


def test_bad_workload_is_a_clear_error(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tasks": [{"id": "x", "load": {"type": "dependent"},
                                          "client": {"model_name": "vgg19-imagenet"}}]}))
    assert main(["bench", "--workload", str(bad), "--no-progress"]) == 2
    assert "dependent" in capsys.readouterr().err
