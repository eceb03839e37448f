"""Handoff: run work posted from any thread on the node's executor.

Why: a runtime future completes on the runtime's callback thread (or inside the simulator's
event loop). Encoding a response and publishing it there would put the ROS layer's cost on
the runtime's clock and race the node's own callbacks, so completions only *post* a
closure here, and the node's executor runs it. A guard condition wakes the executor; every
executor (single, multi, events) serves guard conditions.

Guarantees: ``post`` is thread-safe and never blocks; posted closures are taken in post
order, each runs exactly once, on an executor thread (or on the thread calling ``drain``,
e.g. a deactivate that must not wait for the executor it runs on); after ``close`` nothing
more runs here and ``post`` returns False, so the caller can answer on its own instead (e.g.
a shutdown response), and ``close`` returns what was still queued.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node


class Handoff:
    """A queue of closures drained by a guard-condition callback of ``node``."""

    def __init__(self, node: Node):
        self._node = node
        self._lock = threading.Lock()
        self._queue: deque[Callable[[], Any]] = deque()
        self._closed = False
        self._guard = node.create_guard_condition(
            self.drain, callback_group=MutuallyExclusiveCallbackGroup())

    def post(self, fn: Callable[[], Any]) -> bool:
        """Queues ``fn`` for the executor; False (not queued) once closed."""
        with self._lock:
            if self._closed:
                return False
            self._queue.append(fn)
        try:
            self._guard.trigger()
        except Exception:  # noqa: BLE001 - destroyed meanwhile: close() answers the rest
            return True
        return True

    def drain(self) -> None:
        """Runs what is queued, in order, on the calling thread (the guard condition's
        callback; also whoever must not wait for the executor, e.g. a deactivate running on
        the only executor thread)."""
        while True:
            with self._lock:
                if not self._queue:
                    return
                fn = self._queue.popleft()
            try:
                fn()
            except Exception as exc:  # one bad closure must not stop the others
                self._node.get_logger().error(f"handoff: {type(exc).__name__}: {exc}")

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def close(self) -> list[Callable[[], Any]]:
        """Stops accepting; returns what was queued and never ran (to answer otherwise)."""
        with self._lock:
            self._closed = True
            left = list(self._queue)
            self._queue.clear()
        return left
