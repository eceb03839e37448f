"""The ROS layer's runtime glue, without a ROS context (rclpy is imported, never
initialised): a request's priority, deadline and drop_late go with that request and never
change the client's configuration in the runtime; ``device=auto`` falls back to cpu only
when no GPU is usable, says why (log and /diagnostics), and never hides a configuration
error (issue 16, defect 9).
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest

pytest.importorskip("rclpy")

from av_infer_nodes.common import Answered, Every, Reply, submit_to_runtime  # noqa: E402
from av_infer_nodes.runtime_node import (  # noqa: E402
    DEVICES,
    diagnostic_statuses,
    make_runtime,
)
from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402

import av_infer.runtime  # noqa: E402
from av_infer import (  # noqa: E402
    DeadlineMissedError,
    DeviceUnavailableError,
    InvalidParameterError,
    Priority,
    Runtime,
)
from av_infer import tensor_codec as codec  # noqa: E402
from av_infer.model import zoo  # noqa: E402

pytestmark = pytest.mark.timeout(300)

#: a hang guard only: nothing here is timed
WAIT_S = 120.0
#: a node clock reading far after every stamp used below, so stamped deadlines are past
NODE_NOW = 10_000.0


@pytest.fixture(scope="module")
def rt():
    with Runtime(device="cpu") as runtime:
        runtime.load_model("tiny_cnn", zoo.path("tiny_cnn"))
        yield runtime


@pytest.fixture(scope="module")
def x():
    return zoo.sample_inputs("tiny_cnn")


def _request(x, client: str, priority: str, drop_late: bool, late: bool = False,
             deadline_s: float | None = None) -> tuple[codec.RequestControl, dict]:
    """``late``: stamped long before NODE_NOW with a 1 ms deadline, so already missed."""
    if late:
        deadline_s = 1e-3
    return (codec.RequestControl(id=str(uuid.uuid4()), model="tiny_cnn", client=client,
                                 priority=priority, stamp=(1, 0) if late else (0, 0),
                                 frame_id="", deadline_s=deadline_s, drop_late=drop_late),
            dict(x))


def _met(reply) -> bool | None:
    tm = reply.timings_msg()
    return tm.deadline_met if tm.has_deadline else None


def test_requests_never_change_the_client_configuration(rt, x):
    rt.configure_client("cam", priority="RT", relative_deadline=0.5, drop_late=True)
    for priority, drop_late in (("BE", False), ("RT", False), ("BE", True)):
        resp = submit_to_runtime(rt, *_request(x, "cam", priority, drop_late),
                                 NODE_NOW).result(WAIT_S)
        assert resp.ok, (resp.code, resp.message)
    # the client's defaults are what configure_client set: RT, 0.5 s, drop late work
    res = rt.submit("tiny_cnn", x, client="cam").result(WAIT_S)
    assert res.priority == Priority.RT
    assert res.deadline == pytest.approx(res.timings.arrival + 0.5)
    late = rt.submit("tiny_cnn", x, client="cam", deadline=rt.now() - 1.0)
    with pytest.raises(DeadlineMissedError):
        late.result(WAIT_S)


def test_priority_and_drop_late_go_with_each_request(rt, x):
    # an unconfigured client: BE, no deadline, late work runs late
    ran = submit_to_runtime(rt, *_request(x, "mixed", "RT", False, late=True),
                            NODE_NOW).result(WAIT_S)
    assert ran.ok and _met(ran) is False  # ran, late
    be = submit_to_runtime(rt, *_request(x, "mixed", "BE", False, deadline_s=WAIT_S),
                           NODE_NOW).result(WAIT_S)
    assert be.ok and _met(be) is True
    dropped = submit_to_runtime(rt, *_request(x, "mixed", "RT", True, late=True),
                                NODE_NOW).result(WAIT_S)
    assert not dropped.ok and dropped.code == "deadline_missed"
    # the last request's RT and drop_late=True did not become the client's defaults
    res = rt.submit("tiny_cnn", x, client="mixed", deadline=rt.now() - 1.0).result(WAIT_S)
    assert res.priority == Priority.BE and not res.deadline_met


def test_auto_falls_back_to_cpu_only_without_a_usable_gpu():
    runtime, device, why = make_runtime("auto", c=3)
    try:
        if device == "cuda":  # a machine with a GPU
            assert "usable" in why
            return
        assert device == "cpu" and runtime.device.name == "cpu" and runtime.c == 3
        assert "no usable GPU" in why and "fell back to cpu" in why
        assert "unavailable" in why  # DeviceUnavailableError's own words follow
    finally:
        runtime.close()


class _Spy:
    """Stands in for av_infer.runtime.Runtime: records the devices tried; cuda raises
    ``cuda_error`` (when set) after the real constructor accepted the configuration."""

    def __init__(self, cuda_error: Exception | None = None):
        self.tried: list[str] = []
        self.cuda_error = cuda_error
        self.real = av_infer.runtime.Runtime

    def __call__(self, device: str = "cpu", **kwargs):
        self.tried.append(device)
        if device == "cuda" and self.cuda_error is not None:
            self.real(device="cpu", **kwargs).close()  # the configuration itself is fine
            raise self.cuda_error
        return self.real(device=device, **kwargs)


def test_auto_never_hides_a_configuration_error(monkeypatch):
    spy = _Spy()
    monkeypatch.setattr(av_infer.runtime, "Runtime", spy)
    with pytest.raises(InvalidParameterError, match="nonsense"):
        make_runtime("auto", policy="nonsense")
    assert spy.tried == ["cuda"]  # no second try on the cpu
    for error in (InvalidParameterError("c=9 is too large for this GPU"),
                  RuntimeError("driver exploded")):
        spy = _Spy(cuda_error=error)
        monkeypatch.setattr(av_infer.runtime, "Runtime", spy)
        with pytest.raises(type(error), match=str(error)):
            make_runtime("auto")
        assert spy.tried == ["cuda"]


def test_a_virtual_time_device_is_refused_before_a_runtime_exists(monkeypatch):
    """The simulator's time passes only when its caller runs it: a node on it would never
    answer a request, so the host refuses it at configure with the reason (it used to
    accept it, and every request waited forever)."""
    spy = _Spy()
    monkeypatch.setattr(av_infer.runtime, "Runtime", spy)
    with pytest.raises(InvalidParameterError, match="virtual time"):
        make_runtime("sim")
    assert spy.tried == []
    assert "sim" not in DEVICES and {"auto", "cpu", "cuda"} <= set(DEVICES)


def test_auto_falls_back_on_device_unavailable(monkeypatch):
    spy = _Spy(cuda_error=DeviceUnavailableError("cuda device unavailable: no GPU here"))
    monkeypatch.setattr(av_infer.runtime, "Runtime", spy)
    runtime, device, why = make_runtime("auto", policy="seq")
    try:
        assert spy.tried == ["cuda", "cpu"] and device == "cpu" and runtime.policy == "seq"
        assert "no GPU here" in why and "fell back to cpu" in why
    finally:
        runtime.close()


def test_diagnostics_name_the_device_and_the_fallback(rt):
    why = "auto: no usable GPU (cuda device unavailable: no GPU here); fell back to cpu"
    stats = rt.stats()
    head = diagnostic_statuses(stats, "cpu", rt, {}, device_reason=why,
                               device_fallback=True)[0]
    values = {kv.key: kv.value for kv in head.values}
    assert head.name == "av_infer: runtime" and head.level == DiagnosticStatus.WARN
    assert values["device"] == "cpu" and values["device_reason"] == why
    assert values["device_fallback"] == "True" and why in head.message
    ok = diagnostic_statuses(stats, "cpu", rt, {}, device_reason="requested")[0]
    assert ok.level == DiagnosticStatus.OK
    assert {kv.key: kv.value for kv in ok.values}["device_reason"] == "requested"



def test_deadline_placed_from_a_clock_pair_read_together():
    """``rt_now`` given (the image node reads it with the ROS clock at the callback's
    start): the request's absolute deadline is ``rt_now + (stamp + relative - node_now)``,
    soft and hard, and the runtime's clock is not read again."""

    class FakeRuntime:
        def __init__(self) -> None:
            self.kw: dict = {}

        def now(self) -> float:
            raise AssertionError("the runtime clock was read again")

        def submit(self, model, inputs, **kw):  # noqa: ANN001, ANN003, ANN201
            self.kw = kw
            raise RuntimeError("stop here")  # answered as a typed error reply

    rt = FakeRuntime()
    ctrl = codec.RequestControl(id="r1", model="m", client="c", priority="RT",
                                stamp=(100, 500_000_000), frame_id="f", deadline_s=0.05,
                                drop_late=False, hard_deadline_s=0.08)
    fut = submit_to_runtime(rt, ctrl, {}, 100.51, rt_now=7.0)
    assert fut.result(WAIT_S).code != "ok"
    assert rt.kw["deadline"] == pytest.approx(7.0 + (100.5 + 0.05 - 100.51))
    assert rt.kw["hard_deadline"] == pytest.approx(7.0 + (100.5 + 0.08 - 100.51))


def test_run_here_answers_once_with_the_direct_outputs(rt, x):
    """``run_here``: the request runs on this thread while its lane is idle and comes back
    resolved (an ``Answered``, no ``Future`` made); either way its one reply carries the
    outputs a plain submit gives, and a done-callback sees that reply exactly once."""
    ctrl, inputs = _request(x, "here", "RT", False)
    fut = submit_to_runtime(rt, ctrl, inputs, NODE_NOW, run_here=True)
    reply = fut.result(WAIT_S)
    assert reply.ok and reply.id == ctrl.id
    direct = rt.submit("tiny_cnn", dict(x)).result(WAIT_S)
    for name, value in direct.outputs.items():
        np.testing.assert_array_equal(reply.outputs[name], value)
    seen = []
    fut.add_done_callback(lambda f: seen.append(f.result()))
    assert seen == [reply] and fut.done() and fut.exception() is None


def test_answered_is_a_resolved_future():
    reply = Reply(id="a", code="invalid_input", message="m", model="x")
    a = Answered(reply)
    calls = []
    a.add_done_callback(calls.append)
    assert calls == [a] and a.done() and not a.cancelled() and not a.cancel()
    assert a.result() is reply and a.result(0) is reply and a.exception() is None


def test_every_lets_one_complaint_through_per_period():
    """``Every``: a node's repeated complaint is logged once per period (no clock read by
    the test: a period of an hour is not over within the test, one of 0 always is)."""
    hourly, always = Every(3600.0), Every(0.0)
    assert [hourly.due() for _ in range(3)] == [True, False, False]
    assert [always.due() for _ in range(3)] == [True, True, True]
