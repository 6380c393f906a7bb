/* serve_adapt (coordinator/serve_adapt.h): the tokenizer adapter, the scheduler's backend over
 * the worker group and the health hooks of `mlaserve serve`. */
#include "coordinator/serve_adapt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mla_log.h"

/* ---- tokenizer adapter ---- */

static int st_encode(void *ctx, const char *text, size_t len, bool add_special, bool parse_special,
                     const size_t *plain, size_t n_plain, int32_t **ids, int32_t *n, mla_err *err) {
    serve_adapt *s = ctx;
    tok_ids out = {0};
    int rc = MLA_OK;
    if (add_special && s->prefix && s->prefix[0])
        rc = tok_encode(s->vocab, s->prefix, strlen(s->prefix), false, true, &out, err);
    else if (add_special && !s->prefix)
        rc = MLA_OK; /* no template prefix: tok_encode's own add_special below */
    if (rc == MLA_OK)
        rc = tok_encode_spans(s->vocab, text, len, add_special && !s->prefix, parse_special, plain, n_plain, &out, err);
    if (rc != MLA_OK) {
        tok_ids_free(&out);
        return rc;
    }
    *ids = out.ids; /* ownership moves to the caller (malloc'd) */
    *n = (int32_t)out.n;
    return MLA_OK;
}

static size_t st_control_at(void *ctx, const char *text, size_t len, size_t pos) {
    serve_adapt *s = ctx;
    return tok_control_at(s->vocab, text, len, pos);
}

static const char *st_piece(void *ctx, int32_t id, size_t *len) {
    serve_adapt *s = ctx;
    return tok_token_piece(s->vocab, id, len);
}
static bool st_special(void *ctx, int32_t id) {
    serve_adapt *s = ctx;
    return tok_token_type(s->vocab, id) == TOK_TYPE_CONTROL;
}
bool serve_adapt_is_eog(void *ctx, int32_t id) {
    serve_adapt *s = ctx;
    return tok_is_eog(s->vocab, id);
}
static int st_chat(void *ctx, const cJSON *messages, bool add_gen, const cJSON *vars, char **out, mla_err *err) {
    serve_adapt *s = ctx;
    size_t len = 0;
    const char *used = NULL;
    return chat_tmpl_apply_json(s->tmpl, messages, add_gen, vars, out, &len, &used, err);
}
static bool st_uses_var(void *ctx, const char *name) {
    serve_adapt *s = ctx;
    return chat_tmpl_uses_var(s->tmpl, name);
}

/* ---- scheduler backend over the coordinator ---- */

/* A token's n alternatives (wire_decode bounds n by WIRE_MAX_TOP_LOGPROBS = SCHED_MAX_TOP_LOGPROBS)
 * into the scheduler's arrays; returns how many */
static int32_t take_tops(const wire_top *t, uint32_t n, int32_t *ids, float *lps) {
    if (n > SCHED_MAX_TOP_LOGPROBS) n = SCHED_MAX_TOP_LOGPROBS;
    for (uint32_t k = 0; k < n; k++) {
        ids[k] = t[k].token;
        lps[k] = t[k].logprob;
    }
    return (int32_t)n;
}

static int cb_run(void *ctx, const sched_plan *plan, sched_result *results, mla_err *err) {
    serve_adapt *s = ctx;
    if (plan->n_seqs > s->cap_wseqs) {
        s->cap_wseqs = plan->n_seqs * 2;
        s->wseqs = mla_xrealloc(s->wseqs, (size_t)s->cap_wseqs * sizeof(*s->wseqs));
        s->errs = mla_xrealloc(s->errs, (size_t)s->cap_wseqs * sizeof(*s->errs));
    }
    if ((size_t)plan->n_tokens > s->cap_pos) {
        s->cap_pos = (size_t)plan->n_tokens * 2;
        s->pos = mla_xrealloc(s->pos, s->cap_pos * sizeof(int32_t));
    }
    size_t off = 0;
    for (int i = 0; i < plan->n_seqs; i++) {
        const sched_plan_seq *p = &plan->seqs[i];
        wire_seq *w = &s->wseqs[i];
        memset(w, 0, sizeof(*w));
        w->seq_id = p->seq_id;
        w->n_tokens = (uint32_t)p->n_tokens;
        w->tokens = (int32_t *)p->tokens;
        w->positions = s->pos + off;
        for (int32_t k = 0; k < p->n_tokens; k++) s->pos[off + (size_t)k] = p->start_pos + k;
        off += (size_t)p->n_tokens;
        w->block_start = (uint32_t)p->n_blocks_sent;
        w->n_blocks = (uint32_t)(p->n_blocks - p->n_blocks_sent);
        w->blocks = (uint32_t *)(p->block_table + p->n_blocks_sent); /* ids >= 0: the same bits */
        w->sample = p->sample;
        w->last = p->last;
        /* its prompt starts (at a cached prefix's end, or again after a preemption: the first counts) */
        if (p->n_blocks_sent == 0 && s->api) api_server_note_scheduled(s->api, p->seq_id);
        const sched_sampling *sp = p->sampling;
        w->sp.temperature = sp->temperature;
        w->sp.top_k = sp->top_k;
        w->sp.top_p = sp->top_p;
        w->sp.min_p = sp->min_p;
        w->sp.repetition_penalty = sp->repetition_penalty;
        w->sp.presence_penalty = sp->presence_penalty;
        w->sp.frequency_penalty = sp->frequency_penalty;
        w->sp.penalty_start = (uint32_t)p->n_prompt;
        /* no seed given: a per-request one (the stream index is the position, so preemption
         * and recomputation give the same tokens either way) */
        w->sp.seed = sp->has_seed ? sp->seed : s->seed_base ^ (p->seq_id * 0x9E3779B97F4A7C15ULL);
        w->sp.logprobs = sp->logprobs;
        w->sp.top_logprobs = (uint32_t)sp->top_logprobs;
        w->sp.logits = WIRE_LOGITS_NONE;
        w->next_token = -1;
        if (p->prompt_logprobs) { /* every row's logits, returned as the logprobs of its next tokens */
            w->sp.logits = WIRE_LOGITS_ALL;
            w->sp.prompt_logprobs = true;
            const int32_t after = p->start_pos + p->n_tokens;
            if (after < p->n_prompt) w->next_token = p->seq_tokens[after];
        }
        /* output constraints: the worker keeps them from the plan that starts the sequence's
         * state; the matcher follows the generated tokens from position n_prompt. min_tokens
         * alone: only while the row samples within the ban (a constrained row cannot be sampled
         * ahead on the host, nor greedily on the device without its mask) */
        const bool ban = sp->n_ban > 0 && p->start_pos + p->n_tokens < p->n_prompt + sp->min_tokens;
        w->sp.constrained = sp->grammar || sp->n_bias > 0 || ban;
        if (w->sp.constrained && p->n_blocks_sent == 0) {
            w->sp.constraint_setup = true;
            w->sp.grammar = (char *)sp->grammar;
            w->sp.grammar_start = (uint32_t)p->n_prompt;
            if (p->start_pos > p->n_prompt) { /* generated tokens found in the prefix cache */
                w->sp.replay = (int32_t *)p->seq_tokens + p->n_prompt;
                w->sp.n_replay = (uint32_t)(p->start_pos - p->n_prompt);
            }
            w->sp.n_bias = (uint32_t)sp->n_bias;
            w->sp.bias_ids = (int32_t *)sp->bias_ids;
            w->sp.bias_vals = (float *)sp->bias_vals;
            w->sp.min_tokens = (uint32_t)sp->min_tokens;
            w->sp.n_ban = (uint32_t)sp->n_ban;
            w->sp.ban_ids = (int32_t *)sp->ban_ids;
        }
    }
    wire_step_plan wp = {.step_id = ++s->step_id, .n_seqs = (uint32_t)plan->n_seqs, .seqs = s->wseqs};
    wire_step_result res;
    if (coord_step(s->c, &wp, &res, err) != MLA_OK) return MLA_ERR;
    int rc = MLA_OK;
    if (!res.ok) {
        rc = mla_errf(err, "%s", res.error[0] ? res.error : "the workers failed the step");
    } else {
        size_t nplp = 0, at = 0;
        for (uint32_t k = 0; k < res.n_seqs; k++) nplp += res.seqs[k].n_plp;
        if (nplp > s->cap_plp) {
            s->cap_plp = nplp * 2;
            free(s->plp);
            s->plp = mla_xmalloc(s->cap_plp * sizeof *s->plp);
        }
        for (int i = 0; i < plan->n_seqs && rc == MLA_OK; i++) {
            if (!plan->seqs[i].sample && !plan->seqs[i].prompt_logprobs) continue;
            const wire_seq_result *r = NULL;
            for (uint32_t k = 0; k < res.n_seqs; k++)
                if (res.seqs[k].seq_id == plan->seqs[i].seq_id) r = &res.seqs[k];
            if (r && plan->seqs[i].prompt_logprobs) {
                results[i].plp = s->plp + at;
                results[i].n_plp = (int32_t)r->n_plp;
                for (uint32_t k = 0; k < r->n_plp; k++, at++) {
                    sched_plp *d = &s->plp[at];
                    d->logprob = r->plp[k].logprob;
                    d->n_top = take_tops(r->plp[k].top, r->plp[k].n_top, d->top_ids, d->top_logprobs);
                }
            }
            if (!plan->seqs[i].sample) continue;
            if (!r || r->token < 0) {
                rc = mla_errf(err, "the workers returned no token for sequence %llu",
                              (unsigned long long)plan->seqs[i].seq_id);
                break;
            }
            results[i].token = r->token;
            if (r->error) { /* the worker ended the sequence: its request ends with this */
                snprintf(s->errs[i], sizeof s->errs[i], "%s", r->error);
                results[i].error = s->errs[i];
            }
            results[i].logprob = r->logprob;
            results[i].n_top = take_tops(r->top, r->n_top, results[i].top_ids, results[i].top_logprobs);
        }
    }
    coord_result_free(&res);
    return rc;
}

static void cb_free(void *ctx, uint64_t id) {
    serve_adapt *s = ctx;
    mla_err err;
    if (coord_free_seqs(s->c, &id, 1, &err) != MLA_OK)
        MLA_WARN("serve: freeing sequence %llu: %s", (unsigned long long)id, err.msg);
}

static bool cb_health(void *ctx, char *why, size_t cap) {
    serve_adapt *s = ctx;
    mla_err err = {{0}};
    if (coord_healthy(s->c, &err)) return true;
    snprintf(why, cap, "%s", err.msg[0] ? err.msg : "the worker group failed");
    return false;
}

static int cb_workers(void *ctx, coord_worker_info *info, int cap) {
    serve_adapt *s = ctx;
    return coord_workers(s->c, info, cap);
}

static int cb_restarts(void *ctx) {
    serve_adapt *s = ctx;
    return coord_restarts(s->c);
}

/* /health while the first start is under way (the api calls it until the scheduler is made:
 * loading, then ready with the pools not yet taken): 503 with each rank's progress */
static bool cb_loading(void *ctx, cJSON **body) {
    serve_adapt *s = ctx;
    const int ph = coord_phase(s->c);
    if (ph != COORD_PHASE_LOADING && ph != COORD_PHASE_READY) return false;
    coord_worker_info w[WIRE_MAX_WORLD];
    int n = coord_workers(s->c, w, WIRE_MAX_WORLD);
    cJSON *j = cJSON_CreateObject(), *ranks = cJSON_AddArrayToObject(j, "ranks");
    cJSON_AddStringToObject(j, "status", "loading");
    uint64_t done = 0, total = 0;
    int counted = 0; /* ranks whose sizes are in the totals: a rank not registered yet has none */
    for (int r = 0; r < n; r++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "rank", r);
        cJSON_AddStringToObject(o, "state", w[r].loaded ? "loaded" : !w[r].registered ? "starting"
                                            : w[r].load_total ? "loading" : "registered");
        if (w[r].device[0]) cJSON_AddStringToObject(o, "device", w[r].device);
        if (w[r].load_total) {
            cJSON_AddNumberToObject(o, "bytes_done", (double)w[r].load_done);
            cJSON_AddNumberToObject(o, "bytes_total", (double)w[r].load_total);
            if (w[r].load_seconds > 0 && w[r].load_done > 0) {
                double rate = (double)w[r].load_done / w[r].load_seconds;
                cJSON_AddNumberToObject(o, "bytes_per_second", rate);
                if (!w[r].loaded) cJSON_AddNumberToObject(o, "eta_seconds", (double)(w[r].load_total - w[r].load_done) / rate);
            }
            done += w[r].load_done;
            total += w[r].load_total;
            counted++;
        }
        cJSON_AddItemToArray(ranks, o);
    }
    cJSON_AddNumberToObject(j, "bytes_done", (double)done);
    cJSON_AddNumberToObject(j, "bytes_total", (double)total);
    cJSON_AddNumberToObject(j, "ranks_counted", counted);
    *body = j;
    return true;
}

api_tokenizer serve_adapt_tokenizer(serve_adapt *s, int32_t n_vocab) {
    return (api_tokenizer){.ctx = s, .n_vocab = n_vocab, .encode = st_encode, .piece = st_piece,
                           .is_special = st_special, .is_eog = serve_adapt_is_eog, .control_at = st_control_at,
                           .render_chat = s->tmpl ? st_chat : NULL, .chat_uses_var = s->tmpl ? st_uses_var : NULL};
}

void serve_adapt_api_hooks(serve_adapt *s, api_config *ac) {
    ac->health = cb_health;
    ac->health_ctx = s;
    ac->loading = cb_loading;
    ac->workers = cb_workers;
    ac->restarts = cb_restarts;
}

/* the worker group's restarts: each one starts with empty caches */
static uint64_t cb_epoch(void *ctx) {
    serve_adapt *s = ctx;
    return (uint64_t)coord_restarts(s->c);
}

/* the group failed and will be restarted (--on-worker-failure restart, not given up): the
 * requests wait for it instead of failing one step at a time */
static bool cb_paused(void *ctx) {
    serve_adapt *s = ctx;
    return !coord_healthy(s->c, NULL) && !coord_failed_for_good(s->c);
}

sched_backend serve_adapt_backend(serve_adapt *s) {
    return (sched_backend){
        .ctx = s, .run_step = cb_run, .free_seq = cb_free, .cache_epoch = cb_epoch, .paused = cb_paused};
}

void serve_adapt_free(serve_adapt *s) {
    free(s->wseqs);
    free(s->errs);
    s->errs = NULL;
    free(s->pos);
    free(s->plp);
    s->plp = NULL;
    s->cap_plp = 0;
    free(s->prefix);
    if (s->tmpl) chat_tmpl_free(s->tmpl);
    if (s->vocab) tok_vocab_free(s->vocab);
    s->wseqs = NULL, s->pos = NULL, s->prefix = NULL, s->tmpl = NULL, s->vocab = NULL;
}
