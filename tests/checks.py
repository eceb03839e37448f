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
