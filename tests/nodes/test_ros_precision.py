"""Precision through the runtime host (issue 30 item 4): the ``precision`` and
``model_precisions`` parameters set each loaded model's ``Plan.precision``; a precision the
device does not run fails configure with the reason before any model loads; the
/av_infer/load_model service takes a request's ``precision`` (empty: the host's) and
refuses one the device does not run before it reads the file; ``ModelInfo.precision``
tells a LoadModel/ListModels reader each model's precision; a host on a shared runtime
that already holds one of its models at another precision is refused (``name_in_use``)
instead of served the other precision.

In-process hosts (the refusals and what reaches the runtime do not depend on transport).
cuda-emu (the cuda device on the CPU emulator, no GPU needed) runs fp32, tf32 and fp16;
the cpu device runs fp32 only. Run inside scripts/netns_run.sh (make test does).
"""

from __future__ import annotations

import shutil

import pytest

rclpy = pytest.importorskip("rclpy")

from av_infer_msgs.srv import ListModels, LoadModel  # noqa: E402
from av_infer_nodes.runtime_node import RuntimeNode  # noqa: E402
from av_infer_nodes.testing import WAIT_S, RosHarness, wait_future, wait_reply  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402

from av_infer import InvalidParameterError, zoo_path  # noqa: E402
from av_infer.errors import ModelNameInUseError  # noqa: E402
from tests.checks import require  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(600)]  # a hang guard


@pytest.fixture
def emulator():
    from av_infer.devices.cuda import availability

    ok, why = availability(emulate=True)
    require("ok" if ok else None, f"the CUDA emulator cannot run: {why}")


def _host(h: RosHarness, name: str, runtime=None, **params) -> RuntimeNode:
    return h.add(RuntimeNode(name, context=h.context, runtime=runtime, parameter_overrides=[
        Parameter(k, value=v) for k, v in params.items()]))


def _call_load(h: RosHarness, node, req: LoadModel.Request) -> LoadModel.Response:
    """The load service's callback run as the executor runs it, without the transport."""
    return wait_future(h.executor.create_task(node._on_load_model, req, LoadModel.Response()),
                       what="the load callback")


def _precision(node: RuntimeNode, model: str) -> str:
    return node.runtime.model_info(model).plan.precision


def test_parameters_set_each_models_precision(emulator):
    with RosHarness() as h:
        node = _host(h, "prec_host", device="cuda-emu", models=["tiny_cnn", "tiny_mlp"],
                     precision="tf32", model_precisions=["tiny_mlp=fp16"])
        assert sorted(node.runtime.models()) == ["tiny_cnn", "tiny_mlp"]
        assert _precision(node, "tiny_cnn") == "tf32"  # the host's precision
        assert _precision(node, "tiny_mlp") == "fp16"  # its own entry
        assert node.model_info["tiny_mlp"].plan.precision == "fp16"


def test_default_is_fp32():
    with RosHarness() as h:
        node = _host(h, "fp32_host", device="cpu", models=["tiny_cnn"])
        assert _precision(node, "tiny_cnn") == "fp32"


@pytest.mark.parametrize("params, words", [
    ({"precision": "fp16"}, r"tiny_cnn: precision 'fp16'; device cpu runs fp32"),
    ({"model_precisions": ["tiny_cnn=tf32"]}, r"precision 'tf32'; device cpu runs fp32"),
    ({"precision": "fp64"}, r"precision 'fp64' is not one of fp32, tf32, fp16"),
    ({"model_precisions": ["yolo=fp32"]}, r"not an entry of models"),
])
def test_configure_refuses_before_loading(params, words):
    """autostart: a refused configure raises its typed error from the constructor, the
    node is destroyed and no runtime (so no model) is left."""
    with RosHarness() as h:
        with pytest.raises(InvalidParameterError, match=words):
            _host(h, "refusing_host", device="cpu", models=["tiny_cnn"], **params)


def test_configure_refusal_leaves_the_host_unconfigured():
    """autostart false: configure FAILS with the reason, nothing is loaded, and after
    nothing changed the host stays unconfigured (a managed node's FAILURE)."""
    with RosHarness() as h:
        node = _host(h, "managed_host", device="cpu", models=["tiny_cnn"], autostart=False,
                     model_precisions=["tiny_cnn=fp16"])
        node.trigger_configure()
        assert isinstance(node._configure_error, InvalidParameterError)
        assert "device cpu runs fp32" in str(node._configure_error)
        assert node.runtime is None


def test_load_model_service_precision(tmp_path, emulator):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(zoo_path("tiny_cnn", "scaled"), models / "tiny.onnx")
    with RosHarness() as h:
        node = _host(h, "svc_prec_host", device="cuda-emu", models=["tiny_mlp"],
                     precision="tf32", model_services=True, model_dirs=[str(models)])
        r = _call_load(h, node, LoadModel.Request(name="half", path="tiny.onnx",
                                                  precision="fp16"))
        assert r.success and r.message == "loaded half (fp16)", (r.code, r.message)
        assert _precision(node, "half") == "fp16"
        assert r.model.precision == "fp16"  # ModelInfo says it
        r = _call_load(h, node, LoadModel.Request(name="dflt", path="tiny.onnx"))
        assert r.success and _precision(node, "dflt") == "tf32"  # the host's parameter
        before = sorted(node.runtime.models())
        r = _call_load(h, node, LoadModel.Request(name="bad", path="tiny.onnx",
                                                  precision="int8"))
        assert not r.success and r.code == "invalid_parameter" and "int8" in r.message
        assert sorted(node.runtime.models()) == before


def test_load_model_service_refuses_what_the_device_cannot_run(tmp_path):
    with RosHarness() as h:
        node = _host(h, "svc_cpu_host", device="cpu", models=["tiny_cnn"],
                     model_services=True, model_dirs=[str(tmp_path)])
        # the file does not exist: invalid_parameter (not model_not_found) shows the
        # precision was refused before the file was looked at
        r = _call_load(h, node, LoadModel.Request(name="x", path="missing.onnx",
                                                  precision="fp16"))
        assert not r.success and r.code == "invalid_parameter", (r.code, r.message)
        assert "device cpu runs fp32" in r.message
        assert node.runtime.models() == ["tiny_cnn"]


def test_list_models_reports_each_precision(tmp_path, emulator):
    """ModelInfo.precision over the wire: a ListModels call from another node sees each
    model's Plan.precision, the `models` parameter's and a LoadModel's alike."""
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(zoo_path("tiny_cnn", "scaled"), models / "tiny.onnx")
    with RosHarness() as h:
        node = _host(h, "list_prec_host", device="cuda-emu", models=["tiny_cnn", "tiny_mlp"],
                     precision="tf32", model_precisions=["tiny_mlp=fp16"],
                     model_services=True, model_dirs=[str(models)])
        r = _call_load(h, node, LoadModel.Request(name="plain", path="tiny.onnx",
                                                  precision="fp32"))
        assert r.success, (r.code, r.message)
        client = h.node("list_prec_tester").create_client(ListModels, "/av_infer/list_models")
        assert client.wait_for_service(timeout_sec=WAIT_S)
        listed = wait_reply(lambda: client.call_async(ListModels.Request()),
                            what="list_models")
        assert listed.success, (listed.code, listed.message)
        assert {m.name: m.precision for m in listed.models} == {
            "tiny_cnn": "tf32", "tiny_mlp": "fp16", "plain": "fp32"}


def test_shared_runtime_refuses_a_held_model_at_another_precision(emulator):
    """Two hosts on one Runtime (as the container shares it): the second asks for a model
    the runtime holds at another precision and is refused with ``name_in_use`` before it
    loads anything; the model keeps serving at the precision it was loaded at. Asking for
    the precision it holds shares the model, and that host's cleanup leaves it loaded."""
    with RosHarness() as h:
        first = _host(h, "owner_host", device="cuda-emu", models=["tiny_cnn"],
                      precision="tf32")
        rt = first.runtime
        with pytest.raises(ModelNameInUseError,
                           match=r"tiny_cnn: model 'tiny_cnn' is already loaded in this "
                                 r"runtime at tf32, not fp16") as err:
            _host(h, "fp16_host", runtime=rt, device="cuda-emu",
                  models=["tiny_mlp", "tiny_cnn"], model_precisions=["tiny_cnn=fp16"])
        assert err.value.code == "name_in_use"
        assert rt.models() == ["tiny_cnn"]  # tiny_mlp was not loaded either
        assert _precision(first, "tiny_cnn") == "tf32"
        # the held precision (an fp32 default against tf32 refused too): shared
        with pytest.raises(ModelNameInUseError, match="at tf32, not fp32"):
            _host(h, "default_host", runtime=rt, device="cuda-emu", models=["tiny_cnn"])
        second = _host(h, "tf32_host", runtime=rt, device="cuda-emu",
                       models=["tiny_cnn", "tiny_mlp"], precision="tf32")
        assert sorted(rt.models()) == ["tiny_cnn", "tiny_mlp"]
        second.trigger_deactivate()
        second.trigger_cleanup()  # unloads only what it loaded
        assert rt.models() == ["tiny_cnn"] and _precision(first, "tiny_cnn") == "tf32"
