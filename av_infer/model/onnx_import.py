"""ONNX import: load, bind dynamic dims, infer static shapes, fold constants.

The result is a :class:`~av_infer.model.graph.Graph` in which every non-constant tensor has
a fully static shape and every node whose inputs are all constants has been evaluated
(with ``onnx.reference``) and replaced by its value. That is what makes exported
``Shape -> Gather -> Concat -> Reshape`` chains disappear before lowering.

Shapes come from ONNX's own per-node shape inference (run on a one-node model with the
node's static input types and small constant inputs as initializers), so opset-specific
attribute/input conventions are handled by ONNX itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from av_infer.errors import (
    InvalidInputError,
    ModelLoadError,
    UnboundDimensionError,
    UnsupportedModelError,
)
from av_infer.model.graph import Graph, Node, Value

_log = logging.getLogger(__name__)

#: Ops the lowering understands (when not constant-folded away).
LOWERABLE = {
    "Conv", "ConvTranspose", "Gemm", "MatMul",
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mod",
    "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor",
    "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "HardSwish", "Erf",
    "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Not", "Floor", "Ceil", "Round",
    "Sign", "Sin", "Cos", "Elu", "Selu", "Softplus", "Softsign", "Gelu",
    "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
    "BatchNormalization", "Concat", "Flatten", "Reshape", "Transpose", "Squeeze",
    "Unsqueeze", "Slice", "Split", "Pad", "Gather", "Resize", "Upsample", "Softmax",
    "LayerNormalization", "Cast", "Identity", "Dropout", "Where", "Expand",
}
#: Ops accepted only when every input is constant (they are folded at compile time).
FOLD_ONLY = {
    "Shape", "Size", "Constant", "ConstantOfShape", "Range", "NonZero", "ReduceProd",
    "Tile", "CumSum", "TopK", "ArgMax", "ArgMin", "OneHot", "ScatterND", "GatherND",
    "GatherElements", "Trilu", "EyeLike", "CastLike",
}
SUPPORTED = LOWERABLE | FOLD_ONLY
_RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
           "Multinomial", "Bernoulli"}
#: Constant inputs up to this many elements are given to shape inference as values.
_SMALL_CONST = 1 << 16


class InputShapeError(ModelLoadError, InvalidInputError):
    """A user-given input shape contradicts the model (wrong name, rank or static dim)."""

    code = "invalid_input"


# -- loading -------------------------------------------------------------------------------
def load_model(source: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """Parse a model from a path, raw bytes or a ModelProto; ModelLoadError if unusable."""
    if isinstance(source, onnx.ModelProto):
        model = source
    elif isinstance(source, (bytes, bytearray, memoryview)):
        try:
            model = onnx.load_from_string(bytes(source))
        except Exception as e:  # protobuf DecodeError and friends
            raise ModelLoadError(f"model bytes are not a valid ONNX protobuf: {e}") from e
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise ModelLoadError(f"model file not found: {path}")
        if os.path.isdir(path):
            raise ModelLoadError(f"model path is a directory, not an ONNX file: {path}")
        try:
            model = onnx.load(path)
        except Exception as e:
            raise ModelLoadError(f"cannot parse ONNX model {path}: {e}") from e
    else:
        raise ModelLoadError(f"cannot load a model from {type(source).__name__}")
    g = model.graph
    if model.ir_version <= 0 or len(g.output) == 0 or (len(g.node) == 0 and not g.output):
        raise ModelLoadError("not a valid ONNX model: missing ir_version or graph outputs")
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        # The checker is stricter than exporters and runtimes (e.g. outputs without a
        # shape, custom domains): log and let import report what really cannot compile.
        _log.info("onnx.checker: %s", str(e).splitlines()[0] if str(e) else e)
    return model


def default_opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 1


# -- attributes ----------------------------------------------------------------------------
def decode_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if a.type == onnx.AttributeProto.FLOAT:
            v = float(str(np.float32(v)))  # shortest repr: 0.2, not 0.20000000298
        elif a.type == onnx.AttributeProto.FLOATS:
            v = [float(str(np.float32(x))) for x in v]
        elif isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, onnx.TensorProto):
            v = numpy_helper.to_array(v)
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode("utf-8", "replace") for x in v]
        out[a.name] = v
    return out


def _constant_value(node: onnx.NodeProto) -> np.ndarray:
    a = decode_attrs(node)
    if "value" in a:
        return np.asarray(a["value"])
    if "value_float" in a:
        return np.array(a["value_float"], np.float32)
    if "value_floats" in a:
        return np.array(a["value_floats"], np.float32)
    if "value_int" in a:
        return np.array(a["value_int"], np.int64)
    if "value_ints" in a:
        return np.array(a["value_ints"], np.int64)
    raise ModelLoadError(f"Constant node {node.name!r}: unsupported value attribute {list(a)}")


# -- input binding -------------------------------------------------------------------------
def _np_dtype(elem_type: int) -> str:
    try:
        return str(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))
    except Exception as e:
        raise ModelLoadError(f"unsupported tensor element type {elem_type}") from e


def bind_inputs(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | Sequence[int] | None,
) -> dict[str, Value]:
    """Static types of the graph inputs, dynamic dims bound from ``input_shapes``."""
    g = model.graph
    inits = {i.name for i in g.initializer}
    real = [i for i in g.input if i.name not in inits]
    if input_shapes is None:
        given: dict[str, Sequence[int]] = {}
    elif isinstance(input_shapes, Mapping):
        given = dict(input_shapes)
    else:
        if len(real) != 1:
            raise InputShapeError(
                f"a bare input shape needs a single-input model; this one has inputs "
                f"{[i.name for i in real]}: pass a dict name -> shape"
            )
        given = {real[0].name: input_shapes}
    names = {i.name for i in real}
    for k in given:
        if k not in names:
            raise InputShapeError(f"input_shapes names {k!r}, not a model input {sorted(names)}")

    # Symbolic dims bound through one input are bound everywhere they appear.
    params: dict[str, int] = {}
    for i in real:
        if i.name in given:
            dims = i.type.tensor_type.shape.dim
            shp = list(given[i.name])
            if i.type.tensor_type.HasField("shape") and len(dims) == len(shp):
                for d, v in zip(dims, shp):
                    if d.HasField("dim_param") and d.dim_param:
                        params.setdefault(d.dim_param, int(v))

    out: dict[str, Value] = {}
    for i in real:
        tt = i.type.tensor_type
        if not i.type.HasField("tensor_type"):
            kind = i.type.WhichOneof("value") or "untyped"
            raise UnsupportedModelError(
                {f"{kind} input": [i.name]},
                f"input {i.name!r} is not a tensor; av_infer runs tensor inputs only",
            )
        dtype = _np_dtype(tt.elem_type)
        has_shape = tt.HasField("shape")
        dims = list(tt.shape.dim) if has_shape else None
        if i.name in given:
            shp = [int(v) for v in given[i.name]]
            if any(v < 0 for v in shp):
                raise InputShapeError(f"input {i.name!r}: negative dim in given shape {shp}")
            if dims is not None:
                if len(dims) != len(shp):
                    raise InputShapeError(
                        f"input {i.name!r}: given shape {shp} has rank {len(shp)}, "
                        f"the model declares rank {len(dims)}"
                    )
                for ax, (d, v) in enumerate(zip(dims, shp)):
                    if d.HasField("dim_value") and d.dim_value >= 0 and d.dim_value != v:
                        raise InputShapeError(
                            f"input {i.name!r}: given shape {shp} contradicts static dim "
                            f"{ax} = {d.dim_value} of the model"
                        )
            out[i.name] = Value(tuple(shp), dtype)
            continue
        if dims is None:
            raise UnboundDimensionError(
                f"input {i.name!r} has no declared shape; pass it in input_shapes"
            )
        shp = []
        for ax, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value >= 0:  # 0 is a real (empty) dim
                shp.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param in params:
                shp.append(params[d.dim_param])
            else:
                label = f" ({d.dim_param!r})" if d.HasField("dim_param") else ""
                raise UnboundDimensionError(
                    f"input {i.name!r} dim {ax}{label} is dynamic and not bound: pass "
                    f"input_shapes={{{i.name!r}: [...]}}"
                )
        out[i.name] = Value(tuple(shp), dtype)
    return out


# -- per-node inference and folding --------------------------------------------------------
def _value_info(name: str, v: Value) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(np.dtype(v.dtype)), list(v.shape)
    )


def _node_model(
    node: onnx.NodeProto,
    values: Mapping[str, Value],
    consts: Mapping[str, np.ndarray],
    opsets: Sequence[onnx.OperatorSetIdProto],
    as_inits: bool,
) -> onnx.ModelProto:
    ins, inits, seen = [], [], set()
    for n in node.input:
        if not n or n in seen:
            continue
        seen.add(n)
        if n in consts:
            arr = consts[n]
            if as_inits and (arr.size <= _SMALL_CONST or arr.dtype.kind in "iub"):
                inits.append(numpy_helper.from_array(np.asarray(arr), n))
            else:
                ins.append(_value_info(n, Value(tuple(arr.shape), str(arr.dtype))))
        else:
            ins.append(_value_info(n, values[n]))
    outs = [helper.make_value_info(o, onnx.TypeProto()) for o in node.output if o]
    g = helper.make_graph([node], "node", ins, outs, initializer=inits)
    return helper.make_model(g, opset_imports=list(opsets), ir_version=onnx.IR_VERSION)


def infer_node(
    node: onnx.NodeProto,
    values: Mapping[str, Value],
    consts: Mapping[str, np.ndarray],
    opsets: Sequence[onnx.OperatorSetIdProto],
) -> dict[str, Value]:
    """Static output types of one node via ONNX shape inference (empty dict on failure)."""
    m = _node_model(node, values, consts, opsets, as_inits=True)
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
    except Exception:
        return {}
    out: dict[str, Value] = {}
    for vi in list(m.graph.value_info) + list(m.graph.output):
        t = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not t.HasField("shape") or not t.elem_type:
            continue
        dims = []
        for d in t.shape.dim:
            if not d.HasField("dim_value") or d.dim_value < 0:
                break
            dims.append(int(d.dim_value))
        else:
            out[vi.name] = Value(tuple(dims), _np_dtype(t.elem_type))
    y = node.output[0] if node.output else ""
    if node.op_type in ("MaxPool", "AveragePool") and y in out:
        out[y] = _ceil_mode_pool_shape(node, values[node.input[0]], out[y])
    return out


def _ceil_mode_pool_shape(node: onnx.NodeProto, x: Value, y: Value) -> Value:
    """ONNX Runtime's ceil_mode rule, which ONNX shape inference lacks: a last window that
    would start inside the end padding is dropped."""
    a = decode_attrs(node)
    if not a.get("ceil_mode", 0) or a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return y
    k = list(a["kernel_shape"])
    nsp = len(k)
    s = list(a.get("strides", [1] * nsp))
    d = list(a.get("dilations", [1] * nsp))
    p = list(a.get("pads", [0] * (2 * nsp)))
    dims = list(y.shape)
    for i in range(nsp):
        size = x.shape[2 + i]
        span = size + p[i] + p[i + nsp] - (d[i] * (k[i] - 1) + 1)
        n = -(-span // s[i]) + 1
        if (n - 1) * s[i] >= size + p[i]:
            n -= 1
        dims[2 + i] = n
    return Value(tuple(dims), y.dtype)


def fold_node(
    node: onnx.NodeProto,
    consts: Mapping[str, np.ndarray],
    opsets: Sequence[onnx.OperatorSetIdProto],
) -> list[np.ndarray]:
    """Evaluate a node whose inputs are all constant (numpy fast paths, else onnx.reference)."""
    op = node.op_type
    ins = [consts[n] if n else None for n in node.input]
    if op == "Identity":
        return [ins[0]]
    if op == "Size":
        return [np.array(ins[0].size, np.int64)]
    if op == "Shape":
        a = decode_attrs(node)
        shp = np.array(ins[0].shape, np.int64)
        return [shp[a.get("start", 0) : a.get("end", None)]]
    from onnx.reference import ReferenceEvaluator

    m = _node_model(node, {}, consts, opsets, as_inits=False)
    feeds = {n: np.asarray(consts[n]) for n in dict.fromkeys(x for x in node.input if x)}
    res = ReferenceEvaluator(m).run(None, feeds)
    return [np.asarray(r) for r in res]


# -- the import driver ---------------------------------------------------------------------
def _toposort(nodes: Sequence[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """Nodes in a valid execution order (ONNX requires it; some exporters do not)."""
    avail = set(available)
    pending = list(nodes)
    out: list[onnx.NodeProto] = []
    while pending:
        rest = []
        for n in pending:
            if all((not i) or i in avail for i in n.input):
                out.append(n)
                avail.update(o for o in n.output if o)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            out.extend(rest)  # dangling inputs: reported when the node is visited
            break
        pending = rest
    return out


def import_model(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | Sequence[int] | None = None,
    name: str | None = None,
) -> Graph:
    """ONNX model -> Graph with static shapes and constants folded (see module doc)."""
    g = model.graph
    opsets = list(model.opset_import)
    opset = default_opset(model)
    if opset < 7:
        raise UnsupportedModelError(
            {f"opset{opset}": [g.name or "graph"]}, "av_infer imports ONNX opsets 7-18+"
        )
    values: dict[str, Value] = bind_inputs(model, input_shapes)
    strings = [n for n, v in values.items() if np.dtype(v.dtype).kind in "OSU"]
    if strings:
        raise UnsupportedModelError(
            {"string tensor": strings}, "av_infer runs numeric tensors only (no STRING inputs)"
        )
    consts: dict[str, np.ndarray] = {}
    for init in g.initializer:
        if init.name in values:  # an input that overrides its initializer default
            continue
        try:
            consts[init.name] = numpy_helper.to_array(init)
        except Exception as e:
            raise ModelLoadError(f"cannot read initializer {init.name!r}: {e}") from e

    unsupported: dict[str, list[str]] = {}
    nodes: list[Node] = []
    unknown: set[str] = set()  # tensors downstream of an unsupported node
    details: list[str] = []
    folded = 0
    seen_names: set[str] = set()
    for idx, np_node in enumerate(_toposort(g.node, set(values) | set(consts))):
        op, dom = np_node.op_type, np_node.domain or ""
        nname = np_node.name or f"{op}_{idx}"
        if nname in seen_names:
            nname = f"{nname}_{idx}"
        seen_names.add(nname)
        outs = [o for o in np_node.output]
        if dom not in ("", "ai.onnx"):
            unsupported.setdefault(op, []).append(nname)
            unknown.update(o for o in outs if o)
            continue
        if op == "Constant":
            consts[outs[0]] = _constant_value(np_node)
            folded += 1
            continue
        ins = [i for i in np_node.input if i]
        missing = [i for i in ins if i not in values and i not in consts]
        if missing:
            if op not in SUPPORTED:
                unsupported.setdefault(op, []).append(nname)
            elif not all(i in unknown for i in missing):
                raise ModelLoadError(f"node {nname!r} ({op}) reads undefined tensors {missing}")
            unknown.update(o for o in outs if o)
            continue
        all_const = all(i in consts for i in ins)
        if op in ("Shape", "Size"):  # every shape is static here: fold from the type
            shp = values[ins[0]].shape if ins[0] in values else consts[ins[0]].shape
            if op == "Size":
                consts[outs[0]] = np.array(int(np.prod(shp, dtype=np.int64)), np.int64)
            else:
                a = decode_attrs(np_node)
                full = np.array(shp, np.int64)
                consts[outs[0]] = np.ascontiguousarray(full[a.get("start", 0) : a.get("end")])
            folded += 1
            continue
        if all_const and op not in _RANDOM and (ins or op in SUPPORTED):
            try:
                res = fold_node(np_node, consts, opsets)
            except Exception as e:
                if op not in LOWERABLE:
                    if op not in SUPPORTED:
                        unsupported.setdefault(op, []).append(nname)
                        unknown.update(o for o in outs if o)
                        continue
                    raise ModelLoadError(f"cannot fold constant node {nname!r} ({op}): {e}") from e
            else:
                for o, r in zip(outs, res):
                    if o:
                        consts[o] = np.asarray(r, order="C")
                folded += 1
                continue
        if op not in LOWERABLE:
            unsupported.setdefault(op, []).append(nname)
            unknown.update(o for o in outs if o)
            continue
        inferred = infer_node(np_node, values, consts, opsets)
        types = {o: inferred.get(o) or _fallback_shape(op, ins, values, consts)
                 for o in outs if o}
        if any(v is None for v in types.values()):
            # e.g. Expand/Reshape to a shape computed from runtime data
            unsupported.setdefault(op, []).append(nname)
            details.append(f"{nname}: output shape depends on runtime data")
            unknown.update(o for o in outs if o)
            continue
        values.update(types)  # type: ignore[arg-type]
        attrs = decode_attrs(np_node)
        why = refusal(op, list(np_node.input), attrs, values, consts, opset)
        if why:
            unsupported.setdefault(op, []).append(nname)
            details.append(f"{nname}: {why}")
            unknown.update(o for o in outs if o)
            continue
        nodes.append(Node(op, nname, list(np_node.input), outs, attrs, dom))

    if unsupported:
        raise UnsupportedModelError(unsupported, "; ".join(details))
    for o in g.output:
        if o.name not in values and o.name not in consts:
            raise ModelLoadError(f"graph output {o.name!r} is never produced")
    graph = Graph(
        name=name or g.name or "model",
        opset=opset,
        nodes=nodes,
        inputs=[i.name for i in g.input if i.name in values],
        outputs=[o.name for o in g.output],
        values=values,
        consts=consts,
    )
    graph.stats.update(nodes=len(g.node), const_folded=folded)
    return graph


# -- semantic refusals -----------------------------------------------------------------------
#: Cast targets whose ONNX semantics numpy's cast does not give: float8 with ``saturate=1``
#: clamps to the largest finite value (numpy overflows to inf/NaN); E8M0 rounds up.
_FLOAT8 = {
    onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ,
    onnx.TensorProto.FLOAT8E5M2, onnx.TensorProto.FLOAT8E5M2FNUZ,
}
_E8M0 = getattr(onnx.TensorProto, "FLOAT8E8M0", None)


def _const_input(inputs: Sequence[str], idx: int,
                 consts: Mapping[str, np.ndarray]) -> tuple[bool, np.ndarray | None]:
    """(present, value) of optional input ``idx``; value None when present but not constant."""
    if idx >= len(inputs) or not inputs[idx]:
        return False, None
    return True, consts.get(inputs[idx])


def refusal(
    op: str, inputs: Sequence[str], attrs: Mapping[str, Any],
    values: Mapping[str, Value], consts: Mapping[str, np.ndarray], opset: int,
) -> str | None:
    """Why av_infer cannot compute this (lowerable) node as ONNX defines it, or None.

    These are uses of supported operators whose meaning av_infer's kernels do not
    implement; refusing them here (a typed UnsupportedModelError) is what keeps the
    compiler from ever running them with different semantics.
    """
    if op == "Dropout" and opset >= 12:
        present, training = _const_input(inputs, 2, consts)
        if present and training is None:
            return "training_mode is a runtime input; only inference (False) is supported"
        if present and bool(np.asarray(training).reshape(-1)[0]):
            has_ratio, ratio = _const_input(inputs, 1, consts)
            if not has_ratio:
                ratio = np.array(0.5)
            if ratio is None or float(np.asarray(ratio).reshape(-1)[0]) != 0.0:
                return ("training_mode=True drops random elements (training); av_infer "
                        "runs inference only")
    if op == "Mod" and int(attrs.get("fmod", 0)):
        return "fmod=1 (C fmod, result takes the dividend's sign) is not implemented"
    if op == "Cast":
        to = int(attrs.get("to", 0))
        if to in _FLOAT8 and int(attrs.get("saturate", 1)):
            return "Cast to float8 with saturate=1 is not implemented"
        if _E8M0 is not None and to == _E8M0:
            return "Cast to FLOAT8E8M0 is not implemented"
    if op == "Resize" and opset >= 11:
        return _resize_refusal(inputs, attrs, values, consts)
    return None


def _resize_refusal(inputs: Sequence[str], attrs: Mapping[str, Any],
                    values: Mapping[str, Value], consts: Mapping[str, np.ndarray]) -> str | None:
    """Resize given ``scales`` whose output length ``in * scale`` is fractional, in a mode
    whose coordinates depend on that length: ONNX's reference maps with the fractional
    length (onnx/onnx#2462), ONNX Runtime and PyTorch with the integer one. Both readings
    are in use, so the model's meaning is ambiguous: refuse rather than pick one."""
    ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
    if ctm not in ("align_corners", "pytorch_half_pixel"):
        return None
    _, scales = _const_input(inputs, 2, consts)
    has_sizes, _ = _const_input(inputs, 3, consts)
    if scales is None or scales.size == 0 or has_sizes or not inputs or inputs[0] not in values:
        return None
    xs = values[inputs[0]].shape
    axes = attrs.get("axes") or list(range(len(xs)))
    for a, sc in zip(axes, np.asarray(scales, np.float32).reshape(-1)):
        n_in = xs[int(a) % len(xs)]
        length = float(np.float32(n_in) * sc)  # float32, as the scales are
        n_out = int(np.floor(length))
        if length == n_out:
            continue
        if ctm == "align_corners" or n_out == 1:
            return (f"{ctm} with scales: the output length {n_in} * {float(sc):g} = "
                    f"{length:g} is fractional and ONNX's reference and ONNX Runtime "
                    f"disagree on it; give sizes instead of scales")
    return None


_SAME_SHAPE = {
    "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "HardSwish", "Erf",
    "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Identity", "Dropout", "Softmax",
    "LayerNormalization", "BatchNormalization",
}
_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Where"}


def _fallback_shape(
    op: str, ins: list[str], values: Mapping[str, Value], consts: Mapping[str, np.ndarray]
) -> Value | None:
    """Shape rules for the few cases where ONNX inference leaves a dim unknown."""

    def typ(n: str) -> Value:
        if n in consts:
            return Value(tuple(consts[n].shape), str(consts[n].dtype))
        return values[n]

    if op in _SAME_SHAPE and ins:
        return typ(ins[0])
    if op in _BROADCAST and ins:
        ts = [typ(i) for i in ins]
        try:
            shp = np.broadcast_shapes(*(t.shape for t in ts))
        except ValueError:
            return None
        return Value(tuple(int(d) for d in shp), ts[-1].dtype)
    return None
