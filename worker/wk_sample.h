/* wk_sample: rank 0's host sampling of a step's rows (worker/sample.h), spread over threads.
 *
 * A row sampled on the host (temperature above 0, penalties, logprobs, a grammar, logit_bias)
 * costs passes over the whole vocabulary (1.9 ms at 102400 tokens with temperature 1 on a shared
 * 2-core x86 host), and every row of the step waits for all of them before the result goes out
 * (and, since the step ahead takes the sampled tokens, before the next step starts). The rows
 * are independent (the draw is a hash of the seed and the position: sample.h), so they are
 * sampled on up to WK_SAMPLE_THREADS threads, each with a sampler of its own; every token, logprob
 * and top list is the one sampler_sample_mod gives in line.
 *
 * Ownership: wk_sample_new -> wk_sample_free; the jobs and what they point to (logits, masks,
 * history) belong to the caller and must stay valid and unchanged during wk_sample_run. */
#ifndef WK_SAMPLE_H
#define WK_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sample.h"
#include "wire.h"

#define WK_SAMPLE_THREADS 4

typedef struct wk_sample_job {
    const float *logits; /* the row's last logits (n_vocab); a scored row's own */
    /* score: not sampled; out := sample_logprob of score_token with sp->top_logprobs alternatives
     * (a prompt token's logprob: wire_sampling.prompt_logprobs) */
    bool score;
    int32_t score_token;
    const wire_sampling *sp;
    sample_mod mod;
    const int32_t *history;
    size_t n_history, n_prompt_hist; /* sampler_sample_mod's */
    uint64_t stream;
    sample_out out; /* written by wk_sample_run */
} wk_sample_job;

typedef struct wk_sample wk_sample;

wk_sample *wk_sample_new(uint32_t n_vocab);
void wk_sample_free(wk_sample *s);

/* Samples (or scores) jobs[0, n) (on threads when n > 1): jobs[k].out as sampler_sample_mod (or
 * sample_logprob) gives it. */
void wk_sample_run(wk_sample *s, wk_sample_job *jobs, size_t n);

#endif
