/* chat_tmpl: chat templates from GGUF metadata with built-in fallbacks. See chat.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "chat_jinja.h"
#include "common/mla_log.h"
#include "coordinator/chat_reasoning.h"
#include "coordinator/chat_toolcall.h"

struct chat_tmpl {
    jinja_tmpl *jt; /* NULL: built-in */
    enum chat_family family;
    char *bos, *eos;
    char *src;        /* the Jinja text (NULL: built-in) */
    bool args_object; /* the template renders tool-call arguments given as an object */
    char used[512];
};

const char *chat_family_name(enum chat_family f) {
    switch (f) {
    case CHAT_FAMILY_DEEPSEEK3: return "deepseek3";
    case CHAT_FAMILY_GLM: return "glm";
    default: return "none";
    }
}

enum chat_family chat_family_guess(const char *arch, const char *pre) {
    if (pre && !strcmp(pre, "deepseek-v3")) return CHAT_FAMILY_DEEPSEEK3;
    if (pre && (!strcmp(pre, "glm4") || !strcmp(pre, "chatglm-bpe"))) return CHAT_FAMILY_GLM;
    if (arch && (!strcmp(arch, "deepseek2") || !strcmp(arch, "deepseek3"))) return CHAT_FAMILY_DEEPSEEK3;
    if (arch && (!strncmp(arch, "glm", 3) || !strcmp(arch, "chatglm"))) return CHAT_FAMILY_GLM;
    return CHAT_FAMILY_NONE;
}

/* ---- a growable string ---- */
typedef struct buf {
    char *p;
    size_t n, cap;
} buf;
static void bput(buf *b, const char *s) {
    size_t l = s ? strlen(s) : 0;
    if (b->n + l + 1 > b->cap) {
        b->cap = (b->n + l + 1) * 2;
        b->p = mla_xrealloc(b->p, b->cap);
    }
    if (l) memcpy(b->p + b->n, s, l);
    b->n += l;
    b->p[b->n] = 0;
}

int chat_render_builtin(enum chat_family f, const chat_msg *msgs, size_t n, bool add_gen, const char *bos_text,
                        const char *eos_text, char **out, mla_err *err) {
    *out = NULL;
    buf b = {0};
    bput(&b, "");
    if (f == CHAT_FAMILY_DEEPSEEK3) {
        /* DeepSeek-V3 tokenizer_config.json chat_template without tools: BOS, the system prompts
         * joined by blank lines, then the turns. */
        const char *eot = eos_text && *eos_text ? eos_text : "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
        bput(&b, bos_text);
        int nsys = 0;
        for (size_t i = 0; i < n; i++)
            if (!strcmp(msgs[i].role, "system")) {
                if (nsys++) bput(&b, "\n\n");
                bput(&b, msgs[i].content);
            }
        bool in_tool = false;
        for (size_t i = 0; i < n; i++) {
            const char *r = msgs[i].role;
            if (!strcmp(r, "system")) continue;
            if (!strcmp(r, "user")) {
                if (in_tool) bput(&b, "<\xEF\xBD\x9Ctool\xE2\x96\x81outputs\xE2\x96\x81" "end\xEF\xBD\x9C>");
                in_tool = false;
                bput(&b, "<\xEF\xBD\x9CUser\xEF\xBD\x9C>");
                bput(&b, msgs[i].content);
            } else if (!strcmp(r, "assistant")) {
                if (in_tool) bput(&b, "<\xEF\xBD\x9Ctool\xE2\x96\x81outputs\xE2\x96\x81" "end\xEF\xBD\x9C>");
                else bput(&b, "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>");
                in_tool = false;
                bput(&b, msgs[i].content);
                bput(&b, eot);
            } else if (!strcmp(r, "tool")) {
                if (!in_tool) bput(&b, "<\xEF\xBD\x9Ctool\xE2\x96\x81outputs\xE2\x96\x81" "begin\xEF\xBD\x9C>");
                in_tool = true;
                bput(&b, "<\xEF\xBD\x9Ctool\xE2\x96\x81output\xE2\x96\x81" "begin\xEF\xBD\x9C>");
                bput(&b, msgs[i].content);
                bput(&b, "<\xEF\xBD\x9Ctool\xE2\x96\x81output\xE2\x96\x81" "end\xEF\xBD\x9C>");
            } else {
                free(b.p);
                return mla_errf(err, "chat: role '%s' is not known to the built-in deepseek3 template", r);
            }
        }
        if (in_tool) bput(&b, "<\xEF\xBD\x9Ctool\xE2\x96\x81outputs\xE2\x96\x81" "end\xEF\xBD\x9C>");
        if (add_gen) bput(&b, "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>");
    } else if (f == CHAT_FAMILY_GLM) {
        /* GLM-5: [gMASK]<sop>, <|role|> markers with no newline, past assistant turns closed
         * with </think>, generation opens <think>. */
        bput(&b, "[gMASK]<sop>");
        for (size_t i = 0; i < n; i++) {
            const char *r = msgs[i].role;
            if (!strcmp(r, "system")) bput(&b, "<|system|>");
            else if (!strcmp(r, "user")) bput(&b, "<|user|>");
            else if (!strcmp(r, "assistant")) bput(&b, "<|assistant|></think>");
            else if (!strcmp(r, "tool")) bput(&b, "<|observation|><tool_response>");
            else {
                free(b.p);
                return mla_errf(err, "chat: role '%s' is not known to the built-in glm template", r);
            }
            bput(&b, msgs[i].content);
            if (!strcmp(r, "tool")) bput(&b, "</tool_response>");
        }
        if (add_gen) bput(&b, "<|assistant|><think>");
    } else {
        free(b.p);
        return mla_errf(err, "chat: no chat template in the model and no built-in one for its family");
    }
    *out = b.p;
    return MLA_OK;
}

static cJSON *msgs_json(const chat_msg *msgs, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", msgs[i].role ? msgs[i].role : "");
        cJSON_AddStringToObject(m, "content", msgs[i].content ? msgs[i].content : "");
        cJSON_AddItemToArray(a, m);
    }
    return a;
}

static int render_jinja(const jinja_tmpl *jt, const cJSON *messages, bool add_gen, const char *bos, const char *eos,
                        const cJSON *extra, char **out, size_t *out_len, mla_err *err) {
    cJSON *vars = cJSON_CreateObject();
    if (extra)
        for (const cJSON *it = extra->child; it; it = it->next)
            if (it->string) cJSON_AddItemToObject(vars, it->string, cJSON_Duplicate(it, 1));
    cJSON_DeleteItemFromObjectCaseSensitive(vars, "messages");
    cJSON_AddItemToObject(vars, "messages", cJSON_Duplicate(messages, 1));
    cJSON_DeleteItemFromObjectCaseSensitive(vars, "add_generation_prompt");
    cJSON_AddBoolToObject(vars, "add_generation_prompt", add_gen);
    if (!cJSON_GetObjectItemCaseSensitive(vars, "bos_token")) cJSON_AddStringToObject(vars, "bos_token", bos ? bos : "");
    if (!cJSON_GetObjectItemCaseSensitive(vars, "eos_token")) cJSON_AddStringToObject(vars, "eos_token", eos ? eos : "");
    int rc = jinja_render(jt, vars, out, out_len, err);
    cJSON_Delete(vars);
    return rc;
}

int chat_render(const char *tmpl, const chat_msg *msgs, size_t n, bool add_gen, const char *bos_text,
                const char *eos_text, char **out, mla_err *err) {
    *out = NULL;
    jinja_tmpl *jt;
    int rc = jinja_parse(&jt, tmpl, strlen(tmpl), err);
    if (rc != JINJA_OK) return rc;
    cJSON *m = msgs_json(msgs, n);
    rc = render_jinja(jt, m, add_gen, bos_text, eos_text, NULL, out, NULL, err);
    cJSON_Delete(m);
    jinja_free(jt);
    return rc;
}

const char *chat_past_billing_header(const char *t) {
    static const char k[] = "x-anthropic-billing-header:";
    if (strncmp(t, k, sizeof k - 1)) return t;
    const char *nl = strchr(t, '\n');
    return nl ? nl + 1 : t + strlen(t);
}

int chat_normalize(const cJSON *messages, bool args_object, cJSON **out, mla_err *err) {
    *out = NULL;
    if (!cJSON_IsArray(messages)) return mla_errf(err, "chat: messages must be an array");
    cJSON *copy = cJSON_Duplicate(messages, 1);
    int i = 0;
    cJSON *m;
    cJSON_ArrayForEach(m, copy) {
        /* OpenAI's "developer" role is its newer name for "system"; the templates know only the latter */
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "developer"))
            cJSON_ReplaceItemInObjectCaseSensitive(m, "role", cJSON_CreateString("system"));
        /* "reasoning", vLLM's newer name for "reasoning_content", as clients send a turn back */
        cJSON *rn = cJSON_DetachItemFromObjectCaseSensitive(m, "reasoning");
        const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
        if (cJSON_IsString(rn) && !cJSON_IsString(rc)) { /* absent, or null as our own answers give it */
            cJSON_DeleteItemFromObjectCaseSensitive(m, "reasoning_content");
            cJSON_AddItemToObject(m, "reasoning_content", rn);
        } else {
            cJSON_Delete(rn);
        }
        cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        /* null or absent (an assistant turn of tool calls, as the SDKs send it back): empty text,
         * as vLLM and llama.cpp render it; a template would print null as "None" */
        if (!c || cJSON_IsNull(c)) {
            if (c) cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateString(""));
            else cJSON_AddStringToObject(m, "content", "");
        } else if (cJSON_IsArray(c)) {
            buf b = {0};
            bput(&b, "");
            int j = 0;
            const cJSON *part;
            cJSON_ArrayForEach(part, c) {
                const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type");
                const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
                if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(tx)) {
                    free(b.p);
                    cJSON_Delete(copy);
                    return mla_errf(err, "messages[%d].content[%d]: parts of type '%.64s' are not supported (text parts only)",
                                    i, j, cJSON_IsString(ty) ? ty->valuestring : "(none)");
                }
                if (j) bput(&b, "\n"); /* parts one a line, as vLLM and llama.cpp join them */
                bput(&b, tx->valuestring);
                j++;
            }
            cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateString(b.p));
            free(b.p);
        }
        cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        int j = 0;
        cJSON *tc, *tarr = cJSON_IsArray(tcs) ? tcs : NULL;
        cJSON_ArrayForEach(tc, tarr) {
            cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
            cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
            if (args_object && cJSON_IsString(args)) {
                const char *s = args->valuestring;
                while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
                /* "": a call without arguments, as some clients send one */
                cJSON *parsed = *s ? cJSON_Parse(s) : cJSON_CreateObject();
                if (!cJSON_IsObject(parsed)) {
                    cJSON_Delete(parsed);
                    cJSON_Delete(copy);
                    return mla_errf(err, "messages[%d].tool_calls[%d].function.arguments is not a JSON object", i, j);
                }
                cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", parsed);
            } else if (!args_object && args && !cJSON_IsString(args)) {
                char *s = cJSON_PrintUnformatted(args);
                cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", cJSON_CreateString(s ? s : ""));
                free(s);
            }
            j++;
        }
        i++;
    }
    /* a system message read past Claude Code's billing line (chat_past_billing_header); one of
     * that line alone left out */
    for (cJSON *next, *it = copy->child; it; it = next) {
        next = it->next;
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsString(role) || strcmp(role->valuestring, "system") || !cJSON_IsString(c)) continue;
        const char *t = chat_past_billing_header(c->valuestring);
        if (t == c->valuestring) continue;
        if (*t) cJSON_ReplaceItemInObjectCaseSensitive(it, "content", cJSON_CreateString(t));
        else cJSON_Delete(cJSON_DetachItemViaPointer(copy, it));
    }
    if (!copy->child && messages->child) {
        cJSON_Delete(copy);
        return mla_errf(err, "chat: the messages hold only Claude Code's billing line (x-anthropic-billing-header:): "
                             "nothing to answer");
    }
    *out = copy;
    return MLA_OK;
}

/* Does the template render tool-call arguments given as an object (GLM's iterate over them;
 * DeepSeek's concatenate them as a string)? Rendered once at load with a probe conversation. */
static bool probe_args_object(const chat_tmpl *t) {
    const char *probe = "[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
                        "[{\"id\":\"call_0\",\"type\":\"function\",\"function\":{\"name\":\"probe_fn\","
                        "\"arguments\":{\"probe_key\":\"probe_val\"}}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_0\","
                        "\"content\":\"r\"},{\"role\":\"user\",\"content\":\"u2\"}]";
    cJSON *m = cJSON_Parse(probe);
    char *out = NULL;
    mla_err e = {{0}};
    bool ok = render_jinja(t->jt, m, true, t->bos, t->eos, NULL, &out, NULL, &e) == JINJA_OK && out &&
              strstr(out, "probe_key");
    free(out);
    cJSON_Delete(m);
    return ok;
}

bool chat_tmpl_uses_var(const chat_tmpl *t, const char *name) { return t->jt && jinja_uses_var(t->jt, name); }
const char *chat_tmpl_source(const chat_tmpl *t) { return t->src; }

int chat_tmpl_parsers(const chat_tmpl *t, const char *reasoning, const char *tools, int *rk, int *tk, mla_err *err) {
    int r = reasoning_kind_parse(reasoning ? reasoning : "auto");
    if (r == -2)
        return mla_errf(err, "--reasoning-parser: unknown parser '%s' (auto, none, deepseek-r1, deepseek-v3.1, glm, kimi-k2)",
                        reasoning);
    int k = toolcall_kind_parse(tools ? tools : "auto");
    if (k == -2) return mla_errf(err, "--tool-parser: unknown parser '%s' (auto, none, deepseek, kimi-k2, glm)", tools);
    if (r == REASONING_AUTO)
        r = !t ? REASONING_NONE
            : t->src ? (int)reasoning_auto(t->src)
            : t->family == CHAT_FAMILY_GLM ? REASONING_GLM : REASONING_NONE; /* the built-in glm opens <think> */
    if (k == TOOLCALL_AUTO) k = t && t->src ? (int)toolcall_auto(t->src) : TOOLCALL_NONE;
    *rk = r;
    *tk = k;
    return MLA_OK;
}
bool chat_tmpl_args_object(const chat_tmpl *t) { return t->args_object; }

int chat_tmpl_new(chat_tmpl **out, const char *src, size_t len, enum chat_family family, const char *bos_text,
                  const char *eos_text, mla_err *err) {
    *out = NULL;
    chat_tmpl *t = mla_xcalloc(1, sizeof *t);
    t->family = family;
    t->bos = mla_xstrdup(bos_text ? bos_text : "");
    t->eos = mla_xstrdup(eos_text ? eos_text : "");
    if (!src || !len) {
        if (family == CHAT_FAMILY_NONE) {
            chat_tmpl_free(t);
            return mla_errf(err, "chat: the model has no chat template and its family is unknown");
        }
        snprintf(t->used, sizeof t->used, "built-in %s (the model has no chat template)", chat_family_name(family));
        *out = t;
        return MLA_OK;
    }
    mla_err perr = {{0}};
    int rc = jinja_parse(&t->jt, src, len, &perr);
    if (rc == JINJA_OK) {
        snprintf(t->used, sizeof t->used, "gguf chat_template (jinja)");
        t->src = mla_xmalloc(len + 1);
        memcpy(t->src, src, len);
        t->src[len] = 0;
        t->args_object = probe_args_object(t);
        *out = t;
        return MLA_OK;
    }
    if (family == CHAT_FAMILY_NONE || (rc != JINJA_E_UNSUPPORTED && rc != JINJA_E_SYNTAX)) {
        chat_tmpl_free(t);
        *err = perr;
        return mla_err_prefix(err, "chat template");
    }
    snprintf(t->used, sizeof t->used, "built-in %s (%.400s)", chat_family_name(family), perr.msg);
    *out = t;
    return MLA_OK;
}

int chat_tmpl_from_gguf(chat_tmpl **out, const gguf_ctx *g, const tok_vocab *v, mla_err *err) {
    return chat_tmpl_from_gguf_src(out, g, v, NULL, 0, err);
}

int chat_tmpl_from_gguf_src(chat_tmpl **out, const gguf_ctx *g, const tok_vocab *v, const char *override,
                            size_t override_len, mla_err *err) {
    gguf_str src = {0}, arch = {0}, pre = {0};
    int rc;
    if (override) {
        if (!override_len) return mla_errf(err, "the template is empty");
        src.ptr = override;
        src.len = override_len;
    } else {
        rc = gguf_get_str(g, "tokenizer.chat_template", &src, err);
        if (rc < 0) return rc;
        if (rc == 0) src.len = 0;
    }
    char archb[64] = "", preb[64] = "";
    if (gguf_get_str(g, "general.architecture", &arch, err) == 1)
        snprintf(archb, sizeof archb, "%.*s", (int)(arch.len < 63 ? arch.len : 63), arch.ptr);
    if (gguf_get_str(g, "tokenizer.ggml.pre", &pre, err) == 1)
        snprintf(preb, sizeof preb, "%.*s", (int)(pre.len < 63 ? pre.len : 63), pre.ptr);
    enum chat_family fam = chat_family_guess(archb, preb);
    char *bos = NULL, *eos = NULL;
    size_t l;
    const char *s;
    if (v && (s = tok_token_text(v, tok_bos(v), &l))) {
        bos = mla_xmalloc(l + 1);
        memcpy(bos, s, l);
        bos[l] = 0;
    }
    if (v && (s = tok_token_text(v, tok_eos(v), &l))) {
        eos = mla_xmalloc(l + 1);
        memcpy(eos, s, l);
        eos[l] = 0;
    }
    /* the template is copied (NUL-terminated) by the parser */
    rc = chat_tmpl_new(out, src.len ? src.ptr : NULL, src.len, fam, bos, eos, err);
    free(bos);
    free(eos);
    if (rc == MLA_OK && src.len && !(*out)->src) { /* the text given did not parse */
        if (override) { /* a template named by the operator is the one used, or none */
            rc = mla_errf(err, "not usable: the server would fall back to the %s", (*out)->used);
            chat_tmpl_free(*out);
            *out = NULL;
        } else {
            MLA_WARN("chat template not usable; using the %s", (*out)->used);
        }
    }
    return rc;
}

void chat_tmpl_free(chat_tmpl *t) {
    if (!t) return;
    jinja_free(t->jt);
    free(t->src);
    free(t->bos);
    free(t->eos);
    free(t);
}

const char *chat_tmpl_used(const chat_tmpl *t) { return t->used; }
enum chat_family chat_tmpl_family(const chat_tmpl *t) { return t->family; }

/* content of a JSON message for the built-in templates: a string, or the text parts of a list one
 * a line */
static char *json_content(const cJSON *m) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (cJSON_IsString(c)) return mla_xstrdup(c->valuestring);
    buf b = {0};
    bput(&b, "");
    if (cJSON_IsArray(c)) {
        const cJSON *it;
        int j = 0;
        cJSON_ArrayForEach(it, c) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type"), *tx = cJSON_GetObjectItemCaseSensitive(it, "text");
            const bool part = cJSON_IsString(ty) && !strcmp(ty->valuestring, "text") && cJSON_IsString(tx);
            const char *t = cJSON_IsString(it) ? it->valuestring : part ? tx->valuestring : NULL;
            if (!t) continue;
            if (j++) bput(&b, "\n");
            bput(&b, t);
        }
    }
    return b.p;
}

static int apply_builtin_json(const chat_tmpl *t, const cJSON *messages, bool add_gen, char **out, size_t *out_len,
                              mla_err *err) {
    size_t n = (size_t)cJSON_GetArraySize(messages);
    chat_msg *m = mla_xcalloc(n ? n : 1, sizeof *m);
    char **owned = mla_xcalloc(n ? n : 1, sizeof *owned);
    size_t i = 0;
    const cJSON *it;
    int rc = MLA_OK;
    cJSON_ArrayForEach(it, messages) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(it, "role");
        if (!cJSON_IsString(r)) {
            rc = mla_errf(err, "chat: message %zu has no role", i);
            break;
        }
        m[i].role = r->valuestring;
        owned[i] = json_content(it);
        m[i].content = owned[i];
        i++;
    }
    if (rc == MLA_OK) rc = chat_render_builtin(t->family, m, i, add_gen, t->bos, t->eos, out, err);
    if (rc == MLA_OK && out_len) *out_len = strlen(*out);
    for (size_t k = 0; k < i; k++) free(owned[k]);
    free(owned);
    free(m);
    return rc;
}

int chat_tmpl_apply_json(const chat_tmpl *t, const cJSON *messages, bool add_gen, const cJSON *extra_vars, char **out,
                         size_t *out_len, const char **used, mla_err *err) {
    *out = NULL;
    if (!cJSON_IsArray(messages)) return mla_errf(err, "chat: messages must be an array");
    cJSON *norm = NULL;
    if (chat_normalize(messages, t->args_object, &norm, err) != MLA_OK) return MLA_ERR;
    int rc;
    if (used) *used = t->used;
    if (!t->jt) {
        rc = apply_builtin_json(t, norm, add_gen, out, out_len, err);
    } else {
        /* errors of the template at request time are the request's (no other template is tried) */
        rc = render_jinja(t->jt, norm, add_gen, t->bos, t->eos, extra_vars, out, out_len, err);
        if (rc != JINJA_OK) mla_err_prefix(err, "the chat template failed");
    }
    cJSON_Delete(norm);
    return rc;
}

int chat_tmpl_apply(const chat_tmpl *t, const chat_msg *msgs, size_t n, bool add_gen, const cJSON *extra_vars,
                    char **out, size_t *out_len, const char **used, mla_err *err) {
    cJSON *m = msgs_json(msgs, n);
    int rc = chat_tmpl_apply_json(t, m, add_gen, extra_vars, out, out_len, used, err);
    cJSON_Delete(m);
    return rc;
}

int chat_tmpl_prefix(const chat_tmpl *t, char **out, mla_err *err) {
    cJSON *m = cJSON_CreateArray();
    int rc = chat_tmpl_apply_json(t, m, false, NULL, out, NULL, NULL, err);
    cJSON_Delete(m);
    return rc;
}
