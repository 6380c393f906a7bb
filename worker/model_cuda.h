/* model_cuda: the forward pass of worker/model.h on one CUDA device, same weights, same
 * semantics, same tensor-parallel plan (common/shard_plan.h): this rank's shard of every tensor
 * is uploaded still quantized (attn_k_b / attn_v_b of its heads are dequantized once to float:
 * they feed the per-head absorbed products); the latent KV cache and the indexer key cache live
 * on the device; every op of a step runs on the device on one stream. Host synchronisation
 * inside a step happens only for a collective with world > 1 on the host collective (it copies
 * through pinned memory; NCCL runs on its own stream ordered by events) and for the final copy
 * of the logits.
 *
 * Ownership: mla_cmodel_load borrows the gguf_ctx (only during load: weights are copied to the
 * device) and the coll (must outlive the model; NULL = single rank). mla_cmodel_free releases
 * all device memory. A state (caches) belongs to its model and is released with
 * mla_cstate_free before the model. One model per thread (its stream and scratch). */
#ifndef WORKER_MODEL_CUDA_H
#define WORKER_MODEL_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "common/coll.h"
#include "common/gguf.h"
#include "common/mla_err.h"
#include "common/model_config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mla_cmodel mla_cmodel;
typedef struct mla_cstate mla_cstate;

typedef struct mla_cmodel_opts {
    int device;        /* CUDA device ordinal */
    bool exact;        /* fp32 GEMV for every matmul (no tensor cores); the int8 activations of
                        * quantized weights (MLA_CUDA_Q8) are off unless MLA_CUDA_Q8=1, and attention
                        * stays on fp32 CUDA cores unless MLA_CUDA_ATTN=tc (MLA_CUDA_ATTN=fp32 keeps
                        * it there in the other modes; another value fails the load) */
    /* the coll takes DEVICE buffers, ordered with the model's stream (NCCL, common/coll_nccl.h:
     * the owner attaches mla_cmodel_stream() to it before the first forward); false: host
     * buffers (the host collective; the model stages through pinned memory) */
    bool coll_on_device;
    /* with exact false: steps of more than 8 tokens on the split-bf16 tensor-core matmul
     * (mla_cuda_matmul_split: hi/lo, 3 MMAs, ~fp32 accuracy) instead of plain bf16 */
    bool split;
} mla_cmodel_opts;

int mla_cmodel_load(mla_cmodel **out, const gguf_ctx *g, coll *c, const mla_cmodel_opts *opts, mla_err *err);
void mla_cmodel_free(mla_cmodel *m);
/* --allreduce oneshot: all-reduces of at most 512 KB through peer memory (kernels/allreduce_cuda.h)
 * instead of the collective's, each fused with the residual add and RMSNorm after it where the
 * step's rows fit (mla_cuda_ar_add_rmsnorm_fits). Call after a NCCL coll has the model's stream;
 * every rank calls it. Needs 2 to 8 ranks and one_host (the ranks' GPUs are peers in one host, or
 * one GPU that the ranks share, over the host collective). */
int mla_cmodel_ar_oneshot(mla_cmodel *m, bool one_host, mla_err *err);
const mla_config *mla_cmodel_config(const mla_cmodel *m);
/* the model's compute stream (a cudaStream_t) */
void *mla_cmodel_stream(const mla_cmodel *m);
/* whether the model's attention runs on the fp16 tensor cores (not exact mode, MLA_CUDA_ATTN) */
bool mla_cmodel_attn_tc(const mla_cmodel *m);
/* Device bytes the weights of this rank take. */
uint64_t mla_cmodel_weight_bytes(const mla_cmodel *m);

/* The latent cache pool (one allocation, blocks of MLA_CUDA_KV_BLOCK positions: every layer's
 * rows of those positions, then every layer's indexer key rows, in one block). mla_cmodel_kv_init
 * first sizes the scratch for the largest step (max_step_tokens or max_seqs tokens, max_ctx keys,
 * max_seqs rows of logits), then takes what is left of gpu_memory_utilization x the device's
 * memory (vLLM's meaning: the weights and the scratch count in, and whatever else uses the device)
 * less a margin of min(512 MiB, 2%) for graphs and library workspaces; kv_bytes_cap > 0 (--kv-memory)
 * asks for that many bytes instead, whatever the fraction, where they are free; at most max_blocks
 * blocks (0: no cap). MLA_ERR naming the numbers when not one block fits. Once per model. */
typedef struct mla_cmodel_kv_opts {
    double gpu_memory_utilization;
    int ranks_on_device; /* > 1: this many processes share the device: each takes 1/k of the
                          * fraction, less its own weights, scratch and context, at most what is
                          * free now */
    uint64_t kv_bytes_cap;
    int64_t max_blocks;
    int64_t max_step_tokens, max_ctx, max_seqs;
} mla_cmodel_kv_opts;
int mla_cmodel_kv_init(mla_cmodel *m, const mla_cmodel_kv_opts *o, mla_err *err);
/* blocks in the pool and the device bytes of one */
void mla_cmodel_kv_pool(const mla_cmodel *m, int64_t *n_blocks, uint64_t *block_bytes);

/* A sequence's state: its block table (which pool blocks hold its positions: position p in block
 * table[p / MLA_CUDA_KV_BLOCK]) and how many positions are valid. The table holds up to the
 * pool's max_ctx positions; mla_cstate_set_blocks cuts it to start entries and appends ids[0, n)
 * (uploaded on the model's stream ahead of any step that reads them). Who owns which block is
 * the caller's business (the coordinator's scheduler): shared blocks are only read by the steps
 * (a step writes only the rows of its new positions). NULL / MLA_ERR with err set. */
mla_cstate *mla_cstate_new(mla_cmodel *m, mla_err *err);
int mla_cstate_set_blocks(mla_cstate *s, int64_t start, const uint32_t *ids, int64_t n, mla_err *err);
void mla_cstate_free(mla_cstate *s);
int64_t mla_cstate_n_past(const mla_cstate *s);
/* the positions its table covers */
int64_t mla_cstate_covered(const mla_cstate *s);
/* the valid positions become [0, pos): fewer (a rewind), or more where the table shares blocks
 * another sequence filled (pos <= mla_cstate_covered) */
void mla_cstate_set_n_past(mla_cstate *s, int64_t pos);

/* As mla_model_forward (worker/model.h): mode 0 none, 1 last token, 2 all tokens; logits is a
 * host buffer [rows][n_vocab]; every rank receives the full logits. A prompt runs as one step
 * of its T tokens (the same kernels as a decode step, each token at its own position). */
int mla_cmodel_forward(mla_cmodel *m, mla_cstate *s, const int32_t *tokens, int64_t n_tokens, int64_t pos0,
                       int mode, float *logits, mla_err *err);

/* One decode step of B sequences, one new token each: tokens[b] at position
 * mla_cstate_n_past(states[b]) (the states are distinct). Every matmul runs over the B tokens at
 * once; each token attends over its own sequence's cache. Positions, cache addresses and token
 * ids reach the device in one copy, so the step's work is captured once per (B, longest context)
 * as a CUDA graph and replayed (with one rank or NCCL: MLA_CUDA_GRAPHS=0 turns graphs off,
 * =require makes a failed capture an error instead of a logged fall-back to eager steps); the
 * only host synchronisation is the copy of the logits. logits: NULL, or B host rows of n_vocab
 * (NULL rows skipped); every rank receives the full rows. Same results as mla_cmodel_forward
 * one sequence at a time. mla_cmodel_forward takes this path for single-token steps unless
 * MLA_CUDA_BATCHED=0. */
int mla_cmodel_decode(mla_cmodel *m, mla_cstate *const *states, const int32_t *tokens, int64_t B,
                      float *const *logits, mla_err *err);
/* mla_cmodel_decode that also returns each row's greedy token, the argmax of its logits (lowest id
 * on ties) computed on the device: ids[b] for b < B (ids NULL: none). Rows whose logits[b] is NULL
 * are then never copied to the host. Needs mla_cmodel_device_argmax(m): with the vocabulary split
 * over ranks only where the logits are gathered on the device (NCCL). */
int mla_cmodel_decode_greedy(mla_cmodel *m, mla_cstate *const *states, const int32_t *tokens, int64_t B,
                             float *const *logits, int32_t *ids, mla_err *err);
bool mla_cmodel_device_argmax(const mla_cmodel *m);
/* A row's sampling on the device (kernels/cuda_ops.h mla_cuda_sample_pieces): the settings
 * (temperature 0 or top_k 1: greedy), the draw's seed and stream, and its token mask (n_vocab
 * bytes, 0: not allowed; NULL: every token) and logit biases, read during the call that takes it. */
typedef struct mla_cmodel_samp {
    float temperature, top_p, min_p;
    int32_t top_k;
    uint64_t seed, stream;
    const uint8_t *allow;
    const int32_t *bias_ids;
    const float *bias_vals;
    uint32_t n_bias;
} mla_cmodel_samp;
/* mla_cmodel_decode_greedy where ids[b] is the token row b samples by samp[b] (samp NULL: the
 * greedy ids); -1 where no token of the row is allowed. Needs mla_cmodel_device_argmax(m). */
int mla_cmodel_decode_sample(mla_cmodel *m, mla_cstate *const *states, const int32_t *tokens, int64_t B,
                             float *const *logits, const mla_cmodel_samp *samp, int32_t *ids, mla_err *err);
/* A decode step queued on the device (worker/engine.h queue): mla_cmodel_decode_queue starts a
 * greedy decode step of the B states, each at its next position, behind everything before it on
 * the model's stream, and returns without waiting (at most two queued). tokens NULL: each
 * state's token is the greedy id the model's last decode step took for it on the device (that
 * step's states in the same order: mla_cmodel_decode_greedy with ids, or the last queued step);
 * anything else fails and queues nothing. Needs mla_cmodel_device_argmax(m).
 * mla_cmodel_decode_wait waits for the oldest queued step and writes its B greedy ids. Freeing a
 * state waits for everything queued. */
int mla_cmodel_decode_queue(mla_cmodel *m, mla_cstate *const *states, const int32_t *tokens, int64_t B,
                            mla_err *err);
/* The same where the step's ids are sampled by samp (NULL: greedy), or, with later, by what
 * mla_cmodel_decode_queue_samp gives next: the forward pass is queued now, the sampling then
 * (nothing else may come between; until then nothing can be queued from this step's ids, and
 * waiting for it fails). */
int mla_cmodel_decode_queue_sample(mla_cmodel *m, mla_cstate *const *states, const int32_t *tokens, int64_t B,
                                   const mla_cmodel_samp *samp, bool later, mla_err *err);
int mla_cmodel_decode_queue_samp(mla_cmodel *m, const mla_cmodel_samp *samp, mla_err *err);
int mla_cmodel_decode_wait(mla_cmodel *m, int32_t *ids, mla_err *err);
/* whether the batched decode path is on (MLA_CUDA_BATCHED) */
bool mla_cmodel_batched(const mla_cmodel *m);
/* the batched decode steps replayed from a captured graph so far (those whose result was
 * taken): their device time, from before a step's first copy to after its forward pass, sampling
 * and copy to the host (a step whose sampling waited for its masks: to the end of its forward
 * pass), and the device's time from the end of one to the start of the next (the device waiting
 * for the host, or running other work: prompt steps, steps not timed, deferred sampling, and
 * every pause between requests) */
void mla_cmodel_decode_time(const mla_cmodel *m, uint64_t *steps, double *busy_s, double *between_s);
/* graphs captured and launched so far */
void mla_cmodel_graph_stats(const mla_cmodel *m, uint64_t *captures, uint64_t *launches);
/* layer attentions of prompt steps that took the non-absorbed form (kernels/attn_prefill_cuda.h)
 * so far: the evidence for the checks that lower MLA_CUDA_PREFILL_MIN */
uint64_t mla_cmodel_prefill_mha_count(const mla_cmodel *m);

/* For `mlaserve bench` (worker/engine.h bench_fill, bench_coll): the state holds n_past
 * positions of zero cache (its table must cover them); the model's all-reduce path timed over iters all-reduces of n floats
 * (every rank calls it). */
int mla_cstate_bench_fill(mla_cstate *s, int64_t n_past, mla_err *err);
int mla_cmodel_bench_coll(mla_cmodel *m, size_t n, int iters, double *sec_per_op, mla_err *err);

#ifdef __cplusplus
}
#endif

#endif
