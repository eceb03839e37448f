"""How the runtime host builds its Runtime: which devices a live ROS graph may run on,
``device=auto``'s choice with its reason, the cpu device options from the ``cpu_*``
parameters, where a ``models`` entry comes from (zoo name or ONNX path), and the one
check of what a node asks of its models (precision, pin) against a runtime that may
already hold them (``check_models``: the host's ``models`` and the image nodes' ``model``).

ROS-free apart from the package it lives in: nothing here creates a node, so the
construction rules are tested without a graph (tests/nodes/test_nodes_runtime_api.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import av_infer
from av_infer import (
    DEVICE_NAMES,
    POLICIES,
    AvInferError,
    DeviceUnavailableError,
    InvalidParameterError,
    ModelNameInUseError,
    UnknownModelError,
    device_class,
)


def _wall_clock(name: str) -> bool:
    """A device whose time passes by itself. The simulator runs in virtual time that only
    its caller advances (``av-infer bench --device sim``): a node on it would never answer
    a request. A device that cannot load here (no CUDA build) is still a wall-clock one."""
    try:
        return not device_class(name).virtual
    except AvInferError:
        return True


#: what the ``device`` parameter accepts: auto and the wall-clock devices
DEVICES = ("auto", *(d for d in DEVICE_NAMES if _wall_clock(d)))


def policy_names() -> tuple[str, ...]:
    """The runtime's policy table (``av_infer.POLICIES``)."""
    return tuple(POLICIES)


def check_policy(name: str, runtime: Any = None) -> str | None:
    """None if ``name`` is a usable policy (on ``runtime``'s device, when given: reef_dkp
    needs padded launches, which the cpu device refuses), else the reason it is not."""
    if runtime is not None:
        return runtime.policy_unavailable(name)
    try:
        av_infer.get_policy(name)
    except InvalidParameterError as exc:
        return str(exc)
    return None


def check_live_device(device: str) -> None:
    """InvalidParameterError with the reason for a device a live ROS graph cannot run on
    (one in virtual time); unknown names are left to ``Runtime``, which names the choices."""
    if device != "auto" and not _wall_clock(device):
        raise InvalidParameterError(
            f"device {device!r} runs in virtual time, advanced only by its caller, so a ROS "
            f"node on it would never answer; choose one of {', '.join(DEVICES)} (the "
            "simulator is for benchmarks: av-infer bench --device sim)")


def make_runtime(device: str, cpu_options: dict[str, Any] | None = None,
                 **kwargs: Any) -> tuple[Any, str, str]:
    """Builds a Runtime; returns (runtime, device name, why that device).

    ``device="auto"`` takes cuda when a GPU is usable and falls back to cpu only when it
    is not (``DeviceUnavailableError``: no GPU, driver, CuPy or built dispatcher); the
    reason says so. Any other error (a bad policy, c, option: ``InvalidParameterError``
    and the rest) propagates, so a configuration error is never hidden behind a cpu
    fallback. ``cpu_options``: device options used when the device is the cpu (e.g.
    rt_priority).
    """
    check_live_device(device)
    cpu = {"device_options": dict(cpu_options)} if cpu_options else {}
    if device != "auto":
        extra = cpu if device == "cpu" else {}
        return av_infer.Runtime(device=device, **kwargs, **extra), device, "requested"
    try:
        return av_infer.Runtime(device="cuda", **kwargs), "cuda", "auto: a CUDA GPU is usable"
    except DeviceUnavailableError as exc:
        why = f"auto: no usable GPU ({exc}); fell back to cpu"
    return av_infer.Runtime(device="cpu", **kwargs, **cpu), "cpu", why


def cpu_options(p: dict[str, Any]) -> dict[str, Any]:
    """The ``cpu_*`` parameters as cpu device options (``CpuDevice``; used when the
    device is the cpu, validated there: a refused value fails configure with its reason).
    ``cpu_rt_parallel`` 0 leaves the device's default (one RT lane per core)."""
    out: dict[str, Any] = {"rt_priority": p["cpu_rt_priority"], "be_nice": p["cpu_be_nice"]}
    if p["cpu_rt_parallel"] != 0:
        out["rt_parallel"] = p["cpu_rt_parallel"]
    return out


def model_source(entry: str, variant: str) -> tuple[str, Any]:
    """A ``models`` entry -> (runtime model name, source): zoo names or ONNX paths."""
    p = Path(entry).expanduser()
    if entry.endswith(".onnx") or p.suffix == ".onnx" or p.exists():
        return p.stem, str(p)
    from av_infer import zoo_names, zoo_path

    if entry not in zoo_names():
        raise ValueError(f"{entry!r} is neither an ONNX file nor a zoo model "
                         f"({', '.join(zoo_names())})")
    return entry, zoo_path(entry, variant)


def check_models(runtime: Any, wanted: Mapping[str, tuple[str | None, bool | None]],
                 params: str, name_of: Callable[[str], str] = str) -> None:
    """The one check of what a node asks of its models against the runtime it loads them
    into, called before any of them loads, so a refusal leaves nothing loaded.

    ``wanted``: entry -> (precision, pin), each None for "whatever the runtime holds"
    (an image node with ``precision`` auto; image nodes name no pin); ``name_of``: an
    entry's model name in the runtime (looked up only after the first check passed);
    ``params``: the parameters the refusal names. Raises InvalidParameterError naming
    every entry whose precision ``runtime``'s device does not run
    (``Runtime.precision_unavailable``); then ModelNameInUseError (a subclass, code
    ``name_in_use``) naming every entry whose model the runtime already holds with other
    settings (``held_difference``: another precision, pinned where unpinned was asked or
    the reverse): a runtime shared in the container holds one plan per model name, so
    serving it would silently run with the settings of whichever node loaded it first."""
    bad = [f"{entry}: {why}" for entry, (prec, _pin) in wanted.items()
           if prec is not None and (why := runtime.precision_unavailable(prec))]
    if bad:
        raise InvalidParameterError("; ".join(bad) + f" (parameters {params})")
    held = [(entry, name, diff) for entry, (prec, pin) in wanted.items()
            if (diff := held_difference(runtime, name := name_of(entry), prec, pin))]
    if held:
        raise ModelNameInUseError(
            "; ".join(f"{entry}: model {name!r} is already loaded in this runtime {have}, "
                      f"not {want}" for entry, name, (have, want) in held)
            + f" (parameters {params}; a runtime holds one plan per model name, at one "
              "precision, pinned or not: ask for what it holds, or load the file under "
              "another name)")


def check_precisions(runtime: Any, wanted: dict[str, str], variant: str = "scaled",
                     pinned: Collection[str] | None = None) -> None:
    """``check_models`` for the runtime host's ``models`` entries: entry -> precision
    (``runtime_params.model_precisions``), each pinned iff in ``pinned`` (the
    ``pinned_models`` parameter; None: pins not compared)."""
    check_models(runtime, {e: (prec, None if pinned is None else e in pinned)
                           for e, prec in wanted.items()},
                 "precision, model_precisions" + ("" if pinned is None else ", pinned_models"),
                 name_of=lambda entry: model_source(entry, variant)[0])


def held_settings(runtime: Any, name: str) -> tuple[str, bool] | None:
    """(precision, pinned) of the model ``name`` that ``runtime`` holds (``Plan.precision``,
    ``ModelInfo.pinned``); None when it holds none of that name."""
    if name not in runtime.models():
        return None
    try:
        info = runtime.model_info(name)
    except UnknownModelError:  # unloaded meanwhile
        return None
    return str(info.plan.precision), bool(info.pinned)


def held_precision(runtime: Any, name: str) -> str | None:
    """The precision of the model ``name`` that ``runtime`` holds; None when none."""
    held = held_settings(runtime, name)
    return None if held is None else held[0]


def held_difference(runtime: Any, name: str, precision: str | None,
                    pin: bool | None) -> tuple[str, str] | None:
    """How the model ``name`` that ``runtime`` holds differs from what was asked
    (``precision``, ``pin``; None: not asked): (what it holds, what was asked) as words,
    e.g. ("at tf32 and pinned", "fp16 and unpinned"); None when it holds no such model or
    holds it as asked."""
    held = held_settings(runtime, name)
    if held is None:
        return None
    have: list[str] = []
    want: list[str] = []
    if precision is not None and held[0] != precision:
        have.append(f"at {held[0]}")
        want.append(precision)
    if pin is not None and held[1] != pin:
        have.append(_pinned(held[1]))
        want.append(_pinned(pin))
    return (" and ".join(have), " and ".join(want)) if have else None


def _pinned(pin: bool) -> str:
    return "pinned" if pin else "unpinned"
