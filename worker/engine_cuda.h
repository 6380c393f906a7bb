/* engine_cuda: the CUDA forward pass (worker/model_cuda.h) as a worker engine (worker/engine.h).
 * Chosen by `mlaserve-worker --backend cuda` or MLA_BACKEND=cuda in the environment (the
 * coordinator's workers inherit it: `MLA_BACKEND=cuda mlaserve serve|generate|logits --processes`).
 * Device: rank % device count, or MLA_CUDA_DEVICE. Before loading, the engine runs
 * cuda_selfcheck() and refuses to start with the name of the op that failed. In a build without
 * CUDA, load() fails with "built without CUDA". */
#ifndef ENGINE_CUDA_H
#define ENGINE_CUDA_H

#include "engine.h"

extern const engine_ops engine_cuda_ops;

#endif
