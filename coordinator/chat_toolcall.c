/* chat_toolcall: see chat_toolcall.h. */
#include "coordinator/chat_toolcall.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/mla_err.h"
#include "coordinator/chat_json.h"

#define DS_CALLS_BEGIN TOOLCALL_DS_CALLS_BEGIN
#define DS_CALLS_END TOOLCALL_DS_CALLS_END
#define DS_CALL_BEGIN TOOLCALL_DS_CALL_BEGIN
#define DS_CALL_END TOOLCALL_DS_CALL_END
#define DS_SEP TOOLCALL_DS_SEP
#define KM_SEC_BEGIN TOOLCALL_KIMI_SECTION_BEGIN
#define KM_SEC_BEGIN1 TOOLCALL_KIMI_SECTION_BEGIN1
#define KM_SEC_END TOOLCALL_KIMI_SECTION_END
#define KM_SEC_END1 TOOLCALL_KIMI_SECTION_END1
#define KM_CALL_BEGIN TOOLCALL_KIMI_CALL_BEGIN
#define KM_ARG_BEGIN TOOLCALL_KIMI_ARG_BEGIN
#define KM_CALL_END TOOLCALL_KIMI_CALL_END
#define GL_CALL_BEGIN TOOLCALL_GLM_CALL_BEGIN
#define GL_CALL_END TOOLCALL_GLM_CALL_END
#define GL_KEY_BEGIN TOOLCALL_GLM_KEY_BEGIN
#define GL_KEY_END TOOLCALL_GLM_KEY_END
#define GL_VAL_BEGIN TOOLCALL_GLM_VAL_BEGIN
#define GL_VAL_END TOOLCALL_GLM_VAL_END

static const char *const k_names[] = {"none", "deepseek", "kimi-k2", "glm"};

const char *toolcall_kind_name(enum toolcall_kind k) {
    return (unsigned)k < sizeof k_names / sizeof *k_names ? k_names[k] : "?";
}

int toolcall_kind_parse(const char *name) {
    if (!name) return -2;
    if (!strcmp(name, "auto")) return TOOLCALL_AUTO;
    for (size_t i = 0; i < sizeof k_names / sizeof *k_names; i++)
        if (!strcmp(name, k_names[i])) return (int)i;
    return -2;
}

enum toolcall_kind toolcall_auto(const char *src) {
    if (!src) return TOOLCALL_NONE;
    if (strstr(src, DS_CALL_BEGIN)) return TOOLCALL_DEEPSEEK;
    if (strstr(src, KM_CALL_BEGIN)) return TOOLCALL_KIMI_K2;
    if (strstr(src, GL_CALL_BEGIN) && strstr(src, GL_KEY_BEGIN)) return TOOLCALL_GLM;
    /* the family's turn markers, for templates that render no calls of their own */
    if (strstr(src, "<|im_assistant|>")) return TOOLCALL_KIMI_K2;
    if (strstr(src, "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>")) return TOOLCALL_DEEPSEEK;
    if (strstr(src, "[gMASK]")) return TOOLCALL_GLM;
    return TOOLCALL_NONE;
}

/* ---- helpers ---- */

typedef struct sb {
    char *p;
    size_t n, cap;
} sb;

static void sb_add(sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = mla_xrealloc(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static char *dup_n(const char *s, size_t n) {
    char *o = mla_xmalloc(n + 1);
    if (n) memcpy(o, s, n);
    o[n] = 0;
    return o;
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static bool all_ws(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!is_ws(s[i])) return false;
    return true;
}

static void trim(const char **s, size_t *n) {
    while (*n && is_ws(**s)) {
        (*s)++;
        (*n)--;
    }
    while (*n && is_ws((*s)[*n - 1])) (*n)--;
}

/* position of tag in t[from, len) or SIZE_MAX */
static size_t find(const char *t, size_t len, size_t from, const char *tag) {
    if (from >= len) return SIZE_MAX;
    const char *h = memmem(t + from, len - from, tag, strlen(tag));
    return h ? (size_t)(h - t) : SIZE_MAX;
}

/* position of tag in t[from, len) if it starts before `before`, else `before` (the first of
 * several tags without reading past the one found) */
static size_t find_before(const char *t, size_t len, size_t from, const char *tag, size_t before) {
    const size_t tl = strlen(tag), end = before == SIZE_MAX || before + tl - 1 > len ? len : before + tl - 1;
    const size_t f = find(t, end, from, tag);
    return f < before ? f : before;
}

static bool at(const char *t, size_t len, size_t pos, const char *tag) {
    size_t l = strlen(tag);
    return len - pos >= l && !memcmp(t + pos, tag, l);
}

/* t[pos, len) is non-empty and a proper beginning of tag */
static bool cut_of(const char *t, size_t len, size_t pos, const char *tag) {
    size_t l = strlen(tag), r = len - pos;
    return r > 0 && r < l && !memcmp(t + pos, tag, r);
}

/* Length of the longest suffix of t[from, len) that is a proper prefix of tag. */
static size_t partial_suffix(const char *t, size_t len, size_t from, const char *tag) {
    size_t n = len - from, tl = strlen(tag);
    for (size_t k = tl - 1 < n ? tl - 1 : n; k > 0; k--)
        if (!memcmp(t + len - k, tag, k)) return k;
    return 0;
}

static size_t skip_ws(const char *t, size_t len, size_t pos) {
    while (pos < len && is_ws(t[pos])) pos++;
    return pos;
}

static toolcall *new_call(toolcall_result *r) {
    toolcall *c = &r->calls[r->n_calls++];
    memset(c, 0, sizeof *c);
    c->args = (char *)"";
    c->args_view = true;
    return c;
}

/* the call's arguments: a copy of s[0, n), or (view) s itself, a span of the parsed text */
static void set_args(toolcall *c, const char *s, size_t n, bool view) {
    if (!c->args_view) free(c->args);
    c->args = view ? (char *)s : dup_n(s, n);
    c->args_view = view;
    c->args_len = n;
}

/* Where a search for tag in t[from, len) may start: past the hint's position when it was left by
 * the same search (at the same from) over a shorter prefix of the text, which found nothing
 * before it. */
static size_t hinted(const size_t hint[2], size_t from) { return hint && hint[0] == from && hint[1] > from ? hint[1] : from; }

/* After a search from `from` found no tag (longest tag_len bytes) in t[.., len): a later search
 * from there may skip to where a tag could still start. */
static void hint_miss(size_t hint[2], size_t from, size_t len, size_t tag_len) {
    if (!hint) return;
    const size_t s = len >= tag_len ? len - (tag_len - 1) : 0;
    hint[0] = from;
    hint[1] = s > from ? s : from;
}

enum { SEC_OK, SEC_PARTIAL, SEC_END, SEC_BAD };

/* Whether s[0, n), the text after a call's opening marker where the output ended before its name
 * did, reads as a name cut off (no whitespace inside it once trimmed; a marker's first bytes
 * included, but no whole marker: each ends with '>', and one after the name shows that the name
 * ended, in a call not of the format): a final parse then drops the call, neither a call with a
 * part of a name nor its markers as content (a partial parse held it back; finish_reason says
 * "length"). Other text there is not the format and stays content. */
static bool cut_name(const char *s, size_t n) {
    trim(&s, &n);
    for (size_t i = 0; i < n; i++)
        if (is_ws(s[i]) || s[i] == '>') return false;
    return true;
}

/* The text from t[from] on ended before a call's name did: still partial (SEC_PARTIAL), a name
 * cut off (SEC_END, the rest consumed: cut_name) or not the format (SEC_BAD). */
static int name_unended(const char *t, size_t len, size_t from, bool final, size_t *pos_io) {
    if (!final) return SEC_PARTIAL;
    if (!cut_name(t + from, len - from)) return SEC_BAD;
    *pos_io = len;
    return SEC_END;
}

/* ---- DeepSeek ---- */

/* ```json ... ``` around the arguments of the V3 / R1 form; cut (a call that max_tokens ended):
 * also a beginning of the opening fence ("`", "```js") and an end of text that may begin the
 * closing one ("`", "``"), which are markup, not arguments */
static void strip_fence(const char **s, size_t *n, bool cut) {
    trim(s, n);
    if (cut && *n < 7 && !memcmp(*s, "```json", *n)) *n = 0;
    if (*n >= 7 && !memcmp(*s, "```json", 7)) {
        *s += 7;
        *n -= 7;
    } else if (*n >= 3 && !memcmp(*s, "```", 3)) {
        *s += 3;
        *n -= 3;
    }
    if (*n >= 3 && !memcmp(*s + *n - 3, "```", 3)) *n -= 3;
    else if (cut)
        for (int k = 0; k < 2 && *n && (*s)[*n - 1] == '`'; k++) --*n;
    trim(s, n);
}

static int ds_section(const char *t, size_t len, size_t *pos_io, bool final, toolcall_result *r, size_t *hint) {
    size_t pos = *pos_io;
    for (;;) {
        pos = skip_ws(t, len, pos);
        *pos_io = pos;
        if (pos == len) return final ? SEC_END : SEC_PARTIAL;
        if (!final && (cut_of(t, len, pos, DS_CALLS_END) || cut_of(t, len, pos, DS_CALL_BEGIN))) return SEC_PARTIAL;
        if (at(t, len, pos, DS_CALLS_END)) {
            *pos_io = pos + strlen(DS_CALLS_END);
            return SEC_OK;
        }
        if (!at(t, len, pos, DS_CALL_BEGIN) || r->n_calls == TOOLCALL_MAX_CALLS) return SEC_BAD;
        size_t q = pos + strlen(DS_CALL_BEGIN);
        size_t sep = find(t, len, q, DS_SEP);
        if (sep == SIZE_MAX) return name_unended(t, len, q, final, pos_io);
        const char *h = t + q;
        size_t hn = sep - q;
        trim(&h, &hn);
        size_t a = sep + strlen(DS_SEP);
        bool fenced = hn == 8 && !memcmp(h, "function", 8);
        if (fenced) {
            size_t nl = find(t, len, a, "\n");
            if (nl == SIZE_MAX) return name_unended(t, len, a, final, pos_io);
            h = t + a;
            hn = nl - a;
            trim(&h, &hn);
            a = nl;
        }
        if (!hn) return SEC_BAD;
        toolcall *c = new_call(r);
        c->name = dup_n(h, hn);
        size_t end = find(t, len, hinted(hint, a), DS_CALL_END);
        if (end == SIZE_MAX) hint_miss(hint, a, len, strlen(DS_CALL_END));
        if (end == SIZE_MAX) {
            if (fenced && !final) return SEC_PARTIAL; /* arguments at the call's end */
            /* cut off (final) or still coming: never the start of the end marker */
            size_t e = len - partial_suffix(t, len, a, DS_CALL_END);
            const char *s = t + a;
            size_t n = e - a;
            if (fenced) strip_fence(&s, &n, true);
            set_args(c, s, n, true);
            *pos_io = len;
            return final ? SEC_END : SEC_PARTIAL;
        }
        const char *s = t + a;
        size_t n = end - a;
        if (fenced) strip_fence(&s, &n, false);
        set_args(c, s, n, true);
        c->done = true;
        pos = end + strlen(DS_CALL_END);
    }
}

/* ---- Kimi-K2 ---- */

static int km_section(const char *t, size_t len, size_t *pos_io, bool final, toolcall_result *r, size_t *hint) {
    size_t pos = *pos_io;
    for (;;) {
        pos = skip_ws(t, len, pos);
        *pos_io = pos;
        if (pos == len) return final ? SEC_END : SEC_PARTIAL;
        if (!final && (cut_of(t, len, pos, KM_SEC_END) || cut_of(t, len, pos, KM_SEC_END1) ||
                       cut_of(t, len, pos, KM_CALL_BEGIN)))
            return SEC_PARTIAL;
        if (at(t, len, pos, KM_SEC_END) || at(t, len, pos, KM_SEC_END1)) {
            *pos_io = pos + (at(t, len, pos, KM_SEC_END) ? strlen(KM_SEC_END) : strlen(KM_SEC_END1));
            return SEC_OK;
        }
        if (!at(t, len, pos, KM_CALL_BEGIN) || r->n_calls == TOOLCALL_MAX_CALLS) return SEC_BAD;
        size_t q = pos + strlen(KM_CALL_BEGIN);
        size_t ab = find(t, len, q, KM_ARG_BEGIN);
        if (ab == SIZE_MAX) return name_unended(t, len, q, final, pos_io);
        const char *id = t + q;
        size_t idn = ab - q;
        trim(&id, &idn);
        /* functions.NAME:IDX */
        const char *nm = id;
        size_t nn = idn;
        if (nn > 10 && !memcmp(nm, "functions.", 10)) {
            nm += 10;
            nn -= 10;
        }
        for (size_t k = nn; k > 0; k--)
            if (nm[k - 1] == ':') {
                nn = k - 1;
                break;
            }
        if (!nn) return SEC_BAD;
        toolcall *c = new_call(r);
        c->id = dup_n(id, idn);
        c->name = dup_n(nm, nn);
        size_t a = ab + strlen(KM_ARG_BEGIN);
        size_t end = find(t, len, hinted(hint, a), KM_CALL_END);
        if (end == SIZE_MAX) {
            hint_miss(hint, a, len, strlen(KM_CALL_END));
            size_t e = len - partial_suffix(t, len, a, KM_CALL_END);
            set_args(c, t + a, e - a, true);
            *pos_io = len;
            return final ? SEC_END : SEC_PARTIAL;
        }
        set_args(c, t + a, end - a, true);
        c->done = true;
        pos = end + strlen(KM_CALL_END);
    }
}

/* ---- GLM ---- */

bool toolcall_schema_any(const cJSON *sc, int (*says)(const cJSON *sc)) {
    const int r = says(sc);
    if (r >= 0) return r != 0;
    static const char *const alts[2] = {"anyOf", "oneOf"};
    for (int i = 0; i < 2; i++) {
        const cJSON *br = cJSON_GetObjectItemCaseSensitive(sc, alts[i]), *it;
        if (!cJSON_IsArray(br)) continue;
        cJSON_ArrayForEach(it, br) if (toolcall_schema_any(it, says)) return true;
    }
    return false;
}

/* a schema's own "type": is or lists "string" (1), does not (0), or is not there (-1) */
static int type_string(const cJSON *sc) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(sc, "type"), *it;
    if (cJSON_IsString(ty)) return !strcmp(ty->valuestring, "string");
    if (!cJSON_IsArray(ty)) return -1;
    cJSON_ArrayForEach(it, ty) if (cJSON_IsString(it) && !strcmp(it->valuestring, "string")) return 1;
    return 0;
}

/* whether a parameter's schema allows a string: its "type" is or lists "string", or a branch of
 * its anyOf / oneOf allows one (pydantic writes Optional[str] so); a schema without either
 * ($ref, enum, none at all) does not say so */
bool toolcall_schema_allows_string(const cJSON *sc) { return toolcall_schema_any(sc, type_string); }

/* a JSON value's type as a bit of a set of types: null 1, boolean 2, number 4, array 8, object 16
 * (a string 0) */
static int json_bit(const cJSON *v) {
    return cJSON_IsNull(v)     ? 1
           : cJSON_IsBool(v)   ? 2
           : cJSON_IsNumber(v) ? 4 /* integer or number: a whole number is both */
           : cJSON_IsArray(v)  ? 8
           : cJSON_IsObject(v) ? 16
                               : 0;
}
/* a schema's type name as that bit (integer and number both 4; string or a name unknown 0) */
static int type_bits1(const char *t) {
    return !strcmp(t, "null") ? 1 : !strcmp(t, "boolean") ? 2 : !strcmp(t, "integer") || !strcmp(t, "number") ? 4
           : !strcmp(t, "array") ? 8 : !strcmp(t, "object") ? 16 : 0;
}
/* the non-string types a schema allows: its "type" (or list), else the union over its anyOf /
 * oneOf branches; 31 (any) where neither says */
static int schema_other_types(const cJSON *sc) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(sc, "type"), *it;
    if (cJSON_IsString(ty)) return type_bits1(ty->valuestring);
    if (cJSON_IsArray(ty)) {
        int b = 0;
        cJSON_ArrayForEach(it, ty) if (cJSON_IsString(it)) b |= type_bits1(it->valuestring);
        return b;
    }
    static const char *const alts[2] = {"anyOf", "oneOf"};
    int b = 0;
    bool any = false;
    for (int i = 0; i < 2; i++) {
        const cJSON *br = cJSON_GetObjectItemCaseSensitive(sc, alts[i]);
        if (!cJSON_IsArray(br)) continue;
        any = true;
        cJSON_ArrayForEach(it, br) b |= schema_other_types(it);
    }
    return any ? b : 31;
}

/* How a GLM value's text is read (the format writes every value as text between its markers):
 * GV_TEXT where the parameter's schema allows a string and no other type; GV_JSON where it allows
 * no string (numbers, booleans, arrays, objects; $ref, enum and untyped parameters too): JSON where
 * the text is JSON, else the text; GV_EITHER where it allows a string and other types (pydantic's
 * Optional[str]: "null" is null), or the tool or the key is not declared (any type, as vLLM's and
 * llama.cpp's parsers read them): the JSON value where the text is JSON of an allowed type other
 * than a string, else the text. *other: the allowed non-string types (json_bit's bits). */
enum glm_value { GV_TEXT, GV_JSON, GV_EITHER };
static enum glm_value glm_value_kind(const cJSON *tools, const char *name, const char *key, int *other) {
    *other = 31;
    const cJSON *tl;
    cJSON_ArrayForEach(tl, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tl, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(nm) || strcmp(nm->valuestring, name)) continue;
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(fn, "parameters"), "properties");
        const cJSON *sc = cJSON_GetObjectItemCaseSensitive(pr, key);
        if (!cJSON_IsObject(sc)) return GV_EITHER;
        if (!toolcall_schema_allows_string(sc)) return GV_JSON;
        *other = schema_other_types(sc);
        return *other ? GV_EITHER : GV_TEXT;
    }
    return GV_EITHER;
}

/* (a GLM call's keys and text values go into cJSON through chat_json_str and come out through
 * chat_json_print, so that a NUL byte in them is kept as \u0000) */
static void glm_add_pair(cJSON *obj, const cJSON *tools, const char *name, const char *k, size_t kn, const char *v,
                         size_t vn) {
    char *key = chat_json_str(k, kn);
    char *val = chat_json_str(v, vn);
    cJSON *item = NULL;
    int other;
    const enum glm_value kind = glm_value_kind(tools, name, key, &other);
    if (kind != GV_TEXT) {
        const char *s = v;
        size_t n = vn;
        trim(&s, &n);
        const char *end = NULL;
        item = n ? cJSON_ParseWithLengthOpts(s, n, &end, 0) : NULL;
        if (item && end != s + n) {
            cJSON_Delete(item);
            item = NULL;
        }
        /* Python's literals, which GLM writes as its templates render them (vLLM's parser reads them too) */
        if (!item && n == 4 && !memcmp(s, "True", 4)) item = cJSON_CreateTrue();
        else if (!item && n == 5 && !memcmp(s, "False", 5)) item = cJSON_CreateFalse();
        else if (!item && n == 4 && !memcmp(s, "None", 4)) item = cJSON_CreateNull();
        if (item && kind == GV_EITHER && !(json_bit(item) & other)) { /* a string, or a type not allowed */
            cJSON_Delete(item);
            item = NULL;
        }
    }
    if (!item) item = cJSON_CreateString(val);
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    cJSON_AddItemToObject(obj, key, item);
    free(key);
    free(val);
}

static void glm_finish(toolcall *c, cJSON *obj) {
    char *s = chat_json_print(obj);
    set_args(c, s ? s : "{}", s ? strlen(s) : 2, false);
    free(s);
    cJSON_Delete(obj);
}

/* s[0, n) as JSON string text, left open (no closing quote) unless close */
static void sb_json_string(sb *b, const char *s, size_t n, bool close) {
    char *raw = chat_json_str(s, n);
    cJSON *js = cJSON_CreateString(raw);
    char *j = chat_json_print(js);
    sb_add(b, j, strlen(j) - (close ? 0 : 1));
    free(j);
    cJSON_Delete(js);
    free(raw);
}

/* A call cut off (the output ended inside it): the JSON text of its pairs so far, left open as
 * the model left it (no closing brace), then the pair it was writing: the key as far as written
 * (k, kn; NULL: none), and its value as far as written (v, vn; NULL: not begun): GV_TEXT ones as an
 * open JSON string, GV_JSON ones as written, GV_EITHER ones not yet (text or JSON is known once the
 * value ends: what is streamed is never taken back). */
static void glm_finish_cut(toolcall *c, cJSON *obj, const cJSON *tools, const char *k, size_t kn, bool key_done,
                           const char *v, size_t vn) {
    char *s = chat_json_print(obj);
    const bool any = cJSON_GetArraySize(obj) > 0;
    cJSON_Delete(obj);
    sb b = {0};
    sb_add(&b, s ? s : "{", s ? strlen(s) - 1 : 1); /* without its '}' */
    free(s);
    if (k) {
        if (any) sb_add(&b, ",", 1);
        sb_json_string(&b, k, kn, key_done); /* an unfinished key stays an open string */
        if (key_done) sb_add(&b, ":", 1);
        if (key_done && v) {
            char *key = dup_n(k, kn);
            int other;
            const enum glm_value kind = glm_value_kind(tools, c->name, key, &other);
            if (kind == GV_TEXT) sb_json_string(&b, v, vn, false);
            else if (kind == GV_JSON) sb_add(&b, v, vn);
            free(key);
        }
    }
    set_args(c, b.p ? b.p : "", b.n, false);
    free(b.p);
}

/* one call after "<tool_call>" */
static int gl_call(const char *t, size_t len, size_t *pos_io, bool final, const cJSON *tools, toolcall_result *r,
                   size_t *hint) {
    size_t q = *pos_io;
    if (r->n_calls == TOOLCALL_MAX_CALLS) return SEC_BAD;
    /* the name ends at a newline, its first pair or its end, whichever comes first */
    size_t ne = find(t, len, q, "\n");
    ne = find_before(t, len, q, GL_KEY_BEGIN, ne);
    ne = find_before(t, len, q, GL_CALL_END, ne);
    if (ne == SIZE_MAX) return name_unended(t, len, q, final, pos_io);
    const char *nm = t + q;
    size_t nn = ne - q;
    trim(&nm, &nn);
    if (!nn) return SEC_BAD;
    toolcall *c = new_call(r);
    c->name = dup_n(nm, nn);
    cJSON *obj = cJSON_CreateObject();
    size_t pos = ne;
    for (;;) {
        pos = skip_ws(t, len, pos);
        if (pos == len || cut_of(t, len, pos, GL_CALL_END) || cut_of(t, len, pos, GL_KEY_BEGIN)) {
            if (!final) {
                cJSON_Delete(obj);
                return SEC_PARTIAL;
            }
            /* cut off between pairs (or in a marker's first bytes): the pairs so far, left open */
            glm_finish_cut(c, obj, tools, NULL, 0, false, NULL, 0);
            *pos_io = len;
            return SEC_END;
        }
        if (at(t, len, pos, GL_CALL_END)) {
            glm_finish(c, obj);
            c->done = true;
            *pos_io = pos + strlen(GL_CALL_END);
            return SEC_OK;
        }
        bool ok = at(t, len, pos, GL_KEY_BEGIN);
        size_t k0 = pos + strlen(GL_KEY_BEGIN), k1 = ok ? find(t, len, k0, GL_KEY_END) : SIZE_MAX;
        size_t v = k1 == SIZE_MAX ? SIZE_MAX : skip_ws(t, len, k1 + strlen(GL_KEY_END));
        size_t v0 = 0, v1 = SIZE_MAX;
        if (v != SIZE_MAX && at(t, len, v, GL_VAL_BEGIN)) {
            v0 = v + strlen(GL_VAL_BEGIN);
            v1 = find(t, len, hinted(hint, v0), GL_VAL_END);
            if (v1 == SIZE_MAX) hint_miss(hint, v0, len, strlen(GL_VAL_END));
        }
        if (v1 == SIZE_MAX) {
            /* an unfinished pair, or not the format */
            bool unfinished = ok && (k1 == SIZE_MAX || v == len || cut_of(t, len, v, GL_VAL_BEGIN) || v0);
            if (!final && unfinished) {
                cJSON_Delete(obj);
                return SEC_PARTIAL;
            }
            if (final && unfinished) { /* cut off inside a pair: it too, as far as written */
                const size_t ke = k1 == SIZE_MAX ? len - partial_suffix(t, len, k0, GL_KEY_END) : k1;
                const size_t ve = v0 ? len - partial_suffix(t, len, v0, GL_VAL_END) : 0;
                glm_finish_cut(c, obj, tools, t + k0, ke - k0, k1 != SIZE_MAX, v0 ? t + v0 : NULL, v0 ? ve - v0 : 0);
                *pos_io = len;
                return SEC_END;
            }
            /* text inside the call that is not a pair: the call ends at its "</tool_call>" with
             * the pairs before it (that text is dropped, as vLLM drops it), or is cut off there */
            const size_t ce = find(t, len, pos, GL_CALL_END);
            if (ce == SIZE_MAX) {
                if (!final) {
                    cJSON_Delete(obj);
                    return SEC_PARTIAL;
                }
                glm_finish_cut(c, obj, tools, NULL, 0, false, NULL, 0);
                *pos_io = len;
                return SEC_END;
            }
            glm_finish(c, obj);
            c->done = true;
            *pos_io = ce + strlen(GL_CALL_END);
            return SEC_OK;
        }
        const char *ks = t + k0;
        size_t kn = k1 - k0;
        trim(&ks, &kn);
        glm_add_pair(obj, tools, c->name, ks, kn, t + v0, v1 - v0);
        pos = v1 + strlen(GL_VAL_END);
    }
}

/* ---- driver ---- */

/* The content: a span of the text while it is one (no copy), else a copy of its pieces */
typedef struct cat {
    const char *v; /* the span */
    size_t vn;
    sb b;          /* the copy, once it is not one span */
    bool owned;
} cat;

static void cat_add(cat *c, const char *s, size_t n) {
    if (!n) return;
    if (!c->owned && (!c->vn || s == c->v + c->vn)) {
        if (!c->vn) c->v = s;
        c->vn += n;
        return;
    }
    if (!c->owned) {
        sb_add(&c->b, c->v, c->vn);
        c->owned = true;
    }
    sb_add(&c->b, s, n);
}

void toolcall_parse(enum toolcall_kind k, const char *t, size_t len, bool final, const cJSON *tools,
                    toolcall_scan *scan, toolcall_result *r) {
    memset(r, 0, sizeof *r);
    cat content = {.v = ""};
    const char *starts[2] = {NULL, NULL};
    int n_starts = 0;
    if (k == TOOLCALL_DEEPSEEK) starts[n_starts++] = DS_CALLS_BEGIN;
    else if (k == TOOLCALL_KIMI_K2) {
        starts[n_starts++] = KM_SEC_BEGIN;
        starts[n_starts++] = KM_SEC_BEGIN1;
    } else if (k == TOOLCALL_GLM) starts[n_starts++] = GL_CALL_BEGIN;
    size_t pos = 0, longest = 0;
    for (int i = 0; i < n_starts; i++)
        if (strlen(starts[i]) > longest) longest = strlen(starts[i]);
    while (pos <= len) {
        size_t m = SIZE_MAX, ml = 0;
        const size_t from = hinted(scan ? scan->top : NULL, pos);
        for (int i = 0; i < n_starts; i++) {
            size_t f = find_before(t, len, from, starts[i], m);
            if (f < m) {
                m = f;
                ml = strlen(starts[i]);
            }
        }
        if (m == SIZE_MAX) hint_miss(scan ? scan->top : NULL, pos, len, longest);
        if (m == SIZE_MAX || r->n_calls == TOOLCALL_MAX_CALLS) {
            size_t end = len;
            if (!final && r->n_calls < TOOLCALL_MAX_CALLS)
                for (int i = 0; i < n_starts; i++) {
                    size_t ps = partial_suffix(t, len, pos, starts[i]);
                    if (len - ps < end) end = len - ps;
                }
            /* trailing whitespace may still come before a call (held back) */
            if (!final)
                while (end > pos && is_ws(t[end - 1])) end--;
            if (end > pos && !(r->n_calls && final && all_ws(t + pos, end - pos))) cat_add(&content, t + pos, end - pos);
            break;
        }
        /* the text before a call, without the whitespace that separates it from the call */
        size_t seg = m;
        while (seg > pos && is_ws(t[seg - 1])) seg--;
        cat_add(&content, t + pos, seg - pos);
        size_t sp = m + ml, *ah = scan ? scan->arg : NULL;
        int before = r->n_calls;
        int st = k == TOOLCALL_DEEPSEEK ? ds_section(t, len, &sp, final, r, ah)
                 : k == TOOLCALL_KIMI_K2 ? km_section(t, len, &sp, final, r, ah)
                                         : gl_call(t, len, &sp, final, tools, r, ah);
        if (st != SEC_BAD || r->n_calls > before) r->opened = true;
        for (int i = before; i < r->n_calls; i++) r->calls[i].content_at = content.owned ? content.b.n : content.vn;
        if (st == SEC_OK) {
            pos = sp;
            continue;
        }
        if (st == SEC_BAD) {
            /* not the format: the text from there on stays content (when no call of this
             * section was read, from the whitespace before its start marker: all of it, as it was) */
            size_t from = r->n_calls == before ? seg : sp;
            cat_add(&content, t + from, len - from);
        }
        break;
    }
    r->content_view = !content.owned;
    r->content = content.owned ? content.b.p : (char *)content.v;
    r->content_len = content.owned ? content.b.n : content.vn;
}

void toolcall_result_free(toolcall_result *r) {
    if (!r) return;
    if (!r->content_view) free(r->content);
    for (int i = 0; i < r->n_calls; i++) {
        free(r->calls[i].id);
        free(r->calls[i].name);
        if (!r->calls[i].args_view) free(r->calls[i].args);
    }
    memset(r, 0, sizeof *r);
}

/* Kimi-K2's markers, its call section's first (KIMI_SECTION_MARKS of them) */
static const char *const kimi_marks[] = {TOOLCALL_KIMI_SECTION_BEGIN, TOOLCALL_KIMI_SECTION_BEGIN1,
                                         TOOLCALL_KIMI_SECTION_END,   TOOLCALL_KIMI_SECTION_END1,
                                         TOOLCALL_KIMI_CALL_BEGIN,    TOOLCALL_KIMI_ARG_BEGIN,
                                         TOOLCALL_KIMI_CALL_END,      NULL};
enum { KIMI_SECTION_MARKS = 4 };

/* whether s[0, len) is one of the first n markers of mk (NULL-ended) */
static bool one_of(const char *const *mk, size_t n, const char *s, size_t len) {
    for (size_t i = 0; i < n && mk && mk[i]; i++)
        if (strlen(mk[i]) == len && !memcmp(s, mk[i], len)) return true;
    return false;
}

bool toolcall_marker(enum toolcall_kind k, const char *s, size_t len) {
    static const char *const ds[] = {TOOLCALL_DS_CALLS_BEGIN, TOOLCALL_DS_CALLS_END, TOOLCALL_DS_CALL_BEGIN,
                                     TOOLCALL_DS_CALL_END, TOOLCALL_DS_SEP, NULL};
    static const char *const glm[] = {TOOLCALL_GLM_CALL_BEGIN, TOOLCALL_GLM_CALL_END, TOOLCALL_GLM_KEY_BEGIN,
                                      TOOLCALL_GLM_KEY_END,    TOOLCALL_GLM_VAL_BEGIN, TOOLCALL_GLM_VAL_END, NULL};
    const char *const *mk = k == TOOLCALL_DEEPSEEK ? ds
                            : k == TOOLCALL_KIMI_K2 ? kimi_marks
                            : k == TOOLCALL_GLM     ? glm
                                                    : NULL;
    return one_of(mk, SIZE_MAX, s, len);
}

bool toolcall_kimi_section_marker(const char *s, size_t len) { return one_of(kimi_marks, KIMI_SECTION_MARKS, s, len); }

bool toolcall_name_ok(const char *name) {
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        if (*c <= ' ' || *c == '<' || *c == 0x7F) return false;
    return true;
}
