/* cuda_rand: random inputs for the CUDA op checks (cuda_selfcheck.cu, tests/gpu) (header-only, C and C++). Quantized rows are
 * random bytes (every bit pattern of the quants, signs and grid indices) with the half-float
 * scale fields replaced by sane random values, so that every row dequantizes to finite
 * numbers. No ownership: callers own all buffers. */
#ifndef CUDA_RAND_H
#define CUDA_RAND_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "common/ggml_types.h"
#include "kernels/quant.h"
#ifdef __cplusplus
}
#endif

typedef struct gr_rng {
    uint64_t s;
} gr_rng;

static inline uint64_t gr_u64(gr_rng *r) { /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* uniform in [-1, 1) */
static inline float gr_uni(gr_rng *r) { return (float)((gr_u64(r) >> 40) * (1.0 / 8388608.0)) - 1.0f; }
/* approximately standard normal (sum of 4 uniforms, scaled) */
static inline float gr_norm(gr_rng *r) {
    return (gr_uni(r) + gr_uni(r) + gr_uni(r) + gr_uni(r)) * 0.8660254f;
}
static inline void gr_fill(gr_rng *r, float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = gr_norm(r) * scale;
}

static inline void gr_put_half(uint8_t *p, float f) {
    uint16_t h = quant_f32_to_fp16(f);
    memcpy(p, &h, 2);
}

/* Fill `rows` rows of n elements of type t (ggml_row_bytes(t, n) bytes each, back to back). */
static inline void gr_quant_rows(gr_rng *r, uint32_t t, uint8_t *dst, int64_t n, int64_t rows) {
    const ggml_type_info *ti = ggml_type_get(t);
    int64_t nel = n * rows;
    if (t == GGML_TYPE_F32) {
        for (int64_t i = 0; i < nel; i++) {
            float f = gr_norm(r);
            memcpy(dst + 4 * i, &f, 4);
        }
        return;
    }
    if (t == GGML_TYPE_F16 || t == GGML_TYPE_BF16) {
        for (int64_t i = 0; i < nel; i++) {
            float f = gr_norm(r);
            uint16_t h = t == GGML_TYPE_F16 ? quant_f32_to_fp16(f) : quant_f32_to_bf16(f);
            memcpy(dst + 2 * i, &h, 2);
        }
        return;
    }
    int64_t nb = nel / ti->block_elems;
    size_t bb = ti->block_bytes;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = dst + (size_t)b * bb;
        for (size_t i = 0; i < bb; i += 8) {
            uint64_t v = gr_u64(r);
            memcpy(p + i, &v, bb - i < 8 ? bb - i : 8);
        }
        /* scales: magnitude ~ 1/(typical |q|) so outputs are O(1) */
        float d = (0.5f + 0.5f * (gr_uni(r) + 1.0f)) * 0.02f;
        float dmin = (0.5f + 0.5f * (gr_uni(r) + 1.0f)) * 0.02f;
        switch (t) {
        case GGML_TYPE_Q8_0: case GGML_TYPE_Q5_0: case GGML_TYPE_IQ4_XS: case GGML_TYPE_IQ2_XXS:
        case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S: case GGML_TYPE_IQ3_XXS: case GGML_TYPE_IQ3_S:
        case GGML_TYPE_IQ1_S: case GGML_TYPE_Q4_0: case GGML_TYPE_IQ4_NL:
            gr_put_half(p, d);
            break;
        case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1:
            gr_put_half(p, d);
            gr_put_half(p + 2, dmin);
            break;
        case GGML_TYPE_Q2_K:
            gr_put_half(p + 80, d);
            gr_put_half(p + 82, dmin);
            break;
        case GGML_TYPE_Q3_K: gr_put_half(p + 108, d); break;
        case GGML_TYPE_Q6_K: gr_put_half(p + 208, d); break;
        case GGML_TYPE_IQ1_M: { /* the half scale is the top nibbles of the 4 scale words */
            uint16_t h = quant_f32_to_fp16(d);
            for (int k = 0; k < 4; k++) {
                uint16_t w;
                memcpy(&w, p + 48 + 2 * k, 2);
                w = (uint16_t)((w & 0x0fff) | (((h >> (4 * k)) & 0xf) << 12));
                memcpy(p + 48 + 2 * k, &w, 2);
            }
            break;
        }
        default: break;
        }
    }
}

/* ||a - b|| / ||b|| over n floats; returns INFINITY when any a is NaN/inf. */
static inline double gr_rel_l2(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* What mla_cuda_quantize_q8 makes of x (n a multiple of 32), back in floats, in place or not:
 * per 32 elements d * round(x * id), d = max|x| / 127, id = 127 / max|x|, with the same float
 * operations: the exact input of the integer GEMV, so the reference of its checks. */
static inline void gr_q8_round(const float *x, float *out, int64_t n) {
    for (int64_t b = 0; b + 32 <= n; b += 32) {
        float amax = 0.f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b + i]));
        const float d = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
        for (int i = 0; i < 32; i++) out[b + i] = d * (float)(int)nearbyintf(x[b + i] * id);
    }
}

/* The reference of the per-head products (mla_cuda_head_matmul) on packed rows, double sums:
 * y[t][h][o] = sum_i w[h][o][i] * x[t][h][i]. */
static inline void gr_head_matmul_ref(const float *w, const float *x, int64_t T, int64_t H, int64_t in, int64_t out,
                                      float *y) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t o = 0; o < out; o++) {
                double s = 0;
                for (int64_t i = 0; i < in; i++) s += (double)w[(h * out + o) * in + i] * x[(t * H + h) * in + i];
                y[(t * H + h) * out + o] = (float)s;
            }
}

#endif
