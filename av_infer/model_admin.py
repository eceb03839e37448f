"""ModelAdmin: load, unload and list models at run time, confined to configured directories.

Why: the ROS runtime node offers ``LoadModel``/``UnloadModel``/``ListModels`` services, and
anyone on the ROS graph can call a service. This module is the ROS-free logic behind them
(the node converts requests and typed errors; nothing here imports ROS): which files may be
loaded, how much is read, how many models may be loaded, and what a failure says.

Confinement (``resolve``): a path is relative to one of ``model_dirs`` (tried in order) or
absolute under one of them. Any ``..`` component is refused outright; the path is resolved
(symlinks followed) and must still lie under a model dir, so a symlink pointing out is
refused; only regular files are read (opened with ``O_NOFOLLOW | O_NONBLOCK``, so a FIFO
or device node cannot block or stream, and checked again through the opened descriptor).
The size is checked on the open file before reading, and reading stops past the bound.

Guarantees:

* Every failure is one typed error from :mod:`av_infer.errors` (its ``code`` is what the
  service answers): ``InvalidParameterError`` (bad name or input shapes),
  ``ModelNameInUseError``, ``TooManyModelsError``, ``ModelPathError``,
  ``ModelNotFoundError``, ``ModelFileTooLargeError``, ``ModelLoadError`` (not ONNX),
  ``UnsupportedModelError`` (with the operator names), ``UnboundDimensionError``,
  ``ModelTooLargeError`` (does not fit the model cache), ``UnknownModelError`` (unload).
* A failed load leaves the runtime unchanged (``Runtime.load_model`` registers a model
  only once it compiled and fit); the bytes compiled are the bytes that were checked.
* Loads run one at a time (a compile takes seconds of CPU; concurrent service calls queue
  instead of multiplying that), so the name and count checks hold when the load lands.
* The runtime owns which models are loaded; the admin only remembers where the ones it
  loaded came from, and forgets that when the model it describes is gone.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from av_infer.errors import (
    InvalidParameterError,
    ModelFileTooLargeError,
    ModelNameInUseError,
    ModelNotFoundError,
    ModelPathError,
    TooManyModelsError,
    UnknownModelError,
)

__all__ = ["MODEL_NAME_PATTERN", "LoadedModel", "ModelAdmin"]

#: Model names: a letter, then letters, digits, ``_``, ``-`` or ``.``; at most 64 (they end
#: up in topic names, logs and file names).
MODEL_NAME_PATTERN = r"[A-Za-z][A-Za-z0-9_.\-]{0,63}"
_NAME = re.compile(MODEL_NAME_PATTERN + r"\Z")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class LoadedModel:
    """One loaded model as ``list``/``load`` report it (plain data, JSON-able with
    ``dataclasses.asdict``). ``path``/``sha256``/``file_bytes`` are None for models loaded
    other than through this admin."""

    name: str
    inputs: dict[str, tuple[tuple[int, ...], str]]
    outputs: dict[str, tuple[tuple[int, ...], str]]
    pinned: bool
    kernels: int
    weight_bytes: int
    resident_bytes: int
    path: str | None = None
    sha256: str | None = None
    file_bytes: int | None = None
    #: how the load got its plan: "hit" (on-disk plan cache), "miss", "bypass", None
    plan_cache: str | None = None
    #: the precision it runs at (``Plan.precision``: fp32, tf32 or fp16)
    precision: str = "fp32"


@dataclass(frozen=True)
class _Origin:
    plan: Any  # the loaded Plan object: the record holds while this very plan is loaded
    path: str
    sha256: str
    file_bytes: int
    plan_cache: str | None


class ModelAdmin:
    """Run-time model administration of one :class:`~av_infer.runtime.Runtime`; see the
    module docstring. ``model_dirs``: existing directories models may be loaded from;
    ``max_file_bytes``: largest model file read; ``max_models``: most models loaded in the
    runtime at once (whoever loaded them). Thread-safe."""

    def __init__(self, runtime: Any, model_dirs: Sequence[str | os.PathLike],
                 max_file_bytes: int = 512 << 20, max_models: int = 16) -> None:
        if isinstance(model_dirs, (str, os.PathLike)) or not model_dirs:
            raise InvalidParameterError(
                f"model_dirs must be a non-empty list of directories, got {model_dirs!r}")
        dirs: list[Path] = []
        for d in model_dirs:
            try:
                p = Path(d).resolve(strict=True)
            except (OSError, RuntimeError, TypeError) as e:
                raise InvalidParameterError(f"model dir {d!r} is not usable: {e}") from None
            if not p.is_dir():
                raise InvalidParameterError(f"model dir {d!r} is not a directory")
            dirs.append(p)
        for what, v in (("max_file_bytes", max_file_bytes), ("max_models", max_models)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidParameterError(f"{what} must be an int >= 1, got {v!r}")
        self.runtime = runtime
        self.model_dirs: tuple[Path, ...] = tuple(dirs)
        self.max_file_bytes = max_file_bytes
        self.max_models = max_models
        self._load_lock = threading.Lock()  # one load at a time
        self._lock = threading.Lock()  # _origins
        self._origins: dict[str, _Origin] = {}

    # -- the services --------------------------------------------------------------------
    def load(self, name: str, path: str, input_shapes: Mapping[str, Sequence[int]] | None
             = None, pin: bool = False, whole: bool | None = None,
             precision: str | None = None) -> LoadedModel:
        """Load the model file ``path`` (see ``resolve``) under ``name``.

        ``input_shapes`` binds dynamic dims (name -> dims); ``pin``: an RT model, resident
        for good and never preempted; ``whole``, ``precision``: see
        ``Runtime.load_model`` (a precision the device does not run is refused before the
        file is read). Raises one of the typed errors of the module docstring; the runtime
        is unchanged then."""
        check_name(name)
        shapes = _check_shapes(input_shapes)
        if not isinstance(pin, bool) or not (whole is None or isinstance(whole, bool)):
            raise InvalidParameterError("pin must be a bool and whole a bool or None")
        if precision is not None and (why := self.runtime.precision_unavailable(precision)):
            raise InvalidParameterError(f"model {name!r}: {why}")
        with self._load_lock:
            self._check_room(name)
            real = self.resolve(path)
            data = self._read(real)
            digest = hashlib.sha256(data).hexdigest()
            info = self.runtime.load_model(name, data, shapes, pin=pin, whole=whole,
                                           precision=precision)
            origin = _Origin(info.plan, str(real), digest, len(data), info.plan_cache)
            with self._lock:
                self._origins[name] = origin
        return _record(info, origin)

    def unload(self, name: str) -> None:
        """Unload ``name`` (UnknownModelError if it is not loaded). Requests already
        accepted still complete (``Runtime.unload_model``)."""
        if not isinstance(name, str):
            raise UnknownModelError(f"unknown model {name!r}")
        self.runtime.unload_model(name)
        with self._lock:
            self._origins.pop(name, None)

    def list(self) -> list[LoadedModel]:
        """Every model loaded in the runtime, in load order."""
        out = []
        for name in self.runtime.models():
            try:
                info = self.runtime.model_info(name)
            except UnknownModelError:  # unloaded meanwhile
                continue
            with self._lock:
                origin = self._origins.get(name)
                if origin is not None and origin.plan is not info.plan:
                    origin = None  # another model of that name, loaded elsewhere
                    del self._origins[name]
            out.append(_record(info, origin))
        return out

    # -- confinement ---------------------------------------------------------------------
    def resolve(self, path: str) -> Path:
        """The real path of ``path`` under a model dir (see the module docstring).
        ModelPathError when it is not allowed, ModelNotFoundError when nothing is there."""
        if not isinstance(path, str) or not path or "\0" in path:
            raise ModelPathError(f"model path must be a non-empty string, got {path!r}")
        p = Path(path)
        if ".." in p.parts:
            raise ModelPathError(f"model path {path!r}: '..' is not allowed")
        if p.is_absolute():
            if not any(p.is_relative_to(d) for d in self.model_dirs):
                raise ModelPathError(f"model path {path!r} is outside the model dirs "
                                     f"{[str(d) for d in self.model_dirs]}")
            candidates = [p]
        else:
            candidates = [d / p for d in self.model_dirs]
        for c in candidates:
            try:
                real = c.resolve(strict=True)
            except FileNotFoundError:
                continue
            except (OSError, RuntimeError) as e:  # a symlink loop, a permission error
                raise ModelPathError(f"model path {path!r} cannot be resolved: {e}") from None
            if not self._inside(real):
                raise ModelPathError(f"model path {path!r} leads outside the model dirs")
            return real
        raise ModelNotFoundError(f"no model file {path!r} in the model dirs "
                                 f"{[str(d) for d in self.model_dirs]}")

    def _inside(self, real: Path) -> bool:
        return any(real.is_relative_to(d) for d in self.model_dirs)

    def _read(self, real: Path) -> bytes:
        """The bytes of the regular file ``real``, at most ``max_file_bytes``."""
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) \
            | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(real, flags)
        except FileNotFoundError:
            raise ModelNotFoundError(f"model file {str(real)!r} disappeared") from None
        except OSError as e:  # ELOOP: replaced by a symlink since resolve
            raise ModelPathError(f"cannot open model file {str(real)!r}: {e}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ModelPathError(f"{str(real)!r} is not a regular file")
            proc = f"/proc/self/fd/{fd}"
            if os.path.exists(proc) and not self._inside(Path(os.readlink(proc))):
                raise ModelPathError(f"{str(real)!r} leads outside the model dirs")
            if st.st_size > self.max_file_bytes:
                raise ModelFileTooLargeError(
                    f"model file {str(real)!r} has {st.st_size} bytes, at most "
                    f"{self.max_file_bytes} are read")
            chunks, n = [], 0
            while True:
                b = os.read(fd, min(_CHUNK, self.max_file_bytes + 1 - n))
                if not b:
                    break
                chunks.append(b)
                n += len(b)
                if n > self.max_file_bytes:
                    raise ModelFileTooLargeError(
                        f"model file {str(real)!r} grew past {self.max_file_bytes} bytes")
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _check_room(self, name: str) -> None:
        loaded = self.runtime.models()
        if name in loaded:
            raise ModelNameInUseError(f"model {name!r} is already loaded; unload it first")
        if len(loaded) >= self.max_models:
            raise TooManyModelsError(
                f"{len(loaded)} models loaded, at most {self.max_models}; unload one first")


def check_name(name: Any) -> str:
    """``name`` if it is a valid model name (``MODEL_NAME_PATTERN``), else
    InvalidParameterError."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidParameterError(
            f"model name {name!r} is not valid: 1-64 characters, a letter first, then "
            f"letters, digits, '_', '-' or '.'")
    return name


def _check_shapes(shapes: Any) -> dict[str, list[int]] | None:
    """Input shapes as name -> dims of ints >= 1 (InvalidParameterError otherwise)."""
    if shapes is None:
        return None
    ok = isinstance(shapes, Mapping) and all(
        isinstance(k, str) and k and isinstance(v, Sequence) and not isinstance(v, str)
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in v)
        for k, v in shapes.items())
    if not ok:
        raise InvalidParameterError(
            f"input_shapes must map input names to lists of ints >= 1, got {shapes!r}")
    return {k: list(v) for k, v in shapes.items()}


def _record(info: Any, origin: _Origin | None) -> LoadedModel:
    return LoadedModel(
        info.name, dict(info.input_spec), dict(info.output_spec), bool(info.pinned),
        int(info.kernels), int(info.weight_bytes), int(info.resident_bytes),
        origin.path if origin else None, origin.sha256 if origin else None,
        origin.file_bytes if origin else None, origin.plan_cache if origin else None,
        str(getattr(info.plan, "precision", "fp32")))
