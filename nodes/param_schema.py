"""Parameter schemas in Autoware's style (``param/<node>.schema.json``), generated from the
nodes' own declarations: the code (``common.declare``: default, type, description,
range, read-only, constraints) is the one source; the committed schema files are its
snapshot, and ``tests/nodes/test_ros_param_schema.py`` checks that the snapshot is current, that
``param/av_infer.param.yaml`` validates against it (JSON Schema draft-07, ``jsonschema``)
and that docs/ros.md's parameter tables name every parameter.

    python -m av_infer_nodes.param_schema            # rewrite param/*.schema.json
    python -m av_infer_nodes.param_schema --check    # exit 1 if a file is not current

Needs a ROS context (it declares the nodes' parameters on real nodes, not configured:
``autostart`` false, nothing loaded). Run it inside scripts/netns_run.sh.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from rcl_interfaces.msg import ParameterType

#: The nodes with a schema, each built unconfigured (see ``_build``).
NODES = ("av_infer_runtime", "av_infer_perception", "av_infer_monitoring")

_JSON_TYPES = {ParameterType.PARAMETER_BOOL: "boolean",
               ParameterType.PARAMETER_INTEGER: "integer",
               ParameterType.PARAMETER_DOUBLE: "number",
               ParameterType.PARAMETER_STRING: "string"}
_ARRAY_ITEMS = {ParameterType.PARAMETER_STRING_ARRAY: "string",
                ParameterType.PARAMETER_DOUBLE_ARRAY: "number",
                ParameterType.PARAMETER_INTEGER_ARRAY: "integer"}
#: ``additional_constraints`` that list the values: "one of a, b, c", "a, b or c"
_CHOICES = re.compile(r"(?:one of )?([\w-]+(?:, [\w-]+)*)(?:,? or ([\w-]+))?")
#: the runtime's per-group parameters (declared from ``variant_groups``)
GROUP_PATTERN = r"^variant_group\.[A-Za-z][A-Za-z0-9_]{0,63}\.(models|kappas)$"


def choices(constraints: str) -> list[str] | None:
    """The values a constraints text enumerates, or None (prose)."""
    m = _CHOICES.fullmatch(constraints.strip())
    if m is None or (" or " not in constraints and not constraints.startswith("one of")):
        return None
    vals = m.group(1).split(", ") + ([m.group(2)] if m.group(2) else [])
    return vals


def property_schema(desc: Any, default: Any) -> dict[str, Any]:
    """One parameter's JSON schema from its ParameterDescriptor and default."""
    out: dict[str, Any] = {}
    if desc.type in _ARRAY_ITEMS:
        out["type"] = "array"
        out["items"] = {"type": _ARRAY_ITEMS[desc.type]}
    else:
        out["type"] = _JSON_TYPES[desc.type]
    out["description"] = desc.description
    out["default"] = default
    if desc.integer_range:
        out["minimum"], out["maximum"] = (desc.integer_range[0].from_value,
                                          desc.integer_range[0].to_value)
    if desc.floating_point_range:
        out["minimum"], out["maximum"] = (desc.floating_point_range[0].from_value,
                                          desc.floating_point_range[0].to_value)
    if desc.additional_constraints:
        vals = choices(desc.additional_constraints) if out["type"] == "string" else None
        if vals is not None and default in vals:
            out["enum"] = vals
        else:
            out["$comment"] = desc.additional_constraints
    if desc.read_only:
        out["readOnly"] = True
    return out


def node_schema(node: Any) -> dict[str, Any]:
    """The schema of ``node``'s declared parameters (Autoware's layout: ``/**`` ->
    ``ros__parameters`` -> the node's definition; no unknown keys)."""
    from av_infer_nodes.common import declared_defaults

    name = node.get_name()
    props = {}
    for pname, default in declared_defaults(node).items():
        if re.match(GROUP_PATTERN, pname):
            continue
        props[pname] = property_schema(node.describe_parameter(pname), default)
    definition: dict[str, Any] = {"type": "object", "properties": props,
                                  "additionalProperties": False}
    if name == "av_infer_runtime":
        definition["patternProperties"] = {GROUP_PATTERN: {
            "type": "array", "description": "A variant group's models (string[]) or kappas "
            "(double[]), one per name in variant_groups."}}
    return {"$schema": "http://json-schema.org/draft-07/schema#",
            "title": f"Parameters for {name}",
            "type": "object",
            "definitions": {name: definition},
            "properties": {"/**": {
                "type": "object",
                "properties": {"ros__parameters": {"$ref": f"#/definitions/{name}"}},
                "required": ["ros__parameters"], "additionalProperties": False}},
            "required": ["/**"], "additionalProperties": False}


def _build(name: str, context: Any) -> Any:
    from rclpy.parameter import Parameter

    off = [Parameter("autostart", value=False)]
    if name == "av_infer_runtime":
        from av_infer_nodes.runtime_node import RuntimeNode

        return RuntimeNode(context=context, parameter_overrides=off)
    if name == "av_infer_perception":
        from av_infer_nodes.perception_node import PerceptionNode

        return PerceptionNode(context=context, parameter_overrides=[
            *off, Parameter("runtime", value="remote")])
    from av_infer_nodes.monitoring_node import MonitoringNode

    return MonitoringNode(context=context, parameter_overrides=[
        *off, Parameter("runtime", value="remote")])


def schemas(context: Any) -> dict[str, dict[str, Any]]:
    """Node name -> its schema, from nodes built in ``context`` (destroyed again)."""
    out = {}
    for name in NODES:
        node = _build(name, context)
        try:
            out[name] = node_schema(node)
        finally:
            node.destroy_node()
    return out


def dumps(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    import rclpy

    ap = argparse.ArgumentParser(description="write or check param/<node>.schema.json")
    ap.add_argument("--dir", default=str(Path(__file__).resolve().parent.parent / "param"))
    ap.add_argument("--check", action="store_true", help="exit 1 if a file is not current")
    args = ap.parse_args(argv)
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    try:
        result = schemas(ctx)
    finally:
        rclpy.try_shutdown(context=ctx)
    stale = []
    for name, schema in result.items():
        path = Path(args.dir) / f"{name}.schema.json"
        text = dumps(schema)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
            print(path)
    if stale:
        print("not current (python -m av_infer_nodes.param_schema): " + ", ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
