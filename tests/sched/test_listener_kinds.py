"""Listeners that name the event kinds they want (``event_kinds``) get those kinds only,
the same payloads and in the same order as a listener of every kind sees them; the
"kernel" event (one per completion) is built only while some listener wants it; an
unknown kind is refused when the listeners are set; and ``EVENT_KINDS`` names every kind
the scheduler emits. The simulator in virtual time: exact and fast."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from av_infer.devices.sim import SimDevice
from av_infer.runtime import Runtime
from av_infer.sched import scheduler as scheduler_mod
from av_infer.sched.request import Priority
from av_infer.sched.scheduler import EVENT_KINDS
from tests.sched.test_dkp import synthetic

US = 1e-6


class Recorder:
    """A listener that records what it is called with; ``kinds`` None: every kind."""

    def __init__(self, kinds: set[str] | None = None) -> None:
        if kinds is not None:
            self.event_kinds = frozenset(kinds)
        self.seen: list[tuple[str, str]] = []

    def __call__(self, kind: str, payload: dict[str, Any]) -> None:
        self.seen.append((kind, repr(payload)))


def _run(listeners: list[Any]) -> Runtime:
    """RT and BE requests on the simulated MI50 under reef (preemptions, restores)."""
    rt_plan, rt_prof = synthetic("rt", 6, 80.0, 30, 4)
    be_plan, be_prof = synthetic("be", 40, 30.0, 200, 4)
    dev = SimDevice("mi50", {"rt": rt_prof, "be": be_prof})
    rt = Runtime(device=dev, policy="reef", c=4, max_be_streams=2)
    for fn in listeners:
        rt.add_listener(fn)
    rt.load_model("rt", rt_plan)
    rt.load_model("be", be_plan)
    futs = []
    for i in range(4):
        dev.call_at(i * 300 * US, lambda: futs.append(rt.submit("be", {}, priority=Priority.BE,
                                                                  client="be")))
    for i in range(6):
        dev.call_at((150 + i * 420) * US, lambda: futs.append(
            rt.submit("rt", {}, priority=Priority.RT, client="rt")))
    dev.run()
    assert len(futs) == 10 and all(f.result().outputs is not None for f in futs)
    return rt


def test_a_listener_gets_the_kinds_it_names_in_the_order_every_listener_sees_them() -> None:
    every = Recorder()
    some = Recorder({"preempt", "restore", "complete"})
    kernels = Recorder({"kernel"})
    rt = _run([every, some, kernels])
    rt.close()
    kinds = {k for k, _ in every.seen}
    assert {"arrival", "dispatch", "preempt", "restore", "kernel", "complete"} <= kinds
    assert some.seen == [e for e in every.seen if e[0] in some.event_kinds]
    assert kernels.seen == [e for e in every.seen if e[0] == "kernel"]


def test_no_kernel_listener_no_kernel_event_and_the_same_run() -> None:
    with_kernels, without = Recorder(), Recorder(EVENT_KINDS - {"kernel"})
    a = _run([with_kernels])
    b = _run([without])
    assert a._sched._kernel_listeners == (with_kernels,)
    assert b._sched._kernel_listeners == ()
    assert without.seen == [e for e in with_kernels.seen if e[0] != "kernel"]
    assert a.stats()["preemptions"] == b.stats()["preemptions"] > 0
    a.close()
    b.close()


def test_listeners_are_a_tuple_set_by_assignment_and_unknown_kinds_are_refused() -> None:
    rt = _run([])
    sched = rt._sched
    assert sched.listeners == () and sched._kernel_listeners == ()
    bad = Recorder({"kernel", "nope"})
    with pytest.raises(ValueError, match="nope"):
        sched.listeners = [bad]
    assert sched.listeners == ()  # refused: nothing changed
    ok = Recorder({"kernel"})
    sched.listeners = [ok]
    assert sched.listeners == (ok,) and sched._kernel_listeners == (ok,)
    with pytest.raises(AttributeError):
        sched.listeners.append(ok)  # type: ignore[attr-defined]
    rt.close()


def test_event_kinds_names_every_kind_the_scheduler_emits() -> None:
    src = (Path(scheduler_mod.__file__).parent / "scheduler.py").read_text()
    emitted = set(re.findall(r'_emit\("([a-z_]+)"', src))
    assert emitted and emitted == set(EVENT_KINDS)
