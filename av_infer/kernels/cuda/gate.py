"""The gate kernel of gated CUDA graphs (docs/cuda_graphs.md).

Why: a kernel we cannot modify (or one already running) cannot look at the preemption
flag, so a BE op is put behind a conditional (IF) node of a CUDA graph whose condition a
tiny kernel sets just before it from the stream's flag word. The gate also records, in
host-visible memory, whether the op behind it runs: the device then reports
``Completion.executed`` as a fact, and restore starts at the first op that did not run.

Record layout (``uint32``, one per task, ``nk + 1`` words): word 0 = 1 + the index of the
last op whose gate opened (0: none yet); word ``1 + k`` = 1 if op ``k``'s gate opened
(it runs), 2 if it stayed shut (skipped: the flag was up), 0 if not reached.
Guaranteed: the gate's decision and the op's execution agree, because the op inside the
body runs with a flag word that is always 0 (it never evicts itself half-way).

Graphs of several ops (``CudaDevice(graph_ops=G)``) chain G gate -> IF pairs; a launch that
covers only some of them passes ``k = NOT_THIS_LAUNCH`` to the others' gates, which shut
their IF node and record nothing (the record's words belong to the ops this launch holds).
"""

from __future__ import annotations

#: kernel name in the gate module
GATE_KERNEL = "avi_gate"
#: record words written by the gate
RAN, SKIPPED = 1, 2
#: the gate's ``k`` for an op of the graph that this launch does not hold: shut, no record
NOT_THIS_LAUNCH = 0xFFFFFFFF

GATE_SOURCE = r"""
#ifndef AVI_HOST_EMU
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(
    cudaGraphConditionalHandle handle, unsigned int value);
#endif

// One thread: read the stream's flag word, open or shut the op's IF node, record it.
extern "C" __global__ void avi_gate(const unsigned int* flag, cudaGraphConditionalHandle h,
                                    unsigned int* rec, unsigned int k) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    if (k == 0xFFFFFFFFu) {  // NOT_THIS_LAUNCH: an op of the graph this launch does not hold
        cudaGraphSetConditional(h, 0u);
        return;
    }
    unsigned int up = *(const volatile unsigned int*)flag;
    if (up) {
        cudaGraphSetConditional(h, 0u);
        ((volatile unsigned int*)rec)[1 + k] = 2u;
    } else {
        cudaGraphSetConditional(h, 1u);
        ((volatile unsigned int*)rec)[1 + k] = 1u;
        ((volatile unsigned int*)rec)[0] = k + 1u;
    }
    __threadfence_system();
}
"""
