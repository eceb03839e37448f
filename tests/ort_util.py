"""Shared helpers for tests that compare av_infer against onnxruntime (the reference).

``max_rel_err`` is the one accuracy metric of the suite: the largest absolute difference
scaled by the reference's largest magnitude, so tiny reference values near zero do not
blow it up. float32 results must stay within 1e-4 of onnxruntime's CPU provider.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

os.environ.setdefault("OMP_NUM_THREADS", "1")

TOL = 1e-4


def max_rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max|a - b| / max(max|b|, 1e-6); ``b`` is the reference. Shapes must match."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape:
        raise AssertionError(f"shape mismatch: got {a.shape}, reference {b.shape}")
    if a.size == 0:
        return 0.0
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    both_inf = np.isinf(a64) & np.isinf(b64) & (np.sign(a64) == np.sign(b64))
    diff = np.where(both_inf, 0.0, np.abs(a64 - b64))
    finite_b = np.where(np.isfinite(b64), np.abs(b64), 0.0)
    return float(diff.max() / max(float(finite_b.max()), 1e-6))


def ort_session(model: onnx.ModelProto) -> Any:
    """A single-threaded onnxruntime CPU session (the machine is shared)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), sess_options=so, providers=["CPUExecutionProvider"]
    )


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of ``model`` on ``feeds`` by name."""
    sess = ort_session(model)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def np_to_onnx_type(dtype: Any) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def node_model(
    op_type: str,
    inputs: dict[str, np.ndarray],
    attrs: dict[str, Any] | None = None,
    initializers: dict[str, np.ndarray] | None = None,
    outputs: Sequence[str] = ("y",),
    out_dtype: Any = None,
    opset: int = 17,
    input_order: Sequence[str] | None = None,
    domain: str = "",
) -> onnx.ModelProto:
    """A one-node model: ``inputs`` become graph inputs (static shapes), ``initializers``
    constants; the node's inputs are ``input_order`` (default: inputs then initializers,
    in dict order; use "" for an omitted optional input)."""
    initializers = initializers or {}
    order = list(input_order) if input_order is not None else [*inputs, *initializers]
    node = helper.make_node(op_type, order, list(outputs), domain=domain, **(attrs or {}))
    first = next(iter(inputs.values()), None)
    odt = np.dtype(out_dtype) if out_dtype is not None else (
        first.dtype if first is not None else np.dtype(np.float32)
    )
    graph = helper.make_graph(
        [node],
        f"{op_type.lower()}_test",
        [helper.make_tensor_value_info(n, np_to_onnx_type(a.dtype), a.shape)
         for n, a in inputs.items()],
        [helper.make_tensor_value_info(o, np_to_onnx_type(odt), None) for o in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)])
    model.ir_version = min(model.ir_version, 8)
    return model


def graph_model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, np.ndarray],
    outputs: Sequence[str],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 17,
    out_dtype: Any = np.float32,
) -> onnx.ModelProto:
    """A small multi-node model with static input shapes."""
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info(n, np_to_onnx_type(a.dtype), a.shape)
         for n, a in inputs.items()],
        [helper.make_tensor_value_info(o, np_to_onnx_type(out_dtype), None) for o in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in (initializers or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 8)
    return model


__all__ = [
    "TOL",
    "TensorProto",
    "graph_model",
    "max_rel_err",
    "node_model",
    "ort_session",
    "run_ort",
]
