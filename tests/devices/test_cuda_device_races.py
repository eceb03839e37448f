"""CudaDevice's shared books under the scheduler/drain-thread race (issue 16, defect 3).

The drain thread (``CudaDevice._drain``) and the scheduler thread both touch ``_padded``,
``_tasks`` and ``_zombies``. Each test makes the harmful interleaving happen on purpose:
the dispatcher's completion feed is replaced by a scripted one, and a hook placed exactly
where the scheduler thread is mid-operation (iterating ``_padded`` inside ``reset``; between
the dispatcher's "launches in flight" and the zombie mark inside ``release_task``) hands
the drain thread a completion and waits until the drain thread has either handled it or
is held back by the device's lock. No assertion depends on timing: the waits have long
timeouts only so that a bug fails instead of hanging.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest

from av_infer.devices.cuda import availability
from av_infer.kernels.cuda.samples import chain_plan
from tests.checks import require

EMU_OK, EMU_WHY = availability(emulate=True)
WAIT_S = 30.0
PARTS = ((1, 2, 0, 4, 1),)


class _ScriptedDispatcher:
    """The real dispatcher, except that ``poll`` returns the completions a test feeds
    (the dispatch loop never runs, so nothing is transmitted behind the test's back) and
    ``unregister_task`` can be told to report "launches in flight" once, running a hook."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self._feed: queue.Queue = queue.Queue()
        self.in_flight_hook = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def feed(self, *completion: Any) -> None:
        self._feed.put(completion)

    def poll(self, max_n: int = 4096, timeout: float = 0.05, executed: bool = False) -> list:
        try:
            return [self._feed.get(timeout=timeout)]
        except queue.Empty:
            return []

    def unregister_task(self, task: int) -> bool:
        hook, self.in_flight_hook = self.in_flight_hook, None
        if hook is not None:
            hook()
            return False
        return self._real.unregister_task(task)


class _WatchedLock:
    """The device's books lock, telling the test when the drain thread waits for it."""

    def __init__(self, drain_waits: threading.Event) -> None:
        self._lock = threading.Lock()
        self._drain_waits = drain_waits

    def __enter__(self) -> None:
        if threading.current_thread().name == "test-drain":
            self._drain_waits.set()
        self._lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


@pytest.fixture
def rig():
    """An emulated device with tasks 0 and 1 of the chain plan, one stream, a scripted
    completion feed and its drain thread; ``progress`` is set when the drain thread has
    delivered a completion or waits for the books lock."""
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer.devices.cuda import EmulatedCudaDevice

    dev = EmulatedCudaDevice(c=4)
    plan, _ = chain_plan(seed=3)
    h = dev.load_plan(plan)
    s = dev.open_stream(0)
    dev.new_task(h, 0)
    dev.new_task(h, 1)
    disp = _ScriptedDispatcher(dev._disp)
    dev._disp = disp
    progress = threading.Event()
    if hasattr(dev, "_books"):
        dev._books = _WatchedLock(progress)
    done: queue.Queue = queue.Queue()

    def on_complete(c: Any) -> None:
        done.put(c)
        progress.set()

    dev._on_complete = on_complete
    th = threading.Thread(target=dev._drain, name="test-drain", daemon=True)
    th.start()
    dev._threads.append(th)
    try:
        yield dev, disp, s, len(plan.kernels), done, progress
    finally:
        dev.close()


def test_reset_while_the_drain_thread_takes_padded_parts(rig):
    """The drain thread pops a padded launch's parts while ``reset`` iterates ``_padded``
    to forget the dropped ones: "dictionary changed size during iteration" before the fix."""
    dev, disp, s, nk, done, progress = rig

    class MidIteration(dict):
        def __iter__(self):
            keys = dict.__iter__(self)
            yield next(keys)
            disp.feed(s, 0, 1, 0, 0.0, 0.0)  # task 0's padded kernel 1 completes now
            assert progress.wait(WAIT_S)
            yield from keys

    dev._padded = MidIteration({(1, 5): PARTS, (0, 1): PARTS, (1, 6): PARTS})
    dev.enqueue(s, 1, 0, nk - 1)  # queued only: the dispatch loop is not running
    info = dev.reset(s)
    assert info is not None and info.task == 1 and info.last_sent == -1
    c = done.get(timeout=WAIT_S)
    assert (c.task, c.kernel, c.parts) == (0, 1, PARTS)
    assert dict(dev._padded) == {}


def test_release_while_the_last_launch_completes(rig):
    """The task's last in-flight launch completes between the dispatcher's "launches in
    flight" and the zombie mark in ``release_task``: before the fix the drain thread saw
    no zombie, and the task (arena, launch table) was never freed."""
    dev, disp, s, nk, done, progress = rig

    def last_launch_completes() -> None:
        disp.feed(s, 0, nk - 1, 0, 0.0, 0.0)
        assert progress.wait(WAIT_S)

    disp.in_flight_hook = last_launch_completes
    dev.release_task(0)
    c = done.get(timeout=WAIT_S)
    assert (c.task, c.kernel) == (0, nk - 1)
    assert 0 not in dev._tasks and not dev._zombies
    assert dev._disp.task_inflight(0) == 0
    assert dev._disp.table_stats()["live"] == 1  # task 1 only: 0's slot was reclaimed
