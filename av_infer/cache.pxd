# cython: language_level=3
"""C types for ``cache.py`` (Cython's pure-Python mode, as scheduler.pxd for the
scheduler): ``ModelCache`` and its ``_Entry`` records become ``cdef class``es with C
fields, and the request path's two calls, ``retain`` and ``release``, are ``cpdef``
methods that the compiled ``ModelServices`` (model_services.pxd, cimporting this file)
calls as C functions, reading the entry's refcount, state and handle as struct members
(docs/request_path.md, "Model cache hooks compiled"). The lock stays a
``threading.Lock`` (the cache is used from several threads). Every field is
``public``: Python code (tests, diagnostics) reads the same names as before.
"""

cimport cython


@cython.final
cdef class _Entry:
    cdef public object name
    cdef public object plan
    cdef public bint pinned
    cdef public str state
    cdef public bint gone
    cdef public object handle
    cdef public object size
    cdef public long long refs
    cdef public long long loads
    cdef public list waiters


@cython.final
cdef class ModelCache:
    cdef public object _device
    cdef public object _budget
    cdef public object _max_models
    cdef public object _mode
    cdef public object _clock
    cdef public dict _entries
    cdef public object _lru
    cdef public object _pending
    cdef public _Entry _loading
    cdef public object _lock
    cdef public object _cv
    cdef public bint _dirty
    cdef public bint _draining
    cdef public bint _closed
    cdef public long long _hits
    cdef public long long _misses
    cdef public long long _evictions
    cdef public long long _loads
    cdef public list _load_times
    cdef public long long _load_errors
    cdef public object _thread

    @cython.locals(e=_Entry)
    cpdef object retain(self, name, bint count=*)
    @cython.locals(e=_Entry, work=bint)
    cpdef release(self, name)
