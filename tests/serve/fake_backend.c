/* fake_backend: see fake_backend.h. Tests only. */
#include "fake_backend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/mla_err.h"

static const char ALPHA[] = "abcdefghijklmnopqrstuvwxyz ";

typedef struct fseq {
    uint64_t id;
    int32_t len;
    int32_t *blocks; /* blocks it has written */
    int32_t n_blocks, cap_blocks;
} fseq;

struct fake_backend {
    fake_config cfg;
    pthread_mutex_t mu;
    int32_t *cache;
    uint64_t *owner; /* block -> seq id, 0 free */
    fseq *seqs;
    int n_seqs, cap_seqs;
    fake_stats st;
    int32_t *scratch;
    int32_t scratch_cap;
    sched_plp *plp; /* a step's prompt logprobs (sched_result.plp) */
    size_t cap_plp;
};

void fake_next(const int32_t *seq, int n, uint32_t eos_period, int n_top, sched_result *out) {
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < n; i++) {
        uint32_t t = (uint32_t)seq[i];
        for (int b = 0; b < 4; b++) {
            h ^= (t >> (8 * b)) & 0xffu;
            h *= 1099511628211ULL;
        }
    }
    memset(out, 0, sizeof(*out));
    bool eos = eos_period > 0 && h % eos_period == 0;
    out->token = eos ? FAKE_EOS : (int32_t)(unsigned char)ALPHA[h % 27];
    out->logprob = -(float)((h >> 8) % 1000) / 1000.0f - 0.001f;
    if (n_top > SCHED_MAX_TOP_LOGPROBS) n_top = SCHED_MAX_TOP_LOGPROBS;
    out->n_top = n_top;
    for (int i = 0; i < n_top; i++) {
        out->top_ids[i] = (i == 0) ? out->token : (int32_t)(unsigned char)ALPHA[(h + (uint64_t)i) % 27];
        out->top_logprobs[i] = out->logprob - 0.5f * (float)i;
    }
}

void fake_plp(const int32_t *seq, int n, int n_top, sched_result *out) {
    fake_next(seq, n, 0, n_top, out);
}

/* the prompt positions of entry p whose next token's logprob it returns */
static int32_t fake_plp_count(const sched_plan_seq *p) {
    if (!p->prompt_logprobs) return 0;
    const int32_t end = p->start_pos + p->n_tokens < p->n_prompt - 1 ? p->start_pos + p->n_tokens : p->n_prompt - 1;
    return end > p->start_pos ? end - p->start_pos : 0;
}

fake_backend *fake_backend_new(const fake_config *cfg) {
    fake_backend *f = mla_xcalloc(1, sizeof(*f));
    f->cfg = *cfg;
    pthread_mutex_init(&f->mu, NULL);
    f->cache = mla_xcalloc((size_t)cfg->n_blocks * (size_t)cfg->block_size, sizeof(int32_t));
    f->owner = mla_xcalloc((size_t)cfg->n_blocks, sizeof(uint64_t));
    return f;
}

void fake_backend_free(fake_backend *f) {
    if (!f) return;
    for (int i = 0; i < f->n_seqs; i++) free(f->seqs[i].blocks);
    free(f->seqs);
    free(f->cache);
    free(f->owner);
    free(f->scratch);
    free(f->plp);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

static void violation(fake_backend *f, const char *what, uint64_t id) {
    f->st.violations++;
    fprintf(stderr, "fake_backend: contract violation: %s (seq %llu)\n", what,
            (unsigned long long)id);
}

static fseq *find_seq(fake_backend *f, uint64_t id, bool create) {
    for (int i = 0; i < f->n_seqs; i++)
        if (f->seqs[i].id == id) return &f->seqs[i];
    if (!create) return NULL;
    if (f->n_seqs == f->cap_seqs) {
        f->cap_seqs = f->cap_seqs ? 2 * f->cap_seqs : 16;
        f->seqs = mla_xrealloc(f->seqs, (size_t)f->cap_seqs * sizeof(*f->seqs));
    }
    fseq *s = &f->seqs[f->n_seqs++];
    memset(s, 0, sizeof(*s));
    s->id = id;
    return s;
}

static void note_block(fseq *s, int32_t b) {
    for (int32_t i = 0; i < s->n_blocks; i++)
        if (s->blocks[i] == b) return;
    if (s->n_blocks == s->cap_blocks) {
        s->cap_blocks = s->cap_blocks ? 2 * s->cap_blocks : 8;
        s->blocks = mla_xrealloc(s->blocks, (size_t)s->cap_blocks * sizeof(int32_t));
    }
    s->blocks[s->n_blocks++] = b;
}

/* The n-th id of the script file, FAKE_EOS past its end (or when it cannot be read). */
static int32_t script_token(const char *path, int32_t n) {
    FILE *fp = fopen(path, "r");
    if (!fp) return FAKE_EOS;
    long v = 0;
    int32_t i = 0, tok = FAKE_EOS;
    while (i < 65536 && fscanf(fp, "%ld", &v) == 1) {
        if (i++ == n) {
            tok = (int32_t)v;
            break;
        }
    }
    fclose(fp);
    return tok;
}

/* f->scratch[0, end) := entry p's sequence read back from the cache through its block table */
static void read_back(fake_backend *f, const sched_plan_seq *p, int32_t end) {
    const int32_t bs = f->cfg.block_size;
    if (f->scratch_cap < end) {
        f->scratch_cap = end * 2;
        f->scratch = mla_xrealloc(f->scratch, (size_t)f->scratch_cap * sizeof(int32_t));
    }
    for (int32_t pos = 0; pos < end; pos++) {
        int32_t b = p->block_table[pos / bs];
        f->scratch[pos] = (b >= 0 && b < f->cfg.n_blocks) ? f->cache[(int64_t)b * bs + pos % bs] : -1;
    }
}

static int fake_run(void *ctx, const sched_plan *plan, sched_result *results, mla_err *err) {
    fake_backend *f = ctx;
    pthread_mutex_lock(&f->mu);
    int delay = f->cfg.step_delay_ms;
    pthread_mutex_unlock(&f->mu);
    if (delay > 0) {
        struct timespec ts = {delay / 1000, (long)(delay % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&f->mu);
    int64_t step = f->st.steps++;
    if (plan->n_tokens > f->st.max_batch_tokens) f->st.max_batch_tokens = plan->n_tokens;
    if (plan->n_seqs > f->st.max_batch_seqs) f->st.max_batch_seqs = plan->n_seqs;
    if (f->cfg.fail_at_step >= 0 && step == f->cfg.fail_at_step) {
        pthread_mutex_unlock(&f->mu);
        return mla_errf(err, "fake backend: worker 1 is down (injected failure at step %lld)",
                        (long long)step);
    }
    /* prompt logprobs: entry i's positions in the prompt (sched_plan_seq.prompt_logprobs) */
    size_t nplp = 0, at = 0;
    int64_t plp_tokens = 0;
    for (int i = 0; i < plan->n_seqs; i++) {
        nplp += (size_t)fake_plp_count(&plan->seqs[i]);
        if (plan->seqs[i].prompt_logprobs) plp_tokens += plan->seqs[i].n_tokens;
    }
    if (plp_tokens > f->st.max_plp_tokens) f->st.max_plp_tokens = plp_tokens;
    if (nplp > f->cap_plp) {
        f->cap_plp = nplp * 2;
        free(f->plp);
        f->plp = mla_xmalloc(f->cap_plp * sizeof *f->plp);
    }
    int32_t sum = 0;
    int32_t bs = plan->block_size;
    if (bs != f->cfg.block_size) violation(f, "block size differs", 0);
    for (int i = 0; i < plan->n_seqs; i++) {
        const sched_plan_seq *p = &plan->seqs[i];
        sum += p->n_tokens;
        for (int j = 0; j < i; j++)
            if (plan->seqs[j].seq_id == p->seq_id) violation(f, "sequence twice in a plan", p->seq_id);
        fseq *s = find_seq(f, p->seq_id, true);
        if (p->n_tokens < 1) violation(f, "empty entry", p->seq_id);
        if (p->n_blocks_sent == 0 && s->len == 0) s->len = p->start_pos; /* a prefix cached for another sequence */
        if (p->start_pos != s->len) violation(f, "start position is not the cached length", p->seq_id);
        int32_t end = p->start_pos + p->n_tokens;
        if ((int64_t)p->n_blocks * bs < end) {
            violation(f, "block table too short", p->seq_id);
            continue;
        }
        if (memcmp(p->tokens, p->seq_tokens + p->start_pos, (size_t)p->n_tokens * sizeof(int32_t)))
            violation(f, "tokens are not the sequence's", p->seq_id);
        for (int32_t pos = p->start_pos; pos < end; pos++) {
            int32_t b = p->block_table[pos / bs];
            if (b < 0 || b >= f->cfg.n_blocks) {
                violation(f, "block id out of range", p->seq_id);
                continue;
            }
            if (f->owner[b] != 0 && f->owner[b] != p->seq_id) violation(f, "block owned by another live sequence", p->seq_id);
            f->owner[b] = p->seq_id;
            note_block(s, b);
            f->cache[(int64_t)b * bs + pos % bs] = p->tokens[pos - p->start_pos];
        }
        s->len = end;
        const int32_t nl = fake_plp_count(p);
        if (p->prompt_logprobs && p->n_tokens > SCHED_PLP_CHUNK) violation(f, "a prompt-logprobs entry past its chunk", p->seq_id);
        if (p->prompt_logprobs && p->n_blocks_sent == 0 && p->start_pos > 0)
            violation(f, "prompt logprobs over a cached prefix", p->seq_id);
        if (nl > 0) { /* the fake's logprob at each position, over the sequence read back from the cache */
            read_back(f, p, end);
            for (int32_t j = 0; j < nl; j++, at++) {
                sched_result r;
                fake_plp(f->scratch, p->start_pos + j + 1, p->sampling->top_logprobs, &r);
                f->plp[at].logprob = r.logprob;
                f->plp[at].n_top = r.n_top;
                memcpy(f->plp[at].top_ids, r.top_ids, sizeof r.top_ids);
                memcpy(f->plp[at].top_logprobs, r.top_logprobs, sizeof r.top_logprobs);
            }
        }
        if (p->sample) {
            if (end != p->n_prompt + p->n_generated) violation(f, "sampling before the end of the sequence", p->seq_id);
            read_back(f, p, end);
            fake_next(f->scratch, end, f->cfg.eos_period, p->sampling->top_logprobs, &results[i]);
            if (f->cfg.script_file) results[i].token = script_token(f->cfg.script_file, p->n_generated);
            if (f->cfg.seq_fail_prompt > 0 && p->n_prompt == f->cfg.seq_fail_prompt && p->n_generated == f->cfg.seq_fail_gen)
                results[i].error = "fake backend: this sequence's grammar cannot go on";
        }
        if (nl > 0) { /* after fake_next, which clears the result */
            results[i].plp = f->plp + at - nl;
            results[i].n_plp = nl;
        }
    }
    if (sum != plan->n_tokens) violation(f, "plan token count is wrong", 0);
    f->st.live_seqs = f->n_seqs;
    pthread_mutex_unlock(&f->mu);
    return MLA_OK;
}

static void fake_free_seq(void *ctx, uint64_t id) {
    fake_backend *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->st.frees++;
    for (int i = 0; i < f->n_seqs; i++) {
        if (f->seqs[i].id != id) continue;
        fseq *s = &f->seqs[i];
        for (int32_t k = 0; k < s->n_blocks; k++)
            if (f->owner[s->blocks[k]] == id) f->owner[s->blocks[k]] = 0;
        free(s->blocks);
        f->seqs[i] = f->seqs[--f->n_seqs];
        break;
    }
    f->st.live_seqs = f->n_seqs;
    pthread_mutex_unlock(&f->mu);
}

void fake_backend_bind(fake_backend *f, sched_backend *be) {
    *be = (sched_backend){.ctx = f, .run_step = fake_run, .free_seq = fake_free_seq}; /* never loses its rows */
}

void fake_backend_stats(fake_backend *f, fake_stats *st) {
    pthread_mutex_lock(&f->mu);
    *st = f->st;
    pthread_mutex_unlock(&f->mu);
}

void fake_backend_set_delay(fake_backend *f, int step_delay_ms) {
    pthread_mutex_lock(&f->mu);
    f->cfg.step_delay_ms = step_delay_ms;
    pthread_mutex_unlock(&f->mu);
}
