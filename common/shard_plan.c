#include "shard_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *suffix;
    enum shard_role role;
} k_suffixes[] = {
    {"attn_norm.weight", ROLE_NORM},          {"attn_q_a_norm.weight", ROLE_NORM},
    {"attn_kv_a_norm.weight", ROLE_NORM},     {"ffn_norm.weight", ROLE_NORM},
    {"attn_q_a.weight", ROLE_Q_A},            {"attn_q_b.weight", ROLE_Q_B},
    {"attn_q.weight", ROLE_Q},                {"attn_kv_a_mqa.weight", ROLE_KV_A},
    {"attn_k_b.weight", ROLE_K_B},            {"attn_v_b.weight", ROLE_V_B},
    {"attn_kv_b.weight", ROLE_KV_B},          {"attn_output.weight", ROLE_ATTN_OUT},
    {"ffn_gate.weight", ROLE_FFN_GATE},       {"ffn_up.weight", ROLE_FFN_UP},
    {"ffn_down.weight", ROLE_FFN_DOWN},       {"ffn_gate_inp.weight", ROLE_ROUTER},
    {"exp_probs_b.bias", ROLE_ROUTER_BIAS},   {"ffn_gate_exps.weight", ROLE_EXP_GATE},
    {"ffn_up_exps.weight", ROLE_EXP_UP},      {"ffn_down_exps.weight", ROLE_EXP_DOWN},
    {"ffn_gate_shexp.weight", ROLE_SHEXP_GATE}, {"ffn_up_shexp.weight", ROLE_SHEXP_UP},
    {"ffn_down_shexp.weight", ROLE_SHEXP_DOWN},
};

static const char *k_role_names[ROLE_COUNT] = {
    [ROLE_OTHER] = "other",          [ROLE_EMBD] = "token embedding",
    [ROLE_NORM] = "norm",            [ROLE_OUTPUT] = "output (lm_head)",
    [ROLE_Q_A] = "attn q_a",         [ROLE_Q_B] = "attn q_b",
    [ROLE_Q] = "attn q",             [ROLE_KV_A] = "attn kv_a_mqa",
    [ROLE_K_B] = "attn k_b",         [ROLE_V_B] = "attn v_b",
    [ROLE_KV_B] = "attn kv_b",       [ROLE_ATTN_OUT] = "attn output",
    [ROLE_FFN_GATE] = "dense ffn gate", [ROLE_FFN_UP] = "dense ffn up",
    [ROLE_FFN_DOWN] = "dense ffn down", [ROLE_ROUTER] = "router",
    [ROLE_ROUTER_BIAS] = "router bias", [ROLE_EXP_GATE] = "experts gate",
    [ROLE_EXP_UP] = "experts up",    [ROLE_EXP_DOWN] = "experts down",
    [ROLE_SHEXP_GATE] = "shared expert gate", [ROLE_SHEXP_UP] = "shared expert up",
    [ROLE_SHEXP_DOWN] = "shared expert down", [ROLE_INDEXER] = "DSA indexer",
};

const char *shard_role_name(enum shard_role r) {
    return (unsigned)r < ROLE_COUNT ? k_role_names[r] : "?";
}

const char *shard_kind_name(enum shard_kind k) {
    switch (k) {
    case SHARD_REPLICATE: return "replicated";
    case SHARD_ROWS: return "rows";
    case SHARD_COLS: return "columns";
    case SHARD_DIM2: return "heads";
    case SHARD_EXPERTS: return "experts";
    }
    return "?";
}

enum shard_role shard_role_of(const char *name, int *layer) {
    *layer = -1;
    if (!strcmp(name, "token_embd.weight")) return ROLE_EMBD;
    if (!strcmp(name, "output_norm.weight")) return ROLE_NORM;
    if (!strcmp(name, "output.weight")) return ROLE_OUTPUT;
    int l, n = 0;
    if (sscanf(name, "blk.%d.%n", &l, &n) != 1 || n == 0 || l < 0) return ROLE_OTHER;
    *layer = l;
    const char *rest = name + n;
    if (!strncmp(rest, "indexer.", 8)) return ROLE_INDEXER;
    for (size_t i = 0; i < sizeof k_suffixes / sizeof k_suffixes[0]; i++)
        if (!strcmp(rest, k_suffixes[i].suffix)) return k_suffixes[i].role;
    return ROLE_OTHER;
}

shard_dims shard_dims_from_config(const mla_config *c) {
    shard_dims d = {.n_head = c->n_head,
                    .head_k = c->head_k,
                    .head_kv = c->head_nope + c->head_v,
                    .head_v = c->head_v,
                    .n_expert = c->n_expert,
                    .n_vocab = c->n_vocab};
    return d;
}

static uint64_t block_elems(const gguf_tensor *t) {
    const ggml_type_info *ti = ggml_type_get(t->type);
    return ti ? ti->block_elems : 1;
}

static uint64_t row_bytes(const gguf_tensor *t, int64_t ncols) {
    return ggml_row_bytes(t->type, ncols);
}

/* How one FFN (dense, or the shared expert) of a layer is laid out. */
typedef struct ffn_layout {
    bool seen, split;
} ffn_layout;

static void note(shard_plan *p, const char *fmt, const char *name, long long a, long long b) {
    size_t len = strlen(p->notes);
    if (len + 200 >= sizeof p->notes) return;
    snprintf(p->notes + len, sizeof p->notes - len, fmt, name, a, b);
}

static void set_invalid(shard_plan *p, const char *msg) {
    if (!p->valid) return; /* keep the first reason */
    p->valid = false;
    snprintf(p->reason, sizeof p->reason, "%s", msg);
}

int shard_plan_build(shard_plan *p, const gguf_ctx *g, const shard_dims *d, int rank, int world,
                     mla_err *err) {
    memset(p, 0, sizeof *p);
    if (world < 1 || rank < 0 || rank >= world)
        return mla_errf(err, "tensor parallelism: rank %d of world size %d is not a valid rank", rank,
                        world);
    p->rank = rank;
    p->world = world;
    p->valid = true;
    const int64_t T = world;
    char msg[512];
    if (d->n_head <= 0 || d->n_head % T) {
        snprintf(msg, sizeof msg,
                 "tensor parallelism %d does not divide the %lld attention heads (each rank needs "
                 "whole heads; valid values divide %lld)",
                 world, (long long)d->n_head, (long long)d->n_head);
        set_invalid(p, msg);
    }
    const int64_t hpr = d->n_head > 0 ? d->n_head / T : 0;
    const int64_t h0 = hpr * rank, h1 = hpr * (rank + 1);

    size_t n = gguf_n_tensors(g);
    p->entries = mla_xcalloc(n ? n : 1, sizeof *p->entries);
    p->n_entries = n;

    /* Pass 1: decide each layer's dense-FFN and shared-expert layout from its down projection. */
    int max_layer = -1;
    for (size_t i = 0; i < n; i++) {
        int l;
        shard_role_of(gguf_tensor_at(g, i)->name, &l);
        if (l > max_layer) max_layer = l;
    }
    ffn_layout *dense = mla_xcalloc((size_t)max_layer + 2, sizeof *dense);
    ffn_layout *shexp = mla_xcalloc((size_t)max_layer + 2, sizeof *shexp);
    for (size_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        int l;
        enum shard_role r = shard_role_of(t->name, &l);
        if (r != ROLE_FFN_DOWN && r != ROLE_SHEXP_DOWN) continue;
        ffn_layout *f = r == ROLE_FFN_DOWN ? &dense[l] : &shexp[l];
        int64_t F = t->ne[0];
        f->seen = true;
        f->split = F % T == 0 && (uint64_t)(F / T) % block_elems(t) == 0;
        if (!f->split && T > 1)
            note(p,
                 "%s: %lld inputs over the ranks would cut its %lld-element quant blocks: "
                 "this FFN is replicated and computed by rank 0 alone\n",
                 t->name, (long long)F, (long long)block_elems(t));
    }

    for (size_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        shard_entry *e = &p->entries[i];
        e->name = t->name;
        e->role = shard_role_of(t->name, &e->layer);
        e->kind = SHARD_REPLICATE;
        e->bytes_total = t->nbytes;
        const int64_t ne0 = t->ne[0], ne1 = t->ne[1], ne2 = t->ne[2];
        ffn_layout *f = NULL;
        if (e->layer >= 0) {
            if (e->role == ROLE_FFN_GATE || e->role == ROLE_FFN_UP || e->role == ROLE_FFN_DOWN)
                f = &dense[e->layer];
            if (e->role == ROLE_SHEXP_GATE || e->role == ROLE_SHEXP_UP ||
                e->role == ROLE_SHEXP_DOWN)
                f = &shexp[e->layer];
        }
        switch (e->role) {
        case ROLE_Q_B:
        case ROLE_Q:
        case ROLE_KV_B: {
            int64_t per = e->role == ROLE_KV_B ? d->head_kv : d->head_k;
            if (ne1 != d->n_head * per || ne2 != 1) {
                snprintf(msg, sizeof msg, "%s has %lld rows, expected %lld heads x %lld", t->name,
                         (long long)ne1, (long long)d->n_head, (long long)per);
                set_invalid(p, msg);
                break;
            }
            e->kind = SHARD_ROWS;
            e->begin = h0 * per;
            e->end = h1 * per;
            break;
        }
        case ROLE_K_B:
        case ROLE_V_B:
            if (ne2 != d->n_head) {
                snprintf(msg, sizeof msg, "%s has %lld slices in dim 2, expected %lld heads",
                         t->name, (long long)ne2, (long long)d->n_head);
                set_invalid(p, msg);
                break;
            }
            e->kind = SHARD_DIM2;
            e->begin = h0;
            e->end = h1;
            break;
        case ROLE_ATTN_OUT: {
            int64_t b = h0 * d->head_v, en = h1 * d->head_v;
            uint64_t blk = block_elems(t);
            if (ne0 != d->n_head * d->head_v) {
                snprintf(msg, sizeof msg, "%s has %lld inputs, expected %lld heads x %lld",
                         t->name, (long long)ne0, (long long)d->n_head, (long long)d->head_v);
                set_invalid(p, msg);
            } else if ((uint64_t)b % blk == 0 && (uint64_t)en % blk == 0) {
                e->kind = SHARD_COLS;
                e->begin = b;
                e->end = en;
            } else if (ne1 % T == 0) {
                e->kind = SHARD_ROWS;
                e->gather_input = true;
                e->begin = ne1 / T * rank;
                e->end = ne1 / T * (rank + 1);
                note(p,
                     "%s: its heads' %lld input columns would cut %lld-element quant blocks: "
                     "split by output rows instead, head outputs all-gathered\n",
                     t->name, (long long)(en - b), (long long)blk);
            } else {
                snprintf(msg, sizeof msg,
                         "%s (%s) cannot be split %d ways: %lld columns per rank cut its "
                         "%llu-element quant blocks and its %lld rows do not divide",
                         t->name, ggml_type_name(t->type), world, (long long)(en - b),
                         (unsigned long long)blk, (long long)ne1);
                set_invalid(p, msg);
            }
            break;
        }
        case ROLE_FFN_GATE:
        case ROLE_FFN_UP:
        case ROLE_SHEXP_GATE:
        case ROLE_SHEXP_UP:
            if (f && f->seen && f->split) {
                e->kind = SHARD_ROWS;
                e->begin = ne1 / T * rank;
                e->end = ne1 / T * (rank + 1);
            } else {
                e->rank0_only = T > 1;
            }
            break;
        case ROLE_FFN_DOWN:
        case ROLE_SHEXP_DOWN:
            if (f && f->split) {
                e->kind = SHARD_COLS;
                e->begin = ne0 / T * rank;
                e->end = ne0 / T * (rank + 1);
            } else {
                e->rank0_only = T > 1;
            }
            break;
        case ROLE_EXP_GATE:
        case ROLE_EXP_UP:
        case ROLE_EXP_DOWN:
            e->kind = SHARD_EXPERTS;
            if (d->n_expert > 0 && ne2 != d->n_expert) {
                snprintf(msg, sizeof msg, "%s has %lld experts, expected %lld", t->name,
                         (long long)ne2, (long long)d->n_expert);
                set_invalid(p, msg);
            }
            break;
        case ROLE_OUTPUT:
            if (ne1 % T == 0) {
                e->kind = SHARD_ROWS;
                e->begin = ne1 / T * rank;
                e->end = ne1 / T * (rank + 1);
            }
            break;
        default:
            break;
        }
        /* bytes held by this rank */
        uint64_t rb = row_bytes(t, ne0);
        switch (e->kind) {
        case SHARD_REPLICATE: e->bytes_rank = t->nbytes; break;
        case SHARD_ROWS: e->bytes_rank = (uint64_t)(e->end - e->begin) * rb * (uint64_t)ne2; break;
        case SHARD_COLS:
            e->bytes_rank = row_bytes(t, e->end - e->begin) * (uint64_t)ne1 * (uint64_t)ne2;
            break;
        case SHARD_DIM2: e->bytes_rank = (uint64_t)(e->end - e->begin) * rb * (uint64_t)ne1; break;
        case SHARD_EXPERTS: {
            uint64_t mine = 0;
            for (int64_t x = rank; x < ne2; x += T) mine++;
            e->bytes_rank = mine * rb * (uint64_t)ne1;
            break;
        }
        }
        p->bytes_total += e->bytes_total;
        p->bytes_rank += e->bytes_rank;
    }
    if (d->n_expert > 0 && d->n_expert < T)
        note(p, "%s: %lld routed experts for %lld ranks: some ranks hold none\n", "experts",
             (long long)d->n_expert, (long long)T);
    free(dense);
    free(shexp);
    return MLA_OK;
}

int shard_plan_for_model(shard_plan *p, const gguf_ctx *g, const mla_config *cfg, int rank, int world,
                         mla_err *err) {
    shard_dims d = shard_dims_from_config(cfg);
    if (shard_plan_build(p, g, &d, rank, world, err)) return MLA_ERR;
    if (p->valid) return MLA_OK;
    mla_errf(err, "tensor-parallel plan for %d ranks is invalid: %s", world, p->reason);
    shard_plan_free(p);
    return MLA_ERR;
}

void shard_plan_free(shard_plan *p) {
    free(p->entries);
    p->entries = NULL;
    p->n_entries = 0;
}

const shard_entry *shard_plan_find(const shard_plan *p, const char *name) {
    for (size_t i = 0; i < p->n_entries; i++)
        if (!strcmp(p->entries[i].name, name)) return &p->entries[i];
    return NULL;
}
