#include "model_config.h"

#include "layer_tensors.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mla_log.h"
#include "mla_switch.h"

static void assume(mla_config *c, const char *key, const char *why, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void assume(mla_config *c, const char *key, const char *why, const char *fmt, ...) {
    if (c->n_assumed >= MLA_CONFIG_MAX_ASSUMED) return;
    mla_assumed *a = &c->assumed[c->n_assumed++];
    snprintf(a->key, sizeof a->key, "%s", key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->value, sizeof a->value, fmt, ap);
    va_end(ap);
    snprintf(a->why, sizeof a->why, "%s", why);
    MLA_INFO("model config: %s missing, assuming %s (%s)", a->key, a->value, a->why);
}

typedef struct rd {
    const gguf_ctx *g;
    mla_config *c;
    mla_err *err;
    char key[128];
} rd;

static const char *k(rd *r, const char *suffix) {
    snprintf(r->key, sizeof r->key, "%s.%s", r->c->arch_name, suffix);
    return r->key;
}

/* Required unsigned key. */
static int req_i(rd *r, const char *suffix, int64_t *out) {
    uint64_t v;
    int rc = gguf_get_u64(r->g, k(r, suffix), &v, r->err);
    if (rc < 0) return rc;
    if (rc == 0) return mla_errf(r->err, "metadata key %s is missing (required for %s)", r->key, r->c->arch_name);
    if (v > (uint64_t)INT32_MAX) return mla_errf(r->err, "metadata key %s = %llu is out of range", r->key, (unsigned long long)v);
    *out = (int64_t)v;
    return MLA_OK;
}

/* Optional unsigned key: 1 found, 0 absent (out untouched), <0 error. */
static int opt_i(rd *r, const char *suffix, int64_t *out) {
    uint64_t v;
    int rc = gguf_get_u64(r->g, k(r, suffix), &v, r->err);
    if (rc == 1) {
        if (v > (uint64_t)INT32_MAX) return mla_errf(r->err, "metadata key %s = %llu is out of range", r->key, (unsigned long long)v);
        *out = (int64_t)v;
    }
    return rc;
}

static int opt_f(rd *r, const char *suffix, float *out) {
    return gguf_get_f32(r->g, k(r, suffix), out, r->err);
}

static double yarn_mscale(double factor, double m) {
    if (factor <= 1.0) return 1.0;
    return 0.1 * m * log(factor) + 1.0;
}

int mla_config_from_gguf(mla_config *c, const gguf_ctx *g, mla_err *err) {
    memset(c, 0, sizeof *c);
    gguf_str arch;
    int rc = gguf_get_str(g, "general.architecture", &arch, err);
    if (rc < 0) return rc;
    if (rc == 0) return mla_errf(err, "metadata key general.architecture is missing");
    if (arch.len == 9 && !memcmp(arch.ptr, "deepseek2", 9)) {
        c->arch = MLA_ARCH_DEEPSEEK2;
    } else if (arch.len == 7 && !memcmp(arch.ptr, "glm-dsa", 7)) {
        c->arch = MLA_ARCH_GLM_DSA;
    } else {
        return mla_errf(err, "architecture '%.*s' is not supported (deepseek2 and glm-dsa are)",
                        (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    }
    snprintf(c->arch_name, sizeof c->arch_name, "%.*s", (int)arch.len, arch.ptr);
    rd r = {g, c, err, {0}};
    char why[160];

    if (req_i(&r, "block_count", &c->n_layer_file) < 0) return MLA_ERR;
    if (req_i(&r, "embedding_length", &c->n_embd) < 0) return MLA_ERR;
    if (req_i(&r, "attention.head_count", &c->n_head) < 0) return MLA_ERR;
    if (req_i(&r, "attention.kv_lora_rank", &c->kv_lora_rank) < 0) return MLA_ERR;
    if (req_i(&r, "rope.dimension_count", &c->n_rope) < 0) return MLA_ERR;
    if (req_i(&r, "feed_forward_length", &c->n_ff) < 0) return MLA_ERR;

    if ((rc = opt_i(&r, "nextn_predict_layers", &c->n_nextn)) < 0) return rc;
    if (c->n_nextn >= c->n_layer_file)
        return mla_errf(err, "%s = %lld must be below block_count %lld", k(&r, "nextn_predict_layers"),
                        (long long)c->n_nextn, (long long)c->n_layer_file);
    c->n_layer = c->n_layer_file - c->n_nextn;

    /* vocabulary: key, else the tokenizer list, else the embedding tensor */
    if ((rc = opt_i(&r, "vocab_size", &c->n_vocab)) < 0) return rc;
    if (rc == 0) {
        const gguf_value *toks;
        int rt = gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks, err);
        if (rt < 0) return rt;
        if (rt == 1) {
            c->n_vocab = (int64_t)toks->v.arr.n;
        } else {
            const gguf_tensor *t = gguf_find_tensor(g, "token_embd.weight");
            if (!t) return mla_errf(err, "no vocab_size key, tokenizer list or token_embd.weight");
            c->n_vocab = t->ne[1];
        }
    }

    if ((rc = opt_i(&r, "attention.q_lora_rank", &c->q_lora_rank)) < 0) return rc;
    if (rc == 0) {
        c->q_lora_rank = 0;
        if (!gguf_find_tensor(g, "blk.0.attn_q.weight"))
            return mla_errf(err, "%s is missing and the file has no plain blk.0.attn_q.weight",
                            k(&r, "attention.q_lora_rank"));
        assume(c, k(&r, "attention.q_lora_rank"), "no key and attn_q present: plain query projection (V2-Lite layout)", "0");
    }

    /* head dims: *_mla keys (files with split attn_k_b/attn_v_b), else the plain ones */
    int rk = opt_i(&r, "attention.key_length_mla", &c->head_k);
    if (rk < 0) return rk;
    int rv = opt_i(&r, "attention.value_length_mla", &c->head_v);
    if (rv < 0) return rv;
    if (rk == 0) {
        if (req_i(&r, "attention.key_length", &c->head_k) < 0) return MLA_ERR;
        snprintf(why, sizeof why, "no key_length_mla: the per-head key size is key_length (legacy file)");
        assume(c, k(&r, "attention.key_length_mla"), why, "%lld", (long long)c->head_k);
    }
    if (rv == 0) {
        if (req_i(&r, "attention.value_length", &c->head_v) < 0) return MLA_ERR;
        assume(c, k(&r, "attention.value_length_mla"), "no value_length_mla: the per-head value size is value_length (legacy file)",
               "%lld", (long long)c->head_v);
    }
    if (c->head_k <= c->n_rope)
        return mla_errf(err, "per-head key size %lld must exceed the rope dims %lld", (long long)c->head_k, (long long)c->n_rope);
    if (c->n_rope % 2)
        return mla_errf(err, "%s = %lld must be even", k(&r, "rope.dimension_count"), (long long)c->n_rope);
    c->head_nope = c->head_k - c->n_rope;

    c->rms_eps = 1e-6f;
    if ((rc = opt_f(&r, "attention.layer_norm_rms_epsilon", &c->rms_eps)) < 0) return rc;
    if (rc == 0) assume(c, k(&r, "attention.layer_norm_rms_epsilon"), "DeepSeek/GLM default", "1e-6");

    c->rope_base = 10000.0f;
    if ((rc = opt_f(&r, "rope.freq_base", &c->rope_base)) < 0) return rc;
    if (rc == 0) assume(c, k(&r, "rope.freq_base"), "llama.cpp default", "10000");

    /* YaRN */
    gguf_str st;
    rc = gguf_get_str(g, k(&r, "rope.scaling.type"), &st, err);
    if (rc < 0) return rc;
    c->yarn = rc == 1 && st.len == 4 && !memcmp(st.ptr, "yarn", 4);
    if (rc == 1 && !c->yarn && !(st.len == 4 && !memcmp(st.ptr, "none", 4)))
        return mla_errf(err, "%s = '%.*s' is not supported (yarn or none)", r.key, (int)st.len, st.ptr);
    c->yarn_factor = 1.0f;
    c->rope_attn_factor = 1.0f;
    c->kq_scale = 1.0f / sqrtf((float)c->head_k);
    if (c->yarn) {
        if ((rc = opt_f(&r, "rope.scaling.factor", &c->yarn_factor)) < 0) return rc;
        if (rc == 0 || !(c->yarn_factor >= 1.0f))
            return mla_errf(err, "YaRN needs %s >= 1", k(&r, "rope.scaling.factor"));
        if ((rc = opt_i(&r, "rope.scaling.original_context_length", &c->yarn_orig_ctx)) < 0) return rc;
        if (rc == 0) return mla_errf(err, "YaRN needs %s", k(&r, "rope.scaling.original_context_length"));
        c->yarn_beta_fast = 32.0f;
        c->yarn_beta_slow = 1.0f;
        if ((rc = opt_f(&r, "rope.scaling.yarn_beta_fast", &c->yarn_beta_fast)) < 0) return rc;
        if (rc == 0) assume(c, r.key, "HF/llama.cpp YaRN default", "32");
        if ((rc = opt_f(&r, "rope.scaling.yarn_beta_slow", &c->yarn_beta_slow)) < 0) return rc;
        if (rc == 0) assume(c, r.key, "HF/llama.cpp YaRN default", "1");
        if ((rc = opt_f(&r, "rope.scaling.yarn_log_multiplier", &c->yarn_log_mul)) < 0) return rc;
        if (rc == 0) assume(c, r.key, "llama.cpp default: no softmax mscale", "0");
        /* HF DeepSeek-V3: softmax scale *= mscale(factor, mscale_all_dim)^2 with
         * mscale_all_dim = yarn_log_multiplier / 0.1; cos/sin *= mscale(f, mscale) /
         * mscale(f, mscale_all_dim). GGUF does not carry `mscale`; released DeepSeek configs set
         * mscale == mscale_all_dim, which makes that ratio 1. */
        double m_all = yarn_mscale(c->yarn_factor, c->yarn_log_mul / 0.1);
        c->kq_scale = (float)(m_all * m_all / sqrt((double)c->head_k));
        c->rope_attn_factor = 1.0f;
        assume(c, "rope.scaling.mscale (HF)", "not stored in GGUF; DeepSeek configs use mscale == mscale_all_dim, so cos/sin are not rescaled",
               "mscale_all_dim");
    }

    /* MoE */
    if ((rc = opt_i(&r, "expert_count", &c->n_expert)) < 0) return rc;
    if (c->n_expert > 0) {
        if (req_i(&r, "expert_used_count", &c->n_expert_used) < 0) return MLA_ERR;
        if (req_i(&r, "expert_feed_forward_length", &c->n_ff_exp) < 0) return MLA_ERR;
        if ((rc = opt_i(&r, "expert_shared_count", &c->n_expert_shared)) < 0) return rc;
        if (rc == 0) assume(c, r.key, "no shared experts", "0");
        c->n_ff_shexp = c->n_ff_exp * c->n_expert_shared;
        if ((rc = opt_i(&r, "expert_shared_feed_forward_length", &c->n_ff_shexp)) < 0) return rc;
        int64_t gf = 0;
        if ((rc = opt_i(&r, "expert_gating_func", &gf)) < 0) return rc;
        if (rc == 0 || gf == 0) {
            if (c->arch == MLA_ARCH_GLM_DSA) {
                gf = MLA_GATING_SIGMOID;
                assume(c, k(&r, "expert_gating_func"), "llama.cpp glm-dsa default", "2 (sigmoid)");
            } else if ((c->n_layer == 47 || c->n_layer == 48) && c->n_vocab == 154880) {
                gf = MLA_GATING_SIGMOID;
                assume(c, k(&r, "expert_gating_func"), "llama.cpp deepseek2 default for GLM-4.7-Flash (47/48 layers, vocab 154880)",
                       "2 (sigmoid)");
            } else {
                gf = MLA_GATING_SOFTMAX;
                assume(c, k(&r, "expert_gating_func"), "llama.cpp deepseek2 default (DeepSeek-V2/V2.5 files)", "1 (softmax)");
            }
        }
        if (gf != MLA_GATING_SOFTMAX && gf != MLA_GATING_SIGMOID)
            return mla_errf(err, "%s = %lld is not supported (1 softmax, 2 sigmoid)", k(&r, "expert_gating_func"), (long long)gf);
        c->gating = (enum mla_gating)gf;
        /* group-limited routing: files converted before llama.cpp wrote the group keys (early
         * 2025 DeepSeek-V3 / R1 files) lack them; their config.json routes in 8 groups of which 4
         * are used, and the model's shape says which files those are */
        const bool v3_shape = c->arch == MLA_ARCH_DEEPSEEK2 && c->n_expert == 256 && c->n_vocab == 129280 &&
                              c->gating == MLA_GATING_SIGMOID;
        c->n_group = 1;
        c->n_group_used = 1;
        if ((rc = opt_i(&r, "expert_group_count", &c->n_group)) < 0) return rc;
        const bool v3_groups = rc == 0 && v3_shape;
        if (v3_groups) {
            c->n_group = 8;
            assume(c, r.key, "a DeepSeek-V3 / R1 file (256 experts, vocab 129280, sigmoid gating): n_group of its "
                   "config.json (llama.cpp reads 1: no group-limited routing)", "8");
        } else if (rc == 0) {
            assume(c, r.key, "no group-limited routing", "1");
        }
        if ((rc = opt_i(&r, "expert_group_used_count", &c->n_group_used)) < 0) return rc;
        if (rc == 0 && v3_groups) {
            c->n_group_used = 4;
            assume(c, r.key, "a DeepSeek-V3 / R1 file: topk_group of its config.json", "4");
        } else if (rc == 0) {
            c->n_group_used = c->n_group;
            assume(c, r.key, "every group usable", "%lld", (long long)c->n_group);
        }
        c->weights_scale = 1.0f;
        if ((rc = opt_f(&r, "expert_weights_scale", &c->weights_scale)) < 0) return rc;
        if (rc == 0) assume(c, r.key, "llama.cpp default", "1.0");
        c->weights_norm = false;
        if ((rc = gguf_get_bool(g, k(&r, "expert_weights_norm"), &c->weights_norm, err)) < 0) return rc;
        if (rc == 0) assume(c, r.key, "llama.cpp default", "false");
        if (c->n_expert_used < 1 || c->n_expert_used > c->n_expert)
            return mla_errf(err, "expert_used_count %lld must be in [1, %lld]", (long long)c->n_expert_used, (long long)c->n_expert);
        if (c->n_group < 1 || c->n_expert % c->n_group || c->n_group_used < 1 || c->n_group_used > c->n_group)
            return mla_errf(err, "expert groups %lld (used %lld) do not divide %lld experts",
                            (long long)c->n_group, (long long)c->n_group_used, (long long)c->n_expert);
        if (c->n_group > 1 && c->n_expert / c->n_group < 2)
            return mla_errf(err, "group-limited routing needs at least 2 experts per group");
        if (c->n_group_used * (c->n_expert / c->n_group) < c->n_expert_used)
            return mla_errf(err, "%lld used groups hold fewer than %lld experts", (long long)c->n_group_used,
                            (long long)c->n_expert_used);
    }
    if ((rc = opt_i(&r, "leading_dense_block_count", &c->n_dense_lead)) < 0) return rc;
    if (rc == 0) assume(c, r.key, "llama.cpp default", "0");

    /* DSA indexer */
    if ((rc = opt_i(&r, "attention.indexer.head_count", &c->idx_n_head)) < 0) return rc;
    if (rc == 1) {
        if (req_i(&r, "attention.indexer.key_length", &c->idx_head_dim) < 0) return MLA_ERR;
        if (req_i(&r, "attention.indexer.top_k", &c->idx_top_k) < 0) return MLA_ERR;
        if (c->idx_head_dim < c->n_rope || c->idx_top_k < 1)
            return mla_errf(err, "indexer key_length %lld / top_k %lld are invalid", (long long)c->idx_head_dim,
                            (long long)c->idx_top_k);
        /* Per-layer indexer kind (HF indexer_types; true = "full"). A "shared" layer reuses the
         * previous full layer's top-k in HF (GlmMoeDsaAttention.prev_topk_indices) and carries no
         * indexer weights; that is not implemented: refuse rather than select per layer. */
        const gguf_value *ty = NULL;
        if ((rc = gguf_get_arr(g, k(&r, "attention.indexer.types"), GGUF_VT_BOOL, &ty, err)) < 0) return rc;
        if (rc == 1) {
            if (ty->v.arr.n < (uint64_t)c->n_layer)
                return mla_errf(err, "%s has %llu entries for %lld layers", r.key, (unsigned long long)ty->v.arr.n,
                                (long long)c->n_layer);
            for (int64_t il = 0; il < c->n_layer; il++)
                if (!ty->v.arr.items[il].v.b)
                    return mla_errf(err, "%s: layer %lld reuses the previous layer's DSA top-k (\"shared\"), "
                                         "which this build does not support", r.key, (long long)il);
        }
    } else if (c->arch == MLA_ARCH_GLM_DSA) {
        return mla_errf(err, "%s is missing (required for glm-dsa)", k(&r, "attention.indexer.head_count"));
    }
    if ((rc = opt_i(&r, "context_length", &c->ctx_train)) < 0) return rc;
    if (c->n_head < 1 || c->n_embd < 1 || c->kv_lora_rank < 1 || c->n_layer < 1)
        return mla_errf(err, "head_count, embedding_length, kv_lora_rank and block_count must be positive");
    return MLA_OK;
}

/* ---- tensor shape check ---- */

typedef struct want {
    const char *name;
    int64_t ne[3];
    bool optional;
    bool f32_only; /* norms, biases: used as float arrays */
} want;

static int check_one(const gguf_ctx *g, const char *name, const int64_t *ne, int nd, bool optional,
                     bool f32_only, mla_err *err) {
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) {
        if (optional) return 0;
        return mla_errf(err, "%s: tensor is missing", name);
    }
    bool ok = true;
    for (int i = 0; i < GGUF_MAX_DIMS; i++) {
        int64_t w = i < nd ? ne[i] : 1;
        if (t->ne[i] != w) ok = false;
    }
    if (!ok) {
        char got[96], exp[96];
        int n = 0;
        uint32_t td = t->n_dims < 1 ? 1 : t->n_dims;
        n += snprintf(got + n, sizeof got - n, "[");
        for (uint32_t i = 0; i < td; i++) n += snprintf(got + n, sizeof got - (size_t)n, "%s%lld", i ? ", " : "", (long long)t->ne[i]);
        snprintf(got + n, sizeof got - (size_t)n, "]");
        n = snprintf(exp, sizeof exp, "[");
        for (int i = 0; i < nd; i++) n += snprintf(exp + n, sizeof exp - (size_t)n, "%s%lld", i ? ", " : "", (long long)ne[i]);
        snprintf(exp + n, sizeof exp - (size_t)n, "]");
        return mla_errf(err, "%s: shape %s but the config expects %s", name, got, exp);
    }
    if (f32_only && t->type != GGML_TYPE_F32)
        return mla_errf(err, "%s: type %s, expected F32", name, ggml_type_name(t->type));
    const ggml_type_info *ti = ggml_type_get(t->type);
    if (!ti || (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && t->type != GGML_TYPE_BF16 &&
                ti->block_elems == 1))
        return mla_errf(err, "%s: type %s cannot hold weights", name, ggml_type_name(t->type));
    if (t->ne[0] % ti->block_elems)
        return mla_errf(err, "%s: row of %lld elements is not a whole number of %s blocks", name,
                        (long long)t->ne[0], ti->name);
    return 1;
}

#define CHK(nm, nd, opt, f32, ...)                                                         \
    do {                                                                                   \
        const int64_t ne_[] = {__VA_ARGS__};                                               \
        int rc_ = check_one(g, nm, ne_, nd, opt, f32, err);                                \
        if (rc_ < 0) return rc_;                                                           \
    } while (0)

int mla_config_check_tensors(const mla_config *c, const gguf_ctx *g, mla_err *err) {
    const int64_t E = c->n_embd, H = c->n_head, V = c->n_vocab;
    CHK("token_embd.weight", 2, false, false, E, V);
    CHK("output_norm.weight", 1, false, true, E);
    if (!gguf_find_tensor(g, "output.weight"))
        return mla_errf(err, "output.weight: tensor is missing (tied embeddings are not supported)");
    CHK("output.weight", 2, false, false, E, V);
    /* the layers: the table of common/layer_tensors.c, which the loaders walk too */
    int n_entries;
    const lt_entry *tab = layer_tensors_table(&n_entries);
    char nm[128];
    for (int64_t il = 0; il < c->n_layer; il++) {
        snprintf(nm, sizeof nm, "blk.%lld.attn_k_b.weight", (long long)il);
        const bool split_kb = gguf_find_tensor(g, nm) != NULL;
        for (int i = 0; i < n_entries; i++) {
            const lt_entry *e = &tab[i];
            if (!layer_tensors_applies(e, c, il, split_kb)) continue;
            snprintf(nm, sizeof nm, "blk.%lld.%s", (long long)il, e->suffix);
            if (e->role == LT_KV_B) {
                const gguf_tensor *kvb = gguf_find_tensor(g, nm);
                if (!kvb)
                    return mla_errf(err, "blk.%lld: neither attn_k_b/attn_v_b nor legacy attn_kv_b is present",
                                    (long long)il);
                /* legacy fused up-projection: per head the rows [nope of W_k | v of W_v] */
                const int64_t kv_rows = H * (c->head_nope + c->head_v);
                if (kvb->ne[1] != kv_rows)
                    return mla_errf(err, "%s: %lld rows, expected %lld heads x (nope %lld + v %lld) = %lld rows", nm,
                                    (long long)kvb->ne[1], (long long)H, (long long)c->head_nope,
                                    (long long)c->head_v, (long long)kv_rows);
            }
            if (e->role == LT_IQ_B && c->q_lora_rank == 0) return mla_errf(err, "the DSA indexer needs q_lora_rank > 0");
            int64_t ne[GGUF_MAX_DIMS] = {1, 1, 1, 1}; /* layer_tensors_shape fills the first 3 */
            layer_tensors_shape(e, c, ne);
            const int rc = check_one(g, nm, ne, e->nd, e->optional, e->f32_only, err);
            if (rc < 0) return rc;
        }
    }
    return MLA_OK;
}

/* one weight type the backend lacks: how many tensors hold it, and the first of them */
typedef struct type_miss {
    uint32_t type;
    int count;
    const char *first;
} type_miss;

static void note_type(const gguf_tensor *t, bool (*ok)(uint32_t), type_miss *miss, int *n_miss, int *n_tensors) {
    if (!t || ok(t->type)) return;
    (*n_tensors)++;
    for (int i = 0; i < *n_miss; i++)
        if (miss[i].type == t->type) {
            miss[i].count++;
            return;
        }
    if (*n_miss < GGML_TYPE_COUNT) miss[(*n_miss)++] = (type_miss){t->type, 1, t->name};
}

int mla_config_check_types(const mla_config *c, const gguf_ctx *g, bool (*ok)(uint32_t), const char *backend,
                           mla_err *err) {
    type_miss miss[GGML_TYPE_COUNT];
    int n_miss = 0, n_tensors = 0;
    note_type(gguf_find_tensor(g, "token_embd.weight"), ok, miss, &n_miss, &n_tensors);
    note_type(gguf_find_tensor(g, "output.weight"), ok, miss, &n_miss, &n_tensors);
    for (int64_t il = 0; il < c->n_layer; il++) { /* the tensors the loaders take (norms: F32, always ok) */
        layer_tensors lt;
        if (layer_tensors_find(c, g, il, &lt, err) < 0) return MLA_ERR;
        for (int r = 0; r < LT_COUNT; r++) note_type(lt.t[r], ok, miss, &n_miss, &n_tensors);
    }
    if (!n_miss) return MLA_OK;
    char list[768];
    int n = 0, shown = 0;
    for (; shown < n_miss && n < (int)sizeof list - 160; shown++)
        n += snprintf(list + n, sizeof list - (size_t)n, "%s%s (%d tensor%s, e.g. %s)", shown ? ", " : "",
                      ggml_type_name(miss[shown].type), miss[shown].count, miss[shown].count == 1 ? "" : "s",
                      miss[shown].first);
    if (shown < n_miss) snprintf(list + n, sizeof list - (size_t)n, " and %d more types", n_miss - shown);
    return mla_errf(err,
                    "the %s backend has no kernels for %s: %d of the model's tensors; run it with --backend cpu, or "
                    "use a file quantized without those types",
                    backend, list, n_tensors);
}

int mla_config_check_step(const mla_config *c, const int32_t *tokens, int64_t T, int64_t pos0, int64_t n_past,
                          int64_t n_ctx, mla_err *err) {
    if (T <= 0) return mla_errf(err, "no tokens to run");
    if (pos0 != n_past)
        return mla_errf(err, "forward at position %lld but the cache holds %lld tokens", (long long)pos0,
                        (long long)n_past);
    if (pos0 + T > n_ctx)
        return mla_errf(err, "%lld tokens at position %lld exceed the context of %lld", (long long)T, (long long)pos0,
                        (long long)n_ctx);
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= c->n_vocab)
            return mla_errf(err, "token id %d at index %lld is outside the vocabulary of %lld", tokens[t], (long long)t,
                            (long long)c->n_vocab);
    return MLA_OK;
}

int mla_cuda_attn_fp32(bool exact, mla_err *err) {
    const char *v = mla_sw_str(MLA_SW_CUDA_ATTN);
    if (!v && mla_sw_is_set(MLA_SW_CUDA_ATTN))
        return mla_errf(err, "MLA_CUDA_ATTN=%s: expected tc or fp32", getenv("MLA_CUDA_ATTN"));
    return v ? !strcmp(v, "fp32") : exact;
}

int mla_cuda_kv_f16(int64_t row, bool attn_fp32, mla_err *err) {
    const char *v = mla_sw_str(MLA_SW_CUDA_KV);
    if (!v && mla_sw_is_set(MLA_SW_CUDA_KV))
        return mla_errf(err, "MLA_CUDA_KV=%s: expected f16 or f32 (the latent cache's element type)", getenv("MLA_CUDA_KV"));
    if (row % 2) return 0;
    return v ? !strcmp(v, "f16") : !attn_fp32;
}
