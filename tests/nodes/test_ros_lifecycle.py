"""The managed runtime host and its model services, driven from another process.

The host runs in a subprocess with ``autostart:=false`` and ``model_services:=true``; this
process drives its lifecycle through the standard ``lifecycle_msgs`` services (as
``ros2 lifecycle set`` does), sends typed requests and calls /av_infer/load_model,
unload_model and list_models. Covered: every transition, the ``inactive`` answers in each
non-active state, every typed load failure (outside ``model_dirs`` by ``..``, absolute
path, symlink; missing file; too large; not ONNX; unsupported operators with their names;
name in use; too many models), the on-disk plan cache (a reload is a hit, not a compile),
and a request over the size bound answered ``STATUS_REQUEST_TOO_LARGE`` without
allocating it.

Every wait is on a condition bounded by ``WAIT_S`` only against hangs.
Run inside scripts/netns_run.sh (make test does): LOCALHOST discovery, fresh netns.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
onnx = pytest.importorskip("onnx")

from av_infer_msgs.msg import InferResponse  # noqa: E402
from av_infer_msgs.srv import ListModels, LoadModel, UnloadModel  # noqa: E402
from av_infer_nodes.testing import (  # noqa: E402
    NodeProcess,
    RosHarness,
    RuntimeHostClient,
    wait_future,
)
from lifecycle_msgs.msg import State, Transition  # noqa: E402
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as oh  # noqa: E402

from av_infer import tensor_codec as codec  # noqa: E402
from av_infer import zoo_path  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(600)]  # a hang guard
NODE = "av_infer_runtime"


def _unsupported_model(path) -> None:
    g = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["r"], name="ok"),
         oh.make_node("MyOp", ["r"], ["c"], domain="com.example", name="custom1"),
         oh.make_node("MyOp", ["c"], ["y"], domain="com.example", name="custom2")],
        "t", [oh.make_tensor_value_info("x", T.FLOAT, [1, 4])],
        [oh.make_tensor_value_info("y", T.FLOAT, [1, 4])])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 13),
                                        oh.make_opsetid("com.example", 1)], ir_version=8)
    onnx.save(m, str(path))


@pytest.fixture(scope="module")
def managed(tmp_path_factory):
    root = tmp_path_factory.mktemp("managed")
    models, outside, plans = root / "models", root / "outside", root / "plans"
    for d in (models, outside, plans):
        d.mkdir()
    src = zoo_path("tiny_cnn", "scaled")
    shutil.copy(src, models / "tiny.onnx")
    shutil.copy(src, outside / "secret.onnx")
    (models / "escape.onnx").symlink_to(outside / "secret.onnx")
    (models / "notonnx.onnx").write_bytes(b"this is not a protobuf" * 10)
    (models / "big.onnx").write_bytes(b"\0" * (2 * 2**20))
    _unsupported_model(models / "custom.onnx")
    host = NodeProcess("av_infer_nodes.runtime_node", log_dir=root, ros_args=[
        "-p", "device:=cpu", "-p", "models:=[tiny_cnn]", "-p", "autostart:=false",
        "-p", "model_services:=true", "-p", f"model_dirs:=[{models}]",
        "-p", "max_model_file_mb:=1", "-p", "max_request_mb:=1", "-p", "max_models:=3",
        "-p", f"plan_cache:={plans}"])
    h = RosHarness()
    try:
        yield h, h.node("lc_tester"), host, models, outside
    finally:
        h.close()
        code = host.stop()
        print(f"--- host ---\n{host.output()[-4000:]}")
        assert code == 0, code  # clean exit on SIGINT


X = np.zeros((1, 3, 32, 32), np.float32)


def test_lifecycle_and_model_services_from_another_process(managed):
    h, tester, proc, models, outside = managed
    host = RuntimeHostClient(tester, NODE)
    S = InferResponse
    # unconfigured: requests and services answer "inactive", never silence
    assert host.state() == State.PRIMARY_STATE_UNCONFIGURED
    assert host.ask(X).status == S.STATUS_INACTIVE
    assert host.call(host.list, ListModels.Request()).code == "inactive"
    # configure: runtime + models; still inactive
    assert host.transition(Transition.TRANSITION_CONFIGURE)
    assert host.state() == State.PRIMARY_STATE_INACTIVE
    assert host.ask(X).status == S.STATUS_INACTIVE
    # activate: served
    assert host.transition(Transition.TRANSITION_ACTIVATE)
    assert host.state() == State.PRIMARY_STATE_ACTIVE
    ok = host.ask(X)
    assert ok.status == S.STATUS_OK and codec.tensors_dict(ok.tensors)["logits"].shape == (1, 10)

    # a request beyond max_request_mb (1 MiB): refused by its metadata
    big = host.ask(np.zeros((1, 3, 32, 32 * 128), np.float32))
    assert big.status == S.STATUS_REQUEST_TOO_LARGE and big.code == "request_too_large"

    # model services: list, load, every typed failure, unload
    listed = host.call(host.list, ListModels.Request())
    assert listed.success and [m.name for m in listed.models] == ["tiny_cnn"]
    assert listed.device == "cpu"
    loaded = host.call(host.load, LoadModel.Request(name="tiny2", path="tiny.onnx"))
    assert loaded.success and loaded.code == "ok", loaded.message
    assert loaded.model.name == "tiny2" and loaded.model.path == str(models / "tiny.onnx")
    assert [t.name for t in loaded.model.inputs] == ["input"]
    assert list(loaded.model.inputs[0].shape.dims) == [1, 3, 32, 32]
    # the same bytes as the zoo's tiny_cnn that configure compiled and stored: a plan-cache
    # hit already (the key is the model's bytes, not its name or path)
    assert loaded.model.plan_cache == "hit"
    assert host.ask(X, model="tiny2").status == S.STATUS_OK

    def load_fails(code: str, **kw) -> LoadModel.Response:
        r = host.call(host.load, LoadModel.Request(**kw))
        assert not r.success and r.code == code, (kw, r.code, r.message)
        return r

    load_fails("name_in_use", name="tiny2", path="tiny.onnx")
    load_fails("path_not_allowed", name="x1", path="../outside/secret.onnx")
    load_fails("path_not_allowed", name="x2", path=str(outside / "secret.onnx"))
    load_fails("path_not_allowed", name="x3", path="escape.onnx")  # symlink out
    load_fails("model_not_found", name="x4", path="missing.onnx")
    load_fails("file_too_large", name="x5", path="big.onnx")
    load_fails("model_load", name="x6", path="notonnx.onnx")
    load_fails("invalid_parameter", name="9bad name", path="tiny.onnx")
    r = load_fails("unsupported_model", name="x7", path="custom.onnx")
    assert "MyOp" in r.message  # the cpu device's refusal (ONNX Runtime's) names the op;
    # the per-node list in `unsupported`: test_unsupported_operators_listed_by_node
    names = [m.name for m in host.call(host.list, ListModels.Request()).models]
    assert names == ["tiny_cnn", "tiny2"]  # no failed load left anything behind
    assert host.call(host.load, LoadModel.Request(name="tiny3", path="tiny.onnx")).success
    load_fails("too_many_models", name="tiny4", path="tiny.onnx")  # max_models 3
    assert host.call(host.unload, UnloadModel.Request(name="tiny3")).success

    un = host.call(host.unload, UnloadModel.Request(name="tiny2"))
    assert un.success, un.message
    assert host.ask(X, model="tiny2").status == S.STATUS_UNKNOWN_MODEL
    assert host.call(host.unload, UnloadModel.Request(name="tiny2")).code == "unknown_model"
    # the same bytes again: from the on-disk plan cache, not compiled
    again = host.call(host.load, LoadModel.Request(name="tiny2", path="tiny.onnx"))
    assert again.success and again.model.plan_cache == "hit", again.model.plan_cache

    # deactivate: accepted work drains, new requests answer inactive
    assert host.transition(Transition.TRANSITION_DEACTIVATE)
    assert host.state() == State.PRIMARY_STATE_INACTIVE
    assert host.ask(X).status == S.STATUS_INACTIVE
    assert host.call(host.load, LoadModel.Request(name="t3", path="tiny.onnx")).code \
        == "inactive"
    # cleanup: unloaded; configure + activate again: served again (plans from the cache)
    assert host.transition(Transition.TRANSITION_CLEANUP)
    assert host.state() == State.PRIMARY_STATE_UNCONFIGURED
    assert host.ask(X).status == S.STATUS_INACTIVE
    assert host.transition(Transition.TRANSITION_CONFIGURE)
    assert host.transition(Transition.TRANSITION_ACTIVATE)
    assert host.ask(X).status == S.STATUS_OK
    assert [m.name for m in host.call(host.list, ListModels.Request()).models] == ["tiny_cnn"]
    # shutdown from active
    assert host.transition(Transition.TRANSITION_ACTIVE_SHUTDOWN)
    assert host.state() == State.PRIMARY_STATE_FINALIZED
    assert host.ask(X).status == S.STATUS_INACTIVE
    assert proc.alive()


def _call_load(h: RosHarness, node, req: LoadModel.Request) -> LoadModel.Response:
    """The load service's callback (a coroutine: the compile runs on the loader thread) run
    as the executor runs it, without the transport."""
    return wait_future(h.executor.create_task(node._on_load_model, req, LoadModel.Response()),
                       what="the load callback")


def test_services_off_by_default(tmp_path):
    """Without model_services the services answer services_disabled (tested in-process:
    the refusal does not depend on transport)."""
    from av_infer_nodes.runtime_node import RuntimeNode
    from rclpy.parameter import Parameter

    with RosHarness() as h:
        node = h.add(RuntimeNode("off_host", context=h.context, parameter_overrides=[
            Parameter("device", value="cpu"), Parameter("models", value=["tiny_cnn"])]))
        resp = _call_load(h, node, LoadModel.Request(name="a", path="x.onnx"))
        assert not resp.success and resp.code == "services_disabled"
        resp = node._on_list_models(ListModels.Request(), ListModels.Response())
        assert resp.code == "services_disabled"


def test_unsupported_operators_listed_by_node():
    """An UnsupportedModelError's operators and node names (the kernel compiler lists them
    all at once) become LoadModel.Response.unsupported, one "Op: nodes" entry each."""
    from av_infer_nodes.runtime_node import RuntimeNode
    from rclpy.parameter import Parameter

    from av_infer.errors import UnsupportedModelError

    class Admin:
        def load(self, *a, **kw):
            raise UnsupportedModelError({"MyOp": ["custom1", "custom2"], "NonZero": ["nz"]})

    with RosHarness() as h:
        node = h.add(RuntimeNode("unsup_host", context=h.context, parameter_overrides=[
            Parameter("device", value="cpu"), Parameter("models", value=["tiny_cnn"])]))
        node.p["model_services"] = True
        node.admin = Admin()
        resp = _call_load(h, node, LoadModel.Request(name="a", path="x.onnx"))
        assert not resp.success and resp.code == "unsupported_model"
        assert resp.unsupported == ["MyOp: custom1, custom2", "NonZero: nz"]
