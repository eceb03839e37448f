"""The ROS layer never reaches past the public ``av_infer`` API (docs/design.md: "ROS code
never reaches past the public Runtime API"; issue 16, defect 9).

The nodes' sources are read with ``ast`` (no ROS needed): every import of an ``av_infer``
submodule (``import av_infer.x``, ``from av_infer.x import y``, ``from av_infer import x``
where ``x`` is a submodule, ``importlib.import_module("av_infer.x")``) must be on the
allow-list below, each entry with its reason; ``from av_infer import Name`` of a public
top-level name is always fine.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

import av_infer

NODES = Path(__file__).resolve().parents[2] / "nodes"

#: av_infer submodules the nodes may import, and why there is no top-level alternative.
ALLOWED = {
    "av_infer.tensor_codec": "av_infer_msgs tensors <-> numpy, the request checks and the "
                             "image gather (GatherPlan) of the split control/data path: "
                             "ROS-free so it is tested without ROS",
    "av_infer.pipeline": "the PPipe stage process (pipeline_stage_node.py): stage specs, input "
                         "widening and the pipeline's typed errors, exported by the package",
    "av_infer.detect": "detector-head decoders, NMS and the image <-> model-input geometry "
                       "of the perception node's detections and letterbox: ROS-free, "
                       "tested without ROS",
    "av_infer.latency": "percentiles exactly as numpy computes them (quantiles), for the "
                        "host's per-model latency in /diagnostics, without np.percentile's "
                        "Python layers (docs/ros.md)",
    "av_infer.model_admin": "the ROS-free logic behind /av_infer/load_model, unload_model and "
                            "list_models: model_dirs confinement, size bounds, typed failures",
}


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _av_infer_imports(path: Path) -> list[tuple[int, str]]:
    """(line, av_infer module) for every import of an av_infer submodule in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names
                      if a.name.startswith("av_infer.")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module != "av_infer" and not node.module.startswith("av_infer."):
                continue
            for alias in node.names:  # `from pkg import submodule` imports pkg.submodule
                sub = f"{node.module}.{alias.name}"
                if _is_module(sub):
                    found.append((node.lineno, sub))
                elif node.module != "av_infer":
                    found.append((node.lineno, node.module))
                elif not hasattr(av_infer, alias.name):  # not a public top-level name
                    found.append((node.lineno, sub))
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and node.args[0].value.startswith("av_infer.")
              and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                  "import_module", "__import__")):
            found.append((node.lineno, node.args[0].value))
    return found


SOURCES = sorted(NODES.glob("*.py"))


def test_nodes_found():
    assert {"common.py", "runtime_node.py", "image_node.py"} <= {p.name for p in SOURCES}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_nodes_import_only_the_public_api(path):
    bad = [f"{path.name}:{line}: {mod}" for line, mod in _av_infer_imports(path)
           if mod not in ALLOWED]
    assert not bad, ("nodes/ may import only top-level av_infer names (Runtime, errors, "
                     "DEVICE_NAMES, POLICIES, get_policy, ...) and the allow-list "
                     f"{sorted(ALLOWED)}: {bad}")


def test_allow_list_is_used_and_explained():
    used = {mod for path in SOURCES for _, mod in _av_infer_imports(path)}
    assert set(ALLOWED) <= used, f"stale allow-list entries: {set(ALLOWED) - used}"
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_checker_sees_every_form(tmp_path):
    src = tmp_path / "probe.py"
    src.write_text("import av_infer.devices\n"
                   "from av_infer.sched.policies import POLICIES\n"
                   "from av_infer import sched, Runtime, DEVICE_NAMES\n"
                   "from av_infer.model import zoo\n"
                   "import importlib\n"
                   "importlib.import_module('av_infer.cache')\n"
                   "import av_infer\n")
    mods = [m for _, m in _av_infer_imports(src)]
    assert mods == ["av_infer.devices", "av_infer.sched.policies", "av_infer.sched",
                    "av_infer.model.zoo", "av_infer.cache"]
