/* wk_constrain: see wk_constrain.h. */
#include "wk_constrain.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"
#include "mla_log.h"

typedef struct crec {
    uint64_t id;
    gram *g;         /* NULL: logit biases only */
    gram_match *m;
    bool dead;       /* ended (an end of sequence taken) or failed: only end of sequence from now on */
    char *fail;      /* NULL, or why its grammar cannot go on (wk_constrain_failure) */
    /* the logit biases (n_bias), then min_tokens' banned tokens at -inf (n_ban): all of them apply
     * below position ban_end, the biases alone from there */
    int32_t *bias_ids;
    float *bias_vals;
    uint32_t n_bias, n_ban;
    uint32_t ban_end;
    uint32_t next_pos; /* position of the next token the matcher takes */
    uint32_t start;    /* position of the first generated token (grammar_start) */
    int32_t last_tok;  /* the token it took last (at next_pos - 1), when has_last */
    bool has_last;
    /* wk_constrain_prepare's work for this step's row: its tokens taken and, when it samples, its
     * mask in allow (cnt as gram_match_mask returns it); wk_constrain_row hands them out */
    bool prepared, want_mask;
    const wire_seq *seq;
    uint8_t *allow;
    int64_t cnt;
} crec;

struct wk_constrain {
    char *model_path;
    uint32_t n_vocab;
    gram_vocab *v;
    uint8_t *allow;
    crec *r;
    size_t n, cap;
    /* wk_constrain_prepare's threads: they work through prep[0..n_prep) by next_prep */
    pthread_t th[WK_CONSTRAIN_THREADS];
    int n_th;
    crec **prep;
    size_t n_prep, cap_prep;
    size_t next_prep;
    pthread_mutex_t mu;
};

wk_constrain *wk_constrain_new(const char *model_path, uint32_t n_vocab) {
    wk_constrain *c = mla_xcalloc(1, sizeof *c);
    c->model_path = model_path ? mla_xstrdup(model_path) : NULL;
    c->n_vocab = n_vocab;
    c->allow = mla_xmalloc(n_vocab ? n_vocab : 1);
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

static void rec_clear(crec *r) {
    free(r->fail);
    gram_match_free(r->m);
    gram_free(r->g);
    free(r->bias_ids);
    free(r->bias_vals);
    free(r->allow);
    memset(r, 0, sizeof *r);
}

void wk_constrain_free(wk_constrain *c) {
    if (!c) return;
    wk_constrain_join(c);
    for (size_t i = 0; i < c->n; i++) rec_clear(&c->r[i]);
    free(c->r);
    free(c->prep);
    pthread_mutex_destroy(&c->mu);
    gram_vocab_free(c->v);
    free(c->allow);
    free(c->model_path);
    free(c);
}

void wk_constrain_set_vocab(wk_constrain *c, gram_vocab *v) {
    gram_vocab_free(c->v);
    c->v = v;
}

void wk_constrain_drop(wk_constrain *c, uint64_t seq_id) {
    wk_constrain_join(c);
    for (size_t i = 0; i < c->n; i++)
        if (c->r[i].id == seq_id) {
            rec_clear(&c->r[i]);
            c->r[i] = c->r[--c->n];
            return;
        }
}

/* UTF-8 decoding of one code point; 0 when invalid */
static int utf8_next(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    int k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!k || (size_t)k > n) return 0;
    uint32_t v = k == 1 ? c : (uint32_t)(c & (0x7F >> k));
    for (int i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return k;
}

static int hexd(uint8_t c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int wk_constrain_vocab_from_gguf(gram_vocab **out, const char *model_path, uint32_t n_vocab, mla_err *err) {
    *out = NULL;
    gguf_ctx *g;
    if (gguf_open(&g, model_path, err)) return mla_err_prefix(err, "structured output");
    gguf_str model;
    const gguf_value *toks, *types = NULL;
    int rc = gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (rc == 0) rc = mla_errf(err, "structured output: tokenizer.ggml.model is missing");
    if (rc < 0) goto out;
    bool gpt2 = model.len == 4 && !memcmp(model.ptr, "gpt2", 4);
    bool spm = model.len == 5 && !memcmp(model.ptr, "llama", 5);
    if (!gpt2 && !spm) {
        rc = mla_errf(err, "structured output: tokenizer model '%.*s' is not supported (gpt2, llama are)",
                      (int)(model.len > 40 ? 40 : model.len), model.ptr);
        goto out;
    }
    rc = gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks, err);
    if (rc == 0) rc = mla_errf(err, "structured output: tokenizer.ggml.tokens is missing");
    if (rc < 0) goto out;
    rc = gguf_get_arr(g, "tokenizer.ggml.token_type", GGUF_VT_INT32, &types, err);
    if (rc < 0) goto out;
    if (rc == 0) types = NULL;
    gram_vocab *v = gram_vocab_new(n_vocab);
    uint8_t *buf = NULL;
    size_t cap = 0;
    uint64_t nt = toks->v.arr.n < n_vocab ? toks->v.arr.n : n_vocab;
    for (uint64_t i = 0; i < nt; i++) {
        int64_t ty = types && i < types->v.arr.n ? types->v.arr.items[i].v.i : 1;
        if (ty == 3 || ty == 4) { /* control and user-defined: taken only by a grammar's <[id]>, !<[id]> */
            gram_vocab_set_special(v, (uint32_t)i);
            continue;
        }
        if (ty != 1 && ty != 6) continue; /* normal and byte tokens as text; unknown and unused never */
        const uint8_t *s = (const uint8_t *)toks->v.arr.items[i].v.s.ptr;
        size_t n = toks->v.arr.items[i].v.s.len, k = 0;
        if (n * 3 + 1 > cap) {
            cap = n * 3 + 16;
            buf = mla_xrealloc(buf, cap);
        }
        bool ok = n > 0;
        if (spm && ty == 6) {
            ok = n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && hexd(s[3]) >= 0 && hexd(s[4]) >= 0;
            if (ok) buf[k++] = (uint8_t)(hexd(s[3]) * 16 + hexd(s[4]));
        } else {
            for (size_t j = 0; j < n && ok;) {
                uint32_t cp;
                int l = utf8_next(s + j, n - j, &cp);
                if (!l) {
                    ok = false;
                    break;
                }
                if (gpt2) {
                    int b = gram_gpt2_byte(cp);
                    if (b < 0) ok = false;
                    else buf[k++] = (uint8_t)b;
                } else if (cp == 0x2581) {
                    buf[k++] = ' ';
                } else {
                    memcpy(buf + k, s + j, (size_t)l);
                    k += (size_t)l;
                }
                j += (size_t)l;
            }
        }
        if (ok && k) gram_vocab_set(v, (uint32_t)i, buf, k);
    }
    free(buf);
    const char *eos_keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
    int n_eos = 0;
    for (int k = 0; k < 3; k++) {
        uint32_t id;
        int r2 = gguf_get_u32(g, eos_keys[k], &id, err);
        if (r2 < 0) {
            gram_vocab_free(v);
            rc = MLA_ERR;
            goto out;
        }
        if (r2 == 1 && id < n_vocab) {
            gram_vocab_set_eos(v, id);
            n_eos++;
        }
    }
    if (!n_eos) MLA_WARN("structured output: the model names no end-of-sequence token: grammars never end it");
    *out = v;
    rc = MLA_OK;
out:
    gguf_close(g);
    return rc < 0 ? MLA_ERR : MLA_OK;
}

static crec *find(wk_constrain *c, uint64_t id) {
    for (size_t i = 0; i < c->n; i++)
        if (c->r[i].id == id) return &c->r[i];
    return NULL;
}

/* r cannot go on: dead, with the reason (the first one) for wk_constrain_failure */
static void rec_fail(crec *r, const char *why) {
    MLA_WARN("sequence %" PRIu64 ": %s (only end of sequence from now on)", r->id, why);
    r->dead = true;
    if (!r->fail) r->fail = mla_xstrdup(why);
}

/* The matcher takes token t; a failure marks the record dead. */
static void take(crec *r, const gram_vocab *v, int32_t t) {
    if (!r->m || r->dead) return;
    if (t >= 0 && gram_vocab_is_eos(v, (uint32_t)t)) { /* the sequence ends (a step ahead may still run it) */
        r->dead = true;
        return;
    }
    mla_err e = {{0}};
    if (t < 0 || (uint32_t)t >= gram_vocab_n(v)) {
        mla_errf(&e, "token %d is outside the vocabulary", t);
    } else if (gram_match_accept_token(r->m, v, (uint32_t)t, &e) == MLA_OK) {
        return;
    }
    char why[WIRE_MAX_STR];
    const unsigned ng = r->next_pos - r->start + 1;
    snprintf(why, sizeof why, "the output grammar reached a limit of the matcher after %u generated token%s: %.400s",
             ng, ng == 1 ? "" : "s", e.msg);
    rec_fail(r, why);
}

/* The record of constrained row s, set up by the plan when it says so (created, its grammar
 * parsed, the tokens before the plan replayed); NULL with err set when it cannot be served. */
static crec *row_setup(wk_constrain *c, const wire_seq *s, mla_err *err) {
    if (!c->v && wk_constrain_vocab_from_gguf(&c->v, c->model_path, c->n_vocab, err)) return NULL;
    const wire_sampling *sp = &s->sp;
    crec *r = find(c, s->seq_id);
    if (sp->constraint_setup) {
        if (!r) {
            if (c->n == c->cap) {
                c->cap = c->cap ? 2 * c->cap : 16;
                c->r = mla_xrealloc(c->r, c->cap * sizeof *c->r);
            }
            r = &c->r[c->n++];
            memset(r, 0, sizeof *r);
        } else {
            rec_clear(r);
        }
        r->id = s->seq_id;
        if (sp->grammar) {
            if (gram_parse(&r->g, sp->grammar, strlen(sp->grammar), err) ||
                gram_match_new(&r->m, r->g, err)) {
                wk_constrain_drop(c, s->seq_id);
                mla_err_prefix(err, "sequence %" PRIu64, s->seq_id);
                return NULL;
            }
        }
        r->n_bias = sp->n_bias;
        r->n_ban = sp->min_tokens ? sp->n_ban : 0;
        r->ban_end = sp->grammar_start + sp->min_tokens;
        if (r->n_bias + r->n_ban) {
            r->bias_ids = mla_xmalloc((r->n_bias + r->n_ban) * sizeof *r->bias_ids);
            r->bias_vals = mla_xmalloc((r->n_bias + r->n_ban) * sizeof *r->bias_vals);
            for (uint32_t k = 0; k < r->n_bias + r->n_ban; k++) {
                const bool b = k < r->n_bias;
                r->bias_ids[k] = b ? sp->bias_ids[k] : sp->ban_ids[k - r->n_bias];
                r->bias_vals[k] = b ? sp->bias_vals[k] : -INFINITY;
            }
        }
        r->next_pos = r->start = sp->grammar_start;
        for (uint32_t k = 0; k < sp->n_replay; k++, r->next_pos++) take(r, c->v, sp->replay[k]);
    }
    if (!r) mla_errf(err, "sequence %" PRIu64 ": constrained, but no constraint was set up for it", s->seq_id);
    return r;
}

/* The plan's tokens of row s into r's matcher. */
static int row_take(crec *r, const gram_vocab *v, const wire_seq *s, mla_err *err) {
    for (uint32_t k = 0; k < s->n_tokens; k++) {
        uint32_t pos = (uint32_t)s->positions[k];
        if (pos + 1 == r->next_pos && r->has_last && s->tokens[k] != r->last_tok)
            return mla_errf(err, "sequence %" PRIu64 ": token %d at position %u, but its grammar took %d there",
                            s->seq_id, s->tokens[k], pos, r->last_tok);
        if (pos < r->next_pos) continue; /* the prompt, or taken already (a step ahead) */
        if (pos > r->next_pos)
            return mla_errf(err, "sequence %" PRIu64 ": position %u comes before %u reached its grammar", s->seq_id,
                            pos, r->next_pos);
        take(r, v, s->tokens[k]);
        r->last_tok = s->tokens[k];
        r->has_last = true;
        r->next_pos++;
    }
    return MLA_OK;
}

/* r's token mask into allow: gram_match_mask's count, or -1 (and r dead) where the grammar stops. */
static int64_t row_mask(crec *r, gram_vocab *v, uint8_t *allow) {
    if (r->dead) return -1;
    mla_err e = {{0}};
    int64_t cnt = gram_match_mask(r->m, v, allow, &e);
    char why[WIRE_MAX_STR];
    const unsigned n = r->next_pos - r->start;
    if (cnt < 0) {
        snprintf(why, sizeof why, "the output grammar reached a limit of the matcher after %u generated token%s: %.400s",
                 n, n == 1 ? "" : "s", e.msg);
        rec_fail(r, why);
    } else if (cnt == 0) {
        snprintf(why, sizeof why, "no token of the vocabulary continues the output grammar after %u generated token%s", n,
                 n == 1 ? "" : "s");
        rec_fail(r, why);
        cnt = -1;
    }
    return cnt;
}

/* mod for row s of r, sampled, whose mask (count cnt) is in allow: end of sequence only where the
 * grammar cannot go on; before min_tokens, no stop token, unless the mask allows nothing else (a
 * grammar that is complete and cannot go on ends there). */
static int row_mod(wk_constrain *c, crec *r, const wire_seq *s, uint8_t *allow, int64_t cnt, sample_mod *mod,
                   mla_err *err) {
    bool early = r->n_ban && s->n_tokens && (uint32_t)s->positions[s->n_tokens - 1] + 1 < r->ban_end;
    if (r->m) {
        if (cnt <= 0) { /* end of sequence only */
            uint32_t n_eos = 0;
            for (uint32_t i = 0; i < c->n_vocab; i++) n_eos += allow[i] = gram_vocab_is_eos(c->v, i);
            if (!n_eos)
                return mla_errf(err, "sequence %" PRIu64 ": its grammar cannot go on and the model has no "
                                "end-of-sequence token", r->id);
            cnt = n_eos;
        }
        if (early) { /* the banned tokens the mask allows: all it allows? */
            int64_t n_banned = 0;
            for (uint32_t k = r->n_bias; k < r->n_bias + r->n_ban; k++)
                n_banned += (uint32_t)r->bias_ids[k] < c->n_vocab && allow[r->bias_ids[k]];
            if (n_banned >= cnt) early = false;
        }
        mod->allow = allow;
    }
    mod->bias_ids = r->bias_ids;
    mod->bias_vals = r->bias_vals;
    mod->n_bias = r->n_bias + (early ? r->n_ban : 0);
    return MLA_OK;
}

static void *prep_main(void *arg) {
    wk_constrain *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        crec *r = c->next_prep < c->n_prep ? c->prep[c->next_prep++] : NULL;
        pthread_mutex_unlock(&c->mu);
        if (!r) return NULL;
        mla_err e = {{0}};
        if (row_take(r, c->v, r->seq, &e)) { /* reported again by wk_constrain_row */
            r->prepared = false;
            continue;
        }
        if (r->seq->sample && r->m && r->want_mask) {
            if (!r->allow) r->allow = mla_xmalloc(c->n_vocab ? c->n_vocab : 1);
            r->cnt = row_mask(r, c->v, r->allow);
        }
    }
}

void wk_constrain_prepare(wk_constrain *c, const wire_step_plan *p, const bool *skip, bool masks) {
    wk_constrain_join(c);
    c->n_prep = c->next_prep = 0;
    for (size_t k = 0; k < c->n; k++) { /* nothing of an earlier plan is handed out */
        c->r[k].prepared = false;
        c->r[k].seq = NULL;
    }
    bool any = false;
    for (uint32_t i = 0; i < p->n_seqs; i++) { /* set up (records may move) */
        mla_err e = {{0}};
        if (p->seqs[i].sp.constrained && !(skip && skip[i]) && row_setup(c, &p->seqs[i], &e))
            any = true; /* else wk_constrain_row reports it */
    }
    if (!any) return;
    gram_vocab_freeze(c->v);
    for (uint32_t i = 0; i < p->n_seqs; i++) { /* c->r no longer moves */
        const wire_seq *s = &p->seqs[i];
        crec *r = s->sp.constrained && !(skip && skip[i]) ? find(c, s->seq_id) : NULL;
        if (!r) continue;
        r->want_mask = masks;
        if (c->n_prep == c->cap_prep) {
            c->cap_prep = c->cap_prep ? 2 * c->cap_prep : 16;
            c->prep = mla_xrealloc(c->prep, c->cap_prep * sizeof *c->prep);
        }
        r->prepared = true;
        r->seq = s;
        c->prep[c->n_prep++] = r;
    }
    int n = c->n_prep < WK_CONSTRAIN_THREADS ? (int)c->n_prep : WK_CONSTRAIN_THREADS;
    for (c->n_th = 0; c->n_th < n; c->n_th++)
        if (pthread_create(&c->th[c->n_th], NULL, prep_main, c)) break;
    if (!c->n_th) prep_main(c); /* no thread could start: here, now */
}

const char *wk_constrain_failure(wk_constrain *c, uint64_t seq_id) {
    wk_constrain_join(c);
    const crec *r = find(c, seq_id);
    return r ? r->fail : NULL;
}

void wk_constrain_join(wk_constrain *c) {
    for (int k = 0; k < c->n_th; k++) pthread_join(c->th[k], NULL);
    c->n_th = 0;
}

int wk_constrain_row(wk_constrain *c, const wire_seq *s, sample_mod *mod, mla_err *err) {
    memset(mod, 0, sizeof *mod);
    wk_constrain_join(c);
    crec *r = find(c, s->seq_id);
    if (r && r->prepared && r->seq == s) {
        r->prepared = false;
        r->seq = NULL;
        if (!s->sample) return MLA_OK;
        if (r->want_mask || !r->m) return row_mod(c, r, s, r->allow, r->cnt, mod, err);
        return row_mod(c, r, s, c->allow, row_mask(r, c->v, c->allow), mod, err);
    }
    r = row_setup(c, s, err);
    if (!r) return MLA_ERR;
    if (row_take(r, c->v, s, err)) return MLA_ERR;
    if (!s->sample) return MLA_OK;
    return row_mod(c, r, s, c->allow, r->m ? row_mask(r, c->v, c->allow) : 0, mod, err);
}
