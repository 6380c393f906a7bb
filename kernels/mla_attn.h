/* mla_attn: absorbed Multi-head Latent Attention over the latent cache (CPU reference).
 *
 * For query token t (absolute position pos0 + t) and head h:
 *   s(j) = (q_abs[t,h,:] . c_kv[j,:] + q_pe[t,h,:] . k_pe[j,:]) * scale
 * over keys j = 0 .. pos0 + t (causal), or over the listed keys sel[t][0..n_sel[t]) when a
 * selection is given (DSA; every listed key must be <= pos0 + t); p = softmax(s);
 *   out[t,h,:] = sum_j p(j) c_kv[j,:].
 * Cache rows: kv[j * (kv_lora + n_rope) + ...] = [c_kv (kv_lora) | k_pe (n_rope, roped)].
 * q_abs: [T][n_head][kv_lora], q_pe: [T][n_head][n_rope], out: [T][n_head][kv_lora].
 * No ownership. */
#ifndef MLA_ATTN_H
#define MLA_ATTN_H

#include <stdint.h>

#include "common/threadpool.h"

typedef struct mla_attn_args {
    const float *q_abs;
    const float *q_pe;
    int64_t n_tokens, n_head, kv_lora, n_rope;
    const float *kv;       /* latent cache of this layer */
    int64_t pos0;
    float scale;
    const int32_t *sel;    /* NULL: dense causal; else [n_tokens][sel_stride] key ids */
    const int32_t *n_sel;  /* [n_tokens] */
    int64_t sel_stride;
    float *out;
} mla_attn_args;

void mla_attn(threadpool *tp, const mla_attn_args *a);

#endif
