"""The compiler's internal graph IR.

Two levels share this module:

* :class:`Graph` holds ONNX nodes after import: every tensor has a static shape and dtype
  (:class:`Value`), every constant (initializer, Constant node, folded subgraph) lives in
  ``consts`` as a numpy array. Passes never need to look at protobufs again.
* :class:`KNode` is a lowered node: a kernel kind from ``plan.KERNEL_KINDS`` (or ``view``)
  with normalised args. Fusion passes and memory planning work on lists of KNodes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Value:
    """Static type of a tensor: shape (all dims known) and numpy dtype name."""

    shape: tuple[int, ...]
    dtype: str


@dataclass
class Node:
    """An imported ONNX node (attributes decoded to Python values)."""

    op: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    domain: str = ""


@dataclass
class KNode:
    """A lowered node: ``kind`` is a plan kernel kind or ``view`` (a reshape, no kernel)."""

    kind: str
    name: str
    inputs: list[str]
    outputs: list[str]
    args: dict[str, Any] = field(default_factory=dict)

    def reads(self) -> list[str]:
        """Every tensor the node reads: inputs plus tensors named in args (bias)."""
        r = [t for t in self.inputs if t]
        b = self.args.get("bias")
        if isinstance(b, str) and b not in r:
            r.append(b)
        return r


@dataclass
class Graph:
    """An imported model with static shapes; shared by lowering and passes."""

    name: str
    opset: int
    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    values: dict[str, Value]
    consts: dict[str, np.ndarray]
    stats: dict[str, Any] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=itertools.count, repr=False)

    # -- helpers ---------------------------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.consts:
            return tuple(int(d) for d in self.consts[name].shape)
        return self.values[name].shape

    def dtype(self, name: str) -> str:
        if name in self.consts:
            return str(self.consts[name].dtype)
        return self.values[name].dtype

    def is_const(self, name: str) -> bool:
        return name in self.consts

    def fresh(self, base: str) -> str:
        """A tensor name not used yet, derived from ``base``."""
        while True:
            n = f"{base}__{next(self._ids)}"
            if n not in self.values and n not in self.consts:
                return n

    def new_value(self, base: str, shape: tuple[int, ...], dtype: str) -> str:
        n = self.fresh(base)
        self.values[n] = Value(tuple(int(d) for d in shape), dtype)
        return n

    def new_const(self, base: str, arr: np.ndarray) -> str:
        n = self.fresh(base)
        self.consts[n] = np.asarray(arr, order="C")
        return n
