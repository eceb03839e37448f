# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Dynamic kernel padding: which BE blocks ride along an RT kernel (REEF §5.2).

Called once per RT kernel launch in real-time mode, so it must cost well under a
microsecond (REEF Fig. 19a: 0.2-0.4 µs). The candidates (the next not-yet-run kernel of each
preempted BE task) live in C arrays of a :class:`Selector`, updated only when a task's
padding cursor moves (``set``/``clear``); ``select`` then loops over plain doubles without
touching Python objects except to build the (short) result list.

A BE kernel qualifies when
* rule 1: its profiled duration is not longer than the RT kernel's (the padded launch lasts
  as long as its slowest block), and
* rule 2: its occupancy (blocks per SM) is not lower than the RT kernel's (the padded launch
  runs at the minimum occupancy of its parts).

Slots are counted in RT-occupancy units: the GPU has ``sms * bps_rt`` of them. The RT
kernel's blocks are spread breadth-first, one per SM first, so it holds whole SMs:
``cu_rt = ceil(rt_blocks / layers)`` with ``layers = ceil(rt_blocks / sms)`` (REEF's
``cu_partition``); the free slots are ``(sms - cu_rt) * bps_rt`` and BE blocks only go there,
never beside RT blocks (REEF Fig. 9 partitions CUs). A BE block at occupancy ``occ`` costs
``bps_rt / occ`` slots. As REEF does with its latency profile (rule 2 is about the kernel's
resource occupancy; the occupancy it *runs* at may be lower), ``occ`` is
the highest occupancy (<= the kernel's) whose round of co-resident blocks still fits in the
RT kernel's duration (round time interpolated linearly between ``one_us``, one block per SM,
and ``round_us``, ``bps`` per SM), and each slot runs ``floor(rt_us / round(occ))`` rounds.
Greedy over candidates in order, one kernel per task (a task's kernels depend on each other),
until no slot is left. Each pick is ``(task, kernel, first_block, n_blocks, occ)``.
"""
from cpython.mem cimport PyMem_Free, PyMem_Malloc


cdef struct Cand:
    long long task
    long long kernel
    double dur_us
    double round_us
    double one_us
    long long blocks
    long long bps
    long long done
    bint used


cdef class Selector:
    """Up to ``capacity`` candidate BE kernels in slots; ``select`` picks padding for one
    RT kernel. Not thread-safe: the scheduler owns it."""

    cdef Cand* _c
    cdef Py_ssize_t _cap
    cdef public int sms

    def __cinit__(self, int sms, Py_ssize_t capacity=16):
        if sms < 1:
            raise ValueError(f"sms must be >= 1, got {sms}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._c = <Cand*>PyMem_Malloc(capacity * sizeof(Cand))
        if self._c == NULL:
            raise MemoryError()
        self._cap = capacity
        self.sms = sms
        cdef Py_ssize_t i
        for i in range(capacity):
            self._c[i].used = False

    def __dealloc__(self):
        PyMem_Free(self._c)

    @property
    def capacity(self) -> int:
        return self._cap

    def set(self, Py_ssize_t slot, long long task, long long kernel, double dur_us,
            long long blocks, long long bps, long long done=0, double round_us=-1.0,
            double one_us=-1.0):
        """Slot ``slot`` offers kernel ``kernel`` of ``task``: ``done`` of its ``blocks``
        were already padded. ``round_us``/``one_us``: a round of ``bps`` / of 1 block per
        SM (<= 0: ``dur_us``)."""
        if slot < 0 or slot >= self._cap:
            raise IndexError(f"slot {slot} out of 0..{self._cap - 1}")
        if blocks < 1 or bps < 1 or done < 0 or done > blocks or dur_us < 0:
            raise ValueError("need blocks >= 1, bps >= 1, 0 <= done <= blocks, dur >= 0")
        cdef Cand* c = &self._c[slot]
        c.task = task
        c.kernel = kernel
        c.dur_us = dur_us
        c.round_us = round_us if round_us > 0 else dur_us
        c.one_us = one_us if one_us > 0 else c.round_us
        if c.one_us > c.round_us:
            c.one_us = c.round_us
        c.blocks = blocks
        c.bps = bps
        c.done = done
        c.used = True

    def clear(self, Py_ssize_t slot):
        if 0 <= slot < self._cap:
            self._c[slot].used = False

    def clear_all(self):
        cdef Py_ssize_t i
        for i in range(self._cap):
            self._c[i].used = False

    def __len__(self):
        cdef Py_ssize_t i, n = 0
        for i in range(self._cap):
            if self._c[i].used:
                n += 1
        return n

    def select(self, double rt_us, long long rt_blocks, long long rt_bps):
        """Padding for one RT kernel: a list of ``(task, kernel, first_block, n_blocks,
        occupancy)``.

        Does not move the cursors: the caller commits what it launched with ``set``.
        """
        cdef long long picked_slot[64]
        cdef long long picked_n[64]
        cdef long long picked_occ[64]
        cdef int npick = 0
        cdef long long sms = self.sms
        cdef long long layers, cu_rt, free_slots, per_round, rounds, n, left, used, occ
        cdef double slope, t_occ
        cdef Py_ssize_t i
        cdef Cand* c
        if rt_blocks < 1 or rt_bps < 1:
            return []
        with nogil:
            layers = (rt_blocks + sms - 1) // sms
            cu_rt = (rt_blocks + layers - 1) // layers
            if cu_rt > sms:
                cu_rt = sms
            free_slots = (sms - cu_rt) * rt_bps
            i = 0
            while i < self._cap and free_slots > 0 and npick < 64:
                c = &self._c[i]
                i += 1
                if not c.used or c.done >= c.blocks:
                    continue
                if c.dur_us > rt_us:  # rule 1
                    continue
                if c.bps < rt_bps:  # rule 2
                    continue
                # occupancy whose round fits in the RT kernel (REEF: latency[j] <= rt)
                occ = c.bps
                t_occ = c.round_us
                if c.bps > 1 and t_occ > rt_us:
                    slope = (c.round_us - c.one_us) / (c.bps - 1)
                    occ = 1
                    if slope > 0:
                        occ = 1 + <long long>((rt_us - c.one_us) / slope)
                    if occ < 1:
                        occ = 1
                    if occ > c.bps:
                        occ = c.bps
                    t_occ = c.one_us + (occ - 1) * slope
                per_round = free_slots * occ // rt_bps
                if per_round < 1:
                    continue
                rounds = 1
                if t_occ > 0:
                    rounds = <long long>(rt_us / t_occ)
                    if rounds < 1:
                        rounds = 1
                left = c.blocks - c.done
                n = per_round * rounds
                if n > left:
                    n = left
                # slots this part holds: its blocks per round, in RT units (rounded up)
                used = (n + rounds - 1) // rounds
                used = (used * rt_bps + occ - 1) // occ
                free_slots -= used
                picked_slot[npick] = i - 1
                picked_n[npick] = n
                picked_occ[npick] = occ
                npick += 1
        out = []
        for i in range(npick):
            c = &self._c[picked_slot[i]]
            out.append((c.task, c.kernel, c.done, picked_n[i], picked_occ[i]))
        return out


def select_padding(rt, candidates, int sms):
    """One-shot form of :meth:`Selector.select` (tests, tools): ``rt`` is
    ``(duration_us, blocks, blocks_per_sm)``; each candidate is ``(task, kernel,
    duration_us, blocks, blocks_per_sm, done_blocks[, round_us[, one_us]])``."""
    sel = Selector(sms, max(1, len(candidates)))
    for slot, cand in enumerate(candidates):
        sel.set(slot, *cand)
    return sel.select(rt[0], rt[1], rt[2])
