"""The model-cache hooks (``ModelServices``, sched/model_services.py, over ``ModelCache``,
cache.py): what the scheduler's ``acquire``/``release`` calls keep observable, compiled
(``cdef class``es, model_services.pxd and cache.pxd) and interpreted alike.

One scenario runs in a compiled process and in an interpreted one (``AV_INFER_INTERPRETED=1``)
and prints what it saw: the refcount that keeps a model in use from being unregistered
mid-request, hit/miss counters (a parked task's second look is not a new hit), the LRU
order and the eviction order after ``unpin``, tasks parked while their model loads (one
loader wake-up per load, the parked tasks handed back together, a failed load handed back
with its error), an unload while in use deferred to the last release, and the errors of
the cache's own ``retain``/``release``.
"""

from __future__ import annotations

import json

from av_infer import cache
from av_infer._cy.compiled import PURE_MODULES, is_compiled
from av_infer.sched import model_services
from tests.checks import run_in_form

#: run by a compiled and by an interpreted process; prints what it saw
PROBE = r'''
import json
import av_infer
from av_infer.cache import ModelCache
from av_infer.errors import InvalidParameterError, UnknownModelError
from av_infer.model.plan import Buffer, Plan
from av_infer.sched.model_services import ModelServices
from av_infer.sched.request import Priority, Request, Timings
from av_infer.sched.scheduler import ModelEntry, Task

MB = 1 << 20


class Dev:
    name = "fake"

    def __init__(self):
        self.n, self.loaded, self.unloads, self.fail = 0, {}, [], set()

    def load_plan(self, p):
        if p.name in self.fail:
            raise RuntimeError(f"cannot load {p.name}")
        self.n += 1
        self.loaded[self.n] = p.name
        return self.n

    def unload_plan(self, h):
        self.unloads.append(self.loaded.pop(h))

    def resident_bytes(self, h):
        return MB

    def telemetry(self):
        return {}


def plan(n):
    return Plan(name=n, kernels=[], tensors={}, buffers={0: Buffer(0, MB, "weight")},
                inputs=[], outputs=[])


def err(fn, *a):
    try:
        fn(*a)
    except Exception as e:  # noqa: BLE001
        return type(e).__name__
    return None


out = {}
dev = Dev()
c = ModelCache(dev, 2 * MB, mode="manual")
wakes, ready = [], []
svc = ModelServices(c, wakes.append, lambda ts, e: ready.append(
    ([t.tid for t in ts], type(e).__name__ if e is not None else None)))
c.register("rt", plan("rt"), pin=True)
for n in ("a", "b", "bad", "d"):
    c.register(n, plan(n))
dev.fail.add("bad")
entries = {n: ModelEntry(n, plan(n), None) for n in ("rt", "a", "b", "bad", "d")}


def task(i, n, rt=False):
    return Task(Request(i, n, {}, Priority.RT if rt else Priority.BE, "c", float("inf"),
                        False, Timings(0.0)), entries[n], 0)


def snap(key):
    s = c.stats()
    out[key] = {"hits": s["hits"], "misses": s["misses"], "loads": s["loads"],
                "load_errors": s["load_errors"], "evictions": s["evictions"],
                "lru": s["resident_models"], "pending": s["pending_loads"],
                "in_use": {k: v["in_use"] for k, v in s["models"].items()},
                "parked": svc.parked(), "wakes": len(wakes), "ready": list(ready),
                "unloads": list(dev.unloads)}


def wake_all():
    while wakes:
        wakes.pop(0)()


t1 = task(1, "rt", True)
out["t1"] = svc.acquire(t1)
out["unregister_held"] = err(c.unregister, "rt")  # held: never unloaded mid-request
t2, t3 = task(2, "a"), task(3, "a")
out["parked"] = [svc.acquire(t2), svc.acquire(t3)]  # not resident: both parked
snap("parked_snap")
c.run_pending()  # loads a; the one callback asks for one wake-up
snap("loaded")
wake_all()  # both handed back together
out["second_look"] = [svc.acquire(t2), svc.acquire(t3)]  # not counted again
snap("held")
svc.release(t1)
svc.release(task(99, "a"))  # holds nothing: nothing happens
t4 = task(4, "b")
out["t4"] = svc.acquire(t4)  # no room: a held twice, rt pinned
c.run_pending()
snap("waits_for_room")
svc.unload(entries["a"])  # in use: deferred to its last release
out["a_after_unload"] = "a" in c.stats()["models"]
svc.release(t2)
out["a_after_one_release"] = "a" in c.stats()["models"]
svc.release(t3)
out["a_after_last_release"] = "a" in c.stats()["models"]
c.run_pending()  # b gets a's room
wake_all()
snap("b_loaded")
out["t4_again"] = svc.acquire(t4)
svc.release(t4)
c.set_budget(3 * MB)
t5 = task(5, "bad")
out["t5"] = svc.acquire(t5)
c.run_pending()  # the load fails: handed back with its error
wake_all()
snap("bad")
c.set_budget(2 * MB)
c.unpin("rt")
out["lru_before_d"] = c.stats()["resident_models"]
t6 = task(6, "d")
out["t6"] = svc.acquire(t6)
c.run_pending()  # evicts the least recently used of rt and b
wake_all()
snap("d_loaded")
out["t6_again"] = svc.acquire(t6)
out["t7"] = svc.acquire(task(7, "bad"))
out["taken"] = [t.tid for t in svc.take_parked()]
out["parked_after_take"] = svc.parked()
out["errors"] = [err(c.release, "rt"), err(c.release, "zz"), err(c.retain, "zz"),
                 err(c.retain, "zz", True)]
out["retain_host"] = [c.retain("rt", True), c.stats()["misses"]]  # evicted: a miss
e = c._entries["d"]
out["entry"] = [e.name, e.state, e.refs, e.expected, e.pinned, e.gone, e.loads,
                repr(e).startswith("_Entry(name='d', plan=")]
svc.batching = 1
out["batching"] = [svc.batching, svc.batched_requests, svc.batch_tasks]
print(json.dumps(out))
'''


def _probe(interpreted: bool) -> dict:
    return json.loads(run_in_form(PROBE, ("cache", "sched.model_services"), interpreted))


def test_the_hooks_are_compiled_here_and_keep_every_observable() -> None:
    assert {"cache", "sched.model_services"} <= set(PURE_MODULES)
    assert is_compiled(cache) and is_compiled(model_services), model_services.__file__
    got = _probe(False)
    assert got["t1"] == 1 and got["unregister_held"] == "InvalidParameterError"
    assert got["parked"] == [None, None]
    p = got["parked_snap"]
    assert p["parked"] == 2 and p["wakes"] == 0 and p["pending"] == ["a"]
    assert (p["hits"], p["misses"]) == (1, 2)
    assert got["loaded"]["wakes"] == 1 and got["loaded"]["parked"] == 2  # one wake-up
    assert got["held"]["ready"] == [[[2, 3], None]] and got["held"]["parked"] == 0
    assert got["second_look"] == [2, 2]
    h = got["held"]
    assert (h["hits"], h["misses"]) == (1, 2)  # a parked task's second look: no new hit
    assert h["in_use"] == {"rt": 1, "a": 2, "b": 0, "bad": 0, "d": 0}
    assert h["lru"] == ["rt", "a"]
    assert got["t4"] is None and got["waits_for_room"]["pending"] == ["b"]
    assert got["a_after_unload"] and got["a_after_one_release"]
    assert not got["a_after_last_release"]
    b = got["b_loaded"]
    assert b["ready"][-1] == [[4], None] and b["lru"] == ["rt", "b"] and b["unloads"] == ["a"]
    assert got["t5"] is None and got["bad"]["ready"][-1] == [[5], "RuntimeError"]
    assert got["bad"]["load_errors"] == 1
    assert got["t4_again"] == 3
    assert got["lru_before_d"] == ["rt", "b"]
    d = got["d_loaded"]
    assert d["unloads"] == ["a", "rt"] and d["lru"] == ["b", "d"]  # rt least recent
    assert d["in_use"] == {"rt": 0, "b": 0, "bad": 0, "d": 0} and d["ready"][-1] == [[6], None]
    assert got["t6_again"] == 4
    assert got["t7"] is None and got["taken"] == [7] and got["parked_after_take"] == 0
    assert got["errors"] == ["InvalidParameterError", "InvalidParameterError",
                             "UnknownModelError", "UnknownModelError"]
    assert got["retain_host"] == [None, 7]
    assert got["entry"] == ["d", "resident", 1, 1 << 20, False, False, 1, True]
    assert got["batching"] == [True, 0, 0]


def test_compiled_and_interpreted_hooks_agree() -> None:
    assert _probe(True) == _probe(False)
