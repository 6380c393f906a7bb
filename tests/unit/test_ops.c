/* Unit tests of the CPU reference ops against direct formulas. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/ggml_types.h"
#include "kernels/act.h"
#include "kernels/dsa_indexer.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/mla_attn.h"
#include "kernels/quant.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "mla_test.h"

static uint64_t rs = 88172645463325252ull;
static float frand(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)((rs >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void test_matmul(threadpool *tp) {
    enum { IN = 64, OUT = 37, T = 3 };
    float W[OUT * IN], x[T * IN], y[T * OUT], yt[T * IN];
    for (int i = 0; i < OUT * IN; i++) W[i] = frand();
    for (int i = 0; i < T * IN; i++) x[i] = frand();
    mla_mat m = mla_mat_make(GGML_TYPE_F32, W, IN, OUT);
    matmul(tp, x, IN, T, &m, y, OUT);
    double err = 0;
    for (int t = 0; t < T; t++)
        for (int o = 0; o < OUT; o++) {
            double s = 0;
            for (int i = 0; i < IN; i++) s += (double)W[o * IN + i] * x[t * IN + i];
            err = fmax(err, fabs(s - y[t * OUT + o]));
        }
    CHECK(err < 1e-4);
    /* rows/columns views */
    mla_mat v = mla_mat_cols(&m, 16, 48);
    v = mla_mat_rows(&v, 5, 9);
    float yv[T * 4];
    matmul(tp, x + 16, IN, T, &v, yv, 4);
    CHECK(fabsf(yv[4 + 2] - y[OUT + 7]) > -1); /* shape sanity */
    double s = 0;
    for (int i = 16; i < 48; i++) s += (double)W[6 * IN + i] * x[IN + i];
    CHECK(fabs(s - yv[4 + 1]) < 1e-4);
    /* transposed: yt = x' W with x' [T][OUT] */
    float xo[T * OUT];
    for (int i = 0; i < T * OUT; i++) xo[i] = frand();
    matmul_t(tp, xo, OUT, T, &m, yt, IN);
    err = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < IN; i++) {
            double a = 0;
            for (int o = 0; o < OUT; o++) a += (double)xo[t * OUT + o] * W[o * IN + i];
            err = fmax(err, fabs(a - yt[t * IN + i]));
        }
    CHECK(err < 1e-4);
    /* bf16 weights */
    uint16_t Wb[OUT * IN];
    for (int i = 0; i < OUT * IN; i++) Wb[i] = quant_f32_to_bf16(W[i]);
    mla_mat mb = mla_mat_make(GGML_TYPE_BF16, Wb, IN, OUT);
    matmul(tp, x, IN, T, &mb, y, OUT);
    s = 0;
    for (int i = 0; i < IN; i++) s += (double)quant_bf16_to_f32(Wb[3 * IN + i]) * x[2 * IN + i];
    CHECK(fabs(s - y[2 * OUT + 3]) < 1e-4);
}

static void test_norms(void) {
    float x[2 * 8], w[8], b[8], y[2 * 8];
    for (int i = 0; i < 16; i++) x[i] = frand() * 3;
    for (int i = 0; i < 8; i++) w[i] = 1 + frand(), b[i] = frand();
    rmsnorm(x, 8, 2, 8, w, 1e-6f, y, 8);
    double ss = 0;
    for (int i = 0; i < 8; i++) ss += x[8 + i] * x[8 + i];
    CHECK(fabs(y[8 + 3] - x[8 + 3] / sqrt(ss / 8 + 1e-6) * w[3]) < 1e-5);
    layernorm(x, 8, 2, 8, w, b, 1e-6f, y, 8);
    double mu = 0, var = 0;
    for (int i = 0; i < 8; i++) mu += x[i];
    mu /= 8;
    for (int i = 0; i < 8; i++) var += (x[i] - mu) * (x[i] - mu);
    var /= 8;
    CHECK(fabs(y[5] - ((x[5] - mu) / sqrt(var + 1e-6) * w[5] + b[5])) < 1e-5);
}

static void test_rope(void) {
    rope_params p = {8, 10000.0, false, 1, 0, 32, 1, 1};
    rope_table t;
    rope_table_init(&t, &p);
    CHECK(fabs(t.inv_freq[1] - pow(10000.0, -2.0 / 8)) < 1e-12);
    float x[8], a[8], n[8], perm[8];
    for (int i = 0; i < 8; i++) x[i] = frand();
    memcpy(a, x, sizeof x);
    rope_apply(&t, ROPE_ADJACENT, a, 1, 8, 0);
    CHECK(!memcmp(a, x, sizeof x)); /* position 0: identity */
    memcpy(a, x, sizeof x);
    rope_apply(&t, ROPE_ADJACENT, a, 1, 8, 7);
    double ang = 7 * t.inv_freq[2];
    CHECK(fabs(a[4] - (x[4] * cos(ang) - x[5] * sin(ang))) < 1e-6);
    CHECK(fabs(a[5] - (x[4] * sin(ang) + x[5] * cos(ang))) < 1e-6);
    /* NeoX on the de-interleaved vector == adjacent pairs, permuted */
    for (int i = 0; i < 4; i++) perm[i] = x[2 * i], perm[4 + i] = x[2 * i + 1];
    memcpy(n, perm, sizeof n);
    rope_apply(&t, ROPE_NEOX, n, 1, 8, 7);
    double e = 0;
    for (int i = 0; i < 4; i++) e = fmax(e, fmax(fabs(n[i] - a[2 * i]), fabs(n[4 + i] - a[2 * i + 1])));
    CHECK(e < 1e-6);
    /* YaRN (the tiny-deepseek3 setting: dims 32, base 1e4, factor 4, orig 1024, beta 32/1):
     * correction range low = floor(dim*ln(1024/(32*2pi))/(2 ln 1e4)) = floor(2.83) = 2,
     * high = ceil(dim*ln(1024/(1*2pi))/(2 ln 1e4)) = ceil(8.85) = 9; i <= 2 keep the original
     * frequency, i >= 9 are divided by the factor, a linear ramp between */
    rope_params y = {32, 10000.0, true, 4.0, 1024, 32, 1, 1};
    rope_table ty;
    rope_table_init(&ty, &y);
    double f1 = pow(10000.0, -2.0 / 32), f14 = pow(10000.0, -28.0 / 32), f5 = pow(10000.0, -10.0 / 32);
    CHECK(fabs(ty.inv_freq[1] - f1) < 1e-12);
    CHECK(fabs(ty.inv_freq[14] - f14 / 4) < 1e-12);
    double r = (5 - 2) / 7.0; /* ramp at i = 5 */
    CHECK(fabs(ty.inv_freq[5] - (f5 / 4 * r + f5 * (1 - r))) < 1e-12);
    /* bf16-rounded frequencies (what HF rotates with once inv_freq is cast to bf16):
     * 1e6^(-2/32) = 0.4216965... -> 216 * 2^-9 = 0.421875; every value equals the quant module's
     * own f32 -> bf16 -> f32 conversion, and the table stays untouched elsewhere. */
    rope_params gp = {32, 1e6, false, 1, 0, 32, 1, 1};
    rope_table tg, tr;
    rope_table_init(&tg, &gp);
    rope_table_init(&tr, &gp);
    rope_table_round_freq_bf16(&tr);
    CHECK(tr.inv_freq[1] == 0.421875);
    CHECK(tr.inv_freq[0] == 1.0);
    int same = 1;
    for (int i = 0; i < 16; i++)
        same &= tr.inv_freq[i] == (double)quant_bf16_to_f32(quant_f32_to_bf16((float)tg.inv_freq[i]));
    CHECK(same);
    CHECK(tr.n_dims == tg.n_dims && tr.attn_factor == tg.attn_factor);
    rope_table_round_freq_bf16(&ty); /* YaRN table: rounding is applied after the correction */
    CHECK(ty.inv_freq[14] == (double)quant_bf16_to_f32(quant_f32_to_bf16((float)(f14 / 4))));
}

static void test_attn(threadpool *tp) {
    enum { T = 3, H = 2, L = 16, R = 4, N = 6 };
    const int64_t pos0 = N - T;
    float qa[T * H * L], qp[T * H * R], kv[N * (L + R)], out[T * H * L], out2[T * H * L];
    for (int i = 0; i < T * H * L; i++) qa[i] = frand();
    for (int i = 0; i < T * H * R; i++) qp[i] = frand();
    for (int i = 0; i < N * (L + R); i++) kv[i] = frand();
    mla_attn_args a = {qa, qp, T, H, L, R, kv, pos0, 0.3f, NULL, NULL, 0, out};
    mla_attn(tp, &a);
    double e = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            int nk = (int)pos0 + t + 1;
            double s[N], mx = -1e30, den = 0;
            for (int j = 0; j < nk; j++) {
                double d = 0;
                for (int i = 0; i < L; i++) d += qa[(t * H + h) * L + i] * kv[j * (L + R) + i];
                for (int i = 0; i < R; i++) d += qp[(t * H + h) * R + i] * kv[j * (L + R) + L + i];
                s[j] = d * 0.3;
                mx = fmax(mx, s[j]);
            }
            for (int j = 0; j < nk; j++) den += (s[j] = exp(s[j] - mx));
            for (int i = 0; i < L; i++) {
                double o = 0;
                for (int j = 0; j < nk; j++) o += s[j] / den * kv[j * (L + R) + i];
                e = fmax(e, fabs(o - out[(t * H + h) * L + i]));
            }
        }
    CHECK(e < 1e-5);
    /* a selection listing every causal key equals dense */
    int32_t sel[T * N], ns[T];
    for (int t = 0; t < T; t++) {
        ns[t] = (int32_t)(pos0 + t + 1);
        for (int j = 0; j < ns[t]; j++) sel[t * N + j] = j;
    }
    mla_attn_args b = a;
    b.sel = sel, b.n_sel = ns, b.sel_stride = N, b.out = out2;
    mla_attn(tp, &b);
    CHECK(!memcmp(out, out2, sizeof out));
    /* a single selected key copies its latent */
    ns[0] = 1, sel[0] = 1;
    mla_attn(tp, &b);
    CHECK(!memcmp(out2, kv + 1 * (L + R), L * sizeof(float)));
}

static void test_dsa(void) {
    float s[6] = {0.5f, -1.0f, 2.0f, 0.5f, 3.0f, 0.5f};
    int32_t idx[6];
    CHECK(dsa_topk(s, 6, 3, idx) == 3);
    CHECK(idx[0] == 0 && idx[1] == 2 && idx[2] == 4); /* ties at 0.5: the lowest index (0) */
    CHECK(dsa_topk(s, 6, 10, idx) == 6 && idx[5] == 5);
    /* scores: sum_h w_h relu(q_h.k / sqrt(d)) */
    float q[2 * 4] = {1, 0, 0, 0, 0, 1, 0, 0}, w[2] = {2.0f, -1.0f}, k[2 * 4] = {4, 1, 0, 0, -4, 9, 0, 0};
    float sc[2];
    dsa_scores(q, w, k, 2, 2, 4, sc);
    CHECK(fabsf(sc[0] - (2.0f * 2.0f - 1.0f * 0.5f)) < 1e-6f);
    CHECK(fabsf(sc[1] - (0.0f - 1.0f * 4.5f)) < 1e-6f);
    /* selection: dense while p + 1 <= top_k */
    float kc[5 * 4];
    for (int i = 0; i < 20; i++) kc[i] = frand();
    float qq[2 * 2 * 4], ww[2 * 2] = {1, 1, 1, 1};
    for (int i = 0; i < 16; i++) qq[i] = frand();
    int32_t sl[2 * 3], nsl[2];
    dsa_args a = {qq, ww, kc, 2, 2, 4, 2, 3, sl, nsl}; /* positions 2 and 3, top 3 */
    dsa_select(NULL, &a);
    CHECK(nsl[0] == 3 && sl[0] == 0 && sl[2] == 2);
    CHECK(nsl[1] == 3);
    float s4[4];
    dsa_scores(qq + 8, ww + 2, kc, 4, 2, 4, s4);
    int32_t want[3];
    dsa_topk(s4, 4, 3, want);
    CHECK(!memcmp(want, sl + 3, sizeof want));
}

static void test_act(void) {
    float x[4] = {1, 2, 3, -INFINITY};
    act_softmax(x, 4);
    CHECK(x[3] == 0.0f && fabsf(x[0] + x[1] + x[2] - 1.0f) < 1e-6f);
    CHECK(fabsf(act_silu1(1.0f) - 1.0f / (1.0f + expf(-1.0f))) < 1e-7f);
}

int main(void) {
    threadpool *tp = threadpool_new(3);
    test_matmul(tp);
    test_matmul(NULL);
    test_norms();
    test_rope();
    test_attn(tp);
    test_dsa();
    test_act();
    threadpool_free(tp);
    return mla_test_finish();
}
