"""Block profiles per model x device type x batch size x virtual fraction (PPipe §5.2-5.3).

* Simulated GPUs: *derived*. Each kernel at batch ``b`` is the kernel with ``b`` times the
  blocks, flops and activation bytes (weights read once); its time comes from the same
  roofline + occupancy estimate the simulator uses (:func:`av_infer.profiles.derive_profile`).
  A ``1/v`` virtual device has ``1/v`` of the SMs, FLOP/s and memory bandwidth: the
  interference of ``v`` busy co-tenants (PPipe profiles them running in parallel).
* ``cpu``: *measured*. Each block's ONNX sub-model is timed with ONNX Runtime on one
  thread (a lane) at batch 1; batch ``b`` costs ``b`` times that (a CPU lane is compute
  bound; batching buys it nothing) and lanes are not split (``vfracs = [1]``).

Profiles are stored as :class:`av_infer.profiles.BlockProfile` files under
``<zoo cache>/profiles/`` keyed by the zoo builder hash, so they are computed once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from av_infer.model import zoo
from av_infer.model.plan import Geometry, Kernel, Plan
from av_infer.pipeline.cluster import DeviceType
from av_infer.pipeline.partition import DEFAULT_BLOCKS, Block, extract_stage, prepartition
from av_infer.profiles import (
    BlockProfile,
    GpuSpec,
    derive_profile,
    estimate_duration_us,
    gpu_spec,
    occupancy,
)

#: the reference device of pre-partitioning (PPipe: the GPU type barely matters)
REFERENCE_GPU = "h100"
SIM_BATCHES = (1, 2, 4, 8)
VFRACS = (1, 2, 3, 4)
#: bump when the derivation or measurement changes: stored profiles then read as misses
BLOCK_PROFILE_VERSION = 2


@dataclass
class PartitionedModel:
    """A model cut into blocks, with its ONNX source (to cut stages from) and plan."""

    name: str
    variant: str
    plan: Plan
    blocks: list[Block]
    onnx_path: Path

    def stage_model(self, first: int, end: int) -> onnx.ModelProto:
        return extract_stage(onnx.load(str(self.onnx_path)), self.blocks, first, end)


def partition_model(name: str, variant: str = "scaled", n_blocks: int = DEFAULT_BLOCKS
                    ) -> PartitionedModel:
    """Compile a zoo model and pre-partition it on the reference GPU's derived profile."""
    from av_infer.model.compiler import compile_model

    path = zoo.path(name, variant=variant)
    plan = compile_model(path, name=name)
    ref = derive_profile(plan, REFERENCE_GPU)
    blocks = prepartition(plan, [k.duration_us for k in ref.kernels], n_blocks)
    return PartitionedModel(name, variant, plan, blocks, path)


def _scaled_kernel(plan: Plan, k: Kernel, b: int) -> Kernel:
    if b == 1:
        return k
    wbytes = sum(plan.tensors[t].nbytes for t in k.inputs
                 if t in plan.tensors and plan.buffers[plan.tensors[t].buffer].role == "weight")
    act = max(0, k.bytes_moved - wbytes)
    g = k.geometry
    geom = Geometry((g.grid[0] * b, g.grid[1], g.grid[2]), g.block, g.smem, g.regs)
    return dataclasses.replace(k, geometry=geom, flops=k.flops * b,
                               bytes_moved=wbytes + act * b)


def _virtual(spec: GpuSpec, v: int) -> GpuSpec:
    return dataclasses.replace(spec, name=f"{spec.name}/{v}", sms=max(1, spec.sms // v),
                               peak_tflops=spec.peak_tflops / v,
                               bandwidth_gbs=spec.bandwidth_gbs / v)


def derive_block_profile(pm: PartitionedModel, gpu: str, batches: Sequence[int] = SIM_BATCHES,
                         vfracs: Sequence[int] = VFRACS) -> BlockProfile:
    """Block latencies of ``pm`` on a simulated GPU (see the module docstring)."""
    spec = gpu_spec(gpu)
    table: dict[str, list[list[float]]] = {}
    for v in vfracs:
        vs = _virtual(spec, v)
        rows = []
        prev = [0.0] * len(pm.plan.kernels)
        for b in sorted(batches):
            per_kernel = []
            for k, floor in zip(pm.plan.kernels, prev):
                kb = _scaled_kernel(pm.plan, k, b)
                est = estimate_duration_us(kb, vs, occupancy(kb.geometry, vs))
                # a batch never runs faster than a smaller one (the estimate's one-block
                # bandwidth term would say so for weight-bound kernels)
                per_kernel.append(max(est, floor))
            prev = per_kernel
            rows.append([float(sum(per_kernel[bl.start:bl.end])) for bl in pm.blocks])
        table[str(v)] = rows
    return _profile(pm, spec.name, "derived", sorted(batches), vfracs, table)


def measure_block_profile_cpu(pm: PartitionedModel, batches: Sequence[int] = (1,),
                              repeats: int = 7) -> BlockProfile:
    """Time each block's sub-model with ONNX Runtime on one thread (median of ``repeats``)."""
    import onnxruntime as ort

    from av_infer.model.segments import ort_options

    model = onnx.shape_inference.infer_shapes(onnx.load(str(pm.onnx_path)))
    values: dict[str, np.ndarray] = dict(zoo.sample_inputs(pm.name, pm.variant))
    one = []
    for i in range(len(pm.blocks)):
        sub = extract_stage(model, pm.blocks, i, i + 1)
        sess = ort.InferenceSession(sub.SerializeToString(), ort_options(1),
                                    providers=["CPUExecutionProvider"])
        feeds = {x.name: values[x.name] for x in sess.get_inputs()}
        times = []
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            outs = sess.run(None, feeds)
            times.append(time.perf_counter() - t0)
        values.update({o.name: v for o, v in zip(sess.get_outputs(), outs)})
        one.append(statistics.median(times) * 1e6)
    table = {"1": [[us * b for us in one] for b in batches]}
    return _profile(pm, "cpu", "measured", batches, (1,), table)


def _profile(pm: PartitionedModel, device: str, source: str, batches: Sequence[int],
             vfracs: Sequence[int], table: dict[str, list[list[float]]]) -> BlockProfile:
    return BlockProfile(
        model=pm.name, device=device, variant=pm.variant, source=source,
        blocks=[[b.start, b.end] for b in pm.blocks], out_bytes=[b.out_bytes for b in pm.blocks],
        batches=list(batches), vfracs=list(vfracs), latency_us=table)


def store_dir() -> Path:
    return zoo.cache_dir() / "profiles"


def block_profiles(models: Sequence[str], types: Sequence[DeviceType],
                   n_blocks: int = DEFAULT_BLOCKS, refresh: bool = False
                   ) -> dict[str, dict[str, BlockProfile]]:
    """``{model: {device type: BlockProfile}}``, from the store or computed and stored.

    Every type of one call must share a zoo variant (clusters never mix simulated GPUs and
    real lanes), so every profile of a model has the same blocks."""
    variants = {t.variant for t in types}
    if len(variants) != 1:
        raise ValueError(f"device types of one cluster must share a variant, got {variants}")
    variant = variants.pop()
    out: dict[str, dict[str, BlockProfile]] = {}
    for m in models:
        key = hashlib.sha256(f"{BLOCK_PROFILE_VERSION}|{zoo.builder_hash()}|{n_blocks}|"
                             f"{SIM_BATCHES}|{VFRACS}|{REFERENCE_GPU}".encode()
                             ).hexdigest()[:12]
        pm: PartitionedModel | None = None
        out[m] = {}
        for t in types:
            path = store_dir() / f"{m}-{variant}-{t.name}-n{n_blocks}-{key}.blocks.json"
            if path.is_file() and not refresh:
                try:
                    out[m][t.name] = BlockProfile.load(path)
                    continue
                except (ValueError, KeyError, TypeError):
                    pass  # a corrupt or old file reads as a miss
            if pm is None:
                pm = partition_model(m, variant, n_blocks)
            prof = (derive_block_profile(pm, t.name) if t.simulated
                    else measure_block_profile_cpu(pm))
            prof.save(path)
            out[m][t.name] = prof
    return out
