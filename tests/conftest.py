"""Shared fixtures."""

from __future__ import annotations

import gc
import os

import pytest

# DDS never leaves the machine: `make test` runs the suite in a fresh network namespace
# (scripts/netns_run.sh); a bare `pytest` still keeps ROS 2 discovery on loopback.
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")

from threadpoolctl import threadpool_limits

from av_infer.kernels.cuda_compile import find_nvcc
from tests.checks import require

#: ROS 2 domain of pytest-xdist worker gwN: XDIST_DOMAIN_BASE + N.
XDIST_DOMAIN_BASE = 40


def _worker_domain() -> None:
    """``make test`` runs the suite in pytest-xdist workers (``-n 2``), all in one network
    namespace: each worker gets a ROS 2 domain of its own, so one worker's nodes, topics
    and services are never discovered by the other's. Set here, before any test module
    imports rclpy and before any context is initialised (rcl reads ``ROS_DOMAIN_ID`` at
    init); the node processes tests start (``NodeProcess``) inherit it with the
    environment. A serial run keeps the caller's domain."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        os.environ["ROS_DOMAIN_ID"] = str(XDIST_DOMAIN_BASE + int(worker[2:]))


_worker_domain()


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to test old code: a compiled module (av_infer/_cy/compiled.py) whose build is
    older than its .py or .pxd would be imported instead of the edited source."""
    from av_infer._cy.compiled import stale
    old = stale()
    if old:
        raise pytest.UsageError(
            f"built extension older than its source: {', '.join(old)}; rebuild with "
            "`make build` (or `.venv/bin/python setup.py build_ext --inplace`)")


@pytest.fixture(scope="session", autouse=True)
def one_blas_thread():
    """The whole session at one BLAS thread, the count the cpu device runs the numpy
    engine at (``CpuDevice(blas_threads=1)``, applied while a device runs). Tests compare
    the device's outputs bit for bit with references computed outside any device, and
    OpenBLAS's sums depend on its thread count on some CPUs: on the 2026-11-25 VM host (an
    AMD EPYC driven by OpenBLAS's Haswell kernels) resnet152's logits differ in the 6th
    digit between 2 threads and 1, so the golden tests failed there while the device was
    right."""
    with threadpool_limits(1, user_api="blas"):
        yield


@pytest.fixture(scope="session")
def nvcc() -> str:
    """nvcc's path. CUDA sources must compile in CI (CI=true): a missing nvcc fails there;
    on a machine without the toolkit the compile tests skip with the reason."""
    return require(find_nvcc(), "nvcc not found (set AV_INFER_NVCC or install the CUDA toolkit)")


@pytest.fixture(autouse=True)
def unfrozen_gc():
    """A runtime host node freezes the process's objects at activation (``gc_freeze``);
    in this shared process the next test starts with them collectable again."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


@pytest.fixture
def scheduler_never_errs(caplog):
    """A scheduler handler that raised is a bug where no test injects one: fail loudly
    (``pytestmark = pytest.mark.usefixtures("scheduler_never_errs")``)."""
    yield
    bad = [r.getMessage() for r in caplog.records if r.getMessage().startswith("scheduler:")]
    assert not bad, bad

