"""``exact_array`` (numpy's C API) answers as the Python expression it replaces in
``LaneEngine.write_inputs``, for every kind of value a caller may hand in."""

from __future__ import annotations

import numpy as np
import pytest
from av_infer._cy.ndcheck import exact_array


def _python(v: object, dst: np.ndarray) -> bool:
    return bool(isinstance(v, np.ndarray) and v.shape == dst.shape
                and v.dtype == dst.dtype and v.flags.c_contiguous)


class Sub(np.ndarray):
    pass


def _values(dst: np.ndarray) -> list[object]:
    base = np.arange(dst.size * 4, dtype=np.float64).astype(dst.dtype)
    same = base[:dst.size].reshape(dst.shape)
    out: list[object] = [
        same, same.copy(order="F"), same.view(Sub), same.astype(np.float64),
        same.astype(np.float16), same.astype(">f4"), same.astype("<f4"), same.astype(np.int32),
        base[::2][:dst.size].reshape(dst.shape) if dst.ndim else same,
        np.zeros(dst.shape + (1,), dst.dtype), np.zeros((1,) + dst.shape, dst.dtype),
        np.zeros(dst.shape[::-1], dst.dtype), np.zeros(dst.size + 1, dst.dtype),
        same.tolist(), None, 1.5, "x", memoryview(same.copy()), np.float32(1.0),
    ]
    if dst.ndim >= 2:
        out.append(np.ascontiguousarray(same.T).T)  # an F-ordered view of the shape
        out.append(np.zeros((dst.shape[0], dst.shape[1] * 2) + dst.shape[2:],
                            dst.dtype)[:, ::2])  # strided, right shape
    return out


@pytest.mark.parametrize("shape", [(), (1,), (5,), (1, 3), (2, 3), (3, 1, 4), (1, 1, 2, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_exact_array_is_the_python_check(shape: tuple[int, ...], dtype: type) -> None:
    dst = np.zeros(shape, dtype)
    for v in _values(dst):
        assert exact_array(v, dst) == _python(v, dst), (shape, dtype, v)


def test_a_region_that_is_no_array_is_refused() -> None:
    with pytest.raises(TypeError):
        exact_array(np.zeros(2), [0.0, 0.0])


def _python_spec(v: object, shape: tuple[int, ...], dt: np.dtype) -> int:
    if not (isinstance(v, np.ndarray) and v.shape == shape and v.dtype == dt):
        return 0
    return 2 if v.flags.c_contiguous else 1


@pytest.mark.parametrize("shape", [(), (1,), (5,), (1, 3), (2, 3), (3, 1, 4), (1, 1, 2, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_spec_match_is_the_python_check(shape: tuple[int, ...], dtype: type) -> None:
    from av_infer._cy.ndcheck import spec_match

    dst = np.zeros(shape, dtype)
    dt = np.dtype(dtype)
    for v in _values(dst):
        assert spec_match(v, shape, dt) == _python_spec(v, shape, dt), (shape, dtype, v)
    # a shape given with numpy integers is left to the Python check (0: no decision here)
    if shape:
        assert spec_match(dst, tuple(np.int64(d) for d in shape), dt) == 0
