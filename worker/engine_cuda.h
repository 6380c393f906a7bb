/* engine_cuda: the CUDA forward pass (worker/model_cuda.h) as a worker engine (worker/engine.h).
 * Chosen by `mlaserve-worker --backend cuda` (the coordinator passes its --backend to the workers
 * it starts: `mlaserve serve|generate|logits --processes --backend cuda`).
 * Device: rank % visible device count (CUDA_VISIBLE_DEVICES chooses the devices). Before loading, the engine runs
 * cuda_selfcheck() and refuses to start with the name of the op that failed. In a build without
 * CUDA, load() fails with "built without CUDA".
 * Collective: NCCL (common/coll_nccl.h, device buffers on the model's stream) when the build has it,
 * libnccl.so.2 loads and every rank has a GPU of its own (world <= visible devices); rank 0 makes
 * the unique id and broadcasts it over the worker's host collective, and a known-answer check of
 * the NCCL operations runs before the model loads. Otherwise the worker's host collective (pinned
 * copies). The coordinator's --nccl off forbids NCCL, --nccl on makes "cannot use NCCL" an error. */
#ifndef ENGINE_CUDA_H
#define ENGINE_CUDA_H

#include "engine.h"

extern const engine_ops engine_cuda_ops;

/* CUDA devices this process sees (0 in a build without CUDA, or with no driver or device). */
int engine_cuda_devices(void);

#endif
