/* mm_mmh_cuda: fp16 activations x integer-form weights on the fp16 tensor cores (mma.sync, and
 * on sm_90 the warpgroup kernel of wgmma_cuda.cu for Q4_K, Q8_0 and Q5_0 prompts), dense and grouped
 * over a MoE plan, and the fp16 rounding of the activations (act_h_kernel). API: kernels/cuda_ops.h
 * (mla_cuda_matmul_h, mla_cuda_matmul_grouped_h, mla_cuda_act_h); chosen by mm_choose_cuda.cu. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/mm_cuda.h"
#include "kernels/rmsnorm_row_cuda.h"
#ifdef MLA_CUDA_WGMMA
#include "kernels/wgmma_cuda.h"
#endif

namespace mlacu {

MLACU_GRIDS_TU();

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

/* x [T][in] fp32 -> fp16 rows scaled by 2^e (mlacu_h16_exp), then the T floats 2^-e at
 * mh_scale_off(T, in). One block per row. With u (the fused swiglu): the row is
 * mlacu_swiglu(x, u), as swiglu_kernel computes it, so the result is the same bits as swiglu then
 * act_h, without the fp32 row in between. */
__host__ __device__ inline size_t mh_scale_off(int64_t T, int64_t in) { return mlacu_h16_scale_off(T, in); }

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
    __shared__ float red[32];
    const int e = mlacu_h16_exp(mlacu_rn::block_max(m, red));
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
    cudaError_t err = mlacu_smem_allow(kern, (int)bytes);
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
    /* 128-token tiles where they fit in what a block may have: types of long raw rows (Q5_K, Q6_K:
     * 103-109 KB a block) take 64-token tiles within sm_120's 99 KB (docs/sm120.md) */
    if (rowb * ((T + 127) / 128) < nsm || mh_smem<TY, 128>() > (size_t)mlacu_smem_optin())
        return launch_mmh_cfg<TY, 4, 1>(w, 0, in, out, xh, T, T, 1, NULL, NULL, 1, (unsigned)((T + 63) / 64), 1, y,
                                        s);
    return launch_mmh_cfg<TY, 4, 2>(w, 0, in, out, xh, T, T, 1, NULL, NULL, 1, (unsigned)((T + 127) / 128), 1, y, s);
}

} // namespace mlacu

using namespace mlacu;

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
        cudaError_t err = mlacu_wg_matmul(t, d_w, 0, in, out, (const __half *)d_xh,
                                          (const float *)((const uint8_t *)d_xh + mh_scale_off(T, in)), T, 1, NULL,
                                          NULL, 1, 0, T, d_y, (cudaStream_t)stream);
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
        cudaError_t err = mlacu_wg_matmul(t, d_w, estride, in, out, (const __half *)d_xh,
                                          (const float *)((const uint8_t *)d_xh + mh_scale_off(x_rows, in)), 0,
                                          x_div, plan->sorted, plan->counts, plan->world, (unsigned)n_expert,
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
