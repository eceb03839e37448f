"""Issue 16, defect 5: padding is a field of the device's launch record (vHQ -> dispatcher ->
completion), not a copy the scheduler keeps. A padded launch's BE parts leave the device
exactly once: in ``Completion.parts`` (it ran) or in ``ResetInfo.dropped_parts`` (a reset
dropped it); the scheduler rewinds the BE cursors from the latter and keeps only a count
per BE task. Simulator, virtual time: deterministic."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np

from av_infer.devices.base import Completion, ResetInfo
from av_infer.devices.sim import SimDevice
from av_infer.errors import DeviceFaultError
from av_infer.runtime import Runtime
from av_infer.sched.request import Priority, Result
from av_infer.sched.scheduler import Scheduler
from tests.checks import require
from tests.sched.test_dkp import synthetic

US = 1e-6
BE_BLOCKS = 2000


class Books(SimDevice):
    """The simulator, recording padded launches as issued, completed and dropped."""

    def __init__(self, *a: object, **kw: object) -> None:
        super().__init__(*a, **kw)  # type: ignore[arg-type]
        self.issued: list[tuple[int, int, tuple]] = []  # (rt task, kernel, parts)
        self.completed: list[tuple] = []
        self.resets: list[tuple[int, ResetInfo]] = []  # (padded launches issued, report)

    def enqueue_padded(self, stream, task, kernel, parts):  # noqa: ANN001
        ok = super().enqueue_padded(stream, task, kernel, parts)
        if ok and parts:
            self.issued.append((task, kernel, tuple(tuple(p) for p in parts)))
        return ok

    def reset(self, stream: int) -> ResetInfo | None:
        info = super().reset(stream)
        if info is not None:
            self.resets.append((len(self.issued), info))
        return info

    def start(self, on_complete):  # type: ignore[no-untyped-def]
        def hook(c: Completion) -> None:
            self.completed.extend(c.parts)
            on_complete(c)
        super().start(hook)


def _rig(**kw: object) -> tuple[Runtime, Books]:
    rt_plan, rt_prof = synthetic("rt", 10, 200.0, 30, 4)
    be_plan, be_prof = synthetic("be", 12, 150.0, BE_BLOCKS, 4)
    dev = Books("mi50", {"rt": rt_prof, "be": be_prof})
    rt = Runtime(device=dev, policy="reef_dkp", c=2, **kw)  # type: ignore[arg-type]
    rt.load_model("rt", rt_plan)
    rt.load_model("be", be_plan)
    return rt, dev


def _no_padding_left(rt: Runtime, dev: SimDevice) -> None:
    """Nothing anywhere still holds padding: not the device's queued launch records, not
    a launch waiting to start, not the scheduler."""
    for s in dev._streams:
        assert s.pads == {}, s.id
        assert not s.devq and s.cur is None, s.id
    sched = rt._sched
    assert not hasattr(sched, "_pad_pending")
    assert all(t.pad_in_flight == 0 for t in sched.tasks.values())


def test_the_scheduler_keeps_no_copy_of_padded_launches() -> None:
    rt, dev = _rig()
    try:
        assert not hasattr(rt._sched, "_pad_pending")
        assert not hasattr(Scheduler, "_padded_in_flight")
        assert not hasattr(dev, "_padding")  # the simulator's one table is per stream
    finally:
        rt.close()


def test_a_reset_reports_the_padding_it_dropped_and_the_be_cursor_rewinds_from_it() -> None:
    """edf_preempt: a more urgent RT request takes the RT stream while the first one's
    padded launches are queued. The reset hands their BE parts back
    (``ResetInfo.dropped_parts``); the BE task is padded again from the first dropped part,
    and every BE block still runs exactly once."""
    rt, dev = _rig(edf_preempt=True)
    f_be = rt.submit("be", {}, priority=Priority.BE)
    rts: list[Future[Result]] = []

    def submit(deadline_us: float) -> None:
        rts.append(rt.submit("rt", {}, priority=Priority.RT,
                             deadline=dev.now() + deadline_us * US))

    dev.call_at(100 * US, lambda: submit(1e6))
    dev.call_at(600 * US, lambda: submit(1e3))  # more urgent: switches at a kernel boundary
    dev.run()
    rt1, rt2 = (f.result().request_id for f in rts)
    be_tid = f_be.result().request_id
    assert rts[0].result().timings.preempted == 1
    (n_issued, info), = [(n, i) for n, i in dev.resets if i.dropped_parts]
    dropped = list(info.dropped_parts)
    assert info.task == rt1 and all(task == rt1 for task, _k, _parts in dropped)
    # What the reset reports is exactly what was issued last and never completed, in order.
    assert dev.issued[n_issued - len(dropped):n_issued] == dropped
    assert [d[1] for d in dropped] == list(range(info.last_sent + 1, 10))
    # The BE cursor went back to the first dropped part: the next padded launch (RT2's
    # first) starts there.
    (be, kern, b0, _n, _occ) = dropped[0][2][0]
    assert dev.issued[n_issued][0] == rt2
    assert dev.issued[n_issued][2][0][:3] == (be, kern, b0)
    # Every BE block ran at most once in padded launches, and the result came back.
    covered = np.zeros((12, BE_BLOCKS), dtype=int)
    for task, kernel, start, n, _occ in dev.completed:
        assert task == be_tid
        covered[kernel, start:start + n] += 1
    assert covered.max() == 1
    assert f_be.result().timings.kernels_padded > 0
    _no_padding_left(rt, dev)
    rt.close()


def test_aborting_a_padded_rt_task_leaves_no_padding_and_the_be_task_resumes() -> None:
    """An RT task with padded launches queued is aborted: the reset's report frees its BE
    parts (before, the scheduler's copy of them stayed forever and the BE task, "still in
    padded launches", was never restored)."""
    rt, dev = _rig()
    f_be = rt.submit("be", {}, priority=Priority.BE)
    f_rt: list[Future[Result]] = []
    dev.call_at(100 * US, lambda: f_rt.append(rt.submit("rt", {}, priority=Priority.RT)))
    sched = rt._sched

    def abort() -> None:
        t = next(x for x in sched.tasks.values() if x.rt)
        assert t.outstanding > 2  # padded launches still queued
        sched.post(("control", lambda: sched._abort(t, DeviceFaultError("aborted")), None))

    dev.call_at(500 * US, abort)
    dev.run()
    assert isinstance(f_rt[0].exception(), DeviceFaultError)
    assert any(info.dropped_parts for _n, info in dev.resets)
    assert f_be.done()  # restored after the abort (before: never, it waited forever)
    res = f_be.result()
    assert res.timings.kernels_padded > 0
    _no_padding_left(rt, dev)
    assert not sched.tasks
    rt.close()


def test_cuda_emu_reset_reports_and_clears_the_padding_it_dropped() -> None:
    """CudaDevice: ``_padded`` owns a padded launch's parts, the dispatcher's entry is how
    it is launched; a reset clears both (``_drop_padding``) and reports the parts."""
    from av_infer.devices.cuda import availability

    ok, why = availability(emulate=True)
    require(None if not ok else "ok", f"the CUDA emulator cannot run: {why}")
    from av_infer.devices.cuda import EmulatedCudaDevice
    from av_infer.kernels.cuda.samples import chain_plan

    dev = EmulatedCudaDevice(c=4)  # not started: nothing is transmitted
    try:
        rt_h = dev.load_plan(chain_plan(seed=1)[0])
        be_h = dev.load_plan(chain_plan(seed=2)[0])
        dev.prepare_padding([rt_h, be_h])
        s = dev.open_stream(1)
        be_t, rt_t = 900, 901
        dev.new_task(be_h, be_t)
        dev.new_task(rt_h, rt_t)
        parts = [((be_t, 2, 0, 1, 1),), ((be_t, 2, 1, 1, 1),)]
        for k, p in enumerate(parts):
            assert dev.enqueue_padded(s, rt_t, k, list(p))
        dev.enqueue(s, rt_t, 2, 3)
        info = dev.reset(s)
        assert info is not None and (info.task, info.last_sent, info.dropped) == (rt_t, -1, 4)
        assert info.dropped_parts == ((rt_t, 0, parts[0]), (rt_t, 1, parts[1]))
        assert dict(dev._padded) == {}
        assert dev._disp.clear_padded(rt_t) == 0  # the dispatcher's entries went too
        assert dev.reset(s) is None
    finally:
        dev.close()
