"""A small deterministic ONNX graph builder used by the model zoo.

Why not PyTorch: the zoo must build on machines without any framework, byte-identically
on every run, so the models are written directly with ``onnx.helper``. Weights come from
one seeded ``numpy`` generator in construction order.

Why the calibration: the compiler's numeric tests compare our kernels against
onnxruntime through up to ~150 layers. Random weights easily make activations explode or
vanish over that depth, which hides real bugs behind huge absolute errors or flushes
everything to zero. CNN layers are therefore executed eagerly in numpy while the graph is
built, on one seeded N(0, 1) calibration input: batch-norm running statistics are set
from the statistics actually seen (plus a little noise), as in a trained network, and
layers without a following norm (VGG, classifier heads) are rescaled to unit output
second moment (data-dependent init, as LSUV does). Where no calibration value exists
(transformers, whose LayerNorms keep scale anyway), a rough analytic estimate ``m2`` is used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # readable by every onnxruntime >= 1.10

Shape = Sequence[int | str]


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    a, b = v
    return (int(a), int(b))


def _np_conv(x: np.ndarray, w: np.ndarray, stride: tuple[int, int],
             pad: tuple[int, int]) -> np.ndarray:
    """Reference NCHW convolution (im2col + tensordot) used only for calibration."""
    ph, pw = pad
    kh, kw = w.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if (ph or pw) else x
    if kh == 1 and kw == 1:
        cols = xp[:, :, :: stride[0], :: stride[1]]
        return np.einsum("nchw,oc->nohw", cols, w[:, :, 0, 0], optimize=True)
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    win = win[:, :, :: stride[0], :: stride[1]]  # N C Ho Wo kh kw
    out = np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3]))  # N Ho Wo O
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2))


class GraphBuilder:
    """Accumulates nodes and initializers; node names double as output tensor names."""

    def __init__(self, graph_name: str, seed: int) -> None:
        self.graph_name = graph_name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._names: set[str] = set()
        self._consts: dict[tuple[str, bytes, tuple[int, ...]], str] = {}
        self.m2: dict[str, float] = {}
        self.val: dict[str, np.ndarray] = {}  # eager calibration values (CNN layers only)
        self._calib_rng = np.random.default_rng(seed + 7919)

    # -- bookkeeping -------------------------------------------------------------------
    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"duplicate tensor/node name {name!r}")
        self._names.add(name)
        return name

    def add_input(self, name: str, elem_type: int, shape: Shape, m2: float = 1.0,
                  calib_shape: Sequence[int] | None = None) -> str:
        """A graph input; ``calib_shape`` turns on eager calibration from N(0, 1) data."""
        self._claim(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        self.m2[name] = m2
        if calib_shape is not None:
            self._set(name, self._calib_rng.standard_normal(tuple(calib_shape), np.float32))
        return name

    def _set(self, name: str, value: np.ndarray) -> None:
        self.val[name] = value
        self.m2[name] = float(np.mean(np.square(value, dtype=np.float64)))

    def _vals(self, *names: str) -> list[np.ndarray] | None:
        if all(n in self.val for n in names):
            return [self.val[n] for n in names]
        return None

    def mark_output(self, tensor: str, name: str, elem_type: int, shape: Shape) -> str:
        """Expose ``tensor`` as graph output ``name`` (via Identity when they differ)."""
        if tensor != name:
            tensor = self.node("Identity", [tensor], name)
        self.outputs.append(helper.make_tensor_value_info(tensor, elem_type, list(shape)))
        return tensor

    def param(self, name: str, array: np.ndarray) -> str:
        """A learned weight (counted as a parameter)."""
        self._claim(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(self, array: np.ndarray | Sequence[int] | float, dtype: type = np.int64) -> str:
        """A shared, de-duplicated constant such as a shape or an axes list."""
        arr = np.asarray(array, dtype=dtype)
        key = (arr.dtype.str, arr.tobytes(), arr.shape)
        if key not in self._consts:
            flat = "_".join(str(v) for v in arr.ravel()[:8]).replace("-", "m").replace(".", "p")
            name = f"const.{arr.dtype.name}.{flat}" + ("" if arr.size <= 8 else f".n{arr.size}")
            base, i = name, 1
            while name in self._names:
                i += 1
                name = f"{base}.{i}"
            self._claim(name)
            self.initializers.append(numpy_helper.from_array(arr, name))
            self._consts[key] = name
        return self._consts[key]

    def node(
        self, op: str, inputs: Sequence[str], name: str, m2: float | None = None, **attrs: object
    ) -> str:
        """Append one node whose single output tensor is called ``name``."""
        self._claim(name)
        self.nodes.append(helper.make_node(op, list(inputs), [name], name=name, **attrs))
        if m2 is None:
            m2 = self.m2.get(inputs[0], 1.0) if inputs else 1.0
        self.m2[name] = float(m2)
        return name

    def normal(self, shape: Sequence[int], std: float) -> np.ndarray:
        return self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std)

    def uniform(self, shape: Sequence[int], lo: float, hi: float) -> np.ndarray:
        return self.rng.uniform(lo, hi, size=tuple(shape)).astype(np.float32)

    # -- CNN layers --------------------------------------------------------------------
    def conv(
        self,
        x: str,
        name: str,
        cin: int,
        cout: int,
        kernel: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        pad: int | Sequence[int] = 0,
        bias: bool = False,
        normalize_output: bool = False,
    ) -> str:
        """Conv2d with He-scaled weights (``name.weight``/``name.bias``).

        ``normalize_output`` rescales the weights so the calibrated output has unit second
        moment: used where no batch norm follows (VGG).
        """
        kh, kw = _pair(kernel)
        sh, sw = _pair(stride)
        ph, pw = _pair(pad)
        fan_in = cin * kh * kw
        m2_in = max(self.m2.get(x, 1.0), 1e-12)
        if normalize_output:
            std = math.sqrt(1.0 / (fan_in * m2_in))
        else:
            std = math.sqrt(2.0 / fan_in)
        w = self.normal((cout, cin, kh, kw), std)
        bvec = self.normal((cout,), 0.05) if bias else None
        out_val = None
        vals = self._vals(x)
        if vals is not None:
            out_val = _np_conv(vals[0], w, (sh, sw), (ph, pw))
            if normalize_output:
                k = np.float32(1.0 / math.sqrt(max(float(np.mean(out_val**2)), 1e-12)))
                w *= k
                out_val *= k
            if bvec is not None:
                out_val += bvec[None, :, None, None]
        ins = [x, self.param(f"{name}.weight", w)]
        if bvec is not None:
            ins.append(self.param(f"{name}.bias", bvec))
        out = self.node(
            "Conv",
            ins,
            name,
            m2=1.0 if normalize_output else 2.0 * m2_in,
            kernel_shape=[kh, kw],
            strides=[sh, sw],
            pads=[ph, pw, ph, pw],
            dilations=[1, 1],
            group=1,
        )
        if out_val is not None:
            self._set(out, out_val)
        return out

    def bn(
        self,
        x: str,
        name: str,
        c: int,
        eps: float = 1e-5,
        gamma: tuple[float, float] = (0.5, 1.0),
    ) -> str:
        """Inference BatchNormalization whose running stats match the data (plus noise)."""
        m2_in = max(self.m2.get(x, 1.0), 1e-12)
        g = self.uniform((c,), *gamma)
        b = self.normal((c,), 0.1)
        noise_m = self.normal((c,), 0.1)
        noise_v = self.uniform((c,), 0.8, 1.25)
        vals = self._vals(x)
        if vals is not None:
            v = vals[0].astype(np.float64)
            ch_mean = v.mean(axis=(0, 2, 3))
            # A small calibration set underestimates the spread a channel sees over a
            # dataset (a 2x2 map has 4 values); the floor keeps BN well-conditioned on
            # inputs other than the calibration one.
            ch_var = v.var(axis=(0, 2, 3))
            ch_var = ch_var + 0.5 * float(np.median(ch_var)) + 0.1 * ch_mean**2 + 1e-6 * m2_in
        else:
            ch_mean = np.zeros(c)
            ch_var = np.full(c, m2_in)
        mean = (ch_mean + noise_m * np.sqrt(ch_var)).astype(np.float32)
        var = (ch_var * noise_v).astype(np.float32)
        ins = [
            x,
            self.param(f"{name}.weight", g),
            self.param(f"{name}.bias", b),
            self.param(f"{name}.running_mean", mean),
            self.param(f"{name}.running_var", var),
        ]
        m2_out = float(np.mean(g.astype(np.float64) ** 2) + 0.01)
        out = self.node("BatchNormalization", ins, name, m2=m2_out, epsilon=eps, momentum=0.9)
        if vals is not None:
            sc = g / np.sqrt(var + np.float32(eps))
            y = (vals[0] - mean[None, :, None, None]) * sc[None, :, None, None]
            self._set(out, (y + b[None, :, None, None]).astype(np.float32))
        return out

    def relu(self, x: str, name: str) -> str:
        out = self.node("Relu", [x], name, m2=self.m2.get(x, 1.0) * 0.5)
        vals = self._vals(x)
        if vals is not None:
            self._set(out, np.maximum(vals[0], 0))
        return out

    def maxpool(self, x: str, name: str, k: int, s: int, p: int = 0) -> str:
        out = self.node(
            "MaxPool",
            [x],
            name,
            m2=self.m2.get(x, 1.0) * 2.0,
            kernel_shape=[k, k],
            strides=[s, s],
            pads=[p, p, p, p],
            ceil_mode=0,
        )
        vals = self._vals(x)
        if vals is not None:
            xp = np.pad(vals[0], ((0, 0), (0, 0), (p, p), (p, p)), constant_values=-np.inf)
            win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))
            self._set(out, win[:, :, ::s, ::s].max(axis=(4, 5)))
        return out

    def avgpool(self, x: str, name: str, k: int, s: int, p: int = 0, include_pad: int = 0) -> str:
        """AveragePool; with padding, ``include_pad`` mirrors torch's count_include_pad."""
        attrs: dict[str, object] = dict(kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p])
        if p:
            attrs["count_include_pad"] = include_pad
        out = self.node("AveragePool", [x], name, m2=self.m2.get(x, 1.0) * 0.8, **attrs)
        vals = self._vals(x)
        if vals is not None:
            xp = np.pad(vals[0], ((0, 0), (0, 0), (p, p), (p, p)))
            win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))
            tot = win[:, :, ::s, ::s].sum(axis=(4, 5))
            if p and not include_pad:
                ones = np.pad(np.ones(vals[0].shape[2:], np.float32), p)
                cnt = np.lib.stride_tricks.sliding_window_view(ones, (k, k))[::s, ::s]
                tot = tot / cnt.sum(axis=(2, 3))
            else:
                tot = tot / np.float32(k * k)
            self._set(out, tot.astype(np.float32))
        return out

    def add(self, a: str, b: str, name: str) -> str:
        out = self.node("Add", [a, b], name, m2=self.m2.get(a, 1.0) + self.m2.get(b, 1.0))
        vals = self._vals(a, b)
        if vals is not None:
            self._set(out, vals[0] + vals[1])
        return out

    def concat(self, xs: Sequence[str], name: str, axis: int = 1,
               widths: Sequence[int] | None = None) -> str:
        w = list(widths) if widths is not None else [1] * len(xs)
        m2 = sum(self.m2.get(x, 1.0) * wi for x, wi in zip(xs, w)) / max(sum(w), 1)
        out = self.node("Concat", list(xs), name, m2=m2, axis=axis)
        vals = self._vals(*xs)
        if vals is not None:
            self._set(out, np.concatenate(vals, axis=axis))
        return out

    def gap(self, x: str, name: str) -> str:
        out = self.node("GlobalAveragePool", [x], name)
        vals = self._vals(x)
        if vals is not None:
            self._set(out, vals[0].mean(axis=(2, 3), keepdims=True))
        return out

    def flatten(self, x: str, name: str) -> str:
        out = self.node("Flatten", [x], name, axis=1)
        vals = self._vals(x)
        if vals is not None:
            self._set(out, vals[0].reshape(vals[0].shape[0], -1))
        return out

    def classifier_head(self, x: str, prefix: str, cin: int, classes: int,
                        gap_name: str = "avgpool") -> str:
        """The torchvision export idiom: GlobalAveragePool -> Flatten -> Gemm(transB=1)."""
        return self.linear(self.flatten(self.gap(x, gap_name), "flatten"), prefix, cin, classes,
                           normalize_output=True)

    def linear(self, x: str, name: str, cin: int, cout: int, normalize_output: bool = False,
               gain: float = 2.0) -> str:
        """torch.nn.Linear on a 2-D input, exported as Gemm(transB=1)."""
        m2_in = max(self.m2.get(x, 1.0), 1e-12)
        std = math.sqrt(1.0 / (cin * m2_in)) if normalize_output else math.sqrt(gain / cin)
        w = self.normal((cout, cin), std)
        bvec = self.normal((cout,), 0.02)
        vals = self._vals(x)
        out_val = None
        if vals is not None:
            out_val = vals[0] @ w.T
            if normalize_output:
                k = np.float32(1.0 / math.sqrt(max(float(np.mean(out_val**2)), 1e-12)))
                w *= k
                out_val *= k
            out_val += bvec
        ins = [x, self.param(f"{name}.weight", w), self.param(f"{name}.bias", bvec)]
        m2 = 1.0 if normalize_output else gain * m2_in
        out = self.node("Gemm", ins, name, m2=m2, alpha=1.0, beta=1.0, transB=1)
        if out_val is not None:
            self._set(out, out_val)
        return out

    # -- finishing ---------------------------------------------------------------------
    def model(self, doc: str = "") -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, self.graph_name, self.inputs, self.outputs, self.initializers
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="av_infer.model.zoo",
            producer_version="1",
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        return model


FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
