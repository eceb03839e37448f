"""The ROS layer's typed tensor messages <-> numpy, without importing ROS.

The wire types live in the ``av_infer_msgs`` interface package (``ros/av_infer_msgs``):
``Tensor{name, shape: TensorShape{rank, dims}, data_type, strides, data}`` (Isaac ROS's
``isaac_ros_tensor_list_interfaces/Tensor`` field for field, with its ``data_type`` codes),
``InferRequest``, ``InferResponse`` and ``InferTimings``. This module works on any
object with those fields (duck typing), so ``av_infer`` stays importable, and this logic
testable, without ROS.

The split control/data path (SplitRPC, paper 002) is built from three steps, each with a
guarantee:

* :func:`read_control` reads and validates a request's *control* fields (id, model,
  priority, deadline, ...) without touching any tensor payload;
* :func:`check_tensors` validates every tensor's metadata (names, dtypes, shapes, strides,
  byte counts) against :class:`Limits` *before anything is allocated*, and returns
  read-only numpy views over the message's own bytes (no copy);
* :func:`fill_tensor` writes one array into a ``Tensor`` message with exactly one copy.

The caller copies each view once, into the runtime's task input buffers
(``Runtime.input_buffers``). Anything wrong raises :class:`CodecError` (code
``malformed_request``) carrying the request id when one could be read (``""`` otherwise),
so the caller can still answer the request exactly once.
"""

from __future__ import annotations

import array
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

#: Image preprocessing as one GIL-free weighted gather straight into a task's input buffer
#: (``nodes/preprocess.py`` builds the plan once per camera -> model pair): the data path's
#: only per-frame work on the pixels (av_infer/_cy/gather.pyx).
from av_infer._cy.gather import GatherPlan, ResizePlan  # noqa: E402, F401

#: The data path's messages in their serialised (CDR) form (av_infer/_cy/ros_cdr.pyx): an
#: output ``TensorList`` written straight from the arrays (:func:`tensor_list_cdr`), a
#: received ``Image``/``CompressedImage`` read into its fields and a view of its pixels, a
#: received ``TensorList`` into views of its tensors (:func:`read_tensor_list_cdr`), the
#: host's ``InferResponse`` written (:func:`infer_response_cdr`) and read by a remote
#: client (:func:`read_infer_response_cdr`), a remote client's ``InferRequest`` written
#: (:func:`infer_request_cdr`), an image node's ``Detection2DArray`` (``write_detections``)
#: and a node's ``/diagnostics`` ``DiagnosticArray`` (``write_diagnostics``) written.
from av_infer._cy.ros_cdr import (  # noqa: E402, F401
    read_compressed_image,
    read_image,
    read_infer_request,
    read_infer_response,
    read_tensor_list,
    write_detections,
    write_diagnostics,
    write_float64_stamped,
    write_infer_request,
    write_infer_response,
    write_outputs,
    write_tensor_list,
)

MALFORMED = "malformed_request"

#: ``Tensor.DATA_TYPE_*`` -> little-endian numpy dtype. 1..10 are the codes Isaac ROS's
#: ``Tensor.msg`` documents (9 float32, 10 float64); 11..13 GXF's ``PrimitiveType`` values
#: that follow them (``kComplex64``, ``kComplex128``, ``kFloat16``); 128 (bool) is
#: av_infer's own: GXF has no boolean type.
DATA_TYPES: dict[int, np.dtype] = {
    code: np.dtype(name).newbyteorder("<") for code, name in (
        (1, "int8"), (2, "uint8"), (3, "int16"), (4, "uint16"), (5, "int32"), (6, "uint32"),
        (7, "int64"), (8, "uint64"), (9, "float32"), (10, "float64"), (11, "complex64"),
        (12, "complex128"), (13, "float16"), (128, "bool"))
}
#: The codes Isaac ROS's message documents and its nodes convert (nitros_tensor_list.cpp).
ISAAC_DATA_TYPES = frozenset(range(1, 11))
#: numpy dtype name -> ``Tensor.DATA_TYPE_*``.
DATA_TYPE_OF: dict[str, int] = {dt.name: code for code, dt in DATA_TYPES.items()}
#: numpy type number -> ``Tensor.DATA_TYPE_*`` (``write_outputs``' fast path; a type with a
#: second number, e.g. ``longlong`` beside ``int64``, takes the general path by name)
_TYPE_CODES: dict[int, int] = {dt.num: code for code, dt in DATA_TYPES.items()}

#: ``InferRequest.PRIORITY_*`` -> the runtime's priority names.
PRIORITIES: dict[int, str] = {0: "RT", 1: "BE"}
PRIORITY_OF: dict[str, int] = {v: k for k, v in PRIORITIES.items()}

#: av_infer error codes (``errors.py``; ``AvInferError.code``) -> ``InferResponse.STATUS_*``.
#: Codes not listed map to ``STATUS_INTERNAL_ERROR`` (255), the code string says which.
STATUS: dict[str, int] = {
    "ok": 0, MALFORMED: 1, "invalid_input": 2, "unknown_model": 3, "deadline_missed": 4,
    "rejected": 5, "inactive": 6, "shutdown": 7, "device_fault": 8, "timeout": 9,
    "request_too_large": 10, "invalid_parameter": 11, "not_allowed": 5,
}
STATUS_INTERNAL_ERROR = 255


def status_of(code: str) -> int:
    """The ``InferResponse.status`` constant for an av_infer error code."""
    return STATUS.get(code, STATUS_INTERNAL_ERROR)


@dataclass(frozen=True)
class Limits:
    """Bounds a request must respect before the node allocates anything for it.

    Anyone on the ROS graph can publish a request, so these bound what one message can make
    the runtime host allocate: ``max_tensors`` tensors, each at most ``max_tensor_bytes``
    and all together at most ``max_request_bytes``, of rank at most ``max_rank``.
    """

    max_tensors: int = 64
    max_rank: int = 8
    max_tensor_bytes: int = 256 * 2**20
    max_request_bytes: int = 512 * 2**20
    max_id_len: int = 128

    def __post_init__(self) -> None:
        for name in ("max_tensors", "max_rank", "max_tensor_bytes", "max_request_bytes",
                     "max_id_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")


DEFAULT_LIMITS = Limits()


class CodecError(ValueError):
    """A message that breaks the wire contract; ``request_id`` is ``""`` if unknown."""

    code = MALFORMED

    def __init__(self, message: str, request_id: str = ""):
        super().__init__(message)
        self.request_id = request_id


class TooLargeError(CodecError):
    """A request beyond :class:`Limits` (code ``request_too_large``); nothing allocated."""

    code = "request_too_large"


@dataclass(frozen=True)
class RequestControl:
    """A request's control fields, validated (the payload is not part of it)."""

    id: str
    model: str
    client: str
    priority: str
    stamp: tuple[int, int]
    frame_id: str
    #: relative to ``stamp`` (receipt when the stamp is zero); None: no deadline
    deadline_s: float | None
    drop_late: bool
    #: paper 001's hard deadline, relative to ``stamp`` like ``deadline_s`` (which is then
    #: the soft one); None: none
    hard_deadline_s: float | None = None
    #: a variant group on the host serving ``model`` (the group or one of its variants);
    #: None: none (or the client's)
    variant_group: str | None = None


def read_id(msg: Any, limits: Limits = DEFAULT_LIMITS) -> str:
    """The request's id if usable, else ``""`` (the answer then carries an empty id)."""
    rid = getattr(msg, "id", None)
    return rid if isinstance(rid, str) and 0 < len(rid) <= limits.max_id_len else ""


def read_control(msg: Any, limits: Limits = DEFAULT_LIMITS) -> RequestControl:
    """An ``InferRequest``'s control fields, validated; never reads tensor data."""
    rid = read_id(msg, limits)
    if not rid:
        raise CodecError(f"'id' must be a non-empty string of at most {limits.max_id_len} "
                         "characters")
    model = msg.model
    if not isinstance(model, str) or not model:
        raise CodecError("'model' must be a non-empty string", rid)
    prio = PRIORITIES.get(int(msg.priority))
    if prio is None:
        raise CodecError(f"'priority' must be PRIORITY_RT (0) or PRIORITY_BE (1), got "
                         f"{msg.priority}", rid)
    deadline = _duration(msg.deadline, "deadline", rid)
    hard = _duration(getattr(msg, "hard_deadline", None), "hard_deadline", rid)
    group = getattr(msg, "variant_group", "") or None
    if group is not None and (not isinstance(group, str) or len(group) > limits.max_id_len):
        raise CodecError(f"'variant_group' must be a string of at most {limits.max_id_len} "
                         "characters", rid)
    stamp = (int(msg.header.stamp.sec), int(msg.header.stamp.nanosec))
    return RequestControl(id=rid, model=model, client=msg.client or "remote", priority=prio,
                          stamp=stamp, frame_id=msg.header.frame_id, deadline_s=deadline,
                          drop_late=bool(msg.drop_late), hard_deadline_s=hard,
                          variant_group=group)


def _duration(d: Any, field: str, rid: str) -> float | None:
    """A ``builtin_interfaces/Duration`` field in seconds; None for zero (or absent)."""
    if d is None:
        return None
    sec, nsec = int(d.sec), int(d.nanosec)
    if sec < 0 or not 0 <= nsec < 1_000_000_000:
        raise CodecError(f"'{field}' must be a non-negative duration, got {sec} s "
                         f"{nsec} ns", rid)
    return sec + nsec * 1e-9 or None


def _payload(data: Any) -> memoryview:
    """The bytes of a ``uint8[]`` field (rclpy hands an ``array.array('B')``): no copy."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def check_tensors(tensors: Iterable[Any], limits: Limits = DEFAULT_LIMITS,
                  request_id: str = "") -> dict[str, np.ndarray]:
    """Validates tensor metadata and returns read-only views over the messages' bytes.

    Checks, in order and before allocating anything: the tensor count, then for each tensor
    a unique non-empty name, a known ``data_type``, the rank, C-contiguous (or empty)
    strides, the byte count ``prod(shape) x itemsize`` against ``len(data)`` and the per-
    tensor and per-request byte bounds. The views alias the messages (keep them alive while
    the views are used) and are little-endian (native on every platform av_infer runs on).
    """

    def bad(msg: str) -> CodecError:
        return CodecError(msg, request_id)

    def big(msg: str) -> CodecError:
        return TooLargeError(msg, request_id)

    tensors = list(tensors)
    if len(tensors) > limits.max_tensors:
        raise big(f"too many tensors ({len(tensors)} > {limits.max_tensors})")
    out: dict[str, np.ndarray] = {}
    total = 0
    for i, t in enumerate(tensors):
        name = t.name
        if not isinstance(name, str) or not name:
            raise bad(f"tensors[{i}].name must be a non-empty string")
        if name in out:
            raise bad(f"tensor {name!r} appears twice")
        dtype = DATA_TYPES.get(int(t.data_type))
        if dtype is None:
            raise bad(f"tensor {name!r}: unknown data_type {t.data_type} (known: "
                      + ", ".join(f"{k}={v.name}" for k, v in DATA_TYPES.items()) + ")")
        shape = _dims(t, name, request_id)
        if len(shape) > limits.max_rank:
            raise big(f"tensor {name!r}: rank {len(shape)} > {limits.max_rank}")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > limits.max_tensor_bytes:
            raise big(f"tensor {name!r}: {nbytes} bytes > the limit of "
                      f"{limits.max_tensor_bytes}")
        total += nbytes
        if total > limits.max_request_bytes:
            raise big(f"request tensors exceed the limit of {limits.max_request_bytes} bytes")
        strides = [int(s) for s in t.strides]
        if strides and strides != contiguous_strides(shape, dtype.itemsize):
            raise bad(f"tensor {name!r}: strides {strides} are not C-contiguous for shape "
                      f"{shape} (send contiguous data, or empty strides)")
        data = _payload(t.data)
        if len(data) != nbytes:
            raise bad(f"tensor {name!r}: shape {shape} x {dtype.name} is {nbytes} bytes, "
                      f"data has {len(data)}")
        view = np.frombuffer(data, dtype=dtype).reshape(shape)
        view.flags.writeable = False
        out[name] = view
    return out


def _dims(t: Any, name: str, request_id: str = "") -> list[int]:
    """A ``Tensor``'s dimensions from its ``TensorShape`` (``rank`` must equal
    ``len(dims)``); a plain sequence (a test's stand-in object) is taken as the dims."""
    shape = t.shape
    dims = getattr(shape, "dims", None)
    if dims is None:
        return [int(d) for d in shape]
    dims = [int(d) for d in dims]
    if int(shape.rank) != len(dims):
        raise CodecError(f"tensor {name!r}: shape.rank {shape.rank} but {len(dims)} dims",
                         request_id)
    return dims


@dataclass
class Shape:
    """A ``TensorShape``'s fields, for ``Tensor`` stand-ins that are not messages."""

    rank: int
    dims: Any  # array.array("I") where built here, a tuple where read from the wire


def _set_shape(msg: Any, dims: Any) -> None:
    """Sets ``msg.shape`` (a ``TensorShape``: ``rank``, ``dims``): in place on a message,
    a :class:`Shape` on any other object."""
    dims = array.array("I", dims)
    shape = getattr(msg, "shape", None)
    if shape is None or not hasattr(shape, "dims"):
        msg.shape = Shape(len(dims), dims)
        return
    shape.rank = len(dims)
    shape.dims = dims


def _same_shape(msg: Any, dims: tuple[int, ...]) -> bool:
    """Whether ``msg.shape`` (a ``TensorShape`` or :class:`Shape`) already is ``dims``."""
    shape = getattr(msg, "shape", None)
    return (shape is not None and shape.rank == len(dims)
            and tuple(shape.dims) == tuple(dims))


def contiguous_strides(shape: list[int], itemsize: int) -> list[int]:
    """Byte strides of a C-contiguous array of ``shape``."""
    strides = [0] * len(shape)
    acc = itemsize
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = acc
        acc *= max(int(shape[i]), 1)
    return strides


def wire_array(name: str, value: Any) -> tuple[np.ndarray, int]:
    """``value`` as the array a ``Tensor`` carries (little-endian, C order: a copy only
    where it is neither) and its ``data_type``; CodecError for a dtype without one."""
    arr = np.asarray(value)
    code = DATA_TYPE_OF.get(arr.dtype.name)
    if code is None:
        raise CodecError(f"tensor {name!r}: dtype {arr.dtype} has no Tensor data_type")
    if arr.dtype.byteorder == ">" or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, dtype=DATA_TYPES[code])  # the rare extra copy
    return arr, code


def fill_tensor(msg: Any, name: str, value: np.ndarray) -> Any:
    """Sets ``msg``'s fields (a ``Tensor``) from ``value``: one copy of the bytes. A
    message that already holds a tensor of this name, dtype and shape (a reused one) gets
    the new bytes copied into its data buffer and no field set again.

    The copy is one only if ``msg``'s setter keeps the ``array.array`` it is given: make
    the message with ``check_fields=True`` (``av_infer_nodes.common.new_tensor``); with
    rosidl's default the setter copies it again. Raises :class:`CodecError` for a dtype the
    wire cannot carry.
    """
    arr, code = wire_array(name, value)
    old = getattr(msg, "data", None)
    if (isinstance(old, array.array) and old.typecode == "B" and len(old) == arr.nbytes
            and msg.data_type == code and msg.name == name and _same_shape(msg, arr.shape)):
        # a reused message that already describes this tensor (a node publishing the same
        # model's outputs every frame): the bytes copied into its buffer, no field set
        memoryview(old)[:] = arr.reshape(-1).view(np.uint8)
        return msg
    data = array.array("B")
    data.frombytes(arr.reshape(-1).view(np.uint8))
    msg.name = name
    _set_shape(msg, arr.shape)
    msg.data_type = code
    msg.strides = array.array("Q", contiguous_strides(list(arr.shape), arr.dtype.itemsize))
    msg.data = data
    return msg


def tensor_list_cdr(stamp: tuple[int, int], frame_id: str,
                    outputs: Mapping[str, Any]) -> bytes:
    """``outputs`` as a serialised ``TensorList`` (header ``stamp`` = ``(sec, nanosec)``,
    ``frame_id``), the bytes ``Publisher.publish`` sends as they are: what
    :func:`fill_tensor` would put in each ``Tensor`` (strides filled in, little-endian,
    C order), with one copy of each array's bytes and no message objects
    (``av_infer/_cy/ros_cdr.pyx``). Raises :class:`CodecError` for a dtype the wire
    cannot carry or a rank over 255, before anything is written."""
    raw = write_outputs(stamp[0], stamp[1], frame_id.encode(), outputs, _TYPE_CODES)
    if raw is not None:  # every output a plain array: written from C, no Python per tensor
        return raw
    tensors = []
    for name, value in outputs.items():
        arr, code = wire_array(name, value)
        tensors.append((name.encode(), arr.shape, code,
                        contiguous_strides(list(arr.shape), arr.dtype.itemsize),
                        arr.reshape(-1).view(np.uint8)))
    try:
        return write_tensor_list(stamp[0], stamp[1], frame_id.encode(), tensors)
    except (ValueError, OverflowError) as exc:  # a rank or a dimension the wire cannot carry
        raise CodecError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class WireTensor:
    """A ``Tensor``'s fields as :func:`read_tensor_list_cdr` reads them from the serialised
    bytes (``data`` a view of those bytes), for :func:`check_tensors`."""

    name: str
    shape: Shape
    data_type: int
    strides: tuple[int, ...]
    data: memoryview


def read_tensor_list_cdr(data: bytes) -> tuple[tuple[int, int], str, dict[str, np.ndarray]]:
    """A serialised ``TensorList`` (a ``raw=True`` subscription's message, e.g. an image
    node's ``~/output/tensors``) as ``((sec, nanosec), frame_id, {name: array})``: the
    arrays are read-only views of ``data`` (keep it alive while they are used), checked as
    :func:`tensors_dict` checks received messages, and equal to what it gives for the same
    message deserialised by rclpy (no message objects: ~1 µs against rclpy's typed take,
    docs/perf_cython.md). ValueError (a :class:`CodecError` for a tensor that fails the
    checks) when ``data`` is not a valid one."""
    sec, nanosec, frame_id, raw = read_tensor_list(data)
    return (sec, nanosec), frame_id, tensors_dict(wire_tensors(raw))


def wire_tensors(raw: Iterable[tuple]) -> list[WireTensor]:
    """``ros_cdr``'s tensor tuples (``read_tensor_list``, ``read_infer_request``) as
    :class:`WireTensor` records, for :func:`check_tensors`."""
    return [WireTensor(name, Shape(rank, dims), code, strides, payload)
            for name, rank, dims, code, strides, payload in raw]


class Duration(NamedTuple):
    """A ``builtin_interfaces/Duration`` read from the wire (``read_infer_request``)."""

    sec: int
    nanosec: int


class WireTimings(NamedTuple):
    """An ``InferTimings`` read from the wire (:func:`read_infer_response_cdr`): the
    message's fields, by the same names."""

    queueing_ms: float
    compute_ms: float
    total_ms: float
    preempted: int
    kernels_padded: int
    has_deadline: bool
    deadline_met: bool


class WireResponse(NamedTuple):
    """An ``InferResponse`` read from its serialised bytes (:func:`read_infer_response_cdr`):
    the message's fields by their names (``stamp`` the header's ``(sec, nanosec)``,
    ``frame_id`` its frame), ``timings`` a :class:`WireTimings`, and ``tensors`` as
    :class:`WireTensor` records not checked yet (:meth:`outputs` checks and views them), so
    a response whose outputs fail the checks can still be matched to its request by
    ``id`` and answered with the reason."""

    stamp: tuple[int, int]
    frame_id: str
    id: str
    status: int
    code: str
    message: str
    model: str
    served_model: str
    kappa: float
    quality: float
    timings: WireTimings
    tensors: list[WireTensor]

    def outputs(self) -> dict[str, np.ndarray]:
        """The tensors as read-only arrays over the message's bytes, checked as
        :func:`tensors_dict` checks received messages (:class:`CodecError` otherwise)."""
        return tensors_dict(self.tensors)


def read_infer_response_cdr(data: bytes) -> WireResponse:
    """A serialised ``InferResponse`` (a ``raw=True`` subscription's message: a remote
    client's answers) without message objects: every field read and every count checked
    against the bytes (``ValueError`` naming the field when ``data`` is not one); the
    tensors' bytes stay in ``data`` (keep it alive while the arrays are used)."""
    (sec, nanosec, frame_id, rid, status, code, message, model, served, kappa, quality,
     timings, raw) = read_infer_response(data)
    return WireResponse((sec, nanosec), frame_id, rid, status, code, message, model, served,
                        kappa, quality, WireTimings(*timings), wire_tensors(raw))


def infer_response_cdr(stamp: tuple[int, int], frame_id: str, rid: str, code: str,
                       message: str, model: str, served_model: str, kappa: float,
                       quality: float, timings: Any,
                       outputs: Mapping[str, Any] | None) -> bytes | None:
    """An ``InferResponse`` as the bytes ``Publisher.publish`` sends as they are (``status``
    from ``code``; ``timings`` anything with ``InferTimings``' field names; ``outputs``
    ``{name: array}`` or None), written as :func:`tensor_list_cdr` writes outputs: one
    copy of each array, no message objects. None where an output is not a plain
    native-order C-contiguous array of a wire dtype or a field does not fit the message:
    the caller builds the message (whose conversion then raises what the wire refuses).
    Strings must be UTF-8 encodable (:func:`ros_text`)."""
    t = timings
    texts = _wire_texts(frame_id, rid, code, message, model, served_model)
    if texts is None:
        return None
    try:
        return write_infer_response(
            stamp[0], stamp[1], texts[0], texts[1], status_of(code), *texts[2:],
            float(kappa), float(quality),
            (float(t.queueing_ms), float(t.compute_ms), float(t.total_ms),
             int(t.preempted), int(t.kernels_padded), bool(t.has_deadline),
             bool(t.deadline_met)),
            dict(outputs) if outputs else {}, _TYPE_CODES)
    except (OverflowError, ValueError):
        return None


def infer_request_cdr(ctrl: RequestControl,
                      inputs: Mapping[str, Any]) -> bytes | None:
    """The ``InferRequest`` for ``ctrl`` and ``inputs`` as the bytes ``Publisher.publish``
    sends as they are: what ``nodes.common.request_msg`` puts in the message (the relative
    deadlines as durations rounded to the nanosecond, no deadline as zero), the inputs
    written as :func:`tensor_list_cdr` writes outputs (one copy each, no message objects).
    None where an input is not a plain native-order C-contiguous array of a wire dtype,
    a string holds a NUL or a field does not fit the message: the caller builds the
    message (whose conversion raises what the wire refuses)."""
    texts = _wire_texts(ctrl.frame_id, ctrl.id, ctrl.model, ctrl.client,
                        ctrl.variant_group or "")
    if texts is None:
        return None

    def duration(rel: float | None) -> tuple[int, int]:
        return divmod(int(round(rel * 1e9)), 1_000_000_000) if rel else (0, 0)

    try:
        return write_infer_request(
            ctrl.stamp[0], ctrl.stamp[1], *texts[:4], PRIORITY_OF[ctrl.priority],
            duration(ctrl.deadline_s), bool(ctrl.drop_late), duration(ctrl.hard_deadline_s),
            texts[4], dict(inputs), _TYPE_CODES)
    except (OverflowError, ValueError):
        return None


def ros_text(text: str) -> str:
    """``text`` as a ROS string can carry it: lone surrogates cannot be UTF-8 encoded and
    would make ``publish`` raise, so they are written as backslash escapes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _wire_texts(*texts: str) -> list[bytes] | None:
    """Strings as a serialised message's UTF-8 bytes; None when one holds a NUL (a ROS
    string ends at its first: the message's conversion then decides) or cannot be encoded
    (a lone surrogate: :func:`ros_text` escapes them first)."""
    if any("\x00" in t for t in texts):
        return None
    try:
        return [t.encode() for t in texts]
    except UnicodeEncodeError:
        return None


def spec_tensor(msg: Any, name: str, shape: Iterable[int], dtype: Any) -> Any:
    """Sets ``msg`` (a ``Tensor``) to describe an input/output without data."""
    dt = np.dtype(dtype)
    code = DATA_TYPE_OF.get(dt.name)
    if code is None:
        raise CodecError(f"tensor {name!r}: dtype {dt} has no Tensor data_type")
    dims = [max(int(d), 0) if isinstance(d, int | np.integer) else 0 for d in shape]
    msg.name = name
    _set_shape(msg, dims)
    msg.data_type = code
    msg.strides = array.array("Q", contiguous_strides(dims, dt.itemsize))
    return msg


def tensor_array(msg: Any) -> np.ndarray:
    """A received ``Tensor`` as a read-only numpy view (no copy); validated."""
    return check_tensors([msg], DEFAULT_LIMITS)[msg.name]


#: what a received response or ``TensorList`` is held to (the sender's own limits applied)
_RECEIVED = Limits(max_tensors=1 << 16, max_tensor_bytes=1 << 62, max_request_bytes=1 << 62,
                   max_rank=64)


def tensors_dict(tensors: Iterable[Any]) -> dict[str, np.ndarray]:
    """A response's or ``TensorList``'s tensors as read-only numpy views, by name."""
    return check_tensors(tensors, _RECEIVED)


def fill_timings(msg: Any, timings: Any, deadline: float | None,
                 received: float | None = None, now: float | None = None) -> Any:
    """Sets an ``InferTimings`` from a runtime ``Timings`` (runtime-clock seconds).

    ``received``/``now``: the host's receipt and publication times on the same clock (for
    ``total_ms``); NaN where something was not measured.
    """
    def ms(a: Any, b: Any) -> float:
        try:
            v = (float(b) - float(a)) * 1e3
        except (TypeError, ValueError):
            return math.nan
        return v if math.isfinite(v) else math.nan

    if timings is not None:
        msg.queueing_ms = ms(getattr(timings, "arrival", None), getattr(timings, "start", None))
        msg.compute_ms = ms(getattr(timings, "start", None), getattr(timings, "end", None))
        for key in ("preempted", "kernels_padded"):
            v = getattr(timings, key, 0)
            setattr(msg, key, max(int(v), 0) if isinstance(v, int | np.integer) else 0)
    else:
        msg.queueing_ms = msg.compute_ms = math.nan
    msg.total_ms = ms(received, now) if received is not None and now is not None else math.nan
    has = deadline is not None and math.isfinite(deadline)
    msg.has_deadline = bool(has)
    end = getattr(timings, "end", None) if timings is not None else None
    msg.deadline_met = bool(has and isinstance(end, float) and math.isfinite(end)
                            and end <= deadline)
    return msg


def error_code(exc: BaseException) -> str:
    """The stable code of an av_infer error (``internal_error`` for anything else)."""
    return str(getattr(exc, "code", None) or "internal_error")


def check_spec(model: str, spec: Mapping[str, tuple[Any, Any]],
               views: Mapping[str, np.ndarray]) -> None:
    """Names, shapes and dtypes of ``views`` against a model's input spec.

    Raises ``InvalidInputError`` (code ``invalid_input``) naming what differs: the same
    check ``Runtime.submit`` makes, done before the payload is copied anywhere.
    """
    from av_infer.errors import InvalidInputError

    missing = sorted(set(spec) - set(views))
    extra = sorted(set(views) - set(spec))
    if missing or extra:
        raise InvalidInputError(f"model {model!r}: missing {missing}, unexpected {extra}; "
                                "expects " + ", ".join(f"{n}: {np.dtype(d).name}{list(s)}"
                                                       for n, (s, d) in spec.items()))
    for name, (shape, dtype) in spec.items():
        v = views[name]
        if tuple(v.shape) != tuple(shape) or v.dtype != np.dtype(dtype):
            raise InvalidInputError(f"model {model!r} input {name!r}: expected "
                                    f"{np.dtype(dtype).name}{list(shape)}, got "
                                    f"{v.dtype.name}{list(v.shape)}")
