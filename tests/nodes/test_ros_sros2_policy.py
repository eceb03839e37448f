"""The SROS2 policy generator (nodes/sros2_policy.py).

* The committed example (param/sros2/av_infer.policy.xml) is what the generator writes for
  the launch file's one-process-per-node deployment (regenerate it when a node's topics
  change: the command is in EXAMPLE_CMD).
* A generated policy is well-formed XML in sros2's 0.2.0 structure (policy.xsd: policy >
  enclaves > enclave[path] > profiles > profile[ns, node] > topics[publish|subscribe] >
  topic / services[reply|request] > service; ALLOW or DENY), fully qualified valid names.
* It names exactly the topics and services the nodes use: a deployment with custom client
  ids, remapped inputs, camera_info and debug topics is built, each client's request is
  answered (the host makes per-client publishers on demand), and another node's view of
  the ROS graph must equal each profile, name for name.

SROS2 itself (keystore, DDS Security) is not run: the venv has no sros2.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("rclpy")

from av_infer_msgs.msg import InferRequest, InferResponse  # noqa: E402
from av_infer_nodes import sros2_policy as sp  # noqa: E402
from av_infer_nodes.common import (  # noqa: E402
    REQUEST_QOS,
    REQUEST_TOPIC,
    RESPONSE_QOS_CLIENT,
    response_topic,
)
from av_infer_nodes.testing import RosHarness, wait_for  # noqa: E402
from rclpy.validate_full_topic_name import validate_full_topic_name  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "param" / "sros2" / "av_infer.policy.xml"
EXAMPLE_CMD = ["--params-file", "param/av_infer.param.yaml",
               "--perception", "av_infer_perception=/camera/image_raw",
               "--monitoring", "av_infer_monitoring=/cabin/image_raw",
               "--camera-info", "av_infer_perception=/camera_info",
               "--camera-info", "av_infer_monitoring=/camera_info",
               # the launch file's output rules whose defaults differ from ~/output/*
               "--remap", "av_infer_perception:~/output/tensors:=/av_infer_perception/output",
               "--remap", "av_infer_perception:~/output/errors:=/av_infer_perception/errors",
               "--remap", "av_infer_monitoring:~/output/tensors:=/av_infer_monitoring/output",
               "--remap", "av_infer_monitoring:~/output/errors:=/av_infer_monitoring/errors"]

PARAMS = """\
pol_runtime:
  ros__parameters:
    models: [tiny_cnn]
    device: cpu
pol_front:
  ros__parameters:
    client: front_cam
    model: tiny_cnn
    use_camera_info: true
pol_cabin:
  ros__parameters:
    client: cabin_cam
    model: tiny_cnn
    debug_topics: true
"""


def _deployment(tmp_path: Path) -> sp.Deployment:
    params = tmp_path / "pol.param.yaml"
    params.write_text(PARAMS)
    return sp.Deployment(
        [sp.ImageClient("perception", "pol_front", image_topic="/front/image_raw",
                        camera_info_topic="/front/camera_info"),
         sp.ImageClient("monitoring", "pol_cabin", image_topic="/cabin/image_raw",
                        enclave="/vehicle/cabin")],
        params_file=str(params), host="pol_runtime")


def _parse(text: str) -> dict[tuple[str, str, str], dict[str, set[str]]]:
    """Checks sros2's 0.2.0 structure; {(enclave, ns, node): {publish|...: names}}."""
    root = ET.fromstring(text)
    assert root.tag == "policy" and root.get("version") == "0.2.0"
    assert [c.tag for c in root] == ["enclaves"]
    out: dict[tuple[str, str, str], dict[str, set[str]]] = {}
    for enc in root[0]:
        assert enc.tag == "enclave" and enc.get("path", "").startswith("/")
        assert [c.tag for c in enc] == ["profiles"]
        for prof in enc[0]:
            assert prof.tag == "profile" and prof.get("ns") and prof.get("node")
            rules: dict[str, set[str]] = {}
            for group in prof:
                item = {"topics": "topic", "services": "service"}[group.tag]
                (attr, value), = group.attrib.items()
                assert attr in {"topics": ("publish", "subscribe"),
                                "services": ("reply", "request")}[group.tag]
                assert value in ("ALLOW", "DENY")
                names = [c.text for c in group]
                assert all(c.tag == item for c in group) and names
                for name in names:
                    validate_full_topic_name(name)  # fully qualified and valid
                assert len(set(names)) == len(names)
                rules.setdefault(attr, set()).update(names)
            out[(enc.get("path"), prof.get("ns"), prof.get("node"))] = rules
    return out


def test_committed_example_is_current(capsys):
    assert sp.main(EXAMPLE_CMD) == 0
    text = capsys.readouterr().out
    assert EXAMPLE.read_text() == text, (
        "param/sros2/av_infer.policy.xml is stale: regenerate it with "
        "scripts/netns_run.sh .venv/bin/python -m av_infer_nodes.sros2_policy "
        + " ".join(EXAMPLE_CMD) + " -o param/sros2/av_infer.policy.xml")
    profs = _parse(text)
    assert {k[2] for k in profs} == {"av_infer_runtime", "av_infer_perception",
                                     "av_infer_monitoring"}


def test_policy_names_exactly_what_the_graph_shows(tmp_path):
    dep = _deployment(tmp_path)
    policy = _parse(sp.generate(dep))
    assert set(policy) == {("/av_infer/pol_runtime", "/", "pol_runtime"),
                           ("/av_infer/pol_front", "/", "pol_front"),
                           ("/vehicle/cabin", "/", "pol_cabin")}
    host_rules = policy[("/av_infer/pol_runtime", "/", "pol_runtime")]
    front_rules = policy[("/av_infer/pol_front", "/", "pol_front")]
    cabin_rules = policy[("/vehicle/cabin", "/", "pol_cabin")]
    # each client reads its own answers only; the host writes both
    assert response_topic("front_cam") in front_rules["subscribe"]
    assert response_topic("cabin_cam") not in front_rules["subscribe"]
    assert response_topic("cabin_cam") in cabin_rules["subscribe"]
    assert {response_topic("front_cam"), response_topic("cabin_cam")} <= host_rules["publish"]
    assert "/front/camera_info" in front_rules["subscribe"]
    assert "/pol_cabin/debug/cyclic_time_ms" in cabin_rules["publish"]

    with RosHarness(executor="single") as h:
        host, clients = sp.build_nodes(dep, h.context)
        host.trigger_configure()
        host.trigger_activate()
        for n in (host, *clients):
            h.add(n)
        tester = h.node("pol_tester")
        answered: set[str] = set()
        subs = [tester.create_subscription(InferResponse, response_topic(c),
                                           lambda m: answered.add(m.id), RESPONSE_QOS_CLIENT)
                for c in ("front_cam", "cabin_cam")]
        pub = tester.create_publisher(InferRequest, REQUEST_TOPIC, REQUEST_QOS)
        wait_for(lambda: pub.get_subscription_count() > 0, 60, what="the host's request topic")
        # one request per client id (no tensors: answered with a typed error), so the host
        # makes each client's response publisher, as a client's first request does
        for cid in ("front_cam", "cabin_cam"):
            pub.publish(InferRequest(id=f"probe-{cid}", model="tiny_cnn", client=cid))
        wait_for(lambda: answered >= {"probe-front_cam", "probe-cabin_cam"}, 120,
                 what="the probes' answers")
        wait_for(lambda: all(c.client.response_topic for c in clients), 60,
                 what="the clients' response subscriptions")

        def seen(node: str) -> dict[str, set[str]]:
            return {"publish": {n for n, _ in tester.get_publisher_names_and_types_by_node(
                        node, "/")},
                    "subscribe": {n for n, _ in tester.get_subscriber_names_and_types_by_node(
                        node, "/")},
                    "reply": {n for n, _ in tester.get_service_names_and_types_by_node(
                        node, "/")}}

        for (_enc, _ns, node), rules in policy.items():
            want = {"publish": rules.get("publish", set()),
                    "subscribe": rules.get("subscribe", set()),
                    "reply": rules.get("reply", set())}
            assert not rules.get("request")  # av_infer's nodes call no services
            try:  # the graph fills in as discovery proceeds
                wait_for(lambda node=node, want=want: seen(node) == want, 60,
                         what=f"{node}'s endpoints in the graph")
            except TimeoutError:
                pass
            got = seen(node)
            for kind in want:
                assert got[kind] == want[kind], (node, kind, got[kind] ^ want[kind])
        del subs
