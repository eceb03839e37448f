# cython: language_level=3
"""C types for ``request.py`` (Cython's pure-Python mode, as scheduler.pxd for the
scheduler): ``Timings`` and ``Request`` become ``cdef class``es with C fields, which the
compiled scheduler (``cimport``-ing them in scheduler.pxd) reads and writes as struct
members instead of through the interpreter's generic attribute lookup
(docs/request_path.md, "Requests compiled"). Every field is ``public``: Python code reads
and writes the same names. Times are C doubles (an ``int`` given reads back as a float);
names, inputs, priority, future and thread ident stay Python objects.
"""

cimport cython


@cython.final
cdef class Timings:
    cdef public double arrival
    cdef public double start
    cdef public double first_kernel_start
    cdef public double end
    cdef public long long preempted
    cdef public long long kernels_padded
    cdef public double received
    cdef public double run_cpu


@cython.final
cdef class Request:
    cdef public object id
    cdef public object model
    cdef public object inputs
    cdef public object priority
    cdef public object client
    cdef public double deadline
    cdef public bint drop_late
    cdef public Timings timings
    cdef public object future
    cdef public int stream
    cdef public object caller_runs
    cdef public double hard_deadline


@cython.final
cdef class Result:
    cdef public object request_id
    cdef public object model
    cdef public object client
    cdef public object priority
    cdef public object outputs
    cdef public Timings timings
    cdef public double deadline
    cdef public double hard_deadline
    cdef public double kappa
