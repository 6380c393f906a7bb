/* mm_narrow_cuda: float activations x float weights (F32, F16, BF16) of at most
 * MLACU_GV_FLOAT_OUT outputs, past the GEMV's rows: a MoE router's product in a prompt step.
 * API: kernels/cuda_ops.h (mla_cuda_matmul_narrow); chosen by mm_choose_cuda.cu.
 *
 * Why a kernel of its own: the bf16 tensor cores' tile (mm_mma_cuda.cu, 64 tokens x 128 outputs)
 * leaves a router of 64-256 outputs a column of blocks that each walk all of K in steps of 32, one
 * round of global loads at a time; the K loop's latency is the time at any row count. Here a block
 * owns 16 or 32 tokens x 64 outputs and its 8 warps split K between them (in / 8 each), so a block
 * walks an eighth of K, and sums the warps' parts in shared memory in a fixed order: the same bits
 * on every run, with no workspace and no second kernel.
 *
 * Arithmetic: three TF32 MMAs per fragment (x_lo w_hi + x_hi w_lo + x_hi w_hi; hi = x rounded to
 * tf32, lo = the rest rounded again), fp32 accumulation: about fp32 accuracy (the lo lo term,
 * ~2^-22 relative, is left out), as the GEMV and the CPU reference compute it. F16 and BF16 weights
 * are exact in tf32 (w_lo = 0): two MMAs.
 *
 * Each lane loads 4 consecutive columns (a float4 of x; 16 or 8 bytes of W) of a 16-column chunk
 * and feeds them to two k8 MMAs: column 4 tig + 2 s + j of the chunk is the k8 step s's column
 * tig + 4 j, in A and B alike, so the sum is over every column once. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/mm_cuda.h"

namespace mlacu {

constexpr int NW_TN = 64, NW_WARPS = 8; /* outputs a block; warps, each an eighth of K */
constexpr int NW_LD = NW_TN + 4;          /* a row of partial sums, floats */

/* 4 consecutive weights from p (16-byte aligned for F32, 8 for the 16-bit types) */
template <int TY> __device__ __forceinline__ float4 nw_load_w(const uint8_t *p);
template <> __device__ __forceinline__ float4 nw_load_w<GGML_TYPE_F32>(const uint8_t *p) {
    return __ldg((const float4 *)p);
}
template <> __device__ __forceinline__ float4 nw_load_w<GGML_TYPE_F16>(const uint8_t *p) {
    const uint2 u = __ldg((const uint2 *)p);
    const float2 a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}
template <> __device__ __forceinline__ float4 nw_load_w<GGML_TYPE_BF16>(const uint8_t *p) {
    const uint2 u = __ldg((const uint2 *)p);
    const float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x),
                 b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}

__device__ __forceinline__ uint32_t nw_tf32(float f) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
    return r;
}

/* f = hi + lo, both tf32 */
__device__ __forceinline__ void nw_split(float f, uint32_t &hi, uint32_t &lo) {
    hi = nw_tf32(f);
    lo = nw_tf32(f - __uint_as_float(hi));
}

/* c += A B, m16n8k8, tf32 operands, fp32 accumulate */
__device__ __forceinline__ void nw_mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Block (output tile blockIdx.x, token tile blockIdx.y): y [t0 .. t0 + 16 MT - 1][n0 .. n0 + 63].
 * Warp w takes K's chunks [w C, (w + 1) C) of 16 columns, C = in / 128, for all 16 MT tokens.
 * MT = 2 reads each weight once for 32 tokens (half the L2 traffic of MT = 1, which a block
 * walks in as many load rounds: steps of many tokens), MT = 1 gives twice the blocks (few). */
template <int TY, int MT>
__global__ void __launch_bounds__(NW_WARPS * 32, MT == 1 ? 2 : 1)
    narrow_kernel(const uint8_t *__restrict__ W, size_t rb, int in, int out, const float *__restrict__ x, int T,
                  float *__restrict__ y) {
    mlacu_pdl_enter();
    constexpr bool WLO = TY == GGML_TYPE_F32; /* 16-bit weights are exact in tf32 */
    constexpr int WB = TY == GGML_TYPE_F32 ? 4 : 2;
    constexpr int U = MT == 1 ? 2 : 1;       /* chunks a load round */
    constexpr int TM = 16 * MT, XR = 2 * MT; /* tokens a block; x rows a lane */
    /* the warps' partial sums: warps 4..7 add into 0..3, then 0..3 are summed in order */
    __shared__ __align__(16) float red[NW_WARPS / 2][TM][NW_LD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const int n0 = blockIdx.x * NW_TN, t0 = blockIdx.y * TM;
    const int C = in / (16 * NW_WARPS), c0 = warp * C;
    /* this lane's x rows: tokens t0 + g + 8 i (absent ones read as zeros); W rows n0 + 8 nt + g */
    const float *xr = x + (size_t)(t0 + g) * in + 4 * tig; /* + 8 i rows: the lane's row i */
    const size_t xs8 = (size_t)8 * in;
    const int xlive = T - t0 - g; /* rows i < xlive / 8 (rounded up) are tokens */
    const uint8_t *wr = W + (size_t)(n0 + g) * rb + (size_t)4 * tig * WB; /* + 8 nt rows: output tile nt */
    const size_t rs8 = 8 * rb;
    const int nlive = out - n0 - g; /* tiles nt < nlive / 8 (rounded up) are rows of W */
    float acc[MT][8][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][nt][i] = 0.f;

    const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int c = 0; c < C; c += U) {
        float4 vx[U][XR], vw[U][8];
#pragma unroll
        for (int u = 0; u < U; u++) { /* one round of loads: U chunks */
            const bool have = c + u < C;
            const int k = (c0 + c + u) * 16;
#pragma unroll
            for (int i = 0; i < XR; i++)
                vx[u][i] = have && 8 * i < xlive ? __ldg((const float4 *)(xr + i * xs8 + k)) : z4;
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
                vw[u][nt] = have && 8 * nt < nlive ? nw_load_w<TY>(wr + nt * rs8 + (size_t)k * WB) : z4;
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int s = 0; s < 2; s++) {
                /* A of token tile m: (g, tig) (g + 8, tig) (g, tig + 4) (g + 8, tig + 4) = rows
                 * 2 m, 2 m + 1 of the lane's, columns 4 tig + 2 s, + 1 */
                uint32_t ah[MT][4], al[MT][4];
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    const float4 r0 = vx[u][2 * m], r1 = vx[u][2 * m + 1];
                    const float av[4] = {s ? r0.z : r0.x, s ? r1.z : r1.x, s ? r0.w : r0.y, s ? r1.w : r1.y};
#pragma unroll
                    for (int i = 0; i < 4; i++) nw_split(av[i], ah[m][i], al[m][i]);
                }
#pragma unroll
                for (int nt = 0; nt < 8; nt++) {
                    /* B: (k tig, n g) (k tig + 4, n g) */
                    const float b0 = s ? vw[u][nt].z : vw[u][nt].x, b1 = s ? vw[u][nt].w : vw[u][nt].y;
                    uint32_t bh0, bl0, bh1, bl1;
                    if constexpr (WLO) {
                        nw_split(b0, bh0, bl0);
                        nw_split(b1, bh1, bl1);
                    } else {
                        bh0 = __float_as_uint(b0), bh1 = __float_as_uint(b1), bl0 = bl1 = 0;
                    }
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        nw_mma(acc[m][nt], al[m], bh0, bh1); /* small terms first */
                        if constexpr (WLO) nw_mma(acc[m][nt], ah[m], bl0, bl1);
                        nw_mma(acc[m][nt], ah[m], bh0, bh1);
                    }
                }
            }
    }
    /* C of tile m: (g, 2 tig) (g, 2 tig + 1) (g + 8, 2 tig) (g + 8, 2 tig + 1) of each 8 outputs */
    const int wq = warp & 3;
    if (warp >= 4) {
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                *(float2 *)&red[wq][16 * m + g][8 * nt + 2 * tig] = make_float2(acc[m][nt][0], acc[m][nt][1]);
                *(float2 *)&red[wq][16 * m + g + 8][8 * nt + 2 * tig] = make_float2(acc[m][nt][2], acc[m][nt][3]);
            }
    }
    __syncthreads();
    if (warp < 4) {
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                float2 *p0 = (float2 *)&red[wq][16 * m + g][8 * nt + 2 * tig];
                float2 *p1 = (float2 *)&red[wq][16 * m + g + 8][8 * nt + 2 * tig];
                const float2 q0 = *p0, q1 = *p1;
                *p0 = make_float2(acc[m][nt][0] + q0.x, acc[m][nt][1] + q0.y);
                *p1 = make_float2(acc[m][nt][2] + q1.x, acc[m][nt][3] + q1.y);
            }
    }
    __syncthreads();
    /* thread i: token rows i / 16 + 16 j, outputs 4 (i % 16) .. + 3, the four sums in order */
#pragma unroll
    for (int j = 0; j < MT; j++) {
        const int r = (threadIdx.x >> 4) + 16 * j, col = 4 * (threadIdx.x & 15);
        float4 v = *(const float4 *)&red[0][r][col];
#pragma unroll
        for (int w = 1; w < NW_WARPS / 2; w++) {
            const float4 p = *(const float4 *)&red[w][r][col];
            v.x += p.x, v.y += p.y, v.z += p.z, v.w += p.w;
        }
        const int t = t0 + r, n = n0 + col;
        if (t >= T) continue;
        float *yr = y + (size_t)t * out;
        const float vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (n + q < out) yr[n + q] = vv[q];
    }
}

/* MT = 2 where MT = 1 would make more blocks than two waves of the GPU's SMs */
template <int TY>
static cudaError_t launch_narrow(const void *w, int64_t in, int64_t out, const float *x, int64_t T, float *y,
                                 cudaStream_t s) {
    const unsigned gx = (unsigned)((out + NW_TN - 1) / NW_TN);
    const size_t rb = ggml_row_bytes(TY, in);
    if ((int64_t)gx * ((T + 15) / 16) > 2 * (int64_t)mlacu_sm_count()) {
        mlacu_launch(narrow_kernel<TY, 2>, dim3(gx, (unsigned)((T + 31) / 32)), NW_WARPS * 32, 0, s,
                     (const uint8_t *)w, rb, (int)in, (int)out, x, (int)T, y);
    } else {
        mlacu_launch(narrow_kernel<TY, 1>, dim3(gx, (unsigned)((T + 15) / 16)), NW_WARPS * 32, 0, s,
                     (const uint8_t *)w, rb, (int)in, (int)out, x, (int)T, y);
    }
    return cudaGetLastError();
}

} // namespace mlacu

using namespace mlacu;

extern "C" bool mla_cuda_narrow_supported(uint32_t t, int64_t in, int64_t out) {
    return (t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16) && in > 0 && in % 128 == 0 &&
           out > 0 && out <= MLACU_GV_FLOAT_OUT;
}

extern "C" int mla_cuda_matmul_narrow(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x,
                                      int64_t T, float *d_y, mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, T);
    if (T == 0) return MLA_OK;
    /* the shapes it does not take, and x or W off the 16-byte alignment of its loads: the split
     * bf16 tensor cores, as accurate (hi/lo, three MMAs) */
    if (!mla_cuda_narrow_supported(t, in, out) || ((uintptr_t)d_x & 15) || ((uintptr_t)d_w & 15))
        return mla_cuda_matmul_mma3(t, d_w, in, out, d_x, T, d_y, stream, e);
    cudaStream_t s = (cudaStream_t)stream;
    /* launches of at most 65535 blocks of 16 tokens (the grid's y) */
    const int64_t most = (int64_t)65535 * 16;
    for (int64_t t0 = 0; t0 < T; t0 += most) {
        const int64_t n = T - t0 < most ? T - t0 : most;
        const float *x = d_x + t0 * in;
        float *y = d_y + t0 * out;
        const cudaError_t err = t == GGML_TYPE_F32 ? launch_narrow<GGML_TYPE_F32>(d_w, in, out, x, n, y, s)
                                : t == GGML_TYPE_F16 ? launch_narrow<GGML_TYPE_F16>(d_w, in, out, x, n, y, s)
                                                     : launch_narrow<GGML_TYPE_BF16>(d_w, in, out, x, n, y, s);
        MLACU_CHECK(err, e, "narrow matmul %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out, (long long)in,
                    (long long)T);
    }
    return MLA_OK;
}
