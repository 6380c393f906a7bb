/* api_params: the OpenAI request bodies (completions, chat completions, tokenize, detokenize)
 * parsed and validated into plain structs. Pure functions (no I/O, no tokenizer), shared by the
 * server and the fuzz target.
 *
 * Ownership: api_gen_params_parse fills a struct the caller frees with api_gen_params_free;
 * it holds its own copies of every string and array (the cJSON document may be deleted
 * afterwards, except for .messages, which points into it). */
#ifndef API_PARAMS_H
#define API_PARAMS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "coordinator/api_constrain.h"
#include "coordinator/chat_reasoning.h"
#include "coordinator/sched_batch.h"

#define API_MAX_STOP 16
#define API_MAX_STOP_LEN 256
#define API_MAX_USER_LEN 256
/* choices a request may ask for (OpenAI's n; each is a sequence of its own in the scheduler) */
#define API_MAX_N 128 /* also the most choices of a request: prompts x n */

/* An API error: status, message, param (may be empty), code (may be empty). Its type is the
 * status's (http_error_type), in the request's form: OpenAI's or Anthropic's. */
typedef struct api_error {
    int status;
    char message[1024];
    char param[48];
    char code[48];
    /* a context_length_exceeded error's figures, for other APIs' wording of it: the context, the
     * prompt's tokens, the completion's asked for (0: the prompt alone left no room) */
    int32_t ctx_limit, ctx_prompt, ctx_completion;
} api_error;

/* Fills e and returns MLA_ERR. */
int api_error_set(api_error *e, int status, const char *param, const char *code, const char *fmt,
                  ...) __attribute__((format(printf, 5, 6)));

/* api_error_set for a mistake of the request's: 400 (invalid_request_error) naming param. Returns
 * MLA_ERR. */
int api_bad(api_error *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Whether k is one of the NULL-terminated list l */
bool api_in_list(const char *const *l, const char *k);
/* Each from in s (a NUL-terminated string in cap bytes) as to, as far as the result fits */
void api_replace_all(char *s, size_t cap, const char *from, const char *to);

/* s[0..n) percent-decoded (as a URL path: '+' kept; a '%' not before two hex digits kept as it
 * is), NUL-terminated; its length (NULs decoded included) in *len; the caller frees it */
char *api_pct_decode(const char *s, size_t n, size_t *len);
/* The value of member key of a URL query ("a=1&b=x", without the '?'), percent-decoded with '+'
 * a blank ("" for a member without '='), or NULL where the query has none; the first where it
 * has several. Its length in *len (more than its strlen where it holds a decoded NUL). The
 * caller frees it. */
char *api_query_value(const char *query, const char *key, size_t *len);

/* Text pieces joined a line apart (none before the first, nor after text that is still empty), as
 * the chat path joins text parts; s NULL until a piece is added, then the caller's to free */
typedef struct api_join {
    char *s;
    size_t len, cap;
    bool any; /* a piece was added (maybe empty) */
} api_join;
void api_join_add(api_join *j, const char *t);

/* What the translations of other APIs' requests into a chat body share (api_responses.c,
 * api_messages.c): a message {"role", "content"} appended to msgs (content NULL: none), returned
 * for more members; a tool call appended to a message's calls */
cJSON *api_chat_msg(cJSON *msgs, const char *role, const char *content);
void api_chat_call(cJSON *calls, const char *id, const char *name, const char *arguments);

/* Ids a request defines (its calls') and refers to (its results', each with its place): every
 * reference must name a definition. The strings are the request's (not copied). */
typedef struct api_refs {
    const char **defs, **refs;
    int *ref_at;
    int n_defs, cap_defs, n_refs, cap_refs;
} api_refs;
void api_refs_def(api_refs *r, const char *id);
void api_refs_ref(api_refs *r, const char *id, int at);
/* The index of the first reference that names no definition, or -1 (sorted once: n log n) */
int api_refs_missing(api_refs *r);
void api_refs_free(api_refs *r);
/* An error of the chat parser named as another API names the members: each text[i][0] of its
 * message as text[i][1] (n_text pairs, longest first), its param as names[k][1] where it is
 * names[k][0]; with prefix put before the message where the param was names[0][0] (the chat
 * messages, whose index is not the request's) */
void api_error_rename(api_error *e, const char *const (*text)[2], size_t n_text, const char *const (*names)[2],
                      size_t n_names, const char *prefix);

enum api_kind { API_COMPLETIONS = 0, API_CHAT = 1 };

/* tool_choice */
enum api_tool_choice { API_TOOLS_AUTO = 0, API_TOOLS_NONE, API_TOOLS_REQUIRED, API_TOOLS_NAMED };
#define API_MAX_TOOLS 128       /* the tools a prompt lists */
#define API_MAX_TOOLS_ALL 1024  /* with those of function.defer_loading true, which it does not */
#define API_MAX_TOOL_NAME 256

typedef struct api_gen_params {
    enum api_kind kind;
    char *model;          /* NULL when absent */
    char *user;           /* the end user's id, up to API_MAX_USER_LEN bytes without control
                             characters, for the request's log line; NULL when absent */
    /* completions: exactly one of prompt_text / prompt_ids */
    char *prompt_text;
    int32_t *prompt_ids;
    int32_t n_prompt_ids;
    /* completions given a list of several prompts (strings, or token-id lists; one kind): those
     * after the first (which is in prompt_text / prompt_ids), each with n choices of its own */
    int32_t n_more;
    char **more_text;    /* [n_more] where the prompts are strings, else NULL */
    int32_t **more_ids;  /* [n_more] where they are token-id lists, else NULL */
    int32_t *more_n_ids;
    /* chat */
    const cJSON *messages; /* points into the request document */
    bool add_generation_prompt;
    const cJSON *tools;                /* points into the request document; NULL: none */
    enum api_tool_choice tool_choice;
    char *tool_choice_name;            /* API_TOOLS_NAMED: the function */
    bool one_call;                     /* parallel_tool_calls: false: the first call alone is returned */
    const char *max_tokens_param;      /* the field max_tokens came from, for errors (a literal) */
    const cJSON *chat_template_kwargs; /* points into the request document; NULL: none */
    char *reasoning_effort;            /* NULL: absent */
    bool include_reasoning;            /* the answer carries the reasoning (vLLM's include_reasoning) */
    enum reasoning_prompt prompt_reasoning; /* set by the server: where the rendered prompt leaves the reasoning */
    sched_sampling sampling;
    int32_t n;            /* choices (OpenAI's n), 1 to API_MAX_N; 0 (a struct filled elsewhere) is 1 */
    int32_t truncate_prompt; /* truncate_prompt_tokens: keep the prompt's last N tokens; -1: the context
                                less one; 0: none */
    int32_t max_tokens;   /* -1: absent (use what the context leaves) */
    int32_t min_tokens;   /* vLLM's: no stop token or stop string ends the answer before this many tokens; 0: none */
    char *stop[API_MAX_STOP];
    int n_stop;
    int32_t *stop_ids;
    int32_t n_stop_ids;
    bool ignore_eos;
    bool skip_special_tokens;
    bool stream;
    bool include_usage;   /* stream_options.include_usage */
    bool continuous_usage; /* stream_options.continuous_usage_stats: the usage so far in every chunk */
    bool include_stop_str; /* include_stop_str_in_output: the answer ends after the stop string */
    bool logprobs;        /* return logprobs at all */
    int32_t top_logprobs; /* alternatives per token */
    bool echo;            /* completions: the text (and logprobs) start with the prompt's tokens */
    bool continue_final;  /* chat: the prompt ends inside the last (assistant) message's text */
    api_constrain constrain; /* response_format, grammar, logit_bias */
} api_gen_params;

/* Parses a completions (kind API_COMPLETIONS) or chat (API_CHAT) request body. On failure
 * returns MLA_ERR with e set (400 with the offending param). A member the server does not
 * honour is refused (400 naming it; docs/openai-params.md lists them all). */
int api_gen_params_parse(api_gen_params *p, enum api_kind kind, const cJSON *root, api_error *e);
/* The value rules of a filled api_gen_params (sampling ranges, max_tokens, logprobs, stop strings,
 * token ids, exactly one prompt), shared by the JSON parser above and the gRPC API
 * (coordinator/grpc_*). Returns MLA_ERR with e set (400 with the offending param). */
int api_gen_params_check(const api_gen_params *p, api_error *e);
void api_gen_params_free(api_gen_params *p);

/* /tokenize: {"prompt": str} or {"messages": [...]} (+ "add_special_tokens": bool).
 * /detokenize: {"tokens": [int]}. */
typedef struct api_tok_params {
    char *model;  /* NULL: any; else the served model's id, or the server answers 404 */
    char *prompt;
    const cJSON *messages;
    bool add_special;
    bool add_gen; /* messages: end with the template's generation prompt (add_generation_prompt) */
    bool continue_final; /* messages: end inside the last (assistant) message (continue_final_message) */
    api_gen_params chat; /* messages: what the template gets beside them (tools, tool_choice,
                          * chat_template_kwargs, reasoning_effort), as a chat request's */
    int32_t *tokens;
    int32_t n_tokens;
} api_tok_params;
int api_tokenize_params_parse(api_tok_params *p, const cJSON *root, api_error *e);
int api_detokenize_params_parse(api_tok_params *p, const cJSON *root, api_error *e);
void api_tok_params_free(api_tok_params *p);

/* Checks a chat "messages" array: objects with a string "role" and "content" a string, null or
 * an array of {"type":"text","text":str} parts. */
int api_messages_check(const cJSON *messages, api_error *e);

/* Valid UTF-8 copy of bytes, NUL-terminated, caller frees: each maximal subpart of an invalid
 * or cut-off sequence (its longest prefix that is valid so far, else one byte) becomes one
 * U+FFFD, as Python's errors="replace" decodes. */
char *api_utf8_sanitize(const char *s, size_t len, size_t *out_len);
/* api_utf8_sanitize for text that goes into a cJSON document the server prints with
 * chat_json_print: a NUL byte (which a C string would end at) as CHAT_JSON_NUL
 * (coordinator/chat_json.h), written back as \u0000. */
char *api_json_text(const char *s, size_t len, size_t *out_len);
/* The number of characters api_utf8_sanitize(s, len) gives. */
size_t api_utf8_chars(const char *s, size_t len);
/* pos, or where the character (or maximal subpart) that covers byte pos of s[0..len) starts when
 * pos is inside one: the character boundary at or before pos. */
size_t api_utf8_char_start(const char *s, size_t len, size_t pos);
/* The offset of the first byte of s that is not part of valid UTF-8 (a cut-off sequence at the
 * end included), or -1 when all of s is valid. */
long api_utf8_invalid_at(const char *s, size_t len);
/* Length of the longest prefix of s[0..len) that does not end inside an incomplete (but so far
 * valid) UTF-8 sequence. */
size_t api_utf8_complete_prefix(const char *s, size_t len);

#endif
