"""Coalesced completions (``Completion.count`` > 1) leave the scheduler exactly where the
same completions one by one leave it (docs/request_path.md, "Coalesced completions").

The rig is the simulator in virtual time behind a device wrapper that holds completions and
hands them over in batches (seeded sizes and delays, as a completion thread that falls behind
a GPU does; half of the batches stream by stream, as the dispatcher's passes fill its ring).
Each seed runs twice with the same batches: once delivering every held completion as its
own record, once merging them as ``Dispatcher.poll(coalesce=True)`` does (consecutive, one
stream and task, contiguous kernels, the same ``executed``, no padded launch, the stream's
flag down). Every answer (all request timings, errors), the scheduler's statistics, its
"kernel" listener events and the device's launch record must be identical; the runs cover
preemption and restore (reef), padding (reef_dkp), EDF take-over and the wait baseline.
The cuda device's side (the dispatcher merging its ring, the drain booking a record once)
is checked on the emulator in tests/devices/test_cuda_coalesce.py.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from av_infer.devices.base import Completion
from av_infer.devices.sim import SimDevice
from av_infer.runtime import Runtime
from av_infer.sched.request import Priority
from tests.sched.test_dkp import synthetic

US = 1e-6


class Batching(SimDevice):
    """The simulator, its completions held and delivered in seeded batches."""

    coalesces = True

    def __init__(self, profiles: dict, seed: int, merge: bool) -> None:
        super().__init__("mi50", profiles)
        self.rng = random.Random(seed)
        self.merge = merge
        #: every third seed merges across a raised flag too (the device never does): the
        #: scheduler must stay exact on its own (evicted launches, preemption latency)
        self.strict = seed % 3 != 0
        self.held: list[Completion] = []
        self.gen = 0
        self.flags: set[int] = set()
        self.records = 0  # records delivered
        self.merged = 0  # records of several launches delivered
        self.launches: list[tuple] = []  # what the scheduler asked of the device

    def start(self, on_complete: Any, coalesce: bool = False) -> None:
        assert coalesce, "the engine asks a device that coalesces for coalesced records"
        self._deliver = on_complete
        self._size = self.rng.randint(1, 24)

        def hold(c: Completion) -> None:
            self.held.append(c)
            if len(self.held) >= self._size:
                self._flush(self.gen)
            elif len(self.held) == 1:
                gen = self.gen
                self.call_at(self.now() + self.rng.choice((0.0, 50.0, 200.0, 500.0)) * US,
                             lambda: self._flush(gen))

        super().start(hold)

    def _flush(self, gen: int) -> None:
        if gen != self.gen or not self.held:
            return
        self.gen += 1
        held, self.held = self.held, []
        self._size = self.rng.randint(1, 24)
        if self.rng.random() < 0.5:  # stream by stream, as the dispatcher's passes push them
            held.sort(key=lambda c: c.stream)  # (each stream's own order kept)
        for c in (self._merged(held) if self.merge else held):
            self.records += 1
            self.merged += c.count > 1
            self._deliver(c)

    def _merged(self, held: list[Completion]) -> list[Completion]:
        out: list[list[Completion]] = []
        for c in held:
            prev = out[-1] if out else None
            if (prev is not None and _plain(c) and _plain(prev[0])
                    and (c.stream not in self.flags or not self.strict)
                    and c.stream == prev[0].stream
                    and c.task == prev[0].task and c.kernel == prev[-1].kernel + 1
                    and c.executed == prev[0].executed):
                prev.append(c)
            else:
                out.append([c])
        recs = []
        for run in out:
            if len(run) == 1:
                recs.append(run[0])
                continue
            times = tuple(t for c in run for t in (c.t_start, c.t_end))
            recs.append(Completion(run[0].stream, run[0].task, run[0].kernel, run[0].executed,
                                   run[0].t_start, run[-1].t_end, count=len(run),
                                   times=times))
        return recs

    def set_preempt(self, stream: int, flag: bool) -> None:
        (self.flags.add if flag else self.flags.discard)(stream)
        self.launches.append(("flag", stream, bool(flag), self.now()))
        super().set_preempt(stream, flag)

    def enqueue(self, stream: int, task: int, first: int, last: int,
                wake: bool = True) -> None:
        self.launches.append(("enqueue", stream, task, first, last, self.now()))
        super().enqueue(stream, task, first, last, wake)

    def reset(self, stream: int) -> Any:
        info = super().reset(stream)
        self.launches.append(("reset", stream, repr(info), self.now()))
        return info


def _plain(c: Completion) -> bool:
    return not c.parts and math.isnan(c.t_stop) and math.isnan(c.cpu_s)


CASES = [  # (policy, Runtime keywords)
    ("reef", {}),
    ("reef", {"edf_preempt": True}),
    ("reef_dkp", {}),
    ("streams", {}),
    ("wait", {}),
]


def _run(seed: int, merge: bool, policy: str, kw: dict) -> tuple[str, Batching]:
    rt_plan, rt_prof = synthetic("rt", 6, 80.0, 30, 4)
    be_plan, be_prof = synthetic("be", 40, 30.0, 200, 4)
    be2_plan, be2_prof = synthetic("be2", 25, 45.0, 120, 4)
    dev = Batching({"rt": rt_prof, "be": be_prof, "be2": be2_prof}, seed, merge)
    rt = Runtime(device=dev, policy=policy, c=4, max_be_streams=2, **kw)
    events: list[tuple] = []
    if seed % 2:
        rt._sched.listeners = [lambda kind, p: events.append((kind, repr(p)))]
    for name, plan in (("rt", rt_plan), ("be", be_plan), ("be2", be2_plan)):
        rt.load_model(name, plan)
    arr = random.Random(seed * 7 + 1)
    futs = []

    def submit(model: str, prio: Priority, client: str, deadline_us: float | None) -> None:
        dl = None if deadline_us is None else dev.now() + deadline_us * US
        futs.append(rt.submit(model, {}, priority=prio, client=client, deadline=dl))

    t = 0.0
    for _ in range(arr.randint(8, 16)):  # BE clients, bursts
        t += arr.uniform(0, 400)
        m = arr.choice(("be", "be2"))
        dev.call_at(t * US, lambda m=m: submit(m, Priority.BE, m, None))
    t = 0.0
    for _ in range(arr.randint(5, 12)):  # RT requests, some with tight deadlines
        t += arr.uniform(50, 900)
        dl = arr.choice((None, 300.0, 5000.0))
        dev.call_at(t * US, lambda dl=dl: submit("rt", Priority.RT, "rt", dl))
    dev.run()
    answers = []
    for f in futs:
        e = f.exception()
        answers.append(repr(e) if e is not None else repr(f.result().timings))
    stats = rt.stats()
    dev.applied, dev.split = rt._sched.coalesced_applied, rt._sched.coalesced_split
    rt.close()
    stats.pop("device", None)  # the wrapper's own counters differ by design
    stats["cache"].pop("load_time_s", None)  # wall-clock seconds of model loads
    text = json.dumps({"answers": answers, "stats": stats, "events": events,
                       "launches": dev.launches}, sort_keys=True, default=repr)
    return text, dev


@pytest.mark.parametrize("policy,kw", CASES, ids=[f"{p}{'-edf' if k else ''}"
                                                   for p, k in CASES])
def test_coalesced_records_decide_exactly_as_single_ones(policy: str, kw: dict) -> None:
    merged = records = applied = 0
    for seed in range(12):
        one, dev1 = _run(seed, False, policy, kw)
        many, dev2 = _run(seed, True, policy, kw)
        assert dev1.merged == 0
        assert one == many, (policy, seed)
        merged += dev2.merged
        records += dev2.records
        applied += dev2.applied
        assert dev2.applied + dev2.split == dev2.merged
        assert json.loads(one)["answers"], "requests ran"
    # the rig really coalesced (else it would compare single records with themselves)
    # and the scheduler applied most of them at once (else it split them all)
    assert merged > 0.1 * records and applied > 0.5 * merged, (merged, applied, records)


def test_the_reef_runs_preempt_and_answer_every_request() -> None:
    """The equivalence above covers preemption and restore: the runs do preempt."""
    pre = 0
    for seed in range(12):
        text, _ = _run(seed, True, "reef", {})
        d = json.loads(text)
        pre += d["stats"]["preemptions"]
        assert all("Error" not in a for a in d["answers"]), d["answers"]
    assert pre > 0


def test_a_record_splits_into_the_single_records_it_stands_for() -> None:
    c = Completion(3, 7, 10, None, 1.0, 4.0, count=3, times=(1.0, 1.5, 2.0, 3.0, 3.5, 4.0))
    assert [(x.stream, x.task, x.kernel, x.executed, x.t_start, x.t_end, x.count)
            for x in c.singles()] == [(3, 7, 10, None, 1.0, 1.5, 1), (3, 7, 11, None, 2.0, 3.0, 1),
                                      (3, 7, 12, None, 3.5, 4.0, 1)]
    one = Completion(0, 1, 2, True, 0.0, 1.0)
    assert one.count == 1 and one.singles() == [one]
