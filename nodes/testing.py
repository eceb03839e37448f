"""Helpers for tests and the demo: a private rclpy context spun in a thread, synthetic
camera images, waits on conditions and node subprocesses that are always cleaned up.

Tests wait for what they need (a matched endpoint, a service, a received message, a
parameter value), never for a fixed time: on a busy machine discovery and start-up take
longer, and a fixed sleep or a short timeout then fails a correct program. ``WAIT_S`` only
bounds a hang.

Run anything that creates a ROS 2 context inside ``scripts/netns_run.sh`` (LOCALHOST
discovery in a fresh network namespace).
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
from av_infer_msgs.msg import InferRequest, InferResponse
from av_infer_msgs.srv import ListModels, LoadModel, UnloadModel
from av_infer_nodes.common import (
    PUB_EVENTS,
    REQUEST_QOS,
    REQUEST_TOPIC,
    RESPONSE_QOS_CLIENT,
    SUB_EVENTS,
    make_executor,
    request_msg,
    response_topic,
)
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState, GetState
from rclpy.context import Context
from rclpy.node import Node
from sensor_msgs.msg import Image

from av_infer import tensor_codec as codec

REPO = Path(__file__).resolve().parents[1]

#: Upper bound of every wait in the ROS tests: a hang guard, not a timing expectation.
WAIT_S = 120.0


class Collector:
    """Thread-safe list of received messages: a subscription callback whose ``snapshot``
    a test polls (``wait_for``) from its own thread."""

    def __init__(self) -> None:
        self.items: list = []
        self._lock = threading.Lock()

    def __call__(self, msg: Any) -> None:
        with self._lock:
            self.items.append(msg)

    def snapshot(self) -> list:
        with self._lock:
            return list(self.items)


class TesterNode(Node):
    """A plain node whose publishers and subscriptions add no QoS-event waitables unless a
    caller asks (``event_callbacks=``), like av_infer's own endpoints (``PUB_EVENTS``).

    Why: tests create and destroy endpoints while the executor spins. rclpy 7.1.5's
    ``_wait_for_ready_callbacks`` lists a node's waitables, then enters each (an
    ``InvalidHandle`` there is skipped) and later adds *every listed one* to the wait set
    (``add_to_wait_set`` is not guarded): an endpoint destroyed between the listing and the
    entering takes its ``EventHandler`` waitables with it, the spin raises ``InvalidHandle``
    and the executor stops for good. Endpoints without event handlers have no waitables;
    subscriptions themselves are handled safely there."""

    __test__ = False  # not a test class (pytest collects names starting with 'Test')

    def create_publisher(self, *args: Any, **kw: Any) -> Any:
        kw.setdefault("event_callbacks", PUB_EVENTS)
        return super().create_publisher(*args, **kw)

    def create_subscription(self, *args: Any, **kw: Any) -> Any:
        kw.setdefault("event_callbacks", SUB_EVENTS)
        return super().create_subscription(*args, **kw)


#: InvalidHandle recoveries within one second past which ``RosHarness`` stops spinning.
MAX_RECOVERIES_PER_S = 50


class RosHarness:
    """An rclpy context with an executor (``make_executor``) spinning in a background
    thread."""

    def __init__(self, num_threads: int = 4, args: list[str] | None = None,
                 executor: str | None = None, start: bool = True):
        self.context = Context()
        rclpy.init(context=self.context, args=args)
        self.executor = make_executor(executor, num_threads, context=self.context)
        self.nodes: list[Node] = []
        #: what ended the spin while the context was still ok (None: still spinning)
        self.spin_error: BaseException | None = None
        #: InvalidHandles the spin survived (a node destroyed while spinning; ``_spin``)
        self.spin_recoveries: list[str] = []
        self._thread = threading.Thread(target=self._spin, name="ros-harness", daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        """Starts spinning. ``start=False`` and this once every node and entity exists:
        rclpy 7.1.6's EventsExecutor blocks a thread that adds a node or creates a
        subscription while it spins (docs/ros.md, "Executor")."""
        if not self._thread.is_alive():
            self._thread.start()

    def _spin(self) -> None:
        """Spin until shutdown. An ``InvalidHandle`` while the context is ok is rclpy's
        race of a node destroyed while the executor spins (TesterNode's docstring: a wait
        set built from waitables listed before ``remove_node``, one of them destroyed
        before it is entered; the ``/parameter_events`` publisher rclpy's ``Node`` creates
        for every node carries a default incompatible-QoS event handler): the node is no
        longer in the executor, so the next wait set does not list it, and the harness
        spins on instead of leaving every later test of the process to time out (seen once
        in CI, 2026-11-27: test_ros_qos.py's remote case after its local one). The same
        error more than ``MAX_RECOVERIES_PER_S`` times within a second is no such race
        (the destroyed entity stays listed): the spin stops with it as ``spin_error``, so
        the waiting test fails naming it instead of spinning a core until its timeout."""
        from rclpy.exceptions import InvalidHandle

        burst: list[float] = []  # recent recoveries' times
        while True:
            try:
                self.executor.spin()
                return
            except InvalidHandle as exc:
                if not self.context.ok():
                    return
                self.spin_recoveries.append(str(exc))
                now = time.monotonic()
                burst = [t for t in burst if now - t < 1.0] + [now]
                if len(burst) > MAX_RECOVERIES_PER_S:  # not the one-off race: a loop
                    self._spin_failed(exc)
                    return
                print(f"ros-harness: a destroyed entity in the executor's wait set ({exc}); "
                      "spinning on", file=sys.stderr, flush=True)
            except Exception as exc:  # noqa: BLE001 - shutdown races end the spin
                self._spin_failed(exc)
                return

    def _spin_failed(self, exc: BaseException) -> None:
        if self.context.ok():  # not a shutdown race: keep it for the caller, and say so
            # at once (every later wait in the process would only time out)
            self.spin_error = exc
            traceback.print_exception(exc, file=sys.stderr)
            print(f"ros-harness: the executor stopped spinning: {type(exc).__name__}: "
                  f"{exc}", file=sys.stderr, flush=True)

    def add(self, node: Node) -> Node:
        self.nodes.append(node)
        self.executor.add_node(node)
        return node

    def node(self, name: str, **kw: Any) -> Node:
        """A tester node (``TesterNode``: endpoints safe to destroy while spinning)."""
        return self.add(TesterNode(name, context=self.context, **kw))

    def close(self) -> None:
        for node in reversed(self.nodes):
            self.executor.remove_node(node)
            node.destroy_node()
        self.nodes.clear()
        self.executor.shutdown(timeout_sec=2.0)
        if self.context.ok():
            rclpy.shutdown(context=self.context)
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def __enter__(self) -> RosHarness:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def wait_for(pred: Callable[[], Any], timeout: float = WAIT_S, period: float = 0.02,
             what: str = "condition") -> Any:
    """Polls ``pred`` until truthy and returns its value; raises TimeoutError naming
    ``what`` after ``timeout`` (a hang guard: ``WAIT_S`` unless a test knows better)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            # what every thread was doing: a hang (an executor blocked in a callback, a
            # stopped spin) shows in the failure's captured stderr
            print(f"wait_for: timed out waiting for {what}; thread stacks:", file=sys.stderr,
                  flush=True)
            dump_threads(sys.stderr)
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(period)


def dump_threads(out: Any) -> None:
    """Every thread's name and stack, written to ``out`` (a hang's diagnosis)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        print(f"--- thread {names.get(ident, '?')} ({ident})", file=out)
        print("".join(traceback.format_stack(frame)), file=out)
    out.flush()


def wait_matched(*endpoints: Any, timeout: float = WAIT_S, what: str = "discovery") -> None:
    """Waits until every publisher has a matched subscription and every subscription a
    matched publisher (DDS drops what is published before matching)."""

    def matched(e: Any) -> bool:
        count = getattr(e, "get_subscription_count", None) or e.get_publisher_count
        return count() > 0

    wait_for(lambda: all(matched(e) for e in endpoints), timeout, what=what)


def wait_future(fut: Any, timeout: float = WAIT_S, what: str = "a reply") -> Any:
    """The result of a (rclpy or concurrent.futures) future, waiting at most ``timeout``."""
    wait_for(fut.done, timeout, what=what)
    return fut.result()


def wait_reply(send: Callable[[], Any], timeout: float = WAIT_S, resend_s: float = 5.0,
               what: str = "a reply") -> Any:
    """The first answer to an *idempotent* service request (a get, a state query, setting a
    parameter to a value), sending it again every ``resend_s`` until one answer arrives.

    Why: a service's response can be lost while discovery is still going on. rmw_fastrtps
    sends a response only once the server has matched the client's response reader and
    waits at most 100 ms for that (ros2/rmw_fastrtps #390, #467); rclpy then logs "failed to
    send response (timeout)" and drops it. ``wait_for_service`` cannot see that side of the
    match, so on a busy machine the first request after it can go unanswered forever (seen
    once in CI: get_parameters to a node process, 120 s without a reply). A later request
    finds the reader matched. Requests that change state differently when repeated
    (a lifecycle transition, loading a model) must not use this."""
    futures = [send()]
    next_send = time.monotonic() + resend_s

    def answered() -> Any:
        nonlocal next_send
        done = next((f for f in futures if f.done()), None)
        if done is None and time.monotonic() >= next_send:
            print(f"wait_reply: no answer to {what} after {resend_s:g} s; sending it again",
                  file=sys.stderr, flush=True)
            futures.append(send())
            next_send = time.monotonic() + resend_s
        return done

    return wait_for(answered, timeout, what=f"{what} (re-sent every {resend_s:g} s)").result()


def make_image(node: Node, frame_id: str, height: int = 48, width: int = 64,
               encoding: str = "rgb8", seed: int = 0, stamp: Any = None) -> Image:
    """A synthetic camera frame (moving gradient + noise) stamped with the node's clock."""
    rng = np.random.default_rng(seed)
    ch = 1 if encoding == "mono8" else 3
    yy, xx = np.mgrid[0:height, 0:width]
    base = ((xx + yy + seed * 7) % 256).astype(np.uint8)
    img = np.repeat(base[:, :, None], ch, axis=2)
    img = (img + rng.integers(0, 32, img.shape, dtype=np.uint8)).astype(np.uint8)
    msg = Image()
    msg.header.stamp = stamp if stamp is not None else node.get_clock().now().to_msg()
    msg.header.frame_id = frame_id
    msg.height, msg.width, msg.encoding = height, width, encoding
    msg.is_bigendian = 0
    msg.step = width * ch
    msg.data = img.tobytes()
    return msg


class CameraFrame:
    """A camera frame published as a camera driver publishes it: the message serialised
    once (``rclpy.serialization.serialize_message``), then per publication only its
    header stamp rewritten (the 8 bytes after the encapsulation header: ``int32`` sec,
    ``uint32`` nanosec, little-endian XCDR1) and the bytes handed to
    ``Publisher.publish(bytes)``.

    Why: a ``Publisher.publish(msg)`` from Python converts the whole message to its C
    struct first, the pixels included (a 320x240 rgb8 frame: ~0.25 ms of the demo's
    0.9-1.1 ms "ROS path minus direct call", ``scripts/ros_executor_hops.py``'s ``camera
    publish()``), a cost of the Python stand-in for a camera that a driver written against
    rclcpp or a GXF camera never pays; what stays is what any publisher pays, the DDS
    write of the bytes (docs/ros.md). ``msg`` stays readable (its stamp is the one it was
    serialised with)."""

    def __init__(self, msg: Any) -> None:
        from rclpy.serialization import serialize_message

        self.msg = msg
        self._raw = serialize_message(msg)
        if self._raw[:4] != b"\x00\x01\x00\x00":  # XCDR1 little-endian, no options
            raise ValueError(f"unexpected encapsulation {self._raw[:4]!r}")
        self._tail = memoryview(self._raw)[12:]

    def stamped(self, sec: int, nanosec: int) -> bytes:
        """The serialised frame with the header stamp ``(sec, nanosec)``."""
        return b"".join((self._raw[:4], struct.pack("<iI", sec, nanosec), self._tail))

    def publish(self, pub: Any, clock: Any) -> None:
        """Publish it on ``pub`` stamped with ``clock``'s now."""
        pub.publish(self.stamped(*clock.now().seconds_nanoseconds()))


class NodeProcess:
    """``python -m <module> --ros-args ...`` as a child; ``stop()`` sends SIGINT, then kills.

    Output goes to a log file (``log``) so a chatty child never blocks on a full pipe.
    """

    def __init__(self, module: str, ros_args: Sequence[str] = (), args: Sequence[str] = (),
                 log_dir: Path | None = None, env: dict[str, str] | None = None):
        log_dir = Path(log_dir or os.environ.get("TMPDIR", "/tmp"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log = log_dir / f"{module.rsplit('.', 1)[-1]}-{os.getpid()}-{id(self)}.log"
        cmd = [sys.executable, "-m", module, *args]
        if ros_args:
            cmd += ["--ros-args", *ros_args]
        self.cmd = cmd
        # faulthandler: a child that crashes (SIGSEGV) leaves every thread's stack in its log
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1", **(env or {}))
        self._log_file = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=self._log_file,
                                     stderr=subprocess.STDOUT)

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = WAIT_S) -> int:
        """SIGINT (Ctrl-C), wait for the exit (``timeout`` bounds a hang); SIGKILL if it
        hangs. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5.0)
        self._log_file.close()
        return self.proc.returncode


class RuntimeHostClient:
    """Another process's view of a runtime host node (tests): its lifecycle services,
    typed requests (each answer collected) and model services."""

    def __init__(self, tester: Node, node: str = "av_infer_runtime") -> None:
        self.node = tester
        self.get_state = tester.create_client(GetState, f"/{node}/get_state")
        self.change = tester.create_client(ChangeState, f"/{node}/change_state")
        self.load = tester.create_client(LoadModel, "/av_infer/load_model")
        self.unload = tester.create_client(UnloadModel, "/av_infer/unload_model")
        self.list = tester.create_client(ListModels, "/av_infer/list_models")
        for c in (self.get_state, self.change, self.load, self.unload, self.list):
            assert c.wait_for_service(timeout_sec=WAIT_S), c.srv_name
        # One harmless request per client (refused or read-only: nothing changes), re-sent
        # until answered (``wait_reply``): once one answer came back the host has matched
        # this client's response reader, so the answers of the tests' own calls, which are
        # not all safe to repeat (transitions, loads), cannot be lost in discovery.
        for c, probe in ((self.get_state, GetState.Request()),
                         (self.change, ChangeState.Request(transition=Transition(
                             label="av_infer_test_probe"))),  # none such: a WARN line
                         (self.load, LoadModel.Request(name="", path="")),  # invalid
                         (self.unload, UnloadModel.Request(name="")),  # unknown
                         (self.list, ListModels.Request())):
            wait_reply(lambda c=c, probe=probe: c.call_async(probe),
                       what=f"{c.srv_name} (a probe)")
        self._lock = threading.Lock()
        self.responses: list[InferResponse] = []
        # the host answers client "lc" (``ask``) on its own topic; the publisher there is
        # made by the first request, and what it sent before matching is kept for us
        self.sub = tester.create_subscription(InferResponse, response_topic("lc"), self._on,
                                              RESPONSE_QOS_CLIENT)
        self.pub = tester.create_publisher(InferRequest, REQUEST_TOPIC, REQUEST_QOS)
        wait_matched(self.pub)
        self._n = 0

    def _on(self, msg: InferResponse) -> None:
        with self._lock:
            self.responses.append(msg)

    def state(self) -> int:
        return wait_future(self.get_state.call_async(GetState.Request()),
                           what="get_state").current_state.id

    def transition(self, tid: int) -> bool:
        req = ChangeState.Request(transition=Transition(id=tid))
        return wait_future(self.change.call_async(req), what=f"transition {tid}").success

    def ask(self, x: np.ndarray, model: str = "tiny_cnn") -> InferResponse:
        """One request; its (only) answer."""
        self._n += 1
        rid = f"lc-{self._n}"
        ctrl = codec.RequestControl(id=rid, model=model, client="lc", priority="RT",
                                    stamp=(0, 0), frame_id="", deadline_s=None,
                                    drop_late=False)
        self.pub.publish(request_msg(ctrl, {"input": x}))

        def answer():
            with self._lock:
                return [r for r in self.responses if r.id == rid]

        got = wait_for(answer, what=f"the answer to {rid}")
        assert len(got) == 1
        return got[0]

    def call(self, client, req):
        return wait_future(client.call_async(req), what=client.srv_name)
