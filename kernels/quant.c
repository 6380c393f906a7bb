/* quant: conversions, dispatch, the plain types (F32/F16/BF16) and the 32-element block types
 * (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4) plus Q8_K, TQ1_0, TQ2_0.
 * Formats follow gguf-py's gguf/quants.py (dequantize_blocks); the arithmetic is done in the same
 * order there (float32, no fused multiply-add) so results are bit-identical. */
#include "quant.h"

#include "common/mla_err.h"
#include "quant_grids.h"
#include "quant_impl.h"

/* ---- conversions ---- */

float quant_fp16_to_f32(uint16_t h) { return quant_h2f(h); }

uint16_t quant_f32_to_fp16(float f) {
    uint32_t x = quant_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu)); /* quiet NaN */
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (x >= 0x38800000u) {                                  /* normal half */
        uint32_t y = x - 0x38000000u;                        /* rebias exponent 127 -> 15 */
        return (uint16_t)(sign | ((y + 0xfffu + ((y >> 13) & 1u)) >> 13));
    }
    /* subnormal half (or zero): value in units of 2^-24, round half to even */
    uint32_t e = x >> 23;
    if (e < 102) return sign; /* below 2^-25: rounds to zero (2^-25 itself ties to 0 too) */
    uint32_t m = (x & 0x7fffffu) | 0x800000u;
    uint32_t s = 126 - e; /* 14..24 */
    uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
    q += (rem > half) || (rem == half && (q & 1u));
    return (uint16_t)(sign | q);
}

float quant_bf16_to_f32(uint16_t h) { return quant_bits_f32((uint32_t)h << 16); }

uint16_t quant_f32_to_bf16(float f) {
    uint32_t u = quant_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64u); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* ---- 32-element blocks ---- */

static inline void quant_blk_q4_0(const uint8_t *b, float *y) { /* d, qs[16] */
    float d = quant_rdh(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((int)(qs[j] & 15) - 8);
        y[j + 16] = d * (float)((int)(qs[j] >> 4) - 8);
    }
}

static inline void quant_blk_q4_1(const uint8_t *b, float *y) { /* d, m, qs[16] */
    float d = quant_rdh(b), m = quant_rdh(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(qs[j] & 15) + m;
        y[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

/* 1 << j (a table lookup instead of a per-lane variable shift, which SSE2 cannot vectorize) */
static const uint32_t quant_bit[32] = {
    1u << 0, 1u << 1, 1u << 2, 1u << 3, 1u << 4, 1u << 5, 1u << 6, 1u << 7, 1u << 8, 1u << 9, 1u << 10,
    1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15, 1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20,
    1u << 21, 1u << 22, 1u << 23, 1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30,
    1u << 31};

static inline void quant_blk_q5_0(const uint8_t *b, float *y) { /* d, qh u32, qs[16] */
    float d = quant_rdh(b);
    uint32_t qh = quant_rd32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int lo = (int)((qs[j] & 15u) | ((qh & quant_bit[j]) ? 16u : 0u));
        int hi = (int)((qs[j] >> 4) | ((qh & quant_bit[j + 16]) ? 16u : 0u));
        y[j] = d * (float)(lo - 16);
        y[j + 16] = d * (float)(hi - 16);
    }
}

static inline void quant_blk_q5_1(const uint8_t *b, float *y) { /* d, m, qh u32, qs[16] */
    float d = quant_rdh(b), m = quant_rdh(b + 2);
    uint32_t qh = quant_rd32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        uint32_t lo = (qs[j] & 15u) | ((qh & quant_bit[j]) ? 16u : 0u);
        uint32_t hi = (qs[j] >> 4) | ((qh & quant_bit[j + 16]) ? 16u : 0u);
        y[j] = d * (float)lo + m;
        y[j + 16] = d * (float)hi + m;
    }
}

static inline void quant_blk_q8_0(const uint8_t *b, float *y) { /* d, int8 qs[32] */
    float d = quant_rdh(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) y[j] = (float)qs[j] * d;
}

static inline void quant_blk_iq4_nl(const uint8_t *b, float *y) { /* d, qs[16] */
    float d = quant_rdh(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)quant_kvalues_iq4nl[qs[j] & 15];
        y[j + 16] = d * (float)quant_kvalues_iq4nl[qs[j] >> 4];
    }
}

/* e8m0 exponent byte -> 2^(e-127) / 2 (the value table is doubled) */
static inline float quant_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? (0x00200000u << e) : ((uint32_t)(e - 1) << 23);
    return quant_bits_f32(bits);
}

static inline void quant_blk_mxfp4(const uint8_t *b, float *y) { /* e8m0, qs[16] */
    float d = quant_e8m0_half(b[0]);
    const uint8_t *qs = b + 1;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)quant_kvalues_mxfp4[qs[j] & 15];
        y[j + 16] = d * (float)quant_kvalues_mxfp4[qs[j] >> 4];
    }
}

/* ---- 256-element blocks that are not K-quants ---- */

static inline void quant_blk_q8_k(const uint8_t *b, float *y) { /* f32 d, int8 qs[256], bsums */
    float d = quant_bits_f32(quant_rd32(b));
    const int8_t *qs = (const int8_t *)(b + 4);
    for (int j = 0; j < 256; j++) y[j] = d * (float)qs[j];
}

/* TQ1_0: qs[48] holding 5 base-3 digits per byte (as a fraction of 256), qh[4] holding 4,
 * then d. Digit p of byte q is ((uint8)(q * 3^p) * 3) >> 8. */
static inline void quant_blk_tq1_0(const uint8_t *b, float *y) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    const uint8_t *qs = b, *qh = b + 48;
    float d = quant_rdh(b + 52);
    for (int p = 0; p < 5; p++) {
        for (int l = 0; l < 32; l++) {
            uint8_t q = (uint8_t)(qs[l] * pow3[p]);
            y[32 * p + l] = d * (float)((int)(((uint16_t)q * 3u) >> 8) - 1);
        }
        for (int l = 0; l < 16; l++) {
            uint8_t q = (uint8_t)(qs[32 + l] * pow3[p]);
            y[160 + 16 * p + l] = d * (float)((int)(((uint16_t)q * 3u) >> 8) - 1);
        }
    }
    for (int p = 0; p < 4; p++)
        for (int l = 0; l < 4; l++) {
            uint8_t q = (uint8_t)(qh[l] * pow3[p]);
            y[240 + 4 * p + l] = d * (float)((int)(((uint16_t)q * 3u) >> 8) - 1);
        }
}

static inline void quant_blk_tq2_0(const uint8_t *b, float *y) { /* qs[64] 2-bit, d */
    float d = quant_rdh(b + 64);
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int l = 0; l < 32; l++)
                y[128 * h + 32 * s + l] = d * (float)((int)((b[32 * h + l] >> (2 * s)) & 3) - 1);
}

QUANT_DEFINE_ROW_FNS(q4_0, 32, 18)
QUANT_DEFINE_ROW_FNS(q4_1, 32, 20)
QUANT_DEFINE_ROW_FNS(q5_0, 32, 22)
QUANT_DEFINE_ROW_FNS(q5_1, 32, 24)
QUANT_DEFINE_ROW_FNS(q8_0, 32, 34)
QUANT_DEFINE_ROW_FNS(iq4_nl, 32, 18)
QUANT_DEFINE_ROW_FNS(mxfp4, 32, 17)
QUANT_DEFINE_ROW_FNS(q8_k, 256, 292)
QUANT_DEFINE_ROW_FNS(tq1_0, 256, 54)
QUANT_DEFINE_ROW_FNS(tq2_0, 256, 66)

/* ---- plain types ---- */

/* Rows of plain types: 16 elements at a time converted into a float buffer, then the tail. */
#define QUANT_PLAIN_DOT(name, ESZ, CONV)                                                     \
    static float quant_dot_##name(const uint8_t *a, const float *x, int64_t n) {            \
        quant_acc acc = {{0}, {0}, {0}, {0}};                                                \
        int64_t i = 0;                                                                       \
        for (; i + QUANT_LANES <= n; i += QUANT_LANES) {                                     \
            uint8_t raw[QUANT_LANES * (ESZ)];                                                \
            float buf[QUANT_LANES];                                                          \
            memcpy(raw, a + (ESZ) * i, sizeof raw);                                          \
            for (int k = 0; k < QUANT_LANES; k++) buf[k] = CONV(raw + (ESZ) * k);            \
            quant_acc16(&acc, buf, x + i);                                                   \
        }                                                                                    \
        float buf[QUANT_LANES] = {0}, xt[QUANT_LANES] = {0};                                 \
        for (int k = 0; i + k < n; k++) {                                                    \
            buf[k] = CONV(a + (ESZ) * (i + k));                                              \
            xt[k] = x[i + k];                                                                \
        }                                                                                    \
        quant_acc16(&acc, buf, xt);                                                          \
        return quant_acc_sum(&acc);                                                          \
    }

static inline float quant_rdf32(const uint8_t *p) { return quant_bits_f32(quant_rd32(p)); }
static inline float quant_rdbf16(const uint8_t *p) { return quant_bits_f32((uint32_t)quant_rd16(p) << 16); }

QUANT_PLAIN_DOT(f32, 4, quant_rdf32)
QUANT_PLAIN_DOT(f16, 2, quant_rdh)
QUANT_PLAIN_DOT(bf16, 2, quant_rdbf16)

/* ---- dispatch ---- */

typedef void (*quant_deq_fn)(const uint8_t *, float *, int64_t);
typedef float (*quant_dot_fn)(const uint8_t *, const float *, int64_t);

typedef struct quant_kind {
    quant_deq_fn deq;
    quant_dot_fn dot;
} quant_kind;

static const quant_kind k_kinds[GGML_TYPE_COUNT] = {
#define QUANT_KIND(T, name) [GGML_TYPE_##T] = {quant_deq_##name, quant_dot_##name},
    QUANT_KIND(Q4_0, q4_0) QUANT_KIND(Q4_1, q4_1) QUANT_KIND(Q5_0, q5_0) QUANT_KIND(Q5_1, q5_1)
    QUANT_KIND(Q8_0, q8_0) QUANT_KIND(Q8_K, q8_k) QUANT_KIND(IQ4_NL, iq4_nl)
    QUANT_KIND(MXFP4, mxfp4) QUANT_KIND(TQ1_0, tq1_0) QUANT_KIND(TQ2_0, tq2_0)
    QUANT_KIND(Q2_K, q2_k) QUANT_KIND(Q3_K, q3_k) QUANT_KIND(Q4_K, q4_k) QUANT_KIND(Q5_K, q5_k)
    QUANT_KIND(Q6_K, q6_k) QUANT_KIND(IQ4_XS, iq4_xs) QUANT_KIND(IQ2_XXS, iq2_xxs)
    QUANT_KIND(IQ2_XS, iq2_xs) QUANT_KIND(IQ2_S, iq2_s) QUANT_KIND(IQ3_XXS, iq3_xxs)
    QUANT_KIND(IQ3_S, iq3_s) QUANT_KIND(IQ1_S, iq1_s) QUANT_KIND(IQ1_M, iq1_m)
#undef QUANT_KIND
};

bool quant_supported(uint32_t t) {
    if (t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16) return true;
    return t < GGML_TYPE_COUNT && k_kinds[t].deq != NULL && ggml_type_get(t) != NULL;
}

static int64_t quant_check(uint32_t t, int64_t n, const char *what) {
    const ggml_type_info *ti = ggml_type_get(t);
    if (!quant_supported(t)) MLA_PANIC("%s: unsupported type %s", what, ggml_type_name(t));
    if (n < 0 || n % ti->block_elems)
        MLA_PANIC("%s: n=%lld is not a multiple of the %s block size %u", what, (long long)n,
                  ti->name, ti->block_elems);
    return n / ti->block_elems;
}

void quant_dequant_row(uint32_t t, const void *src, float *dst, int64_t n) {
    int64_t nb = quant_check(t, n, "quant_dequant_row");
    const uint8_t *s = src;
    switch (t) {
    case GGML_TYPE_F32:
        if (n) memcpy(dst, src, (size_t)n * 4);
        return;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = quant_rdh(s + 2 * i);
        return;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = quant_rdbf16(s + 2 * i);
        return;
    default:
        k_kinds[t].deq(s, dst, nb);
    }
}

float quant_dot_row(uint32_t t, const void *row, const float *x, int64_t n) {
    int64_t nb = quant_check(t, n, "quant_dot_row");
    switch (t) {
    case GGML_TYPE_F32: return quant_dot_f32(row, x, n);
    case GGML_TYPE_F16: return quant_dot_f16(row, x, n);
    case GGML_TYPE_BF16: return quant_dot_bf16(row, x, n);
    default: return k_kinds[t].dot(row, x, nb);
    }
}
