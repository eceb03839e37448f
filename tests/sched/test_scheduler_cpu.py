"""Scheduler behaviour on the CPU device: EDF order, deadlines, BE round-robin, every policy,
policy switches, close semantics, and every request answered exactly once.

Behaviour only, no timing assertions: ordering is forced by gating a kernel of a blocker
task (``GateDevice``) until the requests under test are queued behind it.
"""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest

from av_infer import Runtime
from av_infer.errors import (
    DeadlineMissedError,
    InvalidParameterError,
    RejectedError,
    RuntimeClosedError,
)
from av_infer.model import zoo
from av_infer.model.compiler import compile_model
from av_infer.sched.policies import POLICIES
from tests.sched.test_golden_preemption import GateDevice

# The cpu device refuses padding policies with a reason (tests/sched/test_dkp.py checks that).
ALL_POLICIES = [p for p, spec in POLICIES.items() if spec.available and not spec.padding]

pytestmark = pytest.mark.usefixtures("scheduler_never_errs")



@pytest.fixture(scope="module")
def plans():
    return {
        "cnn": compile_model(zoo.path("tiny_cnn"), name="cnn"),
        "mlp": compile_model(zoo.path("tiny_mlp"), name="mlp"),
    }


@pytest.fixture(scope="module")
def inputs():
    return {"cnn": zoo.sample_inputs("tiny_cnn"), "mlp": zoo.sample_inputs("tiny_mlp")}


class Tracker:
    """Counts listener answers per request and every future's callback invocations."""

    def __init__(self, rt: Runtime) -> None:
        self.events: list[tuple[str, dict]] = []
        self.lock = threading.Lock()
        self.callbacks: Counter = Counter()
        rt.add_listener(self.on_event)

    def on_event(self, kind: str, p: dict) -> None:
        if kind != "kernel":
            with self.lock:
                self.events.append((kind, p))

    def watch(self, fut):
        fut.add_done_callback(lambda f: self.callbacks.update([id(f)]))
        return fut

    def answers(self) -> Counter:
        return Counter(p["request_id"] for k, p in self.events if k in ("complete", "fail"))

    def order(self, kind: str) -> list[int]:
        return [p["request_id"] for k, p in self.events if k == kind]


def _gate(dev: GateDevice, model: str, kernel: int = 0) -> threading.Event:
    """Block the next task of ``model`` before ``kernel`` until the returned event is set."""
    ev = threading.Event()
    dev.hook_next(model, kernel, lambda: ev.wait(30))
    return ev


def _runtime(plans, dev=None, **kw) -> Runtime:
    rt = Runtime(dev or "cpu", **kw)
    for name, plan in plans.items():
        rt.load_model(name, plan)
    return rt


def test_rt_requests_complete_in_edf_order_fifo_on_ties(plans, inputs):
    dev = GateDevice(rt_parallel=1)  # REEF's order: one RT task at a time
    rt = _runtime(plans, dev, policy="reef")
    tr = Tracker(rt)
    gate = _gate(dev, "cnn")
    now = rt.now()
    blocker = rt.submit("cnn", inputs["cnn"], priority="RT", deadline=now + 100)
    # queued behind the running blocker, out of deadline order, with a tie
    deadlines = [now + 50, now + 30, now + 40, now + 30, now + 60]
    futs = [rt.submit("mlp", inputs["mlp"], priority="RT", deadline=d) for d in deadlines]
    gate.set()
    ids = [f.result(timeout=30).request_id for f in futs]
    blocker.result(timeout=30)
    done = [i for i in tr.order("complete") if i in ids]
    expected = [ids[1], ids[3], ids[2], ids[0], ids[4]]  # 30, 30 (FIFO), 40, 50, 60
    assert done == expected
    rt.close()


def test_default_deadline_from_client_and_drop_late(plans, inputs):
    with _runtime(plans) as rt:
        rt.configure_client("cam", "RT", relative_deadline=0.5)
        t0 = rt.now()
        r = rt.submit("mlp", inputs["mlp"], client="cam", arrival=t0).result(timeout=30)
        assert r.priority.name == "RT"
        assert r.deadline == pytest.approx(t0 + 0.5)
        # no relative deadline: infinite
        r2 = rt.submit("mlp", inputs["mlp"]).result(timeout=30)
        assert r2.deadline == float("inf") and r2.priority.name == "BE"
        # drop_late: arrival long ago -> deadline passed before it could start
        rt.configure_client("late", "RT", relative_deadline=0.01, drop_late=True)
        f = rt.submit("mlp", inputs["mlp"], client="late", arrival=rt.now() - 10)
        with pytest.raises(DeadlineMissedError):
            f.result(timeout=30)
        # an explicit deadline overrides the client's relative one
        f2 = rt.submit("mlp", inputs["mlp"], client="late", deadline=rt.now() + 60)
        assert f2.result(timeout=30).deadline_met
        st = rt.stats()["clients"]["late"]
        assert st["failed"] == 1 and st["deadline_misses"] == 1 and st["completed"] == 1
        assert st["errors"] == {"deadline_missed": 1}


def test_be_round_robin_between_clients(plans, inputs):
    dev = GateDevice()
    rt = _runtime(plans, dev, policy="reef", max_be_streams=1)
    tr = Tracker(rt)
    gate = _gate(dev, "cnn")
    blocker = rt.submit("cnn", inputs["cnn"], client="z")
    a = [rt.submit("mlp", inputs["mlp"], client="a") for _ in range(3)]
    b = [rt.submit("mlp", inputs["mlp"], client="b") for _ in range(3)]
    gate.set()
    ida = [f.result(timeout=30).request_id for f in a]
    idb = [f.result(timeout=30).request_id for f in b]
    blocker.result(timeout=30)
    order = [i for i in tr.order("dispatch") if i in ida + idb]
    assert order == [ida[0], idb[0], ida[1], idb[1], ida[2], idb[2]]
    rt.close()


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_every_policy_mixed_load_answers_each_request_once(policy, plans, inputs):
    rt = _runtime(plans, policy=policy, c=2, edf_preempt=(policy == "reef"))
    tr = Tracker(rt)
    futs = []
    for i in range(24):
        if i % 3 == 0:
            futs.append(tr.watch(rt.submit("mlp", inputs["mlp"], priority="RT",
                                           deadline=rt.now() + (i % 4) * 0.01)))
        else:
            futs.append(tr.watch(rt.submit("cnn", inputs["cnn"], client=f"be{i % 2}")))
    for i, f in enumerate(futs):
        if policy == "rt_only" and i % 3:
            with pytest.raises(RejectedError):
                f.result(timeout=30)
        else:
            r = f.result(timeout=30)
            assert set(r.outputs) == set(plans["cnn" if i % 3 else "mlp"].outputs)
    rt.close()
    assert all(v == 1 for v in tr.answers().values()) and len(tr.answers()) == len(futs)
    assert all(tr.callbacks[id(f)] == 1 for f in futs)
    st = rt.stats()
    assert st["queues"]["rt"] == 0 and sum(st["queues"]["be"].values()) == 0


def test_policy_switch_mid_run(plans, inputs):
    rt = _runtime(plans, policy="streams", c=2)
    tr = Tracker(rt)
    futs = []
    for pol in ["reef", "wait", "seq", "prio_streams", "reef", "rt_only"]:
        for i in range(6):
            futs.append(("RT", rt.submit("mlp", inputs["mlp"], priority="RT")))
            futs.append(("BE", rt.submit("cnn", inputs["cnn"], client=f"c{i % 2}")))
        rt.set_policy(pol)
        assert rt.policy == pol
    outcomes = Counter()
    for prio, f in futs:
        try:
            f.result(timeout=30)
            outcomes[prio, "ok"] += 1
        except RejectedError:
            assert prio == "BE"
            outcomes[prio, "rejected"] += 1
    assert outcomes["RT", "ok"] == 36
    # after switching to rt_only, BE submits are rejected at once
    with pytest.raises(RejectedError):
        rt.submit("cnn", inputs["cnn"]).result(timeout=30)
    rt.close()
    assert all(v == 1 for v in tr.answers().values())


def test_rt_only_switch_rejects_queued_and_fails_running_be(plans, inputs):
    dev = GateDevice()
    rt = _runtime(plans, dev, policy="reef", max_be_streams=1)
    gate = _gate(dev, "cnn")
    running = rt.submit("cnn", inputs["cnn"], client="be")
    queued = [rt.submit("cnn", inputs["cnn"], client="be") for _ in range(3)]
    rt.set_policy("rt_only")
    for f in [running, *queued]:
        with pytest.raises(RejectedError):
            f.result(timeout=30)
    gate.set()
    assert rt.submit("mlp", inputs["mlp"], priority="RT").result(timeout=30)
    rt.close()


def test_set_c_validation(plans):
    with _runtime(plans) as rt:
        rt.set_c(1)
        assert rt.c == 1
        guard = min(p.reuse_guard for p in plans.values())
        rt.set_c(guard - 1)
        assert rt.c == guard - 1
        for bad in (0, -1, guard, 2.5, "3", True):
            with pytest.raises(InvalidParameterError):
                rt.set_c(bad)
        assert rt.c == guard - 1
        for bad in ("nope", "fifo"):
            with pytest.raises(InvalidParameterError):
                rt.set_policy(bad)
        assert rt.policy == "reef"


def test_invalid_requests_fail_at_submit_and_are_never_queued(plans, inputs):
    from av_infer.errors import InvalidInputError, UnknownModelError

    with _runtime(plans) as rt:
        x = inputs["cnn"]["input"]
        cases = [
            ("cnn", {"inputs": x}, InvalidInputError, "input"),  # wrong name
            ("cnn", {}, InvalidInputError, "missing"),
            ("cnn", {"input": x, "extra": x}, InvalidInputError, "extra"),
            ("cnn", {"input": x[:, :, :16]}, InvalidInputError, "[1, 3, 32, 32]"),
            ("cnn", {"input": x.astype(np.float64)}, InvalidInputError, "float64"),
            ("cnn", {"input": x.tolist()}, InvalidInputError, "numpy array"),
            ("cnn", [x], InvalidInputError, "dict"),
            ("nope", {"input": x}, UnknownModelError, "nope"),
        ]
        for model, inp, err, text in cases:
            f = rt.submit(model, inp)
            assert f.done()
            with pytest.raises(err, match=None) as ei:
                f.result()
            assert text in str(ei.value), (text, str(ei.value))
        f = rt.submit("cnn", {"input": x}, priority="urgent")
        with pytest.raises(InvalidParameterError):
            f.result()
        st = rt.stats()
        assert st["queues"]["rt"] == 0 and st["queues"]["be"] == {}
        assert st["clients"] == {} and st["submit_errors"]["invalid_input"] == 7


def test_inputs_are_copied_at_submit(plans, inputs):
    dev = GateDevice()
    with _runtime(plans, dev) as rt:
        gate = _gate(dev, "cnn")
        x = inputs["cnn"]["input"].copy()
        ref = rt.submit("mlp", inputs["mlp"])  # warm path, unrelated
        ref.result(timeout=30)
        expected = rt.submit("cnn", {"input": x.copy()})
        gate.set()
        want = expected.result(timeout=30).outputs
        gate2 = _gate(dev, "cnn")
        f = rt.submit("cnn", {"input": x})
        x[...] = 0  # caller reuses its buffer while the request is queued/running
        gate2.set()
        got = f.result(timeout=30).outputs
        for k in want:
            assert np.array_equal(got[k], want[k])


def test_close_drain_completes_everything(plans, inputs):
    rt = _runtime(plans, policy="reef")
    futs = [rt.submit("cnn", inputs["cnn"], client=f"c{i % 3}") for i in range(10)]
    futs += [rt.submit("mlp", inputs["mlp"], priority="RT") for _ in range(5)]
    rt.close(drain=True)
    assert all(f.done() and f.exception() is None for f in futs)
    f = rt.submit("mlp", inputs["mlp"])
    with pytest.raises(RuntimeClosedError):
        f.result(timeout=1)
    with pytest.raises(RuntimeClosedError):
        rt.set_policy("seq")
    rt.close()  # idempotent


def test_close_without_drain_fails_queued_and_running(plans, inputs):
    dev = GateDevice(rt_parallel=1)  # one RT lane: the second RT request stays queued
    rt = _runtime(plans, dev, policy="reef", max_be_streams=1)
    gate = _gate(dev, "cnn", kernel=1)
    gate_rt = _gate(dev, "mlp", kernel=0)
    running = rt.submit("cnn", inputs["cnn"], client="be")
    running_rt = rt.submit("mlp", inputs["mlp"], priority="RT", deadline=rt.now() + 9)
    queued = [rt.submit("cnn", inputs["cnn"], client="be") for _ in range(4)]
    queued += [rt.submit("mlp", inputs["mlp"], priority="RT", deadline=rt.now() + 9)]
    closer = threading.Thread(target=rt.close, kwargs={"drain": False})
    closer.start()
    for f in [running, running_rt, *queued]:
        with pytest.raises(RuntimeClosedError):
            f.result(timeout=30)
    gate.set()  # let the lanes finish their kernels so the device can stop
    gate_rt.set()
    closer.join(30)
    assert not closer.is_alive()
    with pytest.raises(RuntimeClosedError):
        rt.submit("mlp", inputs["mlp"]).result(timeout=1)


def test_close_drain_timeout_fails_the_rest(plans, inputs):
    dev = GateDevice()
    rt = _runtime(plans, dev, max_be_streams=1)
    gate = _gate(dev, "cnn", kernel=1)
    futs = [rt.submit("cnn", inputs["cnn"], client="be") for _ in range(3)]
    threading.Timer(0.5, gate.set).start()
    rt.close(drain=True, timeout=0.05)
    assert all(f.done() for f in futs)
    assert all(isinstance(f.exception(), RuntimeClosedError) for f in futs)


@pytest.mark.parametrize("policy", ["reef", "streams", "prio_streams", "wait", "seq"])
def test_what_an_rt_arrival_does_to_running_be(policy, plans, inputs):
    """reef preempts BE and runs RT at once; streams run both; wait raises the flag and
    starts RT once the launched BE kernels ran or evicted themselves (BE resumes after);
    seq starts RT only after the BE request finished."""
    dev = GateDevice()
    rt = _runtime(plans, dev, policy=policy, c=1)
    arrived = threading.Event()
    rt.add_listener(lambda k, p: arrived.set() if k == "arrival" and p["priority"] == "RT"
                    else None)
    gate, inside = threading.Event(), threading.Event()
    dev.hook_next("cnn", 1, lambda: (inside.set(), gate.wait(30)))
    be = rt.submit("cnn", inputs["cnn"], client="be")
    assert inside.wait(30)  # BE is running kernel 1 when RT arrives
    f_rt = rt.submit("mlp", inputs["mlp"], priority="RT")
    if policy in ("reef", "streams", "prio_streams"):
        r_rt = f_rt.result(timeout=30)  # completes while BE is held inside kernel 1
        gate.set()
        r_be = be.result(timeout=30)
        assert r_rt.timings.end < r_be.timings.end
        assert r_be.timings.preempted == (1 if policy == "reef" else 0)
    else:
        assert arrived.wait(30)
        t_gate = rt.now()
        gate.set()
        r_rt, r_be = f_rt.result(timeout=30), be.result(timeout=30)
        assert r_rt.timings.first_kernel_start >= t_gate  # waited for launched BE work
        if policy == "wait":
            assert r_be.timings.preempted == 1
            assert r_rt.timings.end < r_be.timings.end
        else:
            assert r_rt.timings.first_kernel_start >= r_be.timings.end
    rt.close()


def test_edf_preempt_switches_rt_tasks_at_a_kernel_boundary(plans, inputs):
    dev = GateDevice()
    rt = _runtime(plans, dev, policy="reef", c=1, edf_preempt=True)
    switched = threading.Event()
    rt.add_listener(lambda k, p: switched.set() if k == "preempt" and p["kind"] == "edf"
                    else None)
    gate = _gate(dev, "cnn", kernel=1)
    now = rt.now()
    slow = rt.submit("cnn", inputs["cnn"], priority="RT", deadline=now + 100)
    urgent = rt.submit("mlp", inputs["mlp"], priority="RT", deadline=now + 1)
    assert switched.wait(30)
    gate.set()
    r_slow, r_urgent = slow.result(timeout=30), urgent.result(timeout=30)
    assert r_urgent.timings.end < r_slow.timings.end
    assert r_slow.timings.preempted == 1
    ref = rt.submit("cnn", inputs["cnn"]).result(timeout=30)
    for k in ref.outputs:
        assert np.array_equal(r_slow.outputs[k], ref.outputs[k])
    assert rt.stats()["rt_switches"] == 1
    rt.close()


def test_without_edf_preempt_running_rt_is_not_switched(plans, inputs):
    dev = GateDevice(rt_parallel=1)  # REEF's order: one RT task at a time
    rt = _runtime(plans, dev, policy="reef", c=1)
    gate = _gate(dev, "cnn", kernel=1)
    now = rt.now()
    slow = rt.submit("cnn", inputs["cnn"], priority="RT", deadline=now + 100)
    urgent = rt.submit("mlp", inputs["mlp"], priority="RT", deadline=now + 1)
    gate.set()
    assert urgent.result(timeout=30).timings.end > slow.result(timeout=30).timings.end
    rt.close()


def test_rt_requests_run_side_by_side_on_parallel_rt_lanes(plans, inputs):
    """``rt_parallel=2`` (the cpu default on two cores at one thread per task): an RT
    request completes while another one is held inside its kernel on the other RT lane,
    and outputs are those of a request run alone."""
    dev = GateDevice(rt_parallel=2)
    rt = _runtime(plans, dev, policy="reef", c=1)
    assert rt.stats()["device"]["rt_parallel"] == 2
    gate = _gate(dev, "cnn", kernel=1)
    now = rt.now()
    held = rt.submit("cnn", inputs["cnn"], priority="RT", deadline=now + 100)
    beside = rt.submit("mlp", inputs["mlp"], priority="RT", deadline=now + 200)
    r_beside = beside.result(timeout=30)  # the held request's lane is still blocked
    assert not held.done()
    gate.set()
    r_held = held.result(timeout=30)
    assert r_beside.timings.end < r_held.timings.end
    assert r_beside.request_id != r_held.request_id
    for name, r in (("mlp", r_beside), ("cnn", r_held)):
        ref = rt.infer(name, inputs[name])
        for k in ref.outputs:
            assert np.array_equal(r.outputs[k], ref.outputs[k])
    rt.close()


def test_a_second_rt_request_takes_the_core_reef_dkp_left_to_be(plans, inputs):
    """reef_dkp on the cpu keeps one BE lane running beside one RT task (the core it does
    not use); a second RT request running side by side takes that core: the BE task is
    preempted then, and still completes with the outputs it has alone."""
    dev = GateDevice(rt_parallel=2)
    rt = _runtime(plans, dev, policy="reef_dkp", c=1, max_be_streams=1)
    preempts = []
    rt.add_listener(lambda k, p: preempts.append(p) if k == "preempt" else None)
    be_gate = _gate(dev, "cnn", kernel=1)
    be = rt.submit("cnn", inputs["cnn"], client="be")
    rt_gate = _gate(dev, "mlp", kernel=0)
    first = rt.submit("mlp", inputs["mlp"], priority="RT")
    assert not preempts  # BE keeps the core the first RT task leaves free
    second = rt.submit("mlp", inputs["mlp"], priority="RT")
    assert len(preempts) == 1  # the second RT task takes it
    rt_gate.set()
    be_gate.set()
    first.result(timeout=30), second.result(timeout=30)
    r_be = be.result(timeout=30)
    assert r_be.timings.preempted == 1
    ref = rt.infer("cnn", inputs["cnn"])
    for k in ref.outputs:
        assert np.array_equal(r_be.outputs[k], ref.outputs[k])
    rt.close()


def test_be_requests_start_on_the_core_rt_leaves_free_under_reef_dkp(plans, inputs):
    """reef_dkp on the cpu: while an RT task runs, BE requests keep starting on the lane
    beside it, one after another, instead of that core idling until RT ends; outputs as
    alone."""
    dev = GateDevice(rt_parallel=1)
    rt = _runtime(plans, dev, policy="reef_dkp", c=1, max_be_streams=2)
    rt_gate = _gate(dev, "mlp", kernel=0)
    first = rt.submit("mlp", inputs["mlp"], priority="RT")  # held inside its kernel
    ref = None
    for _ in range(3):  # each starts after the previous one, beside the held RT task
        r_be = rt.submit("cnn", inputs["cnn"], client="be").result(timeout=30)
        assert not first.done()
        ref = ref or r_be
        for k in ref.outputs:
            assert np.array_equal(r_be.outputs[k], ref.outputs[k])
    rt_gate.set()
    first.result(timeout=30)
    rt.close()


def test_kernel_fault_fails_only_that_request(plans, inputs):
    from av_infer.errors import DeviceFaultError

    dev = GateDevice()
    with _runtime(plans, dev) as rt:

        def boom() -> None:
            raise FloatingPointError("injected")

        dev.hook_next("cnn", 1, boom)
        bad = rt.submit("cnn", inputs["cnn"])
        with pytest.raises(DeviceFaultError, match="injected"):
            bad.result(timeout=30)
        assert rt.submit("cnn", inputs["cnn"]).result(timeout=30).outputs
        assert rt.stats()["clients"]["default"]["errors"] == {"device_fault": 1}
