"""The benchmark's PNGs exist, are non-empty and have the documented pixel size."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np

from av_infer.bench import plots


def _check(path) -> None:
    assert path.is_file() and path.stat().st_size > 1000
    img = mpimg.imread(path)
    assert img.shape[1] == plots.PIXELS[0] and img.shape[0] == plots.PIXELS[1]
    assert np.ptp(img[..., :3]) > 0  # something was drawn


def _section(rt: float, be: float) -> dict:
    return {"rt": {"throughput_rps": rt}, "be": {"throughput_rps": be}}


def test_cdf_throughput_timeline_sweep(tmp_path) -> None:
    rng = np.random.default_rng(0)
    _check(plots.latency_cdf({"rt_only": rng.uniform(10, 11, 100),
                              "streams": rng.uniform(12, 30, 100)}, tmp_path / "cdf.png"))
    _check(plots.throughput_bars({"rt_only": _section(100, 0), "reef": _section(100, 60)},
                                 tmp_path / "tp.png"))
    tl = plots.Timeline(t_preempt=1.0, window=(0.999, 1.001), policy="reef", kernels=[
        (1, 7, 3, True, 0.9992, 0.9996, False), (1, 7, 4, False, 1.00001, 1.00002, False),
        (0, 9, 0, True, 1.00003, 1.0006, True)])
    _check(plots.timeline(tl, tmp_path / "tl.png"))
    _check(plots.timeline(None, tmp_path / "none.png"))
    res = [{"preemption_latency_us": {"p50": 10.0 * c, "p99": 20.0 * c},
            "be": {"throughput_rps": 50.0 + c}} for c in (1, 2, 4, 8)]
    _check(plots.sweep_plot([1, 2, 4, 8], res, tmp_path / "sweep.png"))
