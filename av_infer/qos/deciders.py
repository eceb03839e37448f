"""Batch size and variant per dispatch: the decisions of seed paper 001, one class a mode.

Why deciders: the scheduler acts only when a BE stream is free (paper 001 Fig. 4: actions
at dynamic points, not on a timer); at that moment ``sched.model_services`` hands the
model's or group's decider a :class:`BatchView` (the queued requests' deadlines in
dispatch order, the compiled batch sizes, each variant's κ and expected latency) and gets
back ``(variant, n)``: run the first ``n`` requests as one batch on that variant.

Modes (``Runtime(batch_mode=...)``, all selectable at runtime, compared by
``av-infer qos eval``):

* ``rafiqi``: Rafiqi's adaptive threshold (``batching.AdaptiveBatcher``) for B;
* ``eq2``: paper 001 eq. 2 (``batching.Eq2Batcher``): the smallest B that keeps up;
  the most accurate variant unless B >= ``b_thrd``, then the one maximising Q_B;
* ``fixed``: the paper's baseline: batch everything queued, at most ``max_batch``;
* ``qos_rl``: the learned policy (``qos.policy``).

In every mode the variant is the one maximising the batch's expected quality
``Q_B = Σ_q κ_M · V(now + busy + D_{B,M}; soft_q, hard_q)`` (paper 001 §3.1; the paper
writes one more κ_M factor in front, which only sharpens the preference for accurate
models and is left out here), except where the mode says otherwise (``eq2`` below
``b_thrd``, ``qos_rl``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from av_infer.batching import AdaptiveBatcher, Eq2Batcher
from av_infer.errors import InvalidParameterError
from av_infer.qos.utility import utility

#: The batching modes a runtime accepts.
MODES = ("rafiqi", "eq2", "fixed", "qos_rl")


@dataclass
class BatchView:
    """What a decider sees at a dispatch (times on the device clock, seconds)."""

    now: float
    #: (soft, hard) absolute deadlines of the head request and the unit's queued requests,
    #: in dispatch order (inf: none)
    deadlines: Sequence[tuple[float, float]]
    sizes: tuple[int, ...]  # compiled batch sizes, ascending, 1 first
    kappas: tuple[float, ...]  # per variant, most accurate first
    latency: Callable[[int, int], float]  # (variant, plan batch size) -> expected seconds
    busy: float = 0.0  # expected seconds until the unit's running batches are done


class Decider(Protocol):
    def observe_arrival(self, now: float) -> None: ...

    def decide(self, view: BatchView) -> tuple[int, int]: ...

    def stats(self) -> dict[str, Any]: ...


def check_mode(mode: Any) -> str:
    if not isinstance(mode, str) or mode.strip().lower() not in MODES:
        raise InvalidParameterError(
            f"unknown batch mode {mode!r}; choose one of {', '.join(MODES)}")
    return mode.strip().lower()


def plan_size(sizes: Sequence[int], n: int) -> int:
    """The compiled size that serves ``n`` requests: the smallest >= n (else the largest)."""
    for b in sizes:
        if b >= n:
            return b
    return sizes[-1]


def batch_quality(view: BatchView, variant: int, n: int) -> float:
    """Expected Σ κ·V of the first ``n`` requests run now as one batch on ``variant``."""
    b = plan_size(view.sizes, n)
    t_end = view.now + view.busy + view.latency(variant, b)
    k = view.kappas[variant]
    return sum(k * utility(t_end, s, h) for s, h in view.deadlines[:n])


def best_variant(view: BatchView, n: int) -> int:
    """The variant maximising Q_B of the first ``n`` requests (ties: the more accurate)."""
    if len(view.kappas) == 1:
        return 0
    best, best_q = 0, -math.inf
    for v in range(len(view.kappas)):
        q = batch_quality(view, v, n)
        if q > best_q + 1e-12:
            best, best_q = v, q
    return best


class FixedDecider:
    """Paper 001's ``fixed`` baseline: everything queued, at most ``max_batch``."""

    def __init__(self, max_batch: int = 32) -> None:
        self.max_batch = int(max_batch)
        self.batches: dict[int, int] = {}

    def observe_arrival(self, now: float) -> None:
        pass

    def decide(self, view: BatchView) -> tuple[int, int]:
        n = min(len(view.deadlines), self.max_batch, view.sizes[-1])
        self.batches[n] = self.batches.get(n, 0) + 1
        return best_variant(view, n), n

    def stats(self) -> dict[str, Any]:
        return {"mode": "fixed", "max_batch": self.max_batch,
                "batches": dict(sorted(self.batches.items()))}


class Eq2Decider:
    """Paper 001 §3.1: eq. 2's B on the most accurate variant's latency; variants are
    compared only for batches of at least ``b_thrd`` (below, the most accurate runs)."""

    def __init__(self, sizes: Sequence[int], alpha: float = 0.5, beta: float = 1.0,
                 window: float = 0.05, b_thrd: int = 8) -> None:
        self.batcher = Eq2Batcher(sizes, alpha, beta, window)
        self.b_thrd = int(b_thrd)

    def observe_arrival(self, now: float) -> None:
        self.batcher.observe_arrival(now)

    def decide(self, view: BatchView) -> tuple[int, int]:
        self.batcher.set_batch_sizes(view.sizes)
        n = self.batcher.take(len(view.deadlines), view.now,
                              lambda b: view.latency(0, plan_size(view.sizes, b)))
        return (best_variant(view, n) if n >= self.b_thrd else 0), n

    def stats(self) -> dict[str, Any]:
        return {"mode": "eq2", "b_thrd": self.b_thrd, **self.batcher.stats()}


class RafiqiDecider:
    """Rafiqi's threshold for B (``batching.AdaptiveBatcher``); the variant by Q_B."""

    def __init__(self, batcher: AdaptiveBatcher) -> None:
        self.batcher = batcher

    def observe_arrival(self, now: float) -> None:
        self.batcher.observe_arrival(now)

    def decide(self, view: BatchView) -> tuple[int, int]:
        n = self.batcher.take(len(view.deadlines), view.now)
        return best_variant(view, n), n

    def stats(self) -> dict[str, Any]:
        return {"mode": "rafiqi", **self.batcher.stats()}
