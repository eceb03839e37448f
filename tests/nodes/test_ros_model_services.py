"""Model services from another process: the typed errors test_ros_lifecycle.py leaves out
(``model_too_large``, ``unbound_dimension``) and a host that keeps answering while a load
compiles (the compile runs on the loader thread, not the executor's).

The host runs in a subprocess (``model_services:=true``, a 2 MiB cache budget, no plan
cache, so every load compiles); this process calls /av_infer/load_model and list_models
and sends requests. Every wait is on a condition bounded by ``WAIT_S`` only against hangs.
Run inside scripts/netns_run.sh (make test does): LOCALHOST discovery, fresh netns.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
onnx = pytest.importorskip("onnx")

from av_infer_msgs.msg import InferResponse  # noqa: E402
from av_infer_msgs.srv import ListModels, LoadModel  # noqa: E402
from av_infer_nodes.testing import (  # noqa: E402
    NodeProcess,
    RosHarness,
    RuntimeHostClient,
    wait_future,
)
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as oh  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

from av_infer import tensor_codec as codec  # noqa: E402
from av_infer import zoo_path  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(600)]  # a hang guard

#: Add+Relu pairs of the model whose compile the host must not wait for (seconds of work)
SLOW_PAIRS = 5000


def _heavy_model(path) -> None:
    """4 MiB of weights: more than the host's 2 MiB cache budget, less than its file bound."""
    w = nh.from_array(np.zeros((1024, 1024), np.float32), "w")
    g = oh.make_graph([oh.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "heavy",
                      [oh.make_tensor_value_info("x", T.FLOAT, [1, 1024])],
                      [oh.make_tensor_value_info("y", T.FLOAT, [1, 1024])], [w])
    onnx.save(oh.make_model(g, opset_imports=[oh.make_opsetid("", 13)], ir_version=8),
              str(path))


def _slow_model(path) -> None:
    """A long chain of small kernels: little weight, a compile of seconds."""
    nodes, inits, prev = [], [], "x"
    for i in range(SLOW_PAIRS):
        inits.append(nh.from_array(np.full((1, 16), 0.5, np.float32), f"b{i}"))
        nodes += [oh.make_node("Add", [prev, f"b{i}"], [f"a{i}"]),
                  oh.make_node("Relu", [f"a{i}"], [f"r{i}"])]
        prev = f"r{i}"
    nodes.append(oh.make_node("Identity", [prev], ["y"]))
    g = oh.make_graph(nodes, "slow", [oh.make_tensor_value_info("x", T.FLOAT, [1, 16])],
                      [oh.make_tensor_value_info("y", T.FLOAT, [1, 16])], inits)
    onnx.save(oh.make_model(g, opset_imports=[oh.make_opsetid("", 13)], ir_version=8),
              str(path))


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    root = tmp_path_factory.mktemp("services")
    models = root / "models"
    models.mkdir()
    shutil.copy(zoo_path("dynamic_cnn"), models / "dynamic.onnx")
    _heavy_model(models / "heavy.onnx")
    _slow_model(models / "slow.onnx")
    proc = NodeProcess("av_infer_nodes.runtime_node", log_dir=root, ros_args=[
        "-p", "device:=cpu", "-p", "models:=[tiny_cnn]", "-p", "model_services:=true",
        "-p", f"model_dirs:=[{models}]", "-p", "max_model_file_mb:=8",
        "-p", "cache_budget_mb:=2", "-p", "max_models:=8"])
    h = RosHarness()
    try:
        yield RuntimeHostClient(h.node("svc_tester"))
    finally:
        h.close()
        code = proc.stop()
        print(f"--- host ---\n{proc.output()[-4000:]}")
        assert code == 0, code  # clean exit on SIGINT


def _names(host: RuntimeHostClient) -> list[str]:
    return [m.name for m in host.call(host.list, ListModels.Request()).models]


def test_model_too_large_and_unbound_dimension(services):
    host = services
    too_large = host.call(host.load, LoadModel.Request(name="heavy", path="heavy.onnx"))
    assert not too_large.success and too_large.code == "model_too_large", too_large.message
    unbound = host.call(host.load, LoadModel.Request(name="dyn", path="dynamic.onnx"))
    assert not unbound.success and unbound.code == "unbound_dimension", unbound.message
    assert _names(host) == ["tiny_cnn"]  # nothing left behind by either failure
    # the same file with its dynamic dims bound loads and serves
    bound = host.call(host.load, LoadModel.Request(name="dyn", path="dynamic.onnx",
                                                   input_shapes=["input=1,3,32,32"]))
    assert bound.success, (bound.code, bound.message)
    assert list(bound.model.inputs[0].shape.dims) == [1, 3, 32, 32]
    assert host.ask(np.zeros((1, 3, 32, 32), np.float32), model="dyn").status \
        == InferResponse.STATUS_OK


def test_host_answers_while_a_load_compiles(services):
    """Behaviour, not timing: the list answered meanwhile does not contain the model yet
    (it would if the load had held the executor until it was done), a request is served,
    and the load is then answered once, with the model."""
    host = services
    loading = host.load.call_async(LoadModel.Request(name="slow", path="slow.onnx"))
    assert "slow" not in _names(host)
    ok = host.ask(np.zeros((1, 3, 32, 32), np.float32))
    assert ok.status == InferResponse.STATUS_OK
    assert codec.tensors_dict(ok.tensors)["logits"].shape == (1, 10)
    loaded = wait_future(loading, what="the slow load")
    assert loaded.success and loaded.model.name == "slow", (loaded.code, loaded.message)
    assert "slow" in _names(host)
