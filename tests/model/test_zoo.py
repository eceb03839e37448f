"""The model zoo: every test and scaled model builds, is valid ONNX, runs in onnxruntime,
is deterministic and caches atomically; DISB workloads only name models the zoo has."""

from __future__ import annotations

import glob
import json
import os
import pathlib

import numpy as np
import onnx
import pytest

from av_infer.errors import UnknownModelError
from av_infer.model import zoo

ort = pytest.importorskip("onnxruntime")

DISB = ["vgg19", "resnet152", "densenet201", "inception_v3", "distilbert"]
TEST_MODELS = ["tiny_cnn", "tiny_mlp", "tiny_transformer", "dynamic_cnn"]
WORKLOADS = pathlib.Path(os.environ.get("AV_INFER_DISB_DIR", "/work/shared/disb/workloads"))
FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "torch"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AV_INFER_CACHE", str(tmp_path / "cache"))


def _session(model: onnx.ModelProto | str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def test_names() -> None:
    assert zoo.names() == DISB + TEST_MODELS


@pytest.mark.parametrize("name", DISB + TEST_MODELS)
def test_builds_checks_and_runs(name: str) -> None:
    m = zoo.build(name, "scaled")
    onnx.checker.check_model(m, full_check=True)
    assert m.opset_import[0].version == 17
    node_names = [n.name for n in m.graph.node]
    assert all(node_names) and len(set(node_names)) == len(node_names)
    feeds = zoo.sample_inputs(name, "scaled")
    assert [i.name for i in m.graph.input] == list(feeds)
    outs = _session(m).run(None, feeds)
    assert outs and all(np.isfinite(o).all() for o in outs)
    # calibrated weights: activations stay O(1), not exploding or vanishing
    scale = float(np.sqrt(np.mean(np.square(outs[0], dtype=np.float64))))
    assert 0.05 < scale < 50, scale


@pytest.mark.parametrize("name", ["resnet152", "distilbert", "tiny_transformer"])
def test_build_is_deterministic(name: str) -> None:
    assert zoo.build(name).SerializeToString() == zoo.build(name).SerializeToString()


def test_scaled_and_full_differ_only_where_expected() -> None:
    assert zoo.sample_inputs("vgg19", "full")["input"].shape == (1, 3, 224, 224)
    assert zoo.sample_inputs("inception_v3", "full")["input"].shape == (1, 3, 299, 299)
    full_bert = zoo.sample_inputs("distilbert", "full")
    assert full_bert["input_ids"].shape == (1, 128)
    assert full_bert["input_ids"].max() < 30522
    # test models have a single variant
    assert zoo.path("tiny_cnn", "full") == zoo.path("tiny_cnn", "scaled")


def test_sample_inputs_valid_and_seeded() -> None:
    a = zoo.sample_inputs("distilbert", seed=1)
    b = zoo.sample_inputs("distilbert", seed=1)
    c = zoo.sample_inputs("distilbert", seed=2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["input_ids"], c["input_ids"])
    assert a["input_ids"].dtype == np.int64 and a["attention_mask"].dtype == np.int64
    assert 0 <= a["input_ids"].min() and a["input_ids"].max() < 1000
    mask = a["attention_mask"][0]
    assert mask[0] == 1 and mask[-1] == 0 and set(np.unique(mask)) == {0, 1}


def test_attention_mask_is_applied() -> None:
    """Changing a masked-out token must not change the unmasked positions' outputs."""
    s = _session(zoo.build("distilbert"))
    feeds = zoo.sample_inputs("distilbert")
    y0 = s.run(None, feeds)[0]
    feeds2 = {k: v.copy() for k, v in feeds.items()}
    feeds2["input_ids"][0, -1] = (feeds2["input_ids"][0, -1] + 7) % 1000
    y1 = s.run(None, feeds2)[0]
    n = int(feeds["attention_mask"].sum())
    np.testing.assert_allclose(y0[:, :n], y1[:, :n], rtol=1e-5, atol=1e-5)


def test_dynamic_cnn_binds_dims() -> None:
    m = zoo.build("dynamic_cnn")
    dims = [d.dim_param or d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["N", 3, "H", "W"]
    s = _session(m)
    for shape in [(1, 3, 16, 16), (3, 3, 33, 20)]:
        y = s.run(None, {"input": np.ones(shape, np.float32)})[0]
        assert y.shape == (shape[0], 10)


def test_path_caches_atomically(tmp_path: pathlib.Path) -> None:
    p = zoo.path("tiny_cnn")
    assert p.is_file() and p.parent == zoo.cache_dir() / "zoo"
    assert p.name.startswith("tiny_cnn-default-") and p.suffix == ".onnx"
    assert str(tmp_path) in str(p)
    mtime = p.stat().st_mtime_ns
    assert zoo.path("tiny_cnn") == p
    assert p.stat().st_mtime_ns == mtime
    assert p.read_bytes() == zoo.build("tiny_cnn").SerializeToString()
    assert not [f for f in p.parent.iterdir() if f.name.endswith(".tmp")]
    p2 = zoo.path("resnet152", "scaled")
    assert p2.name.startswith(f"resnet152-scaled-{zoo.builder_hash()}")


def test_describe() -> None:
    d = zoo.describe("tiny_mlp")
    assert d["inputs"] == {"x": {"shape": [1, 64], "dtype": "float32"}}
    assert d["outputs"]["probs"]["shape"] == [1, 10]
    assert d["params"] == 64 * 32 + 32 + 32 * 10 + 10
    assert d["nodes"] == 5 and d["op_counts"]["Gemm"] == 2
    d = zoo.describe("distilbert")
    assert d["inputs"]["attention_mask"]["dtype"] == "int64"
    assert d["outputs"]["last_hidden_state"]["shape"] == [1, 32, 128]
    assert {"Erf", "LayerNormalization", "Softmax", "Shape", "Reshape"} <= set(d["op_counts"])


def test_unknown_model_and_variant() -> None:
    with pytest.raises(UnknownModelError):
        zoo.build("alexnet")
    with pytest.raises(ValueError):
        zoo.build("vgg19", "medium")


def test_disb_models_cover_workloads() -> None:
    files = sorted(glob.glob(str(WORKLOADS / "*.json")))
    if not files:
        pytest.skip(f"no DISB workloads under {WORKLOADS}")
    seen = set()
    for f in files:
        for task in json.loads(pathlib.Path(f).read_text())["tasks"]:
            seen.add(task["client"]["model_name"])
    assert seen and seen <= set(zoo.DISB_MODELS)
    assert set(zoo.DISB_MODELS.values()) == set(DISB)


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.onnx")), ids=lambda p: p.stem)
def test_torch_fixtures_match_pytorch(path: pathlib.Path) -> None:
    assert path.stat().st_size < 200_000
    m = onnx.load(str(path))
    onnx.checker.check_model(m)
    ref = np.load(path.with_suffix(".npz"))
    s = _session(str(path))
    y = s.run(None, {i.name: ref[i.name] for i in s.get_inputs()})[0]
    np.testing.assert_allclose(y, ref["expected_output"], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("AV_INFER_SLOW"), reason="set AV_INFER_SLOW=1 (~15 s)")
def test_vgg19_full_runs() -> None:
    p = zoo.path("vgg19", "full")
    y = _session(str(p)).run(None, zoo.sample_inputs("vgg19", "full"))[0]
    assert y.shape == (1, 1000) and np.isfinite(y).all()
