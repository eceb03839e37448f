"""QoS-aware scheduling after seed paper 001: utility, model variants, batch-size deciders.

Why a package: paper 001 turns a statistic (the time-utility of a response) into the thing
the scheduler maximises. The pieces are small and separate:

* :mod:`.utility`: the time-utility function V and the per-client accumulators;
* :mod:`.variants`: variant groups (alternative models of one task with accuracy factors
  κ) and their per-group statistics (share served by each variant, mean utility);
* :mod:`.latency`: the expected device time D_{B,M} of each plan (profile, then observed);
* :mod:`.deciders`: per dispatch, the batch size and variant (``fixed``, ``eq2``,
  ``rafiqi`` with utility-driven variants, ``qos_rl``);
* :mod:`.policy`: the learned policy network (numpy) and its file format;
* :mod:`.train`, :mod:`.evaluate`, :mod:`.cli`: ``av-infer qos train|eval``.

The scheduler asks the deciders through ``sched.model_services`` only; nothing here
imports ROS or a GPU library.
"""

from av_infer.qos.utility import (
    UtilityAccumulator,
    UtilityTracker,
    check_deadlines,
    quality,
    utility,
)
from av_infer.qos.variants import GroupStats, Variant, VariantGroup

__all__ = [
    "GroupStats",
    "UtilityAccumulator",
    "UtilityTracker",
    "Variant",
    "VariantGroup",
    "check_deadlines",
    "quality",
    "utility",
]
