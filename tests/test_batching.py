"""AdaptiveBatcher threshold dynamics and batch stacking (Rafiqi §3.3)."""

from __future__ import annotations

import numpy as np
import pytest

from av_infer.batching import AdaptiveBatcher, split_outputs, stack_inputs
from av_infer.errors import InvalidInputError, InvalidParameterError

Q = 0.005


def feed(b: AdaptiveBatcher, per_quantum: list[int], t0: float = 0.0) -> list[float]:
    """Arrivals spread evenly in each quantum; the threshold after each quantum."""
    out = []
    for q, c in enumerate(per_quantum):
        for i in range(c):
            b.observe_arrival(t0 + (q + (i + 0.5) / max(c, 1)) * Q)
        out.append(b.tick(t0 + (q + 1) * Q + 1e-9))
    return out


def test_rise_under_burst_is_gradual_and_capped() -> None:
    b = AdaptiveBatcher((1, 2, 4, 8), quantum=Q)
    ts = feed(b, [16] * 8)
    # t = 0.5 t + 0.5 c from 1: 8.5 capped to 8 at once when c = 16
    assert ts[0] == 8.0 and max(ts) == 8.0
    b = AdaptiveBatcher((1, 2, 4, 8), quantum=Q)
    ts = feed(b, [6] * 6)
    assert ts[0] == pytest.approx(3.5) and ts[1] == pytest.approx(4.75)
    assert all(x < y for x, y in zip(ts, ts[1:]))  # rises gradually towards 6
    assert ts[-1] < 6.0


def test_fast_fall_when_load_stops() -> None:
    b = AdaptiveBatcher((1, 2, 4, 8, 16), quantum=Q)
    feed(b, [32] * 6)
    assert b.threshold == 16.0
    ts = feed(b, [0, 0, 0, 0, 0], t0=6 * Q)
    assert ts == [8.0, 4.0, 2.0, 1.0, 1.0]
    # lazy catch-up over many idle quanta in one call
    b2 = AdaptiveBatcher((1, 2, 4, 8, 16), quantum=Q)
    feed(b2, [32] * 6)
    assert b2.tick(6 * Q + 100 * Q) == 1.0


def test_fall_when_fewer_than_threshold() -> None:
    b = AdaptiveBatcher((1, 2, 4, 8), quantum=Q)
    feed(b, [8] * 5)
    t = b.threshold
    (t2,) = feed(b, [int(t) - 1], t0=5 * Q)
    assert t2 == pytest.approx(max(1.0, t / 2))


def test_take_uses_compiled_sizes() -> None:
    b = AdaptiveBatcher((1, 2, 4, 8), quantum=Q)
    assert b.take(0, 0.0) == 0
    assert b.take(10, 0.0) == 1  # t = 1 at start: no batching without load
    feed(b, [16] * 4)
    now = 4 * Q + 1e-9
    assert b.take(100, now) == 8
    assert b.take(7, now) == 4  # largest compiled size <= 7
    assert b.take(3, now) == 2
    assert b.take(1, now) == 1
    b.set_batch_sizes((1, 2))
    assert b.threshold == 2.0 and b.take(100, now) == 2
    assert b.stats()["batches"][8] == 1


def test_bad_parameters() -> None:
    with pytest.raises(InvalidParameterError):
        AdaptiveBatcher((0, 2))
    with pytest.raises(InvalidParameterError):
        AdaptiveBatcher(quantum=0)
    assert AdaptiveBatcher((4, 2)).batch_sizes == (1, 2, 4)


def test_stack_and_split_roundtrip() -> None:
    rng = np.random.default_rng(0)
    reqs = [{"x": rng.standard_normal((1, 3, 4)).astype(np.float32),
             "m": np.array([[i]], dtype=np.int64)} for i in range(3)]
    s = stack_inputs(reqs, 4)
    assert s["x"].shape == (4, 3, 4) and s["m"].dtype == np.int64
    assert np.all(s["x"][3] == 0)  # zero padding
    outs = split_outputs({"y": s["x"] * 2, "m": s["m"]}, 3)
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(o["y"], reqs[i]["x"] * 2)
        assert o["m"][0, 0] == i
    with pytest.raises(InvalidInputError):
        stack_inputs(reqs, 2)
    with pytest.raises(InvalidInputError):
        stack_inputs([reqs[0], {"x": reqs[1]["x"].astype(np.float64), "m": reqs[1]["m"]}], 2)


# -- through the Runtime ----------------------------------------------------------------------
def _dyn_inputs(i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(i)
    return {"input": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}


def test_runtime_batches_be_and_answers_individually() -> None:
    from av_infer import Runtime
    from av_infer.kernels.cpu import CpuPlanRunner
    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    shapes = {"input": (1, 3, 16, 16)}
    ref_plan = compile_model(zoo.path("dynamic_cnn"), shapes, name="ref")
    runner = CpuPlanRunner(ref_plan)
    # a quantum that never ends and a threshold at the cap: batching does not depend on
    # wall-clock timing here (the dynamics are tested above and on the simulator)
    with Runtime("cpu", batching=True, batch_quantum=1e6, max_be_streams=1) as rt:
        rt.load_model("dyn", zoo.path("dynamic_cnn"), shapes)
        rt._services.batchers["dyn"].threshold = 8.0
        futs = []
        for wave in range(20):
            futs += [rt.submit("dyn", _dyn_inputs(wave * 8 + i), client=f"c{i % 3}")
                     for i in range(8)]
        for i, f in enumerate(futs):
            out = f.result(timeout=60).outputs
            np.testing.assert_allclose(out["logits"], runner.run(_dyn_inputs(i))["logits"],
                                       rtol=1e-4, atol=1e-5)
            assert out["logits"].shape == (1, 10)
        s = rt.stats()
    assert s["batching"]["availability"]["dyn"] == "batch sizes 1, 2, 4, 8"
    assert s["batching"]["batch_tasks"] > 0


def test_static_batch_model_is_not_batched() -> None:
    from av_infer import Runtime
    from av_infer.model import zoo

    with Runtime("cpu", batching=True) as rt:
        rt.load_model("cnn", zoo.path("tiny_cnn"))
        assert rt.stats()["batching"]["availability"]["cnn"].startswith("unavailable")
        x = zoo.sample_inputs("tiny_cnn")
        assert all(f.result(timeout=60) for f in [rt.submit("cnn", x) for _ in range(4)])


def test_sim_batching_raises_be_throughput_deterministically() -> None:
    """sim device, closed-loop BE clients on dynamic_cnn: batching on vs off."""
    from av_infer import Runtime
    from av_infer.model import zoo

    def run(batching: bool) -> tuple[int, dict]:
        rt = Runtime("sim", batching=batching, max_be_streams=1)
        rt.load_model("dyn", zoo.path("dynamic_cnn"), {"input": (1, 3, 16, 16)})
        dev = rt.device
        done = [0]
        horizon = 0.05

        def loop(i: int) -> None:
            def again(_f: object) -> None:
                done[0] += 1
                if dev.now() < horizon:
                    loop(i)
            rt.submit("dyn", _dyn_inputs(0), client=f"c{i}").add_done_callback(again)

        for i in range(16):
            dev.call_at(0.0, lambda i=i: loop(i))
        dev.run()
        st = rt.stats()
        rt.close()
        return done[0], st

    n_off, _ = run(False)
    n_on, st = run(True)
    assert st["batching"]["batch_tasks"] > 0
    assert n_on > n_off
    assert (n_on, n_off) == (run(True)[0], run(False)[0])  # deterministic
