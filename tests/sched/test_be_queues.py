"""The compiled BE queue (av_infer/_cy/be_queues.pyx) against the Python class it replaced.

``_Reference`` is that class, verbatim: one FIFO per client, clients taken round-robin.
A hypothesis state machine applies the same operations to both and compares every
result and the whole observable state (truth, len, iteration order, depths) after each.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from types import FunctionType
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from av_infer.sched.queues import BeQueues


class _Reference:
    """The Python BeQueues of sched/queues.py before it was compiled."""

    def __init__(self) -> None:
        self._fifos: OrderedDict[str, deque[Any]] = OrderedDict()
        self._turn: deque[str] = deque()
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
        client = self._turn.popleft()
        fifo = self._fifos[client]
        item = fifo.popleft()
        if fifo:
            self._turn.append(client)
        self._n -= 1
        return item

    def push_front(self, client: str, item: Any) -> None:
        fifo = self._fifos.setdefault(client, deque())
        if fifo:
            self._turn.remove(client)
        fifo.appendleft(item)
        self._turn.appendleft(client)
        self._n += 1

    def clear(self) -> list[Any]:
        out = [item for fifo in self._fifos.values() for item in fifo]
        for fifo in self._fifos.values():
            fifo.clear()
        self._turn.clear()
        self._n = 0
        return out

    def remove_if(self, pred: Any) -> list[Any]:
        out: list[Any] = []
        for client, fifo in self._fifos.items():
            keep: deque[Any] = deque()
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

    def __iter__(self):  # noqa: ANN204
        for fifo in self._fifos.values():
            yield from fifo

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0


def test_the_scheduler_gets_the_compiled_queue() -> None:
    assert BeQueues.__module__ == "av_infer._cy.be_queues"
    assert not isinstance(BeQueues.__dict__["__bool__"], FunctionType)  # a C slot


def test_round_robin_between_clients_fifo_within() -> None:
    q = BeQueues()
    assert not q and len(q) == 0
    for item in ("a1", "a2", "a3"):
        q.push("a", item)
    q.push("b", "b1")
    assert q and len(q) == 4 and list(q) == ["a1", "a2", "a3", "b1"]
    assert [q.pop() for _ in range(4)] == ["a1", "b1", "a2", "a3"]
    assert not q
    with pytest.raises(IndexError):
        q.pop()


def test_no_other_attributes() -> None:
    with pytest.raises(AttributeError):
        BeQueues().extra = 1  # type: ignore[attr-defined]


_CLIENTS = st.sampled_from(["a", "b", "c", "d"])


class _SameAsReference(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.ref = BeQueues(), _Reference()
        self.next = 0

    def _item(self) -> int:
        self.next += 1
        return self.next

    @rule(client=_CLIENTS)
    def push(self, client: str) -> None:
        item = self._item()
        self.q.push(client, item)
        self.ref.push(client, item)

    @rule(client=_CLIENTS)
    def push_front(self, client: str) -> None:
        item = self._item()
        self.q.push_front(client, item)
        self.ref.push_front(client, item)

    @rule()
    def pop(self) -> None:
        if self.ref:
            assert self.q.pop() == self.ref.pop()
        else:
            with pytest.raises(IndexError):
                self.q.pop()

    @rule(mod=st.integers(2, 4), rem=st.integers(0, 3))
    def remove_if(self, mod: int, rem: int) -> None:
        def pred(x: int) -> bool:
            return x % mod == rem % mod

        assert self.q.remove_if(pred) == self.ref.remove_if(pred)

    @rule()
    def clear(self) -> None:
        assert self.q.clear() == self.ref.clear()

    @invariant()
    def same_state(self) -> None:
        assert bool(self.q) == bool(self.ref)
        assert len(self.q) == len(self.ref)
        assert list(self.q) == list(self.ref)
        assert self.q.depths() == self.ref.depths()
        assert list(self.q.depths()) == list(self.ref.depths())  # client order too


_SameAsReference.TestCase.settings = settings(max_examples=200, stateful_step_count=40,
                                              deadline=None)
test_same_as_reference = _SameAsReference.TestCase
