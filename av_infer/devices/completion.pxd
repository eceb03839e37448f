# cython: language_level=3
"""C types for ``completion.py`` (Cython's pure-Python mode, as sched/request.pxd): the
record a device hands the scheduler per launch becomes a ``cdef class`` with C fields,
which the compiled scheduler (``sched/scheduler.pxd`` cimports it) reads as struct members.
Fields are ``readonly`` from Python (the class's ``__setattr__`` refuses assignment, as the
frozen dataclass it replaces did); times are C doubles, ``task``, ``executed``, ``parts``
and ``times`` stay Python objects."""

cimport cython


@cython.final
cdef class Completion:
    cdef readonly int stream
    cdef readonly object task
    cdef readonly int kernel
    cdef readonly object executed
    cdef readonly double t_start
    cdef readonly double t_end
    cdef readonly tuple parts
    cdef readonly double t_stop
    cdef readonly double cpu_s
    cdef readonly int count
    cdef readonly tuple times
