/* engine: what a worker runs, behind a table of functions so that the CPU model, the CUDA model
 * and test engines plug into the same worker process (worker/wk_run.h).
 *
 * Ownership: load() creates an engine owned by the caller, released with destroy(). The coll
 * passed to load() stays owned by the caller and outlives the engine; boot (may be NULL: no
 * coordinator to relay through) is used during load() only. Buffers passed to step()
 * belong to the caller.
 *
 * step() runs one StepPlan on this rank's shard. Every rank calls it with the same plan (the
 * engine performs its collectives inside). The logits it produces are read on rank 0 only
 * (other ranks may leave the buffers untouched): for sequence i, logits[i] holds rows(i) rows of
 * n_vocab floats, rows(i) = n_tokens when sp.logits == WIRE_LOGITS_ALL, else 1 (the row of the
 * last new token). */
#ifndef ENGINE_H
#define ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coll.h"
#include "mla_err.h"
#include "sample.h"
#include "wire.h"

typedef struct engine engine;

/* How a row of step_greedy or queue takes its token (one a row): take false: the engine writes
 * its logits (step_greedy; queue takes none such). take true: the engine takes the token itself,
 * greedily (sp's temperature 0 or top_k 1) or, where the engine says dev_sample, by the sampling
 * sp asks for (temperature, top_k, top_p, min_p, seed; never penalties or logprobs: such rows are
 * sampled on the host), drawn with stream, under mod's mask and biases (worker/sample.h; the
 * same token sampler_sample_mod takes, up to rounding at a boundary). mod_later (queue only):
 * the mask and biases are not known yet; the engine starts the step's forward pass and samples
 * when queue_mods gives them. */
typedef struct engine_drow {
    bool take, mod_later;
    const wire_sampling *sp;
    uint64_t stream; /* the position of the token sampled (sample.h) */
    sample_mod mod;  /* read during the call (queue_mods: during that call) */
} engine_drow;

/* Bootstrap exchange through the coordinator (provided by the worker runtime, worker/wk_boot.c):
 * rank 0 publishes a secret every rank needs before its collective exists (the NCCL unique id,
 * WIRE_MAX_NCCL_ID bytes); the coordinator relays it (Control NCCL_ID, docs/ctrl.md); the other
 * ranks wait for it, bounded by a timeout (the coordinator's --nccl-id-timeout-ms, 120 s by default), failing with
 * a message. Engines that need no such id (the CPU engine) ignore it. Called from load() only. */
typedef struct engine_boot {
    void *ctx;
    /* rank 0: hands the id to the coordinator */
    int (*publish_id)(void *ctx, const uint8_t *id, size_t len, mla_err *err);
    /* ranks > 0: waits for the id rank 0 published; len must be WIRE_MAX_NCCL_ID */
    int (*wait_id)(void *ctx, uint8_t *id, size_t len, mla_err *err);
} engine_boot;

/* What load() sizes the engine by: threads, and the cache pool settings the coordinator sent at
 * registration (wire_kv_opts: the fraction of the device, or the bytes, the pool may take; the
 * largest step and context the scratch must hold). */
typedef struct engine_opts {
    int n_threads;
    wire_kv_opts kv;
    wire_worker_opts wo; /* the coordinator's worker settings: NCCL, CUDA precision (RegisterReply) */
} engine_opts;

/* The latent cache pool an engine took at load: n_blocks blocks of block_size positions (every
 * layer's cache rows of those positions), block_bytes each. The coordinator's scheduler assigns
 * the blocks (one pager); the engine only stores rows where the block tables say. */
typedef struct engine_kv_pool {
    uint32_t n_blocks, block_size;
    uint64_t block_bytes;
} engine_kv_pool;

typedef struct engine_ops {
    const char *name;
    /* the model's identity, checked by the coordinator at registration (cheap: no weights) */
    int (*model_hash)(const char *model_path, uint64_t *hash, mla_err *err);
    int (*load)(engine **out, const char *model_path, int rank, int world, coll *c, const engine_boot *boot,
                const engine_opts *opts, mla_err *err);
    /* the pool load() took */
    void (*kv_pool)(const engine *e, engine_kv_pool *out);
    /* Applies the block table updates of every row of plan p (wire_seq block_start / blocks),
     * creating the sequences it does not know yet. The worker calls it for every plan before
     * anything of that plan runs, also for rows a step ahead already answered. MLA_ERR (nothing
     * applied to that row and after) for a cut past the table's end. */
    int (*set_tables)(engine *e, const wire_step_plan *p, mla_err *err);
    uint32_t (*n_vocab)(const engine *e);
    int (*step)(engine *e, const wire_step_plan *plan, float *const *logits, mla_err *err);
    /* forgets a sequence's cached state; unknown ids are ignored */
    void (*free_seq)(engine *e, uint64_t seq_id);
    void (*destroy)(engine *e);
    /* For `mlaserve bench` (NULL: the engine cannot; the worker answers with an error).
     * bench_fill: makes seq_id (created if new) hold n_past positions of zero latent cache, as if
     * a prompt of that length had run, so that decode at a long context is timed without
     * prefilling it; its block table becomes blocks[0, n_blocks), which must cover n_past
     * positions. bench_coll: times iters all-reduces of n floats on the collective the model
     * uses (device buffers where that is NCCL); *sec_per_op is the mean per all-reduce. Every
     * rank calls it with the same arguments. */
    int (*bench_fill)(engine *e, uint64_t seq_id, uint32_t n_past, const uint32_t *blocks, uint32_t n_blocks,
                      mla_err *err);
    int (*bench_coll)(engine *e, size_t n, int iters, double *sec_per_op, mla_err *err);
    /* Optional (NULL: every row is sampled on the host): step() where the engine may also take
     * the token of sequence i itself when drow[i].take is set (the worker sets it for a greedy
     * row, or with dev_sample for a sampled one, with no penalties, no logprobs and no logits
     * returned: engine_drow): tokens[i] = the token taken (greedy: the argmax of the row, lowest
     * id on ties), and logits[i] may then be left unwritten; tokens[i] = -1 for the rows it did
     * not take, whose logits it wrote as step() does. drow NULL: none taken. */
    int (*step_greedy)(engine *e, const wire_step_plan *plan, float *const *logits, const engine_drow *drow,
                       int32_t *tokens, mla_err *err);
    /* Optional (NULL: greedy rows only): whether step_greedy and queue take sampled rows too. */
    bool (*dev_sample)(const engine *e);
    /* Optional, all three or none (NULL: the worker runs its step ahead, worker/wk_ahead.h, with
     * step_greedy once the step before has returned). queue: starts plan a behind whatever the
     * engine has run or queued and returns without waiting for it; a's rows are one-token rows,
     * each at its sequence's next position, taken on the device as drow says (NULL: greedily).
     * With from_device, row i's token is the one that row i of the engine's last step (the last
     * step_greedy or queue, whose rows were a's sequences in a's order, every row taken on the
     * device) took, and a's token values are not read; an engine that cannot then fails and
     * queues nothing. Where rows have mod_later, queue_mods gives their masks and biases (mods[i]
     * for row i, read for the mod_later rows only; NULL: none, the tokens will not be used) and
     * only then is the step's sampling queued; until it comes, nothing may be queued and only
     * an older queued plan may be waited for. wait_queued: waits for the oldest queued plan
     * and writes its rows' tokens (fails for a plan whose sampling queue_mods could not queue). At most two plans are queued; the worker waits for every
     * queued plan before any other call. */
    int (*queue)(engine *e, const wire_step_plan *a, bool from_device, const engine_drow *drow, mla_err *err);
    int (*queue_mods)(engine *e, const sample_mod *mods, mla_err *err);
    int (*wait_queued)(engine *e, int32_t *tokens, mla_err *err);
    /* Optional (NULL: no device): the device's free and total memory in bytes, for the worker's
     * heartbeat stats. Called on the thread that runs the steps. */
    int (*mem_info)(engine *e, uint64_t *free_bytes, uint64_t *total_bytes);
    /* Optional (NULL: not timed): the decode steps (every row one token) the engine has timed
     * itself since load and their time in seconds, for the worker's heartbeat stats: a CUDA
     * engine its CUDA graph replays on the device (mla_cmodel_decode_time), the CPU engine its
     * steps on the clock. Called on the thread that runs the steps. */
    void (*decode_time)(const engine *e, uint64_t *steps, double *seconds);
    /* Optional (NULL: none, the CPU engine): the kernel configuration the engine chose at load
     * (architecture, attention kernel, shared memory, wgmma), sent with the loaded frame for the
     * coordinator's /metrics. */
    void (*backend_config)(const engine *e, wire_backend_cfg *out);
} engine_ops;

/* rows of logits step() writes for sequence s */
static inline uint32_t engine_logit_rows(const wire_seq *s) {
    return s->sp.logits == WIRE_LOGITS_ALL ? s->n_tokens : 1;
}

#endif
