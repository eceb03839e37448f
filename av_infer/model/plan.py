"""Plans: a model compiled into an ordered list of idempotent kernels plus a buffer layout.

A plan is the analogue of REEF's TVM-generated ``model.json``. Everything downstream
(executors, the scheduler's restore arithmetic, the simulator, padding selection) reasons
about plans only, never about ONNX.

Guarantees a plan gives its users:

* **Idempotent kernels.** No kernel writes a region it reads (no in-place ops), and the
  memory planner never lets a kernel overwrite a region that any of the ``reuse_guard``
  preceding kernels read. So re-running kernels ``k-g .. k`` (g <= reuse_guard) with the
  state left by a partial run gives bit-identical results: the precondition of
  restore-from-c. The runtime refuses ``c + 1 > reuse_guard``.
* **Views are not kernels.** Reshape, Flatten, Squeeze, Unsqueeze, Identity and Dropout
  produce a :class:`Tensor` that shares its producer's buffer with another shape.
* **Static geometry.** Each kernel carries the launch geometry its CUDA version uses, so the
  simulator and padding selection can reason about a plan before any GPU code exists.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

BufferRole = Literal["input", "output", "weight", "activation"]

#: Bump when the serialized form changes.
PLAN_FORMAT_VERSION = 1


@dataclass(frozen=True)
class Buffer:
    """A contiguous memory region.

    ``weight`` buffers live in the plan's weight store (shared by every task of the model);
    ``input``/``output``/``activation`` buffers live in the per-task activation arena at
    ``offset`` (bytes). Inputs and outputs get dedicated regions (never reused) so callers
    can write inputs and read outputs at any time.
    """

    id: int
    nbytes: int
    role: BufferRole
    offset: int = 0  # byte offset in the arena (activation/input/output) or weight store


@dataclass(frozen=True)
class Tensor:
    """A typed, shaped, C-contiguous view on a buffer (``byte_offset`` from its start)."""

    name: str
    buffer: int
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name: "float32", "int64", ...
    byte_offset: int = 0

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))  # exact on ints; far cheaper than np.prod per call

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Geometry:
    """The CUDA launch geometry of a kernel (also what the simulator and DKP use).

    ``regs`` is registers per thread (an estimate until profiled on a device).
    """

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int = 0
    regs: int = 32

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class Kernel:
    """One launch of a plan.

    ``kind`` selects the implementation on every device (see ``KERNEL_KINDS``);
    ``inputs``/``outputs`` name tensors of the plan; ``args`` are static arguments
    (JSON-serialisable: ints, floats, strings, lists); ``flops`` and ``bytes_moved`` feed
    duration estimates when no profile exists.
    """

    index: int
    kind: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    args: dict[str, Any]
    geometry: Geometry
    flops: int = 0
    bytes_moved: int = 0


@dataclass
class Plan:
    """A compiled model. ``weights`` maps weight-buffer ids to their host arrays."""

    name: str
    kernels: list[Kernel]
    tensors: dict[str, Tensor]
    buffers: dict[int, Buffer]
    inputs: list[str]  # graph input tensor names, in ONNX order
    outputs: list[str]  # graph output tensor names, in ONNX order
    weights: dict[int, np.ndarray] = field(default_factory=dict)
    arena_bytes: int = 0  # per-task activation arena size (inputs + outputs + activations)
    reuse_guard: int = 16
    stats: dict[str, Any] = field(default_factory=dict)  # compile-time counters (passes)
    #: segment plans (``model.segments``): the program each ``ort_segment`` kernel runs,
    #: indexed by its ``args["segment"]``; empty for kernel plans
    segments: list[Any] = field(default_factory=list)
    #: numeric precision the model runs at: ``fp32`` (default), ``tf32`` or ``fp16``; set
    #: at load (``Runtime.load_model(precision=...)``), read by devices that offer more than
    #: FP32 (cuda: ``CudaDevice.precisions``); not part of the compiled plan's JSON
    precision: str = "fp32"

    # -- sizes ----------------------------------------------------------------------------
    @property
    def weight_bytes(self) -> int:
        """Weight buffers, plus the initializers a segment plan's programs hold."""
        return (sum(b.nbytes for b in self.buffers.values() if b.role == "weight")
                + sum(getattr(p, "weight_bytes", 0) for p in self.segments))

    @property
    def activation_bytes(self) -> int:
        return self.arena_bytes

    def input_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Input name -> (shape, dtype name)."""
        return {n: (self.tensors[n].shape, self.tensors[n].dtype) for n in self.inputs}

    def output_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {n: (self.tensors[n].shape, self.tensors[n].dtype) for n in self.outputs}

    # -- serialization (weights are not serialized: they come from the ONNX file) ---------
    def to_json(self) -> str:
        def enc(o: Any) -> Any:
            if dataclasses.is_dataclass(o):
                return {f.name: enc(getattr(o, f.name)) for f in dataclasses.fields(o)}
            if isinstance(o, (list, tuple)):
                return [enc(x) for x in o]
            if isinstance(o, dict):
                return {str(k): enc(v) for k, v in o.items()}
            if isinstance(o, np.generic):
                return o.item()
            return o

        doc = {
            "format": PLAN_FORMAT_VERSION,
            "name": self.name,
            "kernels": enc(self.kernels),
            "tensors": enc(self.tensors),
            "buffers": enc(self.buffers),
            "inputs": self.inputs,
            "outputs": self.outputs,
            "arena_bytes": self.arena_bytes,
            "reuse_guard": self.reuse_guard,
            "stats": enc(self.stats),
        }
        return json.dumps(doc)


#: Kernel kinds the compiler emits, with the ``args`` each one carries. Every device
#: implements every kind. Tensors: ``inputs``/``outputs`` of the Kernel, in this order.
KERNEL_KINDS: dict[str, str] = {
    "conv": "inputs (x, w[, residual]) -> (y,). NCHW 2-D conv. args: strides[2], pads[4] "
    "(top,left,bottom,right), dilations[2], group, bias (tensor name or None), "
    "epilogue (list, see EPILOGUE). 1-D convs are lowered as 2-D with H=1.",
    "conv_transpose": "inputs (x, w) -> (y,). args: strides, pads[4], dilations, group, "
    "output_padding[2], bias, epilogue.",
    "gemm": "inputs (a, b[, residual]) -> (y,). Batched matmul with numpy broadcasting "
    "over leading dims: y = alpha * op(a) @ op(b). args: trans_a, trans_b, alpha, bias "
    "(tensor name or None, broadcast to y, scaled by beta), beta, epilogue.",
    "binary": "inputs (a, b) -> (y,). args: op in add|sub|mul|div|pow|max|min; "
    "numpy broadcasting. Also emitted by the compiler: mod, equal, less, less_equal, "
    "greater, greater_equal (bool y), and, or, xor.",
    "unary": "inputs (x,) -> (y,). args: ops: list of [name, params] applied in order "
    "(see ACTIVATIONS plus sqrt, erf, exp, log, neg, abs, reciprocal; the compiler also "
    "emits not, floor, ceil, round, sign, sin, cos, softsign, elu{alpha}, "
    "selu{alpha,gamma}, softplus, gelu_tanh).",
    "pool": "inputs (x,) -> (y,). args: mode max|avg, kernel[2], strides[2], pads[4], "
    "dilations[2], ceil_mode, count_include_pad.",
    "global_pool": "inputs (x,) -> (y,). args: mode avg|max. Reduces H, W keeping dims.",
    "reduce": "inputs (x,) -> (y,). args: op mean|sum|max|min, axes (list), keepdims.",
    "softmax": "inputs (x,) -> (y,). args: axis.",
    "layernorm": "inputs (x, scale[, bias]) -> (y,). args: axis, epsilon.",
    "concat": "inputs (x0, x1, ...) -> (y,). args: axis.",
    "split": "inputs (x,) -> (y0, y1, ...). args: axis, sizes (list).",
    "transpose": "inputs (x,) -> (y,). args: perm.",
    "slice": "inputs (x,) -> (y,). args: starts, ends, axes, steps (all normalised, "
    "non-negative starts, clamped ends; negative steps allowed: then an end of -1 means "
    "'through index 0', i.e. Python's None, not the last element).",
    "pad": "inputs (x,) -> (y,). args: pads (2*rank, ONNX order), mode constant|reflect|"
    "edge, value.",
    "gather": "inputs (data, indices) -> (y,). args: axis.",
    "resize": "inputs (x,) -> (y,). args: mode nearest|linear, "
    "coordinate_transformation_mode, nearest_mode, scales (per axis, floats).",
    "cast": "inputs (x,) -> (y,). args: to (numpy dtype name).",
    "copy": "inputs (x,) -> (y,). Materialises a tensor (e.g. graph output that is an "
    "input or a view of another output).",
    "batchnorm": "inputs (x, scale, bias, mean, var) -> (y,). args: epsilon. Only when it "
    "cannot be folded into a producer.",
    "where": "inputs (cond, a, b) -> (y,). numpy broadcasting.",
    "ort_segment": "inputs (tensors crossing into the segment) -> (tensors it produces that "
    "later segments or the caller read). args: segment (index into plan.segments), nodes "
    "[first, end) of the ORT-optimised graph, est_ms. Segment plans only "
    "(model.segments); run by the cpu device through ONNX Runtime.",
    "trace": "no tensors. A measured kernel of a REEF trace (args: storage indices): "
    "simulator workload only; no device executes it.",
}

#: Kinds that are launches of an external engine's program, not av_infer kernels: the
#: kernel executors (numpy, CUDA C) do not implement them; ``kernels.ort_segments`` does.
ENGINE_KINDS: frozenset[str] = frozenset({"ort_segment"})

#: Activations usable in ``unary`` ops and conv/gemm epilogues: name -> parameter names.
ACTIVATIONS: dict[str, tuple[str, ...]] = {
    "relu": (),
    "leaky_relu": ("alpha",),
    "sigmoid": (),
    "tanh": (),
    "clip": ("min", "max"),
    "hard_sigmoid": ("alpha", "beta"),
    "hard_swish": (),
    "gelu_erf": (),
}

#: Epilogue steps of conv/conv_transpose/gemm, applied in order after bias:
#: ``["add", <tensor name>]`` adds a tensor of the output's shape (residual, reads the
#: kernel's third input), ``[<activation>, {params}]`` applies an activation.
EPILOGUE = "list of ['add', tensor] | [activation, params]"
