"""Plumbing shared by the CPU kernel modules: plan-time context, prepared kernels, scratch.

A CPU kernel is built in two stages so the hot path does no Python-level planning:

1. at plan time (``CpuPlanRunner.__init__``) a factory ``f(kernel, ctx) -> Prepared`` reads
   shapes and args, precomputes what depends only on the plan (index tables, divisors,
   weight transforms) and declares how much scratch memory it needs;
2. at bind time (once per arena) ``Prepared.bind(view, scratch)`` resolves the tensor views
   and returns a zero-argument closure that only calls numpy with ``out=`` targets.

Scratch is one array per bound arena shared by all kernels of the plan (they run one after
another), so it must be fully rewritten by every run of a kernel that uses it; this keeps
memory at the largest kernel's need instead of the sum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from av_infer.model.plan import Plan, Tensor

from .cpu_ops import ELEMENTWISE, act_params

#: Resolves a tensor name to its view (arena or weight store) for one bound arena.
ViewFn = Callable[[str], np.ndarray]
KernelFn = Callable[[], None]

ALIGN = 64


def aligned_empty(nbytes: int, align: int = ALIGN) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose data pointer is ``align``-byte aligned."""
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start : start + nbytes]


def round_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


class ScratchLayout:
    """Carves typed arrays out of a kernel's scratch slice (64-byte aligned pieces)."""

    def __init__(self) -> None:
        self.parts: list[tuple[tuple[int, ...], np.dtype]] = []
        self.nbytes = 0

    def add(self, shape: tuple[int, ...], dtype: Any) -> int:
        """Reserve an array; returns its index for :meth:`carve`."""
        dt = np.dtype(dtype)
        self.parts.append((tuple(int(s) for s in shape), dt))
        self.nbytes += round_up(int(np.prod(shape, dtype=np.int64)) * dt.itemsize)
        return len(self.parts) - 1

    def carve(self, scratch: np.ndarray) -> list[np.ndarray]:
        out = []
        pos = 0
        for shape, dt in self.parts:
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            out.append(scratch[pos : pos + n].view(dt).reshape(shape))
            pos += round_up(n)
        return out


@dataclass(frozen=True)
class Prepared:
    """A kernel after plan-time preparation: ``bind(view, scratch) -> closure``."""

    bind: Callable[[ViewFn, np.ndarray], KernelFn]
    scratch_bytes: int = 0


class PlanContext:
    """What kernel factories may look at when preparing: tensors, shapes, static weights."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._weight_views: dict[str, np.ndarray] = {}

    def tensor(self, name: str) -> Tensor:
        try:
            return self.plan.tensors[name]
        except KeyError:
            raise KeyError(f"plan {self.plan.name!r} has no tensor {name!r}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensor(name).shape)

    def dtype(self, name: str) -> np.dtype:
        return np.dtype(self.tensor(name).dtype)

    def is_weight(self, name: str) -> bool:
        t = self.tensor(name)
        buf = self.plan.buffers.get(t.buffer)
        return buf is not None and buf.role == "weight"

    def weight(self, name: str) -> np.ndarray:
        """Read-only view of a weight tensor (cached)."""
        v = self._weight_views.get(name)
        if v is None:
            t = self.tensor(name)
            if t.buffer not in self.plan.weights:
                raise KeyError(f"weight buffer {t.buffer} of {name!r} is not bound in the plan")
            v = tensor_view(np.asarray(self.plan.weights[t.buffer]), t, 0)
            v.flags.writeable = False
            self._weight_views[name] = v
        return v

    def static(self, name: str | None) -> np.ndarray | None:
        """The weight array if ``name`` is a weight, else None (known only at run time)."""
        if name is None or not self.is_weight(name):
            return None
        return self.weight(name)


def tensor_view(store: np.ndarray, t: Tensor, base: int) -> np.ndarray:
    """View of tensor ``t`` at ``base + t.byte_offset`` bytes into ``store``."""
    dt = np.dtype(t.dtype)
    if base == 0 and t.byte_offset == 0 and store.dtype == dt and store.size == t.size:
        if store.flags.c_contiguous:
            return store.reshape(t.shape)
    flat = np.ascontiguousarray(store).reshape(-1).view(np.uint8)
    start = base + t.byte_offset
    if start + t.nbytes > flat.size:
        raise ValueError(
            f"tensor {t.name!r} ({t.nbytes} B at {start}) overruns its store ({flat.size} B)"
        )
    return flat[start : start + t.nbytes].view(dt).reshape(t.shape)


def bind_epilogue(steps: list[Any] | None, y: np.ndarray, view: ViewFn,
                  bias: np.ndarray | None = None) -> list[KernelFn]:
    """Closures applying ``bias`` (broadcast to ``y``), then ``args['epilogue']``, in place
    on ``y``."""
    fns: list[KernelFn] = []
    if bias is not None:
        fns.append(lambda: np.add(y, bias, out=y))
    for step in steps or []:
        name = step[0]
        param = step[1] if len(step) > 1 else None
        if name == "add":
            r = view(param)
            if r.shape != y.shape:
                r = np.broadcast_to(r, y.shape) if r.size != y.size else r.reshape(y.shape)

            def add(r: np.ndarray = r) -> None:
                np.add(y, r, out=y)

            fns.append(add)
        else:
            if name not in ELEMENTWISE:
                raise NotImplementedError(f"epilogue activation {name!r}")
            fn, p = ELEMENTWISE[name], act_params(name, param)

            def act(fn: Any = fn, p: dict[str, Any] = p) -> None:
                fn(y, y, p)

            fns.append(act)
    return fns


class ArenaIO:
    """Graph inputs and outputs of a plan on a task's arena: what every executor shares
    (``CpuPlanRunner``, ``ort_segments.SegmentRunner``). Subclasses set ``plan`` and give
    ``view(arena, name)``.

    The input and output views of the arena used last are kept (and with them that arena,
    alive) so a caller running one arena over and over (``run``, benchmarks, the numpy
    reference) pays for building views once, not per call: for a model of a few µs the
    views cost more than the model. Inputs that already have the exact names, dtypes and
    shapes are copied without the checks below."""

    plan: Any
    _io_views: tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]] | None = None

    def view(self, arena: np.ndarray, name: str) -> np.ndarray:
        raise NotImplementedError

    def io_views(self, arena: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``(inputs, outputs)``: name -> view of that tensor in ``arena`` (cached for the
        arena used last; one tuple assignment, so concurrent callers each see a whole one)."""
        c = self._io_views
        if c is None or c[0] is not arena:
            c = (arena, {n: self.view(arena, n) for n in self.plan.inputs},
                 {n: self.view(arena, n) for n in self.plan.outputs})
            self._io_views = c
        return c[1], c[2]

    def write_inputs(self, arena: np.ndarray, inputs: dict[str, np.ndarray]) -> None:
        """Copy each graph input into its arena region (names and shapes must match exactly;
        dtypes may only widen): InvalidInputError saying what is wrong otherwise."""
        from av_infer.errors import InvalidInputError

        views, _ = self.io_views(arena)
        if len(inputs) == len(views):  # the common case: exactly what the plan takes
            exact = True
            for name, value in inputs.items():
                dst = views.get(name)
                if (dst is None or type(value) is not np.ndarray or value.dtype != dst.dtype
                        or value.shape != dst.shape):
                    exact = False
                    break
            if exact:
                for name, value in inputs.items():
                    np.copyto(views[name], value)
                return
        for name in self.plan.inputs:
            if name not in inputs:
                raise InvalidInputError(f"missing input {name!r} (expects {self.plan.inputs})")
        for name, value in inputs.items():
            if name not in self.plan.inputs:
                raise InvalidInputError(f"unknown input {name!r} (expects {self.plan.inputs})")
            dst = views[name]
            src = np.asarray(value)
            if src.shape != dst.shape:
                raise InvalidInputError(f"input {name!r}: shape {src.shape}, expected {dst.shape}")
            try:
                np.copyto(dst, src, casting="same_kind")
            except TypeError as e:
                raise InvalidInputError(
                    f"input {name!r}: dtype {src.dtype} cannot be cast to {dst.dtype}"
                ) from e

    def read_outputs(self, arena: np.ndarray) -> dict[str, np.ndarray]:
        """Fresh copies of the graph outputs (safe to keep after the arena is reused)."""
        _, views = self.io_views(arena)
        return {name: v.copy() for name, v in views.items()}
