"""av_infer: a real-time GPU inference runtime for ROS 2 autonomous-driving stacks.

Importing av_infer never touches a GPU or ROS. The public names load lazily.
"""

from __future__ import annotations

import os as _os
from typing import TYPE_CHECKING, Any

if _os.environ.get("AV_INFER_INTERPRETED"):  # the compiled modules from their .py
    from av_infer._cy.compiled import use_interpreted

    use_interpreted()

from av_infer.errors import (  # noqa: F401
    AvInferError,
    DeadlineMissedError,
    DeviceFaultError,
    DeviceUnavailableError,
    InvalidInputError,
    InvalidParameterError,
    ModelLoadError,
    ModelNameInUseError,
    ModelTooLargeError,
    NotAllowedError,
    RejectedError,
    RuntimeClosedError,
    UnboundDimensionError,
    UnknownModelError,
    UnsupportedModelError,
    error_from_code,
)

__version__ = "0.1.0"

#: public name -> module (same name there) or (module, name there)
_LAZY: dict[str, str | tuple[str, str]] = {
    "Runtime": "av_infer.runtime",
    "Priority": "av_infer.sched.request",
    "Result": "av_infer.sched.request",
    "Timings": "av_infer.sched.request",
    "compile_model": "av_infer.model.compiler",
    "Plan": "av_infer.model.plan",
    "DEVICE_NAMES": "av_infer.devices",
    "device_class": "av_infer.devices",
    # Plan.precision's values (Runtime.load_model(precision=); Runtime.precisions: a device's)
    "PRECISIONS": ("av_infer.devices.cuda_vendor", "PRECISIONS"),
    "POLICIES": "av_infer.sched.policies",
    "get_policy": "av_infer.sched.policies",
    "zoo_names": ("av_infer.model.zoo", "names"),
    "zoo_path": ("av_infer.model.zoo", "path"),
    # QoS (paper 001): what a caller of Runtime(batch_mode=, qos_policy=) validates against
    "BATCH_MODES": ("av_infer.qos.deciders", "MODES"),
    "check_batch_mode": ("av_infer.qos.deciders", "check_mode"),
    "DEFAULT_QOS_POLICY": ("av_infer.qos.policy", "DEFAULT_POLICY"),
    "load_qos_policy": ("av_infer.qos.policy", "load_policy"),
}

if TYPE_CHECKING:
    from av_infer.model.compiler import compile_model  # noqa: F401
    from av_infer.model.plan import Plan  # noqa: F401
    from av_infer.runtime import Runtime  # noqa: F401
    from av_infer.sched.request import Priority, Result, Timings  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        where = _LAZY[name]
        module, attr = where if isinstance(where, tuple) else (where, name)
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'av_infer' has no attribute {name!r}")
