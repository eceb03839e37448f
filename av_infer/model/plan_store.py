"""PlanStore: compiled plans on disk, so a restart loads a model without compiling it.

Why: compiling is the slow part of loading a model (the cpu device profiles ONNX Runtime to
choose its segment cuts; the kernel compiler lowers and plans memory), and a ROS 2 stack
restarts often. The store keeps what ``Device.compile`` returned; the live objects (ORT
sessions, device memory, CUDA modules) are rebuilt from it by ``Device.load_plan`` as
before, so a hit skips exactly the compiler and nothing else.

**Key** (``plan_key``): a SHA-256 over the four things that decide a plan:

* the model's bytes (the serialized ONNX; a path is read once and those same bytes are
  compiled, so the key and the plan cannot come from two versions of the file);
* the input shapes that bind its dynamic dims, as given;
* the compiler: ``COMPILER_VERSION`` (bump it when lowering changes meaning without a source
  change), av_infer's version, the plan file format, a fingerprint of the compiler's
  source files (``av_infer/model``, the zoo excluded) and the onnx, onnxruntime and numpy
  versions, so an edited or upgraded compiler never serves an old plan;
* the device (``device_plan_key``): its class and name, and for the cpu device what its
  compile depends on: the engine, the segment target (none for ``whole`` models), and the
  CPU model the cuts were profiled on.

Models whose tensors live in external data files are compiled but never stored (their
bytes alone do not identify them).

**Files**: ``<root>/<key[:2]>/<key>.plan``, laid out as ``MAGIC | sha256(payload) |
payload`` like the CUDA compile cache (``kernels.cuda_compile.CompileCache``); the payload
is an uncompressed ``.npz`` (read with ``allow_pickle=False``: loading a file never runs
code) holding the plan's JSON (``Plan.to_json``), its weights and its segment programs.
Writes go to a temporary file in the same directory, are fsynced and moved into place with
``os.replace``: readers see no file or a whole one, also across processes.

**Guarantees**: a hit returns a plan equal to what the compiler would return for the key
(the tests check outputs and CUDA sources bit for bit). A file that is truncated, fails its
checksum, does not decode, or carries another key is a miss: it is deleted and the model
recompiled; the store never raises on a bad file. Failing to write (read-only or full disk)
is logged and costs only the next start's compile. The directory is bounded: after each
write the least recently used plans (by mtime; a hit touches its file) are deleted until the
total is at most ``max_bytes``; a plan larger than that is not stored.

Location: ``root`` if given, else ``$AV_INFER_PLAN_CACHE``, else
``$XDG_CACHE_HOME/av_infer/plans`` (``~/.cache/av_infer/plans``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import logging
import mmap
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal

import numpy as np

from av_infer.errors import InvalidParameterError, ModelLoadError, ModelNotFoundError
from av_infer.model.plan import PLAN_FORMAT_VERSION, Buffer, Geometry, Kernel, Plan, Tensor

if TYPE_CHECKING:
    from av_infer.model.segments import SegmentProgram

__all__ = ["COMPILER_VERSION", "DEFAULT_MAX_BYTES", "Outcome", "PlanStore",
           "default_plan_dir", "device_plan_key", "plan_key"]

log = logging.getLogger(__name__)

#: Bump when the compiler's output changes meaning without any change to the files the
#: fingerprint covers (e.g. a behaviour change of a dependency it does not version).
COMPILER_VERSION = 1
#: Layout of a ``.plan`` file (MAGIC, checksum, npz members); bump when it changes.
FILE_FORMAT = 1
MAGIC = b"AVIPLAN1"
#: Default bound on the directory's size.
DEFAULT_MAX_BYTES = 2 << 30
#: Temporary files older than this (seconds) are leftovers of a killed writer.
_STALE_TMP_S = 3600.0

#: How ``PlanStore.compile`` got its plan: read from disk, compiled (and stored when it
#: could be), or compiled without the store (the model's bytes do not identify it).
Outcome = Literal["hit", "miss", "bypass"]


def default_plan_dir() -> Path:
    """``$AV_INFER_PLAN_CACHE``, else ``$XDG_CACHE_HOME/av_infer/plans`` (default
    ``~/.cache``)."""
    env = os.environ.get("AV_INFER_PLAN_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "av_infer" / "plans"


# -- the key ----------------------------------------------------------------------------------
@functools.cache
def compiler_fingerprint() -> str:
    """What identifies the compiler: versions and a hash of its source files."""
    import onnx

    import av_infer

    try:
        import onnxruntime

        ort_version = onnxruntime.__version__
    except ImportError:  # the kernel compiler does not need it
        ort_version = "none"
    h = hashlib.sha256(
        f"c{COMPILER_VERSION}|av_infer {av_infer.__version__}|plan {PLAN_FORMAT_VERSION}|"
        f"file {FILE_FORMAT}|onnx {onnx.__version__}|ort {ort_version}|"
        f"numpy {np.__version__}".encode())
    here = Path(__file__).parent
    for f in sorted(here.glob("*.py")):
        if f.name.startswith("zoo") or f.name in ("exported.py", "plan_store.py"):
            continue  # model builders and this store do not change what compiles
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


@functools.cache
def device_plan_key(device: Any, whole: bool) -> dict[str, Any]:
    """What of ``device`` decides the plan its ``compile`` returns (JSON-able): its class
    and name, so a plan is used only by the device kind that compiled it, and what the
    device itself declares (``Device.compile_key``: the cpu device's ORT engine cuts models
    by time profiled on this CPU, so its engine, segment target and CPU model)."""
    cls = type(device)
    key: dict[str, Any] = {"device": str(device.name),
                           "class": f"{cls.__module__}.{cls.__qualname__}"}
    compile_key = getattr(device, "compile_key", None)
    if compile_key is not None:
        key.update(compile_key(whole))
    return key


def _shapes_key(input_shapes: Any) -> Any:
    """``input_shapes`` as canonical JSON-able data (InvalidParameterError if it is not a
    mapping of name -> dims, a sequence of dims, or None)."""
    if input_shapes is None:
        return None
    try:
        if isinstance(input_shapes, Mapping):
            return {str(k): [int(d) for d in v] for k, v in sorted(input_shapes.items())}
        if not isinstance(input_shapes, (str, bytes)):  # one input's dims, any iterable
            return [int(d) for d in input_shapes]
    except (TypeError, ValueError):
        pass
    raise InvalidParameterError(
        f"input_shapes must be a dict of name -> dims, a list of dims or None, "
        f"got {input_shapes!r}")


def plan_key(model_bytes: bytes, input_shapes: Any, device: Any, whole: bool) -> str:
    """The store key (hex SHA-256) of compiling these model bytes for ``device``."""
    h = hashlib.sha256()
    h.update(hashlib.sha256(model_bytes).digest())
    meta = {"shapes": _shapes_key(input_shapes), "compiler": compiler_fingerprint(),
            "device": device_plan_key(device, bool(whole))}
    h.update(json.dumps(meta, sort_keys=True).encode())
    return h.hexdigest()


def _model_bytes(source: Any) -> tuple[Any, bytes | None]:
    """(what to compile, the bytes that identify it or None when nothing does).

    A path is read here and its bytes are what gets compiled; a model with tensors in
    external files is compiled from its path and not stored."""
    import onnx

    if isinstance(source, onnx.ModelProto):
        data = source.SerializeToString()
        return source, None if _external(data) else data
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        return data, None if _external(data) else data
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise ModelNotFoundError(f"model file not found: {path}") from None
        except IsADirectoryError:
            raise ModelLoadError(f"model path is a directory, not an ONNX file: {path}") \
                from None
        except OSError as e:
            raise ModelLoadError(f"cannot read model file {path}: {e}") from None
        return (source, None) if _external(data) else (data, data)
    return source, None  # the compiler says what is wrong with it


def _external(data: bytes) -> bool:
    """The model keeps tensors in external files. ``location`` is the key every external
    data entry has: bytes without it certainly have none (the fast path)."""
    if b"location" not in data:
        return False
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    try:
        m = onnx.load_from_string(data)
    except Exception:  # noqa: BLE001 - the compiler reports it
        return False
    return any(uses_external_data(t) for t in _get_all_tensors(m))


# -- the file format ----------------------------------------------------------------------------
def _encode(key: str, plan: Plan) -> bytes:
    """The file bytes of ``plan`` (TypeError/ValueError when it is not serialisable)."""
    header = {
        "format": FILE_FORMAT,
        "key": key,
        "plan": json.loads(plan.to_json()),
        "weights": sorted(int(i) for i in plan.weights),
        "segments": [{"inputs": list(p.inputs), "outputs": list(p.outputs),
                      "est_ms": p.est_ms, "weight_bytes": p.weight_bytes}
                     for p in plan.segments],
    }
    arrays: dict[str, np.ndarray] = {
        "header": np.frombuffer(json.dumps(header).encode(), np.uint8)}
    for i, w in plan.weights.items():
        a = np.asarray(w)
        if a.dtype.hasobject:
            raise TypeError(f"weight {i} has dtype object")
        arrays[f"w{int(i)}"] = a
    for i, p in enumerate(plan.segments):
        arrays[f"s{i}"] = np.frombuffer(p.onnx, np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    payload = buf.getvalue()
    return MAGIC + hashlib.sha256(payload).digest() + payload


def _decode(f: BinaryIO, key: str) -> Plan:
    """The plan in the open file ``f``; ValueError (or what a malformed member raises)
    when the file is damaged or belongs to another key. The checksum is computed over a
    read-only mapping and the members are read from the same open file (no copy of the
    whole file in memory, and no other file can be swapped in between)."""
    n = len(MAGIC) + 32
    head = f.read(n)
    if len(head) < n or not head.startswith(MAGIC):
        raise ValueError("bad magic or truncated header")
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        whole = memoryview(mm)
        payload = whole[n:]
        try:
            ok = hashlib.sha256(payload).digest() == head[len(MAGIC):]
        finally:
            payload.release()
            whole.release()
    if not ok:
        raise ValueError("checksum mismatch")
    from av_infer.model.segments import SegmentProgram

    f.seek(n)  # zipfile finds the archive after the header (it allows prefixed data)
    with np.load(f, allow_pickle=False) as z:
        header = json.loads(z["header"].tobytes())
        if header.get("format") != FILE_FORMAT or header.get("key") != key:
            raise ValueError("written for another key or format")
        weights = {int(i): z[f"w{int(i)}"] for i in header["weights"]}
        segments = [SegmentProgram(z[f"s{i}"].tobytes(), tuple(s["inputs"]),
                                   tuple(s["outputs"]), float(s["est_ms"]),
                                   int(s["weight_bytes"]))
                    for i, s in enumerate(header["segments"])]
    plan = _plan_from_doc(header["plan"], weights, segments)
    _check_plan(plan)
    return plan


def _plan_from_doc(doc: dict[str, Any], weights: dict[int, np.ndarray],
                   segments: list[SegmentProgram]) -> Plan:
    """Rebuild a Plan from ``Plan.to_json``'s document (the fields JSON made lists of are
    made tuples again; kernel ``args`` stay as JSON has them, as the compiler's docs
    promise they are)."""
    if doc.get("format") != PLAN_FORMAT_VERSION:
        raise ValueError(f"plan format {doc.get('format')!r}")
    kernels = []
    for k in doc["kernels"]:
        g = k["geometry"]
        geom = Geometry(**{**g, "grid": tuple(g["grid"]), "block": tuple(g["block"])})
        kernels.append(Kernel(**{**k, "inputs": tuple(k["inputs"]),
                                 "outputs": tuple(k["outputs"]), "geometry": geom}))
    tensors = {n: Tensor(**{**t, "shape": tuple(t["shape"])})
               for n, t in doc["tensors"].items()}
    buffers = {int(i): Buffer(**b) for i, b in doc["buffers"].items()}
    return Plan(doc["name"], kernels, tensors, buffers, list(doc["inputs"]),
                list(doc["outputs"]), weights, int(doc["arena_bytes"]),
                int(doc["reuse_guard"]), dict(doc["stats"]), segments)


def _check_plan(plan: Plan) -> None:
    """References inside the plan resolve and weights have their buffers' sizes (a file
    that decodes but does not describe a runnable plan is treated as damaged)."""
    for k in plan.kernels:
        for t in (*k.inputs, *k.outputs):
            if t not in plan.tensors:
                raise ValueError(f"kernel {k.index} names unknown tensor {t!r}")
    for t in plan.tensors.values():
        if t.buffer not in plan.buffers:
            raise ValueError(f"tensor {t.name!r} in unknown buffer {t.buffer}")
    for n in (*plan.inputs, *plan.outputs):
        if n not in plan.tensors:
            raise ValueError(f"graph tensor {n!r} missing")
    for i, w in plan.weights.items():
        b = plan.buffers.get(i)
        if b is None or b.role != "weight" or int(w.nbytes) != b.nbytes:
            raise ValueError(f"weight {i} does not match its buffer")
    if plan.segments and len(plan.segments) != len(plan.kernels):
        raise ValueError("segment programs do not match the kernels")


def _renamed(plan: Plan, name: str) -> Plan:
    """``plan`` under the model name it is loaded as (a plan is stored once per key,
    whatever the name; devices key profiles by ``plan.name``)."""
    if plan.name == name:
        return plan
    old = plan.name + "/"
    plan.kernels = [dataclasses.replace(k, name=name + "/" + k.name[len(old):])
                    if k.name.startswith(old) else k for k in plan.kernels]
    plan.name = name
    return plan


# -- the store ----------------------------------------------------------------------------------
@dataclass
class _Counters:
    hits: int = 0
    misses: int = 0
    bypasses: int = 0
    writes: int = 0
    write_errors: int = 0
    corrupt: int = 0
    evictions: int = 0


class PlanStore:
    """A directory of compiled plans; see the module docstring. Thread-safe, and safe to
    share between processes (atomic files; a reader racing an eviction just misses)."""

    def __init__(self, root: str | os.PathLike | None = None,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise InvalidParameterError(f"plan cache max_bytes must be an int >= 0, "
                                        f"got {max_bytes!r}")
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise InvalidParameterError(f"plan cache root must be a path, got {root!r}")
        self.root = Path(root) if root is not None else default_plan_dir()
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._n = _Counters()

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.plan"

    # -- reading and writing -------------------------------------------------------------
    def get(self, key: str, name: str) -> Plan | None:
        """The stored plan for ``key`` named ``name``, or None (absent or damaged: a
        damaged file is deleted)."""
        p = self.path(key)
        try:
            f = open(p, "rb")  # noqa: SIM115 - closed below, after decoding
        except OSError:
            return None
        try:
            with f:
                plan = _decode(f, key)
        except Exception as e:  # noqa: BLE001 - any damage is a miss, never a crash
            log.warning("plan cache: %s is damaged (%s); recompiling", p, e)
            self._count("corrupt")
            with contextlib.suppress(OSError):
                p.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(p)  # most recently used
        return _renamed(plan, name)

    def put(self, key: str, plan: Plan) -> bool:
        """Store ``plan`` under ``key`` atomically; False (logged) when it could not be."""
        try:
            data = _encode(key, plan)
        except (TypeError, ValueError) as e:
            log.info("plan cache: plan %r is not storable (%s)", plan.name, e)
            self._count("write_errors")
            return False
        if len(data) > self.max_bytes:
            log.info("plan cache: plan %r (%d bytes) exceeds the bound %d", plan.name,
                     len(data), self.max_bytes)
            return False
        p = self.path(key)
        tmp = None
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-", suffix=".plan")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)
        except OSError as e:
            log.warning("plan cache: cannot write %s (%s); the next start recompiles", p, e)
            self._count("write_errors")
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            return False
        self._count("writes")
        self.trim(keep=p)
        return True

    def compile(self, device: Any, source: Any, input_shapes: Any = None,
                name: str | None = None, whole: bool = False) -> tuple[Plan, Outcome]:
        """``device.compile(source, input_shapes, name, whole)`` through the store: the
        stored plan when there is one, else the compiled one (stored for next time).
        Raises what the compiler raises (ModelLoadError and subclasses)."""
        if name is None and isinstance(source, (str, os.PathLike)):
            name = os.path.splitext(os.path.basename(os.fspath(source)))[0]
        src, data = _model_bytes(source)
        if data is None:
            self._count("bypasses")
            return device.compile(src, input_shapes, name=name, whole=whole), "bypass"
        key = plan_key(data, input_shapes, device, whole)
        plan = self.get(key, name or "model")
        if plan is not None:
            self._count("hits")
            return plan, "hit"
        self._count("misses")
        plan = device.compile(src, input_shapes, name=name, whole=whole)
        self.put(key, plan)
        return plan, "miss"

    # -- bounding -------------------------------------------------------------------------
    def _files(self) -> list[tuple[float, int, Path]]:
        """(mtime, bytes, path) of every file in the store; stale temporaries removed."""
        out = []
        now = time.time()
        try:
            subdirs = [d for d in os.scandir(self.root) if d.is_dir(follow_symlinks=False)]
        except OSError:
            return out
        for d in subdirs:
            try:
                entries = list(os.scandir(d.path))
            except OSError:
                continue
            for e in entries:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if e.name.startswith(".tmp-"):
                    if now - st.st_mtime > _STALE_TMP_S:
                        with contextlib.suppress(OSError):
                            os.unlink(e.path)
                    continue
                if e.name.endswith(".plan") and e.is_file(follow_symlinks=False):
                    out.append((st.st_mtime, st.st_size, Path(e.path)))
        return out

    def trim(self, keep: Path | None = None) -> int:
        """Delete least recently used plans until the store holds at most ``max_bytes``
        (``keep``, the plan just written, goes last); returns how many were deleted."""
        files = sorted(self._files(), key=lambda f: (f[2] == keep, f[0]))
        total = sum(f[1] for f in files)
        gone = 0
        for _, size, p in files:
            if total <= self.max_bytes:
                break
            with contextlib.suppress(OSError):
                p.unlink()
                gone += 1
            total -= size
        if gone:
            self._count("evictions", gone)
        return gone

    def clear(self) -> int:
        """Delete every stored plan; returns how many."""
        files = self._files()
        for _, _, p in files:
            with contextlib.suppress(OSError):
                p.unlink()
        return len(files)

    # -- diagnostics ----------------------------------------------------------------------
    def _count(self, what: str, n: int = 1) -> None:
        with self._lock:
            setattr(self._n, what, getattr(self._n, what) + n)

    def stats(self) -> dict[str, Any]:
        """Counters since construction and the directory's current size (JSON-able)."""
        files = self._files()
        with self._lock:
            counts = dataclasses.asdict(self._n)
        return {"root": str(self.root), "max_bytes": self.max_bytes, "files": len(files),
                "bytes": sum(f[1] for f in files), **counts}


def open_plan_store(spec: PlanStore | str | os.PathLike | bool | None) -> PlanStore | None:
    """The store a ``plan_cache=`` setting names: None/False off, True the default
    directory, a path that directory, or a ready PlanStore."""
    if spec is None or spec is False:
        return None
    if spec is True:
        return PlanStore()
    if isinstance(spec, PlanStore):
        return spec
    if isinstance(spec, (str, os.PathLike)) and os.fspath(spec):
        return PlanStore(spec)
    raise InvalidParameterError(
        f"plan_cache must be None, a bool, a directory or a PlanStore, got {spec!r}")
