# cython: language_level=3
"""C types for ``policies.py`` (Cython's pure-Python mode, as devices/completion.pxd): a
policy becomes a ``cdef class`` with C fields, ``readonly`` from Python (its
``__setattr__`` refuses assignment, as the frozen dataclass it replaces did). The compiled
scheduler (``scheduler.pxd`` cimports it) holds the live policy typed and reads its flags
as struct members: one owner of each flag, no copies in the scheduler."""

cimport cython


@cython.final
cdef class Policy:
    cdef readonly str name
    cdef readonly bint accepts_be
    cdef readonly bint exclusive
    cdef readonly bint rt_high_priority
    cdef readonly str preempt
    cdef readonly bint be_unbounded
    cdef readonly bint available
    cdef readonly bint padding
    cdef readonly str doc
    cdef readonly bint be_concurrent_with_rt
    cdef readonly bint preempts
    cdef readonly bint waits
