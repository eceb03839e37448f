# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Vendor kernels (cuBLASLt, cuDNN 9) behind the cuda dispatcher, loaded with ``dlopen``.

Why here: a vendor op is one more kernel index of a plan in the vHQ; the nogil dispatch
loop (``cuda_dispatch.pyx``) launches it through :c:func:`vendor_launch` (its address is
``Vendor.launch_address``) instead of ``cuLaunchKernel``. Like libcuda, the libraries are
never linked and no NVIDIA header is included: the handful of prototypes, enums and structs
used are declared below (cuBLASLt 12/13 and cuDNN 9 ABI), so CI builds this without CUDA.

What is guaranteed:
* ``Vendor(cublaslt_path, cudnn_path)`` dlopens exactly those files (the search over
  NVIDIA's wheels and the typed "missing" error live in ``av_infer/devices/cuda_vendor.py``)
  and raises OSError naming the file and the missing symbol otherwise. Either may be None.
* ``matmul_op`` / ``conv_op`` build every descriptor once and pick the algorithm once, from
  the library's heuristics (no timing: the same shapes give the same algorithm in every
  run), restricted to deterministic algorithms with the requested maths (FP32: FMA only,
  no TF32) and to the per-stream workspace; the choice is stored in the op (pinned).
  A conv with ReLU or a residual add is one fused ``cudnnConvolutionBiasActivationForward``;
  one with neither is ``cudnnConvolutionForward`` (+ ``cudnnAddTensor`` when it has a
  bias), because the fused call with the identity activation is limited to one algorithm.
* ``vendor_launch(op, args, stream, sctx)`` (nogil, no allocation) runs one op on
  ``stream``: ``args`` is the op's packed ``MmArgs`` struct of the task (the same bytes our
  own kernel gets: pointers y, a, b, bias, res first), ``sctx`` the stream's context (its
  cuDNN handle and workspace, ``stream_ctx``). Returns 0 or a vendor status encoded as
  ``LT_BASE + cublasStatus_t`` / ``DNN_BASE + cudnnStatus_t`` (``error_string`` decodes).
"""
from libc.stdint cimport int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset
from posix.dlfcn cimport RTLD_GLOBAL, RTLD_LOCAL, RTLD_NOW, dlerror, dlopen, dlsym

# -- status encoding (see module docstring) --------------------------------------------------
cdef enum:
    LT_BASE_ = 0x10000
    DNN_BASE_ = 0x20000
    ERR_NO_CTX_ = 0x30001      # the stream has no vendor context
    ERR_WS_ = 0x30002          # the op needs more workspace than the stream has

LT_BASE = LT_BASE_
DNN_BASE = DNN_BASE_
ERR_NO_CTX = ERR_NO_CTX_
ERR_WS = ERR_WS_

# -- cuBLASLt (declared by hand; values from cublasLt.h / library_types.h) ------------------
cdef enum:
    CUDA_R_32F = 0
    CUBLAS_COMPUTE_32F = 68
    CUBLAS_COMPUTE_32F_FAST_16F = 74
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77
    CUBLAS_OP_N = 0
    CUBLAS_OP_T = 1
    CUBLASLT_MATMUL_DESC_TRANSA = 3
    CUBLASLT_MATMUL_DESC_TRANSB = 4
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8
    CUBLASLT_EPILOGUE_DEFAULT = 1
    CUBLASLT_EPILOGUE_RELU = 2
    CUBLASLT_EPILOGUE_BIAS = 4
    CUBLASLT_EPILOGUE_RELU_BIAS = 6
    CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5
    CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1
    CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5   # B, C, D: 6, 7, 8
    CUBLASLT_REDUCTION_SCHEME_NONE = 0
    CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE = 2
    CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE = 4

ctypedef int (*lt_create_t)(void**) noexcept nogil
ctypedef int (*lt_destroy_t)(void*) noexcept nogil
ctypedef size_t (*lt_version_t)() noexcept nogil
ctypedef int (*lt_desc_create_t)(void**, int, int) noexcept nogil
ctypedef int (*lt_set_attr_t)(void*, int, const void*, size_t) noexcept nogil
ctypedef int (*lt_layout_create_t)(void**, int, uint64_t, uint64_t, int64_t) noexcept nogil
ctypedef int (*lt_heur_t)(void*, void*, void*, void*, void*, void*, void*, int, void*,
                          int*) noexcept nogil
ctypedef int (*lt_matmul_t)(void*, void*, const void*, const void*, void*, const void*, void*,
                            const void*, const void*, void*, void*, void*, const void*, void*,
                            size_t, void*) noexcept nogil

cdef struct Lt:
    void* lib
    void* handle
    lt_create_t create
    lt_destroy_t destroy
    lt_version_t version
    lt_desc_create_t desc_create
    lt_destroy_t desc_destroy
    lt_set_attr_t desc_set
    lt_layout_create_t layout_create
    lt_destroy_t layout_destroy
    lt_set_attr_t layout_set
    lt_create_t pref_create
    lt_destroy_t pref_destroy
    lt_set_attr_t pref_set
    lt_heur_t heuristic
    lt_matmul_t matmul

# -- cuDNN 9 legacy API (values from cudnn_ops.h / cudnn_cnn.h / cudnn_graph.h) --------------
cdef enum:
    CUDNN_TENSOR_NCHW = 0
    CUDNN_DATA_FLOAT = 0
    CUDNN_CROSS_CORRELATION = 1
    CUDNN_DEFAULT_MATH = 0
    CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2
    CUDNN_FMA_MATH = 3
    CUDNN_ACTIVATION_RELU = 1
    CUDNN_ACTIVATION_IDENTITY = 5
    CUDNN_NOT_PROPAGATE_NAN = 0
    CUDNN_PROPAGATE_NAN = 1
    CUDNN_FWD_IMPLICIT_PRECOMP_GEMM = 1
    CUDNN_DETERMINISTIC = 1
    CUDNN_ALGOS = 8

cdef struct ConvPerf:          # cudnnConvolutionFwdAlgoPerf_t
    int algo
    int status
    float time
    size_t memory
    int determinism
    int mathType
    int reserved[3]

ctypedef int (*dnn_create_t)(void**) noexcept nogil
ctypedef int (*dnn_destroy_t)(void*) noexcept nogil
ctypedef int (*dnn_set_stream_t)(void*, void*) noexcept nogil
ctypedef size_t (*dnn_version_t)() noexcept nogil
ctypedef const char* (*dnn_errstr_t)(int) noexcept nogil
ctypedef int (*dnn_set_tensor4d_t)(void*, int, int, int, int, int, int) noexcept nogil
ctypedef int (*dnn_set_filter4d_t)(void*, int, int, int, int, int, int) noexcept nogil
ctypedef int (*dnn_set_conv2d_t)(void*, int, int, int, int, int, int, int, int) noexcept nogil
ctypedef int (*dnn_set_int_t)(void*, int) noexcept nogil
ctypedef int (*dnn_set_act_t)(void*, int, int, double) noexcept nogil
ctypedef int (*dnn_algo_v7_t)(void*, void*, void*, void*, void*, int, int*, ConvPerf*) noexcept nogil
ctypedef int (*dnn_ws_t)(void*, void*, void*, void*, void*, int, size_t*) noexcept nogil
ctypedef int (*dnn_cba_t)(void*, const void*, void*, const void*, void*, const void*, void*, int,
                          void*, size_t, const void*, void*, const void*, void*, const void*,
                          void*, void*, void*) noexcept nogil
# cudnnConvolutionForward(handle, alpha, xDesc, x, wDesc, w, convDesc, algo, workSpace,
#                         workSpaceSizeInBytes, beta, yDesc, y)
ctypedef int (*dnn_fwd_t)(void*, const void*, void*, const void*, void*, const void*, void*, int,
                          void*, size_t, const void*, void*, void*) noexcept nogil
# cudnnAddTensor(handle, alpha, aDesc, A, beta, cDesc, C): C = alpha*A + beta*C, A broadcast
ctypedef int (*dnn_add_t)(void*, const void*, void*, const void*, const void*, void*,
                          void*) noexcept nogil

cdef struct Dnn:
    void* lib
    dnn_create_t create
    dnn_destroy_t destroy
    dnn_set_stream_t set_stream
    dnn_version_t version
    dnn_errstr_t errstr
    dnn_create_t tensor_create
    dnn_set_tensor4d_t tensor_set
    dnn_destroy_t tensor_destroy
    dnn_create_t filter_create
    dnn_set_filter4d_t filter_set
    dnn_destroy_t filter_destroy
    dnn_create_t conv_create
    dnn_set_conv2d_t conv_set
    dnn_set_int_t conv_groups
    dnn_set_int_t conv_math
    dnn_destroy_t conv_destroy
    dnn_create_t act_create
    dnn_set_act_t act_set
    dnn_destroy_t act_destroy
    dnn_algo_v7_t algo_v7
    dnn_ws_t ws_size
    dnn_cba_t cba
    dnn_fwd_t fwd
    dnn_add_t add

# -- ops and stream contexts -------------------------------------------------------------
cdef enum:
    OP_MATMUL = 1
    OP_CONV = 2
    SLOT_Y = 0
    SLOT_A = 1
    SLOT_B = 2
    SLOT_BIAS = 3
    SLOT_RES = 4
    C_NONE = 0                 # cuBLASLt C = D with beta 0
    C_RES = 1                  # C = the residual (beta 1)
    C_BIAS = 2                 # C = a full-shape bias (beta = the plan's beta)
    CALL_FUSED = 1             # cudnnConvolutionBiasActivationForward (ReLU or residual)
    CALL_CONV = 2              # cudnnConvolutionForward (identity, no residual, no bias)
    CALL_CONV_BIAS = 3         # cudnnConvolutionForward, then cudnnAddTensor of the bias

cdef struct VOp:
    int kind
    Lt* lt
    Dnn* dnn
    # matmul
    void* mdesc
    void* adesc
    void* bdesc
    void* cdesc
    void* ddesc
    unsigned char algo[64]     # cublasLtMatmulAlgo_t (8 x uint64)
    int swap                   # Lt-A = the plan's b, Lt-B = the plan's a (row-major trick)
    int bias_epi
    int c_slot
    float alpha
    float beta
    # conv
    void* xd
    void* wd
    void* yd
    void* bd
    void* convd
    void* actd
    int calgo
    int use_z
    int call                   # CALL_FUSED | CALL_CONV | CALL_CONV_BIAS
    float alpha1
    float beta0                # 0: cudnnConvolutionForward overwrites y (never reads it)
    float one                  # 1: cudnnAddTensor's alpha and beta (y += bias)
    float alpha2
    uint64_t zero_bias         # device buffer of cout zeros (conv without bias)
    size_t ws

cdef struct SCtx:
    void* dnnh                 # cuDNN handle bound to this stream (cudnnSetStream once)
    void* ws
    size_t ws_bytes
    void* stream


cdef int vendor_launch(void* opv, const char* args, void* stream, void* ctxv) noexcept nogil:
    """One vendor op on ``stream`` (the dispatcher's launch path; see module docstring)."""
    cdef VOp* op = <VOp*>opv
    cdef SCtx* ctx = <SCtx*>ctxv
    cdef const uint64_t* p = <const uint64_t*>args
    cdef int st
    cdef uint64_t y = p[SLOT_Y], a = p[SLOT_A], b = p[SLOT_B], bias = p[SLOT_BIAS]
    cdef uint64_t res = p[SLOT_RES], c, z
    cdef float beta
    if ctx == NULL:
        return ERR_NO_CTX_
    if op.ws > ctx.ws_bytes:
        return ERR_WS_
    if op.kind == OP_MATMUL:
        if op.bias_epi:
            st = op.lt.desc_set(op.mdesc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, 8)
            if st != 0:
                return LT_BASE_ + st
        c, beta = y, 0.0
        if op.c_slot == C_RES:
            c, beta = res, 1.0
        elif op.c_slot == C_BIAS:
            c, beta = bias, op.beta
        st = op.lt.matmul(op.lt.handle, op.mdesc, &op.alpha,
                          <const void*>(b if op.swap else a), op.adesc,
                          <const void*>(a if op.swap else b), op.bdesc, &beta,
                          <const void*>c, op.cdesc, <void*>y, op.ddesc, op.algo, ctx.ws, op.ws,
                          stream)
        return 0 if st == 0 else LT_BASE_ + st
    if op.kind == OP_CONV and op.call != CALL_FUSED:
        # two calls in stream order on the same handle: y = conv(x, w); y += bias
        st = op.dnn.fwd(ctx.dnnh, &op.alpha1, op.xd, <const void*>a, op.wd, <const void*>b,
                        op.convd, op.calgo, ctx.ws, op.ws, &op.beta0, op.yd, <void*>y)
        if st == 0 and op.call == CALL_CONV_BIAS:
            st = op.dnn.add(ctx.dnnh, &op.one, op.bd, <const void*>bias, &op.one, op.yd,
                            <void*>y)
        return 0 if st == 0 else DNN_BASE_ + st
    if op.kind == OP_CONV:
        z = res if op.use_z else y
        if bias == 0:
            bias = op.zero_bias
        st = op.dnn.cba(ctx.dnnh, &op.alpha1, op.xd, <const void*>a, op.wd, <const void*>b,
                        op.convd, op.calgo, ctx.ws, op.ws, &op.alpha2, op.yd, <const void*>z,
                        op.bd, <const void*>bias, op.actd, op.yd, <void*>y)
        return 0 if st == 0 else DNN_BASE_ + st
    return ERR_NO_CTX_


cdef void* _need(void* lib, str path, const char* name) except NULL:
    cdef void* f = dlsym(lib, name)
    if f == NULL:
        raise OSError(f"{path}: symbol {name.decode()} missing (library too old?)")
    return f


cdef void* _open(str path, int flags) except NULL:
    cdef bytes b = path.encode()
    cdef void* lib = dlopen(b, flags)
    cdef const char* err
    if lib == NULL:
        err = dlerror()
        raise OSError(f"{path}: dlopen failed: "
                      f"{(<bytes>err).decode() if err != NULL else 'unknown error'}")
    return lib


def _lt_check(int st, str what):
    if st != 0:
        raise RuntimeError(f"cuBLASLt {what} failed (cublasStatus_t {st})")


cdef class Vendor:
    """The loaded vendor libraries of one device, the ops built on them and the per-stream
    contexts. Ops and contexts live until ``close`` (the device's close)."""

    cdef Lt* _lt
    cdef Dnn* _dnn
    cdef list _ops
    cdef list _ctxs
    cdef public str cublaslt_path
    cdef public str cudnn_path

    def __cinit__(self):
        self._lt = NULL
        self._dnn = NULL
        self._ops = []
        self._ctxs = []

    def __init__(self, cublaslt_path=None, cudnn_path=None, preload=()):
        """dlopen the given files (None: that library is not used). ``preload``: files
        opened first with RTLD_GLOBAL (cuDNN 9's sub-libraries beside the loader shim, so
        its own by-name dlopen finds them outside the system loader path)."""
        cdef void* lib
        for extra in preload:
            lib = dlopen(str(extra).encode(), RTLD_NOW | RTLD_GLOBAL)  # best effort
        self.cublaslt_path = cublaslt_path
        self.cudnn_path = cudnn_path
        if cublaslt_path is not None:
            self._lt = <Lt*>calloc(1, sizeof(Lt))
            lib = _open(cublaslt_path, RTLD_NOW | RTLD_LOCAL)
            self._lt.lib = lib
            self._lt.create = <lt_create_t>_need(lib, cublaslt_path, b"cublasLtCreate")
            self._lt.destroy = <lt_destroy_t>_need(lib, cublaslt_path, b"cublasLtDestroy")
            self._lt.version = <lt_version_t>_need(lib, cublaslt_path, b"cublasLtGetVersion")
            self._lt.desc_create = <lt_desc_create_t>_need(lib, cublaslt_path, b"cublasLtMatmulDescCreate")
            self._lt.desc_destroy = <lt_destroy_t>_need(lib, cublaslt_path, b"cublasLtMatmulDescDestroy")
            self._lt.desc_set = <lt_set_attr_t>_need(lib, cublaslt_path, b"cublasLtMatmulDescSetAttribute")
            self._lt.layout_create = <lt_layout_create_t>_need(lib, cublaslt_path, b"cublasLtMatrixLayoutCreate")
            self._lt.layout_destroy = <lt_destroy_t>_need(lib, cublaslt_path, b"cublasLtMatrixLayoutDestroy")
            self._lt.layout_set = <lt_set_attr_t>_need(lib, cublaslt_path, b"cublasLtMatrixLayoutSetAttribute")
            self._lt.pref_create = <lt_create_t>_need(lib, cublaslt_path, b"cublasLtMatmulPreferenceCreate")
            self._lt.pref_destroy = <lt_destroy_t>_need(lib, cublaslt_path, b"cublasLtMatmulPreferenceDestroy")
            self._lt.pref_set = <lt_set_attr_t>_need(lib, cublaslt_path, b"cublasLtMatmulPreferenceSetAttribute")
            self._lt.heuristic = <lt_heur_t>_need(lib, cublaslt_path, b"cublasLtMatmulAlgoGetHeuristic")
            self._lt.matmul = <lt_matmul_t>_need(lib, cublaslt_path, b"cublasLtMatmul")
            _lt_check(self._lt.create(&self._lt.handle), "cublasLtCreate")
        if cudnn_path is not None:
            self._dnn = <Dnn*>calloc(1, sizeof(Dnn))
            lib = _open(cudnn_path, RTLD_NOW | RTLD_GLOBAL)
            self._dnn.lib = lib
            self._dnn.create = <dnn_create_t>_need(lib, cudnn_path, b"cudnnCreate")
            self._dnn.destroy = <dnn_destroy_t>_need(lib, cudnn_path, b"cudnnDestroy")
            self._dnn.set_stream = <dnn_set_stream_t>_need(lib, cudnn_path, b"cudnnSetStream")
            self._dnn.version = <dnn_version_t>_need(lib, cudnn_path, b"cudnnGetVersion")
            self._dnn.errstr = <dnn_errstr_t>_need(lib, cudnn_path, b"cudnnGetErrorString")
            self._dnn.tensor_create = <dnn_create_t>_need(lib, cudnn_path, b"cudnnCreateTensorDescriptor")
            self._dnn.tensor_set = <dnn_set_tensor4d_t>_need(lib, cudnn_path, b"cudnnSetTensor4dDescriptor")
            self._dnn.tensor_destroy = <dnn_destroy_t>_need(lib, cudnn_path, b"cudnnDestroyTensorDescriptor")
            self._dnn.filter_create = <dnn_create_t>_need(lib, cudnn_path, b"cudnnCreateFilterDescriptor")
            self._dnn.filter_set = <dnn_set_filter4d_t>_need(lib, cudnn_path, b"cudnnSetFilter4dDescriptor")
            self._dnn.filter_destroy = <dnn_destroy_t>_need(lib, cudnn_path, b"cudnnDestroyFilterDescriptor")
            self._dnn.conv_create = <dnn_create_t>_need(lib, cudnn_path, b"cudnnCreateConvolutionDescriptor")
            self._dnn.conv_set = <dnn_set_conv2d_t>_need(lib, cudnn_path, b"cudnnSetConvolution2dDescriptor")
            self._dnn.conv_groups = <dnn_set_int_t>_need(lib, cudnn_path, b"cudnnSetConvolutionGroupCount")
            self._dnn.conv_math = <dnn_set_int_t>_need(lib, cudnn_path, b"cudnnSetConvolutionMathType")
            self._dnn.conv_destroy = <dnn_destroy_t>_need(lib, cudnn_path, b"cudnnDestroyConvolutionDescriptor")
            self._dnn.act_create = <dnn_create_t>_need(lib, cudnn_path, b"cudnnCreateActivationDescriptor")
            self._dnn.act_set = <dnn_set_act_t>_need(lib, cudnn_path, b"cudnnSetActivationDescriptor")
            self._dnn.act_destroy = <dnn_destroy_t>_need(lib, cudnn_path, b"cudnnDestroyActivationDescriptor")
            self._dnn.algo_v7 = <dnn_algo_v7_t>_need(lib, cudnn_path, b"cudnnGetConvolutionForwardAlgorithm_v7")
            self._dnn.ws_size = <dnn_ws_t>_need(lib, cudnn_path, b"cudnnGetConvolutionForwardWorkspaceSize")
            self._dnn.cba = <dnn_cba_t>_need(lib, cudnn_path, b"cudnnConvolutionBiasActivationForward")
            self._dnn.fwd = <dnn_fwd_t>_need(lib, cudnn_path, b"cudnnConvolutionForward")
            self._dnn.add = <dnn_add_t>_need(lib, cudnn_path, b"cudnnAddTensor")

    @property
    def has_cublaslt(self):
        return self._lt != NULL

    @property
    def has_cudnn(self):
        return self._dnn != NULL

    def versions(self):
        """{"cublaslt": int, "cudnn": int} of the loaded libraries."""
        out = {}
        if self._lt != NULL:
            out["cublaslt"] = int(self._lt.version())
        if self._dnn != NULL:
            out["cudnn"] = int(self._dnn.version())
        return out

    @property
    def launch_address(self):
        """Address of ``vendor_launch`` (the dispatcher calls it for vendor kernels)."""
        return <uintptr_t>&vendor_launch

    def error_string(self, int code):
        """Text of a status ``vendor_launch`` returned."""
        cdef const char* s
        if code == ERR_NO_CTX_:
            return "vendor op on a stream without a vendor context"
        if code == ERR_WS_:
            return "vendor op needs more workspace than the stream has"
        if LT_BASE_ <= code < DNN_BASE_:
            return f"cuBLASLt status {code - LT_BASE_}"
        if DNN_BASE_ <= code < ERR_NO_CTX_:
            if self._dnn != NULL:
                s = self._dnn.errstr(code - DNN_BASE_)
                if s != NULL:
                    return f"cuDNN {(<bytes>s).decode()} ({code - DNN_BASE_})"
            return f"cuDNN status {code - DNN_BASE_}"
        return f"status {code}"

    # -- streams ---------------------------------------------------------------------------
    def stream_ctx(self, uintptr_t stream, uintptr_t ws, size_t ws_bytes):
        """Context of one dispatcher stream: its workspace (device memory the caller owns)
        and, with cuDNN, a handle bound to the stream. Returns its address."""
        cdef SCtx* c = <SCtx*>calloc(1, sizeof(SCtx))
        cdef int st
        if c == NULL:
            raise MemoryError()
        c.ws = <void*>ws
        c.ws_bytes = ws_bytes
        c.stream = <void*>stream
        if self._dnn != NULL:
            st = self._dnn.create(&c.dnnh)
            if st == 0:
                st = self._dnn.set_stream(c.dnnh, <void*>stream)
            if st != 0:
                free(c)
                raise RuntimeError(f"cudnnCreate/cudnnSetStream failed: {self.error_string(DNN_BASE_ + st)}")
        self._ctxs.append(<uintptr_t>c)
        return <uintptr_t>c

    # -- ops -------------------------------------------------------------------------------
    def matmul_op(self, *, int M, int N, int K, int a_rowmajor, int64_t lda, int b_rowmajor,
                  int64_t ldb, int batch=1, int64_t stride_a=0, int64_t stride_b=0,
                  float alpha=1.0, float beta=1.0, int bias_epi=0, int relu=0, int c_slot=0,
                  str precision="fp32", size_t max_ws=0, int align_a=256, int align_b=256,
                  int align_c=256, int align_d=256):
        """A row-major ``y[M,N] = alpha * a[M,K] @ b[K,N]`` (+ epilogue), batched.

        ``a_rowmajor``: a's rows are contiguous (``lda`` = its row stride), else a is stored
        column-major (``lda`` = its column stride); same for b. ``bias_epi``: add the bias
        vector of N (bias slot) before ``relu``; ``c_slot``: 1 adds the residual (res slot),
        2 adds ``beta`` times a full-shape bias. ``align_*``: the bytes every address of
        that operand is a multiple of (the heuristic assumes 256 unless told: an algorithm
        needing more would fail at the launch). Returns (op address, workspace bytes)."""
        if self._lt == NULL:
            raise RuntimeError("cuBLASLt is not loaded")
        cdef VOp* op = <VOp*>calloc(1, sizeof(VOp))
        if op == NULL:
            raise MemoryError()
        self._ops.append(<uintptr_t>op)
        op.kind = OP_MATMUL
        op.lt = self._lt
        op.swap = 1
        op.alpha = alpha
        op.beta = beta
        op.bias_epi = bias_epi
        op.c_slot = c_slot
        cdef Lt* lt = self._lt
        cdef int ctype = {"fp32": CUBLAS_COMPUTE_32F, "tf32": CUBLAS_COMPUTE_32F_FAST_TF32,
                          "fp16": CUBLAS_COMPUTE_32F_FAST_16F}[precision]
        cdef int opa, opb, epi
        cdef int64_t bstride_d = <int64_t>M * N, cnt = batch
        _lt_check(lt.desc_create(&op.mdesc, ctype, CUDA_R_32F), "MatmulDescCreate")
        # column-major view: D^T[N,M] = B^T[N,K] @ A^T[K,M]; Lt-A is b, Lt-B is a
        opa = CUBLAS_OP_N if b_rowmajor else CUBLAS_OP_T
        opb = CUBLAS_OP_N if a_rowmajor else CUBLAS_OP_T
        _lt_check(lt.desc_set(op.mdesc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(int)), "TRANSA")
        _lt_check(lt.desc_set(op.mdesc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(int)), "TRANSB")
        epi = CUBLASLT_EPILOGUE_DEFAULT
        if bias_epi and relu:
            epi = CUBLASLT_EPILOGUE_RELU_BIAS
        elif bias_epi:
            epi = CUBLASLT_EPILOGUE_BIAS
        elif relu:
            epi = CUBLASLT_EPILOGUE_RELU
        _lt_check(lt.desc_set(op.mdesc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(int)), "EPILOGUE")
        if b_rowmajor:
            _lt_check(lt.layout_create(&op.adesc, CUDA_R_32F, N, K, max(ldb, N, 1)), "layout A")
        else:
            _lt_check(lt.layout_create(&op.adesc, CUDA_R_32F, K, N, max(ldb, K, 1)), "layout A")
        if a_rowmajor:
            _lt_check(lt.layout_create(&op.bdesc, CUDA_R_32F, K, M, max(lda, K, 1)), "layout B")
        else:
            _lt_check(lt.layout_create(&op.bdesc, CUDA_R_32F, M, K, max(lda, M, 1)), "layout B")
        _lt_check(lt.layout_create(&op.cdesc, CUDA_R_32F, N, M, N), "layout C")
        _lt_check(lt.layout_create(&op.ddesc, CUDA_R_32F, N, M, N), "layout D")
        if batch > 1:
            for d, s in ((<uintptr_t>op.adesc, stride_b), (<uintptr_t>op.bdesc, stride_a),
                         (<uintptr_t>op.cdesc, bstride_d), (<uintptr_t>op.ddesc, bstride_d)):
                self._batch(<void*><uintptr_t>d, cnt, s)
        # the algorithm: the heuristic's first, deterministic reductions, within max_ws
        cdef void* pref = NULL
        cdef unsigned char res[256]
        cdef int nres = 0, st
        cdef uint64_t wsmax = max_ws
        cdef uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE
        _lt_check(lt.pref_create(&pref), "PreferenceCreate")
        try:
            _lt_check(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsmax, 8), "pref ws")
            _lt_check(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, 4), "pref reduction")
            # Lt-A is the plan's b, Lt-B the plan's a (the row-major swap above)
            for i, al in enumerate((align_b, align_a, align_c, align_d)):
                mask = <uint32_t>al
                _lt_check(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i,
                                      &mask, 4), "pref alignment")
            memset(res, 0, sizeof(res))
            st = lt.heuristic(lt.handle, op.mdesc, op.adesc, op.bdesc, op.cdesc, op.ddesc, pref,
                              1, res, &nres)
        finally:
            lt.pref_destroy(pref)
        if st != 0 or nres < 1:
            raise RuntimeError(f"cuBLASLt has no algorithm for {M}x{N}x{K} batch {batch} "
                               f"({precision}, status {st}, {nres} results)")
        memcpy(op.algo, res, 64)
        op.ws = (<size_t*>(res + 64))[0]
        return <uintptr_t>op, op.ws

    cdef _batch(self, void* d, int64_t cnt, int64_t stride):
        cdef int c32 = <int>cnt
        _lt_check(self._lt.layout_set(d, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &c32, 4), "batch count")
        _lt_check(self._lt.layout_set(d, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, 8),
                  "batch stride")

    def conv_op(self, *, int n, int c, int h, int w, int cout, int kh, int kw, int ho, int wo,
                int pad_h, int pad_w, int stride_h, int stride_w, int dil_h, int dil_w,
                int groups, int relu=0, int residual=0, int has_bias=1, uintptr_t zero_bias=0,
                str precision="fp32", size_t max_ws=0):
        """NCHW float32 cross-correlation ``y = act(conv(x, w) + z + bias)``. Returns (op
        address, workspace bytes); ``op_info(op)["call"]`` says which calls run it:

        * ``relu`` or ``residual`` (res slot, alpha2 = 1): one fused
          ``cudnnConvolutionBiasActivationForward`` ("fused"), with the bias slot or, without
          a bias (``has_bias=0``), ``zero_bias`` (a device buffer of ``cout`` zeros);
        * neither (identity activation, no residual): ``cudnnConvolutionForward``, then only
          with ``has_bias`` ``cudnnAddTensor`` of the bias slot ("conv+bias", else "conv").
          Why: the fused call with CUDNN_ACTIVATION_IDENTITY accepts only
          IMPLICIT_PRECOMP_GEMM (cuDNN API reference, cudnnActivationMode_t), which
          filters out the heuristics' faster algorithms for these convs.

        The algorithm is the heuristics' first deterministic one of the requested maths
        that fits ``max_ws`` (and, fused with identity, IMPLICIT_PRECOMP_GEMM only)."""
        if self._dnn == NULL:
            raise RuntimeError("cuDNN is not loaded")
        cdef Dnn* d = self._dnn
        cdef VOp* op = <VOp*>calloc(1, sizeof(VOp))
        if op == NULL:
            raise MemoryError()
        self._ops.append(<uintptr_t>op)
        op.kind = OP_CONV
        op.dnn = d
        op.alpha1 = 1.0
        op.alpha2 = 1.0 if residual else 0.0
        op.use_z = residual
        op.zero_bias = zero_bias
        op.beta0 = 0.0
        op.one = 1.0
        cdef int fused = 1 if (relu or residual) else 0
        op.call = CALL_FUSED if fused else (CALL_CONV_BIAS if has_bias else CALL_CONV)
        cdef int math = {"fp32": CUDNN_FMA_MATH, "tf32": CUDNN_DEFAULT_MATH,
                         "fp16": CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION}[precision]
        ck = self._dnn_check
        ck(d.tensor_create(&op.xd), "x desc")
        ck(d.tensor_set(op.xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w), "x desc")
        ck(d.tensor_create(&op.yd), "y desc")
        ck(d.tensor_set(op.yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, cout, ho, wo), "y desc")
        ck(d.tensor_create(&op.bd), "bias desc")
        ck(d.tensor_set(op.bd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, cout, 1, 1), "bias desc")
        ck(d.filter_create(&op.wd), "w desc")
        ck(d.filter_set(op.wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, cout, c // groups, kh, kw), "w desc")
        ck(d.conv_create(&op.convd), "conv desc")
        ck(d.conv_set(op.convd, pad_h, pad_w, stride_h, stride_w, dil_h, dil_w,
                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT), "conv desc")
        ck(d.conv_groups(op.convd, groups), "group count")
        ck(d.conv_math(op.convd, math), "math type")
        if fused:
            ck(d.act_create(&op.actd), "activation desc")
            ck(d.act_set(op.actd, CUDNN_ACTIVATION_RELU if relu else CUDNN_ACTIVATION_IDENTITY,
                         CUDNN_PROPAGATE_NAN, 0.0), "activation desc")
        # the algorithm: heuristics (not timing, so it is the same in every run), the first
        # deterministic one with the requested maths that fits the workspace; identity
        # activation allows only IMPLICIT_PRECOMP_GEMM in the fused call (identity without
        # a residual is not fused, so this restriction is left only for residual adds)
        cdef ConvPerf perf[CUDNN_ALGOS]
        cdef int nperf = 0, i, chosen = -1
        cdef size_t ws = 0
        cdef void* h0 = NULL
        ck(d.create(&h0), "cudnnCreate")
        try:
            ck(d.algo_v7(h0, op.xd, op.wd, op.convd, op.yd, CUDNN_ALGOS, &nperf, perf),
               "GetConvolutionForwardAlgorithm_v7")
            for i in range(nperf):
                if perf[i].status != 0 or perf[i].determinism != CUDNN_DETERMINISTIC:
                    continue
                if precision == "fp32" and perf[i].mathType != CUDNN_FMA_MATH:
                    continue
                if fused and not relu and perf[i].algo != CUDNN_FWD_IMPLICIT_PRECOMP_GEMM:
                    continue
                # the descriptor runs with the math type the heuristic paired the algorithm
                # with (FP32: always FMA, filtered above)
                if d.conv_math(op.convd, perf[i].mathType) != 0:
                    continue
                if d.ws_size(h0, op.xd, op.wd, op.convd, op.yd, perf[i].algo, &ws) != 0:
                    continue
                if ws > max_ws:
                    continue
                chosen = perf[i].algo
                break
            if chosen < 0 and fused and not relu:
                # heuristics may omit it; the fused identity path needs exactly this one
                ck(d.conv_math(op.convd, math), "math type")
                if d.ws_size(h0, op.xd, op.wd, op.convd, op.yd, CUDNN_FWD_IMPLICIT_PRECOMP_GEMM,
                             &ws) == 0 and ws <= max_ws:
                    chosen = CUDNN_FWD_IMPLICIT_PRECOMP_GEMM
        finally:
            d.destroy(h0)
        if chosen < 0:
            raise RuntimeError(
                f"cuDNN has no deterministic {precision} algorithm for conv n{n} c{c} {h}x{w} -> "
                f"{cout} k{kh}x{kw} g{groups} within {max_ws} B of workspace")
        op.calgo = chosen
        op.ws = ws
        return <uintptr_t>op, op.ws

    def _dnn_check(self, int st, str what):
        if st != 0:
            raise RuntimeError(f"cuDNN {what} failed: {self.error_string(DNN_BASE_ + st)}")

    def op_info(self, uintptr_t opp):
        """{"kind", "call", "algo", "workspace"} of an op (reports, tests). ``call``: the
        library calls one launch makes: "matmul" (cublasLtMatmul), "fused"
        (cudnnConvolutionBiasActivationForward), "conv" (cudnnConvolutionForward) or
        "conv+bias" (cudnnConvolutionForward then cudnnAddTensor)."""
        cdef VOp* op = <VOp*>opp
        if op.kind == OP_CONV:
            call = {CALL_FUSED: "fused", CALL_CONV: "conv", CALL_CONV_BIAS: "conv+bias"}[op.call]
            return {"kind": "conv", "call": call, "algo": op.calgo, "workspace": op.ws}
        return {"kind": "matmul", "call": "matmul", "algo": bytes(op.algo[:64]).hex(),
                "workspace": op.ws}

    def launch(self, uintptr_t op, bytes args, uintptr_t stream, uintptr_t ctx):
        """``vendor_launch`` from Python (profiling, tests): returns its status."""
        cdef const char* a = args
        cdef int r
        with nogil:
            r = vendor_launch(<void*>op, a, <void*>stream, <void*>ctx)
        return r

    def close(self):
        """Destroy every op, stream context and the handles (the device's close, after its
        streams are synchronised)."""
        cdef VOp* op
        cdef SCtx* c
        for addr in self._ops:
            op = <VOp*><uintptr_t>addr
            if op.kind == OP_MATMUL and op.lt != NULL:
                for dsc in (<uintptr_t>op.adesc, <uintptr_t>op.bdesc, <uintptr_t>op.cdesc,
                            <uintptr_t>op.ddesc):
                    if dsc:
                        op.lt.layout_destroy(<void*>dsc)
                if op.mdesc != NULL:
                    op.lt.desc_destroy(op.mdesc)
            elif op.kind == OP_CONV and op.dnn != NULL:
                for dsc in (<uintptr_t>op.xd, <uintptr_t>op.yd, <uintptr_t>op.bd):
                    if dsc:
                        op.dnn.tensor_destroy(<void*>dsc)
                if op.wd != NULL:
                    op.dnn.filter_destroy(op.wd)
                if op.convd != NULL:
                    op.dnn.conv_destroy(op.convd)
                if op.actd != NULL:
                    op.dnn.act_destroy(op.actd)
            free(op)
        self._ops = []
        for addr in self._ctxs:
            c = <SCtx*><uintptr_t>addr
            if c.dnnh != NULL and self._dnn != NULL:
                self._dnn.destroy(c.dnnh)
            free(c)
        self._ctxs = []
        if self._lt != NULL and self._lt.handle != NULL:
            self._lt.destroy(self._lt.handle)
            self._lt.handle = NULL
