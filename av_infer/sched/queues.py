"""Ready queues: RT requests in EDF order, BE requests per client served round-robin.

Why two shapes: RT work is ordered by urgency (absolute deadline, FIFO on ties: the
Cython ``RtQueue`` over ``EdfHeap``); BE work has no deadline worth ordering by, so
fairness between BE clients matters more: one FIFO per client, clients taken in turn so a
chatty client cannot starve a quiet one. Neither queue is thread-safe: only the scheduler
touches them.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator
from typing import Any

from av_infer._cy.edf_heap import RtQueue

__all__ = ["BeQueues", "RtQueue"]


class BeQueues:
    """One FIFO per BE client; ``pop`` takes the head of the next client in turn."""

    __slots__ = ("_fifos", "_turn", "_n")

    def __init__(self) -> None:
        self._fifos: OrderedDict[str, deque[Any]] = OrderedDict()
        self._turn: deque[str] = deque()  # clients with queued work, next-served first
        self._n = 0

    def push(self, client: str, item: Any) -> None:
        fifo = self._fifos.get(client)
        if fifo is None:
            fifo = self._fifos[client] = deque()
        if not fifo:
            self._turn.append(client)
        fifo.append(item)
        self._n += 1

    def pop(self) -> Any:
        """Head of the client whose turn it is (IndexError when empty)."""
        client = self._turn.popleft()
        fifo = self._fifos[client]
        item = fifo.popleft()
        if fifo:
            self._turn.append(client)
        self._n -= 1
        return item

    def push_front(self, client: str, item: Any) -> None:
        """Put an item back at the head of its client's FIFO and give that client the turn."""
        fifo = self._fifos.setdefault(client, deque())
        if fifo:
            self._turn.remove(client)
        fifo.appendleft(item)
        self._turn.appendleft(client)
        self._n += 1

    def clear(self) -> list[Any]:
        """Remove and return everything (client order, FIFO within a client)."""
        out = [item for fifo in self._fifos.values() for item in fifo]
        for fifo in self._fifos.values():
            fifo.clear()
        self._turn.clear()
        self._n = 0
        return out

    def remove_if(self, pred: Any) -> list[Any]:
        """Remove and return every item for which ``pred(item)`` is true."""
        out: list[Any] = []
        for client, fifo in self._fifos.items():
            keep = deque()
            for item in fifo:
                (out if pred(item) else keep).append(item)
            if len(keep) != len(fifo):
                self._fifos[client] = keep
                if not keep and client in self._turn:
                    self._turn.remove(client)
        self._n -= len(out)
        return out

    def depths(self) -> dict[str, int]:
        return {c: len(f) for c, f in self._fifos.items()}

    def __iter__(self) -> Iterator[Any]:
        for fifo in self._fifos.values():
            yield from fifo

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0
