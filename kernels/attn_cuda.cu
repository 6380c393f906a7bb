/* attn_cuda: absorbed MLA attention (split over key chunks, online softmax), the DSA indexer
 * (scores + radix top-k), per-head float matmuls, the MoE plan (counting sort by expert on the
 * GPU) + weighted combine, and sampling. API and meaning: kernels/cuda_ops.h. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda_internal.h"

namespace {

__device__ __forceinline__ float wsum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float wmax(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

/* ---------------------------------------------------------------- MLA attention */
/* Block = (split, group of AT_HG heads, token); 8 warps. Keys are walked in chunks of AT_C = 32
 * rows staged in shared memory (row stride row+1: conflict-free when lane j reads key j). Warp h
 * scores head h against the 32 keys (lane = key), keeps the running max / sum; every thread
 * accumulates AT_LP latent columns of each head's output. */
constexpr int AT_HG = 8, AT_C = 32, AT_T = 256, AT_LP = 4;

struct attn_k {
    const float *qa, *qp;
    int64_t qp_ld_t, qp_ld_h;
    int H, L, R;
    const void *kv;                  /* contiguous cache of KT rows (the kernels' element type) */
    const float *const *const *tabs; /* per-token block table (paged cache), NULL: kv */
    int64_t tab_off;
    int64_t pos0;
    const int32_t *post;     /* per-token position, NULL: pos0 + t */
    float scale;
    const int32_t *sel, *nsel;
    int64_t sel_stride;
    float *out, *work;
    int splits;
};

/* The keys [k0, k1) of token t that split `split` walks: the token's keys (its selected ones, or
 * positions 0..pos) in equal parts over the splits, whole chunks of `chunk` keys each (a graph
 * sized for the longest context still spreads a short one over every split). */
__device__ __forceinline__ void split_keys(const attn_k &a, int t, int split, int chunk, int64_t &k0, int64_t &k1) {
    const int64_t pos = a.post ? (int64_t)a.post[t] : a.pos0 + t;
    const int64_t nk = a.sel ? a.nsel[t] : pos + 1;
    const int64_t per = a.splits == 1 ? nk : ((nk + a.splits - 1) / a.splits + chunk - 1) / chunk * chunk;
    k0 = (int64_t)split * per;
    k1 = nk < k0 + per ? nk : k0 + per;
}

template <typename KT>
__global__ void __launch_bounds__(AT_T) mla_attn_kernel(attn_k a) {
    mlacu_pdl_enter();
    extern __shared__ float sm[];
    __shared__ float alpha[AT_HG], mrun[AT_HG], lrun[AT_HG];
    const int row = a.L + a.R, rs = row + 1;
    float *kvs = sm;
    float *qs = kvs + AT_C * rs;
    float *ps = qs + AT_HG * row;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int t = blockIdx.z, hg0 = blockIdx.y * AT_HG, split = blockIdx.x;
    const float *const *tab = a.tabs ? a.tabs[t] : nullptr;
    int64_t k0, k1;
    split_keys(a, t, split, AT_C, k0, k1);
    for (int i = tid; i < AT_HG * row; i += AT_T) {
        int h = i / row, c = i % row, hh = hg0 + h;
        float v = 0.f;
        if (hh < a.H) v = c < a.L ? a.qa[((int64_t)t * a.H + hh) * a.L + c] : a.qp[t * a.qp_ld_t + hh * a.qp_ld_h + (c - a.L)];
        qs[i] = v;
    }
    if (tid < AT_HG) {
        mrun[tid] = -INFINITY;
        lrun[tid] = 0.f;
    }
    float o[AT_HG][AT_LP];
#pragma unroll
    for (int h = 0; h < AT_HG; h++)
#pragma unroll
        for (int q = 0; q < AT_LP; q++) o[h][q] = 0.f;
    for (int64_t kb = k0; kb < k1; kb += AT_C) {
        __syncthreads();
        for (int j = warp; j < AT_C; j += AT_T / 32) {
            int64_t k = kb + j;
            if (k < k1) {
                int64_t key = a.sel ? a.sel[t * a.sel_stride + k] : k;
                const KT *src = tab ? paged_row_t<KT>(tab, a.tab_off, row, key) : (const KT *)a.kv + key * row;
                for (int c = lane; c < row; c += 32) kvs[j * rs + c] = to_f32(src[c]);
            }
        }
        __syncthreads();
        {
            const int h = warp, j = lane;
            float s = -INFINITY;
            if (kb + j < k1 && hg0 + h < a.H) {
                const float *qh = qs + h * row, *kj = kvs + j * rs;
                float d = 0.f;
                for (int c = 0; c < row; c++) d = fmaf(qh[c], kj[c], d);
                s = d * a.scale;
            }
            const float mo = mrun[h];
            const float mc = wmax(s);
            const float mn = fmaxf(mo, mc);
            const float p = s == -INFINITY ? 0.f : __expf(s - mn);
            const float al = mn == -INFINITY ? 1.f : __expf(mo - mn);
            const float ls = wsum(p);
            ps[h * AT_C + j] = p;
            __syncwarp();
            if (lane == 0) {
                alpha[h] = al;
                mrun[h] = mn;
                lrun[h] = lrun[h] * al + ls;
            }
        }
        __syncthreads();
        const int nj = (int)(k1 - kb < AT_C ? k1 - kb : AT_C);
#pragma unroll
        for (int h = 0; h < AT_HG; h++) {
            const float al = alpha[h];
#pragma unroll
            for (int q = 0; q < AT_LP; q++) o[h][q] *= al;
        }
        for (int j = 0; j < nj; j++) {
            const float *kj = kvs + j * rs;
            float kvv[AT_LP];
#pragma unroll
            for (int q = 0; q < AT_LP; q++) {
                int c = tid + AT_T * q;
                kvv[q] = c < a.L ? kj[c] : 0.f;
            }
#pragma unroll
            for (int h = 0; h < AT_HG; h++) {
                const float p = ps[h * AT_C + j];
#pragma unroll
                for (int q = 0; q < AT_LP; q++) o[h][q] = fmaf(p, kvv[q], o[h][q]);
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < AT_HG; h++) {
        const int hh = hg0 + h;
        if (hh >= a.H) continue;
        if (a.splits == 1) {
            const float inv = lrun[h] > 0.f ? 1.f / lrun[h] : 0.f;
#pragma unroll
            for (int q = 0; q < AT_LP; q++) {
                int c = tid + AT_T * q;
                if (c < a.L) a.out[((int64_t)t * a.H + hh) * a.L + c] = o[h][q] * inv;
            }
        } else {
            float *w = a.work + (((int64_t)t * a.H + hh) * a.splits + split) * (a.L + 2);
            if (tid == 0) {
                w[0] = mrun[h];
                w[1] = lrun[h];
            }
#pragma unroll
            for (int q = 0; q < AT_LP; q++) {
                int c = tid + AT_T * q;
                if (c < a.L) w[2 + c] = o[h][q];
            }
        }
    }
}

/* Combines the splits of one (head, token), AR_C latent columns a block: block (chunk + head *
 * chunks, token), 256 threads. The splits' maxima and sums are read in parallel into shared
 * memory (weights exp(m_s - M) / den there); then each of AR_G groups of AR_C threads sums its
 * column over every AR_G-th split, four loads in flight, and the groups' sums are added. */
constexpr int AR_MAXS = 1024, AR_C = 64, AR_G = 256 / AR_C;
__global__ void __launch_bounds__(256) mla_attn_reduce_kernel(const float *__restrict__ work, int H, int L, int splits,
                                                               float *__restrict__ out) {
    mlacu_pdl_enter();
    __shared__ float wgt[AR_MAXS], red[2][8], part[AR_G][AR_C];
    const int chunks = (L + AR_C - 1) / AR_C;
    const int h = blockIdx.x / chunks, c0 = blockIdx.x % chunks * AR_C, t = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t ld = L + 2;
    const float *w = work + ((int64_t)t * H + h) * splits * ld;
    float mloc = -INFINITY;
    for (int s = tid; s < splits; s += 256) {
        wgt[s] = w[s * ld];
        mloc = fmaxf(mloc, wgt[s]);
    }
    mloc = wmax(mloc);
    if (lane == 0) red[0][warp] = mloc;
    __syncthreads();
    float M = red[0][0];
#pragma unroll
    for (int i = 1; i < 8; i++) M = fmaxf(M, red[0][i]);
    float dloc = 0.f;
    for (int s = tid; s < splits; s += 256) {
        const float m = wgt[s], e = m == -INFINITY ? 0.f : __expf(m - M);
        dloc += w[s * ld + 1] * e;
        wgt[s] = e;
    }
    dloc = wsum(dloc);
    if (lane == 0) red[1][warp] = dloc;
    __syncthreads();
    float den = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) den += red[1][i];
    const float inv = den > 0.f ? 1.f / den : 0.f;
    /* splits with no keys (a graph sized for the longest context over a short one) weigh 0: their
     * outputs are not read */
    const int g = tid / AR_C, cc = tid % AR_C, c = c0 + cc;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (c < L) {
        const float *wc = w + 2 + c;
        int s = g;
        for (; s + 3 * AR_G < splits; s += 4 * AR_G) {
            float v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) v[u] = wgt[s + u * AR_G] != 0.f ? wc[(s + u * AR_G) * ld] : 0.f;
#pragma unroll
            for (int u = 0; u < 4; u++) acc[u] = fmaf(v[u], wgt[s + u * AR_G], acc[u]);
        }
        for (; s < splits; s += AR_G)
            if (wgt[s] != 0.f) acc[0] = fmaf(wc[s * ld], wgt[s], acc[0]);
    }
    part[g][cc] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    __syncthreads();
    if (g == 0 && c < L) {
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < AR_G; i++) sum += part[i][cc];
        out[((int64_t)t * H + h) * L + c] = sum * inv;
    }
}

/* ---------------------------------------------------------------- MLA attention on tensor cores */
/* The same attention with fp16 mma.sync m16n8k16 (fp32 accumulation): queries (times the
 * softmax scale), keys and the softmax weights P are rounded to fp16, as llama.cpp's
 * FlashAttention kernels do over their fp16 cache (fp16 rather than bf16: 3 more mantissa bits;
 * the latent and rope rows are normalized, far from fp16's range). Block = (split, group of TC_HR
 * = 32 heads, token), 4 warps, two blocks per SM. The 32 query rows (latent + rope) are staged
 * once in shared memory; keys are walked in tiles of TC_KT = 32 rows, converted from the fp32
 * cache into shared memory (each key's row address looked up once per tile, the loads of a
 * thread issued in batches so that their latencies overlap). Warp w computes S for rows 16 (w / 2) .. +16 against keys
 * 16 (w % 2) .. +16; the two warps of a row block exchange row maxima and sums through shared
 * memory (both keep the same running max / sum in registers), write P to shared memory, and
 * each accumulates its half of the latent columns of O = P V (V is the latent part of the same
 * key rows). Row strides are an odd number of 16-byte units (ldmatrix without bank conflicts). */
constexpr int TC_HR = 32, TC_KT = 32, TC_T = 128;

template <int L, int R> struct tc_cfg {
    static constexpr int ROW = L + R;
    static constexpr int LDS = (ROW / 8) % 2 ? ROW + 16 : ROW + 8; /* 16-bit elements */
    static constexpr int LDP = TC_KT + 8;                          /* 80 bytes: 5 units */
    static constexpr int NT = L / 16;                              /* n-tiles of 8 per warp (L / 2 columns) */
    static constexpr int KS = ROW / 16;                            /* k-steps of S */
    static constexpr int PER = TC_KT * (ROW / 4) / TC_T;           /* float4 loads per thread and tile */
    static constexpr int NB = PER / 6;                             /* load batches of 6 float4 per tile */
    static constexpr int QP = TC_HR * (ROW / 2) / TC_T;            /* query float2 per thread */
    /* queries, two key tiles (the one in use, the next one loading), P, the row exchanges: 112.5 KB
     * at 512 + 64, two blocks in the 228 KB of an H100/H200 SM */
    static constexpr size_t SMEM = ((size_t)(TC_HR + 2 * TC_KT) * LDS + (size_t)TC_HR * LDP) * 2 + 2 * 4 * 16 * 4;
    static_assert(L % 32 == 0 && ROW % 16 == 0 && (LDS / 8) % 2 == 1 && (TC_KT * (ROW / 4)) % TC_T == 0 && PER % 6 == 0 &&
                      KS == 6 * NB && (TC_HR * (ROW / 2)) % TC_T == 0 && QP % 36 == 0,
                  "tensor-core attention shape");
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ uint32_t pack_h2(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *(uint32_t *)&h;
}

/* Four consecutive cache elements as one load: a float4 of the fp32 cache, a uint2 of the fp16 one;
 * h4 gives them as four halves (the fp32 ones rounded). */
template <typename KT> struct kv4;
template <> struct kv4<float> {
    using T = float4;
    static __device__ __forceinline__ T zero() { return make_float4(0.f, 0.f, 0.f, 0.f); }
    static __device__ __forceinline__ uint2 h4(T v) { return make_uint2(pack_h2(v.x, v.y), pack_h2(v.z, v.w)); }
};
template <> struct kv4<__half> {
    using T = uint2;
    static __device__ __forceinline__ T zero() { return make_uint2(0u, 0u); }
    static __device__ __forceinline__ uint2 h4(T v) { return v; }
};

/* KT: the cache's element type. An fp32 cache is loaded through registers during the scores of
 * the tile before (rounded to fp16 on the way to shared memory); an fp16 cache (ASYNC) is copied
 * as it is by cp.async, two tiles in flight: each tile's copy is issued as soon as its buffer is
 * free, and the first two are issued before the queries are staged. */
template <int L, int R, typename KT>
__global__ void __launch_bounds__(TC_T, 2) mla_attn_tc_kernel(attn_k a) {
    using C = tc_cfg<L, R>;
    constexpr bool ASYNC = std::is_same<KT, __half>::value;
    static_assert((TC_KT * (C::ROW / 8)) % TC_T == 0, "16-byte copies of a key tile");
    extern __shared__ __align__(16) unsigned char tc_sm[];
    __shared__ const KT *rowp[2][TC_KT]; /* the key rows of the current / next tile (NULL: none) */
    using V4 = typename kv4<KT>::T;
    __half *qs = (__half *)tc_sm;
    __half *ks = qs + TC_HR * C::LDS; /* two tiles of TC_KT rows */
    __half *ps = ks + 2 * TC_KT * C::LDS;
    float *pmax = (float *)(ps + TC_HR * C::LDP), *psum = pmax + 4 * 16;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c4 = lane & 3;
    const int mt = warp >> 1, half = warp & 1;
    const int t = blockIdx.z, hg0 = blockIdx.y * TC_HR, split = blockIdx.x;
    /* A paged fp16 cache without selected keys: the first two tiles' rows are looked up and their
     * copies issued before the wait on the kernel before, which wrote only the queries. The
     * positions and block tables come from the host; the cache rows were stored at least two
     * launches back, and every kernel lets the next one be scheduled only after its own wait has
     * returned, so those launches have completed when this one starts (cuda_internal.h). The
     * selected keys (DSA) come from the kernel just before. */
    const bool early = ASYNC && a.tabs && !a.sel;
    if (!early) mlacu_pdl_wait();
    const float *const *tab = a.tabs ? a.tabs[t] : nullptr;
    int64_t k0, k1;
    split_keys(a, t, split, TC_KT, k0, k1);
    /* the cache row of key k of this split (NULL past k1): a lane of warp 0 looks it up, a key a
     * lane of a tile; the lookups (the block table, the selected keys) are loads, issued well
     * before the rows are stored for the tile's copy */
    auto row_at = [&](int64_t k) -> const KT * {
        if (k >= k1) return nullptr;
        const int64_t key = a.sel ? a.sel[t * a.sel_stride + k] : k;
        return tab ? paged_row_t<KT>(tab, a.tab_off, C::ROW, key) : (const KT *)a.kv + key * C::ROW;
    };
    /* batch b of a tile: 6 loads of 4 elements per thread from the rows in rp, then into key
     * buffer kd */
    constexpr int IPK = C::ROW / 4;
    auto load_batch = [&](const KT *const *rp, int b, V4 *v) {
#pragma unroll
        for (int u = 0; u < 6; u++) {
            const int i = tid + (6 * b + u) * TC_T, j = i / IPK, c = i % IPK * 4;
            const KT *src = rp[j];
            v[u] = src ? __ldg((const V4 *)(src + c)) : kv4<KT>::zero();
        }
    };
    auto store_batch = [&](__half *kd, int b, const V4 *v) {
#pragma unroll
        for (int u = 0; u < 6; u++) {
            const int i = tid + (6 * b + u) * TC_T, j = i / IPK, c = i % IPK * 4;
            *(uint2 *)(kd + j * C::LDS + c) = kv4<KT>::h4(v[u]);
        }
    };
    /* an fp16 tile: 16-byte copies straight into key buffer kd (zeros past k1); one commit group */
    constexpr int CPK = C::ROW / 8, CPT = TC_KT * CPK / TC_T;
    auto issue_tile = [&](const KT *const *rp, __half *kd) {
#pragma unroll
        for (int u = 0; u < CPT; u++) {
            const int i = tid + u * TC_T, j = i / CPK, c = i % CPK * 8;
            const KT *src = rp[j];
            cp_async16_zfill(kd + j * C::LDS + c, src ? (const void *)(src + c) : (const void *)a.qa, src != nullptr);
        }
        cp_async_commit();
    };
    if (warp == 0 && k0 < k1) { /* both tiles' lookups in flight together */
        const KT *r0 = row_at(k0 + lane), *r1 = ASYNC ? row_at(k0 + TC_KT + lane) : nullptr;
        rowp[0][lane] = r0;
        if (ASYNC) rowp[1][lane] = r1;
    }
    if constexpr (ASYNC) { /* tiles 0 and 1 in flight while the queries are staged (a group each) */
        __syncthreads();
        if (k0 < k1) issue_tile(rowp[0], ks);
        else cp_async_commit();
        if (k0 + TC_KT < k1) issue_tile(rowp[1], ks + TC_KT * C::LDS);
        else cp_async_commit();
    }
    if (early) mlacu_pdl_wait();
    /* Split (the combine, or v_b combining, follows: blocks that would take issue slots from these
     * while they wait), the next kernel is scheduled at each block's last tile; with one split
     * (prompts, large decode batches), as soon as the wait has returned. */
    const bool late = a.splits > 1;
    if (!late) mlacu_pdl_trigger();
    /* the queries: float2 loads, QB in flight per thread (the host checked their alignment) */
    const float sl2 = a.scale * 1.44269504088896341f; /* scores in log2 units, folded into q */
    constexpr int QB = 36;
#pragma unroll 1
    for (int b = 0; b < C::QP; b += QB) {
        float2 v[QB];
#pragma unroll
        for (int u = 0; u < QB; u++) {
            const int i = tid + (b + u) * TC_T, h = i / (C::ROW / 2), c = i % (C::ROW / 2) * 2, hh = hg0 + h;
            v[u] = make_float2(0.f, 0.f);
            if (hh < a.H)
                v[u] = c < L ? *(const float2 *)(a.qa + ((int64_t)t * a.H + hh) * L + c)
                             : *(const float2 *)(a.qp + t * a.qp_ld_t + hh * a.qp_ld_h + (c - L));
        }
#pragma unroll
        for (int u = 0; u < QB; u++) {
            const int i = tid + (b + u) * TC_T, h = i / (C::ROW / 2), c = i % (C::ROW / 2) * 2;
            *(uint32_t *)(qs + h * C::LDS + c) = pack_h2(v[u].x * sl2, v[u].y * sl2);
        }
    }
    /* the first tile, loaded before the loop (two batches in flight); the loop loads tile i + 1
     * during tile i's scores */
    __syncthreads();
    if (tid == 0) MLACU_TRACE_MARK(3);
    if (!ASYNC && k0 < k1) {
#pragma unroll 1
        for (int b = 0; b < C::NB; b += 2) {
            V4 v[6], v2[6];
            load_batch(rowp[0], b, v);
            if (b + 1 < C::NB) load_batch(rowp[0], b + 1, v2);
            store_batch(ks, b, v);
            if (b + 1 < C::NB) store_batch(ks, b + 1, v2);
        }
        if (warp == 0 && k0 + TC_KT < k1) rowp[1][lane] = row_at(k0 + TC_KT + lane);
    }
    float o[C::NT][4];
#pragma unroll
    for (int n = 0; n < C::NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    const uint32_t qaddr = smem_u32(qs + (mt * 16 + (lane & 15)) * C::LDS + (lane >> 4) * 8);
    const uint32_t kaddr0 = smem_u32(ks + (half * 16 + (lane & 7) + ((lane >> 4) << 3)) * C::LDS + ((lane >> 3) & 1) * 8);
    const uint32_t paddr = smem_u32(ps + (mt * 16 + (lane & 15)) * C::LDP + (lane >> 4) * 8);
    const uint32_t vaddr0 =
        smem_u32(ks + ((lane & 7) + (((lane >> 3) & 1) << 3)) * C::LDS + half * (L / 2) + (lane >> 4) * 8);
    constexpr uint32_t KBUF = TC_KT * C::LDS * 2; /* bytes of one key tile */
    int buf = 0;
    for (int64_t kb = k0; kb < k1; kb += TC_KT, buf ^= 1) {
        if (late && kb + TC_KT >= k1) mlacu_pdl_trigger();
        if constexpr (ASYNC) cp_async_wait<1>(); /* this thread's copies of tile buf are done */
        __syncthreads(); /* tile buf is stored, rowp[buf ^ 1] holds the next tile's rows, and the
                          * readers of buffer buf ^ 1 (the previous tile) are done */
        const bool next = !ASYNC && kb + TC_KT < k1;
        /* the rows of the tile after next: looked up now, stored after the scores */
        const KT *row2 = warp == 0 ? row_at(kb + 2 * TC_KT + lane) : nullptr;
        const uint32_t kaddr = kaddr0 + buf * KBUF, vaddr = vaddr0 + buf * KBUF;
        __half *knext = ks + (buf ^ 1) * TC_KT * C::LDS;
        /* S = Q K^T, two accumulator sets per n-tile (independent mma chains), and in between
         * the next tile's loads, batch by batch */
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        float s2[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll 1
        for (int b = 0; b < C::NB; b++) {
            V4 v[6];
            if (next) load_batch(rowp[buf ^ 1], b, v);
#pragma unroll
            for (int k6 = 0; k6 < 6; k6 += 2) {
                const int kk = 6 * b + k6;
                uint32_t A[4], B[4], A2[4], B2[4];
                mlacu_ldsm_x4(A, qaddr + kk * 32);
                mlacu_ldsm_x4(B, kaddr + kk * 32);
                mlacu_ldsm_x4(A2, qaddr + kk * 32 + 32);
                mlacu_ldsm_x4(B2, kaddr + kk * 32 + 32);
                mlacu_mma_f16(s[0], A, B[0], B[1]);
                mlacu_mma_f16(s[1], A, B[2], B[3]);
                mlacu_mma_f16(s2[0], A2, B2[0], B2[1]);
                mlacu_mma_f16(s2[1], A2, B2[2], B2[3]);
            }
            if (next) store_batch(knext, b, v);
        }
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] += s2[j][e];
        if (warp == 0 && kb + 2 * TC_KT < k1) rowp[buf][lane] = row2;
        /* s[j][e]: row g (e < 2) or g + 8, key 16 half + 8 j + 2 c4 + (e & 1) */
        const int nvalid = (int)(k1 - kb < TC_KT ? k1 - kb : TC_KT);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = half * 16 + 8 * j + 2 * c4 + (e & 1);
                const float v = key < nvalid ? s[j][e] : -INFINITY;
                s[j][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        if (c4 == 0) {
            pmax[warp * 16 + g] = mx[0];
            pmax[warp * 16 + g + 8] = mx[1];
        }
        __syncthreads();
        float mn[2], al[2], sum[2] = {0.f, 0.f};
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mn[r] = fmaxf(m_r[r], fmaxf(mx[r], pmax[(warp ^ 1) * 16 + g + 8 * r]));
            al[r] = exp2f(m_r[r] - mn[r]);
        }
#pragma unroll
        for (int j = 0; j < 2; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[j][e] = exp2f(s[j][e] - mn[e >> 1]);
                sum[e >> 1] += s[j][e];
            }
            const int col = half * 16 + 8 * j + 2 * c4;
            *(uint32_t *)(ps + (mt * 16 + g) * C::LDP + col) = pack_h2(s[j][0], s[j][1]);
            *(uint32_t *)(ps + (mt * 16 + g + 8) * C::LDP + col) = pack_h2(s[j][2], s[j][3]);
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
        }
        if (c4 == 0) {
            psum[warp * 16 + g] = sum[0];
            psum[warp * 16 + g + 8] = sum[1];
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l_r[r] = l_r[r] * al[r] + sum[r] + psum[(warp ^ 1) * 16 + g + 8 * r];
            m_r[r] = mn[r];
        }
#pragma unroll
        for (int n = 0; n < C::NT; n++) {
            o[n][0] *= al[0];
            o[n][1] *= al[0];
            o[n][2] *= al[1];
            o[n][3] *= al[1];
        }
#pragma unroll
        for (int kk = 0; kk < TC_KT / 16; kk++) {
            uint32_t A[4];
            mlacu_ldsm_x4(A, paddr + kk * 32);
#pragma unroll
            for (int n = 0; n < C::NT; n += 2) {
                uint32_t B[4];
                mlacu_ldsm_x4_t(B, vaddr + kk * 16 * C::LDS * 2 + n * 16);
                mlacu_mma_f16(o[n], A, B[0], B[1]);
                mlacu_mma_f16(o[n + 1], A, B[2], B[3]);
            }
        }
        if constexpr (ASYNC) { /* buffer buf is free once every warp is past its P V: tile + 2 into it */
            __syncthreads();
            if (kb + 2 * TC_KT < k1) issue_tile(rowp[buf], ks + buf * TC_KT * C::LDS);
            else cp_async_commit();
        }
        if (tid == 0) MLACU_TRACE_MARK(4);
    }
    if constexpr (ASYNC) cp_async_wait<0>(); /* no copy outlives the block (only empty groups remain) */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int hh = hg0 + mt * 16 + g + 8 * r;
        if (hh >= a.H) continue;
        if (a.splits == 1) {
            const float inv = l_r[r] > 0.f ? 1.f / l_r[r] : 0.f;
            float *dst = a.out + ((int64_t)t * a.H + hh) * L + half * (L / 2) + 2 * c4;
#pragma unroll
            for (int n = 0; n < C::NT; n++) *(float2 *)(dst + 8 * n) = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
        } else {
            float *w = a.work + (((int64_t)t * a.H + hh) * a.splits + split) * (L + 2);
            if (half == 0 && c4 == 0) {
                w[0] = m_r[r] * 0.69314718055994531f; /* natural units, as mla_attn_reduce_kernel reads */
                w[1] = l_r[r];
            }
            float *dst = w + 2 + half * (L / 2) + 2 * c4;
#pragma unroll
            for (int n = 0; n < C::NT; n++) *(float2 *)(dst + 8 * n) = make_float2(o[n][2 * r], o[n][2 * r + 1]);
        }
    }
    if (late && k0 >= k1) mlacu_pdl_trigger();
    if (tid == 0) MLACU_TRACE_MARK(1);
}

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

/* Inclusive prefix of v over the warp's lanes (the whole warp calls it). */
__device__ __forceinline__ int warp_scan_int(int v, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int up = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += up;
    }
    return v;
}

/* Exclusive prefix of v over the block (blockDim.x multiple of 32, <= 1024); *total gets the
 * block's sum. Uses sh[0..32]. */
__device__ int block_scan_int(int v, int *sh, int *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int inc = warp_scan_int(v, lane);
    __syncthreads();
    if (lane == 31) sh[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        const int w = lane < nw ? sh[lane] : 0, wi = warp_scan_int(w, lane);
        if (lane < nw) sh[lane] = wi - w;
        if (lane == 31) sh[32] = wi;
    }
    __syncthreads();
    *total = sh[32];
    return sh[warp] + inc - v;
}

/* The same for a 0/1 flag. */
__device__ __forceinline__ int block_scan_flag(bool f, int *sh, int *total) { return block_scan_int(f ? 1 : 0, sh, total); }

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

/* ---------------------------------------------------------------- cache rows of a batched step */
/* Block t: row t of src goes to slot pos[t] of token t's paged cache, of element type KT (fp16:
 * rounded to nearest). */
template <typename KT>
__global__ void scatter_rows_kernel(const float *__restrict__ src, int64_t src_ld, int n,
                                    const float *const *const *__restrict__ tabs, int64_t tab_off,
                                    const int32_t *__restrict__ pos, int64_t dst_ld) {
    mlacu_pdl_enter();
    const int t = blockIdx.x;
    KT *d = (KT *)paged_row_t<KT>(tabs[t], tab_off, dst_ld, pos[t]);
    const float *s = src + (int64_t)t * src_ld;
    for (int c = threadIdx.x; c < n; c += blockDim.x) kv_store(d + c, s[c]);
}

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
 * out) dotted with the T rows of xs, y stored (lane gl == 0 of each row's LPR lanes). */
template <int IN>
__device__ __forceinline__ void hq_rows(const uint8_t *ws, const float *xs, int np, int o0, int out, int h, int T,
                                        float *__restrict__ y, int64_t yt, int64_t yh) {
    using S = hq_shape<IN>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sub = lane / S::LPR, gl = lane % S::LPR;
#pragma unroll
    for (int p = 0; p < np; p++) {
        const int r = p * 8 * S::RPW + warp * S::RPW + sub; /* the block's row */
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < S::BPL; j++) {
            const int b = gl + S::LPR * j;
            if (b >= S::NB) break;
            const uint8_t *blk = ws + r * S::RB + b * 34;
            const float d = __half2float(*(const __half *)blk);
            float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int g = (k + gl) & 7; /* elements 4g .. 4g + 3 of the block */
                const uint16_t lo = *(const uint16_t *)(blk + 2 + 4 * g), hi = *(const uint16_t *)(blk + 4 + 4 * g);
                const float q0 = (float)(int8_t)(lo & 0xff), q1 = (float)(int8_t)(lo >> 8);
                const float q2 = (float)(int8_t)(hi & 0xff), q3 = (float)(int8_t)(hi >> 8);
#pragma unroll
                for (int t = 0; t < 8; t++) {
                    if (t >= T) break;
                    const float4 a = *(const float4 *)(xs + t * IN + b * 32 + 4 * g);
                    part[t] += q0 * a.x + q1 * a.y + q2 * a.z + q3 * a.w;
                }
            }
#pragma unroll
            for (int t = 0; t < 8; t++) acc[t] += d * part[t];
        }
        const int o = o0 + r;
#pragma unroll
        for (int t = 0; t < 8; t++) {
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
template <int IN>
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
        mlacu_bulk_g2s(ws, W + ((size_t)h * out + o0) * S::RB, S::ROWS * S::RB, &bar);
    }
    mlacu_pdl_wait();
    for (int i = threadIdx.x; i < T * IN; i += 256) xs[i] = x[(i / IN) * xt + h * xh + i % IN];
    __syncthreads();
    mlacu_mbar_wait(&bar, 0);
    /* the next kernel is scheduled once x is in (v_b is followed by the attention output's
     * streamed GEMV, whose first copies would otherwise queue ahead of these loads) */
    mlacu_pdl_trigger();
    hq_rows<IN>(ws, xs, S::PASSES, o0, out, h, T, y, yt, yh);
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
template <int IN>
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
        mlacu_bulk_g2s(hq_sm, W + ((size_t)h * out + o0) * S::RB, wb, &bar);
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
    hq_rows<IN>(hq_sm, xs, rpb / (8 * S::RPW), o0, out, h, T, y, yt, yh);
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

/* ---------------------------------------------------------------- MoE plan + combine */
/* One block: counts per owned expert, exclusive offsets, scatter of pair ids (order inside an
 * expert does not matter: every pair's output row is its own), tiles of <= 8 pairs: first the
 * experts with one pair (n_tiles[1] of them), then the others' tiles. */
constexpr int MP_TILE = MLACU_MOE_TILE;
__global__ void moe_plan_kernel(const int32_t *__restrict__ ids, int64_t npairs, int n_expert, int rank, int world,
                                int32_t *counts, int32_t *sorted, int32_t *tile_e, int32_t *tile_s, int32_t *tile_n,
                                int32_t *n_tiles) {
    mlacu_pdl_enter();
    extern __shared__ int32_t ms[];
    int32_t *cnt = ms, *off = ms + n_expert, *toff = ms + 2 * n_expert, *fill = ms + 3 * n_expert;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        cnt[e] = 0;
        fill[e] = 0;
    }
    __syncthreads();
    for (int64_t p = threadIdx.x; p < npairs; p += blockDim.x) {
        int e = ids[p];
        if (e >= 0 && e < n_expert && e % world == rank) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    /* pairs before each expert (off), and its first tile (toff): the tiles of one pair first, in
     * expert order, then the others' in expert order. Thread i scans a run of experts; three block
     * scans place the runs. */
    {
        __shared__ int sh[33];
        const int per = (n_expert + (int)blockDim.x - 1) / (int)blockDim.x;
        const int e0 = min(n_expert, (int)threadIdx.x * per), e1 = min(n_expert, e0 + per);
        int sc = 0, ss = 0, stl = 0;
        for (int e = e0; e < e1; e++) {
            const int c = cnt[e];
            sc += c;
            ss += c == 1;
            stl += c == 1 ? 0 : (c + MP_TILE - 1) / MP_TILE;
        }
        int tot_c, tot_s, tot_t;
        int a = block_scan_int(sc, sh, &tot_c), s1 = block_scan_int(ss, sh, &tot_s), b = block_scan_int(stl, sh, &tot_t);
        b += tot_s;
        for (int e = e0; e < e1; e++) {
            const int c = cnt[e];
            off[e] = a;
            a += c;
            if (c == 1) toff[e] = s1++;
            else {
                toff[e] = b;
                b += (c + MP_TILE - 1) / MP_TILE;
            }
        }
        if (threadIdx.x == 0) {
            n_tiles[1] = tot_s;
            n_tiles[0] = tot_s + tot_t;
        }
    }
    __syncthreads();
    for (int64_t p = threadIdx.x; p < npairs; p += blockDim.x) {
        int e = ids[p];
        if (e >= 0 && e < n_expert && e % world == rank) sorted[off[e] + atomicAdd(&fill[e], 1)] = (int32_t)p;
    }
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        counts[e] = cnt[e];
        for (int j = 0; j * MP_TILE < cnt[e]; j++) {
            tile_e[toff[e] + j] = e;
            tile_s[toff[e] + j] = off[e] + j * MP_TILE;
            tile_n[toff[e] + j] = min(MP_TILE, cnt[e] - j * MP_TILE);
        }
    }
}

__global__ void moe_combine_kernel(const float *__restrict__ y, const int32_t *__restrict__ ids,
                                   const float *__restrict__ w, int K, int64_t n, int rank, int world,
                                   float *__restrict__ out) {
    mlacu_pdl_enter();
    const int64_t t = blockIdx.y;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float acc = out[t * n + i];
        for (int k = 0; k < K; k++) {
            int e = ids[t * K + k];
            if (e % world == rank) acc = fmaf(w[t * K + k], y[(t * K + k) * n + i], acc);
        }
        out[t * n + i] = acc;
    }
}

/* ---------------------------------------------------------------- sampling */
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
__device__ double dev_uniform(uint64_t seed, uint64_t stream) {
    uint64_t r = mix64(mix64(seed) ^ mix64(stream ^ 0x5851f42d4c957f2dull));
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

constexpr int SP_T = 1024, SP_CAP = MLA_CUDA_SAMPLE_CAP;
struct samp_k {
    float temperature, top_p, min_p;
    int top_k;
    uint64_t seed, stream0;
};

__global__ void __launch_bounds__(SP_T) sample_kernel(const float *__restrict__ logits, int64_t V, samp_k sp,
                                                       int32_t *__restrict__ ids) {
    mlacu_pdl_enter();
    __shared__ float cv[SP_CAP];
    __shared__ int32_t ci[SP_CAP];
    __shared__ double dsh[33];
    __shared__ float fsh[33];
    __shared__ int ish[33];
    __shared__ unsigned hist[256];
    __shared__ int64_t sh64[2];
    const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float *w = logits + (int64_t)t * V;
    /* max (value, lowest index) */
    float bv = -INFINITY;
    int64_t bi = INT64_MAX;
    for (int64_t i = tid; i < V; i += SP_T) {
        float v = w[i];
        if (bi == INT64_MAX || v > bv) {
            bv = v;
            bi = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    __shared__ int64_t bis[32];
    if (lane == 0) {
        fsh[warp] = bv;
        bis[warp] = bi;
    }
    __syncthreads();
    if (tid == 0) {
        for (int i = 1; i < SP_T / 32; i++)
            if (fsh[i] > fsh[0] || (fsh[i] == fsh[0] && bis[i] < bis[0])) {
                fsh[0] = fsh[i];
                bis[0] = bis[i];
            }
    }
    __syncthreads();
    const float mxf = fsh[0];
    const int64_t amax = bis[0];
    if (sp.temperature == 0.f || sp.top_k == 1) {
        if (tid == 0) ids[t] = (int32_t)amax;
        return;
    }
    if (sp.top_k > SP_CAP && (int64_t)sp.top_k < V) {
        if (tid == 0) ids[t] = -1;
        return;
    }
    const double invt = 1.0 / (double)sp.temperature;
    const bool topk_on = sp.top_k > 0 && (int64_t)sp.top_k < V;
    const bool sorted = topk_on || sp.top_p < 1.0f || sp.min_p > 0.f;
    const double mx = (double)mxf;
    if (!sorted) {
        /* every token in id order: inclusive prefix sums in double, chunk by chunk */
        double tot = 0;
        for (int64_t i = tid; i < V; i += SP_T) tot += exp(((double)w[i] - mx) * invt);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, o);
        __syncthreads();
        if (lane == 0) dsh[warp] = tot;
        __syncthreads();
        if (tid == 0) {
            double s = 0;
            for (int i = 0; i < SP_T / 32; i++) s += dsh[i];
            dsh[32] = s;
        }
        __syncthreads();
        const double u = dev_uniform(sp.seed, sp.stream0 + t) * dsh[32];
        double run = 0;
        __shared__ int64_t found;
        if (tid == 0) found = V - 1;
        __syncthreads();
        for (int64_t base = 0; base < V; base += SP_T) {
            int64_t i = base + tid;
            double p = i < V ? exp(((double)w[i] - mx) * invt) : 0.0;
            /* inclusive scan over the block */
            double s = p;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                double n = __shfl_up_sync(0xffffffffu, s, o);
                if (lane >= o) s += n;
            }
            __syncthreads();
            if (lane == 31) dsh[warp] = s;
            __syncthreads();
            if (tid == 0) {
                double a = 0;
                for (int k = 0; k < SP_T / 32; k++) {
                    double v = dsh[k];
                    dsh[k] = a;
                    a += v;
                }
                dsh[32] = a;
            }
            __syncthreads();
            double cum = run + dsh[warp] + s;
            bool hit = i < V && i < V - 1 && u < cum;
            unsigned m = __ballot_sync(0xffffffffu, hit);
            if (m && lane == __ffs(m) - 1) atomicMin((unsigned long long *)&found, (unsigned long long)i);
            run += dsh[32];
            __syncthreads();
            if (found < V - 1) break;
        }
        if (tid == 0) ids[t] = (int32_t)found;
        return;
    }
    /* candidate set: the top K by (value desc, id asc) */
    int64_t K = topk_on ? sp.top_k : V;
    if (K > SP_CAP) K = SP_CAP;
    const bool capped = K < (topk_on ? (int64_t)sp.top_k : V);
    uint32_t thr;
    int64_t need;
    radix_select(w, V, K, hist, &thr, &need, sh64);
    int64_t eq_before = 0, out_before = 0;
    for (int64_t base = 0; base < V; base += SP_T) {
        int64_t i = base + tid;
        uint32_t key = i < V ? fkey(w[i]) : 0u;
        bool gt = i < V && key > thr, eq = i < V && key == thr;
        int eq_tot;
        int eq_rank = block_scan_flag(eq, ish, &eq_tot);
        bool take = gt || (eq && eq_before + eq_rank < need);
        int tk_tot;
        int pos = block_scan_flag(take, ish, &tk_tot);
        if (take) {
            cv[out_before + pos] = w[i];
            ci[out_before + pos] = (int32_t)i;
        }
        eq_before += eq_tot;
        out_before += tk_tot;
    }
    for (int64_t j = K + tid; j < SP_CAP; j += SP_T) {
        cv[j] = -INFINITY;
        ci[j] = INT32_MAX;
    }
    __syncthreads();
    /* bitonic sort of SP_CAP (value desc, id asc) */
    for (int size = 2; size <= SP_CAP; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < SP_CAP; i += SP_T) {
                int j = i ^ stride;
                if (j > i) {
                    bool desc = (i & size) == 0;
                    float a = cv[i], b = cv[j];
                    int32_t ia = ci[i], ib = ci[j];
                    bool a_first = a > b || (a == b && ia < ib);
                    if (desc != a_first) {
                        cv[i] = b;
                        cv[j] = a;
                        ci[i] = ib;
                        ci[j] = ia;
                    }
                }
            }
            __syncthreads();
        }
    }
    /* total over all V when not cut by top_k (the CPU's tot before top_p) */
    double totall = 0;
    if (!topk_on) {
        double s = 0;
        for (int64_t i = tid; i < V; i += SP_T) s += exp(((double)w[i] - mx) * invt);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) dsh[warp] = s;
        __syncthreads();
        if (tid == 0) {
            double a = 0;
            for (int i = 0; i < SP_T / 32; i++) a += dsh[i];
            dsh[32] = a;
        }
        __syncthreads();
        totall = dsh[32];
    }
    if (tid != 0) return;
    int64_t n = K;
    double tot = 0;
    for (int64_t j = 0; j < n; j++) tot += exp(((double)cv[j] - mx) * invt);
    if (!topk_on) tot = totall;
    bool overflow = false;
    if (sp.top_p < 1.0f) {
        double cum = 0, lim = (double)sp.top_p * tot;
        int64_t keep = 0;
        while (keep < n) {
            cum += exp(((double)cv[keep++] - mx) * invt);
            if (cum >= lim) break;
        }
        if (cum < lim && capped) overflow = true;
        n = keep;
    }
    if (sp.min_p > 0.f) {
        double p0 = exp(((double)cv[0] - mx) * invt);
        double cut = (double)sp.min_p * p0;
        int64_t keep = 1;
        while (keep < n && exp(((double)cv[keep] - mx) * invt) >= cut) keep++;
        if (keep == n && capped && sp.top_p >= 1.0f) overflow = true;
        n = keep;
    }
    if (overflow) {
        ids[t] = -1;
        return;
    }
    tot = 0;
    for (int64_t j = 0; j < n; j++) tot += exp(((double)cv[j] - mx) * invt);
    double u = dev_uniform(sp.seed, sp.stream0 + t) * tot;
    int64_t j = 0;
    double cum = 0;
    for (; j + 1 < n; j++) {
        cum += exp(((double)cv[j] - mx) * invt);
        if (u < cum) break;
    }
    ids[t] = ci[j];
}

} // namespace

/* ================================================================ host API */

extern "C" size_t mla_cuda_attn_work_floats(int64_t T, int64_t H, int64_t L, int n_splits) {
    return (size_t)T * (size_t)H * (size_t)n_splits * (size_t)(L + 2);
}

/* The tensor-core kernel's least keys a split: 128 (four tiles). Measured on the H200 (one
 * sequence of 16k keys, 16 heads, fp16 cache: 256 splits of 64 keys 38.9 us, 128 of 128 27.7 us,
 * 64 of 256 35.6 us): the fewer splits, the less each block's fixed cost (its queries, the first
 * tiles' latency) and the combine count; too few leave SMs idle. One token (a batch-1 decode
 * step) whose keys leave fewer blocks than SMs at 128 a split takes splits of down to 64 keys, up
 * to a block an SM: at 1k keys V3's 128 heads 23.6-23.9 us against 28.4-28.6, V2-Lite's 16 heads
 * 17.6-18.4 against 22.0-22.3, GLM-5's 64 over 2048 selected keys 21.3-21.8 against 22.5-23.1
 * (mla-gpu-check --attn1, eighteenth session; at 4k and 16k keys those grids time as the
 * committed ones or better). mla_cuda_attn_tune changes the first bound. */
constexpr int TC_MIN_KEYS = 128, TC_MIN_KEYS1 = 64;
static int g_tc_min_keys = 0;
extern "C" void mla_cuda_attn_tune(int min_keys) {
    MLA_ASSERT(min_keys >= 0 && min_keys % TC_KT == 0);
    g_tc_min_keys = min_keys;
}

/* Splits of a launch: enough blocks for two waves of two per SM over 132 SMs, each split at
 * least min_keys keys, within the work buffer. min_keys2 (< min_keys, or 0): where min_keys
 * leaves fewer blocks than SMs, splits of down to min_keys2 keys up to a block an SM. */
static int attn_splits(const mla_cuda_attn_args *a, int64_t blocks_per_split, int64_t nk_max, int64_t min_keys,
                       int64_t min_keys2 = 0) {
    if (!a->work) return 1;
    const int64_t want = (264 + blocks_per_split - 1) / blocks_per_split, maxs = (nk_max + min_keys - 1) / min_keys;
    int splits = (int)(want < maxs ? want : maxs);
    if (min_keys2 > 0 && splits * blocks_per_split < mlacu_sm_count()) {
        const int64_t want2 = (mlacu_sm_count() + blocks_per_split - 1) / blocks_per_split,
                      maxs2 = (nk_max + min_keys2 - 1) / min_keys2;
        splits = std::max(splits, (int)std::min(want2, maxs2));
    }
    if (splits < 1) splits = 1;
    if (splits > AR_MAXS) splits = AR_MAXS;
    while (splits > 1 && mla_cuda_attn_work_floats(a->n_tokens, a->n_head, a->kv_lora, splits) > a->work_floats) splits--;
    return splits;
}

/* Combines the splits of a launch (none to combine with one), unless the caller combines them
 * (n_splits_out, up to comb_max splits). */
static int attn_reduce(const mla_cuda_attn_args *a, int splits, cudaStream_t st, mla_err *e) {
    if (a->n_splits_out) *a->n_splits_out = splits > 1 && splits <= a->comb_max ? splits : 1;
    if (splits == 1 || (a->n_splits_out && *a->n_splits_out > 1)) return MLA_OK;
    const int64_t chunks = (a->kv_lora + AR_C - 1) / AR_C;
    mlacu_launch(mla_attn_reduce_kernel, dim3((unsigned)(a->n_head * chunks), (unsigned)a->n_tokens), 256, 0, st, a->work,
                 (int)a->n_head, (int)a->kv_lora, splits, a->out);
    MLACU_CHECK(cudaGetLastError(), e, "mla_attn reduce");
    return MLA_OK;
}

/* MLA_OK, MLA_ERR, or 1: this device cannot give a block the kernel's shared memory (the
 * 512 + 64 kernel takes 113 KB: Hopper / Blackwell data-center parts and the A100 can, GPUs with
 * 99-101 KB a block such as sm_86/89/120 cannot; they keep the fp32 kernel). Once per process
 * (one device per process, or ranks of one process on one device). */
template <int L, int R, typename KT> static int tc_launch_setup(mla_err *e) {
    using C = tc_cfg<L, R>;
    static int state = 0; /* 0: not yet, 1: set up, 2: not on this device */
    if (state == 2) return 1;
    if (state == 0) {
        /* a failed query reads as 48 KB: the kernel is then not used on this device */
        if ((size_t)mlacu_smem_optin() < C::SMEM + sizeof(float *) * 2 * TC_KT) {
            state = 2;
            return 1;
        }
        MLACU_CHECK(cudaFuncSetAttribute(mla_attn_tc_kernel<L, R, KT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::SMEM),
                    e, "mla_attn (tensor cores): shared memory %zu", C::SMEM);
        /* all of the SM's unified memory as shared memory: two blocks per SM */
        MLACU_CHECK(cudaFuncSetAttribute(mla_attn_tc_kernel<L, R, KT>, cudaFuncAttributePreferredSharedMemoryCarveout, 100), e,
                    "mla_attn (tensor cores): carveout");
        state = 1;
    }
    return MLA_OK;
}

template <int L, int R, typename KT>
static int tc_launch(const attn_k &k, int64_t T, int64_t H, cudaStream_t stream, mla_err *e) {
    using C = tc_cfg<L, R>;
    const int s = tc_launch_setup<L, R, KT>(e);
    if (s != MLA_OK) return s;
    dim3 grid((unsigned)k.splits, (unsigned)((H + TC_HR - 1) / TC_HR), (unsigned)T);
    mlacu_launch(mla_attn_tc_kernel<L, R, KT>, grid, TC_T, C::SMEM, stream, k);
    MLACU_CHECK(cudaGetLastError(), e, "mla_attn (tensor cores) T=%lld H=%lld", (long long)T, (long long)H);
    return MLA_OK;
}

extern "C" int mla_cuda_attn_tc_blocks_per_sm(void) {
    using C = tc_cfg<512, 64>;
    mla_err e;
    const int s = tc_launch_setup<512, 64, __half>(&e);
    if (s != MLA_OK) return s == 1 ? 0 : -1;
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, mla_attn_tc_kernel<512, 64, __half>, TC_T, C::SMEM) != cudaSuccess)
        return -1;
    return n;
}

/* The tensor-core attention where a kernel exists for the shape and the device: MLA_OK, MLA_ERR,
 * or 1 (none: the caller takes the fp32 kernel). */
static int tc_attn(const mla_cuda_attn_args *a, int64_t nk_max, mla_cuda_stream stream, mla_err *e) {
    const int64_t L = a->kv_lora, R = a->n_rope;
    const bool w512 = L == 512 && R == 64, w256 = L == 256 && R == 32;
    if (!w512 && !w256) return 1;
    if (!a->blk_tok && ((uintptr_t)a->kv & 15)) return 1;
    if (((uintptr_t)a->q_abs & 7) || ((uintptr_t)a->q_pe & 7) || (a->q_pe_ld_t & 1) || (a->q_pe_ld_h & 1)) return 1;
    if (a->blk_tok && (a->blk_off & 3)) return 1;
    const int64_t hgroups = (a->n_head + TC_HR - 1) / TC_HR;
    const int splits = attn_splits(a, a->n_tokens * hgroups, nk_max, g_tc_min_keys ? g_tc_min_keys : TC_MIN_KEYS,
                                   a->n_tokens == 1 && !g_tc_min_keys ? TC_MIN_KEYS1 : 0);
    attn_k k = {a->q_abs, a->q_pe, a->q_pe_ld_t, a->q_pe_ld_h, (int)a->n_head, (int)L, (int)R, a->kv, a->blk_tok,
                a->blk_off, a->pos0, a->pos_tok, a->scale, a->sel, a->n_sel, a->sel_stride, a->out, a->work, splits};
    cudaStream_t st = (cudaStream_t)stream;
    int r;
    if (a->kv_f16) r = w512 ? tc_launch<512, 64, __half>(k, a->n_tokens, a->n_head, st, e)
                            : tc_launch<256, 32, __half>(k, a->n_tokens, a->n_head, st, e);
    else r = w512 ? tc_launch<512, 64, float>(k, a->n_tokens, a->n_head, st, e)
                  : tc_launch<256, 32, float>(k, a->n_tokens, a->n_head, st, e);
    if (r) return r;
    return attn_reduce(a, splits, st, e);
}

extern "C" int mla_cuda_mla_attn(const mla_cuda_attn_args *a, mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(a->kv_lora > 0 && a->kv_lora <= AT_T * AT_LP && a->n_rope >= 0 && a->n_rope <= 128);
    MLA_ASSERT(a->n_tokens >= 0 && a->n_tokens <= 65535 && a->n_head > 0);
    MLA_ASSERT(!a->pos_tok || a->max_keys > 0);
    if (a->n_tokens == 0) return MLA_OK;
    const int64_t nk_max = a->sel ? a->sel_stride : a->pos_tok ? a->max_keys : a->pos0 + a->n_tokens;
    if (a->tensor_cores) {
        const int r = tc_attn(a, nk_max, stream, e);
        if (r != 1) return r;
    }
    const int row = (int)(a->kv_lora + a->n_rope);
    const size_t smem = ((size_t)AT_C * (row + 1) + (size_t)AT_HG * row + AT_HG * AT_C) * sizeof(float);
    static size_t smem_set[2] = {0, 0}; /* per element type */
    if (smem > smem_set[a->kv_f16 != 0]) {
        MLACU_CHECK(cudaFuncSetAttribute(a->kv_f16 ? mla_attn_kernel<__half> : mla_attn_kernel<float>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                    e, "mla_attn: shared memory %zu", smem);
        smem_set[a->kv_f16 != 0] = smem;
    }
    const int64_t hgroups = (a->n_head + AT_HG - 1) / AT_HG;
    const int splits = attn_splits(a, a->n_tokens * hgroups, nk_max, 256);
    attn_k k = {a->q_abs, a->q_pe, a->q_pe_ld_t, a->q_pe_ld_h, (int)a->n_head, (int)a->kv_lora, (int)a->n_rope,
                a->kv, a->blk_tok, a->blk_off, a->pos0, a->pos_tok, a->scale, a->sel, a->n_sel, a->sel_stride, a->out, a->work,
                splits};
    dim3 grid((unsigned)splits, (unsigned)hgroups, (unsigned)a->n_tokens);
    mlacu_launch(a->kv_f16 ? mla_attn_kernel<__half> : mla_attn_kernel<float>, grid, AT_T, smem, (cudaStream_t)stream, k);
    MLACU_CHECK(cudaGetLastError(), e, "mla_attn T=%lld H=%lld", (long long)a->n_tokens, (long long)a->n_head);
    return attn_reduce(a, splits, (cudaStream_t)stream, e);
}

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
        MLACU_CHECK(cudaFuncSetAttribute(dsa_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), e,
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
        MLACU_CHECK(cudaFuncSetAttribute(dsa_topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes), e,
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

extern "C" int mla_cuda_scatter_paged(const float *d_src, int64_t src_ld, int64_t n, int64_t T,
                                      const float *const *const *d_blk_tok, int64_t blk_off, const int32_t *d_pos,
                                      int64_t dst_ld, int dst_f16, mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(n > 0 && n <= INT32_MAX && T >= 0 && T <= INT32_MAX && src_ld >= n && dst_ld >= n && blk_off >= 0);
    if (T == 0) return MLA_OK;
    mlacu_launch(dst_f16 ? scatter_rows_kernel<__half> : scatter_rows_kernel<float>, (unsigned)T, 256, 0,
                 (cudaStream_t)stream, d_src, src_ld, (int)n, d_blk_tok, blk_off, d_pos, dst_ld);
    MLACU_CHECK(cudaGetLastError(), e, "scatter_rows%s T=%lld n=%lld", dst_f16 ? " (fp16)" : "", (long long)T, (long long)n);
    return MLA_OK;
}

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

/* Where a head GEMV kernel rounds y into d_yq itself (mlacu_q8out_on): *q, *qs its int8 rows and
 * unit scales for T rows of yt; else both NULL and the caller quantizes after it. */
static void head_yq(void *d_yq, int64_t T, int64_t yt, int8_t **q, float4 **qs) {
    void *kq = mlacu_q8out_on() ? d_yq : NULL;
    *q = (int8_t *)kq;
    *qs = kq ? (float4 *)((uint8_t *)kq + mlacu_q8_scale_off(T, yt)) : nullptr;
}

extern "C" int mla_cuda_head_matmul_f16(const void *d_w, int64_t H, int64_t in, int64_t out, const float *d_x,
                                        int64_t xt, int64_t xh, int64_t T, float *d_y, int64_t yt, int64_t yh,
                                        void *d_yq, mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(in > 0 && in <= 1024 && out > 0 && H > 0 && H <= 65535);
    MLA_ASSERT(!d_yq || (out % 32 == 0 && yh == out && yt == H * yh && ((uintptr_t)d_yq & 15) == 0));
    if (T == 0) return MLA_OK;
    cudaStream_t st = (cudaStream_t)stream;
    bool yq_done = false; /* the kernel rounded y into d_yq */
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
    if (in == 64) go(head_gemv_q8_kernel<64>);
    else if (in == 128) go(head_gemv_q8_kernel<128>);
    else if (in == 192) go(head_gemv_q8_kernel<192>);
    else if (in == 256) go(head_gemv_q8_kernel<256>);
    else go(head_gemv_q8_kernel<512>);
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
            MLACU_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             mlacu_smem_optin() - (int)hq_comb_static(in)),
                        e, "head_matmul (Q8_0, splits combined): shared memory");
            attr = true;
        }
        mlacu_launch(kern, dim3((unsigned)nb, (unsigned)H), 256, smem, st, (const uint8_t *)d_w, (int)out, rpb, d_work,
                     (int)H, n_splits, (int)T, d_y, yt, yh, q, qs);
        return MLA_OK;
    };
    static bool attr[2] = {false, false};
    if ((in == 512 ? go(head_gemv_q8_comb_kernel<512>, attr[1]) : go(head_gemv_q8_comb_kernel<256>, attr[0])) != MLA_OK)
        return MLA_ERR;
    MLACU_CHECK(cudaGetLastError(), e, "head_matmul (Q8_0, %d splits combined) H=%lld %lldx%lld T=%lld", n_splits,
                (long long)H, (long long)out, (long long)in, (long long)T);
    return d_yq && !q ? mla_cuda_quantize_q8(d_y, T, yt, d_yq, stream, e) : MLA_OK;
}

static size_t al16(size_t b) { return (b + 255) / 256 * 256; }

/* tiles of a plan: at most one per pair, and at most one partial tile per expert */
static int64_t moe_max_tiles(int64_t T, int64_t K, int64_t X) {
    int64_t b = (T * K + MP_TILE - 1) / MP_TILE + X;
    return T * K < b ? T * K : b;
}

extern "C" size_t mla_cuda_moe_plan_bytes(int64_t T, int64_t K, int64_t X) {
    int64_t mt = moe_max_tiles(T, K, X);
    return al16((size_t)(T * K) * 4) + 3 * al16((size_t)mt * 4) + al16(8) + al16((size_t)X * 4);
}

extern "C" void mla_cuda_moe_plan_init(mla_cuda_moe_plan *p, void *d_mem, int64_t T, int64_t K, int64_t X, int rank,
                                       int world) {
    int64_t mt = moe_max_tiles(T, K, X);
    uint8_t *m = (uint8_t *)d_mem;
    p->sorted = (int32_t *)m;
    m += al16((size_t)(T * K) * 4);
    p->tile_e = (int32_t *)m;
    m += al16((size_t)mt * 4);
    p->tile_s = (int32_t *)m;
    m += al16((size_t)mt * 4);
    p->tile_n = (int32_t *)m;
    m += al16((size_t)mt * 4);
    p->n_tiles = (int32_t *)m;
    m += al16(8);
    p->counts = (int32_t *)m;
    p->max_tiles = mt;
    p->tokens = T;
    p->rank = rank;
    p->world = world;
}

extern "C" int mla_cuda_moe_plan_build(mla_cuda_moe_plan *p, const int32_t *d_ids, int64_t T, int64_t K, int64_t X,
                                       mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(X > 0 && X <= 4096 && p->world >= 1);
    p->max_tiles = moe_max_tiles(T, K, X);
    p->tokens = T;
    const size_t smem = (size_t)X * 4 * sizeof(int32_t);
    static size_t smem_set = 48 << 10; /* past 48 KB (3072 experts and more) only by opting in */
    if (smem > smem_set) {
        MLACU_CHECK(cudaFuncSetAttribute(moe_plan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), e,
                    "moe plan: shared memory %zu", smem);
        smem_set = smem;
    }
    mlacu_launch(moe_plan_kernel, 1, 1024, smem, (cudaStream_t)stream, d_ids, T * K, (int)X,
                 p->rank, p->world, p->counts, p->sorted, p->tile_e, p->tile_s, p->tile_n, p->n_tiles);
    MLACU_CHECK(cudaGetLastError(), e, "moe plan T=%lld", (long long)T);
    return MLA_OK;
}

extern "C" int mla_cuda_moe_combine(const float *d_y, const int32_t *d_ids, const float *d_w, int64_t T, int64_t K,
                                    int64_t n, int rank, int world, float *d_out, mla_cuda_stream stream, mla_err *e) {
    if (T == 0) return MLA_OK;
    MLA_ASSERT(T <= 65535);
    unsigned gx = (unsigned)((n + 255) / 256);
    mlacu_launch(moe_combine_kernel, dim3(gx, (unsigned)T), 256, 0, (cudaStream_t)stream, d_y, d_ids, d_w, (int)K, n,
                 rank, world, d_out);
    MLACU_CHECK(cudaGetLastError(), e, "moe combine");
    return MLA_OK;
}

extern "C" size_t mla_cuda_moe_work_bytes(int64_t T, int64_t K, int64_t E, int64_t F, int64_t X) {
    return mla_cuda_moe_plan_bytes(T, K, X) + al16((size_t)(T * K * F) * 4) * 3 + al16((size_t)(T * K * E) * 4) +
           mla_cuda_q8_bytes(T, E) + mla_cuda_q8_bytes(T * K, F) + mla_cuda_act_h_bytes(T, E) +
           mla_cuda_act_h_bytes(T * K, F);
}

extern "C" int mla_cuda_moe_apply(const mla_cuda_experts *ex, const float *d_x, const void *d_xq, int64_t T,
                                  const int32_t *d_ids, const float *d_w, int64_t K, float *d_out, void *d_work,
                                  mla_cuda_stream stream, mla_err *e) {
    if (T == 0) return MLA_OK;
    const int64_t E = ex->n_embd, F = ex->n_ff;
    uint8_t *m = (uint8_t *)d_work;
    mla_cuda_moe_plan pl;
    mla_cuda_moe_plan_init(&pl, m, T, K, ex->n_expert, ex->rank, ex->world);
    m += mla_cuda_moe_plan_bytes(T, K, ex->n_expert);
    float *h = (float *)m;
    m += al16((size_t)(T * K * F) * 4);
    float *g = (float *)m;
    m += al16((size_t)(T * K * F) * 4);
    float *u = (float *)m;
    m += al16((size_t)(T * K * F) * 4);
    float *y = (float *)m;
    m += al16((size_t)(T * K * E) * 4);
    void *qx = m, *qh = m + mla_cuda_q8_bytes(T, E); /* q8 buffers of x and of h */
    /* x's q8 buffer: the caller's, else quantized here (qx) by q8x() */
    auto q8x = [&]() -> const void * {
        if (d_xq) return d_xq;
        return mla_cuda_quantize_q8(d_x, T, E, qx, stream, e) ? nullptr : qx;
    };
    m += mla_cuda_q8_bytes(T, E) + mla_cuda_q8_bytes(T * K, F);
    void *hx = m, *hh = m + mla_cuda_act_h_bytes(T, E); /* fp16 buffers of x and of h */
    if (mla_cuda_moe_plan_build(&pl, d_ids, T, K, ex->n_expert, stream, e)) return MLA_ERR;
    /* enough tokens per expert: the fp16 tensor cores, 32 pairs a tile, 64 from 48 a expert */
    if (ex->mmh_min > 0 && T * K >= (int64_t)ex->mmh_min * ex->n_expert && mla_cuda_mmh_supported(ex->gate_type, E) &&
        mla_cuda_mmh_supported(ex->up_type, E) && mla_cuda_mmh_supported(ex->down_type, F)) {
        const int bm = T * K >= 48 * ex->n_expert ? 64 : 32;
        if (mla_cuda_act_h(d_x, T, E, hx, stream, e) ||
            mla_cuda_matmul_grouped_h(ex->gate_type, ex->gate, ex->gate_estride, E, F, hx, T, (int)K, &pl,
                                      ex->n_expert, bm, g, stream, e) ||
            mla_cuda_matmul_grouped_h(ex->up_type, ex->up, ex->up_estride, E, F, hx, T, (int)K, &pl, ex->n_expert,
                                      bm, u, stream, e) ||
            mla_cuda_swiglu_h(g, u, T * K, F, hh, stream, e) ||
            mla_cuda_matmul_grouped_h(ex->down_type, ex->down, ex->down_estride, F, E, hh, T * K, 1, &pl,
                                      ex->n_expert, bm, y, stream, e))
            return MLA_ERR;
        return mla_cuda_moe_combine(y, d_ids, d_w, T, K, E, ex->rank, ex->world, d_out, stream, e);
    }
    /* many tokens per expert (64 on average, a full tile, and more: long prompts): the int8 tensor
     * cores. At 16 a expert they were no faster than the grouped GEMV on the H200 (a 512-token
     * prompt of the V3-shaped model: 129 ms either way; 16 experts x 64 tokens: 525 us against 381),
     * bench/results/gpu-h200-2026-11-29d.md */
    const bool mma = ex->q8 && T * K >= 64 * ex->n_expert && mla_cuda_q8_supported(ex->gate_type) &&
                     mla_cuda_q8_supported(ex->up_type) && mla_cuda_q8_supported(ex->down_type);
    if (mma) {
        const void *xq = q8x();
        if (!xq ||
            mla_cuda_matmul_grouped_q8_mma(ex->gate_type, ex->gate, ex->gate_estride, E, F, xq, T, (int)K, &pl,
                                           ex->n_expert, g, stream, e) ||
            mla_cuda_matmul_grouped_q8_mma(ex->up_type, ex->up, ex->up_estride, E, F, xq, T, (int)K, &pl, ex->n_expert,
                                           u, stream, e) ||
            mla_cuda_swiglu(g, u, h, T * K * F, stream, e) || mla_cuda_quantize_q8(h, T * K, F, qh, stream, e) ||
            mla_cuda_matmul_grouped_q8_mma(ex->down_type, ex->down, ex->down_estride, F, E, qh, T * K, 1, &pl,
                                           ex->n_expert, y, stream, e))
            return MLA_ERR;
        return mla_cuda_moe_combine(y, d_ids, d_w, T, K, E, ex->rank, ex->world, d_out, stream, e);
    }
    const bool q8_down = ex->q8 && mla_cuda_q8_supported(ex->down_type);
    bool qh_made = false; /* qh holds h */
    if (ex->q8 && ex->gate_type == ex->up_type && mla_cuda_q8_supported(ex->gate_type)) {
        const void *xq = q8x();
        /* h's q8 buffer too, for the down projection (rounded by the GEMV where it can) */
        void *hq = q8_down ? qh : NULL;
        if (!xq || mla_cuda_matmul_grouped_q8(ex->gate_type, ex->gate, ex->up, ex->gate_estride, E, F, xq, T, (int)K,
                                              &pl, h, hq, stream, e))
            return MLA_ERR;
        qh_made = hq != NULL;
    } else if (ex->gate_type == ex->up_type) {
        if (mla_cuda_matmul_grouped(ex->gate_type, ex->gate, ex->up, ex->gate_estride, E, F, d_x, (int)K, &pl, h, stream,
                                    e))
            return MLA_ERR;
    } else {
        if (mla_cuda_matmul_grouped(ex->gate_type, ex->gate, NULL, ex->gate_estride, E, F, d_x, (int)K, &pl, g, stream,
                                    e) ||
            mla_cuda_matmul_grouped(ex->up_type, ex->up, NULL, ex->up_estride, E, F, d_x, (int)K, &pl, u, stream, e) ||
            mla_cuda_swiglu(g, u, h, T * K * F, stream, e))
            return MLA_ERR;
    }
    if (q8_down) {
        if ((!qh_made && mla_cuda_quantize_q8(h, T * K, F, qh, stream, e)) ||
            mla_cuda_matmul_grouped_q8(ex->down_type, ex->down, NULL, ex->down_estride, F, E, qh, T * K, 1, &pl, y,
                                       NULL, stream, e))
            return MLA_ERR;
    } else if (mla_cuda_matmul_grouped(ex->down_type, ex->down, NULL, ex->down_estride, F, E, h, 1, &pl, y, stream, e))
        return MLA_ERR;
    return mla_cuda_moe_combine(y, d_ids, d_w, T, K, E, ex->rank, ex->world, d_out, stream, e);
}

extern "C" int mla_cuda_sample(const float *d_logits, int64_t T, int64_t n, const mla_cuda_sampling *sp,
                               uint64_t stream0, int32_t *d_ids, mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(n > 0 && n <= INT32_MAX);
    if (T == 0) return MLA_OK;
    samp_k k = {sp->temperature, sp->top_p, sp->min_p, sp->top_k, sp->seed, stream0};
    mlacu_launch(sample_kernel, (unsigned)T, SP_T, 0, (cudaStream_t)stream, d_logits, n, k, d_ids);
    MLACU_CHECK(cudaGetLastError(), e, "sample T=%lld n=%lld", (long long)T, (long long)n);
    return MLA_OK;
}
