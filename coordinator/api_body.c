/* api_body: a request body read as the HTTP API takes it. See api_body.h. */
#include "coordinator/api_body.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/api_params.h"

/* The offset of the first character inside a JSON string of b that a request may not hold, or
 * -1: a NUL (*nul set), raw or escaped as \u0000, since cJSON ends its strings there and what
 * follows would be lost unseen; or another raw control character, which JSON wants escaped
 * (RFC 8259 7) and Python's json, behind other servers, refuses. Outside strings the parser has
 * already refused such bytes. */
static long json_str_bad_at(const char *b, size_t n, bool *nul) {
    bool in = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)b[i];
        if (!in) {
            in = ch == '"';
        } else if (ch == '"') {
            in = false;
        } else if (ch == '\\') {
            if (i + 6 <= n && !memcmp(b + i + 1, "u0000", 5)) {
                *nul = true;
                return (long)i;
            }
            i++; /* the escaped character */
        } else if (ch < 0x20) {
            *nul = ch == 0;
            return (long)i;
        }
    }
    return -1;
}

/* The offset of the first number of a body cJSON took that JSON's grammar (RFC 8259 6) does not:
 * -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, or -1. cJSON reads numbers with strtod, which
 * also takes "01", "1." and "00.5": a strict client or proxy would read such a body otherwise. */
static long json_num_bad_at(const char *b, size_t n) {
    bool in = false;
    for (size_t i = 0; i < n; i++) {
        const char ch = b[i];
        if (in) {
            if (ch == '\\') i++;
            else if (ch == '"') in = false;
            continue;
        }
        if (ch == '"') {
            in = true;
            continue;
        }
        if (ch != '-' && (ch < '0' || ch > '9')) continue;
        const size_t at = i;
        if (b[i] == '-') i++;
        if (i >= n || b[i] < '0' || b[i] > '9') return (long)at;
        if (b[i] == '0') i++;
        else
            while (i < n && b[i] >= '0' && b[i] <= '9') i++;
        if (i < n && b[i] == '.') {
            i++;
            if (i >= n || b[i] < '0' || b[i] > '9') return (long)at;
            while (i < n && b[i] >= '0' && b[i] <= '9') i++;
        }
        if (i < n && (b[i] == 'e' || b[i] == 'E')) {
            i++;
            if (i < n && (b[i] == '+' || b[i] == '-')) i++;
            if (i >= n || b[i] < '0' || b[i] > '9') return (long)at;
            while (i < n && b[i] >= '0' && b[i] <= '9') i++;
        }
        /* what cJSON read as part of the number ends here */
        if (i < n && ((b[i] >= '0' && b[i] <= '9') || b[i] == '.' || b[i] == 'e' || b[i] == 'E' || b[i] == '+' ||
                      b[i] == '-'))
            return (long)at;
        i--; /* the loop's i++ */
    }
    return -1;
}

/* The byte at which the arrays and objects of a body (valid JSON or not) open a level deeper
 * than cJSON parses (CJSON_NESTING_LIMIT), or -1: tells a body refused for its nesting from
 * one that is not JSON. Brackets inside strings do not count. */
static long json_too_deep_at(const char *b, size_t n) {
    bool in = false;
    long depth = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = b[i];
        if (in) {
            if (ch == '\\') i++;
            else if (ch == '"') in = false;
        } else if (ch == '"') {
            in = true;
        } else if (ch == '[' || ch == '{') {
            if (++depth > CJSON_NESTING_LIMIT) return (long)i;
        } else if (ch == ']' || ch == '}') {
            depth--;
        }
    }
    return -1;
}

/* The value of a \u escape at b (4 hex digits), or -1 */
static long json_u4(const char *b, size_t n) {
    if (n < 4) return -1;
    char h[5] = {b[0], b[1], b[2], b[3], 0};
    for (int k = 0; k < 4; k++)
        if (!isxdigit((unsigned char)h[k])) return -1;
    return strtol(h, NULL, 16);
}

/* The byte at which a string of a body (valid JSON or not) has a \u escape of a UTF-16 surrogate
 * without its pair (a high one not followed by a low one, or a low one alone), or -1: such a
 * string has no UTF-8 form (cJSON refuses it; Python's json takes it, and its encoder then fails). */
static long json_lone_surrogate_at(const char *b, size_t n) {
    bool in = false;
    for (size_t i = 0; i < n; i++) {
        const char ch = b[i];
        if (!in) {
            in = ch == '"';
        } else if (ch == '"') {
            in = false;
        } else if (ch == '\\' && i + 1 < n) {
            if (b[i + 1] != 'u') {
                i++;
                continue;
            }
            const long u = json_u4(b + i + 2, n - i - 2);
            if (u >= 0xdc00 && u <= 0xdfff) return (long)i;
            if (u >= 0xd800 && u <= 0xdbff) {
                const long lo = i + 8 < n && b[i + 6] == '\\' && b[i + 7] == 'u' ? json_u4(b + i + 8, n - i - 8) : -1;
                if (lo < 0xdc00 || lo > 0xdfff) return (long)i;
                i += 6; /* the pair's low half */
            }
            if (u >= 0) i += 5;
        }
    }
    return -1;
}

static int cmp_key(const void *x, const void *y) {
    return strcmp((*(const cJSON *const *)x)->string, (*(const cJSON *const *)y)->string);
}

/* The first member name that an object of j (at any depth) holds twice, or NULL. Sorted, not
 * compared pair by pair: an object may have a hundred thousand members within the body limit. */
static const char *json_dup_key(const cJSON *j) {
    if (!cJSON_IsObject(j) && !cJSON_IsArray(j)) return NULL;
    size_t n = 0;
    const cJSON *k;
    cJSON_ArrayForEach(k, j) n++;
    if (cJSON_IsObject(j) && n > 1) {
        const cJSON **v = mla_xmalloc(n * sizeof *v);
        size_t i = 0;
        cJSON_ArrayForEach(k, j) v[i++] = k;
        qsort(v, n, sizeof *v, cmp_key);
        const char *dup = NULL;
        for (i = 1; i < n && !dup; i++)
            if (!strcmp(v[i - 1]->string, v[i]->string)) dup = v[i]->string;
        free(v);
        if (dup) return dup;
    }
    cJSON_ArrayForEach(k, j) {
        const char *d = json_dup_key(k);
        if (d) return d;
    }
    return NULL;
}

/* err = the formatted message; frees j: NULL, for api_body_parse */
static cJSON *refuse(mla_err *err, cJSON *j, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static cJSON *refuse(mla_err *err, cJSON *j, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap); /* before j goes: the arguments may point into it */
    va_end(ap);
    cJSON_Delete(j);
    return NULL;
}

cJSON *api_body_parse(const char *body, size_t len, mla_err *err) {
    size_t k = 0;
    while (k < len && (body[k] == ' ' || body[k] == '\t' || body[k] == '\r' || body[k] == '\n')) k++;
    if (k == len) return refuse(err, NULL, "the request body is empty (a JSON object is expected)");
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!j) {
        long deep = json_too_deep_at(body, len);
        if (deep >= 0)
            return refuse(err, NULL,
                          "the request body nests arrays and objects deeper than the limit of %d levels "
                          "(at byte %ld)",
                          CJSON_NESTING_LIMIT, deep);
        long sur = json_lone_surrogate_at(body, len);
        if (sur >= 0)
            return refuse(err, NULL,
                          "the request body is not valid JSON: a \\u escape of half a UTF-16 surrogate pair "
                          "(a character no UTF-8 text holds) at byte %ld",
                          sur);
        /* where the parser stopped (end: cJSON's global error pointer is any thread's) */
        if (end && end >= body && end <= body + len)
            return refuse(err, NULL, "the request body is not valid JSON (at byte %ld)", (long)(end - body));
        return refuse(err, NULL, "the request body is not valid JSON");
    }
    /* one JSON value and nothing after it but whitespace */
    const char *stop = body + len;
    while (end && end < stop && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')) end++;
    if (!end || end != stop)
        return refuse(err, j, "the request body has data after its JSON value (at byte %zu)",
                      end ? (size_t)(end - body) : (size_t)0);
    /* JSON is UTF-8 (RFC 8259 8.1): other bytes would reach the tokenizer as they came */
    long bad = api_utf8_invalid_at(body, len);
    if (bad >= 0) return refuse(err, j, "the request body is not valid UTF-8 (byte %ld)", bad);
    bool nul = false;
    long at = json_str_bad_at(body, len, &nul);
    if (at >= 0 && nul)
        return refuse(err, j,
                      "the request body holds a NUL character (U+0000) at byte %ld; strings with NUL are not "
                      "supported",
                      at);
    if (at >= 0)
        return refuse(err, j, "the request body has a raw control character in a string (byte %ld); escape it",
                      at);
    long num = json_num_bad_at(body, len);
    if (num >= 0)
        return refuse(err, j, "the request body is not valid JSON: a number JSON does not allow (leading zeros, or "
                      "a '.' or exponent without digits) at byte %ld",
                      num);
    const char *dup = json_dup_key(j);
    if (dup)
        return refuse(err, j, "the request body has the member '%.*s' twice in one object",
                      (int)api_utf8_complete_prefix(dup, strnlen(dup, 60)), dup);
    return j;
}

