"""Resource-reservation adaptive batching (PPipe §5.4, Algorithm 1).

Per model, pending requests wait in arrival order. ``step()`` repeats: (1) probe every
pooled pipeline of the model at its unified batch size and take the one that waits least
for resources; (2) on it, take the largest batch size whose probed finish meets the oldest
request's deadline; then one of three outcomes:

* no batch size meets it: the oldest request is dropped (``Drop``: answered with a
  ``deadline_missed`` error) and the loop starts over;
* fewer requests are pending than that batch size: wait, at most until the last moment
  at which the pending ones still finish in time (``step`` returns that moment); at that
  moment the pending requests go as a smaller batch;
* otherwise the probe's resources are reserved and the oldest requests dispatched
  (``Dispatch``).

The batcher owns the queues; :class:`~.reservation.ReservationTables` owns the tables. It
never reads a clock: the caller passes ``now`` (the simulator's virtual time or the
executor's wall clock), so both drive the same code.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from av_infer.pipeline.reservation import Probe, ReservationTables, Route

#: a wake-up this close to the last safe moment counts as having reached it
_EPS = 1e-9


@dataclass
class Pending:
    rid: Any
    arrival: float
    deadline: float


@dataclass
class Dispatch:
    probe: Probe
    requests: list[Pending]


@dataclass
class Drop:
    request: Pending


class ReservationBatcher:
    """Algorithm 1 over ``routes`` (grouped by model) and one set of ``tables``."""

    def __init__(self, routes: Sequence[Route], tables: ReservationTables) -> None:
        self.tables = tables
        self.routes: dict[str, list[Route]] = {}
        for r in routes:
            self.routes.setdefault(r.model, []).append(r)
        self.queues: dict[str, deque[Pending]] = {m: deque() for m in self.routes}
        self.probes = 0  # probe() calls, for the overhead figure

    def models(self) -> list[str]:
        return list(self.routes)

    def submit(self, model: str, rid: Any, arrival: float, deadline: float) -> None:
        self.queues[model].append(Pending(rid, arrival, deadline))

    def pending(self, model: str) -> int:
        return len(self.queues[model])

    def drain(self, model: str | None = None) -> list[Pending]:
        """Remove and return every pending request (of ``model``, or all): for a flush."""
        out: list[Pending] = []
        for m, q in self.queues.items():
            if model is None or m == model:
                out.extend(q)
                q.clear()
        return out

    def step(self, model: str, now: float) -> tuple[list[Dispatch | Drop], float | None]:
        """Decide what ``model``'s queue does at ``now``: the actions, and when to call
        again if requests are left waiting (the last safe moment), else None."""
        q = self.queues[model]
        routes = self.routes[model]
        tables = self.tables
        actions: list[Dispatch | Drop] = []
        while q:
            best: Probe | None = None
            for r in routes:  # step 1: the pipeline that waits least at its unified batch
                p = tables.probe(r, r.batch, now)
                self.probes += 1
                if best is None or p.wait < best.wait:
                    best = p
            assert best is not None
            route, head = best.route, q[0]
            chosen: Probe | None = None
            for bs in route.batches:  # step 2: the largest batch that meets the deadline
                p = best if bs == route.batch else tables.probe(route, bs, now)
                if bs != route.batch:
                    self.probes += 1
                if p.finish <= head.deadline:
                    chosen = p
                    break
            if chosen is None:
                actions.append(Drop(q.popleft()))
                continue
            if len(q) < chosen.batch:
                last_safe = head.deadline - (chosen.finish - now)
                if now + _EPS < last_safe:
                    return actions, last_safe
                # the last safe moment: send what is pending, timed as the smallest
                # profiled batch that holds it
                fit = min(b for b in route.batches if b >= len(q))
                if fit != chosen.batch:
                    p = tables.probe(route, fit, now)
                    self.probes += 1
                    if p.finish <= head.deadline:
                        chosen = p
            n = min(len(q), chosen.batch)
            tables.reserve(chosen, now)
            actions.append(Dispatch(chosen, [q.popleft() for _ in range(n)]))
        return actions, None

