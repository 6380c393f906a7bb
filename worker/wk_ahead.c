#include "wk_ahead.h"

#include <stdlib.h>
#include <string.h>

#include "mla_err.h"

void wk_ahead_init(wk_ahead *a, bool dev) {
    memset(a, 0, sizeof *a);
    a->dev = dev;
}

void wk_ahead_free(wk_ahead *a) {
    free(a->plan.seqs);
    free(a->tok);
    free(a->pos);
    free(a->out);
    free(a->host);
    free(a->lrow);
    free(a->logits);
    free(a->rest);
    memset(a, 0, sizeof *a);
}

wk_ahead_mode_t wk_ahead_mode(bool step_greedy, bool queue, uint32_t setting) {
    if (!step_greedy || setting == WIRE_AHEAD_OFF) return WK_AHEAD_OFF;
    return queue && setting != WIRE_AHEAD_SYNC ? WK_AHEAD_QUEUE : WK_AHEAD_SYNC;
}

bool wk_ahead_device_row(const wire_seq *s, bool dev) {
    const wire_sampling *sp = &s->sp;
    if (!s->sample || sp->repetition_penalty != 1.0f || sp->presence_penalty != 0 || sp->frequency_penalty != 0 ||
        sp->logprobs || sp->top_logprobs != 0 || sp->logits != WIRE_LOGITS_NONE)
        return false;
    return dev || ((sp->temperature == 0 || sp->top_k == 1) && !sp->constrained);
}

bool wk_ahead_row(const wire_seq *s) {
    return s->sample && s->n_tokens == 1 && s->positions[0] != INT32_MAX && s->sp.logits == WIRE_LOGITS_NONE;
}

/* whether every row of p ends its request (wire_seq.last): no plan continues any of them */
static bool all_last(const wire_step_plan *p) {
    for (uint32_t i = 0; i < p->n_seqs; i++)
        if (!p->seqs[i].last) return false;
    return true;
}

bool wk_ahead_wants_host(const wire_step_plan *p, bool dev) {
    bool any = false;
    for (uint32_t i = 0; i < p->n_seqs; i++) {
        if (!wk_ahead_row(&p->seqs[i])) return false;
        any |= !wk_ahead_device_row(&p->seqs[i], dev);
    }
    return any && !all_last(p);
}

void wk_ahead_clear(wk_ahead *a) {
    a->plan.n_seqs = 0;
    a->n_host = 0;
}

bool wk_ahead_build(wk_ahead *a, const wire_step_plan *p, const int32_t *tok, bool host) {
    wk_ahead_clear(a);
    if (p->n_seqs == 0 || all_last(p)) return false;
    for (uint32_t i = 0; i < p->n_seqs; i++) {
        const wire_seq *s = &p->seqs[i];
        if (!wk_ahead_row(s) || (tok && tok[i] < 0) || (!(tok && host) && !wk_ahead_device_row(s, a->dev))) return false;
    }
    if (p->n_seqs > a->cap) {
        a->cap = p->n_seqs;
        a->plan.seqs = mla_xrealloc(a->plan.seqs, a->cap * sizeof *a->plan.seqs);
        a->tok = mla_xrealloc(a->tok, a->cap * sizeof *a->tok);
        a->pos = mla_xrealloc(a->pos, a->cap * sizeof *a->pos);
        a->out = mla_xrealloc(a->out, a->cap * sizeof *a->out);
        a->host = mla_xrealloc(a->host, a->cap * sizeof *a->host);
        a->lrow = mla_xrealloc(a->lrow, a->cap * sizeof *a->lrow);
    }
    for (uint32_t i = 0; i < p->n_seqs; i++) {
        a->tok[i] = tok ? tok[i] : -1;
        a->pos[i] = p->seqs[i].positions[0] + 1;
        a->out[i] = -1;
        a->host[i] = !wk_ahead_device_row(&p->seqs[i], a->dev);
        a->n_host += a->host[i];
        a->lrow[i] = NULL;
        a->plan.seqs[i] = p->seqs[i];
        a->plan.seqs[i].sp.constraint_setup = false; /* set up by p, if at all */
        a->plan.seqs[i].tokens = &a->tok[i];
        a->plan.seqs[i].positions = &a->pos[i];
    }
    a->plan.n_seqs = p->n_seqs;
    a->plan.step_id = 0;
    return true;
}

void wk_ahead_logits(wk_ahead *a, uint32_t n_vocab, float **rows) {
    const size_t need = (size_t)a->plan.n_seqs * n_vocab;
    if (need > a->logits_cap) {
        free(a->logits);
        a->logits_cap = need;
        a->logits = mla_xmalloc(need * sizeof *a->logits);
    }
    for (uint32_t i = 0; i < a->plan.n_seqs; i++) rows[i] = a->lrow[i] = a->logits + (size_t)i * n_vocab;
}

void wk_ahead_set_tokens(wk_ahead *a, const int32_t *tok) {
    memcpy(a->tok, tok, a->plan.n_seqs * sizeof *a->tok);
}

/* whether row s asks for exactly row j of the step held: its sequence, one token, that token at
 * that position, sampled where row j was (a greedy row on the device, else on the host) */
static bool asks_for(const wk_ahead *a, uint32_t j, const wire_seq *s) {
    return s->seq_id == a->plan.seqs[j].seq_id && wk_ahead_row(s) && wk_ahead_device_row(s, a->dev) == !a->host[j] &&
           s->positions[0] == a->pos[j] && s->tokens[0] == a->tok[j];
}

bool wk_ahead_covers(const wk_ahead *a, const wire_step_plan *p) {
    if (a->plan.n_seqs == 0 || p->n_seqs != a->plan.n_seqs) return false;
    for (uint32_t i = 0; i < p->n_seqs; i++)
        if (!asks_for(a, i, &p->seqs[i])) return false;
    return true;
}

void wk_ahead_done(wk_ahead *a, const int32_t *out) {
    if (!out) {
        wk_ahead_clear(a);
        return;
    }
    for (uint32_t i = 0; i < a->plan.n_seqs; i++) a->out[i] = a->host[i] ? WK_AHEAD_LOGITS : out[i];
    a->rows_run += a->plan.n_seqs;
}

void wk_ahead_drop(wk_ahead *a, uint64_t id) {
    for (uint32_t i = 0; i < a->plan.n_seqs; i++)
        if (a->plan.seqs[i].seq_id == id) a->out[i] = -1;
}

/* the row of the step ahead with row s's sequence, if s asks for exactly it and its token is
 * there; else -1 (hint: the likely index) */
static int64_t find(const wk_ahead *a, const wire_seq *s, uint32_t hint) {
    const uint32_t n = a->plan.n_seqs;
    for (uint32_t k = 0; k < n; k++) {
        const uint32_t j = (hint + k) % n;
        if (a->plan.seqs[j].seq_id != s->seq_id) continue;
        return (a->out[j] >= 0 || a->out[j] == WK_AHEAD_LOGITS) && asks_for(a, j, s) ? (int64_t)j : -1;
    }
    return -1;
}

uint32_t wk_ahead_match(wk_ahead *a, const wire_step_plan *p, int32_t *hit, float **lhit, wire_step_plan *rest,
                        uint32_t *rest_idx) {
    if (p->n_seqs > a->rest_cap) {
        a->rest_cap = p->n_seqs;
        a->rest = mla_xrealloc(a->rest, a->rest_cap * sizeof *a->rest);
    }
    uint32_t nhit = 0, nrest = 0;
    for (uint32_t i = 0; i < p->n_seqs; i++) {
        const int64_t j = a->plan.n_seqs ? find(a, &p->seqs[i], i) : -1;
        hit[i] = j >= 0 ? a->out[j] : -1;
        lhit[i] = j >= 0 && a->host[j] ? a->lrow[j] : NULL;
        if (j >= 0) {
            a->out[j] = -1; /* once */
            a->host_used += a->host[j];
            nhit++;
        } else {
            rest_idx[nrest] = i;
            a->rest[nrest++] = p->seqs[i];
        }
    }
    a->rows_used += nhit;
    rest->step_id = p->step_id;
    rest->n_seqs = nrest;
    rest->seqs = a->rest;
    wk_ahead_clear(a);
    return nhit;
}
