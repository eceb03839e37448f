"""Launch geometry: the one owner of how many blocks and threads each kernel launches.

:func:`geometry_for` decides a kernel's :class:`~av_infer.model.plan.Geometry` when the plan
is built; the plan carries it, and everything downstream reads it from the plan: the
simulator and DKP (blocks, threads, smem, regs), the profiles, and the CUDA code generator.
The generator does not decide geometry; it *applies* the plan's through
:func:`cuda_launch`, which only maps it onto the wrappers' block loop (a 1-D grid of at
most :data:`GRID_MAX` blocks, each looping over logical blocks) and clamps it to the
kernel's work. The tile and block constants below are the ones the CUDA kernels are
written for (``sources`` imports them rather than keeping its own copies).

Known gap, kept as is (changing it would change plan geometry): ``pool`` is planned as a
row kernel (one block per output row) but its CUDA kernel is elementwise, so
:func:`cuda_launch` clamps its block count to ``ceil(outputs / threads)``; for small rows
the CUDA launch has fewer blocks than the plan says.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from av_infer.model.plan import Geometry

__all__ = [
    "ELEMS_PER_THREAD",
    "ELEM_BLOCK",
    "GEMM_SMEM",
    "GEMM_THREADS",
    "GRID_MAX",
    "TILE",
    "Launch",
    "cuda_launch",
    "geometry_for",
]

#: conv/gemm output tile edge (a 64x64 tile per block)
TILE = 64
#: threads of a conv/gemm block
GEMM_THREADS = 256
#: shared memory of a conv/gemm block: double-buffered 64x16 + 16x64 float tiles
GEMM_SMEM = 2 * (TILE * 16 + 16 * TILE) * 4
#: threads of an elementwise block
ELEM_BLOCK = 256
#: elements per thread an elementwise kernel is planned with
ELEMS_PER_THREAD = 4
#: the largest grid x dimension (CUDA); more logical blocks loop inside the wrapper
GRID_MAX = 2**31 - 1


def _cdiv(a: int, b: int) -> int:
    return max(1, -(-int(a) // int(b)))


def _row_block(n: int) -> int:
    """Threads per block for a one-block-per-row kernel: next pow2 of the row, 32..256."""
    return int(min(256, max(32, 1 << max(0, math.ceil(math.log2(max(n, 1)))))))


def geometry_for(
    kind: str, in_shapes: Sequence[tuple[int, ...]], out_shapes: Sequence[tuple[int, ...]],
    args: dict[str, Any],
) -> Geometry:
    """CUDA launch geometry of a kernel (what its CUDA version uses; the sim and DKP read it).

    * conv / gemm / conv_transpose: implicit GEMM, one 64x64 output tile per block,
      256 threads, smem for double-buffered 64x16 + 16x64 float tiles, ~64 regs;
      grid = (ceil(M/64) * ceil(N/64), batch [* groups], 1). Depthwise conv is direct:
      elementwise geometry over outputs, 40 regs.
    * pool / reduce / softmax / layernorm / global_pool: one block per output row,
      threads = next pow2 of the row length (32..256), smem = one float per thread.
    * everything else (elementwise, data movement): 256 threads, 4 elements per thread,
      grid = ceil(n / 1024).
    """
    out0 = out_shapes[0] if out_shapes else ()
    n_out = max(1, sum(int(np.prod(s)) for s in out_shapes))
    if kind in ("conv", "conv_transpose"):
        x, y = in_shapes[0], out0
        g = int(args.get("group", 1))
        cin, cout = x[1], y[1]
        if kind == "conv" and g > 1 and g == cin and cout % cin == 0:
            return Geometry((min(_cdiv(n_out, ELEM_BLOCK), GRID_MAX), 1, 1),
                            (ELEM_BLOCK, 1, 1), 0, 40)
        m, nsp = cout // g, int(np.prod(y[2:]))
        grid_y = min(y[0] * g, 65535)
        return Geometry((_cdiv(m, TILE) * _cdiv(nsp, TILE), grid_y, 1),
                        (GEMM_THREADS, 1, 1), GEMM_SMEM, 64)
    if kind == "gemm":
        y = out0
        m, n = (y[-2], y[-1]) if len(y) >= 2 else (1, y[-1] if y else 1)
        batch = int(np.prod(y[:-2])) if len(y) > 2 else 1
        return Geometry((_cdiv(m, TILE) * _cdiv(n, TILE), min(max(batch, 1), 65535), 1),
                        (GEMM_THREADS, 1, 1), GEMM_SMEM, 64)
    if kind in ("pool", "global_pool", "reduce", "softmax", "layernorm"):
        x = in_shapes[0]
        if kind == "pool":
            rows, row = int(np.prod(out0[:-1])), out0[-1] * int(np.prod(args["kernel"]))
        elif kind == "global_pool":
            rows, row = x[0] * x[1], int(np.prod(x[2:]))
        elif kind == "reduce":
            rows = max(1, int(np.prod(out0)))
            row = int(np.prod([x[a] for a in args["axes"]]))
        else:
            ax = args["axis"]
            row = int(np.prod(x[ax:])) if kind == "layernorm" else x[ax]
            rows = max(1, int(np.prod(x)) // max(row, 1))
        b = _row_block(row)
        return Geometry((min(max(rows, 1), GRID_MAX), 1, 1), (b, 1, 1), b * 4 * 2, 32)
    return Geometry((min(_cdiv(n_out, ELEM_BLOCK * ELEMS_PER_THREAD), GRID_MAX), 1, 1),
                    (ELEM_BLOCK, 1, 1), 0, 32)


@dataclass(frozen=True)
class Launch:
    """A CUDA launch of one kernel: ``grid`` x ``block`` threads running ``nblk`` logical
    blocks (the wrapper's ``for (b = blockIdx; b < nblk; b += gridDim)`` loop); ``per`` is
    the elements each logical block handles (elementwise work; 0 otherwise)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    nblk: int
    per: int = 0


def cuda_launch(geometry: Geometry, work: str, count: int) -> Launch:
    """Apply a plan's ``geometry`` to a CUDA kernel whose body does ``count`` units of
    ``work``; decides nothing the plan did not, only fits it to the kernel and the device:

    * ``"mm"`` (conv / conv_transpose / gemm tiles): ``count`` logical blocks, one per
      64x64 tile and batch entry (image*group) -- the plan's grid x*y, flattened to 1-D --
      of :data:`GEMM_THREADS` threads (the kernels are written for that block size).
    * ``"row"`` (reduce, global_pool, softmax, layernorm): one logical block per row
      (``count`` rows), the plan's threads when a multiple of 32 in 32..1024, else 256.
    * ``"elem"`` (everything else, pool and depthwise conv included): the plan's blocks
      and threads (threads outside 32..1024 become 256 and blocks the default
      ``ceil(count / 1024)``), clamped to at most one block per ``threads`` elements;
      logical block b handles elements ``[b*per, (b+1)*per)``, ``per = ceil(count /
      blocks)``, so any block count is correct.

    The grid is ``(min(nblk, GRID_MAX), 1, 1)``: logical blocks beyond that loop inside
    the wrapper.
    """
    if work == "mm":
        nblk = max(1, count)
        return Launch((min(nblk, GRID_MAX), 1, 1), (GEMM_THREADS, 1, 1), nblk)
    if work == "row":
        t = geometry.threads
        t = t if t % 32 == 0 and 32 <= t <= 1024 else ELEM_BLOCK
        nblk = max(1, count)
        return Launch((min(nblk, GRID_MAX), 1, 1), (t, 1, 1), nblk)
    if work != "elem":
        raise ValueError(f"unknown kernel work {work!r} (mm, row or elem)")
    t = geometry.threads if 32 <= geometry.threads <= 1024 else ELEM_BLOCK
    blocks = (geometry.blocks if geometry.blocks >= 1 and geometry.threads == t
              else _cdiv(count, ELEM_BLOCK * ELEMS_PER_THREAD))
    blocks = min(blocks, _cdiv(count, t))  # never more blocks than thread-sized chunks
    per = _cdiv(count, blocks)
    nblk = _cdiv(count, per)
    return Launch((min(nblk, GRID_MAX), 1, 1), (t, 1, 1), nblk, per)
