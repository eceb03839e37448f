"""Typed errors of the pool-pipeline layer (paper 004).

Each subclasses the runtime's error of the same family in :mod:`av_infer.errors`, so a
caller that handles ``InvalidParameterError`` or ``DeviceFaultError`` handles these too,
while the ``code`` says exactly which pipeline rule refused.
"""

from __future__ import annotations

from av_infer.errors import (
    DeviceFaultError,
    InvalidInputError,
    InvalidParameterError,
    ModelLoadError,
)


class UnknownDeviceTypeError(InvalidParameterError):
    """A cluster spec names a device type av_infer has no profile source for."""

    code = "unknown_device_type"


class InfeasibleSloError(InvalidParameterError):
    """No partitioning, pool and batch size serves a model within its SLO (minus margin)
    on the given cluster; the message names the model and its best achievable latency."""

    code = "infeasible_slo"


class UncuttableModelError(ModelLoadError):
    """A model whose plan cannot be split into blocks (one kernel, no tensor graph, or a
    cut that no sub-model can be extracted at)."""

    code = "uncuttable_model"


class StageFailedError(DeviceFaultError):
    """A pipeline stage (a pool member: a Runtime, in this or another process) died or
    stopped answering while it held the request."""

    code = "stage_failed"


class MalformedFeatureMapError(InvalidInputError):
    """A feature-map message between stages does not match the partition's inputs."""

    code = "malformed_feature_map"
