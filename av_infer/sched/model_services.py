"""Glue between the scheduler and the model cache / adaptive batcher.

Why a separate module: the scheduler core stays about preemption and EDF; it asks this one
(``Scheduler.ext``) for *decisions* and acts on them itself. The interface is narrow and
one-way: ModelServices never touches the scheduler's queues, tasks or methods.

* ``acquire(task)``: the device handle (model retained), or None: the task is *parked*
  here (``parked()`` keeps the scheduler from counting itself idle) until the cache's load
  resolves; then, inside the driver (``wake``), ``ready(tasks, error)`` hands the parked
  tasks back and the scheduler queues or fails them (``Scheduler.resume_parked``).
* ``release(task)`` / ``unload(entry)``: the model may be evicted / forgotten.
* ``on_arrival(task, now)``, ``maybe_batch(task, now, queued_of, take_of)``: batching is a
  request transform ahead of dispatch (BE only): the model's :class:`AdaptiveBatcher` says
  how many queued requests of that model to take (through the two views of the BE queue
  the scheduler passes), and they become one task on the plan compiled for that batch
  size, with ``members`` set; ``split_result`` turns its result back into one answer per
  member, which the scheduler delivers.

Everything here runs inside the scheduler's driver, never blocks and never waits for a
load.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from av_infer.batching import AdaptiveBatcher, split_outputs, stack_inputs
from av_infer.cache import ModelCache
from av_infer.errors import AvInferError, InvalidParameterError
from av_infer.sched.request import Priority, Request, Result, Timings
from av_infer.sched.scheduler import ModelEntry, Task

log = logging.getLogger(__name__)

#: Device task ids of batch tasks start here (request ids count from 1).
_BATCH_IDS = 1 << 40


def batch_name(model: str, b: int) -> str:
    """Cache name of the plan of ``model`` compiled for batch size ``b``."""
    return f"{model}#b{b}"


class ModelServices:
    """Cache and batching hooks of one scheduler; see the module docstring."""

    def __init__(self, cache: ModelCache, wake: Callable[[Callable[[], None]], None],
                 ready: Callable[[list[Task], BaseException | None], None],
                 batching: bool = False, quantum: float = 0.005) -> None:
        """``wake(fn)``: run ``fn`` inside the scheduler's driver soon (from any thread);
        ``ready(tasks, error)``: give parked tasks back to the scheduler (called inside
        the driver)."""
        self.cache = cache
        self.wake = wake
        self.ready = ready
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
    def on_arrival(self, task: Task, now: float) -> None:
        if self.batching and not task.rt:
            b = self.batchers.get(task.req.model)
            if b is not None:
                b.observe_arrival(now)

    def acquire(self, t: Task) -> Any | None:
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
        if not waiting:
            fut.add_done_callback(lambda f, n=name: self._loaded(n, f))
        return None

    def _loaded(self, name: str, fut: Future) -> None:
        """The load ``name``'s parked tasks wait for resolved (any thread)."""
        err = fut.exception()
        self.wake(lambda: self._hand_back(name, err))

    def _hand_back(self, name: str, err: BaseException | None) -> None:
        tasks = self._parked.pop(name, [])
        if tasks:
            self.ready(tasks, err)

    def take_parked(self) -> list[Task]:
        """Every parked task, removed (shutdown fails them)."""
        out = [t for ts in self._parked.values() for t in ts]
        self._parked.clear()
        return out

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
    def maybe_batch(self, t: Task, now: float, queued_of: Callable[[str], int],
                    take_of: Callable[[str, int], list[Task]]) -> Task:
        """``t`` alone, or a batch task of ``t`` and more queued requests of its model
        (``queued_of(model)`` counts them, ``take_of(model, n)`` removes up to n)."""
        if not self.batching or t.rt or t.allocated or t.members is not None:
            return t
        model = t.req.model
        ents = self.batch_entries.get(model)
        bat = self.batchers.get(model)
        if not ents or bat is None:
            return t
        qlen = 1 + queued_of(model)
        n = bat.take(qlen, now)
        # the largest batch plan <= n that is resident; ask for the wanted one meanwhile
        sizes = sorted((s for s in ents if s <= n), reverse=True)
        b = next((s for s in sizes if self.cache.handle(ents[s].name) is not None), 1)
        if sizes and b < sizes[0]:
            self.cache.ensure_resident(ents[sizes[0]].name, count=False)
        if b <= 1:
            return t
        members = [t, *take_of(model, b - 1)]
        entry = ents[b]
        inputs = stack_inputs([m.req.inputs for m in members], b)
        for m in members:
            m.req.inputs = {}
        req = Request(next(self._ids), entry.name, inputs, Priority.BE, t.req.client,
                      math.inf, False, Timings(min(m.req.timings.arrival for m in members)))
        self.batch_tasks += 1
        self.batched_requests += len(members)
        return Task(req, entry, entry.n_kernels, members=members)

    def split_result(self, t: Task, result: Result) -> list[tuple[Task, Result | AvInferError]]:
        """One answer per member of batch task ``t``: its rows of the outputs (with the
        batch's timings), or the error splitting raised."""
        members = t.members or []
        try:
            outs = split_outputs(result.outputs, len(members))
        except AvInferError as e:
            return [(m, e) for m in members]
        bt = t.req.timings
        out: list[tuple[Task, Result | AvInferError]] = []
        for m, rows in zip(members, outs):
            tm = m.req.timings
            tm.start, tm.first_kernel_start, tm.end = bt.start, bt.first_kernel_start, bt.end
            tm.preempted, tm.kernels_reexecuted = bt.preempted, bt.kernels_reexecuted
            tm.kernels_padded = bt.kernels_padded
            out.append((m, Result(m.req.id, m.req.model, m.req.client, m.req.priority,
                                  rows, tm, m.req.deadline)))
        return out

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
