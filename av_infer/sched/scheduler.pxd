# cython: language_level=3
"""C types for ``scheduler.py`` (Cython's pure-Python mode: the ``.py`` stays the one
readable source, runs interpreted where it is not compiled, and is compiled with these
declarations by ``setup.py``).

What the types buy: ``Task`` and ``StreamState`` are ``cdef class``es with C fields, the
scheduler's decision routines are ``cdef`` methods called as C functions, and their
``Task``/``StreamState`` locals read fields as struct members instead of through the
interpreter (docs/request_path.md, "The compiled core"); the same for ``Task.req``, a
``Request``, and its ``Timings`` (request.pxd, cimported), and for the devices'
``Completion`` records (devices/completion.pxd, cimported). ``ModelEntry`` is a ``cdef
class`` too (the entry's ``refs``/``handle``/``n_kernels``/... read per request as C
fields); the live ``Policy`` and the ``Stats`` are typed (policies.pxd, stats.pxd,
cimported): the decisions read the policy's flags, and the request path writes the
statistics, as C fields of their one owner. Every name Python code reads
(tests, ``ModelServices``, the engine, the listeners' payloads) keeps its name: fields are
``public``; entry points stay ``def``/``cpdef``. ``nonecheck`` is on (scheduler.py's first
line): a ``None`` where a task or stream is expected raises instead of crashing.
"""

cimport cython

from av_infer._cy.fastlock cimport FastLock
from av_infer.devices.completion cimport Completion
from av_infer.devices.cpu_lanes cimport LaneEngine
from av_infer.sched.policies cimport Policy
from av_infer.sched.request cimport Request, Timings
from av_infer.sched.stats cimport ClientStats, Stats

cdef int QUEUED, RUNNING, PAUSED, PREEMPTED, ABORTING, DONE
cdef double _INF, _NINF, _BE_WINDOW
cdef tuple _PRIO
cdef dict _KERNEL_KEYS


@cython.final
cdef class ModelEntry:
    cdef dict __dict__
    cdef public object name
    cdef public object plan
    cdef public object handle
    cdef public bint pinned
    cdef public int refs
    cdef public bint unloading
    cdef public object profile
    cdef public object variants
    cdef public object _dkp
    cdef public int n_kernels
    cdef public object _input_spec


@cython.final
cdef class Task:
    cdef public Request req
    cdef public ModelEntry entry
    cdef public int n
    cdef public int state
    cdef public int stream
    cdef public bint allocated
    cdef public bint answered
    cdef public int done
    cdef public int outstanding
    cdef public int resume_from
    cdef public int enq_from
    cdef public object reset_done
    cdef public int pad_k
    cdef public int pad_b
    cdef public dict pad_blocks
    cdef public set pad_full
    cdef public int pad_in_flight
    cdef public object qh
    cdef public object members
    cdef public Task batch
    cdef public object tid
    cdef public bint rt


@cython.final
cdef class StreamState:
    cdef public int id
    cdef public str kind
    cdef readonly bint is_be
    cdef public Task owner
    cdef public int outstanding
    cdef public bint flagged
    cdef public object stop_from
    cdef public double stop_from_received


@cython.final
cdef class Scheduler:
    cdef public object device
    # the cpu device's lane engine when its request-path methods are the engine's own
    # (``CpuDevice.lane_engine``): called as C methods; None for every other device
    cdef readonly LaneEngine _port
    # the live policy (``policy``, a read-only property; ``set_policy`` its one writer),
    # typed: the decisions read its fields as C fields, no copies
    cdef Policy _policy
    cdef public int c
    cdef public bint edf_preempt
    cdef public bint preempt_drain
    cdef readonly Stats stats
    cdef tuple _listeners
    cdef readonly tuple _kernel_listeners
    cdef dict _routes
    cdef public object rt_queue
    cdef public object be_queues
    cdef public dict tasks
    cdef public set rt_active
    cdef public Task rt_fed
    cdef public bint closing
    cdef public bint stopped
    cdef public object max_queue_depth
    cdef public list _late
    cdef public double be_min_share
    cdef public bint _be_wait
    cdef public double _be_seen
    cdef public double _grant_until
    cdef public list _answers
    cdef public bint _busy
    cdef public object ext
    cdef public StreamState rt_hi
    cdef public StreamState rt_plain
    cdef public list be_streams
    cdef public list rt_par
    cdef public dict streams
    cdef public int sms
    cdef public object _dkp
    cdef public set _dkp_off
    cdef public long long coalesced_applied
    cdef public long long coalesced_split

    cpdef post(self, tuple event)
    cpdef complete(self, Completion comp)
    cdef _enter(self, tuple event, Completion comp)
    cdef _handle(self, tuple ev)
    cpdef bint idle(self)
    cdef _handler_failed(self, tuple ev, exc)
    @cython.locals(t=Task)
    cdef Task _queued_task(self, tid)
    cdef _evict(self, Task t, err)
    @cython.locals(t=Task, due=double)
    cpdef double next_timer(self)
    @cython.locals(s=StreamState)
    cdef bint _be_waiting(self)
    @cython.locals(now=double, share=double)
    cdef bint _be_granted(self)
    @cython.locals(t=Task, b=Task, cs=ClientStats)
    cdef _expire_late(self)
    @cython.locals(req=Request)
    cdef _miss_error(self, Task t, now, deadline, str where)
    @cython.locals(req=Request, cs=ClientStats)
    cdef _miss(self, Task t, now, deadline=*, str where=*)
    cdef _queue(self, Task t, bint front=*)
    cdef tuple _route(self, str kind)
    cdef _emit(self, str kind, dict payload)
    @cython.locals(task=Task, cs=ClientStats, lock=FastLock)
    cpdef on_arrival(self, Request req, ModelEntry entry)
    @cython.locals(s=StreamState, task=Task, k0=int, i=int, be=bint, tm=Timings)
    cpdef on_complete(self, Completion comp)
    @cython.locals(s=StreamState, task=Task, n=int, k0=int, done=int, i=int)
    cdef bint _coalescible(self, Completion comp) except -1
    @cython.locals(s=StreamState)
    cdef _apply_capacity(self, int c, Policy policy)
    cdef _schedule(self, bint settled=*)
    cdef int _rt_width(self)
    @cython.locals(s=StreamState, t=Task)
    cdef StreamState _rt_stream_for(self, Task task)
    @cython.locals(s=StreamState)
    cdef int _be_running_count(self)
    cdef bint _be_running(self)
    @cython.locals(s=StreamState)
    cdef bint _be_in_flight(self)
    @cython.locals(s=StreamState)
    cdef bint _be_owned(self)
    @cython.locals(cur=Task, width=int)
    cdef bint _rt_idle(self)
    @cython.locals(cur=Task, task=Task, width=int)
    cdef _schedule_rt(self)
    @cython.locals(s=StreamState, resume=int)
    cdef _rt_switch(self, Task cur)
    cdef _account_dropped(self, Task task, StreamState s, info)
    @cython.locals(s=StreamState, t=Task, keep=int, mine=bint, head=Task, tm=Timings)
    cdef _preempt_be(self)
    cdef int _be_room_beside_rt(self, int rt_tasks)
    @cython.locals(s=StreamState, t=Task, rt_mode=bint)
    cdef _schedule_be(self, bint granted=*)
    @cython.locals(rp=int)
    cdef _restore(self, Task t, StreamState s)
    @cython.locals(first=int, req=Request, port=LaneEngine)
    cdef bint _start(self, Task t, StreamState s) except -1
    @cython.locals(req=Request)
    cdef _enqueue(self, Task t, StreamState s, int first, bint wake=*)
    cdef _enqueue_from(self, Task t, StreamState s, int first, bint wake)
    cdef _count(self, Task t, StreamState s, int n)
    cdef _flag(self, StreamState s, bint flag)
    @cython.locals(port=LaneEngine)
    cdef _launch(self, Task t, StreamState s, int first, int last, bint wake=*)
    @cython.locals(bt=Task, k=int, run_from=int)
    cdef _enqueue_padded(self, Task t, StreamState s, int first)
    @cython.locals(t=Task, bs=StreamState, slot=int)
    cdef dict _dkp_refresh(self)
    cdef bint _dkp_offer(self, Task t, int slot, list nums) except -1
    @cython.locals(bt=Task)
    cdef _dkp_credit(self, comp)
    @cython.locals(bt=Task)
    cdef _dkp_forget(self, dropped)
    @cython.locals(t=Task)
    cdef Task _task_of(self, StreamState s, tid)
    @cython.locals(s=StreamState)
    cdef _detach(self, Task t)
    @cython.locals(s=StreamState, port=LaneEngine)
    cdef _release(self, Task t)
    @cython.locals(req=Request, port=LaneEngine)
    cdef _finish(self, Task t, double t_end)
    @cython.locals(s=StreamState)
    cpdef _abort(self, Task t, err)
    @cython.locals(m=Task, req=Request, tm=Timings, cs=ClientStats, lock=FastLock)
    cdef _answer(self, Task t, result)
    @cython.locals(m=Task, req=Request, cs=ClientStats)
    cdef _fail(self, Task t, err)
    cdef _unref(self, ModelEntry entry)
    cdef _unload(self, ModelEntry entry)
    cdef _flush_answers(self)


@cython.locals(p=dict)
cdef dict _kernel_payload(int stream, task, int kernel, executed, double t_start,
                          double t_end, double t_stop)
cdef bint _past_hard_deadline(Task t, double now) except -1
