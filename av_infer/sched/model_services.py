# cython: annotation_typing=False, language_level=3
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
  request transform ahead of dispatch (BE only): the model's decider
  (``qos.deciders``: Rafiqi's :class:`AdaptiveBatcher`, paper 001's eq. 2, ``fixed`` or
  the learned policy; ``batch_mode``) says how many queued requests of that model to take
  (through the two views of the BE queue the scheduler passes), and they become one task
  on the plan compiled for that batch size, with ``members`` set; ``split_result`` turns
  its result back into one answer per member, which the scheduler delivers.
* Variant groups (paper 001 §2.3) are the same transform: a request naming a group (RT
  too, then batch 1) becomes a task on the variant, and batch size, with the highest
  expected quality; ``latency`` (qos.latency) learns each plan's device time from the
  batch tasks' timings.

Everything here runs inside the scheduler's driver, never blocks and never waits for a
load.

Compiled (model_services.pxd, Cython's pure-Python mode; the ``.py`` runs interpreted
where it is not built), ``ModelServices`` is a ``cdef class`` and ``acquire``/``release``,
called once each per request, are C methods that call the cache's (cache.pxd) as C.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from av_infer.batching import AdaptiveBatcher, split_outputs, stack_inputs
from av_infer.cache import ModelCache
from av_infer.errors import AvInferError, InvalidParameterError
from av_infer.qos.deciders import (
    BatchView,
    Decider,
    Eq2Decider,
    FixedDecider,
    RafiqiDecider,
    best_variant,
    check_mode,
    plan_size,
)
from av_infer.qos.latency import LatencyTable
from av_infer.qos.policy import PolicyNet, RlDecider, check_fits
from av_infer.qos.variants import VariantGroup
from av_infer.sched.request import Request, Result, Timings
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
                 batching: bool = False, quantum: float = 0.005,
                 mode: str = "rafiqi") -> None:
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
        # -- QoS (paper 001): batch mode, variant groups, latency estimates ---------------
        self.mode = check_mode(mode)
        #: group -> (the group, each variant's base entry, most accurate first)
        self.groups: dict[str, tuple[VariantGroup, list[ModelEntry]]] = {}
        self.deciders: dict[str, Decider] = {}  # unit (model or group) -> its decider
        self.latency = LatencyTable()
        self.policy: PolicyNet | None = None  # qos_rl's network
        #: eq. 2's parameters, the arrival-rate window (eq. 2, qos_rl) and fixed's cap
        self.eq2 = {"alpha": 0.5, "beta": 1.0, "b_thrd": 8}
        self.rate_window = 0.05
        self.fixed_max = 32
        self.max_batch: int | None = None  # set_batching's cap on the compiled sizes used
        self._plan_variant: dict[str, tuple[str, float]] = {}  # plan -> (variant, κ)
        self._expected_end: dict[int, tuple[str, float]] = {}  # task id -> (unit, end)

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
        for g, (grp, _) in self.groups.items():  # a group's sizes are its variants' common ones
            if model in grp.models:
                self.deciders.pop(g, None)
                self.batchers.pop(g, None)

    def add_group(self, group: VariantGroup, bases: list[ModelEntry]) -> None:
        """Serve requests naming ``group.name`` by its variants (``bases``: their entries,
        in the group's order). The caller validated the group."""
        if self.mode == "qos_rl" and self.policy is not None:
            check_fits(self.policy, group.name, len(group.variants), self._sizes(group.name))
        self.groups[group.name] = (group, list(bases))
        self.deciders.pop(group.name, None)
        for v, e in zip(group.variants, bases):
            self._plan_variant[e.name] = (v.model, v.kappa)

    def remove_group(self, name: str) -> None:
        self.groups.pop(name, None)
        self.deciders.pop(name, None)
        self.batchers.pop(name, None)

    def set_mode(self, mode: str, policy: PolicyNet | None = None,
                 params: dict[str, float] | None = None) -> None:
        """Switch the batch mode (and qos_rl's policy, eq. 2's parameters): validated
        against every unit first, so a refusal changes nothing; deciders restart."""
        mode = check_mode(mode)
        pol = policy if policy is not None else self.policy
        if mode == "qos_rl":
            if pol is None:
                raise InvalidParameterError("batch mode 'qos_rl' needs a policy")
            for u in [*self.groups, *self.batch_entries]:
                g = self.groups.get(u)
                check_fits(pol, u, len(g[0].variants) if g else 1, self._sizes(u))
        eq2 = dict(self.eq2)
        window, fixed_max = self.rate_window, self.fixed_max
        for k, v in (params or {}).items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise InvalidParameterError(f"batch-mode parameter {k!r} must be a finite "
                                            f"number, got {v!r}")
            if k in ("b_thrd", "fixed_max") and (int(v) != v or v < 1):
                raise InvalidParameterError(f"{k} must be an int >= 1, got {v!r}")
            if k == "rate_window":
                window = float(v)
            elif k == "fixed_max":
                fixed_max = int(v)
            elif k in eq2:
                eq2[k] = v
            else:
                raise InvalidParameterError(
                    f"unknown batch-mode parameter {k!r}; known: alpha, beta, b_thrd, "
                    f"rate_window, fixed_max")
        Eq2Decider((1,), eq2["alpha"], eq2["beta"], window, int(eq2["b_thrd"]))  # validates
        self.mode, self.policy, self.eq2 = mode, pol, eq2
        self.rate_window, self.fixed_max = window, fixed_max
        self.deciders.clear()

    def set_batching(self, enabled: bool, quantum: float | None = None,
                     max_batch: int | None = None) -> None:
        if quantum is not None:
            if not quantum > 0:
                raise InvalidParameterError(f"batch quantum must be > 0 s, got {quantum}")
            self.quantum = float(quantum)
            for b in self.batchers.values():
                b.quantum = self.quantum
        if max_batch is not None:
            self.max_batch = int(max_batch)
            for m, ents in self.batch_entries.items():
                self.batchers[m].set_batch_sizes(
                    [1, *(b for b in ents if b <= max_batch)])
        self.batching = bool(enabled)

    # -- hooks ----------------------------------------------------------------------------
    def on_arrival(self, task: Task, now: float) -> None:
        if self.batching and not task.rt:
            d = self._decider(task.req.model)
            if d is not None:
                d.observe_arrival(now)

    def acquire(self, t: Task) -> Any | None:
        """The device handle for ``t`` (its model retained), or None: ``t`` is parked."""
        name = t.entry.name
        counted = self._counted
        if counted and t.tid in counted:  # a parked task's second look is not a new hit
            counted.discard(t.tid)
            h = self.cache.retain(name, False)
        else:  # the request path: nothing parked (no set.discard call)
            h = self.cache.retain(name, True)
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
        if not waiting:  # (a partial, not a lambda: no closure in a compiled cpdef method)
            fut.add_done_callback(functools.partial(self._loaded, name))
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
        if self._unload_later and name in self._unload_later:
            self._try_unregister(name)

    def unload(self, entry: ModelEntry) -> None:
        """The model is gone from the runtime: drop it (and its batch plans) from the cache."""
        names = [entry.name, *(e.name for e in self.batch_entries.pop(entry.name, {}).values())]
        self.batchers.pop(entry.name, None)
        self.deciders.pop(entry.name, None)
        for n in names:
            self.latency.forget(n)
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
    def _sizes(self, unit: str) -> tuple[int, ...]:
        """Batch sizes compiled for every variant of ``unit`` (1 always)."""
        g = self.groups.get(unit)
        models = g[0].models if g is not None else (unit,)
        common: set[int] | None = None
        for m in models:
            have = set(self.batch_entries.get(m, {}))
            common = have if common is None else common & have
        cap = self.max_batch or math.inf
        return (1, *sorted(b for b in common or () if b <= cap))

    def _decider(self, unit: str) -> Decider | None:
        """The unit's decider in the current mode (None: nothing to batch or choose)."""
        d = self.deciders.get(unit)
        if d is not None:
            return d
        if unit not in self.groups and unit not in self.batch_entries:
            return None
        sizes = self._sizes(unit)
        mode = self.mode
        if mode == "rafiqi":
            b = self.batchers.get(unit)
            if b is None:
                b = self.batchers[unit] = AdaptiveBatcher(sizes, self.quantum)
            d = RafiqiDecider(b)
        elif mode == "eq2":
            e = self.eq2
            d = Eq2Decider(sizes, e["alpha"], e["beta"], self.rate_window, int(e["b_thrd"]))
        elif mode == "fixed":
            d = FixedDecider(self.fixed_max)
        else:
            d = RlDecider(self.policy, self.rate_window)
        self.deciders[unit] = d
        return d

    def _estimate(self, plan: str, base: str, b: int) -> float:
        est = self.latency.get(plan)
        if est is None:
            one = self.latency.get(base)
            est = one * b if one is not None else 0.0
        return est

    def _busy(self, unit: str, now: float) -> float:
        """Expected seconds until the unit's running batches end (paper 001's device
        availability); forgets the ones already due."""
        busy = 0.0
        for tid, (u, end) in list(self._expected_end.items()):
            if end <= now:
                del self._expected_end[tid]
            elif u == unit:
                busy = max(busy, end - now)
        return busy

    def maybe_batch(self, t: Task, now: float, queued_of: Callable[[str], list[Task]],
                    take_of: Callable[[str, int], list[Task]]) -> Task:
        """``t`` alone, or a task on the variant and batch size its unit's decider chose:
        ``t`` and more queued requests of its model or group (``queued_of(unit)`` lists
        them in dispatch order, ``take_of(unit, n)`` removes up to n)."""
        if t.allocated or t.members is not None:
            return t
        unit = t.req.model
        grp = self.groups.get(unit)
        if grp is None and (not self.batching or t.rt or unit not in self.batch_entries):
            return t
        if grp is not None:
            group, bases = grp
            kappas, models = group.kappas, [e.name for e in bases]
        else:
            kappas, models = (1.0,), [unit]
        batching = self.batching and not t.rt
        sizes = self._sizes(unit) if batching else (1,)
        ents = [self.batch_entries.get(m, {}) for m in models]

        def latency(v: int, b: int) -> float:
            return self._estimate(ents[v][b].name if b > 1 else models[v], models[v], b)

        queued = queued_of(unit) if len(sizes) > 1 else []
        req = t.req
        view = BatchView(now, [(req.deadline, req.hard_deadline),
                               *((x.req.deadline, x.req.hard_deadline) for x in queued)],
                         sizes, kappas, latency, self._busy(unit, now))
        dec = self._decider(unit) if len(sizes) > 1 else None
        v, n = dec.decide(view) if dec is not None else (best_variant(view, 1), 1)
        n = max(1, min(int(n), len(view.deadlines)))
        b = plan_size(sizes, n)
        if b > 1 and self.cache.handle(ents[v][b].name) is None:
            # not resident: the largest resident size below it; ask for the wanted one
            self.cache.ensure_resident(ents[v][b].name, count=False)
            b = max((s for s in ents[v] if s < b and self.cache.handle(ents[v][s].name)
                     is not None), default=1)
            n = min(n, b)
        if grp is None and b <= 1:
            return t
        members = [t, *take_of(unit, n - 1)] if n > 1 else [t]
        entry = ents[v][b] if b > 1 else grp[1][v]
        inputs = stack_inputs([m.req.inputs for m in members], b)
        rt = t.rt
        breq = Request(next(self._ids), entry.name, inputs, req.priority, req.client,
                       req.deadline if rt else math.inf, False,
                       Timings(min(m.req.timings.arrival for m in members)))
        task = Task(breq, entry, entry.n_kernels, members=members)
        for m in members:
            m.req.inputs = {}
            m.batch = task
        if grp is not None:
            self._plan_variant.setdefault(entry.name, (models[v], kappas[v]))
        self._expected_end[task.tid] = (unit, now + view.busy + latency(v, b))
        if b > 1:
            self.batch_tasks += 1
            self.batched_requests += len(members)
        return task

    def split_result(self, t: Task, result: Result) -> list[tuple[Task, Result | AvInferError]]:
        """One answer per member of batch task ``t``: its rows of the outputs (with the
        batch's timings), or the error splitting raised."""
        members = t.members or []
        try:
            outs = split_outputs(result.outputs, len(members))
        except AvInferError as e:
            return [(m, e) for m in members]
        bt = t.req.timings
        self._expected_end.pop(t.tid, None)
        if bt.preempted == 0:  # what the plan takes alone: the decisions' D_{B,M}
            self.latency.observe(t.entry.name, bt.end - bt.start)
        served = self._plan_variant.get(t.entry.name)
        out: list[tuple[Task, Result | AvInferError]] = []
        for m, rows in zip(members, outs):
            if m.answered:  # dropped meanwhile (hard deadline): answered already
                continue
            tm = m.req.timings
            tm.start, tm.first_kernel_start, tm.end = bt.start, bt.first_kernel_start, bt.end
            tm.preempted = bt.preempted
            tm.kernels_padded = bt.kernels_padded
            model, kappa = served if served is not None and m.req.model in self.groups \
                else (m.req.model, 1.0)
            out.append((m, Result(m.req.id, model, m.req.client, m.req.priority,
                                  rows, tm, m.req.deadline, m.req.hard_deadline, kappa)))
        return out

    # -- diagnostics ----------------------------------------------------------------------
    def batching_stats(self) -> dict[str, Any]:
        return {
            "enabled": self.batching,
            "quantum_s": self.quantum,
            "batch_tasks": self.batch_tasks,
            "batched_requests": self.batched_requests,
            "models": {m: b.stats() for m, b in self.batchers.items()},
            "mode": self.mode,
            "deciders": {u: d.stats() for u, d in self.deciders.items()},
            "latency_ms": {p: s * 1e3 for p, s in self.latency.snapshot().items()},
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
        if p.precision != base.precision:  # a batch runs at its model's precision
            p = replace(p, precision=base.precision)
        plans[b] = p
    return plans, "ok"
