/* Unit tests of kernels/quant: half / bfloat16 conversions (exhaustive or property-based against
 * independent definitions) and quant_dot_row against a float64 dot of quant_dequant_row for every
 * supported type. Bit-exactness of the dequantization itself is checked against gguf-py by
 * tests/quant/check_dequant.py and check_fixtures.py. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/ggml_types.h"
#include "kernels/quant.h"
#include "mla_test.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
static float rndf(void) { return ((float)rnd32() / 4294967296.0f) * 2.0f - 1.0f; }
static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Half value by its definition (independent of the bit tricks in quant.c). */
static float half_def(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexpf((float)m, -24);
    else v = ldexpf((float)(1024 + m), e - 25);
    return s ? -v : v;
}

static void test_fp16_to_f32(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float got = quant_fp16_to_f32((uint16_t)h), want = half_def((uint16_t)h);
        if (isnan(want) ? !isnan(got) : f_bits(got) != f_bits(want)) bad++;
#ifdef __FLT16_MAX__
        _Float16 hf;
        uint16_t hh = (uint16_t)h;
        memcpy(&hf, &hh, 2);
        if (!isnan(want) && f_bits((float)hf) != f_bits(got)) bad++;
#endif
    }
    CHECKF(bad == 0, "%d half values convert wrongly", bad);
}

/* Nearest-even check of r = conv(f) on the target's value function val(): no neighbour is
 * closer, and on a tie r is even. Computed in double (exact for these differences). */
static int nearest_even_ok(float f, uint16_t r, float (*val)(uint16_t)) {
    double d = fabs((double)val(r) - (double)f);
    uint16_t mag = r & 0x7fff;
    for (int step = -1; step <= 1; step += 2) {
        int nm = (int)mag + step;
        if (nm < 0 || nm > 0x7f80) continue; /* bf16/half magnitude range is checked by caller */
        uint16_t nb = (uint16_t)((r & 0x8000) | nm);
        double v = val(nb);
        if (isnan(v) || isinf(v)) continue;
        double dn = fabs(v - (double)f);
        if (dn < d) return 0;
        if (dn == d && (r & 1)) return 0;
    }
    return 1;
}

static float half_val(uint16_t h) { return half_def(h); }
static float bf16_val(uint16_t h) { return bits_f((uint32_t)h << 16); }

static void test_f32_to_fp16(void) {
    /* round trip of every finite half (and inf) */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if (((h >> 10) & 31) == 31 && (h & 1023)) continue;
        if (quant_f32_to_fp16(half_def((uint16_t)h)) != h) bad++;
    }
    CHECKF(bad == 0, "%d halves do not round-trip", bad);
    /* random floats in and around the half range, plus exact ties */
    int bad_ne = 0, bad_f16 = 0;
    for (int i = 0; i < 400000; i++) {
        float f;
        if (i % 4 == 3) { /* tie between two halves */
            uint16_t h = (uint16_t)(rnd32() & 0x7bfe);
            f = (half_def(h) + half_def((uint16_t)(h + 1))) * 0.5f;
            if (rnd32() & 1) f = -f;
        } else {
            f = ldexpf(rndf(), (int)(rnd32() % 50) - 30);
        }
        uint16_t r = quant_f32_to_fp16(f);
        if (fabsf(f) < 65504.0f && !nearest_even_ok(f, r, half_val)) bad_ne++;
#ifdef __FLT16_MAX__
        _Float16 hf = (_Float16)f;
        uint16_t want;
        memcpy(&want, &hf, 2);
        if (want != r) bad_f16++;
#endif
    }
    CHECKF(bad_ne == 0, "%d floats not rounded to the nearest-even half", bad_ne);
    CHECKF(bad_f16 == 0, "%d floats convert differently from the compiler's _Float16", bad_f16);
    CHECK(quant_f32_to_fp16(65504.0f) == 0x7bff);
    CHECK(quant_f32_to_fp16(65519.99f) == 0x7bff);
    CHECK(quant_f32_to_fp16(65520.0f) == 0x7c00);
    CHECK(quant_f32_to_fp16(-INFINITY) == 0xfc00);
    CHECK(quant_f32_to_fp16(1e10f) == 0x7c00);
    CHECK(quant_f32_to_fp16(ldexpf(1.0f, -25)) == 0x0000);
    CHECK(quant_f32_to_fp16(ldexpf(1.5f, -25)) == 0x0001);
    CHECK(quant_f32_to_fp16(ldexpf(1.0f, -24)) == 0x0001);
    CHECK(quant_f32_to_fp16(-0.0f) == 0x8000);
    uint16_t hn = quant_f32_to_fp16(NAN);
    CHECK(((hn >> 10) & 31) == 31 && (hn & 1023) != 0);
}

static void test_bf16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_bf16_to_f32((uint16_t)h);
        if (f_bits(f) != h << 16) bad++;
        if (!isnan(f) && quant_f32_to_bf16(f) != h) bad++;
    }
    CHECKF(bad == 0, "%d bf16 values convert or round-trip wrongly", bad);
    int bad_ne = 0;
    for (int i = 0; i < 400000; i++) {
        uint32_t u = rnd32();
        if (i % 4 == 3) u = (u & 0xffff0000u) | 0x8000u; /* exact tie */
        float f = bits_f(u);
        if (isnan(f) || isinf(f) || fabsf(f) > 3.38e38f) continue;
        if (!nearest_even_ok(f, quant_f32_to_bf16(f), bf16_val)) bad_ne++;
    }
    CHECKF(bad_ne == 0, "%d floats not rounded to the nearest-even bf16", bad_ne);
    CHECK(quant_f32_to_bf16(INFINITY) == 0x7f80);
    CHECK(quant_f32_to_bf16(3.4e38f) == 0x7f80); /* rounds up past the largest bf16 */
    uint16_t bn = quant_f32_to_bf16(bits_f(0x7f800001u));
    CHECK((bn & 0x7f80) == 0x7f80 && (bn & 0x7f) != 0);
}

/* Random block bytes with finite scale fields (same layout knowledge as check_dequant.py). */
static uint16_t rnd_half_scale(void) {
    return quant_f32_to_fp16(ldexpf(rndf(), -(int)(rnd32() % 16)));
}
static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

static void fill_blocks(uint32_t t, uint8_t *p, int64_t nb) {
    const ggml_type_info *ti = ggml_type_get(t);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = p + b * ti->block_bytes;
        for (uint32_t i = 0; i < ti->block_bytes; i++) blk[i] = (uint8_t)rnd32();
        int o1 = -1, o2 = -1;
        switch (t) {
        case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
            o1 = 0, o2 = 2; break;
        case GGML_TYPE_Q2_K: o1 = 80, o2 = 82; break;
        case GGML_TYPE_Q3_K: o1 = 108; break;
        case GGML_TYPE_Q6_K: o1 = 208; break;
        case GGML_TYPE_TQ1_0: o1 = 52; break;
        case GGML_TYPE_TQ2_0: o1 = 64; break;
        case GGML_TYPE_MXFP4: blk[0] = (uint8_t)(100 + rnd32() % 40); break;
        case GGML_TYPE_Q8_K: { float d = rndf() * 0.01f; memcpy(blk, &d, 4); break; }
        case GGML_TYPE_IQ1_M: {
            uint16_t d = rnd_half_scale();
            for (int i = 0; i < 4; i++) {
                uint16_t s;
                memcpy(&s, blk + 48 + 2 * i, 2);
                s = (uint16_t)((s & 0x0fff) | (((d >> (4 * i)) & 15) << 12));
                memcpy(blk + 48 + 2 * i, &s, 2);
            }
            break;
        }
        case GGML_TYPE_F32: { float v = rndf() * 4; memcpy(blk, &v, 4); break; }
        case GGML_TYPE_F16: put16(blk, quant_f32_to_fp16(rndf() * 4)); break;
        case GGML_TYPE_BF16: put16(blk, quant_f32_to_bf16(rndf() * 4)); break;
        default: o1 = 0; /* Q4_0, Q5_0, Q8_0, IQ4_NL, IQ4_XS, IQ2_*, IQ3_*, IQ1_S */
        }
        if (o1 >= 0) put16(blk + o1, rnd_half_scale());
        if (o2 >= 0) put16(blk + o2, rnd_half_scale());
    }
}

static void test_dots(void) {
    static const uint32_t types[] = {
        GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
        GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
        GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_K, GGML_TYPE_IQ4_NL,
        GGML_TYPE_IQ4_XS, GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S,
        GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M, GGML_TYPE_MXFP4,
        GGML_TYPE_TQ1_0, GGML_TYPE_TQ2_0};
    static const int64_t nblocks[] = {1, 2, 3, 7, 16, 33};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t t = types[ti];
        const ggml_type_info *info = ggml_type_get(t);
        REQUIRE(quant_supported(t));
        int bad = 0;
        for (size_t k = 0; k < sizeof nblocks / sizeof nblocks[0]; k++) {
            int64_t nb = nblocks[k] * (info->block_elems == 1 ? 17 : 1); /* odd plain lengths */
            int64_t n = nb * info->block_elems;
            uint8_t *row = malloc((size_t)nb * info->block_bytes);
            float *x = malloc((size_t)n * sizeof(float)), *a = malloc((size_t)n * sizeof(float));
            REQUIRE(row && x && a);
            for (int rep = 0; rep < 4; rep++) {
                fill_blocks(t, row, nb);
                for (int64_t i = 0; i < n; i++) x[i] = rndf();
                quant_dequant_row(t, row, a, n);
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < n; i++) {
                    ref += (double)a[i] * x[i];
                    mag += fabs((double)a[i] * x[i]);
                }
                float got = quant_dot_row(t, row, x, n);
                if (!(fabs((double)got - ref) <= 1e-5 * mag + 1e-30)) {
                    if (!bad)
                        fprintf(stderr, "%s n=%lld: dot %.9g, dequant-then-dot %.9g (sum|ax| %.3g)\n",
                                info->name, (long long)n, got, ref, mag);
                    bad++;
                }
            }
            free(row);
            free(x);
            free(a);
        }
        CHECKF(bad == 0, "%s: %d dot products off", info->name, bad);
    }
    /* n = 0 is a valid empty row */
    CHECK(quant_dot_row(GGML_TYPE_Q4_K, NULL, NULL, 0) == 0.0f);
}

static void test_supported(void) {
    CHECK(!quant_supported(GGML_TYPE_Q8_1));
    CHECK(!quant_supported(GGML_TYPE_I8));
    CHECK(!quant_supported(GGML_TYPE_F64));
    CHECK(!quant_supported(31));
    CHECK(!quant_supported(1000));
}

int main(void) {
    test_fp16_to_f32();
    test_f32_to_fp16();
    test_bf16();
    test_dots();
    test_supported();
    return mla_test_finish();
}
