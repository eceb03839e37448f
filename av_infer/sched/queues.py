"""Ready queues: RT requests in EDF order, BE requests per client served round-robin.

Why two shapes: RT work is ordered by urgency (absolute deadline, FIFO on ties: the
Cython ``RtQueue`` over ``EdfHeap``); BE work has no deadline worth ordering by, so
fairness between BE clients matters more: one FIFO per client, clients taken in turn so a
chatty client cannot starve a quiet one (the Cython ``BeQueues``,
``av_infer/_cy/be_queues.pyx``: its truth, ``len``, ``push`` and ``pop`` are C calls, not
Python frames, on the request path). Neither queue is thread-safe: only the scheduler
touches them.
"""

from __future__ import annotations

from av_infer._cy.be_queues import BeQueues
from av_infer._cy.edf_heap import RtQueue

__all__ = ["BeQueues", "RtQueue"]
