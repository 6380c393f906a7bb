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
#include "kernels/dsa_wg_cuda.h" /* the prompt kernel, where MLA_CUDA_WGMMA */

namespace {

/* ---------------------------------------------------------------- DSA indexer */
/* Block (key group, token): q[t] and w[t] in shared memory, one warp per key; keys of KT (float,
 * or __half: the model's cache, whose offset and row length count halves). */
constexpr int DS_KPB = 64;
template <typename KT>
__global__ void dsa_scores_kernel(const float *__restrict__ q, const float *__restrict__ w, const KT *__restrict__ k,
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
        const KT *kj = tab ? paged_row_t<KT>(tab, tab_off, D, j) : k + j * D;
        float kr[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int c = lane + 32 * i;
            kr[i] = c < D ? to_f32(kj[c]) : 0.f;
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

/* ---------------------------------------------------------------- tensor-core scores, fp16 keys */
/* The scores over an fp16 key cache on the tensor cores: for token t, the rows of a product are
 * its heads (padded to 16 MT, zero queries and weights past H), the columns keys, the depth the
 * D dimensions: mma.sync m16n8k16 (fp16 in, fp32 accumulation), then ReLU, the head weights and
 * the sum over heads in the epilogue (a shuffle over the 8 lanes that share a column). A warp
 * holds its token's queries as fp16 A fragments in registers (read once) and walks n-tiles of 8
 * keys of its block's chunk; lane (g, c) reads key g's halves 32u + 8c .. +7 (u < D/32: a warp
 * load is 8 rows of 64 contiguous bytes) straight into B fragments, two n-tiles' loads at a
 * time. The depth is permuted
 * (a sum does not care): k-step s takes pairs 2 (s & 1) and 2 (s & 1) + 1 of chunk u = s / 2
 * for both operands. A block is 4 warps: wt tokens (1, 2 or 4) times 4 / wt key slices. */
constexpr int DT_WARPS = 4;
__device__ __forceinline__ uint32_t dsa_pack_h2(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *(const uint32_t *)&h;
}
template <int D, int MT>
__global__ void __launch_bounds__(DT_WARPS * 32)
    dsa_scores_mma_kernel(const float *__restrict__ q, const float *__restrict__ w,
                          const float *const *const *__restrict__ tabs, int64_t tab_off, const int32_t *__restrict__ post,
                          int T, int H, int64_t skip, int wt, int64_t chunk, float *__restrict__ scores, int64_t ld) {
    static_assert(D % 32 == 0, "chunks of 32 dimensions");
    constexpr int NU = D / 32, NS = D / 16;
    mlacu_pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int wk = DT_WARPS / wt;
    const int t = blockIdx.y * wt + warp / wk;
    if (t >= T) return; /* warp-uniform exits only: no barrier in this kernel */
    const int64_t nk = (int64_t)post[t] + 1;
    const int64_t k0 = (int64_t)blockIdx.x * chunk;
    if (nk <= skip || k0 >= nk) return;
    const int64_t k1 = k0 + chunk < nk ? k0 + chunk : nk;
    uint32_t a[MT][NS][4];
    float wr[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int h = 16 * m + g + 8 * r;
            const bool ok = h < H;
            wr[m][r] = ok ? w[(int64_t)t * H + h] : 0.f;
            const float4 *qr = (const float4 *)(q + ((int64_t)t * H + (ok ? h : 0)) * D);
#pragma unroll
            for (int u = 0; u < NU; u++) {
                const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
                const float4 x0 = ok ? qr[8 * u + 2 * c] : z, x1 = ok ? qr[8 * u + 2 * c + 1] : z;
                a[m][2 * u][r] = dsa_pack_h2(x0.x, x0.y);
                a[m][2 * u][2 + r] = dsa_pack_h2(x0.z, x0.w);
                a[m][2 * u + 1][r] = dsa_pack_h2(x1.x, x1.y);
                a[m][2 * u + 1][2 + r] = dsa_pack_h2(x1.z, x1.w);
            }
        }
    const float *const *tab = tabs[t];
    const float sc = 1.0f / sqrtf((float)D);
    float *srow = scores + (int64_t)t * ld;
    /* two n-tiles an iteration (n0 and n0 + 8 wk): both tiles' loads in flight together */
    for (int64_t n0 = k0 + (int64_t)(warp % wk) * 8; n0 < k1; n0 += 16 * wk) {
        uint4 kb[2][NU];
#pragma unroll
        for (int p = 0; p < 2; p++) {
            const int64_t j = n0 + 8 * wk * p + g;
            if (j < k1) {
                const uint4 *kp = (const uint4 *)paged_row_t<__half>(tab, tab_off, D, j);
#pragma unroll
                for (int u = 0; u < NU; u++) kb[p][u] = __ldg(kp + 4 * u + c);
            } else {
#pragma unroll
                for (int u = 0; u < NU; u++) kb[p][u] = make_uint4(0u, 0u, 0u, 0u);
            }
        }
#pragma unroll
        for (int p = 0; p < 2; p++) {
            const int64_t nt = n0 + 8 * wk * p; /* this tile's first key (warp-uniform) */
            if (nt >= k1) break;
            float acc[MT][4];
#pragma unroll
            for (int m = 0; m < MT; m++) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.f;
#pragma unroll
            for (int s = 0; s < NS; s++) {
                const uint4 &kv = kb[p][s >> 1];
                const uint32_t b0 = (s & 1) ? kv.z : kv.x, b1 = (s & 1) ? kv.w : kv.y;
#pragma unroll
                for (int m = 0; m < MT; m++) mlacu_mma_f16(acc[m], a[m][s], b0, b1);
            }
            /* acc[m][0..1]: head 16 m + g, keys nt + 2c, +1; acc[m][2..3]: head 16 m + g + 8 */
            float s0 = 0.f, s1 = 0.f;
#pragma unroll
            for (int m = 0; m < MT; m++) {
                s0 += wr[m][0] * fmaxf(acc[m][0] * sc, 0.f) + wr[m][1] * fmaxf(acc[m][2] * sc, 0.f);
                s1 += wr[m][0] * fmaxf(acc[m][1] * sc, 0.f) + wr[m][1] * fmaxf(acc[m][3] * sc, 0.f);
            }
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
                s0 += __shfl_xor_sync(0xffffffffu, s0, o);
                s1 += __shfl_xor_sync(0xffffffffu, s1, o);
            }
            if (g == 0) {
                const int64_t jj = nt + 2 * c;
                if (jj < k1) srow[jj] = s0;
                if (jj + 1 < k1) srow[jj + 1] = s1;
            }
        }
    }
}

/* ---------------------------------------------------------------- top-k over many blocks a row */
/* The same selection as dsa_topk_kernel, spread over the blocks of chunks of TKM_CHUNK keys of
 * each row (rows of many keys, few rows): a radix select of the row's keys (fkey) in three
 * passes, bits 31..20 and 19..8 (TKM_BINS bins, added over the row in global memory) and 7..0
 * (256 bins a chunk, with the chunk's count of keys above the 24-bit prefix), each pass's blocks
 * finding the bins picked so far from the totals of the passes before; then every chunk writes
 * its selected ids at its offset (the counts of the chunks before it), ties at the threshold to
 * the lowest ids. A row's work: TKM_BINS x 2 totals, then (257 a chunk) the last pass's. */
constexpr int TKM_T = 256, TKM_CHUNK = 4096, TKM_BINS = 4096, TKM_ROWS = 64;
constexpr int TKM_PER = TKM_CHUNK / TKM_T;

__host__ __device__ constexpr int64_t tkm_chunks(int64_t ld) { return (ld + TKM_CHUNK - 1) / TKM_CHUNK; }
__host__ __device__ constexpr int64_t tkm_row_words(int64_t ld) { return 2 * TKM_BINS + tkm_chunks(ld) * 257; }

/* The bin of nb (a multiple of blockDim.x) counts h[] holding the rem-th largest, from the top bin
 * down, and the rank left inside it: *bin, *left (shared; every thread of the block calls it). */
__device__ void tkm_pick(const unsigned *h, int nb, int64_t rem, int *sh, int *bin, int *left) {
    const int per = nb / (int)blockDim.x, b0 = (int)threadIdx.x * per;
    int own = 0;
    for (int i = 0; i < per; i++) own += (int)h[b0 + i];
    int tot;
    const int excl = block_scan_int(own, sh, &tot);
    const int64_t above = (int64_t)tot - excl - own; /* in bins past this thread's */
    if (above < rem && above + own >= rem) {
        int64_t ab = above;
        int d = b0 + per - 1;
        for (; d > b0; d--) {
            if (ab + (int64_t)h[d] >= rem) break;
            ab += h[d];
        }
        *bin = d;
        *left = (int)(rem - ab);
    }
    __syncthreads();
}

/* One pass's counts over a block's chunk. pass 0: bits 31..20 of every key, added to the row's
 * first totals; 1: bits 19..8 of the keys in the picked top bin, to the second; 2: bits 7..0 of
 * the keys in the picked 24-bit prefix, stored as the chunk's own 256 counts with its count of
 * keys above the prefix. */
template <int PASS>
__global__ void __launch_bounds__(TKM_T) dsa_topk_hist_kernel(const float *__restrict__ scores, int64_t ld,
                                                               const int32_t *__restrict__ post, int64_t top_k,
                                                               unsigned *__restrict__ work) {
    mlacu_pdl_enter();
    __shared__ unsigned hist[TKM_BINS];
    __shared__ int sh[33], pick[2];
    const int t = blockIdx.y;
    const int64_t n = (int64_t)post[t] + 1, c0 = (int64_t)blockIdx.x * TKM_CHUNK;
    if (n <= top_k || c0 >= n) return; /* block-uniform */
    unsigned *rw = work + (int64_t)t * tkm_row_words(ld);
    constexpr int NB = PASS == 2 ? 256 : TKM_BINS;
    for (int i = threadIdx.x; i < NB; i += TKM_T) hist[i] = 0;
    uint32_t pre = 0; /* the picked prefix (pass 1: bits 31..20; pass 2: 31..8) */
    int64_t rem = top_k;
    if (PASS >= 1) {
        tkm_pick(rw, TKM_BINS, rem, sh, &pick[0], &pick[1]);
        pre = (uint32_t)pick[0];
        rem = pick[1];
    }
    if (PASS == 2) {
        __syncthreads(); /* pick[] read by every thread above */
        tkm_pick(rw + TKM_BINS, TKM_BINS, rem, sh, &pick[0], &pick[1]);
        pre = pre << 12 | (uint32_t)pick[0];
    }
    __syncthreads();
    const float *v = scores + (int64_t)t * ld;
    int above = 0;
#pragma unroll 4
    for (int r = 0; r < TKM_PER; r++) { /* warp-uniform trip count */
        const int64_t i = c0 + r * TKM_T + threadIdx.x;
        const uint32_t key = i < n ? fkey(v[i]) : 0u;
        bool act;
        uint32_t bin;
        if (PASS == 0) {
            act = i < n;
            bin = key >> 20;
        } else if (PASS == 1) {
            act = i < n && (key >> 20) == pre;
            bin = (key >> 8) & (TKM_BINS - 1);
        } else {
            act = i < n && (key >> 8) == pre;
            bin = key & 255u;
            above += i < n && (key >> 8) > pre;
        }
        const unsigned am = __ballot_sync(0xffffffffu, act);
        if (act) {
            const unsigned peers = __match_any_sync(am, bin);
            if ((int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
        }
    }
    __syncthreads();
    if (PASS < 2) {
        unsigned *tot = rw + PASS * TKM_BINS;
        for (int i = threadIdx.x; i < TKM_BINS; i += TKM_T)
            if (hist[i]) atomicAdd(&tot[i], hist[i]);
    } else {
        unsigned *own = rw + 2 * TKM_BINS + (int64_t)blockIdx.x * 257;
        for (int i = threadIdx.x; i < 256; i += TKM_T) own[i] = hist[i];
        int tot;
        block_scan_int(above, sh, &tot);
        if (threadIdx.x == 0) own[256] = (unsigned)tot;
    }
}

/* The selected ids of a block's chunk, ascending, at the chunk's offset in the row's output. */
__global__ void __launch_bounds__(TKM_T) dsa_topk_write_kernel(const float *__restrict__ scores, int64_t ld,
                                                                const int32_t *__restrict__ post, int64_t top_k,
                                                                const unsigned *__restrict__ work, int32_t *__restrict__ sel,
                                                                int32_t *__restrict__ nsel) {
    mlacu_pdl_enter();
    __shared__ unsigned h3[256];
    __shared__ int sh[33], pick[2], wcnt[TKM_T / 32][2];
    __shared__ int64_t base_sh[2];
    const int t = blockIdx.y;
    const int64_t n = (int64_t)post[t] + 1, c0 = (int64_t)blockIdx.x * TKM_CHUNK;
    if (c0 >= n) return; /* block-uniform */
    int32_t *out = sel + (int64_t)t * top_k;
    if (n <= top_k) { /* every key, unscored */
        for (int64_t i = c0 + threadIdx.x; i < n && i < c0 + TKM_CHUNK; i += TKM_T) out[i] = (int32_t)i;
        if (blockIdx.x == 0 && threadIdx.x == 0) nsel[t] = (int32_t)n;
        return;
    }
    const unsigned *rw = work + (int64_t)t * tkm_row_words(ld);
    const unsigned *ch = rw + 2 * TKM_BINS;
    const int64_t nch = (n + TKM_CHUNK - 1) / TKM_CHUNK;
    tkm_pick(rw, TKM_BINS, top_k, sh, &pick[0], &pick[1]);
    uint32_t thr = (uint32_t)pick[0];
    int64_t rem = pick[1];
    __syncthreads();
    tkm_pick(rw + TKM_BINS, TKM_BINS, rem, sh, &pick[0], &pick[1]);
    thr = thr << 12 | (uint32_t)pick[0];
    rem = pick[1];
    /* the last byte from the sum of every chunk's counts */
    for (int i = threadIdx.x; i < 256; i += TKM_T) {
        unsigned s = 0;
        for (int64_t k = 0; k < nch; k++) s += ch[k * 257 + i];
        h3[i] = s;
    }
    __syncthreads();
    tkm_pick(h3, 256, rem, sh, &pick[0], &pick[1]);
    const int b3 = pick[0];
    const int64_t need = pick[1]; /* keys equal to thr to take, lowest ids first */
    thr = thr << 8 | (uint32_t)b3;
    /* this chunk's offset: the chunks before it take their keys above thr and their share of
     * the ties */
    if (threadIdx.x < 32) {
        int64_t gt = 0, eq = 0;
        for (int64_t k = threadIdx.x; k < blockIdx.x; k += 32) {
            const unsigned *ck = ch + k * 257;
            int64_t g = ck[256];
            for (int b = b3 + 1; b < 256; b++) g += ck[b];
            gt += g;
            eq += ck[b3];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            gt += __shfl_xor_sync(0xffffffffu, gt, o);
            eq += __shfl_xor_sync(0xffffffffu, eq, o);
        }
        if (threadIdx.x == 0) {
            const int64_t eq_take = eq < need ? eq : need;
            base_sh[0] = gt + eq_take; /* output offset */
            base_sh[1] = need - eq_take; /* ties left for this chunk and later ones */
        }
    }
    /* the chunk's keys: warp w has keys c0 + w * WSEG + 32 r + lane */
    constexpr int WSEG = TKM_CHUNK / (TKM_T / 32), NR = WSEG / 32;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const unsigned lt = (1u << lane) - 1u;
    const float *v = scores + (int64_t)t * ld;
    uint32_t key[NR];
    int gtc = 0, eqc = 0;
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const int64_t i = c0 + (int64_t)warp * WSEG + 32 * r + lane;
        key[r] = i < n ? fkey(v[i]) : 0u; /* 0: below every key */
        gtc += key[r] > thr;
        eqc += key[r] == thr;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        gtc += __shfl_xor_sync(0xffffffffu, gtc, o);
        eqc += __shfl_xor_sync(0xffffffffu, eqc, o);
    }
    if (lane == 0) wcnt[warp][0] = gtc, wcnt[warp][1] = eqc;
    __syncthreads();
    int64_t off = base_sh[0], ties = base_sh[1];
    for (int w2 = 0; w2 < warp; w2++) {
        const int64_t take = wcnt[w2][1] < ties ? wcnt[w2][1] : ties;
        off += wcnt[w2][0] + take;
        ties -= take;
    }
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const int64_t i = c0 + (int64_t)warp * WSEG + 32 * r + lane;
        const unsigned em = __ballot_sync(0xffffffffu, key[r] == thr);
        const bool take = key[r] > thr || (key[r] == thr && __popc(em & lt) < ties);
        const unsigned tm = __ballot_sync(0xffffffffu, take);
        if (take) out[off + __popc(tm & lt)] = (int32_t)i;
        off += __popc(tm);
        ties -= __popc(em) < ties ? __popc(em) : ties;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) nsel[t] = (int32_t)top_k;
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
        MLACU_CHECK(mlacu_smem_allow(dsa_scores_kernel<float>, (int)smem), e,
                    "dsa_scores smem");
    mlacu_launch(dsa_scores_kernel<float>, grid, 256, smem, stream, d_q, d_w, d_k, d_tabs, tab_off, d_pos, (int)H, (int)D,
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

/* ---------------------------------------------------------------- fp16 key cache */
static int g_dsw_mode = 1; /* mla_cuda_dsa_wg */

extern "C" void mla_cuda_dsa_wg(int mode) {
    MLA_ASSERT(mode == 0 || mode == 1);
    g_dsw_mode = mode;
}

extern "C" int mla_cuda_dsa_wg_ok(void) {
#ifdef MLA_CUDA_WGMMA
    return mlacu_dsw_device_ok();
#else
    return 0;
#endif
}

/* prompt steps of 64 tokens or more on the warpgroup kernel; fewer stay on mma.sync */
constexpr int64_t DSW_MIN_TOKENS = 64;

extern "C" int mla_cuda_dsa_scores_paged_h(const float *d_q, const float *d_w, const float *const *const *d_blk_tok,
                                           int64_t blk_off, const int32_t *d_pos, const float *const *d_seq_tab,
                                           int64_t pos0, int64_t T, int64_t H, int64_t D, int64_t max_keys,
                                           int64_t skip_keys, float *d_scores, int64_t ld, mla_cuda_stream stream,
                                           mla_err *e) {
    MLA_ASSERT(d_blk_tok && d_pos && max_keys > 0 && blk_off >= 0 && D > 0 && D <= 256 && H > 0 && ld >= max_keys &&
               T <= 65535 && (!d_seq_tab || (pos0 >= 0 && pos0 + T <= max_keys)));
    if (T == 0) return MLA_OK;
    cudaStream_t st = (cudaStream_t)stream;
#ifdef MLA_CUDA_WGMMA
    const mlacu_dsw_args a = {d_q, d_w, d_seq_tab, blk_off, pos0, skip_keys, (int)T, (int)H, (int)D, d_scores, ld};
    if (d_seq_tab && g_dsw_mode && T >= DSW_MIN_TOKENS && mlacu_dsw_takes(&a)) {
        MLACU_CHECK(mlacu_dsw_launch(&a, st), e, "dsa_scores (fp16 keys, wgmma) T=%lld pos0=%lld", (long long)T,
                    (long long)pos0);
        return MLA_OK;
    }
#else
    (void)d_seq_tab;
    (void)pos0;
#endif
    /* the tensor cores: D of 64 or 128, up to 64 heads, queries and key rows 16-byte aligned */
    if ((D == 64 || D == 128) && H <= 64 && !((uintptr_t)d_q & 15) && !(blk_off & 7)) {
        const int wt = T >= 64 ? 4 : T >= 8 ? 2 : 1; /* tokens a block */
        const int64_t gy = (T + wt - 1) / wt;
        /* about one wave: 3 blocks an SM (GLM-5's 32 x 128 kernel, 140 registers a thread, fits 3) */
        int64_t bx = (3 * (int64_t)mlacu_sm_count() + gy - 1) / gy;
        int64_t chunk = (max_keys + bx - 1) / bx;
        chunk = (chunk + 63) / 64 * 64;
        if (chunk < 256) chunk = 256;
        const dim3 grid((unsigned)((max_keys + chunk - 1) / chunk), (unsigned)gy);
        const int mt = H <= 16 ? 1 : H <= 32 ? 2 : 4;
#define DSA_MMA(DD, MM)                                                                                                \
    if (D == DD && mt == MM)                                                                                           \
        mlacu_launch(dsa_scores_mma_kernel<DD, MM>, grid, DT_WARPS * 32, 0, st, d_q, d_w, d_blk_tok, blk_off, d_pos,    \
                     (int)T, (int)H, skip_keys, wt, chunk, d_scores, ld);
        DSA_MMA(128, 1)
        DSA_MMA(128, 2)
        DSA_MMA(128, 4)
        DSA_MMA(64, 1)
        DSA_MMA(64, 2)
        DSA_MMA(64, 4)
#undef DSA_MMA
        MLACU_CHECK(cudaGetLastError(), e, "dsa_scores (fp16 keys, tensor cores) T=%lld keys<=%lld", (long long)T,
                    (long long)max_keys);
        return MLA_OK;
    }
    const dim3 grid((unsigned)((max_keys + DS_KPB - 1) / DS_KPB), (unsigned)T);
    const size_t smem = (size_t)(H * D + H) * sizeof(float);
    if (smem > 48 * 1024)
        MLACU_CHECK(mlacu_smem_allow(dsa_scores_kernel<__half>, (int)smem), e, "dsa_scores (fp16 keys) smem");
    mlacu_launch(dsa_scores_kernel<__half>, grid, 256, smem, st, d_q, d_w, (const __half *)nullptr, d_blk_tok, blk_off,
                 d_pos, (int)H, (int)D, (int64_t)0, skip_keys, d_scores, ld);
    MLACU_CHECK(cudaGetLastError(), e, "dsa_scores (fp16 keys) T=%lld keys<=%lld", (long long)T, (long long)max_keys);
    return MLA_OK;
}

/* ---------------------------------------------------------------- top-k of a paged step */
static int g_topk_path = 0; /* mla_cuda_dsa_topk_path */

extern "C" void mla_cuda_dsa_topk_path(int path) { g_topk_path = path; }

extern "C" size_t mla_cuda_dsa_topk_work_bytes(int64_t T, int64_t max_keys) {
    const int64_t rows = T < TKM_ROWS ? T : TKM_ROWS;
    return (size_t)(rows > 0 ? rows : 1) * (size_t)tkm_row_words(max_keys) * 4;
}

extern "C" int mla_cuda_dsa_topk_paged(const float *d_scores, int64_t ld, int64_t T, const int32_t *d_pos, int64_t top_k,
                                       void *d_work, int32_t *d_sel, int32_t *d_nsel, mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(top_k > 0 && T <= INT32_MAX && d_pos && d_work);
    if (T == 0) return MLA_OK;
    /* many blocks a row for long rows when one block a row would leave most of the device idle:
     * fewer rows than multiprocessors (decode); a prompt's rows fill the device one block a row,
     * which then costs less (32k keys, 512 rows on an H200: 217 us against 693) */
    const bool multi = g_topk_path == 2 || (g_topk_path == 0 && ld > 2 * TKM_CHUNK && T < mlacu_sm_count());
    if (!multi) return mla_cuda_dsa_topk_tok(d_scores, ld, T, d_pos, top_k, d_sel, d_nsel, stream, e);
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t rw = tkm_row_words(ld);
    for (int64_t r0 = 0; r0 < T; r0 += TKM_ROWS) { /* TKM_ROWS rows at a time through the work */
        const int64_t rows = T - r0 < TKM_ROWS ? T - r0 : TKM_ROWS;
        const dim3 grid((unsigned)tkm_chunks(ld), (unsigned)rows);
        const float *sc = d_scores + r0 * ld;
        const int32_t *pos = d_pos + r0;
        unsigned *wk = (unsigned *)d_work;
        MLACU_CHECK(cudaMemsetAsync(wk, 0, (size_t)rows * (size_t)rw * 4, st), e, "dsa_topk work clear");
        mlacu_launch(dsa_topk_hist_kernel<0>, grid, TKM_T, 0, st, sc, ld, pos, top_k, wk);
        mlacu_launch(dsa_topk_hist_kernel<1>, grid, TKM_T, 0, st, sc, ld, pos, top_k, wk);
        mlacu_launch(dsa_topk_hist_kernel<2>, grid, TKM_T, 0, st, sc, ld, pos, top_k, wk);
        mlacu_launch(dsa_topk_write_kernel, grid, TKM_T, 0, st, sc, ld, pos, top_k, (const unsigned *)wk,
                     d_sel + r0 * top_k, d_nsel + r0);
        MLACU_CHECK(cudaGetLastError(), e, "dsa_topk (many blocks a row) T=%lld keys<=%lld k=%lld", (long long)T,
                    (long long)ld, (long long)top_k);
    }
    return MLA_OK;
}
