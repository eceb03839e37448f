"""Synthetic PPipe-like datasets: several models, device types and fractions, in the file
format of :mod:`.profile_files`, for property tests of the planner (not a benchmark).

The shape follows what PPipe reports of measured block profiles: early blocks (large
feature maps, compute bound) run much slower on a low-class type, late blocks (small maps)
nearly as fast; a 1/v fraction slows a block by ``v ** a`` with ``a`` in [0.2, 1] (small
kernels barely notice), a batch of ``b`` costs ``1 + c (b - 1)`` times batch 1; some
(fraction, batch) cells are not measured; cut bytes shrink along the model.
Deterministic for a seed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from av_infer.pipeline.cluster import Cluster, parse_cluster_doc
from av_infer.pipeline.profile_files import MeasuredProfile, parse_profile


def dataset(seed: int, n_models: int = 3, n_types: int = 2, n_blocks: int = 6,
            batches: tuple[int, ...] = (1, 2, 4, 8), max_v: int = 4
            ) -> tuple[dict[str, dict[str, MeasuredProfile]], Cluster]:
    """``({model: {type: profile}}, cluster)``; every profile went through the loader."""
    rng = np.random.default_rng(seed)
    types = [f"gpu{k}" for k in range(n_types)]
    # type 0 is the high class; others are slower on early blocks than on late ones
    slow_early = [1.0] + [float(rng.uniform(2.0, 6.0)) for _ in types[1:]]
    slow_late = [1.0] + [float(rng.uniform(1.0, 1.6)) for _ in types[1:]]
    profiles: dict[str, dict[str, MeasuredProfile]] = {}
    for m in range(n_models):
        name = f"model{m}"
        base = rng.uniform(50.0, 400.0, n_blocks)
        cuts = sorted(rng.uniform(2e3, 4e5, n_blocks - 1), reverse=True)
        frac_exp = rng.uniform(0.2, 1.0, n_blocks)
        batch_c = rng.uniform(0.15, 0.9, n_blocks)
        profiles[name] = {}
        for k, t in enumerate(types):
            pos = np.linspace(0.0, 1.0, n_blocks)
            slow = slow_early[k] * (1 - pos) + slow_late[k] * pos
            fractions: dict[str, Any] = {}
            for v in range(1, max_v + 1):
                keep = [b for b in batches if b == 1 or v == 1 or rng.random() > 0.25]
                rows = [[float(base[i] * slow[i] * v ** frac_exp[i] * (1 + batch_c[i] * (b - 1)))
                         for i in range(n_blocks)] for b in keep]
                fractions[str(v)] = {"batches": keep, "latency": rows}
            doc = {"format": "av_infer.block_profile", "version": 1, "model": name,
                   "device_type": t, "source": "measured", "latency_unit": "us",
                   "bytes_unit": "B", "n_blocks": n_blocks,
                   "cut_bytes": [float(c) for c in cuts], "fractions": fractions,
                   "provenance": {"synthetic_seed": seed}}
            profiles[name][t] = parse_profile(doc, f"synthetic {name}@{t}")
    cdoc = {"format": "av_infer.cluster", "version": 1, "device_types": [
        {"name": t, "count": int(rng.integers(2, 9)),
         "gpus_per_server": int(rng.choice([1, 2, 4])),
         "link_gbps": float(rng.choice([10.0, 25.0, 100.0])),
         "link_latency_us": float(rng.choice([0.0, 5.0, 20.0]))} for t in types]}
    return profiles, parse_cluster_doc(cdoc, profiles, "synthetic cluster")
