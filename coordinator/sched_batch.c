/* sched: continuous batching over a paged KV cache. See sched_batch.h. */
#include "coordinator/sched_batch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mla_log.h"

typedef struct sreq {
    uint64_t id;
    void *user;
    int32_t *tokens; /* prompt + generated */
    int32_t n_tokens, cap_tokens;
    int32_t n_prompt, n_gen, max_tokens;
    int32_t *stop_ids;
    int32_t n_stop_ids;
    bool ignore_eos;
    sched_sampling sampling;
    int32_t *blocks;
    int32_t n_blocks, cap_blocks;
    int32_t n_computed;   /* tokens whose cache rows are valid */
    bool cancelled;
    bool has_state;       /* the backend may hold state for it */
    uint64_t preempt_step; /* step in which it was last preempted (+1), 0 never */
} sreq;

typedef struct reqvec {
    sreq **v;
    int n, cap;
} reqvec;

static void rv_push(reqvec *r, sreq *q) {
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 16;
        r->v = mla_xrealloc(r->v, (size_t)r->cap * sizeof(*r->v));
    }
    r->v[r->n++] = q;
}
static void rv_insert_front(reqvec *r, sreq *q) {
    rv_push(r, q);
    memmove(r->v + 1, r->v, (size_t)(r->n - 1) * sizeof(*r->v));
    r->v[0] = q;
}
static void rv_remove_at(reqvec *r, int i) {
    memmove(r->v + i, r->v + i + 1, (size_t)(r->n - i - 1) * sizeof(*r->v));
    r->n--;
}
static int rv_find(const reqvec *r, const sreq *q) {
    for (int i = 0; i < r->n; i++)
        if (r->v[i] == q) return i;
    return -1;
}

typedef struct pending_event {
    sched_event ev;
    char error[sizeof(((mla_err *)0)->msg)];
} pending_event;

struct sched {
    sched_config cfg;
    sched_backend be;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool thread_running, stopping;
    bool step_active; /* a step is in progress (only one at a time) */
    uint64_t next_id;
    reqvec waiting, running;
    int32_t *free_blocks; /* stack of free block ids */
    int32_t n_free;
    int n_cancel_pending;
    sched_stats st;
    /* step scratch, reused */
    sched_plan_seq *plan;
    sreq **plan_req;
    sched_result *results;
    pending_event *events;
    int n_events, cap_events;
    uint64_t *to_free;
    int n_to_free, cap_to_free;
    sreq **dead;
    int n_dead, cap_dead;
};

void sched_sampling_default(sched_sampling *s) {
    memset(s, 0, sizeof(*s));
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    s->top_k = 0;
    s->repetition_penalty = 1.0f;
}

const char *sched_finish_name(enum sched_finish f) {
    switch (f) {
    case SCHED_FINISH_NONE: return "none";
    case SCHED_FINISH_STOP: return "stop";
    case SCHED_FINISH_LENGTH: return "length";
    case SCHED_FINISH_CANCELLED: return "cancelled";
    case SCHED_FINISH_ERROR: return "error";
    }
    return "?";
}

int sched_init(sched **out, const sched_config *cfg, const sched_backend *be, mla_err *err) {
    *out = NULL;
    if (cfg->block_size <= 0 || cfg->n_blocks <= 0 || cfg->max_seqs <= 0 ||
        cfg->max_step_tokens <= 0 || cfg->max_queue <= 0 || cfg->max_context <= 0)
        return mla_errf(err, "sched: block_size, n_blocks, max_seqs, max_step_tokens, max_queue "
                             "and max_context must be positive (got %d %d %d %d %d %d)",
                        cfg->block_size, cfg->n_blocks, cfg->max_seqs, cfg->max_step_tokens,
                        cfg->max_queue, cfg->max_context);
    if (!be || !be->run_step) return mla_errf(err, "sched: backend without run_step");
    sched *s = mla_xcalloc(1, sizeof(*s));
    s->cfg = *cfg;
    s->be = *be;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->next_id = 1;
    s->free_blocks = mla_xmalloc((size_t)cfg->n_blocks * sizeof(int32_t));
    /* pop from the end: hand out low ids first */
    for (int32_t i = 0; i < cfg->n_blocks; i++) s->free_blocks[i] = cfg->n_blocks - 1 - i;
    s->n_free = cfg->n_blocks;
    s->plan = mla_xcalloc((size_t)cfg->max_seqs, sizeof(*s->plan));
    s->plan_req = mla_xcalloc((size_t)cfg->max_seqs, sizeof(*s->plan_req));
    s->results = mla_xcalloc((size_t)cfg->max_seqs, sizeof(*s->results));
    s->st.blocks_total = cfg->n_blocks;
    s->st.block_size = cfg->block_size;
    *out = s;
    return MLA_OK;
}

static void sreq_free(sreq *q) {
    if (!q) return;
    free(q->tokens);
    free(q->stop_ids);
    free(q->blocks);
    free(q);
}

void sched_free(sched *s) {
    if (!s) return;
    sched_stop(s);
    for (int i = 0; i < s->waiting.n; i++) sreq_free(s->waiting.v[i]);
    for (int i = 0; i < s->running.n; i++) {
        if (s->be.free_seq) s->be.free_seq(s->be.ctx, s->running.v[i]->id);
        sreq_free(s->running.v[i]);
    }
    free(s->waiting.v);
    free(s->running.v);
    free(s->free_blocks);
    free(s->plan);
    free(s->plan_req);
    free(s->results);
    free(s->events);
    free(s->to_free);
    free(s->dead);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

int sched_submit(sched *s, const sched_request *r, uint64_t *req_id, mla_err *err) {
    if (req_id) *req_id = 0;
    if (!r->prompt || r->n_prompt < 1) {
        mla_errf(err, "the prompt is empty");
        return SCHED_E_INVALID;
    }
    if (r->max_tokens < 1) {
        mla_errf(err, "max_tokens must be at least 1 (got %d)", r->max_tokens);
        return SCHED_E_INVALID;
    }
    if (r->n_stop_ids < 0 || (r->n_stop_ids > 0 && !r->stop_ids)) {
        mla_errf(err, "bad stop token id list");
        return SCHED_E_INVALID;
    }
    if (r->sampling.top_logprobs < 0 || r->sampling.top_logprobs > SCHED_MAX_TOP_LOGPROBS) {
        mla_errf(err, "top_logprobs must be between 0 and %d (got %d)", SCHED_MAX_TOP_LOGPROBS,
                 r->sampling.top_logprobs);
        return SCHED_E_INVALID;
    }
    if (r->n_prompt >= s->cfg.max_context) {
        mla_errf(err, "the prompt has %d tokens; the context holds %d (prompt plus at least one "
                      "generated token)", r->n_prompt, s->cfg.max_context);
        return SCHED_E_CONTEXT;
    }
    int64_t need = (int64_t)r->n_prompt + r->max_tokens;
    if (need > s->cfg.max_context) need = s->cfg.max_context;
    int64_t capacity = (int64_t)s->cfg.n_blocks * s->cfg.block_size;
    if (need > capacity) {
        mla_errf(err, "the request needs up to %lld tokens of KV cache; the whole cache holds %lld",
                 (long long)need, (long long)capacity);
        return SCHED_E_CAPACITY;
    }
    sreq *q = mla_xcalloc(1, sizeof(*q));
    q->cap_tokens = (int32_t)need;
    q->tokens = mla_xmalloc((size_t)q->cap_tokens * sizeof(int32_t));
    memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
    q->n_tokens = q->n_prompt = r->n_prompt;
    q->max_tokens = r->max_tokens;
    if (r->n_stop_ids > 0) {
        q->stop_ids = mla_xmalloc((size_t)r->n_stop_ids * sizeof(int32_t));
        memcpy(q->stop_ids, r->stop_ids, (size_t)r->n_stop_ids * sizeof(int32_t));
        q->n_stop_ids = r->n_stop_ids;
    }
    q->ignore_eos = r->ignore_eos;
    q->sampling = r->sampling;
    q->user = r->user;

    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        sreq_free(q);
        mla_errf(err, "the server is shutting down");
        return SCHED_E_STOPPED;
    }
    if (s->waiting.n >= s->cfg.max_queue) {
        int n = s->waiting.n;
        pthread_mutex_unlock(&s->mu);
        sreq_free(q);
        mla_errf(err, "too many requests waiting (%d); try again later", n);
        return SCHED_E_QUEUE_FULL;
    }
    q->id = s->next_id++;
    rv_push(&s->waiting, q);
    if (req_id) *req_id = q->id;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return SCHED_E_OK;
}

void sched_cancel(sched *s, uint64_t req_id) {
    pthread_mutex_lock(&s->mu);
    reqvec *lists[2] = {&s->waiting, &s->running};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < lists[l]->n; i++)
            if (lists[l]->v[i]->id == req_id && !lists[l]->v[i]->cancelled) {
                lists[l]->v[i]->cancelled = true;
                s->n_cancel_pending++;
                pthread_cond_signal(&s->cv);
            }
    pthread_mutex_unlock(&s->mu);
}

void sched_get_stats(sched *s, sched_stats *st) {
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    st->waiting = s->waiting.n;
    st->running = s->running.n;
    st->blocks_used = s->cfg.n_blocks - s->n_free;
    pthread_mutex_unlock(&s->mu);
}

/* ---- step internals (lock held) ---- */

static pending_event *push_event(sched *s, sreq *q) {
    if (s->n_events == s->cap_events) {
        s->cap_events = s->cap_events ? s->cap_events * 2 : 32;
        s->events = mla_xrealloc(s->events, (size_t)s->cap_events * sizeof(*s->events));
    }
    pending_event *e = &s->events[s->n_events++];
    memset(e, 0, sizeof(*e));
    e->ev.req_id = q->id;
    e->ev.user = q->user;
    e->ev.n_prompt = q->n_prompt;
    e->ev.n_generated = q->n_gen;
    return e;
}

static void queue_free_seq(sched *s, sreq *q) {
    if (!q->has_state) return;
    q->has_state = false;
    if (s->n_to_free == s->cap_to_free) {
        s->cap_to_free = s->cap_to_free ? s->cap_to_free * 2 : 16;
        s->to_free = mla_xrealloc(s->to_free, (size_t)s->cap_to_free * sizeof(*s->to_free));
    }
    s->to_free[s->n_to_free++] = q->id;
}

static void release_blocks(sched *s, sreq *q) {
    for (int32_t i = q->n_blocks - 1; i >= 0; i--) {
        MLA_ASSERT(s->n_free < s->cfg.n_blocks);
        s->free_blocks[s->n_free++] = q->blocks[i];
    }
    q->n_blocks = 0;
    q->n_computed = 0;
}

/* The request leaves the scheduler: blocks back, backend told, freed after events go out. */
static void retire(sched *s, sreq *q) {
    release_blocks(s, q);
    queue_free_seq(s, q);
    if (s->n_dead == s->cap_dead) {
        s->cap_dead = s->cap_dead ? s->cap_dead * 2 : 16;
        s->dead = mla_xrealloc(s->dead, (size_t)s->cap_dead * sizeof(*s->dead));
    }
    s->dead[s->n_dead++] = q;
}

static int32_t blocks_for(const sched *s, int32_t tokens) {
    return (tokens + s->cfg.block_size - 1) / s->cfg.block_size;
}

static bool alloc_blocks(sched *s, sreq *q, int32_t upto_tokens) {
    int32_t need = blocks_for(s, upto_tokens) - q->n_blocks;
    if (need <= 0) return true;
    if (need > s->n_free) return false;
    if (q->n_blocks + need > q->cap_blocks) {
        q->cap_blocks = q->n_blocks + need + 4;
        q->blocks = mla_xrealloc(q->blocks, (size_t)q->cap_blocks * sizeof(int32_t));
    }
    for (int32_t i = 0; i < need; i++) q->blocks[q->n_blocks++] = s->free_blocks[--s->n_free];
    return true;
}

static void preempt(sched *s, sreq *q) {
    int i = rv_find(&s->running, q);
    MLA_ASSERT(i >= 0);
    rv_remove_at(&s->running, i);
    release_blocks(s, q);
    queue_free_seq(s, q);
    q->preempt_step = s->st.steps + 1;
    rv_insert_front(&s->waiting, q);
    s->st.preemptions++;
    MLA_DEBUG("sched: preempted request %llu (%d tokens to recompute)",
              (unsigned long long)q->id, q->n_tokens);
}

static void plan_add(sched *s, int *n, sreq *q, int32_t chunk) {
    sched_plan_seq *p = &s->plan[*n];
    p->seq_id = q->id;
    p->tokens = q->tokens + q->n_computed;
    p->n_tokens = chunk;
    p->start_pos = q->n_computed;
    p->block_table = q->blocks;
    p->n_blocks = q->n_blocks;
    p->n_blocks_sent = 0; /* the whole table every step */
    p->sample = q->n_computed + chunk == q->n_tokens;
    p->sampling = &q->sampling;
    p->seq_tokens = q->tokens;
    p->n_prompt = q->n_prompt;
    p->n_generated = q->n_gen;
    s->plan_req[*n] = q;
    q->has_state = true;
    (*n)++;
}

static bool is_stop_token(const sched *s, const sreq *q, int32_t tok) {
    for (int32_t i = 0; i < q->n_stop_ids; i++)
        if (q->stop_ids[i] == tok) return true;
    if (!q->ignore_eos && s->cfg.is_eog && s->cfg.is_eog(s->cfg.eog_ctx, tok)) return true;
    return false;
}

/* Builds the plan; returns the number of entries. */
static int build_plan(sched *s, int32_t *n_tokens_out) {
    int n = 0;
    int32_t budget = s->cfg.max_step_tokens;
    /* running sequences, oldest first */
    for (int i = 0; i < s->running.n && budget > 0 && n < s->cfg.max_seqs; i++) {
        sreq *q = s->running.v[i];
        int32_t pending = q->n_tokens - q->n_computed;
        MLA_ASSERT(pending >= 1);
        int32_t chunk = pending < budget ? pending : budget;
        bool self_preempted = false;
        while (!alloc_blocks(s, q, q->n_computed + chunk)) {
            sreq *victim = s->running.v[s->running.n - 1];
            if (victim == q) {
                preempt(s, q);
                self_preempted = true;
                break;
            }
            preempt(s, victim);
        }
        if (self_preempted) break; /* q was the youngest: nothing after it */
        plan_add(s, &n, q, chunk);
        budget -= chunk;
    }
    /* admission, first come first served */
    while (budget > 0 && n < s->cfg.max_seqs && s->waiting.n > 0) {
        sreq *q = s->waiting.v[0];
        if (q->preempt_step == s->st.steps + 1) break; /* not in the step that preempted it */
        int32_t chunk = q->n_tokens < budget ? q->n_tokens : budget;
        if (!alloc_blocks(s, q, chunk)) break;
        rv_remove_at(&s->waiting, 0);
        rv_push(&s->running, q);
        plan_add(s, &n, q, chunk);
        budget -= chunk;
    }
    *n_tokens_out = s->cfg.max_step_tokens - budget;
    return n;
}

static void handle_cancellations(sched *s) {
    if (!s->n_cancel_pending) return;
    reqvec *lists[2] = {&s->waiting, &s->running};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < lists[l]->n;) {
            sreq *q = lists[l]->v[i];
            if (q->cancelled) {
                rv_remove_at(lists[l], i);
                pending_event *e = push_event(s, q);
                e->ev.finish = SCHED_FINISH_CANCELLED;
                retire(s, q);
            } else {
                i++;
            }
        }
    s->n_cancel_pending = 0;
}

/* Sends the collected events and backend frees without the lock, then frees dead requests. */
static void flush_outside_lock(sched *s) {
    for (int i = 0; i < s->n_events; i++) {
        pending_event *e = &s->events[i];
        if (e->ev.finish == SCHED_FINISH_ERROR) e->ev.error = e->error;
        if (s->cfg.on_event) s->cfg.on_event(s->cfg.cb_ctx, &e->ev);
    }
    s->n_events = 0;
    if (s->be.free_seq)
        for (int i = 0; i < s->n_to_free; i++) s->be.free_seq(s->be.ctx, s->to_free[i]);
    s->n_to_free = 0;
    for (int i = 0; i < s->n_dead; i++) sreq_free(s->dead[i]);
    s->n_dead = 0;
}

int sched_step(sched *s) {
    pthread_mutex_lock(&s->mu);
    MLA_ASSERT(!s->step_active);
    s->step_active = true;
    handle_cancellations(s);
    int32_t n_tok = 0;
    int n = build_plan(s, &n_tok);
    pthread_mutex_unlock(&s->mu);

    /* events of cancellations and frees of preempted sequences go out before the step */
    flush_outside_lock(s);
    if (n == 0) {
        pthread_mutex_lock(&s->mu);
        s->step_active = false;
        pthread_mutex_unlock(&s->mu);
        return 0;
    }

    sched_plan plan = {.seqs = s->plan, .n_seqs = n, .block_size = s->cfg.block_size,
                       .n_tokens = n_tok};
    memset(s->results, 0, (size_t)n * sizeof(*s->results));
    mla_err err = {{0}};
    int rc = s->be.run_step(s->be.ctx, &plan, s->results, &err);

    pthread_mutex_lock(&s->mu);
    s->st.steps++;
    for (int i = 0; i < n; i++) {
        sreq *q = s->plan_req[i];
        const sched_plan_seq *p = &s->plan[i];
        if (rc != MLA_OK) {
            int k = rv_find(&s->running, q);
            MLA_ASSERT(k >= 0);
            rv_remove_at(&s->running, k);
            pending_event *e = push_event(s, q);
            e->ev.finish = SCHED_FINISH_ERROR;
            snprintf(e->error, sizeof(e->error), "%s", err.msg[0] ? err.msg : "backend failure");
            retire(s, q);
            continue;
        }
        q->n_computed += p->n_tokens;
        if (q->n_prompt > q->n_computed - p->n_tokens) {
            int32_t from = q->n_computed - p->n_tokens;
            int32_t to = q->n_computed < q->n_prompt ? q->n_computed : q->n_prompt;
            s->st.tokens_prefilled += (uint64_t)(to - from);
        }
        if (!p->sample) continue;
        const sched_result *r = &s->results[i];
        if (q->cancelled) continue; /* finished by handle_cancellations next step */
        MLA_ASSERT(q->n_tokens < q->cap_tokens);
        q->tokens[q->n_tokens++] = r->token;
        q->n_gen++;
        s->st.tokens_generated++;
        pending_event *e = push_event(s, q);
        e->ev.has_token = true;
        e->ev.result = *r;
        if (e->ev.result.n_top < 0) e->ev.result.n_top = 0;
        if (e->ev.result.n_top > SCHED_MAX_TOP_LOGPROBS) e->ev.result.n_top = SCHED_MAX_TOP_LOGPROBS;
        if (is_stop_token(s, q, r->token)) {
            e->ev.is_stop = true;
            e->ev.finish = SCHED_FINISH_STOP;
        } else if (q->n_gen >= q->max_tokens || q->n_tokens >= s->cfg.max_context) {
            e->ev.finish = SCHED_FINISH_LENGTH;
        }
        if (e->ev.finish != SCHED_FINISH_NONE) {
            int k = rv_find(&s->running, q);
            MLA_ASSERT(k >= 0);
            rv_remove_at(&s->running, k);
            retire(s, q);
        }
    }
    if (rc != MLA_OK) MLA_WARN("sched: step failed: %s", err.msg);
    pthread_mutex_unlock(&s->mu);
    flush_outside_lock(s);
    pthread_mutex_lock(&s->mu);
    s->step_active = false;
    pthread_mutex_unlock(&s->mu);
    return 1;
}

static void *sched_thread(void *arg) {
    sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && s->waiting.n == 0 && s->running.n == 0 && !s->n_cancel_pending)
            pthread_cond_wait(&s->cv, &s->mu);
        bool stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        sched_step(s);
    }
    return NULL;
}

int sched_start(sched *s, mla_err *err) {
    pthread_mutex_lock(&s->mu);
    if (s->thread_running) {
        pthread_mutex_unlock(&s->mu);
        return mla_errf(err, "sched: already started");
    }
    s->stopping = false;
    int rc = pthread_create(&s->thread, NULL, sched_thread, s);
    if (rc == 0) s->thread_running = true;
    pthread_mutex_unlock(&s->mu);
    if (rc != 0) return mla_errf(err, "sched: pthread_create failed: %s", strerror(rc));
    return MLA_OK;
}

void sched_stop(sched *s) {
    pthread_mutex_lock(&s->mu);
    if (!s->thread_running) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->stopping = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&s->mu);
    s->thread_running = false;
    pthread_mutex_unlock(&s->mu);
}
