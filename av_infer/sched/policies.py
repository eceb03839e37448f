# cython: annotation_typing=False, language_level=3
"""The scheduling policies, in one table: what each one does, so the scheduler has no
policy-name ``if`` chains and comparisons stay honest (docs/design.md "Policies").

Every policy runs RT requests one at a time in EDF order (optionally switched at kernel
boundaries, ``edf_preempt``); they differ in how BE work shares the device with RT work.

Compiled where built (``policies.pxd``; av_infer/_cy/compiled.py): ``Policy`` is a
``cdef class`` the scheduler reads as C fields; the ``.py`` is the one source and runs
interpreted where it is not built (``AV_INFER_INTERPRETED=1``).
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import Any, Literal

import cython

from av_infer.errors import InvalidParameterError

__all__ = ["FIELDS", "POLICIES", "Policy", "PreemptKind", "device_refuses", "get_policy"]

#: How RT arrival treats running BE tasks.
#: ``none``: BE keeps running; ``wait``: REEF §7.3's wait-based baseline "with lazy
#: eviction and no limit on launched kernels": the flag is raised, and RT starts once every
#: launched BE kernel ran or was fetched and evicted itself (linear in what was launched);
#: ``reset``: REEF-N reset-based preemption (vHQ
#: reset + preemption flag: the <= c launched BE kernels finish or evict themselves at
#: their flag check; BE is restored from the restore point). RT starts at once on the
#: high-priority stream, or — with the scheduler's ``preempt_drain`` — after those <= c
#: launches drained (REEF-N's literal order; what makes Fig. 15a grow with c).
PreemptKind = Literal["none", "wait", "reset"]

_set = object.__setattr__

#: the policy's fields, in constructor order (what ``==``, ``hash`` and ``repr`` cover)
FIELDS = ("name", "accepts_be", "exclusive", "rt_high_priority", "preempt", "be_unbounded",
          "available", "padding", "doc")


class Policy:
    """One scheduling policy: a frozen value.

    ``accepts_be``: False: BE submits are rejected (RejectedError); ``exclusive``: one
    task at a time on the whole device (RT first); ``rt_high_priority``: RT on the
    device's high-priority stream, else a plain one; ``preempt``: what an RT arrival does
    to running BE (``PreemptKind``); ``be_unbounded``: BE streams transmit without the c
    bound (wait-based baseline); ``padding``: RT launches padded with blocks of preempted
    BE tasks (DKP).

    Derived once, read by the scheduler on every decision (not compared, not in the
    ``repr``): ``be_concurrent_with_rt`` (BE tasks may start or continue while RT work is
    queued or running), ``preempts`` (``preempt != "none"``), ``waits`` (``preempt ==
    "wait"``).

    Compiled where built (``policies.pxd``, Cython's pure-Python mode,
    av_infer/_cy/compiled.py): a ``cdef class`` with C fields that the compiled scheduler
    (``scheduler.pxd`` cimports it) holds typed and reads as struct members, so the
    scheduler keeps no copies of them. What the frozen slotted dataclass it replaces gave
    is kept in both forms: the constructor (positions, keywords, defaults), field-wise
    ``==`` and ``hash``, the ``repr``, assignment refused with
    ``dataclasses.FrozenInstanceError``, pickling. Not kept: ``dataclasses.fields``/
    ``replace``/``asdict`` (nothing used them; ``FIELDS`` names the fields in order).
    """

    def __init__(self, name: str, accepts_be: bool, exclusive: bool, rt_high_priority: bool,
                 preempt: PreemptKind, be_unbounded: bool, available: bool = True,
                 padding: bool = False, doc: str = "") -> None:
        concurrent = bool(accepts_be and not exclusive and preempt == "none")
        if cython.compiled:  # C fields: written here, read-only from Python
            self.name = name
            self.accepts_be = accepts_be
            self.exclusive = exclusive
            self.rt_high_priority = rt_high_priority
            self.preempt = preempt
            self.be_unbounded = be_unbounded
            self.available = available
            self.padding = padding
            self.doc = doc
            self.be_concurrent_with_rt = concurrent
            self.preempts = preempt != "none"
            self.waits = preempt == "wait"
        else:  # interpreted: one __dict__ write past the refusing __setattr__
            _set(self, "__dict__", {
                "name": name, "accepts_be": bool(accepts_be), "exclusive": bool(exclusive),
                "rt_high_priority": bool(rt_high_priority), "preempt": preempt,
                "be_unbounded": bool(be_unbounded), "available": bool(available),
                "padding": bool(padding), "doc": doc, "be_concurrent_with_rt": concurrent,
                "preempts": preempt != "none", "waits": preempt == "wait"})

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def _key(self) -> tuple:
        return (self.name, self.accepts_be, self.exclusive, self.rt_high_priority,
                self.preempt, self.be_unbounded, self.available, self.padding, self.doc)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Policy):
            return NotImplemented
        return self._key() == other._key()

    def __ne__(self, other: object) -> bool:
        if not isinstance(other, Policy):
            return NotImplemented
        return self._key() != other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return "Policy(" + ", ".join(f"{n}={v!r}" for n, v in zip(FIELDS, self._key())) + ")"

    def __reduce__(self) -> tuple:
        return (Policy, self._key())


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("rt_only", False, False, True, "none", False,
               doc="RT alone (the latency reference); BE is rejected."),
        Policy("seq", True, True, False, "none", False,
               doc="One task at a time, RT first (EDF), then BE round-robin; no preemption."),
        Policy("streams", True, False, False, "none", False,
               doc="RT and BE concurrently on plain streams of equal priority."),
        Policy("prio_streams", True, False, True, "none", False,
               doc="As streams, RT on the highest stream priority (the CPU device cannot "
               "honour stream priorities; sim and cuda do)."),
        Policy("wait", True, False, True, "wait", True,
               doc="Wait-based preemption (REEF §7.3 baseline): BE launches unbounded; on RT "
               "arrival raise the flag and start RT once every launched BE kernel ran or "
               "evicted itself; BE restored from what completed."),
        Policy("reef", True, False, True, "reset", False,
               doc="REEF-N: vHQ reset + preemption flag, RT on the high-priority stream "
               "(at once, or after the <= c launched BE kernels drained with "
               "preempt_drain), BE restored from max(done, k_l - c)."),
        Policy("reef_dkp", True, False, True, "reset", False, padding=True,
               doc="reef plus dynamic kernel padding: each RT kernel launch carries blocks "
               "of preempted BE tasks that obey REEF's rules (BE kernel not longer, "
               "occupancy not lower) on the SMs it leaves free (sim, cuda, cuda-emu). On "
               "cpu, without padded launches: BE keeps running, and starting, on the cores "
               "RT leaves free (Device.be_beside_rt), at a lower OS priority."),
    )
}


def device_refuses(pol: Policy, device: Any) -> str | None:
    """Why ``device`` cannot run ``pol`` (None if it can): padding needs padded launches."""
    if pol.padding and not device.supports_padding:
        why = device.padding_reason or "no padded launches"
        return (f"policy {pol.name!r} needs dynamic kernel padding, which device "
                f"{device.name!r} cannot do: {why}; use 'reef'")
    return None


def get_policy(name: str) -> Policy:
    """The policy called ``name``; InvalidParameterError if unknown or not available."""
    pol = POLICIES.get(str(name).strip().lower())
    if pol is None:
        raise InvalidParameterError(
            f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}"
        )
    if not pol.available:
        raise InvalidParameterError(f"policy {pol.name!r} is not available in this build")
    return pol
