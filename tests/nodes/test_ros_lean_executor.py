"""LeanExecutor (nodes/lean_executor.py) keeps rclpy's executor contract.

The node suites run on it too (tests/nodes/test_ros_nodes.py's ``lean`` graph); these check
the parts of the contract the nodes use only rarely: coroutine callbacks awaiting a future
set from another thread (the host's LoadModel service), ``create_task``, timers, guard
conditions, ``spin_once`` timeouts, endpoints and nodes added and destroyed while it spins,
and callbacks in one process never overlapping. No timed assertions: waits are hang guards.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest

rclpy = pytest.importorskip("rclpy")

from av_infer_nodes.common import make_executor  # noqa: E402
from av_infer_nodes.lean_executor import LeanExecutor  # noqa: E402
from av_infer_nodes.testing import TesterNode, wait_for  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.task import Future  # noqa: E402
from std_msgs.msg import String  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(300)]


@pytest.fixture()
def spun():
    """A context, a LeanExecutor spinning in a thread, and a tester node on it."""
    ctx = Context()
    rclpy.init(context=ctx)
    ex = make_executor("lean", context=ctx)
    assert isinstance(ex, LeanExecutor)
    node = TesterNode("lean_probe", context=ctx)
    ex.add_node(node)
    errors: list[BaseException] = []

    def spin() -> None:
        try:
            ex.spin()
        except Exception as exc:  # noqa: BLE001 - reported below unless a shutdown race
            if ctx.ok():
                errors.append(exc)

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    yield ctx, ex, node
    ex.shutdown(timeout_sec=2.0)
    node.destroy_node()
    rclpy.shutdown(context=ctx)
    t.join(10)
    assert not errors, errors


def test_pub_sub_timer_guard_and_task(spun):
    ctx, ex, node = spun
    got: list[str] = []
    node.create_subscription(String, "/lean/chatter", lambda m: got.append(m.data), 10)
    pub = node.create_publisher(String, "/lean/chatter", 10)
    ticks = []
    node.create_timer(0.01, lambda: ticks.append(1))
    fired = threading.Event()
    gc = node.create_guard_condition(fired.set)
    wait_for(lambda: pub.get_subscription_count() > 0, 30, what="the subscription")
    for i in range(20):  # one at a time: a keep-last history may replace unread samples
        pub.publish(String(data=str(i)))
        wait_for(lambda i=i: len(got) == i + 1, 60, what=f"message {i}")
    assert got == [str(i) for i in range(20)]  # each once, in order
    wait_for(lambda: len(ticks) >= 3, 60, what="timer ticks")
    gc.trigger()
    assert fired.wait(60)
    task = ex.create_task(lambda: 42)
    wait_for(task.done, 60, what="a created task")
    assert task.result() == 42


def test_coroutine_awaiting_a_future_set_elsewhere(spun):
    """The host's LoadModel pattern: a coroutine service awaits a future that a guard
    condition's callback completes, posted from another thread."""
    ctx, ex, node = spun
    done = Future()
    result: list[int] = []
    gc = node.create_guard_condition(lambda: done.set_result(7))

    async def waiter() -> None:
        result.append(await done)

    ex.create_task(waiter)
    threading.Timer(0.05, gc.trigger).start()
    wait_for(lambda: result == [7], 60, what="the coroutine's result")


def test_endpoints_and_nodes_come_and_go_while_spinning(spun):
    ctx, ex, node = spun
    other = TesterNode("lean_other", context=ctx)
    ex.add_node(other)
    got: list[str] = []
    sub = other.create_subscription(String, "/lean/late", lambda m: got.append(m.data), 10)
    pub = node.create_publisher(String, "/lean/late", 10)
    wait_for(lambda: pub.get_subscription_count() > 0, 30, what="the late subscription")
    pub.publish(String(data="a"))
    wait_for(lambda: got == ["a"], 60, what="the message to the added node")
    for _ in range(20):  # destroyed and recreated while the executor waits on them
        other.destroy_subscription(sub)
        sub = other.create_subscription(String, "/lean/late", lambda m: got.append(m.data), 10)
    ex.remove_node(other)
    other.destroy_node()
    ticks = []
    node.create_timer(0.01, lambda: ticks.append(1))
    wait_for(lambda: len(ticks) >= 2, 60, what="spinning after the removals")


def test_a_chain_of_callbacks_that_publish_destroy_and_create_endpoints(spun):
    """The data path waits again on the entities it gathered while its callbacks leave
    something ready (``HOT_REPOLLS``), with their handles held: a chain of messages each
    published from the previous one's callback arrives whole and in order, longer than
    the re-polls; a subscription destroyed by a callback right after a message was
    published to it is never called (its take finds it gone); one created by a callback
    receives what is published after it matched."""
    ctx, ex, node = spun
    from av_infer_nodes.lean_executor import HOT_REPOLLS

    hops: list[int] = []
    victim_calls: list[str] = []
    late: list[str] = []
    made: list[object] = []
    victim = node.create_subscription(String, "/lean/victim",
                                      lambda m: victim_calls.append(m.data), 10)
    p_victim = node.create_publisher(String, "/lean/victim", 10)
    p_hop = node.create_publisher(String, "/lean/hop", 10)
    n_hops = 5 * HOT_REPOLLS

    def hop(m: String) -> None:
        n = int(m.data)
        hops.append(n)
        if n == 2:
            p_victim.publish(String(data="never taken"))
            node.destroy_subscription(victim)
        if n == 3:
            made.append(node.create_subscription(String, "/lean/made",
                                                 lambda m: late.append(m.data), 10))
        if n < n_hops:
            p_hop.publish(String(data=str(n + 1)))

    node.create_subscription(String, "/lean/hop", hop, 10)
    wait_for(lambda: p_hop.get_subscription_count() > 0
             and p_victim.get_subscription_count() > 0, 30, what="the subscriptions")
    p_hop.publish(String(data="0"))
    wait_for(lambda: len(hops) == n_hops + 1, 60, what="the whole chain")
    assert hops == list(range(n_hops + 1))
    assert victim_calls == []
    p_made = node.create_publisher(String, "/lean/made", 10)
    wait_for(lambda: p_made.get_subscription_count() > 0, 30, what="the made subscription")
    p_made.publish(String(data="after"))
    wait_for(lambda: late == ["after"], 60, what="a message to the made subscription")
    assert len(made) == 1


def test_callbacks_never_overlap(spun):
    ctx, ex, node = spun
    inside, overlaps, count = [0], [0], [0]

    def cb(*_a) -> None:
        inside[0] += 1
        if inside[0] > 1:
            overlaps[0] += 1
        time.sleep(0.001)
        count[0] += 1
        inside[0] -= 1

    node.create_subscription(String, "/lean/busy", cb, 50)
    for _ in range(3):
        node.create_timer(0.002, cb)
    pub = node.create_publisher(String, "/lean/busy", 50)
    wait_for(lambda: pub.get_subscription_count() > 0, 30, what="the subscription")
    for i in range(50):
        pub.publish(String(data=str(i)))
        time.sleep(0.001)
    wait_for(lambda: count[0] >= 100, 120, what="100 callbacks")
    assert overlaps[0] == 0


def test_spin_once_timeout_and_until_future():
    ctx = Context()
    rclpy.init(context=ctx)
    try:
        ex = LeanExecutor(context=ctx)
        node = TesterNode("lean_once", context=ctx)
        ex.add_node(node)
        ex.spin_once(timeout_sec=0)  # nothing ready: returns
        ex.spin_once(timeout_sec=0.01)
        fut = Future()
        node.create_timer(0.01, lambda: fut.done() or fut.set_result("ok"))
        ex.spin_until_future_complete(fut, timeout_sec=60)
        assert fut.result() == "ok"
        ex.shutdown(timeout_sec=2.0)
        node.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)


def test_split_wakes_the_other_thread_for_a_shared_group(spun):
    """A slow timer (calling thread) and a subscription (data-path thread) in the node's
    default mutually exclusive group: while the timer runs, the data thread leaves the
    subscription out of its wait set, and the timer's end must wake it (else messages
    would wait for an unrelated wake-up)."""
    ctx, ex, node = spun
    assert any(t.name == "lean-executor-data" for t in threading.enumerate())
    got: list[str] = []
    node.create_subscription(String, "/lean/shared", lambda m: got.append(m.data), 10)
    pub = node.create_publisher(String, "/lean/shared", 10)
    wait_for(lambda: pub.get_subscription_count() > 0, 30, what="the subscription")
    busy = threading.Event()

    def slow() -> None:
        busy.set()
        time.sleep(0.05)

    node.create_timer(0.2, slow)
    for i in range(10):
        busy.clear()
        assert busy.wait(60)  # publish while the timer callback holds the group
        pub.publish(String(data=str(i)))
        wait_for(lambda i=i: len(got) == i + 1, 60, what=f"message {i}")
    assert got == [str(i) for i in range(10)]


def test_unsplit_spin():
    ctx = Context()
    rclpy.init(context=ctx)
    ex = LeanExecutor(context=ctx, split=False)
    node = TesterNode("lean_unsplit", context=ctx)
    ex.add_node(node)
    t = threading.Thread(target=ex.spin, daemon=True)
    t.start()
    try:
        ticks = []
        node.create_timer(0.01, lambda: ticks.append(1))
        wait_for(lambda: len(ticks) >= 3, 60, what="timer ticks")
        assert not any(t.name == "lean-executor-data" for t in threading.enumerate())
    finally:
        ex.shutdown(timeout_sec=2.0)
        node.destroy_node()
        rclpy.shutdown(context=ctx)
        t.join(10)


def test_a_timer_cancelled_before_its_take_is_skipped():
    """A timer found ready and then cancelled by another thread before the executor takes
    it (the demo cancels its camera timers from its main thread while spinning): skipped,
    as a destroyed one is, instead of ``RCLError: timer is canceled`` out of ``spin``."""
    ctx = Context()
    rclpy.init(context=ctx)
    try:
        ex = LeanExecutor(context=ctx)
        node = TesterNode("lean_cancel_take", context=ctx)
        ex.add_node(node)
        tmr = node.create_timer(0.001, lambda: None)
        wait_for(tmr.handle.is_timer_ready, 60, what="the timer ready")
        tmr.cancel()  # between the ready check and the take
        assert ex._take_timer(tmr) is None
        node.destroy_node()
        ex.shutdown(timeout_sec=2.0)
    finally:
        rclpy.shutdown(context=ctx)


def test_timers_cancelled_from_another_thread_while_spinning(spun):
    """Timers cancelled and reset from another thread while the executor runs them: the
    spin goes on (the fixture checks it raised nothing) and still delivers messages."""
    ctx, ex, node = spun
    timers = [node.create_timer(0.0001, lambda: None) for _ in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the window is a few Python lines: switch threads often
    try:
        for _ in range(20000):
            for t in timers:
                t.cancel()
            for t in timers:
                t.reset()
    finally:
        sys.setswitchinterval(interval)
    got: list[str] = []
    node.create_subscription(String, "/lean/after_cancel", lambda m: got.append(m.data), 10)
    pub = node.create_publisher(String, "/lean/after_cancel", 10)
    wait_for(lambda: pub.get_subscription_count() > 0, 30, what="the subscription")
    pub.publish(String(data="still spinning"))
    wait_for(lambda: got == ["still spinning"], 60, what="a message after the cancels")


def test_data_path_callback_kinds_and_errors():
    """The data-path thread calls plain callbacks directly (no ``Task``): a callback taking
    the message info gets it, an ``async`` callback still runs (through a ``Task``), and an
    exception in a callback leaves ``spin()`` as rclpy's executor lets it."""
    ctx = Context()
    rclpy.init(context=ctx)
    ex = LeanExecutor(context=ctx)
    node = TesterNode("lean_kinds", context=ctx)
    ex.add_node(node)
    raised: list[BaseException] = []

    def spin() -> None:
        try:
            ex.spin()
        except Exception as exc:  # noqa: BLE001 - the test's point
            raised.append(exc)

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    try:
        infos: list[tuple[str, int]] = []
        node.create_subscription(
            String, "/lean/info",
            lambda m, info: infos.append((m.data, info["publication_sequence_number"])), 10)
        seen: list[str] = []

        async def on_async(m: String) -> None:
            seen.append(m.data)

        node.create_subscription(String, "/lean/async", on_async, 10)
        p_info = node.create_publisher(String, "/lean/info", 10)
        p_async = node.create_publisher(String, "/lean/async", 10)
        wait_for(lambda: p_info.get_subscription_count() > 0
                 and p_async.get_subscription_count() > 0, 30, what="the subscriptions")
        for i in range(3):
            p_info.publish(String(data=str(i)))
            wait_for(lambda i=i: len(infos) == i + 1, 60, what=f"message {i} with info")
            p_async.publish(String(data=str(i)))
            wait_for(lambda i=i: len(seen) == i + 1, 60, what=f"async message {i}")
        assert [d for d, _ in infos] == ["0", "1", "2"]
        assert all(isinstance(n, int) for _, n in infos)
        assert seen == ["0", "1", "2"]

        def boom(_m: String) -> None:
            raise RuntimeError("boom from a callback")

        node.create_subscription(String, "/lean/boom", boom, 10)
        p_boom = node.create_publisher(String, "/lean/boom", 10)
        wait_for(lambda: p_boom.get_subscription_count() > 0, 30, what="the subscription")
        p_boom.publish(String(data="x"))
        t.join(60)
        assert not t.is_alive()
        assert len(raised) == 1 and "boom from a callback" in str(raised[0])
    finally:
        ex.shutdown(timeout_sec=2.0)
        node.destroy_node()
        rclpy.shutdown(context=ctx)
        t.join(10)


def test_the_harness_stops_a_spin_that_keeps_failing_on_a_destroyed_entity():
    """``RosHarness`` survives the one-off race of a node destroyed while the executor
    spins (an ``InvalidHandle``, then spinning on), but the same error repeating is no
    race: past ``MAX_RECOVERIES_PER_S`` within a second the spin stops with it as
    ``spin_error`` (a waiting test then fails naming it, instead of a core spinning until
    the test's timeout). The executor's ``spin`` is replaced on the instance to raise."""
    from av_infer_nodes.testing import MAX_RECOVERIES_PER_S, RosHarness
    from rclpy.exceptions import InvalidHandle

    with RosHarness(executor="lean", start=False) as h:
        calls = []

        def spin() -> None:
            calls.append(1)
            raise InvalidHandle("destroyed meanwhile")

        h.executor.spin = spin
        h.start()
        wait_for(lambda: h.spin_error is not None, what="the harness to give up")
        assert isinstance(h.spin_error, InvalidHandle)
        assert len(h.spin_recoveries) == len(calls) == MAX_RECOVERIES_PER_S + 1
