"""Build ``libavi_cuda_emu.so``, the driver half of the CUDA emulator (docs/cuda_emu.md §2).

``driver.c`` is compiled with the host C compiler (``$CC``, else gcc/cc on PATH) into a
cache directory, keyed by the SHA-256 of the source and the compiler's version, written
atomically (temp file + ``os.replace``) and reused when present. The library exports the
CUDA driver entry points that ``av_infer/_cy/cuda_dispatch.pyx`` (``load_driver``) and
``CudaDevice`` resolve; its semantics and deviations from CUDA are documented at the top of
``driver.c``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["DRIVER_SOURCE", "DriverBuildError", "build_driver", "find_cc"]

#: The C source of the emulated driver.
DRIVER_SOURCE = Path(__file__).with_name("driver.c")
#: The emulated cuBLASLt / cuDNN entry points, ``#include``d at the end of driver.c (one
#: library: the vendor ops enqueue on the driver's own emulated streams).
VENDOR_SOURCE = Path(__file__).with_name("vendor_emu.c")
#: CUDA graphs with conditional nodes (a sequential executor), ``#include``d after it.
GRAPH_SOURCE = Path(__file__).with_name("graph_emu.c")
#: Compiler flags (before the output and the source); ``-ldl`` goes last. ``-Bsymbolic``:
#: the library's own calls to its exported entry points bind to itself. Without it, a
#: second copy loaded in a process where another was opened ``RTLD_GLOBAL`` (the vendor
#: path opens the driver as its cuBLASLt/cuDNN that way) ran its calls in the first copy:
#: a kernel failure on one copy's stream was recorded in the other's last error.
CFLAGS = ("-O2", "-std=c11", "-shared", "-fPIC", "-pthread", "-Wl,-Bsymbolic")
LIBS = ("-ldl", "-lm")
LIB_STEM = "libavi_cuda_emu"


class DriverBuildError(RuntimeError):
    """The host C compiler failed on driver.c; the message carries its output."""


def find_cc() -> str | None:
    """The host C compiler: ``$CC`` (a command line, e.g. ``gcc -m64``), else ``gcc`` or
    ``cc`` on PATH; None if there is none."""
    env = os.environ.get("CC", "").strip()
    if env:
        return env
    return shutil.which("gcc") or shutil.which("cc")


@functools.lru_cache(maxsize=8)
def _cc_version(cc: str) -> str:
    try:
        out = subprocess.run([*shlex.split(cc), "--version"], capture_output=True, text=True,
                             check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise DriverBuildError(f"cannot run the C compiler {cc!r}: {e}") from e
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else cc


def _default_dir() -> Path:
    from av_infer.kernels.cuda_compile import default_cache_dir

    return default_cache_dir() / "emu"


def build_driver(cache_dir: str | os.PathLike[str] | None = None,
                 defines: tuple[str, ...] = ()) -> Path:
    """Path of the built ``libavi_cuda_emu.so`` (compiled on a cache miss).

    ``cache_dir`` defaults to ``default_cache_dir()/emu`` (``$AV_INFER_CUDA_CACHE`` or
    ``~/.cache/av_infer/cuda``). ``defines``: preprocessor names for a variant of the
    driver (tests: ``AVI_EMU_NO_CAPTURE_TO_GRAPH`` builds a driver without
    ``cuStreamBeginCaptureToGraph``, as one older than CUDA 12.3); part of the cache key.
    Raises :class:`DriverBuildError` without a C compiler or when the compiler fails (the
    message names the compiler and quotes its output).
    """
    for d in defines:
        if not d.isidentifier():
            raise ValueError(f"not a preprocessor name: {d!r}")
    dflags = tuple(f"-D{d}" for d in sorted(defines))
    cc = find_cc()
    if cc is None:
        raise DriverBuildError("no host C compiler for the CUDA emulator driver "
                               "(install gcc or set CC)")
    source = (DRIVER_SOURCE.read_bytes() + b"\0" + VENDOR_SOURCE.read_bytes() + b"\0"
              + GRAPH_SOURCE.read_bytes())
    version = _cc_version(cc)
    h = hashlib.sha256()
    for part in (source, cc.encode(), version.encode(),
                 " ".join(CFLAGS + dflags + LIBS).encode()):
        h.update(part)
        h.update(b"\0\1")
    out_dir = Path(cache_dir) if cache_dir is not None else _default_dir()
    target = out_dir / f"{LIB_STEM}-{h.hexdigest()[:24]}.so"
    if target.is_file():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{LIB_STEM}-", suffix=".so.tmp", dir=out_dir)
    os.close(fd)
    try:
        cmd = [*shlex.split(cc), *CFLAGS, *dflags, "-o", tmp, str(DRIVER_SOURCE), *LIBS]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as e:
            raise DriverBuildError(f"{' '.join(cmd)} could not run: {e}") from e
        if res.returncode != 0:
            log = (res.stdout + res.stderr).strip()
            raise DriverBuildError(
                f"building the CUDA emulator driver failed ({cc}, exit {res.returncode}):\n"
                f"$ {' '.join(cmd)}\n{log}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
