"""Offline training of the QoS policy (paper 001 §3.2) by REINFORCE in the simulator.

Why the simulator: it runs the real scheduler in virtual time, deterministically and far
faster than real time, so thousands of dispatch decisions per episode cost about a
second. Each episode is a half-hour job of the training hours (9-12 h, as in the paper)
of a diurnal trace with its own seed and its own peak load (drawn from ``load_range``,
so that overload, where the fast variant pays, is seen too); the policy acts only when
the device is free (paper Fig. 4). The first ``imitate`` episodes clone the eq. 2
heuristic (it acts, the network learns its choices: a warm start the paper does not
describe, stated here); then the policy acts by sampling and learns by REINFORCE. The
reward of decision k is the mean quality of the last ``window`` responses answered by
decision k+1 (the paper's reward; a dropped request counts 0 at its hard deadline);
returns are discounted by ``gamma``; the gradient of log π times the normalised
advantage (return minus the mean of the episode) is followed with Adam, plus a small
entropy bonus that keeps the policy exploring early on. Everything is seeded:
``train(seed=s)`` reproduces its policy exactly on the same machine and versions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from av_infer.qos.deciders import Eq2Decider
from av_infer.qos.evaluate import (
    Outcome,
    Workload,
    deadlines_for,
    diurnal_trace,
    latency_table,
    peak_rate_for,
    run_trace,
)
from av_infer.qos.policy import Explorer, PolicyNet

BATCH_SIZES = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class TrainConfig:
    episodes: int = 100
    seed: int = 0
    hidden: int = 32
    lr: float = 0.01
    gamma: float = 0.9
    window: int = 32  # responses averaged into one reward (the paper's W)
    entropy: float = 0.01
    job_hours: float = 0.5  # trace hours per episode
    #: each episode's peak load (x the full variant's batch-32 throughput) is drawn from
    #: this range, so the policy also sees overload (where the fast variant pays)
    load_range: tuple[float, float] = (0.6, 1.4)
    imitate: int = 10  # first episodes: clone eq. 2 (behaviour cloning warm start)
    imitate_steps: int = 40  # Adam steps per cloning episode
    n_pre: int = 4
    n_post: int = 6
    bin_units: float = 1.0


def rewards(out: Outcome, steps: list[tuple[Any, Any, int, float]], hard: float,
            window: int) -> np.ndarray:
    """Per decision: mean quality of the last ``window`` responses answered before the next
    decision (the episode's end for the last one)."""
    t_ans = np.where(np.isnan(out.end), out.arrival + hard, out.end) + out.t0
    order = np.argsort(t_ans, kind="stable")
    t_sorted, q_sorted = t_ans[order], out.quality[order]
    csum = np.concatenate([[0.0], np.cumsum(q_sorted)])
    times = [s[3] for s in steps[1:]] + [np.inf]
    idx = np.searchsorted(t_sorted, times, side="right")
    lo = np.maximum(0, idx - window)
    n = np.maximum(1, idx - lo)
    return np.where(idx > 0, (csum[idx] - csum[lo]) / n, 0.0)


def returns(r: np.ndarray, gamma: float) -> np.ndarray:
    g = np.zeros_like(r)
    acc = 0.0
    for k in range(len(r) - 1, -1, -1):
        acc = r[k] + gamma * acc
        g[k] = acc
    return g * (1.0 - gamma)  # on the scale of one reward


def gradient(net: PolicyNet, steps: list[tuple[Any, Any, int, float]], adv: np.ndarray,
             entropy: float) -> dict[str, np.ndarray]:
    """Ascent direction of mean(adv · log π(a|x)) + entropy · mean H(π(·|x))."""
    x = np.stack([s[0] for s in steps])
    mask = np.stack([s[1] for s in steps])
    act = np.asarray([s[2] for s in steps])
    h = np.tanh(x @ net.w1.T + net.b1)
    z = h @ net.w2.T + net.b2
    z = np.where(mask, z, -np.inf)
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    onehot = np.zeros_like(p)
    onehot[np.arange(len(act)), act] = 1.0
    g = (onehot - p) * adv[:, None]
    if entropy:
        logp = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), 0.0)
        ent = -(p * logp).sum(axis=1, keepdims=True)
        g += entropy * (-p * (logp + ent))
    k = len(steps)
    dh = (g @ net.w2) * (1.0 - h * h)
    return {"w2": g.T @ h / k, "b2": g.sum(0) / k, "w1": dh.T @ x / k, "b1": dh.sum(0) / k}


class Adam:
    def __init__(self, lr: float, b1: float = 0.9, b2: float = 0.999) -> None:
        self.lr, self.b1, self.b2, self.t = lr, b1, b2, 0
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}

    def ascend(self, net: PolicyNet, grads: dict[str, np.ndarray]) -> None:
        self.t += 1
        for k, g in grads.items():
            m = self.m.get(k, np.zeros_like(g)) * self.b1 + (1 - self.b1) * g
            v = self.v.get(k, np.zeros_like(g)) * self.b2 + (1 - self.b2) * g * g
            self.m[k], self.v[k] = m, v
            mh = m / (1 - self.b1 ** self.t)
            vh = v / (1 - self.b2 ** self.t)
            setattr(net, k, getattr(net, k) + self.lr * mh / (np.sqrt(vh) + 1e-8))


def train(w: Workload, cfg: TrainConfig = TrainConfig(),
          on_episode: Callable[[int, dict[str, float]], None] | None = None) -> PolicyNet:
    """A policy trained on ``w`` (sim) from ``cfg.seed``; ``meta`` records how."""
    t_wall = time.perf_counter()
    table = latency_table(w)
    soft, hard = deadlines_for(w, table)
    peak = peak_rate_for(w, table)
    net = PolicyNet.init(2, BATCH_SIZES, cfg.hidden, cfg.n_pre, cfg.n_post, cfg.bin_units,
                         seed=cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    opt = Adam(cfg.lr)
    history: list[float] = []
    for ep in range(cfg.episodes):
        start = float(rng.uniform(9.0, 12.0 - cfg.job_hours))
        load = float(rng.uniform(*cfg.load_range))
        trace = diurnal_trace(int(rng.integers(1 << 31)) + 1000, peak * load / w.load,
                              w.hour_s, start, start + cfg.job_hours)
        clone = ep < cfg.imitate
        teacher = Eq2Decider(BATCH_SIZES, window=0.05) if clone else None
        net.explore = Explorer(np.random.default_rng(int(rng.integers(1 << 31))),
                               teacher=teacher)
        out = run_trace(w, "qos_rl", trace, (soft, hard), net)
        steps = net.explore.steps
        net.explore = None
        if len(steps) < 2:
            continue
        if clone:  # maximise the log-likelihood of the teacher's actions
            ones = np.ones(len(steps))
            for _ in range(cfg.imitate_steps):
                opt.ascend(net, gradient(net, steps, ones, 0.0))
            history.append(float(out.quality.mean()))
            if on_episode is not None:
                on_episode(ep, {"mean_utility": history[-1], "decisions": len(steps),
                                "phase": "clone"})
            continue
        g = returns(rewards(out, steps, hard, cfg.window), cfg.gamma)
        adv = g - g.mean()
        sd = adv.std()
        adv = adv / sd if sd > 1e-9 else adv
        opt.ascend(net, gradient(net, steps, adv, cfg.entropy))
        mean_q = float(out.quality.mean())
        history.append(mean_q)
        if on_episode is not None:
            on_episode(ep, {"mean_utility": mean_q, "decisions": len(steps),
                            "phase": "reinforce"})
    net.meta = {
        "name": "qos_rl_default" if cfg == TrainConfig() else "custom",
        "trained_on": {"device": w.device, "full": w.full, "fast": w.fast,
                       "kappa_fast": w.kappa_fast, "size": w.size, "hour_s": w.hour_s,
                       "load": w.load, "soft_factor": w.soft_factor,
                       "hard_factor": w.hard_factor},
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "episode_mean_utility": [round(x, 4) for x in history],
        "train_wall_s": round(time.perf_counter() - t_wall, 1),
    }
    return net


def small_config(**kw: Any) -> TrainConfig:
    """A few-episode configuration (tests)."""
    return replace(TrainConfig(episodes=2, imitate=1, job_hours=0.05), **kw)
