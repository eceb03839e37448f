"""``Policy`` (sched/policies.py), ``Stats``/``ClientStats`` (sched/stats.py) and the
client/priority validators (request_options.py) are compiled where built (``cdef
class``es and C functions the scheduler and the admission read directly); the same
sources run by the interpreter behave alike, and as the frozen dataclass, the Python
statistics and the inline checks they replace did."""

from __future__ import annotations

import json

from av_infer._cy.compiled import is_compiled
from av_infer.sched import policies, stats
from tests.checks import run_in_form

#: run by a compiled and an interpreted process; prints what it saw
PROBE = r'''
import dataclasses, json, pickle
import av_infer
from av_infer.errors import InvalidParameterError
from av_infer.request_options import check_client, parse_priority
from av_infer.sched.policies import FIELDS, POLICIES, Policy, get_policy
from av_infer.sched.request import Priority
from av_infer.sched.stats import MAX_CLIENTS, OTHER_CLIENTS, Stats
out = {}
p = POLICIES["streams"]
out["repr"] = repr(p)
out["fields"] = [repr(getattr(p, f)) for f in FIELDS]
out["derived"] = {n: [q.be_concurrent_with_rt, q.preempts, q.waits]
                  for n, q in POLICIES.items()}
same = Policy("streams", True, False, False, "none", False,
              doc="RT and BE concurrently on plain streams of equal priority.")
out["eq"] = [p == same, p != same, p == POLICIES["reef"], p != POLICIES["reef"],
             p == "streams", hash(p) == hash(same), len({p, same, POLICIES["reef"]})]
out["pickle"] = [pickle.loads(pickle.dumps(q)) == q for q in POLICIES.values()]
out["get"] = get_policy(" REEF ") is POLICIES["reef"]
refused = []
for name in ("padding", "preempts", "new"):
    try:
        setattr(p, name, True)
    except dataclasses.FrozenInstanceError:
        refused.append(name)
try:
    del p.name
except dataclasses.FrozenInstanceError:
    refused.append("del")
out["refused"] = refused
out["padding_kw"] = [POLICIES["reef_dkp"].padding, POLICIES["reef"].padding]

s = Stats()
with s.lock:
    a = s.client("a", "RT")
    a.submitted += 2
    a.completed += 1
    a.latency.add(0.002)
    a.preemption_latency.add(0.001)
    a.errors["x"] = 1
    assert s.client("a", "BE") is a  # the first priority stays
    s.model("m")["submitted"] += 3
    for i in range(MAX_CLIENTS + 2):
        s.client(f"c{i}", "BE").failed += 1
    s.preemptions += 1
    s.be_grants += 2
    s.preemption_stop.add(0.0005)
    s.handler_errors["arrival"] = 1
snap = s.snapshot()
out["snap_keys"] = sorted(snap)
out["a"] = snap["clients"]["a"]
out["other"] = snap["clients"][OTHER_CLIENTS]
out["n_clients"] = len(snap["clients"])
out["models"] = snap["models"]
out["counters"] = [snap[k] for k in ("preemptions", "restores", "rt_switches",
                                     "padded_launches", "padded_blocks", "padded_kernels",
                                     "be_grants", "handler_errors")]
out["stop"] = snap["preemption_stop_ms"]

checks = []
for c in ("cam", "", 3, None):
    try:
        checks.append(check_client(c))
    except InvalidParameterError as e:
        checks.append(str(e))
for v in (Priority.RT, "be", " rt ", 0, 1, True, "XX", 2.0, None):
    try:
        checks.append(repr(parse_priority(v)))
    except InvalidParameterError as e:
        checks.append(str(e))
out["checks"] = checks
print(json.dumps(out))
'''


def _probe(interpreted: bool) -> dict:
    return json.loads(run_in_form(PROBE, ("sched.policies", "sched.stats", "request_options"),
                                  interpreted))


def test_compiled_here_and_both_forms_behave_as_before() -> None:
    assert is_compiled(policies), policies.__file__
    assert is_compiled(stats), stats.__file__
    got = _probe(False)
    # the frozen dataclass's repr, field for field (the derived fields not in it)
    assert got["repr"] == (
        "Policy(name='streams', accepts_be=True, exclusive=False, rt_high_priority=False, "
        "preempt='none', be_unbounded=False, available=True, padding=False, "
        "doc='RT and BE concurrently on plain streams of equal priority.')")
    assert got["derived"] == {
        "rt_only": [False, False, False], "seq": [False, False, False],
        "streams": [True, False, False], "prio_streams": [True, False, False],
        "wait": [False, True, True], "reef": [False, True, False],
        "reef_dkp": [False, True, False]}
    assert got["eq"] == [True, False, False, True, False, True, 2]
    assert all(got["pickle"]) and got["get"]
    assert got["refused"] == ["padding", "preempts", "new", "del"]
    assert got["padding_kw"] == [True, False]
    assert got["snap_keys"] == sorted([
        "models", "preemptions", "restores", "rt_switches", "padded_launches",
        "padded_blocks", "padded_kernels", "handler_errors", "be_grants", "clients",
        "preemption_stop_ms", "preemption_observed_ms", "preemption_stop_from_submit_ms"])
    a = got["a"]
    assert {k: a[k] for k in ("priority", "submitted", "completed", "failed",
                              "deadline_misses", "errors")} == {
        "priority": "RT", "submitted": 2, "completed": 1, "failed": 0, "deadline_misses": 0,
        "errors": {"x": 1}}
    assert round(a["latency_ms"]["max"], 9) == 2.0
    assert round(a["preemption_latency_ms"]["p50"], 9) == 1.0
    # 256 names counted by name (a and c0..c254), the rest together
    assert got["n_clients"] == 257 and got["other"]["failed"] == 3
    assert got["models"] == {"m": {"submitted": 3, "completed": 0, "failed": 0}}
    assert got["counters"] == [1, 0, 0, 0, 0, 0, 2, {"arrival": 1}]
    assert got["stop"]["count"] == 1
    assert got["checks"] == [
        "cam", "client must be a non-empty string, got ''",
        "client must be a non-empty string, got 3",
        "client must be a non-empty string, got None",
        "<Priority.RT: 0>", "<Priority.BE: 1>", "<Priority.RT: 0>", "<Priority.RT: 0>",
        "<Priority.BE: 1>", "priority must be 'RT', 'BE', 0 or 1, got True",
        "priority must be 'RT' or 'BE', got 'XX'",
        "priority must be 'RT', 'BE', 0 or 1, got 2.0",
        "priority must be 'RT', 'BE', 0 or 1, got None"]
    assert _probe(True) == got
