/* engine_cpu: the engine (worker/engine.h) on top of the CPU forward pass (worker/model.h).
 * One mla_state (latent KV cache) per sequence id, of MLA_N_CTX tokens (environment; default
 * min(trained context, 8192)). A plan whose first position is below the cached length rewinds
 * the cache (positions 0 restarts the sequence); a gap is an error. Bench hooks: bench_fill zeroes
 * the first n_past rows of a sequence's cache (mla_state_bench_fill); bench_coll times the
 * worker's collective (the host collective) on a buffer of zeros. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine_cpu.h"
#include "gguf.h"
#include "mla_log.h"
#include "model.h"

typedef struct cpu_seq {
    uint64_t id;
    mla_state *st;
} cpu_seq;

struct engine {
    gguf_ctx *g;
    mla_model *m;
    coll *c; /* the worker's collective (borrowed) */
    int64_t n_ctx;
    cpu_seq *seqs;
    size_t n, cap;
};

static int cpu_model_hash(const char *path, uint64_t *hash, mla_err *err) {
    gguf_ctx *g;
    if (gguf_open(&g, path, err)) return MLA_ERR;
    *hash = gguf_index_hash(g);
    gguf_close(g);
    return MLA_OK;
}

static int cpu_load(engine **out, const char *path, int rank, int world, coll *c, const engine_boot *boot,
                    int n_threads, mla_err *err) {
    (void)rank, (void)world, (void)boot; /* the host collective needs no id */
    engine *e = mla_xcalloc(1, sizeof *e);
    e->c = c;
    if (gguf_open(&e->g, path, err)) {
        free(e);
        return MLA_ERR;
    }
    mla_model_opts opts = {.n_threads = n_threads};
    if (mla_model_load(&e->m, e->g, c, &opts, err)) {
        gguf_close(e->g);
        free(e);
        return MLA_ERR;
    }
    const mla_config *cf = mla_model_config(e->m);
    e->n_ctx = cf->ctx_train > 0 && cf->ctx_train < 8192 ? cf->ctx_train : 8192;
    const char *env = getenv("MLA_N_CTX");
    if (env && atoll(env) > 0) e->n_ctx = atoll(env);
    *out = e;
    return MLA_OK;
}

static uint32_t cpu_vocab(const engine *e) { return (uint32_t)mla_model_config(e->m)->n_vocab; }

static mla_state *get_state(engine *e, uint64_t id) {
    for (size_t i = 0; i < e->n; i++)
        if (e->seqs[i].id == id) return e->seqs[i].st;
    if (e->n == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 8;
        e->seqs = mla_xrealloc(e->seqs, e->cap * sizeof *e->seqs);
    }
    e->seqs[e->n].id = id;
    e->seqs[e->n].st = mla_state_new(e->m, e->n_ctx);
    return e->seqs[e->n++].st;
}

static int cpu_step(engine *e, const wire_step_plan *p, float *const *logits, mla_err *err) {
    for (uint32_t i = 0; i < p->n_seqs; i++) {
        const wire_seq *s = &p->seqs[i];
        mla_state *st = get_state(e, s->seq_id);
        int64_t pos0 = s->positions[0], past = mla_state_n_past(st);
        if (pos0 < past) mla_state_truncate(st, pos0);
        else if (pos0 > past)
            return mla_errf(err, "seq %llu: starts at position %lld but its cache holds %lld tokens",
                            (unsigned long long)s->seq_id, (long long)pos0, (long long)past);
        if (pos0 + (int64_t)s->n_tokens > e->n_ctx)
            return mla_errf(err, "seq %llu: %lld tokens exceed the context of %lld",
                            (unsigned long long)s->seq_id, (long long)(pos0 + s->n_tokens),
                            (long long)e->n_ctx);
        enum mla_logits_mode mode = s->sp.logits == WIRE_LOGITS_ALL ? MLA_LOGITS_ALL
                                    : (s->sample || s->sp.logits == WIRE_LOGITS_LAST) ? MLA_LOGITS_LAST
                                                                                     : MLA_LOGITS_NONE;
        if (mla_model_forward(e->m, st, s->tokens, s->n_tokens, pos0, mode, logits[i], err))
            return mla_err_prefix(err, "seq %llu", (unsigned long long)s->seq_id);
    }
    return MLA_OK;
}

static void cpu_free_seq(engine *e, uint64_t id) {
    for (size_t i = 0; i < e->n; i++)
        if (e->seqs[i].id == id) {
            mla_state_free(e->seqs[i].st);
            e->seqs[i] = e->seqs[--e->n];
            return;
        }
}

static int cpu_bench_fill(engine *e, uint64_t id, uint32_t n_past, mla_err *err) {
    if ((int64_t)n_past > e->n_ctx)
        return mla_errf(err, "%u positions exceed the context of %lld (MLA_N_CTX)", n_past, (long long)e->n_ctx);
    return mla_state_bench_fill(get_state(e, id), n_past, err);
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
    for (size_t i = 0; i < e->n; i++) mla_state_free(e->seqs[i].st);
    free(e->seqs);
    mla_model_free(e->m);
    gguf_close(e->g);
    free(e);
}

const engine_ops engine_cpu_ops = {"cpu", cpu_model_hash, cpu_load, cpu_vocab, cpu_step, cpu_free_seq,
                                   cpu_destroy, cpu_bench_fill, cpu_bench_coll, NULL, NULL, NULL, NULL};
