/* layer_tensors: the per-layer GGUF tensors of an MLA + MoE model, one table (name, role, when it
 * is present, required or optional, shape from the config) that the shape check
 * (mla_config_check_tensors) and both loaders (worker/model.c, worker/model_cuda.cu) walk. */
#ifndef LAYER_TENSORS_H
#define LAYER_TENSORS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/gguf.h"
#include "common/mla_err.h"
#include "common/model_config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lt_role {
    LT_ATTN_NORM,
    LT_FFN_NORM,
    LT_Q_A,
    LT_Q_A_NORM,
    LT_Q_B,
    LT_Q, /* without q-LoRA */
    LT_KV_A,
    LT_KV_A_NORM,
    LT_K_B,
    LT_V_B,
    LT_KV_B, /* the legacy fused k_b / v_b */
    LT_ATTN_OUT,
    LT_IQ_B, /* the DSA indexer's */
    LT_IK,
    LT_IK_NORM_W,
    LT_IK_NORM_B,
    LT_IPROJ,
    LT_FFN_GATE, /* dense layers */
    LT_FFN_UP,
    LT_FFN_DOWN,
    LT_ROUTER, /* MoE layers */
    LT_ROUTER_BIAS,
    LT_EXP_GATE,
    LT_EXP_UP,
    LT_EXP_DOWN,
    LT_SHEXP_GATE,
    LT_SHEXP_UP,
    LT_SHEXP_DOWN,
    LT_COUNT
} lt_role;

/* when an entry belongs to a layer */
typedef enum lt_when {
    LT_ALWAYS,
    LT_QLORA,    /* q_lora_rank > 0 */
    LT_NO_QLORA, /* q_lora_rank == 0 */
    LT_SPLIT_KB, /* the layer has attn_k_b */
    LT_FUSED_KB, /* it has not: the legacy attn_kv_b */
    LT_INDEXER,  /* idx_n_head > 0 */
    LT_DENSE,    /* mla_config_layer_dense */
    LT_MOE,      /* not dense */
    LT_SHEXP,    /* not dense, n_expert_shared > 0 */
} lt_when;

/* one dimension of an entry's shape, from the config */
typedef enum lt_dim {
    LT_D_E,      /* n_embd */
    LT_D_QLR,    /* q_lora_rank */
    LT_D_HQK,    /* n_head * head_k */
    LT_D_KVR,    /* kv_lora_rank + n_rope */
    LT_D_KVL,    /* kv_lora_rank */
    LT_D_NOPE,   /* head_nope */
    LT_D_V,      /* head_v */
    LT_D_H,      /* n_head */
    LT_D_HNV,    /* n_head * (head_nope + head_v) */
    LT_D_HV,     /* n_head * head_v */
    LT_D_IQ,     /* idx_n_head * idx_head_dim */
    LT_D_ID,     /* idx_head_dim */
    LT_D_IH,     /* idx_n_head */
    LT_D_FF,     /* n_ff */
    LT_D_X,      /* n_expert */
    LT_D_F,      /* n_ff_exp */
    LT_D_S,      /* n_ff_shexp */
} lt_dim;

typedef struct lt_entry {
    const char *suffix; /* the name after "blk.<il>." */
    lt_role role;
    lt_when when;
    bool optional; /* may be absent (then NULL) */
    bool f32_only; /* norms, biases: read as float arrays */
    int nd;
    lt_dim ne[3];
} lt_entry;

/* The table, in the order the check walks it; n_entries gets its length. */
const lt_entry *layer_tensors_table(int *n_entries);

/* Whether entry e belongs to layer il of c (split_kb: the layer has attn_k_b). */
bool layer_tensors_applies(const lt_entry *e, const mla_config *c, int64_t il, bool split_kb);

/* e's shape under c: ne[0..e->nd) */
void layer_tensors_shape(const lt_entry *e, const mla_config *c, int64_t ne[3]);

/* The tensors of layer il: t[role] for every entry that belongs to the layer (NULL for the
 * others and for an absent optional one). The names are not checked here: the loaders call it
 * after mla_config_check_tensors, and a required tensor that is absent is MLA_ERR naming it. */
typedef struct layer_tensors {
    const gguf_tensor *t[LT_COUNT];
    bool split_kb; /* attn_k_b / attn_v_b (else the legacy attn_kv_b) */
    bool dense;
} layer_tensors;
int layer_tensors_find(const mla_config *c, const gguf_ctx *g, int64_t il, layer_tensors *out, mla_err *err);

#ifdef __cplusplus
}
#endif

#endif
