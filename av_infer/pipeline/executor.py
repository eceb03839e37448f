"""Execution of a plan's pipelines on pools of av_infer Runtimes (PPipe §5.4 on real lanes).

Each physical pool member is a :class:`~.lanes.Lane`: a :class:`~.lanes.LocalLane` wraps a
``Runtime`` in this process; ``nodes/pipeline_stage_node.py`` has the lane of a stage
process reached over ROS 2 with ``av_infer_msgs`` (same contract). A stage is the ONNX
sub-model of its blocks (:func:`.partition.extract_stage`) loaded on each member of its
pool; a request's feature maps go from one stage's outputs straight into the next
stage's ``submit`` (the one copy into that stage's input buffer; with ``fp16_boundaries``
they travel as float16 and are widened on arrival). Each stage's runtime schedules the
request with its own policy at the request's priority and deadline, so RT work on a
device still preempts pipeline BE work.

One thread owns the :class:`~.batcher.ReservationBatcher` and the tables: submissions,
feedback (actual stage completions) and wake-ups reach it through its inbox.

Guarantees: every submitted request's future resolves exactly once, with the outputs of
the last stage or a typed error (``deadline_missed`` when the batcher drops it,
``stage_failed`` when a lane dies holding it, ``shutdown`` on close, or the stage
runtime's own error). :meth:`PipelineExecutor.migrate` switches to a new plan without
losing a request: the new stages are loaded first, requests still queued move to the new
plan's queues, in-flight ones finish on the old stages, then the old stages are unloaded.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from av_infer.errors import (
    AvInferError,
    DeadlineMissedError,
    DeviceFaultError,
    InvalidParameterError,
    RuntimeClosedError,
    UnknownModelError,
)
from av_infer.pipeline.batcher import Dispatch, ReservationBatcher
from av_infer.pipeline.cluster import Cluster
from av_infer.pipeline.errors import StageFailedError
from av_infer.pipeline.lanes import Lane, StageSpec
from av_infer.pipeline.planner import ClusterPlan
from av_infer.pipeline.reservation import COMPUTE, ReservationTables, Route, build_routes
from av_infer.profiles import BlockProfile

log = logging.getLogger(__name__)


@dataclass
class _Request:
    rid: int
    model: str
    inputs: dict[str, np.ndarray]
    arrival: float
    deadline: float
    priority: str
    future: Future = field(default_factory=Future)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _done: bool = False

    def finish(self, value: Any = None, exc: BaseException | None = None) -> bool:
        """Resolve once; later calls are ignored (and say so)."""
        with self._lock:
            if self._done:
                return False
            self._done = True
        if exc is not None:
            self.future.set_exception(exc)
        else:
            self.future.set_result(value)
        return True


@dataclass
class _Generation:
    """One plan in service: its routes, tables, batcher and stage names."""

    gen: int
    plan: ClusterPlan
    batcher: ReservationBatcher
    routes: list[Route]
    lane_of: list[Lane]  # table compute index -> lane
    stages: list[tuple[Lane, str]]
    inflight: int = 0


def stage_name(model: str, gen: int, first: int, end: int) -> str:
    return f"{model}@{gen}[{first}:{end}]"


class PipelineExecutor:
    """Serve ``plan`` on ``lanes`` (the plan's physical devices ``type#i`` are the live
    lanes in order). ``replan(cluster)``: the planner to call when a lane dies, with the
    cluster less the dead lanes (and ``weights=``, the observed mix, from
    :meth:`replan_for_load`); its plan is migrated to (None: no re-planning)."""

    def __init__(self, plan: ClusterPlan, profiles: Mapping[str, Mapping[str, BlockProfile]],
                 cluster: Cluster, lanes: Sequence[Lane], variant: str = "scaled",
                 n_blocks: int = 10, priority: str = "BE",
                 replan: Callable[..., ClusterPlan] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if priority not in ("RT", "BE"):
            raise InvalidParameterError(f"priority must be 'RT' or 'BE', got {priority!r}")
        self.profiles = profiles
        self.cluster = cluster
        self.variant = variant
        self.n_blocks = int(n_blocks)
        self.lanes = list(lanes)
        self.replan = replan
        self._dead: set[str] = set()
        self._replan_lock = threading.Lock()  # one re-plan at a time (it waits for loads)
        self._dead_lock = threading.Lock()
        self._arrivals: dict[str, int] = {}  # per model since the current plan
        self.late = 0  # answered with outputs after their deadline
        self.answered = 0
        for lane in self.lanes:  # lanes that notice their own death (RemoteLane) say so
            if hasattr(lane, "on_death"):
                lane.on_death.append(self.lane_failed)
        self.priority = priority
        self.clock = clock
        self._ids = itertools.count(1)
        self._cv = threading.Condition()
        self._inbox: list[tuple[Any, ...]] = []
        self._closed = False
        self._gens: dict[int, _Generation] = {}
        self._pending: dict[int, _Request] = {}
        self._gen_ids = itertools.count(1)
        self._current = self._prepare(plan)
        self.replans = 0
        self._thread = threading.Thread(target=self._loop, name="pipeline-batcher",
                                        daemon=True)
        self._thread.start()

    # -- plans --------------------------------------------------------------------------
    @property
    def plan(self) -> ClusterPlan:
        return self._current.plan

    def _prepare(self, plan: ClusterPlan) -> _Generation:
        """Build routes and load every stage on every member (the 'preload' step)."""
        gen = next(self._gen_ids)
        link_of = {t.name: (t.link_gbps, t.link_us) for t in self.cluster.types}
        routes, cids, pids = build_routes(plan, self.profiles, link_of)
        # real lanes are of one type (cpu): the plan's device type#i is the i-th live lane
        alive = [ln for ln in self.lanes if ln.alive and ln.name not in self._dead]
        phys_lane = {f"{t}#{i}": lane for t in plan.physical for i, lane in enumerate(alive)}
        try:
            lane_of = [phys_lane[c.split("/")[0]] for c in cids]
        except KeyError as e:
            raise InvalidParameterError(f"plan uses device {e.args[0]}, which has no live "
                                        "lane") from None
        stages: list[tuple[Lane, str]] = []
        for p in plan.pipelines:
            for s in p.stages:
                name = stage_name(p.model, gen, s.first, s.end)
                spec = StageSpec(p.model, self.variant, self.n_blocks, s.first, s.end)
                for mid in s.members:
                    lane = phys_lane[mid.split("/")[0]]
                    if (lane, name) not in stages:
                        lane.load(name, spec)
                        stages.append((lane, name))
        g = _Generation(gen, plan, ReservationBatcher(routes, ReservationTables(len(cids),
                                                                                 len(pids))),
                        routes, lane_of, stages)
        self._gens[gen] = g
        return g

    def migrate(self, plan: ClusterPlan) -> None:
        """Switch to ``plan``: preload its stages, move queued requests over, let the old
        plan's in-flight requests finish, then unload the old stages. Loses nothing."""
        new = self._prepare(plan)
        with self._cv:
            old = self._current
            self._current = new
            for m in list(old.batcher.queues):
                for q in old.batcher.drain(m):
                    self._requeue(q.rid)
            self._cv.notify()
        self._retire(old)

    def _retire(self, old: _Generation) -> None:
        def unload_when_idle() -> None:
            with self._cv:
                while old.inflight > 0 and not self._closed:
                    self._cv.wait(0.5)
            for lane, name in old.stages:
                if lane.alive:
                    try:
                        lane.unload(name)
                    except AvInferError as e:  # already gone: nothing to free
                        log.debug("unload %s: %s", name, e)
            self._gens.pop(old.gen, None)

        threading.Thread(target=unload_when_idle, name="pipeline-retire", daemon=True).start()

    # -- requests -----------------------------------------------------------------------
    def submit(self, model: str, inputs: Mapping[str, np.ndarray],
               deadline_s: float | None = None) -> Future:
        """Queue one request; its future resolves to the model's outputs or a typed error.
        ``deadline_s``: relative; default the plan's SLO for ``model``."""
        now = self.clock()
        slo = self.plan.slo_ms.get(model)
        rel = float(deadline_s) if deadline_s is not None else (slo / 1e3 if slo else math.inf)
        req = _Request(next(self._ids), model, dict(inputs), now, now + rel, self.priority)
        if self._closed:
            req.finish(exc=RuntimeClosedError("pipeline executor is closed"))
            return req.future
        if model not in self._current.batcher.queues:
            req.finish(exc=UnknownModelError(f"no pipeline serves {model!r}; planned: "
                                             f"{sorted(self._current.batcher.queues)}"))
            return req.future
        with self._cv:
            self._arrivals[model] = self._arrivals.get(model, 0) + 1
            self._pending[req.rid] = req
            self._current.batcher.submit(model, req.rid, now, req.deadline)
            self._inbox.append(("step", model))
            self._cv.notify()
        return req.future

    def _requeue(self, rid: int) -> None:
        req = self._pending.get(rid)
        if req is not None:
            self._current.batcher.submit(req.model, rid, req.arrival, req.deadline)
            self._inbox.append(("step", req.model))

    # -- the batcher's thread -----------------------------------------------------------
    def _loop(self) -> None:
        wakes: dict[str, float] = {}
        while True:
            with self._cv:
                while not self._inbox and not self._closed:
                    nxt = min(wakes.values(), default=None)
                    timeout = None if nxt is None else max(0.0, nxt - self.clock())
                    if timeout == 0.0:
                        break
                    self._cv.wait(timeout)
                if self._closed:
                    return
                inbox, self._inbox = self._inbox, []
                g = self._current
                now = self.clock()
                todo = {m for kind, *rest in inbox if kind == "step" for m in rest}
                for kind, *rest in inbox:
                    if kind == "feedback":
                        gen, k, idx, rend, aend = rest
                        if gen in self._gens:
                            self._gens[gen].batcher.tables.correct(k, idx, rend, aend)
                todo |= {m for m, t in wakes.items() if t <= now}
                actions = []
                for m in todo:
                    wakes.pop(m, None)
                    if m not in g.batcher.queues:
                        continue
                    acts, wake = g.batcher.step(m, now)
                    actions.extend(acts)
                    if wake is not None:
                        wakes[m] = wake
                for a in actions:
                    if isinstance(a, Dispatch):
                        g.inflight += len(a.requests)
            for a in actions:  # outside the lock: lanes may call back at once
                if isinstance(a, Dispatch):
                    self._start(g, a, now)
                else:
                    req = self._pending.pop(a.request.rid, None)
                    if req is not None:
                        req.finish(exc=DeadlineMissedError(
                            f"pipeline {req.model}: no pipeline could finish request "
                            f"{req.rid} by its deadline; dropped"))

    def _start(self, g: _Generation, d: Dispatch, now: float) -> None:
        reqs = [self._pending.get(q.rid) for q in d.requests]
        route = d.probe.route
        compute = [r for r in d.probe.resv if r[0] == COMPUTE]
        left = [len(reqs)] * len(route.members)
        for req in reqs:
            if req is None:  # resolved meanwhile (close)
                self._done_inflight(g)
                continue
            self._stage(g, d, req, 0, req.inputs, compute, left)

    def _stage(self, g: _Generation, d: Dispatch, req: _Request, s: int,
               inputs: Mapping[str, np.ndarray], compute: list, left: list[int]) -> None:
        route = d.probe.route
        st = route.plan.stages[s]
        lane = g.lane_of[d.probe.path[s]]
        name = stage_name(route.model, g.gen, st.first, st.end)
        try:
            fut = lane.run(name, inputs, req.priority, req.deadline - self.clock())
        except AvInferError as e:
            fut = Future()
            fut.set_exception(e)

        def done(f: Future) -> None:
            left[s] -= 1
            if left[s] == 0:  # the batch's last request left this stage: feedback
                _, idx, _, rend = compute[s]
                t = self.clock()
                with self._cv:
                    self._inbox.append(("feedback", g.gen, COMPUTE, idx, rend, t))
                    self._cv.notify()
            exc = f.exception()
            if exc is not None:
                if isinstance(exc, (DeviceFaultError, RuntimeClosedError)) \
                        and not isinstance(exc, StageFailedError):
                    exc = StageFailedError(f"stage {name} on {lane.name}: {exc}")
                self._end(g, req, exc=exc)
                if not lane.alive:
                    self.lane_failed(lane)
            elif s + 1 == len(route.members):
                self._end(g, req, value=f.result())
            else:
                out = f.result()
                if g.plan.fp16_boundaries:
                    out = {k: v.astype(np.float16) if v.dtype == np.float32 else v
                           for k, v in out.items()}
                self._stage(g, d, req, s + 1, out, compute, left)

        fut.add_done_callback(done)

    def _end(self, g: _Generation, req: _Request, value: Any = None,
             exc: BaseException | None = None) -> None:
        self._pending.pop(req.rid, None)
        if exc is None and self.clock() > req.deadline:
            self.late += 1
        if req.finish(value, exc):
            self.answered += 1
        self._done_inflight(g)

    def _done_inflight(self, g: _Generation) -> None:
        with self._cv:
            g.inflight -= 1
            self._cv.notify_all()

    # -- load changes -----------------------------------------------------------------------
    def replan_for_load(self, min_change: float = 0.25) -> bool:
        """Re-plan for the mix of arrivals since the current plan when it moved from the
        plan's mix by more than ``min_change`` (total variation distance of the shares),
        then migrate (nothing is lost). Runs in the caller's thread, off the request path
        (call it from a timer). Returns whether it re-planned."""
        if self.replan is None:
            raise InvalidParameterError("no planner: construct the executor with replan=")
        with self._cv:
            seen = dict(self._arrivals)
        total = sum(seen.values())
        planned = self.plan.rate
        ptotal = sum(planned.values()) or 1.0
        if total == 0:
            return False
        dist = 0.5 * sum(abs(seen.get(m, 0) / total - planned.get(m, 0.0) / ptotal)
                         for m in set(seen) | set(planned))
        if dist <= min_change:
            return False
        weights = {m: max(seen.get(m, 0) / total, 0.01) for m in planned}
        with self._replan_lock:
            plan = self.replan(self.cluster, weights=weights)
            self.migrate(plan)
            with self._cv:
                self._arrivals = {}
            self.replans += 1
        return True

    # -- failures -------------------------------------------------------------------------
    def lane_failed(self, lane: Lane) -> None:
        """``lane`` died: (once per lane) re-plan onto the live lanes and migrate, off the
        caller's thread. Requests it held already failed with ``stage_failed``."""
        with self._dead_lock:  # never the re-plan lock: callers are lane callback threads
            if lane.name in self._dead or self._closed:
                return
            self._dead.add(lane.name)
        if self.replan is None:
            return
        threading.Thread(target=self._replan_after, args=(lane,), name="pipeline-replan",
                         daemon=True).start()

    def _replan_after(self, lane: Lane) -> None:
        with self._replan_lock:
            t = self.cluster.types[0].name
            with self._dead_lock:
                dead = set(self._dead)
            alive = sum(1 for ln in self.lanes if ln.alive and ln.name not in dead)
            if alive == 0:
                log.error("pipeline: no live lane left; cannot re-plan")
                return
            self.cluster = Cluster(((t, alive),), self.cluster.defs)  # keeps its links
            try:
                assert self.replan is not None
                plan = self.replan(self.cluster)
                self.lanes = [ln for ln in self.lanes if ln.name not in dead]
                self.migrate(plan)
                self.replans += 1
            except AvInferError as e:
                log.error("pipeline: re-plan onto %s failed: %s", self.cluster.spec(), e)

    # -- lifecycle ------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        g = self._current
        return {"generation": g.gen, "pending": len(self._pending), "inflight": g.inflight,
                "probes": g.batcher.probes, "replans": self.replans, "late": self.late,
                "answered": self.answered}

    def close(self) -> None:
        """Stop; every request not answered yet fails with RuntimeClosedError."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=10)
        for req in list(self._pending.values()):
            req.finish(exc=RuntimeClosedError("pipeline executor closed"))
        self._pending.clear()

