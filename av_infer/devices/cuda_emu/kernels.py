"""The kernel half of the CUDA emulator (docs/cuda_emu.md §1): CUDA C -> host ``.so``.

:class:`HostKernelCompiler` implements the ``Compiler`` protocol of
``av_infer/kernels/cuda_compile.py``: it prepends ``prelude.h`` (CUDA built-ins on the
host), appends one trampoline per ``extern "C" __global__`` kernel and builds a shared
library with the host C++ compiler; the returned bytes are the ``.so`` (an ELF image, like
a cubin), so ``CompileCache`` caches it like one.

The ABI (one export per kernel NAME, plus the version)::

    int avi_emu_NAME(void** params, unsigned gx, unsigned gy, unsigned gz,
                     unsigned bx, unsigned by, unsigned bz, unsigned smem);
    int avi_emu_abi_version(void);   // 1

``params`` is ``cuLaunchKernel``'s ``kernelParams``; the call returns when the whole grid
has run, with 0 or a CUresult (1: invalid launch geometry, 2: out of memory, 719: the
block deadlocked or an ``mma.sync`` lacked lanes). Each module also exports
``int avi_emuparams_NAME(unsigned long long* sizes, int cap)``: the kernel's parameter
count (and, up to ``cap``, each parameter's size in bytes), for a driver that must copy
``kernelParams`` values at ``cuLaunchKernel`` time; and
``void avi_emu_set_schedule(int mode, unsigned seed)`` (tests): the order in which a
block's fibers are resumed (0 thread order, 1 reverse, 2 shuffled every pass), to catch
kernels whose results depend on thread interleaving.

Besides the compiler this module holds a host harness for tests and tools:
:func:`load_module` (bytes -> :class:`EmuModule`), :class:`HostPlanRun` (a plan's weights,
aux arrays and one task arena in numpy memory, pointers resolved exactly like
``CudaDevice._resolver``) and :func:`run_plan_emulated`.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import struct
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from av_infer.kernels.cuda.sources import (
    AuxRef,
    PlanSource,
    TensorRef,
    build_plan_source,
    slot_address,
)
from av_infer.kernels.cuda_compile import CompileCache, CompileError
from av_infer.model.plan import Plan

__all__ = [
    "ABI_VERSION",
    "EMU_ARCH",
    "EmulationError",
    "EmuModule",
    "HostKernelCompiler",
    "HostPlanRun",
    "PRELUDE_PATH",
    "aligned_bytes",
    "compile_module",
    "find_cxx",
    "host_has_fma",
    "host_source",
    "kernel_names",
    "load_module",
    "run_plan_emulated",
]

ABI_VERSION = 1
PRELUDE_PATH = Path(__file__).with_name("prelude.h")
#: Flags of every build; -ffp-contract=off: no FMA contraction beyond explicit fmaf.
BASE_FLAGS = ("-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden", "-ffp-contract=off",
              "-DAVI_HOST_EMU", "-w")
#: Architecture label for emulated modules (``arch`` only enters the cache key).
EMU_ARCH = "host"

_KERNEL_RE = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^()]*\)\s*)?'
    r"([A-Za-z_]\w*)\s*\(")
_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_PASS_OPTS = ("-D", "-U", "-I", "-O", "-g", "-w")

_TRAMPOLINE = """
AVI_EMU_EXPORT int avi_emu_{name}(void** params, unsigned gx, unsigned gy, unsigned gz,
                                  unsigned bx, unsigned by, unsigned bz, unsigned smem) {{
    return avi_emu::launch(&{name}, params, gx, gy, gz, bx, by, bz, smem);
}}
AVI_EMU_EXPORT int avi_emuparams_{name}(unsigned long long* sizes, int cap) {{
    return avi_emu::param_sizes(&{name}, sizes, cap);
}}
"""
_FOOTER = "\nAVI_EMU_EXPORT int avi_emu_abi_version(void) {{ return {abi}; }}\n"
_SOURCE_LINE = '\n#line 1 "kernel.cu"\n'
_TRAMP_LINE = '\n#line 1 "avi_emu_trampolines"\n'
#: Every text host_source() adds around a CUDA source (all of it enters version()).
_TU_PARTS = (_SOURCE_LINE, _TRAMP_LINE, _TRAMPOLINE, _FOOTER)


class EmulationError(RuntimeError):
    """An emulated launch returned a CUresult other than CUDA_SUCCESS."""


def kernel_names(source: str) -> list[str]:
    """Names of the ``extern "C" __global__`` kernels of a CUDA source, in order."""
    seen: dict[str, None] = {}
    for m in _KERNEL_RE.finditer(_COMMENT_RE.sub(" ", source)):
        seen.setdefault(m.group(1), None)
    return list(seen)


def host_source(source: str) -> str:
    """The translation unit the host compiler builds: prelude + source + trampolines."""
    names = kernel_names(source)
    return (PRELUDE_PATH.read_text() + _SOURCE_LINE + source + _TRAMP_LINE
            + "".join(_TRAMPOLINE.format(name=n) for n in names)
            + _FOOTER.format(abi=ABI_VERSION))


def find_cxx() -> str | None:
    """The host C++ compiler: ``$AV_INFER_CXX``, ``$CXX``, else g++ (or c++) on PATH."""
    return (os.environ.get("AV_INFER_CXX") or os.environ.get("CXX") or shutil.which("g++")
            or shutil.which("c++"))


@functools.lru_cache(maxsize=1)
def host_has_fma() -> bool:
    """x86-64 with FMA (then -mfma inlines ``fmaf``: 4x faster FP32 tiles, same bits, since
    libm's ``fmaf`` is exact and -ffp-contract=off keeps every other operation unfused)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return "fma" in line.split(":", 1)[-1].split()
    return False


@functools.lru_cache(maxsize=8)
def _cxx_version(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[0]


class HostKernelCompiler:
    """CUDA C -> host shared library (see the module docstring).

    ``arch`` is ignored (it only enters the cache key); of ``options`` only ``-D``, ``-U``,
    ``-I``, ``-O``, ``-g`` and ``-w`` reach the host compiler, the rest (NVRTC/nvcc flags)
    are dropped. ``version()`` covers the compiler, the flags, the prelude and the
    trampoline text, so a change in any of them is a cache miss. ``fma`` (default: when
    the CPU has it) adds ``-mfma``; results are the same bits either way.
    """

    name = "host-cxx"
    fmt = "emu-so"

    def __init__(self, path: str | None = None, opt: str = "-O2",
                 extra_flags: Sequence[str] = (), fma: bool | None = None) -> None:
        self.path = path or find_cxx()
        if self.path is None:
            raise OSError("no host C++ compiler found (install g++ or set AV_INFER_CXX)")
        fma = host_has_fma() if fma is None else fma
        self.flags = (*BASE_FLAGS, opt, *(("-mfma",) if fma else ()), *extra_flags)

    def version(self) -> str:
        h = hashlib.sha256()
        for part in (PRELUDE_PATH.read_text(), *_TU_PARTS, " ".join(self.flags)):
            h.update(part.encode())
            h.update(b"\0")
        return f"emu{ABI_VERSION}-{_cxx_version(self.path)}-{h.hexdigest()[:16]}"

    def compile(self, source: str, arch: str = EMU_ARCH, options: Sequence[str] = ()) -> bytes:
        opts = [o for o in options if o.startswith(_PASS_OPTS)]
        with tempfile.TemporaryDirectory(prefix="avi_emu_cc_") as d:
            src, dst = os.path.join(d, "kernel.cpp"), os.path.join(d, "kernel.so")
            Path(src).write_text(host_source(source))
            cmd = [self.path, *self.flags, *opts, "-o", dst, src]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise CompileError(f"host compiler failed ({' '.join(cmd[:3])} ...):\n"
                                   f"{r.stderr[-20000:]}")
            return Path(dst).read_bytes()


# -- loading ----------------------------------------------------------------------------------
_LAUNCH_ARGTYPES = [ctypes.c_void_p] + [ctypes.c_uint] * 7
_loaded: dict[str, ctypes.CDLL] = {}
_load_lock = threading.Lock()


def _dlopen(image: bytes) -> ctypes.CDLL:
    """The module's library, loaded once per process per image (content hash)."""
    digest = hashlib.sha256(image).hexdigest()
    with _load_lock:
        lib = _loaded.get(digest)
        if lib is None:
            fd, path = tempfile.mkstemp(prefix="avi_emu_", suffix=".so")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(image)
                lib = ctypes.CDLL(path)
            finally:
                os.unlink(path)
            _loaded[digest] = lib
    return lib


class EmuModule:
    """A loaded emulated module: ``launch(name, params, grid, block, smem) -> CUresult``."""

    def __init__(self, image: bytes) -> None:
        self.image = image
        self.lib = _dlopen(image)
        self._funcs: dict[str, Any] = {}
        ver = self.lib.avi_emu_abi_version
        ver.restype = ctypes.c_int
        self.abi_version = int(ver())
        if self.abi_version != ABI_VERSION:
            raise OSError(f"emulated module ABI {self.abi_version}, expected {ABI_VERSION}")

    def function(self, name: str) -> Any:
        fn = self._funcs.get(name)
        if fn is None:
            try:
                fn = getattr(self.lib, f"avi_emu_{name}")
            except AttributeError:
                raise KeyError(f"no kernel {name!r} in this module") from None
            fn.argtypes = _LAUNCH_ARGTYPES
            fn.restype = ctypes.c_int
            self._funcs[name] = fn
        return fn

    def set_schedule(self, mode: int, seed: int = 0) -> None:
        """Order in which the fibers of a block are resumed (all launches of this module,
        every thread): 0 thread order (default), 1 reverse, 2 a pseudo-random permutation
        every pass (``seed``). Correct kernels give the same bits under every order."""
        fn = self.lib.avi_emu_set_schedule
        fn.argtypes = [ctypes.c_int, ctypes.c_uint]
        fn.restype = None
        fn(int(mode), int(seed) & 0xFFFFFFFF)

    def param_sizes(self, name: str) -> list[int]:
        fn = getattr(self.lib, f"avi_emuparams_{name}")
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int]
        fn.restype = ctypes.c_int
        n = fn(None, 0)
        arr = (ctypes.c_ulonglong * max(n, 1))()
        fn(arr, n)
        return [int(arr[i]) for i in range(n)]

    def launch_raw(self, name: str, params: Any, grid: Sequence[int], block: Sequence[int],
                   smem: int = 0) -> int:
        """Launch with a ready ``void*[]`` (``ctypes`` array or address)."""
        fn = self.function(name)
        return int(fn(ctypes.cast(params, ctypes.c_void_p) if not isinstance(params, int)
                      else params, *(int(g) for g in grid), *(int(b) for b in block),
                      int(smem)))

    def launch(self, name: str, params: Sequence[bytes], grid: Sequence[int],
               block: Sequence[int], smem: int = 0) -> int:
        """Launch with each kernel parameter given as its raw bytes (e.g. a packed
        struct, or ``struct.pack('<Q', address)`` for a pointer); returns the CUresult."""
        bufs = [ctypes.create_string_buffer(bytes(p), max(len(p), 1)) for p in params]
        arr = (ctypes.c_void_p * max(len(bufs), 1))(*[ctypes.addressof(b) for b in bufs])
        return self.launch_raw(name, arr, grid, block, smem)


def load_module(image: bytes) -> EmuModule:
    """Load an emulated module from its ``.so`` bytes (what ``HostKernelCompiler`` made)."""
    return EmuModule(image)


_default_compiler: HostKernelCompiler | None = None


def compile_module(source: str, cache: CompileCache | None = None,
                   compiler: HostKernelCompiler | None = None) -> EmuModule:
    """Compile (through ``cache``; the default disk cache when None) and load ``source``."""
    global _default_compiler
    if compiler is None:
        if _default_compiler is None:
            _default_compiler = HostKernelCompiler()
        compiler = _default_compiler
    cache = cache if cache is not None else CompileCache()
    return EmuModule(cache.get_or_compile(compiler, source, EMU_ARCH, ()))


# -- host memory harness ------------------------------------------------------------------------
def aligned_bytes(nbytes: int, align: int = 256, fill: int = 0) -> np.ndarray:
    """A uint8 array of ``nbytes`` (at least 1) whose data starts ``align``-aligned, like a
    ``cuMemAlloc`` result."""
    n = max(int(nbytes), 1)
    raw = np.empty(n + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    out = raw[off:off + n]
    out[...] = fill
    return out


class HostPlanRun:
    """One plan's device state in host memory: weights laid out by the plan's weight
    offsets, the aux arrays, and one task arena (poisoned with ``poison`` bytes so a read
    of never-written memory shows up as NaN / garbage), plus a flag word.

    Mirrors ``CudaDevice.load_plan`` / ``_resolver`` / ``new_task``.
    """

    def __init__(self, plan: Plan, src: PlanSource, module: EmuModule,
                 poison: int = 0xFF) -> None:
        self.plan, self.src, self.module = plan, src, module
        wbufs = [b for b in plan.buffers.values() if b.role == "weight"]
        wsize = max((b.offset + b.nbytes for b in wbufs), default=0)
        self.weights = aligned_bytes(wsize)
        for b in wbufs:
            arr = np.ascontiguousarray(plan.weights[b.id]).view(np.uint8).reshape(-1)
            self.weights[b.offset:b.offset + arr.size] = arr
        self.aux = []
        for a in src.aux:
            a = np.ascontiguousarray(a)
            buf = aligned_bytes(a.nbytes)
            buf[:a.nbytes] = a.view(np.uint8).reshape(-1)
            self.aux.append(buf)
        self.arena = aligned_bytes(int(plan.arena_bytes), fill=poison)
        self.flags = aligned_bytes(32)  # 8 flag words, all clear
        self.flag_addr = int(self.flags.ctypes.data)

    def resolve(self, ref: TensorRef | AuxRef) -> int:
        return slot_address(self.plan, ref, int(self.weights.ctypes.data),
                            int(self.arena.ctypes.data), [int(a.ctypes.data) for a in self.aux])

    def view(self, name: str) -> np.ndarray:
        """The tensor ``name`` as a numpy view of the emulated device memory."""
        t = self.plan.tensors[name]
        b = self.plan.buffers[t.buffer]
        base = self.weights if b.role == "weight" else self.arena
        off = b.offset + t.byte_offset
        return base[off:off + t.nbytes].view(np.dtype(t.dtype)).reshape(t.shape)

    def set_flag(self, value: int, word: int = 0) -> None:
        self.flags.view(np.uint32)[word] = value

    def write_inputs(self, inputs: dict[str, np.ndarray]) -> None:
        for name in self.plan.inputs:
            if name not in inputs:
                raise KeyError(f"missing input {name!r} (expects {self.plan.inputs})")
        for name, value in inputs.items():
            self.view(name)[...] = np.asarray(value)

    def read_outputs(self) -> dict[str, np.ndarray]:
        return {n: self.view(n).copy() for n in self.plan.outputs}

    def pack(self, k: int) -> bytes:
        """Kernel ``k``'s argument struct with every pointer resolved (``new_task``)."""
        return self.src.specs[k].pack(self.resolve)

    def launch(self, k: int, flag_addr: int | None = None) -> int:
        """Launch kernel ``k`` as the dispatcher does (params: flag pointer, struct)."""
        spec = self.src.specs[k]
        flag = self.flag_addr if flag_addr is None else int(flag_addr)
        return self.module.launch(spec.func, [struct.pack("<Q", flag), self.pack(k)],
                                  spec.grid, spec.block, spec.smem)

    def run(self, first: int = 0, last: int | None = None) -> None:
        last = len(self.src.specs) - 1 if last is None else last
        for k in range(first, last + 1):
            rc = self.launch(k)
            if rc != 0:
                spec = self.src.specs[k]
                raise EmulationError(f"kernel {k} ({spec.func}) of {self.plan.name}: "
                                     f"CUresult {rc}")


def run_plan_emulated(plan: Plan, inputs: dict[str, np.ndarray], *, tf32: bool = False,
                      cache: CompileCache | None = None,
                      compiler: HostKernelCompiler | None = None) -> dict[str, np.ndarray]:
    """Run every kernel of ``plan`` through the emulated CUDA kernels; the outputs."""
    src = build_plan_source(plan, tf32=tf32)
    module = compile_module(src.source, cache, compiler)
    run = HostPlanRun(plan, src, module)
    run.write_inputs(inputs)
    run.run()
    return run.read_outputs()
