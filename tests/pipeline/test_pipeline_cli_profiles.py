"""``av-infer profile --blocks`` (ONNX Runtime on the cpu, real zoo models) and ``av-infer
pipeline plan|sim --profiles DIR --cluster FILE|SPEC --weights ...``; the committed
CPU-measured profiles under docs/pipeline_profiles/ load and plan."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from av_infer.cli import main
from av_infer.model import zoo
from av_infer.pipeline.block_measure import dynamic_batch
from av_infer.pipeline.block_profiles import partition_model
from av_infer.pipeline.cluster import load_cluster_file
from av_infer.pipeline.profile_files import load_profiles

DOCS = Path(__file__).resolve().parents[2] / "docs" / "pipeline_profiles"


def test_profile_blocks_writes_measured_files_that_load(tmp_path, capsys):
    # the median of 7 runs per cell (the default), not of 2: on a busy host (make test's
    # two workers on two cores) one stalled run made a 2-run median of a tiny block 10x its
    # batch-2 time, and the profiler rightly refused the profile as too noisy
    rc = main(["profile", "--blocks", "--models", "tiny_cnn", "--device", "cpu",
               "--batches", "1,2", "--repeats", "7", "--warmup", "1", "--out",
               str(tmp_path), "--json", "-"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    (entry,) = doc["profiles"]
    assert entry["source"] == "measured" and entry["device_type"] == "cpu"
    prof = load_profiles(tmp_path)["tiny_cnn"]["cpu"]
    assert prof.batches_at(1) == [1, 2] and prof.vfracs == [1]
    assert prof.provenance["device"] == "cpu" and "profile --blocks" in \
        prof.provenance["command"]
    assert all(x > 0 for b in (1, 2) for x in prof.latency(1, b))


def test_batch_b_runs_the_block_on_b_stacked_inputs():
    """What batch b measures computes what b batch-1 runs compute (ORT as the oracle)."""
    pm = partition_model("tiny_cnn", "scaled")
    sub = pm.stage_model(0, 2)
    x = zoo.sample_inputs("tiny_cnn", "scaled")
    one = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"])
    many = ort.InferenceSession(dynamic_batch(sub).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    ref = one.run(None, x)
    got = many.run(None, {k: np.repeat(v, 3, axis=0) for k, v in x.items()})
    for r, g in zip(ref, got):
        assert g.shape[0] == 3
        np.testing.assert_allclose(g, np.repeat(r, 3, axis=0), rtol=1e-5, atol=1e-6)


def test_profile_refuses_bad_settings(tmp_path, capsys):
    assert main(["profile", "--blocks", "--models", "nope", "--out", str(tmp_path)]) == 2
    assert main(["profile", "--blocks", "--models", "tiny_cnn", "--fractions", "2",
                 "--out", str(tmp_path)]) == 2
    assert "not split" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before writing anything


def test_committed_cpu_profiles_load_and_plan_the_mixed_cluster(capsys):
    profs = load_profiles(DOCS)
    measured = [m for m, by_type in profs.items()
                if by_type.get("cpu") is not None and by_type["cpu"].source == "measured"]
    assert len(measured) >= 3
    cluster = load_cluster_file(DOCS / "cluster_mixed.json", profs)
    assert {t.name: t.source for t in cluster.types} == {"orin": "derived", "cpu": "measured"}
    rc = main(["pipeline", "plan", "--profiles", str(DOCS), "--cluster",
               str(DOCS / "cluster_mixed.json"), "--batch-fill-factor", "1.3",
               "--weights", "resnet152=2,vgg19=1,densenet201=1,inception_v3=1",
               "--json", "-"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["device_types"]["cpu"]["source"] == "measured"
    assert doc["device_types"]["orin"]["source"] == "derived"
    assert doc["rules"]["batch_fill_factor"] == 1.3
    lam = min(doc["rate"][m] / w for m, w in
              {"resnet152": 2, "vgg19": 1, "densenet201": 1, "inception_v3": 1}.items())
    assert doc["rate"]["resnet152"] >= 2 * lam * (1 - 1e-6) and lam > 0


def test_plan_with_spec_weights_and_errors(tmp_path, capsys):
    src = DOCS / "resnet152.cpu.blocks.json"
    (tmp_path / src.name).write_text(src.read_text())
    rc = main(["pipeline", "plan", "--profiles", str(tmp_path), "--cluster", "cpu:3",
               "--json", "-"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cluster"] == "cpu:3" and doc["device_types"]["cpu"]["source"] == "measured"
    assert main(["pipeline", "plan", "--profiles", str(tmp_path), "--cluster", "cpu:3",
                 "--weights", "vgg19=1"]) == 2  # not a planned model
    assert main(["pipeline", "plan", "--profiles", str(tmp_path), "--cluster", "cpu:3",
                 "--weights", "resnet152=-1"]) == 2
    assert main(["pipeline", "plan", "--profiles", str(tmp_path), "--cluster",
                 "cpu:3,b200:2"]) == 2  # a type without profiles, not built in
    err = capsys.readouterr().err
    assert "UnknownDeviceTypeError" in err and "b200" in err


@pytest.mark.parametrize("load", ["poisson"])
def test_sim_on_measured_profiles(tmp_path, capsys, load):
    src = DOCS / "resnet152.cpu.blocks.json"
    (tmp_path / src.name).write_text(src.read_text())
    rc = main(["pipeline", "sim", "--profiles", str(tmp_path), "--cluster", "cpu:2",
               "--load", load, "--duration", "0.2", "--iters", "3", "--json", "-"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["device_types"]["cpu"]["source"] == "measured"
    assert doc["pipeline"]["rate"] > 0 and doc["no_partition"]["rate"] > 0


CUDA_EP = "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA_EP, reason="ONNX Runtime here has no CUDAExecutionProvider "
                    f"({ort.get_available_providers()}): the cuda block profiler cannot run")
def test_cuda_block_profile_of_a_zoo_model(tmp_path):
    """The cuda path on a real GPU (whole GPU, fraction 1): every cell measured, loads."""
    rc = main(["profile", "--blocks", "--models", "resnet152", "--device", "cuda",
               "--variant", "full", "--batches", "1,2,4", "--repeats", "5",
               "--out", str(tmp_path)])
    assert rc == 0
    (by_type,) = load_profiles(tmp_path).values()
    (prof,) = by_type.values()
    assert prof.source == "measured" and prof.provenance["device"] == "cuda"
    assert prof.batches_at(1)[0] == 1 and all(x > 0 for x in prof.latency(1, 1))
