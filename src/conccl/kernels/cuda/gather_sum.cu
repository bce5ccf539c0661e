// MoE combine's gathered, weighted sum of rows: out[r] = round(sum over j with index[r, j] >= 0
// of weights[r, j] * float(src[index[r, j]])), an fp32 accumulator from +0, each product
// __fmul_rn, added in j order with __fadd_rn (never an FMA), rounded to the dtype once
// (conccl/kernels/gather_sum.py launches it).
// Options: THREADS_PER_CTA.
#include "conccl.cuh"
#ifndef THREADS_PER_CTA
#error "conccl's gathered sum is compiled with THREADS_PER_CTA (conccl.kernels.gather_sum)"
#endif

template <int KIND> __device__ __forceinline__ float scalar_load(const void* p, long long i) {
    if (KIND == 0) return ((const float*)p)[i];
    return half_to_float(((const u16*)p)[i], KIND == 1);
}
template <int KIND> __device__ __forceinline__ void scalar_store(void* p, long long i, float f) {
    if (KIND == 0) ((float*)p)[i] = f;
    else ((u16*)p)[i] = to_half(f, KIND == 1);
}

// VEC: one thread per 16-byte vector of a row (h a multiple of the vector, every row 16-byte
// aligned); otherwise one thread per element.
template <int KIND, int VEC> __device__ __forceinline__ void gather_sum(
        void* dst, const void* src, const long long* index, const float* weights, int n, long long rows, long long h) {
    const int EPV = VEC ? (KIND == 0 ? 4 : 8) : 1;
    const long long per_row = h / EPV, total = rows * per_row;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total; t += stride) {
        const long long r = t / per_row, c = t - r * per_row;
        float acc[EPV];
        #pragma unroll
        for (int e = 0; e < EPV; ++e) acc[e] = 0.0f;
        for (int j = 0; j < n; ++j) {
            const long long p = index[r * n + j];
            if (p < 0) continue;
            float f[EPV];
            if (VEC) unpack<KIND>(((const uint4*)src)[p * per_row + c], f);
            else f[0] = scalar_load<KIND>(src, p * h + c);
            const float w = weights ? weights[r * n + j] : 1.0f;
            #pragma unroll
            for (int e = 0; e < EPV; ++e) acc[e] = __fadd_rn(acc[e], weights ? __fmul_rn(w, f[e]) : f[e]);
        }
        if (VEC) ((uint4*)dst)[t] = pack<KIND>(acc);
        else scalar_store<KIND>(dst, t, acc[0]);
    }
}

#define KERNEL(name, KIND, VEC) \
extern "C" __global__ void __launch_bounds__(THREADS_PER_CTA) name( \
        void* dst, const void* src, const long long* index, const float* weights, int n, long long rows, \
        long long h) { \
    gather_sum<KIND, VEC>(dst, src, index, weights, n, rows, h); }
KERNEL(gather_sum_f32, 0, 0)
KERNEL(gather_sum_bf16, 1, 0)
KERNEL(gather_sum_f16, 2, 0)
KERNEL(gather_sum_vec_f32, 0, 1)
KERNEL(gather_sum_vec_bf16, 1, 1)
KERNEL(gather_sum_vec_f16, 2, 1)
