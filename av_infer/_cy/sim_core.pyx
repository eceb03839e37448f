# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The device model of the simulated GPU (``av_infer.devices.sim``): SMs, streams, block
placement and the event loop, in Cython.

Why Cython: a DISB run at H100 scale places millions of block batches, and every batch
goes through the event heap, the ready list, the placement walk over every SM and the
stream's completion (issue 13: a 60 s DISB-E run must take seconds). ``SimDevice``
(``devices/sim.py``) keeps what is per plan and per request (loading, profiles, outputs,
telemetry) and documents the model; this module is that model, operation for operation
the Python implementation it replaced (the same IEEE doubles in the same order, the same
event sequence numbers), so a run gives bit-identical timelines (``bench.sim_speed``
compares digests against the older ``sim.py``).

Events are ``(t, seq, kind, a, b)`` in a binary heap of C records (``_Ev``: time,
sequence number, kind, payload slot; the payload objects ``a``, ``b`` in two lists, where
the cycle collector sees them); ties run in insertion order (``seq``). The keys
``(t, seq)`` are unique, so events run in the one order the heap of Python tuples this
replaced (``heapq``) gave them, compared without a Python object per event.
The ready list is kept sorted by ``(-priority, t_ready, seq)`` on insertion (the keys
never change and are unique, so this is the order a stable sort before every placement
pass gives).
"""

from collections import deque

from libc.math cimport ceil
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free, malloc, realloc

from av_infer._cy.vhq cimport VHQ

from av_infer.devices.base import ResetInfo
from av_infer.devices.completion import Completion
from av_infer.devices.faults import InjectedFault

#: Resource units of one SM; a block of a kernel with occupancy b costs ``U // b``.
U = 1 << 20
#: A held kernel's expected length is its profiled duration times this, times the
#: contention slowdown the bandwidth held at that moment would give it.
QUIET_MARGIN = 1.25

cdef struct _Ev:
    double t
    long long seq
    int kind
    Py_ssize_t slot  # index into SimCore._pa / _pb (the event's payload)


cdef inline bint _ev_lt(_Ev* x, _Ev* y) noexcept nogil:
    """``(x.t, x.seq) < (y.t, y.seq)`` (the tuple order of the heap it replaced)."""
    return x.t < y.t or (x.t == y.t and x.seq < y.seq)


cdef double _NAN = float("nan")


DEF EV_CALL = 0
DEF EV_ARRIVE = 1
DEF EV_FLAG = 2
DEF EV_QUIET_END = 3
DEF EV_BATCH_END = 4
DEF EV_FINISH = 5


cdef inline double _slowdown(double q, double other):
    """``sim_contention.slowdown``: time factor of a batch with memory share ``q``."""
    cdef double tot = q + other
    return 1.0 - q + q * tot if tot > 1.0 else 1.0


cdef double _curve_at(tuple curve, double press, long long d):
    """``profiles.curve_at`` at an integer density ``d`` (same operations)."""
    cdef Py_ssize_t n = len(curve)
    cdef long long i
    cdef double lo
    if n == 0:
        return <double>d * press
    if d <= 1:
        return 1.0
    if d >= n:
        return <double>curve[n - 1] + <double>(d - n) * press
    i = d
    lo = <double>curve[i - 1]
    return lo + <double>(d - i) * (<double>curve[i] - lo)


cdef class SmPool:
    """Per-SM free units (``units`` each when empty) and pressure of resident blocks."""

    cdef long long* free_
    cdef double* press
    cdef int* ords
    cdef long long* fits
    cdef long long* base
    cdef readonly int n
    cdef readonly long long units
    cdef public long long free_total

    def __cinit__(self, int n, long long units):
        if n < 1 or units < 1:
            raise ValueError("SmPool needs n >= 1 SMs and units >= 1")
        self.free_ = <long long*>malloc(n * sizeof(long long))
        self.press = <double*>malloc(n * sizeof(double))
        self.ords = <int*>malloc(n * sizeof(int))
        self.fits = <long long*>malloc(n * sizeof(long long))
        self.base = <long long*>malloc(n * sizeof(long long))
        if (self.free_ == NULL or self.press == NULL or self.ords == NULL
                or self.fits == NULL or self.base == NULL):
            raise MemoryError()
        self.n = n
        self.units = units
        self.free_total = n * units
        cdef int i
        for i in range(n):
            self.free_[i] = units
            self.press[i] = 0.0

    def __dealloc__(self):
        free(self.free_)
        free(self.press)
        free(self.ords)
        free(self.fits)
        free(self.base)

    cpdef long long max_free(self):
        """The most units free on one SM."""
        cdef long long m = 0
        cdef int i
        for i in range(self.n):
            if self.free_[i] > m:
                m = self.free_[i]
        return m

    def free_of(self, int sm):
        return self.free_[sm]

    def press_of(self, int sm):
        return self.press[sm]

    cdef long long _place(self, long long cost, long long want, object order, double p,
                          _Batch out) except -1:
        """Breadth-first placement (see :meth:`place`) into ``out``; returns the number of
        blocks placed (0: nothing fits)."""
        cdef int n_sm, i, sm, m = 0
        cdef int* ords = self.ords
        cdef long long* fits = self.fits
        cdef long long* base = self.base
        cdef long long n = 0, total = 0, acc, level, rem, b, d = 1
        cdef bint two
        cdef double f_sum = 0.0
        if order is None:
            n_sm = self.n
            for i in range(n_sm):
                ords[i] = i
        else:
            n_sm = len(order)
            for i in range(n_sm):
                ords[i] = order[i]
        for i in range(n_sm):
            base[i] = 0
        if want <= n_sm:  # one block on each of the first `want` SMs with room
            two = False
            for i in range(n_sm):
                sm = ords[i]
                if self.free_[sm] >= cost:
                    base[i] = 1
                    n += 1
                    if self.free_[sm] >= 2 * cost:
                        two = True
                    if n == want:
                        break
            if n < want and two:  # fewer SMs with room than blocks: rounds below
                for i in range(n_sm):
                    base[i] = 0
                n = 0
        if n == 0:
            for i in range(n_sm):  # (no division where no block fits: a full SM)
                rem = self.free_[ords[i]]
                fits[i] = rem // cost if rem >= cost else 0
                total += fits[i]
            if total == 0:
                return 0
            if want >= total:
                for i in range(n_sm):
                    base[i] = fits[i]
                n = total
            else:  # rounds of one block per SM: the lowest level that holds `want`
                n = want
                level = 1
                while True:
                    acc = 0
                    for i in range(n_sm):
                        acc += fits[i] if fits[i] < level else level
                    if acc >= want:
                        break
                    level += 1
                rem = want
                for i in range(n_sm):
                    base[i] = fits[i] if fits[i] < level else level - 1
                    rem -= base[i]
                for i in range(n_sm):
                    if rem == 0:
                        break
                    if fits[i] >= level:
                        base[i] += 1
                        rem -= 1
        out.reserve(n_sm)
        for i in range(n_sm):
            b = base[i]
            if b:
                sm = ords[i]
                out.sms[m] = sm
                out.cnt[m] = b
                m += 1
                self.free_[sm] -= b * cost
                f_sum += self.press[sm] * b
                self.press[sm] += b * p
                if b > d:
                    d = b
        self.free_total -= n * cost
        out.m = m
        out.n = n
        out.d = d
        out.f_sum = f_sum
        return n

    cdef void _release(self, _Batch bt, long long cost, double p) noexcept:
        cdef long long units = 0, b
        cdef int sm, i
        for i in range(bt.m):
            sm = bt.sms[i]
            b = bt.cnt[i]
            self.free_[sm] += b * cost
            self.press[sm] -= b * p
            units += b * cost
        self.free_total += units

    def place(self, long long cost, long long want, object order, double p):
        """Start up to ``want`` blocks of ``cost`` units and pressure ``p`` each, on the SMs
        of ``order`` (None: all, in SM order), breadth-first: one block per SM with room,
        then a second round, and so on (see ``SimDevice``, point 3).

        Returns ``(alloc, n, d, f_sum)``: ``alloc`` the ``(sm, blocks)`` placed, ``n``
        their count, ``d`` the most on one SM, ``f_sum`` the pressure the new blocks found
        (block-weighted); or None when nothing fits.
        """
        cdef _Batch bt = _Batch()
        if self._place(cost, want, order, p, bt) == 0:
            return None
        return bt.alloc(), bt.n, bt.d, bt.f_sum

    def release(self, list alloc, long long cost, double p):
        """The blocks of ``alloc`` (from :meth:`place`, same ``cost`` and ``p``) left."""
        cdef long long units = 0, b
        cdef int sm
        for sm, b in alloc:
            self.free_[sm] += b * cost
            self.press[sm] -= b * p
            units += b * cost
        self.free_total += units


cdef class _Batch:
    """Blocks of one kernel placed together: where (``m`` SMs, ``sms``/``cnt``), how many
    (``n``), the most on one SM (``d``), the pressure they found (``f_sum``); they end
    together."""

    cdef int* sms
    cdef long long* cnt
    cdef int m, cap
    cdef long long n, d
    cdef double f_sum, t0
    cdef _KRun k

    cdef int reserve(self, int cap) except -1:
        if cap > self.cap:
            free(self.sms)
            free(self.cnt)
            self.sms = <int*>malloc(cap * sizeof(int))
            self.cnt = <long long*>malloc(cap * sizeof(long long))
            if self.sms == NULL or self.cnt == NULL:
                self.cap = 0
                raise MemoryError()
            self.cap = cap
        return 0

    cdef list alloc(self):
        return [(self.sms[i], self.cnt[i]) for i in range(self.m)]

    def __dealloc__(self):
        free(self.sms)
        free(self.cnt)


cdef class _Stream:
    cdef readonly int id
    cdef readonly int priority
    cdef readonly VHQ vhq
    #: arrived, not yet started launches: (task, kernel, padding parts)
    cdef readonly object devq
    cdef readonly _KRun cur  # the launch the stream is executing (in order)
    cdef bint flag  # preemption flag as the SMs see it
    cdef long long used  # resource units held by this stream's running blocks
    #: the padding of launches still queued in the vHQ, (task, kernel) -> BE parts, in
    #: queue order: the one place a padded launch's parts live until it is transmitted
    #: (then they travel with the launch: arrival, ``devq``, ``_KRun.done_parts``)
    cdef readonly dict pads
    #: quiet windows ``(start, end)``, sorted (set_quiet); the head launch waits while it
    #: would run into one; ``hold_at``: when the pending release fires
    cdef list quiet
    cdef double hold_at
    cdef double last_arrive  # host model: when its last transmitted launch lands

    def __cinit__(self, int sid, int priority, int c):
        self.id = sid
        self.priority = priority
        self.vhq = VHQ(c)
        self.devq = deque()
        self.cur = None
        self.flag = False
        self.used = 0
        self.pads = {}
        self.quiet = []
        self.hold_at = -1.0
        self.last_arrive = 0.0


cdef class _KRun:
    """One launch on the device, from ready to completion."""

    cdef _Stream stream
    cdef object task
    cdef int kernel
    cdef long long seq
    cdef double t_ready
    cdef long long pending, running, cost, started, first_block
    cdef double block_s, press, g_alone, t_start, evict_until
    cdef tuple curve
    cdef bint evicted
    cdef object order  # SMs it may use, in placement order (None: all)
    cdef list parts  # padding parts still running (padded RT launch)
    cdef _KRun parent  # padding part: the padded launch it belongs to
    cdef object done_parts
    cdef double q  # memory share alone (contention model)
    cdef double bw_unit  # bandwidth share one resident block holds
    cdef double bw_res  # bandwidth share its resident blocks hold now
    cdef double pad_load  # padded RT launch: bandwidth its BE parts will hold


cdef _KRun _krun(_Stream stream, object task, int kernel, long long seq, double t, tuple c):
    """A new launch record (``_KRun.__new__`` and C assignments: no argument parsing);
    fields not set here start at 0 / None."""
    cdef _KRun k = _KRun.__new__(_KRun)
    k.stream = stream
    k.task = task
    k.kernel = kernel
    k.seq = seq
    k.t_ready = t
    k.pending = c[0]
    k.cost = c[1]
    k.block_s = c[2]
    k.press = c[3]
    k.curve = c[4]
    k.g_alone = c[5]
    k.t_start = _NAN
    k.parts = []
    k.done_parts = ()
    return k


cdef inline bint _before(_KRun a, _KRun b):
    """Placement order: higher stream priority first, then FIFO by ready time."""
    if a.stream.priority != b.stream.priority:
        return a.stream.priority > b.stream.priority
    if a.t_ready != b.t_ready:
        return a.t_ready < b.t_ready
    return a.seq < b.seq


cdef class SimCore:
    """The device model behind ``SimDevice``: clock, event heap, streams and SMs.

    ``SimDevice.__init__`` validates its options and calls :meth:`_setup`; the Device
    methods defined here (``enqueue``, ``reset``, ``set_preempt``, ``run``, ...) are the
    simulator's implementations of :class:`av_infer.devices.base.Device`.
    """

    cdef public double _t
    cdef long long _seq
    # the event heap (see the module docstring): ``_n`` records in ``_heap`` (room for
    # ``_cap``), payloads in ``_pa``/``_pb`` by slot, free slots in ``_free``
    cdef _Ev* _heap
    cdef Py_ssize_t* _free
    cdef Py_ssize_t _n, _cap, _nfree
    cdef list _pa, _pb
    cdef readonly list _streams
    cdef list _ready
    cdef list _spare  # finished _Batch objects, reused (their SM arrays are allocated)
    cdef readonly dict _tasks
    cdef readonly dict _failed
    cdef SmPool _sms
    cdef double _bw_load
    cdef dict _residency  # stream -> (batch starts, batch ends); None: not recorded
    cdef list _order, _rev_order
    cdef object _on_complete
    cdef bint _closed, _reserved
    cdef bint _host_on  # host model (devices.sim_host): launches wait for their task's
    cdef dict _host_ready  # task -> end of its host start work (virtual s)
    cdef int _c, _n_sms
    cdef double flag_s, launch_s, evict_s, _interference, _jitter, _pad_factor
    cdef object _rng
    cdef public object timeline
    #: ``Device.faults`` (the reliability suite's hook, None in production), held as a C
    #: field: read at every launch start
    cdef public object faults
    cdef long long n_events, n_batches, n_kernels, n_evicted, n_padded, n_padded_blocks
    cdef double busy_s, pad_tail_s

    def _setup(self, int sms, int c, double flag_s, double launch_s, double evict_s,
               double interference, double jitter, object rng, double pad_overhead,
               bint reserved, bint record, bint record_residency):
        """Initial state (called once by ``SimDevice.__init__`` after validation)."""
        self._t = 0.0
        self._seq = 0
        self._clear_events()
        self._grow(64)
        self._streams = []
        self._ready = []
        self._spare = []
        self._tasks = {}
        self._failed = {}
        self._n_sms = sms
        self._sms = SmPool(sms, U)
        self._bw_load = 0.0
        self._residency = {} if record_residency else None
        self._order = list(range(sms))
        self._rev_order = self._order[::-1]
        self._on_complete = None
        self._closed = False
        self._reserved = reserved
        self._c = c
        self.flag_s = flag_s
        self.launch_s = launch_s
        self.evict_s = evict_s
        self._interference = interference
        self._jitter = jitter
        self._rng = rng
        self._pad_factor = 1.0 + pad_overhead
        self.timeline = [] if record else None
        self._host_on = False
        self._host_ready = {}

    def _set_host_ready(self, task, double t):
        """Host model (``devices.sim_host``): ``task``'s launches are transmitted no
        earlier than ``t`` (its host start work ends then). The first call turns the rule
        on for the device: from then on a stream's launches also land in transmit order
        (a later task's launch never overtakes an earlier one still on the host)."""
        self._host_on = True
        self._host_ready[task] = t

    def _forget_host(self, task):
        self._host_ready.pop(task, None)

    @property
    def stats(self):
        """Counters of the run so far (a fresh dict)."""
        return {"events": self.n_events, "batches": self.n_batches,
                "kernels": self.n_kernels, "evicted": self.n_evicted,
                "busy_s": self.busy_s, "padded_launches": self.n_padded,
                "padded_blocks": self.n_padded_blocks, "pad_tail_s": self.pad_tail_s}

    def stream_states(self):
        """Per stream (in id order) what diagnostics show of it, as the CPU and CUDA devices
        do in ``telemetry()["streams"]``: queued and in-flight launches, capacity, flag."""
        cdef _Stream s
        return [{"id": s.id, "priority": s.priority, "queued": s.vhq.queued,
                 "in_flight": s.vhq.in_flight, "capacity": s.vhq.c, "flag": bool(s.flag)}
                for s in self._streams]

    # -- clock and event loop ------------------------------------------------------------
    def now(self):
        return self._t

    def __dealloc__(self):
        free(self._heap)
        free(self._free)

    cdef int _grow(self, Py_ssize_t cap) except -1:
        """Room for ``cap`` events (and as many payload slots: never more are in use)."""
        cdef _Ev* h = <_Ev*>realloc(self._heap, cap * sizeof(_Ev))
        if h == NULL:
            raise MemoryError()
        self._heap = h
        cdef Py_ssize_t* f = <Py_ssize_t*>realloc(self._free, cap * sizeof(Py_ssize_t))
        if f == NULL:
            raise MemoryError()
        self._free = f
        self._cap = cap
        return 0

    cdef int _clear_events(self) except -1:
        self._n = 0
        self._nfree = 0
        self._pa = []
        self._pb = []
        return 0

    cdef inline void _at(self, double t, int kind, object a, object b) except *:
        """Schedule event ``kind`` with payload ``a``, ``b`` at ``t`` (after every event
        already at ``t``)."""
        cdef Py_ssize_t slot, i, p
        cdef _Ev ev
        cdef _Ev* heap
        self._seq += 1
        if self._nfree:
            self._nfree -= 1
            slot = self._free[self._nfree]
            self._pa[slot] = a
            self._pb[slot] = b
        else:
            slot = len(self._pa)
            self._pa.append(a)
            self._pb.append(b)
        if self._n == self._cap:
            self._grow(2 * self._cap)
        ev.t = t
        ev.seq = self._seq
        ev.kind = kind
        ev.slot = slot
        heap = self._heap
        i = self._n
        self._n += 1
        while i > 0:  # up from the new leaf
            p = (i - 1) >> 1
            if _ev_lt(&ev, &heap[p]):
                heap[i] = heap[p]
                i = p
            else:
                break
        heap[i] = ev

    cdef inline _Ev _pop(self) noexcept:
        """Remove and return the first event (the heap is not empty); its payload slot is
        the caller's to read and free (``_take``)."""
        cdef _Ev* heap = self._heap
        cdef _Ev top = heap[0]
        cdef _Ev last
        cdef Py_ssize_t n, i, c
        self._n -= 1
        n = self._n
        if n > 0:
            last = heap[n]
            i = 0
            while True:  # down from the root
                c = 2 * i + 1
                if c >= n:
                    break
                if c + 1 < n and _ev_lt(&heap[c + 1], &heap[c]):
                    c += 1
                if _ev_lt(&heap[c], &last):
                    heap[i] = heap[c]
                    i = c
                else:
                    break
            heap[i] = last
        return top

    def call_at(self, double t, fn):
        """Run ``fn()`` at virtual time ``t`` (not before now) inside :meth:`run`."""
        self._at(t if t > self._t else self._t, EV_CALL, fn, None)

    def run(self, until=None):
        """Process events in time order (ties: insertion order) until none are left or
        ``until``; the clock then stands at ``until`` (if given)."""
        cdef bint bounded = until is not None
        cdef double u = until if bounded else 0.0
        cdef long long n = 0
        cdef _Ev e
        cdef int kind
        cdef list pa, pb
        while self._n:
            if bounded and self._heap[0].t > u:
                break
            e = self._pop()
            pa = self._pa
            pb = self._pb
            a = pa[e.slot]
            b = pb[e.slot]
            pa[e.slot] = None
            pb[e.slot] = None
            self._free[self._nfree] = e.slot
            self._nfree += 1
            self._t = e.t
            kind = e.kind
            if kind == EV_BATCH_END:
                self._on_batch_end(<_Batch>a)
            elif kind == EV_ARRIVE:
                self._on_arrive(<_Stream>a, <tuple>b)
            elif kind == EV_FINISH:
                self._finish(<_KRun>a)
            elif kind == EV_CALL:
                a()
            elif kind == EV_FLAG:
                self._on_flag(<_Stream>a, b)
            else:
                self._on_quiet_end(<_Stream>a)
            if self._ready:
                self._schedule()
            n += 1
        self.n_events += n
        if bounded and u > self._t:
            self._t = u

    def idle(self):
        """No event pending: nothing in flight, nothing scheduled."""
        return self._n == 0

    # -- streams, vHQs, preemption -------------------------------------------------------
    def open_stream(self, int priority):
        cdef _Stream s = _Stream(len(self._streams), priority, self._c)
        self._streams.append(s)
        return s.id

    def enqueue(self, int stream, task, int first, int last, wake=True):
        cdef _Stream s = self._streams[stream]
        s.vhq.push(task, first, last)
        self._pump(s)

    def _set_pads(self, int stream, object key, tuple parts):
        (<_Stream>self._streams[stream]).pads[key] = parts

    def reset(self, int stream):
        cdef _Stream s = self._streams[stream]
        r = s.vhq.reset()
        # every queued launch is dropped, and with it its padding (the stream's one table)
        dropped = tuple((t, k, parts) for (t, k), parts in s.pads.items())
        s.pads.clear()
        if r is None:
            return None
        return ResetInfo(*r, dropped_parts=dropped)

    def set_preempt(self, int stream, flag):
        """The flag write lands ``flag_us`` from now (a stream memory operation)."""
        self._at(self._t + self.flag_s, EV_FLAG, self._streams[stream], bool(flag))

    def set_quiet(self, int stream, windows):
        """See :meth:`Device.set_quiet`; takes effect now (a held launch whose window
        moved away starts)."""
        cdef _Stream s = self._streams[stream]
        s.quiet = sorted((float(a), float(b)) for a, b in windows)
        if s.cur is None and s.devq:
            self._start_head(s)

    def set_capacity(self, int c):
        cdef _Stream s
        self._c = c
        for s in self._streams:
            s.vhq.c = c
            self._pump(s)

    def set_stream_capacity(self, int stream, int c):
        """Per-stream capacity (the ``wait`` baseline transmits BE work unbounded)."""
        cdef _Stream s = self._streams[stream]
        s.vhq.c = c
        self._pump(s)

    def start(self, on_complete):
        self._on_complete = on_complete

    def close(self):
        self._closed = True
        self._clear_events()
        del self._ready[:]

    def residency(self, int stream):
        """``(starts, ends)`` of every block batch that ran on ``stream`` (padding parts
        excluded: they belong to the RT launch), in completion order; needs
        ``record_residency=True``. A batch is blocks placed together; they leave the SMs
        together, so a batch resident at ``t`` has left at its end."""
        if self._residency is None:
            raise RuntimeError("SimDevice(record_residency=True) keeps batch residency")
        return self._residency.get(stream, ([], []))

    # -- the device model ------------------------------------------------------------------
    cdef int _pump(self, _Stream s) except -1:
        """The dispatcher: transmit while the vHQ allows; launches land after launch_us."""
        if self._closed:
            return 0
        cdef double t = self._t + self.launch_s
        cdef dict pads = s.pads
        cdef VHQ vhq = s.vhq
        cdef int64_t task
        cdef int32_t kernel
        cdef double ta
        while vhq.transmit_c(&task, &kernel):
            parts = pads.pop((task, kernel), ()) if pads else ()
            if self._host_on:  # host model: not before the task's host work ended
                r = self._host_ready.get(task)
                ta = t if r is None else max(t, <double>r + self.launch_s)
                if ta < s.last_arrive:
                    ta = s.last_arrive
                s.last_arrive = ta
                self._at(ta, EV_ARRIVE, s, (task, kernel, parts))
            else:
                self._at(t, EV_ARRIVE, s, (task, kernel, parts))
        return 0

    cdef int _on_flag(self, _Stream s, bint flag) except -1:
        s.flag = flag
        if flag and s.cur is None and s.devq:  # a held launch: it starts and evicts
            self._start_head(s)
        return 0

    cdef bint _held(self, _Stream s) except -1:
        """Does the head launch wait for a quiet window (and its release is scheduled)?"""
        cdef double now, stretch, end, ws, we
        task, kernel, parts = s.devq[0]
        h = self._tasks.get(task)
        if parts or h is None or h.dur_s is None:
            return False
        now = self._t
        stretch = QUIET_MARGIN
        mem = h.mem
        if mem is not None:  # what the bus others hold now would stretch it to
            stretch *= _slowdown(mem[kernel][0], self._bw_load)
        end = now + <double>h.dur_s[kernel] * stretch
        for w in s.quiet:
            ws, we = w
            if we <= now:
                continue
            if ws >= end:
                return False
            if s.hold_at != we:
                s.hold_at = we
                self._at(we, EV_QUIET_END, s, None)
            return True
        return False

    cdef int _on_quiet_end(self, _Stream s) except -1:
        if s.hold_at == self._t:
            s.hold_at = -1.0
        if s.cur is None and s.devq:
            self._start_head(s)
        return 0

    cdef int _on_arrive(self, _Stream s, tuple launch) except -1:
        s.devq.append(launch)
        if s.cur is None:
            self._start_head(s)
        return 0

    cdef int _add_ready(self, _KRun k) except -1:
        """Insert ``k`` into the ready list at its place in placement order."""
        cdef list ready = self._ready
        cdef Py_ssize_t i = len(ready)
        while i > 0 and _before(k, <_KRun>ready[i - 1]):
            i -= 1
        ready.insert(i, k)
        return 0

    cdef int _start_head(self, _Stream s) except -1:
        cdef _KRun k
        if s.quiet and not s.flag and self._held(s):
            return 0
        task, kernel, parts = s.devq.popleft()
        self._seq += 1
        h = self._tasks[task]
        faults = self.faults
        if faults is not None:
            try:
                faults.check("kernel", h.plan.name, kernel)
            except InjectedFault as e:
                self._failed.setdefault(task, f"kernel {kernel} failed: {e}")
        k = _krun(s, task, kernel, self._seq, self._t, h.consts[kernel])
        mem = h.mem
        if mem is not None:
            k.q, k.bw_unit = mem[kernel]
        s.cur = k
        self._add_ready(k)
        if parts:
            self._start_padding(k, parts, h)
        return 0

    cdef int _start_padding(self, _KRun k, tuple parts, object h_rt) except -1:
        """A padded launch: the RT kernel pays the dispatcher's overhead (its plan's
        ``pad_factor`` where a pad model set one, else the device's) and its BE parts
        become block groups of the same grid, behind the RT blocks in block order (same
        stream, later sequence numbers). See ``SimDevice``, point 6."""
        cdef _KRun kb
        cdef list runs = []
        cdef long long grid_cost, room, n, layers, cu_rt, sms
        pf = getattr(h_rt, "pad_factor", None)
        k.block_s *= self._pad_factor if pf is None else <double>pf
        self.n_padded += 1
        for p in parts:
            task, kernel, first, n, occ = p
            h = self._tasks.get(task)
            if h is None:  # released meanwhile (answered, aborted): nothing to run
                continue
            self._seq += 1
            kb = _krun(k.stream, task, kernel, self._seq, self._t, h.consts[kernel])
            kb.pending = n
            occ = max(1, occ)
            if U // occ > kb.cost:  # at most `occ` per SM
                kb.cost = U // occ
            kb.parent = k
            kb.first_block = first
            mem = h.mem
            if mem is not None:
                kb.q, kb.bw_unit = mem[kernel]
            runs.append(kb)
        if not self._reserved:
            grid_cost = k.cost
            for kb in runs:
                if kb.cost > grid_cost:
                    grid_cost = kb.cost
            k.cost = grid_cost
            room = self._sms.free_total // grid_cost - k.pending
            if room < 0:
                room = 0
            for kb in runs:
                kb.cost = grid_cost
                # the RT blocks share the bus with the BE blocks that start beside them
                n = kb.pending if kb.pending < room else room
                k.pad_load += kb.bw_unit * n
                room -= n
        else:
            sms = self._n_sms
            layers = <long long>ceil(<double>k.pending / sms)  # cu_partition: whole SMs
            cu_rt = <long long>ceil(<double>k.pending / layers)
            if cu_rt > sms:
                cu_rt = sms
            k.order = self._order[:cu_rt]
            be_order = self._rev_order[: sms - cu_rt] or self._rev_order
            for kb in runs:
                kb.order = be_order
        k.done_parts = parts
        for kb in runs:
            k.parts.append(kb)
            self._add_ready(kb)
            self.n_padded_blocks += kb.pending
        return 0

    cdef int _schedule(self) except -1:
        """Place blocks of ready kernels: higher priority first, then FIFO by ready time."""
        cdef list ready = self._ready
        cdef Py_ssize_t i = 0
        cdef _KRun k
        cdef SmPool pool = self._sms
        while i < len(ready):
            k = <_KRun>ready[i]
            if k.stream.flag:
                if pool.max_free() >= k.cost:  # a block reaches an SM, reads the flag
                    del ready[i]
                    self._evict(k)
                    continue
            elif pool.free_total >= k.cost:
                self._place(k)
                if k.pending == 0:
                    del ready[i]
                    continue
            i += 1
        return 0

    cdef int _evict(self, _KRun k) except -1:
        k.evicted = True
        k.pending = 0
        if k.started == 0:
            k.t_start = self._t
        k.evict_until = self._t + self.evict_s
        if k.running == 0:
            self._at(k.evict_until, EV_FINISH, k, None)
        return 0

    cdef int _place(self, _KRun k) except -1:
        """Start as many of ``k``'s pending blocks as fit, breadth-first over the SMs
        (``SmPool._place``); the batch's time follows the packing model, the interference
        of blocks already on its SMs, and the contention model (``SimDevice``, 4 and 7)."""
        cdef _Batch bt = self._spare.pop() if self._spare else _Batch()
        cdef long long n = self._sms._place(k.cost, k.pending, k.order, k.press, bt)
        cdef double dur, x, g, bw
        if n == 0:
            self._spare.append(bt)
            return 0
        k.stream.used += n * k.cost
        # The batch ends with its most packed SM (d blocks), which follows the kernel's
        # packing curve; blocks of other kernels (and earlier batches) already on its SMs
        # add their pressure (block-weighted mean).
        x = _curve_at(k.curve, k.press, bt.d) + self._interference * bt.f_sum / <double>n
        dur = k.block_s * (x if x > 1.0 else 1.0) / k.g_alone
        if k.q:  # memory-side contention (sim_contention): the bus others hold now
            dur *= _slowdown(k.q, self._bw_load - k.bw_res + k.pad_load)
            bw = k.bw_unit * n
            k.bw_res += bw
            self._bw_load += bw
        if self._jitter:
            g = self._rng.gauss(1.0, self._jitter)
            dur *= g if g > 0.1 else 0.1
        if k.started == 0:
            k.t_start = self._t
        k.started += n
        k.pending -= n
        k.running += n
        self.n_batches += 1
        bt.k = k
        bt.t0 = self._t
        self._at(self._t + dur, EV_BATCH_END, bt, None)
        return 0

    cdef int _on_batch_end(self, _Batch bt) except -1:
        cdef _KRun k = bt.k
        cdef _KRun parent
        cdef long long n = bt.n
        cdef double bw
        self._sms._release(bt, k.cost, k.press)
        bt.k = None
        self._spare.append(bt)
        k.stream.used -= n * k.cost
        if k.q:
            bw = k.bw_unit * n
            k.bw_res -= bw
            self._bw_load -= bw
        if self._residency is not None and k.parent is None:
            se = self._residency.get(k.stream.id)  # (not setdefault: no lists made per batch)
            if se is None:
                se = self._residency[k.stream.id] = ([], [])
            (<list>se[0]).append(bt.t0)
            (<list>se[1]).append(self._t)
        k.running -= n
        if k.running == 0 and k.pending == 0:
            if k.parent is not None:  # a padding part of a padded launch
                parent = k.parent
                parent.parts.remove(k)
                if self.timeline is not None:
                    self.timeline.append((k.stream.id, k.task, k.kernel, k.t_start, self._t,
                                          True, k.started))
                if not parent.parts and parent.running == 0 and parent.pending == 0:
                    self.pad_tail_s += self._t - parent.evict_until
                    self._finish(parent)
            elif k.parts:
                k.evict_until = self._t  # (unused for a padded launch) RT blocks' end
                return 0  # the RT blocks are done; the launch ends with its last BE block
            elif k.evicted and k.evict_until > self._t:
                self._at(k.evict_until, EV_FINISH, k, None)
            else:
                self._finish(k)
        return 0

    cdef int _finish(self, _KRun k) except -1:
        cdef _Stream s = k.stream
        cdef int64_t task
        cdef int32_t kernel
        s.cur = None
        if not s.vhq.complete_c(&task, &kernel):
            raise RuntimeError("complete() with no launch in flight")
        assert task == k.task and kernel == k.kernel, "stream completed out of order"
        cdef bint executed = not k.evicted
        self.n_kernels += 1
        if not executed:
            self.n_evicted += 1
        else:
            self.busy_s += self._t - k.t_start
        if self.timeline is not None:
            self.timeline.append((s.id, k.task, kernel, k.t_start, self._t, executed,
                                  k.started))
        if s.devq:
            self._start_head(s)
        self._pump(s)
        if self._on_complete is not None:
            # the compiled record (devices/completion.pxd; the .py under AV_INFER_INTERPRETED)
            self._on_complete(Completion(s.id, k.task, kernel, executed, k.t_start, self._t,
                                         k.done_parts))
        return 0
