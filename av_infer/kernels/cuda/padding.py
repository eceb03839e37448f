"""DKP on CUDA: the padded dispatcher kernel (REEF §5.1 "Efficient Function Pointers").

What a padded launch is (docs/dkp.md, ``Device.enqueue_padded``): one launch of an RT
kernel whose grid also holds block ranges of BE kernels. Blocks ``[0, rt_blocks)`` run the
RT kernel's body with their own index; the next ``n_blocks`` run BE part 0's body with
logical blocks ``first_block ..``, and so on.

How (this module only generates source; nothing here touches CUDA):

* One module per *plan set* (e.g. the RT plan and the BE plan of a pair) holds every
  distinct ``__device__`` body of those plans (the functors of ``sources.py``, without their
  ``__global__`` wrappers) and ONE dispatcher kernel, ``avi_pad_T<threads>_O<occ>``, in a
  few proxy variants: ``__launch_bounds__(threads, occ)`` for ``occ`` in
  :data:`OCC_LEVELS` (REEF's register-usage proxies: the variant caps registers so that
  ``occ`` blocks fit per SM; one per occupancy level, not one per kernel pair).
* Body selection: REEF calls device function pointers loaded from a table. We emit a
  ``switch`` over a small body-id table instead: NVRTC/nvcc then see every call site
  statically (bodies stay inlinable, no ``-rdc``, no indirect-call register spill to the
  ABI maximum), and the ids are fixed per module. The switch is over *distinct bodies of
  the module* (tens), not over launches.
* Arguments: a single by-value :data:`PAD_ARGS` struct (8-byte fields only, like every
  other struct here) with ``nparts`` and, per part, the stream's flag word, a device
  pointer to that kernel's packed argument struct (``LaunchSpec.pack`` bytes uploaded to
  the device), the body id, the body's thread count, the part's first grid block and its
  first logical block. Part 0 is the RT kernel (``first_block`` 0).
* Lazy eviction: a block checks *its part's* flag word with the same block-uniform
  ``AVI_PREEMPT_CHECK`` every plain kernel starts with (common.cuh: thread 0 reads it into
  shared memory, a barrier, the whole block returns or runs).
* Threads: the launch uses ``max`` of the parts' thread counts; threads at or beyond a
  body's count return before the body (whole warps for every body with barriers: row
  kinds use multiples of 32, conv/gemm 256). Bodies loop over ``blockDim.x``; in this
  module the family sources are rewritten to read ``avi_nthreads()`` (the body's own
  count, from shared memory) so every body partitions its work exactly as in its own
  launch -- results are bit-identical to the unpadded kernels, reductions included.
* Shared memory: the conv/gemm tiles are file-scope ``__shared__`` arrays (gemm.cu), so
  every tile body of the dispatcher kernel uses the same ~17 KB (a block runs one body);
  only the small per-instantiation reduction scratch adds up. Bodies use static shared
  arrays only (dynamic ``smem`` is 0 for every spec); the launch's dynamic shared memory
  is the max of the parts' (0 today).
* Flags: every part reads the flag word of the stream the padded launch runs on (the RT
  stream): padded BE blocks belong to the RT launch, whose completion credits them
  (``Scheduler._dkp_credit``); the BE task's own stream flag is raised while it is
  preempted and must not evict them.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from av_infer.kernels.cuda.sources import (
    FAMILY_FILES,
    LAYOUTS,
    LaunchSpec,
    PlanSource,
    read_family,
    struct_decl,
    struct_size,
)

__all__ = [
    "MAX_PAD_PARTS",
    "OCC_LEVELS",
    "PAD_SELECTS",
    "PAD_ARGS",
    "PaddedLaunch",
    "PaddedModule",
    "block_part",
    "bound_regs",
    "build_padded_module",
    "pad_table",
    "variant_name",
]

#: Occupancy levels (blocks per SM) with a dispatcher proxy variant.
OCC_LEVELS = (1, 2, 4, 8)
#: Parts per padded launch, the RT part included.
MAX_PAD_PARTS = 8
#: Threads per SM on sm_80+ (caps which occupancy variants a thread count allows).
MAX_THREADS_PER_SM = 2048
PAD_ARGS = "AviPadArgs"
#: Registers per SM on sm_80+ (what ``__launch_bounds__(threads, occ)`` divides).
REGS_PER_SM = 65536
#: How a padded launch picks its proxy variant (``PaddedModule.launch``; docs/cuda.md
#: "Register and shared-memory use, padded vs plain"):
#: ``parts``: the largest plain occupancy of the BE parts, level 1 without parts (the
#: first design; a padded launch with no BE part then runs with the registers of the
#: module's largest body); ``regs``: REEF §5.1's rule, the variant with the fewest
#: registers that still holds every part's plain kernel, the RT kernel's included.
PAD_SELECTS = ("parts", "regs")
_PART_FIELDS = ("flag", "args", "body", "threads", "start", "first")

_BODY_RE = re.compile(r"avi_grid_blocks\(\)\) (.+)\(a, b\);")


def variant_name(threads: int, occ: int) -> str:
    return f"avi_pad_T{threads}_O{occ}"


def bound_regs(threads: int, occ: int) -> int:
    """The registers per thread ``__launch_bounds__(threads, occ)`` leaves a kernel on
    sm_80+ (65536 per SM over ``occ`` blocks of whole warps, a multiple of 8, at most 255):
    the estimate :meth:`PaddedModule.variant_for_regs` uses for a variant whose measured
    count (``cuFuncGetAttribute``) is not known."""
    warps = -(-int(threads) // 32)
    return min(255, REGS_PER_SM // (int(occ) * warps * 32)) // 8 * 8


def pad_table(rt_blocks: int, parts: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """The block->part table: ``(start, end, first_block)`` per part, RT first.

    ``parts``: ``(first_block, n_blocks)`` of each BE part, in launch order. Grid block
    ``g`` with ``start <= g < end`` of part ``i`` runs logical block ``first + g - start``.
    """
    if rt_blocks < 1:
        raise ValueError("a padded launch needs at least one RT block")
    table = [(0, int(rt_blocks), 0)]
    pos = int(rt_blocks)
    for first, n in parts:
        if n < 1 or first < 0:
            raise ValueError(f"padding part ({first}, {n}): need first >= 0 and n >= 1")
        table.append((pos, pos + int(n), int(first)))
        pos += int(n)
    if len(table) > MAX_PAD_PARTS:
        raise ValueError(f"{len(table)} parts; a padded launch holds at most {MAX_PAD_PARTS}")
    return table


def block_part(table: Sequence[tuple[int, int, int]], g: int) -> tuple[int, int]:
    """(part index, logical block) of grid block ``g`` -- what the kernel computes."""
    for i, (start, end, first) in enumerate(table):
        if start <= g < end:
            return i, first + g - start
    raise IndexError(f"block {g} beyond the padded grid ({table[-1][1]} blocks)")


def _pad_args_decl() -> str:
    return (
        "struct AviPadPart {\n"
        "    const unsigned int* flag; const void* args; long long body; long long threads;\n"
        "    long long start; long long first;\n"
        "};\n"
        f"struct {PAD_ARGS} {{ long long nparts; AviPadPart part[{MAX_PAD_PARTS}]; }};\n"
        f'static_assert(sizeof({PAD_ARGS}) == {8 + 8 * len(_PART_FIELDS) * MAX_PAD_PARTS}, '
        f'"{PAD_ARGS}: layout drift");\n'
    )


def _padded_prelude() -> str:
    """Structs + family sources with ``blockDim.x`` read through ``avi_nthreads()``."""
    parts = ["// generated by av_infer.kernels.cuda.padding: argument structs"]
    parts += [struct_decl(n) for n in LAYOUTS]
    parts += [f'static_assert(sizeof({n}) == {struct_size(n)}, "{n}: layout drift");'
              for n in LAYOUTS]
    fams = [read_family(f) for f in FAMILY_FILES]
    # common.cuh first (types); avi_nthreads needs only the built-ins
    parts.append(fams[0].replace("blockDim.x", "avi_nthreads()").replace(
        "typedef long long i64;",
        "typedef long long i64;\n"
        "// padded module: the running body's thread count (set per block by the dispatcher)\n"
        "__shared__ unsigned int avi_pad_nthreads;\n"
        "__device__ __forceinline__ unsigned int avi_nthreads() { return avi_pad_nthreads; }",
        1))
    parts += [f.replace("blockDim.x", "avi_nthreads()") for f in fams[1:]]
    return "\n".join(parts) + "\n"


@dataclass(frozen=True, slots=True)
class PaddedLaunch:
    """One padded launch: function, geometry and the packed :data:`PAD_ARGS` bytes."""

    func: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: bytes


@dataclass
class PaddedModule:
    """The dispatcher module of a plan set: source, body ids, variant names."""

    source: str
    body_ids: dict[str, int]  # wrapper function name (LaunchSpec.func) -> body id
    body_structs: dict[str, str]
    threads: int
    variants: dict[int, str]  # occupancy level -> kernel name
    #: occupancy level -> registers per thread of that variant as compiled (set where the
    #: module is loaded: ``cuFuncGetAttribute``); a missing level is estimated from its
    #: launch bound (:func:`bound_regs`)
    variant_regs: dict[int, int] = field(default_factory=dict)

    def variant_for(self, occupancy: int) -> str:
        """The proxy variant for ``occupancy`` blocks per SM: the smallest level >= it
        (the largest generated one when it exceeds them all)."""
        levels = sorted(self.variants)
        for lv in levels:
            if lv >= occupancy:
                return self.variants[lv]
        return self.variants[levels[-1]]

    def variant_for_regs(self, need: int) -> str:
        """The ``regs`` selection (:data:`PAD_SELECTS`, REEF §5.1): among the variants with
        at least ``need`` registers per thread (the most any part's plain kernel uses), the
        one with the fewest, ties to the higher occupancy level; when none has ``need``, the
        one with the most. So no part runs with fewer registers than its plain kernel has
        (bodies other than the parts' may spill in that variant; a block only runs its own
        body), and no part loses occupancy to a larger body it never runs (what the
        ``parts`` selection does without BE parts: every RT kernel at level 1)."""
        regs = {lv: self.variant_regs.get(lv) or bound_regs(self.threads, lv)
                for lv in self.variants}
        fit = [lv for lv in regs if regs[lv] >= need]
        if fit:
            best = min(fit, key=lambda lv: (regs[lv], -lv))
        else:
            best = max(regs, key=lambda lv: (regs[lv], lv))
        return self.variants[best]

    def launch(self, rt: LaunchSpec, rt_flag: int, rt_args: int,
               parts: Sequence[tuple[LaunchSpec, int, int, int, int, int]],
               regs: int | None = None) -> PaddedLaunch:
        """Geometry and argument bytes of a padded launch (on the RT launch path: one pass,
        a precompiled struct; ``scripts/padded_enqueue_cost.py`` measures it).

        ``rt_flag``/``rt_args``: device addresses of the RT stream's flag word and of the RT
        kernel's packed struct. ``parts``: ``(spec, flag, args, first_block, n_blocks,
        occupancy)`` per BE part (device addresses again). The grid is
        :func:`pad_table`'s: RT blocks first, then each part's range in order.
        ``regs``: None = the ``parts`` selection (the largest of the parts' ``occupancy``,
        1 without parts: :meth:`variant_for`); else the ``regs`` selection for that many
        registers per thread (the most of the RT kernel's and the parts' plain kernels:
        :meth:`variant_for_regs`).
        """
        if rt.nblk != rt.grid[0]:
            raise ValueError("padded RT kernels need one grid block per logical block")
        if len(parts) + 1 > MAX_PAD_PARTS:
            raise ValueError(f"{len(parts) + 1} parts; a padded launch holds at most "
                             f"{MAX_PAD_PARTS}")
        ids = self.body_ids
        threads, occ, smem = rt.block[0], 1, rt.smem
        vals = [len(parts) + 1, rt_flag, rt_args, ids[rt.func], threads, 0, 0]
        pos = rt.grid[0]
        for spec, flag, args, first, n, o in parts:
            if n < 1 or first < 0 or first + n > spec.nblk:
                raise ValueError(f"padding part {spec.func}: blocks {first}+{n} empty or "
                                 f"beyond its {spec.nblk}")
            vals += (flag, args, ids[spec.func], spec.block[0], pos, first)
            pos += n
            threads = max(threads, spec.block[0])
            occ = max(occ, o)
            smem = max(smem, spec.smem)
        if threads > self.threads:
            raise ValueError(f"{threads} threads; this module's variants allow {self.threads}")
        vals += _PAD_ZEROS[:_PAD_WORDS - len(vals)]
        func = self.variant_for(occ) if regs is None else self.variant_for_regs(regs)
        return PaddedLaunch(func, (pos, 1, 1), (threads, 1, 1), smem, _PAD_STRUCT.pack(*vals))


_PAD_WORDS = 1 + len(_PART_FIELDS) * MAX_PAD_PARTS
_PAD_STRUCT = struct.Struct(f"<{_PAD_WORDS}q")
_PAD_ZEROS = (0,) * _PAD_WORDS


def _split_wrapper(code: str) -> tuple[str, str]:
    """(functor text without the __global__ wrapper, body call expression)."""
    head, glob = code.split('extern "C" __global__', 1)
    m = _BODY_RE.search(glob)
    if m is None:
        raise ValueError("wrapper without a recognisable body call")
    return head, m.group(1)


def build_padded_module(sources: Sequence[PlanSource],
                        levels: Sequence[int] = OCC_LEVELS) -> PaddedModule:
    """The padded dispatcher module for the kernels of ``sources`` (e.g. an RT/BE pair)."""
    bodies: dict[str, tuple[str, str, str]] = {}  # func -> (functor text, call, struct)
    threads = 32
    for src in sources:
        for spec in src.specs:
            threads = max(threads, spec.block[0])
        for func, code in src.wrappers.items():
            if func not in bodies:
                functor, call = _split_wrapper(code)
                struct_name = next(s.struct_name for s in src.specs if s.func == func)
                bodies[func] = (functor, call, struct_name)
    ids = {f: i for i, f in enumerate(bodies)}
    cases = []
    for f, (_, call, sname) in bodies.items():
        cases.append(f"    case {ids[f]}: {call}(*(const {sname}*)p.args, blk); break;")
    switch = "\n".join(cases)
    variants: dict[int, str] = {}
    kernels = []
    for occ in sorted(set(int(x) for x in levels)):
        if threads * occ > MAX_THREADS_PER_SM:
            continue
        name = variant_name(threads, occ)
        variants[occ] = name
        kernels.append(
            f'extern "C" __global__ void __launch_bounds__({threads}, {occ})\n'
            f"{name}(const {PAD_ARGS} a) {{ avi_pad_dispatch(a); }}\n")
    if not variants:
        raise ValueError(f"{threads} threads allow none of the occupancy levels {levels}")
    dispatch = (
        f"__device__ __forceinline__ void avi_pad_dispatch(const {PAD_ARGS}& a) {{\n"
        "    const i64 g = (i64)blockIdx.x;\n"
        "    int i = 0;\n"
        "    while (i + 1 < a.nparts && g >= a.part[i + 1].start) ++i;  // parts in grid order\n"
        "    const AviPadPart& p = a.part[i];\n"
        "    const i64 blk = p.first + (g - p.start);\n"
        "    if (threadIdx.x == 0) avi_pad_nthreads = (unsigned int)p.threads;\n"
        "    AVI_PREEMPT_CHECK(p.flag)  // this part's stream flag, block-uniform (common.cuh)\n"
        "    if (threadIdx.x >= avi_pad_nthreads) return;\n"
        "    switch (p.body) {\n" + switch + "\n    default: break;\n    }\n"
        "}\n"
    )
    source = (_padded_prelude() + _pad_args_decl() + "\n// bodies\n"
              + "\n".join(b[0] for b in bodies.values()) + "\n" + dispatch + "\n"
              + "\n".join(kernels))
    return PaddedModule(source, ids, {f: b[2] for f, b in bodies.items()}, threads, variants)
