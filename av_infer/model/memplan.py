"""Arena memory planning with the idempotency guard.

Inputs and outputs get dedicated regions at the start of the arena (callers may write
inputs / read outputs at any time). Activation buffers share the rest by liveness: a
buffer defined by kernel ``d`` and last read by kernel ``u`` occupies its region over the
kernel interval ``[d, u + reuse_guard]``. Two buffers whose intervals intersect never
overlap in memory. Hence (a) no kernel writes a region it reads, and (b) kernel ``j`` never
writes a region read by any kernel ``k`` with ``k < j <= k + reuse_guard``: re-running the
last ``reuse_guard`` kernels after a preemption finds their inputs intact (restore-from-c).
Views share their base buffer, so their reads extend the base's liveness (the caller maps
view reads to base buffers before calling :func:`plan_memory`).

Placement is greedy by size (largest first), first fit on 64-byte aligned offsets.
"""

from __future__ import annotations

from collections.abc import Mapping

from av_infer.model.plan import Plan

ALIGN = 64


def _align(n: int) -> int:
    return -(-max(int(n), 1) // ALIGN) * ALIGN


def plan_memory(
    sizes: Mapping[int, int],
    roles: Mapping[int, str],
    first_def: Mapping[int, int],
    last_use: Mapping[int, int],
    reuse_guard: int,
) -> tuple[dict[int, int], int]:
    """Arena offsets for every non-weight buffer and the arena size in bytes."""
    offsets: dict[int, int] = {}
    cur = 0
    for bid in sorted(sizes):
        if roles[bid] in ("input", "output"):
            offsets[bid] = cur
            cur += _align(sizes[bid])
    base = cur
    acts = [b for b in sizes if roles[b] == "activation"]
    intervals: dict[int, tuple[int, int]] = {}
    for b in acts:
        d = first_def.get(b, 0)
        u = max(last_use.get(b, d), d)
        intervals[b] = (d, u + max(int(reuse_guard), 0))
    placed: list[tuple[int, int, int]] = []  # (offset, end, bid)
    top = base
    for b in sorted(acts, key=lambda x: (-sizes[x], intervals[x][0], x)):
        lo, hi = intervals[b]
        need = _align(sizes[b])
        busy = sorted(
            (o, e) for o, e, p in placed if not (intervals[p][1] < lo or hi < intervals[p][0])
        )
        off = base
        for o, e in busy:
            if off + need <= o:
                break
            off = max(off, e)
        offsets[b] = off
        placed.append((off, off + need, b))
        top = max(top, off + need)
    return offsets, top


def check_guard(plan: Plan) -> list[str]:
    """Violations of the plan's memory guarantees (empty list when the plan is sound).

    For every kernel k: its outputs do not overlap its inputs, and no kernel j with
    k < j <= k + reuse_guard writes a region k reads. Weights are read-only and skipped.
    """

    def regions(names: tuple[str, ...] | list[str]) -> list[tuple[int, int, str]]:
        out = []
        for n in names:
            t = plan.tensors[n]
            b = plan.buffers[t.buffer]
            if b.role == "weight":
                continue
            start = b.offset + t.byte_offset
            out.append((start, start + max(t.nbytes, 1), n))
        return out

    def reads(k: object) -> list[str]:
        r = list(k.inputs)  # type: ignore[attr-defined]
        bias = k.args.get("bias")  # type: ignore[attr-defined]
        if isinstance(bias, str):
            r.append(bias)
        return r

    errs: list[str] = []
    ks = plan.kernels
    for k in ks:
        rin = regions(reads(k))
        for j in range(k.index, min(len(ks), k.index + plan.reuse_guard + 1)):
            for o0, o1, on in regions(ks[j].outputs):
                for i0, i1, inn in rin:
                    if o0 < i1 and i0 < o1:
                        errs.append(
                            f"kernel {j} ({ks[j].name}) writes {on} over {inn} read by "
                            f"kernel {k.index} ({k.name})"
                        )
    return errs
