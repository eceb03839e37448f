"""Vendor ops (cuBLASLt / cuDNN) behind the cuda dispatcher, on the CPU emulator.

``CudaDevice(emulate=True, vendor="force")`` loads the emulator's own cuBLASLt / cuDNN entry
points (docs/cuda_emu.md §3) through the same ``cuda_vendor.pyx`` loader and launcher a GPU
uses: ops built once at load, launched by the nogil dispatcher as kernel indices of the plan
in the vHQ (counted against c), not issued while the stream's flag is up. Checked here:
zoo models through vendor ops against ONNX Runtime, the flag check, preempt / reset /
restore with vendor launches, the scheduler on top, precisions, the per-op fallback report
and the typed error for a missing library. The same tests on a GPU: ``gpu`` marked ones.
"""

from __future__ import annotations

import ctypes
import queue
import random

import numpy as np
import pytest

from av_infer.devices.base import Completion
from av_infer.devices.cuda import availability
from av_infer.devices.cuda_vendor import TOLERANCE, VendorLibraryError, find_library, max_error
from av_infer.errors import DeviceUnavailableError, InvalidParameterError
from av_infer.kernels.cuda.samples import chain_plan
from av_infer.model.plan_builder import PlanBuilder
from tests.checks import be_bit_identical_under_rt, require

EMU_OK, EMU_WHY = availability(emulate=True)
GPU_OK, GPU_WHY = availability()


@pytest.fixture(scope="module")
def dev():
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer.devices.cuda import CudaDevice

    d = CudaDevice(emulate=True, vendor="force")
    yield d
    d.close()


class Runner:
    """Plans through the device without a scheduler; completions routed by task id."""

    def __init__(self, dev) -> None:
        self.dev = dev
        self.q: queue.Queue[Completion] = queue.Queue()
        self.stream = dev.open_stream(0)
        self.last: dict[int, int] = {}
        dev.start(self.q.put)
        self.next = 0

    def wait(self, task: int, kernel: int) -> None:
        while self.last.get(task, -1) < kernel:
            c = self.q.get(timeout=120)
            assert c.task is not None
            self.last[c.task] = max(self.last.get(c.task, -1), c.kernel)

    def run(self, handle, x) -> dict[str, np.ndarray]:
        t = self.next = self.next + 1
        n = len(handle.plan.kernels)
        self.dev.new_task(handle, t)
        self.dev.write_inputs(t, x)
        self.dev.enqueue(self.stream, t, 0, n - 1)
        self.wait(t, n - 1)
        out = self.dev.read_outputs(t)
        self.dev.release_task(t)
        return out


@pytest.fixture(scope="module")
def runner(dev):
    return Runner(dev)


def vendor_runs(dev) -> tuple[int, int]:
    """(matmuls, convs) the emulated vendor libraries have executed in this process."""
    out = (ctypes.c_uint64 * 2)()
    ctypes.CDLL(dev._driver_path).avi_emu_vendor_runs(out)
    return int(out[0]), int(out[1])


def _zoo(name: str):
    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    variant = "scaled"
    p = zoo.path(name, variant)
    return p, compile_model(p, name=name), zoo.sample_inputs(name, variant, seed=3)


def _ort(path, x) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, x), strict=True))


ZOO = ["tiny_cnn", "tiny_mlp", "tiny_transformer", "vgg19", "resnet152", "densenet201",
       "inception_v3", "distilbert"]


@pytest.mark.parametrize("name", ZOO)
def test_zoo_through_vendor_ops_matches_onnxruntime(name, dev, runner):
    path, plan, x = _zoo(name)
    h = dev.load_plan(plan)
    rep = dev.vendor_report(h)
    n_vendor = [r for r in rep if r["path"] == "vendor"]
    own = [(r["name"], r["reason"]) for r in rep if r["path"] == "own"]
    print(f"{name}: {len(n_vendor)} of {len(rep)} conv/gemm kernels on vendor ops; ours: {own}")
    assert all(r["reason"] for r in rep if r["path"] == "own")  # every fallback says why
    mm = sum(1 for r in n_vendor if r["kind"] == "gemm")
    cv = sum(1 for r in n_vendor if r["kind"] == "conv")
    if any(k.kind == "conv" for k in plan.kernels):
        assert cv > 0
    before = vendor_runs(dev)
    got = runner.run(h, x)
    after = vendor_runs(dev)
    assert (after[0] - before[0], after[1] - before[1]) == (mm, cv)  # each op ran once
    want = _ort(path, x)
    for k, w in want.items():
        err = max_error(got[k], w)
        print(f"  {k}: max error {err:.2e} (fp32 tolerance {TOLERANCE['fp32']:.0e})")
        assert err <= TOLERANCE["fp32"], (name, k, err)
    dev.unload_plan(h)


def _hand_plan(pads, epilogue, name="hand"):
    rng = np.random.default_rng(0)
    b = PlanBuilder(name)
    x = b.tensor("x", (1, 4, 9, 9), role="input")
    w = b.weight("w", rng.standard_normal((8, 4, 3, 3)).astype(np.float32))
    bias = b.weight("b", rng.standard_normal(8).astype(np.float32))
    ho = 9 + pads[0] + pads[2] - 2
    wo = 9 + pads[1] + pads[3] - 2
    y = b.tensor("y", (1, 8, ho, wo), role="output")
    b.kernel("conv", [x, w], [y], strides=[1, 1], pads=list(pads), dilations=[1, 1], group=1,
             bias=bias, epilogue=epilogue)
    return b.build(), {"x": rng.standard_normal((1, 4, 9, 9)).astype(np.float32)}


@pytest.mark.parametrize("pads,epilogue,reason", [
    ((0, 0, 1, 1), [["relu", {}]], "asymmetric padding"),
    ((1, 1, 1, 1), [["sigmoid", {}]], "epilogue"),
])
def test_kernels_a_vendor_op_cannot_compute_stay_ours_and_say_why(pads, epilogue, reason, dev,
                                                                  runner):
    from av_infer.kernels.cpu import CpuPlanRunner

    plan, x = _hand_plan(pads, epilogue)
    h = dev.load_plan(plan)
    (row,) = dev.vendor_report(h)
    assert row["path"] == "own" and reason in row["reason"]
    assert not h.vendor  # no vendor table: the dispatcher launches our kernel
    got = runner.run(h, x)
    want = CpuPlanRunner(plan).run(x)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)


def test_vendor_launch_is_not_issued_while_the_flag_is_up(dev, runner):
    """A closed kernel cannot read the flag: the dispatcher checks it before issuing a
    vendor op. Launched under a raised flag every kernel completes (ours return at their
    check, vendor ops are not issued), and none of the vendor ops ran."""
    plan, x = chain_plan(seed=2)
    h = dev.load_plan(plan)
    nv = sum(1 for v in h.vendor if v is not None)
    assert nv >= 7  # the chain's seven convs and its gemm
    s = runner.stream
    ref = runner.run(h, x)
    skipped0 = dev._disp.stream_stats(s)["vendor_skipped"]
    runs0 = vendor_runs(dev)
    dev.set_preempt(s, True)
    try:
        t = 900
        dev.new_task(h, t)
        dev.write_inputs(t, x)
        dev.enqueue(s, t, 0, len(plan.kernels) - 1)
        runner.wait(t, len(plan.kernels) - 1)
    finally:
        dev.set_preempt(s, False)
    st = dev._disp.stream_stats(s)
    assert st["vendor_skipped"] - skipped0 == nv
    assert st["vendor_launched"] >= 2 * nv and st["vendor_host_us_per_launch"] > 0
    assert vendor_runs(dev) == runs0
    # the same task again with the flag down: every kernel runs, the result is the reference
    dev.enqueue(s, t, 0, len(plan.kernels) - 1)
    runner.last[t] = -1
    runner.wait(t, len(plan.kernels) - 1)
    out = dev.read_outputs(t)
    dev.release_task(t)
    for k in ref:
        assert np.array_equal(out[k], ref[k])


def test_preempted_be_with_vendor_ops_is_bit_identical(dev, runner):
    """REEF-N's reset for closed kernels: reset the vHQ, raise the flag, let the <= c
    launches in flight (vendor ops among them) finish, restore from done (REEF's
    max(done, k_l - c), observed)."""
    plan, x = chain_plan(seed=5)
    h = dev.load_plan(plan)
    n = len(plan.kernels)
    s = runner.stream
    ref = runner.run(h, x)
    rng = random.Random(0)
    restored = 0
    for trial in range(20):
        t = 1000 + trial
        dev.new_task(h, t)
        dev.write_inputs(t, x)
        dev.enqueue(s, t, 0, n - 1)
        runner.wait(t, rng.randrange(0, n))
        info = dev.reset(s)
        dev.set_preempt(s, True)
        if info is not None:
            runner.wait(info.task, info.last_sent)
        dev.set_preempt(s, False)
        if info is not None and info.task == t:
            start = info.done  # the scheduler's restore point (= REEF's max(done, k_l - c))
            if start <= n - 1:
                restored += 1
                runner.last[t] = start - 1
                dev.enqueue(s, t, start, n - 1)
                runner.wait(t, n - 1)
        out = dev.read_outputs(t)
        for k in ref:
            assert np.array_equal(out[k], ref[k]), (trial, info)
        dev.release_task(t)
    assert restored > 0


def test_scheduler_reef_preempts_be_running_vendor_ops():
    """The real scheduler on a vendor-op device: BE results under RT preemption equal the
    unpreempted result bit for bit, and vendor ops ran."""
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer import Runtime
    from av_infer.devices.cuda import CudaDevice

    _, be, x = _zoo("resnet152")
    _, rt_plan, x_rt = _zoo("tiny_mlp")
    d = CudaDevice(emulate=True, vendor="force")
    runs0 = vendor_runs(d)
    with Runtime(d, policy="reef", c=4) as rt:
        rt.load_model("be", be)
        rt.load_model("rt", rt_plan)
        be_bit_identical_under_rt(rt, x, x_rt, n_be=6, n_rt=30)
        assert rt.stats()["preemptions"] > 0
    assert vendor_runs(d)[1] > runs0[1]


@pytest.mark.parametrize("precision", ["tf32", "fp16"])
def test_precision_through_the_runtime_against_onnxruntime(precision):
    """``load_model(precision=...)``: vendor ops run the library's TF32 / FP16 maths (the
    emulator rounds operands as the library's mode does); outputs within the stated
    tolerance of ONNX Runtime, and different from FP32 (the rounding is real)."""
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer import Runtime
    from av_infer.devices.cuda import CudaDevice

    path, plan, x = _zoo("resnet152")
    want = _ort(path, x)
    with Runtime(CudaDevice(emulate=True, vendor="force"), policy="reef") as rt:
        rt.load_model("m32", plan)
        rt.load_model("m", plan, precision=precision)
        got32 = rt.submit("m32", x).result(timeout=120).outputs
        got = rt.submit("m", x).result(timeout=120).outputs
    for k, w in want.items():
        err = max_error(got[k], w)
        print(f"resnet152 {precision} {k}: max error {err:.2e} "
              f"(tolerance {TOLERANCE[precision]:.0e}); fp32 {max_error(got32[k], w):.2e}")
        assert err <= TOLERANCE[precision]
        assert not np.array_equal(got[k], got32[k])


def test_fp16_gemm_is_fp16_operands_with_fp32_accumulation(dev, runner):
    rng = np.random.default_rng(1)
    b = PlanBuilder("g16")
    a = b.tensor("a", (8, 64), role="input")
    wv = rng.standard_normal((64, 16)).astype(np.float32)
    bv = rng.standard_normal(16).astype(np.float32)
    w = b.weight("w", wv)
    bias = b.weight("bias", bv)
    y = b.tensor("y", (8, 16), role="output")
    b.kernel("gemm", [a, w], [y], trans_a=0, trans_b=0, alpha=1.0, beta=1.0, bias=bias,
             epilogue=[["relu", {}]])
    plan = b.build()
    plan.precision = "fp16"
    xa = (rng.standard_normal((8, 64)) * 3).astype(np.float32)
    h = dev.load_plan(plan)
    assert [r["path"] for r in dev.vendor_report(h)] == ["vendor"]
    got = runner.run(h, {"a": xa})["y"]
    f16 = np.float16
    want = np.maximum(xa.astype(f16).astype(np.float64) @ wv.astype(f16).astype(np.float64)
                      + bv, 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    exact = np.maximum(xa.astype(np.float64) @ wv.astype(np.float64) + bv, 0)
    assert np.max(np.abs(got - exact)) > 1e-3  # FP16 operands, visibly


def test_missing_library_is_a_typed_error_naming_every_place(tmp_path, monkeypatch):
    import av_infer.devices.cuda_vendor as cv

    with pytest.raises(VendorLibraryError) as e:
        find_library("cudnn", env={"AV_INFER_CUDNN": str(tmp_path / "nowhere")})
    assert isinstance(e.value, DeviceUnavailableError)
    assert "libcudnn.so.9" in str(e.value) and str(tmp_path / "nowhere") in str(e.value)
    # no override: every wheel folder and the loader path are named
    site_dir = tmp_path / "site"
    (site_dir / "nvidia" / "cudnn" / "lib").mkdir(parents=True)
    monkeypatch.setattr(cv, "_site_dirs", lambda: [site_dir])
    monkeypatch.setattr(cv, "_loadable", lambda name: False)  # as on a machine without it
    with pytest.raises(VendorLibraryError) as e:
        find_library("cublaslt", env={})
    msg = str(e.value)
    assert "libcublasLt.so.13" in msg and "libcublasLt.so.12" in msg
    assert str(site_dir / "nvidia" / "cu13" / "lib") in msg
    assert str(site_dir / "nvidia" / "cudnn" / "lib") in msg
    assert "system loader path" in msg and "vendor='off'" in msg
    assert e.value.searched and e.value.library.startswith("cuBLASLt")
    # a file that is there is found, by override folder or wheel folder
    lib = site_dir / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9"
    lib.write_bytes(b"\x7fELF")
    assert find_library("cudnn", env={}) == str(lib)
    assert find_library("cudnn", env={"AV_INFER_CUDNN": str(lib.parent)}) == str(lib)


def test_a_library_that_does_not_load_names_itself(tmp_path):
    from av_infer._cy.cuda_vendor import Vendor

    bad = tmp_path / "libcublasLt.so.13"
    bad.write_bytes(b"not an ELF file")
    with pytest.raises(OSError, match="libcublasLt.so.13"):
        Vendor(str(bad), None)


def test_settings_are_validated_first():
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer import Runtime
    from av_infer.devices.cuda import CudaDevice

    with pytest.raises(ValueError, match="vendor"):
        CudaDevice(emulate=True, vendor="sometimes")
    _, plan, _ = _zoo("tiny_mlp")
    with Runtime("cpu") as rt:
        with pytest.raises(InvalidParameterError, match="fp32"):
            rt.load_model("m", plan, precision="fp16")
        rt.load_model("m", plan)  # the refused load changed nothing: the name is free
    with Runtime(CudaDevice(emulate=True, vendor="force")) as rt:
        with pytest.raises(InvalidParameterError, match="int8"):
            rt.load_model("m", plan, precision="int8")


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_OK, reason=f"no usable GPU: {GPU_WHY}")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_vendor_zoo_against_onnxruntime(precision):
    """On a GPU: cuBLASLt / cuDNN found and loaded, scaled zoo models through vendor ops
    within the precision's tolerance of ONNX Runtime, bit-identical from run to run
    (densenet201: identity convs on ``cudnnConvolutionForward``; resnet152: its downsample
    convs on ``cudnnConvolutionForward`` + ``cudnnAddTensor``)."""
    from av_infer.devices.cuda import CudaDevice

    d = CudaDevice(vendor="force")
    try:
        r = Runner(d)
        for name in ("resnet152", "distilbert", "densenet201"):
            path, plan, x = _zoo(name)
            plan.precision = precision
            h = d.load_plan(plan)
            assert any(row["path"] == "vendor" for row in d.vendor_report(h))
            got = r.run(h, x)
            again = r.run(h, x)  # pinned deterministic algorithms: the same bits
            assert all(np.array_equal(got[k], again[k]) for k in got), name
            for k, w in _ort(path, x).items():
                err = max_error(got[k], w)
                print(f"{name} {precision} {k}: {err:.2e} (tolerance {TOLERANCE[precision]})")
                assert err <= TOLERANCE[precision]
    finally:
        d.close()


def test_peer_torch_without_torch_or_gpu_says_why_and_exits_2(capsys):
    """``bench --peer torch`` where it cannot run: exit 2 and the reason, nothing loaded."""
    from av_infer.bench.peer_torch import PeerUnavailable, TorchPeerConfig, check_available
    from av_infer.cli import main

    cfg = TorchPeerConfig.for_workload("A")
    try:
        check_available(cfg)
    except PeerUnavailable:
        pass
    else:
        pytest.skip("torch and a GPU are here: the comparison would run")
    assert main(["bench", "--peer", "torch", "--workload", "A", "--duration", "1"]) == 2
    assert "cannot run here" in capsys.readouterr().err


def test_peer_torch_avi_side_and_gpu_summary_on_the_emulator(tmp_path):
    """The avi system of ``--peer torch`` (DISB A's models, scaled) and the vendor bench on
    the emulator with vendor ops, then gpu_summary.json from both in issue 30 item 7's
    exact shape. Emulated: no figure is GPU speed."""
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    import dataclasses

    from av_infer.bench.peer_torch import TorchPeerConfig, run_torch_peer, summary_row

    cfg = TorchPeerConfig.for_workload("A", rate_scale=0.05, systems=("avi",), emulate=True,
                                       vendor="force", scale="scaled", duration=1.5,
                                       warmup=0.2, progress=False)
    doc = run_torch_peer(cfg)
    a = doc["avi"]
    assert "error" not in a, a
    assert a["rt_n"] >= 1 and a["rt_p50_ms"] > 0 and a["be_rps"] >= 0
    assert set(a["preemption_us"]) == {"p50", "p99", "n"}
    assert a["vendor"]["mode"] == "force" and a["vendor"]["models"]["rt"]["vendor"] > 0
    row = summary_row(doc)
    assert row["workload"] == "A" and set(row["avi"]) == {"rt_p50_ms", "rt_p99_ms", "be_rps"}

    import json

    from av_infer.bench import gpu_vendor
    from av_infer.bench.gpu_summary import main as summary_main

    # the same avi side under prio_streams (the GPU script's fourth peer run): it runs, and
    # stays out of the summary's rows (their shape has no policy)
    other = run_torch_peer(dataclasses.replace(cfg, policy="prio_streams", duration=0.8))
    assert "error" not in other["avi"], other["avi"]
    assert other["config"]["policy"] == "prio_streams" and other["avi"]["rt_n"] >= 1
    assert other["avi"]["preemption_us"]["n"] == 0  # streams never preempt
    # and with av_infer's RT model as one graph launch a request (the GPU script's fifth
    # peer run): the graphs ran (instances taken, none refused), and the run stays out of
    # the summary's rows too
    graphs = run_torch_peer(dataclasses.replace(cfg, rt_graphs=2, duration=0.8))
    assert "error" not in graphs["avi"], graphs["avi"]
    assert graphs["config"]["rt_graphs"] == 2 and graphs["avi"]["rt_n"] >= 1
    g = graphs["avi"]["rt_graphs"]
    assert g["active"] and g["taken"] >= graphs["avi"]["rt_n"] and g["launch_refused"] == 0, g
    assert doc["avi"]["rt_graphs"]["taken"] == 0  # the plain run took none
    (tmp_path / "peer_torch.json").write_text(json.dumps({"runs": [doc, other, graphs]}))
    assert gpu_vendor.main(["--emulate", "--out", str(tmp_path), "--models", "tiny_cnn",
                            "--reps", "1", "--chain-ops", "8"]) == 0
    vend = json.loads((tmp_path / "gpu_vendor.json").read_text())
    assert vend["host_cost"]["vendor"]["vendor_ops"] == 8
    assert vend["host_cost"]["own"]["vendor_ops"] == 0
    assert [(r["model"], r["precision"], r["ok"]) for r in vend["models"]] == [
        ("tiny_cnn", "fp32", True), ("tiny_cnn", "fp16", True)]
    for r in vend["models"]:  # the ops per library call path add up to the vendor ops
        assert sum(r["vendor_calls"].values()) == r["vendor_ops"] > 0, r
        assert set(r["vendor_calls"]) <= {"fused", "conv", "conv+bias", "matmul"}, r
    assert summary_main([str(tmp_path), "--gpu", "emu", "--commit", "c0"]) == 0
    summ = json.loads((tmp_path / "gpu_summary.json").read_text())
    assert set(summ) == {"gpu", "commit", "models", "launch_host_us", "preemption_us", "peer"}
    assert set(summ["models"][0]) == {"model", "precision", "ours_ms", "torch_eager_ms",
                                      "torch_graphs_ms", "ok"}
    assert summ["launch_host_us"] > 0 and set(summ["preemption_us"]) == {"p50", "p99", "n"}
    (peer,) = summ["peer"]
    assert set(peer) == {"workload", "precision", "avi", "torch_prio", "torch_rt_alone"}


def test_misaligned_operand_views_are_declared_to_the_library(dev, runner):
    """A gemm reading a view 4 bytes into its buffer: the op tells cuBLASLt the real
    alignment (the emulated library, like the real one, fails a pointer less aligned than
    the algorithm was chosen for), so it runs and matches numpy."""
    rng = np.random.default_rng(3)
    b = PlanBuilder("mis")
    big = b.tensor("big", (1, 8 * 32 + 1), role="input")
    a = b.tensor("a", (8, 32), buffer=b.tensors[big].buffer, byte_offset=4)
    wv = rng.standard_normal((32, 8)).astype(np.float32)
    w = b.weight("w", wv)
    y = b.tensor("y", (8, 8), role="output")
    b.kernel("gemm", [a, w], [y], trans_a=0, trans_b=0, alpha=1.0, beta=1.0, bias=None,
             epilogue=[])
    plan = b.build()
    h = dev.load_plan(plan)
    (row,) = dev.vendor_report(h)
    assert row["path"] == "vendor", row
    xb = rng.standard_normal((1, 8 * 32 + 1)).astype(np.float32)
    got = runner.run(h, {"big": xb})["y"]
    np.testing.assert_allclose(got, xb[0, 1:].reshape(8, 32) @ wv, rtol=1e-5, atol=1e-5)


def test_a_failing_vendor_launch_fails_its_task_with_the_library_s_words():
    """A vendor launch that returns an error (here: a stream without its vendor context)
    is the task's DeviceFaultError naming the cause, like a failing cuLaunchKernel."""
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer.devices.cuda import CudaDevice
    from av_infer.errors import DeviceFaultError

    d = CudaDevice(emulate=True, vendor="force")
    try:
        r = Runner(d)
        d._disp.set_stream_vendor(r.stream, 0)
        plan, x = chain_plan(seed=1)
        h = d.load_plan(plan)
        t = 5
        d.new_task(h, t)
        d.write_inputs(t, x)
        d.enqueue(r.stream, t, 0, len(plan.kernels) - 1)
        r.wait(t, len(plan.kernels) - 1)
        with pytest.raises(DeviceFaultError, match="without a vendor context"):
            d.read_outputs(t)
        d.release_task(t)
    finally:
        d.close()


def test_auto_mode_picks_per_op_by_measurement():
    """``vendor="auto"``: each eligible op is timed both ways at load (CUDA events; on the
    emulator host time, which says nothing about a GPU) and runs on the faster path (ours
    only when faster by more than ``cuda_choices.AUTO_MARGIN``); measured afresh here
    (``vendor_choices="measure"``: the recorded choices have tests of their own)."""
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer.devices.cuda import CudaDevice
    from av_infer.devices.cuda_choices import decide

    d = CudaDevice(emulate=True, vendor="auto", vendor_choices="measure")
    try:
        _, plan, x = _zoo("tiny_cnn")
        h = d.load_plan(plan)
        rows = d.vendor_report(h)
        assert rows and all("own_us" in r and "vendor_us" in r for r in rows)
        for r in rows:
            assert r["path"] == decide(r["own_us"], r["vendor_us"]), r
        got = Runner(d).run(h, x)
        from av_infer.kernels.cpu import CpuPlanRunner

        want = CpuPlanRunner(plan).run(x)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)
    finally:
        d.close()


def _vendor_include_dirs() -> list[str]:
    """Folders holding cublasLt.h and cudnn.h (and the CUDA runtime headers they include):
    ``$AV_INFER_VENDOR_INCLUDE`` (a ':' list), NVIDIA's wheels, /usr/local/cuda*."""
    import glob
    import os
    import site
    import sys

    dirs = [d for d in os.environ.get("AV_INFER_VENDOR_INCLUDE", "").split(":") if d]
    for sp in [*sys.path, *site.getsitepackages()]:
        dirs += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "include")))
    dirs += sorted(glob.glob("/usr/local/cuda*/include"))
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


@pytest.mark.gpu
def test_declared_vendor_abi_matches_the_headers(tmp_path):
    """The enum values and struct layouts ``cuda_vendor.pyx`` declares by hand (and the
    emulated libraries' status codes) against NVIDIA's own headers, by a C compile of
    static assertions. Runs where the headers are (the GPU image's wheels, or
    ``$AV_INFER_VENDOR_INCLUDE``); marked gpu so the GPU check runs it, needs no GPU."""
    import os
    import re
    import shutil
    import subprocess
    from pathlib import Path

    inc = _vendor_include_dirs()
    have = {h: any(os.path.isfile(os.path.join(d, h)) for d in inc)
            for h in ("cublasLt.h", "cudnn.h", "cuda_runtime_api.h")}
    if not all(have.values()) or not shutil.which("gcc"):
        pytest.skip(f"NVIDIA headers not here ({have}); set AV_INFER_VENDOR_INCLUDE")
    root = Path(__file__).resolve().parents[2]
    pyx = (root / "av_infer" / "_cy" / "cuda_vendor.pyx").read_text()
    rename = {"CUDNN_FWD_IMPLICIT_PRECOMP_GEMM": "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM",
              "CUDNN_ALGOS": "CUDNN_CONVOLUTION_FWD_ALGO_COUNT"}
    vals = {rename.get(n, n): int(v) for n, v in
            re.findall(r"^\s{4}((?:CUBLAS|CUDA_R|CUDNN)\w*) = (\d+)", pyx, re.M)}
    emu = (root / "av_infer" / "devices" / "cuda_emu" / "vendor_emu.c").read_text()
    vals.update({n: int(v) for n, v in re.findall(r"((?:CUBLAS|CUDNN)_STATUS_\w+) = (\d+)", emu)})
    assert len(vals) > 40
    lines = ["#include <stddef.h>", "#include <cublasLt.h>", "#include <cudnn.h>",
             "struct ConvPerf { int algo; int status; float time; size_t memory;"
             " int determinism; int mathType; int reserved[3]; };"]
    lines += [f'_Static_assert({n} == {v}, "{n} is not {v}");' for n, v in vals.items()]
    lines += [
        '_Static_assert(sizeof(cublasLtMatmulAlgo_t) == 64, "algo");',
        '_Static_assert(offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize) == 64, "ws");',
        '_Static_assert(offsetof(cublasLtMatmulHeuristicResult_t, state) == 72, "state");',
        '_Static_assert(sizeof(cublasLtMatmulHeuristicResult_t) <= 256, "result");',
        '_Static_assert(sizeof(cudnnConvolutionFwdAlgoPerf_t) == sizeof(struct ConvPerf), "");',
        '_Static_assert(offsetof(cudnnConvolutionFwdAlgoPerf_t, mathType)'
        ' == offsetof(struct ConvPerf, mathType), "perf");',
    ]
    src = tmp_path / "abi.c"
    src.write_text("\n".join(lines) + "\n")
    res = subprocess.run(["gcc", "-std=c11", "-fsyntax-only", *(f"-I{d}" for d in inc),
                          str(src)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    print(f"{len(vals)} constants and 6 layouts match the headers in {inc}")


@pytest.mark.gpu
def test_the_real_vendor_libraries_load_and_resolve_every_entry_point():
    """cuBLASLt and cuDNN 9 as ``find_library`` finds them (the GPU image's wheels, or
    ``$AV_INFER_CUBLASLT`` / ``$AV_INFER_CUDNN``): dlopened with cuDNN's sub-libraries
    preloaded, every entry point resolved, versions and error strings read (no GPU
    needed for that much; handles need one)."""
    from av_infer._cy.cuda_vendor import DNN_BASE, Vendor

    from av_infer.devices.cuda_vendor import cudnn_preload

    try:
        lt, dnn = find_library("cublaslt"), find_library("cudnn")
    except VendorLibraryError as e:
        pytest.skip(f"no vendor libraries here: {e}")
    try:
        v = Vendor(lt, dnn, cudnn_preload(dnn))
    except RuntimeError as e:  # every symbol resolved, but a cuBLASLt handle needs a GPU
        if GPU_OK:
            raise
        assert "cublasLtCreate" in str(e), e
        v = Vendor(None, dnn, cudnn_preload(dnn))  # cuDNN creates no handle at load
    ver = v.versions()
    print(f"{lt}: {ver.get('cublaslt')}; {dnn}: {ver['cudnn']}")
    assert ver.get("cublaslt", 120000) >= 120000 and ver["cudnn"] >= 90000
    assert "CUDNN_STATUS_NOT_SUPPORTED" in v.error_string(DNN_BASE + 3000)
    v.close()


# -- identity convs: cudnnConvolutionForward (+ cudnnAddTensor) instead of the fused call ------
#: (name, attributes, bias, then): parallel convs of one input, each a graph output;
#: ``then``: "" identity, "relu", "add" (a same-shape residual: x itself)
_IDENTITY_CONVS = [
    ("c3_bias", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), True, ""),
    ("c3_nobias", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), False, ""),
    ("g2_s2_d2_bias", dict(kernel_shape=[3, 3], pads=[2, 2, 2, 2], strides=[2, 2],
                           dilations=[2, 2], group=2), True, ""),
    ("g4_s1x2_d1x2_nobias", dict(kernel_shape=[3, 2], pads=[1, 1, 1, 1], strides=[1, 2],
                                 dilations=[1, 2], group=4), False, ""),
    ("p1x1_nobias", dict(kernel_shape=[1, 1]), False, ""),
    ("c3_relu_nobias", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), False, "relu"),
    ("c3_res_bias", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), True, "add"),
]
#: the call path each must take (docs/cuda_vendor.md, "Identity convs")
_WANT_CALL = {"c3_bias": "conv+bias", "c3_nobias": "conv", "g2_s2_d2_bias": "conv+bias",
              "g4_s1x2_d1x2_nobias": "conv", "p1x1_nobias": "conv",
              "c3_relu_nobias": "fused", "c3_res_bias": "fused"}


def _identity_conv_model(path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    c = 8
    nodes, inits, outs = [], [], []
    for name, attrs, bias, then in _IDENTITY_CONVS:
        g = attrs.get("group", 1)
        kh, kw = attrs["kernel_shape"]
        w = rng.standard_normal((c, c // g, kh, kw)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"{name}_w"))
        ins = ["x", f"{name}_w"]
        if bias:
            inits.append(numpy_helper.from_array(rng.standard_normal(c).astype(np.float32),
                                                 f"{name}_b"))
            ins.append(f"{name}_b")
        conv_out = f"{name}_conv" if then else name
        nodes.append(helper.make_node("Conv", ins, [conv_out], name=name, **attrs))
        if then == "relu":
            nodes.append(helper.make_node("Relu", [conv_out], [name]))
        elif then == "add":
            nodes.append(helper.make_node("Add", [conv_out, "x"], [name]))
        st, dl, pd = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1]), \
            attrs.get("pads", [0, 0, 0, 0])
        hw = [(n + pd[i] + pd[i + 2] - dl[i] * (k - 1) - 1) // st[i] + 1
              for i, (n, k) in enumerate(((13, kh), (11, kw)))]
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, c, *hw]))
    graph = helper.make_graph(nodes, "identity_convs",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             [1, c, 13, 11])], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def vendor_calls(dev) -> dict[str, int]:
    """Executed calls of the emulated libraries by entry point, in this process."""
    out = (ctypes.c_uint64 * 4)()
    ctypes.CDLL(dev._driver_path).avi_emu_vendor_calls(out)
    return dict(zip(("matmul", "fused", "conv", "add_tensor"), map(int, out), strict=True))


@pytest.mark.parametrize("workspace_mb", [1, 0])
def test_identity_convs_leave_the_fused_call_and_match_onnxruntime(tmp_path, workspace_mb):
    """Convs with identity activation and no residual run ``cudnnConvolutionForward`` with
    the heuristics' first deterministic algorithm that fits the workspace (the fused call
    would allow only IMPLICIT_PRECOMP_GEMM with identity), then ``cudnnAddTensor`` only
    where the conv has a bias; ReLU and residual convs stay fused. With and without bias,
    groups, strides, dilation, against ONNX Runtime; each op's call path reported, each
    call run exactly once per request; outputs bit-identical between runs."""
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer.devices.cuda import CudaDevice
    from av_infer.model.compiler import compile_model

    path = tmp_path / "identity_convs.onnx"
    _identity_conv_model(path)
    plan = compile_model(path, name="identity_convs")
    x = {"x": np.random.default_rng(8).standard_normal((1, 8, 13, 11)).astype(np.float32)}
    d = CudaDevice(emulate=True, vendor="force", workspace_mb=workspace_mb)
    try:
        h = d.load_plan(plan)
        rows = {plan.kernels[r["kernel"]].name: r for r in d.vendor_report(h)}
        by_out = {plan.kernels[r["kernel"]].outputs[0]: r for r in rows.values()}
        print({n: (r["call"], r["algo"], r["workspace"]) for n, r in rows.items()})
        assert all(r["path"] == "vendor" for r in rows.values()), rows
        # every graph output comes from exactly one conv kernel (ReLU / Add in its epilogue)
        assert set(by_out) == set(_WANT_CALL)
        assert {o: r["call"] for o, r in by_out.items()} == _WANT_CALL
        # the emulated heuristics list WINOGRAD_NONFUSED (7) first for 3x3 stride-1
        # ungrouped convs and IMPLICIT_GEMM (0) first for 1x1: the identity convs get
        # them (workspace permitting: Winograd needs some, so with none the next one,
        # IMPLICIT_PRECOMP_GEMM (1)); the fused identity+residual conv gets 1 regardless
        c3 = 7 if workspace_mb else 1
        assert by_out["c3_bias"]["algo"] == by_out["c3_nobias"]["algo"] == c3
        assert by_out["c3_relu_nobias"]["algo"] == c3  # ReLU: fused, any algorithm
        assert by_out["p1x1_nobias"]["algo"] == 0
        assert by_out["c3_res_bias"]["algo"] == 1
        assert all(r["workspace"] <= workspace_mb << 20 for r in rows.values())
        r = Runner(d)
        calls0 = vendor_calls(d)
        got = r.run(h, x)
        calls = {k: v - calls0[k] for k, v in vendor_calls(d).items()}
        n_conv = sum(c in ("conv", "conv+bias") for c in _WANT_CALL.values())
        assert calls == {"matmul": 0, "fused": 2, "conv": n_conv,
                         "add_tensor": sum(c == "conv+bias" for c in _WANT_CALL.values())}
        want = _ort(path, x)
        for k, w in want.items():
            err = max_error(got[k], w)
            print(f"  {k} ({by_out[k]['call']}): max error {err:.2e}")
            assert err <= TOLERANCE["fp32"], (k, err)
        again = r.run(h, x)
        for k in got:
            assert np.array_equal(again[k], got[k]), k  # pinned algorithm: bit-stable
        d.unload_plan(h)
    finally:
        d.close()


def test_conv_op_call_paths_and_their_emulated_results_agree():
    """``Vendor.conv_op`` directly: identity without residual is "conv" / "conv+bias"
    (no zero-bias buffer needed), ReLU or a residual "fused"; on the emulator (which
    computes every algorithm with the same loops) "conv+bias" and the fused identity call
    give bit-identical results for the same operands (the bias added after the FP32
    accumulation in both); an op needing more workspace than its stream has is refused."""
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer._cy.cuda_vendor import DNN_BASE, ERR_WS

    from av_infer.devices.cuda import CudaDevice

    d = CudaDevice(emulate=True, vendor="force")
    try:
        v = d._vendor
        shape = dict(n=1, c=4, h=6, w=5, cout=4, kh=3, kw=3, ho=6, wo=5, pad_h=1, pad_w=1,
                     stride_h=1, stride_w=1, dil_h=1, dil_w=1, groups=1, max_ws=1 << 20)
        infos = {}
        for key, kw in {"conv+bias": dict(), "conv": dict(has_bias=0),
                        "fused_relu": dict(relu=1), "fused_res": dict(residual=1)}.items():
            op, ws = v.conv_op(**shape, **kw)
            infos[key] = (op, v.op_info(op))
            assert infos[key][1]["workspace"] == ws
        assert [i["call"] for _, i in infos.values()] == ["conv+bias", "conv", "fused", "fused"]
        assert infos["conv"][1]["algo"] == 7 and infos["fused_res"][1]["algo"] == 1
        # launched by hand on a stream of our own with a 1 MiB workspace, as the timing does
        cu, mem = d._timing._driver(), d._mem
        sp = ctypes.c_void_p()
        assert cu.cuStreamCreate(ctypes.byref(sp), 1) == 0
        ws = mem.alloc(1 << 20)
        ctx = v.stream_ctx(sp.value or 0, mem.ptr(ws), 1 << 20)
        rng = np.random.default_rng(3)
        bufs = {}
        for k, shp in {"x": (1, 4, 6, 5), "w": (4, 4, 3, 3), "b": (4,), "z": (1, 4, 6, 5),
                       "conv+bias": (1, 4, 6, 5), "fused_res": (1, 4, 6, 5)}.items():
            bufs[k] = mem.alloc(4 * int(np.prod(shp)), zero=k == "z")
            if k in ("x", "w", "b"):
                bufs[k].view(np.float32)[:] = rng.standard_normal(shp).ravel()
        for key in ("conv+bias", "fused_res"):
            args = np.array([mem.ptr(bufs[n]) for n in (key, "x", "w", "b", "z")], np.uint64)
            assert v.launch(infos[key][0], args.tobytes(), sp.value or 0, ctx) == 0
        assert cu.cuStreamSynchronize(sp) == 0
        y1, y2 = (bufs[k].view(np.float32) for k in ("conv+bias", "fused_res"))
        assert np.all(np.isfinite(y1)) and np.array_equal(y1, y2)  # z = 0: the same maths
        # an op whose algorithm needs more workspace than the stream has is refused
        big, _ = v.conv_op(**dict(shape, h=64, w=64, ho=64, wo=64, c=64, cout=64,
                                  max_ws=64 << 20))
        assert v.op_info(big)["workspace"] > 1 << 20
        assert v.launch(big, np.zeros(5, np.uint64).tobytes(), sp.value or 0, ctx) == ERR_WS
        # a launch the library refuses (no operands) is its status, with its words
        rc = v.launch(infos["conv"][0], np.zeros(5, np.uint64).tobytes(), sp.value or 0, ctx)
        assert rc == DNN_BASE + 2000 and "BAD_PARAM" in v.error_string(rc)
        cu.cuStreamDestroy_v2(sp)
    finally:
        d.close()


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_OK, reason=f"no usable GPU: {GPU_WHY}")
def test_gpu_identity_convs_against_onnxruntime(tmp_path):
    """On a GPU, the identity-conv model of the emulator test: each conv on its call path
    (``conv`` / ``conv+bias`` / ``fused``) with whatever algorithm the real heuristics
    rank first (printed), within 1e-3 of ONNX Runtime and bit-identical between runs."""
    from av_infer.devices.cuda import CudaDevice
    from av_infer.model.compiler import compile_model

    path = tmp_path / "identity_convs.onnx"
    _identity_conv_model(path)
    plan = compile_model(path, name="identity_convs")
    x = {"x": np.random.default_rng(8).standard_normal((1, 8, 13, 11)).astype(np.float32)}
    d = CudaDevice(vendor="force")
    try:
        h = d.load_plan(plan)
        by_out = {plan.kernels[r["kernel"]].outputs[0]: r for r in d.vendor_report(h)}
        print({o: (r["path"], r.get("call"), r.get("algo"), r.get("workspace"), r["reason"])
               for o, r in by_out.items()})
        assert {o: r.get("call") for o, r in by_out.items() if r["path"] == "vendor"} == {
            o: c for o, c in _WANT_CALL.items() if by_out[o]["path"] == "vendor"}
        assert all(r["reason"] for r in by_out.values() if r["path"] == "own")
        r = Runner(d)
        got = r.run(h, x)
        again = r.run(h, x)
        for k, w in _ort(path, x).items():
            assert np.array_equal(got[k], again[k]), k
            err = max_error(got[k], w)
            print(f"  {k} ({by_out[k].get('call')}): max error {err:.2e}")
            assert err <= TOLERANCE["fp32"], (k, err)
    finally:
        d.close()
