/* engine_cpu: the engine (worker/engine.h) on top of the CPU forward pass (worker/model.h).
 * The latent cache lives in a pool of host memory (engine_opts kv.kv_memory_bytes, 1 GiB when 0):
 * blocks of CPU_KV_BLOCK positions, each holding every layer's latent rows of those positions,
 * then every layer's indexer key rows. Each sequence id has the block table the coordinator's
 * plans give it (set_tables). A step copies the sequence's rows [0, pos0) from its blocks into a
 * contiguous working cache, runs the reference forward pass there, and copies the new rows back
 * into the blocks: the reference code stays as it is, and the pool is what bounds memory. A plan
 * whose first position is below the sequence's length rewinds it; a sequence that holds nothing
 * may start at a later position (its table then shares blocks another sequence filled: the
 * prefix cache); any other gap is an error. Bench hooks:
 * bench_fill zeroes the first n_past rows through a given table; bench_coll times the worker's
 * collective (the host collective) on a buffer of zeros. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine_cpu.h"
#include "gguf.h"
#include "kvtab.h"
#include "mla_log.h"
#include "model.h"

#define CPU_KV_BLOCK 16
#define CPU_KV_DEFAULT_BYTES ((uint64_t)1 << 30)

typedef struct cpu_seq {
    uint64_t id;
    kvtab tab;
    int64_t n_past;
} cpu_seq;

struct engine {
    gguf_ctx *g;
    mla_model *m;
    coll *c; /* the worker's collective (borrowed) */
    int64_t n_ctx; /* the longest sequence */
    int64_t n_layer, kv_row, ik_row;
    float *pool;
    size_t blk_floats;
    engine_kv_pool kv;
    mla_state *work; /* the contiguous working cache, grown on demand up to n_ctx */
    cpu_seq *seqs;
    size_t n, cap;
    uint64_t dt_steps; /* decode steps (every row one token) and their seconds: cpu_decode_time */
    double dt_seconds;
};

static int cpu_model_hash(const char *path, uint64_t *hash, mla_err *err) {
    gguf_ctx *g;
    if (gguf_open(&g, path, err)) return MLA_ERR;
    *hash = gguf_index_hash(g);
    gguf_close(g);
    return MLA_OK;
}

static void cpu_destroy(engine *e);

static int cpu_load(engine **out, const char *path, int rank, int world, coll *c, const engine_boot *boot,
                    const engine_opts *eo, mla_err *err) {
    (void)rank, (void)boot; /* the host collective needs no id */
    if (eo->wo.allreduce == WIRE_AR_ONESHOT && world > 1)
        return mla_errf(err, "--allreduce oneshot is an all-reduce between GPUs; the CPU backend uses the host collective");
    engine *e = mla_xcalloc(1, sizeof *e);
    e->c = c;
    if (gguf_open(&e->g, path, err)) {
        free(e);
        return MLA_ERR;
    }
    mla_model_opts opts = {.n_threads = eo->n_threads};
    if (mla_model_load(&e->m, e->g, c, &opts, err)) {
        gguf_close(e->g);
        free(e);
        return MLA_ERR;
    }
    const mla_config *cf = mla_model_config(e->m);
    e->n_ctx = eo->kv.max_context > 0 ? eo->kv.max_context : cf->ctx_train > 0 ? cf->ctx_train : 4096;
    e->n_layer = cf->n_layer;
    e->kv_row = cf->kv_lora_rank + cf->n_rope;
    e->ik_row = cf->idx_n_head > 0 ? cf->idx_head_dim : 0;
    e->blk_floats = (size_t)(e->n_layer * CPU_KV_BLOCK * (e->kv_row + e->ik_row));
    const uint64_t bytes = eo->kv.kv_memory_bytes ? eo->kv.kv_memory_bytes : CPU_KV_DEFAULT_BYTES;
    uint64_t nb = bytes / (e->blk_floats * sizeof(float));
    if (nb > WIRE_MAX_BLOCKS) nb = WIRE_MAX_BLOCKS;
    if (nb < 1) {
        mla_errf(err, "--kv-memory %llu bytes holds no cache block (a block of %d positions takes %zu bytes)",
                 (unsigned long long)bytes, CPU_KV_BLOCK, e->blk_floats * sizeof(float));
        cpu_destroy(e);
        return MLA_ERR;
    }
    /* untouched pages stay unmapped: the pool costs memory as it fills */
    e->pool = calloc((size_t)nb, e->blk_floats * sizeof(float));
    if (!e->pool) {
        mla_errf(err, "cannot allocate the cache pool of %llu blocks (%.2f GiB)", (unsigned long long)nb,
                 (double)nb * (double)(e->blk_floats * sizeof(float)) / 1073741824.0);
        cpu_destroy(e);
        return MLA_ERR;
    }
    e->kv = (engine_kv_pool){(uint32_t)nb, CPU_KV_BLOCK, e->blk_floats * sizeof(float)};
    *out = e;
    return MLA_OK;
}

static void cpu_kv_pool(const engine *e, engine_kv_pool *out) { *out = e->kv; }

static uint32_t cpu_vocab(const engine *e) { return (uint32_t)mla_model_config(e->m)->n_vocab; }

static cpu_seq *get_seq(engine *e, uint64_t id) {
    for (size_t i = 0; i < e->n; i++)
        if (e->seqs[i].id == id) return &e->seqs[i];
    if (e->n == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 8;
        e->seqs = mla_xrealloc(e->seqs, e->cap * sizeof *e->seqs);
    }
    e->seqs[e->n] = (cpu_seq){.id = id};
    return &e->seqs[e->n++];
}

/* Cuts q's table to start entries and appends ids[0, n). */
static int seq_table(engine *e, cpu_seq *q, uint32_t start, const uint32_t *ids, uint32_t n, mla_err *err) {
    if (kvtab_apply(&q->tab, start, ids, n, e->kv.n_blocks, (uint64_t)((e->n_ctx + CPU_KV_BLOCK - 1) / CPU_KV_BLOCK),
                    err))
        return mla_err_prefix(err, "seq %llu", (unsigned long long)q->id);
    if (q->n_past > (int64_t)q->tab.n * CPU_KV_BLOCK) q->n_past = (int64_t)q->tab.n * CPU_KV_BLOCK;
    return MLA_OK;
}

static int cpu_set_tables(engine *e, const wire_step_plan *p, mla_err *err) {
    for (uint32_t i = 0; i < p->n_seqs; i++) {
        const wire_seq *s = &p->seqs[i];
        if (seq_table(e, get_seq(e, s->seq_id), s->block_start, s->blocks, s->n_blocks, err)) return MLA_ERR;
    }
    return MLA_OK;
}

/* Copies positions [p0, p1) of layer il between q's blocks and rows (to_pool: into the blocks). */
static void copy_rows(engine *e, const cpu_seq *q, int64_t il, bool indexer, float *rows, int64_t p0, int64_t p1,
                      bool to_pool) {
    const int64_t w = indexer ? e->ik_row : e->kv_row;
    const size_t off = indexer ? (size_t)(e->n_layer * CPU_KV_BLOCK * e->kv_row + il * CPU_KV_BLOCK * e->ik_row)
                               : (size_t)(il * CPU_KV_BLOCK * e->kv_row);
    for (int64_t p = p0; p < p1;) {
        const int64_t b = p / CPU_KV_BLOCK, j = p % CPU_KV_BLOCK;
        const int64_t cnt = (CPU_KV_BLOCK - j) < (p1 - p) ? (CPU_KV_BLOCK - j) : (p1 - p);
        float *blk = e->pool + (size_t)q->tab.ids[b] * e->blk_floats + off + (size_t)(j * w);
        float *row = rows + p * w;
        if (to_pool) memcpy(blk, row, (size_t)(cnt * w) * sizeof(float));
        else memcpy(row, blk, (size_t)(cnt * w) * sizeof(float));
        p += cnt;
    }
}

static void copy_all(engine *e, const cpu_seq *q, int64_t p0, int64_t p1, bool to_pool) {
    for (int64_t il = 0; il < e->n_layer; il++) {
        copy_rows(e, q, il, false, mla_state_rows(e->work, il, false), p0, p1, to_pool);
        if (e->ik_row) copy_rows(e, q, il, true, mla_state_rows(e->work, il, true), p0, p1, to_pool);
    }
}

/* The working cache holds at least n positions (grown by doubling, at most the context). */
static void ensure_work(engine *e, int64_t n) {
    if (e->work && mla_state_n_ctx(e->work) >= n) return;
    int64_t cap = e->work ? 2 * mla_state_n_ctx(e->work) : 256;
    if (cap < n) cap = n;
    if (cap > e->n_ctx) cap = e->n_ctx;
    mla_state_free(e->work);
    e->work = mla_state_new(e->m, cap);
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cpu_rows(engine *e, const wire_step_plan *p, float *const *logits, mla_err *err) {
    for (uint32_t i = 0; i < p->n_seqs; i++) {
        const wire_seq *s = &p->seqs[i];
        cpu_seq *q = get_seq(e, s->seq_id);
        const int64_t pos0 = s->positions[0], end = pos0 + (int64_t)s->n_tokens;
        /* a sequence that holds nothing yet may start later: rows [0, pos0) are in the blocks its
         * table shares (the coordinator's prefix cache); otherwise a gap is an error */
        if (pos0 > q->n_past && q->n_past > 0)
            return mla_errf(err, "seq %llu: starts at position %lld but its cache holds %lld tokens",
                            (unsigned long long)s->seq_id, (long long)pos0, (long long)q->n_past);
        if (end > e->n_ctx)
            return mla_errf(err, "seq %llu: %lld tokens exceed the context of %lld", (unsigned long long)s->seq_id,
                            (long long)end, (long long)e->n_ctx);
        if (end > (int64_t)q->tab.n * CPU_KV_BLOCK)
            return mla_errf(err, "seq %llu: the block table covers %lld positions, the step needs %lld",
                            (unsigned long long)s->seq_id, (long long)q->tab.n * CPU_KV_BLOCK, (long long)end);
        enum mla_logits_mode mode = s->sp.logits == WIRE_LOGITS_ALL ? MLA_LOGITS_ALL
                                    : (s->sample || s->sp.logits == WIRE_LOGITS_LAST) ? MLA_LOGITS_LAST
                                                                                     : MLA_LOGITS_NONE;
        ensure_work(e, end);
        copy_all(e, q, 0, pos0, false);
        mla_state_set_n_past(e->work, pos0);
        if (mla_model_forward(e->m, e->work, s->tokens, s->n_tokens, pos0, mode, logits[i], err))
            return mla_err_prefix(err, "seq %llu", (unsigned long long)s->seq_id);
        copy_all(e, q, pos0, end, true);
        q->n_past = end;
    }
    return MLA_OK;
}

/* engine.h step; a step whose rows are all one token long is timed as a decode step */
static int cpu_step(engine *e, const wire_step_plan *p, float *const *logits, mla_err *err) {
    bool decode = p->n_seqs > 0;
    for (uint32_t i = 0; i < p->n_seqs; i++) decode &= p->seqs[i].n_tokens == 1;
    const double t0 = decode ? mono_s() : 0;
    if (cpu_rows(e, p, logits, err)) return MLA_ERR;
    if (decode) {
        e->dt_steps++;
        e->dt_seconds += mono_s() - t0;
    }
    return MLA_OK;
}

static void cpu_decode_time(const engine *e, uint64_t *steps, double *seconds) {
    *steps = e->dt_steps;
    *seconds = e->dt_seconds;
}

/* engine.h step_greedy: step, then the greedy rows' argmax (lowest id on ties, as the host
 * sampler's greedy pick), so that the worker's step ahead (worker/wk_ahead.h) runs on this
 * backend too; their logits rows are written as well. */
static int cpu_step_greedy(engine *e, const wire_step_plan *p, float *const *logits, const engine_drow *drow,
                           int32_t *tokens, mla_err *err) {
    for (uint32_t i = 0; tokens && i < p->n_seqs; i++) tokens[i] = -1;
    if (cpu_step(e, p, logits, err)) return MLA_ERR;
    const uint32_t V = cpu_vocab(e);
    for (uint32_t i = 0; drow && i < p->n_seqs; i++) {
        const wire_seq *s = &p->seqs[i];
        const engine_drow *d = &drow[i];
        /* greedy rows only (no dev_sample): the others are sampled on the host */
        if (!d->take || d->mod_later || d->mod.allow || d->mod.n_bias || (s->sp.temperature != 0 && s->sp.top_k != 1) ||
            !s->sample || s->sp.logits != WIRE_LOGITS_NONE)
            continue;
        const float *r = logits[i];
        uint32_t best = 0;
        for (uint32_t t = 1; t < V; t++)
            if (r[t] > r[best]) best = t;
        tokens[i] = (int32_t)best;
    }
    return MLA_OK;
}

static void cpu_free_seq(engine *e, uint64_t id) {
    for (size_t i = 0; i < e->n; i++)
        if (e->seqs[i].id == id) {
            kvtab_free(&e->seqs[i].tab);
            e->seqs[i] = e->seqs[--e->n];
            return;
        }
}

static int cpu_bench_fill(engine *e, uint64_t id, uint32_t n_past, const uint32_t *blocks, uint32_t n_blocks,
                          mla_err *err) {
    if ((int64_t)n_past > e->n_ctx)
        return mla_errf(err, "%u positions exceed the context of %lld", n_past, (long long)e->n_ctx);
    cpu_seq *q = get_seq(e, id);
    if (seq_table(e, q, 0, blocks, n_blocks, err)) return MLA_ERR;
    if ((int64_t)n_past > (int64_t)q->tab.n * CPU_KV_BLOCK)
        return mla_errf(err, "seq %llu: a table of %u blocks does not cover %u positions", (unsigned long long)id,
                        q->tab.n, n_past);
    for (uint32_t b = 0; b < q->tab.n; b++)
        memset(e->pool + (size_t)q->tab.ids[b] * e->blk_floats, 0, e->blk_floats * sizeof(float));
    q->n_past = n_past;
    return MLA_OK;
}

static int cpu_bench_coll(engine *e, size_t n, int iters, double *sec_per_op, mla_err *err) {
    *sec_per_op = 0;
    if (n == 0 || iters < 1) return mla_errf(err, "an all-reduce of %zu floats %d times (need at least 1 of each)", n, iters);
    if (!e->c) return mla_errf(err, "this engine has no collective");
    float *buf = calloc(n, sizeof *buf); /* zeros: sums stay zero, however many iterations */
    if (!buf) return mla_errf(err, "cannot allocate %zu floats for the all-reduce", n);
    int rc = coll_allreduce_sum_f32(e->c, buf, n, err); /* untimed: faults the pages, lines up the ranks */
    double t0 = mono_s();
    for (int i = 0; rc == MLA_OK && i < iters; i++) rc = coll_allreduce_sum_f32(e->c, buf, n, err);
    double t1 = mono_s();
    free(buf);
    if (rc == MLA_OK) *sec_per_op = (t1 - t0) / iters;
    return rc;
}

static void cpu_destroy(engine *e) {
    if (!e) return;
    for (size_t i = 0; i < e->n; i++) kvtab_free(&e->seqs[i].tab);
    free(e->seqs);
    mla_state_free(e->work);
    free(e->pool);
    mla_model_free(e->m);
    gguf_close(e->g);
    free(e);
}

const engine_ops engine_cpu_ops = {.name = "cpu",
                                   .model_hash = cpu_model_hash,
                                   .load = cpu_load,
                                   .kv_pool = cpu_kv_pool,
                                   .set_tables = cpu_set_tables,
                                   .n_vocab = cpu_vocab,
                                   .step = cpu_step,
                                   .step_greedy = cpu_step_greedy,
                                   .free_seq = cpu_free_seq,
                                   .destroy = cpu_destroy,
                                   .bench_fill = cpu_bench_fill,
                                   .bench_coll = cpu_bench_coll,
                                   .decode_time = cpu_decode_time};
