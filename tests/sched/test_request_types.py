"""``Timings`` and ``Request`` keep the dataclass behaviour users and the runtime rely on,
compiled (``cdef class``es, request.pxd) and interpreted (the same ``.py``): the
constructor's positions and defaults, ``repr``, field-wise ``==`` for ``Timings`` and
identity for ``Request``, writable fields, the ``latency``/``queueing`` properties, and a
new ``Future`` only where none was given."""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path

import pytest

from av_infer.sched.request import Priority, Request, Result, Timings

ROOT = Path(__file__).resolve().parents[2]


def test_timings_defaults_repr_eq_and_properties() -> None:
    t = Timings(1.0, received=0.5)
    assert (t.arrival, t.received, t.preempted, t.kernels_padded) == (1.0, 0.5, 0, 0)
    assert all(math.isnan(v) for v in (t.start, t.first_kernel_start, t.end, t.run_cpu))
    assert repr(t) == ("Timings(arrival=1.0, start=nan, first_kernel_start=nan, end=nan, "
                       "preempted=0, kernels_padded=0, received=0.5, run_cpu=nan)")
    t.start, t.end = 1.25, 3.0
    t.preempted += 1
    assert (t.latency, t.queueing, t.preempted) == (2.0, 0.25, 1)
    same = Timings(1.0, 1.25, math.nan, 3.0, 1, 0, 0.5, math.nan)
    assert same.start == 1.25 and same.end == 3.0
    u = Timings(1.0, 1.25, 2.0, 3.0, 1, 2, 0.5, 0.1)
    assert u == Timings(1.0, 1.25, 2.0, 3.0, 1, 2, 0.5, 0.1)
    assert u != Timings(1.0, 1.25, 2.0, 3.0, 1, 3, 0.5, 0.1)
    assert u != (1.0, 1.25, 2.0, 3.0, 1, 2, 0.5, 0.1)
    with pytest.raises(TypeError):
        hash(u)  # mutable and compared by value, as the dataclass was
    assert pickle.loads(pickle.dumps(u)) == u


def test_request_future_default_identity_and_fields() -> None:
    tm = Timings(0.0)
    r = Request(7, "m", {}, Priority.RT, "c", math.inf, False, tm)
    assert isinstance(r.future, Future) and not r.future.done()
    assert (r.stream, r.caller_runs, r.hard_deadline) == (-1, 0, math.inf)
    assert r.timings is tm
    none = Request(8, "m", {}, Priority.BE, "c", 2.0, True, Timings(0.0), None,
                   hard_deadline=3.0)
    assert none.future is None and none.hard_deadline == 3.0 and none.drop_late is True
    fut: Future = Future()
    none.future = fut
    none.stream, none.caller_runs, none.inputs = 2, 12345, {"x": 1}
    assert (none.future, none.stream, none.caller_runs, none.inputs) == (fut, 2, 12345, {"x": 1})
    twin = Request(7, "m", {}, Priority.RT, "c", math.inf, False, tm)
    assert r == r and r != twin  # identity, as the eq=False dataclass
    assert repr(r).startswith("Request(id=7, model='m', inputs={}, priority=<Priority.RT: 0>, ")


def test_result_reads_the_timings() -> None:
    tm = Timings(1.0, 1.5, 1.5, 2.0)
    res = Result(1, "m", "c", Priority.RT, {}, tm, deadline=2.5)
    assert res.deadline_met and res.timings.latency == 1.0 and res.timings.queueing == 0.5
    assert "timings=Timings(arrival=1.0" in repr(res)
    assert repr(res).startswith("Result(request_id=1, model='m', client='c', ")
    twin = Result(1, "m", "c", Priority.RT, {}, tm, deadline=2.5)  # (Timings' NaNs: same tm)
    assert res == twin and res != Result(2, "m", "c", Priority.RT, {}, tm)
    assert repr(pickle.loads(pickle.dumps(res))) == repr(res)
    with pytest.raises(TypeError):
        hash(res)
    late = Result(1, "m", "c", Priority.RT, {}, Timings(0.0, 0.0, 0.0, 3.0), deadline=2.0,
                  hard_deadline=4.0, kappa=0.8)
    assert not late.deadline_met and late.quality == pytest.approx(0.4)


def test_the_same_behaviour_interpreted() -> None:
    """This file's checks again with ``AV_INFER_INTERPRETED=1`` (the plain classes)."""
    code = ("import sys; import av_infer; from av_infer.sched import request; "
            "from av_infer._cy.compiled import is_compiled; "
            "assert not is_compiled(request), request.__file__; "
            "sys.path.insert(0, sys.argv[1]); import test_request_types as t; "
            "[f() for n, f in sorted(vars(t).items()) "
            " if n.startswith('test_') and n != 'test_the_same_behaviour_interpreted']")
    env = {**os.environ, "AV_INFER_INTERPRETED": "1"}
    proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
