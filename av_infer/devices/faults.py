"""Fault injection: the reliability suite's test hook into a device.

Why: "a segment fails mid-task", "a model load fails", "out of memory at load", "a lane
thread dies" must each be answered with a typed error while every other client keeps
being served (issue 16). Real faults are rare and unrepeatable; this hook makes a chosen
device operation fail at a chosen point, on every device the same way, so one test can
run against ``cpu``, ``sim`` and ``cuda-emu``.

Guarantees: a device with no injector (``Device.faults is None``, the default) pays one
attribute read per hook point. Rules fire in the order added; each fires ``times`` times
and then is spent. ``check`` is thread-safe (lanes and the scheduler call it at once).

Hook points (``where``), and what the device does when one fires:

* ``"kernel"``: a launch of ``model``'s kernel/segment ``kernel`` (any if None) raises
  before it runs; the device records it as the task's error (``read_outputs`` raises
  DeviceFaultError), as it does for a real failing launch.
* ``"load"``: ``load_plan`` of ``model`` raises ModelLoadError.
* ``"oom"``: ``load_plan`` of ``model`` raises ModelTooLargeError (out of device memory).
* ``"lane"``: the host thread that runs ``model``'s launches dies (cpu: the lane thread
  raises outside its per-launch handler); the device must notice, fail the launches it
  held and keep serving.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from av_infer.errors import InvalidParameterError, ModelLoadError, ModelTooLargeError

__all__ = ["FAULT_POINTS", "FaultInjector", "InjectedFault"]

FAULT_POINTS = ("kernel", "load", "oom", "lane")


class InjectedFault(RuntimeError):
    """The exception a fired rule raises (devices wrap it in their typed error)."""


@dataclass
class _Rule:
    where: str
    model: str | None
    kernel: int | None
    times: int
    fired: int = 0


class FaultInjector:
    """A list of rules a device consults at its hook points (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []

    def add(self, where: str, model: str | None = None, kernel: int | None = None,
            times: int = 1) -> None:
        """Fail the next ``times`` operations at ``where`` matching ``model``/``kernel``."""
        if where not in FAULT_POINTS:
            raise InvalidParameterError(
                f"fault point must be one of {', '.join(FAULT_POINTS)}, got {where!r}")
        if not isinstance(times, int) or times < 1:
            raise InvalidParameterError(f"times must be an int >= 1, got {times!r}")
        with self._lock:
            self._rules.append(_Rule(where, model, kernel, times))

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def check(self, where: str, model: str | None = None, kernel: int | None = None) -> None:
        """Raise InjectedFault if a live rule matches this operation (and spend it)."""
        if not self._rules:
            return
        with self._lock:
            for r in self._rules:
                if (r.where == where and r.fired < r.times
                        and (r.model is None or r.model == model)
                        and (r.kernel is None or r.kernel == kernel)):
                    r.fired += 1
                    raise InjectedFault(
                        f"injected {where} fault"
                        + (f" in {model}" if model is not None else "")
                        + (f" kernel {kernel}" if kernel is not None else ""))

    def check_load(self, model: str, device: str) -> None:
        """The ``"load"``/``"oom"`` hook points of ``load_plan``, raised typed
        (ModelLoadError / ModelTooLargeError), as every device reports them."""
        try:
            self.check("load", model)
        except InjectedFault as e:
            raise ModelLoadError(
                f"model {model!r} failed to load on the {device} device: {e}") from e
        try:
            self.check("oom", model)
        except InjectedFault as e:
            raise ModelTooLargeError(
                f"model {model!r} does not fit the {device} device's memory: {e}") from e

    def fired(self) -> dict[str, int]:
        """How many times each hook point fired so far."""
        out: dict[str, int] = {}
        with self._lock:
            for r in self._rules:
                out[r.where] = out.get(r.where, 0) + r.fired
        return out
