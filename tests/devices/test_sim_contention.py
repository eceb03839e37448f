"""Issue 13 in the simulator: memory-side contention, the faithful padded grid, quiet windows
(virtual time: exact assertions are valid)."""

from __future__ import annotations

import pytest

from av_infer.devices import sim_contention
from av_infer.devices.base import Completion
from av_infer.devices.sim import SimDevice
from av_infer.model.plan import Geometry, Kernel, Plan
from av_infer.profiles import GPUS, KernelProfile, ModelProfile
from av_infer.sched.rt_forecast import RtForecast

US = 1e-6
BW = GPUS["mi50"].bandwidth_gbs * 1e9


def plan_of(name: str, n: int, blocks: int, nbytes: int = 0) -> Plan:
    g = Geometry(grid=(blocks, 1, 1), block=(256, 1, 1))
    ks = [Kernel(i, "trace", f"k{i}", (), (), {}, g, bytes_moved=nbytes) for i in range(n)]
    return Plan(name=name, kernels=ks, tensors={}, buffers={}, inputs=[], outputs=[])


def prof_of(name: str, n: int, dur_us: float, blocks: int, bps: int = 1) -> ModelProfile:
    ks = [KernelProfile(i, f"k{i}", dur_us, blocks, 256, blocks_per_sm=bps) for i in range(n)]
    return ModelProfile(model=name, device="mi50", sms=60, kernels=ks)


def two_kernels(contention: str, nbytes: int) -> list[Completion]:
    """Two 30-block kernels (half the SMs each, no SM sharing) on two streams."""
    profs = {n: prof_of(n, 1, 100.0, 30) for n in "ab"}
    dev = SimDevice("mi50", profs, contention=contention, interference=0.0)
    done: list[Completion] = []
    dev.start(done.append)
    for i, n in enumerate("ab"):
        dev.new_task(dev.load_plan(plan_of(n, 1, 30, nbytes)), i)
        dev.enqueue(dev.open_stream(0), i, 0, 0)
    dev.run()
    return done


def test_models_are_named_and_validated_first() -> None:
    assert sim_contention.check_model("none") is None
    assert sim_contention.check_model("bandwidth") == 1.0
    assert sim_contention.check_model("calibrated", "h100") == 180.0
    assert sim_contention.check_model("beta=7") == 7.0
    for bad in ("fast", "beta=-1", "beta=x"):
        with pytest.raises(ValueError):
            sim_contention.check_model(bad)
    with pytest.raises(ValueError, match="dkp_placement"):
        SimDevice("mi50", dkp_placement="anywhere")


def test_slowdown_is_a_fair_share_of_an_oversubscribed_bus() -> None:
    assert sim_contention.slowdown(0.3, 0.5) == 1.0  # 0.8 of the bus: no slowdown
    assert sim_contention.slowdown(1.0, 1.0) == pytest.approx(2.0)  # two saturating kernels
    assert sim_contention.slowdown(0.5, 1.5) == pytest.approx(0.5 + 0.5 * 2.0)


def test_co_running_kernels_on_disjoint_sms_slow_each_other_only_with_contention() -> None:
    # 100 us alone; each moves 80 % of the bus's bytes in that time (q = 0.8 alone).
    nbytes = int(0.8 * BW * 100 * US)
    a, b = two_kernels("none", nbytes)
    assert a.t_end - a.t_start == pytest.approx(100 * US)
    assert b.t_end - b.t_start == pytest.approx(100 * US)
    a, b = two_kernels("bandwidth", nbytes)
    assert a.t_end - a.t_start == pytest.approx(100 * US)  # placed first: snapshot
    # b sees a's 0.8: its memory part gets 0.8 / 1.6 of the bus
    assert b.t_end - b.t_start == pytest.approx(100 * US * (0.2 + 0.8 * 1.6))
    # compute-bound kernels (q 0.01) do not notice each other without calibration
    a, b = two_kernels("bandwidth", int(0.01 * BW * 100 * US))
    assert b.t_end - b.t_start == pytest.approx(100 * US)


def padded_launch(placement: str) -> Completion:
    """An RT kernel of 30 blocks (100 us) padded with 30 blocks of a BE kernel (90 us a
    block alone, 1.6x with a second block on its SM: REEF's packing curve)."""
    be = ModelProfile("be", "mi50", 60, [KernelProfile(0, "k0", 90.0, 60, 256, blocks_per_sm=2,
                                                       latency_by_bps=[90.0, 144.0])])
    dev = SimDevice("mi50", {"rt": prof_of("rt", 1, 100.0, 30, bps=2), "be": be},
                    dkp_placement=placement)
    done: list[Completion] = []
    dev.start(done.append)
    dev.new_task(dev.load_plan(plan_of("rt", 1, 30)), 1)
    dev.new_task(dev.load_plan(plan_of("be", 1, 60)), 2)
    dev.enqueue_padded(dev.open_stream(1), 1, 0, [(2, 0, 0, 30, 2)])
    dev.run()
    (c,) = done
    assert c.parts == ((2, 0, 0, 30, 2),) and c.executed
    assert dev.telemetry()["dkp_placement"] == placement
    return c


def test_faithful_padding_puts_be_blocks_beside_rt_blocks_reserved_does_not() -> None:
    pad = 1 + GPUS["mi50"].pad_overhead
    # reserved (what-if): RT on SMs 0-29, BE alone on SMs 59..30: the RT blocks end last
    c = padded_launch("reserved")
    assert c.t_end - c.t_start == pytest.approx(100 * US * pad)
    # faithful: the hardware rule puts BE's blocks on the first SMs with room, beside the
    # RT blocks (pressure 0.5 each): 1.5x their time, and the launch ends with them
    c = padded_launch("faithful")
    assert c.t_end - c.t_start == pytest.approx(135 * US)


def test_forecast_finds_a_period_lag_two_trains_and_nothing_in_noise() -> None:
    f = RtForecast()
    for i in range(6):
        f.observe("cam", 0.01 * i)
    t, slack = f.next_arrival("cam")
    assert t == pytest.approx(0.06) and slack == pytest.approx(50e-6)
    for i in range(6):  # two 15 Hz cameras 31 ms apart, merged into one client
        f.observe("two", i / 15)
        f.observe("two", i / 15 + 0.031)
    t, _ = f.next_arrival("two")
    assert t == pytest.approx(6 / 15)
    for x in (0.0, 0.013, 0.019, 0.041, 0.043, 0.077, 0.09):
        f.observe("poisson", x)
    assert f.next_arrival("poisson") is None
    assert f.next_arrival("unknown") is None
    assert [w[0] < w[1] for w in f.windows(0.0)] == [True, True]


def test_forecast_windows_start_later_by_the_rt_latency_budget() -> None:
    # a BE kernel may overrun the earliest predicted arrival by budget x the client's
    # shortest recent RT latency: the window starts that much later (never past its end)
    f = RtForecast(budget=0.01)
    for i in range(6):
        f.observe("cam", 0.01 * i)
    ((ws, we),) = f.windows(0.0)
    assert (ws, we) == (pytest.approx(0.06 - 50e-6), pytest.approx(0.06 + 50e-6))
    f.observe_latency("cam", 0.004)
    f.observe_latency("cam", 0.003)
    assert f.allowance("cam") == pytest.approx(30e-6)
    ((ws, we),) = f.windows(0.0)
    assert ws == pytest.approx(0.06 - 50e-6 + 30e-6) and we == pytest.approx(0.06 + 50e-6)
    f.observe_latency("cam", 0.5)  # the shortest recent latency counts
    assert f.allowance("cam") == pytest.approx(30e-6)
    big = RtForecast(budget=0.5)
    for i in range(6):
        big.observe("cam", 0.01 * i)
    big.observe_latency("cam", 0.004)  # 2 ms allowance > the 100 us window
    ((ws, we),) = big.windows(0.0)
    assert ws == we == pytest.approx(0.06 + 50e-6)
    with pytest.raises(ValueError):
        RtForecast(budget=1.0)


def held_device(flag_at: float | None) -> list[Completion]:
    """A 100 us BE kernel enqueued at 0 with a quiet window at [50, 60] us."""
    dev = SimDevice("mi50", {"be": prof_of("be", 1, 100.0, 60)})
    done: list[Completion] = []
    dev.start(done.append)
    dev.new_task(dev.load_plan(plan_of("be", 1, 60)), 1)
    s = dev.open_stream(0)
    dev.set_quiet(s, [(50 * US, 60 * US)])
    dev.enqueue(s, 1, 0, 0)
    if flag_at is not None:
        dev.call_at(flag_at, lambda: dev.set_preempt(s, True))
    dev.run()
    return done


def test_a_launch_that_would_run_into_a_quiet_window_waits_for_its_end() -> None:
    (c,) = held_device(None)
    assert c.executed and c.t_start == pytest.approx(60 * US)
    assert c.t_end == pytest.approx(160 * US)


def test_a_held_launch_evicts_itself_once_its_flag_is_up() -> None:
    (c,) = held_device(55 * US)  # the RT arrival preempts inside the window
    evict = GPUS["mi50"].evict_us * US
    assert c.executed is False
    assert c.t_start == pytest.approx(56 * US)  # the flag write lands 1 us later
    assert c.t_end == pytest.approx(56 * US + evict)
