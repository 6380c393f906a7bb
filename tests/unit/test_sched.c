/* Scheduler tests against the deterministic fake backend (tests/serve/fake_backend.h): outputs
 * must equal the fake model run over the true sequence, whatever the batching, chunking and
 * preemption; the backend checks the cache bookkeeping at every step. The prefix cache tests
 * use sim (below), a backend that simulates the cache's contents shared between sequences. */
#include <pthread.h>
#include <stdarg.h>
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
    float plp[MAXT]; /* the prompt logprobs of the event that carried them (sched_event.plp) */
    int32_t plp_top0[MAXT];
    int n_plp, plp_events, plp_at_tok; /* plp_at_tok: tokens before that event's */
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
    if (ev->plp || ev->n_plp) {
        r->plp_events++;
        r->plp_at_tok = r->n_tok;
        r->n_plp = ev->n_plp;
        for (int k = 0; k < ev->n_plp && k < MAXT; k++) {
            r->plp[k] = ev->plp[k].logprob;
            r->plp_top0[k] = ev->plp[k].n_top > 0 ? ev->plp[k].top_ids[0] : -1;
        }
    }
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

/* job j as a greedy request (top alternatives a token), its events to slot idx */
static sched_request job_request(const job *j, int idx, int top) {
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
    return rq;
}

static int submit_job(sched *s, const job *j, int idx, int top, uint64_t *id) {
    const sched_request rq = job_request(j, idx, top);
    mla_err err;
    return sched_submit(s, &rq, id, &err);
}

static void random_job(job *j, int max_prompt, int max_new) {
    j->n_prompt = 1 + (int)rnd((uint32_t)max_prompt);
    for (int i = 0; i < j->n_prompt; i++) j->prompt[i] = (int32_t)rnd(256);
    j->max_tokens = 1 + (int)rnd((uint32_t)max_new);
    j->stop_id = -1;
}

/* Record i (the request submitted with user index i) against the reference run of job j. */
static void check_job(world *w, int i, const job *j, int max_context, uint32_t eos_period) {
    int32_t exp[MAXT * 2];
    int n_exp;
    enum sched_finish fin;
    expect(j, max_context, eos_period, exp, &n_exp, &fin);
    rec *r = &w->r[i];
    CHECKF(r->n_final == 1, "job %d: %d final events", i, r->n_final);
    CHECKF(r->events_after_final == 0, "job %d", i);
    CHECKF(r->finish == fin, "job %d: finish %s, expected %s", i, sched_finish_name(r->finish),
           sched_finish_name(fin));
    CHECKF(r->n_tok == n_exp, "job %d: %d tokens, expected %d", i, r->n_tok, n_exp);
    if (r->n_tok == n_exp) CHECKF(!memcmp(r->toks, exp, (size_t)n_exp * sizeof(int32_t)), "job %d tokens differ", i);
}

static void check_against_reference(world *w, job *jobs, int n, int max_context, uint32_t eos_period) {
    for (int i = 0; i < n; i++) check_job(w, i, &jobs[i], max_context, eos_period);
}

/* Many random requests through a small cache: batching, chunked prefill and preemption. */
/* A scheduler over a fresh fake backend (fc: its behaviour and cfg's cache geometry); *fb for the
 * test to inspect and free after sched_free. */
static sched *fake_sched(const fake_config *fc, const sched_config *cfg, fake_backend **fb) {
    *fb = fake_backend_new(fc);
    sched_backend be;
    fake_backend_bind(*fb, &be);
    sched *s;
    mla_err err;
    REQUIRE(sched_init(&s, cfg, &be, &err) == MLA_OK);
    return s;
}

/* A backend over the fake one that checks each sampled row's `last` (sched_plan_seq): set exactly
 * where the token ends the request by its length, its max_tokens (by request id) or the context. */
#define LAST_MAX_ID 256
typedef struct last_be {
    sched_backend in;
    int32_t max_tokens[LAST_MAX_ID], max_context;
    bool marked_id[LAST_MAX_ID];
    int64_t bad, marked;
} last_be;
static int last_run(void *ctx, const sched_plan *plan, sched_result *results, mla_err *err) {
    last_be *b = ctx;
    for (int i = 0; i < plan->n_seqs; i++) {
        const sched_plan_seq *p = &plan->seqs[i];
        const int32_t end = p->start_pos + p->n_tokens;
        const bool want = p->sample && p->seq_id < LAST_MAX_ID &&
                          (p->n_generated + 1 >= b->max_tokens[p->seq_id] || end + 1 >= b->max_context);
        if (p->last != want && b->bad++ < 5)
            fprintf(stderr, "seq %llu at %d (%d generated): last %d, want %d\n", (unsigned long long)p->seq_id, end,
                    p->n_generated, p->last, want);
        b->marked += p->last;
        if (p->last && p->seq_id < LAST_MAX_ID) b->marked_id[p->seq_id] = true;
    }
    return b->in.run_step(b->in.ctx, plan, results, err);
}
static void last_free(void *ctx, uint64_t id) {
    last_be *b = ctx;
    b->in.free_seq(b->in.ctx, id);
}

/* limit: cfg.long_prefill_tokens (0: none) */
static void test_random_workload(int32_t limit) {
    static world w;
    make_world(&w);
    sched_config cfg = base_cfg(&w);
    cfg.long_prefill_tokens = limit;
    fake_config fc = {.n_blocks = cfg.n_blocks, .block_size = cfg.block_size, .eos_period = 40,
                      .fail_at_step = -1};
    fake_backend *fb = fake_backend_new(&fc);
    static last_be lb;
    memset(&lb, 0, sizeof lb);
    lb.max_context = cfg.max_context;
    fake_backend_bind(fb, &lb.in);
    sched_backend be = {.ctx = &lb, .run_step = last_run, .free_seq = last_free};
    sched *s;
    mla_err err;
    REQUIRE(sched_init(&s, &cfg, &be, &err) == MLA_OK);
    static job jobs[60];
    int n_jobs = 60, submitted = 0;
    for (int i = 0; i < n_jobs; i++) random_job(&jobs[i], 70, 60);
    jobs[0].n_prompt = 100; /* a long prompt: several chunks */
    for (int i = 0; i < 100; i++) jobs[0].prompt[i] = i;
    jobs[1].n_prompt = 140; /* the context (150) ends it */
    jobs[1].max_tokens = 60;
    for (int i = 0; i < 140; i++) jobs[1].prompt[i] = 3 * i % 256;
    for (int i = 2; i < n_jobs; i += 4) jobs[i].max_tokens = 1; /* the prompt's row is the last (also grown: cut) */
    uint64_t id, ids[60];
    for (; submitted < 30; submitted++) {
        REQUIRE(submit_job(s, &jobs[submitted], submitted, 0, &id) == SCHED_E_OK && id < LAST_MAX_ID);
        lb.max_tokens[id] = jobs[submitted].max_tokens;
        ids[submitted] = id;
    }
    int steps = 0;
    while (steps < 100000) {
        int did = sched_step(s);
        steps++;
        if (submitted < n_jobs && steps % 3 == 0) {
            REQUIRE(submit_job(s, &jobs[submitted], submitted, 0, &id) == SCHED_E_OK && id < LAST_MAX_ID);
            lb.max_tokens[id] = jobs[submitted].max_tokens;
            ids[submitted++] = id;
        }
        sched_stats st;
        sched_get_stats(s, &st);
        CHECK(st.blocks_used <= st.blocks_total);
        if (!did && submitted == n_jobs && st.waiting == 0 && st.running == 0) break;
    }
    check_against_reference(&w, jobs, n_jobs, cfg.max_context, fc.eos_period);
    int n_length = 0, mismatch = 0;
    for (int i = 0; i < n_jobs; i++) {
        n_length += w.r[i].finish == SCHED_FINISH_LENGTH;
        /* the outcome: a request ended by its length had a marked row; a marked one ended with the
         * token of that row (by its length, or a stop token that came as its last) */
        const bool len = w.r[i].finish == SCHED_FINISH_LENGTH,
                   stop_last = w.r[i].finish == SCHED_FINISH_STOP &&
                               (w.r[i].n_tok == jobs[i].max_tokens || jobs[i].n_prompt + w.r[i].n_tok >= cfg.max_context);
        if (len != lb.marked_id[ids[i]] && !(stop_last && lb.marked_id[ids[i]]) && mismatch++ < 3)
            fprintf(stderr, "job %d: %s after %d tokens (max %d), marked %d\n", i, sched_finish_name(w.r[i].finish),
                    w.r[i].n_tok, jobs[i].max_tokens, lb.marked_id[ids[i]]);
    }
    CHECKF(mismatch == 0, "%d requests ended by length without a marked row, or marked and ended otherwise", mismatch);
    CHECKF(lb.bad == 0, "%lld sampled rows with the wrong `last`", (long long)lb.bad);
    /* every request that ended by its length was marked at its last token (a preempted one may
     * be marked again when recomputed) */
    CHECKF(lb.marked >= n_length && n_length > 1, "%lld rows marked last, %d requests ended by length",
           (long long)lb.marked, n_length);
    CHECK(w.r[1].finish == SCHED_FINISH_LENGTH && w.r[1].n_tok == 10);
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
    printf("random workload (long prefill limit %d): %d steps, %llu preemptions, %llu generated\n", limit, steps,
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
    fake_backend *fb;
    sched *s = fake_sched(&fc, &cfg, &fb);
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

/* A backend that loses one prompt logprob of its first entry that has any (a worker answering
 * for fewer positions than the plan gave): the scheduler fails that request alone. */
typedef struct short_be {
    sched_backend in;
} short_be;
static int short_run(void *ctx, const sched_plan *plan, sched_result *results, mla_err *err) {
    short_be *b = ctx;
    int rc = b->in.run_step(b->in.ctx, plan, results, err);
    for (int i = 0; rc == MLA_OK && i < plan->n_seqs; i++)
        if (results[i].n_plp > 0) {
            results[i].n_plp--;
            break;
        }
    return rc;
}
static void short_free(void *ctx, uint64_t id) {
    short_be *b = ctx;
    b->in.free_seq(b->in.ctx, id);
}

/* sampling.prompt_logprobs: every prompt token's logprob after the first, computed (never taken
 * from the prefix cache) in entries of at most SCHED_PLP_CHUNK tokens and delivered once, with
 * the first token; the requests around it keep the cache. */
static void test_prompt_logprobs(void) {
    static world w;
    make_world(&w);
    sched_config cfg = base_cfg(&w);
    cfg.n_blocks = 300;
    cfg.max_context = 1000;
    cfg.max_step_tokens = 512;
    cfg.max_seqs = 300; /* prompt-logprobs entries: at most SCHED_PLP_CHUNK tokens (and max_seqs) */
    cfg.prefix_cache = true;
    fake_config fc = {.n_blocks = cfg.n_blocks, .block_size = cfg.block_size, .fail_at_step = -1};
    fake_backend *fb;
    sched *s = fake_sched(&fc, &cfg, &fb);
    static job j;
    j.n_prompt = 400;
    for (int i = 0; i < j.n_prompt; i++) j.prompt[i] = 'a' + (i * 7) % 26;
    j.max_tokens = 3;
    j.stop_id = -1;
    /* 0: fills the cache; 1: prompt logprobs over the same prompt; 2: the cache again */
    REQUIRE(submit_job(s, &j, 0, 0, NULL) == SCHED_E_OK);
    while (sched_step(s)) {}
    sched_request rq = job_request(&j, 1, 3);
    rq.sampling.prompt_logprobs = true;
    mla_err err;
    REQUIRE(sched_submit(s, &rq, NULL, &err) == SCHED_E_OK);
    int steps = 0;
    while (w.r[1].n_tok == 0 && steps < 10) {
        sched_step(s);
        steps++;
    }
    CHECKF(steps == 2, "400 prompt tokens in entries of %d: 2 steps (took %d; %s %s)", SCHED_PLP_CHUNK, steps,
           sched_finish_name(w.r[1].finish), w.r[1].error);
    while (sched_step(s)) {}
    sched_stats st;
    sched_get_stats(s, &st);
    const uint64_t hits_before = st.prefix_hits;
    CHECKF(st.prefix_queries == (uint64_t)j.n_prompt, "the prompt-logprobs request looked nothing up (%llu queries)",
           (unsigned long long)st.prefix_queries);
    REQUIRE(submit_job(s, &j, 2, 0, NULL) == SCHED_E_OK);
    while (sched_step(s)) {}
    sched_get_stats(s, &st);
    CHECKF(st.prefix_hits > hits_before, "the request after it reuses the cache (%llu -> %llu hits)",
           (unsigned long long)hits_before, (unsigned long long)st.prefix_hits);
    CHECKF(hits_before == 0, "the prompt-logprobs request took nothing from the cache (%llu hits in all)",
           (unsigned long long)hits_before);
    check_against_reference(&w, &j, 1, cfg.max_context, 0);
    rec *r = &w.r[1];
    CHECKF(r->plp_events == 1 && r->plp_at_tok == 0 && r->n_plp == j.n_prompt - 1,
           "one event with %d prompt logprobs, the first token's (%d events, %d logprobs, at token %d)", j.n_prompt - 1,
           r->plp_events, r->n_plp, r->plp_at_tok);
    int bad = 0;
    for (int k = 1; k < j.n_prompt && k - 1 < r->n_plp; k++) {
        sched_result ref;
        fake_plp(j.prompt, k, 3, &ref);
        bad += r->plp[k - 1] != ref.logprob || r->plp_top0[k - 1] != ref.top_ids[0];
    }
    CHECKF(bad == 0, "%d prompt logprobs differ from the reference", bad);
    CHECK(w.r[0].plp_events == 0 && w.r[2].plp_events == 0);
    /* a one-token prompt: nothing to report, the event says so */
    rq.prompt = j.prompt;
    rq.n_prompt = 1;
    rq.user = (void *)(intptr_t)3;
    REQUIRE(sched_submit(s, &rq, NULL, &err) == SCHED_E_OK);
    while (sched_step(s)) {}
    CHECK(w.r[3].n_tok == 3 && w.r[3].n_plp == 0 && w.r[3].finish == SCHED_FINISH_LENGTH);
    fake_stats fs;
    fake_backend_stats(fb, &fs);
    CHECKF(fs.violations == 0, "%lld violations", (long long)fs.violations);
    sched_free(s);
    fake_backend_free(fb);

    /* entries of at most max_seqs tokens (the rows the workers keep logits for) */
    cfg.max_seqs = 7;
    s = fake_sched(&fc, &cfg, &fb);
    rq = job_request(&j, 4, 1);
    rq.sampling.prompt_logprobs = true;
    REQUIRE(sched_submit(s, &rq, NULL, &err) == SCHED_E_OK);
    steps = 0;
    while (w.r[4].n_tok == 0 && steps < 100) {
        sched_step(s);
        steps++;
    }
    CHECKF(steps == (j.n_prompt + 6) / 7, "400 prompt tokens in entries of 7: %d steps (took %d)", (j.n_prompt + 6) / 7,
           steps);
    while (sched_step(s)) {}
    sched_result last;
    fake_plp(j.prompt, j.n_prompt - 1, 1, &last);
    CHECK(w.r[4].n_plp == j.n_prompt - 1 && w.r[4].plp[j.n_prompt - 2] == last.logprob);
    /* two of them and a plain request at once: 7 prompt-logprob rows a step in all, the plain
     * prompt beside them not held back */
    make_world(&w);
    for (int k = 0; k < 2; k++) {
        rq = job_request(&j, k, 2);
        rq.sampling.prompt_logprobs = true;
        REQUIRE(sched_submit(s, &rq, NULL, &err) == SCHED_E_OK);
    }
    REQUIRE(submit_job(s, &j, 2, 0, NULL) == SCHED_E_OK);
    steps = 0;
    while (w.r[2].n_tok == 0 && steps < 1000) {
        sched_step(s);
        steps++;
    }
    CHECKF(steps < 10, "the plain prompt beside them: its first token after %d steps", steps);
    while (sched_step(s)) {}
    for (int k = 0; k < 3; k++) check_job(&w, k, &j, cfg.max_context, 0);
    CHECK(w.r[0].n_plp == j.n_prompt - 1 && w.r[1].n_plp == j.n_prompt - 1 && w.r[2].plp_events == 0 &&
          w.r[0].plp[j.n_prompt - 2] == last.logprob && w.r[1].plp[j.n_prompt - 2] == last.logprob);
    fake_backend_stats(fb, &fs);
    CHECKF(fs.max_plp_tokens == 7, "at most 7 prompt-logprob rows a step (%lld)", (long long)fs.max_plp_tokens);
    CHECKF(fs.violations == 0, "%lld violations", (long long)fs.violations);
    sched_free(s);
    fake_backend_free(fb);

    /* a backend that answers for fewer positions: that request fails, the one beside it goes on */
    make_world(&w);
    fb = fake_backend_new(&fc);
    short_be sb;
    fake_backend_bind(fb, &sb.in);
    sched_backend be = {.ctx = &sb, .run_step = short_run, .free_seq = short_free};
    REQUIRE(sched_init(&s, &cfg, &be, &err) == MLA_OK);
    rq = job_request(&j, 0, 0);
    rq.sampling.prompt_logprobs = true;
    REQUIRE(sched_submit(s, &rq, NULL, &err) == SCHED_E_OK);
    REQUIRE(submit_job(s, &j, 1, 0, NULL) == SCHED_E_OK);
    while (sched_step(s)) {}
    CHECKF(w.r[0].finish == SCHED_FINISH_ERROR && strstr(w.r[0].error, "prompt logprobs") && w.r[0].n_tok == 0,
           "fewer prompt logprobs than positions: an error (%s: %s)", sched_finish_name(w.r[0].finish), w.r[0].error);
    CHECK(w.r[1].finish == SCHED_FINISH_LENGTH && w.r[1].n_tok == 3);
    sched_free(s);
    fake_backend_free(fb);
}

static void test_stop_ids_and_context(void) {
    static world w;
    make_world(&w);
    sched_config cfg = base_cfg(&w);
    cfg.max_context = 40;
    fake_config fc = {.n_blocks = cfg.n_blocks, .block_size = cfg.block_size, .fail_at_step = -1};
    fake_backend *fb;
    sched *s = fake_sched(&fc, &cfg, &fb);
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
    fake_backend *fb;
    sched *s = fake_sched(&fc, &cfg, &fb);
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
    fake_backend *fb;
    sched *s = fake_sched(&fc, &cfg, &fb);
    mla_err err;
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
    /* the queue's cap (3) counts the waiting past the batch's free places (max_seqs 8, none
     * running): 8 + 3 wait, the 12th is refused */
    for (int i = 3; i < 11; i++) CHECK(submit_job(s, &j, i, 0, NULL) == SCHED_E_OK);
    CHECK(submit_job(s, &j, 11, 0, NULL) == SCHED_E_QUEUE_FULL);
    sched_request rq = {0};
    rq.prompt = j.prompt;
    rq.n_prompt = 5;
    rq.max_tokens = 1;
    rq.sampling.top_logprobs = 21;
    CHECK(sched_submit(s, &rq, NULL, &err) == SCHED_E_INVALID && strstr(err.msg, "top_logprobs"));
    while (sched_step(s)) {}
    for (int i = 0; i < 11; i++) CHECKF(w.r[i].n_final == 1, "request %d", i);
    CHECK(w.r[11].n_final == 0);
    CHECK(w.r[0].n_tok == 35);
    fake_stats fs;
    fake_backend_stats(fb, &fs);
    CHECK(fs.violations == 0);
    sched_free(s);
    fake_backend_free(fb);
}

/* A backend's per-sequence error (a worker's grammar that cannot go on) ends that request alone
 * with the message, its token dropped; the other request of the same steps runs to its end. */
static void test_seq_error(void) {
    static world w;
    make_world(&w);
    sched_config cfg = base_cfg(&w);
    fake_config fc = {.n_blocks = cfg.n_blocks, .block_size = cfg.block_size, .fail_at_step = -1,
                      .seq_fail_prompt = 7, .seq_fail_gen = 3};
    fake_backend *fb;
    sched *s = fake_sched(&fc, &cfg, &fb);
    static job jobs[2];
    for (int i = 0; i < 2; i++) {
        random_job(&jobs[i], 9, 1);
        jobs[i].n_prompt = 7 + 2 * i; /* the fake fails prompts of 7 */
        jobs[i].max_tokens = 12;
        REQUIRE(submit_job(s, &jobs[i], i, 0, NULL) == SCHED_E_OK);
    }
    while (sched_step(s)) {}
    CHECK(w.r[0].finish == SCHED_FINISH_ERROR && strstr(w.r[0].error, "grammar cannot go on"));
    CHECKF(w.r[0].n_tok == 3 && w.r[0].n_final == 1, "%d tokens, %d final events", w.r[0].n_tok, w.r[0].n_final);
    check_job(&w, 1, &jobs[1], cfg.max_context, 0);
    CHECK(w.r[1].finish == SCHED_FINISH_LENGTH && w.r[1].n_tok == 12);
    sched_stats st;
    sched_get_stats(s, &st);
    CHECK(st.blocks_used == 0);
    sched_free(s);
    fake_backend_free(fb);
}

static void test_backend_failure(void) {
    static world w;
    make_world(&w);
    sched_config cfg = base_cfg(&w);
    fake_config fc = {.n_blocks = cfg.n_blocks, .block_size = cfg.block_size, .fail_at_step = 3};
    fake_backend *fb;
    sched *s = fake_sched(&fc, &cfg, &fb);
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
    check_job(&w, 2, &jobs[2], cfg.max_context, 0);
    CHECK(w.r[2].n_final == 1 && w.r[2].finish == SCHED_FINISH_LENGTH && w.r[2].n_tok == 20);
    sched_stats st;
    sched_get_stats(s, &st);
    CHECK(st.blocks_used == 0);
    sched_free(s);
    fake_backend_free(fb);
}

/* ---- prefix cache ----
 *
 * sim: a backend that keeps what the cache holds: per block id and slot, the token id written
 * there and, like a real cache row, a value that depends on the whole prefix (a hash of the row
 * before it, read through the table, and the token). Every plan entry first checks that the
 * rows below start_pos, through the sequence's table as the backend holds it (the entries it
 * had plus the new ones from n_blocks_sent on), are that sequence's tokens computed after that
 * sequence's prefix: reused and earlier computed rows must be the right ones. Then it
 * checks that no block it writes is in another live sequence's table, writes the new tokens and
 * samples fake_next() over the rows read back. It also checks n_blocks_sent against the table
 * it holds and, when sim.s is set, the scheduler's own bookkeeping (sched_check) mid-step. */

#define SIM_LOG_TABLE 32

typedef struct sim_seq {
    uint64_t id;
    int32_t *table;
    int32_t n, cap, len;
} sim_seq;

typedef struct sim_entry {
    uint64_t id;
    int64_t step; /* the sim's step that ran it, from 1 */
    int32_t start_pos, n_tokens, n_blocks, n_sent;
    int32_t table[SIM_LOG_TABLE];
} sim_entry;

typedef struct sim {
    int32_t n_blocks, bs;
    uint32_t eos_period;
    int32_t *slot;        /* n_blocks * bs tokens, -1 never written */
    uint64_t *row;        /* per slot: row_value(value of the row before, token) */
    uint64_t *truth;      /* scratch: the row values of the true sequence */
    uint8_t *reused;      /* block read as a cached prefix since it was last written */
    sim_seq *seqs;
    int n_seqs, cap_seqs;
    sim_entry *log;
    int n_log, cap_log;
    int32_t *scratch;
    sched *s;
    int64_t violations, steps, computed, frees, evicted_reused, first_plan_hits;
} sim;

static void sim_violation(sim *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sim_violation(sim *m, const char *fmt, ...) {
    if (m->violations++ < 10) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "sim: ");
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
}

static void sim_init(sim *m, int32_t n_blocks, int32_t bs, uint32_t eos_period) {
    memset(m, 0, sizeof(*m));
    m->n_blocks = n_blocks;
    m->bs = bs;
    m->eos_period = eos_period;
    m->slot = malloc((size_t)n_blocks * (size_t)bs * sizeof(int32_t));
    for (int64_t i = 0; i < (int64_t)n_blocks * bs; i++) m->slot[i] = -1;
    m->row = calloc((size_t)n_blocks * (size_t)bs, sizeof(uint64_t));
    m->truth = malloc(MAXT * 2 * sizeof(uint64_t));
    m->reused = calloc((size_t)n_blocks, 1);
    m->scratch = malloc(MAXT * 2 * sizeof(int32_t));
}

static void sim_done(sim *m) {
    for (int i = 0; i < m->n_seqs; i++) free(m->seqs[i].table);
    free(m->seqs);
    free(m->log);
    free(m->slot);
    free(m->row);
    free(m->truth);
    free(m->reused);
    free(m->scratch);
}

#define ROW_SEED 0x243F6A8885A308D3ULL

static uint64_t row_value(uint64_t before, int32_t token) {
    uint64_t h = (before ^ (uint32_t)token) * 0x9E3779B97F4A7C15ULL;
    return h ^ (h >> 31);
}

static sim_seq *sim_find(sim *m, uint64_t id) {
    for (int i = 0; i < m->n_seqs; i++)
        if (m->seqs[i].id == id) return &m->seqs[i];
    return NULL;
}

static bool sim_held_by_other(sim *m, uint64_t id, int32_t b) {
    for (int i = 0; i < m->n_seqs; i++) {
        if (m->seqs[i].id == id) continue;
        for (int32_t k = 0; k < m->seqs[i].n; k++)
            if (m->seqs[i].table[k] == b) return true;
    }
    return false;
}

static void sim_check_sched(sim *m) {
    mla_err e;
    if (m->s && sched_check(m->s, &e) != MLA_OK) sim_violation(m, "sched_check: %s", e.msg);
}

static int sim_run(void *ctx, const sched_plan *plan, sched_result *results, mla_err *err) {
    (void)err;
    sim *m = ctx;
    m->steps++;
    int32_t bs = m->bs;
    if (plan->block_size != bs) sim_violation(m, "block size %d", plan->block_size);
    sim_check_sched(m);
    for (int i = 0; i < plan->n_seqs; i++) {
        const sched_plan_seq *p = &plan->seqs[i];
        int32_t end = p->start_pos + p->n_tokens;
        if (m->n_log == m->cap_log) {
            m->cap_log = m->cap_log ? 2 * m->cap_log : 256;
            m->log = realloc(m->log, (size_t)m->cap_log * sizeof(*m->log));
        }
        sim_entry *le = &m->log[m->n_log++];
        memset(le, -1, sizeof(*le));
        le->id = p->seq_id;
        le->step = m->steps;
        le->start_pos = p->start_pos;
        le->n_tokens = p->n_tokens;
        le->n_blocks = p->n_blocks;
        le->n_sent = p->n_blocks_sent;
        for (int32_t k = 0; k < p->n_blocks && k < SIM_LOG_TABLE; k++) le->table[k] = p->block_table[k];
        if (p->n_tokens < 1 || p->start_pos < 0 || (int64_t)p->n_blocks * bs < end || p->n_blocks_sent < 0 ||
            p->n_blocks_sent > p->n_blocks || end > MAXT * 2) {
            sim_violation(m, "seq %llu: bad entry (start %d, %d tokens, %d blocks, %d sent)",
                          (unsigned long long)p->seq_id, p->start_pos, p->n_tokens, p->n_blocks, p->n_blocks_sent);
            continue;
        }
        sim_seq *q = sim_find(m, p->seq_id);
        if (!q) {
            if (p->n_blocks_sent != 0)
                sim_violation(m, "seq %llu: first plan says %d blocks were sent", (unsigned long long)p->seq_id,
                              p->n_blocks_sent);
            if (p->start_pos % bs) sim_violation(m, "seq %llu: first plan starts mid-block", (unsigned long long)p->seq_id);
            if (m->n_seqs == m->cap_seqs) {
                m->cap_seqs = m->cap_seqs ? 2 * m->cap_seqs : 16;
                m->seqs = realloc(m->seqs, (size_t)m->cap_seqs * sizeof(*m->seqs));
            }
            q = &m->seqs[m->n_seqs++];
            memset(q, 0, sizeof(*q));
            q->id = p->seq_id;
            m->first_plan_hits += p->start_pos;
            for (int32_t k = 0; k < p->start_pos / bs; k++)
                if (p->block_table[k] >= 0 && p->block_table[k] < m->n_blocks) m->reused[p->block_table[k]] = 1;
        } else {
            if (p->n_blocks_sent != q->n)
                sim_violation(m, "seq %llu: n_blocks_sent %d, the backend holds %d", (unsigned long long)p->seq_id,
                              p->n_blocks_sent, q->n);
            for (int32_t k = 0; k < q->n && k < p->n_blocks; k++)
                if (q->table[k] != p->block_table[k])
                    sim_violation(m, "seq %llu: sent table entry %d changed (%d -> %d)", (unsigned long long)p->seq_id,
                                  k, q->table[k], p->block_table[k]);
            if (p->start_pos != q->len)
                sim_violation(m, "seq %llu: start %d, %d rows computed", (unsigned long long)p->seq_id, p->start_pos,
                              q->len);
        }
        /* the backend's table: what it held, then the new entries */
        int32_t keep = p->n_blocks_sent < q->n ? p->n_blocks_sent : q->n;
        if (q->cap < p->n_blocks) {
            q->cap = p->n_blocks + 8;
            q->table = realloc(q->table, (size_t)q->cap * sizeof(int32_t));
        }
        q->n = keep;
        bool bad = false;
        for (int32_t k = keep; k < p->n_blocks; k++) {
            int32_t b = p->block_table[k];
            if (b < 0 || b >= m->n_blocks) bad = true;
            q->table[q->n++] = b;
        }
        if (bad) {
            sim_violation(m, "seq %llu: block id out of range", (unsigned long long)p->seq_id);
            continue;
        }
        if (memcmp(p->tokens, p->seq_tokens + p->start_pos, (size_t)p->n_tokens * sizeof(int32_t)))
            sim_violation(m, "seq %llu: tokens are not the sequence's", (unsigned long long)p->seq_id);
        for (int32_t pos = 0; pos < end; pos++)
            m->truth[pos] = row_value(pos ? m->truth[pos - 1] : ROW_SEED, p->seq_tokens[pos]);
        for (int32_t pos = 0; pos < p->start_pos; pos++) {
            int64_t at = (int64_t)q->table[pos / bs] * bs + pos % bs;
            if (m->slot[at] != p->seq_tokens[pos] || m->row[at] != m->truth[pos]) {
                sim_violation(m, "seq %llu: row %d (block %d) holds token %d%s, the sequence has %d",
                              (unsigned long long)p->seq_id, pos, q->table[pos / bs], m->slot[at],
                              m->slot[at] == p->seq_tokens[pos] ? " after another prefix" : "", p->seq_tokens[pos]);
                break;
            }
        }
        for (int32_t pos = p->start_pos; pos < end; pos++) {
            int32_t b = q->table[pos / bs];
            /* the row before, as this sequence's table finds it */
            uint64_t before = pos ? m->row[(int64_t)q->table[(pos - 1) / bs] * bs + (pos - 1) % bs] : ROW_SEED;
            if (pos == p->start_pos || pos % bs == 0) {
                if (sim_held_by_other(m, p->seq_id, b))
                    sim_violation(m, "seq %llu writes block %d that another live sequence holds",
                                  (unsigned long long)p->seq_id, b);
                if (pos % bs == 0 && m->reused[b]) {
                    m->evicted_reused++;
                    m->reused[b] = 0;
                }
            }
            m->slot[(int64_t)b * bs + pos % bs] = p->tokens[pos - p->start_pos];
            m->row[(int64_t)b * bs + pos % bs] = row_value(before, p->tokens[pos - p->start_pos]);
        }
        q->len = end;
        m->computed += p->n_tokens;
        if (p->sample) {
            if (end != p->n_prompt + p->n_generated)
                sim_violation(m, "seq %llu: sampling at %d of %d", (unsigned long long)p->seq_id, end,
                              p->n_prompt + p->n_generated);
            for (int32_t pos = 0; pos < end; pos++) m->scratch[pos] = m->slot[(int64_t)q->table[pos / bs] * bs + pos % bs];
            if (m->row[(int64_t)q->table[(end - 1) / bs] * bs + (end - 1) % bs] != m->truth[end - 1])
                sim_violation(m, "seq %llu: its last row was computed after another prefix", (unsigned long long)p->seq_id);
            fake_next(m->scratch, end, m->eos_period, p->sampling->top_logprobs, &results[i]);
        }
    }
    return MLA_OK;
}

static void sim_free_seq(void *ctx, uint64_t id) {
    sim *m = ctx;
    m->frees++;
    for (int i = 0; i < m->n_seqs; i++)
        if (m->seqs[i].id == id) {
            free(m->seqs[i].table);
            m->seqs[i] = m->seqs[--m->n_seqs];
            return;
        }
    sim_violation(m, "free_seq of unknown seq %llu", (unsigned long long)id);
}

/* A scheduler over a fresh sim with cfg's cache geometry; epoch, paused: the backend's
 * cache_epoch and paused, or NULL. */
static sched *sim_sched_hooks(sim *m, const sched_config *cfg, uint32_t eos_period, uint64_t (*epoch)(void *),
                              bool (*paused)(void *)) {
    sim_init(m, cfg->n_blocks, cfg->block_size, eos_period);
    sched_backend be = {
        .ctx = m, .run_step = sim_run, .free_seq = sim_free_seq, .cache_epoch = epoch, .paused = paused};
    sched *s;
    mla_err err;
    REQUIRE(sched_init(&s, cfg, &be, &err) == MLA_OK);
    m->s = s;
    return s;
}

static sched *sim_sched(sim *m, const sched_config *cfg, uint32_t eos_period) {
    return sim_sched_hooks(m, cfg, eos_period, NULL, NULL);
}

static sched_stats stats_of(sched *s) {
    sched_stats st;
    sched_get_stats(s, &st);
    return st;
}

/* Between steps, from outside the scheduler: the blocks in the live tables are the used ones,
 * the live sequences the running ones. */
static void sim_check_usage(sim *m, sched *s) {
    sched_stats st = stats_of(s);
    uint8_t *held = calloc((size_t)m->n_blocks, 1);
    int32_t used = 0;
    for (int i = 0; i < m->n_seqs; i++)
        for (int32_t k = 0; k < m->seqs[i].n; k++)
            if (!held[m->seqs[i].table[k]]) {
                held[m->seqs[i].table[k]] = 1;
                used++;
            }
    if (used + st.blocks_pinned != st.blocks_used || st.running != m->n_seqs ||
        st.blocks_used + st.blocks_cached > st.blocks_total)
        sim_violation(m, "%d blocks in %d live tables; the scheduler: %d used, %d cached, %d running", used, m->n_seqs,
                      st.blocks_used, st.blocks_cached, st.running);
    free(held);
}

/* Steps until idle (at most max_steps), checking the bookkeeping after each step. */
static int sim_drain(sched *s, sim *m, int max_steps) {
    int steps = 0;
    while (steps < max_steps && sched_step(s)) {
        steps++;
        sim_check_sched(m);
        sim_check_usage(m, s);
    }
    return steps;
}

/* The log entries of one sequence, in order. */
static int entries_of(const sim *m, uint64_t id, const sim_entry **out, int max) {
    int n = 0;
    for (int i = 0; i < m->n_log && n < max; i++)
        if (m->log[i].id == id) out[n++] = &m->log[i];
    return n;
}

static void fill(job *j, const int32_t *stem, int n_stem, int32_t first, int n_tail, int max_tokens) {
    if (n_stem > 0) memcpy(j->prompt, stem, (size_t)n_stem * sizeof(int32_t));
    for (int i = 0; i < n_tail; i++) j->prompt[n_stem + i] = (first + i) % 256;
    j->n_prompt = n_stem + n_tail;
    j->max_tokens = max_tokens;
    j->stop_id = -1;
}

static sched_config prefix_cfg(world *w) {
    sched_config c = base_cfg(w);
    c.prefix_cache = true;
    return c;
}

/* Two requests with a 3-block common prefix: the second computes only its own tail. */
static void test_prefix_shared(void) {
    static world w;
    make_world(&w);
    sched_config cfg = prefix_cfg(&w);
    static sim m;
    sched *s = sim_sched(&m, &cfg, 0);
    int32_t stem[12];
    for (int i = 0; i < 12; i++) stem[i] = 200 + i;
    static job jobs[3];
    fill(&jobs[0], stem, 12, 'x', 3, 5);
    fill(&jobs[1], stem, 12, 'a', 5, 5);
    fill(&jobs[2], stem, 12, 'k', 2, 30);
    uint64_t ids[3];
    REQUIRE(submit_job(s, &jobs[0], 0, 0, &ids[0]) == SCHED_E_OK);
    sim_drain(s, &m, 1000);
    sched_stats st = stats_of(s);
    CHECK(st.prefix_queries == 15 && st.prefix_hits == 0);
    CHECKF(st.blocks_cached == 4 && st.blocks_used == 0, "%d cached (3 prompt blocks + 1 of generated tokens), %d used",
           st.blocks_cached, st.blocks_used);
    int64_t computed = m.computed;
    REQUIRE(submit_job(s, &jobs[1], 1, 0, &ids[1]) == SCHED_E_OK);
    sched_step(s);
    st = stats_of(s);
    CHECKF(st.prefix_hits == 12 && st.prefix_queries == 15 + 17, "%llu hits of %llu", (unsigned long long)st.prefix_hits,
           (unsigned long long)st.prefix_queries);
    CHECKF(m.computed - computed == 5, "the second request computed %lld prompt tokens", (long long)(m.computed - computed));
    const sim_entry *a[64], *b[64];
    int na = entries_of(&m, ids[0], a, 64), nb = entries_of(&m, ids[1], b, 64);
    REQUIRE(na > 0 && nb == 1);
    CHECK(b[0]->start_pos == 12 && b[0]->n_tokens == 5 && b[0]->n_sent == 0);
    for (int k = 0; k < 3; k++) CHECK(b[0]->table[k] == a[0]->table[k]);
    CHECK(b[0]->table[3] != a[0]->table[3]);
    /* a third one while the second runs: the prefix is held twice, counted once */
    REQUIRE(submit_job(s, &jobs[2], 2, 0, &ids[2]) == SCHED_E_OK);
    sched_step(s);
    st = stats_of(s);
    CHECK(st.running == 2 && st.prefix_hits == 24);
    CHECKF(st.blocks_used == 3 + 2 + 1, "blocks used %d: the shared prefix counts once", st.blocks_used);
    sim_drain(s, &m, 1000);
    check_against_reference(&w, jobs, 3, cfg.max_context, 0);
    CHECK(m.violations == 0 && m.n_seqs == 0);
    st = stats_of(s);
    CHECK(st.blocks_used == 0 && st.running == 0 && st.preemptions == 0);
    sched_free(s);
    sim_done(&m);
}

/* Two requests with one uncached stem computed in the same step: the second one's stem blocks
 * duplicate the first's, and its own tail is cached all the same (registered under the first's
 * blocks, which it holds meanwhile); each one sent again takes all its full blocks. */
static void test_prefix_race(void) {
    static world w;
    make_world(&w);
    sched_config cfg = prefix_cfg(&w);
    static sim m;
    sched *s = sim_sched(&m, &cfg, 0);
    int32_t stem[12];
    for (int i = 0; i < 12; i++) stem[i] = 60 + i;
    static job jobs[4];
    fill(&jobs[0], stem, 12, 'a', 9, 3);
    fill(&jobs[1], stem, 12, 'b', 9, 3);
    uint64_t ids[4];
    mla_err err;
    REQUIRE(submit_job(s, &jobs[0], 0, 0, &ids[0]) == SCHED_E_OK);
    REQUIRE(submit_job(s, &jobs[1], 1, 0, &ids[1]) == SCHED_E_OK);
    sched_step(s); /* both admitted: 21 and 11 tokens (32 a step), nothing cached before */
    const sim_entry *e[64];
    REQUIRE(entries_of(&m, ids[0], e, 64) == 1 && entries_of(&m, ids[1], e, 64) == 1);
    REQUIRE(sched_check(s, &err) == MLA_OK);
    sched_stats st = stats_of(s);
    CHECKF(st.blocks_pinned == 0, "the duplicates' cached blocks are the first one's, in its table (%d pinned)",
           st.blocks_pinned);
    sim_drain(s, &m, 1000);
    REQUIRE(sched_check(s, &err) == MLA_OK);
    st = stats_of(s);
    const uint64_t hits0 = st.prefix_hits;
    CHECKF(st.blocks_used == 0 && st.blocks_pinned == 0 && st.blocks_cached == 3 + 2 + 2,
           "cached: the stem once and each tail's two full blocks (%d)", st.blocks_cached);
    jobs[2] = jobs[0];
    jobs[3] = jobs[1];
    REQUIRE(submit_job(s, &jobs[2], 2, 0, &ids[2]) == SCHED_E_OK);
    REQUIRE(submit_job(s, &jobs[3], 3, 0, &ids[3]) == SCHED_E_OK);
    sched_step(s);
    st = stats_of(s);
    CHECKF(st.prefix_hits - hits0 == 2 * 20, "each sent again takes its 5 full blocks (%llu tokens)",
           (unsigned long long)(st.prefix_hits - hits0));
    sim_drain(s, &m, 1000);
    check_against_reference(&w, jobs, 4, cfg.max_context, 0);
    CHECK(m.violations == 0 && m.n_seqs == 0);
    REQUIRE(sched_check(s, &err) == MLA_OK);
    sched_free(s);
    sim_done(&m);
}

/* A request that computes its whole prompt (the repetition penalty looks nothing up) over a
 * prompt the cache holds with no one using it: its blocks duplicate evictable cached ones, which
 * it must not hold (the admission counted them as free): with a pool the prompt fills twice over
 * exactly, holding them left it no block for its answer, preempting itself forever. */
static void test_prefix_dup_evictable(void) {
    static world w;
    make_world(&w);
    sched_config cfg = prefix_cfg(&w); /* 40 blocks of 4, 32 tokens a step */
    static sim m;
    sched *s = sim_sched(&m, &cfg, 0);
    static job jobs[2];
    fill(&jobs[0], NULL, 0, 'p', 80, 1); /* 20 blocks, cached when it ends */
    jobs[1] = jobs[0];
    jobs[1].max_tokens = 6;
    uint64_t ids[2];
    mla_err err;
    REQUIRE(submit_job(s, &jobs[0], 0, 0, &ids[0]) == SCHED_E_OK);
    sim_drain(s, &m, 1000);
    sched_stats st = stats_of(s);
    REQUIRE(st.blocks_cached == 20 && st.blocks_used == 0);
    sched_request rq = job_request(&jobs[1], 1, 0);
    rq.sampling.repetition_penalty = 1.1f;
    REQUIRE(sched_submit(s, &rq, &ids[1], &err) == SCHED_E_OK);
    const int steps = sim_drain(s, &m, 200);
    st = stats_of(s);
    CHECKF(w.r[1].n_final == 1 && steps < 20 && st.preemptions == 0,
           "the second one finishes in %d steps (%llu preemptions, %d finals)", steps,
           (unsigned long long)st.preemptions, w.r[1].n_final);
    REQUIRE(sched_check(s, &err) == MLA_OK);
    check_against_reference(&w, jobs, 2, cfg.max_context, 0);
    CHECK(m.violations == 0);
    sched_free(s);
    sim_done(&m);
}

/* sched_request.after: a request that shares its leader's prompt waits until that prompt is
 * computed (the requests behind it go on meanwhile), then takes its full blocks from the cache;
 * a leader that leaves, or an id that is not waiting or prefilling, holds nothing back. */
static void test_prefix_after(void) {
    static world w;
    make_world(&w);
    sched_config cfg = prefix_cfg(&w);
    static sim m;
    sched *s = sim_sched(&m, &cfg, 0);
    int32_t stem[40];
    for (int i = 0; i < 40; i++) stem[i] = 100 + i;
    static job jobs[7];
    fill(&jobs[0], stem, 40, 'a', 0, 4); /* a prompt of two steps (32 tokens a step) */
    jobs[1] = jobs[0];                    /* its sibling */
    fill(&jobs[2], NULL, 0, 'q', 5, 3);   /* another request behind them */
    mla_err err;
    uint64_t ids[7];
    REQUIRE(submit_job(s, &jobs[0], 0, 0, &ids[0]) == SCHED_E_OK);
    sched_request rq = job_request(&jobs[1], 1, 0);
    rq.after = ids[0];
    REQUIRE(sched_submit(s, &rq, &ids[1], &err) == SCHED_E_OK);
    REQUIRE(submit_job(s, &jobs[2], 2, 0, &ids[2]) == SCHED_E_OK);
    const sim_entry *a[64], *b[64], *c[64];
    sched_step(s); /* the leader's first 32 tokens; the third request (budget permitting) but not the sibling */
    CHECK(entries_of(&m, ids[0], a, 64) == 1 && entries_of(&m, ids[1], b, 64) == 0);
    REQUIRE(sched_check(s, &err) == MLA_OK);
    sched_step(s); /* the leader's prompt ends: the gate opens after this step */
    CHECK(entries_of(&m, ids[1], b, 64) == 0 && entries_of(&m, ids[2], c, 64) >= 1);
    REQUIRE(sched_check(s, &err) == MLA_OK);
    sched_step(s);
    REQUIRE(entries_of(&m, ids[1], b, 64) == 1);
    CHECKF(b[0]->start_pos == 36 && b[0]->n_tokens == 4, "the sibling starts at %d with %d tokens (9 cached blocks)",
           b[0]->start_pos, b[0]->n_tokens);
    sim_drain(s, &m, 1000);
    /* a leader cancelled before its first step, and an id that names nothing: no gate */
    fill(&jobs[3], stem, 10, 'c', 2, 3);
    jobs[4] = jobs[3];
    fill(&jobs[5], NULL, 0, 'z', 6, 2);
    REQUIRE(submit_job(s, &jobs[3], 3, 0, &ids[3]) == SCHED_E_OK);
    rq = job_request(&jobs[4], 4, 0);
    rq.after = ids[3];
    REQUIRE(sched_submit(s, &rq, &ids[4], &err) == SCHED_E_OK);
    rq = job_request(&jobs[5], 5, 0);
    rq.after = 999999;
    REQUIRE(sched_submit(s, &rq, &ids[5], &err) == SCHED_E_OK);
    sched_cancel(s, ids[3]);
    REQUIRE(sched_check(s, &err) == MLA_OK);
    sched_step(s);
    CHECK(entries_of(&m, ids[4], b, 64) == 1 && entries_of(&m, ids[5], c, 64) == 1);
    REQUIRE(sched_check(s, &err) == MLA_OK);
    sim_drain(s, &m, 1000);
    /* a follower cancelled while it waits: its leader goes on (and no longer counts it) */
    fill(&jobs[6], stem, 20, 'f', 1, 2);
    REQUIRE(submit_job(s, &jobs[6], 6, 0, &ids[6]) == SCHED_E_OK);
    rq = job_request(&jobs[6], 3, 0); /* its events to slot 3, cancelled twice over */
    rq.after = ids[6];
    uint64_t f_id;
    REQUIRE(sched_submit(s, &rq, &f_id, &err) == SCHED_E_OK);
    sched_cancel(s, f_id);
    sched_step(s);
    REQUIRE(sched_check(s, &err) == MLA_OK);
    sim_drain(s, &m, 1000);
    CHECK(w.r[3].n_final == 2 && w.r[3].finish == SCHED_FINISH_CANCELLED);
    check_job(&w, 6, &jobs[6], cfg.max_context, 0);
    check_against_reference(&w, jobs, 3, cfg.max_context, 0);
    check_job(&w, 4, &jobs[4], cfg.max_context, 0);
    check_job(&w, 5, &jobs[5], cfg.max_context, 0);
    CHECK(m.violations == 0 && m.n_seqs == 0);
    sched_free(s);
    sim_done(&m);
}

/* The backend loses every row between two steps (a worker group that restarted: cache_epoch
 * moves, the sim forgets its rows and sequences): the running requests start over from position
 * 0, the prefix cache reuses nothing computed before, and every answer is the reference's. */
static uint64_t g_sim_epoch;
static uint64_t sim_epoch(void *ctx) {
    (void)ctx;
    return g_sim_epoch;
}
static void sim_lose_rows(sim *m) {
    for (int64_t i = 0; i < (int64_t)m->n_blocks * m->bs; i++) m->slot[i] = -1, m->row[i] = 0;
    memset(m->reused, 0, (size_t)m->n_blocks);
    for (int i = 0; i < m->n_seqs; i++) free(m->seqs[i].table);
    m->n_seqs = 0;
}

static void test_cache_lost(void) {
    static world w;
    make_world(&w);
    sched_config cfg = prefix_cfg(&w);
    static sim m;
    sched *s = sim_sched_hooks(&m, &cfg, 0, sim_epoch, NULL);
    int32_t stem[12];
    for (int i = 0; i < 12; i++) stem[i] = 300 + i;
    static job jobs[4];
    fill(&jobs[0], stem, 12, 'x', 3, 5);
    fill(&jobs[1], stem, 12, 'a', 5, 20);
    fill(&jobs[2], NULL, 0, 'q', 9, 25);
    fill(&jobs[3], stem, 12, 'm', 2, 6);
    uint64_t ids[4];
    REQUIRE(submit_job(s, &jobs[0], 0, 0, &ids[0]) == SCHED_E_OK);
    sim_drain(s, &m, 1000);
    REQUIRE(stats_of(s).blocks_cached > 0);
    REQUIRE(submit_job(s, &jobs[1], 1, 0, &ids[1]) == SCHED_E_OK);
    REQUIRE(submit_job(s, &jobs[2], 2, 0, &ids[2]) == SCHED_E_OK);
    for (int k = 0; k < 4; k++) sched_step(s);
    sched_stats st = stats_of(s);
    REQUIRE(st.running == 2 && st.prefix_hits == 12);
    sim_lose_rows(&m);
    g_sim_epoch++;
    const int64_t frees = m.frees;
    sched_step(s);
    st = stats_of(s);
    CHECKF(st.prefix_hits == 12 && st.preemptions == 0 && st.running == 2,
           "after the loss: %llu hits, %llu preemptions, %d running", (unsigned long long)st.prefix_hits,
           (unsigned long long)st.preemptions, st.running);
    const sim_entry *e[64];
    for (int j = 1; j <= 2; j++) {
        int n = entries_of(&m, ids[j], e, 64);
        CHECKF(n > 0 && e[n - 1]->start_pos == 0 && e[n - 1]->n_sent == 0, "request %d starts over (start %d)", j,
               n > 0 ? e[n - 1]->start_pos : -1);
    }
    CHECK(m.frees == frees); /* nothing to free at a backend that forgot everything */
    sim_drain(s, &m, 1000);
    /* the stem is cached again (computed after the loss): a later request reuses it */
    REQUIRE(submit_job(s, &jobs[3], 3, 0, &ids[3]) == SCHED_E_OK);
    sim_drain(s, &m, 1000);
    CHECK(stats_of(s).prefix_hits == 24);
    check_against_reference(&w, jobs, 4, cfg.max_context, 0);
    /* but not one with a penalty: a backend learns a sequence's tokens from the plans alone
     * (checked after the others: its events go to slot 3 too) */
    sched_request rq = job_request(&jobs[3], 3, 0);
    rq.max_tokens = 2;
    rq.sampling.repetition_penalty = 1.3f;
    uint64_t pid;
    mla_err err;
    const uint64_t queries = stats_of(s).prefix_queries;
    REQUIRE(sched_submit(s, &rq, &pid, &err) == SCHED_E_OK);
    sim_drain(s, &m, 1000);
    const int np = entries_of(&m, pid, e, 64);
    CHECK(stats_of(s).prefix_hits == 24 && np > 0 && e[0]->start_pos == 0);
    CHECKF(stats_of(s).prefix_queries == queries, "it looked nothing up: %llu queries, %llu before",
           (unsigned long long)stats_of(s).prefix_queries, (unsigned long long)queries);
    /* one with presence or frequency penalties (they count the generated tokens) reuses the
     * prompt's blocks */
    rq.sampling.repetition_penalty = 1.0f;
    rq.sampling.frequency_penalty = 0.5f;
    REQUIRE(sched_submit(s, &rq, &pid, &err) == SCHED_E_OK);
    sim_drain(s, &m, 1000);
    const int nf = entries_of(&m, pid, e, 64);
    CHECKF(stats_of(s).prefix_hits == 36 && nf > 0 && e[0]->start_pos == 12, "frequency penalty: %llu hits, start %d",
           (unsigned long long)stats_of(s).prefix_hits, nf > 0 ? e[0]->start_pos : -1);
    CHECK(m.violations == 0 && m.n_seqs == 0);
    sched_free(s);
    sim_done(&m);
}

/* A prompt of exactly k blocks reuses at most k - 1 of them: one token is always computed. */
static void test_prefix_cap(void) {
    static world w;
    make_world(&w);
    sched_config cfg = prefix_cfg(&w);
    static sim m;
    sched *s = sim_sched(&m, &cfg, 0);
    int32_t stem[13];
    for (int i = 0; i < 13; i++) stem[i] = 60 + 3 * i;
    static job jobs[6];
    fill(&jobs[0], stem, 12, 0, 0, 1);  /* 12 tokens: 3 full blocks registered */
    fill(&jobs[1], stem, 12, 0, 0, 1);  /* the same: 2 reused, 4 tokens computed */
    fill(&jobs[2], stem, 13, 0, 0, 1);  /* one more token: all 3 reused */
    fill(&jobs[3], stem, 4, 0, 0, 1);   /* one block: none reused */
    fill(&jobs[4], stem, 3, 0, 0, 1);   /* less than a block */
    fill(&jobs[5], stem, 12, 0, 0, 3);  /* 12 again, longer output */
    int32_t want_hits[6] = {0, 8, 12, 0, 0, 8};
    for (int i = 0; i < 6; i++) {
        sched_stats before = stats_of(s);
        int64_t computed = m.computed;
        uint64_t id;
        REQUIRE(submit_job(s, &jobs[i], i, 0, &id) == SCHED_E_OK);
        sim_drain(s, &m, 1000);
        sched_stats st = stats_of(s);
        CHECKF(st.prefix_hits - before.prefix_hits == (uint64_t)want_hits[i], "job %d: %llu tokens hit, expected %d", i,
               (unsigned long long)(st.prefix_hits - before.prefix_hits), want_hits[i]);
        CHECK(st.prefix_queries - before.prefix_queries == (uint64_t)jobs[i].n_prompt);
        const sim_entry *e[8];
        REQUIRE(entries_of(&m, id, e, 8) >= 1);
        CHECKF(e[0]->start_pos == want_hits[i] && e[0]->n_tokens == jobs[i].n_prompt - want_hits[i],
               "job %d: first plan at %d for %d tokens", i, e[0]->start_pos, e[0]->n_tokens);
        CHECK(m.computed - computed == jobs[i].n_prompt - want_hits[i] + jobs[i].max_tokens - 1);
    }
    check_against_reference(&w, jobs, 6, cfg.max_context, 0);
    CHECK(m.violations == 0);
    sched_free(s);
    sim_done(&m);
}

/* The backend is paused (a worker group restarting after a failure, be.paused): no step runs
 * and no request fails while it is; a cancellation still finishes; once it is back with its rows
 * lost (cache_epoch moved), the running requests start over, the waiting ones are admitted, and
 * every answer is the reference's. */
static bool g_sim_paused;
static bool sim_paused(void *ctx) {
    (void)ctx;
    return g_sim_paused;
}

static void test_paused(void) {
    static world w;
    make_world(&w);
    sched_config cfg = base_cfg(&w);
    cfg.max_seqs = 2;
    static sim m;
    g_sim_epoch = 0;
    sched *s = sim_sched_hooks(&m, &cfg, 0, sim_epoch, sim_paused);
    static job jobs[4];
    for (int i = 0; i < 4; i++) {
        random_job(&jobs[i], 10, 1);
        jobs[i].max_tokens = 12;
    }
    uint64_t ids[4];
    for (int i = 0; i < 4; i++) REQUIRE(submit_job(s, &jobs[i], i, 0, &ids[i]) == SCHED_E_OK);
    for (int k = 0; k < 3; k++) sched_step(s);
    REQUIRE(stats_of(s).running == 2);
    g_sim_paused = true;
    const int64_t steps = m.steps;
    for (int k = 0; k < 5; k++) CHECK(sched_step(s) == 0);
    sched_cancel(s, ids[3]); /* waiting: it finishes while paused */
    sched_step(s);
    sched_stats st = stats_of(s);
    CHECKF(m.steps == steps && st.running == 2 && st.waiting == 1, "paused: %lld steps ran, %d running, %d waiting",
           (long long)(m.steps - steps), st.running, st.waiting);
    for (int i = 0; i < 3; i++) CHECKF(w.r[i].n_final == 0, "paused: request %d not finished", i);
    CHECK(w.r[3].finish == SCHED_FINISH_CANCELLED && w.r[3].n_final == 1);
    sim_lose_rows(&m);
    g_sim_epoch++;
    g_sim_paused = false;
    sim_drain(s, &m, 1000);
    check_against_reference(&w, jobs, 3, cfg.max_context, 0);
    CHECK(m.violations == 0);
    sched_free(s);
    sim_done(&m);
}

/* Evictable blocks leave least recently used first, free blocks go before any of them, and a
 * reuse makes a block recent again. */
static void test_prefix_lru(void) {
    static world w;
    make_world(&w);
    sched_config cfg = prefix_cfg(&w);
    cfg.n_blocks = 10;
    static sim m;
    sched *s = sim_sched(&m, &cfg, 0);
    int32_t none[1] = {0};
    static job jobs[8];
    fill(&jobs[0], none, 0, 10, 9, 1);   /* A: 2 full blocks cached, 1 partial freed */
    fill(&jobs[1], none, 0, 40, 9, 1);   /* B */
    fill(&jobs[2], none, 0, 70, 9, 1);   /* C */
    fill(&jobs[3], none, 0, 10, 9, 1);   /* A again: reuses A's 2 blocks, now the most recent */
    fill(&jobs[4], none, 0, 100, 21, 1); /* D: 6 blocks = 4 free + the 2 least recent (B's) */
    fill(&jobs[5], none, 0, 10, 9, 1);   /* A: still cached */
    fill(&jobs[6], none, 0, 70, 9, 1);   /* C: still cached */
    fill(&jobs[7], none, 0, 40, 9, 1);   /* B: evicted */
    int32_t want_hits[8] = {0, 0, 0, 8, 0, 8, 8, 0};
    int32_t want_cached[8] = {2, 4, 6, 6, 9, 9, 9, 9}; /* B evicts two of D's, caches its own two */
    uint64_t ids[8];
    for (int i = 0; i < 8; i++) {
        sched_stats before = stats_of(s);
        REQUIRE(submit_job(s, &jobs[i], i, 0, &ids[i]) == SCHED_E_OK);
        sim_drain(s, &m, 1000);
        sched_stats st = stats_of(s);
        CHECKF(st.prefix_hits - before.prefix_hits == (uint64_t)want_hits[i], "job %d: %llu tokens hit, expected %d", i,
               (unsigned long long)(st.prefix_hits - before.prefix_hits), want_hits[i]);
        CHECKF(st.blocks_cached == want_cached[i] && st.blocks_used == 0, "job %d: %d blocks cached, expected %d", i,
               st.blocks_cached, want_cached[i]);
    }
    const sim_entry *a[4], *b[4], *c[4], *d[4];
    REQUIRE(entries_of(&m, ids[0], a, 4) == 1 && entries_of(&m, ids[1], b, 4) == 1);
    REQUIRE(entries_of(&m, ids[2], c, 4) == 1 && entries_of(&m, ids[4], d, 4) == 1);
    REQUIRE(d[0]->n_blocks == 6);
    /* B's blocks were released last block first: its second block is the older */
    CHECKF(d[0]->table[4] == b[0]->table[1] && d[0]->table[5] == b[0]->table[0],
           "D took blocks %d %d, B's cached blocks were %d %d", d[0]->table[4], d[0]->table[5], b[0]->table[1],
           b[0]->table[0]);
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 2; j++) CHECK(d[0]->table[k] != a[0]->table[j] && d[0]->table[k] != c[0]->table[j]);
    check_against_reference(&w, jobs, 8, cfg.max_context, 0);
    CHECK(m.violations == 0);
    sched_free(s);
    sim_done(&m);
}

/* Shared blocks stay while any holder runs: the first user is cancelled and the pool is
 * pressed hard while the second still decodes on them. */
static void test_prefix_refcount(void) {
    static world w;
    make_world(&w);
    sched_config cfg = prefix_cfg(&w);
    cfg.n_blocks = 16;
    cfg.max_context = 60;
    static sim m;
    sched *s = sim_sched(&m, &cfg, 0);
    int32_t stem[12];
    for (int i = 0; i < 12; i++) stem[i] = 150 + i;
    static job jobs[12];
    fill(&jobs[0], stem, 12, 1, 2, 40);
    fill(&jobs[1], stem, 12, 5, 3, 40);
    uint64_t ids[12];
    REQUIRE(submit_job(s, &jobs[0], 0, 0, &ids[0]) == SCHED_E_OK);
    sched_step(s);
    REQUIRE(submit_job(s, &jobs[1], 1, 0, &ids[1]) == SCHED_E_OK);
    sched_step(s);
    sched_stats st = stats_of(s);
    REQUIRE(st.running == 2 && st.prefix_hits == 12);
    const sim_entry *e[64];
    REQUIRE(entries_of(&m, ids[1], e, 64) == 1 && e[0]->start_pos == 12);
    int32_t shared[3] = {e[0]->table[0], e[0]->table[1], e[0]->table[2]};
    sched_cancel(s, ids[0]);
    sched_step(s);
    CHECK(w.r[0].finish == SCHED_FINISH_CANCELLED);
    /* ten more distinct requests: the pool runs out, the younger ones are preempted, cached
     * blocks are evicted, but the blocks under request 1 are not handed out */
    for (int i = 2; i < 12; i++) {
        fill(&jobs[i], stem, 0, 20 * i, 10 + i, 10);
        REQUIRE(submit_job(s, &jobs[i], i, 0, &ids[i]) == SCHED_E_OK);
    }
    int n_e = 0;
    while (w.r[1].n_final == 0 && sched_step(s)) {
        sim_check_sched(&m);
        n_e = entries_of(&m, ids[1], e, 64);
        for (int k = 0; k < 3; k++) CHECK(e[n_e - 1]->table[k] == shared[k]);
    }
    CHECK(n_e > 20);
    sim_drain(s, &m, 10000);
    st = stats_of(s);
    CHECKF(st.preemptions > 0, "the pool should have run out (%llu preemptions)", (unsigned long long)st.preemptions);
    for (int i = 1; i < 12; i++) check_job(&w, i, &jobs[i], cfg.max_context, 0);
    CHECK(m.violations == 0 && m.n_seqs == 0 && st.blocks_used == 0);
    sched_free(s);
    sim_done(&m);
}

/* ---- the plan stream with prefix_cache off, against a recording of the code before it ---- */

typedef struct tracer {
    uint64_t h;
    int64_t entries, frees;
} tracer;

static void trace_mix(tracer *t, uint64_t v) {
    for (int b = 0; b < 8; b++) {
        t->h ^= (v >> (8 * b)) & 0xffu;
        t->h *= 1099511628211ULL;
    }
}

static int trace_run(void *ctx, const sched_plan *plan, sched_result *results, mla_err *err) {
    (void)err;
    tracer *t = ctx;
    trace_mix(t, (uint64_t)plan->n_seqs);
    trace_mix(t, (uint64_t)plan->n_tokens);
    for (int i = 0; i < plan->n_seqs; i++) {
        const sched_plan_seq *p = &plan->seqs[i];
        t->entries++;
        trace_mix(t, p->seq_id);
        trace_mix(t, (uint64_t)p->start_pos);
        trace_mix(t, (uint64_t)p->n_tokens);
        trace_mix(t, (uint64_t)p->sample);
        trace_mix(t, (uint64_t)p->n_blocks);
        for (int32_t k = 0; k < p->n_blocks; k++) trace_mix(t, (uint64_t)p->block_table[k]);
        if (p->sample) fake_next(p->seq_tokens, p->start_pos + p->n_tokens, 23, 0, &results[i]);
    }
    return MLA_OK;
}

static void trace_free(void *ctx, uint64_t id) {
    tracer *t = ctx;
    t->frees++;
    trace_mix(t, 0xF4EEULL);
    trace_mix(t, id);
}

static uint64_t trace_events_h = 1469598103934665603ULL;
static void trace_on_event(void *ctx, const sched_event *ev) {
    (void)ctx;
    uint64_t v[4] = {ev->req_id, (uint64_t)ev->has_token, (uint64_t)(ev->has_token ? ev->result.token : -1),
                     (uint64_t)ev->finish};
    for (int i = 0; i < 4; i++)
        for (int b = 0; b < 8; b++) {
            trace_events_h ^= (v[i] >> (8 * b)) & 0xffu;
            trace_events_h *= 1099511628211ULL;
        }
}

/* A fixed workload (shared and repeated prompts, cancellations, preemption) through a small
 * cache; returns the hash of every plan, free and event. */
static uint64_t trace_workload(int64_t *entries, int64_t *frees, uint64_t *preemptions) {
    tracer t = {.h = 1469598103934665603ULL};
    trace_events_h = 1469598103934665603ULL;
    sched_config c = {0};
    c.block_size = 4;
    c.n_blocks = 24;
    c.max_seqs = 6;
    c.max_step_tokens = 20;
    c.max_queue = 100;
    c.max_context = 90;
    c.on_event = trace_on_event;
    sched_backend be = {.ctx = &t, .run_step = trace_run, .free_seq = trace_free};
    sched *s;
    mla_err err;
    REQUIRE(sched_init(&s, &c, &be, &err) == MLA_OK);
    uint64_t r = 0x2545F4914F6CDD1DULL;
    int32_t stems[3][40];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 40; i++) stems[k][i] = (int32_t)((k * 131 + i * 7) % 256);
    uint64_t ids[40] = {0};
    int submitted = 0;
    for (int step = 0; step < 20000; step++) {
        if (submitted < 40 && step % 2 == 0) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            int32_t prompt[60];
            int stem = (int)(r % 4), n = 1 + (int)((r >> 8) % 50);
            for (int i = 0; i < n; i++)
                prompt[i] = stem < 3 && i < 40 ? stems[stem][i] : (int32_t)((r >> (i % 40)) % 256);
            sched_request rq = {0};
            rq.prompt = prompt;
            rq.n_prompt = n;
            rq.max_tokens = 1 + (int)((r >> 20) % 30);
            sched_sampling_default(&rq.sampling);
            REQUIRE(sched_submit(s, &rq, &ids[submitted], &err) == SCHED_E_OK);
            submitted++;
        }
        if (step == 15) sched_cancel(s, ids[3]);
        if (step == 31) sched_cancel(s, ids[10]);
        int did = sched_step(s);
        if (!did && submitted == 40) break;
    }
    sched_stats st;
    sched_get_stats(s, &st);
    *preemptions = st.preemptions;
    sched_free(s);
    *entries = t.entries;
    *frees = t.frees;
    return t.h ^ (trace_events_h * 31);
}

/* A block whose key another block already holds stays private, and so do the blocks after it
 * (also those filled in later steps): their key would name a block that goes back to the free
 * stack and may come back cached under another prefix. */
static void test_prefix_duplicates(void) {
    static world w;
    make_world(&w);
    sched_config cfg = prefix_cfg(&w);
    static sim m;
    sched *s = sim_sched(&m, &cfg, 0);
    int32_t p[8], q[8];
    for (int i = 0; i < 8; i++) p[i] = 1 + 7 * i;
    for (int i = 0; i < 8; i++) q[i] = 90 + i;
    static job jobs[4];
    fill(&jobs[0], p, 8, 0, 0, 6); /* 3 full blocks, the third of generated tokens */
    fill(&jobs[1], p, 8, 0, 0, 6); /* the same, in the same steps: all its blocks private */
    fill(&jobs[2], q, 8, 200, 1, 1); /* takes the second request's first two blocks, caches them */
    uint64_t ids[4];
    REQUIRE(submit_job(s, &jobs[0], 0, 0, &ids[0]) == SCHED_E_OK);
    REQUIRE(submit_job(s, &jobs[1], 1, 0, &ids[1]) == SCHED_E_OK);
    sim_drain(s, &m, 100);
    sched_stats st = stats_of(s);
    CHECKF(st.blocks_cached == 3 && st.prefix_hits == 0, "%d blocks cached, %llu tokens hit", st.blocks_cached,
           (unsigned long long)st.prefix_hits);
    REQUIRE(w.r[1].n_tok == 6);
    /* the last request: Q (the third request's 2 blocks), then the second one's third block */
    memcpy(jobs[3].prompt, q, sizeof(q));
    memcpy(jobs[3].prompt + 8, w.r[1].toks, 4 * sizeof(int32_t));
    jobs[3].prompt[12] = 3;
    jobs[3].n_prompt = 13;
    jobs[3].max_tokens = 1;
    jobs[3].stop_id = -1;
    for (int i = 2; i < 4; i++) {
        REQUIRE(submit_job(s, &jobs[i], i, 0, &ids[i]) == SCHED_E_OK);
        sim_drain(s, &m, 100);
    }
    st = stats_of(s);
    CHECKF(st.prefix_hits == 8, "%llu tokens hit: Q's 2 blocks only", (unsigned long long)st.prefix_hits);
    check_against_reference(&w, jobs, 4, cfg.max_context, 0);
    CHECK(m.violations == 0);
    sched_free(s);
    sim_done(&m);
}

/* Admission counts a reused block once: a request whose prefix is held by a running one needs
 * only blocks for its own tail. */
static void test_prefix_admission(void) {
    static world w;
    make_world(&w);
    sched_config cfg = prefix_cfg(&w);
    cfg.n_blocks = 8;
    static sim m;
    sched *s = sim_sched(&m, &cfg, 0);
    int32_t stem[16];
    for (int i = 0; i < 16; i++) stem[i] = 30 + i;
    static job jobs[2];
    fill(&jobs[0], stem, 16, 90, 4, 8); /* 20 + 8: 7 blocks of 8 */
    fill(&jobs[1], stem, 16, 120, 2, 2); /* 18 + 2: 5 blocks, 4 of them shared */
    REQUIRE(submit_job(s, &jobs[0], 0, 0, NULL) == SCHED_E_OK);
    sched_step(s); /* 20 tokens in 5 blocks */
    REQUIRE(submit_job(s, &jobs[1], 1, 0, NULL) == SCHED_E_OK);
    sched_step(s); /* request 0 takes a 6th block; request 1 fits in the 2 left with 4 shared */
    sched_stats st = stats_of(s);
    CHECKF(st.running == 2 && st.waiting == 0, "%d running, %d waiting", st.running, st.waiting);
    CHECKF(st.blocks_used == 7, "%d blocks used", st.blocks_used);
    CHECK(st.prefix_hits == 16);
    sim_drain(s, &m, 1000);
    check_against_reference(&w, jobs, 2, cfg.max_context, 0);
    st = stats_of(s);
    CHECK(st.preemptions == 0 && m.violations == 0);
    /* the capacity refusal names the request and the cache in tokens */
    static job big;
    fill(&big, stem, 16, 0, 0, 17);
    sched_request rq = {0};
    rq.prompt = big.prompt;
    rq.n_prompt = big.n_prompt;
    rq.max_tokens = big.max_tokens;
    sched_sampling_default(&rq.sampling);
    mla_err err;
    CHECK(sched_submit(s, &rq, NULL, &err) == SCHED_E_CAPACITY);
    CHECKF(strstr(err.msg, "33 tokens") && strstr(err.msg, "32 tokens"), "%s", err.msg);
    rq.max_tokens = 16;
    CHECK(sched_submit(s, &rq, NULL, &err) == SCHED_E_OK);
    sim_drain(s, &m, 1000);
    CHECK(m.violations == 0);
    sched_free(s);
    sim_done(&m);
}

/* A preempted request resumes from the prefix cache: a plain one also from its cached generated
 * tokens; one with a frequency penalty from its prompt's blocks only (a backend counts the
 * generated tokens its plans send). The younger request (a 6-token prompt) is preempted when the
 * older needs its 5th block of 7; its second block (2 prompt tokens, 2 generated) is then still
 * cached. */
static void test_penalty_resume(void) {
    int32_t start[2] = {-1, -1};
    for (int pen = 0; pen < 2; pen++) {
        static world w;
        make_world(&w);
        sched_config cfg = prefix_cfg(&w);
        cfg.n_blocks = 7;
        static sim m;
        sched *s = sim_sched(&m, &cfg, 0);
        static job two[2];
        fill(&two[0], NULL, 0, 1, 8, 10);
        fill(&two[1], NULL, 0, 100, 6, 8);
        uint64_t ids[2];
        REQUIRE(submit_job(s, &two[0], 0, 0, &ids[0]) == SCHED_E_OK);
        sched_request rq = job_request(&two[1], 1, 0);
        rq.sampling.frequency_penalty = pen ? 0.5f : 0.0f;
        mla_err err;
        REQUIRE(sched_submit(s, &rq, &ids[1], &err) == SCHED_E_OK);
        sim_drain(s, &m, 100);
        CHECKF(stats_of(s).preemptions == 1, "%llu preemptions", (unsigned long long)stats_of(s).preemptions);
        const sim_entry *b[32];
        const int n = entries_of(&m, ids[1], b, 32);
        for (int k = 1; k < n; k++)
            if (b[k]->n_sent == 0) start[pen] = b[k]->start_pos;
        check_against_reference(&w, two, 2, cfg.max_context, 0);
        CHECK(m.violations == 0);
        sched_free(s);
        sim_done(&m);
    }
    CHECKF(start[0] == 8 && start[1] == 4, "resumed at %d (plain) and %d (frequency penalty)", start[0], start[1]);
}

/* n_blocks_sent: what the backend holds, step by step, and back to 0 after a preemption. */
static void test_blocks_sent(void) {
    for (int pc = 0; pc < 2; pc++) {
        static world w;
        make_world(&w);
        sched_config cfg = base_cfg(&w);
        cfg.prefix_cache = pc;
        cfg.max_step_tokens = 4;
        static sim m;
        sched *s = sim_sched(&m, &cfg, 0);
        static job j;
        fill(&j, NULL, 0, 7, 10, 8);
        uint64_t id;
        REQUIRE(submit_job(s, &j, 0, 0, &id) == SCHED_E_OK);
        sim_drain(s, &m, 100);
        static const int32_t want[10][4] = {{0, 4, 1, 0},  {4, 4, 2, 1},  {8, 2, 3, 2},  {10, 1, 3, 3},
                                            {11, 1, 3, 3}, {12, 1, 4, 3}, {13, 1, 4, 4}, {14, 1, 4, 4},
                                            {15, 1, 4, 4}, {16, 1, 5, 4}};
        const sim_entry *e[16];
        int n = entries_of(&m, id, e, 16);
        CHECKF(n == 10, "%d plans", n);
        for (int k = 0; k < n && k < 10; k++)
            CHECKF(e[k]->start_pos == want[k][0] && e[k]->n_tokens == want[k][1] && e[k]->n_blocks == want[k][2] &&
                       e[k]->n_sent == want[k][3],
                   "plan %d: start %d, %d tokens, %d blocks, %d sent", k, e[k]->start_pos, e[k]->n_tokens,
                   e[k]->n_blocks, e[k]->n_sent);
        check_against_reference(&w, &j, 1, cfg.max_context, 0);
        CHECK(m.violations == 0);
        sched_free(s);
        sim_done(&m);

        /* two requests in 6 blocks: the younger is preempted when the older needs its 4th */
        make_world(&w);
        cfg = base_cfg(&w);
        cfg.prefix_cache = pc;
        cfg.n_blocks = 6;
        s = sim_sched(&m, &cfg, 0);
        static job two[2];
        fill(&two[0], NULL, 0, 1, 8, 6);
        fill(&two[1], NULL, 0, 100, 8, 14);
        uint64_t ids[2];
        REQUIRE(submit_job(s, &two[0], 0, 0, &ids[0]) == SCHED_E_OK);
        REQUIRE(submit_job(s, &two[1], 1, 0, &ids[1]) == SCHED_E_OK);
        sim_drain(s, &m, 100);
        sched_stats st = stats_of(s);
        CHECKF(st.preemptions == 1, "%llu preemptions", (unsigned long long)st.preemptions);
        const sim_entry *b[32];
        n = entries_of(&m, ids[1], b, 32);
        int resumed = -1;
        for (int k = 1; k < n; k++)
            if (b[k]->n_sent == 0) resumed = k;
        REQUIRE(resumed == 5); /* prefill, positions 8..11, then the resumption */
        /* with the cache its first two blocks (the prompt) are still there, its third was
         * evicted for the older request's fourth block */
        CHECKF(b[resumed]->start_pos == (pc ? 8 : 0) && b[resumed]->n_tokens == 13 - b[resumed]->start_pos,
               "resumed at %d for %d tokens", b[resumed]->start_pos, b[resumed]->n_tokens);
        if (pc) CHECK(b[resumed]->table[0] == b[0]->table[0] && b[resumed]->table[1] == b[0]->table[1]);
        /* a resumption is looked up again: 8 + 8 + 13 tokens, 8 found */
        CHECKF(st.prefix_queries == (pc ? 29u : 0u) && st.prefix_hits == (pc ? 8u : 0u), "%llu of %llu tokens hit",
               (unsigned long long)st.prefix_hits, (unsigned long long)st.prefix_queries);
        CHECK(b[resumed + 1]->n_sent == b[resumed]->n_blocks);
        check_against_reference(&w, two, 2, cfg.max_context, 0);
        CHECK(m.violations == 0);
        sched_free(s);
        sim_done(&m);
    }
}

/* decode_lookahead: every one-token row that is its sequence's last pending token holds the block
 * of the position after it as well (here the pool has room): at a block boundary the table already
 * has the next block, which without the lookahead would come a plan later; other rows are sized as
 * without it, and the outputs are the same. */
static void test_decode_lookahead(void) {
    static world w;
    make_world(&w);
    sched_config cfg = base_cfg(&w);
    cfg.decode_lookahead = true;
    cfg.max_step_tokens = 4;
    static sim m;
    static job j;
    fill(&j, NULL, 0, 7, 10, 8);
    sched *s = sim_sched(&m, &cfg, 0);
    uint64_t id;
    REQUIRE(submit_job(s, &j, 0, 0, &id) == SCHED_E_OK);
    sim_drain(s, &m, 100);
    const sim_entry *e[16];
    int n = entries_of(&m, id, e, 16), boundaries = 0;
    CHECKF(n == 10, "%d plans", n);
    for (int k = 0; k < n; k++) {
        const int32_t end = e[k]->start_pos + e[k]->n_tokens, cover = e[k]->n_blocks * cfg.block_size;
        if (e[k]->n_tokens == 1 && end < 10 + 8 - 1) {
            CHECKF(cover >= end + 1, "plan %d: a decode row ending at %d holds %d positions", k, end, cover);
            boundaries += end % cfg.block_size == 0;
        } else {
            CHECKF(cover >= end && cover < end + cfg.block_size, "plan %d: %d positions for %d", k, cover, end);
        }
    }
    CHECKF(boundaries > 0, "no decode row ended at a block boundary (block size %d)", cfg.block_size);
    check_against_reference(&w, &j, 1, cfg.max_context, 0);
    CHECK(m.violations == 0);
    sched_free(s);
    sim_done(&m);
}

/* 64 requests, shared and distinct prefixes, through a small pool: preemption and eviction;
 * every output must equal that of a huge pool without the cache. */
static void pressure_jobs(job *jobs, int n) {
    static int32_t stems[4][40];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 40; i++) stems[k][i] = (int32_t)((k * 71 + i * 13 + 5) % 256);
    for (int i = 0; i < n; i++) {
        int kind = (int)rnd(6); /* 0-3: a stem, 4-5: distinct */
        int n_stem = kind < 4 ? 8 + (int)rnd(30) : 0;
        int n_tail = (kind < 4 ? 0 : 1) + (int)rnd(20);
        fill(&jobs[i], kind < 4 ? stems[kind] : NULL, n_stem, (int32_t)rnd(256), n_tail, 1 + (int)rnd(24));
    }
}

static int run_pressure(world *w, job *jobs, int n, bool prefix, int32_t n_blocks, int32_t bs, sched_stats *out,
                        sim *m) {
    make_world(w);
    sched_config cfg = base_cfg(w);
    cfg.prefix_cache = prefix;
    cfg.n_blocks = n_blocks;
    cfg.block_size = bs;
    cfg.max_context = 80;
    cfg.max_step_tokens = 24;
    sched *s = sim_sched(m, &cfg, 37);
    int submitted = 0, steps = 0;
    for (; submitted < 16; submitted++) REQUIRE(submit_job(s, &jobs[submitted], submitted, 1, NULL) == SCHED_E_OK);
    for (; steps < 100000; steps++) {
        if (submitted < n && steps % 2 == 0) {
            REQUIRE(submit_job(s, &jobs[submitted], submitted, 1, NULL) == SCHED_E_OK);
            submitted++;
        }
        int did = sched_step(s);
        sim_check_sched(m);
        sim_check_usage(m, s);
        if (!did && submitted == n) break;
    }
    *out = stats_of(s);
    sched_free(s);
    return steps;
}

static void test_prefix_pressure(void) {
    static world small, huge;
    static job jobs[64];
    rng = 0x9E3779B97F4A7C15ULL;
    pressure_jobs(jobs, 64);
    const int32_t sizes[][2] = {{4, 24}, {1, 90}, {3, 30}, {8, 12}}; /* block size, blocks (>= 80 tokens) */
    for (int v = 0; v < 4; v++) {
        static sim m1, m2;
        sched_stats st1, st2;
        int steps = run_pressure(&small, jobs, 64, true, sizes[v][1], sizes[v][0], &st1, &m1);
        run_pressure(&huge, jobs, 64, false, 4096, sizes[v][0], &st2, &m2);
        for (int i = 0; i < 64; i++) {
            rec *a = &small.r[i], *b = &huge.r[i];
            CHECKF(a->n_final == 1 && b->n_final == 1 && a->finish == b->finish && a->n_tok == b->n_tok &&
                       !memcmp(a->toks, b->toks, (size_t)a->n_tok * sizeof(int32_t)) &&
                       !memcmp(a->lp, b->lp, (size_t)a->n_tok * sizeof(float)),
                   "block size %d, job %d: %d tokens (%s), without the cache %d (%s)", sizes[v][0], i, a->n_tok,
                   sched_finish_name(a->finish), b->n_tok, sched_finish_name(b->finish));
            check_job(&small, i, &jobs[i], 80, 37);
        }
        CHECKF(m1.violations == 0 && m2.violations == 0, "%lld and %lld violations", (long long)m1.violations,
               (long long)m2.violations);
        CHECKF(st1.preemptions > 0 && m1.evicted_reused > 0 && st1.prefix_hits > 0,
               "block size %d: %llu preemptions, %lld reused blocks evicted, %llu hits", sizes[v][0],
               (unsigned long long)st1.preemptions, (long long)m1.evicted_reused, (unsigned long long)st1.prefix_hits);
        CHECK(st1.prefix_hits == (uint64_t)m1.first_plan_hits);
        CHECK(m1.computed < m2.computed);
        CHECK(st2.prefix_queries == 0 && st2.prefix_hits == 0 && st2.blocks_cached == 0 && st2.preemptions == 0);
        CHECK(m2.first_plan_hits == 0);
        CHECK(st1.blocks_used == 0 && m1.n_seqs == 0 && m1.frees == m2.frees + (int64_t)st1.preemptions);
        printf("prefix pressure, block size %d, %d blocks: %d steps, %llu preemptions, %llu of %llu tokens hit, "
               "%lld reused blocks evicted, %lld tokens computed (%lld without the cache)\n",
               sizes[v][0], sizes[v][1], steps, (unsigned long long)st1.preemptions,
               (unsigned long long)st1.prefix_hits, (unsigned long long)st1.prefix_queries,
               (long long)m1.evicted_reused, (long long)m1.computed, (long long)m2.computed);
        sim_done(&m1);
        sim_done(&m2);
    }
}

/* Random submissions and cancellations; the bookkeeping is checked at every step and inside
 * every step. */
static void test_prefix_random_cancel(void) {
    static world w;
    static job jobs[MAXR];
    rng = 0xD1B54A32D192ED03ULL;
    for (int round = 0; round < 6; round++) {
        make_world(&w);
        sched_config cfg = prefix_cfg(&w);
        cfg.block_size = 1 + round % 5;
        cfg.n_blocks = (60 + cfg.block_size - 1) / cfg.block_size + (int32_t)rnd(8);
        cfg.max_context = 60;
        cfg.max_seqs = 2 + (int32_t)rnd(6);
        cfg.max_step_tokens = 8 + (int32_t)rnd(24);
        static sim m;
        sched *s = sim_sched(&m, &cfg, 0);
        pressure_jobs(jobs, MAXR);
        for (int i = 0; i < MAXR; i++) {
            if (jobs[i].n_prompt > 40) jobs[i].n_prompt = 40;
            if (jobs[i].max_tokens > 20) jobs[i].max_tokens = 20;
        }
        uint64_t ids[MAXR];
        bool cancelled[MAXR] = {0};
        int submitted = 0;
        for (int step = 0; step < 20000; step++) {
            uint32_t r = rnd(10);
            if (submitted < MAXR && r < 4) {
                REQUIRE(submit_job(s, &jobs[submitted], submitted, 0, &ids[submitted]) == SCHED_E_OK);
                submitted++;
            } else if (submitted > 0 && r == 4) {
                int k = (int)rnd((uint32_t)submitted);
                sched_cancel(s, ids[k]);
                cancelled[k] = true;
            }
            int did = sched_step(s);
            sim_check_sched(&m);
            sim_check_usage(&m, s);
            if (!did && submitted == MAXR) break;
        }
        int n_cancelled = 0;
        for (int i = 0; i < MAXR; i++) {
            rec *r = &w.r[i];
            if (cancelled[i] && r->finish == SCHED_FINISH_CANCELLED) {
                n_cancelled++;
                int32_t exp[MAXT * 2];
                int n_exp;
                enum sched_finish fin;
                expect(&jobs[i], cfg.max_context, 0, exp, &n_exp, &fin);
                CHECKF(r->n_final == 1 && r->n_tok <= n_exp && !memcmp(r->toks, exp, (size_t)r->n_tok * sizeof(int32_t)),
                       "round %d, cancelled job %d", round, i);
            } else {
                check_job(&w, i, &jobs[i], cfg.max_context, 0);
            }
        }
        sched_stats st = stats_of(s);
        CHECKF(m.violations == 0, "round %d: %lld violations", round, (long long)m.violations);
        CHECK(n_cancelled > 0 && st.prefix_hits > 0 && st.blocks_used == 0 && m.n_seqs == 0);
        CHECK(st.blocks_cached > 0 && st.blocks_cached <= st.blocks_total);
        sched_free(s);
        sim_done(&m);
    }
}

/* prefix_cache off: the plans, frees and events of a fixed workload are those recorded from
 * the scheduler before the cache existed. */
static void test_prefix_off_unchanged(void) {
    int64_t entries, frees;
    uint64_t preemptions;
    uint64_t h = trace_workload(&entries, &frees, &preemptions);
    CHECKF(h == 0x0e87b17b2747f93eULL && entries == 773 && frees == 116 && preemptions == 78,
           "hash %016llx, %lld entries, %lld frees, %llu preemptions", (unsigned long long)h, (long long)entries,
           (long long)frees, (unsigned long long)preemptions);
}

/* The scheduler on its own thread with the cache on, checked from this one meanwhile. */
static void test_prefix_threaded(void) {
    static world w;
    make_world(&w);
    sched_config cfg = prefix_cfg(&w);
    cfg.n_blocks = 30;
    static sim m;
    sched *s = sim_sched(&m, &cfg, 30);
    m.s = NULL; /* the sim runs on the scheduler's thread; check from here only */
    mla_err err;
    REQUIRE(sched_start(s, &err) == MLA_OK);
    static job jobs[40];
    rng = 0x1234567ULL;
    pressure_jobs(jobs, 40);
    /* a check after every submission (the scheduler thread is running the ones before), then
     * until all are done: on a loaded machine the thread may finish them all before this one
     * looks again */
    int checks = 0, failed = 0;
    for (int i = 0; i < 40; i++) {
        REQUIRE(submit_job(s, &jobs[i], i, 0, NULL) == SCHED_E_OK);
        if (sched_check(s, &err) != MLA_OK && failed++ == 0) fprintf(stderr, "sched_check: %s\n", err.msg);
        checks++;
    }
    for (;;) {
        pthread_mutex_lock(&w.mu);
        int done = w.finals;
        pthread_mutex_unlock(&w.mu);
        if (done == 40) break;
        if (sched_check(s, &err) != MLA_OK && failed++ == 0) fprintf(stderr, "sched_check: %s\n", err.msg);
        checks++;
    }
    sched_stop(s);
    CHECKF(failed == 0, "%d of %d checks failed", failed, checks);
    check_against_reference(&w, jobs, 40, cfg.max_context, 30);
    CHECK(m.violations == 0 && m.n_seqs == 0);
    sched_free(s);
    sim_done(&m);
}

/* The scheduler on its own thread, requests from this one. */
static void test_threaded(void) {
    static world w;
    make_world(&w);
    sched_config cfg = base_cfg(&w);
    cfg.n_blocks = 64;
    fake_config fc = {.n_blocks = cfg.n_blocks, .block_size = cfg.block_size, .eos_period = 30,
                      .fail_at_step = -1};
    fake_backend *fb;
    sched *s = fake_sched(&fc, &cfg, &fb);
    mla_err err;
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

/* hold_until: no step runs, on a caller's steps or the scheduler's thread, until that many
 * requests have been submitted; then the burst is planned as one (the serve_pool_pressure test
 * relies on it for a pool under pressure whatever the clients' timing); a value past max_queue
 * is refused. */
static void test_hold(void) {
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
    sched_config bad = cfg;
    bad.hold_until = cfg.max_queue + 1;
    CHECK(sched_init(&s, &bad, &be, &err) != MLA_OK && strstr(err.msg, "hold_until"));
    cfg.hold_until = 4;
    REQUIRE(sched_init(&s, &cfg, &be, &err) == MLA_OK);
    static job jobs[4];
    for (int i = 0; i < 4; i++) random_job(&jobs[i], 8, 8);
    for (int i = 0; i < 3; i++) {
        REQUIRE(submit_job(s, &jobs[i], i, 0, NULL) == SCHED_E_OK);
        CHECKF(sched_step(s) == 0, "held with %d of 4 requests", i + 1);
    }
    sched_stats st;
    sched_get_stats(s, &st);
    CHECK(st.steps == 0 && st.waiting == 3 && st.running == 0);
    REQUIRE(submit_job(s, &jobs[3], 3, 0, NULL) == SCHED_E_OK);
    REQUIRE(sched_step(s) == 1);
    sched_get_stats(s, &st);
    fake_stats fs;
    fake_backend_stats(fb, &fs);
    CHECKF(st.waiting == 0 && fs.max_batch_seqs == 4, "the first step plans the burst (%d sequences)",
           (int)fs.max_batch_seqs);
    for (int i = 0; i < 1000 && sched_step(s); i++) {}
    check_against_reference(&w, jobs, 4, cfg.max_context, fc.eos_period);
    sched_free(s);
    fake_backend_free(fb);

    /* on the scheduler's thread: nothing runs until the last of the burst arrives */
    static world w2;
    make_world(&w2);
    cfg = base_cfg(&w2);
    cfg.hold_until = 3;
    fb = fake_backend_new(&fc);
    fake_backend_bind(fb, &be);
    REQUIRE(sched_init(&s, &cfg, &be, &err) == MLA_OK);
    REQUIRE(sched_start(s, &err) == MLA_OK);
    for (int i = 0; i < 2; i++) REQUIRE(submit_job(s, &jobs[i], i, 0, NULL) == SCHED_E_OK);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL); /* time for a step that must not come; its absence is the check */
    sched_get_stats(s, &st);
    CHECK(st.steps == 0 && st.waiting == 2);
    REQUIRE(submit_job(s, &jobs[2], 2, 0, NULL) == SCHED_E_OK);
    pthread_mutex_lock(&w2.mu);
    while (w2.finals < 3) pthread_cond_wait(&w2.cv, &w2.mu);
    pthread_mutex_unlock(&w2.mu);
    sched_stop(s);
    check_against_reference(&w2, jobs, 3, cfg.max_context, fc.eos_period);
    sched_free(s);
    fake_backend_free(fb);
}

/* cfg.long_prefill_tokens, on a 32-token step (half: 16), each case's tokens a step by request:
 * 0. a 100-token prompt with more than the limit left (68 > 40) is cut to 16 while two short
 *    requests wait; they are admitted beside it and what they leave goes back to it (24 = 32 - 5
 *    - 3); then their decodes run beside its next chunk (30 = 32 - 1 - 1);
 * 1. with max_seqs 2 admission stops after the first, and the chunk takes the rest (27);
 * 2, 3. with the limit off, or above the prompt (200), it takes every step until its prefill ends;
 * 4. two long prompts share the half: the younger gets what the older left of it (a token), the
 *    request behind them is admitted, the rest goes back to the older (16 + 10);
 * 5. admission needs the whole prompt to fit beside what the running prompts still need: in 40
 *    blocks the second 100-token prompt waits for the first.
 * Outputs equal the reference, nothing is preempted. */
static int64_t tokens_in_step(const sim *m, uint64_t id, int64_t step) {
    for (int i = 0; i < m->n_log; i++)
        if (m->log[i].id == id && m->log[i].step == step) return m->log[i].n_tokens;
    return 0;
}

typedef struct lp_case {
    int32_t limit, max_seqs, n_blocks;
    int n_jobs, first_wave;      /* requests; how many are submitted before step 1 (the rest before 2) */
    int prompt[3];               /* prompt lengths */
    int64_t want[3][3];          /* [step][request] tokens, -1: not checked */
} lp_case;

static void test_long_prefill(void) {
    static const lp_case cases[] = {
        {40, 8, 40, 3, 1, {100, 5, 3}, {{32, 0, 0}, {24, 5, 3}, {30, 1, 1}}},
        {40, 2, 40, 3, 1, {100, 5, 3}, {{32, 0, 0}, {27, 5, 0}, {-1, -1, -1}}},
        {0, 8, 40, 3, 1, {100, 5, 3}, {{32, 0, 0}, {32, 0, 0}, {32, 0, 0}}},
        {200, 8, 40, 3, 1, {100, 5, 3}, {{32, 0, 0}, {32, 0, 0}, {32, 0, 0}}},
        {40, 8, 80, 3, 2, {100, 100, 5}, {{16, 16, 0}, {26, 1, 5}, {-1, -1, -1}}},
        {40, 8, 40, 2, 2, {100, 100, 0}, {{32, 0, -1}, {-1, -1, -1}, {-1, -1, -1}}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const lp_case *c = &cases[k];
        static world w;
        make_world(&w);
        sched_config cfg = base_cfg(&w);
        cfg.long_prefill_tokens = c->limit;
        cfg.max_seqs = c->max_seqs;
        cfg.n_blocks = c->n_blocks;
        static sim m;
        sched *s = sim_sched(&m, &cfg, 0);
        static job jobs[3];
        uint64_t id[3];
        for (int j = 0; j < c->n_jobs; j++) fill(&jobs[j], NULL, 0, 10 + 40 * j, c->prompt[j], 2 + j % 2);
        for (int step = 1; step <= 3; step++) {
            if (step <= 2)
                for (int j = step == 1 ? 0 : c->first_wave; j < (step == 1 ? c->first_wave : c->n_jobs); j++)
                    REQUIRE(submit_job(s, &jobs[j], j, 0, &id[j]) == SCHED_E_OK);
            sched_step(s);
            for (int j = 0; j < c->n_jobs; j++)
                CHECKF(c->want[step - 1][j] < 0 || tokens_in_step(&m, id[j], step) == c->want[step - 1][j],
                       "case %zu, step %d: request %d took %lld tokens, not %lld", k, step, j,
                       (long long)tokens_in_step(&m, id[j], step), (long long)c->want[step - 1][j]);
        }
        sim_drain(s, &m, 1000);
        check_against_reference(&w, jobs, c->n_jobs, cfg.max_context, 0);
        CHECKF(m.violations == 0 && stats_of(s).preemptions == 0, "case %zu: %lld violations, %llu preemptions", k,
               (long long)m.violations, (unsigned long long)stats_of(s).preemptions);
        sched_free(s);
        sim_done(&m);
    }
    /* a negative limit is refused by name */
    static world w;
    make_world(&w);
    sched_config bad = base_cfg(&w);
    bad.long_prefill_tokens = -1;
    sim m;
    sim_init(&m, bad.n_blocks, bad.block_size, 0);
    sched_backend be = {.ctx = &m, .run_step = sim_run, .free_seq = sim_free_seq};
    sched *s;
    mla_err err;
    CHECK(sched_init(&s, &bad, &be, &err) != MLA_OK && strstr(err.msg, "long_prefill_tokens"));
    sim_done(&m);
}

int main(void) {
    test_random_workload(0);
    test_random_workload(5);
    test_chunked_prefill_and_logprobs();
    test_prompt_logprobs();
    test_stop_ids_and_context();
    test_cancel();
    test_refusals();
    test_backend_failure();
    test_seq_error();
    test_threaded();
    test_prefix_shared();
    test_prefix_after();
    test_prefix_race();
    test_prefix_dup_evictable();
    test_prefix_cap();
    test_cache_lost();
    test_paused();
    test_prefix_lru();
    test_prefix_duplicates();
    test_prefix_refcount();
    test_prefix_admission();
    test_blocks_sent();
    test_penalty_resume();
    test_decode_lookahead();
    test_prefix_pressure();
    test_prefix_random_cancel();
    test_prefix_off_unchanged();
    test_prefix_threaded();
    test_hold();
    test_long_prefill();
    return mla_test_finish();
}
