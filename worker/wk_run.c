#include "wk_run.h"
#include "curve.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "coll_host.h"
#include "common/buildinfo.h"
#include "common/fdlink.h"
#include "common/loadprog.h"
#include "common/opts.h"
#include "common/steptrace.h"
#include "mla_log.h"
#include "sample.h"
#include "wire.h"
#include "wk_ahead.h"
#include "wk_constrain.h"
#include "zspin.h"

#define WK_REFUSED (-3)
#define WK_HELP 1 /* wk_parse_args: --help was asked for */

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- argument parsing ------------------------------------------------------------------- */

static const char wk_usage[] =
    "usage: mlaserve-worker --coord ENDPOINT --rank R --world T -m MODEL.gguf [options]\n"
    "One tensor-parallel rank: registers with the coordinator, loads its shard, runs the steps.\n"
    "`mlaserve serve|generate|bench` start their workers themselves; start one by hand for\n"
    "--workers-external (workers on other hosts).\n";

/* the option table over cfg (strings point into argv) */
static size_t wk_specs(wk_config *cfg, int *proto, opt_spec *s) {
    const opt_spec t[] = {
        {.name = "--coord", .kind = OPT_STR, .arg = "ENDPOINT", .help = "the coordinator (tcp://HOST:PORT or ipc://PATH)",
         .dest = &cfg->coord_endpoint},
        {.name = "--rank", .kind = OPT_INT, .arg = "R", .help = "this worker's rank, 0..T-1", .dest = &cfg->rank, .lo = 0,
         .hi = WIRE_MAX_WORLD - 1},
        {.name = "--world", .kind = OPT_INT, .arg = "T", .help = "tensor-parallel degree (the coordinator's --tp)",
         .dest = &cfg->world, .lo = 1, .hi = WIRE_MAX_WORLD},
        {.name = "--model", .alias = "-m", .kind = OPT_STR, .arg = "PATH",
         .help = "the GGUF file (a split model: its first part), the coordinator's", .dest = &cfg->model_path},
        {.name = "--backend", .kind = OPT_STR, .arg = "cpu|cuda", .def = "$MLA_BACKEND, else cuda where a GPU is visible",
         .help = "what this worker computes on", .dest = &cfg->backend},
        {.name = "--threads", .kind = OPT_INT, .arg = "N", .def = "1", .help = "CPU threads", .dest = &cfg->n_threads,
         .lo = 1, .hi = 1024},
        {.name = "--device", .kind = OPT_STR, .arg = "NAME", .def = "the backend's device",
         .help = "device name reported at registration", .dest = &cfg->device},
        {.name = "--curve-dir", .kind = OPT_STR, .arg = "DIR", .def = "none",
         .help = "CURVE keys (server.pub, client.key) from `mlaserve keygen`", .dest = &cfg->curve_dir},
        {.name = "--curve-client-key", .kind = OPT_STR, .arg = "FILE", .def = "DIR/client.key",
         .help = "another client key file", .dest = &cfg->curve_client_key},
        {.name = "--link-fd", .kind = OPT_INT, .arg = "FD", .def = "none",
         .help = "the local link the coordinator made (set by the coordinator)", .dest = &cfg->link_fd, .lo = 1,
         .hi = 1 << 20},
        {.name = "--protocol-version", .kind = OPT_INT, .arg = "V", .def = "this build's",
         .help = "protocol version to claim (tests of refusals)", .dest = proto, .lo = 1, .hi = 1 << 30},
        MLA_LOG_LEVEL_OPT,
    };
    memcpy(s, t, sizeof t);
    return sizeof t / sizeof *t;
}

int wk_parse_args(int argc, char **argv, wk_config *cfg, mla_err *err) {
    const engine_ops *eng = cfg->engine;
    memset(cfg, 0, sizeof *cfg);
    cfg->engine = eng;
    cfg->rank = -1;
    cfg->world = -1;
    cfg->n_threads = 1;
    int proto = 0;
    opt_spec specs[16];
    const opt_table tab = {"options", specs, wk_specs(cfg, &proto, specs)};
    int help = 0;
    if (opts_parse(&tab, 1, argc, argv, 1, 0, NULL, 0, NULL, NULL, &help, err)) return MLA_ERR;
    if (help) return WK_HELP;
    cfg->protocol_version = (uint32_t)proto;
    if (!cfg->coord_endpoint || cfg->rank < 0 || cfg->world < 1 || !cfg->model_path)
        return mla_errf(err, "need --coord ENDPOINT --rank R --world T -m MODEL");
    if (cfg->rank >= cfg->world) return mla_errf(err, "--rank %d is not below --world %d", cfg->rank, cfg->world);
    if (cfg->curve_client_key && !cfg->curve_dir)
        return mla_errf(err, "--curve-client-key needs --curve-dir (for server.pub)");
    return MLA_OK;
}

/* ---- shared state between the two threads ------------------------------------------------ */

typedef struct wk {
    const wk_config *cfg;
    void *zctx;
    char pair_ep[64];
    coll *coll;
    _Atomic uint32_t n_vocab;
    _Atomic int compute_failed;
    char compute_err[sizeof(((mla_err *)0)->msg)];
    /* the NCCL id relayed by the coordinator (Control NCCL_ID), for engine_boot.wait_id: set by
     * the I/O thread, waited for by the compute thread; id_quit: the I/O thread is leaving */
    pthread_mutex_t id_mu;
    pthread_cond_t id_cv;
    uint8_t nccl_id[WIRE_MAX_NCCL_ID];
    int id_known, id_quit;
    /* the compute thread's logits rows, kept from step to step (a fresh half-megabyte row per
     * sequence and step cost page faults), and its per-sequence greedy flags and tokens */
    float *rows_buf;
    size_t rows_cap;
    bool *greedy;
    int32_t *gtok;
    /* the step ahead (worker/wk_ahead.h): ahead[cur] is the one held, run or (queued) in the
     * engine; the other is the one queued behind it (chained) while a plan is matched. Its
     * scratch: a plan's rows it answered (hit), the indices of the others (ridx), their greedy
     * flags and tokens (rgreedy, rtok) */
    wk_ahead ahead[2];
    wk_ahead_mode_t ahead_mode;
    int cur;
    bool queued, chained;
    bool *rgreedy;
    int32_t *rtok, *hit;
    uint32_t *ridx;
    uint32_t flags_cap;
    long spin_us; /* zspin_default(the engine): how long both threads poll before they sleep */
    wire_kv_opts kv;  /* the cache pool settings from the coordinator's reply */
    _Atomic uint32_t kv_blocks; /* the pool's blocks once loaded: what block ids are checked against */
    /* for the heartbeat's stats (written by the compute thread, read by the I/O thread) */
    _Atomic uint64_t st_steps, st_step_ns, mem_free, mem_total;
    int64_t mem_at; /* compute thread: ms of the last mem_info */
} wk;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* compute thread: the device's memory, at most once a second */
static void poll_mem(wk *w, engine *eng) {
    if (!w->cfg->engine->mem_info) return;
    int64_t t = now_ms();
    if (w->mem_at && t - w->mem_at < 1000) return;
    w->mem_at = t;
    uint64_t f = 0, tot = 0;
    if (w->cfg->engine->mem_info(eng, &f, &tot) == MLA_OK && f <= tot) {
        atomic_store(&w->mem_free, f);
        atomic_store(&w->mem_total, tot);
    }
}

static int send_msg(void *sock, const wire_msg *m, mla_err *err) {
    uint8_t *buf;
    size_t n;
    if (wire_encode(m, &buf, &n, err)) return MLA_ERR;
    int rc = zmq_send(sock, buf, n, 0);
    free(buf);
    if (rc < 0) return mla_errf(err, "zmq send: %s", zmq_strerror(zmq_errno()));
    return MLA_OK;
}

static wire_msg control_msg(wire_control_kind kind, int rank, int32_t status, uint32_t n_vocab, uint64_t step_id,
                            const char *message) {
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_CONTROL;
    m.u.ctl.kind = kind;
    m.u.ctl.rank = (uint32_t)rank;
    m.u.ctl.status = status;
    m.u.ctl.n_vocab = n_vocab;
    m.u.ctl.step_id = step_id;
    if (message) { /* cut to fit, as snprintf would (without its truncation warning once inlined) */
        size_t k = strnlen(message, sizeof m.u.ctl.message - 1);
        memcpy(m.u.ctl.message, message, k);
        m.u.ctl.message[k] = '\0';
    }
    return m;
}

static void send_control(void *sock, wire_control_kind kind, int rank, int32_t status, uint32_t n_vocab,
                         uint64_t step_id, const char *message) {
    wire_msg m = control_msg(kind, rank, status, n_vocab, step_id, message);
    mla_err err;
    if (send_msg(sock, &m, &err)) MLA_WARN("%s", err.msg);
}

/* ---- compute thread ---------------------------------------------------------------------- */

typedef struct seq_hist {
    uint64_t id;
    int32_t *tok;
    size_t n, cap;
} seq_hist;

typedef struct hist_tab {
    seq_hist *v;
    size_t n, cap;
} hist_tab;

static seq_hist *hist_get(hist_tab *t, uint64_t id) {
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i].id == id) return &t->v[i];
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 16;
        t->v = mla_xrealloc(t->v, t->cap * sizeof *t->v);
    }
    seq_hist *h = &t->v[t->n++];
    memset(h, 0, sizeof *h);
    h->id = id;
    return h;
}

static void hist_drop(hist_tab *t, uint64_t id) {
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i].id == id) {
            free(t->v[i].tok);
            t->v[i] = t->v[--t->n];
            return;
        }
}

static void hist_append(seq_hist *h, const wire_seq *s) {
    if (s->positions[0] == 0) h->n = 0; /* a sequence starting over */
    if (h->n + s->n_tokens > h->cap) {
        h->cap = (h->n + s->n_tokens) * 2;
        h->tok = mla_xrealloc(h->tok, h->cap * sizeof *h->tok);
    }
    memcpy(h->tok + h->n, s->tokens, s->n_tokens * sizeof *h->tok);
    h->n += s->n_tokens;
}

/* Waits for the queued step ahead (when there is one) and keeps its tokens for the next plan. */
static void ahead_collect(wk *w, engine *eng) {
    if (!w->queued) return;
    w->queued = false;
    mla_err err;
    wk_ahead *a = &w->ahead[w->cur];
    if (w->cfg->engine->wait_queued(eng, w->rtok, &err)) {
        MLA_WARN("the step ahead failed (the next plan runs in full): %s", err.msg);
        wk_ahead_done(a, NULL);
        return;
    }
    wk_ahead_done(a, w->rtok);
}

/* Runs the engine on plan p's rows that the step ahead did not answer (all of them without one):
 * w->gtok[i] = the token row i took on the device (from the step ahead, or now), -1 where the
 * engine wrote logits into rows[i] instead. When p asks for exactly the queued step ahead, the
 * step after it is queued first, from the tokens on the device (w->chained). */
static int run_rows(wk *w, engine *eng, const wire_step_plan *p, float **rows, mla_err *err) {
    const engine_ops *ops = w->cfg->engine;
    w->chained = false;
    if (!ops->step_greedy) return ops->step(eng, p, (float *const *)rows, err);
    wk_ahead *a = &w->ahead[w->cur], *next = &w->ahead[w->cur ^ 1];
    if (w->queued && wk_ahead_covers(a, p) && wk_ahead_build(next, p, NULL)) {
        mla_err qerr;
        w->chained = ops->queue(eng, &next->plan, true, &qerr) == MLA_OK;
        if (!w->chained) {
            MLA_INFO("step %llu: the step after the step ahead was not queued: %s", (unsigned long long)p->step_id,
                     qerr.msg);
            wk_ahead_clear(next);
        }
    }
    ahead_collect(w, eng);
    wire_step_plan rest = *p;
    uint32_t nhit = 0;
    if (a->plan.n_seqs) nhit = wk_ahead_match(a, p, w->hit, &rest, w->ridx);
    if (w->chained && rest.n_seqs > 0) { /* the step ahead failed: drop the one queued behind it */
        w->queued = true;
        w->cur ^= 1;
        ahead_collect(w, eng);
        wk_ahead_clear(&w->ahead[w->cur]);
        w->chained = false;
    } else if (w->chained) {
        w->cur ^= 1;
        w->queued = true;
    }
    if (nhit == 0) return ops->step_greedy(eng, p, (float *const *)rows, w->greedy, w->gtok, err);
    for (uint32_t i = 0; i < p->n_seqs; i++) w->gtok[i] = w->hit[i];
    if (w->chained) wk_ahead_set_tokens(&w->ahead[w->cur], w->gtok); /* its inputs: this step's tokens */
    if (rest.n_seqs == 0) return MLA_OK;
    /* the residual rows, compacted: their logits rows, greedy flags and tokens */
    float **rrows = mla_xmalloc(rest.n_seqs * sizeof *rrows);
    for (uint32_t k = 0; k < rest.n_seqs; k++) {
        rrows[k] = rows[w->ridx[k]];
        w->rgreedy[k] = w->greedy[w->ridx[k]];
    }
    int rc = ops->step_greedy(eng, &rest, (float *const *)rrows, w->rgreedy, w->rtok, err);
    for (uint32_t k = 0; rc == MLA_OK && k < rest.n_seqs; k++) w->gtok[w->ridx[k]] = w->rtok[k];
    free(rrows);
    return rc;
}

/* After plan p (its result sent): the step that follows from its device tokens, queued in the
 * engine or run now (worker/wk_ahead.h), unless run_rows already queued it. The logits rows of p
 * are big enough for it (one row a sequence, as p had). */
static void run_ahead(wk *w, engine *eng, const wire_step_plan *p, float **rows) {
    if (w->ahead_mode == WK_AHEAD_OFF || w->chained) return;
    wk_ahead *a = &w->ahead[w->cur];
    if (!wk_ahead_build(a, p, w->gtok)) return;
    mla_err err;
    if (w->ahead_mode == WK_AHEAD_QUEUE) {
        if (w->cfg->engine->queue(eng, &a->plan, false, &err) == MLA_OK) {
            w->queued = true;
            return;
        }
    } else {
        for (uint32_t i = 0; i < a->plan.n_seqs; i++) w->rgreedy[i] = true;
        if (w->cfg->engine->step_greedy(eng, &a->plan, (float *const *)rows, w->rgreedy, w->rtok, &err) == MLA_OK) {
            wk_ahead_done(a, w->rtok);
            return;
        }
    }
    MLA_INFO("the step ahead of step %llu failed (the next plan runs in full): %s", (unsigned long long)p->step_id,
             err.msg);
    wk_ahead_done(a, NULL);
}

static void run_plan(wk *w, engine *eng, sampler *smp, wk_constrain *cons, hist_tab *hist, void *pair,
                     const wire_step_plan *p) {
    const int rank = w->cfg->rank;
    steptrace_mark(p->step_id, 'D');
    const uint32_t V = atomic_load(&w->n_vocab);
    const char *delay = getenv("MLA_WORKER_STEP_DELAY_MS"); /* fault injection (tests) */
    if (delay && atoi(delay) > 0) usleep((useconds_t)atoi(delay) * 1000);
    float **rows = mla_xcalloc(p->n_seqs, sizeof *rows);
    size_t need = 0;
    for (uint32_t i = 0; i < p->n_seqs; i++) need += (size_t)engine_logit_rows(&p->seqs[i]) * V;
    if (need > w->rows_cap) {
        free(w->rows_buf);
        w->rows_cap = need + need / 4;
        w->rows_buf = mla_xmalloc(w->rows_cap * sizeof(float));
    }
    if (p->n_seqs > w->flags_cap) {
        w->flags_cap = p->n_seqs * 2;
        w->greedy = mla_xrealloc(w->greedy, w->flags_cap * sizeof *w->greedy);
        w->rgreedy = mla_xrealloc(w->rgreedy, w->flags_cap * sizeof *w->rgreedy);
        w->gtok = mla_xrealloc(w->gtok, w->flags_cap * sizeof *w->gtok);
        w->rtok = mla_xrealloc(w->rtok, w->flags_cap * sizeof *w->rtok);
        w->hit = mla_xrealloc(w->hit, w->flags_cap * sizeof *w->hit);
        w->ridx = mla_xrealloc(w->ridx, w->flags_cap * sizeof *w->ridx);
    }
    for (uint32_t i = 0, off = 0; i < p->n_seqs; i++) {
        rows[i] = w->rows_buf + (size_t)off * V;
        off += engine_logit_rows(&p->seqs[i]);
        w->greedy[i] = wk_ahead_greedy_row(&p->seqs[i]);
        w->gtok[i] = -1;
    }
    mla_err err;
    const int64_t t0 = now_ns();
    /* the plan's table updates first: also those of rows a step ahead answered */
    int rc = w->cfg->engine->set_tables(eng, p, &err);
    if (rc == MLA_OK) rc = run_rows(w, eng, p, rows, &err);
    atomic_fetch_add(&w->st_step_ns, (uint64_t)(now_ns() - t0));
    atomic_fetch_add(&w->st_steps, 1);
    poll_mem(w, eng);
    wire_msg m;
    memset(&m, 0, sizeof m);
    if (rc) {
        wk_ahead_clear(&w->ahead[w->cur]);
        MLA_ERROR("step %llu failed: %s", (unsigned long long)p->step_id, err.msg);
        if (rank == 0) {
            m.kind = WIRE_STEP_RESULT;
            m.u.result.step_id = p->step_id;
            m.u.result.ok = false;
            snprintf(m.u.result.error, sizeof m.u.result.error, "rank 0: %.480s", err.msg);
            if (send_msg(pair, &m, &err)) MLA_WARN("%s", err.msg);
        } else {
            send_control(pair, WIRE_CTL_ERROR, rank, 1, 0, p->step_id, err.msg);
        }
    } else if (rank == 0) {
        char cerr[420] = "";
        wire_seq_result *sr = mla_xcalloc(p->n_seqs, sizeof *sr);
        for (uint32_t i = 0; i < p->n_seqs; i++) {
            const wire_seq *s = &p->seqs[i];
            seq_hist *h = hist_get(hist, s->seq_id);
            hist_append(h, s);
            uint32_t nrow = engine_logit_rows(s);
            const float *last = rows[i] + (size_t)(nrow - 1) * V;
            sr[i].seq_id = s->seq_id;
            sr[i].token = -1;
            if (s->sample && w->gtok[i] >= 0) { /* taken on the device: greedy, no logprobs */
                sr[i].token = w->gtok[i];
                sr[i].logprob = 0;
                sr[i].n_top = 0;
            }
            sample_mod mod = {0};
            if (s->sp.constrained && wk_constrain_row(cons, s, &mod, &err)) {
                /* cannot be served (the coordinator checked the grammar): the step reports it */
                MLA_ERROR("step %llu: %s", (unsigned long long)p->step_id, err.msg);
                if (!cerr[0]) snprintf(cerr, sizeof cerr, "%.400s", err.msg);
                continue;
            }
            if (s->sample && w->gtok[i] >= 0) {
                /* taken on the device above */
            } else if (s->sample) {
                sample_out so;
                sampler_sample_mod(smp, last, &s->sp, &mod, h->tok, h->n,
                                   (uint64_t)s->positions[s->n_tokens - 1] + 1, &so);
                sr[i].token = so.token;
                sr[i].logprob = so.logprob;
                sr[i].n_top = so.n_top;
                memcpy(sr[i].top, so.top, sizeof so.top);
            }
            if (s->sp.logits != WIRE_LOGITS_NONE) {
                sr[i].n_logit_rows = nrow;
                sr[i].n_vocab = V;
                sr[i].logits = rows[i];
            }
        }
        m.kind = WIRE_STEP_RESULT;
        m.u.result.step_id = p->step_id;
        m.u.result.ok = !cerr[0];
        if (cerr[0]) snprintf(m.u.result.error, sizeof m.u.result.error, "rank 0: %s", cerr);
        m.u.result.n_seqs = p->n_seqs;
        m.u.result.seqs = sr;
        steptrace_mark(p->step_id, 'E');
        if (send_msg(pair, &m, &err)) {
            /* e.g. too large a frame: report instead of going silent */
            memset(&m, 0, sizeof m);
            m.kind = WIRE_STEP_RESULT;
            m.u.result.step_id = p->step_id;
            snprintf(m.u.result.error, sizeof m.u.result.error, "rank 0: %.480s", err.msg);
            mla_err e2;
            if (send_msg(pair, &m, &e2)) MLA_WARN("%s", e2.msg);
        }
        free(sr);
    }
    if (rc == MLA_OK) run_ahead(w, eng, p, rows);
    free(rows);
}

/* A Bench request (`mlaserve bench`): through the engine's bench hooks, in order with the steps;
 * every rank answers with a BenchResult (an engine without the hook answers with an error). */
static void run_bench(wk *w, engine *eng, hist_tab *hist, void *pair, const wire_bench *b) {
    const engine_ops *ops = w->cfg->engine;
    const int rank = w->cfg->rank;
    mla_err err = {{0}};
    int rc = MLA_OK;
    double sec = 0;
    if (b->op == WIRE_BENCH_FILL) {
        if (!ops->bench_fill) {
            rc = mla_errf(&err, "the %s engine has no bench_fill hook: it cannot fill sequences for `mlaserve bench`",
                          ops->name ? ops->name : "?");
        }
        for (uint32_t i = 0; rc == MLA_OK && i < b->n_seq_ids; i++) {
            hist_drop(hist, b->seq_ids[i]); /* synthetic context: no tokens for the penalties */
            if (ops->bench_fill(eng, b->seq_ids[i], b->n_past, b->blocks + (size_t)i * b->blocks_per_seq,
                                b->blocks_per_seq, &err))
                rc = mla_err_prefix(&err, "bench fill of seq %llu to %u positions", (unsigned long long)b->seq_ids[i],
                                    b->n_past);
        }
    } else if (!ops->bench_coll) {
        rc = mla_errf(&err, "the %s engine has no bench_coll hook: it cannot time all-reduces for `mlaserve bench`",
                      ops->name ? ops->name : "?");
    } else if (ops->bench_coll(eng, (size_t)b->n_floats, (int)b->iters, &sec, &err)) {
        rc = mla_err_prefix(&err, "bench all-reduce of %llu floats", (unsigned long long)b->n_floats);
    } else if (!(sec >= 0 && sec <= 1e6)) {
        rc = mla_errf(&err, "bench all-reduce: the engine reports %g seconds per operation", sec);
    }
    if (rc) MLA_ERROR("bench request %llu failed: %s", (unsigned long long)b->bench_id, err.msg);
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_BENCH_RESULT;
    m.u.bench_result.bench_id = b->bench_id;
    m.u.bench_result.rank = (uint32_t)rank;
    m.u.bench_result.ok = rc == MLA_OK;
    m.u.bench_result.sec_per_op = rc == MLA_OK ? sec : 0;
    if (rc) {
        snprintf(m.u.bench_result.error, sizeof m.u.bench_result.error, "%.500s", err.msg);
        for (char *p = m.u.bench_result.error; *p; p++) /* wire_decode refuses control characters */
            if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = ' ';
    }
    if (send_msg(pair, &m, &err)) MLA_WARN("%s", err.msg);
}

/* ---- engine_boot (worker/engine.h): the NCCL id through the coordinator ---------------------- */

typedef struct wk_boot {
    wk *w;
    void *pair; /* the compute thread's end of the inproc pair */
} wk_boot;

static int boot_publish(void *ctx, const uint8_t *id, size_t len, mla_err *err) {
    wk_boot *b = ctx;
    if (len != WIRE_MAX_NCCL_ID) return mla_errf(err, "an NCCL id of %zu bytes (need %u)", len, (unsigned)WIRE_MAX_NCCL_ID);
    if (b->w->cfg->rank != 0) return mla_errf(err, "rank %d cannot publish the NCCL id (rank 0 does)", b->w->cfg->rank);
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_CONTROL;
    m.u.ctl.kind = WIRE_CTL_NCCL_ID;
    m.u.ctl.rank = 0;
    memcpy(m.u.ctl.nccl_id, id, len);
    m.u.ctl.nccl_id_len = (uint32_t)len;
    return send_msg(b->pair, &m, err); /* the I/O thread forwards it to the coordinator */
}

static int boot_wait(void *ctx, uint8_t *id, size_t len, mla_err *err) {
    wk *w = ((wk_boot *)ctx)->w;
    if (len != WIRE_MAX_NCCL_ID) return mla_errf(err, "an NCCL id of %zu bytes (need %u)", len, (unsigned)WIRE_MAX_NCCL_ID);
    const char *env = getenv("MLA_NCCL_ID_TIMEOUT_MS");
    long timeout_ms = env && atol(env) > 0 ? atol(env) : 120000;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    int rc = 0;
    pthread_mutex_lock(&w->id_mu);
    while (!w->id_known && !w->id_quit && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&w->id_cv, &w->id_mu, &dl);
    int known = w->id_known, quit = w->id_quit;
    if (known) memcpy(id, w->nccl_id, len);
    pthread_mutex_unlock(&w->id_mu);
    if (known) return MLA_OK;
    if (quit) return mla_errf(err, "the worker is stopping while it waits for rank 0's NCCL id");
    return mla_errf(err, "no NCCL id from rank 0 through the coordinator within %ld ms (rank 0 not started, "
                         "failed, or not using NCCL? MLA_NCCL_ID_TIMEOUT_MS sets the wait)", timeout_ms);
}

static void *compute_main(void *arg) {
    wk *w = arg;
    const wk_config *cfg = w->cfg;
    void *pair = zmq_socket(w->zctx, ZMQ_PAIR);
    int linger = 0;
    zmq_setsockopt(pair, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(pair, w->pair_ep) != 0) MLA_PANIC("inproc connect: %s", zmq_strerror(zmq_errno()));
    engine *eng = NULL;
    mla_err err;
    wk_boot bctx = {w, pair};
    const engine_boot boot = {&bctx, boot_publish, boot_wait};
    const engine_opts eo = {.n_threads = cfg->n_threads, .kv = w->kv};
    if (cfg->engine->load(&eng, cfg->model_path, cfg->rank, cfg->world, w->coll, &boot, &eo, &err)) {
        snprintf(w->compute_err, sizeof w->compute_err, "loading %.200s: %.700s", cfg->model_path, err.msg);
        atomic_store(&w->compute_failed, 1);
        send_control(pair, WIRE_CTL_LOADED, cfg->rank, 1, 0, 0, w->compute_err);
        zmq_send(pair, "X", 1, 0);
        zmq_close(pair);
        return NULL;
    }
    uint32_t V = cfg->engine->n_vocab(eng);
    loadprog_state lst;
    loadprog_get(&lst);
    if (lst.total) {
        char d[160];
        loadprog_describe(&lst, d, sizeof d);
        MLA_INFO("loaded: %s in %.1f s", d, lst.seconds);
    }
    poll_mem(w, eng);
    atomic_store(&w->n_vocab, V);
    engine_kv_pool kp;
    cfg->engine->kv_pool(eng, &kp);
    atomic_store(&w->kv_blocks, kp.n_blocks);
    {
        wire_msg lm = control_msg(WIRE_CTL_LOADED, cfg->rank, 0, V, 0, NULL);
        lm.u.ctl.kv_blocks = kp.n_blocks;
        lm.u.ctl.kv_block_size = kp.block_size;
        lm.u.ctl.kv_block_bytes = kp.block_bytes;
        if (send_msg(pair, &lm, &err)) MLA_WARN("%s", err.msg);
    }
    sampler *smp = cfg->rank == 0 ? sampler_new(V) : NULL;
    wk_constrain *cons = cfg->rank == 0 ? wk_constrain_new(cfg->model_path, V) : NULL;
    hist_tab hist = {0};
    for (;;) {
        wire_msg *m = NULL;
        zmq_pollitem_t it = {pair, 0, ZMQ_POLLIN, 0};
        zspin_poll(&it, 1, -1, w->spin_us); /* the next step of a decode loop comes quickly */
        int n = zmq_recv(pair, &m, sizeof m, 0);
        if (n != (int)sizeof m) {
            if (n < 0 && zmq_errno() == EINTR) continue;
            break;
        }
        if (!m) break; /* quit */
        if (m->kind == WIRE_STEP_PLAN) {
            run_plan(w, eng, smp, cons, &hist, pair, &m->u.plan);
        } else if (m->kind == WIRE_BENCH) {
            ahead_collect(w, eng);
            wk_ahead_clear(&w->ahead[w->cur]); /* a fill rewrites caches */
            run_bench(w, eng, &hist, pair, &m->u.bench);
        } else if (m->kind == WIRE_CONTROL && m->u.ctl.kind == WIRE_CTL_FREE_SEQ) {
            ahead_collect(w, eng); /* nothing queued may use a cache that goes */
            for (uint32_t i = 0; i < m->u.ctl.n_seq_ids; i++) {
                cfg->engine->free_seq(eng, m->u.ctl.seq_ids[i]);
                wk_ahead_drop(&w->ahead[w->cur], m->u.ctl.seq_ids[i]);
                hist_drop(&hist, m->u.ctl.seq_ids[i]);
                if (cons) wk_constrain_drop(cons, m->u.ctl.seq_ids[i]);
            }
        }
        wire_msg_free(m);
        free(m);
    }
    ahead_collect(w, eng);
    if (w->ahead_mode != WK_AHEAD_OFF)
        MLA_INFO("step ahead: %llu rows run ahead, %llu of them taken by a plan",
                 (unsigned long long)(w->ahead[0].rows_run + w->ahead[1].rows_run),
                 (unsigned long long)(w->ahead[0].rows_used + w->ahead[1].rows_used));
    for (size_t i = 0; i < hist.n; i++) free(hist.v[i].tok);
    free(hist.v);
    sampler_free(smp);
    wk_constrain_free(cons);
    cfg->engine->destroy(eng);
    zmq_close(pair);
    return NULL;
}

/* ---- I/O thread --------------------------------------------------------------------------- */

/* Makes the DEALER a CURVE client with the keys from cfg. */
static int setup_curve(const wk_config *cfg, void *dealer, mla_err *err) {
    if (!zmq_has("curve")) return mla_errf(err, "--curve-dir: this libzmq was built without CURVE support");
    char path[PATH_MAX + 32], server_pub[41], secret[41], pub[41];
    snprintf(path, sizeof path, "%s/server.pub", cfg->curve_dir);
    if (curve_read_z85_key(path, server_pub, err)) return MLA_ERR;
    if (cfg->curve_client_key) snprintf(path, sizeof path, "%s", cfg->curve_client_key);
    else snprintf(path, sizeof path, "%s/client.key", cfg->curve_dir);
    if (curve_read_z85_key(path, secret, err)) return MLA_ERR;
    if (zmq_curve_public(pub, secret) != 0) return mla_errf(err, "%s: cannot derive the public key", path);
    if (zmq_setsockopt(dealer, ZMQ_CURVE_SERVERKEY, server_pub, 40) ||
        zmq_setsockopt(dealer, ZMQ_CURVE_PUBLICKEY, pub, 40) || zmq_setsockopt(dealer, ZMQ_CURVE_SECRETKEY, secret, 40))
        return mla_errf(err, "CURVE setup: %s", zmq_strerror(zmq_errno()));
    memset(secret, 0, sizeof secret);
    return MLA_OK;
}

/* A handshake failure reported by the socket monitor: MLA_OK when none (or one that may pass),
 * WK_REFUSED when the coordinator refused our key, MLA_ERR on repeated protocol failures. */
static int check_monitor(void *mon, int *n_proto, mla_err *err) {
    zmq_msg_t a, b;
    zmq_msg_init(&a);
    zmq_msg_init(&b);
    int rc = MLA_OK;
    if (zmq_msg_recv(&a, mon, ZMQ_DONTWAIT) < 0) goto out;
    if (zmq_msg_more(&a)) zmq_msg_recv(&b, mon, 0);
    if (zmq_msg_size(&a) < 6) goto out;
    uint16_t ev;
    uint32_t val;
    memcpy(&ev, zmq_msg_data(&a), 2);
    memcpy(&val, (const uint8_t *)zmq_msg_data(&a) + 2, 4);
    if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
        mla_errf(err, "the coordinator refused this worker's CURVE key (ZAP status %u): is its public key in the "
                      "coordinator's authorized_keys?", val);
        rc = WK_REFUSED;
    } else if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        *n_proto = -1000000; /* connected: later drops are the heartbeat's business */
    } else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
        /* libzmq does not reconnect after a protocol error (a mechanism mismatch, a CURVE message
         * that does not decrypt): waiting would only run into the registration timeout */
        mla_errf(err, "the security handshake with the coordinator failed: %s (ZMTP protocol error 0x%x)",
                 val == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
                     ? "one side uses CURVE and the other does not"
                     : "wrong server.pub, or one side uses CURVE and the other does not",
                 val);
        rc = WK_REFUSED;
    } else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || ev == ZMQ_EVENT_DISCONNECTED) {
        /* the peer closed the connection during the handshake (a CURVE server dropping a plain
         * client, or the other way round): libzmq reconnects, so count the attempts */
        if (ev != ZMQ_EVENT_DISCONNECTED) MLA_WARN("handshake with the coordinator failed (event 0x%x, %u)", ev, val);
        if (++*n_proto >= 3) {
            mla_errf(err, "the security handshake with the coordinator failed %d times (wrong server.pub, or one side "
                          "uses CURVE and the other does not)", *n_proto);
            rc = WK_REFUSED;
        }
    }
out:
    zmq_msg_close(&a);
    zmq_msg_close(&b);
    return rc;
}

static int do_register(const wk_config *cfg, void *dealer, void *mon, wire_register_reply *reply, mla_err *err) {
    uint64_t hash = 0;
    if (cfg->engine->model_hash(cfg->model_path, &hash, err))
        return mla_err_prefix(err, "model %s", cfg->model_path);
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_REGISTER;
    m.u.reg.rank = (uint32_t)cfg->rank;
    m.u.reg.world = (uint32_t)cfg->world;
    m.u.reg.protocol_version = cfg->protocol_version ? cfg->protocol_version : WIRE_VERSION;
    m.u.reg.model_hash = hash;
    m.u.reg.pid = (int32_t)getpid();
    if (gethostname(m.u.reg.host, sizeof m.u.reg.host - 1) != 0) strcpy(m.u.reg.host, "?");
    for (char *p = m.u.reg.host; *p; p++)
        if ((unsigned char)*p < 0x20) *p = '?';
    snprintf(m.u.reg.device, sizeof m.u.reg.device, "%s", cfg->device ? cfg->device : "cpu");
    if (send_msg(dealer, &m, err)) return MLA_ERR;
    int64_t deadline = now_ms() + (cfg->register_timeout_ms > 0 ? cfg->register_timeout_ms : 60000);
    int n_proto = 0;
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return mla_errf(err, "no answer from the coordinator at %s to the registration",
                            cfg->coord_endpoint);
        zmq_pollitem_t it[2] = {{dealer, 0, ZMQ_POLLIN, 0}, {mon, 0, ZMQ_POLLIN, 0}};
        int rc = zmq_poll(it, mon ? 2 : 1, (long)left);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            return mla_errf(err, "zmq poll: %s", zmq_strerror(zmq_errno()));
        }
        if (rc == 0) continue;
        if (mon && (it[1].revents & ZMQ_POLLIN)) {
            int mrc = check_monitor(mon, &n_proto, err);
            if (mrc) return mrc;
        }
        if (!(it[0].revents & ZMQ_POLLIN)) continue;
        zmq_msg_t zm;
        zmq_msg_init(&zm);
        if (zmq_msg_recv(&zm, dealer, 0) < 0) {
            zmq_msg_close(&zm);
            continue;
        }
        wire_msg in;
        mla_err e2;
        int drc = wire_decode(zmq_msg_data(&zm), zmq_msg_size(&zm), NULL, &in, &e2);
        zmq_msg_close(&zm);
        if (drc) {
            MLA_WARN("dropping a malformed frame from the coordinator: %s", e2.msg);
            continue;
        }
        if (in.kind != WIRE_REGISTER_REPLY) {
            wire_msg_free(&in);
            continue;
        }
        *reply = in.u.reply;
        if (!reply->ok) {
            mla_errf(err, "registration refused by the coordinator: %s", reply->reason);
            return WK_REFUSED;
        }
        return MLA_OK;
    }
}

/* ---- the I/O thread's traffic with the coordinator ------------------------------------------- */

typedef struct io_st {
    wk *w;
    void *dealer, *pair;
    fdlink *link;       /* the local link (--link-fd), NULL: the DEALER carries everything */
    int64_t last_rx;    /* when the coordinator was last heard from */
    uint64_t last_plan; /* the last step plan forwarded: what a result from the pair answers (steptrace) */
    int stop;           /* SHUTDOWN received */
} io_st;

/* one encoded frame to the coordinator: over the link when there is one, else the DEALER */
static void up_frame(io_st *io, const void *buf, size_t n) {
    mla_err e;
    if (io->link) {
        if (fdlink_send(io->link, buf, n, &e)) MLA_WARN("send to the coordinator: %s", e.msg);
    } else if (zmq_send(io->dealer, buf, n, 0) < 0) {
        MLA_WARN("send to the coordinator: %s", zmq_strerror(zmq_errno()));
    }
}

static void send_up(io_st *io, const wire_msg *m) {
    uint8_t *buf;
    size_t n;
    mla_err e;
    if (wire_encode(m, &buf, &n, &e)) {
        MLA_WARN("%s", e.msg);
        return;
    }
    up_frame(io, buf, n);
    free(buf);
}

/* Load progress (common/loadprog.h) while the compute thread loads: a LOAD_PROGRESS frame to the
 * coordinator once a second when it moved, a log line every 10 s and one at the end. */
typedef struct load_report {
    int64_t sent_at, logged_at;
    uint64_t sent_done;
} load_report;

static void report_load(io_st *io, int rank, int64_t t, load_report *lr) {
    loadprog_state st;
    loadprog_get(&st);
    if (!st.total) return; /* the load has not begun (self-check, collective setup) */
    if (t - lr->sent_at >= 1000 && (st.done != lr->sent_done || !lr->sent_at)) {
        wire_msg m = control_msg(WIRE_CTL_LOAD_PROGRESS, rank, 0, 0, 0, NULL);
        m.u.ctl.load_done = st.done;
        m.u.ctl.load_total = st.total;
        send_up(io, &m);
        lr->sent_at = t;
        lr->sent_done = st.done;
    }
    if (!lr->logged_at) lr->logged_at = t;
    if (t - lr->logged_at >= 10000) {
        char d[160];
        loadprog_describe(&st, d, sizeof d);
        MLA_INFO("loading: %s", d);
        lr->logged_at = t;
    }
}

/* One frame from the coordinator (DEALER or link): plans, bench requests and FREE_SEQ go to the
 * compute thread in order; the NCCL id is handed to a load waiting for it; SHUTDOWN sets stop. */
static void handle_down(io_st *io, const void *data, size_t len) {
    wk *w = io->w;
    const wk_config *cfg = w->cfg;
    io->last_rx = now_ms();
    wire_limits lim = {.n_vocab = atomic_load(&w->n_vocab), .world = (uint32_t)cfg->world,
                       .max_blocks = atomic_load(&w->kv_blocks)};
    wire_msg *m = mla_xcalloc(1, sizeof *m);
    mla_err e2;
    if (wire_decode(data, len, &lim, m, &e2)) {
        MLA_WARN("dropping a malformed frame from the coordinator: %s", e2.msg);
        free(m);
        return;
    }
    int forward = 0;
    if (m->kind == WIRE_STEP_PLAN) {
        io->last_plan = m->u.plan.step_id;
        steptrace_mark(io->last_plan, 'C');
    }
    if (m->kind == WIRE_STEP_PLAN || m->kind == WIRE_BENCH) forward = 1;
    else if (m->kind == WIRE_CONTROL) {
        if (m->u.ctl.kind == WIRE_CTL_SHUTDOWN) {
            MLA_INFO("shutdown requested by the coordinator");
            io->stop = 1;
        } else if (m->u.ctl.kind == WIRE_CTL_FREE_SEQ) {
            forward = 1;
        } else if (m->u.ctl.kind == WIRE_CTL_NCCL_ID) {
            /* wire_decode checked: exactly WIRE_MAX_NCCL_ID bytes, from rank 0 */
            pthread_mutex_lock(&w->id_mu);
            if (cfg->rank != 0 && !w->id_known) {
                memcpy(w->nccl_id, m->u.ctl.nccl_id, WIRE_MAX_NCCL_ID);
                w->id_known = 1;
                pthread_cond_broadcast(&w->id_cv);
            } else {
                MLA_WARN("dropping an unexpected NCCL id from the coordinator");
            }
            pthread_mutex_unlock(&w->id_mu);
        }
    }
    if (forward && zmq_send(io->pair, &m, sizeof m, 0) == (int)sizeof m) return;
    if (forward) MLA_WARN("inproc send: %s", zmq_strerror(zmq_errno()));
    wire_msg_free(m);
    free(m);
}

/* fdlink_pump's callback: one frame from the link; stop after SHUTDOWN */
static int link_down(void *ctx, const uint8_t *f, size_t n) {
    io_st *io = ctx;
    handle_down(io, f, n);
    return io->stop;
}

int wk_run(const wk_config *cfg, mla_err *err) {
    char tag[32];
    snprintf(tag, sizeof tag, "worker %d", cfg->rank);
    mla_log_set_tag(tag);
    int rc = MLA_OK;
    wk w;
    memset(&w, 0, sizeof w);
    w.cfg = cfg;
    w.spin_us = zspin_default(cfg->engine ? cfg->engine->name : NULL);
    wk_ahead_init(&w.ahead[0]);
    wk_ahead_init(&w.ahead[1]);
    if (cfg->engine)
        w.ahead_mode = wk_ahead_mode(cfg->engine->step_greedy != NULL, cfg->engine->queue && cfg->engine->wait_queued);
    pthread_mutex_init(&w.id_mu, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* boot_wait's deadline */
        pthread_cond_init(&w.id_cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    w.zctx = zmq_ctx_new();
    void *dealer = zmq_socket(w.zctx, ZMQ_DEALER);
    int linger = 200;
    zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof linger);
    int64_t maxmsg = (int64_t)WIRE_MAX_FRAME;
    zmq_setsockopt(dealer, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    /* handshake failures (a refused CURVE key) are seen through a socket monitor during the
     * registration: fail fast with the reason instead of waiting for the timeout */
    void *mon = NULL;
    if (cfg->curve_dir && setup_curve(cfg, dealer, err)) {
        zmq_close(dealer);
        zmq_ctx_term(w.zctx);
        return MLA_ERR;
    }
    {
        char mon_ep[64];
        snprintf(mon_ep, sizeof mon_ep, "inproc://wk-mon-%p", (void *)&w);
        if (zmq_socket_monitor(dealer, mon_ep, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                                   ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                                                   ZMQ_EVENT_DISCONNECTED) == 0) {
            mon = zmq_socket(w.zctx, ZMQ_PAIR);
            zmq_setsockopt(mon, ZMQ_LINGER, &linger, sizeof linger);
            if (zmq_connect(mon, mon_ep) != 0) {
                zmq_close(mon);
                mon = NULL;
            }
        }
    }
    if (zmq_connect(dealer, cfg->coord_endpoint) != 0) {
        rc = mla_errf(err, "cannot connect to %s: %s", cfg->coord_endpoint, zmq_strerror(zmq_errno()));
        if (mon) zmq_close(mon);
        zmq_close(dealer);
        zmq_ctx_term(w.zctx);
        return rc;
    }
    wire_register_reply reply;
    rc = do_register(cfg, dealer, mon, &reply, err);
    if (mon) {
        zmq_socket_monitor(dealer, NULL, 0);
        zmq_close(mon);
    }
    if (rc) {
        zmq_close(dealer);
        zmq_ctx_term(w.zctx);
        return rc;
    }
    MLA_INFO("registered with %s (rank %d of %d%s%s)", cfg->coord_endpoint, cfg->rank, cfg->world,
             cfg->curve_dir ? ", CURVE" : "", cfg->link_fd > 0 ? ", local link" : "");
    w.kv = reply.kv;
    /* the coordinator that started this worker talks over the link from its reply on */
    fdlink *link = NULL;
    if (cfg->link_fd > 0 && !(link = fdlink_new(cfg->link_fd, WIRE_MAX_FRAME, err))) {
        zmq_close(dealer);
        zmq_ctx_term(w.zctx);
        return mla_err_prefix(err, "--link-fd");
    }
    if (reply.coll_shm_name[0]) {
        if (coll_host_attach(&w.coll, reply.coll_shm_name, cfg->rank, cfg->world,
                             (int)reply.coll_timeout_ms, err)) {
            fdlink_free(link);
            zmq_close(dealer);
            zmq_ctx_term(w.zctx);
            return MLA_ERR;
        }
    } else if (cfg->world == 1) {
        w.coll = coll_single_new();
    } else {
        fdlink_free(link);
        zmq_close(dealer);
        zmq_ctx_term(w.zctx);
        return mla_errf(err, "the coordinator gave no collective for world size %d", cfg->world);
    }

    void *pair = zmq_socket(w.zctx, ZMQ_PAIR);
    zmq_setsockopt(pair, ZMQ_LINGER, &linger, sizeof linger);
    snprintf(w.pair_ep, sizeof w.pair_ep, "inproc://wk-compute-%p", (void *)&w);
    if (zmq_bind(pair, w.pair_ep) != 0) MLA_PANIC("inproc bind: %s", zmq_strerror(zmq_errno()));
    pthread_t th;
    if (pthread_create(&th, NULL, compute_main, &w) != 0) MLA_PANIC("pthread_create failed");

    const int hb_ms = (int)reply.heartbeat_ms;
    const int hb_timeout = (int)reply.heartbeat_timeout_ms;
    io_st io = {&w, dealer, pair, link, now_ms(), 0, 0};
    int64_t last_tx = 0;
    load_report load_rep = {0};
    int stop = 0;
    while (!stop) {
        int64_t t = now_ms();
        if (t - last_tx >= hb_ms) {
            wire_msg hb = control_msg(WIRE_CTL_HEARTBEAT, cfg->rank, 0, 0, 0, NULL);
            wire_worker_stats *ws = &hb.u.ctl.stats;
            hb.u.ctl.has_stats = true;
            ws->steps = atomic_load(&w.st_steps);
            ws->step_seconds = (double)atomic_load(&w.st_step_ns) / 1e9;
            coll_host_stats(&ws->allreduces, &ws->allreduce_seconds);
            ws->device_mem_free = atomic_load(&w.mem_free);
            ws->device_mem_total = atomic_load(&w.mem_total);
            send_up(&io, &hb);
            last_tx = t;
        }
        if (!atomic_load(&w.n_vocab) && !atomic_load(&w.compute_failed)) report_load(&io, cfg->rank, t, &load_rep);
        if (t - io.last_rx > hb_timeout) {
            rc = mla_errf(err, "the coordinator stopped answering (nothing for %lld ms); exiting",
                          (long long)(t - io.last_rx));
            coll_host_abort(w.coll, "a worker lost its coordinator");
            break;
        }
        zmq_pollitem_t items[3] = {{dealer, 0, ZMQ_POLLIN, 0}, {pair, 0, ZMQ_POLLIN, 0}, {NULL, -1, 0, 0}};
        if (link)
            items[2] = (zmq_pollitem_t){NULL, fdlink_fd(link), (short)(ZMQ_POLLIN | (fdlink_pending(link) ? ZMQ_POLLOUT : 0)),
                                        0};
        int prc = zspin_poll(items, link ? 3 : 2, hb_ms, w.spin_us);
        if (prc < 0) {
            if (zmq_errno() == EINTR) continue;
            rc = mla_errf(err, "zmq poll: %s", zmq_strerror(zmq_errno()));
            break;
        }
        if (items[1].revents & ZMQ_POLLIN) {
            zmq_msg_t zm;
            zmq_msg_init(&zm);
            if (zmq_msg_recv(&zm, pair, 0) >= 0) {
                if (zmq_msg_size(&zm) == 1 && ((char *)zmq_msg_data(&zm))[0] == 'X') {
                    rc = mla_errf(err, "%s", w.compute_err);
                    stop = 1;
                } else {
                    steptrace_mark(io.last_plan, 'F'); /* the compute thread answers the plans in order */
                    up_frame(&io, zmq_msg_data(&zm), zmq_msg_size(&zm));
                }
            }
            zmq_msg_close(&zm);
        }
        if (stop) break;
        if (link && items[2].revents) {
            mla_err e2;
            if (fdlink_pump(link, (items[2].revents & ZMQ_POLLOUT) != 0, 64, link_down, &io, &e2)) {
                rc = mla_errf(err, "the coordinator's local link: %s; exiting", e2.msg);
                coll_host_abort(w.coll, "a worker lost its coordinator");
                break;
            }
        }
        if (items[0].revents & ZMQ_POLLIN) {
            zmq_msg_t zm;
            zmq_msg_init(&zm);
            if (zmq_msg_recv(&zm, dealer, 0) < 0) {
                zmq_msg_close(&zm);
                continue;
            }
            if (link) MLA_WARN("dropping a ZeroMQ frame from the coordinator (it talks over the local link)");
            else handle_down(&io, zmq_msg_data(&zm), zmq_msg_size(&zm));
            zmq_msg_close(&zm);
        }
        stop = io.stop;
    }

    /* stop the compute thread: it is idle unless a step is running; a step stuck in a collective
     * is released by the abort flag */
    if (rc != MLA_OK && w.coll) coll_host_abort(w.coll, "a worker is exiting");
    pthread_mutex_lock(&w.id_mu);
    w.id_quit = 1; /* a load waiting for the NCCL id gives up */
    pthread_cond_broadcast(&w.id_cv);
    pthread_mutex_unlock(&w.id_mu);
    wire_msg *quit = NULL;
    zmq_send(pair, &quit, sizeof quit, ZMQ_DONTWAIT);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    int joined = pthread_timedjoin_np(th, NULL, &ts) == 0;
    if (!joined) {
        MLA_WARN("the compute thread did not stop; leaving without cleanup");
        return rc;
    }
    /* what is still queued for the coordinator (an error report) gets up to a second */
    for (int i = 0; link && fdlink_pending(link) && i < 100; i++) {
        struct pollfd p = {fdlink_fd(link), POLLOUT, 0};
        mla_err e2;
        if (poll(&p, 1, 10) < 0 || ((p.revents & POLLOUT) && fdlink_flush(link, &e2))) break;
    }
    fdlink_free(link);
    zmq_close(pair);
    zmq_close(dealer);
    zmq_ctx_term(w.zctx);
    coll_free(w.coll);
    free(w.rows_buf);
    free(w.greedy);
    free(w.gtok);
    free(w.rgreedy);
    free(w.rtok);
    free(w.hit);
    free(w.ridx);
    wk_ahead_free(&w.ahead[0]);
    wk_ahead_free(&w.ahead[1]);
    pthread_cond_destroy(&w.id_cv);
    pthread_mutex_destroy(&w.id_mu);
    return rc;
}

int wk_main(int argc, char **argv, wk_pick_engine pick) {
    if (argc == 2 && !strcmp(argv[1], "--version")) {
        buildinfo_print(stdout, "mlaserve-worker");
        return 0;
    }
    wk_config cfg = {0};
    mla_err err;
    int prc = wk_parse_args(argc, argv, &cfg, &err);
    if (prc == WK_HELP) {
        int proto = 0;
        opt_spec specs[16];
        const opt_table tab = {"options", specs, wk_specs(&cfg, &proto, specs)};
        opts_help(stdout, wk_usage, &tab, 1);
        return 0;
    }
    if (prc) {
        fprintf(stderr, "%s: %s (--help lists the options)\n", argv[0], err.msg);
        return 2;
    }
    cfg.engine = pick(cfg.backend, &err);
    if (!cfg.engine) {
        fprintf(stderr, "%s: %s\n", argv[0], err.msg);
        return 2;
    }
    if (!cfg.device) cfg.device = cfg.engine->name;
    int rc = wk_run(&cfg, &err);
    if (rc == MLA_OK) return 0;
    mla_log_set_tag("worker");
    fprintf(stderr, "mlaserve-worker (rank %d): %s\n", cfg.rank, err.msg);
    return rc == WK_REFUSED ? 3 : 1;
}
