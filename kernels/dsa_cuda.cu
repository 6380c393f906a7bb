/* dsa_cuda: the DSA indexer on the device: per-key scores and the radix top-k of each token's
 * keys. API and meaning: kernels/cuda_ops.h. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda_internal.h"

namespace {

/* ---------------------------------------------------------------- DSA indexer */
/* Block (key group, token): q[t] and w[t] in shared memory, one warp per key. */
constexpr int DS_KPB = 64;
__global__ void dsa_scores_kernel(const float *__restrict__ q, const float *__restrict__ w, const float *__restrict__ k,
                                  const float *const *const *__restrict__ tabs, int64_t tab_off,
                                  const int32_t *__restrict__ post, int H, int D, int64_t pos0, int64_t skip,
                                  float *__restrict__ scores, int64_t ld) {
    mlacu_pdl_enter();
    extern __shared__ float qsm[];
    float *ws = qsm + H * D;
    const int t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int64_t nk = (post ? (int64_t)post[t] : pos0 + t) + 1;
    /* past this token's keys (a batched step's grid is sized for the longest), or a token whose
     * selection takes all its keys unscored (block-uniform: before any barrier) */
    if ((int64_t)blockIdx.x * DS_KPB >= nk || nk <= skip) return;
    for (int i = threadIdx.x; i < H * D; i += blockDim.x) qsm[i] = q[(int64_t)t * H * D + i];
    for (int i = threadIdx.x; i < H; i += blockDim.x) ws[i] = w[(int64_t)t * H + i];
    __syncthreads();
    const float *const *tab = tabs ? tabs[t] : nullptr;
    const float sc = 1.0f / sqrtf((float)D);
    for (int jj = warp; jj < DS_KPB; jj += nw) {
        const int64_t j = (int64_t)blockIdx.x * DS_KPB + jj;
        if (j >= nk) break;
        const float *kj = tab ? paged_row_t<float>(tab, tab_off, D, j) : k + j * D;
        float kr[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int c = lane + 32 * i;
            kr[i] = c < D ? kj[c] : 0.f;
        }
        float s = 0.f;
        for (int h = 0; h < H; h++) {
            const float *qh = qsm + h * D;
            float d = 0.f;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int c = lane + 32 * i;
                if (c < D) d = fmaf(qh[c], kr[i], d);
            }
            d = wsum(d) * sc;
            if (d > 0.f) s += ws[h] * d;
        }
        if (lane == 0) scores[t * ld + j] = s;
    }
}

/* The same scores with a lane per key, for head_dim D (64 or 128) and up to DS_HMAX heads: the
 * block's 64 keys, each lane holding its key's dot products with every head in registers and
 * reading the queries from shared memory (every lane the same address: a broadcast), no
 * shuffles; the key row is read as float4, a chunk of 32 elements at a time. The warp-per-key
 * kernel above takes other shapes. */
constexpr int DS_HMAX = 32;
template <int D>
__global__ void __launch_bounds__(DS_KPB) dsa_scores_lane_kernel(const float *__restrict__ q, const float *__restrict__ w,
                                                                const float *__restrict__ k,
                                                                const float *const *const *__restrict__ tabs,
                                                                int64_t tab_off, const int32_t *__restrict__ post, int H,
                                                                int64_t pos0, int64_t skip, float *__restrict__ scores,
                                                                int64_t ld) {
    static_assert(D % 32 == 0, "chunks of 32 elements");
    mlacu_pdl_enter();
    __shared__ float4 qs4[DS_HMAX * D / 4];
    __shared__ float ws[DS_HMAX];
    const int t = blockIdx.y;
    const int64_t nk = (post ? (int64_t)post[t] : pos0 + t) + 1;
    if ((int64_t)blockIdx.x * DS_KPB >= nk || nk <= skip) return; /* block-uniform, as above */
    const float4 *q4 = (const float4 *)(q + (int64_t)t * H * D);
    for (int i = threadIdx.x; i < H * D / 4; i += DS_KPB) qs4[i] = q4[i];
    for (int i = threadIdx.x; i < H; i += DS_KPB) ws[i] = w[(int64_t)t * H + i];
    __syncthreads();
    const int64_t j = (int64_t)blockIdx.x * DS_KPB + threadIdx.x;
    const bool valid = j < nk;
    const float *const *tab = tabs ? tabs[t] : nullptr;
    const float4 *k4 = (const float4 *)(valid ? (tab ? paged_row_t<float>(tab, tab_off, D, j) : k + j * D) : q);
    float acc[DS_HMAX];
#pragma unroll
    for (int h = 0; h < DS_HMAX; h++) acc[h] = 0.f;
#pragma unroll
    for (int c = 0; c < D / 32; c++) {
        float4 kr[8];
#pragma unroll
        for (int u = 0; u < 8; u++) kr[u] = valid ? __ldg(k4 + c * 8 + u) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int h = 0; h < DS_HMAX; h++) {
            if (h >= H) break;
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const float4 qv = qs4[h * (D / 4) + c * 8 + u];
                acc[h] = fmaf(qv.x, kr[u].x, acc[h]);
                acc[h] = fmaf(qv.y, kr[u].y, acc[h]);
                acc[h] = fmaf(qv.z, kr[u].z, acc[h]);
                acc[h] = fmaf(qv.w, kr[u].w, acc[h]);
            }
        }
    }
    const float sc = 1.0f / sqrtf((float)D);
    float sum = 0.f;
#pragma unroll
    for (int h = 0; h < DS_HMAX; h++) {
        if (h >= H) break;
        const float d = acc[h] * sc;
        if (d > 0.f) sum += ws[h] * d;
    }
    if (valid) scores[t * ld + j] = sum;
}

__device__ __forceinline__ uint32_t fkey(float f) {
    if (isnan(f)) f = -INFINITY;
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* One radix pass's histogram: key's byte at shift into hist when act (the whole warp calls it:
 * lanes of a warp in the same bin add once, __match_any_sync, since scores sharing their top
 * byte would otherwise queue on one counter). */
__device__ __forceinline__ void radix_hist_add(bool act, uint32_t key, int shift, unsigned *hist) {
    const unsigned am = __ballot_sync(0xffffffffu, act);
    if (act) {
        const uint32_t bin = (key >> shift) & 255u;
        const unsigned peers = __match_any_sync(am, bin);
        if ((int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
    }
}

/* After a pass's histogram (block-synchronised): the bin holding the rem-th largest (from the
 * top bin down) into sh64[1], and the rank left within it into sh64[0]. Warp 0: lane l sums bins
 * 8l..8l+7, a suffix sum over the lanes picks the lane, that lane its bin. */
__device__ __forceinline__ void radix_pick_bin(const unsigned *hist, int64_t rem, int64_t *sh64) {
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    int64_t own = 0;
#pragma unroll
    for (int b = 0; b < 8; b++) own += hist[8 * lane + b];
    int64_t suf = own; /* bins 8 lane .. 255 */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int64_t up = __shfl_down_sync(0xffffffffu, suf, o);
        if (lane + o < 32) suf += up;
    }
    const unsigned hit = __ballot_sync(0xffffffffu, suf >= rem);
    const int ln = hit ? 31 - __clz(hit) : 0; /* the highest lane reaching rem */
    if (lane == ln) {
        int64_t above = suf - own;
        int d = 8 * lane + 7;
        for (; d > 8 * lane; d--) {
            if (above + hist[d] >= rem) break;
            above += hist[d];
        }
        sh64[0] = rem - above;
        sh64[1] = d;
    }
}

/* Radix select: the key of the k-th largest (1-based) of a row and how many elements equal to it
 * are to be taken (lowest indices first); four passes of 8 bits. each_key(f) calls f(valid, key)
 * for every key of the row, the whole block together (warp-uniform calls). */
template <typename EachKey>
__device__ void radix_select_keys(EachKey each_key, int64_t k, unsigned *hist, uint32_t *thr, int64_t *need,
                                  int64_t *sh64) {
    uint32_t prefix = 0, mask = 0;
    int64_t rem = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        each_key([&](bool valid, uint32_t key) { radix_hist_add(valid && (key & mask) == prefix, key, shift, hist); });
        __syncthreads();
        radix_pick_bin(hist, rem, sh64);
        __syncthreads();
        rem = sh64[0];
        prefix |= (uint32_t)sh64[1] << shift;
        mask |= 255u << shift;
        __syncthreads();
    }
    *thr = prefix;
    *need = rem;
}

/* The same over the scores v[0..n) in global memory (read again each pass). */
__device__ void radix_select(const float *v, int64_t n, int64_t k, unsigned *hist, uint32_t *thr, int64_t *need,
                             int64_t *sh64) {
    radix_select_keys(
        [&](auto f) {
            for (int64_t base = 0; base < n; base += blockDim.x) { /* warp-uniform trip count */
                const int64_t i = base + threadIdx.x;
                f(i < n, i < n ? fkey(v[i]) : 0u);
            }
        },
        k, hist, thr, need, sh64);
}

/* Per token (block t): the top_k keys by score (higher score, then lower id), ascending ids; a
 * token with no more than top_k keys takes them all. A row of up to cap keys (the dynamic shared
 * memory the host gave, cap * 4 bytes) is read once into shared memory as radix keys, for the
 * four radix passes; a longer row is read again each pass (coalesced). Then each thread takes
 * per = ceil(n / TK_T) consecutive keys (stored at r * TK_T + thread: no bank conflicts) for the
 * output: one count scan for the threshold's ties, one for the output offsets. */
constexpr int TK_T = 1024;
__global__ void __launch_bounds__(TK_T) dsa_topk_kernel(const float *__restrict__ scores, int64_t ld, int64_t pos0,
                                                         const int32_t *__restrict__ post, int64_t top_k,
                                                         int32_t *__restrict__ sel, int32_t *__restrict__ nsel, int64_t cap) {
    mlacu_pdl_enter();
    extern __shared__ uint32_t tk_keys[];
    __shared__ unsigned hist[256];
    __shared__ int64_t sh64[2];
    __shared__ int sh[33];
    const int t = blockIdx.x;
    const int64_t n = (post ? (int64_t)post[t] : pos0 + t) + 1;
    int32_t *out = sel + (int64_t)t * top_k;
    if (n <= top_k) {
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) out[j] = (int32_t)j;
        if (threadIdx.x == 0) nsel[t] = (int32_t)n;
        return;
    }
    const float *v = scores + t * ld;
    const bool in_smem = n <= cap;
    const int64_t per = (n + TK_T - 1) / TK_T; /* keys [i0, i0 + per) of this thread */
    const int64_t i0 = (int64_t)threadIdx.x * per;
    /* keys past n are 0: neither above nor at any threshold (fkey of every float is above 0) */
    auto key_at = [&](int64_t r) -> uint32_t {
        return in_smem ? tk_keys[r * TK_T + threadIdx.x] : i0 + r < n ? fkey(v[i0 + r]) : 0u;
    };
    uint32_t thr;
    int64_t need;
    if (in_smem) {
        for (int64_t r = 0; r < per; r++) tk_keys[r * TK_T + threadIdx.x] = i0 + r < n ? fkey(v[i0 + r]) : 0u;
        radix_select_keys(
            [&](auto f) {
                for (int64_t r = 0; r < per; r++) { /* block-uniform trip count */
                    const uint32_t key = tk_keys[r * TK_T + threadIdx.x];
                    f(key != 0u, key);
                }
            },
            top_k, hist, &thr, &need, sh64);
    } else
        radix_select(v, n, top_k, hist, &thr, &need, sh64);
    int gt = 0, eq = 0;
    for (int64_t r = 0; r < per; r++) {
        const uint32_t key = key_at(r);
        gt += key > thr;
        eq += key == thr;
    }
    int tot;
    const int64_t eq_before = block_scan_int(eq, sh, &tot);
    const int64_t eq_take = need - eq_before < 0 ? 0 : need - eq_before < eq ? need - eq_before : eq;
    int64_t o = block_scan_int(gt + (int)eq_take, sh, &tot), e = 0;
    for (int64_t r = 0; r < per; r++) {
        const uint32_t key = key_at(r);
        const bool take = key > thr || (key == thr && e++ < eq_take);
        if (take) out[o++] = (int32_t)(i0 + r);
    }
    if (threadIdx.x == 0) nsel[t] = (int32_t)top_k;
}

} // namespace

/* ================================================================ host API */

static int dsa_scores_launch(const float *d_q, const float *d_w, const float *d_k, const float *const *const *d_tabs,
                             int64_t tab_off, const int32_t *d_pos, int64_t T, int64_t H, int64_t D, int64_t pos0, int64_t max_keys,
                             int64_t skip, float *d_scores, int64_t ld, cudaStream_t stream, mla_err *e) {
    MLA_ASSERT(D > 0 && D <= 256 && H > 0 && ld >= max_keys && T <= 65535);
    if (T == 0) return MLA_OK;
    dim3 grid((unsigned)((max_keys + DS_KPB - 1) / DS_KPB), (unsigned)T);
    const bool rows16 = d_k ? !((uintptr_t)d_k & 15) : !(tab_off & 3); /* key rows 16-byte aligned */
    if (H <= DS_HMAX && (D == 64 || D == 128) && !((uintptr_t)d_q & 15) && rows16) {
        if (D == 128)
            mlacu_launch(dsa_scores_lane_kernel<128>, grid, DS_KPB, 0, stream, d_q, d_w, d_k, d_tabs, tab_off, d_pos, (int)H,
                         pos0, skip, d_scores, ld);
        else
            mlacu_launch(dsa_scores_lane_kernel<64>, grid, DS_KPB, 0, stream, d_q, d_w, d_k, d_tabs, tab_off, d_pos, (int)H,
                         pos0, skip, d_scores, ld);
        MLACU_CHECK(cudaGetLastError(), e, "dsa_scores (a lane a key) T=%lld keys<=%lld", (long long)T, (long long)max_keys);
        return MLA_OK;
    }
    size_t smem = (size_t)(H * D + H) * sizeof(float);
    if (smem > 48 * 1024)
        MLACU_CHECK(mlacu_smem_allow(dsa_scores_kernel, (int)smem), e,
                    "dsa_scores smem");
    mlacu_launch(dsa_scores_kernel, grid, 256, smem, stream, d_q, d_w, d_k, d_tabs, tab_off, d_pos, (int)H, (int)D,
                 pos0, skip, d_scores, ld);
    MLACU_CHECK(cudaGetLastError(), e, "dsa_scores T=%lld keys<=%lld", (long long)T, (long long)max_keys);
    return MLA_OK;
}

extern "C" int mla_cuda_dsa_scores(const float *d_q, const float *d_w, const float *d_k, int64_t T, int64_t H,
                                   int64_t D, int64_t pos0, float *d_scores, int64_t ld, mla_cuda_stream stream,
                                   mla_err *e) {
    return dsa_scores_launch(d_q, d_w, d_k, NULL, 0, NULL, T, H, D, pos0, pos0 + T, 0, d_scores, ld, (cudaStream_t)stream,
                             e);
}

extern "C" int mla_cuda_dsa_scores_paged(const float *d_q, const float *d_w, const float *const *const *d_blk_tok,
                                         int64_t blk_off, const int32_t *d_pos, int64_t T, int64_t H, int64_t D,
                                         int64_t max_keys, int64_t skip_keys, float *d_scores, int64_t ld,
                                         mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(d_blk_tok && d_pos && max_keys > 0 && blk_off >= 0);
    return dsa_scores_launch(d_q, d_w, NULL, d_blk_tok, blk_off, d_pos, T, H, D, 0, max_keys, skip_keys, d_scores, ld,
                             (cudaStream_t)stream, e);
}

/* dsa_topk_kernel's shared memory for rows of up to max_n keys: their radix keys when they fit in
 * what the device gives a block (past the kernel's static 1.2 KB), else none (cap 0: the kernel
 * reads the scores again each pass). The limit is set once a process. */
static int topk_smem(int64_t max_n, size_t *smem, int64_t *cap, mla_err *e) {
    static int64_t limit = -1; /* keys a block may hold */
    if (limit < 0) {
        const int64_t bytes = (int64_t)mlacu_smem_optin() - 4096;
        MLACU_CHECK(mlacu_smem_allow(dsa_topk_kernel, (int)bytes), e,
                    "dsa_topk: shared memory %lld", (long long)bytes);
        limit = bytes / 4 / TK_T * TK_T;
    }
    const int64_t want = (max_n + TK_T - 1) / TK_T * TK_T;
    *cap = want <= limit ? want : 0;
    *smem = (size_t)*cap * 4;
    return MLA_OK;
}

extern "C" int mla_cuda_dsa_topk(const float *d_scores, int64_t ld, int64_t T, int64_t pos0, int64_t top_k,
                                 int32_t *d_sel, int32_t *d_nsel, mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(top_k > 0 && T <= INT32_MAX);
    if (T == 0) return MLA_OK;
    size_t smem;
    int64_t cap;
    if (topk_smem(pos0 + T, &smem, &cap, e)) return MLA_ERR;
    mlacu_launch(dsa_topk_kernel, (unsigned)T, TK_T, smem, (cudaStream_t)stream, d_scores, ld, pos0, nullptr, top_k, d_sel,
                 d_nsel, cap);
    MLACU_CHECK(cudaGetLastError(), e, "dsa_topk T=%lld k=%lld", (long long)T, (long long)top_k);
    return MLA_OK;
}

extern "C" int mla_cuda_dsa_topk_tok(const float *d_scores, int64_t ld, int64_t T, const int32_t *d_pos, int64_t top_k,
                                     int32_t *d_sel, int32_t *d_nsel, mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(top_k > 0 && T <= INT32_MAX && d_pos);
    if (T == 0) return MLA_OK;
    size_t smem;
    int64_t cap;
    if (topk_smem(ld, &smem, &cap, e)) return MLA_ERR; /* every row's keys fit in its ld scores */
    mlacu_launch(dsa_topk_kernel, (unsigned)T, TK_T, smem, (cudaStream_t)stream, d_scores, ld, 0, d_pos, top_k, d_sel,
                 d_nsel, cap);
    MLACU_CHECK(cudaGetLastError(), e, "dsa_topk (per-token positions) T=%lld k=%lld", (long long)T, (long long)top_k);
    return MLA_OK;
}
