/* mm_gemvq_cuda: the per-warp integer GEMV (q8 activations, dp4a) of every type with an integer
 * form, dense and grouped over a MoE plan's tiles, the quantizer of the activations (q8x_kernel),
 * and the float-weight GEMV in the same layout (gemvf_kernel: F32 / F16 / BF16). API:
 * kernels/cuda_ops.h (mla_cuda_quantize_q8, mla_cuda_q8_*); chosen by mm_choose_cuda.cu. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/mm_cuda.h"

namespace mlacu {

MLACU_GRIDS_TU();

/* ---------------------------------------------------------------- integer GEMV (q8 activations) */
/* The decode path for quantized weights, the scheme llama.cpp's CUDA backend uses: the
 * activations are quantized per 32 elements to int8 (scale d = max|x| / 127, round to nearest
 * even) by q8x_kernel into a q8 buffer: int8 [T][in], then float4 [T][in / 32] holding
 * (d, d * sum of the first 16 q, d * sum of the last 16 q, 0). A weight unit in its integer form
 * (unit_i8) dots an activation block with eight dp4a, so a weight element costs a quarter of an
 * integer instruction instead of a dequantization and an FMA per token, and the weight bytes
 * go from global memory straight to registers (no shared memory): the kernel can stream at HBM
 * speed. One warp owns GQ_R rows; lane l takes units l, l + 32, ...; tokens up to GQ_T per
 * launch. */
constexpr int GQ_WARPS = 4, GQ_R = 2, GQ_T = 8;
static_assert(GQ_T >= MLACU_MOE_TILE && MLACU_GV_TMAX >= MLACU_MOE_TILE, "a MoE tile's tokens must fit one pass");

__global__ void q8x_kernel(const float *__restrict__ x, int64_t nblk, int8_t *__restrict__ q, float4 *__restrict__ s) {
    mlacu_pdl_enter();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nblk) return;
    const float4 *xp = (const float4 *)(x + i * 32);
    float v[32];
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float4 f = __ldg(xp + k);
        v[4 * k] = f.x, v[4 * k + 1] = f.y, v[4 * k + 2] = f.z, v[4 * k + 3] = f.w;
    }
#pragma unroll
    for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(v[k]));
    const float d = mlacu_q8_d(amax), id = mlacu_q8_inv(amax);
    uint32_t w[8];
    int sum0 = 0, sum1 = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        uint32_t pk = 0;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            int qi = mlacu_q8_round(v[4 * j + b], id);
            if (j < 4) sum0 += qi;
            else sum1 += qi;
            pk |= (uint32_t)(qi & 0xFF) << (8 * b);
        }
        w[j] = pk;
    }
    uint4 *qo = (uint4 *)(q + i * 32);
    qo[0] = make_uint4(w[0], w[1], w[2], w[3]);
    qo[1] = make_uint4(w[4], w[5], w[6], w[7]);
    s[i] = make_float4(d, d * (float)sum0, d * (float)sum1, 0.f);
}

/* acc[r][t] = row r (pointer p[r]) . activation row xr[t] over units u0, u0 + step, ... */
template <int TY>
__device__ __forceinline__ void gemvq_rows(const uint8_t *const p[GQ_R], int nu, const uint4 *__restrict__ qx,
                                           const float4 *__restrict__ sx, const int xr[GQ_T], int T, int u0,
                                           int step, float acc[GQ_R][GQ_T]) {
    using Q = qtraits<TY>;
#pragma unroll
    for (int r = 0; r < GQ_R; r++)
#pragma unroll
        for (int t = 0; t < GQ_T; t++) acc[r][t] = 0.f;
#pragma unroll 2
    for (int u = u0; u < nu; u += step) {
        unit_i8_t w[GQ_R];
#pragma unroll
        for (int r = 0; r < GQ_R; r++) unit_i8<TY>(p[r] + (size_t)(u / Q::BU) * Q::BB, u % Q::BU, w[r]);
#pragma unroll
        for (int t = 0; t < GQ_T; t++) {
            if (t >= T) break;
            const size_t blk = (size_t)xr[t] * nu + u;
            const uint4 a = __ldg(qx + 2 * blk), b = __ldg(qx + 2 * blk + 1);
            const float4 sv = __ldg(sx + blk);
#pragma unroll
            for (int r = 0; r < GQ_R; r++) {
                int i0 = __dp4a((int)w[r].q[0], (int)a.x, 0);
                i0 = __dp4a((int)w[r].q[1], (int)a.y, i0);
                i0 = __dp4a((int)w[r].q[2], (int)a.z, i0);
                i0 = __dp4a((int)w[r].q[3], (int)a.w, i0);
                int i1 = __dp4a((int)w[r].q[4], (int)b.x, 0);
                i1 = __dp4a((int)w[r].q[5], (int)b.y, i1);
                i1 = __dp4a((int)w[r].q[6], (int)b.z, i1);
                i1 = __dp4a((int)w[r].q[7], (int)b.w, i1);
                acc[r][t] += sv.x * (w[r].s[0] * (float)i0 + w[r].s[1] * (float)i1) -
                             (w[r].m[0] * sv.y + w[r].m[1] * sv.z);
            }
        }
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* wpr warps (1, 2 or 4) share a group of GQ_R rows, splitting its units, so that short rows
 * (few units) still give every multiprocessor enough warps; partial sums meet in shared memory. */
/* Sums acc over the wpr warps of a row group: afterwards every lane of the group's first warp
 * (part 0) holds the totals. Every warp of the block must call it (it has block barriers when
 * wpr > 1). */
template <int NT = GQ_T>
__device__ __forceinline__ void gemv_group_sum(float (&acc)[GQ_R][NT], float (*red)[GQ_R][NT], int warp, int lane,
                                               int part, int wpr) {
#pragma unroll
    for (int r = 0; r < GQ_R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            acc[r][t] = warp_sum(acc[r][t]);
            if (wpr > 1 && lane == 0) red[warp][r][t] = acc[r][t];
        }
    if (wpr == 1) return;
    __syncthreads();
    if (part == 0)
#pragma unroll
        for (int r = 0; r < GQ_R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float v = 0.f;
                for (int k = 0; k < wpr; k++) v += red[warp + k][r][t];
                acc[r][t] = v;
            }
    __syncthreads(); /* red is reused by the next tile */
}

/* Sums a row group's partial results over its wpr warps and stores y[t][row0 + r]. */
template <int NT = GQ_T>
__device__ __forceinline__ void gemv_group_store(float (&acc)[GQ_R][NT], float (*red)[GQ_R][NT], int warp, int lane,
                                                 int part, int wpr, int row0, int out, int T, float *__restrict__ y) {
    gemv_group_sum<NT>(acc, red, warp, lane, part, wpr);
    if (part != 0 || lane != 0) return;
#pragma unroll
    for (int r = 0; r < GQ_R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < T && row0 + r < out) y[(size_t)t * out + row0 + r] = acc[r][t];
}

template <int TY>
__global__ void __launch_bounds__(GQ_WARPS * 32)
    gemvq_kernel(const uint8_t *__restrict__ W, size_t rb, int nu, int out, const uint4 *__restrict__ qx,
                 const float4 *__restrict__ sx, int T, float *__restrict__ y, int wpr) {
    mlacu_pdl_enter();
    __shared__ float red[GQ_WARPS][GQ_R][GQ_T];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int grp = warp / wpr, part = warp % wpr;
    const int row0 = (blockIdx.x * (GQ_WARPS / wpr) + grp) * GQ_R;
    if (wpr == 1 && row0 >= out) return; /* no barrier below when wpr == 1 */
    const uint8_t *p[GQ_R];
#pragma unroll
    for (int r = 0; r < GQ_R; r++) p[r] = W + (size_t)min(row0 + r, out - 1) * rb; /* past the end: row out-1 again */
    int xr[GQ_T];
#pragma unroll
    for (int t = 0; t < GQ_T; t++) xr[t] = t;
    float acc[GQ_R][GQ_T];
    gemvq_rows<TY>(p, nu, qx, sx, xr, T, part * 32 + lane, 32 * wpr, acc);
    gemv_group_store(acc, red, warp, lane, part, wpr, row0, out, T, y);
}

/* The float-weight GEMV (F32 / F16 / BF16: routers, bf16 files) in the same layout as
 * gemvq_kernel: lanes over 32-element units read W with 16-byte loads straight to registers and
 * dot them with fp32 x (L1-cached), wpr warps per group of GQ_R rows. NT: the tokens it is built
 * for, GQ_T, or 1 for a decode step's router (the same sums; a decode step runs this code once a
 * launch, cold, so it is built without the other tokens' unrolled sums). */
template <int TY> __device__ __forceinline__ void unit_f32(const uint8_t *b, float *v) {
    if (TY == GGML_TYPE_F32) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float4 f = __ldg((const float4 *)b + i);
            v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint4 q = __ldg((const uint4 *)b + i);
            const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                if (TY == GGML_TYPE_BF16) {
                    v[8 * i + 2 * k] = bits_f32(w[k] << 16);
                    v[8 * i + 2 * k + 1] = bits_f32(w[k] & 0xFFFF0000u);
                } else {
                    v[8 * i + 2 * k] = h2f(w[k] & 0xFFFF);
                    v[8 * i + 2 * k + 1] = h2f(w[k] >> 16);
                }
            }
        }
    }
}

template <int TY, int NT>
__global__ void __launch_bounds__(GQ_WARPS * 32)
    gemvf_kernel(const uint8_t *__restrict__ W, size_t rb, int nu, int out, const float *__restrict__ x, int T,
                 float *__restrict__ y, int wpr) {
    __shared__ float red[GQ_WARPS][GQ_R][NT];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int grp = warp / wpr, part = warp % wpr;
    const int row0 = (blockIdx.x * (GQ_WARPS / wpr) + grp) * GQ_R;
    const uint8_t *p[GQ_R];
#pragma unroll
    for (int r = 0; r < GQ_R; r++) p[r] = W + (size_t)min(row0 + r, out - 1) * rb;
    /* this thread's weight units into L2 while the kernel before finishes (programmatic launch;
     * no kernel writes weights) */
    for (int u = part * 32 + lane; u < nu; u += 32 * wpr)
#pragma unroll
        for (int r = 0; r < GQ_R; r++)
            asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p[r] + (size_t)u * qtraits<TY>::BB));
    mlacu_pdl_enter();
    if (wpr == 1 && row0 >= out) return;
    float acc[GQ_R][NT];
#pragma unroll
    for (int r = 0; r < GQ_R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.f;
    const int in = nu * 32;
    for (int u = part * 32 + lane; u < nu; u += 32 * wpr) {
        float v[GQ_R][32];
#pragma unroll
        for (int r = 0; r < GQ_R; r++) unit_f32<TY>(p[r] + (size_t)u * qtraits<TY>::BB, v[r]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= T) break;
            const float4 *xp = (const float4 *)(x + (size_t)t * in + (size_t)u * 32);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float4 xv = __ldg(xp + i);
#pragma unroll
                for (int r = 0; r < GQ_R; r++)
                    acc[r][t] += v[r][4 * i] * xv.x + v[r][4 * i + 1] * xv.y + v[r][4 * i + 2] * xv.z +
                                 v[r][4 * i + 3] * xv.w;
            }
        }
    }
    gemv_group_store<NT>(acc, red, warp, lane, part, wpr, row0, out, T, y);
}

/* The grouped expert version over a MoE plan's tiles (as gemv_kernel's gv_grouped row source):
 * blockIdx.y walks the tiles (multi: those after the plan's single-pair ones), a warp owns rows
 * (FUSE: row f of gate and of up, writing silu(g) * u). */
template <int TY, bool FUSE>
__global__ void __launch_bounds__(GQ_WARPS * 32)
    gemvq_grp_kernel(const uint8_t *__restrict__ W0, const uint8_t *__restrict__ W1, size_t rb, size_t estride, int nu,
                     int out, const uint4 *__restrict__ qx, const float4 *__restrict__ sx, int x_div,
                     const int32_t *__restrict__ sorted, const int32_t *__restrict__ tile_e,
                     const int32_t *__restrict__ tile_s, const int32_t *__restrict__ tile_n,
                     const int32_t *__restrict__ n_tiles, int world, float *__restrict__ y, int wpr, bool multi) {
    mlacu_pdl_enter();
    __shared__ float red[GQ_WARPS][GQ_R][GQ_T];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int grp = warp / wpr, part = warp % wpr;
    const int f = blockIdx.x * (GQ_WARPS / wpr) + grp;
    const int row0 = FUSE ? f : f * GQ_R;
    if (wpr == 1 && row0 >= out) return; /* no barrier in the loop when wpr == 1 */
    const int nt = n_tiles[0];
    for (int tile = blockIdx.y + (multi ? n_tiles[1] : 0); tile < nt; tile += gridDim.y) {
        const int e = tile_e[tile], s0 = tile_s[tile], T = tile_n[tile];
        const size_t eo = (size_t)(e / world) * estride;
        const uint8_t *p[GQ_R];
        if (FUSE) {
            p[0] = W0 + eo + (size_t)min(f, out - 1) * rb;
            p[1] = W1 + eo + (size_t)min(f, out - 1) * rb;
        } else {
#pragma unroll
            for (int r = 0; r < GQ_R; r++) p[r] = W0 + eo + (size_t)min(row0 + r, out - 1) * rb;
        }
        int xr[GQ_T], yr[GQ_T];
#pragma unroll
        for (int t = 0; t < GQ_T; t++) {
            int pr = t < T ? sorted[s0 + t] : 0;
            xr[t] = pr / x_div;
            yr[t] = pr;
        }
        float acc[GQ_R][GQ_T];
        gemvq_rows<TY>(p, nu, qx, sx, xr, T, part * 32 + lane, 32 * wpr, acc);
        gemv_group_sum(acc, red, warp, lane, part, wpr);
        if (part != 0 || row0 >= out) continue;
#pragma unroll
        for (int t = 0; t < GQ_T; t++) {
            const float a0 = acc[0][t], a1 = acc[1][t];
            if (lane == 0 && t < T) {
                if (FUSE) {
                    y[(size_t)yr[t] * out + f] = a0 / (1.0f + expf(-a0)) * a1;
                } else {
                    y[(size_t)yr[t] * out + row0] = a0;
                    if (row0 + 1 < out) y[(size_t)yr[t] * out + row0 + 1] = a1;
                }
            }
        }
    }
}

/* Warps per group of `groups` row groups of nu units: 1, 2 or 4, splitting the units further while
 * each warp keeps 2 or more units a lane and the launch has fewer than 16384 warps (short rows
 * or few rows would otherwise leave the multiprocessors with too few warps to hide latency). */
static int gemv_wpr(int nu, int64_t groups) {
    int w = 1;
    while (w < GQ_WARPS && nu / (32 * w) >= 2 && groups * w < 16384) w *= 2;
    return w;
}

template <int TY>
static cudaError_t launch_gemvf(const void *w, int64_t in, int64_t out, const float *x, int64_t T, float *y,
                                cudaStream_t s) {
    const int nu = (int)(in / 32), wpr = gemv_wpr(nu, (out + GQ_R - 1) / GQ_R);
    const int rows_per_block = GQ_WARPS / wpr * GQ_R;
    unsigned grid = (unsigned)((out + rows_per_block - 1) / rows_per_block);
    for (int64_t t0 = 0; t0 < T; t0 += GQ_T) {
        int tn = (int)(T - t0 < GQ_T ? T - t0 : GQ_T);
        mlacu_launch(tn == 1 ? gemvf_kernel<TY, 1> : gemvf_kernel<TY, GQ_T>, grid, GQ_WARPS * 32, 0, s,
                     (const uint8_t *)w, ggml_row_bytes(TY, in), nu, (int)out, x + t0 * in, tn, y + t0 * out, wpr);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

template <int TY>
static cudaError_t launch_gemvq(const void *w, int64_t in, int64_t out, const void *q8, int64_t T, float *y,
                                cudaStream_t s) {
    const int nu = (int)(in / 32);
    const uint4 *qx = (const uint4 *)q8;
    const float4 *sx = (const float4 *)((const uint8_t *)q8 + mlacu_q8_scale_off(T, in));
    const int wpr = gemv_wpr(nu, (out + GQ_R - 1) / GQ_R);
    const int rows_per_block = GQ_WARPS / wpr * GQ_R;
    unsigned grid = (unsigned)((out + rows_per_block - 1) / rows_per_block);
    for (int64_t t0 = 0; t0 < T; t0 += GQ_T) {
        int tn = (int)(T - t0 < GQ_T ? T - t0 : GQ_T);
        mlacu_launch(gemvq_kernel<TY>, grid, GQ_WARPS * 32, 0, s, (const uint8_t *)w, ggml_row_bytes(TY, in), nu,
                     (int)out, qx + t0 * nu * 2, sx + t0 * nu, tn, y + t0 * out, wpr);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

template <int TY, bool FUSE>
static cudaError_t launch_grpq(const void *w0, const void *w1, size_t estride, int64_t in, int64_t out,
                               const void *q8, int64_t x_rows, int x_div, const mla_cuda_moe_plan *pl, float *y,
                               bool multi, cudaStream_t s) {
    int64_t ty = pl->max_tiles < 65535 ? pl->max_tiles : 65535;
    const int64_t groups = FUSE ? out : (out + GQ_R - 1) / GQ_R;
    const int wpr = gemv_wpr((int)(in / 32), groups * (ty > 0 ? ty : 1));
    const int rows_per_block = FUSE ? GQ_WARPS / wpr : GQ_WARPS / wpr * GQ_R;
    dim3 grid((unsigned)((out + rows_per_block - 1) / rows_per_block), (unsigned)(ty > 0 ? ty : 1));
    mlacu_launch(gemvq_grp_kernel<TY, FUSE>, grid, GQ_WARPS * 32, 0, s, (const uint8_t *)w0, (const uint8_t *)w1,
                 ggml_row_bytes(TY, in), estride, (int)(in / 32), (int)out, (const uint4 *)q8,
                 (const float4 *)((const uint8_t *)q8 + mlacu_q8_scale_off(x_rows, in)), x_div, pl->sorted, pl->tile_e,
                 pl->tile_s, pl->tile_n, pl->n_tiles, pl->world, y, wpr, multi);
    return cudaGetLastError();
}

/* the launchers over a runtime type (mm_cuda.h) */
cudaError_t mlacu_gemvf(uint32_t t, const void *w, int64_t in, int64_t out, const float *x, int64_t T, float *y,
                        cudaStream_t s) {
    switch (t) {
#define MLACU_CASE(T_)                                                                                              \
    case T_:                                                                                                        \
        if constexpr (!i8traits<T_>::OK) return launch_gemvf<T_>(w, in, out, x, T, y, s);                          \
        break;
        MLACU_FOR_TYPES(MLACU_CASE)
#undef MLACU_CASE
    }
    return cudaErrorInvalidValue;
}

cudaError_t mlacu_gemvq(uint32_t t, const void *w, int64_t in, int64_t out, const void *q8, int64_t T, float *y,
                        cudaStream_t s) {
    return with_q8_type(t, [&](auto ty) { return launch_gemvq<decltype(ty)::value>(w, in, out, q8, T, y, s); });
}

cudaError_t mlacu_grpq(uint32_t t, const void *w0, const void *w1, size_t estride, int64_t in, int64_t out,
                       const void *q8, int64_t x_rows, int x_div, const mla_cuda_moe_plan *pl, float *y, bool multi,
                       cudaStream_t s) {
    return with_q8_type(t, [&](auto ty) {
        constexpr int TY = decltype(ty)::value;
        return w1 ? launch_grpq<TY, true>(w0, w1, estride, in, out, q8, x_rows, x_div, pl, y, multi, s)
                  : launch_grpq<TY, false>(w0, NULL, estride, in, out, q8, x_rows, x_div, pl, y, multi, s);
    });
}

} // namespace mlacu

using namespace mlacu;

extern "C" bool mla_cuda_q8_supported(uint32_t t) {
    return with_q8_type(t, [](auto) { return cudaSuccess; }) == cudaSuccess;
}

extern "C" size_t mla_cuda_q8_bytes(int64_t T, int64_t in) {
    MLA_ASSERT(T >= 0 && in >= 0 && in % 32 == 0);
    return mlacu_q8_scale_off(T, in) + (size_t)(T * in / 32) * 16;
}

extern "C" int mla_cuda_quantize_q8(const float *d_x, int64_t T, int64_t in, void *d_q8, mla_cuda_stream stream,
                                    mla_err *e) {
    MLA_ASSERT(T >= 0 && in > 0 && in % 32 == 0 && ((uintptr_t)d_x & 15) == 0 && ((uintptr_t)d_q8 & 15) == 0);
    const int64_t nblk = T * in / 32;
    if (nblk == 0) return MLA_OK;
    mlacu_launch(q8x_kernel, (unsigned)((nblk + 127) / 128), 128, 0, (cudaStream_t)stream, d_x, nblk, (int8_t *)d_q8,
                 (float4 *)((uint8_t *)d_q8 + mlacu_q8_scale_off(T, in)));
    MLACU_CHECK(cudaGetLastError(), e, "quantize_q8 T=%lld in=%lld", (long long)T, (long long)in);
    return MLA_OK;
}
