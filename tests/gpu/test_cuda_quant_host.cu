/* Host-side check of the CUDA dequantizers (kernels/cuda_quant_unit.h): their __host__
 * instantiation must reproduce the CPU reference quant_dequant_row on random blocks of every
 * supported type, and so must the integer form of each quantized type (unit_i8: s * q - m). Needs no GPU (runs in CI); the device build of the same code is checked
 * against the CPU by mla-gpu-check on the GPU machine. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda_quant_unit.h"
#include "kernels/cuda_rand.h"

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

int main(void) {
    gr_rng r = {12345};
#define RUN(T_) check_type<T_>(&r);
    MLACU_FOR_TYPES(RUN)
#undef RUN
    return mla_test_finish();
}
