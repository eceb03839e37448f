"""Timing behaviour of the real scheduler on the simulated MI50 (virtual time: exact, fast).

These reproduce the shape of REEF's §7.3 results (Fig. 13, Fig. 15a) and of DISB workload A
(Fig. 11) with the REEF traces. Numbers are virtual microseconds of the simulator's model,
not claims about real hardware (docs/design.md, "sim").
"""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pytest

from av_infer.devices.sim import SimDevice
from av_infer.model.plan import Geometry, Kernel, Plan
from av_infer.profiles import GPUS, KernelProfile, ModelProfile, default_trace_dir, load_reef_trace
from av_infer.runtime import Runtime
from av_infer.sched.request import Priority, Result, Timings

pytestmark = pytest.mark.skipif(
    not default_trace_dir().is_dir(), reason="REEF traces not found"
)

US = 1e-6
#: RT arrival, after the BE task was submitted at 0: BE kernel 2 of 100 us is running and
#: has 21.3 us left (kernels start at 5 us + 100 us * i).
RT_AT = 283.7 * US


def long_be(n: int, dur_us: float = 100.0) -> tuple[Plan, ModelProfile]:
    """REEF Fig. 13's synthetic BE model: ``n`` kernels of ``dur_us`` filling the GPU
    (240 blocks at 4 per CU on 60 CUs), so RT must wait for its running blocks."""
    g = Geometry((240, 1, 1), (256, 1, 1))
    name = f"be{n}"
    plan = Plan(name, [Kernel(i, "trace", f"k{i}", (), (), {}, g) for i in range(n)],
                {}, {}, [], [], reuse_guard=n + 1)
    prof = ModelProfile(name, "mi50", 60, [
        KernelProfile(i, f"k{i}", dur_us, 240, 256, blocks_per_sm=4) for i in range(n)
    ])
    return plan, prof


def preemption(policy: str, n_be: int, c: int = 4, drain: bool = False,
               rt_at: float = RT_AT) -> tuple[Timings, Timings]:
    """One BE task of ``n_be`` kernels, one vgg RT request at RT_AT: (RT, BE) timings."""
    vgg, p_vgg = load_reef_trace("vgg")
    be, p_be = long_be(n_be)
    dev = SimDevice("mi50", {"vgg": p_vgg, be.name: p_be})
    rt = Runtime(device=dev, policy=policy, c=c, preempt_drain=drain)
    rt.load_model("vgg", vgg)
    rt.load_model("be", be)
    f_be = rt.submit("be", {}, priority=Priority.BE)
    f_rt: list[Future[Result]] = []
    dev.call_at(rt_at, lambda: f_rt.append(rt.submit("vgg", {}, priority=Priority.RT)))
    dev.run()
    out = f_rt[0].result().timings, f_be.result().timings
    rt.close()
    return out


def latency_us(t: Timings) -> float:
    return (t.first_kernel_start - t.arrival) / US


QUEUED = (10, 30, 60, 100, 300, 1000)


@pytest.fixture(scope="module")
def fig13() -> dict[str, dict[int, float]]:
    return {pol: {n: latency_us(preemption(pol, n)[0]) for n in QUEUED}
            for pol in ("reef", "wait")}


def test_fig13_reef_preemption_latency_is_flat_in_queued_kernels(fig13: dict) -> None:
    reef = fig13["reef"]
    # RT starts once the running BE kernel's blocks finished (REEF-N cannot kill them:
    # 21.3 us left) and the other c-1 launched kernels evicted themselves; whatever is
    # queued behind them in the vHQ costs nothing (REEF: "stable ... less than 40 us").
    assert len(set(reef.values())) == 1, reef
    assert 21.3 < reef[10] < 60.0, reef


def test_fig13_wait_preemption_latency_grows_with_launched_kernels(fig13: dict) -> None:
    wait = fig13["wait"]
    # REEF's baseline launches the whole BE model (the device's max_capacity launches) and
    # evicts lazily: RT waits until every launched kernel was fetched and evicted itself,
    # one per evict_us in stream order — linear in launched kernels, all the way to 1000.
    evict_us = GPUS["mi50"].evict_us
    assert SimDevice.max_capacity >= max(QUEUED)
    for a, b in zip(QUEUED, QUEUED[1:]):
        assert wait[b] - wait[a] == pytest.approx((b - a) * evict_us, rel=0.02), (a, b, wait)
    for n in QUEUED:
        assert wait[n] > fig13["reef"][n]
    assert wait[1000] > 30 * fig13["reef"][1000]


def test_fig13_restore_reexecutes_at_most_c_plus_1_kernels() -> None:
    for c in (1, 4, 8):
        rt_t, be_t = preemption("reef", 100, c)
        assert be_t.preempted == 1
        # the simulator reports which launches ran: restore starts at the first kernel that
        # did not, so nothing that ran is re-run (REEF's bound is c + 1)
        assert be_t.end > rt_t.end  # BE finished after RT, restored


def test_fig15a_reef_preemption_latency_grows_with_c() -> None:
    # REEF-N's literal order (preempt_drain): the <= c launched BE kernels finish or
    # self-evict before RT starts; each extra launch in flight is one more kernel to fetch
    # and evict (Fig. 15a: linear in c).
    # Averaged over RT arrival phases spanning one BE kernel, so the remaining time of the
    # running kernel (which c=1's exposed launch gaps shift) averages out.
    phases = [(200.0 + 10.0 * i) * US for i in range(10)]
    lat = {c: float(np.mean([latency_us(preemption("reef", 100, c, True, t)[0])
                             for t in phases])) for c in (1, 2, 4, 8)}
    assert lat[1] < lat[2] < lat[4] < lat[8], lat
    step = (lat[8] - lat[4]) / 4
    assert lat[4] - lat[2] == pytest.approx(2 * step, rel=0.1), lat


def test_reef_without_drain_starts_rt_before_the_launched_be_kernels_evicted() -> None:
    # Default reef: RT goes to the high-priority stream at once; it waits only for SM
    # slots held by running BE blocks, not for the c launches behind them.
    for c in (1, 4, 8):
        fast = latency_us(preemption("reef", 100, c)[0])
        strict = latency_us(preemption("reef", 100, c, drain=True)[0])
        assert fast <= strict, (c, fast, strict)


def test_fig15a_normal_execution_time_falls_with_c() -> None:
    # c = 1 exposes the launch latency between kernels; from c = 2 on it is hidden.
    be, prof = long_be(100)
    times = {}
    for c in (1, 2, 4, 8):
        dev = SimDevice("mi50", {be.name: prof})
        rt = Runtime(device=dev, policy="reef", c=c)
        rt.load_model("be", be)
        f = rt.submit("be", {}, priority=Priority.BE)
        dev.run()
        times[c] = f.result().timings.latency / US
        rt.close()
    launch = dev.gpu.launch_us
    assert times[1] == pytest.approx(100 * 100.0 + 100 * launch)
    assert times[2] == times[4] == times[8] == pytest.approx(100 * 100.0 + launch)


# -- DISB workload A on the traces ---------------------------------------------------------


def disb_a(policy: str, seconds: float = 2.0, rt_hz: float = 100.0,
           dkp_placement: str = "faithful") -> dict[str, float]:
    """vgg RT at ``rt_hz`` (uniform), resnet152 BE closed loop; RT latencies in us."""
    vgg, p_vgg = load_reef_trace("vgg")
    r152, p_r152 = load_reef_trace("resnet152")
    dev = SimDevice("mi50", {"vgg": p_vgg, "resnet152": p_r152}, dkp_placement=dkp_placement)
    rt = Runtime(device=dev, policy=policy, c=4)
    rt.load_model("vgg", vgg)
    rt.load_model("resnet152", r152)
    rts: list[Future[Result]] = []
    bes: list[Future[Result]] = []

    def be_loop() -> None:
        if dev.now() < seconds:
            f = rt.submit("resnet152", {}, priority=Priority.BE, client="monitor")
            bes.append(f)
            f.add_done_callback(lambda _: be_loop())

    if policy != "rt_only":
        dev.call_at(0.0, be_loop)
    for i in range(int(seconds * rt_hz)):
        t = 3.7e-3 + i / rt_hz
        dev.call_at(t, lambda t=t: rts.append(
            rt.submit("vgg", {}, priority=Priority.RT, client="camera", arrival=t)))
    dev.run()
    lat = np.array([f.result().timings.latency for f in rts]) / US
    be_done = sum(1 for f in bes if f.exception() is None)
    rt.close()
    return {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
            "n": len(lat), "be": be_done}


@pytest.fixture(scope="module")
def disb() -> dict[str, dict[str, float]]:
    return {p: disb_a(p) for p in ("rt_only", "reef", "streams", "prio_streams")}


def test_disb_a_reef_keeps_rt_latency_within_2_percent(disb: dict) -> None:
    ref, reef = disb["rt_only"], disb["reef"]
    assert ref["n"] == reef["n"] == 200
    for q in ("p50", "p99"):
        assert reef[q] <= ref[q] * 1.02, (q, reef, ref)
    assert reef["be"] > 0  # BE still progresses


def test_disb_a_streams_hurts_rt_latency(disb: dict) -> None:
    ref, streams = disb["rt_only"], disb["streams"]
    assert streams["p99"] > ref["p99"] * 1.02, (streams, ref)
    assert streams["be"] >= disb["reef"]["be"]  # the price reef pays: less BE throughput
    # REEF Fig. 11 (A: GPUStreams 1.84x): BE blocks share the CUs of RT kernels.
    assert streams["p50"] > ref["p50"] * 1.05, (streams, ref)


def test_disb_a_prio_streams_is_worse_than_reef(disb: dict) -> None:
    # Stream priority only orders block dispatch: BE blocks already resident (and those
    # placed in the slots RT leaves) still slow RT kernels down.
    prio, reef = disb["prio_streams"], disb["reef"]
    for q in ("p50", "p99"):
        assert prio[q] > reef[q] * 1.05, (q, prio, reef)
