# cython: language_level=3
"""C types for ``driver.py`` (Cython's pure-Python mode, as scheduler.pxd for the
scheduler; the list of compiled modules: av_infer/_cy/compiled.py).

What the types buy (docs/bench.md, "Simulator speed"): every event, and in the simulator
every kernel completion, passes through ``Driver.post``/``Driver.complete``. Compiled,
they are C functions; ``sched`` is the compiled ``Scheduler``, so ``next_timer`` and
``stopped`` are read as a C call and a struct member. ``complete`` is the device's
completion entry (``Device.start(driver.complete)``).

``__dict__``: a ``Driver`` keeps an instance dictionary as the Python class it was, so
an instance's methods can still be replaced (tests stop its timer that way); the fields
below are ``public``: Python code reads and writes the same names.
``RequestFuture`` stays a Python class (it derives from ``concurrent.futures.Future``),
compiled as it is.
"""

cimport cython

from av_infer._cy.fastlock cimport FastLock, thread_ident
from av_infer.devices.cpu_lanes cimport LaneEngine
from av_infer.sched.request cimport Request
from av_infer.sched.scheduler cimport Scheduler


cdef FastLock _COND_LOCK


cdef class Driver:
    cdef dict __dict__
    cdef public Scheduler sched
    cdef public object device
    cdef public double _armed
    cdef public object _tcv
    cdef public object _t_thread
    cdef public bint inline_callbacks
    cdef public object on_stop
    cdef public object stopped
    cdef public object _pending
    cdef public FastLock _lock
    cdef public unsigned long _holder
    cdef public object _cbq
    cdef public object _cb_thread
    cdef public object _cb_lock
    cdef public bint _cb_closed
    cdef public long long callback_errors

    cpdef post(self, tuple event)
    cpdef complete(self, comp)
    @cython.locals(lock=FastLock)
    cdef _drain(self, first, comp)


@cython.final
@cython.freelist(8)
cdef class _Resolved:
    cdef object fut


@cython.locals(s=int, port=LaneEngine)
cdef _help_run(fut, Driver driver, Request req)
