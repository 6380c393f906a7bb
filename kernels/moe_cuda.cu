/* moe_cuda: the MoE plan (counting sort of the (token, expert) pairs by expert on the GPU), the
 * weighted combine, and the expert FFN of a step (mla_cuda_moe_apply: the family of its products
 * from the chooser, mla_cuda_mm_choose). API and meaning: kernels/cuda_ops.h. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda_internal.h"

namespace {

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

} // namespace

/* ================================================================ host API */

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
    p->settled = false;
    p->rank = rank;
    p->world = world;
}

extern "C" int mla_cuda_moe_plan_build(mla_cuda_moe_plan *p, const int32_t *d_ids, int64_t T, int64_t K, int64_t X,
                                       mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(X > 0 && X <= 4096 && p->world >= 1);
    p->max_tiles = moe_max_tiles(T, K, X);
    p->tokens = T;
    p->settled = false;
    const size_t smem = (size_t)X * 4 * sizeof(int32_t);
    static size_t smem_set = 48 << 10; /* past 48 KB (3072 experts and more) only by opting in */
    if (smem > smem_set) {
        MLACU_CHECK(mlacu_smem_allow(moe_plan_kernel, (int)smem), e,
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

extern "C" int mla_cuda_moe_apply(const mla_cuda_experts *ex, const float *d_x, const void *d_xq, const void *d_xh,
                                  int64_t T, const int32_t *d_ids, const float *d_w, int64_t K, float *d_out,
                                  void *d_work, mla_cuda_stream stream, mla_err *e) {
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
    /* The family of the three products (mla_cuda_mm_choose, over the pairs a expert): enough
     * tokens per expert (ex->mmh_min), the fp16 tensor cores; many tokens per expert (64 on
     * average, a full tile, and more: long prompts), the int8 tensor cores. At 16 a expert those
     * were no faster than the grouped GEMV on the H200 (a 512-token prompt of the V3-shaped model:
     * 129 ms either way; 16 experts x 64 tokens: 525 us against 381),
     * measured on an H200, 2026-11-29. Else the grouped GEMVs. */
    const uint32_t types[3] = {ex->gate_type, ex->up_type, ex->down_type};
    const int64_t ins[3] = {E, E, F};
    const mla_cuda_mm_policy pol = {ex->q8, false, false, ex->mmh_min, 64, 0};
    const mla_cuda_mm_family fam = mla_cuda_mm_choose(&pol, types, ins, 3, T * K / ex->n_expert, E > F ? E : F);
    /* the fp16 tensor cores, 32 pairs a tile, 64 from 48 a expert */
    if (fam == MLA_CUDA_MM_H) {
        const int bm = T * K >= 48 * ex->n_expert ? 64 : 32;
        if (d_xh) hx = (void *)d_xh; /* x's fp16 rows from the caller (its norm made them) */
        else if (mla_cuda_act_h(d_x, T, E, hx, stream, e)) return MLA_ERR;
        if (mla_cuda_matmul_grouped_h(ex->gate_type, ex->gate, ex->gate_estride, E, F, hx, T, (int)K, &pl,
                                      ex->n_expert, bm, g, stream, e) ||
            mla_cuda_matmul_grouped_h(ex->up_type, ex->up, ex->up_estride, E, F, hx, T, (int)K, &pl, ex->n_expert,
                                      bm, u, stream, e) ||
            mla_cuda_swiglu_h(g, u, T * K, F, hh, stream, e) ||
            mla_cuda_matmul_grouped_h(ex->down_type, ex->down, ex->down_estride, F, E, hh, T * K, 1, &pl,
                                      ex->n_expert, bm, y, stream, e))
            return MLA_ERR;
        return mla_cuda_moe_combine(y, d_ids, d_w, T, K, E, ex->rank, ex->world, d_out, stream, e);
    }
    if (fam == MLA_CUDA_MM_Q8_MMA) {
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
    pl.settled = true; /* the gate and up products waited on the plan's kernel */
    if (q8_down) {
        if ((!qh_made && mla_cuda_quantize_q8(h, T * K, F, qh, stream, e)) ||
            mla_cuda_matmul_grouped_q8(ex->down_type, ex->down, NULL, ex->down_estride, F, E, qh, T * K, 1, &pl, y,
                                       NULL, stream, e))
            return MLA_ERR;
    } else if (mla_cuda_matmul_grouped(ex->down_type, ex->down, NULL, ex->down_estride, F, E, h, 1, &pl, y, stream, e))
        return MLA_ERR;
    return mla_cuda_moe_combine(y, d_ids, d_w, T, K, E, ex->rank, ex->world, d_out, stream, e);
}
