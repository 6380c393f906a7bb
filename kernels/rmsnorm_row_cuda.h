/* rmsnorm_row_cuda: the RMSNorm of one row by one block, as the kernels that norm a row share it
 * (rmsnorm_kernel and qnorm_kv_kernel in ops_cuda.cu, the one-shot all-reduce's fused sum + norm
 * in allreduce_cuda.cu): the same sums in the same order wherever it runs, so each gives the
 * bits of the others. Internal to kernels/ (CUDA C++ only); block_sum and block_max are the block
 * reductions every kernel here takes. */
#ifndef RMSNORM_ROW_CUDA_H
#define RMSNORM_ROW_CUDA_H

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda_internal.h"

namespace mlacu_rn {
/* Sum over a block of blockDim.x (a multiple of 32, <= 1024) threads; every thread gets it. */
__device__ inline float block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = wsum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = lane < nw ? red[lane] : 0.f;
    return wsum(s);
}

/* the largest v of the block's threads (v >= 0), as block_sum shares `red` */
__device__ inline float block_max(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = lane < nw ? red[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

constexpr int RN_T = 512, RN_V = 16; /* threads of a row; values per thread kept in registers */
constexpr int RN_KB = 2;             /* a slice of a row: RN_KB RN_T elements (mla_cuda_rmsnorm_ex) */
/* Row xr of n (one block of RN_T threads; every thread calls it): with ADD, x = xr + rr first
 * (mla_cuda_add's sum), written to xo (xo == xr: in place, one block a row); then st(i, y_i) for
 * y = rmsnorm(x) w, and with Q8 (rows of up to RN_T RN_V elements, n % 32 == 0) also y's q8
 * units: element i of the row's int8 at q[i], unit u's scales at qs[u] (mla_cuda_quantize_q8's
 * values), and with H16 (rows of up to RN_T RN_V, the whole row: k0 0, k1 RN_V) y's fp16 row at
 * h and its scale at *hs (mla_cuda_act_h's values). Rows of up to RN_T RN_V: only the elements
 * i = threadIdx.x + k RN_T with k0 <= k < k1 are written (x, y and q8; the sum is the whole
 * row's), so that several blocks can share a row (k1 - k0 = RN_KB, or the whole row).
 * PDL: the caller has not waited on the kernel before; rms_row reads w (a weight) first, then
 * waits, and lets the next kernel be scheduled once the row's loads are in (its reduction).
 * rmsnorm_kernel takes this form for a decode step's few rows only. A decode step's norm is
 * followed by a streamed GEMV whose blocks copy their first stages of weights as soon as they are
 * scheduled: those copies would otherwise queue ahead of the norm's own loads, on the step's
 * critical path. fetch() runs after the wait, before xr and rr are read
 * (rmsnorm_kernel's bulk copy of them into shared memory). */
struct rms_no_fetch {
    __device__ void operator()() const {}
};
template <bool ADD, bool Q8, bool H16, bool PDL = false, typename ST, typename FETCH = rms_no_fetch>
__device__ __forceinline__ void rms_row(const float *xr, const float *rr, float *xo, int n, const float *__restrict__ w,
                                        float eps, float *red, int8_t *q, float4 *qs, __half *h, float *hs, int k0,
                                        int k1, ST st, FETCH fetch = {}) {
    float ss = 0.f;
    if (n <= RN_T * RN_V) {
        /* rows of up to 8192 (every hidden size here): x and w read once, all loads issued before
         * the reduction (one block per token is latency, not bandwidth); the same sums and
         * products, in the same order, as the loops below. The loops end at the row's last
         * chunk: a decode step runs this code once a launch, cold, and a 2048-wide row takes 4 of
         * the 16 chunks */
        float xv[RN_V] = {}, wv[RN_V], rv[RN_V]; /* xv: zeros past the row (the q8 units of a whole row) */
#pragma unroll
        for (int k = 0; k < RN_V; k++) {
            if (k * RN_T >= n) break; /* past the row: every thread alike */
            const int i = threadIdx.x + k * RN_T;
            wv[k] = i < n ? w[i] : 0.f;
        }
        if (PDL) mlacu_pdl_wait();
        fetch();
#pragma unroll
        for (int k = 0; k < RN_V; k++) {
            if (k * RN_T >= n) break; /* past the row: every thread alike */
            const int i = threadIdx.x + k * RN_T;
            xv[k] = i < n ? xr[i] : 0.f;
            if (ADD) rv[k] = i < n ? rr[i] : 0.f;
        }
        if (ADD) /* after every load: a store to x before them would hold each one back */
#pragma unroll
            for (int k = 0; k < RN_V; k++) {
                if (k * RN_T >= n) break; /* past the row: every thread alike */
                const int i = threadIdx.x + k * RN_T;
                xv[k] += rv[k];
                if (i < n && k >= k0 && k < k1) xo[i] = xv[k];
            }
#pragma unroll
        for (int k = 0; k < RN_V && k * RN_T < n; k++)
            if (threadIdx.x + k * RN_T < n) ss += xv[k] * xv[k];
        ss = block_sum(ss, red);
        if (PDL) mlacu_pdl_trigger();
        const float r = (float)(1.0 / sqrt((double)ss / (double)n + (double)eps));
#pragma unroll
        for (int k = 0; k < RN_V; k++) {
            if (k * RN_T >= n) break; /* past the row: every thread alike */
            const int i = threadIdx.x + k * RN_T;
            xv[k] = xv[k] * r * wv[k]; /* y */
            if (i < n && k >= k0 && k < k1) st(i, xv[k]);
        }
        /* a warp holds one whole 32-element unit at each k (RN_T is a multiple of 32): units
         * past n are computed on zeros and not stored */
        if (Q8) {
            const int base = (int)(threadIdx.x & ~31u), nk = (n - base + RN_T - 1) / RN_T; /* this warp's units */
            if (k1 - k0 >= RN_V) {
                mlacu_q8_units_warp<RN_V>(xv, q + base, qs + base / 32, RN_T, nk);
            } else { /* the slice's units only (block-uniform k0) */
                float v[RN_KB];
#pragma unroll
                for (int j = 0; j < RN_KB; j++) {
                    v[j] = 0.f;
#pragma unroll
                    for (int k = 0; k < RN_V && k * RN_T < n; k++)
                        if (k == k0 + j) v[j] = xv[k];
                }
                mlacu_q8_units_warp<RN_KB>(v, q + base + k0 * RN_T, qs + (base + k0 * RN_T) / 32, RN_T,
                                           min(RN_KB, nk - k0));
            }
        }
        if (H16) { /* act_h_kernel's scale and rounding of the same y */
            float m = 0.f;
#pragma unroll
            for (int k = 0; k < RN_V && k * RN_T < n; k++)
                if (threadIdx.x + k * RN_T < n) m = fmaxf(m, fabsf(xv[k]));
            const int e = mlacu_h16_exp(block_max(m, red));
            const float s = ldexpf(1.f, e);
#pragma unroll
            for (int k = 0; k < RN_V; k++) {
                if (k * RN_T >= n) break; /* past the row: every thread alike */
                const int i = threadIdx.x + k * RN_T;
                if (i < n) h[i] = __float2half_rn(xv[k] * s);
            }
            if (threadIdx.x == 0) *hs = ldexpf(1.f, -e);
        }
        return;
    }
    /* unrolled: the loads of a thread are independent (one block per token: latency, not bandwidth) */
    if (PDL) mlacu_pdl_enter();
    fetch();
    if (ADD) { /* each thread its own elements: read back below by the same thread */
        for (int i = threadIdx.x; i < n; i += blockDim.x) xo[i] = xr[i] + rr[i];
        xr = xo;
    }
#pragma unroll 8
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    float r = (float)(1.0 / sqrt((double)ss / (double)n + (double)eps));
#pragma unroll 8
    for (int i = threadIdx.x; i < n; i += blockDim.x) st(i, xr[i] * r * w[i]);
}

/* Slice j of `slices` blocks sharing a row: its k0 .. k1 - 1 of rms_row (the whole row with one);
 * and how many blocks a row of n takes when it is sliced (a few rows with q8: each row's
 * quantization spread over SMs, each block summing the whole row again, from L2) */
__device__ __forceinline__ void rn_slice(int j, int slices, int &k0, int &k1) {
    k0 = slices > 1 ? j * RN_KB : 0;
    k1 = slices > 1 ? k0 + RN_KB : RN_V;
}
static inline unsigned rn_slices(int64_t n) { return (unsigned)((n + RN_T * RN_KB - 1) / (RN_T * RN_KB)); }

} // namespace mlacu_rn

#endif
