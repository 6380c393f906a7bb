#include "rope.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/mla_err.h"
#include "common/mla_log.h"
#include "common/mla_switch.h"
#include "common/model_config.h"

static double corr_dim(double n_rot, int dims, double base, double orig_ctx) {
    return (double)dims * log(orig_ctx / (n_rot * 2.0 * M_PI)) / (2.0 * log(base));
}

void rope_table_init(rope_table *t, const rope_params *p) {
    MLA_ASSERT(p->n_dims > 0 && p->n_dims % 2 == 0 && p->n_dims <= ROPE_MAX_DIMS);
    const int d = p->n_dims, h = d / 2;
    t->n_dims = d;
    t->attn_factor = p->attn_factor == 0.0 ? 1.0 : p->attn_factor;
    double lo = 0, hi = 0;
    if (p->yarn) {
        lo = floor(corr_dim(p->beta_fast, d, p->freq_base, p->yarn_orig_ctx));
        hi = ceil(corr_dim(p->beta_slow, d, p->freq_base, p->yarn_orig_ctx));
        if (lo < 0) lo = 0;
        if (hi > d - 1) hi = d - 1;
        if (lo == hi) hi += 0.001;
    }
    for (int i = 0; i < h; i++) {
        double extrap = 1.0 / pow(p->freq_base, (double)(2 * i) / (double)d);
        if (!p->yarn) {
            t->inv_freq[i] = extrap;
            continue;
        }
        double interp = extrap / p->yarn_factor;
        double ramp = ((double)i - lo) / (hi - lo);
        if (ramp < 0) ramp = 0;
        if (ramp > 1) ramp = 1;
        double w_extrap = 1.0 - ramp;
        t->inv_freq[i] = interp * (1.0 - w_extrap) + extrap * w_extrap;
    }
}

void rope_table_round_freq_bf16(rope_table *t) {
    for (int i = 0; i < t->n_dims / 2; i++) {
        float f = (float)t->inv_freq[i];
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        MLA_ASSERT((u & 0x7f800000u) != 0x7f800000u); /* finite */
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        memcpy(&f, &u, sizeof f);
        t->inv_freq[i] = (double)f;
    }
}

void rope_apply(const rope_table *t, enum rope_mode mode, float *x, int64_t n_vec, int64_t stride,
                int64_t pos) {
    const int h = t->n_dims / 2;
    float cs[ROPE_MAX_DIMS / 2], sn[ROPE_MAX_DIMS / 2];
    for (int i = 0; i < h; i++) {
        double a = (double)pos * t->inv_freq[i];
        cs[i] = (float)(cos(a) * t->attn_factor);
        sn[i] = (float)(sin(a) * t->attn_factor);
    }
    for (int64_t v = 0; v < n_vec; v++) {
        float *y = x + v * stride;
        for (int i = 0; i < h; i++) {
            int i0 = mode == ROPE_ADJACENT ? 2 * i : i;
            int i1 = mode == ROPE_ADJACENT ? 2 * i + 1 : i + h;
            float a = y[i0], b = y[i1];
            y[i0] = a * cs[i] - b * sn[i];
            y[i1] = a * sn[i] + b * cs[i];
        }
    }
}

void rope_table_for_model(rope_table *t, const mla_config *cf) {
    rope_params rp = {(int)cf->n_rope,          cf->rope_base,      cf->yarn,
                      cf->yarn_factor,          (double)cf->yarn_orig_ctx,
                      cf->yarn_beta_fast,       cf->yarn_beta_slow, cf->rope_attn_factor};
    rope_table_init(t, &rp);
    if (mla_sw_bool(MLA_SW_ROPE_FREQ_BF16)) {
        rope_table_round_freq_bf16(t);
        MLA_INFO("RoPE inverse frequencies rounded to bf16 (MLA_ROPE_FREQ_BF16)");
    }
}
