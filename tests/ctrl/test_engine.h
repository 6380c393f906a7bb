/* A tiny deterministic engine for testing the control plane (tests only, never shipped).
 *
 * Vocabulary TEST_VOCAB. Its "KV cache" is the running hash after every position, stored in a pool
 * of blocks of 16 positions (kv_memory_bytes / 1 KiB blocks, 4096 by default) where the plans'
 * block tables say, as the real engines store rows: shared blocks give the same state; free_seq
 * forgets a sequence's table. The logits of a token are the sum over ranks of a
 * per-rank part, combined with the real collective (all-reduce), so a wrong collective or a
 * missing rank changes the answer:
 *   logit[v] = sum_r part(r, state_after_token, position, v),  part in multiples of 1/64
 * (exact in float, whatever the summation order). test_engine_expected() computes the same
 * thing in-process for the tests.
 * Positions are taken as the real engines take them: a plan starting below what a sequence holds
 * rewinds it there (a running state is kept per position), one starting past it is refused
 * unless the sequence holds nothing yet (its table shares blocks), one past its table is refused.
 * queue / wait_queued (engine.h) run the plan at once and hand its tokens out later. It samples
 * on the "device" (dev_sample): rows it takes get the host sampler's token (worker/sample.c) from
 * their logits, queued rows whose masks come later when queue_mods gives them.
 * Developer switches (common/mla_switch.h): MLA_TEST_ENGINE_DELAY_MS (sleep inside every step, before the all-reduce),
 * MLA_TEST_ENGINE_STATS=PATH (at destroy, PATH.<rank> gets "tokens host_queues device_queues":
 * the tokens the engine advanced, and its queue calls with tokens from the plan / the device),
 * MLA_TEST_ENGINE_FAIL_LOAD (a rank number whose load fails).
 * NCCL-id relay (engine_boot, as the CUDA engine uses it): with MLA_TEST_ENGINE_ID_SEED=S and
 * world > 1, rank 0's load publishes test_engine_boot_id(S) through the coordinator and every
 * other rank's load waits for it and fails unless the relayed bytes are exactly those;
 * MLA_TEST_ENGINE_ID_CORRUPT=B makes rank 0 flip byte B (1..127) before publishing,
 * MLA_TEST_ENGINE_ID_NOPUB=1 makes it publish nothing (the others time out). */
#ifndef TEST_ENGINE_H
#define TEST_ENGINE_H

#include <stdint.h>

#include "engine.h"

#define TEST_VOCAB 97

extern const engine_ops test_engine_ops;

/* model hash used by the test engine: FNV-1a of the model file's bytes */
int test_engine_file_hash(const char *path, uint64_t *hash, mla_err *err);

/* the 128-byte id rank 0 publishes for seed S (MLA_TEST_ENGINE_ID_SEED) */
void test_engine_boot_id(uint64_t seed, uint8_t id[WIRE_MAX_NCCL_ID]);

/* running state after appending token t at position pos to state h (start: 0 = empty) */
uint64_t test_engine_advance(uint64_t h, int32_t t, int32_t pos);
/* the logits row for state h (after its token at position pos), world size T */
void test_engine_expected(uint64_t h, int32_t pos, int world, float *row);

#endif
