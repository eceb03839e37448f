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

import numpy as np

from av_infer.devices.cuda import availability
from tests.checks import require
from tests.devices.test_cuda_graphs import _Graphs, graph_runs

EMU_OK, EMU_WHY = availability(emulate=True)


def _device(**kw):
    require(None if not EMU_OK else "ok", f"the CUDA emulator cannot run: {EMU_WHY}")
    from av_infer.devices.cuda import CudaDevice

    return CudaDevice(emulate=True, **kw)


def _emu(dev) -> ctypes.CDLL:
    return ctypes.CDLL(dev._driver_path)


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

