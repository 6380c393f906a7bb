/* attn_prefill_cuda: MLA attention of a prompt step in the non-absorbed (multi-head) form, on the
 * fp16 tensor cores (kernels/attn_prefill_cuda.cu).
 *
 * The absorbed form (mla_cuda_mla_attn) scores each query against the 576-wide latent rows and
 * outputs 512 latent columns a head, which v_b then maps to head_v: 2 (576 + 512) flops a (query,
 * key, head). A prompt of T tokens has T keys or more for each of its queries, so here the keys and
 * values are first decompressed per head from the sequence's cache rows (k_nope = c W_kb, v = c
 * W_vb^T, rounded to fp16; the rotated k_pe is the cache row's own, shared by the heads), and the
 * attention runs as FlashAttention does it: 2 (head_k + head_v) flops a (query, key, head), 640 at
 * DeepSeek's 128 + 64 / 128 (against 2176), 128 query rows a block sharing every key tile (mma.sync;
 * at 128 + 64 / 128 on a compute capability 9.0 device the warpgroup kernel, attn_pfwg_cuda.h). The
 * output is head_v floats a (token, head), what attn_output reads after v_b: no v_b product follows.
 *
 * Meaning: for query t of the step (position pos0 + t) and head h, with q = [q_nope | q_pe] and key
 * j = [c_j W_kb[h] | k_pe_j] for j = 0 .. pos0 + t (causal), s_j = scale q . key_j, p = softmax(s),
 *   out[t][h] = sum_j p_j (W_vb[h] c_j),
 * mathematically mla_attn (kernels/mla_attn.h) of q_abs = W_kb[h] q_nope followed by W_vb[h].
 * Queries (times the scale), keys, values and the softmax weights are rounded to fp16; products
 * are summed in fp32.
 *
 * Ownership: the caller owns every buffer, the work area included (mla_cuda_prefill_work_bytes);
 * nothing is allocated here. Pointers named d_ / the struct's are device pointers; the calls are
 * enqueued on `stream` and return before they have run. */
#ifndef ATTN_PREFILL_CUDA_H
#define ATTN_PREFILL_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mla_cuda_prefill_args {
    /* the step: n_tokens tokens of one sequence at positions pos0 .. pos0 + n_tokens - 1; query t,
     * head h at q + t q_ld_t + h q_ld_h: head_nope floats, then n_rope floats (rotated); 8-byte
     * aligned, the strides even */
    const float *q;
    int64_t q_ld_t, q_ld_h;
    int64_t n_tokens, pos0, n_head;
    int64_t kv_lora, n_rope, head_nope, head_v;
    /* the sequence's paged latent cache in fp16 (kernels/cuda_ops.h, MLA_CUDA_KV_BLOCK): its device
     * block table, this layer's rows at blk_off halves into each block, rows of kv_lora + n_rope
     * halves (latent, then the rotated k_pe); keys 0 .. pos0 + n_tokens - 1, the step's own rows
     * stored already */
    const float *const *blk_tab;
    int64_t blk_off;
    /* this launch's heads' up-projections, as the model keeps them: w_kb [n_head][kv_lora]
     * [head_nope], w_vb [n_head][head_v][kv_lora]; fp16 (w_f16) or float */
    const void *w_kb, *w_vb;
    int w_f16;
    float scale;
    /* head_v floats of token t, head h at out + t out_ld_t + h out_ld_h (8-byte aligned, strides even) */
    float *out;
    int64_t out_ld_t, out_ld_h;
    /* the decompressed keys and values of a group of heads at a time: at least
     * mla_cuda_prefill_work_bytes(pos0 + n_tokens, 1, ...) bytes (one head a group); 16-aligned */
    void *work;
    size_t work_bytes;
} mla_cuda_prefill_args;

/* Whether a kernel exists for the shape on this device: head_nope / n_rope / head_v 128 / 64 / 128
 * (DeepSeek-V2/V3, Kimi-K2), 192 / 64 / 256 (GLM-4.7-Flash) or 64 / 32 / 64 (the fixtures' widths),
 * kv_lora a multiple of 32 up to 1024, and the shared memory a block needs (84 KB at 128 / 64 / 128;
 * 100 KB at 192 / 64 / 256, 84 KB where a block has less: MLA_CUDA_SMEM_CAP applies). */
bool mla_cuda_prefill_supported(int64_t kv_lora, int64_t n_rope, int64_t head_nope, int64_t head_v);
/* bytes of the work area that holds the decompressed keys (head_nope) and values (head_v) of
 * `keys` keys for n_head heads */
size_t mla_cuda_prefill_work_bytes(int64_t keys, int64_t n_head, int64_t head_nope, int64_t head_v);
/* The attention of a->n_head heads: in groups of as many heads as the work area holds, the
 * decompression (two launches) then the attention (one), per group. MLA_OK, or MLA_ERR with the
 * CUDA error. Unsupported shapes and a work area short of one head are caller bugs (MLA_ASSERT). */
int mla_cuda_prefill_attn(const mla_cuda_prefill_args *a, mla_cuda_stream stream, mla_err *e);

#ifdef __cplusplus
}
#endif

#endif
