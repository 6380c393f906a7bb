/* api_messages (prefix api_msg_): Anthropic's Messages API (POST /v1/messages) over the chat path,
 * for clients that speak it (Claude Code and the Anthropic SDKs).
 *
 * A request is translated into a chat completions body (api_msg_parse): system a system message
 * first; a user turn's tool_result blocks tool messages (before its text, as the API orders
 * them), its text blocks the user's message; an assistant turn's thinking block its
 * reasoning_content, its text blocks its content, its tool_use blocks its tool calls (input
 * printed as the arguments); a last assistant turn the prefix the answer goes on from
 * (continue_final_message); tools the chat form (input_schema the parameters); tool_choice
 * auto / any / tool / none as chat's auto / required / named / none (disable_parallel_tool_use:
 * parallel_tool_calls false); max_tokens, stop_sequences, temperature, top_p, top_k and
 * metadata.user_id the chat members; thinking enabled / disabled in opts, which the server turns
 * into the template's own switch; context_management only where its edits clear nothing. Every
 * other member is refused by name.
 *
 * The answer's items (api_responses.h, opts.messages) are its content blocks: thinking, text,
 * tool_use, streamed as content_block_start / _delta / _stop between the server's message_start
 * and message_delta / message_stop.
 *
 * Ownership: api_msg_parse returns a document the caller deletes. Pure functions (no I/O). */
#ifndef API_MESSAGES_H
#define API_MESSAGES_H

#include <cjson/cJSON.h>

#include "coordinator/api_params.h"
#include "coordinator/api_responses.h"

/* Translates a Messages request body into *chat (a chat completions body) and *opts (messages
 * set, thinking). MLA_ERR with e set (400 naming the member) when the body is not one. */
int api_msg_parse(const cJSON *body, cJSON **chat, api_rsp_opts *opts, api_error *e);

/* An error of the chat parser on a translated body, named as the Messages request names it
 * (max_completion_tokens -> max_tokens, stop -> stop_sequences, ...). */
void api_msg_error_names(api_error *e);

/* A message's usage: input_tokens the prompt's tokens not read from the prefix cache,
 * cache_read_input_tokens those, cache_creation_input_tokens 0, output_tokens (usage NULL: zeros) */
cJSON *api_msg_usage(const api_rsp_usage *usage);

/* The message object of an answer: its blocks (api_rsp_blocks), stop_reason ("end_turn",
 * "max_tokens", "stop_sequence" with stop_sequence, "tool_use"), usage (input_tokens the prompt's
 * tokens not read from the prefix cache, cache_read_input_tokens those, output_tokens), and where
 * the request asked for cache diagnostics (diag NULL or diag->diagnostics 0: not asked) their
 * answer: null where there is no earlier message or the prompt goes on from it, else
 * {"cache_miss_reason": {"type": diag->miss_reason, "cache_missed_input_tokens": n}} (the count
 * for the *_changed types). o NULL: the message as it starts (no content, no stop_reason). */
cJSON *api_msg_object(const api_rsp_out *o, const char *id, const char *model, const char *stop_reason,
                      const char *stop_sequence, const api_rsp_usage *usage, const api_rsp_opts *diag);

#endif
