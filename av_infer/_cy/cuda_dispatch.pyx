# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""GIL-free CUDA dispatcher for the cuda device (REEF-N vHQ -> CUDA streams, OSDI'22 §4.4).

Builds on machines without CUDA: the driver API types and prototypes are declared here and
resolved at run time with ``dlopen("libcuda.so.1")`` + ``dlsym``; nothing links libcuda and
nothing includes ``cuda.h``. ``load_driver()`` raises ``OSError("libcuda.so.1 not found:
...")`` where there is no driver.

One dispatcher thread (``Dispatcher.start``) runs a loop inside ``with nogil:``. Per stream:
1. completions: the oldest in-flight launch whose CUDA event has fired is completed in the
   stream's vHQ (``complete_c``) and pushed onto the completion ring;
2. transmissions: while the vHQ allows (fewer than c in flight, ``transmit_c``) the next
   (task, kernel) is launched with ``cuLaunchKernel`` on the task's pre-packed argument
   struct (packed at ``new_task`` time; the launch builds only the 2-pointer
   ``kernelParams`` array: the stream's flag word and the struct) and an event is recorded.
A Python thread blocks in ``poll`` (GIL released) and forwards completions to the device's
``on_complete``. Launch tables are found by task id in an open-addressing table whose
deleted slots are reclaimed at once (backward-shift deletion, no tombstones; it doubles
when half full), so lookups stay O(1) however many tasks came and went (``table_stats``). Preemption flags are written with ``cuStreamWriteValue32`` on a dedicated
highest-priority stream; clearing a flag also makes the compute stream wait for the write,
so a restored kernel can never see a stale "preempted" word.
"""
from cpython.pythread cimport (
    WAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset
from posix.dlfcn cimport RTLD_LOCAL, RTLD_NOW, dlerror, dlopen, dlsym
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, nanosleep, timespec

import threading

from av_infer._cy.vhq cimport VHQ, LaunchRange

cdef extern from "Python.h":
    int PyThread_acquire_lock_timed(PyThread_type_lock lock, long long microseconds,
                                    int intr_flag) nogil

# -- driver API, declared by hand (no cuda.h) --------------------------------------------
ctypedef int CUresult
ctypedef void* CUcontext
ctypedef void* CUstream
ctypedef void* CUevent
ctypedef void* CUfunction
ctypedef void* CUmodule
ctypedef unsigned long long CUdeviceptr
ctypedef void* CUgraph
ctypedef void* CUgraphNode
ctypedef void* CUgraphExec
ctypedef unsigned long long CUgraphConditionalHandle

cdef enum:
    CUDA_SUCCESS = 0
    CUDA_ERROR_NOT_READY = 600
    CU_STREAM_NON_BLOCKING = 1
    CU_EVENT_DISABLE_TIMING = 2
    CU_STREAM_WRITE_VALUE_DEFAULT = 0
    RING = 64               # in-flight launches per stream (>= the device's max capacity)
    MAX_STREAMS = 64
    TASK_SLOTS_MIN = 256    # initial task table size (power of 2; doubles at half full)
    COMP_RING = 65536       # completion ring (power of 2)
    GEOM_WORDS = 7          # grid xyz, block xyz, dynamic smem
    # CUDA graphs with conditional nodes (CUDA 12.4+, docs/cuda_graphs.md)
    CU_GRAPH_NODE_TYPE_KERNEL = 0
    CU_GRAPH_NODE_TYPE_CONDITIONAL = 13
    CU_GRAPH_COND_TYPE_IF = 0
    CU_GRAPH_COND_ASSIGN_DEFAULT = 1
    NODE_PARAMS_BYTES = 256     # sizeof(CUgraphNodeParams): type, 3 ints, 232-byte union, 8
    NODE_PARAMS_UNION = 16      # offset of its union
    ZERO_PARAM_BYTES = 32768    # the largest kernel parameter CUDA 12.1+ accepts
    MAX_GRAPH_OPS = 16          # gated ops per graph (CudaDevice(graph_ops=...))
    CU_STREAM_CAPTURE_MODE_RELAXED = 2  # RT graphs: stream capture (docs/cuda_graphs.md)

#: CUDA_KERNEL_NODE_PARAMS_v2 (= _v3, the kernel member of CUgraphNodeParams' union)
cdef struct KernelNodeParams:
    CUfunction func
    unsigned int gridDimX
    unsigned int gridDimY
    unsigned int gridDimZ
    unsigned int blockDimX
    unsigned int blockDimY
    unsigned int blockDimZ
    unsigned int sharedMemBytes
    void** kernelParams
    void** extra
    void* kern
    CUcontext ctx

#: CUDA_CONDITIONAL_NODE_PARAMS (the conditional member of CUgraphNodeParams' union)
cdef struct CondNodeParams:
    CUgraphConditionalHandle handle
    int type
    unsigned int size
    CUgraph* phGraph_out
    CUcontext ctx

#: one gated op of a graph: gate kernel -> IF node { op kernel }
cdef struct GatedOp:
    CUgraphNode gate
    CUgraphNode op
    CUgraphConditionalHandle cond
    CUfunction op_func
    uint32_t geom[7]
    int captured                # a vendor op captured into the IF body (op is NULL): its
                                # arguments are baked in, nothing to update per launch

#: a gated graph (docs/cuda_graphs.md): ``n`` gated ops of plan kernels ``first..first+n-1``
#: chained in kernel order (gate_0 -> IF_0 -> gate_1 -> IF_1 ...), instantiated once
cdef struct GatedGraph:
    CUgraph graph
    CUgraphExec exec
    CUfunction gate_func
    int32_t first
    int32_t n
    GatedOp ops[MAX_GRAPH_OPS]

#: RT as one graph (docs/cuda_graphs.md): every kernel of a plan, captured in order on a
#: private stream with the arguments of one graph arena, instantiated once
cdef struct RtGraph:
    CUgraph graph
    CUgraphExec exec
    int32_t nk
    int dead                    # the driver refused a launch: plain launches from then on
    CUresult refused            # ... with this CUresult

ctypedef CUresult (*p_cuInit)(unsigned int) noexcept nogil
ctypedef CUresult (*p_cuGetErrorString)(CUresult, const char**) noexcept nogil
ctypedef CUresult (*p_cuCtxGetCurrent)(CUcontext*) noexcept nogil
ctypedef CUresult (*p_cuCtxSetCurrent)(CUcontext) noexcept nogil
ctypedef CUresult (*p_cuCtxGetStreamPriorityRange)(int*, int*) noexcept nogil
ctypedef CUresult (*p_cuStreamCreateWithPriority)(CUstream*, unsigned int, int) noexcept nogil
ctypedef CUresult (*p_cuStreamDestroy)(CUstream) noexcept nogil
ctypedef CUresult (*p_cuStreamSynchronize)(CUstream) noexcept nogil
ctypedef CUresult (*p_cuStreamWaitEvent)(CUstream, CUevent, unsigned int) noexcept nogil
ctypedef CUresult (*p_cuStreamWriteValue32)(CUstream, CUdeviceptr, uint32_t, unsigned int) noexcept nogil
ctypedef CUresult (*p_cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream) noexcept nogil
ctypedef CUresult (*p_cuEventCreate)(CUevent*, unsigned int) noexcept nogil
ctypedef CUresult (*p_cuEventDestroy)(CUevent) noexcept nogil
ctypedef CUresult (*p_cuEventRecord)(CUevent, CUstream) noexcept nogil
ctypedef CUresult (*p_cuEventQuery)(CUevent) noexcept nogil
ctypedef CUresult (*p_cuLaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int,
                                      unsigned int, unsigned int, unsigned int, unsigned int,
                                      CUstream, void**, void**) noexcept nogil
ctypedef CUresult (*p_cuModuleLoadData)(CUmodule*, const void*) noexcept nogil
ctypedef CUresult (*p_cuModuleUnload)(CUmodule) noexcept nogil
ctypedef CUresult (*p_cuModuleGetFunction)(CUfunction*, CUmodule, const char*) noexcept nogil
ctypedef CUresult (*p_cuFuncGetAttribute)(int*, int, CUfunction) noexcept nogil
ctypedef CUresult (*p_cuGraphCreate)(CUgraph*, unsigned int) noexcept nogil
ctypedef CUresult (*p_cuGraphDestroy)(CUgraph) noexcept nogil
ctypedef CUresult (*p_cuGraphConditionalHandleCreate)(CUgraphConditionalHandle*, CUgraph, CUcontext,
                                                      unsigned int, unsigned int) noexcept nogil
ctypedef CUresult (*p_cuGraphAddNode)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                                      void*) noexcept nogil
ctypedef CUresult (*p_cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph,
                                                   unsigned long long) noexcept nogil
ctypedef CUresult (*p_cuGraphExecDestroy)(CUgraphExec) noexcept nogil
ctypedef CUresult (*p_cuGraphLaunch)(CUgraphExec, CUstream) noexcept nogil
ctypedef CUresult (*p_cuGraphExecKernelNodeSetParams)(CUgraphExec, CUgraphNode,
                                                      const KernelNodeParams*) noexcept nogil
ctypedef CUresult (*p_cuStreamBeginCapture)(CUstream, int) noexcept nogil
ctypedef CUresult (*p_cuStreamEndCapture)(CUstream, CUgraph*) noexcept nogil
#: CUDA 12.3+ (CUDA 13.0's cuda.h): cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph
#: hGraph, const CUgraphNode* dependencies, const CUgraphEdgeData* dependencyData, size_t
#: numDependencies, CUstreamCaptureMode mode); edge data is always NULL here
ctypedef CUresult (*p_cuStreamBeginCaptureToGraph)(CUstream, CUgraph, const CUgraphNode*,
                                                   const void*, size_t, int) noexcept nogil
#: a vendor op's launcher (``cuda_vendor.pyx``: ``vendor_launch``): (op, the task's packed
#: struct of the kernel, CUstream, the stream's vendor context) -> 0 or a vendor status
ctypedef int (*p_vendor_launch)(void*, const char*, CUstream, void*) noexcept nogil


cdef struct Driver:
    void* lib
    p_cuInit cuInit
    p_cuGetErrorString cuGetErrorString
    p_cuCtxGetCurrent cuCtxGetCurrent
    p_cuCtxSetCurrent cuCtxSetCurrent
    p_cuCtxGetStreamPriorityRange cuCtxGetStreamPriorityRange
    p_cuStreamCreateWithPriority cuStreamCreateWithPriority
    p_cuStreamDestroy cuStreamDestroy
    p_cuStreamSynchronize cuStreamSynchronize
    p_cuStreamWaitEvent cuStreamWaitEvent
    p_cuStreamWriteValue32 cuStreamWriteValue32
    p_cuMemsetD32Async cuMemsetD32Async
    p_cuEventCreate cuEventCreate
    p_cuEventDestroy cuEventDestroy
    p_cuEventRecord cuEventRecord
    p_cuEventQuery cuEventQuery
    p_cuLaunchKernel cuLaunchKernel
    p_cuModuleLoadData cuModuleLoadData
    p_cuModuleUnload cuModuleUnload
    p_cuModuleGetFunction cuModuleGetFunction
    p_cuFuncGetAttribute cuFuncGetAttribute
    # optional: CUDA graphs with conditional nodes (NULL where the driver lacks them)
    p_cuGraphCreate cuGraphCreate
    p_cuGraphDestroy cuGraphDestroy
    p_cuGraphConditionalHandleCreate cuGraphConditionalHandleCreate
    p_cuGraphAddNode cuGraphAddNode
    p_cuGraphInstantiateWithFlags cuGraphInstantiateWithFlags
    p_cuGraphExecDestroy cuGraphExecDestroy
    p_cuGraphLaunch cuGraphLaunch
    p_cuGraphExecKernelNodeSetParams cuGraphExecKernelNodeSetParams
    # optional: stream capture (RT as one graph; NULL where the driver lacks them)
    p_cuStreamBeginCapture cuStreamBeginCapture
    p_cuStreamEndCapture cuStreamEndCapture
    # optional: capture into an existing graph (vendor ops inside gated graphs)
    p_cuStreamBeginCaptureToGraph cuStreamBeginCaptureToGraph

cdef dict _drivers = {}   # library path -> address of its Driver (never freed)


cdef void* _sym(void* lib, const char* a) noexcept:
    return dlsym(lib, a)


cdef void* _sym2(void* lib, const char* a, const char* b) noexcept:
    """``a``, else ``b`` (a versioned name and its older one). Two helpers, not one with
    ``b = NULL``: GCC 12 warns (-Wnonnull) on ``dlsym(lib, NULL)`` in the dead branch of
    a helper inlined with a constant NULL (its warning pass runs before that branch is
    folded away): a false warning in every build of this module."""
    cdef void* p = dlsym(lib, a)
    if p == NULL:
        p = dlsym(lib, b)
    return p


cdef Driver* _driver(str path) except NULL:
    """The driver library at ``path``, dlopened and resolved once per process.

    One table per path: a process may hold the real driver and the CPU emulator's
    (``av_infer.devices.cuda_emu``) side by side.
    """
    cdef uintptr_t have = _drivers.get(path, 0)
    if have:
        return <Driver*>have
    cdef bytes bpath = path.encode()
    cdef void* lib = dlopen(bpath, RTLD_NOW | RTLD_LOCAL)
    cdef const char* err
    if lib == NULL:
        err = dlerror()
        raise OSError(f"{path} not found: {(<bytes>err).decode() if err != NULL else 'dlopen failed'}")
    names = [
        (b"cuInit", None), (b"cuGetErrorString", None), (b"cuCtxGetCurrent", None),
        (b"cuCtxSetCurrent", None), (b"cuCtxGetStreamPriorityRange", None),
        (b"cuStreamCreateWithPriority", None), (b"cuStreamDestroy_v2", b"cuStreamDestroy"),
        (b"cuStreamSynchronize", None), (b"cuStreamWaitEvent", None),
        (b"cuMemsetD32Async", None), (b"cuEventCreate", None),
        (b"cuEventDestroy_v2", b"cuEventDestroy"), (b"cuEventRecord", None),
        (b"cuEventQuery", None), (b"cuLaunchKernel", None), (b"cuModuleLoadData", None),
        (b"cuModuleUnload", None), (b"cuModuleGetFunction", None), (b"cuFuncGetAttribute", None),
    ]
    cdef void* p
    ptrs = {}
    for a, b in names:
        if b is None:
            p = _sym(lib, a)
        else:
            p = _sym2(lib, a, b)
        if p == NULL:
            raise OSError(f"{path}: symbol {a.decode()} missing (driver too old?)")
        ptrs[a] = <uintptr_t>p
    cdef Driver* d = <Driver*>calloc(1, sizeof(Driver))
    if d == NULL:
        raise MemoryError()
    d.lib = lib
    d.cuInit = <p_cuInit><uintptr_t>ptrs[b"cuInit"]
    d.cuGetErrorString = <p_cuGetErrorString><uintptr_t>ptrs[b"cuGetErrorString"]
    d.cuCtxGetCurrent = <p_cuCtxGetCurrent><uintptr_t>ptrs[b"cuCtxGetCurrent"]
    d.cuCtxSetCurrent = <p_cuCtxSetCurrent><uintptr_t>ptrs[b"cuCtxSetCurrent"]
    d.cuCtxGetStreamPriorityRange = <p_cuCtxGetStreamPriorityRange><uintptr_t>ptrs[b"cuCtxGetStreamPriorityRange"]
    d.cuStreamCreateWithPriority = <p_cuStreamCreateWithPriority><uintptr_t>ptrs[b"cuStreamCreateWithPriority"]
    d.cuStreamDestroy = <p_cuStreamDestroy><uintptr_t>ptrs[b"cuStreamDestroy_v2"]
    d.cuStreamSynchronize = <p_cuStreamSynchronize><uintptr_t>ptrs[b"cuStreamSynchronize"]
    d.cuStreamWaitEvent = <p_cuStreamWaitEvent><uintptr_t>ptrs[b"cuStreamWaitEvent"]
    d.cuMemsetD32Async = <p_cuMemsetD32Async><uintptr_t>ptrs[b"cuMemsetD32Async"]
    d.cuEventCreate = <p_cuEventCreate><uintptr_t>ptrs[b"cuEventCreate"]
    d.cuEventDestroy = <p_cuEventDestroy><uintptr_t>ptrs[b"cuEventDestroy_v2"]
    d.cuEventRecord = <p_cuEventRecord><uintptr_t>ptrs[b"cuEventRecord"]
    d.cuEventQuery = <p_cuEventQuery><uintptr_t>ptrs[b"cuEventQuery"]
    d.cuLaunchKernel = <p_cuLaunchKernel><uintptr_t>ptrs[b"cuLaunchKernel"]
    d.cuModuleLoadData = <p_cuModuleLoadData><uintptr_t>ptrs[b"cuModuleLoadData"]
    d.cuModuleUnload = <p_cuModuleUnload><uintptr_t>ptrs[b"cuModuleUnload"]
    d.cuModuleGetFunction = <p_cuModuleGetFunction><uintptr_t>ptrs[b"cuModuleGetFunction"]
    d.cuFuncGetAttribute = <p_cuFuncGetAttribute><uintptr_t>ptrs[b"cuFuncGetAttribute"]
    # optional: stream memory operations (fallback: cuMemsetD32Async on the flag stream)
    p = _sym2(lib, b"cuStreamWriteValue32_v2", b"cuStreamWriteValue32")
    d.cuStreamWriteValue32 = <p_cuStreamWriteValue32>p
    # optional: CUDA graphs with conditional nodes (the gated BE path; docs/cuda_graphs.md).
    # cuGraphAddNode: the CUDA 12.2+ ABI (no edge data); cuGraphExecKernelNodeSetParams_v2:
    # CUDA_KERNEL_NODE_PARAMS_v2 (the unversioned symbol takes v1, a prefix of it)
    d.cuGraphCreate = <p_cuGraphCreate>_sym(lib, b"cuGraphCreate")
    d.cuGraphDestroy = <p_cuGraphDestroy>_sym(lib, b"cuGraphDestroy")
    d.cuGraphConditionalHandleCreate = <p_cuGraphConditionalHandleCreate>_sym(
        lib, b"cuGraphConditionalHandleCreate")
    d.cuGraphAddNode = <p_cuGraphAddNode>_sym(lib, b"cuGraphAddNode")
    d.cuGraphInstantiateWithFlags = <p_cuGraphInstantiateWithFlags>_sym(
        lib, b"cuGraphInstantiateWithFlags")
    d.cuGraphExecDestroy = <p_cuGraphExecDestroy>_sym(lib, b"cuGraphExecDestroy")
    d.cuGraphLaunch = <p_cuGraphLaunch>_sym(lib, b"cuGraphLaunch")
    d.cuGraphExecKernelNodeSetParams = <p_cuGraphExecKernelNodeSetParams>_sym2(
        lib, b"cuGraphExecKernelNodeSetParams_v2", b"cuGraphExecKernelNodeSetParams")
    # optional: stream capture (RT as one graph). Only the _v2 symbol takes a capture mode
    # (cuda.h maps cuStreamBeginCapture to it; the unversioned symbol is CUDA 10.0's
    # one-argument call), so there is no fallback name
    d.cuStreamBeginCapture = <p_cuStreamBeginCapture>_sym(lib, b"cuStreamBeginCapture_v2")
    d.cuStreamEndCapture = <p_cuStreamEndCapture>_sym(lib, b"cuStreamEndCapture")
    # optional: capture into an existing graph (CUDA 12.3+; vendor ops inside gated graphs,
    # docs/cuda_graphs.md). Missing: those vendor ops keep the host flag check (reported)
    d.cuStreamBeginCaptureToGraph = <p_cuStreamBeginCaptureToGraph>_sym(
        lib, b"cuStreamBeginCaptureToGraph")
    cdef CUresult r = d.cuInit(0)
    if r != CUDA_SUCCESS:
        free(d)
        raise RuntimeError(f"{path}: cuInit failed ({r})")
    _drivers[path] = <uintptr_t>d
    return d


def load_driver(str path="libcuda.so.1"):
    """dlopen a CUDA driver library and resolve the entry points; idempotent per path.

    Raises OSError("libcuda.so.1 not found: ...") without a driver, or naming the missing
    symbol with a too-old driver.
    """
    _driver(path)


def driver_loaded(str path="libcuda.so.1"):
    return path in _drivers


cdef str _errstr(Driver* d, CUresult r):
    cdef const char* s = NULL
    if d != NULL and d.cuGetErrorString(r, &s) == CUDA_SUCCESS and s != NULL:
        return (<bytes>s).decode()
    return f"CUresult {r}"


cdef int _check(Driver* d, CUresult r, str what) except -1:
    if r != CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {_errstr(d, r)} ({r})")
    return 0


def error_string(int code, str path="libcuda.so.1"):
    """Text of a CUresult (for completions that carry a launch/event error)."""
    cdef uintptr_t have = _drivers.get(path, 0)
    return _errstr(<Driver*>have, code)


cdef inline double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


# -- dispatcher state ---------------------------------------------------------------------
cdef struct Stream:
    CUstream s
    CUevent ev[RING]
    CUevent fev                 # flag-clear event the stream waits on
    CUdeviceptr flag
    int64_t task[RING]
    int32_t kernel[RING]
    double t0[RING]
    CUresult err[RING]
    uint32_t head
    uint32_t count
    uint64_t launched
    uint64_t completed
    void* vctx                  # vendor context (cuDNN handle, workspace); NULL: none
    uint32_t hflag              # host copy of the flag word, for vendor launches
    uint64_t vskipped           # vendor launches not issued because the flag was up
    uint64_t vlaunched          # vendor launches (issued or skipped)
    double host_s               # host seconds spent transmitting (lookup, launch, event)
    double vhost_s              # ... of which on vendor launches
    int graphs                  # gated graph launches on this stream (docs/cuda_graphs.md)
    uint8_t gated[RING]         # launch in slot went through a gated graph
    uint64_t glaunched          # gated graph launches
    uint64_t gops               # ops those launches held (one vHQ index each)
    uint64_t gskipped           # gated ops whose gate stayed shut (flag up): did not run
    uint64_t gvops              # vendor ops those launches held (captured into IF bodies)
    # launch units: a graph of several ops is ONE entry against c (docs/request_path.md
    # section 2); plain launches are one unit each. cunits = c (RING: no limit of its own)
    uint8_t unit_end[RING]      # the slot holds the last index of its launch unit
    int32_t units               # launch units in flight
    int32_t cunits              # at most this many units in flight
    int has_pend                # an index taken from the vHQ that did not fit the graph
    # RT as one graph (docs/cuda_graphs.md): a task with an RT graph whose whole range the
    # vHQ holds goes as ONE unit: one cuGraphLaunch, one event, one ring slot, one record
    int rtg                     # RT graphs on for this stream
    uint32_t cnt[RING]          # vHQ indices the slot holds (1, or a whole task's n kernels)
    uint64_t rglaunched         # RT graph launches
    uint64_t rgops              # kernels those launches held
    uint64_t rgrefused          # RT graph launches the driver refused (ran plain, one unit)
    CUresult rglast             # the CUresult of the last refusal
    uint8_t padded[RING]        # the slot's launch was a padded (DKP) launch
    int64_t pend_t              # ... (launched next, through the ordinary branches)
    int32_t pend_k

cdef struct TaskRec:
    int64_t id                  # -1: empty slot (there are no tombstones; see _remove)
    int32_t nk
    int64_t inflight
    CUfunction* funcs
    uint32_t* geom
    char* args
    int64_t* offs
    CUfunction* pfuncs          # DKP: padded launch of kernel k (NULL: plain), lazily made
    uint32_t* pgeom
    char** pargs                # its by-value AviPadArgs bytes
    p_vendor_launch* vfn        # vendor op of kernel k (NULL: a kernel of ours); NULL: none
    void** vop
    GatedGraph** gg             # gated graph of kernel k (NULL: none); NULL: none at all
    CUdeviceptr grec            # the task's gate record (host-visible; gate.py's layout)
    RtGraph* rg                 # the task's RT graph (its graph arena's); NULL: none

cdef struct Comp:
    int32_t stream
    int64_t task
    int32_t kernel
    int32_t status
    int32_t executed            # 1 ran, 0 skipped (a gate record says so), -1 unknown
    int32_t padded              # a padded (DKP) launch: never coalesced (``poll``)
    int32_t count               # kernels kernel..kernel+count-1 (an RT graph launch: n)
    double t0
    double t1


cdef inline void _drop_padded(TaskRec* r, int32_t k) noexcept nogil:
    """Kernel k of r launches plain again (its padded launch was sent or dropped)."""
    r.pfuncs[k] = NULL
    free(r.pargs[k])
    r.pargs[k] = NULL


cdef inline int _vhq_transmit(void* q, int64_t* t, int32_t* k) noexcept nogil:
    return (<VHQ>q).transmit_c(t, k)

cdef inline int _vhq_complete(void* q, int64_t* t, int32_t* k) noexcept nogil:
    return (<VHQ>q).complete_c(t, k)

cdef inline int _no_padded(TaskRec* r) noexcept nogil:
    """No kernel of ``r`` has a padded (DKP) launch set up."""
    cdef int32_t k
    if r.pfuncs != NULL:
        for k in range(r.nk):
            if r.pfuncs[k] != NULL:
                return 0
    return 1


cdef int _vhq_take_rest(void* q, int64_t task, int32_t nk) noexcept nogil:
    """Kernel 0 of ``task`` was just transmitted: if the vHQ's head range is exactly its
    kernels 1..nk-1 and its capacity lets them all be in flight, transmit them all now
    (under the vHQ's own lock, in one go) and return 1; else take nothing and return 0.
    An RT graph launch holds the whole task: every index it runs is in flight in the vHQ,
    never queued (the same rule as gated graphs of several ops)."""
    cdef int ok = 0
    cdef int32_t i, k2
    cdef int64_t t2
    cdef LaunchRange* r
    if nk <= 1:
        return 1
    PyThread_acquire_lock((<VHQ>q)._lock, WAIT_LOCK)
    if (<VHQ>q)._head != (<VHQ>q)._tail:
        r = &(<VHQ>q)._ring[(<VHQ>q)._head & (<VHQ>q)._mask]
        if (r.task == task and r.next == 1 and r.last == nk - 1
                and (<VHQ>q)._in_flight + nk - 1 <= (<VHQ>q)._c):
            for i in range(nk - 1):
                (<VHQ>q)._transmit_locked(&t2, &k2)
            ok = 1
    PyThread_release_lock((<VHQ>q)._lock)
    return ok


cdef class Dispatcher:
    """Streams, task launch tables, the nogil dispatch loop and the completion ring."""

    cdef Driver* _drv
    cdef CUcontext _ctx
    cdef Stream* _st
    cdef void* _vhq[MAX_STREAMS]
    cdef list _vhq_refs
    cdef int _nst
    cdef TaskRec* _tasks        # open-addressing table, linear probing, _tcap slots
    cdef uint64_t _tcap         # power of 2; live tasks <= _tcap / 2 (one empty slot ends every probe)
    cdef int _tbits             # log2(_tcap)
    cdef uint64_t _tlive
    cdef PyThread_type_lock _tlock
    cdef Comp* _ring
    cdef uint64_t _rhead
    cdef uint64_t _rtail
    cdef PyThread_type_lock _rlock
    cdef PyThread_type_lock _rsig
    cdef PyThread_type_lock _wake
    cdef CUstream _fstream
    cdef int _stop
    cdef public int spin_us
    cdef int _prio_lo
    cdef int _prio_hi
    cdef uint64_t _loops
    cdef CUdeviceptr _zero      # a device word that is always 0: the flag of gated ops
    cdef CUstream _cstream      # private stream RT graphs are captured on (made on first use)
    cdef char* _zbuf            # zero bytes: parameter values of a graph's first build
    cdef object _caplock        # one capture at a time on _cstream (``_capture``)
    cdef public uint64_t capture_waits  # captures that found _caplock held and waited
    cdef object _verrstr        # vendor status -> text (``set_vendor_errstr``), or None

    def __cinit__(self):
        self._st = <Stream*>calloc(MAX_STREAMS, sizeof(Stream))
        self._tasks = <TaskRec*>calloc(TASK_SLOTS_MIN, sizeof(TaskRec))
        self._tcap = TASK_SLOTS_MIN
        self._tbits = 0
        while (1ULL << self._tbits) < self._tcap:
            self._tbits += 1
        self._tlive = 0
        self._ring = <Comp*>calloc(COMP_RING, sizeof(Comp))
        if self._st == NULL or self._tasks == NULL or self._ring == NULL:
            raise MemoryError()
        cdef int i
        for i in range(TASK_SLOTS_MIN):
            self._tasks[i].id = -1
        self._tlock = PyThread_allocate_lock()
        self._rlock = PyThread_allocate_lock()
        self._rsig = PyThread_allocate_lock()
        self._wake = PyThread_allocate_lock()
        PyThread_acquire_lock(self._rsig, WAIT_LOCK)  # semaphores start at 0
        PyThread_acquire_lock(self._wake, WAIT_LOCK)
        self._vhq_refs = []
        self._nst = 0
        self._stop = 0
        self.spin_us = 50
        self._fstream = NULL
        self._ctx = NULL
        self._drv = NULL
        self._zero = 0
        self._cstream = NULL
        self._zbuf = <char*>calloc(ZERO_PARAM_BYTES, 1)
        if self._zbuf == NULL:
            raise MemoryError()
        self._caplock = threading.Lock()
        self.capture_waits = 0
        self._verrstr = None

    def __init__(self, str driver="libcuda.so.1"):
        """Needs a current CUDA context on the calling thread (e.g. CuPy's device).

        ``driver``: the driver library (the CPU emulator's for ``CudaDevice(emulate=True)``).
        """
        self._drv = _driver(driver)
        _check(self._drv, self._drv.cuCtxGetCurrent(&self._ctx), "cuCtxGetCurrent")
        if self._ctx == NULL:
            raise RuntimeError("no current CUDA context: initialise the device (CuPy) first")
        _check(self._drv, self._drv.cuCtxGetStreamPriorityRange(&self._prio_lo, &self._prio_hi),
               "cuCtxGetStreamPriorityRange")
        _check(self._drv, self._drv.cuStreamCreateWithPriority(&self._fstream, CU_STREAM_NON_BLOCKING,
                                               self._prio_hi), "flag stream")

    def __dealloc__(self):
        cdef int i, j
        if self._drv != NULL and self._ctx != NULL:
            self._drv.cuCtxSetCurrent(self._ctx)
            for i in range(self._nst):
                self._drv.cuStreamSynchronize(self._st[i].s)
                for j in range(RING):
                    self._drv.cuEventDestroy(self._st[i].ev[j])
                self._drv.cuEventDestroy(self._st[i].fev)
                self._drv.cuStreamDestroy(self._st[i].s)
            if self._fstream != NULL:
                self._drv.cuStreamDestroy(self._fstream)
            if self._cstream != NULL:
                self._drv.cuStreamDestroy(self._cstream)
        if self._tasks != NULL:
            for i in range(<int>self._tcap):
                if self._tasks[i].id >= 0:
                    self._free_rec(&self._tasks[i])
        free(self._st)
        free(self._tasks)
        free(self._ring)
        free(self._zbuf)
        if self._tlock != NULL:
            PyThread_free_lock(self._tlock)
        if self._rlock != NULL:
            PyThread_free_lock(self._rlock)
        if self._rsig != NULL:
            PyThread_free_lock(self._rsig)
        if self._wake != NULL:
            PyThread_free_lock(self._wake)

    cdef inline void _cur(self) noexcept nogil:
        self._drv.cuCtxSetCurrent(self._ctx)

    @property
    def priority_range(self):
        """(least, greatest) CUDA stream priority (greatest is numerically lowest)."""
        return (self._prio_lo, self._prio_hi)

    # -- streams ------------------------------------------------------------------------
    def open_stream(self, VHQ vhq, bint realtime, uintptr_t flag_ptr):
        """A CUDA stream (highest priority if ``realtime``, else lowest) fed by ``vhq``."""
        if self._nst >= MAX_STREAMS:
            raise RuntimeError(f"at most {MAX_STREAMS} streams")
        if vhq.c > RING:
            raise ValueError(f"vHQ capacity {vhq.c} exceeds the dispatcher ring ({RING})")
        cdef Stream* st = &self._st[self._nst]
        cdef int j
        self._cur()
        memset(st, 0, sizeof(Stream))
        _check(self._drv, self._drv.cuStreamCreateWithPriority(&st.s, CU_STREAM_NON_BLOCKING,
                                               self._prio_hi if realtime else self._prio_lo),
               "cuStreamCreateWithPriority")
        for j in range(RING):
            _check(self._drv, self._drv.cuEventCreate(&st.ev[j], CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        _check(self._drv, self._drv.cuEventCreate(&st.fev, CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        st.flag = <CUdeviceptr>flag_ptr
        st.cunits = RING
        self._vhq_refs.append(vhq)
        self._vhq[self._nst] = <void*>vhq
        self._nst += 1  # published last: the loop reads _nst
        return self._nst - 1

    def stream_handle(self, int s):
        return <uintptr_t>self._st[s].s

    def sync_stream(self, int s):
        cdef CUresult r
        with nogil:
            self._cur()
            r = self._drv.cuStreamSynchronize(self._st[s].s)
        _check(self._drv, r, "cuStreamSynchronize")

    def write_flag(self, int s, uint32_t value):
        """Write stream ``s``'s preemption word on the flag stream (asynchronously).

        Clearing (value 0) also makes stream ``s`` wait for the write before anything
        launched afterwards, so restored kernels never read a stale flag.
        """
        cdef Stream* st = &self._st[s]
        cdef CUresult r
        st.hflag = value  # vendor launches check this copy (set before the device's word)
        with nogil:
            self._cur()
            if self._drv.cuStreamWriteValue32 != NULL:
                r = self._drv.cuStreamWriteValue32(self._fstream, st.flag, value,
                                              CU_STREAM_WRITE_VALUE_DEFAULT)
                if r != CUDA_SUCCESS:
                    r = self._drv.cuMemsetD32Async(st.flag, value, 1, self._fstream)
            else:
                r = self._drv.cuMemsetD32Async(st.flag, value, 1, self._fstream)
            if r == CUDA_SUCCESS and value == 0:
                r = self._drv.cuEventRecord(st.fev, self._fstream)
                if r == CUDA_SUCCESS:
                    r = self._drv.cuStreamWaitEvent(st.s, st.fev, 0)
        _check(self._drv, r, "write_flag")

    def error_string(self, int code):
        """Text of a CUresult from this dispatcher's driver."""
        return _errstr(self._drv, code)

    def stream_stats(self, int s):
        """Counters of stream ``s``; ``host_us_per_launch``: mean host time of one
        transmission (table lookup, ``cuLaunchKernel`` or the vendor call, event record),
        all launches and vendor launches (``vendor_host_us_per_launch``)."""
        cdef Stream* st = &self._st[s]
        return {"launched": st.launched, "completed": st.completed, "in_flight": st.count,
                "vendor_launched": st.vlaunched, "vendor_skipped": st.vskipped,
                "graphs": bool(st.graphs), "graph_launched": st.glaunched,
                "graph_ops": st.gops, "graph_skipped": st.gskipped,
                "graph_vendor_ops": st.gvops,
                "unit_capacity": st.cunits if st.cunits < RING else None,
                "rt_graphs": bool(st.rtg), "rt_graph_launched": st.rglaunched,
                "rt_graph_ops": st.rgops, "rt_graph_refused": st.rgrefused,
                "rt_graph_last_refusal": st.rglast if st.rgrefused else None,
                "host_us_per_launch": st.host_s / st.launched * 1e6 if st.launched else None,
                "vendor_host_us_per_launch":
                    st.vhost_s / st.vlaunched * 1e6 if st.vlaunched else None}

    def set_stream_vendor(self, int s, uintptr_t ctx):
        """The vendor context (``cuda_vendor.Vendor.stream_ctx``) of stream ``s``: its
        cuDNN handle and workspace; set before a vendor op is queued on the stream."""
        if not 0 <= s < self._nst:
            raise IndexError(f"no stream {s}")
        self._st[s].vctx = <void*>ctx

    # -- gated CUDA graphs (docs/cuda_graphs.md) -----------------------------------------
    def graphs_missing(self):
        """The graph entry points the driver lacks ([] where it has them all)."""
        d = self._drv
        have = {"cuGraphCreate": d.cuGraphCreate != NULL, "cuGraphDestroy": d.cuGraphDestroy != NULL,
                "cuGraphConditionalHandleCreate": d.cuGraphConditionalHandleCreate != NULL,
                "cuGraphAddNode": d.cuGraphAddNode != NULL,
                "cuGraphInstantiateWithFlags": d.cuGraphInstantiateWithFlags != NULL,
                "cuGraphExecDestroy": d.cuGraphExecDestroy != NULL,
                "cuGraphLaunch": d.cuGraphLaunch != NULL,
                "cuGraphExecKernelNodeSetParams": d.cuGraphExecKernelNodeSetParams != NULL}
        return [k for k, v in have.items() if not v]

    def set_zero_word(self, uintptr_t ptr):
        """A device word that stays 0: the flag argument of ops inside gated graphs (the
        gate decided; the op must then run whole, never evict itself half-way)."""
        self._zero = <CUdeviceptr>ptr

    def set_stream_graphs(self, int s, bint on):
        """Launch stream ``s``'s kernels that have a gated graph through it."""
        if not 0 <= s < self._nst:
            raise IndexError(f"no stream {s}")
        if on and self._zero == 0:
            raise RuntimeError("set_zero_word first")
        self._st[s].graphs = 1 if on else 0

    def set_stream_units(self, int s, int n):
        """At most ``n`` launch units in flight on stream ``s`` (a gated graph of several
        ops is one unit; ``n >= RING``: no limit beyond the vHQ's own capacity). The vHQ's
        capacity must then allow the ops of those units (``CudaDevice``: c x graph_ops)."""
        if not 0 <= s < self._nst:
            raise IndexError(f"no stream {s}")
        if n < 1:
            raise ValueError(f"units must be >= 1, got {n}")
        self._st[s].cunits = n if n < RING else RING

    def vendor_graph_missing(self):
        """The entry points vendor ops inside gated graphs need that the driver lacks
        ([] where it has them): the gated graph's and stream capture into a graph."""
        d = self._drv
        have = {"cuStreamBeginCaptureToGraph": d.cuStreamBeginCaptureToGraph != NULL,
                "cuStreamEndCapture": d.cuStreamEndCapture != NULL}
        return self.graphs_missing() + [k for k, v in have.items() if not v]

    cdef tuple _capture(self, CUstream cst, CUgraph into, CUgraph* out, funcs, geom,
                        const char* a, offs, vendor, uintptr_t vctx, int32_t k0, int32_t n):
        """The one place ops are stream-captured (RT graphs and vendor ops inside gated
        graphs): begin a capture on ``cst`` (``into`` NULL: ``cuStreamBeginCapture_v2``, a
        new graph; else ``cuStreamBeginCaptureToGraph`` into that graph, e.g. a conditional
        node's body), issue ``n`` ops (list positions ``0..n-1``, plan kernels
        ``k0..k0+n-1``): ours as ``cuLaunchKernel`` with the zero flag word and the struct
        at ``a + offs[i]``, vendor ops (``vendor[i]`` = (launcher, op)) through the same
        launcher as the dispatcher's with ``vctx``; then ``cuStreamEndCapture`` (always,
        also after a failed call) into ``out``. Returns (CUresult, the call that gave it,
        whether it was a vendor status).

        Serialized by ``capture_lock``: the capture stream is one per dispatcher, and a
        second capture begun on it while one is open would be refused (or, on a driver
        that allowed it, mix the two plans' nodes); two threads loading plans at once
        wait for each other here (``capture_waits`` counts the waits)."""
        if not self._caplock.acquire(False):
            self.capture_waits += 1
            self._caplock.acquire()
        try:
            return self._capture_locked(cst, into, out, funcs, geom, a, offs, vendor, vctx,
                                        k0, n)
        finally:
            self._caplock.release()

    cdef tuple _capture_locked(self, CUstream cst, CUgraph into, CUgraph* out, funcs, geom,
                               const char* a, offs, vendor, uintptr_t vctx, int32_t k0,
                               int32_t n):
        """``_capture``'s body (caller holds ``capture_lock``)."""
        cdef Driver* d = self._drv
        cdef CUresult r, r2
        cdef const uint32_t* g
        cdef void* params[2]
        cdef p_vendor_launch vf
        cdef int32_t i
        cdef int vend = 0
        cdef CUgraph got = NULL
        if into == NULL:
            what = "cuStreamBeginCapture_v2"
            r = d.cuStreamBeginCapture(cst, CU_STREAM_CAPTURE_MODE_RELAXED)
        else:
            what = f"cuStreamBeginCaptureToGraph(kernel {k0})"
            r = d.cuStreamBeginCaptureToGraph(cst, into, NULL, NULL, 0,
                                              CU_STREAM_CAPTURE_MODE_RELAXED)
        if r != CUDA_SUCCESS:
            return r, what, 0
        for i in range(n):
            if vendor is not None and vendor[i] is not None:
                vend = 1
                what = f"the vendor op of kernel {k0 + i} (captured)"
                vf = <p_vendor_launch><uintptr_t>vendor[i][0]
                r = vf(<void*><uintptr_t>vendor[i][1], a + <int64_t>offs[i], cst, <void*>vctx)
            else:
                vend = 0
                what = f"cuLaunchKernel of kernel {k0 + i} (captured)"
                g = (<const uint32_t*><const char*>geom) + GEOM_WORDS * i
                params[0] = &self._zero
                params[1] = <void*>(a + <int64_t>offs[i])
                r = d.cuLaunchKernel(<CUfunction><uintptr_t>funcs[i], g[0], g[1], g[2], g[3],
                                     g[4], g[5], g[6], cst, params, NULL)
            if r != CUDA_SUCCESS:
                break
        r2 = d.cuStreamEndCapture(cst, &got)  # always ends the capture
        if r == CUDA_SUCCESS and r2 != CUDA_SUCCESS:
            return r2, f"cuStreamEndCapture(kernel {k0})" if into != NULL else "cuStreamEndCapture", 0
        if r == CUDA_SUCCESS:
            out[0] = got
        elif got != NULL and into == NULL:
            d.cuGraphDestroy(got)
        return r, what, vend

    def gated_graph(self, uintptr_t gate_func, op_funcs, bytes geom, int first=0, vendor=None,
                    bytes args=None, offs=None, uintptr_t vctx=0):
        """Build and instantiate one gated graph: per op ``i`` (plan kernel ``first + i``)
        gate kernel -> IF node { op kernel }, the pairs chained in kernel order. ``op_funcs``:
        one CUfunction or a list of 1..MAX_GRAPH_OPS; ``geom``: 7 uint32 words per op.

        ``vendor``: per op None or (launcher, op address): that op is a vendor op, captured
        into its IF node's body with ``cuStreamBeginCaptureToGraph`` on the capture stream
        (``_capture``), with its packed struct at ``args[offs[i]:]`` and ``vctx`` (a vendor
        context bound to the capture stream, its workspace): the arena and workspace
        addresses are baked into the graph, so it serves only tasks whose arena that is
        (``CudaDevice``'s vendor graph instances, docs/cuda_graphs.md).

        Returns its address (for ``register_task``'s ``graphs``, at each of its kernels);
        raises RuntimeError naming the refusing call and its CUresult (the caller falls back
        to plain launches and says so)."""
        funcs = list(op_funcs) if isinstance(op_funcs, (list, tuple)) else [op_funcs]
        cdef int n = len(funcs)
        cdef bint has_vendor = vendor is not None and any(v is not None for v in vendor)
        if has_vendor:
            if len(vendor) != n or args is None or offs is None or len(offs) != n:
                raise ValueError("vendor ops need a vendor entry, args and an offset per op")
            for j, o2 in enumerate(offs):
                if not 0 <= o2 < len(args):
                    raise ValueError(f"argument offset of op {j} outside the blob")
            missing = self.vendor_graph_missing()
            if missing:
                raise RuntimeError(f"the driver lacks {', '.join(missing)}")
        cdef CUstream cst = NULL
        cdef const char* ablob = NULL
        if has_vendor:
            cst = <CUstream><uintptr_t>self.capture_stream()
            ablob = args
        if not 1 <= n <= MAX_GRAPH_OPS:
            raise ValueError(f"a gated graph holds 1..{MAX_GRAPH_OPS} ops, got {n}")
        if len(geom) != n * GEOM_WORDS * 4:
            raise ValueError("geometry: 7 uint32 words per op")
        if first < 0:
            raise ValueError(f"first kernel index must be >= 0, got {first}")
        missing = self.graphs_missing()
        if missing:
            raise RuntimeError(f"the driver lacks {', '.join(missing)}")
        cdef GatedGraph* gg = <GatedGraph*>calloc(1, sizeof(GatedGraph))
        if gg == NULL:
            raise MemoryError()
        cdef int i
        cdef GatedOp* o
        gg.gate_func = <CUfunction>gate_func
        gg.first = first
        gg.n = n
        for i in range(n):
            memcpy(gg.ops[i].geom, (<const char*>geom) + i * GEOM_WORDS * 4, GEOM_WORDS * 4)
            gg.ops[i].op_func = <CUfunction><uintptr_t>funcs[i]
        cdef char np_[NODE_PARAMS_BYTES]
        cdef KernelNodeParams* kp = <KernelNodeParams*>(np_ + NODE_PARAMS_UNION)
        cdef CondNodeParams* cp = <CondNodeParams*>(np_ + NODE_PARAMS_UNION)
        cdef void* gparams[4]
        cdef void* oparams[2]
        cdef CUgraph body = NULL
        cdef CUgraph cap = NULL
        cdef int vstat = 0
        cdef CUgraphNode cond_node = NULL
        cdef CUgraphNode prev = NULL
        cdef Driver* d = self._drv
        cdef CUresult r
        what = "cuGraphCreate"
        self._cur()
        r = d.cuGraphCreate(&gg.graph, 0)
        for i in range(n):
            o = &gg.ops[i]
            if r == CUDA_SUCCESS:
                what = "cuGraphConditionalHandleCreate"
                r = d.cuGraphConditionalHandleCreate(&o.cond, gg.graph, self._ctx, 0,
                                                     CU_GRAPH_COND_ASSIGN_DEFAULT)
            if r == CUDA_SUCCESS:  # the gate: (flag, handle, record, k); values set per launch
                what = "cuGraphAddNode(gate kernel)"
                memset(np_, 0, NODE_PARAMS_BYTES)
                (<int*>np_)[0] = CU_GRAPH_NODE_TYPE_KERNEL
                kp.func = gg.gate_func
                kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1
                kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1
                gparams[0] = self._zbuf
                gparams[1] = &o.cond
                gparams[2] = self._zbuf
                gparams[3] = self._zbuf
                kp.kernelParams = gparams
                # after the previous op's IF node: gates run in kernel order
                r = d.cuGraphAddNode(&o.gate, gg.graph, &prev if prev != NULL else NULL,
                                     1 if prev != NULL else 0, np_)
            if r == CUDA_SUCCESS:
                what = "cuGraphAddNode(IF conditional)"
                memset(np_, 0, NODE_PARAMS_BYTES)
                (<int*>np_)[0] = CU_GRAPH_NODE_TYPE_CONDITIONAL
                cp.handle = o.cond
                cp.type = CU_GRAPH_COND_TYPE_IF
                cp.size = 1
                cp.ctx = self._ctx
                r = d.cuGraphAddNode(&cond_node, gg.graph, &o.gate, 1, np_)
                if r == CUDA_SUCCESS:
                    body = cp.phGraph_out[0]
                    prev = cond_node
            if r == CUDA_SUCCESS and has_vendor and vendor[i] is not None:
                # a vendor op: its library calls captured into the IF node's body
                o.captured = 1
                r, what, vstat = self._capture(cst, body, &cap, None, None, ablob, [offs[i]],
                                               [vendor[i]], vctx, first + i, 1)
                continue
            if r == CUDA_SUCCESS:  # the op, in the IF node's body
                what = "cuGraphAddNode(op kernel in the IF body)"
                memset(np_, 0, NODE_PARAMS_BYTES)
                (<int*>np_)[0] = CU_GRAPH_NODE_TYPE_KERNEL
                kp.func = o.op_func
                kp.gridDimX, kp.gridDimY, kp.gridDimZ = o.geom[0], o.geom[1], o.geom[2]
                kp.blockDimX, kp.blockDimY, kp.blockDimZ = o.geom[3], o.geom[4], o.geom[5]
                kp.sharedMemBytes = o.geom[6]
                oparams[0] = self._zbuf
                oparams[1] = self._zbuf
                kp.kernelParams = oparams
                r = d.cuGraphAddNode(&o.op, body, NULL, 0, np_)
        if r == CUDA_SUCCESS:
            what = "cuGraphInstantiateWithFlags"
            r = d.cuGraphInstantiateWithFlags(&gg.exec, gg.graph, 0)
        for i in range(n):
            o = &gg.ops[i]
            if r == CUDA_SUCCESS and not o.captured:
                # every launch updates the op nodes inside the IF bodies of the executable
                # graph: probe it now, so a driver that refuses it falls back here, not per
                # launch
                what = "cuGraphExecKernelNodeSetParams(op node in the IF body)"
                memset(kp, 0, sizeof(KernelNodeParams))
                kp.func = o.op_func
                kp.gridDimX, kp.gridDimY, kp.gridDimZ = o.geom[0], o.geom[1], o.geom[2]
                kp.blockDimX, kp.blockDimY, kp.blockDimZ = o.geom[3], o.geom[4], o.geom[5]
                kp.sharedMemBytes = o.geom[6]
                kp.kernelParams = oparams
                r = d.cuGraphExecKernelNodeSetParams(gg.exec, o.op, kp)
            if r == CUDA_SUCCESS:
                what = "cuGraphExecKernelNodeSetParams(gate node)"
                kp.func = gg.gate_func
                kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1
                kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1
                kp.sharedMemBytes = 0
                gparams[1] = &o.cond
                kp.kernelParams = gparams
                r = d.cuGraphExecKernelNodeSetParams(gg.exec, o.gate, kp)
        if r != CUDA_SUCCESS:
            if gg.exec != NULL:
                d.cuGraphExecDestroy(gg.exec)
            if gg.graph != NULL:
                d.cuGraphDestroy(gg.graph)
            free(gg)
            if vstat:  # a vendor library status under capture, not a CUresult
                raise RuntimeError(f"{what} refused: {self._vendor_text(r)}")
            raise RuntimeError(f"{what} refused: {_errstr(d, r)} (CUresult {r})")
        return <uintptr_t>gg

    def destroy_gated_graph(self, uintptr_t addr):
        """Free a gated graph (no task that uses it may have launches in flight)."""
        cdef GatedGraph* gg = <GatedGraph*>addr
        if gg == NULL:
            return
        self._cur()
        if gg.exec != NULL:
            self._drv.cuGraphExecDestroy(gg.exec)
        if gg.graph != NULL:
            self._drv.cuGraphDestroy(gg.graph)
        free(gg)

    # -- RT as one graph (docs/cuda_graphs.md) ------------------------------------------
    def rt_graph_missing(self):
        """The entry points RT graphs need that the driver lacks ([] where it has them)."""
        d = self._drv
        have = {"cuStreamBeginCapture_v2": d.cuStreamBeginCapture != NULL,
                "cuStreamEndCapture": d.cuStreamEndCapture != NULL,
                "cuGraphInstantiateWithFlags": d.cuGraphInstantiateWithFlags != NULL,
                "cuGraphLaunch": d.cuGraphLaunch != NULL,
                "cuGraphExecDestroy": d.cuGraphExecDestroy != NULL,
                "cuGraphDestroy": d.cuGraphDestroy != NULL}
        return [k for k, v in have.items() if not v]

    @property
    def capture_lock(self):
        """The lock every stream capture holds (``_capture``): load-time captures of
        several threads run one at a time on the one capture stream."""
        return self._caplock

    def set_vendor_errstr(self, fn):
        """``fn(status) -> str``: the text of a vendor status (``Vendor.error_string``),
        used when a vendor call fails under capture; None: the bare number."""
        self._verrstr = fn

    def _vendor_text(self, int status):
        if self._verrstr is not None:
            return f"{self._verrstr(status)} (vendor status {status})"
        return f"vendor status {status}"

    def capture_stream(self):
        """The private stream RT graphs are captured on (created on first call): a vendor
        context bound to it (``Vendor.stream_ctx``) issues the vendor ops of a capture."""
        if self._cstream == NULL:
            with self._caplock:  # made once, also when two threads ask first at once
                if self._cstream == NULL:
                    self._cur()
                    _check(self._drv, self._drv.cuStreamCreateWithPriority(
                        &self._cstream, CU_STREAM_NON_BLOCKING, self._prio_hi),
                        "capture stream")
        return <uintptr_t>self._cstream

    def set_stream_rt_graphs(self, int s, bint on):
        """Launch the tasks with an RT graph on stream ``s`` as one graph launch each
        (when the vHQ holds the whole task at its first kernel; else plain launches)."""
        if not 0 <= s < self._nst:
            raise IndexError(f"no stream {s}")
        self._st[s].rtg = 1 if on else 0

    def rt_graph(self, funcs, bytes geom, bytes args, offs, vendor=None, uintptr_t vctx=0):
        """Capture a whole plan as one graph and instantiate it: on the private capture
        stream (``cuStreamBeginCapture_v2``, relaxed mode) every kernel in order, ours as
        ``cuLaunchKernel`` with the zero flag word (an RT graph runs whole) and the packed
        struct at ``args[offs[k]:]``, vendor ops (``vendor[k]`` = (launcher, op)) through
        the same launcher with ``vctx`` (a context bound to the capture stream, its own
        workspace); then ``cuStreamEndCapture`` and ``cuGraphInstantiateWithFlags``. The
        argument values (arena and workspace addresses) are baked into the graph.

        Returns its address (``register_task``'s ``rt_graph``); raises RuntimeError naming
        the refusing call and its code (the caller runs plain launches and says so)."""
        cdef int32_t n = len(funcs)
        if n < 1:
            raise ValueError("an RT graph needs at least one kernel")
        if len(geom) != n * GEOM_WORDS * 4 or len(offs) != n:
            raise ValueError("launch table sizes do not match")
        if vendor is not None and len(vendor) != n:
            raise ValueError("vendor table size does not match")
        missing = self.rt_graph_missing()
        if missing:
            raise RuntimeError(f"the driver lacks {', '.join(missing)}")
        if self._zero == 0:
            raise RuntimeError("set_zero_word first")
        for j, o in enumerate(offs):
            if not 0 <= o < len(args):
                raise ValueError(f"argument offset of kernel {j} outside the blob")
        cs = self.capture_stream()
        cdef CUstream cst = <CUstream><uintptr_t>cs
        cdef RtGraph* rg = <RtGraph*>calloc(1, sizeof(RtGraph))
        if rg == NULL:
            raise MemoryError()
        rg.nk = n
        cdef Driver* d = self._drv
        cdef CUresult r
        cdef int vend
        self._cur()
        r, what, vend = self._capture(cst, NULL, &rg.graph, funcs, geom, args, offs, vendor,
                                      vctx, 0, n)
        if r == CUDA_SUCCESS:
            what = "cuGraphInstantiateWithFlags(captured graph)"
            r = d.cuGraphInstantiateWithFlags(&rg.exec, rg.graph, 0)
        if r != CUDA_SUCCESS:
            if rg.exec != NULL:
                d.cuGraphExecDestroy(rg.exec)
            if rg.graph != NULL:
                d.cuGraphDestroy(rg.graph)
            free(rg)
            if vend:
                raise RuntimeError(f"{what} refused: {self._vendor_text(r)}")
            raise RuntimeError(f"{what} refused: {_errstr(d, r)} (code {r})")
        return <uintptr_t>rg

    def rt_graph_refused_total(self):
        """RT graph launches the driver refused, over every stream (cheap: the drain
        thread asks after each poll)."""
        cdef uint64_t n = 0
        cdef int i
        for i in range(self._nst):
            n += self._st[i].rgrefused
        return n

    def rt_graph_refusal(self, uintptr_t addr):
        """The CUresult with which the driver refused a launch of this RT graph (it then
        runs plain launches), or None."""
        cdef RtGraph* rg = <RtGraph*>addr
        return rg.refused if rg != NULL and rg.dead else None

    def destroy_rt_graph(self, uintptr_t addr):
        """Free an RT graph (no task that uses it may have launches in flight)."""
        cdef RtGraph* rg = <RtGraph*>addr
        if rg == NULL:
            return
        self._cur()
        if rg.exec != NULL:
            self._drv.cuGraphExecDestroy(rg.exec)
        if rg.graph != NULL:
            self._drv.cuGraphDestroy(rg.graph)
        free(rg)

    # -- modules ------------------------------------------------------------------------
    def load_module(self, bytes image):
        cdef CUmodule m
        cdef const char* p = image
        self._cur()
        _check(self._drv, self._drv.cuModuleLoadData(&m, p), "cuModuleLoadData")
        return <uintptr_t>m

    def unload_module(self, uintptr_t m):
        self._cur()
        _check(self._drv, self._drv.cuModuleUnload(<CUmodule>m), "cuModuleUnload")

    def get_function(self, uintptr_t m, str name):
        cdef CUfunction f
        cdef bytes b = name.encode()
        _check(self._drv, self._drv.cuModuleGetFunction(&f, <CUmodule>m, b), f"cuModuleGetFunction({name})")
        return <uintptr_t>f

    def func_attribute(self, uintptr_t f, int attr):
        """cuFuncGetAttribute (4: registers/thread, 1: static smem bytes, 0: max threads)."""
        cdef int v
        _check(self._drv, self._drv.cuFuncGetAttribute(&v, attr, <CUfunction>f), "cuFuncGetAttribute")
        return v

    # -- tasks --------------------------------------------------------------------------
    # The task table: linear probing without tombstones. A removed entry's slot is
    # reclaimed at once by shifting the entries of its probe run back (``_remove``), so
    # every lookup ends at the first empty slot within a few probes however many tasks
    # came and went (a tombstone table degrades to scanning every slot once the task ids
    # have cycled through it: 0.33 us -> 22.8 us per register + unregister after 60k
    # tasks). Callers hold _tlock; no TaskRec* is kept past it (entries move).
    cdef inline uint64_t _home(self, int64_t task) noexcept nogil:
        return (<uint64_t>task * 0x9E3779B97F4A7C15ULL) >> (64 - self._tbits)

    cdef TaskRec* _find(self, int64_t task, bint insert) noexcept nogil:
        """The entry of ``task``; if absent, NULL or (``insert``) the empty slot that
        ends its probe run (the caller then sets ``id``: see ``_claim``)."""
        cdef uint64_t mask = self._tcap - 1
        cdef uint64_t i = self._home(task)
        cdef TaskRec* r
        if task < 0:
            return NULL  # -1 marks empty slots; task ids are >= 0 (register_task)
        while True:
            r = &self._tasks[i]
            if r.id == task:
                return r
            if r.id == -1:
                return r if insert else NULL
            i = (i + 1) & mask

    cdef int _grow(self) noexcept nogil:
        """Double the table (rehash every live entry); 0 when out of memory."""
        cdef uint64_t old_cap = self._tcap, i, j, mask
        cdef TaskRec* old = self._tasks
        cdef TaskRec* t = <TaskRec*>calloc(old_cap * 2, sizeof(TaskRec))
        if t == NULL:
            return 0
        for i in range(old_cap * 2):
            t[i].id = -1
        self._tasks = t
        self._tcap = old_cap * 2
        self._tbits += 1
        mask = self._tcap - 1
        for i in range(old_cap):
            if old[i].id >= 0:
                j = self._home(old[i].id)
                while t[j].id != -1:
                    j = (j + 1) & mask
                t[j] = old[i]
        free(old)
        return 1

    cdef void _remove(self, TaskRec* r) noexcept nogil:
        """Free ``r``'s entry and reclaim its slot: backward-shift deletion (each later
        entry of the probe run moves into the hole unless its home lies after the hole)."""
        cdef uint64_t mask = self._tcap - 1
        cdef uint64_t i = <uint64_t>(r - self._tasks), j = i, home
        self._free_rec(r)
        while True:
            j = (j + 1) & mask
            if self._tasks[j].id == -1:
                break
            home = self._home(self._tasks[j].id)
            # the entry at j may move to the hole i unless home is cyclically in (i, j]
            if ((j - home) & mask) < ((j - i) & mask):
                continue
            self._tasks[i] = self._tasks[j]
            i = j
        memset(&self._tasks[i], 0, sizeof(TaskRec))
        self._tasks[i].id = -1
        self._tlive -= 1

    def table_stats(self):
        """The task table's shape: ``capacity`` (slots), ``live`` (registered tasks),
        ``max_probe`` (longest probe run of a live entry: 1 = found in its home slot).
        Bounded by the peak number of live tasks, not by how many came and went."""
        cdef uint64_t i, mask, cap, live, longest = 0, d
        PyThread_acquire_lock(self._tlock, WAIT_LOCK)
        cap, live, mask = self._tcap, self._tlive, self._tcap - 1
        for i in range(cap):
            if self._tasks[i].id >= 0:
                d = ((i - self._home(self._tasks[i].id)) & mask) + 1
                if d > longest:
                    longest = d
        PyThread_release_lock(self._tlock)
        return {"capacity": cap, "live": live, "max_probe": longest}

    cdef void _free_rec(self, TaskRec* r) noexcept nogil:
        cdef int32_t k
        free(r.funcs)
        free(r.geom)
        free(r.args)
        free(r.offs)
        if r.pfuncs != NULL:
            for k in range(r.nk):
                _drop_padded(r, k)
        free(r.pfuncs)
        free(r.pgeom)
        free(r.pargs)
        free(r.vfn)
        free(r.vop)
        free(r.gg)
        r.vfn = NULL
        r.vop = NULL
        r.gg = NULL
        r.grec = 0
        r.rg = NULL
        r.funcs = NULL
        r.geom = NULL
        r.args = NULL
        r.offs = NULL
        r.pfuncs = NULL
        r.pgeom = NULL
        r.pargs = NULL

    def register_task(self, int64_t task, funcs, bytes geom, bytes args, offs, vendor=None,
                      graphs=None, uintptr_t record=0, uintptr_t rt_graph=0):
        """Launch table of a task: per kernel its CUfunction, 7 geometry words (uint32:
        grid xyz, block xyz, smem) and the offset of its packed struct in ``args``.

        ``vendor``: per kernel None or ``(launcher address, op address)``: that kernel is a
        vendor op, launched by calling the launcher on the stream (``cuda_vendor.pyx``)
        with the same packed struct, unless the stream's flag is up (it cannot check it).

        ``graphs``: per kernel 0 or a ``gated_graph`` address, and ``record`` the task's
        gate record (``nk + 1`` host-visible uint32 words, kernels/cuda/gate.py): on a
        stream with graphs on, that kernel is launched through its gated graph and its
        completion reports whether it ran.

        ``rt_graph``: an ``rt_graph`` address captured with exactly this ``args`` (the
        task's arena is that graph's arena): on a stream with RT graphs on, the task goes as
        one graph launch when the vHQ holds all of it (docs/cuda_graphs.md)."""
        cdef int32_t nk = len(funcs)
        if rt_graph and (<RtGraph*>rt_graph).nk != nk:
            raise ValueError("the RT graph holds another number of kernels")
        cdef int32_t i
        cdef GatedGraph** gg = NULL
        if graphs is not None and any(graphs):
            if len(graphs) != nk or record == 0:
                raise ValueError("graph table size does not match, or no record")
            gg = <GatedGraph**>calloc(nk, sizeof(GatedGraph*))
            if gg == NULL:
                raise MemoryError()
            for i in range(nk):
                gg[i] = <GatedGraph*><uintptr_t>graphs[i]
        cdef p_vendor_launch* vf = NULL
        cdef void** vo = NULL
        if vendor is not None and any(v is not None for v in vendor):
            if len(vendor) != nk:
                raise ValueError("vendor table size does not match")
            vf = <p_vendor_launch*>calloc(nk, sizeof(p_vendor_launch))
            vo = <void**>calloc(nk, sizeof(void*))
            if vf == NULL or vo == NULL:
                free(vf); free(vo); free(gg)
                raise MemoryError()
            for i in range(nk):
                if vendor[i] is not None:
                    vf[i] = <p_vendor_launch><uintptr_t>vendor[i][0]
                    vo[i] = <void*><uintptr_t>vendor[i][1]
        if task < 0 or len(geom) != nk * GEOM_WORDS * 4 or len(offs) != nk:
            free(vf); free(vo); free(gg)
            if task < 0:
                raise ValueError(f"task ids are >= 0, got {task}")
            raise ValueError("launch table sizes do not match")
        cdef CUfunction* fs = <CUfunction*>malloc(max(nk, 1) * sizeof(CUfunction))
        cdef uint32_t* gm = <uint32_t*>malloc(max(nk, 1) * GEOM_WORDS * 4)
        cdef char* ag = <char*>malloc(max(len(args), 1))
        cdef int64_t* of = <int64_t*>malloc(max(nk, 1) * sizeof(int64_t))
        if fs == NULL or gm == NULL or ag == NULL or of == NULL:
            free(fs); free(gm); free(ag); free(of); free(vf); free(vo); free(gg)
            raise MemoryError()
        for i in range(nk):
            fs[i] = <CUfunction><uintptr_t>funcs[i]
            of[i] = offs[i]
        memcpy(gm, <const char*>geom, len(geom))
        memcpy(ag, <const char*>args, len(args))
        cdef TaskRec* r
        PyThread_acquire_lock(self._tlock, WAIT_LOCK)
        r = self._find(task, False)
        if r != NULL:
            self._free_rec(r)  # re-registered: the new table replaces the old
        else:
            if (self._tlive + 1) * 2 > self._tcap and not self._grow():
                PyThread_release_lock(self._tlock)
                free(fs); free(gm); free(ag); free(of); free(vf); free(vo); free(gg)
                raise MemoryError("task table")
            r = self._find(task, True)
            self._tlive += 1
        r.id = task
        r.nk = nk
        r.inflight = 0
        r.funcs = fs
        r.geom = gm
        r.args = ag
        r.offs = of  # pfuncs/pgeom/pargs: NULL in every free slot (calloc, _free_rec)
        r.vfn = vf
        r.vop = vo
        r.gg = gg
        r.grec = <CUdeviceptr>record if gg != NULL else 0
        r.rg = <RtGraph*>rt_graph
        PyThread_release_lock(self._tlock)

    def set_padded(self, int64_t task, int32_t kernel, uintptr_t func, bytes geom, bytes args):
        """The next launch of ``kernel`` of ``task`` is this padded launch (DKP): the
        dispatcher kernel ``func`` with geometry ``geom`` (7 uint32 words) and the single
        by-value argument ``args``; later launches of that kernel are plain again."""
        if len(geom) != GEOM_WORDS * 4:
            raise ValueError("padded geometry: 7 uint32 words")
        cdef char* blob = <char*>malloc(max(len(args), 1))
        if blob == NULL:
            raise MemoryError()
        memcpy(blob, <const char*>args, len(args))
        cdef TaskRec* r
        cdef int32_t i
        PyThread_acquire_lock(self._tlock, WAIT_LOCK)
        r = self._find(task, False)
        if r == NULL or not 0 <= kernel < r.nk:
            PyThread_release_lock(self._tlock)
            free(blob)
            raise KeyError(f"task {task} kernel {kernel} is not registered")
        if r.pfuncs == NULL:
            r.pfuncs = <CUfunction*>calloc(r.nk, sizeof(CUfunction))
            r.pgeom = <uint32_t*>calloc(r.nk * GEOM_WORDS, 4)
            r.pargs = <char**>calloc(r.nk, sizeof(char*))
            if r.pfuncs == NULL or r.pgeom == NULL or r.pargs == NULL:
                free(r.pfuncs); free(r.pgeom); free(r.pargs)
                r.pfuncs = NULL
                r.pgeom = NULL
                r.pargs = NULL
                PyThread_release_lock(self._tlock)
                free(blob)
                raise MemoryError()
        free(r.pargs[kernel])
        r.pfuncs[kernel] = <CUfunction>func
        memcpy(r.pgeom + GEOM_WORDS * kernel, <const char*>geom, GEOM_WORDS * 4)
        r.pargs[kernel] = blob
        PyThread_release_lock(self._tlock)

    def clear_padded(self, int64_t task, int32_t first=0):
        """Forget the padded launches of kernels ``first..`` of ``task`` not yet launched
        (a reset dropped them: they run plain when restored); returns how many."""
        cdef TaskRec* r
        cdef int32_t k
        cdef int n = 0
        PyThread_acquire_lock(self._tlock, WAIT_LOCK)
        r = self._find(task, False)
        if r != NULL and r.pfuncs != NULL:
            for k in range(max(first, 0), r.nk):
                n += r.pfuncs[k] != NULL
                _drop_padded(r, k)
        PyThread_release_lock(self._tlock)
        return n

    def unregister_task(self, int64_t task):
        """Forget a task's launch table; False (and nothing freed) while launches are in flight."""
        cdef TaskRec* r
        PyThread_acquire_lock(self._tlock, WAIT_LOCK)
        r = self._find(task, False)
        if r == NULL:
            PyThread_release_lock(self._tlock)
            return True
        if r.inflight > 0:
            PyThread_release_lock(self._tlock)
            return False
        self._remove(r)
        PyThread_release_lock(self._tlock)
        return True

    def task_inflight(self, int64_t task):
        cdef TaskRec* r
        cdef int64_t n = 0
        PyThread_acquire_lock(self._tlock, WAIT_LOCK)
        r = self._find(task, False)
        if r != NULL:
            n = r.inflight
        PyThread_release_lock(self._tlock)
        return n

    # -- the loop -----------------------------------------------------------------------
    cdef int _push_comp(self, int32_t s, int64_t t, int32_t k, int32_t status, double t0,
                        double t1, int32_t executed, int32_t padded,
                        int32_t count=1) noexcept nogil:
        cdef Comp* c
        PyThread_acquire_lock(self._rlock, WAIT_LOCK)
        if self._rtail - self._rhead >= COMP_RING:
            PyThread_release_lock(self._rlock)
            return 0
        c = &self._ring[self._rtail & (COMP_RING - 1)]
        c.stream = s
        c.task = t
        c.kernel = k
        c.status = status
        c.executed = executed
        c.padded = padded
        c.count = count
        c.t0 = t0
        c.t1 = t1
        self._rtail += 1
        PyThread_release_lock(self._rlock)
        return 1

    cdef CUresult _issue(self, Stream* st, TaskRec* rec, int32_t k) noexcept nogil:
        """Kernel ``k`` of ``rec`` as a plain launch on ``st`` (ours: its flag word and
        struct; a vendor op: through its launcher, unless the flag is up). No event: the
        caller records one for the unit (an RT graph launch the driver refused)."""
        cdef uint32_t* g
        cdef void* params[2]
        if rec.vfn != NULL and rec.vfn[k] != NULL:
            if st.hflag:
                st.vskipped += 1
                return CUDA_SUCCESS
            return rec.vfn[k](rec.vop[k], rec.args + rec.offs[k], st.s, st.vctx)
        g = rec.geom + GEOM_WORDS * k
        params[0] = &st.flag
        params[1] = rec.args + rec.offs[k]
        return self._drv.cuLaunchKernel(rec.funcs[k], g[0], g[1], g[2], g[3], g[4], g[5], g[6],
                                        st.s, params, NULL)

    cdef int _step(self) noexcept nogil:
        """One pass over every stream; returns 1 if anything happened, 2 if work is in flight."""
        cdef int s, busy = 0, inflight = 0
        cdef Stream* st
        cdef uint32_t slot
        cdef CUresult r
        cdef int64_t t
        cdef int32_t k
        cdef TaskRec* rec
        cdef uint32_t* g
        cdef void* params[2]
        cdef double tl, tl2
        cdef int is_vendor, is_padded
        cdef int32_t executed
        cdef uint32_t word
        cdef KernelNodeParams kp
        cdef void* gparams[4]
        cdef uint32_t k32[MAX_GRAPH_OPS]
        cdef GatedGraph* gg
        cdef GatedOp* o
        cdef int32_t klast, i, nops, unit_n, n1
        cdef bint held
        cdef RtGraph* rg
        cdef int64_t t2
        cdef int32_t k2
        cdef int nst = self._nst
        for s in range(nst):
            st = &self._st[s]
            # 1. completions, in stream order
            while st.count > 0:
                slot = st.head
                if st.err[slot] == CUDA_SUCCESS:
                    r = self._drv.cuEventQuery(st.ev[slot])
                    if r == CUDA_ERROR_NOT_READY:
                        break
                else:
                    r = st.err[slot]
                n1 = <int32_t>st.cnt[slot]  # an RT graph launch: a whole task's n kernels
                if self._rtail - self._rhead + <uint64_t>(1 if r == CUDA_SUCCESS else n1) > COMP_RING:
                    break  # Python is behind: keep the launch in flight for now
                for i in range(n1):
                    _vhq_complete(self._vhq[s], &t, &k)
                executed = -1
                PyThread_acquire_lock(self._tlock, WAIT_LOCK)
                rec = self._find(st.task[slot], False)
                if rec != NULL and rec.inflight > 0:
                    rec.inflight = rec.inflight - n1 if rec.inflight >= n1 else 0
                if (st.gated[slot] and r == CUDA_SUCCESS and rec != NULL and rec.grec != 0
                        and 0 <= st.kernel[slot] < rec.nk):
                    # the graph completed: its gate wrote the record (host-visible memory)
                    word = (<volatile uint32_t*>rec.grec)[1 + st.kernel[slot]]
                    executed = 1 if word == 1 else (0 if word == 2 else -1)
                    if executed == 0:
                        st.gskipped += 1
                PyThread_release_lock(self._tlock)
                if n1 == 1:
                    self._push_comp(s, st.task[slot], st.kernel[slot], r, st.t0[slot], _now(),
                                    executed, st.padded[slot])
                elif r == CUDA_SUCCESS:  # one record of the whole graph (Completion.count)
                    self._push_comp(s, st.task[slot], st.kernel[slot], r, st.t0[slot], _now(),
                                    -1, 0, n1)
                else:  # a failed unit: one failed record per kernel, as plain launches give
                    tl = _now()
                    for i in range(n1):
                        self._push_comp(s, st.task[slot], st.kernel[slot] + i, r, st.t0[slot],
                                        tl, -1, 0)
                if st.unit_end[slot]:
                    st.units -= 1
                st.head = (slot + 1) % RING
                st.count -= 1
                st.completed += n1
                busy = 1
            # 2. transmissions while the vHQ allows (< c in flight) and, where gated graphs
            #    of several ops run, fewer than c launch units are in flight
            while st.count < RING and st.units < st.cunits:
                if st.has_pend:  # taken from the vHQ while filling a graph; it did not fit
                    t = st.pend_t
                    k = st.pend_k
                    st.has_pend = 0
                elif not _vhq_transmit(self._vhq[s], &t, &k):
                    break
                slot = (st.head + st.count) % RING
                r = -1  # unknown task / kernel index
                is_vendor = 0
                is_padded = 0
                nops = 1
                unit_n = 1
                st.gated[slot] = 0
                tl = _now()
                PyThread_acquire_lock(self._tlock, WAIT_LOCK)
                rec = self._find(t, False)
                if rec != NULL and 0 <= k < rec.nk and rec.pfuncs != NULL and rec.pfuncs[k] != NULL:
                    # DKP: the padded dispatcher kernel takes one by-value struct (its
                    # parts carry their flag words); CUDA copies it at the launch call
                    g = rec.pgeom + GEOM_WORDS * k
                    params[0] = rec.pargs[k]
                    r = self._drv.cuLaunchKernel(rec.pfuncs[k], g[0], g[1], g[2], g[3], g[4],
                                                 g[5], g[6], st.s, params, NULL)
                    _drop_padded(rec, k)
                    is_padded = 1
                    if r == CUDA_SUCCESS:
                        r = self._drv.cuEventRecord(st.ev[slot], st.s)
                    rec.inflight += 1
                elif (st.rtg and k == 0 and rec != NULL and rec.rg != NULL and not rec.rg.dead
                      and rec.rg.nk == rec.nk and _no_padded(rec)
                      and _vhq_take_rest(self._vhq[s], t, rec.nk)):
                    # RT as one graph (docs/cuda_graphs.md): the vHQ held the whole task and
                    # handed all of it out above; one graph launch runs every kernel, one
                    # event completes them (one slot, one unit against c, one record). A
                    # launch the driver refuses runs the same kernels plain, still one unit,
                    # and the graph is not used again (counted; the device reports it)
                    rg = rec.rg
                    unit_n = rec.nk
                    r = self._drv.cuGraphLaunch(rg.exec, st.s)
                    if r == CUDA_SUCCESS:
                        st.rglaunched += 1
                        st.rgops += unit_n
                    else:
                        rg.dead = 1
                        rg.refused = r
                        st.rgrefused += 1
                        st.rglast = r
                        r = CUDA_SUCCESS
                        for i in range(unit_n):
                            r = self._issue(st, rec, i)
                            if r != CUDA_SUCCESS:
                                break
                    if r == CUDA_SUCCESS:
                        r = self._drv.cuEventRecord(st.ev[slot], st.s)
                    rec.inflight += unit_n
                elif (st.graphs and rec != NULL and 0 <= k < rec.nk and rec.gg != NULL
                      and rec.gg[k] != NULL):
                    # a gated graph (docs/cuda_graphs.md) holding kernels first..first+n-1:
                    # this launch holds k and the following indices the vHQ hands out next
                    # for the same task (transmitted now, so a reset never drops an index
                    # whose gate may still open); an index that does not follow becomes the
                    # next launch. Its values go into the executable graph's kernel nodes
                    # (later launches only), gates of ops it does not hold stay shut, then
                    # one graph launch; each gate reads the flag and records its op's outcome
                    # (the vHQ's lock is taken under _tlock here; nothing takes them the
                    # other way round: vHQ calls never call into the dispatcher)
                    gg = rec.gg[k]
                    klast = k
                    while (klast + 1 < gg.first + gg.n and st.count + (klast - k) + 1 < RING
                           and (rec.pfuncs == NULL or rec.pfuncs[klast + 1] == NULL)
                           and _vhq_transmit(self._vhq[s], &t2, &k2)):
                        if t2 == t and k2 == klast + 1:
                            klast = k2
                        else:
                            st.has_pend = 1
                            st.pend_t = t2
                            st.pend_k = k2
                            break
                    nops = klast - k + 1
                    r = CUDA_SUCCESS
                    memset(&kp, 0, sizeof(KernelNodeParams))
                    for i in range(gg.n):
                        if r != CUDA_SUCCESS:
                            break
                        o = &gg.ops[i]
                        held = k <= gg.first + i <= klast
                        # NOT_THIS_LAUNCH (gate.py): an op this launch does not hold
                        k32[i] = <uint32_t>(gg.first + i) if held else <uint32_t>0xFFFFFFFF
                        kp.func = gg.gate_func
                        kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1
                        kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1
                        kp.sharedMemBytes = 0
                        gparams[0] = &st.flag
                        gparams[1] = &o.cond
                        gparams[2] = &rec.grec
                        gparams[3] = &k32[i]
                        kp.kernelParams = gparams
                        r = self._drv.cuGraphExecKernelNodeSetParams(gg.exec, o.gate, &kp)
                        if held and o.captured:  # baked into the body: nothing to update
                            st.gvops += 1
                        elif r == CUDA_SUCCESS and held:
                            kp.func = o.op_func
                            g = o.geom
                            kp.gridDimX, kp.gridDimY, kp.gridDimZ = g[0], g[1], g[2]
                            kp.blockDimX, kp.blockDimY, kp.blockDimZ = g[3], g[4], g[5]
                            kp.sharedMemBytes = g[6]
                            params[0] = &self._zero
                            params[1] = rec.args + rec.offs[gg.first + i]
                            kp.kernelParams = params
                            r = self._drv.cuGraphExecKernelNodeSetParams(gg.exec, o.op, &kp)
                    if r == CUDA_SUCCESS:
                        r = self._drv.cuGraphLaunch(gg.exec, st.s)
                    st.glaunched += 1
                    st.gops += nops
                    for i in range(nops):  # one ring slot per index: one completion each
                        slot = (st.head + st.count + i) % RING
                        st.gated[slot] = 1
                        st.err[slot] = r
                        if r == CUDA_SUCCESS:
                            st.err[slot] = self._drv.cuEventRecord(st.ev[slot], st.s)
                        st.task[slot] = t
                        st.kernel[slot] = k + i
                        st.unit_end[slot] = 0
                        st.padded[slot] = 0
                        st.cnt[slot] = 1
                    rec.inflight += nops
                elif rec != NULL and 0 <= k < rec.nk and rec.vfn != NULL and rec.vfn[k] != NULL:
                    # a vendor op: a closed kernel cannot read the flag, so it is checked
                    # here; while it is up the op is not issued and completes like a kernel
                    # of ours that returned at its flag check (an event only)
                    is_vendor = 1
                    if st.hflag:
                        st.vskipped += 1
                        r = CUDA_SUCCESS
                    else:
                        r = rec.vfn[k](rec.vop[k], rec.args + rec.offs[k], st.s, st.vctx)
                    if r == CUDA_SUCCESS:
                        r = self._drv.cuEventRecord(st.ev[slot], st.s)
                    rec.inflight += 1
                elif rec != NULL and 0 <= k < rec.nk:
                    g = rec.geom + GEOM_WORDS * k
                    params[0] = &st.flag
                    params[1] = rec.args + rec.offs[k]
                    r = self._drv.cuLaunchKernel(rec.funcs[k], g[0], g[1], g[2], g[3], g[4], g[5],
                                            g[6], st.s, params, NULL)
                    if r == CUDA_SUCCESS:
                        r = self._drv.cuEventRecord(st.ev[slot], st.s)
                    rec.inflight += 1
                PyThread_release_lock(self._tlock)
                if nops > 1:  # a graph of several indices: slots filled above
                    tl2 = _now()
                    for i in range(nops):
                        st.t0[(st.head + st.count + i) % RING] = tl2
                    st.host_s += tl2 - tl
                    slot = (st.head + st.count + nops - 1) % RING
                    st.unit_end[slot] = 1
                    st.count += nops
                    st.launched += nops
                    st.units += 1
                    busy = 1
                    continue
                if st.gated[slot]:
                    r = st.err[slot]  # the graph branch recorded its one slot
                st.task[slot] = t
                st.kernel[slot] = k
                st.t0[slot] = _now()
                st.host_s += st.t0[slot] - tl
                if is_vendor:
                    st.vlaunched += 1
                    st.vhost_s += st.t0[slot] - tl
                st.err[slot] = r
                st.padded[slot] = is_padded
                st.unit_end[slot] = 1
                st.cnt[slot] = <uint32_t>unit_n
                st.count += 1
                st.units += 1
                st.launched += unit_n
                busy = 1
            if st.count > 0:
                inflight = 1
        if busy:
            PyThread_release_lock(self._rsig)
        return busy | (inflight << 1)

    def _run(self):
        """The dispatcher thread's body (call from a threading.Thread)."""
        cdef int state
        cdef timespec ts
        cdef double idle_since = 0.0
        with nogil:
            self._cur()
            while not self._stop:
                state = self._step()
                self._loops += 1
                if state & 1:
                    idle_since = 0.0
                    continue
                if state & 2:
                    # work in flight: poll; nap briefly after spin_us of nothing happening
                    if idle_since == 0.0:
                        idle_since = _now()
                    elif (_now() - idle_since) * 1e6 > self.spin_us:
                        ts.tv_sec = 0
                        ts.tv_nsec = 2000
                        nanosleep(&ts, NULL)
                    continue
                idle_since = 0.0
                PyThread_acquire_lock_timed(self._wake, 2000, 0)  # until enqueue() wakes us

    def wake(self):
        """New launches were queued: wake the loop if it sleeps."""
        PyThread_release_lock(self._wake)

    def stop(self):
        self._stop = 1
        PyThread_release_lock(self._wake)
        PyThread_release_lock(self._rsig)

    @property
    def loops(self):
        return self._loops

    def poll(self, int max_n=4096, double timeout=0.05, bint executed=False,
             bint coalesce=False):
        """Completions since the last poll, waiting up to ``timeout`` s for the first:
        list of (stream, task, kernel, status, t_launch, t_observed), with ``executed``
        one more item: True / False where a gated graph's record says whether the op ran,
        else None.

        ``coalesce`` (implies ``executed``): consecutive ring entries of one stream and
        one task with consecutive kernels, all status 0, the same ``executed``, none a
        padded launch, become one item, and only while that stream's preemption flag is
        down (host copy, read now): items are (stream, task, first kernel, status,
        t_launch of the first, t_observed of the last, executed, count, times) with
        ``times`` the (t_launch, t_observed) of each, flattened (() when count is 1).
        At most ``max_n`` ring entries are taken either way; order is kept.

        An RT graph launch (docs/cuda_graphs.md) completes a whole task at once: one ring
        entry, given as one coalesced item of all its kernels (``coalesce``; ``times``: the
        graph's (t_launch, t_observed) for each) or as one single item per kernel."""
        cdef long long us = <long long>(timeout * 1e6)
        cdef int n = 0
        cdef int cnt, i
        cdef Comp c
        cdef Comp* c2
        out = []
        if self._rtail == self._rhead:
            with nogil:
                PyThread_acquire_lock_timed(self._rsig, us, 0)
        PyThread_acquire_lock(self._rlock, WAIT_LOCK)
        while self._rhead != self._rtail and n < max_n:
            c = self._ring[self._rhead & (COMP_RING - 1)]
            self._rhead += 1
            n += 1
            if c.count > 1:  # an RT graph launch: the task's kernels, all at once
                ex = None if c.executed < 0 else c.executed == 1
                if coalesce:
                    out.append((c.stream, c.task, c.kernel, c.status, c.t0, c.t1, ex, c.count,
                                (c.t0, c.t1) * c.count))
                else:
                    for i in range(c.count):
                        out.append((c.stream, c.task, c.kernel + i, c.status, c.t0, c.t1, ex)
                                   if executed else
                                   (c.stream, c.task, c.kernel + i, c.status, c.t0, c.t1))
                continue
            if coalesce:
                cnt = 1
                tt = None
                if (c.status == CUDA_SUCCESS and not c.padded and 0 <= c.stream < self._nst
                        and self._st[c.stream].hflag == 0):
                    while self._rhead != self._rtail and n < max_n:
                        c2 = &self._ring[self._rhead & (COMP_RING - 1)]
                        if (c2.stream != c.stream or c2.task != c.task
                                or c2.kernel != c.kernel + cnt or c2.status != CUDA_SUCCESS
                                or c2.padded or c2.executed != c.executed or c2.count != 1):
                            break
                        if tt is None:
                            tt = [c.t0, c.t1]
                        tt.append(c2.t0)
                        tt.append(c2.t1)
                        c.t1 = c2.t1
                        cnt += 1
                        self._rhead += 1
                        n += 1
                out.append((c.stream, c.task, c.kernel, c.status, c.t0, c.t1,
                            None if c.executed < 0 else c.executed == 1, cnt,
                            tuple(tt) if cnt > 1 else ()))
            elif executed:
                out.append((c.stream, c.task, c.kernel, c.status, c.t0, c.t1,
                            None if c.executed < 0 else c.executed == 1))
            else:
                out.append((c.stream, c.task, c.kernel, c.status, c.t0, c.t1))
        PyThread_release_lock(self._rlock)
        return out
