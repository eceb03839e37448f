"""Glue between the scheduler and the model cache / adaptive batcher.

Why a separate module: the scheduler core stays about preemption and EDF; it calls a few
hooks here (``Scheduler.ext``) at five points: an arrival, the start of a task (acquire
the model), the release of a task, the answer/failure of a task, and a model unload.
Everything here runs on the scheduler's thread (or inline in the simulator), never blocks,
and never waits for a load: a task whose model is not resident is *parked* (kept in
``sched.tasks`` so the scheduler is not idle) and re-queued when the cache's future
resolves, through ``wake`` (the Runtime's control channel).

Batching (BE only): when a BE task of a batchable model starts, the model's
:class:`AdaptiveBatcher` says how many queued requests of that model to take; they are
stacked into one task on the plan compiled for that batch size and answered individually.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from av_infer.batching import AdaptiveBatcher, split_outputs, stack_inputs
from av_infer.cache import ModelCache
from av_infer.errors import AvInferError, DeviceFaultError, InvalidParameterError
from av_infer.sched.request import Priority, Request, Result, Timings
from av_infer.sched.scheduler import ModelEntry, Task

log = logging.getLogger(__name__)

#: Device task ids of batch tasks start here (request ids count from 1).
_BATCH_IDS = 1 << 40


def batch_name(model: str, b: int) -> str:
    """Cache name of the plan of ``model`` compiled for batch size ``b``."""
    return f"{model}#b{b}"


@dataclass(eq=False)
class BatchTask(Task):
    """A task running several BE requests of one model as one batched plan instance."""

    members: list[Task] = field(default_factory=list)


class ModelServices:
    """Cache and batching hooks of one scheduler; see the module docstring."""

    def __init__(self, cache: ModelCache, wake: Callable[[Callable[[], None]], None],
                 batching: bool = False, quantum: float = 0.005) -> None:
        self.cache = cache
        self.wake = wake
        self.batching = bool(batching)
        self.quantum = float(quantum)
        self.batch_entries: dict[str, dict[int, ModelEntry]] = {}  # model -> b -> entry
        self.batchers: dict[str, AdaptiveBatcher] = {}
        self._retained: dict[int, str] = {}  # task id -> cache name it holds
        self._parked: dict[str, list[Task]] = {}  # cache name -> tasks waiting for it
        self._unload_later: set[str] = set()
        self._counted: set[int] = set()  # parked tasks whose miss was counted
        self._ids = itertools.count(_BATCH_IDS)
        self.batched_requests = 0
        self.batch_tasks = 0

    # -- batching setup -------------------------------------------------------------------
    def add_batch_entries(self, model: str, entries: dict[int, ModelEntry]) -> None:
        """Plans of ``model`` for batch sizes > 1 (already registered with the cache)."""
        if not entries:
            return
        self.batch_entries.setdefault(model, {}).update(entries)
        sizes = (1, *sorted(self.batch_entries[model]))
        old = self.batchers.get(model)
        if old is None:
            self.batchers[model] = AdaptiveBatcher(sizes, self.quantum)
        else:
            old.set_batch_sizes(sizes)

    def set_batching(self, enabled: bool, quantum: float | None = None,
                     max_batch: int | None = None) -> None:
        if quantum is not None:
            if not quantum > 0:
                raise InvalidParameterError(f"batch quantum must be > 0 s, got {quantum}")
            self.quantum = float(quantum)
            for b in self.batchers.values():
                b.quantum = self.quantum
        if max_batch is not None:
            for m, ents in self.batch_entries.items():
                self.batchers[m].set_batch_sizes(
                    [1, *(b for b in ents if b <= max_batch)])
        self.batching = bool(enabled)

    # -- hooks ----------------------------------------------------------------------------
    def on_arrival(self, sched: Any, task: Task) -> None:
        if self.batching and not task.rt:
            b = self.batchers.get(task.req.model)
            if b is not None:
                b.observe_arrival(sched.device.now())

    def acquire(self, sched: Any, t: Task) -> Any | None:
        """The device handle for ``t`` (its model retained), or None: ``t`` is parked."""
        name = t.entry.name
        retry = t.tid in self._counted  # a parked task's second look is not a new hit
        self._counted.discard(t.tid)
        h = self.cache.retain(name, count=not retry)
        if h is None:
            fut = self.cache.ensure_resident(name, count=False)
            if fut.done() and fut.exception() is None:  # inline mode: loaded already
                h = self.cache.retain(name)
        if h is not None:
            self._retained[t.tid] = name
            return h
        waiting = name in self._parked
        self._counted.add(t.tid)
        self._parked.setdefault(name, []).append(t)
        sched.tasks[t.tid] = t  # the scheduler is not idle while tasks are parked
        if not waiting:
            fut.add_done_callback(lambda f, n=name: self.wake(
                lambda: self._unpark(sched, n, f)))
        return None

    def _unpark(self, sched: Any, name: str, fut: Future) -> None:
        tasks = self._parked.pop(name, [])
        err = fut.exception()
        for t in tasks:
            sched.tasks.pop(t.tid, None)
            if t.answered:
                continue  # failed meanwhile (shutdown)
            if err is not None:
                e = err if isinstance(err, AvInferError) else DeviceFaultError(
                    f"model {name!r} could not be loaded: {err}")
                sched._fail(t, e)
            elif t.rt:
                sched.rt_queue.push(t.req.deadline, t)
            else:
                sched.be_queues.push_front(t.req.client, t)

    def release(self, t: Task) -> None:
        name = self._retained.pop(t.tid, None)
        if name is None:
            return
        self.cache.release(name)
        if name in self._unload_later:
            self._try_unregister(name)

    def unload(self, entry: ModelEntry) -> None:
        """The model is gone from the runtime: drop it (and its batch plans) from the cache."""
        names = [entry.name, *(e.name for e in self.batch_entries.pop(entry.name, {}).values())]
        self.batchers.pop(entry.name, None)
        for n in names:
            self._try_unregister(n)

    def _try_unregister(self, name: str) -> None:
        try:
            self.cache.unregister(name)
            self._unload_later.discard(name)
        except InvalidParameterError:
            self._unload_later.add(name)  # still in use: when its last task is released
        except AvInferError:
            self._unload_later.discard(name)

    # -- batching at dispatch -------------------------------------------------------------
    def maybe_batch(self, sched: Any, t: Task) -> Task:
        """``t`` alone, or a BatchTask of ``t`` and more queued requests of its model."""
        if not self.batching or t.rt or t.allocated or isinstance(t, BatchTask):
            return t
        model = t.req.model
        ents = self.batch_entries.get(model)
        bat = self.batchers.get(model)
        if not ents or bat is None:
            return t
        qlen = 1 + sum(1 for x in sched.be_queues if x.req.model == model)
        n = bat.take(qlen, sched.device.now())
        # the largest batch plan <= n that is resident; ask for the wanted one meanwhile
        sizes = sorted((s for s in ents if s <= n), reverse=True)
        b = next((s for s in sizes if self.cache.handle(ents[s].name) is not None), 1)
        if sizes and b < sizes[0]:
            self.cache.ensure_resident(ents[sizes[0]].name, count=False)
        if b <= 1:
            return t
        left = [b - 1]

        def pick(x: Task) -> bool:
            if left[0] > 0 and x.req.model == model and not x.allocated:
                left[0] -= 1
                return True
            return False

        others = sched.be_queues.remove_if(pick)
        members = [t, *others]
        entry = ents[b]
        inputs = stack_inputs([m.req.inputs for m in members], b)
        for m in members:
            m.req.inputs = {}
        req = Request(next(self._ids), entry.name, inputs, Priority.BE, t.req.client,
                      math.inf, False, Timings(min(m.req.timings.arrival for m in members)))
        self.batch_tasks += 1
        self.batched_requests += len(members)
        return BatchTask(req, entry, entry.n_kernels, members=members)

    def intercept_answer(self, sched: Any, t: Task, result: Result) -> bool:
        """Answer each member of a batch task with its rows of the outputs."""
        if not isinstance(t, BatchTask):
            return False
        if t.answered:
            return True
        t.answered = True
        try:
            outs = split_outputs(result.outputs, len(t.members))
        except AvInferError as e:
            for m in t.members:
                sched._fail(m, e)
            return True
        bt = t.req.timings
        for m, out in zip(t.members, outs):
            tm = m.req.timings
            tm.start, tm.first_kernel_start, tm.end = bt.start, bt.first_kernel_start, bt.end
            tm.preempted, tm.kernels_reexecuted = bt.preempted, bt.kernels_reexecuted
            tm.kernels_padded = bt.kernels_padded
            sched._answer(m, Result(m.req.id, m.req.model, m.req.client, m.req.priority,
                                    out, tm, m.req.deadline))
        return True

    def intercept_fail(self, sched: Any, t: Task, err: AvInferError) -> bool:
        if not isinstance(t, BatchTask):
            return False
        if not t.answered:
            t.answered = True
            for m in t.members:
                sched._fail(m, err)
        return True

    # -- diagnostics ----------------------------------------------------------------------
    def batching_stats(self) -> dict[str, Any]:
        return {
            "enabled": self.batching,
            "quantum_s": self.quantum,
            "batch_tasks": self.batch_tasks,
            "batched_requests": self.batched_requests,
            "models": {m: b.stats() for m, b in self.batchers.items()},
        }

    def parked(self) -> int:
        return sum(len(v) for v in self._parked.values())


def compile_batch_plans(device: Any, name: str, source: Any, input_shapes: Any, base: Any,
                        sizes: list[int], whole: bool = False) -> tuple[dict[int, Any], str]:
    """Plans of an ONNX model for batch sizes ``sizes``; ``({}, why)`` when unavailable.

    Batching needs every input and output of the base plan to lead with a batch dim of 1
    and an ONNX whose batch dim is dynamic (recompiled with ``input_shapes`` batch=b). A
    static batch-1 ONNX model (the zoo's scaled models) cannot be batched: its shapes are
    fixed in the file. Runs the device's compiler (``Device.compile``): call it off the RT
    path (at load time).
    """
    if source is None:
        return {}, "no ONNX source (loaded from a Plan)"
    spec_in, spec_out = base.input_spec(), base.output_spec()
    bad = [n for n, (sh, _) in {**spec_in, **spec_out}.items() if not sh or sh[0] != 1]
    if bad:
        return {}, f"tensors {bad} do not lead with a batch dim of 1"
    plans: dict[int, Any] = {}
    for b in sizes:
        shapes = {n: (b, *sh[1:]) for n, (sh, _) in spec_in.items()}
        try:
            p = device.compile(source, shapes, name=batch_name(name, b), whole=whole)
        except AvInferError as e:
            return {}, f"recompiling with batch {b} failed: {e}"
        ok = all(p.input_spec()[n][0] == shapes[n] for n in spec_in if n in p.input_spec()) \
            and set(p.input_spec()) == set(spec_in) \
            and all(sh[0] == b for sh, _ in p.output_spec().values())
        if not ok:
            return {}, "the ONNX batch dim is static (not dynamic): batching unavailable"
        plans[b] = p
    return plans, "ok"
