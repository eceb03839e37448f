"""Builds small plans by hand (tests, CUDA samples, benchmarks): no ONNX, no compiler.

Graph inputs, outputs and activations each get their own arena region (64-byte aligned, no
reuse, so every kernel is trivially idempotent); weights get offsets in the weight store.
Launch geometry comes from the compiler's ``geometry_for`` where it applies.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from av_infer.model.plan import Buffer, Geometry, Kernel, Plan, Tensor

ALIGN = 64


def _align(n: int) -> int:
    return (max(int(n), 1) + ALIGN - 1) // ALIGN * ALIGN


class PlanBuilder:
    """``tensor``/``weight``/``kernel`` calls in execution order, then ``build()``."""

    def __init__(self, name: str = "hand") -> None:
        self.name = name
        self.tensors: dict[str, Tensor] = {}
        self.buffers: dict[int, Buffer] = {}
        self.weights: dict[int, np.ndarray] = {}
        self.kernels: list[Kernel] = []
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.offset = 0  # next free byte of the activation arena
        self.woffset = 0  # next free byte of the weight store

    def _buffer(self, nbytes: int, role: str) -> int:
        bid = len(self.buffers)
        if role == "weight":
            off, self.woffset = self.woffset, self.woffset + _align(nbytes)
        else:
            off, self.offset = self.offset, self.offset + _align(nbytes)
        self.buffers[bid] = Buffer(bid, nbytes, role, off)  # type: ignore[arg-type]
        return bid

    def tensor(self, name: str, shape: tuple[int, ...], dtype: str = "float32",
               role: str = "activation", buffer: int | None = None,
               byte_offset: int = 0) -> str:
        """A new tensor with its own buffer, or a view on ``buffer`` at ``byte_offset``."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if buffer is None:
            buffer = self._buffer(nbytes, role)
        self.tensors[name] = Tensor(name, buffer, tuple(int(s) for s in shape), dtype,
                                    byte_offset)
        if role == "input":
            self.inputs.append(name)
        elif role == "output":
            self.outputs.append(name)
        return name

    def weight(self, name: str, value: np.ndarray) -> str:
        value = np.ascontiguousarray(value)
        self.tensor(name, value.shape, value.dtype.name, "weight")
        self.weights[self.tensors[name].buffer] = value
        return name

    def kernel(self, kind: str, inputs: list[str], outputs: list[str], **args: Any) -> None:
        from av_infer.model.geometry import geometry_for

        ins = [self.tensors[t].shape for t in inputs if t]
        outs = [self.tensors[t].shape for t in outputs]
        try:
            geom = geometry_for(kind, ins, outs, args)
        except (KeyError, IndexError, TypeError, ValueError):
            geom = Geometry((1, 1, 1), (256, 1, 1))
        self.kernels.append(Kernel(len(self.kernels), kind, f"{kind}{len(self.kernels)}",
                                   tuple(inputs), tuple(outputs), args, geom))

    def build(self) -> Plan:
        return Plan(self.name, self.kernels, self.tensors, self.buffers, self.inputs,
                    self.outputs, self.weights, arena_bytes=self.offset)
