"""vHQ (av_infer._cy.vhq): REEF-N virtual host queue, c-bounded transmission, O(1) reset,
restore from ``done``; hypothesis state machine against a model queue and a model device.

The scheduler restores a preempted task from the vHQ's ``done`` (observed). REEF computes
``max(done, k_l - c)`` (inferred); ``reef_restore_point`` below is that formula, kept here as
the oracle the observed point is checked against (the product does not need it)."""

import threading
from collections import deque

import pytest
from av_infer._cy.vhq import VHQ
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule


def reef_restore_point(last_sent: int, done: int, c: int) -> int:
    """REEF §4.3's restore point: ``max(done, last_sent - c)``, at least 0."""
    return max(done, last_sent - c, 0)


# -- REEF's restore point (the oracle) ------------------------------------------------
@pytest.mark.parametrize(
    ("last_sent", "done", "c", "expected"),
    [(10, 3, 4, 6), (10, 8, 4, 8), (2, 0, 4, 0), (-1, 0, 4, 0), (-1, 5, 2, 5), (100, 97, 4, 97)],
)
def test_reef_restore_point(last_sent, done, c, expected):
    assert reef_restore_point(last_sent, done, c) == expected


# -- plain unit tests ----------------------------------------------------------------
def test_push_is_one_range_and_transmit_is_c_bounded():
    q = VHQ(c=2)
    q.push(7, 0, 499)
    assert (q.queued, q.ranges, q.in_flight, q.empty) == (500, 1, 0, False)
    assert q.transmit() == (7, 0)
    assert q.transmit() == (7, 1)
    assert q.transmit() is None              # c reached
    assert q.in_flight == 2 and q.queued == 498
    assert q.complete() == (7, 0)
    assert q.current == (7, 1, 1)
    assert q.transmit() == (7, 2)
    assert q.inflight() == [(7, 1), (7, 2)]


def _transmit_loop(q: VHQ) -> list:
    out = []
    while (x := q.transmit()) is not None:
        out.append(x)
    return out


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 8), st.lists(st.tuples(st.sampled_from(["push", "tx", "done", "reset", "c"]),
                                           st.integers(1, 9)), max_size=40))
def test_transmit_into_is_transmit_until_none(c, ops):
    """``transmit_into`` (what the cpu lanes call) sends exactly what repeated ``transmit``
    calls would, in order, and leaves the queue in the same state."""
    a, b = VHQ(c=c), VHQ(c=c)
    task = 0
    for op, n in ops:
        if op == "push":
            task += 1
            a.push(task, 0, n - 1)
            b.push(task, 0, n - 1)
        elif op == "tx":
            got = deque()
            assert a.transmit_into(got) == len(got)
            assert list(got) == _transmit_loop(b)
        elif op == "done":
            for _ in range(min(n, a.in_flight)):
                assert a.complete() == b.complete()
        elif op == "reset":
            assert a.reset() == b.reset()
        else:
            a.c = b.c = n % 8 + 1
        assert (a.queued, a.in_flight, a.ranges, a.current, a.inflight()) == \
            (b.queued, b.in_flight, b.ranges, b.current, b.inflight())


def test_adjacent_ranges_merge_and_others_do_not():
    q = VHQ()
    q.push(1, 0, 9)
    q.push(1, 10, 19)           # continues the tail range
    assert q.ranges == 1 and q.queued == 20
    q.push(2, 0, 0)
    q.push(1, 20, 20)
    assert q.ranges == 3 and q.queued == 22


def test_bad_arguments():
    q = VHQ()
    with pytest.raises(ValueError):
        q.push(1, 5, 4)
    with pytest.raises(ValueError):
        q.push(1, -1, 4)
    for bad in (0, 4097, -3):
        with pytest.raises(ValueError):
            q.c = bad
        with pytest.raises(ValueError):
            VHQ(c=bad)
    with pytest.raises(RuntimeError):
        q.complete()
    assert q.queued == 0 and q.empty


def test_lowering_c_stops_transmission_until_drained():
    q = VHQ(c=4)
    q.push(1, 0, 9)
    sent = [q.transmit() for _ in range(4)]
    assert sent == [(1, 0), (1, 1), (1, 2), (1, 3)]
    q.c = 2
    assert q.transmit() is None
    q.complete()
    q.complete()
    assert q.transmit() is None               # 2 still in flight, c = 2
    q.complete()
    assert q.transmit() == (1, 4)
    q.complete()
    q.complete()
    assert q.in_flight == 0


def test_ring_grows_in_powers_of_two():
    q = VHQ(capacity=16)
    for t in range(1000):
        q.push(t, 0, 2)
    assert q.ranges == 1000 and q.queued == 3000
    assert q.capacity == 1024
    q.c = 64
    out = []
    while q.queued or q.in_flight:
        x = q.transmit()
        if x is None:
            q.complete()
        else:
            out.append(x)
    assert out == [(t, k) for t in range(1000) for k in range(3)]


def test_ring_grow_while_wrapped():
    q = VHQ(c=1, capacity=16)
    for t in range(10):
        q.push(t, 0, 0)
    for _ in range(8):
        q.transmit()
        q.complete()
    for t in range(10, 40):     # tail wraps, then grows
        q.push(t, 0, 0)
    out = []
    while (x := q.transmit()) is not None:
        out.append(x[0])
        q.complete()
    assert out == list(range(8, 40))


def test_reset_semantics():
    q = VHQ(c=3)
    assert q.reset() is None                  # nothing at all
    q.push(5, 0, 99)
    assert q.reset() == (5, -1, 0, 100)       # nothing sent: head task, last_sent -1
    assert q.queued == 0 and q.empty
    q.push(5, 40, 99)                          # restored from kernel 40
    assert q.reset() == (5, -1, 40, 60)
    q.push(5, 40, 99)
    for _ in range(3):
        q.transmit()
    assert q.complete() == (5, 40)
    assert q.reset() == (5, 42, 41, 57)
    assert reef_restore_point(42, 41, 3) == 41  # REEF's rule agrees with done
    assert q.queued == 0 and q.in_flight == 2 and q.transmit() is None
    # Old-epoch completions do not move the restored task's progress.
    q.push(5, 41, 99)
    assert q.transmit() == (5, 41)             # 2 stale + 1 new in flight (c = 3)
    assert q.complete() == (5, 41)             # stale (evicted or not)
    assert q.complete() == (5, 42)             # stale
    assert q.current == (5, 41, 41)
    assert q.reset() == (5, 41, 41, 58)
    assert q.reset() is None                   # only stale launches left in flight
    q.complete()
    assert q.empty


def test_reset_after_task_finished_reports_next_head():
    q = VHQ(c=2)
    q.push(1, 0, 1)
    q.push(2, 0, 4)
    for _ in range(2):
        q.transmit()
        q.complete()
    assert q.reset() == (2, -1, 0, 5)


@pytest.mark.parametrize("n", [10, 100, 1000, 10_000])
@pytest.mark.parametrize("layout", ["one_range", "many_ranges"])
def test_reset_drops_everything_queued(n, layout):
    q = VHQ(c=4)
    if layout == "one_range":
        q.push(1, 0, n + 1)
    else:
        q.push(1, 0, 1)
        for i in range(n):
            q.push(2 + (i % 2), i, i)           # alternating tasks: no merging
    q.transmit()
    q.transmit()
    ranges_before = q.ranges
    info = q.reset()
    assert info == (1, 1, 0, n)
    assert q.queued == 0 and q.ranges == 0 and q.in_flight == 2
    assert q.transmit() is None
    # The reset moved two indices: the ring kept its capacity, nothing was walked.
    assert ranges_before == (1 if layout == "one_range" else n)
    assert q.stats["resets"] == 1
    q.push(9, 0, 0)
    assert q.transmit() == (9, 0)


def test_interleaved_tasks_done_is_oldest_in_flight():
    q = VHQ(c=4)
    q.push(1, 0, 1)
    q.push(2, 0, 0)
    q.push(1, 2, 5)
    assert [q.transmit() for _ in range(4)] == [(1, 0), (1, 1), (2, 0), (1, 2)]
    assert q.current == (1, 2, 0)      # kernels 0 and 1 of task 1 are still in flight
    assert q.complete() == (1, 0)
    task, last_sent, done, dropped = q.reset()
    assert (task, last_sent, done, dropped) == (1, 2, 1, 3)
    assert reef_restore_point(last_sent, done, 4) == done == 1


def test_drain_nogil_matches_order():
    q = VHQ(c=3)
    q.push(1, 0, 9)
    q.push(2, 5, 7)
    out = q._drain_nogil(100)
    assert out == [(1, k) for k in range(10)] + [(2, k) for k in range(5, 8)]
    assert q.empty and q.stats["transmitted"] == 13 == q.stats["completed"]


@pytest.mark.parametrize("nogil", [False, True])
def test_concurrent_push_and_dispatch(nogil):
    """Scheduler thread pushes while a dispatcher thread transmits/completes."""
    q = VHQ(c=4)
    n_tasks, per = 400, 25
    got = []
    stop = threading.Event()

    def dispatcher():
        while True:
            if nogil:
                batch = q._drain_nogil(64)
                got.extend(batch)
                if not batch and stop.is_set() and q.empty:
                    return
            else:
                x = q.transmit()
                if x is not None:
                    got.append(x)
                    assert q.in_flight <= q.c
                elif q.in_flight:
                    q.complete()
                elif stop.is_set() and q.empty:
                    return

    th = threading.Thread(target=dispatcher)
    th.start()
    for t in range(n_tasks):
        for j in range(0, per, 5):
            q.push(t, j, j + 4)
    stop.set()
    th.join(timeout=60)
    assert not th.is_alive()
    assert got == [(t, k) for t in range(n_tasks) for k in range(per)]


small = st.one_of(st.integers(1, 3), st.integers(1, 40))


# -- state machine: any interleaving against a model queue and a model device ---------
class VHQMachine(RuleBasedStateMachine):
    """Model: a FIFO of launches, an in-order device. Before a reset every completion is an
    execution; launches still in flight at a reset may each execute or self-evict."""

    def __init__(self):
        super().__init__()
        self.q = VHQ(c=4)
        self.c = 4
        # the largest c in effect since nothing was last in flight (bounds what is in flight)
        self.c_peak = 4
        self.queue = deque()          # (task, kernel)
        self.inflight = deque()       # (task, kernel, epoch)
        self.epoch = 0
        self.ntasks = 0
        self.size = {}                # task -> total kernels
        self.pushed = {}              # task -> kernels pushed so far (0..pushed-1)
        self.executed = {}            # task -> set of kernels known to have run
        self.abandoned = set()
        self.restores = []            # (task, restore point) waiting to be pushed
        self.last_tx = {}             # task -> last transmitted kernel in this epoch
        self.cur_task = None          # last transmitted task in this epoch

    def _push(self, task, first, last):
        self.q.push(task, first, last)
        self.queue.extend((task, k) for k in range(first, last + 1))

    @rule(n=small, first_chunk=small)
    def new_task(self, n, first_chunk):
        t = self.ntasks
        self.ntasks += 1
        self.size[t] = n
        self.executed[t] = set()
        m = min(n, first_chunk)
        self.pushed[t] = m
        self._push(t, 0, m - 1)

    @rule(data=st.data(), chunk=small)
    def push_more(self, data, chunk):
        open_tasks = [t for t in self.size if t not in self.abandoned
                      and self.pushed[t] < self.size[t]
                      and not any(rt == t for rt, _ in self.restores)]
        if not open_tasks:
            return
        t = data.draw(st.sampled_from(open_tasks))
        first = self.pushed[t]
        last = min(self.size[t], first + chunk) - 1
        self.pushed[t] = last + 1
        self._push(t, first, last)

    @rule()
    def restore(self):
        for t, r in self.restores:
            if r < self.pushed[t]:
                self._push(t, r, self.pushed[t] - 1)
        self.restores = []

    @rule()
    def transmit(self):
        before = self.q.in_flight
        got = self.q.transmit()
        if before < self.c and self.queue:
            if not self.inflight or self.c > self.c_peak:
                self.c_peak = self.c
            task, k = self.queue.popleft()
            assert got == (task, k)
            assert self.q.in_flight == before + 1 <= self.c               # (a)
            assert self.last_tx.get(task, -1) < k                          # (b)
            self.last_tx[task] = k
            self.cur_task = task
            self.inflight.append((task, k, self.epoch))
        else:
            assert got is None

    @rule(executed=st.booleans())
    def complete(self, executed):
        if not self.inflight:
            with pytest.raises(RuntimeError):
                self.q.complete()
            return
        task, k, ep = self.inflight.popleft()
        assert self.q.complete() == (task, k)
        if not self.inflight:
            self.c_peak = self.c
        if ep == self.epoch or executed:
            self.executed[task].add(k)

    @rule(c=st.integers(1, 8))
    def set_c(self, c):
        self.q.c = c
        self.c = c
        if not self.inflight or c > self.c_peak:
            self.c_peak = c

    @rule()
    def reset(self):
        cur_inflight = [(t, k) for t, k, ep in self.inflight if ep == self.epoch]
        affected = {t for t, _ in cur_inflight} | {t for t, _ in self.queue}
        dropped = len(self.queue)
        info = self.q.reset()
        if not cur_inflight and not self.queue:
            assert info is None
        else:
            task, last_sent, done, n_dropped = info
            expected_task = self.cur_task if cur_inflight else self.queue[0][0]
            assert task == expected_task
            assert n_dropped == dropped
            assert last_sent == self.last_tx.get(task, -1)
            c = self.c_peak
            r = done  # the scheduler's restore point (observed) ...
            assert r == reef_restore_point(last_sent, done, c)  # ... is REEF's (inferred)
            if task not in self.abandoned:
                ex = self.executed[task]
                # (c) nothing before r may be skipped unless it certainly executed ...
                assert all(j in ex for j in range(r)), (r, sorted(ex))
                # ... and at most c+1 already-executed kernels run again (worst case:
                # every launch still in flight executed before it could self-evict).
                maybe = ex | {k for t, k in cur_inflight if t == task}
                assert sum(1 for j in maybe if j >= r) <= c + 1
                self.restores = [(rt, rr) for rt, rr in self.restores if rt != task]
                self.restores.append((task, r))
            self.abandoned |= affected - {task}
            self.restores = [(rt, rr) for rt, rr in self.restores if rt not in self.abandoned]
        self.queue.clear()
        self.epoch += 1
        self.last_tx = {}
        self.cur_task = None
        assert self.q.queued == 0 and self.q.ranges == 0                   # (d)
        assert self.q.transmit() is None or self.q.in_flight <= self.c

    @invariant()
    def matches_model(self):
        assert self.q.queued == len(self.queue)
        assert self.q.in_flight == len(self.inflight)
        assert self.q.inflight() == [(t, k) for t, k, _ in self.inflight]
        assert self.q.empty == (not self.queue and not self.inflight)
        assert self.q.c == self.c


VHQMachine.TestCase.settings = settings(max_examples=400, stateful_step_count=80, deadline=None)
TestVHQMachine = VHQMachine.TestCase
