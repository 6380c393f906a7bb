/* api_messages: see api_messages.h. */
#include "coordinator/api_messages.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mla_err.h"
#include "coordinator/chat.h"

static bool is_null(const cJSON *j) { return !j || cJSON_IsNull(j); }

/* Whether j is an integer in [lo, hi] (the range checked before any conversion) */
static bool int_in(const cJSON *j, double lo, double hi) {
    return cJSON_IsNumber(j) && j->valuedouble >= lo && j->valuedouble <= hi &&
           j->valuedouble == (double)(long long)j->valuedouble;
}

static const char *const k_keys[] = {"model",         "max_tokens",         "messages", "system",   "stop_sequences",
                                     "stream",        "temperature",        "top_p",    "top_k",    "tools",
                                     "tool_choice",   "thinking",           "metadata", "output_config",
                                     "cache_control", "context_management", "diagnostics", NULL};

#define API_MSG_MIN_THINKING 1024 /* Anthropic's least budget_tokens */
#define API_MSG_TOOL_ERROR "Error" /* a tool_result with is_error true: "Error: " before its text */

/* Members of a block (of the request's member param) beyond those read: cache_control (the prefix
 * cache here needs no marks) and citations as null */
static int block_members(const cJSON *b, const char *param, const char *where, const char *const *read,
                         api_error *e) {
    const cJSON *m;
    cJSON_ArrayForEach(m, b) {
        const char *k = m->string ? m->string : "";
        if (api_in_list(read, k) || !strcmp(k, "cache_control") || (!strcmp(k, "citations") && cJSON_IsNull(m)))
            continue;
        return api_bad(e, param, "%s.%.64s is not supported here", where, k);
    }
    return MLA_OK;
}

/* The members of object o (the request's member param) all in read, else a 400 naming the other */
static int only_members(const cJSON *o, const char *param, const char *const *read, api_error *e) {
    const cJSON *m;
    cJSON_ArrayForEach(m, o) {
        const char *k = m->string ? m->string : "";
        if (!api_in_list(read, k)) return api_bad(e, param, "%s.%.64s is not supported here", param, k);
    }
    return MLA_OK;
}

static const char *block_type(const cJSON *b) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(b, "type");
    return cJSON_IsObject(b) && cJSON_IsString(ty) ? ty->valuestring : NULL;
}

/* A text block (of the request's member param, at where): its text joined to j (sys: a system
 * block, read past a billing header line; a block of that line alone adds nothing) */
static int text_block(const cJSON *b, const char *param, const char *at, bool sys, api_join *j, api_error *e) {
    static const char *const read[] = {"type", "text", NULL};
    const cJSON *tx = cJSON_GetObjectItemCaseSensitive(b, "text");
    if (!cJSON_IsString(tx)) return api_bad(e, param, "%s: a text block needs a string 'text'", at);
    if (block_members(b, param, at, read, e)) return MLA_ERR;
    const char *t = sys ? chat_past_billing_header(tx->valuestring) : tx->valuestring;
    if (t == tx->valuestring || *t) api_join_add(j, t);
    return MLA_OK;
}

/* The text of a string, or of a list of text blocks, joined; NULL with e set (param: the member;
 * sys: the system prompt, read past billing header lines) */
static char *text_of(const cJSON *c, const char *param, const char *where, bool sys, api_error *e) {
    if (cJSON_IsString(c)) return mla_xstrdup(sys ? chat_past_billing_header(c->valuestring) : c->valuestring);
    if (!cJSON_IsArray(c)) {
        api_bad(e, param, "%s must be a string or a list of text blocks", where);
        return NULL;
    }
    api_join j = {0};
    int k = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, c) {
        char at[96];
        snprintf(at, sizeof at, "%s[%d]", where, k++);
        const char *ty = block_type(b);
        if (!ty || strcmp(ty, "text")) {
            api_bad(e, param, "%s: blocks of type '%.64s' are not supported here (text)", at, ty ? ty : "(none)");
            free(j.s);
            return NULL;
        }
        if (text_block(b, param, at, sys, &j, e)) {
            free(j.s);
            return NULL;
        }
    }
    return j.s ? j.s : mla_xstrdup("");
}

/* A client tool {"name", "description"?, "input_schema"} in the chat form: {"type": "function",
 * "function": {"name", "description"?, "parameters"}} (checked by tools_chat) */
static cJSON *chat_tool(const cJSON *t) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(t, "description");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *fn = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(fn, "name", cJSON_IsString(name) ? name->valuestring : "");
    if (cJSON_IsString(desc)) cJSON_AddStringToObject(fn, "description", desc->valuestring);
    cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(t, "input_schema"), 1));
    return c;
}

typedef struct tx_state {
    cJSON *msgs;
    const cJSON *tools; /* the request's tools (as sent, checked by tools_chat), which tool_reference blocks name */
    const char **loaded; /* the tools a tool_reference brought in so far (names in tools) */
    int n_loaded, cap_loaded;
    int n_refs; /* tool_reference blocks read so far (at most API_MAX_TOOLS_ALL) */
    api_refs uses; /* the tool_use blocks' ids, which each tool_result's tool_use_id must name */
    bool counted;  /* the turn's ids are in uses already (turns joined: each was read alone first) */
} tx_state;

/* Whether tool name was brought in so far */
static bool is_loaded(const tx_state *t, const char *name) {
    for (int i = 0; i < t->n_loaded; i++)
        if (!strcmp(t->loaded[i], name)) return true;
    return false;
}

/* Whether tool name was brought in already; else it is, now */
static bool loaded_before(tx_state *t, const char *name) {
    if (is_loaded(t, name)) return true;
    if (t->n_loaded == t->cap_loaded) {
        t->cap_loaded = t->cap_loaded ? 2 * t->cap_loaded : 8;
        t->loaded = mla_xrealloc(t->loaded, (size_t)t->cap_loaded * sizeof *t->loaded);
    }
    t->loaded[t->n_loaded++] = name;
    return false;
}

/* A tool_reference block b (at at) joined to j as result_text says */
static int reference_text(tx_state *t, const cJSON *b, const char *at, api_join *j, api_error *e) {
    static const char *const read[] = {"type", "tool_name", NULL};
    if (++t->n_refs > API_MAX_TOOLS_ALL)
        return api_bad(e, "messages", "%s: more than %d tool_reference blocks in a request", at, API_MAX_TOOLS_ALL);
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(b, "tool_name");
    if (!cJSON_IsString(nm)) return api_bad(e, "messages", "%s: a tool_reference needs a string tool_name", at);
    if (block_members(b, "messages", at, read, e)) return MLA_ERR;
    const cJSON *tool = NULL, *x, *list = cJSON_IsArray(t->tools) ? t->tools : NULL;
    cJSON_ArrayForEach(x, list) {
        const cJSON *xn = cJSON_GetObjectItemCaseSensitive(x, "name");
        if (cJSON_IsString(xn) && !strcmp(xn->valuestring, nm->valuestring)) tool = x;
    }
    if (!tool)
        return api_bad(e, "messages", "%s: tool_reference '%.64s' names no tool of 'tools'", at, nm->valuestring);
    cJSON *ct = chat_tool(tool);
    /* the tool's own name, which lives as long as the request (a joined turn's blocks do not) */
    if (loaded_before(t, cJSON_GetObjectItemCaseSensitive(tool, "name")->valuestring)) {
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(ct, "function");
        cJSON_DeleteItemFromObjectCaseSensitive(fn, "description");
        cJSON_DeleteItemFromObjectCaseSensitive(fn, "parameters");
    }
    char *s = cJSON_PrintUnformatted(ct);
    api_join_add(j, s);
    free(s);
    cJSON_Delete(ct);
    return MLA_OK;
}

/* A tool_result's content (at where): a string, or text and tool_reference blocks, joined a line
 * apart. A tool_reference {"tool_name"} (a tool search's result, as Claude Code returns one) names
 * a tool of the request, most often one of defer_loading true, which the prompt does not list: its
 * first reference reads as that tool's definition as JSON in the chat form ({"type": "function",
 * "function": {"name", "description", "parameters"}}, as the prompt's tools are given to the
 * template), so that the tool is brought in where it is found and the prompt before it stays as it
 * was; a later one as {"type": "function", "function": {"name"}} (a prompt is then never longer than
 * the request's tools and messages together). */
static char *result_text(tx_state *t, const cJSON *c, const char *where, api_error *e) {
    if (!cJSON_IsArray(c)) return text_of(c, "messages", where, false, e);
    api_join j = {0};
    int k = 0, rc = MLA_OK;
    const cJSON *b;
    cJSON_ArrayForEach(b, c) {
        char at[160];
        snprintf(at, sizeof at, "%s[%d]", where, k++);
        const char *ty = block_type(b);
        if (ty && !strcmp(ty, "text")) {
            rc = text_block(b, "messages", at, false, &j, e);
        } else if (ty && !strcmp(ty, "tool_reference")) {
            rc = reference_text(t, b, at, &j, e);
        } else {
            rc = api_bad(e, "messages", "%s: blocks of type '%.64s' are not supported in a tool_result (text, "
                                    "tool_reference)", at, ty ? ty : "(none)");
        }
        if (rc) {
            free(j.s);
            return NULL;
        }
    }
    return j.s ? j.s : mla_xstrdup("");
}

/* A user turn: its tool_result blocks tool messages, its text blocks one user message after them */
static int user_turn(tx_state *t, const cJSON *c, int i, api_error *e) {
    char where[64];
    snprintf(where, sizeof where, "messages[%d].content", i);
    if (cJSON_IsString(c)) {
        api_chat_msg(t->msgs, "user", c->valuestring);
        return MLA_OK;
    }
    if (!cJSON_IsArray(c) || !cJSON_GetArraySize(c))
        return api_bad(e, "messages", "%s must be a string or a list of blocks that is not empty", where);
    api_join text = {0};
    int k = 0, rc = MLA_OK;
    const cJSON *b;
    cJSON_ArrayForEach(b, c) {
        char at[96];
        snprintf(at, sizeof at, "%s[%d]", where, k++);
        const char *ty = block_type(b);
        if (ty && !strcmp(ty, "text")) {
            rc = text_block(b, "messages", at, false, &text, e);
        } else if (ty && !strcmp(ty, "tool_result")) {
            static const char *const read[] = {"type", "tool_use_id", "content", "is_error", NULL};
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "tool_use_id");
            const cJSON *err = cJSON_GetObjectItemCaseSensitive(b, "is_error");
            const cJSON *out = cJSON_GetObjectItemCaseSensitive(b, "content");
            if (!cJSON_IsString(id)) rc = api_bad(e, "messages", "%s: a tool_result needs a string tool_use_id", at);
            else if (!is_null(err) && !cJSON_IsBool(err))
                rc = api_bad(e, "messages", "%s.is_error must be a boolean", at);
            else rc = block_members(b, "messages", at, read, e);
            if (rc) break;
            char cw[112];
            snprintf(cw, sizeof cw, "%s.content", at);
            char *o = is_null(out) ? mla_xstrdup("") : result_text(t, out, cw, e);
            if (!o) {
                rc = MLA_ERR;
                break;
            }
            /* a failed call's result says so in its text: the chat templates have no member for it */
            char *shown = o;
            if (cJSON_IsTrue(err)) {
                const size_t n = sizeof API_MSG_TOOL_ERROR + 2 + strlen(o); /* "Error: " o NUL */
                shown = mla_xmalloc(n);
                snprintf(shown, n, *o ? "%s: %s" : "%s", API_MSG_TOOL_ERROR, o);
                free(o);
            }
            cJSON_AddStringToObject(api_chat_msg(t->msgs, "tool", shown), "tool_call_id", id->valuestring);
            free(shown);
            if (!t->counted) api_refs_ref(&t->uses, id->valuestring, i);
        } else {
            rc = api_bad(e, "messages", "%s: blocks of type '%.64s' are not supported in a user turn (text, "
                                    "tool_result; this model reads text)", at, ty ? ty : "(none)");
        }
        if (rc) break;
    }
    if (!rc && text.any) api_chat_msg(t->msgs, "user", text.s);
    free(text.s);
    return rc;
}

/* An assistant turn: thinking its reasoning_content, text its content, tool_use its calls; the
 * last turn (last) the prefix the answer goes on from: text alone */
static int assistant_turn(tx_state *t, const cJSON *c, int i, bool last, api_error *e) {
    char where[64];
    snprintf(where, sizeof where, "messages[%d].content", i);
    cJSON *m = api_chat_msg(t->msgs, "assistant", NULL);
    if (cJSON_IsString(c)) {
        cJSON_AddStringToObject(m, "content", c->valuestring);
        return MLA_OK;
    }
    if (!cJSON_IsArray(c)) return api_bad(e, "messages", "%s must be a string or a list of blocks", where);
    api_join text = {0}, think = {0};
    cJSON *calls = NULL;
    int k = 0, rc = MLA_OK;
    const cJSON *b;
    cJSON_ArrayForEach(b, c) {
        char at[96];
        snprintf(at, sizeof at, "%s[%d]", where, k++);
        const char *ty = block_type(b);
        if (ty && !strcmp(ty, "text")) {
            rc = text_block(b, "messages", at, false, &text, e);
        } else if (ty && !strcmp(ty, "thinking") && !last) {
            /* its text, else the text its signature seals (a display "omitted" answer's) */
            static const char *const read[] = {"type", "thinking", "signature", NULL};
            const cJSON *th = cJSON_GetObjectItemCaseSensitive(b, "thinking");
            const cJSON *sig = cJSON_GetObjectItemCaseSensitive(b, "signature");
            char *sealed = cJSON_IsString(th) && !th->valuestring[0] && cJSON_IsString(sig) && sig->valuestring[0]
                               ? api_rsp_unseal(sig->valuestring)
                               : NULL;
            if (!cJSON_IsString(th) || (!is_null(sig) && !cJSON_IsString(sig)))
                rc = api_bad(e, "messages", "%s: a thinking block needs a string 'thinking' (and 'signature')", at);
            else if (!th->valuestring[0] && cJSON_IsString(sig) && sig->valuestring[0] && !sealed)
                rc = api_bad(e, "messages", "%s: a thinking block of no text whose signature this server did not "
                                        "write", at);
            else if (!(rc = block_members(b, "messages", at, read, e)))
                api_join_add(&think, sealed ? sealed : th->valuestring);
            free(sealed);
        } else if (ty && !strcmp(ty, "tool_use") && !last) {
            static const char *const read[] = {"type", "id", "name", "input", NULL};
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "id");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(b, "name");
            const cJSON *in = cJSON_GetObjectItemCaseSensitive(b, "input");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsObject(in))
                rc = api_bad(e, "messages", "%s: a tool_use needs strings id and name and an object input", at);
            else rc = block_members(b, "messages", at, read, e);
            if (rc) break;
            if (!t->counted) api_refs_def(&t->uses, id->valuestring);
            if (!calls) calls = cJSON_AddArrayToObject(m, "tool_calls");
            char *args = cJSON_PrintUnformatted(in);
            api_chat_call(calls, id->valuestring, name->valuestring, args);
            cJSON_free(args);
        } else if (last && ty && (!strcmp(ty, "thinking") || !strcmp(ty, "tool_use"))) {
            rc = api_bad(e, "messages", "%s: the last turn, the assistant's, is the prefix the answer goes on from: "
                                    "text blocks only", at);
        } else {
            rc = api_bad(e, "messages", "%s: blocks of type '%.64s' are not supported in an assistant turn (text, "
                                    "thinking, tool_use)", at, ty ? ty : "(none)");
        }
        if (rc) break;
    }
    if (!rc) {
        if (think.any) cJSON_AddStringToObject(m, "reasoning_content", think.s);
        if (text.any) cJSON_AddStringToObject(m, "content", text.s);
        else if (calls) cJSON_AddNullToObject(m, "content");
        else cJSON_AddStringToObject(m, "content", "");
    }
    free(text.s);
    free(think.s);
    return rc;
}

/* Messages i .. i + count - 1 (it the first) as one content list: their blocks in order, a string
 * content as a text block (turns of one role in a row are one turn, as Anthropic's API joins them) */
static cJSON *joined_content(const cJSON *it, int count) {
    cJSON *all = cJSON_CreateArray();
    for (int j = 0; j < count; j++, it = it->next) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content"), *b;
        if (cJSON_IsString(c)) {
            cJSON *tb = cJSON_CreateObject();
            cJSON_AddStringToObject(tb, "type", "text");
            cJSON_AddStringToObject(tb, "text", c->valuestring);
            cJSON_AddItemToArray(all, tb);
        } else {
            cJSON_ArrayForEach(b, c) cJSON_AddItemToArray(all, cJSON_Duplicate(b, true));
        }
    }
    return all;
}

/* A turn of role user (else assistant), messages[i]'s content c (last: it ends the messages) into t */
static int one_turn(tx_state *t, bool user, const cJSON *c, int i, bool last, api_error *e) {
    return user ? user_turn(t, c, i, e) : assistant_turn(t, c, i, last, e);
}

static int messages_chat(const cJSON *body, cJSON *chat, api_error *e) {
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(body, "system");
    if (!is_null(sys)) {
        char *s = text_of(sys, "system", "system", true, e);
        if (!s) return MLA_ERR;
        if (*s) api_chat_msg(msgs, "system", s); /* an empty system prompt is none */
        free(s);
    }
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(body, "messages");
    const int n = cJSON_IsArray(in) ? cJSON_GetArraySize(in) : 0;
    if (!n) return api_bad(e, "messages", "'messages' must be a list of messages that is not empty");
    /* each message: an object of a role and a content */
    int i = 0, rc = MLA_OK;
    const cJSON *it;
    cJSON_ArrayForEach(it, in) {
        static const char *const read[] = {"role", "content", NULL};
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        char where[48];
        snprintf(where, sizeof where, "messages[%d]", i);
        /* a system turn among the messages (Claude Code sends one for a model it does not know):
         * refused in the words Anthropic's API uses, which Claude Code reads and sends the request
         * again without it */
        if (cJSON_IsObject(it) && cJSON_IsString(role) && !strcmp(role->valuestring, "system"))
            return api_bad(e, "messages", "messages[%d]: role 'system' messages are not supported here (the system "
                                      "prompt goes in 'system')", i);
        if (!cJSON_IsObject(it) || !cJSON_IsString(role) ||
            (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")))
            return api_bad(e, "messages", "messages[%d].role must be user or assistant", i);
        if (block_members(it, "messages", where, read, e)) return MLA_ERR;
        i++;
    }
    tx_state t = {.msgs = msgs, .tools = cJSON_GetObjectItemCaseSensitive(body, "tools")};
    bool prefix = false;
    i = 0;
    for (it = in->child; it && !rc;) {
        const bool user = !strcmp(cJSON_GetObjectItemCaseSensitive(it, "role")->valuestring, "user");
        int count = 1;
        for (const cJSON *x = it->next;
             x && !strcmp(cJSON_GetObjectItemCaseSensitive(x, "role")->valuestring, user ? "user" : "assistant");
             x = x->next)
            count++;
        const bool last = i + count == n;
        if (count == 1) {
            rc = one_turn(&t, user, cJSON_GetObjectItemCaseSensitive(it, "content"), i, last, e);
        } else {
            /* each turn read alone first, so that a mistake is named where it is (its ids counted
             * there, at its own index); then all as one */
            tx_state alone = {.msgs = cJSON_CreateArray(), .tools = t.tools, .uses = t.uses};
            const cJSON *x = it;
            for (int j = 0; j < count && !rc; j++, x = x->next)
                rc = one_turn(&alone, user, cJSON_GetObjectItemCaseSensitive(x, "content"), i + j, last, e);
            t.uses = alone.uses;
            cJSON_Delete(alone.msgs);
            free(alone.loaded);
            if (!rc) {
                cJSON *all = joined_content(it, count);
                t.counted = true;
                rc = one_turn(&t, user, all, i, last, e);
                t.counted = false;
                cJSON_Delete(all);
            }
        }
        if (!rc && !user && last) {
            prefix = true;
            const int at = cJSON_GetArraySize(msgs) - 1;
            const cJSON *lc = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(msgs, at), "content");
            if (cJSON_IsString(lc) && !lc->valuestring[0]) { /* nothing to go on from: as none */
                cJSON_DeleteItemFromArray(msgs, at);
                prefix = false;
            }
        }
        for (int j = 0; j < count; j++) it = it->next;
        i += count;
    }
    /* each tool_result names a tool_use of the messages */
    const int k = rc ? -1 : api_refs_missing(&t.uses);
    if (k >= 0)
        rc = api_bad(e, "messages", "messages[%d]: tool_use_id '%.64s' names no tool_use of the messages",
                     t.uses.ref_at[k], t.uses.refs[k]);
    api_refs_free(&t.uses);
    /* a tool of defer_loading true that no tool_reference brought in cannot be called (the model
     * has not seen it): out of the chat's tools (tools_chat put them there, marked) */
    cJSON *tl = cJSON_GetObjectItemCaseSensitive(chat, "tools");
    for (cJSON *x = cJSON_IsArray(tl) ? tl->child : NULL, *next; x && !rc; x = next) {
        next = x->next;
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(x, "function");
        if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fn, "defer_loading"))) continue;
        if (!is_loaded(&t, cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring))
            cJSON_Delete(cJSON_DetachItemViaPointer(tl, x));
    }
    free(t.loaded);
    if (!rc && prefix) cJSON_AddBoolToObject(chat, "continue_final_message", true);
    return rc;
}

/* tools: [{"name", "description"?, "input_schema", "type"?: "custom"}] in the chat form;
 * *eager_input set where a tool asks for its input streamed as it is written (every call's is then) */
static int tools_chat(const cJSON *body, cJSON *chat, bool *eager_input, api_error *e) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
    if (is_null(tools)) return MLA_OK;
    if (!cJSON_IsArray(tools)) return api_bad(e, "tools", "'tools' must be a list");
    if (cJSON_GetArraySize(tools) > API_MAX_TOOLS_ALL) /* before the tool_references look them up */
        return api_bad(e, "tools", "at most %d tools are supported (got %d)", API_MAX_TOOLS_ALL,
                       cJSON_GetArraySize(tools));
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    int i = 0, n_deferred = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const char *ty = block_type(t);
        const cJSON *tym = cJSON_GetObjectItemCaseSensitive(t, "type");
        if (!cJSON_IsObject(t) || (ty && strcmp(ty, "custom")) || (!ty && !is_null(tym)))
            return api_bad(e, "tools", "tools[%d]: a tool of type '%.64s' is not served here, only client tools "
                                   "(name, description, input_schema); server tools such as web search run on "
                                   "Anthropic's servers", i, ty ? ty : !cJSON_IsObject(t) ? "(not an object)"
                                                                                     : "(not a string)");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(t, "description");
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
        if (!cJSON_IsString(name) || !cJSON_IsObject(schema) || (!is_null(desc) && !cJSON_IsString(desc)))
            return api_bad(e, "tools", "tools[%d] needs a string name, an object input_schema and a string "
                                   "description where it has one", i);
        const cJSON *strict = cJSON_GetObjectItemCaseSensitive(t, "strict");
        const cJSON *eager = cJSON_GetObjectItemCaseSensitive(t, "eager_input_streaming");
        const cJSON *defer = cJSON_GetObjectItemCaseSensitive(t, "defer_loading");
        if ((!is_null(strict) && !cJSON_IsBool(strict)) || (!is_null(eager) && !cJSON_IsBool(eager)) ||
            (!is_null(defer) && !cJSON_IsBool(defer)))
            return api_bad(e, "tools", "tools[%d]: strict, eager_input_streaming and defer_loading must be booleans",
                           i);
        if (cJSON_IsTrue(eager)) *eager_input = true;
        const cJSON *m;
        cJSON_ArrayForEach(m, t) {
            static const char *const read[] = {"type",   "name",          "description",           "input_schema",
                                               "strict", "cache_control", "eager_input_streaming", "defer_loading",
                                               NULL};
            if (!api_in_list(read, m->string ? m->string : ""))
                return api_bad(e, "tools", "tools[%d].%.64s is not supported (name, description, input_schema, "
                                       "strict, defer_loading)", i, m->string ? m->string : "");
        }
        cJSON *c = chat_tool(t);
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        if (cJSON_IsBool(strict)) cJSON_AddBoolToObject(fn, "strict", cJSON_IsTrue(strict));
        /* not in the prompt's list of tools: a tool_reference brings it in (result_text) */
        if (cJSON_IsTrue(defer)) cJSON_AddTrueToObject(fn, "defer_loading"), n_deferred++;
        cJSON_AddItemToArray(out, c);
        i++;
    }
    /* as Anthropic's API: the listed tools are where the template tells the model how to call any */
    if (i > 0 && n_deferred == i)
        return api_bad(e, "tools", "every tool has defer_loading true: at least one must be listed in the prompt");
    return MLA_OK;
}

/* tool_choice {"type": auto | any | tool (name) | none, "disable_parallel_tool_use"?} */
static int tool_choice_chat(const cJSON *body, cJSON *chat, api_error *e) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(body, "tool_choice");
    if (is_null(tc)) return MLA_OK;
    const char *ty = block_type(tc);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(tc, "name");
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(tc, "disable_parallel_tool_use");
    if (!ty) return api_bad(e, "tool_choice", "'tool_choice' must be an object with a type");
    static const char *const read[] = {"type", "name", "disable_parallel_tool_use", NULL};
    if (only_members(tc, "tool_choice", read, e)) return MLA_ERR;
    if (!is_null(dp) && !cJSON_IsBool(dp))
        return api_bad(e, "tool_choice", "tool_choice.disable_parallel_tool_use must be a boolean");
    if (!strcmp(ty, "tool")) {
        if (!cJSON_IsString(name)) return api_bad(e, "tool_choice", "tool_choice of type tool needs a string name");
        cJSON *o = cJSON_AddObjectToObject(chat, "tool_choice");
        cJSON_AddStringToObject(o, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "function"), "name", name->valuestring);
    } else if (!is_null(name)) {
        return api_bad(e, "tool_choice", "tool_choice.name goes with type tool only");
    } else if (!strcmp(ty, "auto") || !strcmp(ty, "any") || !strcmp(ty, "none")) {
        cJSON_AddStringToObject(chat, "tool_choice", !strcmp(ty, "any") ? "required" : ty);
    } else {
        return api_bad(e, "tool_choice", "tool_choice.type must be auto, any, tool or none");
    }
    if (cJSON_IsTrue(dp)) cJSON_AddBoolToObject(chat, "parallel_tool_calls", false);
    return MLA_OK;
}

/* thinking {"type": "enabled", "budget_tokens", "display"?}, {"type": "adaptive", "display"?} (the
 * model's own default) or {"type": "disabled"}: opts->thinking, opts->omit_thinking */
static int thinking_opts(const cJSON *body, api_rsp_opts *opts, api_error *e) {
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(body, "thinking");
    if (is_null(th)) return MLA_OK;
    const char *ty = block_type(th);
    const cJSON *budget = cJSON_GetObjectItemCaseSensitive(th, "budget_tokens");
    const cJSON *display = cJSON_GetObjectItemCaseSensitive(th, "display");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(body, "max_tokens");
    static const char *const read[] = {"type", "budget_tokens", "display", NULL};
    if (!cJSON_IsObject(th)) return api_bad(e, "thinking", "'thinking' must be an object");
    if (only_members(th, "thinking", read, e)) return MLA_ERR;
    /* "updates" (Claude Code's stream-json runs): the thinking as it comes, which is what
     * "summarized" gives here (the thinking whole) */
    if (!is_null(display) && (!cJSON_IsString(display) || (strcmp(display->valuestring, "summarized") &&
                                                           strcmp(display->valuestring, "updates") &&
                                                           strcmp(display->valuestring, "omitted"))))
        return api_bad(e, "thinking", "thinking.display must be \"summarized\", \"updates\" or \"omitted\"");
    opts->omit_thinking = cJSON_IsString(display) && !strcmp(display->valuestring, "omitted");
    static const char *const types[] = {"enabled", "adaptive", "disabled", NULL};
    if (!ty || !api_in_list(types, ty))
        return api_bad(e, "thinking", "thinking.type must be \"enabled\" (with budget_tokens), \"adaptive\" or "
                                  "\"disabled\"");
    if (strcmp(ty, "enabled") && !is_null(budget))
        return api_bad(e, "thinking", "thinking.budget_tokens goes with type \"enabled\" only");
    if (!strcmp(ty, "disabled")) {
        if (!is_null(display))
            return api_bad(e, "thinking", "thinking.display goes with thinking on, not \"disabled\"");
        opts->thinking = -1;
        return MLA_OK;
    }
    if (!strcmp(ty, "adaptive")) return MLA_OK;
    /* the budget is checked as Anthropic checks it; the thinking and the answer then share
     * max_tokens (docs/openai-params.md) */
    if (!int_in(budget, API_MSG_MIN_THINKING, INT32_MAX) ||
        (cJSON_IsNumber(mt) && budget->valuedouble >= mt->valuedouble))
        return api_bad(e, "thinking", "thinking.budget_tokens must be an integer of at least %d and less than "
                                  "max_tokens", API_MSG_MIN_THINKING);
    opts->thinking = 1;
    return MLA_OK;
}

/* output_config {"effort"?, "format"?}: effort as chat's reasoning_effort (xhigh and max as high: the
 * most that names), format {"type": "json_schema", "schema"} as a json_schema response_format */
static int output_config_chat(const cJSON *body, cJSON *chat, api_error *e) {
    const cJSON *oc = cJSON_GetObjectItemCaseSensitive(body, "output_config");
    if (is_null(oc)) return MLA_OK;
    if (!cJSON_IsObject(oc)) return api_bad(e, "output_config", "'output_config' must be an object");
    static const char *const read[] = {"effort", "format", NULL};
    if (only_members(oc, "output_config", read, e)) return MLA_ERR;
    const cJSON *ef = cJSON_GetObjectItemCaseSensitive(oc, "effort");
    if (!is_null(ef)) {
        static const char *const as_is[] = {"low", "medium", "high", NULL}, *const most[] = {"xhigh", "max", NULL};
        if (!cJSON_IsString(ef) || (!api_in_list(as_is, ef->valuestring) && !api_in_list(most, ef->valuestring)))
            return api_bad(e, "output_config", "output_config.effort must be low, medium, high, xhigh or max");
        const bool top = api_in_list(most, ef->valuestring);
        cJSON_AddStringToObject(chat, "reasoning_effort", top ? "high" : ef->valuestring);
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(oc, "format");
    if (!is_null(f)) {
        const cJSON *sch = cJSON_GetObjectItemCaseSensitive(f, "schema");
        const char *ty = block_type(f);
        if (!ty || strcmp(ty, "json_schema") || !cJSON_IsObject(sch) || cJSON_GetArraySize(f) != 2)
            return api_bad(e, "output_config", "output_config.format must be {\"type\": \"json_schema\", \"schema\": "
                                           "{...}}");
        cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
        cJSON_AddStringToObject(rf, "type", "json_schema");
        cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
        cJSON_AddStringToObject(js, "name", "output");
        cJSON_AddItemToObject(js, "schema", cJSON_Duplicate(sch, 1));
        cJSON_AddBoolToObject(js, "strict", true);
    }
    return MLA_OK;
}

/* context_management {"edits": [...]}: Anthropic's context editing, which clears parts of the
 * conversation before the model reads it. Served: no edit, or clear_thinking_20251015 keeping every
 * thinking block (keep "all" or {"type": "all"}: the conversation as sent), which Claude Code sends
 * with each request. An edit that would clear something (thinking of older turns, tool results,
 * compaction) is refused by name: this server reads the conversation as it is sent. */
static int context_management_check(const cJSON *body, api_error *e) {
    const cJSON *cm = cJSON_GetObjectItemCaseSensitive(body, "context_management");
    if (is_null(cm)) return MLA_OK;
    if (!cJSON_IsObject(cm)) return api_bad(e, "context_management", "'context_management' must be an object");
    static const char *const read[] = {"edits", NULL};
    if (only_members(cm, "context_management", read, e)) return MLA_ERR;
    const cJSON *ed = cJSON_GetObjectItemCaseSensitive(cm, "edits"), *x;
    if (!is_null(ed) && !cJSON_IsArray(ed))
        return api_bad(e, "context_management", "context_management.edits must be a list");
    int i = 0;
    cJSON_ArrayForEach(x, ed) {
        const char *ty = block_type(x), *kt = NULL;
        const cJSON *keep = cJSON_GetObjectItemCaseSensitive(x, "keep");
        if (cJSON_IsString(keep)) kt = keep->valuestring;
        else if (cJSON_IsObject(keep) && cJSON_GetArraySize(keep) == 1) kt = block_type(keep);
        if (!ty || strcmp(ty, "clear_thinking_20251015") || !kt || strcmp(kt, "all") || cJSON_GetArraySize(x) != 2)
            return api_bad(e, "context_management", "context_management.edits[%d] ('%.64s'): this server reads the "
                                               "conversation as it is sent; the one edit it takes is "
                                               "clear_thinking_20251015 with keep \"all\"", i, ty ? ty : "(none)");
        i++;
    }
    return MLA_OK;
}

/* diagnostics {"previous_message_id": id or null}: Anthropic's cache diagnostics, which compare a
 * request with an earlier one to say why the prompt cache missed: the id kept here, the comparison
 * made by the server (api_fprint.h) and answered in the message (api_msg_object). */
static int diagnostics_opts(const cJSON *body, api_rsp_opts *opts, api_error *e) {
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(body, "diagnostics");
    if (is_null(d)) return MLA_OK;
    static const char *const read[] = {"previous_message_id", NULL};
    if (!cJSON_IsObject(d)) return api_bad(e, "diagnostics", "'diagnostics' must be an object");
    if (only_members(d, "diagnostics", read, e)) return MLA_ERR;
    const cJSON *prev = cJSON_GetObjectItemCaseSensitive(d, "previous_message_id");
    if (!is_null(prev) && !cJSON_IsString(prev))
        return api_bad(e, "diagnostics", "diagnostics.previous_message_id must be a string or null");
    opts->diagnostics = cJSON_IsString(prev) ? 2 : 1;
    if (cJSON_IsString(prev) && strlen(prev->valuestring) < sizeof opts->prev_id)
        memcpy(opts->prev_id, prev->valuestring, strlen(prev->valuestring) + 1);
    return MLA_OK;
}

int api_msg_parse(const cJSON *body, cJSON **chat, api_rsp_opts *opts, api_error *e) {
    *chat = NULL;
    memset(opts, 0, sizeof *opts);
    opts->messages = true;
    if (!cJSON_IsObject(body)) return api_bad(e, NULL, "the request body must be a JSON object");
    const cJSON *it;
    cJSON_ArrayForEach(it, body) {
        const char *k = it->string ? it->string : "";
        if (!api_in_list(k_keys, k))
            return api_bad(e, k, "'%.64s' is not supported by /v1/messages on this server (docs/openai-params.md "
                                 "lists the parameters)", k);
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(body, "max_tokens");
    if (!int_in(mt, 1, INT32_MAX))
        return api_bad(e, "max_tokens", "'max_tokens' is required: an integer from 1 to %d", INT32_MAX);
    const cJSON *temp = cJSON_GetObjectItemCaseSensitive(body, "temperature");
    if (!is_null(temp) && (!cJSON_IsNumber(temp) || temp->valuedouble < 0 || temp->valuedouble > 1))
        return api_bad(e, "temperature", "'temperature' must be a number from 0 to 1");
    const cJSON *ss = cJSON_GetObjectItemCaseSensitive(body, "stop_sequences");
    if (!is_null(ss) && !cJSON_IsArray(ss))
        return api_bad(e, "stop_sequences", "'stop_sequences' must be a list of strings");
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(body, "metadata");
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(md, "user_id");
    if (!is_null(md) && (!cJSON_IsObject(md) || cJSON_GetArraySize(md) > 1 || (cJSON_GetArraySize(md) && !user) ||
                         (!is_null(user) && !cJSON_IsString(user))))
        return api_bad(e, "metadata", "'metadata' must be an object of one member, user_id, a string or null");
    /* a cache mark for the whole request: the prefix cache here needs none */
    const cJSON *cc = cJSON_GetObjectItemCaseSensitive(body, "cache_control");
    if (!is_null(cc) && !cJSON_IsObject(cc)) return api_bad(e, "cache_control", "'cache_control' must be an object");
    if (thinking_opts(body, opts, e) || context_management_check(body, e) || diagnostics_opts(body, opts, e))
        return MLA_ERR;
    cJSON *c = cJSON_CreateObject();
    if (tools_chat(body, c, &opts->eager_input, e) || messages_chat(body, c, e) || tool_choice_chat(body, c, e) ||
        output_config_chat(body, c, e)) {
        cJSON_Delete(c);
        return MLA_ERR;
    }
    cJSON_AddItemToObject(c, "max_completion_tokens", cJSON_Duplicate(mt, 1));
    static const char *const same[] = {"model", "stream", "temperature", "top_p", "top_k", NULL};
    for (int i = 0; same[i]; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(body, same[i]);
        if (j) cJSON_AddItemToObject(c, same[i], cJSON_Duplicate(j, 1));
    }
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(body, "stop_sequences");
    if (stop) cJSON_AddItemToObject(c, "stop", cJSON_Duplicate(stop, 1));
    if (cJSON_IsString(user)) cJSON_AddStringToObject(c, "user", user->valuestring);
    *chat = c;
    return MLA_OK;
}

/* A context error in Anthropic's words (which clients match to shorten a conversation) */
static void context_words(api_error *e) {
    if (!e->ctx_completion)
        snprintf(e->message, sizeof e->message, "prompt is too long: %d tokens > %d maximum", e->ctx_prompt,
                 e->ctx_limit);
    else
        snprintf(e->message, sizeof e->message,
                 "input length and `max_tokens` exceed context limit: %d + %d > %d, decrease input length or "
                 "`max_tokens` and try again", e->ctx_prompt, e->ctx_completion, e->ctx_limit);
}

void api_msg_error_names(api_error *e) {
    if (!strcmp(e->code, "context_length_exceeded")) context_words(e);
    static const char *const text[][2] = {{"max_completion_tokens", "max_tokens"},
                                          {"reasoning_effort", "output_config.effort"},
                                          {"response_format.json_schema.", "output_config.format."},
                                          {"response_format", "output_config.format"},
                                          {"chat_template_kwargs.", "thinking, as "}};
    static const char *const names[][2] = {{"messages", "messages"},
                                           {"max_completion_tokens", "max_tokens"},
                                           {"stop", "stop_sequences"},
                                           {"user", "metadata.user_id"},
                                           {"parallel_tool_calls", "tool_choice.disable_parallel_tool_use"},
                                           {"chat_template_kwargs", "thinking"},
                                           {"reasoning_effort", "output_config.effort"},
                                           {"response_format", "output_config.format"},
                                           {"continue_final_message", "messages"}};
    /* an index into messages is the chat messages' (system first, a tool message a tool_result) */
    api_error_rename(e, text, sizeof text / sizeof *text, names, sizeof names / sizeof *names,
                     strstr(e->message, "messages[") ? "messages, as the chat messages they make (system first, a "
                                                       "tool message a tool_result): "
                                                     : NULL);
}

cJSON *api_msg_object(const api_rsp_out *o, const char *id, const char *model, const char *stop_reason,
                      const char *stop_sequence, const api_rsp_usage *usage, const api_rsp_opts *diag) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "type", "message");
    cJSON_AddStringToObject(j, "role", "assistant");
    cJSON_AddStringToObject(j, "model", model);
    cJSON_AddItemToObject(j, "content", o ? api_rsp_blocks(o) : cJSON_CreateArray());
    if (stop_reason) cJSON_AddStringToObject(j, "stop_reason", stop_reason);
    else cJSON_AddNullToObject(j, "stop_reason");
    if (stop_sequence) cJSON_AddStringToObject(j, "stop_sequence", stop_sequence);
    else cJSON_AddNullToObject(j, "stop_sequence");
    cJSON_AddItemToObject(j, "usage", api_msg_usage(usage));
    if (diag && diag->diagnostics && !(diag->diagnostics == 2 && diag->miss_reason)) {
        cJSON_AddNullToObject(j, "diagnostics");
    } else if (diag && diag->diagnostics) {
        cJSON *why = cJSON_AddObjectToObject(cJSON_AddObjectToObject(j, "diagnostics"), "cache_miss_reason");
        cJSON_AddStringToObject(why, "type", diag->miss_reason);
        if (strstr(diag->miss_reason, "_changed"))
            cJSON_AddNumberToObject(why, "cache_missed_input_tokens", diag->miss_tokens);
    }
    return j;
}

cJSON *api_msg_usage(const api_rsp_usage *usage) {
    cJSON *u = cJSON_CreateObject();
    const int32_t cached = usage ? usage->cached : 0;
    cJSON_AddNumberToObject(u, "input_tokens", usage ? usage->input - cached : 0);
    cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", cached);
    cJSON_AddNumberToObject(u, "output_tokens", usage ? usage->output : 0);
    return u;
}
