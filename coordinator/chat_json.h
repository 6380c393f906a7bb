/* chat_json: text for the JSON of the API's answers, a NUL byte kept.
 *
 * cJSON takes C strings, which end at a NUL byte, while generated text (a byte-level vocabulary's
 * token for byte 0) may hold one. Text put into a cJSON document carries NUL as CHAT_JSON_NUL, a
 * byte valid UTF-8 never holds, and chat_json_print writes it as \u0000. The API's answers
 * (coordinator/api_server.c, through api_json_text) and the GLM calls' argument text
 * (coordinator/chat_toolcall.c) are built so.
 *
 * Ownership: every result is malloc'd; the caller frees it. */
#ifndef CHAT_JSON_H
#define CHAT_JSON_H

#include <stddef.h>

#include <cjson/cJSON.h>

#define CHAT_JSON_NUL '\xFF'

/* A NUL-terminated copy of s[0, n) for cJSON: each NUL byte as CHAT_JSON_NUL, and a 0xFF byte of s
 * (never valid UTF-8) as U+FFFD, so that the marker stands for NUL alone. */
char *chat_json_str(const char *s, size_t n);

/* cJSON_PrintUnformatted of j with each CHAT_JSON_NUL written as \u0000. */
char *chat_json_print(const cJSON *j);

#endif
