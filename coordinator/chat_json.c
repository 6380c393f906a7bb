/* chat_json: see chat_json.h. */
#include "coordinator/chat_json.h"

#include <stdlib.h>
#include <string.h>

#include "common/mla_err.h"

char *chat_json_str(const char *s, size_t n) {
    size_t ff = 0, k = 0;
    for (size_t i = 0; i < n; i++) ff += s[i] == CHAT_JSON_NUL;
    char *o = mla_xmalloc(n + 2 * ff + 1);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == CHAT_JSON_NUL) {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
        } else {
            o[k++] = s[i] ? s[i] : CHAT_JSON_NUL;
        }
    }
    o[k] = 0;
    return o;
}

char *chat_json_print(const cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    MLA_ASSERT(s);
    size_t n = 0, k = 0;
    for (const char *p = s; *p; p++) n += *p == CHAT_JSON_NUL;
    if (!n) return s;
    char *o = mla_xmalloc(strlen(s) + 5 * n + 1);
    for (const char *p = s; *p; p++) {
        if (*p == CHAT_JSON_NUL) {
            memcpy(o + k, "\\u0000", 6);
            k += 6;
        } else {
            o[k++] = *p;
        }
    }
    o[k] = 0;
    free(s);
    return o;
}
