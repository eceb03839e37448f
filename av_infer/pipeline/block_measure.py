"""``av-infer profile --blocks``: measure block profiles of zoo models into the file format
of :mod:`.profile_files` (issue 32; PPipe §5.2-5.3 profiles each block on every device type,
batch size and virtual-GPU fraction).

Each block's ONNX sub-model (:func:`.partition.extract_stage`) runs in ONNX Runtime on its
real input (the previous blocks' outputs on the zoo's sample input). Batch ``b`` is measured,
not extrapolated: the sub-model's leading dimension is made symbolic and it runs on ``b``
stacked copies of its input. Where a block cannot run at ``b`` (a reshape that fixes the
batch at 1 inside it), batch ``b`` is *left out* of that fraction's list: not measured.

* ``cpu``: ``CPUExecutionProvider``, ``threads`` intra-op threads (1: one av_infer CPU lane).
  A lane is not split: fraction 1/1 only.
* ``cuda``: ``CUDAExecutionProvider`` on the whole GPU (1/1). Fractions 1/v > 1 need MPS
  (a running ``nvidia-cuda-mps-control`` daemon): v processes each limited to 100/v % of the
  SMs (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) time the block *at the same time*, as PPipe
  profiles co-tenants; the cell is the median over the v processes. Without MPS the
  fraction is refused, never guessed. **This path has not run on a GPU** (no GPU was lent
  to the session that wrote it); the CPU path is what the committed profiles used.

Guarantees: every cell written was timed (median of ``repeats`` runs after ``warmup``,
the minimum over re-timings) or raised to a smaller batch's cell of the same block; every
row written is monotone in the batch. A block measuring faster at a larger batch by more
than the measurement's noise (:mod:`.profile_noise`: 10 %, a 15 us floor, the cells' own
spread) is re-timed (up to 3 times) and refused (NonMonotoneProfileError) if it stays so;
a drop within the noise is raised to the running maximum over the smaller batches and
listed in the file's ``provenance.monotone_adjusted`` (fraction, block, batch, measured
and written us).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import onnx

from av_infer.errors import InvalidParameterError
from av_infer.pipeline.profile_files import MeasuredProfile
from av_infer.pipeline.profile_noise import NOISE_FLOOR_US, NOISE_MADS, Timing, settle_row

DEVICES = ("cpu", "cuda")
DEFAULT_BATCHES = (1, 2, 4, 8)


def dynamic_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs and outputs have a symbolic leading dim
    (``N``) where they had 1; inner shapes are left to ONNX Runtime."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in [*m.graph.input, *m.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        if len(dims) and dims[0].HasField("dim_value") and dims[0].dim_value == 1:
            dims[0].dim_param = "N"
    del m.graph.value_info[:]
    return m


def _providers(device: str) -> list[str]:
    return ["CUDAExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]


def _time_session(sess: Any, feeds: dict[str, np.ndarray], repeats: int, warmup: int
                  ) -> Timing:
    for _ in range(max(0, warmup)):
        sess.run(None, feeds)
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e6)
    return Timing.of(times)


def _stack(x: np.ndarray, b: int) -> np.ndarray:
    return np.ascontiguousarray(np.repeat(x, b, axis=0)) if b > 1 else x


class _BlockRunner:
    """One block's sessions: batch 1 (static, the chain's values) and batch ``b``."""

    def __init__(self, sub: onnx.ModelProto, device: str, threads: int) -> None:
        import onnxruntime as ort

        from av_infer.model.segments import ort_options

        opts = ort_options(threads)
        self.static = ort.InferenceSession(sub.SerializeToString(), opts,
                                           providers=_providers(device))
        self.dynamic = ort.InferenceSession(dynamic_batch(sub).SerializeToString(), opts,
                                            providers=_providers(device))

    def time(self, values: dict[str, np.ndarray], b: int, repeats: int, warmup: int
             ) -> Timing | None:
        sess = self.static if b == 1 else self.dynamic
        feeds = {x.name: _stack(values[x.name], b) for x in sess.get_inputs()}
        try:
            outs = sess.run(None, feeds)
        except Exception:  # noqa: BLE001 - ORT raises several kinds: the batch cannot run
            return None
        if b > 1 and any(o.ndim == 0 or o.shape[0] != b for o in outs):
            return None
        return _time_session(sess, feeds, repeats, warmup)


def _mps_ok() -> bool:
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    return shutil.which("nvidia-cuda-mps-control") is not None and os.path.isdir(pipe)


def measure_blocks(pm: Any, device: str = "cpu", batches: Sequence[int] = DEFAULT_BATCHES,
                   fractions: Sequence[int] = (1,), repeats: int = 7, warmup: int = 2,
                   threads: int = 1, type_name: str | None = None,
                   command: str | None = None) -> MeasuredProfile:
    """Measure ``pm`` (a :class:`~.block_profiles.PartitionedModel`) into a profile.

    Settings are validated before any work (InvalidParameterError)."""
    if device not in DEVICES:
        raise InvalidParameterError(f"device must be one of {DEVICES}, got {device!r}")
    bs = sorted(set(batches))
    if not bs or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in bs):
        raise InvalidParameterError(f"batches must be integers >= 1, got {batches!r}")
    fr = sorted(set(fractions))
    if not fr or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in fr):
        raise InvalidParameterError(f"fractions must be integers >= 1, got {fractions!r}")
    if device == "cpu" and fr != [1]:
        raise InvalidParameterError("a cpu lane is not split: fractions must be [1]")
    if device == "cuda" and fr != [1] and not _mps_ok():
        raise InvalidParameterError(
            "fractions > 1 on cuda need MPS (start nvidia-cuda-mps-control -d); without it "
            "only the whole GPU (fraction 1) is measured")
    if repeats < 1 or threads < 1:
        raise InvalidParameterError("repeats and threads must be >= 1")
    import onnxruntime as ort

    if device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise InvalidParameterError("ONNX Runtime here has no CUDAExecutionProvider "
                                    f"({ort.get_available_providers()})")
    from av_infer.model import zoo
    from av_infer.pipeline.partition import extract_stage

    model = onnx.shape_inference.infer_shapes(onnx.load(str(pm.onnx_path)))
    values: dict[str, np.ndarray] = dict(zoo.sample_inputs(pm.name, pm.variant))
    n = len(pm.blocks)
    cells: dict[int, dict[int, list[float | None]]] = {1: {b: [None] * n for b in bs}}
    subs = []
    block_inputs = []
    adjusted: list[dict[str, Any]] = []
    for i in range(n):
        sub = extract_stage(model, pm.blocks, i, i + 1)
        runner = _BlockRunner(sub, device, threads)
        block_inputs.append({x.name: values[x.name] for x in runner.static.get_inputs()})
        row, raised = settle_row(
            lambda b, runner=runner: runner.time(values, b, repeats, warmup), bs,
            where=f"{pm.name} block {i} on {device}")
        for b, x in row.items():
            cells[1][b][i] = x
        adjusted += [{"fraction": 1, "block": i, **r} for r in raised]
        outs = runner.static.run(None, block_inputs[-1])
        values.update({o.name: v for o, v in zip(runner.static.get_outputs(), outs)})
        subs.append(sub)
    for v in fr:
        if v == 1:
            continue
        cells[v] = _measure_mps(subs, block_inputs, v, bs, repeats, warmup, threads,
                                f"{pm.name} on {device} 1/{v}", adjusted)
    table = {v: {b: tuple(float(x) for x in row) for b, row in rows.items()
                 if all(x is not None for x in row)} for v, rows in cells.items()}
    table = {v: rows for v, rows in table.items() if rows}
    if not table:
        raise InvalidParameterError(f"{pm.name}: no (fraction, batch) could be measured")
    name = type_name or (device if device == "cpu" else _gpu_name())
    prov = {
        "command": command or " ".join(sys.argv),
        "device": device, "variant": pm.variant, "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "onnxruntime": ort.__version__, "threads": threads, "repeats": repeats,
        "warmup": warmup, "statistic": "median of repeats, min over re-timings",
        "monotone": f"a cell faster than a smaller batch's of its block within the noise "
                    f"(max of 10 %, {NOISE_FLOOR_US:g} us, {NOISE_MADS:g} MADs of each "
                    "cell's repeats or the range of its re-timings) is raised to the "
                    "running max over the smaller batches; listed in monotone_adjusted",
        "monotone_adjusted": adjusted,
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "batches_tried": bs,
        "batch_method": "the block's sub-model with a symbolic leading dim on b stacked "
                        "copies of its batch-1 input; a batch that cannot run is left out",
        "cut_bytes_from": "the compiled plan's tensors crossing each cut at batch 1",
        "blocks_kernels": [[b.start, b.end] for b in pm.blocks],
    }
    return MeasuredProfile(pm.name, name, "measured", n,
                           tuple(float(b.out_bytes) for b in pm.blocks[:-1]), table, prov)


def _gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout
        name = out.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "cuda"
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-") or "cuda"


_WORKER = r"""
import json, sys, time, statistics
import numpy as np, onnxruntime as ort
spec = json.loads(sys.stdin.read())
o = ort.SessionOptions(); o.intra_op_num_threads = spec["threads"]
res = []
for path, inp in zip(spec["models"], spec["inputs"]):
    row = {}
    feeds0 = {k: np.load(f) for k, f in inp.items()}
    sess = ort.InferenceSession(path, o, providers=["CUDAExecutionProvider"])
    for b in spec["batches"]:
        feeds = {k: np.repeat(x, b, axis=0) for k, x in feeds0.items()}
        try:
            sess.run(None, feeds)
        except Exception:
            row[str(b)] = None; continue
        for _ in range(spec["warmup"]): sess.run(None, feeds)
        ts = []
        for _ in range(spec["repeats"]):
            t0 = time.perf_counter(); sess.run(None, feeds); ts.append(time.perf_counter() - t0)
        med = statistics.median(ts)
        row[str(b)] = [med * 1e6, statistics.median(abs(t - med) for t in ts) * 1e6]
    res.append(row)
print(json.dumps(res))
"""


def _measure_mps(subs: list[onnx.ModelProto], inputs: list[dict[str, np.ndarray]], v: int,
                 bs: list[int], repeats: int, warmup: int, threads: int, where: str,
                 adjusted: list[dict[str, Any]]) -> dict[int, list[float | None]]:
    """Fraction 1/v on cuda under MPS: v processes at 100/v % of the SMs time every block
    together (UNTESTED: written without a GPU). Each cell is the median over the processes
    (its spread: their largest MAD); a row is made monotone within the noise as on 1/1,
    without re-timing (that would re-run every process), raised cells appended to
    ``adjusted``."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="av_infer_mps_") as tmp:
        models, ins = [], []
        for i, (sub, inp) in enumerate(zip(subs, inputs)):
            p = os.path.join(tmp, f"b{i}.onnx")
            onnx.save(dynamic_batch(sub), p)
            models.append(p)
            files = {}
            for k, x in inp.items():
                f = os.path.join(tmp, f"b{i}_{len(files)}.npy")
                np.save(f, x)
                files[k] = f
            ins.append(files)
        spec = json.dumps({"models": models, "inputs": ins, "batches": bs,
                           "repeats": repeats, "warmup": warmup, "threads": threads})
        env = dict(os.environ, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(max(1, 100 // v)))
        procs = [subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
                 for _ in range(v)]
        results = [json.loads(p.communicate(spec, timeout=3600)[0]) for p in procs]
    out: dict[int, list[float | None]] = {b: [None] * len(subs) for b in bs}
    for i in range(len(subs)):
        got: dict[int, Timing | None] = {}
        for b in bs:
            xs = [r[i][str(b)] for r in results]
            got[b] = None if any(x is None for x in xs) else Timing(
                float(statistics.median(x[0] for x in xs)), float(max(x[1] for x in xs)))
        row, raised = settle_row(got.__getitem__, bs, where=f"{where} block {i}",
                                 retimings=0)
        for b, x in row.items():
            out[b][i] = x
        adjusted += [{"fraction": v, "block": i, **r} for r in raised]
    return out
