"""The CUDA dispatcher's task table (av_infer/_cy/cuda_dispatch.pyx): slots are reclaimed.

Issue 16, defect 2: the table kept a tombstone for every unregistered task, so once task
ids had cycled through it every lookup (register, unregister, and the nogil loop's lookup
per launch and completion) scanned all its slots. These tests assert the table's shape
through ``Dispatcher.table_stats()`` (capacity, live entries, longest probe run), never
timing; scripts/dispatch_slots_cost.py measures the cost.
"""

from __future__ import annotations

import random

import pytest

from av_infer.devices.cuda import availability
from tests.checks import require

EMU_OK, EMU_WHY = availability(emulate=True)
GEOM = b"\0" * 28  # one kernel's 7 geometry words


@pytest.fixture
def disp():
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer._cy.cuda_dispatch import Dispatcher

    from av_infer.devices.cuda_emu.driver import build_driver

    return Dispatcher(str(build_driver()))


def _register(disp, task: int) -> None:
    disp.register_task(task, [0], GEOM, b"\0" * 16, [0])


def test_table_stays_bounded_after_100k_register_unregister(disp):
    resident = [1 << 40 | i for i in range(8)]  # tasks that stay registered throughout
    for t in resident:
        _register(disp, t)
    start = disp.table_stats()
    for t in range(100_000):
        _register(disp, t)
        assert disp.unregister_task(t)
    st = disp.table_stats()
    assert st["live"] == len(resident)
    assert st["capacity"] == start["capacity"]
    # every lookup ends within a few slots (a tombstone table scans all of them)
    assert st["max_probe"] <= 4, st
    for t in resident:  # still found (set_padded raises KeyError for an unknown task)
        disp.set_padded(t, 0, 1, GEOM, b"")  # never launched
    assert disp.clear_padded(resident[0]) == 1


def test_table_agrees_with_a_set_under_random_churn(disp):
    """Backward-shift deletion keeps every live entry findable and no dead one, through
    growth, colliding ids and removals from the middle of probe runs."""
    rng = random.Random(7)
    live: set[int] = set()
    peak = 0
    for step in range(20_000):
        target = 600 if (step // 4000) % 2 == 0 else 20
        if live and (len(live) > target or rng.random() < 0.35):
            t = rng.choice(sorted(live)) if step % 5 else min(live)
            assert disp.unregister_task(t)
            live.discard(t)
        else:
            t = rng.randrange(1 << 16) * 1024  # ids that share low bits
            _register(disp, t)
            live.add(t)
        peak = max(peak, len(live))
        if step % 2000 == 1999:
            assert disp.table_stats()["live"] == len(live)
            for x in live:
                disp.set_padded(x, 0, 0, GEOM, b"")
            for x in rng.sample(range(1 << 16), 200):
                if x * 1024 + 1 not in live:
                    with pytest.raises(KeyError):
                        disp.set_padded(x * 1024 + 1, 0, 0, GEOM, b"")
    st = disp.table_stats()
    assert st["capacity"] <= 4 * peak  # grows with the peak of live tasks, not with churn
    for t in list(live):
        assert disp.unregister_task(t)
    assert disp.table_stats()["live"] == 0


def test_register_rejects_negative_ids(disp):
    with pytest.raises(ValueError):
        _register(disp, -1)
