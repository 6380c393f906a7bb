/* Scheduler tests against the deterministic fake backend (tests/serve/fake_backend.h): outputs
 * must equal the fake model run over the true sequence, whatever the batching, chunking and
 * preemption; the backend checks the cache bookkeeping at every step. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/sched_batch.h"
#include "mla_test.h"
#include "serve/fake_backend.h"

#define MAXR 128
#define MAXT 512

typedef struct rec {
    int32_t toks[MAXT];
    int n_tok;
    int n_final;
    int events_after_final;
    enum sched_finish finish;
    char error[256];
    float lp[MAXT];
    int n_top[MAXT];
} rec;

typedef struct world {
    rec r[MAXR];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int finals;
} world;

static void on_event(void *ctx, const sched_event *ev) {
    world *w = ctx;
    pthread_mutex_lock(&w->mu);
    rec *r = &w->r[(intptr_t)ev->user];
    if (r->n_final) r->events_after_final++;
    if (ev->has_token && r->n_tok < MAXT) {
        r->lp[r->n_tok] = ev->result.logprob;
        r->n_top[r->n_tok] = ev->result.n_top;
        r->toks[r->n_tok++] = ev->result.token;
    }
    if (ev->finish != SCHED_FINISH_NONE) {
        r->n_final++;
        r->finish = ev->finish;
        if (ev->error) snprintf(r->error, sizeof(r->error), "%s", ev->error);
        w->finals++;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
}

static bool eog(void *ctx, int32_t t) {
    (void)ctx;
    return t == FAKE_EOS;
}

static uint64_t rng = 88172645463325252ULL;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

typedef struct job {
    int32_t prompt[MAXT];
    int n_prompt, max_tokens;
    int32_t stop_id; /* -1 none */
} job;

/* Expected output of a job by running the reference directly. */
static void expect(const job *j, int max_context, uint32_t eos_period, int32_t *out, int *n_out,
                   enum sched_finish *fin) {
    int32_t seq[MAXT * 2];
    memcpy(seq, j->prompt, (size_t)j->n_prompt * sizeof(int32_t));
    int n = j->n_prompt;
    *n_out = 0;
    for (;;) {
        sched_result r;
        fake_next(seq, n, eos_period, 0, &r);
        seq[n++] = r.token;
        out[(*n_out)++] = r.token;
        if (r.token == FAKE_EOS || r.token == j->stop_id) {
            *fin = SCHED_FINISH_STOP;
            return;
        }
        if (*n_out >= j->max_tokens || n >= max_context) {
            *fin = SCHED_FINISH_LENGTH;
            return;
        }
    }
}

static void make_world(world *w) {
    memset(w, 0, sizeof(*w));
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
}

static sched_config base_cfg(world *w) {
    sched_config c = {0};
    c.block_size = 4;
    c.n_blocks = 40;
    c.max_seqs = 8;
    c.max_step_tokens = 32;
    c.max_queue = 100;
    c.max_context = 150;
    c.is_eog = eog;
    c.on_event = on_event;
    c.cb_ctx = w;
    return c;
}

static int submit_job(sched *s, const job *j, int idx, int top, uint64_t *id) {
    sched_request rq = {0};
    rq.prompt = j->prompt;
    rq.n_prompt = j->n_prompt;
    rq.max_tokens = j->max_tokens;
    rq.stop_ids = j->stop_id >= 0 ? &j->stop_id : NULL;
    rq.n_stop_ids = j->stop_id >= 0 ? 1 : 0;
    sched_sampling_default(&rq.sampling);
    rq.sampling.temperature = 0;
    rq.sampling.top_logprobs = top;
    rq.user = (void *)(intptr_t)idx;
    mla_err err;
    return sched_submit(s, &rq, id, &err);
}

static void random_job(job *j, int max_prompt, int max_new) {
    j->n_prompt = 1 + (int)rnd((uint32_t)max_prompt);
    for (int i = 0; i < j->n_prompt; i++) j->prompt[i] = (int32_t)rnd(256);
    j->max_tokens = 1 + (int)rnd((uint32_t)max_new);
    j->stop_id = -1;
}

static void check_against_reference(world *w, job *jobs, int n, int max_context, uint32_t eos_period) {
    for (int i = 0; i < n; i++) {
        int32_t exp[MAXT * 2];
        int n_exp;
        enum sched_finish fin;
        expect(&jobs[i], max_context, eos_period, exp, &n_exp, &fin);
        rec *r = &w->r[i];
        CHECKF(r->n_final == 1, "job %d: %d final events", i, r->n_final);
        CHECKF(r->events_after_final == 0, "job %d", i);
        CHECKF(r->finish == fin, "job %d: finish %s, expected %s", i, sched_finish_name(r->finish),
               sched_finish_name(fin));
        CHECKF(r->n_tok == n_exp, "job %d: %d tokens, expected %d", i, r->n_tok, n_exp);
        if (r->n_tok == n_exp) CHECKF(!memcmp(r->toks, exp, (size_t)n_exp * sizeof(int32_t)), "job %d tokens differ", i);
    }
}

/* Many random requests through a small cache: batching, chunked prefill and preemption. */
static void test_random_workload(void) {
    static world w;
    make_world(&w);
    sched_config cfg = base_cfg(&w);
    fake_config fc = {.n_blocks = cfg.n_blocks, .block_size = cfg.block_size, .eos_period = 40,
                      .fail_at_step = -1};
    fake_backend *fb = fake_backend_new(&fc);
    sched_backend be;
    fake_backend_bind(fb, &be);
    sched *s;
    mla_err err;
    REQUIRE(sched_init(&s, &cfg, &be, &err) == MLA_OK);
    static job jobs[60];
    int n_jobs = 60, submitted = 0;
    for (int i = 0; i < n_jobs; i++) random_job(&jobs[i], 70, 60);
    jobs[0].n_prompt = 100; /* a long prompt: several chunks */
    for (int i = 0; i < 100; i++) jobs[0].prompt[i] = i;
    for (; submitted < 30; submitted++) REQUIRE(submit_job(s, &jobs[submitted], submitted, 0, NULL) == SCHED_E_OK);
    int steps = 0;
    while (steps < 100000) {
        int did = sched_step(s);
        steps++;
        if (submitted < n_jobs && steps % 3 == 0) {
            REQUIRE(submit_job(s, &jobs[submitted], submitted, 0, NULL) == SCHED_E_OK);
            submitted++;
        }
        sched_stats st;
        sched_get_stats(s, &st);
        CHECK(st.blocks_used <= st.blocks_total);
        if (!did && submitted == n_jobs && st.waiting == 0 && st.running == 0) break;
    }
    check_against_reference(&w, jobs, n_jobs, cfg.max_context, fc.eos_period);
    sched_stats st;
    sched_get_stats(s, &st);
    fake_stats fs;
    fake_backend_stats(fb, &fs);
    CHECKF(fs.violations == 0, "%lld violations", (long long)fs.violations);
    CHECK(st.blocks_used == 0);
    CHECKF(st.preemptions > 0, "the workload should force preemption (got %llu)", (unsigned long long)st.preemptions);
    CHECK(fs.live_seqs == 0);
    CHECK(fs.max_batch_tokens <= cfg.max_step_tokens);
    CHECK(fs.max_batch_seqs <= cfg.max_seqs);
    CHECK(fs.max_batch_seqs > 1);
    printf("random workload: %d steps, %llu preemptions, %llu generated\n", steps,
           (unsigned long long)st.preemptions, (unsigned long long)st.tokens_generated);
    sched_free(s);
    fake_backend_free(fb);
}

static void test_chunked_prefill_and_logprobs(void) {
    static world w;
    make_world(&w);
    sched_config cfg = base_cfg(&w);
    cfg.max_step_tokens = 16;
    fake_config fc = {.n_blocks = cfg.n_blocks, .block_size = cfg.block_size, .fail_at_step = -1};
    fake_backend *fb = fake_backend_new(&fc);
    sched_backend be;
    fake_backend_bind(fb, &be);
    sched *s;
    mla_err err;
    REQUIRE(sched_init(&s, &cfg, &be, &err) == MLA_OK);
    static job j;
    j.n_prompt = 100;
    for (int i = 0; i < 100; i++) j.prompt[i] = 'a' + i % 26;
    j.max_tokens = 3;
    j.stop_id = -1;
    REQUIRE(submit_job(s, &j, 0, 5, NULL) == SCHED_E_OK);
    int steps_before_first = 0;
    while (w.r[0].n_tok == 0 && steps_before_first < 100) {
        sched_step(s);
        steps_before_first++;
    }
    CHECKF(steps_before_first == 7, "100 prompt tokens at 16 a step take 7 steps (took %d)", steps_before_first);
    while (sched_step(s)) {}
    check_against_reference(&w, &j, 1, cfg.max_context, 0);
    sched_result ref;
    fake_next(j.prompt, j.n_prompt, 0, 5, &ref);
    CHECK(w.r[0].n_top[0] == 5);
    CHECK(w.r[0].lp[0] == ref.logprob);
    sched_free(s);
    fake_backend_free(fb);
}

static void test_stop_ids_and_context(void) {
    static world w;
    make_world(&w);
    sched_config cfg = base_cfg(&w);
    cfg.max_context = 40;
    fake_config fc = {.n_blocks = cfg.n_blocks, .block_size = cfg.block_size, .fail_at_step = -1};
    fake_backend *fb = fake_backend_new(&fc);
    sched_backend be;
    fake_backend_bind(fb, &be);
    sched *s;
    mla_err err;
    REQUIRE(sched_init(&s, &cfg, &be, &err) == MLA_OK);
    static job jobs[2];
    random_job(&jobs[0], 10, 1);
    jobs[0].max_tokens = 30;
    /* stop at the 4th token of the reference */
    int32_t exp[MAXT * 2];
    int n_exp;
    enum sched_finish fin;
    expect(&jobs[0], cfg.max_context, 0, exp, &n_exp, &fin);
    jobs[0].stop_id = exp[3];
    random_job(&jobs[1], 10, 1);
    jobs[1].n_prompt = 30;
    jobs[1].max_tokens = 100; /* the context (40) ends it */
    REQUIRE(submit_job(s, &jobs[0], 0, 0, NULL) == SCHED_E_OK);
    REQUIRE(submit_job(s, &jobs[1], 1, 0, NULL) == SCHED_E_OK);
    while (sched_step(s)) {}
    check_against_reference(&w, jobs, 2, cfg.max_context, 0);
    CHECK(w.r[0].finish == SCHED_FINISH_STOP);
    CHECK(w.r[0].n_tok <= 4);
    CHECK(w.r[1].finish == SCHED_FINISH_LENGTH && w.r[1].n_tok == 10);
    sched_free(s);
    fake_backend_free(fb);
}

static void test_cancel(void) {
    static world w;
    make_world(&w);
    sched_config cfg = base_cfg(&w);
    fake_config fc = {.n_blocks = cfg.n_blocks, .block_size = cfg.block_size, .fail_at_step = -1};
    fake_backend *fb = fake_backend_new(&fc);
    sched_backend be;
    fake_backend_bind(fb, &be);
    sched *s;
    mla_err err;
    REQUIRE(sched_init(&s, &cfg, &be, &err) == MLA_OK);
    static job jobs[3];
    for (int i = 0; i < 3; i++) {
        random_job(&jobs[i], 10, 1);
        jobs[i].max_tokens = 50;
    }
    uint64_t ids[3];
    for (int i = 0; i < 3; i++) REQUIRE(submit_job(s, &jobs[i], i, 0, &ids[i]) == SCHED_E_OK);
    for (int k = 0; k < 5; k++) sched_step(s);
    int before = w.r[1].n_tok;
    CHECK(before > 0);
    sched_cancel(s, ids[1]);
    sched_cancel(s, 999999); /* unknown: ignored */
    sched_step(s);
    CHECK(w.r[1].finish == SCHED_FINISH_CANCELLED && w.r[1].n_final == 1);
    CHECK(w.r[1].n_tok == before);
    while (sched_step(s)) {}
    sched_cancel(s, ids[0]); /* finished: ignored */
    CHECK(sched_step(s) == 0);
    CHECK(w.r[1].events_after_final == 0 && w.r[0].n_final == 1 && w.r[0].finish == SCHED_FINISH_LENGTH);
    CHECK(w.r[2].n_tok == 50);
    sched_stats st;
    sched_get_stats(s, &st);
    CHECK(st.blocks_used == 0 && st.running == 0 && st.waiting == 0);
    fake_stats fs;
    fake_backend_stats(fb, &fs);
    CHECK(fs.live_seqs == 0 && fs.violations == 0);
    /* cancel while waiting (never ran) */
    REQUIRE(submit_job(s, &jobs[0], 0, 0, &ids[0]) == SCHED_E_OK);
    w.r[0].n_final = 0;
    w.r[0].n_tok = 0;
    sched_cancel(s, ids[0]);
    sched_step(s);
    CHECK(w.r[0].finish == SCHED_FINISH_CANCELLED && w.r[0].n_final == 1 && w.r[0].n_tok == 0);
    sched_free(s);
    fake_backend_free(fb);
}

static void test_refusals(void) {
    static world w;
    make_world(&w);
    sched_config cfg = base_cfg(&w);
    cfg.max_queue = 3;
    cfg.n_blocks = 10; /* 40 token slots */
    fake_config fc = {.n_blocks = cfg.n_blocks, .block_size = cfg.block_size, .fail_at_step = -1};
    fake_backend *fb = fake_backend_new(&fc);
    sched_backend be;
    fake_backend_bind(fb, &be);
    sched *s;
    mla_err err;
    REQUIRE(sched_init(&s, &cfg, &be, &err) == MLA_OK);
    static job j;
    random_job(&j, 5, 1);
    j.n_prompt = 5;
    j.max_tokens = 100;
    CHECK(submit_job(s, &j, 0, 0, NULL) == SCHED_E_CAPACITY);
    j.max_tokens = 35; /* exactly the capacity */
    CHECK(submit_job(s, &j, 0, 0, NULL) == SCHED_E_OK);
    j.max_tokens = 0;
    CHECK(submit_job(s, &j, 1, 0, NULL) == SCHED_E_INVALID);
    j.max_tokens = 1;
    j.n_prompt = 150;
    CHECK(submit_job(s, &j, 1, 0, NULL) == SCHED_E_CONTEXT);
    j.n_prompt = 0;
    CHECK(submit_job(s, &j, 1, 0, NULL) == SCHED_E_INVALID);
    j.n_prompt = 5;
    CHECK(submit_job(s, &j, 1, 0, NULL) == SCHED_E_OK);
    CHECK(submit_job(s, &j, 2, 0, NULL) == SCHED_E_OK);
    CHECK(submit_job(s, &j, 3, 0, NULL) == SCHED_E_QUEUE_FULL);
    sched_request rq = {0};
    rq.prompt = j.prompt;
    rq.n_prompt = 5;
    rq.max_tokens = 1;
    rq.sampling.top_logprobs = 21;
    CHECK(sched_submit(s, &rq, NULL, &err) == SCHED_E_INVALID && strstr(err.msg, "top_logprobs"));
    while (sched_step(s)) {}
    CHECK(w.r[0].n_final == 1 && w.r[1].n_final == 1 && w.r[2].n_final == 1 && w.r[3].n_final == 0);
    CHECK(w.r[0].n_tok == 35);
    fake_stats fs;
    fake_backend_stats(fb, &fs);
    CHECK(fs.violations == 0);
    sched_free(s);
    fake_backend_free(fb);
}

static void test_backend_failure(void) {
    static world w;
    make_world(&w);
    sched_config cfg = base_cfg(&w);
    fake_config fc = {.n_blocks = cfg.n_blocks, .block_size = cfg.block_size, .fail_at_step = 3};
    fake_backend *fb = fake_backend_new(&fc);
    sched_backend be;
    fake_backend_bind(fb, &be);
    sched *s;
    mla_err err;
    REQUIRE(sched_init(&s, &cfg, &be, &err) == MLA_OK);
    static job jobs[3];
    for (int i = 0; i < 3; i++) {
        random_job(&jobs[i], 10, 1);
        jobs[i].max_tokens = 20;
    }
    for (int i = 0; i < 2; i++) REQUIRE(submit_job(s, &jobs[i], i, 0, NULL) == SCHED_E_OK);
    for (int k = 0; k < 4; k++) sched_step(s);
    CHECK(w.r[0].finish == SCHED_FINISH_ERROR && strstr(w.r[0].error, "worker 1 is down"));
    CHECK(w.r[1].finish == SCHED_FINISH_ERROR && w.r[1].n_final == 1);
    /* the scheduler keeps serving afterwards */
    REQUIRE(submit_job(s, &jobs[2], 2, 0, NULL) == SCHED_E_OK);
    while (sched_step(s)) {}
    check_against_reference(&w, jobs + 2, 0, cfg.max_context, 0);
    CHECK(w.r[2].n_final == 1 && w.r[2].finish == SCHED_FINISH_LENGTH && w.r[2].n_tok == 20);
    sched_stats st;
    sched_get_stats(s, &st);
    CHECK(st.blocks_used == 0);
    sched_free(s);
    fake_backend_free(fb);
}

/* The scheduler on its own thread, requests from this one. */
static void test_threaded(void) {
    static world w;
    make_world(&w);
    sched_config cfg = base_cfg(&w);
    cfg.n_blocks = 64;
    fake_config fc = {.n_blocks = cfg.n_blocks, .block_size = cfg.block_size, .eos_period = 30,
                      .fail_at_step = -1};
    fake_backend *fb = fake_backend_new(&fc);
    sched_backend be;
    fake_backend_bind(fb, &be);
    sched *s;
    mla_err err;
    REQUIRE(sched_init(&s, &cfg, &be, &err) == MLA_OK);
    REQUIRE(sched_start(s, &err) == MLA_OK);
    static job jobs[40];
    uint64_t ids[40];
    for (int i = 0; i < 40; i++) {
        random_job(&jobs[i], 40, 40);
        REQUIRE(submit_job(s, &jobs[i], i, 2, &ids[i]) == SCHED_E_OK);
    }
    pthread_mutex_lock(&w.mu);
    while (w.finals < 40) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    sched_stop(s);
    check_against_reference(&w, jobs, 40, cfg.max_context, fc.eos_period);
    fake_stats fs;
    fake_backend_stats(fb, &fs);
    CHECK(fs.violations == 0 && fs.live_seqs == 0);
    mla_err e2;
    sched_request rq = {0};
    rq.prompt = jobs[0].prompt;
    rq.n_prompt = 1;
    rq.max_tokens = 1;
    CHECK(sched_submit(s, &rq, NULL, &e2) == SCHED_E_STOPPED);
    sched_free(s);
    fake_backend_free(fb);
}

int main(void) {
    test_random_workload();
    test_chunked_prefill_and_logprobs();
    test_stop_ids_and_context();
    test_cancel();
    test_refusals();
    test_backend_failure();
    test_threaded();
    return mla_test_finish();
}
