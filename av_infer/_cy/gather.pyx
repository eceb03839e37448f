"""Weighted gather: the image preprocessing of the ROS data path as one GIL-free C loop.

``out[n] = sum_k weight[k, n] * raw[index[k, n]] - offset[n]``: resize (nearest: 1 tap,
bilinear: 4), channel order and count, scaling, normalisation and the NCHW transpose of a
camera frame, all precomputed into ``index``/``weight``/``offset`` once per camera -> model
pair (``nodes/preprocess.py``), applied per frame straight into the task's input buffer.
numpy needs a gather, an einsum and a subtraction over temporaries for the same (about 3x
slower at 3x107x107, tests/cy/test_bench_cython.py); this runs without the GIL, so the ROS
executor's other callbacks and the runtime's threads keep running beside it.
"""

cimport cython
import numpy as np


cdef class GatherPlan:
    """``index``/``weight``/``offset`` of one camera -> model pair, checked once here (shapes,
    the largest index), so each frame only checks that the image holds that many bytes."""

    cdef readonly object index, weight, offset
    cdef readonly Py_ssize_t size, max_index
    cdef const int[:, ::1] _idx
    cdef const float[:, ::1] _w
    cdef const float[::1] _off

    def __init__(self, index, weight, offset):
        self.index = np.ascontiguousarray(index, dtype=np.int32)
        self.weight = np.ascontiguousarray(weight, dtype=np.float32)
        self.offset = np.ascontiguousarray(offset, dtype=np.float32)
        if self.index.ndim != 2 or self.weight.shape != self.index.shape \
                or self.offset.shape != (self.index.shape[1],):
            raise ValueError(f"GatherPlan: index {self.index.shape}, weight "
                             f"{self.weight.shape}, offset {self.offset.shape}")
        if self.index.size and int(self.index.min()) < 0:
            raise ValueError("GatherPlan: negative index")
        self.max_index = int(self.index.max()) if self.index.size else -1
        self.size = self.index.shape[1]
        self._idx, self._w, self._off = self.index, self.weight, self.offset

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def apply(self, const unsigned char[::1] raw, float[::1] out):
        """``out[n] = sum_k weight[k, n] * raw[index[k, n]] - offset[n]``, without the GIL.
        ValueError (nothing written) if ``raw`` is shorter than the largest index or ``out``
        is not ``size`` floats."""
        cdef Py_ssize_t k, n, K = self._idx.shape[0], N = self.size
        cdef const int[:, ::1] idx = self._idx
        cdef const float[:, ::1] w = self._w
        cdef const float[::1] off = self._off
        cdef const int* ip
        cdef const float* wp
        cdef const unsigned char* src
        cdef float* dst
        if out.shape[0] != N:
            raise ValueError(f"GatherPlan.apply: out has {out.shape[0]} floats, needs {N}")
        if self.max_index >= raw.shape[0]:
            raise ValueError(f"GatherPlan.apply: a {raw.shape[0]}-byte image, the plan "
                             f"reads byte {self.max_index}")
        if N == 0:
            return
        src, dst = &raw[0], &out[0]
        with nogil:
            for n in range(N):
                dst[n] = -off[n]
            for k in range(K):
                ip = &idx[k, 0]
                wp = &w[k, 0]
                for n in range(N):
                    dst[n] += wp[n] * src[ip[n]]
