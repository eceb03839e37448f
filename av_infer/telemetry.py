"""GPU facts through NVML (nvidia-ml-py): name, memory, utilisation, clocks.

Why separate from the device: benches and the CLI want these numbers without creating a
CudaDevice, and NVML works (or fails) independently of CUDA contexts. Never raises:
without NVML or a GPU the answer is ``{"available": False, "reason": ...}``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["gpu_telemetry"]


def gpu_telemetry(index: int = 0) -> dict[str, Any]:
    """NVML snapshot of GPU ``index``; ``{"available": False, "reason": ...}`` when unavailable."""
    try:
        import pynvml
    except ImportError as e:
        return {"available": False, "reason": f"nvidia-ml-py not installed ({e})"}
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return {"available": False, "reason": f"NVML unavailable: {e}"}
    try:
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as e:  # noqa: BLE001
            return {"available": False, "reason": f"no GPU {index}: {e}"}
        out: dict[str, Any] = {"available": True, "index": index}

        def put(key: str, fn: Any) -> None:
            try:
                out[key] = fn()
            except Exception as e:  # noqa: BLE001 - a field unsupported on this GPU (Orin)
                out.setdefault("unsupported", {})[key] = str(e)

        def name() -> str:
            n = pynvml.nvmlDeviceGetName(h)
            return n.decode() if isinstance(n, bytes) else str(n)

        put("name", name)
        put("driver", lambda: str(pynvml.nvmlSystemGetDriverVersion()))
        mem = None
        try:
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        except Exception as e:  # noqa: BLE001
            out.setdefault("unsupported", {})["memory"] = str(e)
        if mem is not None:
            out["memory_total_bytes"] = int(mem.total)
            out["memory_used_bytes"] = int(mem.used)
            out["memory_free_bytes"] = int(mem.free)
        put("utilization_gpu_pct", lambda: int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
        put("utilization_mem_pct", lambda: int(pynvml.nvmlDeviceGetUtilizationRates(h).memory))
        put("clock_sm_mhz", lambda: int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)))
        put("clock_mem_mhz", lambda: int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)))
        put("clock_sm_max_mhz",
            lambda: int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)))
        put("temperature_c",
            lambda: int(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)))
        put("power_w", lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0)
        return out
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
