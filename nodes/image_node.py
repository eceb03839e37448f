"""Image in -> tensors out: the shared body of the perception (RT) and monitoring (BE) nodes.

A managed (lifecycle) node, configured and activated at start unless ``autostart`` is
false: configure loads the model (in-process runtime), activate accepts images, deactivate
drops them (counted ``dropped_inactive``), cleanup releases the runtime client.

Subscribes ``sensor_msgs/Image`` on ``~/input/image`` (SensorDataQoS, depth 1: a late frame is
replaced, never queued) and reads it in its serialised form (a raw subscription:
``tensor_codec.read_image`` takes the header and a view of the pixels, no ``Image`` object
is built; a ``Frame`` keeps the header), preprocesses it straight into the request's input
buffer (``preprocess.py``; in-process that is the runtime's own task input buffer, the only
copy of the input), submits it with ``deadline = header.stamp + relative_deadline_ms`` and
publishes the outputs on ``~/output/tensors`` as ``av_infer_msgs/TensorList`` with the
image's header (serialised straight from the output arrays,
``tensor_codec.tensor_list_cdr``). Every image that is submitted gets exactly one message:
the outputs on ``~/output/tensors``, or an ``av_infer_msgs/InferResponse`` without tensors
on ``~/output/errors`` with its status and code (e.g. ``deadline_missed``); so does one
whose bytes are no image (``invalid_input``, an empty header). Images arriving
while ``max_in_flight`` requests are pending, before the runtime is reachable, or while
inactive are dropped and counted. Outputs are encoded and published on the node's
executor (``Handoff``).

``runtime``: ``local`` calls an in-process Runtime (the container), ``remote`` reaches a
runtime host in another process over /av_infer/request|response; ``auto`` picks local when
the container hands the node a Runtime.

``precision`` (read-only): in-process, the precision the model is loaded (or shared) at,
through the runtime host's one check (``runtime_build.check_models``: a precision the
device does not run, or a model held at another, fails configure with the typed error);
``auto`` asks for none (a held model as it is held, a missing one at fp32). Remote: while
the host's model table gives ``model`` another precision, images are dropped as not ready.

QoS (paper 001, docs/qos.md): ``relative_deadline_ms`` is the soft deadline and
``hard_deadline_ms`` the hard one (0: none); ``variant_group`` names a variant group of
the runtime that serves ``model`` (the group or one of its variants). Each request carries
them (``InferRequest.hard_deadline``/``variant_group`` remotely); in-process the node also
configures its client with them (``Runtime.configure_client``), which validates them and
keeps the client's mean utility in the runtime's statistics.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, NamedTuple

from av_infer_msgs.msg import InferResponse, TensorList
from av_infer_nodes.common import (
    PUB_EVENTS,
    SUB_EVENTS,
    Every,
    Frame,
    LocalRuntimeClient,
    RemoteRuntimeClient,
    Reply,
    RuntimeClient,
    as_float_list,
    debug_publishers,
    declare,
    publish_cyclic,
    publish_debug,
    response_msg,
    ros_now_ns,
)
from av_infer_nodes.detections import (
    DECODER_PARAMS,
    decoder_from_params,
    detections_cdr,
    detections_msg,
)
from av_infer_nodes.handoff import Handoff
from av_infer_nodes.health import (
    ConsecutiveCheck,
    Finding,
    RateCheck,
    StampCheck,
    combine,
    diagnostics_cdr,
    status_of,
)
from av_infer_nodes.image_decode import CONVERTED, convert_raw, decode_compressed
from av_infer_nodes.preprocess import (
    ENCODINGS,
    FIT_MODES,
    RESIZE_METHODS,
    ImageFormatError,
    image_to_tensor,
)
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, CompressedImage, Image
from vision_msgs.msg import Detection2DArray

from av_infer import PRECISIONS, AvInferError, InvalidParameterError
from av_infer import tensor_codec as codec
from av_infer.detect import BOX_FORMATS, DECODERS, NMS_BACKENDS, Decoder, Fit, fit

#: SensorDataQoS with depth 1 (best effort, volatile, keep last 1).
IMAGE_QOS = QoSProfile(depth=1, history=qos_profile_sensor_data.history,
                       reliability=qos_profile_sensor_data.reliability,
                       durability=qos_profile_sensor_data.durability)


#: ``fn(reply, frame, t_received_monotonic)``; ``frame.header`` is the image's header
ResultListener = Callable[[Reply, Frame, float], None]

#: Topics, Autoware's ``~/input/*`` / ``~/output/*`` convention (remap them: ``-r
#: ~/input/image:=/camera/image_raw``; the launch file remaps every one of ``TOPICS``).
IMAGE_TOPIC = "~/input/image"
CAMERA_INFO_TOPIC = "~/input/camera_info"
#: the outputs (``TensorList``), reliable, depth 10 like every output
TENSORS_TOPIC = "~/output/tensors"
#: the decoded outputs (``Detection2DArray``, ``decoder`` set)
DETECTIONS_TOPIC = "~/output/detections"
#: the model input's camera model (``CameraInfo``, ``use_camera_info``)
OUTPUT_CAMERA_INFO_TOPIC = "~/output/camera_info"
#: a submitted image that failed (``InferResponse`` without tensors)
ERRORS_TOPIC = "~/output/errors"
#: An image node's topics (besides /diagnostics and ``~/debug/*``).
TOPICS = (IMAGE_TOPIC, CAMERA_INFO_TOPIC, TENSORS_TOPIC, DETECTIONS_TOPIC,
          OUTPUT_CAMERA_INFO_TOPIC, ERRORS_TOPIC)
#: Their names before that convention, where they differ. A remap rule naming one (``-r
#: image:=...``, ``-r ~/output:=...``, as deployments wrote them) still decides the
#: topic, so those keep working unchanged.
LEGACY_NAMES = {IMAGE_TOPIC: "image", CAMERA_INFO_TOPIC: "camera_info",
                TENSORS_TOPIC: "~/output", ERRORS_TOPIC: "~/errors"}


def node_topic(node: LifecycleNode, name: str) -> str:
    """The topic ``node`` uses for ``name`` (one of ``TOPICS``): the remapped legacy name
    where a rule remaps it (``LEGACY_NAMES``), else ``name`` (which the node's own rules
    then resolve). Logged, so the old rule is visible."""
    legacy = LEGACY_NAMES.get(name)
    if legacy is None:
        return name
    remapped = node.resolve_topic_name(legacy)
    if remapped != node.resolve_topic_name(legacy, only_expand=True):
        node.get_logger().info(f"topic {name}: a remap of {legacy!r} (the name before "
                               f"~/input/*, ~/output/*) applies: using {remapped}")
        return remapped
    return name

#: Parameters of the input's health checks (``InputHealth``), applied together.
HEALTH_PARAMS = ("expected_hz", "rate_tolerance", "stale_timeout_s", "max_stamp_age_ms",
                 "max_stamp_future_ms", "deadline_miss_warn", "deadline_miss_error")
#: Reply codes that count as a missed deadline (besides an answer after its deadline).
MISS_CODES = ("deadline_missed", "timeout")


class _Framing(NamedTuple):
    """How an image's answer is published, fixed when the image arrived: its fit into the
    model input (boxes and the model-input ``CameraInfo`` are mapped back through it) and
    the decoder of that moment, so a ``decoder``/``model`` change made while the image is in
    flight applies from the next image, as the parameters promise (not to this one's
    outputs, which the model of its arrival made)."""

    geom: Fit
    decoder: Decoder | None


class InputHealth:
    """The checks behind an image node's /diagnostics status (``health``): the camera's
    rate and staleness (monotonic receipt times), its header stamps' age (ROS time) and
    consecutive deadline misses of its requests. Built from the ``HEALTH_PARAMS``
    (ValueError for values that do not fit together, so a refused batch changes nothing)."""

    def __init__(self, p: dict[str, Any], start: float):
        if p["deadline_miss_warn"] > p["deadline_miss_error"]:
            raise ValueError(f"deadline_miss_warn ({p['deadline_miss_warn']}) must not be "
                             f"above deadline_miss_error ({p['deadline_miss_error']})")
        self.rate = RateCheck(p["expected_hz"], p["rate_tolerance"], p["stale_timeout_s"],
                              window_s=max(2.0, 5.0 / p["expected_hz"])
                              if p["expected_hz"] else 2.0, start=start)
        self.stamps = StampCheck(p["max_stamp_age_ms"] * 1e-3, p["max_stamp_future_ms"] * 1e-3)
        self.misses = ConsecutiveCheck(p["deadline_miss_warn"], p["deadline_miss_error"])

    def check(self, now: float) -> Finding:
        return combine([self.rate.check(now), self.stamps.check(), self.misses.check()])


def missed_deadline(reply: Reply) -> bool | None:
    """Whether ``reply`` came after its request's deadline (None: it had none): a drop
    (``deadline_missed``) or a client timeout, or an answer whose end passed the deadline
    (local: the runtime's timings; remote: the host's ``InferTimings.deadline_met``)."""
    if reply.code in MISS_CODES:
        return True
    t = reply.timings
    if t is None:
        return None
    if hasattr(t, "has_deadline"):  # an InferTimings from a runtime host
        return (not t.deadline_met) if t.has_deadline else None
    end = getattr(t, "end", None)
    if reply.deadline is None or not isinstance(end, float):
        return None
    return end > reply.deadline


#: What the ``precision`` parameter accepts: auto or a precision (``av_infer.PRECISIONS``).
PRECISION_CHOICES = ("auto", *PRECISIONS)
#: What the ``pin`` parameter accepts: auto (pinned iff ``priority`` is RT, when this node
#: loads the model; a held model as it is), true or false (asked of a held model too).
PIN_CHOICES = ("auto", "true", "false")


def wanted_pin(pin: str) -> bool | None:
    """The pin a ``pin`` value asks of a model the runtime already holds (None: any)."""
    return None if pin == "auto" else pin == "true"


def remote_mismatch(client: Any, model: str, p: Mapping[str, Any]) -> str | None:
    """Why a remote host's model table contradicts the node's ``precision`` / ``pin`` for
    ``model`` (each variant, when it names a variant group), or None: the node drops its
    images meanwhile instead of submitting them."""
    prec, pin = p["precision"], wanted_pin(p["pin"])
    for name, held_prec, held_pin in client.held_settings(model):
        where = f"model {name!r}" + (f" (variant group {model!r})" if name != model else "")
        if prec != "auto" and held_prec is not None and held_prec != prec:
            return (f"the runtime host serves {where} at {held_prec}, not {prec} "
                    "(parameter precision)")
        if pin is not None and held_pin is not None and held_pin != pin:
            return (f"the runtime host holds {where} {'pinned' if held_pin else 'unpinned'}, "
                    f"not as parameter pin ({p['pin']}) asks")
    return None

#: Parameters that make up the client's configuration in an in-process runtime.
CLIENT_CONFIG = ("relative_deadline_ms", "hard_deadline_ms", "variant_group", "drop_late")


class ImageInferenceNode(LifecycleNode):
    """Base of PerceptionNode and MonitoringNode; ``priority`` is their default class."""

    default_priority = "BE"
    default_deadline_ms = 0.0
    default_model = "tiny_cnn"
    #: RT perception: on (measured: docs/ros.md, "ROS overhead"); BE monitoring: off, so a
    #: long BE inference never holds the executor thread
    default_run_in_callback = False

    def __init__(self, node_name: str, *, runtime: Any = None, **node_kwargs: Any):
        super().__init__(node_name, **node_kwargs)
        self.p = self._declare_parameters()
        mode = self.p["runtime"]
        if mode == "auto":
            mode = "local" if runtime is not None else "remote"
        if mode == "local" and runtime is None:
            raise RuntimeError("runtime:=local needs an in-process Runtime (use the "
                               "av_infer_container executable) or runtime:=remote")
        self.mode = mode
        self._runtime = runtime
        self._lock = threading.Lock()
        self.counters = {"received": 0, "submitted": 0, "completed": 0, "failed": 0,
                         "dropped_not_ready": 0, "dropped_busy": 0, "dropped_inactive": 0,
                         "invalid": 0, "decode_failed": 0, "encode_failed": 0}
        self._in_flight = 0
        #: request ids: one uuid4 per node instance and a counter (unique per process run
        #: and across restarts, as nodes/common.py's RESPONSE_QOS_CLIENT needs), instead of
        #: a uuid4 per image (os.urandom: 20-30 us of the callback on the dev VM, measured
        #: with scripts/ros_executor_hops.py; docs/ros.md, "ROS path cost")
        self._rid_prefix = uuid.uuid4().hex + "-"
        self._rid_seq = itertools.count()
        self._listeners: list[ResultListener] = []
        self._not_ready_log = Every()
        self.active = False
        self.client: RuntimeClient | None = None
        self._handoff = Handoff(self)
        self._debug = debug_publishers(self, self.p["debug_topics"])
        self._last_image: float | None = None  # monotonic, for ~/debug/cyclic_time_ms
        try:
            self.health = InputHealth(self.p, time.monotonic())
        except ValueError as exc:  # refuse to start, with the reason
            self.destroy_node()
            raise InvalidParameterError(str(exc)) from None
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10,
                                               event_callbacks=PUB_EVENTS)
        self._diag_timer = self.create_timer(self.p["diagnostics_period_s"],
                                             self.publish_diagnostics)
        self._pub = self.create_publisher(TensorList, node_topic(self, TENSORS_TOPIC), 10,
                                          event_callbacks=PUB_EVENTS)
        self._err_pub = self.create_publisher(InferResponse, node_topic(self, ERRORS_TOPIC), 10,
                                              event_callbacks=PUB_EVENTS)
        #: the detector-head decoder (parameter ``decoder``; None: raw tensors only) and
        #: its publisher, created with the first decoder
        try:
            self._decoder: Decoder | None = decoder_from_params(self.p)
        except (ValueError, OSError) as exc:  # refuse to start, with the reason
            self.destroy_node()
            raise InvalidParameterError(str(exc)) from None
        self._det_pub: Any = None
        if self._decoder is not None:
            self._det_pub = self._detections_publisher()
        self._decode_log = Every()
        # one subscription on ~/input/image: raw Image or, with input:=compressed,
        # CompressedImage
        # (raw: the callback gets the serialised bytes, read by ros_cdr)
        in_type = CompressedImage if self.p["input"] == "compressed" else Image
        self._sub = self.create_subscription(in_type, node_topic(self, IMAGE_TOPIC),
                                             self._on_image, IMAGE_QOS,
                                             event_callbacks=SUB_EVENTS, raw=True)
        #: the latest CameraInfo (use_camera_info) and the input-side model it implies
        self._camera_info: CameraInfo | None = None
        self._info_sub = self._info_pub = None
        if self.p["use_camera_info"]:
            self._info_sub = self.create_subscription(CameraInfo,
                                                      node_topic(self, CAMERA_INFO_TOPIC),
                                                      self._on_camera_info, IMAGE_QOS,
                                                      event_callbacks=SUB_EVENTS)
            self._info_pub = self.create_publisher(CameraInfo,
                                                   node_topic(self, OUTPUT_CAMERA_INFO_TOPIC),
                                                   10, event_callbacks=PUB_EVENTS)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self._configure_error: BaseException | None = None
        if self.p["autostart"]:
            self.trigger_configure()
            if self._configure_error is not None:  # refuse to start, with the reason
                err = self._configure_error
                self.destroy_node()
                raise err
            self.trigger_activate()

    # -- lifecycle -----------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Reaches the runtime (local: loads the model); FAILURE, with the reason logged
        and kept for ``autostart``, if it cannot."""
        self._configure_error = None
        try:
            if (why := _deadlines_conflict(self.p)) is not None:
                raise InvalidParameterError(why)
            if self.p["precision"] not in PRECISION_CHOICES:
                raise InvalidParameterError(
                    f"precision {self.p['precision']!r} is not one of "
                    f"{', '.join(PRECISION_CHOICES)}")
            if self.p["pin"] not in PIN_CHOICES:
                raise InvalidParameterError(
                    f"pin {self.p['pin']!r} is not one of {', '.join(PIN_CHOICES)}")
            if self.mode == "local":
                self.client = LocalRuntimeClient(self, self._runtime)
                self._ensure_local_model(self.p["model"])
                self._configure_local_client(self.p)
            else:
                self.client = RemoteRuntimeClient(self, timeout_s=self.p["request_timeout_s"],
                                                  client=self.p["client"])
        except Exception as exc:  # noqa: BLE001 - refuse the transition, say why
            self.get_logger().error(f"configure failed: {type(exc).__name__}: {exc}")
            self._configure_error = exc
            self.client = None
            return TransitionCallbackReturn.FAILURE
        self.get_logger().info(
            f"{self.p['priority']} client {self.p['client']!r}: model {self.p['model']} via "
            f"{self.mode} runtime, deadline {self.p['relative_deadline_ms']} ms")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        with self._lock:  # staleness counts from the activation
            self.health = InputHealth(self.p, time.monotonic())
        self.active = True
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.active = False
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._close_client()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.active = False
        self._close_client()
        return TransitionCallbackReturn.SUCCESS

    def _close_client(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            client.close()
            if isinstance(client, RemoteRuntimeClient):
                client.destroy()

    # -- parameters ----------------------------------------------------------------------
    def _declare_parameters(self) -> dict[str, Any]:
        return {
            "runtime": declare(self, "runtime", "auto",
                               "How to reach the runtime: local (in-process, container), "
                               "remote (/av_infer/request topics) or auto.", read_only=True,
                               constraints="auto, local or remote"),
            "model": declare(self, "model", self.default_model,
                             "Model to run: a zoo name or the name of a model the runtime "
                             "host loaded."),
            "model_variant": declare(self, "model_variant", "scaled",
                                     "Zoo variant loaded on demand in local mode.",
                                     read_only=True),
            "precision": declare(self, "precision", "auto",
                                 "Numeric precision of `model`: auto (in-process: the one "
                                 "the runtime holds it at, fp32 when this node loads it; "
                                 "remote: the host's) or one the device runs; a model held "
                                 "at another precision is refused.", read_only=True,
                                 constraints="one of " + ", ".join(PRECISION_CHOICES)),
            "pin": declare(self, "pin", "auto",
                           "Keep `model` pinned in the runtime's model cache (never evicted): "
                           "auto (pinned iff priority is RT when this node loads it; a model "
                           "the runtime holds is served as held), true or false (a held "
                           "model pinned the other way is refused; remote: images are "
                           "dropped while the host's table says otherwise).",
                           read_only=True, constraints="one of " + ", ".join(PIN_CHOICES)),
            "client": declare(self, "client", self.get_name(),
                              "Client id in runtime statistics; in remote mode also the "
                              "name of this node's response topic (/av_infer/response/"
                              "<client>) and its entry in the host's client_models "
                              "allow-list.", read_only=True),
            "priority": declare(self, "priority", self.default_priority,
                                "Request priority: RT (deadline-ordered, preempts BE) or BE.",
                                read_only=True, constraints="RT or BE"),
            "relative_deadline_ms": declare(self, "relative_deadline_ms",
                                            float(self.default_deadline_ms),
                                            "Deadline after the image stamp in ms (0: none).",
                                            float_range=(0.0, 60000.0)),
            "hard_deadline_ms": declare(self, "hard_deadline_ms", 0.0,
                                        "Hard deadline after the image stamp in ms (0: none; "
                                        "not before relative_deadline_ms, the soft one): a "
                                        "BE request unanswered by then is dropped "
                                        "(deadline_missed) wherever it is.",
                                        float_range=(0.0, 60000.0)),
            "variant_group": declare(self, "variant_group", "",
                                     "A variant group of the runtime serving `model` (the "
                                     "group or one of its variants) by its best variant; '' "
                                     "none."),
            "drop_late": declare(self, "drop_late", False,
                                 "Drop requests whose deadline passed before they ran."),
            "resize": declare(self, "resize", "bilinear",
                              "Resize to the model input: nearest or bilinear.",
                              constraints="nearest or bilinear"),
            "mean": declare(self, "mean", [0.485, 0.456, 0.406],
                            "Per-channel mean subtracted from pixels scaled to [0, 1].",
                            array_of=float),
            "std": declare(self, "std", [0.229, 0.224, 0.225],
                           "Per-channel standard deviation the pixels are divided by.",
                           array_of=float),
            "max_in_flight": declare(self, "max_in_flight", 2,
                                     "Pending requests at most; newer images are dropped.",
                                     int_range=(1, 64)),
            "request_timeout_s": declare(self, "request_timeout_s", 5.0,
                                         "Remote mode: give up on a response after this long.",
                                         float_range=(0.1, 600.0)),
            "autostart": declare(self, "autostart", True,
                                 "Configure and activate at start (false: wait for "
                                 "~/change_state).", read_only=True),
            "run_in_callback": declare(self, "run_in_callback", self.default_run_in_callback,
                                       "In-process runtime: the image callback runs its "
                                       "request's launches itself while the lane is idle "
                                       "and publishes the output at once (no thread "
                                       "hand-offs; the executor thread is busy meanwhile)."),
            "debug_topics": declare(self, "debug_topics", True,
                                    "Publish ~/debug/processing_time_ms, "
                                    "~/debug/pipeline_latency_ms and "
                                    "~/debug/cyclic_time_ms.", read_only=True),
            "diagnostics_period_s": declare(self, "diagnostics_period_s", 1.0,
                                            "Period of this input's /diagnostics status (s).",
                                            float_range=(0.05, 60.0)),
            "expected_hz": declare(self, "expected_hz", 0.0,
                                   "Expected camera rate (Hz): /diagnostics WARNs outside "
                                   "expected_hz ± rate_tolerance (0: rate not checked).",
                                   float_range=(0.0, 1000.0)),
            "rate_tolerance": declare(self, "rate_tolerance", 0.1,
                                      "Accepted rate deviation, a fraction of expected_hz.",
                                      float_range=(0.0, 0.99)),
            "stale_timeout_s": declare(self, "stale_timeout_s", 1.0,
                                       "/diagnostics is STALE once no image came for this "
                                       "long (s) while active.", float_range=(0.01, 3600.0)),
            "max_stamp_age_ms": declare(self, "max_stamp_age_ms", 0.0,
                                        "ERROR for an image whose header stamp is older "
                                        "than this on arrival, ms (0: age not checked; "
                                        "zero and future stamps are).",
                                        float_range=(0.0, 600000.0)),
            "max_stamp_future_ms": declare(self, "max_stamp_future_ms", 50.0,
                                           "ERROR for a header stamp more than this ahead "
                                           "of the node's clock (ms).",
                                           float_range=(0.0, 600000.0)),
            "deadline_miss_warn": declare(self, "deadline_miss_warn", 1,
                                          "WARN from this many consecutive deadline misses "
                                          "(drops and timeouts included).",
                                          int_range=(1, 100000)),
            "deadline_miss_error": declare(self, "deadline_miss_error", 3,
                                           "ERROR from this many consecutive deadline misses "
                                           "(not below deadline_miss_warn).",
                                           int_range=(1, 100000)),
            "input": declare(self, "input", "raw",
                             "What ~/input/image carries: raw (sensor_msgs/Image: rgb8, bgr8, "
                             "mono8, yuv422/uyvy, yuyv, bayer_*8) or compressed "
                             "(sensor_msgs/CompressedImage: JPEG, PNG).", read_only=True,
                             constraints="raw or compressed"),
            "fit": declare(self, "fit", "stretch",
                           "How the image fills the model input: stretch, or letterbox "
                           "(one scale, centred, padded grey 114).",
                           constraints="stretch or letterbox"),
            "use_camera_info": declare(self, "use_camera_info", False,
                                       "Subscribe ~/input/camera_info: refuse images of "
                                       "another size, publish ~/output/camera_info for the model "
                                       "input.", read_only=True),
            "decoder": declare(self, "decoder", "none",
                               "Detector head to decode into vision_msgs/Detection2DArray "
                               "on ~/output/detections: none, yolo ([1, 4+nc, N]) or ssd "
                               "(boxes [1, N, 4] + scores [1, N, nc]).",
                               constraints="none, yolo or ssd"),
            "score_threshold": declare(self, "score_threshold", 0.25,
                                       "Detections: lowest class score kept.",
                                       float_range=(0.0, 1.0)),
            "iou_threshold": declare(self, "iou_threshold", 0.45,
                                     "Detections: NMS drops a box whose IoU with a kept box "
                                     "of its class is above this.", float_range=(0.0, 1.0)),
            "max_detections": declare(self, "max_detections", 100,
                                      "Detections: at most this many per image.",
                                      int_range=(1, 1000)),
            "class_names_file": declare(self, "class_names_file", "",
                                        "Detections: class names, one per line ('': the "
                                        "class index as class_id)."),
            "box_format": declare(self, "box_format", "xyxy",
                                  "ssd decoder: boxes as xyxy or cxcywh.",
                                  constraints="xyxy or cxcywh"),
            "boxes_normalized": declare(self, "boxes_normalized", False,
                                        "ssd decoder: boxes in [0, 1] of the model input "
                                        "(else input pixels)."),
            "nms_backend": declare(self, "nms_backend", "onnxruntime",
                                   "Detections: NMS on ONNX Runtime's NonMaxSuppression "
                                   "operator (onnxruntime) or in numpy.",
                                   constraints="onnxruntime or numpy"),
            "background_class": declare(self, "background_class", -1,
                                        "ssd decoder: a class never reported (SSD's 0); -1 "
                                        "none.", int_range=(-1, 100000)),
        }

    def _validate(self, name: str, value: Any) -> str | None:
        if name == "model":
            if not isinstance(value, str) or not value:
                return "model must be a non-empty string"
            if self.mode == "local":
                try:
                    self._ensure_local_model(value)
                except Exception as exc:
                    return f"cannot load model {value!r}: {exc}"
                return None
            spec = self.client.input_spec(value) if self.client is not None else None
            return None if spec is not None or self.client is None else (
                f"model {value!r} is not loaded by the runtime host")
        if name == "resize":
            return None if value in RESIZE_METHODS else (
                f"resize must be one of {', '.join(RESIZE_METHODS)}")
        if name == "fit":
            return None if value in FIT_MODES else f"fit must be one of {', '.join(FIT_MODES)}"
        if name in ("mean", "std"):
            vals = as_float_list(value) if value is not None else []
            if len(vals) not in (1, 3):
                return f"{name} needs 1 or 3 values"
            if name == "std" and any(v == 0 for v in vals):
                return "std values must be non-zero"
            return None
        if name in ("relative_deadline_ms", "hard_deadline_ms"):
            ok = isinstance(value, float) and 0.0 <= value <= 60000.0
            return None if ok else f"{name} must be in [0, 60000]"
        if name == "variant_group":
            if not isinstance(value, str):
                return "variant_group must be a string"
            groups = self.client.variant_groups() if self.client is not None else None
            if value and groups is not None and value not in groups:  # None: not known yet
                return f"unknown variant group {value!r}; defined: {sorted(groups)}"
            return None
        if name == "max_in_flight":
            ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 64
            return None if ok else "max_in_flight must be in 1..64"
        if name == "request_timeout_s":
            ok = isinstance(value, float) and 0.1 <= value <= 600.0
            return None if ok else "request_timeout_s must be in [0.1, 600]"
        if name in ("drop_late", "run_in_callback", "boxes_normalized"):
            return None if isinstance(value, bool) else f"{name} must be a bool"
        if name == "decoder":
            return None if value in DECODERS else f"decoder must be one of {', '.join(DECODERS)}"
        if name == "nms_backend":
            return None if value in NMS_BACKENDS else (
                f"nms_backend must be one of {', '.join(NMS_BACKENDS)}")
        if name == "box_format":
            return None if value in BOX_FORMATS else (
                f"box_format must be one of {', '.join(BOX_FORMATS)}")
        if name in ("score_threshold", "iou_threshold"):
            ok = isinstance(value, float) and 0.0 <= value <= 1.0
            return None if ok else f"{name} must be in [0, 1]"
        if name == "max_detections":
            ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1000
            return None if ok else "max_detections must be in 1..1000"
        if name == "background_class":
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= -1
            return None if ok else "background_class must be >= -1"
        if name == "class_names_file":
            return None if isinstance(value, str) else "class_names_file must be a string"
        if name in ("expected_hz", "rate_tolerance", "stale_timeout_s", "max_stamp_age_ms",
                    "max_stamp_future_ms", "diagnostics_period_s"):
            lo, hi = {"expected_hz": (0.0, 1000.0), "rate_tolerance": (0.0, 0.99),
                      "stale_timeout_s": (0.01, 3600.0), "max_stamp_age_ms": (0.0, 600000.0),
                      "max_stamp_future_ms": (0.0, 600000.0),
                      "diagnostics_period_s": (0.05, 60.0)}[name]
            ok = isinstance(value, float) and lo <= value <= hi
            return None if ok else f"{name} must be in [{lo:g}, {hi:g}]"
        if name in ("deadline_miss_warn", "deadline_miss_error"):
            ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 100000
            return None if ok else f"{name} must be in 1..100000"
        if self.has_parameter(name) and self.describe_parameter(name).read_only:
            return f"{name} is read-only (a restart is needed)"
        return None

    def _on_set_parameters(self, params: list[Parameter]) -> SetParametersResult:
        errors = [r for prm in params if (r := self._validate(prm.name, prm.value))]
        merged = {**self.p, **{prm.name: prm.value for prm in params}}
        if not errors and (why := _deadlines_conflict(merged)) is not None:
            errors.append(why)
        if not errors and isinstance(self.client, LocalRuntimeClient) and any(
                prm.name in CLIENT_CONFIG for prm in params):
            try:  # the runtime validates the client's configuration; a refusal changes nothing
                self._configure_local_client(merged)
            except Exception as exc:  # noqa: BLE001 - refused with the typed error's text
                errors.append(f"{type(exc).__name__}: {exc}")
        health = None
        if not errors and any(prm.name in HEALTH_PARAMS for prm in params):
            try:  # all the checks from the merged values: a refusal changes nothing
                health = InputHealth(merged, time.monotonic())
            except ValueError as exc:
                errors.append(str(exc))
        decoder = self._decoder
        if not errors and any(prm.name in DECODER_PARAMS for prm in params):
            try:  # the whole decoder from the merged values: a refusal changes nothing
                decoder = decoder_from_params(merged)
            except (ValueError, OSError) as exc:
                errors.append(str(exc))
        if errors:
            return SetParametersResult(successful=False, reason="; ".join(errors))
        if decoder is not None and self._det_pub is None:
            self._det_pub = self._detections_publisher()
        self._decoder = decoder
        if health is not None:
            with self._lock:
                self.health = health
        if any(prm.name == "diagnostics_period_s" for prm in params):
            self.destroy_timer(self._diag_timer)
            self._diag_timer = self.create_timer(float(merged["diagnostics_period_s"]),
                                                 self.publish_diagnostics)
        for prm in params:  # all valid: take effect from the next image
            if prm.name in self.p:
                self.p[prm.name] = prm.value
            if prm.name == "request_timeout_s" and isinstance(self.client, RemoteRuntimeClient):
                self.client.timeout_s = float(prm.value)
        return SetParametersResult(successful=True)

    def _configure_local_client(self, p: dict[str, Any]) -> None:
        """In-process: the client's priority, deadlines and variant group in the runtime
        (``Runtime.configure_client`` validates them: an unknown group is
        ``UnknownModelError``, a soft deadline after the hard one ``InvalidParameterError``).
        Requests carry the same values, so remote and local clients behave alike."""
        soft = p["relative_deadline_ms"] * 1e-3 or None
        hard = p["hard_deadline_ms"] * 1e-3 or None
        self._runtime.configure_client(
            p["client"], p["priority"], relative_deadline=soft, drop_late=p["drop_late"],
            soft_deadline=soft if hard else None, hard_deadline=hard,
            variant_group=p["variant_group"] or None)

    def _ensure_local_model(self, model: str) -> None:
        """In-process: ``model`` (a model or variant group the runtime holds, else a zoo
        name or ONNX path loaded now) at ``precision``. The runtime host's check
        (``runtime_build.check_models``) refuses, before anything loads, a precision the
        device does not run (InvalidParameterError) and a model (or a group's variant)
        held at another precision or pinned the other way (ModelNameInUseError); ``auto``
        asks for neither. A model this node loads is pinned as ``pin`` says (auto: iff its
        ``priority`` is RT: the RT models are the pinned ones, never evicted)."""
        from av_infer_nodes.runtime_build import check_models, model_source

        rt = self._runtime
        prec = self.p["precision"]
        want = None if prec == "auto" else prec
        pin = wanted_pin(self.p["pin"])
        groups = rt.variant_groups()
        source = None
        if model in groups:
            names = list(groups[model])
        elif model in rt.models():
            names = [model]
        else:
            name, source = model_source(model, self.p["model_variant"])
            names = [name]
        check_models(rt, {n: (want, pin) for n in names},
                     "precision" if pin is None else "precision, pin")
        name = names[0]
        if source is not None and name not in rt.models():
            if pin is None:
                pin = str(self.p["priority"]).strip().upper() == "RT"
            self.get_logger().info(f"loading model {name} from {source}"
                                   + (f" at {want}" if want else "")
                                   + (", pinned" if pin else ""))
            rt.load_model(name, source, precision=want, pin=pin)
        if source is not None and name != model:
            raise ValueError(f"use the model name {name!r} (file stem), not {model!r}")

    # -- data path -----------------------------------------------------------------------
    def add_result_listener(self, fn: ResultListener) -> None:
        """``fn(reply, frame, t_received_monotonic)`` after each output is published (a
        :class:`Frame`: the image's stamp and frame id, ``.header`` built on use)."""
        self._listeners.append(fn)

    def _not_ready(self, why: str, frame: Frame) -> None:
        publish_cyclic(self._debug, self, frame.cycle_ms)
        self.counters["dropped_not_ready"] += 1
        if self._not_ready_log.due():
            self.get_logger().warning(f"dropping images: {why}")

    def _on_camera_info(self, msg: CameraInfo) -> None:
        self._camera_info = msg

    def _read(self, msg: bytes) -> tuple[Frame, tuple]:
        """The image's ``Frame`` and its pixels as :meth:`_pixels` takes them: ``(format,
        data)`` compressed, ``(encoding, height, width, step, data)`` raw, from the
        subscription's serialised bytes (``data`` a view of them). ValueError if the bytes
        are not one."""
        if self._sub.msg_type is CompressedImage:
            sec, ns, fid, fmt, data = codec.read_compressed_image(msg)
            return Frame(sec, ns, fid), (fmt, data)
        sec, ns, fid, h, w, enc, _big, step, data = codec.read_image(msg)
        return Frame(sec, ns, fid), (enc, h, w, step, data)

    @staticmethod
    def _pixels(px: tuple) -> tuple[str, int, int, int, Any]:
        """``(encoding, height, width, step, data)`` the gather reads: a raw rgb8/bgr8/mono8
        image as it is (no copy), anything else decoded or converted first
        (``image_decode``); ImageFormatError when it cannot be."""
        if len(px) == 2:
            enc, arr = decode_compressed(*px)
        elif px[0] in CONVERTED:
            enc, arr = convert_raw(*px)
        elif px[0] not in ENCODINGS:
            raise ImageFormatError(f"unsupported encoding {px[0]!r} (supported: "
                                   f"{', '.join([*ENCODINGS, *CONVERTED])})")
        else:
            return px[0], int(px[1]), int(px[2]), int(px[3]), px[4]
        return enc, arr.shape[0], arr.shape[1], arr.strides[0], arr

    def _check_camera_info(self, height: int, width: int) -> None:
        info = self._camera_info
        if info is not None and info.width and info.height and (
                (info.width, info.height) != (width, height)):
            raise ImageFormatError(f"image is {width}x{height}, camera_info says "
                                   f"{info.width}x{info.height}")

    def _on_image(self, msg: bytes) -> None:
        t_recv = time.monotonic()
        p = self.p
        model = p["model"]
        decoder = self._decoder  # with the model: what this image's outputs are decoded by
        client = self.client
        last, self._last_image = self._last_image, t_recv
        try:
            frame, px = self._read(msg)
        except ValueError as exc:  # bytes that are no image: answered, like a bad image
            frame, px = Frame(0, 0, ""), str(exc)
        if last is not None:
            frame.cycle_ms = (t_recv - last) * 1e3
        if isinstance(px, str):  # why the bytes are no image
            with self._lock:
                self.counters["received"] += 1
                self.counters["invalid"] += 1
            self._publish(Reply(id=f"{self._rid_prefix}{next(self._rid_seq)}",
                                code="invalid_input", message=px, model=model),
                          frame, t_recv)
            return
        # the ROS clock once per image; in-process, read with the runtime's clock so the
        # request's deadline is placed from this one moment (LocalRuntimeClient.submit)
        now_ros = ros_now_ns(self) * 1e-9
        clocks = (now_ros, client.now()) if isinstance(client, LocalRuntimeClient) else None
        with self._lock:
            self.health.rate.tick(t_recv)
            self.health.stamps.tick(frame.sec + frame.nanosec * 1e-9, now_ros)
            self.counters["received"] += 1
            dropped = None
            if not self.active or client is None:
                dropped = "dropped_inactive"
            elif self._in_flight >= p["max_in_flight"]:
                dropped = "dropped_busy"
            if dropped is not None:
                self.counters[dropped] += 1
        if dropped is not None:
            publish_cyclic(self._debug, self, frame.cycle_ms)
            return
        if not client.ready(model):
            self._not_ready(f"runtime not reachable or model {model!r} not loaded yet", frame)
            return
        if (p["precision"] != "auto" or p["pin"] != "auto") and isinstance(
                client, RemoteRuntimeClient) and (why := remote_mismatch(client, model, p)):
            self._not_ready(why, frame)
            return
        spec = client.input_spec(model) or {}
        rid = f"{self._rid_prefix}{next(self._rid_seq)}"
        try:
            if len(spec) != 1:
                raise ImageFormatError(f"model {model!r} has {len(spec)} inputs; image nodes "
                                       "feed single-input models")
            (input_name, (shape, _dtype)), = spec.items()
            enc, height, width, step, data = self._pixels(px)
            self._check_camera_info(height, width)
            shape = _concrete_shape(shape, height, width)
            inputs = client.input_buffers(model)
            buf = inputs.get(input_name)
            if buf is None or list(buf.shape) != shape:  # dynamic dims: a buffer of the size
                buf = None
            tensor = image_to_tensor(enc, height, width, step, data, shape, p["resize"],
                                     p["mean"], p["std"], out=buf, fit=p["fit"])
            if buf is None:
                inputs = {input_name: tensor}
            framing = None  # only what decoding or the model-input CameraInfo needs
            if decoder is not None or self._info_pub is not None:
                framing = _Framing(fit(height, width, shape[2], shape[3], p["fit"]), decoder)
        except (ImageFormatError, ValueError) as exc:
            self.counters["invalid"] += 1
            self._publish(Reply(id=rid, code="invalid_input", message=str(exc), model=model),
                          frame, t_recv)
            return
        ctrl = codec.RequestControl(id=rid, model=model, client=p["client"],
                                    priority=p["priority"], stamp=(frame.sec, frame.nanosec),
                                    frame_id=frame.frame_id,
                                    deadline_s=p["relative_deadline_ms"] * 1e-3 or None,
                                    drop_late=p["drop_late"],
                                    hard_deadline_s=p["hard_deadline_ms"] * 1e-3 or None,
                                    variant_group=p["variant_group"] or None)
        with self._lock:
            self._in_flight += 1
            self.counters["submitted"] += 1
        fut = client.submit(ctrl, inputs, run_here=p["run_in_callback"], clocks=clocks)
        if fut.done():  # ran to completion on this thread (run_in_callback)
            self._done(fut, frame, t_recv, framing)
        else:
            fut.add_done_callback(lambda f: self._post(f, frame, t_recv, framing))

    def _post(self, fut: Future, frame: Frame, t_recv: float,
              framing: _Framing | None = None) -> None:
        """On the runtime's (or the response callback's) thread: hand over to the executor."""
        if not self._handoff.post(lambda: self._done(fut, frame, t_recv, framing)):
            self._done(fut, frame, t_recv, framing)

    def _done(self, fut: Future, frame: Frame, t_recv: float,
              framing: _Framing | None = None) -> None:
        reply: Reply = fut.result()
        missed = missed_deadline(reply)
        with self._lock:
            if missed is not None:
                self.health.misses.tick(missed)
            self._in_flight -= 1
            self.counters["completed" if reply.ok else "failed"] += 1
        self._publish(reply, frame, t_recv, framing)

    def _publish_tensors(self, reply: Reply, frame: Frame) -> None:
        """``~/output/tensors``: the in-process outputs serialised straight into the
        ``TensorList``'s bytes (one copy of each array, no message objects:
        ``tensor_codec.tensor_list_cdr``; docs/ros.md, "ROS path cost"), a remote host's
        as well (read from its response's bytes)."""
        self._pub.publish(codec.tensor_list_cdr((frame.sec, frame.nanosec), frame.frame_id,
                                                reply.outputs or {}))

    def _publish_detections(self, reply: Reply, frame: Frame, framing: _Framing) -> None:
        """The outputs decoded into ``~/output/detections`` by the decoder the image arrived
        with (``decoder`` set then). Outputs the decoder cannot read are counted
        (``decode_failed``) and logged at most every 5 s: the image's one answer on
        ``~/output/tensors``/``~/output/errors`` is already out."""
        decoder, geom = framing.decoder, framing.geom
        if decoder is None or self._det_pub is None:
            return
        try:
            dets = decoder.decode(reply.outputs or {}, geom)
        except (ValueError, AvInferError) as exc:  # DecodeError, CodecError
            with self._lock:
                self.counters["decode_failed"] += 1
            if self._decode_log.due():
                self.get_logger().error(f"{decoder.kind} decoder: {exc}")
            return
        # as bytes (no message objects); the message where the bytes cannot be written
        self._det_pub.publish(detections_cdr(dets, (frame.sec, frame.nanosec), frame.frame_id)
                              or detections_msg(dets, frame.header))

    def _detections_publisher(self) -> Any:
        return self.create_publisher(Detection2DArray, node_topic(self, DETECTIONS_TOPIC), 10,
                                     event_callbacks=PUB_EVENTS)

    def _publish(self, reply: Reply, frame: Frame, t_recv: float,
                 framing: _Framing | None = None) -> None:
        try:
            if reply.ok:
                try:
                    self._publish_tensors(reply, frame)
                except codec.CodecError as exc:  # outputs the wire cannot carry: the
                    # image's one answer is then this error, not a log line alone
                    reply = Reply(id=reply.id, code="internal_error", model=reply.model,
                                  message=f"outputs cannot be published: {exc}")
                    with self._lock:
                        self.counters["encode_failed"] += 1
                    self._err_pub.publish(response_msg(reply, frame.header))
                    framing = None
                if framing is not None:
                    self._publish_detections(reply, frame, framing)
                    info = self._camera_info
                    if self._info_pub is not None and info is not None:
                        self._info_pub.publish(
                            input_camera_info(info, framing.geom, frame.header))
            else:
                self._err_pub.publish(response_msg(reply, frame.header))
            publish_debug(self._debug, self, t_recv, frame, frame.cycle_ms)
        except Exception as exc:  # shut down meanwhile
            if self.context.ok():
                self.get_logger().error(f"cannot publish output: {exc}")
        for fn in self._listeners:
            fn(reply, frame, t_recv)

    # -- diagnostics ---------------------------------------------------------------------
    def health_status(self, now: float | None = None) -> Any:
        """This input's ``DiagnosticStatus`` (``InputHealth``) at monotonic time ``now``
        (default: now): OK only when active and every check passes; while inactive OK
        with the message "inactive" (not expected to process)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            finding = self.health.check(now) if self.active else Finding(message="inactive")
            counters = dict(self.counters)
        return status_of(finding, f"av_infer: input {self.get_fully_qualified_name()}",
                         hardware_id=str(self.p["client"]), extra=counters)

    def publish_diagnostics(self) -> None:
        stamp = self.get_clock().now().seconds_nanoseconds()
        try:  # serialised here, no message objects (health.diagnostics_cdr)
            self._diag_pub.publish(diagnostics_cdr([self.health_status()], stamp))
        except Exception as exc:  # a diagnostics problem must never stop the node
            if self.context.ok():
                self.get_logger().warning(f"diagnostics not published: {exc!r}")

    def destroy_node(self) -> None:
        self.active = False
        if self.client is not None:
            self.client.close()
        for fn in self._handoff.close():
            fn()
        super().destroy_node()


def _deadlines_conflict(p: dict[str, Any]) -> str | None:
    """Why the hard deadline cannot be used with the soft one, or None."""
    if 0 < p["hard_deadline_ms"] < p["relative_deadline_ms"]:
        return (f"hard_deadline_ms {p['hard_deadline_ms']} is before relative_deadline_ms "
                f"{p['relative_deadline_ms']} (the soft one)")
    return None


def input_camera_info(info: CameraInfo, geom: Fit, header: Any) -> CameraInfo:
    """``info`` for the model input the image was fitted into (``geom``): K and P scaled
    and shifted as the pixels were (pixel centres at integers, OpenCV's convention:
    ``u' = (u + 0.5) * s - 0.5 + pad``), the input's size, no ROI or binning; the
    distortion model is the camera's (resizing does not undistort)."""
    sx, sy = geom.scale_x, geom.scale_y
    ox, oy = 0.5 * sx - 0.5 + geom.pad_x, 0.5 * sy - 0.5 + geom.pad_y
    k = list(info.k)
    k[0], k[1], k[2] = k[0] * sx, k[1] * sx, k[2] * sx + ox * k[8]
    k[4], k[5] = k[4] * sy, k[5] * sy + oy * k[8]
    p = list(info.p)
    p[0], p[1], p[2], p[3] = p[0] * sx, p[1] * sx, p[2] * sx + ox * p[10], p[3] * sx
    p[5], p[6], p[7] = p[5] * sy, p[6] * sy + oy * p[10], p[7] * sy
    return CameraInfo(header=header, height=geom.dst_h, width=geom.dst_w,
                      distortion_model=info.distortion_model, d=list(info.d), k=k,
                      r=list(info.r), p=p)


def _concrete_shape(shape: list[Any], height: int, width: int) -> list[int]:
    """Model input shape with dynamic dims bound: N=1, C=3, H/W from the image."""
    if len(shape) != 4:
        return [int(d) if isinstance(d, int) else 1 for d in shape]
    fill = [1, 3, int(height), int(width)]
    return [int(d) if isinstance(d, int) and d > 0 else f for d, f in zip(shape, fill)]
