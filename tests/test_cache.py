"""ModelCache: LRU order, pinning, budget, refusal, concurrency (Rafiqi §3.4)."""

from __future__ import annotations

import random
import threading
from concurrent.futures import Future

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from av_infer.cache import ModelCache
from av_infer.errors import InvalidParameterError, ModelTooLargeError, UnknownModelError
from av_infer.model.plan import Buffer, Plan

MB = 1 << 20


def plan(name: str, nbytes: int) -> Plan:
    return Plan(name=name, kernels=[], tensors={}, buffers={0: Buffer(0, nbytes, "weight")},
                inputs=[], outputs=[])


class FakeDevice:
    """load/unload/resident_bytes only; tracks what is physically resident.

    ``measured`` overrides the size a load reports (to test estimate != measurement).
    """

    name = "fake"

    def __init__(self, measured: dict[str, int] | None = None, free: int | None = None,
                 delay: float = 0.0) -> None:
        self.measured = measured or {}
        self.free = free
        self.delay = delay
        self.loaded: dict[int, tuple[str, int]] = {}
        self.peak = 0
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.lock = threading.Lock()
        self._n = 0

    def load_plan(self, p: Plan) -> int:
        if self.delay:
            threading.Event().wait(self.delay)
        with self.lock:
            self._n += 1
            size = self.measured.get(p.name, p.weight_bytes)
            self.loaded[self._n] = (p.name, size)
            self.peak = max(self.peak, self.physical())
            self.loads.append(p.name)
            return self._n

    def unload_plan(self, h: int) -> None:
        with self.lock:
            name, _ = self.loaded.pop(h)
            self.unloads.append(name)

    def resident_bytes(self, h: int) -> int:
        return self.loaded[h][1]

    def physical(self) -> int:
        return sum(s for _, s in self.loaded.values())

    def telemetry(self) -> dict:
        return {"device": "fake", "memory_free_bytes": self.free}


def manual(dev: FakeDevice, budget: int | None, cap: int | None = None) -> ModelCache:
    return ModelCache(dev, budget, cap, mode="manual")  # type: ignore[arg-type]


def test_hit_miss_and_lru_order() -> None:
    dev = FakeDevice()
    c = manual(dev, 3 * MB)
    for n in "abcd":
        c.register(n, plan(n, MB))
    for n in "abc":
        f = c.ensure_resident(n)
        assert not f.done()  # a miss waits for the loader
        c.run_pending()
        assert f.result(0) is not None
    assert c.stats()["resident_models"] == ["a", "b", "c"]
    assert c.ensure_resident("a").done()  # hit: done at once, touches LRU
    assert c.stats()["resident_models"] == ["b", "c", "a"]
    c.ensure_resident("d")
    c.run_pending()
    s = c.stats()
    assert s["resident_models"] == ["c", "a", "d"]  # b was least recently used
    assert dev.unloads == ["b"]
    assert (s["hits"], s["misses"], s["loads"], s["evictions"]) == (1, 4, 4, 1)
    assert s["resident_bytes"] == 3 * MB


def test_cap_on_models() -> None:
    dev = FakeDevice()
    c = manual(dev, None, cap=2)
    for n in "abc":
        c.register(n, plan(n, 10))
        c.ensure_resident(n)
        c.run_pending()
    assert c.stats()["resident_models"] == ["b", "c"]


def test_pinned_never_evicted_and_in_use_not_evicted() -> None:
    dev = FakeDevice()
    c = manual(dev, 3 * MB)
    c.register("rt", plan("rt", MB), pin=True)  # loaded at registration
    assert c.is_resident("rt")
    for n in "abc":
        c.register(n, plan(n, MB))
    c.ensure_resident("a")
    c.run_pending()
    assert c.retain("a") is not None  # a is in use
    fb = c.ensure_resident("b")
    c.run_pending()
    assert fb.done()
    fc = c.ensure_resident("c")  # needs a victim: b (a in use, rt pinned)
    c.run_pending()
    assert fc.done() and dev.unloads == ["b"]
    fb = c.ensure_resident("b")  # victims: c only (a in use): fine
    c.run_pending()
    assert fb.done() and dev.unloads == ["b", "c"]
    c.retain("b")
    fc = c.ensure_resident("c")  # no victim at all now: waits, is not refused
    c.run_pending()
    assert not fc.done()
    c.release("a")
    c.run_pending()
    assert fc.result(0) is not None and dev.unloads[-1] == "a"
    assert c.is_resident("rt")
    assert c.stats()["pinned_bytes"] == MB


def test_pinned_release_keeps_hold_and_lru_and_wakes_no_loader() -> None:
    """A pinned model's retain/release (every RT request) still counts, holds and touches
    the LRU order, but its release frees no room, so it does not wake the loader even while
    a load waits for room; the release of the unpinned model in use does."""
    dev = FakeDevice()
    c = manual(dev, 2 * MB)
    c.register("rt", plan("rt", MB), pin=True)
    c.register("a", plan("a", MB))
    c.register("b", plan("b", MB))
    c.ensure_resident("a")
    c.run_pending()
    assert c.retain("a") is not None  # a in use, rt pinned: b has no victim
    fb = c.ensure_resident("b")
    c.run_pending()
    assert not fb.done()
    assert c.retain("rt", True) is not None
    assert c.stats()["models"]["rt"]["in_use"] == 1
    assert c.stats()["resident_models"] == ["a", "rt"]  # retain touched the LRU order
    with pytest.raises(InvalidParameterError, match="in use"):
        c.unregister("rt")  # held: never unloaded mid-request
    c._dirty = False
    c.release("rt")
    assert not c._dirty  # nothing for the loader: rt may not go
    assert c.run_pending() == 0 and not fb.done()
    assert c.stats()["models"]["rt"]["in_use"] == 0 and c.stats()["hits"] == 1
    c.release("a")
    assert c._dirty  # a may go now: the waiting load gets its room
    c.run_pending()
    assert fb.result(0) is not None and dev.unloads == ["a"]
    c.register("c", plan("c", MB))
    c.unpin("rt")
    c.retain("rt")
    c.retain("b")
    fc = c.ensure_resident("c")
    c.run_pending()
    assert not fc.done()  # rt and b in use
    c._dirty = False
    c.release("rt")  # unpinned now: its release makes room again
    assert c._dirty
    c.run_pending()
    assert fc.result(0) is not None and dev.unloads == ["a", "rt"]


def test_oversized_refused_with_clear_message() -> None:
    dev = FakeDevice()
    c = manual(dev, 4 * MB)
    c.register("rt", plan("rt", 3 * MB), pin=True)
    c.register("big", plan("big", 2 * MB))
    f = c.ensure_resident("big")
    c.run_pending()
    with pytest.raises(ModelTooLargeError) as ei:
        f.result(0)
    msg = str(ei.value)
    assert "big" in msg and "budget" in msg and "pinned" in msg and "2.00 MiB" in msg
    with pytest.raises(ModelTooLargeError):
        c.register("rt2", plan("rt2", 2 * MB), pin=True)
    assert "rt2" not in c.stats()["models"]
    with pytest.raises(UnknownModelError):
        c.ensure_resident("nope")
    with pytest.raises(UnknownModelError, match="not registered"):
        c.retain("nope")  # the request path's look-up refuses as ensure_resident does


def test_measured_size_larger_than_estimate() -> None:
    # the plan says 1 MiB but the device holds 2 MiB: the cache trusts the measurement
    dev = FakeDevice(measured={"x": 2 * MB})
    c = manual(dev, 3 * MB)
    for n in "ab":
        c.register(n, plan(n, MB))
        c.ensure_resident(n)
        c.run_pending()
    c.register("x", plan("x", MB))
    f = c.ensure_resident("x")
    c.run_pending()
    assert f.result(0) is not None
    assert c.resident_bytes() <= 3 * MB
    assert c.stats()["models"]["x"]["bytes"] == 2 * MB
    assert dev.unloads == ["a"]


def test_measured_too_large_is_refused() -> None:
    dev = FakeDevice(measured={"x": 5 * MB})
    c = manual(dev, 3 * MB)
    c.register("x", plan("x", MB))
    f = c.ensure_resident("x")
    c.run_pending()
    with pytest.raises(ModelTooLargeError):
        f.result(0)
    assert dev.loaded == {}


def test_set_budget_and_cap() -> None:
    dev = FakeDevice()
    c = manual(dev, 4 * MB)
    c.register("rt", plan("rt", MB), pin=True)
    for n in "abc":
        c.register(n, plan(n, MB))
        c.ensure_resident(n)
        c.run_pending()
    c.retain("a")
    c.set_budget(2 * MB)  # b, c go; a is in use; rt pinned
    c.run_pending()
    assert c.stats()["resident_models"] == ["rt", "a"]
    with pytest.raises(InvalidParameterError, match="pinned"):
        c.set_budget(MB // 2)
    c.set_budget(MB)  # over until a is released
    c.run_pending()
    assert c.is_resident("a")
    c.release("a")
    c.run_pending()
    assert c.stats()["resident_models"] == ["rt"]
    assert c.budget == MB
    c.set_budget(None)
    with pytest.raises(InvalidParameterError):
        c.set_max_models(0)
    with pytest.raises(InvalidParameterError):
        c.release("a")  # not retained


def test_default_budget_from_telemetry() -> None:
    assert ModelCache(FakeDevice(free=123), mode="manual").budget == 123  # type: ignore[arg-type]
    assert ModelCache(FakeDevice(), mode="manual").budget is None  # type: ignore[arg-type]


def test_inline_mode_loads_in_caller() -> None:
    dev = FakeDevice()
    c = ModelCache(dev, 2 * MB, mode="inline")  # type: ignore[arg-type]
    for n in "abc":
        c.register(n, plan(n, MB))
        assert c.ensure_resident(n).done()
    assert c.acquire("c") is not None
    c.release("c")
    assert c.stats()["resident_models"] == ["b", "c"]


def test_load_error_reaches_every_waiter() -> None:
    class Broken(FakeDevice):
        def load_plan(self, p: Plan) -> int:
            raise RuntimeError("boom")

    c = manual(Broken(), MB)
    c.register("a", plan("a", 10))
    fs = [c.ensure_resident("a") for _ in range(3)]
    c.run_pending()
    for f in fs:
        with pytest.raises(RuntimeError, match="boom"):
            f.result(0)
    assert c.stats()["load_errors"] == 1


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=2, max_size=6),
    extra=st.lists(st.integers(0, 3), min_size=6, max_size=6),
    budget=st.integers(4, 14),
    cap=st.one_of(st.none(), st.integers(1, 4)),
    ops=st.lists(st.tuples(st.sampled_from(["ensure", "retain", "release", "run", "budget"]),
                           st.integers(0, 5), st.integers(3, 14)), max_size=60),
)
def test_budget_never_exceeded(sizes: list[int], extra: list[int], budget: int,
                               cap: int | None, ops: list[tuple[str, int, int]]) -> None:
    names = [f"m{i}" for i in range(len(sizes))]
    # measured sizes may exceed the plan's estimate
    dev = FakeDevice(measured={n: s + extra[i] for i, (n, s) in enumerate(zip(names, sizes))})
    c = manual(dev, budget, cap)
    for n, s in zip(names, sizes):
        c.register(n, plan(n, s))
    held: list[str] = []
    futures: list[Future] = []
    for op, i, b in ops:
        n = names[i % len(names)]
        if op == "ensure":
            futures.append(c.ensure_resident(n))
        elif op == "retain":
            if c.retain(n) is not None:
                held.append(n)
        elif op == "release" and held:
            c.release(held.pop(i % len(held)))
        elif op == "run":
            c.run_pending()
        elif op == "budget":
            c.set_budget(b)
            budget = b
        c.run_pending()
        st_ = c.stats()
        in_use = sum(st_["models"][m]["bytes"] for m in set(held))
        # the accounted bytes never exceed the budget unless in-use models force it (after
        # a shrink), and what the device holds is what the cache accounts for
        assert st_["resident_bytes"] <= max(budget, in_use)
        assert dev.physical() == st_["resident_bytes"]
        if cap is not None:
            assert len(st_["resident_models"]) <= max(cap, len(set(held)))
    for n in held:
        c.release(n)
    c.run_pending()
    assert c.resident_bytes() <= budget
    # every future resolved: a handle, or a refusal when the model can never fit
    for f in futures:
        assert f.done()
        if f.exception() is not None:
            assert isinstance(f.exception(), ModelTooLargeError)


def test_no_request_lost_under_concurrent_traffic() -> None:
    """5 models, room for 4, threads hammering acquire/release while the loader works."""
    dev = FakeDevice(delay=0.0005)
    c = ModelCache(dev, 4 * MB, mode="thread")  # type: ignore[arg-type]
    names = [f"m{i}" for i in range(5)]
    for n in names:
        c.register(n, plan(n, MB))
    errors: list[BaseException] = []
    done = [0]
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(60):
                n = rng.choice(names)
                h = c.acquire(n, timeout=10)
                assert dev.loaded[h][0] == n  # the handle is live while held
                c.release(n)
                with lock:
                    done[0] += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    # futures path too: ask for every model at once, every future must resolve
    fs = [c.ensure_resident(n) for n in names for _ in range(3)]
    for f in fs:
        assert f.result(10) is not None
    c.close()
    assert not errors, errors[0]
    assert done[0] == 6 * 60
    assert dev.peak <= 4 * MB
    s = c.stats()
    assert s["evictions"] > 0 and s["loads"] >= 5


# -- through the Runtime ----------------------------------------------------------------------
def test_runtime_serves_more_models_than_fit() -> None:
    """cpu device, room for 2 of 3 BE models + a pinned RT model: every request answered
    with the right outputs, evictions counted, the RT model never evicted."""
    import numpy as np

    from av_infer import Runtime
    from av_infer.kernels.cpu import CpuPlanRunner
    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    x = zoo.sample_inputs("tiny_cnn")
    plans = {f"m{i}": compile_model(zoo.path("tiny_cnn"), name=f"m{i}") for i in range(3)}
    ref = CpuPlanRunner(plans["m0"]).run(x)
    with Runtime("cpu", cache_max_models=3) as rt:
        rt.load_model("rt", compile_model(zoo.path("tiny_cnn"), name="rt"), pin=True)
        for n, p in plans.items():
            rt.load_model(n, p)
        rt.configure_client("cam", "RT", soft_deadline=10.0, hard_deadline=20.0)
        futs = [rt.submit(f"m{i % 3}", x, client=f"c{i % 2}") for i in range(30)]
        futs += [rt.submit("rt", x, client="cam") for _ in range(5)]
        for f in futs:
            out = f.result(timeout=60).outputs
            for k in ref:
                np.testing.assert_allclose(out[k], ref[k], rtol=1e-5, atol=1e-6)
        s = rt.stats()
    c = s["cache"]
    assert c["evictions"] > 0 and c["models"]["rt"]["pinned"]
    assert "rt" in c["resident_models"] and len(c["resident_models"]) <= 3
    assert c["hits"] + c["misses"] >= 35
    assert s["utility"]["cam"]["count"] == 5 and s["utility"]["cam"]["mean_utility"] == 1.0


def test_runtime_refuses_model_too_large_and_budget_setter() -> None:
    from av_infer import Runtime
    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    p = compile_model(zoo.path("tiny_cnn"), name="a")
    with Runtime("cpu", cache_budget=p.weight_bytes // 2) as rt:
        with pytest.raises(ModelTooLargeError, match="budget"):
            rt.load_model("a", p)
        rt.set_cache_budget(p.weight_bytes * 4)
        rt.load_model("a", p, pin=True)
        with pytest.raises(InvalidParameterError):
            rt.set_cache_budget(p.weight_bytes // 2)
        assert rt.model_info("a").resident_bytes == p.weight_bytes
