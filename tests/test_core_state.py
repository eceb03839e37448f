"""Issue 16's core defects, one test each: every piece of state has one owner, setters
validate-apply-publish, handler failures answer their requests, parked tasks and batching
go through a narrow interface, timers fire on time, queues are bounded.

The simulator (virtual time) drives the timing-dependent ones, so nothing here asserts on
wall-clock time."""

from __future__ import annotations

import ast
import threading
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from av_infer import Priority, Runtime
from av_infer.cache import ModelCache
from av_infer.devices.cpu import CpuDevice
from av_infer.devices.sim import SimDevice
from av_infer.errors import (
    DeadlineMissedError,
    DeviceFaultError,
    InvalidParameterError,
    RejectedError,
    UnknownModelError,
)
from av_infer.model import zoo
from av_infer.model.compiler import compile_model
from av_infer.model.plan import Geometry, Kernel, Plan
from av_infer.profiles import KernelProfile, ModelProfile

ROOT = Path(__file__).resolve().parents[1]
US = 1e-6


def long_plan(name: str, n: int, dur_us: float = 100.0) -> tuple[Plan, ModelProfile]:
    """``n`` kernels of ``dur_us`` filling the simulated GPU (as test_sim_scheduler)."""
    g = Geometry((240, 1, 1), (256, 1, 1))
    plan = Plan(name, [Kernel(i, "trace", f"k{i}", (), (), {}, g) for i in range(n)],
                {}, {}, [], [], reuse_guard=n + 1)
    prof = ModelProfile(name, "mi50", 60, [
        KernelProfile(i, f"k{i}", dur_us, 240, 256, blocks_per_sm=4) for i in range(n)])
    return plan, prof


def sim_runtime(dev: SimDevice | None = None, **kw) -> tuple[Runtime, SimDevice]:
    a, pa = long_plan("a", 10)
    b, pb = long_plan("b", 500)
    dev = dev or SimDevice("mi50", {"a": pa, "b": pb})
    dev.profiles.update({"a": pa, "b": pb})
    rt = Runtime(device=dev, **kw)
    rt.load_model("a", a)
    rt.load_model("b", b)
    return rt, dev


# -- defect 1: one capacity range, setters validate, apply, then publish ----------------------
def test_cuda_emu_wait_policy_uses_the_devices_own_capacity_range() -> None:
    """Was: ``Runtime("cuda-emu", policy="wait")`` raised an untyped ValueError (the
    scheduler asked for 4096 launches, the dispatcher ring holds 64) and ``set_policy``
    left the policy set to ``wait`` after raising."""
    pytest.importorskip("av_infer._cy.cuda_dispatch")
    with Runtime(device="cuda-emu", policy="wait") as rt:
        assert rt.policy == "wait"
        assert rt.c_range == (1, rt.device.max_capacity)
        rt.set_policy("reef")
        rt.set_policy("wait")
        assert rt.policy == "wait"


def test_set_c_out_of_the_device_range_is_refused_and_changes_nothing() -> None:
    """Was: ``set_c(100)`` on cuda-emu raised ValueError while ``rt.c`` reported 100 and
    the device kept 4."""
    pytest.importorskip("av_infer._cy.cuda_dispatch")
    with Runtime(device="cuda-emu", c=4) as rt:
        hi = rt.device.max_capacity
        with pytest.raises(InvalidParameterError, match=f"1..{hi}"):
            rt.set_c(hi + 1)
        assert rt.c == 4
        streams = rt.device.telemetry()["streams"]
        assert {s["capacity"] for s in streams} == {4}
    with pytest.raises(InvalidParameterError):
        Runtime(device="cuda-emu", c=hi + 1)


class _RefusingSim(SimDevice):
    """A device that refuses one capacity value after the runtime's checks passed."""

    refuse = 7

    def set_capacity(self, c: int) -> None:
        if c == self.refuse:
            raise RuntimeError("no")
        super().set_capacity(c)


def test_a_device_refusing_a_setting_leaves_the_published_one() -> None:
    rt, dev = sim_runtime(_RefusingSim("mi50"), c=4)
    with pytest.raises(DeviceFaultError, match="refused capacity 7"):
        rt.set_c(7)
    assert rt.c == 4
    assert all(s.vhq.c == 4 for s in dev._streams)
    f = rt.submit("a", {}, priority=Priority.BE)
    dev.run()
    assert f.result().outputs == {}
    rt.close()


# -- defect 4: a handler that raises answers its requests -----------------------------------
class _EnqueueFails(SimDevice):
    """Refuses the launches of one task (a device error inside the scheduler's handler)."""

    fail_task = -1

    def enqueue(self, stream, task, first, last, wake=True):  # noqa: ANN001
        if task == self.fail_task:
            raise RuntimeError("launch refused")
        return super().enqueue(stream, task, first, last, wake)


def test_a_launch_the_device_refuses_fails_its_request_and_nothing_else() -> None:
    """Was: the exception was logged and swallowed; the request stayed RUNNING with
    launches that never existed, so it was never answered and ``close()`` hung."""
    rt, dev = sim_runtime(_EnqueueFails("mi50"))
    dev.fail_task = 2  # request ids count from 1
    f1 = rt.submit("a", {}, priority=Priority.BE)
    f2 = rt.submit("a", {}, priority=Priority.RT)
    f3 = rt.submit("a", {}, priority=Priority.BE)
    dev.run()
    assert f1.result().outputs == {} and f3.result().outputs == {}
    with pytest.raises(DeviceFaultError, match="launch refused"):
        f2.result()
    rt.close()
    assert rt.stats()["clients"]["default"]["errors"] == {"device_fault": 1}


def test_a_handler_that_raises_fails_its_request_typed_and_is_counted() -> None:
    """Was: ``Scheduler.post`` logged every handler exception and went on, leaving the
    event's request unanswered."""
    rt, dev = sim_runtime()
    calls = []

    class Boom:
        """A queue bound whose comparison raises in the first arrival's handler, half-way
        (after the request was counted and its model referenced)."""

        def __le__(self, queued: object) -> bool:
            if not calls:
                calls.append(1)
                raise KeyError("half-applied")
            return False

        __ge__ = __le__

    # (the statistics, compiled, are C fields: no method of theirs can be replaced)
    rt._sched.max_queue_depth = Boom()
    f = rt.submit("a", {}, priority=Priority.RT)
    g = rt.submit("a", {}, priority=Priority.RT)
    dev.run()
    rt._sched.max_queue_depth = None
    with pytest.raises(DeviceFaultError, match="half-applied"):
        f.result()
    assert g.result().outputs == {}
    assert rt.stats()["handler_errors"] == {"arrival": 1}
    rt.close()


# -- defect 6: cache and batching through a narrow interface ----------------------------------
def test_model_services_never_reaches_into_the_scheduler() -> None:
    """Was: ModelServices wrote ``sched.tasks`` and the queues and called ``_fail`` and
    ``_answer`` (which called back into it)."""
    src = (ROOT / "av_infer/sched/model_services.py").read_text()
    tree = ast.parse(src)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "sched" not in names
    assert not attrs & {"tasks", "rt_queue", "be_queues", "_fail", "_answer", "device"}
    sched_src = (ROOT / "av_infer/sched/scheduler.py").read_text()
    assert "intercept_" not in sched_src


class _SlowLoad(CpuDevice):
    """load_plan blocks until released: a cold compile in the cache's loader thread."""

    def __init__(self) -> None:
        super().__init__(engine="numpy")
        self.started = threading.Event()
        self.release = threading.Event()
        self.unloaded: list[object] = []

    def load_plan(self, plan):  # noqa: ANN001
        self.started.set()
        self.release.wait(120)
        return super().load_plan(plan)

    def unload_plan(self, handle) -> None:  # noqa: ANN001
        self.unloaded.append(handle)
        super().unload_plan(handle)


def test_unregister_does_not_wait_for_a_running_load() -> None:
    """Was: ``ModelCache.unregister`` waited on the cache's condition until the load
    ended, on the scheduler's thread: a cold compile stalled scheduling."""
    a = compile_model(zoo.path("tiny_cnn"), name="a")
    dev = _SlowLoad()
    cache = ModelCache(dev, mode="thread")
    try:
        cache.register("a", a)
        fut = cache.ensure_resident("a")
        assert dev.started.wait(120), "the loader never started"
        done = threading.Event()

        def unregister() -> None:
            cache.unregister("a")
            done.set()

        th = threading.Thread(target=unregister, daemon=True)
        th.start()
        # the load is still blocked; unregister must return anyway
        finished = done.wait(60)
        dev.release.set()
        assert finished, "unregister waited for the running load"
        with pytest.raises(UnknownModelError):
            fut.result(120)
        for _ in range(600):  # the loader undoes what it loaded (condition, hang guard)
            if dev.unloaded:
                break
            threading.Event().wait(0.1)
        assert len(dev.unloaded) == 1
        assert "a" not in cache.stats()["models"]
    finally:
        dev.release.set()
        cache.close()
        dev.close()


# -- issue 31 item 3: the runtime split into API, engine assembly, registry, options ------------
#: the modules ``Runtime`` is made of (the API and what it delegates to)
RUNTIME_FILES = ("av_infer/runtime.py", "av_infer/engine.py", "av_infer/registry.py",
                 "av_infer/request_options.py", "av_infer/inputs.py")


def _imports(rel: str) -> set[str]:
    tree = ast.parse((ROOT / rel).read_text())
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module:
            out.add(n.module)
        elif isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
    return out


def test_no_floor_below_the_runtime_imports_its_modules() -> None:
    """The scheduler and the devices sit below the runtime: none of them may import the
    API, the engine assembly, the registry or the request options (no import runs up)."""
    above = {f[:-3].replace("/", ".") for f in RUNTIME_FILES}
    for pkg in ("av_infer/sched", "av_infer/devices"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            up = _imports(str(f.relative_to(ROOT))) & above
            assert not up, (str(f.relative_to(ROOT)), up)


def test_each_engine_setting_has_one_validator_the_runtime_delegates_to() -> None:
    """``c``, policy, queue depth, BE share and batching are checked in ``engine`` only:
    the API module calls none of the scheduler-level checks itself."""
    src = (ROOT / "av_infer/runtime.py").read_text()
    for check in ("check_capacity", "device_refuses", "get_policy", "check_mode",
                  "check_depth", "check_share", "check_max_batch", "check_c("):
        assert check not in src, check
    from av_infer import engine
    dev = SimDevice("mi50")
    try:
        with pytest.raises(InvalidParameterError, match="1.."):
            engine.check_c(0, dev)
        with pytest.raises(InvalidParameterError, match="reuse_guard=3"):
            engine.check_c(3, dev, [3, 8])
        assert engine.check_c(2, dev, [3, 8]) == 2
        with pytest.raises(InvalidParameterError, match="unknown policy"):
            engine.check_policy("nope", dev)
        assert engine.check_policy("reef", dev).name == "reef"
        assert engine.check_depth(None) is None
        for bad in (0, True, 1.5):
            with pytest.raises(InvalidParameterError):
                engine.check_depth(bad)
        with pytest.raises(InvalidParameterError):
            engine.check_share(1.0)
        with pytest.raises(InvalidParameterError):
            engine.check_max_batch(257)
    finally:
        dev.close()


def test_the_scheduler_holds_settings_it_does_not_validate_them() -> None:
    """``c`` and the policy have one validator (engine.check_c / check_policy): the
    scheduler module holds and applies them but checks neither again."""
    src = (ROOT / "av_infer/sched/scheduler.py").read_text()
    for check in ("check_capacity", "device_refuses", "get_policy", "InvalidParameterError"):
        assert check not in src, check


def test_the_flag_and_the_outstanding_counts_have_one_writer_each() -> None:
    """The preemption flag is held in ``StreamState.flagged`` and published by
    ``set_preempt``, both written in ``Scheduler._flag`` only; launches are counted in
    ``Scheduler._count`` (and taken off by a completion, ``on_complete``) only."""
    tree = ast.parse((ROOT / "av_infer/sched/scheduler.py").read_text())
    writers: dict[str, set[str]] = {"flagged": set(), "set_preempt": set(),
                                    "outstanding": set()}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or fn.name == "__init__":
            continue  # (the classes' constructors set the starting values)
        for node in ast.walk(fn):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Attribute) and t.attr in ("flagged", "outstanding"):
                        writers[t.attr].add(fn.name)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "set_preempt"):
                writers["set_preempt"].add(fn.name)
    assert writers == {"flagged": {"_flag"}, "set_preempt": {"_flag"},
                       "outstanding": {"_count", "on_complete"}}, writers


def test_the_device_interface_has_no_fields_only_tests_read() -> None:
    """Removed as dead (issue 31): ``Device.in_flight`` (diagnostics read it from
    ``telemetry()["streams"]``), ``ResetInfo.restore_c`` and the vHQ's ``restore_c`` /
    ``restore_point`` (the scheduler restores from the observed ``done``)."""
    from av_infer._cy import vhq
    from av_infer.devices.base import Device, ResetInfo
    assert not hasattr(Device, "in_flight")
    assert "restore_c" not in ResetInfo.__dataclass_fields__
    assert not hasattr(vhq, "restore_point") and not hasattr(vhq.VHQ, "restore_c")
    dev = SimDevice("mi50")
    try:
        s = dev.open_stream(0)
        assert dev.telemetry()["streams"][s]["in_flight"] == 0
    finally:
        dev.close()


def test_a_bad_max_batch_is_refused_before_a_device_is_made(monkeypatch) -> None:
    """Was: ``max_batch`` was checked after the device was built, outside the guard that
    closes it again, so a refused value left the device open."""
    made: list[SimDevice] = []
    init = SimDevice.__init__

    def counted(self, *a, **k) -> None:
        init(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(SimDevice, "__init__", counted)
    with pytest.raises(InvalidParameterError, match="max_batch"):
        Runtime(device="sim", max_batch=0)
    assert not made
    Runtime(device="sim").close()  # the counter sees a device that is made
    assert len(made) == 1


@pytest.mark.parametrize("interpreted", [False, True])
def test_request_options_is_one_frozen_value(interpreted: bool) -> None:
    """The same value compiled (request_options.pxd) and interpreted: fields in
    constructor order, keyword defaults, ``==``/``hash``, read-only, repr, pickling."""
    from tests.checks import run_in_form

    code = """
import pickle
from dataclasses import FrozenInstanceError
from av_infer.request_options import FIELDS, RequestOptions
assert FIELDS == ("priority", "deadline", "client", "arrival", "drop_late",
                  "hard_deadline", "variant_group", "borrow")
fast = RequestOptions.of("rt", 1.0, "cam", None, True, 2.0, None, False)
assert fast == RequestOptions("rt", 1.0, "cam", None, True, 2.0, None, False)
assert fast != RequestOptions("rt", 1.0, "cam", None, True, 2.0, None, True)
assert hash(fast) == hash(RequestOptions("rt", 1.0, "cam", None, True, 2.0, None, False))
assert [getattr(fast, n) for n in FIELDS] == ["rt", 1.0, "cam", None, True, 2.0, None, False]
d = RequestOptions()
assert (d.client, d.borrow, d.priority) == ("default", False, None)
assert RequestOptions(client="x", borrow=True).client == "x"
assert pickle.loads(pickle.dumps(fast)) == fast
assert repr(fast).startswith("RequestOptions(priority='rt', deadline=1.0, client='cam'")
for name in ("client", "borrow", "new"):
    try:
        setattr(fast, name, "other")
    except FrozenInstanceError:
        pass
    else:
        raise AssertionError(name)
print("ok")
"""
    assert run_in_form(code, ("request_options",), interpreted) == "ok"


def test_removing_a_group_a_client_is_configured_with_changes_that_client() -> None:
    """Was: ``remove_variant_group`` assigned to the client's frozen configuration and
    raised FrozenInstanceError (after the group was already gone). Now the client's
    requests go to the model they name."""
    rt, dev = sim_runtime()
    try:
        rt.define_variant_group("ab", {"a": 1.0, "b": 0.5})
        rt.configure_client("cam", variant_group="ab")
        rt.remove_variant_group("ab")
        assert rt.variant_groups() == {}
        x = {n: np.zeros(sh, dt) for n, (sh, dt) in rt.input_spec("a").items()}
        fut = rt.submit("a", x, client="cam")
        dev.run()
        assert fut.result().model == "a"
        with pytest.raises(UnknownModelError):
            rt.remove_variant_group("ab")
    finally:
        rt.close()


# -- defect 7: capabilities declared, timers -------------------------------------------------
def test_runtime_and_scheduler_never_probe_the_device_with_getattr() -> None:
    """No ``getattr`` on a device (any expression naming one: ``self.device``, ``dev``,
    ``driver.device``); other objects' optional attributes (a listener's
    ``event_kinds``) are not device capabilities."""
    for rel in RUNTIME_FILES + ("av_infer/sched/scheduler.py",
                                "av_infer/sched/policies.py"):
        tree = ast.parse((ROOT / rel).read_text())
        probes = [n.lineno for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "getattr"
                  and n.args and "dev" in ast.unparse(n.args[0]).lower()]
        assert not probes, (rel, probes)
        assert "_virtual" not in (ROOT / rel).read_text()


def test_drop_late_fails_a_queued_request_at_its_deadline() -> None:
    """Was: a queued drop_late request was failed only when some other event arrived (here
    the end of the 50 ms task ahead of it), not at its deadline."""
    rt, dev = sim_runtime(max_be_streams=1)
    fails: list[tuple[int, float]] = []
    rt.add_listener(lambda k, p: fails.append((p["request_id"], p["t"])) if k == "fail"
                    else None)
    long = rt.submit("b", {}, priority=Priority.BE)  # 500 x 100 us
    late = rt.submit("a", {}, priority=Priority.BE, deadline=1e-3, drop_late=True)
    dev.run()
    assert long.result().outputs == {}
    with pytest.raises(DeadlineMissedError):
        late.result()
    (rid, t), = fails
    end = long.result().timings.end
    assert 1e-3 <= t < 1.1e-3 < end, (t, end)
    rt.close()


def test_drop_late_timer_on_a_wall_clock_device() -> None:
    """The same on the cpu device: the driver's timer thread fails the queued request
    (no other event comes: the task ahead blocks until the test releases it)."""
    a = compile_model(zoo.path("tiny_cnn"), name="a")
    x = zoo.sample_inputs("tiny_cnn")
    gate = threading.Event()

    class Gated(CpuDevice):
        """The first launch of request 1 blocks its lane until the test opens the gate."""

        def write_inputs(self, task, inputs):  # noqa: ANN001
            super().write_inputs(task, inputs)
            if task == 1:
                fns = self._tasks[task].bound.fns
                first = fns[0]

                def gated(*a):  # noqa: ANN002
                    fns[0] = first
                    gate.wait(120)
                    return first(*a)
                fns[0] = gated

    rt = Runtime(device=Gated(engine="numpy"), max_be_streams=1)
    try:
        rt.load_model("a", a)
        first = rt.submit("a", x, priority=Priority.BE)  # holds the only BE stream
        late = rt.submit("a", x, priority=Priority.BE, deadline=rt.now() + 0.01,
                         drop_late=True)
        with pytest.raises(DeadlineMissedError):
            late.result(120)
        assert not first.done()
        gate.set()
        assert first.result(120).outputs
    finally:
        gate.set()
        rt.close()


# -- overload: bounded queues ---------------------------------------------------------------
def test_max_queue_depth_rejects_arrivals_beyond_it_per_priority_class() -> None:
    rt, dev = sim_runtime(max_be_streams=1, max_queue_depth=2)
    be = [rt.submit("a", {}, priority=Priority.BE) for _ in range(5)]
    rtf = [rt.submit("a", {}, priority=Priority.RT) for _ in range(3)]
    dev.run()
    ok = [f for f in be if f.exception() is None]
    rejected = [f for f in be if isinstance(f.exception(), RejectedError)]
    assert len(ok) == 3 and len(rejected) == 2  # one started at once, two queued
    assert all(f.exception() is None for f in rtf)  # RT has its own bound
    with pytest.raises(InvalidParameterError):
        rt.set_max_queue_depth(0)
    assert rt.max_queue_depth == 2
    rt.set_max_queue_depth(None)
    more = [rt.submit("a", {}, priority=Priority.BE) for _ in range(5)]
    dev.run()
    assert all(f.exception() is None for f in more)
    rt.close()


def test_every_future_is_answered_once() -> None:
    """Futures resolve once even when a batch and a failure race (shutdown, no drain)."""
    rt, dev = sim_runtime()
    futs: list[Future] = [rt.submit("b", {}, priority=Priority.BE) for _ in range(4)]
    futs += [rt.submit("a", {}, priority=Priority.RT) for _ in range(4)]
    dev.run(until=2e-3)
    rt.close(drain=False)
    assert all(f.done() for f in futs)
    answered = sum(1 for f in futs if f.exception() is None)
    assert answered + sum(1 for f in futs if f.exception() is not None) == len(futs)
    assert np.isfinite(answered)


# -- launches the device refused part-way ------------------------------------------------------
class _PadRefused(SimDevice):
    """Refuses every padded launch (its BE parts do not match what it would launch)."""

    def enqueue_padded(self, stream, task, kernel, parts):  # noqa: ANN001
        raise ValueError("padding part: blocks beyond the kernel's")


class _SecondRangeRefused(SimDevice):
    """Takes the first launch range of a task and refuses the next one."""

    seen: set[int]

    def enqueue(self, stream, task, first, last, wake=True):  # noqa: ANN001
        if task in self.seen:
            raise RuntimeError("vHQ full")
        self.seen.add(task)
        return super().enqueue(stream, task, first, last, wake)


def _rt_during_be(dev: SimDevice) -> tuple[Runtime, Future, list[Future]]:
    rt, dev = sim_runtime(dev, policy="reef_dkp")
    be = rt.submit("b", {}, priority=Priority.BE)
    futs: list[Future] = []
    dev.call_at(250 * US, lambda: futs.append(rt.submit("a", {}, priority=Priority.RT)))
    return rt, be, futs


def test_a_refused_padded_launch_runs_the_rt_kernel_unpadded() -> None:
    """Was: the device's refusal of the BE parts failed the RT request."""
    rt, be, futs = _rt_during_be(_PadRefused("mi50"))
    rt.device.run()
    assert futs[0].result().outputs == {} and be.result().outputs == {}
    assert rt.stats()["padding"]["launches"] == 0
    rt.close()


def test_launches_are_counted_only_once_the_device_took_them() -> None:
    """Was: a task's launches were counted before the device took them, so a refusal
    part-way left completions that never come: the task never left and close() hung."""
    dev = _SecondRangeRefused("mi50")
    dev.seen = set()
    rt, dev = sim_runtime(dev, max_be_streams=1)
    rt.set_policy("reef")
    be = rt.submit("b", {}, priority=Priority.BE)
    futs: list[Future] = []
    dev.call_at(250 * US, lambda: futs.append(rt.submit("a", {}, priority=Priority.RT)))
    dev.run()  # the RT arrival preempts b; its restore is refused
    assert futs[0].result().outputs == {}
    with pytest.raises(DeviceFaultError, match="vHQ full"):
        be.result()
    rt.close()  # returns: nothing is left waiting for a completion
    assert rt._sched.idle()


def test_a_setting_refused_inside_the_scheduler_is_counted_not_dropped() -> None:
    """Was: a control call made on the scheduler's thread (a listener) that failed was
    dropped silently; now it is logged and counted in ``stats()["handler_errors"]``."""
    rt, dev = sim_runtime(_RefusingSim("mi50"), c=4)
    calls: list[int] = []

    def listener(kind: str, payload: dict) -> None:
        if kind == "arrival" and not calls:
            calls.append(1)
            rt.set_c(7)  # valid range, refused by the device when applied after the event

    rt.add_listener(listener)
    f = rt.submit("a", {}, priority=Priority.BE)
    dev.run()
    assert f.result().outputs == {}
    assert rt.c == 4
    assert rt.stats()["handler_errors"] == {"control": 1}
    rt.close()
