# cython: annotation_typing=False, language_level=3
"""Counters and latency recorders for diagnostics (``Runtime.stats()``).

The recorders themselves (raw samples, percentiles) are ``av_infer.latency``. Only the
scheduler writes; readers take a snapshot under a lock.

Compiled where built (``stats.pxd``, Cython's pure-Python mode, av_infer/_cy/compiled.py):
``Stats`` and ``ClientStats`` are ``cdef class``es with C fields, which the compiled
scheduler (``scheduler.pxd`` cimports them) holds typed and writes as struct members on
every request, with no copies of the lock or the tables beside them. The ``.py`` is the
one source and runs interpreted where it is not built (``AV_INFER_INTERPRETED=1``).
"""

from __future__ import annotations

from typing import Any

from av_infer._cy.fastlock import FastLock
from av_infer.latency import LatencyRecorder, summarize_ms

#: Clients counted by name; more distinct names (a remote publisher inventing one per
#: request) are counted together under OTHER_CLIENTS, so the table stays bounded.
MAX_CLIENTS = 256
OTHER_CLIENTS = "(other clients)"


class ClientStats:
    """One client's counters and latency recorders (written by the scheduler under
    ``Stats.lock``)."""

    def __init__(self, priority: str) -> None:
        self.priority = priority
        self.submitted = 0
        self.completed = 0
        self.failed = 0
        self.deadline_misses = 0
        self.latency = LatencyRecorder()
        self.preemption_latency = LatencyRecorder()  # arrival -> first kernel start
        self.errors: dict[str, int] = {}


class Stats:
    """Everything ``Runtime.stats()`` reports that the scheduler counts."""

    def __init__(self) -> None:
        # a FastLock (_cy/fastlock.pyx): the compiled scheduler takes it twice a request
        # with acquire()/release() as C calls; everyone else uses it as threading.Lock
        self.lock = FastLock()
        self.clients: dict[str, ClientStats] = {}
        self.models: dict[str, dict[str, int]] = {}
        self.preemptions = 0
        self.restores = 0
        self.rt_switches = 0  # edf_preempt take-overs of the RT stream
        self.padded_launches = 0  # RT launches that carried BE blocks (DKP)
        self.padded_blocks = 0  # BE blocks that ran inside padded launches
        self.padded_kernels = 0  # BE kernels completed by padding
        #: RT arrival -> the BE launch running at arrival left the device (evicted, killed
        #: or finished), per preempted stream that had one (docs/design.md, preemption latency)
        self.preemption_stop = LatencyRecorder()
        #: the same up to the moment the device *reported* that launch (a killed CPU launch
        #: reports once its thread has the GIL again: an upper bound)
        self.preemption_observed = LatencyRecorder()
        #: as ``preemption_stop`` but from the moment the runtime took the RT request
        #: (``submit``): the runtime's part, without the caller's own delay before submitting
        self.preemption_stop_submit = LatencyRecorder()
        #: scheduler handlers that raised, by event kind (their requests failed typed)
        self.handler_errors: dict[str, int] = {}
        self.be_grants = 0  # BE minimum-share grants under RT overload

    def client(self, name: str, priority: str) -> ClientStats:
        """``name``'s statistics (caller holds ``lock``), added on first use; beyond
        ``MAX_CLIENTS`` names, the shared ``OTHER_CLIENTS`` row."""
        cs = self.clients.get(name)
        if cs is None:
            if len(self.clients) >= MAX_CLIENTS:
                name = OTHER_CLIENTS
                cs = self.clients.get(name)
            if cs is None:
                cs = self.clients[name] = ClientStats(priority)
        return cs

    def model(self, name: str) -> dict[str, int]:
        """``name``'s request counters (caller holds ``lock``), added on first use."""
        m = self.models.get(name)
        if m is None:
            m = self.models[name] = {"submitted": 0, "completed": 0, "failed": 0}
        return m

    def snapshot(self) -> dict[str, Any]:
        """Counters and percentiles; the lock is held only to copy (percentiles after)."""
        with self.lock:
            clients = {
                name: ({"priority": cs.priority, "submitted": cs.submitted,
                        "completed": cs.completed, "failed": cs.failed,
                        "deadline_misses": cs.deadline_misses, "errors": dict(cs.errors)},
                       cs.latency.sample(), cs.preemption_latency.sample())
                for name, cs in self.clients.items()
            }
            out: dict[str, Any] = {
                "models": {k: dict(v) for k, v in self.models.items()},
                "preemptions": self.preemptions,
                "restores": self.restores,
                "rt_switches": self.rt_switches,
                "padded_launches": self.padded_launches,
                "padded_blocks": self.padded_blocks,
                "padded_kernels": self.padded_kernels,
                "handler_errors": dict(self.handler_errors),
                "be_grants": self.be_grants,
            }
            stop = self.preemption_stop.sample()
            observed = self.preemption_observed.sample()
            from_submit = self.preemption_stop_submit.sample()
        out["clients"] = {
            name: {**c, "latency_ms": summarize_ms(lat), "preemption_latency_ms": summarize_ms(pl)}
            for name, (c, lat, pl) in clients.items()
        }
        out["preemption_stop_ms"] = {**summarize_ms(stop), "count": stop[1]}
        out["preemption_observed_ms"] = {**summarize_ms(observed), "count": observed[1]}
        out["preemption_stop_from_submit_ms"] = {**summarize_ms(from_submit),
                                                 "count": from_submit[1]}
        return out
