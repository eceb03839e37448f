"""Micro-benchmark of DKP selection (REEF Fig. 19a: 0.2-0.4 us per RT kernel).

Run: ``.venv/bin/python -m pytest tests/cy/test_bench_dkp.py --benchmark-enable``
(benchmarks are disabled by default; then this only checks the result is sane).
"""

from __future__ import annotations

import pytest
from av_infer._cy.dkp_select import Selector


@pytest.mark.parametrize("n", [1, 4, 8])
def test_select_cost(benchmark, n: int) -> None:  # type: ignore[no-untyped-def]
    sel = Selector(60, 16)
    for i in range(n):  # typical trace kernels: tens of us, 32-256 blocks, 4-10 per SM
        sel.set(i, 100 + i, 7, 40.0 + 10 * i, 64 + 32 * i, 6 + i % 4, i % 3, 60.0, 30.0)
    parts = benchmark(sel.select, 104.0, 32, 6)
    assert parts and all(p[3] > 0 for p in parts)
