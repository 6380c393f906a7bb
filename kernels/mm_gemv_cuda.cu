/* mm_gemv_cuda: the float-activation GEMV of every type (decode steps of up to GV_TMAX tokens
 * over weights with no integer form, and the fallback of the others) and its grouped form over a
 * MoE plan's tiles. API: kernels/cuda_ops.h (mla_cuda_matmul_gemv, mla_cuda_matmul_grouped);
 * chosen by mm_choose_cuda.cu. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/mm_cuda.h"

namespace mlacu {

MLACU_GRIDS_TU();

/* ---------------------------------------------------------------- GEMV (T <= 8) */
/* A block of GV_WARPS warps owns GV_RPW rows per warp. The K dimension is walked in chunks of
 * 1024 elements (32 units): x[:, chunk] is staged in shared memory (unit stride 33 floats: no
 * bank conflicts when each lane reads its own unit), each warp copies the chunk bytes of its
 * rows into shared memory with 16-byte coalesced loads (issued one chunk ahead), then lane u
 * dequantizes unit u in registers and dots it with the T token rows. */
constexpr int GV_WARPS = 8, GV_RPW = 2, GV_TMAX = 8, GV_CHUNK = 1024, GV_XS = 32 * 33;

template <int TY> struct gv {
    static constexpr int CB = (GV_CHUNK / qtraits<TY>::BE) * qtraits<TY>::BB; /* chunk bytes */
    static constexpr int SB = (CB + 16 + 15) / 16 * 16; /* staged bytes incl. misalignment */
    static constexpr int NV = (SB / 16 + 31) / 32;     /* 16-byte vectors per lane */
};

template <int TY> static size_t gemv_smem(int T) {
    return (size_t)T * GV_XS * 4 + (size_t)GV_WARPS * GV_RPW * gv<TY>::SB;
}

/* Row sources of gemv_kernel: which weight rows a block meets and which rows of x and y its
 * token slots are. A tile is up to GV_TMAX token rows against one matrix; blockIdx.y walks the
 * tiles, blockIdx.x the output rows. */

/* Dense: one matrix w; one tile, the launch's T rows of x and of y. */
struct gv_dense {
    static constexpr bool GROUPED = false;
    const uint8_t *w;
    const float *x;
    float *y;
    int T;
};

/* Grouped over a MoE plan's tiles (mla_cuda_moe_plan): tile i holds the tile_n[i] pairs of
 * expert tile_e[i] from sorted[tile_s[i]]; pair p reads x row p / x_div and writes y row p;
 * expert e's matrix starts (e / world) * estride bytes into w0 (and w1: FUSE's up matrix). */
struct gv_grouped {
    static constexpr bool GROUPED = true;
    const uint8_t *w0, *w1;
    size_t estride;
    const float *x;
    int x_div;
    const int32_t *sorted, *tile_e, *tile_s, *tile_n, *n_tiles;
    int world;
    float *y;
};

/* y = x W^T over the tiles of a row source RS. Without FUSE, warp w of a block owns GV_RPW
 * consecutive output rows of W; with FUSE (grouped only) it owns output row f of both w0 (gate,
 * r = 0) and w1 (up, r = 1) and writes silu(g) * u. Every output element is the same sum in
 * the same order whatever the row source: per chunk, lane u's 32-element dot product (fmaf in
 * element order) added to the lane's total, then the lanes' totals summed by the xor butterfly. */
template <int TY, class RS, bool FUSE>
__global__ void __launch_bounds__(GV_WARPS * 32) gemv_kernel(const RS rs, size_t rb, int in, int out) {
    static_assert(!FUSE || (RS::GROUPED && GV_RPW == 2), "FUSE: gate and up rows of a plan's experts");
    mlacu_pdl_enter();
    using Q = qtraits<TY>;
    using G = gv<TY>;
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int xmap[RS::GROUPED ? GV_TMAX : 1], ymap[RS::GROUPED ? GV_TMAX : 1];
    float *xs = (float *)smem;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* staged rows of x (the dynamic shared memory's layout); this block's tiles: tile0, tile0 +
     * step, .. below nt (dense: tile 0 alone, known at compile time) */
    int xrows, nt, tile0, step;
    if constexpr (RS::GROUPED) {
        xrows = GV_TMAX;
        nt = *rs.n_tiles;
        tile0 = blockIdx.y;
        step = gridDim.y;
    } else {
        xrows = rs.T;
        nt = 1;
        tile0 = 0;
        step = 1;
    }
    uint8_t *ws = smem + (size_t)xrows * GV_XS * 4 + (size_t)warp * GV_RPW * G::SB;
    const int nchunks = (in + GV_CHUNK - 1) / GV_CHUNK;
    const int f = blockIdx.x * GV_WARPS + warp;
    const int row0 = FUSE ? f : f * GV_RPW;
    for (int tile = tile0; tile < nt; tile += step) {
        const uint8_t *w0, *w1 = nullptr;
        int T;
        if constexpr (RS::GROUPED) {
            const int e = rs.tile_e[tile], s0 = rs.tile_s[tile];
            T = rs.tile_n[tile];
            const size_t eo = (size_t)(e / rs.world) * rs.estride;
            w0 = rs.w0 + eo;
            if (FUSE) w1 = rs.w1 + eo;
            __syncthreads(); /* the previous tile's slots are read no more */
            if (threadIdx.x < GV_TMAX && threadIdx.x < T) {
                int p = rs.sorted[s0 + threadIdx.x];
                xmap[threadIdx.x] = p / rs.x_div;
                ymap[threadIdx.x] = p;
            }
        } else {
            w0 = rs.w;
            T = rs.T;
        }
        /* x's and y's row of token slot t */
        auto xrow = [&](int t) -> const float * {
            if constexpr (RS::GROUPED) return rs.x + (size_t)xmap[t] * in;
            else return rs.x + (size_t)t * in;
        };
        auto yrow = [&](int t) -> float * {
            if constexpr (RS::GROUPED) return rs.y + (size_t)ymap[t] * out;
            else return rs.y + (size_t)t * out;
        };
        auto rowptr = [&](int r) -> const uint8_t * {
            if (FUSE) return (r == 0 ? w0 : w1) + (size_t)f * rb;
            return w0 + (size_t)(row0 + r) * rb;
        };
        auto valid = [&](int r) -> bool { return FUSE ? f < out : row0 + r < out; };

        float acc[GV_RPW][GV_TMAX];
#pragma unroll
        for (int r = 0; r < GV_RPW; r++)
#pragma unroll
            for (int t = 0; t < GV_TMAX; t++) acc[r][t] = 0.f;
        uint4 pre[GV_RPW][G::NV];
        int nvec[GV_RPW];
        auto chunk_src = [&](int r, int c, int &off, int &nv) -> const uint4 * {
            const uint8_t *g = rowptr(r) + (size_t)c * G::CB;
            size_t nbytes = rb - (size_t)c * G::CB;
            if (nbytes > (size_t)G::CB) nbytes = G::CB;
            off = (int)((uintptr_t)g & 15);
            nv = (int)((off + nbytes + 15) / 16);
            return (const uint4 *)(g - off);
        };
        auto load = [&](int c) {
#pragma unroll
            for (int r = 0; r < GV_RPW; r++) {
                nvec[r] = 0;
                if (!valid(r)) continue;
                int off, nv;
                const uint4 *s = chunk_src(r, c, off, nv);
                nvec[r] = nv;
#pragma unroll
                for (int k = 0; k < G::NV; k++) {
                    int i = lane + 32 * k;
                    if (i < nv) pre[r][k] = __ldg(s + i);
                }
            }
        };
        load(0);
        for (int c = 0; c < nchunks; c++) {
            const int k0 = c * GV_CHUNK;
            const int nk = min(GV_CHUNK, in - k0);
            __syncthreads();
            for (int idx = threadIdx.x; idx < T * (GV_CHUNK / 4); idx += GV_WARPS * 32) {
                int t = idx / (GV_CHUNK / 4), k4 = (idx % (GV_CHUNK / 4)) * 4;
                float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
                if (k4 < nk) v = __ldg((const float4 *)(xrow(t) + k0 + k4));
                float *d = xs + t * GV_XS + (k4 >> 5) * 33 + (k4 & 31);
                d[0] = v.x;
                d[1] = v.y;
                d[2] = v.z;
                d[3] = v.w;
            }
#pragma unroll
            for (int r = 0; r < GV_RPW; r++) {
                uint4 *d = (uint4 *)(ws + r * G::SB);
#pragma unroll
                for (int k = 0; k < G::NV; k++) {
                    int i = lane + 32 * k;
                    if (i < nvec[r]) d[i] = pre[r][k];
                }
            }
            __syncthreads();
            if (c + 1 < nchunks) load(c + 1);
            const int u = lane;
            if (u < nk / 32) {
#pragma unroll
                for (int r = 0; r < GV_RPW; r++) {
                    if (!valid(r)) continue;
                    int off, nv;
                    chunk_src(r, c, off, nv);
                    const uint8_t *blk = ws + r * G::SB + off + (u / Q::BU) * Q::BB;
                    float v[32];
                    deq_unit<TY>(blk, u % Q::BU, v);
#pragma unroll
                    for (int t = 0; t < GV_TMAX; t++) {
                        if (t < T) {
                            const float *xq = xs + t * GV_XS + u * 33;
                            float s = 0.f;
#pragma unroll
                            for (int i = 0; i < 32; i++) s = fmaf(v[i], xq[i], s);
                            acc[r][t] += s;
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < GV_RPW; r++)
#pragma unroll
            for (int t = 0; t < GV_TMAX; t++) {
                float s = acc[r][t];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                acc[r][t] = s;
            }
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < GV_TMAX; t++) {
                if (t >= T) break;
                if (FUSE) {
                    if (f < out) yrow(t)[f] = mlacu_swiglu(acc[0][t], acc[1][t]);
                } else {
#pragma unroll
                    for (int r = 0; r < GV_RPW; r++)
                        if (row0 + r < out) yrow(t)[row0 + r] = acc[r][t];
                }
            }
        }
    }
}
static_assert(GV_TMAX == MLACU_GV_TMAX, "mm_cuda.h names the GEMV's tokens a launch");

template <int TY, bool FUSE>
static cudaError_t launch_grp(const void *w0, const void *w1, size_t estride, int64_t in, int64_t out, const float *x,
                              int x_div, const mla_cuda_moe_plan *pl, float *y, cudaStream_t s) {
    static bool attr_set = false;
    if (!attr_set) {
        cudaError_t err = mlacu_smem_allow(gemv_kernel<TY, gv_grouped, FUSE>, (int)gemv_smem<TY>(GV_TMAX));
        if (err != cudaSuccess) return err;
        attr_set = true;
    }
    const int rows_per_block = FUSE ? GV_WARPS : GV_WARPS * GV_RPW;
    int64_t ty = pl->max_tiles < 65535 ? pl->max_tiles : 65535;
    dim3 grid((unsigned)((out + rows_per_block - 1) / rows_per_block), (unsigned)(ty > 0 ? ty : 1));
    const gv_grouped rs = {(const uint8_t *)w0, (const uint8_t *)w1, estride, x, x_div, pl->sorted,
                           pl->tile_e, pl->tile_s, pl->tile_n, pl->n_tiles, pl->world, y};
    mlacu_launch(gemv_kernel<TY, gv_grouped, FUSE>, grid, GV_WARPS * 32, gemv_smem<TY>(GV_TMAX), s, rs,
                 ggml_row_bytes(TY, in), (int)in, (int)out);
    return cudaGetLastError();
}

template <int TY>
static cudaError_t launch_gemv(const void *w, int64_t in, int64_t out, const float *x, int64_t T, float *y,
                               cudaStream_t s) {
    static bool attr_set = false; /* per type; the max dynamic size is set once */
    size_t rb = ggml_row_bytes(TY, in);
    if (!attr_set) {
        cudaError_t err = mlacu_smem_allow(gemv_kernel<TY, gv_dense, false>, (int)gemv_smem<TY>(GV_TMAX));
        if (err != cudaSuccess) return err;
        attr_set = true;
    }
    unsigned grid = (unsigned)((out + GV_WARPS * GV_RPW - 1) / (GV_WARPS * GV_RPW));
    for (int64_t t0 = 0; t0 < T; t0 += GV_TMAX) {
        int tn = (int)(T - t0 < GV_TMAX ? T - t0 : GV_TMAX);
        const gv_dense rs = {(const uint8_t *)w, x + t0 * in, y + t0 * out, tn};
        mlacu_launch(gemv_kernel<TY, gv_dense, false>, grid, GV_WARPS * 32, gemv_smem<TY>(tn), s, rs, rb, (int)in,
                     (int)out);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

/* the GEMV over a runtime type (mm_cuda.h) */
cudaError_t mlacu_gemv(uint32_t t, const void *w, int64_t in, int64_t out, const float *x, int64_t T, float *y,
                       cudaStream_t s) {
    switch (t) {
#define MLACU_CASE(T_)                                                                                              \
    case T_:                                                                                                        \
        return launch_gemv<T_>(w, in, out, x, T, y, s);
        MLACU_FOR_TYPES(MLACU_CASE)
#undef MLACU_CASE
    }
    return cudaErrorInvalidValue;
}

} // namespace mlacu

using namespace mlacu;

extern "C" int mla_cuda_matmul_grouped(uint32_t t, const void *d_w0, const void *d_w1, size_t estride, int64_t in,
                                       int64_t out, const float *d_x, int x_div, const mla_cuda_moe_plan *plan,
                                       float *d_y, mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, 1);
    MLA_ASSERT(x_div >= 1 && plan && plan->world >= 1);
    if (plan->max_tiles <= 0) return MLA_OK;
    cudaError_t err = cudaErrorInvalidValue;
    switch (t) {
#define MLACU_CASE(T_)                                                                                              \
    case T_:                                                                                                        \
        err = d_w1 ? launch_grp<T_, true>(d_w0, d_w1, estride, in, out, d_x, x_div, plan, d_y, stream)             \
                   : launch_grp<T_, false>(d_w0, NULL, estride, in, out, d_x, x_div, plan, d_y, stream);           \
        break;
        MLACU_FOR_TYPES(MLACU_CASE)
#undef MLACU_CASE
    }
    MLACU_CHECK(err, e, "grouped gemv %s %lldx%lld", ggml_type_name(t), (long long)out, (long long)in);
    return MLA_OK;
}
