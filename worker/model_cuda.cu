/* model_cuda: the CUDA forward pass (worker/model_cuda.h), step for step the CPU model of
 * worker/model.c (read that file for the meaning of every stage). */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>

#include "kernels/cuda_ops.h"
#include "kernels/allreduce_cuda.h"
#include "kernels/attn_prefill_cuda.h"

extern "C" {
#include "common/layer_tensors.h"
#include "common/loadprog.h"
#include "common/mla_switch.h"
#include "common/mla_log.h"
#include "common/shard_plan.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/quant.h"
#include "kernels/rope.h"
#include "worker/model_cuda.h"
}

#define CU(call, ...)                                                                                   \
    do {                                                                                                \
        cudaError_t cu_e_ = (call);                                                                     \
        if (cu_e_ != cudaSuccess) {                                                                     \
            mla_errf(err, __VA_ARGS__);                                                                 \
            return mla_err_prefix(err, "CUDA %s", cudaGetErrorString(cu_e_)), MLA_ERR;                   \
        }                                                                                               \
    } while (0)
#define TRY(call)                                                                                       \
    do {                                                                                                \
        if ((call) != MLA_OK) return MLA_ERR;                                                           \
    } while (0)

namespace {

struct dmat {
    uint32_t type = 0;
    void *d = nullptr;
    int64_t n_in = 0, n_out = 0;
};

struct dffn {
    dmat gate, up, down;
    bool skip = false;
};

struct dlayer {
    float *attn_norm, *ffn_norm, *q_a_norm, *kv_a_norm;
    dmat q_a, q_b, kv_a, o;
    void *kb, *vb; /* [Hl][KL][dn], [Hl][dv][KL]: float, or fp16 with m->kvb_f16 */
    void *kb_q8, *vb_q8; /* the same rows as the file's Q8_0 bytes, for decode steps (m->kvb_q8), or NULL */
    bool o_gather;
    int64_t o_r0, o_r1;
    dmat iq_b, ik, iproj;
    float *ik_norm_w, *ik_norm_b;
    bool dense, has_shexp;
    dffn ffn;
    dmat router;
    float *router_bias;
    mla_cuda_experts ex;
};

} // namespace

struct mla_cmodel {
    mla_config cfg;
    coll *c;
    coll *own_coll;
    int rank, world, device;
    bool exact;
    bool coll_dev; /* m->c takes device buffers on m->st (NCCL) */
    /* --allreduce oneshot (mla_cmodel_ar_oneshot): all-reduces of at most AR_ONESHOT_BYTES sum
     * every rank's ar_in through peer memory (a buffer copied there, or a sublayer's output written
     * there: ar_defer); ar.buf / ar.sig of the other ranks are their IPC mappings */
    bool ar_on;
    mla_ar_peers ar;
    float *ar_in;
    void *ar_sig;
    /* a step whose sublayer outputs fit ar_in and mla_cuda_ar_add_rmsnorm writes them there
     * (m->y is ar_in while step_body runs it: ar_defer): the all-reduce after a sublayer is left
     * pending (ar_pending) and the next norm sums, adds and norms in one launch (norm_h) */
    bool ar_defer, ar_pending;
    bool attn_tc;  /* attention on fp16 tensor cores (mla_cuda_attn_args.tensor_cores) */
    bool kvb_f16;  /* !exact: the absorbed k_b / v_b in fp16 (mla_cuda_head_matmul_f16) */
    /* !exact: where the file's attn_k_b / attn_v_b are Q8_0, decode steps of up to 8 tokens read
     * those bytes (mla_cuda_head_matmul_q8). Decode steps whose v_b reads them combine the
     * attention's splits in v_b's prologue (mla_cuda_head_matmul_q8_comb, vb_comb_max); those of
     * a q-LoRA model whose k_b reads them write the cache rows in the q-LoRA norm's launch and
     * rotate the queries' k_pe in k_b (mla_cuda_qnorm_kv_rows, mla_cuda_head_matmul_q8_rope,
     * kv_merged). */
    bool kvb_q8;
    /* Prompt steps of one sequence (mla_cmodel_forward) of at least pf_min tokens (MLA_CUDA_PREFILL_MIN)
     * take the attention in the non-absorbed form (kernels/attn_prefill_cuda.h) where pf_ok: the
     * tensor-core attention over the fp16 cache, a shape with a kernel, no DSA selection in the
     * step. pf_tab: the step's sequence's device block table while mla_cmodel_forward runs it
     * (NULL otherwise: batched steps keep the absorbed kernels), pf_pos0 its first position (the
     * DSA indexer's prompt scores take them too: mla_cuda_dsa_scores_paged_h);
     * pf_work: the decompressed keys and values of a group of heads (ensure_scratch). */
    bool pf_ok;
    int pf_min;
    const float *const *pf_tab;
    int64_t pf_pos0;
    void *pf_work;
    size_t pf_work_bytes;
    uint64_t n_pf; /* layer attentions that took it */
    bool split;    /* !exact: split-bf16 (3 MMAs) rather than plain bf16 tensor cores */
    bool q8;       /* int8 activations for quantized weights: GEMV (dp4a) up to Q8_TMAX tokens, int8 mma above */
    int64_t max_in; /* the widest matmul input: sizes q8buf */
    void *q8buf;    /* [cap_T] rows of max_in, mla_cuda_q8_bytes */
    /* Decode-step fusions: the residual add and the q8 quantization into the norms, the cache
     * side of the attention in one kernel, two products of one input (and gate / up with swiglu)
     * in one GEMV. A MoE layer's shared expert runs on st2 beside the router and its routing on
     * st, and a DSA layer's indexer on st2 beside q_b and k_b (forked and joined by the events:
     * inside a captured graph, two branches). */
    cudaStream_t st2;
    cudaEvent_t ev_fork, ev_join;
    void *q8h, *q8c; /* q8 buffers of m->h ([cap_T][n_embd]) and of m->cq ([cap_T][q_lora]), made by the norms */
    bool mmh;       /* quantized weights on the fp16 tensor cores above gemv_tmax tokens (mla_cuda_matmul_h) */
    int gemv_tmax;  /* with mmh: the integer GEMV up to this many tokens a step (MLA_CUDA_GEMV_TMAX) */
    void *xhbuf;    /* [cap_T] rows of max_in, mla_cuda_act_h_bytes */
    void *hh;       /* m->h's fp16 buffer ([cap_T] rows of n_embd, mla_cuda_act_h_bytes), made by the norms */
    bool hh_ok;     /* hh holds the fp16 rows of what m->h holds (norm_h16) */
    int moe_mmh_min; /* with mmh: the routed experts too, from this many pairs a expert (MLA_MOE_MMH_MIN) */
    int64_t h0, h1, Hl;
    rope_table rope;
    dmat tok_embd, output;
    float *out_norm;
    int64_t out_r0, out_r1;
    bool out_split;
    dlayer *L;
    cudaStream_t st;
    uint64_t wbytes;
    void **allocs;
    size_t n_allocs, cap_allocs;
    /* scratch for up to cap_T tokens */
    int64_t cap_T, cap_keys, cap_out; /* cap_out: rows of logits */
    /* x2: the residual stream's second buffer (norm_h); cqr: q_a's output before its norm (cq) */
    float *x, *x2, *h, *y, *cq, *cqr, *q, *kva, *qabs, *ol, *o, *full, *part, *g, *u, *iq, *iw, *rl, *rw, *scores,
        *attn_work, *logit_dev, *topk_work;
    size_t attn_work_floats;
    int32_t *tok, *rid, *sel, *nsel;
    void *moe_work;
    size_t moe_work_bytes;
    float *hbuf;   /* pinned host staging */
    size_t hbuf_floats;
    float *hbuf2;
    float *dgbuf;  /* device gather buffer (hbuf_floats) when coll_dev */
    int32_t *htok;
    int32_t *dids, *hids; /* [cap_T] greedy ids of a decode step (mla_cmodel_decode_greedy) */
    /* the step block holds everything a step of T tokens changes (step_layout), so that a
     * captured graph replays with new data; uploaded with one copy from its pinned mirror */
    uint8_t *dstep, *hstep;
    size_t step_bytes;
    float *kvn, *ikn; /* [cap_T][kv row], [cap_T][indexer head dim]: a step's new cache rows */
    bool batched;     /* MLA_CUDA_BATCHED != 0: single-token steps take the batched path */
    bool graphs;      /* MLA_CUDA_GRAPHS != 0 and capture is possible (one rank or NCCL) */
    bool graphs_required; /* MLA_CUDA_GRAPHS=require: a failed capture is an error, not a fall-back */
    struct dgraph {
        int64_t B, max_keys;
        int seen;             /* eager runs so far: capture on the second */
        cudaGraphExec_t exec; /* NULL until captured */
        uint64_t used;
    } gr[8];
    uint64_t gr_tick;
    uint64_t n_graph_launch, n_graph_capture;
    /* the device's time in decode steps and between them (mla_cmodel_decode_time): a pair of
     * timing events a step (tstep_open: what the pair spans, which steps are timed); a ring of
     * four, as at most three steps are open at once (two queued, one being launched) */
    cudaEvent_t tev[4][2];
    int tev_next, tev_last; /* the next pair; the pair of the last step closed (-1: none) */
    int tev_cur, tev_prev;  /* the step decode_launch opened, and the one closed before it */
    bool replayed;          /* decode_run's step was a replay of a captured graph */
    uint64_t dt_steps;
    double dt_busy, dt_between;
    /* the paged latent cache (kernels/cuda_ops.h MLA_CUDA_KV_BLOCK): n_pool blocks of blk_floats
     * floats (every layer's kv rows, fp16 with kv_f16, then every layer's indexer key rows) in one
     * allocation made by mla_cmodel_kv_init; which block holds what is the block tables' business
     * (the coordinator's scheduler assigns them) */
    bool kv_f16; /* the blocks' latent rows in fp16 (mla_cuda_kv_f16: MLA_CUDA_KV) */
    size_t blk_floats;
    float *pool;
    int64_t n_pool;
    int64_t max_ctx; /* the positions a state's table can cover (mla_cmodel_kv_init) */
    size_t scratch_bytes; /* device bytes of the step scratch (dmalloc) */
    /* the last decode step whose greedy ids are in dids: its states, in order (last_B 0: none) */
    mla_cstate **last_st;
    int64_t last_B, last_cap;
    /* queued decode steps (mla_cmodel_decode_queue), oldest first: rows, pinned slot (its step
     * block hsq and ids hq, cap_q tokens each) and the event after its ids' copy */
    struct qstep {
        int64_t B;
        int slot;
        bool failed; /* its sampling could not be queued: waiting for it syncs and fails */
        int tp, tprev; /* its pair of timing events and the step's before it (tstep_open) */
    } qs[2];
    int nq, qnext;
    uint8_t *hsq[2];
    int32_t *hq[2];
    cudaEvent_t qev[2];
    int64_t cap_q;
    /* device sampling (mla_cmodel_decode_sample): a step's row settings, biases and masks staged
     * in pinned memory (one stage a queue slot, the last for the step run now) and uploaded with
     * one copy to dsamp, which the steps share in stream order; pend: the newest queued step
     * waits for its sampling (mla_cmodel_decode_queue_samp) */
    struct sstage {
        uint8_t *h;
        size_t cap;
    } ss[3];
    uint8_t *dsamp;
    size_t dsamp_cap;
    bool pend;
    int pend_slot;
    int64_t pend_B;
};

struct mla_cstate {
    mla_cmodel *m;
    int64_t n_ctx, n_past, n_layer, kv_row, ik_row;
    float **tab_h;     /* the block table (host copy), cap_blk entries, n_blk used */
    float **tab_d;     /* its device copy (what the kernels read) */
    int64_t n_blk, cap_blk;
};

/* The step block of a step of T tokens: tok [T], pos [T], tabs [T] (each token's sequence's
 * device block table), back to back. */
struct step_off {
    size_t pos, tabs, total;
};
static step_off step_layout(int64_t T) {
    step_off o;
    o.pos = (size_t)T * 4;
    o.tabs = (o.pos + (size_t)T * 4 + 15) / 16 * 16;
    o.total = o.tabs + (size_t)T * sizeof(float **);
    return o;
}

static void graphs_clear(mla_cmodel *m) {
    for (auto &g : m->gr) {
        if (g.exec) cudaGraphExecDestroy(g.exec);
        g = mla_cmodel::dgraph{};
    }
}

static int dalloc(mla_cmodel *m, void **p, size_t n, mla_err *err) {
    CU(cudaMalloc(p, n ? n : 16), "cudaMalloc %zu bytes", n);
    if (m->n_allocs == m->cap_allocs) {
        m->cap_allocs = m->cap_allocs ? 2 * m->cap_allocs : 256;
        m->allocs = (void **)mla_xrealloc(m->allocs, m->cap_allocs * sizeof *m->allocs);
    }
    m->allocs[m->n_allocs++] = *p;
    m->wbytes += n;
    return MLA_OK;
}

static int up_bytes(mla_cmodel *m, void **d, const void *h, size_t n, size_t alloc, mla_err *err) {
    TRY(dalloc(m, d, alloc > n ? alloc : n, err));
    CU(cudaMemcpy(*d, h, n, cudaMemcpyHostToDevice), "upload %zu bytes", n);
    return MLA_OK;
}

static int up_f32(mla_cmodel *m, float **d, const gguf_tensor *t, mla_err *err) {
    *d = nullptr;
    if (!t) return MLA_OK;
    MLA_ASSERT(t->type == GGML_TYPE_F32);
    size_t n = 1;
    for (uint32_t i = 0; i < t->n_dims; i++) n *= (size_t)t->ne[i];
    return up_bytes(m, (void **)d, t->data, n * 4, 0, err);
}

/* Packs the rows of a view back to back (column views included) and uploads them. */
static int up_mat(mla_cmodel *m, dmat *d, const mla_mat *v, mla_err *err) {
    if (!mla_cuda_quant_supported(v->type))
        return mla_errf(err, "type %s has no CUDA kernels", ggml_type_name(v->type));
    size_t rb = ggml_row_bytes(v->type, v->n_in), n = rb * (size_t)v->n_out;
    uint8_t *h = (uint8_t *)mla_xmalloc(n ? n : 1);
    for (int64_t r = 0; r < v->n_out; r++) memcpy(h + (size_t)r * rb, v->data + (size_t)r * v->row_stride, rb);
    int rc = up_bytes(m, &d->d, h, n, mla_cuda_weight_bytes(v->type, v->n_in, v->n_out) + 16, err);
    free(h);
    d->type = v->type;
    d->n_in = v->n_in;
    if (v->n_in > m->max_in) m->max_in = v->n_in;
    d->n_out = v->n_out;
    return rc;
}

static mla_mat mat_of(const gguf_tensor *t) { return mla_mat_make(t->type, t->data, t->ne[0], t->ne[1]); }

static mla_mat shard_mat(const shard_plan *p, const gguf_tensor *t) {
    mla_mat m = mat_of(t);
    const shard_entry *e = shard_plan_find(p, t->name);
    MLA_ASSERT(e);
    if (e->kind == SHARD_ROWS) return mla_mat_rows(&m, e->begin, e->end);
    if (e->kind == SHARD_COLS) return mla_mat_cols(&m, e->begin, e->end);
    return m;
}

static int load_ffn(mla_cmodel *m, dffn *f, const shard_plan *p, const gguf_tensor *gt, const gguf_tensor *ut,
                    const gguf_tensor *dt, mla_err *err) {
    const shard_entry *eg = shard_plan_find(p, gt->name), *ed = shard_plan_find(p, dt->name);
    MLA_ASSERT(eg && ed);
    bool r0 = eg->rank0_only || ed->rank0_only;
    f->skip = r0 && m->rank != 0;
    if (f->skip) return MLA_OK; /* this rank adds zero: nothing to upload */
    mla_mat g = r0 ? mat_of(gt) : shard_mat(p, gt), u = r0 ? mat_of(ut) : shard_mat(p, ut),
            d = r0 ? mat_of(dt) : shard_mat(p, dt);
    TRY(up_mat(m, &f->gate, &g, err));
    TRY(up_mat(m, &f->up, &u, err));
    TRY(up_mat(m, &f->down, &d, err));
    return MLA_OK;
}

/* This rank's experts of a 3-D expert tensor, packed in increasing expert order. */
static int up_experts(mla_cmodel *m, const gguf_tensor *t, const void **d, size_t *estride, mla_err *err) {
    if (!mla_cuda_quant_supported(t->type))
        return mla_errf(err, "%s: type %s has no CUDA kernels", t->name, ggml_type_name(t->type));
    size_t sb = ggml_row_bytes(t->type, t->ne[0]) * (size_t)t->ne[1];
    int64_t X = t->ne[2], nown = 0;
    for (int64_t e = m->rank; e < X; e += m->world) nown++;
    uint8_t *h = (uint8_t *)mla_xmalloc(sb * (size_t)(nown ? nown : 1));
    int64_t k = 0;
    for (int64_t e = m->rank; e < X; e += m->world) memcpy(h + sb * (size_t)k++, t->data + sb * (size_t)e, sb);
    void *dp;
    int rc = up_bytes(m, &dp, h, sb * (size_t)nown, sb * (size_t)nown + 32, err);
    free(h);
    *d = dp;
    *estride = sb;
    return rc;
}

/* Per-head float matrices of this rank's heads: kb [Hl][KL][dn], vb [Hl][dv][KL]. */
static int up_kv_b(mla_cmodel *m, dlayer *l, const gguf_tensor *kbt, const gguf_tensor *vbt, const gguf_tensor *kvbt,
                   mla_err *err) {
    const mla_config *c = &m->cfg;
    const int64_t dn = c->head_nope, dv = c->head_v, KL = c->kv_lora_rank, Hl = m->Hl;
    float *kb = (float *)mla_xmalloc((size_t)(Hl * KL * dn) * sizeof(float));
    float *vb = (float *)mla_xmalloc((size_t)(Hl * dv * KL) * sizeof(float));
    for (int64_t h = 0; h < Hl; h++) {
        const int64_t hg = m->h0 + h;
        if (kbt) {
            mla_mat k = mla_mat_slice(kbt->type, kbt->data, dn, KL, hg);
            for (int64_t r = 0; r < KL; r++) quant_dequant_row(k.type, k.data + (size_t)r * k.row_stride, kb + (h * KL + r) * dn, dn);
            mla_mat v = mla_mat_slice(vbt->type, vbt->data, KL, dv, hg);
            for (int64_t r = 0; r < dv; r++) quant_dequant_row(v.type, v.data + (size_t)r * v.row_stride, vb + (h * dv + r) * KL, KL);
        } else {
            mla_mat kvb = mat_of(kvbt);
            float *row = (float *)mla_xmalloc((size_t)KL * sizeof(float));
            for (int64_t o = 0; o < dn; o++) {
                quant_dequant_row(kvb.type, kvb.data + (size_t)(hg * (dn + dv) + o) * kvb.row_stride, row, KL);
                for (int64_t cc = 0; cc < KL; cc++) kb[(h * KL + cc) * dn + o] = row[cc];
            }
            for (int64_t o = 0; o < dv; o++)
                quant_dequant_row(kvb.type, kvb.data + (size_t)(hg * (dn + dv) + dn + o) * kvb.row_stride,
                                  vb + (h * dv + o) * KL, KL);
            free(row);
        }
    }
    const size_t nk = (size_t)(Hl * KL * dn), nv = (size_t)(Hl * dv * KL);
    int rc;
    if (m->kvb_f16) { /* in place: the halves fill the front of the float buffers */
        __half *hk = (__half *)kb, *hv = (__half *)vb;
        for (size_t i = 0; i < nk; i++) hk[i] = __float2half_rn(kb[i]);
        for (size_t i = 0; i < nv; i++) hv[i] = __float2half_rn(vb[i]);
        rc = up_bytes(m, &l->kb, hk, nk * 2, 0, err);
        if (rc == MLA_OK) rc = up_bytes(m, &l->vb, hv, nv * 2, 0, err);
    } else {
        rc = up_bytes(m, &l->kb, kb, nk * 4, 0, err);
        if (rc == MLA_OK) rc = up_bytes(m, &l->vb, vb, nv * 4, 0, err);
    }
    free(kb);
    free(vb);
    /* the file's Q8_0 rows of this rank's heads as they are (a head's rows are contiguous) */
    if (rc == MLA_OK && kbt && m->kvb_q8 && kbt->type == GGML_TYPE_Q8_0 && vbt->type == GGML_TYPE_Q8_0 &&
        mla_cuda_head_q8_supported(dn, KL) && mla_cuda_head_q8_supported(KL, dv)) {
        const mla_mat k = mla_mat_slice(kbt->type, kbt->data, dn, KL, m->h0);
        const mla_mat v = mla_mat_slice(vbt->type, vbt->data, KL, dv, m->h0);
        const size_t kn = (size_t)(Hl * KL) * k.row_stride, vn = (size_t)(Hl * dv) * v.row_stride;
        rc = up_bytes(m, &l->kb_q8, k.data, kn, kn + 16, err);
        if (rc == MLA_OK) rc = up_bytes(m, &l->vb_q8, v.data, vn, vn + 16, err);
    }
    return rc;
}

extern "C" void *mla_cmodel_stream(const mla_cmodel *m) { return (void *)m->st; }
extern "C" bool mla_cmodel_attn_tc(const mla_cmodel *m) { return m->attn_tc; }

/* With m->q8, quantized weights take the integer GEMV for steps of up to this many tokens (it
 * passes over W once per 8 tokens), the int8 tensor cores above. H200, Q4_K 7168 -> 2048: GEMV
 * 128 us at T = 64 and 250 at 128, int8 tensor cores ~210 at both
 * (measured on an H200, 2026-11-29). */
#define Q8_TMAX 96
/* The non-absorbed prompt attention's work area holds at least this much (ensure_scratch): a
 * chunk after a long prefix takes groups of heads of this size, and a group must keep the GPU
 * busy (its grid is the step's 128-row tiles times the group's heads): 1 GiB is 12 of V3's heads
 * at 160k keys, 16 MiB a head at 32k. */
#define PF_WORK_MIN ((size_t)1 << 30)
/* With m->mmh, the weights the fp16 tensor cores take (mla_cuda_mmh_supported) keep the integer
 * GEMV up to m->gemv_tmax tokens a step, the tensor cores above: 8, the default of
 * MLA_CUDA_GEMV_TMAX (common/mla_switch.c). There steps of up to 64 tokens split K over ~512
 * blocks, one pass over W for any batch, where the GEMV makes one per 8 tokens. H200 at 8
 * tokens: 18432 x 7168 Q4_K 91 us either way, 7168 x 16384 Q8_0 88 against 126, GLM-5's Q6_K
 * output matrix 603 against 1100; at 16 the tensor cores win everywhere
 * (measured on an H200, 2026-11-30). The routed experts of a step take them from
 * m->moe_mmh_min (token, expert) pairs a expert on average, 8 (the default of MLA_MOE_MMH_MIN),
 * the grouped integer GEMV below. H200, V3 experts (256 x 2048 x 7168, Q4_K): 4 a expert 7.5 ms
 * against the GEMV's 5.1; 8 a expert 7.6 against 8.1; 16 a expert 7.8 against 15.5
 * (measured on an H200, 2026-11-30). */

extern "C" int mla_cmodel_load(mla_cmodel **out, const gguf_ctx *g, coll *c, const mla_cmodel_opts *opts,
                               mla_err *err) {
    *out = nullptr;
    loadprog_begin(g);
    mla_cmodel *m = (mla_cmodel *)mla_xcalloc(1, sizeof *m);
    if (!c) c = m->own_coll = coll_single_new();
    m->c = c;
    m->rank = c->rank;
    m->world = c->world;
    m->device = opts ? opts->device : 0;
    m->exact = opts && opts->exact;
    m->coll_dev = opts && opts->coll_on_device;
    m->split = opts && opts->split;
    {
        /* the switches of common/mla_switch.c (values checked at start-up) */
        const char *gr = mla_sw_str(MLA_SW_CUDA_GRAPHS);
        m->batched = mla_sw_bool(MLA_SW_CUDA_BATCHED);
        /* a graph cannot hold the host collective's synchronisations: one rank, or NCCL */
        m->graphs = m->batched && !(gr && !strcmp(gr, "0")) && (m->world == 1 || m->coll_dev);
        m->graphs_required = m->graphs && gr && !strcmp(gr, "require");
        /* the integer GEMV: on with the tensor-core modes, off with exact; MLA_CUDA_Q8=0|1 decides */
        const char *q8 = mla_sw_str(MLA_SW_CUDA_Q8);
        m->q8 = q8 ? !strcmp(q8, "1") : !m->exact;
        /* prompts on the fp16 tensor cores: on unless exact */
        m->mmh = !m->exact;
        m->moe_mmh_min = (int)mla_sw_int(MLA_SW_MOE_MMH_MIN);
        m->gemv_tmax = (int)mla_sw_int(MLA_SW_CUDA_GEMV_TMAX);
        /* attention on fp16 tensor cores: on unless exact; MLA_CUDA_ATTN=tc|fp32 decides */
        const int attn_fp32 = mla_cuda_attn_fp32(m->exact, err);
        if (attn_fp32 < 0) {
            mla_cmodel_free(m);
            return MLA_ERR;
        }
        m->attn_tc = !attn_fp32;
        /* the streamed decode GEMV of Q4_K / Q6_K / Q8_0 / Q5_0 and its tensor-core form for dense
         * steps of MLA_CUDA_GEMVM_TMIN (the switch, default 2) to 16 tokens (both process-wide) */
        mla_cuda_set_gemv_stream(MLA_CUDA_GEMVS_DENSE, MLA_CUDA_GEMVS_GROUPED);
        mla_cuda_set_gemv_mma((int)mla_sw_int(MLA_SW_CUDA_GEMVM_TMIN), MLA_CUDA_GEMVM_TMAX);
        mla_cuda_set_gemv_mma_grouped((int)mla_sw_int(MLA_SW_CUDA_GEMVM_GRP));
        m->kvb_f16 = !m->exact;
        m->kvb_q8 = !m->exact;
    }
    shard_plan plan;
    memset(&plan, 0, sizeof plan);
    const mla_config *cf = &m->cfg;
    if (mla_cuda_init(m->device, err) < 0) goto fail;
    if (cudaStreamCreateWithFlags(&m->st, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&m->st2, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&m->ev_fork, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&m->ev_join, cudaEventDisableTiming) != cudaSuccess) {
        mla_errf(err, "cudaStreamCreate / cudaEventCreate failed");
        goto fail;
    }
    m->tev_last = -1;
    for (auto &pr : m->tev)
        for (auto &ev : pr)
            if (cudaEventCreate(&ev) != cudaSuccess) {
                mla_errf(err, "cudaEventCreate failed (step timing)");
                goto fail;
            }
    if (mla_config_from_gguf(&m->cfg, g, err) < 0 || mla_config_check_tensors(&m->cfg, g, err) < 0 ||
        mla_config_check_types(&m->cfg, g, mla_cuda_quant_supported, "CUDA", err) < 0)
        goto fail;
    if (cf->n_rope > ROPE_MAX_DIMS) {
        mla_errf(err, "rope dims %lld exceed %d", (long long)cf->n_rope, ROPE_MAX_DIMS);
        goto fail;
    }
    if (cf->kv_lora_rank > 1024 || cf->head_nope > 1024 || cf->n_rope > 128 || (cf->idx_n_head > 0 && cf->idx_head_dim > 256)) {
        mla_errf(err, "model dimensions outside the CUDA kernels' limits (kv_lora <= 1024, rope <= 128, indexer head <= 256)");
        goto fail;
    }
    if (shard_plan_for_model(&plan, g, cf, m->rank, m->world, err) < 0) goto fail;
    {
        const int kf = mla_cuda_kv_f16(cf->kv_lora_rank + cf->n_rope, !m->attn_tc, err);
        if (kf < 0) goto fail;
        m->kv_f16 = kf == 1;
    }
    m->pf_min = (int)mla_sw_int(MLA_SW_CUDA_PREFILL_MIN);
    m->pf_ok = m->attn_tc && m->kv_f16 &&
               mla_cuda_prefill_supported(cf->kv_lora_rank, cf->n_rope, cf->head_nope, cf->head_v);
    /* indexer keys: fp16 where the latent cache is ((idx_head_dim + 1) / 2 floats a row), else fp32 */
    m->blk_floats = (size_t)(cf->n_layer * MLA_CUDA_KV_BLOCK) *
                    (size_t)((cf->kv_lora_rank + cf->n_rope) / (m->kv_f16 ? 2 : 1) +
                             (cf->idx_n_head > 0 ? m->kv_f16 ? (cf->idx_head_dim + 1) / 2 : cf->idx_head_dim : 0));
    m->h0 = cf->n_head * m->rank / m->world;
    m->h1 = cf->n_head * (m->rank + 1) / m->world;
    m->Hl = m->h1 - m->h0;
    rope_table_for_model(&m->rope, cf);
    {
        mla_mat te = mat_of(gguf_find_tensor(g, "token_embd.weight"));
        if (up_mat(m, &m->tok_embd, &te, err) < 0) goto fail;
        if (up_f32(m, &m->out_norm, gguf_find_tensor(g, "output_norm.weight"), err) < 0) goto fail;
        const gguf_tensor *ot = gguf_find_tensor(g, "output.weight");
        const shard_entry *e = shard_plan_find(&plan, ot->name);
        mla_mat om = mat_of(ot);
        m->out_r0 = 0;
        m->out_r1 = cf->n_vocab;
        if (e->kind == SHARD_ROWS && m->world > 1) {
            m->out_split = true;
            m->out_r0 = e->begin;
            m->out_r1 = e->end;
            om = mla_mat_rows(&om, e->begin, e->end);
        }
        if (up_mat(m, &m->output, &om, err) < 0) goto fail;
    }
    m->L = (dlayer *)mla_xcalloc((size_t)cf->n_layer, sizeof *m->L);
    for (int64_t il = 0; il < cf->n_layer; il++) {
        loadprog_layers_done(g, il);
        dlayer *l = &m->L[il];
        layer_tensors lt;
        if (layer_tensors_find(cf, g, il, &lt, err) < 0) goto fail;
        mla_mat v;
#define UPF(dst, role) \
    if (up_f32(m, &(dst), lt.t[role], err) < 0) goto fail;
#define UPM(dst, view) \
    v = (view);        \
    if (up_mat(m, &(dst), &v, err) < 0) goto fail;
        UPF(l->attn_norm, LT_ATTN_NORM);
        UPF(l->ffn_norm, LT_FFN_NORM);
        UPF(l->kv_a_norm, LT_KV_A_NORM);
        UPM(l->kv_a, mat_of(lt.t[LT_KV_A]));
        if (cf->q_lora_rank > 0) {
            UPM(l->q_a, mat_of(lt.t[LT_Q_A]));
            UPF(l->q_a_norm, LT_Q_A_NORM);
            UPM(l->q_b, shard_mat(&plan, lt.t[LT_Q_B]));
        } else {
            UPM(l->q_b, shard_mat(&plan, lt.t[LT_Q]));
        }
        if (up_kv_b(m, l, lt.t[LT_K_B], lt.t[LT_V_B],
                    lt.t[LT_KV_B], err) < 0)
            goto fail;
        {
            const gguf_tensor *ot = lt.t[LT_ATTN_OUT];
            const shard_entry *e = shard_plan_find(&plan, ot->name);
            UPM(l->o, shard_mat(&plan, ot));
            l->o_gather = e->gather_input;
            l->o_r0 = e->kind == SHARD_ROWS ? e->begin : 0;
            l->o_r1 = e->kind == SHARD_ROWS ? e->end : cf->n_embd;
            if (e->kind == SHARD_REPLICATE && m->world > 1) {
                mla_errf(err, "%s: replicated attn_output is not supported with %d ranks", ot->name, m->world);
                goto fail;
            }
        }
        if (cf->idx_n_head > 0) {
            UPM(l->iq_b, mat_of(lt.t[LT_IQ_B]));
            UPM(l->ik, mat_of(lt.t[LT_IK]));
            UPM(l->iproj, mat_of(lt.t[LT_IPROJ]));
            UPF(l->ik_norm_w, LT_IK_NORM_W);
            UPF(l->ik_norm_b, LT_IK_NORM_B);
        }
        l->dense = lt.dense;
        if (l->dense) {
            if (load_ffn(m, &l->ffn, &plan, lt.t[LT_FFN_GATE], lt.t[LT_FFN_UP],
                         lt.t[LT_FFN_DOWN], err) < 0)
                goto fail;
        } else {
            UPM(l->router, mat_of(lt.t[LT_ROUTER]));
            UPF(l->router_bias, LT_ROUTER_BIAS);
            const gguf_tensor *eg = lt.t[LT_EXP_GATE];
            const gguf_tensor *eu = lt.t[LT_EXP_UP];
            const gguf_tensor *ed = lt.t[LT_EXP_DOWN];
            mla_cuda_experts *x = &l->ex;
            x->gate_type = eg->type;
            x->up_type = eu->type;
            x->down_type = ed->type;
            if (up_experts(m, eg, &x->gate, &x->gate_estride, err) < 0 || up_experts(m, eu, &x->up, &x->up_estride, err) < 0 ||
                up_experts(m, ed, &x->down, &x->down_estride, err) < 0)
                goto fail;
            x->n_embd = cf->n_embd;
            x->n_ff = cf->n_ff_exp;
            x->n_expert = cf->n_expert;
            x->rank = m->rank;
            x->world = m->world;
            x->q8 = m->q8;
            x->mmh_min = m->mmh ? m->moe_mmh_min : 0;
            l->has_shexp = cf->n_expert_shared > 0;
            if (l->has_shexp &&
                load_ffn(m, &l->ffn, &plan, lt.t[LT_SHEXP_GATE],
                         lt.t[LT_SHEXP_UP], lt.t[LT_SHEXP_DOWN], err) < 0)
                goto fail;
        }
#undef UPF
#undef UPM
    }
    shard_plan_free(&plan);
    loadprog_finish();
    MLA_INFO("cuda model: rank %d/%d, %.1f MiB of weights on device %d", m->rank, m->world, m->wbytes / 1048576.0,
             m->device);
    *out = m;
    return MLA_OK;
fail:
    shard_plan_free(&plan);
    mla_cmodel_free(m);
    return MLA_ERR;
}

/* cudaMalloc that counts the scratch's device bytes (mla_cmodel_kv_init weighs them) */
static cudaError_t dmalloc(mla_cmodel *m, void **p, size_t n) {
    const cudaError_t e = cudaMalloc(p, n);
    if (e == cudaSuccess) m->scratch_bytes += n;
    return e;
}

static void free_scratch(mla_cmodel *m) {
    graphs_clear(m); /* they point into the scratch */
    m->scratch_bytes = 0;
    void *ps[] = {m->x, m->x2, m->h, m->y, m->cq, m->cqr, m->q, m->kva, m->qabs, m->ol, m->o, m->full, m->part, m->g, m->u, m->iq,
                  m->iw, m->rl, m->rw, m->scores, m->attn_work, m->logit_dev, m->tok, m->rid, m->sel, m->nsel,
                  m->topk_work, m->moe_work, m->dgbuf, m->dstep, m->kvn, m->ikn, m->q8buf, m->xhbuf, m->dids,
                  m->q8h, m->q8c, m->pf_work, m->hh};
    for (void *p : ps)
        if (p) cudaFree(p);
    if (m->hbuf) cudaFreeHost(m->hbuf);
    if (m->hbuf2) cudaFreeHost(m->hbuf2);
    if (m->htok) cudaFreeHost(m->htok);
    if (m->hids) cudaFreeHost(m->hids);
    m->dids = m->hids = nullptr;
    if (m->hstep) cudaFreeHost(m->hstep);
    m->dstep = m->hstep = nullptr;
    m->kvn = m->ikn = nullptr;
    m->x = m->x2 = m->h = m->y = m->cq = m->cqr = m->q = m->kva = m->qabs = m->ol = m->o = m->full = m->part = m->g = m->u = m->iq =
        m->iw = m->rl = m->rw = m->scores = m->attn_work = m->logit_dev = m->topk_work = nullptr;
    m->tok = m->rid = m->sel = m->nsel = nullptr;
    m->moe_work = nullptr;
    m->pf_work = nullptr;
    m->pf_work_bytes = 0;
    m->q8buf = m->xhbuf = m->q8h = m->q8c = m->hh = nullptr;
    m->hh_ok = false;
    m->dgbuf = nullptr;
    m->hbuf = m->hbuf2 = nullptr;
    m->htok = nullptr;
    m->cap_T = m->cap_keys = m->cap_out = 0;
}

static void queue_free(mla_cmodel *m) {
    for (int k = 0; k < 2; k++) {
        if (m->hsq[k]) cudaFreeHost(m->hsq[k]);
        if (m->hq[k]) cudaFreeHost(m->hq[k]);
        if (m->qev[k]) cudaEventDestroy(m->qev[k]);
        m->hsq[k] = nullptr;
        m->hq[k] = nullptr;
        m->qev[k] = nullptr;
    }
    m->cap_q = 0;
    for (auto &g : m->ss) {
        if (g.h) cudaFreeHost(g.h);
        g = mla_cmodel::sstage{};
    }
    if (m->dsamp) cudaFree(m->dsamp);
    m->dsamp = nullptr;
    m->dsamp_cap = 0;
}

extern "C" void mla_cmodel_free(mla_cmodel *m) {
    if (!m) return;
    if (m->st) cudaStreamSynchronize(m->st);
    queue_free(m);
    free(m->last_st);
    free_scratch(m);
    for (size_t i = 0; i < m->n_allocs; i++) cudaFree(m->allocs[i]);
    free(m->allocs);
    if (m->pool) cudaFree(m->pool);
    free(m->L);
    if (m->st) cudaStreamDestroy(m->st);
    if (m->st2) cudaStreamDestroy(m->st2);
    if (m->ev_fork) cudaEventDestroy(m->ev_fork);
    if (m->ev_join) cudaEventDestroy(m->ev_join);
    for (auto &pr : m->tev)
        for (auto &ev : pr)
            if (ev) cudaEventDestroy(ev);
    if (m->own_coll) coll_free(m->own_coll);
    for (int r = 0; r < MLA_AR_MAX_RANKS; r++) {
        if (r == m->rank) continue;
        if (m->ar.buf[r]) cudaIpcCloseMemHandle((void *)m->ar.buf[r]);
        if (m->ar.sig[r]) cudaIpcCloseMemHandle(m->ar.sig[r]);
    }
    if (m->ar_in) cudaFree(m->ar_in);
    if (m->ar_sig) cudaFree(m->ar_sig);
    free(m);
}

extern "C" const mla_config *mla_cmodel_config(const mla_cmodel *m) { return &m->cfg; }
extern "C" uint64_t mla_cmodel_weight_bytes(const mla_cmodel *m) { return m->wbytes; }

/* ---------------------------------------------------------------- paged cache */

static int ensure_scratch(mla_cmodel *m, int64_t T, int64_t keys, int64_t nout, mla_err *err);

/* The largest pool that fits: util of the device's memory in all (what the weights and the
 * scratch already hold counted in), less a margin for what comes later (graphs, library
 * workspaces), at most cap_bytes (0: no cap), in whole blocks. */
static int64_t pool_blocks(size_t free_b, size_t total_b, double util, int k, double own, uint64_t cap_bytes,
                           size_t blk_bytes, double *budget_out) {
    const double used = (double)(total_b - free_b), margin = fmin(512.0 * 1048576.0, 0.02 * (double)total_b);
    double budget = util * (double)total_b - used - margin;
    /* k processes share the device (loading at the same time): each its share less its own use,
     * never more than is free now */
    if (k > 1) budget = fmin(util * (double)total_b / k - own - margin / k, (double)free_b - margin);
    /* a size asked for (--kv-memory) is taken as it is where it is free, whatever the fraction */
    if (cap_bytes) budget = fmin((double)cap_bytes, (double)free_b - margin);
    *budget_out = budget;
    return budget > 0 ? (int64_t)(budget / (double)blk_bytes) : 0;
}

extern "C" int mla_cmodel_kv_init(mla_cmodel *m, const mla_cmodel_kv_opts *o, mla_err *err) {
    if (m->pool) return mla_errf(err, "the cache pool is already allocated");
    if (o->max_ctx < 1 || o->max_step_tokens < 1 || o->max_seqs < 1 || !(o->gpu_memory_utilization > 0) ||
        o->gpu_memory_utilization > 1)
        return mla_errf(err, "cache pool settings: context %lld, step %lld tokens, %lld sequences, utilization %g",
                        (long long)o->max_ctx, (long long)o->max_step_tokens, (long long)o->max_seqs,
                        o->gpu_memory_utilization);
    CU(cudaSetDevice(m->device), "cudaSetDevice");
    m->max_ctx = o->max_ctx;
    /* the scratch of the largest step first, so that what is left is what the pool may take */
    const int64_t T = o->max_step_tokens > o->max_seqs ? o->max_step_tokens : o->max_seqs;
    TRY(ensure_scratch(m, T, o->max_ctx, o->max_seqs, err));
    CU(cudaStreamSynchronize(m->st), "scratch");
    size_t fr = 0, tot = 0;
    CU(cudaMemGetInfo(&fr, &tot), "cudaMemGetInfo");
    const size_t bb = m->blk_floats * 4;
    double budget = 0;
    /* a process's own use besides its allocations: the CUDA context and library handles */
    const double own = (double)m->wbytes + (double)m->scratch_bytes + 768.0 * 1048576.0;
    int64_t n = pool_blocks(fr, tot, o->gpu_memory_utilization, o->ranks_on_device, own, o->kv_bytes_cap, bb, &budget);
    if (n < 1)
        return mla_errf(err, "no room for the cache pool: %.2f GiB of %.2f GiB in use after the weights and the scratch "
                             "(%lld-token steps), --gpu-memory-utilization %.2f (over %d process%s on the device) leaves "
                             "%.2f GiB; a block of %d positions takes %.2f MiB",
                        (double)(tot - fr) / 1073741824.0, (double)tot / 1073741824.0, (long long)T,
                        o->gpu_memory_utilization, o->ranks_on_device > 1 ? o->ranks_on_device : 1,
                        o->ranks_on_device > 1 ? "es" : "", budget / 1073741824.0, MLA_CUDA_KV_BLOCK,
                        (double)bb / 1048576.0);
    if (o->max_blocks > 0 && n > o->max_blocks) n = o->max_blocks;
    for (int tries = 0;; tries++) { /* the free memory may be in pieces: a little less each time */
        void *d = nullptr;
        if (cudaMalloc(&d, (size_t)n * bb) == cudaSuccess) {
            m->pool = (float *)d;
            break;
        }
        (void)cudaGetLastError();
        if (tries == 20 || n < 2)
            return mla_errf(err, "the cache pool: cudaMalloc of %lld blocks (%.2f GiB) failed", (long long)n,
                            (double)n * (double)bb / 1073741824.0);
        n -= n / 20 > 0 ? n / 20 : 1;
    }
    m->n_pool = n;
    return MLA_OK;
}

extern "C" void mla_cmodel_kv_pool(const mla_cmodel *m, int64_t *n_blocks, uint64_t *block_bytes) {
    *n_blocks = m->n_pool;
    *block_bytes = (uint64_t)m->blk_floats * 4;
}

/* Checks that s's table covers its first n_tokens positions. */
static int state_covers(const mla_cstate *s, int64_t n_tokens, mla_err *err) {
    if (n_tokens > s->n_blk * MLA_CUDA_KV_BLOCK)
        return mla_errf(err, "the block table covers %lld positions, the step needs %lld",
                        (long long)(s->n_blk * MLA_CUDA_KV_BLOCK), (long long)n_tokens);
    return MLA_OK;
}

extern "C" mla_cstate *mla_cstate_new(mla_cmodel *m, mla_err *err) {
    if (!m->pool) {
        mla_errf(err, "no cache pool (mla_cmodel_kv_init)");
        return nullptr;
    }
    mla_cstate *s = (mla_cstate *)mla_xcalloc(1, sizeof *s);
    s->m = m;
    s->n_ctx = m->max_ctx;
    s->n_layer = m->cfg.n_layer;
    s->kv_row = m->cfg.kv_lora_rank + m->cfg.n_rope;
    s->ik_row = m->cfg.idx_head_dim;
    if (cudaSetDevice(m->device) != cudaSuccess) {
        mla_errf(err, "cudaSetDevice(%d) failed", m->device);
        mla_cstate_free(s);
        return nullptr;
    }
    s->cap_blk = (s->n_ctx + MLA_CUDA_KV_BLOCK - 1) / MLA_CUDA_KV_BLOCK;
    s->tab_h = (float **)mla_xcalloc((size_t)s->cap_blk, sizeof *s->tab_h);
    if (cudaMalloc((void **)&s->tab_d, (size_t)s->cap_blk * sizeof(float *)) != cudaSuccess) {
        (void)cudaGetLastError();
        mla_errf(err, "block table of %lld entries: out of device memory", (long long)s->cap_blk);
        mla_cstate_free(s);
        return nullptr;
    }
    return s;
}

extern "C" int mla_cstate_set_blocks(mla_cstate *s, int64_t start, const uint32_t *ids, int64_t n, mla_err *err) {
    mla_cmodel *m = s->m;
    if (start < 0 || start > s->n_blk)
        return mla_errf(err, "a table update from entry %lld, the table holds %lld", (long long)start,
                        (long long)s->n_blk);
    if (n < 0 || start + n > s->cap_blk)
        return mla_errf(err, "a table of %lld blocks exceeds the %lld of the context (%lld positions)",
                        (long long)(start + n), (long long)s->cap_blk, (long long)s->n_ctx);
    for (int64_t i = 0; i < n; i++)
        if ((int64_t)ids[i] >= m->n_pool)
            return mla_errf(err, "block %u is outside the pool of %lld blocks", ids[i], (long long)m->n_pool);
    if (start < s->n_blk) CU(cudaStreamSynchronize(m->st), "table cut"); /* nothing queued may read them */
    for (int64_t i = 0; i < n; i++) s->tab_h[start + i] = m->pool + (size_t)ids[i] * m->blk_floats;
    s->n_blk = start + n;
    if (s->n_past > s->n_blk * MLA_CUDA_KV_BLOCK) s->n_past = s->n_blk * MLA_CUDA_KV_BLOCK;
    if (n > 0)
        CU(cudaMemcpyAsync(s->tab_d + start, s->tab_h + start, (size_t)n * sizeof(float *), cudaMemcpyHostToDevice,
                           m->st),
           "block table upload");
    return MLA_OK;
}

extern "C" void mla_cstate_free(mla_cstate *s) {
    if (!s) return;
    cudaStreamSynchronize(s->m->st);
    for (int64_t b = 0; b < s->m->last_B; b++) /* its ids may no longer feed a queued step */
        if (s->m->last_st[b] == s) s->m->last_B = 0;
    free(s->tab_h);
    if (s->tab_d) cudaFree(s->tab_d);
    free(s);
}

extern "C" int64_t mla_cstate_n_past(const mla_cstate *s) { return s->n_past; }
extern "C" int64_t mla_cstate_covered(const mla_cstate *s) { return s->n_blk * MLA_CUDA_KV_BLOCK; }
extern "C" void mla_cstate_set_n_past(mla_cstate *s, int64_t pos) {
    MLA_ASSERT(pos >= 0 && pos <= s->n_blk * MLA_CUDA_KV_BLOCK);
    s->n_past = pos;
}

/* ---------------------------------------------------------------- forward */

/* The step buffers for T tokens, keys keys and the logits of nout rows (a prompt asks for one row,
 * or none: the logits buffers are not sized by its length). */
static int ensure_scratch(mla_cmodel *m, int64_t T, int64_t keys, int64_t nout, mla_err *err) {
    if (T <= m->cap_T && keys <= m->cap_keys && nout <= m->cap_out) return MLA_OK;
    if (T < m->cap_T) T = m->cap_T; /* grow, never shrink the other dimensions */
    if (keys < m->cap_keys) keys = m->cap_keys;
    if (nout < m->cap_out) nout = m->cap_out;
    cudaStreamSynchronize(m->st);
    free_scratch(m);
    const mla_config *c = &m->cfg;
    T = T < 16 ? 16 : T;
    keys = keys < 256 ? 256 : keys;
    nout = nout < 16 ? 16 : nout;
    const int64_t E = c->n_embd, Hl = m->Hl, KL = c->kv_lora_rank, row = KL + c->n_rope;
    int64_t Fmax = c->n_ff > c->n_ff_exp ? c->n_ff : c->n_ff_exp;
    if (c->n_ff_shexp > Fmax) Fmax = c->n_ff_shexp;
    if (Fmax < 1) Fmax = 1;
    const int64_t V = c->n_vocab, X = c->n_expert > 0 ? c->n_expert : 1, K = c->n_expert_used > 0 ? c->n_expert_used : 1;
#define A(p, n)                                                                                                        \
    CU(dmalloc(m, (void **)&(p), (size_t)(n) * 4 + 64), "scratch %s: %lld tokens", #p, (long long)T)
    A(m->x, T * E);
    A(m->x2, T * E);
    A(m->h, T * E);
    A(m->y, T * E);
    A(m->cq, T * (c->q_lora_rank > 0 ? c->q_lora_rank : 1));
    A(m->cqr, T * (c->q_lora_rank > 0 ? c->q_lora_rank : 1));
    A(m->q, T * Hl * c->head_k);
    A(m->kva, T * row);
    A(m->qabs, T * Hl * KL);
    A(m->ol, T * Hl * KL);
    A(m->o, T * Hl * c->head_v);
    A(m->full, T * c->n_head * c->head_v);
    A(m->part, T * E);
    A(m->g, T * Fmax);
    A(m->u, T * Fmax);
    A(m->iq, T * (c->idx_n_head * c->idx_head_dim + 1));
    A(m->iw, T * (c->idx_n_head + 1));
    A(m->rl, T * X);
    A(m->rw, T * K);
    A(m->scores, T * (c->idx_n_head > 0 ? keys : 1));
    A(m->logit_dev, nout * V);
    A(m->tok, T);
    A(m->rid, T * K);
    A(m->sel, T * (c->idx_top_k > 0 ? c->idx_top_k : 1));
    A(m->nsel, T);
    A(m->topk_work, c->idx_n_head > 0 ? mla_cuda_dsa_topk_work_bytes(T, keys) / 4 : 1);
    m->attn_work_floats = mla_cuda_attn_work_floats(T < 64 ? T : 64, Hl, KL, 32);
    CU(dmalloc(m, (void **)&m->attn_work, m->attn_work_floats * 4), "attention work");
    m->moe_work_bytes = c->n_expert > 0 ? mla_cuda_moe_work_bytes(T, K, E, c->n_ff_exp, X) : 16;
    CU(dmalloc(m, &m->moe_work, m->moe_work_bytes), "MoE work");
    if (m->pf_ok) {
        /* the non-absorbed prompt attention's keys and values: every head of the largest step's
         * keys at once (a prompt of the step size, no prefix: one group), a group of heads at a time
         * for longer prefixes (at least one head of the longest context's keys): at most the larger
         * of that step's need and PF_WORK_MIN, at most every head of the longest context */
        const size_t full = mla_cuda_prefill_work_bytes(keys, Hl, c->head_nope, c->head_v),
                     step = mla_cuda_prefill_work_bytes(T, Hl, c->head_nope, c->head_v),
                     one = mla_cuda_prefill_work_bytes(keys, 1, c->head_nope, c->head_v);
        size_t want = step > PF_WORK_MIN ? step : PF_WORK_MIN;
        if (want < one) want = one;
        m->pf_work_bytes = want < full ? want : full;
        CU(dmalloc(m, &m->pf_work, m->pf_work_bytes), "prompt attention work (%zu bytes)", m->pf_work_bytes);
        MLA_INFO("prompt attention (non-absorbed, steps of %d tokens or more): %.0f MiB of keys and values, "
                 "%lld of %lld heads a group at %lld keys", m->pf_min, m->pf_work_bytes / 1048576.0,
                 (long long)std::min<int64_t>(Hl, (int64_t)(m->pf_work_bytes / one)), (long long)Hl, (long long)keys);
    }
    CU(dmalloc(m, &m->q8buf, mla_cuda_q8_bytes(T, (m->max_in + 31) / 32 * 32)), "q8 activations");
    CU(dmalloc(m, &m->q8h, mla_cuda_q8_bytes(T, (E + 31) / 32 * 32)), "q8 activations");
    /* + 32: not an empty allocation for models without a q-LoRA */
    CU(dmalloc(m, &m->q8c, mla_cuda_q8_bytes(T, (c->q_lora_rank + 31) / 32 * 32 + 32)), "q8 activations");
    CU(dmalloc(m, &m->xhbuf, mla_cuda_act_h_bytes(T, m->max_in)), "fp16 activations");
    if (m->mmh) CU(dmalloc(m, &m->hh, mla_cuda_act_h_bytes(T, E)), "fp16 activations");
    /* staging for the all-reduce (T x E), the attention output's gather (T x heads x v) and the
     * logits (nout x V, from every rank) */
    m->hbuf_floats = (size_t)(T * E + T * c->n_head * c->head_v + nout * V) * (size_t)m->world + 64;
    CU(cudaMallocHost((void **)&m->hbuf, m->hbuf_floats * 4), "pinned staging");
    CU(cudaMallocHost((void **)&m->hbuf2, m->hbuf_floats * 4), "pinned staging");
    if (m->coll_dev) CU(dmalloc(m, (void **)&m->dgbuf, m->hbuf_floats * 4), "gather buffer");
    CU(cudaMallocHost((void **)&m->htok, (size_t)T * 4), "pinned staging");
    CU(cudaMallocHost((void **)&m->hids, (size_t)T * 4), "pinned staging");
    CU(dmalloc(m, (void **)&m->dids, (size_t)T * 4), "greedy ids");
    A(m->kvn, T * row);
    A(m->ikn, T * (c->idx_head_dim > 0 ? c->idx_head_dim : 1));
#undef A
    m->step_bytes = step_layout(T).total;
    CU(dmalloc(m, (void **)&m->dstep, m->step_bytes), "step block");
    CU(cudaMallocHost((void **)&m->hstep, m->step_bytes), "pinned step block");
    memset(m->hstep, 0, m->step_bytes);
    m->cap_T = T;
    m->cap_keys = keys;
    m->cap_out = nout;
    return MLA_OK;
}

/* whether w's type takes the q8 products (with m->q8) at some batch */
static bool mm_q8(const mla_cmodel *m, const dmat *w) { return m->q8 && mla_cuda_q8_supported(w->type); }

/* The family of a product of w in a T-token step (kernels/mm_choose_cuda.cu, mla_cuda_mm_choose):
 * with m->mmh, steps of more than m->gemv_tmax tokens on the fp16 tensor cores, except (with
 * m->q8) those of up to MLA_CUDA_GEMVM_TMAX tokens that the streamed int8 tensor-core GEMV takes
 * (Q4_K / Q6_K / Q8_0: one read of W for 9-16 tokens where the fp16 path took ~2x as long,
 * bench/results/step8to9-h200-2026-12-02.md), which stay on the q8 family; with m->q8, the
 * integer GEMV up to Q8_TMAX tokens (at any batch in exact mode: no tensor cores) and the int8
 * tensor cores above; else the float-activation forms (exact: the GEMV; split: the hi/lo split). */
static mla_cuda_mm_family mm_family(const mla_cmodel *m, const dmat *w, int64_t T) {
    const mla_cuda_mm_policy p = {m->q8,
                                  m->split,
                                  m->exact,
                                  m->mmh ? (int64_t)m->gemv_tmax + 1 : 0,
                                  m->exact ? 0 : (int64_t)Q8_TMAX + 1,
                                  m->mmh ? (int64_t)MLA_CUDA_GEMVM_TMAX : 0};
    return mla_cuda_mm_choose(&p, &w->type, &w->n_in, 1, T, w->n_out);
}

/* whether mm() of w in a T-token step reads a q8 buffer of x (off the fp16 tensor cores) */
static bool mm_reads_q8(const mla_cmodel *m, const dmat *w, int64_t T) {
    const mla_cuda_mm_family f = mm_family(m, w, T);
    return f == MLA_CUDA_MM_Q8 || f == MLA_CUDA_MM_Q8_MMA;
}

/* y = x W^T from the activations already quantized (q: a q8 buffer of x; w reads one) */
static int mm_from_q8(mla_cmodel *m, const dmat *w, int64_t T, const void *q, float *y, mla_err *err) {
    if (mm_family(m, w, T) == MLA_CUDA_MM_Q8)
        return mla_cuda_matmul_q8(w->type, w->d, w->n_in, w->n_out, q, T, y, m->st, err);
    return mla_cuda_matmul_q8_mma(w->type, w->d, w->n_in, w->n_out, q, T, y, m->st, err);
}

/* x's q8 buffer: xq where the caller has it (a norm made it), else x quantized into m->q8buf */
static const void *q8_of(mla_cmodel *m, const float *x, const void *xq, int64_t T, int64_t in, mla_err *err) {
    if (xq) return xq;
    return mla_cuda_quantize_q8(x, T, in, m->q8buf, m->st, err) ? nullptr : m->q8buf;
}

/* whether the norms of a step of T tokens also quantize their rows (for the q8 products after
 * them: the integer GEMV, the streamed int8 tensor-core GEMV up to MLA_CUDA_GEMVM_TMAX tokens
 * (mm_family), or the int8 tensor cores where the fp16 ones are off) */
static bool norm_q8(const mla_cmodel *m, int64_t T) {
    return m->q8 && !(m->mmh && T > std::max<int64_t>(m->gemv_tmax, MLA_CUDA_GEMVM_TMAX));
}

/* whether the norms of a T-token step also write m->h's fp16 rows (m->hh) for the products on the
 * fp16 tensor cores after them: steps past the fp16 products' split-K steps (up to 64 tokens,
 * whose partial sums go to the end of the buffer they read; those convert x into xhbuf each time) */
static bool norm_h16(const mla_cmodel *m, int64_t T) { return m->mmh && T > 64; }

/* x's fp16 rows for a product of `in` inputs on the fp16 tensor cores: m->hh where x is m->h and
 * its norm made them, else x converted into m->xhbuf (NULL on an error) */
static const void *h16_of(mla_cmodel *m, const float *x, int64_t T, int64_t in, mla_err *err) {
    if (x == m->h && m->hh_ok && in == m->cfg.n_embd) return m->hh;
    return mla_cuda_act_h(x, T, in, m->xhbuf, m->st, err) ? nullptr : m->xhbuf;
}

/* y = x W^T; xq: NULL, or x's q8 buffer */
static int mm(mla_cmodel *m, const dmat *w, const float *x, const void *xq, int64_t T, float *y, mla_err *err) {
    switch (mm_family(m, w, T)) {
    case MLA_CUDA_MM_H: {
        const void *xh = h16_of(m, x, T, w->n_in, err);
        if (!xh) return MLA_ERR;
        return mla_cuda_matmul_h(w->type, w->d, w->n_in, w->n_out, xh, T, y, m->st, err);
    }
    case MLA_CUDA_MM_Q8:
    case MLA_CUDA_MM_Q8_MMA: {
        const void *q = q8_of(m, x, xq, T, w->n_in, err);
        if (!q) return MLA_ERR;
        return mm_from_q8(m, w, T, q, y, err);
    }
    case MLA_CUDA_MM_GEMV:
        return mla_cuda_matmul_gemv(w->type, w->d, w->n_in, w->n_out, x, T, y, m->st, err);
    case MLA_CUDA_MM_SPLIT:
        return mla_cuda_matmul_split(w->type, w->d, w->n_in, w->n_out, x, T, y, m->st, err);
    case MLA_CUDA_MM_NARROW:
        return mla_cuda_matmul_narrow(w->type, w->d, w->n_in, w->n_out, x, T, y, m->st, err);
    case MLA_CUDA_MM_MMA:
        break;
    }
    return mla_cuda_matmul_mma(w->type, w->d, w->n_in, w->n_out, x, T, y, m->st, err);
}

/* whether two matrices on the same input of a T-token step take the integer GEMV together: both
 * q8 products off the fp16 tensor cores, of one type and row length, below the int8 tensor cores */
static bool q8_gemv2(const mla_cmodel *m, const dmat *w0, const dmat *w1, int64_t T) {
    return mm_family(m, w0, T) == MLA_CUDA_MM_Q8 && mm_family(m, w1, T) == MLA_CUDA_MM_Q8 && w0->type == w1->type &&
           w0->n_in == w1->n_in;
}

/* mm() of two matrices on the same input: when both take the fp16 or the int8 path, x is
 * converted once; on the integer GEMV, matrices of one type in one kernel. */
static int mm2(mla_cmodel *m, const dmat *w0, float *y0, const dmat *w1, float *y1, const float *x, const void *xq,
               int64_t T, mla_err *err) {
    if (mm_family(m, w0, T) == MLA_CUDA_MM_H && mm_family(m, w1, T) == MLA_CUDA_MM_H && w0->n_in == w1->n_in) {
        const void *xh = h16_of(m, x, T, w0->n_in, err);
        if (!xh) return MLA_ERR;
        TRY(mla_cuda_matmul_h(w0->type, w0->d, w0->n_in, w0->n_out, xh, T, y0, m->st, err));
        return mla_cuda_matmul_h(w1->type, w1->d, w1->n_in, w1->n_out, xh, T, y1, m->st, err);
    }
    if (!mm_reads_q8(m, w0, T) || !mm_reads_q8(m, w1, T) || w0->n_in != w1->n_in) {
        TRY(mm(m, w0, x, xq, T, y0, err));
        return mm(m, w1, x, xq, T, y1, err);
    }
    const void *q = q8_of(m, x, xq, T, w0->n_in, err);
    if (!q) return MLA_ERR;
    if (q8_gemv2(m, w0, w1, T))
        return mla_cuda_matmul_q8_pair(w0->type, w0->d, w0->n_out, y0, w1->d, w1->n_out, y1, w0->n_in, q, T, m->st,
                                       err);
    TRY(mm_from_q8(m, w0, T, q, y0, err));
    return mm_from_q8(m, w1, T, q, y1, err);
}

/* m->h = rmsnorm(x [+ res]) of T rows (weights w), *x the residual stream (m->x or m->x2): with
 * res, x + res becomes the stream (written to the other buffer, so that the norm's blocks can
 * share a row). *hq: h's q8 buffer (m->q8h) where norm_q8 says the
 * products after it read one, else NULL; h's fp16 rows in m->hh where norm_h16 says so. */
static int norm_h(mla_cmodel *m, float **x, const float *res, int64_t T, const float *w, const void **hq,
                  mla_err *err) {
    const mla_config *c = &m->cfg;
    const int64_t E = c->n_embd;
    *hq = nullptr;
    void *q = norm_q8(m, T) && E % 32 == 0 ? m->q8h : nullptr;
    float *xs = res ? (*x == m->x ? m->x2 : m->x) : nullptr;
    if (res && m->ar_pending) { /* res: this rank's part in m->ar_in, summed over the ranks here */
        MLA_ASSERT(res == m->ar_in && !norm_h16(m, T));
        m->ar_pending = false;
        m->hh_ok = false;
        TRY(mla_cuda_ar_add_rmsnorm(&m->ar, T, E, *x, xs, w, c->rms_eps, m->h, q, m->st, err));
        *x = xs;
        *hq = q;
        return MLA_OK;
    }
    m->hh_ok = m->hh && norm_h16(m, T) && E % 4 == 0;
    TRY(mla_cuda_rmsnorm_ex(*x, res, xs, E, T, E, w, c->rms_eps, m->h, E, q, m->hh_ok ? m->hh : nullptr, m->st,
                            err));
    if (res) *x = xs;
    *hq = q;
    return MLA_OK;
}

/* buf[0..n) device: summed over ranks through the host collective (pinned copies). */
/* the one-shot all-reduce takes messages up to this size (docs/cuda.md: where it pays at 8 GPUs) */
#define AR_ONESHOT_BYTES (512u << 10)

static int allreduce(mla_cmodel *m, float *d, size_t n, mla_err *err) {
    if (m->world == 1) return MLA_OK;
    if (m->ar_defer && d == m->ar_in) { /* summed by the norm after it (norm_h) */
        m->ar_pending = true;
        return MLA_OK;
    }
    if (m->ar_on && n * 4 <= AR_ONESHOT_BYTES) {
        CU(cudaMemcpyAsync(m->ar_in, d, n * 4, cudaMemcpyDeviceToDevice, m->st), "one-shot all-reduce copy");
        return mla_cuda_ar_sum(&m->ar, d, n, m->st, err);
    }
    if (m->coll_dev) return coll_allreduce_sum_f32(m->c, d, n, err); /* NCCL, ordered with m->st */
    CU(cudaMemcpyAsync(m->hbuf, d, n * 4, cudaMemcpyDeviceToHost, m->st), "allreduce copy");
    CU(cudaStreamSynchronize(m->st), "allreduce sync");
    TRY(coll_allreduce_sum_f32(m->c, m->hbuf, n, err));
    CU(cudaMemcpyAsync(d, m->hbuf, n * 4, cudaMemcpyHostToDevice, m->st), "allreduce copy back");
    return MLA_OK;
}

/* y = down(silu(gate h) * up h); hq: NULL, or h's q8 buffer */
static int ffn_apply(mla_cmodel *m, const dffn *f, const float *h, const void *hq, int64_t T, float *y,
                     mla_err *err) {
    const int64_t E = m->cfg.n_embd;
    if (f->skip) {
        CU(cudaMemsetAsync(y, 0, (size_t)(T * E) * 4, m->st), "memset");
        return MLA_OK;
    }
    const dmat *gt = &f->gate, *up = &f->up, *dn = &f->down;
    const int64_t F = gt->n_out;
    void *gq = nullptr; /* the hidden rows' q8 buffer, for the down projection */
    if (q8_gemv2(m, gt, up, T)) { /* gate, up and swiglu in one GEMV */
        const void *q = q8_of(m, h, hq, T, gt->n_in, err);
        if (!q) return MLA_ERR;
        /* and the hidden rows' rounding for a q8 down projection (in the GEMV where it can): into
         * m->q8buf, unless that holds h's */
        if (q != m->q8buf && mm_reads_q8(m, dn, T) && F % 32 == 0) gq = m->q8buf;
        TRY(mla_cuda_matmul_q8_swiglu(gt->type, gt->d, up->d, gt->n_in, F, q, T, m->g, m->u, gq, m->st, err));
    } else {
        TRY(mm2(m, gt, m->g, up, m->u, h, hq, T, err));
        if (mm_family(m, dn, T) == MLA_CUDA_MM_H) { /* swiglu into the down product's fp16 rows: the
                                                     * bits of swiglu, then of their conversion */
            TRY(mla_cuda_swiglu_h(m->g, m->u, T, F, m->xhbuf, m->st, err));
            return mla_cuda_matmul_h(dn->type, dn->d, F, dn->n_out, m->xhbuf, T, y, m->st, err);
        }
        TRY(mla_cuda_swiglu(m->g, m->u, m->g, T * F, m->st, err));
    }
    return mm(m, dn, m->g, gq, T, y, err);
}

static int attn_out(mla_cmodel *m, const dlayer *l, int64_t T, int n_splits, mla_err *err);

/* Where a paged step's new cache rows go (attention_b), for project_q_kv's merged form */
struct kv_dest {
    const float *const *const *tabs;
    int64_t kv_off;
    const int32_t *pos;
};

/* whether a T-token step's absorbed product reads wq, a matrix's Q8_0 rows (dlayer's kb_q8 /
 * vb_q8, or NULL): head_mm's choice, which the merged forms below follow */
static bool head_reads_q8(const void *wq, int64_t T) { return wq && T <= 8; }

/* whether a paged step of T tokens writes its cache rows in the q-LoRA norm's launch and rotates
 * the queries' k_pe in k_b */
static bool kv_merged(const mla_cmodel *m, const dlayer *l, int64_t T) {
    const mla_config *c = &m->cfg;
    return c->q_lora_rank > 0 && head_reads_q8(l->kb_q8, T) && m->rope.n_dims == c->n_rope &&
           norm_q8(m, T) && mla_cuda_qnorm_kv_rows_supported(c->q_lora_rank, c->kv_lora_rank, (int)c->n_rope);
}

/* The attention's input projections of T tokens from m->h (hq: NULL or its q8 buffer): queries in
 * m->q (through the q-LoRA and its norm, m->cq, when the model has one; *cq_q: cq's q8 buffer
 * where the norm made one, else NULL) and the compressed kv + k_pe in m->kva. kd (kv_merged):
 * the cache rows are also written, in the norm's launch. fork: m->ev_fork recorded once cq is
 * in (a q-LoRA model: the DSA indexer's start, attention_b). */
static int project_q_kv(mla_cmodel *m, const dlayer *l, const void *hq, int64_t T, const void **cq_q,
                        const kv_dest *kd, bool fork, mla_err *err) {
    const mla_config *c = &m->cfg;
    *cq_q = nullptr;
    if (c->q_lora_rank > 0) { /* q_a and kv_a read the same input */
        const int64_t QL = c->q_lora_rank;
        TRY(mm2(m, &l->q_a, m->cqr, &l->kv_a, m->kva, m->h, hq, T, err));
        void *q = norm_q8(m, T) && QL % 32 == 0 ? m->q8c : nullptr;
        if (kd)
            TRY(mla_cuda_qnorm_kv_rows(m->cqr, T, QL, l->q_a_norm, c->rms_eps, m->cq, q, &m->rope, m->kva,
                                       c->kv_lora_rank, l->kv_a_norm, kd->tabs, kd->kv_off, kd->pos, m->kv_f16, m->st,
                                       err));
        else
            TRY(mla_cuda_rmsnorm_ex(m->cqr, nullptr, nullptr, QL, T, QL, l->q_a_norm, c->rms_eps, m->cq, QL, q,
                                    nullptr, m->st, err));
        *cq_q = q;
        if (fork) CU(cudaEventRecord(m->ev_fork, m->st), "fork"); /* cq is in: the indexer may start */
        return mm(m, &l->q_b, m->cq, q, T, m->q, err);
    }
    return mm2(m, &l->q_b, m->q, &l->kv_a, m->kva, m->h, hq, T, err);
}

/* The absorbed per-head products (k_b before attention, v_b after) of this rank's heads: w as
 * dlayer's kb / vb, wq its Q8_0 rows or NULL (steps of up to 8 tokens read those); yq: NULL, or a
 * q8 buffer that also gets y (mla_cuda_head_matmul_f16's d_yq) */
static int head_mm(mla_cmodel *m, const void *w, const void *wq, int64_t in, int64_t out, const float *x, int64_t xt,
                   int64_t xh, int64_t T, float *y, int64_t yt, int64_t yh, void *yq, mla_err *err) {
    if (head_reads_q8(wq, T)) return mla_cuda_head_matmul_q8(wq, m->Hl, in, out, x, xt, xh, T, y, yt, yh, yq, m->st, err);
    if (m->kvb_f16) return mla_cuda_head_matmul_f16(w, m->Hl, in, out, x, xt, xh, T, y, yt, yh, yq, m->st, err);
    TRY(mla_cuda_head_matmul((const float *)w, m->Hl, in, out, x, xt, xh, T, y, yt, yh, m->st, err));
    return yq ? mla_cuda_quantize_q8(y, T, yt, yq, m->st, err) : MLA_OK;
}

/* the most splits of a T-token step's attention that its v_b combines (mla_cuda_head_matmul_q8_comb),
 * or 0: the attention combines them */
static int vb_comb_max(const mla_cmodel *m, const dlayer *l, int64_t T) {
    const mla_config *c = &m->cfg;
    return head_reads_q8(l->vb_q8, T) &&
                   mla_cuda_head_q8_comb_supported(c->kv_lora_rank, c->head_v, T, MLA_CUDA_HEAD_COMB_MAXS)
               ? MLA_CUDA_HEAD_COMB_MAXS
               : 0;
}

/* The attention's output side, from m->ol (latent outputs of this rank's heads), or with n_splits
 * > 1 from the attention's splits in m->attn_work, which v_b combines (vb_comb_max), or with
 * n_splits 0 from m->o itself (the non-absorbed attention's head_v outputs: no v_b): v_b,
 * attn_output (row- or column-split), the all-reduce; result in m->y. */
static int attn_out(mla_cmodel *m, const dlayer *l, int64_t T, int n_splits, mla_err *err) {
    const mla_config *c = &m->cfg;
    const int64_t E = c->n_embd, Hl = m->Hl, dv = c->head_v, KL = c->kv_lora_rank;
    cudaStream_t st = m->st;
    /* the output rows' q8 buffer for a q8 attn_output, made by the v_b GEMV where it can */
    void *oq = n_splits > 0 && !l->o_gather && mm_reads_q8(m, &l->o, T) && dv % 32 == 0 ? m->q8buf : nullptr;
    if (n_splits == 0) {
        /* m->o holds the heads' outputs already */
    } else if (n_splits > 1)
        TRY(mla_cuda_head_matmul_q8_comb(l->vb_q8, Hl, KL, dv, m->attn_work, n_splits, T, m->o, Hl * dv, dv, oq, st,
                                         err));
    else TRY(head_mm(m, l->vb, l->vb_q8, KL, dv, m->ol, Hl * KL, KL, T, m->o, Hl * dv, dv, oq, err));
    if (!l->o_gather) {
        TRY(mm(m, &l->o, m->o, oq, T, m->y, err));
    } else {
        const int64_t H = c->n_head, per = T * Hl * dv, w = l->o_r1 - l->o_r0;
        const float *gsrc = m->hbuf;
        if (m->coll_dev) { /* NCCL: device to device */
            TRY(coll_allgather_f32(m->c, m->o, m->dgbuf, (size_t)per, err));
            gsrc = m->dgbuf;
        } else {
            CU(cudaMemcpyAsync(m->hbuf2, m->o, (size_t)per * 4, cudaMemcpyDeviceToHost, st), "gather copy");
            CU(cudaStreamSynchronize(st), "gather sync");
            TRY(coll_allgather_f32(m->c, m->hbuf2, m->hbuf, (size_t)per, err));
        }
        for (int r = 0; r < m->world; r++) { /* rank-major -> token-major, straight into the device */
            int64_t rh0 = H * r / m->world, rhl = H * (r + 1) / m->world - rh0;
            CU(cudaMemcpy2DAsync(m->full + rh0 * dv, (size_t)(H * dv) * 4, gsrc + r * per, (size_t)(rhl * dv) * 4,
                                 (size_t)(rhl * dv) * 4, (size_t)T, cudaMemcpyDefault, st),
               "gather upload");
        }
        TRY(mm(m, &l->o, m->full, nullptr, T, m->part, err));
        CU(cudaMemsetAsync(m->y, 0, (size_t)(T * E) * 4, st), "memset");
        CU(cudaMemcpy2DAsync(m->y + l->o_r0, (size_t)E * 4, m->part, (size_t)w * 4, (size_t)w * 4, (size_t)T,
                             cudaMemcpyDeviceToDevice, st),
           "rows copy");
        /* the host staging is reused by the all-reduce below: wait for the uploads */
        if (!m->coll_dev) CU(cudaStreamSynchronize(st), "gather sync");
    }
    return allreduce(m, m->y, (size_t)(T * E), err);
}

/* f() with its kernels on st2 (m->st while it runs), after what st recorded in m->ev_fork; then
 * m->ev_join recorded on st2, for st to wait on before it reads what f() wrote */
template <typename F> static int on_side_stream(mla_cmodel *m, F f, mla_err *err) {
    CU(cudaStreamWaitEvent(m->st2, m->ev_fork, 0), "fork");
    cudaStream_t st0 = m->st;
    m->st = m->st2;
    const int rc = f();
    m->st = st0;
    TRY(rc);
    CU(cudaEventRecord(m->ev_join, m->st2), "join");
    return MLA_OK;
}

/* The layer's FFN (dense, or shared + routed experts) of m->h (hq: NULL or its q8 buffer) into m->y,
 * all-reduced */
static int ffn_moe(mla_cmodel *m, int64_t il, int64_t T, const void *hq, mla_err *err) {
    const mla_config *c = &m->cfg;
    const dlayer *l = &m->L[il];
    const int64_t E = c->n_embd;
    if (l->dense) {
        TRY(ffn_apply(m, &l->ffn, m->h, hq, T, m->y, err));
    } else {
        const int64_t X = c->n_expert, K = c->n_expert_used;
        /* the shared expert beside the router and the routing: on st2, into m->y, joined
         * before the routed experts add into m->y. The router then must not use m->q8buf (the
         * shared expert's): it reads hq, or is not a q8 product. */
        const bool side = l->has_shexp && (hq || !mm_q8(m, &l->router));
        if (side) {
            CU(cudaEventRecord(m->ev_fork, m->st), "fork");
            TRY(on_side_stream(m, [&] { return ffn_apply(m, &l->ffn, m->h, hq, T, m->y, err); }, err));
        } else if (l->has_shexp) {
            TRY(ffn_apply(m, &l->ffn, m->h, hq, T, m->y, err));
        } else {
            CU(cudaMemsetAsync(m->y, 0, (size_t)(T * E) * 4, m->st), "memset");
        }
        TRY(mm(m, &l->router, m->h, hq, T, m->rl, err));
        moe_route_params rp = {(int)X, (int)K, (int)c->n_group, (int)c->n_group_used, (int)c->gating, c->weights_norm,
                               c->weights_scale};
        TRY(mla_cuda_moe_route(&rp, m->rl, l->router_bias, T, m->rid, m->rw, m->st, err));
        if (side) CU(cudaStreamWaitEvent(m->st, m->ev_join, 0), "join");
        TRY(mla_cuda_moe_apply(&l->ex, m->h, hq, m->hh_ok ? m->hh : nullptr, T, m->rid, m->rw, K, m->y, m->moe_work,
                               m->st, err));
    }
    return allreduce(m, m->y, (size_t)(T * E), err);
}

/* ---------------------------------------------------------------- steps over the paged cache */
/* The DSA indexer of a step of T tokens (attention_b), on m->st. A token with no more than top_k
 * keys selects all of them, in order: the plain attention. A step whose key bound max_keys (what
 * a decode graph is keyed on) is no more than top_k (a prompt of up to top_k tokens) skips the
 * indexer's queries, scores and selection (*sel NULL); otherwise such tokens are left unscored
 * (skip_keys) and selected whole, and *sel is m->sel. The indexer's key rows are computed and
 * stored (at ik_off) for later steps either way. */
static int indexer_b(mla_cmodel *m, const dlayer *l, int64_t T, int64_t max_keys, const void *cq_q, const void *hq,
                     const float *const *const *tabs, int64_t ik_off, const int32_t *pos, const int32_t **sel,
                     mla_err *err) {
    const mla_config *c = &m->cfg;
    const int64_t nih = c->idx_n_head, ihd = c->idx_head_dim;
    cudaStream_t st = m->st;
    const bool select = max_keys > c->idx_top_k;
    if (select) {
        TRY(mm(m, &l->iq_b, m->cq, cq_q, T, m->iq, err));
        TRY(mm2(m, &l->ik, m->ikn, &l->iproj, m->iw, m->h, hq, T, err));
    } else
        TRY(mm(m, &l->ik, m->h, hq, T, m->ikn, err));
    /* the key rows normalized, rotated and stored; selecting, the queries rotated and the head
     * weights scaled: one launch */
    TRY(mla_cuda_dsa_ik_rows(&m->rope, m->ikn, T, ihd, l->ik_norm_w, l->ik_norm_b, 1e-6f, tabs, ik_off, pos,
                             m->kv_f16, select ? m->iq : nullptr, nih, m->iw, 1.0f / sqrtf((float)nih), st, err));
    *sel = NULL;
    if (!select) return MLA_OK;
    if (m->kv_f16) /* fp16 keys on the tensor cores */
        TRY(mla_cuda_dsa_scores_paged_h(m->iq, m->iw, tabs, ik_off, pos, m->pf_tab, m->pf_pos0, T, nih, ihd, max_keys,
                                        c->idx_top_k, m->scores, max_keys, st, err));
    else
        TRY(mla_cuda_dsa_scores_paged(m->iq, m->iw, tabs, ik_off, pos, T, nih, ihd, max_keys, c->idx_top_k, m->scores,
                                      max_keys, st, err));
    TRY(mla_cuda_dsa_topk_paged(m->scores, max_keys, T, pos, c->idx_top_k, m->topk_work, m->sel, m->nsel, st, err));
    *sel = m->sel;
    return MLA_OK;
}

/* whether mm() of w in a T-token step reads only its inputs (xq: x's q8 buffer or NULL): it neither
 * converts x into m->xhbuf (the fp16 tensor cores) nor quantizes it into m->q8buf; two such
 * products may run at once on two streams */
static bool mm_private(const mla_cmodel *m, const dmat *w, const void *xq, int64_t T) {
    return mm_family(m, w, T) != MLA_CUDA_MM_H && (xq || !mm_reads_q8(m, w, T));
}

/* whether the indexer of a T-token step runs beside the queries' products (attention_b): a q-LoRA
 * model (the fork is at its norm) whose q_b and indexer products each read only their inputs
 * (cq_q, hq: the norms' q8 buffers or NULL) */
static bool indexer_side(const mla_cmodel *m, const dlayer *l, int64_t T, int64_t max_keys, const void *cq_q,
                         const void *hq) {
    const bool select = max_keys > m->cfg.idx_top_k;
    return m->cfg.q_lora_rank > 0 && mm_private(m, &l->q_b, cq_q, T) && mm_private(m, &l->ik, hq, T) &&
           (!select || (mm_private(m, &l->iq_b, cq_q, T) && mm_private(m, &l->iproj, hq, T)));
}

/* Attention of a step of T tokens (of one sequence or of many): token ids, positions and each
 * token's block table are read from the step block on the device; the new cache rows go to
 * their slots through the tables (nothing here depends on positions on the host). */
static int attention_b(mla_cmodel *m, int64_t il, int64_t T, int64_t max_keys, const void *hq, mla_err *err) {
    const mla_config *c = &m->cfg;
    const dlayer *l = &m->L[il];
    const int64_t Hl = m->Hl, dk = c->head_k, dn = c->head_nope, dr = c->n_rope, KL = c->kv_lora_rank, row = KL + dr;
    const int64_t ihd = c->idx_n_head > 0 ? c->idx_head_dim : 0;
    /* this layer's rows inside a block: kv rows of every layer first (kv_off in elements: halves
     * with kv_f16), then indexer keys (ik_off in elements: with kv_f16 the keys are fp16 too,
     * the offset in halves) */
    const int64_t kv_off = il * MLA_CUDA_KV_BLOCK * row,
                  ik_off = (m->kv_f16 ? 2 * (c->n_layer * MLA_CUDA_KV_BLOCK * row / 2) : c->n_layer * MLA_CUDA_KV_BLOCK * row) +
                           il * MLA_CUDA_KV_BLOCK * ihd;
    cudaStream_t st = m->st;
    const step_off so = step_layout(T);
    const int32_t *pos = (const int32_t *)(m->dstep + so.pos);
    const float *const *const *tabs = (const float *const *const *)(m->dstep + so.tabs);
    const void *cq_q;
    const bool merged = kv_merged(m, l, T);
    /* a prompt step of one sequence: the non-absorbed form (no k_b, no v_b) where it has a kernel
     * and the step selects no keys (DSA: the step's keys within top_k) */
    const bool mha = m->pf_ok && m->pf_tab && T >= m->pf_min && !merged &&
                     (c->idx_n_head == 0 || max_keys <= c->idx_top_k);
    const kv_dest kd = {tabs, kv_off, pos};
    const bool dsa = c->idx_n_head > 0;
    TRY(project_q_kv(m, l, hq, T, &cq_q, merged ? &kd : nullptr, dsa && c->q_lora_rank > 0, err));
    /* The DSA indexer beside the queries' products (q_b, k_b, the cache rows): on st2 from the
     * q-LoRA norm, joined before the attention, where no product of either side converts its
     * input into a shared buffer (indexer_side) */
    const int32_t *sel = NULL;
    const bool side = dsa && indexer_side(m, l, T, max_keys, cq_q, hq);
    if (side)
        TRY(on_side_stream(m, [&] { return indexer_b(m, l, T, max_keys, cq_q, hq, tabs, ik_off, pos, &sel, err); },
                           err));
    /* the new cache rows: normalized latent + roped k_pe, stored in the blocks; the queries' k_pe
     * roped. Merged: the rows are stored already, and k_b rotates the queries'. Not beside k_b on
     * st2: the attention, which copies its first key tiles before its wait (rows two or more
     * launches back: kernels/cuda_internal.h), would then come right after the rows' launch. */
    if (merged) {
        TRY(mla_cuda_head_matmul_q8_rope(l->kb_q8, Hl, dn, KL, m->q, Hl * dk, dk, T, m->qabs, Hl * KL, KL, &m->rope,
                                         m->q + dn, Hl * dk, dk, pos, st, err));
    } else {
        if (m->rope.n_dims == dr && KL <= 8192) {
            TRY(mla_cuda_mla_kv_rows(&m->rope, m->kva, T, KL, l->kv_a_norm, c->rms_eps, tabs, kv_off, pos, m->kv_f16,
                                     m->q + dn, Hl * dk, Hl, dk, st, err));
        } else { /* built in kvn, then stored */
            TRY(mla_cuda_rmsnorm(m->kva, row, T, KL, l->kv_a_norm, c->rms_eps, m->kvn, row, st, err));
            CU(cudaMemcpy2DAsync(m->kvn + KL, (size_t)row * 4, m->kva + KL, (size_t)row * 4, (size_t)dr * 4,
                                 (size_t)T, cudaMemcpyDeviceToDevice, st),
               "k_pe copy");
            TRY(mla_cuda_rope(&m->rope, ROPE_ADJACENT, m->kvn + KL, T, 1, dr, row, 0, pos, st, err));
            TRY(mla_cuda_scatter_paged(m->kvn, row, row, T, tabs, kv_off, pos, row, m->kv_f16, st, err));
            TRY(mla_cuda_rope(&m->rope, ROPE_ADJACENT, m->q + dn, T, Hl, dk, Hl * dk, 0, pos, st, err));
        }
        if (!mha) TRY(head_mm(m, l->kb, l->kb_q8, dn, KL, m->q, Hl * dk, dk, T, m->qabs, Hl * KL, KL, nullptr, err));
    }
    if (dsa && !side) TRY(indexer_b(m, l, T, max_keys, cq_q, hq, tabs, ik_off, pos, &sel, err));
    if (side) CU(cudaStreamWaitEvent(st, m->ev_join, 0), "join");
    if (mha) {
        MLA_ASSERT(!sel);
        const int64_t dv = c->head_v;
        const mla_cuda_prefill_args pa = {m->q, Hl * dk, dk, T, m->pf_pos0, Hl, KL, dr, dn, dv, m->pf_tab, kv_off,
                                          l->kb, l->vb, m->kvb_f16, c->kq_scale, m->o, Hl * dv, dv, m->pf_work,
                                          m->pf_work_bytes};
        TRY(mla_cuda_prefill_attn(&pa, st, err));
        m->n_pf++;
        return attn_out(m, l, T, 0, err);
    }
    mla_cuda_attn_args aa = {m->qabs, m->q + dn, Hl * dk, dk, T, Hl, KL, dr, NULL, 0, c->kq_scale, sel, m->nsel,
                             c->idx_top_k, m->ol, T <= 64 ? m->attn_work : NULL, m->attn_work_floats,
                             tabs, kv_off, pos, max_keys, m->attn_tc, m->kv_f16, vb_comb_max(m, l, T), NULL};
    int n_splits = 1;
    if (aa.comb_max > 0) aa.n_splits_out = &n_splits;
    TRY(mla_cuda_mla_attn(&aa, st, err));
    return attn_out(m, l, T, n_splits, err);
}

/* Everything of a step of T tokens that runs on the device, from the token ids in the step block
 * to the logits of rows [out0, out0 + nout) in m->logit_dev (or, split over ranks on NCCL,
 * gathered in m->dgbuf). */
static int step_body(mla_cmodel *m, int64_t T, int64_t max_keys, int64_t out0, int64_t nout, mla_err *err) {
    const mla_config *c = &m->cfg;
    const int64_t E = c->n_embd;
    cudaStream_t st = m->st;
    TRY(mla_cuda_get_rows(m->tok_embd.type, m->tok_embd.d, E, (const int32_t *)m->dstep, T, m->x, st, err));
    /* one-shot all-reduces fused with the norms after them: the sublayers write into ar_in */
    struct y_back {
        mla_cmodel *m;
        float *y;
        ~y_back() {
            m->y = y;
            m->ar_defer = m->ar_pending = false;
        }
    } yb{m, m->y};
    if (m->ar_on && (size_t)(T * E) * 4 <= AR_ONESHOT_BYTES && mla_cuda_ar_add_rmsnorm_fits(T, E)) {
        m->y = m->ar_in;
        m->ar_defer = true;
    }
    /* each sublayer's output m->y is added into the residual stream x by the next norm */
    const void *hq = nullptr;
    float *x = m->x;
    for (int64_t il = 0; il < c->n_layer; il++) {
        const dlayer *l = &m->L[il];
        TRY(norm_h(m, &x, il ? m->y : nullptr, T, l->attn_norm, &hq, err));
        TRY(attention_b(m, il, T, max_keys, hq, err));
        TRY(norm_h(m, &x, m->y, T, l->ffn_norm, &hq, err));
        TRY(ffn_moe(m, il, T, hq, err));
    }
    /* logits of every row: the last add in the output norm; else added here, rows normalized apart */
    const bool all_rows = out0 == 0 && nout == T;
    if (!all_rows && m->ar_pending) { /* summed apart: the norm below takes some rows only */
        m->ar_pending = false;
        TRY(mla_cuda_ar_sum(&m->ar, yb.y, (size_t)(T * E), st, err));
        TRY(mla_cuda_add(x, yb.y, T * E, st, err));
    } else if (!all_rows) {
        TRY(mla_cuda_add(x, m->y, T * E, st, err));
    }
    if (nout <= 0) return MLA_OK;
    if (all_rows) TRY(norm_h(m, &x, m->y, T, m->out_norm, &hq, err));
    else {
        m->hh_ok = false; /* m->h holds nout rows now */
        TRY(mla_cuda_rmsnorm(x + out0 * E, E, nout, E, m->out_norm, c->rms_eps, m->h, E, st, err));
    }
    TRY(mm(m, &m->output, m->h, all_rows ? hq : nullptr, nout, m->logit_dev, err));
    if (m->out_split && m->coll_dev)
        TRY(coll_allgather_f32(m->c, m->logit_dev, m->dgbuf, (size_t)(nout * (m->out_r1 - m->out_r0)), err));
    return MLA_OK;
}

/* A decode step of B tokens (logits of every row): eagerly the first time for (B, max_keys),
 * captured into a CUDA graph the second time, replayed after that. A capture that fails turns
 * graphs off for this model (with the reason in the log) and the step runs eagerly: slower,
 * never different. */
static int decode_run(mla_cmodel *m, int64_t B, int64_t max_keys, mla_err *err) {
    m->replayed = false;
    if (!m->graphs) return step_body(m, B, max_keys, 0, B, err);
    mla_cmodel::dgraph *g = nullptr, *lru = &m->gr[0];
    for (auto &e : m->gr) {
        if (e.B == B && e.max_keys == max_keys) g = &e;
        if (e.used < lru->used) lru = &e;
    }
    if (!g) {
        if (lru->exec) cudaGraphExecDestroy(lru->exec);
        *lru = mla_cmodel::dgraph{};
        g = lru;
        g->B = B;
        g->max_keys = max_keys;
    }
    g->used = ++m->gr_tick;
    m->replayed = g->exec != nullptr;
    if (!g->exec && g->seen++ == 0) return step_body(m, B, max_keys, 0, B, err); /* warm-up: lazy attributes */
    if (!g->exec) {
        cudaGraph_t graph = nullptr;
        CU(cudaStreamBeginCapture(m->st, cudaStreamCaptureModeThreadLocal), "graph capture start");
        mla_err e2;
        int rc = step_body(m, B, max_keys, 0, B, &e2);
        cudaError_t ce = cudaStreamEndCapture(m->st, &graph);
        if (rc == MLA_OK && ce == cudaSuccess) ce = cudaGraphInstantiate(&g->exec, graph, 0);
        if (graph) cudaGraphDestroy(graph);
        if (rc != MLA_OK || ce != cudaSuccess) {
            (void)cudaGetLastError(); /* clear the capture's error state */
            if (m->graphs_required)
                return mla_errf(err, "MLA_CUDA_GRAPHS=require: capture of a decode step of %lld tokens failed: %s",
                                (long long)B, rc != MLA_OK ? e2.msg : cudaGetErrorString(ce));
            MLA_WARN("CUDA graphs off for this model: capture of a decode step of %lld tokens failed: %s",
                     (long long)B, rc != MLA_OK ? e2.msg : cudaGetErrorString(ce));
            g->exec = nullptr;
            graphs_clear(m);
            m->graphs = false;
            return step_body(m, B, max_keys, 0, B, err);
        }
        if (m->n_graph_capture++ < 4)
            MLA_INFO("CUDA graph captured: decode steps of %lld tokens (contexts up to %lld)", (long long)B,
                     (long long)max_keys);
    }
    CU(cudaGraphLaunch(g->exec, m->st), "graph launch (decode of %lld tokens)", (long long)B);
    m->n_graph_launch++;
    return MLA_OK;
}

/* Step timing (mla_cmodel_decode_time). tstep_open: the next pair's first event, before a decode
 * step's first copy (m->tev_cur; m->tev_prev the step closed before it, in stream order), unless
 * a queued step still holds that pair; tstep_close: its second, after the step's forward pass
 * and what it copies to the host (a step whose sampling waits for its masks: after the forward
 * pass, the sampling then counts as time between steps), for a step replayed from a captured
 * graph only (an eager, warm-up or capturing step has the device wait for the host's launches
 * inside it); tstep_done, once that has completed: the step's span and the time from the end
 * of the step closed before it to its start. */
static void tstep_open(mla_cmodel *m) {
    const int k = m->tev_next;
    m->tev_cur = -1;
    for (int i = 0; i < m->nq; i++)
        if (m->qs[i].tp == k || m->qs[i].tprev == k) return;
    m->tev_prev = m->tev_last;
    m->tev_next = (k + 1) & 3;
    if (cudaEventRecord(m->tev[k][0], m->st) == cudaSuccess) m->tev_cur = k;
    else (void)cudaGetLastError();
}
static void tstep_close(mla_cmodel *m, int tp) {
    if (tp < 0) return;
    if (!m->replayed) {
        if (m->tev_cur == tp) m->tev_cur = -1; /* not timed: tstep_done skips it */
        return;
    }
    if (cudaEventRecord(m->tev[tp][1], m->st) == cudaSuccess) m->tev_last = tp;
    else (void)cudaGetLastError();
}
static void tstep_done(mla_cmodel *m, int tp, int tprev) {
    float busy = 0.f, gap = 0.f;
    if (tp < 0 || cudaEventElapsedTime(&busy, m->tev[tp][0], m->tev[tp][1]) != cudaSuccess) {
        (void)cudaGetLastError(); /* a pair left open by a failed step: not counted */
        return;
    }
    m->dt_steps++;
    m->dt_busy += busy * 1e-3;
    if (tprev >= 0 && cudaEventElapsedTime(&gap, m->tev[tprev][1], m->tev[tp][0]) == cudaSuccess)
        m->dt_between += gap * 1e-3;
    else
        (void)cudaGetLastError();
}

/* The nout logits rows of the step just run to the host (the step's one synchronisation):
 * rows[i] gets row i (NULL: skipped); every rank receives full rows. tp: the step's timing
 * pair (tstep_open), closed after the copy, or -1. */
static int logits_down(mla_cmodel *m, int64_t nout, float *const *rows, int tp, mla_err *err) {
    const int64_t V = m->cfg.n_vocab;
    cudaStream_t st = m->st;
    if (nout <= 0) {
        tstep_close(m, tp);
        CU(cudaStreamSynchronize(st), "step");
        return MLA_OK;
    }
    if (!m->out_split) {
        CU(cudaMemcpyAsync(m->hbuf, m->logit_dev, (size_t)(nout * V) * 4, cudaMemcpyDeviceToHost, st), "logits copy");
        tstep_close(m, tp);
        CU(cudaStreamSynchronize(st), "step");
        for (int64_t i = 0; i < nout; i++)
            if (rows[i]) memcpy(rows[i], m->hbuf + i * V, (size_t)V * 4);
        return MLA_OK;
    }
    const int64_t Vr = m->out_r1 - m->out_r0;
    if (m->coll_dev) { /* gathered on the device by the step */
        CU(cudaMemcpyAsync(m->hbuf, m->dgbuf, (size_t)(m->world * nout * Vr) * 4, cudaMemcpyDeviceToHost, st),
           "logits copy");
        tstep_close(m, tp);
        CU(cudaStreamSynchronize(st), "step");
    } else {
        CU(cudaMemcpyAsync(m->hbuf2, m->logit_dev, (size_t)(nout * Vr) * 4, cudaMemcpyDeviceToHost, st), "logits copy");
        tstep_close(m, tp);
        CU(cudaStreamSynchronize(st), "step");
        TRY(coll_allgather_f32(m->c, m->hbuf2, m->hbuf, (size_t)(nout * Vr), err));
    }
    for (int64_t i = 0; i < nout; i++)
        if (rows[i])
            for (int r = 0; r < m->world; r++) memcpy(rows[i] + r * Vr, m->hbuf + (r * nout + i) * Vr, (size_t)Vr * 4);
    return MLA_OK;
}

/* Writes token t of the step block staged at hs (pinned): its id, position and sequence. */
static void step_set(uint8_t *hs, int64_t T, int64_t t, int32_t tok, int64_t pos, const mla_cstate *s) {
    const step_off so = step_layout(T);
    ((int32_t *)hs)[t] = tok;
    ((int32_t *)(hs + so.pos))[t] = (int32_t)pos;
    ((float ***)(hs + so.tabs))[t] = s->tab_d;
}

extern "C" bool mla_cmodel_device_argmax(const mla_cmodel *m) { return !m->out_split || m->coll_dev; }

extern "C" int mla_cmodel_decode(mla_cmodel *m, mla_cstate *const *states, const int32_t *tokens, int64_t B,
                                 float *const *logits, mla_err *err) {
    return mla_cmodel_decode_greedy(m, states, tokens, B, logits, NULL, err);
}

/* A decode step's key bound (what its graph is keyed on and its attention is sized by): the most
 * keys a token of the step has, rounded up to a power of two (at least 256), at most the largest
 * cache. A sequence moves to the next graph log2 times over its life; the attention's splits, and
 * GLM-5's indexer (skipped while the bound is within top_k), follow the sequences' length rather
 * than the size of their caches (MLA_N_CTX). */
static int64_t key_bound(int64_t need, int64_t cap) {
    int64_t b = 256;
    while (b < need) b *= 2;
    return b < cap ? b : cap;
}

/* The checks of a decode step of B states (tokens NULL: not checked, they come from the device):
 * *max_keys its key bound, *cap the largest cache. */
static int decode_check(const mla_cmodel *m, mla_cstate *const *states, const int32_t *tokens, int64_t B,
                        int64_t *max_keys, int64_t *cap_out, mla_err *err) {
    const mla_config *c = &m->cfg;
    if (B <= 0) return mla_errf(err, "no sequences to decode");
    if (B > 65535) return mla_errf(err, "a decode step of %lld sequences exceeds 65535", (long long)B);
    int64_t need = 0, cap = 0; /* the most keys a token of this step has; the largest cache */
    for (int64_t b = 0; b < B; b++) {
        const mla_cstate *s = states[b];
        MLA_ASSERT(s && s->m == m);
        if (tokens && (tokens[b] < 0 || tokens[b] >= c->n_vocab))
            return mla_errf(err, "token id %d of sequence %lld is outside the vocabulary of %lld", tokens[b],
                            (long long)b, (long long)c->n_vocab);
        if (s->n_past + 1 > s->n_ctx)
            return mla_errf(err, "sequence %lld: position %lld is past the context of %lld", (long long)b,
                            (long long)s->n_past, (long long)s->n_ctx);
        for (int64_t b2 = 0; b2 < b; b2++)
            if (states[b2] == s) return mla_errf(err, "sequence %lld appears twice in one decode step", (long long)b);
        if (s->n_past + 1 > need) need = s->n_past + 1;
        if (s->n_ctx > cap) cap = s->n_ctx;
    }
    *max_keys = key_bound(need, cap);
    *cap_out = cap;
    return MLA_OK;
}

/* Remembers the states of the decode step whose greedy ids dids now holds (B 0: none). */
static void set_last(mla_cmodel *m, mla_cstate *const *states, int64_t B) {
    if (B > m->last_cap) {
        m->last_cap = B;
        m->last_st = (mla_cstate **)mla_xrealloc(m->last_st, (size_t)B * sizeof *m->last_st);
    }
    if (B) memcpy(m->last_st, states, (size_t)B * sizeof *states);
    m->last_B = B;
}

/* The sampling of the B rows of the decode step just launched by samp (the settings staged in
 * stage g and uploaded to dsamp) into dids. */
static int sample_launch(mla_cmodel *m, int64_t B, mla_cmodel::sstage *g, const mla_cmodel_samp *samp,
                         mla_err *err) {
    const int64_t V = m->cfg.n_vocab;
    int64_t nm = 0, nb = 0;
    for (int64_t b = 0; b < B; b++) {
        nm += samp[b].allow != nullptr;
        nb += samp[b].n_bias;
    }
    auto al = [](size_t x) { return (x + 15) / 16 * 16; };
    const size_t o_ids = al((size_t)B * sizeof(mla_cuda_samp)), o_vals = al(o_ids + (size_t)nb * 4),
                 o_mask = al(o_vals + (size_t)nb * 4), total = o_mask + (size_t)(nm * V);
    if (total > g->cap) { /* the stage's last step has been waited for (or synchronised) */
        if (g->h) cudaFreeHost(g->h);
        g->h = nullptr;
        g->cap = 0;
        CU(cudaMallocHost((void **)&g->h, total + total / 4), "pinned sampling stage");
        g->cap = total + total / 4;
    }
    if (total > m->dsamp_cap) { /* cudaFree waits for the work that may still read it */
        if (m->dsamp) cudaFree(m->dsamp);
        m->dsamp = nullptr;
        m->dsamp_cap = 0;
        CU(cudaMalloc((void **)&m->dsamp, total + total / 4), "sampling settings (%zu bytes)", total);
        m->dsamp_cap = total + total / 4;
    }
    mla_cuda_samp *r = (mla_cuda_samp *)g->h;
    int32_t *ids = (int32_t *)(g->h + o_ids);
    float *vals = (float *)(g->h + o_vals);
    int32_t km = 0, kb = 0;
    for (int64_t b = 0; b < B; b++) {
        const mla_cmodel_samp *q = &samp[b];
        r[b] = mla_cuda_samp{};
        r[b].temperature = q->temperature;
        r[b].top_k = q->top_k;
        r[b].top_p = q->top_p;
        r[b].min_p = q->min_p;
        r[b].seed = q->seed;
        r[b].stream = q->stream;
        r[b].mask = q->allow ? km : -1;
        r[b].bias_off = kb;
        r[b].n_bias = (int32_t)q->n_bias;
        if (q->allow) memcpy(g->h + o_mask + (size_t)(km++) * (size_t)V, q->allow, (size_t)V);
        if (q->n_bias) {
            memcpy(ids + kb, q->bias_ids, q->n_bias * 4);
            memcpy(vals + kb, q->bias_vals, q->n_bias * 4);
            kb += (int32_t)q->n_bias;
        }
    }
    CU(cudaMemcpyAsync(m->dsamp, g->h, total, cudaMemcpyHostToDevice, m->st), "sampling settings upload");
    const float *lg = m->out_split ? m->dgbuf : m->logit_dev;
    const int64_t np = m->out_split ? m->out_r1 - m->out_r0 : V;
    TRY(mla_cuda_sample_pieces(lg, B, np, m->out_split ? m->world : 1, (const mla_cuda_samp *)m->dsamp,
                               m->dsamp + o_mask, (const int32_t *)(m->dsamp + o_ids),
                               (const float *)(m->dsamp + o_vals), m->dids, m->st, err));
    return MLA_OK;
}

/* The ids of the B rows of the decode step just launched (greedy, or sampled by samp) into dids
 * and on to the slot's pinned ids (hids or hq). */
static int pick_ids(mla_cmodel *m, int64_t B, int slot, const mla_cmodel_samp *samp, mla_err *err) {
    const int64_t V = m->cfg.n_vocab;
    if (samp) TRY(sample_launch(m, B, &m->ss[slot < 0 ? 2 : slot], samp, err));
    else if (!m->out_split) TRY(mla_cuda_argmax(m->logit_dev, B, V, m->dids, m->st, err));
    else TRY(mla_cuda_argmax_pieces(m->dgbuf, B, m->out_r1 - m->out_r0, m->world, m->dids, m->st, err));
    CU(cudaMemcpyAsync(slot < 0 ? m->hids : m->hq[slot], m->dids, (size_t)B * 4, cudaMemcpyDeviceToHost, m->st),
       "token ids copy");
    /* a sampled row may take none (-1): the host sees it; a step queued from these ids reads 0 */
    if (samp) TRY(mla_cuda_ids_to_tokens(m->dids, B, m->cfg.n_vocab, m->dids, m->st, err));
    return MLA_OK;
}

/* A decode step of the B states (decode_check's max_keys and cap) on the model's stream, not
 * waited for; the states' n_past advanced. Its step block is staged in the model's pinned block
 * (slot < 0) or in queue slot `slot` (hsq), looked up after ensure_scratch, which may move the
 * model's. tokens NULL: each state's token is the id the step before took, still in dids.
 * ids: the step's ids (greedy, or sampled by samp) also go to dids and are copied to the slot's
 * pinned ids (hids or hq), and these states become the ones dids belongs to (set_last); else to
 * none. later (a queue slot): the ids are left to mla_cmodel_decode_queue_samp (m->pend). */
static int decode_launch(mla_cmodel *m, mla_cstate *const *states, const int32_t *tokens, int64_t B,
                         int64_t max_keys, int64_t cap, int slot, bool ids, const mla_cmodel_samp *samp, bool later,
                         mla_err *err) {
    m->last_B = 0;
    TRY(ensure_scratch(m, B, cap, B, err)); /* sized for the caches: a bound that grows reallocates nothing */
    uint8_t *hs = slot < 0 ? m->hstep : m->hsq[slot];
    for (int64_t b = 0; b < B; b++) {
        TRY(state_covers(states[b], states[b]->n_past + 1, err));
        step_set(hs, B, b, tokens ? tokens[b] : 0, states[b]->n_past, states[b]);
    }
    tstep_open(m);
    CU(cudaMemcpyAsync(m->dstep, hs, step_layout(B).total, cudaMemcpyHostToDevice, m->st), "step block upload");
    if (!tokens) /* the tokens: the ids the step before took, still on the device */
        CU(cudaMemcpyAsync(m->dstep, m->dids, (size_t)B * 4, cudaMemcpyDeviceToDevice, m->st), "ids to tokens");
    TRY(decode_run(m, B, max_keys, err));
    for (int64_t b = 0; b < B; b++) states[b]->n_past++;
    if (!ids) return MLA_OK;
    set_last(m, states, B);
    if (later) {
        m->pend = true;
        m->pend_slot = slot;
        m->pend_B = B;
        return MLA_OK;
    }
    /* the tokens from the device: B ints instead of B rows of logits */
    return pick_ids(m, B, slot, samp, err);
}

extern "C" int mla_cmodel_decode_greedy(mla_cmodel *m, mla_cstate *const *states, const int32_t *tokens, int64_t B,
                                        float *const *logits, int32_t *ids, mla_err *err) {
    return mla_cmodel_decode_sample(m, states, tokens, B, logits, NULL, ids, err);
}

extern "C" int mla_cmodel_decode_sample(mla_cmodel *m, mla_cstate *const *states, const int32_t *tokens, int64_t B,
                                        float *const *logits, const mla_cmodel_samp *samp, int32_t *ids,
                                        mla_err *err) {
    int64_t max_keys = 0, cap = 0;
    TRY(decode_check(m, states, tokens, B, &max_keys, &cap, err));
    MLA_ASSERT(!ids || mla_cmodel_device_argmax(m));
    if (m->pend) return mla_errf(err, "a queued step waits for its sampling settings");
    CU(cudaSetDevice(m->device), "cudaSetDevice");
    TRY(decode_launch(m, states, tokens, B, max_keys, cap, -1, ids != NULL, ids ? samp : NULL, false, err));
    const int tp = m->tev_cur, tprev = m->tev_prev;
    bool any = false;
    for (int64_t b = 0; logits && b < B; b++) any |= logits[b] != nullptr;
    TRY(any ? logits_down(m, B, logits, tp, err) : logits_down(m, 0, NULL, tp, err));
    tstep_done(m, m->tev_cur == tp ? tp : -1, tprev);
    if (ids) memcpy(ids, m->hids, (size_t)B * 4);
    return MLA_OK;
}

extern "C" int mla_cmodel_decode_queue(mla_cmodel *m, mla_cstate *const *states, const int32_t *tokens, int64_t B,
                                       mla_err *err) {
    return mla_cmodel_decode_queue_sample(m, states, tokens, B, NULL, false, err);
}

extern "C" int mla_cmodel_decode_queue_sample(mla_cmodel *m, mla_cstate *const *states, const int32_t *tokens,
                                              int64_t B, const mla_cmodel_samp *samp, bool later, mla_err *err) {
    int64_t max_keys = 0, cap = 0;
    TRY(decode_check(m, states, tokens, B, &max_keys, &cap, err));
    if (!mla_cmodel_device_argmax(m))
        return mla_errf(err, "this model takes no tokens on the device: nothing can be queued");
    if (m->nq == 2) return mla_errf(err, "two decode steps are queued already");
    if (m->pend) return mla_errf(err, "the queued step waits for its sampling settings");
    if (!tokens) { /* the ids in dids must be these states' */
        bool same = m->last_B == B;
        for (int64_t b = 0; same && b < B; b++) same = m->last_st[b] == states[b];
        if (!same) return mla_errf(err, "the last decode step's ids are not these %lld sequences'", (long long)B);
        if (B > m->cap_T || cap > m->cap_keys || B > m->cap_out)
            return mla_errf(err, "a queued step from the device's ids cannot grow the scratch");
    }
    CU(cudaSetDevice(m->device), "cudaSetDevice");
    if (B > m->cap_q) { /* only with nothing queued: the slots move */
        if (m->nq > 0) return mla_errf(err, "a queued step of %lld rows needs larger slots while one is queued", (long long)B);
        queue_free(m);
        const int64_t n = B < 256 ? 256 : B;
        for (int k = 0; k < 2; k++) {
            CU(cudaMallocHost((void **)&m->hsq[k], step_layout(n).total), "pinned step block");
            CU(cudaMallocHost((void **)&m->hq[k], (size_t)n * 4), "pinned ids");
            CU(cudaEventCreateWithFlags(&m->qev[k], cudaEventDisableTiming), "event");
        }
        m->cap_q = n;
    }
    const int slot = m->qnext;
    TRY(decode_launch(m, states, tokens, B, max_keys, cap, slot, true, samp, later, err));
    tstep_close(m, m->tev_cur);
    if (!later) CU(cudaEventRecord(m->qev[slot], m->st), "event");
    m->qs[m->nq++] = mla_cmodel::qstep{B, slot, false, m->tev_cur, m->tev_prev};
    m->qnext ^= 1;
    return MLA_OK;
}

extern "C" int mla_cmodel_decode_queue_samp(mla_cmodel *m, const mla_cmodel_samp *samp, mla_err *err) {
    if (!m->pend) return mla_errf(err, "no queued step waits for its sampling settings");
    m->pend = false;
    CU(cudaSetDevice(m->device), "cudaSetDevice");
    const int rc = pick_ids(m, m->pend_B, m->pend_slot, samp, err);
    if (rc) { /* the step's ids are not taken: nothing may be queued from them, its wait fails */
        m->last_B = 0;
        m->qs[m->nq - 1].failed = true;
    }
    /* recorded either way, so that waiting for the step waits for what of it was queued */
    const cudaError_t ce = cudaEventRecord(m->qev[m->pend_slot], m->st);
    if (rc) return rc;
    if (ce != cudaSuccess) return mla_errf(err, "event: %s", cudaGetErrorString(ce));
    return MLA_OK;
}

extern "C" int mla_cmodel_decode_wait(mla_cmodel *m, int32_t *ids, mla_err *err) {
    if (m->nq == 0) return mla_errf(err, "no decode step is queued");
    if (m->pend && m->nq == 1) return mla_errf(err, "the queued step waits for its sampling settings");
    const mla_cmodel::qstep q = m->qs[0];
    m->qs[0] = m->qs[1];
    m->nq--;
    CU(cudaEventSynchronize(m->qev[q.slot]), "queued decode step of %lld sequences", (long long)q.B);
    if (q.failed) return mla_errf(err, "the queued decode step of %lld sequences was not sampled", (long long)q.B);
    tstep_done(m, q.tp, q.tprev);
    memcpy(ids, m->hq[q.slot], (size_t)q.B * 4);
    return MLA_OK;
}

extern "C" bool mla_cmodel_batched(const mla_cmodel *m) { return m->batched; }

extern "C" void mla_cmodel_decode_time(const mla_cmodel *m, uint64_t *steps, double *busy_s, double *between_s) {
    *steps = m->dt_steps;
    *busy_s = m->dt_busy;
    *between_s = m->dt_between;
}

extern "C" void mla_cmodel_graph_stats(const mla_cmodel *m, uint64_t *captures, uint64_t *launches) {
    *captures = m->n_graph_capture;
    *launches = m->n_graph_launch;
}

extern "C" uint64_t mla_cmodel_prefill_mha_count(const mla_cmodel *m) { return m->n_pf; }

extern "C" int mla_cstate_bench_fill(mla_cstate *s, int64_t n_past, mla_err *err) {
    mla_cmodel *m = s->m;
    if (n_past < 0 || n_past >= s->n_ctx)
        return mla_errf(err, "cannot fill %lld positions: the context holds %lld", (long long)n_past,
                        (long long)s->n_ctx);
    CU(cudaSetDevice(m->device), "cudaSetDevice");
    TRY(state_covers(s, n_past, err));
    for (int64_t b = 0; b < s->n_blk; b++) CU(cudaMemsetAsync(s->tab_h[b], 0, m->blk_floats * 4, m->st), "cache fill");
    CU(cudaStreamSynchronize(m->st), "cache fill");
    s->n_past = n_past;
    return MLA_OK;
}

extern "C" int mla_cmodel_bench_coll(mla_cmodel *m, size_t n, int iters, double *sec_per_op, mla_err *err) {
    MLA_ASSERT(iters > 0);
    *sec_per_op = 0;
    CU(cudaSetDevice(m->device), "cudaSetDevice");
    float *d = nullptr;
    CU(cudaMalloc((void **)&d, (n ? n : 1) * 4), "bench buffer of %zu floats", n);
    int rc = MLA_OK;
    if (cudaMemsetAsync(d, 0, n * 4, m->st) != cudaSuccess) rc = mla_errf(err, "bench buffer memset");
    /* the model's own all-reduce path (NCCL on device buffers, or the host collective through
     * pinned copies), which needs staging for n floats: the scratch of a step of that size */
    if (rc == MLA_OK) rc = ensure_scratch(m, (int64_t)(n / (size_t)m->cfg.n_embd) + 1, m->cap_keys, m->cap_out, err);
    for (int i = 0; i < 2 && rc == MLA_OK; i++) rc = allreduce(m, d, n, err);
    if (rc == MLA_OK && cudaStreamSynchronize(m->st) != cudaSuccess) rc = mla_errf(err, "bench sync");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < iters && rc == MLA_OK; i++) rc = allreduce(m, d, n, err);
    if (rc == MLA_OK && cudaStreamSynchronize(m->st) != cudaSuccess) rc = mla_errf(err, "bench sync");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cudaFree(d);
    if (rc == MLA_OK) *sec_per_op = ((double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9) / iters;
    return rc;
}

extern "C" int mla_cmodel_forward(mla_cmodel *m, mla_cstate *s, const int32_t *tokens, int64_t T, int64_t pos0,
                                  int mode, float *logits, mla_err *err) {
    const mla_config *c = &m->cfg;
    if (mla_config_check_step(c, tokens, T, pos0, s->n_past, s->n_ctx, err)) return MLA_ERR;
    if (T == 1 && m->batched) { /* a decode step: the batched (and graph) path with one sequence */
        float *rows[1] = {mode != 0 ? logits : NULL};
        return mla_cmodel_decode(m, &s, tokens, 1, rows, err);
    }
    /* a prompt: one step of T tokens of this sequence at positions pos0.. (no graph) */
    CU(cudaSetDevice(m->device), "cudaSetDevice");
    m->last_B = 0;
    const int64_t max_keys = pos0 + T;
    const int64_t out0 = mode == 1 ? T - 1 : 0, nout = mode == 0 ? 0 : T - out0, V = c->n_vocab;
    TRY(ensure_scratch(m, T, max_keys, nout, err));
    TRY(state_covers(s, pos0 + T, err));
    for (int64_t t = 0; t < T; t++) step_set(m->hstep, T, t, tokens[t], pos0 + t, s);
    CU(cudaMemcpyAsync(m->dstep, m->hstep, step_layout(T).total, cudaMemcpyHostToDevice, m->st), "step block upload");
    m->pf_tab = s->tab_d; /* one sequence, positions pos0 .. pos0 + T - 1: the prompt attention may take it */
    m->pf_pos0 = pos0;
    const int brc = step_body(m, T, max_keys, out0, nout, err);
    m->pf_tab = nullptr;
    TRY(brc);
    s->n_past = pos0 + T;
    float **rows = (float **)mla_xmalloc((size_t)(nout > 0 ? nout : 1) * sizeof *rows);
    for (int64_t i = 0; i < nout; i++) rows[i] = logits + i * V;
    int rc = logits_down(m, nout, rows, -1, err);
    free(rows);
    return rc;
}

/* --allreduce oneshot: each rank's input buffer and signal area, their IPC handles gathered over
 * the collective (NCCL: through a device buffer on the stream; the host collective: host memory),
 * the peers' opened; every area zeroed before any rank's first call. Over the host collective
 * the ranks may share a GPU (each process maps the others' memory on it): their kernels then
 * take turns on it, so each barrier waits for the others' turn: for checking, not for speed. */
extern "C" int mla_cmodel_ar_oneshot(mla_cmodel *m, bool one_host, mla_err *err) {
    if (m->world == 1) return MLA_OK;
    if (!one_host)
        return mla_errf(err, "--allreduce oneshot needs every rank on one host (workers the coordinator starts)");
    if (m->world > MLA_AR_MAX_RANKS)
        return mla_errf(err, "--allreduce oneshot takes at most %d ranks, not %d", MLA_AR_MAX_RANKS, m->world);
    CU(cudaSetDevice(m->device), "cudaSetDevice");
    CU(cudaMalloc((void **)&m->ar_in, AR_ONESHOT_BYTES), "one-shot all-reduce buffer");
    CU(cudaMalloc(&m->ar_sig, mla_cuda_ar_sig_bytes()), "one-shot all-reduce signal area");
    cudaIpcMemHandle_t hs[2];
    CU(cudaIpcGetMemHandle(&hs[0], m->ar_in), "IPC handle of the all-reduce buffer");
    CU(cudaIpcGetMemHandle(&hs[1], m->ar_sig), "IPC handle of the all-reduce signal area");
    const size_t hf = (sizeof hs + 3) / 4; /* the handles as floats: the collective copies the bits */
    float *dh = nullptr, *hin = (float *)mla_xcalloc(hf, 4); /* the handles, then the meet's float */
    float *hh = (float *)mla_xcalloc(hf * (size_t)m->world, 4);
    memcpy(hin, hs, sizeof hs);
    int rc = MLA_OK;
    if (m->coll_dev) {
        if (cudaMalloc((void **)&dh, hf * 4 * (size_t)(m->world + 1)) != cudaSuccess)
            rc = mla_errf(err, "IPC handle exchange buffer");
        if (rc == MLA_OK && cudaMemcpyAsync(dh, hs, sizeof hs, cudaMemcpyHostToDevice, m->st) != cudaSuccess)
            rc = mla_errf(err, "IPC handle copy");
        if (rc == MLA_OK) rc = coll_allgather_f32(m->c, dh, dh + hf, hf, err);
        if (rc == MLA_OK &&
            cudaMemcpyAsync(hh, dh + hf, hf * 4 * (size_t)m->world, cudaMemcpyDeviceToHost, m->st) != cudaSuccess)
            rc = mla_errf(err, "IPC handle copy back");
        if (rc == MLA_OK && cudaStreamSynchronize(m->st) != cudaSuccess) rc = mla_errf(err, "IPC handle exchange");
    } else {
        rc = coll_allgather_f32(m->c, hin, hh, hf, err);
    }
    m->ar.rank = m->rank;
    m->ar.world = m->world;
    for (int r = 0; r < m->world && rc == MLA_OK; r++) {
        if (r == m->rank) {
            m->ar.buf[r] = m->ar_in;
            m->ar.sig[r] = m->ar_sig;
            continue;
        }
        cudaIpcMemHandle_t ph[2];
        memcpy(ph, hh + (size_t)r * hf, sizeof ph);
        void *pb = nullptr, *psg = nullptr;
        cudaError_t e = cudaIpcOpenMemHandle(&pb, ph[0], cudaIpcMemLazyEnablePeerAccess);
        if (e == cudaSuccess) {
            m->ar.buf[r] = (const float *)pb;
            e = cudaIpcOpenMemHandle(&psg, ph[1], cudaIpcMemLazyEnablePeerAccess);
            if (e == cudaSuccess) m->ar.sig[r] = psg;
        }
        if (e != cudaSuccess)
            rc = mla_errf(err, "--allreduce oneshot: opening rank %d's buffers (peer access between the GPUs?): %s", r,
                          cudaGetErrorString(e));
    }
    /* every signal area zeroed before any rank's first call: zero, then meet once */
    if (rc == MLA_OK) rc = mla_cuda_ar_sig_init(m->ar_sig, m->st, err);
    if (rc == MLA_OK && cudaStreamSynchronize(m->st) != cudaSuccess) rc = mla_errf(err, "one-shot all-reduce setup");
    if (rc == MLA_OK) rc = coll_allreduce_sum_f32(m->c, m->coll_dev ? dh : hin, 1, err);
    if (rc == MLA_OK && cudaStreamSynchronize(m->st) != cudaSuccess) rc = mla_errf(err, "one-shot all-reduce setup");
    if (dh) cudaFree(dh);
    free(hin);
    free(hh);
    if (rc == MLA_OK) {
        m->ar_on = true;
        MLA_INFO("rank %d: all-reduces of at most %u KB one-shot through peer memory (%d ranks)", m->rank,
                 AR_ONESHOT_BYTES >> 10, m->world);
    }
    return rc;
}
