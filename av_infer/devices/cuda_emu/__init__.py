"""CPU emulation of the CUDA device (docs/cuda_emu.md).

Why: this project's GPU code was written where no GPU could be had. The emulator runs the
generated CUDA C kernels, the Cython dispatcher and ``CudaDevice`` itself on the CPU
(``CudaDevice(emulate=True)``), so their logic is executed and checked in CI. It proves
nothing about speed or about the GPU's own behaviour.
"""

from __future__ import annotations

import os
import shutil

__all__ = ["emulator_availability"]


def emulator_availability() -> tuple[bool, str]:
    """(usable, reason): the emulator needs a C compiler (driver) and a C++ one (kernels)."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cc or not cxx:
        return False, "no host C/C++ compiler (gcc/g++, or set CC/CXX) for the CUDA emulator"
    return True, "ok"
