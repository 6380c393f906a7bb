/* fake_backend: a deterministic stand-in for the model workers, for tests only.
 *
 * It keeps a real paged cache (one int32 token per slot) addressed through the block tables of
 * the plans, checks the scheduler's bookkeeping (continuous positions, blocks owned by one live
 * sequence only, block tables long enough; a sequence's first plan may start after a prefix cached
 * for another) and "samples" the next token as a pure function of
 * the whole sequence read back from its cache: fake_next(). A wrong block table or position
 * therefore changes the output, which tests compare with fake_next() over the true sequence.
 *
 * The fake model over a byte vocabulary (ids 0..255 are bytes, FAKE_EOS = 256, FAKE_BOS = 257):
 *   h = FNV-1a 64 of the tokens (each as 4 little-endian bytes)
 *   next = FAKE_EOS when h % eos_period == 0 (eos_period > 0), else ALPHA[h % 27]
 *   logprob = -(((h >> 8) % 1000) / 1000) - 0.001
 *   top i (0-based): ALPHA[(h + i) % 27] (top 0 is the chosen token), logprob - 0.5 * i
 * with ALPHA = "abcdefghijklmnopqrstuvwxyz ".
 * A prompt token k's logprob (sched_plan_seq.prompt_logprobs) is fake_plp(prompt, k): the
 * fake's logprob and alternatives after the sequence's first k tokens. */
#ifndef FAKE_BACKEND_H
#define FAKE_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "coordinator/sched_batch.h"

#define FAKE_EOS 256
#define FAKE_BOS 257
#define FAKE_VOCAB 258

typedef struct fake_backend fake_backend;

typedef struct fake_config {
    int32_t n_blocks, block_size; /* must match the scheduler's */
    uint32_t eos_period;          /* 0: never EOS */
    int step_delay_ms;            /* sleep per step (to make streams last) */
    int64_t fail_at_step;         /* step index (0-based) whose run_step fails; -1 never */
    /* A sequence of seq_fail_prompt prompt tokens (0: none) fails alone (sched_result.error) when
     * it samples its seq_fail_gen-th generated token (0-based), as a worker's grammar would. */
    int32_t seq_fail_prompt, seq_fail_gen;
    /* A scripted model: when set, a sequence's n-th generated token is the n-th id of this file
     * (ids as decimal numbers separated by whitespace, read at every sampling step; at most
     * 65536), then FAKE_EOS; logprobs as fake_next gives them. NULL: fake_next's tokens. */
    const char *script_file;
} fake_config;

fake_backend *fake_backend_new(const fake_config *cfg);
void fake_backend_free(fake_backend *f);
/* Sets be to the fake's functions (the other members zero: it never loses its rows). */
void fake_backend_bind(fake_backend *f, sched_backend *be);

/* The reference: the next token and its logprobs after seq[0..n). */
void fake_next(const int32_t *seq, int n, uint32_t eos_period, int n_top, sched_result *out);
/* The reference of a prompt token's logprob: out->logprob and its n_top alternatives for the
 * token at position n of seq (seq[0..n) before it). */
void fake_plp(const int32_t *seq, int n, int n_top, sched_result *out);

/* Counters for tests. Violations of the scheduler's contract are counted (and logged). */
typedef struct fake_stats {
    int64_t steps, violations, live_seqs, max_batch_tokens, max_batch_seqs, frees;
    int64_t max_plp_tokens; /* the most tokens of prompt-logprobs entries in one plan */
} fake_stats;
void fake_backend_stats(fake_backend *f, fake_stats *st);
void fake_backend_set_delay(fake_backend *f, int step_delay_ms);

#endif
