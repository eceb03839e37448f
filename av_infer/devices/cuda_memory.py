"""Memory of the cuda device: device buffers, pinned staging and the copy stream.

The one thing that differs between a GPU and the CPU emulator besides compilation
(``CudaDevice(emulate=True)``, docs/cuda_emu.md): :class:`CupyMemory` allocates with CuPy
and copies on a non-blocking copy stream; :class:`HostMemory` hands out 256-byte aligned
host buffers ("device pointers are host pointers") and copies with ``memmove``. Both have
the same small interface, which is all ``CudaDevice`` uses.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

__all__ = ["CupyMemory", "HostMemory"]


class CupyMemory:
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


class HostMemory:
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
