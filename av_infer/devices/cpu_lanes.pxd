# cython: language_level=3
"""C types for ``cpu_lanes.py`` (Cython's pure-Python mode, as sched/scheduler.pxd; the
list of compiled modules: av_infer/_cy/compiled.py).

What the types buy (docs/request_path.md, "The lane, typed"): the records a request's
launches read (lane, task, arena, model) are ``cdef class``es whose fields are struct
members; ``LaneEngine`` is final, its hot methods ``cpdef`` (a C call from Python, no
frame) and the drain loop a ``cdef`` method with typed locals. Every field is ``public``:
``CpuDevice``, telemetry and tests read and write the same names.
"""

cimport cython

from av_infer._cy.fastlock cimport FastLock
from av_infer._cy.ndcheck cimport copy_into, exact_array, fresh_copy
from av_infer._cy.vhq cimport VHQ


@cython.final
cdef class _Model:
    cdef public object plan
    cdef public object runner
    cdef public object weight_bytes
    cdef public bint killable
    cdef public list est_s
    cdef public list pool
    cdef public bint nice_in_run


@cython.final
cdef class _Bound:
    cdef public object arena
    cdef public list fns
    cdef public dict inputs
    cdef public dict outputs
    cdef public object binds
    cdef public object zero_in
    cdef public object zero_out
    cdef public dict held


@cython.final
cdef class _Task:
    cdef public _Model model
    cdef public _Bound bound
    cdef public object error
    cdef public int error_kernel


@cython.final
cdef class _Lane:
    cdef public int id
    cdef public int priority
    cdef public VHQ vhq
    cdef public FastLock lock
    cdef public object dq
    cdef public FastLock token
    cdef public FastLock wake
    cdef public bint flag
    cdef public object capacity
    cdef public object thread
    cdef public object running
    cdef public object ro_spare
    cdef public bint ro_killed
    cdef public double run_t0
    cdef public double run_est
    cdef public bint busy
    cdef public long long run_clk
    cdef public long long run_tid
    cdef public object flag_mark
    cdef public long long executed
    cdef public long long evicted
    cdef public long long killed
    cdef public object nice
    cdef public object run_nice
    cdef public bint niced
    cdef public bint armed
    cdef public long long kill_lowered
    cdef public long long parked
    cdef public object prio_desc
    cdef public bint helpable
    cdef public object hand
    cdef public long long restarts


@cython.final
cdef class LaneEngine:
    cdef public dict tasks
    cdef public list lanes
    cdef public object on_complete
    cdef public bint stopping
    cdef public object faults
    cdef public bint kill
    cdef public double kill_below_s
    cdef public FastLock lock
    cdef public object kill_latency
    cdef public object make_bound

    cpdef new_task(self, _Model handle, task)
    @cython.locals(t=_Task)
    cpdef release_task(self, task)
    @cython.locals(t=_Task, b=_Bound, exact=bint)
    cpdef write_inputs(self, task, inputs)
    @cython.locals(t=_Task, out=dict)
    cpdef dict read_outputs(self, task)
    @cython.locals(lane=_Lane)
    cpdef enqueue(self, Py_ssize_t stream, task, first, last, bint wake=*)
    @cython.locals(lane=_Lane)
    cpdef reset(self, Py_ssize_t stream)
    @cython.locals(lane=_Lane, now=cython.double)
    cpdef set_preempt(self, Py_ssize_t stream, flag)
    cpdef bint worth_killing(self, double est, double elapsed=*)
    @cython.locals(lane=_Lane, ran=bint)
    cpdef bint run_pending(self, Py_ssize_t stream, until) except -1
    @cython.locals(wake=FastLock, token=FastLock)
    cpdef lane_loop(self, _Lane lane)
    @cython.locals(rec=_Task)
    cpdef fail_hand(self, _Lane lane, err)
    @cython.locals(rec=_Task, tasks=dict, vhq=VHQ, lock=FastLock, ran=bint, executed=bint, measure=bint,
                   read_own=bint, clk=cython.longlong, tid=cython.longlong, k=cython.int,
                   t0=cython.double, t1=cython.double, cpu0=cython.double)
    cdef bint _drain_loop(self, _Lane lane, until) except -1


cdef bint _terminated(LaneEngine engine, _Lane lane, ro) except -1
cpdef _signal(FastLock ev)
cpdef transmit(_Lane lane, bint wake)
