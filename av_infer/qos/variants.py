"""Variant groups (paper 001 §2.2-2.3): alternative models of one task, each with an
accuracy factor κ, and what the runtime reports about them.

Why: under overload a faster, less accurate model that answers in time is worth more than
the full model answering late. A client names a *group* instead of a model; the scheduler
picks the variant per request or batch (``qos.deciders``) maximising
``Q = κ_M · V(t_end; soft, hard)``. Variants must be interchangeable for the caller: the
same input and output names, shapes and dtypes (checked when the group is defined).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from av_infer.errors import InvalidParameterError


@dataclass(frozen=True)
class Variant:
    """One model of a group and its accuracy factor κ in (0, 1]."""

    model: str
    kappa: float


@dataclass(frozen=True)
class VariantGroup:
    """A named, ordered set of variants (most accurate first: the default choice)."""

    name: str
    variants: tuple[Variant, ...]

    @classmethod
    def build(cls, name: Any, variants: Any) -> VariantGroup:
        """Validate ``variants`` (a mapping model -> κ, or (model, κ) pairs) and order them
        by κ, most accurate first (ties keep the given order). InvalidParameterError on a
        bad name, an empty group, a repeated model or κ outside (0, 1]."""
        if not isinstance(name, str) or not name:
            raise InvalidParameterError(f"variant group name must be a non-empty string, "
                                        f"got {name!r}")
        items = list(variants.items()) if isinstance(variants, Mapping) else variants
        try:
            pairs = [(m, k) for m, k in items]
        except (TypeError, ValueError):
            raise InvalidParameterError(
                f"variant group {name!r}: variants must map model name -> kappa, "
                f"got {variants!r}") from None
        if not pairs:
            raise InvalidParameterError(f"variant group {name!r} has no variants")
        out: list[Variant] = []
        for m, k in pairs:
            if not isinstance(m, str) or not m:
                raise InvalidParameterError(f"variant group {name!r}: model names must be "
                                            f"non-empty strings, got {m!r}")
            if isinstance(k, bool) or not isinstance(k, (int, float)) or math.isnan(k) \
                    or not 0.0 < float(k) <= 1.0:
                raise InvalidParameterError(
                    f"variant group {name!r}: kappa of {m!r} must be in (0, 1], got {k!r}")
            if any(v.model == m for v in out):
                raise InvalidParameterError(f"variant group {name!r} names {m!r} twice")
            out.append(Variant(m, float(k)))
        out.sort(key=lambda v: -v.kappa)
        return cls(name, tuple(out))

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(v.model for v in self.variants)

    @property
    def kappas(self) -> tuple[float, ...]:
        return tuple(v.kappa for v in self.variants)

    def kappa_of(self, model: str) -> float:
        for v in self.variants:
            if v.model == model:
                return v.kappa
        raise InvalidParameterError(f"{model!r} is not a variant of group {self.name!r}")


class GroupStats:
    """Per group: requests answered, the share served by each variant (paper 001's
    P_tiny), and mean quality Q over every request (a failed or dropped one counts 0).
    Thread-safe: completions are recorded from the runtime's callback thread."""

    def __init__(self, group: VariantGroup) -> None:
        self.group = group
        self._lock = threading.Lock()
        self._served = {m: 0 for m in group.models}
        self._failed: dict[str, int] = {}
        self._count = 0
        self._total = 0.0
        self._sq = 0.0

    def record(self, model: str | None, q: float, error: str | None = None) -> None:
        """One answer: served by ``model`` with quality ``q``, or failed with ``error``."""
        with self._lock:
            self._count += 1
            self._total += q
            self._sq += q * q
            if error is not None:
                self._failed[error] = self._failed.get(error, 0) + 1
            elif model in self._served:
                self._served[model] += 1

    def summary(self) -> dict[str, Any]:
        with self._lock:
            n, served = self._count, dict(self._served)
            mean = self._total / n if n else None
            var = max(0.0, self._sq / n - mean * mean) if n else None
            failed = dict(self._failed)
        done = sum(served.values())
        return {
            "variants": {v.model: v.kappa for v in self.group.variants},
            "requests": n,
            "served": served,
            "share": {m: (c / done if done else None) for m, c in served.items()},
            "failed": failed,
            "mean_utility": mean,
            "sd_utility": math.sqrt(var) if var is not None else None,
        }
