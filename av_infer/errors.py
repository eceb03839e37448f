"""Typed errors. Every request is answered exactly once: outputs, or one of these.

Each error carries a stable ``code`` (used by the ROS layer's responses and by JSON
reports) and a message that says what was wrong.
"""

from __future__ import annotations


class AvInferError(Exception):
    """Base of every error av_infer raises on purpose."""

    code = "error"


# -- model loading / compiling -----------------------------------------------------------
class ModelLoadError(AvInferError):
    """The model file is missing, corrupt or not a valid ONNX model."""

    code = "model_load"


class UnsupportedModelError(ModelLoadError):
    """The model uses operators (or attributes) av_infer cannot compile.

    ``unsupported`` maps op type -> list of node names, every one of them, so a user fixes
    the export once rather than one error at a time.
    """

    code = "unsupported_model"

    def __init__(self, unsupported: dict[str, list[str]], detail: str = ""):
        self.unsupported = {k: list(v) for k, v in sorted(unsupported.items())}
        parts = [f"{op} (nodes: {', '.join(names)})" for op, names in self.unsupported.items()]
        msg = "unsupported operators: " + "; ".join(parts)
        if detail:
            msg += f". {detail}"
        super().__init__(msg)


class UnboundDimensionError(ModelLoadError):
    """A dynamic input dimension was not bound by a user-given input shape."""

    code = "unbound_dimension"


class ModelNotFoundError(ModelLoadError):
    """No model file at the given path (or, through ``ModelAdmin``, under any model dir)."""

    code = "model_not_found"


class ModelPathError(ModelLoadError):
    """The path is not allowed: outside the configured model directories (``..``, an
    absolute path elsewhere, a symlink pointing out) or not a regular file."""

    code = "path_not_allowed"


class ModelFileTooLargeError(ModelLoadError):
    """The model file exceeds the configured size bound; it was not read."""

    code = "file_too_large"


# -- requests ----------------------------------------------------------------------------
class InvalidInputError(AvInferError):
    """Wrong input names, shape or dtype; rejected at submit, never queued."""

    code = "invalid_input"


class InvalidParameterError(AvInferError):
    """A runtime setting (policy, c, deadline, ...) was rejected; nothing changed."""

    code = "invalid_parameter"


class ModelNameInUseError(InvalidParameterError):
    """A model of that name is already loaded; unload it first."""

    code = "name_in_use"


class TooManyModelsError(InvalidParameterError):
    """Loading one more model would exceed the configured number of models."""

    code = "too_many_models"


class UnknownModelError(AvInferError):
    code = "unknown_model"


class DeadlineMissedError(AvInferError):
    """The request's deadline passed before it could run and its client drops late work."""

    code = "deadline_missed"


class RuntimeClosedError(AvInferError):
    """The runtime shut down before the request completed."""

    code = "shutdown"


class DeviceFaultError(AvInferError):
    """The device failed while running the request (e.g. a CUDA error)."""

    code = "device_fault"


class ModelTooLargeError(AvInferError):
    """The model cannot fit the cache budget even after evicting everything evictable."""

    code = "model_too_large"


class RejectedError(AvInferError):
    """The active policy does not serve this request (e.g. BE work under ``rt_only``)."""

    code = "rejected"


class NotAllowedError(RejectedError):
    """The runtime host's allow-list (``client_models``) does not let this client run
    this model: a refusal of configuration, answered like any rejection."""

    code = "not_allowed"


class DeviceUnavailableError(AvInferError):
    """The named device cannot be used here (no GPU, no driver, or not built yet)."""

    code = "device_unavailable"


def error_from_code(code: str, message: str) -> AvInferError:
    """The typed error for a stable ``code`` (one that crossed a process boundary, e.g. in
    an ``InferResponse``): the most general loaded class with that code whose constructor
    takes a message alone, else an ``AvInferError`` carrying the code. Subclasses defined
    elsewhere (``av_infer.pipeline.errors``) count once their module is imported."""
    todo, seen = [AvInferError], set()
    while todo:  # breadth first: the most general class of a code wins
        cls = todo.pop(0)
        if cls in seen:
            continue
        seen.add(cls)
        if cls.__dict__.get("code") == code:
            try:
                return cls(message)
            except Exception:  # noqa: BLE001 - needs more than a message
                pass  # (UnsupportedModelError: its operator table); a subclass may not
        todo.extend(cls.__subclasses__())
    err = AvInferError(message)
    err.code = code
    return err
