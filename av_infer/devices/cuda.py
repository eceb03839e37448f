"""The CUDA device: NVRTC-compiled plan kernels launched by a GIL-free Cython dispatcher.

Why this shape (docs/design.md "Devices", REEF-N §4.4): the scheduler only pushes
``(task, first..last)`` ranges into per-stream vHQs; the dispatcher thread
(``av_infer._cy.cuda_dispatch``) moves at most ``c`` launches per stream to CUDA with
``cuLaunchKernel`` on argument structs packed once per task, and reports completions via
CUDA events. Every kernel checks its stream's flag word first (lazy eviction), and the
flag is written with ``cuStreamWriteValue32`` on a dedicated high-priority stream.

Memory: each plan's weights live in one device allocation laid out by the plan's weight
offsets; each task gets one activation arena of ``plan.arena_bytes`` (buffer offsets from
the memory planner). Inputs and outputs go through pinned host staging buffers on a copy
stream, straight into / out of the arena regions the kernels read / write.

Importing this module never touches CUDA; :func:`is_available` says whether it can run.
Completions: ``executed`` is None (a kernel that returned at its flag check looks like one
that ran), except for launches through gated graphs (``graphs="be"``, docs/cuda_graphs.md),
whose gate record says True / False; ``t_start`` is the host time of the launch call,
``t_end`` the host time the dispatcher saw the kernel's event complete. RT as one graph
(``rt_graphs=N``, docs/cuda_graphs.md): a whole RT task launched as one captured graph
completes as one record of all its kernels (``Completion.count``; the graph's times).

DKP (``enqueue_padded``): the padded dispatcher kernel of ``kernels/cuda/padding.py``,
compiled per set of resident plans (RT plan + the BE plans of the parts) on a background
thread the first time that set is asked for (or up front: :meth:`CudaDevice.prepare_padding`);
until it is ready the kernel runs unpadded and ``enqueue_padded`` says so (returns False).
Which proxy variant of the dispatcher kernel a padded launch uses is ``pad_select``
(``kernels.cuda.padding.PAD_SELECTS``: ``parts``, the first design, or ``regs``, REEF's
register rule with the RT kernel's own registers counted; docs/cuda.md).

Threads and ownership: the scheduler thread calls the Device methods; the dispatcher thread
(nogil) owns the streams; the drain thread turns the dispatcher's completions into
:class:`Completion` calls. The task records (``_tasks``), the released tasks whose launches
are still in flight (``_zombies``) and the BE parts of queued padded launches
(``_padded``) are shared by the scheduler and the drain thread and have one owner, the
lock ``_books``: every change, and every iteration, happens under it (issue 16: the drain
popping ``_padded`` while ``reset`` iterated it; a task released between the dispatcher's
"still in flight" and the drain's last completion of it was never freed).

Fault hook points (``devices.faults``, tests only): ``"kernel"`` where the drain thread
records a launch's completion (the launch counts as failed: its task's ``read_outputs``
raises DeviceFaultError, as for a failing ``cuLaunchKernel``); ``"lane"`` just before it,
outside any handler: the drain thread dies, the completion it held is booked as failed and
a new drain thread takes over (the launches themselves run on the GPU, so the host thread
that can die is this one); ``"load"``/``"oom"`` at the start of ``load_plan``
(ModelLoadError / ModelTooLargeError, nothing allocated yet).

``CudaDevice(emulate=True)`` runs all of the above on the CPU: the emulated driver and
kernel modules of ``av_infer.devices.cuda_emu`` (docs/cuda_emu.md) replace libcuda and
NVRTC, and "device" memory is host memory. Only memory and compilation differ
(:class:`~av_infer.devices.cuda_memory.CupyMemory` vs ``HostMemory``); the dispatcher,
packing, vHQs and completions are the same code.

Vendor ops (``vendor="auto"|"force"``, docs/cuda_vendor.md): conv / gemm kernels that
cuDNN / cuBLASLt compute exactly as ours do become vendor ops at ``load_plan`` (one op per
kernel, algorithm chosen once, pinned); each is still kernel ``k`` of the plan in the vHQ,
launched by the dispatcher through ``cuda_vendor.pyx`` with the same packed struct, and
issued only while the stream's flag is down (a closed kernel cannot check it). ``auto``
keeps, per op, the faster of the two (CUDA events at load); ``force`` takes the vendor's
wherever it can (how the emulator tests cover it). Which kernels stay ours, and why:
:meth:`CudaDevice.vendor_report`. Precision per plan (``plan.precision``: fp32 | tf32 |
fp16): our conv/gemm kernels use TF32 tiles under tf32 (FP32 under fp16: one compiled
variant less on a GPU's clock), vendor ops the library's TF32 / FP16 tensor-core maths on
FP32 storage.

Split by responsibility: this module launches (models, tasks, streams, padded launches,
completions); ``cuda_memory`` holds memory and copies, ``cuda_padcache`` compiles and
caches the padded dispatcher modules, ``cuda_profiling`` times kernels and queries
occupancy through the driver.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from av_infer._cy.vhq import MAX_C as VHQ_MAX_C
from av_infer.devices import cuda_choices
from av_infer.devices.base import Completion, CompletionCallback, Device, ResetInfo
from av_infer.devices.cuda_choices import CHOICE_MODES
from av_infer.devices.cuda_memory import CupyMemory, HostMemory
from av_infer.devices.cuda_padcache import PadModuleCache
from av_infer.devices.cuda_profiling import DriverTiming
from av_infer.devices.cuda_vendor import MODES, PRECISIONS, VendorLibraryError, VendorSpec
from av_infer.devices.faults import InjectedFault
from av_infer.errors import (
    DeviceFaultError,
    DeviceUnavailableError,
    InvalidInputError,
)
from av_infer.kernels.cuda.padding import OCC_LEVELS, PAD_SELECTS
from av_infer.kernels.cuda.sources import (
    ArgTemplate,
    PlanSource,
    build_plan_source,
    slot_address,
)
from av_infer.kernels.cuda_compile import CompileCache, Compiler, default_compiler
from av_infer.model.plan import Plan

log = logging.getLogger(__name__)

#: Largest per-stream capacity (the dispatcher's per-stream event ring is 64).
MAX_CAPACITY = 64
MAX_STREAMS = 64
_FLAG_STRIDE = 32  # bytes between flag words (one per stream, own sector)
#: ``CudaDevice(graphs=...)``: off = plain vHQ launches; be = gated CUDA graphs on BE streams
GRAPH_MODES = ("off", "be")
#: ``CudaDevice(graph_ops=...)``: gated ops per BE graph launch (the dispatcher's MAX_GRAPH_OPS)
MAX_GRAPH_OPS = 16
#: ``CudaDevice(rt_graphs=N)``: graph instances (arena + captured graph) per model, at most
MAX_RT_GRAPHS = 8
#: ``CudaDevice(vendor_graphs=N)``: BE graph instances (arena + gated graphs with the vendor
#: ops captured into their IF bodies) per model, at most
MAX_VENDOR_GRAPHS = 8


def availability(device_id: int = 0, emulate: bool = False) -> tuple[bool, str]:
    """(usable, reason): checks CuPy, the built dispatcher, libcuda and a visible GPU
    (``emulate``: the dispatcher and a host C/C++ compiler for the CPU emulator)."""
    try:
        from av_infer._cy import cuda_dispatch
    except ImportError as e:
        return False, f"dispatcher extension not built ({e}); run `make build`"
    if emulate:
        from av_infer.devices.cuda_emu import emulator_availability

        return emulator_availability()
    try:
        cuda_dispatch.load_driver()
    except OSError as e:
        return False, str(e)
    try:
        import cupy
    except ImportError as e:
        return False, f"cupy not installed ({e}); pip install -e .[gpu]"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - any CUDA runtime failure means unavailable
        return False, f"CUDA runtime error: {e}"
    if n <= device_id:
        return False, f"no CUDA device {device_id} ({n} visible)"
    return True, "ok"


def is_available(device_id: int = 0) -> bool:
    """True when a CudaDevice can be created here (see :func:`availability` for why not)."""
    return availability(device_id)[0]


@dataclass(eq=False)
class _Model:
    plan: Plan
    src: PlanSource
    module: int
    funcs: list[int]
    geom: bytes
    weights: Any  # cupy uint8 array
    aux: list[Any]
    weight_bytes: int
    precision: str = "fp32"
    #: per kernel None (ours) or (launcher address, op address) for the dispatcher
    vendor: list[tuple[int, int] | None] = field(default_factory=list)
    #: per kernel: {"kernel", "kind", "path": "vendor"|"own", "reason", "own_us", "vendor_us"}
    vendor_report: list[dict[str, Any]] = field(default_factory=list)
    zero_bias: list[Any] = field(default_factory=list)
    #: per kernel 0 or the address of its gated graph (docs/cuda_graphs.md); [] = none
    graphs: list[int] = field(default_factory=list)
    #: per kernel the plain function's registers per thread (cuFuncGetAttribute), read
    #: the first time a padded launch under ``pad_select="regs"`` needs them; [] = not yet
    regs: list[int] = field(default_factory=list)
    #: every kernel's argument struct with arena slots relative (``new_task`` adds a
    #: task's arena base: no per-kernel packing per request)
    args: ArgTemplate | None = None
    #: RT as one graph (``rt_graphs=N``, docs/cuda_graphs.md): the plan's graph instances
    #: and those no task holds (both under ``CudaDevice._books``)
    rt_pool: list[_RtInstance] = field(default_factory=list)
    rt_free: list[_RtInstance] = field(default_factory=list)
    #: tasks of this plan were enqueued on an RT / a BE stream (which tasks take instances)
    rt_seen: bool = False
    be_seen: bool = False
    #: vendor ops inside gated graphs (``vendor_graphs=N``, docs/cuda_graphs.md): the plan's
    #: BE graph instances and those no task holds (both under ``CudaDevice._books``)
    vg_pool: list[_VendorInstance] = field(default_factory=list)
    vg_free: list[_VendorInstance] = field(default_factory=list)


@dataclass(eq=False)
class _RtInstance:
    """One graph arena of an RT graph pool: the arena, the argument structs packed for it,
    the whole plan captured with those structs (``Dispatcher.rt_graph``) and, with vendor
    ops, the workspace baked into the captured library calls."""

    arena: Any
    blob: bytes
    graph: int
    ws: Any = None


@dataclass(eq=False)
class _VendorInstance:
    """One arena of a plan's vendor graph pool (docs/cuda_graphs.md, "Vendor ops inside
    gated graphs"): the arena, the argument structs packed for it, a vendor workspace of
    its own, and the task's graph table: per kernel the gated graph that launches it
    (graphs with vendor ops captured into their IF bodies bake this arena's and this
    workspace's addresses; the plan's own gated graphs for kernels of ours elsewhere; 0
    for a vendor op that fell back to the host flag check)."""

    arena: Any
    blob: bytes
    ws: Any
    table: list[int]
    built: list[int]


@dataclass(eq=False)
class _Task:
    model: _Model
    arena: Any  # device uint8 buffer
    args: bytes = b""  # packed argument structs of every kernel, back to back
    offs: list[int] = field(default_factory=list)
    dev_args: Any = None  # ``args`` in device memory (DKP parts read their struct there)
    dev_args_ptr: int = 0
    error: str | None = None
    error_kernel: int = -1
    staging: dict[str, Any] = field(default_factory=dict)
    #: gate record (host-visible uint32[nk + 1], kernels/cuda/gate.py); None: no graphs
    grec: Any = None
    #: the RT graph instance whose arena this task uses (back to the pool when freed)
    rt: _RtInstance | None = None
    #: the vendor graph instance whose arena this task uses (back to the pool when freed)
    vg: _VendorInstance | None = None


def _split_item(item: tuple) -> list[tuple]:
    """A coalesced poll item as the single items it stands for (7-tuples, in order)."""
    s, task, k, status, _, _, executed, count, tt = item
    return [(s, task, k + i, status, tt[2 * i], tt[2 * i + 1], executed) for i in range(count)]


class CudaDevice(Device):
    """REEF-N on CUDA; see the module docstring."""

    name = "cuda"
    virtual = False
    max_capacity = MAX_CAPACITY  # Device.max_capacity: the dispatcher ring
    #: DKP: padded launches (``enqueue_padded``) through the generated dispatcher kernel
    supports_padding = True
    padding_reason = ""

    #: plan precisions this device runs (``Plan.precision``)
    precisions = PRECISIONS
    #: ``start(on_complete, coalesce=True)``: consecutive ordinary completions of one task
    #: on one stream that the completion thread finds waiting together are delivered as one
    #: record (``Completion.count``; ``Dispatcher.poll(coalesce=True)``, docs/request_path.md)
    coalesces = True

    def __init__(self, device_id: int = 0, c: int = 4, tf32: bool = False,
                 cache_dir: str | None = None, compiler: Compiler | None = None,
                 emulate: bool = False, sms: int = 16, vendor: str | None = None,
                 workspace_mb: int | None = None, graphs: str | None = None,
                 pad_select: str | None = None, graph_ops: int | None = None,
                 pad_levels: str | Sequence[int] | None = None,
                 vendor_choices: str | None = None, rt_graphs: int | str | None = None,
                 vendor_graphs: int | str | None = None) -> None:
        """``emulate``: run on the CPU emulator (docs/cuda_emu.md); ``sms`` is then the
        SM count padding selection assumes (a real GPU reports its own).

        ``vendor``: ``off`` | ``auto`` | ``force`` (module docstring; default
        ``$AV_INFER_CUDA_VENDOR``, else ``off``: the vendor path has not run on a GPU yet,
        docs/cuda_vendor.md; the emulator's vendor libraries are its own emulated ones).
        Unless ``off``, cuBLASLt and cuDNN 9 must be found (``cuda_vendor.find_library``),
        else :class:`VendorLibraryError`.
        ``workspace_mb``: vendor workspace per stream (default
        ``$AV_INFER_VENDOR_WORKSPACE_MB``, else 32 on a GPU, 1 on the emulator).
        ``vendor_choices``: ``cache`` | ``measure`` (default
        ``$AV_INFER_CUDA_VENDOR_CHOICES``, else ``cache``): under ``auto``, ``cache`` runs a
        model's ops on the paths recorded the first time it was measured on this GPU with
        these libraries, ``measure`` times every op at every load (``cuda_choices``).
        ``graphs``: ``off`` | ``be`` (default ``$AV_INFER_CUDA_GRAPHS``, else ``off``):
        ``be`` launches the kernels of ours on BE streams as gated CUDA graphs (a gate
        kernel reads the flag, an IF node runs the op or skips it, a record says which;
        docs/cuda_graphs.md). Where the driver refuses graphs or conditional nodes the
        plain vHQ path runs and ``telemetry()["graphs"]`` says why.
        ``pad_select``: ``parts`` | ``regs`` (default ``$AV_INFER_CUDA_PAD_SELECT``, else
        ``parts``): how a padded launch picks the dispatcher kernel's proxy variant
        (``kernels.cuda.padding.PAD_SELECTS``; ``regs`` is not measured on a GPU yet,
        docs/cuda.md); settable later through the ``pad_select`` property.
        ``pad_levels``: the occupancy levels of the padded dispatcher's proxy variants
        (a comma list or ints in 1..32; default ``$AV_INFER_CUDA_PAD_LEVELS``, else
        ``kernels.cuda.padding.OCC_LEVELS`` = 1,2,4,8): more levels let ``regs`` match more
        plain kernels' occupancy, each one more variant to compile (docs/cuda.md).
        ``graph_ops``: gated ops per graph launch under ``graphs="be"`` (1..16; default
        ``$AV_INFER_CUDA_GRAPH_OPS``, else 1 = one op per launch): a graph of several ops
        is ONE entry against ``c`` (docs/request_path.md section 2; the stream's vHQ then
        holds up to c x graph_ops indices in flight, at most 64), each op behind its own
        gate, one completion per op saying whether it ran (docs/cuda_graphs.md).
        ``rt_graphs``: RT as one graph (0..8; default ``$AV_INFER_CUDA_RT_GRAPHS``, else 0 =
        off; never measured on a GPU yet): each plan gets, at load, N graph instances (an
        arena of its own and the whole plan captured as one CUDA graph with that arena's
        addresses, vendor ops included); a task takes a free one at ``new_task`` and, on
        an RT stream, runs as ONE graph launch and one completion record of all its
        kernels (docs/cuda_graphs.md, "RT as one graph"). No free instance, a range that
        is not the whole task, or any refusal by the driver: the plain per-op path (the
        same results), counted in ``telemetry()["rt_graphs"]``.
        ``vendor_graphs``: vendor ops inside gated BE graphs (0..8; default
        ``$AV_INFER_CUDA_VENDOR_GRAPHS``, else 0 = off; needs ``graphs="be"`` and vendor ops;
        emulator only so far): each plan with vendor ops gets, at load, N BE graph
        instances (an arena and a workspace of its own, and gated graphs whose IF bodies
        hold the vendor calls captured with ``cuStreamBeginCaptureToGraph`` for that
        arena); a BE task that takes one runs its vendor ops behind gates like the kernels
        of ours. No free instance: the host flag check for its vendor ops, as without.
        A refusal (the driver lacks the call, a capture or an instantiation refused) keeps
        that op on the host flag check, named in ``telemetry()["vendor_graphs"]`` and the
        log (docs/cuda_graphs.md, "Vendor ops inside gated graphs")."""
        import os

        vg_s = vendor_graphs if vendor_graphs is not None else os.environ.get(
            "AV_INFER_CUDA_VENDOR_GRAPHS", "").strip() or 0
        try:
            vgn = int(vg_s)
        except (TypeError, ValueError):
            raise ValueError(f"vendor_graphs must be an integer, got {vg_s!r}") from None
        if isinstance(vg_s, float | bool) or not 0 <= vgn <= MAX_VENDOR_GRAPHS:
            raise ValueError(
                f"vendor_graphs must be an integer in 0..{MAX_VENDOR_GRAPHS}, got {vg_s!r}")

        rtg_s = rt_graphs if rt_graphs is not None else os.environ.get(
            "AV_INFER_CUDA_RT_GRAPHS", "").strip() or 0
        try:
            rtg = int(rtg_s)
        except (TypeError, ValueError):
            raise ValueError(f"rt_graphs must be an integer, got {rtg_s!r}") from None
        if isinstance(rtg_s, float | bool) or not 0 <= rtg <= MAX_RT_GRAPHS:
            raise ValueError(f"rt_graphs must be an integer in 0..{MAX_RT_GRAPHS}, got {rtg_s!r}")

        gops_s = graph_ops if graph_ops is not None else os.environ.get(
            "AV_INFER_CUDA_GRAPH_OPS", "").strip() or 1
        try:
            gops = int(gops_s)
        except ValueError:
            raise ValueError(f"graph_ops must be an integer, got {gops_s!r}") from None
        if not 1 <= gops <= MAX_GRAPH_OPS:
            raise ValueError(f"graph_ops must be in 1..{MAX_GRAPH_OPS}, got {gops}")

        psel = pad_select if pad_select is not None else os.environ.get(
            "AV_INFER_CUDA_PAD_SELECT", "")
        psel = self._check_pad_select(psel.strip().lower() or "parts")
        plev = self._check_pad_levels(pad_levels if pad_levels is not None else
                                      os.environ.get("AV_INFER_CUDA_PAD_LEVELS", ""))

        gmode = graphs if graphs is not None else os.environ.get("AV_INFER_CUDA_GRAPHS", "")
        gmode = gmode.strip().lower() or "off"
        if gmode not in GRAPH_MODES:
            raise ValueError(f"graphs must be one of {GRAPH_MODES}, got {gmode!r}")

        mode = vendor if vendor is not None else os.environ.get("AV_INFER_CUDA_VENDOR", "")
        mode = mode.strip().lower() or "off"
        if mode not in MODES:
            raise ValueError(f"vendor must be one of {MODES}, got {mode!r}")
        cmode = vendor_choices if vendor_choices is not None else os.environ.get(
            "AV_INFER_CUDA_VENDOR_CHOICES", "")
        cmode = cmode.strip().lower() or "cache"
        if cmode not in CHOICE_MODES:
            raise ValueError(f"vendor_choices must be one of {CHOICE_MODES}, got {cmode!r}")
        ws_mb = workspace_mb if workspace_mb is not None else int(
            os.environ.get("AV_INFER_VENDOR_WORKSPACE_MB", "1" if emulate else "32"))
        if ws_mb < 0:
            raise ValueError(f"workspace_mb must be >= 0, got {ws_mb}")
        ok, why = availability(device_id, emulate=emulate)
        if not ok:
            kind = "cuda emulator" if emulate else "cuda device"
            raise DeviceUnavailableError(f"{kind} unavailable: {why}")
        from av_infer._cy.cuda_dispatch import Dispatcher

        if not 1 <= c <= MAX_CAPACITY:
            raise ValueError(f"capacity must be in 1..{MAX_CAPACITY}, got {c}")
        self.device_id = int(device_id)
        self.emulated = bool(emulate)
        self.tf32 = bool(tf32)
        if emulate:
            from av_infer.devices.cuda_emu.driver import build_driver
            from av_infer.devices.cuda_emu.kernels import HostKernelCompiler

            self._mem: CupyMemory | HostMemory = HostMemory()
            self._driver_path = str(build_driver())
            self._compiler: Compiler = compiler or HostKernelCompiler()
        else:
            self._mem = CupyMemory(self.device_id)
            self._driver_path = "libcuda.so.1"
            self._compiler = compiler or default_compiler("cubin")
        self.arch = self._mem.arch
        #: SMs (DKP selection counts block slots per SM)
        self.sms = int(sms) if emulate else self._mem.sms
        self._pad_select = psel
        #: padded launches set up per proxy variant (telemetry: which selection ran what)
        self._pad_variants: dict[str, int] = {}
        self._profiles: dict[str, Any] = {}
        self._flags = self._mem.alloc(MAX_STREAMS * _FLAG_STRIDE, zero=True)
        self._flags_ptr = self._mem.ptr(self._flags)
        self._disp = Dispatcher(self._driver_path)
        self._errstr = self._disp.error_string
        self._cache = CompileCache(cache_dir)
        self._pads = PadModuleCache(self._disp, self._cache, self._compiler, self.arch, plev)
        self._timing = DriverTiming(self._driver_path, self._mem, self._errstr)
        self.vendor_mode = mode
        #: ``auto``'s per-op choices: ``cache`` | ``measure``; models whose choices came
        #: from the record / were measured at load (telemetry)
        self.vendor_choices = cmode
        self._choice_stats = {"cached": 0, "measured": 0}
        self._ws_bytes = int(ws_mb) << 20
        self._vendor: Any = None
        #: plan name -> {"precision", "vendor", "own"}: conv/gemm kernels per path (telemetry)
        self._vendor_models: dict[str, dict[str, Any]] = {}
        self._ws: list[Any] = []  # per stream: its vendor workspace (device memory)
        if mode != "off":
            self._vendor = self._load_vendor()
            # a vendor call that fails under capture is reported with the library's text
            self._disp.set_vendor_errstr(self._vendor.error_string)
        #: gated graphs (docs/cuda_graphs.md): mode, whether in use, why not, per plan
        self.graphs_mode = gmode
        #: gated ops per graph launch (docs/cuda_graphs.md, "Graphs of several ops")
        self.graph_ops = gops
        self._graphs: dict[str, Any] = {"mode": gmode, "active": False, "reason": "off",
                                        "ops_per_graph": gops, "plans": {}}
        self._gate_func = 0
        self._zero_word: Any = None
        self._graph_addrs: set[int] = set()
        if gmode != "off":
            self._init_graphs()
        #: RT as one graph (docs/cuda_graphs.md): instances per plan, whether in use, why
        #: not; ``taken``: tasks that got an instance, ``exhausted``: tasks that wanted one
        #: when none was free (plain path), ``launch_refused``: graph launches the driver
        #: refused (ran plain); per plan its instances or why it has none
        self.rt_graphs = rtg
        self._rt: dict[str, Any] = {"instances": rtg, "active": False,
                                    "reason": "off" if rtg == 0 else "", "taken": 0,
                                    "exhausted": 0, "launch_refused": 0, "plans": {}}
        self._rt_addrs: set[int] = set()
        if rtg:
            self._init_rt_graphs()
        #: vendor ops inside gated graphs (docs/cuda_graphs.md): instances per plan,
        #: whether in use, why not; ``taken`` / ``exhausted`` as for RT graphs; per plan
        #: its instances, the vendor ops gated and those that fell back (kernel -> reason)
        self.vendor_graphs = vgn
        self._vg: dict[str, Any] = {"instances": vgn, "active": False,
                                    "reason": "off" if vgn == 0 else "", "taken": 0,
                                    "exhausted": 0, "plans": {}}
        if vgn:
            self._init_vendor_graphs()
        #: one owner of _tasks / _zombies / _padded (module docstring, "Threads")
        self._books = threading.Lock()
        #: BE parts of the padded launches queued or in flight, by (RT task, kernel): the
        #: owner of a padded launch's parts from ``pad_kernel`` until its completion takes
        #: them (``Completion.parts``) or a reset drops them (``ResetInfo.dropped_parts``,
        #: ``_drop_padding``). The dispatcher's padded entry (``set_padded``: function,
        #: geometry, argument struct built from these parts) is only how the launch is made;
        #: it is consumed at transmission and cleared with these by ``_drop_padding``.
        self._padded: dict[tuple[int, int], tuple[tuple[int, int, int, int, int], ...]] = {}
        self._c = int(c)
        self._vhqs: list[Any] = []
        self._prio: list[int] = []
        self._stream_cap: list[int | None] = []
        self._tasks: dict[int, _Task] = {}
        self._zombies: set[int] = set()
        self._on_complete: CompletionCallback | None = None
        self._coalesce = False
        #: tests and measurements only: the completion thread sleeps this long before each
        #: poll, so completions wait in the ring and batches form as on a loaded GPU (on the
        #: emulator kernels are slow and the thread rarely falls behind). 0: no pause
        self.poll_pause_s = 0.0
        #: completion records delivered and the launches they stood for (telemetry
        #: ``completions``: launches per record > 1 where records were coalesced)
        self._records = 0
        self._record_launches = 0
        self._threads: list[threading.Thread] = []
        #: completion threads that died and were replaced (``_drain``)
        self.drain_restarts = 0
        self._started = False
        self._closed = False
        self._lock = threading.Lock()

    # -- clock ----------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter()  # CLOCK_MONOTONIC, the dispatcher's clock too

    # -- gated CUDA graphs (docs/cuda_graphs.md) -------------------------------------------
    def _graphs_refused(self, why: str) -> None:
        """Graphs off for this device from now on: the plain vHQ path, and say why."""
        self._graphs["active"] = False
        self._graphs["reason"] = why
        log.warning("cuda: gated graphs refused, plain vHQ launches instead: %s", why)

    def _init_graphs(self) -> None:
        """The gate kernel's module and the zero flag word of gated ops."""
        from av_infer.kernels.cuda.gate import GATE_KERNEL, GATE_SOURCE

        missing = self._disp.graphs_missing()
        if missing:
            self._graphs_refused(f"the driver lacks {', '.join(missing)}")
            return
        try:
            image = self._cache.get_or_compile(self._compiler, GATE_SOURCE, self.arch, ())
            module = self._disp.load_module(image)
            self._gate_func = self._disp.get_function(module, GATE_KERNEL)
        except Exception as e:  # noqa: BLE001 - any compile/load failure: plain path, said
            self._graphs_refused(f"the gate kernel did not build: {type(e).__name__}: {e}")
            return
        self._zero_word = self._mem.alloc(64, zero=True)
        self._disp.set_zero_word(self._mem.ptr(self._zero_word))
        self._graphs["active"] = True
        self._graphs["reason"] = ""

    def _graph_groups(self, m: _Model, vendor: bool = False) -> list[tuple[int, int]]:
        """(first kernel, ops) of each gated graph of a plan: runs of consecutive kernels
        of ours (vendor ops keep the host flag check and end a run) cut into pieces of
        ``graph_ops`` from the run's start. ``vendor``: vendor ops join the runs (a vendor
        graph instance captures them into their IF bodies)."""
        groups: list[tuple[int, int]] = []
        k, nk = 0, len(m.funcs)
        if vendor:
            return [(f, min(self.graph_ops, nk - f)) for f in range(0, nk, self.graph_ops)]
        while k < nk:
            if m.vendor and m.vendor[k] is not None:
                k += 1
                continue
            end = k
            while end < nk and not (m.vendor and m.vendor[end] is not None):
                end += 1
            for first in range(k, end, self.graph_ops):
                groups.append((first, min(self.graph_ops, end - first)))
            k = end
        return groups

    def _build_graphs(self, m: _Model) -> None:
        """Gated graphs over the kernels of ours (``_graph_groups``; vendor ops keep the
        host flag check): per kernel the address of the graph holding it, 0 for none.
        A refusal drops graphs for the device (plain path) and says so."""
        made = [0] * len(m.funcs)
        built: list[int] = []
        try:
            for first, n in self._graph_groups(m):
                a = self._disp.gated_graph(self._gate_func, m.funcs[first:first + n],
                                           m.geom[first * 28:(first + n) * 28], first)
                built.append(a)
                made[first:first + n] = [a] * n
        except RuntimeError as e:
            for a in built:
                self._disp.destroy_gated_graph(a)
            self._graphs_refused(f"{m.plan.name}: {e}")
            for sid in range(len(self._vhqs)):
                self._disp.set_stream_graphs(sid, False)
                self._apply_capacity(sid, self._stream_cap[sid] or self._c)
            return
        m.graphs = made
        self._graph_addrs.update(built)
        self._graphs["plans"][m.plan.name] = sum(1 for a in made if a)

    def _free_graphs(self, m: _Model) -> None:
        for a in set(m.graphs) - {0}:  # a graph of several ops stands at each of its kernels
            self._disp.destroy_gated_graph(a)
            self._graph_addrs.discard(a)
        m.graphs = []

    # -- vendor ops inside gated graphs (docs/cuda_graphs.md) ------------------------------
    def _init_vendor_graphs(self) -> None:
        """Vendor graphs need gated graphs on, vendor ops, and capture into a graph."""
        why = ""
        if not self._graphs["active"]:
            why = ("gated graphs are off" if self.graphs_mode == "off"
                   else f"gated graphs refused ({self._graphs['reason']})")
        elif self._vendor is None:
            why = "vendor ops are off (vendor='off')"
        else:
            missing = self._disp.vendor_graph_missing()
            if missing:
                why = f"the driver lacks {', '.join(missing)}"
        if why:
            self._vg["reason"] = why
            log.warning("cuda: vendor ops inside gated graphs refused, vendor ops keep the "
                        "host flag check: %s", why)
            return
        self._vg["active"] = True

    def _vendor_gated(self, m: _Model, first: int, n: int, blob: bytes, vctx: int) -> int:
        """One gated graph over kernels first..first+n-1 for one arena (``blob``): the
        vendor ops among them captured into their IF bodies with ``vctx``."""
        ks = range(first, first + n)
        return self._disp.gated_graph(self._gate_func, m.funcs[first:first + n],
                                      m.geom[first * 28:(first + n) * 28], first,
                                      [m.vendor[k] for k in ks], blob,
                                      [m.args.offs[k] for k in ks], vctx)

    def _vendor_instance(self, m: _Model, fallback: dict[int, str]) -> _VendorInstance:
        """One vendor graph instance: per group of ``_graph_groups(vendor=True)`` that
        holds a vendor op one graph for this arena; a group refused is retried op by op
        (each vendor op alone: a refusal leaves it 0 = host flag check, its reason in
        ``fallback``; kernels of ours keep the plan's own gated graphs)."""
        mem, nk = self._mem, len(m.funcs)
        arena = mem.alloc(m.plan.arena_bytes)
        blob = m.args.for_arena(mem.ptr(arena))
        ws = mem.alloc(max(self._ws_bytes, 256))  # baked into the captured calls: its own
        vctx = self._vendor.stream_ctx(self._disp.capture_stream(), mem.ptr(ws),
                                       self._ws_bytes)
        table = list(m.graphs) if m.graphs else [0] * nk
        built: list[int] = []
        for first, n in self._graph_groups(m, vendor=True):
            ks = range(first, first + n)
            if not any(m.vendor[k] is not None for k in ks):
                continue
            try:
                a = self._vendor_gated(m, first, n, blob, vctx)
                built.append(a)
                table[first:first + n] = [a] * n
                continue
            except RuntimeError as e:
                if n == 1:
                    fallback[first] = str(e)
                    continue
            for k in ks:  # the group was refused: op by op
                if m.vendor[k] is None:
                    continue
                try:
                    a = self._vendor_gated(m, k, 1, blob, vctx)
                except RuntimeError as e:
                    fallback[k] = str(e)
                    continue
                built.append(a)
                table[k] = a
        return _VendorInstance(arena, blob, ws, table, built)

    def _build_vendor_graphs(self, m: _Model) -> None:
        """The plan's pool of ``vendor_graphs`` instances, built at load. Vendor ops that
        could not be gated keep the host flag check (per op, named in telemetry and the
        log); a plan none of whose vendor ops could be gated gets no instance."""
        nv = sum(1 for v in m.vendor if v is not None)
        fallback: dict[int, str] = {}
        pool: list[_VendorInstance] = []
        for _ in range(self.vendor_graphs):
            inst = self._vendor_instance(m, fallback)
            pool.append(inst)
            if not inst.built:
                break
        gated = sum(1 for k, v in enumerate(m.vendor)
                    if v is not None and pool and pool[0].table[k])
        row: dict[str, Any] = {"instances": len(pool), "vendor_ops": nv, "gated": gated,
                               "fallback": {k: fallback[k] for k in sorted(fallback)}}
        if fallback:
            log.warning("cuda: %s: %d of %d vendor op(s) keep the host flag check (not "
                        "gated): %s", m.plan.name, len(fallback), nv,
                        "; ".join(f"kernel {k}: {w}" for k, w in sorted(fallback.items())))
        if gated == 0:
            for inst in pool:
                for a in inst.built:
                    self._disp.destroy_gated_graph(a)
            row["instances"] = 0
            self._vg["plans"][m.plan.name] = row
            return
        for inst in pool:
            self._graph_addrs.update(inst.built)
        m.vg_pool, m.vg_free = pool, list(pool)
        m.weight_bytes += sum(int(i.arena.nbytes) + int(i.ws.nbytes) for i in pool)
        self._vg["plans"][m.plan.name] = row

    def _free_vendor_graphs(self, m: _Model) -> None:
        for inst in m.vg_pool:
            for a in inst.built:
                self._disp.destroy_gated_graph(a)
                self._graph_addrs.discard(a)
        m.vg_pool, m.vg_free = [], []

    def _take_vendor(self, m: _Model) -> _VendorInstance | None:
        """A free vendor graph instance for a new task of ``m``, or None (host flag check
        for its vendor ops). Tasks of a plan seen on RT streams only take none."""
        if not m.vg_pool or (m.rt_seen and not m.be_seen):
            return None
        with self._books:
            if m.vg_free:
                self._vg["taken"] += 1
                return m.vg_free.pop()
            self._vg["exhausted"] += 1
        return None

    # -- RT as one graph (docs/cuda_graphs.md) ---------------------------------------------
    def _init_rt_graphs(self) -> None:
        """RT graphs need stream capture and graph launches, and the zero flag word."""
        missing = self._disp.rt_graph_missing()
        if missing:
            self._rt["reason"] = f"the driver lacks {', '.join(missing)}"
            log.warning("cuda: RT graphs refused, plain launches instead: %s",
                        self._rt["reason"])
            return
        if self._zero_word is None:
            self._zero_word = self._mem.alloc(64, zero=True)
            self._disp.set_zero_word(self._mem.ptr(self._zero_word))
        self._rt["active"] = True

    def _build_rt_graphs(self, m: _Model) -> None:
        """The plan's pool of ``rt_graphs`` graph instances, built at load; a refusal
        (capture, a vendor call under capture, instantiation) leaves the plan without one
        (plain path), named in telemetry and the log."""
        mem, plan = self._mem, m.plan
        pool: list[_RtInstance] = []
        offs = list(m.args.offs)
        try:
            for _ in range(self.rt_graphs):
                arena = mem.alloc(plan.arena_bytes)
                blob = m.args.for_arena(mem.ptr(arena))
                ws, vctx = None, 0
                if m.vendor:  # the workspace is baked into the captured calls: its own
                    ws = mem.alloc(max(self._ws_bytes, 256))
                    vctx = self._vendor.stream_ctx(self._disp.capture_stream(), mem.ptr(ws),
                                                   self._ws_bytes)
                a = self._disp.rt_graph(m.funcs, m.geom, blob, offs, m.vendor or None, vctx)
                pool.append(_RtInstance(arena, blob, a, ws))
        except RuntimeError as e:
            for inst in pool:
                self._disp.destroy_rt_graph(inst.graph)
            why = str(e)
            self._rt["plans"][plan.name] = {"instances": 0, "reason": why}
            log.warning("cuda: RT graph of %s refused, plain launches instead: %s",
                        plan.name, why)
            return
        m.rt_pool, m.rt_free = pool, list(pool)
        self._rt_addrs.update(i.graph for i in pool)
        m.weight_bytes += sum(int(i.arena.nbytes) + (int(i.ws.nbytes) if i.ws is not None
                                                     else 0) for i in pool)
        self._rt["plans"][plan.name] = {"instances": len(pool), "kernels": len(m.funcs),
                                        "reason": ""}

    def _free_rt_graphs(self, m: _Model) -> None:
        for inst in m.rt_pool:
            self._disp.destroy_rt_graph(inst.graph)
            self._rt_addrs.discard(inst.graph)
        m.rt_pool, m.rt_free = [], []

    def _take_rt(self, m: _Model) -> _RtInstance | None:
        """A free graph instance for a new task of ``m``, or None (the plain path). Tasks
        of a plan seen on BE streams only take none (they would hold instances RT needs)."""
        if not m.rt_pool or (m.be_seen and not m.rt_seen):
            return None
        with self._books:
            if m.rt_free:
                self._rt["taken"] += 1
                return m.rt_free.pop()
            self._rt["exhausted"] += 1
        return None

    def _forget_task(self, task: int) -> None:
        """Drop a freed task's record; its graph instance goes back to the pool (caller
        holds ``_books``; the task has no launch in flight)."""
        t = self._tasks.pop(task, None)
        if t is not None and t.rt is not None:
            t.model.rt_free.append(t.rt)
            t.rt = None
        if t is not None and t.vg is not None:
            t.model.vg_free.append(t.vg)
            t.vg = None

    def _rt_refusals(self) -> None:
        """Report RT graph launches the driver refused (they ran plain, as one unit)."""
        n = self._disp.rt_graph_refused_total()
        if n > self._rt["launch_refused"]:
            self._rt["launch_refused"] = n
            dead = {a: self._disp.rt_graph_refusal(a) for a in self._rt_addrs}
            codes = sorted({c for c in dead.values() if c is not None})
            self._rt["reason"] = ("cuGraphLaunch refused: " + ", ".join(
                f"{self._errstr(c)} (CUresult {c})" for c in codes))
            log.warning("cuda: %d RT graph launch(es) refused, those tasks ran plain "
                        "launches: %s", n, self._rt["reason"])

    # -- vendor libraries (cuda_vendor.py, cuda_vendor.pyx) -------------------------------
    def _load_vendor(self) -> Any:
        """cuBLASLt and cuDNN, dlopened from where ``find_library`` finds them (the emulator:
        its own driver library, which exports the emulated entry points)."""
        from av_infer._cy.cuda_vendor import Vendor
        from av_infer.devices.cuda_vendor import cudnn_preload, find_library

        if self.emulated:
            lt = dnn = self._driver_path
            pre: list[str] = []
        else:
            lt, dnn = find_library("cublaslt"), find_library("cudnn")
            pre = cudnn_preload(dnn)
        try:
            return Vendor(lt, dnn, pre)
        except OSError as e:
            raise VendorLibraryError(str(e), [lt, dnn], "found, but it does not load") from e

    def _stream_vendor(self, sid: int) -> None:
        """Give stream ``sid`` its vendor context: a workspace and a cuDNN handle on it."""
        ws = self._mem.alloc(max(self._ws_bytes, 256))
        self._ws.append(ws)
        ctx = self._vendor.stream_ctx(self._disp.stream_handle(sid), self._mem.ptr(ws),
                                      self._ws_bytes)
        self._disp.set_stream_vendor(sid, ctx)

    def vendor_report(self, handle: Any) -> list[dict[str, Any]]:
        """Per conv/gemm kernel of a loaded plan: which path runs it (``vendor`` | ``own``),
        why it stays ours, the measured µs of both (``auto``), the vendor algorithm and
        ``call``: the library calls of the op (``Vendor.op_info``: matmul | fused | conv |
        conv+bias)."""
        return [dict(r) for r in handle.vendor_report]

    def _build_vendor_ops(self, m: _Model) -> None:
        """Vendor op per eligible kernel (the fallback to ours is per op and reported)."""
        from av_infer.devices.cuda_vendor import vendor_spec

        v = self._vendor
        have = {"cublaslt": v.has_cublaslt, "cudnn": v.has_cudnn}
        m.vendor = [None] * len(m.src.specs)
        launch = v.launch_address
        auto = self.vendor_mode == "auto"
        eligible = {k.index for k in m.plan.kernels if k.kind in ("conv", "gemm",
                                                                   "conv_transpose")}
        key, known = "", None
        if auto and self.vendor_choices == "cache":
            key = cuda_choices.choice_key(m.src.source, m.precision, self._gpu_identity(),
                                          v.versions(), self._ws_bytes)
            known = cuda_choices.load(self._cache, key, eligible)
        measured: dict[int, dict[str, Any]] = {}
        for k, spec in zip(m.plan.kernels, m.src.specs, strict=True):
            if k.kind not in ("conv", "gemm", "conv_transpose"):
                continue
            vs: VendorSpec = vendor_spec(m.plan, k, spec, have)
            row: dict[str, Any] = {"kernel": k.index, "kind": k.kind, "name": k.name,
                                   "path": "own", "reason": vs.reason}
            m.vendor_report.append(row)
            if vs.kind is None:
                continue
            params = dict(vs.params, precision=m.precision, max_ws=self._ws_bytes)
            try:
                if vs.kind == "conv":
                    zb = 0
                    if vs.needs_zero_bias:
                        buf = self._mem.alloc(4 * vs.needs_zero_bias, zero=True)
                        m.zero_bias.append(buf)
                        zb = self._mem.ptr(buf)
                    op, _ws = v.conv_op(zero_bias=zb, **params)
                else:
                    op, _ws = v.matmul_op(**params)
            except RuntimeError as e:  # no algorithm for these shapes: ours runs it
                row["reason"] = str(e)
                continue
            info = v.op_info(op)
            row.update(op=info["kind"], call=info["call"], algo=info["algo"],
                       workspace=info["workspace"])
            if auto:
                if known is not None and k.index in known:
                    rec = known[k.index]
                    row["chosen"] = "cached"
                else:
                    own = self.time_kernel(m, k.index, cuda_choices.AUTO_REPEATS)
                    ven = self._time_vendor(m, k.index, op, cuda_choices.AUTO_REPEATS)
                    rec = {"path": cuda_choices.decide(own, ven), "own_us": round(own, 2),
                           "vendor_us": round(ven, 2)}
                    measured[k.index] = rec
                    row["chosen"] = "measured"
                row["own_us"], row["vendor_us"] = rec["own_us"], rec["vendor_us"]
                if rec["path"] == "own":
                    row["reason"] = "ours measured faster"
                    continue
            row["path"], row["reason"] = "vendor", ""
            m.vendor[k.index] = (launch, op)
        if auto:
            self._choice_stats["measured" if measured else "cached"] += 1
            if key and measured:
                cuda_choices.store(self._cache, key, {**(known or {}), **measured},
                                   m.plan.name)
        if not any(m.vendor):
            m.vendor = []
        n = sum(1 for r in m.vendor_report if r["path"] == "vendor")
        self._vendor_models[m.plan.name] = {"precision": m.precision, "vendor": n,
                                            "own": len(m.vendor_report) - n}
        log.info("%s: %d of %d conv/gemm kernels on vendor ops (%s, %s)", m.plan.name, n,
                 len(m.vendor_report), self.vendor_mode, m.precision)

    def _gpu_identity(self) -> dict[str, Any]:
        """What identifies the GPU for recorded choices: architecture, SMs and name."""
        out: dict[str, Any] = {"arch": self.arch, "sms": self.sms, "emulated": self.emulated}
        if not self.emulated:
            import cupy

            props = cupy.cuda.runtime.getDeviceProperties(self.device_id)
            name = props.get("name", b"")
            out["name"] = name.decode() if isinstance(name, bytes) else str(name)
        return out

    def _time_vendor(self, m: _Model, k: int, op: int, repeats: int) -> float:
        spec = m.src.specs[k]
        return self._timing.time_vendor(
            self._vendor, op, lambda arena: spec.pack(self._resolver(m, arena)),
            m.plan.arena_bytes, repeats, self._ws_bytes)

    # -- models ---------------------------------------------------------------------------
    @staticmethod
    def plan_precision(plan: Plan) -> str:
        """The precision a plan asks for (``Plan.precision``; fp32 when absent)."""
        p = getattr(plan, "precision", "fp32") or "fp32"
        if p not in PRECISIONS:
            raise InvalidInputError(f"precision must be one of {PRECISIONS}, got {p!r}")
        return p

    def compile_plan(self, plan: Plan) -> tuple[PlanSource, bytes]:
        """Source and cubin of a plan (through the disk cache); our conv/gemm kernels use
        TF32 tiles for ``tf32=True`` devices and tf32 plans."""
        src = build_plan_source(plan, tf32=self.tf32 or self.plan_precision(plan) == "tf32")
        image = self._cache.get_or_compile(self._compiler, src.source, self.arch, ())
        return src, image

    def load_plan(self, plan: Plan) -> _Model:
        if self.faults is not None:
            self.faults.check_load(plan.name, self.name)
        mem = self._mem
        src, image = self.compile_plan(plan)
        module = self._disp.load_module(image)
        fcache: dict[str, int] = {}
        funcs = []
        for s in src.specs:
            if s.func not in fcache:
                fcache[s.func] = self._disp.get_function(module, s.func)
            funcs.append(fcache[s.func])
        geom = b"".join(struct.pack("<7I", *s.grid, *s.block, s.smem) for s in src.specs)
        wbufs = [b for b in plan.buffers.values() if b.role == "weight"]
        wsize = max((b.offset + b.nbytes for b in wbufs), default=0)
        weights = mem.alloc(wsize, zero=True)
        for b in wbufs:
            arr = np.ascontiguousarray(plan.weights[b.id]).view(np.uint8).reshape(-1)
            mem.upload(weights, b.offset, arr)
        aux = [mem.to_device(a) for a in src.aux]
        mem.synchronize()
        wb = int(weights.nbytes) + sum(int(a.nbytes) for a in aux)
        m = _Model(plan, src, module, funcs, geom, weights, aux, wb, self.plan_precision(plan))
        m.args = ArgTemplate.build(plan, src.specs, mem.ptr(weights), [mem.ptr(a) for a in aux])
        if self._vendor is not None:
            self._build_vendor_ops(m)
        if self._graphs["active"]:
            self._build_graphs(m)
        if self._vg["active"] and self._graphs["active"] and m.vendor:
            self._build_vendor_graphs(m)
        if self._rt["active"]:
            self._build_rt_graphs(m)
        return m

    def kernel_geometry(self, handle: Any, k: int) -> tuple[int, int]:
        """(logical blocks, threads) of kernel ``k`` as launched here: what DKP parts count
        (conv/gemm tiles and row kernels differ from the plan's nominal geometry)."""
        spec = handle.src.specs[k]
        return spec.nblk, int(spec.block[0])

    def profile_of(self, handle: Any) -> Any:
        """The kernel profile of a loaded plan (CUDA events + occupancy API; measured once
        per loaded plan): what padding selection uses when the runtime is given
        no profile file."""
        from av_infer.devices.cuda_profiling import profile_loaded

        prof = self._profiles.get(id(handle))
        if prof is None:
            prof = profile_loaded(handle.plan, self, handle, repeats=1 if self.emulated else 3)
            self._profiles[id(handle)] = prof
        return prof

    def unload_plan(self, handle: Any) -> None:
        self._profiles.pop(id(handle), None)
        self._pads.forget_plan(handle)  # modules holding its bodies: unloaded at close()
        self._free_graphs(handle)
        self._free_vendor_graphs(handle)
        self._free_rt_graphs(handle)
        self._disp.unload_module(handle.module)
        handle.weights = None
        handle.aux = []

    def resident_bytes(self, handle: Any) -> int:
        return handle.weight_bytes

    # -- tasks ----------------------------------------------------------------------------
    def _resolver(self, handle: Any, arena: Any) -> Any:
        """Device address of a pointer slot for a task whose activations live in ``arena``."""
        ptr = self._mem.ptr
        plan, wbase, abase = handle.plan, ptr(handle.weights), ptr(arena)
        aux = [ptr(a) for a in handle.aux]
        return lambda ref: slot_address(plan, ref, wbase, abase, aux)

    def new_task(self, handle: Any, task: int) -> None:
        plan: Plan = handle.plan
        inst = self._take_rt(handle) if handle.rt_pool else None
        vg = self._take_vendor(handle) if handle.vg_pool and inst is None else None
        if inst is not None:  # its graph arena: the graph bakes these addresses
            arena, blob = inst.arena, inst.blob
        elif vg is not None:  # its vendor graphs bake these addresses
            arena, blob = vg.arena, vg.blob
        else:
            arena = self._mem.alloc(plan.arena_bytes)
            blob = handle.args.for_arena(self._mem.ptr(arena))
        offs = list(handle.args.offs)
        graphs = vg.table if vg is not None else handle.graphs
        grec = None
        if graphs:
            grec = self._mem.pinned(4 * (len(handle.funcs) + 1)).view(np.uint32)
            grec[:] = 0
        try:
            self._disp.register_task(task, handle.funcs, handle.geom, blob, offs,
                                     handle.vendor or None, graphs or None,
                                     int(grec.ctypes.data) if grec is not None else 0,
                                     inst.graph if inst is not None else 0)
        except BaseException:
            with self._books:
                if inst is not None:
                    handle.rt_free.append(inst)
                if vg is not None:
                    handle.vg_free.append(vg)
            raise
        t = _Task(handle, arena, blob, offs, grec=grec, rt=inst, vg=vg)
        with self._books:
            self._tasks[task] = t
        if self._pads.in_use():  # padding in use: upload now, not in a padded launch
            self._device_args(t)

    def release_task(self, task: int) -> None:
        # under _books: the drain cannot take the task's last completion between the
        # dispatcher's "launches in flight" and the zombie mark (it would never free it)
        with self._books:
            if task not in self._tasks:
                return
            if self._disp.unregister_task(task):
                self._forget_task(task)
                self._zombies.discard(task)
                self._forget_padding(task)
            else:
                self._zombies.add(task)  # launches in flight: freed at their completion

    def _staging(self, t: _Task, name: str, nbytes: int) -> np.ndarray:
        buf = t.staging.get(name)
        if buf is None or buf.size < nbytes:
            buf = self._mem.pinned(nbytes)
            t.staging[name] = buf
        return buf

    def _addr(self, t: _Task, name: str) -> int:
        plan = t.model.plan
        tn = plan.tensors[name]
        return self._mem.ptr(t.arena) + plan.buffers[tn.buffer].offset + tn.byte_offset

    def write_inputs(self, task: int, inputs: dict[str, np.ndarray]) -> None:
        t = self._tasks[task]
        plan = t.model.plan
        for name in plan.inputs:
            if name not in inputs:
                raise InvalidInputError(f"missing input {name!r} (expects {plan.inputs})")
        mem = self._mem
        for name, value in inputs.items():
            if name not in plan.inputs:
                raise InvalidInputError(f"unknown input {name!r} (expects {plan.inputs})")
            tn = plan.tensors[name]
            src = np.asarray(value)
            if tuple(src.shape) != tuple(tn.shape):
                raise InvalidInputError(f"input {name!r}: shape {src.shape}, expected {tn.shape}")
            if not np.can_cast(src.dtype, tn.dtype, casting="same_kind"):
                raise InvalidInputError(
                    f"input {name!r}: dtype {src.dtype} cannot be cast to {tn.dtype}")
            host = self._staging(t, name, tn.nbytes)
            host[:tn.nbytes].view(tn.dtype).reshape(tn.shape)[...] = src
            mem.h2d(self._addr(t, name), host.ctypes.data, tn.nbytes)
        mem.wait_copies()

    def read_outputs(self, task: int) -> dict[str, np.ndarray]:
        t = self._tasks[task]
        if t.error is not None:
            raise DeviceFaultError(f"kernel {t.error_kernel} of {t.model.plan.name} failed on "
                                   f"the cuda device: {t.error}")
        plan = t.model.plan
        mem = self._mem
        hosts = {}
        for name in plan.outputs:
            tn = plan.tensors[name]
            host = self._staging(t, name, tn.nbytes)
            mem.d2h(host.ctypes.data, self._addr(t, name), tn.nbytes)
            hosts[name] = (host, tn)
        mem.wait_copies()
        return {n: h[:tn.nbytes].view(tn.dtype).reshape(tn.shape).copy()
                for n, (h, tn) in hosts.items()}

    # -- streams --------------------------------------------------------------------------
    def open_stream(self, priority: int) -> int:
        from av_infer._cy.vhq import VHQ

        with self._lock:
            sid = len(self._vhqs)
            if sid >= MAX_STREAMS:
                raise RuntimeError(f"at most {MAX_STREAMS} cuda streams")
            vhq = VHQ(self._c)
            flag = self._flag_addr(sid)
            got = self._disp.open_stream(vhq, int(priority) > 0, flag)
            assert got == sid
            if self._vendor is not None:
                self._stream_vendor(sid)
            self._vhqs.append(vhq)
            self._prio.append(int(priority))
            self._stream_cap.append(None)
            if self._graphs["active"] and int(priority) <= 0:  # BE streams only
                self._disp.set_stream_graphs(sid, True)
                self._apply_capacity(sid, self._c)
            if self._rt["active"] and int(priority) > 0:  # RT as one graph: RT streams
                self._disp.set_stream_rt_graphs(sid, True)
                self._apply_capacity(sid, self._c)
        return sid

    def _apply_capacity(self, sid: int, c: int) -> None:
        """``c`` launches in flight on stream ``sid``. On a BE stream with gated graphs of
        several ops a graph launch is one of those c (the dispatcher counts launch units),
        so its vHQ lets c x graph_ops indices be in flight (at most the ring's 64). On an RT
        stream with RT graphs a whole task's graph launch is one of those c, so its vHQ
        lets every index of a task be in flight (``VHQ_MAX_C``) and the dispatcher counts
        the c units."""
        if self._rt["active"] and self._prio[sid] > 0:
            self._vhqs[sid].c = VHQ_MAX_C
            self._disp.set_stream_units(sid, c)
            return
        graphs = self.graph_ops > 1 and self._disp.stream_stats(sid)["graphs"]
        self._vhqs[sid].c = min(c * self.graph_ops, MAX_CAPACITY) if graphs else c
        if self.graph_ops > 1:
            self._disp.set_stream_units(sid, c if graphs else MAX_CAPACITY)

    def enqueue(self, stream: int, task: int, first: int, last: int,
                wake: bool = True) -> None:
        if self._rt["active"] or self._vg["active"]:  # which plans run on RT streams
            # (who takes RT / vendor graph instances)
            t = self._tasks.get(task)
            if t is not None:
                if self._prio[stream] > 0:
                    t.model.rt_seen = True
                else:
                    t.model.be_seen = True
        self._vhqs[stream].push(task, first, last)
        self._disp.wake()

    def _flag_addr(self, stream: int) -> int:
        return self._flags_ptr + stream * _FLAG_STRIDE

    def reset(self, stream: int) -> ResetInfo | None:
        vhq = self._vhqs[stream]
        r = vhq.reset()
        if r is None:
            return None
        # dropped launches take their padding with them (and report it)
        dropped = self._drop_padding(r[0], r[1] + 1) if self._padded else ()
        return ResetInfo(*r, dropped_parts=dropped)

    def set_preempt(self, stream: int, flag: bool) -> None:
        self._disp.write_flag(stream, 1 if flag else 0)

    def set_capacity(self, c: int) -> None:
        if not 1 <= c <= MAX_CAPACITY:
            raise ValueError(f"capacity must be in 1..{MAX_CAPACITY}, got {c}")
        self._c = int(c)
        for i in range(len(self._vhqs)):
            self._stream_cap[i] = None
            self._apply_capacity(i, self._c)
        self._disp.wake()

    def set_stream_capacity(self, stream: int, c: int) -> None:
        if not 1 <= c <= MAX_CAPACITY:
            raise ValueError(f"capacity must be in 1..{MAX_CAPACITY}, got {c}")
        self._stream_cap[stream] = int(c)
        self._apply_capacity(stream, int(c))
        self._disp.wake()

    # -- dynamic kernel padding (REEF §5; kernels/cuda/padding.py) -------------------------
    @staticmethod
    def _check_pad_select(mode: str) -> str:
        if mode not in PAD_SELECTS:
            raise ValueError(f"pad_select must be one of {PAD_SELECTS}, got {mode!r}")
        return mode

    @staticmethod
    def _check_pad_levels(levels: str | Sequence[int]) -> tuple[int, ...]:
        if isinstance(levels, str):
            parts = [v.strip() for v in levels.split(",") if v.strip()]
            if not parts:
                return OCC_LEVELS
            try:
                levels = [int(v) for v in parts]
            except ValueError:
                raise ValueError(f"pad_levels must be integers, got {levels!r}") from None
        out = tuple(sorted({int(v) for v in levels}))
        if not out or out[0] < 1 or out[-1] > 32:
            raise ValueError(f"pad_levels must be occupancy levels in 1..32, got {levels!r}")
        return out

    @property
    def pad_select(self) -> str:
        """How padded launches pick their proxy variant (``PAD_SELECTS``); takes effect for
        the padded launches set up after the change (queued ones keep theirs)."""
        return self._pad_select

    @pad_select.setter
    def pad_select(self, mode: str) -> None:
        self._pad_select = self._check_pad_select(mode)

    def _kernel_regs(self, m: _Model, k: int) -> int:
        """Registers per thread of plan kernel ``k``'s plain function (read once per plan)."""
        if not m.regs:
            per_func: dict[int, int] = {}
            for f in m.funcs:
                if f not in per_func:
                    per_func[f] = int(self._disp.func_attribute(f, 4))
            m.regs = [per_func[f] for f in m.funcs]
        return m.regs[k]

    def prepare_padding(self, handles: list[Any]) -> None:
        """Compile (or load from the disk cache) the padded dispatcher module for this set
        of resident plans now, instead of on the first padded launch that needs it."""
        pm = self._pads.get(handles, wait=True)
        if pm.error is not None:
            raise DeviceFaultError(f"padded dispatcher module: {pm.error}")

    def _device_args(self, t: _Task) -> int:
        """Device address of the task's packed structs: uploaded at ``new_task`` once
        padding is in use, else here on first use (one copy on the copy stream; no device
        synchronisation, so in-flight BE work is not waited for)."""
        if t.dev_args is None:
            mem = self._mem
            host = mem.pinned(len(t.args))
            host[:len(t.args)] = np.frombuffer(t.args, dtype=np.uint8)
            buf = mem.alloc(len(t.args))
            mem.h2d(mem.ptr(buf), host.ctypes.data, len(t.args))
            mem.wait_copies()
            t.dev_args, t.dev_args_ptr = buf, mem.ptr(buf)
        return t.dev_args_ptr

    def enqueue_padded(self, stream: int, task: int, kernel: int,
                       parts: Sequence[tuple[int, int, int, int, int]]) -> bool:
        """Queue kernel ``kernel`` of ``task`` as one padded launch with the BE ``parts``
        (see Device.enqueue_padded). False: it was queued unpadded instead (the module for
        these plans is still compiling, or the RT kernel loops over its blocks)."""
        padded = bool(parts) and self.pad_kernel(stream, task, kernel, parts)
        self.enqueue(stream, task, kernel, kernel)
        return padded

    def pad_kernel(self, stream: int, task: int, kernel: int,
                   parts: Sequence[tuple[int, int, int, int, int]] = ()) -> bool:
        """Make the next launch of kernel ``kernel`` of ``task`` on ``stream`` the padded
        dispatcher kernel with ``parts`` (none: the RT body alone, REEF Fig. 18a's overhead
        case); it is queued as usual (``enqueue``). False if no padded module is ready."""
        t = self._tasks[task]
        spec = t.model.src.specs[kernel]
        if spec.nblk != spec.grid[0]:
            return False
        if t.model.vendor and t.model.vendor[kernel] is not None:
            return False  # a vendor op has no body to pad (BE parts run our bodies)
        bes = []
        for p in parts:  # block ranges are checked by PaddedModule.launch
            bt = self._tasks.get(int(p[0]))
            if bt is None:
                raise ValueError(f"padding part {tuple(p)}: unknown task {p[0]}")
            bes.append((bt, bt.model.src.specs[int(p[1])], p))
        pm = self._pads.ready_for(t.model, [b[0].model for b in bes])
        if pm is None:
            return False
        flag = self._flag_addr(stream)  # parts belong to this launch: its stream's flag
        rows = [(bspec, flag, self._device_args(bt) + bt.offs[int(p[1])], int(p[2]), int(p[3]),
                 int(p[4])) for bt, bspec, p in bes]
        regs = None
        if self._pad_select == "regs":  # REEF's rule: every part's plain kernel, RT included
            regs = max([self._kernel_regs(t.model, kernel)]
                       + [self._kernel_regs(bt.model, int(p[1])) for bt, _, p in bes])
        launch = pm.padded.launch(spec, flag, self._device_args(t) + t.offs[kernel], rows,
                                  regs)
        geom = struct.pack("<7I", *launch.grid, *launch.block, launch.smem)
        self._disp.set_padded(task, kernel, pm.funcs[launch.func], geom, launch.args)
        self._pad_variants[launch.func] = self._pad_variants.get(launch.func, 0) + 1
        if parts:
            with self._books:
                self._padded[(task, kernel)] = tuple(parts)  # type: ignore[arg-type]
        return True

    def _drop_padding(self, task: int, first: int = 0) -> tuple[tuple[int, int, Any], ...]:
        """The one place the padding of queued launches is forgotten (``reset``): the
        dispatcher's padded launch entries of kernels ``first..`` of ``task`` (not yet
        transmitted: they launch plain if ever sent again) and their recorded parts, both
        here. Returns the dropped ``(task, kernel, parts)`` in kernel order."""
        self._disp.clear_padded(task, first)
        with self._books:
            return self._forget_padding(task, first)

    def _forget_padding(self, task: int, first: int = 0) -> tuple[tuple[int, int, Any], ...]:
        """Remove and return the recorded parts of ``task``'s padded launches from
        ``first`` on, in kernel order (caller holds ``_books``)."""
        keys = sorted(k for k in self._padded if k[0] == task and k[1] >= first)
        return tuple((t, k, self._padded.pop((t, k))) for t, k in keys)

    # -- profiling (av_infer.profiler.KernelTimer; devices/cuda_profiling.py) -------------
    def occupancy(self, handle: Any, k: int) -> int:
        """Resident blocks per SM of kernel ``k`` (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
        spec = handle.src.specs[k]
        return self._timing.occupancy(handle.funcs[k], spec.block[0], spec.smem)

    def time_kernel(self, handle: Any, k: int, repeats: int) -> float:
        """Median µs of ``repeats`` CUDA-event-timed launches of kernel ``k`` alone (after
        one warm-up launch), on a zeroed scratch arena and a private stream with a clear
        flag word; never goes through the dispatcher."""
        if handle.vendor and handle.vendor[k] is not None:
            return self._time_vendor(handle, k, handle.vendor[k][1], repeats)
        spec = handle.src.specs[k]
        return self._timing.time_kernel(
            handle.funcs[k], spec, lambda arena: spec.pack(self._resolver(handle, arena)),
            handle.plan.arena_bytes, repeats)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, on_complete: CompletionCallback, coalesce: bool = False) -> None:
        """``coalesce``: ``on_complete`` accepts coalesced records (``Device.coalesces``)."""
        with self._lock:
            if self._started:
                raise RuntimeError("cuda device already started")
            self._on_complete = on_complete
            self._coalesce = bool(coalesce)
            self._started = True
            for target, name in ((self._disp._run, "dispatch"), (self._drain, "completions")):
                th = threading.Thread(target=target, name=f"av_infer-cuda-{name}", daemon=True)
                th.start()
                self._threads.append(th)

    def _drain(self, backlog: Sequence[tuple] = ()) -> None:
        """Forward the dispatcher's completions to on_complete (Python thread).

        If this thread's body dies (a bug, or the ``"lane"`` fault), the completion it held
        counts as a failed launch (its task's ``read_outputs`` raises DeviceFaultError) and
        a new thread takes over it and the rest of the batch (``drain_restarts``).

        Coalesced items (``start(coalesce=True)``: ``count`` > 1) are booked once, except
        while fault hooks are armed or a padded launch's parts are booked for one of their
        kernels: those are per launch, so the item is delivered as its single records."""
        pending = deque(backlog)
        held = None
        coalesce = self._coalesce
        try:
            while not self._closed:
                if not pending:
                    if self.poll_pause_s > 0:
                        time.sleep(self.poll_pause_s)
                    pending.extend(self._disp.poll(4096, 0.05, executed=True, coalesce=True)
                                   if coalesce else self._disp.poll(4096, 0.05, executed=True))
                    if self._rt["active"] and pending:
                        self._rt_refusals()
                while pending:
                    held = pending.popleft()
                    faults = self.faults
                    if len(held) > 7 and held[7] > 1 and (faults is not None
                                                          or self._padded_in(held)):
                        pending.extendleft(reversed(_split_item(held)))
                        held = None
                        continue
                    if faults is not None:  # outside any handler: this thread dies
                        rec = self._tasks.get(held[1])
                        if rec is not None:
                            faults.check("lane", rec.model.plan.name, held[2])
                    done = self._completed(*held, faults=faults)
                    held = None
                    self._records += 1
                    self._record_launches += done.count
                    cb = self._on_complete
                    if cb is not None and not self._closed:
                        cb(done)
        except BaseException as e:  # noqa: BLE001 - the thread dies; a new one takes over
            if self._closed:
                return
            log.error("cuda completion thread died (%s: %s); a new one takes over",
                      type(e).__name__, e)
            if held is not None:  # not yet booked: book it as failed, then deliver it
                with self._books:
                    rec = self._tasks.get(held[1])
                    if rec is not None and rec.error is None:
                        rec.error = f"the completion thread died while it held it ({e})"
                        rec.error_kernel = held[2]
                pending.appendleft(held)
            with self._lock:
                self.drain_restarts += 1
                th = threading.Thread(target=self._drain, args=(tuple(pending),),
                                      name="av_infer-cuda-completions", daemon=True)
                self._threads.append(th)
            th.start()

    def _padded_in(self, item: tuple) -> bool:
        """Parts of a padded launch are booked for a kernel of the coalesced ``item``."""
        if not self._padded:
            return False
        task, k = item[1], item[2]
        with self._books:
            return any((task, k + i) in self._padded for i in range(item[7]))

    def _completed(self, s: int, task: int, k: int, status: int, t0: float, t1: float,
                   executed: bool | None = None, count: int = 1, times: tuple = (),
                   faults: Any = None) -> Completion:
        """The books of one completion (drain thread): a failed launch becomes its task's
        error, a padded launch takes its parts, a released task's last launch frees it.
        ``executed``: what a gated graph's record says (None: plain launch, unknown).
        ``count`` > 1: a coalesced item of ``Dispatcher.poll`` (status 0, no padded
        launch, no fault hooks: ``_drain`` splits the others), booked once.
        ``faults``: the device's injector (None in production)."""
        if count != 1:
            with self._books:
                if task in self._zombies and self._disp.unregister_task(task):
                    self._zombies.discard(task)
                    self._forget_task(task)
            return Completion(s, task, k, executed, t0, t1, count=count, times=times)
        with self._books:
            rec = self._tasks.get(task)
            if rec is not None and rec.error is None:
                if status != 0:
                    why = ("unknown task/kernel" if status < 0 else
                           self._vendor.error_string(status)
                           if status >= 0x10000 and self._vendor is not None
                           else self._errstr(status))
                    rec.error, rec.error_kernel = f"{why} (CUresult {status})", k
                elif faults is not None:
                    try:
                        faults.check("kernel", rec.model.plan.name, k)
                    except InjectedFault as e:
                        rec.error, rec.error_kernel = str(e), k
            parts = self._padded.pop((task, k), ()) if self._padded else ()
            if task in self._zombies and self._disp.unregister_task(task):
                self._zombies.discard(task)
                self._forget_task(task)
        return Completion(s, task, k, None if status != 0 else executed, t0, t1, parts)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._disp.stop()
        me = threading.current_thread()
        for th in self._threads:
            if th is not me:
                th.join(timeout=5)
        for s in range(len(self._vhqs)):
            try:
                self._disp.sync_stream(s)
            except RuntimeError as e:  # a failed launch (sticky per stream): close anyway
                log.warning("cuda close: stream %d: %s", s, e)
        self._pads.unload_all()
        for a in list(self._graph_addrs):
            self._disp.destroy_gated_graph(a)
        self._graph_addrs.clear()
        for a in list(self._rt_addrs):
            self._disp.destroy_rt_graph(a)
        self._rt_addrs.clear()
        self._timing.close()
        if self._vendor is not None:
            self._vendor.close()
        with self._books:
            self._tasks.clear()
            self._zombies.clear()
            self._padded.clear()

    def telemetry(self) -> dict[str, Any]:
        from av_infer.telemetry import gpu_telemetry

        out: dict[str, Any] = {"device": self.name, "arch": self.arch, "tf32": self.tf32,
                               "emulated": self.emulated}
        out["gpu"] = ({"name": "CPU emulator (docs/cuda_emu.md)"} if self.emulated
                      else gpu_telemetry(self.device_id))
        out["streams"] = [
            {"id": i, "priority": self._prio[i], "queued": v.queued, "in_flight": v.in_flight,
             "capacity": v.c, **self._disp.stream_stats(i)}
            for i, v in enumerate(self._vhqs)
        ]
        out["tasks"] = len(self._tasks)
        out["drain_restarts"] = self.drain_restarts
        out["completions"] = {"coalesce": self._coalesce, "records": self._records,
                              "launches": self._record_launches}
        out["task_table"] = self._disp.table_stats()
        out["cuda_priority_range"] = self._disp.priority_range
        out["compile_cache"] = {"dir": str(self._cache.dir), "hits": self._cache.hits,
                                "misses": self._cache.misses}
        out["padding"] = {"select": self._pad_select, "levels": list(self._pads.levels),
                          "launches_by_variant": dict(self._pad_variants),
                          **self._pads.stats()}
        out["graphs"] = {**self._graphs, "plans": dict(self._graphs["plans"])}
        out["vendor_graphs"] = {**self._vg,
                                "plans": {k: dict(v) for k, v in self._vg["plans"].items()}}
        out["rt_graphs"] = {**self._rt,
                            "plans": {k: dict(v) for k, v in self._rt["plans"].items()}}
        out["vendor"] = {"mode": self.vendor_mode, "choices": self.vendor_choices,
                         "models_by_choice": dict(self._choice_stats)}
        if self._vendor is not None:
            out["vendor"].update(
                cublaslt=self._vendor.cublaslt_path, cudnn=self._vendor.cudnn_path,
                versions=self._vendor.versions(), workspace_bytes_per_stream=self._ws_bytes,
                models=dict(self._vendor_models))
        return out


class EmulatedCudaDevice(CudaDevice):
    """``CudaDevice`` on the CPU emulator, under its own device name ("cuda-emu")."""

    name = "cuda-emu"

    def __init__(self, **kw: Any) -> None:
        kw["emulate"] = True
        super().__init__(**kw)
