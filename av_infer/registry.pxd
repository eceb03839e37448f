# cython: language_level=3
"""C types for ``registry.py`` (Cython's pure-Python mode, av_infer/_cy/compiled.py): the
registry a ``cdef class`` whose tables are ``public`` fields (Python code reads and
writes the same names) and whose per-request look-up, ``resolve``, is a C method the
compiled admission (``admission.pxd`` cimports it) calls directly, reading the tables
without the lock unless a change overlapped it (``_gen``, a C field; registry.py)."""

cimport cython


@cython.final
cdef class ModelRegistry:
    cdef public object lock
    cdef public dict models
    cdef public dict sources
    cdef public dict groups
    cdef public dict clients
    cdef public dict submit_errors
    cdef public unsigned long long _gen

    @cython.locals(gen="unsigned long long")
    cpdef tuple resolve(self, model, client, variant_group)
    cdef tuple _look(self, model, client, variant_group)
    cdef void _begin(self)
    cdef void _end(self)
