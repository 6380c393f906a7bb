/* wk_sample: see wk_sample.h. */
#include "wk_sample.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "mla_err.h"

struct wk_sample {
    uint32_t n_vocab;
    sampler *smp[WK_SAMPLE_THREADS]; /* one a thread, made at first use */
};

typedef struct worker_arg {
    wk_sample_job *jobs;
    size_t n;
    atomic_size_t *next;
    sampler *smp;
    uint32_t n_vocab;
} worker_arg;

wk_sample *wk_sample_new(uint32_t n_vocab) {
    wk_sample *s = mla_xcalloc(1, sizeof *s);
    s->n_vocab = n_vocab;
    return s;
}

void wk_sample_free(wk_sample *s) {
    if (!s) return;
    for (int k = 0; k < WK_SAMPLE_THREADS; k++) sampler_free(s->smp[k]);
    free(s);
}

static void *work(void *arg) {
    worker_arg *a = arg;
    for (;;) {
        size_t k = atomic_fetch_add(a->next, 1);
        if (k >= a->n) return NULL;
        wk_sample_job *j = &a->jobs[k];
        if (j->score)
            sample_logprob(j->logits, a->n_vocab, j->score_token, j->sp->top_logprobs, &j->out);
        else
            sampler_sample_mod(a->smp, j->logits, j->sp, &j->mod, j->history, j->n_history, j->n_prompt_hist,
                               j->stream, &j->out);
    }
}

void wk_sample_run(wk_sample *s, wk_sample_job *jobs, size_t n) {
    if (n == 0) return;
    int nt = n < WK_SAMPLE_THREADS ? (int)n : WK_SAMPLE_THREADS;
    for (int k = 0; k < nt; k++)
        if (!s->smp[k]) s->smp[k] = sampler_new(s->n_vocab);
    atomic_size_t next = 0;
    worker_arg args[WK_SAMPLE_THREADS];
    pthread_t th[WK_SAMPLE_THREADS];
    int started = 0;
    for (int k = 0; k < nt; k++) args[k] = (worker_arg){jobs, n, &next, s->smp[k], s->n_vocab};
    for (int k = 1; k < nt; k++) { /* this thread is the first worker */
        if (pthread_create(&th[k], NULL, work, &args[k])) break;
        started = k;
    }
    work(&args[0]);
    for (int k = 1; k <= started; k++) pthread_join(th[k], NULL);
}
