/* engine: what a worker runs, behind a table of functions so that the CPU model, the CUDA model
 * and test engines plug into the same worker process (worker/wk_run.h).
 *
 * Ownership: load() creates an engine owned by the caller, released with destroy(). The coll
 * passed to load() stays owned by the caller and outlives the engine. Buffers passed to step()
 * belong to the caller.
 *
 * step() runs one StepPlan on this rank's shard. Every rank calls it with the same plan (the
 * engine performs its collectives inside). The logits it produces are read on rank 0 only
 * (other ranks may leave the buffers untouched): for sequence i, logits[i] holds rows(i) rows of
 * n_vocab floats, rows(i) = n_tokens when sp.logits == WIRE_LOGITS_ALL, else 1 (the row of the
 * last new token). */
#ifndef ENGINE_H
#define ENGINE_H

#include <stdint.h>

#include "coll.h"
#include "mla_err.h"
#include "wire.h"

typedef struct engine engine;

typedef struct engine_ops {
    const char *name;
    /* the model's identity, checked by the coordinator at registration (cheap: no weights) */
    int (*model_hash)(const char *model_path, uint64_t *hash, mla_err *err);
    int (*load)(engine **out, const char *model_path, int rank, int world, coll *c, int n_threads,
                mla_err *err);
    uint32_t (*n_vocab)(const engine *e);
    int (*step)(engine *e, const wire_step_plan *plan, float *const *logits, mla_err *err);
    /* forgets a sequence's cached state; unknown ids are ignored */
    void (*free_seq)(engine *e, uint64_t seq_id);
    void (*destroy)(engine *e);
} engine_ops;

/* rows of logits step() writes for sequence s */
static inline uint32_t engine_logit_rows(const wire_seq *s) {
    return s->sp.logits == WIRE_LOGITS_ALL ? s->n_tokens : 1;
}

#endif
