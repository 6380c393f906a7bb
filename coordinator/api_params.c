/* api_params: see api_params.h. */
#include "coordinator/api_params.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mla_err.h"
#include "coordinator/chat_json.h"

/* A message that quotes the request, made valid text in place (buffer of cap bytes): what starts
 * no whole character (a quote cut by a %.64s or by the buffer's end, a request's own bad bytes)
 * becomes U+FFFD (api_utf8_sanitize), and the result is cut at a character that fits, so that a
 * JSON body or a grpc-message carrying it is well-formed UTF-8 */
static void utf8_whole(char *s, size_t cap) {
    const size_t len = strlen(s);
    if (api_utf8_invalid_at(s, len) < 0) return;
    size_t n;
    char *v = api_utf8_sanitize(s, len, &n);
    n = api_utf8_complete_prefix(v, n < cap - 1 ? n : cap - 1);
    memcpy(s, v, n);
    s[n] = 0;
    free(v);
}

int api_error_set(api_error *e, int status, const char *param, const char *code, const char *fmt,
                  ...) {
    if (!e) return MLA_ERR;
    memset(e, 0, sizeof(*e));
    e->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    utf8_whole(e->message, sizeof e->message);
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    snprintf(e->code, sizeof(e->code), "%s", code ? code : "");
    return MLA_ERR;
}

int api_bad(api_error *e, const char *param, const char *fmt, ...) {
    char m[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof(m), fmt, ap);
    va_end(ap);
    return api_error_set(e, 400, param, NULL, "%s", m);
}

static bool is_null(const cJSON *j) { return !j || cJSON_IsNull(j); }

/* Integer-valued JSON number within [lo, hi]. */
static int get_int(const cJSON *root, const char *name, int64_t lo, int64_t hi, int64_t *out,
                   bool *present, api_error *e) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, name);
    *present = false;
    if (is_null(j)) return MLA_OK;
    if (!cJSON_IsNumber(j)) return api_bad(e, name, "'%s' must be an integer", name);
    double d = j->valuedouble;
    if (!isfinite(d) || d != floor(d)) return api_bad(e, name, "'%s' must be an integer", name);
    if (d < (double)lo || d > (double)hi)
        return api_bad(e, name, "'%s' must be between %lld and %lld (got %.17g)", name, (long long)lo,
                   (long long)hi, d);
    *out = (int64_t)d;
    *present = true;
    return MLA_OK;
}

static int get_num(const cJSON *root, const char *name, double lo, double hi, float *out,
                   api_error *e) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, name);
    if (is_null(j)) return MLA_OK;
    if (!cJSON_IsNumber(j)) return api_bad(e, name, "'%s' must be a number", name);
    double d = j->valuedouble;
    if (!isfinite(d) || d < lo || d > hi)
        return api_bad(e, name, "'%s' must be between %g and %g (got %.17g)", name, lo, hi, d);
    *out = (float)d;
    return MLA_OK;
}

/* A number in (lo, hi]: lo itself is refused (top_p 0 would keep no token). */
static int get_num_open_lo(const cJSON *root, const char *name, double lo, double hi, float *out, api_error *e) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, name);
    if (is_null(j)) return MLA_OK;
    if (!cJSON_IsNumber(j)) return api_bad(e, name, "'%s' must be a number", name);
    double d = j->valuedouble;
    if (!isfinite(d) || d <= lo || d > hi)
        return api_bad(e, name, "'%s' must be in (%g, %g] (got %.17g)", name, lo, hi, d);
    if ((float)d <= (float)lo) /* in range, but the sampler's float makes it the bound */
        return api_bad(e, name,
                "'%s' must be in (%g, %g]: %.17g is %g as a 32-bit float", name, lo, hi, d, (double)(float)d);
    *out = (float)d;
    return MLA_OK;
}

/* root's "model": absent or null (*out stays NULL), or a string (*out: its copy) */
static int get_model(const cJSON *root, char **out, api_error *e) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (is_null(m)) return MLA_OK;
    if (!cJSON_IsString(m)) return api_bad(e, "model", "'model' must be a string");
    *out = mla_xstrdup(m->valuestring);
    return MLA_OK;
}

static int get_bool(const cJSON *root, const char *name, bool *out, api_error *e) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, name);
    if (is_null(j)) return MLA_OK;
    if (!cJSON_IsBool(j)) return api_bad(e, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(j);
    return MLA_OK;
}

static int get_token_array(const cJSON *a, const char *name, int32_t **ids, int32_t *n,
                           api_error *e) {
    int cnt = cJSON_GetArraySize(a);
    *ids = cnt > 0 ? mla_xmalloc((size_t)cnt * sizeof(int32_t)) : NULL;
    *n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, a) {
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble != floor(it->valuedouble) ||
            it->valuedouble < 0 || it->valuedouble > INT32_MAX) {
            free(*ids);
            *ids = NULL;
            *n = 0;
            return api_bad(e, name, "'%s' must be a list of non-negative integer token ids", name);
        }
        (*ids)[(*n)++] = (int32_t)it->valuedouble;
    }
    return MLA_OK;
}

/* Each from in s (a NUL-terminated string in cap bytes) as to, as far as the result fits */
void api_replace_all(char *s, size_t cap, const char *from, const char *to) {
    const size_t fl = strlen(from), tl = strlen(to);
    for (char *p = strstr(s, from); p; p = strstr(p, from)) {
        const size_t rest = strlen(p + fl);
        if ((size_t)(p - s) + tl + rest + 1 > cap) return;
        memmove(p + tl, p + fl, rest + 1);
        memcpy(p, to, tl);
        p += tl;
    }
}

void api_error_rename(api_error *e, const char *const (*text)[2], size_t n_text, const char *const (*names)[2],
                      size_t n_names, const char *prefix) {
    for (size_t i = 0; i < n_text; i++) api_replace_all(e->message, sizeof e->message, text[i][0], text[i][1]);
    for (size_t i = 0; i < n_names; i++) {
        if (strcmp(e->param, names[i][0])) continue;
        snprintf(e->param, sizeof e->param, "%s", names[i][1]);
        if (i == 0 && prefix) {
            const size_t pl = strlen(prefix);
            if (pl >= sizeof e->message) return;
            memmove(e->message + pl, e->message, sizeof e->message - pl); /* the message's bytes that still fit */
            memcpy(e->message, prefix, pl);
            e->message[sizeof e->message - 1] = 0;
        }
        return;
    }
}

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

char *api_pct_decode(const char *s, size_t n, size_t *len) {
    char *d = mla_xmalloc(n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int hi, lo;
        if (s[i] == '%' && i + 2 < n && (hi = hexval(s[i + 1])) >= 0 && (lo = hexval(s[i + 2])) >= 0) {
            d[k++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            d[k++] = s[i];
        }
    }
    d[k] = 0;
    *len = k;
    return d;
}

char *api_query_value(const char *query, const char *key, size_t *len) {
    const size_t kn = strlen(key);
    *len = 0;
    for (const char *p = query; p && *p;) {
        const size_t n = strcspn(p, "&");
        if (n >= kn && !strncmp(p, key, kn) && (n == kn || p[kn] == '=')) {
            if (n == kn) return mla_xstrdup("");
            char *raw = mla_xmalloc(n - kn); /* '+' a blank before decoding: "%2B" stays a '+' */
            for (size_t i = 0; i + 1 < n - kn; i++) raw[i] = p[kn + 1 + i] == '+' ? ' ' : p[kn + 1 + i];
            char *v = api_pct_decode(raw, n - kn - 1, len);
            free(raw);
            return v;
        }
        p = p[n] ? p + n + 1 : NULL;
    }
    return NULL;
}

void api_join_add(api_join *j, const char *t) {
    const size_t n = strlen(t);
    if (j->len + n + 2 > j->cap) {
        j->cap = 2 * (j->len + n + 2);
        j->s = mla_xrealloc(j->s, j->cap);
    }
    if (j->len) j->s[j->len++] = '\n';
    memcpy(j->s + j->len, t, n + 1);
    j->len += n;
    j->any = true;
}

cJSON *api_chat_msg(cJSON *msgs, const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    if (content) cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
    return m;
}

void api_chat_call(cJSON *calls, const char *id, const char *name, const char *arguments) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *fn = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(fn, "name", name);
    cJSON_AddStringToObject(fn, "arguments", arguments);
    cJSON_AddItemToArray(calls, c);
}

void api_refs_def(api_refs *r, const char *id) {
    if (r->n_defs == r->cap_defs) {
        r->cap_defs = r->cap_defs ? 2 * r->cap_defs : 8;
        r->defs = mla_xrealloc(r->defs, (size_t)r->cap_defs * sizeof *r->defs);
    }
    r->defs[r->n_defs++] = id;
}

void api_refs_ref(api_refs *r, const char *id, int at) {
    if (r->n_refs == r->cap_refs) {
        r->cap_refs = r->cap_refs ? 2 * r->cap_refs : 8;
        r->refs = mla_xrealloc(r->refs, (size_t)r->cap_refs * sizeof *r->refs);
        r->ref_at = mla_xrealloc(r->ref_at, (size_t)r->cap_refs * sizeof *r->ref_at);
    }
    r->refs[r->n_refs] = id;
    r->ref_at[r->n_refs++] = at;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

int api_refs_missing(api_refs *r) {
    if (r->n_defs) qsort(r->defs, (size_t)r->n_defs, sizeof *r->defs, cmp_str);
    for (int k = 0; k < r->n_refs; k++)
        if (!r->n_defs || !bsearch(&r->refs[k], r->defs, (size_t)r->n_defs, sizeof *r->defs, cmp_str)) return k;
    return -1;
}

void api_refs_free(api_refs *r) {
    free(r->defs);
    free(r->refs);
    free(r->ref_at);
    memset(r, 0, sizeof *r);
}

bool api_in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return true;
    return false;
}

/* The first member of object o not in keys (NULL-ended), or NULL. */
static const char *other_member(const cJSON *o, const char *const *keys) {
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        const char *k = it->string ? it->string : "";
        if (!api_in_list(keys, k)) return k;
    }
    return NULL;
}

static const char *const k_call_keys[] = {"id", "type", "function", "index", NULL};
static const char *const k_fn_keys[] = {"name", "arguments", NULL};
static const char *const k_part_keys[] = {"type", "text", NULL};

/* messages[i].tool_calls: absent or null, or (on an assistant message) a list of
 * {"id"?, "type"?: "function", "function": {"name": string, "arguments": a JSON object or the
 * string of one}}: a template would otherwise drop a malformed call without a trace, or fail on
 * it with a message that names none of it */
static int tool_calls_check(const cJSON *m, const char *role, int i, api_error *e) {
    const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (is_null(tcs)) return MLA_OK;
    if (strcmp(role, "assistant")) return api_bad(e, "messages",
            "messages[%d].tool_calls: only an assistant message has them", i);
    if (!cJSON_IsArray(tcs)) return api_bad(e, "messages", "messages[%d].tool_calls must be a list", i);
    const cJSON *tc;
    int j = 0;
    cJSON_ArrayForEach(tc, tcs) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        if (!cJSON_IsObject(tc) || !cJSON_IsObject(fn))
            return api_bad(e, "messages",
                    "messages[%d].tool_calls[%d] must be an object with a 'function' object", i, j);
        if (!is_null(ty) && (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function")))
            return api_bad(e, "messages", "messages[%d].tool_calls[%d].type must be \"function\"", i, j);
        /* a client that gathered the call from a stream may keep its "index" */
        const char *k = other_member(tc, k_call_keys);
        if (k)
            return api_bad(e, "messages",
                       "messages[%d].tool_calls[%d].%.64s is not a member of a tool call (id, type, function, index)",
                       i, j, k);
        if ((k = other_member(fn, k_fn_keys)))
            return api_bad(e, "messages",
                       "messages[%d].tool_calls[%d].function.%.64s is not a member of a call's function (name, "
                       "arguments)",
                       i, j, k);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(tc, "id");
        if (!is_null(id) && !cJSON_IsString(id))
            return api_bad(e, "messages", "messages[%d].tool_calls[%d].id must be a string", i, j);
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(tc, "index");
        if (!is_null(ix) && (!cJSON_IsNumber(ix) || ix->valuedouble != floor(ix->valuedouble) || ix->valuedouble < 0))
            return api_bad(e, "messages", "messages[%d].tool_calls[%d].index must be a non-negative integer", i, j);
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(nm) || !nm->valuestring[0])
            return api_bad(e, "messages", "messages[%d].tool_calls[%d].function.name must be a non-empty string", i, j);
        /* a string as it is (OpenAI takes any, a call cut short by max_tokens gives part of one);
         * a template that iterates over the arguments needs the text of an object (chat_normalize) */
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsString(args) && !cJSON_IsObject(args))
            return api_bad(e, "messages",
                    "messages[%d].tool_calls[%d].function.arguments %s a JSON object or its text", i,
                       j, is_null(args) ? "is required:" : "must be");
        j++;
    }
    return MLA_OK;
}

/* The members of a message that reach the template (docs/openai-params.md). OpenAI's own answer
 * carries a few more, which clients send back with the assistant turn as they got it: those are
 * taken empty (null, "" or []) and refused otherwise, as is anything else (a misspelt "content"
 * would otherwise leave an empty turn in the prompt without a word). */
static const char *const k_msg_keys[] = {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content",
                                         "reasoning", NULL};
static const char *const k_msg_echo_keys[] = {"refusal", "annotations", "audio", "function_call", NULL};

static bool is_empty(const cJSON *j) {
    return is_null(j) || (cJSON_IsString(j) && !j->valuestring[0]) || (cJSON_IsArray(j) && !cJSON_GetArraySize(j));
}

static int message_members_check(const cJSON *m, const char *role, int i, api_error *e) {
    const cJSON *it;
    cJSON_ArrayForEach(it, m) {
        const char *k = it->string ? it->string : "";
        if (api_in_list(k_msg_keys, k)) {
            if ((!strcmp(k, "name") || !strcmp(k, "tool_call_id") || !strcmp(k, "reasoning_content") ||
                 !strcmp(k, "reasoning")) &&
                !is_null(it) && !cJSON_IsString(it))
                return api_bad(e, "messages", "messages[%d].%s must be a string", i, k);
            continue;
        }
        if (api_in_list(k_msg_echo_keys, k)) {
            if (is_empty(it)) continue;
            return api_bad(e, "messages",
                    "messages[%d].%.64s is not supported by this server (only taken empty)", i, k);
        }
        return api_bad(e, "messages",
                   "messages[%d].%.64s is not a member of a message (role, content, name, tool_calls, tool_call_id, "
                   "reasoning_content or reasoning)",
                   i, k);
    }
    /* OpenAI's rule: every message has content, but an assistant turn that makes tool calls */
    const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (is_null(cJSON_GetObjectItemCaseSensitive(m, "content")) &&
        (strcmp(role, "assistant") || !cJSON_IsArray(tcs) || !cJSON_GetArraySize(tcs)))
        return api_bad(e, "messages", "messages[%d].content is required%s", i,
                   strcmp(role, "assistant") ? "" : " (or tool_calls)");
    return MLA_OK;
}

int api_messages_check(const cJSON *messages, api_error *e) {
    if (!cJSON_IsArray(messages)) return api_bad(e, "messages", "'messages' must be a list of message objects");
    if (cJSON_GetArraySize(messages) == 0) return api_bad(e, "messages", "'messages' must not be empty");
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, messages) {
        if (!cJSON_IsObject(m)) return api_bad(e, "messages", "messages[%d] must be an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) return api_bad(e, "messages", "messages[%d].role must be a string", i);
        /* Only these reach every chat template: the DeepSeek and GLM templates skip any other role
         * without a trace. "developer" (OpenAI's newer name for "system") becomes "system" in
         * chat_normalize. */
        if (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "developer") &&
            strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant") &&
            strcmp(role->valuestring, "tool"))
            return api_bad(e, "messages",
                       "messages[%d].role '%.64s' is not supported (system, developer, user, assistant or tool)",
                       i, role->valuestring);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (c && !cJSON_IsNull(c) && !cJSON_IsString(c)) {
            if (!cJSON_IsArray(c))
                return api_bad(e, "messages", "messages[%d].content must be a string or a list of parts", i);
            const cJSON *part;
            cJSON_ArrayForEach(part, c) {
                const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type");
                const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
                if (!cJSON_IsObject(part) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "text"))
                    return api_bad(e, "messages",
                            "messages[%d].content: parts of type '%.64s' are not supported (only {\"type\": "
                            "\"text\", \"text\": ...})", i,
                               cJSON_IsString(ty) ? ty->valuestring : "(none)");
                if (!cJSON_IsString(tx))
                    return api_bad(e, "messages", "messages[%d].content: a text part needs a string 'text'", i);
                const char *k = other_member(part, k_part_keys);
                if (k)
                    return api_bad(e, "messages",
                               "messages[%d].content: '%.64s' is not a member of a text part (type, text)", i, k);
            }
        }
        if (tool_calls_check(m, role->valuestring, i, e)) return MLA_ERR;
        if (message_members_check(m, role->valuestring, i, e)) return MLA_ERR;
        i++;
    }
    return MLA_OK;
}

/* continue_final_message (vLLM): the prompt ends inside the last message, the assistant's, and
 * the answer goes on from its text (a string that is not empty); add_generation_prompt then
 * defaults to false (true: 400). Chat completions and /tokenize. */
static int continue_check(const cJSON *root, const cJSON *msgs, bool *cont, bool *add_gen, api_error *e) {
    if (get_bool(root, "continue_final_message", cont, e)) return MLA_ERR;
    if (!*cont) return MLA_OK;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "add_generation_prompt")))
        return api_bad(e, "continue_final_message",
                   "'continue_final_message' continues the last message: 'add_generation_prompt' must be false");
    *add_gen = false;
    const cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(last, "role");
    if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant"))
        return api_bad(e, "continue_final_message", "'continue_final_message' needs the last message to be the "
                                                "assistant's (the text to go on from)");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(last, "content");
    if (!cJSON_IsString(content) || !content->valuestring[0])
        return api_bad(e, "continue_final_message",
                   "'continue_final_message' needs the last message's content as a string that is not empty");
    return MLA_OK;
}

/* The request members this server reads, by endpoint. Anything else is refused by name: an
 * OpenAI (or vLLM / llama.cpp) parameter it does not honour must not pass silently. */
static const char *const k_common_keys[] = {
    "model", "n", "max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "stop", "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
    "skip_special_tokens", "stream", "truncate_prompt_tokens",
    "stream_options", "logprobs", "max_completion_tokens", "user",
    /* structured output and logit_bias: coordinator/api_constrain.c */
    "logit_bias", "response_format", "grammar", NULL};
static const char *const k_chat_keys[] = {"messages", "add_generation_prompt", "top_logprobs",
                                          "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
                                          "reasoning_effort", "include_reasoning", "continue_final_message", NULL};
static const char *const k_completion_keys[] = {"prompt", "echo", "suffix", "best_of", NULL};

static int check_keys(const cJSON *root, enum api_kind kind, api_error *e) {
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        const char *k = it->string ? it->string : "";
        if (api_in_list(k_common_keys, k) || api_in_list(kind == API_CHAT ? k_chat_keys : k_completion_keys, k))
            continue;
        if (kind == API_COMPLETIONS && api_in_list(k_chat_keys, k))
            return api_bad(e, k, "'%.64s' is a chat parameter: use /v1/chat/completions", k);
        if (kind == API_CHAT && api_in_list(k_completion_keys, k))
            return api_bad(e, k, "'%.64s' is a completions parameter: use /v1/completions", k);
        return api_bad(e, k, "'%.64s' is not supported by this server (docs/openai-params.md lists the parameters)", k);
    }
    return MLA_OK;
}

/* tools: [{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}] */
static int parse_tools(api_gen_params *p, const cJSON *root, api_error *e) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    const cJSON *ptc = cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls");
    if (!is_null(tools)) {
        if (!cJSON_IsArray(tools)) return api_bad(e, "tools", "'tools' must be a list of tools");
        int n = cJSON_GetArraySize(tools), n_deferred = 0;
        if (n > API_MAX_TOOLS_ALL)
            return api_bad(e, "tools", "at most %d tools are supported (got %d)", API_MAX_TOOLS_ALL, n);
        int i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
            if (!cJSON_IsObject(t) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function"))
                return api_bad(e, "tools",
                        "tools[%d]: only {\"type\": \"function\", \"function\": {...}} tools are supported", i);
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsObject(fn) || !cJSON_IsString(nm) || !nm->valuestring[0] ||
                strlen(nm->valuestring) > API_MAX_TOOL_NAME)
                return api_bad(e, "tools", "tools[%d].function.name must be a non-empty string of at most %d bytes", i,
                           API_MAX_TOOL_NAME);
            /* the call formats' parsers end a name at whitespace or '<' (a marker): a tool so named
             * could never be called */
            if (!toolcall_name_ok(nm->valuestring))
                return api_bad(e, "tools", "tools[%d].function.name '%.64s' holds whitespace, a control character or "
                                       "'<', where a model's call format ends a name", i, nm->valuestring);
            const cJSON *t2;
            int j = 0;
            cJSON_ArrayForEach(t2, tools) { /* two tools of one name: which one a call means would be a guess */
                if (j++ == i) break;
                const cJSON *f2 = cJSON_GetObjectItemCaseSensitive(t2, "function"),
                            *n2 = cJSON_GetObjectItemCaseSensitive(f2, "name");
                if (cJSON_IsString(n2) && !strcmp(n2->valuestring, nm->valuestring))
                    return api_bad(e, "tools", "tools[%d].function.name '%.64s' is tools[%d]'s too", i, nm->valuestring,
                               j - 1);
            }
            const cJSON *it;
            cJSON_ArrayForEach(it, t) { /* "strict" put beside "function" would be lost */
                const char *k = it->string ? it->string : "";
                if (strcmp(k, "type") && strcmp(k, "function"))
                    return api_bad(e, "tools",
                            "tools[%d].%.64s is not supported (a tool has \"type\" and \"function\")", i, k);
            }
            const cJSON *pa = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
            if (!is_null(pa) && !cJSON_IsObject(pa))
                return api_bad(e, "tools", "tools[%d].function.parameters must be a JSON schema object", i);
            const cJSON *de = cJSON_GetObjectItemCaseSensitive(fn, "description");
            if (!is_null(de) && !cJSON_IsString(de))
                return api_bad(e, "tools", "tools[%d].function.description must be a string", i);
            /* strict: true: the call's arguments are held to the schema (api_constrain_tools) */
            const cJSON *sx = cJSON_GetObjectItemCaseSensitive(fn, "strict");
            if (!is_null(sx) && !cJSON_IsBool(sx)) return api_bad(e, "tools",
                    "tools[%d].function.strict must be a boolean", i);
            /* the arguments are a JSON object: a strict schema must describe one (as OpenAI requires) */
            const cJSON *pt = cJSON_GetObjectItemCaseSensitive(pa, "type");
            if (cJSON_IsTrue(sx) && cJSON_IsObject(pa) && !(cJSON_IsString(pt) && !strcmp(pt->valuestring, "object")))
                return api_bad(e, "tools",
                        "tools[%d].function.parameters of a strict tool must have \"type\": \"object\"", i);
            /* defer_loading: true: left out of the template's tools (api_server's chat_vars: the
             * prompt does not list it), its calls read as any other's; for a client that brings the
             * tool into the conversation itself (/v1/messages: tool_reference blocks) */
            const cJSON *dl = cJSON_GetObjectItemCaseSensitive(fn, "defer_loading");
            if (!is_null(dl) && !cJSON_IsBool(dl)) return api_bad(e, "tools",
                    "tools[%d].function.defer_loading must be a boolean", i);
            n_deferred += cJSON_IsTrue(dl);
            cJSON_ArrayForEach(it, fn) {
                const char *k = it->string ? it->string : "";
                if (strcmp(k, "name") && strcmp(k, "description") && strcmp(k, "parameters") && strcmp(k, "strict") &&
                    strcmp(k, "defer_loading"))
                    return api_bad(e, "tools", "tools[%d].function.%.64s is not supported", i, k);
            }
            i++;
        }
        /* the listed tools' section is where the template tells the model how to call any */
        if (n > 0 && n_deferred == n)
            return api_bad(e, "tools", "every tool has defer_loading true: at least one must be listed in the prompt");
        if (n - n_deferred > API_MAX_TOOLS)
            return api_bad(e, "tools", "at most %d tools are supported besides those of defer_loading true (got %d)",
                           API_MAX_TOOLS, n - n_deferred);
        if (n > 0) p->tools = tools;
    }
    p->tool_choice = API_TOOLS_AUTO;
    if (!is_null(tc)) {
        if (cJSON_IsString(tc)) {
            if (!strcmp(tc->valuestring, "auto")) p->tool_choice = API_TOOLS_AUTO;
            else if (!strcmp(tc->valuestring, "none")) p->tool_choice = API_TOOLS_NONE;
            else if (!strcmp(tc->valuestring, "required")) p->tool_choice = API_TOOLS_REQUIRED;
            else return api_bad(e, "tool_choice",
                    "'tool_choice' must be \"auto\", \"none\", \"required\" or a named function");
        } else {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tc, "function"), "name");
            if (!cJSON_IsObject(tc) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(nm))
                return api_bad(e, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                                             "{\"type\": \"function\", \"function\": {\"name\": ...}}");
            static const char *const k_tc[] = {"type", "function", NULL}, *const k_tcf[] = {"name", NULL};
            const char *k = other_member(tc, k_tc);
            if (k)
                return api_bad(e, "tool_choice",
                           "tool_choice.%.64s is not a member of a named tool choice (type, function)", k);
            if ((k = other_member(cJSON_GetObjectItemCaseSensitive(tc, "function"), k_tcf)))
                return api_bad(e, "tool_choice", "tool_choice.function.%.64s is not a member of a named tool choice's "
                                             "function (name)", k);
            p->tool_choice = API_TOOLS_NAMED;
            p->tool_choice_name = mla_xstrdup(nm->valuestring);
        }
        if (!p->tools && p->tool_choice != API_TOOLS_NONE) return api_bad(e, "tool_choice",
                "'tool_choice' needs 'tools'");
        if (p->tool_choice == API_TOOLS_NAMED) {
            bool found = false;
            const cJSON *t;
            cJSON_ArrayForEach(t, p->tools) {
                const cJSON *n2 = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
                if (cJSON_IsString(n2) && !strcmp(n2->valuestring, p->tool_choice_name)) found = true;
            }
            if (!found)
                return api_bad(e, "tool_choice", "'tool_choice' names the function '%.200s', which is not in 'tools'",
                           p->tool_choice_name);
        }
    }
    if (!is_null(ptc)) {
        if (!cJSON_IsBool(ptc)) return api_bad(e, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
        p->one_call = !cJSON_IsTrue(ptc); /* the calls after the first are dropped from the answer */
    }
    return MLA_OK;
}

/* What a chat request gives its template beside the messages: tools (and tool_choice,
 * parallel_tool_calls), chat_template_kwargs, reasoning_effort. Chat completions and /tokenize. */
static int parse_template_vars(api_gen_params *p, const cJSON *root, api_error *e) {
    if (parse_tools(p, root, e)) return MLA_ERR;
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    if (!is_null(kw)) {
        if (!cJSON_IsObject(kw)) return api_bad(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        const cJSON *it;
        cJSON_ArrayForEach(it, kw) {
            const char *k = it->string ? it->string : "";
            if (!strcmp(k, "messages") || !strcmp(k, "tools") || !strcmp(k, "add_generation_prompt") ||
                !strcmp(k, "bos_token") || !strcmp(k, "eos_token"))
                return api_bad(e, "chat_template_kwargs",
                           "chat_template_kwargs.%s is set by the server (use the request's own parameter)", k);
        }
        p->chat_template_kwargs = kw;
    }
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(root, "reasoning_effort");
    if (!is_null(re)) {
        if (!cJSON_IsString(re) || (strcmp(re->valuestring, "minimal") && strcmp(re->valuestring, "low") &&
                                    strcmp(re->valuestring, "medium") && strcmp(re->valuestring, "high")))
            return api_bad(e, "reasoning_effort",
                       "'reasoning_effort' must be \"minimal\", \"low\", \"medium\" or \"high\"");
        p->reasoning_effort = mla_xstrdup(re->valuestring);
    }
    return MLA_OK;
}

int api_gen_params_parse(api_gen_params *p, enum api_kind kind, const cJSON *root, api_error *e) {
    memset(p, 0, sizeof(*p));
    p->kind = kind;
    sched_sampling_default(&p->sampling);
    p->max_tokens = -1;
    p->add_generation_prompt = true;
    p->skip_special_tokens = true;
    p->include_reasoning = true;
    if (!cJSON_IsObject(root)) return api_bad(e, NULL, "the request body must be a JSON object");
    if (check_keys(root, kind, e)) return MLA_ERR;
    int64_t v;
    bool has;

    if (get_model(root, &p->model, e)) return MLA_ERR;
    /* the end user's id (OpenAI's "user"): written in the request's log line */
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (!is_null(user)) {
        if (!cJSON_IsString(user)) return api_bad(e, "user", "'user' must be a string");
        if (strlen(user->valuestring) > API_MAX_USER_LEN)
            return api_bad(e, "user", "'user' is limited to %d bytes", API_MAX_USER_LEN);
        const unsigned char *u0 = (const unsigned char *)user->valuestring;
        for (const unsigned char *u = u0; *u; u++) /* C0, DEL and C1 (U+0080..U+009F: 0xC2 0x80..0x9F) */
            if (*u < 0x20 || *u == 0x7f || (*u == 0xc2 && u[1] >= 0x80 && u[1] <= 0x9f))
                return api_bad(e, "user", "'user' must not hold control characters");
        p->user = mla_xstrdup(user->valuestring);
    }
    if (kind == API_COMPLETIONS) {
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        if (is_null(pr)) return api_bad(e, "prompt", "'prompt' is required");
        if (cJSON_IsString(pr)) {
            p->prompt_text = mla_xstrdup(pr->valuestring);
        } else if (cJSON_IsArray(pr)) {
            const cJSON *first = cJSON_GetArrayItem(pr, 0);
            int n = cJSON_GetArraySize(pr);
            if (n == 0) return api_bad(e, "prompt", "'prompt' must not be empty");
            if (cJSON_IsNumber(first)) {
                if (get_token_array(pr, "prompt", &p->prompt_ids, &p->n_prompt_ids, e)) return MLA_ERR;
            } else if (cJSON_IsString(first) || cJSON_IsArray(first)) { /* a list of prompts */
                if (n > API_MAX_N) return api_bad(e, "prompt", "at most %d prompts a request (got %d)", API_MAX_N, n);
                const bool text = cJSON_IsString(first);
                const cJSON *it;
                int i = 0;
                cJSON_ArrayForEach(it, pr) {
                    if (text ? !cJSON_IsString(it) : !cJSON_IsArray(it))
                        return api_bad(e, "prompt",
                                "'prompt' [%d]: a list of prompts holds strings or lists of token ids, "
                                                "not both", i);
                    if (i == 0 && text) {
                        p->prompt_text = mla_xstrdup(it->valuestring);
                    } else if (i == 0) {
                        if (get_token_array(it, "prompt", &p->prompt_ids, &p->n_prompt_ids, e))
                            return api_bad(e, "prompt",
                                    "'prompt' [0] must be a list of non-negative integer token ids");
                        if (!p->n_prompt_ids) return api_bad(e, "prompt", "'prompt' [0] must not be empty");
                    } else {
                        if (!p->more_n_ids) {
                            p->more_n_ids = mla_xcalloc((size_t)n - 1, sizeof *p->more_n_ids);
                            if (text) p->more_text = mla_xcalloc((size_t)n - 1, sizeof *p->more_text);
                            else p->more_ids = mla_xcalloc((size_t)n - 1, sizeof *p->more_ids);
                        }
                        if (text) p->more_text[i - 1] = mla_xstrdup(it->valuestring);
                        else if (get_token_array(it, "prompt", &p->more_ids[i - 1], &p->more_n_ids[i - 1], e))
                            return api_bad(e, "prompt",
                                    "'prompt' [%d] must be a list of non-negative integer token ids",
                                       i);
                        p->n_more = i;
                        if (!text && p->more_n_ids[i - 1] == 0)
                            return api_bad(e, "prompt", "'prompt' [%d] must not be empty", i);
                    }
                    i++;
                }
            } else {
                return api_bad(e, "prompt", "'prompt' must be a string, a list of token ids, or a list of those");
            }
            if (p->prompt_ids && p->n_prompt_ids == 0) return api_bad(e, "prompt", "'prompt' must not be empty");
        } else {
            return api_bad(e, "prompt", "'prompt' must be a string or a list of token ids");
        }
        const cJSON *echo = cJSON_GetObjectItemCaseSensitive(root, "echo");
        if (!is_null(echo) && !cJSON_IsBool(echo)) return api_bad(e, "echo", "'echo' must be a boolean");
        p->echo = cJSON_IsTrue(echo);
        const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(root, "suffix");
        if (!is_null(suffix)) return api_bad(e, "suffix", "'suffix' is not supported");
        /* logprobs: integer count of alternatives (OpenAI: 0..5; here up to 20) */
        const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
        if (cJSON_IsBool(lp)) {
            p->logprobs = cJSON_IsTrue(lp);
        } else {
            if (get_int(root, "logprobs", 0, SCHED_MAX_TOP_LOGPROBS, &v, &has, e)) return MLA_ERR;
            if (has) {
                p->logprobs = true;
                p->top_logprobs = (int32_t)v;
            }
        }
    } else {
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
        if (is_null(msgs)) return api_bad(e, "messages", "'messages' is required");
        if (api_messages_check(msgs, e)) return MLA_ERR;
        p->messages = msgs;
        if (get_bool(root, "add_generation_prompt", &p->add_generation_prompt, e)) return MLA_ERR;
        if (continue_check(root, msgs, &p->continue_final, &p->add_generation_prompt, e)) return MLA_ERR;
        if (get_bool(root, "logprobs", &p->logprobs, e)) return MLA_ERR;
        if (get_int(root, "top_logprobs", 0, SCHED_MAX_TOP_LOGPROBS, &v, &has, e)) return MLA_ERR;
        if (has) {
            if (!p->logprobs && v > 0) return api_bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
            p->top_logprobs = (int32_t)v;
        }
        if (parse_template_vars(p, root, e)) return MLA_ERR;
        /* false: the reasoning is parsed out of the answer and not returned (vLLM's parameter) */
        if (get_bool(root, "include_reasoning", &p->include_reasoning, e)) return MLA_ERR;
    }
    /* response_format, grammar, logit_bias: coordinator/api_constrain */
    if (api_constrain_parse(&p->constrain, root, e)) return MLA_ERR;
    if (get_int(root, "n", 1, API_MAX_N, &v, &has, e)) return MLA_ERR;
    p->n = has ? (int32_t)v : 1;
    /* vLLM's: the prompt's last N tokens (-1: as many as leave one for the answer) */
    if (get_int(root, "truncate_prompt_tokens", -1, INT32_MAX, &v, &has, e)) return MLA_ERR;
    if (has && v == 0) return api_bad(e, "truncate_prompt_tokens",
            "'truncate_prompt_tokens' must be -1 or at least 1 (got 0)");
    p->truncate_prompt = has ? (int32_t)v : 0;
    if ((int64_t)p->n * (1 + p->n_more) > API_MAX_N)
        return api_bad(e, "n",
                "%d prompts of %d choices each: at most %d choices a request", 1 + p->n_more, p->n, API_MAX_N);
    /* best_of: the server returns every choice it makes, so it must make no more than n */
    if (kind == API_COMPLETIONS) {
        if (get_int(root, "best_of", 1, API_MAX_N, &v, &has, e)) return MLA_ERR;
        if (has && v != p->n)
            return api_bad(e, "best_of",
                    "'best_of' must equal 'n' (%d): every choice made is returned, none picked (got %lld)",
                       p->n, (long long)v);
    }

    /* max_tokens / max_completion_tokens */
    int64_t mt = -1, mct = -1;
    bool has_mt, has_mct;
    /* 0 with echo: the prompt and its logprobs alone (a text scored, as OpenAI's completions took it) */
    const int64_t mt_min = p->echo ? 0 : 1;
    if (get_int(root, "max_tokens", mt_min, INT32_MAX, &mt, &has_mt, e)) return MLA_ERR;
    if (get_int(root, "max_completion_tokens", mt_min, INT32_MAX, &mct, &has_mct, e)) return MLA_ERR;
    p->max_tokens_param = has_mct ? "max_completion_tokens" : "max_tokens";
    if (has_mct) p->max_tokens = (int32_t)mct;
    else if (has_mt) p->max_tokens = (int32_t)mt;
    if (get_int(root, "min_tokens", 0, INT32_MAX, &v, &has, e)) return MLA_ERR;
    if (has) p->min_tokens = (int32_t)v;

    sched_sampling *s = &p->sampling;
    if (get_num(root, "temperature", 0.0, 100.0, &s->temperature, e)) return MLA_ERR;
    if (get_num_open_lo(root, "top_p", 0.0, 1.0, &s->top_p, e)) return MLA_ERR;
    if (get_int(root, "top_k", -1, INT32_MAX, &v, &has, e)) return MLA_ERR;
    if (has) s->top_k = v < 0 ? 0 : (int32_t)v;
    if (get_num(root, "min_p", 0.0, 1.0, &s->min_p, e)) return MLA_ERR;
    if (get_num(root, "presence_penalty", -2.0, 2.0, &s->presence_penalty, e)) return MLA_ERR;
    if (get_num(root, "frequency_penalty", -2.0, 2.0, &s->frequency_penalty, e)) return MLA_ERR;
    if (get_num_open_lo(root, "repetition_penalty", 0.0, 100.0, &s->repetition_penalty, e)) return MLA_ERR;
    /* A JSON number is read as a double, exact only up to 2^53: 9007199254740993 would be read as
     * ...992, another seed than the one sent. Such seeds are refused, not rounded. */
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed");
    if (!is_null(seed)) {
        if (!cJSON_IsNumber(seed) || !isfinite(seed->valuedouble) || seed->valuedouble != floor(seed->valuedouble))
            return api_bad(e, "seed", "'seed' must be an integer");
        if (fabs(seed->valuedouble) >= 9007199254740992.0)
            return api_bad(e, "seed",
                       "'seed' must be an integer of magnitude below 2^53 = 9007199254740992 (larger JSON numbers "
                       "are not read exactly; got %.17g)",
                       seed->valuedouble);
        s->seed = (uint64_t)(int64_t)seed->valuedouble;
        s->has_seed = true;
    }
    s->logprobs = p->logprobs;
    s->top_logprobs = p->top_logprobs;
    s->prompt_logprobs = p->echo && p->logprobs;

    /* stop: string or list of strings */
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!is_null(stop)) {
        if (cJSON_IsString(stop)) {
            p->stop[p->n_stop++] = mla_xstrdup(stop->valuestring); /* "": refused below, as vLLM does */
        } else if (cJSON_IsArray(stop)) {
            if (cJSON_GetArraySize(stop) > API_MAX_STOP)
                return api_bad(e, "stop", "at most %d stop strings are supported", API_MAX_STOP);
            const cJSON *it;
            cJSON_ArrayForEach(it, stop) {
                if (!cJSON_IsString(it)) return api_bad(e, "stop", "'stop' must be a string or a list of strings");
                p->stop[p->n_stop++] = mla_xstrdup(it->valuestring);
            }
        } else {
            return api_bad(e, "stop", "'stop' must be a string or a list of strings");
        }
    }
    const cJSON *sti = cJSON_GetObjectItemCaseSensitive(root, "stop_token_ids");
    if (!is_null(sti)) {
        if (!cJSON_IsArray(sti)) return api_bad(e, "stop_token_ids", "'stop_token_ids' must be a list of token ids");
        if (get_token_array(sti, "stop_token_ids", &p->stop_ids, &p->n_stop_ids, e)) return MLA_ERR;
    }
    if (get_bool(root, "include_stop_str_in_output", &p->include_stop_str, e)) return MLA_ERR;
    if (get_bool(root, "ignore_eos", &p->ignore_eos, e)) return MLA_ERR;
    if (get_bool(root, "skip_special_tokens", &p->skip_special_tokens, e)) return MLA_ERR;
    if (get_bool(root, "stream", &p->stream, e)) return MLA_ERR;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (!is_null(so)) {
        if (!cJSON_IsObject(so)) return api_bad(e, "stream_options", "'stream_options' must be an object");
        const cJSON *it;
        cJSON_ArrayForEach(it, so) {
            const bool iu = it->string && !strcmp(it->string, "include_usage"),
                       cu = it->string && !strcmp(it->string, "continuous_usage_stats");
            if (!iu && !cu) return api_bad(e, "stream_options", "stream_options.%.64s is not supported", it->string);
            if (is_null(it)) continue;
            if (!cJSON_IsBool(it)) return api_bad(e, "stream_options",
                    "'stream_options.%s' must be a boolean", it->string);
            *(iu ? &p->include_usage : &p->continuous_usage) = cJSON_IsTrue(it);
        }
        /* vLLM's: the usage so far in every chunk, beside include_usage's last one */
        if (p->continuous_usage && !p->include_usage)
            return api_bad(e, "stream_options", "'stream_options.continuous_usage_stats' needs 'include_usage': true");
        /* as OpenAI: without a stream it would do nothing (a reply always carries its usage) */
        if (!p->stream) return api_bad(e, "stream_options", "'stream_options' is only allowed with 'stream': true");
    }
    return api_gen_params_check(p, e);
}

static bool in_range(float v, double lo, double hi) { return isfinite(v) && v >= lo && v <= hi; }

int api_gen_params_check(const api_gen_params *p, api_error *e) {
    const sched_sampling *s = &p->sampling;
    if (p->n < 0 || p->n > API_MAX_N) return api_bad(e, "n", "'n' must be between 1 and %d (got %d)", API_MAX_N, p->n);
    if (p->n_more < 0 || (p->n_more > 0 && (p->kind != API_COMPLETIONS || !p->more_n_ids ||
                                            (p->prompt_text ? !p->more_text : !p->more_ids))))
        return api_bad(e, "prompt", "a list of prompts must hold prompts of one kind (strings or token-id lists)");
    if (p->kind == API_COMPLETIONS) {
        if (!!p->prompt_text + !!p->prompt_ids != 1 || p->messages)
            return api_bad(e, "prompt", "exactly one prompt (text or token ids) is required");
        if (p->prompt_ids && p->n_prompt_ids <= 0) return api_bad(e, "prompt", "'prompt' must not be empty");
    } else if (!p->messages || p->prompt_text || p->prompt_ids) {
        return api_bad(e, "messages", "'messages' (and no prompt) is required");
    }
    for (int32_t i = 0; i < p->n_prompt_ids; i++)
        if (p->prompt_ids[i] < 0) return api_bad(e, "prompt",
                "'prompt' must be a list of non-negative integer token ids");
    for (int32_t i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0)
            return api_bad(e, "stop_token_ids", "'stop_token_ids' must be a list of non-negative integer token ids");
    if (p->max_tokens != -1 && p->max_tokens < (p->echo ? 0 : 1))
        return api_bad(e, "max_tokens", "'max_tokens' must be between %d and %d (got %d)", p->echo ? 0 : 1, INT32_MAX,
                   p->max_tokens);
    if (p->min_tokens < 0) return api_bad(e, "min_tokens", "'min_tokens' must be >= 0 (got %d)", p->min_tokens);
    if (p->max_tokens != -1 && p->min_tokens > p->max_tokens)
        return api_bad(e, "min_tokens", "'min_tokens' (%d) must not exceed '%s' (%d)", p->min_tokens,
                   p->max_tokens_param ? p->max_tokens_param : "max_tokens", p->max_tokens);
    if (!in_range(s->temperature, 0.0, 100.0))
        return api_bad(e, "temperature", "'temperature' must be between 0 and 100 (got %g)", s->temperature);
    if (!in_range(s->top_p, 0.0, 1.0) || s->top_p <= 0.0f)
        return api_bad(e, "top_p", "'top_p' must be in (0, 1] (got %g)", s->top_p);
    if (s->top_k < 0) return api_bad(e, "top_k", "'top_k' must be >= -1");
    if (!in_range(s->min_p, 0.0, 1.0)) return api_bad(e, "min_p", "'min_p' must be between 0 and 1 (got %g)", s->min_p);
    if (!in_range(s->presence_penalty, -2.0, 2.0))
        return api_bad(e, "presence_penalty",
                "'presence_penalty' must be between -2 and 2 (got %g)", s->presence_penalty);
    if (!in_range(s->frequency_penalty, -2.0, 2.0))
        return api_bad(e, "frequency_penalty",
                "'frequency_penalty' must be between -2 and 2 (got %g)", s->frequency_penalty);
    if (!in_range(s->repetition_penalty, 0.0, 100.0) || s->repetition_penalty <= 0.0f)
        return api_bad(e, "repetition_penalty",
                "'repetition_penalty' must be in (0, 100] (got %g)", s->repetition_penalty);
    if (p->top_logprobs < 0 || p->top_logprobs > SCHED_MAX_TOP_LOGPROBS)
        return api_bad(e, "top_logprobs", "'top_logprobs' must be between 0 and %d", SCHED_MAX_TOP_LOGPROBS);
    if (s->logprobs != p->logprobs || s->top_logprobs != p->top_logprobs || s->prompt_logprobs != (p->echo && p->logprobs))
        return api_bad(e, "logprobs", "inconsistent logprobs settings");
    if (p->n_stop < 0 || p->n_stop > API_MAX_STOP)
        return api_bad(e, "stop", "at most %d stop strings are supported", API_MAX_STOP);
    for (int i = 0; i < p->n_stop; i++) {
        if (!p->stop[i] || !p->stop[i][0]) return api_bad(e, "stop", "stop strings must not be empty");
        if (strlen(p->stop[i]) > API_MAX_STOP_LEN)
            return api_bad(e, "stop", "stop strings are limited to %d bytes", API_MAX_STOP_LEN);
    }
    return MLA_OK;
}

void api_gen_params_free(api_gen_params *p) {
    for (int32_t i = 0; i < p->n_more; i++) {
        if (p->more_text) free(p->more_text[i]);
        if (p->more_ids) free(p->more_ids[i]);
    }
    free(p->more_text);
    free(p->more_ids);
    free(p->more_n_ids);
    free(p->model);
    free(p->user);
    free(p->tool_choice_name);
    free(p->reasoning_effort);
    free(p->prompt_text);
    free(p->prompt_ids);
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    free(p->stop_ids);
    api_constrain_free(&p->constrain);
    memset(p, 0, sizeof(*p));
}

static const char *const k_tokenize_keys[] = {"model", "prompt", "messages", "add_special_tokens",
                                              "add_generation_prompt", "continue_final_message", NULL};
/* and what a chat's template gets beside its messages (parse_template_vars) */
static const char *const k_tokenize_chat_keys[] = {"tools", "tool_choice", "parallel_tool_calls",
                                                   "chat_template_kwargs", "reasoning_effort", NULL};
static const char *const k_detokenize_keys[] = {"model", "tokens", NULL};

int api_tokenize_params_parse(api_tok_params *p, const cJSON *root, api_error *e) {
    memset(p, 0, sizeof(*p));
    p->add_special = true;
    p->add_gen = true;
    if (!cJSON_IsObject(root)) return api_bad(e, NULL, "the request body must be a JSON object");
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        const char *k = it->string ? it->string : "";
        if (!api_in_list(k_tokenize_keys, k) && !api_in_list(k_tokenize_chat_keys, k))
            return api_bad(e, k, "'%.64s' is not a /tokenize field (model, prompt, messages, add_special_tokens, "
                             "add_generation_prompt, continue_final_message, tools, tool_choice, "
                             "parallel_tool_calls, chat_template_kwargs, reasoning_effort)", k);
        if (api_in_list(k_tokenize_chat_keys, k) && is_null(cJSON_GetObjectItemCaseSensitive(root, "messages")))
            return api_bad(e, k, "'%.64s' applies to 'messages'", k);
    }
    if (get_model(root, &p->model, e)) return MLA_ERR;
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!is_null(pr) && !is_null(msgs)) return api_bad(e, "messages", "'prompt' and 'messages' exclude each other");
    if (!is_null(pr)) {
        if (!cJSON_IsString(pr)) return api_bad(e, "prompt", "'prompt' must be a string");
        p->prompt = mla_xstrdup(pr->valuestring);
    } else if (!is_null(msgs)) {
        if (api_messages_check(msgs, e)) return MLA_ERR;
        p->messages = msgs;
    } else {
        return api_bad(e, "prompt", "'prompt' (a string) or 'messages' is required");
    }
    if (get_bool(root, "add_special_tokens", &p->add_special, e)) return MLA_ERR;
    /* a chat's special tokens (its BOS included) are the template's text: none added (false, vLLM's
     * default for messages, says so; true would add a second BOS) */
    if (p->messages && !is_null(cJSON_GetObjectItemCaseSensitive(root, "add_special_tokens")) && p->add_special)
        return api_bad(e, "add_special_tokens", "'add_special_tokens': true applies to 'prompt': the special tokens of "
                                            "'messages' come from the chat template");
    if (p->messages) p->add_special = false;
    if (p->messages && parse_template_vars(&p->chat, root, e)) return MLA_ERR;
    if (get_bool(root, "add_generation_prompt", &p->add_gen, e)) return MLA_ERR;
    if (!p->messages && !is_null(cJSON_GetObjectItemCaseSensitive(root, "add_generation_prompt")))
        return api_bad(e, "add_generation_prompt", "'add_generation_prompt' applies to 'messages'");
    if (!p->messages && !is_null(cJSON_GetObjectItemCaseSensitive(root, "continue_final_message")))
        return api_bad(e, "continue_final_message", "'continue_final_message' applies to 'messages'");
    if (p->messages && continue_check(root, p->messages, &p->continue_final, &p->add_gen, e)) return MLA_ERR;
    return MLA_OK;
}

int api_detokenize_params_parse(api_tok_params *p, const cJSON *root, api_error *e) {
    memset(p, 0, sizeof(*p));
    if (!cJSON_IsObject(root)) return api_bad(e, NULL, "the request body must be a JSON object");
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        const char *k = it->string ? it->string : "";
        if (!api_in_list(k_detokenize_keys, k))
            return api_bad(e, k, "'%.64s' is not a /detokenize field (model, tokens)", k);
    }
    if (get_model(root, &p->model, e)) return MLA_ERR;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!cJSON_IsArray(t)) return api_bad(e, "tokens", "'tokens' (a list of token ids) is required");
    return get_token_array(t, "tokens", &p->tokens, &p->n_tokens, e);
}

void api_tok_params_free(api_tok_params *p) {
    free(p->model);
    free(p->prompt);
    free(p->tokens);
    api_gen_params_free(&p->chat);
    memset(p, 0, sizeof(*p));
}

/* Length of a valid UTF-8 sequence at s, 0 when invalid, -1 when valid so far but cut off. */
static int utf8_seq(const unsigned char *s, size_t avail) {
    unsigned char c = s[0];
    int n;
    uint32_t min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; min = 0x10000; }
    else return 0;
    uint32_t cp = c & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((size_t)i >= avail) return -1;
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
        /* early checks so a cut-off sequence is only "incomplete" when it can still be valid */
        if (i == 1) {
            if (n == 3 && c == 0xE0 && s[1] < 0xA0) return 0;
            if (n == 3 && c == 0xED && s[1] >= 0xA0) return 0;
            if (n == 4 && c == 0xF0 && s[1] < 0x90) return 0;
            if (n == 4 && c == 0xF4 && s[1] >= 0x90) return 0;
        }
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n;
}

long api_utf8_invalid_at(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        int n = utf8_seq(u + i, len - i);
        if (n <= 0) return (long)i;
        i += (size_t)n;
    }
    return -1;
}

/* Bytes at s that one U+FFFD replaces where no valid sequence starts there: the longest prefix
 * of a sequence that is valid so far (the Unicode standard's "maximal subpart", what Python's
 * errors="replace" and Hugging Face's decoders give), at least one byte. */
static size_t utf8_bad_len(const unsigned char *s, size_t avail) {
    size_t k = 1;
    while (k < 3 && k < avail && utf8_seq(s, k + 1) == -1) k++;
    return k;
}

char *api_utf8_sanitize(const char *s, size_t len, size_t *out_len) {
    char *o = mla_xmalloc(len * 3 + 1);
    size_t j = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        int n = utf8_seq(u + i, len - i);
        if (n > 0) {
            memcpy(o + j, s + i, (size_t)n);
            j += (size_t)n;
            i += (size_t)n;
        } else {
            o[j++] = (char)0xEF;
            o[j++] = (char)0xBF;
            o[j++] = (char)0xBD;
            i += utf8_bad_len(u + i, len - i);
        }
    }
    o[j] = 0;
    if (out_len) *out_len = j;
    return o;
}

char *api_json_text(const char *s, size_t len, size_t *out_len) {
    size_t n;
    char *v = api_utf8_sanitize(s, len, &n); /* valid UTF-8: no 0xFF byte left */
    char *o = chat_json_str(v, n);
    free(v);
    if (out_len) *out_len = n;
    return o;
}

size_t api_utf8_chars(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t c = 0;
    for (size_t i = 0; i < len; c++) {
        int n = utf8_seq(u + i, len - i);
        i += n > 0 ? (size_t)n : utf8_bad_len(u + i, len - i);
    }
    return c;
}

size_t api_utf8_char_start(const char *s, size_t len, size_t pos) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t q = pos; q > 0 && pos - q < 3 && q < len && (u[q] & 0xC0) == 0x80;) {
        q--;
        if ((u[q] & 0xC0) == 0x80) continue;
        int n = utf8_seq(u + q, len - q);
        size_t span = n > 0 ? (size_t)n : utf8_bad_len(u + q, len - q);
        return q + span > pos ? q : pos;
    }
    return pos;
}

size_t api_utf8_complete_prefix(const char *s, size_t len) {
    /* only the last (up to 3) bytes can start an incomplete sequence */
    size_t start = len > 3 ? len - 3 : 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = start; i < len; i++) {
        if ((u[i] & 0xC0) == 0x80) continue;
        if (utf8_seq(u + i, len - i) == -1) return i;
    }
    return len;
}
