#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/layer_tensors.h"
#include "common/loadprog.h"
#include "common/mla_log.h"
#include "common/shard_plan.h"
#include "common/threadpool.h"
#include "kernels/act.h"
#include "kernels/dsa_indexer.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/mla_attn.h"
#include "kernels/moe.h"
#include "kernels/quant.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

/* A dense / shared-expert SwiGLU FFN shard. */
typedef struct ffn_shard {
    mla_mat gate, up, down; /* gate/up: rows of this rank; down: the same columns */
    bool skip;              /* replicated and computed by rank 0 alone; this rank adds zero */
} ffn_shard;

typedef struct layer_w {
    const float *attn_norm, *ffn_norm, *q_a_norm, *kv_a_norm;
    mla_mat q_a, q_b, kv_a; /* q_b: rows of this rank's heads (or plain attn_q when no q_lora) */
    bool legacy_kv_b;
    const gguf_tensor *k_b, *v_b, *kv_b;
    const uint8_t *k_b_data, *v_b_data; /* whole-tensor layout; this rank's heads filled */
    mla_mat kv_b_mat;       /* legacy: rows of this rank's heads, starting at global row kv_b_r0 */
    int64_t kv_b_r0;
    mla_mat o;              /* attn_output view of this rank */
    bool o_gather;          /* o split by output rows [o_r0, o_r1) with the head outputs gathered */
    int64_t o_r0, o_r1;
    /* indexer */
    mla_mat iq_b, ik, iproj;
    const float *ik_norm_w, *ik_norm_b;
    /* FFN */
    bool dense;
    ffn_shard ffn;          /* dense FFN or shared experts */
    bool has_shexp;
    mla_mat router;
    const float *router_bias;
    moe_experts ex;
} layer_w;

struct mla_model {
    mla_config cfg;
    const gguf_ctx *g;
    coll *c;
    coll *own_coll;
    int rank, world;
    int64_t h0, h1, n_head_local;
    threadpool *tp;
    rope_table rope;
    const gguf_tensor *tok_embd;
    const float *out_norm;
    mla_mat output;         /* rows [out_r0, out_r1) */
    int64_t out_r0, out_r1;
    bool out_split;
    layer_w *L;
    bool *owned;            /* [n_expert] */
    /* world > 1: this rank's bytes of every split tensor, copied out of the file mapping */
    void **priv;
    size_t *priv_len;
    size_t n_priv;
};

struct mla_state {
    int64_t n_ctx, n_past;
    int64_t n_layer, kv_row, ik_row;
    float **kv;             /* [layer] n_ctx * kv_row */
    float **ik;             /* [layer] n_ctx * ik_row, NULL without indexer */
};

/* ---------------- loading ---------------- */

static const float *f32_of(const gguf_tensor *t) { return t ? (const float *)(const void *)t->data : NULL; }

static mla_mat mat_of(const gguf_tensor *t) { return mla_mat_make(t->type, t->data, t->ne[0], t->ne[1]); }

static int check_type(const gguf_tensor *t, mla_err *err) {
    if (t->type != GGML_TYPE_F32 && !quant_supported(t->type))
        return mla_errf(err, "%s: type %s is not supported by this build", t->name, ggml_type_name(t->type));
    return MLA_OK;
}

/* With several ranks, each rank copies its bytes of every split tensor into private memory
 * and drops its mapping of the whole tensor, so that a worker keeps resident only its shard
 * (a column slice of a matrix touches every page of it; experts and heads are contiguous but
 * the kernel maps neighbouring pages around each fault). Private buffers are anonymous
 * mappings: pages never written (other ranks' experts and heads, kept at their offsets so that
 * indexing is unchanged) cost nothing. One rank keeps zero-copy views into the file. */
static uint8_t *priv_alloc(mla_model *m, size_t n) {
    void *p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) MLA_PANIC("out of memory: %zu bytes for a weight shard", n);
    m->priv = mla_xrealloc(m->priv, (m->n_priv + 1) * sizeof *m->priv);
    m->priv_len = mla_xrealloc(m->priv_len, (m->n_priv + 1) * sizeof *m->priv_len);
    m->priv[m->n_priv] = p;
    m->priv_len[m->n_priv++] = n ? n : 1;
    return p;
}

/* A compact private copy of view v (rows of its columns, row_stride = the slice's bytes). */
static mla_mat priv_mat(mla_model *m, mla_mat v) {
    if (m->world == 1) return v;
    size_t rb = ggml_row_bytes(v.type, v.n_in);
    uint8_t *p = priv_alloc(m, rb * (size_t)v.n_out);
    for (int64_t r = 0; r < v.n_out; r++) memcpy(p + (size_t)r * rb, v.data + (size_t)r * v.row_stride, rb);
    v.data = p;
    v.row_stride = rb;
    return v;
}

/* A private copy of slices [s] of a 3-D tensor (slice_bytes each) for which keep(s) holds,
 * at their offsets in a buffer of the whole tensor's size. */
static const uint8_t *priv_slices(mla_model *m, const gguf_tensor *t, int64_t n_slices, const bool *keep,
                                  int64_t s0, int64_t s1) {
    if (m->world == 1) return t->data;
    size_t sb = t->nbytes / (size_t)n_slices;
    uint8_t *p = priv_alloc(m, t->nbytes);
    for (int64_t s = 0; s < n_slices; s++)
        if (keep ? keep[s] : (s >= s0 && s < s1)) memcpy(p + (size_t)s * sb, t->data + (size_t)s * sb, sb);
    return p;
}

static void drop_mapping(const mla_model *m, const gguf_tensor *t) {
    if (m->world > 1) gguf_evict(m->g, t->data, t->nbytes);
}

/* The view of a 2-D matrix this rank uses, from its plan entry. */
static mla_mat shard_mat_view(const shard_plan *p, const gguf_tensor *t) {
    mla_mat m = mat_of(t);
    const shard_entry *e = shard_plan_find(p, t->name);
    MLA_ASSERT(e);
    if (e->kind == SHARD_ROWS) return mla_mat_rows(&m, e->begin, e->end);
    if (e->kind == SHARD_COLS) return mla_mat_cols(&m, e->begin, e->end);
    return m;
}

/* The same, as this rank's own copy when the tensor is split. */
static mla_mat shard_mat(mla_model *mm, const shard_plan *p, const gguf_tensor *t) {
    const shard_entry *e = shard_plan_find(p, t->name);
    MLA_ASSERT(e);
    mla_mat v = shard_mat_view(p, t);
    if (e->kind == SHARD_REPLICATE) return v;
    v = priv_mat(mm, v);
    drop_mapping(mm, t);
    return v;
}

static void load_ffn(mla_model *m, ffn_shard *f, const shard_plan *p, const gguf_tensor *gt,
                     const gguf_tensor *ut, const gguf_tensor *dt) {
    const shard_entry *eg = shard_plan_find(p, gt->name), *ed = shard_plan_find(p, dt->name);
    MLA_ASSERT(eg && ed);
    f->skip = (eg->rank0_only || ed->rank0_only) && m->rank != 0;
    if (eg->rank0_only || ed->rank0_only) { /* replicated: whole matrices (rank 0 alone reads them) */
        f->gate = mat_of(gt);
        f->up = mat_of(ut);
        f->down = mat_of(dt);
    } else {
        f->gate = shard_mat(m, p, gt);
        f->up = shard_mat(m, p, ut);
        f->down = shard_mat(m, p, dt);
    }
    MLA_ASSERT(f->gate.n_out == f->down.n_in && f->up.n_out == f->gate.n_out);
}

int mla_model_load(mla_model **out, const gguf_ctx *g, coll *c, const mla_model_opts *opts,
                   mla_err *err) {
    *out = NULL;
    loadprog_begin(g);
    mla_model *m = mla_xcalloc(1, sizeof *m);
    m->g = g;
    if (!c) c = m->own_coll = coll_single_new();
    m->c = c;
    m->rank = c->rank;
    m->world = c->world;
    shard_plan plan;
    memset(&plan, 0, sizeof plan);
    if (mla_config_from_gguf(&m->cfg, g, err) < 0) goto fail;
    if (mla_config_check_tensors(&m->cfg, g, err) < 0) goto fail;
    const mla_config *cf = &m->cfg;
    if (cf->n_rope > ROPE_MAX_DIMS) {
        mla_errf(err, "rope dims %lld exceed %d", (long long)cf->n_rope, ROPE_MAX_DIMS);
        goto fail;
    }
    for (size_t i = 0; i < gguf_n_tensors(g); i++)
        if (check_type(gguf_tensor_at(g, i), err) < 0) goto fail;

    if (shard_plan_for_model(&plan, g, cf, m->rank, m->world, err) < 0) goto fail;
    m->h0 = cf->n_head * m->rank / m->world;
    m->h1 = cf->n_head * (m->rank + 1) / m->world;
    m->n_head_local = m->h1 - m->h0;

    rope_table_for_model(&m->rope, cf);

    m->tok_embd = gguf_find_tensor(g, "token_embd.weight");
    m->out_norm = f32_of(gguf_find_tensor(g, "output_norm.weight"));
    {
        const gguf_tensor *ot = gguf_find_tensor(g, "output.weight");
        const shard_entry *e = shard_plan_find(&plan, ot->name);
        m->output = mat_of(ot);
        m->out_r0 = 0;
        m->out_r1 = cf->n_vocab;
        if (e->kind == SHARD_ROWS && m->world > 1) {
            m->out_split = true;
            m->out_r0 = e->begin;
            m->out_r1 = e->end;
            m->output = priv_mat(m, mla_mat_rows(&m->output, e->begin, e->end));
            drop_mapping(m, ot);
        }
    }
    if (cf->n_expert > 0) {
        m->owned = mla_xcalloc((size_t)cf->n_expert, sizeof *m->owned);
        for (int64_t e = 0; e < cf->n_expert; e++) m->owned[e] = e % m->world == m->rank;
    }

    m->L = mla_xcalloc((size_t)cf->n_layer, sizeof *m->L);
    for (int64_t il = 0; il < cf->n_layer; il++) {
        loadprog_layers_done(g, il);
        layer_w *l = &m->L[il];
        layer_tensors lt;
        if (layer_tensors_find(cf, g, il, &lt, err) < 0) goto fail;
        l->attn_norm = f32_of(lt.t[LT_ATTN_NORM]);
        l->ffn_norm = f32_of(lt.t[LT_FFN_NORM]);
        l->kv_a_norm = f32_of(lt.t[LT_KV_A_NORM]);
        l->kv_a = mat_of(lt.t[LT_KV_A]);
        if (cf->q_lora_rank > 0) {
            l->q_a = mat_of(lt.t[LT_Q_A]);
            l->q_a_norm = f32_of(lt.t[LT_Q_A_NORM]);
            l->q_b = shard_mat(m, &plan, lt.t[LT_Q_B]);
        } else {
            l->q_b = shard_mat(m, &plan, lt.t[LT_Q]);
        }
        l->k_b = lt.t[LT_K_B];
        l->v_b = lt.t[LT_V_B];
        l->kv_b = lt.t[LT_KV_B];
        l->legacy_kv_b = !l->k_b;
        if (l->legacy_kv_b) {
            l->kv_b_mat = shard_mat(m, &plan, l->kv_b);
            l->kv_b_r0 = shard_plan_find(&plan, l->kv_b->name)->begin;
        } else {
            l->k_b_data = priv_slices(m, l->k_b, cf->n_head, NULL, m->h0, m->h1);
            l->v_b_data = priv_slices(m, l->v_b, cf->n_head, NULL, m->h0, m->h1);
            drop_mapping(m, l->k_b);
            drop_mapping(m, l->v_b);
        }
        {
            const gguf_tensor *ot = lt.t[LT_ATTN_OUT];
            const shard_entry *e = shard_plan_find(&plan, ot->name);
            l->o = shard_mat(m, &plan, ot);
            l->o_gather = e->gather_input;
            l->o_r0 = e->kind == SHARD_ROWS ? e->begin : 0;
            l->o_r1 = e->kind == SHARD_ROWS ? e->end : cf->n_embd;
            if (e->kind == SHARD_REPLICATE && m->world > 1) {
                mla_errf(err, "%s: replicated attn_output is not supported with %d ranks", ot->name, m->world);
                goto fail;
            }
        }
        if (cf->idx_n_head > 0) {
            l->iq_b = mat_of(lt.t[LT_IQ_B]);
            l->ik = mat_of(lt.t[LT_IK]);
            l->iproj = mat_of(lt.t[LT_IPROJ]);
            l->ik_norm_w = f32_of(lt.t[LT_IK_NORM_W]);
            l->ik_norm_b = f32_of(lt.t[LT_IK_NORM_B]);
        }
        l->dense = lt.dense;
        if (l->dense) {
            load_ffn(m, &l->ffn, &plan, lt.t[LT_FFN_GATE],
                     lt.t[LT_FFN_UP], lt.t[LT_FFN_DOWN]);
        } else {
            l->router = mat_of(lt.t[LT_ROUTER]);
            l->router_bias = f32_of(lt.t[LT_ROUTER_BIAS]);
            const gguf_tensor *eg = lt.t[LT_EXP_GATE];
            const gguf_tensor *eu = lt.t[LT_EXP_UP];
            const gguf_tensor *ed = lt.t[LT_EXP_DOWN];
            l->ex = (moe_experts){eg->type,
                                  eu->type,
                                  ed->type,
                                  priv_slices(m, eg, cf->n_expert, m->owned, 0, 0),
                                  priv_slices(m, eu, cf->n_expert, m->owned, 0, 0),
                                  priv_slices(m, ed, cf->n_expert, m->owned, 0, 0),
                                  cf->n_embd,
                                  cf->n_ff_exp,
                                  cf->n_expert,
                                  m->owned};
            drop_mapping(m, eg);
            drop_mapping(m, eu);
            drop_mapping(m, ed);
            l->has_shexp = cf->n_expert_shared > 0;
            if (l->has_shexp)
                load_ffn(m, &l->ffn, &plan, lt.t[LT_SHEXP_GATE],
                         lt.t[LT_SHEXP_UP], lt.t[LT_SHEXP_DOWN]);
        }
    }
    if (plan.notes[0]) MLA_INFO("tensor-parallel plan notes:\n%s", plan.notes);
    shard_plan_free(&plan);
    loadprog_finish();
    m->tp = threadpool_new(opts && opts->n_threads > 0 ? opts->n_threads : 1);
    *out = m;
    return MLA_OK;
fail:
    shard_plan_free(&plan);
    mla_model_free(m);
    return MLA_ERR;
}

void mla_model_free(mla_model *m) {
    if (!m) return;
    threadpool_free(m->tp);
    for (size_t i = 0; i < m->n_priv; i++) munmap(m->priv[i], m->priv_len[i]);
    free(m->priv);
    free(m->priv_len);
    free(m->L);
    free(m->owned);
    if (m->own_coll) coll_free(m->own_coll);
    free(m);
}

const mla_config *mla_model_config(const mla_model *m) { return &m->cfg; }

mla_state *mla_state_new(const mla_model *m, int64_t n_ctx) {
    MLA_ASSERT(n_ctx > 0);
    mla_state *s = mla_xcalloc(1, sizeof *s);
    s->n_ctx = n_ctx;
    s->n_layer = m->cfg.n_layer;
    s->kv_row = m->cfg.kv_lora_rank + m->cfg.n_rope;
    s->ik_row = m->cfg.idx_head_dim;
    s->kv = mla_xcalloc((size_t)s->n_layer, sizeof *s->kv);
    s->ik = mla_xcalloc((size_t)s->n_layer, sizeof *s->ik);
    for (int64_t il = 0; il < s->n_layer; il++) {
        s->kv[il] = mla_xcalloc((size_t)(n_ctx * s->kv_row), sizeof(float));
        if (m->cfg.idx_n_head > 0) s->ik[il] = mla_xcalloc((size_t)(n_ctx * s->ik_row), sizeof(float));
    }
    return s;
}

void mla_state_free(mla_state *s) {
    if (!s) return;
    for (int64_t il = 0; il < s->n_layer; il++) {
        free(s->kv[il]);
        free(s->ik[il]);
    }
    free(s->kv);
    free(s->ik);
    free(s);
}

int64_t mla_state_n_past(const mla_state *s) { return s->n_past; }
int64_t mla_state_n_ctx(const mla_state *s) { return s->n_ctx; }
float *mla_state_rows(mla_state *s, int64_t il, bool indexer) {
    MLA_ASSERT(il >= 0 && il < s->n_layer);
    return indexer ? s->ik[il] : s->kv[il];
}
void mla_state_set_n_past(mla_state *s, int64_t n_past) {
    MLA_ASSERT(n_past >= 0 && n_past <= s->n_ctx);
    s->n_past = n_past;
}

void mla_state_truncate(mla_state *s, int64_t pos) {
    MLA_ASSERT(pos >= 0 && pos <= s->n_past);
    s->n_past = pos;
}

int mla_state_bench_fill(mla_state *s, int64_t n_past, mla_err *err) {
    if (n_past < 0 || n_past > s->n_ctx)
        return mla_errf(err, "%lld positions do not fit the context of %lld", (long long)n_past, (long long)s->n_ctx);
    for (int64_t il = 0; il < s->n_layer; il++) {
        memset(s->kv[il], 0, (size_t)(n_past * s->kv_row) * sizeof(float));
        if (s->ik[il]) memset(s->ik[il], 0, (size_t)(n_past * s->ik_row) * sizeof(float));
    }
    s->n_past = n_past;
    return MLA_OK;
}

/* ---------------- forward ---------------- */

typedef struct scratch {
    float *x, *h, *cq, *q, *kva, *qabs, *ol, *o, *ogath, *y, *tmp, *g, *u;
    float *iq, *iw, *rl, *rw;
    int32_t *sel, *nsel, *rid;
} scratch;

static float *fa(int64_t n) { return mla_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(float)); }

/* y[T][E] = FFN shard of h (zero when skipped). */
static void ffn_apply(mla_model *m, const ffn_shard *f, const float *h, int64_t T, float *y, scratch *s) {
    const int64_t E = m->cfg.n_embd, F = f->gate.n_out;
    if (f->skip) {
        memset(y, 0, (size_t)(T * E) * sizeof *y);
        return;
    }
    float *g = fa(T * F), *u = fa(T * F);
    (void)s;
    matmul(m->tp, h, E, T, &f->gate, g, F);
    matmul(m->tp, h, E, T, &f->up, u, F);
    act_swiglu(g, u, g, T * F);
    matmul(m->tp, g, F, T, &f->down, y, E);
    free(g);
    free(u);
}

static int attention(mla_model *m, mla_state *st, int64_t il, int64_t T, int64_t pos0, scratch *s, mla_err *err) {
    const mla_config *c = &m->cfg;
    const layer_w *l = &m->L[il];
    const int64_t E = c->n_embd, Hl = m->n_head_local, dk = c->head_k, dn = c->head_nope, dr = c->n_rope,
                  dv = c->head_v, KL = c->kv_lora_rank, row = KL + dr;
    /* queries */
    const float *qin = s->h;
    int64_t ldq_in = E;
    if (c->q_lora_rank > 0) {
        matmul(m->tp, s->h, E, T, &l->q_a, s->cq, c->q_lora_rank);
        rmsnorm(s->cq, c->q_lora_rank, T, c->q_lora_rank, l->q_a_norm, c->rms_eps, s->cq, c->q_lora_rank);
        qin = s->cq;
        ldq_in = c->q_lora_rank;
    }
    matmul(m->tp, qin, ldq_in, T, &l->q_b, s->q, Hl * dk);
    /* latent kv of the new tokens into the cache */
    matmul(m->tp, s->h, E, T, &l->kv_a, s->kva, row);
    float *kvc = st->kv[il];
    for (int64_t t = 0; t < T; t++) {
        float *dst = kvc + (pos0 + t) * row;
        rmsnorm(s->kva + t * row, row, 1, KL, l->kv_a_norm, c->rms_eps, dst, row);
        memcpy(dst + KL, s->kva + t * row + KL, (size_t)dr * sizeof *dst);
        rope_apply(&m->rope, ROPE_ADJACENT, dst + KL, 1, dr, pos0 + t);
        rope_apply(&m->rope, ROPE_ADJACENT, s->q + t * Hl * dk + dn, Hl, dk, pos0 + t);
    }
    /* absorbed queries: q_abs[t][h] = W_k_b(h)^T-free form: kv_lora outputs of q_nope */
    float *qpe = fa(T * Hl * dr);
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < Hl; h++)
            memcpy(qpe + (t * Hl + h) * dr, s->q + t * Hl * dk + h * dk + dn, (size_t)dr * sizeof *qpe);
    for (int64_t h = 0; h < Hl; h++) {
        const int64_t hg = m->h0 + h;
        if (!l->legacy_kv_b) {
            mla_mat kb = mla_mat_slice(l->k_b->type, l->k_b_data, dn, KL, hg);
            matmul(m->tp, s->q + h * dk, Hl * dk, T, &kb, s->qabs + h * KL, Hl * KL);
        } else {
            const int64_t r = hg * (dn + dv) - l->kv_b_r0; /* row of head hg in this rank's kv_b */
            mla_mat kb = mla_mat_rows(&l->kv_b_mat, r, r + dn);
            matmul_t(m->tp, s->q + h * dk, Hl * dk, T, &kb, s->qabs + h * KL, Hl * KL);
        }
    }
    /* DSA indexer: replicated on every rank */
    const int32_t *sel = NULL;
    if (c->idx_n_head > 0) {
        const int64_t nih = c->idx_n_head, ihd = c->idx_head_dim;
        matmul(m->tp, s->cq, c->q_lora_rank, T, &l->iq_b, s->iq, nih * ihd);
        float *ikc = st->ik[il];
        matmul(m->tp, s->h, E, T, &l->ik, ikc + pos0 * ihd, ihd);
        layernorm(ikc + pos0 * ihd, ihd, T, ihd, l->ik_norm_w, l->ik_norm_b, 1e-6f, ikc + pos0 * ihd, ihd);
        matmul(m->tp, s->h, E, T, &l->iproj, s->iw, nih);
        const float wsc = 1.0f / sqrtf((float)nih);
        for (int64_t i = 0; i < T * nih; i++) s->iw[i] *= wsc;
        for (int64_t t = 0; t < T; t++) {
            /* HF GlmMoeDsaIndexer (transformers 5.16+): RoPE on the first n_rope dims of q and k,
             * interleaved (apply_rotary_pos_emb_interleave, i.e. adjacent pairs), with the same
             * cos/sin as the MLA rope; the converter does not permute these rows. */
            rope_apply(&m->rope, ROPE_ADJACENT, s->iq + t * nih * ihd, nih, ihd, pos0 + t);
            rope_apply(&m->rope, ROPE_ADJACENT, ikc + (pos0 + t) * ihd, 1, ihd, pos0 + t);
        }
        if (pos0 + T > c->idx_top_k) {
            dsa_args da = {s->iq, s->iw, ikc, T, nih, ihd, pos0, c->idx_top_k, s->sel, s->nsel};
            dsa_select(m->tp, &da);
            sel = s->sel;
        }
    }
    mla_attn_args aa = {s->qabs, qpe, T, Hl, KL, dr, kvc, pos0, c->kq_scale, sel, s->nsel, c->idx_top_k, s->ol};
    mla_attn(m->tp, &aa);
    free(qpe);
    /* per-head value up-projection */
    for (int64_t h = 0; h < Hl; h++) {
        const int64_t hg = m->h0 + h;
        mla_mat vb;
        if (!l->legacy_kv_b) {
            vb = mla_mat_slice(l->v_b->type, l->v_b_data, KL, dv, hg);
        } else {
            const int64_t r = hg * (dn + dv) - l->kv_b_r0;
            vb = mla_mat_rows(&l->kv_b_mat, r + dn, r + dn + dv);
        }
        matmul(m->tp, s->ol + h * KL, Hl * KL, T, &vb, s->o + h * dv, Hl * dv);
    }
    /* output projection (partial sums; the all-reduce adds the ranks) */
    if (!l->o_gather) {
        matmul(m->tp, s->o, Hl * dv, T, &l->o, s->y, E);
    } else {
        const int64_t H = c->n_head, per = T * Hl * dv;
        if (coll_allgather_f32(m->c, s->o, s->ogath, (size_t)per, err) < 0) return MLA_ERR;
        float *full = fa(T * H * dv);
        for (int r = 0; r < m->world; r++) { /* rank-major -> token-major */
            int64_t rh0 = H * r / m->world, rhl = H * (r + 1) / m->world - rh0;
            for (int64_t t = 0; t < T; t++)
                memcpy(full + t * H * dv + rh0 * dv, s->ogath + r * per + t * rhl * dv, (size_t)(rhl * dv) * sizeof *full);
        }
        float *part = fa(T * (l->o_r1 - l->o_r0));
        matmul(m->tp, full, H * dv, T, &l->o, part, l->o_r1 - l->o_r0);
        memset(s->y, 0, (size_t)(T * E) * sizeof *s->y);
        for (int64_t t = 0; t < T; t++)
            memcpy(s->y + t * E + l->o_r0, part + t * (l->o_r1 - l->o_r0), (size_t)(l->o_r1 - l->o_r0) * sizeof *part);
        free(full);
        free(part);
    }
    return coll_allreduce_sum_f32(m->c, s->y, (size_t)(T * E), err);
}

static int ffn_moe(mla_model *m, int64_t il, int64_t T, scratch *s, mla_err *err) {
    const mla_config *c = &m->cfg;
    const layer_w *l = &m->L[il];
    const int64_t E = c->n_embd;
    if (l->dense) {
        ffn_apply(m, &l->ffn, s->h, T, s->y, s);
    } else {
        const int64_t X = c->n_expert, K = c->n_expert_used;
        if (l->has_shexp) {
            ffn_apply(m, &l->ffn, s->h, T, s->y, s);
        } else {
            memset(s->y, 0, (size_t)(T * E) * sizeof *s->y);
        }
        /* routing from replicated inputs: identical on every rank */
        matmul(m->tp, s->h, E, T, &l->router, s->rl, X);
        moe_route_params rp = {(int)X, (int)K, (int)c->n_group, (int)c->n_group_used, (int)c->gating,
                               c->weights_norm, c->weights_scale};
        for (int64_t t = 0; t < T; t++) moe_route(&rp, s->rl + t * X, l->router_bias, s->rid + t * K, s->rw + t * K);
        moe_experts_apply(m->tp, &l->ex, s->h, T, s->rid, s->rw, K, s->y);
    }
    return coll_allreduce_sum_f32(m->c, s->y, (size_t)(T * E), err);
}

int mla_model_forward(mla_model *m, mla_state *st, const int32_t *tokens, int64_t T, int64_t pos0,
                      enum mla_logits_mode mode, float *logits, mla_err *err) {
    const mla_config *c = &m->cfg;
    if (mla_config_check_step(c, tokens, T, pos0, st->n_past, st->n_ctx, err)) return MLA_ERR;
    const int64_t E = c->n_embd, Hl = m->n_head_local, KL = c->kv_lora_rank;
    scratch s = {0};
    s.x = fa(T * E);
    s.h = fa(T * E);
    s.y = fa(T * E);
    s.cq = fa(T * (c->q_lora_rank > 0 ? c->q_lora_rank : 1));
    s.q = fa(T * Hl * c->head_k);
    s.kva = fa(T * (KL + c->n_rope));
    s.qabs = fa(T * Hl * KL);
    s.ol = fa(T * Hl * KL);
    s.o = fa(T * Hl * c->head_v);
    s.ogath = fa(T * c->n_head * c->head_v);
    if (c->idx_n_head > 0) {
        s.iq = fa(T * c->idx_n_head * c->idx_head_dim);
        s.iw = fa(T * c->idx_n_head);
        s.sel = mla_xmalloc((size_t)(T * c->idx_top_k) * sizeof *s.sel);
        s.nsel = mla_xmalloc((size_t)T * sizeof *s.nsel);
    }
    if (c->n_expert > 0) {
        s.rl = fa(T * c->n_expert);
        s.rw = fa(T * c->n_expert_used);
        s.rid = mla_xmalloc((size_t)(T * c->n_expert_used) * sizeof *s.rid);
    }
    int rc = MLA_OK;
    for (int64_t t = 0; t < T; t++)
        quant_dequant_row(m->tok_embd->type, m->tok_embd->data + ggml_row_bytes(m->tok_embd->type, E) * (size_t)tokens[t],
                          s.x + t * E, E);
    for (int64_t il = 0; il < c->n_layer && rc == MLA_OK; il++) {
        const layer_w *l = &m->L[il];
        rmsnorm(s.x, E, T, E, l->attn_norm, c->rms_eps, s.h, E);
        rc = attention(m, st, il, T, pos0, &s, err);
        if (rc < 0) break;
        act_add(s.x, s.y, T * E);
        rmsnorm(s.x, E, T, E, l->ffn_norm, c->rms_eps, s.h, E);
        rc = ffn_moe(m, il, T, &s, err);
        if (rc < 0) break;
        act_add(s.x, s.y, T * E);
    }
    if (rc == MLA_OK) {
        st->n_past = pos0 + T;
        if (mode != MLA_LOGITS_NONE) {
            const int64_t t0 = mode == MLA_LOGITS_LAST ? T - 1 : 0, nt = T - t0, V = c->n_vocab;
            rmsnorm(s.x + t0 * E, E, nt, E, m->out_norm, c->rms_eps, s.h, E);
            if (!m->out_split) {
                matmul(m->tp, s.h, E, nt, &m->output, logits, V);
            } else {
                const int64_t Vr = m->out_r1 - m->out_r0;
                float *part = fa(nt * Vr), *all = fa(nt * V);
                matmul(m->tp, s.h, E, nt, &m->output, part, Vr);
                rc = coll_allgather_f32(m->c, part, all, (size_t)(nt * Vr), err);
                if (rc == MLA_OK)
                    for (int r = 0; r < m->world; r++)
                        for (int64_t t = 0; t < nt; t++)
                            memcpy(logits + t * V + r * Vr, all + (r * nt + t) * Vr, (size_t)Vr * sizeof *logits);
                free(part);
                free(all);
            }
        }
    }
    free(s.x); free(s.h); free(s.y); free(s.cq); free(s.q); free(s.kva); free(s.qabs); free(s.ol);
    free(s.o); free(s.ogath); free(s.iq); free(s.iw); free(s.sel); free(s.nsel); free(s.rl); free(s.rw);
    free(s.rid);
    return rc;
}
