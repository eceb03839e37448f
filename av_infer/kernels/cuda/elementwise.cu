// Elementwise family: unary, binary, where, cast, copy, batchnorm, and the strided copies
// transpose and slice. One body, ew_body<F, NIN>: every output element e of a contiguous
// output gets the offsets of its NIN operands from broadcast strides (stride 0 on
// broadcast dims), then the generated functor F (see sources.py) computes y[e].
// Work split: logical block b handles elements [b * per, (b + 1) * per).
#pragma once

template <int NIN>
__device__ __forceinline__ void ew_offsets(const EwArgs& a, i64 e, i64* off) {
    #pragma unroll
    for (int i = 0; i < NIN; ++i) off[i] = 0;
    if (a.contig) {
        #pragma unroll
        for (int i = 0; i < NIN; ++i) off[i] = e;
        return;
    }
    for (int d = (int)a.rank - 1; d >= 0; --d) {
        const i64 s = a.shape[d];
        const i64 q = e / s;
        const i64 idx = e - q * s;
        #pragma unroll
        for (int i = 0; i < NIN; ++i) off[i] += idx * a.st[i * AVI_MAXR + d];
        e = q;
    }
}

template <class F, int NIN>
__device__ void ew_body(const EwArgs& a, i64 block_id) {
    const i64 start = block_id * a.per;
    const i64 end = start + a.per < a.n ? start + a.per : a.n;
    i64 off[NIN];
    for (i64 e = start + threadIdx.x; e < end; e += blockDim.x) {
        ew_offsets<NIN>(a, e, off);
        F::apply(a, e, off);
    }
}
