/* api_server: the OpenAI-compatible HTTP API over the scheduler.
 *
 * Routes: POST /v1/completions, POST /v1/chat/completions (both with stream:true as
 * Server-Sent Events ending in "data: [DONE]"), POST /v1/responses (the chat path under the
 * Responses API's shapes, coordinator/api_responses.h; streamed as its events), GET /v1/models,
 * GET /health, GET /metrics, POST /tokenize, POST /detokenize. Errors use the OpenAI shape
 * {"error":{"message","type","param","code"}}.
 *
 * Engine-agnostic: the tokenizer and the chat template come in as function pointers
 * (api_tokenizer), the model through the scheduler (sched_batch.h), worker health through a
 * callback. Threads: everything runs on the libuv loop thread except api_server_on_event, which
 * the scheduler calls from its thread: it only queues the event and wakes the loop (uv_async),
 * and the prep thread (started with the first request, joined by api_server_free), which makes
 * the prompts (chat template, tokenizer) of HTTP requests, of sink generations with on_refused
 * and of api_server_tokenize_async, in arrival order; the tokenizer's functions must therefore
 * be callable from another thread than the loop's. Chat message text is guarded
 * (coordinator/chat_guard.h) unless api_config.special_in_messages.
 * Stop strings are matched on the detokenized text here; the text is cut before them and the
 * request is cancelled in the scheduler.
 * Chat responses are split into content, reasoning_content and tool_calls by the parsers named in
 * api_config (coordinator/chat_reasoning.h, chat_toolcall.h; docs/chat-dialects.md), in whole
 * responses and streams; the template variables of a request (chat_template_kwargs,
 * reasoning_effort, tools) must be read by the template (api_tokenizer.chat_uses_var).
 *
 * Setup order: api_server_new -> sched_init with on_event = api_server_on_event and
 * cb_ctx = the api server -> api_server_set_sched -> http_server_init with handler
 * api_server_handle and ud = the api server -> api_server_set_http.
 * Shutdown: http_server_close, api_server_drain (runs the loop until every request has its
 * final scheduler event), sched_stop, sched_free, api_server_free, http_server_free.
 * Ownership: api_server_new copies the config strings and the tokenizer struct (not what its
 * ctx points to); the caller frees with api_server_free. */
#ifndef API_SERVER_H
#define API_SERVER_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/mla_err.h"
#include "coordinator/api_params.h"
#include "coordinator/coord.h"
#include "coordinator/http_server.h"
#include "coordinator/sched_batch.h"

typedef struct api_tokenizer {
    void *ctx;
    int32_t n_vocab;
    /* text -> token ids (*ids malloc'd, caller frees). add_special: BOS etc. per the vocab;
     * parse_special: special-token texts become those tokens, except where they would touch
     * one of the n_plain spans plain[2k] .. plain[2k+1] (byte offsets, ascending; NULL, 0: none):
     * text there is plain text. */
    int (*encode)(void *ctx, const char *text, size_t len, bool add_special, bool parse_special,
                  const size_t *plain, size_t n_plain, int32_t **ids, int32_t *n, mla_err *err);
    /* Length of the control-token text at text[pos] that encode would turn into a control token
     * (0: none). Chat messages are guarded with it (coordinator/chat_guard.h): their text never
     * becomes control tokens. NULL: no guard (only with api_config.special_in_messages). */
    size_t (*control_at)(void *ctx, const char *text, size_t len, size_t pos);
    /* The bytes a token decodes to (may be part of a UTF-8 sequence); NULL when out of range. */
    const char *(*piece)(void *ctx, int32_t id, size_t *len);
    /* Control tokens render as nothing when skip_special_tokens (the default). */
    bool (*is_special)(void *ctx, int32_t id);
    /* End-of-generation tokens (EOS, EOT...). */
    bool (*is_eog)(void *ctx, int32_t id);
    /* Renders chat messages (a validated cJSON array) to prompt text (malloc'd, caller frees);
     * vars (may be NULL): further template variables (tools, chat_template_kwargs,
     * reasoning_effort). NULL when the model has no chat template (chat requests then get 400). */
    int (*render_chat)(void *ctx, const cJSON *messages, bool add_generation_prompt, const cJSON *vars,
                       char **out, mla_err *err);
    /* Whether the chat template reads the variable name (NULL: none does). A variable a request
     * sets (chat_template_kwargs, reasoning_effort, tools) that the template never reads is a 400. */
    bool (*chat_uses_var)(void *ctx, const char *name);
} api_tokenizer;

typedef struct api_config {
    const char *model_name;    /* the id in /v1/models and responses */
    const char *model_aliases; /* NULL, or more names a request may give, separated by commas (each
                                * one in /v1/models too) */
    const char *api_key;       /* NULL or "": no authentication */
    int32_t max_context;       /* prompt + completion limit */
    int32_t default_max_tokens;/* when the request names none; 0: what the context leaves */
    /* wrong keys from one address before it is locked out (api_server_auth); 0: API_AUTH_MAX_FAILS,
     * -1: never (behind a proxy every client has its address) */
    int32_t auth_max_fails;
    /* Control-token texts inside chat messages become control tokens (the old behaviour, for
     * trusted clients); false: only the chat template's own text yields control tokens. */
    bool special_in_messages;
    /* Worker health: return true when all is well; else fill why. NULL: always healthy. */
    bool (*health)(void *ctx, char *why, size_t cap);
    void *health_ctx;
    /* While the workers load (the server answers before they are ready): true, with *body a
     * JSON object (the caller's: /health answers 503 with it). NULL: never loading. ctx: health_ctx. */
    bool (*loading)(void *ctx, cJSON **body);
    /* /metrics: the workers' state (coordinator/coord.h coord_workers). NULL: none. ctx: health_ctx. */
    int (*workers)(void *ctx, coord_worker_info *info, int cap);
    /* /metrics: the worker group's restarts so far (coordinator/coord.h coord_restarts). NULL: none. */
    int (*restarts)(void *ctx);
    int tp; /* tensor-parallel degree, for mlaserve_model_info */
    /* Chat output parsing (docs/chat-dialects.md): enum reasoning_kind (coordinator/chat_reasoning.h)
     * and enum toolcall_kind (coordinator/chat_toolcall.h), resolved (no "auto"); 0: none. Only the
     * HTTP chat API parses; api_server_generate's sinks get the text as generated. */
    int reasoning_parser;
    int tool_parser;
} api_config;

typedef struct api_server api_server;

int api_server_new(api_server **out, uv_loop_t *loop, const api_config *cfg,
                   const api_tokenizer *tok, mla_err *err);
void api_server_set_sched(api_server *a, sched *s);
/* Once the workers report their cache pools: the context the server takes (prompt + completion),
 * and for /metrics the blocks of each of n_ranks ranks (borrowed, outlives the server) and the
 * bytes of one block. Loop thread. */
void api_server_set_capacity(api_server *a, int32_t max_context, const uint32_t *rank_blocks, int n_ranks,
                             uint64_t block_bytes);
void api_server_set_http(api_server *a, http_server *h);
/* The http_handler_fn (ud = the api server). */
void api_server_handle(void *ud, http_conn *c, const http_request *req);
/* The http_early_fn (ud = the api server): refuses a request that needs the key and lacks it
 * before its body is read. */
bool api_server_early(void *ud, http_conn *c, const http_head *h);
/* The http_error_form_fn (ud = the api server): Anthropic's form for /v1/messages and
 * /v1/messages/count_tokens, OpenAI's for the rest. */
enum http_error_form api_server_error_form(void *ud, const char *url);
/* The sched_config.on_event callback (cb_ctx = the api server); any thread. */
void api_server_on_event(void *cb_ctx, const sched_event *ev);
/* Runs the loop until no generation request is in flight (after http_server_close). */
void api_server_drain(api_server *a);
/* Requests in flight: submitted, or with their prompt being made on the prep thread. */
int api_server_inflight(const api_server *a);
/* Of those, the ones whose prompt is being made (not submitted yet). */
int api_server_preparing(const api_server *a);
/* Graceful drain: from now on new generations get 503 "shutting_down" and /health answers 503,
 * both naming why (copied; e.g. "signal 15", or the worker group's failure); requests in
 * flight go on. */
void api_server_set_draining(api_server *a, const char *why);
/* The scheduler runs a step that starts request sched_id's prompt (any thread; the first call for
 * a request counts): the request's queue time ends, its prefill time starts (/metrics). */
void api_server_note_scheduled(api_server *a, uint64_t sched_id);
/* Prompt tokens received and tokens generated so far (loop thread). */
void api_server_token_counts(const api_server *a, uint64_t *prompt, uint64_t *generated);
/* Cancels every request in flight; each fails with `reason` (a static string) as its error. */
void api_server_cancel_all(api_server *a, const char *reason);
void api_server_free(api_server *a);

/* ---- the same generation path for other fronts (the gRPC API, coordinator/grpc_*) ----
 * Everything below runs on the loop thread. */

/* A generated token: id, logprob, alternatives, and its byte range [start, end) in the
 * request's generated text. */
typedef struct api_token {
    int32_t id;
    float logprob;
    int32_t n_top;
    int32_t top_ids[SCHED_MAX_TOP_LOGPROBS];
    float top_lps[SCHED_MAX_TOP_LOGPROBS];
    size_t start, end;
    bool no_lp;  /* an echoed prompt's first token: no logprob (null) */
    bool prompt; /* an echoed prompt's token */
} api_token;

/* Where a generation's output goes. text is the whole generated text so far (after
 * detokenization and stop strings); [from, to) is the part not delivered yet and toks[0, n)
 * the tokens it comes from (their ranges may reach past to: a token's text can be cut by a stop
 * string or end inside a UTF-8 sequence). Text up to `to` ends on a UTF-8 boundary (the bytes
 * themselves are the model's: they may be invalid UTF-8). */
/* How a generation ended (api_sink.on_final): API_END_SHUTDOWN when the drain timeout of a
 * shutting-down server cut it off (api_server_cancel_all), whichever way it then ended;
 * API_END_UNAVAILABLE when it failed while the worker group was down (another server, or this
 * one once the group is back, may take it again) */
enum api_end { API_END_OK = 0, API_END_FAILED, API_END_CANCELLED, API_END_SHUTDOWN, API_END_UNAVAILABLE };

typedef struct api_sink {
    void *ud;
    void (*on_delta)(void *ud, const char *text, size_t from, size_t to, const api_token *toks, int n);
    /* The last call: the rest of the text and tokens, then finish_reason ("stop", "length") on
     * success or error (a message; finish_reason NULL; end says why: failed, cancelled, or cut
     * off by the server's shutdown) and the usage. The api_gen handle is gone after it returns. */
    void (*on_final)(void *ud, const char *text, size_t from, size_t to, const api_token *toks, int n,
                     const char *finish_reason, const char *error, enum api_end end, int32_t n_prompt,
                     int32_t n_completion);
    /* Optional. When set, api_server_generate returns at once and the prompt (chat template,
     * tokenizer) is made on the prep thread; a request refused then (prompt too long, template
     * error, queue full, ...) gets this call instead, with the error the HTTP API would answer,
     * and the handle is gone after it. NULL: all of it happens inside api_server_generate. */
    void (*on_refused)(void *ud, const api_error *e);
} api_sink;

typedef struct api_req api_gen;

/* Starts a generation as the HTTP API does (model name check, chat template, tokenization,
 * context checks, stop strings, submission to the scheduler, metrics). p must have passed
 * api_gen_params_check and carry no tools / chat_template_kwargs / reasoning_effort; the request copies
 * what it keeps of p (the caller still frees p; with sink->on_refused all of p's contents move,
 * p->messages is copied). A sink's generation is one choice: p->n is not read.
 * Returns the handle, or NULL with e set (e->status as the HTTP API would answer). */
api_gen *api_server_generate(api_server *a, api_gen_params *p, const api_sink *sink, api_error *e);
/* Cancels a generation. detach: the sink is never called again (its client left); else the
 * sink gets its final call (error, cancelled = true) once the scheduler is done (or, while the
 * prompt is being made, once it is). */
void api_server_gen_cancel(api_gen *g, bool detach);
/* Tokenizes a prompt (add_special: BOS etc.) or chat messages (a checked cJSON array; add_gen:
 * with the template's generation prompt; cont: ending inside the last message, as
 * continue_final_message; chat: the tools, chat_template_kwargs and reasoning_effort the template
 * gets, as a chat request's, NULL for none) as /tokenize does; *ids malloc'd, caller frees. */
int api_server_tokenize(api_server *a, const char *text, const cJSON *messages, bool add_special, bool add_gen,
                        bool cont, const api_gen_params *chat, int32_t **ids, int32_t *n, api_error *e);
/* Wrong-key attempts: at most cfg.auth_max_fails (default API_AUTH_MAX_FAILS) from one client
 * address (the peer without its port) within API_AUTH_WINDOW_S seconds; after that every request
 * needing the key from that address is refused (429) until the window ends, whatever key it
 * carries. Addresses are tracked in API_AUTH_SLOTS slots (the oldest is reused). */
#define API_AUTH_MAX_FAILS 10
#define API_AUTH_WINDOW_S 10
#define API_AUTH_SLOTS 256
/* Checks key for a request from peer ("addr:port"): 0 allowed (or no key configured), 401 wrong
 * or missing key (counted), 429 this address has failed too often (*retry_after_s: seconds
 * until it may try again). */
int api_server_auth(api_server *a, const char *peer, const char *key, int *retry_after_s);
/* Tokenizes as api_server_tokenize, on the prep thread (in arrival order with the other
 * requests): done(ud, ids, n, e) runs later on the loop thread, e NULL on success (ids valid
 * during the call) or the error. text and messages are copied. The handle is valid until done
 * runs; api_server_tokenize_detach before that means done is never called (its client left). */
typedef struct api_tok_job api_tok_job;
api_tok_job *api_server_tokenize_async(api_server *a, const char *text, const cJSON *messages, bool add_special,
                                       void (*done)(void *ud, const int32_t *ids, int32_t n, const api_error *e),
                                       void *ud);
void api_server_tokenize_detach(api_tok_job *j);
/* The request's key matches the server's (constant time; true when the server has none). */
bool api_server_key_ok(const api_server *a, const char *key);
bool api_server_auth_required(const api_server *a);
/* The model's first name (the one answers carry); all of them (*names, borrowed), their count */
const char *api_server_model_name(const api_server *a);
int api_server_model_names(const api_server *a, const char *const **names);
/* The context served (positions), 0 until it is known: until the workers have taken their cache
 * pools and the scheduler runs (api_server_set_sched) */
int32_t api_server_max_context(const api_server *a);
/* Whether the server takes new generations: false (why says so) while it drains, while the
 * workers load, and while the worker group is down. Every health answer (HTTP /health, the
 * gRPC Health and grpc.health.v1 services, /metrics' mlaserve_healthy) reads this. */
bool api_server_healthy(api_server *a, char *why, size_t cap);

#endif
