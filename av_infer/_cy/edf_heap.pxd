# cython: language_level=3
"""cdef API of the EDF heap (av_infer._cy.edf_heap) for other Cython modules.

    from av_infer._cy.edf_heap cimport EdfHeap

All methods need the GIL (items are Python objects). Not thread-safe beyond the GIL:
one scheduler thread owns a heap.
"""
cimport cython
from libc.stdint cimport uint32_t, uint64_t


cdef struct HeapEntry:
    double key          # absolute deadline; +inf = no deadline
    uint64_t seq        # insertion counter: FIFO among equal deadlines
    Py_ssize_t slot     # index into EdfHeap._objs


@cython.final
cdef class EdfHeap:
    cdef HeapEntry* _heap       # binary min-heap on (key, seq); live and stale entries
    cdef Py_ssize_t _n          # entries in _heap
    cdef Py_ssize_t _cap        # allocated entries (== slots)
    cdef list _objs             # slot -> item (None when free or stale)
    cdef unsigned char* _state  # slot -> SLOT_FREE / SLOT_LIVE / SLOT_STALE
    cdef uint32_t* _gen         # slot -> generation (part of the handle; bumped on free)
    cdef Py_ssize_t* _free      # stack of free slots
    cdef Py_ssize_t _nfree
    cdef Py_ssize_t _live       # live items (what __len__ reports)
    cdef uint64_t _seq

    cdef int _grow(self, Py_ssize_t new_cap) except -1
    cdef void _sift_up(self, Py_ssize_t pos, HeapEntry e) noexcept
    cdef void _sift_down(self, Py_ssize_t pos, HeapEntry e) noexcept
    cdef void _remove_top(self) noexcept
    cdef void _release_slot(self, Py_ssize_t slot) noexcept
    cdef void _drop_stale_top(self) noexcept
    cdef void _compact(self) noexcept
    cdef list _sorted_live(self)

    # Fast paths. push_c returns the handle (never 0); pop_c returns the item and writes
    # its deadline, raising IndexError when empty; peek_deadline_c returns False when empty.
    cdef uint64_t push_c(self, double deadline, object item) except 0
    cdef object pop_c(self, double* deadline)
    cdef bint peek_deadline_c(self, double* deadline) except -1
    cdef bint remove_c(self, uint64_t handle) except -1
