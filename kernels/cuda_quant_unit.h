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
#include <string.h>

extern "C" {
#include "common/ggml_types.h"
#include "kernels/cuda_types.h"
#include "kernels/quant_grids.h"
}

namespace mlacu {

#ifdef __CUDA_ARCH__
#define MLACU_UNROLL _Pragma("unroll")
#else
#define MLACU_UNROLL
#endif

/* Device copies of the grids. Defined here: with whole-program compilation (no separable
 * compilation) each .cu file that includes this header has its own copies. A file whose kernels
 * read them says MLACU_GRIDS_TU() once: mla_cuda_init() (quant_cuda.cu) then uploads its copies
 * (through mlacu_grids_upload_tu below, registered at start-up). */
__device__ uint8_t g_iq2xxs_grid[256][8];
__device__ uint8_t g_iq2xs_grid[512][8];
__device__ uint8_t g_iq2s_grid[1024][8];
__device__ uint8_t g_iq3xxs_grid[256][4];
__device__ uint8_t g_iq3s_grid[512][4];
__device__ int8_t g_iq1s_grid[2048][8];
__device__ uint8_t g_ksigns[128];
__device__ int8_t g_kvalues_iq4nl[16];

/* this file's copies of the grids from the host arrays (kernels/quant_grids.c) */
static cudaError_t mlacu_grids_upload_tu(void) {
    cudaError_t err = cudaSuccess;
#define MLACU_UP(dst, src)                                                                      \
    if (err == cudaSuccess) err = cudaMemcpyToSymbol(dst, src, sizeof(src));
    MLACU_UP(g_iq2xxs_grid, quant_iq2xxs_grid)
    MLACU_UP(g_iq2xs_grid, quant_iq2xs_grid)
    MLACU_UP(g_iq2s_grid, quant_iq2s_grid)
    MLACU_UP(g_iq3xxs_grid, quant_iq3xxs_grid)
    MLACU_UP(g_iq3s_grid, quant_iq3s_grid)
    MLACU_UP(g_iq1s_grid, quant_iq1s_grid)
    MLACU_UP(g_ksigns, quant_ksigns)
    MLACU_UP(g_kvalues_iq4nl, quant_kvalues_iq4nl)
#undef MLACU_UP
    return err;
}
typedef cudaError_t (*mlacu_grids_upload_fn)(void);
#define MLACU_GRIDS_MAX 16
/* adds f to what mla_cuda_init() calls (at most MLACU_GRIDS_MAX files); true */
bool mlacu_grids_register(mlacu_grids_upload_fn f); /* quant_cuda.cu */
#define MLACU_GRIDS_TU() [[maybe_unused]] static const bool mlacu_grids_registered_tu = mlacu_grids_register(mlacu_grids_upload_tu)

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
MLACU_TRAITS(GGML_TYPE_Q4_0, 32, 18)
MLACU_TRAITS(GGML_TYPE_Q4_1, 32, 20)
MLACU_TRAITS(GGML_TYPE_Q5_1, 32, 24)
MLACU_TRAITS(GGML_TYPE_IQ4_NL, 32, 18)
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

/* Calls M(type) for every supported type: the list of kernels/cuda_types.h. */
#define MLACU_FOR_TYPES(M) MLA_CUDA_WEIGHT_TYPES(M)

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

/* Q4_0: d, then 16 bytes of nibbles (element i the low nibble of byte i, i + 16 the high), less 8 */
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_Q4_0>(const uint8_t *b, int, float *v) {
    float d = h2f(rd16(b));
    const uint8_t *qs = b + 2;
MLACU_UNROLL
    for (int i = 0; i < 16; i++) {
        v[i] = d * (float)((int)(qs[i] & 0xF) - 8);
        v[i + 16] = d * (float)((int)(qs[i] >> 4) - 8);
    }
}
/* Q4_1: d and the min m, then the nibbles: d q + m */
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_Q4_1>(const uint8_t *b, int, float *v) {
    float d = h2f(rd16(b)), m = h2f(rd16(b + 2));
    const uint8_t *qs = b + 4;
MLACU_UNROLL
    for (int i = 0; i < 16; i++) {
        v[i] = d * (float)(qs[i] & 0xF) + m;
        v[i + 16] = d * (float)(qs[i] >> 4) + m;
    }
}
/* Q5_1: d, m, the fifth bits (bit i of element i), the nibbles: d q + m */
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_Q5_1>(const uint8_t *b, int, float *v) {
    float d = h2f(rd16(b)), m = h2f(rd16(b + 2));
    uint32_t qh = rd32(b + 4);
    const uint8_t *qs = b + 8;
MLACU_UNROLL
    for (int i = 0; i < 16; i++) {
        v[i] = d * (float)((qs[i] & 0xF) | (((qh >> i) & 1) << 4)) + m;
        v[i + 16] = d * (float)((qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) + m;
    }
}
/* 32 elements from 16 bytes of IQ4 nibbles qs (element i the low nibble of byte i, i + 16 the
 * high), each nibble indexing the 16 non-linear levels, times d (an IQ4_NL block, an IQ4_XS
 * sub-block) */
__host__ __device__ __forceinline__ void iq4_deq(const uint8_t *qs, float d, float *v) {
    const int8_t *kv = MLACU_TAB(g_kvalues_iq4nl, quant_kvalues_iq4nl);
MLACU_UNROLL
    for (int i = 0; i < 16; i++) {
        v[i] = d * (float)kv[qs[i] & 0xF];
        v[i + 16] = d * (float)kv[qs[i] >> 4];
    }
}
/* IQ4_NL: d, then the nibbles (IQ4_XS's levels, one scale a block) */
template <>
__host__ __device__ __forceinline__ void deq_unit<GGML_TYPE_IQ4_NL>(const uint8_t *b, int, float *v) {
    iq4_deq(b + 2, h2f(rd16(b)), v);
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
    float d = h2f(rd16(b));
    uint32_t sh = rd16(b + 2);
    int ls = ((b[4 + (sub >> 1)] >> (4 * (sub & 1))) & 0xF) | (((sh >> (2 * sub)) & 3) << 4);
    iq4_deq(b + 8 + 16 * sub, d * (float)(ls - 32), v);
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

/* ---------------------------------------------------------------- integer form of a unit */
/* For the integer GEMV (activations quantized to int8 in blocks of 32, dot products with dp4a):
 * unit_i8<T>(blk, sub, u) writes the unit as 32 signed 8-bit integers q (u.q[j] packs elements
 * 4j..4j+3, element 4j in the low byte) with, per half of 16 elements h, a scale s[h] and an
 * offset m[h]: element i of half h equals s[h] * q[i] - m[h] (what deq_unit gives, to float
 * rounding). Every quantized type has this form; the IQ1 grids' +-1/8 offsets become exact
 * integers by scaling q by 8. F32/F16/BF16 have none (qtraits<T>::I8 is false for them). */
struct unit_i8_t {
    uint32_t q[8];
    float s[2], m[2];
};
template <int T> struct i8traits {
    static constexpr bool OK = true;
};
/* SCALES2: the two halves of a unit can have different scales (else s[0] == s[1]); MIN: the
 * offsets m can be non-zero (else m[0] == m[1] == 0). The tensor-core kernel uses both. */
template <int T> __host__ __device__ constexpr bool i8_scales2() {
    return T == GGML_TYPE_Q6_K || T == GGML_TYPE_Q2_K || T == GGML_TYPE_Q3_K || T == GGML_TYPE_IQ2_XS ||
           T == GGML_TYPE_IQ2_S || T == GGML_TYPE_IQ1_M;
}
template <int T> __host__ __device__ constexpr bool i8_min() {
    return T == GGML_TYPE_Q4_K || T == GGML_TYPE_Q5_K || T == GGML_TYPE_Q2_K || T == GGML_TYPE_Q4_1 || T == GGML_TYPE_Q5_1;
}
template <> struct i8traits<GGML_TYPE_F32> { static constexpr bool OK = false; };
template <> struct i8traits<GGML_TYPE_F16> { static constexpr bool OK = false; };
template <> struct i8traits<GGML_TYPE_BF16> { static constexpr bool OK = false; };

/* per-byte a - b (mod 256) */
__host__ __device__ __forceinline__ uint32_t vsub4(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __vsub4(a, b);
#else
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= ((((a >> (8 * i)) & 0xFFu) - ((b >> (8 * i)) & 0xFFu)) & 0xFFu) << (8 * i);
    return r;
#endif
}
/* bits 0..3 of t to bit 0 of bytes 0..3 (the four products land in disjoint bit ranges) */
__host__ __device__ __forceinline__ uint32_t bits4_bytes(uint32_t t) {
    return ((t & 0xFu) * 0x00204081u) & 0x01010101u;
}
/* bytes g (magnitudes < 128) negated where sign bits 0..3 of s are set */
__host__ __device__ __forceinline__ uint32_t signs4(uint32_t g, uint32_t s) {
    uint32_t m = bits4_bytes(s) * 0xFFu;
    return vsub4(g ^ m, m);
}
/* N little-endian 32-bit words from p. A = the alignment p is known to have (16, 4 or 2). On the
 * device 16-aligned runs use 16-byte loads; 2-aligned ones aligned 4-byte loads and funnel
 * shifts (never reading a word past the run when p is 4-aligned). */
template <int N, int A> __host__ __device__ __forceinline__ void ldw(const uint8_t *p, uint32_t *w) {
#ifdef __CUDA_ARCH__
    if (A >= 16 && N % 4 == 0) {
MLACU_UNROLL
        for (int i = 0; i < N / 4; i++) {
            uint4 v = __ldg((const uint4 *)p + i);
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
    } else if (A >= 4) {
MLACU_UNROLL
        for (int i = 0; i < N; i++) w[i] = __ldg((const uint32_t *)p + i);
    } else {
        const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
        const uint32_t sh = (uint32_t)((uintptr_t)p & 3) * 8;
        uint32_t v[N + 1];
MLACU_UNROLL
        for (int i = 0; i < N; i++) v[i] = __ldg(a + i);
        v[N] = sh ? __ldg(a + N) : 0u;
MLACU_UNROLL
        for (int i = 0; i < N; i++) w[i] = __funnelshift_r(v[i], v[i + 1], sh);
    }
#else /* the host runs the same word arithmetic (so that the host test checks it) with plain loads */
    if (A >= 4) {
        for (int i = 0; i < N; i++) memcpy(&w[i], p + 4 * i, 4);
    } else {
        const uint8_t *a = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)3);
        const uint32_t sh = (uint32_t)((uintptr_t)p & 3) * 8;
        uint32_t v[N + 1];
        for (int i = 0; i < N; i++) memcpy(&v[i], a + 4 * i, 4);
        v[N] = 0;
        if (sh) memcpy(&v[N], a + 4 * N, 4);
        for (int i = 0; i < N; i++) w[i] = sh ? (v[i] >> sh) | (v[i + 1] << (32 - sh)) : v[i];
    }
#endif
}
/* 4 bytes of a grid table row (device: one load; tables are __device__ arrays) */
__host__ __device__ __forceinline__ uint32_t grid4(const uint8_t *g) {
#ifdef __CUDA_ARCH__
    return *(const uint32_t *)g;
#else
    return rd32(g);
#endif
}

template <int T>
__host__ __device__ __forceinline__ void unit_i8(const uint8_t *b, int sub, unit_i8_t &u);

/* Q4_K / Q5_K: d, dmin and sub-block j's 6-bit scale and min from the block's first 16 bytes as
 * four words h (k4_scale), or read from b (k4_header: one 16-byte load on the device) */
__host__ __device__ __forceinline__ void k4_scale(const uint32_t h[4], int j, float &s, float &m) {
    const uint32_t s0 = h[1], s1 = h[2], s2 = h[3]; /* scale bytes 0-3, 4-7, 8-11 */
    const int k = 8 * (j & 3);
    int sc, mn;
    if (j < 4) {
        sc = (int)((s0 >> k) & 63);
        mn = (int)((s1 >> k) & 63);
    } else {
        sc = (int)(((s2 >> k) & 0xF) | (((s0 >> k) >> 6 & 3) << 4));
        mn = (int)(((s2 >> k) >> 4 & 0xF) | (((s1 >> k) >> 6 & 3) << 4));
    }
    s = h2f(h[0] & 0xFFFF) * (float)sc;
    m = h2f(h[0] >> 16) * (float)mn;
}
__host__ __device__ __forceinline__ void k4_header(const uint8_t *b, int j, float &s, float &m) {
    uint32_t h[4];
    ldw<4, 16>(b, h);
    k4_scale(h, j, s, m);
}

template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_Q8_0>(const uint8_t *b, int, unit_i8_t &u) {
    ldw<8, 2>(b + 2, u.q);
    u.s[0] = u.s[1] = h2f(rd16(b));
    u.m[0] = u.m[1] = 0.f;
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_Q5_0>(const uint8_t *b, int, unit_i8_t &u) {
    uint32_t l[4];
    ldw<4, 2>(b + 6, l);
    uint32_t qh = rd32(b + 2);
MLACU_UNROLL
    for (int j = 0; j < 4; j++) {
        u.q[j] = vsub4((l[j] & 0x0F0F0F0Fu) | (bits4_bytes(qh >> (4 * j)) << 4), 0x10101010u);
        u.q[j + 4] = vsub4(((l[j] >> 4) & 0x0F0F0F0Fu) | (bits4_bytes(qh >> (16 + 4 * j)) << 4), 0x10101010u);
    }
    u.s[0] = u.s[1] = h2f(rd16(b));
    u.m[0] = u.m[1] = 0.f;
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_Q4_0>(const uint8_t *b, int, unit_i8_t &u) {
    uint32_t l[4];
    ldw<4, 2>(b + 2, l);
MLACU_UNROLL
    for (int j = 0; j < 4; j++) {
        u.q[j] = vsub4(l[j] & 0x0F0F0F0Fu, 0x08080808u);
        u.q[j + 4] = vsub4((l[j] >> 4) & 0x0F0F0F0Fu, 0x08080808u);
    }
    u.s[0] = u.s[1] = h2f(rd16(b));
    u.m[0] = u.m[1] = 0.f;
}
/* Q4_1 / Q5_1: element d q + m, so the offset is -m */
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_Q4_1>(const uint8_t *b, int, unit_i8_t &u) {
    uint32_t l[4];
    ldw<4, 2>(b + 4, l);
MLACU_UNROLL
    for (int j = 0; j < 4; j++) {
        u.q[j] = l[j] & 0x0F0F0F0Fu;
        u.q[j + 4] = (l[j] >> 4) & 0x0F0F0F0Fu;
    }
    u.s[0] = u.s[1] = h2f(rd16(b));
    u.m[0] = u.m[1] = -h2f(rd16(b + 2));
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_Q5_1>(const uint8_t *b, int, unit_i8_t &u) {
    uint32_t l[4];
    ldw<4, 2>(b + 8, l);
    uint32_t qh = rd32(b + 4);
MLACU_UNROLL
    for (int j = 0; j < 4; j++) {
        u.q[j] = (l[j] & 0x0F0F0F0Fu) | (bits4_bytes(qh >> (4 * j)) << 4);
        u.q[j + 4] = ((l[j] >> 4) & 0x0F0F0F0Fu) | (bits4_bytes(qh >> (16 + 4 * j)) << 4);
    }
    u.s[0] = u.s[1] = h2f(rd16(b));
    u.m[0] = u.m[1] = -h2f(rd16(b + 2));
}
/* the integer form of 16 bytes of IQ4 nibbles (l): each nibble's non-linear level, the low
 * nibbles' into q[0..3], the high ones' into q[4..7] (an IQ4_NL block, an IQ4_XS sub-block) */
__host__ __device__ __forceinline__ void iq4_levels(const uint32_t (&l)[4], unit_i8_t &u) {
    const int8_t *kv = MLACU_TAB(g_kvalues_iq4nl, quant_kvalues_iq4nl);
MLACU_UNROLL
    for (int j = 0; j < 4; j++) {
        uint32_t lo = 0, hi = 0;
MLACU_UNROLL
        for (int i = 0; i < 4; i++) {
            uint32_t byte = (l[j] >> (8 * i)) & 0xFFu;
            lo |= (uint32_t)(uint8_t)kv[byte & 0xF] << (8 * i);
            hi |= (uint32_t)(uint8_t)kv[byte >> 4] << (8 * i);
        }
        u.q[j] = lo, u.q[j + 4] = hi;
    }
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_IQ4_NL>(const uint8_t *b, int, unit_i8_t &u) {
    uint32_t l[4];
    ldw<4, 2>(b + 2, l);
    iq4_levels(l, u);
    u.s[0] = u.s[1] = h2f(rd16(b));
    u.m[0] = u.m[1] = 0.f;
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_Q4_K>(const uint8_t *b, int sub, unit_i8_t &u) {
    uint32_t w[8];
    ldw<8, 16>(b + 16 + 32 * (sub >> 1), w);
    const int sh = 4 * (sub & 1);
MLACU_UNROLL
    for (int j = 0; j < 8; j++) u.q[j] = (w[j] >> sh) & 0x0F0F0F0Fu;
    k4_header(b, sub, u.s[0], u.m[0]);
    u.s[1] = u.s[0], u.m[1] = u.m[0];
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_Q5_K>(const uint8_t *b, int sub, unit_i8_t &u) {
    uint32_t w[8], h[8];
    ldw<8, 16>(b + 48 + 32 * (sub >> 1), w);
    ldw<8, 16>(b + 16, h);
    const int sh = 4 * (sub & 1);
MLACU_UNROLL
    for (int j = 0; j < 8; j++) u.q[j] = ((w[j] >> sh) & 0x0F0F0F0Fu) | (((h[j] >> sub) & 0x01010101u) << 4);
    k4_header(b, sub, u.s[0], u.m[0]);
    u.s[1] = u.s[0], u.m[1] = u.m[0];
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_Q6_K>(const uint8_t *b, int sub, unit_i8_t &u) {
    const int n = sub >> 2, k = sub & 3;
    uint32_t l[8], h[8];
    ldw<8, 2>(b + 64 * n + 32 * (k & 1), l);
    ldw<8, 2>(b + 128 + 32 * n, h);
    const int lsh = 4 * (k >> 1), hsh = 2 * k;
MLACU_UNROLL
    for (int j = 0; j < 8; j++)
        u.q[j] = vsub4(((l[j] >> lsh) & 0x0F0F0F0Fu) | (((h[j] >> hsh) & 0x03030303u) << 4), 0x20202020u);
    const int8_t *scales = (const int8_t *)(b + 192);
    float d = h2f(rd16(b + 208));
    u.s[0] = d * (float)scales[8 * n + 2 * k];
    u.s[1] = d * (float)scales[8 * n + 2 * k + 1];
    u.m[0] = u.m[1] = 0.f;
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_Q2_K>(const uint8_t *b, int sub, unit_i8_t &u) {
    uint32_t w[8];
    ldw<8, 4>(b + 16 + 32 * (sub >> 2), w);
    const int sh = 2 * (sub & 3);
MLACU_UNROLL
    for (int j = 0; j < 8; j++) u.q[j] = (w[j] >> sh) & 0x03030303u;
    float d = h2f(rd16(b + 80)), dmin = h2f(rd16(b + 82));
    int s0 = b[2 * sub], s1 = b[2 * sub + 1];
    u.s[0] = d * (float)(s0 & 0xF), u.m[0] = dmin * (float)(s0 >> 4);
    u.s[1] = d * (float)(s1 & 0xF), u.m[1] = dmin * (float)(s1 >> 4);
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_Q3_K>(const uint8_t *b, int sub, unit_i8_t &u) {
    uint32_t w[8], hm[8];
    ldw<8, 2>(b + 32 + 32 * (sub >> 2), w);
    ldw<8, 2>(b, hm);
    const int sh = 2 * (sub & 3);
MLACU_UNROLL
    for (int j = 0; j < 8; j++)
        u.q[j] = vsub4(((w[j] >> sh) & 0x03030303u) | (((hm[j] >> sub) & 0x01010101u) << 2), 0x04040404u);
    float d = h2f(rd16(b + 108));
    u.s[0] = d * (float)q3k_scale(b + 96, 2 * sub);
    u.s[1] = d * (float)q3k_scale(b + 96, 2 * sub + 1);
    u.m[0] = u.m[1] = 0.f;
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_IQ4_XS>(const uint8_t *b, int sub, unit_i8_t &u) {
    uint32_t l[4];
    ldw<4, 4>(b + 8 + 16 * sub, l);
    iq4_levels(l, u);
    uint32_t sh = rd16(b + 2);
    int ls = ((b[4 + (sub >> 1)] >> (4 * (sub & 1))) & 0xF) | (((sh >> (2 * sub)) & 3) << 4);
    u.s[0] = u.s[1] = h2f(rd16(b)) * (float)(ls - 32);
    u.m[0] = u.m[1] = 0.f;
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_IQ2_XXS>(const uint8_t *b, int sub, unit_i8_t &u) {
    const uint8_t *q = b + 2 + 8 * sub;
    uint32_t aux1 = rd32(q + 4);
MLACU_UNROLL
    for (int l = 0; l < 4; l++) {
        const uint8_t *g = MLACU_TAB(g_iq2xxs_grid, quant_iq2xxs_grid)[q[l]];
        uint32_t s = MLACU_TAB(g_ksigns, quant_ksigns)[(aux1 >> (7 * l)) & 127];
        u.q[2 * l] = signs4(grid4(g), s);
        u.q[2 * l + 1] = signs4(grid4(g + 4), s >> 4);
    }
    u.s[0] = u.s[1] = h2f(rd16(b)) * (0.5f + (float)(aux1 >> 28)) * 0.25f;
    u.m[0] = u.m[1] = 0.f;
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_IQ2_XS>(const uint8_t *b, int sub, unit_i8_t &u) {
MLACU_UNROLL
    for (int l = 0; l < 4; l++) {
        uint32_t w = rd16(b + 2 + 2 * (4 * sub + l));
        const uint8_t *g = MLACU_TAB(g_iq2xs_grid, quant_iq2xs_grid)[w & 511];
        uint32_t s = MLACU_TAB(g_ksigns, quant_ksigns)[w >> 9];
        u.q[2 * l] = signs4(grid4(g), s);
        u.q[2 * l + 1] = signs4(grid4(g + 4), s >> 4);
    }
    float d = h2f(rd16(b));
    int sc = b[66 + sub];
    u.s[0] = d * (0.5f + (float)(sc & 0xF)) * 0.25f;
    u.s[1] = d * (0.5f + (float)(sc >> 4)) * 0.25f;
    u.m[0] = u.m[1] = 0.f;
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_IQ2_S>(const uint8_t *b, int sub, unit_i8_t &u) {
    const uint8_t *qs = b + 2 + 4 * sub, *signs = b + 34 + 4 * sub;
    int qh = b[66 + sub], sc = b[74 + sub];
MLACU_UNROLL
    for (int l = 0; l < 4; l++) {
        const uint8_t *g = MLACU_TAB(g_iq2s_grid, quant_iq2s_grid)[qs[l] | (((qh >> (2 * l)) & 3) << 8)];
        uint32_t s = signs[l];
        u.q[2 * l] = signs4(grid4(g), s);
        u.q[2 * l + 1] = signs4(grid4(g + 4), s >> 4);
    }
    float d = h2f(rd16(b));
    u.s[0] = d * (0.5f + (float)(sc & 0xF)) * 0.25f;
    u.s[1] = d * (0.5f + (float)(sc >> 4)) * 0.25f;
    u.m[0] = u.m[1] = 0.f;
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_IQ3_XXS>(const uint8_t *b, int sub, unit_i8_t &u) {
    const uint8_t *qs = b + 2 + 8 * sub;
    uint32_t aux = rd32(b + 66 + 4 * sub);
MLACU_UNROLL
    for (int l = 0; l < 4; l++) {
        uint32_t s = MLACU_TAB(g_ksigns, quant_ksigns)[(aux >> (7 * l)) & 127];
        u.q[2 * l] = signs4(grid4(MLACU_TAB(g_iq3xxs_grid, quant_iq3xxs_grid)[qs[2 * l]]), s);
        u.q[2 * l + 1] = signs4(grid4(MLACU_TAB(g_iq3xxs_grid, quant_iq3xxs_grid)[qs[2 * l + 1]]), s >> 4);
    }
    u.s[0] = u.s[1] = h2f(rd16(b)) * (0.5f + (float)(aux >> 28)) * 0.5f;
    u.m[0] = u.m[1] = 0.f;
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_IQ3_S>(const uint8_t *b, int sub, unit_i8_t &u) {
    const uint8_t *qs = b + 2 + 8 * sub, *signs = b + 74 + 4 * sub;
    int qh = b[66 + sub];
MLACU_UNROLL
    for (int g = 0; g < 8; g++) {
        int idx = qs[g] | (((qh >> g) & 1) << 8);
        u.q[g] = signs4(grid4(MLACU_TAB(g_iq3s_grid, quant_iq3s_grid)[idx]), signs[g >> 1] >> (4 * (g & 1)));
    }
    u.s[0] = u.s[1] = h2f(rd16(b)) * (float)(1 + 2 * ((b[106 + (sub >> 1)] >> (4 * (sub & 1))) & 0xF));
    u.m[0] = u.m[1] = 0.f;
}
/* IQ1: element = dl * (g + delta), g in {-1, 0, 1}, delta = +-1/8: q = 8 g +- 1, scale dl / 8 */
__host__ __device__ __forceinline__ uint32_t iq1_word(uint32_t g, bool neg) {
    uint32_t v = (g << 3) & 0xF8F8F8F8u; /* 8 g per byte */
    return neg ? vsub4(v, 0x01010101u) : vsub4(v, 0xFFFFFFFFu);
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_IQ1_S>(const uint8_t *b, int sub, unit_i8_t &u) {
    const uint8_t *qs = b + 2 + 4 * sub;
    uint32_t qh = rd16(b + 34 + 2 * sub);
    const bool neg = (qh & 0x8000) != 0;
MLACU_UNROLL
    for (int l = 0; l < 4; l++) {
        const int8_t *g = MLACU_TAB(g_iq1s_grid, quant_iq1s_grid)[qs[l] | (((qh >> (3 * l)) & 7) << 8)];
        u.q[2 * l] = iq1_word(grid4((const uint8_t *)g), neg);
        u.q[2 * l + 1] = iq1_word(grid4((const uint8_t *)g + 4), neg);
    }
    u.s[0] = u.s[1] = h2f(rd16(b)) * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f;
    u.m[0] = u.m[1] = 0.f;
}
template <>
__host__ __device__ __forceinline__ void unit_i8<GGML_TYPE_IQ1_M>(const uint8_t *b, int sub, unit_i8_t &u) {
    const uint8_t *qs = b + 4 * sub, *qh = b + 32 + 2 * sub;
    uint32_t s0 = rd16(b + 48), s1 = rd16(b + 50), s2 = rd16(b + 52), s3 = rd16(b + 54);
    float d = h2f((s0 >> 12) | ((s1 >> 8) & 0xF0) | ((s2 >> 4) & 0xF00) | (s3 & 0xF000));
    uint32_t w = rd16(b + 48 + 2 * (sub >> 1));
    int shw = 6 * (sub & 1);
MLACU_UNROLL
    for (int g = 0; g < 4; g++) {
        int hb = qh[g >> 1] >> (4 * (g & 1));
        const int8_t *gr = MLACU_TAB(g_iq1s_grid, quant_iq1s_grid)[qs[g] | ((hb & 7) << 8)];
        u.q[2 * g] = iq1_word(grid4((const uint8_t *)gr), (hb & 8) != 0);
        u.q[2 * g + 1] = iq1_word(grid4((const uint8_t *)gr + 4), (hb & 8) != 0);
    }
    u.s[0] = d * (float)(2 * ((w >> shw) & 7) + 1) * 0.125f;
    u.s[1] = d * (float)(2 * ((w >> (shw + 3)) & 7) + 1) * 0.125f;
    u.m[0] = u.m[1] = 0.f;
}
/* float types: no integer form (never called; keeps the type switch uniform) */
#define MLACU_NO_I8(T_)                                                                          \
    template <>                                                                                  \
    __host__ __device__ __forceinline__ void unit_i8<T_>(const uint8_t *, int, unit_i8_t &u) {  \
        for (int j = 0; j < 8; j++) u.q[j] = 0;                                                  \
        u.s[0] = u.s[1] = u.m[0] = u.m[1] = 0.f;                                                 \
    }
MLACU_NO_I8(GGML_TYPE_F32)
MLACU_NO_I8(GGML_TYPE_F16)
MLACU_NO_I8(GGML_TYPE_BF16)
#undef MLACU_NO_I8

} // namespace mlacu

#endif
