/* shard_plan: which bytes of which tensor each tensor-parallel rank holds, and how it computes
 * with them. The one source of truth for `mlaserve inspect --tp N` and for the worker loader.
 *
 * Rules (DESIGN.md, "Tensor parallelism"), for world size T and rank r:
 *  - replicated: token_embd, norms, attn_q_a, attn_kv_a_mqa, ffn_gate_inp, exp_probs_b, indexer.*
 *  - by heads (H % T == 0 or the plan is invalid): attn_q_b / attn_q output rows of heads
 *    [r*H/T, (r+1)*H/T); attn_k_b / attn_v_b outermost dim (ne2 = heads); attn_kv_b rows.
 *  - attn_output: input columns of its heads (row-parallel, summed by the all-reduce). When the
 *    column range would cut a quantization block, the fallback is a split by output rows with the
 *    heads' outputs all-gathered first ("gather_input"); when even that is impossible the plan is
 *    invalid.
 *  - dense FFN and shared experts: gate/up by output rows, down by input columns (the same
 *    range). When the down split would cut a block (or F % T != 0) the FFN is replicated and
 *    computed by rank 0 alone ("rank0_only"; others add zero before the all-reduce).
 *  - routed experts: rank r owns experts {e : e mod T == r} (ne2 index).
 *  - output (lm_head): vocab rows split when vocab % T == 0 (logits all-gathered), else replicated.
 *
 * Ownership: shard_plan_build fills a caller-owned shard_plan; shard_plan_free releases the
 * arrays inside it. Entries' names point into the gguf_ctx, which must outlive the plan. */
#ifndef SHARD_PLAN_H
#define SHARD_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "mla_err.h"
#include "model_config.h"

/* The few model dimensions the plan depends on (filled from the model config). */
typedef struct shard_dims {
    int64_t n_head;
    int64_t head_k;  /* nope + rope: rows per head of attn_q_b */
    int64_t head_kv; /* nope + v: rows per head of legacy attn_kv_b */
    int64_t head_v;  /* v dims per head: columns per head of attn_output */
    int64_t n_expert;
    int64_t n_vocab;
} shard_dims;

enum shard_kind {
    SHARD_REPLICATE = 0,
    SHARD_ROWS,    /* rows [begin, end) of ne1 */
    SHARD_COLS,    /* columns [begin, end) of ne0 (block-aligned) */
    SHARD_DIM2,    /* slices [begin, end) of ne2 (heads) */
    SHARD_EXPERTS, /* slices {e : e % world == rank} of ne2 */
};

enum shard_role {
    ROLE_OTHER = 0,
    ROLE_EMBD, ROLE_NORM, ROLE_OUTPUT,
    ROLE_Q_A, ROLE_Q_B, ROLE_Q, ROLE_KV_A, ROLE_K_B, ROLE_V_B, ROLE_KV_B, ROLE_ATTN_OUT,
    ROLE_FFN_GATE, ROLE_FFN_UP, ROLE_FFN_DOWN,
    ROLE_ROUTER, ROLE_ROUTER_BIAS,
    ROLE_EXP_GATE, ROLE_EXP_UP, ROLE_EXP_DOWN,
    ROLE_SHEXP_GATE, ROLE_SHEXP_UP, ROLE_SHEXP_DOWN,
    ROLE_INDEXER,
    ROLE_COUNT
};

typedef struct shard_entry {
    const char *name;
    int layer;             /* -1 for non-layer tensors */
    enum shard_role role;
    enum shard_kind kind;
    int64_t begin, end;    /* range for ROWS / COLS / DIM2 */
    bool rank0_only;       /* replicated fallback computed by rank 0 alone */
    bool gather_input;     /* output-row split of a row-parallel matrix: input all-gathered */
    uint64_t bytes_total;  /* the whole tensor */
    uint64_t bytes_rank;   /* what this rank holds */
} shard_entry;

typedef struct shard_plan {
    int rank, world;
    bool valid;
    char reason[512];      /* why not valid */
    char notes[2048];      /* fallbacks chosen, one per line */
    shard_entry *entries;  /* one per tensor, in file order */
    size_t n_entries;
    uint64_t bytes_total, bytes_rank;
} shard_plan;

/* The plan's dimensions of a model config. */
shard_dims shard_dims_from_config(const mla_config *c);

/* Builds the plan for rank/world. An invalid plan (heads not divisible, no block-aligned
 * layout) is not an error: valid=false and reason says why. MLA_ERR only for bad arguments. */
int shard_plan_build(shard_plan *p, const gguf_ctx *g, const shard_dims *d, int rank, int world,
                     mla_err *err);
void shard_plan_free(shard_plan *p);
/* The plan a worker loads with: shard_plan_build on the config's dimensions, and MLA_ERR
 * ("tensor-parallel plan for N ranks is invalid: <reason>") when it is not valid. */
int shard_plan_for_model(shard_plan *p, const gguf_ctx *g, const mla_config *cfg, int rank, int world,
                         mla_err *err);

const char *shard_role_name(enum shard_role r);
const char *shard_kind_name(enum shard_kind k);
/* Role of a tensor name ("blk.3.attn_q_b.weight" -> ROLE_Q_B, *layer = 3). */
enum shard_role shard_role_of(const char *name, int *layer);
/* The entry for a tensor name, or NULL. */
const shard_entry *shard_plan_find(const shard_plan *p, const char *name);

#endif
