"""CUDA C kernels of every plan kernel kind, generated per plan (see ``sources``).

Importing this package never touches CUDA: it only reads and generates source text.
"""

from av_infer.kernels.cuda.sources import (
    LaunchSpec,
    PlanSource,
    build_plan_source,
    missing_kinds,
    supported_kinds,
)

__all__ = ["LaunchSpec", "PlanSource", "build_plan_source", "missing_kinds", "supported_kinds"]
