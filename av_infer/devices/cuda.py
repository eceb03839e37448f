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
"""

from __future__ import annotations

import statistics
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from av_infer.devices.base import Completion, CompletionCallback, Device, ResetInfo
from av_infer.errors import DeviceFaultError, DeviceUnavailableError, InvalidInputError
from av_infer.kernels.cuda.sources import AuxRef, PlanSource, TensorRef, build_plan_source
from av_infer.kernels.cuda_compile import CompileCache, Compiler, default_compiler
from av_infer.model.plan import Plan

#: Largest per-stream capacity (the dispatcher's per-stream event ring is 64).
MAX_CAPACITY = 64
MAX_STREAMS = 64
_FLAG_STRIDE = 32  # bytes between flag words (one per stream, own sector)


def availability(device_id: int = 0) -> tuple[bool, str]:
    """(usable, reason): checks CuPy, the built dispatcher, libcuda and a visible GPU."""
    try:
        from av_infer._cy import cuda_dispatch
    except ImportError as e:
        return False, f"dispatcher extension not built ({e}); run `make build`"
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


@dataclass(eq=False)
class _Task:
    model: _Model
    arena: Any  # cupy uint8 array
    error: str | None = None
    error_kernel: int = -1
    staging: dict[str, Any] = field(default_factory=dict)


class CudaDevice(Device):
    """REEF-N on CUDA; see the module docstring."""

    name = "cuda"
    virtual = False
    #: DKP: ``av_infer.kernels.cuda.padding`` generates the padded dispatcher kernels (and
    #: the tests compile them for sm_87/sm_90), but the Cython dispatcher does not launch
    #: them: ``enqueue_padded`` keeps raising NotImplementedError with this reason.
    supports_padding = False
    padding_reason = ("padded dispatcher kernels are generated and compile-checked but not "
                      "wired into the launch path yet")

    def __init__(self, device_id: int = 0, c: int = 4, tf32: bool = False,
                 cache_dir: str | None = None, compiler: Compiler | None = None) -> None:
        ok, why = availability(device_id)
        if not ok:
            raise DeviceUnavailableError(f"cuda device unavailable: {why}")
        import cupy

        from av_infer._cy.cuda_dispatch import Dispatcher, error_string

        if not 1 <= c <= MAX_CAPACITY:
            raise ValueError(f"capacity must be in 1..{MAX_CAPACITY}, got {c}")
        self._cp = cupy
        self._errstr = error_string
        self.device_id = int(device_id)
        self._dev = cupy.cuda.Device(self.device_id)
        self._dev.use()
        cc = self._dev.compute_capability
        self.arch = f"sm_{cc}"
        self.tf32 = bool(tf32)
        self._flags = cupy.zeros(MAX_STREAMS * _FLAG_STRIDE // 4, dtype=cupy.uint32)
        cupy.cuda.runtime.deviceSynchronize()  # context exists and is current
        self._disp = Dispatcher()
        self._copy = cupy.cuda.Stream(non_blocking=True)
        self._cache = CompileCache(cache_dir)
        self._compiler = compiler or default_compiler("cubin")
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
        cp = self._cp
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
        weights = cp.zeros(max(wsize, 1), dtype=cp.uint8)
        for b in wbufs:
            arr = np.ascontiguousarray(plan.weights[b.id]).view(np.uint8).reshape(-1)
            weights[b.offset:b.offset + arr.size].set(arr)
        aux = [cp.asarray(a) for a in src.aux]
        cp.cuda.runtime.deviceSynchronize()
        wb = int(weights.nbytes) + sum(int(a.nbytes) for a in aux)
        return _Model(plan, src, module, funcs, geom, weights, aux, wb)

    def unload_plan(self, handle: Any) -> None:
        self._disp.unload_module(handle.module)
        handle.weights = None
        handle.aux = []

    def resident_bytes(self, handle: Any) -> int:
        return handle.weight_bytes

    # -- tasks ----------------------------------------------------------------------------
    @staticmethod
    def _resolver(handle: Any, arena: Any) -> Any:
        """Device address of a pointer slot for a task whose activations live in ``arena``."""
        plan: Plan = handle.plan
        abase, wbase = int(arena.data.ptr), int(handle.weights.data.ptr)

        def resolve(ref: TensorRef | AuxRef) -> int:
            if isinstance(ref, AuxRef):
                return int(handle.aux[ref.index].data.ptr)
            t = plan.tensors[ref.name]
            b = plan.buffers[t.buffer]
            base = wbase if b.role == "weight" else abase
            return base + b.offset + t.byte_offset + ref.extra

        return resolve

    def new_task(self, handle: Any, task: int) -> None:
        cp = self._cp
        plan: Plan = handle.plan
        arena = cp.empty(max(int(plan.arena_bytes), 1), dtype=cp.uint8)

        resolve = self._resolver(handle, arena)
        packed, offs, pos = [], [], 0
        for s in handle.src.specs:
            blob = s.pack(resolve)
            packed.append(blob)
            offs.append(pos)
            pos += len(blob)
        self._disp.register_task(task, handle.funcs, handle.geom, b"".join(packed), offs)
        self._tasks[task] = _Task(handle, arena)

    def release_task(self, task: int) -> None:
        if task not in self._tasks:
            return
        if self._disp.unregister_task(task):
            self._tasks.pop(task, None)
        else:
            self._zombies.add(task)  # launches still in flight: free on their completion

    def _staging(self, t: _Task, name: str, nbytes: int) -> np.ndarray:
        buf = t.staging.get(name)
        if buf is None or buf.size < nbytes:
            mem = self._cp.cuda.alloc_pinned_memory(max(nbytes, 1))
            buf = np.frombuffer(mem, dtype=np.uint8, count=max(nbytes, 1))
            t.staging[name] = buf
        return buf

    def _addr(self, t: _Task, name: str) -> int:
        plan = t.model.plan
        tn = plan.tensors[name]
        return int(t.arena.data.ptr) + plan.buffers[tn.buffer].offset + tn.byte_offset

    def write_inputs(self, task: int, inputs: dict[str, np.ndarray]) -> None:
        t = self._tasks[task]
        plan = t.model.plan
        for name in plan.inputs:
            if name not in inputs:
                raise InvalidInputError(f"missing input {name!r} (expects {plan.inputs})")
        rt = self._cp.cuda.runtime
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
            rt.memcpyAsync(self._addr(t, name), host.ctypes.data, tn.nbytes,
                           rt.memcpyHostToDevice, self._copy.ptr)
        self._copy.synchronize()

    def read_outputs(self, task: int) -> dict[str, np.ndarray]:
        t = self._tasks[task]
        if t.error is not None:
            raise DeviceFaultError(f"kernel {t.error_kernel} of {t.model.plan.name} failed on "
                                   f"the cuda device: {t.error}")
        plan = t.model.plan
        rt = self._cp.cuda.runtime
        hosts = {}
        for name in plan.outputs:
            tn = plan.tensors[name]
            host = self._staging(t, name, tn.nbytes)
            rt.memcpyAsync(host.ctypes.data, self._addr(t, name), tn.nbytes,
                           rt.memcpyDeviceToHost, self._copy.ptr)
            hosts[name] = (host, tn)
        self._copy.synchronize()
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
            flag = int(self._flags.data.ptr) + sid * _FLAG_STRIDE
            got = self._disp.open_stream(vhq, int(priority) > 0, flag)
            assert got == sid
            self._vhqs.append(vhq)
            self._prio.append(int(priority))
            self._stream_cap.append(None)
        return sid

    def enqueue(self, stream: int, task: int, first: int, last: int) -> None:
        self._vhqs[stream].push(task, first, last)
        self._disp.wake()

    def reset(self, stream: int) -> ResetInfo | None:
        vhq = self._vhqs[stream]
        r = vhq.reset()
        if r is None:
            return None
        return ResetInfo(*r, restore_c=vhq.restore_c)

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

    # -- profiling (av_infer.profiler.KernelTimer) -----------------------------------------
    def _driver(self) -> Any:
        """libcuda through ctypes (the context is the one CuPy made current)."""
        import ctypes

        lib = getattr(self, "_cu", None)
        if lib is None:
            lib = ctypes.CDLL("libcuda.so.1")
            self._cu = lib
        return lib

    def _cu_check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise DeviceFaultError(f"{what} failed: {self._errstr(rc)} (CUresult {rc})")

    def occupancy(self, handle: Any, k: int) -> int:
        """Resident blocks per SM of kernel ``k`` (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
        import ctypes

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
        import ctypes

        cp, cu = self._cp, self._driver()
        spec = handle.src.specs[k]
        arena = cp.zeros(max(int(handle.plan.arena_bytes), 1), dtype=cp.uint8)
        flag = cp.zeros(8, dtype=cp.uint32)
        blob = ctypes.create_string_buffer(spec.pack(self._resolver(handle, arena)))
        fptr = ctypes.c_void_p(int(flag.data.ptr))
        params = (ctypes.c_void_p * 2)(ctypes.addressof(fptr), ctypes.addressof(blob))
        stream = cp.cuda.Stream(non_blocking=True)
        start, end = ctypes.c_void_p(), ctypes.c_void_p()
        self._cu_check(cu.cuEventCreate(ctypes.byref(start), 0), "cuEventCreate")
        self._cu_check(cu.cuEventCreate(ctypes.byref(end), 0), "cuEventCreate")
        sp = ctypes.c_void_p(stream.ptr)

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
            stream.synchronize()
            cu.cuEventDestroy_v2(start)
            cu.cuEventDestroy_v2(end)
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
                if task in self._zombies and self._disp.unregister_task(task):
                    self._zombies.discard(task)
                    self._tasks.pop(task, None)
                cb = self._on_complete
                if cb is not None and not self._closed:
                    cb(Completion(s, task, k, None, t0, t1))

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
        self._tasks.clear()

    def telemetry(self) -> dict[str, Any]:
        from av_infer.telemetry import gpu_telemetry

        out: dict[str, Any] = {"device": self.name, "arch": self.arch, "tf32": self.tf32}
        out["gpu"] = gpu_telemetry(self.device_id)
        out["streams"] = [
            {"id": i, "priority": self._prio[i], "queued": v.queued, "in_flight": v.in_flight,
             "capacity": v.c, **self._disp.stream_stats(i)}
            for i, v in enumerate(self._vhqs)
        ]
        out["tasks"] = len(self._tasks)
        out["cuda_priority_range"] = self._disp.priority_range
        out["compile_cache"] = {"dir": str(self._cache.dir), "hits": self._cache.hits,
                                "misses": self._cache.misses}
        return out
