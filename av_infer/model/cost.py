"""The compile-time cost model: arithmetic and memory traffic of each kernel.

A plan's ``Kernel.flops`` and ``Kernel.bytes_moved`` come from here; they feed duration
estimates (the simulator, profiles derived without a device) wherever no measured profile
exists. They are estimates by design: no cache effects, no tile waste.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

__all__ = ["bytes_for", "flops_for"]


def flops_for(kind: str, in_shapes: Sequence[tuple[int, ...]],
              out_shapes: Sequence[tuple[int, ...]], args: dict[str, Any]) -> int:
    """Arithmetic operations of a kernel (multiply-add = 2), for duration estimates."""
    n_out = sum(int(np.prod(s)) for s in out_shapes)
    n_in = int(np.prod(in_shapes[0])) if in_shapes else 0
    epi = len(args.get("epilogue") or []) * n_out
    if kind == "conv":
        w = in_shapes[1]
        return 2 * n_out * int(np.prod(w[1:])) + epi + (n_out if args.get("bias") else 0)
    if kind == "conv_transpose":
        w = in_shapes[1]
        return 2 * n_in * int(np.prod(w[1:])) + epi
    if kind == "gemm":
        a = in_shapes[0]
        k = a[-2] if args.get("trans_a") else a[-1]
        return 2 * n_out * k + epi + (n_out if args.get("bias") else 0)
    if kind == "unary":
        return n_out * max(1, len(args.get("ops", [])))
    if kind in ("pool",):
        return n_out * int(np.prod(args["kernel"]))
    if kind in ("global_pool", "reduce"):
        return n_in
    if kind == "softmax":
        return 5 * n_in
    if kind == "layernorm":
        return 8 * n_in
    if kind == "batchnorm":
        return 2 * n_out
    if kind == "resize":
        return n_out * (4 if args.get("mode") == "linear" else 1)
    if kind in ("binary", "where"):
        return n_out
    return 0


def bytes_for(reads: Iterable[str], writes: Iterable[str],
              nbytes_of: Callable[[str], int]) -> int:
    """Bytes a kernel moves: every tensor it reads (``KNode.reads()``: inputs and bias)
    once, plus every tensor it writes once."""
    return sum(nbytes_of(t) for t in reads) + sum(nbytes_of(t) for t in writes)
