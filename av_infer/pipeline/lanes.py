"""Pool members as the executor sees them: the :class:`Lane` contract, the in-process
:class:`LocalLane`, what a lane loads (:class:`StageSpec`) and :func:`widen` (float16
feature maps back to the stage's float32, where they arrive).

A lane in another process (``nodes/pipeline_stage_node.py``: ``RemoteLane``) fills the same
contract over ROS 2.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import onnx

from av_infer.pipeline.block_profiles import PartitionedModel, partition_model


@dataclass(frozen=True)
class StageSpec:
    """What a lane loads: blocks ``[first, end)`` of a zoo model cut into ``n_blocks``.
    Partitioning is deterministic, so a lane in another process builds the same
    sub-model from these five fields (no ONNX crosses the wire)."""

    model: str
    variant: str
    n_blocks: int
    first: int
    end: int

    def build(self) -> onnx.ModelProto:
        return _partitioned(self.model, self.variant, self.n_blocks).stage_model(
            self.first, self.end)


@functools.lru_cache(maxsize=32)
def _partitioned(model: str, variant: str, n_blocks: int) -> PartitionedModel:
    return partition_model(model, variant, n_blocks)


class Lane(Protocol):
    """One pool member as the executor sees it. ``run`` never raises: its future fails
    with a typed error (``stage_failed`` once the lane is dead)."""

    name: str

    @property
    def alive(self) -> bool: ...

    def load(self, stage: str, spec: StageSpec) -> None: ...

    def unload(self, stage: str) -> None: ...

    def run(self, stage: str, inputs: Mapping[str, np.ndarray], priority: str,
            deadline_in_s: float) -> Future[dict[str, np.ndarray]]: ...


class LocalLane:
    """A Runtime in this process as a pool member."""

    def __init__(self, name: str, runtime: Any) -> None:
        self.name = name
        self.runtime = runtime

    @property
    def alive(self) -> bool:
        return not getattr(self.runtime, "_closed", False)

    def load(self, stage: str, spec: StageSpec) -> None:
        self.runtime.load_model(stage, spec.build(), whole=True)

    def unload(self, stage: str) -> None:
        self.runtime.unload_model(stage)

    def run(self, stage: str, inputs: Mapping[str, np.ndarray], priority: str,
            deadline_in_s: float) -> Future[dict[str, np.ndarray]]:
        out: Future[dict[str, np.ndarray]] = Future()
        deadline = self.runtime.now() + deadline_in_s if math.isfinite(deadline_in_s) else None
        inputs = widen(inputs, self.runtime.input_spec(stage))
        f = self.runtime.submit(stage, inputs, priority=priority, deadline=deadline,
                                client="pipeline")

        def done(fut: Future) -> None:
            exc = fut.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(fut.result().outputs)

        f.add_done_callback(done)
        return out


def widen(inputs: Mapping[str, np.ndarray], spec: Mapping[str, tuple[Any, Any]]
          ) -> dict[str, np.ndarray]:
    """Feature maps sent as float16 (``fp16_boundaries``) back to the float32 the stage
    expects: done where they arrive, as the one copy into the stage's input."""
    out = {}
    for k, v in inputs.items():
        want = spec.get(k, (None, None))[1]
        out[k] = v.astype(np.float32) if v.dtype == np.float16 and want is not None \
            and np.dtype(want) == np.float32 else v
    return out
