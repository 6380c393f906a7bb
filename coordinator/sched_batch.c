/* sched: continuous batching over a paged KV cache. See sched_batch.h. */
#include "coordinator/sched_batch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/mla_log.h"

typedef struct sreq {
    uint64_t id;
    void *user;
    int32_t *tokens; /* prompt + generated */
    int32_t n_tokens, cap_tokens;
    int32_t n_prompt, n_gen, max_tokens;
    int32_t n_cached;     /* prompt tokens its first admission took from the prefix cache; -1: not admitted yet */
    int32_t *stop_ids;
    int32_t n_stop_ids;
    bool ignore_eos;
    sched_sampling sampling;
    int32_t *blocks;
    int32_t n_blocks, cap_blocks;
    /* Per table index: the cached block whose key this one's block duplicates (another request
     * registered the same tokens first), held by this request so that the blocks it registers
     * after it, whose parent that block is, are never held without their parent; -1: none.
     * n_canon: the leading table entries that are cached themselves or have such a block. */
    int32_t *pins;
    int32_t n_canon;
    bool chain_ends; /* a duplicate whose cached block no one else held: its later blocks stay private */
    int32_t n_computed;   /* tokens whose cache rows are valid */
    int32_t n_sent;       /* leading block table entries the backend holds (0 without state) */
    bool cancelled;
    bool has_state;       /* the backend may hold state for it */
    sched_plp *plp;       /* sampling.prompt_logprobs: prompt token i + 1's at [i], until sent */
    bool plp_sent;        /* its first token event carried them */
    uint64_t preempt_step; /* step in which it was last preempted (+1), 0 never */
    struct sreq *leader;   /* sched_request.after while that one's prompt is not computed: not admitted */
    int32_t n_followers;   /* waiting requests whose leader this one is */
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
    uint64_t epoch;   /* be.cache_epoch as the last step saw it */
    uint64_t next_id;
    reqvec waiting, running;
    int32_t *free_blocks; /* stack of free unregistered block ids (ref 0) */
    int32_t n_free;
    int32_t *ref;         /* per block: how many running block tables (and pins) hold it */
    int32_t *npin;        /* per block: how many of those are pins (sreq.pins) */
    int64_t n_pins;       /* pins held, all requests */
    /* Prefix cache (cfg.prefix_cache), per block. A registered block is in the hash table under
     * the key (kparent, its block_size tokens at ktok + b * block_size); with ref 0 it is also
     * in the LRU list (evictable), oldest at lru_head. */
    uint8_t *reg;
    int32_t *kparent;
    int32_t *ktok;
    uint64_t *khash;
    int32_t *hnext;       /* next block in the same hash bucket, -1 ends */
    int32_t *nchild;      /* registered blocks whose kparent is this block */
    int32_t *buckets;     /* bucket -> first block, -1 empty */
    uint32_t bucket_mask;
    int32_t *lru_prev, *lru_next;
    int32_t lru_head, lru_tail, n_lru;
    int n_cancel_pending;
    sched_stats st;
    /* step scratch, reused */
    sched_plan_seq *plan;
    sreq **plan_req;
    int *plan_cut; /* build_plan: the entries whose chunk chunk_of cut */
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
    if (cfg->hold_until < 0 || cfg->hold_until > cfg->max_queue)
        return mla_errf(err, "sched: hold_until %d outside 0..max_queue (%d)", cfg->hold_until,
                        cfg->max_queue);
    if (cfg->long_prefill_tokens < 0)
        return mla_errf(err, "sched: long_prefill_tokens %d is negative", cfg->long_prefill_tokens);
    if (!be || !be->run_step) return mla_errf(err, "sched: backend without run_step");
    sched *s = mla_xcalloc(1, sizeof(*s));
    s->cfg = *cfg;
    s->be = *be;
    s->epoch = be->cache_epoch ? be->cache_epoch(be->ctx) : 0;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->next_id = 1;
    s->free_blocks = mla_xmalloc((size_t)cfg->n_blocks * sizeof(int32_t));
    /* pop from the end: hand out low ids first */
    for (int32_t i = 0; i < cfg->n_blocks; i++) s->free_blocks[i] = cfg->n_blocks - 1 - i;
    s->n_free = cfg->n_blocks;
    s->ref = mla_xcalloc((size_t)cfg->n_blocks, sizeof(int32_t));
    s->npin = mla_xcalloc((size_t)cfg->n_blocks, sizeof(int32_t));
    s->lru_head = s->lru_tail = -1;
    if (cfg->prefix_cache) {
        size_t nb = (size_t)cfg->n_blocks;
        s->reg = mla_xcalloc(nb, 1);
        s->kparent = mla_xmalloc(nb * sizeof(int32_t));
        s->ktok = mla_xmalloc(nb * (size_t)cfg->block_size * sizeof(int32_t));
        s->khash = mla_xmalloc(nb * sizeof(uint64_t));
        s->hnext = mla_xmalloc(nb * sizeof(int32_t));
        s->nchild = mla_xcalloc(nb, sizeof(int32_t));
        s->lru_prev = mla_xmalloc(nb * sizeof(int32_t));
        s->lru_next = mla_xmalloc(nb * sizeof(int32_t));
        size_t n_buckets = 16;
        while (n_buckets < nb) n_buckets *= 2;
        s->bucket_mask = (uint32_t)(n_buckets - 1);
        s->buckets = mla_xmalloc(n_buckets * sizeof(int32_t));
        for (size_t i = 0; i < n_buckets; i++) s->buckets[i] = -1;
    }
    s->plan = mla_xcalloc((size_t)cfg->max_seqs, sizeof(*s->plan));
    s->plan_req = mla_xcalloc((size_t)cfg->max_seqs, sizeof(*s->plan_req));
    s->plan_cut = mla_xcalloc((size_t)cfg->max_seqs, sizeof(*s->plan_cut));
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
    free(q->pins);
    free(q->plp);
    free((char *)q->sampling.grammar);
    free((int32_t *)q->sampling.bias_ids);
    free((float *)q->sampling.bias_vals);
    free((int32_t *)q->sampling.ban_ids);
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
    free(s->ref);
    free(s->npin);
    free(s->reg);
    free(s->kparent);
    free(s->ktok);
    free(s->khash);
    free(s->hnext);
    free(s->nchild);
    free(s->buckets);
    free(s->lru_prev);
    free(s->lru_next);
    free(s->plan);
    free(s->plan_req);
    free(s->plan_cut);
    free(s->results);
    free(s->events);
    free(s->to_free);
    free(s->dead);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

static bool prefix_looks_up(const sched *s, const sreq *q);

/* The request with this id where it still waits or prefills its prompt (a gate for a request
 * that shares the prompt: sched_request.after), else NULL. Under the lock. */
static sreq *gate_of(const sched *s, uint64_t id) {
    const reqvec *lists[2] = {&s->waiting, &s->running};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < lists[l]->n; i++) {
            sreq *q = lists[l]->v[i];
            if (q->id == id) return q->cancelled || (l == 1 && q->n_computed >= q->n_prompt) ? NULL : q;
        }
    return NULL;
}

/* q's prompt is computed, or q leaves: the requests waiting on it may be admitted */
static void open_gate(sched *s, sreq *q) {
    for (int i = 0; q->n_followers > 0 && i < s->waiting.n; i++)
        if (s->waiting.v[i]->leader == q) {
            s->waiting.v[i]->leader = NULL;
            q->n_followers--;
        }
    MLA_ASSERT(q->n_followers == 0);
}

/* Whether n more requests are taken now (lock held): not once the scheduler stops; the queue's cap
 * counts the requests past the batch's free places, so that a burst the next step admits whole
 * is not refused. */
static int room(sched *s, int n, mla_err *err) {
    if (s->stopping) {
        mla_errf(err, "the server is shutting down");
        return SCHED_E_STOPPED;
    }
    const int32_t free_places = s->cfg.max_seqs > s->running.n ? s->cfg.max_seqs - s->running.n : 0;
    if ((int64_t)s->waiting.n + n - 1 - free_places < s->cfg.max_queue) return SCHED_E_OK;
    if (n > 1) {
        mla_errf(err, "too many requests waiting: %d, and the request's %d choices, where the batch has %d free "
                 "places and --max-queue is %d; try again later", s->waiting.n, n, free_places, s->cfg.max_queue);
    } else {
        mla_errf(err, "too many requests waiting: %d, where the batch has %d free places and --max-queue is %d; try "
                 "again later", s->waiting.n, free_places, s->cfg.max_queue);
    }
    return SCHED_E_QUEUE_FULL;
}

int sched_room(sched *s, int n, mla_err *err) {
    pthread_mutex_lock(&s->mu);
    const int rc = room(s, n, err);
    pthread_mutex_unlock(&s->mu);
    return rc;
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
    if (r->sampling.min_tokens < 0 || r->sampling.min_tokens > r->max_tokens || r->sampling.n_ban < 0 || r->sampling.n_ban > SCHED_MAX_BAN ||
        (r->sampling.n_ban > 0 && !r->sampling.ban_ids)) {
        mla_errf(err, "bad min_tokens (%d) or stop tokens it bans (%d)", r->sampling.min_tokens, r->sampling.n_ban);
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
        mla_errf(err, "the request needs up to %lld tokens of KV cache (prompt plus max_tokens, "
                      "within the context); the whole cache holds %lld tokens",
                 (long long)need, (long long)capacity);
        return SCHED_E_CAPACITY;
    }
    sreq *q = mla_xcalloc(1, sizeof(*q));
    q->cap_tokens = (int32_t)need;
    q->tokens = mla_xmalloc((size_t)q->cap_tokens * sizeof(int32_t));
    memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
    q->n_tokens = q->n_prompt = r->n_prompt;
    q->n_cached = -1;
    q->max_tokens = r->max_tokens;
    if (r->n_stop_ids > 0) {
        q->stop_ids = mla_xmalloc((size_t)r->n_stop_ids * sizeof(int32_t));
        memcpy(q->stop_ids, r->stop_ids, (size_t)r->n_stop_ids * sizeof(int32_t));
        q->n_stop_ids = r->n_stop_ids;
    }
    q->ignore_eos = r->ignore_eos;
    q->sampling = r->sampling;
    q->sampling.grammar = r->sampling.grammar ? mla_xstrdup(r->sampling.grammar) : NULL;
    q->sampling.bias_ids = NULL;
    q->sampling.bias_vals = NULL;
    q->sampling.n_bias = r->sampling.n_bias > 0 ? r->sampling.n_bias : 0;
    if (q->sampling.n_bias) {
        int32_t *bi = mla_xmalloc((size_t)q->sampling.n_bias * sizeof *bi);
        float *bv = mla_xmalloc((size_t)q->sampling.n_bias * sizeof *bv);
        memcpy(bi, r->sampling.bias_ids, (size_t)q->sampling.n_bias * sizeof *bi);
        memcpy(bv, r->sampling.bias_vals, (size_t)q->sampling.n_bias * sizeof *bv);
        q->sampling.bias_ids = bi;
        q->sampling.bias_vals = bv;
    }
    q->sampling.ban_ids = NULL;
    if (!q->sampling.min_tokens) q->sampling.n_ban = 0; /* no ban to apply */
    if (q->sampling.n_ban) {
        int32_t *b = mla_xmalloc((size_t)q->sampling.n_ban * sizeof *b);
        memcpy(b, r->sampling.ban_ids, (size_t)q->sampling.n_ban * sizeof *b);
        q->sampling.ban_ids = b;
    }
    q->user = r->user;

    pthread_mutex_lock(&s->mu);
    const int rc = room(s, 1, err);
    if (rc != SCHED_E_OK) {
        pthread_mutex_unlock(&s->mu);
        sreq_free(q);
        return rc;
    }
    q->id = s->next_id++;
    if (r->after && prefix_looks_up(s, q)) q->leader = gate_of(s, r->after);
    if (q->leader) q->leader->n_followers++;
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

int32_t sched_max_batch_submit(const sched *s) {
    const int64_t n = (int64_t)s->cfg.max_seqs + s->cfg.max_queue;
    return n > INT32_MAX ? INT32_MAX : (int32_t)n;
}

void sched_get_stats(sched *s, sched_stats *st) {
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    st->waiting = s->waiting.n;
    st->running = s->running.n;
    st->blocks_used = s->cfg.n_blocks - s->n_free - s->n_lru;
    st->blocks_cached = s->n_lru;
    st->blocks_pinned = 0;
    for (int32_t b = 0; s->n_pins > 0 && b < s->cfg.n_blocks; b++) st->blocks_pinned += s->ref[b] > 0 && s->ref[b] == s->npin[b];
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
    e->ev.n_cached = q->n_cached > 0 ? q->n_cached : 0;
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

/* ---- blocks: reference counts, the free stack and the prefix cache ---- */

#ifndef SCHED_PREFIX_HASH_MASK
/* Bits of the prefix hash kept. Only a test build narrows it, to make collisions common. */
#define SCHED_PREFIX_HASH_MASK UINT64_MAX
#endif

static uint64_t mix64(uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ULL;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dULL;
    x ^= x >> 33;
    return x;
}

static uint64_t prefix_hash(const sched *s, int32_t parent, const int32_t *toks) {
    uint64_t h = mix64((uint64_t)(uint32_t)parent ^ 0x6a09e667f3bcc908ULL);
    for (int32_t i = 0; i < s->cfg.block_size; i++) {
        h = (h ^ (uint32_t)toks[i]) * 0x9e3779b97f4a7c15ULL;
        h ^= h >> 29;
    }
    return mix64(h) & SCHED_PREFIX_HASH_MASK;
}

static int32_t *key_tokens(const sched *s, int32_t b) {
    return s->ktok + (size_t)b * (size_t)s->cfg.block_size;
}

/* The registered block with exactly this key, or -1. The hash only narrows the search. */
static int32_t cache_find(const sched *s, int32_t parent, const int32_t *toks, uint64_t h) {
    for (int32_t b = s->buckets[h & s->bucket_mask]; b >= 0; b = s->hnext[b])
        if (s->khash[b] == h && s->kparent[b] == parent &&
            !memcmp(key_tokens(s, b), toks, (size_t)s->cfg.block_size * sizeof(int32_t)))
            return b;
    return -1;
}

static void cache_insert(sched *s, int32_t b, int32_t parent, const int32_t *toks, uint64_t h) {
    MLA_ASSERT(!s->reg[b]);
    s->reg[b] = 1;
    s->kparent[b] = parent;
    memcpy(key_tokens(s, b), toks, (size_t)s->cfg.block_size * sizeof(int32_t));
    s->khash[b] = h;
    s->nchild[b] = 0;
    if (parent >= 0) s->nchild[parent]++;
    uint32_t k = (uint32_t)(h & s->bucket_mask);
    s->hnext[b] = s->buckets[k];
    s->buckets[k] = b;
}

static void cache_remove(sched *s, int32_t b) {
    MLA_ASSERT(s->reg[b]);
    /* A child's key names this block as its parent: its rows are only valid after this
     * block's, so it must never outlive it. Eviction order guarantees it (see take_block). */
    MLA_ASSERT(s->nchild[b] == 0);
    int32_t *link = &s->buckets[s->khash[b] & s->bucket_mask];
    while (*link != b) {
        MLA_ASSERT(*link >= 0);
        link = &s->hnext[*link];
    }
    *link = s->hnext[b];
    if (s->kparent[b] >= 0) s->nchild[s->kparent[b]]--;
    s->reg[b] = 0;
}

static void lru_push_tail(sched *s, int32_t b) {
    s->lru_prev[b] = s->lru_tail;
    s->lru_next[b] = -1;
    if (s->lru_tail >= 0) s->lru_next[s->lru_tail] = b;
    else s->lru_head = b;
    s->lru_tail = b;
    s->n_lru++;
}

static void lru_unlink(sched *s, int32_t b) {
    if (s->lru_prev[b] >= 0) s->lru_next[s->lru_prev[b]] = s->lru_next[b];
    else s->lru_head = s->lru_next[b];
    if (s->lru_next[b] >= 0) s->lru_prev[s->lru_next[b]] = s->lru_prev[b];
    else s->lru_tail = s->lru_prev[b];
    s->n_lru--;
}

static bool is_registered(const sched *s, int32_t b) {
    return s->reg && s->reg[b];
}

/* A block for a table: a free (unregistered) one first, else the least recently used cached
 * block, which leaves the cache. The LRU head never has a registered child: a child is held
 * only together with its parent (the parent precedes it in every table holding it), tables
 * are released last block first, and a reuse takes the whole chain from the first block, so
 * a child always enters the LRU before its parent and never becomes held without it. */
static int32_t take_block(sched *s) {
    int32_t b;
    if (s->n_free > 0) {
        b = s->free_blocks[--s->n_free];
    } else {
        MLA_ASSERT(s->n_lru > 0);
        b = s->lru_head;
        lru_unlink(s, b);
        cache_remove(s, b);
    }
    MLA_ASSERT(s->ref[b] == 0);
    s->ref[b] = 1;
    return b;
}

static void block_ref(sched *s, int32_t b) {
    if (s->ref[b] == 0) {
        MLA_ASSERT(is_registered(s, b));
        lru_unlink(s, b);
    }
    s->ref[b]++;
}

static void block_unref(sched *s, int32_t b) {
    MLA_ASSERT(s->ref[b] > 0);
    if (--s->ref[b] > 0) return;
    if (is_registered(s, b)) {
        lru_push_tail(s, b);
    } else {
        MLA_ASSERT(s->n_free < s->cfg.n_blocks);
        s->free_blocks[s->n_free++] = b;
    }
}

/* Drops the request's references, last block first, each position's pin with it (the deepest
 * cached blocks become the least recently used, before their parents); its cache state is gone. */
static void release_blocks(sched *s, sreq *q) {
    for (int32_t i = q->n_blocks - 1; i >= 0; i--) {
        block_unref(s, q->blocks[i]);
        if (i < q->n_canon && q->pins[i] >= 0) {
            s->npin[q->pins[i]]--;
            s->n_pins--;
            block_unref(s, q->pins[i]);
        }
    }
    q->n_canon = 0;
    q->chain_ends = false;
    q->n_blocks = 0;
    q->n_computed = 0;
    q->n_sent = 0;
}

/* The request leaves the scheduler: blocks back, backend told, freed after events go out. */
static void retire(sched *s, sreq *q) {
    if (q->leader) q->leader->n_followers--; /* a follower cancelled while it waited */
    q->leader = NULL;
    open_gate(s, q);
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

static void reserve_blocks(sreq *q, int32_t n) {
    if (n <= q->cap_blocks) return;
    q->cap_blocks = n + 4;
    q->blocks = mla_xrealloc(q->blocks, (size_t)q->cap_blocks * sizeof(int32_t));
    q->pins = mla_xrealloc(q->pins, (size_t)q->cap_blocks * sizeof(int32_t));
}

static bool alloc_blocks(sched *s, sreq *q, int32_t upto_tokens) {
    int32_t need = blocks_for(s, upto_tokens) - q->n_blocks;
    if (need <= 0) return true;
    if (need > s->n_free + s->n_lru) return false;
    reserve_blocks(q, q->n_blocks + need);
    for (int32_t i = 0; i < need; i++) q->blocks[q->n_blocks++] = take_block(s);
    return true;
}

/* whether q's plan entries return prompt logprobs: asked for, not sent yet */
static bool wants_plp(const sreq *q) { return q->sampling.prompt_logprobs && !q->plp_sent; }

/* The prompt-logprob rows a step may carry, over all its entries: the logits rows a worker keeps
 * for a decode step (cfg.max_seqs), at most SCHED_PLP_CHUNK (each is a row of logits on the
 * workers' host and a pass over the vocabulary on rank 0) */
static int32_t plp_step_rows(const sched *s) {
    return s->cfg.max_seqs < SCHED_PLP_CHUNK ? s->cfg.max_seqs : SCHED_PLP_CHUNK;
}

/* The tokens q may take this step out of `want`: where its entry returns prompt logprobs, within
 * what the step has left of those rows (*left, which the caller takes the final chunk from) */
static int32_t plp_want(const sreq *q, int32_t want, int32_t left) {
    return wants_plp(q) && want > left ? left : want;
}

/* Whether q looks in the prefix cache at all. A backend learns a sequence's tokens only from the
 * plans that send them. The repetition penalty looks at every token: such a request computes its
 * own rows from position 0. A request for its prompt's logprobs needs every prompt position's
 * logits. */
static bool prefix_looks_up(const sched *s, const sreq *q) {
    const float rp = q->sampling.repetition_penalty;
    return s->cfg.prefix_cache && (rp == 1.0f || rp == 0.0f) && !wants_plp(q);
}

/* Longest chain of cached full blocks equal to the request's tokens from position 0, leaving
 * at least one token to compute; the ids go to q->blocks[0, hits) (q->n_blocks untouched, no
 * reference taken). *in_lru gets how many of them are evictable now. */
static int32_t prefix_lookup(sched *s, sreq *q, int32_t *in_lru) {
    *in_lru = 0;
    if (!prefix_looks_up(s, q)) return 0;
    /* The presence and frequency penalties look at the generated tokens: the hits of such a
     * request stay within the prompt (a preempted request's generated tokens are sent again). */
    const sched_sampling *sp = &q->sampling;
    int32_t bs = s->cfg.block_size, max_hits = (q->n_tokens - 1) / bs, hits = 0;
    if ((sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f) && max_hits > q->n_prompt / bs)
        max_hits = q->n_prompt / bs;
    reserve_blocks(q, max_hits);
    int32_t parent = -1;
    while (hits < max_hits) {
        const int32_t *toks = q->tokens + (size_t)hits * (size_t)bs;
        int32_t b = cache_find(s, parent, toks, prefix_hash(s, parent, toks));
        if (b < 0) break;
        if (s->ref[b] == 0) (*in_lru)++;
        q->blocks[hits++] = b;
        parent = b;
    }
    return hits;
}

/* The cached block that holds q's table entry j's key: the entry itself, or the one it duplicates */
static int32_t canon_of(const sreq *q, int32_t j) { return q->pins[j] >= 0 ? q->pins[j] : q->blocks[j]; }

/* Registers the full blocks the request's steps filled (up to q->n_computed), each under its
 * parent, the cached block of the position before it (a chain hangs off the cache from the
 * first block on). A block whose key another block holds already stays private. Where another
 * running request holds that block (the two computed the same tokens in one step), this one
 * holds it too (its pin: no block more is taken) and the chain goes on through it, so that the
 * blocks after it, where the two part, are cached too. Where no one holds it (an evictable block:
 * a request that computes its whole prompt, the repetition penalty's, found it cached), holding
 * it would take a block the admission counted as free: the chain ends there, the rest private. */
static void register_full_blocks(sched *s, sreq *q) {
    if (!s->cfg.prefix_cache) return;
    int32_t bs = s->cfg.block_size;
    for (int32_t j = q->n_canon; !q->chain_ends && j < q->n_computed / bs; j++) {
        int32_t b = q->blocks[j];
        MLA_ASSERT(!s->reg[b]); /* reused blocks lie before start_pos */
        const int32_t parent = j > 0 ? canon_of(q, j - 1) : -1;
        const int32_t *toks = q->tokens + (size_t)j * (size_t)bs;
        uint64_t h = prefix_hash(s, parent, toks);
        const int32_t d = cache_find(s, parent, toks, h);
        if (d >= 0 && s->ref[d] == 0) {
            q->chain_ends = true;
            return;
        }
        q->pins[j] = d;
        if (d >= 0) {
            block_ref(s, d);
            s->npin[d]++;
            s->n_pins++;
        } else {
            cache_insert(s, b, parent, toks, h);
        }
        q->n_canon = j + 1;
    }
}

/* q leaves the running batch, finished: its blocks and state go (retire) */
static void leave_running(sched *s, sreq *q) {
    int k = rv_find(&s->running, q);
    MLA_ASSERT(k >= 0);
    rv_remove_at(&s->running, k);
    retire(s, q);
}

/* q fails with msg: its final event (SCHED_FINISH_ERROR), then it leaves the running batch */
static void fail_running(sched *s, sreq *q, const char *msg) {
    pending_event *e = push_event(s, q);
    e->ev.finish = SCHED_FINISH_ERROR;
    snprintf(e->error, sizeof(e->error), "%s", msg);
    leave_running(s, q);
}

/* running request i goes back to the front of the queue, its blocks and state released: it
 * starts over from its first token when admitted again */
static void requeue(sched *s, int i) {
    sreq *q = s->running.v[i];
    rv_remove_at(&s->running, i);
    release_blocks(s, q);
    rv_insert_front(&s->waiting, q);
}

static void preempt(sched *s, sreq *q) {
    int i = rv_find(&s->running, q);
    MLA_ASSERT(i >= 0);
    requeue(s, i);
    queue_free_seq(s, q);
    q->preempt_step = s->st.steps + 1;
    s->st.preemptions++;
    MLA_DEBUG("sched: preempted request %llu (%d tokens to recompute)",
              (unsigned long long)q->id, q->n_tokens);
}

/* The backend lost its rows (be.cache_epoch moved): the running requests start over from their
 * first token, as after a preemption (not counted as one), and the prefix cache forgets every
 * block, none of which holds its rows any more. */
static void cache_lost(sched *s) {
    const int n_run = s->running.n, n_cached = s->n_lru;
    /* the youngest first: the oldest ends up first in line; no free_seq: the backend forgot them */
    while (s->running.n > 0) requeue(s, s->running.n - 1);
    while (s->n_lru > 0) { /* every block is unreferenced now; the LRU head never has a child */
        const int32_t b = s->lru_head;
        lru_unlink(s, b);
        cache_remove(s, b);
        s->free_blocks[s->n_free++] = b;
    }
    MLA_WARN("sched: the workers lost their cache: %d running requests start over, %d cached blocks dropped",
             n_run, n_cached);
}

/* whether the token a row of q samples after its first `to` tokens ends q by its length (the
 * finish rule of the step's results: max_tokens, or the context full) */
static bool last_by_length(const sched *s, const sreq *q, int32_t to) {
    return q->n_gen + 1 >= q->max_tokens || to + 1 >= s->cfg.max_context;
}

static void plan_add(sched *s, int *n, sreq *q, int32_t chunk) {
    sched_plan_seq *p = &s->plan[*n];
    p->seq_id = q->id;
    p->tokens = q->tokens + q->n_computed;
    p->n_tokens = chunk;
    p->start_pos = q->n_computed;
    p->block_table = q->blocks;
    p->n_blocks = q->n_blocks;
    p->n_blocks_sent = q->n_sent;
    p->sample = q->n_computed + chunk == q->n_tokens;
    p->last = p->sample && last_by_length(s, q, q->n_tokens);
    p->sampling = &q->sampling;
    p->seq_tokens = q->tokens;
    p->n_prompt = q->n_prompt;
    p->n_generated = q->n_gen;
    p->prompt_logprobs = wants_plp(q) && q->n_computed < q->n_prompt;
    if (p->prompt_logprobs && !q->plp && q->n_prompt > 1) /* at its first entry: not while it waits */
        q->plp = mla_xcalloc((size_t)q->n_prompt - 1, sizeof *q->plp);
    s->plan_req[*n] = q;
    q->has_state = true;
    q->n_sent = q->n_blocks;
    (*n)++;
}

static bool is_stop_token(const sched *s, const sreq *q, int32_t tok) {
    for (int32_t i = 0; i < q->n_stop_ids; i++)
        if (q->stop_ids[i] == tok) return true;
    if (!q->ignore_eos && s->cfg.is_eog && s->cfg.is_eog(s->cfg.eog_ctx, tok)) return true;
    return false;
}

/* cfg.hold_until: fewer requests than that submitted so far (ids count them; once reached, for
 * good). */
static bool held(const sched *s) {
    return s->cfg.hold_until > 0 && s->next_id - 1 < (uint64_t)s->cfg.hold_until;
}

/* A prompt chunk of up to `want` tokens (what it has left to prefill) within budget: the long
 * ones (more than cfg.long_prefill_tokens left) share half of the step while other requests are
 * in line behind them (`others`: running after it, or waiting): *long_used counts what they took,
 * a later one gets what is left of the half (at least a token); *cut says whether it was cut. */
static int32_t chunk_of(const sched *s, int32_t want, int32_t budget, bool others, int32_t *long_used, bool *cut) {
    const int32_t c = want < budget ? want : budget;
    *cut = false;
    if (!others || s->cfg.long_prefill_tokens <= 0 || want <= s->cfg.long_prefill_tokens) return c;
    const int32_t half = s->cfg.max_step_tokens > 1 ? s->cfg.max_step_tokens / 2 : 1;
    const int32_t cap = half - *long_used > 1 ? half - *long_used : 1, r = c < cap ? c : cap;
    *cut = r < c;
    *long_used += r;
    return r;
}

/* The plan's cut chunks (chunk_of) grow into the budget the step left, oldest first, as far as
 * blocks can be had without preempting; one that then ends its prompt also gets the block of the
 * position after it where one is free (decode_lookahead, as build_plan gives a decode row). */
static void grow_cut(sched *s, const int *cut, int n_cut, int32_t *budget, int32_t *plp_left) {
    for (int k = 0; k < n_cut && *budget > 0; k++) {
        sched_plan_seq *p = &s->plan[cut[k]];
        sreq *q = s->plan_req[cut[k]];
        const int32_t from = q->n_computed + p->n_tokens, room = (q->n_blocks + s->n_free + s->n_lru) * s->cfg.block_size;
        int32_t to = q->n_tokens < from + *budget ? q->n_tokens : from + *budget;
        if (to > room) to = room;
        if (wants_plp(q) && to - from > *plp_left) to = from + *plp_left;
        if (to <= from) continue;
        if (wants_plp(q)) *plp_left -= to - from;
        const bool ok = alloc_blocks(s, q, to);
        MLA_ASSERT(ok);
        p->n_tokens += to - from;
        p->sample = to == q->n_tokens;
        p->last = p->sample && last_by_length(s, q, to);
        if (p->sample && s->cfg.decode_lookahead && to + 1 <= q->cap_tokens) (void)alloc_blocks(s, q, to + 1);
        p->block_table = q->blocks; /* alloc_blocks may have moved it */
        p->n_blocks = q->n_blocks;
        q->n_sent = q->n_blocks;
        *budget -= to - from;
    }
}

/* Blocks q still needs for its tokens (its prompt, or the position being decoded), 0 when none. */
static int32_t blocks_left(const sched *s, const sreq *q) {
    const int32_t need = blocks_for(s, q->n_tokens) - q->n_blocks;
    return need > 0 ? need : 0;
}

/* Builds the plan; returns the number of entries. */
static int build_plan(sched *s, int32_t *n_tokens_out) {
    int n = 0, n_cut = 0;
    *n_tokens_out = 0;
    if (held(s)) return 0;
    int32_t budget = s->cfg.max_step_tokens, long_used = 0, plp_left = plp_step_rows(s);
    int *cut = s->plan_cut;
    /* running sequences, oldest first */
    for (int i = 0; i < s->running.n && budget > 0 && n < s->cfg.max_seqs; i++) {
        sreq *q = s->running.v[i];
        int32_t pending = q->n_tokens - q->n_computed;
        MLA_ASSERT(pending >= 1);
        bool was_cut;
        const int32_t want = plp_want(q, pending, plp_left);
        if (want == 0) continue; /* its prompt's logprobs go on next step */
        int32_t chunk = chunk_of(s, want, budget, i + 1 < s->running.n || s->waiting.n > 0, &long_used, &was_cut);
        if (wants_plp(q)) plp_left -= chunk;
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
        /* a decode row: the block of its next position too, when one is free without preempting
         * (a worker may run that step ahead of the plan: worker/wk_ahead.h) */
        if (s->cfg.decode_lookahead && chunk == pending && q->n_computed + chunk + 1 <= q->cap_tokens)
            (void)alloc_blocks(s, q, q->n_computed + chunk + 1);
        if (was_cut) cut[n_cut++] = n;
        plan_add(s, &n, q, chunk);
        budget -= chunk;
    }
    /* with long prompts sharing their steps (long_prefill_tokens), a request is admitted only
     * where its whole prompt fits beside the blocks the running ones still need for theirs
     * (reserve): one admitted beside a long prefill is then not preempted by it */
    const bool whole = s->cfg.long_prefill_tokens > 0;
    int32_t reserve = 0;
    if (whole)
        for (int i = 0; i < s->running.n; i++) reserve += blocks_left(s, s->running.v[i]);
    /* admission, first come first served; a request whose prompt logprobs the step has no rows
     * left for waits for the next step without holding back the ones behind it. The cap counts
     * the running requests, not the plan's entries: a running one whose prompt logprobs wait
     * for the next step is not in this plan but holds its place in the batch. */
    for (int wi = 0; budget > 0 && s->running.n < s->cfg.max_seqs && wi < s->waiting.n;) {
        sreq *q = s->waiting.v[wi];
        if (q->preempt_step == s->st.steps + 1) break; /* not in the step that preempted it */
        if (q->leader) { /* its prompt's blocks come with the leader's: the ones behind it go on */
            wi++;
            continue;
        }
        MLA_ASSERT(q->n_blocks == 0 && q->n_computed == 0);
        int32_t in_lru;
        int32_t hits = prefix_lookup(s, q, &in_lru);
        int32_t start = hits * s->cfg.block_size;
        bool was_cut;
        const int32_t want = plp_want(q, q->n_tokens - start, plp_left);
        if (want == 0) {
            wi++;
            continue;
        }
        int32_t chunk = chunk_of(s, want, budget, s->waiting.n > 1, &long_used, &was_cut);
        /* cached blocks it reuses stop being evictable: they cannot be allocated as well */
        if (blocks_for(s, whole ? q->n_tokens : start + chunk) - hits + reserve > s->n_free + s->n_lru - in_lru) break;
        if (wants_plp(q)) plp_left -= chunk;
        for (int32_t i = 0; i < hits; i++) {
            block_ref(s, q->blocks[i]);
            q->pins[i] = -1;
        }
        q->n_blocks = hits;
        q->n_canon = hits;
        q->n_computed = start;
        if (q->n_cached < 0) q->n_cached = start < q->n_prompt ? start : q->n_prompt;
        bool ok = alloc_blocks(s, q, start + chunk);
        MLA_ASSERT(ok);
        if (prefix_looks_up(s, q)) { /* tokens looked up, as vLLM counts them (again after a preemption) */
            s->st.prefix_queries += (uint64_t)q->n_tokens;
            s->st.prefix_hits += (uint64_t)start;
        }
        if (whole) reserve += blocks_left(s, q);
        rv_remove_at(&s->waiting, wi);
        rv_push(&s->running, q);
        if (was_cut) cut[n_cut++] = n;
        plan_add(s, &n, q, chunk);
        budget -= chunk;
    }
    grow_cut(s, cut, n_cut, &budget, &plp_left);
    *n_tokens_out = s->cfg.max_step_tokens - budget;
    return n;
}

/* Entry p's prompt logprobs into q->plp (prompt token k's at [k - 1]); MLA_ERR when the backend
 * returned another number than the entry's prompt positions */
static int take_plp(sreq *q, const sched_plan_seq *p, const sched_result *r) {
    const int32_t end = p->start_pos + p->n_tokens < q->n_prompt - 1 ? p->start_pos + p->n_tokens : q->n_prompt - 1;
    const int32_t n = end > p->start_pos ? end - p->start_pos : 0;
    if (r->n_plp != n || (n > 0 && !r->plp)) return MLA_ERR;
    for (int32_t j = 0; j < n; j++) {
        sched_plp *d = &q->plp[p->start_pos + j];
        *d = r->plp[j];
        if (d->n_top < 0) d->n_top = 0;
        if (d->n_top > SCHED_MAX_TOP_LOGPROBS) d->n_top = SCHED_MAX_TOP_LOGPROBS;
    }
    return MLA_OK;
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

/* How long a step waits while the backend is paused before it looks again */
#define SCHED_PAUSE_POLL_MS 20

int sched_step(sched *s) {
    const bool paused = s->be.paused && s->be.paused(s->be.ctx);
    const uint64_t epoch = s->be.cache_epoch ? s->be.cache_epoch(s->be.ctx) : 0;
    pthread_mutex_lock(&s->mu);
    MLA_ASSERT(!s->step_active);
    s->step_active = true;
    if (epoch != s->epoch) {
        s->epoch = epoch;
        cache_lost(s);
    }
    handle_cancellations(s);
    int32_t n_tok = 0;
    int n = paused ? 0 : build_plan(s, &n_tok);
    pthread_mutex_unlock(&s->mu);

    /* events of cancellations and frees of preempted sequences go out before the step */
    flush_outside_lock(s);
    if (n == 0) {
        pthread_mutex_lock(&s->mu);
        s->step_active = false;
        if (paused && !s->stopping) { /* requests wait for the backend: look again in a while */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += SCHED_PAUSE_POLL_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
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
            fail_running(s, q, err.msg[0] ? err.msg : "backend failure");
            continue;
        }
        if (p->prompt_logprobs && take_plp(q, p, &s->results[i])) {
            fail_running(s, q, "the workers returned the wrong number of prompt logprobs");
            continue;
        }
        q->n_computed += p->n_tokens;
        register_full_blocks(s, q);
        if (q->n_computed >= q->n_prompt) open_gate(s, q);
        if (q->n_prompt > q->n_computed - p->n_tokens) {
            int32_t from = q->n_computed - p->n_tokens;
            int32_t to = q->n_computed < q->n_prompt ? q->n_computed : q->n_prompt;
            s->st.tokens_prefilled += (uint64_t)(to - from);
        }
        if (!p->sample) continue;
        const sched_result *r = &s->results[i];
        if (q->cancelled) continue; /* finished by handle_cancellations next step */
        if (r->error) { /* this sequence alone cannot go on */
            fail_running(s, q, r->error);
            continue;
        }
        MLA_ASSERT(q->n_tokens < q->cap_tokens);
        q->tokens[q->n_tokens++] = r->token;
        q->n_gen++;
        s->st.tokens_generated++;
        pending_event *e = push_event(s, q);
        e->ev.has_token = true;
        e->ev.result = *r;
        e->ev.result.plp = NULL;
        e->ev.result.n_plp = 0;
        if (wants_plp(q)) { /* its prompt is done: the first token brings its logprobs */
            e->ev.plp = q->plp;
            e->ev.n_plp = q->n_prompt - 1;
            q->plp_sent = true;
        }
        if (e->ev.result.n_top < 0) e->ev.result.n_top = 0;
        if (e->ev.result.n_top > SCHED_MAX_TOP_LOGPROBS) e->ev.result.n_top = SCHED_MAX_TOP_LOGPROBS;
        if (is_stop_token(s, q, r->token)) {
            e->ev.is_stop = true;
            e->ev.finish = SCHED_FINISH_STOP;
        } else if (q->n_gen >= q->max_tokens || q->n_tokens >= s->cfg.max_context) {
            e->ev.finish = SCHED_FINISH_LENGTH;
        }
        if (e->ev.finish != SCHED_FINISH_NONE) leave_running(s, q);
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
        while (!s->stopping && (s->waiting.n == 0 || held(s)) && s->running.n == 0 &&
               !s->n_cancel_pending)
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

/* ---- consistency check ---- */

static int check_locked(sched *s, mla_err *err) {
    int32_t nb = s->cfg.n_blocks, bs = s->cfg.block_size;
    int32_t *holders = mla_xcalloc((size_t)nb, sizeof(int32_t));
    int32_t *lru_pos = mla_xmalloc((size_t)nb * sizeof(int32_t));
    int32_t *children = mla_xcalloc((size_t)nb, sizeof(int32_t));
    uint8_t *in_free = mla_xcalloc((size_t)nb, 1);
    int32_t *pins = mla_xcalloc((size_t)nb, sizeof(int32_t));
    int64_t n_pins = 0;
    int rc = MLA_OK;
#define FAIL(...)                        \
    do {                                 \
        rc = mla_errf(err, __VA_ARGS__); \
        goto out;                        \
    } while (0)
    for (int i = 0; i < s->waiting.n; i++)
        if (s->waiting.v[i]->n_blocks != 0 || s->waiting.v[i]->n_computed != 0)
            FAIL("waiting request %llu holds %d blocks", (unsigned long long)s->waiting.v[i]->id,
                 s->waiting.v[i]->n_blocks);
    /* a gate (sched_request.after): the leader waits or prefills, and counts its followers */
    for (int l = 0; l < 2; l++) {
        const reqvec *v = l ? &s->running : &s->waiting;
        for (int i = 0; i < v->n; i++) {
            const sreq *q = v->v[i];
            int32_t n = 0;
            for (int k = 0; k < s->waiting.n; k++) n += s->waiting.v[k]->leader == q;
            if (n != q->n_followers || (n && l && q->n_computed >= q->n_prompt))
                FAIL("request %llu: %d followers counted, %d waiting on it (%d of %d prompt tokens computed)",
                     (unsigned long long)q->id, q->n_followers, n, q->n_computed, q->n_prompt);
            if (l && q->leader) FAIL("running request %llu still has a leader", (unsigned long long)q->id);
        }
    }
    for (int i = 0; i < s->waiting.n; i++) {
        const sreq *L = s->waiting.v[i]->leader;
        if (L && rv_find(&s->waiting, L) < 0 && rv_find(&s->running, L) < 0)
            FAIL("waiting request %llu: its leader is gone", (unsigned long long)s->waiting.v[i]->id);
    }
    for (int i = 0; i < s->running.n; i++) {
        const sreq *q = s->running.v[i];
        if (q->n_computed < 0 || q->n_computed > q->n_tokens ||
            q->n_blocks < blocks_for(s, q->n_computed) ||
            q->n_blocks > blocks_for(s, q->n_tokens + (s->cfg.decode_lookahead ? 1 : 0)) ||
            q->n_sent > q->n_blocks)
            FAIL("request %llu: %d computed of %d tokens, %d blocks, %d sent",
                 (unsigned long long)q->id, q->n_computed, q->n_tokens, q->n_blocks, q->n_sent);
        if (q->n_canon < 0 || q->n_canon > q->n_blocks || q->n_canon * bs > q->n_computed ||
            (s->cfg.prefix_cache && !q->chain_ends && q->n_canon != q->n_computed / bs))
            FAIL("request %llu: %d blocks accounted for the cache, %d computed", (unsigned long long)q->id, q->n_canon,
                 q->n_computed);
        for (int32_t j = 0; j < q->n_blocks; j++) {
            int32_t b = q->blocks[j];
            if (b < 0 || b >= nb) FAIL("request %llu: block id %d", (unsigned long long)q->id, b);
            holders[b]++;
            const int32_t pin = j < q->n_canon ? q->pins[j] : -1;
            if (pin >= 0) {
                if (pin >= nb || pin == b || is_registered(s, b) || !is_registered(s, pin))
                    FAIL("request %llu: table index %d holds block %d beside %d", (unsigned long long)q->id, j, pin, b);
                holders[pin]++;
                pins[pin]++;
            }
            const int32_t c = pin >= 0 ? pin : b;
            if (!is_registered(s, c)) {
                if (j < q->n_canon) FAIL("request %llu: table index %d is not cached", (unsigned long long)q->id, j);
                continue;
            }
            /* a cached block in a table (or held for it) holds exactly this request's tokens after the
             * cached blocks of its earlier positions */
            int32_t parent = j > 0 ? canon_of(q, j - 1) : -1;
            if (j >= q->n_canon || (j + 1) * bs > q->n_computed || s->kparent[c] != parent ||
                memcmp(key_tokens(s, c), q->tokens + (size_t)j * (size_t)bs, (size_t)bs * sizeof(int32_t)))
                FAIL("request %llu: cached block %d at table index %d does not hold its prefix",
                     (unsigned long long)q->id, c, j);
        }
    }
    for (int32_t k = 0; k < s->n_free; k++) {
        int32_t b = s->free_blocks[k];
        if (b < 0 || b >= nb || in_free[b]) FAIL("free stack entry %d: block %d", k, b);
        in_free[b] = 1;
    }
    for (int32_t b = 0; b < nb; b++) lru_pos[b] = -1;
    int32_t n = 0, prev = -1;
    for (int32_t b = s->lru_head; b >= 0; b = s->lru_next[b]) {
        if (b >= nb || lru_pos[b] >= 0 || n >= nb || s->lru_prev[b] != prev)
            FAIL("LRU list broken at block %d", b);
        lru_pos[b] = n++;
        prev = b;
    }
    if (prev != s->lru_tail || n != s->n_lru) FAIL("LRU list: %d blocks, counted %d", n, s->n_lru);
    int32_t n_reg = 0, used = 0;
    for (int32_t b = 0; b < nb; b++) {
        bool reg = is_registered(s, b);
        if (s->ref[b] != holders[b] || s->npin[b] != pins[b])
            FAIL("block %d: reference count %d (%d pins), held by %d running tables and pins (%d pins)", b, s->ref[b],
                 s->npin[b], holders[b], pins[b]);
        n_pins += pins[b];
        if (s->ref[b] > 0) used++;
        if (in_free[b] != (s->ref[b] == 0 && !reg))
            FAIL("block %d: ref %d, registered %d, on the free stack %d", b, s->ref[b], reg, in_free[b]);
        if ((lru_pos[b] >= 0) != (s->ref[b] == 0 && reg))
            FAIL("block %d: ref %d, registered %d, in the LRU %d", b, s->ref[b], reg, lru_pos[b] >= 0);
        if (!reg) continue;
        n_reg++;
        int32_t p = s->kparent[b];
        if (p < -1 || p >= nb || (p >= 0 && !s->reg[p]))
            FAIL("cached block %d: parent %d is not cached", b, p);
        if (p >= 0 && s->ref[b] > 0 && s->ref[p] == 0)
            FAIL("cached block %d is held, its parent %d is not", b, p);
        if (p >= 0 && lru_pos[b] >= 0 && lru_pos[p] >= 0 && lru_pos[p] < lru_pos[b])
            FAIL("cached block %d would be evicted after its parent %d", b, p);
        if (s->khash[b] != prefix_hash(s, p, key_tokens(s, b)) ||
            cache_find(s, p, key_tokens(s, b), s->khash[b]) != b)
            FAIL("cached block %d is not found under its key", b);
        if (p >= 0) children[p]++;
    }
    for (int32_t b = 0; b < nb; b++)
        if (is_registered(s, b) && children[b] != s->nchild[b])
            FAIL("cached block %d: %d children, counted %d", b, children[b], s->nchild[b]);
    if (s->reg) {
        int32_t in_table = 0;
        for (uint32_t k = 0; k <= s->bucket_mask; k++)
            for (int32_t b = s->buckets[k]; b >= 0 && in_table <= nb; b = s->hnext[b]) in_table++;
        if (in_table != n_reg) FAIL("hash table holds %d entries, %d blocks are cached", in_table, n_reg);
    }
    if (s->n_free + s->n_lru + used != nb)
        FAIL("free %d + cached %d + used %d != %d blocks", s->n_free, s->n_lru, used, nb);
    if (n_pins != s->n_pins) FAIL("%lld pins counted, %lld held", (long long)s->n_pins, (long long)n_pins);
#undef FAIL
out:
    free(pins);
    free(holders);
    free(lru_pos);
    free(children);
    free(in_free);
    return rc;
}

int sched_check(sched *s, mla_err *err) {
    pthread_mutex_lock(&s->mu);
    int rc = check_locked(s, err);
    pthread_mutex_unlock(&s->mu);
    return rc;
}
