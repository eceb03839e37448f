"""Kernel profiles: how long each kernel of a plan takes and how many of its blocks fit an SM.

One format serves three producers and every consumer: the simulator reads it to model
time, the padding selection (DKP rules 1 and 2) reads durations and occupancies, and it is
written by

* :func:`derive_profile`: an estimate from a plan's launch geometry and flops/bytes
  (roofline + occupancy calculator), for plans nobody has measured yet;
* :func:`load_reef_trace`: measured MI50 numbers from the public REEF traces;
* the GPU kernel profiler (:mod:`av_infer.profiler`: CUDA events and the occupancy API),
  whose files carry ``source="measured"`` and the GPU they were measured on
  (:class:`ModelProfile`'s ``gpu``: name, SMs, clocks) and which
  :func:`load_profile_dir` reads back for the simulator (``--profiles DIR``,
  docs/sim_fidelity.md).

Units: durations in microseconds (as REEF's traces), sizes in bytes.

The optional fields (``ModelProfile.source``/``gpu``/``variant``, ``KernelProfile.kind``/
``vendor``) were added without a format bump: files without them load as before, and
their defaults say "unknown".
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from av_infer.model.plan import Buffer, Geometry, Kernel, Plan

#: Bump when the serialized form changes.
PROFILE_FORMAT_VERSION = 1


@dataclass(frozen=True)
class GpuSpec:
    """What the occupancy calculator, the roofline and the simulator need of a GPU.

    ``launch_us`` is the latency from the runtime transmitting a launch to the launch
    being visible in the device's queue; ``evict_us`` the cost of a launch that reaches
    the SMs and evicts itself at its flag check (REEF §4.1: fetch + dispatch + return).
    """

    name: str
    sms: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int
    smem_per_sm: int
    peak_tflops: float
    bandwidth_gbs: float
    launch_us: float = 5.0
    evict_us: float = 5.0
    floor_us: float = 2.0  # shortest kernel: launch-to-retire of an empty kernel
    #: relative slowdown of an RT kernel run through the padding dispatcher (branch on
    #: the block index + jump to the kernel body): REEF Fig. 18a, 0.8% mean, <= 1.21%
    pad_overhead: float = 0.008


#: GPUs the project reasons about. MI50 is where REEF's traces were measured (60 CUs of 40
#: wavefronts = 2560 threads and 64 KB LDS; REEF §4.1 a ~30 µs reset of a c=4 device
#: queue, hence ~6 µs per self-evicting kernel).
#:
#: ``h200`` is the H200 SXM (the driver's "NVIDIA H200"): the H100's GH100 chip (same 132
#: SMs, SM limits and 1980 MHz boost clock, so the same occupancy, FP32 peak and launch
#: costs as ``h100``) with 141 GB of HBM3e at 4.8 TB/s instead of the H100 SXM's 80 GB of
#: HBM3 at 3.35 TB/s (NVIDIA's H200 Tensor Core GPU datasheet, 2024). Seen on this
#: project's lent H200s (2026-11-27, docs/gpu_results/2026-11-27-h200/): 132 SMs, SM clock
#: 1980 MHz, memory clock 3201 MHz; PyTorch reports 60 MB of L2 on them (50 MB on the
#: H100s). The L2 is not a field: the contention model's ``beta`` stands for what the L2
#: does not hold (devices/sim_contention.py). A profile measured on an H200 is refused
#: for ``h100`` and the other way round (:func:`check_profiles_gpu`).
GPUS: dict[str, GpuSpec] = {
    "mi50": GpuSpec(
        name="mi50", sms=60, max_threads_per_sm=2560, max_blocks_per_sm=32,
        regs_per_sm=65536, smem_per_sm=65536, peak_tflops=13.4, bandwidth_gbs=1024.0,
        launch_us=5.0, evict_us=6.0,
    ),
    "h100": GpuSpec(
        name="h100", sms=132, max_threads_per_sm=2048, max_blocks_per_sm=32,
        regs_per_sm=65536, smem_per_sm=233472, peak_tflops=67.0, bandwidth_gbs=3350.0,
        launch_us=4.0, evict_us=3.0,
    ),
    "h200": GpuSpec(
        name="h200", sms=132, max_threads_per_sm=2048, max_blocks_per_sm=32,
        regs_per_sm=65536, smem_per_sm=233472, peak_tflops=67.0, bandwidth_gbs=4800.0,
        launch_us=4.0, evict_us=3.0,
    ),
    "orin": GpuSpec(
        name="orin", sms=16, max_threads_per_sm=1536, max_blocks_per_sm=16,
        regs_per_sm=65536, smem_per_sm=167936, peak_tflops=5.3, bandwidth_gbs=204.8,
        launch_us=8.0, evict_us=5.0,
    ),
}


def gpu_key(name: str) -> str | None:
    """The :data:`GPUS` key of a GPU named as its driver names it ("NVIDIA H100 80GB
    HBM3" -> ``h100``, "NVIDIA H200" -> ``h200``, "AMD Instinct MI50" -> ``mi50``), None
    if none matches.

    A key matches a word of the name that starts with it and does not go on with a digit
    ("H100-SXM5" -> ``h100``), so another product whose name merely contains a key is not
    taken for it ("NVIDIA GH200 480GB", a Grace Hopper superchip, is no ``h200``)."""
    words = re.split(r"[^a-z0-9]+", str(name).lower())
    for key in GPUS:
        pat = re.compile(re.escape(key) + r"(?![0-9])")
        if any(pat.match(w) for w in words):
            return key
    return None


def gpu_spec(gpu: str | GpuSpec) -> GpuSpec:
    """Accept a name from :data:`GPUS` or a spec."""
    if isinstance(gpu, GpuSpec):
        return gpu
    try:
        return GPUS[gpu.lower()]
    except KeyError:
        raise ValueError(f"unknown GPU {gpu!r}; known: {sorted(GPUS)}") from None


@dataclass
class KernelProfile:
    """One kernel: duration alone on the whole GPU and its occupancy.

    ``latency_by_bps[i]`` (when known) is the kernel's duration when its blocks are packed
    ``i + 1`` per SM (REEF's profiler output); its length is the occupancy level count.
    """

    index: int
    name: str
    duration_us: float
    blocks: int
    threads: int
    regs: int = 32
    smem: int = 0
    blocks_per_sm: int = 1
    latency_by_bps: list[float] | None = None
    #: the plan kernel's op kind (``Kernel.kind``, e.g. ``conv``, ``gemm``); "" unknown
    kind: str = ""
    #: the library a vendor op runs in (``cudnn``, ``cublaslt``); "" for our own kernels.
    #: A vendor op is timed like any launch (its ``duration_us``); its ``blocks`` and
    #: ``blocks_per_sm`` are what the device reports for it (0/1 where it cannot say)
    vendor: str = ""


#: ``ModelProfile.source`` values: timed on the device, estimated from geometry
#: (:func:`derive_profile`), a REEF trace, or derived then scaled per model to a measured
#: standalone latency (``bench.compare_sim``'s ``--calibrate standalone``).
PROFILE_SOURCES = ("measured", "derived", "reef-trace", "derived-scaled")


@dataclass
class ModelProfile:
    """Per-kernel profiles of one plan on one GPU (``sms`` as measured).

    ``source``: one of :data:`PROFILE_SOURCES` ("" when a file predates the field).
    ``gpu``: what was measured on, for ``measured`` files: ``name`` (the driver's, e.g.
    "NVIDIA H100 80GB HBM3"), ``sms``, ``clock_sm_mhz``, ``clock_mem_mhz`` and whatever
    else the device's telemetry said; :func:`gpu_key` maps the name to :data:`GPUS`.
    ``variant``: the zoo variant the plan was compiled from ("" unknown).
    """

    model: str
    device: str
    sms: int
    kernels: list[KernelProfile] = field(default_factory=list)
    source: str = ""
    gpu: dict[str, Any] | None = None
    variant: str = ""

    @property
    def total_us(self) -> float:
        """Sum of kernel durations: the model's latency alone, ignoring launch gaps."""
        return sum(k.duration_us for k in self.kernels)

    def to_json(self) -> str:
        doc: dict[str, Any] = {"format": PROFILE_FORMAT_VERSION, **dataclasses.asdict(self)}
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> ModelProfile:
        doc = json.loads(text)
        fmt = doc.pop("format", PROFILE_FORMAT_VERSION)
        if fmt != PROFILE_FORMAT_VERSION:
            raise ValueError(f"profile format {fmt} is not {PROFILE_FORMAT_VERSION}")
        kernels = [KernelProfile(**k) for k in doc.pop("kernels")]
        return cls(kernels=kernels, **doc)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Atomic write (temp file + rename) so a concurrent reader never sees half a file."""
        atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ModelProfile:
        return cls.from_json(Path(path).read_text())


#: File name of a model's profile in a profile directory (:func:`save_profile_dir`).
PROFILE_SUFFIX = ".profile.json"


def save_profile_dir(profiles: dict[str, ModelProfile] | list[ModelProfile],
                     out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write each profile as ``OUT_DIR/<model>.profile.json`` (atomic); the paths."""
    items = profiles.values() if isinstance(profiles, dict) else profiles
    out = []
    for prof in items:
        path = Path(out_dir) / f"{prof.model}{PROFILE_SUFFIX}"
        prof.save(path)
        out.append(path)
    return out


def save_profile_bundle(profiles: list[ModelProfile], path: str | os.PathLike[str]) -> Path:
    """Several profiles in one file, ``{"format": 1, "kind": "profile-bundle", "profiles":
    {model: profile}}`` (what a GPU session returns: one file instead of one per model)."""
    doc = {"format": PROFILE_FORMAT_VERSION, "kind": "profile-bundle",
           "profiles": {p.model: json.loads(p.to_json()) for p in profiles}}
    atomic_write_text(path, json.dumps(doc, indent=1))
    return Path(path)


def check_profiles_gpu(profiles: dict[str, ModelProfile], gpu: str | GpuSpec,
                       where: str = "") -> None:
    """ValueError if a profile was measured on another GPU than ``gpu`` (by
    :func:`gpu_key` of its ``gpu.name`` or ``device``), or on a real GPU the simulator has
    no spec for (its ``gpu`` telemetry says ``emulated: false`` and no key matches its
    name: taking it for another GPU would be pretending). Names no key matches that are
    not a real GPU's, e.g. the CPU emulator's, are accepted."""
    want = gpu_spec(gpu).name
    for m, prof in profiles.items():
        name = (prof.gpu or {}).get("name") or prof.device
        key = gpu_key(str(name))
        src = f" in {where}" if where else ""
        if key is not None and key != want:
            raise ValueError(f"profile of {m!r}{src} was measured on {name} ({key}), the "
                             f"simulated GPU is {want}: pass --gpu {key}")
        if key is None and (prof.gpu or {}).get("emulated") is False:
            raise ValueError(f"profile of {m!r}{src} was measured on {name}, a GPU the "
                             f"simulator has no spec for (known: {sorted(GPUS)}); add it "
                             "to profiles.GPUS")


def load_profile_dir(path: str | os.PathLike[str]) -> dict[str, ModelProfile]:
    """Every ``*.profile.json`` under ``path`` (not recursive), keyed by ``model``; or,
    when ``path`` is a file, the profiles of a bundle (:func:`save_profile_bundle`).

    What the simulator's ``--profiles DIR`` reads. ValueError (naming the file) for a file
    that is not a kernel profile of this format, or two files of the same model;
    FileNotFoundError if ``path`` does not exist. Block profiles (``kind: blocks``)
    in the same directory are skipped: they are the pipeline planner's."""
    d = Path(path)
    if d.is_file():
        try:
            doc = json.loads(d.read_text())
        except ValueError as e:
            raise ValueError(f"{d}: not JSON ({e})") from None
        if not isinstance(doc, dict) or doc.get("kind") != "profile-bundle" or \
                doc.get("format") != PROFILE_FORMAT_VERSION:
            raise ValueError(f"{d}: not a profile bundle of format {PROFILE_FORMAT_VERSION}")
        try:
            return {m: ModelProfile.from_json(json.dumps(v))
                    for m, v in (doc.get("profiles") or {}).items()}
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"{d}: a profile in the bundle is not of format "
                             f"{PROFILE_FORMAT_VERSION} ({e})") from None
    if not d.is_dir():
        raise FileNotFoundError(f"profile directory {d} does not exist")
    out: dict[str, ModelProfile] = {}
    where: dict[str, Path] = {}
    for f in sorted(d.glob(f"*{PROFILE_SUFFIX}")):
        try:
            doc = json.loads(f.read_text())
        except ValueError as e:
            raise ValueError(f"{f}: not JSON ({e})") from None
        if isinstance(doc, dict) and doc.get("kind") == "blocks":
            continue
        try:
            prof = ModelProfile.from_json(json.dumps(doc))
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"{f}: not a kernel profile of format "
                             f"{PROFILE_FORMAT_VERSION} ({e})") from None
        if prof.model in out:
            raise ValueError(f"two profiles of {prof.model!r}: {where[prof.model]} and {f}")
        out[prof.model] = prof
        where[prof.model] = f
    return out


# -- the packing model (simulator and padding selection share it) ------------------------


def packing(kp: KernelProfile, sms: int, gpu: GpuSpec | None = None
            ) -> tuple[int, int, float, tuple[float, ...], float, float]:
    """How one kernel's blocks share SMs: ``(blocks, bps, block_us, curve, press, g_alone)``.

    ``bps``: occupancy, clamped by ``gpu``'s block and thread limits. ``block_us``: time of a
    block at the density the kernel has alone (``duration / waves``). With a packing curve
    (REEF's ``latency``: one round of ``i + 1`` co-resident blocks per CU) ``curve`` is it
    relative to one block alone and a block's *pressure* ``press`` is its mean slope: each
    extra block on the SM, of this kernel or another, lengthens a block by about that
    fraction of its time alone (the conv with 104 us alone, 442 us at 7 per CU: ~0.54).
    Without a curve (``()``) a block demands ``1 / bps`` of its SM (processor sharing).
    A block at density ``d`` with foreign pressure ``F`` takes
    ``block_us * max(1, curve_at(curve, press, d) + F) / g_alone``.
    """
    blocks = max(1, kp.blocks)
    bps = max(1, kp.blocks_per_sm)
    if gpu is not None:
        bps = max(1, min(bps, gpu.max_blocks_per_sm,
                         gpu.max_threads_per_sm // max(1, kp.threads)))
    waves = math.ceil(blocks / (sms * bps))
    lat = kp.latency_by_bps
    curve: tuple[float, ...]
    if lat and lat[0] > 0:
        curve = tuple(max(1.0, x / lat[0]) for x in lat)
        press = (curve[-1] - 1.0) / (len(curve) - 1) if len(curve) > 1 else 0.0
        press = min(1.0, max(0.0, press))
    else:
        curve = ()
        press = 1.0 / bps
    alone = min(bps, math.ceil(blocks / sms))
    return (blocks, bps, kp.duration_us / waves, curve, press,
            max(1.0, curve_at(curve, press, alone)))


def curve_at(curve: tuple[float, ...], press: float, d: float) -> float:
    """Packing-curve value at ``d`` blocks per SM (interpolated; linear past its end).

    Without a curve (``()``): processor sharing, ``d`` blocks demand ``d * press`` of the
    SM, which only slows them once it exceeds 1 (callers take ``max(1, ...)``).
    """
    n = len(curve)
    if n == 0:
        return d * press
    if d <= 1.0:
        return 1.0
    if d >= n:
        return curve[-1] + (d - n) * press
    i = int(d)
    return curve[i - 1] + (d - i) * (curve[i] - curve[i - 1])


def round_times_us(kp: KernelProfile, sms: int) -> tuple[float, float]:
    """Time of one round of this kernel's blocks at 1 and at ``blocks_per_sm`` per SM, in
    the packing model (what padding selection plans with: REEF's ``latency[j]``)."""
    _, bps, block_us, curve, press, g_alone = packing(kp, sms)
    one = block_us * max(1.0, curve_at(curve, press, 1)) / g_alone
    full = block_us * max(1.0, curve_at(curve, press, bps)) / g_alone
    return one, full


# -- estimates from geometry ------------------------------------------------------------


def occupancy(geometry: Geometry, gpu: GpuSpec) -> int:
    """Max resident blocks per SM from threads, registers and shared memory (>= 1)."""
    threads = max(1, geometry.threads)
    limits = [gpu.max_blocks_per_sm, gpu.max_threads_per_sm // threads]
    if geometry.regs > 0:
        limits.append(gpu.regs_per_sm // (geometry.regs * threads))
    if geometry.smem > 0:
        limits.append(gpu.smem_per_sm // geometry.smem)
    return max(1, min(limits))


def estimate_duration_us(kernel: Kernel, gpu: GpuSpec, blocks_per_sm: int) -> float:
    """Roofline time corrected by how much of the GPU the launch can fill, plus a floor.

    One partial wave uses ``sms_used / sms`` of the SMs, each saturated once a quarter of its
    thread slots are resident; several waves pay for the idle tail of the last one.
    """
    g = kernel.geometry
    blocks = max(1, g.blocks)
    roof_s = max(
        kernel.flops / (gpu.peak_tflops * 1e12), kernel.bytes_moved / (gpu.bandwidth_gbs * 1e9)
    )
    full_wave = gpu.sms * blocks_per_sm
    waves = math.ceil(blocks / full_wave)
    if waves == 1:
        per_sm = math.ceil(blocks / gpu.sms)
        sms_used = min(gpu.sms, blocks)
        saturation = min(1.0, per_sm * max(1, g.threads) / (gpu.max_threads_per_sm / 4))
        util = sms_used / gpu.sms * saturation
    else:
        util = blocks / (waves * full_wave)
    return gpu.floor_us + roof_s * 1e6 / util


def derive_profile(plan: Plan, gpu: str | GpuSpec) -> ModelProfile:
    """Estimate a profile from geometry (occupancy calculator) and flops/bytes (roofline)."""
    spec = gpu_spec(gpu)
    kernels = []
    for k in plan.kernels:
        bps = occupancy(k.geometry, spec)
        kernels.append(
            KernelProfile(
                index=k.index, name=k.name, duration_us=estimate_duration_us(k, spec, bps),
                blocks=k.geometry.blocks, threads=k.geometry.threads, regs=k.geometry.regs,
                smem=k.geometry.smem, blocks_per_sm=bps, kind=k.kind,
            )
        )
    return ModelProfile(model=plan.name, device=spec.name, sms=spec.sms, kernels=kernels,
                        source="derived")


# -- REEF traces --------------------------------------------------------------------------

_DTYPE_BYTES = {
    "float32": 4, "float16": 2, "int64": 8, "int32": 4, "byte": 1, "uint1": 1, "uint8": 1,
}


def default_trace_dir() -> Path:
    """``$AV_INFER_REEF_TRACES``, else ``shared/reef-kernel-traces`` beside or in the repo."""
    env = os.environ.get("AV_INFER_REEF_TRACES")
    if env:
        return Path(env)
    root = Path(__file__).resolve().parent.parent
    for shared in (root.parent / "shared", root / "shared"):
        cand = shared / "reef-kernel-traces"
        if cand.is_dir():
            return cand
    return root.parent / "shared" / "reef-kernel-traces"


def reef_models(trace_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Models with both a kernel list and a profile in the trace directory."""
    d = Path(trace_dir) if trace_dir is not None else default_trace_dir()
    return sorted(
        p.name[: -len(".profile.json")] for p in d.glob("*.profile.json")
        if (d / p.name.replace(".profile.json", ".json")).is_file()
    )


def _storage_role(name: str) -> str:
    if name == "data" or name.startswith("input"):
        return "input"
    if name == "output":
        return "output"
    if name in ("null", "temp_arg"):
        return "activation"
    return "weight"


def load_reef_trace(
    model: str, trace_dir: str | os.PathLike[str] | None = None, gpu: str | GpuSpec = "mi50"
) -> tuple[Plan, ModelProfile]:
    """A REEF model as a simulator workload: a ``trace`` Plan plus its measured profile.

    The plan has the trace's launch geometry, buffers from its storage table (weights are
    sized but not materialised) and no graph inputs/outputs: it cannot run on a real
    device, only in the simulator. Durations are REEF's ``total_latency`` per kernel.

    ``latency_by_bps`` is REEF's ``latency`` list: the time of one round of ``i + 1``
    blocks packed on one CU. It *rises* with ``i`` (co-resident blocks slow each other):
    a packing/interference curve, not an occupancy limit. So ``blocks_per_sm`` is the
    hardware limit of the block's shape (MI50: 2560 threads = 40 wavefronts per CU, 64 KB
    LDS), and the simulator uses the curve for the slowdown of blocks sharing a CU. The
    trace's ``total_latency`` is about ``latency[ceil(blocks / CUs) - 1]``: alone, a
    kernel's blocks are spread breadth-first, one per CU first.
    """
    d = Path(trace_dir) if trace_dir is not None else default_trace_dir()
    try:
        trace = json.loads((d / f"{model}.json").read_text())
        prof = json.loads((d / f"{model}.profile.json").read_text())
    except FileNotFoundError as e:
        raise FileNotFoundError(f"no REEF trace for {model!r} in {d}: {e.filename}") from None
    spec = gpu_spec(gpu)
    smem_by_name: dict[str, int] = trace.get("shared_memory", {})
    lat: dict[str, dict[str, Any]] = prof["kernel_latency"]

    buffers: dict[int, Buffer] = {}
    offset = 0
    for i, s in enumerate(trace["storage"]):
        nbytes = int(s["size"]) * _DTYPE_BYTES.get(s.get("stype", "float32"), 4)
        role = _storage_role(s["name"])
        if role == "weight":
            buffers[i] = Buffer(id=i, nbytes=nbytes, role="weight")
        else:
            buffers[i] = Buffer(id=i, nbytes=nbytes, role=role, offset=offset)  # type: ignore[arg-type]
            offset += nbytes

    kernels: list[Kernel] = []
    kprofs: list[KernelProfile] = []
    for idx, k in enumerate(trace["kernels"]):
        gx, gy, gz, bx, by, bz = (int(v) for v in k["launch_params"])
        smem = int(smem_by_name.get(k["name"], 0))
        # regs=0: the traces do not record registers, so occupancy comes from threads and
        # LDS only (REEF's TVM kernels are compiled for the occupancy they declare).
        geom = Geometry(grid=(gx, gy, gz), block=(bx, by, bz), smem=smem, regs=0)
        kernels.append(
            Kernel(index=idx, kind="trace", name=k["name"], inputs=(), outputs=(),
                   args={"storage": list(k.get("args", []))}, geometry=geom)
        )
        entry = lat[k["name"]]
        levels = [float(x) for x in entry.get("latency", [])] or None
        kprofs.append(
            KernelProfile(
                index=idx, name=k["name"], duration_us=float(entry["total_latency"]),
                blocks=geom.blocks, threads=geom.threads, regs=geom.regs, smem=geom.smem,
                blocks_per_sm=occupancy(geom, spec), latency_by_bps=levels,
            )
        )
    plan = Plan(
        name=model, kernels=kernels, tensors={}, buffers=buffers, inputs=[], outputs=[],
        arena_bytes=offset, reuse_guard=max(16, len(kernels)),
        stats={"source": "reef-trace", "model_latency_us": float(prof["model_latency"])},
    )
    profile = ModelProfile(model=model, device=spec.name, sms=spec.sms, kernels=kprofs,
                           source="reef-trace")
    return plan, profile


# -- block profiles (pool pipelines, paper 004) -------------------------------------------


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` through a temp file + rename: readers see the old file or
    the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class BlockProfile:
    """Latency of each pre-partitioned block of one model on one device type, per batch
    size and virtual-device fraction (PPipe §5.2-5.3; ``av_infer.pipeline.partition``).

    ``blocks``: the kernel ranges ``[start, end)`` of the plan; ``out_bytes``: bytes that
    cross each block's end at batch 1. ``latency_us[str(v)][bi][blk]``: block ``blk`` at
    batch ``batches[bi]`` on ``1/v`` of one device. ``source``: ``derived`` (roofline on a
    simulated GPU) or ``measured`` (timed on the device). Same file format family as
    :class:`ModelProfile`: a ``format`` field and atomic saves.
    """

    model: str
    device: str
    variant: str
    source: str
    blocks: list[list[int]]
    out_bytes: list[int]
    batches: list[int]
    vfracs: list[int]
    latency_us: dict[str, list[list[float]]]

    def latency(self, v: int, batch: int) -> list[float]:
        """Per-block latencies (us) at ``batch`` on ``1/v`` of a device."""
        return self.latency_us[str(v)][self.batches.index(batch)]

    def to_json(self) -> str:
        return json.dumps({"format": PROFILE_FORMAT_VERSION, "kind": "blocks",
                           **dataclasses.asdict(self)})

    @classmethod
    def from_json(cls, text: str) -> BlockProfile:
        doc = json.loads(text)
        fmt = doc.pop("format", None)
        if fmt != PROFILE_FORMAT_VERSION or doc.pop("kind", None) != "blocks":
            raise ValueError(f"not a block profile of format {PROFILE_FORMAT_VERSION}")
        return cls(**doc)

    def save(self, path: str | os.PathLike[str]) -> None:
        atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BlockProfile:
        return cls.from_json(Path(path).read_text())
