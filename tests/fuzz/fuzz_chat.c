/* libFuzzer target: the chat-template interpreter with the template text as input. Parses and
 * renders a fixed conversation (with a tool call) through the jinja layer and through chat_tmpl
 * (with its built-in fallback). Any status is fine; crashes, leaks, UB and hangs are not. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/chat.h"
#include "coordinator/chat_jinja.h"

static cJSON *vars;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!vars)
        vars = cJSON_Parse(
            "{\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"hi \\u00e9\"},"
            "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"function\",\"function\":"
            "{\"name\":\"f\",\"arguments\":{\"a\":1,\"b\":[true,null,2.5]}}}]},{\"role\":\"tool\",\"content\":\"r\"}],"
            "\"add_generation_prompt\":true,\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"tools\":[{\"name\":\"f\"}]}");
    mla_err err;
    jinja_tmpl *t = NULL;
    if (jinja_parse(&t, (const char *)data, size, &err) == JINJA_OK) {
        char *out = NULL;
        size_t ol;
        if (jinja_render(t, vars, &out, &ol, &err) == JINJA_OK) {
            if (strlen(out) > ol) abort(); /* NUL-terminated at ol (embedded NULs allowed) */
            free(out);
        }
        jinja_free(t);
    }
    chat_tmpl *ct = NULL;
    if (chat_tmpl_new(&ct, (const char *)data, size, CHAT_FAMILY_GLM, "<s>", "</s>", &err) == MLA_OK) {
        chat_msg m[2] = {{"user", "q"}, {"assistant", "a"}};
        char *out = NULL;
        if (chat_tmpl_apply(ct, m, 2, true, NULL, &out, NULL, NULL, &err) == MLA_OK) free(out);
        chat_tmpl_free(ct);
    }
    return 0;
}
