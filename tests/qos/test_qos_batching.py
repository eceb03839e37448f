"""Paper 001 eq. 2 batching beside Rafiqi's threshold, selectable at runtime."""

from __future__ import annotations

import pytest

from av_infer import Runtime
from av_infer.batching import Eq2Batcher, RateWindow
from av_infer.errors import InvalidParameterError
from av_infer.model import zoo
from tests.qos.qos_util import SHAPES, x


def test_rate_window_slides() -> None:
    w = RateWindow(1.0)
    for i in range(100):
        w.observe(i / 100)
    assert w.rate(0.995) == pytest.approx(100.0)
    assert w.rate(1.5) == pytest.approx(49.0)  # arrivals in (0.5, 1.5]
    assert w.rate(10.0) == 0.0


def test_eq2_smallest_batch_that_keeps_up() -> None:
    b = Eq2Batcher((1, 2, 4, 8), alpha=0.5, beta=1.0, window=1.0)
    for i in range(100):
        b.observe_arrival(i / 100)
    d = lambda n: 0.01 * n  # noqa: E731 - D_B = 10 ms per request
    # B >= 0.5 * (0.01 B * 100) + 0.5 * N  <=>  B >= N
    assert [b.target(n, 0.995, d) for n in (1, 2, 3, 5, 8, 20)] == [1, 2, 4, 8, 8, 8]
    assert b.take(3, 0.995, d) == 3  # B = 4, but only 3 are queued
    assert b.take(0, 0.995, d) == 0
    # alpha = 1: only the arrivals during one batch count: B >= B -> 1
    b1 = Eq2Batcher((1, 2, 4, 8), alpha=1.0, window=1.0)
    b1.observe_arrival(0.5, 100)
    assert b1.target(50, 0.9, d) == 1
    # beta scales the target: beta = 2, N = 3 -> B >= 6 -> 8
    b2 = Eq2Batcher((1, 2, 4, 8), alpha=0.0, beta=2.0)
    assert b2.target(3, 0.0, d) == 8


@pytest.mark.parametrize("kw", [{"alpha": -0.1}, {"alpha": 1.1}, {"beta": 0.0},
                                {"window": 0.0}])
def test_eq2_bad_parameters(kw: dict) -> None:
    with pytest.raises(InvalidParameterError):
        Eq2Batcher((1, 2), **kw)


def _burst(rt: Runtime, n: int) -> list:
    futs = [rt.submit("dyn", x(i), client=f"c{i % 2}") for i in range(n)]
    rt.device.run()
    return futs


def test_modes_switch_at_runtime_and_answer_everything() -> None:
    rt = Runtime("sim", batching=True, max_batch=8, max_be_streams=1)
    rt.load_model("dyn", zoo.path("dynamic_cnn"), SHAPES)
    assert rt.stats()["batching"]["mode"] == "rafiqi"
    for mode in ("fixed", "eq2", "rafiqi"):
        rt.set_batching(True, mode=mode, params={"alpha": 0.5, "beta": 1.0})
        futs = _burst(rt, 20)
        assert all(f.result().outputs["logits"].shape == (1, 10) for f in futs)
        st = rt.stats()["batching"]
        assert st["mode"] == mode and st["deciders"]["dyn"]["mode"] == mode
    # fixed took everything queued behind the first request (at most 8 at once)
    rt.set_batching(True, mode="fixed")
    _burst(rt, 17)
    assert rt.stats()["batching"]["deciders"]["dyn"]["batches"] == {"1": 1, "8": 2}
    with pytest.raises(InvalidParameterError):
        rt.set_batching(True, mode="nope")
    with pytest.raises(InvalidParameterError):
        rt.set_batching(True, mode="eq2", params={"alpha": 2.0})
    with pytest.raises(InvalidParameterError):
        rt.set_batching(True, mode="eq2", params={"gamma": 1.0})
    for bad in ({"b_thrd": 0.5}, {"fixed_max": 0}, {"beta": "1"}, {"rate_window": -1.0}):
        with pytest.raises(InvalidParameterError):
            rt.set_batching(True, mode="eq2", params=bad)
    assert rt.stats()["batching"]["mode"] == "fixed"  # refusals changed nothing
    rt.close()


def test_eq2_batches_follow_the_load() -> None:
    """A steady trickle (one request per batch-1 latency) runs unbatched; a burst makes
    eq. 2 batch."""
    rt = Runtime("sim", batching=True, max_batch=8, max_be_streams=1, batch_mode="eq2")
    rt.load_model("dyn", zoo.path("dynamic_cnn"), SHAPES)
    lat = _burst(rt, 1)[0].result().timings.latency
    dev = rt.device
    t0 = dev.now()
    for k in range(20):
        dev.call_at(t0 + k * 2 * lat, lambda: rt.submit("dyn", x(), client="steady"))
    dev.run()
    assert rt.stats()["batching"]["deciders"]["dyn"]["batches"] == {"1": 21}
    _burst(rt, 30)
    batches = rt.stats()["batching"]["deciders"]["dyn"]["batches"]
    assert max(int(b) for b in batches) > 1
    rt.close()


def test_batch_plans_run_at_their_models_precision() -> None:
    """A batch plan is recompiled from the ONNX source: it takes the base plan's precision
    (an fp16 model's batches are fp16 too), not the compiler's default fp32."""
    from dataclasses import replace

    from av_infer.devices.sim import SimDevice
    from av_infer.sched.model_services import compile_batch_plans

    dev = SimDevice("h100")
    try:
        base = dev.compile(zoo.path("dynamic_cnn"), SHAPES, name="dyn")
        for precision in ("fp32", "fp16"):
            plans, why = compile_batch_plans(dev, "dyn", zoo.path("dynamic_cnn"), SHAPES,
                                             replace(base, precision=precision), [2, 4])
            assert why == "ok" and sorted(plans) == [2, 4]
            assert {p.precision for p in plans.values()} == {precision}
    finally:
        dev.close()
