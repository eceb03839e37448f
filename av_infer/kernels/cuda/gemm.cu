// Tiled matrix kernels: gemm (batched, broadcast, strided operands), conv and
// conv_transpose as implicit GEMM, and the direct depthwise conv.
//
// Tiling (mm_body): one logical block = one 64x64 tile of C = A(MxK) @ B(KxN) for one
// batch entry (gemm) or one (image, group) (conv); 256 threads; K consumed in 16-deep
// slabs through double-buffered shared memory with a register prefetch of the next slab.
// FP32 path: every thread owns a 4x4 register block (rows ty + 16i, cols tx + 16j).
// TF32 path (option, default off): 8 warps as 2x4, each a 32x16 sub-tile of
// mma.sync.m16n8k8 TF32 tensor-core ops with FP32 accumulation.
// Operand element (m, k) / (k, n) comes from a loader per MODE, so im2col is never
// materialised. The epilogue (alpha, bias*beta, generated residual/activation steps)
// runs on the accumulator before the single store, like kernels/cpu.py.
#pragma once

#define MM_TILE 64
#define MM_KS 16
#define MM_PAD 4

enum { MM_GEMM = 0, MM_CONV = 1, MM_CONVT = 2 };

// The tiles live at file scope, not inside mm_body: a function-scope __shared__ array is
// one allocation per template instantiation, and they add up in a kernel that calls
// several bodies (the DKP dispatcher kernel, padding.py); file-scope ones are shared by
// every body of a kernel (a block runs exactly one body).
__shared__ float mm_As[2][MM_KS][MM_TILE + MM_PAD];
__shared__ float mm_Bs[2][MM_KS][MM_TILE + MM_PAD];

struct MmCtx {
    const float* A;  // gemm: batch-offset A; conv: the weights of group g
    const float* B;  // gemm: batch-offset B; conv: image nb, first channel of group g
    i64 row0;        // output row (channel) of m = 0: y index = (row0 + m) * N + n
    i64 g;
};

template <int MODE>
__device__ __forceinline__ float mm_load_a(const MmArgs& a, const MmCtx& c, i64 m, i64 k) {
    if (m >= a.M || k >= a.K) return 0.f;
    if (MODE == MM_GEMM) return c.A[m * a.sam + k * a.sak];
    if (MODE == MM_CONV) return c.A[m * a.K + k];
    // conv_transpose weights (Cin, coutg, kh, kw): k = (ci, r, s), m = output channel
    const i64 khw = a.kh * a.kw;
    const i64 ci = k / khw, rs = k - ci * khw;
    return c.A[(ci * a.coutg + m) * khw + rs];
}

template <int MODE>
__device__ __forceinline__ float mm_load_b(const MmArgs& a, const MmCtx& c, i64 k, i64 n) {
    if (n >= a.N || k >= a.K) return 0.f;
    if (MODE == MM_GEMM) return c.B[k * a.sbk + n * a.sbn];
    const i64 khw = a.kh * a.kw;
    const i64 ci = k / khw, rs = k - ci * khw;
    const i64 r = rs / a.kw, s = rs - r * a.kw;
    const i64 oh = n / a.wo, ow = n - oh * a.wo;
    i64 ih, iw;
    if (MODE == MM_CONV) {
        ih = oh * a.sh - a.pt + r * a.dh;
        iw = ow * a.sw - a.pl + s * a.dw;
    } else {
        const i64 th = oh + a.pt - r * a.dh, tw = ow + a.pl - s * a.dw;
        if (th < 0 || tw < 0 || th % a.sh || tw % a.sw) return 0.f;
        ih = th / a.sh;
        iw = tw / a.sw;
    }
    if (ih < 0 || ih >= a.H || iw < 0 || iw >= a.W) return 0.f;
    return c.B[(ci * a.H + ih) * a.W + iw];
}

// alpha, bias * beta, then the generated epilogue Epi; one store.
template <class Epi>
__device__ __forceinline__ void mm_store(const MmArgs& a, i64 yi, i64 chan, float v) {
    if (a.alpha != 1.0) v *= (float)a.alpha;
    if (a.bias_mode == 1) v += ((const float*)a.bias)[chan];
    else if (a.bias_mode == 2) v += (float)((const float*)a.bias)[avi_offset(yi, (int)a.yrank, a.yshape, a.bias_st)] * (float)a.beta;
    else if (a.bias_mode == 3) v += ((const float*)a.bias)[yi % a.bias_n] * (float)a.beta;
    ((float*)a.y)[yi] = Epi::apply(a, v, yi);
}

__device__ __forceinline__ i64 mm_res_index(const MmArgs& a, i64 yi) {
    return a.res_mode == 1 ? yi : avi_offset(yi, (int)a.yrank, a.yshape, a.res_st);
}

__device__ __forceinline__ unsigned mm_tf32(float x) { return avi_cvt_tf32(x); }

template <class Epi, int MODE, bool TF32>
__device__ void mm_body(const MmArgs& a, i64 block_id) {
    float (*As)[MM_KS][MM_TILE + MM_PAD] = mm_As;
    float (*Bs)[MM_KS][MM_TILE + MM_PAD] = mm_Bs;
    const int tid = threadIdx.x;
    const i64 tiles = a.tiles_m * a.tiles_n;
    const i64 bz = block_id / tiles;
    const i64 tile = block_id - bz * tiles;
    const i64 m0 = (tile / a.tiles_n) * MM_TILE;
    const i64 n0 = (tile % a.tiles_n) * MM_TILE;

    MmCtx c;
    if (MODE == MM_GEMM) {
        i64 oa = 0, ob = 0, r = bz;
        for (int d = (int)a.brank - 1; d >= 0; --d) {
            const i64 idx = r % a.bshape[d];
            r /= a.bshape[d];
            oa += idx * a.sab[d];
            ob += idx * a.sbb[d];
        }
        c.A = (const float*)a.a + oa;
        c.B = (const float*)a.b + ob;
        c.row0 = bz * a.M;
        c.g = 0;
    } else {
        const i64 nb = bz / a.groups, g = bz - nb * a.groups;
        c.g = g;
        c.B = (const float*)a.a + (nb * a.C + g * a.cg) * a.H * a.W;  // input image, group g
        c.A = MODE == MM_CONV ? (const float*)a.b + g * a.coutg * a.K
                              : (const float*)a.b + g * a.cg * a.coutg * a.kh * a.kw;
        c.row0 = nb * a.cout + g * a.coutg;
    }

    float ra[4], rb[4];
    const i64 nk = (a.K + MM_KS - 1) / MM_KS;
    auto load = [&](i64 k0) {
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int idx = tid + 256 * i;
            ra[i] = mm_load_a<MODE>(a, c, m0 + idx / MM_KS, k0 + idx % MM_KS);
            rb[i] = mm_load_b<MODE>(a, c, k0 + idx / MM_TILE, n0 + idx % MM_TILE);
        }
    };
    auto store = [&](int buf) {
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int idx = tid + 256 * i;
            As[buf][idx % MM_KS][idx / MM_KS] = TF32 ? __uint_as_float(mm_tf32(ra[i])) : ra[i];
            Bs[buf][idx / MM_TILE][idx % MM_TILE] = TF32 ? __uint_as_float(mm_tf32(rb[i])) : rb[i];
        }
    };

    float acc[16];
    #pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = 0.f;
    const int tx = tid & 15, ty = tid >> 4;               // FP32 mapping
    const int lane = tid & 31, warp = tid >> 5;           // TF32 mapping
    const int wm = (warp & 1) * 32, wn = (warp >> 1) * 16;
    const int gq = lane >> 2, tq = lane & 3;

    load(0);
    store(0);
    __syncthreads();
    for (i64 kt = 0; kt < nk; ++kt) {
        const int cur = (int)(kt & 1);
        if (kt + 1 < nk) load((kt + 1) * MM_KS);
        if (!TF32) {
            #pragma unroll
            for (int k = 0; k < MM_KS; ++k) {
                float av[4], bv[4];
                #pragma unroll
                for (int i = 0; i < 4; ++i) { av[i] = As[cur][k][ty + 16 * i]; bv[i] = Bs[cur][k][tx + 16 * i]; }
                #pragma unroll
                for (int i = 0; i < 4; ++i)
                    #pragma unroll
                    for (int j = 0; j < 4; ++j) acc[i * 4 + j] = fmaf(av[i], bv[j], acc[i * 4 + j]);
            }
        } else {
            #pragma unroll
            for (int k8 = 0; k8 < MM_KS; k8 += 8) {
                unsigned af[2][4], bf[2][2];
                #pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    const int r = wm + mt * 16 + gq;
                    af[mt][0] = __float_as_uint(As[cur][k8 + tq][r]);
                    af[mt][1] = __float_as_uint(As[cur][k8 + tq][r + 8]);
                    af[mt][2] = __float_as_uint(As[cur][k8 + tq + 4][r]);
                    af[mt][3] = __float_as_uint(As[cur][k8 + tq + 4][r + 8]);
                }
                #pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    const int col = wn + nt * 8 + gq;
                    bf[nt][0] = __float_as_uint(Bs[cur][k8 + tq][col]);
                    bf[nt][1] = __float_as_uint(Bs[cur][k8 + tq + 4][col]);
                }
                #pragma unroll
                for (int mt = 0; mt < 2; ++mt)
                    #pragma unroll
                    for (int nt = 0; nt < 2; ++nt)
                        avi_mma_tf32_m16n8k8(&acc[(mt * 2 + nt) * 4], af[mt], bf[nt]);
            }
        }
        if (kt + 1 < nk) store(cur ^ 1);
        __syncthreads();
    }

    #pragma unroll
    for (int q = 0; q < 16; ++q) {
        i64 m, n;
        if (!TF32) {
            m = m0 + ty + 16 * (q >> 2);
            n = n0 + tx + 16 * (q & 3);
        } else {
            const int mt = q >> 3, nt = (q >> 2) & 1, i = q & 3;
            m = m0 + wm + mt * 16 + gq + ((i & 2) ? 8 : 0);
            n = n0 + wn + nt * 8 + 2 * tq + (i & 1);
        }
        if (m < a.M && n < a.N) {
            const i64 chan = MODE == MM_GEMM ? m : c.g * a.coutg + m;
            mm_store<Epi>(a, (c.row0 + m) * a.N + n, chan, acc[q]);
        }
    }
}

// Depthwise (group == C_in, any channel multiplier): one thread per output, direct taps.
template <class Epi>
__device__ void dwconv_body(const MmArgs& a, i64 block_id) {
    const i64 start = block_id * a.per;
    const i64 end = start + a.per < a.n ? start + a.per : a.n;
    const float* x = (const float*)a.a;
    const float* w = (const float*)a.b;
    for (i64 e = start + threadIdx.x; e < end; e += blockDim.x) {
        const i64 ow = e % a.wo;
        const i64 oh = (e / a.wo) % a.ho;
        const i64 co = (e / (a.wo * a.ho)) % a.cout;
        const i64 nb = e / (a.wo * a.ho * a.cout);
        const i64 ci = co / a.coutg;
        const float* xp = x + (nb * a.C + ci) * a.H * a.W;
        const float* wp = w + co * a.kh * a.kw;
        float acc = 0.f;
        for (i64 r = 0; r < a.kh; ++r) {
            const i64 ih = oh * a.sh - a.pt + r * a.dh;
            if (ih < 0 || ih >= a.H) continue;
            for (i64 s = 0; s < a.kw; ++s) {
                const i64 iw = ow * a.sw - a.pl + s * a.dw;
                if (iw < 0 || iw >= a.W) continue;
                acc = fmaf(xp[ih * a.W + iw], wp[r * a.kw + s], acc);
            }
        }
        mm_store<Epi>(a, e, co, acc);
    }
}
