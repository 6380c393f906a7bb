/* quant_iq: the codebook ("i-quant") block types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
 * IQ1_S, IQ1_M (256 elements per block). Grids come from quant_grids.c (generated from gguf-py).
 * Layouts and arithmetic order follow gguf-py's gguf/quants.py (see quant.c). */
#include "quant_grids.h"
#include "quant_impl.h"

/* 8 values of grid row g times db with signs from the 8 bits of s (set: negative). The sign is
 * applied by flipping the float sign bit (same result as negation, and no branch). */
static inline void quant_put8(float *y, float db, const uint8_t *g, uint32_t s) {
    for (int j = 0; j < 8; j++) {
        float v = db * (float)g[j];
        y[j] = quant_bits_f32(quant_f32_bits(v) ^ (((s >> j) & 1u) << 31));
    }
}

/* IQ2_XXS: d, then 8 sub-blocks of two u32: aux0 = 4 grid indices (bytes), aux1 = 4 x 7-bit sign
 * indices + 4-bit scale in the top bits. */
static inline void quant_blk_iq2_xxs(const uint8_t *b, float *y) {
    float d = quant_rdh(b);
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *aux0 = b + 2 + 8 * ib;
        uint32_t aux1 = quant_rd32(b + 2 + 8 * ib + 4);
        float db = d * (0.5f + (float)(aux1 >> 28)) * 0.25f;
        for (int l = 0; l < 4; l++)
            quant_put8(y + 32 * ib + 8 * l, db, quant_iq2xxs_grid[aux0[l]], quant_ksigns[(aux1 >> (7 * l)) & 127]);
    }
}

/* IQ2_XS: d, qs u16[32] (9-bit grid index, 7-bit sign index), scales[8] (16 nibbles). */
static inline void quant_blk_iq2_xs(const uint8_t *b, float *y) {
    float d = quant_rdh(b);
    const uint8_t *sc = b + 66;
    for (int k = 0; k < 16; k++) {
        float db = d * (0.5f + (float)((sc[k >> 1] >> (4 * (k & 1))) & 15)) * 0.25f;
        for (int m = 0; m < 2; m++) {
            uint16_t q = quant_rd16(b + 2 + 2 * (2 * k + m));
            quant_put8(y + 16 * k + 8 * m, db, quant_iq2xs_grid[q & 511], quant_ksigns[q >> 9]);
        }
    }
}

/* IQ2_S: d, qs[32] (low 8 bits of the grid index), signs[32], qh[8] (2 high bits each),
 * scales[8] (16 nibbles). */
static inline void quant_blk_iq2_s(const uint8_t *b, float *y) {
    float d = quant_rdh(b);
    const uint8_t *qs = b + 2, *sg = b + 34, *qh = b + 66, *sc = b + 74;
    for (int k = 0; k < 16; k++) {
        float db = d * (0.5f + (float)((sc[k >> 1] >> (4 * (k & 1))) & 15)) * 0.25f;
        for (int m = 0; m < 2; m++) {
            int g = 2 * k + m;
            int idx = qs[g] | (((qh[g >> 2] >> (2 * (g & 3))) & 3) << 8);
            quant_put8(y + 8 * g, db, quant_iq2s_grid[idx], sg[g]);
        }
    }
}

/* IQ3_XXS: d, qs[64] grid indices (4 values each), then 8 u32: 4 x 7-bit sign indices and a
 * 4-bit scale. */
static inline void quant_blk_iq3_xxs(const uint8_t *b, float *y) {
    float d = quant_rdh(b);
    const uint8_t *qs = b + 2;
    for (int ib = 0; ib < 8; ib++) {
        uint32_t s = quant_rd32(b + 66 + 4 * ib);
        float db = d * (0.5f + (float)(s >> 28)) * 0.5f;
        for (int l = 0; l < 4; l++) {
            uint8_t g8[8];
            memcpy(g8, quant_iq3xxs_grid[qs[8 * ib + 2 * l]], 4);
            memcpy(g8 + 4, quant_iq3xxs_grid[qs[8 * ib + 2 * l + 1]], 4);
            quant_put8(y + 32 * ib + 8 * l, db, g8, quant_ksigns[(s >> (7 * l)) & 127]);
        }
    }
}

/* IQ3_S: d, qs[64] (low 8 bits of 9-bit grid indices), qh[8], signs[32], scales[4] (8 nibbles,
 * scale 1 + 2s). */
static inline void quant_blk_iq3_s(const uint8_t *b, float *y) {
    float d = quant_rdh(b);
    const uint8_t *qs = b + 2, *qh = b + 66, *sg = b + 74, *sc = b + 106;
    for (int k = 0; k < 8; k++) {
        float db = d * (float)(1 + 2 * ((sc[k >> 1] >> (4 * (k & 1))) & 15));
        for (int l = 0; l < 4; l++) {
            int m0 = 8 * k + 2 * l, m1 = m0 + 1;
            int i0 = qs[m0] | (((qh[k] >> (2 * l)) & 1) << 8);
            int i1 = qs[m1] | (((qh[k] >> (2 * l + 1)) & 1) << 8);
            uint8_t g8[8];
            memcpy(g8, quant_iq3s_grid[i0], 4);
            memcpy(g8 + 4, quant_iq3s_grid[i1], 4);
            quant_put8(y + 32 * k + 8 * l, db, g8, sg[4 * k + l]);
        }
    }
}

/* 8 values (grid + delta) * dl of the IQ1 grid row g. */
static inline void quant_put8_iq1(float *y, float dl, float delta, const int8_t *g) {
    for (int j = 0; j < 8; j++) y[j] = dl * ((float)g[j] + delta);
}

/* IQ1_S: d, qs[32] (low 8 bits of 11-bit grid indices), qh u16[8]: 4 x 3 high index bits,
 * 3-bit scale (bits 12-14), delta sign (bit 15). */
static inline void quant_blk_iq1_s(const uint8_t *b, float *y) {
    float d = quant_rdh(b);
    const uint8_t *qs = b + 2;
    for (int ib = 0; ib < 8; ib++) {
        uint16_t h = quant_rd16(b + 34 + 2 * ib);
        float dl = d * (float)(2 * ((h >> 12) & 7) + 1);
        float delta = (h & 0x8000u) ? -0.125f : 0.125f;
        for (int l = 0; l < 4; l++) {
            int idx = qs[4 * ib + l] | (((h >> (3 * l)) & 7) << 8);
            quant_put8_iq1(y + 32 * ib + 8 * l, dl, delta, quant_iq1s_grid[idx]);
        }
    }
}

/* IQ1_M: qs[32], qh[16] (per nibble: 3 high index bits + delta sign), scales u16[4]: 16 x 3-bit
 * scales in the low 12 bits, the fp16 d spread over the four top nibbles. */
static inline void quant_blk_iq1_m(const uint8_t *b, float *y) {
    const uint8_t *qs = b, *qh = b + 32;
    uint16_t sc[4];
    for (int i = 0; i < 4; i++) sc[i] = quant_rd16(b + 48 + 2 * i);
    uint16_t dbits = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0u) | ((sc[2] >> 4) & 0x0f00u) |
                                (sc[3] & 0xf000u));
    float d = quant_h2f(dbits);
    for (int k = 0; k < 16; k++) { /* 16 groups of 16 */
        float dl = d * (float)(2 * ((sc[k >> 2] >> (3 * (k & 3))) & 7) + 1);
        for (int u = 0; u < 2; u++) {
            int g = 2 * k + u;
            int v = (qh[g >> 1] >> (4 * (g & 1))) & 15;
            int idx = qs[g] | ((v & 7) << 8);
            float delta = (v & 8) ? -0.125f : 0.125f;
            quant_put8_iq1(y + 8 * g, dl, delta, quant_iq1s_grid[idx]);
        }
    }
}

QUANT_DEFINE_ROW_FNS(iq2_xxs, 256, 66)
QUANT_DEFINE_ROW_FNS(iq2_xs, 256, 74)
QUANT_DEFINE_ROW_FNS(iq2_s, 256, 82)
QUANT_DEFINE_ROW_FNS(iq3_xxs, 256, 98)
QUANT_DEFINE_ROW_FNS(iq3_s, 256, 110)
QUANT_DEFINE_ROW_FNS(iq1_s, 256, 50)
QUANT_DEFINE_ROW_FNS(iq1_m, 256, 56)
