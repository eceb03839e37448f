"""``RequestFuture`` (sched/driver.py) is a ``concurrent.futures.Future`` in everything a
caller can do with one, although it makes its condition only when something needs it
(docs/request_path.md, "av_infer's own instructions per request"): wait/as_completed,
blocking result/exception with and without timeouts, cancel, done-callbacks (delivered on
the driver's callback thread), errors raised as themselves, a second resolution refused.
Each case runs against requests of a real runtime and against futures resolved by hand
from another thread, before and after the waiter starts."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading

import pytest

from av_infer import Runtime
from av_infer.errors import UnknownModelError
from av_infer.model import zoo
from av_infer.sched import driver as drv
from av_infer.sched.driver import RequestFuture


@pytest.fixture(scope="module")
def rt():
    with Runtime("cpu", max_be_streams=1) as r:
        r.load_model("m", zoo.path("tiny_mlp"))
        yield r


@pytest.fixture(scope="module")
def x():
    return zoo.sample_inputs("tiny_mlp")


def test_this_python_takes_the_lean_path() -> None:
    # the fallback (Future's own methods) is correct too, but the figures in the docs are
    # of the lean path: a Python that changes Future's fields must show up here
    assert drv._LEAN


def _resolve_later(fut: RequestFuture, value: object, error: bool = False,
                   delay: float = 0.05) -> threading.Thread:
    def go() -> None:
        threading.Event().wait(delay)
        if error:
            fut.set_exception(value)  # type: ignore[arg-type]
        else:
            fut.set_result(value)

    th = threading.Thread(target=go)
    th.start()
    return th


def test_requests_work_with_wait_and_as_completed(rt, x) -> None:
    futs = [rt.submit("m", x) for _ in range(8)]
    done, not_done = cf.wait(futs, timeout=60)
    assert len(done) == 8 and not not_done
    assert sorted(f.result().request_id for f in cf.as_completed(futs, timeout=60)) == \
        sorted(f.result().request_id for f in futs)
    bad = rt.submit("nope", x)  # failed at once, typed
    done, _ = cf.wait([bad], timeout=60)
    assert bad in done and isinstance(bad.exception(), UnknownModelError)
    with pytest.raises(UnknownModelError):
        bad.result()


@pytest.mark.parametrize("when", ["before", "after"])
def test_wait_sees_a_resolution_before_or_after_it_starts(rt, when: str) -> None:
    fut = RequestFuture(rt._driver)
    if when == "before":
        fut.set_result(7)
        assert fut.done() and fut.resolved
        done, _ = cf.wait([fut], timeout=5)
    else:
        th = _resolve_later(fut, 7)
        done, _ = cf.wait([fut], timeout=60, return_when=cf.FIRST_COMPLETED)
        th.join()
    assert fut in done and fut.result() == 7


def test_as_completed_orders_by_resolution(rt) -> None:
    a, b = RequestFuture(rt._driver), RequestFuture(rt._driver)
    b.set_result("b")  # before as_completed starts
    th = _resolve_later(a, "a")
    got = [f.result() for f in cf.as_completed([a, b], timeout=60)]
    th.join()
    assert got == ["b", "a"]


def test_blocking_result_and_exception_wake_up(rt) -> None:
    fut = RequestFuture(rt._driver)
    th = _resolve_later(fut, 3)
    assert fut.result(timeout=60) == 3  # waits on the condition it makes
    th.join()
    fut = RequestFuture(rt._driver)
    err = UnknownModelError("gone")
    th = _resolve_later(fut, err, error=True)
    assert fut.exception(timeout=60) is err
    th.join()
    with pytest.raises(UnknownModelError):
        fut.result()


def test_timeouts_cancel_and_a_second_resolution(rt) -> None:
    fut = RequestFuture(rt._driver)
    with pytest.raises(cf.TimeoutError):
        fut.result(timeout=0.01)
    with pytest.raises(cf.TimeoutError):
        fut.exception(timeout=0.01)
    assert not fut.done()
    fut.set_result(1)
    with pytest.raises(cf.InvalidStateError):
        fut.set_result(2)
    with pytest.raises(cf.InvalidStateError):
        fut.set_exception(ValueError())
    assert fut.result() == 1 and not fut.cancel()

    c = RequestFuture(rt._driver)
    assert c.cancel() and c.cancelled() and c.done()
    with pytest.raises(cf.CancelledError):
        c.result()
    with pytest.raises(cf.InvalidStateError):
        c.set_result(1)  # the scheduler's answer leaves it cancelled (see below)
    assert not c.resolved

    r = RequestFuture(rt._driver)
    assert r.set_running_or_notify_cancel() and r.running()
    r.set_result(5)
    assert r.result() == 5 and "finished" in repr(r)


def test_the_scheduler_leaves_a_done_future_as_it_is(rt) -> None:
    # the answers' flush calls no done() first: a future a caller cancelled (or one
    # already resolved) refuses the scheduler's result or error itself, stays as it was,
    # and the answers after it in the same flush are still delivered
    sched = rt._engine.sched
    futs = {k: RequestFuture(rt._driver) for k in ("cancelled_r", "cancelled_e", "done",
                                                   "plain_cancelled", "pending")}
    futs["plain_cancelled"] = cf.Future()
    assert futs["cancelled_r"].cancel() and futs["cancelled_e"].cancel()
    assert futs["plain_cancelled"].cancel()
    futs["done"].set_result("first")
    err = UnknownModelError("x")
    rt._control(lambda: sched._answers.extend([
        (futs["cancelled_r"], "late", False), (futs["cancelled_e"], err, True),
        (futs["done"], "second", False), (futs["plain_cancelled"], "late", False),
        (futs["pending"], "answer", False)]))
    assert futs["cancelled_r"].cancelled() and not futs["cancelled_r"].resolved
    assert futs["cancelled_e"].cancelled() and not futs["cancelled_e"].resolved
    assert futs["plain_cancelled"].cancelled()
    assert futs["done"].result() == "first"
    assert futs["pending"].result(timeout=0) == "answer"


def test_done_callbacks_run_once_on_the_callback_thread(rt) -> None:
    seen: list[tuple[object, str]] = []
    ev = threading.Event()

    def cb(f: cf.Future) -> None:
        seen.append((f.result(), threading.current_thread().name))
        ev.set()

    fut = RequestFuture(rt._driver)
    fut.add_done_callback(cb)  # before: held until the result is in
    th = _resolve_later(fut, "v")
    assert ev.wait(60)
    th.join()
    ev.clear()
    fut.add_done_callback(cb)  # after: called at once, still on the callback thread
    assert ev.wait(60)
    assert [v for v, _ in seen] == ["v", "v"]
    assert {name for _, name in seen} == {"av_infer-callbacks"}


def test_asyncio_wraps_it(rt, x) -> None:
    async def main() -> int:
        return (await asyncio.wrap_future(rt.submit("m", x))).request_id

    assert asyncio.run(main()) > 0


def test_many_threads_race_resolution_against_waiting(rt) -> None:
    # a waiter making the condition while another thread resolves: never lost
    for _ in range(200):
        fut = RequestFuture(rt._driver)
        got: list[object] = []
        w = threading.Thread(target=lambda f=fut, g=got: g.append(f.result(timeout=60)))
        w.start()
        fut.set_result(1)
        w.join(60)
        assert got == [1]


def test_a_request_leaves_no_reference_cycle(rt, x) -> None:
    # the future's helper holds the request, which holds the future: dropped once
    # resolved, so requests are freed by reference counting, not the cycle collector
    import gc

    for _ in range(5):
        rt.infer("m", x)
    gc.collect()
    gc.disable()
    try:
        gc.set_debug(gc.DEBUG_SAVEALL)
        for _ in range(20):
            rt.infer("m", x)
            rt.submit("m", x).result()
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert "RequestFuture" not in left and "Request" not in left, left
