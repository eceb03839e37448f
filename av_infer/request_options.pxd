# cython: language_level=3
"""C types for ``request_options.py`` (Cython's pure-Python mode, as
devices/completion.pxd): one request's options become a ``cdef class`` with C fields,
``readonly`` from Python (its ``__setattr__`` refuses assignment, as the frozen dataclass
it replaces did), which the compiled admission (``admission.pxd`` cimports it) reads as
struct members. ``check_client`` and ``parse_priority``, the one validators of a client
name and a priority (``Runtime.configure_client`` and the admission call them), are C
functions the admission calls directly."""

cimport cython


@cython.final
cdef class RequestOptions:
    cdef readonly object priority
    cdef readonly object deadline
    cdef readonly object client
    cdef readonly object arrival
    cdef readonly object drop_late
    cdef readonly object hard_deadline
    cdef readonly object variant_group
    cdef readonly bint borrow


cpdef check_client(client)
cpdef parse_priority(priority)
