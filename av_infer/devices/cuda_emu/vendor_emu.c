/* Emulated cuBLASLt and cuDNN 9 entry points of the CPU emulator (docs/cuda_emu.md §3).
 *
 * #included at the end of driver.c, so libavi_cuda_emu.so is at once the emulated libcuda,
 * libcublasLt and libcudnn: cython_ext/cuda_vendor.pyx dlopens it in place of the vendor
 * libraries (CudaDevice(emulate=True)) and runs exactly the calls it makes on a GPU. Only
 * the subset the vendor path uses exists, with the real prototypes, enum values and
 * status codes (cuBLASLt 12/13, cuDNN 9):
 *   cublasLtCreate/Destroy/GetVersion, MatmulDesc{Create,Destroy,SetAttribute},
 *   MatrixLayout{Create,Destroy,SetAttribute}, MatmulPreference{Create,Destroy,SetAttribute},
 *   cublasLtMatmulAlgoGetHeuristic, cublasLtMatmul;
 *   cudnnCreate/Destroy/SetStream/GetVersion/GetErrorString, {Create,Set*,Destroy} of
 *   tensor (4-d NCHW), filter, convolution (2-d, group count, math type) and activation
 *   descriptors, cudnnGetConvolutionForwardAlgorithm_v7, ...WorkspaceSize,
 *   cudnnConvolutionBiasActivationForward, cudnnConvolutionForward, cudnnAddTensor.
 * Semantics: the work call validates its arguments at the call (a bad one returns the
 * library's status and enqueues nothing), copies every descriptor value and pointer, and
 * enqueues one host operation on the emulated stream (emu_enqueue_host): it runs in stream
 * order with kernels, and cannot be evicted (it never reads a flag word), like a closed
 * vendor kernel. Maths: straightforward loops, FP32 accumulation in k order. Precision as
 * the library's mode asks: cuBLASLt COMPUTE_32F and cuDNN FMA_MATH exact FP32;
 * COMPUTE_32F_FAST_TF32 / DEFAULT_MATH round both operands to TF32 (10 mantissa bits, ties
 * away, as cvt.rna.tf32.f32); COMPUTE_32F_FAST_16F / TENSOR_OP_MATH_ALLOW_CONVERSION round
 * them to FP16 (ties to even, FP16 range: overflow to inf, subnormals). Epilogues: cuBLASLt
 * D = act(alpha*op(A)op(B) + beta*C + bias), cuDNN y = act(alpha1*conv(x,w) + alpha2*z + bias);
 * cudnnConvolutionForward y = alpha*conv(x,w) + beta*y and cudnnAddTensor C = alpha*A + beta*C
 * (A broadcast over C's dimensions where A's are 1); with beta = 0 the output is not read
 * (cuDNN's scaling-parameter rule: it may hold NaN). Every algorithm computes the same loops:
 * the emulator models which algorithm is chosen and its workspace, not its numerics.
 * Constraints mirrored from the libraries: cuDNN's fused call with the identity activation
 * only with IMPLICIT_PRECOMP_GEMM (else CUDNN_STATUS_NOT_SUPPORTED); float data only; a
 * convolution given less workspace than its algorithm needs fails (BAD_PARAM).
 * Alignment: the cuBLASLt algorithm needs the MIN_ALIGNMENT_*_BYTES the preference promised
 * (256 by default, as the library assumes) and the bias 16 bytes; cuDNN 16 bytes for every
 * operand: a misaligned pointer fails the call (INVALID_VALUE / BAD_PARAM).
 * Heuristics: cuBLASLt returns one algorithm (workspace 0). cuDNN lists deterministic
 * algorithms with the descriptor's math type, in an order that depends on the shape, so
 * that the first is not always IMPLICIT_PRECOMP_GEMM (as on a GPU): 3x3 stride 1 dilation 1
 * ungrouped: WINOGRAD_NONFUSED, IMPLICIT_PRECOMP_GEMM, IMPLICIT_GEMM, GEMM; 1x1 stride 1
 * unpadded: IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM, GEMM; others: IMPLICIT_PRECOMP_GEMM,
 * IMPLICIT_GEMM, GEMM. Workspace: WINOGRAD_NONFUSED 4*16*(tiles*(C+K) + C*K) bytes with
 * tiles = N*ceil(Ho/2)*ceil(Wo/2) (F(2x2,3x3) transforms), GEMM 4*N*C*KH*KW*Ho*Wo (im2col),
 * the implicit GEMMs 0.
 */
#include <math.h>

typedef int cublasStatus_t;
typedef int cudnnStatus_t;
enum {
    CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1, CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum {
    CUDNN_STATUS_SUCCESS = 0, CUDNN_STATUS_NOT_INITIALIZED = 1001,
    CUDNN_STATUS_BAD_PARAM = 2000, CUDNN_STATUS_NOT_SUPPORTED = 3000,
    CUDNN_STATUS_INTERNAL_ERROR = 4000, CUDNN_STATUS_EXECUTION_FAILED = 5000,
    CUDNN_STATUS_ALLOC_FAILED = 4003,
};
enum { VE_FP32 = 0, VE_TF32 = 1, VE_FP16 = 2 };

#define MAGIC_LT 0x4c54484eU   /* 'LTHN' */
#define MAGIC_DNN 0x444e4e48U  /* 'DNNH' */

/* executed vendor operations (matmul, conv): tests check what ran where */
static _Atomic uint64_t g_vendor_runs[2];
EXPORT void avi_emu_vendor_runs(uint64_t out[2]) {
    out[0] = atomic_load(&g_vendor_runs[0]);
    out[1] = atomic_load(&g_vendor_runs[1]);
}
/* executed calls by entry point: cublasLtMatmul, cudnnConvolutionBiasActivationForward,
 * cudnnConvolutionForward, cudnnAddTensor (a conv counts once in avi_emu_vendor_runs
 * whichever call ran it) */
static _Atomic uint64_t g_vendor_calls[4];
EXPORT void avi_emu_vendor_calls(uint64_t out[4]) {
    for (int i = 0; i < 4; ++i) out[i] = atomic_load(&g_vendor_calls[i]);
}

/* avi_emu_vendor_capture_fail_nth(n): only the n-th vendor work call (cublasLtMatmul,
 * cudnnConvolutionBiasActivationForward, cudnnConvolutionForward, cudnnAddTensor) issued
 * on a capturing stream from now fails with the library's EXECUTION_FAILED status (13 /
 * 5000) after validating its arguments, enqueuing nothing: a library that cannot be
 * captured, as a GPU session may meet. Calls on streams that are not capturing neither
 * fail nor count. 0 = off. */
static atomic_int g_vendor_capfail_nth;
EXPORT void avi_emu_vendor_capture_fail_nth(int n) { atomic_store(&g_vendor_capfail_nth, n); }
static int ve_capture_fails(CUstream h, const char* call) {
    if (atomic_load(&g_vendor_capfail_nth) <= 0) return 0;
    struct emu_stream* s = resolve(h);
    if (!s) return 0;
    pthread_mutex_lock(&s->mu);
    int capturing = s->capture != NULL;
    pthread_mutex_unlock(&s->mu);
    if (!capturing || atomic_fetch_sub(&g_vendor_capfail_nth, 1) != 1) return 0;
    set_error("%s: failed under capture (avi_emu_vendor_capture_fail_nth)", call);
    return 1;
}

/* -- rounding ------------------------------------------------------------------------ */
static float ve_round(float x, int mode) {
    if (mode == VE_FP32 || !isfinite(x) || x == 0.0f) return x;
    float a = fabsf(x), r;
    int e;
    if (mode == VE_FP16) {
        if (a >= 65520.0f) return copysignf(INFINITY, x);
        if (a < 6.103515625e-05f) {                       /* 2^-14: subnormal, step 2^-24 */
            r = nearbyintf(a * 16777216.0f) / 16777216.0f;
        } else {
            frexpf(a, &e);                                /* a in [2^(e-1), 2^e) */
            float q = ldexpf(1.0f, e - 11);
            r = nearbyintf(a / q) * q;                    /* ties to even */
        }
    } else {                                              /* TF32: 10 bits, ties away */
        frexpf(a, &e);
        float q = ldexpf(1.0f, e - 11);
        r = roundf(a / q) * q;
    }
    return copysignf(r, x);
}

/* ================================ cuBLASLt ========================================= */
struct lt_handle { uint32_t magic; };
struct lt_desc {
    int compute, scale, transa, transb, epilogue;
    const float* bias;
};
struct lt_layout {
    int type, order;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
};
struct lt_pref { uint64_t max_ws; uint32_t reduction_mask; uint32_t align[4]; };

EXPORT cublasStatus_t cublasLtCreate(void** h) {
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    struct lt_handle* p = calloc(1, sizeof *p);
    if (!p) return CUBLAS_STATUS_ALLOC_FAILED;
    p->magic = MAGIC_LT;
    *h = p;
    return CUBLAS_STATUS_SUCCESS;
}
EXPORT cublasStatus_t cublasLtDestroy(void* h) {
    struct lt_handle* p = h;
    if (!p || p->magic != MAGIC_LT) return CUBLAS_STATUS_NOT_INITIALIZED;
    p->magic = 0;
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}
EXPORT size_t cublasLtGetVersion(void) { return 130000; }

EXPORT cublasStatus_t cublasLtMatmulDescCreate(void** d, int compute, int scale) {
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    if (compute != 68 && compute != 74 && compute != 77) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (scale != 0) return CUBLAS_STATUS_NOT_SUPPORTED;       /* CUDA_R_32F only */
    struct lt_desc* p = calloc(1, sizeof *p);
    if (!p) return CUBLAS_STATUS_ALLOC_FAILED;
    p->compute = compute;
    p->scale = scale;
    p->epilogue = 1;
    *d = p;
    return CUBLAS_STATUS_SUCCESS;
}
EXPORT cublasStatus_t cublasLtMatmulDescDestroy(void* d) { free(d); return CUBLAS_STATUS_SUCCESS; }

EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(void* dv, int attr, const void* buf,
                                                     size_t n) {
    struct lt_desc* d = dv;
    if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
        case 3: case 4: case 7:                                /* TRANSA, TRANSB, EPILOGUE */
            if (n != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
            {
                int v = *(const int32_t*)buf;
                if (attr == 3) d->transa = v;
                else if (attr == 4) d->transb = v;
                else d->epilogue = v;
            }
            return CUBLAS_STATUS_SUCCESS;
        case 8:                                                /* BIAS_POINTER */
            if (n != sizeof(void*)) return CUBLAS_STATUS_INVALID_VALUE;
            d->bias = *(const float* const*)buf;
            return CUBLAS_STATUS_SUCCESS;
        default:
            return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(void** l, int type, uint64_t rows,
                                                 uint64_t cols, int64_t ld) {
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    if (type != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (ld < (int64_t)rows) return CUBLAS_STATUS_INVALID_VALUE;  /* column-major */
    struct lt_layout* p = calloc(1, sizeof *p);
    if (!p) return CUBLAS_STATUS_ALLOC_FAILED;
    p->type = type;
    p->rows = rows;
    p->cols = cols;
    p->ld = ld;
    p->batch = 1;
    *l = p;
    return CUBLAS_STATUS_SUCCESS;
}
EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(void* l) { free(l); return CUBLAS_STATUS_SUCCESS; }

EXPORT cublasStatus_t cublasLtMatrixLayoutSetAttribute(void* lv, int attr, const void* buf,
                                                       size_t n) {
    struct lt_layout* l = lv;
    if (!l || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == 5 && n == 4) { l->batch = *(const int32_t*)buf; return CUBLAS_STATUS_SUCCESS; }
    if (attr == 6 && n == 8) { l->stride = *(const int64_t*)buf; return CUBLAS_STATUS_SUCCESS; }
    if (attr == 1 && n == 4) {
        l->order = *(const int32_t*)buf;
        return l->order == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceCreate(void** p) {
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    *p = calloc(1, sizeof(struct lt_pref));
    return *p ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}
EXPORT cublasStatus_t cublasLtMatmulPreferenceDestroy(void* p) { free(p); return CUBLAS_STATUS_SUCCESS; }
EXPORT cublasStatus_t cublasLtMatmulPreferenceSetAttribute(void* pv, int attr, const void* buf,
                                                           size_t n) {
    struct lt_pref* p = pv;
    if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == 1 && n == 8) { p->max_ws = *(const uint64_t*)buf; return CUBLAS_STATUS_SUCCESS; }
    if (attr == 3 && n == 4) { p->reduction_mask = *(const uint32_t*)buf; return CUBLAS_STATUS_SUCCESS; }
    if (attr >= 5 && attr <= 8 && n == 4) {             /* MIN_ALIGNMENT_{A,B,C,D}_BYTES */
        uint32_t a = *(const uint32_t*)buf;
        if (a == 0 || (a & (a - 1))) return CUBLAS_STATUS_INVALID_VALUE;
        p->align[attr - 5] = a;
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

/* op(X) of a layout: (rows, cols) after the transpose flag */
static void lt_opdims(const struct lt_layout* l, int trans, uint64_t* r, uint64_t* c) {
    *r = trans ? l->cols : l->rows;
    *c = trans ? l->rows : l->cols;
}

static cublasStatus_t lt_check(const struct lt_desc* d, const struct lt_layout* a,
                               const struct lt_layout* b, const struct lt_layout* c,
                               const struct lt_layout* D) {
    uint64_t ar, ac, br, bc;
    if (!d || !a || !b || !c || !D) return CUBLAS_STATUS_INVALID_VALUE;
    lt_opdims(a, d->transa, &ar, &ac);
    lt_opdims(b, d->transb, &br, &bc);
    if (ac != br || ar != D->rows || bc != D->cols || c->rows != D->rows || c->cols != D->cols)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (a->batch != D->batch || b->batch != D->batch || c->batch != D->batch)
        return CUBLAS_STATUS_INVALID_VALUE;
    int e = d->epilogue;
    if (e != 1 && e != 2 && e != 4 && e != 6) return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

/* cublasLtMatmulHeuristicResult_t: algo (64 B), workspaceSize, state, wavesCount, reserved */
struct lt_heur { uint64_t algo[8]; size_t ws; int state; float waves; int reserved[4]; };

EXPORT cublasStatus_t cublasLtMatmulAlgoGetHeuristic(void* h, void* dv, void* a, void* b,
                                                     void* c, void* D, void* pref, int want,
                                                     void* out, int* got) {
    struct lt_handle* hp = h;
    if (!hp || hp->magic != MAGIC_LT) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!out || !got || want < 1 || !pref) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = lt_check(dv, a, b, c, D);
    if (st) return st;
    struct lt_heur* r = out;
    struct lt_pref* pr = pref;
    memset(r, 0, sizeof *r);
    r->algo[0] = 0x415649454d55ULL;   /* "AVIEMU": the one emulated algorithm */
    /* like the library's kernels, it needs the alignment the preference promised
     * (default 256 bytes): cublasLtMatmul checks the pointers against it */
    for (int i = 0; i < 4; ++i) r->algo[1 + i] = pr->align[i] ? pr->align[i] : 256;
    r->waves = 1.0f;
    *got = 1;
    return CUBLAS_STATUS_SUCCESS;
}

struct lt_work {
    struct lt_desc d;
    struct lt_layout a, b, c, D;
    float alpha, beta;
    const float *A, *B, *C;
    float* Dp;
};

static float lt_at(const float* base, const struct lt_layout* l, int trans, int64_t batch,
                   uint64_t i, uint64_t j, int mode) {
    /* element (i, j) of op(X) for one batch entry; X column-major with ld */
    uint64_t r = trans ? j : i, c = trans ? i : j;
    return ve_round(base[batch * l->stride + (int64_t)(r + c * (uint64_t)l->ld)], mode);
}

static int lt_run(void* data, int run) {
    struct lt_work* w = data;
    if (run & 1) {
        atomic_fetch_add(&g_vendor_runs[0], 1);
        atomic_fetch_add(&g_vendor_calls[0], 1);
        int mode = w->d.compute == 77 ? VE_TF32 : w->d.compute == 74 ? VE_FP16 : VE_FP32;
        uint64_t M = w->D.rows, N = w->D.cols, K;
        uint64_t ar, ac;
        lt_opdims(&w->a, w->d.transa, &ar, &ac);
        K = ac;
        int bias = w->d.epilogue == 4 || w->d.epilogue == 6;
        int relu = w->d.epilogue == 2 || w->d.epilogue == 6;
        for (int64_t bt = 0; bt < w->D.batch; ++bt) {
            for (uint64_t j = 0; j < N; ++j) {
                for (uint64_t i = 0; i < M; ++i) {
                    float acc = 0.0f;
                    for (uint64_t k = 0; k < K; ++k)
                        acc = fmaf(lt_at(w->A, &w->a, w->d.transa, bt, i, k, mode),
                                   lt_at(w->B, &w->b, w->d.transb, bt, k, j, mode), acc);
                    float v = w->alpha * acc;
                    if (w->beta != 0.0f)
                        v += w->beta * w->C[bt * w->c.stride + (int64_t)(i + j * w->c.ld)];
                    if (bias) v += w->d.bias[i];
                    if (relu && !(v >= 0.0f)) v = isnan(v) ? v : 0.0f;
                    w->Dp[bt * w->D.stride + (int64_t)(i + j * w->D.ld)] = v;
                }
            }
        }
    }
    if (!(run & 2)) free(w);  /* mode 3: a graph node runs it again */
    return 0;
}

EXPORT cublasStatus_t cublasLtMatmul(void* h, void* dv, const void* alpha, const void* A,
                                     void* adesc, const void* B, void* bdesc, const void* beta,
                                     const void* C, void* cdesc, void* D, void* ddesc,
                                     const void* algo, void* ws, size_t ws_bytes, void* stream) {
    struct lt_handle* hp = h;
    (void)ws;
    (void)ws_bytes;
    if (!hp || hp->magic != MAGIC_LT) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!alpha || !beta || !A || !B || !D || !algo) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = lt_check(dv, adesc, bdesc, cdesc, ddesc);
    if (st) return st;
    struct lt_work* w = calloc(1, sizeof *w);
    if (!w) return CUBLAS_STATUS_ALLOC_FAILED;
    w->d = *(struct lt_desc*)dv;
    w->a = *(struct lt_layout*)adesc;
    w->b = *(struct lt_layout*)bdesc;
    w->c = *(struct lt_layout*)cdesc;
    w->D = *(struct lt_layout*)ddesc;
    w->alpha = *(const float*)alpha;
    w->beta = *(const float*)beta;
    w->A = A;
    w->B = B;
    w->C = C;
    w->Dp = D;
    if ((w->d.epilogue == 4 || w->d.epilogue == 6) && !w->d.bias) {
        free(w);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (w->beta != 0.0f && !C) {
        free(w);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const uint64_t* al = algo;
    const struct lt_layout* L[4] = {&w->a, &w->b, &w->c, &w->D};
    const void* P[4] = {A, B, w->beta != 0.0f ? C : NULL, D};
    for (int i = 0; i < 4; ++i) {
        uint64_t need = al[1 + i] ? al[1 + i] : 256;
        uint64_t addr = (uint64_t)(uintptr_t)P[i];
        if (!P[i]) continue;
        if (addr % need || (L[i]->batch > 1 && ((uint64_t)L[i]->stride * 4) % need)) {
            free(w);
            return CUBLAS_STATUS_INVALID_VALUE;  /* misaligned for the chosen algorithm */
        }
    }
    if ((w->d.epilogue == 4 || w->d.epilogue == 6) && ((uintptr_t)w->d.bias % 16)) {
        free(w);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (ve_capture_fails((CUstream)stream, "cublasLtMatmul") ||
        emu_enqueue_host_r((CUstream)stream, lt_run, w, 1) != CUDA_SUCCESS) {
        free(w);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ================================== cuDNN ========================================== */
struct dnn_handle { uint32_t magic; CUstream stream; };
struct dnn_tensor { int set, format, dtype, n, c, h, w; };
struct dnn_filter { int set, dtype, format, k, c, h, w; };
struct dnn_conv { int set, ph, pw, u, v, dh, dw, mode, ctype, groups, math; };
struct dnn_act { int set, mode, nan; double coef; };

EXPORT cudnnStatus_t cudnnCreate(void** h) {
    if (!h) return CUDNN_STATUS_BAD_PARAM;
    struct dnn_handle* p = calloc(1, sizeof *p);
    if (!p) return CUDNN_STATUS_ALLOC_FAILED;
    p->magic = MAGIC_DNN;
    *h = p;
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnDestroy(void* h) {
    struct dnn_handle* p = h;
    if (!p || p->magic != MAGIC_DNN) return CUDNN_STATUS_BAD_PARAM;
    p->magic = 0;
    free(p);
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnSetStream(void* h, void* stream) {
    struct dnn_handle* p = h;
    if (!p || p->magic != MAGIC_DNN) return CUDNN_STATUS_BAD_PARAM;
    p->stream = stream;
    return CUDNN_STATUS_SUCCESS;
}
EXPORT size_t cudnnGetVersion(void) { return 90000; }
EXPORT const char* cudnnGetErrorString(cudnnStatus_t s) {
    switch (s) {
        case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
        case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
        case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
        case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
        case CUDNN_STATUS_ALLOC_FAILED: return "CUDNN_STATUS_ALLOC_FAILED";
        case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
        default: return "CUDNN_STATUS_INTERNAL_ERROR";
    }
}

#define DNN_CREATE(NAME, T)                                                             \
    EXPORT cudnnStatus_t NAME(void** d) {                                               \
        if (!d) return CUDNN_STATUS_BAD_PARAM;                                          \
        *d = calloc(1, sizeof(T));                                                      \
        return *d ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;                   \
    }
#define DNN_DESTROY(NAME)                                                               \
    EXPORT cudnnStatus_t NAME(void* d) { free(d); return CUDNN_STATUS_SUCCESS; }
DNN_CREATE(cudnnCreateTensorDescriptor, struct dnn_tensor)
DNN_DESTROY(cudnnDestroyTensorDescriptor)
DNN_CREATE(cudnnCreateFilterDescriptor, struct dnn_filter)
DNN_DESTROY(cudnnDestroyFilterDescriptor)
DNN_CREATE(cudnnCreateConvolutionDescriptor, struct dnn_conv)
DNN_DESTROY(cudnnDestroyConvolutionDescriptor)
DNN_CREATE(cudnnCreateActivationDescriptor, struct dnn_act)
DNN_DESTROY(cudnnDestroyActivationDescriptor)

EXPORT cudnnStatus_t cudnnSetTensor4dDescriptor(void* dv, int format, int dtype, int n, int c,
                                                int h, int w) {
    struct dnn_tensor* d = dv;
    if (!d || n < 1 || c < 1 || h < 1 || w < 1) return CUDNN_STATUS_BAD_PARAM;
    if (format != 0 || dtype != 0) return CUDNN_STATUS_NOT_SUPPORTED;  /* NCHW float */
    *d = (struct dnn_tensor){1, format, dtype, n, c, h, w};
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnSetFilter4dDescriptor(void* dv, int dtype, int format, int k, int c,
                                                int h, int w) {
    struct dnn_filter* d = dv;
    if (!d || k < 1 || c < 1 || h < 1 || w < 1) return CUDNN_STATUS_BAD_PARAM;
    if (format != 0 || dtype != 0) return CUDNN_STATUS_NOT_SUPPORTED;
    *d = (struct dnn_filter){1, dtype, format, k, c, h, w};
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnSetConvolution2dDescriptor(void* dv, int ph, int pw, int u, int v,
                                                     int dh, int dw, int mode, int ctype) {
    struct dnn_conv* d = dv;
    if (!d || ph < 0 || pw < 0 || u < 1 || v < 1 || dh < 1 || dw < 1) return CUDNN_STATUS_BAD_PARAM;
    if (mode != 1 || ctype != 0) return CUDNN_STATUS_NOT_SUPPORTED;  /* cross-corr., float */
    int g = d->groups ? d->groups : 1, m = d->math;
    *d = (struct dnn_conv){1, ph, pw, u, v, dh, dw, mode, ctype, g, m};
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnSetConvolutionGroupCount(void* dv, int g) {
    struct dnn_conv* d = dv;
    if (!d || g < 1) return CUDNN_STATUS_BAD_PARAM;
    d->groups = g;
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnSetConvolutionMathType(void* dv, int m) {
    struct dnn_conv* d = dv;
    if (!d || m < 0 || m > 3) return CUDNN_STATUS_BAD_PARAM;
    d->math = m;
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnSetActivationDescriptor(void* dv, int mode, int nan, double coef) {
    struct dnn_act* d = dv;
    if (!d) return CUDNN_STATUS_BAD_PARAM;
    if (mode != 1 && mode != 5) return CUDNN_STATUS_NOT_SUPPORTED;  /* RELU, IDENTITY */
    *d = (struct dnn_act){1, mode, nan, coef};
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t dnn_check(const struct dnn_tensor* x, const struct dnn_filter* w,
                               const struct dnn_conv* cv, const struct dnn_tensor* y) {
    if (!x || !w || !cv || !y || !x->set || !w->set || !cv->set || !y->set)
        return CUDNN_STATUS_BAD_PARAM;
    if (x->c != w->c * cv->groups || w->k % cv->groups || y->c != w->k || y->n != x->n)
        return CUDNN_STATUS_BAD_PARAM;
    int ho = (x->h + 2 * cv->ph - cv->dh * (w->h - 1) - 1) / cv->u + 1;
    int wo = (x->w + 2 * cv->pw - cv->dw * (w->w - 1) - 1) / cv->v + 1;
    if (ho != y->h || wo != y->w) return CUDNN_STATUS_BAD_PARAM;
    return CUDNN_STATUS_SUCCESS;
}

/* the emulated heuristics' order for a shape (see the header); returns the count */
enum { ALGO_IMPLICIT_GEMM = 0, ALGO_PRECOMP = 1, ALGO_GEMM = 2, ALGO_WINOGRAD_NONFUSED = 7 };
static int dnn_winograd_ok(const struct dnn_filter* w, const struct dnn_conv* cv) {
    return w->h == 3 && w->w == 3 && cv->u == 1 && cv->v == 1 && cv->dh == 1 && cv->dw == 1 &&
           cv->groups == 1;
}
static int dnn_algos(const struct dnn_tensor* x, const struct dnn_filter* w,
                     const struct dnn_conv* cv, int out[4]) {
    (void)x;
    if (dnn_winograd_ok(w, cv)) {
        out[0] = ALGO_WINOGRAD_NONFUSED; out[1] = ALGO_PRECOMP;
        out[2] = ALGO_IMPLICIT_GEMM; out[3] = ALGO_GEMM;
        return 4;
    }
    if (w->h == 1 && w->w == 1 && cv->u == 1 && cv->v == 1 && cv->ph == 0 && cv->pw == 0) {
        out[0] = ALGO_IMPLICIT_GEMM; out[1] = ALGO_PRECOMP; out[2] = ALGO_GEMM;
        return 3;
    }
    out[0] = ALGO_PRECOMP; out[1] = ALGO_IMPLICIT_GEMM; out[2] = ALGO_GEMM;
    return 3;
}
/* 1 if the emulated library has ALGO for this convolution */
static int dnn_algo_ok(const struct dnn_filter* w, const struct dnn_conv* cv, int algo) {
    return (algo >= 0 && algo <= 2) || (algo == ALGO_WINOGRAD_NONFUSED && dnn_winograd_ok(w, cv));
}
static size_t dnn_ws(const struct dnn_tensor* x, const struct dnn_filter* w,
                     const struct dnn_tensor* y, int algo) {
    if (algo == ALGO_WINOGRAD_NONFUSED) {
        size_t tiles = (size_t)x->n * ((y->h + 1) / 2) * ((y->w + 1) / 2);
        return 4u * 16u * (tiles * ((size_t)x->c + w->k) + (size_t)x->c * w->k);
    }
    if (algo == ALGO_GEMM) return 4u * (size_t)x->n * x->c * w->h * w->w * y->h * y->w;
    return 0;
}

/* cudnnConvolutionFwdAlgoPerf_t */
struct dnn_perf { int algo, status; float time; size_t memory; int determinism, math, reserved[3]; };

EXPORT cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(void* h, void* x, void* w, void* cv,
                                                            void* y, int want, int* got,
                                                            struct dnn_perf* out) {
    struct dnn_handle* hp = h;
    if (!hp || hp->magic != MAGIC_DNN) return CUDNN_STATUS_BAD_PARAM;
    if (!got || !out || want < 1) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = dnn_check(x, w, cv, y);
    if (st) return st;
    int algos[4], na = dnn_algos(x, w, cv, algos);
    int n = want < na ? want : na;
    for (int i = 0; i < n; ++i) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].algo = algos[i];
        out[i].memory = dnn_ws(x, w, y, algos[i]);
        out[i].determinism = 1;
        out[i].math = ((struct dnn_conv*)cv)->math;
    }
    *got = n;
    return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(void* h, void* x, void* w, void* cv,
                                                             void* y, int algo, size_t* ws) {
    struct dnn_handle* hp = h;
    if (!hp || hp->magic != MAGIC_DNN || !ws) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = dnn_check(x, w, cv, y);
    if (st) return st;
    if (!dnn_algo_ok(w, cv, algo)) return CUDNN_STATUS_NOT_SUPPORTED;
    *ws = dnn_ws(x, w, y, algo);
    return CUDNN_STATUS_SUCCESS;
}

struct dnn_work {
    struct dnn_tensor x, y;
    struct dnn_filter w;
    struct dnn_conv cv;
    int fused;               /* 1: cudnnConvolutionBiasActivationForward, 0: ...Forward */
    int relu;
    float alpha1, alpha2;    /* fused: alpha1, alpha2; plain: alpha, beta */
    const float *X, *W, *Z, *B;
    float* Y;
};

static int dnn_run(void* data, int run) {
    struct dnn_work* k = data;
    if (run & 1) {
        atomic_fetch_add(&g_vendor_runs[1], 1);
        atomic_fetch_add(&g_vendor_calls[k->fused ? 1 : 2], 1);
        int mode = k->cv.math == 3 ? VE_FP32 : k->cv.math == 2 ? VE_FP16 : VE_TF32;
        int G = k->cv.groups, cg = k->w.c, coutg = k->w.k / G;
        int H = k->x.h, Wd = k->x.w, Ho = k->y.h, Wo = k->y.w, KH = k->w.h, KW = k->w.w;
        for (int n = 0; n < k->x.n; ++n)
            for (int oc = 0; oc < k->w.k; ++oc) {
                int g = oc / coutg;
                for (int oy = 0; oy < Ho; ++oy)
                    for (int ox = 0; ox < Wo; ++ox) {
                        float acc = 0.0f;
                        for (int ic = 0; ic < cg; ++ic) {
                            const float* xp = k->X + ((int64_t)n * k->x.c + g * cg + ic) * H * Wd;
                            const float* wp = k->W + ((int64_t)oc * cg + ic) * KH * KW;
                            for (int ky = 0; ky < KH; ++ky) {
                                int iy = oy * k->cv.u - k->cv.ph + ky * k->cv.dh;
                                if (iy < 0 || iy >= H) continue;
                                for (int kx = 0; kx < KW; ++kx) {
                                    int ix = ox * k->cv.v - k->cv.pw + kx * k->cv.dw;
                                    if (ix < 0 || ix >= Wd) continue;
                                    acc = fmaf(ve_round(xp[(int64_t)iy * Wd + ix], mode),
                                               ve_round(wp[ky * KW + kx], mode), acc);
                                }
                            }
                        }
                        int64_t yi = (((int64_t)n * k->w.k + oc) * Ho + oy) * Wo + ox;
                        float v = k->alpha1 * acc;
                        if (!k->fused) {             /* y = alpha*conv + beta*y */
                            if (k->alpha2 != 0.0f) v += k->alpha2 * k->Y[yi];
                            k->Y[yi] = v;
                            continue;
                        }
                        if (k->alpha2 != 0.0f) v += k->alpha2 * k->Z[yi];
                        v += k->B[oc];
                        if (k->relu && !(v >= 0.0f)) v = isnan(v) ? v : 0.0f;
                        k->Y[yi] = v;
                    }
            }
    }
    if (!(run & 2)) free(k);  /* mode 3: a graph node runs it again */
    return 0;
}

/* the checks both convolution calls make; 0 or the library's status */
static cudnnStatus_t dnn_conv_args(void* h, void* xd, const void* x, void* wd, const void* w,
                                   void* cvd, int algo, const void* ws, size_t ws_bytes,
                                   void* yd, const void* y) {
    struct dnn_handle* hp = h;
    if (!hp || hp->magic != MAGIC_DNN || !x || !w || !y) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = dnn_check(xd, wd, cvd, yd);
    if (st) return st;
    if (!dnn_algo_ok(wd, cvd, algo)) return CUDNN_STATUS_NOT_SUPPORTED;
    size_t need = dnn_ws(xd, wd, yd, algo);
    if (need && (!ws || ws_bytes < need)) return CUDNN_STATUS_BAD_PARAM;  /* too little */
    return CUDNN_STATUS_SUCCESS;
}

static struct dnn_work* dnn_work_new(void* xd, const void* x, void* wd, const void* w, void* cvd,
                                     void* yd, void* y) {
    struct dnn_work* k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->x = *(struct dnn_tensor*)xd;
    k->y = *(struct dnn_tensor*)yd;
    k->w = *(struct dnn_filter*)wd;
    k->cv = *(struct dnn_conv*)cvd;
    k->X = x;
    k->W = w;
    k->Y = y;
    return k;
}

EXPORT cudnnStatus_t cudnnConvolutionBiasActivationForward(
    void* h, const void* alpha1, void* xd, const void* x, void* wd, const void* w, void* cvd,
    int algo, void* ws, size_t ws_bytes, const void* alpha2, void* zd, const void* z, void* bd,
    const void* bias, void* actd, void* yd, void* y) {
    struct dnn_handle* hp = h;
    struct dnn_act* act = actd;
    struct dnn_tensor* b = bd;
    if (!alpha1 || !alpha2 || !bias || !act || !act->set || !b || !b->set)
        return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = dnn_conv_args(h, xd, x, wd, w, cvd, algo, ws, ws_bytes, yd, y);
    if (st) return st;
    struct dnn_tensor* zt = zd;
    struct dnn_tensor* yt = yd;
    if (!zt || zt->n != yt->n || zt->c != yt->c || zt->h != yt->h || zt->w != yt->w)
        return CUDNN_STATUS_BAD_PARAM;
    if (b->n != 1 || b->c != yt->c || b->h != 1 || b->w != 1) return CUDNN_STATUS_BAD_PARAM;
    if (act->mode == 5 && algo != ALGO_PRECOMP) return CUDNN_STATUS_NOT_SUPPORTED;  /* as the library */
    /* 16-byte aligned operands (the floor the vendor path promises cuDNN) */
    const void* ptrs[5] = {x, w, y, bias, z};
    for (int i = 0; i < 5; ++i)
        if (ptrs[i] && ((uintptr_t)ptrs[i] % 16)) return CUDNN_STATUS_BAD_PARAM;
    if (*(const float*)alpha2 != 0.0f && !z) return CUDNN_STATUS_BAD_PARAM;
    struct dnn_work* k = dnn_work_new(xd, x, wd, w, cvd, yd, y);
    if (!k) return CUDNN_STATUS_ALLOC_FAILED;
    k->fused = 1;
    k->relu = act->mode == 1;
    k->alpha1 = *(const float*)alpha1;
    k->alpha2 = *(const float*)alpha2;
    k->Z = z;
    k->B = bias;
    if (ve_capture_fails(hp->stream, "cudnnConvolutionBiasActivationForward") ||
        emu_enqueue_host_r(hp->stream, dnn_run, k, 1) != CUDA_SUCCESS) {
        free(k);
        return CUDNN_STATUS_EXECUTION_FAILED;
    }
    return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnConvolutionForward(void* h, const void* alpha, void* xd, const void* x,
                                             void* wd, const void* w, void* cvd, int algo,
                                             void* ws, size_t ws_bytes, const void* beta,
                                             void* yd, void* y) {
    struct dnn_handle* hp = h;
    if (!alpha || !beta) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = dnn_conv_args(h, xd, x, wd, w, cvd, algo, ws, ws_bytes, yd, y);
    if (st) return st;
    const void* ptrs[3] = {x, w, y};
    for (int i = 0; i < 3; ++i)
        if ((uintptr_t)ptrs[i] % 16) return CUDNN_STATUS_BAD_PARAM;
    struct dnn_work* k = dnn_work_new(xd, x, wd, w, cvd, yd, y);
    if (!k) return CUDNN_STATUS_ALLOC_FAILED;
    k->alpha1 = *(const float*)alpha;
    k->alpha2 = *(const float*)beta;
    if (ve_capture_fails(hp->stream, "cudnnConvolutionForward") ||
        emu_enqueue_host_r(hp->stream, dnn_run, k, 1) != CUDA_SUCCESS) {
        free(k);
        return CUDNN_STATUS_EXECUTION_FAILED;
    }
    return CUDNN_STATUS_SUCCESS;
}

struct dnn_add_work {
    struct dnn_tensor a, c;
    float alpha, beta;
    const float* A;
    float* C;
};

static int dnn_add_run(void* data, int run) {
    struct dnn_add_work* k = data;
    if (run & 1) {
        atomic_fetch_add(&g_vendor_calls[3], 1);
        const struct dnn_tensor *a = &k->a, *c = &k->c;
        for (int n = 0; n < c->n; ++n)
            for (int ch = 0; ch < c->c; ++ch)
                for (int y = 0; y < c->h; ++y)
                    for (int x = 0; x < c->w; ++x) {
                        int64_t ai = (((int64_t)(a->n == 1 ? 0 : n) * a->c +
                                       (a->c == 1 ? 0 : ch)) * a->h + (a->h == 1 ? 0 : y)) *
                                         a->w + (a->w == 1 ? 0 : x);
                        int64_t ci = (((int64_t)n * c->c + ch) * c->h + y) * c->w + x;
                        float v = k->alpha * k->A[ai];
                        if (k->beta != 0.0f) v += k->beta * k->C[ci];  /* beta 0: C not read */
                        k->C[ci] = v;
                    }
    }
    if (!(run & 2)) free(k);  /* mode 3: a graph node runs it again */
    return 0;
}

EXPORT cudnnStatus_t cudnnAddTensor(void* h, const void* alpha, void* ad, const void* A,
                                    const void* beta, void* cd, void* C) {
    struct dnn_handle* hp = h;
    struct dnn_tensor *a = ad, *c = cd;
    if (!hp || hp->magic != MAGIC_DNN || !alpha || !beta || !A || !C) return CUDNN_STATUS_BAD_PARAM;
    if (!a || !c || !a->set || !c->set) return CUDNN_STATUS_BAD_PARAM;
    /* each dimension of A equals C's or is 1 (broadcast) */
    if ((a->n != c->n && a->n != 1) || (a->c != c->c && a->c != 1) ||
        (a->h != c->h && a->h != 1) || (a->w != c->w && a->w != 1))
        return CUDNN_STATUS_BAD_PARAM;
    struct dnn_add_work* k = calloc(1, sizeof *k);
    if (!k) return CUDNN_STATUS_ALLOC_FAILED;
    k->a = *a;
    k->c = *c;
    k->alpha = *(const float*)alpha;
    k->beta = *(const float*)beta;
    k->A = A;
    k->C = C;
    if (ve_capture_fails(hp->stream, "cudnnAddTensor") ||
        emu_enqueue_host_r(hp->stream, dnn_add_run, k, 1) != CUDA_SUCCESS) {
        free(k);
        return CUDNN_STATUS_EXECUTION_FAILED;
    }
    return CUDNN_STATUS_SUCCESS;
}
