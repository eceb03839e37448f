"""What nodes sharing one Runtime ask of a model (issue 34 leftovers): the image nodes'
``precision`` parameter, the pin compared beside the precision in the one check
(``runtime_build.check_models``), and each model's precision and pin in /av_infer/models.

* An image node (perception, monitoring) loads its model in-process at its ``precision``;
  ``auto`` (the default) shares a held model at whatever it holds and loads a missing one
  at fp32. A precision the device does not run is refused with InvalidParameterError, a
  model held at another precision with ModelNameInUseError (``name_in_use``): configure
  fails, nothing loads, the held model keeps its precision.
* Two hosts on one runtime, or an image node then a host, asking one model pinned and
  unpinned: the later one is refused the same way, naming the difference.
* /av_infer/models (JSON, latched) gives each model's precision, pinned, weight_bytes and
  kernels; a remote image node whose ``precision`` the host's table contradicts drops its
  images (``dropped_not_ready``) instead of submitting them.

cuda-emu (the cuda device on the CPU emulator, no GPU) runs fp32, tf32 and fp16; the cpu
device fp32 only. Run inside scripts/netns_run.sh (make test does).
"""

from __future__ import annotations

import json
import shutil

import pytest

rclpy = pytest.importorskip("rclpy")

from av_infer_nodes.common import LATCHED_QOS, MODELS_TOPIC  # noqa: E402
from av_infer_nodes.image_node import IMAGE_QOS  # noqa: E402
from av_infer_nodes.monitoring_node import MonitoringNode  # noqa: E402
from av_infer_nodes.perception_node import PerceptionNode  # noqa: E402
from av_infer_nodes.runtime_build import check_models, held_difference  # noqa: E402
from av_infer_nodes.runtime_node import RuntimeNode  # noqa: E402
from av_infer_nodes.testing import (  # noqa: E402
    Collector,
    RosHarness,
    make_image,
    wait_for,
    wait_matched,
)
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from av_infer import InvalidParameterError, ModelNameInUseError, Runtime, zoo_path  # noqa: E402
from tests.checks import require  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(600)]  # a hang guard


@pytest.fixture
def emulator():
    from av_infer.devices.cuda import availability

    ok, why = availability(emulate=True)
    require("ok" if ok else None, f"the CUDA emulator cannot run: {why}")


def _params(**params) -> list[Parameter]:
    """Overrides; an empty list is left out (its default: rclpy would type it BYTE_ARRAY)."""
    return [Parameter(k, value=v) for k, v in params.items() if v != []]


def _host(h: RosHarness, name: str, runtime=None, **params) -> RuntimeNode:
    return h.add(RuntimeNode(name, context=h.context, runtime=runtime,
                             parameter_overrides=_params(**params)))


def _image_node(h: RosHarness, cls, name: str, rt, **params):
    """``cls`` on the in-process Runtime ``rt`` (None: none; ``runtime`` is a parameter)."""
    return h.add(cls(name, context=h.context, runtime=rt,
                     parameter_overrides=_params(**params)))


def _held(rt, model: str) -> tuple[str, bool]:
    info = rt.model_info(model)
    return info.plan.precision, info.pinned


def _publish_until_served(h: RosHarness, tester_name: str, wrong: list, right,
                          ready, what: str) -> None:
    """Remote image nodes ``wrong`` and ``right``: once ``ready(node)`` holds for each,
    images are published to all of them until ``right`` has an answer and each of
    ``wrong`` has received one; then each of ``wrong`` has submitted nothing and dropped
    its images (``dropped_not_ready``)."""
    tester = h.node(tester_name)
    pubs = [tester.create_publisher(Image, f"/{n.get_name()}/input/image", IMAGE_QOS)
            for n in (*wrong, right)]
    wait_matched(*pubs)
    wait_for(lambda: all(ready(n) for n in (*wrong, right)),
             what="every client ready with the host's table")

    def published_until_answered() -> bool:
        for pub in pubs:
            pub.publish(make_image(tester, "frame"))
        return right.counters["completed"] > 0 and all(
            n.counters["received"] > 0 for n in wrong)

    wait_for(published_until_answered, period=0.2, what=what)
    for n in wrong:
        assert n.counters["submitted"] == 0, n.get_name()
        assert n.counters["dropped_not_ready"] >= 1, n.get_name()


# -- the image nodes' precision ---------------------------------------------------------
@pytest.mark.parametrize("cls", [PerceptionNode, MonitoringNode])
def test_image_node_loads_its_model_at_its_precision(emulator, cls):
    with RosHarness() as h:
        host = _host(h, "emu_host", device="cuda-emu", models=["tiny_mlp"])
        node = _image_node(h, cls, "half_node", host.runtime, model="tiny_cnn",
                           precision="fp16")
        assert node.client is not None and node.active
        # pin auto: the RT (perception) node pins what it loads, the BE one does not
        assert _held(host.runtime, "tiny_cnn") == ("fp16", cls is PerceptionNode)
        assert _held(host.runtime, "tiny_mlp") == ("fp32", False)


def test_image_node_auto_shares_the_held_precision_and_loads_fp32(emulator):
    with RosHarness() as h:
        host = _host(h, "tf32_host", device="cuda-emu", models=["tiny_cnn"], precision="tf32")
        rt = host.runtime
        node = _image_node(h, PerceptionNode, "auto_node", rt, model="tiny_cnn")
        assert node.p["precision"] == "auto" and node.active
        assert _held(rt, "tiny_cnn") == ("tf32", False)  # shared as held
        same = _image_node(h, MonitoringNode, "same_node", rt, model="tiny_cnn",
                           precision="tf32")
        assert same.active  # asking for the held precision shares it too
        # auto and a model nobody holds: loaded at fp32 (Runtime.load_model's default)
        _image_node(h, MonitoringNode, "fresh_node", rt, model="tiny_mlp")
        assert _held(rt, "tiny_mlp") == ("fp32", False)


def test_image_node_refuses_a_precision_the_device_does_not_run():
    with RosHarness() as h:
        host = _host(h, "cpu_host", device="cpu", models=["tiny_mlp"])
        with pytest.raises(InvalidParameterError,
                           match=r"tiny_cnn: precision 'fp16'; device cpu runs fp32 "
                                 r"\(parameters precision\)") as err:
            _image_node(h, PerceptionNode, "fp16_on_cpu", host.runtime, model="tiny_cnn",
                        precision="fp16")
        assert not isinstance(err.value, ModelNameInUseError)
        assert host.runtime.models() == ["tiny_mlp"]  # nothing loaded


@pytest.mark.parametrize("mode", ["local", "remote"])
def test_image_node_refuses_an_unknown_precision(mode):
    """Read-only and checked at configure, in either mode (remote: before any topic)."""
    with RosHarness() as h:
        rt = _host(h, "any_host", device="cpu", models=["tiny_cnn"]).runtime
        with pytest.raises(InvalidParameterError,
                           match=r"precision 'fp64' is not one of auto, fp32, tf32, fp16"):
            _image_node(h, PerceptionNode, f"fp64_{mode}", rt if mode == "local" else None,
                        runtime=mode, precision="fp64")


def test_image_node_refuses_a_model_held_at_another_precision(emulator):
    """autostart: the constructor raises the typed error; managed: configure FAILS with
    it kept, and the held model is unchanged either way."""
    with RosHarness() as h:
        host = _host(h, "holder", device="cuda-emu", models=["tiny_cnn"], precision="tf32")
        rt = host.runtime
        with pytest.raises(ModelNameInUseError,
                           match=r"tiny_cnn: model 'tiny_cnn' is already loaded in this "
                                 r"runtime at tf32, not fp16 \(parameters precision;") as err:
            _image_node(h, PerceptionNode, "fp16_node", rt, model="tiny_cnn",
                        precision="fp16")
        assert err.value.code == "name_in_use"
        managed = _image_node(h, MonitoringNode, "managed_node", rt, model="tiny_cnn",
                              precision="fp32", autostart=False)
        managed.trigger_configure()
        assert isinstance(managed._configure_error, ModelNameInUseError)
        assert "at tf32, not fp32" in str(managed._configure_error)
        assert managed.client is None and not managed.active
        assert rt.models() == ["tiny_cnn"] and _held(rt, "tiny_cnn") == ("tf32", False)


def test_image_node_precision_checks_each_variant_of_a_group(emulator, tmp_path):
    """``model`` naming a variant group: every variant must be held at the precision."""
    for name in ("full", "fast"):
        shutil.copy(zoo_path("tiny_cnn", "scaled"), tmp_path / f"{name}.onnx")
    with RosHarness() as h:
        host = _host(h, "group_host", device="cuda-emu",
                     models=[str(tmp_path / "full.onnx"), str(tmp_path / "fast.onnx")],
                     model_precisions=["fast=fp16"], variant_groups=["cls"],
                     **{"variant_group.cls.models": ["full", "fast"],
                        "variant_group.cls.kappas": [1.0, 0.5]})
        rt = host.runtime
        assert rt.variant_groups() == {"cls": {"full": 1.0, "fast": 0.5}}
        with pytest.raises(ModelNameInUseError,
                           match=r"fast: model 'fast' is already loaded in this runtime at "
                                 r"fp16, not fp32") as err:
            _image_node(h, PerceptionNode, "group_fp32", rt, model="cls", precision="fp32")
        assert "full:" not in str(err.value)  # the fp32 variant is as asked
        assert _image_node(h, PerceptionNode, "group_auto", rt, model="cls").active


def test_live_model_change_is_checked_too(emulator):
    """A live ``model`` change loads (or shares) at the node's precision through the same
    check: a refusal leaves the parameter as it was."""
    with RosHarness() as h:
        host = _host(h, "live_host", device="cuda-emu", models=["tiny_mlp"], precision="tf32")
        node = _image_node(h, PerceptionNode, "live_node", host.runtime, model="tiny_cnn",
                           precision="fp16")
        r = node.set_parameters([Parameter("model", value="tiny_mlp")])[0]
        assert not r.successful and "at tf32, not fp16" in r.reason, r.reason
        assert node.p["model"] == "tiny_cnn"
        assert _held(host.runtime, "tiny_cnn") == ("fp16", True)  # RT node, pin auto


# -- the image nodes' pin -----------------------------------------------------------------
@pytest.mark.parametrize("cls, pin, pinned", [
    (PerceptionNode, "auto", True), (MonitoringNode, "auto", False),
    (PerceptionNode, "false", False), (MonitoringNode, "true", True)])
def test_image_node_pins_what_it_loads_as_pin_says(cls, pin, pinned):
    """auto: an RT node's model is pinned (never evicted), a BE node's is not; true/false
    override the priority."""
    with RosHarness() as h:
        rt = _host(h, "pin_host", device="cpu", models=["tiny_mlp"]).runtime
        node = _image_node(h, cls, f"pin_{pin}_node", rt, model="tiny_cnn", pin=pin)
        assert node.active and _held(rt, "tiny_cnn") == ("fp32", pinned)


def test_image_node_refuses_a_model_held_pinned_the_other_way():
    """pin true/false is asked of a held model like precision: refused typed, nothing
    changes; auto shares it as held."""
    with RosHarness() as h:
        rt = _host(h, "pinned_host", device="cpu", models=["tiny_cnn"],
                   pinned_models=["tiny_cnn"]).runtime
        with pytest.raises(ModelNameInUseError,
                           match=r"already loaded in this runtime pinned, not unpinned "
                                 r"\(parameters precision, pin;"):
            _image_node(h, PerceptionNode, "unpin_node", rt, model="tiny_cnn", pin="false")
        assert _held(rt, "tiny_cnn") == ("fp32", True)
        assert _image_node(h, MonitoringNode, "share_node", rt, model="tiny_cnn").active
        assert _image_node(h, MonitoringNode, "ask_node", rt, model="tiny_cnn",
                           pin="true").active
        assert _held(rt, "tiny_cnn") == ("fp32", True)


@pytest.mark.parametrize("mode", ["local", "remote"])
def test_image_node_refuses_an_unknown_pin(mode):
    with RosHarness() as h:
        rt = _host(h, "pin_any_host", device="cpu", models=["tiny_cnn"]).runtime
        with pytest.raises(InvalidParameterError,
                           match=r"pin 'yes' is not one of auto, true, false"):
            _image_node(h, PerceptionNode, f"pin_yes_{mode}", rt if mode == "local" else None,
                        runtime=mode, pin="yes")


def test_remote_image_node_drops_images_the_host_holds_pinned_the_other_way():
    """Remote mode: the host's table says tiny_cnn is unpinned; a node asking pin true
    never submits (``dropped_not_ready``), one with pin auto is served."""
    with RosHarness() as h:
        _host(h, "av_infer_runtime", device="cpu", models=["tiny_cnn"])
        wrong = _image_node(h, PerceptionNode, "remote_pin_true", None, runtime="remote",
                            model="tiny_cnn", pin="true")
        right = _image_node(h, PerceptionNode, "remote_pin_auto", None, runtime="remote",
                            model="tiny_cnn")
        _publish_until_served(
            h, "remote_pin_tester", [wrong], right,
            lambda n: n.client.model_pinned("tiny_cnn") is False and n.client.ready("tiny_cnn"),
            "an answer to the pin-auto node")


def test_remote_image_node_checks_each_variant_of_a_group(tmp_path):
    """Remote mode, ``model`` naming a variant group: the host's table gives its variants'
    precision and pin, each compared (full is pinned, fast is not): pin false and precision
    fp16 drop images, naming the variant; pin auto is served."""
    for name in ("full", "fast"):
        shutil.copy(zoo_path("tiny_cnn", "scaled"), tmp_path / f"{name}.onnx")
    with RosHarness() as h:
        _host(h, "av_infer_runtime", device="cpu",
              models=[str(tmp_path / "full.onnx"), str(tmp_path / "fast.onnx")],
              pinned_models=[str(tmp_path / "full.onnx")], variant_groups=["cls"],
              **{"variant_group.cls.models": ["full", "fast"],
                 "variant_group.cls.kappas": [1.0, 0.5]})
        nodes = {"grp_unpinned": {"pin": "false"}, "grp_half": {"precision": "fp16"},
                 "grp_auto": {}}
        made = {n: _image_node(h, PerceptionNode, n, None, runtime="remote", model="cls",
                               **kw) for n, kw in nodes.items()}
        _publish_until_served(h, "group_tester", [made["grp_unpinned"], made["grp_half"]],
                              made["grp_auto"], lambda n: n.client.ready("cls"),
                              "an answer to the pin-auto node")
        assert made["grp_auto"].client.held_settings("cls") == [
            ("full", "fp32", True), ("fast", "fp32", False)]
        from av_infer_nodes.image_node import remote_mismatch

        client = made["grp_auto"].client
        assert remote_mismatch(client, "cls", {"precision": "auto", "pin": "false"}) == (
            "the runtime host holds model 'full' (variant group 'cls') pinned, not as "
            "parameter pin (false) asks")
        assert "model 'full' (variant group 'cls') at fp32, not fp16" in remote_mismatch(
            client, "cls", {"precision": "fp16", "pin": "auto"})
        assert remote_mismatch(client, "cls", {"precision": "fp32", "pin": "auto"}) is None


# -- pins: the same check ---------------------------------------------------------------
@pytest.mark.parametrize("first_pins, second_pins, words", [
    (["tiny_cnn"], [], "unpinned"),  # held pinned, asked unpinned
    ([], ["tiny_cnn"], "pinned"),  # held unpinned, asked pinned
])
def test_hosts_on_one_runtime_refuse_a_pin_mismatch(first_pins, second_pins, words):
    held_word = "pinned" if first_pins else "unpinned"
    with RosHarness() as h:
        first = _host(h, "pin_owner", device="cpu", models=["tiny_cnn"],
                      pinned_models=first_pins)
        rt = first.runtime
        with pytest.raises(ModelNameInUseError,
                           match=rf"tiny_cnn: model 'tiny_cnn' is already loaded in this "
                                 rf"runtime {held_word}, not {words} \(parameters precision, "
                                 r"model_precisions, pinned_models;") as err:
            _host(h, "pin_other", runtime=rt, device="cpu", models=["tiny_mlp", "tiny_cnn"],
                  pinned_models=second_pins)
        assert err.value.code == "name_in_use"
        assert rt.models() == ["tiny_cnn"]  # tiny_mlp was not loaded either
        assert _held(rt, "tiny_cnn") == ("fp32", bool(first_pins))
        # asking what it holds shares it; that host's cleanup leaves it loaded
        second = _host(h, "pin_same", runtime=rt, device="cpu",
                       models=["tiny_cnn", "tiny_mlp"], pinned_models=first_pins)
        assert sorted(rt.models()) == ["tiny_cnn", "tiny_mlp"]
        second.trigger_deactivate()
        second.trigger_cleanup()
        assert rt.models() == ["tiny_cnn"] and _held(rt, "tiny_cnn") == ("fp32",
                                                                          bool(first_pins))


def test_host_refuses_to_pin_what_an_image_node_loaded_unpinned(capfd):
    """The case that was silent: an image node loads its model first (unpinned: a BE
    node, pin auto), then a host whose pinned_models names it configures on the same
    runtime: refused, typed and logged (rclpy's logger writes to stderr)."""
    rt = Runtime(device="cpu")
    try:
        with RosHarness() as h:
            _image_node(h, MonitoringNode, "early_node", rt, model="tiny_cnn")
            assert _held(rt, "tiny_cnn") == ("fp32", False)
            host = _host(h, "late_host", runtime=rt, device="cpu", models=["tiny_cnn"],
                         pinned_models=["tiny_cnn"], autostart=False)
            host.trigger_configure()
            err = host._configure_error
            assert isinstance(err, ModelNameInUseError), err
            assert "already loaded in this runtime unpinned, not pinned" in str(err)
            logged = capfd.readouterr().err
            assert "[late_host]: configure failed" in logged
            assert "ModelNameInUseError: tiny_cnn: model 'tiny_cnn' is already loaded in " \
                   "this runtime unpinned, not pinned" in logged
            assert rt.models() == ["tiny_cnn"] and _held(rt, "tiny_cnn") == ("fp32", False)
            # unpinned, as held: shared
            ok = _host(h, "late_ok", runtime=rt, device="cpu", models=["tiny_cnn"])
            assert ok.active
    finally:
        rt.close()


def test_precision_and_pin_differences_named_together(emulator):
    with RosHarness() as h:
        first = _host(h, "both_owner", device="cuda-emu", models=["tiny_cnn"],
                      precision="tf32", pinned_models=["tiny_cnn"])
        with pytest.raises(ModelNameInUseError,
                           match=r"already loaded in this runtime at tf32 and pinned, not "
                                 r"fp16 and unpinned"):
            _host(h, "both_other", runtime=first.runtime, device="cuda-emu",
                  models=["tiny_cnn"], precision="fp16")


def test_check_models_names_every_entry_and_asks_nothing_of_none():
    """ROS-free: the check itself on a cpu runtime."""
    rt = Runtime(device="cpu")
    try:
        rt.load_model("tiny_cnn", zoo_path("tiny_cnn", "scaled"), pin=True)
        rt.load_model("tiny_mlp", zoo_path("tiny_mlp", "scaled"))
        assert held_difference(rt, "tiny_cnn", "fp32", True) is None
        assert held_difference(rt, "tiny_cnn", None, None) is None  # nothing asked
        assert held_difference(rt, "absent", "fp32", False) is None  # nothing held
        assert held_difference(rt, "tiny_cnn", None, False) == ("pinned", "unpinned")
        check_models(rt, {"tiny_cnn": (None, None), "tiny_mlp": ("fp32", False)}, "x")
        with pytest.raises(ModelNameInUseError) as err:
            check_models(rt, {"tiny_cnn": ("fp32", False), "tiny_mlp": (None, True)}, "pp")
        msg = str(err.value)
        assert "tiny_cnn: model 'tiny_cnn' is already loaded in this runtime pinned, " \
               "not unpinned" in msg
        assert "tiny_mlp: model 'tiny_mlp' is already loaded in this runtime unpinned, " \
               "not pinned" in msg
        assert "(parameters pp;" in msg
        # the device check comes first and is not a name_in_use
        with pytest.raises(InvalidParameterError, match=r"tiny_cnn: precision 'tf32'") as e2:
            check_models(rt, {"tiny_cnn": ("tf32", False)}, "pp")
        assert not isinstance(e2.value, ModelNameInUseError)
    finally:
        rt.close()


# -- /av_infer/models -------------------------------------------------------------------
def _latest_table(tester) -> tuple[Collector, object]:
    got = Collector()
    sub = tester.create_subscription(String, MODELS_TOPIC, got, LATCHED_QOS)
    return got, sub


def test_models_table_gives_precision_and_pin(emulator):
    with RosHarness() as h:
        host = _host(h, "table_host", device="cuda-emu", models=["tiny_cnn", "tiny_mlp"],
                     precision="tf32", model_precisions=["tiny_mlp=fp16"],
                     pinned_models=["tiny_mlp"])
        tester = h.node("table_tester")
        got, sub = _latest_table(tester)
        msg = wait_for(lambda: got.snapshot(), what="the latched model table")[-1]
        table = json.loads(msg.data)
        models = table["models"]
        assert {n: (m["precision"], m["pinned"]) for n, m in models.items()} == {
            "tiny_cnn": ("tf32", False), "tiny_mlp": ("fp16", True)}
        for name, m in models.items():
            info = host.runtime.model_info(name)
            assert (m["weight_bytes"], m["kernels"]) == (info.weight_bytes, info.kernels)
            assert set(m["inputs"]) == set(info.input_spec)  # the specs are still there
        tester.destroy_subscription(sub)


def test_remote_image_node_drops_images_the_host_serves_at_another_precision():
    """Remote mode: the host's table says fp32 (cpu); a node asking fp16 never submits,
    each image counted ``dropped_not_ready``; a node asking fp32 is served."""
    with RosHarness() as h:
        _host(h, "av_infer_runtime", device="cpu", models=["tiny_cnn"])
        wrong = _image_node(h, PerceptionNode, "remote_fp16", None, runtime="remote",
                            model="tiny_cnn", precision="fp16")
        right = _image_node(h, PerceptionNode, "remote_fp32", None, runtime="remote",
                            model="tiny_cnn", precision="fp32")
        _publish_until_served(
            h, "remote_tester", [wrong], right,
            lambda n: n.client.model_precision("tiny_cnn") == "fp32"
            and n.client.ready("tiny_cnn"), "an answer to the fp32 node")
        assert wrong.counters["completed"] == wrong.counters["failed"] == 0
