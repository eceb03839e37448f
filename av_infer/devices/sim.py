"""A simulated GPU in virtual time: the real scheduler on a model of SMs, streams and queues.

Why: timing behaviour (preemption latency, interference, restore cost) must be testable
deterministically on any machine, and what-if studies need GPUs nobody here has. The
simulator models *time* only; it never stands in for numeric results (``read_outputs``
returns zeros) nor for a claim about real hardware (docs/design.md, "sim").

The model, per launch (a ``(task, kernel)`` of a stream):

1. The scheduler pushes launches into the stream's vHQ (the Cython ``VHQ`` the CUDA device
   uses). The dispatcher transmits while fewer than ``c`` are in flight; a transmitted
   launch reaches the stream's device queue ``gpu.launch_us`` later.
2. Streams are in order: a launch becomes *ready* when it reached the device queue and the
   stream's previous launch completed.
3. Ready kernels place blocks on SMs whenever slots free up: higher stream priority first,
   then FIFO by ready time. An SM holds blocks while their resource units fit (one block
   costs ``1/blocks_per_sm`` of an SM, ``blocks_per_sm`` from the profile, clamped by the
   GPU's thread and block limits). Blocks go breadth-first in SM order, as a GPU's block
   dispatcher places them: one per SM from SM 0 (skipping full SMs), then a second round;
   so concurrent kernels share the low SMs. A placed batch ends together. Running blocks
   cannot be killed (NVIDIA).
4. Block time = ``duration_us / waves`` at the density the kernel has alone, so a kernel
   alone on the GPU takes its profiled duration. Sharing an SM slows blocks down per the
   packing model of :func:`profiles.packing`: a batch whose most packed SM holds ``d`` of
   its blocks, placed where other blocks already exert pressure ``F`` (block-weighted mean;
   each resident block adds its kernel's packing-curve slope, e.g. ~0.54 for a vgg conv),
   runs ``max(1, curve(d) + interference*F) / curve(d_alone)`` times its block time. This
   is what makes plain concurrent streams slow RT work down (REEF Fig. 11: GPUStreams);
   blocks already running are not re-timed when others arrive (a snapshot at placement).
5. Lazy eviction: blocks read their stream's preemption flag when they *start*. A kernel
   whose blocks start under a set flag exits (``gpu.evict_us`` per kernel, not per block)
   and completes with ``executed=False``; blocks already running finish.

6. Padded launches (:meth:`SimDevice.enqueue_padded`, DKP) are one grid, as on CUDA
   (docs/cuda.md, "DKP on CUDA"): RT blocks first, then each BE part's, all at the grid's
   one occupancy (the most demanding part's: one block size, one ``__launch_bounds__``
   proxy), placed by the same breadth-first rule as any grid, so BE blocks take whatever
   slots free up, on the RT kernel's SMs too, and can hold slots a later wave of RT blocks
   would have used. The RT kernel runs ``1 + gpu.pad_overhead`` times longer (the
   dispatcher; REEF's figure), or ``1 + overhead`` of its model from a measured pad model
   (``pad``, :mod:`devices.sim_pad`; off by default). The launch completes, once, when its
   last block did.
   ``dkp_placement="reserved"`` is the what-if the simulator used before issue 13 and
   CUDA cannot do: RT blocks packed on the first SMs (REEF's ``cu_partition``), BE parts
   on the others from the last one down, at most their chosen occupancy per SM.
8. Quiet windows (:meth:`SimDevice.set_quiet`, ``sched.rt_forecast``): a stream's next
   launch waits in its device queue while its kernel (profiled duration x
   ``QUIET_MARGIN``) would overlap a predicted RT arrival, until the window ends or the
   stream's flag goes up (then it starts and evicts itself).
7. Memory-side contention (``contention``, :mod:`devices.sim_contention`): a batch also
   slows down by the DRAM bandwidth other resident kernels hold ("none" by default here;
   the benchmark harness uses "calibrated").
9. Host work (``host``, :mod:`devices.sim_host`; off by default): a started request's
   launches are transmitted only once its host start work (``start_us + per_kernel_us x
   kernels``) is done, on one FIFO host that also spends ``complete_us`` per kernel
   completion; a stream's launches still land in transmit order.

Everything happens inside :meth:`SimDevice.run` (the event loop); callbacks scheduled with
:meth:`SimDevice.call_at` (request arrivals, the runtime's handlers) run inline, so a run
with the same inputs and seed gives the same timeline.

Where the code is: points 1-8 (streams, the event loop, placement, eviction, padding,
quiet windows, contention) are ``SimCore`` in ``av_infer/_cy/sim_core.pyx``, which
``SimDevice`` extends with what is per plan and per task (loading, profiles, outputs,
telemetry). Issue 13 moved the model there from this file, operation for operation, for
speed; ``python -m av_infer.bench.sim_speed --equivalence OLD_SIM_PY`` checks that every
request of a set of benchmark runs comes out the same as with an older ``sim.py``.

Fault hook points (``devices.faults``): ``"kernel"`` when a launch starts on its stream (it
still takes its modelled time; its task's ``read_outputs`` raises DeviceFaultError),
``"load"``/``"oom"`` in ``load_plan`` (ModelLoadError / ModelTooLargeError). ``"lane"``
does not apply: the simulator has no host threads to die.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from av_infer._cy.sim_core import QUIET_MARGIN, SimCore, U
from av_infer.devices import sim_contention, sim_host, sim_pad
from av_infer.devices.base import Device
from av_infer.errors import DeviceFaultError
from av_infer.model.plan import Plan
from av_infer.profiles import (
    GpuSpec,
    KernelProfile,
    ModelProfile,
    check_profiles_gpu,
    derive_profile,
    gpu_spec,
    load_profile_dir,
    packing,
)

__all__ = ["DKP_PLACEMENTS", "QUIET_MARGIN", "SimDevice", "SimPlan", "kernel_consts"]

#: Resource units of one SM; a block of a kernel with occupancy b costs ``_U // b``.
_U = U

#: Per-kernel simulation constants: (blocks, cost units per block, block time alone in
#: seconds, pressure of one block on its SM, packing curve relative to one block per SM,
#: curve value at the density the kernel has alone).
KConsts = tuple[int, int, float, float, tuple[float, ...], float]

#: One timeline entry: (stream, task, kernel, t_start, t_end, executed, blocks started).
TimelineEntry = tuple[int, int, int, float, float, bool, int]

#: Where the blocks of a padded launch go (see the module docstring, point 6).
DKP_PLACEMENTS = ("faithful", "reserved")


@dataclass
class SimPlan:
    """Handle of a loaded plan: the plan, its profile and per-kernel simulation constants."""

    plan: Plan
    profile: ModelProfile
    resident: int
    #: per kernel, see :func:`kernel_consts`
    consts: list[KConsts]
    #: per kernel ``(q, q / footprint)``: its memory share alone and per resident block
    #: (:mod:`devices.sim_contention`); empty without a contention model
    mem: list[tuple[float, float]] | None = None
    #: per kernel its profiled duration alone, seconds (quiet windows)
    dur_s: list[float] | None = None
    #: time factor of its RT blocks in a padded launch (:mod:`devices.sim_pad`); None:
    #: the device's ``1 + gpu.pad_overhead``
    pad_factor: float | None = None


class SimDevice(SimCore, Device):
    """Discrete-event GPU model implementing :class:`Device` in virtual seconds.

    The device model is inherited from ``SimCore`` (``av_infer/_cy/sim_core.pyx``):
    ``now``, ``call_at``, ``run``, ``idle``, ``open_stream``, ``enqueue``, ``reset``,
    ``set_preempt``, ``set_quiet``, ``set_capacity``,
    ``set_stream_capacity``, ``start``, ``close``, ``residency``, ``timeline`` and the
    ``stats`` counters are its.
    """

    name = "sim"
    virtual = True
    supports_padding = True
    padding_reason = ""

    def __init__(
        self,
        gpu: str | GpuSpec = "mi50",
        profiles: dict[str, ModelProfile] | str | os.PathLike[str] | None = None,
        seed: int = 0,
        *,
        c: int = 4,
        flag_us: float = 1.0,
        interference: float = 1.0,
        jitter: float = 0.0,
        record: bool = False,
        contention: str = "none",
        dkp_placement: str = "faithful",
        record_residency: bool = False,
        host: str | sim_host.HostModel | None = None,
        pad: str | sim_pad.PadModel | None = None,
    ) -> None:
        """``flag_us``: latency of the flag write (a stream memory op); ``jitter``: relative
        standard deviation of block times (0: exact profile), drawn from ``seed``;
        ``contention``: a model of :data:`sim_contention.MODELS`, ``beta=X`` or a
        parameter file fitted to GPU measurements (``FILE.json``, docs/sim_fidelity.md);
        ``profiles``: per plan name, the profile it is timed with, or a directory / bundle
        file of measured profiles (``profiles.load_profile_dir``; refused if measured on
        another GPU); plans without one get a profile derived from their geometry;
        ``dkp_placement``: one of
        :data:`DKP_PLACEMENTS` ("reserved" is a what-if CUDA cannot do);
        ``record_residency``: keep every block batch's ``[start, end)`` per stream
        (:meth:`residency`, what the benchmark's preemption latency is measured from);
        ``host``: the host model (point 9; None/"none": off, a :class:`sim_host.HostModel`
        or a parameter file ``FILE.json`` from ``av-infer bench --refit-host``);
        ``pad``: what a padded launch costs the RT kernel per model (point 6; None/"none"/
        "paper": ``gpu.pad_overhead``, a :class:`sim_pad.PadModel` or a parameter file
        ``FILE.json`` from ``av-infer bench --refit-pad``).
        ValueError for an unknown name, before anything is set up."""
        self._beta = sim_contention.check_model(contention, gpu)
        self._host = sim_host.check_host(host, gpu)
        self._pad = sim_pad.check_pad(pad, gpu)
        self.pad = pad
        self.host = host
        self._host_free = 0.0  # host model: when the host has done all it was asked
        if dkp_placement not in DKP_PLACEMENTS:
            raise ValueError(f"unknown dkp_placement {dkp_placement!r}; choose one of "
                             f"{', '.join(DKP_PLACEMENTS)}")
        self.contention = contention
        self.dkp_placement = dkp_placement
        self.gpu = gpu_spec(gpu)
        if isinstance(profiles, (str, os.PathLike)):
            loaded = load_profile_dir(profiles)
            check_profiles_gpu(loaded, gpu, str(profiles))
            profiles = loaded
        self.profiles = dict(profiles or {})
        self.seed = seed
        self.interference = interference
        self.jitter = jitter
        self.sms = self.gpu.sms  # Device.sms: DKP slots
        self._setup(self.gpu.sms, c, flag_us * 1e-6, self.gpu.launch_us * 1e-6,
                    self.gpu.evict_us * 1e-6, interference, jitter, random.Random(seed),
                    self.gpu.pad_overhead, dkp_placement == "reserved", record,
                    record_residency)

    # -- models and tasks ----------------------------------------------------------------
    def load_plan(self, plan: Plan) -> SimPlan:
        if self.faults is not None:
            self.faults.check_load(plan.name, self.name)
        prof = self.profiles.get(plan.name) or derive_profile(plan, self.gpu)
        if len(prof.kernels) != len(plan.kernels):
            raise ValueError(
                f"profile of {plan.name!r} has {len(prof.kernels)} kernels, plan has "
                f"{len(plan.kernels)}"
            )
        consts = [kernel_consts(kp, self.gpu) for kp in prof.kernels]
        resident = plan.weight_bytes
        mem = None
        if self._beta is not None:
            qs = sim_contention.memory_shares(plan, [kp.duration_us for kp in prof.kernels],
                                              self.gpu.bandwidth_gbs, self._beta)
            mem = []
            for q, c in zip(qs, consts, strict=True):
                footprint = min(c[0], self.gpu.sms * max(1, _U // c[1]))
                mem.append((q, q / max(1, footprint)))
        pad = None if self._pad is None else self._pad.factor(plan.name, self.gpu)
        return SimPlan(plan=plan, profile=prof, resident=resident, consts=consts, mem=mem,
                       dur_s=[kp.duration_us * 1e-6 for kp in prof.kernels], pad_factor=pad)

    def set_profile(self, model: str, profile: ModelProfile) -> None:
        """Simulate plans named ``model`` with ``profile`` (loaded afterwards)."""
        self.profiles[model] = profile

    def profile_of(self, handle: Any) -> ModelProfile:
        """The profile a loaded plan is simulated with (what DKP selection should use)."""
        return handle.profile

    def unload_plan(self, handle: Any) -> None:
        for task, h in list(self._tasks.items()):
            if h is handle:
                raise RuntimeError(f"task {task} of {handle.plan.name!r} is not released")

    def resident_bytes(self, handle: Any) -> int:
        return int(handle.resident)

    def new_task(self, handle: Any, task: int) -> None:
        self._tasks[task] = handle
        self._failed.pop(task, None)
        if self._host is not None:  # its start work queues on the one host (point 9)
            done = max(self._t, self._host_free) + self._host.start_s(len(handle.consts))
            self._host_free = done
            self._set_host_ready(task, done)

    def release_task(self, task: int) -> None:
        self._tasks.pop(task, None)
        self._failed.pop(task, None)
        if self._host is not None:
            self._forget_host(task)

    def start(self, on_complete: Any) -> None:
        """Start dispatching; with a host model whose ``complete_us`` > 0 each completion
        also keeps the host busy that long (point 9)."""
        if self._host is None or self._host.complete_us <= 0:
            SimCore.start(self, on_complete)
            return
        cost = self._host.complete_us * 1e-6

        def completed(*args: Any, **kw: Any) -> Any:
            self._host_free = max(self._t, self._host_free) + cost
            return on_complete(*args, **kw)

        SimCore.start(self, completed)

    def write_inputs(self, task: int, inputs: dict[str, np.ndarray]) -> None:
        """Nothing to copy: the simulator models time, not values."""

    def read_outputs(self, task: int) -> dict[str, np.ndarray]:
        """Zero arrays of the output shapes: the simulator never produces numeric results."""
        plan = self._tasks[task].plan
        why = self._failed.get(task)
        if why is not None:
            raise DeviceFaultError(f"{why} ({plan.name} on the sim device)")
        return {n: np.zeros(shape, dtype=dt) for n, (shape, dt) in plan.output_spec().items()}

    # -- padded launches ----------------------------------------------------------------
    def enqueue_padded(self, stream: int, task: int, kernel: int,
                       parts: Sequence[tuple[int, int, int, int, int]]) -> bool:
        """One launch of ``kernel`` of ``task`` padded with BE block ranges (see Device)."""
        for p in parts:
            if p[0] not in self._tasks:
                raise ValueError(f"padding part {p}: unknown task {p[0]}")
            blocks = self._tasks[p[0]].consts[p[1]][0]
            if p[3] < 1 or p[2] < 0 or p[2] + p[3] > blocks or p[4] < 1:
                raise ValueError(f"padding part {p}: kernel has {blocks} blocks")
        if parts:
            self._set_pads(stream, (task, kernel), tuple(tuple(p) for p in parts))
        self.enqueue(stream, task, kernel, kernel)
        return True

    # -- lifecycle -----------------------------------------------------------------------
    def telemetry(self) -> dict[str, Any]:
        return {
            "device": self.name, "gpu": self.gpu.name, "sms": self.gpu.sms,
            "virtual_time_s": self._t, "contention": self.contention,
            "dkp_placement": self.dkp_placement,
            **({"host": sim_host.describe(self._host, self.gpu)} if self._host else {}),
            **({"pad": sim_pad.describe(self.pad, self.gpu)} if self._pad else {}),
            **self.stats,
            "streams": self.stream_states(),
        }


def kernel_consts(kp: KernelProfile, gpu: GpuSpec) -> KConsts:
    """Simulation constants of one kernel on ``gpu`` (see :func:`profiles.packing`)."""
    blocks, bps, block_s_us, curve, press, g_alone = packing(kp, gpu.sms, gpu)
    return (blocks, _U // bps, block_s_us * 1e-6, press, curve, g_alone)
