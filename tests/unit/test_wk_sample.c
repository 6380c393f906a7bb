/* wk_sample: rows sampled on threads give exactly what sampler_sample_mod gives in line (the
 * token, its logprob, the top list), for greedy, temperature, top-k/p, min-p, penalties,
 * logprobs, a mask and biases, and for 1 to 9 rows at once. */
#include <stdlib.h>
#include <string.h>

#include "mla_test.h"
#include "wk_sample.h"

enum { V = 3001, NJ = 9 };

int main(void) {
    float *lg = malloc((size_t)NJ * V * sizeof *lg);
    uint8_t *mask = malloc((size_t)NJ * V);
    int32_t hist[NJ][40];
    int32_t bias_ids[2] = {5, 77};
    float bias_vals[2] = {4.0f, -2.5f};
    wire_sampling sp[NJ];
    uint64_t st = 12345;
    for (size_t i = 0; i < (size_t)NJ * V; i++) {
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        lg[i] = (float)((st >> 33) % 20000) / 1000.0f - 10.0f;
        mask[i] = (st >> 20) % 5 != 0;
    }
    for (int k = 0; k < NJ; k++) {
        for (int t = 0; t < 40; t++) hist[k][t] = (k * 131 + t * 17) % V;
        memset(&sp[k], 0, sizeof sp[k]);
        sp[k].temperature = k == 0 ? 0.0f : 0.5f + 0.25f * (float)k;
        sp[k].top_p = k == 2 ? 0.9f : 1.0f;
        sp[k].top_k = k == 3 ? 40 : 0;
        sp[k].min_p = k == 4 ? 0.05f : 0.0f;
        sp[k].repetition_penalty = k == 5 ? 1.3f : 1.0f;
        sp[k].presence_penalty = k == 6 ? 0.7f : 0.0f;
        sp[k].frequency_penalty = k == 6 ? 0.2f : 0.0f;
        sp[k].logprobs = k % 2 == 1;
        sp[k].top_logprobs = k == 7 ? 5 : 0;
        sp[k].seed = 100 + (uint64_t)k;
    }
    wk_sample *ws = wk_sample_new(V);
    sampler *ref = sampler_new(V);
    for (int n = 1; n <= NJ; n++) {
        wk_sample_job jobs[NJ];
        sample_out want[NJ];
        for (int k = 0; k < n; k++) {
            wk_sample_job *j = &jobs[k];
            memset(j, 0, sizeof *j);
            j->logits = lg + (size_t)k * V;
            j->sp = &sp[k];
            if (k % 3 == 1) j->mod.allow = mask + (size_t)k * V;
            if (k % 4 == 2) {
                j->mod.bias_ids = bias_ids;
                j->mod.bias_vals = bias_vals;
                j->mod.n_bias = 2;
            }
            j->history = hist[k];
            j->n_history = 40;
            j->n_prompt_hist = (size_t)(k * 5 % 41);
            j->stream = 1000 + (uint64_t)(k * 7 + n);
            sampler_sample_mod(ref, j->logits, j->sp, &j->mod, j->history, j->n_history, j->n_prompt_hist, j->stream,
                               &want[k]);
        }
        wk_sample_run(ws, jobs, (size_t)n);
        for (int k = 0; k < n; k++) {
            const sample_out *a = &jobs[k].out, *b = &want[k];
            CHECKF(a->token == b->token && a->logprob == b->logprob && a->n_top == b->n_top &&
                       !memcmp(a->top, b->top, b->n_top * sizeof *b->top),
                   "%d rows, row %d: token %d vs %d in line", n, k, a->token, b->token);
        }
    }
    /* no rows: nothing to do */
    wk_sample_run(ws, NULL, 0);
    sampler_free(ref);
    wk_sample_free(ws);
    free(lg);
    free(mask);
    return mla_test_finish();
}
