/* sched_batch (prefix sched_): continuous batching over a paged latent KV cache, engine-agnostic.
 * (Not named sched.h: the coordinator folder is on the include path and would shadow <sched.h>.)
 *
 * Requests (prompt token ids, sampling parameters, max_tokens, stop token ids) join and leave
 * between steps. Every step the scheduler builds a plan within a per-step token budget: the
 * running sequences oldest first (a decode row, or the next chunk of a prompt), then admission of
 * waiting requests first come first served while the cache and the budget allow (one whose
 * prompt logprobs the step has no rows left for is passed over: sampling.prompt_logprobs). While other
 * requests are in line behind them (running after, or waiting), the long prompts (more than
 * cfg.long_prefill_tokens left to prefill) share half of the budget, so that a long prompt does
 * not hold back the decodes and admissions behind it for its whole prefill; what the step leaves
 * unused goes back to their chunks. With that limit on, a request is admitted only where its whole
 * prompt fits beside what the running prompts still need. A plan entry names the sequence, its new token
 * ids, their start position, its cache block table and its sampling parameters; a backend
 * (sched_backend: function pointers) executes the plan and returns one sampled token per entry
 * that asked for one.
 *
 * KV cache: n_blocks blocks of block_size token slots (latent cache rows); each running sequence
 * holds a block table with a block id for every block_size positions computed or being computed
 * (position p lives in block table[p / block_size], slot p % block_size). Blocks are reference
 * counted: the count is the number of running sequences whose table holds the block. When a
 * running sequence needs a block and none can be had, the youngest running sequence is
 * preempted: it drops its references, the backend is told (free_seq) and it goes back to the
 * head of the waiting queue to be recomputed (prompt + tokens generated so far) later. A request
 * that could never fit the whole cache even alone (min(prompt + max_tokens, max_context) >
 * n_blocks * block_size) is refused at submission (SCHED_E_CAPACITY, the message naming both
 * in tokens: the API answers 400, as for a prompt past the context, since no retry can help); a full waiting queue refuses with SCHED_E_QUEUE_FULL (a
 * 429-type error).
 *
 * Prefix cache (cfg.prefix_cache): a FULL block (block_size positions whose rows a step computed
 * and returned MLA_OK for) is registered under the key (the id of the block before it in the
 * table, or -1 for the first block; its block_size token ids). A sequence's block is registered
 * only when the block before it is (each cached block hangs off a cached chain from position 0)
 * and no other block already holds the key. A duplicate (two sequences computed the same tokens
 * in one step) stays private to its sequence, which then holds the cached block it duplicates
 * (a pin) and registers its later blocks under that one, so that a cached block is never held
 * without its parent and the chain goes on past the duplicate. Lookups
 * go through a hash of the key but compare the key itself, so a hash collision never yields a
 * wrong prefix. At admission (of a new request or of a preempted one being resumed, whose tokens
 * are prompt + generated so far) the request takes the longest chain of cached blocks equal to its
 * tokens from position 0, at most (n_tokens - 1) / block_size blocks so that at least one token is
 * still computed; it holds a reference on each and starts with start_pos = hits * block_size. A
 * block whose count drops to 0 stays cached (evictable) in an LRU list; a sequence's blocks are
 * released last block first, so a chain's deepest blocks count as the least recently used. A new
 * block is a free (unregistered) one when there is one, else the least recently used evictable
 * block, which then leaves the cache. Reusing an evictable block takes it off the LRU list.
 * Admission counts reused blocks once, whoever else holds them; preemption and finishing drop
 * only the sequence's own references. With prefix_cache false no block is ever registered and
 * the scheduler behaves as without the cache (every block is private, freed blocks go straight
 * back to the free stack).
 *
 * What a backend must keep: the rows of a block stay as written until a plan entry writes them
 * again, also across free_seq (free_seq forgets the sequence, not the rows: other sequences may
 * read them as their cached prefix). A plan entry writes only positions [start_pos, start_pos +
 * n_tokens) of its own sequence; the blocks holding positions below start_pos, shared ones
 * included, are only read.
 *
 * Threads: sched_submit / sched_cancel / sched_get_stats / sched_check may be called from any
 * thread (one mutex guards the queues, the block tables, the reference counts and the prefix
 * cache). sched_step runs one step on the calling thread; sched_start runs steps on an own thread
 * until sched_stop. Events (tokens, finish) are delivered through cfg.on_event on the thread that
 * runs the step, never with the scheduler's lock held. Every accepted request gets exactly one
 * final event (finish != SCHED_FINISH_NONE), also after cancellation or a backend failure; after
 * it the scheduler never mentions that request again.
 *
 * Ownership: sched_init returns a scheduler the caller frees with sched_free (which stops the
 * thread; requests still inside are dropped without events). sched_submit copies the prompt,
 * the stop ids and the sampling parameters. The plan passed to run_step and everything it
 * points to is owned by the scheduler and valid only during that call. The block ids, the
 * reference counts and the prefix cache belong to the scheduler; the backend owns the rows. */
#ifndef SCHED_BATCH_H
#define SCHED_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/mla_err.h"

#define SCHED_MAX_TOP_LOGPROBS 20
/* The most prompt-logprob rows a step carries over all its entries (and at most cfg.max_seqs):
 * every such row's logits are made, where the workers keep those of a decode step's max_seqs
 * rows, and go to their host memory (rows x vocabulary floats) */
#define SCHED_PLP_CHUNK 256

typedef struct sched_sampling {
    float temperature;        /* 0: greedy */
    float top_p;              /* 1: off */
    int32_t top_k;            /* 0 or -1: off */
    float min_p;              /* 0: off */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    float repetition_penalty; /* 1: off */
    uint64_t seed;
    bool has_seed;
    bool logprobs;            /* return the sampled token's logprob */
    int32_t top_logprobs;     /* 0..SCHED_MAX_TOP_LOGPROBS alternatives */
    /* the logprob of each prompt token after the first, with top_logprobs alternatives (an
     * echoed prompt's): such a request computes every prompt position itself (no prefix cache),
     * a step's entries of such requests carry at most min(cfg.max_seqs, SCHED_PLP_CHUNK) tokens
     * together, and its first token event carries them */
    bool prompt_logprobs;
    /* Output constraints (coordinator/api_constrain.h): a GBNF grammar (NULL: none) and logit
     * biases. In a sched_request they are the submitter's (read during sched_submit only); the
     * scheduler keeps its own copies for the request's life. */
    const char *grammar;
    const int32_t *bias_ids;
    const float *bias_vals;
    int32_t n_bias;
    /* vLLM's min_tokens: the tokens ban_ids (distinct; the request's stop tokens, which the
     * submitter lists: its stop ids and, unless it ignores them, the end-of-generation tokens) are
     * not sampled until min_tokens tokens are generated (a grammar that can only end still ends).
     * Copied as the biases are; at most SCHED_MAX_BAN; min_tokens at most max_tokens. */
    int32_t min_tokens;
    const int32_t *ban_ids;
    int32_t n_ban;
} sched_sampling;

#define SCHED_MAX_BAN 256

/* Default (neutral) sampling parameters: temperature 1, no filters, no penalties. */
void sched_sampling_default(sched_sampling *s);

typedef struct sched_plan_seq {
    uint64_t seq_id;            /* = the request id */
    const int32_t *tokens;      /* the new tokens to run, n_tokens >= 1 */
    int32_t n_tokens;
    /* Position of tokens[0]; cache rows [0, start_pos) are valid. On a sequence's first plan
     * (n_blocks_sent == 0) it can be > 0: those rows are cached blocks computed earlier, maybe
     * for other sequences (prefix cache), and are read, never written. */
    int32_t start_pos;
    const int32_t *block_table; /* n_blocks cache block ids; position p lives in block
                                   block_table[p / block_size], slot p % block_size */
    int32_t n_blocks;
    /* Leading entries of block_table that the backend already received for this sequence in
     * earlier plans since the sequence last got state: 0 on its first plan and on the first
     * plan after a preemption or free_seq. Entries [0, n_blocks_sent) equal those sent before
     * (an entry never changes once sent while the sequence keeps its state), so a backend may
     * send or apply only [n_blocks_sent, n_blocks); its table after the step is
     * block_table[0, n_blocks). */
    int32_t n_blocks_sent;
    bool sample;                /* true: return the next token after tokens[n_tokens-1] */
    /* with sample: that token is the request's last by its length (max_tokens, or the context
     * full after it), so a backend need not prepare another step for the sequence */
    bool last;
    const sched_sampling *sampling;
    /* Tokens generated so far for this request (for penalties and seeded sampling: the
     * n_generated-th sampled token of a request uses the same random stream whether or not it
     * was preempted). The prompt is seq_tokens[0, n_prompt). */
    const int32_t *seq_tokens;
    int32_t n_prompt;
    int32_t n_generated;
    /* the backend returns the logprobs of the tokens after each of this entry's positions that
     * lie in the prompt (sched_result.plp): positions [start_pos, min(start_pos + n_tokens,
     * n_prompt - 1)) */
    bool prompt_logprobs;
} sched_plan_seq;

typedef struct sched_plan {
    const sched_plan_seq *seqs;
    int n_seqs;
    int32_t block_size;
    int32_t n_tokens; /* sum of seqs[i].n_tokens */
} sched_plan;

/* The logprob of a prompt token, and the most likely tokens at its position with theirs */
typedef struct sched_plp {
    float logprob;
    int32_t n_top;
    int32_t top_ids[SCHED_MAX_TOP_LOGPROBS];
    float top_logprobs[SCHED_MAX_TOP_LOGPROBS];
} sched_plp;

typedef struct sched_result {
    int32_t token;
    float logprob;
    int32_t n_top;
    int32_t top_ids[SCHED_MAX_TOP_LOGPROBS];
    float top_logprobs[SCHED_MAX_TOP_LOGPROBS];
    /* NULL, or why this sequence cannot go on (the backend's, valid until its next run_step): the
     * request then ends with SCHED_FINISH_ERROR and this message, its token dropped */
    const char *error;
    /* entries with prompt_logprobs (sample or not): n_plp entries, one per prompt position of the
     * entry as sched_plan_seq says (the backend's, valid until its next run_step) */
    const sched_plp *plp;
    int32_t n_plp;
} sched_result;

typedef struct sched_backend {
    void *ctx;
    /* Runs the plan; results[i] is filled for every plan entry with sample == true or
     * prompt_logprobs (entries with neither are left alone). Returns MLA_OK, or MLA_ERR with err filled (every request in
     * the plan is then finished with SCHED_FINISH_ERROR and its sequence freed). */
    int (*run_step)(void *ctx, const sched_plan *plan, sched_result *results, mla_err *err);
    /* Forget a sequence's state (finished, cancelled or preempted): its table and position.
     * The rows in its blocks must stay (see "What a backend must keep"). May be NULL. */
    void (*free_seq)(void *ctx, uint64_t seq_id);
    /* How many times the backend lost the rows of its blocks (a worker group that restarted).
     * When it moves, the next step starts every running request over from its first token (as
     * after a preemption) and the prefix cache forgets every block. May be NULL (never). */
    uint64_t (*cache_epoch)(void *ctx);
    /* True while the backend cannot run steps but will again (a worker group that failed and is
     * being restarted): no step runs and no request is failed meanwhile (the waiting ones are
     * admitted once it is back, as after a cache loss); cancellations still finish. A backend
     * down for good answers false, and its steps fail. May be NULL (never). */
    bool (*paused)(void *ctx);
} sched_backend;

enum sched_finish {
    SCHED_FINISH_NONE = 0,  /* not finished: a token event */
    SCHED_FINISH_STOP,      /* a stop token was sampled (it is in the event, is_stop set) */
    SCHED_FINISH_LENGTH,    /* max_tokens reached or the context is full */
    SCHED_FINISH_CANCELLED, /* sched_cancel */
    SCHED_FINISH_ERROR,     /* backend failure; message in the event */
};
const char *sched_finish_name(enum sched_finish f);

typedef struct sched_event {
    uint64_t req_id;
    void *user;              /* as given to sched_submit */
    bool has_token;
    bool is_stop;            /* the token is a stop token (not part of the text) */
    sched_result result;     /* valid when has_token */
    enum sched_finish finish;
    int32_t n_prompt;        /* prompt tokens of the request */
    int32_t n_generated;     /* tokens generated so far, this one included */
    int32_t n_cached;        /* prompt tokens its first admission took from the prefix cache */
    const char *error;       /* SCHED_FINISH_ERROR: message (valid during the callback) */
    /* the first token event of a request with sampling.prompt_logprobs: plp[i] is prompt token
     * i + 1's (n_plp = n_prompt - 1; valid during the callback) */
    const sched_plp *plp;
    int32_t n_plp;
} sched_event;

typedef struct sched_config {
    int32_t block_size;      /* token slots per cache block (> 0) */
    int32_t n_blocks;        /* cache blocks in all (> 0) */
    int32_t max_seqs;        /* sequences per step (> 0) */
    int32_t max_step_tokens; /* token budget per step, prefill chunks included (> 0) */
    int32_t max_queue;       /* waiting requests past the batch's free places (max_seqs less the
                              * running) before SCHED_E_QUEUE_FULL (> 0) */
    int32_t max_context;     /* prompt + generated limit per sequence (> 0) */
    /* Reuse cached full blocks of earlier sequences with the same leading tokens (see "Prefix
     * cache" above). false: every block is private, as before the cache existed. */
    bool prefix_cache;
    /* > 0: a prompt with more than this many tokens left to prefill is long: while other
     * requests are in line behind them (running after, or waiting), the long prompts of a step
     * share half of max_step_tokens, the rest going to the others (vLLM's
     * long_prefill_token_threshold); a step's tokens they leave go back to the chunks so cut.
     * Shorter prompts keep first come, first served. Admission then also needs the whole prompt
     * to fit beside what the running prompts still need (no admission that a running prefill
     * would preempt). 0: a chunk takes all the budget it can (oldest first), admission needs
     * its first chunk's blocks. */
    int32_t long_prefill_tokens;
    /* a running sequence whose row is its last pending token also gets the block of the position
     * after it when one can be had without preempting, so that a worker can run the next decode
     * step before the plan for it arrives (worker/wk_ahead.h) */
    bool decode_lookahead;
    /* > 0: no step runs until this many requests have been submitted, so that a burst meets the
     * first plan as one whatever the submitters' timing (tests: MLA_SCHED_HOLD); from then on it
     * no longer applies. 0: none. At most max_queue. */
    int32_t hold_until;
    /* Tokens that end generation for every request (EOS etc.) besides its own stop ids. */
    bool (*is_eog)(void *eog_ctx, int32_t token);
    void *eog_ctx;
    /* Called for every event; see the thread note above. */
    void (*on_event)(void *cb_ctx, const sched_event *ev);
    void *cb_ctx;
} sched_config;

typedef struct sched_request {
    const int32_t *prompt;
    int32_t n_prompt;        /* >= 1 */
    int32_t max_tokens;      /* >= 1 */
    const int32_t *stop_ids; /* may be NULL */
    int32_t n_stop_ids;
    bool ignore_eos;         /* do not apply cfg.is_eog */
    sched_sampling sampling;
    void *user;
    /* 0, or the id of a request submitted before this one whose prompt this one shares (the
     * choices of an API request with n > 1): with cfg.prefix_cache, and where this one may take
     * cached blocks (no repetition penalty, no prompt logprobs), it is not admitted while that one
     * waits or prefills its prompt, and then takes that prompt's full blocks from the cache rather
     * than computing them again. Requests behind it are admitted meanwhile. An id that is no
     * longer waiting or prefilling (or unknown) is no gate. */
    uint64_t after;
} sched_request;

enum sched_submit_err {
    SCHED_E_OK = 0,
    SCHED_E_INVALID = -1,    /* bad request (empty prompt, max_tokens < 1) */
    SCHED_E_CONTEXT = -2,    /* prompt (+1) longer than max_context */
    SCHED_E_CAPACITY = -3,   /* can never fit the cache: prompt + max_tokens > capacity */
    SCHED_E_QUEUE_FULL = -4, /* too many waiting */
    SCHED_E_STOPPED = -5,    /* the scheduler is shutting down */
};

typedef struct sched_stats {
    int32_t waiting, running;
    /* blocks_used: blocks held by running sequences (reference count > 0); evictable cached
     * blocks count as free here, so blocks_used / blocks_total is the usage ratio. */
    int32_t blocks_used, blocks_total, block_size;
    uint64_t steps, preemptions, tokens_prefilled, tokens_generated;
    /* Prefix cache (0 when cfg.prefix_cache is false). prefix_queries: tokens looked up, the
     * whole sequence at each admission (a resumed request is looked up again); prefix_hits:
     * of those, tokens found cached (start_pos of the admission). blocks_cached: evictable
     * cached blocks (reference count 0, still registered). Free blocks are blocks_total -
     * blocks_used - blocks_cached. */
    uint64_t prefix_queries, prefix_hits;
    int32_t blocks_cached;
    /* of blocks_used, those no running table holds: held only for a request whose own block
     * duplicates them (a pin, see the prefix cache above) */
    int32_t blocks_pinned;
} sched_stats;

typedef struct sched sched;

int sched_init(sched **out, const sched_config *cfg, const sched_backend *be, mla_err *err);
void sched_free(sched *s);

/* Adds a request; on success *req_id gets its id (> 0) and SCHED_E_OK is returned. On failure a
 * negative sched_submit_err is returned and err names the problem; no event will follow. */
int sched_submit(sched *s, const sched_request *r, uint64_t *req_id, mla_err *err);
/* Whether n more requests would be taken by sched_submit now: SCHED_E_OK, or SCHED_E_QUEUE_FULL /
 * SCHED_E_STOPPED with err naming why. A caller that is the only one to submit (the API's loop
 * thread) checks a group of requests whole this way: steps only make room. */
int sched_room(sched *s, int n, mla_err *err);
/* Finishes a request at the next step (final event SCHED_FINISH_CANCELLED). Unknown or finished
 * ids are ignored. */
void sched_cancel(sched *s, uint64_t req_id);

/* Runs one step on this thread. Returns 1 when work was done, 0 when idle. */
int sched_step(sched *s);
/* Starts / stops the scheduler thread (which calls sched_step until stopped). */
int sched_start(sched *s, mla_err *err);
void sched_stop(sched *s);

void sched_get_stats(sched *s, sched_stats *st);
/* The most requests an idle scheduler takes at once (cfg.max_seqs places and cfg.max_queue
 * waiting past them): a group of more requests can never be taken whole. */
int32_t sched_max_batch_submit(const sched *s);

/* Checks the scheduler's bookkeeping (for tests and debugging): every block's reference count
 * equals the number of running tables holding it; free + cached + used == n_blocks; the free
 * stack, the LRU list and the hash table hold exactly the blocks they should; every cached
 * block in a running table holds that sequence's tokens after that sequence's earlier blocks,
 * and its parent is cached and evicted after it. Returns MLA_OK, or MLA_ERR naming the first
 * broken rule. Takes the lock; O(n_blocks + tokens in the running tables). */
int sched_check(sched *s, mla_err *err);

#endif
