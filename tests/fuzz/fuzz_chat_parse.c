/* libFuzzer target for the chat output parsers (coordinator/chat_reasoning.c,
 * coordinator/chat_toolcall.c), combined as the server combines them: the reasoning split, then
 * the tool-call parse of the content. Input: a header byte (bits 0-1: tool-call format,
 * bit 2: reasoning on, bit 3: the prompt opened <think>, bit 4: Kimi-K2's reasoning, which its
 * tool-call section also ends), a byte naming where to cut, then the
 * model's text (any bytes; the fuzzer's dictionary of markers comes from the seed corpus).
 * Checked: the partial parse of every prefix up to the cut (as a stream sees them) is a prefix of
 * the parse of the longer text and of the final parse (reasoning, content, the number of calls,
 * each call's name once known, its arguments), so what was streamed is never taken back; spans
 * lie inside the text; no more than TOOLCALL_MAX_CALLS calls; the reasoning split and the
 * tool-call parse with the stream's hints equal them without; the Responses API's output items
 * (coordinator/api_responses.c) made from the stream's parses (at each UTF-8 boundary, as the server
 * streams) equal those made from the final parse alone. Deterministic in ctest
 * (-runs=N -seed=1); tests/fuzz/replay_main.c replays the corpus (tests/data/chat-parse). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/api_params.h"
#include "coordinator/api_messages.h"
#include "coordinator/api_responses.h"
#include "coordinator/chat_json.h"
#include "coordinator/chat_reasoning.h"
#include "coordinator/chat_toolcall.h"

typedef struct parsed {
    reasoning_split rs;
    toolcall_result tc;
} parsed;

static const cJSON *g_tools;

/* a stream's hints (as api_server keeps them per answer) */
typedef struct hints {
    size_t r_scan;
    toolcall_scan tc;
    size_t tc_base;
} hints;

static bool same_result(const toolcall_result *a, const toolcall_result *b) {
    if (a->content_len != b->content_len || memcmp(a->content, b->content, a->content_len) || a->n_calls != b->n_calls ||
        a->opened != b->opened)
        return false;
    for (int i = 0; i < a->n_calls; i++) {
        const toolcall *x = &a->calls[i], *y = &b->calls[i];
        if (x->done != y->done || x->args_len != y->args_len || memcmp(x->args, y->args, x->args_len) ||
            !x->name != !y->name || (x->name && strcmp(x->name, y->name)) || !x->id != !y->id ||
            (x->id && strcmp(x->id, y->id)))
            return false;
    }
    return true;
}

/* h: the stream's hints (NULL: none); the parse must not depend on them */
static void parse(const char *t, size_t len, int flags, bool final, hints *h, parsed *o) {
    size_t *scan = h ? &h->r_scan : NULL;
    memset(o, 0, sizeof *o);
    if (flags & 4) {
        const enum reasoning_kind k = (flags & 16) ? REASONING_KIMI_K2 : REASONING_DEEPSEEK_R1;
        reasoning_split_text(k, t, len, (flags & 8) != 0, final, scan, &o->rs);
        if (scan) {
            reasoning_split plain;
            reasoning_split_text(k, t, len, (flags & 8) != 0, final, NULL, &plain);
            if (memcmp(&plain, &o->rs, sizeof plain)) {
                fprintf(stderr, "the scan hint changed the split at %zu bytes\n", len);
                abort();
            }
        }
    } else {
        o->rs.c_start = 0;
        o->rs.c_end = len;
    }
    if (o->rs.r_start > len || o->rs.r_end > len || o->rs.c_start > o->rs.c_end || o->rs.c_end > len) abort();
    const enum toolcall_kind tk = (enum toolcall_kind)(flags & 3);
    const char *ct = t + o->rs.c_start;
    const size_t cn = o->rs.c_end - o->rs.c_start;
    if (h && o->rs.c_start != h->tc_base) {
        memset(&h->tc, 0, sizeof h->tc);
        h->tc_base = o->rs.c_start;
    }
    toolcall_parse(tk, ct, cn, final, g_tools, h ? &h->tc : NULL, &o->tc);
    if (o->tc.n_calls > TOOLCALL_MAX_CALLS) abort();
    if (h) {
        toolcall_result plain;
        toolcall_parse(tk, ct, cn, final, g_tools, NULL, &plain);
        if (!same_result(&plain, &o->tc)) {
            fprintf(stderr, "the scan hints changed the tool-call parse at %zu bytes\n", len);
            abort();
        }
        toolcall_result_free(&plain);
    }
}

static bool is_prefix(const char *a, size_t an, const char *b, size_t bn) { return an <= bn && !memcmp(a, b, an); }

/* a (partial, over the shorter text ta) must be a prefix of b (over tb) */
static void check_prefix(const char *ta, const parsed *a, const char *tb, const parsed *b) {
    size_t ar = a->rs.r_end > a->rs.r_start ? a->rs.r_end - a->rs.r_start : 0;
    size_t br = b->rs.r_end > b->rs.r_start ? b->rs.r_end - b->rs.r_start : 0;
    if (!is_prefix(ta + a->rs.r_start, ar, tb + b->rs.r_start, br)) {
        fprintf(stderr, "reasoning taken back\n");
        abort();
    }
    if (!is_prefix(a->tc.content, a->tc.content_len, b->tc.content, b->tc.content_len)) {
        fprintf(stderr, "content taken back: '%.*s' / '%.*s'\n", (int)a->tc.content_len, a->tc.content,
                (int)b->tc.content_len, b->tc.content);
        abort();
    }
    if (a->tc.n_calls > b->tc.n_calls) {
        fprintf(stderr, "calls taken back\n");
        abort();
    }
    for (int i = 0; i < a->tc.n_calls; i++) {
        const toolcall *x = &a->tc.calls[i], *y = &b->tc.calls[i];
        if (!x->name) continue; /* not streamed yet */
        if (!y->name || strcmp(x->name, y->name) || (x->id && (!y->id || strcmp(x->id, y->id))) ||
            !is_prefix(x->args, x->args_len, y->args, y->args_len) || x->content_at != y->content_at) {
            fprintf(stderr, "call %d changed\n", i);
            abort();
        }
    }
}

/* the parse as the Responses API's items take it */
static void rsp_feed(api_rsp_out *o, const char *t, const parsed *p) {
    api_rsp_view v = {.content = p->tc.content, .content_len = p->tc.content_len, .calls = p->tc.calls,
                      .n_calls = p->tc.n_calls};
    if (p->rs.r_end > p->rs.r_start) {
        v.reasoning = t + p->rs.r_start;
        v.reasoning_len = p->rs.r_end - p->rs.r_start;
    }
    api_rsp_out_update(o, &v, NULL, NULL);
}

/* each reasoning item of o (summary and encrypted_content asked) in its response object: its
 * summary its text, and its encrypted_content, sent back as an input item alone, that text again */
static void rsp_seal_check(const api_rsp_out *o) {
    cJSON *echo = cJSON_CreateObject();
    cJSON *obj = api_rsp_object(o, echo, "m", 0, "completed", NULL, NULL, NULL);
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(obj, "output")) {
        if (strcmp(cJSON_GetObjectItemCaseSensitive(it, "type")->valuestring, "reasoning")) continue;
        const char *text = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(it, "content"), 0)
                               ->child->next->valuestring; /* {"type", "text"} */
        const cJSON *sum = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(it, "summary"), 0);
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(it, "encrypted_content");
        if (!sum || strcmp(cJSON_GetObjectItemCaseSensitive(sum, "text")->valuestring, text) || !cJSON_IsString(x)) {
            fprintf(stderr, "responses: a reasoning item without its summary or encrypted_content\n");
            abort();
        }
        cJSON *body = cJSON_CreateObject(), *in = cJSON_AddArrayToObject(body, "input");
        cJSON *u = cJSON_CreateObject(), *r = cJSON_CreateObject();
        cJSON_AddStringToObject(u, "role", "user");
        cJSON_AddStringToObject(u, "content", "q");
        cJSON_AddStringToObject(r, "type", "reasoning");
        cJSON_AddArrayToObject(r, "summary");
        cJSON_AddStringToObject(r, "encrypted_content", x->valuestring);
        cJSON_AddItemToArray(in, u);
        cJSON_AddItemToArray(in, r);
        cJSON *chat, *e2;
        api_rsp_opts opts;
        api_error e = {0};
        const bool nul = strchr(text, CHAT_JSON_NUL) != NULL; /* a NUL: refused, as in any request's text */
        if ((api_rsp_parse(body, &chat, &e2, &opts, &e) != MLA_OK) != nul) {
            fprintf(stderr, "responses: sealed reasoning %s: %s\n", nul ? "taken with a NUL" : "refused", e.message);
            abort();
        }
        if (nul) {
            cJSON_Delete(body);
            continue;
        }
        const cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(chat, "messages"), 1);
        const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
        if (!cJSON_IsString(rc) || strcmp(rc->valuestring, text)) {
            fprintf(stderr, "responses: sealed reasoning came back changed\n");
            abort();
        }
        cJSON_Delete(chat);
        cJSON_Delete(e2);
        cJSON_Delete(body);
    }
    cJSON_Delete(obj);
    cJSON_Delete(echo);
}

/* the same items as a Messages answer's blocks: a thinking block's signature, sent back alone in
 * an assistant turn, its text again; a tool_use block's input an object */
static void msg_blocks_check(const api_rsp_out *o) {
    cJSON *blocks = api_rsp_blocks(o);
    if (cJSON_GetArraySize(blocks) != o->n_items) abort();
    int k = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, blocks) {
        const api_rsp_item *it = &o->items[k++];
        const char *ty = cJSON_GetObjectItemCaseSensitive(b, "type")->valuestring;
        if (it->kind == API_RSP_CALL) {
            char *in = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(b, "input"));
            cJSON *back = cJSON_Parse(in);
            if (strcmp(ty, "tool_use") || !cJSON_IsObject(back)) {
                fprintf(stderr, "messages: a tool_use input that is not an object: %s\n", in);
                abort();
            }
            cJSON_Delete(back);
            cJSON_free(in);
        }
        if (it->kind != API_RSP_REASONING || !it->text || strchr(it->text, CHAT_JSON_NUL)) continue;
        cJSON *body = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(body, "messages");
        cJSON_AddNumberToObject(body, "max_tokens", 1);
        cJSON *u = cJSON_CreateObject(), *a = cJSON_CreateObject(), *u2 = cJSON_CreateObject();
        cJSON_AddStringToObject(u, "role", "user");
        cJSON_AddStringToObject(u, "content", "q");
        cJSON_AddStringToObject(a, "role", "assistant");
        cJSON *ac = cJSON_AddArrayToObject(a, "content"), *th = cJSON_CreateObject(), *tx = cJSON_CreateObject();
        cJSON_AddStringToObject(th, "type", "thinking");
        cJSON_AddStringToObject(th, "thinking", "");
        cJSON_AddItemToObject(th, "signature", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(b, "signature"), 1));
        cJSON_AddStringToObject(tx, "type", "text");
        cJSON_AddStringToObject(tx, "text", "a");
        cJSON_AddItemToArray(ac, th);
        cJSON_AddItemToArray(ac, tx);
        cJSON_AddStringToObject(u2, "role", "user");
        cJSON_AddStringToObject(u2, "content", "b");
        cJSON_AddItemToArray(msgs, u);
        cJSON_AddItemToArray(msgs, a);
        cJSON_AddItemToArray(msgs, u2);
        cJSON *chat;
        api_rsp_opts opts;
        api_error e = {0};
        if (api_msg_parse(body, &chat, &opts, &e) != MLA_OK) {
            fprintf(stderr, "messages: a signature of ours refused: %s\n", e.message);
            abort();
        }
        const cJSON *rc =
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(chat, "messages"), 1),
                                             "reasoning_content");
        if (!cJSON_IsString(rc) || strcmp(rc->valuestring, it->text)) {
            fprintf(stderr, "messages: a signature came back as other text\n");
            abort();
        }
        cJSON_Delete(chat);
        cJSON_Delete(body);
    }
    cJSON_Delete(blocks);
}

/* the items of a stream (a) and of the final parse alone (b): the same, the messages' text the
 * final content where that is valid UTF-8 (else its pieces around the calls, each made valid
 * alone, may differ from the whole made valid) */
static void rsp_check(api_rsp_out *a, api_rsp_out *b, const parsed *fin) {
    api_rsp_out_finish(a, false, NULL, NULL);
    api_rsp_out_finish(b, false, NULL, NULL);
    if (a->n_items != b->n_items) {
        fprintf(stderr, "responses: %d items streamed, %d whole\n", a->n_items, b->n_items);
        abort();
    }
    size_t n = 0, m = 0;
    /* valid: UTF-8, and cut by no call inside a character (the pieces either side are made valid
     * each, so a character the final content joins across a call is two replacements there) */
    bool valid = api_utf8_invalid_at(fin->tc.content, fin->tc.content_len) < 0;
    for (int i = 0; valid && i < fin->tc.n_calls; i++) {
        const size_t at = fin->tc.calls[i].content_at;
        if (at < fin->tc.content_len && api_utf8_complete_prefix(fin->tc.content, at) != at) valid = false;
    }
    char *want = api_json_text(fin->tc.content, fin->tc.content_len, &n);
    for (int k = 0; k < a->n_items; k++) {
        const api_rsp_item *x = &a->items[k], *y = &b->items[k];
        /* a message's text may differ where the content is not UTF-8: the stream's pieces (split
         * where a tool-call section was, which the final content joins across) are made valid each */
        const bool same_text = (x->kind == API_RSP_MESSAGE && !valid) ||
                               (x->len == y->len && (!x->len || !memcmp(x->text, y->text, x->len)));
        if (x->kind != y->kind || !same_text || !x->name != !y->name || (x->name && strcmp(x->name, y->name))) {
            fprintf(stderr, "responses: item %d differs\n", k);
            abort();
        }
        if (x->kind == API_RSP_MESSAGE && valid) {
            if (m + x->len > n || (x->len && memcmp(want + m, x->text, x->len))) {
                fprintf(stderr, "responses: message text is not the content\n");
                abort();
            }
            m += x->len;
        }
    }
    if (valid && m != n) {
        fprintf(stderr, "responses: %zu bytes of %zu content in messages\n", m, n);
        abort();
    }
    free(want);
    rsp_seal_check(b);
    msg_blocks_check(b);
    api_rsp_out_free(a);
    api_rsp_out_free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    if (!g_tools)
        g_tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                              "\"properties\":{\"s\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"},"
                              "\"o\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]},"
                              "\"r\":{\"$ref\":\"#/$defs/R\"}}}}}]");
    int flags = data[0];
    const char *t = (const char *)data + 2;
    size_t len = size - 2;
    if (len > 4096) len = 4096;
    size_t cut = len ? data[1] % (len + 1) : 0;
    parsed fin;
    parse(t, len, flags, true, NULL, &fin);
    /* the stream's view: every prefix up to the cut, each against the next and the final, with
     * the stream's scan hint */
    parsed prev;
    hints h = {0};
    api_rsp_out streamed, whole;
    const api_rsp_opts all = {.summary = true, .encrypted = true};
    api_rsp_out_init(&streamed, "resp_x", NULL);
    api_rsp_out_init(&whole, "resp_x", &all);
    parse(t, 0, flags, false, &h, &prev);
    for (size_t l = 1; l <= cut; l++) {
        parsed cur;
        parse(t, l, flags, false, &h, &cur);
        check_prefix(t, &prev, t, &cur);
        if (api_utf8_complete_prefix(t, l) == l) rsp_feed(&streamed, t, &cur);
        toolcall_result_free(&prev.tc);
        prev = cur;
    }
    check_prefix(t, &prev, t, &fin);
    rsp_feed(&streamed, t, &fin);
    rsp_feed(&whole, t, &fin);
    rsp_check(&streamed, &whole, &fin);
    toolcall_result_free(&prev.tc);
    toolcall_result_free(&fin.tc);
    return 0;
}
