"""The data plane's resource tables, ``probe()`` and ``reserve()`` (PPipe §5.4, App. A.3).

One :class:`ReservationTables` owns, for every virtual device of a plan, the time its
compute is reserved until, and for every physical device the times its uplink and
downlink are reserved until (virtual devices of one physical device share its links:
PPipe's network contention). ``probe()`` walks a pooled pipeline stage by stage and picks
in each pool the member that finishes the stage earliest, counting the feature-map
transfer, which needs the previous member's uplink and this member's downlink at the same
time (Algorithm 2). It changes nothing; ``reserve()`` books what a probe returned;
``correct()`` applies the feedback of an actual completion time.

A resource's table is its list of reserved intervals; a probe back-fills gaps (a later
stage's reservations sit in the future, so its members' timelines have holes earlier
work can use). Where a resource's last reservation has ended the probe needs no search,
which keeps stage 0 and an unloaded cluster at a few vector operations.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from av_infer.pipeline.planner import ClusterPlan, PipelinePlan
from av_infer.pipeline.profile_files import batches_at
from av_infer.profiles import BlockProfile

COMPUTE, UPLINK, DOWNLINK = 0, 1, 2


@dataclass
class Route:
    """A pooled pipeline as the data plane sees it: per stage the table indices of its
    members, their physical devices, and per batch size the stage and transfer times (s)."""

    index: int
    model: str
    batch: int
    members: list[np.ndarray]  # per stage: compute indices
    phys: list[np.ndarray]  # per stage: physical-device indices (link tables)
    stage_s: dict[int, list[float]]  # batch -> per-stage compute seconds
    xfer_s: dict[int, list[float]]  # batch -> per-stage transfer seconds to the next stage
    plan: PipelinePlan

    @property
    def batches(self) -> list[int]:
        """Batch sizes this route may run, largest first (<= the unified batch size)."""
        return sorted((b for b in self.stage_s if b <= self.batch), reverse=True)


@dataclass
class Probe:
    """What ``probe()`` found: the member per stage, the reservations
    ``(kind, index, start, end)`` to book, the finish time and the time spent waiting."""

    route: Route
    batch: int
    path: list[int]
    resv: list[tuple[int, int, float, float]]
    finish: float
    wait: float


class _Timeline:
    """One resource's reserved intervals, sorted and disjoint (``starts``/``ends``)."""

    __slots__ = ("starts", "ends")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def conflict(self, t: float, dur: float) -> float | None:
        """The end of the first interval overlapping ``[t, t + dur)``, else None."""
        i = bisect_right(self.ends, t)
        if i < len(self.starts) and self.starts[i] < t + dur:
            return self.ends[i]
        return None

    def first_fit(self, t: float, dur: float) -> float:
        """The earliest time >= ``t`` at which this resource is free for ``dur``: one
        forward walk over the intervals from ``t`` (what repeated :meth:`conflict` calls
        find, without a bisection per interval passed)."""
        starts, ends = self.starts, self.ends
        i = bisect_right(ends, t)
        n = len(starts)
        while i < n and starts[i] < t + dur:
            if ends[i] > t:
                t = ends[i]
            i += 1
        return t

    def add(self, start: float, end: float) -> None:
        i = bisect_right(self.starts, start)
        self.starts.insert(i, start)
        self.ends.insert(i, end)

    def prune(self, before: float) -> None:
        i = bisect_right(self.ends, before)
        if i > 64:  # amortised: drop the past in chunks
            del self.starts[:i]
            del self.ends[:i]

    def correct(self, reserved_end: float, actual_end: float) -> None:
        """The interval ending at ``reserved_end`` ended at ``actual_end``: later ones it
        now overlaps are pushed back (the device runs them after it)."""
        i = bisect_left(self.ends, reserved_end)
        if i >= len(self.ends) or self.ends[i] != reserved_end:
            return  # pruned, or already corrected
        self.ends[i] = actual_end
        for j in range(i + 1, len(self.starts)):
            if self.starts[j] >= self.ends[j - 1]:
                break
            d = self.ends[j - 1] - self.starts[j]
            self.starts[j] += d
            self.ends[j] += d


class ReservationTables:
    """Reserved intervals of every compute slot and link of a plan (see module doc).

    ``until[kind][i]`` (numpy) is the end of the resource's last reservation: where it is
    in the past the resource is free and a probe needs no interval search (the common
    case at stage 0); otherwise ``earliest_slot`` walks the resources' timelines and
    back-fills gaps, as PPipe's ``earliestSlot``.
    """

    def __init__(self, n_compute: int, n_phys: int) -> None:
        self.until = (np.zeros(n_compute), np.zeros(n_phys), np.zeros(n_phys))
        self.compute, self.up, self.down = self.until
        self.lines = ([_Timeline() for _ in range(n_compute)],
                      [_Timeline() for _ in range(n_phys)],
                      [_Timeline() for _ in range(n_phys)])

    def earliest_slot(self, res: Sequence[tuple[int, int]], t: float, dur: float) -> float:
        """The earliest time >= ``t`` at which every ``(kind, index)`` in ``res`` is free
        for ``dur`` (Algorithm 2's earliestSlot)."""
        lines = [self.lines[k][i] for k, i in res if self.until[k][i] > t]
        if len(lines) == 1:
            return lines[0].first_fit(t, dur)
        while True:  # each line's first fit from t, until no line moves t
            t0 = t
            for line in lines:
                t = line.first_fit(t, dur)
            if t == t0:
                return t

    def probe(self, route: Route, batch: int, now: float) -> Probe:
        """Algorithm 2's probe(): the earliest-finishing path of ``route`` at ``batch``.
        Pure: it reads the tables and books nothing."""
        lat, xfer = route.stage_s[batch], route.xfer_s[batch]
        comp_until, up_until, down_until = self.until
        t = now
        wait = 0.0
        path: list[int] = []
        resv: list[tuple[int, int, float, float]] = []
        prev_phys = -1
        for s, members in enumerate(route.members):
            li = lat[s]
            if s == 0:
                # a first stage's reservations are booked at max(now, until) back to back,
                # so its timelines have no holes to search
                until = comp_until[members]
                j = int(np.argmin(until))
                st = max(t, float(until[j]))
                wait += st - t
                resv.append((COMPUTE, int(members[j]), st, st + li))
            else:
                ln = xfer[s - 1]
                phys = route.phys[s]
                free = np.flatnonzero((down_until[phys] <= t) & (comp_until[members] <= t + ln))
                if free.size and up_until[prev_phys] <= t:
                    j, t_net = int(free[0]), t
                    st = t + ln
                else:
                    best, j, t_net, st = math.inf, 0, t, t
                    for k, m in enumerate(members):
                        tn = self.earliest_slot(((UPLINK, prev_phys), (DOWNLINK, int(phys[k]))),
                                                t, ln)
                        c = self.earliest_slot(((COMPUTE, int(m)),), tn + ln, li)
                        if c < best:
                            best, j, t_net, st = c, k, tn, c
                            if c <= t + ln:
                                break  # nothing can start earlier
                wait += (t_net - t) + (st - t_net - ln)
                resv.append((UPLINK, prev_phys, t_net, t_net + ln))
                resv.append((DOWNLINK, int(phys[j]), t_net, t_net + ln))
                resv.append((COMPUTE, int(members[j]), st, st + li))
            t = st + li
            path.append(int(members[j]))
            prev_phys = int(route.phys[s][j])
        return Probe(route, batch, path, resv, t, wait)

    def reserve(self, probe: Probe, now: float | None = None) -> None:
        """Algorithm 2's reserve(): book every interval of ``probe``."""
        for kind, idx, start, end in probe.resv:
            line = self.lines[kind][idx]
            line.add(start, end)
            until = self.until[kind]
            if end > until[idx]:
                until[idx] = end
            if now is not None:
                line.prune(now)

    def correct(self, kind: int, idx: int, reserved_end: float, actual_end: float) -> None:
        """Feedback correction: a reservation ending at ``reserved_end`` actually ended at
        ``actual_end``; later reservations it now overlaps shift back, an early end frees
        its gap."""
        line = self.lines[kind][idx]
        line.correct(reserved_end, actual_end)
        self.until[kind][idx] = line.ends[-1] if line.ends else actual_end


def build_routes(plan: ClusterPlan, profiles: Mapping[str, Mapping[str, BlockProfile]],
                 link_of: Mapping[str, tuple[float, float]],
                 gpus_per_server: Mapping[str, int] | None = None,
                 ) -> tuple[list[Route], list[str], list[str]]:
    """Routes of every pipeline of ``plan``; the compute ids and link ids, in table
    order. ``link_of``: device type -> (Gbit/s, per-transfer us); transfers are half as
    long when the plan sends float16 feature maps. ``gpus_per_server``: device type ->
    devices per server; the devices of one server share its uplink and downlink (link
    id ``type@server``), else each physical device has its own (link id ``type#i``)."""
    compute_ids: list[str] = []
    phys_ids: list[str] = []
    cidx: dict[str, int] = {}
    pidx: dict[str, int] = {}
    routes = []
    scale = 0.5 if plan.fp16_boundaries else 1.0
    for r, p in enumerate(plan.pipelines):
        members, phys = [], []
        for st in p.stages:
            mi, pi = [], []
            for mid in st.members:
                cidx.setdefault(mid, len(compute_ids))
                if cidx[mid] == len(compute_ids):
                    compute_ids.append(mid)
                ph = mid.split("/")[0]
                gps = (gpus_per_server or {}).get(st.device_type, 1)
                if gps > 1:
                    ph = f"{st.device_type}@{int(ph.split('#')[1]) // gps}"
                if ph not in pidx:
                    pidx[ph] = len(phys_ids)
                    phys_ids.append(ph)
                mi.append(cidx[mid])
                pi.append(pidx[ph])
            members.append(np.array(mi, dtype=np.int64))
            phys.append(np.array(pi, dtype=np.int64))
        stage_s: dict[int, list[float]] = {}
        xfer_s: dict[int, list[float]] = {}
        by_type = profiles[p.model]
        batches = sorted(set.intersection(*(set(batches_at(by_type[s.device_type], s.v))
                                            for s in p.stages)))
        for b in batches:
            stage_s[b] = [sum(by_type[s.device_type].latency(s.v, b)[s.first:s.end]) / 1e6
                          for s in p.stages]
            xs = []
            for a, c in zip(p.stages, p.stages[1:]):
                gbps = min(link_of[a.device_type][0], link_of[c.device_type][0])
                us = max(link_of[a.device_type][1], link_of[c.device_type][1])
                nbytes = by_type[a.device_type].out_bytes[a.end - 1] * b * scale
                xs.append((us + nbytes * 8 / (gbps * 1e3)) / 1e6)
            xfer_s[b] = [*xs, 0.0]
        routes.append(Route(r, p.model, p.batch, members, phys, stage_s, xfer_s, p))
    return routes, compute_ids, phys_ids


def physical_of(compute_ids: Sequence[str]) -> list[str]:
    return [c.split("/")[0] for c in compute_ids]
