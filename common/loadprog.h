/* loadprog: how far this process's model load has come, for the load progress a worker logs
 * and reports to the coordinator (worker/wk_run.c), which shows it in /health and bases the
 * start timeout on it.
 *
 * Progress is counted in bytes of the model file's tensors: the loaders (worker/model.c,
 * worker/model_cuda.cu) go through the layers in order and report each layer done; the tensors
 * outside the layers (embeddings, output) count at loadprog_finish. A rank that loads a shard
 * reads only its part of each tensor, but goes through every layer: the fraction and the ETA
 * hold, the rate is in file bytes a second.
 *
 * Process-wide state (one load at a time), thread-safe: the loader writes, another thread reads.
 * Nothing to free. */
#ifndef LOADPROG_H
#define LOADPROG_H

#include <stdint.h>

#include "gguf.h"

/* A load of g starts: total := bytes of every tensor, done := 0, the clock starts. */
void loadprog_begin(const gguf_ctx *g);
/* Layers 0..n_layers-1 are loaded: done := bytes of their tensors ("blk.N.*").
 * Fault injection for tests: $MLA_LOAD_LAYER_DELAY_MS makes each call after the first sleep that
 * long (a slow load of a small model). */
void loadprog_layers_done(const gguf_ctx *g, int64_t n_layers);
/* The load is complete: done := total. */
void loadprog_finish(void);

typedef struct loadprog_state {
    uint64_t done, total;
    double seconds; /* since loadprog_begin (0: not begun) */
    int finished;
} loadprog_state;
void loadprog_get(loadprog_state *st);

/* "12.3 of 400.0 GiB (3%), 1.20 GiB/s, ETA 5m30s" into buf (rate and ETA once known). */
void loadprog_describe(const loadprog_state *st, char *buf, unsigned long cap);

#endif
