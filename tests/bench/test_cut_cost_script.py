"""``scripts/cut_cost.py``: what cutting a model costs, as the cpu device measures it
(docs/cpu_engine.md, "What a cut costs"); its rows and what the default budget keeps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_script_measures_each_target_and_says_what_the_budget_keeps():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "cut_cost.py"),
                          "densenet201", "--segment-ms", "0.1,1000", "--budget-s", "0.05",
                          "--json", "-"], cwd=ROOT, check=True, capture_output=True,
                         text=True)
    doc = json.loads(out.stdout)  # the text table went to stderr
    assert doc["kind"] == "cut_cost" and doc["max_cut_cost"] == 0.05
    cut, whole = doc["rows"]
    assert cut["model"] == "densenet201" and cut["segment_ms"] == 0.1
    assert cut["segments"] >= 2 and 1 <= cut["segments_kept"] <= cut["segments"]
    assert cut["per_cut"] == cut["cut_cost"] / (cut["segments"] - 1)
    # a target longer than the model: nothing cut, nothing measured
    assert whole["segments"] == 1 and whole["cut_cost"] == 0.0 and whole["per_cut"] is None
    assert "densenet201" in out.stderr and "per cut" in out.stderr
