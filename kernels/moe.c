#include "moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "act.h"
#include "common/mla_err.h"

/* index of the largest v[i] among allowed (ties: lowest i); -1 if none */
static int argmax_allowed(const float *v, const bool *allowed, int n) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (!allowed[i]) continue;
        if (best < 0 || v[i] > v[best]) best = i;
    }
    return best;
}

void moe_route(const moe_route_params *p, const float *logits, const float *bias, int32_t *ids,
               float *w) {
    const int n = p->n_expert;
    MLA_ASSERT(n > 0 && p->n_used > 0 && p->n_used <= n && p->n_group >= 1 && n % p->n_group == 0);
    float *prob = mla_xmalloc((size_t)n * sizeof *prob);
    float *choice = mla_xmalloc((size_t)n * sizeof *choice);
    bool *allowed = mla_xmalloc((size_t)n * sizeof *allowed);
    if (p->gating == 1) {
        memcpy(prob, logits, (size_t)n * sizeof *prob);
        act_softmax(prob, n);
    } else {
        for (int i = 0; i < n; i++) prob[i] = act_sigmoid1(logits[i]);
    }
    for (int i = 0; i < n; i++) {
        choice[i] = prob[i] + (bias ? bias[i] : 0.0f);
        allowed[i] = true;
    }
    if (p->n_group > 1 && p->n_group_used < p->n_group) {
        const int G = p->n_group, per = n / G;
        float *gs = mla_xmalloc((size_t)G * sizeof *gs);
        bool *gok = mla_xcalloc((size_t)G, sizeof *gok);
        for (int g = 0; g < G; g++) {
            float a = -INFINITY, b = -INFINITY; /* top two */
            for (int i = g * per; i < (g + 1) * per; i++) {
                float v = choice[i];
                if (v > a) {
                    b = a;
                    a = v;
                } else if (v > b) {
                    b = v;
                }
            }
            gs[g] = p->gating == 1 ? a : a + b; /* V2's greedy groups: their best; V3's: the best two */
        }
        bool *gfree = mla_xmalloc((size_t)G * sizeof *gfree);
        for (int g = 0; g < G; g++) gfree[g] = true;
        for (int k = 0; k < p->n_group_used; k++) {
            int g = argmax_allowed(gs, gfree, G);
            gok[g] = true;
            gfree[g] = false;
        }
        for (int i = 0; i < n; i++) allowed[i] = gok[i / per];
        free(gs);
        free(gok);
        free(gfree);
    }
    double sum = 0.0;
    for (int k = 0; k < p->n_used; k++) {
        int e = argmax_allowed(choice, allowed, n);
        MLA_ASSERT(e >= 0);
        allowed[e] = false;
        ids[k] = e;
        w[k] = prob[e];
        sum += prob[e];
    }
    for (int k = 0; k < p->n_used; k++) {
        if (p->norm) w[k] = (float)((double)w[k] / (sum + 1e-20));
        w[k] *= p->scale;
    }
    free(prob);
    free(choice);
    free(allowed);
}

void moe_experts_apply(threadpool *tp, const moe_experts *ex, const float *x, int64_t T,
                       const int32_t *ids, const float *w, int64_t n_used, float *out) {
    const int64_t E = ex->n_embd, F = ex->n_ff;
    int64_t *tok = mla_xmalloc((size_t)(T > 0 ? T : 1) * sizeof *tok);
    float *wt = mla_xmalloc((size_t)(T > 0 ? T : 1) * sizeof *wt);
    float *xg = mla_xmalloc((size_t)(T * E > 0 ? T * E : 1) * sizeof *xg);
    float *g = mla_xmalloc((size_t)(T * F > 0 ? T * F : 1) * sizeof *g);
    float *u = mla_xmalloc((size_t)(T * F > 0 ? T * F : 1) * sizeof *u);
    float *y = mla_xmalloc((size_t)(T * E > 0 ? T * E : 1) * sizeof *y);
    for (int64_t e = 0; e < ex->n_expert; e++) {
        if (ex->owned && !ex->owned[e]) continue;
        int64_t m = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t k = 0; k < n_used; k++)
                if (ids[t * n_used + k] == e) {
                    tok[m] = t;
                    wt[m] = w[t * n_used + k];
                    memcpy(xg + m * E, x + t * E, (size_t)E * sizeof *xg);
                    m++;
                }
        if (!m) continue;
        mla_mat mg = mla_mat_slice(ex->gate_type, ex->gate, E, F, e);
        mla_mat mu = mla_mat_slice(ex->up_type, ex->up, E, F, e);
        mla_mat md = mla_mat_slice(ex->down_type, ex->down, F, E, e);
        matmul(tp, xg, E, m, &mg, g, F);
        matmul(tp, xg, E, m, &mu, u, F);
        act_swiglu(g, u, g, m * F);
        matmul(tp, g, F, m, &md, y, E);
        for (int64_t i = 0; i < m; i++) act_axpy(out + tok[i] * E, wt[i], y + i * E, E);
    }
    free(tok);
    free(wt);
    free(xg);
    free(g);
    free(u);
    free(y);
}
