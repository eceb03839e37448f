"""Shared fixtures."""

from __future__ import annotations

import pytest

from av_infer.kernels.cuda_compile import find_nvcc
from tests.checks import require


@pytest.fixture(scope="session")
def nvcc() -> str:
    """nvcc's path. CUDA sources must compile in CI (CI=true): a missing nvcc fails there;
    on a machine without the toolkit the compile tests skip with the reason."""
    return require(find_nvcc(), "nvcc not found (set AV_INFER_NVCC or install the CUDA toolkit)")
