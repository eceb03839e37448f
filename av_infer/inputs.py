# cython: annotation_typing=False, language_level=3
"""A request's input tensors at the API boundary: validation and zero-copy buffers.

Why here: the runtime checks inputs exactly (names, shapes, dtypes; no silent casts)
before anything is queued, and copies them so callers can reuse their buffers, except
where the caller handed the arrays over (:class:`InputBuffers`) or waits for the answer
(``Runtime.infer`` without a timeout borrows them, as ``InferenceSession.run`` does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from av_infer._cy.ndcheck import spec_match
from av_infer.errors import InvalidInputError

__all__ = ["InputBuffers", "Spec", "fmt_spec", "validate_inputs"]

Spec = dict[str, tuple[tuple[int, ...], str]]


def validate_inputs(model: str, spec: Spec, inputs: Any,
                    borrow: bool = False) -> dict[str, np.ndarray]:
    """Exact names, shapes and dtypes (no silent casts); returns private copies, or with
    ``borrow`` (``Runtime.infer``: the caller waits) the C-contiguous arrays themselves.
    Raises InvalidInputError naming the first thing wrong (names before arrays).

    Every submit runs this, so the common case takes the cheap checks first: a plain dict
    before the ``Mapping`` ABC check, one key-view comparison for the names (the lists of
    missing and unexpected names are built only for the error), dtypes compared with
    cached ``np.dtype`` objects rather than parsed from their names each time."""
    if type(inputs) is dict and len(inputs) == len(spec):
        # the common case in C (numpy's C API, ``_cy/ndcheck.spec_match``): every name
        # present with an array of its shape and dtype; anything else goes to the checks
        # below, which name the first thing wrong (names before arrays)
        out: dict[str, np.ndarray] = {}
        for name, (shape, dtype) in spec.items():
            v = inputs.get(name)
            dt = _np_dtype(dtype)
            m = spec_match(v, shape if type(shape) is tuple else tuple(shape), dt)
            if m == 0:
                break
            out[name] = v if borrow and m == 2 else v.copy(order="C")
        else:
            return out
    if type(inputs) is not dict and not isinstance(inputs, Mapping):
        raise InvalidInputError(
            f"model {model!r}: inputs must be a dict of name -> numpy array, "
            f"got {type(inputs).__name__}")
    if inputs.keys() != spec.keys():
        missing = [n for n in spec if n not in inputs]
        extra = [n for n in inputs if n not in spec] \
            if len(inputs) != len(spec) or missing else []
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if extra:
            parts.append(f"unexpected {extra}")
        raise InvalidInputError(f"model {model!r}: {', '.join(parts)}; "
                                f"expects {fmt_spec(spec)}")
    buffers = isinstance(inputs, InputBuffers)
    out = {}
    for name, (shape, dtype) in spec.items():
        v = inputs[name]
        if not isinstance(v, np.ndarray):
            raise InvalidInputError(
                f"model {model!r} input {name!r}: expected a numpy array {dtype}{list(shape)}, "
                f"got {type(v).__name__}")
        dt = _np_dtype(dtype)
        vdt = v.dtype  # numpy's dtypes of the built-in types are one object each: ``is``
        if v.shape != (shape if type(shape) is tuple else tuple(shape)) or (
                vdt is not dt and vdt != dt):
            raise InvalidInputError(
                f"model {model!r} input {name!r}: expected {dtype}{list(shape)}, "
                f"got {v.dtype}{list(v.shape)}")
        if buffers:
            out[name] = inputs.take(name, v)
        elif borrow and v.flags.c_contiguous:
            out[name] = v
        else:
            out[name] = v.copy(order="C")
    return out


#: dtype name (as a plan's spec holds it) -> ``np.dtype``: a handful of entries
_DTYPES: dict[Any, np.dtype] = {}


def _np_dtype(dtype: Any) -> np.dtype:
    """``np.dtype(dtype)`` from the cache (made once per name)."""
    dt = _DTYPES.get(dtype)
    if dt is None:
        dt = _DTYPES[dtype] = np.dtype(dtype)
    return dt


class InputBuffers(dict):
    """Input arrays a caller filled in place, handed to ``Runtime.submit`` without a copy.

    ``Runtime.input_buffers(model)`` makes them; the caller writes into the arrays (never
    replaces them: a replaced or foreign array is copied as usual) and submits the mapping
    once. On submit the runtime owns the arrays: they become read-only, so a late write by
    the caller fails loudly instead of changing a queued request. Submitting the same
    mapping again copies (the arrays are the first request's).
    """

    def __init__(self, model: str, arrays: dict[str, np.ndarray]):
        super().__init__(arrays)
        self.model = model
        self._own = dict(arrays)
        self._taken = False

    def take(self, name: str, value: np.ndarray) -> np.ndarray:
        """``value`` itself if it is this mapping's untaken own array, else a copy."""
        if self._taken or self._own.get(name) is not value or not value.flags.c_contiguous:
            return value.copy(order="C")
        value.flags.writeable = False
        if all(not a.flags.writeable for a in self.values()):
            self._taken = True
        return value


def fmt_spec(spec: Spec) -> str:
    """``name: dtype[shape], ...`` for error messages."""
    return ", ".join(f"{n}: {dt}{list(sh)}" for n, (sh, dt) in spec.items())
