"""Elementwise numpy building blocks shared by every CPU kernel: activations and unary ops.

Each function writes into ``out`` (which may alias ``x``), so the same code serves ``unary``
kernels (``x`` is the input view, ``out`` the output view) and conv/gemm epilogues (both are
the output view, in place). Parameters arrive as a dict (``{"alpha": 0.1}``), a list in
``ACTIVATIONS`` order, or ``None``; :func:`act_params` normalises them once at plan time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from av_infer.model.plan import ACTIVATIONS

_F32_MAX = float(np.finfo(np.float32).max)

#: ``fn(x, out, params)``: reads ``x``, writes ``out`` (``out`` may be ``x``).
ElementwiseFn = Callable[[np.ndarray, np.ndarray, dict[str, Any]], None]

_DEFAULTS: dict[str, dict[str, Any]] = {
    "leaky_relu": {"alpha": 0.01},
    "clip": {"min": None, "max": None},
    "hard_sigmoid": {"alpha": 0.2, "beta": 0.5},
    "elu": {"alpha": 1.0},
    "selu": {"alpha": 1.6732632423543772, "gamma": 1.0507009873554805},
    "celu": {"alpha": 1.0},
    "thresholded_relu": {"alpha": 1.0},
    "shrink": {"bias": 0.0, "lambd": 0.5},
}

# Coefficients of the float32 rational erf approximation used by Eigen/XLA (x in [-4, 4]):
# erf(x) = x * P(x^2) / Q(x^2); max abs error ~4e-7 against math.erf.
_ERF_P = (
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
)
_ERF_Q = (
    -1.45660718464996e-05,
    -2.13374055278905e-04,
    -1.68282697438203e-03,
    -7.37332916720468e-03,
    -1.42647390514189e-02,
)


def act_params(name: str, params: Any) -> dict[str, Any]:
    """Normalise an op's parameters (dict, positional list or None) to a dict with defaults."""
    merged = dict(_DEFAULTS.get(name, {}))
    if params is None:
        return merged
    if isinstance(params, dict):
        merged.update(params)
        return merged
    if isinstance(params, (list, tuple)):
        names = ACTIVATIONS.get(name) or tuple(_DEFAULTS.get(name, {}))
        if len(params) > len(names):
            raise ValueError(f"{name}: {len(params)} parameters, expected at most {names}")
        merged.update(zip(names, params))
        return merged
    # a bare scalar: the first parameter (e.g. leaky_relu 0.1)
    names = ACTIVATIONS.get(name) or tuple(_DEFAULTS.get(name, {}))
    if not names:
        raise ValueError(f"{name} takes no parameters, got {params!r}")
    merged[names[0]] = params
    return merged


def erf(x: np.ndarray, out: np.ndarray) -> None:
    """Vectorised erf (rational approximation, ~4e-7 absolute): no scipy needed."""
    dt = out.dtype if out.dtype.kind == "f" else np.dtype(np.float32)
    xc = np.clip(x, -4.0, 4.0).astype(dt, copy=False)
    x2 = xc * xc
    p = np.full_like(x2, _ERF_P[0])
    for c in _ERF_P[1:]:
        p *= x2
        p += c
    q = np.full_like(x2, _ERF_Q[0])
    for c in _ERF_Q[1:]:
        q *= x2
        q += c
    p *= xc
    np.divide(p, q, out=out, casting="unsafe")


def _relu(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    np.maximum(x, 0, out=out)


def _leaky_relu(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    neg = x < 0
    scaled = x * np.asarray(p["alpha"], dtype=out.dtype)
    if out is not x:
        np.copyto(out, x)
    np.copyto(out, scaled, where=neg)


def _sigmoid(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    # 0.5 * (1 + tanh(x / 2)): stable for any x, never overflows exp.
    np.multiply(x, 0.5, out=out)
    np.tanh(out, out=out)
    out *= 0.5
    out += 0.5


def _tanh(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    np.tanh(x, out=out)


def clip_bound(value: Any, dtype: np.dtype, lower: bool) -> np.ndarray | None:
    """A Clip bound as a scalar of ``dtype`` (None: no bound), never overflowing.

    Bounds arrive as Python floats and the lowering writes +-FLT_MAX for an absent bound
    (and for any bound beyond it), which ONNX defines as the dtype's lowest/largest value:
    so a bound at or beyond +-FLT_MAX becomes the dtype's own limit (float64 values beyond
    FLT_MAX stay unclipped). An integer tensor gets the other bounds rounded inwards (ceil
    for the lower, floor for the upper) and saturated to its range.
    """
    if value is None:
        return None
    v = float(value)
    if np.isnan(v):
        return None
    dtype = np.dtype(dtype)
    if dtype.kind not in "iuf":
        return np.asarray(v).astype(dtype)
    info = np.iinfo(dtype) if dtype.kind in "iu" else np.finfo(dtype)
    if v <= -_F32_MAX or v >= _F32_MAX:
        return np.asarray(info.min if v < 0 else info.max, dtype=dtype)
    if dtype.kind in "iu":
        iv = int(np.ceil(v)) if lower else int(np.floor(v))
        return np.asarray(min(max(iv, int(info.min)), int(info.max)), dtype=dtype)
    return np.asarray(min(max(v, float(info.min)), float(info.max))).astype(dtype)


def _clip(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    key = f"_bounds_{out.dtype.str}"  # p is the kernel's own dict (act_params): cache there
    bounds = p.get(key)
    if bounds is None:
        bounds = p[key] = (clip_bound(p.get("min"), out.dtype, lower=True),
                           clip_bound(p.get("max"), out.dtype, lower=False))
    lo, hi = bounds
    if lo is None and hi is None:
        if out is not x:
            np.copyto(out, x)
        return
    if lo is None:
        np.minimum(x, hi, out=out)
    elif hi is None:
        np.maximum(x, lo, out=out)
    else:
        np.clip(x, lo, hi, out=out)


def _hard_sigmoid(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    np.multiply(x, np.asarray(p["alpha"], dtype=out.dtype), out=out)
    out += np.asarray(p["beta"], dtype=out.dtype)
    np.clip(out, 0, 1, out=out)


def _hard_swish(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    gate = x * np.asarray(1.0 / 6.0, dtype=out.dtype)
    gate += np.asarray(0.5, dtype=out.dtype)
    np.clip(gate, 0, 1, out=gate)
    np.multiply(x, gate, out=out)


def _gelu_erf(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    t = x * np.asarray(1.0 / np.sqrt(2.0), dtype=out.dtype)
    erf(t, t)
    t += 1
    t *= 0.5
    np.multiply(x, t, out=out)


def _gelu_tanh(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    t = x * x
    t *= 0.044715
    t += 1
    t *= x
    t *= np.asarray(np.sqrt(2.0 / np.pi), dtype=out.dtype)
    np.tanh(t, out=t)
    t += 1
    t *= 0.5
    np.multiply(x, t, out=out)


def _elu(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    neg = x < 0
    e = np.expm1(np.minimum(x, 0))
    e *= np.asarray(p["alpha"], dtype=out.dtype)
    if out is not x:
        np.copyto(out, x)
    np.copyto(out, e, where=neg)


def _selu(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    _elu(x, out, {"alpha": p["alpha"]})
    out *= np.asarray(p["gamma"], dtype=out.dtype)


def _softplus(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    # log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), stable for large |x|.
    t = np.abs(x)
    np.negative(t, out=t)
    np.exp(t, out=t)
    np.log1p(t, out=t)
    np.maximum(x, 0, out=out)
    out += t


def _softsign(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    d = np.abs(x)
    d += 1
    np.divide(x, d, out=out)


def _silu(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    s = np.empty_like(out)
    _sigmoid(x, s, p)
    np.multiply(x, s, out=out)


def _mish(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    s = np.empty_like(out)
    _softplus(x, s, p)
    np.tanh(s, out=s)
    np.multiply(x, s, out=out)


def _ufunc(f: np.ufunc) -> ElementwiseFn:
    def run(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
        f(x, out=out)

    return run


def _erf(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    erf(x, out)


def _identity(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    if out is not x:
        np.copyto(out, x)


def _not(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    np.logical_not(x, out=out)


def _reciprocal(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    np.divide(1, x, out=out)


def _round(x: np.ndarray, out: np.ndarray, p: dict[str, Any]) -> None:
    np.rint(x, out=out)  # ONNX Round: half to even, like rint


#: Activations (``ACTIVATIONS``, usable in epilogues) and the other ``unary`` ops.
ELEMENTWISE: dict[str, ElementwiseFn] = {
    "relu": _relu,
    "leaky_relu": _leaky_relu,
    "sigmoid": _sigmoid,
    "tanh": _tanh,
    "clip": _clip,
    "hard_sigmoid": _hard_sigmoid,
    "hard_swish": _hard_swish,
    "gelu_erf": _gelu_erf,
    "gelu_tanh": _gelu_tanh,
    "gelu": _gelu_erf,
    "elu": _elu,
    "selu": _selu,
    "softplus": _softplus,
    "softsign": _softsign,
    "silu": _silu,
    "swish": _silu,
    "mish": _mish,
    "sqrt": _ufunc(np.sqrt),
    "erf": _erf,
    "exp": _ufunc(np.exp),
    "log": _ufunc(np.log),
    "neg": _ufunc(np.negative),
    "abs": _ufunc(np.abs),
    "reciprocal": _reciprocal,
    "floor": _ufunc(np.floor),
    "ceil": _ufunc(np.ceil),
    "round": _round,
    "sign": _ufunc(np.sign),
    "sin": _ufunc(np.sin),
    "cos": _ufunc(np.cos),
    "tan": _ufunc(np.tan),
    "atan": _ufunc(np.arctan),
    "asin": _ufunc(np.arcsin),
    "acos": _ufunc(np.arccos),
    "sinh": _ufunc(np.sinh),
    "cosh": _ufunc(np.cosh),
    "identity": _identity,
    "not": _not,
}

assert set(ACTIVATIONS) <= set(ELEMENTWISE), "every plan activation needs a CPU version"


def _int_div(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """Integer division truncating toward zero (C semantics, as onnxruntime)."""
    q = np.abs(a) // np.abs(b)
    neg = (a < 0) != (b < 0)
    np.copyto(out, np.where(neg, -q, q), casting="unsafe")


def _div(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    if out.dtype.kind in "iu":
        _int_div(a, b, out)
    else:
        np.divide(a, b, out=out)


def _pow(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    if out.dtype.kind == "f":
        np.power(a, b, out=out, casting="unsafe")
    else:
        np.copyto(out, np.power(a.astype(np.float64), b), casting="unsafe")


def _mod(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    with np.errstate(invalid="ignore", divide="ignore"):  # x mod 0, inf mod y: NaN, as ONNX
        np.mod(a, b, out=out, casting="unsafe")


def _binary_ufunc(f: np.ufunc) -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    def run(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        f(a, b, out=out, casting="unsafe")

    return run


#: ``binary`` kernel ops: ``fn(a, b, out)`` with numpy broadcasting.
BINARY: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], None]] = {
    "add": _binary_ufunc(np.add),
    "sub": _binary_ufunc(np.subtract),
    "mul": _binary_ufunc(np.multiply),
    "div": _div,
    "pow": _pow,
    "max": _binary_ufunc(np.maximum),
    "min": _binary_ufunc(np.minimum),
    "mod": _mod,
    "equal": _binary_ufunc(np.equal),
    "less": _binary_ufunc(np.less),
    "less_equal": _binary_ufunc(np.less_equal),
    "greater": _binary_ufunc(np.greater),
    "greater_equal": _binary_ufunc(np.greater_equal),
    "and": _binary_ufunc(np.logical_and),
    "or": _binary_ufunc(np.logical_or),
    "xor": _binary_ufunc(np.logical_xor),
}
