/* Host-side check of the CUDA dequantizers (kernels/cuda_quant_unit.h): their __host__
 * instantiation must reproduce the CPU reference quant_dequant_row on random blocks of every
 * supported type, and so must the integer form of each quantized type (unit_i8: s * q - m); and
 * the streamed GEMV's item arithmetic (kernels/gemvs_item.h) must give the dot product of the
 * dequantized row with the q8 activations, and the tensor-core GEMV's Q5_0 fragments (gs_q5_0_bytes8)
 * its signed bytes. Needs no GPU (runs in CI); the device build of the same
 * code is checked against the CPU by mla-gpu-check on a GPU host. */
#include <stdio.h>
#include <stdlib.h>

#include <math.h>

#include "kernels/cuda_quant_unit.h"
#include "kernels/cuda_rand.h"
#include "kernels/gemvs_item.h"

extern "C" {
#include "tests/unit/mla_test.h"
}

using namespace mlacu;

template <int TY> static void check_type(gr_rng *r) {
    using Q = qtraits<TY>;
    const int64_t n = 2048, rows = 3;
    size_t rb = ggml_row_bytes(TY, n);
    CHECKF(rb == (size_t)(n / Q::BE) * Q::BB, "%s row bytes %zu", ggml_type_name(TY), rb);
    CHECKF(quant_supported(TY), "CPU reference lacks %s", ggml_type_name(TY));
    if (!quant_supported(TY)) return;
    uint8_t *w = (uint8_t *)malloc(rb * rows);
    float *ref = (float *)malloc(sizeof(float) * n * rows), *got = (float *)malloc(sizeof(float) * n * rows);
    gr_quant_rows(r, TY, w, n, rows);
    quant_dequant_row(TY, w, ref, n * rows);
    for (int64_t u = 0; u < n * rows / 32; u++)
        deq_unit<TY>(w + (u / Q::BU) * Q::BB, (int)(u % Q::BU), got + 32 * u);
    double amax = 0;
    for (int64_t i = 0; i < n * rows; i++) amax = fmax(amax, fabs(ref[i]));
    int bad = 0;
    for (int64_t i = 0; i < n * rows; i++) {
        if (!(fabs((double)got[i] - ref[i]) <= 1e-6 * amax)) {
            if (bad++ < 3)
                fprintf(stderr, "%s: element %lld: cuda %.9g cpu %.9g\n", ggml_type_name(TY), (long long)i,
                        got[i], ref[i]);
        }
    }
    CHECKF(bad == 0, "%s: %d of %lld elements differ", ggml_type_name(TY), bad, (long long)(n * rows));
    CHECKF(amax > 0, "%s: all zero", ggml_type_name(TY));
    int bad8 = 0;
    if (i8traits<TY>::OK) {
        for (int64_t u = 0; u < n * rows / 32; u++) {
            unit_i8_t q;
            unit_i8<TY>(w + (u / Q::BU) * Q::BB, (int)(u % Q::BU), q);
            if ((!i8_scales2<TY>() && q.s[0] != q.s[1]) || (!i8_min<TY>() && (q.m[0] != 0 || q.m[1] != 0))) {
                if (bad8++ < 3)
                    fprintf(stderr, "%s: unit %lld: scales %g %g mins %g %g break the type's traits\n",
                            ggml_type_name(TY), (long long)u, q.s[0], q.s[1], q.m[0], q.m[1]);
            }
            for (int i = 0; i < 32; i++) {
                int8_t qi = (int8_t)(q.q[i / 4] >> (8 * (i % 4)));
                double v = (double)q.s[i / 16] * qi - q.m[i / 16], want = ref[32 * u + i];
                if (!(fabs(v - want) <= 1e-6 * amax) && bad8++ < 3)
                    fprintf(stderr, "%s: integer form, element %lld: %g * %d - %g = %.9g, cpu %.9g\n",
                            ggml_type_name(TY), (long long)(32 * u + i), q.s[i / 16], qi, q.m[i / 16], v, want);
            }
        }
        CHECKF(bad8 == 0, "%s: integer form: %d of %lld elements differ", ggml_type_name(TY), bad8,
               (long long)(n * rows));
    }
    printf("%-8s max|x| %.3g  mismatches %d, integer form %s\n", ggml_type_name(TY), amax, bad,
           i8traits<TY>::OK ? (bad8 ? "MISMATCH" : "ok") : "none");
    free(w);
    free(ref);
    free(got);
}

/* x in the q8 layout of mm_gemvq_cuda.cu (what q8x_kernel writes): per 32 elements d = max|x| / 127,
 * q = x / d rounded to nearest even, and (d, d * sum of the first 16 q, d * sum of the last 16, 0) */
static void q8_host(const float *x, int64_t n, int8_t *q, float4 *s) {
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0.f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
        const float d = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
        int sum[2] = {0, 0};
        for (int i = 0; i < 32; i++) {
            const int qi = (int)nearbyintf(x[32 * b + i] * id);
            q[32 * b + i] = (int8_t)qi;
            sum[i / 16] += qi;
        }
        s[b] = make_float4(d, d * (float)sum[0], d * (float)sum[1], 0.f);
    }
}

/* Each row, as the streamed GEMV computes it (every item of 128 elements, its activations
 * loaded as a thread does), against the CPU dequantization dotted in double with the same
 * activations; rows at every offset 0..15 from 16-aligned (the host loads are bytewise). */
template <int TY> static void check_gemvs_items(gr_rng *r) {
    const int64_t n = 2304, rows = 5; /* 18 items a row: an odd count of Q4_K / Q6_K halves */
    const size_t rb = ggml_row_bytes(TY, n);
    uint8_t *w = (uint8_t *)malloc(rb * rows), *buf = (uint8_t *)malloc(rb + 64);
    float *x = (float *)malloc(sizeof(float) * n), *deq = (float *)malloc(sizeof(float) * n);
    int8_t *q = (int8_t *)malloc(n);
    float4 *s = (float4 *)malloc(sizeof(float4) * (n / 32));
    gr_quant_rows(r, TY, w, n, rows);
    gr_fill(r, x, n, 1.0f);
    q8_host(x, n, q, s);
    double worst = 0;
    for (int64_t row = 0; row < rows; row++) {
        uint8_t *rp = buf + 16 + (row * 5) % 16; /* gs_words may read 3 bytes before, 4 after */
        memcpy(rp, w + row * rb, rb);
        memset(rp + rb, 0xA5, 16);
        double got = 0;
        for (int it = 0; it < (int)(n / 128); it++) {
            gs_x<TY> xi;
            gs_load_x<TY>((const uint4 *)q, s, 0, it, xi);
            got += gs_dot<TY>(rp, it, xi);
        }
        quant_dequant_row(TY, w + row * rb, deq, n);
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n; i++) {
            const double xv = (double)s[i / 32].x * q[i];
            ref += (double)deq[i] * xv;
            mag += fabs((double)deq[i] * xv);
        }
        worst = fmax(worst, fabs(got - ref) / (mag > 0 ? mag : 1));
    }
    CHECKF(worst <= 1e-5, "%s: streamed GEMV items off by %.3g of the dot's magnitude", ggml_type_name(TY), worst);
    printf("%-8s streamed GEMV items: worst error %.3g of the magnitude\n", ggml_type_name(TY), worst);
    free(w);
    free(buf);
    free(x);
    free(deq);
    free(q);
    free(s);
}

/* The tensor-core GEMV's Q5_0 fragments (gs_q5_0_bytes8): every block's 32 elements as d times
 * the signed bytes equal the CPU dequantization, blocks at every offset 0..15 from 16-aligned */
static void check_q5_0_bytes(gr_rng *r) {
    const int64_t n = 1408, rows = 4;
    const size_t rb = ggml_row_bytes(GGML_TYPE_Q5_0, n);
    uint8_t *w = (uint8_t *)malloc(rb * rows), *buf = (uint8_t *)malloc(rb + 64);
    float *deq = (float *)malloc(sizeof(float) * n);
    gr_quant_rows(r, GGML_TYPE_Q5_0, w, n, rows);
    int bad = 0, nonzero = 0;
    for (int64_t row = 0; row < rows; row++) {
        uint8_t *rp = buf + 16 + (row * 7) % 16; /* gs_words may read 3 bytes before, 4 after */
        memcpy(rp, w + row * rb, rb);
        memset(rp + rb, 0xA5, 16);
        quant_dequant_row(GGML_TYPE_Q5_0, w + row * rb, deq, n);
        for (int64_t blk = 0; blk < n / 32; blk++) {
            const uint8_t *b = rp + 22 * blk;
            uint16_t dh;
            memcpy(&dh, b, 2);
            const float d = h2f(dh);
            for (int t = 0; t < 4; t++) {
                uint32_t wv[2];
                gs_q5_0_bytes8(b, t, wv);
                for (int i = 0; i < 8; i++) {
                    const int q = (int8_t)(wv[i / 4] >> (8 * (i % 4)));
                    const float want = deq[32 * blk + 8 * t + i];
                    nonzero += q != 0;
                    if ((q < -16 || q > 15 || d * (float)q != want) && bad++ < 3)
                        fprintf(stderr, "Q5_0 row %lld block %lld element %d: byte %d x d %g, cpu %.9g\n", (long long)row,
                                (long long)blk, 8 * t + i, q, d, want);
                }
            }
        }
    }
    CHECKF(bad == 0, "Q5_0 fragment bytes: %d of %lld elements differ", bad, (long long)(n * rows));
    CHECKF(nonzero > n * rows / 2, "Q5_0 fragment bytes: %d of %lld nonzero", nonzero, (long long)(n * rows));
    printf("Q5_0     tensor-core fragment bytes: mismatches %d\n", bad);
    free(w);
    free(buf);
    free(deq);
}

int main(void) {
    gr_rng r = {12345};
#define RUN(T_) check_type<T_>(&r);
    MLACU_FOR_TYPES(RUN)
#undef RUN
    check_gemvs_items<GGML_TYPE_Q4_K>(&r);
    check_gemvs_items<GGML_TYPE_Q6_K>(&r);
    check_gemvs_items<GGML_TYPE_Q8_0>(&r);
    check_gemvs_items<GGML_TYPE_Q5_0>(&r);
    check_q5_0_bytes(&r);
    return mla_test_finish();
}
