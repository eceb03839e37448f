"""The image gather of the ROS data path (av_infer/_cy/gather.pyx, ``GatherPlan``): the same
numbers as numpy's gather + einsum, and every bad argument refused before anything runs."""

from __future__ import annotations

import numpy as np
import pytest
from av_infer_nodes import preprocess as pre

from av_infer.tensor_codec import GatherPlan


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
    np.testing.assert_allclose(t[0].reshape(-1), out, rtol=1e-6)
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
