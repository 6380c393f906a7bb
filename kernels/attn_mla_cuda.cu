/* attn_mla_cuda: absorbed MLA attention (split over key chunks, online softmax) in fp32 and on
 * the fp16 tensor cores, the combine of its splits, and the paged-cache row scatter of a batched
 * step. API and meaning: kernels/cuda_ops.h. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda_internal.h"
#ifdef MLA_CUDA_WGMMA
#include "kernels/attn_wg_cuda.h"
#endif

namespace {

/* ---------------------------------------------------------------- MLA attention */
/* Block = (group of AT_HG heads, split, token); 8 warps. Keys are walked in chunks of AT_C = 32
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
    const int t = blockIdx.z, hg0 = blockIdx.x * AT_HG, split = blockIdx.y;
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
 * the latent and rope rows are normalized, far from fp16's range). Block = (group of TC_HR = 32
 * heads, split, token), 4 warps, two blocks per SM: the head groups of one split are neighbours in
 * the grid, so they run together and L2 serves each key tile to all of them from one read of
 * HBM (at 128 heads and 128k keys a sequence's latent rows are 151 MB a layer, three times the
 * L2). The 32 query rows (latent + rope) are staged
 * once in shared memory; keys are walked in tiles of TC_KT = 32 rows, converted from the fp32
 * cache into shared memory (each key's row address looked up once per tile, the loads of a
 * thread issued in batches so that their latencies overlap). Warp w computes S for rows 16 (w / 2) .. +16 against keys
 * 16 (w % 2) .. +16; the two warps of a row block exchange row maxima and sums through shared
 * memory (both keep the same running max / sum in registers), write P to shared memory, and
 * each accumulates its half of the latent columns of O = P V (V is the latent part of the same
 * key rows). Row strides are an odd number of 16-byte units (ldmatrix without bank conflicts). */
constexpr int TC_HR = 32, TC_KT = 32, TC_T = 128;

/* KTL: keys a tile, TC_KT (32) or 16. The 16-key tile is the same kernel within 99 KB a block (a
 * compute capability 12.x part; the 512 + 64 latent's 32-key kernel takes 113 KB): warp w then
 * scores its 16 rows against keys 8 (w % 2) .. +8 (one n-tile of 8, two k-steps a 4-matrix
 * ldmatrix), P V takes one k-step of 16 keys, and the next tile's loads go in batches of 3. */
template <int L, int R, int KTL = TC_KT> struct tc_cfg {
    static constexpr int ROW = L + R;
    static constexpr int LDS = (ROW / 8) % 2 ? ROW + 16 : ROW + 8; /* 16-bit elements */
    static constexpr int LDP = KTL + 8;                            /* 80 bytes (5 units) or 48 (3) */
    static constexpr int NT = L / 16;                              /* n-tiles of 8 per warp (L / 2 columns) */
    static constexpr int KS = ROW / 16;                            /* k-steps of S */
    static constexpr int NJ = KTL / 16;                            /* n-tiles of 8 keys a warp of S */
    static constexpr int LB = 6 * KTL / TC_KT;                     /* loads of a batch: 6 (32 keys) or 3 (16) */
    static constexpr int PER = KTL * (ROW / 4) / TC_T;             /* float4 loads per thread and tile */
    static constexpr int NB = PER / LB;                            /* load batches per tile (6 k-steps of S each) */
    /* queries, two key tiles (the one in use, the next one loading), P, the row exchanges: 112.5 KB
     * at 512 + 64 with 32-key tiles (two blocks in the 228 KB of an H100/H200 SM), 75 KB with 16-key
     * tiles; 58.5 KB at 256 + 32 with 32-key tiles */
    static constexpr size_t SMEM = ((size_t)(TC_HR + 2 * KTL) * LDS + (size_t)TC_HR * LDP) * 2 + 2 * 4 * 16 * 4;
    /* with the static part (the key row pointers of two tiles) */
    static constexpr size_t SMEM_ALL = SMEM + sizeof(void *) * 2 * KTL;
    static_assert((KTL == TC_KT || KTL == 16) && (LDP / 8) % 2 == 1, "tensor-core attention key tile");
    static_assert(L % 32 == 0 && ROW % 16 == 0 && (LDS / 8) % 2 == 1 && (KTL * (ROW / 4)) % TC_T == 0 && PER % LB == 0 &&
                      KS == 6 * NB,
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

/* Sixteen query rows of the tensor-core kernels into shared memory, heads h0 .. h0 + 15 of token t
 * (zeros past a.H), times the scale in log2 units, as fp16 rows of ld elements: the latent part a
 * row at a time (128 float2 a pass), then the rope part (128 / (R / 2) rows a pass); every
 * address a constant offset from a thread's base (a row's elements found by division instead
 * took a decode step ~45 instructions a float2, run once a launch, cold). 128 threads. */
template <int L, int R, int ld>
__device__ __forceinline__ void stage_q16(const attn_k &a, __half *qs, int t, int h0, float sl2) {
    constexpr int T = 128, LU = L / 256, LN = 16 * LU, RH = R / 2, RR = T / RH, RN = 16 / RR;
    static_assert(L % 256 == 0 && T % RH == 0 && 16 % RR == 0 && ld % 2 == 0, "query staging shape");
    const int tid = threadIdx.x, nh = a.H - h0; /* rows with a head */
    const float2 *qa2 = (const float2 *)(a.qa + ((int64_t)t * a.H + h0) * L) + tid;
    float2 v[LN + RN];
#pragma unroll
    for (int u = 0; u < LN; u++) v[u] = u / LU < nh ? qa2[u / LU * (L / 2) + u % LU * T] : make_float2(0.f, 0.f);
    const int rh = tid / RH, rc = tid % RH;
    const float *qp = a.qp + t * a.qp_ld_t + (int64_t)(h0 + rh) * a.qp_ld_h + 2 * rc;
#pragma unroll
    for (int u = 0; u < RN; u++)
        v[LN + u] = rh + u * RR < nh ? *(const float2 *)(qp + (int64_t)u * RR * a.qp_ld_h) : make_float2(0.f, 0.f);
    uint32_t *q32 = (uint32_t *)(qs + 2 * tid), *r32 = (uint32_t *)(qs + rh * ld + L + 2 * rc);
#pragma unroll
    for (int u = 0; u < LN; u++) q32[(u / LU * ld + u % LU * 2 * T) / 2] = pack_h2(v[u].x * sl2, v[u].y * sl2);
#pragma unroll
    for (int u = 0; u < RN; u++) r32[u * RR * ld / 2] = pack_h2(v[LN + u].x * sl2, v[LN + u].y * sl2);
}

/* The cache row of token t's key k (its DSA selection's k-th where a.sel), NULL from k1 on: in
 * the block table tab (paged) or the contiguous cache; rows of ROW elements of type KT. */
template <typename KT, int ROW>
__device__ __forceinline__ const KT *tc_row(const attn_k &a, const float *const *tab, int t, int64_t k, int64_t k1) {
    if (k >= k1) return nullptr;
    const int64_t key = a.sel ? a.sel[t * a.sel_stride + k] : k;
    return tab ? paged_row_t<KT>(tab, a.tab_off, ROW, key) : (const KT *)a.kv + key * ROW;
}

/* A key tile of an fp16 cache copied as it is into key buffer kd (rows of ld halves) by 16-byte
 * cp.async copies from the rows in rp (both tensor-core kernels; zeros where a row is NULL, the copy
 * then reading nothing from zero), when any; one commit group either way. U: the copies of a thread
 * unrolled. 128 threads. */
template <typename KT, int ROW, int ld, int KTL, int U>
__device__ __forceinline__ void tc_tile_copy(bool any, const KT *const *rp, __half *kd, const void *zero) {
    constexpr int CPK = ROW / 8, CPT = KTL * CPK / 128;
    static_assert((KTL * CPK) % 128 == 0, "16-byte copies of a key tile");
    if (any) {
#pragma unroll U
        for (int u = 0; u < CPT; u++) {
            const int i = threadIdx.x + u * 128, j = i / CPK, c = i % CPK * 8;
            const KT *src = rp[j];
            cp_async16_zfill(kd + j * ld + c, src ? (const void *)(src + c) : zero, src != nullptr);
        }
    }
    cp_async_commit();
}

/* One key tile's P V for a warp's NT n-tiles of output (both tensor-core kernels): o's rows g and
 * g + 8 rescaled by al, then O += P V over the tile's KTL keys (P's fragments at paddr, V's, rows of
 * ld halves, at vaddr). */
template <int NT, int KTL, int ld>
__device__ __forceinline__ void tc_pv(float (&o)[NT][4], const float (&al)[2], uint32_t paddr, uint32_t vaddr) {
#pragma unroll
    for (int n = 0; n < NT; n++) {
        o[n][0] *= al[0];
        o[n][1] *= al[0];
        o[n][2] *= al[1];
        o[n][3] *= al[1];
    }
#pragma unroll
    for (int kk = 0; kk < KTL / 16; kk++) {
        uint32_t A[4];
        mlacu_ldsm_x4(A, paddr + kk * 32);
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            uint32_t B[4];
            mlacu_ldsm_x4_t(B, vaddr + kk * 16 * ld * 2 + n * 16);
            mlacu_mma_f16(o[n], A, B[0], B[1]);
            mlacu_mma_f16(o[n + 1], A, B[2], B[3]);
        }
    }
}

/* A warp's rows after the last tile (both tensor-core kernels): rows g and g + 8 are heads h0 + g
 * and h0 + g + 8 (none past a.H), their NT n-tiles from latent column col. One split: the output;
 * else the split's partial row of the work buffer, its maximum (natural units, as
 * mla_attn_reduce_kernel reads) and sum written by the warp with ml. */
template <int L, int NT>
__device__ __forceinline__ void tc_store(const attn_k &a, const float (&o)[NT][4], const float (&m_r)[2],
                                         const float (&l_r)[2], int t, int h0, int split, int col, bool ml) {
    const int g = (threadIdx.x & 31) >> 2, c4 = threadIdx.x & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int hh = h0 + g + 8 * r;
        if (hh >= a.H) continue;
        if (a.splits == 1) {
            const float inv = l_r[r] > 0.f ? 1.f / l_r[r] : 0.f;
            float *dst = a.out + ((int64_t)t * a.H + hh) * L + col + 2 * c4;
#pragma unroll
            for (int n = 0; n < NT; n++) *(float2 *)(dst + 8 * n) = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
        } else {
            float *w = a.work + (((int64_t)t * a.H + hh) * a.splits + split) * (L + 2);
            if (ml && c4 == 0) {
                w[0] = m_r[r] * 0.69314718055994531f;
                w[1] = l_r[r];
            }
            float *dst = w + 2 + col + 2 * c4;
#pragma unroll
            for (int n = 0; n < NT; n++) *(float2 *)(dst + 8 * n) = make_float2(o[n][2 * r], o[n][2 * r + 1]);
        }
    }
}

/* KT: the cache's element type. An fp32 cache is loaded through registers during the scores of
 * the tile before (rounded to fp16 on the way to shared memory); an fp16 cache (ASYNC) is copied
 * as it is by cp.async, two tiles in flight: each tile's copy is issued as soon as its buffer is
 * free, and the first two are issued before the queries are staged. */
template <int L, int R, typename KT, int KTL>
__global__ void __launch_bounds__(TC_T, 2) mla_attn_tc_kernel(attn_k a) {
    using C = tc_cfg<L, R, KTL>;
    constexpr bool ASYNC = std::is_same<KT, __half>::value;
    static_assert((KTL * (C::ROW / 8)) % TC_T == 0, "16-byte copies of a key tile");
    extern __shared__ __align__(16) unsigned char tc_sm[];
    __shared__ const KT *rowp[2][KTL]; /* the key rows of the current / next tile (NULL: none) */
    using V4 = typename kv4<KT>::T;
    __half *qs = (__half *)tc_sm;
    __half *ks = qs + TC_HR * C::LDS; /* two tiles of KTL rows */
    __half *ps = ks + 2 * KTL * C::LDS;
    float *pmax = (float *)(ps + TC_HR * C::LDP), *psum = pmax + 4 * 16;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c4 = lane & 3;
    const int mt = warp >> 1, half = warp & 1;
    const int t = blockIdx.z, hg0 = blockIdx.x * TC_HR, split = blockIdx.y;
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
    split_keys(a, t, split, KTL, k0, k1);
    /* the cache row of key k of this split (NULL past k1): a lane of warp 0 looks it up, a key a
     * lane of a tile; the lookups (the block table, the selected keys) are loads, issued well
     * before the rows are stored for the tile's copy */
    auto row_at = [&](int64_t k) { return tc_row<KT, C::ROW>(a, tab, t, k, k1); };
    /* batch b of a tile: LB loads of 4 elements per thread from the rows in rp, then into key
     * buffer kd */
    constexpr int IPK = C::ROW / 4, LB = C::LB;
    auto load_batch = [&](const KT *const *rp, int b, V4 *v) {
#pragma unroll
        for (int u = 0; u < LB; u++) {
            const int i = tid + (LB * b + u) * TC_T, j = i / IPK, c = i % IPK * 4;
            const KT *src = rp[j];
            v[u] = src ? __ldg((const V4 *)(src + c)) : kv4<KT>::zero();
        }
    };
    auto store_batch = [&](__half *kd, int b, const V4 *v) {
#pragma unroll
        for (int u = 0; u < LB; u++) {
            const int i = tid + (LB * b + u) * TC_T, j = i / IPK, c = i % IPK * 4;
            *(uint2 *)(kd + j * C::LDS + c) = kv4<KT>::h4(v[u]);
        }
    };
    /* an fp16 tile (rows past k1: zeros) when any, one commit group either way; unrolled */
    constexpr int CPT = KTL * (C::ROW / 8) / TC_T;
    auto issue_tile = [&](bool any, const KT *const *rp, __half *kd) {
        tc_tile_copy<KT, C::ROW, C::LDS, KTL, CPT>(any, rp, kd, a.qa);
    };
    if (warp == 0 && lane < KTL && k0 < k1) { /* both tiles' lookups in flight together */
        const KT *r0 = row_at(k0 + lane), *r1 = ASYNC ? row_at(k0 + KTL + lane) : nullptr;
        rowp[0][lane] = r0;
        if (ASYNC) rowp[1][lane] = r1;
    }
    if constexpr (ASYNC) { /* tiles 0 and 1 in flight while the queries are staged (a group each) */
        __syncthreads();
        issue_tile(k0 < k1, rowp[0], ks);
        issue_tile(k0 + KTL < k1, rowp[1], ks + KTL * C::LDS);
    }
    if (early) mlacu_pdl_wait();
    /* Split (the combine, or v_b combining, follows: blocks that would take issue slots from these
     * while they wait), the next kernel is scheduled at each block's last tile; with one split
     * (prompts, large decode batches), as soon as the wait has returned. */
    const bool late = a.splits > 1;
    if (!late) mlacu_pdl_trigger();
    /* the queries, 16 rows at a time (the host checked their alignment) */
    const float sl2 = a.scale * 1.44269504088896341f; /* scores in log2 units, folded into q */
#pragma unroll 1
    for (int h = 0; h < TC_HR; h += 16) stage_q16<L, R, C::LDS>(a, qs + h * C::LDS, t, hg0 + h, sl2);
    /* the first tile, loaded before the loop (two batches in flight); the loop loads tile i + 1
     * during tile i's scores */
    __syncthreads();
    if (tid == 0) MLACU_TRACE_MARK(3);
    if (!ASYNC && k0 < k1) {
#pragma unroll 1
        for (int b = 0; b < C::NB; b += 2) {
            V4 v[LB], v2[LB];
            load_batch(rowp[0], b, v);
            if (b + 1 < C::NB) load_batch(rowp[0], b + 1, v2);
            store_batch(ks, b, v);
            if (b + 1 < C::NB) store_batch(ks, b + 1, v2);
        }
        if (warp == 0 && lane < KTL && k0 + KTL < k1) rowp[1][lane] = row_at(k0 + KTL + lane);
    }
    float o[C::NT][4];
#pragma unroll
    for (int n = 0; n < C::NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    const uint32_t qaddr = smem_u32(qs + (mt * 16 + (lane & 15)) * C::LDS + (lane >> 4) * 8);
    /* S's B fragments: 32-key tiles, keys 16 half .. +16 of one k-step (matrices: keys +0 and +8,
     * columns +0 and +8); 16-key tiles, keys 8 half .. +8 of two k-steps (columns +0, +8, +16, +24) */
    const uint32_t kaddr0 =
        KTL == TC_KT ? smem_u32(ks + (half * 16 + (lane & 7) + ((lane >> 4) << 3)) * C::LDS + ((lane >> 3) & 1) * 8)
                     : smem_u32(ks + (half * 8 + (lane & 7)) * C::LDS + (lane >> 3) * 8);
    const uint32_t paddr = smem_u32(ps + (mt * 16 + (lane & 15)) * C::LDP + (lane >> 4) * 8);
    const uint32_t vaddr0 =
        smem_u32(ks + ((lane & 7) + (((lane >> 3) & 1) << 3)) * C::LDS + half * (L / 2) + (lane >> 4) * 8);
    constexpr uint32_t KBUF = KTL * C::LDS * 2; /* bytes of one key tile */
    int buf = 0;
    for (int64_t kb = k0; kb < k1; kb += KTL, buf ^= 1) {
        if (late && kb + KTL >= k1) mlacu_pdl_trigger();
        if constexpr (ASYNC) cp_async_wait<1>(); /* this thread's copies of tile buf are done */
        __syncthreads(); /* tile buf is stored, rowp[buf ^ 1] holds the next tile's rows, and the
                          * readers of buffer buf ^ 1 (the previous tile) are done */
        const bool next = !ASYNC && kb + KTL < k1;
        /* the rows of the tile after next: looked up now, stored after the scores */
        const KT *row2 = warp == 0 && lane < KTL ? row_at(kb + 2 * KTL + lane) : nullptr;
        const uint32_t kaddr = kaddr0 + buf * KBUF, vaddr = vaddr0 + buf * KBUF;
        __half *knext = ks + (buf ^ 1) * KTL * C::LDS;
        /* S = Q K^T, two accumulator sets per n-tile (independent mma chains), and in between
         * the next tile's loads, batch by batch */
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        float s2[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll 1
        for (int b = 0; b < C::NB; b++) {
            V4 v[LB];
            if (next) load_batch(rowp[buf ^ 1], b, v);
#pragma unroll
            for (int k6 = 0; k6 < 6; k6 += 2) {
                const int kk = 6 * b + k6;
                uint32_t A[4], B[4], A2[4];
                mlacu_ldsm_x4(A, qaddr + kk * 32);
                mlacu_ldsm_x4(B, kaddr + kk * 32);
                mlacu_ldsm_x4(A2, qaddr + kk * 32 + 32);
                if constexpr (KTL == TC_KT) {
                    uint32_t B2[4];
                    mlacu_ldsm_x4(B2, kaddr + kk * 32 + 32);
                    mlacu_mma_f16(s[0], A, B[0], B[1]);
                    mlacu_mma_f16(s[1], A, B[2], B[3]);
                    mlacu_mma_f16(s2[0], A2, B2[0], B2[1]);
                    mlacu_mma_f16(s2[1], A2, B2[2], B2[3]);
                } else { /* B: k-steps kk and kk + 1 of the warp's 8 keys; four chains over the pairs */
                    if (k6 & 2) {
                        mlacu_mma_f16(s[1], A, B[0], B[1]);
                        mlacu_mma_f16(s2[1], A2, B[2], B[3]);
                    } else {
                        mlacu_mma_f16(s[0], A, B[0], B[1]);
                        mlacu_mma_f16(s2[0], A2, B[2], B[3]);
                    }
                }
            }
            if (next) store_batch(knext, b, v);
        }
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] += s2[j][e];
        if constexpr (KTL != TC_KT) {
#pragma unroll
            for (int e = 0; e < 4; e++) s[0][e] += s[1][e];
        }
        if (warp == 0 && lane < KTL && kb + 2 * KTL < k1) rowp[buf][lane] = row2;
        /* s[j][e], j < NJ: row g (e < 2) or g + 8, key KTL / 2 half + 8 j + 2 c4 + (e & 1) */
        constexpr int NJ = C::NJ;
        const int nvalid = (int)(k1 - kb < KTL ? k1 - kb : KTL);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = half * (KTL / 2) + 8 * j + 2 * c4 + (e & 1);
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
        for (int j = 0; j < NJ; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[j][e] = exp2f(s[j][e] - mn[e >> 1]);
                sum[e >> 1] += s[j][e];
            }
            const int col = half * (KTL / 2) + 8 * j + 2 * c4;
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
        tc_pv<C::NT, KTL, C::LDS>(o, al, paddr, vaddr);
        if constexpr (ASYNC) { /* buffer buf is free once every warp is past its P V: tile + 2 into it */
            __syncthreads();
            issue_tile(kb + 2 * KTL < k1, rowp[buf], ks + buf * KTL * C::LDS);
        }
        if (tid == 0) MLACU_TRACE_MARK(4);
    }
    if constexpr (ASYNC) cp_async_wait<0>(); /* no copy outlives the block (only empty groups remain) */
    tc_store<L, C::NT>(a, o, m_r, l_r, t, hg0 + mt * 16, split, half * (L / 2), half == 0);
    if (late && k0 >= k1) mlacu_pdl_trigger();
    if (tid == 0) MLACU_TRACE_MARK(1);
}

/* ---------------------------------------------------------------- the same for up to 16 heads */
/* The tensor-core attention of TC_NR = 16 heads a block (V2-Lite's 16, a rank of TP 8: V3's 16,
 * GLM-5's and Kimi-K2's 8) over the fp16 cache: the kernel above stages 32 query rows, so at 16
 * heads or fewer half of its rows and of its products are zeros, and each of its 4 warps carries
 * a quarter of the block's 32 x L output (o[L / 16][4]: the code a decode step runs once a
 * launch, cold, as the step's other 13 launches of a layer take the SM's instruction cache
 * between two of its layers; bench/boundary_cuda.cu -c). Here warp w scores the 16 rows against
 * keys 8 w .. +8 of each 32-key tile (four mma chains over the k-steps), the four warps' row
 * maxima and sums meet in shared memory (added in warp order: every warp keeps the same running
 * sum), and warp w accumulates columns L / 4 w .. +L / 4 of O = P V: a quarter of the registers
 * and of the unrolled code. Tiles, lookups, copies, the programmatic launch and the partial rows
 * written are the kernel above's; the row sums are added in another order, so the results agree
 * to rounding, not bit for bit. */
constexpr int TC_NR = 16;
template <int L, int R> struct tcn_cfg {
    static constexpr int ROW = L + R;
    static constexpr int LDS = (ROW / 8) % 2 ? ROW + 16 : ROW + 8; /* 16-bit elements */
    static constexpr int LDP = TC_KT + 8;                          /* 80 bytes: 5 units */
    static constexpr int NT = L / 32;                              /* n-tiles of 8 a warp (L / 4 columns) */
    static constexpr int KS = ROW / 16;                            /* k-steps of S */
    static constexpr size_t SMEM = ((size_t)(TC_NR + 2 * TC_KT) * LDS + (size_t)TC_NR * LDP) * 2 + 2 * 4 * 16 * 4;
    static constexpr size_t SMEM_ALL = SMEM + sizeof(void *) * 2 * TC_KT;
    static_assert(KS % 2 == 0 && NT % 2 == 0 && (LDS / 8) % 2 == 1,
                  "16-head tensor-core attention shape");
};

template <int L, int R> __global__ void __launch_bounds__(TC_T, 2) mla_attn_tcn_kernel(attn_k a) {
    using C = tcn_cfg<L, R>;
    extern __shared__ __align__(16) unsigned char tc_sm[];
    __shared__ const __half *rowp[2][TC_KT];
    __half *qs = (__half *)tc_sm;
    __half *ks = qs + TC_NR * C::LDS; /* two tiles of TC_KT rows */
    __half *ps = ks + 2 * TC_KT * C::LDS;
    float *pmax = (float *)(ps + TC_NR * C::LDP), *psum = pmax + 4 * 16;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c4 = lane & 3;
    const int t = blockIdx.z, hg0 = blockIdx.x * TC_NR, split = blockIdx.y;
    const bool early = a.tabs && !a.sel; /* as the kernel above */
    if (!early) mlacu_pdl_wait();
    const float *const *tab = a.tabs ? a.tabs[t] : nullptr;
    int64_t k0, k1;
    split_keys(a, t, split, TC_KT, k0, k1);
    auto row_at = [&](int64_t k) { return tc_row<__half, C::ROW>(a, tab, t, k, k1); };
    auto issue_tile = [&](bool any, const __half *const *rp, __half *kd) { /* copies unrolled by 2 */
        tc_tile_copy<__half, C::ROW, C::LDS, TC_KT, 2>(any, rp, kd, a.qa);
    };
    if (warp == 0 && k0 < k1) {
        const __half *r0 = row_at(k0 + lane), *r1 = row_at(k0 + TC_KT + lane);
        rowp[0][lane] = r0;
        rowp[1][lane] = r1;
    }
    __syncthreads();
    issue_tile(k0 < k1, rowp[0], ks);
    issue_tile(k0 + TC_KT < k1, rowp[1], ks + TC_KT * C::LDS);
    if (early) mlacu_pdl_wait();
    const bool late = a.splits > 1;
    if (!late) mlacu_pdl_trigger();
    stage_q16<L, R, C::LDS>(a, qs, t, hg0, a.scale * 1.44269504088896341f);
    if (tid == 0) MLACU_TRACE_MARK(3);
    float o[C::NT][4];
#pragma unroll
    for (int n = 0; n < C::NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    /* A: the 16 query rows (as the kernel above); B: keys 8 warp .. +8, two k-steps a 4-matrix
     * load (columns +0, +8, +16, +24); P's rows; V: keys x columns L / 4 warp .. */
    const uint32_t qaddr = smem_u32(qs + (lane & 15) * C::LDS + (lane >> 4) * 8);
    const uint32_t kaddr0 = smem_u32(ks + (warp * 8 + (lane & 7)) * C::LDS + (lane >> 3) * 8);
    const uint32_t paddr = smem_u32(ps + (lane & 15) * C::LDP + (lane >> 4) * 8);
    const uint32_t vaddr0 =
        smem_u32(ks + ((lane & 7) + (((lane >> 3) & 1) << 3)) * C::LDS + warp * (L / 4) + (lane >> 4) * 8);
    constexpr uint32_t KBUF = TC_KT * C::LDS * 2;
    int buf = 0;
    for (int64_t kb = k0; kb < k1; kb += TC_KT, buf ^= 1) {
        if (late && kb + TC_KT >= k1) mlacu_pdl_trigger();
        cp_async_wait<1>();
        __syncthreads(); /* tile buf stored (and, the first time, the queries) */
        const __half *row2 = warp == 0 ? row_at(kb + 2 * TC_KT + lane) : nullptr;
        const uint32_t kaddr = kaddr0 + buf * KBUF, vaddr = vaddr0 + buf * KBUF;
        float s[4][4] = {};
#pragma unroll 3
        for (int kk = 0; kk < C::KS; kk += 4) {
#pragma unroll
            for (int h2 = 0; h2 < 2; h2++) {
                if (C::KS % 4 && kk + 2 * h2 >= C::KS) break; /* 256 + 32: 18 k-steps */
                uint32_t A[4], A2[4], B[4];
                mlacu_ldsm_x4(A, qaddr + (kk + 2 * h2) * 32);
                mlacu_ldsm_x4(A2, qaddr + (kk + 2 * h2) * 32 + 32);
                mlacu_ldsm_x4(B, kaddr + (kk + 2 * h2) * 32);
                mlacu_mma_f16(s[2 * h2], A, B[0], B[1]);
                mlacu_mma_f16(s[2 * h2 + 1], A2, B[2], B[3]);
            }
        }
#pragma unroll
        for (int e = 0; e < 4; e++) s[0][e] = (s[0][e] + s[1][e]) + (s[2][e] + s[3][e]);
        if (warp == 0 && kb + 2 * TC_KT < k1) rowp[buf][lane] = row2;
        /* s[0][e]: row g (e < 2) or g + 8, key 8 warp + 2 c4 + (e & 1) */
        const int nvalid = (int)(k1 - kb < TC_KT ? k1 - kb : TC_KT);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float v = warp * 8 + 2 * c4 + (e & 1) < nvalid ? s[0][e] : -INFINITY;
            s[0][e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        if (c4 == 0) pmax[warp * 16 + g] = mx[0], pmax[warp * 16 + g + 8] = mx[1];
        __syncthreads();
        float mn[2], al[2], sum[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = g + 8 * r;
            const float tm = fmaxf(fmaxf(pmax[row], pmax[16 + row]), fmaxf(pmax[32 + row], pmax[48 + row]));
            mn[r] = fmaxf(m_r[r], tm);
            al[r] = exp2f(m_r[r] - mn[r]);
        }
#pragma unroll
        for (int e = 0; e < 4; e++) s[0][e] = exp2f(s[0][e] - mn[e >> 1]);
        sum[0] = s[0][0] + s[0][1], sum[1] = s[0][2] + s[0][3];
        const int col = warp * 8 + 2 * c4;
        *(uint32_t *)(ps + g * C::LDP + col) = pack_h2(s[0][0], s[0][1]);
        *(uint32_t *)(ps + (g + 8) * C::LDP + col) = pack_h2(s[0][2], s[0][3]);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
        }
        if (c4 == 0) psum[warp * 16 + g] = sum[0], psum[warp * 16 + g + 8] = sum[1];
        __syncthreads(); /* P and the sums are in */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = g + 8 * r;
            l_r[r] = l_r[r] * al[r] + ((psum[row] + psum[16 + row]) + (psum[32 + row] + psum[48 + row]));
            m_r[r] = mn[r];
        }
        tc_pv<C::NT, TC_KT, C::LDS>(o, al, paddr, vaddr);
        __syncthreads(); /* buffer buf, P and the row exchanges are free: tile + 2 into the buffer */
        issue_tile(kb + 2 * TC_KT < k1, rowp[buf], ks + buf * TC_KT * C::LDS);
        if (tid == 0) MLACU_TRACE_MARK(4);
    }
    cp_async_wait<0>();
    tc_store<L, C::NT>(a, o, m_r, l_r, t, hg0, split, warp * (L / 4), warp == 0);
    if (late && k0 >= k1) mlacu_pdl_trigger();
    if (tid == 0) MLACU_TRACE_MARK(1);
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
 * (mla-gpu-check --attn1, measured on an H200 on 2026-11-30; at 4k and 16k keys those grids time as the
 * committed ones or better). mla_cuda_attn_tune changes the first bound. */
constexpr int TC_MIN_KEYS = 128, TC_MIN_KEYS1 = 64;
static int g_tc_min_keys = 0;
extern "C" void mla_cuda_attn_tune(int min_keys) {
    MLA_ASSERT(min_keys >= 0 && min_keys % TC_KT == 0);
    g_tc_min_keys = min_keys;
}

/* Splits of a launch of `base` blocks a split (tokens x head groups) over up to nk_max keys a
 * token, each split at least min_keys keys, within the work buffer; `slots`: the blocks resident
 * on the GPU at once (blocks an SM x SMs).
 * - Where the keys allow at most one wave (short contexts), as many splits as they allow. min_keys2
 *   (< min_keys, or 0): where min_keys leaves fewer blocks than SMs, splits of down to min_keys2
 *   keys up to a block an SM.
 * - Else (long contexts) the count of the least modelled time, waves x (keys a split + a block's
 *   fixed cost of AT_FIXED_KEYS keys: its queries, the first tiles' latency, its partial rows
 *   written and combined), the fewest splits on a tie: whole waves. The former rule, the first
 *   count past one wave, left V3's batch 8 (32 blocks a split, 9 splits, 288 blocks on 264
 *   slots) two waves of which the second held 24 blocks; 8 splits are one wave of 256.
 * Every split of a token takes an equal part of that token's keys (split_keys), so the blocks of
 * a launch over sequences of one length take the same time. */
constexpr int64_t AT_FIXED_KEYS = 256;
/* The rule from its inputs: cap, the most splits the work buffer and the combine take; sms, the
 * device's SMs. */
static int64_t split_count(int64_t base, int64_t nk_max, int64_t min_keys, int64_t slots, int64_t sms, int64_t cap,
                           int64_t min_keys2) {
    if (cap <= 1 || base < 1 || slots < 1) return 1;
    const int64_t maxs = std::min(cap, (nk_max + min_keys - 1) / min_keys);
    const int64_t want = (slots + base - 1) / base; /* one wave or more */
    int64_t splits = 1;
    if (maxs <= want) {
        splits = maxs;
        if (min_keys2 > 0 && splits * base < sms) {
            const int64_t want2 = (sms + base - 1) / base, maxs2 = (nk_max + min_keys2 - 1) / min_keys2;
            splits = std::max(splits, std::min(std::min(want2, maxs2), cap));
        }
    } else {
        double best = INFINITY;
        for (int64_t s = 1; s <= maxs; s++) {
            const double waves = (double)((s * base + slots - 1) / slots),
                         cost = waves * (double)((nk_max + s - 1) / s + AT_FIXED_KEYS);
            if (cost < best) best = cost, splits = s;
        }
    }
    return std::max<int64_t>(splits, 1);
}

/* the most splits of a launch of T tokens, H heads, latent L within work_floats floats of work
 * buffer and the combine */
static int64_t split_cap(int64_t T, int64_t H, int64_t L, size_t work_floats) {
    const size_t per_split = mla_cuda_attn_work_floats(T, H, L, 1);
    return per_split ? std::min<int64_t>(AR_MAXS, (int64_t)(work_floats / per_split)) : 1;
}

static int attn_splits(const mla_cuda_attn_args *a, int64_t base, int64_t nk_max, int64_t min_keys, int64_t slots,
                       int64_t min_keys2 = 0) {
    if (!a->work) return 1;
    return (int)split_count(base, nk_max, min_keys, slots, mlacu_sm_count(),
                            split_cap(a->n_tokens, a->n_head, a->kv_lora, a->work_floats), min_keys2);
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

/* The key tile of the tensor-core kernel for latent L + rope R on this device: 32 where the device
 * (or MLA_CUDA_SMEM_CAP) gives a block its shared memory (512 + 64: 113 KB, Hopper and Blackwell
 * data-center parts, the A100), else 16 where that fits (512 + 64: 75 KB, GPUs of 99-101 KB a block
 * such as sm_86/89/120), else 0: the fp32 kernel. A failed query reads as 48 KB. */
static bool g_tc_tile16 = false; /* mla_cuda_attn_tile16 */
extern "C" void mla_cuda_attn_tile16(bool on) { g_tc_tile16 = on; }

template <int L, int R> static int tc_tile(void) {
    if constexpr (L == 512 && R == 64) {
        if ((size_t)mlacu_smem_optin() >= tc_cfg<L, R, TC_KT>::SMEM_ALL && !g_tc_tile16) return TC_KT;
        if ((size_t)mlacu_smem_optin() >= tc_cfg<L, R, 16>::SMEM_ALL) return 16;
        return 0;
    }
    return (size_t)mlacu_smem_optin() >= tc_cfg<L, R, TC_KT>::SMEM_ALL ? TC_KT : 0;
}

/* MLA_OK or MLA_ERR: the kernel's shared memory allowed, once per process (one device per
 * process, or ranks of one process on one device); *bps (if given): its blocks resident per SM */
template <int L, int R, typename KT, int KTL> static int tc_launch_setup(mla_err *e, int *bps = nullptr) {
    using C = tc_cfg<L, R, KTL>;
    static bool done = false;
    static int occ = 0;
    if (!done) {
        MLACU_CHECK(mlacu_smem_allow(mla_attn_tc_kernel<L, R, KT, KTL>, C::SMEM), e,
                    "mla_attn (tensor cores, %d-key tiles): shared memory %zu", KTL, C::SMEM);
        /* all of the SM's unified memory as shared memory: two blocks per SM where they fit */
        MLACU_CHECK(cudaFuncSetAttribute(mla_attn_tc_kernel<L, R, KT, KTL>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         100),
                    e, "mla_attn (tensor cores): carveout");
        MLACU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, mla_attn_tc_kernel<L, R, KT, KTL>, TC_T, C::SMEM),
                    e, "mla_attn (tensor cores, %d-key tiles): occupancy", KTL);
        done = true;
    }
    if (bps) *bps = occ;
    return MLA_OK;
}

/* One launch of the KTL-key kernel for the args' shape, its splits sized for this device
 * (attn_splits: the blocks resident per SM times the SMs); *splits gets them. */
template <int L, int R, typename KT, int KTL>
static int tc_launch(const mla_cuda_attn_args *a, attn_k k, int64_t nk_max, cudaStream_t stream, int *splits, mla_err *e) {
    using C = tc_cfg<L, R, KTL>;
    int bps = 0;
    if (tc_launch_setup<L, R, KT, KTL>(e, &bps)) return MLA_ERR;
    const int64_t T = a->n_tokens, H = a->n_head, hgroups = (H + TC_HR - 1) / TC_HR;
    k.splits = attn_splits(a, T * hgroups, nk_max, g_tc_min_keys ? g_tc_min_keys : TC_MIN_KEYS,
                           (int64_t)std::max(bps, 1) * mlacu_sm_count(), T == 1 && !g_tc_min_keys ? TC_MIN_KEYS1 : 0);
    const dim3 grid((unsigned)hgroups, (unsigned)k.splits, (unsigned)T);
    mlacu_launch(mla_attn_tc_kernel<L, R, KT, KTL>, grid, TC_T, C::SMEM, stream, k);
    MLACU_CHECK(cudaGetLastError(), e, "mla_attn (tensor cores, %d-key tiles) T=%lld H=%lld splits=%d", KTL, (long long)T,
                (long long)H, k.splits);
    *splits = k.splits;
    return MLA_OK;
}

/* The 16-head kernel for the args' shape where the device gives a block its shared memory:
 * MLA_OK, MLA_ERR, or 1 (not taken: the kernel above takes the launch) */
template <int L, int R>
static int tcn_launch(const mla_cuda_attn_args *a, attn_k k, int64_t nk_max, cudaStream_t stream, int *splits, mla_err *e) {
    using C = tcn_cfg<L, R>;
    static int occ = -1; /* blocks an SM; 0: the kernel does not fit this device */
    if (occ < 0) {
        if ((size_t)mlacu_smem_optin() < C::SMEM_ALL) {
            occ = 0;
        } else {
            MLACU_CHECK(mlacu_smem_allow(mla_attn_tcn_kernel<L, R>, C::SMEM), e,
                        "mla_attn (tensor cores, 16 heads): shared memory %zu", C::SMEM);
            MLACU_CHECK(cudaFuncSetAttribute(mla_attn_tcn_kernel<L, R>, cudaFuncAttributePreferredSharedMemoryCarveout, 100),
                        e, "mla_attn (tensor cores, 16 heads): carveout");
            int n = 0;
            MLACU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, mla_attn_tcn_kernel<L, R>, TC_T, C::SMEM), e,
                        "mla_attn (tensor cores, 16 heads): occupancy");
            occ = n;
        }
    }
    if (occ == 0) return 1;
    const int64_t T = a->n_tokens, hgroups = (a->n_head + TC_NR - 1) / TC_NR;
    k.splits = attn_splits(a, T * hgroups, nk_max, g_tc_min_keys ? g_tc_min_keys : TC_MIN_KEYS,
                           (int64_t)occ * mlacu_sm_count(), T == 1 && !g_tc_min_keys ? TC_MIN_KEYS1 : 0);
    const dim3 grid((unsigned)hgroups, (unsigned)k.splits, (unsigned)T);
    mlacu_launch(mla_attn_tcn_kernel<L, R>, grid, TC_T, C::SMEM, stream, k);
    MLACU_CHECK(cudaGetLastError(), e, "mla_attn (tensor cores, 16 heads) T=%lld H=%lld splits=%d", (long long)T,
                (long long)a->n_head, k.splits);
    *splits = k.splits;
    return MLA_OK;
}

/* the shape's kernel of this device (tc_tile) for element type KT: MLA_OK, MLA_ERR, or 1 (none);
 * up to 16 heads over an fp16 cache, the 16-head kernel where it fits */
template <int L, int R, typename KT>
static int tc_launch_any(const mla_cuda_attn_args *a, const attn_k &k, int64_t nk_max, cudaStream_t stream, int *splits,
                         mla_err *e) {
    if constexpr (std::is_same<KT, __half>::value)
        if (a->n_head <= TC_NR) {
            const int r = tcn_launch<L, R>(a, k, nk_max, stream, splits, e);
            if (r != 1) return r;
        }
    const int kt = tc_tile<L, R>();
    if (kt == TC_KT) return tc_launch<L, R, KT, TC_KT>(a, k, nk_max, stream, splits, e);
    if constexpr (L == 512 && R == 64)
        if (kt == 16) return tc_launch<L, R, KT, 16>(a, k, nk_max, stream, splits, e);
    return 1;
}

extern "C" int mla_cuda_attn_tc_tile(int64_t kv_lora, int64_t n_rope) {
    if (kv_lora == 512 && n_rope == 64) return tc_tile<512, 64>();
    if (kv_lora == 256 && n_rope == 32) return tc_tile<256, 32>();
    return 0;
}

extern "C" size_t mla_cuda_attn_tc_smem(int64_t kv_lora, int64_t n_rope) {
    const int kt = mla_cuda_attn_tc_tile(kv_lora, n_rope);
    if (kv_lora == 512) return kt == TC_KT ? tc_cfg<512, 64>::SMEM_ALL : kt == 16 ? tc_cfg<512, 64, 16>::SMEM_ALL : 0;
    return kt == TC_KT ? tc_cfg<256, 32>::SMEM_ALL : 0;
}

template <int KTL> static int tc_blocks_per_sm(void) {
    mla_err e;
    int n = 0;
    if (tc_launch_setup<512, 64, __half, KTL>(&e, &n)) return -1;
    return n;
}

extern "C" int mla_cuda_attn_tc_blocks_per_sm(void) {
    const int kt = tc_tile<512, 64>();
    return kt == TC_KT ? tc_blocks_per_sm<TC_KT>() : kt == 16 ? tc_blocks_per_sm<16>() : 0;
}

extern "C" int mla_cuda_attn_tc_splits(int64_t n_tokens, int64_t n_head, int64_t kv_lora, int64_t max_keys,
                                       size_t work_floats, int blocks_per_sm, int sms) {
    const int64_t hgroups = (n_head + TC_HR - 1) / TC_HR;
    return (int)split_count(n_tokens * hgroups, max_keys, TC_MIN_KEYS, (int64_t)blocks_per_sm * sms, sms,
                            split_cap(n_tokens, n_head, kv_lora, work_floats), n_tokens == 1 ? TC_MIN_KEYS1 : 0);
}

/* The warpgroup kernel (attn_wg_cuda.cu) splits over keys as the tensor-core one, at least
 * WG_MIN_KEYS keys a split (a block's fixed cost, its 72 KB of queries and first two tiles, is
 * about twice the mma.sync kernel's), down to WG_MIN_KEYS1 for one token, one block an SM. */
constexpr int WG_MIN_KEYS = 256, WG_MIN_KEYS1 = 128, WG_HEADS = 64;
static int g_wg_mode = 1; /* mla_cuda_attn_wg */
extern "C" void mla_cuda_attn_wg(int mode) {
    MLA_ASSERT(mode >= 0 && mode <= 2);
    g_wg_mode = mode;
}

extern "C" int mla_cuda_attn_wg_ok(void) {
#ifdef MLA_CUDA_WGMMA
    return mlacu_awg_device_ok() && mlacu_awg_blocks_per_sm() > 0;
#else
    return 0;
#endif
}

extern "C" int mla_cuda_attn_wg_splits(int64_t n_tokens, int64_t n_head, int64_t kv_lora, int64_t max_keys,
                                       size_t work_floats, int sms) {
    return (int)split_count(n_tokens * (n_head / WG_HEADS), max_keys, WG_MIN_KEYS, sms, sms,
                            split_cap(n_tokens, n_head, kv_lora, work_floats), n_tokens == 1 ? WG_MIN_KEYS1 : 0);
}

/* The warpgroup kernel where the rule above (cuda_ops.h) takes it: MLA_OK, MLA_ERR, or 1 (not
 * taken). The caller has checked the alignment of the queries and the contiguous cache. */
static int wg_attn(const mla_cuda_attn_args *a, int64_t nk_max, cudaStream_t st, mla_err *e) {
    if (!g_wg_mode || !a->kv_f16 || a->kv_lora != 512 || a->n_rope != 64 || a->n_head % WG_HEADS) return 1;
    if (g_wg_mode == 1 && (a->sel ? a->n_tokens < MLA_CUDA_ATTN_WG_SEL_MIN_TOKENS : nk_max < MLA_CUDA_ATTN_WG_MIN_KEYS))
        return 1;
    if (a->blk_tok && (a->blk_off & 7)) return 1; /* 16-byte copies */
#ifdef MLA_CUDA_WGMMA
    if (!mlacu_awg_device_ok()) return 1;
    const int bps = mlacu_awg_blocks_per_sm();
    if (bps < 0) return mla_errf(e, "mla_attn (wgmma): shared memory or occupancy query failed");
    if (bps == 0) return 1;
    const int64_t T = a->n_tokens, hgroups = a->n_head / WG_HEADS;
    const int splits = attn_splits(a, T * hgroups, nk_max, WG_MIN_KEYS, (int64_t)bps * mlacu_sm_count(),
                                   T == 1 ? WG_MIN_KEYS1 : 0);
    mlacu_awg_args k = {a->q_abs, a->q_pe, a->q_pe_ld_t, a->q_pe_ld_h, (int)a->n_head, (const __half *)a->kv,
                        a->blk_tok, a->blk_off, a->pos0, a->pos_tok, a->sel, a->n_sel, a->sel_stride,
                        a->scale, a->out, a->work, splits};
    MLACU_CHECK(mlacu_awg_launch(&k, T, st), e, "mla_attn (wgmma) T=%lld H=%lld splits=%d", (long long)T,
                (long long)a->n_head, splits);
    return attn_reduce(a, splits, st, e);
#else
    (void)a, (void)nk_max, (void)st, (void)e;
    return 1;
#endif
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
    attn_k k = {a->q_abs, a->q_pe, a->q_pe_ld_t, a->q_pe_ld_h, (int)a->n_head, (int)L, (int)R, a->kv, a->blk_tok,
                a->blk_off, a->pos0, a->pos_tok, a->scale, a->sel, a->n_sel, a->sel_stride, a->out, a->work, 1};
    cudaStream_t st = (cudaStream_t)stream;
    int r = wg_attn(a, nk_max, st, e);
    if (r != 1) return r;
    int splits = 1;
    if (a->kv_f16) r = w512 ? tc_launch_any<512, 64, __half>(a, k, nk_max, st, &splits, e)
                            : tc_launch_any<256, 32, __half>(a, k, nk_max, st, &splits, e);
    else r = w512 ? tc_launch_any<512, 64, float>(a, k, nk_max, st, &splits, e)
                  : tc_launch_any<256, 32, float>(a, k, nk_max, st, &splits, e);
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
        MLACU_CHECK(mlacu_smem_allow(a->kv_f16 ? mla_attn_kernel<__half> : mla_attn_kernel<float>, (int)smem),
                    e, "mla_attn: shared memory %zu", smem);
        smem_set[a->kv_f16 != 0] = smem;
    }
    const int64_t hgroups = (a->n_head + AT_HG - 1) / AT_HG;
    /* taken as two blocks an SM (93 KB a block at 512 + 64) */
    const int splits = attn_splits(a, a->n_tokens * hgroups, nk_max, 256, 2 * (int64_t)mlacu_sm_count());
    attn_k k = {a->q_abs, a->q_pe, a->q_pe_ld_t, a->q_pe_ld_h, (int)a->n_head, (int)a->kv_lora, (int)a->n_rope,
                a->kv, a->blk_tok, a->blk_off, a->pos0, a->pos_tok, a->scale, a->sel, a->n_sel, a->sel_stride, a->out, a->work,
                splits};
    const dim3 grid((unsigned)hgroups, (unsigned)splits, (unsigned)a->n_tokens);
    mlacu_launch(a->kv_f16 ? mla_attn_kernel<__half> : mla_attn_kernel<float>, grid, AT_T, smem, (cudaStream_t)stream, k);
    MLACU_CHECK(cudaGetLastError(), e, "mla_attn T=%lld H=%lld", (long long)a->n_tokens, (long long)a->n_head);
    return attn_reduce(a, splits, (cudaStream_t)stream, e);
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
