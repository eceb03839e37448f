"""The one small interface between the scheduler and a device (cpu, sim, cuda).

The split follows REEF-N (REEF §4.4): the *scheduler* decides what runs (modes, EDF,
preemption, restore points); the *device* owns streams, one virtual host queue (vHQ) in
front of each, and a dispatcher that moves launches from a vHQ to its stream keeping at most
``c`` kernels in flight. Devices never make scheduling decisions; the scheduler never
touches a device's internals.

Designed for the CUDA device first: there the dispatcher is a Cython thread that drains the
vHQs and calls ``cuLaunchKernel`` without the GIL, so everything the dispatcher needs per
launch is plain integers in the vHQ ring ``(task id, kernel index)``; argument arrays are
packed per task at ``new_task`` time. ``set_preempt`` is a device-memory write
(``cuStreamWriteValue32`` on a dedicated high-priority stream on CUDA). Every compiled
kernel checks its stream's flag word first and returns at once when it is set (lazy
eviction), so preempting never waits for queued work, only for blocks already running.

Threading contract:
* ``enqueue``/``reset``/``set_preempt``/``set_capacity`` are called by the scheduler
  (from one thread at a time) and return without waiting for the device.
* ``on_complete`` (given to ``start``) is called once per transmitted launch, in stream
  order, from a device thread (cpu, cuda) or from inside the simulator's event loop (sim).
  It must not block. Started with ``coalesce=True`` (devices that ``coalesce``), one call
  may stand for several consecutive launches (``Completion.count``).
* ``now()`` is the clock every timestamp uses (wall time, or virtual time in the sim).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from av_infer._cy.vhq import MAX_C
from av_infer.devices.completion import Completion
from av_infer.devices.faults import FaultInjector
from av_infer.model.plan import Plan


@dataclass(frozen=True, slots=True)
class ResetInfo:
    """What ``Device.reset`` reports for restore-from-c (all kernel indices of ``task``).

    ``last_sent`` is k_l, the last kernel transmitted to the stream (-1 if none);
    ``done`` is the number of leading kernels whose completion was observed; ``dropped``
    how many queued launches the reset discarded (reclaimed in the background). The
    scheduler restores from ``done`` (or its own later count of executed completions):
    with at most c launches in flight, in order, that is REEF's ``max(done, k_l - c)``,
    observed rather than inferred.

    Protocol: reset a stream *before* raising its preemption flag, so every completion
    counted in ``done`` really executed.
    """

    task: int
    last_sent: int
    done: int
    dropped: int
    #: a launch of the stream is executing now (None: the device cannot tell): preemption
    #: latency is measured only where BE was running (docs/design.md, Metrics)
    running: bool | None = None
    #: padded launches the reset dropped, in queue order, each ``(task, kernel, parts)``
    #: with the BE ``parts`` as in ``Completion.parts``: those blocks never ran, and the
    #: device has forgotten them (the scheduler rewinds the BE cursors from this; it keeps
    #: no copy of which BE parts ride in which launch)
    dropped_parts: tuple[tuple[int, int, tuple[tuple[int, int, int, int, int], ...]], ...] = ()


CompletionCallback = Callable[[Completion], None]


class Device(ABC):
    """Base class: names every hook and every capability once; backends fill them.

    Capabilities are class attributes declared here with their defaults (``virtual``,
    ``max_capacity``, ``supports_padding``, ``be_beside_rt``, ``sms``), so the layers above
    read them directly and never probe a device with ``getattr``."""

    name: str = "device"
    #: The clock is virtual (the simulator): events run inside :meth:`run`, so the runtime
    #: drives the device from the caller's thread (deterministic) instead of wall-clock
    #: threads. One declaration read once, by ``Runtime``.
    virtual: bool = False
    #: Largest per-stream capacity c (launches in flight) the device accepts: the one range
    #: ``1..max_capacity`` every layer checks before anything changes (the vHQ's in-flight
    #: ring by default; the CUDA dispatcher's event ring is smaller). The ``wait`` policy's
    #: unbounded BE streams use it.
    max_capacity: int = MAX_C
    #: Streaming multiprocessors DKP counts padding slots on (0: not a GPU).
    sms: int = 0
    #: Plan precisions (``Plan.precision``: fp32 | tf32 | fp16) this device runs; the one
    #: list ``Runtime.load_model`` checks a requested precision against.
    precisions: tuple[str, ...] = ("fp32",)
    #: ``start(on_complete, coalesce=True)`` is accepted: the device may then report
    #: consecutive launches of one task on one stream in one record (``Completion.count``),
    #: so the consumer's Python runs once per batch instead of once per kernel (a batch
    #: forms when the consumer falls behind). The engine asks for it; consumers that read
    #: one record per kernel (tests, ``bench.gpu_bench``) start without it and get exactly
    #: that. Devices without it never coalesce.
    coalesces: bool = False
    #: Streams are numbered from 0; priority: higher number = more urgent (RT streams use
    #: the device's highest priority, BE streams its lowest).

    # -- clock ---------------------------------------------------------------------------
    @abstractmethod
    def now(self) -> float:
        """Seconds on this device's clock (monotonic; virtual in the simulator)."""

    # -- models and tasks ----------------------------------------------------------------
    def compile(self, source: Any, input_shapes: Any = None, name: str | None = None,
                whole: bool = False) -> Plan:
        """Compile an ONNX model (path, bytes or ModelProto) into the plan this device
        runs best. Default: av_infer's kernel compiler (``model.compiler``). ``whole``: run
        the model as one launch where the device's engine can (the cpu device's ORT
        segments; RT models, which are never preempted, lose nothing by it); kernel plans
        ignore it. Pure: nothing is loaded. Raises ModelLoadError and its subclasses."""
        from av_infer.model.compiler import compile_model

        return compile_model(source, input_shapes, name=name)

    def compile_key(self, whole: bool = False) -> dict[str, Any]:
        """What of this device, beyond its class and name, decides the plan ``compile``
        returns (JSON-able; the on-disk plan cache keys by it, ``model.plan_store``).
        Kernel plans depend on the model alone: nothing. A device whose ``compile`` reads
        its settings or measures the machine says so here."""
        return {}

    @abstractmethod
    def load_plan(self, plan: Plan) -> Any:
        """Make the plan's weights resident; returns an opaque handle. Compiles kernels."""

    @abstractmethod
    def unload_plan(self, handle: Any) -> None:
        """Free the plan's resident weights (its tasks must be released first)."""

    @abstractmethod
    def resident_bytes(self, handle: Any) -> int:
        """Bytes of device memory the loaded plan holds (weights), measured, not guessed."""

    @abstractmethod
    def new_task(self, handle: Any, task: int) -> None:
        """Allocate the task's activation arena and pack its launch arguments."""

    @abstractmethod
    def release_task(self, task: int) -> None:
        """Free a task's arena. Its launches must have completed or been reset."""

    @abstractmethod
    def write_inputs(self, task: int, inputs: dict[str, np.ndarray]) -> None:
        """Copy validated inputs into the buffers the task's first kernels read."""

    @abstractmethod
    def read_outputs(self, task: int) -> dict[str, np.ndarray]:
        """Copy the task's outputs out (fresh host arrays the caller owns)."""

    # -- streams, vHQs, preemption -------------------------------------------------------
    @abstractmethod
    def open_stream(self, priority: int) -> int:
        """Create a stream with its vHQ; returns its id."""

    @abstractmethod
    def enqueue(self, stream: int, task: int, first: int, last: int,
                wake: bool = True) -> None:
        """Append launches of kernels ``first..last`` (inclusive) of ``task`` to the vHQ.

        ``wake=False``: the caller's thread is about to run them itself (``run_pending``),
        so a device whose launches run on host threads need not wake its worker for them
        (on a VM a cross-core wake-up costs the waker tens of microseconds). Others ignore
        it."""

    @abstractmethod
    def reset(self, stream: int) -> ResetInfo | None:
        """Drop every queued (not yet transmitted) launch in O(1); None if the vHQ is idle.

        Launches already transmitted (at most c) stay on the stream: they complete or
        evict themselves if the stream's flag is set.
        """

    @abstractmethod
    def set_preempt(self, stream: int, flag: bool) -> None:
        """Write the stream's preemption flag word."""

    @abstractmethod
    def set_capacity(self, c: int) -> None:
        """At most ``c`` launches in flight per stream from now on (REEF's DQ capacity)."""

    def set_quiet(self, stream: int, windows: Sequence[tuple[float, float]]) -> None:
        """Hold launches of ``stream`` whose kernel would run into one of ``windows``
        (``(start, end)`` device times of predicted RT arrivals, ``sched.rt_forecast``)
        until that window ends, unless the stream's flag is up. Default: no gating (a
        device that cannot time kernels ignores it; nothing else depends on it)."""
        return None

    # -- lifecycle -----------------------------------------------------------------------
    @abstractmethod
    def start(self, on_complete: CompletionCallback) -> None:
        """Start dispatching; completions are reported through ``on_complete``. A device
        that ``coalesces`` also takes ``coalesce: bool = False`` (see there)."""

    @abstractmethod
    def close(self) -> None:
        """Stop dispatching and free everything. Idempotent."""

    # -- optional ------------------------------------------------------------------------
    # set_stream_capacity(stream, c): per-stream device-queue capacity. The scheduler's
    # "wait" policy (REEF §7.3 wait-based baseline) lets BE streams transmit without the c
    # bound; devices that cannot do it raise NotImplementedError and "wait" runs with c.
    # Implemented by cpu; sim and cuda should implement it too.
    def set_stream_capacity(self, stream: int, c: int) -> None:
        """At most ``c`` launches in flight on ``stream`` (overrides ``set_capacity``)."""
        raise NotImplementedError(f"{self.name} has no per-stream capacity")

    # enqueue_padded(stream, task, kernel, parts): dynamic kernel padding (REEF §5). One
    # launch of RT kernel ``kernel`` of ``task`` that also runs blocks
    # ``first_block .. first_block + n_blocks - 1`` of each BE part ``(task, kernel,
    # first_block, n_blocks, blocks_per_sm)`` on the SMs the RT kernel leaves free, at most
    # ``blocks_per_sm`` of them per SM (the occupancy selection chose); it completes (one
    # Completion, ``parts`` set) when every block did. On CUDA this is a generated
    # dispatcher kernel: blocks below the RT kernel's block count call the RT kernel's
    # ``__device__`` body with their block index, the rest call the BE bodies by block
    # range (offset by ``first_block``), with one proxy per occupancy level so the
    # dispatcher does not lower the RT kernel's occupancy (REEF §5.1). Returns False when
    # the device queued the kernel unpadded instead (the BE parts did not run; CUDA does
    # this while the padded module for these plans compiles). Devices that cannot pad at
    # all set ``supports_padding = False`` and say why in ``padding_reason``.
    supports_padding: bool = False
    padding_reason: str = "this device has no padded launches"
    #: Padding without padded launches (the CPU): how many BE streams may keep running
    #: beside one RT task because they take nothing from it (cores the RT task does not use,
    #: BE at a lower OS priority: DKP's rules 1 and 2 enforced by the OS scheduler). Under a
    #: padding policy the scheduler preempts only the BE streams beyond this; 0 elsewhere.
    be_beside_rt: int = 0
    #: RT tasks that may run side by side, each at its standalone speed: 1 on a GPU (REEF
    #: runs one RT task at a time; its kernels already fill the device), one per group of
    #: cores a task uses on the CPU. The scheduler starts up to this many RT requests (EDF
    #: order) on RT streams of their own; BE beside them keeps what is left
    #: (``be_beside_rt`` less ``rt_task_cores`` per further RT task).
    rt_parallel: int = 1
    #: cores one RT task occupies (the CPU: its intra-op threads); only read where
    #: ``rt_parallel`` > 1
    rt_task_cores: int = 1
    #: The device's C-level table (docs/request_path.md section 2): an object whose
    #: ``new_task``/``write_inputs``/``enqueue``/``run_pending``/``release_task``/
    #: ``read_outputs`` are this device's own, which the compiled scheduler (and the
    #: driver's helping caller) call as C methods; today the cpu device's lane engine
    #: (``CpuDevice.lane_engine``). None: they call the device's methods. Read once, when
    #: the scheduler is built.
    lane_engine: Any = None

    def enqueue_padded(self, stream: int, task: int, kernel: int,
                       parts: Sequence[tuple[int, int, int, int, int]]) -> bool:
        """Append one padded launch of ``kernel`` of ``task`` to the stream's vHQ."""
        raise NotImplementedError(f"{self.name}: {self.padding_reason}")

    # run_pending(stream, until): "helping" (caller-runs). A thread about to block on a
    # request's result runs the stream's transmitted launches itself, in stream order, while
    # no other thread runs that stream, until ``until()`` is true or none are left; returns
    # whether it ran any. Saves the two thread hand-offs of a request on devices whose
    # launches run on host threads (cpu). Devices whose launches run elsewhere return False.
    def run_pending(self, stream: int, until: Callable[[], bool]) -> bool:
        """Run queued launches of ``stream`` on the calling thread (see above)."""
        return False

    #: Test hook of the reliability suite (``devices.faults``): None in production. Devices
    #: call ``faults.check(point, model, kernel)`` at the hook points listed there.
    faults: FaultInjector | None = None

    def inject_faults(self) -> FaultInjector:
        """The device's fault injector, created on first use (tests only)."""
        if self.faults is None:
            self.faults = FaultInjector()
        return self.faults

    # set_profile / profile_of: kernel profiles (profiles.ModelProfile) drive padding
    # selection and the simulator's timing. Devices without profiles ignore them.
    def set_profile(self, plan_name: str, profile: Any) -> None:
        """Use ``profile`` for the plan called ``plan_name`` (default: ignored)."""
        return None

    def profile_of(self, handle: Any) -> Any | None:
        """The kernel profile of a loaded plan, if the device has one (default: None)."""
        return None

    def run(self) -> None:
        """Virtual devices: run every pending event (drains the work). Others: nothing."""
        return None

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        """Virtual devices: run ``fn()`` at device time ``t`` inside :meth:`run` (the
        driver's timer). Wall-clock devices do not need it (the driver has a thread)."""
        raise NotImplementedError(f"{self.name} has no virtual clock")

    def telemetry(self) -> dict[str, Any]:
        """Device facts for diagnostics (name, memory, utilisation, clocks)."""
        return {"device": self.name}
