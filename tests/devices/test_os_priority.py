"""Per-thread OS priority (devices/os_priority.py): a helper thread takes a lane's nice for
its launches and gets its own back."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from av_infer import Runtime
from av_infer.devices import os_priority
from av_infer.devices.faults import FaultInjector
from av_infer.model import zoo

pytestmark = pytest.mark.skipif(not os_priority.supported(), reason="no per-thread nice here")


def test_as_lane_restores_the_thread_s_own_priority() -> None:
    """Where the process may raise a thread's priority back, a helper takes the lane's nice
    and returns to its own; where it may not, the cpu device never renices helpers (it
    leaves niced lanes to their workers) and says so in its stats."""
    own = os_priority.current_nice()
    if os_priority.can_restore():
        with os_priority.as_lane(min(19, own + 10)):
            assert os_priority.current_nice() == min(19, own + 10)
        assert os_priority.current_nice() == own
    with Runtime("cpu") as rt:
        dev = rt.stats()["device"]
        assert dev["helpers_reniced"] is os_priority.can_restore()


class _NiceRecorder(FaultInjector):
    """Injects nothing; records the nice the calling thread's model run gets at the cpu
    device's hook points: ``"lane"`` (the Python before a launch) and ``"kernel"`` (just
    before the model run): the thread's nice there, or, where the run renices itself
    (the C API: its lane is ``armed``), the nice it was armed with (the thread's own nice
    before such a run is kept in ``before_armed``)."""

    def __init__(self, dev: Any = None) -> None:
        super().__init__()
        self.dev = dev
        self.seen: list[tuple[str, str | None, str, int]] = []
        self.before_armed: list[int] = []

    def check(self, where: str, model: str | None = None, kernel: int | None = None) -> None:
        name, nice = threading.current_thread().name, os_priority.current_nice()
        tid = threading.get_native_id()
        for ln in (self.dev._lanes if where == "kernel" and self.dev is not None else ()):
            if ln.busy and ln.armed and ln.run_tid == tid and ln.running is not None:
                self.before_armed.append(nice)
                nice = ln.running.armed_nice
        self.seen.append((where, model, name, nice))


@pytest.mark.skipif(not os_priority.can_restore(),
                    reason="this process may not raise a thread's priority back: BE lane "
                           "workers stay niced (tested by the runtime test above)")
def test_be_lanes_are_niced_only_while_a_model_runs() -> None:
    """Where priority can be restored, a BE launch runs its model at the lane's nice and the
    Python around it (which holds the GIL an RT thread may wait for) at the thread's own:
    on the calling thread (``infer`` helps) and on a lane worker (``submit``) alike; RT
    launches keep the thread's own priority, and every thread ends at its own. On the C
    API the run renices itself once the GIL is released (tests/kernels/test_ort_capi.py)."""
    own = os_priority.current_nice()
    run_nice = min(19, own + 10)
    # kill_below_ms 0: every run is long enough to renice (the next test: shorter ones)
    with Runtime("cpu", device_options={"be_nice": 10, "kill_below_ms": 0.0}) as rt:
        rec = _NiceRecorder(rt.device)
        rt.device.faults = rec
        rt.load_model("be", zoo.path("tiny_cnn"))
        rt.load_model("rt", zoo.path("tiny_cnn"), pin=True)
        x = zoo.sample_inputs("tiny_cnn")
        rt.infer("be", x)
        rt.infer("rt", x, priority="RT")
        futs = [rt.submit("be", x) for _ in range(4)]
        done = threading.Event()
        futs[-1].add_done_callback(lambda f: done.set())
        assert done.wait(60)
        for f in futs:
            f.result()
        streams = rt.stats()["device"]["streams"]
        be_lanes = [s for s in streams if s["priority"] <= 0]
        assert be_lanes and all(
            s["os_priority"].startswith(f"nice {run_nice} while a model runs")
            for s in be_lanes)
        threads = {t.name: t for t in threading.enumerate()}
        for t in threads.values():
            if t.name.startswith("av_infer-cpu-lane"):
                assert os.getpriority(os.PRIO_PROCESS, t.native_id) == own, t.name
    kernel = [(m, th, n) for w, m, th, n in rec.seen if w == "kernel"]
    outside = [n for w, _, _, n in rec.seen if w == "lane"]
    assert {n for m, _, n in kernel if m == "be"} == {run_nice}
    assert {n for m, _, n in kernel if m == "rt"} == {own}
    assert outside and set(outside) == {own}
    assert set(rec.before_armed) <= {own}  # armed runs hold the GIL at the thread's own
    be_threads = {th for m, th, _ in kernel if m == "be"}
    assert threading.current_thread().name in be_threads  # helped
    assert any(th.startswith("av_infer-cpu-lane") for th in be_threads)  # a worker ran one
    assert os_priority.current_nice() == own


@pytest.mark.skipif(not os_priority.can_restore(),
                    reason="this process may not raise a thread's priority back: BE lane "
                           "workers stay niced (tested by the runtime test above)")
def test_runs_shorter_than_kill_below_keep_the_thread_s_own_priority() -> None:
    """A BE run estimated under ``kill_below_ms`` is never killed, and is not reniced
    either (two setpriority calls would cost more than such a run keeps a core): its model
    runs at the thread's own priority; a kill of it renices nothing."""
    own = os_priority.current_nice()
    with Runtime("cpu", device_options={"be_nice": 10, "kill_below_ms": 1000.0}) as rt:
        rec = _NiceRecorder(rt.device)
        rt.device.faults = rec
        rt.load_model("be", zoo.path("tiny_cnn"))
        x = zoo.sample_inputs("tiny_cnn")
        for _ in range(3):
            rt.infer("be", x)
        futs = [rt.submit("be", x) for _ in range(4)]
        for f in futs:
            f.result(timeout=60)
        ests = rt._models["be"].handle.est_s  # what the device decides by
        assert ests and all(0.0 < est < rt.device.kill_below_s for est in ests)
    kernel = [n for w, m, _, n in rec.seen if w == "kernel" and m == "be"]
    assert len(kernel) >= 7 and set(kernel) == {own}
    assert os_priority.current_nice() == own


@pytest.mark.skipif(not os_priority.can_restore(),
                    reason="this process may not raise a thread's priority back: BE lane "
                           "workers stay niced as a whole, runs are not armed")
def test_a_fault_before_an_armed_run_leaves_no_renice_armed_for_the_next_run() -> None:
    """A launch that fails after the lane armed its run (a fault at the run's hook) is
    answered typed; its run options (the lane's spare for the next launch, which may be
    another thread's) are left unarmed, and the thread keeps its own priority."""
    from av_infer.errors import DeviceFaultError

    own = os_priority.current_nice()
    with Runtime("cpu", max_be_streams=1,
                 device_options={"be_nice": 10, "kill_below_ms": 0.0}) as rt:
        rt.load_model("be", zoo.path("tiny_cnn"))
        x = zoo.sample_inputs("tiny_cnn")
        rt.infer("be", x)
        faults = FaultInjector()
        faults.add("kernel", "be")
        rt.device.faults = faults
        with pytest.raises(DeviceFaultError):
            rt.infer("be", x)
        lanes = [ln for ln in rt.device._lanes if ln.priority <= 0]
        spares = [ln.ro_spare for ln in lanes if ln.ro_spare is not None]
        assert spares and all(getattr(ro, "armed_nice", None) is None for ro in spares)
        assert os_priority.current_nice() == own
        rt.device.faults = None
        rt.infer("be", x)  # the next run is served
    assert os_priority.current_nice() == own
