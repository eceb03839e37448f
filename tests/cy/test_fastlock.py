"""``FastLock`` (``_cy/fastlock.pyx``) behaves as ``threading.Lock`` where the cpu lanes use
it: mutual exclusion, non-blocking and timed acquires, errors, ``with``, and a blocked
acquirer waits without the GIL (else the holder could never run to release it)."""

from __future__ import annotations

import threading

import pytest
from av_infer._cy.fastlock import FastLock


def test_acquire_release_and_errors_as_threading_lock():
    for lk in (FastLock(), threading.Lock()):
        assert not lk.locked()
        assert lk.acquire() is True and lk.locked()
        assert lk.acquire(False) is False
        assert lk.acquire(True, 0.01) is False
        lk.release()
        assert not lk.locked()
        with pytest.raises(RuntimeError):
            lk.release()
        with lk:
            assert lk.locked()
        assert not lk.locked()
        assert lk.acquire(timeout=1.0) is True
        lk.release()


def test_release_if_locked_is_an_idempotent_signal():
    ev = FastLock()
    assert ev.release_if_locked() is False
    ev.acquire()
    assert ev.release_if_locked() is True and not ev.locked()
    assert ev.release_if_locked() is False


def test_mutual_exclusion_under_threads():
    lk, box = FastLock(), {"n": 0, "inside": 0, "overlap": False}

    def work():
        for _ in range(5000):
            lk.acquire()
            try:
                box["inside"] += 1
                if box["inside"] != 1:
                    box["overlap"] = True
                box["n"] += 1
                box["inside"] -= 1
            finally:
                lk.release()

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert box == {"n": 20000, "inside": 0, "overlap": False}


def test_a_blocked_acquirer_leaves_the_gil_to_the_holder():
    lk = FastLock()
    lk.acquire()
    entered, got = threading.Event(), threading.Event()

    def waiter():
        entered.set()
        lk.acquire()  # blocks: must not keep the GIL
        got.set()
        lk.release()

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    assert entered.wait(60)
    total = sum(i * i for i in range(200000))  # the holder runs Python meanwhile
    assert total > 0 and not got.is_set()
    lk.release()
    assert got.wait(60)
    t.join(60)


@pytest.mark.parametrize("make", [FastLock, threading.Lock])
def test_bad_timeouts_are_refused_as_threading_lock_refuses_them(make):
    lk = make()
    with pytest.raises(OverflowError):
        lk.acquire(True, 1e300)
    with pytest.raises(ValueError):
        lk.acquire(False, 1.0)
    with pytest.raises(ValueError):
        lk.acquire(True, -2.0)
    assert not lk.locked()


def test_thread_ident_is_the_threading_module_s_id_on_every_thread():
    from av_infer._cy.fastlock import thread_ident

    seen = {}

    def record():
        seen["thread"] = (thread_ident(), threading.get_ident())

    th = threading.Thread(target=record)
    th.start()
    th.join()
    assert thread_ident() == threading.get_ident()
    assert seen["thread"][0] == seen["thread"][1] != thread_ident()
