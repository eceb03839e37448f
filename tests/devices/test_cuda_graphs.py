"""Gated CUDA graphs on BE streams (docs/cuda_graphs.md), on the CPU emulator.

``CudaDevice(emulate=True, graphs="be")`` launches every kernel of ours on a BE stream as
one CUDA graph: gate kernel -> IF conditional node { the op }. The emulated driver runs the
graph with its sequential executor (cuda_emu/graph_emu.c) through exactly the driver entry
points a GPU gets. Checked here: outputs against ONNX Runtime and bit-identical to plain
launches, a raised flag skipping every gated op still queued with the completions saying so
(``executed`` False) and the gate record's progress, restore from that progress with
bit-identical outputs, the scheduler on top, a driver that refuses conditional nodes (plain
path, reported), and a fault inside a graph (the task's DeviceFaultError).
"""

from __future__ import annotations

import ctypes
import queue
import random
import time

import numpy as np
import pytest

from av_infer.devices.base import Completion
from av_infer.devices.cuda import availability
from av_infer.devices.cuda_vendor import TOLERANCE, max_error
from av_infer.kernels.cuda.gate import RAN, SKIPPED
from av_infer.kernels.cuda.samples import chain_plan
from tests.checks import be_bit_identical_under_rt, require

EMU_OK, EMU_WHY = availability(emulate=True)


def _device(**kw):
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer.devices.cuda import CudaDevice

    return CudaDevice(emulate=True, **kw)


def _emu(dev) -> ctypes.CDLL:
    return ctypes.CDLL(dev._driver_path)


def graph_runs(dev) -> tuple[int, int]:
    """(graph launches, kernel nodes run) by the emulated driver in this process."""
    out = (ctypes.c_uint64 * 2)()
    _emu(dev).avi_emu_graph_runs(out)
    return int(out[0]), int(out[1])


def raise_flag(dev, s: int) -> None:
    """Raise stream ``s``'s flag and wait until the word has landed in (emulated) device
    memory: the write goes through the flag stream asynchronously, and a launch issued
    before it lands may still see the flag down (as on a GPU)."""
    from av_infer.devices.cuda import _FLAG_STRIDE

    dev.set_preempt(s, True)
    words = dev._flags.view(np.uint32)
    deadline = time.monotonic() + 60
    while words[s * _FLAG_STRIDE // 4] != 1:
        assert time.monotonic() < deadline, "the flag write never landed"
        time.sleep(0.001)


class Runner:
    """Plans through the device without a scheduler; completions kept per (task, kernel)."""

    def __init__(self, dev, priority: int = 0) -> None:
        self.dev = dev
        self.q: queue.Queue[Completion] = queue.Queue()
        self.stream = dev.open_stream(priority)
        self.last: dict[int, int] = {}
        self.comps: dict[tuple[int, int], list[Completion]] = {}
        dev.start(self.q.put)
        self.next = 0

    def wait(self, task: int, kernel: int) -> None:
        while self.last.get(task, -1) < kernel:
            c = self.q.get(timeout=120)
            self.comps.setdefault((c.task, c.kernel), []).append(c)
            self.last[c.task] = max(self.last.get(c.task, -1), c.kernel)

    def start_task(self, handle, x) -> int:
        t = self.next = self.next + 1
        self.dev.new_task(handle, t)
        self.dev.write_inputs(t, x)
        return t

    def run(self, handle, x) -> dict[str, np.ndarray]:
        t = self.start_task(handle, x)
        n = len(handle.plan.kernels)
        self.dev.enqueue(self.stream, t, 0, n - 1)
        self.wait(t, n - 1)
        out = self.dev.read_outputs(t)
        self.dev.release_task(t)
        return out


@pytest.fixture(scope="module")
def dev():
    d = _device(graphs="be")
    yield d
    d.close()


@pytest.fixture(scope="module")
def runner(dev):
    return Runner(dev)


def _zoo(name: str):
    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    p = zoo.path(name, "scaled")
    return p, compile_model(p, name=name), zoo.sample_inputs(name, "scaled", seed=3)


def _ort(path, x) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, x), strict=True))


def test_settings_are_validated_first():
    from av_infer.devices.cuda import CudaDevice

    with pytest.raises(ValueError, match="graphs must be one of"):
        CudaDevice(emulate=True, graphs="always")


def test_off_by_default_and_the_environment_turns_it_on(monkeypatch):
    monkeypatch.delenv("AV_INFER_CUDA_GRAPHS", raising=False)
    d = _device()
    try:
        g = d.telemetry()["graphs"]
        assert g["mode"] == "off" and not g["active"] and g["reason"] == "off"
    finally:
        d.close()
    monkeypatch.setenv("AV_INFER_CUDA_GRAPHS", "be")
    d = _device()
    try:
        g = d.telemetry()["graphs"]
        assert g["mode"] == "be" and g["active"] and g["reason"] == ""
        assert d._disp.graphs_missing() == []
    finally:
        d.close()


@pytest.mark.parametrize("name", ["tiny_cnn", "tiny_mlp", "tiny_transformer", "resnet152"])
def test_zoo_through_gated_graphs_matches_onnxruntime(name, dev, runner):
    path, plan, x = _zoo(name)
    h = dev.load_plan(plan)
    n = len(plan.kernels)
    assert dev.telemetry()["graphs"]["active"]
    assert dev.telemetry()["graphs"]["plans"][name] == n
    st0 = dev._disp.stream_stats(runner.stream)
    g0 = graph_runs(dev)
    t = runner.next + 1
    got = runner.run(h, x)
    st = dev._disp.stream_stats(runner.stream)
    assert st["graphs"] and st["graph_launched"] - st0["graph_launched"] == n
    assert graph_runs(dev)[0] - g0[0] == n
    assert graph_runs(dev)[1] - g0[1] == 2 * n  # every gate and every op ran
    assert all(runner.comps[(t, k)][-1].executed is True for k in range(n))
    want = _ort(path, x)
    for k, w in want.items():
        err = max_error(got[k], w)
        print(f"{name} {k}: max error {err:.2e} (fp32 tolerance {TOLERANCE['fp32']:.0e})")
        assert err <= TOLERANCE["fp32"], (name, k, err)
    dev.unload_plan(h)


def test_gated_graphs_equal_plain_launches_bit_for_bit(dev, runner):
    plan, x = chain_plan(seed=4)
    h = dev.load_plan(plan)
    got = runner.run(h, x)
    plain = _device()
    try:
        assert not plain.telemetry()["graphs"]["active"]
        ref = Runner(plain).run(plain.load_plan(plan), x)
    finally:
        plain.close()
    for k in ref:
        assert np.array_equal(got[k], ref[k])
    dev.unload_plan(h)


def test_a_raised_flag_skips_every_gated_op_and_says_so(dev, runner):
    """Launched under a raised flag every gate stays shut: no op runs, every completion is
    ``executed=False``, the record shows nothing ran; with the flag down the same task runs
    whole and equals the reference."""
    plan, x = chain_plan(seed=2)
    h = dev.load_plan(plan)
    n = len(plan.kernels)
    s = runner.stream
    ref = runner.run(h, x)
    st0 = dev._disp.stream_stats(s)
    g0 = graph_runs(dev)
    t = runner.start_task(h, x)
    raise_flag(dev, s)
    try:
        dev.enqueue(s, t, 0, n - 1)
        runner.wait(t, n - 1)
    finally:
        dev.set_preempt(s, False)
    st = dev._disp.stream_stats(s)
    assert st["graph_skipped"] - st0["graph_skipped"] == n
    assert graph_runs(dev)[1] - g0[1] == n  # the gates only
    assert [runner.comps[(t, k)][-1].executed for k in range(n)] == [False] * n
    rec = dev._tasks[t].grec
    assert int(rec[0]) == 0 and all(int(w) == SKIPPED for w in rec[1:])
    runner.last[t] = -1
    dev.enqueue(s, t, 0, n - 1)
    runner.wait(t, n - 1)
    assert all(runner.comps[(t, k)][-1].executed is True for k in range(n))
    assert int(rec[0]) == n and all(int(w) == RAN for w in rec[1:])
    out = dev.read_outputs(t)
    dev.release_task(t)
    for k in ref:
        assert np.array_equal(out[k], ref[k])
    dev.unload_plan(h)


def _preempt_at_random_point(dev, runner, h, x, n: int, rng: random.Random):
    """Start a task of plan ``h`` on the runner's stream, reset it and raise the flag once
    a random kernel completed, wait for what was sent to leave, lower the flag. Returns
    ``(task, reset info, kernels whose completion says they ran, gate record, progress)``
    (progress: the record's count of leading ops that ran)."""
    s = runner.stream
    t = runner.start_task(h, x)
    dev.enqueue(s, t, 0, n - 1)
    runner.wait(t, rng.randrange(0, n - 1))
    info = dev.reset(s)
    dev.set_preempt(s, True)
    if info is not None:
        runner.wait(info.task, info.last_sent)
    else:
        # nothing was queued or in flight at the reset: every launch of ``t`` was sent and
        # has left the device, but its completions may still sit in the runner's queue
        # (consumed only by ``wait``): take them before reading what ran
        runner.wait(t, n - 1)
    dev.set_preempt(s, False)
    ran = [k for k in range(n) if (t, k) in runner.comps
           and runner.comps[(t, k)][-1].executed]
    rec = dev._tasks[t].grec
    return t, info, ran, rec, int(rec[0])


def test_restore_resumes_from_the_recorded_progress_bit_identical(dev, runner):
    """Reset + flag at a random point: the ops that ran form a prefix, the gate record's
    progress word is its length, the completions say exactly which ran (no guess), and a
    restore from that progress re-runs nothing and gives bit-identical outputs."""
    _, plan, x = _zoo("resnet152")
    h = dev.load_plan(plan)
    n = len(plan.kernels)
    s = runner.stream
    ref = runner.run(h, x)
    rng = random.Random(0)
    restored = skipped_any = 0
    for _trial in range(12):
        t, info, ran, rec, progress = _preempt_at_random_point(dev, runner, h, x, n, rng)
        assert ran == list(range(progress))  # a prefix, and the record's progress is its end
        assert all(int(rec[1 + k]) == RAN for k in ran)
        sent = info.last_sent if info is not None and info.task == t else n - 1
        skipped = [k for k in range(progress, sent + 1)
                   if runner.comps[(t, k)][-1].executed is False]
        assert skipped == list(range(progress, sent + 1))
        skipped_any += bool(skipped)
        if progress < n:
            restored += 1
            g0 = graph_runs(dev)[1]
            runner.last[t] = progress - 1
            dev.enqueue(s, t, progress, n - 1)
            runner.wait(t, n - 1)
            assert graph_runs(dev)[1] - g0 == 2 * (n - progress)  # nothing re-ran
        assert int(rec[0]) == n
        out = dev.read_outputs(t)
        for k in ref:
            assert np.array_equal(out[k], ref[k]), (_trial, info, progress)
        dev.release_task(t)
    assert restored > 0 and skipped_any > 0
    dev.unload_plan(h)


def test_vendor_ops_stay_on_the_host_check_beside_gated_graphs():
    """vendor="force" + graphs="be": vendor ops get no graph (closed kernels keep the host
    flag check, executed unknown), the kernels of ours do; under a raised flag nothing runs
    and the gated completions say False; flag down: bit-identical to the reference."""
    d = _device(graphs="be", vendor="force")
    try:
        r = Runner(d)
        plan, x = chain_plan(seed=6)
        h = d.load_plan(plan)
        n = len(plan.kernels)
        vendor = [k for k in range(n) if h.vendor and h.vendor[k] is not None]
        assert vendor and all(h.graphs[k] == 0 for k in vendor)
        assert all(h.graphs[k] for k in range(n) if k not in vendor)
        ref = r.run(h, x)
        t = r.start_task(h, x)
        raise_flag(d, r.stream)
        try:
            d.enqueue(r.stream, t, 0, n - 1)
            r.wait(t, n - 1)
        finally:
            d.set_preempt(r.stream, False)
        ex = [r.comps[(t, k)][-1].executed for k in range(n)]
        assert all(ex[k] is None for k in vendor)
        assert all(ex[k] is False for k in range(n) if k not in vendor)
        r.last[t] = -1
        d.enqueue(r.stream, t, 0, n - 1)
        r.wait(t, n - 1)
        out = d.read_outputs(t)
        d.release_task(t)
        for k in ref:
            assert np.array_equal(out[k], ref[k])
    finally:
        d.close()


def test_rt_streams_stay_on_plain_launches(dev):
    sid = dev.open_stream(1)
    assert not dev._disp.stream_stats(sid)["graphs"]


def test_scheduler_reef_over_gated_graphs_is_bit_identical():
    """The real scheduler (unchanged) over gated BE graphs: BE outputs under RT preemption
    equal the unpreempted ones bit for bit; BE ran through graphs."""
    from av_infer import Runtime

    _, be, x = _zoo("resnet152")
    _, rt_plan, x_rt = _zoo("tiny_mlp")
    d = _device(graphs="be")
    with Runtime(d, policy="reef", c=4) as rt:
        rt.load_model("be", be)
        rt.load_model("rt", rt_plan)
        be_bit_identical_under_rt(rt, x, x_rt, n_be=6, n_rt=30)
        assert rt.stats()["preemptions"] > 0
        tel = d.telemetry()
    assert sum(s["graph_launched"] for s in tel["streams"]) > 0


def test_a_driver_that_refuses_conditional_nodes_falls_back_and_says_so():
    """cuGraphConditionalHandleCreate refused (the emulator's hook, as a driver without
    conditional nodes): the plan loads, runs the plain vHQ path (executed unknown: None),
    gives the right outputs, and telemetry names the refusing call."""
    d = _device(graphs="be")
    _emu(d).avi_emu_graph_refuse(1)
    try:
        plan, x = chain_plan(seed=3)
        h = d.load_plan(plan)
        g = d.telemetry()["graphs"]
        assert not g["active"] and g["mode"] == "be"
        assert "cuGraphConditionalHandleCreate" in g["reason"] and "801" in g["reason"]
        assert h.graphs == []
        r = Runner(d)
        assert not d._disp.stream_stats(r.stream)["graphs"]
        t = r.next + 1
        got = r.run(h, x)
        assert r.comps[(t, 0)][-1].executed is None
        want = _ref_chain(plan, x)
        for k in want:
            assert np.array_equal(got[k], want[k])
    finally:
        _emu(d).avi_emu_graph_refuse(0)
        d.close()


def test_a_driver_that_refuses_updates_inside_conditional_bodies_falls_back_at_load():
    """Every gated launch updates the op node inside the IF body; a driver that refuses that
    (the emulator's hook 2) is found at load by a probe update, not per launch: plain path,
    the reason names the call, no BE request fails."""
    d = _device(graphs="be")
    _emu(d).avi_emu_graph_refuse(2)
    try:
        plan, x = chain_plan(seed=3)
        h = d.load_plan(plan)
        g = d.telemetry()["graphs"]
        assert not g["active"] and h.graphs == []
        assert "op node in the IF body" in g["reason"] and "801" in g["reason"]
        r = Runner(d)
        got = r.run(h, x)
        want = _ref_chain(plan, x)
        for k in want:
            assert np.array_equal(got[k], want[k])
    finally:
        _emu(d).avi_emu_graph_refuse(0)
        d.close()


def _ref_chain(plan, x):
    plain = _device()
    try:
        return Runner(plain).run(plain.load_plan(plan), x)
    finally:
        plain.close()


def test_a_fault_inside_a_graph_fails_its_task_with_a_typed_error():
    """A kernel node failing inside a graph (the emulator's hook) fails the graph launch
    like a failing cuLaunchKernel: the task's read_outputs raises DeviceFaultError."""
    from av_infer.errors import DeviceFaultError

    d = _device(graphs="be")
    try:
        r = Runner(d)
        plan, x = chain_plan(seed=1)
        h = d.load_plan(plan)
        n = len(plan.kernels)
        t = r.start_task(h, x)
        _emu(d).avi_emu_graph_fail_after(5)
        try:
            d.enqueue(r.stream, t, 0, n - 1)
            r.wait(t, n - 1)
        finally:
            _emu(d).avi_emu_graph_fail_after(0)
        with pytest.raises(DeviceFaultError, match="719"):
            d.read_outputs(t)
        d.release_task(t)
    finally:
        d.close()


def test_gpu_graphs_check_script_on_the_emulator(tmp_path, capsys):
    """The GPU step's script (scripts/gpu_graphs_check.py) runs end to end on the emulator:
    both modes right against ONNX Runtime, preemption trials restored bit-identical, the
    gated mode knowing what the flag caught, the plain mode not."""
    import importlib.util
    import json
    from pathlib import Path

    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu_graphs_check.py"
    spec = importlib.util.spec_from_file_location("gpu_graphs_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rc = mod.main(["--emulate", "--variant", "scaled", "--model", "tiny_cnn", "--repeats", "2",
                   "--trials", "4", "--graph-ops", "1,4", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "gpu_graphs.json").read_text())
    assert rc == 0 and [m["mode"] for m in res["modes"]] == ["off", "be", "be"]
    assert [m["graph_ops"] for m in res["modes"]] == [1, 1, 4]
    off, be, be4 = res["modes"]
    assert off["ok"] and be["ok"] and be["graphs"]["active"]
    assert off["preempt"]["caught"]["ran"] == off["preempt"]["caught"]["skipped"] == 0
    assert be["preempt"]["caught"]["unknown"] == 0
    assert be4["ok"] and be4["preempt"]["caught"]["unknown"] == 0
    assert be4["stream"]["graph_launched"] < be4["stream"]["graph_ops"]
    assert capsys.readouterr().out.splitlines()[-1].startswith("gpu_graphs: {")


def _cuda_include() -> str | None:
    import glob
    import os

    cands = [os.path.join(os.environ[v], "include") for v in ("CUDA_HOME", "CUDA_PATH")
             if os.environ.get(v)]
    cands += sorted(glob.glob("/usr/local/cuda*/include"), reverse=True)
    return next((d for d in cands if os.path.isfile(os.path.join(d, "cuda.h"))), None)


def test_declared_graph_abi_matches_cuda_h(tmp_path):
    """What ``cuda_dispatch.pyx`` and ``graph_emu.c`` declare by hand (struct layouts, enum
    values, prototypes of the graph entry points) against NVIDIA's ``cuda.h``, by a C compile
    of static assertions and function-pointer assignments (-Werror). Runs where a CUDA
    toolkit's headers are (``/usr/local/cuda*``, ``$CUDA_HOME``); needs no GPU.
    ``cuGraphAddNode``'s unversioned symbol is declared by cuda.h only for the driver's own
    build (the name maps to ``cuGraphAddNode_v2`` with edge data): its 5-argument ABI is
    checked here against that legacy declaration, made visible on purpose."""
    import shutil
    import subprocess
    from pathlib import Path

    inc = require(_cuda_include(), "CUDA toolkit headers (cuda.h)")
    require(shutil.which("gcc"), "gcc")
    src = tmp_path / "abi.c"
    src.write_text(r"""
#include <stddef.h>
#include <cuda.h>
struct K { void* func; unsigned g[3], b[3], smem; void** kp; void** extra; void* kern;
           void* ctx; };
struct C { unsigned long long handle; int type; unsigned size; void* out; void* ctx; };
_Static_assert(sizeof(CUgraphNodeParams) == 256, "CUgraphNodeParams size");
_Static_assert(offsetof(CUgraphNodeParams, kernel) == 16, "union offset");
_Static_assert(offsetof(CUgraphNodeParams, conditional) == 16, "union offset");
_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS_v2) == sizeof(struct K), "kernel params");
_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS_v3) == sizeof(struct K), "kernel params v3");
_Static_assert(offsetof(CUDA_KERNEL_NODE_PARAMS_v2, kernelParams) == offsetof(struct K, kp), "kp");
_Static_assert(offsetof(CUDA_KERNEL_NODE_PARAMS_v2, ctx) == offsetof(struct K, ctx), "ctx");
_Static_assert(sizeof(CUDA_CONDITIONAL_NODE_PARAMS) == sizeof(struct C), "cond params");
_Static_assert(offsetof(CUDA_CONDITIONAL_NODE_PARAMS, phGraph_out) == offsetof(struct C, out), "");
_Static_assert(offsetof(CUDA_CONDITIONAL_NODE_PARAMS, ctx) == offsetof(struct C, ctx), "");
_Static_assert(sizeof(CUgraphConditionalHandle) == 8, "handle");
_Static_assert(CU_GRAPH_NODE_TYPE_KERNEL == 0 && CU_GRAPH_NODE_TYPE_CONDITIONAL == 13, "");
_Static_assert(CU_GRAPH_COND_TYPE_IF == 0 && CU_GRAPH_COND_ASSIGN_DEFAULT == 1, "");
typedef CUresult (*p_create)(CUgraphConditionalHandle*, CUgraph, CUcontext, unsigned, unsigned);
typedef CUresult (*p_inst)(CUgraphExec*, CUgraph, unsigned long long);
typedef CUresult (*p_set)(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS_v2*);
typedef CUresult (*p_launch)(CUgraphExec, CUstream);
typedef CUresult (*p_gcreate)(CUgraph*, unsigned);
p_create a = cuGraphConditionalHandleCreate;
p_inst b = cuGraphInstantiateWithFlags;
p_set c = cuGraphExecKernelNodeSetParams_v2;
p_launch d = cuGraphLaunch;
p_gcreate e = cuGraphCreate;
#undef cuGraphAddNode
CUresult CUDAAPI cuGraphAddNode(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                                CUgraphNodeParams*);
""")
    res = subprocess.run(["gcc", "-std=c11", "-fsyntax-only", "-Werror=incompatible-pointer-types",
                          f"-I{inc}", str(src)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    # the legacy declaration the unversioned symbol keeps (for binaries built before 13)
    text = Path(inc, "cuda.h").read_text(errors="replace")
    assert ("CUresult CUDAAPI cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, "
            "const CUgraphNode *dependencies, size_t numDependencies, "
            "CUgraphNodeParams *nodeParams);") in text
    print(f"graph ABI matches {inc}/cuda.h")


def test_the_gate_kernel_compiles_with_nvcc_without_rdc(tmp_path):
    """The gate kernel (kernels/cuda/gate.py) compiles to a cubin for sm_90 with the CUDA
    toolkit's nvcc, without -rdc: ``cudaGraphSetConditional`` stays an undefined symbol of
    the cubin, which the driver resolves when it loads the module (as it does for the
    device runtime's builtins; only a GPU can confirm that part). Skips without nvcc."""
    import os
    import shutil
    import subprocess

    from av_infer.kernels.cuda.gate import GATE_SOURCE

    inc = _cuda_include()
    nvcc = shutil.which("nvcc") or (os.path.join(os.path.dirname(inc), "bin", "nvcc")
                                    if inc else None)
    require(nvcc if nvcc and os.path.isfile(nvcc) else None, "nvcc (CUDA toolkit)")
    cu = tmp_path / "gate.cu"
    cu.write_text(GATE_SOURCE)
    out = tmp_path / "gate.cubin"
    res = subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-o", str(out), str(cu)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    data = out.read_bytes()
    assert data[:4] == b"\x7fELF" and b"avi_gate" in data and b"cudaGraphSetConditional" in data


# -- the emulated driver's graph executor, call by call (graph_emu.c) -------------------------
_PUT_SOURCE = r"""
extern "C" __global__ void avi_put(unsigned int* p, unsigned int v) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *p = v;
}
"""


class _KernelNodeParams(ctypes.Structure):
    _fields_ = [("func", ctypes.c_void_p), ("g", ctypes.c_uint * 3), ("b", ctypes.c_uint * 3),
                ("smem", ctypes.c_uint), ("kernelParams", ctypes.POINTER(ctypes.c_void_p)),
                ("extra", ctypes.c_void_p), ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


class _CondNodeParams(ctypes.Structure):
    _fields_ = [("handle", ctypes.c_uint64), ("type", ctypes.c_int), ("size", ctypes.c_uint),
                ("phGraph_out", ctypes.POINTER(ctypes.c_void_p)), ("ctx", ctypes.c_void_p)]


class _NodeUnion(ctypes.Union):
    _fields_ = [("reserved1", ctypes.c_longlong * 29), ("kernel", _KernelNodeParams),
                ("conditional", _CondNodeParams)]


class _NodeParams(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("reserved0", ctypes.c_int * 3), ("u", _NodeUnion),
                ("reserved2", ctypes.c_longlong)]


class _Graphs:
    """ctypes on the emulated driver's graph entry points, as the dispatcher calls them."""

    def __init__(self, dev) -> None:
        from av_infer.devices.cuda_emu.kernels import HostKernelCompiler
        from av_infer.kernels.cuda.gate import GATE_SOURCE

        assert ctypes.sizeof(_NodeParams) == 256 and _NodeParams.u.offset == 16
        self.L = L = _emu(dev)
        L.cuGraphConditionalHandleCreate.argtypes = [ctypes.POINTER(ctypes.c_uint64),
                                                     ctypes.c_void_p, ctypes.c_void_p,
                                                     ctypes.c_uint, ctypes.c_uint]
        L.cuGraphInstantiateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p),
                                                  ctypes.c_void_p, ctypes.c_ulonglong]
        for name in ("cuGraphLaunch", "cuStreamSynchronize", "cuGraphExecDestroy",
                     "cuGraphDestroy"):
            getattr(L, name).argtypes = [ctypes.c_void_p] * (2 if name == "cuGraphLaunch" else 1)
        L.cuGraphExecKernelNodeSetParams_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                                        ctypes.POINTER(_KernelNodeParams)]
        L.cuGraphAddNode.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                     ctypes.POINTER(_NodeParams)]
        L.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        L.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                          ctypes.c_char_p]
        assert L.cuInit(0) == 0
        cc = HostKernelCompiler()
        self.gate = self.func(cc.compile(GATE_SOURCE), b"avi_gate")
        self.put = self.func(cc.compile(_PUT_SOURCE), b"avi_put")
        self.stream = ctypes.c_void_p()
        assert L.cuStreamCreate(ctypes.byref(self.stream), 0) == 0
        self.keep: list = []

    def func(self, image: bytes, name: bytes) -> ctypes.c_void_p:
        m, f = ctypes.c_void_p(), ctypes.c_void_p()
        assert self.L.cuModuleLoadData(ctypes.byref(m), image) == 0
        assert self.L.cuModuleGetFunction(ctypes.byref(f), m, name) == 0
        return f

    def kparams(self, func, *vals) -> _KernelNodeParams:
        boxes = [ctypes.c_uint64(v) if isinstance(v, int) and v > 0xFFFFFFFF
                 else ctypes.c_uint32(v) if isinstance(v, int) else v for v in vals]
        arr = (ctypes.c_void_p * len(boxes))(*[ctypes.addressof(b) for b in boxes])
        self.keep += [boxes, arr]
        p = _KernelNodeParams(func=func, smem=0, kernelParams=arr)
        p.g[:] = (1, 1, 1)
        p.b[:] = (1, 1, 1)
        return p

    def add_kernel(self, graph, deps, func, *vals) -> ctypes.c_void_p:
        np_ = _NodeParams(type=0)
        np_.u.kernel = self.kparams(func, *vals)
        node = ctypes.c_void_p()
        d = (ctypes.c_void_p * max(len(deps), 1))(*deps)
        assert self.L.cuGraphAddNode(ctypes.byref(node), graph, d, len(deps),
                                     ctypes.byref(np_)) == 0
        return node

    def add_if(self, graph, deps, handle: int, ctype: int = 0) -> tuple[int, ctypes.c_void_p]:
        np_ = _NodeParams(type=13)
        np_.u.conditional = _CondNodeParams(handle=handle, type=ctype, size=1)
        node = ctypes.c_void_p()
        d = (ctypes.c_void_p * max(len(deps), 1))(*deps)
        rc = self.L.cuGraphAddNode(ctypes.byref(node), graph, d, len(deps), ctypes.byref(np_))
        body = ctypes.c_void_p(np_.u.conditional.phGraph_out[0]) if rc == 0 else None
        return rc, body

    def launch_sync(self, exe) -> None:
        assert self.L.cuGraphLaunch(exe, self.stream) == 0
        assert self.L.cuStreamSynchronize(self.stream) == 0


def test_emulated_graph_executor_gates_records_and_snapshots():
    """graph_emu.c on its own: a gate opens or shuts the IF body from the flag word and
    writes the record; an exec update changes later launches only (each launch snapshots
    its values); a handle's default applies at every launch; the executable graph outlives
    its source graph; SWITCH nodes are refused (not emulated)."""
    d = _device()
    try:
        G = _Graphs(d)
        L = G.L
        words = np.zeros(8, dtype=np.uint32)  # [flag, out, rec0, rec1, ...]
        base = words.ctypes.data
        flag, out, rec = base, base + 4, base + 8
        graph, h = ctypes.c_void_p(), ctypes.c_uint64()
        assert L.cuGraphCreate(ctypes.byref(graph), 0) == 0
        assert L.cuGraphConditionalHandleCreate(ctypes.byref(h), graph, None, 0, 1) == 0
        gate = G.add_kernel(graph, [], G.gate, ctypes.c_uint64(flag), ctypes.c_uint64(h.value),
                            ctypes.c_uint64(rec), 0)
        rc, body = G.add_if(graph, [gate.value], h.value)
        assert rc == 0
        op = G.add_kernel(body, [], G.put, ctypes.c_uint64(out), 7)
        assert G.add_if(graph, [], h.value, ctype=2)[0] == 801  # SWITCH: not emulated
        exe = ctypes.c_void_p()
        assert L.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0) == 0
        assert L.cuGraphInstantiateWithFlags(ctypes.byref(ctypes.c_void_p()), graph, 0) == 800
        runs0 = graph_runs(d)
        G.launch_sync(exe)
        assert words[1] == 7 and list(words[2:4]) == [1, RAN]
        # the exec's copy changes; the graph's node is the handle to it
        assert L.cuGraphExecKernelNodeSetParams_v2(
            exe, op, ctypes.byref(G.kparams(G.put, ctypes.c_uint64(out), 9))) == 0
        assert L.cuGraphLaunch(exe, G.stream) == 0  # snapshot: 9
        assert L.cuGraphExecKernelNodeSetParams_v2(
            exe, op, ctypes.byref(G.kparams(G.put, ctypes.c_uint64(out), 11))) == 0
        assert L.cuStreamSynchronize(G.stream) == 0
        assert words[1] == 9
        G.launch_sync(exe)
        assert words[1] == 11
        words[0] = 1  # flag up: the gate shuts the body
        G.launch_sync(exe)
        assert words[1] == 11 and words[3] == SKIPPED and words[2] == 1
        assert graph_runs(d)[0] - runs0[0] == 4
        assert graph_runs(d)[1] - runs0[1] == 4 + 3  # four gates, three ops
        # the source graph destroyed: the executable graph and its handle live on
        assert L.cuGraphDestroy(graph) == 0
        words[0] = 0
        G.launch_sync(exe)
        assert words[1] == 11 and words[3] == RAN
        assert L.cuGraphExecDestroy(exe) == 0
        # a handle's default applies at every launch (no gate: default 1 opens the body)
        g2, h2 = ctypes.c_void_p(), ctypes.c_uint64()
        assert L.cuGraphCreate(ctypes.byref(g2), 0) == 0
        assert L.cuGraphConditionalHandleCreate(ctypes.byref(h2), g2, None, 1, 1) == 0
        rc, body2 = G.add_if(g2, [], h2.value)
        G.add_kernel(body2, [], G.put, ctypes.c_uint64(out), 5)
        e2 = ctypes.c_void_p()
        assert L.cuGraphInstantiateWithFlags(ctypes.byref(e2), g2, 0) == 0
        ctypes.c_uint32.from_address(h2.value).value = 0  # a stale value from a last launch
        G.launch_sync(e2)
        assert words[1] == 5
        assert L.cuGraphExecDestroy(e2) == 0 and L.cuGraphDestroy(g2) == 0
    finally:
        d.close()


# -- graphs of several ops (CudaDevice(graph_ops=k); docs/cuda_graphs.md) -------------------
GOPS = 4


@pytest.fixture(scope="module")
def dev_k():
    d = _device(graphs="be", graph_ops=GOPS)
    yield d
    d.close()


@pytest.fixture(scope="module")
def runner_k(dev_k):
    return Runner(dev_k)


def test_graph_ops_is_validated_first_and_read_from_the_environment(monkeypatch):
    from av_infer.devices.cuda import CudaDevice

    for bad in (0, 17, "many"):
        with pytest.raises(ValueError, match="graph_ops"):
            CudaDevice(emulate=True, graphs="be", graph_ops=bad)
    monkeypatch.setenv("AV_INFER_CUDA_GRAPH_OPS", "3")
    d = _device(graphs="be")
    try:
        assert d.graph_ops == 3 and d.telemetry()["graphs"]["ops_per_graph"] == 3
    finally:
        d.close()


def test_a_graph_of_k_ops_is_one_entry_against_c(dev_k, runner_k):
    """c = 2, k = 4: the BE stream's vHQ admits c x k indices, the dispatcher c launch
    units; an RT stream stays plain (vHQ capacity c, no unit limit of its own)."""
    be = runner_k.stream
    dev_k.set_stream_capacity(be, 2)
    try:
        st = dev_k._disp.stream_stats(be)
        assert st["unit_capacity"] == 2 and dev_k._vhqs[be].c == 2 * GOPS
        rt = dev_k.open_stream(1)
        assert dev_k._disp.stream_stats(rt)["unit_capacity"] is None
        assert dev_k._vhqs[rt].c == dev_k._c
    finally:
        dev_k.set_stream_capacity(be, 4)
    assert dev_k._disp.stream_stats(be)["unit_capacity"] == 4


def test_k_op_graphs_equal_plain_launches_with_fewer_graph_launches(dev_k, runner_k):
    plan, x = chain_plan(seed=4)
    h = dev_k.load_plan(plan)
    n = len(plan.kernels)
    groups = dev_k._graph_groups(h)
    assert [f for f, _ in groups] == list(range(0, n, GOPS))
    assert len(set(h.graphs)) == len(groups)  # one graph per group, at each of its kernels
    st0 = dev_k._disp.stream_stats(runner_k.stream)
    t = runner_k.next + 1
    got = runner_k.run(h, x)
    st = dev_k._disp.stream_stats(runner_k.stream)
    assert st["graph_ops"] - st0["graph_ops"] == n
    assert st["graph_launched"] - st0["graph_launched"] == len(groups)
    assert all(runner_k.comps[(t, k)][-1].executed is True for k in range(n))
    plain = _device()
    try:
        ref = Runner(plain).run(plain.load_plan(plan), x)
    finally:
        plain.close()
    for k in ref:
        assert np.array_equal(got[k], ref[k])
    dev_k.unload_plan(h)


def test_a_raised_flag_skips_every_op_of_k_op_graphs(dev_k, runner_k):
    plan, x = chain_plan(seed=2)
    h = dev_k.load_plan(plan)
    n = len(plan.kernels)
    s = runner_k.stream
    ref = runner_k.run(h, x)
    t = runner_k.start_task(h, x)
    raise_flag(dev_k, s)
    try:
        dev_k.enqueue(s, t, 0, n - 1)
        runner_k.wait(t, n - 1)
    finally:
        dev_k.set_preempt(s, False)
    assert [runner_k.comps[(t, k)][-1].executed for k in range(n)] == [False] * n
    rec = dev_k._tasks[t].grec
    assert int(rec[0]) == 0 and all(int(w) == SKIPPED for w in rec[1:])
    runner_k.last[t] = -1
    dev_k.enqueue(s, t, 0, n - 1)
    runner_k.wait(t, n - 1)
    assert all(runner_k.comps[(t, k)][-1].executed is True for k in range(n))
    out = dev_k.read_outputs(t)
    dev_k.release_task(t)
    for k in ref:
        assert np.array_equal(out[k], ref[k])
    dev_k.unload_plan(h)


def test_preemption_inside_k_op_graphs_restores_from_the_first_skipped_op(dev_k, runner_k):
    """Reset + flag at random points of resnet152 run as graphs of 4 ops: the ops that ran
    are a prefix ending at the record's progress, every index sent after it completes
    ``executed=False`` (also those sharing a graph launch with ops that ran: the flag
    caught a graph in the middle), the restore from that progress re-runs no op (the
    executor's count: the gates of the graphs it launches plus exactly the missing ops)
    and outputs are bit-identical."""
    _, plan, x = _zoo("resnet152")
    h = dev_k.load_plan(plan)
    n = len(plan.kernels)
    s = runner_k.stream
    groups = dev_k._graph_groups(h)
    ref = runner_k.run(h, x)
    rng = random.Random(1)
    restored = split = 0
    for _trial in range(16):
        t, info, ran, rec, progress = _preempt_at_random_point(dev_k, runner_k, h, x, n, rng)
        assert ran == list(range(progress))
        sent = info.last_sent if info is not None and info.task == t else n - 1
        assert all(runner_k.comps[(t, k)][-1].executed is False
                   for k in range(progress, sent + 1))
        # the graph holding the first skipped op also held ops that ran
        split += any(f < progress <= sent and progress < f + m for f, m in groups)
        if progress < n:
            restored += 1
            g0 = graph_runs(dev_k)[1]
            runner_k.last[t] = progress - 1
            dev_k.enqueue(s, t, progress, n - 1)
            runner_k.wait(t, n - 1)
            gates = sum(m for f, m in groups if f + m > progress)
            assert graph_runs(dev_k)[1] - g0 == gates + (n - progress)
        assert int(rec[0]) == n
        out = dev_k.read_outputs(t)
        for k in ref:
            assert np.array_equal(out[k], ref[k]), (_trial, info, progress)
        dev_k.release_task(t)
    assert restored > 0 and split > 0
    dev_k.unload_plan(h)


def test_scheduler_reef_over_k_op_graphs_is_bit_identical():
    from av_infer import Runtime

    _, be, x = _zoo("resnet152")
    _, rt_plan, x_rt = _zoo("tiny_mlp")
    d = _device(graphs="be", graph_ops=GOPS)
    with Runtime(d, policy="reef", c=4) as rt:
        rt.load_model("be", be)
        rt.load_model("rt", rt_plan)
        be_bit_identical_under_rt(rt, x, x_rt, n_be=6, n_rt=30)
        assert rt.stats()["preemptions"] > 0
        tel = d.telemetry()
    launched = sum(s["graph_launched"] for s in tel["streams"])
    ops = sum(s["graph_ops"] for s in tel["streams"])
    assert 0 < launched < ops


def test_a_range_ending_inside_a_graph_and_the_next_task_both_run_right(dev_k, runner_k):
    """Task A enqueued for kernels 0..1 of a 4-op graph, task B whole right behind it: the
    launch of A's graph takes only A's two ops; the index the vHQ hands out next (B's 0,
    taken while filling A's graph) becomes the next launch. Every op runs exactly once,
    A then continues from 2, and both equal the reference."""
    plan, x = chain_plan(seed=6)
    h = dev_k.load_plan(plan)
    n = len(plan.kernels)
    assert n > GOPS
    s = runner_k.stream
    ref = runner_k.run(h, x)
    a = runner_k.start_task(h, x)
    b = runner_k.start_task(h, x)
    g0 = graph_runs(dev_k)[1]
    dev_k._vhqs[s].push(a, 0, 1)  # both queued before the dispatcher wakes (enqueue wakes it)
    dev_k.enqueue(s, b, 0, n - 1)
    runner_k.wait(b, n - 1)
    runner_k.wait(a, 1)
    dev_k.enqueue(s, a, 2, n - 1)
    runner_k.wait(a, n - 1)
    for t in (a, b):
        assert all(runner_k.comps[(t, k)][-1].executed is True for k in range(n))
        assert all(len(runner_k.comps[(t, k)]) == 1 for k in range(n))  # each op once
        out = dev_k.read_outputs(t)
        dev_k.release_task(t)
        for k in ref:
            assert np.array_equal(out[k], ref[k]), (t, k)
    groups = dev_k._graph_groups(h)
    ops_run = graph_runs(dev_k)[1] - g0 - sum(m for _, m in groups)  # minus B's gates
    # A: its first graph's 4 gates + the gates of the graphs from 2 on; ops: 2 n exactly
    a_gates = GOPS + sum(m for f, m in groups if f + m > 2)
    assert ops_run - a_gates == 2 * n
    dev_k.unload_plan(h)
