"""Shared set-up of the QoS tests: a two-variant group on the simulator whose ``full``
variant is ``factor`` times slower than ``fast`` (the same plan, its sim profile scaled),
so expected latencies are known exactly in virtual time."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from av_infer import Runtime
from av_infer.model import zoo
from av_infer.profiles import derive_profile

SHAPES = {"input": (1, 3, 16, 16)}


def x(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input": rng.standard_normal(SHAPES["input"]).astype(np.float32)}


def slow_profile(rt: Runtime, name: str, factor: float) -> Any:
    plan = rt.device.compile(str(zoo.path("dynamic_cnn")), SHAPES, name=name)
    prof = derive_profile(plan, rt.device.gpu)
    prof.kernels = [replace(k, duration_us=k.duration_us * factor) for k in prof.kernels]
    return prof


def group_runtime(factor: float = 20.0, **kw: Any) -> Runtime:
    """Models ``full`` (slow) and ``fast`` (dynamic_cnn); ``max_be_streams=1``."""
    kw.setdefault("max_be_streams", 1)
    rt = Runtime("sim", **kw)
    src = zoo.path("dynamic_cnn")
    rt.load_model("full", src, SHAPES, profile=slow_profile(rt, "full", factor))
    rt.load_model("fast", src, SHAPES)
    return rt


def latency_of(rt: Runtime, model: str) -> float:
    """Standalone latency of one request (runs the device until idle)."""
    f = rt.submit(model, x(), client="probe")
    rt.device.run()
    return f.result().timings.latency
