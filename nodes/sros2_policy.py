"""An SROS2 access-control policy for an av_infer deployment, from the nodes' own topics.

Why: per-client response topics (``/av_infer/response/<client>``) only keep clients from
*receiving* each other's answers; that no other participant can *read* them is the
transport's job. SROS2 (DDS Security) enforces it per enclave from a policy file
(``ros2 security create_permission <keystore> <enclave> policy.xml``). Writing that file by
hand means repeating every topic each node uses, and a wrong name fails only at run time
(an endpoint refused under ``ROS_SECURITY_STRATEGY=Enforce``).

What: builds the deployment's nodes (the runtime host, and each image node as a remote
client with its parameters and input remaps) in a private ROS context, reads the topics
and services each one created, and writes sros2's policy format (version 0.2.0: one
``<enclave>`` per process, one ``<profile>`` per node, fully qualified names). Added to
what the nodes created, because they appear later or below rclpy's entity lists:

* the host's per-client publishers ``response_topic(client)`` for every configured client
  (the host makes each on that client's first request), and each client's subscription to
  it (made when the host's model table arrives); with ``response_routing: shared``
  ``/av_infer/response`` instead;
* ``/rosout`` and ``~/transition_event``, which rcl creates for every (lifecycle) node.

Guarantees: the policy names exactly the topics and services these nodes use in this
configuration (``tests/nodes/test_ros_sros2_policy.py`` compares it with what another
participant sees in the ROS graph). Topics a live parameter change creates later
(``debug_topics``, ``decoder``'s ``~/output/detections``) are in it only if the
configuration already has them. Only the ``av_infer`` side is written: a camera driver's
or a consumer's enclave needs its own profile. SROS2 itself is not run here (the venv has
no ``sros2``/security-enabled build; docs/ros.md, "Locking the topics down with SROS2").

    scripts/netns_run.sh .venv/bin/python -m av_infer_nodes.sros2_policy \\
        --params-file param/av_infer.param.yaml \\
        --perception av_infer_perception=/camera/image_raw \\
        --monitoring av_infer_monitoring=/cabin/image_raw \\
        --remap av_infer_perception:~/output/tensors:=/av_infer_perception/output -o policy.xml
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

POLICY_VERSION = "0.2.0"
#: The rcl-made publishers of every node (rosout) and lifecycle node (transition events).
RCL_TOPICS = ("/rosout",)
LIFECYCLE_TOPICS = ("~/transition_event",)


@dataclass
class ImageClient:
    """One image node of the deployment, run as a remote client of the host."""

    kind: str  # perception or monitoring
    node: str  # node name
    image_topic: str | None = None  # what ~/input/image is remapped to
    camera_info_topic: str | None = None  # what ~/input/camera_info is remapped to
    namespace: str = "/"
    enclave: str | None = None  # default /av_infer/<node>

    def ros_args(self) -> list[str]:
        args = ["--ros-args", "-r", f"__ns:={self.namespace}", "-p", "runtime:=remote"]
        if self.image_topic:
            args += ["-r", f"~/input/image:={self.image_topic}"]
        if self.camera_info_topic:
            args += ["-r", f"~/input/camera_info:={self.camera_info_topic}"]
        return args


@dataclass
class Deployment:
    """The runtime host and its remote image clients, with one parameters file."""

    clients: list[ImageClient]
    params_file: str | None = None
    host: str = "av_infer_runtime"
    host_namespace: str = "/"
    host_enclave: str | None = None  # default /av_infer/<host>
    #: extra ``--ros-args`` for every node (e.g. ``-p``, ``-r`` rules)
    extra_args: list[str] = field(default_factory=list)


@dataclass
class Profile:
    """What one node may do: topics it publishes and subscribes, services it serves."""

    enclave: str
    namespace: str
    node: str
    publish: set[str] = field(default_factory=set)
    subscribe: set[str] = field(default_factory=set)
    reply: set[str] = field(default_factory=set)
    request: set[str] = field(default_factory=set)


def _fqn(node: Any, name: str, service: bool = False) -> str:
    resolve = node.resolve_service_name if service else node.resolve_topic_name
    return resolve(name, only_expand=True)


def _own_endpoints(node: Any, enclave: str) -> Profile:
    prof = Profile(enclave, node.get_namespace(), node.get_name())
    prof.publish = {p.topic_name for p in node.publishers}
    prof.publish |= {_fqn(node, t) for t in (*RCL_TOPICS, *LIFECYCLE_TOPICS)}
    prof.subscribe = {s.topic_name for s in node.subscriptions}
    prof.reply = {_fqn(node, s.srv_name, service=True) for s in node.services}
    prof.request = {_fqn(node, c.srv_name, service=True) for c in node.clients}
    return prof


def build_nodes(dep: Deployment, context: Any) -> tuple[Any, list[Any]]:
    """The host (not configured: nothing loaded, every endpoint made in its constructor)
    and the image clients (configured as remote clients), in ``context``."""
    from av_infer_nodes.monitoring_node import MonitoringNode
    from av_infer_nodes.perception_node import PerceptionNode
    from av_infer_nodes.runtime_node import RuntimeNode

    params = ["--params-file", dep.params_file] if dep.params_file else []
    host = RuntimeNode(context=context, cli_args=[
        "--ros-args", "-r", f"__node:={dep.host}", "-r", f"__ns:={dep.host_namespace}",
        *params, "-p", "autostart:=false", "-p", "device:=cpu", *dep.extra_args])
    clients = []
    for c in dep.clients:
        cls = {"perception": PerceptionNode, "monitoring": MonitoringNode}[c.kind]
        args = c.ros_args()
        clients.append(cls(c.node, context=context,
                           cli_args=[*args[:1], *params, *args[1:], *dep.extra_args]))
    return host, clients


def profiles(dep: Deployment, host: Any, clients: Sequence[Any]) -> list[Profile]:
    """Every node's profile (see the module docstring for what is added to its own
    entities)."""
    from av_infer_nodes.common import RESPONSE_TOPIC, response_topic

    per_client = host.p["response_routing"] == "per_client"
    hp = _own_endpoints(host, dep.host_enclave or f"/av_infer/{dep.host}")
    out = [hp]
    for spec, node in zip(dep.clients, clients, strict=True):
        cp = _own_endpoints(node, spec.enclave or f"/av_infer/{spec.node}")
        cid = node.p["client"]
        topic = response_topic(cid) if per_client and cid else RESPONSE_TOPIC
        cp.subscribe.add(topic)
        hp.publish.add(topic)
        out.append(cp)
    return out


def policy_xml(profs: Sequence[Profile]) -> str:
    """sros2's policy format (0.2.0), enclaves in the given order, names sorted."""
    root = ET.Element("policy", {"version": POLICY_VERSION})
    enclaves = ET.SubElement(root, "enclaves")
    by_enclave: dict[str, ET.Element] = {}
    for p in profs:
        if p.enclave not in by_enclave:
            enc = ET.SubElement(enclaves, "enclave", {"path": p.enclave})
            by_enclave[p.enclave] = ET.SubElement(enc, "profiles")
        prof = ET.SubElement(by_enclave[p.enclave], "profile",
                             {"ns": p.namespace, "node": p.node})
        for tag, item, attr, names in (("topics", "topic", "publish", p.publish),
                                       ("topics", "topic", "subscribe", p.subscribe),
                                       ("services", "service", "reply", p.reply),
                                       ("services", "service", "request", p.request)):
            if names:
                group = ET.SubElement(prof, tag, {attr: "ALLOW"})
                for name in sorted(names):
                    ET.SubElement(group, item).text = name
    ET.indent(root, space="  ")
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<!-- generated by python -m '
            'av_infer_nodes.sros2_policy: the topics and services the av_infer nodes of '
            'this deployment use -->\n' + ET.tostring(root, encoding="unicode") + "\n")


def generate(dep: Deployment) -> str:
    """Builds the nodes in a private context, reads their endpoints, writes the policy."""
    import rclpy
    from rclpy.context import Context

    ctx = Context()
    rclpy.init(context=ctx, args=[])
    nodes: list[Any] = []
    try:
        host, clients = build_nodes(dep, ctx)
        nodes = [host, *clients]
        return policy_xml(profiles(dep, host, clients))
    finally:
        for n in reversed(nodes):
            n.destroy_node()
        rclpy.try_shutdown(context=ctx)


def _client_arg(kind: str, text: str) -> ImageClient:
    node, _, topic = text.partition("=")
    return ImageClient(kind, node, image_topic=topic or None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m av_infer_nodes.sros2_policy",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--params-file", default=None, help="the deployment's parameters YAML")
    ap.add_argument("--host", default="av_infer_runtime", help="runtime host node name")
    ap.add_argument("--perception", action="append", default=[], metavar="NODE[=IMAGE_TOPIC]",
                    help="a perception node (remote client); repeat")
    ap.add_argument("--monitoring", action="append", default=[], metavar="NODE[=IMAGE_TOPIC]",
                    help="a monitoring node (remote client); repeat")
    ap.add_argument("--camera-info", action="append", default=[], metavar="NODE=TOPIC",
                    help="what NODE's ~/input/camera_info is remapped to (use_camera_info)")
    ap.add_argument("--remap", action="append", default=[], metavar="[NODE:]FROM:=TO",
                    help="a remap rule given to every node (node-scoped: to NODE only), e.g. "
                         "the launch file's output rules av_infer_perception:~/output/tensors"
                         ":=/av_infer_perception/output; repeat")
    ap.add_argument("-o", "--output", default="-", help="policy file (default: stdout)")
    args = ap.parse_args(argv)
    clients = ([_client_arg("perception", t) for t in args.perception]
               + [_client_arg("monitoring", t) for t in args.monitoring])
    if not clients:
        ap.error("name at least one --perception or --monitoring node")
    infos = dict(t.partition("=")[::2] for t in args.camera_info)
    for c in clients:
        c.camera_info_topic = infos.pop(c.node, None)
    if infos:
        ap.error(f"--camera-info for nodes not named: {', '.join(infos)}")
    text = generate(Deployment(clients, params_file=args.params_file, host=args.host,
                               extra_args=[a for rule in args.remap for a in ("-r", rule)]))
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    code = main()
    if code == 0:  # end without interpreter finalization, as the node executables do
        from av_infer_nodes.common import _exit_after_cleanup

        _exit_after_cleanup()
    sys.exit(code)
