/* ops_cuda: the small ops of a layer on the device: rmsnorm, layernorm, swiglu, add, rope,
 * embedding gather, MoE routing, greedy sampling. Each mirrors its CPU reference (see
 * kernels/cuda_ops.h for the exact correspondence). */
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>

#include "kernels/cuda_internal.h"
#include "kernels/rmsnorm_row_cuda.h"

extern "C" {
#include "common/mla_switch.h"
#include "kernels/moe.h"
#include "kernels/rope.h"
}

namespace {
using namespace mlacu_rn;

/* block (t, j): row t, slice j of RN_KB RN_T elements (gridDim.y > 1: rows of up to RN_T RN_V;
 * with ADD, xo is not x), or the whole row (gridDim.y 1). With ADD xo = x + res (rows of n,
 * ldx == n); with Q8 the q8 buffer of y (q: int8 [T][n], qs: its scales); with H16 (gridDim.y 1)
 * the fp16 buffer of y (h: fp16 [T][n], hs: its scales) */
template <bool ADD, bool Q8, bool H16>
__global__ void __launch_bounds__(RN_T) rmsnorm_kernel(const float *x, const float *__restrict__ res, float *xo,
                                                       int64_t ldx, int64_t n, const float *__restrict__ w, float eps,
                                                       float *y, int64_t ldy, int8_t *q, float4 *qs, __half *h,
                                                       float *hs, int bulk) {
    /* bulk: the row (and with ADD the residual's) copied into shared memory by the copy engine
     * (one bulk copy each) instead of every thread loading its elements: a few blocks read a
     * row each, and the loads of one SM drain far slower than its bulk copies */
    extern __shared__ __align__(16) float rn_sm[];
    __shared__ float red[32]; /* rms_row waits on the kernel before */
    __shared__ uint64_t bar;
    float *yr = y + blockIdx.x * ldy;
    int k0, k1;
    rn_slice((int)blockIdx.y, (int)gridDim.y, k0, k1);
    const float *xr = x + blockIdx.x * ldx, *rr = ADD ? res + blockIdx.x * n : nullptr;
    if (bulk) {
        if (threadIdx.x == 0) {
            mlacu_mbar_init(&bar, 1);
            mlacu_mbar_init_fence();
        }
        __syncthreads();
    }
    auto fetch = [&]() {
        if (threadIdx.x == 0) {
            const uint32_t b = (uint32_t)n * 4;
            mlacu_mbar_expect(&bar, ADD ? 2 * b : b);
            mlacu_bulk_g2s(rn_sm, xr, b, &bar);
            if (ADD) mlacu_bulk_g2s(rn_sm + n, rr, b, &bar);
        }
        mlacu_mbar_wait(&bar, 0);
    };
    auto st = [&](int i, float v) { yr[i] = v; };
    int8_t *qrow = Q8 ? q + blockIdx.x * n : nullptr;
    float4 *qsrow = Q8 ? qs + blockIdx.x * (n / 32) : nullptr;
    float *xorow = ADD ? xo + blockIdx.x * n : nullptr;
    __half *hrow = H16 ? h + blockIdx.x * n : nullptr;
    float *hsrow = H16 ? hs + blockIdx.x : nullptr;
    /* rms_row's PDL form (weights before the wait, the next kernel scheduled after the reduction)
     * only for a decode step's few rows: over many rows (prompts, decode batches of 128 and 256)
     * it cost 2-11% a step on an H200 (measured 2026-12-01), so those wait and
     * let the next kernel be scheduled at once */
    if (bulk) {
        rms_row<ADD, Q8, H16, true>(rn_sm, ADD ? rn_sm + n : nullptr, xorow, (int)n, w, eps, red, qrow, qsrow, hrow,
                                    hsrow, k0, k1, st, fetch);
    } else {
        mlacu_pdl_enter();
        rms_row<ADD, Q8, H16>(xr, rr, xorow, (int)n, w, eps, red, qrow, qsrow, hrow, hsrow, k0, k1, st);
    }
    if (threadIdx.x == 0) MLACU_TRACE_MARK(1);
}

/* One row's layer norm by the whole block (LN_T threads: the sums' order, so the same bits
 * wherever it runs): xr's n values, weights w and bias b (either NULL: none), into yr. */
constexpr int LN_T = 256;
__device__ __forceinline__ void ln_row(const float *__restrict__ xr, int64_t n, const float *__restrict__ w,
                                       const float *__restrict__ b, float eps, float *red, float *yr) {
    float s = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    float mean = block_sum(s, red) / (float)n;
    float v = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
    float var = block_sum(v, red) / (float)n;
    float r = 1.0f / sqrtf(var + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float o = (xr[i] - mean) * r;
        if (w) o *= w[i];
        if (b) o += b[i];
        yr[i] = o;
    }
}

__global__ void __launch_bounds__(LN_T) layernorm_kernel(const float *__restrict__ x, int64_t ldx, int64_t n,
                                                         const float *__restrict__ w, const float *__restrict__ b,
                                                         float eps, float *y, int64_t ldy) {
    mlacu_pdl_enter();
    __shared__ float red[32];
    ln_row(x + blockIdx.x * ldx, n, w, b, eps, red, y + blockIdx.x * ldy);
}

__global__ void swiglu_kernel(const float *g, const float *u, float *y, int64_t n) {
    mlacu_pdl_enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        y[i] = mlacu_swiglu(g[i], u[i]);
    }
}

__global__ void add_kernel(float *y, const float *a, int64_t n) {
    mlacu_pdl_enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += a[i];
}

using rope_k = mlacu_rope_k<ROPE_MAX_DIMS>;

/* block = one token; threads over (vector, pair) */
__global__ void rope_kernel(rope_k rk, int mode, float *x, int64_t n_vec, int64_t stride, int64_t tok_stride,
                            int64_t pos0, const int32_t *pos) {
    mlacu_pdl_enter();
    __shared__ float tcs[ROPE_MAX_DIMS / 2], tsn[ROPE_MAX_DIMS / 2]; /* this token's cos / sin per frequency */
    const int t = blockIdx.x;
    mlacu_rope_token(rk, mode, x + t * tok_stride, n_vec, stride, pos ? (int64_t)pos[t] : pos0 + t, tcs, tsn);
}

/* Token t's new cache row: its latent (kva row t, KL floats) normalized (weights nw), its k_pe
 * (the dr floats after it) rotated, both stored in its cache slot (position pos[t] through block
 * table tabs[t]). The whole block (RN_T threads) calls it after its wait on the kernel before. */
template <typename KT, typename RK>
__device__ __forceinline__ void kv_row_store(const RK &rk, const float *__restrict__ kva, int KL, int dr,
                                             const float *__restrict__ nw, float eps,
                                             const float *const *const *__restrict__ tabs, int64_t kv_off,
                                             const int32_t *__restrict__ pos, int t, float *red, float *tcs, float *tsn,
                                             float *pe) {
    const int row = KL + dr;
    KT *d = (KT *)paged_row_t<KT>(tabs[t], kv_off, row, pos[t]);
    const float *s = kva + (int64_t)t * row;
    rms_row<false, false, false>(s, nullptr, nullptr, KL, nw, eps, red, nullptr, nullptr, nullptr, nullptr, 0, RN_V,
                                 [&](int i, float v) { kv_store(d + i, v); });
    for (int i = threadIdx.x; i < dr; i += blockDim.x) pe[i] = s[KL + i]; /* k_pe rotated in shared memory */
    __syncthreads();
    mlacu_rope_token(rk, ROPE_ADJACENT, pe, 1, dr, pos[t], tcs, tsn);
    __syncthreads();
    for (int i = threadIdx.x; i < dr; i += blockDim.x) kv_store(d + KL + i, pe[i]);
}

/* The cache side of an MLA step (mla_cuda_mla_kv_rows), block (t, 0): token t's cache row
 * (kv_row_store); block (t, 1): token t's query k_pe rotated in place. RN_T threads. */
template <typename KT>
__global__ void __launch_bounds__(RN_T) mla_kv_rows_kernel(rope_k rk, const float *__restrict__ kva, int KL, int dr,
                                                           const float *__restrict__ nw, float eps,
                                                           const float *const *const *__restrict__ tabs,
                                                           int64_t kv_off, const int32_t *__restrict__ pos, float *q,
                                                           int64_t q_ld, int64_t n_head, int64_t head_ld) {
    mlacu_pdl_enter();
    __shared__ float red[32], tcs[ROPE_MAX_DIMS / 2], tsn[ROPE_MAX_DIMS / 2], pe[ROPE_MAX_DIMS];
    const int t = blockIdx.x;
    if (blockIdx.y == 1) {
        mlacu_rope_token(rk, ROPE_ADJACENT, q + t * q_ld, n_head, head_ld, pos[t], tcs, tsn);
        return;
    }
    kv_row_store<KT>(rk, kva, KL, dr, nw, eps, tabs, kv_off, pos, t, red, tcs, tsn, pe);
}

/* The indexer's cache side of a DSA step (mla_cuda_dsa_ik_rows), block (t, 0): token t's key row
 * layer-normalized into shared memory (ln_row), its first n_dims rotated, stored in its cache
 * slot; block (t, 1) (with queries): token t's indexer queries rotated in place and its head
 * weights scaled. LN_T threads. */
template <typename KT>
__global__ void __launch_bounds__(LN_T) dsa_ik_rows_kernel(rope_k rk, const float *__restrict__ ik, int D,
                                                           const float *__restrict__ nw, const float *__restrict__ nb,
                                                           float eps, const float *const *const *__restrict__ tabs,
                                                           int64_t ik_off, const int32_t *__restrict__ pos, float *q,
                                                           int n_head, float *hw, float wscale) {
    mlacu_pdl_enter();
    __shared__ float red[32], tcs[ROPE_MAX_DIMS / 2], tsn[ROPE_MAX_DIMS / 2], row[MLA_CUDA_IK_MAX];
    const int t = blockIdx.x;
    if (blockIdx.y == 1) {
        mlacu_rope_token(rk, ROPE_ADJACENT, q + (int64_t)t * n_head * D, n_head, D, pos[t], tcs, tsn);
        for (int h = threadIdx.x; h < n_head; h += blockDim.x) hw[(int64_t)t * n_head + h] *= wscale;
        return;
    }
    ln_row(ik + (int64_t)t * D, D, nw, nb, eps, red, row);
    __syncthreads();
    mlacu_rope_token(rk, ROPE_ADJACENT, row, 1, D, pos[t], tcs, tsn);
    __syncthreads();
    KT *d = (KT *)paged_row_t<KT>(tabs[t], ik_off, D, pos[t]);
    for (int i = threadIdx.x; i < D; i += blockDim.x) kv_store(d + i, row[i]);
}

/* mla_cuda_qnorm_kv_rows: blocks (t, j < slices) the q-LoRA norm of row t (slice j of RN_KB RN_T
 * elements when slices > 1, as rmsnorm_kernel without a residual), block (t, slices) token t's
 * cache row (kv_row_store). */
template <typename KT, bool Q8>
__global__ void __launch_bounds__(RN_T) qnorm_kv_kernel(const float *__restrict__ x, int n, const float *__restrict__ w,
                                                        float eps, float *__restrict__ y, int8_t *q, float4 *qs,
                                                        int slices, mlacu_rope_k<MLA_CUDA_ROPE_ARG_DIMS> rk,
                                                        const float *__restrict__ kva, int KL, int dr,
                                                        const float *__restrict__ nw,
                                                        const float *const *const *__restrict__ tabs, int64_t kv_off,
                                                        const int32_t *__restrict__ pos) {
    __shared__ float red[32], tcs[MLA_CUDA_ROPE_ARG_DIMS / 2], tsn[MLA_CUDA_ROPE_ARG_DIMS / 2],
        pe[MLA_CUDA_ROPE_ARG_DIMS];
    const int t = blockIdx.x;
    if ((int)blockIdx.y == slices) {
        mlacu_pdl_enter();
        kv_row_store<KT>(rk, kva, KL, dr, nw, eps, tabs, kv_off, pos, t, red, tcs, tsn, pe);
        return;
    }
    int k0, k1;
    rn_slice((int)blockIdx.y, slices, k0, k1);
    float *yr = y + (int64_t)t * n;
    rms_row<false, Q8, false, true>(x + (int64_t)t * n, nullptr, nullptr, n, w, eps, red,
                                    Q8 ? q + (int64_t)t * n : nullptr, Q8 ? qs + (int64_t)t * (n / 32) : nullptr,
                                    nullptr, nullptr, k0, k1, [&](int i, float v) { yr[i] = v; });
}

/* One warp per token. Experts <= 1024, groups <= 32 (asserted on the host). */
struct route_k {
    int n_expert, n_used, n_group, n_group_used, gating, norm;
    float scale;
};
constexpr int RT_WARPS = 4, RT_MAXE = 1024;

__device__ __forceinline__ void argmax_pair(float &v, int &i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (ov > v || (ov == v && oi < i)) {
            v = ov;
            i = oi;
        }
    }
}

__global__ void route_kernel(route_k p, const float *__restrict__ logits, const float *__restrict__ bias, int64_t T,
                             int32_t *ids, float *wout) {
    mlacu_pdl_enter();
    __shared__ float s_prob[RT_WARPS][RT_MAXE], s_choice[RT_WARPS][RT_MAXE];
    __shared__ unsigned char s_ok[RT_WARPS][RT_MAXE];
    __shared__ float s_gs[RT_WARPS][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * RT_WARPS + warp;
    if (t >= T) return;
    const int n = p.n_expert;
    const float *l = logits + t * n;
    float *prob = s_prob[warp], *choice = s_choice[warp];
    unsigned char *ok = s_ok[warp];
    if (p.gating == 1) {
        float m = -INFINITY;
        for (int e = lane; e < n; e += 32) m = fmaxf(m, l[e]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float s = 0.f;
        for (int e = lane; e < n; e += 32) {
            float v = l[e] == -INFINITY ? 0.f : expf(l[e] - m);
            prob[e] = v;
            s += v;
        }
        s = wsum(s);
        for (int e = lane; e < n; e += 32) prob[e] /= s;
    } else {
        for (int e = lane; e < n; e += 32) prob[e] = 1.0f / (1.0f + expf(-l[e]));
    }
    for (int e = lane; e < n; e += 32) {
        choice[e] = prob[e] + (bias ? bias[e] : 0.f);
        ok[e] = 1;
    }
    __syncwarp();
    if (p.n_group > 1 && p.n_group_used < p.n_group) {
        const int G = p.n_group, per = n / G;
        if (lane < G) {
            float a = -INFINITY, b = -INFINITY;
            for (int i = lane * per; i < (lane + 1) * per; i++) {
                float v = choice[i];
                if (v > a) {
                    b = a;
                    a = v;
                } else if (v > b) {
                    b = v;
                }
            }
            s_gs[warp][lane] = p.gating == 1 ? a : a + b; /* as moe_route: softmax groups by their best */
        }
        __syncwarp();
        float gv = lane < G ? s_gs[warp][lane] : -INFINITY;
        bool gfree = lane < G, gok = false;
        for (int k = 0; k < p.n_group_used; k++) {
            float v = gfree ? gv : -INFINITY;
            int i = gfree ? lane : 0x7fffffff;
            argmax_pair(v, i);
            if (lane == i) {
                gfree = false;
                gok = true;
            }
        }
        unsigned okmask = __ballot_sync(0xffffffffu, gok);
        for (int e = lane; e < n; e += 32) ok[e] = (okmask >> (e / per)) & 1;
        __syncwarp();
    }
    float sum = 0.f;
    float myw = 0.f;
    int myid = -1;
    for (int k = 0; k < p.n_used; k++) {
        float v = -INFINITY;
        int i = 0x7fffffff;
        for (int e = lane; e < n; e += 32)
            if (ok[e] && (choice[e] > v || i == 0x7fffffff)) {
                v = choice[e];
                i = e;
            }
        argmax_pair(v, i);
        __syncwarp();
        if (lane == 0) ok[i] = 0;
        __syncwarp();
        float pw = prob[i];
        sum += pw;
        if (lane == k) {
            myid = i;
            myw = pw;
        }
    }
    if (lane < p.n_used) {
        float wv = myw;
        if (p.norm) wv = (float)((double)wv / ((double)sum + 1e-20));
        ids[t * p.n_used + lane] = myid;
        wout[t * p.n_used + lane] = wv * p.scale;
    }
}

/* the next step's input tokens from a step's ids: one taken on the device, or 0 where none was (-1) */
__global__ void ids_to_tokens_kernel(const int32_t *ids, int64_t T, int64_t n_vocab, int32_t *tok) {
    mlacu_pdl_enter();
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const int32_t v = ids[t];
    tok[t] = v >= 0 && v < n_vocab ? v : 0;
}

/* Greedy: one block per row, highest logit, ties to the lower index. */
/* Row t (blockIdx.x) of T is n_piece * pieces values: piece r at logits + (r * T + t) * n_piece
 * (pieces = 1: rows back to back). */
__global__ void argmax_kernel(const float *__restrict__ logits, int64_t n_piece, int pieces, int32_t *out) {
    mlacu_pdl_enter();
    __shared__ float sv[32];
    __shared__ int si[32];
    const int64_t T = gridDim.x;
    float v = -INFINITY;
    int idx = 0x7fffffff;
    for (int r = 0; r < pieces; r++) {
        const float *l = logits + ((int64_t)r * T + blockIdx.x) * n_piece;
        for (int64_t i = threadIdx.x; i < n_piece; i += blockDim.x)
            if (l[i] > v || idx == 0x7fffffff) {
                v = l[i];
                idx = (int)(r * n_piece + i);
            }
    }
    argmax_pair(v, idx);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = idx;
    }
    __syncthreads();
    if (warp == 0) {
        const int nw = blockDim.x >> 5;
        v = lane < nw ? sv[lane] : -INFINITY;
        idx = lane < nw ? si[lane] : 0x7fffffff;
        argmax_pair(v, idx);
        if (lane == 0) out[blockIdx.x] = idx;
    }
}

unsigned ew_grid(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

} // namespace

extern "C" int mla_cuda_rmsnorm(const float *d_x, int64_t ldx, int64_t T, int64_t n, const float *d_w, float eps,
                                float *d_y, int64_t ldy, mla_cuda_stream stream, mla_err *e) {
    return mla_cuda_rmsnorm_ex(d_x, NULL, NULL, ldx, T, n, d_w, eps, d_y, ldy, NULL, NULL, stream, e);
}

/* rmsnorm_kernel's forms, [with the residual][q8][fp16] */
static decltype(&rmsnorm_kernel<false, false, false>) rn_kernel(bool add, bool q8, bool h16) {
    static decltype(&rmsnorm_kernel<false, false, false>) const k[8] = {
        rmsnorm_kernel<false, false, false>, rmsnorm_kernel<false, false, true>, rmsnorm_kernel<false, true, false>,
        rmsnorm_kernel<false, true, true>,   rmsnorm_kernel<true, false, false>, rmsnorm_kernel<true, false, true>,
        rmsnorm_kernel<true, true, false>,   rmsnorm_kernel<true, true, true>};
    return k[(add ? 4 : 0) + (q8 ? 2 : 0) + (h16 ? 1 : 0)];
}

extern "C" int mla_cuda_rmsnorm_ex(const float *d_x, const float *d_res, float *d_xsum, int64_t ldx, int64_t T,
                                   int64_t n, const float *d_w, float eps, float *d_y, int64_t ldy, void *d_q8,
                                   void *d_h16, mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(T >= 0 && n > 0 && n < INT32_MAX && (!d_res || (ldx == n && d_xsum)) &&
               (!d_q8 || (n % 32 == 0 && ldy == n)) && (!d_h16 || (n % 4 == 0 && ldy == n && T <= INT32_MAX)));
    if (T == 0) return MLA_OK;
    const bool q8 = d_q8 && n <= RN_T * RN_V;   /* longer rows: quantized after */
    const bool h16 = d_h16 && n <= RN_T * RN_V; /* longer rows: converted after */
    int8_t *q = (int8_t *)d_q8;
    float4 *qs = d_q8 ? (float4 *)((uint8_t *)d_q8 + mlacu_q8_scale_off(T, n)) : nullptr;
    __half *hh = (__half *)d_h16;
    float *hs = d_h16 ? (float *)((uint8_t *)d_h16 + mlacu_h16_scale_off(T, n)) : nullptr;
    auto k = rn_kernel(d_res != NULL, q8, h16);
    /* a few rows with q8: each row over several blocks (rn_slices; the fp16 rows need the whole
     * row's largest element in one block) */
    const bool apart = (!d_res || d_xsum != d_x) && d_y != d_x && (!d_res || d_y != d_xsum); /* nothing in place */
    const unsigned slices = q8 && !h16 && T <= 16 && apart ? rn_slices(n) : 1;
    /* rows of up to RN_T RN_V elements, 16-byte aligned, few of them (a decode step's): bulk
     * copies into shared memory (rmsnorm_kernel) */
    const size_t rowb = (size_t)n * 4, smem = d_res ? 2 * rowb : rowb;
    const int bulk = n <= RN_T * RN_V && T <= 16 && rowb % 16 == 0 && (ldx * 4) % 16 == 0 && (uintptr_t)d_x % 16 == 0 &&
                     (!d_res || (uintptr_t)d_res % 16 == 0);
    if (bulk) {
        static bool attr[8] = {false, false, false, false, false, false, false, false};
        bool &done = attr[(d_res ? 4 : 0) + (q8 ? 2 : 0) + (h16 ? 1 : 0)];
        if (!done) {
            MLACU_CHECK(mlacu_smem_allow(k, (int)(2 * RN_T * RN_V * 4)), e,
                        "rmsnorm: shared memory");
            done = true;
        }
    }
    mlacu_launch(k, dim3((unsigned)T, slices), RN_T, bulk ? smem : 0, stream, d_x, d_res, d_xsum, ldx, n, d_w, eps, d_y,
                 ldy, q, qs, hh, hs, bulk);
    MLACU_CHECK(cudaGetLastError(), e, "rmsnorm%s%s%s T=%lld n=%lld", d_res ? " (+ residual)" : "", q8 ? " (+ q8)" : "",
                h16 ? " (+ fp16)" : "", (long long)T, (long long)n);
    if (d_q8 && !q8 && mla_cuda_quantize_q8(d_y, T, n, d_q8, stream, e)) return MLA_ERR;
    if (d_h16 && !h16) return mla_cuda_act_h(d_y, T, n, d_h16, stream, e);
    return MLA_OK;
}

extern "C" int mla_cuda_layernorm(const float *d_x, int64_t ldx, int64_t T, int64_t n, const float *d_w,
                                  const float *d_b, float eps, float *d_y, int64_t ldy, mla_cuda_stream stream,
                                  mla_err *e) {
    MLA_ASSERT(T >= 0 && n > 0);
    if (T == 0) return MLA_OK;
    mlacu_launch(layernorm_kernel, (unsigned)T, LN_T, 0, stream, d_x, ldx, n, d_w, d_b, eps, d_y, ldy);
    MLACU_CHECK(cudaGetLastError(), e, "layernorm T=%lld n=%lld", (long long)T, (long long)n);
    return MLA_OK;
}

extern "C" int mla_cuda_swiglu(const float *d_g, const float *d_u, float *d_y, int64_t n, mla_cuda_stream stream,
                               mla_err *e) {
    if (n <= 0) return MLA_OK;
    mlacu_launch(swiglu_kernel, ew_grid(n), 256, 0, stream, d_g, d_u, d_y, n);
    MLACU_CHECK(cudaGetLastError(), e, "swiglu n=%lld", (long long)n);
    return MLA_OK;
}

extern "C" int mla_cuda_add(float *d_y, const float *d_a, int64_t n, mla_cuda_stream stream, mla_err *e) {
    if (n <= 0) return MLA_OK;
    mlacu_launch(add_kernel, ew_grid(n), 256, 0, stream, d_y, d_a, n);
    MLACU_CHECK(cudaGetLastError(), e, "add n=%lld", (long long)n);
    return MLA_OK;
}

extern "C" int mla_cuda_rope(const rope_table *t, int mode, float *d_x, int64_t T, int64_t n_vec, int64_t stride,
                             int64_t tok_stride, int64_t pos0, const int32_t *d_pos, mla_cuda_stream stream,
                             mla_err *e) {
    MLA_ASSERT(t->n_dims > 0 && t->n_dims <= ROPE_MAX_DIMS && (mode == ROPE_ADJACENT || mode == ROPE_NEOX));
    if (T <= 0 || n_vec <= 0) return MLA_OK;
    const rope_k rk = mlacu_rope_args<ROPE_MAX_DIMS>(t);
    MLA_ASSERT(n_vec * t->n_dims < INT32_MAX);
    mlacu_launch(rope_kernel, (unsigned)T, n_vec * t->n_dims / 2 >= 1024 ? 512 : 128, 0, stream, rk, mode, d_x, n_vec,
                 stride, tok_stride, pos0, d_pos);
    MLACU_CHECK(cudaGetLastError(), e, "rope T=%lld n_vec=%lld", (long long)T, (long long)n_vec);
    return MLA_OK;
}

extern "C" int mla_cuda_mla_kv_rows(const rope_table *t, const float *d_kva, int64_t T, int64_t kv_lora,
                                    const float *d_norm_w, float eps, const float *const *const *d_blk_tok,
                                    int64_t blk_off, const int32_t *d_pos, int kv_f16, float *d_q, int64_t q_ld,
                                    int64_t n_head, int64_t head_ld, mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(t->n_dims > 0 && t->n_dims <= ROPE_MAX_DIMS && kv_lora > 0 && kv_lora <= RN_T * RN_V && T >= 0 &&
               T <= INT32_MAX && n_head > 0 && head_ld >= t->n_dims && blk_off >= 0);
    if (T == 0) return MLA_OK;
    const rope_k rk = mlacu_rope_args<ROPE_MAX_DIMS>(t);
    mlacu_launch(kv_f16 ? mla_kv_rows_kernel<__half> : mla_kv_rows_kernel<float>, dim3((unsigned)T, 2), RN_T, 0,
                 stream, rk, d_kva, (int)kv_lora, t->n_dims, d_norm_w, eps, d_blk_tok, blk_off, d_pos, d_q, q_ld,
                 n_head, head_ld);
    MLACU_CHECK(cudaGetLastError(), e, "mla_kv_rows%s T=%lld", kv_f16 ? " (fp16)" : "", (long long)T);
    return MLA_OK;
}

extern "C" int mla_cuda_dsa_ik_rows(const rope_table *t, const float *d_ik, int64_t T, int64_t D,
                                    const float *d_norm_w, const float *d_norm_b, float eps,
                                    const float *const *const *d_blk_tok, int64_t blk_off, const int32_t *d_pos,
                                    int kv_f16, float *d_q, int64_t n_head, float *d_w, float wscale,
                                    mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(t->n_dims > 0 && t->n_dims <= ROPE_MAX_DIMS && D >= t->n_dims && D <= MLA_CUDA_IK_MAX && T >= 0 &&
               T <= INT32_MAX && blk_off >= 0 && (!d_q || (n_head > 0 && n_head <= INT32_MAX && d_w)));
    if (T == 0) return MLA_OK;
    const rope_k rk = mlacu_rope_args<ROPE_MAX_DIMS>(t);
    mlacu_launch(kv_f16 ? dsa_ik_rows_kernel<__half> : dsa_ik_rows_kernel<float>, dim3((unsigned)T, d_q ? 2 : 1),
                 LN_T, 0, stream, rk, d_ik, (int)D, d_norm_w, d_norm_b, eps, d_blk_tok, blk_off, d_pos, d_q,
                 (int)n_head, d_w, wscale);
    MLACU_CHECK(cudaGetLastError(), e, "dsa_ik_rows%s T=%lld D=%lld", kv_f16 ? " (fp16)" : "", (long long)T,
                (long long)D);
    return MLA_OK;
}

extern "C" bool mla_cuda_qnorm_kv_rows_supported(int64_t n, int64_t kv_lora, int n_rope) {
    return n > 0 && n <= RN_T * RN_V && n % 32 == 0 && kv_lora > 0 && kv_lora <= RN_T * RN_V && n_rope > 0 &&
           n_rope <= MLA_CUDA_ROPE_ARG_DIMS && n_rope % 2 == 0;
}

extern "C" int mla_cuda_qnorm_kv_rows(const float *d_x, int64_t T, int64_t n, const float *d_w, float eps, float *d_y,
                                      void *d_q8, const rope_table *t, const float *d_kva, int64_t kv_lora,
                                      const float *d_kv_norm_w, const float *const *const *d_blk_tok, int64_t blk_off,
                                      const int32_t *d_pos, int kv_f16, mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(mla_cuda_qnorm_kv_rows_supported(n, kv_lora, t->n_dims) && T >= 0 && T <= 65535 && blk_off >= 0);
    if (T == 0) return MLA_OK;
    const bool q8 = d_q8 != NULL;
    int8_t *q = (int8_t *)d_q8;
    float4 *qs = q8 ? (float4 *)((uint8_t *)d_q8 + mlacu_q8_scale_off(T, n)) : nullptr;
    /* as mla_cuda_rmsnorm_ex: a few rows with q8 over several blocks each (x and y apart) */
    const int slices = q8 && T <= 16 ? (int)rn_slices(n) : 1;
    const auto rk = mlacu_rope_args<MLA_CUDA_ROPE_ARG_DIMS>(t);
    auto k = kv_f16 ? (q8 ? qnorm_kv_kernel<__half, true> : qnorm_kv_kernel<__half, false>)
                    : (q8 ? qnorm_kv_kernel<float, true> : qnorm_kv_kernel<float, false>);
    mlacu_launch(k, dim3((unsigned)T, (unsigned)slices + 1), RN_T, 0, stream, d_x, (int)n, d_w, eps, d_y, q, qs, slices,
                 rk, d_kva, (int)kv_lora, t->n_dims, d_kv_norm_w, d_blk_tok, blk_off, d_pos);
    MLACU_CHECK(cudaGetLastError(), e, "qnorm_kv_rows%s T=%lld n=%lld", kv_f16 ? " (fp16)" : "", (long long)T,
                (long long)n);
    return MLA_OK;
}

extern "C" int mla_cuda_moe_route(const moe_route_params *p, const float *d_logits, const float *d_bias,
                                  int64_t T, int32_t *d_ids, float *d_w, mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(p->n_expert > 0 && p->n_expert <= RT_MAXE && p->n_used > 0 && p->n_used <= 32 &&
               p->n_used <= p->n_expert && p->n_group >= 1 && p->n_group <= 32 && p->n_expert % p->n_group == 0);
    if (T <= 0) return MLA_OK;
    route_k rk = {p->n_expert, p->n_used, p->n_group, p->n_group_used, p->gating, p->norm ? 1 : 0, p->scale};
    mlacu_launch(route_kernel, (unsigned)((T + RT_WARPS - 1) / RT_WARPS), RT_WARPS * 32, 0, stream, rk, d_logits,
                 d_bias, T, d_ids, d_w);
    MLACU_CHECK(cudaGetLastError(), e, "moe_route T=%lld", (long long)T);
    return MLA_OK;
}

extern "C" int mla_cuda_argmax(const float *d_logits, int64_t T, int64_t n, int32_t *d_ids, mla_cuda_stream stream,
                               mla_err *e) {
    return mla_cuda_argmax_pieces(d_logits, T, n, 1, d_ids, stream, e);
}

extern "C" int mla_cuda_argmax_pieces(const float *d_logits, int64_t T, int64_t n_piece, int pieces, int32_t *d_ids,
                                      mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(n_piece > 0 && pieces >= 1 && n_piece * pieces < INT32_MAX && T < INT32_MAX);
    if (T <= 0) return MLA_OK;
    mlacu_launch(argmax_kernel, (unsigned)T, 1024, 0, stream, d_logits, n_piece, pieces, d_ids);
    MLACU_CHECK(cudaGetLastError(), e, "argmax T=%lld n=%lld x %d", (long long)T, (long long)n_piece, pieces);
    return MLA_OK;
}

extern "C" int mla_cuda_ids_to_tokens(const int32_t *d_ids, int64_t T, int64_t n_vocab, int32_t *d_tok,
                                      mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(n_vocab > 0 && T < INT32_MAX);
    if (T <= 0) return MLA_OK;
    mlacu_launch(ids_to_tokens_kernel, (unsigned)((T + 255) / 256), 256, 0, stream, d_ids, T, n_vocab, d_tok);
    MLACU_CHECK(cudaGetLastError(), e, "ids_to_tokens T=%lld", (long long)T);
    return MLA_OK;
}

#ifdef MLA_CUDA_STEPTRACE
/* The step trace's host side (cuda_internal.h): one device buffer of records a process, the
 * launches logged in order, both written at exit to MLA_CUDA_STEPTRACE.dev.csv / .host.csv. */
#include <mutex>
#include <vector>
namespace {
struct trace_launch {
    const void *k;
    dim3 grid, block;
    size_t smem;
    cudaStream_t st;
};
std::mutex g_trace_mu;
std::vector<trace_launch> g_trace_log;
mlacu_trace_rec *g_trace_buf;
unsigned *g_trace_cnt;
unsigned g_trace_cap; /* MLA_CUDA_STEPTRACE_RECORDS */

void trace_write(void) {
    const char *pre = mla_sw_str(MLA_SW_CUDA_STEPTRACE);
    if (!pre || !g_trace_buf) return;
    cudaDeviceSynchronize();
    unsigned n = 0;
    cudaMemcpy(&n, g_trace_cnt, sizeof n, cudaMemcpyDeviceToHost);
    if (n > g_trace_cap) {
        fprintf(stderr, "step trace: %u block records asked for, the buffer holds %u: the launches after it are "
                        "not stamped (MLA_CUDA_STEPTRACE_RECORDS)\n", n, g_trace_cap);
        n = g_trace_cap;
    }
    std::vector<mlacu_trace_rec> r(n);
    cudaMemcpy(r.data(), g_trace_buf, n * sizeof(mlacu_trace_rec), cudaMemcpyDeviceToHost);
    char path[4096];
    snprintf(path, sizeof path, "%s.dev.csv", pre);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "grid,block,sm,tag,t_in,t_out\n");
    for (const auto &x : r) fprintf(f, "%llu,%u,%u,%u,%llu,%llu\n", x.grid, x.block, x.sm, x.tag, x.t_in, x.t_out);
    fclose(f);
    snprintf(path, sizeof path, "%s.host.csv", pre);
    f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "seq,name,grid,block,smem,stream\n");
    for (size_t i = 0; i < g_trace_log.size(); i++) {
        const trace_launch &l = g_trace_log[i];
        const char *nm = "?";
        if (cudaFuncGetName(&nm, l.k) != cudaSuccess) nm = "?";
        fprintf(f, "%zu,%s,%u,%u,%zu,%p\n", i, nm, l.grid.x * l.grid.y * l.grid.z, l.block.x * l.block.y * l.block.z,
                l.smem, (void *)l.st);
    }
    fclose(f);
    fprintf(stderr, "step trace: %u block records, %zu launches -> %s.{dev,host}.csv\n", n, g_trace_log.size(), pre);
}
} // namespace

void mlacu_trace_host(mlacu_trace_rec **buf, unsigned **cnt, unsigned *cap) {
    std::lock_guard<std::mutex> l(g_trace_mu);
    if (!g_trace_buf && mla_sw_str(MLA_SW_CUDA_STEPTRACE)) {
        g_trace_cap = (unsigned)mla_sw_int(MLA_SW_CUDA_STEPTRACE_RECORDS);
        if (cudaMalloc(&g_trace_buf, (size_t)g_trace_cap * sizeof(mlacu_trace_rec)) != cudaSuccess ||
            cudaMalloc(&g_trace_cnt, sizeof(unsigned)) != cudaSuccess || cudaMemset(g_trace_cnt, 0, sizeof(unsigned)) != cudaSuccess) {
            fprintf(stderr, "step trace: no device memory for a buffer of %u records (MLA_CUDA_STEPTRACE_RECORDS)\n",
                    g_trace_cap);
            abort();
        }
        atexit(trace_write);
    }
    *buf = g_trace_buf;
    *cnt = g_trace_cnt;
    *cap = g_trace_buf ? g_trace_cap : 0;
}

void mlacu_trace_log(const void *k, dim3 grid, dim3 block, size_t smem, cudaStream_t st) {
    if (!g_trace_buf) return;
    std::lock_guard<std::mutex> l(g_trace_mu);
    g_trace_log.push_back({k, grid, block, smem, st});
}
#endif
