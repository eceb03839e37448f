# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""EDF ready queue: a typed binary min-heap keyed by (deadline, insertion seq).

Entries are C structs (double deadline, uint64 seq, slot); the items themselves live in a
Python list indexed by slot, so comparisons never touch Python objects. Ties on the deadline
pop in FIFO order; ``+inf`` (no deadline) sorts after every finite deadline, FIFO among
themselves. NaN deadlines are rejected.

``push`` returns an opaque int handle ``(generation << 32) | slot``; ``remove(handle)`` is
lazy: the entry is marked stale and dropped when it reaches the top (or when stale entries
outnumber live ones, in one O(n) compaction). A handle is valid until its item leaves the
heap; after that ``remove`` returns False, also once the slot has been reused.
"""
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.math cimport isnan
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport qsort

cdef enum:
    SLOT_FREE = 0
    SLOT_LIVE = 1
    SLOT_STALE = 2
    MIN_CAP = 16
    COMPACT_MIN = 64

cdef uint64_t SLOT_MASK = 0xFFFFFFFFULL


cdef inline bint _lt(const HeapEntry* a, const HeapEntry* b) noexcept nogil:
    return a.key < b.key or (a.key == b.key and a.seq < b.seq)


cdef int _cmp_entries(const void* pa, const void* pb) noexcept nogil:
    cdef const HeapEntry* a = <const HeapEntry*>pa
    cdef const HeapEntry* b = <const HeapEntry*>pb
    if _lt(a, b):
        return -1
    if _lt(b, a):
        return 1
    return 0


cdef class EdfHeap:
    """Min-heap of (deadline, item) in EDF order, FIFO on equal deadlines."""

    def __cinit__(self, Py_ssize_t capacity=MIN_CAP):
        if capacity < MIN_CAP:
            capacity = MIN_CAP
        self._heap = NULL
        self._state = NULL
        self._gen = NULL
        self._free = NULL
        self._n = 0
        self._cap = 0
        self._nfree = 0
        self._live = 0
        self._seq = 0
        self._objs = []
        self._grow(capacity)

    def __dealloc__(self):
        PyMem_Free(self._heap)
        PyMem_Free(self._state)
        PyMem_Free(self._gen)
        PyMem_Free(self._free)

    cdef int _grow(self, Py_ssize_t new_cap) except -1:
        cdef Py_ssize_t i, old = self._cap
        cdef void* p
        p = PyMem_Realloc(self._heap, new_cap * sizeof(HeapEntry))
        if p == NULL:
            raise MemoryError()
        self._heap = <HeapEntry*>p
        p = PyMem_Realloc(self._state, new_cap * sizeof(unsigned char))
        if p == NULL:
            raise MemoryError()
        self._state = <unsigned char*>p
        p = PyMem_Realloc(self._gen, new_cap * sizeof(uint32_t))
        if p == NULL:
            raise MemoryError()
        self._gen = <uint32_t*>p
        p = PyMem_Realloc(self._free, new_cap * sizeof(Py_ssize_t))
        if p == NULL:
            raise MemoryError()
        self._free = <Py_ssize_t*>p
        self._objs.extend([None] * (new_cap - old))
        # New slots go on the free stack, lowest index on top.
        for i in range(new_cap - 1, old - 1, -1):
            self._state[i] = SLOT_FREE
            self._gen[i] = 1
            self._free[self._nfree] = i
            self._nfree += 1
        self._cap = new_cap
        return 0

    # -- heap primitives -------------------------------------------------------------
    cdef void _sift_up(self, Py_ssize_t pos, HeapEntry e) noexcept:
        cdef Py_ssize_t parent
        cdef HeapEntry* h = self._heap
        while pos > 0:
            parent = (pos - 1) >> 1
            if _lt(&e, &h[parent]):
                h[pos] = h[parent]
                pos = parent
            else:
                break
        h[pos] = e

    cdef void _sift_down(self, Py_ssize_t pos, HeapEntry e) noexcept:
        cdef Py_ssize_t child, n = self._n
        cdef HeapEntry* h = self._heap
        while True:
            child = 2 * pos + 1
            if child >= n:
                break
            if child + 1 < n and _lt(&h[child + 1], &h[child]):
                child += 1
            if _lt(&h[child], &e):
                h[pos] = h[child]
                pos = child
            else:
                break
        h[pos] = e

    cdef void _remove_top(self) noexcept:
        self._n -= 1
        if self._n > 0:
            self._sift_down(0, self._heap[self._n])

    cdef void _release_slot(self, Py_ssize_t slot) noexcept:
        # The caller has already taken (or dropped) the item; the list keeps None.
        self._state[slot] = SLOT_FREE
        self._gen[slot] += 1
        if self._gen[slot] == 0:
            self._gen[slot] = 1
        self._free[self._nfree] = slot
        self._nfree += 1

    cdef void _drop_stale_top(self) noexcept:
        cdef Py_ssize_t slot
        while self._n > 0:
            slot = self._heap[0].slot
            if self._state[slot] == SLOT_LIVE:
                return
            self._remove_top()
            self._release_slot(slot)

    cdef void _compact(self) noexcept:
        """Drop every stale entry and re-heapify (O(n))."""
        cdef Py_ssize_t i, j = 0, slot
        for i in range(self._n):
            slot = self._heap[i].slot
            if self._state[slot] == SLOT_LIVE:
                self._heap[j] = self._heap[i]
                j += 1
            else:
                self._release_slot(slot)
        self._n = j
        i = (j >> 1) - 1
        while i >= 0:
            self._sift_down(i, self._heap[i])
            i -= 1

    # -- cdef API --------------------------------------------------------------------
    cdef uint64_t push_c(self, double deadline, object item) except 0:
        cdef Py_ssize_t slot
        cdef HeapEntry e
        if isnan(deadline):
            raise ValueError("deadline must not be NaN (use inf for no deadline)")
        if self._nfree == 0:
            self._grow(self._cap * 2)
        self._nfree -= 1
        slot = self._free[self._nfree]
        self._objs[slot] = item
        self._state[slot] = SLOT_LIVE
        e.key = deadline
        e.seq = self._seq
        e.slot = slot
        self._seq += 1
        self._n += 1
        self._sift_up(self._n - 1, e)
        self._live += 1
        return ((<uint64_t>self._gen[slot]) << 32) | <uint64_t>slot

    cdef object pop_c(self, double* deadline):
        cdef Py_ssize_t slot
        self._drop_stale_top()
        if self._n == 0:
            raise IndexError("pop from an empty EdfHeap")
        slot = self._heap[0].slot
        deadline[0] = self._heap[0].key
        item = self._objs[slot]
        self._remove_top()
        self._release_slot(slot)
        self._live -= 1
        self._objs[slot] = None     # item still referenced here: no finalizer runs
        return item

    cdef bint peek_deadline_c(self, double* deadline) except -1:
        self._drop_stale_top()
        if self._n == 0:
            return False
        deadline[0] = self._heap[0].key
        return True

    cdef bint remove_c(self, uint64_t handle) except -1:
        cdef Py_ssize_t slot = <Py_ssize_t>(handle & SLOT_MASK)
        cdef uint32_t gen = <uint32_t>(handle >> 32)
        if slot >= self._cap or self._state[slot] != SLOT_LIVE or self._gen[slot] != gen:
            return False
        self._state[slot] = SLOT_STALE
        self._live -= 1
        old = self._objs[slot]
        self._objs[slot] = None
        if self._n - self._live > COMPACT_MIN and self._n - self._live > self._live:
            self._compact()
        del old                     # finalizers (if any) run with the heap consistent
        return True

    # -- Python API ------------------------------------------------------------------
    def push(self, double deadline, item):
        """Insert ``item`` with absolute ``deadline`` (inf = none); return its handle."""
        return self.push_c(deadline, item)

    def pop(self):
        """Remove and return ``(deadline, item)`` with the earliest deadline (IndexError if empty)."""
        cdef double d
        item = self.pop_c(&d)
        return (d, item)

    def peek(self):
        """Return ``(deadline, item)`` with the earliest deadline without removing it."""
        self._drop_stale_top()
        if self._n == 0:
            raise IndexError("peek at an empty EdfHeap")
        return (self._heap[0].key, self._objs[self._heap[0].slot])

    def remove(self, handle):
        """Lazily remove the item pushed with ``handle``; False if it is no longer queued."""
        if not isinstance(handle, int) or handle < 1 or handle > 0xFFFFFFFFFFFFFFFF:
            return False
        return self.remove_c(<uint64_t>handle)

    cdef list _sorted_live(self):
        cdef Py_ssize_t i, m = 0
        cdef HeapEntry* tmp = <HeapEntry*>PyMem_Malloc((self._n + 1) * sizeof(HeapEntry))
        if tmp == NULL:
            raise MemoryError()
        try:
            for i in range(self._n):
                if self._state[self._heap[i].slot] == SLOT_LIVE:
                    tmp[m] = self._heap[i]
                    m += 1
            qsort(tmp, m, sizeof(HeapEntry), _cmp_entries)
            out = [None] * m
            for i in range(m):
                out[i] = (tmp[i].key, self._objs[tmp[i].slot])
            return out
        finally:
            PyMem_Free(tmp)

    def items(self):
        """Live ``(deadline, item)`` pairs in EDF order (a copy, for diagnostics)."""
        return self._sorted_live()

    def clear(self):
        """Remove everything; return the live items in EDF order (e.g. to fail them)."""
        cdef Py_ssize_t i
        pairs = self._sorted_live()
        for i in range(self._n):
            self._release_slot(self._heap[i].slot)
        self._n = 0
        self._live = 0
        old = self._objs
        self._objs = [None] * self._cap
        del old
        return [p[1] for p in pairs]

    def __len__(self):
        return self._live

    def __bool__(self):
        return self._live > 0

    def __repr__(self):
        return f"EdfHeap(live={self._live}, entries={self._n}, capacity={self._cap})"


cdef class RtQueue:
    """The scheduler's RT ready queue (``sched.queues``): an ``EdfHeap`` of items, EDF
    order, FIFO on ties. In C because the scheduler asks its length or truth several times
    per decision and pushes/pops once per RT request: here none of that runs a Python frame.
    Differs from ``EdfHeap`` in returning items, not ``(deadline, item)`` pairs, from
    ``pop``, ``clear`` and ``items``; ``peek`` gives ``(deadline, item)`` or None."""

    cdef EdfHeap _h

    def __cinit__(self):
        self._h = EdfHeap()

    def push(self, double deadline, item):
        """Insert ``item`` with absolute ``deadline`` (inf = none); return its handle."""
        return self._h.push_c(deadline, item)

    def pop(self):
        """Remove and return the most urgent item (IndexError if empty)."""
        cdef double d
        return self._h.pop_c(&d)

    def peek(self):
        """(deadline, item) of the most urgent item, or None when empty."""
        if self._h._live == 0:
            return None
        return self._h.peek()

    def remove(self, handle):
        """Lazily remove the item pushed with ``handle``; False if no longer queued."""
        return self._h.remove(handle)

    def clear(self):
        """Remove and return every item in EDF order (to fail them)."""
        return self._h.clear()

    def items(self):
        """The queued items in EDF order (a copy)."""
        return [p[1] for p in self._h._sorted_live()]

    def __len__(self):
        return self._h._live

    def __bool__(self):
        return self._h._live > 0
