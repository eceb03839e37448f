"""The learned scheduling policy of seed paper 001 §3.2: a small numpy network.

State (all times in units of ``u`` = the most accurate variant's expected batch-1 latency,
so one file serves devices of different speed): the histogram of queued requests' soft
deadlines relative to now in ``n_pre`` bins before and ``n_post`` bins from now (width
``bin_units``·u; ends clamped), the total queued, the arrival rate R_t (arrivals per u,
over the runtime's sliding ``rate_window``) and the device's availability (expected busy
time, in u). Action: one (variant, batch size) pair; actions that do not exist for the
unit (more variants than it has, a size not compiled, a size larger than the one that
already serves the whole queue) are masked out. The network: one tanh hidden layer,
softmax over actions.

The file is JSON (small, diffable, committed under ``qos/data``); :func:`load_policy`
checks its format and shapes, and :func:`check_fits` that it can drive a given unit, so a
policy file that does not match is an InvalidParameterError at configuration time.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from av_infer.batching import RateWindow
from av_infer.errors import InvalidParameterError
from av_infer.qos.deciders import BatchView, plan_size

FORMAT = "av_infer.qos_rl/1"
#: The committed policy the runtime loads by default (``av-infer qos train`` writes it).
DEFAULT_POLICY = Path(__file__).with_name("data") / "qos_rl_default.json"
#: Queue counts are divided by this before entering the network.
COUNT_SCALE = 32.0


@dataclass
class Explorer:
    """Training only (``qos.train``): sample actions with ``rng`` and record each
    decision's (features, mask, action, device time) in ``steps``; with a ``teacher``
    (a decider, e.g. eq. 2) act as it does and record its action (behaviour cloning)."""

    rng: np.random.Generator
    steps: list[tuple[np.ndarray, np.ndarray, int, float]] = field(default_factory=list)
    teacher: Any = None


@dataclass
class PolicyNet:
    """Weights plus the feature layout they were trained with."""

    n_pre: int
    n_post: int
    bin_units: float
    n_variants: int
    batch_sizes: tuple[int, ...]
    w1: np.ndarray  # (hidden, features)
    b1: np.ndarray  # (hidden,)
    w2: np.ndarray  # (actions, hidden)
    b2: np.ndarray  # (actions,)
    meta: dict[str, Any] = field(default_factory=dict)
    explore: Explorer | None = field(default=None, repr=False)  # never saved

    @property
    def n_features(self) -> int:
        return self.n_pre + self.n_post + 3

    @property
    def actions(self) -> list[tuple[int, int]]:
        """(variant, batch size) per output, variant-major."""
        return [(v, b) for v in range(self.n_variants) for b in self.batch_sizes]

    @classmethod
    def init(cls, n_variants: int, batch_sizes: tuple[int, ...], hidden: int = 32,
             n_pre: int = 4, n_post: int = 6, bin_units: float = 1.0,
             seed: int = 0) -> PolicyNet:
        rng = np.random.default_rng(seed)
        f = n_pre + n_post + 3
        a = n_variants * len(batch_sizes)
        return cls(n_pre, n_post, float(bin_units), int(n_variants), tuple(batch_sizes),
                   rng.normal(0, 1 / math.sqrt(f), (hidden, f)), np.zeros(hidden),
                   rng.normal(0, 0.01, (a, hidden)), np.zeros(a))

    # -- state and action -------------------------------------------------------------------
    def features(self, view: BatchView, rate: float) -> np.ndarray:
        u = view.latency(0, 1) or 1e-3
        x = np.zeros(self.n_features)
        width = self.bin_units * u
        lo, hi = -self.n_pre, self.n_post - 1
        for s, _h in view.deadlines:
            i = math.floor((s - view.now) / width) if s < math.inf else hi
            x[min(hi, max(lo, i)) + self.n_pre] += 1.0
        x[: self.n_pre + self.n_post] /= COUNT_SCALE
        k = self.n_pre + self.n_post
        x[k] = len(view.deadlines) / COUNT_SCALE
        x[k + 1] = rate * u / 8.0
        x[k + 2] = view.busy / u
        return x

    def mask(self, view: BatchView) -> np.ndarray:
        full = plan_size(view.sizes, len(view.deadlines))
        ok = [v < len(view.kappas) and b in view.sizes and b <= full
              for v, b in self.actions]
        m = np.asarray(ok, dtype=bool)
        if not m.any():  # the unit has no size of the policy's: batch 1, first variant
            m[0] = True
        return m

    def probs(self, x: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(action probabilities, hidden activations) for features ``x``."""
        h = np.tanh(self.w1 @ x + self.b1)
        z = self.w2 @ h + self.b2
        z = np.where(mask, z, -np.inf)
        z = z - z[mask].max()
        p = np.exp(z)
        return p / p.sum(), h

    # -- file -------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "n_pre": self.n_pre, "n_post": self.n_post,
            "bin_units": self.bin_units,
            "n_variants": self.n_variants, "batch_sizes": list(self.batch_sizes),
            "w1": np.round(self.w1, 6).tolist(), "b1": np.round(self.b1, 6).tolist(),
            "w2": np.round(self.w2, 6).tolist(), "b2": np.round(self.b2, 6).tolist(),
            "meta": self.meta,
        }, separators=(",", ":"))

    def save(self, path: str | os.PathLike[str]) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(self.to_json() + "\n")
        os.replace(tmp, p)


def load_policy(path: str | os.PathLike[str] | None = None) -> PolicyNet:
    """Read a policy file (default: the committed one); InvalidParameterError if it cannot
    be read or its format, sizes or weight shapes are wrong."""
    p = Path(DEFAULT_POLICY if path is None else path)
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise InvalidParameterError(f"cannot read QoS policy {str(p)!r}: {e}") from None
    where = f"QoS policy {str(p)!r}"
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise InvalidParameterError(f"{where}: not a {FORMAT} file")
    try:
        net = PolicyNet(int(d["n_pre"]), int(d["n_post"]), float(d["bin_units"]),
                        int(d["n_variants"]), tuple(int(b) for b in d["batch_sizes"]),
                        np.asarray(d["w1"], float), np.asarray(d["b1"], float),
                        np.asarray(d["w2"], float), np.asarray(d["b2"], float),
                        dict(d.get("meta", {})))
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidParameterError(f"{where}: bad field: {e}") from None
    hid = net.b1.shape[0] if net.b1.ndim == 1 else -1
    if net.n_pre < 0 or net.n_post < 1 or net.n_variants < 1 or not net.batch_sizes \
            or min(net.batch_sizes) < 1 or not net.bin_units > 0:
        raise InvalidParameterError(f"{where}: bad feature layout")
    want = {"w1": (hid, net.n_features), "b1": (hid,), "w2": (len(net.actions), hid),
            "b2": (len(net.actions),)}
    for k, shape in want.items():
        a = getattr(net, k)
        if a.shape != shape or not np.isfinite(a).all():
            raise InvalidParameterError(
                f"{where}: {k} has shape {list(a.shape)}, the layout needs {list(shape)}")
    return net


def check_fits(net: PolicyNet, unit: str, n_variants: int, sizes: tuple[int, ...]) -> None:
    """InvalidParameterError unless ``net`` can drive ``unit`` (a model or group with
    ``n_variants`` variants and compiled batch sizes ``sizes``)."""
    if n_variants > net.n_variants:
        raise InvalidParameterError(
            f"QoS policy has {net.n_variants} variant(s); {unit!r} has {n_variants}")
    if 1 not in net.batch_sizes:
        raise InvalidParameterError("QoS policy has no batch-1 action")
    del sizes  # sizes the policy lacks are masked out; batch 1 always exists


class RlDecider:
    """Acts with a :class:`PolicyNet`: greedy at run time; while training (the net's
    ``explore`` is set) it samples and records every decision there."""

    def __init__(self, net: PolicyNet, window: float = 0.05) -> None:
        self.net = net
        self.rates = RateWindow(window)
        self.actions: dict[str, int] = {}

    def observe_arrival(self, now: float) -> None:
        self.rates.observe(now)
        ex = self.net.explore
        if ex is not None and ex.teacher is not None:
            ex.teacher.observe_arrival(now)

    def decide(self, view: BatchView) -> tuple[int, int]:
        net = self.net
        x = net.features(view, self.rates.rate(view.now))
        m = net.mask(view)
        p, _ = net.probs(x, m)
        ex = net.explore
        if ex is None:
            a = int(np.argmax(p))
        elif ex.teacher is not None:
            v, n = ex.teacher.decide(view)
            act = (v, plan_size(view.sizes, n))
            if act in net.actions and m[net.actions.index(act)]:
                ex.steps.append((x, m, net.actions.index(act), view.now))
            return v, n
        else:
            a = int(ex.rng.choice(len(p), p=p))
            ex.steps.append((x, m, a, view.now))
        v, b = net.actions[a]
        key = f"{v}:{b}"
        self.actions[key] = self.actions.get(key, 0) + 1
        return v, min(b, len(view.deadlines))

    def stats(self) -> dict[str, Any]:
        return {"mode": "qos_rl", "actions": dict(sorted(self.actions.items())),
                "policy": self.net.meta.get("name", "custom")}
