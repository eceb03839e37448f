"""RT as one graph (``CudaDevice(rt_graphs=N)``, docs/cuda_graphs.md), on the CPU emulator.

Each plan gets, at load, N graph instances: an arena of its own and the whole plan captured
(stream capture: ``cuStreamBeginCapture_v2`` relaxed, every kernel / vendor call issued
on a private stream, ``cuStreamEndCapture``, ``cuGraphInstantiateWithFlags``) with that
arena's addresses. A task takes a free instance at ``new_task``; on an RT stream it then
runs as ONE ``cuGraphLaunch`` and one completion record of all its kernels. Checked here:
the emulated capture itself (ctypes, as the dispatcher calls it), outputs bit-identical to
the plain path (ours and vendor ops), one graph launch per RT request, pool exhaustion
(plain, counted), option validation, refusals at every step (capture, end, instantiate,
launch: plain path, reported, right outputs), and BE preemption under reef unchanged.
"""

from __future__ import annotations

import ctypes
import logging
import queue

import numpy as np
import pytest

from av_infer.devices.base import Completion
from av_infer.kernels.cuda.samples import chain_plan
from tests.checks import be_bit_identical_under_rt, require
from tests.devices.test_cuda_graphs import (
    EMU_OK,
    EMU_WHY,
    _device,
    _emu,
    _Graphs,
    _ort,
    _zoo,
    graph_runs,
)


def vendor_runs(dev) -> tuple[int, int]:
    """(matmuls, convolutions) the emulated vendor libraries executed in this process."""
    out = (ctypes.c_uint64 * 2)()
    _emu(dev).avi_emu_vendor_runs(out)
    return int(out[0]), int(out[1])


class Runner:
    """Whole tasks through the device on one stream, without a scheduler; the completion
    records kept as delivered (coalesced, as the engine takes them)."""

    def __init__(self, dev, priority: int = 1) -> None:
        self.dev = dev
        self.q: queue.Queue[Completion] = queue.Queue()
        self.stream = dev.open_stream(priority)
        self.records: dict[int, list[Completion]] = {}
        dev.start(self.q.put, coalesce=True)
        self.next = 0

    def start_task(self, handle, x) -> int:
        t = self.next = self.next + 1
        self.dev.new_task(handle, t)
        self.dev.write_inputs(t, x)
        return t

    def finish(self, t: int, n: int) -> dict[str, np.ndarray]:
        got = sum(c.count for c in self.records.get(t, []))
        while got < n:
            c = self.q.get(timeout=300)
            self.records.setdefault(c.task, []).append(c)
            if c.task == t:
                got += c.count
        out = self.dev.read_outputs(t)
        self.dev.release_task(t)
        return out

    def run(self, handle, x) -> dict[str, np.ndarray]:
        t = self.start_task(handle, x)
        n = len(handle.plan.kernels)
        self.dev.enqueue(self.stream, t, 0, n - 1)
        return self.finish(t, n)


def _plain_reference(plan, x, **kw) -> dict[str, np.ndarray]:
    d = _device(**kw)
    try:
        return Runner(d).run(d.load_plan(plan), x)
    finally:
        d.close()


# -- the emulated stream capture (graph_emu.c) ------------------------------------------
def test_emulated_stream_capture_records_launches_and_replays_them():
    """A capturing stream runs nothing: its kernel launches become nodes with the values
    of the call; the instantiated graph replays them in order at every launch; another
    operation on a capturing stream (an event record) invalidates the capture (901, no
    graph); the refusal hooks answer as documented."""
    d = _device()
    try:
        G = _Graphs(d)
        L = G.L
        L.cuStreamBeginCapture_v2.argtypes = [ctypes.c_void_p, ctypes.c_int]
        L.cuStreamEndCapture.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        L.cuStreamIsCapturing.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        L.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
            ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        L.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        put = G.put
        words = np.zeros(4, dtype=np.uint32)
        base = words.ctypes.data

        def launch(i: int, v: int) -> int:
            p, val = ctypes.c_uint64(base + 4 * i), ctypes.c_uint32(v)
            arr = (ctypes.c_void_p * 2)(ctypes.addressof(p), ctypes.addressof(val))
            return L.cuLaunchKernel(put, 1, 1, 1, 1, 1, 1, 0, G.stream, arr, None)

        st = ctypes.c_int()
        assert L.cuStreamBeginCapture_v2(G.stream, 2) == 0  # CU_STREAM_CAPTURE_MODE_RELAXED
        assert L.cuStreamIsCapturing(G.stream, ctypes.byref(st)) == 0 and st.value == 1
        assert L.cuStreamBeginCapture_v2(G.stream, 2) == 401  # already capturing
        assert launch(0, 3) == 0 and launch(1, 4) == 0 and launch(0, 5) == 0
        graph = ctypes.c_void_p()
        assert L.cuStreamEndCapture(G.stream, ctypes.byref(graph)) == 0 and graph.value
        assert L.cuStreamSynchronize(G.stream) == 0
        assert list(words[:2]) == [0, 0]  # captured, not run
        exe = ctypes.c_void_p()
        assert L.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0) == 0
        r0 = graph_runs(d)
        G.launch_sync(exe)
        assert list(words[:2]) == [5, 4]  # in capture order: 3 then 5 at word 0
        words[:] = 0
        G.launch_sync(exe)
        assert list(words[:2]) == [5, 4]
        assert graph_runs(d)[0] - r0[0] == 2 and graph_runs(d)[1] - r0[1] == 6
        assert L.cuGraphDestroy(graph) == 0
        G.launch_sync(exe)  # the executable graph outlives its source
        assert L.cuGraphExecDestroy(exe) == 0
        # an event record on a capturing stream invalidates the capture
        ev = ctypes.c_void_p()
        L.cuEventCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        assert L.cuEventCreate(ctypes.byref(ev), 2) == 0
        assert L.cuStreamBeginCapture_v2(G.stream, 2) == 0
        assert launch(2, 7) == 0
        assert L.cuEventRecord(ev, G.stream) != 0
        assert L.cuStreamIsCapturing(G.stream, ctypes.byref(st)) == 0 and st.value == 2
        assert L.cuStreamEndCapture(G.stream, ctypes.byref(graph)) == 901
        assert not graph.value
        assert L.cuStreamEndCapture(G.stream, ctypes.byref(graph)) == 401  # not capturing
        assert words[2] == 0  # nothing of the invalidated capture ran
        # the refusal hooks
        hooks = L.avi_emu_graph_refuse
        try:
            hooks(3)
            assert L.cuStreamBeginCapture_v2(G.stream, 2) == 801
            hooks(4)
            assert L.cuStreamBeginCapture_v2(G.stream, 2) == 0
            assert launch(0, 1) == 0
            assert L.cuStreamEndCapture(G.stream, ctypes.byref(graph)) == 901
            hooks(0)
            assert L.cuStreamBeginCapture_v2(G.stream, 2) == 0 and launch(0, 1) == 0
            assert L.cuStreamEndCapture(G.stream, ctypes.byref(graph)) == 0
            hooks(5)
            assert L.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0) == 801
            hooks(6)
            assert L.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0) == 0
            assert L.cuGraphLaunch(exe, G.stream) == 801
        finally:
            hooks(0)
        assert L.cuGraphExecDestroy(exe) == 0 and L.cuGraphDestroy(graph) == 0
    finally:
        d.close()


# -- the option ---------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-1, 9, "two", 1.5, True])
def test_rt_graphs_is_validated_first(bad):
    """A bad value is refused before anything is made: even where no GPU exists (the
    validation comes before the availability check) and from the environment."""
    from av_infer.devices.cuda import CudaDevice

    with pytest.raises(ValueError, match="rt_graphs must be an integer"):
        CudaDevice(emulate=False, rt_graphs=bad)


def test_off_by_default_and_the_environment_sets_it(monkeypatch):
    monkeypatch.delenv("AV_INFER_CUDA_RT_GRAPHS", raising=False)
    d = _device()
    try:
        t = d.telemetry()["rt_graphs"]
        assert t["instances"] == 0 and not t["active"] and t["reason"] == "off"
        s = d.open_stream(1)
        assert not d._disp.stream_stats(s)["rt_graphs"]
    finally:
        d.close()
    monkeypatch.setenv("AV_INFER_CUDA_RT_GRAPHS", "x")
    from av_infer.devices.cuda import CudaDevice

    with pytest.raises(ValueError, match="rt_graphs"):
        CudaDevice(emulate=True)
    monkeypatch.setenv("AV_INFER_CUDA_RT_GRAPHS", "2")
    d = _device()
    try:
        t = d.telemetry()["rt_graphs"]
        assert t["instances"] == 2 and t["active"] and t["reason"] == ""
        assert d._disp.rt_graph_missing() == []
        rt, be = d.open_stream(1), d.open_stream(0)
        st = d._disp.stream_stats(rt)
        assert st["rt_graphs"] and st["unit_capacity"] == 4  # c units, one per graph launch
        assert not d._disp.stream_stats(be)["rt_graphs"]  # BE streams: unchanged
    finally:
        d.close()


# -- RT requests as one graph launch --------------------------------------------------------
@pytest.mark.parametrize("name,vendor", [("tiny_cnn", "force"), ("tiny_mlp", "off"),
                                         ("tiny_transformer", "off"), ("resnet152", "force")])
def test_rt_graph_runs_equal_the_plain_path_bit_for_bit(name, vendor):
    """Every RT request of a zoo model is one cuGraphLaunch (dispatcher and emulator count
    it) and one completion record of all its kernels, the captured vendor ops really run
    at each launch, and the outputs equal the plain per-op path's bit for bit (and ONNX
    Runtime within the fp32 tolerance)."""
    from av_infer.devices.cuda_vendor import TOLERANCE, max_error

    path, plan, x = _zoo(name)
    n = len(plan.kernels)
    ref = _plain_reference(plan, x, vendor=vendor)
    d = _device(rt_graphs=2, vendor=vendor)
    try:
        r = Runner(d)
        h = d.load_plan(plan)
        nv = sum(1 for v in (h.vendor or []) if v is not None)
        assert (nv > 0) == (vendor == "force")
        assert d.telemetry()["rt_graphs"]["plans"][name] == {"instances": 2, "kernels": n,
                                                            "reason": ""}
        g0, v0 = graph_runs(d), sum(vendor_runs(d))
        reqs = 3
        for _ in range(reqs):
            t = r.next + 1
            out = r.run(h, x)
            assert [(c.kernel, c.count) for c in r.records[t]] == [(0, n)]
            for k in ref:
                assert np.array_equal(out[k], ref[k]), (name, k)
        st = d._disp.stream_stats(r.stream)
        assert st["rt_graph_launched"] == reqs and st["rt_graph_ops"] == reqs * n
        assert st["launched"] == st["completed"] == reqs * n
        assert graph_runs(d)[0] - g0[0] == reqs
        assert sum(vendor_runs(d)) - v0 == reqs * nv  # the captured vendor calls ran
        assert st["vendor_launched"] == 0  # none went the per-op vendor path
        tel = d.telemetry()["rt_graphs"]
        assert tel["taken"] == reqs and tel["exhausted"] == 0
        for k, w in _ort(path, x).items():
            assert max_error(out[k], w) <= TOLERANCE["fp32"]
    finally:
        d.close()


def test_a_graph_launch_completes_as_single_records_for_consumers_that_ask_so():
    """A consumer that starts without ``coalesce`` gets one record per kernel of an RT
    graph launch, in order, all with the graph's times."""
    plan, x = chain_plan(seed=3)
    n = len(plan.kernels)
    d = _device(rt_graphs=1)
    try:
        q: queue.Queue[Completion] = queue.Queue()
        s = d.open_stream(1)
        d.start(q.put)
        h = d.load_plan(plan)
        d.new_task(h, 1)
        d.write_inputs(1, x)
        d.enqueue(s, 1, 0, n - 1)
        got = [q.get(timeout=120) for _ in range(n)]
        assert [(c.kernel, c.count) for c in got] == [(k, 1) for k in range(n)]
        assert len({(c.t_start, c.t_end) for c in got}) == 1
        assert d._disp.stream_stats(s)["rt_graph_launched"] == 1
        d.read_outputs(1)
        d.release_task(1)
    finally:
        d.close()


def test_pool_exhaustion_falls_back_to_plain_and_is_counted():
    """One instance, two RT requests at once: the first runs as the graph, the second
    (none free) on the plain path; both right; counted; the instance comes back to the
    pool when its task is freed and the next request takes it."""
    plan, x = chain_plan(seed=5)
    n = len(plan.kernels)
    ref = _plain_reference(plan, x)
    d = _device(rt_graphs=1)
    try:
        r = Runner(d)
        h = d.load_plan(plan)
        t1, t2 = r.start_task(h, x), r.start_task(h, x)
        tel = d.telemetry()["rt_graphs"]
        assert tel["taken"] == 1 and tel["exhausted"] == 1
        assert d._tasks[t1].rt is not None and d._tasks[t2].rt is None
        d.enqueue(r.stream, t1, 0, n - 1)
        d.enqueue(r.stream, t2, 0, n - 1)
        for t in (t1, t2):
            out = r.finish(t, n)
            for k in ref:
                assert np.array_equal(out[k], ref[k])
        assert [c.count for c in r.records[t1]] == [n]
        assert all(c.count < n for c in r.records[t2])  # plain launches, perhaps coalesced
        st = d._disp.stream_stats(r.stream)
        assert st["rt_graph_launched"] == 1 and st["launched"] == 2 * n
        assert h.rt_free == h.rt_pool  # back in the pool
        out = r.run(h, x)
        assert d.telemetry()["rt_graphs"]["taken"] == 2
        assert d._disp.stream_stats(r.stream)["rt_graph_launched"] == 2
        for k in ref:
            assert np.array_equal(out[k], ref[k])
    finally:
        d.close()


def test_a_range_that_is_not_the_whole_task_runs_plain_in_the_instance_arena():
    """An RT task enqueued in two pieces, the second only after the first has completed
    (as a resumed task would be): no graph launch (it would run kernels the vHQ has not
    handed out); the plain path in the instance's arena gives the same outputs."""
    plan, x = chain_plan(seed=7)
    n = len(plan.kernels)
    ref = _plain_reference(plan, x)
    d = _device(rt_graphs=1)
    try:
        r = Runner(d)
        h = d.load_plan(plan)
        t = r.start_task(h, x)
        assert d._tasks[t].rt is not None
        d.enqueue(r.stream, t, 0, 1)
        got = 0
        while got < 2:
            c = r.q.get(timeout=120)
            r.records.setdefault(c.task, []).append(c)
            got += c.count
        d.enqueue(r.stream, t, 2, n - 1)
        out = r.finish(t, n)
        for k in ref:
            assert np.array_equal(out[k], ref[k])
        st = d._disp.stream_stats(r.stream)
        assert st["launched"] == n and st["rt_graph_launched"] == 0
    finally:
        d.close()


# -- refusals: the plain path, reported ------------------------------------------------------
@pytest.mark.parametrize("hook,call", [(3, "cuStreamBeginCapture_v2"),
                                       (4, "cuStreamEndCapture"),
                                       (5, "cuGraphInstantiateWithFlags")])
def test_a_refused_capture_falls_back_and_says_so(hook, call, caplog):
    """The driver refuses the capture (at its start, at its end, or the instantiation):
    the plan loads without instances (telemetry and a warning name the call and its code),
    RT requests run the plain path with the right outputs, no graph launch."""
    plan, x = chain_plan(seed=8)
    ref = _plain_reference(plan, x, vendor="force")
    d = _device(rt_graphs=2, vendor="force")
    try:
        _emu(d).avi_emu_graph_refuse(hook)
        try:
            with caplog.at_level(logging.WARNING, logger="av_infer.devices.cuda"):
                h = d.load_plan(plan)
        finally:
            _emu(d).avi_emu_graph_refuse(0)
        p = d.telemetry()["rt_graphs"]["plans"][plan.name]
        assert p["instances"] == 0 and call in p["reason"], p
        assert ("801" if hook != 4 else "901") in p["reason"]
        assert any(call in rec.getMessage() for rec in caplog.records)
        assert not h.rt_pool
        r = Runner(d)
        out = r.run(h, x)
        for k in ref:
            assert np.array_equal(out[k], ref[k])
        assert d._disp.stream_stats(r.stream)["rt_graph_launched"] == 0
        assert d.telemetry()["rt_graphs"]["taken"] == 0
    finally:
        d.close()


def test_a_vendor_call_failing_under_capture_falls_back_with_the_library_error(caplog):
    """The library fails the 1st cuBLASLt call under capture
    (``avi_emu_vendor_capture_fail_nth(1)``): the plan loads without an RT graph, the
    reason names the vendor op and the library's text (not a bare number), a warning says
    so, and RT requests run the plain path right."""
    _, plan, x = _zoo("tiny_mlp")
    ref = _plain_reference(plan, x, vendor="force")
    d = _device(rt_graphs=1, vendor="force")
    try:
        _emu(d).avi_emu_vendor_capture_fail_nth(1)
        try:
            with caplog.at_level(logging.WARNING, logger="av_infer.devices.cuda"):
                h = d.load_plan(plan)
        finally:
            _emu(d).avi_emu_vendor_capture_fail_nth(0)
        p = d.telemetry()["rt_graphs"]["plans"][plan.name]
        assert p["instances"] == 0 and not h.rt_pool
        assert p["reason"] == ("the vendor op of kernel 0 (captured) refused: cuBLASLt "
                               "status 13 (vendor status 65549)"), p
        assert any(p["reason"] in rec.getMessage() for rec in caplog.records)
        r = Runner(d)
        out = r.run(h, x)
        for k in ref:
            assert np.array_equal(out[k], ref[k])
        assert d._disp.stream_stats(r.stream)["rt_graph_launched"] == 0
    finally:
        d.close()


def test_a_refused_graph_launch_runs_plain_and_says_so(caplog):
    """cuGraphLaunch refused at transmission: the same kernels go plain as one unit (right
    outputs, every request answered), the refusal is counted, named in telemetry and
    logged, and that graph is not tried again."""
    plan, x = chain_plan(seed=9)
    n = len(plan.kernels)
    ref = _plain_reference(plan, x, vendor="force")
    d = _device(rt_graphs=1, vendor="force")
    try:
        r = Runner(d)
        h = d.load_plan(plan)
        _emu(d).avi_emu_graph_refuse(6)
        try:
            with caplog.at_level(logging.WARNING, logger="av_infer.devices.cuda"):
                outs = [r.run(h, x) for _ in range(2)]
        finally:
            _emu(d).avi_emu_graph_refuse(0)
        for out in outs:
            for k in ref:
                assert np.array_equal(out[k], ref[k])
        st = d._disp.stream_stats(r.stream)
        assert st["rt_graph_refused"] == 1 and st["rt_graph_last_refusal"] == 801
        assert st["rt_graph_launched"] == 0 and st["launched"] == 2 * n
        tel = d.telemetry()["rt_graphs"]
        assert tel["launch_refused"] == 1
        assert "cuGraphLaunch refused" in tel["reason"] and "801" in tel["reason"]
        assert any("RT graph launch" in rec.getMessage() for rec in caplog.records)
        assert d._disp.rt_graph_refusal(h.rt_pool[0].graph) == 801
    finally:
        d.close()


def test_a_kernel_failing_inside_an_rt_graph_fails_its_task_with_a_typed_error():
    """A kernel node failing inside the RT graph (the emulator's hook): every kernel of the
    task completes as a failed record (no coalesced success), its ``read_outputs`` raises
    DeviceFaultError naming CUresult 719; ``close()`` still completes."""
    from av_infer.errors import DeviceFaultError

    plan, x = chain_plan(seed=1)
    n = len(plan.kernels)
    d = _device(rt_graphs=1)
    try:
        r = Runner(d)
        h = d.load_plan(plan)
        t = r.start_task(h, x)
        _emu(d).avi_emu_graph_fail_after(2)
        try:
            d.enqueue(r.stream, t, 0, n - 1)
            got = 0
            while got < n:
                c = r.q.get(timeout=120)
                r.records.setdefault(c.task, []).append(c)
                got += c.count
        finally:
            _emu(d).avi_emu_graph_fail_after(0)
        assert [c.count for c in r.records[t]] == [1] * n
        assert d._disp.stream_stats(r.stream)["rt_graph_launched"] == 1
        with pytest.raises(DeviceFaultError, match="719"):
            d.read_outputs(t)
        d.release_task(t)
    finally:
        d.close()


def test_rt_graphs_beside_gated_be_graphs():
    """Both options on one device: RT requests as one graph launch on the RT stream, BE
    requests through gated graphs of 4 ops on a BE stream; each bit-identical to its plain
    run."""
    plan, x = chain_plan(seed=11)
    n = len(plan.kernels)
    ref = _plain_reference(plan, x)
    d = _device(rt_graphs=1, graphs="be", graph_ops=4)
    try:
        r = Runner(d)
        be = d.open_stream(0)
        h = d.load_plan(plan)
        assert d.telemetry()["graphs"]["active"] and d.telemetry()["rt_graphs"]["active"]
        out_rt = r.run(h, x)
        t = r.start_task(h, x)  # the pool's instance is free again: this one takes it
        d.enqueue(be, t, 0, n - 1)
        out_be = r.finish(t, n)
        for k in ref:
            assert np.array_equal(out_rt[k], ref[k]) and np.array_equal(out_be[k], ref[k])
        assert d._disp.stream_stats(r.stream)["rt_graph_launched"] == 1
        st = d._disp.stream_stats(be)
        assert st["graph_launched"] > 0 and st["rt_graph_launched"] == 0
    finally:
        d.close()


# -- the scheduler on top ------------------------------------------------------------------
@pytest.mark.parametrize("vendor", ["off", "force"])
def test_reef_be_preemption_is_unchanged_under_rt_graphs(vendor):
    """The unchanged scheduler (reef, BE on its own stream): RT requests run as graph
    launches, BE requests preempted by them equal the unpreempted result bit for bit,
    every request answered; with vendor ops in both models too (captured in the RT
    graph, host-checked on the BE stream)."""
    from av_infer import Runtime

    _, be, x = _zoo("resnet152")
    _, rt_plan, x_rt = _zoo("tiny_cnn" if vendor == "force" else "tiny_mlp")
    d = _device(rt_graphs=2, vendor=vendor)
    with Runtime(d, policy="reef", c=4) as rt:
        rt.load_model("be", be)
        rt.load_model("rt", rt_plan)
        be_bit_identical_under_rt(rt, x, x_rt, n_be=6, n_rt=30)
        stats = rt.stats()
        tel = d.telemetry()
    assert stats["preemptions"] > 0
    assert sum(s["rt_graph_launched"] for s in tel["streams"]) > 0
    assert all(s["rt_graph_refused"] == 0 for s in tel["streams"])


# -- the GPU step's script, and the declared ABI ---------------------------------------------
def test_gpu_graphs_check_rt_mode_on_the_emulator(tmp_path, capsys):
    """The graphs step's RT mode (scripts/gpu_graphs_check.py --rt-graphs) end to end on
    the emulator with vendor ops: both modes right against ONNX Runtime and bit-identical
    to each other, one graph launch per RT request in the graph mode, none in the plain
    one, alone and beside a BE client; the result line printed whole."""
    import importlib.util
    import json
    from pathlib import Path

    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu_graphs_check.py"
    spec = importlib.util.spec_from_file_location("gpu_graphs_check_rt", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rc = mod.main(["--emulate", "--variant", "scaled", "--model", "tiny_cnn", "--be-model",
                   "tiny_mlp", "--rt-graphs", "2", "--rt-only", "--vendor", "force",
                   "--repeats", "3", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "gpu_graphs.json").read_text())["rt"]
    assert rc == 0 and res["ok"] and res["identical_to_plain"]
    plain, graph = res["modes"]
    assert plain["rt_graphs"] == 0 and graph["rt_graphs"] == 2
    assert plain["vendor_ops"] > 0 and plain["rt_stream"]["rt_graph_launched"] == 0
    assert graph["rt_stream"]["rt_graph_launched"] == 1 + 2 * 3  # warm-up, alone, beside BE
    assert res["graph_launches_per_request"] == 1.0
    assert graph["beside_be"]["be_requests_done"] > 0
    lines = capsys.readouterr().out.splitlines()
    assert any(ln.startswith("gpu_graphs_rt: {") for ln in lines)
    assert lines[-1].startswith("gpu_graphs: {")


def test_declared_capture_abi_matches_cuda_h(tmp_path):
    """The stream capture entry points as ``cuda_dispatch.pyx`` and ``graph_emu.c`` declare
    them (``cuStreamBeginCapture_v2(CUstream, mode)`` with RELAXED = 2,
    ``cuStreamEndCapture(CUstream, CUgraph*)``, the capture error codes) against NVIDIA's
    ``cuda.h`` by a C compile (-Werror); skips without a CUDA toolkit's headers."""
    import shutil
    import subprocess

    from tests.devices.test_cuda_graphs import _cuda_include

    inc = require(_cuda_include(), "CUDA toolkit headers (cuda.h)")
    require(shutil.which("gcc"), "gcc")
    src = tmp_path / "abi_capture.c"
    src.write_text(r"""
#include <cuda.h>
_Static_assert(sizeof(CUstreamCaptureMode) == sizeof(int), "mode is passed as an int");
_Static_assert(CU_STREAM_CAPTURE_MODE_RELAXED == 2, "relaxed");
_Static_assert(CU_STREAM_CAPTURE_STATUS_ACTIVE == 1 && CU_STREAM_CAPTURE_STATUS_INVALIDATED == 2,
               "capture status");
_Static_assert(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED == 900, "900");
_Static_assert(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED == 901, "901");
_Static_assert(CUDA_ERROR_ILLEGAL_STATE == 401, "401");
typedef CUresult (*p_begin)(CUstream, CUstreamCaptureMode);
typedef CUresult (*p_end)(CUstream, CUgraph*);
typedef CUresult (*p_is)(CUstream, CUstreamCaptureStatus*);
p_begin a = cuStreamBeginCapture_v2;
p_end b = cuStreamEndCapture;
p_is c = cuStreamIsCapturing;
""")
    res = subprocess.run(["gcc", "-std=c11", "-fsyntax-only", "-Werror=incompatible-pointer-types",
                          f"-I{inc}", str(src)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
