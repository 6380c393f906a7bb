/* quant_k: the K-quant block types Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256 elements per block) and
 * IQ4_XS. Layouts and arithmetic order follow gguf-py's gguf/quants.py (see quant.c). */
#include "quant_grids.h"
#include "quant_impl.h"

/* Q2_K: scales[16] (low nibble scale, high nibble min), qs[64] 2-bit, d, dmin.
 * Element 128h + 32s + l is bits 2s of qs[32h + l]; group of 16 elements g uses scales[g]. */
static inline void quant_blk_q2_k(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *qs = b + 16;
    float d = quant_rdh(b + 80), dmin = quant_rdh(b + 82);
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int half = 0; half < 2; half++) {
                int g = 8 * h + 2 * s + half;
                float dl = d * (float)(sc[g] & 15), ml = dmin * (float)(sc[g] >> 4);
                float *yy = y + 16 * g;
                const uint8_t *q = qs + 32 * h + 16 * half;
                for (int l = 0; l < 16; l++) yy[l] = dl * (float)((q[l] >> (2 * s)) & 3) - ml;
            }
}

/* Q3_K: hmask[32], qs[64] 2-bit, scales[12] (16 6-bit signed scales), d.
 * Element i = 128h + 32s + l: low bits (qs[32h + l] >> 2s) & 3, high bit (hmask[l] >> (i/32)) & 1;
 * q = low - 4 when the high bit is clear. */
static inline void quant_blk_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    float d = quant_rdh(b + 108);
    float dl[16];
    for (int k = 0; k < 16; k++) {
        int lo = k < 8 ? (sc[k] & 15) : (sc[k - 8] >> 4);
        int hi = (sc[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
        dl[k] = d * (float)((lo | (hi << 4)) - 32);
    }
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++) {
            int blk = 4 * h + s; /* 32-element group, also the hmask bit */
            for (int half = 0; half < 2; half++) {
                float dd = dl[2 * blk + half];
                for (int l = 16 * half; l < 16 * half + 16; l++) {
                    int q = ((qs[32 * h + l] >> (2 * s)) & 3) - 4 + 4 * ((hm[l] >> blk) & 1);
                    y[32 * blk + l] = dd * (float)q;
                }
            }
        }
}

/* 6-bit scales and mins of Q4_K / Q5_K packed in 12 bytes. */
static inline void quant_k_scale_min(const uint8_t *s, float d, float dmin, float *D, float *M) {
    for (int j = 0; j < 4; j++) {
        D[j] = d * (float)(s[j] & 63);
        M[j] = dmin * (float)(s[j + 4] & 63);
        D[j + 4] = d * (float)((s[j + 8] & 15) | ((s[j] >> 2) & 0x30));
        M[j + 4] = dmin * (float)((s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30));
    }
}

/* Q4_K: d, dmin, scales[12], qs[128]. Element 64c + 32t + l = nibble t of qs[32c + l],
 * sub-block 2c + t. */
static inline void quant_blk_q4_k(const uint8_t *b, float *y) {
    float D[8], M[8];
    quant_k_scale_min(b + 4, quant_rdh(b), quant_rdh(b + 2), D, M);
    const uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++)
        for (int t = 0; t < 2; t++) {
            float dd = D[2 * c + t], mm = M[2 * c + t];
            float *yy = y + 64 * c + 32 * t;
            for (int l = 0; l < 32; l++) yy[l] = dd * (float)((qs[32 * c + l] >> (4 * t)) & 15) - mm;
        }
}

/* Q5_K: d, dmin, scales[12], qh[32], qs[128]; fifth bit of element i is (qh[i%32] >> i/32) & 1. */
static inline void quant_blk_q5_k(const uint8_t *b, float *y) {
    float D[8], M[8];
    quant_k_scale_min(b + 4, quant_rdh(b), quant_rdh(b + 2), D, M);
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int c = 0; c < 4; c++)
        for (int t = 0; t < 2; t++) {
            int sb = 2 * c + t;
            float dd = D[sb], mm = M[sb];
            float *yy = y + 32 * sb;
            for (int l = 0; l < 32; l++) {
                int q = ((qs[32 * c + l] >> (4 * t)) & 15) | (((qh[l] >> sb) & 1) << 4);
                yy[l] = dd * (float)q - mm;
            }
        }
}

/* Q6_K: ql[128], qh[64], int8 scales[16], d. Element i = 128h + 32s + l (s < 4):
 * low nibble (ql[64h + 32(s&1) + l] >> 4(s>>1)) & 15, high bits (qh[32h + l] >> 2s) & 3. */
static inline void quant_blk_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = quant_rdh(b + 208);
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++) {
            const uint8_t *L = ql + 64 * h + 32 * (s & 1);
            const uint8_t *H = qh + 32 * h;
            int base = 128 * h + 32 * s;
            for (int half = 0; half < 2; half++) {
                float dd = d * (float)sc[base / 16 + half];
                for (int l = 16 * half; l < 16 * half + 16; l++) {
                    int q = (((L[l] >> (4 * (s >> 1))) & 15) | (((H[l] >> (2 * s)) & 3) << 4)) - 32;
                    y[base + l] = dd * (float)q;
                }
            }
        }
}

/* IQ4_XS: d, scales_h u16, scales_l[4], qs[128]; 8 sub-blocks of 32 with 6-bit scales - 32,
 * element 16t + l of sub-block k = nibble t of qs[16k + l], mapped through kvalues_iq4nl. */
static inline void quant_blk_iq4_xs(const uint8_t *b, float *y) {
    float d = quant_rdh(b);
    uint16_t sh = quant_rd16(b + 2);
    const uint8_t *sl = b + 4, *qs = b + 8;
    for (int k = 0; k < 8; k++) {
        int ls = ((sl[k >> 1] >> (4 * (k & 1))) & 15) | (((sh >> (2 * k)) & 3) << 4);
        float dl = d * (float)(ls - 32);
        const uint8_t *q = qs + 16 * k;
        for (int l = 0; l < 16; l++) {
            y[32 * k + l] = dl * (float)quant_kvalues_iq4nl[q[l] & 15];
            y[32 * k + 16 + l] = dl * (float)quant_kvalues_iq4nl[q[l] >> 4];
        }
    }
}

QUANT_DEFINE_ROW_FNS(q2_k, 256, 84)
QUANT_DEFINE_ROW_FNS(q3_k, 256, 110)
QUANT_DEFINE_ROW_FNS(q4_k, 256, 144)
QUANT_DEFINE_ROW_FNS(q5_k, 256, 176)
QUANT_DEFINE_ROW_FNS(q6_k, 256, 210)
QUANT_DEFINE_ROW_FNS(iq4_xs, 256, 136)
