/* sample: token sampling on the worker (rank 0, after the logits of a sequence's last token).
 *
 * Order of operations: penalties on the logits (repetition: divide positive / multiply negative
 * logits of tokens seen in the history, prompt included; frequency: minus f x the token's count
 * among the generated tokens; presence: minus p once if it is among them), then
 * greedy (temperature 0 or top_k 1: argmax, lowest id on ties), else temperature, top_k, softmax,
 * top_p (smallest prefix of the sorted distribution whose mass reaches top_p), min_p (drop tokens
 * below min_p x the largest probability), and one draw.
 *
 * Randomness is stateless: the draw is a hash of (seed, stream), where the caller passes the
 * position of the token being sampled as the stream. The same seed, position and logits always
 * give the same token, whatever else the batch holds and whichever process samples.
 *
 * Logprobs (logprob of the chosen token, top_logprobs) are those of the model's raw distribution
 * (log-softmax of the unmodified logits), as the OpenAI API reports them.
 *
 * Ownership: a sampler holds scratch buffers for one vocabulary size; sampler_new / sampler_free. */
#ifndef SAMPLE_H
#define SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "mla_err.h"
#include "wire.h"

typedef struct sampler sampler;

typedef struct sample_out {
    int32_t token;
    float logprob;
    uint32_t n_top;
    wire_top top[WIRE_MAX_TOP_LOGPROBS];
} sample_out;

/* Output constraints of one row (worker/wk_constrain.h), applied to its logits first: tokens
 * with allow[i] == 0 get -inf, bias_vals[k] is added to token bias_ids[k] (OpenAI logit_bias).
 * Logprobs then are those of this modified distribution (as OpenAI reports them under
 * logit_bias); tokens at -inf are never listed among top_logprobs. */
typedef struct sample_mod {
    const uint8_t *allow; /* NULL: every token */
    const int32_t *bias_ids;
    const float *bias_vals;
    uint32_t n_bias;
} sample_mod;

sampler *sampler_new(uint32_t n_vocab);
void sampler_free(sampler *s);

/* history: the sequence's tokens the penalties look at, each in [0, n_vocab) (out-of-range entries
 * are ignored); here all of them generated ones. */
void sampler_sample(sampler *s, const float *logits, const wire_sampling *sp, const int32_t *history,
                    size_t n_history, uint64_t stream, sample_out *out);
/* The same with the row's constraints (mod may be NULL) and a history whose first n_prompt_hist
 * tokens are the prompt's: the repetition penalty looks at every token of the history, the
 * presence and frequency penalties only at the generated ones (as OpenAI and vLLM count them). */
void sampler_sample_mod(sampler *s, const float *logits, const wire_sampling *sp, const sample_mod *mod,
                        const int32_t *history, size_t n_history, size_t n_prompt_hist, uint64_t stream,
                        sample_out *out);

/* out := token, its logprob in the distribution of logits (log-softmax) and the n_top most likely
 * tokens with theirs (at most WIRE_MAX_TOP_LOGPROBS; tokens at -inf are not listed): what
 * sampling reports for a chosen token, and the logprobs of a prompt's own tokens. */
void sample_logprob(const float *logits, uint32_t V, int32_t token, uint32_t n_top, sample_out *out);

/* The uniform number in [0, 1) used for (seed, stream); exposed for tests. */
double sampler_uniform(uint64_t seed, uint64_t stream);

#endif
