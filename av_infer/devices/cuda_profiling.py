"""Kernel profiling for the cuda device: occupancy queries and CUDA-event timing of single
kernels, straight through the driver library (ctypes), never through the dispatcher.

What ``profile_loaded`` (below; ``av_infer.profiler`` uses it) measures on a loaded plan
(padding selection needs each kernel's duration and blocks per SM). The context is the one
the device made current (CuPy on a GPU; the emulator's driver on the CPU).
"""

from __future__ import annotations

import ctypes
import statistics
from collections.abc import Callable
from typing import Any

from av_infer.errors import DeviceFaultError
from av_infer.model.plan import Plan
from av_infer.profiles import KernelProfile, ModelProfile

__all__ = ["DriverTiming", "profile_loaded"]


class DriverTiming:
    """``driver_path``: the driver library; ``mem``: the device's memory
    (``cuda_memory``); ``errstr``: CUresult -> text."""

    def __init__(self, driver_path: str, mem: Any, errstr: Callable[[int], str]) -> None:
        self._driver_path = driver_path
        self._mem = mem
        self._errstr = errstr
        self._cu: Any = None
        #: the vendor timing stream, its workspace and vendor context (made once, reused)
        self._vt: tuple[Any, Any, int] | None = None

    def _driver(self) -> Any:
        """The driver library through ctypes, opened on first use."""
        if self._cu is None:
            self._cu = ctypes.CDLL(self._driver_path)
        return self._cu

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise DeviceFaultError(f"{what} failed: {self._errstr(rc)} (CUresult {rc})")

    def occupancy(self, func: int, threads: int, smem: int) -> int:
        """Resident blocks per SM of ``func`` (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
        n = ctypes.c_int(0)
        self._check(self._driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(n), ctypes.c_void_p(func), ctypes.c_int(threads),
            ctypes.c_size_t(smem)), "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return int(n.value)

    def _median_us(self, launch: Callable[[], None], sp: Any, start: Any, end: Any,
                   repeats: int) -> float:
        """One warm-up ``launch()``, then the median µs of ``repeats`` launches each timed
        between events ``start`` and ``end`` on stream ``sp``; the stream is drained and
        both events destroyed whatever happens (the stream stays the caller's)."""
        cu = self._driver()
        times = []
        try:
            launch()
            for _ in range(max(1, int(repeats))):
                self._check(cu.cuEventRecord(start, sp), "cuEventRecord")
                launch()
                self._check(cu.cuEventRecord(end, sp), "cuEventRecord")
                self._check(cu.cuEventSynchronize(end), "cuEventSynchronize")
                ms = ctypes.c_float(0.0)
                self._check(cu.cuEventElapsedTime(ctypes.byref(ms), start, end),
                            "cuEventElapsedTime")
                times.append(ms.value * 1000.0)
        finally:
            cu.cuStreamSynchronize(sp)
            cu.cuEventDestroy_v2(start)
            cu.cuEventDestroy_v2(end)
        return float(statistics.median(times))

    def time_kernel(self, func: int, spec: Any, pack: Callable[[Any], bytes], arena_bytes: int,
                    repeats: int) -> float:
        """Median µs of ``repeats`` CUDA-event-timed launches of ``func`` with ``spec``'s
        geometry (after one warm-up launch), on a zeroed scratch arena of ``arena_bytes``
        (``pack(arena)``: the kernel's argument struct for it) and a private stream with a
        clear flag word."""
        cu, mem = self._driver(), self._mem
        arena = mem.alloc(arena_bytes, zero=True)
        flag = mem.alloc(32, zero=True)
        blob = ctypes.create_string_buffer(pack(arena))
        fptr = ctypes.c_void_p(mem.ptr(flag))
        params = (ctypes.c_void_p * 2)(ctypes.addressof(fptr), ctypes.addressof(blob))
        sp = ctypes.c_void_p()
        self._check(cu.cuStreamCreate(ctypes.byref(sp), 1), "cuStreamCreate")  # non-blocking
        start, end = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(cu.cuEventCreate(ctypes.byref(start), 0), "cuEventCreate")
        self._check(cu.cuEventCreate(ctypes.byref(end), 0), "cuEventCreate")

        def launch() -> None:
            self._check(cu.cuLaunchKernel(
                ctypes.c_void_p(func), *(ctypes.c_uint(g) for g in spec.grid),
                *(ctypes.c_uint(b) for b in spec.block), ctypes.c_uint(spec.smem), sp,
                params, None), "cuLaunchKernel")

        try:
            return self._median_us(launch, sp, start, end, repeats)
        finally:
            cu.cuStreamDestroy_v2(sp)

    def time_vendor(self, vendor: Any, op: int, pack: Callable[[Any], bytes], arena_bytes: int,
                    repeats: int, ws_bytes: int) -> float:
        """Median µs of ``repeats`` CUDA-event-timed runs of vendor op ``op`` (after one
        warm-up), on a zeroed scratch arena and a private stream with its own workspace
        (the vendor counterpart of :meth:`time_kernel`; ``vendor``: ``cuda_vendor.Vendor``)."""
        cu, mem = self._driver(), self._mem
        arena = mem.alloc(arena_bytes, zero=True)
        args = pack(arena)
        if self._vt is None:  # one stream + cuDNN handle for every timing (cudnnCreate is slow)
            sp0 = ctypes.c_void_p()
            self._check(cu.cuStreamCreate(ctypes.byref(sp0), 1), "cuStreamCreate")
            ws = mem.alloc(max(ws_bytes, 256))
            self._vt = (sp0, ws, vendor.stream_ctx(sp0.value or 0, mem.ptr(ws), ws_bytes))
        sp, _ws, ctx = self._vt
        start, end = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(cu.cuEventCreate(ctypes.byref(start), 0), "cuEventCreate")
        self._check(cu.cuEventCreate(ctypes.byref(end), 0), "cuEventCreate")

        def launch() -> None:
            rc = vendor.launch(op, args, sp.value or 0, ctx)
            if rc != 0:
                raise DeviceFaultError(f"vendor op failed: {vendor.error_string(rc)}")

        return self._median_us(launch, sp, start, end, repeats)

    def close(self) -> None:
        """Destroy the vendor timing stream (its vendor context dies with the vendor's)."""
        if self._vt is not None:
            cu = self._driver()
            cu.cuStreamSynchronize(self._vt[0])
            cu.cuStreamDestroy_v2(self._vt[0])
            self._vt = None


def profile_loaded(plan: Plan, device: Any, handle: Any, repeats: int) -> ModelProfile:
    """CUDA events + occupancy API through :class:`KernelTimer` on a loaded plan. Blocks
    and threads are the launch's own where the device says (``kernel_geometry``), so DKP
    block ranges count the blocks that really run."""
    geometry = getattr(device, "kernel_geometry", None)
    kernels = []
    for k in plan.kernels:
        dur = float(device.time_kernel(handle, k.index, repeats))
        bps = int(device.occupancy(handle, k.index))
        blocks, threads = (geometry(handle, k.index) if geometry is not None
                           else (k.geometry.blocks, k.geometry.threads))
        kernels.append(KernelProfile(
            index=k.index, name=k.name, duration_us=dur, blocks=int(blocks),
            threads=int(threads), regs=k.geometry.regs, smem=k.geometry.smem,
            blocks_per_sm=max(1, bps)))
    tele = device.telemetry() if hasattr(device, "telemetry") else {}
    gpu = tele.get("gpu")
    gpu_name = gpu.get("name") if isinstance(gpu, dict) else gpu
    sms = int(getattr(device, "sms", 0) or tele.get("sms") or 0)
    return ModelProfile(model=plan.name, device=str(gpu_name or device.name), sms=sms,
                        kernels=kernels)
