/* coordinator/api_messages.c's tool search and chat_normalize's billing line, as text: a
 * tool_reference reads as its tool's definition the first time and as its name later, a deferred
 * tool no reference brought in leaves the chat's tools, every tool deferred or too many references
 * is a 400; a system message reads past Claude Code's billing line, a message of that line alone
 * goes, a user message keeps it. (tests/serve/test_messages.py checks the same requests' token
 * counts through the server.) */
#include <stdio.h>
#include <string.h>

#include "api_fprint.h"
#include "api_messages.h"
#include "api_params.h"
#include "chat.h"
#include "mla_test.h"

static const char *const k_tools =
    "[{\"name\":\"ToolSearch\",\"description\":\"Finds tools\",\"input_schema\":{\"type\":\"object\"}},"
    "{\"name\":\"get_weather\",\"description\":\"W\",\"input_schema\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\"}}},\"defer_loading\":true},"
    "{\"name\":\"unused\",\"input_schema\":{\"type\":\"object\"},\"defer_loading\":true}]";

/* a Messages body: the tools above (or tools), then a search of turns: each of n_found tool results
 * holds refs (a JSON list of blocks) */
static cJSON *body_of(const char *tools, const char *refs, int n_found) {
    const size_t cap = 256 + strlen(tools) + (size_t)n_found * (strlen(refs) + 320);
    char *buf = malloc(cap);
    REQUIRE(buf != NULL);
    int o = snprintf(buf, cap, "{\"model\":\"m\",\"max_tokens\":8,\"tools\":%s,\"messages\":[", tools);
    for (int i = 0; i < n_found; i++)
        o += snprintf(buf + o, cap - (size_t)o,
                      "{\"role\":\"user\",\"content\":\"q%d\"},{\"role\":\"assistant\",\"content\":[{\"type\":"
                      "\"tool_use\",\"id\":\"t%d\",\"name\":\"ToolSearch\",\"input\":{}}]},{\"role\":\"user\","
                      "\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t%d\",\"content\":%s}]},",
                      i, i, i, refs);
    snprintf(buf + o, cap - (size_t)o, "{\"role\":\"user\",\"content\":\"go\"}]}");
    cJSON *b = cJSON_Parse(buf);
    free(buf);
    REQUIRE(b != NULL);
    return b;
}

/* message i's content of chat c ("" where none) */
static const char *content_at(const cJSON *c, int i) {
    const cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(c, "messages"), i);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(m, "content");
    return cJSON_IsString(t) ? t->valuestring : "";
}

static void test_reference(void) {
    const char *refs = "[{\"type\":\"tool_reference\",\"tool_name\":\"get_weather\"},{\"type\":\"text\","
                       "\"text\":\"1 found\"}]";
    cJSON *b = body_of(k_tools, refs, 2), *chat = NULL;
    api_rsp_opts o;
    api_error e = {0};
    REQUIRE(api_msg_parse(b, &chat, &o, &e) == MLA_OK);
    /* q0, the call, its result; q1, the call, its result; go */
    const char *first = content_at(chat, 2), *later = content_at(chat, 5);
    CHECKF(!strcmp(first, "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"W\","
                          "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}\n"
                          "1 found"),
           "first reference: %s", first);
    CHECKF(!strcmp(later, "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}\n1 found"),
           "later reference: %s", later);
    /* the chat's tools: the listed one and the one brought in (still marked), not the other */
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(chat, "tools");
    CHECK(cJSON_GetArraySize(tl) == 2);
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(tl, 1), "function");
    CHECK(!strcmp(cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring, "get_weather") &&
          cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fn, "defer_loading")));
    /* the chat parses, and the fingerprint of its tools is that of the listed one alone */
    api_gen_params p;
    CHECK(api_gen_params_parse(&p, API_CHAT, chat, &e) == MLA_OK);
    api_gen_params_free(&p);
    cJSON *listed = cJSON_Duplicate(chat, 1);
    cJSON_DeleteItemFromArray(cJSON_GetObjectItemCaseSensitive(listed, "tools"), 1);
    api_fp *fa = api_fp_make(chat, 100), *fb = api_fp_make(listed, 100);
    int32_t missed = -1;
    CHECK(api_fp_compare(fa, fb, &missed) == API_FP_SAME);
    api_fp_free(fa);
    api_fp_free(fb);
    cJSON_Delete(listed);
    cJSON_Delete(chat);
    cJSON_Delete(b);

    /* turns of one role in a row, each with a reference: read as one turn (its blocks after the turn
     * they came from are freed), the first reference in full */
    b = cJSON_Parse("{\"model\":\"m\",\"max_tokens\":8,\"tools\":[{\"name\":\"S\",\"input_schema\":{}},"
                    "{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"},\"defer_loading\":true}],\"messages\":["
                    "{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":[{\"type\":"
                    "\"tool_use\",\"id\":\"a\",\"name\":\"S\",\"input\":{}},{\"type\":\"tool_use\",\"id\":\"b\","
                    "\"name\":\"S\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
                    "\"tool_use_id\":\"a\",\"content\":[{\"type\":\"tool_reference\",\"tool_name\":\"f\"}]}]},"
                    "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"b\",\"content\":"
                    "[{\"type\":\"tool_reference\",\"tool_name\":\"f\"}]}]}]}");
    REQUIRE(b != NULL);
    REQUIRE(api_msg_parse(b, &chat, &o, &e) == MLA_OK);
    CHECKF(!strcmp(content_at(chat, 2), "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                                        "{\"type\":\"object\"}}}") &&
               !strcmp(content_at(chat, 3), "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}"),
           "joined turns: %s | %s", content_at(chat, 2), content_at(chat, 3));
    cJSON_Delete(chat);
    cJSON_Delete(b);
}

static void test_refused(void) {
    api_rsp_opts o;
    api_error e = {0};
    cJSON *chat = NULL;
    /* a reference to no tool of the request */
    cJSON *b = body_of(k_tools, "[{\"type\":\"tool_reference\",\"tool_name\":\"nope\"}]", 1);
    CHECK(api_msg_parse(b, &chat, &o, &e) == MLA_ERR && e.status == 400 && strstr(e.message, "names no tool"));
    cJSON_Delete(b);
    /* more references than API_MAX_TOOLS_ALL in a request */
    char refs[64 * 40];
    int n = snprintf(refs, sizeof refs, "[");
    for (int i = 0; i < 33; i++)
        n += snprintf(refs + n, sizeof refs - (size_t)n, "%s{\"type\":\"tool_reference\",\"tool_name\":"
                                                         "\"get_weather\"}", i ? "," : "");
    snprintf(refs + n, sizeof refs - (size_t)n, "]");
    b = body_of(k_tools, refs, API_MAX_TOOLS_ALL / 33 + 1);
    e = (api_error){0};
    CHECKF(api_msg_parse(b, &chat, &o, &e) == MLA_ERR && strstr(e.message, "tool_reference blocks"), "%s",
           e.message);
    cJSON_Delete(b);
    /* a malformed tools list is named as such, before the references that would look into it */
    b = body_of("{\"name\":\"get_weather\"}", "[{\"type\":\"tool_reference\",\"tool_name\":\"get_weather\"}]", 1);
    e = (api_error){0};
    CHECK(api_msg_parse(b, &chat, &o, &e) == MLA_ERR && !strcmp(e.param, "tools"));
    cJSON_Delete(b);
    /* every tool deferred (no listed tool shows the call format): Messages, and the chat parse */
    b = body_of("[{\"name\":\"get_weather\",\"input_schema\":{},\"defer_loading\":true}]",
                "[{\"type\":\"tool_reference\",\"tool_name\":\"get_weather\"}]", 1);
    e = (api_error){0};
    CHECK(api_msg_parse(b, &chat, &o, &e) == MLA_ERR && !strcmp(e.param, "tools") && strstr(e.message, "at least one"));
    cJSON_Delete(b);
    b = cJSON_Parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":[{\"type\":"
                    "\"function\",\"function\":{\"name\":\"f\",\"defer_loading\":true}}]}");
    REQUIRE(b != NULL);
    api_gen_params p;
    e = (api_error){0};
    CHECK(api_gen_params_parse(&p, API_CHAT, b, &e) == MLA_ERR && strstr(e.message, "at least one"));
    api_gen_params_free(&p);
    cJSON_Delete(b);
}

static void test_billing(void) {
    cJSON *m = cJSON_Parse("[{\"role\":\"developer\",\"content\":\"x-anthropic-billing-header: cc_version=1; "
                           "cch=a;\\nBe brief.\"},{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":"
                           "\"x-anthropic-billing-header: cch=b;\"}]},{\"role\":\"user\",\"content\":"
                           "\"x-anthropic-billing-header: cch=c;\\nhi\"},{\"role\":\"system\",\"content\":"
                           "\"Note.\\nx-anthropic-billing-header: cch=d;\"}]");
    REQUIRE(m != NULL);
    cJSON *out = NULL;
    mla_err err = {{0}};
    REQUIRE(chat_normalize(m, false, &out, &err) == MLA_OK);
    cJSON *w = cJSON_CreateObject();
    cJSON_AddItemToObject(w, "messages", out);
    CHECK(cJSON_GetArraySize(out) == 3);
    CHECKF(!strcmp(content_at(w, 0), "Be brief."), "%s", content_at(w, 0));
    CHECK(!strcmp(content_at(w, 1), "x-anthropic-billing-header: cch=c;\nhi"));
    CHECK(!strcmp(content_at(w, 2), "Note.\nx-anthropic-billing-header: cch=d;"));
    cJSON_Delete(w);
    cJSON_Delete(m);
    CHECK(!strcmp(chat_past_billing_header("x-anthropic-billing-header: a"), ""));
    CHECK(!strcmp(chat_past_billing_header("plain"), "plain"));
}

int main(void) {
    test_reference();
    test_refused();
    test_billing();
    return mla_test_finish();
}
