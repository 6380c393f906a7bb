/* head_cuda: the per-head matmuls of absorbed MLA (float, fp16 and Q8_0 weights; GEMVs for
 * decode steps, tensor cores for prompts; the Q8_0 GEMV that also combines the attention's
 * splits). API and meaning: kernels/cuda_ops.h. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda_internal.h"
#include "kernels/head_wg_cuda.h" /* the prompt kernel, where MLA_CUDA_WGMMA */

namespace {

/* ---------------------------------------------------------------- per-head float matmul */

/* One warp per (output, head), the row in registers, every token in turn (decode steps). */
template <typename WT>
__global__ void head_matmul_kernel(const WT *__restrict__ W, int in, int out, const float *__restrict__ x,
                                   int64_t xt, int64_t xh, int T, float *__restrict__ y, int64_t yt, int64_t yh) {
    mlacu_pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.y, o = blockIdx.x * (blockDim.x >> 5) + warp;
    if (o >= out) return;
    const WT *wr = W + ((int64_t)h * out + o) * in;
    float wv[32];
#pragma unroll
    for (int i = 0; i < 32; i++) {
        int c = lane + 32 * i;
        wv[i] = c < in ? to_f32(wr[c]) : 0.f;
    }
    for (int t = 0; t < T; t++) {
        const float *xr = x + t * xt + h * xh;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            int c = lane + 32 * i;
            if (c < in) s = fmaf(wv[i], xr[c], s);
        }
        s = wsum(s);
        if (lane == 0) y[t * yt + h * yh + o] = s;
    }
}

/* The q8 rounding of a head GEMV block's rows o0 .. o0 + 32 UPB - 1 of head h for each of the T
 * tokens (after a barrier over the block's stores of y): a warp a 32-row unit, into yq (int8
 * rows) and ys (their unit scales), as mla_cuda_quantize_q8 of y gives them. */
__device__ __forceinline__ void head_round_units(int UPB, const float *y, int64_t yt, int64_t yh, int h, int o0, int out,
                                                 int T, int8_t *yq, float4 *ys) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int u = warp; u < UPB * T; u += (int)(blockDim.x >> 5)) { /* token u / UPB, unit u % UPB */
        const int o = o0 + (u % UPB) * 32;
        if (o >= out) continue;
        const int64_t i = (u / UPB) * yt + h * yh + o;
        const float v[1] = {y[i + lane]};
        mlacu_q8_units_warp<1>(v, yq + i, ys + i / 32, 32, 1);
    }
}

/* Decode steps (T <= 8) with fp16 weights of rows of IN halves: a block = 64 output rows of one
 * head (8 per warp), x of the head staged in shared memory; G lanes share a row (min(32, IN / 8),
 * or 8 where that does not divide a warp: GLM-5's 192), each taking 16-byte chunks, and every lane
 * issues all its loads before it computes. yq (NULL, or y's q8 int8 rows, ys their unit scales;
 * out % 32 == 0): the block then rounds its two 32-row units of each token too. */
template <int IN, int G = (IN / 8 < 32 ? IN / 8 : 32)>
__global__ void __launch_bounds__(256) head_gemv_f16_kernel(const __half *__restrict__ W, int out,
                                                            const float *__restrict__ x, int64_t xt, int64_t xh, int T,
                                                            float *__restrict__ y, int64_t yt, int64_t yh,
                                                            int8_t *__restrict__ yq, float4 *__restrict__ ys) {
    constexpr int CPR = IN / 8, RPW = 32 / G, NP = 8 / RPW, NJ = CPR / G;
    static_assert(IN % 8 == 0 && 32 % G == 0 && CPR % G == 0 && 8 % RPW == 0, "head GEMV shape");
    __shared__ __align__(16) float xs[8 * IN];
    const int h = blockIdx.y, o0 = blockIdx.x * 64, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int sub = lane / G, gl = lane % G;
    /* the weights (no kernel writes them) are loaded while the kernel before finishes
     * (programmatic launch); x after it */
    uint4 w[NP][NJ];
#pragma unroll
    for (int p = 0; p < NP; p++) {
        const int o = o0 + warp * 8 + p * RPW + sub;
#pragma unroll
        for (int j = 0; j < NJ; j++)
            w[p][j] = o < out ? __ldg((const uint4 *)(W + ((int64_t)h * out + o) * IN + (gl + G * j) * 8))
                              : make_uint4(0u, 0u, 0u, 0u);
    }
    mlacu_pdl_enter();
    for (int i = threadIdx.x; i < T * IN; i += 256) xs[i] = x[(i / IN) * xt + h * xh + i % IN];
    __syncthreads();
#pragma unroll
    for (int p = 0; p < NP; p++) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const __half2 *wh = (const __half2 *)&w[p][j];
            float wf[8];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                float2 f = __half22float2(wh[q]);
                wf[2 * q] = f.x;
                wf[2 * q + 1] = f.y;
            }
            const int c = (gl + G * j) * 8;
#pragma unroll
            for (int t = 0; t < 8; t++) {
                if (t >= T) break;
                const float4 a = *(const float4 *)(xs + t * IN + c), b = *(const float4 *)(xs + t * IN + c + 4);
                acc[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y + wf[6] * b.z +
                          wf[7] * b.w;
            }
        }
        const int o = o0 + warp * 8 + p * RPW + sub;
#pragma unroll
        for (int t = 0; t < 8; t++) {
            if (t >= T) break;
            float v = acc[t];
#pragma unroll
            for (int off = G / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            if (gl == 0 && o < out) y[t * yt + h * yh + o] = v;
        }
    }
    if (!yq) return;
    __syncthreads(); /* the block's rows of y are stored (and visible to the block) */
    head_round_units(2, y, yt, yh, h, o0, out, T, yq, ys);
}

/* Decode steps (T <= 8) with Q8_0 weights as the GGUF holds them (a row of IN elements: NB = IN / 32
 * blocks of 34 bytes, an fp16 scale d then 32 int8 q): half the bytes of the fp16 copy. A block
 * = hq_shape<IN>::ROWS output rows of one head, copied into shared memory before the wait on the kernel
 * before (no kernel writes weights), the head's x staged after it. LPR lanes share a row (NB
 * rounded up to a power of two), lane gl taking the row's blocks gl, gl + LPR, ...; a block's 8
 * groups of 4 elements are walked from group gl on, so that the lanes of a row read x from
 * different banks. y = sum over the row's blocks of d * (sum of q x), in fp32. yq: as
 * head_gemv_f16_kernel (its 32-row units rounded by the block). */
template <int IN> struct hq_shape {
    static constexpr int NB = IN / 32, RB = NB * 34;
    static constexpr int LPR = NB <= 1 ? 1 : NB <= 2 ? 2 : NB <= 4 ? 4 : NB <= 8 ? 8 : NB <= 16 ? 16 : 32;
    static constexpr int RPW = 32 / LPR, BPL = (NB + LPR - 1) / LPR;
    static constexpr int ROWS = 8 * RPW > 64 ? 8 * RPW : IN > 256 ? 32 : 64; /* a block's rows */
    static constexpr int PASSES = ROWS / (8 * RPW);
    static_assert(IN % 32 == 0 && NB <= 32 && ROWS % 32 == 0 && PASSES >= 1 && (ROWS * RB) % 16 == 0, "head q8 shape");
};
/* The block's rows r = p 8 RPW + warp RPW + sub of ws (passes p < np; row o0 + r of head h's
 * out) dotted with the T rows of xs, y stored (lane gl == 0 of each row's LPR lanes). NT: the
 * tokens the kernel is built for, 8 or 1 (a decode step of one token runs this code once a launch,
 * cold: built without the other tokens' sums, the same arithmetic). */
template <int IN, int NT>
__device__ __forceinline__ void hq_rows(const uint8_t *ws, const float *xs, int np, int o0, int out, int h, int T,
                                        float *__restrict__ y, int64_t yt, int64_t yh) {
    using S = hq_shape<IN>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sub = lane / S::LPR, gl = lane % S::LPR;
#pragma unroll
    for (int p = 0; p < np; p++) {
        const int r = p * 8 * S::RPW + warp * S::RPW + sub; /* the block's row */
        float acc[NT] = {};
#pragma unroll
        for (int j = 0; j < S::BPL; j++) {
            const int b = gl + S::LPR * j;
            if (b >= S::NB) break;
            const uint8_t *blk = ws + r * S::RB + b * 34;
            const float d = __half2float(*(const __half *)blk);
            float part[NT] = {};
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int g = (k + gl) & 7; /* elements 4g .. 4g + 3 of the block */
                const uint16_t lo = *(const uint16_t *)(blk + 2 + 4 * g), hi = *(const uint16_t *)(blk + 4 + 4 * g);
                const float q0 = (float)(int8_t)(lo & 0xff), q1 = (float)(int8_t)(lo >> 8);
                const float q2 = (float)(int8_t)(hi & 0xff), q3 = (float)(int8_t)(hi >> 8);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= T) break;
                    const float4 a = *(const float4 *)(xs + t * IN + b * 32 + 4 * g);
                    part[t] += q0 * a.x + q1 * a.y + q2 * a.z + q3 * a.w;
                }
            }
#pragma unroll
            for (int t = 0; t < NT; t++) acc[t] += d * part[t];
        }
        const int o = o0 + r;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= T) break;
            float v = acc[t];
#pragma unroll
            for (int off = S::LPR / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            if (gl == 0 && o < out) y[t * yt + h * yh + o] = v;
        }
    }
}

/* the queries' k_pe rotation k_b may do (mla_cuda_head_matmul_q8_rope): none where qpe is NULL */
struct hq_rope {
    mlacu_rope_k<MLA_CUDA_ROPE_ARG_DIMS> rk;
    float *qpe;
    int64_t qpe_t, qpe_h;
    const int32_t *pos;
};
template <int IN, int NT>
__global__ void __launch_bounds__(256) head_gemv_q8_kernel(const uint8_t *__restrict__ W, int out,
                                                           const float *__restrict__ x, int64_t xt, int64_t xh, int T,
                                                           float *__restrict__ y, int64_t yt, int64_t yh,
                                                           int8_t *__restrict__ yq, float4 *__restrict__ ys,
                                                           const __grid_constant__ hq_rope rp) {
    using S = hq_shape<IN>;
    __shared__ __align__(16) uint8_t ws[S::ROWS * S::RB];
    __shared__ __align__(16) float xs[8 * IN];
    __shared__ uint64_t bar;
    const int h = blockIdx.y, o0 = blockIdx.x * S::ROWS;
    /* the block's rows (contiguous, 16-byte aligned: the host checks W, ROWS RB is a multiple of
     * 16) by one bulk copy, before the wait: a weight. Loads by every thread drain from an SM far
     * slower than a bulk copy does. */
    if (threadIdx.x == 0) {
        mlacu_mbar_init(&bar, 1);
        mlacu_mbar_init_fence();
        mlacu_mbar_expect(&bar, S::ROWS * S::RB);
        mlacu_bulk_g2s_once(ws, W + ((size_t)h * out + o0) * S::RB, S::ROWS * S::RB, &bar);
    }
    mlacu_pdl_wait();
    for (int i = threadIdx.x; i < T * IN; i += 256) xs[i] = x[(i / IN) * xt + h * xh + i % IN];
    __syncthreads();
    mlacu_mbar_wait(&bar, 0);
    /* the next kernel is scheduled once x is in (v_b is followed by the attention output's
     * streamed GEMV, whose first copies would otherwise queue ahead of these loads) */
    mlacu_pdl_trigger();
    hq_rows<IN, NT>(ws, xs, S::PASSES, o0, out, h, T, y, yt, yh);
    if (rp.qpe && (int)blockIdx.x < T) { /* head h's k_pe of token t, by the head's blocks t mod gridDim.x */
        __shared__ float tcs[MLA_CUDA_ROPE_ARG_DIMS / 2], tsn[MLA_CUDA_ROPE_ARG_DIMS / 2];
        for (int t = blockIdx.x; t < T; t += gridDim.x) {
            mlacu_rope_token(rp.rk, ROPE_ADJACENT, rp.qpe + t * rp.qpe_t + h * rp.qpe_h, 1, rp.rk.n_dims, rp.pos[t], tcs,
                             tsn);
            __syncthreads(); /* tcs / tsn are the next token's */
        }
    }
    if (!yq) return;
    __syncthreads(); /* the block's rows of y are stored (and visible to the block) */
    head_round_units(S::ROWS / 32, y, yt, yh, h, o0, out, T, yq, ys);
}

/* v_b over the attention's splits, not yet combined (mla_cuda_head_matmul_q8_comb): block (j, h)
 * = rows j rpb .. j rpb + rpb - 1 of head h (their weights by one bulk copy into dynamic shared
 * memory before the wait), its x the combine of the ns splits' partials of each token (work rows
 * [t][h][split] of IN + 2: maximum in natural units, sum, then the unnormalized output), as
 * mla_attn_reduce_kernel forms it: x = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s. The first
 * splits' columns are loaded with the maxima and sums, before their reduction. */
/* splits at most (a lane each: one warp reads a token's maxima and sums); a thread's column loads
 * in flight */
constexpr int HQ_COMB_MAXS = MLA_CUDA_HEAD_COMB_MAXS, HQ_COMB_SB = 16;
static_assert(HQ_COMB_MAXS <= 32, "a warp a token's splits");
/* the combine kernel's static shared memory (xs, ew, inv, the barrier), rounded up */
constexpr size_t hq_comb_static(int64_t in) { return (size_t)(8 * in + 8 * HQ_COMB_MAXS + 8) * 4 + 64; }
template <int IN, int NT>
__global__ void __launch_bounds__(256) head_gemv_q8_comb_kernel(const uint8_t *__restrict__ W, int out, int rpb,
                                                                const float *__restrict__ work, int H, int ns, int T,
                                                                float *__restrict__ y, int64_t yt, int64_t yh,
                                                                int8_t *__restrict__ yq, float4 *__restrict__ ys) {
    using S = hq_shape<IN>;
    static_assert(IN % 2 == 0 && IN / 2 <= 256, "head q8 combine shape");
    extern __shared__ __align__(16) uint8_t hq_sm[];
    __shared__ __align__(16) float xs[8 * IN];
    __shared__ float ew[8 * HQ_COMB_MAXS], inv[8]; /* exp(m_s - M) of token t, split s; 1 / sum */
    __shared__ uint64_t bar;
    const int h = blockIdx.y, o0 = blockIdx.x * rpb, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint32_t wb = (uint32_t)rpb * S::RB;
    if (tid == 0) {
        mlacu_mbar_init(&bar, 1);
        mlacu_mbar_init_fence();
        mlacu_mbar_expect(&bar, wb);
        mlacu_bulk_g2s_once(hq_sm, W + ((size_t)h * out + o0) * S::RB, wb, &bar);
    }
    mlacu_pdl_wait();
    const int64_t ld = IN + 2;
    /* item i: token i / (IN / 2), columns 2 (i % (IN / 2)) + {0, 1} */
    constexpr int CP = IN / 2;
    float2 v[HQ_COMB_SB];
    auto load_cols = [&](int i, int s0) {
        const float *w = work + (((int64_t)(i / CP) * H + h) * ns) * ld + 2 + 2 * (i % CP);
#pragma unroll
        for (int u = 0; u < HQ_COMB_SB; u++)
            v[u] = s0 + u < ns ? *(const float2 *)(w + (int64_t)(s0 + u) * ld) : make_float2(0.f, 0.f);
    };
    if (tid < T * CP) load_cols(tid, 0);
    if (warp < T) { /* token warp: its splits' maxima and sums (a lane a split) */
        const float *w = work + ((int64_t)warp * H + h) * ns * ld;
        const float m = lane < ns ? w[lane * ld] : -INFINITY, l = lane < ns ? w[lane * ld + 1] : 0.f;
        float M = m;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        const float e = m == -INFINITY ? 0.f : __expf(m - M);
        float den = l * e;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
        ew[warp * HQ_COMB_MAXS + lane] = e;
        if (lane == 0) inv[warp] = den > 0.f ? 1.f / den : 0.f;
    }
    __syncthreads();
    for (int i = tid; i < T * CP; i += 256) {
        const int t = i / CP;
        if (i != tid) load_cols(i, 0);
        float2 acc = make_float2(0.f, 0.f);
        for (int s0 = 0; s0 < ns; s0 += HQ_COMB_SB) {
            if (s0 > 0) load_cols(i, s0);
#pragma unroll
            for (int u = 0; u < HQ_COMB_SB; u++) {
                const float e = s0 + u < ns ? ew[t * HQ_COMB_MAXS + s0 + u] : 0.f;
                acc.x = fmaf(v[u].x, e, acc.x);
                acc.y = fmaf(v[u].y, e, acc.y);
            }
        }
        *(float2 *)(xs + t * IN + 2 * (i % CP)) = make_float2(acc.x * inv[t], acc.y * inv[t]);
    }
    __syncthreads();
    mlacu_mbar_wait(&bar, 0);
    mlacu_pdl_trigger();
    hq_rows<IN, NT>(hq_sm, xs, rpb / (8 * S::RPW), o0, out, h, T, y, yt, yh);
    if (!yq) return;
    __syncthreads();
    head_round_units(rpb / 32, y, yt, yh, h, o0, out, T, yq, ys);
}

/* Steps of many tokens with fp16 weights: per head, Y_h [T][out] = X_h [T][in] W_h^T on fp16
 * mma.sync (fp32 accumulation; x rounded to fp16 as it is staged). Block = 64 tokens x 64
 * outputs of one head, 4 warps of 32 x 32, K in chunks of 32 (in % 32 == 0, x's strides % 4). */
constexpr int HM_B = 64, HM_K = 32, HM_LD = HM_K + 8; /* 80-byte rows: ldmatrix without conflicts */
__global__ void __launch_bounds__(128) head_mma_kernel(const __half *__restrict__ W, int in, int out,
                                                       const float *__restrict__ x, int64_t xt, int64_t xh, int T,
                                                       float *__restrict__ y, int64_t yt, int64_t yh) {
    mlacu_pdl_enter();
    __shared__ __align__(16) __half As[HM_B * HM_LD], Bs[HM_B * HM_LD];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c4 = lane & 3;
    const int wm = warp >> 1, wn = warp & 1;
    const int o0 = blockIdx.x * HM_B, t0 = blockIdx.y * HM_B, h = blockIdx.z;
    const __half *Wh = W + (int64_t)h * out * in;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int n = 0; n < 4; n++) acc[i][n][0] = acc[i][n][1] = acc[i][n][2] = acc[i][n][3] = 0.f;
    const uint32_t abase = (uint32_t)__cvta_generic_to_shared(As + (wm * 32 + (lane & 15)) * HM_LD + (lane >> 4) * 8);
    const uint32_t bbase = (uint32_t)__cvta_generic_to_shared(
        Bs + (wn * 32 + (lane & 7) + ((lane >> 4) << 3)) * HM_LD + ((lane >> 3) & 1) * 8);
    for (int k0 = 0; k0 < in; k0 += HM_K) {
        __syncthreads();
#pragma unroll
        for (int u = 0; u < 4; u++) { /* x: 64 rows x 32 floats, 4 float4 per thread */
            const int i = tid + u * 128, r = i >> 3, c = (i & 7) * 4, t = t0 + r;
            float4 v = t < T ? *(const float4 *)(x + t * xt + h * xh + k0 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
            __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
            *(uint2 *)(As + r * HM_LD + c) = make_uint2(*(uint32_t *)&lo, *(uint32_t *)&hi);
        }
#pragma unroll
        for (int u = 0; u < 2; u++) { /* W: 64 rows x 32 halves, 2 x 16 bytes per thread */
            const int i = tid + u * 128, r = i >> 2, c = (i & 3) * 8, o = o0 + r;
            uint4 v = o < out ? *(const uint4 *)(Wh + (int64_t)o * in + k0 + c) : make_uint4(0u, 0u, 0u, 0u);
            *(uint4 *)(Bs + r * HM_LD + c) = v;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < HM_K / 16; kk++) {
            uint32_t A[2][4], B[2][4];
#pragma unroll
            for (int i = 0; i < 2; i++) mlacu_ldsm_x4(A[i], abase + (i * 16 * HM_LD + kk * 16) * 2);
#pragma unroll
            for (int j = 0; j < 2; j++) mlacu_ldsm_x4(B[j], bbase + (j * 16 * HM_LD + kk * 16) * 2);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    mlacu_mma_f16(acc[i][2 * j], A[i], B[j][0], B[j][1]);
                    mlacu_mma_f16(acc[i][2 * j + 1], A[i], B[j][2], B[j][3]);
                }
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = t0 + wm * 32 + i * 16 + g + 8 * r;
            if (t >= T) continue;
#pragma unroll
            for (int n = 0; n < 4; n++) {
                const int o = o0 + wn * 32 + n * 8 + 2 * c4;
                float *yr = y + t * yt + h * yh;
                if (o < out) yr[o] = acc[i][n][2 * r];
                if (o + 1 < out) yr[o + 1] = acc[i][n][2 * r + 1];
            }
        }
}

} // namespace

/* ================================================================ host API */

extern "C" int mla_cuda_head_matmul(const float *d_w, int64_t H, int64_t in, int64_t out, const float *d_x,
                                    int64_t xt, int64_t xh, int64_t T, float *d_y, int64_t yt, int64_t yh,
                                    mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(in > 0 && in <= 1024 && out > 0 && H > 0 && H <= 65535);
    if (T == 0) return MLA_OK;
    dim3 grid((unsigned)((out + 7) / 8), (unsigned)H);
    mlacu_launch(head_matmul_kernel<float>, grid, 256, 0, (cudaStream_t)stream, d_w, (int)in, (int)out, d_x, xt, xh,
                 (int)T, d_y, yt, yh);
    MLACU_CHECK(cudaGetLastError(), e, "head_matmul H=%lld %lldx%lld T=%lld", (long long)H, (long long)out,
                (long long)in, (long long)T);
    return MLA_OK;
}

/* Where a head GEMV kernel rounds y into d_yq itself: *q, *qs its int8 rows and unit scales for
 * T rows of yt; else (no d_yq) both NULL. */
static void head_yq(void *d_yq, int64_t T, int64_t yt, int8_t **q, float4 **qs) {
    void *kq = d_yq;
    *q = (int8_t *)kq;
    *qs = kq ? (float4 *)((uint8_t *)kq + mlacu_q8_scale_off(T, yt)) : nullptr;
}

static int g_hwg_mode = 1; /* mla_cuda_head_wg */
/* prompt-sized steps on the warpgroup kernel; fewer tokens stay on mma.sync */
constexpr int64_t HWG_MIN_TOKENS = 64;

extern "C" void mla_cuda_head_wg(int mode) {
    MLA_ASSERT(mode == 0 || mode == 1);
    g_hwg_mode = mode;
}

extern "C" int mla_cuda_head_wg_ok(void) {
#ifdef MLA_CUDA_WGMMA
    return mlacu_hwg_device_ok();
#else
    return 0;
#endif
}

extern "C" int mla_cuda_head_matmul_f16(const void *d_w, int64_t H, int64_t in, int64_t out, const float *d_x,
                                        int64_t xt, int64_t xh, int64_t T, float *d_y, int64_t yt, int64_t yh,
                                        void *d_yq, mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(in > 0 && in <= 1024 && out > 0 && H > 0 && H <= 65535);
    MLA_ASSERT(!d_yq || (out % 32 == 0 && yh == out && yt == H * yh && ((uintptr_t)d_yq & 15) == 0));
    if (T == 0) return MLA_OK;
    cudaStream_t st = (cudaStream_t)stream;
    bool yq_done = false; /* the kernel rounded y into d_yq */
#ifdef MLA_CUDA_WGMMA
    const mlacu_hwg_args hw = {(const __half *)d_w, d_x, xt, xh, d_y, yt, yh, (int)T, (int)H, (int)in, (int)out};
    if (g_hwg_mode && T >= HWG_MIN_TOKENS && T <= INT32_MAX && mlacu_hwg_takes(&hw)) {
        MLACU_CHECK(mlacu_hwg_launch(&hw, st), e, "head_matmul (fp16, wgmma) H=%lld %lldx%lld T=%lld", (long long)H,
                    (long long)out, (long long)in, (long long)T);
        return d_yq ? mla_cuda_quantize_q8(d_y, T, yt, d_yq, stream, e) : MLA_OK;
    }
#endif
    if (T > 8 && in % HM_K == 0 && xt % 4 == 0 && xh % 4 == 0 && ((uintptr_t)d_x & 15) == 0 && T <= 65535 * HM_B) {
        dim3 grid((unsigned)((out + HM_B - 1) / HM_B), (unsigned)((T + HM_B - 1) / HM_B), (unsigned)H);
        mlacu_launch(head_mma_kernel, grid, 128, 0, st, (const __half *)d_w, (int)in, (int)out, d_x, xt, xh, (int)T,
                     d_y, yt, yh);
    } else if (T <= 8 && (in == 64 || in == 128 || in == 192 || in == 256 || in == 512)) {
        dim3 grid((unsigned)((out + 63) / 64), (unsigned)H);
        const __half *w = (const __half *)d_w;
        int8_t *q;
        float4 *qs;
        head_yq(d_yq, T, yt, &q, &qs);
        auto go = [&](auto kern) {
            mlacu_launch(kern, grid, 256, 0, st, w, (int)out, d_x, xt, xh, (int)T, d_y, yt, yh, q, qs);
        };
        if (in == 64) go(head_gemv_f16_kernel<64>);
        else if (in == 128) go(head_gemv_f16_kernel<128>);
        else if (in == 192) go(head_gemv_f16_kernel<192, 8>);
        else if (in == 256) go(head_gemv_f16_kernel<256>);
        else go(head_gemv_f16_kernel<512>);
        yq_done = q != NULL;
    } else {
        dim3 grid((unsigned)((out + 7) / 8), (unsigned)H);
        mlacu_launch(head_matmul_kernel<__half>, grid, 256, 0, st, (const __half *)d_w, (int)in, (int)out, d_x, xt, xh,
                     (int)T, d_y, yt, yh);
    }
    MLACU_CHECK(cudaGetLastError(), e, "head_matmul (fp16) H=%lld %lldx%lld T=%lld", (long long)H, (long long)out,
                (long long)in, (long long)T);
    return d_yq && !yq_done ? mla_cuda_quantize_q8(d_y, T, yt, d_yq, stream, e) : MLA_OK;
}

/* the rows a block of head_gemv_q8_kernel takes for rows of `in` elements; 0: no kernel */
static int head_q8_rows(int64_t in) {
    switch (in) {
    case 64: return hq_shape<64>::ROWS;
    case 128: return hq_shape<128>::ROWS;
    case 192: return hq_shape<192>::ROWS;
    case 256: return hq_shape<256>::ROWS;
    case 512: return hq_shape<512>::ROWS;
    default: return 0;
    }
}

extern "C" bool mla_cuda_head_q8_supported(int64_t in, int64_t out) {
    const int rows = head_q8_rows(in);
    return rows > 0 && out > 0 && out % rows == 0;
}

static int head_q8_launch(const void *d_w, int64_t H, int64_t in, int64_t out, const float *d_x, int64_t xt,
                          int64_t xh, int64_t T, float *d_y, int64_t yt, int64_t yh, void *d_yq, const hq_rope &rp,
                          mla_cuda_stream stream, mla_err *e);

extern "C" int mla_cuda_head_matmul_q8(const void *d_w, int64_t H, int64_t in, int64_t out, const float *d_x,
                                       int64_t xt, int64_t xh, int64_t T, float *d_y, int64_t yt, int64_t yh,
                                       void *d_yq, mla_cuda_stream stream, mla_err *e) {
    const hq_rope rp = {};
    return head_q8_launch(d_w, H, in, out, d_x, xt, xh, T, d_y, yt, yh, d_yq, rp, stream, e);
}

extern "C" int mla_cuda_head_matmul_q8_rope(const void *d_w, int64_t H, int64_t in, int64_t out, const float *d_x,
                                            int64_t xt, int64_t xh, int64_t T, float *d_y, int64_t yt, int64_t yh,
                                            const rope_table *t, float *d_qpe, int64_t qpe_t, int64_t qpe_h,
                                            const int32_t *d_pos, mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(t->n_dims > 0 && t->n_dims <= MLA_CUDA_ROPE_ARG_DIMS && d_qpe && d_pos);
    const hq_rope rp = {mlacu_rope_args<MLA_CUDA_ROPE_ARG_DIMS>(t), d_qpe, qpe_t, qpe_h, d_pos};
    return head_q8_launch(d_w, H, in, out, d_x, xt, xh, T, d_y, yt, yh, NULL, rp, stream, e);
}

static int head_q8_launch(const void *d_w, int64_t H, int64_t in, int64_t out, const float *d_x, int64_t xt,
                          int64_t xh, int64_t T, float *d_y, int64_t yt, int64_t yh, void *d_yq, const hq_rope &rp,
                          mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(mla_cuda_head_q8_supported(in, out) && T >= 0 && T <= 8 && H > 0 && H <= 65535);
    MLA_ASSERT(((uintptr_t)d_w & 15) == 0);
    MLA_ASSERT(!d_yq || (out % 32 == 0 && yh == out && yt == H * yh && ((uintptr_t)d_yq & 15) == 0));
    if (T == 0) return MLA_OK;
    cudaStream_t st = (cudaStream_t)stream;
    int8_t *q;
    float4 *qs;
    head_yq(d_yq, T, yt, &q, &qs);
    const dim3 grid((unsigned)(out / head_q8_rows(in)), (unsigned)H);
    const uint8_t *w = (const uint8_t *)d_w;
    auto go = [&](auto kern) {
        mlacu_launch(kern, grid, 256, 0, st, w, (int)out, d_x, xt, xh, (int)T, d_y, yt, yh, q, qs, rp);
    };
    const bool one = T == 1; /* the kernel built for one token */
    if (in == 64) one ? go(head_gemv_q8_kernel<64, 1>) : go(head_gemv_q8_kernel<64, 8>);
    else if (in == 128) one ? go(head_gemv_q8_kernel<128, 1>) : go(head_gemv_q8_kernel<128, 8>);
    else if (in == 192) one ? go(head_gemv_q8_kernel<192, 1>) : go(head_gemv_q8_kernel<192, 8>);
    else if (in == 256) one ? go(head_gemv_q8_kernel<256, 1>) : go(head_gemv_q8_kernel<256, 8>);
    else one ? go(head_gemv_q8_kernel<512, 1>) : go(head_gemv_q8_kernel<512, 8>);
    MLACU_CHECK(cudaGetLastError(), e, "head_matmul (Q8_0) H=%lld %lldx%lld T=%lld", (long long)H, (long long)out,
                (long long)in, (long long)T);
    return d_yq && !q ? mla_cuda_quantize_q8(d_y, T, yt, d_yq, stream, e) : MLA_OK;
}

extern "C" bool mla_cuda_head_q8_comb_supported(int64_t in, int64_t out, int64_t T, int n_splits) {
    if ((in != 256 && in != 512) || !mla_cuda_head_q8_supported(in, out) || T < 1 || T > 8 || n_splits < 2 ||
        n_splits > HQ_COMB_MAXS)
        return false;
    const size_t wb = (size_t)out * (size_t)(in / 32 * 34);
    return wb % 16 == 0 && wb + hq_comb_static(in) <= (size_t)mlacu_smem_optin();
}

extern "C" int mla_cuda_head_matmul_q8_comb(const void *d_w, int64_t H, int64_t in, int64_t out, const float *d_work,
                                            int n_splits, int64_t T, float *d_y, int64_t yt, int64_t yh, void *d_yq,
                                            mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(mla_cuda_head_q8_comb_supported(in, out, T, n_splits) && H > 0 && H <= 65535);
    MLA_ASSERT(((uintptr_t)d_w & 15) == 0 && ((uintptr_t)d_work & 7) == 0);
    MLA_ASSERT(!d_yq || (yh == out && yt == H * yh && ((uintptr_t)d_yq & 15) == 0));
    cudaStream_t st = (cudaStream_t)stream;
    int8_t *q;
    float4 *qs;
    head_yq(d_yq, T, yt, &q, &qs);
    /* blocks a head: the fewest (each combines the splits again) that, with a head's rows split
     * into runs of a multiple of 32, give 3/4 of the SMs a block */
    int nb = 1;
    while (4 * H * nb < 3 * mlacu_sm_count() && out % (64 * nb) == 0) nb *= 2;
    const int rpb = (int)(out / nb);
    const size_t smem = (size_t)rpb * (size_t)(in / 32 * 34);
    auto go = [&](auto kern, bool &attr) -> int {
        if (!attr) { /* all a block may have beside the static part: the check above bounds smem by it */
            MLACU_CHECK(mlacu_smem_allow(kern, mlacu_smem_optin() - (int)hq_comb_static(in)),
                        e, "head_matmul (Q8_0, splits combined): shared memory");
            attr = true;
        }
        mlacu_launch(kern, dim3((unsigned)nb, (unsigned)H), 256, smem, st, (const uint8_t *)d_w, (int)out, rpb, d_work,
                     (int)H, n_splits, (int)T, d_y, yt, yh, q, qs);
        return MLA_OK;
    };
    static bool attr[4] = {false, false, false, false}; /* [in 512][one token] */
    int r;
    if (in == 512) r = T == 1 ? go(head_gemv_q8_comb_kernel<512, 1>, attr[3]) : go(head_gemv_q8_comb_kernel<512, 8>, attr[2]);
    else r = T == 1 ? go(head_gemv_q8_comb_kernel<256, 1>, attr[1]) : go(head_gemv_q8_comb_kernel<256, 8>, attr[0]);
    if (r != MLA_OK) return MLA_ERR;
    MLACU_CHECK(cudaGetLastError(), e, "head_matmul (Q8_0, %d splits combined) H=%lld %lldx%lld T=%lld", n_splits,
                (long long)H, (long long)out, (long long)in, (long long)T);
    return d_yq && !q ? mla_cuda_quantize_q8(d_y, T, yt, d_yq, stream, e) : MLA_OK;
}
