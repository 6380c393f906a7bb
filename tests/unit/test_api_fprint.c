/* coordinator/api_fprint.c: where a prompt first leaves an earlier one (tools, system, messages),
 * the earlier prompt's tokens from there on, and the store's bound (the oldest goes; an id too
 * long to keep is never found). */
#include <stdio.h>
#include <string.h>

#include "api_fprint.h"
#include "mla_test.h"

/* a chat translation: tools (NULL: none), system (NULL: none), then the user / assistant texts */
static cJSON *chat_of(const char *tools, const char *sys, const char *const *texts, int n) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "model", "m");
    if (tools) cJSON_AddItemToObject(c, "tools", cJSON_Parse(tools));
    cJSON *ms = cJSON_AddArrayToObject(c, "messages");
    if (sys) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", sys);
        cJSON_AddItemToArray(ms, m);
    }
    for (int i = 0; i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", i % 2 ? "assistant" : "user");
        cJSON_AddStringToObject(m, "content", texts[i]);
        cJSON_AddItemToArray(ms, m);
    }
    return c;
}

static api_fp *fp_of(const char *tools, const char *sys, const char *const *texts, int n, int32_t tokens) {
    cJSON *c = chat_of(tools, sys, texts, n);
    api_fp *f = api_fp_make(c, tokens);
    cJSON_Delete(c);
    return f;
}

static void test_compare(void) {
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]";
    const char *const t[] = {"first question", "first answer", "second question"};
    const char *const e[] = {"first question", "another answer", "second question"};
    api_fp *prev = fp_of(tools, "Be brief.", t, 1, 1000);
    int32_t missed = -1;
    /* going on from it: the same prefix */
    api_fp *cur = fp_of(tools, "Be brief.", t, 3, 2000);
    CHECK(api_fp_compare(prev, cur, &missed) == API_FP_SAME && missed == 0);
    CHECK(api_fp_change_name(API_FP_SAME) == NULL);
    api_fp_free(cur);
    /* the tools first: every token of the earlier prompt */
    cur = fp_of("[]", "Be brief.", t, 1, 1000);
    CHECK(api_fp_compare(prev, cur, &missed) == API_FP_TOOLS && missed == 1000);
    CHECK(!strcmp(api_fp_change_name(API_FP_TOOLS), "tools_changed"));
    api_fp_free(cur);
    /* the system prompt: fewer; its absence is a change too */
    int32_t m_sys = -1, m_msg = -1;
    cur = fp_of(tools, "Be very brief.", t, 1, 1000);
    CHECK(api_fp_compare(prev, cur, &m_sys) == API_FP_SYSTEM && m_sys > 0 && m_sys < 1000);
    CHECK(!strcmp(api_fp_change_name(API_FP_SYSTEM), "system_changed"));
    api_fp_free(cur);
    cur = fp_of(tools, NULL, t, 1, 1000);
    CHECK(api_fp_compare(prev, cur, &missed) == API_FP_SYSTEM && missed == m_sys);
    api_fp_free(cur);
    /* a message: fewer still */
    cur = fp_of(tools, "Be brief.", e + 1, 1, 1000);
    CHECK(api_fp_compare(prev, cur, &m_msg) == API_FP_MESSAGES && m_msg > 0 && m_msg < m_sys);
    CHECK(!strcmp(api_fp_change_name(API_FP_MESSAGES), "messages_changed"));
    api_fp_free(cur);
    api_fp_free(prev);
    /* the second message edited: the tokens from it on; one dropped is a change */
    prev = fp_of(tools, "Be brief.", t, 3, 3000);
    cur = fp_of(tools, "Be brief.", e, 3, 3000);
    CHECK(api_fp_compare(prev, cur, &missed) == API_FP_MESSAGES && missed > 0 && missed < 3000);
    api_fp_free(cur);
    cur = fp_of(tools, "Be brief.", t, 2, 3000);
    int32_t m_drop = -1;
    CHECK(api_fp_compare(prev, cur, &m_drop) == API_FP_MESSAGES && m_drop > 0 && m_drop < missed);
    api_fp_free(cur);
    api_fp_free(prev);
}

static void test_store(void) {
    api_fp_store *s = api_fp_store_new(2);
    const char *const t[] = {"q"};
    char longid[80];
    memset(longid, 'x', sizeof longid - 1);
    longid[sizeof longid - 1] = 0;
    api_fp *a = fp_of(NULL, NULL, t, 1, 1);
    api_fp_store_put(s, "msg_a", a);
    api_fp_store_put(s, "msg_b", fp_of(NULL, NULL, t, 1, 2));
    CHECK(api_fp_store_get(s, "msg_a") == a && api_fp_store_get(s, "msg_b") != NULL);
    CHECK(api_fp_store_get(s, "msg_c") == NULL);
    /* a third: the oldest goes */
    api_fp_store_put(s, "msg_c", fp_of(NULL, NULL, t, 1, 3));
    CHECK(api_fp_store_get(s, "msg_a") == NULL && api_fp_store_get(s, "msg_b") && api_fp_store_get(s, "msg_c"));
    /* an id put again replaces its fingerprint in place (msg_b stays) */
    api_fp *c2 = fp_of(NULL, NULL, t, 1, 4);
    api_fp_store_put(s, "msg_c", c2);
    CHECK(api_fp_store_get(s, "msg_c") == c2 && api_fp_store_get(s, "msg_b") != NULL);
    /* an id too long to keep (freed, never found) */
    api_fp_store_put(s, longid, fp_of(NULL, NULL, t, 1, 5));
    CHECK(api_fp_store_get(s, longid) == NULL && api_fp_store_get(s, "msg_b") && api_fp_store_get(s, "msg_c"));
    api_fp_store_free(s);
    api_fp_store_free(NULL);
}

int main(void) {
    test_compare();
    test_store();
    return mla_test_finish();
}
