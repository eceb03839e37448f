"""Micro-benchmarks of the Cython hot paths (pytest-benchmark).

pyproject disables benchmarking by default, so these run once as tests. Real numbers:
    .venv/bin/python -m pytest tests/cy/test_bench_cython.py --benchmark-enable
Each benchmarked call does N operations; docs/perf_cython.md divides the medians by N.
"""

import heapq
import importlib.util
import itertools
import random
from collections import deque

import pytest
from av_infer._cy.edf_heap import EdfHeap
from av_infer._cy.vhq import VHQ

HEAP_SIZE = 1000
N_OPS = 1000
pytestmark = pytest.mark.benchmark(group="cython-hot-paths")


def _deadlines(n, seed=1):
    rng = random.Random(seed)
    return [rng.uniform(0.0, 1.0) for _ in range(n)]


def test_bench_edf_push_pop(benchmark):
    """EdfHeap: push one + pop one on a heap holding HEAP_SIZE items (N_OPS pairs)."""
    h = EdfHeap()
    for i, d in enumerate(_deadlines(HEAP_SIZE)):
        h.push(d, i)
    ds = _deadlines(N_OPS, seed=2)
    push, pop = h.push, h.pop

    def run():
        for d in ds:
            push(d, None)
            pop()

    benchmark(run)
    assert len(h) == HEAP_SIZE


def test_bench_heapq_push_pop_baseline(benchmark):
    """Pure-Python baseline: heapq on (deadline, seq, item) tuples, same workload."""
    seq = itertools.count()
    h = [(d, next(seq), i) for i, d in enumerate(_deadlines(HEAP_SIZE))]
    heapq.heapify(h)
    ds = _deadlines(N_OPS, seed=2)
    push, pop = heapq.heappush, heapq.heappop

    def run():
        for d in ds:
            push(h, (d, next(seq), None))
            pop(h)

    benchmark(run)
    assert len(h) == HEAP_SIZE


def test_bench_vhq_push_transmit_complete(benchmark):
    """VHQ: push(task, k, k) + transmit + complete, N_OPS launches (c = 4)."""
    q = VHQ(c=4)
    push, transmit, complete = q.push, q.transmit, q.complete

    def run():
        for k in range(N_OPS):
            push(1, k, k)
            transmit()
            complete()

    benchmark(run)
    assert q.empty


def test_bench_vhq_transmit_complete_range(benchmark):
    """VHQ: one push of an N_OPS-kernel task, then N_OPS x (transmit + complete)."""
    q = VHQ(c=4)
    push, transmit, complete = q.push, q.transmit, q.complete

    def run():
        push(1, 0, N_OPS - 1)
        for _ in range(N_OPS):
            transmit()
            complete()

    benchmark(run)
    assert q.empty


def test_bench_vhq_drain_nogil(benchmark):
    """VHQ: GIL-free transmit_c + complete_c loop (the dispatcher's C path), N_OPS launches."""
    q = VHQ(c=4)

    def run():
        q.push(1, 0, N_OPS - 1)
        q._drain_nogil(N_OPS)

    benchmark(run)
    assert q.empty


def test_bench_deque_push_transmit_complete_baseline(benchmark):
    """Pure-Python baseline: deque of (task, kernel) launches + an in-flight deque."""
    queue, inflight = deque(), deque()
    c = 4

    def run():
        for k in range(N_OPS):
            queue.append((1, k))
            if len(inflight) < c and queue:
                inflight.append(queue.popleft())
            inflight.popleft()

    benchmark(run)
    assert not queue and not inflight


def _vhq_with_queued(n_ranges):
    q = VHQ(c=4)
    q.push(0, 0, 1)
    q.transmit()
    for i in range(n_ranges):
        q.push(1 + (i % 2), i, i)       # alternating tasks: n separate range records
    return (q,), {}


def test_bench_vhq_reset_1000_queued(benchmark):
    """VHQ.reset() with 1000 queued launches in 1000 range records (O(1))."""
    result = benchmark.pedantic(
        lambda q: q.reset(), setup=lambda: _vhq_with_queued(1000), rounds=2000, iterations=1
    )
    assert result == (0, 0, 0, 1001)


def test_bench_deque_clear_1000_baseline(benchmark):
    """Pure-Python baseline: deque.clear() of 1000 queued launch tuples (O(n))."""

    def setup():
        return (deque((1, k) for k in range(1000)),), {}

    benchmark.pedantic(lambda d: d.clear(), setup=setup, rounds=2000, iterations=1)


def test_bench_image_gather(benchmark):
    """GatherPlan.apply: a 320x240 rgb8 frame -> 1x3x107x107 bilinear, normalised (one
    frame per call; the numpy gather + einsum it replaced: ~3x slower, docs/perf_cython.md)."""
    import numpy as np
    from av_infer_nodes import preprocess as pre

    raw = np.random.default_rng(0).integers(0, 256, 240 * 320 * 3, dtype=np.uint8)
    plan = pre._compiled_plan("rgb8", 240, 320, 960, 3, 107, 107, "bilinear",
                              (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    out = np.empty(3 * 107 * 107, np.float32)
    benchmark(plan.apply, raw, out)


#: the ROS message benchmarks need rclpy's serialisation (no context is started)
needs_rclpy = pytest.mark.skipif(importlib.util.find_spec("rclpy") is None,
                                 reason="rclpy is not installed")


def _frame_bytes():
    import array

    from rclpy.serialization import serialize_message
    from sensor_msgs.msg import Image

    img = Image(height=240, width=320, encoding="rgb8", step=960,
                data=array.array("B", bytes(240 * 320 * 3)))
    img.header.frame_id = "front_camera"
    return serialize_message(img), Image


@needs_rclpy
def test_bench_ros_cdr_read_image(benchmark):
    """ros_cdr.read_image: a serialised 320x240 rgb8 Image -> header fields and a view of
    the pixels (the image node's read since 2026-11-28; baseline below)."""
    from av_infer._cy import ros_cdr

    raw, _ = _frame_bytes()
    benchmark(ros_cdr.read_image, raw)


@needs_rclpy
def test_bench_rclpy_deserialize_image_baseline(benchmark):
    """rclpy's deserialize_message of the same bytes into an ``Image`` (what a typed
    subscription's take builds: the message objects and a copy of the pixels)."""
    from rclpy.serialization import deserialize_message

    raw, image = _frame_bytes()
    benchmark(deserialize_message, raw, image)


def _outputs():
    import numpy as np

    return {"logits": np.random.default_rng(0).random((1, 1000), dtype=np.float32)}


def test_bench_tensor_list_cdr(benchmark):
    """tensor_codec.tensor_list_cdr: one 1x1000 float32 output -> serialised TensorList
    (the image node's output since 2026-11-28; baseline below)."""
    from av_infer import tensor_codec as codec

    benchmark(codec.tensor_list_cdr, (1, 2), "front_camera", _outputs())


@needs_rclpy
def test_bench_fill_tensor_serialize_baseline(benchmark):
    """The same through message objects: ``fill_tensor`` into a ``TensorList`` and rclpy's
    ``serialize_message`` (what a typed publish does)."""
    from av_infer_msgs.msg import Tensor, TensorList
    from rclpy.serialization import serialize_message

    from av_infer import tensor_codec as codec

    outs = _outputs()

    def run():
        msg = TensorList(tensors=[codec.fill_tensor(Tensor(), n, v) for n, v in outs.items()])
        msg.header.frame_id = "front_camera"
        return serialize_message(msg)

    benchmark(run)


def test_bench_read_tensor_list_cdr(benchmark):
    """tensor_codec.read_tensor_list_cdr: a serialised TensorList of one 1x1000 float32
    output -> stamp, frame and checked read-only views (a consumer of the image node's
    ``~/output/tensors`` on a ``raw=True`` subscription; baseline below)."""
    from av_infer import tensor_codec as codec

    raw = codec.tensor_list_cdr((1, 2), "front_camera", _outputs())
    benchmark(codec.read_tensor_list_cdr, raw)


@needs_rclpy
def test_bench_rclpy_deserialize_tensor_list_baseline(benchmark):
    """The same bytes through rclpy: ``deserialize_message`` into a ``TensorList`` (what a
    typed subscription's take builds) and ``tensors_dict``'s views."""
    from av_infer_msgs.msg import TensorList
    from rclpy.serialization import deserialize_message

    from av_infer import tensor_codec as codec

    raw = codec.tensor_list_cdr((1, 2), "front_camera", _outputs())
    benchmark(lambda: codec.tensors_dict(deserialize_message(raw, TensorList).tensors))


def _response_args():
    from av_infer import tensor_codec as codec

    t = codec.WireTimings(0.1, 1.2, 1.5, 0, 0, True, True)
    return ((1, 2), "front_camera", "perception_front-17", "ok", "", "resnet", "resnet",
            1.0, 0.9, t, _outputs())


def test_bench_infer_response_cdr(benchmark):
    """tensor_codec.infer_response_cdr: the host's answer (one 1x1000 float32 output) ->
    serialised ``InferResponse`` (the runtime host's response since 2026-11-28 05:18 UTC;
    baseline below)."""
    from av_infer import tensor_codec as codec

    benchmark(codec.infer_response_cdr, *_response_args())


@needs_rclpy
def test_bench_response_msg_serialize_baseline(benchmark):
    """The same through message objects: ``nodes.common.response_msg`` (``fill_tensor``,
    ``InferTimings``) and rclpy's ``serialize_message`` (what a typed publish does)."""
    from av_infer_nodes.common import Reply, response_msg
    from rclpy.serialization import serialize_message
    from std_msgs.msg import Header

    args = _response_args()
    t = args[9]
    reply = Reply(id=args[2], model=args[5], served_model=args[6], kappa=1.0, quality=0.9,
                  outputs=args[10], timings=t)
    header = Header(frame_id=args[1])

    benchmark(lambda: serialize_message(response_msg(reply, header)))


def test_bench_read_infer_response_cdr(benchmark):
    """tensor_codec.read_infer_response_cdr + ``outputs()``: a serialised ``InferResponse``
    (one 1x1000 float32 output) -> its fields and checked read-only views (a remote
    client's read since 2026-11-28 05:18 UTC; baseline below)."""
    from av_infer import tensor_codec as codec

    raw = codec.infer_response_cdr(*_response_args())
    benchmark(lambda: codec.read_infer_response_cdr(raw).outputs())


@needs_rclpy
def test_bench_rclpy_deserialize_response_baseline(benchmark):
    """The same bytes through rclpy: ``deserialize_message`` into an ``InferResponse``
    (what the client's typed take built) and ``tensors_dict``'s views."""
    from av_infer_msgs.msg import InferResponse
    from rclpy.serialization import deserialize_message

    from av_infer import tensor_codec as codec

    raw = codec.infer_response_cdr(*_response_args())
    benchmark(lambda: codec.tensors_dict(deserialize_message(raw, InferResponse).tensors))


def _request_args():
    import numpy as np

    from av_infer import tensor_codec as codec

    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    ctrl = codec.RequestControl(id="cam-17", model="resnet", client="cam", priority="RT",
                                stamp=(1, 2), frame_id="front_camera", deadline_s=0.033,
                                drop_late=False)
    return ctrl, {"x": x}


def test_bench_infer_request_cdr(benchmark):
    """tensor_codec.infer_request_cdr: a remote client's request (one 1x3x224x224 float32
    input) -> serialised ``InferRequest`` (``RemoteRuntimeClient.submit`` since 2026-11-28
    05:40 UTC; baseline below)."""
    from av_infer import tensor_codec as codec

    benchmark(codec.infer_request_cdr, *_request_args())


@needs_rclpy
def test_bench_request_msg_serialize_baseline(benchmark):
    """The same through message objects: ``nodes.common.request_msg`` (``fill_tensor``)
    and rclpy's ``serialize_message`` (what a typed publish does)."""
    from av_infer_nodes.common import request_msg
    from rclpy.serialization import serialize_message

    ctrl, ins = _request_args()
    benchmark(lambda: serialize_message(request_msg(ctrl, ins)))


@needs_rclpy
def test_bench_request_msg_buffers_serialize_baseline(benchmark):
    """The remote image node's form before: the input preprocessed into a
    ``MessageBuffers`` array (the message's own ``uint8[]`` buffer, no ``fill_tensor``
    copy), ``request_msg`` and ``serialize_message``."""
    import numpy as np
    from av_infer_nodes.common import MessageBuffers, request_msg
    from rclpy.serialization import serialize_message

    ctrl, ins = _request_args()
    bufs = MessageBuffers({"x": ([1, 3, 224, 224], "float32")})
    np.copyto(bufs["x"], ins["x"])
    benchmark(lambda: serialize_message(request_msg(ctrl, bufs)))


def test_bench_infer_request_cdr_buffers(benchmark):
    """``infer_request_cdr`` of the same ``MessageBuffers`` (the remote image node since
    2026-11-28 05:40 UTC: its arrays are plain numpy arrays over ``array.array``)."""
    import numpy as np
    from av_infer_nodes.common import MessageBuffers

    from av_infer import tensor_codec as codec

    ctrl, ins = _request_args()
    bufs = MessageBuffers({"x": ([1, 3, 224, 224], "float32")})
    np.copyto(bufs["x"], ins["x"])
    benchmark(codec.infer_request_cdr, ctrl, bufs)


def _detections(n: int = 100):
    import numpy as np

    from av_infer.detect import Detections

    rng = np.random.default_rng(0)
    boxes = rng.random((n, 4)).astype(np.float32) * 300
    boxes[:, 2:] += boxes[:, :2]
    return Detections(boxes=boxes, scores=rng.random(n).astype(np.float32),
                      classes=np.zeros(n, np.int64), labels=("car",) * n)


@needs_rclpy
def test_bench_detections_cdr(benchmark):
    """nodes.detections.detections_cdr: 100 boxes -> serialised ``Detection2DArray`` (an
    image node's ``~/output/detections`` since 2026-11-28 05:44 UTC; baseline below)."""
    pytest.importorskip("vision_msgs.msg")
    from av_infer_nodes.detections import detections_cdr

    dets = _detections()
    benchmark(detections_cdr, dets, (1, 2), "front_camera")


@needs_rclpy
def test_bench_detections_msg_serialize_baseline(benchmark):
    """The same through message objects: ``detections_msg`` and rclpy's
    ``serialize_message`` (what a typed publish does)."""
    pytest.importorskip("vision_msgs.msg")
    from av_infer_nodes.detections import detections_msg
    from rclpy.serialization import serialize_message
    from std_msgs.msg import Header

    dets = _detections()
    header = Header(frame_id="front_camera")
    benchmark(lambda: serialize_message(detections_msg(dets, header)))


def _statuses(n_status: int = 30, n_values: int = 18):
    from av_infer_nodes.health import KV, Status

    return [Status(bytes([i % 4]), f"av_infer: client camera_{i}", "p50 1.20 ms, p99 2.41 ms",
                   "cpu", [KV(f"latency_ms.p{j}", f"{j * 0.173:.3f}") for j in range(n_values)])
            for i in range(n_status)]


@needs_rclpy
def test_bench_diagnostics_cdr(benchmark):
    """health.diagnostics_cdr: 30 statuses of 18 values (a host's ``/diagnostics`` with 24
    clients and 4 models is ~550 values) -> serialised ``DiagnosticArray`` (published as
    bytes since 2026-11-28 07:5x UTC; baseline below)."""
    from av_infer_nodes.health import diagnostics_cdr

    statuses = _statuses()
    benchmark(diagnostics_cdr, statuses, (1, 2))


@needs_rclpy
def test_bench_diagnostics_msg_serialize_baseline(benchmark):
    """The same statuses as ``DiagnosticStatus``/``KeyValue`` messages, serialised by rclpy
    (what the nodes published before)."""
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
    from rclpy.serialization import serialize_message

    statuses = _statuses()

    def as_msg():
        msg = DiagnosticArray()
        msg.status = [DiagnosticStatus(level=s.level, name=s.name, message=s.message,
                                       hardware_id=s.hardware_id,
                                       values=[KeyValue(key=k, value=v) for k, v in s.values])
                      for s in statuses]
        return serialize_message(msg)

    benchmark(as_msg)


def test_bench_quantiles(benchmark):
    """latency.quantiles: a recorder's summary (p50/p90/p99/p999) of 500 samples, as
    ``Runtime.stats()`` computes one per client recorder; baseline: ``np.percentile``."""
    import numpy as np

    from av_infer.latency import _SUMMARY_QS, quantiles

    a = np.random.default_rng(0).lognormal(0, 1, 500)
    benchmark(lambda: quantiles(a * 1e3, _SUMMARY_QS))


def test_bench_quantiles_numpy_baseline(benchmark):
    import numpy as np

    a = np.random.default_rng(0).lognormal(0, 1, 500)
    benchmark(lambda: np.percentile(a * 1e3, [50, 90, 99, 99.9]))


def _request_bytes():
    import numpy as np
    from av_infer_msgs.msg import InferRequest, Tensor
    from rclpy.serialization import serialize_message

    from av_infer import tensor_codec as codec

    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    msg = InferRequest(id="r1", model="resnet", client="cam")
    msg.tensors = [codec.fill_tensor(Tensor(), "x", x)]
    return serialize_message(msg), InferRequest


@needs_rclpy
def test_bench_wire_request(benchmark):
    """The host's read of a request (one 1x3x224x224 float32 input) since 2026-11-28: its
    serialised bytes into ``WireRequest`` (payload a view), control and tensor checks."""
    from av_infer_nodes.common import WireRequest

    from av_infer import tensor_codec as codec

    raw, _ = _request_bytes()

    def run():
        msg = WireRequest(raw)
        codec.read_control(msg)
        return codec.check_tensors(msg.tensors)

    benchmark(run)


@needs_rclpy
def test_bench_rclpy_deserialize_request_baseline(benchmark):
    """The same through rclpy's ``deserialize_message`` (what the typed take built: message
    objects and a copy of the payload) and the same checks."""
    from rclpy.serialization import deserialize_message

    from av_infer import tensor_codec as codec

    raw, request = _request_bytes()

    def run():
        msg = deserialize_message(raw, request)
        codec.read_control(msg)
        return codec.check_tensors(msg.tensors)

    benchmark(run)
