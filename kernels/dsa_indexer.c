#include "dsa_indexer.h"

#include <math.h>
#include <stdlib.h>

#include "common/mla_err.h"

void dsa_scores(const float *q, const float *w, const float *k, int64_t n_keys, int64_t n_head,
                int64_t head_dim, float *scores) {
    const float sc = 1.0f / sqrtf((float)head_dim);
    for (int64_t j = 0; j < n_keys; j++) {
        const float *kj = k + j * head_dim;
        float s = 0.0f;
        for (int64_t h = 0; h < n_head; h++) {
            const float *qh = q + h * head_dim;
            float d = 0.0f;
            for (int64_t i = 0; i < head_dim; i++) d += qh[i] * kj[i];
            d *= sc;
            if (d > 0.0f) s += w[h] * d;
        }
        scores[j] = s;
    }
}

typedef struct sk {
    float s;
    int32_t i;
} sk;

static int by_score(const void *a, const void *b) {
    const sk *x = a, *y = b;
    if (x->s > y->s) return -1;
    if (x->s < y->s) return 1;
    return (x->i > y->i) - (x->i < y->i);
}

static int by_index(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int64_t dsa_topk(const float *scores, int64_t n, int64_t k, int32_t *idx) {
    if (k >= n) {
        for (int64_t j = 0; j < n; j++) idx[j] = (int32_t)j;
        return n;
    }
    sk *v = mla_xmalloc((size_t)n * sizeof *v);
    for (int64_t j = 0; j < n; j++) {
        v[j].s = isnan(scores[j]) ? -INFINITY : scores[j];
        v[j].i = (int32_t)j;
    }
    qsort(v, (size_t)n, sizeof *v, by_score);
    for (int64_t j = 0; j < k; j++) idx[j] = v[j].i;
    free(v);
    qsort(idx, (size_t)k, sizeof *idx, by_index);
    return k;
}

static void sel_task(void *vc, int64_t t) {
    const dsa_args *a = vc;
    const int64_t nk = a->pos0 + t + 1;
    int32_t *idx = a->sel + t * a->top_k;
    if (nk <= a->top_k) {
        for (int64_t j = 0; j < nk; j++) idx[j] = (int32_t)j;
        a->n_sel[t] = (int32_t)nk;
        return;
    }
    float *s = mla_xmalloc((size_t)nk * sizeof *s);
    dsa_scores(a->q + t * a->n_head * a->head_dim, a->w + t * a->n_head, a->k, nk, a->n_head,
               a->head_dim, s);
    a->n_sel[t] = (int32_t)dsa_topk(s, nk, a->top_k, idx);
    free(s);
}

void dsa_select(threadpool *tp, const dsa_args *a) {
    threadpool_run(tp, a->n_tokens, sel_task, (void *)a);
}
