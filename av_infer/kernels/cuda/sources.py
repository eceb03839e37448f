"""Plan -> CUDA C: one source per plan plus one :class:`LaunchSpec` per kernel.

Why generated: a kernel's body is a shared, templated ``__device__`` function of its kind
family (``*.cu`` next to this file); what differs per kernel (dtypes, the unary op chain,
the conv/gemm epilogue) becomes a small functor and an ``extern "C" __global__`` wrapper.
Wrappers are deduplicated by their text, so a plan compiles to one NVRTC module whose size
grows with the number of *distinct* kernels, not with the plan's length.

Every wrapper has the same shape (REEF §4.1 lazy eviction, §5.1 bodies for padding)::

    extern "C" __global__ void NAME(const unsigned int* flag, STRUCT a) {
        AVI_PREEMPT_CHECK(flag)          // one flag word per stream, block-uniform exit
        for (i64 b = avi_block_id(); b < a.nblk; b += avi_grid_blocks()) BODY(a, b);
    }

Arguments: a flag pointer and one struct passed by value whose fields are all 8 bytes
(``long long``, ``double``, pointers), so the C layout has no padding and the Python
packer (``LaunchSpec.pack``) and the C declaration come from the same table (``LAYOUTS``).

Launch geometry is the plan's: :func:`av_infer.model.geometry.geometry_for` decides it when
the plan is built, and the wrappers only apply it through
:func:`av_infer.model.geometry.cuda_launch` (see there), from the kind of work the body
does (``_Gen.work``: ``elem``, ``row`` or ``mm``) and how much (``_Gen.count``):
* elementwise-style kinds (unary, binary, where, cast, copy, batchnorm, transpose, slice,
  concat, split, pad, gather, resize, pool, depthwise conv) take the plan's blocks x threads,
  at most one block per ``threads`` elements; logical block b handles elements
  [b*per, (b+1)*per) with per = ceil(n / blocks), so any block count is correct;
* row kinds (reduce, global_pool, softmax, layernorm) use one logical block per row and
  the plan's thread count when it is a multiple of 32 (else 256);
* conv / conv_transpose / gemm use 64x64 tiles, 256 threads, one logical block per
  (tile, batch entry or image*group): the plan's block count, launched as a 1-D grid
  (logical blocks beyond 2^31-1 loop inside the wrapper).
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from av_infer.errors import UnsupportedModelError
from av_infer.kernels.cpu import slice_index
from av_infer.kernels.cpu_ops import act_params
from av_infer.kernels.cpu_spatial import _as_2d_args, _to4d, resize_taps
from av_infer.model.geometry import GEMM_THREADS, TILE, cuda_launch
from av_infer.model.plan import ENGINE_KINDS, KERNEL_KINDS, Kernel, Plan

__all__ = [
    "FAMILY_FILES",
    "LAYOUTS",
    "ArgTemplate",
    "AuxRef",
    "LaunchSpec",
    "PlanSource",
    "TensorRef",
    "build_plan_source",
    "slot_address",
    "supported_kinds",
]

HERE = Path(__file__).parent
MAXR = 8
#: concat/split parts per kernel (DenseNet-201 concatenates 49; the struct stays ~2 KB,
#: within the 4 KB kernel-parameter limit)
MAXPARTS = 128
MAXBATCH = 6
NPARAM = 16

#: Family sources, in include order (common helpers first).
FAMILY_FILES = ("common.cuh", "elementwise.cu", "movement.cu", "reduce.cu", "gemm.cu")

# -- argument structs: (field, kind, count); kind: p pointer, q int64, d float64 ----------
Layout = list[tuple[str, str, int]]
LAYOUTS: dict[str, Layout] = {
    "EwArgs": [
        ("y", "p", 1), ("n", "q", 1), ("per", "q", 1), ("nblk", "q", 1), ("rank", "q", 1),
        ("contig", "q", 1), ("shape", "q", MAXR), ("in_", "p", 5), ("st", "q", 5 * MAXR),
        ("p", "d", NPARAM),
    ],
    "MmArgs": [
        ("y", "p", 1), ("a", "p", 1), ("b", "p", 1), ("bias", "p", 1), ("res", "p", 1),
        ("M", "q", 1), ("N", "q", 1), ("K", "q", 1), ("tiles_m", "q", 1), ("tiles_n", "q", 1),
        ("nblk", "q", 1), ("n", "q", 1), ("per", "q", 1),
        ("sam", "q", 1), ("sak", "q", 1), ("sbk", "q", 1), ("sbn", "q", 1), ("brank", "q", 1),
        ("bshape", "q", MAXBATCH), ("sab", "q", MAXBATCH), ("sbb", "q", MAXBATCH),
        ("C", "q", 1), ("H", "q", 1), ("W", "q", 1), ("cg", "q", 1), ("coutg", "q", 1),
        ("cout", "q", 1), ("groups", "q", 1), ("ho", "q", 1), ("wo", "q", 1), ("kh", "q", 1),
        ("kw", "q", 1), ("sh", "q", 1), ("sw", "q", 1), ("pt", "q", 1), ("pl", "q", 1),
        ("dh", "q", 1), ("dw", "q", 1),
        ("alpha", "d", 1), ("beta", "d", 1), ("bias_mode", "q", 1), ("bias_n", "q", 1),
        ("bias_st", "q", MAXR), ("res_mode", "q", 1), ("res_st", "q", MAXR), ("yrank", "q", 1),
        ("yshape", "q", MAXR), ("p", "d", NPARAM),
    ],
    "RowArgs": [
        ("x", "p", 1), ("y", "p", 1), ("scale", "p", 1), ("bias", "p", 1), ("rows", "q", 1),
        ("cols", "q", 1), ("nblk", "q", 1), ("krank", "q", 1), ("kshape", "q", MAXR),
        ("kst", "q", MAXR), ("rrank", "q", 1), ("rshape", "q", MAXR), ("rst", "q", MAXR),
        ("scale_n", "q", 1), ("bias_n", "q", 1), ("eps", "d", 1),
    ],
    "PoolArgs": [
        ("x", "p", 1), ("y", "p", 1), ("n", "q", 1), ("per", "q", 1), ("nblk", "q", 1),
        ("h", "q", 1), ("w", "q", 1), ("ho", "q", 1), ("wo", "q", 1), ("kh", "q", 1),
        ("kw", "q", 1), ("sh", "q", 1), ("sw", "q", 1), ("pt", "q", 1), ("pl", "q", 1),
        ("dh", "q", 1), ("dw", "q", 1), ("hp", "q", 1), ("wp", "q", 1), ("incl", "q", 1),
        ("minval", "d", 1),
    ],
    "CatArgs": [
        ("y", "p", 1), ("parts", "p", MAXPARTS), ("offs", "q", MAXPARTS + 1), ("nparts", "q", 1),
        ("axis_len", "q", 1), ("inner", "q", 1), ("n", "q", 1), ("per", "q", 1),
        ("nblk", "q", 1),
    ],
    "PadArgs": [
        ("x", "p", 1), ("y", "p", 1), ("rank", "q", 1), ("oshape", "q", MAXR),
        ("begin", "q", MAXR), ("lo", "q", MAXR), ("len", "q", MAXR), ("xst", "q", MAXR),
        ("mode", "q", 1), ("value", "d", 1), ("n", "q", 1), ("per", "q", 1), ("nblk", "q", 1),
    ],
    "GatherArgs": [
        ("data", "p", 1), ("idx", "p", 1), ("y", "p", 1), ("axis_len", "q", 1),
        ("nidx", "q", 1), ("inner", "q", 1), ("n", "q", 1), ("per", "q", 1), ("nblk", "q", 1),
    ],
    "ResizeArgs": [
        ("x", "p", 1), ("y", "p", 1), ("rank", "q", 1), ("oshape", "q", MAXR),
        ("xst", "q", MAXR), ("tbl_idx", "p", MAXR), ("tbl_w", "p", MAXR), ("taps", "q", MAXR),
        ("n", "q", 1), ("per", "q", 1), ("nblk", "q", 1),
    ],
}


def _slot_of(layout: Layout, name: str) -> int:
    i = 0
    for f, _, count in layout:
        if f == name:
            return i
        i += count
    raise KeyError(name)


#: struct name -> index of its ``nblk`` slot (every argument struct has one)
_NBLK_SLOT = {n: _slot_of(lay, "nblk") for n, lay in LAYOUTS.items()}


def struct_decl(name: str) -> str:
    """The C declaration of an argument struct (8-byte fields only: no padding)."""
    ctype = {"p": "void*", "q": "long long", "d": "double"}
    lines = [f"struct {name} {{"]
    for f, kind, count in LAYOUTS[name]:
        suffix = f"[{count}]" if count > 1 or f in ("in_", "parts") else ""
        lines.append(f"    {ctype[kind]} {f}{suffix};")
    lines.append("};")
    return "\n".join(lines)


def struct_size(name: str) -> int:
    """Bytes of an argument struct (what the packer writes and the C side must agree on)."""
    return 8 * sum(c for _, _, c in LAYOUTS[name])


@dataclass(frozen=True)
class TensorRef:
    """A pointer slot: the device address of tensor ``name`` plus ``extra`` bytes."""

    name: str
    extra: int = 0


@dataclass(frozen=True)
class AuxRef:
    """A pointer slot: the device address of the plan's auxiliary array ``index``."""

    index: int


Slot = int | float | TensorRef | AuxRef | None


def slot_address(plan: Plan, ref: TensorRef | AuxRef, weights: int, arena: int,
                 aux: Sequence[int]) -> int:
    """Device address of a pointer slot, given the base addresses of the plan's weights,
    of one task's activation arena and of each aux array (every device, and the emulator
    harness, lays memory out this way)."""
    if isinstance(ref, AuxRef):
        return aux[ref.index]
    t = plan.tensors[ref.name]
    b = plan.buffers[t.buffer]
    return (weights if b.role == "weight" else arena) + b.offset + t.byte_offset + ref.extra


@dataclass
class LaunchSpec:
    """Everything needed to launch one kernel of a plan, except task addresses."""

    kernel: int
    func: str
    struct_name: str
    slots: list[Slot]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int = 0
    fmt: str = field(init=False)
    ref_slots: list[int] = field(init=False)
    #: logical blocks (the struct's ``nblk`` slot): what the wrapper loops over and DKP
    #: parts count; a launch may have fewer grid blocks (wrappers loop past 2^31 - 1)
    nblk: int = field(init=False)

    def __post_init__(self) -> None:
        kinds = "".join(
            ("d" if k == "d" else "q") * c for _, k, c in LAYOUTS[self.struct_name]
        )
        self.fmt = "<" + kinds
        self.ref_slots = [i for i, s in enumerate(self.slots) if isinstance(s, (TensorRef, AuxRef))]
        self.nblk = int(self.slots[_NBLK_SLOT[self.struct_name]])  # type: ignore[arg-type]

    @property
    def nbytes(self) -> int:
        return 8 * len(self.slots)

    def pack(self, resolve: Callable[[TensorRef | AuxRef], int]) -> bytes:
        """The argument struct's bytes with every pointer slot resolved to an address."""
        vals: list[Any] = [0 if s is None else s for s in self.slots]
        for i in self.ref_slots:
            vals[i] = int(resolve(self.slots[i]))  # type: ignore[arg-type]
        return struct.pack(self.fmt, *vals)


@dataclass(frozen=True)
class ArgTemplate:
    """Every kernel's argument struct of one loaded plan, packed once, with the pointer
    slots into a task's activation arena left as offsets from address 0.

    Why: a task's structs differ from another's only in those slots (weights and aux arrays
    are the model's, fixed at load; numbers are constants), and packing ``LaunchSpec.pack``
    per kernel in Python for every request held the GIL for a time that grows with the
    kernel count (508 structs for densenet201). ``for_arena(base)`` gives the same bytes as
    packing every spec with that arena base (``slot_address`` is linear in the base), with
    one vectorised add. Guaranteed: identical bytes (``tests/kernels``)."""

    #: the structs back to back as 64-bit words (every slot is 8 bytes), arena base 0
    words: np.ndarray
    #: word indices of the slots that point into the arena
    arena_slots: np.ndarray
    #: byte offset of each kernel's struct in the bytes
    offs: tuple[int, ...]

    @classmethod
    def build(cls, plan: Plan, specs: Sequence[LaunchSpec], weights: int,
              aux: Sequence[int]) -> ArgTemplate:
        """The template of ``specs`` for a plan whose weights and aux arrays live at
        ``weights`` / ``aux`` (device addresses)."""
        def resolve(ref: TensorRef | AuxRef) -> int:
            return slot_address(plan, ref, weights, 0, aux)

        blobs, offs, slots, pos = [], [], [], 0
        for spec in specs:
            blobs.append(spec.pack(resolve))
            offs.append(pos)
            for i in spec.ref_slots:
                ref = spec.slots[i]
                if (isinstance(ref, TensorRef)
                        and plan.buffers[plan.tensors[ref.name].buffer].role != "weight"):
                    slots.append(pos // 8 + i)
            pos += spec.nbytes
        words = np.frombuffer(b"".join(blobs), dtype=np.uint64).copy()
        return cls(words, np.asarray(slots, dtype=np.int64), tuple(offs))

    def for_arena(self, base: int) -> bytes:
        """The structs of a task whose activation arena starts at device address ``base``."""
        w = self.words.copy()
        w[self.arena_slots] += np.uint64(base)
        return w.tobytes()


@dataclass
class PlanSource:
    """A plan's CUDA source, its launch specs (index = kernel index) and aux arrays."""

    source: str
    specs: list[LaunchSpec]
    aux: list[np.ndarray]
    functions: list[str]
    wrappers: dict[str, str] = field(default_factory=dict)


# -- helpers ------------------------------------------------------------------------------
CTYPE = {
    "float32": "float", "float64": "double", "int64": "long long", "int32": "int",
    "int16": "short", "int8": "signed char", "uint8": "unsigned char",
    "uint16": "unsigned short", "uint32": "unsigned int", "uint64": "unsigned long long",
    "bool": "bool",
}
WORD = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}


def _ct(dtype: Any) -> str:
    name = np.dtype(dtype).name
    if name not in CTYPE:
        raise NotImplementedError(f"dtype {name} has no CUDA kernel")
    return CTYPE[name]


def _word(dtype: Any) -> str:
    return WORD[np.dtype(dtype).itemsize]


def _cdiv(a: int, b: int) -> int:
    return max(1, -(-int(a) // int(b)))


def _prod(s: Any) -> int:
    return int(np.prod(s, dtype=np.int64)) if len(s) else 1


def _contig(shape: tuple[int, ...]) -> list[int]:
    st, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        st[d] = acc
        acc *= int(shape[d])
    return st


def _bstrides(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[int]:
    """Element strides of a contiguous ``in_shape`` broadcast to ``out_shape`` (0 = bcast)."""
    r = len(out_shape)
    pad = (1,) * (r - len(in_shape)) + tuple(in_shape)
    st = _contig(pad)
    return [0 if pad[d] == 1 and out_shape[d] != 1 else st[d] for d in range(r)]


def _collapse(
    shape: tuple[int, ...], strides: list[list[int]]
) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge adjacent dims every operand walks contiguously."""
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    sh = [int(shape[d]) for d in dims]
    sts = [[s[d] for d in dims] for s in strides]
    i = len(sh) - 1
    while i > 0:
        if all(s[i - 1] == s[i] * sh[i] for s in sts):
            sh[i - 1] *= sh[i]
            for s in sts:
                s[i - 1] = s[i]
                del s[i]
            del sh[i]
        i -= 1
    if not sh:
        sh, sts = [1], [[0] for _ in sts]
    return sh, sts


def _pad(vals: list[Any], n: int, fill: Any = 0) -> list[Any]:
    if len(vals) > n:
        raise NotImplementedError(f"needs {len(vals)} entries, the kernel supports {n}")
    return list(vals) + [fill] * (n - len(vals))


def _norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


class _Ctx:
    """Plan lookups for the generators."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.aux: list[np.ndarray] = []

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(s) for s in self.plan.tensors[name].shape)

    def dtype(self, name: str) -> np.dtype:
        return np.dtype(self.plan.tensors[name].dtype)

    def add_aux(self, arr: np.ndarray) -> AuxRef:
        self.aux.append(np.ascontiguousarray(arr))
        return AuxRef(len(self.aux) - 1)


@dataclass
class _Gen:
    """What a kind generator returns: code with NAME placeholder, struct, fields, work."""

    code: str
    struct_name: str
    fields: dict[str, Any]
    work: str  # "elem" | "row" | "mm"
    count: int  # elements, rows, or logical tiles
    threads: int = 256


def _wrapper(struct_name: str, body: str, bounds: int | None = None) -> str:
    lb = f"__launch_bounds__({bounds}) " if bounds else ""
    return (
        f'extern "C" __global__ void {lb}NAME(const unsigned int* flag, {struct_name} a) {{\n'
        "    AVI_PREEMPT_CHECK(flag)\n"
        f"    for (i64 b = avi_block_id(); b < a.nblk; b += avi_grid_blocks()) {body}(a, b);\n"
        "}\n"
    )


# -- elementwise family -------------------------------------------------------------------
_MATH = {
    "sqrt": "sqrt", "erf": "erf", "exp": "exp", "log": "log", "floor": "floor",
    "ceil": "ceil", "round": "rint", "sin": "sin", "cos": "cos", "tan": "tan",
    "atan": "atan", "asin": "asin", "acos": "acos", "sinh": "sinh", "cosh": "cosh",
}
_SIMPLE = {
    "relu": "act_relu<CT>(v)", "sigmoid": "act_sigmoid<CT>(v)", "tanh": "act_tanh<CT>(v)",
    "hard_swish": "act_hard_swish<CT>(v)", "gelu_erf": "act_gelu_erf<CT>(v)",
    "gelu": "act_gelu_erf<CT>(v)", "gelu_tanh": "act_gelu_tanh<CT>(v)",
    "softplus": "act_softplus<CT>(v)", "softsign": "act_softsign<CT>(v)",
    "silu": "act_silu<CT>(v)", "swish": "act_silu<CT>(v)", "mish": "act_mish<CT>(v)",
    "sign": "act_sign<CT>(v)", "abs": "act_abs<CT>(v)", "neg": "-v",
    "reciprocal": "CT(1) / v", "identity": "v",
}
_PARAMS = {
    "leaky_relu": ("alpha",), "clip": ("min", "max"), "hard_sigmoid": ("alpha", "beta"),
    "elu": ("alpha",), "selu": ("alpha", "gamma"),
}
_INT_OK = {"relu", "neg", "abs", "sign", "identity", "clip"}


def _act_lines(steps: list[Any], ct: str, params: list[float]) -> list[str]:
    """C statements applying unary ops / activations to ``v`` (type CT); params appended."""
    is_float = ct in ("float", "double")
    out = []
    for step in steps:
        name = step[0] if isinstance(step, (list, tuple)) else step
        raw = step[1] if isinstance(step, (list, tuple)) and len(step) > 1 else None
        if ct == "bool":
            if name == "not":
                out.append("v = !v;")
                continue
            if name == "identity":
                continue
            raise NotImplementedError(f"unary op {name!r} on bool")
        if not is_float and name not in _INT_OK:
            raise NotImplementedError(f"unary op {name!r} on integer type {ct}")
        if name in _SIMPLE:
            out.append(f"v = {_SIMPLE[name]};")
        elif name in _MATH:
            fn = _MATH[name] + ("f" if ct == "float" else "")
            out.append(f"v = (CT){fn}(v);")
        elif name in _PARAMS:
            p = act_params(name, raw)
            idx = []
            for pn in _PARAMS[name]:
                val = p.get(pn)
                idx.append(len(params))
                params.append(float("nan") if val is None else float(val))
            args = ", ".join(f"a.p[{i}]" for i in idx)
            out.append(f"v = act_{name}<CT>(v, {args});")
        elif name == "not":
            out.append("v = !v;")
        else:
            raise NotImplementedError(f"unary op {name!r} has no CUDA version")
    return out


def _ew(ctx: _Ctx, out: str, shape: tuple[int, ...], operands: list[tuple[TensorRef, list[int]]],
        apply_lines: list[str], params: list[float] | None = None) -> _Gen:
    """An elementwise kernel over the contiguous output ``out`` of iteration ``shape``."""
    nin = len(operands)
    sh, sts = _collapse(shape, [s for _, s in operands])
    contig = all(s == _contig(tuple(sh)) for s in sts)
    st = []
    for s in sts:
        st += _pad(s, MAXR)
    st = _pad(st, 5 * MAXR)
    code = (
        "struct FNAME {\n"
        "    static __device__ __forceinline__ void apply(const EwArgs& a, i64 e, const i64* o) {\n"
        + "".join(f"        {ln}\n" for ln in apply_lines)
        + "    }\n};\n"
        + _wrapper("EwArgs", f"ew_body<FNAME, {nin}>")
    )
    n = _prod(shape)
    fields = dict(
        y=TensorRef(out), n=n, rank=len(sh), contig=int(contig), shape=_pad(sh, MAXR, 1),
        in_=_pad([r for r, _ in operands], 5, None), st=st,
        p=_pad([float(x) for x in (params or [])], NPARAM, 0.0),
    )
    return _Gen(code, "EwArgs", fields, "elem", n)


def _load(i: int, dtype: np.dtype, ct: str) -> str:
    return f"(({ct})((const {_ct(dtype)}*)a.in_[{i}])[o[{i}]])"


def _store(dtype: np.dtype, expr: str) -> str:
    t = _ct(dtype)
    if t == "bool":
        return f"((bool*)a.y)[e] = (bool)({expr} != 0);"
    return f"(({t}*)a.y)[e] = ({t})({expr});"


def gen_unary(k: Kernel, ctx: _Ctx) -> _Gen:
    x, y = k.inputs[0], k.outputs[0]
    ys, ydt = ctx.shape(y), ctx.dtype(y)
    ct = _ct(ydt)
    params: list[float] = []
    lines = [f"typedef {ct} CT;", f"CT v = {_load(0, ctx.dtype(x), 'CT')};"]
    lines += _act_lines(list(k.args.get("ops") or []), ct, params)
    lines.append(_store(ydt, "v"))
    return _ew(ctx, y, ys, [(TensorRef(x), _contig(ys))], lines, params)


_BIN = {
    "add": "x0 + x1", "sub": "x0 - x1", "mul": "x0 * x1", "div": "avi_div<CT>(x0, x1)",
    "pow": "avi_pow<CT>(x0, x1)", "max": "act_max<CT>(x0, x1)", "min": "act_min<CT>(x0, x1)",
    "mod": "avi_mod<CT>(x0, x1)", "equal": "x0 == x1", "less": "x0 < x1",
    "less_equal": "x0 <= x1", "greater": "x0 > x1", "greater_equal": "x0 >= x1",
    "and": "(x0 != CT(0)) && (x1 != CT(0))", "or": "(x0 != CT(0)) || (x1 != CT(0))",
    "xor": "(x0 != CT(0)) != (x1 != CT(0))",
}


def gen_binary(k: Kernel, ctx: _Ctx) -> _Gen:
    op = k.args["op"]
    if op not in _BIN:
        raise NotImplementedError(f"binary op {op!r}")
    a, b, y = k.inputs[0], k.inputs[1], k.outputs[0]
    shape = tuple(np.broadcast_shapes(ctx.shape(a), ctx.shape(b)))
    ct = _ct(np.result_type(ctx.dtype(a), ctx.dtype(b)))
    if ct == "bool" and op in ("add", "sub", "mul", "div", "pow", "mod"):
        ct = "int"
    lines = [f"typedef {ct} CT;", f"const CT x0 = {_load(0, ctx.dtype(a), 'CT')};",
             f"const CT x1 = {_load(1, ctx.dtype(b), 'CT')};",
             _store(ctx.dtype(y), f"({_BIN[op]})")]
    ops = [(TensorRef(t), _bstrides(ctx.shape(t), shape)) for t in (a, b)]
    return _ew(ctx, y, shape, ops, lines)


def gen_where(k: Kernel, ctx: _Ctx) -> _Gen:
    c, a, b = k.inputs[:3]
    y = k.outputs[0]
    ys = ctx.shape(y)
    ct = _ct(ctx.dtype(y))
    lines = [f"typedef {ct} CT;",
             f"const bool c = ((const {_ct(ctx.dtype(c))}*)a.in_[0])[o[0]] != 0;",
             _store(ctx.dtype(y),
                    f"(c ? {_load(1, ctx.dtype(a), 'CT')} : {_load(2, ctx.dtype(b), 'CT')})")]
    ops = [(TensorRef(t), _bstrides(ctx.shape(t), ys)) for t in (c, a, b)]
    return _ew(ctx, y, ys, ops, lines)


def _copy_like(k: Kernel, ctx: _Ctx, ref: TensorRef, strides: list[int]) -> _Gen:
    x, y = k.inputs[0], k.outputs[0]
    xt, yt = ctx.dtype(x), ctx.dtype(y)
    if xt == yt:
        w = _word(yt)
        lines = [f"(({w}*)a.y)[e] = ((const {w}*)a.in_[0])[o[0]];"]
    else:
        lines = [f"typedef {_ct(xt)} CT;", "const CT v = ((const CT*)a.in_[0])[o[0]];",
                 _store(yt, "v")]
    return _ew(ctx, y, ctx.shape(y), [(ref, strides)], lines)


def gen_copy(k: Kernel, ctx: _Ctx) -> _Gen:
    return _copy_like(k, ctx, TensorRef(k.inputs[0]), _contig(ctx.shape(k.outputs[0])))


gen_cast = gen_copy


def gen_transpose(k: Kernel, ctx: _Ctx) -> _Gen:
    xs = ctx.shape(k.inputs[0])
    perm = k.args.get("perm")
    perm = list(range(len(xs)))[::-1] if perm is None else [int(p) for p in perm]
    xst = _contig(xs)
    return _copy_like(k, ctx, TensorRef(k.inputs[0]), [xst[p] for p in perm])


def gen_slice(k: Kernel, ctx: _Ctx) -> _Gen:
    xs = ctx.shape(k.inputs[0])
    sl = slice_index(k.args, xs)
    xst = _contig(xs)
    base, strides = 0, []
    for d, s in enumerate(sl):
        start, _, step = s.indices(xs[d])
        if len(range(*s.indices(xs[d]))):
            base += start * xst[d]
        strides.append(step * xst[d])
    item = ctx.dtype(k.inputs[0]).itemsize
    return _copy_like(k, ctx, TensorRef(k.inputs[0], base * item), strides)


def gen_batchnorm(k: Kernel, ctx: _Ctx) -> _Gen:
    x, y = k.inputs[0], k.outputs[0]
    xs = ctx.shape(x)
    ch = 1 if len(xs) > 1 else 0
    pst = [1 if d == ch else 0 for d in range(len(xs))]
    ct = _ct(ctx.dtype(y))
    if ct not in ("float", "double"):
        raise NotImplementedError("batchnorm on a non-float type")
    loads = [f"const double s{i} = (double){_load(i, ctx.dtype(t), ct)};"
             for i, t in enumerate(k.inputs[:5])]
    lines = [f"typedef {ct} CT;", *loads,
             "const double mul = s1 / sqrt(s4 + a.p[0]);", "const double add = s2 - s3 * mul;"]
    if ct == "float":
        lines.append("((float*)a.y)[e] = __fadd_rn(__fmul_rn((float)s0, (float)mul), (float)add);")
    else:
        lines.append("((double*)a.y)[e] = s0 * mul + add;")
    ops = [(TensorRef(x), _contig(xs))] + [(TensorRef(t), pst) for t in k.inputs[1:5]]
    return _ew(ctx, y, xs, ops, lines, [float(k.args.get("epsilon", 1e-5))])


# -- movement -----------------------------------------------------------------------------
def _elem(code: str, struct_name: str, fields: dict[str, Any], n: int) -> _Gen:
    fields = dict(fields, n=n)
    return _Gen(code, struct_name, fields, "elem", n)


def _cat_fields(shape: tuple[int, ...], axis: int, parts: list[str], sizes: list[int]) -> dict:
    if len(parts) > MAXPARTS:
        raise NotImplementedError(f"{len(parts)} parts; the kernel supports {MAXPARTS}")
    offs = [0]
    for s in sizes:
        offs.append(offs[-1] + int(s))
    return dict(parts=_pad([TensorRef(p) for p in parts], MAXPARTS, None),
                offs=_pad(offs, MAXPARTS + 1, offs[-1]), nparts=len(parts),
                axis_len=int(shape[axis]), inner=_prod(shape[axis + 1:]))


def gen_concat(k: Kernel, ctx: _Ctx) -> _Gen:
    y = k.outputs[0]
    ys = ctx.shape(y)
    axis = _norm_axis(int(k.args.get("axis", 0)), len(ys))
    parts = [t for t in k.inputs if ctx.shape(t) and _prod(ctx.shape(t)) > 0]
    f = _cat_fields(ys, axis, parts, [ctx.shape(t)[axis] for t in parts])
    f["y"] = TensorRef(y)
    code = _wrapper("CatArgs", f"concat_body<{_word(ctx.dtype(y))}>")
    return _elem(code, "CatArgs", f, _prod(ys))


def gen_split(k: Kernel, ctx: _Ctx) -> _Gen:
    x = k.inputs[0]
    xs = ctx.shape(x)
    axis = _norm_axis(int(k.args.get("axis", 0)), len(xs))
    sizes = k.args.get("sizes") or [ctx.shape(o)[axis] for o in k.outputs]
    f = _cat_fields(xs, axis, list(k.outputs), [int(s) for s in sizes])
    f["y"] = TensorRef(x)
    code = _wrapper("CatArgs", f"split_body<{_word(ctx.dtype(x))}>")
    return _elem(code, "CatArgs", f, _prod(xs))


def gen_pad(k: Kernel, ctx: _Ctx) -> _Gen:
    x, y = k.inputs[0], k.outputs[0]
    xs, ys = ctx.shape(x), ctx.shape(y)
    r = len(xs)
    pads = [int(p) for p in k.args["pads"]]
    mode = {"constant": 0, "reflect": 1, "edge": 2, "wrap": 3}.get(k.args.get("mode", "constant"))
    if mode is None:
        raise NotImplementedError(f"pad mode {k.args.get('mode')!r}")
    value = k.args.get("value", 0.0)
    lo = [max(-pads[i], 0) for i in range(r)]
    ln = [xs[i] - max(-pads[i + r], 0) - lo[i] for i in range(r)]
    f = dict(x=TensorRef(x), y=TensorRef(y), rank=r, oshape=_pad(list(ys), MAXR, 1),
             begin=_pad([max(pads[i], 0) for i in range(r)], MAXR), lo=_pad(lo, MAXR),
             len=_pad(ln, MAXR, 1), xst=_pad(_contig(xs), MAXR), mode=mode,
             value=float(0.0 if value is None else value))
    code = _wrapper("PadArgs", f"pad_body<{_ct(ctx.dtype(y))}>")
    return _elem(code, "PadArgs", f, _prod(ys))


def gen_gather(k: Kernel, ctx: _Ctx) -> _Gen:
    d, i, y = k.inputs[0], k.inputs[1], k.outputs[0]
    ds = ctx.shape(d)
    axis = _norm_axis(int(k.args.get("axis", 0)), len(ds))
    f = dict(data=TensorRef(d), idx=TensorRef(i), y=TensorRef(y), axis_len=ds[axis],
             nidx=_prod(ctx.shape(i)), inner=_prod(ds[axis + 1:]))
    code = _wrapper("GatherArgs", f"gather_body<{_word(ctx.dtype(d))}, {_ct(ctx.dtype(i))}>")
    return _elem(code, "GatherArgs", f, _prod(ctx.shape(y)))


def gen_resize(k: Kernel, ctx: _Ctx) -> _Gen:
    a = k.args
    x, y = k.inputs[0], k.outputs[0]
    xs, ys = ctx.shape(x), ctx.shape(y)
    mode = a.get("mode", "nearest")
    ctm = a.get("coordinate_transformation_mode", "half_pixel")
    nmode = a.get("nearest_mode", "round_prefer_floor")
    scales = list(a.get("scales") or [])
    excl = bool(a.get("exclude_outside", 0))
    cubic_a = float(a.get("cubic_coeff_a", -0.75))
    if mode not in ("nearest", "linear", "cubic"):
        raise NotImplementedError(f"resize mode {mode!r}")

    def scale_of(ax: int) -> float:
        if ax < len(scales) and scales[ax] and float(scales[ax]) > 0:
            return float(scales[ax])
        return ys[ax] / xs[ax]

    taps, tidx, tw = [0] * len(xs), [None] * len(xs), [None] * len(xs)
    for ax in range(len(xs)):
        if xs[ax] == ys[ax] and scale_of(ax) == 1.0:
            continue
        n_in, n_out = xs[ax], ys[ax]
        idx, wts = resize_taps(mode, ctm, nmode, n_in, n_out, scale_of(ax), cubic_a, excl)
        taps[ax] = idx.shape[1]
        tidx[ax] = ctx.add_aux(idx.astype(np.int64))
        tw[ax] = ctx.add_aux(wts.astype(np.float32))
    dt = ctx.dtype(y)
    acc = "double" if dt == np.float64 else "float"
    f = dict(x=TensorRef(x), y=TensorRef(y), rank=len(xs), oshape=_pad(list(ys), MAXR, 1),
             xst=_pad(_contig(xs), MAXR), tbl_idx=_pad(tidx, MAXR, None),
             tbl_w=_pad(tw, MAXR, None), taps=_pad(taps, MAXR))
    code = _wrapper("ResizeArgs", f"resize_body<{_ct(dt)}, {acc}>")
    return _elem(code, "ResizeArgs", f, _prod(ys))


# -- rows ---------------------------------------------------------------------------------
def _rows(x_shape: tuple[int, ...], axes: tuple[int, ...]) -> dict[str, Any]:
    """RowArgs geometry: kept dims index rows, reduced dims index columns (x contiguous)."""
    st = _contig(x_shape)
    kept = [d for d in range(len(x_shape)) if d not in axes]
    ksh, (kst,) = _collapse(tuple(x_shape[d] for d in kept), [[st[d] for d in kept]])
    rsh, (rst,) = _collapse(tuple(x_shape[d] for d in axes), [[st[d] for d in axes]])
    return dict(krank=len(ksh), kshape=_pad(ksh, MAXR, 1), kst=_pad(kst, MAXR),
                rrank=len(rsh), rshape=_pad(rsh, MAXR, 1), rst=_pad(rst, MAXR),
                rows=_prod([x_shape[d] for d in kept]), cols=_prod([x_shape[d] for d in axes]))


_RED = {"sum": 0, "mean": 1, "avg": 1, "max": 2, "min": 3, "prod": 4, "sum_square": 5,
        "l1": 6, "l2": 7, "log_sum": 8, "log_sum_exp": 9}


def _acc_type(dt: np.dtype) -> str:
    if dt == np.float64:
        return "double"
    if dt.kind == "f":
        return "float"
    return "long long" if dt.kind in "iub" else "float"


def _reduce_gen(k: Kernel, ctx: _Ctx, axes: tuple[int, ...], op: str) -> _Gen:
    x, y = k.inputs[0], k.outputs[0]
    if op not in _RED:
        raise NotImplementedError(f"reduce op {op!r}")
    f = _rows(ctx.shape(x), axes)
    f.update(x=TensorRef(x), y=TensorRef(y))
    dt = ctx.dtype(y)
    code = _wrapper("RowArgs", f"reduce_body<{_ct(dt)}, {_acc_type(dt)}, {_RED[op]}>")
    return _Gen(code, "RowArgs", f, "row", f["rows"])


def gen_reduce(k: Kernel, ctx: _Ctx) -> _Gen:
    xs = ctx.shape(k.inputs[0])
    axes_arg = k.args.get("axes")
    if axes_arg is None or len(axes_arg) == 0:
        if k.args.get("noop_with_empty_axes"):
            return gen_copy(k, ctx)
        axes = tuple(range(len(xs)))
    else:
        axes = tuple(sorted(_norm_axis(int(a), len(xs)) for a in axes_arg))
    return _reduce_gen(k, ctx, axes, k.args.get("op", "mean"))


def gen_global_pool(k: Kernel, ctx: _Ctx) -> _Gen:
    xs = ctx.shape(k.inputs[0])
    mode = k.args.get("mode", "avg")
    return _reduce_gen(k, ctx, tuple(range(2, len(xs))), "mean" if mode == "avg" else mode)


def gen_softmax(k: Kernel, ctx: _Ctx) -> _Gen:
    x, y = k.inputs[0], k.outputs[0]
    xs = ctx.shape(x)
    axis = _norm_axis(int(k.args.get("axis", -1)), len(xs))
    legacy = k.args.get("coerce_2d") or k.args.get("legacy")
    axes = tuple(range(axis, len(xs))) if legacy else (axis,)
    f = _rows(xs, axes)
    f.update(x=TensorRef(x), y=TensorRef(y))
    log = "true" if k.args.get("log") else "false"
    code = _wrapper("RowArgs", f"softmax_body<{_ct(ctx.dtype(y))}, {log}>")
    return _Gen(code, "RowArgs", f, "row", f["rows"])


def gen_layernorm(k: Kernel, ctx: _Ctx) -> _Gen:
    x, y = k.inputs[0], k.outputs[0]
    xs = ctx.shape(x)
    axis = _norm_axis(int(k.args.get("axis", -1)), len(xs))
    cols = _prod(xs[axis:])
    has_bias = len(k.inputs) > 2 and bool(k.inputs[2])
    scale_n = _prod(ctx.shape(k.inputs[1]))
    bias_n = _prod(ctx.shape(k.inputs[2])) if has_bias else 1
    if cols % scale_n or cols % bias_n:
        raise NotImplementedError("layernorm scale/bias must broadcast as a suffix")
    f = dict(x=TensorRef(x), y=TensorRef(y), scale=TensorRef(k.inputs[1]),
             bias=TensorRef(k.inputs[2]) if has_bias else None, rows=_prod(xs[:axis]),
             cols=cols, scale_n=scale_n, bias_n=bias_n, eps=float(k.args.get("epsilon", 1e-5)))
    code = _wrapper("RowArgs", f"layernorm_body<{_ct(ctx.dtype(y))}>")
    return _Gen(code, "RowArgs", f, "row", f["rows"])


def gen_pool(k: Kernel, ctx: _Ctx) -> _Gen:
    a = k.args
    x, y = k.inputs[0], k.outputs[0]
    xs = ctx.shape(x)
    n, c, h, w = _to4d(xs)
    _, _, ho, wo = _to4d(ctx.shape(y))
    kern = list(a["kernel"])
    if len(kern) == 1:
        kern = [1, *kern]
    s, pb, pe, d = _as_2d_args(a, len(xs) - 2)
    mode = a.get("mode", "max")
    if mode not in ("max", "avg"):
        raise NotImplementedError(f"pool mode {mode!r}")
    dt = ctx.dtype(y)
    minval = float(np.iinfo(dt).min) if dt.kind in "iu" else -math.inf
    f = dict(x=TensorRef(x), y=TensorRef(y), h=h, w=w, ho=ho, wo=wo, kh=int(kern[0]),
             kw=int(kern[1]), sh=s[0], sw=s[1], pt=pb[0], pl=pb[1], dh=d[0], dw=d[1],
             hp=h + pb[0] + pe[0], wp=w + pb[1] + pe[1],
             incl=int(bool(a.get("count_include_pad", 0))),
             minval=minval)
    code = _wrapper("PoolArgs", f"pool_body<{_ct(dt)}, {'true' if mode == 'max' else 'false'}>")
    return _elem(code, "PoolArgs", f, n * c * ho * wo)


# -- conv / gemm --------------------------------------------------------------------------
def _epilogue(k: Kernel, ctx: _Ctx, y_shape: tuple[int, ...], f: dict[str, Any]) -> str:
    """Residual/activation steps as an Epi functor; fills res/p fields."""
    params: list[float] = []
    lines = []
    res = None
    for step in k.args.get("epilogue") or []:
        if step[0] == "add":
            if res is not None:
                raise NotImplementedError("more than one residual add in an epilogue")
            res = step[1]
            lines.append("v += ((const float*)a.res)[mm_res_index(a, yi)];")
        else:
            lines += _act_lines([step], "float", params)
    f["p"] = _pad(params, NPARAM, 0.0)
    f["yrank"] = len(y_shape)
    f["yshape"] = _pad(list(y_shape), MAXR, 1)
    if res is not None:
        if ctx.dtype(res) != np.float32:
            raise NotImplementedError("residual must be float32")
        rs = ctx.shape(res)
        f["res"] = TensorRef(res)
        if _prod(rs) == _prod(y_shape):
            f["res_mode"] = 1
        else:
            f["res_mode"] = 2
            f["res_st"] = _pad(_bstrides(rs, y_shape), MAXR)
    return (
        "struct FNAME {\n"
        "    static __device__ __forceinline__ float apply(const MmArgs& a, float v, i64 yi) {\n"
        "        typedef float CT;\n"
        + "".join(f"        {ln}\n" for ln in lines)
        + "        return v;\n    }\n};\n"
    )


def _check_f32(ctx: _Ctx, names: tuple[str, ...]) -> None:
    for t in names:
        if t and ctx.dtype(t) != np.float32:
            raise NotImplementedError(f"conv/gemm kernels are float32 only ({t}: {ctx.dtype(t)})")


def gen_conv(k: Kernel, ctx: _Ctx, tf32: bool = False, transposed: bool = False) -> _Gen:
    a = k.args
    x, w, y = k.inputs[0], k.inputs[1], k.outputs[0]
    _check_f32(ctx, (x, w, y))
    xs, ys = ctx.shape(x), ctx.shape(y)
    n, c, h, wd = _to4d(xs)
    ws4 = _to4d(ctx.shape(w))
    _, cout, ho, wo = _to4d(ys)
    g = int(a.get("group", 1))
    s, pb, _, d = _as_2d_args(a, len(xs) - 2)
    if transposed:
        cg, coutg = c // g, ws4[1]
    else:
        cg, coutg = ws4[1], cout // g
    kh, kw = ws4[2], ws4[3]
    f: dict[str, Any] = dict(
        y=TensorRef(y), a=TensorRef(x), b=TensorRef(w), C=c, H=h, W=wd, cg=cg, coutg=coutg,
        cout=cout, groups=g, ho=ho, wo=wo, kh=kh, kw=kw, sh=s[0], sw=s[1], pt=pb[0], pl=pb[1],
        dh=d[0], dw=d[1], alpha=1.0, beta=1.0,
    )
    if a.get("bias"):
        f["bias"], f["bias_mode"] = TensorRef(a["bias"]), 1
    epi = _epilogue(k, ctx, ys, f)
    depthwise = not transposed and g > 1 and g == c and cout % c == 0
    if depthwise:
        code = epi + _wrapper("MmArgs", "dwconv_body<FNAME>")
        return _elem(code, "MmArgs", f, n * cout * ho * wo)  # _elem sets the n field
    f.update(M=coutg, N=ho * wo, K=cg * kh * kw)
    f.update(tiles_m=_cdiv(f["M"], TILE), tiles_n=_cdiv(f["N"], TILE))
    mode = "MM_CONVT" if transposed else "MM_CONV"
    body = f"mm_body<FNAME, {mode}, {'true' if tf32 else 'false'}>"
    code = epi + _wrapper("MmArgs", body, GEMM_THREADS)
    return _Gen(code, "MmArgs", f, "mm", f["tiles_m"] * f["tiles_n"] * n * g)


def gen_conv_transpose(k: Kernel, ctx: _Ctx, tf32: bool = False) -> _Gen:
    return gen_conv(k, ctx, tf32, transposed=True)


def gen_gemm(k: Kernel, ctx: _Ctx, tf32: bool = False) -> _Gen:
    args = k.args
    ta, tb = bool(args.get("trans_a", 0)), bool(args.get("trans_b", 0))
    a, b, y = k.inputs[0], k.inputs[1], k.outputs[0]
    _check_f32(ctx, (a, b, y))
    sa, sb, sy = ctx.shape(a), ctx.shape(b), ctx.shape(y)

    def mat(s: tuple[int, ...], is_a: bool, t: bool) -> tuple[tuple[int, ...], list[int]]:
        st = _contig(s)
        if len(s) == 1:
            return ((1, s[0]), [0, st[0]]) if is_a else ((s[0], 1), [st[0], 0])
        s2, st2 = list(s), list(st)
        if t:
            s2[-1], s2[-2] = s2[-2], s2[-1]
            st2[-1], st2[-2] = st2[-2], st2[-1]
        return tuple(s2), st2

    (a2, ast), (b2, bst) = mat(sa, True, ta), mat(sb, False, tb)
    if a2[-1] != b2[-2]:
        raise ValueError(f"{k.name}: gemm inner dims differ: {sa} @ {sb}")
    batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    r = len(batch)

    def bstr(s2: tuple[int, ...], st2: list[int]) -> list[int]:
        bs, bt = s2[:-2], st2[:-2]
        bs = (1,) * (r - len(bs)) + tuple(bs)
        bt = [0] * (r - len(bt)) + list(bt)
        return [0 if bs[i] == 1 and batch[i] != 1 else bt[i] for i in range(r)]

    bsh, (sab, sbb) = _collapse(batch, [bstr(a2, ast), bstr(b2, bst)]) if r else ([1], [[0], [0]])
    if len(bsh) > MAXBATCH:
        raise NotImplementedError(f"gemm with {len(bsh)} batch dims")
    M, K, N = a2[-2], a2[-1], b2[-1]
    nbatch = _prod(batch)
    if nbatch * M * N != _prod(sy):
        raise ValueError(f"{k.name}: gemm result does not fit output {sy}")
    f: dict[str, Any] = dict(
        y=TensorRef(y), a=TensorRef(a), b=TensorRef(b), M=M, N=N, K=K, sam=ast[-2],
        sak=ast[-1], sbk=bst[-2], sbn=bst[-1], brank=len(bsh), bshape=_pad(bsh, MAXBATCH, 1),
        sab=_pad(sab, MAXBATCH), sbb=_pad(sbb, MAXBATCH), alpha=float(args.get("alpha", 1.0)),
        beta=float(args.get("beta", 1.0)),
    )
    bias = args.get("bias")
    if bias:
        bs = ctx.shape(bias)
        f["bias"] = TensorRef(bias)
        core = tuple(bs[i] for i in range(len(bs)) if not (i < len(bs) - 1 and bs[i] == 1))
        if _prod(bs) in (1, _prod(sy)):
            f["bias_mode"], f["bias_n"] = 3, _prod(bs)
        elif sy and core == (sy[-1],) and len(bs) <= len(sy):
            f["bias_mode"], f["bias_n"] = 3, sy[-1]
        else:
            f["bias_mode"], f["bias_st"] = 2, _pad(_bstrides(bs, sy), MAXR)
    epi = _epilogue(k, ctx, sy, f)
    f.update(tiles_m=_cdiv(M, TILE), tiles_n=_cdiv(N, TILE))
    body = f"mm_body<FNAME, MM_GEMM, {'true' if tf32 else 'false'}>"
    code = epi + _wrapper("MmArgs", body, GEMM_THREADS)
    return _Gen(code, "MmArgs", f, "mm", f["tiles_m"] * f["tiles_n"] * nbatch)


GENERATORS: dict[str, Callable[..., _Gen]] = {
    "conv": gen_conv, "conv_transpose": gen_conv_transpose, "gemm": gen_gemm,
    "binary": gen_binary, "unary": gen_unary, "pool": gen_pool,
    "global_pool": gen_global_pool, "reduce": gen_reduce, "softmax": gen_softmax,
    "layernorm": gen_layernorm, "concat": gen_concat, "split": gen_split,
    "transpose": gen_transpose, "slice": gen_slice, "pad": gen_pad, "gather": gen_gather,
    "resize": gen_resize, "cast": gen_cast, "copy": gen_copy, "batchnorm": gen_batchnorm,
    "where": gen_where,
}
_TF32_KINDS = ("conv", "conv_transpose", "gemm")


def supported_kinds() -> list[str]:
    """Kinds with a CUDA generator (every kind of KERNEL_KINDS except ``trace`` and the
    engine kinds)."""
    return sorted(GENERATORS)


def missing_kinds() -> list[str]:
    return sorted(set(KERNEL_KINDS) - set(GENERATORS) - {"trace"} - ENGINE_KINDS)


def _slots(struct_name: str, fields: dict[str, Any]) -> list[Slot]:
    out: list[Slot] = []
    known = {f for f, _, _ in LAYOUTS[struct_name]}
    extra = set(fields) - known
    if extra:
        raise KeyError(f"{struct_name} has no fields {sorted(extra)}")
    for name, kind, count in LAYOUTS[struct_name]:
        v = fields.get(name)
        vals = list(v) if isinstance(v, (list, tuple)) else [v] * (1 if count == 1 else count)
        if len(vals) != count:
            raise ValueError(f"{struct_name}.{name}: {len(vals)} values for {count} slots")
        for x in vals:
            if kind == "d":
                out.append(0.0 if x is None else float(x))
            elif kind == "q":
                out.append(0 if x is None else int(x))
            else:
                out.append(x)  # TensorRef | AuxRef | None
    return out


def read_family(name: str) -> str:
    """A family source without its include guard (the plan source is one translation unit)."""
    return (HERE / name).read_text().replace("#pragma once\n", "")


def prelude() -> str:
    """Argument structs and the family bodies shared by every plan source."""
    parts = ["// generated by av_infer.kernels.cuda.sources: argument structs"]
    parts += [struct_decl(n) for n in LAYOUTS]
    parts += [f'static_assert(sizeof({n}) == {struct_size(n)}, "{n}: layout drift");'
              for n in LAYOUTS]
    parts += [read_family(f) for f in FAMILY_FILES]
    return "\n".join(parts) + "\n"


def build_plan_source(plan: Plan, tf32: bool = False) -> PlanSource:
    """CUDA source and launch specs for every kernel of ``plan``.

    ``tf32`` selects tensor-core TF32 tiles for conv/gemm (default FP32 FFMA tiles).
    Raises UnsupportedModelError naming the kernel when a kind/dtype has no CUDA version.
    """
    ctx = _Ctx(plan)
    specs: list[LaunchSpec] = []
    wrappers: dict[str, str] = {}
    for k in plan.kernels:
        gen_fn = GENERATORS.get(k.kind)
        if gen_fn is None:
            raise UnsupportedModelError({k.kind: [k.name]}, f"kernel {k.index}: no CUDA version")
        try:
            gen = gen_fn(k, ctx, tf32) if k.kind in _TF32_KINDS else gen_fn(k, ctx)
            launch = cuda_launch(k.geometry, gen.work, gen.count)
            if gen.work == "elem":
                gen.fields["per"] = launch.per
            gen.fields["nblk"] = launch.nblk
            slots = _slots(gen.struct_name, gen.fields)
        except NotImplementedError as e:  # a variant of the kind the CUDA kernels lack
            raise UnsupportedModelError(
                {k.kind: [k.name]}, f"kernel {k.index} on CUDA: {e}") from e
        except (ValueError, KeyError) as e:
            raise type(e)(f"kernel {k.index} {k.kind} ({k.name}): {e}") from e
        digest = hashlib.sha1(gen.code.encode()).hexdigest()[:12]
        func = f"avi_{k.kind}_{digest}"
        if func not in wrappers:
            wrappers[func] = gen.code.replace("FNAME", f"F_{func}").replace("NAME", func)
        specs.append(LaunchSpec(k.index, func, gen.struct_name, slots, launch.grid,
                                launch.block, 0))
    source = prelude() + "\n// kernels of plan " + plan.name.replace("\n", " ") + "\n" + "\n".join(
        wrappers.values()
    )
    return PlanSource(source, specs, ctx.aux, list(wrappers), wrappers)


def union_source(plans: list[Plan], tf32: bool = False) -> str:
    """One source holding the kernels of several plans (compile checks, warm-up)."""
    wrappers: dict[str, str] = {}
    for p in plans:
        wrappers.update(build_plan_source(p, tf32).wrappers)
    return prelude() + "\n" + "\n".join(wrappers.values())
