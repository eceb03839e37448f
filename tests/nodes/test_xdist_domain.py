"""``make test``'s pytest-xdist workers each run in a ROS 2 domain of their own
(tests/conftest.py, docs/testing.md): a context initialised in a worker is in domain
``XDIST_DOMAIN_BASE + N`` for worker ``gwN``, and a node process a test starts inherits it.
In a serial run the caller's domain is kept. Run inside scripts/netns_run.sh."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

rclpy = pytest.importorskip("rclpy")

from tests.conftest import XDIST_DOMAIN_BASE  # noqa: E402


def _want() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        return XDIST_DOMAIN_BASE + int(worker[2:])
    return int(os.environ.get("ROS_DOMAIN_ID") or 0)


def test_a_context_here_is_in_the_worker_domain():
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    try:
        assert ctx.get_domain_id() == _want()
    finally:
        rclpy.shutdown(context=ctx)


def test_a_child_process_inherits_the_domain():
    code = ("import rclpy\nctx = rclpy.Context()\nrclpy.init(context=ctx)\n"
            "print(ctx.get_domain_id())\nrclpy.shutdown(context=ctx)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert int(out.split()[-1]) == _want()
