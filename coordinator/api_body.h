/* api_body: the body of an HTTP API request read as JSON, as strictly as RFC 8259 reads it and
 * no more loosely than the Python servers behind other APIs do: one JSON value and only
 * whitespace after it; UTF-8; no NUL character (raw or \u0000: cJSON's strings end there) and no
 * raw control character in a string; no \u escape of half a surrogate pair; numbers in JSON's
 * grammar (cJSON reads them with strtod, which also takes "01" and "1."); no member twice in one
 * object; nesting within cJSON's limit (CJSON_NESTING_LIMIT). Pure: no I/O; any thread (the
 * parser's own error pointer, which every thread's cJSON writes, is not read). Fuzzed by
 * tests/fuzz/fuzz_http.c, with the request parsing before it.
 *
 * Ownership: the document returned is the caller's (cJSON_Delete). */
#ifndef API_BODY_H
#define API_BODY_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "common/mla_err.h"

/* body [len] (not NUL-terminated) as a cJSON document, or NULL with err naming what is wrong
 * and at which byte ("the request body is not valid JSON (at byte 12)", "... has the member 'n'
 * twice in one object"). */
cJSON *api_body_parse(const char *body, size_t len, mla_err *err);

#endif
