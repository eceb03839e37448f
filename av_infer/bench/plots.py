"""PNG figures of a benchmark run (matplotlib, Agg backend; fixed pixel sizes).

Every figure is ``FIG_W x FIG_H`` inches at ``DPI``: ``PIXELS`` = (width, height) pixels,
never cropped (no ``bbox_inches="tight"``), so tests and reports can rely on the size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FIG_W, FIG_H, DPI = 9.0, 5.0, 100
PIXELS = (int(FIG_W * DPI), int(FIG_H * DPI))

_POLICY_COLORS = {
    "rt_only": "#000000", "seq": "#d62728", "streams": "#ff7f0e", "prio_streams": "#bcbd22",
    "wait": "#9467bd", "reef": "#2ca02c", "reef_dkp": "#17becf",
}


def _plt():  # noqa: ANN202 - matplotlib.pyplot module
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    _plt().close(fig)
    return path


def latency_cdf(latencies_ms: dict[str, Sequence[float]], path: str | Path,
                title: str = "RT latency CDF") -> Path:
    """One CDF line per policy of RT request latencies (ms), log x-axis when wide."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(FIG_W, FIG_H))
    lo, hi = np.inf, 0.0
    for pol, lat in latencies_ms.items():
        x = np.sort(np.asarray(lat, dtype=float))
        if x.size == 0:
            continue
        y = np.arange(1, x.size + 1) / x.size
        ref = pol == "rt_only"  # the reference: drawn dashed and wider, visible under others
        ax.step(x, y, where="post", label=f"{pol} (n={x.size})", color=_POLICY_COLORS.get(pol),
                lw=3.0 if ref else 1.6, ls="--" if ref else "-", zorder=3 if ref else 2)
        lo, hi = min(lo, float(x[0])), max(hi, float(x[-1]))
    if hi > 0 and np.isfinite(lo) and lo > 0 and hi / lo > 20:
        ax.set_xscale("log")
    ax.set_xlabel("RT latency (ms, completion - scheduled arrival)")
    ax.set_ylabel("fraction of RT requests")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.set_title(title)
    if latencies_ms:
        ax.legend(loc="lower right", fontsize=8)
    return _save(fig, path)


def throughput_bars(policies: dict[str, dict[str, Any]], path: str | Path,
                    title: str = "Throughput") -> Path:
    """Stacked bars per policy: RT and BE completed requests per second."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(FIG_W, FIG_H))
    names = list(policies)
    rt = [policies[n]["rt"].get("throughput_rps") or 0.0 for n in names]
    be = [policies[n]["be"].get("throughput_rps") or 0.0 for n in names]
    x = np.arange(len(names))
    ax.bar(x, rt, color="#d62728", label="RT")
    ax.bar(x, be, bottom=rt, color="#1f77b4", label="BE")
    for i, (a, b) in enumerate(zip(rt, be)):
        ax.text(i, a + b, f"{a + b:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, names)
    ax.set_ylabel("completed requests / s")
    ax.set_title(title)
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


@dataclass
class Timeline:
    """Kernel executions around one preemption (from the runtime's "kernel" events)."""

    t_preempt: float
    window: tuple[float, float]
    # (stream, task, kernel, executed, t_start, t_end, is_rt)
    kernels: list[tuple[int, int, int, bool | None, float, float, bool]] = field(
        default_factory=list)
    policy: str = ""


def timeline(tl: Timeline | None, path: str | Path, title: str = "") -> Path:
    """Stream lanes as rows; RT kernels red, BE kernels blue shades (one per task),
    evicted launches hatched; the preemption instant is the dashed line at t = 0."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(FIG_W, FIG_H))
    if tl is None or not tl.kernels:
        ax.text(0.5, 0.5, "no preemption observed", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return _save(fig, path)
    blues = plt.get_cmap("Blues")
    streams = sorted({k[0] for k in tl.kernels})
    lane = {s: i for i, s in enumerate(streams)}
    be_tasks = sorted({k[1] for k in tl.kernels if not k[6]})
    shade = {t: blues(0.45 + 0.5 * (i % 5) / 4) for i, t in enumerate(be_tasks)}
    t0 = tl.t_preempt
    for s, task, _k, executed, ts, te, is_rt in tl.kernels:
        color = "#d62728" if is_rt else shade[task]
        w = max((te - ts) * 1e6, 0.5)
        ax.broken_barh([((ts - t0) * 1e6, w)], (lane[s] - 0.4, 0.8), facecolors=color,
                       edgecolors="white" if executed is not False else "black",
                       linewidth=0.3, hatch=None if executed is not False else "////")
    ax.axvline(0.0, color="black", ls="--", lw=1.2, label="RT arrival / preemption")
    ax.set_yticks(range(len(streams)),
                  [f"stream {s}{' (RT)' if any(k[0] == s and k[6] for k in tl.kernels) else ''}"
                   for s in streams])
    ax.set_xlim((tl.window[0] - t0) * 1e6, (tl.window[1] - t0) * 1e6)
    ax.set_xlabel("time relative to the preemption (µs)")
    ax.set_title(title or f"{tl.policy}: kernels around one preemption "
                 "(red RT, blue BE, hatched = evicted)")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, path)


def sweep_plot(values: Sequence[float], results: Sequence[dict[str, Any]], path: str | Path,
               param: str = "c", title: str = "") -> Path:
    """REEF Fig. 15a: preemption latency (p50, p99) and BE throughput against ``param``."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(FIG_W, FIG_H))
    pre = [r.get("preemption_latency_us", {}) for r in results]
    p50 = [p.get("p50") or 0.0 for p in pre]
    p99 = [p.get("p99") or 0.0 for p in pre]
    ax.plot(values, p50, "o-", color="#d62728", label="preemption p50 (µs)")
    ax.plot(values, p99, "s--", color="#ff7f0e", label="preemption p99 (µs)")
    ax.set_xlabel(param)
    ax.set_ylabel("preemption latency (µs)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(values), [str(v) for v in values])
    ax2 = ax.twinx()
    be = [r["be"]["throughput_rps"] or 0.0 for r in results]
    ax2.plot(values, be, "^-", color="#1f77b4", label="BE throughput (req/s)")
    ax2.set_ylabel("BE throughput (req/s)")
    ax.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.set_title(title or f"reef: preemption latency and BE throughput vs {param}")
    return _save(fig, path)
