"""Shared fixtures."""

from __future__ import annotations

import os

import pytest

# DDS never leaves the machine: `make test` runs the suite in a fresh network namespace
# (scripts/netns_run.sh); a bare `pytest` still keeps ROS 2 discovery on loopback.
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")

from av_infer.kernels.cuda_compile import find_nvcc
from tests.checks import require


@pytest.fixture(scope="session")
def nvcc() -> str:
    """nvcc's path. CUDA sources must compile in CI (CI=true): a missing nvcc fails there;
    on a machine without the toolkit the compile tests skip with the reason."""
    return require(find_nvcc(), "nvcc not found (set AV_INFER_NVCC or install the CUDA toolkit)")


@pytest.fixture
def scheduler_never_errs(caplog):
    """A scheduler handler that raised is a bug where no test injects one: fail loudly
    (``pytestmark = pytest.mark.usefixtures("scheduler_never_errs")``)."""
    yield
    bad = [r.getMessage() for r in caplog.records if r.getMessage().startswith("scheduler:")]
    assert not bad, bad
