"""The simulated GPU on its own (no scheduler): timing semantics the scheduler relies on."""

from __future__ import annotations

import pytest

from av_infer.devices.base import Completion
from av_infer.devices.completion import FIELDS
from av_infer.devices.sim import SimDevice
from av_infer.model.plan import Geometry, Kernel, Plan
from av_infer.profiles import GPUS, KernelProfile, ModelProfile, load_reef_trace

US = 1e-6


def make_plan(name: str, n: int, blocks: int = 60, threads: int = 256) -> Plan:
    """A plan of ``n`` identical geometry-only kernels (the sim needs no tensors)."""
    g = Geometry(grid=(blocks, 1, 1), block=(threads, 1, 1))
    kernels = [Kernel(i, "trace", f"k{i}", (), (), {}, g) for i in range(n)]
    return Plan(name=name, kernels=kernels, tensors={}, buffers={}, inputs=[], outputs=[])


def make_profile(name: str, n: int, dur_us: float, blocks: int = 60, bps: int = 1,
                 threads: int = 256, lat: list[float] | None = None) -> ModelProfile:
    ks = [KernelProfile(i, f"k{i}", dur_us, blocks, threads, blocks_per_sm=bps,
                        latency_by_bps=lat) for i in range(n)]
    return ModelProfile(model=name, device="mi50", sms=60, kernels=ks)


class Harness:
    """A device with plans loaded, completions collected."""

    def __init__(self, profiles: dict[str, tuple[int, float, int, int]], **kw: object) -> None:
        profs = {n: make_profile(n, k, d, b, bps) for n, (k, d, b, bps) in profiles.items()}
        self.dev = SimDevice("mi50", profs, record=True, **kw)  # type: ignore[arg-type]
        self.done: list[Completion] = []
        self.dev.start(self.done.append)
        self.handles = {
            n: self.dev.load_plan(make_plan(n, k, b)) for n, (k, _, b, _) in profiles.items()
        }
        self._next_task = 0

    def task(self, model: str) -> int:
        self._next_task += 1
        self.dev.new_task(self.handles[model], self._next_task)
        return self._next_task

    def of(self, task: int) -> list[Completion]:
        return [c for c in self.done if c.task == task]


def test_one_kernel_alone_takes_its_profiled_duration() -> None:
    # 600 blocks, 4 per SM on 60 SMs: 3 waves; whole kernel = 90 us.
    h = Harness({"m": (1, 90.0, 600, 4)})
    s = h.dev.open_stream(0)
    t = h.task("m")
    h.dev.enqueue(s, t, 0, 0)
    h.dev.run()
    (c,) = h.done
    launch = GPUS["mi50"].launch_us * US
    assert c.executed is True
    assert c.t_start == pytest.approx(launch)
    assert c.t_end - c.t_start == pytest.approx(90 * US)


def test_model_alone_is_sum_of_kernels_when_c_hides_launch() -> None:
    h = Harness({"m": (10, 50.0, 60, 1)})
    s = h.dev.open_stream(0)
    t = h.task("m")
    h.dev.enqueue(s, t, 0, 9)
    h.dev.run()
    assert [c.kernel for c in h.done] == list(range(10))
    assert h.done[-1].t_end - h.done[0].t_start == pytest.approx(500 * US)


def test_c_one_exposes_launch_latency() -> None:
    h = Harness({"m": (10, 50.0, 60, 1)}, c=1)
    s = h.dev.open_stream(0)
    h.dev.enqueue(s, h.task("m"), 0, 9)
    h.dev.run()
    launch = GPUS["mi50"].launch_us * US
    assert h.done[-1].t_end - h.done[0].t_start == pytest.approx(500 * US + 9 * launch)


def test_two_streams_share_sms() -> None:
    # Each kernel alone fills half the GPU (60 blocks at 2 per SM = 120 slots): both fit.
    h = Harness({"a": (1, 100.0, 60, 2), "b": (1, 100.0, 60, 2)}, interference=0.0)
    s0, s1 = h.dev.open_stream(0), h.dev.open_stream(0)
    h.dev.enqueue(s0, h.task("a"), 0, 0)
    h.dev.enqueue(s1, h.task("b"), 0, 0)
    h.dev.run()
    a, b = h.done
    assert a.t_start == b.t_start and a.t_end == pytest.approx(b.t_end)
    assert a.t_end - a.t_start == pytest.approx(100 * US)


def test_full_gpu_kernels_serialise_and_interference_slows_sharing() -> None:
    # Kernel A fills every slot: B waits for A's blocks.
    h = Harness({"a": (1, 100.0, 60, 1), "b": (1, 100.0, 60, 1)}, interference=0.0)
    s0, s1 = h.dev.open_stream(0), h.dev.open_stream(0)
    h.dev.enqueue(s0, h.task("a"), 0, 0)
    h.dev.enqueue(s1, h.task("b"), 0, 0)
    h.dev.run()
    a, b = h.done
    assert b.t_start == pytest.approx(a.t_end)


@pytest.mark.parametrize("interference", [0.0, 0.5, 1.0])
def test_sharing_an_sm_with_heavy_blocks_slows_down(interference: float) -> None:
    # Two blocks per SM fit; REEF's packing curve says a second co-resident block makes a
    # block take 1.6x (pressure 0.6 per block, whatever kernel it belongs to): the later
    # kernel, placed on SMs holding one block of the first, runs 1 + 0.6 * interference
    # times longer (blocks already running are not re-timed: a snapshot at placement).
    profs = {n: make_profile(n, 1, 100.0, 60, 2, lat=[100.0, 160.0]) for n in "ab"}
    dev = SimDevice("mi50", profs, interference=interference)
    done: list[Completion] = []
    dev.start(done.append)
    for i, n in enumerate("ab"):
        dev.new_task(dev.load_plan(make_plan(n, 1, 60)), i)
        dev.enqueue(dev.open_stream(0), i, 0, 0)
    dev.run()
    a, b = done
    assert a.t_end - a.t_start == pytest.approx(100 * US)
    assert b.t_end - b.t_start == pytest.approx(100 * US * (1.0 + 0.6 * interference))


def test_priority_stream_gets_slots_first() -> None:
    # A long full-GPU kernel runs; low and high priority kernels wait; on release the
    # high-priority one (submitted later) goes first.
    h = Harness({"big": (1, 100.0, 60, 1), "x": (1, 50.0, 60, 1)}, interference=0.0)
    s_big, s_lo, s_hi = h.dev.open_stream(0), h.dev.open_stream(0), h.dev.open_stream(5)
    h.dev.enqueue(s_big, h.task("big"), 0, 0)
    t_lo, t_hi = h.task("x"), h.task("x")
    h.dev.call_at(10 * US, lambda: h.dev.enqueue(s_lo, t_lo, 0, 0))
    h.dev.call_at(20 * US, lambda: h.dev.enqueue(s_hi, t_hi, 0, 0))
    h.dev.run()
    (lo,), (hi,) = h.of(t_lo), h.of(t_hi)
    assert hi.t_start < lo.t_start
    assert lo.t_start == pytest.approx(hi.t_end)
    # Equal priority: FIFO by ready time.
    h = Harness({"big": (1, 100.0, 60, 1), "x": (1, 50.0, 60, 1)}, interference=0.0)
    s_big, s_a, s_b = h.dev.open_stream(0), h.dev.open_stream(0), h.dev.open_stream(0)
    h.dev.enqueue(s_big, h.task("big"), 0, 0)
    t_a, t_b = h.task("x"), h.task("x")
    h.dev.call_at(10 * US, lambda: h.dev.enqueue(s_a, t_a, 0, 0))
    h.dev.call_at(20 * US, lambda: h.dev.enqueue(s_b, t_b, 0, 0))
    h.dev.run()
    assert h.of(t_a)[0].t_start < h.of(t_b)[0].t_start


def test_low_priority_fills_leftover_slots() -> None:
    # The high-priority kernel uses half the slots; a low-priority one runs beside it.
    h = Harness({"hi": (1, 100.0, 60, 2), "lo": (1, 100.0, 60, 2)}, interference=0.0)
    s_lo, s_hi = h.dev.open_stream(0), h.dev.open_stream(9)
    t_hi, t_lo = h.task("hi"), h.task("lo")
    h.dev.enqueue(s_hi, t_hi, 0, 0)
    h.dev.enqueue(s_lo, t_lo, 0, 0)
    h.dev.run()
    assert h.of(t_hi)[0].t_start == h.of(t_lo)[0].t_start


def in_flight(dev: SimDevice, stream: int) -> int:
    """Launches of ``stream`` transmitted and not yet completed (the device's telemetry)."""
    return dev.telemetry()["streams"][stream]["in_flight"]


def test_capacity_bounds_in_flight() -> None:
    h = Harness({"m": (20, 10.0, 60, 1)}, c=3)
    s = h.dev.open_stream(0)
    h.dev.enqueue(s, h.task("m"), 0, 19)
    assert in_flight(h.dev, s) == 3
    seen: list[int] = []
    h.dev.start(lambda c: (h.done.append(c), seen.append(in_flight(h.dev, s))))
    h.dev.run()
    assert max(seen) <= 3 and len(h.done) == 20
    h.dev.set_capacity(8)
    h.dev.enqueue(s, h.task("m"), 0, 19)
    assert in_flight(h.dev, s) == 8
    h.dev.set_stream_capacity(s, 16)
    assert in_flight(h.dev, s) == 16


def test_reset_drops_queued_launches() -> None:
    h = Harness({"m": (50, 10.0, 60, 1)}, c=4)
    s = h.dev.open_stream(0)
    t = h.task("m")
    h.dev.enqueue(s, t, 0, 49)
    h.dev.run(until=25 * US)
    info = h.dev.reset(s)
    assert info is not None and info.task == t
    assert info.done + info.dropped + in_flight(h.dev, s) == 50
    assert info.last_sent == info.done + in_flight(h.dev, s) - 1
    h.dev.run()
    assert len(h.done) == info.last_sent + 1
    assert all(c.executed for c in h.done)  # no flag: in-flight launches run
    assert h.dev.reset(s) is None


def test_flag_evicts_queued_kernels_and_running_blocks_finish() -> None:
    h = Harness({"m": (50, 100.0, 60, 1)}, c=4)
    s = h.dev.open_stream(0)
    t = h.task("m")
    h.dev.enqueue(s, t, 0, 49)
    launch = GPUS["mi50"].launch_us * US
    h.dev.run(until=launch + 150 * US)  # kernel 1 half way
    info = h.dev.reset(s)
    h.dev.set_preempt(s, True)
    h.dev.run()
    assert info is not None and info.last_sent == 4
    ex = [c for c in h.done if c.executed]
    ev = [c for c in h.done if not c.executed]
    assert [c.kernel for c in ex] == [0, 1]  # kernel 1's blocks were running: it finishes
    assert [c.kernel for c in ev] == [2, 3, 4]
    assert ex[-1].t_end == pytest.approx(launch + 200 * US)
    evict = GPUS["mi50"].evict_us * US
    for c in ev:
        assert c.t_end - c.t_start == pytest.approx(evict)
    assert ev[-1].t_end == pytest.approx(launch + 200 * US + 3 * evict)
    # Clearing the flag lets new launches run again.
    h.dev.set_preempt(s, False)
    h.dev.run()
    h.dev.enqueue(s, t, 2, 3)
    h.dev.run()
    assert [c.executed for c in h.done[-2:]] == [True, True]


def test_flag_mid_kernel_evicts_its_unstarted_blocks() -> None:
    # 3 waves of 60 blocks; flag lands during wave 1: waves 2-3 exit, kernel not executed.
    h = Harness({"m": (1, 300.0, 180, 1)})
    s = h.dev.open_stream(0)
    h.dev.enqueue(s, h.task("m"), 0, 0)
    launch = GPUS["mi50"].launch_us * US
    h.dev.run(until=launch + 50 * US)
    h.dev.set_preempt(s, True)
    h.dev.run()
    (c,) = h.done
    assert c.executed is False  # the rest of its blocks exit when wave 2 would start
    assert c.t_end == pytest.approx(launch + 100 * US + GPUS["mi50"].evict_us * US)


def test_read_outputs_are_zeros_and_resident_bytes() -> None:
    plan, prof = load_reef_trace("alexnet")
    dev = SimDevice("mi50", {"alexnet": prof})
    h = dev.load_plan(plan)
    assert dev.resident_bytes(h) == plan.weight_bytes > 0
    dev.new_task(h, 1)
    assert dev.read_outputs(1) == {}
    dev.release_task(1)
    dev.unload_plan(h)


def run_mixed(seed: int, jitter: float) -> list:
    plan_a, prof_a = load_reef_trace("vgg")
    plan_b, prof_b = load_reef_trace("resnet152")
    dev = SimDevice("mi50", {"vgg": prof_a, "resnet152": prof_b}, seed=seed, jitter=jitter,
                    record=True)
    dev.start(lambda c: None)
    ha, hb = dev.load_plan(plan_a), dev.load_plan(plan_b)
    s0, s1 = dev.open_stream(0), dev.open_stream(1)
    dev.new_task(ha, 1)
    dev.new_task(hb, 2)
    dev.enqueue(s0, 2, 0, len(plan_b.kernels) - 1)
    dev.call_at(1e-3, lambda: dev.enqueue(s1, 1, 0, len(plan_a.kernels) - 1))
    dev.call_at(2e-3, lambda: (dev.reset(s0), dev.set_preempt(s0, True)))
    dev.run()
    assert dev.timeline is not None
    return dev.timeline


def test_deterministic_for_a_seed() -> None:
    assert run_mixed(0, 0.05) == run_mixed(0, 0.05)
    assert run_mixed(0, 0.05) != run_mixed(1, 0.05)
    assert run_mixed(0, 0.0) == run_mixed(1, 0.0)


def test_unknown_profile_is_derived_from_geometry() -> None:
    dev = SimDevice("h100")
    h = dev.load_plan(make_plan("g", 3, blocks=264))
    assert len(h.profile.kernels) == 3 and h.profile.device == "h100"
    with pytest.raises(ValueError, match="kernels"):
        SimDevice("mi50", {"g": make_profile("g", 2, 10.0)}).load_plan(make_plan("g", 3))


def test_completions_equal_what_the_constructor_builds() -> None:
    # sim_core builds the records the devices all build (devices/completion.py): the same
    # type, every field in order, defaults (t_stop) included, hashable and comparable
    h = Harness({"m": (3, 20.0, 60, 1)})
    s = h.dev.open_stream(0)
    h.dev.enqueue(s, h.task("m"), 0, 2)
    h.dev.run()
    assert len(h.done) == 3
    for c in h.done:
        ref = Completion(c.stream, c.task, c.kernel, c.executed, c.t_start, c.t_end, c.parts)
        assert type(c) is Completion and c == ref and hash(c) == hash(ref)
        assert [getattr(c, f) for f in FIELDS][:6] == [getattr(ref, f) for f in FIELDS][:6]
        assert repr(c) == repr(ref)  # every field, in order (NaN prints alike)
        assert c.parts == () and c.t_stop != c.t_stop  # NaN: not a killed cpu segment


def test_stats_and_device_state_are_readable_between_runs() -> None:
    h = Harness({"m": (2, 20.0, 60, 1)})
    s = h.dev.open_stream(0)
    h.dev.enqueue(s, h.task("m"), 0, 1)
    h.dev.run(until=1e-6)
    assert in_flight(h.dev, s) == 2 and h.dev.now() == pytest.approx(1e-6)
    h.dev.run()
    st = h.dev.stats
    assert st["kernels"] == 2 and st["batches"] == 2 and st["evicted"] == 0
    assert st["busy_s"] == pytest.approx(40e-6, rel=0.01) and h.dev.idle()
    st["kernels"] = 99  # a snapshot: the device's counters are its own
    assert h.dev.stats["kernels"] == 2
