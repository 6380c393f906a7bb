/* dsa_indexer: DeepSeek Sparse Attention key selection (GLM-5 indexer, HF GlmMoeDsaIndexer).
 *
 * For query t at absolute position p = pos0 + t, with indexer queries q[t][h][hd] (roped),
 * head weights w[t][h] (already x.W_proj * n_head^-0.5) and cached keys k[j][hd] (LayerNorm'd,
 * roped) for j <= p:
 *   score(j) = sum_h w[t][h] * ReLU(q[t][h] . k[j] * hd^-0.5)
 * When p + 1 <= top_k every key 0..p is selected (dense); otherwise the top_k highest scores
 * (ties: lower key index first, a deterministic choice). sel[t] lists the chosen key ids in
 * increasing order; n_sel[t] their count. No ownership. */
#ifndef DSA_INDEXER_H
#define DSA_INDEXER_H

#include <stdint.h>

#include "common/threadpool.h"

typedef struct dsa_args {
    const float *q;        /* [T][n_head][head_dim] */
    const float *w;        /* [T][n_head] */
    const float *k;        /* key cache [n_keys >= pos0 + T][head_dim] */
    int64_t n_tokens, n_head, head_dim, pos0, top_k;
    int32_t *sel;          /* [T][top_k] */
    int32_t *n_sel;        /* [T] */
} dsa_args;

void dsa_select(threadpool *tp, const dsa_args *a);

/* The scores of one query against keys 0..n_keys-1 (exposed for tests). */
void dsa_scores(const float *q, const float *w, const float *k, int64_t n_keys, int64_t n_head,
                int64_t head_dim, float *scores);
/* Top-k of scores[0..n) (higher first, ties to the lower index), written ascending to idx;
 * returns the count min(k, n). */
int64_t dsa_topk(const float *scores, int64_t n, int64_t k, int32_t *idx);

#endif
