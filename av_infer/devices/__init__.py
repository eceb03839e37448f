"""av_infer.devices: the Device interface and its implementations (cpu, sim, cuda, and
cuda-emu: the cuda device on the CPU emulator, docs/cuda_emu.md).

``make_device`` is the one place that maps a name to a device class, so the Runtime, the
CLI and the benches accept the same names.
"""

from __future__ import annotations

from typing import Any

from av_infer.devices.base import Completion, Device, ResetInfo
from av_infer.errors import DeviceUnavailableError, InvalidParameterError

DEVICE_NAMES = ("cpu", "sim", "cuda", "cuda-emu")


def device_class(name: str) -> type[Device]:
    """The device class for a name, without constructing it (nothing touches a GPU)."""
    name = str(name).strip().lower()
    if name == "cpu":
        from av_infer.devices.cpu import CpuDevice

        return CpuDevice
    if name == "sim":
        from av_infer.devices.sim import SimDevice

        return SimDevice
    if name in ("cuda", "cuda-emu"):
        try:
            from av_infer.devices.cuda import CudaDevice, EmulatedCudaDevice
        except ImportError as e:
            raise DeviceUnavailableError(
                f"the cuda device is not available in this build/machine ({e}); "
                "use device='cpu' or device='sim'"
            ) from e
        return CudaDevice if name == "cuda" else EmulatedCudaDevice
    raise InvalidParameterError(
        f"unknown device {name!r}; choose one of {', '.join(DEVICE_NAMES)} "
        "or pass a Device instance"
    )


def make_device(name_or_device: str | Device, **kw: Any) -> Device:
    """A device from its name (``"cpu"``, ``"sim"``, ``"cuda"``) or the device itself.

    Keyword arguments go to the device's constructor (e.g. ``c``, or the simulator's
    ``gpu``/``profiles``/``seed``).
    """
    if isinstance(name_or_device, Device):
        if kw:
            raise InvalidParameterError(
                f"device options {sorted(kw)} given with a device instance; "
                "configure the instance instead"
            )
        return name_or_device
    return device_class(name_or_device)(**kw)


__all__ = ["Completion", "Device", "DeviceUnavailableError", "ResetInfo", "device_class",
           "make_device"]
