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


class ProfileFormatError(InvalidParameterError):
    """A block-profile or cluster file that does not follow the documented format
    (docs/pipeline.md, "Measured profiles"): wrong field, wrong type, a block count that
    disagrees between device types, a negative or non-finite number."""

    code = "bad_profile"


class MissingCellError(ProfileFormatError):
    """A latency row with a hole (``null``, too few blocks) or a (model, device type) pair
    the cluster needs and no file gives. A batch size that was not measured is *left out*
    of its fraction's batch list, never written as a placeholder."""

    code = "bad_profile"


class NonMonotoneProfileError(ProfileFormatError):
    """A block that runs faster at a larger batch than at a smaller one (beyond the
    loader's 10 % tolerance, or beyond the profiler's measured noise: :mod:`.profile_noise`),
    or batch lists that are not increasing."""

    code = "bad_profile"


class ProfileUnitsError(ProfileFormatError):
    """A unit the format does not know (latency: ``us``, ``ms``, ``s``; bytes: ``B``,
    ``KiB``, ``MiB``; bandwidth: ``gbps``)."""

    code = "bad_profile"
