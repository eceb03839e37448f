"""The simulator's block placement rule (Cython ``SmPool``): breadth-first over SMs."""

from __future__ import annotations

import pytest
from av_infer._cy.sim_core import SmPool

U = 1 << 20


def test_one_block_per_sm_first_then_rounds() -> None:
    pool = SmPool(4, U)
    alloc, n, d, f = pool.place(U // 2, 3, None, 0.5)  # fewer blocks than SMs
    assert alloc == [(0, 1), (1, 1), (2, 1)] and n == 3 and d == 1 and f == 0.0
    assert pool.free_total == 4 * U - 3 * (U // 2)
    # 6 more: SM 3 has room for 2, SMs 0-2 for 1 each: the lowest level holding 6 is 2
    alloc2, n2, d2, f2 = pool.place(U // 2, 6, None, 0.25)
    assert n2 == 5 and sorted(alloc2) == [(0, 1), (1, 1), (2, 1), (3, 2)] and d2 == 2
    assert f2 == pytest.approx(3 * 0.5)  # three blocks landed beside a 0.5-pressure block
    assert pool.place(U // 2, 1, None, 0.0) is None  # full
    pool.release(alloc2, U // 2, 0.25)
    pool.release(alloc, U // 2, 0.5)
    assert pool.free_total == 4 * U and pool.max_free() == U
    assert all(pool.press_of(i) == pytest.approx(0.0) for i in range(4))


def test_order_restricts_and_orders_the_sms() -> None:
    pool = SmPool(4, U)
    alloc, n, _, _ = pool.place(U, 2, [3, 2], 0.0)
    assert alloc == [(3, 1), (2, 1)] and n == 2
    assert pool.free_of(3) == 0 and pool.free_of(0) == U


def test_rounds_spread_evenly_when_blocks_exceed_sms() -> None:
    pool = SmPool(3, U)
    alloc, n, d, _ = pool.place(U // 4, 7, None, 0.0)  # 7 blocks, 4 fit per SM
    assert n == 7 and d == 3 and [b for _, b in alloc] == [3, 2, 2]


def test_bad_pool_is_refused() -> None:
    with pytest.raises(ValueError):
        SmPool(0, U)
