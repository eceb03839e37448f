# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Virtual host queue (vHQ) in front of one device stream: REEF-N, OSDI'22 §4.4.

The scheduler thread ``push``es launches as ranges ``(task, first..last)`` (O(1) for a whole
task) and ``reset``s the queue on preemption (O(1): head := tail). A dispatcher thread
``transmit``s one launch at a time to the stream while fewer than ``c`` are in flight and
reports each in-order completion with ``complete``. State is guarded by a
``PyThread_type_lock``; the ``*_c`` methods (see vhq.pxd) run without the GIL.

Restore protocol (REEF §4.3): ``reset()`` snapshots, for the task being transmitted, k_l
(``last_sent``) and ``done`` (kernels < done have completed). Call it *before* raising the
preemption flag, so every completion counted in ``done`` really executed. The task resumes
from ``done``: with at most c launches in flight, in order, that is REEF's
``max(done, k_l - c)``, observed rather than inferred (the vHQ's property test checks the
two agree, c being the largest in effect while the launches were sent). Launches still in
flight stay in flight (they finish or self-evict); their completions after the reset belong to an old epoch
and no longer move ``done``. A reset reports one task: a preemptible stream should carry one
task at a time (launches of an earlier task still in flight at the reset are visible through
``inflight()`` before the reset).
"""
from cpython.mem cimport PyMem_RawFree, PyMem_RawMalloc
from cpython.pythread cimport (
    NOWAIT_LOCK,
    WAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
)
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

cdef enum:
    MIN_RING = 16


#: Largest device-queue capacity c a vHQ accepts (size of its in-flight ring).
MAX_C = VHQ_MAX_C


cdef inline void _lock_gil(PyThread_type_lock lock):
    """Acquire from a thread holding the GIL; release the GIL only if we must wait."""
    if not PyThread_acquire_lock(lock, NOWAIT_LOCK):
        with nogil:
            PyThread_acquire_lock(lock, WAIT_LOCK)


cdef class VHQ:
    """Virtual host queue of (task, kernel) launches with at most ``c`` in flight."""

    def __cinit__(self, int c=4, Py_ssize_t capacity=MIN_RING):
        cdef uint64_t cap = MIN_RING
        if c < 1 or c > VHQ_MAX_C:
            raise ValueError(f"c must be in 1..{VHQ_MAX_C}, got {c}")
        while cap < <uint64_t>capacity:
            cap <<= 1
        self._ring = <LaunchRange*>PyMem_RawMalloc(cap * sizeof(LaunchRange))
        if self._ring == NULL:
            raise MemoryError()
        self._lock = PyThread_allocate_lock()
        if self._lock == NULL:
            raise MemoryError()
        self._mask = cap - 1
        self._head = 0
        self._tail = 0
        self._queued = 0
        self._fl_head = 0
        self._in_flight = 0
        self._in_flight_cur = 0
        self._c = c
        self._epoch = 0
        self._cur_valid = False
        self._cur_task = -1
        self._cur_last_sent = -1
        self._cur_done = 0
        self._n_transmitted = 0
        self._n_completed = 0
        self._n_resets = 0

    def __dealloc__(self):
        if self._lock != NULL:
            PyThread_free_lock(self._lock)
        PyMem_RawFree(self._ring)

    # -- unlocked bodies -------------------------------------------------------------
    cdef int _push_locked(self, int64_t task, int32_t first, int32_t last) noexcept nogil:
        cdef uint64_t n, cap, i
        cdef LaunchRange* r
        cdef LaunchRange* new_ring
        if first < 0 or last < first:
            return -2
        if self._tail != self._head:
            # Extend the tail range when the new one continues it.
            r = &self._ring[(self._tail - 1) & self._mask]
            if r.task == task and r.last == first - 1:
                r.last = last
                self._queued += <int64_t>last - first + 1
                return 0
        n = self._tail - self._head
        if n == self._mask + 1:
            cap = (self._mask + 1) * 2
            new_ring = <LaunchRange*>PyMem_RawMalloc(cap * sizeof(LaunchRange))
            if new_ring == NULL:
                return -1
            for i in range(n):
                new_ring[i] = self._ring[(self._head + i) & self._mask]
            PyMem_RawFree(self._ring)
            self._ring = new_ring
            self._mask = cap - 1
            self._head = 0
            self._tail = n
        r = &self._ring[self._tail & self._mask]
        r.task = task
        r.next = first
        r.last = last
        self._tail += 1
        self._queued += <int64_t>last - first + 1
        return 0

    cdef int32_t _oldest_in_flight(self, int64_t task, int32_t dflt) noexcept nogil:
        # O(c): scan the in-flight ring (called only when the transmitted task changes).
        cdef int32_t i
        cdef InFlight* f
        for i in range(self._in_flight):
            f = &self._fl[(self._fl_head + <uint32_t>i) & (VHQ_MAX_C - 1)]
            if f.epoch == self._epoch and f.task == task:
                return f.kernel
        return dflt

    cdef int _transmit_locked(self, int64_t* task, int32_t* kernel) noexcept nogil:
        cdef LaunchRange* r
        cdef InFlight* f
        cdef int64_t t
        cdef int32_t k
        if self._in_flight >= self._c or self._head == self._tail:
            return 0
        r = &self._ring[self._head & self._mask]
        t = r.task
        k = r.next
        if k == r.last:
            self._head += 1
        else:
            r.next = k + 1
        self._queued -= 1
        f = &self._fl[(self._fl_head + <uint32_t>self._in_flight) & (VHQ_MAX_C - 1)]
        f.task = t
        f.kernel = k
        f.epoch = self._epoch
        self._in_flight += 1
        self._in_flight_cur += 1
        if not self._cur_valid or self._cur_task != t:
            # Switching to task t: its oldest launch of this epoch still in flight is the
            # first kernel not known to be done; with none in flight, every kernel before
            # k is done (a task is pushed from its start or from its restore point).
            self._cur_valid = True
            self._cur_task = t
            self._cur_done = self._oldest_in_flight(t, k)
        self._cur_last_sent = k
        self._n_transmitted += 1
        task[0] = t
        kernel[0] = k
        return 1

    cdef int _complete_locked(self, int64_t* task, int32_t* kernel) noexcept nogil:
        cdef InFlight* f
        if self._in_flight == 0:
            return 0
        f = &self._fl[self._fl_head]
        self._fl_head = (self._fl_head + 1) & (VHQ_MAX_C - 1)
        self._in_flight -= 1
        if f.epoch == self._epoch:
            self._in_flight_cur -= 1
            if self._cur_valid and f.task == self._cur_task and f.kernel >= self._cur_done:
                self._cur_done = f.kernel + 1
        self._n_completed += 1
        task[0] = f.task
        kernel[0] = f.kernel
        return 1

    cdef int _reset_locked(self, ResetInfo* info) noexcept nogil:
        cdef LaunchRange* r
        cdef int found = 0
        if self._in_flight_cur > 0:
            info.task = self._cur_task
            info.last_sent = self._cur_last_sent
            info.done = self._cur_done
            found = 1
        elif self._head != self._tail:
            r = &self._ring[self._head & self._mask]
            info.task = r.task
            if self._cur_valid and r.task == self._cur_task:
                info.last_sent = self._cur_last_sent
                info.done = self._cur_done
            else:
                info.last_sent = -1
                info.done = r.next
            found = 1
        if found:
            info.dropped = self._queued
        # O(1): forget every queued range; in-flight launches move to an old epoch.
        self._head = self._tail
        self._queued = 0
        self._epoch += 1
        self._in_flight_cur = 0
        self._cur_valid = False
        self._cur_task = -1
        self._cur_last_sent = -1
        self._cur_done = 0
        self._n_resets += 1
        return found

    # -- locked, GIL-free cdef API ---------------------------------------------------
    cdef int push_c(self, int64_t task, int32_t first, int32_t last) noexcept nogil:
        cdef int rc
        PyThread_acquire_lock(self._lock, WAIT_LOCK)
        rc = self._push_locked(task, first, last)
        PyThread_release_lock(self._lock)
        return rc

    cdef int transmit_c(self, int64_t* task, int32_t* kernel) noexcept nogil:
        cdef int rc
        PyThread_acquire_lock(self._lock, WAIT_LOCK)
        rc = self._transmit_locked(task, kernel)
        PyThread_release_lock(self._lock)
        return rc

    cdef int complete_c(self, int64_t* task, int32_t* kernel) noexcept nogil:
        cdef int rc
        PyThread_acquire_lock(self._lock, WAIT_LOCK)
        rc = self._complete_locked(task, kernel)
        PyThread_release_lock(self._lock)
        return rc

    cdef int reset_c(self, ResetInfo* info) noexcept nogil:
        cdef int rc
        PyThread_acquire_lock(self._lock, WAIT_LOCK)
        rc = self._reset_locked(info)
        PyThread_release_lock(self._lock)
        return rc

    # -- Python API ------------------------------------------------------------------
    cpdef push(self, int64_t task, int32_t first, int32_t last):
        """Queue launches of kernels ``first..last`` (inclusive) of ``task``: O(1)."""
        cdef int rc
        _lock_gil(self._lock)
        rc = self._push_locked(task, first, last)
        PyThread_release_lock(self._lock)
        if rc == -2:
            raise ValueError(f"bad kernel range {first}..{last} (need 0 <= first <= last)")
        if rc == -1:
            raise MemoryError()

    def transmit(self):
        """Pop the next launch if fewer than ``c`` are in flight: ``(task, kernel)`` or None."""
        cdef int64_t t
        cdef int32_t k
        cdef int rc
        _lock_gil(self._lock)
        rc = self._transmit_locked(&t, &k)
        PyThread_release_lock(self._lock)
        if rc:
            return (t, k)
        return None

    cpdef Py_ssize_t transmit_into(self, dq) except -1:
        """``transmit`` until nothing more may go, appending each ``(task, kernel)`` to
        ``dq`` (anything with ``append``, in transmission order); returns how many. One
        call instead of a Python loop of ``transmit`` calls: what a CPU lane does after
        every enqueue and completion. The lock is not held while ``dq.append`` runs."""
        cdef int64_t t
        cdef int32_t k
        cdef int rc
        cdef Py_ssize_t n = 0
        while True:
            _lock_gil(self._lock)
            rc = self._transmit_locked(&t, &k)
            PyThread_release_lock(self._lock)
            if not rc:
                return n
            # a method call, not ``put = dq.append`` up front: no bound method made, and
            # no lookup at all when nothing goes (most calls, after a completion)
            dq.append((t, k))
            n += 1

    cpdef tuple complete(self):
        """The oldest in-flight launch finished (streams complete in order): its (task, kernel)."""
        cdef int64_t t
        cdef int32_t k
        cdef int rc
        _lock_gil(self._lock)
        rc = self._complete_locked(&t, &k)
        PyThread_release_lock(self._lock)
        if not rc:
            raise RuntimeError("complete() with no launch in flight")
        return (t, k)

    cpdef reset(self):
        """Drop every queued launch in O(1).

        Returns ``(task, last_sent, done, dropped)`` for the task being transmitted (the head
        task with ``last_sent = -1`` if none of it was sent since the last reset), or None if
        nothing was queued and nothing was sent since the last reset is still in flight.
        """
        cdef ResetInfo info
        cdef int rc
        _lock_gil(self._lock)
        rc = self._reset_locked(&info)
        PyThread_release_lock(self._lock)
        if rc:
            return (info.task, info.last_sent, info.done, info.dropped)
        return None

    def inflight(self):
        """The in-flight launches, oldest first, as (task, kernel) (diagnostics)."""
        cdef int32_t i
        cdef InFlight f
        out = []
        _lock_gil(self._lock)
        try:
            for i in range(self._in_flight):
                f = self._fl[(self._fl_head + <uint32_t>i) & (VHQ_MAX_C - 1)]
                out.append((f.task, f.kernel))
        finally:
            PyThread_release_lock(self._lock)
        return out

    def _drain_nogil(self, Py_ssize_t max_launches):
        """Transmit and complete up to ``max_launches`` launches through the GIL-free
        ``transmit_c``/``complete_c`` path (a synchronous dispatcher; tests, benchmarks).
        Returns the transmitted (task, kernel) pairs in order."""
        cdef int64_t* ts = <int64_t*>PyMem_RawMalloc((max_launches + 1) * sizeof(int64_t))
        cdef int32_t* ks = <int32_t*>PyMem_RawMalloc((max_launches + 1) * sizeof(int32_t))
        cdef Py_ssize_t n = 0, i
        cdef int64_t t
        cdef int32_t k
        if ts == NULL or ks == NULL:
            PyMem_RawFree(ts)
            PyMem_RawFree(ks)
            raise MemoryError()
        with nogil:
            while n < max_launches:
                if self.transmit_c(&ts[n], &ks[n]):
                    n += 1
                elif not self.complete_c(&t, &k):
                    break
            while self.complete_c(&t, &k):
                pass
        out = [(ts[i], ks[i]) for i in range(n)]
        PyMem_RawFree(ts)
        PyMem_RawFree(ks)
        return out

    @property
    def c(self):
        """Device-queue capacity: at most c launches in flight (1..VHQ_MAX_C=4096, settable any time)."""
        return self._c

    @c.setter
    def c(self, int value):
        if value < 1 or value > VHQ_MAX_C:
            raise ValueError(f"c must be in 1..{VHQ_MAX_C}, got {value}")
        _lock_gil(self._lock)
        self._c = value
        PyThread_release_lock(self._lock)

    @property
    def in_flight(self):
        return self._in_flight

    @property
    def queued(self):
        """Untransmitted launches (O(1))."""
        return self._queued

    @property
    def ranges(self):
        """Range records in the ring (diagnostics)."""
        return self._tail - self._head

    @property
    def capacity(self):
        """Range records the ring holds before it grows (a power of 2)."""
        return self._mask + 1

    @property
    def empty(self):
        """True when nothing is queued and nothing is in flight."""
        return self._queued == 0 and self._in_flight == 0

    @property
    def current(self):
        """(task, last_sent, done) of the task transmitted in this epoch, or None."""
        if not self._cur_valid:
            return None
        return (self._cur_task, self._cur_last_sent, self._cur_done)

    @property
    def stats(self):
        return {"transmitted": self._n_transmitted, "completed": self._n_completed,
                "resets": self._n_resets}

    def __repr__(self):
        return (f"VHQ(c={self._c}, queued={self._queued}, in_flight={self._in_flight}, "
                f"ranges={self._tail - self._head})")
