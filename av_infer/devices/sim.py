"""A simulated GPU in virtual time: the real scheduler on a model of SMs, streams and queues.

Why: timing behaviour (preemption latency, interference, restore cost) must be testable
deterministically on any machine, and what-if studies need GPUs nobody here has. The
simulator models *time* only; it never stands in for numeric results (``read_outputs``
returns zeros) nor for a claim about real hardware (DESIGN.md, "sim").

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

6. Padded launches (:meth:`SimDevice.enqueue_padded`, DKP): the RT kernel keeps REEF's
   ``cu_partition`` (its blocks packed ``ceil(blocks / sms)`` per SM on the first SMs) and
   runs ``1 + gpu.pad_overhead`` times longer (the dispatcher); each BE part's blocks run
   on the other SMs, from the last one down, at most its chosen occupancy per SM, in as
   many rounds as needed. The launch completes, once, when its last block did.

Everything happens inside :meth:`SimDevice.run` (the event loop); callbacks scheduled with
:meth:`SimDevice.call_at` (request arrivals, the runtime's handlers) run inline, so a run
with the same inputs and seed gives the same timeline.

Fault hook points (``devices.faults``): ``"kernel"`` when a launch starts on its stream (it
still takes its modelled time; its task's ``read_outputs`` raises DeviceFaultError),
``"load"``/``"oom"`` in ``load_plan`` (ModelLoadError / ModelTooLargeError). ``"lane"``
does not apply: the simulator has no host threads to die.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from av_infer._cy.vhq import VHQ
from av_infer.devices.base import Completion, CompletionCallback, Device, ResetInfo
from av_infer.devices.faults import InjectedFault
from av_infer.errors import DeviceFaultError
from av_infer.model.plan import Plan
from av_infer.profiles import (
    GpuSpec,
    KernelProfile,
    ModelProfile,
    curve_at,
    derive_profile,
    gpu_spec,
    packing,
)

#: Resource units of one SM; a block of a kernel with occupancy b costs ``_U // b``.
_U = 1 << 20

#: Per-kernel simulation constants: (blocks, cost units per block, block time alone in
#: seconds, pressure of one block on its SM, packing curve relative to one block per SM,
#: curve value at the density the kernel has alone).
KConsts = tuple[int, int, float, float, tuple[float, ...], float]
#: the BE parts of a padded launch, each ``(task, kernel, first_block, n_blocks, occupancy)``
Parts = tuple[tuple[int, int, int, int, int], ...]

#: One timeline entry: (stream, task, kernel, t_start, t_end, executed, blocks started).
TimelineEntry = tuple[int, int, int, float, float, bool, int]


@dataclass
class SimPlan:
    """Handle of a loaded plan: the plan, its profile and per-kernel simulation constants."""

    plan: Plan
    profile: ModelProfile
    resident: int
    #: per kernel, see :func:`kernel_consts`
    consts: list[KConsts]


class _Stream:
    __slots__ = ("id", "priority", "vhq", "devq", "cur", "flag", "used", "pads")

    def __init__(self, sid: int, priority: int, c: int) -> None:
        self.id = sid
        self.priority = priority
        self.vhq = VHQ(c)
        #: arrived, not yet started launches: (task, kernel, padding parts)
        self.devq: deque[tuple[int, int, Parts]] = deque()
        self.cur: _KRun | None = None  # the launch the stream is executing (in order)
        self.flag = False  # preemption flag as the SMs see it
        self.used = 0  # resource units held by this stream's running blocks
        #: the padding of launches still queued in the vHQ, (task, kernel) -> BE parts, in
        #: queue order: the one place a padded launch's parts live until it is transmitted
        #: (then they travel with the launch: arrival, ``devq``, ``_KRun.done_parts``)
        self.pads: dict[tuple[int, int], Parts] = {}


class _KRun:
    """One launch on the device, from ready to completion."""

    __slots__ = (
        "stream", "task", "kernel", "seq", "t_ready", "pending", "running", "cost",
        "block_s", "t_start", "evicted", "started", "evict_until", "press", "curve",
        "g_alone", "order", "parts", "parent", "first_block", "done_parts",
    )

    def __init__(self, stream: _Stream, task: int, kernel: int, seq: int, t: float,
                 c: KConsts) -> None:
        self.stream = stream
        self.task = task
        self.kernel = kernel
        self.seq = seq
        self.t_ready = t
        self.pending, self.cost, self.block_s, self.press, self.curve, self.g_alone = c
        self.running = 0
        self.t_start = math.nan
        self.evicted = False
        self.started = 0
        self.evict_until = 0.0
        self.order: list[int] | None = None  # SMs it may use, in placement order
        self.parts: list[_KRun] = []  # padding parts still running (padded RT launch)
        self.parent: _KRun | None = None  # padding part: the padded launch it belongs to
        self.first_block = 0
        self.done_parts: Parts = ()


class SimDevice(Device):
    """Discrete-event GPU model implementing :class:`Device` in virtual seconds."""

    name = "sim"
    virtual = True
    supports_padding = True
    padding_reason = ""

    def __init__(
        self,
        gpu: str | GpuSpec = "mi50",
        profiles: dict[str, ModelProfile] | None = None,
        seed: int = 0,
        *,
        c: int = 4,
        flag_us: float = 1.0,
        interference: float = 1.0,
        jitter: float = 0.0,
        record: bool = False,
    ) -> None:
        """``flag_us``: latency of the flag write (a stream memory op); ``jitter``: relative
        standard deviation of block times (0: exact profile), drawn from ``seed``."""
        self.gpu = gpu_spec(gpu)
        self.profiles = dict(profiles or {})
        self.seed = seed
        self.flag_s = flag_us * 1e-6
        self.launch_s = self.gpu.launch_us * 1e-6
        self.evict_s = self.gpu.evict_us * 1e-6
        self.interference = interference
        self.jitter = jitter
        self._rng = random.Random(seed)
        self._c = c
        self._t = 0.0
        self._seq = 0
        self._events: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._streams: list[_Stream] = []
        self._tasks: dict[int, SimPlan] = {}
        self._failed: dict[int, str] = {}  # task -> why a launch of it failed (faults)
        self._ready: list[_KRun] = []  # kernels with blocks still to place
        self.sms = self.gpu.sms  # Device.sms: DKP slots
        self._free = [_U] * self.gpu.sms
        self._free_total = _U * self.gpu.sms
        self._press = [0.0] * self.gpu.sms  # pressure of the blocks resident on each SM
        self._order = list(range(self.gpu.sms))
        self._rev_order = self._order[::-1]
        self._on_complete: CompletionCallback | None = None
        self._closed = False
        self.timeline: list[TimelineEntry] | None = [] if record else None
        self.stats = {"events": 0, "batches": 0, "kernels": 0, "evicted": 0, "busy_s": 0.0,
                      "padded_launches": 0, "padded_blocks": 0, "pad_tail_s": 0.0}

    # -- clock and event loop ------------------------------------------------------------
    def now(self) -> float:
        return self._t

    def _at(self, t: float, fn: Callable[[Any], None], arg: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, fn, arg))

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn()`` at virtual time ``t`` (not before now) inside :meth:`run`."""
        self._at(max(t, self._t), _call0, fn)

    def run(self, until: float | None = None) -> None:
        """Process events in time order (ties: insertion order) until none are left or
        ``until``; the clock then stands at ``until`` (if given)."""
        ev = self._events
        pop = heapq.heappop
        n = 0
        while ev and (until is None or ev[0][0] <= until):
            t, _, fn, arg = pop(ev)
            self._t = t
            fn(arg)
            if self._ready:
                self._schedule()
            n += 1
        self.stats["events"] += n
        if until is not None and until > self._t:
            self._t = until

    def idle(self) -> bool:
        """No event pending: nothing in flight, nothing scheduled."""
        return not self._events

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
        return SimPlan(plan=plan, profile=prof, resident=resident, consts=consts)

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

    def release_task(self, task: int) -> None:
        self._tasks.pop(task, None)
        self._failed.pop(task, None)

    def write_inputs(self, task: int, inputs: dict[str, np.ndarray]) -> None:
        """Nothing to copy: the simulator models time, not values."""

    def read_outputs(self, task: int) -> dict[str, np.ndarray]:
        """Zero arrays of the output shapes: the simulator never produces numeric results."""
        plan = self._tasks[task].plan
        why = self._failed.get(task)
        if why is not None:
            raise DeviceFaultError(f"{why} ({plan.name} on the sim device)")
        return {n: np.zeros(shape, dtype=dt) for n, (shape, dt) in plan.output_spec().items()}

    # -- streams, vHQs, preemption -------------------------------------------------------
    def open_stream(self, priority: int) -> int:
        s = _Stream(len(self._streams), priority, self._c)
        self._streams.append(s)
        return s.id

    def enqueue(self, stream: int, task: int, first: int, last: int,
                wake: bool = True) -> None:
        s = self._streams[stream]
        s.vhq.push(task, first, last)
        self._pump(s)

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
            self._streams[stream].pads[(task, kernel)] = tuple(
                tuple(p) for p in parts)  # type: ignore[misc]
        self.enqueue(stream, task, kernel, kernel)
        return True

    def reset(self, stream: int) -> ResetInfo | None:
        s = self._streams[stream]
        r = s.vhq.reset()
        # every queued launch is dropped, and with it its padding (the stream's one table)
        dropped = tuple((t, k, parts) for (t, k), parts in s.pads.items())
        s.pads.clear()
        if r is None:
            return None
        return ResetInfo(*r, restore_c=s.vhq.restore_c, dropped_parts=dropped)

    def in_flight(self, stream: int) -> int:
        return self._streams[stream].vhq.in_flight

    def set_preempt(self, stream: int, flag: bool) -> None:
        """The flag write lands ``flag_us`` from now (a stream memory operation)."""
        self._at(self._t + self.flag_s, self._on_flag, (self._streams[stream], bool(flag)))

    def set_capacity(self, c: int) -> None:
        self._c = c
        for s in self._streams:
            s.vhq.c = c
            self._pump(s)

    def set_stream_capacity(self, stream: int, c: int) -> None:
        """Per-stream capacity (the ``wait`` baseline transmits BE work unbounded)."""
        s = self._streams[stream]
        s.vhq.c = c
        self._pump(s)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, on_complete: CompletionCallback) -> None:
        self._on_complete = on_complete

    def close(self) -> None:
        self._closed = True
        self._events.clear()
        self._ready.clear()

    def telemetry(self) -> dict[str, Any]:
        return {
            "device": self.name, "gpu": self.gpu.name, "sms": self.gpu.sms,
            "virtual_time_s": self._t, **self.stats,
        }

    # -- the device model ------------------------------------------------------------------
    def _pump(self, s: _Stream) -> None:
        """The dispatcher: transmit while the vHQ allows; launches land after launch_us."""
        if self._closed:
            return
        t = self._t + self.launch_s
        pads = s.pads
        while (x := s.vhq.transmit()) is not None:
            parts = pads.pop(x, ()) if pads else ()
            self._at(t, self._on_arrive, (s, x[0], x[1], parts))

    def _on_flag(self, arg: tuple[_Stream, bool]) -> None:
        arg[0].flag = arg[1]

    def _on_arrive(self, arg: tuple[_Stream, int, int, Parts]) -> None:
        s, task, kernel, parts = arg
        s.devq.append((task, kernel, parts))
        if s.cur is None:
            self._start_head(s)

    def _start_head(self, s: _Stream) -> None:
        task, kernel, parts = s.devq.popleft()
        self._seq += 1
        h = self._tasks[task]
        if self.faults is not None:
            try:
                self.faults.check("kernel", h.plan.name, kernel)
            except InjectedFault as e:
                self._failed.setdefault(task, f"kernel {kernel} failed: {e}")
        k = _KRun(s, task, kernel, self._seq, self._t, h.consts[kernel])
        s.cur = k
        self._ready.append(k)
        if parts:
            self._start_padding(k, parts)

    def _start_padding(self, k: _KRun, parts: Parts) -> None:
        """A padded launch: the RT kernel pays the dispatcher's overhead and its BE parts
        become block groups of the same launch, placed from the last SM down."""
        k.block_s *= 1.0 + self.gpu.pad_overhead
        self.stats["padded_launches"] += 1
        sms = self.gpu.sms
        layers = math.ceil(k.pending / sms)  # REEF's cu_partition: RT keeps whole SMs
        cu_rt = min(sms, math.ceil(k.pending / layers))
        k.order = self._order[:cu_rt]
        be_order = self._rev_order[: sms - cu_rt] or self._rev_order
        k.done_parts = parts
        for task, kernel, first, n, occ in parts:
            h = self._tasks.get(task)
            if h is None:  # released meanwhile (answered, aborted): nothing to run
                continue
            self._seq += 1
            c = h.consts[kernel]
            kb = _KRun(k.stream, task, kernel, self._seq, self._t, c)
            kb.pending = n
            kb.cost = max(kb.cost, _U // max(1, occ))  # at most `occ` per SM
            kb.order = be_order
            kb.parent = k
            kb.first_block = first
            k.parts.append(kb)
            self._ready.append(kb)
            self.stats["padded_blocks"] += n

    def _schedule(self) -> None:
        """Place blocks of ready kernels: higher priority first, then FIFO by ready time."""
        ready = self._ready
        if len(ready) > 1:
            ready.sort(key=_prio)
        i = 0
        while i < len(ready):
            k = ready[i]
            if k.stream.flag:
                if max(self._free) >= k.cost:  # a block reaches an SM and reads the flag
                    ready.pop(i)
                    self._evict(k)
                    continue
            elif self._free_total >= k.cost:
                self._place(k)
                if k.pending == 0:
                    ready.pop(i)
                    continue
            i += 1

    def _evict(self, k: _KRun) -> None:
        k.evicted = True
        k.pending = 0
        if k.started == 0:
            k.t_start = self._t
        k.evict_until = self._t + self.evict_s
        if k.running == 0:
            self._at(k.evict_until, self._finish, k)

    def _place(self, k: _KRun) -> None:
        """Start as many of ``k``'s pending blocks as fit, breadth-first over the SMs.

        As a GPU's block dispatcher does: one block per SM in SM order (skipping full SMs),
        then a second round, and so on, so concurrent kernels share the low SMs and slow
        each other per their packing curves. A padded launch (``k.order``) keeps its RT
        blocks on its first SMs and its BE parts on the others, filled from the last
        SM down: the CUs the padded RT kernel leaves free (REEF Fig. 9's CU partition).
        """
        free = self._free
        cost = k.cost
        want = k.pending
        order = k.order if k.order is not None else self._order
        n_sm = len(order)
        alloc: list[tuple[int, int]] = []
        n = 0
        if want <= n_sm:  # one block on each of the first `want` SMs with room
            for i in order:
                if free[i] >= cost:
                    alloc.append((i, 1))
                    n += 1
                    if n == want:
                        break
            if n < want and any(free[i] >= 2 * cost for i, _ in alloc):
                alloc = []  # fewer SMs with room than blocks: rounds below
                n = 0
        if not alloc:
            fits = [free[i] // cost for i in order]
            total = sum(fits)
            if total == 0:
                return
            if want >= total:
                alloc = [(i, f) for i, f in zip(order, fits, strict=True) if f]
                n = total
            else:  # rounds of one block per SM: the lowest level L that holds `want`
                n = want
                srt = sorted(fits)
                acc = 0  # blocks of SMs whose fit is below the level
                j = 0
                level = 1
                while True:
                    while srt[j] < level:
                        acc += srt[j]
                        j += 1
                    if acc + level * (n_sm - j) >= want:
                        break
                    level += 1
                base = [f if f < level else level - 1 for f in fits]
                rem = want - sum(base)
                for j in range(n_sm):
                    if rem == 0:
                        break
                    if fits[j] >= level:
                        base[j] += 1
                        rem -= 1
                alloc = [(i, b) for i, b in zip(order, base, strict=True) if b]
        press = self._press
        p = k.press
        f_sum = 0.0
        d = 1
        for i, b in alloc:
            free[i] -= b * cost
            f_sum += press[i] * b
            press[i] += b * p
            if b > d:
                d = b
        units = n * cost
        s = k.stream
        self._free_total -= units
        s.used += units
        # The batch ends with its most packed SM (d blocks), which follows the kernel's
        # packing curve; blocks of other kernels (and earlier batches) already on its SMs
        # add their pressure (block-weighted mean).
        dur = k.block_s * max(
            1.0, curve_at(k.curve, p, d) + self.interference * f_sum / n
        ) / k.g_alone
        if self.jitter:
            dur *= max(0.1, self._rng.gauss(1.0, self.jitter))
        if k.started == 0:
            k.t_start = self._t
        k.started += n
        k.pending -= n
        k.running += n
        self.stats["batches"] += 1
        self._at(self._t + dur, self._on_batch_end, (k, alloc, n))

    def _on_batch_end(self, arg: tuple[_KRun, list[tuple[int, int]], int]) -> None:
        k, alloc, n = arg
        cost = k.cost
        free = self._free
        press = self._press
        p = k.press
        for i, b in alloc:
            free[i] += b * cost
            press[i] -= b * p
        units = n * cost
        self._free_total += units
        k.stream.used -= units
        k.running -= n
        if k.running == 0 and k.pending == 0:
            if k.parent is not None:  # a padding part of a padded launch
                parent = k.parent
                parent.parts.remove(k)
                if self.timeline is not None:
                    self.timeline.append((k.stream.id, k.task, k.kernel, k.t_start, self._t,
                                          True, k.started))
                if not parent.parts and parent.running == 0 and parent.pending == 0:
                    self.stats["pad_tail_s"] += self._t - parent.evict_until
                    self._finish(parent)
            elif k.parts:
                k.evict_until = self._t  # (unused for a padded launch) RT blocks' end
                return  # the RT blocks are done; the launch ends with its last BE block
            elif k.evicted and k.evict_until > self._t:
                self._at(k.evict_until, self._finish, k)
            else:
                self._finish(k)

    def _finish(self, k: _KRun) -> None:
        s = k.stream
        s.cur = None
        task, kernel = s.vhq.complete()
        assert (task, kernel) == (k.task, k.kernel), "stream completed out of order"
        executed = not k.evicted
        self.stats["kernels"] += 1
        if not executed:
            self.stats["evicted"] += 1
        else:
            self.stats["busy_s"] += self._t - k.t_start
        if self.timeline is not None:
            self.timeline.append((s.id, task, kernel, k.t_start, self._t, executed, k.started))
        if s.devq:
            self._start_head(s)
        self._pump(s)
        if self._on_complete is not None:
            self._on_complete(Completion(s.id, task, kernel, executed, k.t_start, self._t,
                                         k.done_parts))


def _prio(k: _KRun) -> tuple[int, float, int]:
    return (-k.stream.priority, k.t_ready, k.seq)


def _call0(fn: Callable[[], None]) -> None:
    fn()


def kernel_consts(kp: KernelProfile, gpu: GpuSpec) -> KConsts:
    """Simulation constants of one kernel on ``gpu`` (see :func:`profiles.packing`)."""
    blocks, bps, block_s_us, curve, press, g_alone = packing(kp, gpu.sms, gpu)
    return (blocks, _U // bps, block_s_us * 1e-6, press, curve, g_alone)
