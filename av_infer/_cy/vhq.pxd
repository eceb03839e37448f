# cython: language_level=3
"""cdef API of the virtual host queue (av_infer._cy.vhq) for other Cython modules.

    from vhq cimport VHQ, ResetInfo

The ``*_c`` methods take the VHQ's own lock and never need the GIL, so a dispatcher thread
can call ``transmit_c`` / ``complete_c`` inside ``with nogil:`` while the scheduler thread
pushes and resets through the Python API. Never call them while holding ``_lock`` yourself.
"""
cimport cython
from cpython.pythread cimport PyThread_type_lock
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

cdef enum:
    VHQ_MAX_C = 4096        # largest device-queue capacity c (power of 2); size of the in-flight ring. Large so the `wait` baseline can put a whole model in flight


cdef struct LaunchRange:    # kernels next..last (inclusive) of one task, not yet transmitted
    int64_t task
    int32_t next
    int32_t last


cdef struct InFlight:       # one transmitted, not yet completed launch
    int64_t task
    int32_t kernel
    uint32_t epoch          # VHQ._epoch at transmit time; resets bump the epoch


cdef struct ResetInfo:
    int64_t task            # task being transmitted (or the head task if none was sent)
    int32_t last_sent       # k_l: last kernel of `task` transmitted (-1: none in this epoch)
    int32_t done            # kernels < done of `task` have completed (exact, in order)
    int64_t dropped         # queued launches dropped by the reset (all tasks)


@cython.final
cdef class VHQ:
    cdef PyThread_type_lock _lock
    cdef LaunchRange* _ring     # ring of range records, capacity _mask + 1 (power of 2)
    cdef uint64_t _mask
    cdef uint64_t _head         # free-running counters; slot = counter & _mask
    cdef uint64_t _tail
    cdef int64_t _queued        # untransmitted launches (sum over ranges)
    cdef InFlight _fl[VHQ_MAX_C]
    cdef uint32_t _fl_head
    cdef int32_t _in_flight     # all in-flight launches (count against c)
    cdef int32_t _in_flight_cur  # those transmitted in the current epoch
    cdef int32_t _c
    cdef uint32_t _epoch
    cdef bint _cur_valid        # a launch was transmitted in the current epoch
    cdef int64_t _cur_task
    cdef int32_t _cur_last_sent
    cdef int32_t _cur_done
    cdef uint64_t _n_transmitted
    cdef uint64_t _n_completed
    cdef uint64_t _n_resets

    # Unlocked bodies (caller holds _lock).
    cdef int32_t _oldest_in_flight(self, int64_t task, int32_t dflt) noexcept nogil
    cdef int _push_locked(self, int64_t task, int32_t first, int32_t last) noexcept nogil
    cdef int _transmit_locked(self, int64_t* task, int32_t* kernel) noexcept nogil
    cdef int _complete_locked(self, int64_t* task, int32_t* kernel) noexcept nogil
    cdef int _reset_locked(self, ResetInfo* info) noexcept nogil

    # Locked, GIL-free API. push_c: 0 ok, -1 out of memory, -2 bad range.
    # transmit_c / complete_c: 1 and the launch written, 0 nothing to do.
    # reset_c: 1 and *info filled, 0 when nothing was queued or sent in this epoch.
    cdef int push_c(self, int64_t task, int32_t first, int32_t last) noexcept nogil
    cdef int transmit_c(self, int64_t* task, int32_t* kernel) noexcept nogil
    cdef int complete_c(self, int64_t* task, int32_t* kernel) noexcept nogil
    cdef int reset_c(self, ResetInfo* info) noexcept nogil

    # The Python API's per-request calls, cpdef: C calls from compiled callers (the cpu
    # lanes), Python methods as before for everyone else.
    cpdef push(self, int64_t task, int32_t first, int32_t last)
    cpdef Py_ssize_t transmit_into(self, dq) except -1
    cpdef tuple complete(self)
    cpdef reset(self)
