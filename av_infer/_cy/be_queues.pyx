# cython: language_level=3
"""BE ready queue: one FIFO per client, clients served round-robin (``sched/queues.py``).

Why compiled: the scheduler asks ``if self.be_queues:`` several times per decision and
pushes and pops once per BE request; as a Python class each of those was a Python frame
(``__bool__`` alone 2-3 per request, issue 31). As an extension type, truth, ``len``,
``push`` and ``pop`` are C calls. Behaviour is the Python class's it replaces, method for
method (``tests/sched/test_be_queues.py`` checks it against a reference model). Not
thread-safe: only the scheduler touches it.
"""
from collections import deque


cdef class BeQueues:
    """One FIFO per BE client; ``pop`` takes the head of the next client in turn."""

    cdef dict _fifos  # client -> deque of items (insertion order: first push first)
    cdef object _turn  # deque of clients with queued work, next-served first
    cdef Py_ssize_t _n  # items queued (== sum of the FIFOs' lengths)

    def __cinit__(self):
        self._fifos = {}
        self._turn = deque()
        self._n = 0

    def push(self, client, item):
        fifo = self._fifos.get(client)
        if fifo is None:
            fifo = self._fifos[client] = deque()
        if not fifo:
            self._turn.append(client)
        fifo.append(item)
        self._n += 1

    def pop(self):
        """Head of the client whose turn it is (IndexError when empty)."""
        client = self._turn.popleft()
        fifo = self._fifos[client]
        item = fifo.popleft()
        if fifo:
            self._turn.append(client)
        self._n -= 1
        return item

    def push_front(self, client, item):
        """Put an item back at the head of its client's FIFO and give that client the turn."""
        fifo = self._fifos.setdefault(client, deque())
        if fifo:
            self._turn.remove(client)
        fifo.appendleft(item)
        self._turn.appendleft(client)
        self._n += 1

    def clear(self):
        """Remove and return everything (client order, FIFO within a client)."""
        out = [item for fifo in self._fifos.values() for item in fifo]
        for fifo in self._fifos.values():
            fifo.clear()
        self._turn.clear()
        self._n = 0
        return out

    def remove_if(self, pred):
        """Remove and return every item for which ``pred(item)`` is true."""
        out = []
        for client, fifo in list(self._fifos.items()):
            keep = deque()
            for item in fifo:
                (out if pred(item) else keep).append(item)
            if len(keep) != len(fifo):
                self._fifos[client] = keep
                if not keep and client in self._turn:
                    self._turn.remove(client)
        self._n -= len(out)
        return out

    def depths(self):
        return {c: len(f) for c, f in self._fifos.items()}

    def __iter__(self):
        for fifo in self._fifos.values():
            yield from fifo

    def __len__(self):
        return self._n

    def __bool__(self):
        return self._n > 0
