/* mm_mma_cuda: float activations x any weight type on the bf16 tensor cores (mma.sync): prompts
 * over weights with no integer form, and the split form (hi + lo, three MMAs: about fp32
 * accuracy) of --split. API: kernels/cuda_ops.h (mla_cuda_matmul_mma, mla_cuda_matmul_mma3);
 * chosen by mm_choose_cuda.cu. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/mm_cuda.h"

namespace mlacu {

MLACU_GRIDS_TU();

/* ---------------------------------------------------------------- tensor cores */
/* Block tile 64 tokens x 128 output rows, K step 32 (one unit). Threads 0..127 dequantize one
 * unit of one W row each into bf16 shared memory, threads 128..255 convert the x tile; then 8
 * warps (2 x 4, 32x32 each) run mma.sync m16n8k16 bf16 -> fp32. Two shared buffers: one
 * barrier per K step. Rows padded to 40 bf16 (80 bytes): conflict-free fragment loads. */
constexpr int MM_BM = 64, MM_BN = 128, MM_LD = 40;

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(uint32_t *)&h;
}

/* x = hi + lo with hi = bf16(x), lo = bf16(x - hi): 16 significant bits between them */
__device__ __forceinline__ void split_bf16(float a, float b, uint32_t &hi, uint32_t &lo) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    float2 hf = __bfloat1622float2(h);
    __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
    hi = *(uint32_t *)&h;
    lo = *(uint32_t *)&l;
}

/* SPLIT: activations and weights split into bf16 hi + lo and three MMAs per fragment
 * (hi*hi + hi*lo + lo*hi, fp32 accumulate): about fp32-GEMV accuracy (the lo*lo term, ~2^-16
 * relative, is left out) at tensor-core speed. Hi and lo tiles double the shared memory, so
 * SPLIT keeps one buffer and pays a second barrier per K step. */
template <int TY, bool SPLIT>
__global__ void __launch_bounds__(256)
    mma_kernel(const uint8_t *__restrict__ W, size_t rb, int in, int out, const float *__restrict__ x, int T,
               float *__restrict__ y) {
    mlacu_pdl_enter();
    using Q = qtraits<TY>;
    constexpr int NB = SPLIT ? 1 : 2, NP = SPLIT ? 2 : 1;
    __shared__ __align__(16) __nv_bfloat16 As[NB][NP][MM_BM][MM_LD];
    __shared__ __align__(16) __nv_bfloat16 Bs[NB][NP][MM_BN][MM_LD];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp >> 2, wn = warp & 3, g = lane >> 2, tig = lane & 3;
    const int m0 = blockIdx.y * MM_BM, n0 = blockIdx.x * MM_BN;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[i][j][k] = 0.f;

    const int nk = in / 32;
    for (int kt = 0; kt < nk; kt++) {
        const int buf = SPLIT ? 0 : (kt & 1);
        if (SPLIT && kt > 0) __syncthreads(); /* one buffer: every warp is done with the last tile */
        if (tid < MM_BN) {
            const int n = n0 + tid;
            float v[32];
            if (n < out) {
                deq_unit<TY>(W + (size_t)n * rb + (size_t)(kt / Q::BU) * Q::BB, kt % Q::BU, v);
            } else {
#pragma unroll
                for (int i = 0; i < 32; i++) v[i] = 0.f;
            }
            uint4 *d = (uint4 *)&Bs[buf][0][tid][0];
            if constexpr (SPLIT) {
                uint4 *dl = (uint4 *)&Bs[buf][NP - 1][tid][0];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    uint32_t h[4], l[4];
#pragma unroll
                    for (int j = 0; j < 4; j++) split_bf16(v[8 * q + 2 * j], v[8 * q + 2 * j + 1], h[j], l[j]);
                    d[q] = make_uint4(h[0], h[1], h[2], h[3]);
                    dl[q] = make_uint4(l[0], l[1], l[2], l[3]);
                }
            } else {
#pragma unroll
                for (int q = 0; q < 4; q++)
                    d[q] = make_uint4(pack_bf16(v[8 * q], v[8 * q + 1]), pack_bf16(v[8 * q + 2], v[8 * q + 3]),
                                      pack_bf16(v[8 * q + 4], v[8 * q + 5]), pack_bf16(v[8 * q + 6], v[8 * q + 7]));
            }
        } else {
            const int i = tid - MM_BN, m = i >> 1, kh = (i & 1) * 16;
            const int gm = m0 + m;
            float4 f[4];
            if (gm < T) {
                const float4 *s = (const float4 *)(x + (size_t)gm * in + (size_t)kt * 32 + kh);
#pragma unroll
                for (int q = 0; q < 4; q++) f[q] = __ldg(s + q);
            } else {
#pragma unroll
                for (int q = 0; q < 4; q++) f[q] = make_float4(0.f, 0.f, 0.f, 0.f);
            }
            uint4 *d = (uint4 *)&As[buf][0][m][kh];
            if constexpr (SPLIT) {
                uint4 *dl = (uint4 *)&As[buf][NP - 1][m][kh];
                uint32_t h[8], l[8];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    split_bf16(f[q].x, f[q].y, h[2 * q], l[2 * q]);
                    split_bf16(f[q].z, f[q].w, h[2 * q + 1], l[2 * q + 1]);
                }
                d[0] = make_uint4(h[0], h[1], h[2], h[3]);
                d[1] = make_uint4(h[4], h[5], h[6], h[7]);
                dl[0] = make_uint4(l[0], l[1], l[2], l[3]);
                dl[1] = make_uint4(l[4], l[5], l[6], l[7]);
            } else {
                d[0] = make_uint4(pack_bf16(f[0].x, f[0].y), pack_bf16(f[0].z, f[0].w), pack_bf16(f[1].x, f[1].y),
                                  pack_bf16(f[1].z, f[1].w));
                d[1] = make_uint4(pack_bf16(f[2].x, f[2].y), pack_bf16(f[2].z, f[2].w), pack_bf16(f[3].x, f[3].y),
                                  pack_bf16(f[3].z, f[3].w));
            }
        }
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < 2; ks++) {
            const int c = ks * 16 + 2 * tig;
            uint32_t a[NP][2][4];
#pragma unroll
            for (int p = 0; p < NP; p++)
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const int r = wm * 32 + mt * 16 + g;
                    a[p][mt][0] = *(const uint32_t *)&As[buf][p][r][c];
                    a[p][mt][1] = *(const uint32_t *)&As[buf][p][r + 8][c];
                    a[p][mt][2] = *(const uint32_t *)&As[buf][p][r][c + 8];
                    a[p][mt][3] = *(const uint32_t *)&As[buf][p][r + 8][c + 8];
                }
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int n = wn * 32 + nt * 8 + g;
                uint32_t b0 = *(const uint32_t *)&Bs[buf][0][n][c];
                uint32_t b1 = *(const uint32_t *)&Bs[buf][0][n][c + 8];
                if constexpr (SPLIT) { /* small terms first */
                    uint32_t l0 = *(const uint32_t *)&Bs[buf][NP - 1][n][c];
                    uint32_t l1 = *(const uint32_t *)&Bs[buf][NP - 1][n][c + 8];
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mlacu_mma_bf16(acc[mt][nt], a[NP - 1][mt], b0, b1);
                        mlacu_mma_bf16(acc[mt][nt], a[0][mt], l0, l1);
                    }
                }
#pragma unroll
                for (int mt = 0; mt < 2; mt++) mlacu_mma_bf16(acc[mt][nt], a[0][mt], b0, b1);
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const int m = m0 + wm * 32 + mt * 16 + g;
            const int n = n0 + wn * 32 + nt * 8 + 2 * tig;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int mm = m + 8 * h;
                if (mm >= T) continue;
                if (n < out) y[(size_t)mm * out + n] = acc[mt][nt][2 * h];
                if (n + 1 < out) y[(size_t)mm * out + n + 1] = acc[mt][nt][2 * h + 1];
            }
        }
    }
}

template <int TY, bool SPLIT = false>
static cudaError_t launch_mma(const void *w, int64_t in, int64_t out, const float *x, int64_t T, float *y,
                              cudaStream_t s) {
    size_t rb = ggml_row_bytes(TY, in);
    dim3 grid((unsigned)((out + MM_BN - 1) / MM_BN), (unsigned)((T + MM_BM - 1) / MM_BM));
    mlacu_launch(mma_kernel<TY, SPLIT>, grid, 256, 0, s, (const uint8_t *)w, rb, (int)in, (int)out, x, (int)T, y);
    return cudaGetLastError();
}

} // namespace mlacu

using namespace mlacu;

extern "C" int mla_cuda_matmul_mma(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x, int64_t T,
                                   float *d_y, mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, T);
    if (T == 0) return MLA_OK;
    cudaError_t err = cudaErrorInvalidValue;
    switch (t) {
#define MLACU_CASE(T_)                                                                                              \
    case T_:                                                                                                        \
        err = launch_mma<T_>(d_w, in, out, d_x, T, d_y, stream);                                                    \
        break;
        MLACU_FOR_TYPES(MLACU_CASE)
#undef MLACU_CASE
    }
    MLACU_CHECK(err, e, "mma %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out, (long long)in, (long long)T);
    return MLA_OK;
}

extern "C" int mla_cuda_matmul_mma3(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x,
                                    int64_t T, float *d_y, mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, T);
    if (T == 0) return MLA_OK;
    cudaError_t err = cudaErrorInvalidValue;
    switch (t) {
#define MLACU_CASE(T_)                                                                                              \
    case T_:                                                                                                        \
        err = launch_mma<T_, true>(d_w, in, out, d_x, T, d_y, stream);                                              \
        break;
        MLACU_FOR_TYPES(MLACU_CASE)
#undef MLACU_CASE
    }
    MLACU_CHECK(err, e, "mma3 %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out, (long long)in, (long long)T);
    return MLA_OK;
}
