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
   GPU's thread and block limits). Blocks are placed as batches spread evenly over SMs; a
   batch ends together. Running blocks cannot be killed (NVIDIA).
4. Block time = ``duration_us / waves`` with ``waves = ceil(blocks / (sms * bps))``, so a
   kernel alone on the GPU takes its profiled duration. Sharing an SM slows blocks down
   (processor sharing, snapshot at placement): a block of kernel k *demands* ``w_k`` of
   an SM's throughput (from REEF's latency-by-blocks-per-SM curve:
   ``latency[-1] / (levels * latency[0])``; else ``1/bps``); a batch placed where other
   blocks already demand ``F`` per SM runs ``max(1, interference*F + d*w) / max(1, d0*w)``
   times longer (``d`` its blocks per SM, ``d0`` the density it has alone). This is what
   makes plain concurrent streams slow RT work down; blocks already running are not
   re-timed when others arrive.
5. Lazy eviction: blocks read their stream's preemption flag when they *start*. A kernel
   whose blocks start under a set flag exits (``gpu.evict_us`` per kernel, not per block)
   and completes with ``executed=False``; blocks already running finish.

Everything happens inside :meth:`SimDevice.run` (the event loop); callbacks scheduled with
:meth:`SimDevice.call_at` (request arrivals, the runtime's handlers) run inline, so a run
with the same inputs and seed gives the same timeline.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from av_infer._cy.vhq import VHQ
from av_infer.devices.base import Completion, CompletionCallback, Device, ResetInfo
from av_infer.model.plan import Plan
from av_infer.profiles import GpuSpec, ModelProfile, derive_profile, gpu_spec

#: Resource units of one SM; a block of a kernel with occupancy b costs ``_U // b``.
_U = 1 << 20

#: One timeline entry: (stream, task, kernel, t_start, t_end, executed, blocks started).
TimelineEntry = tuple[int, int, int, float, float, bool, int]


@dataclass
class SimPlan:
    """Handle of a loaded plan: the plan, its profile and per-kernel simulation constants."""

    plan: Plan
    profile: ModelProfile
    resident: int
    #: per kernel: (blocks, cost units per block, block time in seconds, SM demand per
    #: block, blocks per SM when alone)
    consts: list[tuple[int, int, float, float, float]]


class _Stream:
    __slots__ = ("id", "priority", "vhq", "devq", "cur", "flag", "used")

    def __init__(self, sid: int, priority: int, c: int) -> None:
        self.id = sid
        self.priority = priority
        self.vhq = VHQ(c)
        self.devq: deque[tuple[int, int]] = deque()  # arrived, not yet started launches
        self.cur: _KRun | None = None  # the launch the stream is executing (in order)
        self.flag = False  # preemption flag as the SMs see it
        self.used = 0  # resource units held by this stream's running blocks


class _KRun:
    """One launch on the device, from ready to completion."""

    __slots__ = (
        "stream", "task", "kernel", "seq", "t_ready", "pending", "running", "cost",
        "block_s", "t_start", "evicted", "started", "evict_until", "w", "alone",
    )

    def __init__(self, stream: _Stream, task: int, kernel: int, seq: int, t: float,
                 c: tuple[int, int, float, float, float]) -> None:
        self.stream = stream
        self.task = task
        self.kernel = kernel
        self.seq = seq
        self.t_ready = t
        self.pending, self.cost, self.block_s, self.w, self.alone = c
        self.running = 0
        self.t_start = math.nan
        self.evicted = False
        self.started = 0
        self.evict_until = 0.0


class SimDevice(Device):
    """Discrete-event GPU model implementing :class:`Device` in virtual seconds."""

    name = "sim"
    virtual = True

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
        self._ready: list[_KRun] = []  # kernels with blocks still to place
        self._free = [_U] * self.gpu.sms
        self._free_total = _U * self.gpu.sms
        self._demand = [0.0] * self.gpu.sms  # SM throughput demanded by resident blocks
        self._rr = 0  # round-robin start SM for small placements
        self._on_complete: CompletionCallback | None = None
        self._closed = False
        self.timeline: list[TimelineEntry] | None = [] if record else None
        self.stats = {"events": 0, "batches": 0, "kernels": 0, "evicted": 0, "busy_s": 0.0}

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
        prof = self.profiles.get(plan.name) or derive_profile(plan, self.gpu)
        if len(prof.kernels) != len(plan.kernels):
            raise ValueError(
                f"profile of {plan.name!r} has {len(prof.kernels)} kernels, plan has "
                f"{len(plan.kernels)}"
            )
        g = self.gpu
        consts = []
        for kp in prof.kernels:
            blocks = max(1, kp.blocks)
            bps = max(1, min(kp.blocks_per_sm, g.max_blocks_per_sm,
                             g.max_threads_per_sm // max(1, kp.threads)))
            waves = math.ceil(blocks / (g.sms * bps))
            lat = kp.latency_by_bps
            if lat and len(lat) > 1 and lat[0] > 0:
                w = min(1.0, max(0.0, lat[-1] / (len(lat) * lat[0])))
            else:
                w = 1.0 / bps
            alone = min(bps, math.ceil(blocks / g.sms))
            consts.append((blocks, _U // bps, kp.duration_us * 1e-6 / waves, w, alone))
        resident = plan.weight_bytes
        return SimPlan(plan=plan, profile=prof, resident=resident, consts=consts)

    def unload_plan(self, handle: Any) -> None:
        for task, h in list(self._tasks.items()):
            if h is handle:
                raise RuntimeError(f"task {task} of {handle.plan.name!r} is not released")

    def resident_bytes(self, handle: Any) -> int:
        return int(handle.resident)

    def new_task(self, handle: Any, task: int) -> None:
        self._tasks[task] = handle

    def release_task(self, task: int) -> None:
        self._tasks.pop(task, None)

    def write_inputs(self, task: int, inputs: dict[str, np.ndarray]) -> None:
        """Nothing to copy: the simulator models time, not values."""

    def read_outputs(self, task: int) -> dict[str, np.ndarray]:
        """Zero arrays of the output shapes: the simulator never produces numeric results."""
        plan = self._tasks[task].plan
        return {n: np.zeros(shape, dtype=dt) for n, (shape, dt) in plan.output_spec().items()}

    # -- streams, vHQs, preemption -------------------------------------------------------
    def open_stream(self, priority: int) -> int:
        s = _Stream(len(self._streams), priority, self._c)
        self._streams.append(s)
        return s.id

    def enqueue(self, stream: int, task: int, first: int, last: int) -> None:
        s = self._streams[stream]
        s.vhq.push(task, first, last)
        self._pump(s)

    def reset(self, stream: int) -> ResetInfo | None:
        r = self._streams[stream].vhq.reset()
        return None if r is None else ResetInfo(*r)

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
        while (x := s.vhq.transmit()) is not None:
            self._at(t, self._on_arrive, (s, x[0], x[1]))

    def _on_flag(self, arg: tuple[_Stream, bool]) -> None:
        arg[0].flag = arg[1]

    def _on_arrive(self, arg: tuple[_Stream, int, int]) -> None:
        s, task, kernel = arg
        s.devq.append((task, kernel))
        if s.cur is None:
            self._start_head(s)

    def _start_head(self, s: _Stream) -> None:
        task, kernel = s.devq.popleft()
        self._seq += 1
        k = _KRun(s, task, kernel, self._seq, self._t, self._tasks[task].consts[kernel])
        s.cur = k
        self._ready.append(k)

    def _schedule(self) -> None:
        """Place blocks of ready kernels: higher priority first, then FIFO by ready time."""
        ready = self._ready
        if len(ready) > 1:
            ready.sort(key=_order)
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
        """Start as many of ``k``'s pending blocks as fit, spread evenly over the SMs."""
        free = self._free
        cost = k.cost
        want = k.pending
        n_sm = len(free)
        alloc: list[tuple[int, int]] = []
        if want < n_sm:  # try one block on each of `want` SMs, round robin from _rr
            rr = self._rr
            for i in range(rr, n_sm):
                if free[i] >= cost:
                    alloc.append((i, 1))
                    if len(alloc) == want:
                        break
            else:
                for i in range(rr):
                    if free[i] >= cost:
                        alloc.append((i, 1))
                        if len(alloc) == want:
                            break
            if len(alloc) == want:
                self._rr = (alloc[-1][0] + 1) % n_sm
                n = want
            else:
                alloc = []
        if not alloc:
            fits = [f // cost for f in free]
            total = sum(fits)
            if total == 0:
                return
            if want >= total:
                alloc = [(i, f) for i, f in enumerate(fits) if f]
                n = total
            else:  # water-fill to the lowest level L that holds `want` blocks
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
                for i in range(n_sm):
                    if rem == 0:
                        break
                    if fits[i] >= level:
                        base[i] += 1
                        rem -= 1
                alloc = [(i, b) for i, b in enumerate(base) if b]
        demand = self._demand
        w = k.w
        f_sum = 0.0
        for i, b in alloc:
            free[i] -= b * cost
            f_sum += demand[i]
            demand[i] += b * w
        units = n * cost
        s = k.stream
        self._free_total -= units
        s.used += units
        own = n / len(alloc) * w
        dur = k.block_s * (
            max(1.0, self.interference * f_sum / len(alloc) + own) / max(1.0, k.alone * w)
        )
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
        demand = self._demand
        w = k.w
        for i, b in alloc:
            free[i] += b * cost
            demand[i] -= b * w
        units = n * cost
        self._free_total += units
        k.stream.used -= units
        k.running -= n
        if k.running == 0 and k.pending == 0:
            if k.evicted and k.evict_until > self._t:
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
            self._on_complete(Completion(s.id, task, kernel, executed, k.t_start, self._t))


def _order(k: _KRun) -> tuple[int, float, int]:
    return (-k.stream.priority, k.t_ready, k.seq)


def _call0(fn: Callable[[], None]) -> None:
    fn()
