#include "test_engine.h"

#include "common/mla_switch.h"
#include "kvtab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* a sequence: the running state after each of its positions (h[k]: after the token at k) */
typedef struct tseq {
    uint64_t id;
    size_t n;  /* positions it holds */
    kvtab tab; /* its block table (set_tables) */
} tseq;

#define TE_BLOCK 16 /* positions a cache block */

struct engine {
    int rank, world;
    coll *c;
    tseq *seqs;
    size_t n, cap;
    int delay_ms;
    uint64_t tokens_run; /* tokens advanced over the engine's life (MLA_TEST_ENGINE_STATS) */
    /* the last step's rows and the tokens it took (-1: not taken: then no queue from it), and
     * the tokens of the queued steps, oldest first (queue / wait_queued) */
    uint64_t *last_id;
    int32_t *last_tok;
    uint32_t last_n, last_cap;
    int32_t *queued[2];
    uint32_t queued_n[2], n_queued;
    uint64_t n_queue_host, n_queue_device; /* queue calls with each source of tokens */
    sampler *smp;        /* the rows it samples itself (dev_sample: worker/sample.c, as the host would) */
    /* a queued step whose rows wait for queue_mods: their logits rows and settings */
    float *pend_rows;
    engine_drow *pend_drow;
    wire_sampling *pend_sp;
    uint32_t pend_n;
    bool pend;
    engine_kv_pool pool; /* kv_memory_bytes / 1 KiB blocks (4096 when 0) of TE_BLOCK positions */
    uint64_t *cache;     /* the "KV cache": the running state after each position, by block and slot */
};

/* the slot of position pos of q in the cache */
static uint64_t *slot_of(engine *e, const tseq *q, size_t pos) {
    return &e->cache[(size_t)q->tab.ids[pos / TE_BLOCK] * TE_BLOCK + pos % TE_BLOCK];
}

int test_engine_file_hash(const char *path, uint64_t *hash, mla_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return mla_errf(err, "cannot open %s", path);
    uint64_t h = 0xcbf29ce484222325ull;
    int ch;
    while ((ch = fgetc(f)) != EOF) h = (h ^ (uint64_t)(unsigned char)ch) * 0x100000001b3ull;
    fclose(f);
    *hash = h;
    return MLA_OK;
}

static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t test_engine_advance(uint64_t h, int32_t t, int32_t pos) {
    return mix(h ^ mix((uint64_t)(uint32_t)t * 131 + (uint64_t)(uint32_t)pos));
}

static float part(int r, uint64_t h, int32_t pos, int v) {
    uint64_t z = mix(h ^ mix(((uint64_t)r << 40) ^ ((uint64_t)(uint32_t)pos << 16) ^ (uint64_t)v));
    return (float)((int)(z % 512) - 256) / 64.0f;
}

void test_engine_expected(uint64_t h, int32_t pos, int world, float *row) {
    for (int v = 0; v < TEST_VOCAB; v++) {
        float s = 0;
        for (int r = 0; r < world; r++) s += part(r, h, pos, v);
        row[v] = s;
    }
}

void test_engine_boot_id(uint64_t seed, uint8_t id[WIRE_MAX_NCCL_ID]) {
    for (int i = 0; i < WIRE_MAX_NCCL_ID; i += 8) {
        uint64_t z = mix(seed ^ mix((uint64_t)i));
        memcpy(id + i, &z, 8);
    }
}

/* the NCCL-id exchange as an engine using NCCL does it (MLA_TEST_ENGINE_ID_SEED set, world > 1) */
static int te_boot(const engine_boot *boot, int rank, int world, mla_err *err) {
    const char *seed = mla_sw_str(MLA_SW_TEST_ENGINE_ID_SEED);
    if (!seed || world < 2) return MLA_OK;
    if (!boot) return mla_errf(err, "test engine: no bootstrap relay for the id");
    uint8_t want[WIRE_MAX_NCCL_ID], got[WIRE_MAX_NCCL_ID];
    test_engine_boot_id(strtoull(seed, NULL, 0), want);
    if (rank == 0) {
        const long corrupt = mla_sw_int(MLA_SW_TEST_ENGINE_ID_CORRUPT);
        if (corrupt > 0) want[corrupt % WIRE_MAX_NCCL_ID] ^= 0x5a;
        if (mla_sw_bool(MLA_SW_TEST_ENGINE_ID_NOPUB)) return MLA_OK;
        return boot->publish_id(boot->ctx, want, sizeof want, err);
    }
    if (boot->wait_id(boot->ctx, got, sizeof got, err)) return mla_err_prefix(err, "test engine");
    for (int i = 0; i < WIRE_MAX_NCCL_ID; i++)
        if (got[i] != want[i])
            return mla_errf(err, "test engine: the id relayed from rank 0 differs at byte %d (%02x, expected %02x)", i,
                            got[i], want[i]);
    return MLA_OK;
}

static int te_load(engine **out, const char *path, int rank, int world, coll *c, const engine_boot *boot,
                   const engine_opts *eo, mla_err *err) {
    if (mla_sw_int(MLA_SW_TEST_ENGINE_FAIL_LOAD) == rank) return mla_errf(err, "test engine: load failure requested for rank %d", rank);
    if (te_boot(boot, rank, world, err)) return MLA_ERR;
    FILE *f = fopen(path, "rb");
    if (!f) return mla_errf(err, "cannot open %s", path);
    fclose(f);
    engine *e = mla_xcalloc(1, sizeof *e);
    e->rank = rank;
    e->world = world;
    e->c = c;
    e->delay_ms = (int)mla_sw_int(MLA_SW_TEST_ENGINE_DELAY_MS);
    const uint64_t nb = eo->kv.kv_memory_bytes ? eo->kv.kv_memory_bytes / 1024 : 4096;
    e->pool = (engine_kv_pool){(uint32_t)(nb < WIRE_MAX_BLOCKS ? nb : WIRE_MAX_BLOCKS), TE_BLOCK, 1024};
    if (e->pool.n_blocks == 0) {
        free(e);
        return mla_errf(err, "test engine: --kv-memory holds no block of 1024 bytes");
    }
    e->cache = mla_xcalloc((size_t)e->pool.n_blocks * TE_BLOCK, sizeof *e->cache);
    *out = e;
    return MLA_OK;
}

static void te_kv_pool(const engine *e, engine_kv_pool *out) { *out = e->pool; }

static uint32_t te_vocab(const engine *e) {
    (void)e;
    return TEST_VOCAB;
}

static tseq *get_seq(engine *e, uint64_t id) {
    for (size_t i = 0; i < e->n; i++)
        if (e->seqs[i].id == id) return &e->seqs[i];
    if (e->n == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 8;
        e->seqs = mla_xrealloc(e->seqs, e->cap * sizeof *e->seqs);
    }
    e->seqs[e->n] = (tseq){.id = id};
    return &e->seqs[e->n++];
}

/* set_tables (engine.h): the tables' lengths are kept and checked as the real engines check them */
static int te_set_tables(engine *e, const wire_step_plan *p, mla_err *err) {
    for (uint32_t i = 0; i < p->n_seqs; i++) {
        const wire_seq *s = &p->seqs[i];
        tseq *q = get_seq(e, s->seq_id);
        if (kvtab_apply(&q->tab, s->block_start, s->blocks, s->n_blocks, e->pool.n_blocks, 0, err))
            return mla_err_prefix(err, "test engine: seq %llu", (unsigned long long)s->seq_id);
        if (q->n > (size_t)q->tab.n * TE_BLOCK) q->n = (size_t)q->tab.n * TE_BLOCK;
    }
    return MLA_OK;
}

/* step and step_greedy (engine.h); drow/tokens NULL: step */
/* the token row r gives under d: the host sampler's, without logprobs (the engine takes none such) */
static int32_t te_pick(engine *e, const float *r, const engine_drow *d) {
    if (!e->smp) e->smp = sampler_new(TEST_VOCAB);
    wire_sampling sp = *d->sp;
    sp.logprobs = false;
    sp.top_logprobs = 0;
    sample_out o;
    sampler_sample_mod(e->smp, r, &sp, &d->mod, NULL, 0, 0, d->stream, &o);
    return o.token;
}

static int te_step_greedy(engine *e, const wire_step_plan *p, float *const *logits, const engine_drow *drow,
                          int32_t *tokens, mla_err *err) {
    if (e->delay_ms > 0) usleep((useconds_t)e->delay_ms * 1000);
    size_t total = 0;
    for (uint32_t i = 0; i < p->n_seqs; i++) total += engine_logit_rows(&p->seqs[i]);
    e->last_n = 0;
    if (p->n_seqs > e->last_cap) {
        e->last_cap = p->n_seqs;
        e->last_id = mla_xrealloc(e->last_id, e->last_cap * sizeof *e->last_id);
        e->last_tok = mla_xrealloc(e->last_tok, e->last_cap * sizeof *e->last_tok);
    }
    /* positions as the real engines take them: a plan starting below what a sequence holds
     * rewinds it there, one starting past it is refused (checked before anything advances) */
    for (uint32_t i = 0; i < p->n_seqs; i++) {
        const wire_seq *s = &p->seqs[i];
        const tseq *q = get_seq(e, s->seq_id);
        /* a sequence holding nothing may start later: its table shares blocks others filled */
        if (s->positions[0] < 0 || ((size_t)s->positions[0] > q->n && q->n > 0))
            return mla_errf(err, "test engine: seq %llu starts at position %d but holds %zu",
                            (unsigned long long)s->seq_id, s->positions[0], q->n);
        if ((uint64_t)s->positions[0] + s->n_tokens > (uint64_t)q->tab.n * TE_BLOCK)
            return mla_errf(err, "test engine: seq %llu: the block table covers %u positions, the step needs %u",
                            (unsigned long long)s->seq_id, q->tab.n * TE_BLOCK, s->positions[0] + s->n_tokens);
    }
    float *buf = mla_xmalloc(total * TEST_VOCAB * sizeof(float));
    size_t row = 0;
    for (uint32_t i = 0; i < p->n_seqs; i++) {
        const wire_seq *s = &p->seqs[i];
        tseq *q = get_seq(e, s->seq_id);
        q->n = (size_t)s->positions[0];
        int all = s->sp.logits == WIRE_LOGITS_ALL;
        for (uint32_t k = 0; k < s->n_tokens; k++) {
            const uint64_t h = test_engine_advance(q->n ? *slot_of(e, q, q->n - 1) : 0, s->tokens[k], s->positions[k]);
            *slot_of(e, q, q->n++) = h;
            e->tokens_run++;
            if (all || k + 1 == s->n_tokens) {
                for (int v = 0; v < TEST_VOCAB; v++)
                    buf[row * TEST_VOCAB + (size_t)v] = part(e->rank, h, s->positions[k], v);
                row++;
            }
        }
    }
    if (coll_allreduce_sum_f32(e->c, buf, total * TEST_VOCAB, err)) {
        free(buf);
        return MLA_ERR;
    }
    row = 0;
    for (uint32_t i = 0; i < p->n_seqs; i++) {
        uint32_t nr = engine_logit_rows(&p->seqs[i]);
        const float *r = buf + row * TEST_VOCAB;
        row += nr;
        e->last_id[i] = p->seqs[i].seq_id;
        e->last_tok[i] = -1;
        if (drow && drow[i].take && !drow[i].mod_later) { /* like the CUDA engine: the token, the row unwritten */
            tokens[i] = e->last_tok[i] = te_pick(e, r, &drow[i]);
            continue;
        }
        if (tokens) tokens[i] = -1;
        memcpy(logits[i], r, (size_t)nr * TEST_VOCAB * sizeof(float));
    }
    e->last_n = p->n_seqs;
    free(buf);
    return MLA_OK;
}

/* queue (engine.h): runs the plan now (every rank queues the same, so its all-reduce pairs up)
 * and keeps its tokens until wait_queued asks for them; rows whose masks come later keep their
 * logits until queue_mods */
static int te_queue(engine *e, const wire_step_plan *a, bool from_device, const engine_drow *drow, mla_err *err) {
    if (e->n_queued == 2) return mla_errf(err, "test engine: two plans are queued already");
    if (e->pend) return mla_errf(err, "test engine: the queued plan waits for its masks");
    const uint32_t n = a->n_seqs ? a->n_seqs : 1;
    wire_step_plan q = *a;
    q.seqs = mla_xmalloc(n * sizeof *q.seqs);
    int32_t *tok = mla_xmalloc(n * sizeof *tok);
    engine_drow *d = mla_xcalloc(n, sizeof *d);
    float **rows = mla_xcalloc(n, sizeof *rows);
    float *buf = mla_xmalloc((size_t)n * TEST_VOCAB * sizeof *buf);
    bool later = false;
    int rc = MLA_OK;
    if (from_device && e->last_n != a->n_seqs) rc = mla_errf(err, "test engine: the last step had other rows");
    for (uint32_t i = 0; rc == MLA_OK && i < a->n_seqs; i++) {
        q.seqs[i] = a->seqs[i];
        if (from_device) {
            if (e->last_id[i] != a->seqs[i].seq_id || e->last_tok[i] < 0) {
                rc = mla_errf(err, "test engine: row %u of the last step is not this sequence's device token", i);
                break;
            }
            tok[i] = e->last_tok[i];
            q.seqs[i].tokens = &tok[i];
        }
        if (drow && !drow[i].take) {
            rc = mla_errf(err, "test engine: a queued row must take its token on the device");
            break;
        }
        d[i] = drow ? drow[i] : (engine_drow){.take = true, .sp = &a->seqs[i].sp};
        rows[i] = buf + (size_t)i * TEST_VOCAB; /* written for the rows whose masks come later */
        later |= d[i].mod_later;
    }
    int32_t *out = mla_xmalloc(n * sizeof *out);
    if (rc == MLA_OK) rc = te_step_greedy(e, &q, rows, d, out, err);
    if (rc == MLA_OK) {
        if (from_device) e->n_queue_device++;
        else e->n_queue_host++;
        e->queued[e->n_queued] = out;
        e->queued_n[e->n_queued++] = a->n_seqs;
        if (later) { /* its rows' settings and logits until queue_mods */
            free(e->pend_rows);
            free(e->pend_drow);
            free(e->pend_sp);
            e->pend_rows = buf;
            buf = NULL;
            e->pend_drow = d;
            e->pend_sp = mla_xmalloc(n * sizeof *e->pend_sp);
            for (uint32_t i = 0; i < a->n_seqs; i++) {
                e->pend_sp[i] = *d[i].sp;
                e->pend_drow[i].sp = &e->pend_sp[i];
            }
            d = NULL;
            e->pend_n = a->n_seqs;
            e->pend = true;
        }
    } else {
        free(out);
    }
    free(q.seqs);
    free(tok);
    free(d);
    free(rows);
    free(buf);
    return rc;
}

static int te_queue_mods(engine *e, const sample_mod *mods, mla_err *err) {
    if (!e->pend) return mla_errf(err, "test engine: no queued plan waits for its masks");
    e->pend = false;
    int32_t *out = e->queued[e->n_queued - 1];
    for (uint32_t i = 0; i < e->pend_n; i++) {
        engine_drow *d = &e->pend_drow[i];
        if (!d->mod_later) continue;
        d->mod = mods ? mods[i] : (sample_mod){0};
        out[i] = e->last_tok[i] = te_pick(e, e->pend_rows + (size_t)i * TEST_VOCAB, d);
    }
    return MLA_OK;
}

static bool te_dev_sample(const engine *e) {
    (void)e;
    return true;
}

static int te_wait_queued(engine *e, int32_t *tokens, mla_err *err) {
    if (e->n_queued == 0) return mla_errf(err, "test engine: nothing is queued");
    if (e->pend && e->n_queued == 1) return mla_errf(err, "test engine: the queued plan waits for its masks");
    memcpy(tokens, e->queued[0], e->queued_n[0] * sizeof *tokens);
    free(e->queued[0]);
    e->queued[0] = e->queued[1];
    e->queued_n[0] = e->queued_n[1];
    e->n_queued--;
    return MLA_OK;
}

static int te_step(engine *e, const wire_step_plan *p, float *const *logits, mla_err *err) {
    return te_step_greedy(e, p, logits, NULL, NULL, err);
}

static void te_free_seq(engine *e, uint64_t id) {
    for (size_t i = 0; i < e->n; i++)
        if (e->seqs[i].id == id) {
            kvtab_free(&e->seqs[i].tab);
            e->seqs[i] = e->seqs[--e->n];
            return;
        }
}

static void te_destroy(engine *e) {
    if (!e) return;
    const char *stats = mla_sw_str(MLA_SW_TEST_ENGINE_STATS);
    if (stats) {
        char path[4096];
        snprintf(path, sizeof path, "%s.%d", stats, e->rank);
        FILE *f = fopen(path, "w");
        if (f) {
            fprintf(f, "%llu %llu %llu\n", (unsigned long long)e->tokens_run, (unsigned long long)e->n_queue_host,
                    (unsigned long long)e->n_queue_device);
            fclose(f);
        }
    }
    for (size_t i = 0; i < e->n; i++) kvtab_free(&e->seqs[i].tab);
    free(e->cache);
    for (uint32_t i = 0; i < e->n_queued; i++) free(e->queued[i]);
    free(e->last_id);
    free(e->last_tok);
    free(e->seqs);
    sampler_free(e->smp);
    free(e->pend_rows);
    free(e->pend_drow);
    free(e->pend_sp);
    free(e);
}

const engine_ops test_engine_ops = {.name = "test",
                                    .model_hash = test_engine_file_hash,
                                    .load = te_load,
                                    .kv_pool = te_kv_pool,
                                    .set_tables = te_set_tables,
                                    .n_vocab = te_vocab,
                                    .step = te_step,
                                    .free_seq = te_free_seq,
                                    .destroy = te_destroy,
                                    .step_greedy = te_step_greedy,
                                    .dev_sample = te_dev_sample,
                                    .queue = te_queue,
                                    .queue_mods = te_queue_mods,
                                    .wait_queued = te_wait_queued};
