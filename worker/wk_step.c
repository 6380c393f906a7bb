/* wk_step: the worker's compute thread (worker/wk_run.h): loads the engine, runs each step plan
 * (and the step ahead, worker/wk_ahead.h), samples on rank 0 and hands the result back to the I/O
 * thread; bench requests take the same path. */
#include "wk_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/loadprog.h"
#include "common/steptrace.h"
#include "mla_log.h"
#include "mla_switch.h"
#include "sample.h"
#include "wk_constrain.h"
#include "zspin.h"

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The positions of row s whose next token's logprob it returns (wire_sampling.prompt_logprobs):
 * every one but its last, and that one too where the plan gives the token after it */
static uint32_t plp_rows(const wire_seq *s) {
    return s->sp.prompt_logprobs && s->sp.logits == WIRE_LOGITS_ALL ? s->n_tokens - 1 + (s->next_token >= 0) : 0;
}

/* Row i's prompt logprobs as scoring jobs (w->jobs from *nj), one a position: the logprob of the
 * next token in that position's logits row, with top_logprobs alternatives, into r->plp */
static void plp_jobs(wk *w, const wire_seq *s, uint32_t i, const float *rows, uint32_t V, wire_seq_result *r,
                     size_t *nj) {
    const uint32_t n = plp_rows(s);
    r->n_plp = n;
    r->plp = n ? mla_xcalloc(n, sizeof *r->plp) : NULL;
    for (uint32_t j = 0; j < n; j++) {
        wk_sample_job *job = &w->jobs[*nj];
        memset(job, 0, sizeof *job);
        job->score = true;
        job->score_token = j + 1 < s->n_tokens ? s->tokens[j + 1] : s->next_token;
        job->logits = rows + (size_t)j * V;
        job->sp = &s->sp;
        w->jrow[*nj] = i;
        w->jpos[(*nj)++] = j;
    }
}

/* compute thread: the decode steps the engine timed itself, for the heartbeat */
static void poll_decode_time(wk *w, engine *eng) {
    if (!w->cfg->engine->decode_time) return;
    uint64_t n = 0;
    double s = 0;
    w->cfg->engine->decode_time(eng, &n, &s);
    atomic_store(&w->st_dsteps, n);
    atomic_store(&w->st_dns, (uint64_t)(s * 1e9));
}

/* compute thread: the device's memory, at most once a second */
static void poll_mem(wk *w, engine *eng) {
    if (!w->cfg->engine->mem_info) return;
    int64_t t = wk_now_ms();
    if (w->mem_at && t - w->mem_at < 1000) return;
    w->mem_at = t;
    uint64_t f = 0, tot = 0;
    if (w->cfg->engine->mem_info(eng, &f, &tot) == MLA_OK && f <= tot) {
        atomic_store(&w->mem_free, f);
        atomic_store(&w->mem_total, tot);
    }
}

int wk_send_msg(void *sock, const wire_msg *m, mla_err *err) {
    uint8_t *buf;
    size_t n;
    if (wire_encode(m, &buf, &n, err)) return MLA_ERR;
    int rc = zmq_send(sock, buf, n, 0);
    free(buf);
    if (rc < 0) return mla_errf(err, "zmq send: %s", zmq_strerror(zmq_errno()));
    return MLA_OK;
}

wire_msg wk_control_msg(wire_control_kind kind, int rank, int32_t status, uint32_t n_vocab, uint64_t step_id,
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
    wire_msg m = wk_control_msg(kind, rank, status, n_vocab, step_id, message);
    mla_err err;
    if (wk_send_msg(sock, &m, &err)) MLA_WARN("%s", err.msg);
}

/* ---- compute thread ---------------------------------------------------------------------- */

/* A sequence's tokens as its plans sent them: tok[i] is at position pos0 + i (pos0 > 0 when its
 * first plan started after cached rows) */
typedef struct seq_hist {
    uint64_t id;
    int32_t *tok;
    size_t n, cap;
    int64_t pos0;
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
    if (!h->n || s->positions[0] != h->pos0 + (int64_t)h->n) { /* a sequence starting (over) */
        h->n = 0;
        h->pos0 = s->positions[0];
    }
    if (h->n + s->n_tokens > h->cap) {
        h->cap = (h->n + s->n_tokens) * 2;
        h->tok = mla_xrealloc(h->tok, h->cap * sizeof *h->tok);
    }
    memcpy(h->tok + h->n, s->tokens, s->n_tokens * sizeof *h->tok);
    h->n += s->n_tokens;
}

/* how many of h's tokens come before the sequence's first generated one (sp->penalty_start) */
static size_t hist_prompt(const seq_hist *h, const wire_sampling *sp) {
    const int64_t k = (int64_t)sp->penalty_start - h->pos0;
    return k <= 0 ? 0 : (size_t)k < h->n ? (size_t)k : h->n;
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

/* How row s takes its token (engine.h engine_drow): on the device where wk_ahead_device_row says
 * so, drawn with the stream of the position it samples. */
static engine_drow drow_of(const wk *w, const wire_seq *s) {
    return (engine_drow){.take = wk_ahead_device_row(s, w->dev), .sp = &s->sp,
                         .stream = (uint64_t)s->positions[s->n_tokens - 1] + 1};
}

/* The masks and biases of the constrained device rows among rows[0, n) (d[k] for rows[k]): the
 * grammar takes each row's tokens and gives the mask of the next (worker/wk_constrain.h; every
 * rank keeps the grammars where the engine samples), copied to w->dmask, which the engine reads
 * during the call. threads: the masks are made on wk_constrain_prepare's threads (only where no
 * plan's prepared rows wait to be handed out: it starts over). A row whose constraint cannot be
 * served is not taken (rank 0's host path reports it); returns false then. */
static bool device_mods(wk *w, wk_constrain *cons, wire_seq *rows, uint32_t n, engine_drow *d, bool threads) {
    const uint32_t V = atomic_load(&w->n_vocab);
    size_t nc = 0, j = 0;
    for (uint32_t k = 0; k < n; k++) nc += d[k].take && rows[k].sp.constrained;
    if (!nc) return true;
    if (nc * V > w->dmask_cap) {
        free(w->dmask);
        w->dmask_cap = nc * V;
        w->dmask = mla_xmalloc(w->dmask_cap);
    }
    if (threads && cons && nc > 1) {
        for (uint32_t k = 0; k < n; k++) w->skip[k] = !(d[k].take && rows[k].sp.constrained);
        wk_constrain_prepare(cons, &(wire_step_plan){.n_seqs = n, .seqs = rows}, w->skip, true);
    }
    bool ok = true;
    for (uint32_t k = 0; k < n; k++) {
        if (!d[k].take || !rows[k].sp.constrained) continue;
        mla_err e = {{0}};
        if (!cons || wk_constrain_row(cons, &rows[k], &d[k].mod, &e)) {
            MLA_INFO("seq %llu: not sampled on the device: %s", (unsigned long long)rows[k].seq_id,
                     cons ? e.msg : "no grammars on this rank");
            d[k].take = false;
            d[k].mod = (sample_mod){0};
            ok = false;
            continue;
        }
        if (d[k].mod.allow) {
            uint8_t *mk = w->dmask + j++ * V;
            memcpy(mk, d[k].mod.allow, V);
            d[k].mod.allow = mk;
        }
    }
    return ok;
}

/* Drops the chained step (queued in run_rows, ahead[cur]): its sampling first where it waits for
 * its masks (its tokens are not used), so that it can be waited for. */
static void drop_chained(wk *w, engine *eng) {
    if (w->later) {
        mla_err qerr;
        if (w->cfg->engine->queue_mods(eng, NULL, &qerr)) MLA_WARN("the dropped step's sampling: %s", qerr.msg);
        w->later = false;
    }
    w->queued = true;
    ahead_collect(w, eng);
    wk_ahead_clear(&w->ahead[w->cur]);
    w->chained = false;
}

/* The sampling of the chained step (ahead[cur], queued) whose constrained rows wait for their
 * masks: these follow from its input tokens (the tokens of the plan just answered), so they are
 * made once the result has gone out, while the device runs the step's forward pass. A mask that
 * cannot be made drops the step. */
static void finish_chained(wk *w, engine *eng, wk_constrain *cons) {
    if (!w->later) return;
    wk_ahead *next = &w->ahead[w->cur];
    const uint32_t n = next->plan.n_seqs;
    bool ok = device_mods(w, cons, next->plan.seqs, n, w->ndrow, true);
    for (uint32_t k = 0; k < n; k++) w->nmods[k] = w->ndrow[k].mod;
    if (ok) {
        mla_err qerr;
        w->later = false;
        if (w->cfg->engine->queue_mods(eng, w->nmods, &qerr)) {
            MLA_INFO("the sampling of a queued step failed (the next plan runs in full): %s", qerr.msg);
            ok = false;
        }
    }
    if (!ok) drop_chained(w, eng);
}

/* Runs the engine on plan p's rows that the step ahead did not answer (all of them without one):
 * w->gtok[i] = the token row i took on the device (from the step ahead, or now), -1 where the
 * engine wrote logits into rows[i] instead (a host row the step ahead ran: rows[i] := its logits
 * row there). When p asks for exactly the queued step ahead, the step after it is queued first,
 * from the tokens on the device (w->chained); its constrained rows are sampled once their masks
 * follow from this step's tokens (w->later: finish_chained). */
static int run_rows(wk *w, engine *eng, wk_constrain *cons, const wire_step_plan *p, float **rows, mla_err *err) {
    const engine_ops *ops = w->cfg->engine;
    w->chained = w->later = false;
    if (!ops->step_greedy) return ops->step(eng, p, (float *const *)rows, err);
    wk_ahead *a = &w->ahead[w->cur], *next = &w->ahead[w->cur ^ 1];
    if (w->queued && wk_ahead_covers(a, p) && wk_ahead_build(next, p, NULL, false)) {
        bool later = false;
        for (uint32_t k = 0; k < next->plan.n_seqs; k++) {
            w->ndrow[k] = drow_of(w, &next->plan.seqs[k]);
            w->ndrow[k].mod_later = next->plan.seqs[k].sp.constrained;
            later |= w->ndrow[k].mod_later;
        }
        mla_err qerr;
        w->chained = ops->queue(eng, &next->plan, true, w->ndrow, &qerr) == MLA_OK;
        w->later = w->chained && later;
        if (!w->chained) {
            MLA_INFO("step %llu: the step after the step ahead was not queued: %s", (unsigned long long)p->step_id,
                     qerr.msg);
            wk_ahead_clear(next);
        }
    }
    ahead_collect(w, eng);
    wire_step_plan rest = *p;
    uint32_t nhit = 0;
    if (a->plan.n_seqs) nhit = wk_ahead_match(a, p, w->hit, w->lhit, &rest, w->ridx);
    for (uint32_t i = 0; nhit && i < p->n_seqs; i++) {
        w->gtok[i] = w->hit[i] >= 0 ? w->hit[i] : -1;
        if (w->hit[i] == WK_AHEAD_LOGITS) rows[i] = w->lhit[i]; /* sampled below, as if run now */
    }
    if (w->chained && rest.n_seqs > 0) { /* the step ahead failed: drop the one queued behind it */
        w->cur ^= 1;
        drop_chained(w, eng);
    } else if (w->chained) {
        wk_ahead_set_tokens(next, w->gtok); /* its inputs: this step's tokens (its masks: finish_chained) */
        w->cur ^= 1;
        w->queued = true;
    }
    if (nhit == 0) {
        device_mods(w, cons, p->seqs, p->n_seqs, w->drow, false);
        return ops->step_greedy(eng, p, (float *const *)rows, w->drow, w->gtok, err);
    }
    if (rest.n_seqs == 0) return MLA_OK;
    /* the residual rows, compacted: their logits rows, device rows and tokens */
    float **rrows = mla_xmalloc(rest.n_seqs * sizeof *rrows);
    for (uint32_t k = 0; k < rest.n_seqs; k++) {
        rrows[k] = rows[w->ridx[k]];
        w->rdrow[k] = w->drow[w->ridx[k]];
    }
    device_mods(w, cons, rest.seqs, rest.n_seqs, w->rdrow, false);
    int rc = ops->step_greedy(eng, &rest, (float *const *)rrows, w->rdrow, w->rtok, err);
    for (uint32_t k = 0; rc == MLA_OK && k < rest.n_seqs; k++) w->gtok[w->ridx[k]] = w->rtok[k];
    free(rrows);
    return rc;
}

/* After plan p (its result sent): the step that follows from its tokens, queued in the engine or
 * run now (worker/wk_ahead.h), unless run_rows already queued it. Without host rows, from the
 * device's tokens (w->gtok, the same on every rank); a step ahead of device rows only writes its
 * logits, where it writes any, into rows (p's, one row a sequence). With host rows (every rank
 * takes that decision from p alone), from tok (rank 0: the tokens of its result; broadcast to the
 * other ranks first, whose tok it overwrites), run, its logits kept in the step ahead. Its
 * constrained device rows get their masks now: the tokens are known. */
static void run_ahead(wk *w, engine *eng, wk_constrain *cons, const wire_step_plan *p, float **rows, int32_t *tok) {
    if (w->ahead_mode == WK_AHEAD_OFF || w->chained) return;
    wk_ahead *a = &w->ahead[w->cur];
    mla_err err;
    bool host = wk_ahead_wants_host(p, w->dev);
    if (host && w->cfg->world > 1) {
        if (coll_broadcast(w->coll, tok, p->n_seqs * sizeof *tok, 0, &err)) {
            MLA_WARN("step %llu: rank 0's tokens for the step ahead did not arrive (no step ahead): %s",
                     (unsigned long long)p->step_id, err.msg);
            wk_ahead_clear(a);
            return;
        }
    }
    if (!wk_ahead_build(a, p, host ? tok : w->gtok, host)) return;
    for (uint32_t k = 0; k < a->plan.n_seqs; k++) w->rdrow[k] = drow_of(w, &a->plan.seqs[k]);
    if (!device_mods(w, cons, a->plan.seqs, a->plan.n_seqs, w->rdrow, true)) {
        wk_ahead_done(a, NULL);
        return;
    }
    if (a->n_host) {
        float **arows = mla_xmalloc(a->plan.n_seqs * sizeof *arows);
        wk_ahead_logits(a, atomic_load(&w->n_vocab), arows);
        int rc = w->cfg->engine->step_greedy(eng, &a->plan, (float *const *)arows, w->rdrow, w->rtok, &err);
        free(arows);
        if (rc == MLA_OK) {
            wk_ahead_done(a, w->rtok);
            return;
        }
    } else if (w->ahead_mode == WK_AHEAD_QUEUE) {
        if (w->cfg->engine->queue(eng, &a->plan, false, w->rdrow, &err) == MLA_OK) {
            w->queued = true;
            return;
        }
    } else {
        if (w->cfg->engine->step_greedy(eng, &a->plan, (float *const *)rows, w->rdrow, w->rtok, &err) == MLA_OK) {
            wk_ahead_done(a, w->rtok);
            return;
        }
    }
    /* the engine refused it, most often because a sequence needs a cache block the coordinator
     * gives only with the next plan (a pool near full): expected, and that plan runs in full */
    MLA_DEBUG("no step ahead of step %llu (the next plan runs in full): %s", (unsigned long long)p->step_id, err.msg);
    wk_ahead_done(a, NULL);
}

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* whether plan p holds a sequence in two rows (ids: scratch of p->n_seqs) */
static bool has_twice(const wire_step_plan *p, uint64_t *ids) {
    for (uint32_t i = 0; i < p->n_seqs; i++) ids[i] = p->seqs[i].seq_id;
    qsort(ids, p->n_seqs, sizeof *ids, cmp_u64);
    for (uint32_t i = 1; i < p->n_seqs; i++)
        if (ids[i] == ids[i - 1]) return true;
    return false;
}

/* Every rank must take the same rows on the device: all of them sample there, or none. Agreed on
 * the collective at the first plan (every rank has loaded then; loads may differ by minutes). */
static void agree_dev(wk *w) {
    w->dev_agreed = true;
    mla_err err;
    float all = w->dev ? 1.0f : 0.0f;
    if (coll_allreduce_sum_f32(w->coll, &all, 1, &err)) {
        MLA_WARN("the ranks' device sampling could not be agreed (sampled on the host): %s", err.msg);
        all = 0;
    }
    if (w->dev && all != (float)w->cfg->world)
        MLA_WARN("device sampling off: not every rank can sample on its device (%g of %d)", all, w->cfg->world);
    w->dev = all == (float)w->cfg->world;
    w->ahead[0].dev = w->ahead[1].dev = w->dev;
}

static void run_plan(wk *w, engine *eng, sampler *smp, wk_constrain *cons, hist_tab *hist, void *pair,
                     const wire_step_plan *p) {
    const int rank = w->cfg->rank;
    if (!w->dev_agreed) agree_dev(w);
    steptrace_mark(p->step_id, 'D');
    const uint32_t V = atomic_load(&w->n_vocab);
    const long delay = mla_sw_int(MLA_SW_WORKER_STEP_DELAY_MS); /* fault injection (tests) */
    if (delay > 0) usleep((useconds_t)delay * 1000);
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
        w->drow = mla_xrealloc(w->drow, w->flags_cap * sizeof *w->drow);
        w->rdrow = mla_xrealloc(w->rdrow, w->flags_cap * sizeof *w->rdrow);
        w->ndrow = mla_xrealloc(w->ndrow, w->flags_cap * sizeof *w->ndrow);
        w->nmods = mla_xrealloc(w->nmods, w->flags_cap * sizeof *w->nmods);
        w->skip = mla_xrealloc(w->skip, w->flags_cap * sizeof *w->skip);
        w->sids = mla_xrealloc(w->sids, w->flags_cap * sizeof *w->sids);
        w->gtok = mla_xrealloc(w->gtok, w->flags_cap * sizeof *w->gtok);
        w->rtok = mla_xrealloc(w->rtok, w->flags_cap * sizeof *w->rtok);
        w->hit = mla_xrealloc(w->hit, w->flags_cap * sizeof *w->hit);
        w->lhit = mla_xrealloc(w->lhit, w->flags_cap * sizeof *w->lhit);
        w->stok = mla_xrealloc(w->stok, w->flags_cap * sizeof *w->stok);
        w->ridx = mla_xrealloc(w->ridx, w->flags_cap * sizeof *w->ridx);
    }
    for (uint32_t i = 0, off = 0; i < p->n_seqs; i++) {
        rows[i] = w->rows_buf + (size_t)off * V;
        off += engine_logit_rows(&p->seqs[i]);
        w->drow[i] = drow_of(w, &p->seqs[i]);
        w->skip[i] = w->drow[i].take; /* their grammar work: device_mods, when they are sampled */
        w->gtok[i] = -1;
        w->stok[i] = -1;
    }
    mla_err err;
    const int64_t t0 = now_ns();
    /* the host-sampled constrained rows' grammar work (rank 0: their masks) on threads while the
     * forward pass runs */
    if (cons) wk_constrain_prepare(cons, p, w->skip, rank == 0);
    /* the plan's table updates first: also those of rows a step ahead answered */
    int rc = w->cfg->engine->set_tables(eng, p, &err);
    if (rc == MLA_OK) rc = run_rows(w, eng, cons, p, rows, &err);
    if (cons) wk_constrain_join(cons);
    atomic_fetch_add(&w->st_step_ns, (uint64_t)(now_ns() - t0));
    atomic_fetch_add(&w->st_steps, 1);
    poll_mem(w, eng);
    poll_decode_time(w, eng);
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
            if (wk_send_msg(pair, &m, &err)) MLA_WARN("%s", err.msg);
        } else {
            send_control(pair, WIRE_CTL_ERROR, rank, 1, 0, p->step_id, err.msg);
        }
    } else if (rank == 0) {
        char cerr[420] = "";
        wire_seq_result *sr = mla_xcalloc(p->n_seqs, sizeof *sr);
        /* the host-sampled rows are sampled together after this loop, on threads (worker/wk_sample.h);
         * a plan that holds a sequence twice samples in line (its history grows between the two) */
        const bool in_line = has_twice(p, w->sids);
        size_t nj = 0, ncons = 0, nc = 0, njobs = p->n_seqs;
        for (uint32_t i = 0; i < p->n_seqs; i++) {
            nc += p->seqs[i].sp.constrained;
            njobs += plp_rows(&p->seqs[i]);
        }
        if (njobs > w->jobs_cap) {
            w->jobs_cap = njobs;
            w->jobs = mla_xrealloc(w->jobs, w->jobs_cap * sizeof *w->jobs);
            w->jrow = mla_xrealloc(w->jrow, w->jobs_cap * sizeof *w->jrow);
            w->jpos = mla_xrealloc(w->jpos, w->jobs_cap * sizeof *w->jpos);
        }
        if (nc * V > w->jmask_cap) {
            free(w->jmask);
            w->jmask_cap = nc * V;
            w->jmask = mla_xmalloc(w->jmask_cap);
        }
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
            /* a row the device sampled: its grammar took its tokens when its mask was made */
            if (s->sp.constrained && !(s->sample && w->gtok[i] >= 0) && wk_constrain_row(cons, s, &mod, &err)) {
                /* cannot be served (the coordinator checked the grammar): the step reports it */
                MLA_ERROR("step %llu: %s", (unsigned long long)p->step_id, err.msg);
                if (!cerr[0]) snprintf(cerr, sizeof cerr, "%.400s", err.msg);
                continue;
            }
            if (s->sample && w->gtok[i] >= 0) {
                /* taken on the device above */
            } else if (s->sample && !in_line) { /* sampled below, with the other host rows */
                wk_sample_job *j = &w->jobs[nj];
                w->jpos[nj] = UINT32_MAX;
                w->jrow[nj++] = i;
                j->score = false;
                j->logits = last;
                j->sp = &s->sp;
                j->mod = mod;
                if (mod.allow) { /* its own copy: a mask handed out may live only until the next row's */
                    uint8_t *mk = w->jmask + (size_t)ncons++ * V;
                    memcpy(mk, mod.allow, V);
                    j->mod.allow = mk;
                }
                j->history = NULL; /* below: this row's history buffer may still move */
                j->n_history = h->n;
                j->n_prompt_hist = hist_prompt(h, &s->sp);
                j->stream = (uint64_t)s->positions[s->n_tokens - 1] + 1;
            } else if (s->sample) {
                sample_out so;
                sampler_sample_mod(smp, last, &s->sp, &mod, h->tok, h->n, hist_prompt(h, &s->sp),
                                   (uint64_t)s->positions[s->n_tokens - 1] + 1, &so);
                sr[i].token = so.token;
                sr[i].logprob = so.logprob;
                sr[i].n_top = so.n_top;
                memcpy(sr[i].top, so.top, sizeof so.top);
            }
            if (s->sp.prompt_logprobs && s->sp.logits == WIRE_LOGITS_ALL) {
                plp_jobs(w, s, i, rows[i], V, &sr[i], &nj);
            } else if (s->sp.logits != WIRE_LOGITS_NONE) {
                sr[i].n_logit_rows = nrow;
                sr[i].n_vocab = V;
                sr[i].logits = rows[i];
            }
        }
        for (size_t k = 0; k < nj; k++) w->jobs[k].history = hist_get(hist, p->seqs[w->jrow[k]].seq_id)->tok;
        wk_sample_run(w->samp, w->jobs, nj);
        for (size_t k = 0; k < nj; k++) {
            wire_seq_result *r = &sr[w->jrow[k]];
            const sample_out *so = &w->jobs[k].out;
            if (w->jpos[k] != UINT32_MAX) { /* a prompt token's logprob */
                wire_plp *d = &r->plp[w->jpos[k]];
                d->logprob = so->logprob;
                d->n_top = so->n_top;
                memcpy(d->top, so->top, sizeof so->top);
                continue;
            }
            r->token = so->token;
            r->logprob = so->logprob;
            r->n_top = so->n_top;
            memcpy(r->top, so->top, sizeof so->top);
        }
        /* a constrained row whose grammar cannot go on took an end of sequence: the error ends it */
        for (uint32_t i = 0; cons && nc && i < p->n_seqs; i++)
            if (p->seqs[i].sample && p->seqs[i].sp.constrained)
                sr[i].error = (char *)wk_constrain_failure(cons, p->seqs[i].seq_id);
        m.kind = WIRE_STEP_RESULT;
        m.u.result.step_id = p->step_id;
        m.u.result.ok = !cerr[0];
        if (cerr[0]) snprintf(m.u.result.error, sizeof m.u.result.error, "rank 0: %s", cerr);
        /* a failed result carries no sequences (wire_decode refuses it otherwise, and the step
         * would never be answered) */
        m.u.result.n_seqs = cerr[0] ? 0 : p->n_seqs;
        for (uint32_t i = 0; !cerr[0] && i < p->n_seqs; i++) w->stok[i] = sr[i].token;
        m.u.result.seqs = sr;
        steptrace_mark(p->step_id, 'E');
        if (wk_send_msg(pair, &m, &err)) {
            /* e.g. too large a frame: report instead of going silent */
            memset(&m, 0, sizeof m);
            m.kind = WIRE_STEP_RESULT;
            m.u.result.step_id = p->step_id;
            snprintf(m.u.result.error, sizeof m.u.result.error, "rank 0: %.480s", err.msg);
            mla_err e2;
            if (wk_send_msg(pair, &m, &e2)) MLA_WARN("%s", e2.msg);
        }
        for (uint32_t i = 0; i < p->n_seqs; i++) free(sr[i].plp);
        free(sr);
    }
    finish_chained(w, eng, cons);
    if (rc == MLA_OK) run_ahead(w, eng, cons, p, rows, w->stok);
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
    if (wk_send_msg(pair, &m, &err)) MLA_WARN("%s", err.msg);
}

void *wk_compute_main(void *arg) {
    wk *w = arg;
    const wk_config *cfg = w->cfg;
    void *pair = zmq_socket(w->zctx, ZMQ_PAIR);
    int linger = 0;
    zmq_setsockopt(pair, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(pair, w->pair_ep) != 0) MLA_PANIC("inproc connect: %s", zmq_strerror(zmq_errno()));
    engine *eng = NULL;
    mla_err err;
    wk_boot bctx = {w, pair};
    const engine_boot boot = {&bctx, wk_boot_publish, wk_boot_wait};
    const engine_opts eo = {.n_threads = cfg->n_threads, .kv = w->kv, .wo = w->wo};
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
    if (lst.total) { /* the last progress: a load shorter than a report interval sent none */
        wire_msg pm = wk_control_msg(WIRE_CTL_LOAD_PROGRESS, cfg->rank, 0, 0, 0, NULL);
        pm.u.ctl.load_done = lst.total;
        pm.u.ctl.load_total = lst.total;
        if (wk_send_msg(pair, &pm, &err)) MLA_WARN("%s", err.msg);
    }
    {
        wire_msg lm = wk_control_msg(WIRE_CTL_LOADED, cfg->rank, 0, V, 0, NULL);
        lm.u.ctl.kv_blocks = kp.n_blocks;
        lm.u.ctl.kv_block_size = kp.block_size;
        lm.u.ctl.kv_block_bytes = kp.block_bytes;
        if (cfg->engine->backend_config) {
            cfg->engine->backend_config(eng, &lm.u.ctl.backend);
            lm.u.ctl.has_backend = true;
        }
        if (wk_send_msg(pair, &lm, &err)) MLA_WARN("%s", err.msg);
    }
    /* sampling on the device where the engine can (then every rank keeps the grammars) */
    w->dev = cfg->engine->dev_sample && cfg->engine->dev_sample(eng) && !mla_sw_bool(MLA_SW_WORKER_HOST_SAMPLE);
    w->ahead[0].dev = w->ahead[1].dev = w->dev;
    w->dev_agreed = cfg->world == 1;
    sampler *smp = cfg->rank == 0 ? sampler_new(V) : NULL;
    w->samp = cfg->rank == 0 ? wk_sample_new(V) : NULL;
    wk_constrain *cons = cfg->rank == 0 || w->dev ? wk_constrain_new(cfg->model_path, V) : NULL;
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
        MLA_INFO("step ahead: %llu rows run ahead, %llu of them taken by a plan (%llu sampled on the host)",
                 (unsigned long long)(w->ahead[0].rows_run + w->ahead[1].rows_run),
                 (unsigned long long)(w->ahead[0].rows_used + w->ahead[1].rows_used),
                 (unsigned long long)(w->ahead[0].host_used + w->ahead[1].host_used));
    for (size_t i = 0; i < hist.n; i++) free(hist.v[i].tok);
    free(hist.v);
    sampler_free(smp);
    wk_sample_free(w->samp);
    w->samp = NULL;
    wk_constrain_free(cons);
    cfg->engine->destroy(eng);
    zmq_close(pair);
    return NULL;
}
