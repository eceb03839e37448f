"""Helpers shared by test modules: required tools and output comparison."""

from __future__ import annotations

import os

import numpy as np
import pytest


def require(found: str | None, what: str) -> str:
    """``found`` (a tool's path) or: fail under CI=true (CI must have it), skip elsewhere."""
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{what}: CI must have it")
        pytest.skip(what)
    return found


def compare_outputs(got: dict, want: dict, name: str, rtol: float, atol: float) -> None:
    """Same names, shapes and dtypes; ints/bools exact, floats within rtol/atol."""
    assert set(got) == set(want), name
    for k, w in want.items():
        g = got[k]
        assert g.shape == w.shape and g.dtype == w.dtype, (name, k, g.shape, w.shape, g.dtype)
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=f"{name}:{k}")
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{name}:{k}")


def be_bit_identical_under_rt(rt, x_be: dict, x_rt: dict, n_be: int, n_rt: int) -> None:
    """On a Runtime with models ``be`` and ``rt`` loaded: ``n_be`` BE requests submitted
    while a thread sends ``n_rt`` paced RT requests all equal the unpreempted BE result bit
    for bit. Bounded and paced: back-to-back RT starves BE under reef by design (a BE
    kernel never finishes between two RT requests when it is slower than the gap)."""
    import threading
    import time

    ref = rt.submit("be", x_be, client="be").result(timeout=120).outputs
    futs = [rt.submit("be", x_be, client="be") for _ in range(n_be)]

    def rt_load() -> None:
        for _ in range(n_rt):
            rt.submit("rt", x_rt, priority="RT").result(timeout=60)
            time.sleep(0.002)

    th = threading.Thread(target=rt_load)
    th.start()
    try:
        for f in futs:
            out = f.result(timeout=300).outputs
            for k in ref:
                assert np.array_equal(out[k], ref[k])
    finally:
        th.join()


def run_in_form(code: str, modules: tuple[str, ...], interpreted: bool) -> str:
    """Run ``code`` in a fresh interpreter with av_infer's built extensions, or with
    ``interpreted`` their ``.py`` sources (``AV_INFER_INTERPRETED=1``), after checking that
    each of ``modules`` (``av_infer.<name>``) runs in that form; its last stdout line (the
    compiled-vs-interpreted tests of the pure-Python-mode modules compare the two)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "AV_INFER_INTERPRETED"}
    if interpreted:
        env["AV_INFER_INTERPRETED"] = "1"
    check = "".join(
        f"import av_infer.{m} as _m; from av_infer._cy.compiled import is_compiled as _c\n"
        f"assert _c(_m) is {not interpreted}, _m.__file__\n" for m in modules)
    p = subprocess.run([sys.executable, "-c", check + code], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.strip().splitlines()[-1]
