# cython: language_level=3
"""C types for ``model_services.py`` (Cython's pure-Python mode, as scheduler.pxd for
the scheduler): ``ModelServices`` is a ``cdef class`` whose request-path hooks,
``acquire`` and ``release``, are ``cpdef`` methods: the compiled scheduler calls them
without a Python frame, and they call the cache's ``retain``/``release`` as C functions
(``cache`` is a ``ModelCache``, cache.pxd) and read the scheduler's ``Task`` (cimported)
as a struct. Every field is ``public``: the engine, the runtime and tests read and write
the same names as before (``batching`` a C ``bint``, ``quantum``/``rate_window``
doubles, the counters ``long long``).

The scheduler's ``ext`` stays an untyped object: typing it as ``ModelServices`` would
make scheduler.pxd cimport this file, which cimports scheduler.pxd (``Task``), and the
scheduler's extension would import this module, which imports the scheduler, while it
initialises.
"""

cimport cython

from av_infer.cache cimport ModelCache
from av_infer.sched.scheduler cimport Task


@cython.final
cdef class ModelServices:
    cdef public ModelCache cache
    cdef public object wake
    cdef public object ready
    cdef public bint batching
    cdef public double quantum
    cdef public dict batch_entries
    cdef public dict batchers
    cdef public dict _retained
    cdef public dict _parked
    cdef public set _unload_later
    cdef public set _counted
    cdef public object _ids
    cdef public long long batched_requests
    cdef public long long batch_tasks
    cdef public object mode
    cdef public dict groups
    cdef public dict deciders
    cdef public object latency
    cdef public object policy
    cdef public dict eq2
    cdef public double rate_window
    cdef public object fixed_max
    cdef public object max_batch
    cdef public dict _plan_variant
    cdef public dict _expected_end

    @cython.locals(counted=set, waiting=bint)
    cpdef object acquire(self, Task t)
    cpdef release(self, Task t)
