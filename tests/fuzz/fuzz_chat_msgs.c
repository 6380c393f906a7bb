/* libFuzzer target: chat templates over varied conversations. Input: template text, a NUL
 * byte, then bytes that shape the messages (count, roles, content as a string, null or text
 * parts, tool calls, control-token texts inside the content, add_generation_prompt). Seeded
 * with the released DeepSeek, Kimi and GLM templates (tests/data/chat-fuzz). Each input is
 * parsed and rendered through the jinja layer, through chat_tmpl (built-in fallback) and through
 * the message guard (coordinator/chat_guard.h: protect, render, restore; the restored spans must
 * lie inside the text and hold control-token texts). Any status is fine; crashes, leaks, UB and
 * hangs are not. tests/fuzz/replay_main.c replays the corpus without libFuzzer. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/chat.h"
#include "coordinator/chat_guard.h"
#include "coordinator/chat_jinja.h"

static const char *const SPECIAL[] = {
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>",
    "<\xEF\xBD\x9CUser\xEF\xBD\x9C>", "<|assistant|>", "<|user|>", "<|im_end|>", "<|im_middle|>", "</think>",
    "<think>", "[gMASK]", "<sop>",
};
#define N_SPECIAL (sizeof SPECIAL / sizeof SPECIAL[0])

static size_t match(void *ctx, const char *s, size_t len, size_t pos) {
    (void)ctx;
    size_t best = 0;
    for (size_t k = 0; k < N_SPECIAL; k++) {
        size_t l = strlen(SPECIAL[k]);
        if (l <= len - pos && l > best && !memcmp(s + pos, SPECIAL[k], l)) best = l;
    }
    return best;
}

typedef struct rd {
    const uint8_t *p;
    size_t n, i;
} rd;

static unsigned byte(rd *r) { return r->i < r->n ? r->p[r->i++] : 0; }

/* A string: bytes from the input (up to 24), with control-token texts mixed in. */
static char *text(rd *r) {
    size_t cap = 512, n = 0;
    char *s = malloc(cap);
    unsigned parts = byte(r) % 5;
    for (unsigned k = 0; k <= parts; k++) {
        unsigned c = byte(r);
        const char *add;
        char raw[32];
        if (c % 3 == 0) {
            add = SPECIAL[(c / 3) % N_SPECIAL];
        } else {
            size_t l = c % 24, j = 0;
            for (; j < l && r->i < r->n; j++) raw[j] = (char)(r->p[r->i++] ? r->p[r->i - 1] : ' ');
            raw[j] = 0;
            add = raw;
        }
        size_t al = strlen(add);
        if (n + al + 1 > cap) break;
        memcpy(s + n, add, al);
        n += al;
    }
    s[n] = 0;
    return s;
}

static cJSON *messages(rd *r) {
    static const char *const roles[] = {"system", "user", "assistant", "tool", "user", "assistant", "other"};
    cJSON *m = cJSON_CreateArray();
    unsigned n = byte(r) % 7;
    for (unsigned i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        unsigned b = byte(r);
        cJSON_AddStringToObject(o, "role", roles[b % 7]);
        unsigned kind = (b / 7) % 4;
        if (kind == 0) {
            cJSON_AddNullToObject(o, "content");
        } else if (kind == 1) {
            cJSON *parts = cJSON_AddArrayToObject(o, "content");
            unsigned np = byte(r) % 3 + 1;
            for (unsigned k = 0; k < np; k++) {
                cJSON *p = cJSON_CreateObject();
                cJSON_AddStringToObject(p, "type", "text");
                char *t = text(r);
                cJSON_AddStringToObject(p, "text", t);
                free(t);
                cJSON_AddItemToArray(parts, p);
            }
        } else {
            char *t = text(r);
            cJSON_AddStringToObject(o, "content", t);
            free(t);
        }
        if (byte(r) % 4 == 0) {
            cJSON *tc = cJSON_AddArrayToObject(o, "tool_calls");
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "type", "function");
            cJSON *f = cJSON_AddObjectToObject(c, "function");
            char *t = text(r);
            cJSON_AddStringToObject(f, "name", t);
            free(t);
            t = text(r);
            cJSON_AddStringToObject(f, "arguments", t);
            free(t);
            cJSON_AddItemToArray(tc, c);
        }
        if (byte(r) % 5 == 0) {
            char *t = text(r);
            cJSON_AddStringToObject(o, "reasoning_content", t);
            free(t);
        }
        cJSON_AddItemToArray(m, o);
    }
    return m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t tl = nul ? (size_t)(nul - data) : size;
    rd r = {nul ? nul + 1 : data + size, nul ? size - tl - 1 : 0, 0};
    cJSON *msgs = messages(&r);
    bool add_gen = byte(&r) & 1;
    mla_err err;
    jinja_tmpl *t = NULL;
    if (jinja_parse(&t, (const char *)data, tl, &err) == JINJA_OK) {
        cJSON *vars = cJSON_CreateObject();
        cJSON_AddItemToObject(vars, "messages", cJSON_Duplicate(msgs, 1));
        cJSON_AddBoolToObject(vars, "add_generation_prompt", add_gen);
        cJSON_AddStringToObject(vars, "bos_token", "<s>");
        cJSON_AddStringToObject(vars, "eos_token", "</s>");
        if (byte(&r) & 1) cJSON_AddItemToObject(vars, "tools", cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]"));
        char *out = NULL;
        size_t ol;
        if (jinja_render(t, vars, &out, &ol, &err) == JINJA_OK) {
            if (strlen(out) > ol) abort();
            free(out);
        }
        cJSON_Delete(vars);
        jinja_free(t);
    }
    chat_tmpl *ct = NULL;
    if (chat_tmpl_new(&ct, (const char *)data, tl, (r.n & 1) ? CHAT_FAMILY_GLM : CHAT_FAMILY_DEEPSEEK3, "<s>", "</s>",
                      &err) == MLA_OK) {
        chat_guard g;
        chat_guard_init(&g);
        cJSON *prot = NULL;
        if (chat_guard_protect(&g, msgs, NULL, match, NULL, &prot, NULL, &err) == MLA_OK) {
            char *out = NULL;
            size_t ol = 0;
            if (chat_tmpl_apply_json(ct, prot, add_gen, NULL, &out, &ol, NULL, &err) == MLA_OK) {
                char *full = NULL;
                size_t fl = 0, *sp = NULL, nsp = 0;
                chat_guard_restore(&g, out, ol, &full, &fl, &sp, &nsp);
                for (size_t k = 0; k < nsp; k++) {
                    if (sp[2 * k] > sp[2 * k + 1] || sp[2 * k + 1] > fl) abort();
                    if (k && sp[2 * k] < sp[2 * k - 1]) abort();
                    if (match(NULL, full, fl, sp[2 * k]) != sp[2 * k + 1] - sp[2 * k]) abort();
                }
                free(full);
                free(sp);
                free(out);
            }
        }
        cJSON_Delete(prot);
        chat_guard_free(&g);
        chat_tmpl_free(ct);
    }
    cJSON_Delete(msgs);
    return 0;
}
