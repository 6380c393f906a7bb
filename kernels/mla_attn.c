#include "mla_attn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "act.h"
#include "common/mla_err.h"

static void attn_task(void *vc, int64_t task) {
    const mla_attn_args *a = vc;
    const int64_t t = task / a->n_head, h = task % a->n_head;
    const int64_t L = a->kv_lora, R = a->n_rope, row = L + R;
    const float *qa = a->q_abs + (t * a->n_head + h) * L;
    const float *qp = a->q_pe + (t * a->n_head + h) * R;
    const int64_t pos = a->pos0 + t;
    int64_t nk = a->sel ? a->n_sel[t] : pos + 1;
    const int32_t *ids = a->sel ? a->sel + t * a->sel_stride : NULL;
    float *s = mla_xmalloc((size_t)(nk > 0 ? nk : 1) * sizeof *s);
    for (int64_t k = 0; k < nk; k++) {
        int64_t j = ids ? ids[k] : k;
        MLA_ASSERT(j >= 0 && j <= pos);
        const float *kv = a->kv + j * row;
        float d = 0.0f;
        for (int64_t i = 0; i < L; i++) d += qa[i] * kv[i];
        float dp = 0.0f;
        for (int64_t i = 0; i < R; i++) dp += qp[i] * kv[L + i];
        s[k] = (d + dp) * a->scale;
    }
    act_softmax(s, nk);
    float *o = a->out + (t * a->n_head + h) * L;
    memset(o, 0, (size_t)L * sizeof *o);
    for (int64_t k = 0; k < nk; k++) {
        int64_t j = ids ? ids[k] : k;
        act_axpy(o, s[k], a->kv + j * row, L);
    }
    free(s);
}

void mla_attn(threadpool *tp, const mla_attn_args *a) {
    threadpool_run(tp, a->n_tokens * a->n_head, attn_task, (void *)a);
}
