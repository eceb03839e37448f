// Row kernels: reduce, global_pool, softmax, layernorm (one block per row, warp-shuffle
// block reductions), and pool (one thread per output, window loop). A "row" is one
// combination of the kept dims (kshape/kst); its columns run over the reduced dims
// (rshape/rst). Logical block b = row b.
#pragma once

__device__ __forceinline__ i64 row_col_offset(const RowArgs& a, i64 j) {
    if (a.rrank == 1) return j * a.rst[0];
    return avi_offset(j, (int)a.rrank, a.rshape, a.rst);
}

// op: 0 sum 1 mean 2 max 3 min 4 prod 5 sum_square 6 l1 7 l2 8 log_sum 9 log_sum_exp
template <class T, class CT, int OP>
__device__ void reduce_body(const RowArgs& a, i64 row) {
    const T* x = (const T*)a.x + avi_offset(row, (int)a.krank, a.kshape, a.kst);
    CT v;
    if (OP == 2 || OP == 3 || OP == 9) {
        CT m = (CT)x[row_col_offset(a, 0)];
        for (i64 j = threadIdx.x; j < a.cols; j += blockDim.x) {
            const CT xv = (CT)x[row_col_offset(a, j)];
            m = (OP == 3) ? act_min<CT>(m, xv) : act_max<CT>(m, xv);
        }
        m = (OP == 3) ? avi_block_reduce<CT>(m, OpMin(), m) : avi_block_reduce<CT>(m, OpMax(), m);
        if (OP != 9) { v = m; }
        else {
            CT s = CT(0);
            for (i64 j = threadIdx.x; j < a.cols; j += blockDim.x)
                s += (CT)exp((double)((CT)x[row_col_offset(a, j)] - m));
            s = avi_block_reduce<CT>(s, OpSum(), CT(0));
            v = (CT)log((double)s) + m;
        }
    } else if (OP == 4) {
        CT p = CT(1);
        for (i64 j = threadIdx.x; j < a.cols; j += blockDim.x) p *= (CT)x[row_col_offset(a, j)];
        v = avi_block_reduce<CT>(p, OpProd(), CT(1));
    } else {
        CT s = CT(0);
        for (i64 j = threadIdx.x; j < a.cols; j += blockDim.x) {
            CT xv = (CT)x[row_col_offset(a, j)];
            if (OP == 5 || OP == 7) xv = xv * xv;
            if (OP == 6) xv = xv < CT(0) ? -xv : xv;
            s += xv;
        }
        v = avi_block_reduce<CT>(s, OpSum(), CT(0));
        if (OP == 1) v = v / (CT)a.cols;
        if (OP == 7) v = (CT)sqrt((double)v);
        if (OP == 8) v = (CT)log((double)v);
    }
    if (threadIdx.x == 0) ((T*)a.y)[row] = (T)v;
}

// softmax / log-softmax over the row's columns; y has x's layout.
template <class T, bool LOG>
__device__ void softmax_body(const RowArgs& a, i64 row) {
    const i64 base = avi_offset(row, (int)a.krank, a.kshape, a.kst);
    const T* x = (const T*)a.x + base;
    T* y = (T*)a.y + base;
    T m = x[row_col_offset(a, 0)];
    for (i64 j = threadIdx.x; j < a.cols; j += blockDim.x) m = act_max<T>(m, x[row_col_offset(a, j)]);
    m = avi_block_reduce<T>(m, OpMax(), m);
    T s = T(0);
    for (i64 j = threadIdx.x; j < a.cols; j += blockDim.x) s += (T)exp((double)(x[row_col_offset(a, j)] - m));
    s = avi_block_reduce<T>(s, OpSum(), T(0));
    const T ls = (T)log((double)s);
    for (i64 j = threadIdx.x; j < a.cols; j += blockDim.x) {
        const i64 o = row_col_offset(a, j);
        const T d = x[o] - m;
        y[o] = LOG ? d - ls : (T)exp((double)d) / s;
    }
}
template <>
__device__ void softmax_body<float, false>(const RowArgs& a, i64 row) {
    const i64 base = avi_offset(row, (int)a.krank, a.kshape, a.kst);
    const float* x = (const float*)a.x + base;
    float* y = (float*)a.y + base;
    float m = x[row_col_offset(a, 0)];
    for (i64 j = threadIdx.x; j < a.cols; j += blockDim.x) m = act_max<float>(m, x[row_col_offset(a, j)]);
    m = avi_block_reduce<float>(m, OpMax(), m);
    float s = 0.f;
    for (i64 j = threadIdx.x; j < a.cols; j += blockDim.x) s += expf(x[row_col_offset(a, j)] - m);
    s = avi_block_reduce<float>(s, OpSum(), 0.f);
    for (i64 j = threadIdx.x; j < a.cols; j += blockDim.x) {
        const i64 o = row_col_offset(a, j);
        y[o] = expf(x[o] - m) / s;
    }
}

// layernorm over contiguous trailing columns: (x - mean) / sqrt(var + eps) * scale + bias;
// scale/bias are indexed j % size (suffix broadcasting).
template <class T>
__device__ void layernorm_body(const RowArgs& a, i64 row) {
    const T* x = (const T*)a.x + row * a.cols;
    T* y = (T*)a.y + row * a.cols;
    const T* sc = (const T*)a.scale;
    const T* bi = (const T*)a.bias;
    T s = T(0);
    for (i64 j = threadIdx.x; j < a.cols; j += blockDim.x) s += x[j];
    const T mean = avi_block_reduce<T>(s, OpSum(), T(0)) / (T)a.cols;
    T q = T(0);
    for (i64 j = threadIdx.x; j < a.cols; j += blockDim.x) { const T d = x[j] - mean; q += d * d; }
    const T var = avi_block_reduce<T>(q, OpSum(), T(0)) / (T)a.cols;
    const T den = (T)sqrt((double)(var + (T)a.eps));
    for (i64 j = threadIdx.x; j < a.cols; j += blockDim.x) {
        T v = (x[j] - mean) / den * sc[j % a.scale_n];
        if (bi) v += bi[j % a.bias_n];
        y[j] = v;
    }
}

// pool: max/avg over a (kh, kw) window; avg divisors follow onnxruntime (cpu_spatial.pool).
template <class T, bool MAX>
__device__ void pool_body(const PoolArgs& a, i64 block_id) {
    const i64 start = block_id * a.per;
    const i64 end = start + a.per < a.n ? start + a.per : a.n;
    const T* x = (const T*)a.x;
    T* y = (T*)a.y;
    for (i64 e = start + threadIdx.x; e < end; e += blockDim.x) {
        const i64 ow = e % a.wo;
        const i64 oh = (e / a.wo) % a.ho;
        const i64 nc = e / (a.wo * a.ho);
        const T* xp = x + nc * a.h * a.w;
        float acc = MAX ? -AVI_INF : 0.f;
        T macc = (T)a.minval;
        i64 cnt_h = 0, cnt_w = 0;
        for (i64 r = 0; r < a.kh; ++r) {
            const i64 ph = oh * a.sh + r * a.dh;  // padded coordinate
            const i64 ih = ph - a.pt;
            if (a.incl) cnt_h += (ph < a.hp) ? 1 : 0; else cnt_h += (ih >= 0 && ih < a.h) ? 1 : 0;
            if (ih < 0 || ih >= a.h) continue;
            for (i64 c = 0; c < a.kw; ++c) {
                const i64 iw = ow * a.sw + c * a.dw - a.pl;
                if (iw < 0 || iw >= a.w) continue;
                const T v = xp[ih * a.w + iw];
                if (MAX) macc = act_max<T>(macc, v); else acc += (float)v;
            }
        }
        if (MAX) {
            y[e] = macc;
        } else {
            for (i64 c = 0; c < a.kw; ++c) {
                const i64 pw = ow * a.sw + c * a.dw;
                const i64 iw = pw - a.pl;
                if (a.incl) cnt_w += (pw < a.wp) ? 1 : 0; else cnt_w += (iw >= 0 && iw < a.w) ? 1 : 0;
            }
            const i64 cnt = cnt_h * cnt_w;
            y[e] = cnt > 0 ? (T)(acc * (1.f / (float)cnt)) : (T)0;
        }
    }
}
