# cython: language_level=3
"""C types for ``stats.py`` (Cython's pure-Python mode, as latency.pxd): the statistics
become ``cdef class``es with C fields. The compiled scheduler (``scheduler.pxd`` cimports
them) holds its ``Stats`` typed and reads the lock and the tables, and writes the
counters, as struct members; ``client``/``model`` are C calls. The lock, the tables and
the recorders are ``readonly`` (a ``Stats`` never replaces them); the counters are
``public``, as the Python attributes they were."""

cimport cython

from av_infer._cy.fastlock cimport FastLock
from av_infer.latency cimport LatencyRecorder


@cython.final
cdef class ClientStats:
    cdef public str priority
    cdef public long long submitted
    cdef public long long completed
    cdef public long long failed
    cdef public long long deadline_misses
    cdef readonly LatencyRecorder latency
    cdef readonly LatencyRecorder preemption_latency
    cdef readonly dict errors


@cython.final
cdef class Stats:
    cdef readonly FastLock lock
    cdef readonly dict clients
    cdef readonly dict models
    cdef public long long preemptions
    cdef public long long restores
    cdef public long long rt_switches
    cdef public long long padded_launches
    cdef public long long padded_blocks
    cdef public long long padded_kernels
    cdef readonly LatencyRecorder preemption_stop
    cdef readonly LatencyRecorder preemption_observed
    cdef readonly LatencyRecorder preemption_stop_submit
    cdef readonly dict handler_errors
    cdef public long long be_grants

    @cython.locals(cs=ClientStats)
    cpdef ClientStats client(self, name, str priority)
    cpdef dict model(self, name)
