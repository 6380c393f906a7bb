/* moe: DeepSeek-V3 / GLM-5 expert routing and routed-expert FFN (CPU reference).
 *
 * Routing of one token from router logits (x . ffn_gate_inp):
 *   p = sigmoid(logits) (gating 2) or softmax(logits) (gating 1)
 *   choice = p + bias (bias: exp_probs_b, may be NULL; used for choosing only)
 *   groups (n_group > 1): group score = sum of its two highest choice values (sigmoid gating:
 *     DeepSeek-V3's noaux_tc), or its highest (softmax gating: DeepSeek-V2's
 *     group_limited_greedy); keep the n_group_used best groups (ties: lower group id), others
 *     excluded
 *   chosen = the n_used highest choice values among allowed experts (ties: lower id)
 *   weight = p[chosen] (normalised to sum 1 when norm, + 1e-20 as HF) * scale
 * Routing is a pure function of its inputs, so ranks that hold the same replicated inputs
 * make the same choice.
 *
 * No ownership; expert matrices are views into the mmap. */
#ifndef MOE_H
#define MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/threadpool.h"
#include "matmul.h"

typedef struct moe_route_params {
    int n_expert, n_used, n_group, n_group_used;
    int gating;            /* 1 softmax, 2 sigmoid */
    bool norm;
    float scale;
} moe_route_params;

/* ids[n_used] (in decreasing choice order), w[n_used]. */
void moe_route(const moe_route_params *p, const float *logits, const float *bias, int32_t *ids,
               float *w);

/* Routed experts: 3-D tensors with ne2 = n_expert, each slice a matrix of ne1 rows x ne0. */
typedef struct moe_experts {
    uint32_t gate_type, up_type, down_type;
    const void *gate, *up, *down;
    int64_t n_embd, n_ff, n_expert;
    const bool *owned;     /* [n_expert]: experts this rank computes (NULL: all) */
} moe_experts;

/* out[t] += sum_k w[t][k] * down_e(silu(gate_e x[t]) * up_e x[t]) for e = ids[t][k] owned. */
void moe_experts_apply(threadpool *tp, const moe_experts *ex, const float *x, int64_t T,
                       const int32_t *ids, const float *w, int64_t n_used, float *out);

#endif
