"""The scheduling policies, in one table: what each one does, so the scheduler has no
policy-name ``if`` chains and comparisons stay honest (docs/design.md "Policies").

Every policy runs RT requests one at a time in EDF order (optionally switched at kernel
boundaries, ``edf_preempt``); they differ in how BE work shares the device with RT work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from av_infer.errors import InvalidParameterError

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

@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    accepts_be: bool  # False: BE submits are rejected (RejectedError)
    exclusive: bool  # one task at a time on the whole device (RT first)
    rt_high_priority: bool  # RT on the device's high-priority stream, else a plain one
    preempt: PreemptKind
    be_unbounded: bool  # BE streams transmit without the c bound (wait-based baseline)
    available: bool = True
    padding: bool = False  # RT launches padded with blocks of preempted BE tasks (DKP)
    doc: str = ""
    #: BE tasks may start or continue while RT work is queued or running (derived from the
    #: fields above, once: the scheduler reads it on every RT request, and a slot read is a
    #: C-level load where a property was a Python frame)
    be_concurrent_with_rt: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "be_concurrent_with_rt", self.accepts_be
                           and not self.exclusive and self.preempt == "none")


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
