/* model_config: the hyper-parameters of an MLA + MoE model (GGUF architectures `deepseek2`:
 * DeepSeek-V2/V2-Lite/V3/R1, Kimi-K2, GLM-4.7-Flash; and `glm-dsa`: GLM-5) read from GGUF
 * metadata, plus a shape check of every tensor against them.
 *
 * Missing optional keys get the value llama.cpp uses for the architecture; every such default
 * is recorded in cfg->assumed[] (key, value, why) so `inspect` can show it.
 *
 * Ownership: mla_config is plain caller-owned storage (no pointers into the gguf_ctx);
 * nothing to free. */
#ifndef MODEL_CONFIG_H
#define MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf.h"
#include "mla_err.h"

enum mla_arch { MLA_ARCH_DEEPSEEK2 = 0, MLA_ARCH_GLM_DSA = 1 };
enum mla_gating { MLA_GATING_SOFTMAX = 1, MLA_GATING_SIGMOID = 2 };

#define MLA_CONFIG_MAX_ASSUMED 32

typedef struct mla_assumed {
    char key[96];
    char value[48];
    char why[160];
} mla_assumed;

typedef struct mla_config {
    enum mla_arch arch;
    char arch_name[32];

    int64_t n_layer;      /* layers run by the forward pass (block_count - nextn layers) */
    int64_t n_layer_file; /* block_count */
    int64_t n_nextn;      /* MTP layers present in the file, not run */
    int64_t n_embd;
    int64_t n_vocab;
    int64_t n_head;
    int64_t n_ff;         /* dense FFN width */
    int64_t n_ff_exp;     /* routed expert FFN width */
    int64_t n_ff_shexp;   /* the shared experts' FFN width: expert_shared_feed_forward_length where the file
                           * has it (a rank's share, mkmodel --rank-of), else n_ff_exp * n_expert_shared */
    float rms_eps;

    /* MLA */
    int64_t q_lora_rank;  /* 0: plain attn_q (DeepSeek-V2-Lite) */
    int64_t kv_lora_rank;
    int64_t head_k;       /* nope + rope */
    int64_t head_v;
    int64_t n_rope;       /* rope.dimension_count */
    int64_t head_nope;    /* head_k - n_rope */

    /* RoPE / YaRN */
    float rope_base;
    bool yarn;
    float yarn_factor;
    int64_t yarn_orig_ctx;
    float yarn_beta_fast, yarn_beta_slow;
    float yarn_log_mul;   /* GGUF yarn_log_multiplier = 0.1 * mscale_all_dim */
    float rope_attn_factor; /* cos/sin multiplier (HF mscale(f,mscale)/mscale(f,mscale_all_dim)) */
    float kq_scale;       /* softmax scale: mscale^2 / sqrt(head_k) */

    /* MoE */
    int64_t n_expert, n_expert_used, n_expert_shared;
    int64_t n_group, n_group_used;
    enum mla_gating gating;
    bool weights_norm;
    float weights_scale;
    int64_t n_dense_lead;

    /* DSA indexer (glm-dsa); n_head 0 when absent */
    int64_t idx_n_head, idx_head_dim, idx_top_k;

    int64_t ctx_train;

    int n_assumed;
    mla_assumed assumed[MLA_CONFIG_MAX_ASSUMED];
} mla_config;

/* Reads the config from metadata. MLA_ERR for an unsupported architecture, a missing required
 * key, or inconsistent values (message names the key). */
int mla_config_from_gguf(mla_config *cfg, const gguf_ctx *g, mla_err *err);

/* Checks that every tensor the forward pass uses exists with the expected shape and a type this
 * build can compute with, e.g.
 *   "blk.1.attn_q_b.weight: shape [256, 380] but the config expects [256, 384]". */
int mla_config_check_tensors(const mla_config *cfg, const gguf_ctx *g, mla_err *err);

/* Checks that a backend computes with the type of every weight the forward pass reads (the
 * tensors of mla_config_check_tensors but the F32-only ones): ok(type) says whether it does.
 * MLA_ERR naming each type it lacks with a count and a tensor, e.g. "the CUDA backend has no
 * kernels for IQ4_NL (61 tensors, e.g. blk.3.ffn_down_exps.weight): ...". The CUDA worker asks
 * before it uploads a byte; `mlaserve inspect` reports it. */
int mla_config_check_types(const mla_config *cfg, const gguf_ctx *g, bool (*ok)(uint32_t), const char *backend,
                           mla_err *err);

/* Checks the arguments of a forward step against a sequence's state, as every model (CPU and
 * CUDA) does before it runs one: T > 0 tokens starting at pos0 == n_past, ending within n_ctx,
 * every id inside the vocabulary. MLA_ERR with a message naming the first problem. */
int mla_config_check_step(const mla_config *c, const int32_t *tokens, int64_t T, int64_t pos0, int64_t n_past,
                          int64_t n_ctx, mla_err *err);

/* Whether the CUDA backend's attention runs in fp32 (1) or on the fp16 tensor cores (0):
 * MLA_CUDA_ATTN=fp32|tc decides, else fp32 exactly in exact mode (exact: --cuda-precision exact, as
 * the engine reads it). MLA_ERR when MLA_CUDA_ATTN holds another value (err names it). The backend
 * and `mlaserve bench` both ask here. */
int mla_cuda_attn_fp32(bool exact, mla_err *err);

/* The element type of the CUDA backend's latent cache, rows of `row` (kv_lora + rope) elements:
 * fp16 where attention runs on the fp16 tensor cores (which round the keys to fp16 anyway), fp32
 * where it runs in fp32 (attn_fp32: exact mode or MLA_CUDA_ATTN=fp32); MLA_CUDA_KV=f16|f32 (as
 * llama.cpp's --cache-type-k) overrides both. Rows of an odd length stay fp32 (the indexer rows
 * after the fp16 ones in a block stay aligned).
 * Returns 1 (fp16), 0 (fp32), or MLA_ERR when MLA_CUDA_KV holds another value (err names it). The
 * backend and `mlaserve bench` (which counts the bytes a decode step reads) both ask here. */
int mla_cuda_kv_f16(int64_t row, bool attn_fp32, mla_err *err);

/* Whether layer il is a dense-FFN layer. */
static inline bool mla_config_layer_dense(const mla_config *c, int64_t il) {
    return il < c->n_dense_lead || c->n_expert == 0;
}

#endif
