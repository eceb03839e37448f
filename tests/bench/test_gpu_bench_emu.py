"""``gpu_bench`` (what ``scripts/gpu_check.sh`` runs on a GPU) end to end on the CUDA emulator.

Why: the GPU sessions that run the bench are rare and short; a bench that crashes there
wastes one. Here every section runs on ``CudaDevice(emulate=True)`` with tiny models and
counts, and the JSON must have every section with sane structure: correct and
bit-identical outputs, numbers present. No timing is asserted (emulated times are not GPU
speed).
"""

from __future__ import annotations

import json
import math

from av_infer.bench import gpu_bench
from av_infer.devices.cuda import availability
from tests.checks import require

MODELS = ["tiny_cnn", "vgg19"]


def test_gpu_bench_emulated_writes_every_section(tmp_path, capsys) -> None:
    ok, why = availability(emulate=True)
    require("ok" if ok else None, f"the CUDA emulator cannot run: {why}")
    rc = gpu_bench.main(["--emulate", "--out", str(tmp_path), "--models", ",".join(MODELS),
                         "--reps", "2", "--pair-seconds", "0.2", "--dispatch-kernels", "20"])
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rc == 0, doc["failures"]
    assert doc["failures"] == []
    assert doc["emulated"] is True and doc["scale"] == "scaled"
    assert "NOT GPU speed" in capsys.readouterr().out
    assert set(doc["section_s"]) == set(gpu_bench.SECTIONS)
    assert doc["telemetry"]["emulated"] is True
    assert "test_bench_dkp.py" in doc["selection_cost"]["command"]

    d = doc["dispatch"]
    assert d["kernels"] == 20 and d["us_per_kernel"] > 0 and d["c"] == 4

    assert len(doc["conv_gemm"]) == 2
    assert all(r["ours_ms_end_to_end"] > 0 and r["flops"] > 0 for r in doc["conv_gemm"])

    zoo = doc["zoo_full_vs_ort"]
    assert [r["model"] for r in zoo] == MODELS
    for r in zoo:
        assert r["ok"] and r["max_rel_err"] <= 1e-3, r
        assert r["ours_ms_e2e"] > 0 and r["ours_ms_kernels"] > 0 and r["kernels"] > 0
        assert "torch_ms" not in r and "ort_cuda_ms" not in r  # no references when emulated

    pad = doc["padding_overhead"]
    assert pad["module_models"] == MODELS and pad["pad_compile_s"] >= 0
    assert [r["model"] for r in pad["rows"]] == MODELS
    for r in pad["rows"]:
        assert r["bit_identical"] is True and r["ok"], r
        assert 0 < r["padded_kernels"] <= r["kernels"]
        assert r["plain_ms"] > 0 and r["padded_ms"] > 0 and math.isfinite(r["overhead_pct"])

    pairs = doc["dkp_pairs"]
    assert pairs["device"] == "cuda-emu" and pairs["models"] == MODELS
    assert pairs["skipped"] == [] and "nondeterministic" not in pairs
    assert set(pairs["standalone_ms"]) == set(MODELS)
    assert all(v > 0 for v in pairs["standalone_ms"].values())
    assert {(r["rt"], r["be"]) for r in pairs["rows"]} == {(a, b) for a in MODELS for b in MODELS}
    for row in pairs["rows"]:
        assert row["outputs_identical"] is True, row
        for key in ("rt_p50_change_pct", "rt_p99_change_pct", "throughput_ratio",
                    "be_throughput_ratio", "be_padded_kernels"):
            assert key in row
        for pol in ("reef", "reef_dkp"):
            run = row[pol]
            assert run["drained"] and run["errors"] == [] and run["outputs_identical"], run
            assert math.isfinite(run["p50"]) and run["p99"] >= run["p50"] > 0
            assert run["rt"] >= 0 and run["be"] >= 0 and run["padded"] >= 0
        assert row["reef"]["padded"] == 0  # reef never pads


def test_disb_harness_on_the_cuda_code_path(tmp_path) -> None:
    """`av-infer bench --device cuda` (what gpu_check.sh's DISB steps run) on the emulator:
    the harness, runtime, scheduler and cuda device complete and write valid JSON. No
    figure is read: emulated times are not GPU speed."""
    ok, why = availability(emulate=True)
    require("ok" if ok else None, f"the CUDA emulator cannot run: {why}")
    from av_infer.cli import main

    out = tmp_path / "disb_emu.json"
    # RT rates x0.03: three RT requests per policy in the second (an emulated scaled vgg19
    # takes ~0.5 s, so x0.1's ten queued behind each other and doubled the test's time)
    rc = main(["bench", "--workload", "A", "--policy", "rt_only,reef", "--device", "cuda-emu",
               "--duration", "1", "--rate-scale", "0.03", "--standalone-n", "2",
               "--no-progress", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["device"] == "cuda-emu" and doc["scale"] == "scaled"
    assert set(doc["policies"]) == {"rt_only", "reef"}
    for p in doc["policies"].values():
        assert p["rt"]["count"] > 0 and p["rt"]["failed"] == 0
