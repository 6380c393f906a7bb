/* model: the exact CPU forward pass of deepseek2 / glm-dsa models (MLA + MoE [+ DSA]).
 *
 * Tensor parallelism is built in: a model is created for (rank, world) with a collective
 * (common/coll.h); the shard of every tensor comes from common/shard_plan (heads of
 * attn_q_b/attn_k_b/attn_v_b/attn_kv_b and their attn_output columns, experts e % world ==
 * rank, dense/shared FFN rows+columns when block-aligned, else computed by rank 0 alone).
 * Everything else (norms, attn_q_a, attn_kv_a_mqa, router, indexer, embeddings) is replicated
 * and computed identically on every rank, so routing and DSA key selection agree across ranks.
 * Each layer does one all-reduce after attention and one after the FFN/MoE.
 *
 * Weights are views into the GGUF mmap (no copies). The latent KV cache holds per layer and
 * token [c_kv (kv_lora) | k_pe (rope, rotated)], identical on every rank; glm-dsa also caches
 * one indexer key (LayerNorm'd, rotated) per token and layer.
 *
 * Ownership: mla_model_load borrows the gguf_ctx and the coll (both must outlive the model)
 * and owns its thread pool; mla_model_free releases it. mla_state_new/free own the caches. */
#ifndef WORKER_MODEL_H
#define WORKER_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/coll.h"
#include "common/gguf.h"
#include "common/mla_err.h"
#include "common/model_config.h"

typedef struct mla_model mla_model;
typedef struct mla_state mla_state;

typedef struct mla_model_opts {
    int n_threads;     /* CPU threads for this rank (<= 0: 1) */
} mla_model_opts;

/* coll NULL: single rank. Checks the config and every tensor shape; MLA_ERR with a message
 * naming the tensor on a mismatch, or when the tensor-parallel plan is invalid. */
int mla_model_load(mla_model **out, const gguf_ctx *g, coll *c, const mla_model_opts *opts,
                   mla_err *err);
void mla_model_free(mla_model *m);
const mla_config *mla_model_config(const mla_model *m);

/* A cache for one sequence of up to n_ctx tokens. */
mla_state *mla_state_new(const mla_model *m, int64_t n_ctx);
void mla_state_free(mla_state *s);
int64_t mla_state_n_past(const mla_state *s);
/* Forget tokens from position pos on (pos <= n_past). */
void mla_state_truncate(mla_state *s, int64_t pos);
/* For `mlaserve bench`: the cache holds n_past positions of zeros (latent rows and indexer keys),
 * as if a prompt of that length had run, so that the next forward runs at position n_past.
 * MLA_ERR when n_past is negative or exceeds the state's context. */
int mla_state_bench_fill(mla_state *s, int64_t n_past, mla_err *err);

/* For an engine that keeps the rows elsewhere (worker/engine_cpu.c: a paged pool) and copies
 * them in before a forward and out after it: layer il's latent rows [n_ctx][kv_lora + n_rope],
 * or (indexer) its indexer key rows [n_ctx][idx_head_dim] (NULL without an indexer); the
 * state's context; setting the valid length (0 <= n_past <= n_ctx). */
float *mla_state_rows(mla_state *s, int64_t il, bool indexer);
int64_t mla_state_n_ctx(const mla_state *s);
void mla_state_set_n_past(mla_state *s, int64_t n_past);

enum mla_logits_mode { MLA_LOGITS_NONE = 0, MLA_LOGITS_LAST = 1, MLA_LOGITS_ALL = 2 };

/* Runs n_tokens tokens at positions pos0.. (pos0 must equal the state's n_past: prompt in one
 * pass, then one or more tokens at a time). Writes logits [n_tokens][n_vocab] (ALL) or
 * [n_vocab] for the last token (LAST) into logits when not NONE; every rank receives the full
 * logits. MLA_ERR for a token id out of range or a full cache. Collective: every rank calls it
 * with the same tokens. */
int mla_model_forward(mla_model *m, mla_state *s, const int32_t *tokens, int64_t n_tokens,
                      int64_t pos0, enum mla_logits_mode mode, float *logits, mla_err *err);

#endif
