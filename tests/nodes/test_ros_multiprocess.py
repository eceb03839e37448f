"""Across processes: runtime host in one subprocess, perception node (runtime:=remote) in
another, this test process publishing images, reading TensorList outputs and changing
parameters through the nodes' parameter services. Both nodes start from param/av_infer.param.yaml.

Every wait is on a condition (a service, a received message, a value in /diagnostics)
bounded by ``WAIT_S`` only against hangs, so a busy machine makes the tests slower, not red.

Run inside scripts/netns_run.sh (make test does): LOCALHOST discovery, fresh netns.
"""

from __future__ import annotations

import threading

import pytest

rclpy = pytest.importorskip("rclpy")

from av_infer_msgs.msg import InferResponse, TensorList  # noqa: E402
from av_infer_nodes.image_node import IMAGE_QOS  # noqa: E402
from av_infer_nodes.testing import (  # noqa: E402
    WAIT_S,
    NodeProcess,
    RosHarness,
    make_image,
    wait_for,
    wait_reply,
)
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rcl_interfaces.msg import Parameter as ParameterMsg  # noqa: E402
from rcl_interfaces.msg import ParameterType, ParameterValue  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.parameter_client import AsyncParameterClient  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from av_infer import tensor_codec as codec  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(600)]  # a hang guard
PARAMS = "param/av_infer.param.yaml"
#: the perception node's deadline and request timeout: long enough that no busy machine
#: misses them (the test checks that the deadline travels and is met, not a latency)
DEADLINE_MS = 60000.0


@pytest.fixture(scope="module")
def procs(tmp_path_factory):
    logs = tmp_path_factory.mktemp("ros_logs")
    host = NodeProcess("av_infer_nodes.runtime_node", log_dir=logs, ros_args=[
        "--params-file", PARAMS, "-p", "device:=cpu", "-p", "models:=[tiny_cnn]",
        "-p", "c:=3", "-p", "diagnostics_period_s:=0.2"])
    per = NodeProcess("av_infer_nodes.perception_node", log_dir=logs, ros_args=[
        "--params-file", PARAMS, "-p", "model:=tiny_cnn", "-p", "runtime:=remote",
        "-p", f"relative_deadline_ms:={DEADLINE_MS}", "-p", f"request_timeout_s:={WAIT_S}",
        "-r", "image:=/mp_cam/image"])
    h = RosHarness()
    try:
        yield h, h.node("mp_tester"), host, per
    finally:
        h.close()
        codes = {p.cmd[2]: p.stop() for p in (per, host)}
        for p in (per, host):
            print(f"--- {p.cmd[2]} ---\n{p.output()[-3000:]}")
        assert all(c == 0 for c in codes.values()), codes  # clean exit on SIGINT


def test_image_across_processes_same_header(procs):
    h, tester, host, per = procs
    outs: list = []
    errors: list = []
    lock = threading.Lock()

    def on_out(msg):
        with lock:
            outs.append(msg)

    def on_err(msg):
        with lock:
            errors.append(msg)

    tester.create_subscription(TensorList, "/av_infer_perception/output/tensors", on_out, 10)
    tester.create_subscription(InferResponse, "/av_infer_perception/output/errors", on_err, 10)
    pub = tester.create_publisher(Image, "/mp_cam/image", IMAGE_QOS)
    wait_for(lambda: pub.get_subscription_count() > 0 or not (host.alive() and per.alive()),
             what="perception subscription")
    assert host.alive() and per.alive(), (host.output()[-3000:], per.output()[-3000:])
    sent: dict[str, tuple[int, int]] = {}
    count = [0]

    def five_outputs() -> bool:
        """Publishes one more image unless 5 outputs came back: the perception node drops
        images until the host's model table and topics matched, which nothing outside it
        can see, so images keep coming until outputs do."""
        with lock:
            if len(outs) >= 5:
                return True
        i = count[0]
        img = make_image(tester, f"mp{i}", 30, 40, "bgr8", seed=i)
        sent[f"mp{i}"] = (img.header.stamp.sec, img.header.stamp.nanosec)
        pub.publish(img)
        count[0] += 1
        return not (host.alive() and per.alive())  # a dead node ends the wait early

    try:
        wait_for(five_outputs, period=0.1, what="5 outputs")
    except TimeoutError:
        pass  # the assertion below says what came back
    with lock:
        got, errs = list(outs), list(errors)
    assert len(got) >= 5 and not errs, (
        [(e.code, e.message) for e in errs], host.output()[-2000:], per.output()[-2000:])
    for m in got:
        # correlation: the image's header came back
        assert (m.header.stamp.sec, m.header.stamp.nanosec) == sent[m.header.frame_id]
        assert codec.tensors_dict(m.tensors)["logits"].shape == (1, 10)


def test_params_file_applied(procs):
    h, tester, host, per = procs
    client = AsyncParameterClient(tester, "av_infer_runtime")
    assert client.wait_for_services(timeout_sec=WAIT_S)
    names = ["models", "pinned_models", "c", "policy", "model_variant", "max_be_streams"]
    got = wait_reply(lambda: client.get_parameters(names), what="get_parameters").values
    vals = dict(zip(names, (Parameter.from_parameter_msg(
        ParameterMsg(name=n, value=v)).value for n, v in zip(names, got))))
    assert list(vals["models"]) == ["tiny_cnn"]  # -p after --params-file wins
    assert list(vals["pinned_models"]) == ["inception_v3"]  # from the YAML
    assert vals["c"] == 3 and vals["model_variant"] == "scaled" and vals["max_be_streams"] == 2
    pclient = AsyncParameterClient(tester, "av_infer_perception")
    assert pclient.wait_for_services(timeout_sec=WAIT_S)
    pnames = ["relative_deadline_ms", "resize", "runtime", "priority", "mean"]
    pv = wait_reply(lambda: pclient.get_parameters(pnames), what="get_parameters").values
    assert pv[0].double_value == DEADLINE_MS and pv[1].string_value == "bilinear"
    assert pv[2].string_value == "remote" and pv[3].string_value == "RT"
    assert list(pv[4].double_array_value) == pytest.approx([0.485, 0.456, 0.406])


class RuntimeStatusWatch:
    """The 'av_infer: runtime' statuses on /diagnostics, in order of arrival (one
    publisher, reliable: in order of publication)."""

    def __init__(self, tester) -> None:
        self._lock = threading.Lock()
        self._statuses: list[dict[str, str]] = []
        self.sub = tester.create_subscription(DiagnosticArray, "/diagnostics", self._on, 10)

    def _on(self, msg) -> None:
        for status in msg.status:
            if status.name == "av_infer: runtime":
                with self._lock:
                    self._statuses.append({kv.key: kv.value for kv in status.values})

    def mark(self) -> int:
        """Where statuses received from now on begin (for ``wait``'s ``since``)."""
        with self._lock:
            return len(self._statuses)

    def wait(self, pred, since: int = 0, what: str = "a runtime status") -> dict[str, str]:
        """The first status received at or after ``since`` for which ``pred`` holds."""

        def find():
            with self._lock:
                return next((s for s in self._statuses[since:] if pred(s)), None)

        return wait_for(find, what=what)


def test_parameters_from_another_process(procs):
    h, tester, host, per = procs
    client = AsyncParameterClient(tester, "av_infer_runtime")
    assert client.wait_for_services(timeout_sec=WAIT_S)
    watch = RuntimeStatusWatch(tester)
    res = wait_reply(lambda: client.set_parameters([Parameter("policy", value="seq"),
                                                    Parameter("c", value=2)]), what="set")
    assert all(r.successful for r in res.results), res
    watch.wait(lambda s: s["policy"] == "seq" and s["c"] == "2",
               what="runtime policy seq, c 2 in /diagnostics")
    # invalid values are rejected with a reason and change nothing
    res = wait_reply(lambda: client.set_parameters([Parameter("policy", value="bogus")]),
                     what="set")
    assert not res.results[0].successful and "bogus" in res.results[0].reason
    res = wait_reply(lambda: client.set_parameters([Parameter("c", value=10**6)]), what="set")
    assert not res.results[0].successful and res.results[0].reason
    res = wait_reply(lambda: client.set_parameters([Parameter("device", value="sim")]), what="set")
    assert not res.results[0].successful and "read-only" in res.results[0].reason.lower()
    # the raw service, as `ros2 param set` uses it
    srv = tester.create_client(SetParameters, "/av_infer_runtime/set_parameters")
    assert srv.wait_for_service(timeout_sec=WAIT_S)
    req = SetParameters.Request(parameters=[ParameterMsg(
        name="policy", value=ParameterValue(type=ParameterType.PARAMETER_STRING,
                                            string_value="reef"))])
    since = watch.mark()  # every status from here on was published after policy seq
    resp = wait_reply(lambda: srv.call_async(req), what="SetParameters")
    assert resp.results[0].successful
    status = watch.wait(lambda s: s["policy"] == "reef", since, what="policy reef")
    assert status["c"] == "2"  # the rejected c=99 changed nothing
    tester.destroy_client(srv)
    tester.destroy_subscription(watch.sub)
