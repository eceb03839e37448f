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
from libc.stdlib cimport free, malloc
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


cdef class ResizePlan:
    """The same preprocessing as a ``GatherPlan`` for the common camera -> model pairs (one
    source channel per model channel: rgb8/bgr8 to 3 channels, mono8 to any), computed
    separably instead of read from a per-output table: per output row the two source rows
    are blended into a float row (``fy``), then per output pixel two of its samples
    (``fx``), scaled and offset per channel: ``out[co, y, x] = lerp(lerp(r0, r1, fy)[x0],
    lerp(r0, r1, fy)[x1], fx) * scale[co] - offset[co]`` inside the content window
    (rows ``[row_lo, row_hi)``, columns ``[col_lo, col_hi)``), ``pad[co]`` outside it
    (letterbox).

    Why: a ``GatherPlan`` reads an index and a weight per tap per output value (4 taps
    bilinear: 1.1 MB of tables for 3x107x107, 8.6 MB for 3x299x299, evicted from the caches
    by the inference between two frames) and passes over the output five times; these
    taps are a few KB, the row blend vectorises, the output is written once. The numbers
    are the gather's up to float32 rounding (the weights apply in another order); nearest
    taps and the padding give the same floats.

    ``y0``/``y1``/``wy``: per output row, the source rows and the second one's weight;
    ``x0``/``x1``/``wx``: per output column, the source columns and weight; ``src``,
    ``scale``, ``offset``, ``pad``: per output channel; ``step``, ``ch_in``: the image's
    bytes per row and channels per pixel."""

    cdef readonly Py_ssize_t c, h, w, step, ch_in, min_bytes, row_lo, row_hi, col_lo, col_hi
    cdef Py_ssize_t _span
    cdef const int[::1] _y0, _y1, _x0, _x1, _src
    cdef const float[::1] _wy, _wx, _scale, _off, _pad
    cdef object _keep

    def __init__(self, y0, y1, wy, x0, x1, wx, src, scale, offset, pad,
                 Py_ssize_t step, Py_ssize_t ch_in, rows=None, cols=None):
        i32 = lambda a: np.ascontiguousarray(a, dtype=np.int32)
        f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)
        arrs = (i32(y0), i32(y1), f32(wy), i32(x0), i32(x1), f32(wx),
                i32(src), f32(scale), f32(offset), f32(pad))
        self.h, self.w, self.c = arrs[0].shape[0], arrs[3].shape[0], arrs[6].shape[0]
        if (any(a.ndim != 1 for a in arrs)
                or {a.shape[0] for a in arrs[:3]} != {self.h}
                or {a.shape[0] for a in arrs[3:6]} != {self.w}
                or {a.shape[0] for a in arrs[6:]} != {self.c}):
            raise ValueError("ResizePlan: inconsistent tap or channel array lengths")
        self.row_lo, self.row_hi = rows if rows is not None else (0, self.h)
        self.col_lo, self.col_hi = cols if cols is not None else (0, self.w)
        if not (0 <= self.row_lo <= self.row_hi <= self.h
                and 0 <= self.col_lo <= self.col_hi <= self.w):
            raise ValueError("ResizePlan: content window outside the output")
        if step <= 0 or ch_in <= 0:
            raise ValueError("ResizePlan: step and ch_in must be positive")
        if any(a.size and int(a.min()) < 0 for a in arrs[:2] + arrs[3:5] + arrs[6:7]):
            raise ValueError("ResizePlan: negative tap or channel")
        if self.c and int(arrs[6].max()) >= ch_in:
            raise ValueError("ResizePlan: a source channel beyond the image's")
        # the byte offsets of the columns (x * ch_in) and the row span they read
        arrs = arrs[:3] + (i32(arrs[3].astype(np.int64) * ch_in),
                           i32(arrs[4].astype(np.int64) * ch_in)) + arrs[5:]
        self._keep = arrs
        self._y0, self._y1, self._wy, self._x0, self._x1, self._wx = arrs[:6]
        self._src, self._scale, self._off, self._pad = arrs[6:]
        self.step, self.ch_in = step, ch_in
        if self.h and self.w and self.c:
            self._span = max(int(arrs[3].max()), int(arrs[4].max())) + ch_in
            self.min_bytes = (max(int(arrs[0].max()), int(arrs[1].max())) * step
                              + self._span)
        else:
            self._span = self.min_bytes = 0

    @cython.boundscheck(False)
    @cython.wraparound(False)
    @cython.cdivision(True)
    def apply(self, const unsigned char[::1] raw, float[::1] out):
        """Writes ``c*h*w`` floats of ``out`` (NCHW of one image), without the GIL.
        ValueError (nothing written) if ``raw`` is shorter than the taps read or ``out``
        is not ``c*h*w`` floats."""
        cdef Py_ssize_t H = self.h, W = self.w, C = self.c, span = self._span
        cdef Py_ssize_t rlo = self.row_lo, rhi = self.row_hi
        cdef Py_ssize_t clo = self.col_lo, chi = self.col_hi, step = self.step
        cdef Py_ssize_t y, x, co, k, s
        cdef const unsigned char* base
        cdef const unsigned char* r0
        cdef const unsigned char* r1
        cdef float* d
        cdef float* row
        cdef float* rs
        cdef float fy, fx, sc, of, pv, a
        cdef const int* x0
        cdef const int* x1
        cdef const float* wx
        cdef const int[::1] y0 = self._y0, y1 = self._y1, src = self._src
        cdef const float[::1] wy = self._wy, scale = self._scale
        cdef const float[::1] off = self._off, pad = self._pad
        if out.shape[0] != C * H * W:
            raise ValueError(f"ResizePlan.apply: out has {out.shape[0]} floats, needs "
                             f"{C * H * W}")
        if self.min_bytes > raw.shape[0]:
            raise ValueError(f"ResizePlan.apply: a {raw.shape[0]}-byte image, the plan "
                             f"reads {self.min_bytes} bytes")
        if C * H * W == 0:
            return
        base = &raw[0]
        x0, x1, wx = &self._x0[0], &self._x1[0], &self._wx[0]
        row = <float*> malloc(span * sizeof(float))
        if row == NULL:
            raise MemoryError()
        with nogil:
            for y in range(H):
                if y < rlo or y >= rhi:
                    for co in range(C):
                        d = &out[(co * H + y) * W]
                        pv = pad[co]
                        for x in range(W):
                            d[x] = pv
                    continue
                r0 = base + y0[y] * step
                r1 = base + y1[y] * step
                fy = wy[y]
                for k in range(span):  # the two source rows blended: vectorises
                    row[k] = r0[k] + fy * (<float> r1[k] - <float> r0[k])
                for co in range(C):
                    d = &out[(co * H + y) * W]
                    s, sc, of, pv = src[co], scale[co], off[co], pad[co]
                    rs = row + s
                    for x in range(clo):
                        d[x] = pv
                    for x in range(clo, chi):
                        fx = wx[x]
                        a = rs[x0[x]]
                        d[x] = (a + fx * (rs[x1[x]] - a)) * sc - of
                    for x in range(chi, W):
                        d[x] = pv
        free(row)
