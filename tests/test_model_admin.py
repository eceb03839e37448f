"""ModelAdmin (the logic behind the LoadModel/UnloadModel/ListModels services, no ROS):
confinement to model_dirs, bounded reads, every typed failure, and a failed load leaves
the runtime unchanged."""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading

import pytest
from onnx import TensorProto as T
from onnx import helper as h

from av_infer.errors import (
    InvalidParameterError,
    ModelFileTooLargeError,
    ModelLoadError,
    ModelNameInUseError,
    ModelNotFoundError,
    ModelPathError,
    ModelTooLargeError,
    TooManyModelsError,
    UnknownModelError,
    UnsupportedModelError,
)
from av_infer.model import zoo
from av_infer.model_admin import LoadedModel, ModelAdmin
from av_infer.runtime import Runtime


@pytest.fixture
def dirs(tmp_path):
    models, outside = tmp_path / "models", tmp_path / "outside"
    (models / "sub").mkdir(parents=True)
    outside.mkdir()
    shutil.copy(zoo.path("tiny_mlp"), models / "mlp.onnx")
    shutil.copy(zoo.path("tiny_cnn"), models / "sub" / "cnn.onnx")
    shutil.copy(zoo.path("tiny_mlp"), outside / "secret.onnx")
    return models, outside


@pytest.fixture
def rt():
    with Runtime(device="sim") as r:
        yield r


def _unchanged(rt, before):
    assert rt.models() == before
    assert sorted(rt.stats()["cache"]["models"]) == sorted(before)


def test_load_list_unload(rt, dirs):
    models, _ = dirs
    admin = ModelAdmin(rt, [models])
    rec = admin.load("mlp", "mlp.onnx")
    assert isinstance(rec, LoadedModel)
    assert rec.path == str(models / "mlp.onnx") and rec.file_bytes == (models / "mlp.onnx"
                                                                        ).stat().st_size
    assert len(rec.sha256) == 64 and rec.kernels > 0 and rec.inputs
    admin.load("cnn", str(models / "sub" / "cnn.onnx"), pin=True)  # absolute, inside
    listed = {m.name: m for m in admin.list()}
    assert list(listed) == ["mlp", "cnn"] and listed["cnn"].pinned
    dataclasses.asdict(listed["mlp"])  # plain data
    fut = rt.submit("mlp", zoo.sample_inputs("tiny_mlp"))
    rt.device.run()  # the simulator runs in virtual time, in this thread
    assert fut.result(timeout=0).outputs.keys() == rec.outputs.keys()
    admin.unload("mlp")
    assert [m.name for m in admin.list()] == ["cnn"]
    with pytest.raises(UnknownModelError):
        admin.unload("mlp")


def test_models_loaded_elsewhere_are_listed_without_a_path(rt, dirs):
    models, _ = dirs
    admin = ModelAdmin(rt, [models])
    admin.load("m", "mlp.onnx")
    rt.unload_model("m")
    rt.load_model("m", zoo.path("tiny_cnn"))  # same name, another model, not via admin
    (rec,) = admin.list()
    assert rec.name == "m" and rec.path is None and rec.sha256 is None


@pytest.mark.parametrize("path", ["../outside/secret.onnx", "sub/../mlp.onnx",
                                  "ABS_OUTSIDE", "/etc/passwd", "", "a\0b"])
def test_paths_outside_are_refused(rt, dirs, path):
    models, outside = dirs
    if path == "ABS_OUTSIDE":
        path = str(outside / "secret.onnx")
    admin = ModelAdmin(rt, [models])
    with pytest.raises(ModelPathError):
        admin.load("m", path)
    _unchanged(rt, [])


def test_symlink_escape_is_refused(rt, dirs):
    models, outside = dirs
    os.symlink(outside / "secret.onnx", models / "link.onnx")
    os.symlink(outside, models / "linkdir")
    os.symlink(models / "mlp.onnx", models / "inside.onnx")
    admin = ModelAdmin(rt, [models])
    for p in ("link.onnx", "linkdir/secret.onnx", str(models / "link.onnx")):
        with pytest.raises(ModelPathError, match="outside"):
            admin.load("m", p)
    _unchanged(rt, [])
    assert admin.load("m", "inside.onnx").path == str(models / "mlp.onnx")


def test_non_regular_files_are_refused(rt, dirs):
    models, _ = dirs
    os.mkfifo(models / "fifo.onnx")  # opening it must not block
    admin = ModelAdmin(rt, [models])
    for p in ("fifo.onnx", "sub"):
        with pytest.raises(ModelPathError, match="regular"):
            admin.load("m", p)
    _unchanged(rt, [])


def test_missing_file(rt, dirs):
    admin = ModelAdmin(rt, [dirs[0]])
    with pytest.raises(ModelNotFoundError) as ei:
        admin.load("m", "nope.onnx")
    assert ei.value.code == "model_not_found"
    _unchanged(rt, [])


def test_second_model_dir_is_searched(rt, dirs, tmp_path):
    models, _ = dirs
    other = tmp_path / "more"
    other.mkdir()
    shutil.copy(zoo.path("tiny_cnn"), other / "only_here.onnx")
    admin = ModelAdmin(rt, [models, other])
    assert admin.load("m", "only_here.onnx").path == str(other / "only_here.onnx")


def test_file_too_large_is_not_read(rt, dirs, monkeypatch):
    models, _ = dirs
    size = (models / "mlp.onnx").stat().st_size
    admin = ModelAdmin(rt, [models], max_file_bytes=size - 1)
    reads = []
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    with pytest.raises(ModelFileTooLargeError) as ei:
        admin.load("m", "mlp.onnx")
    assert ei.value.code == "file_too_large" and not reads
    _unchanged(rt, [])
    assert ModelAdmin(rt, [models], max_file_bytes=size).load("m", "mlp.onnx")


def test_not_onnx(rt, dirs):
    models, _ = dirs
    (models / "junk.onnx").write_bytes(b"\x08\x07 not a protobuf \xff\xfe")
    with pytest.raises(ModelLoadError) as ei:
        ModelAdmin(rt, [models]).load("m", "junk.onnx")
    assert ei.value.code == "model_load"
    _unchanged(rt, [])


def test_unsupported_operators_are_named(rt, dirs):
    models, _ = dirs
    g = h.make_graph([h.make_node("Relu", ["x"], ["a"], name="r"),
                      h.make_node("FrobnicateV9", ["a"], ["y"], name="weird1", domain="x.y")],
                     "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13), h.make_opsetid("x.y", 1)],
                     ir_version=8)
    (models / "odd.onnx").write_bytes(m.SerializeToString())
    with pytest.raises(UnsupportedModelError) as ei:
        ModelAdmin(rt, [models]).load("m", "odd.onnx")
    assert ei.value.code == "unsupported_model"
    assert "FrobnicateV9" in str(ei.value) and "weird1" in str(ei.value)
    _unchanged(rt, [])


def test_too_large_for_the_cache(dirs):
    models, _ = dirs
    with Runtime(device="sim", cache_budget=64) as rt:
        admin = ModelAdmin(rt, [models])
        for pin in (True, False):
            with pytest.raises(ModelTooLargeError) as ei:
                admin.load("m", "mlp.onnx", pin=pin)
            assert ei.value.code == "model_too_large"
            _unchanged(rt, [])


def test_name_in_use_and_bad_names(rt, dirs):
    models, _ = dirs
    admin = ModelAdmin(rt, [models])
    admin.load("m", "mlp.onnx")
    with pytest.raises(ModelNameInUseError) as ei:
        admin.load("m", "sub/cnn.onnx")
    assert ei.value.code == "name_in_use"
    with pytest.raises(ModelNameInUseError):  # the runtime says the same
        rt.load_model("m", zoo.path("tiny_cnn"))
    for bad in ("", "1abc", "a b", "a/b", "x" * 65, None, "../m"):
        with pytest.raises(InvalidParameterError):
            admin.load(bad, "mlp.onnx")
    _unchanged(rt, ["m"])


def test_too_many_models(rt, dirs):
    models, _ = dirs
    admin = ModelAdmin(rt, [models], max_models=1)
    admin.load("a", "mlp.onnx")
    with pytest.raises(TooManyModelsError) as ei:
        admin.load("b", "sub/cnn.onnx")
    assert ei.value.code == "too_many_models"
    _unchanged(rt, ["a"])
    admin.unload("a")
    admin.load("b", "sub/cnn.onnx")


def test_bad_input_shapes(rt, dirs):
    models, _ = dirs
    admin = ModelAdmin(rt, [models])
    for bad in ({"x": [0, 3]}, {"x": "1,3"}, [1, 3], {"x": [1.5]}, {"": [1]}):
        with pytest.raises(InvalidParameterError):
            admin.load("m", "mlp.onnx", input_shapes=bad)
    _unchanged(rt, [])


def test_concurrent_loads_of_one_name(rt, dirs):
    models, _ = dirs
    admin = ModelAdmin(rt, [models])
    results: list = []

    def load(p):
        try:
            results.append(admin.load("same", p).path)
        except ModelNameInUseError as e:
            results.append(e)

    ts = [threading.Thread(target=load, args=(p,)) for p in ("mlp.onnx", "sub/cnn.onnx")]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert sum(isinstance(r, str) for r in results) == 1
    assert sum(isinstance(r, ModelNameInUseError) for r in results) == 1
    assert rt.models() == ["same"]


def test_constructor_is_validated(rt, dirs, tmp_path):
    models, _ = dirs
    for bad_dirs in ([], str(models), [tmp_path / "missing"], [models / "mlp.onnx"]):
        with pytest.raises(InvalidParameterError):
            ModelAdmin(rt, bad_dirs)
    for kw in ({"max_file_bytes": 0}, {"max_models": 0}, {"max_models": True}):
        with pytest.raises(InvalidParameterError):
            ModelAdmin(rt, [models], **kw)


def test_loads_through_the_plan_cache(dirs, tmp_path):
    models, _ = dirs
    for expected in ("miss", "hit"):
        with Runtime(device="cpu", plan_cache=tmp_path / "plans") as rt:
            rec = ModelAdmin(rt, [models]).load("m", "mlp.onnx")
            assert rec.plan_cache == expected
