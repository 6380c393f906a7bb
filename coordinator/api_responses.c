/* api_responses: see api_responses.h. */
#include "coordinator/api_responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "common/mla_err.h"
#include "coordinator/chat_json.h"

/* ---- the request ---- */

static bool is_null(const cJSON *j) { return !j || cJSON_IsNull(j); }

/* Members the translation reads, and those handed to the chat parser as they are (vLLM's
 * sampling extras, which the chat parser checks) */
static const char *const k_keys[] = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
                                     "max_output_tokens", "text", "reasoning", "stream", "store", "metadata",
                                     "truncation", "background", "include", "prompt_cache_key", "client_metadata",
                                     NULL};
static const char *const k_pass[] = {"temperature", "top_p", "top_k", "min_p", "seed", "stop", "repetition_penalty",
                                     "presence_penalty", "frequency_penalty", "chat_template_kwargs", "user", NULL};

#define API_RSP_MAX_METADATA 16 /* OpenAI's limits: 16 pairs, keys of 64 and values of 512 characters */
#define API_RSP_MAX_CACHE_KEY 1024 /* prompt_cache_key's bytes */
#define API_RSP_MAX_CLIENT_METADATA 64 /* client_metadata's members (keys and values as metadata's) */
#define API_RSP_MAX_NS_DESC (1 << 20) /* bytes of namespaces' descriptions, each as often as it has functions */

static int check_keys(const cJSON *body, api_error *e) {
    const cJSON *it;
    cJSON_ArrayForEach(it, body) {
        const char *k = it->string ? it->string : "";
        if (api_in_list(k_keys, k) || api_in_list(k_pass, k)) continue;
        if (!strcmp(k, "previous_response_id") || !strcmp(k, "conversation")) {
            if (is_null(it)) continue;
            return api_bad(e, k, "'%s': this server keeps no responses or conversations; send the whole input", k);
        }
        return api_bad(e, k,
                "'%.64s' is not supported by /v1/responses on this server (docs/openai-params.md lists the "
                         "parameters)", k);
    }
    return MLA_OK;
}

/* j (member param): null, or an object of at most max_n string values, keys of at most 64
 * characters and values of at most 512 (OpenAI's metadata) */
static int string_object(const cJSON *j, const char *param, int max_n, api_error *e) {
    if (is_null(j)) return MLA_OK;
    if (!cJSON_IsObject(j) || cJSON_GetArraySize(j) > max_n)
        return api_bad(e, param, "'%s' must be an object of at most %d string values", param, max_n);
    const cJSON *v;
    cJSON_ArrayForEach(v, j) {
        if (!cJSON_IsString(v)) return api_bad(e, param, "%s.%.64s must be a string", param, v->string);
        if (api_utf8_chars(v->string, strlen(v->string)) > 64 ||
            api_utf8_chars(v->valuestring, strlen(v->valuestring)) > 512)
            return api_bad(e, param, "%s: keys of at most 64 characters, values strings of at most 512", param);
    }
    return MLA_OK;
}

/* The stateless values of store, background and truncation; include, prompt_cache_key, metadata,
 * client_metadata */
static int check_stateless(const cJSON *body, api_rsp_opts *opts, api_error *e) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(body, "store");
    if (!is_null(j) && !cJSON_IsBool(j)) return api_bad(e, "store", "'store' must be a boolean");
    if (cJSON_IsTrue(j)) return api_bad(e, "store", "'store': this server keeps no responses (store must be false)");
    j = cJSON_GetObjectItemCaseSensitive(body, "background");
    if (!is_null(j) && !cJSON_IsBool(j)) return api_bad(e, "background", "'background' must be a boolean");
    if (cJSON_IsTrue(j)) return api_bad(e, "background", "'background': responses run in the foreground here");
    j = cJSON_GetObjectItemCaseSensitive(body, "truncation");
    if (!is_null(j) && (!cJSON_IsString(j) || strcmp(j->valuestring, "disabled")))
        return api_bad(e, "truncation", "'truncation' must be \"disabled\" (an input past the context is a 400)");
    j = cJSON_GetObjectItemCaseSensitive(body, "include");
    if (!is_null(j) && !cJSON_IsArray(j)) return api_bad(e, "include", "'include' must be a list of strings");
    const cJSON *v;
    const cJSON *list = cJSON_IsArray(j) ? j : NULL;
    cJSON_ArrayForEach(v, list) {
        if (!cJSON_IsString(v) || strcmp(v->valuestring, "reasoning.encrypted_content"))
            return api_bad(e, "include", "include: '%.64s' is not offered here (only reasoning.encrypted_content)",
                           cJSON_IsString(v) ? v->valuestring : "(not a string)");
        opts->encrypted = true;
    }
    /* a cache-routing hint: the one prefix cache here matches every request's prompt by content */
    j = cJSON_GetObjectItemCaseSensitive(body, "prompt_cache_key");
    if (!is_null(j) && (!cJSON_IsString(j) || strlen(j->valuestring) > API_RSP_MAX_CACHE_KEY))
        return api_bad(e, "prompt_cache_key", "'prompt_cache_key' must be a string of at most %d bytes",
                       API_RSP_MAX_CACHE_KEY);
    /* ids of the client's own (Codex CLI's installation, conversation, thread and turn, sent with
     * every request): nothing the answer depends on */
    if (string_object(cJSON_GetObjectItemCaseSensitive(body, "client_metadata"), "client_metadata",
                      API_RSP_MAX_CLIENT_METADATA, e) ||
        string_object(cJSON_GetObjectItemCaseSensitive(body, "metadata"), "metadata", API_RSP_MAX_METADATA, e))
        return MLA_ERR;
    return MLA_OK;
}

/* A reasoning item's encrypted_content: API_RSP_SEAL and the text in base64 (api_responses.h); the
 * text as the client sees it (CHAT_JSON_NUL, a NUL of the answer, as NUL) */
char *api_rsp_seal(const char *text, size_t n) {
    const size_t pre = sizeof API_RSP_SEAL - 1;
    char *s = mla_xmalloc(pre + 4 * ((n + 2) / 3) + 1);
    memcpy(s, API_RSP_SEAL, pre);
    size_t w = 0;
    unsigned char chunk[3 * 1024];
    for (size_t i = 0; i < n; i += sizeof chunk) { /* EVP_EncodeBlock takes an int: whole groups a call */
        const size_t m = n - i < sizeof chunk ? n - i : sizeof chunk;
        for (size_t k = 0; k < m; k++) chunk[k] = text[i + k] == CHAT_JSON_NUL ? 0 : (unsigned char)text[i + k];
        w += (size_t)EVP_EncodeBlock((unsigned char *)s + pre + w, chunk, (int)m);
    }
    s[pre + w] = 0;
    return s;
}

/* The text an encrypted_content of ours holds (NUL-terminated, the caller's), or NULL when it is
 * not one: another prefix, anything but whole groups of the base64 alphabet, text that is not
 * UTF-8 or holds a NUL (which a request's text cannot hold either) */
char *api_rsp_unseal(const char *s) {
    const size_t pre = sizeof API_RSP_SEAL - 1, n = strlen(s);
    if (n < pre || memcmp(s, API_RSP_SEAL, pre) || (n - pre) % 4) return NULL;
    const size_t m = n - pre;
    for (size_t i = pre; i < n; i++) /* EVP_DecodeBlock would trim whitespace */
        if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '+' || s[i] == '/' || s[i] == '='))
            return NULL;
    char *t = mla_xmalloc(m / 4 * 3 + 1);
    size_t w = 0;
    for (size_t i = 0; i < m; i += 4 * 1024) {
        const size_t k = m - i < 4 * 1024 ? m - i : 4 * 1024;
        const int r = EVP_DecodeBlock((unsigned char *)t + w, (const unsigned char *)s + pre + i, (int)k);
        if (r < 0) {
            free(t);
            return NULL;
        }
        w += (size_t)r;
    }
    /* EVP_DecodeBlock counts the padding's bytes as zeros: '=' only at the very end */
    const size_t pad = m && s[n - 1] == '=' ? (s[n - 2] == '=' ? 2 : 1) : 0;
    if (memchr(s + pre, '=', m - pad) || w < pad) {
        free(t);
        return NULL;
    }
    w -= pad;
    t[w] = 0;
    if (strlen(t) != w || api_utf8_invalid_at(t, w) >= 0) {
        free(t);
        return NULL;
    }
    return t;
}

/* A part's text: "text", a refusal's "refusal" */
static const cJSON *part_text(const cJSON *p) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
    const bool refusal = cJSON_IsString(ty) && !strcmp(ty->valuestring, "refusal");
    return cJSON_GetObjectItemCaseSensitive(p, refusal ? "refusal" : "text");
}

/* The text of a content list's parts (types in allowed), joined one a line, as the chat path
 * joins text parts; NULL with e set */
static char *parts_text(const cJSON *content, const char *where, const char *const *allowed, api_error *e) {
    if (cJSON_IsString(content)) return mla_xstrdup(content->valuestring);
    if (!cJSON_IsArray(content)) {
        api_bad(e, "input", "%s must be a string or a list of parts", where);
        return NULL;
    }
    size_t n = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, content) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *tx = part_text(p);
        if (!cJSON_IsObject(p) || !cJSON_IsString(ty) || !api_in_list(allowed, ty->valuestring)) {
            api_bad(e, "input", "%s: parts of type '%.64s' are not supported (this model reads text: %s%s%s)", where,
                cJSON_IsString(ty) ? ty->valuestring : "(none)", allowed[0], allowed[1] ? " or " : "",
                allowed[1] ? allowed[1] : "");
            return NULL;
        }
        if (!cJSON_IsString(tx)) {
            api_bad(e, "input", "%s: a %s part needs a string 'text'", where, ty->valuestring);
            return NULL;
        }
        n += strlen(tx->valuestring) + 1;
    }
    char *s = mla_xmalloc(n + 1), *w = s;
    cJSON_ArrayForEach(p, content) {
        const char *t = part_text(p)->valuestring;
        if (p != content->child) *w++ = '\n';
        size_t l = strlen(t);
        memcpy(w, t, l);
        w += l;
    }
    *w = 0;
    return s;
}

static const char *const k_in_parts[] = {"input_text", "output_text", NULL};
static const char *const k_assistant_parts[] = {"output_text", "refusal", "input_text", NULL};
static const char *const k_reasoning_parts[] = {"reasoning_text", NULL};
static const char *const k_summary_parts[] = {"summary_text", NULL};

/* Members of an input item beyond those read: an earlier output's own (id, status, phase), and
 * the optional members newer SDKs write out as null (namespace, caller, async) */
static int item_members(const cJSON *it, int i, const char *const *read, api_error *e) {
    static const char *const echo[] = {"id", "status", "phase", NULL};
    static const char *const if_null[] = {"namespace", "caller", "async", NULL};
    const cJSON *m;
    cJSON_ArrayForEach(m, it) {
        const char *k = m->string ? m->string : "";
        if (api_in_list(read, k) || api_in_list(echo, k) || (api_in_list(if_null, k) && cJSON_IsNull(m))) continue;
        return api_bad(e, "input", "input[%d].%.64s is not supported here", i, k);
    }
    return MLA_OK;
}

typedef struct tx_state {
    cJSON *msgs;
    cJSON *last_asst;     /* the assistant message the items just before made, which a call joins */
    api_join reasoning;   /* reasoning items' text, for the next assistant turn (s NULL: none) */
    api_refs calls;       /* the function calls' ids, which each output's call_id must name */
} tx_state;

static cJSON *assistant_turn(tx_state *t) {
    if (!t->last_asst) t->last_asst = api_chat_msg(t->msgs, "assistant", NULL);
    if (t->reasoning.s) {
        cJSON_AddStringToObject(t->last_asst, "reasoning_content", t->reasoning.s);
        free(t->reasoning.s);
        t->reasoning = (api_join){0};
    }
    return t->last_asst;
}

/* Reasoning with no assistant message or call after it (an answer that was its reasoning alone):
 * an assistant turn of its own, its content empty */
static void reasoning_turn(tx_state *t) {
    if (!t->reasoning.s) return;
    t->last_asst = NULL;
    cJSON_AddStringToObject(assistant_turn(t), "content", "");
    t->last_asst = NULL;
}

static int input_message(tx_state *t, const cJSON *it, int i, api_error *e) {
    static const char *const read[] = {"type", "role", "content", NULL};
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
    if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "system") &&
                                  strcmp(role->valuestring, "developer") && strcmp(role->valuestring, "assistant")))
        return api_bad(e, "input", "input[%d].role must be user, system, developer or assistant", i);
    if (item_members(it, i, read, e)) return MLA_ERR;
    char where[48];
    snprintf(where, sizeof where, "input[%d].content", i);
    const bool asst = !strcmp(role->valuestring, "assistant");
    char *text = parts_text(cJSON_GetObjectItemCaseSensitive(it, "content"), where,
                            asst ? k_assistant_parts : k_in_parts, e);
    if (!text) return MLA_ERR;
    if (asst) { /* a turn of its own, which the calls after it join */
        t->last_asst = NULL;
        cJSON_AddStringToObject(assistant_turn(t), "content", text);
    } else {
        reasoning_turn(t);
        api_chat_msg(t->msgs, role->valuestring, text);
        t->last_asst = NULL;
    }
    free(text);
    return MLA_OK;
}

/* A namespace's function in the chat form: NAMESPACE__NAME (the form Codex gives an MCP server's
 * tool, "mcp__server__tool"; the chat templates have no namespaces) */
#define API_RSP_NS_SEP "__"
static char *ns_name(const char *ns, const char *name) {
    const size_t n = strlen(ns) + sizeof API_RSP_NS_SEP + strlen(name);
    char *s = mla_xmalloc(n);
    snprintf(s, n, "%s" API_RSP_NS_SEP "%s", ns, name);
    return s;
}

static int input_call(tx_state *t, const cJSON *it, int i, api_error *e) {
    static const char *const read[] = {"type", "call_id", "name", "arguments", NULL};
    static const char *const read_ns[] = {"type", "call_id", "name", "arguments", "namespace", NULL};
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(it, "arguments");
    const cJSON *ns = cJSON_GetObjectItemCaseSensitive(it, "namespace");
    if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsString(args))
        return api_bad(e, "input", "input[%d]: a function_call needs strings call_id, name and arguments", i);
    if (!is_null(ns) && (!cJSON_IsString(ns) || !ns->valuestring[0]))
        return api_bad(e, "input", "input[%d].namespace must be a non-empty string", i);
    if (item_members(it, i, cJSON_IsString(ns) ? read_ns : read, e)) return MLA_ERR;
    api_refs_def(&t->calls, id->valuestring);
    cJSON *m = assistant_turn(t);
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (!calls) {
        calls = cJSON_AddArrayToObject(m, "tool_calls");
        if (!cJSON_GetObjectItemCaseSensitive(m, "content")) cJSON_AddNullToObject(m, "content");
    }
    char *flat = cJSON_IsString(ns) ? ns_name(ns->valuestring, name->valuestring) : NULL;
    api_chat_call(calls, id->valuestring, flat ? flat : name->valuestring, args->valuestring);
    free(flat);
    return MLA_OK;
}

#define API_RSP_UNSEEN_IMAGE "(an image, not shown: this model reads text only)"
#define API_RSP_UNSEEN_FILE "(a file, not shown: this model reads text only)"
static int input_call_output(tx_state *t, const cJSON *it, int i, api_error *e) {
    static const char *const read[] = {"type", "call_id", "output", NULL};
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id");
    if (!cJSON_IsString(id)) return api_bad(e, "input", "input[%d]: a function_call_output needs a string call_id", i);
    if (item_members(it, i, read, e)) return MLA_ERR;
    api_refs_ref(&t->calls, id->valuestring, i);
    reasoning_turn(t);
    char where[48];
    snprintf(where, sizeof where, "input[%d].output", i);
    static const char *const out_parts[] = {"input_text", NULL};
    /* an image or a file a tool returned (Codex CLI's view_image, an MCP tool's): this model reads
     * text, and the call's output stays in every later request's input, so it reads as a line that
     * says so instead of failing the rest of the conversation */
    const cJSON *out = cJSON_GetObjectItemCaseSensitive(it, "output");
    bool unseen = false; /* an image or file part, which a copy of the parts replaces */
    const cJSON *p, *parts = cJSON_IsArray(out) ? out : NULL;
    cJSON_ArrayForEach(p, parts) {
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(p, "type");
        const char *ty = cJSON_IsString(pt) ? pt->valuestring : "(none)";
        const bool img_file = !strcmp(ty, "input_image") || !strcmp(ty, "input_file");
        if (!img_file && strcmp(ty, "input_text"))
            return api_bad(e, "input", "%s: parts of type '%.64s' are not supported (input_text; input_image and "
                                       "input_file read as a line saying they are not shown)", where, ty);
        unseen |= img_file;
    }
    cJSON *shown = unseen ? cJSON_Duplicate(out, 1) : NULL;
    for (cJSON *q = shown ? shown->child : NULL; q; q = q->next) {
        const char *ty = cJSON_GetObjectItemCaseSensitive(q, "type")->valuestring;
        if (!strcmp(ty, "input_text")) continue;
        cJSON *np = cJSON_CreateObject();
        cJSON_AddStringToObject(np, "type", "input_text");
        cJSON_AddStringToObject(np, "text", !strcmp(ty, "input_image") ? API_RSP_UNSEEN_IMAGE : API_RSP_UNSEEN_FILE);
        cJSON_ReplaceItemViaPointer(shown, q, np);
        q = np;
    }
    char *text = parts_text(shown ? shown : out, where, out_parts, e);
    cJSON_Delete(shown);
    if (!text) return MLA_ERR;
    cJSON_AddStringToObject(api_chat_msg(t->msgs, "tool", text), "tool_call_id", id->valuestring);
    free(text);
    t->last_asst = NULL;
    return MLA_OK;
}

static int input_reasoning(tx_state *t, const cJSON *it, int i, api_error *e) {
    static const char *const read[] = {"type", "summary", "content", "encrypted_content", NULL};
    if (item_members(it, i, read, e)) return MLA_ERR;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(it, "summary");
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(it, "encrypted_content");
    if (cJSON_IsArray(c) && !cJSON_GetArraySize(c)) c = NULL; /* no text there: the sealed text's, or the summary's */
    char *text = NULL;
    if (!is_null(x) && (!cJSON_IsString(x) || !(text = api_rsp_unseal(x->valuestring))))
        return api_bad(e, "input", "input[%d].encrypted_content: not one this server wrote (it seals reasoning as "
                               "'" API_RSP_SEAL "' and base64; send the reasoning's text as content instead)", i);
    if (text && !is_null(c)) { /* the content's text first, as for an item without it */
        free(text);
        text = NULL;
    }
    if (!text) {
        char where[48];
        snprintf(where, sizeof where, "input[%d].%s", i, is_null(c) ? "summary" : "content");
        text = parts_text(is_null(c) ? s : c, where, is_null(c) ? k_summary_parts : k_reasoning_parts, e);
    }
    if (!text) return MLA_ERR;
    api_join_add(&t->reasoning, text); /* items in a row: one turn's reasoning, a line apart */
    free(text);
    t->last_asst = NULL; /* it opens the next assistant turn */
    return MLA_OK;
}

static int input_messages(const cJSON *body, cJSON *msgs, api_error *e) {
    const cJSON *instr = cJSON_GetObjectItemCaseSensitive(body, "instructions");
    if (!is_null(instr)) {
        if (!cJSON_IsString(instr)) return api_bad(e, "instructions", "'instructions' must be a string");
        api_chat_msg(msgs, "system", instr->valuestring);
    }
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(body, "input");
    if (cJSON_IsString(in)) {
        api_chat_msg(msgs, "user", in->valuestring);
        return MLA_OK;
    }
    if (!cJSON_IsArray(in) || !cJSON_GetArraySize(in))
        return api_bad(e, "input", "'input' must be a string or a list of items that is not empty");
    tx_state t = {.msgs = msgs};
    int i = 0, rc = MLA_OK;
    const cJSON *it;
    cJSON_ArrayForEach(it, in) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
        if (!cJSON_IsObject(it)) rc = api_bad(e, "input", "input[%d] must be an object", i);
        else if (is_null(ty) || (cJSON_IsString(ty) && !strcmp(ty->valuestring, "message")))
            rc = input_message(&t, it, i, e);
        else if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "function_call")) rc = input_call(&t, it, i, e);
        else if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "function_call_output"))
            rc = input_call_output(&t, it, i, e);
        else if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "reasoning")) rc = input_reasoning(&t, it, i, e);
        else
            rc = api_bad(e, "input", "input[%d]: items of type '%.64s' are not supported (message, function_call, "
                                 "function_call_output or reasoning)", i,
                     cJSON_IsString(ty) ? ty->valuestring : "(not a string)");
        if (rc) break;
        i++;
    }
    if (!rc) reasoning_turn(&t);
    /* each function_call_output names a function_call of the input */
    const int k = rc ? -1 : api_refs_missing(&t.calls);
    if (k >= 0)
        rc = api_bad(e, "input", "input[%d]: call_id '%.64s' names no function_call of the input", t.calls.ref_at[k],
                     t.calls.refs[k]);
    free(t.reasoning.s);
    api_refs_free(&t.calls);
    return rc;
}

/* A function tool {"type": "function", "name", "description"?, "parameters"?, "strict"?} (at
 * where) in the chat form, named ns__name in namespace ns (NULL: none) whose description nd (NULL:
 * none) goes before its own; NULL with e set */
static cJSON *function_chat(const cJSON *t, const char *where, const char *ns, const char *nd, api_error *e) {
    cJSON *fn = cJSON_CreateObject();
    const cJSON *m;
    cJSON_ArrayForEach(m, t) {
        const char *k = m->string ? m->string : "";
        if (!strcmp(k, "type")) continue;
        if (strcmp(k, "name") && strcmp(k, "description") && strcmp(k, "parameters") && strcmp(k, "strict")) {
            cJSON_Delete(fn);
            api_bad(e, "tools", "%s.%.64s is not supported (type, name, description, parameters, strict)", where, k);
            return NULL;
        }
        cJSON_AddItemToObject(fn, k, cJSON_Duplicate(m, 1));
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(t, "description");
    if (!cJSON_IsString(name) || !name->valuestring[0] || (!is_null(desc) && !cJSON_IsString(desc))) {
        cJSON_Delete(fn);
        api_bad(e, "tools", "%s needs a non-empty string name (and a string description)", where);
        return NULL;
    }
    if (ns) {
        char *flat = ns_name(ns, name->valuestring);
        cJSON_ReplaceItemInObjectCaseSensitive(fn, "name", cJSON_CreateString(flat));
        free(flat);
        if (nd && *nd) {
            const char *own = cJSON_IsString(desc) ? desc->valuestring : "";
            const size_t n = strlen(nd) + 2 + strlen(own) + 1;
            char *d = mla_xmalloc(n);
            snprintf(d, n, *own ? "%s\n\n%s" : "%s", nd, own);
            if (desc) cJSON_ReplaceItemInObjectCaseSensitive(fn, "description", cJSON_CreateString(d));
            else cJSON_AddStringToObject(fn, "description", d);
            free(d);
        }
    }
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddItemToObject(c, "function", fn);
    return c;
}

/* The functions tools lists, a namespace's counted one by one, and the bytes of their namespaces'
 * descriptions as often as the chat form repeats them: checked before anything is copied */
static int tools_size(const cJSON *tools, api_error *e) {
    int n = 0;
    size_t desc = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *inner = cJSON_GetObjectItemCaseSensitive(t, "tools");
        const cJSON *nd = cJSON_GetObjectItemCaseSensitive(t, "description");
        const int k = cJSON_IsString(ty) && !strcmp(ty->valuestring, "namespace") && cJSON_IsArray(inner)
                          ? cJSON_GetArraySize(inner)
                          : 1;
        if (k > API_MAX_TOOLS - n)
            return api_bad(e, "tools", "at most %d tools are supported, a namespace's functions counted one by one",
                           API_MAX_TOOLS);
        n += k;
        if (k > 1 && cJSON_IsString(nd)) desc += (size_t)k * strlen(nd->valuestring);
    }
    if (desc > API_RSP_MAX_NS_DESC)
        return api_bad(e, "tools", "the namespaces' descriptions, each before every one of its functions' own, come to "
                               "%zu bytes: at most %d", desc, API_RSP_MAX_NS_DESC);
    return MLA_OK;
}

/* Is the name of chat tool k (out's last, made from the tool at at[k]; ns: a NAMESPACE__NAME) one a
 * call can give and no earlier tool's? The errors in the request's own terms. */
static int tool_name_ok(const cJSON *out, int k, const char (*at)[128], bool ns, api_error *e) {
    const cJSON *c = cJSON_GetArrayItem(out, k);
    const char *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "function"), "name")
                        ->valuestring;
    const char *flat = ns ? " (its namespace's name, '" API_RSP_NS_SEP "' and its own)" : "";
    if (strlen(n) > API_MAX_TOOL_NAME)
        return api_bad(e, "tools", "%s.name%s is %zu bytes: at most %d", at[k], flat, strlen(n), API_MAX_TOOL_NAME);
    if (!toolcall_name_ok(n))
        return api_bad(e, "tools", "%s.name '%.64s' holds whitespace, a control character or '<', where a model's "
                               "call format ends a name", at[k], n);
    for (int j = 0; j < k; j++) { /* two tools of one name: which one a call means would be a guess */
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(out, j), "function");
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring, n))
            return api_bad(e, "tools", "%s.name '%.64s'%s is %s's too", at[k], n, flat, at[j]);
    }
    return MLA_OK;
}

/* tools: function tools, and namespaces of them ({"type": "namespace", "name", "description"?,
 * "tools": [function tools]}: each function as chat's NAMESPACE__NAME, the namespace's
 * description before its own), in the chat form */
static int tools_chat(const cJSON *body, cJSON *chat, api_error *e) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
    if (!is_null(tools) && !cJSON_IsArray(tools)) return api_bad(e, "tools", "'tools' must be a list");
    if (!is_null(tools) && tools_size(tools, e)) return MLA_ERR;
    cJSON *out = is_null(tools) ? NULL : cJSON_AddArrayToObject(chat, "tools");
    char at[API_MAX_TOOLS][128]; /* where each chat tool came from */
    int i = 0, k = 0;
    const cJSON *t, *list = out ? tools : NULL;
    cJSON_ArrayForEach(t, list) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
        const bool ns = cJSON_IsString(ty) && !strcmp(ty->valuestring, "namespace");
        if (!cJSON_IsObject(t) || !cJSON_IsString(ty) || (strcmp(ty->valuestring, "function") && !ns))
            return api_bad(e, "tools", "tools[%d]: tools of type '%.64s' are not served here, only function tools "
                                   "and namespaces of them%s", i,
                           cJSON_IsString(ty) ? ty->valuestring : !cJSON_IsObject(t) ? "(not an object)" : "(none)",
                           cJSON_IsString(ty) && !strcmp(ty->valuestring, "web_search")
                               ? " (Codex CLI: web_search = \"disabled\" in its config.toml)"
                               : "");
        char where[96];
        snprintf(where, sizeof where, "tools[%d]", i++);
        if (!ns) {
            cJSON *c = function_chat(t, where, NULL, NULL, e);
            if (!c) return MLA_ERR;
            cJSON_AddItemToArray(out, c);
            snprintf(at[k], sizeof at[k], "%s", where);
            if (tool_name_ok(out, k++, at, false, e)) return MLA_ERR;
            continue;
        }
        static const char *const read[] = {"type", "name", "description", "tools", NULL};
        const cJSON *nn = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *nd = cJSON_GetObjectItemCaseSensitive(t, "description");
        const cJSON *inner = cJSON_GetObjectItemCaseSensitive(t, "tools");
        if (!cJSON_IsString(nn) || !nn->valuestring[0] || (!is_null(nd) && !cJSON_IsString(nd)) ||
            !cJSON_IsArray(inner))
            return api_bad(e, "tools", "%s: a namespace needs a string name, a list of tools (and a string "
                                   "description)", where);
        const cJSON *m;
        cJSON_ArrayForEach(m, t) {
            if (!api_in_list(read, m->string ? m->string : ""))
                return api_bad(e, "tools", "%s.%.64s is not supported (type, name, description, tools)", where,
                               m->string ? m->string : "");
        }
        int j = 0;
        const cJSON *f;
        cJSON_ArrayForEach(f, inner) {
            snprintf(at[k], sizeof at[k], "%s.tools[%d]", where, j++);
            const cJSON *fty = cJSON_GetObjectItemCaseSensitive(f, "type");
            if (!cJSON_IsObject(f) || !cJSON_IsString(fty) || strcmp(fty->valuestring, "function"))
                return api_bad(e, "tools", "%s: a namespace holds function tools only", at[k]);
            cJSON *c = function_chat(f, at[k], nn->valuestring, cJSON_IsString(nd) ? nd->valuestring : NULL, e);
            if (!c) return MLA_ERR;
            cJSON_AddItemToArray(out, c);
            if (tool_name_ok(out, k++, at, true, e)) return MLA_ERR;
        }
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(body, "tool_choice");
    /* no tools: "auto" and "none" choose nothing (Codex CLI's compaction turn sends "auto" with an
     * empty list); "required" or a named one still needs tools (the chat parser's 400) */
    if (!cJSON_GetArraySize(out) && cJSON_IsString(tc) && (!strcmp(tc->valuestring, "auto") ||
                                                           !strcmp(tc->valuestring, "none")))
        return MLA_OK;
    if (cJSON_IsString(tc)) {
        cJSON_AddStringToObject(chat, "tool_choice", tc->valuestring);
    } else if (cJSON_IsObject(tc)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(tc, "name");
        const cJSON *ns = cJSON_GetObjectItemCaseSensitive(tc, "namespace"); /* a namespace's function */
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(nm) ||
            (ns && (!cJSON_IsString(ns) || !ns->valuestring[0])) || cJSON_GetArraySize(tc) != (ns ? 3 : 2))
            return api_bad(e, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                                         "{\"type\": \"function\", \"name\": ..., \"namespace\"?: ...}");
        cJSON *o = cJSON_AddObjectToObject(chat, "tool_choice");
        cJSON_AddStringToObject(o, "type", "function");
        char *flat = ns ? ns_name(ns->valuestring, nm->valuestring) : NULL;
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "function"), "name", flat ? flat : nm->valuestring);
        free(flat);
    } else if (!is_null(tc)) {
        return api_bad(e, "tool_choice", "'tool_choice' must be a string or an object");
    }
    return MLA_OK;
}

/* text: {"format": {"type": "text" | "json_object" | "json_schema", ...}} as a response_format */
static int format_chat(const cJSON *body, cJSON *chat, api_error *e) {
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(body, "text");
    if (is_null(text)) return MLA_OK;
    const cJSON *m;
    if (!cJSON_IsObject(text)) return api_bad(e, "text", "'text' must be an object");
    cJSON_ArrayForEach(m, text) {
        if (strcmp(m->string, "format"))
            return api_bad(e, "text", "text.%.64s is not supported here (text.format is)", m->string);
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(text, "format");
    if (is_null(f)) return MLA_OK;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(f, "type");
    if (!cJSON_IsObject(f) || !cJSON_IsString(ty))
        return api_bad(e, "text.format", "text.format must be an object with a string 'type'");
    if (!strcmp(ty->valuestring, "text")) return cJSON_GetArraySize(f) == 1 ? MLA_OK : api_bad(e, "text.format",
                                                         "text.format of type text has no other members");
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    if (!strcmp(ty->valuestring, "json_object")) {
        if (cJSON_GetArraySize(f) != 1) return api_bad(e, "text.format", "text.format of type json_object has no "
                                                                     "other members");
        cJSON_AddStringToObject(rf, "type", "json_object");
        return MLA_OK;
    }
    if (strcmp(ty->valuestring, "json_schema"))
        return api_bad(e, "text.format", "text.format.type must be text, json_object or json_schema");
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    cJSON_ArrayForEach(m, f) {
        if (!strcmp(m->string, "type")) continue;
        if (strcmp(m->string, "name") && strcmp(m->string, "schema") && strcmp(m->string, "strict") &&
            strcmp(m->string, "description"))
            return api_bad(e, "text.format", "text.format.%.64s is not supported (name, schema, strict, description)",
                       m->string);
        cJSON_AddItemToObject(js, m->string, cJSON_Duplicate(m, 1));
    }
    return MLA_OK;
}

static int reasoning_chat(const cJSON *body, cJSON *chat, api_rsp_opts *opts, api_error *e) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(body, "reasoning");
    if (is_null(r)) return MLA_OK;
    if (!cJSON_IsObject(r)) return api_bad(e, "reasoning", "'reasoning' must be an object");
    const cJSON *m;
    cJSON_ArrayForEach(m, r) {
        if (!strcmp(m->string, "effort")) {
            if (cJSON_IsString(m)) cJSON_AddStringToObject(chat, "reasoning_effort", m->valuestring);
            else if (!cJSON_IsNull(m)) return api_bad(e, "reasoning.effort", "reasoning.effort must be a string");
        } else if (!strcmp(m->string, "summary") || !strcmp(m->string, "generate_summary")) {
            /* no summarizer here: a summary asked for is the reasoning whole; summary, where the
             * request has it, over the older generate_summary (as the answer repeats it) */
            if (!strcmp(m->string, "generate_summary") && cJSON_GetObjectItemCaseSensitive(r, "summary")) continue;
            static const char *const kinds[] = {"auto", "concise", "detailed", NULL};
            if (cJSON_IsString(m) && api_in_list(kinds, m->valuestring)) opts->summary = true;
            else if (!cJSON_IsNull(m) && !(cJSON_IsString(m) && !strcmp(m->valuestring, "none")))
                return api_bad(e, "reasoning.summary", "reasoning.%s must be auto, concise, detailed, none or null",
                               m->string);
        } else {
            return api_bad(e, "reasoning", "reasoning.%.64s is not supported (effort, summary)", m->string);
        }
    }
    return MLA_OK;
}

/* echo: what the response object repeats, each with its default */
static cJSON *make_echo(const cJSON *body) {
    cJSON *o = cJSON_CreateObject();
    static const char *const null_default[] = {"instructions", "max_output_tokens", "temperature", "top_p", "user",
                                               "prompt_cache_key", NULL};
    for (int i = 0; null_default[i]; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(body, null_default[i]);
        cJSON_AddItemToObject(o, null_default[i], j ? cJSON_Duplicate(j, 1) : cJSON_CreateNull());
    }
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(body, "tools");
    cJSON_AddItemToObject(o, "tools", is_null(j) ? cJSON_CreateArray() : cJSON_Duplicate(j, 1));
    j = cJSON_GetObjectItemCaseSensitive(body, "tool_choice");
    cJSON_AddItemToObject(o, "tool_choice", is_null(j) ? cJSON_CreateString("auto") : cJSON_Duplicate(j, 1));
    j = cJSON_GetObjectItemCaseSensitive(body, "parallel_tool_calls");
    cJSON_AddBoolToObject(o, "parallel_tool_calls", !cJSON_IsFalse(j));
    j = cJSON_GetObjectItemCaseSensitive(body, "metadata");
    cJSON_AddItemToObject(o, "metadata", is_null(j) ? cJSON_CreateObject() : cJSON_Duplicate(j, 1));
    j = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(body, "text"), "format");
    cJSON *fmt = is_null(j) ? cJSON_CreateObject() : cJSON_Duplicate(j, 1);
    if (is_null(j)) cJSON_AddStringToObject(fmt, "type", "text");
    cJSON_AddItemToObject(cJSON_AddObjectToObject(o, "text"), "format", fmt);
    cJSON *r = cJSON_AddObjectToObject(o, "reasoning");
    const cJSON *asked = cJSON_GetObjectItemCaseSensitive(body, "reasoning");
    j = cJSON_GetObjectItemCaseSensitive(asked, "effort");
    cJSON_AddItemToObject(r, "effort", j ? cJSON_Duplicate(j, 1) : cJSON_CreateNull());
    j = cJSON_GetObjectItemCaseSensitive(asked, "summary");
    if (!j) j = cJSON_GetObjectItemCaseSensitive(asked, "generate_summary");
    cJSON_AddItemToObject(r, "summary", j ? cJSON_Duplicate(j, 1) : cJSON_CreateNull());
    cJSON_AddStringToObject(o, "truncation", "disabled");
    cJSON_AddBoolToObject(o, "store", false);
    cJSON_AddBoolToObject(o, "background", false);
    cJSON_AddNullToObject(o, "previous_response_id");
    return o;
}

int api_rsp_parse(const cJSON *body, cJSON **chat, cJSON **echo, api_rsp_opts *opts, api_error *e) {
    *chat = *echo = NULL;
    memset(opts, 0, sizeof *opts);
    if (!cJSON_IsObject(body)) return api_bad(e, NULL, "the request body must be a JSON object");
    if (check_keys(body, e) || check_stateless(body, opts, e)) return MLA_ERR;
    cJSON *c = cJSON_CreateObject();
    cJSON *msgs = cJSON_AddArrayToObject(c, "messages");
    if (input_messages(body, msgs, e) || tools_chat(body, c, e) || format_chat(body, c, e) ||
        reasoning_chat(body, c, opts, e)) {
        cJSON_Delete(c);
        return MLA_ERR;
    }
    static const char *const same[] = {"model", "stream", "parallel_tool_calls", NULL};
    for (int i = 0; same[i]; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(body, same[i]);
        if (j) cJSON_AddItemToObject(c, same[i], cJSON_Duplicate(j, 1));
    }
    for (int i = 0; k_pass[i]; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(body, k_pass[i]);
        if (j) cJSON_AddItemToObject(c, k_pass[i], cJSON_Duplicate(j, 1));
    }
    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(body, "max_output_tokens");
    if (mo) cJSON_AddItemToObject(c, "max_completion_tokens", cJSON_Duplicate(mo, 1));
    *chat = c;
    *echo = make_echo(body);
    return MLA_OK;
}

void api_rsp_error_names(api_error *e) {
    /* the chat body's names in the message, longest first; a call's members are flat here */
    static const char *const text[][2] = {{"response_format.json_schema.", "text.format."},
                                          {"response_format", "text.format"},
                                          {"max_completion_tokens", "max_output_tokens"},
                                          {"reasoning_effort", "reasoning.effort"},
                                          {"].function.", "]."}};
    static const char *const names[][2] = {{"messages", "input"},
                                           {"max_completion_tokens", "max_output_tokens"},
                                           {"response_format", "text.format"},
                                           {"reasoning_effort", "reasoning.effort"}};
    api_error_rename(e, text, sizeof text / sizeof *text, names, sizeof names / sizeof *names,
                     "input, as the chat messages it makes: ");
}

/* ---- the answer ---- */

void api_rsp_out_init(api_rsp_out *o, const char *resp_id, const api_rsp_opts *opts) {
    memset(o, 0, sizeof *o);
    snprintf(o->resp_id, sizeof o->resp_id, "%s", resp_id);
    if (opts) o->opts = *opts;
    o->open = -1;
}

void api_rsp_out_tools(api_rsp_out *o, const cJSON *tools) { o->tools = cJSON_IsArray(tools) ? tools : NULL; }

/* A call's name as the answer gives it: a namespace's function (NAMESPACE__NAME, api_rsp_out_tools)
 * its NAME, *ns the namespace; else the name, *ns NULL */
static const char *call_name(const api_rsp_out *o, const char *flat, const char **ns) {
    *ns = NULL;
    const cJSON *t;
    cJSON_ArrayForEach(t, o->tools) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *nn = cJSON_GetObjectItemCaseSensitive(t, "name");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "namespace") || !cJSON_IsString(nn)) continue;
        const size_t l = strlen(nn->valuestring);
        if (strncmp(flat, nn->valuestring, l) || strncmp(flat + l, API_RSP_NS_SEP, sizeof API_RSP_NS_SEP - 1))
            continue;
        const char *rest = flat + l + sizeof API_RSP_NS_SEP - 1;
        const cJSON *f;
        cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(t, "tools")) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(f, "name");
            if (cJSON_IsString(fn) && !strcmp(fn->valuestring, rest)) {
                *ns = nn->valuestring;
                return rest;
            }
        }
    }
    return flat;
}

void api_rsp_out_free(api_rsp_out *o) {
    for (int i = 0; i < o->n_items; i++) {
        free(o->items[i].text);
        free(o->items[i].name);
        free(o->items[i].call_id);
    }
    free(o->items);
    memset(o, 0, sizeof *o);
}

cJSON *api_rsp_event(api_rsp_out *o, const char *type) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "type", type);
    if (!o->opts.messages) cJSON_AddNumberToObject(j, "sequence_number", o->seq++);
    return j;
}

static const char *item_status(const api_rsp_item *it) {
    return !it->done ? "in_progress" : it->incomplete ? "incomplete" : "completed";
}

static cJSON *summary_part(const char *text) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "summary_text");
    cJSON_AddStringToObject(p, "text", text);
    return p;
}

/* The item as its events and the response object show it (o's options); status NULL: its own */
static cJSON *item_json(const api_rsp_out *o, const api_rsp_item *it, const char *status) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", it->id);
    const char *t = it->text ? it->text : "";
    switch (it->kind) {
    case API_RSP_REASONING: {
        cJSON_AddStringToObject(j, "type", "reasoning");
        cJSON *s = cJSON_AddArrayToObject(j, "summary");
        cJSON *c = cJSON_AddArrayToObject(j, "content");
        if (it->done || it->len) {
            cJSON *p = cJSON_CreateObject();
            cJSON_AddStringToObject(p, "type", "reasoning_text");
            cJSON_AddStringToObject(p, "text", t);
            cJSON_AddItemToArray(c, p);
            if (o->opts.summary) cJSON_AddItemToArray(s, summary_part(t));
        }
        if (o->opts.encrypted && (it->done || status)) { /* done, or cut off in a failed answer */
            char *x = api_rsp_seal(t, it->len);
            cJSON_AddStringToObject(j, "encrypted_content", x);
            free(x);
        } else if (o->opts.encrypted) {
            cJSON_AddNullToObject(j, "encrypted_content");
        }
        break;
    }
    case API_RSP_MESSAGE: {
        cJSON_AddStringToObject(j, "type", "message");
        cJSON_AddStringToObject(j, "role", "assistant");
        cJSON *c = cJSON_AddArrayToObject(j, "content");
        if (it->done || it->len) {
            cJSON *p = cJSON_CreateObject();
            cJSON_AddStringToObject(p, "type", "output_text");
            cJSON_AddStringToObject(p, "text", t);
            cJSON_AddArrayToObject(p, "annotations");
            cJSON_AddArrayToObject(p, "logprobs");
            cJSON_AddItemToArray(c, p);
        }
        break;
    }
    case API_RSP_CALL: {
        const char *ns, *name = call_name(o, it->name, &ns);
        cJSON_AddStringToObject(j, "type", "function_call");
        cJSON_AddStringToObject(j, "call_id", it->call_id);
        cJSON_AddStringToObject(j, "name", name);
        if (ns) cJSON_AddStringToObject(j, "namespace", ns);
        cJSON_AddStringToObject(j, "arguments", t);
        break;
    }
    }
    cJSON_AddStringToObject(j, "status", status ? status : item_status(it));
    return j;
}

static void emit_free(api_rsp_emit emit, void *ud, cJSON *ev) {
    emit(ud, cJSON_GetObjectItemCaseSensitive(ev, "type")->valuestring, ev);
    cJSON_Delete(ev);
}

/* An event about item k: type, item_id, output_index (and content_index for its part) */
static cJSON *item_event(api_rsp_out *o, const char *type, int k, bool part) {
    cJSON *ev = api_rsp_event(o, type);
    cJSON_AddStringToObject(ev, "item_id", o->items[k].id);
    cJSON_AddNumberToObject(ev, "output_index", k);
    if (part) cJSON_AddNumberToObject(ev, "content_index", 0);
    return ev;
}

/* Whether item k's events include its summary part's (a reasoning item, summary asked) */
static bool has_summary(const api_rsp_out *o, int k) {
    return o->opts.summary && o->items[k].kind == API_RSP_REASONING;
}

/* A summary event of item k: its one part, index 0; text: the member named member (NULL: none) */
static void summary_event(api_rsp_out *o, const char *type, int k, const char *member, const char *text,
                          api_rsp_emit emit, void *ud) {
    cJSON *ev = item_event(o, type, k, false);
    cJSON_AddNumberToObject(ev, "summary_index", 0);
    if (member && !strcmp(member, "part")) cJSON_AddItemToObject(ev, "part", summary_part(text));
    else if (member) cJSON_AddStringToObject(ev, member, text);
    emit_free(emit, ud, ev);
}

static cJSON *part_json(const api_rsp_item *it, const char *text) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", it->kind == API_RSP_REASONING ? "reasoning_text" : "output_text");
    cJSON_AddStringToObject(p, "text", text);
    if (it->kind == API_RSP_MESSAGE) {
        cJSON_AddArrayToObject(p, "annotations");
        cJSON_AddArrayToObject(p, "logprobs");
    }
    return p;
}

/* ---- the same items as an Anthropic Messages answer's content blocks ---- */

/* A call's input where its arguments are one JSON object and nothing after it, else {}: their own
 * text (a \u0000 in it stays one, where a parsed copy would end its string there), or where it
 * holds a control character (which cJSON takes raw inside a string, and strict parsers refuse)
 * the parsed copy, printed anew */
static cJSON *call_input(const char *t) {
    cJSON *in = cJSON_ParseWithOpts(t, NULL, 1);
    if (!cJSON_IsObject(in)) {
        cJSON_Delete(in);
        return cJSON_CreateObject();
    }
    for (const char *p = t; *p; p++)
        if ((unsigned char)*p < 0x20) return in;
    cJSON_Delete(in);
    return cJSON_CreateRaw(t);
}

/* Item k as a content block: thinking (its signature the text sealed, which comes back as the
 * text; the text itself "" where its display is omitted), text, or tool_use (its input
 * call_input's; {} until whole) */
static cJSON *block_json(const api_rsp_out *o, const api_rsp_item *it, bool whole) {
    cJSON *j = cJSON_CreateObject();
    const char *t = whole && it->text ? it->text : "";
    switch (it->kind) {
    case API_RSP_REASONING: {
        cJSON_AddStringToObject(j, "type", "thinking");
        cJSON_AddStringToObject(j, "thinking", o->opts.omit_thinking ? "" : t);
        char *sig = whole ? api_rsp_seal(t, it->len) : NULL;
        cJSON_AddStringToObject(j, "signature", sig ? sig : "");
        free(sig);
        break;
    }
    case API_RSP_MESSAGE:
        cJSON_AddStringToObject(j, "type", "text");
        cJSON_AddStringToObject(j, "text", t);
        break;
    case API_RSP_CALL: {
        cJSON_AddStringToObject(j, "type", "tool_use");
        cJSON_AddStringToObject(j, "id", it->call_id);
        cJSON_AddStringToObject(j, "name", it->name);
        cJSON_AddItemToObject(j, "input", whole ? call_input(t) : cJSON_CreateObject());
        break;
    }
    }
    return j;
}

static void block_event(api_rsp_out *o, const char *type, int k, cJSON *member_of, const char *name, api_rsp_emit emit,
                        void *ud) {
    cJSON *ev = api_rsp_event(o, type);
    cJSON_AddNumberToObject(ev, "index", k);
    if (member_of) cJSON_AddItemToObject(ev, name, member_of);
    emit_free(emit, ud, ev);
}

static void block_delta(api_rsp_out *o, int k, const char *d, api_rsp_emit emit, void *ud) {
    static const char *const type[] = {"thinking_delta", "text_delta", "input_json_delta"};
    static const char *const member[] = {"thinking", "text", "partial_json"};
    const enum api_rsp_item_kind kind = o->items[k].kind;
    cJSON *delta = cJSON_CreateObject();
    cJSON_AddStringToObject(delta, "type", type[kind]);
    cJSON_AddStringToObject(delta, member[kind], d);
    block_event(o, "content_block_delta", k, delta, "delta", emit, ud);
}

cJSON *api_rsp_blocks(const api_rsp_out *o) {
    cJSON *a = cJSON_CreateArray();
    for (int k = 0; k < o->n_items; k++) cJSON_AddItemToArray(a, block_json(o, &o->items[k], true));
    return a;
}

static void item_open(api_rsp_out *o, enum api_rsp_item_kind kind, const toolcall *c, int call, api_rsp_emit emit,
                      void *ud) {
    if (o->n_items == o->cap_items) {
        o->cap_items = o->cap_items ? 2 * o->cap_items : 4;
        o->items = mla_xrealloc(o->items, (size_t)o->cap_items * sizeof *o->items);
    }
    const int k = o->n_items++;
    api_rsp_item *it = &o->items[k];
    memset(it, 0, sizeof *it);
    it->kind = kind;
    const char *base = strncmp(o->resp_id, "resp_", 5) ? o->resp_id : o->resp_id + 5;
    static const char *const prefix[] = {"rs", "msg", "fc"};
    snprintf(it->id, sizeof it->id, "%s_%s_%d", prefix[kind], base, k);
    if (kind == API_RSP_CALL) {
        size_t n;
        it->name = api_json_text(c->name, strlen(c->name), &n);
        char ours[96];
        snprintf(ours, sizeof ours, "call_%s_%d", base, call);
        it->call_id = c->id ? api_json_text(c->id, strlen(c->id), &n) : mla_xstrdup(ours);
        it->call = call;
    }
    o->open = k;
    if (!emit) return;
    if (o->opts.messages) {
        block_event(o, "content_block_start", k, block_json(o, it, false), "content_block", emit, ud);
        return;
    }
    cJSON *ev = api_rsp_event(o, "response.output_item.added");
    cJSON_AddNumberToObject(ev, "output_index", k);
    cJSON_AddItemToObject(ev, "item", item_json(o, it, NULL));
    emit_free(emit, ud, ev);
    if (kind == API_RSP_CALL) return;
    ev = item_event(o, "response.content_part.added", k, true);
    cJSON_AddItemToObject(ev, "part", part_json(it, ""));
    emit_free(emit, ud, ev);
    if (has_summary(o, k)) summary_event(o, "response.reasoning_summary_part.added", k, "part", "", emit, ud);
}

static void item_close(api_rsp_out *o, bool incomplete, api_rsp_emit emit, void *ud) {
    const int k = o->open;
    if (k < 0) return;
    api_rsp_item *it = &o->items[k];
    it->done = true;
    it->incomplete = incomplete || (it->kind == API_RSP_CALL && !it->whole);
    o->open = -1;
    if (!emit) return;
    if (o->opts.messages) {
        if (it->kind == API_RSP_REASONING) { /* the signature last, as Anthropic's stream gives it */
            cJSON *d = cJSON_CreateObject();
            char *sig = api_rsp_seal(it->text ? it->text : "", it->len);
            cJSON_AddStringToObject(d, "type", "signature_delta");
            cJSON_AddStringToObject(d, "signature", sig);
            free(sig);
            block_event(o, "content_block_delta", k, d, "delta", emit, ud);
        } else if (it->kind == API_RSP_CALL && !o->opts.eager_input) { /* the input whole, as the block has it */
            cJSON *in = call_input(it->text ? it->text : "");
            char *s = cJSON_PrintUnformatted(in);
            block_delta(o, k, s, emit, ud);
            cJSON_free(s);
            cJSON_Delete(in);
        }
        block_event(o, "content_block_stop", k, NULL, NULL, emit, ud);
        return;
    }
    const char *t = it->text ? it->text : "";
    cJSON *ev;
    if (it->kind == API_RSP_CALL) {
        ev = item_event(o, "response.function_call_arguments.done", k, false);
        const char *ns;
        cJSON_AddStringToObject(ev, "name", call_name(o, it->name, &ns));
        cJSON_AddStringToObject(ev, "arguments", t);
        emit_free(emit, ud, ev);
    } else {
        const bool r = it->kind == API_RSP_REASONING;
        ev = item_event(o, r ? "response.reasoning_text.done" : "response.output_text.done", k, true);
        cJSON_AddStringToObject(ev, "text", t);
        if (!r) cJSON_AddArrayToObject(ev, "logprobs");
        emit_free(emit, ud, ev);
        ev = item_event(o, "response.content_part.done", k, true);
        cJSON_AddItemToObject(ev, "part", part_json(it, t));
        emit_free(emit, ud, ev);
        if (has_summary(o, k)) {
            summary_event(o, "response.reasoning_summary_text.done", k, "text", t, emit, ud);
            summary_event(o, "response.reasoning_summary_part.done", k, "part", t, emit, ud);
        }
    }
    ev = api_rsp_event(o, "response.output_item.done");
    cJSON_AddNumberToObject(ev, "output_index", k);
    cJSON_AddItemToObject(ev, "item", item_json(o, it, NULL));
    emit_free(emit, ud, ev);
}

/* Appends s[0, n) to item k and sends it as its delta (emit NULL: appended alone) */
static void item_delta(api_rsp_out *o, int k, const char *s, size_t n, api_rsp_emit emit, void *ud) {
    api_rsp_item *it = &o->items[k];
    size_t m;
    char *d = api_json_text(s, n, &m);
    if (it->len + m + 1 > it->cap) {
        it->cap = (it->len + m + 1) * 2;
        it->text = mla_xrealloc(it->text, it->cap);
    }
    memcpy(it->text + it->len, d, m + 1);
    it->len += m;
    if (emit && o->opts.messages) {
        if (!(it->kind == API_RSP_REASONING && o->opts.omit_thinking) &&
            !(it->kind == API_RSP_CALL && !o->opts.eager_input))
            block_delta(o, k, d, emit, ud);
    } else if (emit) {
        static const char *const type[] = {"response.reasoning_text.delta", "response.output_text.delta",
                                           "response.function_call_arguments.delta"};
        cJSON *ev = item_event(o, type[it->kind], k, it->kind != API_RSP_CALL);
        cJSON_AddStringToObject(ev, "delta", d);
        if (it->kind == API_RSP_MESSAGE) cJSON_AddArrayToObject(ev, "logprobs");
        emit_free(emit, ud, ev);
        if (has_summary(o, k)) summary_event(o, "response.reasoning_summary_text.delta", k, "delta", d, emit, ud);
    }
    free(d);
}

/* The open item is of this kind (and call), else it is done and a new one opens */
static void item_want(api_rsp_out *o, enum api_rsp_item_kind kind, api_rsp_emit emit, void *ud) {
    if (o->open >= 0 && o->items[o->open].kind == kind) return;
    item_close(o, false, emit, ud);
    item_open(o, kind, NULL, -1, emit, ud);
}

static int call_item(const api_rsp_out *o, int call) {
    for (int k = 0; k < o->n_items; k++)
        if (o->items[k].kind == API_RSP_CALL && o->items[k].call == call) return k;
    return -1;
}

/* The arguments of call i past what its item holds */
static void call_args(api_rsp_out *o, const toolcall *c, int i, api_rsp_emit emit, void *ud) {
    const int k = call_item(o, i);
    o->items[k].whole = c->done;
    if (c->args_len <= o->sent_args[i]) return;
    /* a done item never grows in the text's order (a call's arguments all come before what
     * follows it); were it to, it keeps them, its events having been sent */
    item_delta(o, k, c->args + o->sent_args[i], c->args_len - o->sent_args[i], k == o->open ? emit : NULL, ud);
    o->sent_args[i] = c->args_len;
}

void api_rsp_out_update(api_rsp_out *o, const api_rsp_view *v, api_rsp_emit emit, void *ud) {
    if (v->reasoning && v->reasoning_len > o->sent_r) {
        item_want(o, API_RSP_REASONING, emit, ud);
        item_delta(o, o->open, v->reasoning + o->sent_r, v->reasoning_len - o->sent_r, emit, ud);
        o->sent_r = v->reasoning_len;
    }
    /* in the text's order: the calls begun before (their arguments), then the content before each
     * new call and the call, then the content after the last */
    for (int i = 0; i < o->n_calls && i < v->n_calls; i++) call_args(o, &v->calls[i], i, emit, ud);
    for (int i = o->n_calls;; i++) {
        const bool call = i < v->n_calls && v->calls[i].name;
        const size_t upto = call && v->calls[i].content_at < v->content_len ? v->calls[i].content_at : v->content_len;
        if (upto > o->sent_c) {
            item_want(o, API_RSP_MESSAGE, emit, ud);
            item_delta(o, o->open, v->content + o->sent_c, upto - o->sent_c, emit, ud);
            o->sent_c = upto;
        }
        if (!call) break;
        item_close(o, false, emit, ud);
        item_open(o, API_RSP_CALL, &v->calls[i], i, emit, ud);
        o->n_calls = i + 1;
        o->sent_args[i] = 0;
        call_args(o, &v->calls[i], i, emit, ud);
    }
}

void api_rsp_out_finish(api_rsp_out *o, bool incomplete, api_rsp_emit emit, void *ud) {
    if (!o->n_items) item_open(o, API_RSP_MESSAGE, NULL, -1, emit, ud);
    item_close(o, incomplete, emit, ud);
}

cJSON *api_rsp_object(const api_rsp_out *o, const cJSON *echo, const char *model, long long created,
                      const char *status, const char *incomplete_reason, const api_rsp_usage *usage,
                      const api_error *err) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", o->resp_id);
    cJSON_AddStringToObject(j, "object", "response");
    cJSON_AddNumberToObject(j, "created_at", (double)created);
    cJSON_AddStringToObject(j, "status", status);
    cJSON_AddStringToObject(j, "model", model);
    if (err) {
        cJSON *x = cJSON_AddObjectToObject(j, "error");
        cJSON_AddStringToObject(x, "code", "server_error"); /* the Responses API's code for it */
        cJSON_AddStringToObject(x, "message", err->message);
    } else {
        cJSON_AddNullToObject(j, "error");
    }
    if (incomplete_reason) cJSON_AddStringToObject(cJSON_AddObjectToObject(j, "incomplete_details"), "reason",
                                                   incomplete_reason);
    else cJSON_AddNullToObject(j, "incomplete_details");
    cJSON *out = cJSON_AddArrayToObject(j, "output");
    const bool in_progress = !strcmp(status, "in_progress");
    for (int k = 0; !in_progress && k < o->n_items; k++) /* a failed answer's open item: cut off */
        cJSON_AddItemToArray(out, item_json(o, &o->items[k], o->items[k].done ? NULL : "incomplete"));
    const cJSON *m;
    cJSON_ArrayForEach(m, echo) cJSON_AddItemToObject(j, m->string, cJSON_Duplicate(m, 1));
    if (usage) {
        cJSON *u = cJSON_AddObjectToObject(j, "usage");
        cJSON_AddNumberToObject(u, "input_tokens", usage->input);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens", usage->cached);
        cJSON_AddNumberToObject(u, "output_tokens", usage->output);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens",
                                usage->reasoning);
        cJSON_AddNumberToObject(u, "total_tokens", (double)usage->input + usage->output);
    } else {
        cJSON_AddNullToObject(j, "usage");
    }
    return j;
}
