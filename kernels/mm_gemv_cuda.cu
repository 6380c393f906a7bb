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

template <int TY>
__global__ void __launch_bounds__(GV_WARPS * 32)
    gemv_kernel(const uint8_t *__restrict__ W, size_t rb, int in, int out, const float *__restrict__ x,
                int T, float *__restrict__ y) {
    mlacu_pdl_enter();
    using Q = qtraits<TY>;
    using G = gv<TY>;
    extern __shared__ __align__(16) uint8_t smem[];
    float *xs = (float *)smem;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint8_t *ws = smem + (size_t)T * GV_XS * 4 + (size_t)warp * GV_RPW * G::SB;
    const int row0 = (blockIdx.x * GV_WARPS + warp) * GV_RPW;
    const int nchunks = (in + GV_CHUNK - 1) / GV_CHUNK;

    float acc[GV_RPW][GV_TMAX];
#pragma unroll
    for (int r = 0; r < GV_RPW; r++)
#pragma unroll
        for (int t = 0; t < GV_TMAX; t++) acc[r][t] = 0.f;

    uint4 pre[GV_RPW][G::NV];
    int nvec[GV_RPW];
    auto chunk_src = [&](int r, int c, int &off, int &nv) -> const uint4 * {
        const uint8_t *g = W + (size_t)(row0 + r) * rb + (size_t)c * G::CB;
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
            if (row0 + r >= out) continue;
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
            if (k4 < nk) v = __ldg((const float4 *)(x + (size_t)t * in + k0 + k4));
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
                if (row0 + r >= out) continue;
                int off, nv;
                chunk_src(r, c, off, nv);
                const uint8_t *blk = ws + r * G::SB + off + (u / Q::BU) * Q::BB;
                float v[32];
                deq_unit<TY>(blk, u % Q::BU, v);
#pragma unroll
                for (int t = 0; t < GV_TMAX; t++) {
                    if (t < T) {
                        const float *xr = xs + t * GV_XS + u * 33;
                        float s = 0.f;
#pragma unroll
                        for (int i = 0; i < 32; i++) s = fmaf(v[i], xr[i], s);
                        acc[r][t] += s;
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < GV_RPW; r++) {
#pragma unroll
        for (int t = 0; t < GV_TMAX; t++) {
            float s = acc[r][t];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == 0 && t < T && row0 + r < out) y[(size_t)t * out + row0 + r] = s;
        }
    }
}
static_assert(GV_TMAX == MLACU_GV_TMAX, "mm_cuda.h names the GEMV's tokens a launch");

/* ---------------------------------------------------------------- grouped expert GEMV (MoE) */
/* The gemv_kernel scheme over tiles of a MoE plan (mla_cuda_moe_plan): blockIdx.y walks the
 * tiles (up to GV_TMAX token slots of one expert each), blockIdx.x the output rows. FUSE: warp
 * w owns output row f of both W0 (gate, r = 0) and W1 (up, r = 1) and writes silu(g) * u. */
template <int TY, bool FUSE>
__global__ void __launch_bounds__(GV_WARPS * 32)
    gemv_grp_kernel(const uint8_t *__restrict__ W0, const uint8_t *__restrict__ W1, size_t rb, size_t estride, int in,
                    int out, const float *__restrict__ x, int x_div, const int32_t *__restrict__ sorted,
                    const int32_t *__restrict__ tile_e, const int32_t *__restrict__ tile_s,
                    const int32_t *__restrict__ tile_n, const int32_t *__restrict__ n_tiles, int world,
                    float *__restrict__ y) {
    mlacu_pdl_enter();
    using Q = qtraits<TY>;
    using G = gv<TY>;
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int xr[GV_TMAX], yr[GV_TMAX];
    float *xs = (float *)smem;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint8_t *ws = smem + (size_t)GV_TMAX * GV_XS * 4 + (size_t)warp * GV_RPW * G::SB;
    const int nt = *n_tiles;
    const int nchunks = (in + GV_CHUNK - 1) / GV_CHUNK;
    for (int tile = blockIdx.y; tile < nt; tile += gridDim.y) {
        const int e = tile_e[tile], s0 = tile_s[tile], T = tile_n[tile];
        const size_t eo = (size_t)(e / world) * estride;
        const int f = blockIdx.x * GV_WARPS + warp;
        const int row0 = f * GV_RPW;
        auto rowptr = [&](int r) -> const uint8_t * {
            if (FUSE) return (r == 0 ? W0 : W1) + eo + (size_t)f * rb;
            return W0 + eo + (size_t)(row0 + r) * rb;
        };
        auto valid = [&](int r) -> bool { return FUSE ? f < out : row0 + r < out; };
        __syncthreads();
        if (threadIdx.x < GV_TMAX && threadIdx.x < T) {
            int p = sorted[s0 + threadIdx.x];
            xr[threadIdx.x] = p / x_div;
            yr[threadIdx.x] = p;
        }
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
                if (k4 < nk) v = __ldg((const float4 *)(x + (size_t)xr[t] * in + k0 + k4));
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
        for (int t = 0; t < GV_TMAX; t++) {
            float s0v = acc[0][t], s1v = acc[1][t];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                s0v += __shfl_xor_sync(0xffffffffu, s0v, o);
                s1v += __shfl_xor_sync(0xffffffffu, s1v, o);
            }
            if (lane == 0 && t < T) {
                if (FUSE) {
                    if (f < out) y[(size_t)yr[t] * out + f] = s0v / (1.0f + expf(-s0v)) * s1v;
                } else {
                    if (row0 < out) y[(size_t)yr[t] * out + row0] = s0v;
                    if (row0 + 1 < out) y[(size_t)yr[t] * out + row0 + 1] = s1v;
                }
            }
        }
    }
}

template <int TY, bool FUSE>
static cudaError_t launch_grp(const void *w0, const void *w1, size_t estride, int64_t in, int64_t out, const float *x,
                              int x_div, const mla_cuda_moe_plan *pl, float *y, cudaStream_t s) {
    static bool attr_set = false;
    if (!attr_set) {
        cudaError_t err = mlacu_smem_allow(gemv_grp_kernel<TY, FUSE>, (int)gemv_smem<TY>(GV_TMAX));
        if (err != cudaSuccess) return err;
        attr_set = true;
    }
    const int rows_per_block = FUSE ? GV_WARPS : GV_WARPS * GV_RPW;
    int64_t ty = pl->max_tiles < 65535 ? pl->max_tiles : 65535;
    dim3 grid((unsigned)((out + rows_per_block - 1) / rows_per_block), (unsigned)(ty > 0 ? ty : 1));
    mlacu_launch(gemv_grp_kernel<TY, FUSE>, grid, GV_WARPS * 32, gemv_smem<TY>(GV_TMAX), s, (const uint8_t *)w0,
                 (const uint8_t *)w1, ggml_row_bytes(TY, in), estride, (int)in, (int)out, x, x_div, pl->sorted,
                 pl->tile_e, pl->tile_s, pl->tile_n, pl->n_tiles, pl->world, y);
    return cudaGetLastError();
}

template <int TY>
static cudaError_t launch_gemv(const void *w, int64_t in, int64_t out, const float *x, int64_t T, float *y,
                               cudaStream_t s) {
    static bool attr_set = false; /* per type; the max dynamic size is set once */
    size_t rb = ggml_row_bytes(TY, in);
    if (!attr_set) {
        cudaError_t err = mlacu_smem_allow(gemv_kernel<TY>, (int)gemv_smem<TY>(GV_TMAX));
        if (err != cudaSuccess) return err;
        attr_set = true;
    }
    unsigned grid = (unsigned)((out + GV_WARPS * GV_RPW - 1) / (GV_WARPS * GV_RPW));
    for (int64_t t0 = 0; t0 < T; t0 += GV_TMAX) {
        int tn = (int)(T - t0 < GV_TMAX ? T - t0 : GV_TMAX);
        mlacu_launch(gemv_kernel<TY>, grid, GV_WARPS * 32, gemv_smem<TY>(tn), s, (const uint8_t *)w, rb, (int)in,
                     (int)out, x + t0 * in, tn, y + t0 * out);
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
