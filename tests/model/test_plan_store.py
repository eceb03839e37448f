"""The on-disk plan cache (av_infer.model.plan_store): a restart loads without compiling, a
hit is the plan the compiler would give, any change of a key part misses, files are written
atomically, and a damaged file is recompiled, never served and never a crash."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from av_infer.devices.cpu import CpuDevice
from av_infer.devices.sim import SimDevice
from av_infer.errors import InvalidParameterError, ModelNotFoundError
from av_infer.kernels.cpu import CpuPlanRunner
from av_infer.kernels.ort_segments import SegmentRunner
from av_infer.model import plan_store, zoo
from av_infer.model.plan_store import PlanStore, default_plan_dir, open_plan_store, plan_key
from av_infer.runtime import Runtime


class CountingCpu(CpuDevice):
    """A cpu device that counts its compiles (the spy on the compile path)."""

    compiles = 0

    def compile(self, *a, **kw):
        CountingCpu.compiles += 1
        return super().compile(*a, **kw)


@pytest.fixture
def counting():
    CountingCpu.compiles = 0
    return CountingCpu


def _run(plan, inputs):
    runner = SegmentRunner(plan) if plan.segments else CpuPlanRunner(plan)
    return runner.run(inputs)


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("model", ["tiny_cnn", "tiny_transformer"])
@pytest.mark.parametrize("engine", ["ort", "numpy"])
def test_hit_is_the_compiled_plan(tmp_path, model, engine):
    store = PlanStore(tmp_path)
    dev = CpuDevice(engine=engine)
    fresh, how1 = store.compile(dev, zoo.path(model), None, model)
    cached, how2 = store.compile(dev, zoo.path(model), None, model)
    assert (how1, how2) == ("miss", "hit")
    assert cached is not fresh
    assert cached.to_json() == fresh.to_json()
    assert [s.onnx for s in cached.segments] == [s.onnx for s in fresh.segments]
    assert cached.weights.keys() == fresh.weights.keys()
    for i in fresh.weights:
        np.testing.assert_array_equal(cached.weights[i], fresh.weights[i])
    x = zoo.sample_inputs(model)
    _same(_run(cached, x), _run(fresh, x))


def test_hit_gives_the_same_cuda_source(tmp_path):
    """Kernel args come back as JSON has them: the CUDA generator must not care."""
    from av_infer.kernels.cuda.sources import build_plan_source

    store = PlanStore(tmp_path)
    dev = SimDevice()
    fresh, _ = store.compile(dev, zoo.path("tiny_cnn"), None, "m")
    cached, how = store.compile(dev, zoo.path("tiny_cnn"), None, "m")
    assert how == "hit"
    a, b = build_plan_source(cached), build_plan_source(fresh)
    assert a.source == b.source and a.specs == b.specs and a.functions == b.functions
    assert len(a.aux) == len(b.aux)
    for x, y in zip(a.aux, b.aux):
        np.testing.assert_array_equal(x, y)


def test_restart_loads_without_compiling(tmp_path, counting):
    x = zoo.sample_inputs("tiny_cnn")
    with Runtime(device=counting(), plan_cache=tmp_path) as rt:
        info = rt.load_model("cam", zoo.path("tiny_cnn"), pin=True)
        y0 = rt.infer("cam", x).outputs
    assert info.plan_cache == "miss" and counting.compiles == 1
    with Runtime(device=counting(), plan_cache=tmp_path) as rt:  # the restart
        info = rt.load_model("cam", zoo.path("tiny_cnn"), pin=True)
        y1 = rt.infer("cam", x).outputs
        stats = rt.stats()["plan_cache"]
    assert info.plan_cache == "hit"
    assert counting.compiles == 1  # not compiled again
    assert stats["hits"] == 1 and stats["files"] == 1
    _same(y0, y1)


def test_off_by_default(tmp_path, counting, monkeypatch):
    monkeypatch.setenv("AV_INFER_PLAN_CACHE", str(tmp_path))
    for _ in range(2):
        with Runtime(device=counting()) as rt:
            assert rt.load_model("m", zoo.path("tiny_mlp")).plan_cache is None
            assert "plan_cache" not in rt.stats()
    assert counting.compiles == 2
    assert not any(tmp_path.iterdir())


def test_same_plan_under_another_name(tmp_path):
    store = PlanStore(tmp_path)
    dev = CpuDevice()
    store.compile(dev, zoo.path("tiny_cnn"), None, "front")
    plan, how = store.compile(dev, zoo.path("tiny_cnn"), None, "rear")
    assert how == "hit" and plan.name == "rear"
    assert all(k.name.startswith("rear/") for k in plan.kernels)


# -- the key -----------------------------------------------------------------------------------
def _bytes(model: str) -> bytes:
    return zoo.path(model).read_bytes()


def test_key_changes_with_the_model_bytes():
    dev = CpuDevice()
    m = onnx.load_from_string(_bytes("tiny_cnn"))
    m.producer_name = "edited"
    assert plan_key(_bytes("tiny_cnn"), None, dev, False) != \
        plan_key(m.SerializeToString(), None, dev, False)
    assert plan_key(_bytes("tiny_cnn"), None, dev, False) == \
        plan_key(_bytes("tiny_cnn"), None, dev, False)


def test_key_changes_with_the_input_shapes(tmp_path):
    data, dev = _bytes("dynamic_cnn"), CpuDevice(engine="numpy")
    name = onnx.load_from_string(data).graph.input[0].name
    k1 = plan_key(data, {name: [1, 3, 32, 32]}, dev, False)
    k2 = plan_key(data, {name: [2, 3, 32, 32]}, dev, False)
    assert k1 != k2
    store = PlanStore(tmp_path)
    p1, _ = store.compile(dev, data, {name: [1, 3, 32, 32]}, "d")
    p2, how = store.compile(dev, data, {name: [2, 3, 32, 32]}, "d")
    assert how == "miss"
    assert p1.tensors[name].shape[0] == 1 and p2.tensors[name].shape[0] == 2


def test_key_changes_with_the_compiler(monkeypatch):
    data, dev = _bytes("tiny_cnn"), CpuDevice()
    before = plan_key(data, None, dev, False)
    plan_store.compiler_fingerprint.cache_clear()
    monkeypatch.setattr(plan_store, "COMPILER_VERSION", plan_store.COMPILER_VERSION + 1)
    try:
        assert plan_key(data, None, dev, False) != before
    finally:
        plan_store.compiler_fingerprint.cache_clear()
    monkeypatch.setattr(plan_store, "compiler_fingerprint", lambda: "an edited compiler")
    assert plan_key(data, None, dev, False) != before


def test_key_changes_with_the_device():
    data = _bytes("tiny_cnn")
    keys = {
        plan_key(data, None, CpuDevice(), False),
        plan_key(data, None, CpuDevice(), True),  # whole: no cuts
        plan_key(data, None, CpuDevice(segment_ms=1.0), False),
        plan_key(data, None, CpuDevice(engine="numpy"), False),
        plan_key(data, None, SimDevice(), False),
    }
    assert len(keys) == 5
    # kernel plans do not depend on ``whole``
    assert plan_key(data, None, SimDevice(), True) == plan_key(data, None, SimDevice(), False)


def test_input_shapes_forms(tmp_path):
    data, dev = _bytes("dynamic_cnn"), CpuDevice(engine="numpy")
    name = onnx.load_from_string(data).graph.input[0].name
    k = plan_key(data, {name: (1, 3, 32, 32)}, dev, False)
    assert k == plan_key(data, {name: np.array([1, 3, 32, 32])}, dev, False)
    assert plan_key(data, np.array([1, 3, 32, 32]), dev, False) == \
        plan_key(data, [1, 3, 32, 32], dev, False)
    for bad in ("x", {name: "1,3"}, 5):
        with pytest.raises(InvalidParameterError):
            PlanStore(tmp_path).compile(dev, data, bad, "m")


# -- files -------------------------------------------------------------------------------------
def _only_file(root) -> os.PathLike:
    files = [p for p in root.rglob("*.plan")]
    assert len(files) == 1, files
    return files[0]


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage", "other_key"])
def test_damaged_file_is_recompiled(tmp_path, counting, damage):
    store, dev = PlanStore(tmp_path), counting(engine="numpy")  # deterministic compiler
    data = _bytes("tiny_cnn")
    good, _ = store.compile(dev, data, None, "m")
    f = _only_file(tmp_path)
    raw = bytearray(f.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0xFF
    elif damage == "truncate":
        raw = raw[: len(raw) // 3]
    elif damage == "empty":
        raw = bytearray()
    elif damage == "garbage":  # a valid checksum over a payload that is no plan
        import hashlib

        payload = b"not an npz at all"
        raw = bytearray(plan_store.MAGIC + hashlib.sha256(payload).digest() + payload)
    else:  # another model's (valid) file under this key
        other = PlanStore(tmp_path / "other")
        other.compile(dev, _bytes("tiny_mlp"), None, "m")
        raw = bytearray(_only_file(tmp_path / "other").read_bytes())
    f.write_bytes(bytes(raw))
    n = counting.compiles
    plan, how = store.compile(dev, data, None, "m")
    assert how == "miss" and counting.compiles == n + 1
    assert store.stats()["corrupt"] == 1
    assert plan.to_json() == good.to_json()
    # rewritten whole: the next load is a hit again
    assert store.compile(dev, data, None, "m")[1] == "hit"


def test_write_is_atomic(tmp_path, monkeypatch):
    """Written to a temporary file in the same directory, fsynced, then os.replace'd; a
    writer that dies before the replace leaves no file at the final path."""
    store, dev = PlanStore(tmp_path), CpuDevice(engine="numpy")
    data = _bytes("tiny_mlp")
    replaced = []
    real_replace = os.replace

    def spy(src, dst):
        replaced.append((os.fspath(src), os.fspath(dst)))
        assert os.path.getsize(src) > 0 and not os.path.exists(dst)
        real_replace(src, dst)

    monkeypatch.setattr(plan_store.os, "replace", spy)
    store.compile(dev, data, None, "m")
    (src, dst), = replaced
    assert os.path.dirname(src) == os.path.dirname(dst)
    assert os.path.basename(src).startswith(".tmp-")

    def crash(fd):
        raise OSError(28, "No space left on device")

    store2 = PlanStore(tmp_path / "full")
    monkeypatch.setattr(plan_store.os, "fsync", crash)
    plan, how = store2.compile(dev, data, None, "m")  # the load still succeeds
    assert how == "miss" and plan.kernels
    assert list((tmp_path / "full").rglob("*")) == [p for p in (tmp_path / "full").rglob("*")
                                                    if p.is_dir()]
    assert store2.stats()["write_errors"] == 1


def test_unwritable_root_never_fails_a_load(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    store = PlanStore(blocker / "plans")
    plan, how = store.compile(CpuDevice(engine="numpy"), _bytes("tiny_mlp"), None, "m")
    assert how == "miss" and plan.kernels
    assert store.stats()["write_errors"] == 1


def test_bounded_lru_by_mtime(tmp_path):
    dev = CpuDevice(engine="numpy")
    probe = PlanStore(tmp_path / "probe")
    probe.compile(dev, _bytes("tiny_mlp"), None, "m")
    size = _only_file(tmp_path / "probe").stat().st_size
    store = PlanStore(tmp_path / "s", max_bytes=int(size * 2.5))
    m = onnx.load_from_string(_bytes("tiny_mlp"))
    variants = []
    for i in range(3):  # three plans of the same size
        m.producer_name = f"v{i}"
        variants.append(m.SerializeToString())
    store.compile(dev, variants[0], None, "m")
    store.compile(dev, variants[1], None, "m")
    files = {p.name: p for p in (tmp_path / "s").rglob("*.plan")}
    for age, p in enumerate(sorted(files.values())):
        os.utime(p, (1000 + age, 1000 + age))
    # a hit makes variant 0 the most recently used
    assert store.compile(dev, variants[0], None, "m")[1] == "hit"
    store.compile(dev, variants[2], None, "m")  # over the bound: evicts variant 1
    assert store.stats()["evictions"] == 1
    assert store.compile(dev, variants[0], None, "m")[1] == "hit"
    assert store.compile(dev, variants[2], None, "m")[1] == "hit"
    assert store.stats()["bytes"] <= store.max_bytes
    tiny = PlanStore(tmp_path / "tiny", max_bytes=16)  # larger than the bound: not stored
    tiny.compile(dev, variants[0], None, "m")
    assert tiny.stats()["files"] == 0


def test_stale_temporaries_are_cleaned(tmp_path):
    store = PlanStore(tmp_path)
    sub = tmp_path / "ab"
    sub.mkdir()
    old, new = sub / ".tmp-dead.plan", sub / ".tmp-live.plan"
    old.write_bytes(b"x")
    new.write_bytes(b"x")
    os.utime(old, (1.0, 1.0))
    store.trim()
    assert not old.exists() and new.exists()


def test_external_data_models_are_not_stored(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4])], [nh.from_array(w, "w")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=8)
    onnx.save_model(m, d / "ext.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="ext.bin", size_threshold=0)
    store = PlanStore(tmp_path / "plans")
    plan, how = store.compile(CpuDevice(engine="numpy"), d / "ext.onnx", None, "ext")
    assert how == "bypass"
    y = CpuPlanRunner(plan).run({"x": np.ones((1, 4), np.float32)})
    np.testing.assert_allclose(y["y"], np.ones((1, 4), np.float32) @ w)
    assert store.stats()["files"] == 0


def test_missing_file_is_typed(tmp_path):
    with pytest.raises(ModelNotFoundError):
        PlanStore(tmp_path).compile(CpuDevice(), tmp_path / "nope.onnx", None, "m")


def test_settings_are_validated(tmp_path, monkeypatch):
    for bad in (123, "", 1.5):
        with pytest.raises(InvalidParameterError):
            open_plan_store(bad)
        with pytest.raises(InvalidParameterError):
            Runtime(device="sim", plan_cache=bad)
    with pytest.raises(InvalidParameterError):
        PlanStore(tmp_path, max_bytes=-1)
    assert open_plan_store(None) is None and open_plan_store(False) is None
    monkeypatch.delenv("AV_INFER_PLAN_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_plan_dir() == tmp_path / "xdg" / "av_infer" / "plans"
    assert open_plan_store(True).root == default_plan_dir()
    monkeypatch.setenv("AV_INFER_PLAN_CACHE", str(tmp_path / "env"))
    assert default_plan_dir() == tmp_path / "env"
