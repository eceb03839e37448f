"""CUDA C -> binary: compilers are pure functions, the disk cache is a layer on top.

Why two layers (STYLE.md, CuPy's ``_compiler_cache``): a compiler only maps
``(source, arch, options) -> bytes`` and can be swapped (NVRTC on a GPU machine, nvcc in
CI, a fake in tests); the cache keys every input that changes the output (source,
options, architecture, the compiler's name and version, a format version) and writes
files atomically (temp file + ``os.replace``) behind a SHA-256 checksum, so a torn or
corrupt file reads as a miss, never as a bad module.

NVRTC is loaded with ctypes from ``libnvrtc.so.*`` (pip wheels of CUDA 12/13, the CUDA
toolkit, or ``$AV_INFER_NVRTC``): importing this module never touches CUDA.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

__all__ = [
    "CACHE_FORMAT_VERSION",
    "CompileCache",
    "CompileError",
    "Compiler",
    "NvccCompiler",
    "NvrtcCompiler",
    "cache_key",
    "default_cache_dir",
    "find_nvrtc",
]

#: Bump when the cache file layout or the meaning of a key changes.
CACHE_FORMAT_VERSION = 1
_MAGIC = b"AVICUBIN"


class CompileError(RuntimeError):
    """The CUDA compiler rejected a source; the message carries its log."""


class Compiler(Protocol):
    """``compile(source, arch, options) -> bytes`` (cubin for arch ``sm_XY``, or PTX)."""

    name: str
    fmt: str  # "cubin" | "ptx"

    def version(self) -> str: ...

    def compile(self, source: str, arch: str, options: Sequence[str] = ()) -> bytes: ...


# -- NVRTC (ctypes) ---------------------------------------------------------------------------
def find_nvrtc() -> str | None:
    """Path of a loadable libnvrtc, or None. Order: $AV_INFER_NVRTC, pip wheels, toolkit."""
    env = os.environ.get("AV_INFER_NVRTC")
    if env:
        return env
    cands: list[str] = []
    for base in sys.path:
        cands += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libnvrtc.so*")))
        cands += sorted(glob.glob(os.path.join(base, "nvidia", "cu*", "lib", "libnvrtc.so*")))
    for root in ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/*/lib",
                 "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"):
        cands += sorted(glob.glob(os.path.join(root, "libnvrtc.so*")))
    cands = [c for c in cands if "builtins" not in c and "alt" not in os.path.basename(c)]
    found = ctypes.util.find_library("nvrtc")
    if found:
        cands.append(found)
    return cands[-1] if cands else None


class NvrtcCompiler:
    """NVRTC through ctypes: cubin for ``sm_XY`` (``fmt='cubin'``) or PTX."""

    name = "nvrtc"

    def __init__(self, fmt: str = "cubin", path: str | None = None) -> None:
        self.fmt = fmt
        path = path or find_nvrtc()
        if path is None:
            raise OSError("libnvrtc not found (install cuda-python/cupy-cuda13x wheels or set "
                          "AV_INFER_NVRTC)")
        self.path = path
        self._lib = ctypes.CDLL(path)
        L = self._lib
        L.nvrtcGetErrorString.restype = ctypes.c_char_p
        L.nvrtcCreateProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                                         ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p,
                                         ctypes.c_void_p]
        L.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                          ctypes.POINTER(ctypes.c_char_p)]
        for fn in ("nvrtcGetProgramLogSize", "nvrtcGetCUBINSize", "nvrtcGetPTXSize"):
            getattr(L, fn).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        for fn in ("nvrtcGetProgramLog", "nvrtcGetCUBIN", "nvrtcGetPTX"):
            getattr(L, fn).argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        L.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = self._lib.nvrtcGetErrorString(rc).decode()
            raise CompileError(f"{what}: {msg}")

    def version(self) -> str:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self._lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "version")
        return f"nvrtc-{major.value}.{minor.value}"

    def compile(self, source: str, arch: str, options: Sequence[str] = ()) -> bytes:
        L = self._lib
        prog = ctypes.c_void_p()
        self._check(L.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"av_infer.cu", 0,
                                         None, None), "nvrtcCreateProgram")
        try:
            target = arch if self.fmt == "cubin" else arch.replace("sm_", "compute_")
            opts = [f"--gpu-architecture={target}", "--std=c++17", *options]
            arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            rc = L.nvrtcCompileProgram(prog, len(opts), arr)
            n = ctypes.c_size_t()
            L.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
            log = ctypes.create_string_buffer(n.value)
            L.nvrtcGetProgramLog(prog, log)
            if rc != 0:
                text = log.value.decode(errors="replace")
                raise CompileError(f"NVRTC failed for {arch}:\n{text}")
            size_fn, get_fn = (("nvrtcGetCUBINSize", "nvrtcGetCUBIN") if self.fmt == "cubin"
                               else ("nvrtcGetPTXSize", "nvrtcGetPTX"))
            self._check(getattr(L, size_fn)(prog, ctypes.byref(n)), size_fn)
            out = ctypes.create_string_buffer(n.value)
            self._check(getattr(L, get_fn)(prog, out), get_fn)
            return out.raw
        finally:
            L.nvrtcDestroyProgram(ctypes.byref(prog))


# -- nvcc (subprocess): CI without a GPU, and a fallback where NVRTC is missing ----------------
def find_nvcc() -> str | None:
    return os.environ.get("AV_INFER_NVCC") or shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
    )


class NvccCompiler:
    """``nvcc -cubin`` / ``--ptx`` on a temp file."""

    name = "nvcc"

    def __init__(self, fmt: str = "cubin", path: str | None = None) -> None:
        self.fmt = fmt
        self.path = path or find_nvcc()
        if self.path is None:
            raise OSError("nvcc not found")

    def version(self) -> str:
        out = subprocess.run([self.path, "--version"], capture_output=True, text=True, check=True)
        return "nvcc-" + out.stdout.strip().splitlines()[-1]

    def compile(self, source: str, arch: str, options: Sequence[str] = ()) -> bytes:
        with tempfile.TemporaryDirectory(prefix="avi_nvcc_") as d:
            src, dst = os.path.join(d, "k.cu"), os.path.join(d, "k.out")
            Path(src).write_text(source)
            flag = "-cubin" if self.fmt == "cubin" else "--ptx"
            cmd = [self.path, f"-arch={arch}", flag, "-std=c++17", *options, "-o", dst, src]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise CompileError(f"nvcc failed for {arch}:\n{r.stderr}")
            return Path(dst).read_bytes()


# -- the cache layer ----------------------------------------------------------------------------
def default_cache_dir() -> Path:
    base = os.environ.get("AV_INFER_CUDA_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "av_infer", "cuda"
    )
    return Path(base)


def cache_key(source: str, arch: str, options: Sequence[str], compiler_id: str, fmt: str) -> str:
    """SHA-256 over every input that changes the binary."""
    h = hashlib.sha256()
    for part in (f"v{CACHE_FORMAT_VERSION}", compiler_id, fmt, arch, "\0".join(options), source):
        h.update(part.encode())
        h.update(b"\0\1")
    return h.hexdigest()


class CompileCache:
    """Disk cache of compiled modules: ``get_or_compile(compiler, source, arch, options)``.

    File layout: MAGIC | sha256(payload) (32 bytes) | payload. A bad magic, a short file
    or a checksum mismatch is a miss (and the file is recompiled and rewritten).
    """

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self.dir = Path(directory) if directory is not None else default_cache_dir()
        self.hits = 0
        self.misses = 0

    def path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.bin"

    def load(self, key: str) -> bytes | None:
        try:
            raw = self.path(key).read_bytes()
        except OSError:
            return None
        if len(raw) < len(_MAGIC) + 32 or not raw.startswith(_MAGIC):
            return None
        digest, payload = raw[len(_MAGIC):len(_MAGIC) + 32], raw[len(_MAGIC) + 32:]
        if hashlib.sha256(payload).digest() != digest:
            return None
        return payload

    def store(self, key: str, payload: bytes) -> Path:
        p = self.path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-", suffix=".bin")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return p

    def get_or_compile(self, compiler: Compiler, source: str, arch: str,
                       options: Sequence[str] = ()) -> bytes:
        key = cache_key(source, arch, options, compiler.version(), compiler.fmt)
        hit = self.load(key)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        payload = compiler.compile(source, arch, options)
        self.store(key, payload)
        return payload


def default_compiler(fmt: str = "cubin") -> Compiler:
    """NVRTC when loadable, else nvcc; raises OSError naming both when neither is found."""
    try:
        return NvrtcCompiler(fmt)
    except OSError as e1:
        try:
            return NvccCompiler(fmt)
        except OSError as e2:
            raise OSError(f"no CUDA compiler: {e1}; {e2}") from e2
