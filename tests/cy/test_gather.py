"""The image gather of the ROS data path (av_infer/_cy/gather.pyx, ``GatherPlan``): the same
numbers as numpy's gather + einsum, and every bad argument refused before anything runs."""

from __future__ import annotations

import numpy as np
import pytest
from av_infer_nodes import preprocess as pre

from av_infer.tensor_codec import GatherPlan, ResizePlan


def _numpy(raw: np.ndarray, key: tuple) -> np.ndarray:
    index, weight, offset = pre._gather_plan(*key)
    return np.einsum("kn,kn->n", raw.take(index), weight) - offset


@pytest.mark.parametrize("encoding,ch", [("rgb8", 3), ("bgr8", 3), ("mono8", 1)])
@pytest.mark.parametrize("method", pre.RESIZE_METHODS)
@pytest.mark.parametrize("c,h,w", [(3, 17, 23), (1, 8, 8), (3, 30, 40)])
def test_gather_plan_matches_numpy(encoding, ch, method, c, h, w):
    rng = np.random.default_rng(0)
    height, width, step = 30, 40, 40 * ch + 5  # padded rows
    raw = rng.integers(0, 256, height * step, dtype=np.uint8)
    key = (encoding, height, width, step, c, h, w, method, (0.4,) * c, (0.25,) * c)
    plan = pre._compiled_plan(*key)
    out = np.empty(c * h * w, np.float32)
    plan.apply(raw, out)
    np.testing.assert_allclose(out, _numpy(raw, key), rtol=1e-5, atol=1e-4)
    t = pre.image_to_tensor(encoding, height, width, step, raw.tobytes(), (2, c, h, w),
                            method, (0.4,) * c, (0.25,) * c)
    # image_to_tensor takes the separable ResizePlan where it applies: float32 rounding
    np.testing.assert_allclose(t[0].reshape(-1), out, rtol=1e-6, atol=2e-6)
    np.testing.assert_array_equal(t[1], t[0])


def test_gather_plan_refuses_bad_arguments_before_running():
    idx = np.array([[0, 5, 9]], np.int32)
    wt = np.ones((1, 3), np.float32)
    off = np.zeros(3, np.float32)
    plan = GatherPlan(idx, wt, off)
    out = np.full(3, 7.0, np.float32)
    with pytest.raises(ValueError, match="reads byte 9"):
        plan.apply(np.zeros(9, np.uint8), out)  # one byte short
    with pytest.raises(ValueError, match="needs 3"):
        plan.apply(np.zeros(10, np.uint8), np.empty(2, np.float32))
    np.testing.assert_array_equal(out, 7.0)  # nothing written by a refused call
    with pytest.raises(ValueError):
        GatherPlan(idx, np.ones((2, 3), np.float32), off)  # weight shape
    with pytest.raises(ValueError, match="negative"):
        GatherPlan(np.array([[-1]], np.int32), np.ones((1, 1), np.float32),
                   np.zeros(1, np.float32))
    plan.apply(np.arange(10, dtype=np.uint8), out)
    np.testing.assert_array_equal(out, [0, 5, 9])


def test_empty_plan_is_a_no_op():
    plan = GatherPlan(np.zeros((1, 0), np.int32), np.zeros((1, 0), np.float32),
                      np.zeros(0, np.float32))
    plan.apply(np.zeros(0, np.uint8), np.zeros(0, np.float32))


@pytest.mark.parametrize("encoding,ch", [("rgb8", 3), ("bgr8", 3), ("mono8", 1)])
@pytest.mark.parametrize("method", pre.RESIZE_METHODS)
@pytest.mark.parametrize("fit", pre.FIT_MODES)
@pytest.mark.parametrize("c,h,w", [(3, 17, 23), (1, 8, 8), (3, 30, 40), (3, 5, 90)])
@pytest.mark.parametrize("height,width", [(30, 40), (7, 5), (1, 1)])
def test_resize_plan_is_the_gather(encoding, ch, method, fit, c, h, w, height, width):
    """The separable plan computes what the gather plan does: nearest taps and letterbox
    padding to the bit, bilinear to float32 rounding."""
    if ch == 3 and c == 1:
        assert pre._resize_plan(encoding, 30, 40, 125, 1, 8, 8, method, (0.4,), (0.25,),
                                fit) is None  # RGB -> grey: the gather's mean of channels
        return
    rng = np.random.default_rng(1)
    step = width * ch + 5
    raw = rng.integers(0, 256, height * step, dtype=np.uint8)
    key = (encoding, height, width, step, c, h, w, method, (0.4,) * c, (0.25,) * c, fit)
    sep = pre._resize_plan(*key)
    assert isinstance(sep, ResizePlan)
    a, b = np.empty(c * h * w, np.float32), np.empty(c * h * w, np.float32)
    sep.apply(raw, a)
    pre._compiled_plan(*key).apply(raw, b)
    if method == "nearest":
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=2e-6)
    if fit == "letterbox":  # the padding exactly where the gather puts it
        np.testing.assert_array_equal(np.isclose(a, a[0]), np.isclose(b, b[0]))


def test_resize_plan_refuses_bad_arguments_before_running():
    one = np.zeros(2, np.int32)
    z = np.zeros(2, np.float32)
    ch = np.zeros(1, np.int32)
    f1 = np.ones(1, np.float32)
    ii = np.array([0, 1], np.int32)  # rows 0 and 1, columns 0 and 1, no blending
    plan = ResizePlan(ii, ii, z, ii, ii, z, ch, f1, f1 * 0, f1, 4, 1)
    out = np.full(4, 7.0, np.float32)
    with pytest.raises(ValueError, match="reads 6 bytes"):
        plan.apply(np.zeros(5, np.uint8), out)  # row 1, column 1: byte 4 + 1
    with pytest.raises(ValueError, match="needs 4"):
        plan.apply(np.zeros(6, np.uint8), np.empty(3, np.float32))
    np.testing.assert_array_equal(out, 7.0)  # nothing written by a refused call
    plan.apply(np.array([1, 2, 0, 0, 3, 4], np.uint8), out)
    np.testing.assert_array_equal(out, [1, 2, 3, 4])
    with pytest.raises(ValueError, match="inconsistent"):
        ResizePlan(one, one, z, one, one, np.zeros(3, np.float32), ch, f1, f1, f1, 4, 1)
    with pytest.raises(ValueError, match="negative"):
        ResizePlan(np.array([-1, 0]), one, z, one, one, z, ch, f1, f1, f1, 4, 1)
    with pytest.raises(ValueError, match="source channel"):
        ResizePlan(one, one, z, one, one, z, np.array([1]), f1, f1, f1, 4, 1)
    with pytest.raises(ValueError, match="content window"):
        ResizePlan(one, one, z, one, one, z, ch, f1, f1, f1, 4, 1, rows=(1, 3))
