"""Hard deadlines (paper 001): a BE request still unanswered at its hard deadline is dropped
with DeadlineMissedError wherever it is (queued, running, preempted, inside a batch), and
everything else keeps being answered exactly once. Simulator: virtual time, exact."""

from __future__ import annotations

import pytest

from av_infer import Runtime
from av_infer.errors import DeadlineMissedError
from av_infer.model import zoo
from tests.qos.qos_util import SHAPES, group_runtime, latency_of, slow_profile, x


def _missed(f: object, where: str) -> None:
    with pytest.raises(DeadlineMissedError, match=where):
        f.result()


def test_dropped_while_queued_and_while_running() -> None:
    rt = group_runtime(factor=20.0)
    lat = latency_of(rt, "full")
    t0 = rt.now()
    a = rt.submit("full", x(), client="a")  # holds the only BE stream
    b = rt.submit("full", x(), client="b", deadline=t0 + 0.2 * lat, hard_deadline=t0 + 0.5 * lat)
    rt.device.run()
    assert a.result().model == "full"
    _missed(b, "hard deadline .* while queued")
    t0 = rt.now()
    c = rt.submit("full", x(), client="c", hard_deadline=t0 + 0.5 * lat)
    d = rt.submit("full", x(), client="d")  # runs once c's stream is free again
    rt.device.run()
    _missed(c, "while running")
    assert d.result().timings.end < t0 + 2 * lat  # c's launches left the device early
    cs = rt.stats()["clients"]
    assert cs["b"]["errors"] == {"deadline_missed": 1} and cs["b"]["deadline_misses"] == 1
    assert cs["c"]["failed"] == 1 and cs["d"]["completed"] == 1
    rt.close()


def test_dropped_while_preempted_by_rt() -> None:
    rt = group_runtime(factor=20.0)
    rt.load_model("rtm", zoo.path("dynamic_cnn"), SHAPES, pin=True,
                  profile=slow_profile(rt, "rtm", 20.0))
    lat = latency_of(rt, "full")
    dev = rt.device
    t0 = rt.now()
    be = rt.submit("full", x(), client="be", hard_deadline=t0 + 0.6 * lat)
    rts: list = []
    dev.call_at(t0 + 0.1 * lat, lambda: rts.append(rt.submit("rtm", x(), priority="RT")))
    dev.run()
    _missed(be, "while preempted")
    assert rts[0].result().model == "rtm"
    assert rt.stats()["preemptions"] >= 1
    rt.close()


def test_rt_is_not_dropped_by_its_hard_deadline() -> None:
    rt = group_runtime(factor=20.0)
    lat = latency_of(rt, "full")
    t0 = rt.now()
    f = rt.submit("full", x(), priority="RT", deadline=t0 + 0.2 * lat,
                  hard_deadline=t0 + 0.5 * lat)
    rt.device.run()
    r = f.result()  # late, worth 0, but answered with outputs
    assert r.quality == 0.0 and not r.deadline_met
    rt.close()


def test_one_member_of_a_batch_is_dropped_the_others_complete() -> None:
    rt = Runtime("sim", batching=True, max_batch=4, max_be_streams=1, batch_mode="fixed")
    rt.load_model("dyn", zoo.path("dynamic_cnn"), SHAPES)

    def round_(hards: list[float | None]) -> tuple[object, list]:
        t0 = rt.now()
        blocker = rt.submit("dyn", x(), client="blocker")
        futs = [rt.submit("dyn", x(i), client="m",
                          hard_deadline=None if h is None else t0 + h)
                for i, h in enumerate(hards)]
        rt.device.run()
        return t0, [blocker, *futs]

    t0, futs = round_([None] * 4)  # measure: the 4 run as one batch after the blocker
    tm = futs[-1].result().timings
    assert all(f.result().timings.start == tm.start for f in futs[1:])
    start, end = tm.start - t0, tm.end - t0
    mid = (start + end) / 2
    _, futs = round_([None, mid, None, None])  # the 2nd passes its hard deadline mid-batch
    _missed(futs[2], "in a batch")
    for f in (futs[0], futs[1], futs[3], futs[4]):
        assert f.result().outputs["logits"].shape == (1, 10)
    # every member past its hard deadline: the batch itself is evicted
    _, futs = round_([mid] * 4)
    for f in futs[1:]:
        _missed(f, "in a batch")
    s = rt.stats()["clients"]["m"]
    assert s["submitted"] == 12 and s["completed"] == 7 and s["failed"] == 5
    rt.close()


def test_a_be_request_already_past_its_hard_deadline_never_starts() -> None:
    """An idle stream would start it at once, before the late-heap timer fires: it is
    answered missed instead of starting (BE only; RT is never dropped by its hard
    deadline)."""
    rt = group_runtime(factor=20.0)
    t0 = rt.now()
    be = rt.submit("full", x(), client="be", hard_deadline=t0 - 1.0)
    rt_req = rt.submit("full", x(), client="rt", priority="RT", deadline=t0 + 10.0,
                       hard_deadline=t0 + 10.0)
    rt.device.run()
    _missed(be, "before it could start")
    assert rt_req.result().outputs
    assert be.done()  # answered, with the typed error
    assert rt.stats()["clients"]["be"]["completed"] == 0


def test_a_request_past_its_hard_deadline_is_never_batched_before_the_timer_fires(
        monkeypatch) -> None:
    """On a wall clock the late heap's timer can fire after a stream frees: the request
    past its hard deadline is still answered missed, and the batch formed then serves only
    the others (here the timer is held back, as a late timer thread would be)."""
    rt = Runtime("sim", batching=True, max_batch=4, max_be_streams=1, batch_mode="fixed")
    rt.load_model("dyn", zoo.path("dynamic_cnn"), SHAPES)
    monkeypatch.setattr(rt._driver, "_arm", lambda due: None)  # the timer never fires
    t0 = rt.now()
    blocker = rt.submit("dyn", x(), client="blocker")
    late = rt.submit("dyn", x(0), client="m", hard_deadline=t0 - 1.0)  # first in line
    others = [rt.submit("dyn", x(i), client="m") for i in (1, 2, 3)]
    rt.device.run()
    assert blocker.result().outputs
    _missed(late, "before it could start")
    starts = {f.result().timings.start for f in others}
    assert len(starts) == 1  # the three others ran as one batch, without the late one
    rt.close()
