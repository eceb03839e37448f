"""Pool-based pipelines across heterogeneous devices (paper 004, PPipe).

A model is cut into blocks (:mod:`.partition`), profiled per block x device type x batch
(:mod:`.block_profiles`, stored as :class:`av_infer.profiles.BlockProfile`), planned by a
MILP on HiGHS (:mod:`.planner`), served by reservation-based adaptive batching
(:mod:`.reservation`, :mod:`.batcher`) on pools of av_infer Runtimes (:mod:`.executor`,
in one process; ``nodes/pipeline_stage_node.py`` across processes), and studied at
cluster scale by :mod:`.simulator`. ``av-infer pipeline plan|sim`` is :mod:`.cli`.
Importing this package needs neither ROS nor a GPU nor HiGHS (loaded when planning).
"""

from av_infer.pipeline.errors import (  # noqa: E402
    MalformedFeatureMapError,
    StageFailedError,
)
from av_infer.pipeline.lanes import StageSpec, widen  # noqa: E402

#: what a stage process (``nodes/pipeline_stage_node.py``) needs of the package
__all__ = ["MalformedFeatureMapError", "StageFailedError", "StageSpec", "widen"]
