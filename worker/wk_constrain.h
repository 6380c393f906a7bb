/* wk_constrain: output constraints on rank 0 of the workers: per sequence a grammar matcher
 * (common/gram.h), logit biases and min_tokens' stop tokens (biased to -inf at the positions before
 * grammar_start + min_tokens, unless the grammar's mask allows nothing else), set up by the plan that starts the sequence's state
 * (SamplingParams constraint_setup) and advanced by the sequence's tokens from grammar_start on,
 * as plans bring them (so preemption, recompute and prefix-cache hits replay exactly the tokens
 * generated). Before a constrained row is sampled, wk_constrain_row gives the sampler its token
 * mask and biases (worker/sample.h).
 *
 * The vocabulary's token bytes come from the GGUF (tokenizer.ggml.tokens: byte-level BPE text
 * mapped back through the GPT-2 byte table, or SentencePiece pieces with U+2581 for spaces and
 * <0xHH> byte tokens); control and user-defined tokens are special (allowed only where a token
 * element of the grammar takes them: <[id]>, !<[id]>), unknown and unused tokens never; the
 * end-of-sequence tokens (eos, eot, eom) only when the grammar is complete.
 * A grammar bound hit while generating (common/gram.h: stack depth, ambiguity), or a state that no
 * token continues, fails that sequence: only end-of-sequence tokens are allowed from there, and
 * wk_constrain_failure names the reason, which rank 0 sends with the row's result (SeqResult.error)
 * so that the coordinator ends the request with that error; the batch goes on.
 *
 * Overlap: wk_constrain_prepare, called with a plan before its forward pass, takes the plan's
 * tokens and computes the masks of its constrained rows on up to WK_CONSTRAIN_THREADS threads
 * while the forward pass runs; wk_constrain_row then hands each row its mask. Without it (or for
 * a row it could not set up) wk_constrain_row does the same work itself.
 *
 * Ahead of the plans: where the engine samples on the device (engine_ops.dev_sample), every rank
 * keeps the records, and a row's next token (the one the device took, that the next plan will
 * bring) is taken when the mask of the step after it is made (wk_constrain_row with a one-token
 * row at that position); the plan then brings it again and it is skipped, or a different token
 * there is an error naming both.
 *
 * Ownership: wk_constrain_new -> wk_constrain_free; the vocabulary is read from the GGUF at the
 * first constrained row. The mask handed out lives until the next call (of the row's next step,
 * for a prepared row). */
#ifndef WK_CONSTRAIN_H
#define WK_CONSTRAIN_H

#include <stdint.h>

#include "common/gram.h"
#include "sample.h"
#include "wire.h"

typedef struct wk_constrain wk_constrain;

wk_constrain *wk_constrain_new(const char *model_path, uint32_t n_vocab);
void wk_constrain_free(wk_constrain *c);
/* A vocabulary given directly (tests; takes v), instead of the GGUF's. */
void wk_constrain_set_vocab(wk_constrain *c, gram_vocab *v);

/* For a row with sp.constrained: takes its setup and tokens; when it samples, fills mod (its
 * pointers valid until the next call). MLA_ERR with err set when the row cannot be served (the
 * vocabulary cannot be read, no setup for the sequence, a grammar that does not parse). */
int wk_constrain_row(wk_constrain *c, const wire_seq *s, sample_mod *mod, mla_err *err);

/* The grammar side of plan p's constrained rows on threads (see Overlap above); p's rows must stay
 * valid until wk_constrain_join or the rows' wk_constrain_row. A row that cannot be set up is
 * left to wk_constrain_row, which reports it. */
#define WK_CONSTRAIN_THREADS 4
/* skip (NULL: none): rows left to wk_constrain_row; masks false: the prepared rows' tokens only
 * are taken (a rank that samples nothing on the host), their masks then made by wk_constrain_row
 * if it is asked. */
void wk_constrain_prepare(wk_constrain *c, const wire_step_plan *p, const bool *skip, bool masks);
/* Waits for wk_constrain_prepare's threads (wk_constrain_row and wk_constrain_free do too). */
void wk_constrain_join(wk_constrain *c);
void wk_constrain_drop(wk_constrain *c, uint64_t seq_id);
/* Why sequence seq_id's constraint cannot go on (see above), or NULL; valid until the next call
 * about that sequence. */
const char *wk_constrain_failure(wk_constrain *c, uint64_t seq_id);

/* The token bytes of a GGUF's vocabulary (n_vocab entries: ids beyond its tokens stay absent). */
int wk_constrain_vocab_from_gguf(gram_vocab **out, const char *model_path, uint32_t n_vocab, mla_err *err);

#endif
