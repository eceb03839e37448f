"""LeanExecutor: rclpy's single-threaded executor with a cheaper iteration, split in two.

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

What this changes: one pass gathers the entities, enters their handles (plain
``__enter__``/``__exit__``, the same guarantee that no handle is destroyed while waited on)
and remembers which ready pointer belongs to which entity; the ``WaitSet`` is kept while
the entity counts stay the same (``clear_entities`` and re-add, as rclcpp does); after the
wait only the ready entities are looked up (ordered as rclpy orders them: node by node,
timers, subscriptions, guard conditions, clients, services); and the handlers do not
trigger the executor's guard condition. And ``spin()`` splits the wait in two: the data
path (subscriptions and guard conditions: images, requests, answers, ``Handoff``
completions; ~12 entities in the demo) is waited on by a thread of its own, the rest
(the ~58 parameter, lifecycle and model services, timers, clients, waitables, and
coroutine tasks) by the calling thread. The rmw wait and the Python around it grow with
the entities in the wait set: the output's hop to a subscriber on the same executor took
0.8-1.0 ms with all 78 entities in one lean wait set, 0.4-0.5 with ~30, and 0.39-0.44 ms
split (1.1-1.2 ms on rclpy's executor; docs/ros.md, "ROS overhead"). The data-path thread
also calls a plain callback directly (take, then call) instead of through a ``Task`` and its
two coroutines, and waits without the generator (``_spin_hot``; 2026-11-27: the output hop
0.30-0.38 -> 0.21-0.27 ms in three alternating pairs).
Everything else is rclpy's: ``Task``/coroutine callbacks, callback groups,
``spin_once``/``spin_until_future_complete`` (one thread, every entity), waitables,
shutdown and ``create_task`` wake-ups.

Guarantees: the same callbacks run, each once per ready event, never two at once (one
lock around every callback, on either thread: the nodes' single-threaded assumptions
hold); a callback that leaves another role's entity out of its wait set (a shared
mutually exclusive callback group) wakes that role's thread when it ends, and a data-path
callback wakes the other thread while coroutine tasks are pending (the host's LoadModel
awaits a future a ``Handoff`` completion sets); entity lists are re-read on every
iteration, so nodes and endpoints may be added or destroyed while it spins (a destroyed
endpoint is skipped, as rclpy skips it). A callback that blocks waiting for another
callback deadlocks, as on rclpy's single-threaded executor. Written against rclpy 7.1.x's
``Executor`` internals (``_tasks``, ``_guard``, ``_sigint_gc``, ``_make_handler``, the
``_take_*`` methods); ``tests/nodes/test_ros_lean_executor.py`` checks the contract and
``tests/nodes/test_ros_nodes.py`` runs its graph on it.
"""

from __future__ import annotations

import inspect
import threading
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
from rclpy.guard_condition import GuardCondition
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.subscription import Subscription
from rclpy.task import Task
from rclpy.timer import Timer
from rclpy.utilities import timeout_sec_to_nsec
from rclpy.waitable import NumberOfEntities

#: ``spin()``'s threads wait at most this long (ns) before building their wait set again,
#: data path / the rest: a wake-up that never comes (none is known; one demo run of about
#: twenty printed no ROS-overhead line, cause unknown, docs/ros.md) then costs this much
#: latency, not a stall. An idle re-check costs ~0.1-0.3 ms of CPU on the demo graph.
RECHECK_NS = {"hot": 100_000_000, "cold": 500_000_000}
#: after the data path's callbacks, waits without blocking on the same gathered entities
#: (``LeanExecutor._spin_hot``) at most this many times before gathering again
HOT_REPOLLS = 4

# rclpy's order of yielding the ready entities of one node
_TIMER, _SUB, _GUARD, _CLIENT, _SERVICE = range(5)
_MESSAGE_ONLY = Subscription.CallbackType.MessageOnly



def _enter_entities(ents: Any, ni: int, kind: int, node: Any, role: str, executable: Any,
                    out: list[Any], owner: dict[int, tuple[int, int, int, Any, Any]],
                    entered: list[Any]) -> None:
    """Enter the handle of each entity of ``ents`` (node ``ni``'s, of ``kind``) that
    ``role`` may run, skipping destroyed ones: appended to ``out`` and ``entered`` (left
    by the caller), its owner recorded by pointer (node index, kind, position, entity,
    node): the wait set's entities, as both ``_spin_hot`` and ``_spin_role`` gather them."""
    for pos, ent in enumerate(ents):
        if not executable(ent, role):
            continue
        handle = ent.handle
        try:
            handle.__enter__()
        except InvalidHandle:
            continue
        entered.append(handle)
        out.append(handle)
        owner[handle.pointer] = (ni, kind, pos, ent, node)

class LeanExecutor(SingleThreadedExecutor):
    """A ``SingleThreadedExecutor`` whose iteration costs less (see the module docstring).

    ``spin()`` with ``split`` (default) waits on two threads: the data path
    (subscriptions and guard conditions: images, requests, answers, ``Handoff``
    completions) on one, everything else (services, timers, clients, waitables, tasks) on
    the calling thread, each on a wait set of its own; one lock runs one callback at a time,
    so callbacks still never overlap. ``spin_once``/``spin_until_future_complete`` wait on
    everything on the calling thread."""

    def __init__(self, *, context: Any = None, split: bool = True) -> None:
        super().__init__(context=context)
        self.split = split
        #: role -> (entity counts, WaitSet): kept while the counts stay the same
        self._wait_sets: dict[str, tuple[tuple[int, ...], Any]] = {}
        #: wakes the data-path thread (the base ``_guard`` wakes the calling thread)
        self._hot_guard = GuardCondition(None, None, self._context)
        self._callback_lock = threading.Lock()
        #: a role left an entity out because the other role ran a callback of its group:
        #: the other role wakes it when its callback is done (``_block_lock`` orders the two)
        self._blocked = {"hot": False, "cold": False}
        self._block_lock = threading.Lock()
        self._role_iters: dict[str, Any] = {}
        self._stop_hot = False

    # -- wake-ups ------------------------------------------------------------------------
    def _wake_hot(self) -> None:
        try:
            self._hot_guard.trigger()
        except (InvalidHandle, AttributeError):  # shut down meanwhile
            pass

    def wake(self) -> None:
        super().wake()
        self._wake_hot()

    def add_node(self, node: Any) -> bool:
        added = super().add_node(node)
        self._wake_hot()
        return added

    def remove_node(self, node: Any) -> None:
        super().remove_node(node)
        self._wake_hot()

    def shutdown(self, timeout_sec: float | None = None) -> bool:
        self._stop_hot = True
        self._wake_hot()
        done = super().shutdown(timeout_sec)
        if done and self._hot_guard is not None:
            self._hot_guard.destroy()
            self._hot_guard = None
        return done

    # -- spinning ------------------------------------------------------------------------
    def spin(self) -> None:
        """Until shutdown; with ``split``, the data path on a thread of its own."""
        if not self.split:
            super().spin()
            return
        errors: list[BaseException] = []
        self._stop_hot = False

        def hot() -> None:
            try:
                while (self._context.ok() and not self._is_shutdown and not self._stop_hot):
                    self._spin_hot()
            except (ShutdownException, ExternalShutdownException):
                pass
            except BaseException as exc:  # noqa: BLE001 - re-raised from spin()
                errors.append(exc)
            finally:
                try:
                    self._guard.trigger()  # the calling thread checks what happened
                except (InvalidHandle, AttributeError):
                    pass

        thread = threading.Thread(target=hot, name="lean-executor-data", daemon=True)
        thread.start()
        try:
            while self._context.ok() and not self._is_shutdown and not errors:
                self._spin_role("cold", lambda: bool(errors))
        finally:
            self._stop_hot = True
            self._wake_hot()
            thread.join(5.0)
        if errors:
            raise errors[0]

    def _spin_role(self, role: str, stop: Callable[[], bool] | None = None) -> None:
        condition = (lambda: self._stop_hot) if role == "hot" else (stop or (lambda: False))
        while True:
            gen = self._role_iters.get(role)
            if gen is None:
                gen = self._role_iters[role] = self._wait_for_ready_callbacks(
                    None, None, condition, role=role)
            try:
                handler, _entity, _node = next(gen)
                break
            except StopIteration:
                self._role_iters[role] = None
            except (TimeoutException, ConditionReachedException, ShutdownException):
                self._role_iters[role] = None
                return
            except BaseException:
                self._role_iters[role] = None
                raise
        self._run_on_role(handler, role)

    def _run_on_role(self, handler: Task, role: str) -> None:
        """``handler`` under the callback lock, then ``_after_callback``; its exception
        raised."""
        with self._callback_lock:
            handler()
        if handler.done():  # rclpy leaves it to the next tasks pass; that is the cold role
            with self._tasks_lock:
                self._tasks = [t for t in self._tasks if t[0] is not handler]
        self._after_callback(role)
        if handler.exception() is not None:
            raise handler.exception()

    def _after_callback(self, role: str) -> None:
        """Wake the other role's thread where it left out an entity of a group this
        callback held, or (data path) while coroutine tasks are pending."""
        other = "cold" if role == "hot" else "hot"
        with self._block_lock:
            wake_other = self._blocked[other]
            self._blocked[other] = False
        if role == "hot" and self._tasks:
            wake_other = True  # a task (coroutine) may wait on what this callback did
        if wake_other:
            if other == "hot":
                self._wake_hot()
            else:
                try:
                    self._guard.trigger()
                except (InvalidHandle, AttributeError):
                    pass

    def _spin_hot(self) -> None:
        """One gather of the data path's entities, a wait, and every ready callback after
        it, then (``HOT_REPOLLS``) waits again on the same entities without blocking while
        the callbacks left something ready, on ``spin()``'s data-path thread: what
        ``_spin_role("hot")`` does, without its generator and, for a plain (not coroutine)
        callback, without a ``Task``: the message is taken and the callback called right
        here, inside the same callback-group begin/end, work tracker and callback lock (an
        exception leaves ``spin()`` as the ``Task``'s did). A coroutine callback still goes
        through ``_make_handler`` (it may await; the calling thread resumes it). Why: on
        the demo's graph the generator, the ``Task`` and its coroutines were most of the
        0.14 ms between the wait returning and the image being taken and of the 0.22 ms
        between a callback's end and the next wait returning (docs/ros.md, "ROS path
        cost"); and the gather (every node's entities, each one's group checked and handle
        entered) is most of what is left of the second: an output published in a callback
        and taken by a subscriber on the same executor waited for it.

        The re-poll keeps the gathered handles entered through the callbacks (a callback
        that destroys an entity defers its destruction to their exit; its take then finds
        it gone and skips it, as rclpy does) and ends at the first wait that finds nothing
        ready, when the thread's own guard condition was triggered (a node added or
        removed, ``wake()``, shutdown: the next gather sees it), or after ``HOT_REPOLLS``
        waits, so an entity created meanwhile, or one skipped for a busy group, is waited
        on by the next gather within that many rounds."""
        subs: list[Any] = []
        guards: list[Any] = []
        entered: list[Any] = []
        owner: dict[int, tuple[int, int, int, Any, Any]] = {}
        executable = self._executable
        try:
            for ni, node in enumerate(self.get_nodes()):
                _enter_entities(node._subscriptions, ni, _SUB, node, "hot", executable, subs,
                                owner, entered)
                for pos, gc in enumerate(node._guards):
                    if not executable(gc, "hot"):
                        continue
                    if gc._executor_triggered:  # triggered, not yet handled: again
                        gc.trigger()
                    try:
                        gc.handle.__enter__()
                    except InvalidHandle:
                        continue
                    entered.append(gc.handle)
                    guards.append((ni, pos, gc, node))
            own = self._hot_guard
            if own is None:  # shut down meanwhile
                raise ShutdownException()
            own.handle.__enter__()
            entered.append(own.handle)
            self._context.handle.__enter__()
            entered.append(self._context.handle)

            key = (len(subs), len(guards) + 1, 0, 0, 0, 0)
            cached = self._wait_sets.get("hot")
            if cached is None or cached[0] != key:
                cached = self._wait_sets["hot"] = (key, _rclpy.WaitSet(
                    *key, self._context.handle))
            wait_set = cached[1]
            timeout = RECHECK_NS["hot"]
            for _ in range(1 + HOT_REPOLLS):
                wait_set.clear_entities()
                for h in subs:
                    wait_set.add_subscription(h)
                for _ni, _pos, gc, _node in guards:
                    wait_set.add_guard_condition(gc.handle)
                wait_set.add_guard_condition(own.handle)

                wait_set.wait(timeout)
                if self._is_shutdown:
                    raise ShutdownException()
                if not self._context.ok():
                    raise ExternalShutdownException()

                ready: list[tuple[int, int, int, Any, Any]] = []
                woken = False
                gcs_ready = wait_set.get_ready_entities("guard_condition")
                if gcs_ready:
                    gcs_ready = set(gcs_ready)
                    woken = own.handle.pointer in gcs_ready
                    for ni, pos, gc, node in guards:
                        if gc.handle.pointer in gcs_ready:
                            gc._executor_triggered = True
                            ready.append((ni, _GUARD, pos, gc, node))
                for ptr in wait_set.get_ready_entities("subscription"):
                    hit = owner.get(ptr)
                    if hit is not None:
                        ready.append(hit)
                self._run_ready(ready)
                if woken or not ready:
                    break
                timeout = 0  # again at once: what the callbacks left ready
        finally:
            for handle in reversed(entered):
                handle.__exit__(None, None, None)

    def _run_ready(self, ready: list[tuple[int, int, int, Any, Any]]) -> None:
        """The ready entities' callbacks in rclpy's order (node by node, subscriptions,
        guard conditions), each skipped while its group cannot run it or a ``Task`` of
        it is pending."""
        if len(ready) > 1:
            ready.sort(key=lambda r: r[:3])
        for _ni, kind, _pos, ent, node in ready:
            if self._is_shutdown:
                raise ShutdownException()
            if ent._executor_event or not ent.callback_group.can_execute(ent):
                continue
            if inspect.iscoroutinefunction(ent.callback):
                self._run_on_role(self._make_handler(
                    ent, node, self._take_subscription if kind == _SUB
                    else self._take_guard_condition), "hot")
            else:
                self._run_direct(ent, kind == _SUB)

    def _run_direct(self, ent: Any, is_sub: bool) -> None:
        """rclpy's handler for a plain callback, called here instead of through a
        ``Task``: the group's permission, the take (the message, or the guard's trigger
        reset), the callback, the group released; then the other role woken if it waits
        for this callback's group (as ``_run_on_role``)."""
        group = ent.callback_group
        exc: BaseException | None = None
        with self._callback_lock:
            if group.beginning_execution(ent):
                try:
                    with self._work_tracker:
                        if is_sub:
                            info = self._take_direct(ent)
                            if info is not None:
                                if ent._callback_type is _MESSAGE_ONLY:
                                    ent.callback(info[0])
                                else:
                                    ent.callback(*info)
                        else:
                            ent._executor_triggered = False
                            ent.callback()
                except Exception as e:  # noqa: BLE001 - raised from spin(), as a Task's
                    exc = e
                finally:
                    group.ending_execution(ent)
        self._after_callback("hot")
        if exc is not None:
            raise exc

    @staticmethod
    def _take_direct(sub: Any) -> Any:
        """``(message, message info)`` of a ready subscription, or None (nothing there, or
        destroyed meanwhile: skipped, as rclpy skips it)."""
        try:
            with sub.handle:
                return sub.handle.take_message(sub.msg_type, sub.raw)
        except InvalidHandle:
            return None

    def _make_handler(self, entity: Any, node: Any, take_from_wait_list: Callable) -> Task:
        """rclpy's handler without the two guard-condition triggers: they wake the other
        threads of a multi-threaded executor so the entity is waited on again; here the
        thread that ran the handler builds its next wait set after it (and ``_spin_role``
        wakes the other role's thread where that one waits for this callback)."""
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

    def _take_timer(self, tmr: Any) -> Any:
        """rclpy's, except that a timer another thread cancelled between the ready check
        and this call is skipped (as rclpy skips a destroyed one) instead of raising
        ``RCLError: timer is canceled`` out of ``spin``, which stopped the executor for
        good: the demo cancels its camera timers from its main thread while the calling
        thread runs timers (one demo run printed no ROS-overhead line, its spin stopped with
        that error; docs/ros.md, "ROS path cost")."""
        try:
            return super()._take_timer(tmr)
        except _rclpy.RCLError as exc:
            # rcl's RCL_RET_TIMER_CANCELED; its message, since the timer may be reset again
            # by the time we look (is_canceled() is then False)
            if tmr.is_canceled() or "timer is canceled" in str(exc):
                return None
            raise

    def _executable(self, ent: Any, role: str) -> bool:
        if ent._executor_event:
            return False
        if ent.callback_group.can_execute(ent):
            return True
        if role != "all":
            with self._block_lock:  # re-checked under the lock: see ``_blocked``
                if ent.callback_group.can_execute(ent):
                    return True
                self._blocked[role] = True
        return False

    def _wait_for_ready_callbacks(
        self, timeout_sec: float | TimeoutObject | None = None, nodes: list[Any] | None = None,
        condition: Callable[[], bool] = lambda: False, role: str = "all",
    ) -> Generator[tuple[Task, Any, Any], None, None]:
        """rclpy's generator (same contract), for ``role``: ``all`` (every entity and the
        tasks), ``hot`` (subscriptions and guard conditions) or ``cold`` (the rest and the
        tasks)."""
        hot, cold = role in ("all", "hot"), role in ("all", "cold")
        timeout_timer = None
        timeout_nsec = timeout_sec_to_nsec(
            timeout_sec.timeout if isinstance(timeout_sec, TimeoutObject) else timeout_sec)
        if timeout_nsec > 0:
            timeout_timer = Timer(None, None, timeout_nsec, self._clock, context=self._context)

        yielded_work = False
        while not yielded_work and not self._is_shutdown and not condition():
            nodes_to_use = self.get_nodes() if nodes is None else nodes

            # tasks in progress (coroutines waiting on a future) before new work, as rclpy
            if cold:
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
            ready: list[tuple[int, int, int, Any, Any]] = []
            timeout_ready = False
            kinds = ((((_TIMER, "timers", timers), (_CLIENT, "clients", clients),
                       (_SERVICE, "services", services)) if cold else ())
                     + (((_SUB, "subscriptions", subs),) if hot else ()))
            try:
                for ni, node in enumerate(nodes_to_use):
                    for kind, attr, out in kinds:
                        _enter_entities(getattr(node, attr), ni, kind, node, role,
                                        self._executable, out, owner, entered)
                    if hot:
                        for gc in node.guards:
                            if not self._executable(gc, role):
                                continue
                            if gc._executor_triggered:  # triggered, not yet handled: again
                                gc.trigger()
                            try:
                                gc.handle.__enter__()
                            except InvalidHandle:
                                continue
                            entered.append(gc.handle)
                            guards.append(gc)
                    if cold:
                        for wt in node.waitables:
                            if not self._executable(wt, role):
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
                own = ((self._guard, self._sigint_gc) if role == "all" else
                       (self._hot_guard,) if role == "hot" else (self._guard, self._sigint_gc))
                for gc in own:
                    if gc is None:  # shut down meanwhile
                        raise ShutdownException()
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
                key = (counts.num_subscriptions, counts.num_guard_conditions,
                       counts.num_timers, counts.num_clients, counts.num_services,
                       counts.num_events)
                cached = self._wait_sets.get(role)
                if cached is None or cached[0] != key:
                    cached = self._wait_sets[role] = (key, _rclpy.WaitSet(
                        *key, self._context.handle))
                wait_set = cached[1]
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

                wait_set.wait(RECHECK_NS[role] if role != "all" and timeout_nsec < 0
                              else timeout_nsec)
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
                for what in (("timer", "client", "service") if cold else ()) + (
                        ("subscription",) if hot else ()):
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
            if hot:
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
