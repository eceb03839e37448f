"""A policy switch takes effect on every decision that reads the policy.

The scheduler holds one live ``Policy`` (compiled: a typed ``cdef class`` whose flags the
decisions read as C fields, ``policies.pxd``; no copies of them beside it) and
``set_policy`` is its one writer. A switch that left any decision reading the old policy
(a copy kept somewhere, a device setting not reapplied) would show here: every decision
of a runtime switched from each other policy to ``target`` (before any request, through
``set_policy``) must be the decision of a runtime built with ``target``, on a workload
where policies differ (RT arrivals while BE runs: preemption, exclusivity, stream
priority, BE beside RT, padding). Virtual time (the simulator): exact.
"""

from __future__ import annotations

import dataclasses

import pytest

from av_infer.devices.sim import SimDevice
from av_infer.model.plan import Geometry, Kernel, Plan
from av_infer.profiles import KernelProfile, ModelProfile
from av_infer.runtime import Runtime
from av_infer.sched.policies import POLICIES
from av_infer.sched.request import Priority

US = 1e-6
NAMES = [n for n, p in POLICIES.items() if p.available]


def _model(name: str, n: int, dur_us: float, blocks: int) -> tuple[Plan, ModelProfile]:
    g = Geometry((blocks, 1, 1), (256, 1, 1))
    plan = Plan(name, [Kernel(i, "trace", f"k{i}", (), (), {}, g) for i in range(n)],
                {}, {}, [], [], reuse_guard=n + 1)
    prof = ModelProfile(name, "mi50", 60, [
        KernelProfile(i, f"k{i}", dur_us, blocks, 256, blocks_per_sm=4) for i in range(n)])
    return plan, prof


def _num(v: object) -> object:
    """A payload value, comparable: floats rounded, nan as a word (nan != nan)."""
    if isinstance(v, float):
        return "nan" if v != v else round(v, 12)
    return v


def _trace(policy: str, switch_to: str | None = None) -> list:
    """Every scheduler event (kernels included) of a fixed workload, times rounded."""
    # BE kernels shorter than RT's, which leave SMs free: padding has candidates
    be, p_be = _model("be", 12, 100.0, 200)
    rtm, p_rt = _model("rtm", 10, 200.0, 30)
    dev = SimDevice("mi50", {"be": p_be, "rtm": p_rt})
    rt = Runtime(device=dev, policy=policy, c=4)
    if switch_to is not None:
        rt.set_policy(switch_to)
        assert rt.policy == switch_to
    events: list = []
    rt.add_listener(lambda kind, p: events.append(
        (kind, tuple(sorted((k, _num(v)) for k, v in p.items())))))
    rt.load_model("be", be)
    rt.load_model("rtm", rtm)
    futs = [rt.submit("be", {}, priority=Priority.BE, client=f"c{i}") for i in range(3)]
    for i, at in enumerate((120.0, 130.0, 900.0, 5000.0)):
        dev.call_at(at * US, lambda i=i: futs.append(
            rt.submit("rtm", {}, priority=Priority.RT, deadline=dev.now() + 5e-3 * (4 - i))))
    dev.run()
    outcome = []
    for f in futs:
        e = f.exception()
        outcome.append(type(e).__name__ if e is not None else "ok")
    rt.close()
    return [events, outcome]


@pytest.fixture(scope="module")
def direct() -> dict[str, list]:
    return {n: _trace(n) for n in NAMES}


def test_policies_decide_differently_here(direct: dict[str, list]) -> None:
    """The workload tells the policies apart (else the switch test below proves nothing)."""
    assert len({repr(t) for t in direct.values()}) == len(NAMES)


@pytest.mark.parametrize("target", NAMES)
def test_switching_to_a_policy_decides_as_that_policy(direct: dict[str, list],
                                                      target: str) -> None:
    for start in NAMES:
        if start != target:
            assert _trace(start, target) == direct[target], (start, target)


def test_the_policy_is_read_only_outside_set_policy() -> None:
    """``set_policy`` is the one way to change it, and the policy itself is frozen."""
    rt = Runtime(device=SimDevice("mi50"), policy="reef")
    with pytest.raises(AttributeError):
        rt._sched.policy = POLICIES["seq"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        rt._sched.policy.accepts_be = False  # type: ignore[misc]
    assert rt.policy == "reef" and rt._sched.policy is POLICIES["reef"]
    rt.close()
