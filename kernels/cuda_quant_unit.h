/* cuda_quant_unit: dequantization of one "unit" (32 consecutive elements) of every GGUF type
 * the CUDA backend supports, as __host__ __device__ code (CUDA C++ only: include from .cu
 * files). The host instantiation lets tests check the formats against the CPU reference
 * (kernels/quant.c) without a GPU; the device one is what the kernels run.
 *
 * A row of n elements is n/32 units. For 32-element block types a unit is one block; for the
 * 256-element K/IQ types it is sub-block `sub` (0..7) of a block; for F32/F16/BF16 a unit is
 * 32 plain elements. deq_unit<T>(blk, sub, v) writes the 32 floats of the unit into v (a
 * register array when inlined: v is only indexed with constants after unrolling).
 *
 * Grid tables: on the device they are __device__ copies filled by mla_cuda_init()
 * (kernels/quant_cuda.cu); on the host the arrays of kernels/quant_grids.c. */
#ifndef CUDA_QUANT_UNIT_H
#define CUDA_QUANT_UNIT_H

#ifndef __CUDACC__
#error "cuda_quant_unit.h is CUDA C++"
#endif

#include <stdint.h>

extern "C" {
#include "common/ggml_types.h"
#include "kernels/quant_grids.h"
}

namespace mlacu {

#ifdef __CUDA_ARCH__
#define MLACU_UNROLL _Pragma("unroll")
#else
#define MLACU_UNROLL
#endif

/* Device copies of the grids, uploaded by mla_cuda_init() (quant_cuda.cu). Defined here, so
 * include this header in ONE .cu file per program (no separable compilation). */
__device__ uint8_t g_iq2xxs_grid[256][8];
__device__ uint8_t g_iq2xs_grid[512][8];
__device__ uint8_t g_iq2s_grid[1024][8];
__device__ uint8_t g_iq3xxs_grid[256][4];
__device__ uint8_t g_iq3s_grid[512][4];
__device__ int8_t g_iq1s_grid[2048][8];
__device__ uint8_t g_ksigns[128];
__device__ int8_t g_kvalues_iq4nl[16];

#ifdef __CUDA_ARCH__
#define MLACU_TAB(dev, host) (dev)
#else
#define MLACU_TAB(dev, host) (host)
#endif

/* Block geometry per type: BE elements and BB bytes per block, BU units per block. Float types
 * are described with 32-element pseudo-blocks. */
template <int T> struct qtraits;
#define MLACU_TRAITS(T_, BE_, BB_)                                                              \
    template <> struct qtraits<T_> {                                                           \
        static constexpr int BE = BE_, BB = BB_, BU = BE_ / 32;                                \
    };
MLACU_TRAITS(GGML_TYPE_F32, 32, 128)
MLACU_TRAITS(GGML_TYPE_F16, 32, 64)
MLACU_TRAITS(GGML_TYPE_BF16, 32, 64)
MLACU_TRAITS(GGML_TYPE_Q8_0, 32, 34)
MLACU_TRAITS(GGML_TYPE_Q5_0, 32, 22)
MLACU_TRAITS(GGML_TYPE_Q2_K, 256, 84)
MLACU_TRAITS(GGML_TYPE_Q3_K, 256, 110)
MLACU_TRAITS(GGML_TYPE_Q4_K, 256, 144)
MLACU_TRAITS(GGML_TYPE_Q5_K, 256, 176)
MLACU_TRAITS(GGML_TYPE_Q6_K, 256, 210)
MLACU_TRAITS(GGML_TYPE_IQ4_XS, 256, 136)
MLACU_TRAITS(GGML_TYPE_IQ2_XXS, 256, 66)
MLACU_TRAITS(GGML_TYPE_IQ2_XS, 256, 74)
MLACU_TRAITS(GGML_TYPE_IQ2_S, 256, 82)
MLACU_TRAITS(GGML_TYPE_IQ3_XXS, 256, 98)
MLACU_TRAITS(GGML_TYPE_IQ3_S, 256, 110)
MLACU_TRAITS(GGML_TYPE_IQ1_S, 256, 50)
MLACU_TRAITS(GGML_TYPE_IQ1_M, 256, 56)
#undef MLACU_TRAITS

/* Calls M(type) for every supported type. */
#define MLACU_FOR_TYPES(M)                                                                      \
    M(GGML_TYPE_F32) M(GGML_TYPE_F16) M(GGML_TYPE_BF16) M(GGML_TYPE_Q8_0) M(GGML_TYPE_Q5_0)     \
    M(GGML_TYPE_Q2_K) M(GGML_TYPE_Q3_K) M(GGML_TYPE_Q4_K) M(GGML_TYPE_Q5_K) M(GGML_TYPE_Q6_K)   \
    M(GGML_TYPE_IQ4_XS) M(GGML_TYPE_IQ2_XXS) M(GGML_TYPE_IQ2_XS) M(GGML_TYPE_IQ2_S)             \
    M(GGML_TYPE_IQ3_XXS) M(GGML_TYPE_IQ3_S) M(GGML_TYPE_IQ1_S) M(GGML_TYPE_IQ1_M)

/* Little-endian reads at 2-byte alignment (every field these formats read as 16 or 32 bits
 * sits at an even offset of a block, and blocks sit at even offsets). */
__host__ __device__ __forceinline__ uint32_t rd16(const uint8_t *p) {
    return *(const uint16_t *)p;
}
__host__ __device__ __forceinline__ uint32_t rd32(const uint8_t *p) {
    return rd16(p) | (rd16(p + 2) << 16);
}
__host__ __device__ __forceinline__ float bits_f32(uint32_t u) {
    union {
        uint32_t u;
        float f;
    } c;
    c.u = u;
    return c.f;
}
__host__ __device__ __forceinline__ uint32_t f32_bits(float f) {
    union {
        float f;
        uint32_t u;
    } c;
    c.f = f;
    return c.u;
}
/* Exact IEEE half -> float (normals, subnormals, inf, nan). */
__host__ __device__ __forceinline__ float h2f(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t b;
    if (em >= 0x7c00u)
        b = 0x7f800000u | (em << 13);
    else
        b = f32_bits(bits_f32(em << 13) * 5.192296858534828e33f); /* 2^112 */
    return bits_f32(b | sign);
}

template <int T>
__host__ __device__ __forceinline__ void deq_unit(const uint8_t *b, int sub, float *v);

template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_F32>(const uint8_t *b, int, float *v) {
    const float *f = (const float *)b;
MLACU_UNROLL
    for (int i = 0; i < 32; i++) v[i] = f[i];
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_F16>(const uint8_t *b, int, float *v) {
MLACU_UNROLL
    for (int i = 0; i < 32; i++) v[i] = h2f(rd16(b + 2 * i));
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_BF16>(const uint8_t *b, int, float *v) {
MLACU_UNROLL
    for (int i = 0; i < 32; i++) v[i] = bits_f32(rd16(b + 2 * i) << 16);
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_Q8_0>(const uint8_t *b, int, float *v) {
    float d = h2f(rd16(b));
MLACU_UNROLL
    for (int i = 0; i < 32; i++) v[i] = d * (float)(int8_t)b[2 + i];
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_Q5_0>(const uint8_t *b, int, float *v) {
    float d = h2f(rd16(b));
    uint32_t qh = rd32(b + 2);
    const uint8_t *qs = b + 6;
MLACU_UNROLL
    for (int i = 0; i < 16; i++) {
        int lo = (int)((qs[i] & 0xF) | (((qh >> i) & 1) << 4)) - 16;
        int hi = (int)((qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) - 16;
        v[i] = d * (float)lo;
        v[i + 16] = d * (float)hi;
    }
}

/* 6-bit scale and min j of the 12-byte packed K-quant scales (Q4_K, Q5_K). */
__host__ __device__ __forceinline__ void kscale_min(const uint8_t *q, int j, int &sc, int &m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_Q4_K>(const uint8_t *b, int sub, float *v) {
    float d = h2f(rd16(b)), dmin = h2f(rd16(b + 2));
    int sc, m;
    kscale_min(b + 4, sub, sc, m);
    float d1 = d * (float)sc, m1 = dmin * (float)m;
    const uint8_t *qs = b + 16 + 32 * (sub >> 1);
    int sh = 4 * (sub & 1);
MLACU_UNROLL
    for (int i = 0; i < 32; i++) v[i] = d1 * (float)((qs[i] >> sh) & 0xF) - m1;
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_Q5_K>(const uint8_t *b, int sub, float *v) {
    float d = h2f(rd16(b)), dmin = h2f(rd16(b + 2));
    int sc, m;
    kscale_min(b + 4, sub, sc, m);
    float d1 = d * (float)sc, m1 = dmin * (float)m;
    const uint8_t *qh = b + 16;
    const uint8_t *qs = b + 48 + 32 * (sub >> 1);
    int sh = 4 * (sub & 1);
MLACU_UNROLL
    for (int i = 0; i < 32; i++)
        v[i] = d1 * (float)(((qs[i] >> sh) & 0xF) | (((qh[i] >> sub) & 1) << 4)) - m1;
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_Q6_K>(const uint8_t *b, int sub, float *v) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    float d = h2f(rd16(b + 208));
    int n = sub >> 2, k = sub & 3;
    const uint8_t *l4 = ql + 64 * n + 32 * (k & 1);
    int lsh = 4 * (k >> 1);
    const uint8_t *h2 = qh + 32 * n;
    float d0 = d * (float)scales[8 * n + 2 * k], d1 = d * (float)scales[8 * n + 2 * k + 1];
MLACU_UNROLL
    for (int i = 0; i < 32; i++) {
        int q = (int)(((l4[i] >> lsh) & 0xF) | (((h2[i] >> (2 * k)) & 3) << 4)) - 32;
        v[i] = (i < 16 ? d0 : d1) * (float)q;
    }
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_Q2_K>(const uint8_t *b, int sub, float *v) {
    const uint8_t *scales = b, *qs = b + 16 + 32 * (sub >> 2);
    float d = h2f(rd16(b + 80)), dmin = h2f(rd16(b + 82));
    int sh = 2 * (sub & 3);
    int s0 = scales[2 * sub], s1 = scales[2 * sub + 1];
    float dl0 = d * (float)(s0 & 0xF), ml0 = dmin * (float)(s0 >> 4);
    float dl1 = d * (float)(s1 & 0xF), ml1 = dmin * (float)(s1 >> 4);
MLACU_UNROLL
    for (int i = 0; i < 32; i++) {
        float q = (float)((qs[i] >> sh) & 3);
        v[i] = i < 16 ? dl0 * q - ml0 : dl1 * q - ml1;
    }
}
__host__ __device__ __forceinline__ int q3k_scale(const uint8_t *s, int j) {
    int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
    int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_Q3_K>(const uint8_t *b, int sub, float *v) {
    const uint8_t *hm = b, *qs = b + 32 + 32 * (sub >> 2), *sc = b + 96;
    float d = h2f(rd16(b + 108));
    int sh = 2 * (sub & 3);
    float d0 = d * (float)q3k_scale(sc, 2 * sub), d1 = d * (float)q3k_scale(sc, 2 * sub + 1);
MLACU_UNROLL
    for (int i = 0; i < 32; i++) {
        int q = (int)((qs[i] >> sh) & 3) - (((hm[i] >> sub) & 1) ? 0 : 4);
        v[i] = (i < 16 ? d0 : d1) * (float)q;
    }
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_IQ4_XS>(const uint8_t *b, int sub, float *v) {
    const int8_t *kv = MLACU_TAB(g_kvalues_iq4nl, quant_kvalues_iq4nl);
    float d = h2f(rd16(b));
    uint32_t sh = rd16(b + 2);
    int ls = ((b[4 + (sub >> 1)] >> (4 * (sub & 1))) & 0xF) | (((sh >> (2 * sub)) & 3) << 4);
    float dl = d * (float)(ls - 32);
    const uint8_t *qs = b + 8 + 16 * sub;
MLACU_UNROLL
    for (int i = 0; i < 16; i++) {
        v[i] = dl * (float)kv[qs[i] & 0xF];
        v[i + 16] = dl * (float)kv[qs[i] >> 4];
    }
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_IQ2_XXS>(const uint8_t *b, int sub, float *v) {
    const uint8_t *q = b + 2 + 8 * sub;
    uint32_t aux1 = rd32(q + 4);
    float db = h2f(rd16(b)) * (0.5f + (float)(aux1 >> 28)) * 0.25f;
MLACU_UNROLL
    for (int l = 0; l < 4; l++) {
        const uint8_t *g = MLACU_TAB(g_iq2xxs_grid, quant_iq2xxs_grid)[q[l]];
        uint32_t s = MLACU_TAB(g_ksigns, quant_ksigns)[(aux1 >> (7 * l)) & 127];
MLACU_UNROLL
        for (int j = 0; j < 8; j++) v[8 * l + j] = db * (float)g[j] * (((s >> j) & 1) ? -1.f : 1.f);
    }
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_IQ2_XS>(const uint8_t *b, int sub, float *v) {
    float d = h2f(rd16(b));
    int sc = b[66 + sub];
    float db0 = d * (0.5f + (float)(sc & 0xF)) * 0.25f, db1 = d * (0.5f + (float)(sc >> 4)) * 0.25f;
MLACU_UNROLL
    for (int l = 0; l < 4; l++) {
        uint32_t w = rd16(b + 2 + 2 * (4 * sub + l));
        const uint8_t *g = MLACU_TAB(g_iq2xs_grid, quant_iq2xs_grid)[w & 511];
        uint32_t s = MLACU_TAB(g_ksigns, quant_ksigns)[w >> 9];
        float db = l < 2 ? db0 : db1;
MLACU_UNROLL
        for (int j = 0; j < 8; j++) v[8 * l + j] = db * (float)g[j] * (((s >> j) & 1) ? -1.f : 1.f);
    }
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_IQ2_S>(const uint8_t *b, int sub, float *v) {
    float d = h2f(rd16(b));
    const uint8_t *qs = b + 2 + 4 * sub, *signs = b + 34 + 4 * sub;
    int qh = b[66 + sub], sc = b[74 + sub];
    float db0 = d * (0.5f + (float)(sc & 0xF)) * 0.25f, db1 = d * (0.5f + (float)(sc >> 4)) * 0.25f;
MLACU_UNROLL
    for (int l = 0; l < 4; l++) {
        int idx = qs[l] | (((qh >> (2 * l)) & 3) << 8);
        const uint8_t *g = MLACU_TAB(g_iq2s_grid, quant_iq2s_grid)[idx];
        uint32_t s = signs[l];
        float db = l < 2 ? db0 : db1;
MLACU_UNROLL
        for (int j = 0; j < 8; j++) v[8 * l + j] = db * (float)g[j] * (((s >> j) & 1) ? -1.f : 1.f);
    }
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_IQ3_XXS>(const uint8_t *b, int sub, float *v) {
    const uint8_t *qs = b + 2 + 8 * sub;
    uint32_t aux = rd32(b + 66 + 4 * sub);
    float db = h2f(rd16(b)) * (0.5f + (float)(aux >> 28)) * 0.5f;
MLACU_UNROLL
    for (int l = 0; l < 4; l++) {
        uint32_t s = MLACU_TAB(g_ksigns, quant_ksigns)[(aux >> (7 * l)) & 127];
        const uint8_t *g1 = MLACU_TAB(g_iq3xxs_grid, quant_iq3xxs_grid)[qs[2 * l]];
        const uint8_t *g2 = MLACU_TAB(g_iq3xxs_grid, quant_iq3xxs_grid)[qs[2 * l + 1]];
MLACU_UNROLL
        for (int j = 0; j < 4; j++) {
            v[8 * l + j] = db * (float)g1[j] * (((s >> j) & 1) ? -1.f : 1.f);
            v[8 * l + 4 + j] = db * (float)g2[j] * (((s >> (j + 4)) & 1) ? -1.f : 1.f);
        }
    }
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_IQ3_S>(const uint8_t *b, int sub, float *v) {
    float d = h2f(rd16(b));
    const uint8_t *qs = b + 2 + 8 * sub, *signs = b + 74 + 4 * sub;
    int qh = b[66 + sub];
    float db = d * (float)(1 + 2 * ((b[106 + (sub >> 1)] >> (4 * (sub & 1))) & 0xF));
MLACU_UNROLL
    for (int g = 0; g < 8; g++) {
        int idx = qs[g] | (((qh >> g) & 1) << 8);
        const uint8_t *gr = MLACU_TAB(g_iq3s_grid, quant_iq3s_grid)[idx];
        uint32_t s = signs[g >> 1] >> (4 * (g & 1));
MLACU_UNROLL
        for (int j = 0; j < 4; j++) v[4 * g + j] = db * (float)gr[j] * (((s >> j) & 1) ? -1.f : 1.f);
    }
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_IQ1_S>(const uint8_t *b, int sub, float *v) {
    float d = h2f(rd16(b));
    const uint8_t *qs = b + 2 + 4 * sub;
    uint32_t qh = rd16(b + 34 + 2 * sub);
    float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
    float delta = (qh & 0x8000) ? -0.125f : 0.125f;
MLACU_UNROLL
    for (int l = 0; l < 4; l++) {
        const int8_t *g = MLACU_TAB(g_iq1s_grid, quant_iq1s_grid)[qs[l] | (((qh >> (3 * l)) & 7) << 8)];
MLACU_UNROLL
        for (int j = 0; j < 8; j++) v[8 * l + j] = dl * ((float)g[j] + delta);
    }
}
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_IQ1_M>(const uint8_t *b, int sub, float *v) {
    const uint8_t *qs = b + 4 * sub, *qh = b + 32 + 2 * sub;
    uint32_t s0 = rd16(b + 48), s1 = rd16(b + 50), s2 = rd16(b + 52), s3 = rd16(b + 54);
    uint32_t dh = (s0 >> 12) | ((s1 >> 8) & 0xF0) | ((s2 >> 4) & 0xF00) | (s3 & 0xF000);
    float d = h2f(dh);
    uint32_t w = rd16(b + 48 + 2 * (sub >> 1));
    int shw = 6 * (sub & 1);
    float dl1 = d * (float)(2 * ((w >> shw) & 7) + 1);
    float dl2 = d * (float)(2 * ((w >> (shw + 3)) & 7) + 1);
MLACU_UNROLL
    for (int g = 0; g < 4; g++) {
        int hb = qh[g >> 1] >> (4 * (g & 1));
        int idx = qs[g] | ((hb & 7) << 8);
        float delta = (hb & 8) ? -0.125f : 0.125f;
        float dl = g < 2 ? dl1 : dl2;
        const int8_t *gr = MLACU_TAB(g_iq1s_grid, quant_iq1s_grid)[idx];
MLACU_UNROLL
        for (int j = 0; j < 8; j++) v[8 * g + j] = dl * ((float)gr[j] + delta);
    }
}

} // namespace mlacu

#endif
