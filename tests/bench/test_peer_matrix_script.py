"""``scripts/peer_matrix.py --table-only``: the table re-printed from a run's JSON names the
cpu device options each row ran with (docs/cpu_engine.md, "Kill or park")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "docs" / "peer_runs" / "2026-11-28"


def _table(folder: Path) -> list[str]:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "peer_matrix.py"),
                          "--table-only", "--out", str(folder)], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if ln.startswith("| ") and "---" not in ln][1:]


def test_the_table_names_each_rows_device_options():
    park = _table(RUNS / "park12")
    default = _table(RUNS / "default")
    assert len(park) == len(default) == 6
    assert all(" reef_dkp kill=False segment_ms=12 |" in row for row in park)
    assert all(" reef_dkp |" in row for row in default)
