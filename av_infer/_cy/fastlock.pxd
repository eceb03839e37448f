# cython: language_level=3
"""C declarations of ``fastlock.pyx`` (``FastLock``) for the compiled modules that type a
lock field as one and call ``acquire``/``release`` as C functions."""

from cpython.pythread cimport PyThread_type_lock


cdef class FastLock:
    cdef PyThread_type_lock _lock
    cdef bint _locked

    cpdef bint acquire(self, bint blocking=*, double timeout=*)
    cpdef release(self)
    cpdef bint release_if_locked(self)


cpdef unsigned long thread_ident() noexcept
