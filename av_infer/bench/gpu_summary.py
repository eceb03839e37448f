"""``gpu_summary.json``: the figures other tools read from one ``scripts/gpu_check.sh`` run.

The shape is issue 30 item 7's, exactly::

    {"gpu", "commit",
     "models": [{"model", "precision", "ours_ms", "torch_eager_ms", "torch_graphs_ms", "ok"}],
     "launch_host_us",
     "preemption_us": {"p50", "p99", "n"},
     "peer": [{"workload", "precision", "avi": {"rt_p50_ms", "rt_p99_ms", "be_rps"},
               "torch_prio": {...}, "torch_rt_alone": {...}}]}

Sources in ``$OUT``: ``gpu_vendor.json`` (``bench.gpu_vendor``: models, median ms, and
``launch_host_us`` = wall µs per launched vendor op on the tiny-GEMM chain) and
``peer_torch.json`` (``{"runs": [...]}`` of ``bench --peer torch`` reports; the first run
whose avi measured preemptions gives ``preemption_us``). ``peer`` rows and
``preemption_us`` come from the runs with av_infer under ``reef`` (the product's policy,
and a row's shape has no policy key); runs under another policy (the GPU script's
``prio_streams`` run) stay in ``peer_torch.json`` only. A missing source leaves its keys
empty (``[]`` / None); the summary is always written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["build_summary", "main"]


def _read(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def build_summary(out_dir: Path, gpu: str | None, commit: str | None) -> dict[str, Any]:
    from av_infer.bench.peer_torch import summary_row

    vend = _read(out_dir / "gpu_vendor.json") or {}
    peer = _read(out_dir / "peer_torch.json") or {}
    models = [{"model": r.get("model"), "precision": r.get("precision"),
               "ours_ms": r.get("ours_ms"), "torch_eager_ms": r.get("torch_eager_ms"),
               "torch_graphs_ms": r.get("torch_graphs_ms"), "ok": bool(r.get("ok"))}
              for r in vend.get("models", [])]
    hc = (vend.get("host_cost") or {}).get("vendor") or {}
    # the rows' shape names no policy and no RT graphs: the prio_streams run and the
    # RT-as-one-graph run (``--rt-graphs``) stay in peer_torch.json
    runs = [r for r in peer.get("runs", []) if isinstance(r, dict)
            and (r.get("config") or {}).get("policy", "reef") == "reef"
            and not (r.get("config") or {}).get("rt_graphs")]
    pre: dict[str, Any] = {"p50": None, "p99": None, "n": 0}
    for r in runs:
        p = (r.get("avi") or {}).get("preemption_us") or {}
        if p.get("n"):
            pre = {"p50": p.get("p50"), "p99": p.get("p99"), "n": p.get("n")}
            break
    return {"gpu": gpu, "commit": commit, "models": models,
            "launch_host_us": hc.get("wall_us_per_op"), "preemption_us": pre,
            "peer": [summary_row(r) for r in runs]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the folder with gpu_vendor.json / peer_torch.json")
    ap.add_argument("--gpu", default=None)
    ap.add_argument("--commit", default=None)
    a = ap.parse_args(argv)
    out = Path(a.out)
    doc = build_summary(out, a.gpu, a.commit)
    (out / "gpu_summary.json").write_text(json.dumps(doc, indent=1))
    print(f"gpu_summary: {len(doc['models'])} model rows, {len(doc['peer'])} peer rows, "
          f"launch_host_us {doc['launch_host_us']}, preemption_us {doc['preemption_us']}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
