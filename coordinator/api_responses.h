/* api_responses (prefix api_rsp_): OpenAI's Responses API (POST /v1/responses) over the chat path.
 *
 * A request is translated into a chat completions body (api_rsp_parse): its input items become
 * messages (a function_call item an assistant turn's tool call, a function_call_output a tool
 * message, a reasoning item the next assistant turn's reasoning_content), instructions a system
 * message first, its flat function tools the chat form, text.format a response_format,
 * reasoning.effort reasoning_effort, max_output_tokens max_completion_tokens. Every other member
 * is refused by name, as the chat parser refuses its own (docs/openai-params.md). Nothing is
 * stored: store, background and previous_response_id are refused but for their stateless values;
 * a reasoning item's encrypted_content (API_RSP_SEAL) carries its text from one request to the next.
 *
 * The answer, parsed as a chat answer is (reasoning, content, tool calls), becomes output items
 * (api_rsp_out): a reasoning item, a message with one output_text part, a function_call item a
 * call, in the order the model wrote them. Streamed, each step of that is the Responses event
 * sequence (response.output_item.added, content_part.added, output_text.delta, ... done), and the
 * whole response object is the same items (api_rsp_object).
 *
 * Ownership: api_rsp_parse returns two documents the caller deletes; api_rsp_out_init / _free
 * pair, its items are its own copies; every cJSON an api_rsp_* function returns is the caller's.
 * Pure functions (no I/O): the loop thread or any other. */
#ifndef API_RESPONSES_H
#define API_RESPONSES_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coordinator/api_params.h"
#include "coordinator/chat_toolcall.h"

/* What a request asks of its answer's reasoning items beyond the chat parse */
typedef struct api_rsp_opts {
    bool summary;   /* reasoning.summary auto / concise / detailed: the reasoning whole as the one summary part */
    bool encrypted; /* include "reasoning.encrypted_content": the item carries its text sealed (API_RSP_SEAL) */
    bool messages;  /* the items are the content blocks of an Anthropic Messages answer (api_messages.h):
                     * thinking, text, tool_use, and their events */
    int thinking;   /* messages: thinking asked enabled (1), disabled (-1), or left to the model (0) */
    bool omit_thinking; /* messages: thinking.display "omitted": a thinking block's text only in its signature */
    bool eager_input;   /* messages: a tool's eager_input_streaming: tool_use input streamed as it is written
                         * (else whole, at the call's end, as the block's input) */
    int diagnostics;    /* messages: cache diagnostics not asked (0), asked with no earlier message (1), asked
                         * against an earlier message (2): api_msg_object */
    char prev_id[64];   /* diagnostics 2: that message's id ("" where longer: never found) */
    /* diagnostics 2, once compared (api_server, api_fprint.h): the cache_miss_reason's type, NULL
     * where the prompt goes on from the earlier one's; miss_tokens its cache_missed_input_tokens
     * (the *_changed types) */
    const char *miss_reason;
    int32_t miss_tokens;
} api_rsp_opts;

/* encrypted_content here: this prefix and the reasoning's text in base64. Opaque to the client and
 * taken back as that item's text, not secret (the same text is the item's content). */
#define API_RSP_SEAL "mlaserve-reasoning-1:"

/* The sealed form of text[0, n) (API_RSP_SEAL), and the text of a sealed string (NULL: not one
 * this server wrote); each the caller's */
char *api_rsp_seal(const char *text, size_t n);
char *api_rsp_unseal(const char *s);

/* Translates a Responses request body into *chat (a chat completions body), *echo (the members
 * its response object repeats: instructions, tools, tool_choice, text, reasoning, ..., with their
 * defaults) and *opts. MLA_ERR with e set (400 naming the member) when the body is not one. */
int api_rsp_parse(const cJSON *body, cJSON **chat, cJSON **echo, api_rsp_opts *opts, api_error *e);

/* An error of the chat parser on a translated body, named as the Responses request names it
 * (messages -> input, max_completion_tokens -> max_output_tokens, ...). */
void api_rsp_error_names(api_error *e);

/* What the chat parse of the answer so far gives (spans of the answer's text, or of the parse) */
typedef struct api_rsp_view {
    const char *reasoning; /* NULL: none (or hidden) */
    size_t reasoning_len;
    const char *content;
    size_t content_len;
    const toolcall *calls;
    int n_calls;
} api_rsp_view;

enum api_rsp_item_kind { API_RSP_REASONING, API_RSP_MESSAGE, API_RSP_CALL };

typedef struct api_rsp_item {
    enum api_rsp_item_kind kind;
    char id[96];
    char *text; /* the reasoning, the message's text or the call's arguments so far (sanitized UTF-8) */
    size_t len, cap;
    char *name, *call_id; /* a call's */
    int call;             /* a call's index in the view */
    bool whole;           /* a call's end was read (a call cut off is incomplete) */
    bool done;
    bool incomplete;      /* done, cut off (by max_output_tokens, or a call's end never written) */
} api_rsp_item;

typedef struct api_rsp_out {
    char resp_id[64];
    api_rsp_opts opts;
    api_rsp_item *items;
    int n_items, cap_items;
    int open;          /* the item still growing, or -1 */
    size_t sent_r, sent_c;
    int n_calls;       /* calls with an item */
    size_t sent_args[TOOLCALL_MAX_CALLS];
    int seq;           /* the next event's sequence_number */
    const cJSON *tools; /* the request's tools (api_rsp_out_tools; the caller's, alive while o is), or NULL */
} api_rsp_out;

/* Each event, with its type (and sequence_number, Responses) set (owned by the callee for the call only) */
typedef void (*api_rsp_emit)(void *ud, const char *type, const cJSON *event);

void api_rsp_out_init(api_rsp_out *o, const char *resp_id, const api_rsp_opts *opts); /* opts NULL: none */
void api_rsp_out_free(api_rsp_out *o);
/* The request's tools (its echo's, kept by the caller while o lives): a call of a namespace's
 * function, which the chat form names NAMESPACE__NAME (api_rsp_parse), goes out as a
 * function_call of that name and namespace */
void api_rsp_out_tools(api_rsp_out *o, const cJSON *tools);
/* What v adds to what the items hold: deltas into the open item, or a new item (the open one
 * done first). emit may be NULL (a whole response: the items alone). */
void api_rsp_out_update(api_rsp_out *o, const api_rsp_view *v, api_rsp_emit emit, void *ud);
/* The end of the answer: the open item done ("completed", or "incomplete" where incomplete);
 * an answer with no item gets an empty message. */
void api_rsp_out_finish(api_rsp_out *o, bool incomplete, api_rsp_emit emit, void *ud);
/* A new event of the stream: {"type": type, "sequence_number": ...} */
cJSON *api_rsp_event(api_rsp_out *o, const char *type);

/* The items as an Anthropic Messages answer's content blocks (opts.messages): thinking, text,
 * tool_use (input: the arguments parsed, {} where they are not a whole object) */
cJSON *api_rsp_blocks(const api_rsp_out *o);

typedef struct api_rsp_usage {
    int32_t input, cached, output, reasoning;
} api_rsp_usage;

/* The response object: status "in_progress", "completed", "incomplete" (incomplete_reason, e.g.
 * "max_output_tokens") or "failed" (err); usage NULL: none yet. */
cJSON *api_rsp_object(const api_rsp_out *o, const cJSON *echo, const char *model, long long created,
                      const char *status, const char *incomplete_reason, const api_rsp_usage *usage,
                      const api_error *err);

#endif
