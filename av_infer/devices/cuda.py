"""The CUDA device: NVRTC-compiled plan kernels launched by a GIL-free Cython dispatcher.

Why this shape (DESIGN.md "Devices", REEF-N §4.4): the scheduler only pushes
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
that ran); ``t_start`` is the host time of the launch call, ``t_end`` the host time the
dispatcher saw the kernel's event complete.

DKP (``enqueue_padded``): the padded dispatcher kernel of ``kernels/cuda/padding.py``,
compiled per set of resident plans (RT plan + the BE plans of the parts) on a background
thread the first time that set is asked for (or up front: :meth:`CudaDevice.prepare_padding`);
until it is ready the kernel runs unpadded and ``enqueue_padded`` says so (returns False).

``CudaDevice(emulate=True)`` runs all of the above on the CPU: the emulated driver and
kernel modules of ``av_infer.devices.cuda_emu`` (docs/cuda_emu.md) replace libcuda and
NVRTC, and "device" memory is host memory. Only memory and compilation differ
(:class:`_CupyMemory` vs :class:`_HostMemory`); the dispatcher, packing, vHQs and
completions are the same code.
"""

from __future__ import annotations

import ctypes
import logging
import statistics
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from av_infer.devices.base import Completion, CompletionCallback, Device, ResetInfo
from av_infer.errors import DeviceFaultError, DeviceUnavailableError, InvalidInputError
from av_infer.kernels.cuda.padding import PaddedModule, build_padded_module
from av_infer.kernels.cuda.sources import PlanSource, build_plan_source, slot_address
from av_infer.kernels.cuda_compile import CompileCache, Compiler, default_compiler
from av_infer.model.plan import Plan

log = logging.getLogger(__name__)

#: Largest per-stream capacity (the dispatcher's per-stream event ring is 64).
MAX_CAPACITY = 64
MAX_STREAMS = 64
_FLAG_STRIDE = 32  # bytes between flag words (one per stream, own sector)


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


class _CupyMemory:
    """Device memory, pinned staging and the copy stream of a real GPU (CuPy)."""

    emulated = False

    def __init__(self, device_id: int) -> None:
        import cupy

        self.cp = cupy
        self.dev = cupy.cuda.Device(device_id)
        self.dev.use()
        self.arch = f"sm_{self.dev.compute_capability}"
        self.sms = int(self.dev.attributes["MultiProcessorCount"])
        self.copy = cupy.cuda.Stream(non_blocking=True)
        cupy.cuda.runtime.deviceSynchronize()  # the context exists and is current

    def alloc(self, nbytes: int, zero: bool = False) -> Any:
        make = self.cp.zeros if zero else self.cp.empty
        return make(max(int(nbytes), 1), dtype=self.cp.uint8)

    @staticmethod
    def ptr(buf: Any) -> int:
        return int(buf.data.ptr)

    def upload(self, buf: Any, offset: int, data: np.ndarray) -> None:
        """Synchronous copy of host bytes into ``buf`` at ``offset`` (model loading)."""
        buf[offset:offset + data.size].set(data)

    def to_device(self, arr: np.ndarray) -> Any:
        return self.cp.asarray(arr)

    def pinned(self, nbytes: int) -> np.ndarray:
        mem = self.cp.cuda.alloc_pinned_memory(max(nbytes, 1))
        return np.frombuffer(mem, dtype=np.uint8, count=max(nbytes, 1))

    def h2d(self, dst: int, src: int, nbytes: int) -> None:
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(dst, src, nbytes, rt.memcpyHostToDevice, self.copy.ptr)

    def d2h(self, dst: int, src: int, nbytes: int) -> None:
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(dst, src, nbytes, rt.memcpyDeviceToHost, self.copy.ptr)

    def wait_copies(self) -> None:
        self.copy.synchronize()

    def synchronize(self) -> None:
        self.cp.cuda.runtime.deviceSynchronize()


class _HostMemory:
    """"Device" memory of the CPU emulator: 256-byte aligned host buffers, plain copies."""

    emulated = True
    arch = "emu"

    def alloc(self, nbytes: int, zero: bool = False) -> np.ndarray:
        """Uninitialised memory is poisoned (0xFF: NaN as float32), so a kernel that reads
        what nothing wrote shows it."""
        from av_infer.devices.cuda_emu.kernels import aligned_bytes

        return aligned_bytes(nbytes, fill=0 if zero else 0xFF)

    @staticmethod
    def ptr(buf: np.ndarray) -> int:
        return int(buf.ctypes.data)

    def upload(self, buf: np.ndarray, offset: int, data: np.ndarray) -> None:
        buf[offset:offset + data.size] = data

    def to_device(self, arr: np.ndarray) -> np.ndarray:
        a = np.ascontiguousarray(arr)
        out = self.alloc(a.nbytes)
        out[:] = a.view(np.uint8).reshape(-1)
        return out

    def pinned(self, nbytes: int) -> np.ndarray:
        return np.empty(max(nbytes, 1), dtype=np.uint8)

    def h2d(self, dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    d2h = h2d

    def wait_copies(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


@dataclass
class _PadModule:
    """A compiled padded dispatcher module (or one being compiled: ``ready`` unset)."""

    ready: threading.Event = field(default_factory=threading.Event)
    module: int = 0
    padded: PaddedModule | None = None
    funcs: dict[str, int] = field(default_factory=dict)
    error: str | None = None


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


class CudaDevice(Device):
    """REEF-N on CUDA; see the module docstring."""

    name = "cuda"
    virtual = False
    #: DKP: padded launches (``enqueue_padded``) through the generated dispatcher kernel
    supports_padding = True
    padding_reason = ""

    def __init__(self, device_id: int = 0, c: int = 4, tf32: bool = False,
                 cache_dir: str | None = None, compiler: Compiler | None = None,
                 emulate: bool = False, sms: int = 16) -> None:
        """``emulate``: run on the CPU emulator (docs/cuda_emu.md); ``sms`` is then the
        SM count padding selection assumes (a real GPU reports its own)."""
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

            self._mem: _CupyMemory | _HostMemory = _HostMemory()
            self._driver_path = str(build_driver())
            self._compiler: Compiler = compiler or HostKernelCompiler()
        else:
            self._mem = _CupyMemory(self.device_id)
            self._driver_path = "libcuda.so.1"
            self._compiler = compiler or default_compiler("cubin")
        self.arch = self._mem.arch
        #: SMs (DKP selection counts block slots per SM)
        self.sms = int(sms) if emulate else self._mem.sms
        self._profiles: dict[str, Any] = {}
        self._flags = self._mem.alloc(MAX_STREAMS * _FLAG_STRIDE, zero=True)
        self._flags_ptr = self._mem.ptr(self._flags)
        self._disp = Dispatcher(self._driver_path)
        self._errstr = self._disp.error_string
        self._cache = CompileCache(cache_dir)
        self._pad_modules: dict[frozenset[int], _PadModule] = {}
        #: launch-path shortcut: (RT model id, part model ids...) -> a ready module
        self._pad_ready: dict[tuple[int, ...], _PadModule] = {}
        self._padded: dict[tuple[int, int], tuple[tuple[int, int, int, int, int], ...]] = {}
        self._c = int(c)
        self._vhqs: list[Any] = []
        self._prio: list[int] = []
        self._stream_cap: list[int | None] = []
        self._tasks: dict[int, _Task] = {}
        self._zombies: set[int] = set()
        self._on_complete: CompletionCallback | None = None
        self._threads: list[threading.Thread] = []
        self._started = False
        self._closed = False
        self._lock = threading.Lock()
        self._retired: list[_PadModule] = []

    # -- clock ----------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter()  # CLOCK_MONOTONIC, the dispatcher's clock too

    # -- models ---------------------------------------------------------------------------
    def compile_plan(self, plan: Plan) -> tuple[PlanSource, bytes]:
        """Source and cubin of a plan (through the disk cache)."""
        src = build_plan_source(plan, tf32=self.tf32)
        image = self._cache.get_or_compile(self._compiler, src.source, self.arch, ())
        return src, image

    def load_plan(self, plan: Plan) -> _Model:
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
        return _Model(plan, src, module, funcs, geom, weights, aux, wb)

    def kernel_geometry(self, handle: Any, k: int) -> tuple[int, int]:
        """(logical blocks, threads) of kernel ``k`` as launched here: what DKP parts count
        (conv/gemm tiles and row kernels differ from the plan's nominal geometry)."""
        spec = handle.src.specs[k]
        return spec.nblk, int(spec.block[0])

    def profile_of(self, handle: Any) -> Any:
        """The kernel profile of a loaded plan (CUDA events + occupancy API; measured once
        per loaded plan): what padding selection uses when the runtime is given
        no profile file."""
        from av_infer.profiler import profile_loaded

        prof = self._profiles.get(id(handle))
        if prof is None:
            prof = profile_loaded(handle.plan, self, handle, repeats=1 if self.emulated else 3)
            self._profiles[id(handle)] = prof
        return prof

    def unload_plan(self, handle: Any) -> None:
        self._profiles.pop(id(handle), None)
        with self._lock:  # padded modules holding its bodies are unloaded at close()
            for key in [k for k in self._pad_modules if id(handle) in k]:
                self._retired.append(self._pad_modules.pop(key))
            self._pad_ready.clear()
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
        arena = self._mem.alloc(plan.arena_bytes)

        resolve = self._resolver(handle, arena)
        packed, offs, pos = [], [], 0
        for s in handle.src.specs:
            blob = s.pack(resolve)
            packed.append(blob)
            offs.append(pos)
            pos += len(blob)
        blob = b"".join(packed)
        self._disp.register_task(task, handle.funcs, handle.geom, blob, offs)
        t = self._tasks[task] = _Task(handle, arena, blob, offs)
        if self._pad_modules:  # padding in use: upload now, not in a padded launch
            self._device_args(t)

    def release_task(self, task: int) -> None:
        if task not in self._tasks:
            return
        if self._disp.unregister_task(task):
            self._tasks.pop(task, None)
            self._forget_padding(task)
        else:
            self._zombies.add(task)  # launches still in flight: free on their completion

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
            self._vhqs.append(vhq)
            self._prio.append(int(priority))
            self._stream_cap.append(None)
        return sid

    def enqueue(self, stream: int, task: int, first: int, last: int,
                wake: bool = True) -> None:
        self._vhqs[stream].push(task, first, last)
        self._disp.wake()

    def _flag_addr(self, stream: int) -> int:
        return self._flags_ptr + stream * _FLAG_STRIDE

    def reset(self, stream: int) -> ResetInfo | None:
        vhq = self._vhqs[stream]
        r = vhq.reset()
        if r is None:
            return None
        info = ResetInfo(*r, restore_c=vhq.restore_c)
        if self._padded:  # dropped launches take their padding with them
            self._disp.clear_padded(info.task, info.last_sent + 1)
            self._forget_padding(info.task, info.last_sent + 1)
        return info

    def in_flight(self, stream: int) -> int:
        return self._vhqs[stream].in_flight

    def set_preempt(self, stream: int, flag: bool) -> None:
        self._disp.write_flag(stream, 1 if flag else 0)

    def set_capacity(self, c: int) -> None:
        if not 1 <= c <= MAX_CAPACITY:
            raise ValueError(f"capacity must be in 1..{MAX_CAPACITY}, got {c}")
        self._c = int(c)
        for i, vhq in enumerate(self._vhqs):
            self._stream_cap[i] = None
            vhq.c = self._c
        self._disp.wake()

    def set_stream_capacity(self, stream: int, c: int) -> None:
        if not 1 <= c <= MAX_CAPACITY:
            raise ValueError(f"capacity must be in 1..{MAX_CAPACITY}, got {c}")
        self._stream_cap[stream] = int(c)
        self._vhqs[stream].c = int(c)
        self._disp.wake()

    # -- dynamic kernel padding (REEF §5; kernels/cuda/padding.py) -------------------------
    def prepare_padding(self, handles: list[Any]) -> None:
        """Compile (or load from the disk cache) the padded dispatcher module for this set
        of resident plans now, instead of on the first padded launch that needs it."""
        pm = self._pad_module(handles, wait=True)
        if pm.error is not None:
            raise DeviceFaultError(f"padded dispatcher module: {pm.error}")

    def _pad_module(self, handles: list[Any], wait: bool = False) -> _PadModule:
        """The padded module of ``handles``' plans, usable once ``ready`` is set and
        ``padded`` is not None (``error`` says why not); a first request starts its
        compilation on a background thread (``wait``: here, and returns when done)."""
        key = frozenset(id(h) for h in handles)
        with self._lock:
            pm = self._pad_modules.get(key)
            if pm is None:  # a ready module over more plans serves as well
                pm = next((m for k, m in self._pad_modules.items()
                           if key <= k and m.padded is not None), None)
            start = pm is None
            if start:
                pm = self._pad_modules[key] = _PadModule()
        if start:
            uniq = list({id(h): h for h in handles}.values())
            if wait:
                self._build_pad_module(pm, uniq)
            else:
                threading.Thread(target=self._build_pad_module, args=(pm, uniq),
                                 name="av_infer-cuda-padcompile", daemon=True).start()
        if wait:
            pm.ready.wait()
        return pm

    def _build_pad_module(self, pm: _PadModule, handles: list[Any]) -> None:
        try:
            padded = build_padded_module([h.src for h in handles])
            image = self._cache.get_or_compile(self._compiler, padded.source, self.arch, ())
            pm.module = self._disp.load_module(image)
            pm.funcs = {name: self._disp.get_function(pm.module, name)
                        for name in padded.variants.values()}
            pm.padded = padded
        except Exception as e:  # noqa: BLE001 - reported by prepare_padding / telemetry
            pm.error = f"{type(e).__name__}: {e}"
            log.warning("padded dispatcher module for %s failed; those plans run "
                        "unpadded: %s", [h.plan.name for h in handles], pm.error)
        finally:
            pm.ready.set()

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
        bes = []
        for p in parts:  # block ranges are checked by PaddedModule.launch
            bt = self._tasks.get(int(p[0]))
            if bt is None:
                raise ValueError(f"padding part {tuple(p)}: unknown task {p[0]}")
            bes.append((bt, bt.model.src.specs[int(p[1])], p))
        key = (id(t.model), *(id(b[0].model) for b in bes))
        pm = self._pad_ready.get(key)
        if pm is None:
            pm = self._pad_module([t.model] + [b[0].model for b in bes])
            if not pm.ready.is_set() or pm.padded is None:
                return False
            self._pad_ready[key] = pm
        flag = self._flag_addr(stream)  # parts belong to this launch: its stream's flag
        rows = [(bspec, flag, self._device_args(bt) + bt.offs[int(p[1])], int(p[2]), int(p[3]),
                 int(p[4])) for bt, bspec, p in bes]
        launch = pm.padded.launch(spec, flag, self._device_args(t) + t.offs[kernel], rows)
        geom = struct.pack("<7I", *launch.grid, *launch.block, launch.smem)
        self._disp.set_padded(task, kernel, pm.funcs[launch.func], geom, launch.args)
        if parts:
            self._padded[(task, kernel)] = tuple(parts)  # type: ignore[arg-type]
        return True

    def _forget_padding(self, task: int, first: int = 0) -> None:
        for key in [k for k in self._padded if k[0] == task and k[1] >= first]:
            del self._padded[key]

    # -- profiling (av_infer.profiler.KernelTimer) -----------------------------------------
    def _driver(self) -> Any:
        """The driver library through ctypes (the context is the one CuPy made current)."""
        lib = getattr(self, "_cu", None)
        if lib is None:
            lib = ctypes.CDLL(self._driver_path)
            self._cu = lib
        return lib

    def _cu_check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise DeviceFaultError(f"{what} failed: {self._errstr(rc)} (CUresult {rc})")

    def occupancy(self, handle: Any, k: int) -> int:
        """Resident blocks per SM of kernel ``k`` (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
        spec = handle.src.specs[k]
        n = ctypes.c_int(0)
        self._cu_check(self._driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(n), ctypes.c_void_p(handle.funcs[k]), ctypes.c_int(spec.block[0]),
            ctypes.c_size_t(spec.smem)), "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return int(n.value)

    def time_kernel(self, handle: Any, k: int, repeats: int) -> float:
        """Median µs of ``repeats`` CUDA-event-timed launches of kernel ``k`` alone (after
        one warm-up launch), on a zeroed scratch arena and a private stream with a clear
        flag word; never goes through the dispatcher."""
        cu, mem = self._driver(), self._mem
        spec = handle.src.specs[k]
        arena = mem.alloc(handle.plan.arena_bytes, zero=True)
        flag = mem.alloc(32, zero=True)
        blob = ctypes.create_string_buffer(spec.pack(self._resolver(handle, arena)))
        fptr = ctypes.c_void_p(mem.ptr(flag))
        params = (ctypes.c_void_p * 2)(ctypes.addressof(fptr), ctypes.addressof(blob))
        sp = ctypes.c_void_p()
        self._cu_check(cu.cuStreamCreate(ctypes.byref(sp), 1), "cuStreamCreate")  # non-blocking
        start, end = ctypes.c_void_p(), ctypes.c_void_p()
        self._cu_check(cu.cuEventCreate(ctypes.byref(start), 0), "cuEventCreate")
        self._cu_check(cu.cuEventCreate(ctypes.byref(end), 0), "cuEventCreate")

        def launch() -> None:
            self._cu_check(cu.cuLaunchKernel(
                ctypes.c_void_p(handle.funcs[k]), *(ctypes.c_uint(g) for g in spec.grid),
                *(ctypes.c_uint(b) for b in spec.block), ctypes.c_uint(spec.smem), sp,
                params, None), "cuLaunchKernel")

        times = []
        try:
            launch()
            for _ in range(max(1, int(repeats))):
                self._cu_check(cu.cuEventRecord(start, sp), "cuEventRecord")
                launch()
                self._cu_check(cu.cuEventRecord(end, sp), "cuEventRecord")
                self._cu_check(cu.cuEventSynchronize(end), "cuEventSynchronize")
                ms = ctypes.c_float(0.0)
                self._cu_check(cu.cuEventElapsedTime(ctypes.byref(ms), start, end),
                               "cuEventElapsedTime")
                times.append(ms.value * 1000.0)
        finally:
            cu.cuStreamSynchronize(sp)
            cu.cuEventDestroy_v2(start)
            cu.cuEventDestroy_v2(end)
            cu.cuStreamDestroy_v2(sp)
        return float(statistics.median(times))

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, on_complete: CompletionCallback) -> None:
        with self._lock:
            if self._started:
                raise RuntimeError("cuda device already started")
            self._on_complete = on_complete
            self._started = True
            for target, name in ((self._disp._run, "dispatch"), (self._drain, "completions")):
                th = threading.Thread(target=target, name=f"av_infer-cuda-{name}", daemon=True)
                th.start()
                self._threads.append(th)

    def _drain(self) -> None:
        """Forward the dispatcher's completions to on_complete (Python thread)."""
        while not self._closed:
            for s, task, k, status, t0, t1 in self._disp.poll(4096, 0.05):
                rec = self._tasks.get(task)
                if status != 0 and rec is not None and rec.error is None:
                    why = "unknown task/kernel" if status < 0 else self._errstr(status)
                    rec.error, rec.error_kernel = f"{why} (CUresult {status})", k
                parts = self._padded.pop((task, k), ()) if self._padded else ()
                if task in self._zombies and self._disp.unregister_task(task):
                    self._zombies.discard(task)
                    self._tasks.pop(task, None)
                cb = self._on_complete
                if cb is not None and not self._closed:
                    cb(Completion(s, task, k, None, t0, t1, parts))

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
            self._disp.sync_stream(s)
        for pm in [*self._pad_modules.values(), *self._retired]:
            pm.ready.wait()
            if pm.module:
                self._disp.unload_module(pm.module)
        self._pad_modules.clear()
        self._retired.clear()
        self._tasks.clear()

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
        out["cuda_priority_range"] = self._disp.priority_range
        out["compile_cache"] = {"dir": str(self._cache.dir), "hits": self._cache.hits,
                                "misses": self._cache.misses}
        with self._lock:
            mods = list(self._pad_modules.values())
        out["padding"] = {"modules": sum(1 for m in mods if m.padded is not None),
                          "compiling": sum(1 for m in mods if not m.ready.is_set()),
                          "errors": [m.error for m in mods if m.error]}
        return out


class EmulatedCudaDevice(CudaDevice):
    """``CudaDevice`` on the CPU emulator, under its own device name ("cuda-emu")."""

    name = "cuda-emu"

    def __init__(self, **kw: Any) -> None:
        kw["emulate"] = True
        super().__init__(**kw)
