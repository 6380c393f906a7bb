/* mlaserve bench: see cmd_bench.h. The workers are started through coord_group_start, as by
 * `mlaserve generate` and `logits --processes`; the steps are plain coord_step calls. */
#include "cmd_bench.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/gguf.h"
#include "common/mla_err.h"
#include "common/mla_log.h"
#include "common/opts.h"
#include "common/outfile.h"
#include "common/model_config.h"
#include "common/shard_plan.h"
#include "coord.h"
#ifdef MLA_HAVE_CUDA
#include "kernels/cuda_ops.h"
#endif

#define BENCH_MAX_LIST 64

typedef struct int_list {
    long v[BENCH_MAX_LIST];
    int n;
} int_list;

typedef struct bench_opts {
    coord_group_opts g;
    int_list tp, prefill, batch, ctx;
    long steps, warmup, repeat, coll_iters;
    uint64_t seed;
    double bw_gbs, tflops; /* 0: not given */
    const char *json, *md;
    int verbose;
} bench_opts;

/* One table row. NAN: not applicable (printed "-", JSON null). */
typedef struct bench_row {
    int tp;
    int decode;
    long batch, prompt, ctx;
    long runs;                    /* prefill repeats, or timed decode steps */
    double ms_best, ms_mean;      /* time to first token, or step time */
    double tok_s, tok_s_seq;
    double ar_us, ar_ms, ar_frac; /* one all-reduce; all-reduces of a step; share of the step */
    double scaling;
    double mb_rank, gbs, bw_frac; /* decode: MB touched per step per rank, achieved GB/s, roofline */
    double tflops, flops_frac;    /* prefill */
} bench_row;

typedef struct row_vec {
    bench_row *v;
    size_t n, cap;
} row_vec;

/* What a step touches, from the GGUF tensors and the tensor-parallel plan of rank 0 (the rank
 * that holds the most: replicated FFNs that rank 0 alone computes). Layers past n_layer (MTP)
 * are not run and not counted. */
typedef struct model_cost {
    double nonexp_bytes_rank; /* every non-expert weight but token_embd, rank 0's share */
    double embd_row_bytes;    /* one row of token_embd (a step reads one per token) */
    double expert_bytes;      /* one routed expert's gate + up + down, summed over the MoE layers */
    double nonexp_params;     /* every non-expert weight but token_embd (shared experts included) */
    double expert_params;     /* one routed expert, summed over the MoE layers */
    int kv_bytes;             /* bytes a latent cache element: 2 (the CUDA backend's fp16 cache) or 4 */
} model_cost;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- options ------------------------------------------------------------------------------ */

static int parse_long(const char *v, long lo, long hi, long *out, mla_err *err) {
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < lo || n > hi) return mla_errf(err, "'%s' is not an integer in [%ld, %ld]", v, lo, hi);
    *out = n;
    return MLA_OK;
}

/* a list option's destination and bounds (an opts callback's ctx) */
typedef struct list_opt {
    int_list *out;
    long lo, hi;
    int allow_none;
} list_opt;

/* "1,8,32" (or "none" where allowed: the phase is skipped) */
static int parse_list(void *ctx, const char *v, mla_err *err) {
    const list_opt *lo = ctx;
    int_list *out = lo->out;
    out->n = 0;
    if (lo->allow_none && !strcmp(v, "none")) return MLA_OK;
    const char *p = v;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        if (len == 0 || len >= sizeof item)
            return mla_errf(err, "'%s' is not a comma-separated list of integers in [%ld, %ld]%s", v, lo->lo, lo->hi,
                            lo->allow_none ? " (or none)" : "");
        if (out->n == BENCH_MAX_LIST) return mla_errf(err, "more than %d values", BENCH_MAX_LIST);
        memcpy(item, p, len);
        item[len] = '\0';
        if (parse_long(item, lo->lo, lo->hi, &out->v[out->n], err)) return MLA_ERR;
        out->n++;
        if (!comma) return MLA_OK;
        p = comma + 1;
    }
}

static int parse_pos_double(void *ctx, const char *v, mla_err *err) {
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(d) || d <= 0) return mla_errf(err, "'%s' is not a positive number", v);
    *(double *)ctx = d;
    return MLA_OK;
}

typedef struct env_list {
    const char *v[BENCH_MAX_LIST];
    int n;
} env_list;

static int add_env(void *ctx, const char *v, mla_err *err) {
    env_list *e = ctx;
    const char *eq = strchr(v, '=');
    if (!eq || eq == v) return mla_errf(err, "'%s' is not NAME=VALUE", v);
    if (e->n == BENCH_MAX_LIST) return mla_errf(err, "more than %d", BENCH_MAX_LIST);
    e->v[e->n++] = v;
    return MLA_OK;
}

static const char usage_text[] =
    "usage: mlaserve bench -m MODEL.gguf [--tp LIST] [--prefill LIST|none] [--batch LIST|none] [--ctx LIST] [options]\n"
    "Throughput of the serving stack: prefill (time to first token), decode at a batch and context, and the\n"
    "all-reduce cost. LIST: comma-separated integers, e.g. --tp 1,2,4 --prefill 512,4096 --batch 1,8,32,128.\n";

/* ---- model cost ----------------------------------------------------------------------------- */

static int model_cost_for(model_cost *mc, const gguf_ctx *g, const mla_config *cf, int tp, mla_err *err) {
    memset(mc, 0, sizeof *mc);
    shard_plan p;
    if (shard_plan_for_model(&p, g, cf, 0, tp, err)) return MLA_ERR;
    for (size_t i = 0; i < p.n_entries; i++) {
        const shard_entry *e = &p.entries[i];
        if (e->layer >= cf->n_layer) continue;
        const gguf_tensor *t = gguf_find_tensor(g, e->name);
        if (!t) continue;
        switch (e->role) {
        case ROLE_EMBD: mc->embd_row_bytes = t->ne[1] > 0 ? (double)t->nbytes / (double)t->ne[1] : 0; break;
        case ROLE_EXP_GATE:
        case ROLE_EXP_UP:
        case ROLE_EXP_DOWN:
            if (cf->n_expert > 0) {
                mc->expert_bytes += (double)t->nbytes / (double)cf->n_expert;
                mc->expert_params += (double)t->n_elems / (double)cf->n_expert;
            }
            break;
        default:
            mc->nonexp_bytes_rank += (double)e->bytes_rank;
            mc->nonexp_params += (double)t->n_elems;
            break;
        }
    }
    shard_plan_free(&p);
    return MLA_OK;
}

/* expected distinct experts of one MoE layer that a batch of b tokens routes to */
static double experts_touched(const mla_config *cf, long b) {
    if (cf->n_expert <= 0) return 0;
    double x = (double)cf->n_expert, k = (double)cf->n_expert_used;
    return x * (1.0 - pow(1.0 - k / x, (double)b));
}

/* bytes one rank touches in a decode step of b sequences at context ctx */
static double decode_bytes_rank(const model_cost *mc, const mla_config *cf, int tp, long b, long ctx) {
    /* a cache row: the latent + rope elements, then the indexer key's floats */
    double kv_row = (double)(cf->kv_lora_rank + cf->n_rope) * mc->kv_bytes +
                    (cf->idx_n_head > 0 ? (double)cf->idx_head_dim * 4.0 : 0);
    return mc->nonexp_bytes_rank + (double)b * mc->embd_row_bytes +
           experts_touched(cf, b) / tp * mc->expert_bytes + (double)b * (double)ctx * (double)cf->n_layer * kv_row;
}

/* ---- measurements ------------------------------------------------------------------------- */

typedef struct run_ctx {
    const bench_opts *o;
    const mla_config *cf;
    model_cost mc;
    coord *c;
    int tp;
    uint32_t n_vocab;
    uint64_t next_seq, next_step;
} run_ctx;

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void synth_tokens(int32_t *tok, long n, uint32_t n_vocab, uint64_t seed) {
    uint64_t s = seed;
    for (long i = 0; i < n; i++) tok[i] = (int32_t)(splitmix(&s) % n_vocab);
}

static wire_sampling greedy(void) {
    wire_sampling sp;
    memset(&sp, 0, sizeof sp);
    sp.top_p = 1;
    sp.repetition_penalty = 1;
    sp.logits = WIRE_LOGITS_NONE;
    return sp;
}

/* one step; checks that every sequence came back with a token; *sec (sec not NULL) its time from
 * send to result */
static int timed_step(run_ctx *x, wire_seq *seqs, uint32_t n, int32_t *next, double *sec, mla_err *err) {
    wire_step_plan plan = {.step_id = ++x->next_step, .n_seqs = n, .seqs = seqs};
    wire_step_result res;
    double t0 = now_s();
    if (coord_step(x->c, &plan, &res, err)) return MLA_ERR;
    if (sec) *sec = now_s() - t0;
    int rc = MLA_OK;
    if (res.n_seqs != n) rc = mla_errf(err, "step %llu: %u results for %u sequences", (unsigned long long)plan.step_id,
                                       res.n_seqs, n);
    for (uint32_t i = 0; rc == MLA_OK && i < n; i++) {
        if (res.seqs[i].seq_id != seqs[i].seq_id || res.seqs[i].token < 0 || (uint32_t)res.seqs[i].token >= x->n_vocab)
            rc = mla_errf(err, "step %llu: result %u is seq %llu token %d (expected seq %llu and a token)",
                          (unsigned long long)plan.step_id, i, (unsigned long long)res.seqs[i].seq_id,
                          res.seqs[i].token, (unsigned long long)seqs[i].seq_id);
        else if (next)
            next[i] = res.seqs[i].token;
    }
    coord_result_free(&res);
    return rc;
}

/* one prefill of p tokens (a fresh sequence, freed afterwards) */
static int prefill_once(run_ctx *x, long p, const int32_t *tok, const int32_t *pos, double *sec, mla_err *err) {
    uint64_t id = x->next_seq++;
    uint32_t *tab = mla_xmalloc(((size_t)coord_table_len(x->c, (uint32_t)p) + 1) * sizeof *tab), ntab = 0;
    if (coord_slot_table(x->c, 0, 1, (uint32_t)p, tab, &ntab, err)) {
        free(tab);
        return MLA_ERR;
    }
    wire_seq s = {.seq_id = id, .n_tokens = (uint32_t)p, .tokens = (int32_t *)tok, .positions = (int32_t *)pos,
                  .sample = true, .sp = greedy(), .n_blocks = ntab, .blocks = tab};
    int rc = timed_step(x, &s, 1, NULL, sec, err);
    free(tab);
    mla_err e2;
    if (coord_free_seqs(x->c, &id, 1, rc == MLA_OK ? err : &e2) && rc == MLA_OK) rc = MLA_ERR;
    return rc;
}

static int run_prefill(run_ctx *x, long p, int warm, bench_row *row, mla_err *err) {
    const bench_opts *o = x->o;
    int32_t *tok = mla_xmalloc((size_t)p * sizeof *tok), *pos = mla_xmalloc((size_t)p * sizeof *pos);
    synth_tokens(tok, p, x->n_vocab, o->seed ^ ((uint64_t)p * 0x9e3779b97f4a7c15ull));
    for (long i = 0; i < p; i++) pos[i] = (int32_t)i;
    double best = INFINITY, sum = 0, sec = 0;
    int rc = MLA_OK;
    if (warm) rc = prefill_once(x, p, tok, pos, &sec, err); /* untimed: first touch of the weights */
    for (long r = 0; rc == MLA_OK && r < o->repeat; r++) {
        rc = prefill_once(x, p, tok, pos, &sec, err);
        if (rc == MLA_OK) {
            best = sec < best ? sec : best;
            sum += sec;
        }
    }
    free(tok);
    free(pos);
    if (rc) return MLA_ERR;
    const double mean = sum / (double)o->repeat;
    row->runs = o->repeat;
    row->ms_best = best * 1e3;
    row->ms_mean = mean * 1e3;
    row->tok_s = (double)p / best;
    const double flops = 2.0 * (double)p * (x->mc.nonexp_params + (double)x->cf->n_expert_used * x->mc.expert_params) / best;
    row->tflops = flops / 1e12;
    row->flops_frac = o->tflops > 0 ? flops / ((double)x->tp * o->tflops * 1e12) : NAN;
    return MLA_OK;
}

static int run_decode(run_ctx *x, long b, long ctx, bench_row *row, mla_err *err) {
    const bench_opts *o = x->o;
    uint64_t *ids = mla_xmalloc((size_t)b * sizeof *ids);
    int32_t *tok = mla_xmalloc((size_t)b * sizeof *tok), *pos = mla_xmalloc((size_t)b * sizeof *pos);
    wire_seq *seqs = mla_xcalloc((size_t)b, sizeof *seqs);
    for (long i = 0; i < b; i++) ids[i] = x->next_seq++;
    synth_tokens(tok, b, x->n_vocab, o->seed ^ ((uint64_t)(b * 131 + ctx) * 0xbf58476d1ce4e5b9ull));
    double total = 0, best = INFINITY;
    const uint32_t cover = (uint32_t)(ctx + o->warmup + o->steps + 1);
    int rc = coord_bench_fill(x->c, ids, (uint32_t)b, (uint32_t)ctx, cover, err);
    if (rc) mla_err_prefix(err, "filling %ld sequences to %ld positions", b, ctx);
    /* a step's time is from the result before to its own (the first: from its plan): what a
     * client waits between tokens, whatever the workers do between plans (worker/wk_ahead.h) */
    double t_prev = now_s();
    for (long s = 0; rc == MLA_OK && s < o->warmup + o->steps; s++) {
        for (long i = 0; i < b; i++) {
            pos[i] = (int32_t)(ctx + s);
            seqs[i] = (wire_seq){.seq_id = ids[i], .n_tokens = 1, .tokens = &tok[i], .positions = &pos[i],
                                 .sample = true, .sp = greedy(), .block_start = coord_table_len(x->c, cover)};
        }
        rc = timed_step(x, seqs, (uint32_t)b, tok, NULL, err);
        const double t = now_s(), sec = t - t_prev;
        t_prev = t;
        if (rc) mla_err_prefix(err, "decode step at position %ld", ctx + s);
        else if (s >= o->warmup) {
            total += sec;
            best = sec < best ? sec : best;
        }
    }
    mla_err e2;
    if (coord_free_seqs(x->c, ids, (uint32_t)b, rc == MLA_OK ? err : &e2) && rc == MLA_OK) rc = MLA_ERR;
    double ar = NAN;
    if (rc == MLA_OK && x->tp > 1) {
        size_t n = (size_t)b * (size_t)x->cf->n_embd;
        rc = coord_bench_coll(x->c, n, (int)o->coll_iters, &ar, err);
        if (rc) mla_err_prefix(err, "timing all-reduces of %zu floats", n);
    }
    free(ids);
    free(tok);
    free(pos);
    free(seqs);
    if (rc) return MLA_ERR;
    const double step = total / (double)o->steps;
    row->runs = o->steps;
    row->ms_best = best * 1e3;
    row->ms_mean = step * 1e3;
    row->tok_s = (double)b * (double)o->steps / total;
    row->tok_s_seq = (double)o->steps / total;
    if (x->tp > 1) {
        const double per_step = 2.0 * (double)x->cf->n_layer * ar;
        row->ar_us = ar * 1e6;
        row->ar_ms = per_step * 1e3;
        row->ar_frac = per_step / step;
    }
    const double bytes = decode_bytes_rank(&x->mc, x->cf, x->tp, b, ctx);
    row->mb_rank = bytes / 1e6;
    row->gbs = bytes / step / 1e9;
    row->bw_frac = o->bw_gbs > 0 ? bytes / (o->bw_gbs * 1e9) / step : NAN;
    return MLA_OK;
}

static bench_row new_row(int tp, int decode, long batch, long prompt, long ctx) {
    bench_row r = {.tp = tp, .decode = decode, .batch = batch, .prompt = prompt, .ctx = ctx};
    r.ms_best = r.ms_mean = r.tok_s = r.tok_s_seq = NAN;
    r.ar_us = r.ar_ms = r.ar_frac = r.scaling = NAN;
    r.mb_rank = r.gbs = r.bw_frac = r.tflops = r.flops_frac = NAN;
    return r;
}

static void push_row(row_vec *rv, const bench_row *r) {
    if (rv->n == rv->cap) {
        rv->cap = rv->cap ? 2 * rv->cap : 16;
        rv->v = mla_xrealloc(rv->v, rv->cap * sizeof *rv->v);
    }
    rv->v[rv->n++] = *r;
}

/* Every point of one TP size on a fresh group. On failure *where says which point. */
static int run_tp(const bench_opts *o, const gguf_ctx *g, const mla_config *cf, int tp, int kv_bytes, row_vec *rv,
                  char *where, size_t where_len, mla_err *err) {
    run_ctx x = {.o = o, .cf = cf, .tp = tp, .next_seq = 1};
    snprintf(where, where_len, "tp %d", tp);
    if (model_cost_for(&x.mc, g, cf, tp, err)) return MLA_ERR;
    x.mc.kv_bytes = kv_bytes;
    coord_group_opts go = o->g;
    go.tp = tp;
    fprintf(stderr, "mlaserve bench: tp %d: starting %d worker%s\n", tp, tp, tp > 1 ? "s" : "");
    if (coord_group_start(&go, g, &x.c, err)) return MLA_ERR;
    x.n_vocab = coord_n_vocab(x.c);
    int rc = MLA_OK;
    for (int i = 0; rc == MLA_OK && i < o->prefill.n; i++) {
        long p = o->prefill.v[i];
        snprintf(where, where_len, "tp %d: prefill %ld", tp, p);
        fprintf(stderr, "mlaserve bench: %s\n", where);
        bench_row r = new_row(tp, 0, 1, p, 0);
        rc = run_prefill(&x, p, i == 0 && o->warmup > 0, &r, err);
        if (rc == MLA_OK) push_row(rv, &r);
    }
    for (int j = 0; rc == MLA_OK && j < o->ctx.n; j++)
        for (int i = 0; rc == MLA_OK && i < o->batch.n; i++) {
            long b = o->batch.v[i], ctx = o->ctx.v[j];
            snprintf(where, where_len, "tp %d: decode batch %ld ctx %ld", tp, b, ctx);
            fprintf(stderr, "mlaserve bench: %s\n", where);
            bench_row r = new_row(tp, 1, b, 0, ctx);
            rc = run_decode(&x, b, ctx, &r, err);
            if (rc == MLA_OK) push_row(rv, &r);
        }
    coord_stop(x.c);
    return rc;
}

/* throughput(TP N) / (N * throughput(TP 1)) for the same point, when TP 1 was measured */
static void fill_scaling(row_vec *rv) {
    for (size_t i = 0; i < rv->n; i++) {
        bench_row *r = &rv->v[i];
        for (size_t k = 0; k < rv->n; k++) {
            const bench_row *b = &rv->v[k];
            if (b->tp == 1 && b->decode == r->decode && b->batch == r->batch && b->prompt == r->prompt &&
                b->ctx == r->ctx && b->tok_s > 0)
                r->scaling = r->tok_s / ((double)r->tp * b->tok_s);
        }
    }
}

/* ---- output ---------------------------------------------------------------------------------- */

typedef struct bench_info {
    char date[64], host[256], family[512], backend[32];
    double file_gib;
    int kv_bytes; /* model_cost.kv_bytes */
} bench_info;

static void fmt_num(char *buf, size_t n, double v) {
    if (isnan(v)) snprintf(buf, n, "-");
    else if (fabs(v) >= 1000) snprintf(buf, n, "%.0f", v);
    else if (fabs(v) >= 100) snprintf(buf, n, "%.1f", v);
    else if (fabs(v) >= 1) snprintf(buf, n, "%.2f", v);
    else snprintf(buf, n, "%.3g", v);
}

static void fmt_pct(char *buf, size_t n, double v) {
    if (isnan(v)) snprintf(buf, n, "-");
    else snprintf(buf, n, "%.1f%%", 100.0 * v);
}

static void list_str(char *buf, size_t n, const int_list *l) {
    size_t off = 0;
    buf[0] = '\0';
    if (l->n == 0) snprintf(buf, n, "none");
    for (int i = 0; i < l->n && off < n; i++) off += (size_t)snprintf(buf + off, n - off, "%s%ld", i ? "," : "", l->v[i]);
}

static void print_md(FILE *f, const bench_opts *o, const bench_info *in, const row_vec *rv, const char *error) {
    char tps[512], pf[512], bs[512], cs[512];
    list_str(tps, sizeof tps, &o->tp);
    list_str(pf, sizeof pf, &o->prefill);
    list_str(bs, sizeof bs, &o->batch);
    list_str(cs, sizeof cs, &o->ctx);
    fprintf(f, "# mlaserve bench\n\n");
    fprintf(f, "- model: %s (%.2f GiB)\n", o->g.model, in->file_gib);
    fprintf(f, "- family: %s\n", in->family);
    fprintf(f, "- backend: %s, %d thread%s per worker; latent cache %s\n", in->backend, o->g.threads,
            o->g.threads > 1 ? "s" : "", in->kv_bytes == 2 ? "fp16" : "fp32");
    fprintf(f, "- tp: %s\n", tps);
    fprintf(f, "- points: prefill %s (%ld repeats); decode batch %s at ctx %s (%ld warm-up + %ld timed steps)\n", pf,
            o->repeat, bs, cs, o->warmup, o->steps);
    if (o->bw_gbs > 0 || o->tflops > 0) {
        fprintf(f, "- limits per rank:");
        if (o->bw_gbs > 0) fprintf(f, " %g GB/s", o->bw_gbs);
        if (o->tflops > 0) fprintf(f, "%s %g TFLOP/s", o->bw_gbs > 0 ? "," : "", o->tflops);
        fprintf(f, "\n");
    }
    fprintf(f, "- date: %s\n", in->date);
    fprintf(f, "- host: %s\n\n", in->host);
    fprintf(f, "| tp | phase | batch | prompt | ctx | ms best | ms mean | tok/s | tok/s/seq | allreduce ms/step | "
               "allreduce %% | scaling | MB/step/rank | GB/s | bw %% | TFLOP/s | compute %% |\n");
    fprintf(f, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < rv->n; i++) {
        const bench_row *r = &rv->v[i];
        char c[12][32];
        fmt_num(c[0], sizeof c[0], r->ms_best);
        fmt_num(c[1], sizeof c[1], r->ms_mean);
        fmt_num(c[2], sizeof c[2], r->tok_s);
        fmt_num(c[3], sizeof c[3], r->tok_s_seq);
        fmt_num(c[4], sizeof c[4], r->ar_ms);
        fmt_pct(c[5], sizeof c[5], r->ar_frac);
        fmt_pct(c[6], sizeof c[6], r->scaling);
        fmt_num(c[7], sizeof c[7], r->mb_rank);
        fmt_num(c[8], sizeof c[8], r->gbs);
        fmt_pct(c[9], sizeof c[9], r->bw_frac);
        fmt_num(c[10], sizeof c[10], r->tflops);
        fmt_pct(c[11], sizeof c[11], r->flops_frac);
        char prompt[24] = "-", ctx[24] = "-";
        if (!r->decode) snprintf(prompt, sizeof prompt, "%ld", r->prompt);
        else snprintf(ctx, sizeof ctx, "%ld", r->ctx);
        fprintf(f, "| %d | %s | %ld | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r->tp,
                r->decode ? "decode" : "prefill", r->batch, prompt, ctx, c[0], c[1], c[2], c[3], c[4], c[5], c[6],
                c[7], c[8], c[9], c[10], c[11]);
    }
    fprintf(f, "\n- prefill: ms = time to first token of one sequence (best, mean of the repeats); tok/s = prompt / "
               "best; TFLOP/s = 2 x prompt x active parameters / best; compute %% = that / (tp x --tflops)\n"
               "- decode: ms = step time, from one step's result to the next (best, mean of the timed steps; with "
               "the step ahead results arrive unevenly around the device's pace, so the mean is the step); "
               "tok/s = batch x steps / their time; "
               "allreduce = 2 x layers x one all-reduce of batch x n_embd floats (slowest rank), and its share of the "
               "mean step; MB/step/rank = weights read (rank 0's shard; expected distinct experts / tp) + KV cache "
               "read; GB/s = MB / mean step; bw %% = (MB / --bw-gbs) / mean step\n"
               "- scaling = tok/s / (tp x tok/s of TP 1 at the same point)\n");
    if (error) fprintf(f, "\nERROR (the run stopped here): %s\n", error);
}

static void json_num(cJSON *o, const char *k, double v) {
    if (isnan(v) || isinf(v)) cJSON_AddNullToObject(o, k);
    else cJSON_AddNumberToObject(o, k, v);
}

static void json_list(cJSON *o, const char *k, const int_list *l) {
    cJSON *a = cJSON_AddArrayToObject(o, k);
    for (int i = 0; i < l->n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)l->v[i]));
}

static char *make_json(const bench_opts *o, const bench_info *in, const mla_config *cf, const row_vec *rv,
                       const char *error) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", o->g.model);
    cJSON_AddNumberToObject(root, "model_gib", in->file_gib);
    cJSON_AddStringToObject(root, "family", cf->arch_name);
    cJSON *sh = cJSON_AddObjectToObject(root, "shapes");
#define NUM(k, v) cJSON_AddNumberToObject(sh, k, (double)(v))
    NUM("n_layer", cf->n_layer);
    NUM("n_embd", cf->n_embd);
    NUM("n_vocab", cf->n_vocab);
    NUM("n_head", cf->n_head);
    NUM("q_lora_rank", cf->q_lora_rank);
    NUM("kv_lora_rank", cf->kv_lora_rank);
    NUM("head_nope", cf->head_nope);
    NUM("head_rope", cf->n_rope);
    NUM("head_v", cf->head_v);
    NUM("n_ff", cf->n_ff);
    NUM("n_ff_exp", cf->n_ff_exp);
    NUM("n_expert", cf->n_expert);
    NUM("n_expert_used", cf->n_expert_used);
    NUM("n_expert_shared", cf->n_expert_shared);
    NUM("n_leading_dense", cf->n_dense_lead);
    NUM("indexer_n_head", cf->idx_n_head);
    NUM("indexer_head_dim", cf->idx_head_dim);
    NUM("indexer_top_k", cf->idx_top_k);
#undef NUM
    cJSON_AddStringToObject(root, "backend", in->backend);
    cJSON_AddStringToObject(root, "kv_cache", in->kv_bytes == 2 ? "f16" : "f32");
    cJSON_AddNumberToObject(root, "threads", o->g.threads);
    json_list(root, "tp", &o->tp);
    json_list(root, "prefill", &o->prefill);
    json_list(root, "batch", &o->batch);
    json_list(root, "ctx", &o->ctx);
    cJSON_AddNumberToObject(root, "repeat", (double)o->repeat);
    cJSON_AddNumberToObject(root, "warmup", (double)o->warmup);
    cJSON_AddNumberToObject(root, "steps", (double)o->steps);
    cJSON_AddNumberToObject(root, "coll_iters", (double)o->coll_iters);
    cJSON_AddNumberToObject(root, "seed", (double)o->seed);
    json_num(root, "bw_gbs", o->bw_gbs > 0 ? o->bw_gbs : NAN);
    json_num(root, "tflops", o->tflops > 0 ? o->tflops : NAN);
    cJSON_AddStringToObject(root, "date", in->date);
    cJSON_AddStringToObject(root, "host", in->host);
    cJSON *rows = cJSON_AddArrayToObject(root, "rows");
    for (size_t i = 0; i < rv->n; i++) {
        const bench_row *r = &rv->v[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "tp", r->tp);
        cJSON_AddStringToObject(j, "phase", r->decode ? "decode" : "prefill");
        cJSON_AddNumberToObject(j, "batch", (double)r->batch);
        json_num(j, "prompt", r->decode ? NAN : (double)r->prompt);
        json_num(j, "ctx", r->decode ? (double)r->ctx : NAN);
        cJSON_AddNumberToObject(j, "runs", (double)r->runs);
        json_num(j, "ms_best", r->ms_best);
        json_num(j, "ms_mean", r->ms_mean);
        json_num(j, "tok_s", r->tok_s);
        json_num(j, "tok_s_per_seq", r->tok_s_seq);
        json_num(j, "allreduce_us_per_op", r->ar_us);
        json_num(j, "allreduce_ms_per_step", r->ar_ms);
        json_num(j, "allreduce_frac", r->ar_frac);
        json_num(j, "scaling", r->scaling);
        json_num(j, "mb_per_step_rank", r->mb_rank);
        json_num(j, "gb_s", r->gbs);
        json_num(j, "bw_frac", r->bw_frac);
        json_num(j, "tflops", r->tflops);
        json_num(j, "flops_frac", r->flops_frac);
        cJSON_AddItemToArray(rows, j);
    }
    if (error) cJSON_AddStringToObject(root, "error", error);
    else cJSON_AddNullToObject(root, "error");
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

/* Whether path can be written (checked before the run, so that a long run's figures are not lost
 * at the end): not a folder, its folder there and writable. MLA_ERR with "PATH: reason". */
/* text into an outfile opened at the start (written whole or not at all) */
static int write_out(outfile *of, const char *text, mla_err *err) {
    if (outfile_write(of, text, strlen(text), err)) {
        outfile_close(of, 0, NULL);
        return MLA_ERR;
    }
    return outfile_close(of, 1, err);
}

/* CUDA devices this process sees (what worker/worker_main.c counts to pick its backend); 0 in a
 * build without CUDA */
static int bench_cuda_devices(void) {
#ifdef MLA_HAVE_CUDA
    return mla_cuda_device_count();
#else
    return 0;
#endif
}

static void make_info(bench_info *in, const bench_opts *o, const gguf_ctx *g, const mla_config *cf) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(in->date, sizeof in->date, "%Y-%m-%d %H:%M:%S UTC", &tm);
    if (gethostname(in->host, sizeof in->host - 1) != 0) snprintf(in->host, sizeof in->host, "?");
    in->host[sizeof in->host - 1] = '\0';
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t hl = strlen(in->host);
    snprintf(in->host + hl, sizeof in->host - hl, " (%ld CPUs)", ncpu);
    uint64_t bytes = 0;
    for (int p = 0; p < gguf_n_parts(g); p++) bytes += gguf_part_size(g, p);
    in->file_gib = (double)bytes / (1024.0 * 1024.0 * 1024.0);
    int n = snprintf(in->family, sizeof in->family,
                     "%s: %lld layers, n_embd %lld, %lld heads (nope %lld + rope %lld, v %lld), q_lora %lld, kv_lora "
                     "%lld, vocab %lld",
                     cf->arch_name, (long long)cf->n_layer, (long long)cf->n_embd, (long long)cf->n_head,
                     (long long)cf->head_nope, (long long)cf->n_rope, (long long)cf->head_v,
                     (long long)cf->q_lora_rank, (long long)cf->kv_lora_rank, (long long)cf->n_vocab);
    if (cf->n_expert > 0 && n > 0 && (size_t)n < sizeof in->family)
        n += snprintf(in->family + n, sizeof in->family - (size_t)n,
                      ", %lld experts (%lld used, %lld shared, width %lld), %lld dense lead layer%s",
                      (long long)cf->n_expert, (long long)cf->n_expert_used, (long long)cf->n_expert_shared,
                      (long long)cf->n_ff_exp, (long long)cf->n_dense_lead, cf->n_dense_lead == 1 ? "" : "s");
    if (cf->idx_n_head > 0 && n > 0 && (size_t)n < sizeof in->family)
        snprintf(in->family + n, sizeof in->family - (size_t)n, ", DSA indexer %lld x %lld top %lld",
                 (long long)cf->idx_n_head, (long long)cf->idx_head_dim, (long long)cf->idx_top_k);
    const char *be = o->g.cc.backend;
    /* not given: what the workers will pick (worker/worker_main.c): cuda where this build has it
     * and a device is visible */
    snprintf(in->backend, sizeof in->backend, "%s", be && *be ? be : bench_cuda_devices() > 0 ? "cuda" : "cpu");
}

/* ---- the command ----------------------------------------------------------------------------- */

int cmd_bench(int argc, char **argv) {
    bench_opts o;
    memset(&o, 0, sizeof o);
    o.g.tp = 1;
    o.g.threads = 1;
    o.tp = (int_list){{1}, 1};
    o.prefill = (int_list){{512}, 1};
    o.batch = (int_list){{1, 8, 32}, 3};
    o.ctx = (int_list){{1024}, 1};
    o.steps = 16;
    o.warmup = 2;
    o.repeat = 3;
    o.coll_iters = 20;
    o.seed = 1234;
    env_list envs = {{0}, 0};
    list_opt l_tp = {&o.tp, 1, WIRE_MAX_WORLD, 0}, l_prefill = {&o.prefill, 1, WIRE_MAX_STEP_TOKENS, 1},
             l_batch = {&o.batch, 1, WIRE_MAX_SEQS, 1}, l_ctx = {&o.ctx, 0, WIRE_MAX_CTX / 2, 0};
    opt_spec g4[COORD_GROUP_N_OPTS], cspecs[COORD_N_OPTS], gspecs[COORD_GROUP_N_OPTS - 1];
    coord_group_opt_specs(&o.g, g4);
    coord_opt_specs(&o.g.cc, cspecs);
    int ng = 0;
    for (int k = 0; k < COORD_GROUP_N_OPTS; k++)
        if (strcmp(g4[k].name, "--tp")) gspecs[ng++] = g4[k]; /* --tp is a list here */
    const opt_spec mine[] = {
        {.name = "--tp", .kind = OPT_FN, .arg = "LIST", .def = "1",
         .help = "tensor-parallel sizes, one after another, fresh workers each", .fn = parse_list, .ctx = &l_tp},
        {.name = "--prefill", .kind = OPT_FN, .arg = "LIST|none", .def = "512",
         .help = "prompt lengths: time to first token of one sequence", .fn = parse_list, .ctx = &l_prefill},
        {.name = "--repeat", .kind = OPT_LONG, .arg = "N", .def = "3", .help = "prefill runs per length: best and mean",
         .dest = &o.repeat, .lo = 1, .hi = 1000000},
        {.name = "--batch", .kind = OPT_FN, .arg = "LIST|none", .def = "1,8,32", .help = "decode batch sizes",
         .fn = parse_list, .ctx = &l_batch},
        {.name = "--ctx", .kind = OPT_FN, .arg = "LIST", .def = "1024",
         .help = "context each decode sequence holds (filled, not prefilled)", .fn = parse_list, .ctx = &l_ctx},
        {.name = "--steps", .kind = OPT_LONG, .arg = "N", .def = "16", .help = "timed decode steps per point",
         .dest = &o.steps, .lo = 1, .hi = 1000000},
        {.name = "--warmup", .kind = OPT_LONG, .arg = "N", .def = "2", .help = "untimed decode steps before them",
         .dest = &o.warmup, .lo = 0, .hi = 1000000},
        {.name = "--coll-iters", .kind = OPT_LONG, .arg = "N", .def = "20",
         .help = "all-reduces timed per decode point when TP > 1", .dest = &o.coll_iters, .lo = 1,
         .hi = WIRE_MAX_BENCH_ITERS},
        {.name = "--seed", .kind = OPT_U64, .arg = "S", .def = "1234", .help = "seed of the synthetic token ids",
         .dest = &o.seed, .lo = 0, .hi = 2147483647.0},
        {.name = "--bw-gbs", .kind = OPT_FN, .arg = "X", .def = "none",
         .help = "one rank's memory bandwidth in GB/s: decode rows show bytes/bandwidth over the step time",
         .fn = parse_pos_double, .ctx = &o.bw_gbs},
        {.name = "--tflops", .kind = OPT_FN, .arg = "X", .def = "none",
         .help = "one rank's compute in TFLOP/s: prefill rows show their fraction of TP x X", .fn = parse_pos_double,
         .ctx = &o.tflops},
        {.name = "--json", .kind = OPT_STR, .arg = "FILE", .def = "none", .help = "the results as JSON (for plots)",
         .dest = &o.json},
        {.name = "--md", .kind = OPT_STR, .arg = "FILE", .def = "none", .help = "the markdown printed on stdout, to a file",
         .dest = &o.md},
        {.name = "--env", .kind = OPT_FN, .arg = "NAME=VALUE", .def = "none",
         .help = "set for the workers (repeatable)", .fn = add_env,
         .ctx = &envs},
        {.name = "--verbose", .alias = "-v", .kind = OPT_FLAG, .help = "log at info (default: warnings only)",
         .dest = &o.verbose},
        MLA_LOG_LEVEL_OPT_WARN,
    };
    const opt_table tabs[] = {{"model and workers", gspecs, (size_t)ng},
                              {"bench", mine, sizeof mine / sizeof *mine},
                              {"control plane", cspecs, COORD_N_OPTS}};
    int st = opts_command("mlaserve bench", usage_text, tabs, 3, argc, argv, NULL, 0, NULL);
    if (st >= 0) return st;
    if (!o.g.model) {
        fprintf(stderr, "mlaserve bench: no model (-m MODEL.gguf; --help lists the options)\n");
        return 2;
    }
    if (o.prefill.n == 0 && o.batch.n == 0) {
        fprintf(stderr, "mlaserve bench: nothing to measure (--prefill none and --batch none)\n");
        return 2;
    }
    long max_ctx = 0, max_p = 0;
    for (int i = 0; i < o.prefill.n; i++) max_p = o.prefill.v[i] > max_p ? o.prefill.v[i] : max_p;
    if (o.batch.n)
        for (int i = 0; i < o.ctx.n; i++) max_ctx = o.ctx.v[i] > max_ctx ? o.ctx.v[i] : max_ctx;
    const long need_ctx = o.batch.n ? max_ctx + o.warmup + o.steps : 0;
    if (need_ctx > (long)WIRE_MAX_CTX) {
        fprintf(stderr, "mlaserve bench: --ctx %ld + %ld warm-up + %ld steps exceed the protocol's context limit %u\n",
                max_ctx, o.warmup, o.steps, WIRE_MAX_CTX);
        return 2;
    }
    /* the outputs opened before the run (a path that cannot take them fails now, not after it);
     * the tables go in at the end, each file whole or not at all */
    outfile ojs = {.fd = -1, .clean = -1}, omd = {.fd = -1, .clean = -1};
    mla_err perr;
    if ((o.json && outfile_open(&ojs, o.json, &perr)) || (o.md && outfile_open(&omd, o.md, &perr))) {
        fprintf(stderr, "mlaserve bench: %s\n", perr.msg);
        if (ojs.path) outfile_close(&ojs, 0, NULL);
        return 1;
    }
    /* the workers follow the level (handed over at registration) */
    if (o.verbose)
        mla_log_level_opt(NULL, "info", NULL);
    else if (!mla_log_level_given()) /* --log-level sets it otherwise */
        mla_log_level_opt(NULL, "warn", NULL);
    for (int i = 0; i < envs.n; i++) {
        const char *eq = strchr(envs.v[i], '=');
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(eq - envs.v[i]), envs.v[i]);
        setenv(name, eq + 1, 1);
    }
    /* the workers' scratch and tables: what the largest point needs */
    long max_b = 1;
    for (int i = 0; i < o.batch.n; i++) max_b = o.batch.v[i] > max_b ? o.batch.v[i] : max_b;
    o.g.cc.kv.max_context = (uint32_t)((need_ctx + 1 > max_p ? need_ctx + 1 : max_p));
    o.g.cc.kv.max_step_tokens = (uint32_t)(max_p > max_b ? max_p : max_b);
    o.g.cc.kv.max_seqs = (uint32_t)(max_b < (long)WIRE_MAX_SEQS ? max_b : (long)WIRE_MAX_SEQS);

    mla_err err = {{0}};
    gguf_ctx *g = NULL;
    mla_config cf;
    int status = 1;
    row_vec rv = {0};
    char where[128] = "", errmsg[sizeof err.msg + 160];
    const char *error = NULL;
    if (gguf_open(&g, o.g.model, &err)) {
        fprintf(stderr, "mlaserve bench: %s\n", err.msg);
        goto done;
    }
    /* every TP size is checked before any worker starts */
    for (int i = 0; i < o.tp.n; i++)
        if (coord_check_model(g, (int)o.tp.v[i], &cf, &err)) {
            fprintf(stderr, "mlaserve bench: %s: --tp %ld: %s\n", o.g.model, o.tp.v[i], err.msg);
            goto done;
        }
    /* positions past the model's context are ones it was never trained for: refused before any
     * worker starts, as generate and serve refuse them */
    if (cf.ctx_train > 0 && max_p + 1 > cf.ctx_train) {
        fprintf(stderr, "mlaserve bench: --prefill %ld and its first token pass the model's context length %lld\n",
                max_p, (long long)cf.ctx_train);
        status = 2;
        goto done;
    }
    if (cf.ctx_train > 0 && need_ctx + 1 > cf.ctx_train) {
        fprintf(stderr, "mlaserve bench: --ctx %ld + %ld warm-up + %ld steps pass the model's context length %lld\n",
                max_ctx, o.warmup, o.steps, (long long)cf.ctx_train);
        status = 2;
        goto done;
    }
    bench_info info;
    make_info(&info, &o, g, &cf);
    /* the latent cache's element type, as the workers will choose it (from --cuda-precision and
     * the same environment, --env included) */
    info.kv_bytes = 4;
    if (!strcmp(info.backend, "cuda")) {
        const int attn_fp32 = mla_cuda_attn_fp32(o.g.cc.cuda_precision == WIRE_PREC_EXACT, &err);
        const int kf = attn_fp32 < 0 ? MLA_ERR
                                     : mla_cuda_kv_f16(cf.kv_lora_rank + cf.n_rope, attn_fp32, &err);
        if (kf < 0) {
            fprintf(stderr, "mlaserve bench: %s\n", err.msg);
            goto done;
        }
        if (kf == 1) info.kv_bytes = 2;
    }
    for (int i = 0; i < o.tp.n && !error; i++) {
        if (run_tp(&o, g, &cf, (int)o.tp.v[i], info.kv_bytes, &rv, where, sizeof where, &err)) {
            snprintf(errmsg, sizeof errmsg, "%s: %s", where, err.msg);
            error = errmsg;
            fprintf(stderr, "mlaserve bench: %s\n", error);
        }
    }
    fill_scaling(&rv);
    status = error ? 1 : 0;
    if (rv.n || !error) {
        print_md(stdout, &o, &info, &rv, error);
        fflush(stdout);
    }
    if (o.md) {
        char *md = NULL;
        size_t md_len = 0;
        FILE *f = open_memstream(&md, &md_len);
        if (!f) MLA_PANIC("out of memory");
        print_md(f, &o, &info, &rv, error);
        fclose(f);
        if (write_out(&omd, md, &err)) {
            fprintf(stderr, "mlaserve bench: %s\n", err.msg);
            status = 1;
        }
        free(md);
    }
    if (o.json) {
        char *js = make_json(&o, &info, &cf, &rv, error);
        if (write_out(&ojs, js, &err)) {
            fprintf(stderr, "mlaserve bench: %s\n", err.msg);
            status = 1;
        }
        cJSON_free(js);
    }
done:
    if (ojs.path) outfile_close(&ojs, 0, NULL); /* not written: the run did not get that far */
    if (omd.path) outfile_close(&omd, 0, NULL);
    free(rv.v);
    if (g) gguf_close(g);
    return status;
}
