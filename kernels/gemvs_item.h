/* gemvs_item: the item arithmetic of the streamed one-token GEMV (kernels/gemvs_cuda.cu): an
 * item is 128 elements of a row (half a Q4_K or Q6_K block, four Q8_0 blocks) dotted with a
 * thread's activations in the q8 layout of mm_gemvq_cuda.cu. Host and device: the host build
 * (tests/gpu/test_cuda_quant_host.cu, in CI) checks it against the CPU dequantization. CUDA C++,
 * internal to kernels/. */
#ifndef GEMVS_ITEM_H
#define GEMVS_ITEM_H

#include <math.h>
#include <string.h>

#include "kernels/cuda_quant_unit.h"

namespace mlacu {

/* a T from p (device: a load of T's alignment, p must have it; host: memcpy) */
template <typename T> __host__ __device__ __forceinline__ T gs_ld(const uint8_t *p) {
#ifdef __CUDA_ARCH__
    return *(const T *)p;
#else
    T v;
    memcpy(&v, p, sizeof v);
    return v;
#endif
}
/* a read-only global load (device: through the non-coherent cache) */
template <typename T> __host__ __device__ __forceinline__ T gs_ldg(const T *p) {
#ifdef __CUDA_ARCH__
    return __ldg(p);
#else
    return *p;
#endif
}
/* the low word of (hi:lo) >> sh, sh in 0..31 */
__host__ __device__ __forceinline__ uint32_t gs_shr(uint32_t lo, uint32_t hi, uint32_t sh) {
#ifdef __CUDA_ARCH__
    return __funnelshift_r(lo, hi, sh);
#else
    return (uint32_t)((((uint64_t)hi << 32) | lo) >> (sh & 31));
#endif
}

/* c + the dot of the four bytes of a (unsigned, GS_DPU) or signed with the signed bytes of b */
template <bool UA> __host__ __device__ __forceinline__ int gs_dp4a(uint32_t a, uint32_t b, int c) {
#ifdef __CUDA_ARCH__
    int d;
    if (UA) asm("dp4a.u32.s32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    else d = __dp4a((int)a, (int)b, c);
    return d;
#else
    for (int i = 0; i < 4; i++) {
        const int ai = UA ? (int)((a >> (8 * i)) & 0xFF) : (int)(int8_t)(a >> (8 * i));
        c += ai * (int)(int8_t)(b >> (8 * i));
    }
    return c;
#endif
}
__host__ __device__ __forceinline__ int gs_dpu(uint32_t a, uint32_t b, int c) { return gs_dp4a<true>(a, b, c); }
/* 4 words of unsigned quants masked by m . 16 signed activations */
__host__ __device__ __forceinline__ int gs_dp4m(const uint32_t *w, uint32_t m, uint4 x) {
    int s = gs_dpu(w[0] & m, x.x, 0);
    s = gs_dpu(w[1] & m, x.y, s);
    s = gs_dpu(w[2] & m, x.z, s);
    return gs_dpu(w[3] & m, x.w, s);
}
__host__ __device__ __forceinline__ int gs_dp4(const uint32_t *w, uint4 x) {
    int s = gs_dp4a<false>(w[0], x.x, 0);
    s = gs_dp4a<false>(w[1], x.y, s);
    s = gs_dp4a<false>(w[2], x.z, s);
    return gs_dp4a<false>(w[3], x.w, s);
}

/* N little-endian words from p, 2-aligned shared memory: N + 1 aligned loads and funnel shifts
 * (reads up to 4 bytes past the N words: the stage buffers keep 16 spare bytes) */
template <int N> __host__ __device__ __forceinline__ void gs_words(const uint8_t *p, uint32_t *w) {
    const uint8_t *a = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)3);
    const uint32_t sh = ((uint32_t)(uintptr_t)p & 3u) * 8u;
    uint32_t v[N + 1];
    MLACU_UNROLL
    for (int i = 0; i <= N; i++) v[i] = gs_ld<uint32_t>(a + 4 * i);
    MLACU_UNROLL
    for (int i = 0; i < N; i++) w[i] = gs_shr(v[i], v[i + 1], sh);
}

/* the 4 bits of b at bit 4 of each byte (bit i to byte i) */
__host__ __device__ __forceinline__ uint32_t gs_bits4(uint32_t b) { return ((b * 0x00204081u) & 0x01010101u) << 4; }

/* Q5_0 block b (d, qh, qs: 22 bytes, 2-aligned): its elements 8 t .. 8 t + 7 (t = 0 .. 3), the
 * quants less 16 as signed bytes, w[0] the first four: the low (t < 2) or high nibbles of
 * qs[8 (t & 1) ..], their fifth bits from byte t of qh (the int8 A fragment of the tensor-core
 * GEMV, kernels/gemvm_cuda.cu; reads as gs_words) */
__host__ __device__ __forceinline__ void gs_q5_0_bytes8(const uint8_t *b, int t, uint32_t (&w)[2]) {
    uint32_t q[2], h;
    gs_words<2>(b + 6 + 8 * (t & 1), q);
    gs_words<1>(b + 2, &h);
    const uint32_t hb = h >> (8 * t);
    MLACU_UNROLL
    for (int j = 0; j < 2; j++) {
        const uint32_t v = ((q[j] >> (4 * (t >> 1))) & 0x0F0F0F0Fu) | gs_bits4((hb >> (4 * j)) & 0xFu);
        const uint32_t s = v ^ 0x10101010u; /* v - 16 a byte: bit 4 flipped, bits 5-7 set where it was clear */
        w[j] = s | (((s >> 4) & 0x01010101u) * 0xE0u);
    }
}

/* 2 N little-endian words from p (8-aligned: N 8-byte loads) */
template <int N> __host__ __device__ __forceinline__ void gs_words8(const uint8_t *p, uint32_t *w) {
    MLACU_UNROLL
    for (int i = 0; i < N; i++) {
        const uint2 v = gs_ld<uint2>(p + 8 * i);
        w[2 * i] = v.x, w[2 * i + 1] = v.y;
    }
}

/* An item is 128 elements of a row: Q4_K: half a block (it / 2, sub-blocks 4 (it % 2) .. + 3);
 * Q6_K: half n = it % 2 of block it / 2; Q8_0, Q5_0: blocks 4 it .. 4 it + 3. A thread's
 * activations for it: the int8 of its four 32-element units (x[2 i], x[2 i + 1]: unit i's halves)
 * and per unit f[i] = d, and g: Q4_K, Q5_0 g[i] = d * sum of the unit's q; Q6_K g[2 i], g[2 i + 1]
 * = d * the sum of each half's q. */
template <int TY> struct gs_x {
    uint4 x[8];
    float f[4], g[TY == GGML_TYPE_Q6_K ? 8 : TY == GGML_TYPE_Q4_K || TY == GGML_TYPE_Q5_0 ? 4 : 1];
};

/* xo: the activation row's first unit */
template <int TY>
__host__ __device__ __forceinline__ void gs_load_x(const uint4 *__restrict__ qx, const float4 *__restrict__ sx,
                                                   size_t xo, int it, gs_x<TY> &x) {
    const size_t u0 = xo + (size_t)it * 4;
MLACU_UNROLL
    for (int i = 0; i < 4; i++) {
        x.x[2 * i] = gs_ldg(qx + 2 * (u0 + i));
        x.x[2 * i + 1] = gs_ldg(qx + 2 * (u0 + i) + 1);
        const float4 s = gs_ldg(sx + u0 + i);
        x.f[i] = s.x;
        if constexpr (TY == GGML_TYPE_Q4_K || TY == GGML_TYPE_Q5_0) x.g[i] = s.y + s.z;
        if constexpr (TY == GGML_TYPE_Q6_K) x.g[2 * i] = s.y, x.g[2 * i + 1] = s.z;
    }
}

/* a b, a b + c, a + b, each rounded once as written (device: never contracted with a neighbour, so
 * that every kernel inlining gs_dot gets the same bits whatever the compiler fuses around it) */
__host__ __device__ __forceinline__ float gs_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
__host__ __device__ __forceinline__ float gs_fma(float a, float b, float c) {
#ifdef __CUDA_ARCH__
    return __fmaf_rn(a, b, c);
#else
    return fmaf(a, b, c);
#endif
}
__host__ __device__ __forceinline__ float gs_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

/* item it of the row at rp (device: shared memory; Q4_K rows 16-aligned, Q8_0 / Q5_0 rows 8-aligned) . x */
template <int TY> __host__ __device__ __forceinline__ float gs_dot(const uint8_t *rp, int it, const gs_x<TY> &x) {
    if constexpr (TY == GGML_TYPE_Q4_K) {
        /* sub-blocks 4 hb + i: i = 0, 1 the low / high nibbles of qs[64 hb ..], i = 2, 3 of
         * qs[64 hb + 32 ..]; their 6-bit scales and minima as bytes of SC and MN (hb = 0: bytes 0-3 / 4-7 of the
         * scales; hb = 1: the low / high nibbles of bytes 8-11 with bits 6-7 of bytes 0-3 / 4-7) */
        const uint8_t *b = rp + (size_t)(it >> 1) * 144;
        const int hb = it & 1;
        const uint4 hv = gs_ld<uint4>(b);
        const uint8_t *qp = b + 16 + 64 * hb;
        uint32_t w[16];
MLACU_UNROLL
        for (int i = 0; i < 4; i++) {
            const uint4 v = gs_ld<uint4>(qp + 16 * i);
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
        const uint32_t SC = hb ? (hv.w & 0x0F0F0F0Fu) | ((hv.y >> 2) & 0x30303030u) : hv.y & 0x3F3F3F3Fu;
        const uint32_t MN = hb ? ((hv.w >> 4) & 0x0F0F0F0Fu) | ((hv.z >> 2) & 0x30303030u) : hv.z & 0x3F3F3F3Fu;
        const float d = h2f(hv.x & 0xFFFF), dmin = h2f(hv.x >> 16);
        float acc = 0.f, mins = 0.f;
MLACU_UNROLL
        for (int i = 0; i < 4; i++) {
            const uint32_t *wi = w + 8 * (i >> 1);
            const uint32_t m = (i & 1) ? 0xF0F0F0F0u : 0x0F0F0F0Fu;
            const int dot = gs_dp4m(wi, m, x.x[2 * i]) + gs_dp4m(wi + 4, m, x.x[2 * i + 1]);
            const float sc = gs_mul((float)((SC >> (8 * i)) & 0xFF), (i & 1) ? 0.0625f : 1.f); /* high nibbles: x16 */
            acc = gs_fma(gs_mul(sc, x.f[i]), (float)dot, acc);
            mins = gs_fma((float)((MN >> (8 * i)) & 0xFF), x.g[i], mins);
        }
        return gs_fma(d, acc, -gs_mul(dmin, mins));
    } else if constexpr (TY == GGML_TYPE_Q6_K) {
        const uint8_t *b = rp + (size_t)(it >> 1) * 210;
        const int n = it & 1;
        uint32_t l[16], h[8], sc[2];
        gs_words<16>(b + 64 * n, l);
        gs_words<8>(b + 128 + 32 * n, h);
        gs_words<2>(b + 192 + 8 * n, sc);
        const float d = h2f(gs_ld<uint16_t>(b + 208));
        float acc = 0.f;
MLACU_UNROLL
        for (int k = 0; k < 4; k++) { /* unit k: nibbles (k >> 1) of ql[32 (k & 1) ..], bits 2k, 2k + 1 of qh */
            uint32_t q[8];
MLACU_UNROLL
            for (int i = 0; i < 8; i++) {
                const uint32_t hi = k < 2 ? (h[i] << (4 - 2 * k)) : (h[i] >> (2 * k - 4));
                q[i] = ((l[8 * (k & 1) + i] >> (4 * (k >> 1))) & 0x0F0F0F0Fu) | (hi & 0x30303030u);
            }
            const uint32_t s2 = sc[k >> 1] >> (16 * (k & 1));
            const float c0 = (float)(int8_t)(s2 & 0xFF), c1 = (float)(int8_t)((s2 >> 8) & 0xFF);
            const float u0 = gs_fma(x.f[k], (float)gs_dp4(q, x.x[2 * k]), -gs_mul(32.f, x.g[2 * k]));
            const float u1 = gs_fma(x.f[k], (float)gs_dp4(q + 4, x.x[2 * k + 1]), -gs_mul(32.f, x.g[2 * k + 1]));
            acc = gs_add(acc, gs_fma(c0, u0, gs_mul(c1, u1)));
        }
        return gs_mul(d, acc);
    } else if constexpr (TY == GGML_TYPE_Q5_0) {
        /* 88 bytes from an 8-aligned start: blocks of 22 at 0, 22, 44, 66 (d, then qh: 4 bytes,
         * then qs: 16); element j < 16 is qs[j]'s low nibble with bit j of qh, j + 16 the high
         * nibble with bit j + 16: q + 16 dotted unsigned, the 16 through the unit's sum */
        uint32_t w[23];
        gs_words8<11>(rp + (size_t)it * 88, w);
        w[22] = 0;
        auto at = [&](int o) { return o % 4 ? gs_shr(w[o / 4], w[o / 4 + 1], 8 * (o % 4)) : w[o / 4]; };
        float acc = 0.f;
MLACU_UNROLL
        for (int q = 0; q < 4; q++) {
            const int o = 22 * q;
            const uint32_t qh = at(o + 2);
            int dot = 0;
MLACU_UNROLL
            for (int i = 0; i < 4; i++) {
                const uint32_t qs = at(o + 6 + 4 * i);
                const uint32_t *xl = &x.x[2 * q].x, *xh = &x.x[2 * q + 1].x;
                dot = gs_dpu((qs & 0x0F0F0F0Fu) | gs_bits4((qh >> (4 * i)) & 0xF), xl[i], dot);
                dot = gs_dpu(((qs >> 4) & 0x0F0F0F0Fu) | gs_bits4((qh >> (16 + 4 * i)) & 0xF), xh[i], dot);
            }
            const float d = h2f(at(o) & 0xFFFF);
            acc = gs_fma(d, gs_fma(x.f[q], (float)dot, -gs_mul(16.f, x.g[q])), acc);
        }
        return acc;
    } else {
        /* 136 bytes from an 8-aligned start: blocks at 0, 34, 68, 102; their quants at 2 (funnel), 36,
         * 70 (funnel), 104 */
        uint32_t w[34];
        gs_words8<17>(rp + (size_t)it * 136, w);
        float acc = 0.f;
MLACU_UNROLL
        for (int q = 0; q < 4; q++) {
            uint32_t qs[8];
            const int w0 = (34 * q + 2) / 4; /* word holding the quants' first byte */
            const bool odd = (q & 1) == 0;   /* quants at 2 mod 4: funnel */
MLACU_UNROLL
            for (int i = 0; i < 8; i++) qs[i] = odd ? gs_shr(w[w0 + i], w[w0 + i + 1], 16) : w[w0 + i];
            const uint32_t dh = (q & 1) ? w[(34 * q) / 4] >> 16 : w[(34 * q) / 4] & 0xFFFF;
            acc = gs_fma(gs_mul(h2f(dh), x.f[q]), (float)(gs_dp4(qs, x.x[2 * q]) + gs_dp4(qs + 4, x.x[2 * q + 1])), acc);
        }
        return acc;
    }
}

} // namespace mlacu

#endif
