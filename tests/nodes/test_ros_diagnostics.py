"""Monitoring a safety reviewer accepts (issue 34, item 5): /diagnostics levels OK, WARN,
ERROR and STALE from rate, timestamp-age and consecutive-deadline-miss checks.

Every level is driven deterministically: the checks take their times as arguments
(``av_infer_nodes.health``), the nodes' statuses are read at a chosen ``now``, and the
deadline misses come from deadlines no inference can meet (1 us) or miss (60 s). No
assertion depends on how fast this machine runs. Run inside scripts/netns_run.sh.
"""

from __future__ import annotations

import time

import pytest

rclpy = pytest.importorskip("rclpy")

from av_infer_nodes.health import (  # noqa: E402
    ERROR,
    OK,
    STALE,
    WARN,
    ConsecutiveCheck,
    Finding,
    RateCheck,
    StampCheck,
    combine,
)
from av_infer_nodes.perception_node import PerceptionNode  # noqa: E402
from av_infer_nodes.runtime_node import (  # noqa: E402
    ClientHealth,
    RuntimeNode,
    diagnostic_statuses,
    parse_client_rates,
)
from av_infer_nodes.testing import RosHarness, make_image, wait_for  # noqa: E402
from builtin_interfaces.msg import Time as TimeMsg  # noqa: E402
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.serialization import serialize_message  # noqa: E402

from av_infer import InvalidParameterError  # noqa: E402


# -- the checks, by injected times ---------------------------------------------------------
def test_rate_check_levels():
    r = RateCheck(expected_hz=10.0, tolerance=0.1, stale_after_s=0.5, window_s=2.0, start=0.0)
    assert r.check(0.2).level == OK  # within stale_after_s of the start, window not full
    assert r.check(0.6).level == STALE and "no input yet" in r.check(0.6).message
    for i in range(31):  # 10 Hz from t=1 to t=4
        r.tick(1.0 + i * 0.1)
    f = r.check(4.0)
    assert f.level == OK and f.values["rate_hz"] == pytest.approx(10.5, abs=0.6)
    for i in range(1, 11):  # slowed to 4 Hz
        r.tick(4.0 + i * 0.25)
    f = r.check(6.5)
    assert f.level == WARN and "too low" in f.message
    for i in range(1, 61):  # 30 Hz
        r.tick(6.5 + i / 30)
    assert "too high" in r.check(8.5).message
    f = r.check(9.2)  # the camera stopped at 8.5
    assert f.level == STALE and "input stopped" in f.message
    only_stale = RateCheck(0.0, 0.1, 1.0, start=0.0)  # no expected rate: staleness only
    only_stale.tick(0.1)
    assert only_stale.check(5.0 - 3.95).level == OK and only_stale.check(5.0).level == STALE
    with pytest.raises(ValueError):
        RateCheck(-1.0, 0.1, 1.0)
    with pytest.raises(ValueError):
        RateCheck(10.0, 1.5, 1.0)


def test_stamp_check_levels_and_reset():
    s = StampCheck(max_age_s=0.1, max_future_s=0.01)
    s.tick(99.95, 100.0)
    assert s.check().level == OK
    s.tick(99.5, 100.0)  # 500 ms old
    f = s.check()
    assert f.level == ERROR and "older than 100 ms" in f.message
    assert s.check().level == OK  # reported once: counts reset at each report
    s.tick(100.5, 100.0)
    assert "in the future" in s.check().message
    s.tick(0.0, 100.0)
    assert s.check().level == ERROR
    off = StampCheck(max_age_s=0.0, max_future_s=0.05)  # age not checked
    off.tick(1.0, 100.0)
    assert off.check().level == OK


def test_consecutive_misses_escalate_and_reset():
    c = ConsecutiveCheck(warn_after=1, error_after=3)
    c.tick(False)
    assert c.check().level == OK
    c.tick(True)
    c.tick(True)
    assert c.check().level == WARN
    c.tick(True)
    assert c.check().level == ERROR and c.check().level == ERROR  # stays until a met one
    c.tick(False)
    f = c.check()
    assert f.level == OK and f.values["longest_miss_run"] == 3 and f.values["misses"] == 3
    with pytest.raises(ValueError):
        ConsecutiveCheck(4, 3)
    assert combine([Finding(WARN, "a"), Finding(STALE, "b"), Finding()]).level == STALE
    assert combine([Finding(WARN, "a"), Finding(ERROR, "b")]).message == "a; b"


# -- the runtime host's per-client statuses -----------------------------------------------
def _params(**kw):
    p = dict(client_rates=["front=10"], rate_tolerance=0.1, stale_timeout_s=0.5,
             deadline_miss_warn=1, deadline_miss_error=2)
    p.update(kw)
    return p


def test_statistics_flatten_to_dotted_keys_with_their_values_text():
    """Nested statistics (dict subclasses too) become dotted keys; floats to 3 decimals
    (non-finite as ``str``), lists as compact JSON, the rest ``str``."""
    from collections import OrderedDict

    stats = {"clients": {}, "cache": OrderedDict(hits=3, ratio=0.25, last={"ms": float("inf")}),
             "queue": [1, 2], "flag": True}
    head = diagnostic_statuses(stats, "cpu", object(), {})[0]
    values = {kv.key: kv.value for kv in head.values}
    assert (values["cache.hits"], values["cache.ratio"], values["cache.last.ms"]) == (
        "3", "0.250", "inf")
    assert (values["queue"], values["flag"]) == ("[1,2]", "True")


def test_an_ort_api_fallback_makes_the_runtime_status_warn():
    def runtime_status(device_stats):
        sts = diagnostic_statuses({"clients": {}, "device": device_stats}, "cpu", object(), {})
        return next(s for s in sts if s.name == "av_infer: runtime")

    ok = runtime_status({"ort_api": "c", "ort_api_reason": None})
    assert ok.level[0] == OK and "Python binding" not in ok.message
    assert {kv.key: kv.value for kv in ok.values}["device.ort_api"] == "c"
    warn = runtime_status({"ort_api": "python", "ort_api_reason": "no libonnxruntime.so"})
    assert warn.level[0] == WARN
    assert "ONNX Runtime through its Python binding: no libonnxruntime.so" in warn.message


def test_client_health_levels_in_diagnostic_statuses():
    assert parse_client_rates(["a=30", "b=0"]) == {"a": 30.0, "b": 0.0}
    for bad in (["a"], ["a=x"], ["=3"], ["a=-1"], ["a=1", "a=2"]):
        with pytest.raises(InvalidParameterError):
            parse_client_rates(bad)
    with pytest.raises(InvalidParameterError):
        ClientHealth(_params(deadline_miss_warn=3, deadline_miss_error=2), 0.0)
    ch = ClientHealth(_params(), start=0.0)

    def level(now):
        stats = {"clients": {}}
        sts = diagnostic_statuses(stats, "cpu", object(), {}, client_findings=ch.findings(now))
        front = [s for s in sts if s.name == "av_infer: client front"]
        return front[0].level[0], front[0].message

    assert level(1.0)[0] == STALE  # expected, never answered
    for i in range(25):  # 10 Hz, deadlines met
        ch.tick("front", True, 1.0 + i * 0.1)
    assert level(3.45)[0] == OK
    ch.tick("front", False, 3.5)
    assert level(3.5)[0] == WARN
    ch.tick("front", False, 3.6)
    lv, msg = level(3.6)
    assert lv == ERROR and "2 consecutive deadline misses" in msg
    ch.tick("other", False, 3.6)  # a client without a rate: misses only
    assert ch.findings(3.6)["other"].level == WARN
    assert level(10.0)[0] == STALE  # front's answers stopped


def test_runtime_health_parameters_validated():
    with RosHarness() as h:
        host = h.add(RuntimeNode(context=h.context, parameter_overrides=[
            Parameter("device", value="cpu"), Parameter("client_rates", value=["front=30"])]))
        before = host.client_health
        r = host.set_parameters([Parameter("client_rates", value=["front"])])
        assert not r[0].successful and host.client_health is before
        r = host.set_parameters([Parameter("deadline_miss_warn", value=5)])  # > error (3)
        assert not r[0].successful and "deadline_miss_error" in r[0].reason
        r = host.set_parameters_atomically([Parameter("deadline_miss_warn", value=5),
                                            Parameter("deadline_miss_error", value=8)])
        assert r.successful and host.client_health is not before
        assert set(host.client_health.rates) == {"front"}


# -- a perception node's input status -----------------------------------------------------
@pytest.fixture(scope="module")
def perception():
    with RosHarness(executor="single") as h:
        host = h.add(RuntimeNode(context=h.context, parameter_overrides=[
            Parameter("device", value="cpu"), Parameter("models", value=["tiny_cnn"])]))
        per = h.add(PerceptionNode("diag_cam", context=h.context, runtime=host.runtime,
                                   parameter_overrides=[
                                       Parameter("model", value="tiny_cnn"),
                                       Parameter("expected_hz", value=1000.0),
                                       Parameter("stale_timeout_s", value=100.0),
                                       Parameter("max_stamp_age_ms", value=60000.0),
                                       Parameter("relative_deadline_ms", value=60000.0),
                                       Parameter("deadline_miss_error", value=3)]))
        tester = h.node("diag_tester")
        yield h, per, tester


def _feed(per, n, **image_kw):
    before = per.counters["completed"] + per.counters["failed"]
    for i in range(n):
        # the serialised bytes, as the node's (raw) subscription hands them over
        per._on_image(serialize_message(make_image(per, "diag", seed=i, **image_kw)))
        wait_for(lambda i=i: per.counters["completed"] + per.counters["failed"]
                 >= before + i + 1, what="the answer")


def _level(per, now=None):
    st = per.health_status(now)
    return st.level[0], st.message


def test_perception_input_levels(perception):
    h, per, tester = perception
    _feed(per, 2)
    assert per.health.misses.check().level == OK
    # slow: 1000 Hz expected, a few frames in the last window
    lv, msg = _level(per, time.monotonic() + 3.0)
    assert lv == WARN and "rate too low" in msg
    # deadlines that cannot be met (1 us after the stamp): WARN, then ERROR at 3 in a row
    assert per.set_parameters([Parameter("relative_deadline_ms", value=0.001)])[0].successful
    _feed(per, 1)
    assert per.health.misses.check().level == WARN
    _feed(per, 2)
    lv, msg = _level(per)
    assert lv == ERROR and "3 consecutive deadline misses" in msg
    assert per.set_parameters([Parameter("relative_deadline_ms", value=60000.0)])[0].successful
    _feed(per, 1)  # met again: the run ends
    assert per.health.misses.check().level == OK
    # a stamp from the distant past, then a zero stamp: ERROR (TimeStampStatus)
    _feed(per, 1, stamp=TimeMsg(sec=1, nanosec=0))
    lv, msg = _level(per)
    assert lv == ERROR and "older than" in msg
    _feed(per, 1, stamp=TimeMsg(sec=0, nanosec=0))
    assert "zero stamps" in _level(per)[1]
    # the camera stopped: STALE after stale_timeout_s
    assert _level(per, time.monotonic() + 200.0)[0] == STALE
    # a refused batch changes nothing
    health = per.health
    r = per.set_parameters_atomically([Parameter("deadline_miss_warn", value=9),
                                       Parameter("deadline_miss_error", value=4)])
    assert not r.successful and per.health is health
    # and the status goes out on /diagnostics
    diags: list[DiagnosticArray] = []
    sub = tester.create_subscription(DiagnosticArray, "/diagnostics", diags.append, 10)
    try:
        wait_for(lambda: any(s.name == "av_infer: input /diag_cam"
                             for m in list(diags) for s in m.status),
                 what="the input's status (diagnostics_period_s)")
    finally:
        tester.destroy_subscription(sub)


def test_host_client_status_escalates_from_real_misses():
    """The host's per-client checks are fed by the runtime's own ``complete`` events: two
    requests whose deadline (1 us after an old stamp) cannot be met make the client ERROR
    (deadline_miss_error 2), one with a 60 s deadline ends the run."""
    import numpy as np
    from av_infer_nodes.common import LocalRuntimeClient

    from av_infer import tensor_codec as codec

    with RosHarness() as h:
        host = h.add(RuntimeNode(context=h.context, parameter_overrides=[
            Parameter("device", value="cpu"), Parameter("deadline_miss_error", value=2)]))
        client = LocalRuntimeClient(host, host.runtime)
        x = {"input": np.zeros((1, 3, 32, 32), np.float32)}

        def ask(deadline_s, stamp):
            ctrl = codec.RequestControl(id=f"r{deadline_s}{stamp}", model="tiny_cnn",
                                        client="late_cam", priority="RT", stamp=stamp,
                                        frame_id="f", deadline_s=deadline_s,
                                        drop_late=False)
            reply = client.submit(ctrl, x).result(30.0)
            assert reply.code == "ok", reply.message

        def level():
            return host.client_health.findings(time.monotonic())["late_cam"].level

        now = host.get_clock().now().seconds_nanoseconds()
        old = (now[0] - 10, now[1])
        ask(1e-6, old)
        wait_for(lambda: "late_cam" in host.client_health.findings(time.monotonic()),
                 what="the complete event")
        assert level() == WARN
        ask(1e-6, old)
        wait_for(lambda: level() == ERROR, what="ERROR after 2 consecutive misses")
        sts = diagnostic_statuses({"clients": {}}, "cpu", host.runtime, {},
                                  client_findings=host.client_health.findings(
                                      time.monotonic()))
        assert [s.level[0] for s in sts if s.name == "av_infer: client late_cam"] == [ERROR]
        ask(60.0, (0, 0))
        wait_for(lambda: level() == OK, what="the run ended by a met deadline")
