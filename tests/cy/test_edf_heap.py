"""EDF heap (av_infer._cy.edf_heap): order, FIFO ties, inf last, lazy remove, clear."""

import math

import pytest
from av_infer._cy.edf_heap import EdfHeap
from hypothesis import given, settings
from hypothesis import strategies as st

INF = math.inf


def drain(h):
    out = []
    while h:
        out.append(h.pop())
    return out


def test_edf_order():
    h = EdfHeap()
    for d in [5.0, 1.0, 3.0, 2.0, 4.0]:
        h.push(d, f"r{d:g}")
    assert len(h) == 5
    assert h.peek() == (1.0, "r1")
    assert [d for d, _ in drain(h)] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert len(h) == 0 and not h


def test_fifo_on_equal_deadlines():
    h = EdfHeap()
    for i in range(50):
        h.push(7.0, i)
    h.push(1.0, "first")
    assert h.pop() == (1.0, "first")
    assert [x for _, x in drain(h)] == list(range(50))


def test_inf_deadlines_sort_last_fifo():
    h = EdfHeap()
    h.push(INF, "be0")
    h.push(10.0, "rt")
    h.push(INF, "be1")
    h.push(1e300, "late")
    assert drain(h) == [(10.0, "rt"), (1e300, "late"), (INF, "be0"), (INF, "be1")]


def test_nan_rejected_and_empty_errors():
    h = EdfHeap()
    with pytest.raises(ValueError):
        h.push(math.nan, "x")
    assert len(h) == 0
    with pytest.raises(IndexError):
        h.pop()
    with pytest.raises(IndexError):
        h.peek()


def test_lazy_remove_and_len():
    h = EdfHeap()
    hs = {d: h.push(float(d), d) for d in range(10)}
    assert h.remove(hs[0]) is True      # the top
    assert h.remove(hs[5]) is True      # in the middle
    assert h.remove(hs[5]) is False     # twice
    assert len(h) == 8
    assert h.peek() == (1.0, 1)
    assert [x for _, x in h.items()] == [1, 2, 3, 4, 6, 7, 8, 9]
    assert [x for _, x in drain(h)] == [1, 2, 3, 4, 6, 7, 8, 9]
    assert h.remove(hs[9]) is False     # already popped


def test_remove_bad_handles():
    h = EdfHeap()
    k = h.push(1.0, "a")
    for bad in (0, -1, 2**64, 2**70, "x", None, 1.5, k + 1):
        assert h.remove(bad) is False
    assert len(h) == 1


def test_stale_handle_after_slot_reuse():
    h = EdfHeap()
    old = h.push(1.0, "a")
    assert h.pop() == (1.0, "a")
    new = h.push(2.0, "b")            # reuses the slot with a new generation
    assert new != old
    assert h.remove(old) is False
    assert len(h) == 1
    assert h.remove(new) is True
    assert len(h) == 0 and not h


def test_remove_all_then_pop_raises():
    h = EdfHeap()
    handles = [h.push(float(i % 7), i) for i in range(300)]
    for k in handles:
        assert h.remove(k)
    assert len(h) == 0
    with pytest.raises(IndexError):
        h.pop()
    h.push(3.0, "x")
    assert h.pop() == (3.0, "x")


def test_clear_returns_live_items_in_edf_order():
    h = EdfHeap()
    ka = h.push(3.0, "c")
    h.push(1.0, "a")
    h.push(INF, "z")
    h.push(2.0, "b")
    h.push(1.0, "a2")
    h.remove(ka)
    assert h.clear() == ["a", "a2", "b", "z"]
    assert len(h) == 0 and h.items() == []
    h.push(5.0, "again")
    assert h.pop() == (5.0, "again")


def test_clear_invalidates_handles():
    h = EdfHeap()
    k = h.push(1.0, "a")
    h.clear()
    h.push(2.0, "b")
    assert h.remove(k) is False
    assert len(h) == 1


def test_grows_beyond_initial_capacity():
    h = EdfHeap()
    n = 5000
    for i in range(n):
        h.push(float((i * 7919) % n), i)
    assert len(h) == n
    ds = [d for d, _ in drain(h)]
    assert ds == sorted(ds)


def test_items_do_not_leak_references():
    import sys

    obj = object()
    base = sys.getrefcount(obj)
    h = EdfHeap()
    handles = [h.push(float(i), obj) for i in range(100)]
    for k in handles[::2]:
        h.remove(k)
    for _ in range(25):
        h.pop()
    h.clear()
    assert sys.getrefcount(obj) == base


ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.sampled_from([0.0, 1.0, 2.5, 2.5, 1e9, INF, -3.0])),
        st.tuples(st.just("pop"), st.none()),
        st.tuples(st.just("peek"), st.none()),
        st.tuples(st.just("remove"), st.integers(0, 200)),
        st.tuples(st.just("clear"), st.none()),
    ),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_matches_sorted_list_model(ops):
    h = EdfHeap()
    model = []          # (deadline, seq, item), kept sorted
    handles = []        # (handle, seq) in push order
    seq = 0
    for op, arg in ops:
        if op == "push":
            handles.append((h.push(arg, seq), seq))
            model.append((arg, seq, seq))
            model.sort()
            seq += 1
        elif op == "pop":
            if model:
                d, _, item = model.pop(0)
                assert h.pop() == (d, item)
            else:
                with pytest.raises(IndexError):
                    h.pop()
        elif op == "peek":
            if model:
                assert h.peek() == (model[0][0], model[0][2])
            else:
                with pytest.raises(IndexError):
                    h.peek()
        elif op == "remove":
            if handles:
                k, s = handles[arg % len(handles)]
                live = any(m[1] == s for m in model)
                assert h.remove(k) is live
                model = [m for m in model if m[1] != s]
        else:
            assert h.clear() == [m[2] for m in model]
            model = []
        assert len(h) == len(model)
        assert bool(h) is bool(model)
        assert h.items() == [(m[0], m[2]) for m in model]


def test_compaction_keeps_order_and_handles():
    h = EdfHeap()
    handles = {i: h.push(float((i * 37) % 1000), i) for i in range(1000)}
    removed = set(range(0, 1000, 3)) | set(range(1, 1000, 3))   # 2/3: forces compaction
    for i in removed:
        assert h.remove(handles[i])
    assert len(h) == 1000 - len(removed)
    for i in removed:
        assert h.remove(handles[i]) is False
    keep = sorted(((i * 37) % 1000, i) for i in range(1000) if i not in removed)
    assert h.items() == [(float(d), i) for d, i in keep]
    # Handles of survivors still work after compaction.
    survivor = keep[len(keep) // 2][1]
    assert h.remove(handles[survivor])
    assert [x for _, x in drain(h)] == [i for _, i in keep if i != survivor]
