"""Tensor request/response wire format of the ROS layer, without ROS.

ROS 2 custom messages cannot be generated from the PyPI wheels, so requests and responses
travel as a standard ``std_msgs/UInt8MultiArray``: ``layout.dim[0].label`` holds a compact
JSON header and ``data`` the concatenated raw little-endian tensor bytes. This module turns
headers + numpy arrays into ``(label, bytes)`` and back, and validates strictly: anything
wrong with a request raises :class:`CodecError` (code ``malformed_request``) carrying the
request id when one could be read (``""`` otherwise), so the caller can still answer it.

Request header (``v`` 1)::

    {"v": 1, "id": "<uuid>", "model": "tiny_cnn", "priority": "RT" | "BE",
     "deadline_s": 0.033 | null, "client": "perception", "stamp": [sec, nanosec],
     "frame_id": "cam0", "drop_late": false,
     "tensors": [{"name": "input", "dtype": "float32", "shape": [1, 3, 32, 32],
                  "offset": 0, "nbytes": 12288}]}

``deadline_s`` is *relative*: the request must complete by ``stamp + deadline_s`` (ROS time);
with a zero stamp, by receipt + ``deadline_s``. Required: ``v``, ``id``, ``model``,
``priority``, ``tensors``; the others default to null / ``"remote"`` / [0, 0] / ``""`` / false.

Response header::

    {"v": 1, "id": "<same id>", "ok": true | false, "code": "ok" | "<error code>",
     "message": "...", "model": "...", "client": "...", "stamp": [sec, nanosec],
     "frame_id": "...", "tensors": [...], "timings": {...}}

Every request gets exactly one response with its id. The same response encoding carries the
outputs of the perception and monitoring nodes (``stamp``/``frame_id`` from the input image).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PROTOCOL_VERSION = 1
MALFORMED = "malformed_request"
PRIORITIES = ("RT", "BE")
#: dtype names on the wire -> little-endian numpy dtypes.
DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<")
    for name in ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
                 "uint8", "uint16", "uint32", "uint64", "bool")
}
MAX_ID_LEN = 128
MAX_TENSORS = 64
MAX_RANK = 8
_INT32_MAX = 2**31 - 1


class CodecError(ValueError):
    """A message that does not follow the wire format; ``request_id`` is ``""`` if unknown."""

    code = MALFORMED

    def __init__(self, message: str, request_id: str = ""):
        super().__init__(message)
        self.request_id = request_id


@dataclass
class TensorRequest:
    """One decoded inference request."""

    id: str
    model: str
    priority: str
    inputs: dict[str, np.ndarray]
    deadline_s: float | None = None
    client: str = "remote"
    stamp: tuple[int, int] = (0, 0)
    frame_id: str = ""
    drop_late: bool = False


@dataclass
class TensorResponse:
    """One response: outputs when ``ok``, otherwise an error ``code`` and ``message``."""

    id: str
    ok: bool
    code: str = "ok"
    message: str = ""
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    client: str = ""
    stamp: tuple[int, int] = (0, 0)
    frame_id: str = ""


# -- tensors -------------------------------------------------------------------------------
def pack_tensors(tensors: dict[str, np.ndarray]) -> tuple[list[dict[str, Any]], bytes]:
    """Concatenates arrays as little-endian bytes; returns their specs and the buffer."""
    specs: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    offset = 0
    for name, value in tensors.items():
        arr = np.asarray(value)
        dname = arr.dtype.name
        if dname not in DTYPES:
            raise CodecError(f"tensor {name!r}: dtype {dname} is not supported on the wire")
        raw = np.ascontiguousarray(arr, dtype=DTYPES[dname]).tobytes()
        specs.append({"name": str(name), "dtype": dname, "shape": [int(d) for d in arr.shape],
                      "offset": offset, "nbytes": len(raw)})
        chunks.append(raw)
        offset += len(raw)
    return specs, b"".join(chunks)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def unpack_tensors(specs: Any, data: bytes | bytearray | memoryview,
                   request_id: str = "") -> dict[str, np.ndarray]:
    """Validates tensor specs against ``data`` and returns native-endian, writable arrays."""

    def bad(msg: str) -> CodecError:
        return CodecError(msg, request_id)

    if not isinstance(specs, list):
        raise bad("'tensors' must be a list")
    if len(specs) > MAX_TENSORS:
        raise bad(f"too many tensors ({len(specs)} > {MAX_TENSORS})")
    buf = memoryview(data).cast("B")
    out: dict[str, np.ndarray] = {}
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict):
            raise bad(f"tensors[{i}] must be an object")
        missing = [k for k in ("name", "dtype", "shape", "offset", "nbytes") if k not in spec]
        if missing:
            raise bad(f"tensors[{i}] misses field(s) {', '.join(missing)}")
        name, dname, shape = spec["name"], spec["dtype"], spec["shape"]
        offset, nbytes = spec["offset"], spec["nbytes"]
        if not isinstance(name, str) or not name:
            raise bad(f"tensors[{i}].name must be a non-empty string")
        if name in out:
            raise bad(f"tensor {name!r} appears twice")
        if not isinstance(dname, str) or dname not in DTYPES:
            raise bad(f"tensor {name!r}: unknown dtype {dname!r} (known: {', '.join(DTYPES)})")
        if (not isinstance(shape, list) or len(shape) > MAX_RANK
                or not all(_is_int(d) and d >= 0 for d in shape)):
            raise bad(f"tensor {name!r}: shape must be a list of at most {MAX_RANK} "
                      f"non-negative integers, got {shape!r}")
        if not (_is_int(offset) and offset >= 0 and _is_int(nbytes) and nbytes >= 0):
            raise bad(f"tensor {name!r}: offset and nbytes must be non-negative integers")
        dtype = DTYPES[dname]
        if math.prod(d for d in shape if d) * dtype.itemsize >= 1 << 62:
            raise bad(f"tensor {name!r}: shape {shape} is too large for any array")
        expected = math.prod(shape) * dtype.itemsize
        if expected != nbytes:
            raise bad(f"tensor {name!r}: shape {shape} x {dname} is {expected} bytes, "
                      f"nbytes says {nbytes}")
        if offset + nbytes > len(buf):
            raise bad(f"tensor {name!r}: bytes [{offset}, {offset + nbytes}) lie outside the "
                      f"{len(buf)}-byte data")
        arr = np.frombuffer(buf[offset:offset + nbytes], dtype=dtype).reshape(shape)
        out[name] = arr.astype(dtype.newbyteorder("="), copy=True)
    return out


# -- header helpers ------------------------------------------------------------------------
def _dumps(header: dict[str, Any]) -> str:
    return json.dumps(header, separators=(",", ":"), allow_nan=False)


def _parse_header(label: Any) -> dict[str, Any]:
    if not isinstance(label, str) or not label:
        raise CodecError("missing JSON header (layout.dim[0].label)")
    try:
        header = json.loads(label)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise CodecError(f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise CodecError("header must be a JSON object")
    return header


def _read_id(header: dict[str, Any]) -> str:
    rid = header.get("id")
    if not isinstance(rid, str) or not rid or len(rid) > MAX_ID_LEN:
        raise CodecError(f"'id' must be a non-empty string of at most {MAX_ID_LEN} characters")
    return rid


def _stamp(value: Any, rid: str) -> tuple[int, int]:
    if value is None:
        return (0, 0)
    if (not isinstance(value, list | tuple) or len(value) != 2
            or not all(_is_int(v) for v in value)
            or not -(2**31) <= value[0] <= _INT32_MAX or not 0 <= value[1] < 1_000_000_000):
        raise CodecError(f"'stamp' must be [sec, nanosec] (int32, 0..999999999), got {value!r}",
                         rid)
    return (int(value[0]), int(value[1]))


def _str(header: dict[str, Any], key: str, default: str, rid: str) -> str:
    value = header.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise CodecError(f"{key!r} must be a string", rid)
    return value


def _version(header: dict[str, Any], rid: str) -> None:
    v = header.get("v")
    if v != PROTOCOL_VERSION:
        raise CodecError(f"unsupported protocol version {v!r} (this runtime speaks "
                         f"v{PROTOCOL_VERSION})", rid)


def _clean_timings(timings: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in timings.items():
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        elif isinstance(v, np.generic):
            v = v.item()
        out[str(k)] = v
    return out


# -- requests ------------------------------------------------------------------------------
def encode_request(req: TensorRequest) -> tuple[str, bytes]:
    """Request -> (JSON label, data bytes)."""
    if req.priority not in PRIORITIES:
        raise CodecError(f"priority must be one of {PRIORITIES}, got {req.priority!r}", req.id)
    specs, data = pack_tensors(req.inputs)
    header = {"v": PROTOCOL_VERSION, "id": req.id, "model": req.model,
              "priority": req.priority, "deadline_s": req.deadline_s, "client": req.client,
              "stamp": [int(req.stamp[0]), int(req.stamp[1])], "frame_id": req.frame_id,
              "drop_late": bool(req.drop_late), "tensors": specs}
    return _dumps(header), data


def decode_request(label: Any, data: bytes | bytearray | memoryview) -> TensorRequest:
    """(label, data) -> request; raises :class:`CodecError` with the id when it was readable."""
    header = _parse_header(label)
    rid = _read_id(header)
    _version(header, rid)
    missing = [k for k in ("model", "priority", "tensors") if k not in header]
    if missing:
        raise CodecError(f"header misses field(s) {', '.join(missing)}", rid)
    model = header["model"]
    if not isinstance(model, str) or not model:
        raise CodecError("'model' must be a non-empty string", rid)
    priority = header["priority"]
    if not isinstance(priority, str) or priority.upper() not in PRIORITIES:
        raise CodecError(f"'priority' must be 'RT' or 'BE', got {priority!r}", rid)
    deadline = header.get("deadline_s")
    if deadline is not None:
        try:  # an int beyond float range (10**400) is as malformed as inf
            seconds = float(deadline) if isinstance(deadline, int | float) else math.nan
        except OverflowError:
            seconds = math.inf
        if isinstance(deadline, bool) or not math.isfinite(seconds) or seconds <= 0:
            raise CodecError(f"'deadline_s' must be null or a positive number of seconds, "
                             f"got {str(deadline)[:40]}", rid)
        deadline = seconds
    drop_late = header.get("drop_late", False)
    if not isinstance(drop_late, bool):
        raise CodecError("'drop_late' must be true or false", rid)
    return TensorRequest(
        id=rid, model=model, priority=priority.upper(),
        inputs=unpack_tensors(header["tensors"], data, rid), deadline_s=deadline,
        client=_str(header, "client", "remote", rid) or "remote",
        stamp=_stamp(header.get("stamp"), rid), frame_id=_str(header, "frame_id", "", rid),
        drop_late=drop_late)


# -- responses -----------------------------------------------------------------------------
def encode_response(resp: TensorResponse) -> tuple[str, bytes]:
    """Response -> (JSON label, data bytes). Error responses carry no tensors."""
    specs, data = pack_tensors(resp.outputs) if resp.ok else ([], b"")
    header = {"v": PROTOCOL_VERSION, "id": resp.id, "ok": bool(resp.ok),
              "code": "ok" if resp.ok else (resp.code or "error"), "message": resp.message,
              "model": resp.model, "client": resp.client,
              "stamp": [int(resp.stamp[0]), int(resp.stamp[1])], "frame_id": resp.frame_id,
              "tensors": specs, "timings": _clean_timings(resp.timings)}
    return _dumps(header), data


def decode_response(label: Any, data: bytes | bytearray | memoryview) -> TensorResponse:
    """(label, data) -> response; raises :class:`CodecError` if it is malformed."""
    header = _parse_header(label)
    rid = header.get("id")
    if not isinstance(rid, str):
        raise CodecError("'id' must be a string")
    _version(header, rid)
    ok = header.get("ok")
    if not isinstance(ok, bool):
        raise CodecError("'ok' must be true or false", rid)
    timings = header.get("timings") or {}
    if not isinstance(timings, dict):
        raise CodecError("'timings' must be an object", rid)
    return TensorResponse(
        id=rid, ok=ok, code=_str(header, "code", "ok" if ok else "error", rid),
        message=_str(header, "message", "", rid),
        outputs=unpack_tensors(header.get("tensors", []), data, rid), timings=timings,
        model=_str(header, "model", "", rid), client=_str(header, "client", "", rid),
        stamp=_stamp(header.get("stamp"), rid), frame_id=_str(header, "frame_id", "", rid))


def error_response(request_id: str, code: str, message: str, **kw: Any) -> TensorResponse:
    """An ``ok: false`` response (``request_id`` ``""`` when the request had no usable id)."""
    return TensorResponse(id=request_id, ok=False, code=code, message=message, **kw)


def timings_dict(timings: Any, deadline: float | None = None) -> dict[str, Any]:
    """A runtime ``Timings`` as JSON-able seconds/counters (NaN -> null)."""
    out: dict[str, Any] = {}
    for key in ("arrival", "start", "first_kernel_start", "end", "preempted",
                "kernels_reexecuted", "kernels_padded"):
        if hasattr(timings, key):
            out[key] = getattr(timings, key)
    for key in ("latency", "queueing"):
        try:
            out[key] = float(getattr(timings, key))
        except (AttributeError, TypeError, ValueError):
            pass
    if deadline is not None and math.isfinite(deadline):
        out["deadline"] = deadline
        end = out.get("end")
        if isinstance(end, float) and math.isfinite(end):
            out["deadline_met"] = end <= deadline
    return _clean_timings(out)
