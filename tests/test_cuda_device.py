"""The cuda device against the numpy reference (GPU only; skipped with the reason elsewhere).

One test body runs every sample kind on both devices (cpu and cuda) and compares; zoo
models (scaled) run end to end; the golden preemption test checks that BE outputs under
REEF preemption (reset + flag + restore-from-c) are bit-identical to unpreempted GPU runs.
"""

from __future__ import annotations

import queue
import random
import threading

import numpy as np
import pytest

from av_infer.devices.base import Completion, Device
from av_infer.devices.cuda import availability
from av_infer.kernels.cpu import CpuPlanRunner
from av_infer.kernels.cuda.samples import chain_plan, samples
from av_infer.model.plan import Plan

OK, WHY = availability()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not OK, reason=f"no usable GPU: {WHY}")]

RTOL = 1e-3
ATOL = 1e-4


class Driver:
    """Runs plans through a Device (no scheduler): enqueue all kernels, wait completions."""

    def __init__(self, dev: Device) -> None:
        self.dev = dev
        self.done: queue.Queue[Completion] = queue.Queue()
        self.stream = dev.open_stream(0)
        dev.start(self.done.put)
        self.next_task = 0

    def run(self, handle, plan: Plan, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        t = self.next_task
        self.next_task += 1
        self.dev.new_task(handle, t)
        self.dev.write_inputs(t, inputs)
        self.dev.enqueue(self.stream, t, 0, len(plan.kernels) - 1)
        self.wait(t, len(plan.kernels) - 1)
        out = self.dev.read_outputs(t)
        self.dev.release_task(t)
        return out

    def wait(self, task: int, kernel: int, timeout: float = 60.0) -> None:
        while True:
            c = self.done.get(timeout=timeout)
            if c.task == task and c.kernel == kernel:
                return


@pytest.fixture(scope="module")
def cuda_dev():
    from av_infer.devices.cuda import CudaDevice

    dev = CudaDevice(c=4)
    yield dev
    dev.close()


@pytest.fixture(scope="module")
def driver(cuda_dev):
    return Driver(cuda_dev)


def _compare(got: dict, want: dict, name: str) -> None:
    for k, w in want.items():
        g = got[k]
        assert g.shape == w.shape and g.dtype == w.dtype, (name, k, g.shape, w.shape, g.dtype)
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=f"{name}:{k}")
        else:
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{name}:{k}")


SAMPLES = samples()


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_kind_matches_numpy(name, cuda_dev, driver):
    plan, inputs = SAMPLES[name]
    want = CpuPlanRunner(plan).run(inputs)
    h = cuda_dev.load_plan(plan)
    got = driver.run(h, plan, inputs)
    _compare(got, want, name)
    again = driver.run(h, plan, inputs)  # idempotent and deterministic
    for k in got:
        assert np.array_equal(got[k], again[k]), (name, k)


def test_tf32_tiles_stay_close():
    from av_infer.devices.cuda import CudaDevice

    dev = CudaDevice(c=4, tf32=True)
    try:
        drv = Driver(dev)
        for name in ("conv3x3_bias_relu", "conv_1x1_big", "gemm_trans_b_bias",
                     "gemm_batched_broadcast_residual"):
            plan, inputs = SAMPLES[name]
            want = CpuPlanRunner(plan).run(inputs)
            got = drv.run(dev.load_plan(plan), plan, inputs)
            for k, w in want.items():
                np.testing.assert_allclose(got[k], w, rtol=2e-2, atol=2e-2, err_msg=name)
    finally:
        dev.close()


ZOO = ["tiny_cnn", "tiny_mlp", "tiny_transformer", "vgg19", "resnet152", "densenet201",
       "inception_v3", "distilbert"]


@pytest.mark.parametrize("name", ZOO)
def test_zoo_scaled_end_to_end(name, cuda_dev, driver):
    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    variant = "default" if name.startswith("tiny") else "scaled"
    try:
        plan = compile_model(zoo.path(name, variant), name=name)
        x = zoo.sample_inputs(name, variant, seed=3)
    except Exception:  # noqa: BLE001 - tiny models may only have a 'scaled' variant
        plan = compile_model(zoo.path(name, "scaled"), name=name)
        x = zoo.sample_inputs(name, "scaled", seed=3)
    want = CpuPlanRunner(plan).run(x)
    got = driver.run(cuda_dev.load_plan(plan), plan, x)
    _compare(got, want, name)


def test_preempted_be_outputs_bit_identical(cuda_dev):
    """Device-level REEF: reset the vHQ, raise the flag, wait for in-flight launches to
    drain, clear the flag, restore from max(done, k_l - c). Outputs equal an unpreempted run."""
    from av_infer._cy.vhq import restore_point

    plan, x = chain_plan(seed=5)
    h = cuda_dev.load_plan(plan)
    n = len(plan.kernels)
    s = cuda_dev.open_stream(0)
    events: queue.Queue[Completion] = queue.Queue()
    base = 10_000
    # the module fixture already started the device; route completions by task id
    orig = cuda_dev._on_complete

    def tee(c: Completion) -> None:
        if c.task >= base:
            events.put(c)
        elif orig is not None:
            orig(c)

    cuda_dev._on_complete = tee
    try:
        cuda_dev.new_task(h, base)
        cuda_dev.write_inputs(base, x)
        cuda_dev.enqueue(s, base, 0, n - 1)
        while events.get(timeout=60).kernel != n - 1:
            pass
        ref = cuda_dev.read_outputs(base)
        rng = random.Random(0)
        for trial in range(20):
            t = base + 1 + trial
            cuda_dev.new_task(h, t)
            cuda_dev.write_inputs(t, x)
            cuda_dev.enqueue(s, t, 0, n - 1)
            stop_after = rng.randrange(0, n)
            seen = -1
            while seen < stop_after:
                seen = events.get(timeout=60).kernel
            info = cuda_dev.reset(s)
            cuda_dev.set_preempt(s, True)
            while cuda_dev.in_flight(s):
                events.get(timeout=60)
            cuda_dev.set_preempt(s, False)
            if info is not None and info.task == t:
                start = restore_point(info.last_sent, info.done, info.restore_c or cuda_dev._c)
                if start <= n - 1:
                    cuda_dev.enqueue(s, t, start, n - 1)
                    while events.get(timeout=60).kernel != n - 1:
                        pass
            out = cuda_dev.read_outputs(t)
            for k in ref:
                assert np.array_equal(out[k], ref[k]), (trial, stop_after, info)
            cuda_dev.release_task(t)
    finally:
        cuda_dev._on_complete = orig


def test_runtime_reef_policy_on_cuda():
    """The real scheduler on the cuda device: BE results under RT preemption equal the
    unpreempted GPU result bit for bit."""
    from av_infer import Runtime
    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    be = compile_model(zoo.path("resnet152", "scaled"), name="be")
    rt_plan = compile_model(zoo.path("tiny_mlp", "default"), name="rt")
    x = zoo.sample_inputs("resnet152", "scaled", seed=1)
    x_rt = zoo.sample_inputs("tiny_mlp", "default")
    with Runtime("cuda", policy="reef", c=4) as rt:
        rt.load_model("be", be)
        rt.load_model("rt", rt_plan)
        ref = rt.submit("be", x, client="be").result(timeout=120).outputs
        futs = [rt.submit("be", x, client="be") for _ in range(8)]
        stop = threading.Event()

        def rt_load() -> None:
            while not stop.is_set():
                rt.submit("rt", x_rt, priority="RT").result(timeout=60)

        th = threading.Thread(target=rt_load)
        th.start()
        try:
            for f in futs:
                out = f.result(timeout=120).outputs
                for k in ref:
                    assert np.array_equal(out[k], ref[k])
        finally:
            stop.set()
            th.join()
        assert rt.stats()["preemptions"] >= 0
