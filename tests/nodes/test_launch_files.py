"""launch/ and param/ are consistent with the code (launch_ros is not installed here, so the
launch file is read with ``ast``): every executable exists as a console script whose target
imports, every launch argument has a description, every YAML key is declared by its node,
and each node starts from the command line the launch file would run, answers on its
parameter services with the YAML's values and exits cleanly on SIGINT. Waits are on
conditions (services, replies) bounded only against hangs (``WAIT_S``).

Run inside scripts/netns_run.sh (make test does): LOCALHOST discovery, fresh netns.
"""

from __future__ import annotations

import ast
import importlib
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
LAUNCH_FILES = sorted((REPO / "launch").glob("*.launch.py"))
PARAM_FILES = sorted((REPO / "param").glob("*.yaml"))
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]

pytestmark = pytest.mark.timeout(600)  # a hang guard


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and getattr(n.func, "id", getattr(n.func, "attr", None)) == name]


def _kw(call: ast.Call, key: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == key), None)


def test_files_exist():
    assert LAUNCH_FILES and PARAM_FILES
    assert (REPO / "package.xml").exists() and (REPO / "resource" / "av_infer").exists()


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_file_names_real_executables_and_files(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = _calls(tree, "Node")
    assert nodes, "no launch_ros Node actions"
    for call in nodes:
        pkg, exe = _kw(call, "package"), _kw(call, "executable")
        assert isinstance(pkg, ast.Constant) and pkg.value == "av_infer"
        assert isinstance(exe, ast.Constant), "executable must be a literal"
        assert exe.value in SCRIPTS, f"{exe.value} is not a console script in pyproject.toml"
        module, func = SCRIPTS[exe.value].split(":")
        pytest.importorskip("rclpy")
        assert callable(getattr(importlib.import_module(module), func))
        assert _kw(call, "parameters") is not None, f"{exe.value} gets no parameters"
    declared = {}
    for call in _calls(tree, "DeclareLaunchArgument"):
        name = call.args[0].value
        desc = _kw(call, "description")
        assert isinstance(desc, ast.Constant | ast.JoinedStr) and desc.value, name
        declared[name] = call
    used = {c.args[0].value for c in _calls(tree, "LaunchConfiguration")
            if isinstance(c.args[0], ast.Constant)}
    if any(getattr(n, "id", None) == "topics" for n in ast.walk(tree)):
        used |= {arg for _, _, arg in _launch_topics(tree)}  # LaunchConfiguration(to)
    assert used <= set(declared), f"undeclared launch arguments: {used - set(declared)}"
    assert {"composed", "params_file"} <= set(declared)
    # every file the launch file names (param YAMLs) is in the repo and installed
    names = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
             and isinstance(n.value, str) and n.value.endswith((".yaml", ".yml"))]
    assert names
    for name in names:
        assert (REPO / "param" / name).exists(), name
    setup = (REPO / "setup.py").read_text()
    assert '"share/av_infer/param"' in setup and '"share/av_infer/launch"' in setup


def _node_classes():
    from av_infer_nodes.monitoring_node import MonitoringNode
    from av_infer_nodes.perception_node import PerceptionNode
    from av_infer_nodes.runtime_node import RuntimeNode

    return {"av_infer_runtime": RuntimeNode, "av_infer_perception": PerceptionNode,
            "av_infer_monitoring": MonitoringNode}


@pytest.mark.ros
@pytest.mark.parametrize("path", PARAM_FILES, ids=lambda p: p.name)
def test_every_yaml_key_is_declared(path):
    pytest.importorskip("rclpy")
    from av_infer_nodes.testing import RosHarness

    data = yaml.safe_load(path.read_text())
    classes = _node_classes()
    with RosHarness(num_threads=2) as h:
        for key, section in data.items():
            params = section["ros__parameters"]
            targets = list(classes) if key in ("/**", "**") else [key.lstrip("/")]
            for node_name in targets:
                assert node_name in classes, f"{path.name}: no node called {node_name}"
                # the YAML itself is applied (types checked at declaration); the runtime
                # host is kept light with cpu + tiny_cnn given after the file
                extra = ["-p", "device:=cpu", "-p", "models:=[tiny_cnn]"] \
                    if node_name == "av_infer_runtime" else ["-p", "runtime:=remote"]
                node = classes[node_name](
                    context=h.context,
                    cli_args=["--ros-args", "--params-file", str(path), *extra])
                try:
                    undeclared = [k for k in params if not node.has_parameter(k)]
                    assert not undeclared, f"{path.name}: {node_name} lacks {undeclared}"
                    for k, v in params.items():
                        if k in ("device", "models", "runtime"):
                            continue
                        got = node.get_parameter(k).value
                        got = list(got) if isinstance(got, list | tuple) or hasattr(
                            got, "tolist") else got
                        assert got == v, f"{node_name}.{k}: {got!r} != YAML {v!r}"
                finally:
                    node.destroy_node()


def _param_values(tester, node_name: str, names: list[str]):
    from av_infer_nodes.testing import WAIT_S, wait_reply
    from rcl_interfaces.msg import Parameter as ParameterMsg
    from rclpy.parameter import Parameter
    from rclpy.parameter_client import AsyncParameterClient

    client = AsyncParameterClient(tester, node_name)
    assert client.wait_for_services(timeout_sec=WAIT_S), f"{node_name} has no param services"
    reply = wait_reply(lambda: client.get_parameters(names), what=f"{node_name} get_parameters")
    return {n: Parameter.from_parameter_msg(ParameterMsg(name=n, value=v)).value
            for n, v in zip(names, reply.values)}


@pytest.mark.ros
def test_nodes_start_from_the_launch_command_lines(tmp_path):
    """Separate processes, as composed:=false runs them; then the container."""
    pytest.importorskip("rclpy")
    from av_infer_nodes.testing import NodeProcess, RosHarness

    params = "param/av_infer.param.yaml"
    yaml_vals = yaml.safe_load((REPO / params).read_text())
    procs = [
        NodeProcess("av_infer_nodes.runtime_node", log_dir=tmp_path, ros_args=[
            "--params-file", params, "-p", "device:=cpu", "-p", "models:=[tiny_cnn]"]),
        NodeProcess("av_infer_nodes.perception_node", log_dir=tmp_path, ros_args=[
            "--params-file", params, "-p", "runtime:=remote",
            "-r", "~/input/image:=/camera/image_raw", "-r", "~/input/camera_info:=/camera_info"]),
        NodeProcess("av_infer_nodes.monitoring_node", log_dir=tmp_path, ros_args=[
            "--params-file", params, "-p", "runtime:=remote",
            "-r", "~/input/image:=/cabin/image_raw", "-r", "~/input/camera_info:=/camera_info"]),
    ]
    try:
        with RosHarness() as h:
            tester = h.node("launch_tester")
            v = _param_values(tester, "av_infer_runtime", ["policy", "c", "pinned_models"])
            rt_yaml = yaml_vals["av_infer_runtime"]["ros__parameters"]
            assert v["policy"] == rt_yaml["policy"] and v["c"] == rt_yaml["c"]
            assert list(v["pinned_models"]) == rt_yaml["pinned_models"]
            for node in ("av_infer_perception", "av_infer_monitoring"):
                v = _param_values(tester, node, ["model", "resize", "runtime"])
                sect = yaml_vals[node]["ros__parameters"]
                assert v["model"] == sect["model"] and v["resize"] == sect["resize"]
                assert v["runtime"] == "remote"
    finally:
        codes = {p.cmd[2]: p.stop() for p in reversed(procs)}
        for p in procs:  # captured: pytest shows it when the test fails
            print(f"--- {p.cmd[2]} (exit {p.proc.returncode}):\n{p.output()[-3000:]}",
                  file=sys.stderr)
    assert all(c == 0 for c in codes.values()), (codes, [p.output()[-2000:] for p in procs])

    container = NodeProcess("av_infer_nodes.container", log_dir=tmp_path, ros_args=[
        "--params-file", params, "-p", "device:=cpu",
        "-r", "av_infer_perception:~/input/image:=/camera/image_raw"])
    try:
        with RosHarness() as h:
            tester = h.node("launch_tester2")
            for node in ("av_infer_runtime", "av_infer_perception", "av_infer_monitoring"):
                names = ["models"] if node == "av_infer_runtime" else ["runtime", "model"]
                v = _param_values(tester, node, names)
                if node != "av_infer_runtime":
                    assert v["runtime"] == "auto"  # local in the container
    finally:
        code = container.stop()
        print(f"--- container (exit {code}):\n{container.output()[-3000:]}", file=sys.stderr)
    assert code == 0, container.output()[-3000:]
    assert "Traceback" not in container.output(), container.output()[-3000:]


def _launch_topics(tree: ast.AST) -> list[tuple[str, str, str]]:
    """The launch file's ``topics`` table: (node, topic, launch argument)."""
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "topics":
            return [tuple(e.value for e in t.elts) for t in n.value.elts]
    raise AssertionError("the launch file has no `topics` table")


#: what each launch topic argument defaults to: the topic the node used before
#: ~/input/*, ~/output/* (so a deployment launched with the same arguments keeps its topics)
OLD_NAMES = {"~/input/image": None, "~/input/camera_info": "/camera_info",
             "~/output/tensors": "/{node}/output", "~/output/errors": "/{node}/errors",
             "~/output/detections": "/{node}/output/detections",
             "~/output/camera_info": "/{node}/output/camera_info"}


def _launch_remaps() -> tuple[list[tuple[str, str, str]], dict[str, str], list[ast.Call]]:
    path = REPO / "launch" / "av_infer.launch.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    defaults = {c.args[0].value: _kw(c, "default_value").value
                for c in _calls(tree, "DeclareLaunchArgument")
                if isinstance(_kw(c, "default_value"), ast.Constant)}
    return _launch_topics(tree), defaults, _calls(tree, "Node")


def test_launch_file_remaps_every_image_node_topic():
    pytest.importorskip("rclpy")
    from av_infer_nodes.image_node import TOPICS

    table, defaults, nodes = _launch_remaps()
    image_nodes = ("av_infer_perception", "av_infer_monitoring")
    assert sorted((n, t) for n, t, _ in table) == sorted(
        (n, t) for n in image_nodes for t in TOPICS)
    assert len({a for _, _, a in table}) == len(table)  # one argument per topic
    for node, topic, arg in table:
        assert arg in defaults, f"{arg} is not declared with a default"
        old = OLD_NAMES[topic]
        if old is not None:
            assert defaults[arg] == old.format(node=node), (arg, defaults[arg])
    assert defaults["camera_topic"] == "/camera/image_raw"
    assert defaults["cabin_topic"] == "/cabin/image_raw"
    # the container takes every rule node-scoped, each node process its own
    for call in nodes:
        exe, rules = _kw(call, "executable").value, _kw(call, "remappings")
        if exe == "av_infer_runtime":
            assert rules is None
            continue
        assert isinstance(rules, ast.Call) and rules.func.id == "remaps", exe
        want = None if exe == "av_infer_container" else exe
        assert rules.args[0].value == want, exe


@pytest.mark.ros
def test_launch_default_remaps_give_the_old_topics():
    """The container's node-scoped rules with the launch file's defaults, as launch_ros
    passes them (``-r node:from:=to``), on both image nodes in one process: every topic
    is the one the nodes used before ~/input/*, ~/output/*."""
    pytest.importorskip("rclpy")
    from av_infer_nodes.monitoring_node import MonitoringNode
    from av_infer_nodes.perception_node import PerceptionNode
    from av_infer_nodes.testing import RosHarness
    from rclpy.parameter import Parameter

    table, defaults, _ = _launch_remaps()
    rules = [a for n, t, arg in table for a in ("-r", f"{n}:{t}:={defaults[arg]}")]
    params = [Parameter("model", value="tiny_cnn"), Parameter("runtime", value="remote"),
              Parameter("use_camera_info", value=True), Parameter("decoder", value="yolo")]
    with RosHarness(executor="single") as h:
        for cls in (PerceptionNode, MonitoringNode):
            node = h.add(cls(context=h.context, cli_args=["--ros-args", *rules],
                             parameter_overrides=params))
            got = {"~/input/image": node._sub.topic_name,
                   "~/input/camera_info": node._info_sub.topic_name,
                   "~/output/tensors": node._pub.topic_name,
                   "~/output/errors": node._err_pub.topic_name,
                   "~/output/detections": node._det_pub.topic_name,
                   "~/output/camera_info": node._info_pub.topic_name}
            name = node.get_name()
            want = {t: defaults[arg] for n, t, arg in table if n == name}
            assert got == want, name
            assert want["~/output/tensors"] == f"/{name}/output"
