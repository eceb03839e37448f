# cython: language_level=3
"""C types for ``latency.py`` (Cython's pure-Python mode, as sched/request.pxd): the
recorder becomes a ``cdef class`` whose ``add`` is a C method over a typed view of its
ring, so a sample recorded on the request path (the scheduler's per-client latency and
preemption figures, one or two a request) costs a C call instead of a Python frame
(docs/request_path.md). ``count``, ``total`` and ``max`` stay readable from Python."""

cimport cython


@cython.final
cdef class LatencyRecorder:
    cdef object _ring
    cdef double[::1] _view
    cdef Py_ssize_t _size
    cdef Py_ssize_t _cap
    cdef public long long count
    cdef public double total
    cdef public double max

    @cython.locals(n=cython.longlong)
    cpdef void add(self, double seconds)
