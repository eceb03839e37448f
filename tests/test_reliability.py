"""The reliability suite, short form (issue 16): fuzzed submits, every public call from many
threads at once, shutdown with work in flight, RT overload, and a short soak. The long
forms run in ``make soak`` (av_infer/bench/soak.py, the same code, longer).

Every test checks docs/design.md's "every request is answered exactly once" with
``soak.Ledger``: no request lost, none answered twice, nothing but a Result or an
AvInferError. Waits are hang guards only; nothing asserts a duration (the overload test
measures shares in the simulator's virtual time)."""

from __future__ import annotations

import collections

import pytest

from av_infer import Runtime
from av_infer.bench import soak
from av_infer.errors import DeadlineMissedError, RejectedError
from av_infer.model import zoo
from av_infer.sched.request import Result


def _clean(r: dict) -> None:
    """No request lost, none answered twice, no untyped answer, submit never raised."""
    assert r["lost"] == 0, r
    assert r["duplicated"] == 0, r
    assert r["untyped"] == 0, r
    assert r["submit_raised"] == 0, r
    assert not r.get("handler_errors"), r


# -- the checker checks ---------------------------------------------------------------------
def test_ledger_counts_duplicates_per_runtime_and_lost_requests():
    class FakeRt:
        def __init__(self):
            self.listeners = []

        def add_listener(self, fn):
            self.listeners.append(fn)

    ledger = soak.Ledger()
    a, b = FakeRt(), FakeRt()
    ledger.watch(a)
    ledger.watch(b)
    for rt in (a, b):  # request ids are per runtime: id 1 in each is no duplicate
        rt.listeners[0]("complete", {"request_id": 1})
        rt.listeners[0]("dispatch", {"request_id": 2})
    assert ledger.duplicated == 0
    a.listeners[0]("fail", {"request_id": 1})
    assert ledger.duplicated == 1

    class Raising:
        def submit(self, *a, **k):
            raise OverflowError("boom")

    assert ledger.submit(Raising(), "m", {}) is None
    s = ledger.summary()
    assert s["submit_raised"] == 1 and s["lost"] == 0 and "OverflowError" in s["samples"][-1]


# -- fuzz: random requests through Runtime.submit --------------------------------------------
@pytest.mark.parametrize("device,examples", [("sim", 1000), ("cpu", 200)])
def test_fuzz_submit_answers_every_request_once_and_typed(device, examples):
    """Random client names, priorities (invalid ones included), shapes, dtypes, sizes,
    NaN/inf deadlines and arrivals, unknown models, missing/extra/non-array inputs: submit
    never raises, each future resolves once with a Result or an AvInferError, and the
    runtime still serves afterwards (soak.fuzz; 10,000 requests in make soak)."""
    r = soak.fuzz(examples, device)
    _clean(r)
    assert r["ok"] > 0 and r["errors"], r  # both kinds were exercised


# -- concurrency: every public call from many threads ---------------------------------------
def test_concurrent_submit_settings_models_stats_and_close():
    """Three submitters, set_policy, set_c, load/unload_model, stats and close, all at once
    on a fresh cpu runtime, 10 rounds (100 in make soak): no hang, no error other than
    AvInferError subclasses from any call, every request answered once."""
    r = soak.concurrency(rounds=10, device="cpu", seed=1)
    assert not r["hung"], r["hung"]
    assert r["call_untyped_count"] == 0, r["call_untyped"]
    _clean(r)
    assert r["requests"] > 0 and r["drained"], r


# -- shutdown with work in flight --------------------------------------------------------------
@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_shutdown_with_work_in_flight_from_any_thread(device):
    """close(drain) and close(no drain) while requests are in flight, called from the
    caller's thread, another thread, the callback thread and inside the scheduler (a
    listener), 10 rounds each (100 in make soak): no hang, every future answered with a
    Result or RuntimeClosedError, and with drain every request accepted before close got
    its Result."""
    r = soak.shutdown(rounds=10, device=device, seed=2)
    assert r["problem_count"] == 0, r["problems"]
    _clean(r)
    assert set(r["errors"]) <= {"shutdown"}, r["errors"]


# -- overload: RT at twice the capacity (simulator, virtual time) ---------------------------
QUEUE_DEPTH = 8


def _overload(policy: str, be_min_share: float | None = None) -> dict:
    """RT requests (deadline 3 standalone latencies) at twice what one RT stream serves,
    for 400 arrivals, with a BE closed loop beside; the queue bounded at QUEUE_DEPTH.
    ``be_share``: BE completions x BE standalone latency / the window (virtual time)."""
    kw = {} if be_min_share is None else {"be_min_share": be_min_share}
    rt = Runtime("sim", policy=policy, max_queue_depth=QUEUE_DEPTH, **kw)
    try:
        rt.load_model("rt", zoo.path("resnet152"), pin=True)
        rt.load_model("be", zoo.path("vgg19"))
        xr, xb = zoo.sample_inputs("resnet152"), zoo.sample_inputs("vgg19")
        dev = rt.device
        f_rt, f_be = rt.submit("rt", xr, priority="RT"), rt.submit("be", xb)
        dev.run()
        lat_rt, lat_be = f_rt.result().timings.latency, f_be.result().timings.latency
        t0, n = dev.now(), 400
        window = n * lat_rt / 2
        rts: list = []
        bes: list = []
        depth: list[int] = []

        def be_loop(_f=None) -> None:
            if dev.now() < t0 + window:
                bes.append(rt.submit("be", xb, client="be"))
                bes[-1].add_done_callback(be_loop)

        def arrive() -> None:
            rts.append(rt.submit("rt", xr, priority="RT", client="cam",
                                 deadline=dev.now() + 3 * lat_rt))
            depth.append(rt.stats()["queues"]["rt"])

        be_loop()
        for i in range(n):
            dev.call_at(t0 + i * lat_rt / 2, arrive)
        dev.run()
        assert all(f.done() for f in rts + bes), "hang guard: unanswered after the run"
        be_done = [f for f in bes if f.exception() is None
                   and f.result().timings.end <= t0 + window]
        return {"rt": [f.exception() or f.result() for f in rts], "depth": depth,
                "be_min_share": rt.be_min_share,
                "be_share": len(be_done) * lat_be / window, "stats": rt.stats(),
                "be_answers": [f.exception() or f.result() for f in bes]}
    finally:
        rt.close(drain=False)


@pytest.mark.parametrize("policy", ["reef", "prio_streams"])
def test_overload_rt_queue_bounded_misses_counted_rejections_typed(policy):
    r = _overload(policy)
    kinds = collections.Counter(type(a).__name__ for a in r["rt"])
    assert set(kinds) <= {"Result", "RejectedError", "DeadlineMissedError"}, kinds
    assert kinds["RejectedError"] > 0 and kinds["Result"] > 0, kinds
    assert max(r["depth"]) <= QUEUE_DEPTH, max(r["depth"])
    assert all("max_queue_depth" in str(a) for a in r["rt"] if isinstance(a, RejectedError))
    late = sum(1 for a in r["rt"] if isinstance(a, Result) and a.timings.end > a.deadline)
    misses = r["stats"]["clients"]["cam"]["deadline_misses"]
    assert late > 0 and misses == late + sum(isinstance(a, DeadlineMissedError)
                                             for a in r["rt"]), (late, misses)
    assert all(isinstance(a, Result) for a in r["be_answers"]), r["be_answers"][:3]


@pytest.mark.parametrize("policy,share", [("reef", None), ("reef", 0.3),
                                          ("prio_streams", None)])
def test_overload_be_keeps_its_minimum_share(policy, share):
    """BE still progresses while RT is overloaded: at least the runtime's stated
    ``be_min_share`` of the window (default 10 %)."""
    r = _overload(policy, share)
    assert r["be_min_share"] == (0.1 if share is None else share)
    assert r["be_share"] >= r["be_min_share"], r["be_share"]


# -- soak, short form ---------------------------------------------------------------------------
@pytest.mark.parametrize("device,seconds", [("sim", 3.0), ("cpu", 4.0)])
def test_soak_short_form(device, seconds):
    """DISB-E (5 RT Poisson clients dropping late work, 5 BE closed loops) for a few
    seconds (10 minutes per device in make soak): nothing lost or duplicated, every error
    typed."""
    r = soak.soak(device, seconds)
    _clean(r)
    assert r["drained"] and r["ok"] > 0, r
    assert set(r["errors"]) <= {"deadline_missed"}, r["errors"]
