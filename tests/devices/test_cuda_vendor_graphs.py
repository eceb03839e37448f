"""Vendor ops inside gated BE graphs (docs/cuda_graphs.md, "Vendor ops inside gated
graphs"), on the CPU emulator.

``CudaDevice(emulate=True, graphs="be", vendor="force", vendor_graphs=N)``: each plan with
vendor ops gets N BE graph instances whose gated graphs hold the vendor calls captured into
their IF bodies (``cuStreamBeginCaptureToGraph``), so a gate decides for a cuDNN /
cuBLASLt op exactly as for a kernel of ours. Checked here: outputs bit-identical to the
plain path, every op's completion saying it ran, a raised flag skipping the vendor ops
too (the emulated libraries' counters), restore from the gate record re-running nothing,
graphs of several ops mixing vendor ops and ours, the unchanged scheduler with
preemptions, the pool running out (host flag check for that task) and every refusal
(driver without the call, capture start / end refused, instantiation refused, one op
refused, a vendor call failing under capture) falling back per op with the reason in
telemetry and the log; plans loaded from two threads at once (captures serialized on the
one capture stream).
"""

from __future__ import annotations

import functools
import logging
import random
import time

import numpy as np
import pytest

from av_infer.kernels.cuda.gate import RAN, SKIPPED
from av_infer.kernels.cuda.samples import chain_plan
from tests.checks import be_bit_identical_under_rt, require
from tests.devices.test_cuda_graphs import (
    Runner,
    _device,
    _emu,
    _preempt_at_random_point,
    _zoo,
    graph_runs,
    raise_flag,
)
from tests.devices.test_cuda_rt_graphs import vendor_runs


def _vendor_ran(dev) -> int:
    m, c = vendor_runs(dev)
    return m + c


def _plain(plan, x) -> dict[str, np.ndarray]:
    """The reference: the same vendor ops, plain launches, no graphs."""
    d = _device(vendor="force")
    try:
        return Runner(d).run(d.load_plan(plan), x)
    finally:
        d.close()


def _vendor_ks(h) -> list[int]:
    return [k for k, v in enumerate(h.vendor) if v is not None]


@pytest.fixture(scope="module")
def resnet():
    _, plan, x = _zoo("resnet152")
    return plan, x, _plain(plan, x)


@pytest.fixture(scope="module")
def dev():
    d = _device(graphs="be", vendor="force", vendor_graphs=2)
    yield d
    d.close()


@pytest.fixture(scope="module")
def runner(dev):
    return Runner(dev)


# -- the emulated entry point (graph_emu.c) -----------------------------------------------
def test_emulated_capture_into_a_conditional_body():
    """cuStreamBeginCaptureToGraph into an IF node's body: launches are captured, not run;
    cuStreamEndCapture hands back the same graph; the body runs at launch when the handle
    is set (here by its default) and not when it is 0; an event record invalidates the
    capture (901, no graph) and the caller's graph stays valid; hooks 7, 8 and
    capture_refuse_nth answer 801 as documented."""
    import ctypes

    from tests.devices.test_cuda_graphs import _Graphs

    d = _device()
    try:
        G = _Graphs(d)
        L = G.L
        L.cuStreamBeginCaptureToGraph.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                                  ctypes.c_void_p, ctypes.c_void_p,
                                                  ctypes.c_size_t, ctypes.c_int]
        L.cuStreamEndCapture.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        L.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
            ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        L.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        L.cuEventCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        L.cuGraphCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        words = np.zeros(4, dtype=np.uint32)

        def launch(i: int, v: int) -> int:
            p, val = ctypes.c_uint64(words.ctypes.data + 4 * i), ctypes.c_uint32(v)
            arr = (ctypes.c_void_p * 2)(ctypes.addressof(p), ctypes.addressof(val))
            return L.cuLaunchKernel(G.put, 1, 1, 1, 1, 1, 1, 0, G.stream, arr, None)

        def gated(default: int):
            graph, h = ctypes.c_void_p(), ctypes.c_uint64()
            assert L.cuGraphCreate(ctypes.byref(graph), 0) == 0
            assert L.cuGraphConditionalHandleCreate(ctypes.byref(h), graph, None, default,
                                                    1) == 0
            rc, body = G.add_if(graph, [], h.value)
            assert rc == 0
            return graph, body

        def capture_into(body, i: int, v: int):
            assert L.cuStreamBeginCaptureToGraph(G.stream, body, None, None, 0, 2) == 0
            assert launch(i, v) == 0
            out = ctypes.c_void_p()
            rc = L.cuStreamEndCapture(G.stream, ctypes.byref(out))
            return rc, out.value

        for default, want in ((1, 7), (0, 0)):
            words[:] = 0
            graph, body = gated(default)
            rc, got = capture_into(body, 0, 7)
            assert rc == 0 and got == body.value  # the same graph back
            assert L.cuStreamSynchronize(G.stream) == 0 and words[0] == 0  # captured, not run
            exe = ctypes.c_void_p()
            assert L.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0) == 0
            G.launch_sync(exe)
            assert words[0] == want
            assert L.cuGraphExecDestroy(exe) == 0 and L.cuGraphDestroy(graph) == 0
        # an event record invalidates the capture; the caller's graph stays valid
        graph, body = gated(1)
        ev = ctypes.c_void_p()
        assert L.cuEventCreate(ctypes.byref(ev), 2) == 0
        assert L.cuStreamBeginCaptureToGraph(G.stream, body, None, None, 0, 2) == 0
        assert launch(1, 5) == 0 and L.cuEventRecord(ev, G.stream) != 0
        out = ctypes.c_void_p()
        assert L.cuStreamEndCapture(G.stream, ctypes.byref(out)) == 901 and not out.value
        assert words[1] == 0 and L.cuGraphDestroy(graph) == 0
        # the hooks
        hooks = L.avi_emu_graph_refuse
        try:
            graph, body = gated(1)
            hooks(7)
            assert L.cuStreamBeginCaptureToGraph(G.stream, body, None, None, 0, 2) == 801
            hooks(0)
            L.avi_emu_capture_refuse_nth(2)
            assert capture_into(body, 2, 1)[0] == 0
            assert L.cuStreamBeginCaptureToGraph(G.stream, body, None, None, 0, 2) == 801
            assert capture_into(body, 2, 2)[0] == 0  # only the 2nd was refused
            hooks(8)
            exe = ctypes.c_void_p()
            assert L.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0) == 801
            hooks(0)
            assert L.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0) == 0
            G.launch_sync(exe)
            assert words[2] == 2  # both captured launches ran, in order
            assert L.cuGraphExecDestroy(exe) == 0 and L.cuGraphDestroy(graph) == 0
        finally:
            hooks(0)
            L.avi_emu_capture_refuse_nth(0)
    finally:
        d.close()


# -- the option --------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-1, 9, "x", 1.5, True])
def test_vendor_graphs_is_validated_first(bad):
    from av_infer.devices.cuda import CudaDevice

    with pytest.raises(ValueError, match="vendor_graphs"):
        CudaDevice(emulate=True, vendor_graphs=bad)


def test_off_by_default_the_environment_sets_it_and_it_needs_graphs_and_vendor(monkeypatch):
    d = _device(graphs="be", vendor="force")
    try:
        v = d.telemetry()["vendor_graphs"]
        assert v["instances"] == 0 and not v["active"] and v["reason"] == "off"
    finally:
        d.close()
    monkeypatch.setenv("AV_INFER_CUDA_VENDOR_GRAPHS", "3")
    d = _device(graphs="be", vendor="force")
    try:
        assert d.vendor_graphs == 3 and d.telemetry()["vendor_graphs"]["active"]
    finally:
        d.close()
    monkeypatch.delenv("AV_INFER_CUDA_VENDOR_GRAPHS")
    for kw, why in (({"vendor": "force"}, "gated graphs are off"),
                    ({"graphs": "be"}, "vendor ops are off")):
        d = _device(vendor_graphs=1, **kw)
        try:
            v = d.telemetry()["vendor_graphs"]
            assert not v["active"] and why in v["reason"]
        finally:
            d.close()


# -- bit identity, gates, progress and restore --------------------------------------------
def test_resnet152_with_vendor_ops_gated_is_bit_identical(dev, runner, resnet):
    """resnet152 (scaled, vendor="force": 27 of its 29 kernels cuDNN / cuBLASLt ops)
    through vendor graph instances: bit-identical to plain launches, every completion
    ``executed=True`` (the vendor ops' too), every vendor op went through a graph launch and
    none through the host flag path, each executed once."""
    plan, x, ref = resnet
    h = dev.load_plan(plan)
    try:
        n = len(plan.kernels)
        vks = _vendor_ks(h)
        assert len(vks) == 27 and len(h.vg_pool) == 2
        p = dev.telemetry()["vendor_graphs"]["plans"][plan.name]
        assert p == {"instances": 2, "vendor_ops": 27, "gated": 27, "fallback": {}}
        st0 = dev._disp.stream_stats(runner.stream)
        v0 = _vendor_ran(dev)
        t = runner.next + 1
        out = runner.run(h, x)
        for k in ref:
            assert np.array_equal(out[k], ref[k])
        assert [runner.comps[(t, k)][-1].executed for k in range(n)] == [True] * n
        st = dev._disp.stream_stats(runner.stream)
        assert st["graph_vendor_ops"] - st0["graph_vendor_ops"] == 27
        assert st["graph_ops"] - st0["graph_ops"] == n
        assert st["vendor_launched"] == st0["vendor_launched"]  # no host-flag vendor launch
        assert _vendor_ran(dev) - v0 == 27
        assert dev.telemetry()["vendor_graphs"]["taken"] >= 1
    finally:
        dev.unload_plan(h)


def test_a_raised_flag_skips_the_vendor_ops_too(dev, runner):
    """Launched under a raised flag every gate stays shut: no vendor call runs (the
    emulated libraries' counters), every completion ``executed=False``, the record says
    skipped; flag down: the same task runs whole and equals the reference."""
    plan, x = chain_plan(seed=6)
    ref = _plain(plan, x)
    h = dev.load_plan(plan)
    try:
        n = len(plan.kernels)
        assert _vendor_ks(h) and h.vg_pool
        s = runner.stream
        t = runner.start_task(h, x)
        assert dev._tasks[t].vg is not None
        v0 = _vendor_ran(dev)
        raise_flag(dev, s)
        try:
            dev.enqueue(s, t, 0, n - 1)
            runner.wait(t, n - 1)
        finally:
            dev.set_preempt(s, False)
        assert _vendor_ran(dev) == v0
        assert [runner.comps[(t, k)][-1].executed for k in range(n)] == [False] * n
        rec = dev._tasks[t].grec
        assert int(rec[0]) == 0 and all(int(w) == SKIPPED for w in rec[1:])
        runner.last[t] = -1
        dev.enqueue(s, t, 0, n - 1)
        runner.wait(t, n - 1)
        assert _vendor_ran(dev) - v0 == len(_vendor_ks(h))
        assert int(rec[0]) == n and all(int(w) == RAN for w in rec[1:])
        out = dev.read_outputs(t)
        dev.release_task(t)
        for k in ref:
            assert np.array_equal(out[k], ref[k])
    finally:
        dev.unload_plan(h)


def test_restore_from_the_record_with_vendor_ops_gated(dev, runner, resnet):
    """Reset + flag at random points of resnet152 with its vendor ops gated: the ops that
    ran are a prefix ending at the record's progress, every sent op after it says
    ``executed=False`` (vendor ops included), the restore from that progress re-runs
    nothing (the executor's kernel nodes: one gate per remaining op plus the missing ops
    of ours; the vendor libraries: exactly the missing vendor ops) and outputs are
    bit-identical."""
    plan, x, ref = resnet
    h = dev.load_plan(plan)
    try:
        n = len(plan.kernels)
        vks = set(_vendor_ks(h))
        s = runner.stream
        rng = random.Random(2)
        restored = skipped_vendor = 0
        for trial in range(12):
            t, info, ran, rec, progress = _preempt_at_random_point(dev, runner, h, x, n, rng)
            assert dev._tasks[t].vg is not None
            assert ran == list(range(progress))
            sent = info.last_sent if info is not None and info.task == t else n - 1
            assert all(runner.comps[(t, k)][-1].executed is False
                       for k in range(progress, sent + 1))
            skipped_vendor += sum(1 for k in range(progress, sent + 1) if k in vks)
            if progress < n:
                restored += 1
                g0, v0 = graph_runs(dev)[1], _vendor_ran(dev)
                runner.last[t] = progress - 1
                dev.enqueue(s, t, progress, n - 1)
                runner.wait(t, n - 1)
                missing = range(progress, n)
                ours = sum(1 for k in missing if k not in vks)
                assert graph_runs(dev)[1] - g0 == (n - progress) + ours
                assert _vendor_ran(dev) - v0 == sum(1 for k in missing if k in vks)
            assert int(rec[0]) == n
            out = dev.read_outputs(t)
            for k in ref:
                assert np.array_equal(out[k], ref[k]), (trial, info, progress)
            dev.release_task(t)
        assert restored > 0 and skipped_vendor > 0
    finally:
        dev.unload_plan(h)


def test_pool_exhaustion_keeps_the_host_flag_check_and_is_counted(resnet):
    """One instance, two tasks at once: the second holds none and runs its vendor ops on the
    host flag check (``executed`` None for them), both bit-identical; counted."""
    plan, x, ref = resnet
    d = _device(graphs="be", vendor="force", vendor_graphs=1)
    try:
        r = Runner(d)
        h = d.load_plan(plan)
        n = len(plan.kernels)
        t1, t2 = r.start_task(h, x), r.start_task(h, x)
        assert d._tasks[t1].vg is not None and d._tasks[t2].vg is None
        for t in (t1, t2):
            d.enqueue(r.stream, t, 0, n - 1)
        for t in (t1, t2):
            r.wait(t, n - 1)
            out = d.read_outputs(t)
            for k in ref:
                assert np.array_equal(out[k], ref[k])
        vks = _vendor_ks(h)
        assert all(r.comps[(t2, k)][-1].executed is None for k in vks)
        assert all(r.comps[(t1, k)][-1].executed is True for k in vks)
        for t in (t1, t2):
            d.release_task(t)
        v = d.telemetry()["vendor_graphs"]
        assert v["taken"] == 1 and v["exhausted"] == 1
        assert len(h.vg_free) == 1  # back in the pool
    finally:
        d.close()


# -- graphs of several ops -----------------------------------------------------------------
def test_vendor_ops_in_graphs_of_four_ops(resnet):
    """graph_ops=4: vendor ops and ours share graphs (fewer graph launches than ops),
    bit-identical; reset + flag at random points: a prefix ran, restore re-runs no vendor
    op, bit-identical, and at least one graph was caught in the middle."""
    plan, x, ref = resnet
    d = _device(graphs="be", vendor="force", vendor_graphs=1, graph_ops=4)
    try:
        r = Runner(d)
        h = d.load_plan(plan)
        n = len(plan.kernels)
        vks = set(_vendor_ks(h))
        st0 = d._disp.stream_stats(r.stream)
        out = r.run(h, x)
        for k in ref:
            assert np.array_equal(out[k], ref[k])
        st = d._disp.stream_stats(r.stream)
        assert st["graph_vendor_ops"] - st0["graph_vendor_ops"] == len(vks)
        assert st["graph_launched"] - st0["graph_launched"] < n
        groups = d._graph_groups(h, vendor=True)
        rng = random.Random(3)
        split = restored = 0
        for trial in range(12):
            t, info, ran, rec, progress = _preempt_at_random_point(d, r, h, x, n, rng)
            assert ran == list(range(progress))
            sent = info.last_sent if info is not None and info.task == t else n - 1
            assert all(r.comps[(t, k)][-1].executed is False for k in range(progress, sent + 1))
            split += any(f < progress <= sent and progress < f + m for f, m in groups)
            if progress < n:
                restored += 1
                v0 = _vendor_ran(d)
                r.last[t] = progress - 1
                d.enqueue(r.stream, t, progress, n - 1)
                r.wait(t, n - 1)
                assert _vendor_ran(d) - v0 == sum(1 for k in range(progress, n) if k in vks)
            out = d.read_outputs(t)
            for k in ref:
                assert np.array_equal(out[k], ref[k]), (trial, info, progress)
            d.release_task(t)
        assert restored > 0 and split > 0
    finally:
        d.close()


# -- the scheduler on top ------------------------------------------------------------------
def test_reef_over_be_vendor_graphs_under_rt_is_bit_identical():
    """The unchanged scheduler (reef, c=4): BE resnet152 with its vendor ops gated,
    preempted by RT tiny_mlp requests; BE outputs equal the unpreempted ones bit for bit,
    every request answered, preemptions happened, vendor ops ran through gated graphs."""
    from av_infer import Runtime

    _, be, x = _zoo("resnet152")
    _, rt_plan, x_rt = _zoo("tiny_mlp")
    d = _device(graphs="be", vendor="force", vendor_graphs=4)
    with Runtime(d, policy="reef", c=4) as rt:
        rt.load_model("be", be)
        rt.load_model("rt", rt_plan)
        be_bit_identical_under_rt(rt, x, x_rt, n_be=6, n_rt=30)
        stats = rt.stats()
        tel = d.telemetry()
    assert stats["preemptions"] > 0
    assert tel["vendor_graphs"]["plans"][be.name]["gated"] == 27
    be_streams = [s for s in tel["streams"] if s["priority"] <= 0]
    assert sum(s["graph_vendor_ops"] for s in be_streams) > 0


# -- refusals: per op, named, never wrong ---------------------------------------------------
def _check_fallback(d, h, plan, x, ref, n_fallback: int) -> None:
    """The plan runs right; the vendor ops that fell back say ``executed`` None (host flag
    check), the gated ones True."""
    r = Runner(d)
    t = r.next + 1
    out = r.run(h, x)
    for k in ref:
        assert np.array_equal(out[k], ref[k])
    fell = d.telemetry()["vendor_graphs"]["plans"][plan.name]["fallback"]
    assert len(fell) == n_fallback
    for k in _vendor_ks(h):
        assert r.comps[(t, k)][-1].executed is (None if k in fell or not h.vg_pool else True)


@pytest.mark.parametrize("hook,call,code", [
    (7, "cuStreamBeginCaptureToGraph(kernel", "801"),
    (4, "cuStreamEndCapture(kernel", "901"),
    (8, "cuGraphInstantiateWithFlags", "801"),
])
def test_a_refused_capture_or_instantiation_falls_back_per_op_and_says_so(hook, call, code,
                                                                          caplog):
    """Capture start refused (801), capture invalidated at its end (901), instantiation of
    a graph with a captured body refused (801): every vendor op keeps the host flag check,
    each named with the call and its code in telemetry and the log; the plan has no
    instance; kernels of ours stay gated; outputs right."""
    plan, x = chain_plan(seed=8)
    ref = _plain(plan, x)
    d = _device(graphs="be", vendor="force", vendor_graphs=1)
    try:
        _emu(d).avi_emu_graph_refuse(hook)
        try:
            with caplog.at_level(logging.WARNING, logger="av_infer.devices.cuda"):
                h = d.load_plan(plan)
        finally:
            _emu(d).avi_emu_graph_refuse(0)
        vks = _vendor_ks(h)
        p = d.telemetry()["vendor_graphs"]["plans"][plan.name]
        assert p["instances"] == 0 and p["gated"] == 0 and sorted(p["fallback"]) == vks
        assert all(call in w and code in w for w in p["fallback"].values()), p
        assert any(call in rec.getMessage() for rec in caplog.records)
        assert not h.vg_pool and any(h.graphs)  # ours stay gated
        _check_fallback(d, h, plan, x, ref, len(vks))
    finally:
        d.close()


def test_one_refused_op_falls_back_alone(resnet, caplog):
    """Only the 2nd capture refused: that vendor op keeps the host flag check (named), the
    other 26 are gated; bit-identical."""
    plan, x, ref = resnet
    d = _device(graphs="be", vendor="force", vendor_graphs=1)
    try:
        _emu(d).avi_emu_capture_refuse_nth(2)
        try:
            with caplog.at_level(logging.WARNING, logger="av_infer.devices.cuda"):
                h = d.load_plan(plan)
        finally:
            _emu(d).avi_emu_capture_refuse_nth(0)
        vks = _vendor_ks(h)
        p = d.telemetry()["vendor_graphs"]["plans"][plan.name]
        assert p["instances"] == 1 and p["gated"] == 26
        assert list(p["fallback"]) == [vks[1]]
        assert "801" in p["fallback"][vks[1]]
        assert any(f"kernel {vks[1]}" in rec.getMessage() for rec in caplog.records)
        assert h.vg_pool[0].table[vks[1]] == 0
        _check_fallback(d, h, plan, x, ref, 1)
    finally:
        d.close()


@pytest.mark.parametrize("model,library,text", [
    ("resnet152", "cuDNN", "cuDNN CUDNN_STATUS_EXECUTION_FAILED (5000)"),
    ("tiny_mlp", "cuBLASLt", "cuBLASLt status 13"),
])
def test_a_vendor_call_failing_under_capture_falls_back_with_the_library_error(
        model, library, text, caplog):
    """The library fails the 2nd vendor call issued under capture
    (``avi_emu_vendor_capture_fail_nth(2)``: EXECUTION_FAILED, nothing enqueued): that op
    alone keeps the host flag check, with the library's error text in
    ``telemetry()["vendor_graphs"]["plans"][name]["fallback"]`` and the log; every other
    vendor op of the plan is still captured and runs through graph launches; outputs
    bit-identical to the plain path and within the FP32 tolerance of ONNX Runtime. The
    reference runs after the hook is set: calls on streams that are not capturing neither
    fail nor count."""
    from av_infer.devices.cuda_vendor import TOLERANCE, max_error
    from tests.devices.test_cuda_graphs import _ort

    path, plan, x = _zoo(model)
    d = _device(graphs="be", vendor="force", vendor_graphs=1)
    try:
        _emu(d).avi_emu_vendor_capture_fail_nth(2)
        try:
            ref = _plain(plan, x)  # plain launches: not under capture, not counted
            with caplog.at_level(logging.WARNING, logger="av_infer.devices.cuda"):
                h = d.load_plan(plan)
        finally:
            _emu(d).avi_emu_vendor_capture_fail_nth(0)
        vks = _vendor_ks(h)
        k = vks[1]  # every op here is one library call: the 2nd call is the 2nd op's
        assert d._vendor.op_info(h.vendor[k][1])["kind"] == (
            "conv" if library == "cuDNN" else "matmul")
        p = d.telemetry()["vendor_graphs"]["plans"][plan.name]
        assert p["instances"] == 1 and p["gated"] == len(vks) - 1
        assert list(p["fallback"]) == [k]
        why = p["fallback"][k]
        assert why == f"the vendor op of kernel {k} (captured) refused: {text} " \
                      f"(vendor status {0x20000 + 5000 if library == 'cuDNN' else 0x10000 + 13})"
        assert any(f"kernel {k}: {why}" in rec.getMessage() and rec.levelno == logging.WARNING
                   for rec in caplog.records)
        inst = h.vg_pool[0]
        assert inst.table[k] == 0 and all(inst.table[j] for j in vks if j != k)
        r = Runner(d)
        st0 = d._disp.stream_stats(r.stream)
        v0 = _vendor_ran(d)
        t = r.next + 1
        out = r.run(h, x)
        for name in ref:
            assert np.array_equal(out[name], ref[name])
        want = _ort(path, x)
        for name in want:
            assert max_error(out[name], want[name]) <= TOLERANCE["fp32"], name
        assert [r.comps[(t, j)][-1].executed for j in vks] == [
            None if j == k else True for j in vks]
        st = d._disp.stream_stats(r.stream)
        assert st["graph_vendor_ops"] - st0["graph_vendor_ops"] == len(vks) - 1
        assert st["vendor_launched"] - st0["vendor_launched"] == 1  # the one that fell back
        assert _vendor_ran(d) - v0 == len(vks)  # each vendor op once, none lost
    finally:
        d.close()


def test_a_driver_without_capture_to_graph_falls_back_and_says_so(monkeypatch, caplog):
    """A driver that does not export cuStreamBeginCaptureToGraph (the emulator built
    without it, as a driver older than CUDA 12.3): the symbol resolves to nothing, the
    device starts, vendor graphs are refused with the reason in telemetry and the log,
    gated graphs of ours still run, vendor ops keep the host flag check, outputs right."""
    import ctypes

    from av_infer.devices.cuda_emu import driver as emu_driver

    variant = functools.partial(emu_driver.build_driver,
                                defines=("AVI_EMU_NO_CAPTURE_TO_GRAPH",))
    path = variant()
    assert not hasattr(ctypes.CDLL(str(path)), "cuStreamBeginCaptureToGraph")
    plan, x = chain_plan(seed=8)
    ref = _plain(plan, x)
    monkeypatch.setattr(emu_driver, "build_driver", variant)
    with caplog.at_level(logging.WARNING, logger="av_infer.devices.cuda"):
        d = _device(graphs="be", vendor="force", vendor_graphs=2)
    try:
        assert d._driver_path == str(path)
        v = d.telemetry()["vendor_graphs"]
        assert not v["active"] and "cuStreamBeginCaptureToGraph" in v["reason"]
        assert d.telemetry()["graphs"]["active"]
        assert any("cuStreamBeginCaptureToGraph" in rec.getMessage() for rec in caplog.records)
        h = d.load_plan(plan)
        assert not h.vg_pool and any(h.graphs)
        r = Runner(d)
        t = r.next + 1
        out = r.run(h, x)
        for k in ref:
            assert np.array_equal(out[k], ref[k])
        assert all(r.comps[(t, k)][-1].executed is None for k in _vendor_ks(h))
    finally:
        d.close()


# -- load-time captures from several threads -------------------------------------------------
def test_two_threads_load_plans_with_vendor_graphs_at_once(resnet):
    """Two threads load plans at the same time on one device (vendor graph instances and
    RT graph instances: every capture on the dispatcher's one capture stream): both loads
    succeed with every vendor op gated and an RT graph each, nothing falls back, and both
    plans run bit-identical to the plain path."""
    import threading

    plan_a, x_a, ref_a = resnet
    plan_b, x_b = chain_plan(seed=8)
    ref_b = _plain(plan_b, x_b)
    d = _device(graphs="be", vendor="force", vendor_graphs=2, rt_graphs=1)
    try:
        go = threading.Barrier(2)
        got: dict[str, object] = {}

        def load(plan):
            go.wait()
            try:
                got[plan.name] = d.load_plan(plan)
            except BaseException as e:  # reported below
                got[plan.name] = e

        ts = [threading.Thread(target=load, args=(p,)) for p in (plan_a, plan_b)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        tel = d.telemetry()
        for plan in (plan_a, plan_b):
            h = got[plan.name]
            assert not isinstance(h, BaseException), h
            n = len(_vendor_ks(h))
            assert tel["vendor_graphs"]["plans"][plan.name] == {
                "instances": 2, "vendor_ops": n, "gated": n, "fallback": {}}
            assert tel["rt_graphs"]["plans"][plan.name]["instances"] == 1
            assert len(h.vg_pool) == 2 and len(h.rt_pool) == 1
        r = Runner(d)
        for plan, x, ref in ((plan_a, x_a, ref_a), (plan_b, x_b, ref_b)):
            h = got[plan.name]
            for _ in range(2):  # both instances of the pool
                out = r.run(h, x)
                for k in ref:
                    assert np.array_equal(out[k], ref[k])
    finally:
        d.close()


def test_a_capture_waits_while_another_holds_the_capture_stream():
    """A load whose captures find the capture stream taken (``capture_lock`` held, as by
    another thread's capture) waits for it (``capture_waits`` counts it) instead of
    beginning a second capture on it; once released, the load completes with its vendor
    ops gated and runs bit-identical."""
    import threading

    _, plan, x = _zoo("tiny_cnn")
    ref = _plain(plan, x)
    d = _device(graphs="be", vendor="force", vendor_graphs=1)
    try:
        disp = d._disp
        disp.capture_stream()  # made before the lock is taken: only captures wait below
        got: dict[str, object] = {}

        def load():
            try:
                got["h"] = d.load_plan(plan)
            except BaseException as e:  # reported below
                got["h"] = e

        w0 = disp.capture_waits
        th = threading.Thread(target=load)
        with disp.capture_lock:
            th.start()
            deadline = time.monotonic() + 300  # generous: a busy 2-core host
            while disp.capture_waits == w0 and th.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert disp.capture_waits == w0 + 1, got
            assert th.is_alive() and "h" not in got  # blocked at its first capture
        th.join()
        h = got["h"]
        assert not isinstance(h, BaseException), h
        n = len(_vendor_ks(h))
        assert d.telemetry()["vendor_graphs"]["plans"][plan.name]["gated"] == n > 0
        out = Runner(d).run(h, x)
        for k in ref:
            assert np.array_equal(out[k], ref[k])
    finally:
        d.close()


# -- the GPU step's script -------------------------------------------------------------------
def test_gpu_graphs_check_with_vendor_graphs_on_the_emulator(tmp_path):
    """scripts/gpu_graphs_check.py --vendor force --vendor-graphs 1 end to end on the
    emulator (tiny_cnn: 3 of its 5 kernels vendor ops): every mode right, restores
    bit-identical; the gated modes run the vendor ops through graphs and know what the
    flag caught (nothing unknown), the plain mode keeps them on the host flag check."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu_graphs_check.py"
    spec = importlib.util.spec_from_file_location("gpu_graphs_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _device().close()  # skips where the emulator cannot run
    rc = mod.main(["--emulate", "--variant", "scaled", "--model", "tiny_cnn", "--repeats", "2",
                   "--trials", "4", "--graph-ops", "1,4", "--vendor", "force",
                   "--vendor-graphs", "1", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "gpu_graphs.json").read_text())
    assert rc == 0 and [m["mode"] for m in res["modes"]] == ["off", "be", "be"]
    off, be, be4 = res["modes"]
    assert off["stream"]["vendor_launched"] > 0 and off["stream"]["graph_vendor_ops"] == 0
    for m in (be, be4):
        assert m["ok"] and m["preempt"]["caught"]["unknown"] == 0
        assert m["preempt"]["restored_bit_identical"]
        assert m["vendor_graphs"]["plans"]["tiny_cnn"]["gated"] == 3
        assert m["stream"]["graph_vendor_ops"] > 0 and m["stream"]["vendor_launched"] == 0


# -- the declared ABI -----------------------------------------------------------------------
def test_declared_capture_to_graph_abi_matches_cuda_h(tmp_path):
    """``cuStreamBeginCaptureToGraph`` as ``cuda_dispatch.pyx`` declares it (CUstream,
    CUgraph, const CUgraphNode*, const CUgraphEdgeData* (void* here, always NULL), size_t,
    CUstreamCaptureMode as an int) against CUDA's ``cuda.h`` by a C compile (-Werror), and
    that the name is not remapped to a versioned symbol outside per-thread default stream
    builds; skips without a CUDA toolkit's headers."""
    import shutil
    import subprocess

    from tests.devices.test_cuda_graphs import _cuda_include

    inc = require(_cuda_include(), "CUDA toolkit headers (cuda.h)")
    require(shutil.which("gcc"), "gcc")
    src = tmp_path / "abi_capture_to_graph.c"
    src.write_text(r"""
#include <cuda.h>
#ifdef cuStreamBeginCaptureToGraph
#error "cuStreamBeginCaptureToGraph is remapped to another symbol"
#endif
_Static_assert(sizeof(CUstreamCaptureMode) == sizeof(int), "mode is passed as an int");
typedef CUresult (*p_ctg)(CUstream, CUgraph, const CUgraphNode*, const CUgraphEdgeData*,
                          size_t, CUstreamCaptureMode);
p_ctg a = cuStreamBeginCaptureToGraph;
""")
    res = subprocess.run(["gcc", "-std=c11", "-fsyntax-only", "-Werror=incompatible-pointer-types",
                          f"-I{inc}", str(src)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
