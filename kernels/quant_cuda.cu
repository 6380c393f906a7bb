/* quant_cuda: device dequantization and quantized matmul (GEMV for decode, mma.sync bf16
 * tensor cores for prefill) for every type in cuda_quant_unit.h. API: kernels/cuda_ops.h. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/cuda_internal.h"
#include "kernels/cuda_quant_unit.h"
#include "kernels/gemvs_cuda.h"
#ifdef MLA_CUDA_WGMMA
#include "kernels/wgmma_cuda.h"
#endif

extern "C" {
#include "kernels/quant.h"
}

namespace mlacu {

/* ---------------------------------------------------------------- dequant */

template <int TY>
__global__ void dequant_kernel(const uint8_t *__restrict__ src, float *__restrict__ dst, int64_t nunits) {
    mlacu_pdl_enter();
    using Q = qtraits<TY>;
    int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= nunits) return;
    float v[32];
    deq_unit<TY>(src + (u / Q::BU) * Q::BB, (int)(u % Q::BU), v);
    float4 *o = (float4 *)(dst + u * 32);
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}

/* Embedding gather: thread per (token, unit). */
template <int TY>
__global__ void get_rows_kernel(const uint8_t *__restrict__ W, size_t rb, int64_t units, const int32_t *__restrict__ ids,
                                float *__restrict__ out) {
    mlacu_pdl_enter();
    using Q = qtraits<TY>;
    int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= units) return;
    const int t = blockIdx.y;
    float v[32];
    deq_unit<TY>(W + (size_t)ids[t] * rb + (u / Q::BU) * Q::BB, (int)(u % Q::BU), v);
    float4 *o = (float4 *)(out + ((size_t)t * units + u) * 32);
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}

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

/* ---------------------------------------------------------------- GEMV variant, T <= 2 */
/* One warp per row, warps independent (no block barrier): the warp copies 32 * UPL units of its
 * row at a time into its own double-buffered shared slot with 16-byte loads issued one chunk
 * ahead, lane u dequantizes units u, u + 32, ... and reads x straight from global memory.
 * Measured on the H200 (bench/results/gpu-ops-2026-11-29.md) 1.2-1.9x SLOWER than gemv_kernel
 * at T = 1, so it is not the default: kept, checked, for tuning (mla_cuda_matmul_gemv_warp). */
constexpr int G2_WARPS = 4, G2_TMAX = 2;

template <int TY> struct gv2 {
    static constexpr int UPL = qtraits<TY>::BE == 32 && qtraits<TY>::BB >= 64 ? 1 : 2; /* F32/F16/BF16: 1 */
    static constexpr int CE = 32 * 32 * UPL;                                             /* chunk elements */
    static constexpr int CB = (CE / qtraits<TY>::BE) * qtraits<TY>::BB;
    static constexpr int SB = (CB + 16 + 15) / 16 * 16;
    static constexpr int NV = (SB / 16 + 31) / 32;
};

template <int TY>
__global__ void __launch_bounds__(G2_WARPS * 32)
    gemv2_kernel(const uint8_t *__restrict__ W, size_t rb, int in, int out, const float *__restrict__ x, int T,
                 float *__restrict__ y) {
    mlacu_pdl_enter();
    using Q = qtraits<TY>;
    using G = gv2<TY>;
    __shared__ __align__(16) uint8_t sm[G2_WARPS][2][G::SB];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * G2_WARPS + warp;
    if (row >= out) return; /* whole warp: no block-wide barrier below */
    const uint8_t *wr = W + (size_t)row * rb;
    const int nchunks = (in + G::CE - 1) / G::CE;
    float acc[G2_TMAX] = {0.f, 0.f};
    uint4 pre[G::NV];
    int off = 0, nv = 0;
    auto load = [&](int c) {
        const uint8_t *g = wr + (size_t)c * G::CB;
        size_t nbytes = rb - (size_t)c * G::CB;
        if (nbytes > (size_t)G::CB) nbytes = G::CB;
        off = (int)((uintptr_t)g & 15);
        nv = (int)((off + nbytes + 15) / 16);
        const uint4 *s = (const uint4 *)(g - off);
#pragma unroll
        for (int k = 0; k < G::NV; k++) {
            int i = lane + 32 * k;
            if (i < nv) pre[k] = __ldg(s + i);
        }
    };
    load(0);
    for (int c = 0; c < nchunks; c++) {
        uint8_t *buf = sm[warp][c & 1];
#pragma unroll
        for (int k = 0; k < G::NV; k++) {
            int i = lane + 32 * k;
            if (i < nv) ((uint4 *)buf)[i] = pre[k];
        }
        const int coff = off;
        __syncwarp();
        if (c + 1 < nchunks) load(c + 1);
        const int k0 = c * G::CE, nu = min(G::CE, in - k0) / 32;
#pragma unroll
        for (int j = 0; j < G::UPL; j++) {
            const int u = lane + 32 * j;
            if (u < nu) {
                float v[32];
                deq_unit<TY>(buf + coff + (u / Q::BU) * Q::BB, u % Q::BU, v);
#pragma unroll
                for (int t = 0; t < G2_TMAX; t++) {
                    if (t < T) {
                        const float4 *xr = (const float4 *)(x + (size_t)t * in + k0 + u * 32);
                        float s = 0.f;
#pragma unroll
                        for (int q = 0; q < 8; q++) {
                            float4 xv = __ldg(xr + q);
                            s = fmaf(v[4 * q], xv.x, s);
                            s = fmaf(v[4 * q + 1], xv.y, s);
                            s = fmaf(v[4 * q + 2], xv.z, s);
                            s = fmaf(v[4 * q + 3], xv.w, s);
                        }
                        acc[t] += s;
                    }
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < G2_TMAX; t++) {
        float s = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0 && t < T) y[(size_t)t * out + row] = s;
    }
}

/* ---------------------------------------------------------------- tensor cores */
/* Block tile 64 tokens x 128 output rows, K step 32 (one unit). Threads 0..127 dequantize one
 * unit of one W row each into bf16 shared memory, threads 128..255 convert the x tile; then 8
 * warps (2 x 4, 32x32 each) run mma.sync m16n8k16 bf16 -> fp32. Two shared buffers: one
 * barrier per K step. Rows padded to 40 bf16 (80 bytes): conflict-free fragment loads. */
constexpr int MM_BM = 64, MM_BN = 128, MM_LD = 40;

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(uint32_t *)&h;
}

/* x = hi + lo with hi = bf16(x), lo = bf16(x - hi): 16 significant bits between them */
__device__ __forceinline__ void split_bf16(float a, float b, uint32_t &hi, uint32_t &lo) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    float2 hf = __bfloat1622float2(h);
    __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
    hi = *(uint32_t *)&h;
    lo = *(uint32_t *)&l;
}

/* SPLIT: activations and weights split into bf16 hi + lo and three MMAs per fragment
 * (hi*hi + hi*lo + lo*hi, fp32 accumulate): about fp32-GEMV accuracy (the lo*lo term, ~2^-16
 * relative, is left out) at tensor-core speed. Hi and lo tiles double the shared memory, so
 * SPLIT keeps one buffer and pays a second barrier per K step. */
template <int TY, bool SPLIT>
__global__ void __launch_bounds__(256)
    mma_kernel(const uint8_t *__restrict__ W, size_t rb, int in, int out, const float *__restrict__ x, int T,
               float *__restrict__ y) {
    mlacu_pdl_enter();
    using Q = qtraits<TY>;
    constexpr int NB = SPLIT ? 1 : 2, NP = SPLIT ? 2 : 1;
    __shared__ __align__(16) __nv_bfloat16 As[NB][NP][MM_BM][MM_LD];
    __shared__ __align__(16) __nv_bfloat16 Bs[NB][NP][MM_BN][MM_LD];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp >> 2, wn = warp & 3, g = lane >> 2, tig = lane & 3;
    const int m0 = blockIdx.y * MM_BM, n0 = blockIdx.x * MM_BN;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[i][j][k] = 0.f;

    const int nk = in / 32;
    for (int kt = 0; kt < nk; kt++) {
        const int buf = SPLIT ? 0 : (kt & 1);
        if (SPLIT && kt > 0) __syncthreads(); /* one buffer: every warp is done with the last tile */
        if (tid < MM_BN) {
            const int n = n0 + tid;
            float v[32];
            if (n < out) {
                deq_unit<TY>(W + (size_t)n * rb + (size_t)(kt / Q::BU) * Q::BB, kt % Q::BU, v);
            } else {
#pragma unroll
                for (int i = 0; i < 32; i++) v[i] = 0.f;
            }
            uint4 *d = (uint4 *)&Bs[buf][0][tid][0];
            if constexpr (SPLIT) {
                uint4 *dl = (uint4 *)&Bs[buf][NP - 1][tid][0];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    uint32_t h[4], l[4];
#pragma unroll
                    for (int j = 0; j < 4; j++) split_bf16(v[8 * q + 2 * j], v[8 * q + 2 * j + 1], h[j], l[j]);
                    d[q] = make_uint4(h[0], h[1], h[2], h[3]);
                    dl[q] = make_uint4(l[0], l[1], l[2], l[3]);
                }
            } else {
#pragma unroll
                for (int q = 0; q < 4; q++)
                    d[q] = make_uint4(pack_bf16(v[8 * q], v[8 * q + 1]), pack_bf16(v[8 * q + 2], v[8 * q + 3]),
                                      pack_bf16(v[8 * q + 4], v[8 * q + 5]), pack_bf16(v[8 * q + 6], v[8 * q + 7]));
            }
        } else {
            const int i = tid - MM_BN, m = i >> 1, kh = (i & 1) * 16;
            const int gm = m0 + m;
            float4 f[4];
            if (gm < T) {
                const float4 *s = (const float4 *)(x + (size_t)gm * in + (size_t)kt * 32 + kh);
#pragma unroll
                for (int q = 0; q < 4; q++) f[q] = __ldg(s + q);
            } else {
#pragma unroll
                for (int q = 0; q < 4; q++) f[q] = make_float4(0.f, 0.f, 0.f, 0.f);
            }
            uint4 *d = (uint4 *)&As[buf][0][m][kh];
            if constexpr (SPLIT) {
                uint4 *dl = (uint4 *)&As[buf][NP - 1][m][kh];
                uint32_t h[8], l[8];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    split_bf16(f[q].x, f[q].y, h[2 * q], l[2 * q]);
                    split_bf16(f[q].z, f[q].w, h[2 * q + 1], l[2 * q + 1]);
                }
                d[0] = make_uint4(h[0], h[1], h[2], h[3]);
                d[1] = make_uint4(h[4], h[5], h[6], h[7]);
                dl[0] = make_uint4(l[0], l[1], l[2], l[3]);
                dl[1] = make_uint4(l[4], l[5], l[6], l[7]);
            } else {
                d[0] = make_uint4(pack_bf16(f[0].x, f[0].y), pack_bf16(f[0].z, f[0].w), pack_bf16(f[1].x, f[1].y),
                                  pack_bf16(f[1].z, f[1].w));
                d[1] = make_uint4(pack_bf16(f[2].x, f[2].y), pack_bf16(f[2].z, f[2].w), pack_bf16(f[3].x, f[3].y),
                                  pack_bf16(f[3].z, f[3].w));
            }
        }
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < 2; ks++) {
            const int c = ks * 16 + 2 * tig;
            uint32_t a[NP][2][4];
#pragma unroll
            for (int p = 0; p < NP; p++)
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const int r = wm * 32 + mt * 16 + g;
                    a[p][mt][0] = *(const uint32_t *)&As[buf][p][r][c];
                    a[p][mt][1] = *(const uint32_t *)&As[buf][p][r + 8][c];
                    a[p][mt][2] = *(const uint32_t *)&As[buf][p][r][c + 8];
                    a[p][mt][3] = *(const uint32_t *)&As[buf][p][r + 8][c + 8];
                }
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int n = wn * 32 + nt * 8 + g;
                uint32_t b0 = *(const uint32_t *)&Bs[buf][0][n][c];
                uint32_t b1 = *(const uint32_t *)&Bs[buf][0][n][c + 8];
                if constexpr (SPLIT) { /* small terms first */
                    uint32_t l0 = *(const uint32_t *)&Bs[buf][NP - 1][n][c];
                    uint32_t l1 = *(const uint32_t *)&Bs[buf][NP - 1][n][c + 8];
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mlacu_mma_bf16(acc[mt][nt], a[NP - 1][mt], b0, b1);
                        mlacu_mma_bf16(acc[mt][nt], a[0][mt], l0, l1);
                    }
                }
#pragma unroll
                for (int mt = 0; mt < 2; mt++) mlacu_mma_bf16(acc[mt][nt], a[0][mt], b0, b1);
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const int m = m0 + wm * 32 + mt * 16 + g;
            const int n = n0 + wn * 32 + nt * 8 + 2 * tig;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int mm = m + 8 * h;
                if (mm >= T) continue;
                if (n < out) y[(size_t)mm * out + n] = acc[mt][nt][2 * h];
                if (n + 1 < out) y[(size_t)mm * out + n + 1] = acc[mt][nt][2 * h + 1];
            }
        }
    }
}

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
        cudaError_t err = cudaFuncSetAttribute(gemv_grp_kernel<TY, FUSE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)gemv_smem<TY>(GV_TMAX));
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
static_assert(GQ_T >= MLACU_MOE_TILE && GV_TMAX >= MLACU_MOE_TILE, "a MoE tile's tokens must fit one pass");

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
__device__ __forceinline__ void gemv_group_sum(float acc[GQ_R][GQ_T], float (*red)[GQ_R][GQ_T], int warp, int lane,
                                               int part, int wpr) {
#pragma unroll
    for (int r = 0; r < GQ_R; r++)
#pragma unroll
        for (int t = 0; t < GQ_T; t++) {
            acc[r][t] = warp_sum(acc[r][t]);
            if (wpr > 1 && lane == 0) red[warp][r][t] = acc[r][t];
        }
    if (wpr == 1) return;
    __syncthreads();
    if (part == 0)
#pragma unroll
        for (int r = 0; r < GQ_R; r++)
#pragma unroll
            for (int t = 0; t < GQ_T; t++) {
                float v = 0.f;
                for (int k = 0; k < wpr; k++) v += red[warp + k][r][t];
                acc[r][t] = v;
            }
    __syncthreads(); /* red is reused by the next tile */
}

/* Sums a row group's partial results over its wpr warps and stores y[t][row0 + r]. */
__device__ __forceinline__ void gemv_group_store(float acc[GQ_R][GQ_T], float (*red)[GQ_R][GQ_T], int warp, int lane,
                                                 int part, int wpr, int row0, int out, int T, float *__restrict__ y) {
    gemv_group_sum(acc, red, warp, lane, part, wpr);
    if (part != 0 || lane != 0) return;
#pragma unroll
    for (int r = 0; r < GQ_R; r++)
#pragma unroll
        for (int t = 0; t < GQ_T; t++)
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
 * dot them with fp32 x (L1-cached), wpr warps per group of GQ_R rows. */
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

template <int TY>
__global__ void __launch_bounds__(GQ_WARPS * 32)
    gemvf_kernel(const uint8_t *__restrict__ W, size_t rb, int nu, int out, const float *__restrict__ x, int T,
                 float *__restrict__ y, int wpr) {
    __shared__ float red[GQ_WARPS][GQ_R][GQ_T];
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
    float acc[GQ_R][GQ_T];
#pragma unroll
    for (int r = 0; r < GQ_R; r++)
#pragma unroll
        for (int t = 0; t < GQ_T; t++) acc[r][t] = 0.f;
    const int in = nu * 32;
    for (int u = part * 32 + lane; u < nu; u += 32 * wpr) {
        float v[GQ_R][32];
#pragma unroll
        for (int r = 0; r < GQ_R; r++) unit_f32<TY>(p[r] + (size_t)u * qtraits<TY>::BB, v[r]);
#pragma unroll
        for (int t = 0; t < GQ_T; t++) {
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
    gemv_group_store(acc, red, warp, lane, part, wpr, row0, out, T, y);
}

/* The grouped expert version over a MoE plan's tiles (as gemv_grp_kernel): blockIdx.y walks the
 * tiles (multi: those after the plan's single-pair ones), a warp owns rows (FUSE: row f of gate
 * and of up, writing silu(g) * u). */
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
        mlacu_launch(gemvf_kernel<TY>, grid, GQ_WARPS * 32, 0, s, (const uint8_t *)w, ggml_row_bytes(TY, in), nu,
                     (int)out, x + t0 * in, tn, y + t0 * out, wpr);
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

/* ---------------------------------------------------------------- integer tensor cores */
/* Prefill and large batches with q8 activations: mma.sync m16n8k16 s8 x s8 -> s32. A block owns
 * 64 tokens x 64 output rows (4 warps of 32 x 32), walks K IM_KU units (of 32) per stage: the
 * tokens' q8 blocks are copied to shared memory, each weight unit is put in its integer form
 * (unit_i8: any quantized type) by one thread, and every unit's two k16 halves go through the
 * tensor cores; the int32 result of a unit (or of each half, for types with two scales per unit)
 * is scaled into fp32 accumulators: y += d_x * s_w * (q_x . q_w) - m_w * (d_x * sum q_x). Rows of
 * 48 bytes in shared memory: the fragment loads of a warp hit 32 distinct banks. */
constexpr int IM_BM = 64, IM_BN = 64, IM_KU = 4, IM_LD = 48;

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b));
}

/* The shared memory of one block of the int8 kernels. xrow[tok]: the q8 row of the block's token
 * tok (-1: none), yrow[tok]: its output row. */
struct mmaq_smem {
    __align__(16) uint8_t As[IM_KU][IM_BM][IM_LD];
    __align__(16) uint8_t Bs[IM_KU][IM_BN][IM_LD];
    float4 Asc[IM_KU][IM_BM]; /* d, d * sum q[0:16], d * sum q[16:32] */
    float4 Bsc[IM_KU][IM_BN]; /* s0, s1, m0, m1 */
    int xrow[IM_BM], yrow[IM_BM];
};

/* acc = rows r0.. of W (64) x the block's tokens (sm.xrow) over all nu units; the caller has
 * filled xrow and synchronised. */
template <int TY>
__device__ __forceinline__ void mmaq_block(const uint8_t *__restrict__ W, size_t rb, int nu, int out, int r0,
                                           const uint4 *__restrict__ qx, const float4 *__restrict__ sx,
                                           mmaq_smem &sm, float (&acc)[2][4][4]) {
    using Q = qtraits<TY>;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const int wm = warp >> 1, wn = warp & 1;
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[a][b][i] = 0.f;
    for (int u0 = 0; u0 < nu; u0 += IM_KU) {
        __syncthreads();
        for (int i = tid; i < IM_KU * IM_BM * 2; i += 128) {
            const int uu = i / (IM_BM * 2), tok = (i >> 1) % IM_BM, half = i & 1;
            const int u = u0 + uu, xr = sm.xrow[tok];
            uint4 v = make_uint4(0, 0, 0, 0);
            if (u < nu && xr >= 0) v = __ldg(qx + ((size_t)xr * nu + u) * 2 + half);
            *(uint4 *)&sm.As[uu][tok][16 * half] = v;
        }
        for (int i = tid; i < IM_KU * IM_BM; i += 128) {
            const int uu = i / IM_BM, tok = i % IM_BM, u = u0 + uu, xr = sm.xrow[tok];
            sm.Asc[uu][tok] = u < nu && xr >= 0 ? __ldg(sx + (size_t)xr * nu + u) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        for (int i = tid; i < IM_KU * IM_BN; i += 128) {
            const int uu = i / IM_BN, row = i % IM_BN, u = u0 + uu;
            unit_i8_t w;
            if (u < nu) {
                unit_i8<TY>(W + (size_t)min(r0 + row, out - 1) * rb + (size_t)(u / Q::BU) * Q::BB, u % Q::BU, w);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) w.q[j] = 0;
                w.s[0] = w.s[1] = w.m[0] = w.m[1] = 0.f;
            }
            uint4 *d = (uint4 *)&sm.Bs[uu][row][0];
            d[0] = make_uint4(w.q[0], w.q[1], w.q[2], w.q[3]);
            d[1] = make_uint4(w.q[4], w.q[5], w.q[6], w.q[7]);
            sm.Bsc[uu][row] = make_float4(w.s[0], w.s[1], w.m[0], w.m[1]);
        }
        __syncthreads();
#pragma unroll 1
        for (int uu = 0; uu < IM_KU && u0 + uu < nu; uu++) {
            float da[2][2];
            float4 sb[4][2];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int k = 0; k < 2; k++) da[mt][k] = sm.Asc[uu][wm * 32 + mt * 16 + g + 8 * k].x;
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int k = 0; k < 2; k++) sb[nt][k] = sm.Bsc[uu][wn * 32 + nt * 8 + tg * 2 + k];
            int c[2][4][4];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (h == 0 || i8_scales2<TY>()) {
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int nt = 0; nt < 4; nt++)
#pragma unroll
                            for (int i = 0; i < 4; i++) c[mt][nt][i] = 0;
                }
                uint32_t a[2][2], b[4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const int tok = wm * 32 + mt * 16 + g;
                    a[mt][0] = *(const uint32_t *)&sm.As[uu][tok][16 * h + 4 * tg];
                    a[mt][1] = *(const uint32_t *)&sm.As[uu][tok + 8][16 * h + 4 * tg];
                }
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
                    b[nt] = *(const uint32_t *)&sm.Bs[uu][wn * 32 + nt * 8 + g][16 * h + 4 * tg];
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) mma_s8(c[mt][nt], a[mt][0], a[mt][1], b[nt]);
                if (h == 1 || i8_scales2<TY>()) { /* scale this half (or the whole unit) */
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int nt = 0; nt < 4; nt++)
#pragma unroll
                            for (int i = 0; i < 4; i++) {
                                const float sw = h == 0 ? sb[nt][i & 1].x : sb[nt][i & 1].y;
                                acc[mt][nt][i] += (float)c[mt][nt][i] * (da[mt][i >> 1] * sw);
                            }
                }
            }
            if (i8_min<TY>()) {
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int k = 0; k < 2; k++) {
                        const float4 xa = sm.Asc[uu][wm * 32 + mt * 16 + g + 8 * k];
#pragma unroll
                        for (int nt = 0; nt < 4; nt++)
#pragma unroll
                            for (int j = 0; j < 2; j++)
                                acc[mt][nt][2 * k + j] -= sb[nt][j].z * xa.y + sb[nt][j].w * xa.z;
                    }
            }
        }
    }
}

/* y[yrow[tok]][r0 + column] = acc for the block's tokens with an output row */
__device__ __forceinline__ void mmaq_store(const float (&acc)[2][4][4], const mmaq_smem &sm, int r0, int out,
                                           float *__restrict__ y) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
    const int wm = warp >> 1, wn = warp & 1;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int yr = sm.yrow[wm * 32 + mt * 16 + g + 8 * (i >> 1)], o = r0 + wn * 32 + nt * 8 + tg * 2 + (i & 1);
                if (yr >= 0 && o < out) y[(size_t)yr * out + o] = acc[mt][nt][i];
            }
}

template <int TY>
__global__ void __launch_bounds__(128)
    mmaq_kernel(const uint8_t *__restrict__ W, size_t rb, int nu, int out, const uint4 *__restrict__ qx,
                const float4 *__restrict__ sx, int T, float *__restrict__ y) {
    mlacu_pdl_enter();
    __shared__ mmaq_smem sm;
    const int t0 = blockIdx.y * IM_BM, r0 = blockIdx.x * IM_BN;
    for (int i = threadIdx.x; i < IM_BM; i += 128) sm.xrow[i] = sm.yrow[i] = t0 + i < T ? t0 + i : -1;
    float acc[2][4][4];
    mmaq_block<TY>(W, rb, nu, out, r0, qx, sx, sm, acc);
    mmaq_store(acc, sm, r0, out, y);
}

/* The experts of a MoE plan on the int8 tensor cores: block (row block, expert e) walks e's pairs
 * (plan.sorted from e's offset, the sum of the counts before it) 64 at a time: pair p reads q8
 * row p / x_div, writes y row p. For prefill-sized steps (many tokens per expert). */
template <int TY>
__global__ void __launch_bounds__(128)
    mmaq_grp_kernel(const uint8_t *__restrict__ W, size_t rb, size_t estride, int nu, int out,
                    const uint4 *__restrict__ qx, const float4 *__restrict__ sx, int x_div,
                    const int32_t *__restrict__ sorted, const int32_t *__restrict__ counts, int world,
                    float *__restrict__ y) {
    mlacu_pdl_enter();
    __shared__ mmaq_smem sm;
    const int e = blockIdx.y, r0 = blockIdx.x * IM_BN, tid = threadIdx.x;
    const int cnt = counts[e];
    if (cnt == 0) return; /* the whole block: no barrier passed yet */
    const int off = plan_first_pair(counts, e);
    const uint8_t *We = W + (size_t)(e / world) * estride;
    for (int c0 = 0; c0 < cnt; c0 += IM_BM) {
        __syncthreads(); /* the previous chunk's stores read yrow */
        for (int i = tid; i < IM_BM; i += 128) {
            const int p = c0 + i < cnt ? sorted[off + c0 + i] : -1;
            sm.xrow[i] = p >= 0 ? p / x_div : -1;
            sm.yrow[i] = p;
        }
        float acc[2][4][4];
        mmaq_block<TY>(We, rb, nu, out, r0, qx, sx, sm, acc);
        mmaq_store(acc, sm, r0, out, y);
    }
}

template <int TY>
static cudaError_t launch_mmaq(const void *w, int64_t in, int64_t out, const void *q8, int64_t T, float *y,
                               cudaStream_t s) {
    const int nu = (int)(in / 32);
    dim3 grid((unsigned)((out + IM_BN - 1) / IM_BN), (unsigned)((T + IM_BM - 1) / IM_BM));
    mlacu_launch(mmaq_kernel<TY>, grid, 128, 0, s, (const uint8_t *)w, ggml_row_bytes(TY, in), nu, (int)out,
                 (const uint4 *)q8, (const float4 *)((const uint8_t *)q8 + mlacu_q8_scale_off(T, in)), (int)T, y);
    return cudaGetLastError();
}

template <int TY>
static cudaError_t launch_mmaq_grp(const void *w, size_t estride, int64_t in, int64_t out, const void *q8,
                                   int64_t x_rows, int x_div, const mla_cuda_moe_plan *pl, int64_t n_expert, float *y,
                                   cudaStream_t s) {
    dim3 grid((unsigned)((out + IM_BN - 1) / IM_BN), (unsigned)n_expert);
    mlacu_launch(mmaq_grp_kernel<TY>, grid, 128, 0, s, (const uint8_t *)w, ggml_row_bytes(TY, in), estride,
                 (int)(in / 32), (int)out, (const uint4 *)q8,
                 (const float4 *)((const uint8_t *)q8 + mlacu_q8_scale_off(x_rows, in)), x_div, pl->sorted, pl->counts,
                 pl->world, y);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- fp16 tensor cores over quantized W */
/* Prefill and large expert tiles: y = x W^T with x in fp16 (each row scaled by a power of two so
 * that its largest element sits below 2^14: fp16 keeps 11 bits of every element, far more than
 * the int8 path's 8 bits of a block's largest) and W dequantized to fp16 in shared memory, then
 * mma.sync m16n8k16 f16 x f16 -> fp32. No per-block epilogue: the integer path pays a convert
 * and two FMAs per output per 32 inputs, which bounds it well below the tensor-core rate.
 *
 * A block owns BM tokens x MH_BN (128) output rows; warps WGM x 4, each (MT 16-row tiles) x 32
 * rows. K walks in steps of 64. The raw quant blocks of the block's 128 rows come into shared
 * memory by cp.async a chunk at a time, one chunk ahead (a chunk: one quant block of 256
 * elements for the K/IQ types, four 32-element blocks otherwise: every step's units are
 * complete); the x tile (fp16 rows) one step ahead through registers; each step the threads
 * dequantize the step's two units of every row into a 128 x 64 fp16 tile, then the warps run 4
 * k16 slices of MMAs from ldmatrix fragments. Rows of 72 halves (144 bytes): conflict-free
 * ldmatrix. */
constexpr int MH_BN = 128, MH_BK = 64, MH_LDH = MH_BK + 8;

template <int TY> struct mh_geo {
    using Q = qtraits<TY>;
    static constexpr int CK = Q::BE > 2 * MH_BK ? Q::BE : 2 * MH_BK; /* elements per raw chunk */
    static constexpr int SPC = CK / MH_BK;                     /* steps per chunk */
    static constexpr int CB = Q::BB * (CK / Q::BE);            /* bytes of a row's chunk */
    /* a row's bytes in shared memory: 16-byte copies when CB allows (and W is aligned: 16 of
     * slack for the 4-byte fallback), else the 4-aligned window around the chunk */
    static constexpr int RAWB = CB % 16 == 0 ? CB + 16 : (CB + 3) / 4 * 4 + 4;
};

template <int TY, int BM> __host__ __device__ constexpr size_t mh_smem() {
    return (size_t)2 * MH_BN * mh_geo<TY>::RAWB + (size_t)2 * BM * MH_LDH * 2 + (size_t)MH_BN * MH_LDH * 2 +
           (size_t)2 * BM * 4;
}

/* The 32 elements of a unit as fp16, stored to d (16-aligned shared memory: 4 x 16 bytes). The
 * results stay in registers: no array whose address escapes (an out-of-line call taking one
 * would put it in local memory). Generic: the float dequantization, rounded. */
__device__ __forceinline__ void store_h(uint4 *d, const uint32_t (&h)[16]) {
#pragma unroll
    for (int q = 0; q < 4; q++) d[q] = make_uint4(h[4 * q], h[4 * q + 1], h[4 * q + 2], h[4 * q + 3]);
}
template <int TY> __device__ __forceinline__ void deq_h_f32(const uint8_t *b, int sub, uint4 *d) {
    float v[32];
    deq_unit<TY>(b, sub, v);
    uint32_t h[16];
#pragma unroll
    for (int i = 0; i < 16; i++) h[i] = h2_bits(__floats2half2_rn(v[2 * i], v[2 * i + 1]));
    store_h(d, h);
}
template <int TY> __device__ __forceinline__ void deq_h(const uint8_t *b, int sub, uint4 *d) {
    deq_h_f32<TY>(b, sub, d);
}
/* the same out of line: the rare fallback of the fast paths, kept from their registers */
template <int TY> __device__ __noinline__ void deq_h_slow(const uint8_t *b, int sub, uint4 *d) {
    deq_h_f32<TY>(b, sub, d);
}
/* Q4_K from a 16-aligned block: the header (d, dmin, 12 bytes of scales) and the unit's 32 bytes
 * of nibbles in three 16-byte loads (byte loads of shared memory cost a bank wavefront each);
 * nibbles to fp16 exactly, then q * d1 - m1 with one fp16 rounding (d1 and m1 rounded to fp16
 * first: relative 2^-11). The float path when they would not fit fp16 or the block is not
 * 16-aligned. */
template <> __device__ __forceinline__ void deq_h<GGML_TYPE_Q4_K>(const uint8_t *b, int sub, uint4 *d) {
    if ((uintptr_t)b & 15) {
        deq_h_slow<GGML_TYPE_Q4_K>(b, sub, d);
        return;
    }
    const uint4 hd = *(const uint4 *)b; /* x: d | dmin; y, z, w: scale bytes 0-3, 4-7, 8-11 */
    const int j = sub & 3, sh8 = 8 * j;
    const uint32_t y = (hd.y >> sh8) & 0xFF, z = (hd.z >> sh8) & 0xFF, w = (hd.w >> sh8) & 0xFF;
    /* kscale_min: sub < 4 from bytes sub and sub + 4; else from bytes sub + 4 and the top bits */
    const int sc = sub < 4 ? (int)(y & 63) : (int)((w & 0xF) | ((y >> 6) << 4));
    const int m = sub < 4 ? (int)(z & 63) : (int)((w >> 4) | ((z >> 6) << 4));
    const float d1 = h2f(hd.x & 0xFFFF) * (float)sc, m1 = h2f(hd.x >> 16) * (float)m;
    if (!(fabsf(d1) < 60000.f && fabsf(m1) < 60000.f)) {
        deq_h_slow<GGML_TYPE_Q4_K>(b, sub, d);
        return;
    }
    const uint4 *qp = (const uint4 *)(b + 16 + 32 * (sub >> 1));
    const uint4 q0 = qp[0], q1 = qp[1];
    const uint32_t qw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    const __half2 hdv = __float2half2_rn(d1), hm = __float2half2_rn(-m1), k1024 = __float2half2_rn(1024.f);
    const int sh = 4 * (sub & 1);
#pragma unroll
    for (int q = 0; q < 4; q++) { /* 8 elements, then their 16 bytes out: few live registers */
        uint32_t t[4];
#pragma unroll
        for (int k2 = 0; k2 < 2; k2++) {
            const uint32_t u = (qw[2 * q + k2] >> sh) & 0x0F0F0F0Fu;
            __half2 lo, hi;
            bytes_h2(u, lo, hi);
            t[2 * k2] = h2_bits(__hfma2(__hsub2(lo, k1024), hdv, hm));
            t[2 * k2 + 1] = h2_bits(__hfma2(__hsub2(hi, k1024), hdv, hm));
        }
        d[q] = make_uint4(t[0], t[1], t[2], t[3]);
    }
}
/* Q8_0 (blocks at even offsets): nine aligned 32-bit loads and funnel shifts instead of 2-byte
 * loads; q + 128 to fp16 exactly, minus 1152, times d (an fp16 already): one rounding. Reads up to
 * 2 bytes past the block (the shared-memory window has them). */
template <> __device__ __forceinline__ void deq_h<GGML_TYPE_Q8_0>(const uint8_t *b, int, uint4 *d) {
    const uint32_t *wp = (const uint32_t *)((uintptr_t)b & ~(uintptr_t)3);
    const bool odd = ((uintptr_t)b & 2) != 0; /* the block starts at byte 2 of its first word */
    uint32_t w[9];
#pragma unroll
    for (int k = 0; k < 9; k++) w[k] = wp[k];
    const uint32_t dbits = odd ? w[0] >> 16 : w[0] & 0xFFFF;
    const __half2 hd = bits_h2(dbits * 0x10001u), k1152 = __float2half2_rn(1152.f);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t t[4];
#pragma unroll
        for (int k2 = 0; k2 < 2; k2++) {
            const int k = 2 * q + k2;
            const uint32_t u = (odd ? w[k + 1] : __funnelshift_r(w[k], w[k + 1], 16)) ^ 0x80808080u;
            __half2 lo, hi;
            bytes_h2(u, lo, hi);
            t[2 * k2] = h2_bits(__hmul2(__hsub2(lo, k1152), hd));
            t[2 * k2 + 1] = h2_bits(__hmul2(__hsub2(hi, k1152), hd));
        }
        d[q] = make_uint4(t[0], t[1], t[2], t[3]);
    }
}

/* One block's product over chunks [c_begin, c_end) of K: acc = x rows (xrow) x W rows r0..
 * (128), raw chunks and x tiles double-buffered. 4-warp tiles (RA) fetch chunk c + 1 as chunk c
 * starts, so that a block keeps a chunk of W in flight while it works (what a short tile of
 * tokens needs to stream W at the memory's rate), and read the next x tile into registers during
 * a step's MMAs. 8-warp tiles (compute-bound; no registers to spare) take x by cp.async a step
 * ahead and W's next chunk with the chunk's last step. sm: the dynamic shared memory; the caller
 * has filled xrow and synchronised. al16: W, rb and estride allow 16-byte copies. */
template <int TY, int MT, int WGM>
__device__ __forceinline__ void mmh_block(const uint8_t *__restrict__ W, size_t rb, bool al16, int in, int out,
                                          int r0, int c_begin, int c_end, const __half *__restrict__ xh,
                                          uint8_t *sm, float (&acc)[MT][4][4]) {
    using G = mh_geo<TY>;
    using Q = qtraits<TY>;
    constexpr int NT = WGM * 128, BM = WGM * MT * 16, NA = BM * 8 / NT;
    uint8_t *raw = sm;                                          /* [2][BN][RAWB] */
    __half *As = (__half *)(sm + 2 * MH_BN * G::RAWB);          /* [2][BM][LDH] */
    __half *Bs = As + 2 * BM * MH_LDH;                          /* [BN][LDH] */
    const int *xrow = (const int *)(Bs + MH_BN * MH_LDH);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp / 4, wn = warp % 4;
#pragma unroll
    for (int a = 0; a < MT; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[a][b][i] = 0.f;
    const int s_begin = c_begin * G::SPC, s_end = c_end * G::SPC;
    const bool v16 = G::CB % 16 == 0 && al16;
    auto row_chunk = [&](int r, int c) { /* global address of row r0 + r's chunk c */
        return W + (size_t)min(r0 + r, out - 1) * rb + (size_t)c * G::CB;
    };
    auto issue_raw = [&](int c) {
        uint8_t *Rd = raw + (c & 1) * MH_BN * G::RAWB;
        if (v16) {
            for (int i = tid; i < MH_BN * (G::CB / 16); i += NT) {
                const int r = i / (G::CB / 16), k = i % (G::CB / 16);
                cp_async16(Rd + r * G::RAWB + 16 * k, row_chunk(r, c) + 16 * k);
            }
        } else {
            constexpr int NW = (G::CB + 3) / 4 + 1; /* words of the widest window */
            for (int i = tid; i < MH_BN * NW; i += NT) {
                const int r = i / NW, k = i % NW;
                const uint8_t *p = row_chunk(r, c);
                const uint8_t *a0 = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)3);
                if (a0 + 4 * k < p + G::CB) cp_async4(Rd + r * G::RAWB + 4 * k, a0 + 4 * k);
            }
        }
    };
    /* RA (4-warp tiles, the memory-bound ones): x through registers and W a chunk ahead. 8-warp
     * tiles, whose registers are taken: x by cp.async, W's next chunk with the chunk's last step */
    constexpr bool RA = WGM == 1;
    auto issue_a = [&](int s) {
        __half *Ad = As + (s & 1) * BM * MH_LDH;
        for (int i = tid; i < BM * 8; i += NT) {
            const int r = i >> 3, c = i & 7;
            cp_async16(Ad + r * MH_LDH + c * 8, xh + (size_t)xrow[r] * in + (size_t)s * MH_BK + c * 8);
        }
    };
    uint4 areg[RA ? NA : 1];
    auto load_a = [&](int s) {
#pragma unroll
        for (int j = 0; j < NA; j++) {
            const int i = tid + j * NT, r = i >> 3, c = i & 7;
            areg[j] = __ldg((const uint4 *)(xh + (size_t)xrow[r] * in + (size_t)s * MH_BK + c * 8));
        }
    };
    auto store_a = [&](int s) {
        __half *Ad = As + (s & 1) * BM * MH_LDH;
#pragma unroll
        for (int j = 0; j < NA; j++) {
            const int i = tid + j * NT, r = i >> 3, c = i & 7;
            *(uint4 *)(Ad + r * MH_LDH + c * 8) = areg[j];
        }
    };
    issue_raw(c_begin);
    if constexpr (RA) {
        load_a(s_begin);
        store_a(s_begin);
    } else {
        issue_a(s_begin);
    }
    cp_async_commit();
    const uint32_t b_base = (uint32_t)__cvta_generic_to_shared(Bs);
    for (int s = s_begin; s < s_end; s++) {
        const int c = s / G::SPC, sub = s % G::SPC;
        if (RA ? sub == 0 : true) cp_async_wait_all(); /* this thread's part of chunk c (and x tile s) */
        __syncthreads(); /* chunk c and x tile s are in; every warp is past step s - 1's MMAs */
        if constexpr (RA) {
            if (sub == 0 && c + 1 < c_end) {
                issue_raw(c + 1);
                cp_async_commit();
            }
        } else {
            if (s + 1 < s_end) issue_a(s + 1);
            if (sub == G::SPC - 1 && c + 1 < c_end) issue_raw(c + 1);
            cp_async_commit();
        }
        { /* dequantize step s: two units of each of the 128 rows */
            const uint8_t *Rs = raw + (c & 1) * MH_BN * G::RAWB;
#pragma unroll
            for (int j = 0; j < MH_BN * 2 / NT; j++) {
                const int i = tid + j * NT, r = i >> 1, uu = i & 1, uc = sub * 2 + uu; /* unit of the chunk */
                const uint8_t *rowp = Rs + r * G::RAWB + (v16 ? 0 : ((uintptr_t)row_chunk(r, c) & 3));
                deq_h<TY>(rowp + (uc / Q::BU) * Q::BB, uc % Q::BU, (uint4 *)(Bs + r * MH_LDH + uu * 32));
            }
        }
        if (RA && s + 1 < s_end) load_a(s + 1); /* in flight during the MMAs */
        __syncthreads();
        const uint32_t a_base = (uint32_t)__cvta_generic_to_shared(As + (s & 1) * BM * MH_LDH);
#pragma unroll
        for (int kk = 0; kk < MH_BK / 16; kk++) {
            uint32_t a[MT][4], b[2][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                mlacu_ldsm_x4(a[mt], a_base + 2 * ((wm * MT * 16 + mt * 16 + (lane & 15)) * MH_LDH + kk * 16 +
                                                   (lane >> 4) * 8));
#pragma unroll
            for (int np = 0; np < 2; np++)
                mlacu_ldsm_x4(b[np], b_base + 2 * ((wn * 32 + np * 16 + (lane & 7) + (lane >> 4) * 8) * MH_LDH +
                                                   kk * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
                    mlacu_mma_f16(acc[mt][nt], a[mt], b[nt >> 1][2 * (nt & 1)], b[nt >> 1][2 * (nt & 1) + 1]);
        }
        if (RA && s + 1 < s_end) store_a(s + 1); /* buffer (s + 1) & 1: last read by step s - 1's MMAs */
    }
}

/* y[yrow[tok]][r0 + column] = acc * the x row's scale, for the block's tokens with an output row */
template <int MT>
__device__ __forceinline__ void mmh_store(const float (&acc)[MT][4][4], const int *xrow, const int *yrow,
                                          const float *__restrict__ xs, int r0, int out, float *__restrict__ y) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
    const int wm = warp / 4, wn = warp % 4;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int tok = wm * MT * 16 + mt * 16 + g + 8 * hh, yr = yrow[tok];
            if (yr < 0) continue;
            const float sc = xs[xrow[tok]];
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int o = r0 + wn * 32 + nt * 8 + tg * 2 + j;
                    if (o < out) y[(size_t)yr * out + o] = acc[mt][nt][2 * hh + j] * sc;
                }
        }
}

/* Dense (counts NULL): block (row block, token block, split z) computes y rows t0.. of the T
 * tokens over K's chunk range z of `splits` (splits > 1: into ws + z T out, summed by
 * mh_sum_kernel). Grouped, the experts of a MoE plan (as mmaq_grp_kernel): block (row block,
 * expert e) walks e's pairs BM at a time; pair p reads x row p / x_div and writes y row p. */
template <int TY, int MT, int WGM>
__global__ void __launch_bounds__(WGM * 128, WGM == 2 ? 2 : 3)
    mmh_kernel(const uint8_t *__restrict__ W, size_t rb, size_t estride, bool al16, int in, int out,
               const __half *__restrict__ xh, const float *__restrict__ xs, int T, int x_div,
               const int32_t *__restrict__ sorted, const int32_t *__restrict__ counts, int world, int splits,
               float *__restrict__ y) {
    mlacu_pdl_enter();
    extern __shared__ __align__(16) uint8_t mh_sm[];
    constexpr int BM = WGM * MT * 16;
    int *xrow = (int *)(mh_sm + mh_smem<TY, BM>() - 2 * BM * 4), *yrow = xrow + BM;
    const int r0 = blockIdx.x * MH_BN;
    int cnt, off;
    const uint8_t *We;
    if (!plan_block_pairs(W, estride, T, BM, counts, world, cnt, off, We)) return;
    for (int c0 = 0; c0 < cnt; c0 += BM) {
        __syncthreads(); /* the previous tile's stores read xrow / yrow */
        plan_tile_rows(xrow, yrow, BM, WGM * 128, off, c0, cnt, sorted, counts, x_div);
        __syncthreads();
        const int nch = in / mh_geo<TY>::CK, z = blockIdx.z;
        float acc[MT][4][4];
        mmh_block<TY, MT, WGM>(We, rb, al16, in, out, r0, (int)((int64_t)z * nch / splits),
                               (int)((int64_t)(z + 1) * nch / splits), xh, mh_sm, acc);
        mmh_store<MT>(acc, xrow, yrow, xs, r0, out, y + (size_t)z * T * out);
    }
}

/* x [T][in] fp32 -> fp16 rows scaled by 2^e (largest element below 2^14), then the T floats
 * 2^-e at mh_scale_off(T, in). One block per row. With u (the fused swiglu): the row is
 * mlacu_swiglu(x, u), as swiglu_kernel computes it, so the result is the same bits as swiglu then
 * act_h, without the fp32 row in between. */
__host__ __device__ inline size_t mh_scale_off(int64_t T, int64_t in) { return ((size_t)(T * in) * 2 + 15) / 16 * 16; }

__global__ void __launch_bounds__(256) act_h_kernel(const float *__restrict__ x, const float *__restrict__ u,
                                                    int64_t in, __half *__restrict__ xh, float *__restrict__ xs) {
    mlacu_pdl_enter();
    const int64_t t = blockIdx.x;
    const float4 *xr = (const float4 *)(x + t * in), *ur = u ? (const float4 *)(u + t * in) : nullptr;
    auto load = [&](int64_t i) {
        float4 v = xr[i];
        if (ur) {
            const float4 w = ur[i];
            v = make_float4(mlacu_swiglu(v.x, w.x), mlacu_swiglu(v.y, w.y), mlacu_swiglu(v.z, w.z),
                            mlacu_swiglu(v.w, w.w));
        }
        return v;
    };
    float m = 0.f;
    for (int64_t i = threadIdx.x; i < in / 4; i += 256) {
        const float4 v = load(i);
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    __shared__ float red[8];
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = red[0];
    for (int k = 1; k < 8; k++) m = fmaxf(m, red[k]);
    int e = 0;
    if (m > 0.f && m < INFINITY) { /* m < 2^k: 2^(14 - k) puts it below 2^14 */
        int k;
        frexpf(m, &k);
        e = max(-120, min(120, 14 - k));
    }
    const float s = ldexpf(1.f, e);
    __half2 *o = (__half2 *)(xh + t * in);
    for (int64_t i = threadIdx.x; i < in / 4; i += 256) {
        const float4 v = load(i);
        o[2 * i] = __floats2half2_rn(v.x * s, v.y * s);
        o[2 * i + 1] = __floats2half2_rn(v.z * s, v.w * s);
    }
    if (threadIdx.x == 0) xs[t] = ldexpf(1.f, -e);
}

/* The dynamic shared memory a kernel needs, allowed once per kernel (done: its flag). */
template <class K> static cudaError_t mh_allow(K kern, size_t bytes, bool &done) {
    if (done) return cudaSuccess;
    cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    done = err == cudaSuccess;
    return err;
}

static bool mh_al16(const void *w, size_t rb, size_t estride) {
    return ((uintptr_t)w & 15) == 0 && rb % 16 == 0 && estride % 16 == 0;
}

/* tiles of MT 16-token slices a warp, WGM x 4 warps; counts NULL: dense over T tokens, K in
 * `splits` chunk ranges (blockIdx.z) */
template <int TY, int MT, int WGM>
static cudaError_t launch_mmh_cfg(const void *w, size_t estride, int64_t in, int64_t out, const void *xh,
                                  int64_t x_rows, int64_t T, int x_div, const int32_t *sorted, const int32_t *counts,
                                  int world, unsigned gy, int splits, float *y, cudaStream_t s) {
    constexpr int BM = WGM * MT * 16;
    static bool allowed = false;
    cudaError_t err = mh_allow(mmh_kernel<TY, MT, WGM>, mh_smem<TY, BM>(), allowed);
    if (err != cudaSuccess) return err;
    const size_t rb = ggml_row_bytes(TY, in);
    dim3 grid((unsigned)((out + MH_BN - 1) / MH_BN), gy, (unsigned)splits);
    mlacu_launch(mmh_kernel<TY, MT, WGM>, grid, WGM * 128, mh_smem<TY, BM>(), s, (const uint8_t *)w, rb, estride,
                 mh_al16(w, rb, estride), (int)in, (int)out, (const __half *)xh,
                 (const float *)((const uint8_t *)xh + mh_scale_off(x_rows, in)), (int)T, x_div, sorted, counts, world,
                 splits, y);
    return cudaGetLastError();
}

/* Small steps (decode batches: T <= MH_SPLIT_TMAX, one tile of tokens) would give one block a 128
 * rows: too few for the GPU and each walks all of K. They split K instead, into enough chunk
 * ranges for about MH_SPLIT_BLOCKS blocks (a fixed count, so that every GPU sums alike), each
 * range at least two chunks; the partial products go to the workspace after the activations'
 * scales (mla_cuda_act_h_bytes counts it: < 2 MH_SPLIT_BLOCKS x 128 x T floats) and
 * mh_sum_kernel adds them in order. */
constexpr int MH_SPLIT_TMAX = 64, MH_SPLIT_BLOCKS = 512;

static size_t mh_ws_off(int64_t T, int64_t in) { return mh_scale_off(T, in) + ((size_t)T * 4 + 15) / 16 * 16; }
/* the workspace of every step of up to T tokens */
static size_t mh_ws_bytes(int64_t T) {
    return (size_t)2 * MH_SPLIT_BLOCKS * MH_BN * 4 * (size_t)std::min<int64_t>(T, MH_SPLIT_TMAX);
}
static int mh_splits(int64_t out, int64_t nch, int64_t T) {
    const int64_t rowb = (out + MH_BN - 1) / MH_BN;
    if (T > MH_SPLIT_TMAX || rowb >= MH_SPLIT_BLOCKS) return 1;
    const int64_t sp = std::min<int64_t>((MH_SPLIT_BLOCKS + rowb - 1) / rowb, std::max<int64_t>(1, nch / 2));
    MLA_ASSERT((size_t)sp * (size_t)out * (size_t)T * 4 <= mh_ws_bytes(T));
    return (int)sp;
}

/* y [n] = the sum of the `splits` partial products ws [z][n], z in order */
__global__ void __launch_bounds__(256) mh_sum_kernel(const float *__restrict__ ws, int splits, int64_t n,
                                                     float *__restrict__ y) {
    mlacu_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < n; i += (int64_t)gridDim.x * 256) {
        float v = ws[i];
        for (int z = 1; z < splits; z++) v += ws[(size_t)z * n + i];
        y[i] = v;
    }
}

/* Dense: up to MH_SPLIT_TMAX tokens, one tile of 32 or 64 (4 warps) over K's split ranges; more,
 * 128-token tiles (8 warps), or 64-token ones (4 warps) when those would leave SMs idle. */
template <int TY>
static cudaError_t launch_mmh(const void *w, int64_t in, int64_t out, const void *xh, int64_t T, float *y,
                              cudaStream_t s) {
    const int nsm = mlacu_sm_count();
    const int64_t rowb = (out + MH_BN - 1) / MH_BN;
    if (T <= MH_SPLIT_TMAX) {
        const int sp = mh_splits(out, in / mh_geo<TY>::CK, T);
        float *ws = (float *)((uint8_t *)xh + mh_ws_off(T, in)), *dst = sp > 1 ? ws : y;
        cudaError_t err =
            T <= 32 ? launch_mmh_cfg<TY, 2, 1>(w, 0, in, out, xh, T, T, 1, NULL, NULL, 1, 1, sp, dst, s)
                    : launch_mmh_cfg<TY, 4, 1>(w, 0, in, out, xh, T, T, 1, NULL, NULL, 1, 1, sp, dst, s);
        if (err != cudaSuccess || sp == 1) return err;
        const int64_t n = T * out;
        mlacu_launch(mh_sum_kernel, (unsigned)std::min<int64_t>((n + 255) / 256, 4 * nsm), 256, 0, s, ws, sp, n, y);
        return cudaGetLastError();
    }
    if (rowb * ((T + 127) / 128) < nsm)
        return launch_mmh_cfg<TY, 4, 1>(w, 0, in, out, xh, T, T, 1, NULL, NULL, 1, (unsigned)((T + 63) / 64), 1, y,
                                        s);
    return launch_mmh_cfg<TY, 4, 2>(w, 0, in, out, xh, T, T, 1, NULL, NULL, 1, (unsigned)((T + 127) / 128), 1, y, s);
}

/* ---------------------------------------------------------------- host dispatch */

template <int TY> static cudaError_t launch_dequant(const void *src, float *dst, int64_t n, cudaStream_t s) {
    int64_t nu = n / 32;
    if (nu == 0) return cudaSuccess;
    mlacu_launch(dequant_kernel<TY>, (unsigned)((nu + 255) / 256), 256, 0, s, (const uint8_t *)src, dst, nu);
    return cudaGetLastError();
}

template <int TY>
static cudaError_t launch_get_rows(const void *w, int64_t n, const int32_t *ids, int64_t T, float *out, cudaStream_t s) {
    int64_t units = n / 32;
    for (int64_t t0 = 0; t0 < T; t0 += 65535) {
        int64_t tn = T - t0 < 65535 ? T - t0 : 65535;
        dim3 grid((unsigned)((units + 127) / 128), (unsigned)tn);
        mlacu_launch(get_rows_kernel<TY>, grid, 128, 0, s, (const uint8_t *)w, ggml_row_bytes(TY, n), units, ids + t0,
                     out + t0 * n);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

template <int TY>
static cudaError_t launch_gemv(const void *w, int64_t in, int64_t out, const float *x, int64_t T, float *y,
                               cudaStream_t s, bool warp_variant) {
    static bool attr_set = false; /* per type; the max dynamic size is set once */
    size_t rb = ggml_row_bytes(TY, in);
    if (!attr_set) {
        cudaError_t err = cudaFuncSetAttribute(gemv_kernel<TY>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)gemv_smem<TY>(GV_TMAX));
        if (err != cudaSuccess) return err;
        attr_set = true;
    }
    if (warp_variant) {
        for (int64_t t0 = 0; t0 < T; t0 += G2_TMAX) {
            int tn = (int)(T - t0 < G2_TMAX ? T - t0 : G2_TMAX);
            mlacu_launch(gemv2_kernel<TY>, (unsigned)((out + G2_WARPS - 1) / G2_WARPS), G2_WARPS * 32, 0, s,
                         (const uint8_t *)w, rb, (int)in, (int)out, x + t0 * in, tn, y + t0 * out);
            cudaError_t err = cudaGetLastError();
            if (err != cudaSuccess) return err;
        }
        return cudaSuccess;
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

template <int TY, bool SPLIT = false>
static cudaError_t launch_mma(const void *w, int64_t in, int64_t out, const float *x, int64_t T, float *y,
                              cudaStream_t s) {
    size_t rb = ggml_row_bytes(TY, in);
    dim3 grid((unsigned)((out + MM_BN - 1) / MM_BN), (unsigned)((T + MM_BM - 1) / MM_BM));
    mlacu_launch(mma_kernel<TY, SPLIT>, grid, 256, 0, s, (const uint8_t *)w, rb, (int)in, (int)out, x, (int)T, y);
    return cudaGetLastError();
}

} // namespace mlacu

using namespace mlacu;

extern "C" bool mla_cuda_quant_supported(uint32_t t) {
    switch (t) {
#define MLACU_CASE(T_) case T_:
        MLACU_FOR_TYPES(MLACU_CASE)
#undef MLACU_CASE
        return true;
    default:
        return false;
    }
}

extern "C" size_t mla_cuda_weight_bytes(uint32_t t, int64_t n, int64_t rows) {
    size_t b = ggml_row_bytes(t, n) * (size_t)rows;
    return (b + 15) / 16 * 16;
}

extern "C" int mla_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int mla_cuda_init(int device, mla_err *e) {
    MLACU_CHECK(cudaSetDevice(device), e, "cudaSetDevice(%d)", device);
#define UP(dst, src) MLACU_CHECK(cudaMemcpyToSymbol(dst, src, sizeof(src)), e, "upload %s", #src)
    UP(g_iq2xxs_grid, quant_iq2xxs_grid);
    UP(g_iq2xs_grid, quant_iq2xs_grid);
    UP(g_iq2s_grid, quant_iq2s_grid);
    UP(g_iq3xxs_grid, quant_iq3xxs_grid);
    UP(g_iq3s_grid, quant_iq3s_grid);
    UP(g_iq1s_grid, quant_iq1s_grid);
    UP(g_ksigns, quant_ksigns);
    UP(g_kvalues_iq4nl, quant_kvalues_iq4nl);
#undef UP
    return MLA_OK;
}

static void check_shape(uint32_t t, int64_t in, int64_t out, int64_t T) {
    MLA_ASSERT(mla_cuda_quant_supported(t));
    MLA_ASSERT(in > 0 && in % 32 == 0 && in % ggml_type_get(t)->block_elems == 0 && in <= INT32_MAX);
    MLA_ASSERT(out > 0 && out <= INT32_MAX && T >= 0);
}

extern "C" int mla_cuda_dequant_row(uint32_t t, const void *d_src, float *d_dst, int64_t n, mla_cuda_stream stream,
                                    mla_err *e) {
    MLA_ASSERT(mla_cuda_quant_supported(t));
    MLA_ASSERT(n >= 0 && n % 32 == 0 && n % ggml_type_get(t)->block_elems == 0);
    cudaError_t err = cudaErrorInvalidValue;
    switch (t) {
#define MLACU_CASE(T_)                                                                                              \
    case T_:                                                                                                        \
        err = launch_dequant<T_>(d_src, d_dst, n, stream);                                                          \
        break;
        MLACU_FOR_TYPES(MLACU_CASE)
#undef MLACU_CASE
    }
    MLACU_CHECK(err, e, "dequant %s n=%lld", ggml_type_name(t), (long long)n);
    return MLA_OK;
}

extern "C" int mla_cuda_get_rows(uint32_t t, const void *d_w, int64_t n, const int32_t *d_ids, int64_t T,
                                 float *d_out, mla_cuda_stream stream, mla_err *e) {
    check_shape(t, n, 1, T);
    if (T == 0) return MLA_OK;
    cudaError_t err = cudaErrorInvalidValue;
    switch (t) {
#define MLACU_CASE(T_)                                                                                              \
    case T_:                                                                                                        \
        err = launch_get_rows<T_>(d_w, n, d_ids, T, d_out, stream);                                                 \
        break;
        MLACU_FOR_TYPES(MLACU_CASE)
#undef MLACU_CASE
    }
    MLACU_CHECK(err, e, "get_rows %s n=%lld T=%lld", ggml_type_name(t), (long long)n, (long long)T);
    return MLA_OK;
}

static int gemv_any(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x, int64_t T, float *d_y,
                    mla_cuda_stream stream, bool warp_variant, mla_err *e) {
    check_shape(t, in, out, T);
    if (T == 0) return MLA_OK;
    cudaError_t err = cudaErrorInvalidValue;
    switch (t) {
#define MLACU_CASE(T_)                                                                                              \
    case T_:                                                                                                        \
        err = !warp_variant && !i8traits<T_>::OK && ((uintptr_t)d_x & 15) == 0                                     \
                  ? launch_gemvf<(i8traits<T_>::OK ? GGML_TYPE_F32 : T_)>(d_w, in, out, d_x, T, d_y, stream)       \
                  : launch_gemv<T_>(d_w, in, out, d_x, T, d_y, stream, warp_variant);                              \
        break;
        MLACU_FOR_TYPES(MLACU_CASE)
#undef MLACU_CASE
    }
    MLACU_CHECK(err, e, "gemv %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out, (long long)in, (long long)T);
    return MLA_OK;
}

extern "C" int mla_cuda_matmul_gemv(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x, int64_t T,
                                    float *d_y, mla_cuda_stream stream, mla_err *e) {
    return gemv_any(t, d_w, in, out, d_x, T, d_y, stream, false, e);
}

extern "C" int mla_cuda_matmul_gemv_warp(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x,
                                         int64_t T, float *d_y, mla_cuda_stream stream, mla_err *e) {
    return gemv_any(t, d_w, in, out, d_x, T, d_y, stream, true, e);
}

extern "C" int mla_cuda_matmul_mma(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x, int64_t T,
                                   float *d_y, mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, T);
    if (T == 0) return MLA_OK;
    cudaError_t err = cudaErrorInvalidValue;
    switch (t) {
#define MLACU_CASE(T_)                                                                                              \
    case T_:                                                                                                        \
        err = launch_mma<T_>(d_w, in, out, d_x, T, d_y, stream);                                                    \
        break;
        MLACU_FOR_TYPES(MLACU_CASE)
#undef MLACU_CASE
    }
    MLACU_CHECK(err, e, "mma %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out, (long long)in, (long long)T);
    return MLA_OK;
}

extern "C" int mla_cuda_matmul_mma3(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x,
                                    int64_t T, float *d_y, mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, T);
    if (T == 0) return MLA_OK;
    cudaError_t err = cudaErrorInvalidValue;
    switch (t) {
#define MLACU_CASE(T_)                                                                                              \
    case T_:                                                                                                        \
        err = launch_mma<T_, true>(d_w, in, out, d_x, T, d_y, stream);                                              \
        break;
        MLACU_FOR_TYPES(MLACU_CASE)
#undef MLACU_CASE
    }
    MLACU_CHECK(err, e, "mma3 %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out, (long long)in, (long long)T);
    return MLA_OK;
}

extern "C" int mla_cuda_matmul_split(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x,
                                     int64_t T, float *d_y, mla_cuda_stream stream, mla_err *e) {
    /* H200, 7168 -> 2048: the GEMV wins up to T = 64 (258 us vs 633), mma3 from T = 256 (608 us
     * vs 1051); crossover near 150 by interpolation (bench/results/gpu-e2e-2026-11-29.md) */
    if (T <= 128) return mla_cuda_matmul_gemv(t, d_w, in, out, d_x, T, d_y, stream, e);
    return mla_cuda_matmul_mma3(t, d_w, in, out, d_x, T, d_y, stream, e);
}

extern "C" int mla_cuda_matmul(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x, int64_t T,
                               float *d_y, mla_cuda_stream stream, mla_err *e) {
    if (T <= GV_TMAX) return mla_cuda_matmul_gemv(t, d_w, in, out, d_x, T, d_y, stream, e);
    return mla_cuda_matmul_mma(t, d_w, in, out, d_x, T, d_y, stream, e);
}

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

/* ---------------------------------------------------------------- integer GEMV API */

/* f(std::integral_constant<int, T>{}) for the quantized type t (the types with an integer form);
 * cudaErrorInvalidValue for any other. */
template <class F> static cudaError_t with_q8_type(uint32_t t, F &&f) {
    switch (t) {
#define MLACU_CASE(T_)                                                                                              \
    case T_:                                                                                                        \
        if constexpr (i8traits<T_>::OK) return f(std::integral_constant<int, T_>{});                                \
        break;
        MLACU_FOR_TYPES(MLACU_CASE)
#undef MLACU_CASE
    }
    return cudaErrorInvalidValue;
}

/* mla_cuda_set_gemv_stream: the streamed GEMV for dense steps of up to g_gs_dense tokens and
 * for the experts of steps of up to g_gs_grouped tokens (0: never; MLA_CUDA_GEMVS_SINGLES: one) */
static int g_gs_dense = MLA_CUDA_GEMVS_DENSE, g_gs_grouped = MLA_CUDA_GEMVS_GROUPED;
extern "C" void mla_cuda_set_gemv_stream(int dense_tmax, int grouped_tmax) {
    MLA_ASSERT(dense_tmax >= 0 && dense_tmax <= MLACU_MOE_TILE && grouped_tmax >= MLA_CUDA_GEMVS_SINGLES);
    g_gs_dense = dense_tmax;
    g_gs_grouped = grouped_tmax;
}
extern "C" void mla_cuda_set_gemv_ws(int on) { gemvs_set_ws(on != 0); }
/* mla_cuda_set_gemv_mma: the streamed tensor-core GEMV for dense steps of g_gm_min .. g_gm_max tokens */
static int g_gm_min = MLA_CUDA_GEMVM_TMIN, g_gm_max = MLA_CUDA_GEMVM_TMAX;
extern "C" void mla_cuda_set_gemv_mma(int tmin, int tmax) {
    MLA_ASSERT(tmin >= 2 && tmax >= 0 && tmax <= MLACU_MOE_TILE);
    g_gm_min = tmin, g_gm_max = tmax;
}
/* whether a dense step of T tokens over nm matrices of type t takes it */
static bool gm_takes(uint32_t t, int64_t in, int nm, int64_t T) {
    return T >= g_gm_min && T <= g_gm_max && gemvm_supported(t, in, nm);
}
extern "C" void mla_cuda_set_gemv_trace(unsigned long long *d_stamps) { gemvs_set_trace(d_stamps); }
static bool gs_grouped_on(const mla_cuda_moe_plan *pl) {
    return pl->tokens <= (g_gs_grouped == MLA_CUDA_GEMVS_SINGLES ? 1 : g_gs_grouped);
}

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

extern "C" int mla_cuda_matmul_q8(uint32_t t, const void *d_w, int64_t in, int64_t out, const void *d_q8, int64_t T,
                                  float *d_y, mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, T);
    MLA_ASSERT(mla_cuda_q8_supported(t) && ((uintptr_t)d_w & 15) == 0);
    if (T == 0) return MLA_OK;
    if (gm_takes(t, in, 1, T)) {
        cudaError_t err = gemvm_dense(t, d_w, NULL, in, out, d_q8, (const uint8_t *)d_q8 + mlacu_q8_scale_off(T, in), T,
                                      d_y, (cudaStream_t)stream);
        MLACU_CHECK(err, e, "gemv q8 (tensor cores) %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out,
                    (long long)in, (long long)T);
        return MLA_OK;
    }
    if (T <= g_gs_dense && gemvs_supported(t, in, 1)) {
        cudaError_t err = gemvs_dense(t, d_w, NULL, in, out, d_q8, (const uint8_t *)d_q8 + mlacu_q8_scale_off(T, in), T,
                                      d_y, NULL, NULL, (cudaStream_t)stream);
        MLACU_CHECK(err, e, "gemv q8 (streamed) %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out,
                    (long long)in, (long long)T);
        return MLA_OK;
    }
    cudaError_t err = with_q8_type(t, [&](auto ty) {
        return launch_gemvq<decltype(ty)::value>(d_w, in, out, d_q8, T, d_y, (cudaStream_t)stream);
    });
    MLACU_CHECK(err, e, "gemv q8 %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out, (long long)in, (long long)T);
    return MLA_OK;
}

extern "C" int mla_cuda_matmul_q8_swiglu(uint32_t t, const void *d_wg, const void *d_wu, int64_t in, int64_t out,
                                         const void *d_q8, int64_t T, float *d_y, float *d_u, void *d_yq,
                                         mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, T);
    MLA_ASSERT(mla_cuda_q8_supported(t) && ((uintptr_t)d_wg & 15) == 0 && ((uintptr_t)d_wu & 15) == 0);
    MLA_ASSERT(!d_yq || (out % 32 == 0 && ((uintptr_t)d_yq & 15) == 0));
    if (T == 0) return MLA_OK;
    bool yq_done = false;
    if (gm_takes(t, in, 2, T)) {
        cudaError_t err = gemvm_dense(t, d_wg, d_wu, in, out, d_q8, (const uint8_t *)d_q8 + mlacu_q8_scale_off(T, in),
                                      T, d_y, (cudaStream_t)stream);
        MLACU_CHECK(err, e, "gemv q8 gate+up (tensor cores) %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out,
                    (long long)in, (long long)T);
    } else if (T <= g_gs_dense && gemvs_supported(t, in, 2)) {
        cudaError_t err = gemvs_dense(t, d_wg, d_wu, in, out, d_q8, (const uint8_t *)d_q8 + mlacu_q8_scale_off(T, in),
                                      T, d_y, d_yq, &yq_done, (cudaStream_t)stream);
        MLACU_CHECK(err, e, "gemv q8 gate+up (streamed) %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out,
                    (long long)in, (long long)T);
    } else if (mla_cuda_matmul_q8(t, d_wg, in, out, d_q8, T, d_y, stream, e) ||
               mla_cuda_matmul_q8(t, d_wu, in, out, d_q8, T, d_u, stream, e) ||
               mla_cuda_swiglu(d_y, d_u, d_y, T * out, stream, e))
        return MLA_ERR;
    return d_yq && !yq_done ? mla_cuda_quantize_q8(d_y, T, out, d_yq, stream, e) : MLA_OK;
}

extern "C" int mla_cuda_matmul_q8_pair(uint32_t t, const void *d_wa, int64_t out_a, float *d_ya, const void *d_wb,
                                       int64_t out_b, float *d_yb, int64_t in, const void *d_q8, int64_t T,
                                       mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out_a, T);
    check_shape(t, in, out_b, T);
    MLA_ASSERT(mla_cuda_q8_supported(t) && ((uintptr_t)d_wa & 15) == 0 && ((uintptr_t)d_wb & 15) == 0);
    if (T == 0) return MLA_OK;
    if (gm_takes(t, in, 1, T)) {
        cudaError_t err = gemvm_dense_pair(t, d_wa, out_a, d_ya, d_wb, out_b, d_yb, in, d_q8,
                                           (const uint8_t *)d_q8 + mlacu_q8_scale_off(T, in), T, (cudaStream_t)stream);
        MLACU_CHECK(err, e, "gemv q8 pair (tensor cores) %s %lld+%lldx%lld T=%lld", ggml_type_name(t),
                    (long long)out_a, (long long)out_b, (long long)in, (long long)T);
        return MLA_OK;
    }
    if (T <= g_gs_dense && gemvs_supported(t, in, 1)) {
        cudaError_t err = gemvs_dense_pair(t, d_wa, out_a, d_ya, d_wb, out_b, d_yb, in, d_q8,
                                           (const uint8_t *)d_q8 + mlacu_q8_scale_off(T, in), T, (cudaStream_t)stream);
        MLACU_CHECK(err, e, "gemv q8 pair (streamed) %s %lld+%lldx%lld T=%lld", ggml_type_name(t), (long long)out_a,
                    (long long)out_b, (long long)in, (long long)T);
        return MLA_OK;
    }
    if (mla_cuda_matmul_q8(t, d_wa, in, out_a, d_q8, T, d_ya, stream, e)) return MLA_ERR;
    return mla_cuda_matmul_q8(t, d_wb, in, out_b, d_q8, T, d_yb, stream, e);
}

extern "C" int mla_cuda_matmul_grouped_q8(uint32_t t, const void *d_w0, const void *d_w1, size_t estride,
                                          int64_t in, int64_t out, const void *d_q8, int64_t x_rows, int x_div,
                                          const mla_cuda_moe_plan *plan, float *d_y, void *d_yq, mla_cuda_stream stream,
                                          mla_err *e) {
    check_shape(t, in, out, 1);
    MLA_ASSERT(mla_cuda_q8_supported(t) && x_div >= 1 && plan && plan->world >= 1);
    MLA_ASSERT(!d_yq || (out % 32 == 0 && ((uintptr_t)d_yq & 15) == 0));
    MLA_ASSERT(((uintptr_t)d_w0 & 15) == 0 && ((uintptr_t)d_w1 & 15) == 0);
    if (plan->max_tiles <= 0) return MLA_OK;
    cudaStream_t s = (cudaStream_t)stream;
    const void *sx = (const uint8_t *)d_q8 + mlacu_q8_scale_off(x_rows, in);
    /* the streamed GEMV: every tile (plans of up to g_gs_grouped tokens; by default one), or, by
     * default, the tiles of one pair (the per-warp GEMV then takes the others) */
    const bool gs = gemvs_supported(t, in, d_w1 ? 2 : 1), all = gs && gs_grouped_on(plan);
    const bool singles = gs && !all && g_gs_grouped == MLA_CUDA_GEMVS_SINGLES;
    const int64_t y_rows = x_rows * x_div;
    bool yq_done = false;
    if (all || singles) {
        cudaError_t err = gemvs_grouped(t, d_w0, d_w1, estride, in, out, d_q8, sx, x_div, plan, singles, d_y, d_yq,
                                        y_rows, &yq_done, s);
        MLACU_CHECK(err, e, "grouped gemv q8 (streamed) %s %lldx%lld", ggml_type_name(t), (long long)out,
                    (long long)in);
    }
    if (!all) {
        cudaError_t err = with_q8_type(t, [&](auto ty) {
            constexpr int TY = decltype(ty)::value;
            return d_w1 ? launch_grpq<TY, true>(d_w0, d_w1, estride, in, out, d_q8, x_rows, x_div, plan, d_y,
                                                singles, s)
                        : launch_grpq<TY, false>(d_w0, NULL, estride, in, out, d_q8, x_rows, x_div, plan, d_y,
                                                 singles, s);
        });
        MLACU_CHECK(err, e, "grouped gemv q8 %s %lldx%lld", ggml_type_name(t), (long long)out, (long long)in);
    }
    return d_yq && !yq_done ? mla_cuda_quantize_q8(d_y, y_rows, out, d_yq, stream, e) : MLA_OK;
}

extern "C" int mla_cuda_matmul_q8_mma(uint32_t t, const void *d_w, int64_t in, int64_t out, const void *d_q8, int64_t T,
                                      float *d_y, mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, T);
    MLA_ASSERT(mla_cuda_q8_supported(t) && ((uintptr_t)d_w & 15) == 0 && T < 65535 * (int64_t)IM_BM);
    if (T == 0) return MLA_OK;
    cudaError_t err = with_q8_type(t, [&](auto ty) {
        return launch_mmaq<decltype(ty)::value>(d_w, in, out, d_q8, T, d_y, (cudaStream_t)stream);
    });
    MLACU_CHECK(err, e, "mma q8 %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out, (long long)in, (long long)T);
    return MLA_OK;
}

extern "C" int mla_cuda_matmul_grouped_q8_mma(uint32_t t, const void *d_w, size_t estride, int64_t in, int64_t out,
                                              const void *d_q8, int64_t x_rows, int x_div,
                                              const mla_cuda_moe_plan *plan, int64_t n_expert, float *d_y,
                                              mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, 1);
    MLA_ASSERT(mla_cuda_q8_supported(t) && x_div >= 1 && plan && plan->world >= 1 && n_expert >= 1 &&
               n_expert <= 65535 && ((uintptr_t)d_w & 15) == 0);
    cudaError_t err = with_q8_type(t, [&](auto ty) {
        return launch_mmaq_grp<decltype(ty)::value>(d_w, estride, in, out, d_q8, x_rows, x_div, plan, n_expert, d_y,
                                                    (cudaStream_t)stream);
    });
    MLACU_CHECK(err, e, "grouped mma q8 %s %lldx%lld", ggml_type_name(t), (long long)out, (long long)in);
    return MLA_OK;
}

/* ---------------------------------------------------------------- fp16 tensor-core API */

extern "C" bool mla_cuda_mmh_supported(uint32_t t, int64_t in) {
    /* whole raw chunks (mh_geo::CK): a quant block, at least 128 elements */
    const int64_t ck = ggml_type_get(t)->block_elems > 2 * MH_BK ? ggml_type_get(t)->block_elems : 2 * MH_BK;
    return mla_cuda_q8_supported(t) && in > 0 && in % ck == 0;
}

extern "C" size_t mla_cuda_act_h_bytes(int64_t T, int64_t in) {
    MLA_ASSERT(T >= 0 && in >= 0);
    return mh_ws_off(T, in) + mh_ws_bytes(T);
}

static int act_h_launch(const float *d_x, const float *d_u, int64_t T, int64_t in, void *d_xh, mla_cuda_stream stream,
                        mla_err *e) {
    MLA_ASSERT(T >= 0 && T <= INT32_MAX && in > 0 && in % 4 == 0 && ((uintptr_t)d_x & 15) == 0 &&
               ((uintptr_t)d_u & 15) == 0 && ((uintptr_t)d_xh & 15) == 0);
    if (T == 0) return MLA_OK;
    mlacu_launch(act_h_kernel, (unsigned)T, 256, 0, (cudaStream_t)stream, d_x, d_u, in, (__half *)d_xh,
                 (float *)((uint8_t *)d_xh + mh_scale_off(T, in)));
    MLACU_CHECK(cudaGetLastError(), e, "act_h%s T=%lld in=%lld", d_u ? " (swiglu)" : "", (long long)T, (long long)in);
    return MLA_OK;
}

extern "C" int mla_cuda_act_h(const float *d_x, int64_t T, int64_t in, void *d_xh, mla_cuda_stream stream,
                              mla_err *e) {
    return act_h_launch(d_x, NULL, T, in, d_xh, stream, e);
}

extern "C" int mla_cuda_swiglu_h(const float *d_g, const float *d_u, int64_t T, int64_t in, void *d_xh,
                                 mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(d_u);
    return act_h_launch(d_g, d_u, T, in, d_xh, stream, e);
}

extern "C" int mla_cuda_matmul_h(uint32_t t, const void *d_w, int64_t in, int64_t out, const void *d_xh, int64_t T,
                                 float *d_y, mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, T);
    MLA_ASSERT(mla_cuda_mmh_supported(t, in) && ((uintptr_t)d_xh & 15) == 0 && (T + 127) / 128 <= 65535);
    if (T == 0) return MLA_OK;
#ifdef MLA_CUDA_WGMMA
    if (T > MH_SPLIT_TMAX && mlacu_wg_usable(t, in, out, T, d_w, 0)) { /* prompts: the warpgroup kernel */
        cudaError_t err = mlacu_wg_q4k(d_w, 0, in, out, (const __half *)d_xh,
                                       (const float *)((const uint8_t *)d_xh + mh_scale_off(T, in)), T, 1, NULL, NULL,
                                       1, 0, T, d_y, (cudaStream_t)stream);
        MLACU_CHECK(err, e, "wgmma f16 %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out, (long long)in,
                    (long long)T);
        return MLA_OK;
    }
#endif
    cudaError_t err = with_q8_type(t, [&](auto ty) {
        return launch_mmh<decltype(ty)::value>(d_w, in, out, d_xh, T, d_y, (cudaStream_t)stream);
    });
    MLACU_CHECK(err, e, "mma f16 %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out, (long long)in, (long long)T);
    return MLA_OK;
}

extern "C" int mla_cuda_matmul_grouped_h(uint32_t t, const void *d_w, size_t estride, int64_t in, int64_t out,
                                         const void *d_xh, int64_t x_rows, int x_div, const mla_cuda_moe_plan *plan,
                                         int64_t n_expert, int bm, float *d_y, mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, 1);
    MLA_ASSERT(mla_cuda_mmh_supported(t, in) && x_div >= 1 && plan && plan->world >= 1 && n_expert >= 1 &&
               n_expert <= 65535 && ((uintptr_t)d_xh & 15) == 0 && (bm == 32 || bm == 64));
#ifdef MLA_CUDA_WGMMA
    if (mlacu_wg_usable(t, in, out, x_rows, d_w, estride)) {
        cudaError_t err = mlacu_wg_q4k(d_w, estride, in, out, (const __half *)d_xh,
                                       (const float *)((const uint8_t *)d_xh + mh_scale_off(x_rows, in)), 0, x_div,
                                       plan->sorted, plan->counts, plan->world, (unsigned)n_expert,
                                       x_rows * x_div, d_y, (cudaStream_t)stream);
        MLACU_CHECK(err, e, "grouped wgmma f16 %s %lldx%lld", ggml_type_name(t), (long long)out, (long long)in);
        return MLA_OK;
    }
#endif
    cudaError_t err = with_q8_type(t, [&](auto ty) {
        constexpr int TY = decltype(ty)::value;
        cudaStream_t s = (cudaStream_t)stream;
        const unsigned gy = (unsigned)n_expert;
        return bm == 32 ? launch_mmh_cfg<TY, 2, 1>(d_w, estride, in, out, d_xh, x_rows, 0, x_div, plan->sorted,
                                                   plan->counts, plan->world, gy, 1, d_y, s)
                        : launch_mmh_cfg<TY, 4, 1>(d_w, estride, in, out, d_xh, x_rows, 0, x_div, plan->sorted,
                                                   plan->counts, plan->world, gy, 1, d_y, s);
    });
    MLACU_CHECK(err, e, "grouped mma f16 %s %lldx%lld", ggml_type_name(t), (long long)out, (long long)in);
    return MLA_OK;
}
