/* serve_adapt: the glue between `mlaserve serve`'s servers and the rest of the coordinator.
 * - the tokenizer adapter (api_tokenizer, coordinator/api_server.h) over the model's vocabulary
 *   (coordinator/tok.h) and chat template (coordinator/chat.h);
 * - the scheduler's backend (sched_backend, coordinator/sched_batch.h) over the worker group
 *   (coordinator/coord.h): each scheduler plan becomes a wire_step_plan for coord_step (the
 *   workers keep their own per-sequence cache, addressed by sequence id and positions; the
 *   scheduler's block accounting bounds how much of it is in use);
 * - the API server's health hooks (api_config: /health, its load progress, /metrics' workers).
 * Every hook takes the serve_adapt as its ctx.
 *
 * Ownership: the caller fills vocab, tmpl, prefix (owned by the serve_adapt from then on), c and
 * api (borrowed: the caller stops and frees them); serve_adapt_free() releases what it owns and
 * its scratch. Not thread-safe: the scheduler's thread runs the backend, the server's loop the
 * other hooks, as cmd_serve.c arranges. */
#ifndef SERVE_ADAPT_H
#define SERVE_ADAPT_H

#include <stdbool.h>
#include <stdint.h>

#include "coordinator/api_server.h"
#include "coordinator/chat.h"
#include "coordinator/coord.h"
#include "coordinator/sched_batch.h"
#include "coordinator/tok.h"

typedef struct serve_adapt {
    tok_vocab *vocab;
    chat_tmpl *tmpl;
    char *prefix; /* what every plain prompt starts with (BOS, "[gMASK]<sop>") */
    coord *c;
    api_server *api;
    uint64_t step_id;
    uint64_t seed_base;
    wire_seq *wseqs;
    char (*errs)[WIRE_MAX_STR]; /* a step's per-sequence errors (sched_result.error), cap_wseqs */
    int cap_wseqs;
    int32_t *pos;
    size_t cap_pos;
    sched_plp *plp; /* a step's prompt logprobs (sched_result.plp), cap_plp entries */
    size_t cap_plp;
} serve_adapt;

/* The tokenizer adapter for api_server_new (render_chat only with a chat template). */
api_tokenizer serve_adapt_tokenizer(serve_adapt *s, int32_t n_vocab);

/* Fills ac's worker hooks (health, loading, workers; health_ctx = s). */
void serve_adapt_api_hooks(serve_adapt *s, api_config *ac);

/* The scheduler's backend over the worker group (run_step, free_seq). */
sched_backend serve_adapt_backend(serve_adapt *s);

/* End of generation (sched_config.is_eog, eog_ctx = s). */
bool serve_adapt_is_eog(void *ctx, int32_t id);

/* Frees vocab, tmpl, prefix and the scratch (not c nor api). */
void serve_adapt_free(serve_adapt *s);

#endif
