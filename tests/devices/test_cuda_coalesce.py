"""Coalesced completions on the cuda device, run on the CPU emulator (docs/request_path.md,
"Coalesced completions").

The dispatcher's ``poll(coalesce=True)`` merges consecutive completions of one task on one
stream into one record; the device books it once and the scheduler applies its count as
that many single completions (tests/sched/test_coalesced_completions.py proves the
scheduler side equal, decision for decision). On the emulator kernels are slow and the
completion thread rarely falls behind, so these tests make batches form the way a loaded
GPU does: ``CudaDevice.poll_pause_s`` makes the completion thread wait before each poll.
Checked: every launch is reported exactly once and in order, outputs are bit-identical to
runs without coalescing (our kernels and vendor ops), every request is answered exactly
once, preemption and restore under reef stay bit-identical, a raised flag and armed fault
hooks get single records. Wall-clock waits are conditions with hang guards only.
"""

from __future__ import annotations

import queue

import numpy as np
import pytest

from av_infer.devices.base import Completion
from av_infer.devices.cuda import availability
from tests.checks import be_bit_identical_under_rt, require

EMU_OK, EMU_WHY = availability(emulate=True)
PAUSE_S = 0.02  # the completion thread's wait before each poll: batches form


@pytest.fixture(autouse=True)
def _emulator() -> None:
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")


def _zoo(name: str, seed: int = 1):
    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    return compile_model(zoo.path(name, "scaled"), name=name), zoo.sample_inputs(
        name, "scaled", seed=seed)


def _device(vendor: str | None = None, coalesce: bool = True):
    from av_infer.devices.cuda import CudaDevice

    class NoCoalescing(CudaDevice):
        coalesces = False  # the engine starts it for single records

    return (CudaDevice if coalesce else NoCoalescing)(emulate=True, c=4, vendor=vendor)


def _reports(q: queue.Queue, task: int, n: int) -> list[Completion]:
    """The records of ``task`` until its kernel ``n - 1`` has been reported."""
    got: list[Completion] = []
    covered = 0
    while covered < n:
        c = q.get(timeout=300)
        if c.task == task:
            got.append(c)
            covered = c.kernel + c.count
    return got


@pytest.mark.parametrize("vendor", [None, "force"])
def test_records_cover_every_launch_once_in_order_and_outputs_are_identical(vendor):
    plan, x = _zoo("densenet201")
    n = len(plan.kernels)
    outs = []
    records: list[list[Completion]] = []
    for coalesce in (False, True):
        dev = _device(vendor)
        try:
            q: queue.Queue[Completion] = queue.Queue()
            s = dev.open_stream(0)
            dev.poll_pause_s = PAUSE_S
            dev.start(q.put, coalesce=coalesce)
            h = dev.load_plan(plan)
            dev.new_task(h, 1)
            dev.write_inputs(1, x)
            dev.enqueue(s, 1, 0, n - 1)
            got = _reports(q, 1, n)
            outs.append(dev.read_outputs(1))
            dev.release_task(1)
            tel = dev.telemetry()["completions"]
            assert tel == {"coalesce": coalesce, "records": len(got), "launches": n}
        finally:
            dev.close()
        records.append(got)
        # every kernel exactly once, in stream order; a record's times are its launches'
        assert [k for c in got for k in range(c.kernel, c.kernel + c.count)] == list(range(n))
        for c in got:
            assert c.stream == s and c.executed is None and not c.parts
            if c.count > 1:
                assert len(c.times) == 2 * c.count
                assert (c.times[0], c.times[-1]) == (c.t_start, c.t_end)
                assert list(c.times[1::2]) == sorted(c.times[1::2])
            else:
                assert c.times == ()
    single, merged = records
    assert all(c.count == 1 for c in single)
    assert len(merged) < len(single) // 2, [c.count for c in merged]  # batches formed
    for k in outs[0]:
        assert np.array_equal(outs[0][k], outs[1][k]), k


@pytest.mark.parametrize("vendor", [None, "force"])
def test_reef_under_rt_preemption_with_coalescing_is_bit_identical(vendor):
    """The real scheduler: BE requests preempted by RT ones (reset, flag, restore) with
    completions coalesced; outputs equal a run without coalescing, every request answered
    once, and the scheduler applied coalesced records."""
    from av_infer import Runtime

    be, x = _zoo("resnet152")
    rt_plan, x_rt = _zoo("tiny_mlp")
    with Runtime(_device(vendor, coalesce=False), policy="reef", c=4) as rt:
        rt.load_model("be", be)
        ref = rt.submit("be", x, client="be").result(timeout=300).outputs
    with Runtime(_device(vendor), policy="reef", c=4) as rt:
        rt.device.poll_pause_s = PAUSE_S
        rt.load_model("be", be)
        rt.load_model("rt", rt_plan)
        out = rt.submit("be", x, client="be").result(timeout=300).outputs
        for k in ref:
            assert np.array_equal(out[k], ref[k]), k
        be_bit_identical_under_rt(rt, x, x_rt, n_be=4, n_rt=20)
        st = rt.stats()
        sched = rt._sched
        assert st["preemptions"] > 0
        assert sched.coalesced_applied > 0, (sched.coalesced_applied, sched.coalesced_split)
        comp = st["device"]["completions"]
        assert comp["coalesce"] and comp["launches"] > comp["records"], comp
        # answered exactly once: 1 + 1 (reference in be_bit_identical_under_rt) + 4 BE,
        # 20 RT, all completed, none failed
        models = st["models"]
        assert models["be"] == {"submitted": 6, "completed": 6, "failed": 0}, models
        assert models["rt"] == {"submitted": 20, "completed": 20, "failed": 0}, models


def test_a_raised_flag_and_armed_fault_hooks_get_single_records():
    """Preemption latency and restore see every completion of a flagged stream on its
    own; fault hooks are per launch, so while they are armed the drain splits records."""
    from av_infer.devices.faults import FaultInjector

    plan, x = _zoo("resnet152")
    n = len(plan.kernels)
    dev = _device()
    try:
        q: queue.Queue[Completion] = queue.Queue()
        s = dev.open_stream(0)
        dev.poll_pause_s = PAUSE_S
        dev.start(q.put, coalesce=True)
        h = dev.load_plan(plan)
        # flag up while the whole task runs: every launch returns at its flag check
        dev.set_preempt(s, True)
        dev.new_task(h, 1)
        dev.write_inputs(1, x)
        dev.enqueue(s, 1, 0, n - 1)
        got = _reports(q, 1, n)
        dev.release_task(1)
        assert len(got) == n and all(c.count == 1 for c in got)
        dev.set_preempt(s, False)
        # fault hooks armed (none fires): single records
        dev.faults = FaultInjector()
        dev.new_task(h, 2)
        dev.write_inputs(2, x)
        dev.enqueue(s, 2, 0, n - 1)
        got = _reports(q, 2, n)
        dev.release_task(2)
        assert len(got) == n and all(c.count == 1 for c in got)
        # disarmed: batches again
        dev.faults = None
        dev.new_task(h, 3)
        dev.write_inputs(3, x)
        dev.enqueue(s, 3, 0, n - 1)
        got = _reports(q, 3, n)
        dev.release_task(3)
        assert len(got) < n and max(c.count for c in got) > 1
    finally:
        dev.close()
