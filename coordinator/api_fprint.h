/* api_fprint: fingerprints of Messages requests for Anthropic's cache diagnostics. A request that
 * carries `diagnostics` leaves one under its answer's id; a later request that names that id
 * (diagnostics.previous_message_id) is compared with it: where its prompt first leaves the earlier
 * one (the tools, the system prompt, or an earlier message), and about how many of the earlier
 * prompt's tokens lie from there on (what the prefix cache could not reuse). A fingerprint holds
 * hashes and byte counts of the request's chat translation (so a Claude Code billing line skipped
 * there counts as no change), never its text. The model is not in it: a server serves one, under
 * any of its names (so "model_changed" is never the answer).
 *
 * Ownership: api_fp_make's result is the caller's until api_fp_store_put takes it; the store
 * owns what it holds and frees the oldest beyond its capacity. api_fp_make is a pure function (the
 * prep thread makes a request's); a store belongs to one thread (the API loop). */
#ifndef API_FPRINT_H
#define API_FPRINT_H

#include <cjson/cJSON.h>
#include <stdint.h>

typedef struct api_fp api_fp;
typedef struct api_fp_store api_fp_store;

/* the fingerprints a server keeps: those of the last API_FP_KEEP requests that asked for
 * diagnostics (an id older than that is "previous_message_not_found") */
#define API_FP_KEEP 1024

/* The fingerprint of a chat translation (members tools, messages with the system first) whose
 * prompt is prompt_tokens tokens; the caller's */
api_fp *api_fp_make(const cJSON *chat, int32_t prompt_tokens);
void api_fp_free(api_fp *f);

/* The first place where cur leaves prev's prefix, in the order the prompt is cached: the tools,
 * the system prompt, then the messages one by one (cur may go on past prev's last: that is the
 * same prefix). Past SAME, *missed is an estimate of prev's prompt tokens from that place on (its
 * tokens shared out by bytes); 0 for SAME. */
typedef enum { API_FP_SAME, API_FP_TOOLS, API_FP_SYSTEM, API_FP_MESSAGES } api_fp_change;
api_fp_change api_fp_compare(const api_fp *prev, const api_fp *cur, int32_t *missed);
/* the cache_miss_reason type of a change: "tools_changed", ... (SAME: NULL) */
const char *api_fp_change_name(api_fp_change c);

/* The last cap fingerprints put, by id (at most 63 bytes: a longer id is never found) */
api_fp_store *api_fp_store_new(int cap);
void api_fp_store_free(api_fp_store *s);
/* takes f; an id put again replaces the fingerprint it had */
void api_fp_store_put(api_fp_store *s, const char *id, api_fp *f);
/* the fingerprint put under id, or NULL (never put, or gone as the oldest) */
const api_fp *api_fp_store_get(const api_fp_store *s, const char *id);

#endif
