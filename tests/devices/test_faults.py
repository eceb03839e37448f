"""Injected device faults (issue 16, av_infer/devices/faults.py): a kernel/segment failing
mid-task, a model load failing, out-of-memory at load, a lane thread dying. Each is answered
with a typed error, every other client is still served, and the runtime keeps serving.

One test body per fault, run on ``cpu`` (both engines), ``sim`` and ``cuda-emu``. The
``"lane"`` fault has no meaning on the simulator (no host threads); it runs on cpu and
cuda-emu. Waits are hang guards only (no timed assertions)."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading

import numpy as np
import pytest

from av_infer import Runtime
from av_infer.errors import (
    AvInferError,
    DeviceFaultError,
    ModelLoadError,
    ModelTooLargeError,
)
from av_infer.model import zoo
from av_infer.sched.request import Result

HANG_S = 60.0  # hang guard for every wait: a request unanswered this long is a hang


def _dev(point: str) -> list:
    out = [pytest.param("cpu", {"engine": "ort"}, id="cpu-ort"),
           pytest.param("cpu", {"engine": "numpy"}, id="cpu-numpy")]
    if point != "lane":  # the simulator has no host threads to die
        out.append(pytest.param("sim", {}, id="sim"))
    out.append(pytest.param("cuda-emu", {}, id="cuda-emu"))
    return out


pytestmark = pytest.mark.usefixtures("scheduler_never_errs")


@pytest.fixture(scope="module")
def xs():
    return {"a": zoo.sample_inputs("tiny_cnn"), "b": zoo.sample_inputs("tiny_mlp")}


def _runtime(device: str, opts: dict, **kw) -> Runtime:
    rt = Runtime(device, device_options=opts or None, **kw)
    rt.load_model("a", zoo.path("tiny_cnn"))
    rt.load_model("b", zoo.path("tiny_mlp"))
    return rt


def answers(rt: Runtime, futs: list) -> list:
    """Every future's Result or exception (the simulator is run to idle first); a future
    still pending after HANG_S fails the test."""
    if getattr(rt.device, "virtual", False):
        rt.device.run()
    done, pending = cf.wait(futs, timeout=HANG_S)
    assert not pending, f"hang guard: {len(pending)} of {len(futs)} requests unanswered"
    return [f.exception() if f.exception() is not None else f.result() for f in futs]


def _same(r: Result, ref: Result) -> bool:
    return all(np.array_equal(r.outputs[k], ref.outputs[k]) for k in ref.outputs)


def _serve_b(rt: Runtime, xs: dict, n: int) -> list:
    return [rt.submit("b", xs["b"], client="other") for _ in range(n)]


# -- a kernel / segment failing mid-task ---------------------------------------------------
@pytest.mark.parametrize("prio", ["BE", "RT"])
@pytest.mark.parametrize("device,opts", _dev("kernel"))
def test_kernel_fault_fails_its_request_only(device, opts, prio, xs):
    with _runtime(device, opts) as rt:
        ref_a, ref_b = answers(rt, [rt.submit("a", xs["a"]), rt.submit("b", xs["b"])])
        mid = rt.model_info("a").kernels // 2
        rt.device.inject_faults().add("kernel", model="a", kernel=mid)
        others = _serve_b(rt, xs, 3)
        bad = rt.submit("a", xs["a"], priority=prio, client="victim")
        others += _serve_b(rt, xs, 3)
        got = answers(rt, [bad, *others])
        assert isinstance(got[0], DeviceFaultError), got[0]
        assert "injected kernel fault" in str(got[0])
        assert all(isinstance(r, Result) and _same(r, ref_b) for r in got[1:]), got[1:]
        assert rt.device.faults.fired() == {"kernel": 1}
        # still serving, the failed model included, with the same outputs
        again = answers(rt, [rt.submit("a", xs["a"], priority=prio), *_serve_b(rt, xs, 2)])
        assert _same(again[0], ref_a) and all(_same(r, ref_b) for r in again[1:])


# -- a model load failing, out of memory at load ---------------------------------------------
@pytest.mark.parametrize("point,err", [("load", ModelLoadError), ("oom", ModelTooLargeError)])
@pytest.mark.parametrize("pin", [False, True], ids=["be", "pinned"])
@pytest.mark.parametrize("device,opts", _dev("load"))
def test_load_fault_is_typed_and_nothing_is_left_behind(device, opts, point, err, pin, xs):
    with _runtime(device, opts) as rt:
        rt.device.inject_faults().add(point, model="c")
        futs = _serve_b(rt, xs, 2)
        with pytest.raises(err, match="injected"):
            rt.load_model("c", zoo.path("tiny_cnn"), pin=pin)
        assert "c" not in rt.models()
        futs += _serve_b(rt, xs, 2)
        assert all(isinstance(r, Result) for r in answers(rt, futs))
        # the name is free again and the next load (the rule is spent) serves
        rt.load_model("c", zoo.path("tiny_cnn"), pin=pin)
        r = answers(rt, [rt.submit("c", xs["a"])])[0]
        assert isinstance(r, Result), r


@pytest.mark.parametrize("point,err", [("load", ModelLoadError), ("oom", ModelTooLargeError)])
@pytest.mark.parametrize("device,opts", _dev("load"))
def test_reload_fault_after_eviction_fails_waiting_requests_typed(device, opts, point, err,
                                                                  xs):
    """With room for one resident model, serving a and b alternately reloads them; a
    reload that fails answers the requests waiting for it with the typed error, the other
    model's requests are served, and the next reload succeeds."""
    with _runtime(device, opts, cache_max_models=1) as rt:
        assert isinstance(answers(rt, [rt.submit("a", xs["a"])])[0], Result)
        rt.device.inject_faults().add(point, model="b")
        got = answers(rt, [rt.submit("b", xs["b"]), rt.submit("a", xs["a"])])
        assert isinstance(got[0], err), got[0]
        assert isinstance(got[1], Result), got[1]
        again = answers(rt, [rt.submit("b", xs["b"]), rt.submit("a", xs["a"])])
        assert all(isinstance(r, Result) for r in again), again


# -- a lane thread dying ---------------------------------------------------------------------
@pytest.mark.parametrize("prio", ["BE", "RT"])
@pytest.mark.parametrize("device,opts", _dev("lane"))
def test_lane_death_fails_the_launch_it_held_and_the_lane_restarts(device, opts, prio, xs,
                                                                   caplog):
    """The thread running a's launch dies outside its per-launch handler: a's request is
    answered with DeviceFaultError, b's requests on the other lanes are served, and the
    lane serves again (a new thread took it over)."""
    caplog.set_level(logging.ERROR)
    with _runtime(device, opts) as rt:
        ref_a, ref_b = answers(rt, [rt.submit("a", xs["a"]), rt.submit("b", xs["b"])])
        rt.device.inject_faults().add("lane", model="a")
        stop = threading.Event()
        bg: list = []

        def other_client() -> None:
            while not stop.is_set() and len(bg) < 500:
                bg.append(rt.submit("b", xs["b"], client="other"))
                cf.wait([bg[-1]], timeout=HANG_S)

        th = threading.Thread(target=other_client)
        th.start()
        try:
            bad = [rt.submit("a", xs["a"], priority=prio, client="victim") for _ in range(4)]
            got = answers(rt, bad)  # cf.wait: the test thread never runs launches itself
        finally:
            stop.set()
            th.join(HANG_S)
        assert not th.is_alive(), "hang guard: the other client never finished"
        faults = [g for g in got if not isinstance(g, Result)]
        assert len(faults) == 1 and isinstance(faults[0], DeviceFaultError), got
        assert "died" in str(faults[0]) or "lane" in str(faults[0]), faults[0]
        assert all(_same(g, ref_a) for g in got if isinstance(g, Result))
        assert all(isinstance(r, Result) and _same(r, ref_b) for r in answers(rt, bg))
        assert rt.device.faults.fired() == {"lane": 1}
        if device == "cpu":
            assert sum(s["restarts"] for s in rt.stats()["device"]["streams"]) == 1
        # the lane serves again: many more requests of a, same priority, all answered
        again = answers(rt, [rt.submit("a", xs["a"], priority=prio) for _ in range(6)])
        assert all(isinstance(r, Result) and _same(r, ref_a) for r in again), again


@pytest.mark.parametrize("device,opts", _dev("lane")[:2])
def test_lane_death_while_a_caller_runs_the_lane(device, opts, xs):
    """``infer`` runs its request's launches on the caller's thread: a death there answers
    that request with DeviceFaultError and never raises anything else into the caller."""
    with _runtime(device, opts) as rt:
        rt.device.inject_faults().add("lane", model="a", times=3)
        outcomes = []
        for _ in range(6):
            try:
                outcomes.append(rt.infer("a", xs["a"], timeout=HANG_S))
            except AvInferError as e:
                outcomes.append(e)
        assert sum(isinstance(o, DeviceFaultError) for o in outcomes) == 3, outcomes
        assert all(isinstance(o, (Result, DeviceFaultError)) for o in outcomes)
        assert isinstance(rt.infer("b", xs["b"], timeout=HANG_S), Result)


# -- faults under load -----------------------------------------------------------------------
@pytest.mark.parametrize("device,opts", _dev("lane")[:2])
def test_random_faults_under_mixed_load_fail_one_request_each(device, opts, caplog):
    """RT requests stream in beside two BE closed loops while kernel and lane faults are
    injected at random: each fault that fired failed exactly one request, with
    DeviceFaultError; every other request got its Result; nothing lost or answered twice."""
    import random

    from av_infer.bench.soak import Ledger

    caplog.set_level(logging.CRITICAL)  # lane deaths are logged as errors: expected here
    rng = random.Random(7)
    ledger = Ledger()
    with Runtime(device, device_options=opts) as rt:
        ledger.watch(rt)
        rt.load_model("be", zoo.path("resnet152"))
        rt.load_model("rt", zoo.path("tiny_cnn"), pin=True)
        xb, xr = zoo.sample_inputs("resnet152"), zoo.sample_inputs("tiny_cnn")
        inj = rt.device.inject_faults()
        stop = threading.Event()

        def be(_f=None) -> None:
            if not stop.is_set():
                ledger.submit(rt, "be", xb, on_done=be, client="be")

        be()
        be()
        for i in range(300):
            f = ledger.submit(rt, "rt", xr, priority="RT", client="cam")
            if i % 4 == 0:  # paced by answers, not by time
                cf.wait([f], timeout=HANG_S)
            if rng.random() < 0.08:
                inj.add(rng.choice(["kernel", "lane"]), model=rng.choice(["be", "rt"]))
        stop.set()
        assert ledger.wait_idle(HANG_S), "hang guard: requests unanswered"
        fired = sum(inj.fired().values())
    s = ledger.summary()
    assert s["lost"] == 0 and s["duplicated"] == 0 and s["untyped"] == 0, s
    assert fired > 0 and s["errors"] == {"device_fault": fired}, (s, inj.fired())
    assert s["ok"] == s["requests"] - fired
