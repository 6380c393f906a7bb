#include "layer_tensors.h"

#include <stdio.h>

#define E_(suffix, role, when, opt, f32, nd, ...) {suffix, role, when, opt, f32, nd, {__VA_ARGS__}}

/* The order is the check's: the first problem of a layer is the one reported. */
static const lt_entry k_table[] = {
    E_("attn_norm.weight", LT_ATTN_NORM, LT_ALWAYS, false, true, 1, LT_D_E),
    E_("ffn_norm.weight", LT_FFN_NORM, LT_ALWAYS, false, true, 1, LT_D_E),
    E_("attn_q_a.weight", LT_Q_A, LT_QLORA, false, false, 2, LT_D_E, LT_D_QLR),
    E_("attn_q_a_norm.weight", LT_Q_A_NORM, LT_QLORA, false, true, 1, LT_D_QLR),
    E_("attn_q_b.weight", LT_Q_B, LT_QLORA, false, false, 2, LT_D_QLR, LT_D_HQK),
    E_("attn_q.weight", LT_Q, LT_NO_QLORA, false, false, 2, LT_D_E, LT_D_HQK),
    E_("attn_kv_a_mqa.weight", LT_KV_A, LT_ALWAYS, false, false, 2, LT_D_E, LT_D_KVR),
    E_("attn_kv_a_norm.weight", LT_KV_A_NORM, LT_ALWAYS, false, true, 1, LT_D_KVL),
    E_("attn_k_b.weight", LT_K_B, LT_SPLIT_KB, false, false, 3, LT_D_NOPE, LT_D_KVL, LT_D_H),
    E_("attn_v_b.weight", LT_V_B, LT_SPLIT_KB, false, false, 3, LT_D_KVL, LT_D_V, LT_D_H),
    E_("attn_kv_b.weight", LT_KV_B, LT_FUSED_KB, false, false, 2, LT_D_KVL, LT_D_HNV),
    E_("attn_output.weight", LT_ATTN_OUT, LT_ALWAYS, false, false, 2, LT_D_HV, LT_D_E),
    E_("indexer.attn_q_b.weight", LT_IQ_B, LT_INDEXER, false, false, 2, LT_D_QLR, LT_D_IQ),
    E_("indexer.attn_k.weight", LT_IK, LT_INDEXER, false, false, 2, LT_D_E, LT_D_ID),
    E_("indexer.k_norm.weight", LT_IK_NORM_W, LT_INDEXER, false, true, 1, LT_D_ID),
    E_("indexer.k_norm.bias", LT_IK_NORM_B, LT_INDEXER, false, true, 1, LT_D_ID),
    E_("indexer.proj.weight", LT_IPROJ, LT_INDEXER, false, false, 2, LT_D_E, LT_D_IH),
    E_("ffn_gate.weight", LT_FFN_GATE, LT_DENSE, false, false, 2, LT_D_E, LT_D_FF),
    E_("ffn_up.weight", LT_FFN_UP, LT_DENSE, false, false, 2, LT_D_E, LT_D_FF),
    E_("ffn_down.weight", LT_FFN_DOWN, LT_DENSE, false, false, 2, LT_D_FF, LT_D_E),
    E_("ffn_gate_inp.weight", LT_ROUTER, LT_MOE, false, false, 2, LT_D_E, LT_D_X),
    E_("exp_probs_b.bias", LT_ROUTER_BIAS, LT_MOE, true, true, 1, LT_D_X),
    E_("ffn_gate_exps.weight", LT_EXP_GATE, LT_MOE, false, false, 3, LT_D_E, LT_D_F, LT_D_X),
    E_("ffn_up_exps.weight", LT_EXP_UP, LT_MOE, false, false, 3, LT_D_E, LT_D_F, LT_D_X),
    E_("ffn_down_exps.weight", LT_EXP_DOWN, LT_MOE, false, false, 3, LT_D_F, LT_D_E, LT_D_X),
    E_("ffn_gate_shexp.weight", LT_SHEXP_GATE, LT_SHEXP, false, false, 2, LT_D_E, LT_D_S),
    E_("ffn_up_shexp.weight", LT_SHEXP_UP, LT_SHEXP, false, false, 2, LT_D_E, LT_D_S),
    E_("ffn_down_shexp.weight", LT_SHEXP_DOWN, LT_SHEXP, false, false, 2, LT_D_S, LT_D_E),
};

const lt_entry *layer_tensors_table(int *n_entries) {
    *n_entries = (int)(sizeof k_table / sizeof k_table[0]);
    return k_table;
}

bool layer_tensors_applies(const lt_entry *e, const mla_config *c, int64_t il, bool split_kb) {
    switch (e->when) {
    case LT_ALWAYS: return true;
    case LT_QLORA: return c->q_lora_rank > 0;
    case LT_NO_QLORA: return c->q_lora_rank == 0;
    case LT_SPLIT_KB: return split_kb;
    case LT_FUSED_KB: return !split_kb;
    case LT_INDEXER: return c->idx_n_head > 0;
    case LT_DENSE: return mla_config_layer_dense(c, il);
    case LT_MOE: return !mla_config_layer_dense(c, il);
    case LT_SHEXP: return !mla_config_layer_dense(c, il) && c->n_expert_shared > 0;
    }
    return false;
}

static int64_t dim_of(lt_dim d, const mla_config *c) {
    switch (d) {
    case LT_D_E: return c->n_embd;
    case LT_D_QLR: return c->q_lora_rank;
    case LT_D_HQK: return c->n_head * c->head_k;
    case LT_D_KVR: return c->kv_lora_rank + c->n_rope;
    case LT_D_KVL: return c->kv_lora_rank;
    case LT_D_NOPE: return c->head_nope;
    case LT_D_V: return c->head_v;
    case LT_D_H: return c->n_head;
    case LT_D_HNV: return c->n_head * (c->head_nope + c->head_v);
    case LT_D_HV: return c->n_head * c->head_v;
    case LT_D_IQ: return c->idx_n_head * c->idx_head_dim;
    case LT_D_ID: return c->idx_head_dim;
    case LT_D_IH: return c->idx_n_head;
    case LT_D_FF: return c->n_ff;
    case LT_D_X: return c->n_expert;
    case LT_D_F: return c->n_ff_exp;
    case LT_D_S: return c->n_ff_shexp;
    }
    return 0;
}

void layer_tensors_shape(const lt_entry *e, const mla_config *c, int64_t ne[3]) {
    for (int i = 0; i < 3; i++) ne[i] = i < e->nd ? dim_of(e->ne[i], c) : 1;
}

static const gguf_tensor *find(const gguf_ctx *g, int64_t il, const char *suffix) {
    char nm[128];
    snprintf(nm, sizeof nm, "blk.%lld.%s", (long long)il, suffix);
    return gguf_find_tensor(g, nm);
}

int layer_tensors_find(const mla_config *c, const gguf_ctx *g, int64_t il, layer_tensors *out, mla_err *err) {
    for (int r = 0; r < LT_COUNT; r++) out->t[r] = NULL;
    out->split_kb = find(g, il, "attn_k_b.weight") != NULL;
    out->dense = mla_config_layer_dense(c, il);
    for (size_t i = 0; i < sizeof k_table / sizeof k_table[0]; i++) {
        const lt_entry *e = &k_table[i];
        if (!layer_tensors_applies(e, c, il, out->split_kb)) continue;
        out->t[e->role] = find(g, il, e->suffix);
        if (!out->t[e->role] && !e->optional)
            return mla_errf(err, "blk.%lld.%s: tensor is missing", (long long)il, e->suffix);
    }
    return MLA_OK;
}
