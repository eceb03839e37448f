"""LeanExecutor: rclpy's single-threaded executor with a cheaper iteration.

Why: on the demo's graph (five nodes, ~78 wait-set entities: mostly the parameter,
lifecycle and type-description services every node has) rclpy 7.1's
``Executor._wait_for_ready_callbacks`` spends about 1.9 ms of Python per image on this VM
between the image's arrival and the output reaching a subscriber on the same executor
(docs/ros.md, "ROS overhead"): each iteration filters every entity twice, enters each
handle through a ``contextlib.ExitStack``, builds a new ``WaitSet``, and afterwards tests
every entity of every node against the ready lists; and every callback triggers the
executor's own guard condition twice, so each callback is followed by one more full
iteration that finds nothing to do (it exists to wake *other* threads of a multi-threaded
executor; a single thread needs no wake-up to see its own work).

What this changes, and only this: one pass gathers the entities, enters their handles
(plain ``__enter__``/``__exit__``, the same guarantee that no handle is destroyed while
waited on) and remembers which ready pointer belongs to which entity; the ``WaitSet`` is
kept while the entity counts stay the same (``clear_entities`` and re-add, as rclcpp
does); after the wait only the ready entities are looked up (ordered as rclpy orders them:
node by node, timers, subscriptions, guard conditions, clients, services); and the
handlers do not trigger the executor's guard condition. Everything else is rclpy's:
``Task``/coroutine callbacks, callback groups, ``spin_once``/``spin_until_future_complete``
timeouts, waitables, shutdown and ``create_task`` wake-ups (which still trigger the guard).

Guarantees: the same callbacks run, each once per ready event, on the thread that spins,
never two at once (single-threaded); entity lists are re-read on every iteration, so nodes
and endpoints may be added or destroyed while it spins (a destroyed endpoint is skipped,
as rclpy skips it). Written against rclpy 7.1.x's ``Executor`` internals (``_tasks``,
``_guard``, ``_sigint_gc``, ``_make_handler``); ``tests/nodes/test_ros_lean_executor.py``
runs the node suites' behaviour on it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from rclpy.exceptions import InvalidHandle
from rclpy.executors import (
    ConditionReachedException,
    ExternalShutdownException,
    ShutdownException,
    SingleThreadedExecutor,
    TimeoutException,
    TimeoutObject,
)
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.task import Task
from rclpy.timer import Timer
from rclpy.utilities import timeout_sec_to_nsec
from rclpy.waitable import NumberOfEntities

# rclpy's order of yielding the ready entities of one node
_TIMER, _SUB, _GUARD, _CLIENT, _SERVICE = range(5)


class LeanExecutor(SingleThreadedExecutor):
    """A ``SingleThreadedExecutor`` whose iteration costs less (see the module docstring)."""

    def __init__(self, *, context: Any = None) -> None:
        super().__init__(context=context)
        self._wait_set: Any = None
        self._wait_set_counts: tuple[int, ...] | None = None

    def _make_handler(self, entity: Any, node: Any, take_from_wait_list: Callable) -> Task:
        """rclpy's handler without the two guard-condition triggers: they wake the other
        threads of a multi-threaded executor so the entity is waited on again; here the
        spinning thread itself builds the next wait set after the handler ran."""
        entity._executor_event = True

        async def handler(entity: Any, is_shutdown: bool, work_tracker: Any) -> None:
            if is_shutdown or not entity.callback_group.beginning_execution(entity):
                entity._executor_event = False
                return
            with work_tracker:
                call_coroutine = take_from_wait_list(entity)
                entity._executor_event = False
                try:
                    if call_coroutine is not None:
                        await call_coroutine()
                finally:
                    entity.callback_group.ending_execution(entity)

        task = Task(handler, (entity, self._is_shutdown, self._work_tracker), executor=self)
        with self._tasks_lock:
            self._tasks.append((task, entity, node))
        return task

    def _wait_for_ready_callbacks(
        self, timeout_sec: float | TimeoutObject | None = None, nodes: list[Any] | None = None,
        condition: Callable[[], bool] = lambda: False,
    ) -> Generator[tuple[Task, Any, Any], None, None]:
        timeout_timer = None
        timeout_nsec = timeout_sec_to_nsec(
            timeout_sec.timeout if isinstance(timeout_sec, TimeoutObject) else timeout_sec)
        if timeout_nsec > 0:
            timeout_timer = Timer(None, None, timeout_nsec, self._clock, context=self._context)

        yielded_work = False
        while not yielded_work and not self._is_shutdown and not condition():
            nodes_to_use = self.get_nodes() if nodes is None else nodes

            # tasks in progress (coroutines waiting on a future) before new work, as rclpy
            with self._tasks_lock:
                tasks = list(self._tasks)
            if tasks:
                for task, entity, node in reversed(tasks):
                    if (not task.executing() and not task.done() and
                            (node is None or node in nodes_to_use)):
                        yielded_work = True
                        yield task, entity, node
                with self._tasks_lock:
                    self._tasks = [t for t in self._tasks
                                   if not t[0].done() and not t[0].cancelled()]

            entered: list[Any] = []
            subs: list[Any] = []
            timers: list[Any] = []
            clients: list[Any] = []
            services: list[Any] = []
            guards: list[Any] = []
            waitables: list[Any] = []
            # pointer -> (node index, kind, position in the node's list, entity, node)
            owner: dict[int, tuple[int, int, int, Any, Any]] = {}
            n_events = 0
            try:
                for ni, node in enumerate(nodes_to_use):
                    for kind, entities, out in ((_TIMER, node.timers, timers),
                                                (_SUB, node.subscriptions, subs),
                                                (_CLIENT, node.clients, clients),
                                                (_SERVICE, node.services, services)):
                        for pos, ent in enumerate(entities):
                            if ent._executor_event or not ent.callback_group.can_execute(ent):
                                continue
                            handle = ent.handle
                            try:
                                handle.__enter__()
                            except InvalidHandle:
                                continue
                            entered.append(handle)
                            out.append(handle)
                            owner[handle.pointer] = (ni, kind, pos, ent, node)
                    for gc in node.guards:
                        if gc._executor_event or not gc.callback_group.can_execute(gc):
                            continue
                        if gc._executor_triggered:  # triggered, not yet handled: again
                            gc.trigger()
                        try:
                            gc.handle.__enter__()
                        except InvalidHandle:
                            continue
                        entered.append(gc.handle)
                        guards.append(gc)
                    for wt in node.waitables:
                        if wt._executor_event or not wt.callback_group.can_execute(wt):
                            continue
                        try:
                            wt.__enter__()
                        except InvalidHandle:
                            continue
                        entered.append(wt)
                        waitables.append((wt, node))
                if timeout_timer is not None:
                    timeout_timer.handle.__enter__()
                    entered.append(timeout_timer.handle)
                    timers.append(timeout_timer.handle)
                for gc in (self._guard, self._sigint_gc):
                    try:
                        gc.handle.__enter__()
                    except InvalidHandle:
                        continue
                    entered.append(gc.handle)
                    guards.append(gc)
                self._context.handle.__enter__()
                entered.append(self._context.handle)

                counts = NumberOfEntities(len(subs), len(guards), len(timers), len(clients),
                                          len(services))
                for wt, _node in waitables:
                    counts += wt.get_num_entities()
                n_events = counts.num_events
                key = (counts.num_subscriptions, counts.num_guard_conditions,
                       counts.num_timers, counts.num_clients, counts.num_services, n_events)
                wait_set = self._wait_set
                if wait_set is None or self._wait_set_counts != key:
                    wait_set = _rclpy.WaitSet(*key, self._context.handle)
                    self._wait_set, self._wait_set_counts = wait_set, key
                wait_set.clear_entities()
                for h in subs:
                    wait_set.add_subscription(h)
                for h in clients:
                    wait_set.add_client(h)
                for h in services:
                    wait_set.add_service(h)
                for h in timers:
                    wait_set.add_timer(h)
                for gc in guards:
                    wait_set.add_guard_condition(gc.handle)
                for wt, _node in waitables:
                    wt.add_to_wait_set(wait_set)

                wait_set.wait(timeout_nsec)
                if self._is_shutdown:
                    raise ShutdownException()
                if not self._context.ok():
                    raise ExternalShutdownException()

                guards_ready = wait_set.get_ready_entities("guard_condition")
                if guards_ready:
                    ready_gc = set(guards_ready)
                    for gc in guards:
                        if gc.handle.pointer in ready_gc:
                            gc._executor_triggered = True
                ready = []
                for what in ("timer", "subscription", "client", "service"):
                    for ptr in wait_set.get_ready_entities(what):
                        hit = owner.get(ptr)
                        if hit is not None:
                            ready.append(hit)
                timeout_ready = (timeout_timer is not None and
                                 timeout_timer.handle.pointer in
                                 wait_set.get_ready_entities("timer"))
                # waitables are asked while the wait set is alive, as rclpy does
                for wt, node in waitables:
                    if wt.is_ready(wait_set) and wt.callback_group.can_execute(wt):
                        yielded_work = True
                        yield self._make_handler(wt, node, self._take_waitable), wt, node
            finally:
                for handle in reversed(entered):
                    handle.__exit__(None, None, None)

            # the ready entities in rclpy's order: node by node, timers, subscriptions,
            # guard conditions, clients, services
            for ni, node in enumerate(nodes_to_use):
                for gc_pos, gc in enumerate(node.guards):
                    if gc._executor_triggered:
                        ready.append((ni, _GUARD, gc_pos, gc, node))
            ready.sort(key=lambda r: r[:3])
            for _ni, kind, _pos, ent, node in ready:
                if kind == _TIMER:
                    if ent.handle.is_timer_ready() and ent.callback_group.can_execute(ent):
                        yielded_work = True
                        yield self._make_handler(ent, node, self._take_timer), ent, node
                    continue
                if not ent.callback_group.can_execute(ent):
                    continue
                take = {_SUB: self._take_subscription, _GUARD: self._take_guard_condition,
                        _CLIENT: self._take_client, _SERVICE: self._take_service}[kind]
                yielded_work = True
                yield self._make_handler(ent, node, take), ent, node

            if timeout_nsec == 0 or timeout_ready:
                raise TimeoutException()
        if self._is_shutdown:
            raise ShutdownException()
        if condition():
            raise ConditionReachedException()
