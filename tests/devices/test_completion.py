"""``Completion`` (devices/completion.py): the dataclass's behaviour, compiled and
interpreted alike (the record is a ``cdef class`` where built, completion.pxd)."""

from __future__ import annotations

import json

from av_infer._cy.compiled import is_compiled
from av_infer.devices import completion
from av_infer.devices.base import Completion
from tests.checks import run_in_form

#: run by this process (compiled) and by an interpreted one; prints what it saw
PROBE = r'''
import dataclasses, json, math, pickle, sys
import av_infer
from av_infer.devices.base import Completion
from av_infer.devices.completion import FIELDS
out = {}
c = Completion(1, 7, 2, True, 0.5, 1.5)
out["fields"] = [repr(getattr(c, f)) for f in FIELDS]
out["eq"] = [c == Completion(1, 7, 2, True, 0.5, 1.5), c != Completion(1, 7, 2, False, 0.5, 1.5),
             c == Completion(1, 7, 2, True, 0.5, 1.5, t_stop=0.7), c == (1, 7)]
out["hash"] = hash(c) == hash(Completion(1, 7, 2, True, 0.5, 1.5))
out["repr"] = repr(c)
out["pickle"] = pickle.loads(pickle.dumps(c)) == c
refused = []
for name in ("stream", "t_end", "new"):
    try:
        setattr(c, name, 3)
    except dataclasses.FrozenInstanceError:
        refused.append(name)
try:
    del c.task
except dataclasses.FrozenInstanceError:
    refused.append("del")
out["refused"] = refused
k = Completion(0, 3, 4, None, 1.0, 2.0, count=2, times=(1.0, 1.5, 1.5, 2.0))
out["singles"] = [repr(s) for s in k.singles()]
out["int_times"] = repr(Completion(0, 1, 0, True, 1, 2).t_start)
print(json.dumps(out))
'''


def _probe(interpreted: bool) -> dict:
    return json.loads(run_in_form(PROBE, ("devices.completion",), interpreted))


def test_the_record_is_compiled_here_and_behaves_like_the_dataclass() -> None:
    assert is_compiled(completion), completion.__file__
    got = _probe(False)
    assert got["fields"] == ["1", "7", "2", "True", "0.5", "1.5", "()", "nan", "nan", "1", "()"]
    assert got["eq"] == [True, True, False, False]
    assert got["hash"] and got["pickle"]
    assert got["refused"] == ["stream", "t_end", "new", "del"]
    assert got["singles"] == [
        "Completion(stream=0, task=3, kernel=4, executed=None, t_start=1.0, t_end=1.5, "
        "parts=(), t_stop=nan, cpu_s=nan, count=1, times=())",
        "Completion(stream=0, task=3, kernel=5, executed=None, t_start=1.5, t_end=2.0, "
        "parts=(), t_stop=nan, cpu_s=nan, count=1, times=())"]
    assert got["int_times"] == "1.0"


def test_compiled_and_interpreted_records_agree() -> None:
    assert _probe(True) == _probe(False)


def test_a_nan_time_equals_a_nan_time() -> None:
    """Records from different devices carry different NaN objects; they compare equal (the
    dataclass relied on one shared NaN object for that)."""
    a = Completion(0, 1, 0, True, 0.0, 1.0, t_stop=float("nan"))
    b = Completion(0, 1, 0, True, 0.0, 1.0, cpu_s=float("nan"))
    assert a == b and hash(a) == hash(b)
