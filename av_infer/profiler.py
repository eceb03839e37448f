"""Offline kernel profiler: per-kernel durations and occupancies of a plan on a device.

Why: padding selection (DKP rules 1 and 2, REEF §5.2) compares a BE kernel's duration and
occupancy with the RT kernel's; REEF measures them offline ("latency predictability",
§2.1). The result is a :class:`~av_infer.profiles.ModelProfile`, the one format the runtime
(``Runtime.load_model(profile=...)``), the simulator and the selection read; save it with
``ModelProfile.save`` (atomic) per model and device.

Per device:

* ``cuda``: median of ``repeats`` CUDA-event-timed runs of each kernel alone and the
  occupancy API's blocks per SM, through the small :class:`KernelTimer` protocol the CUDA
  device implements (``time_kernel``, ``occupancy``). A device lacking them raises
  NotImplementedError, which is reported, never papered over with an estimate.
* ``cpu``: measured wall time per kernel (median of ``repeats`` runs with
  :class:`~av_infer.kernels.cpu.CpuPlanRunner` on zero inputs), occupancy 1 (a kernel holds
  its worker lane whole).
* ``sim``: the simulator's own timing model: the plan's geometry through the occupancy
  calculator and roofline (:func:`~av_infer.profiles.derive_profile`) for the simulated GPU.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Protocol, runtime_checkable

import numpy as np

from av_infer.devices.cuda_profiling import profile_loaded
from av_infer.model.plan import Plan
from av_infer.profiles import GpuSpec, KernelProfile, ModelProfile, derive_profile, gpu_spec

__all__ = ["KernelTimer", "profile_loaded", "profile_plan"]


@runtime_checkable
class KernelTimer(Protocol):
    """What a GPU device offers the profiler (the CUDA device implements it)."""

    def time_kernel(self, handle: Any, k: int, repeats: int) -> float:
        """Median duration (µs) of kernel ``k`` of the loaded plan, alone, over ``repeats``
        event-timed launches (after a warm-up launch)."""

    def occupancy(self, handle: Any, k: int) -> int:
        """Resident blocks per SM of kernel ``k`` (the occupancy API)."""


def profile_plan(plan: Plan, device: Any = "sim", *, repeats: int = 5,
                 gpu: str | GpuSpec = "mi50") -> ModelProfile:
    """Profile ``plan`` on ``device`` (a name, ``"cpu"``/``"sim"``/``"cuda"``, or a Device).

    ``gpu`` is the simulated GPU for ``sim``. ``repeats`` >= 1 runs per kernel (median).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    name = device if isinstance(device, str) else getattr(device, "name", "")
    if name == "sim":
        spec = getattr(device, "gpu", None) if not isinstance(device, str) else None
        return derive_profile(plan, spec if isinstance(spec, GpuSpec) else gpu_spec(gpu))
    if name == "cpu":
        return _profile_cpu(plan, repeats)
    if isinstance(device, str):
        from av_infer.devices import make_device

        device = make_device(device)
    return _profile_gpu(plan, device, repeats)


def _profile_cpu(plan: Plan, repeats: int) -> ModelProfile:
    """Wall time of each numpy kernel, median of ``repeats`` whole-plan runs."""
    from av_infer.kernels.cpu import CpuPlanRunner

    runner = CpuPlanRunner(plan)
    arena = runner.new_arena()
    runner.write_inputs(arena, {n: np.zeros(shape, dtype=dt)
                                for n, (shape, dt) in plan.input_spec().items()})
    calls = runner.bind(arena)
    samples: list[list[float]] = [[] for _ in calls]
    for fn in calls:  # warm-up: first touch of weights and arena pages
        fn()
    clock = time.perf_counter
    for _ in range(repeats):
        for i, fn in enumerate(calls):
            t0 = clock()
            fn()
            samples[i].append((clock() - t0) * 1e6)
    kernels = [
        KernelProfile(index=k.index, name=k.name, duration_us=statistics.median(samples[i]),
                      blocks=k.geometry.blocks, threads=k.geometry.threads,
                      regs=k.geometry.regs, smem=k.geometry.smem, blocks_per_sm=1)
        for i, k in enumerate(plan.kernels)
    ]
    return ModelProfile(model=plan.name, device="cpu", sms=1, kernels=kernels)


def _profile_gpu(plan: Plan, device: Any, repeats: int) -> ModelProfile:
    """Load ``plan`` on a :class:`KernelTimer` device, profile it, unload it."""
    if getattr(device, "time_kernel", None) is None or getattr(device, "occupancy", None) is None:
        raise NotImplementedError(
            f"device {getattr(device, 'name', device)!r} cannot time kernels "
            "(needs time_kernel and occupancy)")
    handle = device.load_plan(plan)
    try:
        return profile_loaded(plan, device, handle, repeats)
    finally:
        device.unload_plan(handle)
