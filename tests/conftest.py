"""Shared fixtures."""

from __future__ import annotations

import os

import pytest

from av_infer.kernels.cuda_compile import find_nvcc


@pytest.fixture(scope="session")
def nvcc() -> str:
    """nvcc's path. CUDA sources must compile in CI (CI=true): a missing nvcc fails there;
    on a machine without the toolkit the compile tests skip with the reason."""
    path = find_nvcc()
    if path is None:
        msg = "nvcc not found (set AV_INFER_NVCC or install the CUDA toolkit)"
        if os.environ.get("CI"):
            pytest.fail(msg + ": CI must compile every CUDA source")
        pytest.skip(msg)
    return path
