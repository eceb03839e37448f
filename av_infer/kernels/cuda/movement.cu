// Data movement: concat, split, pad, gather, resize (transpose/slice/copy are strided
// elementwise copies, see elementwise.cu). Element types are templates; concat, split
// and gather move raw words of the element's size. Work split as in ew_body.
#pragma once

__device__ __forceinline__ void avi_range(i64 block_id, i64 per, i64 n, i64* s, i64* e) {
    *s = block_id * per;
    *e = *s + per < n ? *s + per : n;
}

// The part holding axis index ax: the last p with offs[p] <= ax (binary search; DenseNet
// concatenates up to 49 parts, so a linear scan per element would dominate).
__device__ __forceinline__ int cat_part(const CatArgs& a, i64 ax) {
    int lo = 0, hi = (int)a.nparts - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (ax >= a.offs[mid]) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// concat: y[outer, A, inner] from parts p with axis extents off[p+1]-off[p].
template <class U>
__device__ void concat_body(const CatArgs& a, i64 block_id) {
    i64 s, t;
    avi_range(block_id, a.per, a.n, &s, &t);
    U* y = (U*)a.y;
    for (i64 e = s + threadIdx.x; e < t; e += blockDim.x) {
        const i64 in_i = e % a.inner;
        const i64 r = e / a.inner;
        const i64 ax = r % a.axis_len;
        const i64 o = r / a.axis_len;
        const int p = cat_part(a, ax);
        const i64 len = a.offs[p + 1] - a.offs[p];
        const U* src = (const U*)a.parts[p];
        y[e] = src[(o * len + (ax - a.offs[p])) * a.inner + in_i];
    }
}

// split: the inverse; e runs over the input x.
template <class U>
__device__ void split_body(const CatArgs& a, i64 block_id) {
    i64 s, t;
    avi_range(block_id, a.per, a.n, &s, &t);
    const U* x = (const U*)a.y;
    for (i64 e = s + threadIdx.x; e < t; e += blockDim.x) {
        const i64 in_i = e % a.inner;
        const i64 r = e / a.inner;
        const i64 ax = r % a.axis_len;
        const i64 o = r / a.axis_len;
        const int p = cat_part(a, ax);
        const i64 len = a.offs[p + 1] - a.offs[p];
        U* dst = (U*)a.parts[p];
        dst[(o * len + (ax - a.offs[p])) * a.inner + in_i] = x[e];
    }
}

// pad: per dim, q = o - begin; outside [0, L): constant -> value, edge -> clamp,
// reflect -> mirror without the edge, wrap -> modulo; input index = lo + q.
__device__ __forceinline__ i64 pad_index(i64 q, i64 L, int mode) {
    if (q >= 0 && q < L) return q;
    if (mode == 1) {  // reflect
        if (L == 1) return 0;
        const i64 period = 2 * (L - 1);
        q = q % period;
        if (q < 0) q += period;
        return q < L ? q : period - q;
    }
    if (mode == 2) return q < 0 ? 0 : L - 1;  // edge
    if (mode == 3) { q %= L; return q < 0 ? q + L : q; }  // wrap
    return -1;  // constant
}

template <class T>
__device__ void pad_body(const PadArgs& a, i64 block_id) {
    i64 s, t;
    avi_range(block_id, a.per, a.n, &s, &t);
    const T* x = (const T*)a.x;
    T* y = (T*)a.y;
    const int mode = (int)a.mode;
    for (i64 e = s + threadIdx.x; e < t; e += blockDim.x) {
        i64 r = e, off = 0;
        bool inside = true;
        for (int d = (int)a.rank - 1; d >= 0; --d) {
            const i64 od = r % a.oshape[d];
            r /= a.oshape[d];
            const i64 q = pad_index(od - a.begin[d], a.len[d], mode);
            if (q < 0) { inside = false; break; }
            off += (a.lo[d] + q) * a.xst[d];
        }
        y[e] = inside ? x[off] : (T)a.value;
    }
}

// gather: y[o, i, n] = data[o, idx[i] (negative: + A), n].
template <class U, class IT>
__device__ void gather_body(const GatherArgs& a, i64 block_id) {
    i64 s, t;
    avi_range(block_id, a.per, a.n, &s, &t);
    const U* d = (const U*)a.data;
    const IT* ix = (const IT*)a.idx;
    U* y = (U*)a.y;
    for (i64 e = s + threadIdx.x; e < t; e += blockDim.x) {
        const i64 in_i = e % a.inner;
        const i64 r = e / a.inner;
        const i64 ii = r % a.nidx;
        const i64 o = r / a.nidx;
        i64 k = (i64)ix[ii];
        if (k < 0) k += a.axis_len;
        k = k < 0 ? 0 : (k >= a.axis_len ? a.axis_len - 1 : k);  // numpy would raise
        y[e] = d[(o * a.axis_len + k) * a.inner + in_i];
    }
}

// resize: per resized axis a table of taps (input index, weight) for each output index,
// built on the host exactly like cpu_spatial.resize; y = sum over tap combinations of
// product(weights) * x[indices]. Axes with taps == 0 map one to one.
template <class T, class CT>
__device__ void resize_body(const ResizeArgs& a, i64 block_id) {
    i64 s, t;
    avi_range(block_id, a.per, a.n, &s, &t);
    const T* x = (const T*)a.x;
    T* y = (T*)a.y;
    const int rank = (int)a.rank;
    for (i64 e = s + threadIdx.x; e < t; e += blockDim.x) {
        i64 od[AVI_MAXR];
        i64 r = e;
        for (int d = rank - 1; d >= 0; --d) { od[d] = r % a.oshape[d]; r /= a.oshape[d]; }
        i64 ncomb = 1;
        for (int d = 0; d < rank; ++d) if (a.taps[d] > 0) ncomb *= a.taps[d];
        CT acc = CT(0);
        for (i64 c = 0; c < ncomb; ++c) {
            i64 cc = c, off = 0;
            CT w = CT(1);
            for (int d = rank - 1; d >= 0; --d) {
                const i64 nt = a.taps[d];
                if (nt == 0) { off += od[d] * a.xst[d]; continue; }
                const i64 tp = cc % nt;
                cc /= nt;
                const i64 slot = od[d] * nt + tp;
                off += ((const i64*)a.tbl_idx[d])[slot] * a.xst[d];
                w *= (CT)((const float*)a.tbl_w[d])[slot];
            }
            acc += w * (CT)x[off];
        }
        y[e] = (T)acc;
    }
}
