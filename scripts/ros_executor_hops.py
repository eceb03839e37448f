#!/usr/bin/env python3
"""Where one image's ROS path spends its time, step by step, beside the direct path.

The demo's graph (runtime host, two perception nodes, a monitoring node and a camera
node that also subscribes the front output; ``--graph small``: the front perception node
and the camera node only), one 320x240 rgb8 image to inception_v3 (scaled) at a time.
Each round: 50 warm-up pairs, then ``-n`` pairs of one ROS-path image and one direct
``Runtime.submit(...).result()`` of the same preprocessed tensor (the demo's two paths,
interleaved so both see the same machine state), ``--pause-ms`` apart. ``--rounds R``
repeats that; every round is printed.

Timestamps (``perf_counter``) from wrapping rclpy's ``WaitSet.wait``,
``Executor._take_subscription``, ``Publisher.publish``, the image node's callback,
``image_to_tensor`` and ``_publish``; per step, p50 (ms) per round:

* ``camera publish()``: the camera's ``Publisher.publish`` (the DDS write and Fast DDS's
  intra-process delivery, on the publishing thread; the frame serialised once and
  re-stamped, as the demo's cameras publish, ``testing.CameraFrame``; ``--typed-camera``:
  the ``Image`` message, converted by rclpy on every publication);
* ``DDS -> wait returns``: its return to the executor's wait returning;
* ``wake -> take``: the executor's work between the wait and taking the image;
* ``take image``: ``take_message`` (since 2026-11-28 the node's subscription is raw: the
  serialised bytes, read in the callback head by ``tensor_codec.read_image``; before,
  deserialisation into a Python ``Image``);
* ``take -> callback``: the executor's dispatch to the image callback;
* ``callback head``: the callback up to preprocessing (checks, bookkeeping);
* ``preprocess``: ``image_to_tensor``;
* ``submit + inference``: preprocessing's end to ``_publish`` (the request built, submitted
  and, with ``run_in_callback``, run on this thread);
* ``build output``: ``_publish`` to the output's ``publish()`` call (the ``TensorList``,
  written as serialised bytes since 2026-11-28);
* ``output publish()``; ``callback tail``: after it (debug topics, listeners) to the
  callback's end;
* ``DDS -> wait returns (out)``, ``wake -> take (out)``, ``take output``,
  ``take -> subscriber``: the output's way to the subscriber's callback on the same executor
  (``--consumer-read``: ``raw``, the default since 2026-11-28 as in the demo, takes the
  serialised bytes and reads them with ``tensor_codec.read_tensor_list_cdr`` in the
  callback; ``typed``, rclpy's deserialisation into a ``TensorList`` in the take).

``ROS path`` is the camera's publish call to the subscriber's callback having the output's
arrays (``raw``) or message (``typed``) (the demo's figure), ``direct`` the interleaved
``infer()`` (``submit().result()`` before 2026-11-27 08:00 UTC), ``added`` their difference
(p50 and p99, as the demo prints them). A step the executor does not go through (rclpy's
C++ ``EventsExecutor`` calls no Python wait or take) is ``-``.

    scripts/netns_run.sh .venv/bin/python scripts/ros_executor_hops.py --executor lean
    scripts/netns_run.sh .venv/bin/python scripts/ros_executor_hops.py --rounds 3 --json -

Wall clock on a shared machine: compare settings in alternating runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import numpy as np
import rclpy.executors as rclpy_executors
import rclpy.publisher as rclpy_publisher
from rclpy.impl.implementation_singleton import rclpy_implementation as _real

EV: list[tuple[str, str, float]] = []  # (kind, topic or "", perf_counter)
IMAGE_TOPIC, OUTPUT_TOPIC = "/front/image_raw", "/perception_front/output/tensors"
STEPS = ["camera publish()", "DDS -> wait returns", "wake -> take", "take image",
         "take -> callback", "callback head", "preprocess", "submit + inference",
         "build output", "output publish()", "callback tail", "DDS -> wait returns (out)",
         "wake -> take (out)", "take output", "take -> subscriber"]


class _WaitSet:
    """rclpy's WaitSet, recording when each wait returns."""

    def __init__(self, *a):  # noqa: ANN002
        self._w = _real.WaitSet(*a)

    def wait(self, timeout):  # noqa: ANN001, ANN201
        r = self._w.wait(timeout)
        EV.append(("woke", "", time.perf_counter()))
        return r

    def __getattr__(self, name):  # noqa: ANN001, ANN204
        return getattr(self._w, name)


class _Impl:
    WaitSet = _WaitSet

    def __getattr__(self, name):  # noqa: ANN001, ANN204
        return getattr(_real, name)


def _instrument() -> None:
    from av_infer_nodes import image_node as imn
    from av_infer_nodes import lean_executor

    rclpy_executors._rclpy = lean_executor._rclpy = _Impl()
    take = rclpy_executors.Executor._take_subscription

    def timed_take(self, sub):  # noqa: ANN001, ANN202
        EV.append(("take", sub.topic_name, time.perf_counter()))
        r = take(self, sub)
        EV.append(("taken", sub.topic_name, time.perf_counter()))
        return r

    rclpy_executors.Executor._take_subscription = timed_take
    # lean's data path takes without a Task (since 2026-11-27; absent before: A/B runs)
    take_direct = getattr(lean_executor.LeanExecutor, "_take_direct", None)

    def timed_take_direct(sub):  # noqa: ANN001, ANN202
        EV.append(("take", sub.topic_name, time.perf_counter()))
        r = take_direct(sub)
        EV.append(("taken", sub.topic_name, time.perf_counter()))
        return r

    if take_direct is not None:
        lean_executor.LeanExecutor._take_direct = staticmethod(timed_take_direct)
    pub = rclpy_publisher.Publisher.publish

    def timed_pub(self, msg):  # noqa: ANN001, ANN202
        EV.append(("pub", self.topic_name, time.perf_counter()))
        pub(self, msg)
        EV.append(("pub_end", self.topic_name, time.perf_counter()))

    rclpy_publisher.Publisher.publish = timed_pub

    def wrap(owner, attr, before, after):  # noqa: ANN001, ANN202
        fn = getattr(owner, attr)

        def timed(*a, **k):  # noqa: ANN002, ANN003, ANN202
            EV.append((before, "", time.perf_counter()))
            r = fn(*a, **k)
            EV.append((after, "", time.perf_counter()))
            return r

        setattr(owner, attr, timed)

    wrap(imn.ImageInferenceNode, "_on_image", "cb", "cb_end")
    wrap(imn.ImageInferenceNode, "_publish", "out_build", "out_done")
    wrap(imn, "image_to_tensor", "pre", "pre_end")


_OUT_QOS: list = [10]


def _output_qos_best_effort() -> None:
    """The node's output publisher and the script's subscriber best effort (a trial)."""
    from rclpy.node import Node
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT)
    _OUT_QOS[0] = qos
    create = Node.create_publisher

    def create_publisher(self, msg_type, topic, qos_profile, **kw):  # noqa: ANN001, ANN003, ANN202
        if topic.endswith("output/tensors"):
            qos_profile = qos
        return create(self, msg_type, topic, qos_profile, **kw)

    Node.create_publisher = create_publisher


def _steps(ev: list[tuple[str, str, float]], t0: float, arrived: float) -> list[float]:
    """The per-step durations (s) of one image from its events; NaN where one is missing."""
    nan = float("nan")

    def first(kind: str, topic: str = "", after: float = -1.0, before: float = 1e30) -> float:
        return next((t for k, tp, t in ev if k == kind and (not topic or tp == topic)
                     and after <= t <= before), nan)

    t_ret = first("pub_end", IMAGE_TOPIC)
    cb, cb_end = first("cb"), first("cb_end")
    take_i, taken_i = first("take", IMAGE_TOPIC, before=cb), first("taken", IMAGE_TOPIC,
                                                                   before=cb)
    woke_i = first("woke", after=t_ret, before=take_i if take_i == take_i else cb)
    pre, pre_end = first("pre", after=cb), first("pre_end", after=cb)
    out_build = first("out_build", after=cb)
    out_pub, out_pub_end = first("pub", OUTPUT_TOPIC, after=cb), first("pub_end", OUTPUT_TOPIC,
                                                                       after=cb)
    take_o = first("take", OUTPUT_TOPIC, after=cb_end)
    taken_o = first("taken", OUTPUT_TOPIC, after=cb_end)
    woke_o = first("woke", after=cb_end, before=take_o if take_o == take_o else arrived)
    return [t_ret - t0, woke_i - t_ret, take_i - woke_i, taken_i - take_i, cb - taken_i,
            pre - cb, pre_end - pre, out_build - pre_end, out_pub - out_build,
            out_pub_end - out_pub, cb_end - out_pub_end, woke_o - cb_end, take_o - woke_o,
            taken_o - take_o, arrived - taken_o]


def _p(a: np.ndarray, q: float) -> float | None:
    a = a[~np.isnan(a)]
    return float(np.percentile(a, q)) if a.size else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--executor", default=None,
                    help="lean, single, multi, events (default: av_infer_nodes.common's)")
    ap.add_argument("--graph", default="demo", choices=("demo", "small"))
    ap.add_argument("-n", type=int, default=200, help="measured pairs per round (200)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds (1), each printed")
    ap.add_argument("--pause-ms", type=float, default=2.0,
                    help="pause before each request, either path (2: the demo's)")
    ap.add_argument("--output-qos", default="reliable", choices=("reliable", "best_effort"),
                    help="QoS of the output topic, both ends (reliable, depth 10: the node's)")
    ap.add_argument("--consumer", default="shared", choices=("shared", "own"),
                    help="the camera/output-subscriber node on the graph's executor (shared, "
                    "the demo's layout) or on a single-threaded executor of its own (own: as "
                    "a consumer in another process waits on its own entities only)")
    ap.add_argument("--consumer-read", default="raw", choices=("raw", "typed"),
                    help="how the output subscriber gets the outputs: the serialised bytes "
                    "read by tensor_codec.read_tensor_list_cdr (raw, the demo's) or rclpy's "
                    "TensorList (typed)")
    ap.add_argument("--no-run-in-callback", dest="run_in_callback", action="store_false",
                    help="the front node hands its request to the runtime's threads and its "
                    "answer back to the executor (Handoff) instead of running it in the image "
                    "callback (parameter run_in_callback, on for perception nodes)")
    ap.add_argument("--typed-camera", action="store_true",
                    help="the camera publishes its Image message (rclpy converts it each "
                         "time) instead of the serialised frame the demo's cameras publish "
                         "(testing.CameraFrame)")
    ap.add_argument("--json", default=None, help="write every round as JSON here ('-': stdout)")
    args = ap.parse_args()
    _instrument()
    if args.output_qos != "reliable":
        _output_qos_best_effort()

    from av_infer_msgs.msg import TensorList
    from av_infer_nodes.common import DEFAULT_EXECUTOR
    from av_infer_nodes.image_node import IMAGE_QOS
    from av_infer_nodes.monitoring_node import MonitoringNode
    from av_infer_nodes.perception_node import PerceptionNode
    from av_infer_nodes.preprocess import image_to_tensor
    from av_infer_nodes.runtime_node import RuntimeNode
    from av_infer_nodes.testing import CameraFrame, RosHarness, make_image, wait_for
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import Image

    from av_infer import Runtime, zoo_path
    from av_infer import tensor_codec as codec

    model = "inception_v3"
    executor = args.executor or os.environ.get("AV_INFER_EXECUTOR") or DEFAULT_EXECUTOR
    rt = Runtime("cpu", policy="reef")
    h = RosHarness(num_threads=2, executor=executor, start=False)
    m = [Parameter("model", value=model)]
    if args.graph == "demo":  # the host loads the model, as in the demo
        h.add(RuntimeNode(context=h.context, runtime=rt, parameter_overrides=[
            Parameter("device", value="cpu"), Parameter("models", value=[model])]))
    else:
        rt.load_model(model, zoo_path(model))
    h.add(PerceptionNode("perception_front", context=h.context, runtime=rt,
                         cli_args=["--ros-args", "-r", f"~/input/image:={IMAGE_TOPIC}"],
                         parameter_overrides=[*m, Parameter("relative_deadline_ms", value=33.0),
                                              Parameter("run_in_callback",
                                                        value=args.run_in_callback)]))
    if args.graph == "demo":
        h.add(PerceptionNode("perception_rear", context=h.context, runtime=rt,
                             cli_args=["--ros-args", "-r", "~/input/image:=/rear/image_raw"],
                             parameter_overrides=m))
        h.add(MonitoringNode("monitoring_cabin", context=h.context, runtime=rt,
                             cli_args=["--ros-args", "-r", "~/input/image:=/cabin/image_raw"],
                             parameter_overrides=m))
    if args.consumer == "shared":
        cams = h.node("cams")
    else:
        from av_infer_nodes.testing import TesterNode
        from rclpy.executors import SingleThreadedExecutor

        cams = TesterNode("cams", context=h.context)
        own = SingleThreadedExecutor(context=h.context)
        own.add_node(cams)
    pub = cams.create_publisher(Image, IMAGE_TOPIC, IMAGE_QOS)
    got, arrived = threading.Event(), [0.0]

    raw = args.consumer_read == "raw"

    def on_output(msg: object) -> None:
        if raw:
            codec.read_tensor_list_cdr(msg)
        arrived[0] = time.perf_counter()
        got.set()

    cams.create_subscription(TensorList, OUTPUT_TOPIC, on_output, _OUT_QOS[0], raw=raw)
    h.start()
    if args.consumer == "own":
        threading.Thread(target=own.spin, name="consumer", daemon=True).start()
    wait_for(lambda: pub.get_subscription_count() > 0, 30, what="the image subscription")
    img = make_image(cams, "front_camera", 240, 320, "rgb8", seed=1)
    frame = CameraFrame(img)  # published as the demo's cameras publish (serialised once)
    clock = cams.get_clock()
    (name, (shape, _)), = rt.input_spec(model).items()
    tensor = image_to_tensor(img.encoding, img.height, img.width, img.step, img.data, shape)
    pause = args.pause_ms * 1e-3
    rounds = []
    for r in range(args.rounds):
        rows, ros, direct, lost = [], [], [], 0
        for i in range(args.n + 50):
            time.sleep(pause)
            got.clear()
            EV.clear()
            t0 = time.perf_counter()
            if args.typed_camera:
                img.header.stamp = clock.now().to_msg()
                pub.publish(img)
            else:
                frame.publish(pub, clock)
            ok = got.wait(5)
            ev = list(EV)
            time.sleep(pause)
            t1 = time.perf_counter()
            rt.infer(model, {name: tensor}, priority="RT", client="direct", timeout=10)
            t2 = time.perf_counter()
            if i < 50:
                continue
            if not ok:
                lost += 1
                continue
            rows.append(_steps(ev, t0, arrived[0]))
            ros.append(arrived[0] - t0)
            direct.append(t2 - t1)
        a, ros_a, dir_a = np.array(rows) * 1e3, np.array(ros) * 1e3, np.array(direct) * 1e3
        res = {"round": r + 1, "executor": executor, "graph": args.graph,
               "consumer": args.consumer, "output_qos": args.output_qos,
               "run_in_callback": args.run_in_callback, "n": len(rows),
               "lost": lost, "load_average": os.getloadavg()[0],
               "steps_p50_ms": {s: _p(a[:, j], 50) for j, s in enumerate(STEPS)},
               "steps_p99_ms": {s: _p(a[:, j], 99) for j, s in enumerate(STEPS)},
               # where the slowest 2 % of ROS paths spent their time (the tail's steps)
               "steps_in_slowest_ms": {s: _p(a[ros_a >= np.percentile(ros_a, 98), j], 50)
                                       for j, s in enumerate(STEPS)} if len(rows) else {},
               "ros_p50_ms": _p(ros_a, 50), "ros_p99_ms": _p(ros_a, 99),
               "direct_p50_ms": _p(dir_a, 50), "direct_p99_ms": _p(dir_a, 99)}
        res["added_p50_ms"] = res["ros_p50_ms"] - res["direct_p50_ms"]
        res["added_p99_ms"] = res["ros_p99_ms"] - res["direct_p99_ms"]
        rounds.append(res)
        out = sys.stderr if args.json == "-" else sys.stdout
        print(f"round {r + 1} (executor {executor}, graph {args.graph}, n {len(rows)}, lost "
              f"{lost}, load average {res['load_average']:.2f}), ms: p50 / p99 / median in "
              "the slowest 2 % of ROS paths", file=out)
        for s, v in res["steps_p50_ms"].items():
            row = [v, res["steps_p99_ms"][s], res["steps_in_slowest_ms"].get(s)]
            print(f"  {s:28s} " + " / ".join('-' if x is None else f'{x:.3f}' for x in row),
                  file=out)
        print(f"  {'ROS path':28s} p50 {res['ros_p50_ms']:.3f}  p99 {res['ros_p99_ms']:.3f}\n"
              f"  {'direct infer':28s} p50 {res['direct_p50_ms']:.3f}  p99 "
              f"{res['direct_p99_ms']:.3f}\n"
              f"  {'added':28s} p50 {res['added_p50_ms']:.3f}  p99 {res['added_p99_ms']:.3f}",
              file=out, flush=True)
    if args.json:
        text = json.dumps(rounds, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text)
    sys.stdout.flush()
    os._exit(0)  # a probe: no orderly teardown needed


if __name__ == "__main__":
    main()
