/* engine_cuda: see engine_cuda.h. Mirrors engine_cpu.c (one device state per sequence id: its
 * block table into the model's cache pool, which load() sizes from the coordinator's settings;
 * rewind on a lower first position). The matmul modes (worker/model_cuda.cu mm()):
 *   default (--cuda-precision split): quantized weights with int8 activations (the integer
 *     GEMV up to 96 tokens, int8 tensor cores above: llama.cpp's scheme); float weights through
 *     the fp32 GEMV, or for steps of more than 128 tokens the split-bf16 tensor cores (hi/lo,
 *     3 MMAs: fp32-class accuracy);
 *   --cuda-precision bf16: plain bf16 tensor cores for float weights in steps of more than 8 tokens
 *     (logits ~4e-2 off in log-prob on the fixtures);
 *   --cuda-precision exact: every matmul the fp32 GEMV, activations never rounded (slow prefill);
 *   MLA_CUDA_Q8=0|1 turns the int8 activations off or on in any mode;
 *   attention runs on fp16 tensor cores except in exact mode; MLA_CUDA_ATTN=tc|fp32 decides;
 *   the latent cache holds fp16 with tensor-core attention, fp32 with fp32 attention;
 *   MLA_CUDA_KV=f16|f32 decides (common/model_config.h mla_cuda_kv_f16).
 * The decode sequences of a step run as one batched step (CUDA graphs where the collective
 * allows: worker/model_cuda.h mla_cmodel_decode); greedy rows take their token on the device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_cuda.h"
#include "gguf.h"
#include "mla_log.h"

#ifdef MLA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda_ops.h"
#include "model_cuda.h"
#ifdef MLA_HAVE_NCCL
#include "coll_nccl.h"
#endif

typedef struct cu_seq {
    uint64_t id;
    mla_cstate *st;
} cu_seq;

struct engine {
    gguf_ctx *g;
    mla_cmodel *m;
    int64_t n_ctx; /* the longest sequence a table covers */
    engine_kv_pool pool;
    cu_seq *seqs;
    size_t n, cap;
    coll *nccl; /* owned: the NCCL collective the model uses, NULL: the worker's host collective */
    mla_cuda_config cfg; /* what the kernels chose on this device (logged at load) */
    mla_cmodel_samp *qsamp; /* a queued step's sampling settings until queue_mods (qn rows) */
    bool *qlater;           /* its rows whose masks queue_mods gives */
    uint32_t qn, qcap;
};

#ifdef MLA_HAVE_NCCL
/* NCCL when every rank has a GPU of its own (world <= visible devices) and the coordinator's
 * --nccl is not off (--nccl on makes a failure to set it up an error rather than a fall-back). Rank 0 makes the
 * unique id and publishes it through the coordinator (boot->publish_id: works across hosts); the
 * other ranks wait for it (boot->wait_id, bounded); a known-answer check follows. Every rank
 * takes the same NCCL-or-host decision only when they see the same device counts: a mixed group
 * fails (the ranks waiting for an id time out with a message) rather than mixing collectives. */
static int setup_nccl(engine *e, const engine_boot *boot, int rank, int world, int dev, uint32_t mode,
                      mla_err *err) {
    if (mode == WIRE_NCCL_OFF) return MLA_OK;
    bool force = mode == WIRE_NCCL_REQUIRED;
    int ndev = mla_cuda_device_count();
    bool ok = world <= ndev && coll_nccl_available();
    if (!ok) {
        if (force)
            return mla_errf(err, "--nccl on but NCCL cannot serve %d ranks here (%d devices, libnccl %s)", world, ndev,
                            coll_nccl_available() ? "found" : "not found");
        MLA_INFO("collective: host (%d ranks, %d devices, libnccl %s)", world, ndev,
                 coll_nccl_available() ? "found" : "not found");
        return MLA_OK;
    }
    unsigned char id[COLL_NCCL_ID_BYTES] = {0};
    if (world > 1 && !boot) {
        if (force) return mla_errf(err, "--nccl on but no coordinator relays the NCCL id");
        MLA_INFO("collective: host (no coordinator to hand out the NCCL id)");
        return MLA_OK;
    }
    if (rank == 0) {
        if (coll_nccl_make_id(id, err)) return mla_err_prefix(err, "NCCL id");
        if (world > 1 && boot->publish_id(boot->ctx, id, sizeof id, err)) return mla_err_prefix(err, "publishing the NCCL id");
    } else if (boot->wait_id(boot->ctx, id, sizeof id, err)) {
        return mla_err_prefix(err, "NCCL id");
    }
    if (coll_nccl_new(&e->nccl, id, rank, world, dev, err)) return MLA_ERR;
    if (coll_nccl_selftest(e->nccl, err)) return MLA_ERR;
    MLA_INFO("collective: NCCL (rank %d of %d, device %d; self-check passed)", rank, world, dev);
    return MLA_OK;
}
#endif

static int cu_model_hash(const char *path, uint64_t *hash, mla_err *err) {
    gguf_ctx *g;
    if (gguf_open(&g, path, err)) return MLA_ERR;
    *hash = gguf_index_hash(g);
    gguf_close(g);
    return MLA_OK;
}

static void cu_destroy(engine *e);

static int cu_load(engine **out, const char *path, int rank, int world, coll *c, const engine_boot *boot,
                   const engine_opts *eo, mla_err *err) {
    (void)boot;
    int dev = rank; /* ranks map to the visible devices in turn (CUDA_VISIBLE_DEVICES chooses them) */
    if (mla_cuda_device_count() > 0) dev = rank % mla_cuda_device_count();
    if (mla_cuda_init(dev, err)) return mla_err_prefix(err, "CUDA device %d", dev);
    mla_err se;
    if (cuda_selfcheck(&se)) return mla_errf(err, "CUDA self-check failed on device %d, refusing to start: %s", dev, se.msg);
    engine *e = mla_xcalloc(1, sizeof *e);
    if (gguf_open(&e->g, path, err)) {
        free(e);
        return MLA_ERR;
    }
    /* the coordinator's --cuda-precision: split (the default); bf16: plain bf16 tensor cores for
     * float weights; exact: fp32 GEMV only */
    const bool exact = eo->wo.cuda_precision == WIRE_PREC_EXACT, plain = eo->wo.cuda_precision == WIRE_PREC_BF16;
    mla_cmodel_opts opts = {dev, exact, false, !exact && !plain};
#ifdef MLA_HAVE_NCCL
    if (setup_nccl(e, boot, rank, world, dev, eo->wo.nccl, err)) {
        if (e->nccl) coll_free(e->nccl);
        gguf_close(e->g);
        free(e);
        return MLA_ERR;
    }
    opts.coll_on_device = e->nccl != NULL;
#endif
    if (mla_cmodel_load(&e->m, e->g, e->nccl ? e->nccl : c, &opts, err)) {
        if (e->nccl) coll_free(e->nccl);
        gguf_close(e->g);
        free(e);
        return MLA_ERR;
    }
#ifdef MLA_HAVE_NCCL
    if (e->nccl) coll_nccl_set_stream(e->nccl, mla_cmodel_stream(e->m));
#endif
    if (eo->wo.allreduce == WIRE_AR_ONESHOT && mla_cmodel_ar_oneshot(e->m, eo->kv.local_group, err)) {
        mla_cmodel_free(e->m);
        if (e->nccl) coll_free(e->nccl);
        gguf_close(e->g);
        free(e);
        return MLA_ERR;
    }
    /* weights are on the device: the file is no longer needed */
    gguf_close(e->g);
    e->g = NULL;
    const mla_config *cf = mla_cmodel_config(e->m);
    /* what the kernels chose for this model on this device (also in the coordinator's /metrics) */
    mla_cuda_config_get(&e->cfg, cf->kv_lora_rank, cf->n_rope, mla_cmodel_attn_tc(e->m));
    char ccs[256];
    mla_cuda_config_str(&e->cfg, ccs, sizeof ccs);
    MLA_INFO("CUDA device %d: self-check passed; %s", dev, ccs);
    e->n_ctx = eo->kv.max_context > 0 ? eo->kv.max_context : cf->ctx_train > 0 ? cf->ctx_train : 4096;
    /* ranks the coordinator started here with the same devices visible map to them rank % count:
     * those on this device split it (each worker on a GPU of its own, as a launcher starts them,
     * takes the whole fraction) */
    int share = 1;
    const int ndev = mla_cuda_device_count();
    if (eo->kv.local_group && ndev > 0 && world > ndev)
        share = world / ndev + (dev < world % ndev ? 1 : 0);
    mla_cmodel_kv_opts ko = {eo->kv.gpu_memory_utilization, share, eo->kv.kv_memory_bytes, WIRE_MAX_BLOCKS,
                             wire_kv_step_cap(&eo->kv), e->n_ctx, eo->kv.max_seqs};
    if (mla_cmodel_kv_init(e->m, &ko, err)) {
        mla_err_prefix(err, "device %d", dev);
        cu_destroy(e);
        return MLA_ERR;
    }
    int64_t nb = 0;
    mla_cmodel_kv_pool(e->m, &nb, &e->pool.block_bytes);
    e->pool.n_blocks = (uint32_t)nb;
    e->pool.block_size = MLA_CUDA_KV_BLOCK;
    MLA_INFO("cache pool: %u blocks of %u positions (%.2f MiB each, %.2f GiB, %.0f positions) on device %d",
             e->pool.n_blocks, e->pool.block_size, (double)e->pool.block_bytes / 1048576.0,
             (double)e->pool.n_blocks * (double)e->pool.block_bytes / 1073741824.0,
             (double)e->pool.n_blocks * e->pool.block_size, dev);
    *out = e;
    return MLA_OK;
}

static void cu_kv_pool(const engine *e, engine_kv_pool *out) { *out = e->pool; }

static uint32_t cu_vocab(const engine *e) { return (uint32_t)mla_cmodel_config(e->m)->n_vocab; }

static mla_cstate *get_state(engine *e, uint64_t id, mla_err *err) {
    for (size_t i = 0; i < e->n; i++)
        if (e->seqs[i].id == id) return e->seqs[i].st;
    mla_cstate *st = mla_cstate_new(e->m, err);
    if (!st) return NULL;
    if (e->n == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 8;
        e->seqs = mla_xrealloc(e->seqs, e->cap * sizeof *e->seqs);
    }
    e->seqs[e->n].id = id;
    e->seqs[e->n].st = st;
    return e->seqs[e->n++].st;
}

static int cu_set_tables(engine *e, const wire_step_plan *p, mla_err *err) {
    for (uint32_t i = 0; i < p->n_seqs; i++) {
        const wire_seq *s = &p->seqs[i];
        mla_cstate *st = get_state(e, s->seq_id, err);
        if (!st || mla_cstate_set_blocks(st, s->block_start, s->blocks, s->n_blocks, err))
            return mla_err_prefix(err, "seq %llu", (unsigned long long)s->seq_id);
    }
    return MLA_OK;
}

/* drow's sampling as the model takes it (rows taken greedily need none) */
static void to_samp(const engine_drow *d, mla_cmodel_samp *out) {
    memset(out, 0, sizeof *out);
    out->top_p = 1.0f;
    const wire_sampling *sp = d->sp;
    if (sp && sp->temperature != 0 && sp->top_k != 1) {
        out->temperature = sp->temperature;
        out->top_k = sp->top_k;
        out->top_p = sp->top_p;
        out->min_p = sp->min_p;
        out->seed = sp->seed;
    }
    out->stream = d->stream;
    out->allow = d->mod.allow;
    out->bias_ids = d->mod.bias_ids;
    out->bias_vals = d->mod.bias_vals;
    out->n_bias = d->mod.n_bias;
}

/* whether drow asks for more than the greedy token of the raw logits */
static bool samp_needed(const engine_drow *d) {
    const wire_sampling *sp = d->sp;
    return d->mod_later || d->mod.allow || d->mod.n_bias || (sp && sp->temperature != 0 && sp->top_k != 1);
}

/* Sequences with several new tokens (prompts) run one by one; the single-token ones (decode)
 * run together as one batched step (mla_cmodel_decode), unless MLA_CUDA_BATCHED=0. */
static int cu_step_greedy(engine *e, const wire_step_plan *p, float *const *logits, const engine_drow *drow,
                          int32_t *tokens, mla_err *err) {
    mla_cstate **bst = NULL;
    int32_t *btok = NULL, *bids = NULL;
    uint32_t *bseq = NULL;
    float **blog = NULL;
    mla_cmodel_samp *bsamp = NULL;
    uint32_t nb = 0;
    int rc = MLA_OK;
    /* rows of the batched decode take their token on the device (engine.h step_greedy) */
    const bool dev = drow && mla_cmodel_device_argmax(e->m);
    bool any_take = false, any_samp = false;
    if (mla_cmodel_batched(e->m) && p->n_seqs > 0) {
        bst = mla_xmalloc(p->n_seqs * sizeof *bst);
        btok = mla_xmalloc(p->n_seqs * sizeof *btok);
        blog = mla_xmalloc(p->n_seqs * sizeof *blog);
        bids = mla_xmalloc(p->n_seqs * sizeof *bids);
        bseq = mla_xmalloc(p->n_seqs * sizeof *bseq);
        bsamp = mla_xmalloc(p->n_seqs * sizeof *bsamp);
    }
    for (uint32_t i = 0; tokens && i < p->n_seqs; i++) tokens[i] = -1;
    for (uint32_t i = 0; i < p->n_seqs && rc == MLA_OK; i++) {
        const wire_seq *s = &p->seqs[i];
        mla_cstate *st = get_state(e, s->seq_id, err);
        if (!st) {
            rc = MLA_ERR;
            break;
        }
        int64_t pos0 = s->positions[0], past = mla_cstate_n_past(st);
        /* a lower position rewinds; a sequence that holds nothing may start later (rows [0, pos0)
         * are in blocks its table shares: the prefix cache); another gap is an error */
        if (pos0 + (int64_t)s->n_tokens > mla_cstate_covered(st)) {
            rc = mla_errf(err, "seq %llu: the block table covers %lld positions, the step needs %lld",
                          (unsigned long long)s->seq_id, (long long)mla_cstate_covered(st),
                          (long long)(pos0 + s->n_tokens));
            break;
        }
        if (pos0 < past || (past == 0 && pos0 > 0)) mla_cstate_set_n_past(st, pos0);
        else if (pos0 > past) {
            rc = mla_errf(err, "seq %llu: starts at position %lld but its cache holds %lld tokens",
                          (unsigned long long)s->seq_id, (long long)pos0, (long long)past);
            break;
        }
        if (pos0 + (int64_t)s->n_tokens > e->n_ctx) {
            rc = mla_errf(err, "seq %llu: %lld tokens exceed the context of %lld", (unsigned long long)s->seq_id,
                          (long long)(pos0 + s->n_tokens), (long long)e->n_ctx);
            break;
        }
        int mode = s->sp.logits == WIRE_LOGITS_ALL ? 2 : (s->sample || s->sp.logits == WIRE_LOGITS_LAST) ? 1 : 0;
        if (bst && s->n_tokens == 1) {
            const bool g = dev && drow[i].take && !drow[i].mod_later;
            any_take |= g;
            if (g) {
                to_samp(&drow[i], &bsamp[nb]);
                any_samp |= samp_needed(&drow[i]);
            } else {
                to_samp(&(engine_drow){0}, &bsamp[nb]); /* its logits go to the host; its id is not used */
            }
            bst[nb] = st;
            btok[nb] = s->tokens[0];
            bseq[nb] = i;
            blog[nb++] = mode && !g ? logits[i] : NULL;
            continue;
        }
        if (mla_cmodel_forward(e->m, st, s->tokens, s->n_tokens, pos0, mode, logits[i], err))
            rc = mla_err_prefix(err, "seq %llu", (unsigned long long)s->seq_id);
    }
    if (rc == MLA_OK && nb > 0 &&
        mla_cmodel_decode_sample(e->m, bst, btok, nb, blog, any_samp ? bsamp : NULL, any_take ? bids : NULL, err))
        rc = mla_err_prefix(err, "decode step of %u sequences", nb);
    for (uint32_t b = 0; rc == MLA_OK && any_take && b < nb; b++) {
        const engine_drow *d = &drow[bseq[b]];
        if (!d->take || d->mod_later) continue;
        if (bids[b] < 0) /* its logits were not written: nothing to fall back on */
            rc = mla_errf(err, "seq %llu: no token of its row can be sampled (no finite logit%s)",
                          (unsigned long long)p->seqs[bseq[b]].seq_id, d->mod.allow ? " the mask allows" : "");
        else
            tokens[bseq[b]] = bids[b];
    }
    free(bst);
    free(btok);
    free(blog);
    free(bids);
    free(bseq);
    free(bsamp);
    return rc;
}

static int cu_step(engine *e, const wire_step_plan *p, float *const *logits, mla_err *err) {
    return cu_step_greedy(e, p, logits, NULL, NULL, err);
}

/* the rows that are not greedy are sampled where the greedy ones take their argmax
 * (kernels/sample_cuda.cu): wherever the model takes its tokens on the device */
static bool cu_dev_sample(const engine *e) { return mla_cmodel_device_argmax(e->m); }

/* engine.h queue: one-token rows at each sequence's next position, as one queued decode step;
 * rows whose mask comes later keep their settings here until queue_mods */
static int cu_queue(engine *e, const wire_step_plan *a, bool from_device, const engine_drow *drow, mla_err *err) {
    if (!mla_cmodel_batched(e->m)) return mla_errf(err, "the batched decode path is off (MLA_CUDA_BATCHED=0)");
    const uint32_t n = a->n_seqs ? a->n_seqs : 1;
    mla_cstate **st = mla_xmalloc(n * sizeof *st);
    int32_t *tok = mla_xmalloc(n * sizeof *tok);
    mla_cmodel_samp *samp = drow ? mla_xmalloc(n * sizeof *samp) : NULL;
    bool any_samp = false, later = false;
    int rc = MLA_OK;
    for (uint32_t i = 0; i < a->n_seqs && rc == MLA_OK; i++) {
        const wire_seq *s = &a->seqs[i];
        if (!(st[i] = get_state(e, s->seq_id, err))) {
            rc = MLA_ERR;
        } else if (s->n_tokens != 1 || s->positions[0] != mla_cstate_n_past(st[i])) {
            rc = mla_errf(err, "seq %llu: a queued row of %u tokens at position %d, but its cache holds %lld",
                          (unsigned long long)s->seq_id, s->n_tokens, s->positions[0],
                          (long long)mla_cstate_n_past(st[i]));
        } else if ((int64_t)s->positions[0] + 1 > mla_cstate_covered(st[i])) {
            rc = mla_errf(err, "seq %llu: no block for position %d yet (the table covers %lld)",
                          (unsigned long long)s->seq_id, s->positions[0], (long long)mla_cstate_covered(st[i]));
        } else if (drow && !drow[i].take) {
            rc = mla_errf(err, "seq %llu: a queued row must take its token on the device", (unsigned long long)s->seq_id);
        } else {
            tok[i] = s->tokens[0];
            if (drow) {
                to_samp(&drow[i], &samp[i]);
                any_samp |= samp_needed(&drow[i]);
                later |= drow[i].mod_later;
            }
        }
    }
    if (rc == MLA_OK) {
        if (later) { /* the settings without the masks and biases, kept for queue_mods */
            if (a->n_seqs > e->qcap) {
                e->qcap = a->n_seqs;
                e->qsamp = mla_xrealloc(e->qsamp, e->qcap * sizeof *e->qsamp);
                e->qlater = mla_xrealloc(e->qlater, e->qcap * sizeof *e->qlater);
            }
            memcpy(e->qsamp, samp, a->n_seqs * sizeof *samp);
            for (uint32_t i = 0; i < a->n_seqs; i++) e->qlater[i] = drow[i].mod_later;
            e->qn = a->n_seqs;
        }
        if (mla_cmodel_decode_queue_sample(e->m, st, from_device ? NULL : tok, a->n_seqs, any_samp ? samp : NULL,
                                           later, err))
            rc = mla_err_prefix(err, "queued decode step of %u sequences", a->n_seqs);
    }
    free(st);
    free(tok);
    free(samp);
    return rc;
}

static int cu_queue_mods(engine *e, const sample_mod *mods, mla_err *err) {
    for (uint32_t i = 0; i < e->qn; i++) { /* the rows whose mask came later (engine.h) */
        if (!e->qlater[i]) continue;
        mla_cmodel_samp *q = &e->qsamp[i];
        q->allow = mods ? mods[i].allow : NULL;
        q->bias_ids = mods ? mods[i].bias_ids : NULL;
        q->bias_vals = mods ? mods[i].bias_vals : NULL;
        q->n_bias = mods ? mods[i].n_bias : 0;
    }
    return mla_cmodel_decode_queue_samp(e->m, e->qsamp, err);
}

static int cu_wait_queued(engine *e, int32_t *tokens, mla_err *err) {
    return mla_cmodel_decode_wait(e->m, tokens, err);
}

static int cu_bench_fill(engine *e, uint64_t id, uint32_t n_past, const uint32_t *blocks, uint32_t n_blocks,
                         mla_err *err) {
    mla_cstate *st = get_state(e, id, err);
    if (!st) return MLA_ERR;
    if ((int64_t)n_past >= e->n_ctx)
        return mla_errf(err, "seq %llu: cannot fill %u positions, the context is %lld", (unsigned long long)id, n_past,
                        (long long)e->n_ctx);
    if (mla_cstate_set_blocks(st, 0, blocks, n_blocks, err)) return mla_err_prefix(err, "seq %llu", (unsigned long long)id);
    return mla_cstate_bench_fill(st, n_past, err);
}

static int cu_bench_coll(engine *e, size_t n, int iters, double *sec_per_op, mla_err *err) {
    return mla_cmodel_bench_coll(e->m, n, iters, sec_per_op, err);
}

static void cu_free_seq(engine *e, uint64_t id) {
    for (size_t i = 0; i < e->n; i++)
        if (e->seqs[i].id == id) {
            mla_cstate_free(e->seqs[i].st);
            e->seqs[i] = e->seqs[--e->n];
            return;
        }
}

static void cu_destroy(engine *e) {
    if (!e) return;
    uint64_t n = 0;
    double busy = 0, between = 0;
    if (e->m) mla_cmodel_decode_time(e->m, &n, &busy, &between);
    if (n > 0)
        MLA_INFO("decode steps on the device (graph replays): %llu, %.3f ms each on average; %.1f ms between "
                 "them (%.1f%% of their span: waiting for the host, other steps, pauses between requests)",
                 (unsigned long long)n, busy * 1e3 / (double)n, between * 1e3, 100.0 * between / (busy + between));
    for (size_t i = 0; i < e->n; i++) mla_cstate_free(e->seqs[i].st);
    free(e->seqs);
    free(e->qsamp);
    free(e->qlater);
    mla_cmodel_free(e->m);
    if (e->nccl) coll_free(e->nccl);
    if (e->g) gguf_close(e->g);
    free(e);
}

static void cu_backend_config(const engine *e, wire_backend_cfg *out) {
    const mla_cuda_config *c = &e->cfg;
    *out = (wire_backend_cfg){.arch = (uint32_t)c->arch,
                              .arch_as = (uint32_t)c->arch_as,
                              .attn_smem = (uint32_t)c->attn_smem,
                              .smem_cap = (uint32_t)c->smem_cap,
                              .smem_dev = (uint32_t)c->smem_dev,
                              .wgmma = c->wgmma};
    snprintf(out->attention, sizeof out->attention, "%s", mla_cuda_config_attn(c));
}

static int cu_mem_info(engine *e, uint64_t *free_bytes, uint64_t *total_bytes) {
    (void)e; /* the device is the thread's current one (mla_cuda_init in cu_load) */
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
        cudaGetLastError();
        return MLA_ERR;
    }
    *free_bytes = f;
    *total_bytes = t;
    return MLA_OK;
}

static void cu_decode_time(const engine *e, uint64_t *steps, double *seconds) {
    double between = 0;
    *steps = 0;
    *seconds = 0;
    if (e->m) mla_cmodel_decode_time(e->m, steps, seconds, &between);
}

int engine_cuda_devices(void) { return mla_cuda_device_count(); }

const engine_ops engine_cuda_ops = {.name = "cuda",
                                    .model_hash = cu_model_hash,
                                    .load = cu_load,
                                    .kv_pool = cu_kv_pool,
                                    .set_tables = cu_set_tables,
                                    .n_vocab = cu_vocab,
                                    .step = cu_step,
                                    .free_seq = cu_free_seq,
                                    .destroy = cu_destroy,
                                    .bench_fill = cu_bench_fill,
                                    .bench_coll = cu_bench_coll,
                                    .step_greedy = cu_step_greedy,
                                    .dev_sample = cu_dev_sample,
                                    .queue = cu_queue,
                                    .queue_mods = cu_queue_mods,
                                    .wait_queued = cu_wait_queued,
                                    .mem_info = cu_mem_info,
                                    .decode_time = cu_decode_time,
                                    .backend_config = cu_backend_config};

#else /* no CUDA in this build */

static int nc_hash(const char *path, uint64_t *hash, mla_err *err) {
    gguf_ctx *g;
    if (gguf_open(&g, path, err)) return MLA_ERR;
    *hash = gguf_index_hash(g);
    gguf_close(g);
    return MLA_OK;
}
static int nc_load(engine **out, const char *path, int rank, int world, coll *c, const engine_boot *boot,
                   const engine_opts *eo, mla_err *err) {
    (void)path, (void)rank, (void)world, (void)c, (void)boot, (void)eo;
    *out = NULL;
    return mla_errf(err, "--backend cuda: this mlaserve was built without CUDA (configure with -DMLA_CUDA=ON)");
}
static uint32_t nc_vocab(const engine *e) { (void)e; return 0; }
static int nc_step(engine *e, const wire_step_plan *p, float *const *l, mla_err *err) {
    (void)e, (void)p, (void)l;
    return mla_errf(err, "no CUDA");
}
static void nc_free_seq(engine *e, uint64_t id) { (void)e, (void)id; }
static void nc_destroy(engine *e) { (void)e; }
int engine_cuda_devices(void) { return 0; }

static void nc_kv_pool(const engine *e, engine_kv_pool *out) {
    (void)e;
    memset(out, 0, sizeof *out);
}
static int nc_set_tables(engine *e, const wire_step_plan *p, mla_err *err) {
    (void)e, (void)p;
    return mla_errf(err, "no CUDA");
}
const engine_ops engine_cuda_ops = {.name = "cuda",
                                    .model_hash = nc_hash,
                                    .load = nc_load,
                                    .kv_pool = nc_kv_pool,
                                    .set_tables = nc_set_tables,
                                    .n_vocab = nc_vocab,
                                    .step = nc_step,
                                    .free_seq = nc_free_seq,
                                    .destroy = nc_destroy};

#endif
