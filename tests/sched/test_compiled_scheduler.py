"""The scheduler runs compiled (scheduler.py with scheduler.pxd, request.py with request.pxd,
its driver, driver.py with driver.pxd: Cython's pure-Python mode)
and, where no build exists, interpreted from the same source: both must decide alike.

Checked on the simulator's DISB runs (every workload and the recorded trace, five
policies, the three ``issue13`` configurations of ``bench.sim_speed``): each
run's digest covers every request record (all times, preemption and padding counts), the
preemptions and the event counts, so one differing decision anywhere differs the digest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from av_infer import latency
from av_infer._cy.compiled import PURE_MODULES, is_compiled, stale
from av_infer.bench.sim_speed import _digests
from av_infer.sched import driver, request, scheduler

ROOT = Path(__file__).resolve().parents[2]
SECONDS = "0.2"
CONFIGS = ["issue13"]


def test_the_suite_runs_the_compiled_scheduler() -> None:
    """``make test`` builds it (setup.py); a stale build is refused at start (conftest)."""
    import importlib

    assert {"latency", "devices.completion", "sched.request", "sched.scheduler",
            "sched.driver"} <= set(PURE_MODULES)
    for mod in PURE_MODULES:  # every listed module, built and current
        m = importlib.import_module(f"av_infer.{mod}")
        assert is_compiled(m), m.__file__
    assert is_compiled(latency) and is_compiled(scheduler), scheduler.__file__
    assert is_compiled(request) and is_compiled(driver), driver.__file__
    assert not stale()


def test_compiled_and_interpreted_scheduler_decide_alike(tmp_path: Path) -> None:
    out = tmp_path / "interpreted.json"
    code = ("import json, sys; import av_infer; "
            "from av_infer.sched import driver, request, scheduler; "
            "from av_infer._cy.compiled import is_compiled; "
            "from av_infer.bench.sim_speed import _digests; "
            "assert not is_compiled(scheduler), scheduler.__file__; "
            "assert not is_compiled(request), request.__file__; "
            "assert not is_compiled(driver), driver.__file__; "
            "import importlib; from av_infer._cy.compiled import PURE_MODULES; "
            "ms = [importlib.import_module('av_infer.' + m) for m in PURE_MODULES]; "
            "assert not any(is_compiled(m) for m in ms), [m.__file__ for m in ms]; "
            f"json.dump(_digests({SECONDS}, {CONFIGS!r}, 'interpreted'), "
            "open(sys.argv[1], 'w'))")
    env = {**os.environ, "AV_INFER_INTERPRETED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, text=True)
    mine = _digests(float(SECONDS), CONFIGS, "compiled")  # meanwhile, in this process
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    theirs = {k: tuple(v) for k, v in json.loads(out.read_text()).items()}
    assert len(mine) == 90 and sum(n for _, n in mine.values()) > 0
    differ = sorted(k for k in mine if mine[k] != theirs.get(k))
    assert not differ, differ
