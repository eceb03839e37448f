# cython: language_level=3
"""A mutex whose acquire and release are C calls from compiled code.

Why: a request takes ~12 Python locks on its way (docs/request_path.md); from compiled
code each ``with lock:`` looks up ``__enter__``/``__exit__`` and calls them (~900
instructions a block), each ``lock.acquire()`` goes through a method call whose argument
parsing (``PyArg_ParseTupleAndKeywords``) alone costs ~150. ``FastLock`` is the same
CPython lock (``PyThread_type_lock``) behind ``cpdef`` methods: a module that types the
field as ``FastLock`` (cimporting ``fastlock.pxd``) calls ``acquire``/``release`` as C
functions; Python code uses it as it uses ``threading.Lock`` (``with``, ``acquire``,
``release``, ``locked``).

Guarantees: mutual exclusion as ``threading.Lock`` (not reentrant; any thread may release);
a blocking acquire that cannot take the lock at once waits with the GIL released, so the
holder can run; ``release`` of an unlocked lock raises RuntimeError, as ``threading.Lock``
does. Unlike ``threading.Lock``, a blocking acquire is not interrupted by signals
(``KeyboardInterrupt`` is raised once the lock is taken): hold it only for short sections.
"""

from cpython.pythread cimport (
    PY_LOCK_ACQUIRED,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_get_thread_ident,
    PyThread_release_lock,
    PyThread_type_lock,
)


cpdef unsigned long thread_ident() noexcept:
    """This thread's identifier, the value ``threading.get_ident()`` returns; a C call from
    a compiled module that cimports it (the driver reads it twice a completion: ~180
    instructions each as a Python call)."""
    return PyThread_get_thread_ident()


cdef extern from "pythread.h":
    # CPython's own timed acquire (what threading.Lock.acquire calls): microseconds, -1
    # forever; intr_flag 0: not interrupted by signals
    int PyThread_acquire_lock_timed(PyThread_type_lock, long long, int) nogil
    long long PY_TIMEOUT_MAX


cdef class FastLock:

    def __cinit__(self):
        self._lock = PyThread_allocate_lock()
        if self._lock == NULL:
            raise MemoryError("cannot allocate a lock")
        self._locked = False

    def __dealloc__(self):
        if self._lock != NULL:
            if self._locked:
                PyThread_release_lock(self._lock)
            PyThread_free_lock(self._lock)
            self._lock = NULL

    cpdef bint acquire(self, bint blocking=True, double timeout=-1):
        """Take the lock; ``blocking`` False: only if free now; ``timeout`` seconds (-1:
        none) for a blocking acquire. True if taken."""
        cdef long long us = -1
        cdef int r
        if timeout != -1:  # checked as threading.Lock checks it, taken or not
            if not blocking:
                raise ValueError("can't specify a timeout for a non-blocking call")
            if timeout < 0:
                raise ValueError("timeout value must be a non-negative number")
            if timeout * 1e6 >= PY_TIMEOUT_MAX:
                raise OverflowError("timeout value is too large")
            us = <long long>(timeout * 1e6)
        r = PyThread_acquire_lock_timed(self._lock, 0, 0)
        if r != PY_LOCK_ACQUIRED:
            if not blocking:
                return False
            with nogil:
                r = PyThread_acquire_lock_timed(self._lock, us, 0)
            if r != PY_LOCK_ACQUIRED:
                return False
        self._locked = True
        return True

    cpdef release(self):
        """Give the lock back (RuntimeError if it is not held)."""
        if not self._locked:
            raise RuntimeError("release unlocked lock")
        self._locked = False
        PyThread_release_lock(self._lock)

    cpdef bint release_if_locked(self):
        """Release if held (True), else nothing (False): setting a binary event made of a
        lock ("released = signalled"), idempotent, without raising and catching."""
        if not self._locked:
            return False
        self._locked = False
        PyThread_release_lock(self._lock)
        return True

    def locked(self) -> bool:
        return self._locked

    def __enter__(self):
        self.acquire()
        return True

    def __exit__(self, *exc):
        self.release()
        return False

    def __repr__(self):
        return f"<av_infer FastLock {'locked' if self._locked else 'unlocked'}>"
