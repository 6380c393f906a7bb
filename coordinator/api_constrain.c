/* api_constrain: see api_constrain.h. */
#include "coordinator/api_constrain.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gram.h"
#include "common/mla_err.h"
#include "coordinator/api_params.h"
#include "coordinator/chat_reasoning.h"
#include "coordinator/chat_toolcall.h"

/* ---- a growing string --------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool over; /* beyond GRAM_MAX_TEXT */
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t len) {
    if (b->over || b->n + len + 1 > GRAM_MAX_TEXT) {
        b->over = true;
        return;
    }
    if (b->n + len + 1 > b->cap) {
        b->cap = (b->n + len + 1) * 2;
        b->p = mla_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = 0;
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        sb_add(b, tmp, (size_t)n);
        return;
    }
    char *big = mla_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_add(b, big, (size_t)n);
    free(big);
}

/* s as a GBNF string literal */
static void sb_lit(sbuf *b, const char *s) {
    sb_add(b, "\"", 1);
    for (const unsigned char *u = (const unsigned char *)s; *u; u++) {
        if (*u == '"' || *u == '\\') {
            char e[2] = {'\\', (char)*u};
            sb_add(b, e, 2);
        } else if (*u < 0x20 || *u == 0x7F) {
            sb_printf(b, "\\x%02X", *u);
        } else {
            sb_add(b, (const char *)u, 1);
        }
    }
    sb_add(b, "\"", 1);
}

/* ---- the JSON grammar --------------------------------------------------------------------- */

static const char json_base[] =
    "ws ::= [ \\t\\n]{0,8}\n"
    "jstr ::= \"\\\"\" jchar* \"\\\"\"\n"
    "jchar ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "jint ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
    "jnum ::= jint (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n"
    "jbool ::= \"true\" | \"false\"\n"
    "jnull ::= \"null\"\n"
    "jval ::= jobj | jarr | jstr | jnum | jbool | jnull\n"
    "jobj ::= \"{\" ws (jstr ws \":\" ws jval (ws \",\" ws jstr ws \":\" ws jval)*)? ws \"}\"\n"
    "jarr ::= \"[\" ws (jval (ws \",\" ws jval)*)? ws \"]\"\n";

const char *api_json_object_gbnf(void) {
    static char g[sizeof json_base + 32];
    if (!g[0]) snprintf(g, sizeof g, "root ::= jobj\n%s", json_base);
    return g;
}

/* ---- schema compiler ---------------------------------------------------------------------- */

typedef struct sref {
    char *ref;
    int rule;
} sref;

typedef struct sctx {
    const cJSON *root;
    const char *pfx; /* the rules' names: pfx + number */
    sbuf out;
    int n_rules;
    sref *refs;
    int n_refs, cap_refs;
    char *err;
    size_t err_len;
    bool failed;
} sctx;

static int fail(sctx *c, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(sctx *c, const char *path, const char *fmt, ...) {
    if (c->failed) return -1;
    c->failed = true;
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snprintf(c->err, c->err_len, "%s (at #%s)", m, path);
    return -1;
}

static const char *const annotations[] = {"title", "description", "default", "examples", "$schema", "$id",
                                          "$comment", "$defs", "definitions", NULL};
static const char *const keywords[] = {"type", "properties", "required", "additionalProperties", "items",
                                       "minItems", "maxItems", "minLength", "maxLength", "enum", "const",
                                       "anyOf", "oneOf", "$ref", NULL};

static int gen(sctx *c, const cJSON *s, const char *path, int depth);

static int new_rule(sctx *c) { return c->n_rules++; }

/* a rule "sN ::= " header; the caller writes the body and the newline */
static void rule_head(sctx *c, int r) { sb_printf(&c->out, "%s%d ::= ", c->pfx, r); }

static int get_count(sctx *c, const cJSON *s, const char *k, const char *path, int64_t *v) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(s, k);
    if (!j) return 0;
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < 0)
        return fail(c, path, "'%s' must be a non-negative integer", k);
    if (j->valuedouble > GRAM_MAX_REPEAT)
        return fail(c, path, "'%s' above %d is not supported", k, GRAM_MAX_REPEAT);
    *v = (int64_t)j->valuedouble;
    return 1;
}

/* "x{mn,mx}" in GBNF (mx < 0: unbounded) */
static void sb_rep(sbuf *b, const char *x, int64_t mn, int64_t mx) {
    if (mx < 0) sb_printf(b, "%s{%lld,}", x, (long long)mn);
    else sb_printf(b, "%s{%lld,%lld}", x, (long long)mn, (long long)mx);
}

static int gen_literal(sctx *c, const cJSON *v) {
    char *txt = cJSON_PrintUnformatted(v);
    if (!txt) return fail(c, "", "cannot print a value of enum/const");
    sb_lit(&c->out, txt);
    free(txt);
    return 0;
}

static int gen_object(sctx *c, const cJSON *s, const char *path, int depth, int r) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(c, path, "'properties' must be an object");
    if (req && !cJSON_IsArray(req)) return fail(c, path, "'required' must be a list of names");
    if (addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl))
        return fail(c, path, "'additionalProperties' must be a boolean or a schema");
    const cJSON *it;
    cJSON_ArrayForEach(it, req) {
        if (!cJSON_IsString(it)) return fail(c, path, "'required' must be a list of names");
        if (!cJSON_GetObjectItemCaseSensitive(props, it->valuestring))
            return fail(c, path, "required property '%s' is not in 'properties'", it->valuestring);
    }
    int n = cJSON_GetArraySize(props);
    if (n == 0) {
        if (cJSON_IsFalse(addl)) {
            rule_head(c, r);
            sb_printf(&c->out, "\"{\" ws \"}\"\n");
            return 0;
        }
        if (cJSON_IsObject(addl)) { /* a map */
            char p2[300];
            snprintf(p2, sizeof p2, "%s/additionalProperties", path);
            int v = gen(c, addl, p2, depth + 1);
            if (v < 0) return -1;
            rule_head(c, r);
            sb_printf(&c->out, "\"{\" ws (jstr ws \":\" ws %s%d (ws \",\" ws jstr ws \":\" ws %s%d)*)? ws \"}\"\n", c->pfx,
                      v, c->pfx, v);
            return 0;
        }
        rule_head(c, r);
        sb_printf(&c->out, "jobj\n");
        return 0;
    }
    /* known properties in the schema's order, optional ones skippable; no other keys (outputs stay
     * valid under any additionalProperties) */
    int *kv = mla_xmalloc((size_t)n * sizeof *kv);
    bool *need = mla_xcalloc((size_t)n, sizeof *need);
    int i = 0;
    cJSON_ArrayForEach(it, props) {
        const cJSON *q;
        cJSON_ArrayForEach(q, req) if (!strcmp(q->valuestring, it->string)) need[i] = true;
        char p2[300];
        snprintf(p2, sizeof p2, "%s/properties/%.100s", path, it->string);
        int v = gen(c, it, p2, depth + 1);
        if (v < 0) {
            free(kv);
            free(need);
            return -1;
        }
        kv[i] = new_rule(c);
        rule_head(c, kv[i]);
        {
            cJSON *ks = cJSON_CreateString(it->string);
            char *kt = cJSON_PrintUnformatted(ks);
            sb_lit(&c->out, kt);
            free(kt);
            cJSON_Delete(ks);
        }
        sb_printf(&c->out, " ws \":\" ws %s%d\n", c->pfx, v);
        i++;
    }
    /* after_i: the properties from i on, each preceded by a comma; first_i: the same with
     * nothing before */
    int *after = mla_xmalloc(((size_t)n + 1) * sizeof *after), *first = mla_xmalloc(((size_t)n + 1) * sizeof *first);
    after[n] = -1;
    first[n] = -1;
    for (int k = n - 1; k >= 0; k--) {
        after[k] = new_rule(c);
        rule_head(c, after[k]);
        sb_printf(&c->out, need[k] ? "ws \",\" ws %s%d" : "(ws \",\" ws %s%d)?", c->pfx, kv[k]);
        if (after[k + 1] >= 0) sb_printf(&c->out, " %s%d", c->pfx, after[k + 1]);
        sb_printf(&c->out, "\n");
        first[k] = new_rule(c);
        rule_head(c, first[k]);
        sb_printf(&c->out, "%s%d", c->pfx, kv[k]);
        if (after[k + 1] >= 0) sb_printf(&c->out, " %s%d", c->pfx, after[k + 1]);
        if (!need[k]) {
            if (first[k + 1] >= 0) sb_printf(&c->out, " | %s%d", c->pfx, first[k + 1]);
            else sb_printf(&c->out, " | \"\"");
        }
        sb_printf(&c->out, "\n");
    }
    rule_head(c, r);
    sb_printf(&c->out, "\"{\" ws %s%d ws \"}\"\n", c->pfx, first[0]);
    free(kv);
    free(need);
    free(after);
    free(first);
    return 0;
}

static int gen_array(sctx *c, const cJSON *s, const char *path, int depth, int r) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    int64_t mn = 0, mx = -1;
    if (get_count(c, s, "minItems", path, &mn) < 0 || get_count(c, s, "maxItems", path, &mx) < 0) return -1;
    if (mx >= 0 && mx < mn) return fail(c, path, "'maxItems' is below 'minItems'");
    if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items))
        return fail(c, path, "'items' must be a schema (a list of schemas, prefixItems style, is not supported)");
    char it[32] = "jval";
    if (items) {
        char p2[300];
        snprintf(p2, sizeof p2, "%s/items", path);
        int v = gen(c, items, p2, depth + 1);
        if (v < 0) return -1;
        snprintf(it, sizeof it, "%s%d", c->pfx, v);
    }
    rule_head(c, r);
    if (mx == 0) {
        sb_printf(&c->out, "\"[\" ws \"]\"\n");
        return 0;
    }
    char more[64];
    snprintf(more, sizeof more, "(ws \",\" ws %s)", it);
    sb_printf(&c->out, "\"[\" ws %s%s ", mn == 0 ? "(" : "", it);
    sb_rep(&c->out, more, mn > 0 ? mn - 1 : 0, mx < 0 ? -1 : mx - 1);
    sb_printf(&c->out, "%s ws \"]\"\n", mn == 0 ? ")?" : "");
    return 0;
}

static int gen_type(sctx *c, const cJSON *s, const char *t, const char *path, int depth, int r) {
    if (!strcmp(t, "object")) return gen_object(c, s, path, depth, r);
    if (!strcmp(t, "array")) return gen_array(c, s, path, depth, r);
    if (!strcmp(t, "string")) {
        int64_t mn = 0, mx = -1;
        if (get_count(c, s, "minLength", path, &mn) < 0 || get_count(c, s, "maxLength", path, &mx) < 0) return -1;
        if (mx >= 0 && mx < mn) return fail(c, path, "'maxLength' is below 'minLength'");
        rule_head(c, r);
        if (mn == 0 && mx < 0) {
            sb_printf(&c->out, "jstr\n");
        } else {
            sb_printf(&c->out, "\"\\\"\" ");
            sb_rep(&c->out, "jchar", mn, mx);
            sb_printf(&c->out, " \"\\\"\"\n");
        }
        return 0;
    }
    const char *base = !strcmp(t, "number") ? "jnum" : !strcmp(t, "integer") ? "jint" : !strcmp(t, "boolean") ? "jbool"
                       : !strcmp(t, "null") ? "jnull" : NULL;
    if (!base) return fail(c, path, "unknown type '%.60s'", t);
    rule_head(c, r);
    sb_printf(&c->out, "%s\n", base);
    return 0;
}

static int gen_ref(sctx *c, const char *ref, const char *path, int depth) {
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ref, ref)) return c->refs[i].rule;
    const cJSON *target = NULL;
    if (!strcmp(ref, "#")) {
        target = c->root;
    } else if (!strncmp(ref, "#/$defs/", 8) || !strncmp(ref, "#/definitions/", 14)) {
        const char *sec = ref[2] == '$' ? "$defs" : "definitions";
        const char *name = ref + (ref[2] == '$' ? 8 : 14);
        if (strchr(name, '/') || strchr(name, '~'))
            return fail(c, path, "$ref '%.100s': only #/$defs/NAME and #/definitions/NAME are supported", ref);
        target = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->root, sec), name);
    } else {
        return fail(c, path, "$ref '%.100s': only #/$defs/NAME and #/definitions/NAME are supported", ref);
    }
    if (!target) return fail(c, path, "$ref '%.100s' points to nothing", ref);
    int r = new_rule(c);
    if (c->n_refs == c->cap_refs) {
        c->cap_refs = c->cap_refs ? 2 * c->cap_refs : 8;
        c->refs = mla_xrealloc(c->refs, (size_t)c->cap_refs * sizeof *c->refs);
    }
    c->refs[c->n_refs].ref = mla_xstrdup(ref);
    c->refs[c->n_refs++].rule = r;
    int v = gen(c, target, ref + 1, depth + 1);
    if (v < 0) return -1;
    rule_head(c, r);
    sb_printf(&c->out, "%s%d\n", c->pfx, v);
    return r;
}

/* whether JSON value v is of JSON-schema type t ("integer": a number without a fraction) */
static bool of_type(const cJSON *v, const char *t) {
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    return false;
}

/* whether value v is of a schema's 'type' (a name or a list of names) */
static bool of_types(const cJSON *v, const cJSON *type) {
    if (cJSON_IsString(type)) return of_type(v, type->valuestring);
    const cJSON *t;
    cJSON_ArrayForEach(t, type) if (cJSON_IsString(t) && of_type(v, t->valuestring)) return true;
    return false;
}

/* A 'type' beside 'enum' (a list) or 'const' (what Pydantic writes for an Enum or a Literal) only
 * repeats what the values say: true when every value is of it */
static bool type_redundant(const cJSON *type, const cJSON *en, const cJSON *cn) {
    if (cn) return of_types(cn, type);
    const cJSON *v;
    cJSON_ArrayForEach(v, en) if (!of_types(v, type)) return false;
    return true;
}

/* Compiles schema s into a new rule; returns its number, -1 on failure. */
static int gen(sctx *c, const cJSON *s, const char *path, int depth) {
    if (c->failed) return -1;
    if (depth > API_SCHEMA_MAX_DEPTH) return fail(c, path, "the schema is nested deeper than %d", API_SCHEMA_MAX_DEPTH);
    if (c->out.over) return fail(c, path, "the schema's grammar is larger than %u bytes", GRAM_MAX_TEXT);
    int r = new_rule(c);
    if (cJSON_IsTrue(s)) {
        rule_head(c, r);
        sb_printf(&c->out, "jval\n");
        return r;
    }
    if (cJSON_IsFalse(s)) return fail(c, path, "the schema false admits no value");
    if (!cJSON_IsObject(s)) return fail(c, path, "a schema must be an object or a boolean");
    const cJSON *k;
    int n_cons = 0;
    cJSON_ArrayForEach(k, s) {
        if (api_in_list(annotations, k->string)) continue;
        if (!api_in_list(keywords, k->string))
            return fail(c, path, "unsupported JSON-schema keyword '%.60s'", k->string);
        n_cons++;
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (!any) any = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const char *single = ref ? "$ref" : en ? "enum" : cn ? "const" : any ? (any->string[0] == 'a' ? "anyOf" : "oneOf")
                                                                       : NULL;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    if ((en || cn) && !ref && ty && n_cons == 2 && (!en || cJSON_IsArray(en))) {
        if (!type_redundant(ty, en, cn))
            return fail(c, path, "a value of '%s' is not of the schema's 'type'", single);
        n_cons--;
    }
    if (single && n_cons > 1)
        return fail(c, path, "'%s' together with other keywords is not supported (move them into its branches)",
                    single);
    if (ref) {
        if (!cJSON_IsString(ref)) return fail(c, path, "'$ref' must be a string");
        int v = gen_ref(c, ref->valuestring, path, depth);
        if (v < 0) return -1;
        rule_head(c, r);
        sb_printf(&c->out, "%s%d\n", c->pfx, v);
        return r;
    }
    if (en || cn) {
        if (en && (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0))
            return fail(c, path, "'enum' must be a non-empty list");
        rule_head(c, r);
        if (cn) {
            if (gen_literal(c, cn)) return -1;
        } else {
            const cJSON *v;
            int i = 0;
            cJSON_ArrayForEach(v, en) {
                if (i++) sb_printf(&c->out, " | ");
                if (gen_literal(c, v)) return -1;
            }
        }
        sb_printf(&c->out, "\n");
        return r;
    }
    if (any) {
        if (!cJSON_IsArray(any) || cJSON_GetArraySize(any) == 0)
            return fail(c, path, "'%s' must be a non-empty list of schemas", single);
        int na = cJSON_GetArraySize(any);
        int *alts = mla_xmalloc((size_t)na * sizeof *alts);
        int i = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, any) {
            char p2[300];
            snprintf(p2, sizeof p2, "%s/%s/%d", path, single, i);
            alts[i] = gen(c, v, p2, depth + 1);
            if (alts[i] < 0) {
                free(alts);
                return -1;
            }
            i++;
        }
        rule_head(c, r);
        for (i = 0; i < na; i++) sb_printf(&c->out, "%s%s%d", i ? " | " : "", c->pfx, alts[i]);
        sb_printf(&c->out, "\n");
        free(alts);
        return r;
    }
    if (!ty) {
        if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "additionalProperties") ||
            cJSON_GetObjectItemCaseSensitive(s, "required"))
            return gen_type(c, s, "object", path, depth, r) < 0 ? -1 : r;
        if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "minItems") ||
            cJSON_GetObjectItemCaseSensitive(s, "maxItems"))
            return gen_type(c, s, "array", path, depth, r) < 0 ? -1 : r;
        if (cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength"))
            return fail(c, path, "'minLength'/'maxLength' without \"type\": \"string\" is not supported");
        rule_head(c, r);
        sb_printf(&c->out, "jval\n");
        return r;
    }
    if (cJSON_IsString(ty)) return gen_type(c, s, ty->valuestring, path, depth, r) < 0 ? -1 : r;
    if (!cJSON_IsArray(ty) || cJSON_GetArraySize(ty) == 0)
        return fail(c, path, "'type' must be a type name or a non-empty list of them");
    int nt = cJSON_GetArraySize(ty);
    int *alts = mla_xmalloc((size_t)nt * sizeof *alts);
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, ty) {
        if (!cJSON_IsString(t)) {
            free(alts);
            return fail(c, path, "'type' must be a type name or a non-empty list of them");
        }
        alts[i] = new_rule(c);
        if (gen_type(c, s, t->valuestring, path, depth, alts[i]) < 0) {
            free(alts);
            return -1;
        }
        i++;
    }
    rule_head(c, r);
    for (i = 0; i < nt; i++) sb_printf(&c->out, "%s%s%d", i ? " | " : "", c->pfx, alts[i]);
    sb_printf(&c->out, "\n");
    free(alts);
    return r;
}

/* The objects of JSON value j (j included), counting stopped past cap. */
static int count_objects(const cJSON *j, int cap) {
    int n = cJSON_IsObject(j) ? 1 : 0;
    const cJSON *k;
    if (cJSON_IsObject(j) || cJSON_IsArray(j))
        cJSON_ArrayForEach(k, j) {
            if (n > cap) break;
            n += count_objects(k, cap - n);
        }
    return n;
}

/* The rules of node, a part of schema root at path ("" for root itself; its $refs resolve against
 * root), named pfx + number (no root rule, no JSON base rules) into *out, its top rule in *top
 * (pfx + that number). */
static int schema_rules_at(const cJSON *root, const cJSON *node, const char *path, const char *pfx, char **out,
                           char *top, size_t top_len, char *err, size_t err_len) {
    *out = NULL;
    sctx c = {.root = root, .pfx = pfx, .err = err, .err_len = err_len};
    if (count_objects(root, API_SCHEMA_MAX_NODES) > API_SCHEMA_MAX_NODES) {
        fail(&c, "", "the schema has more than %d objects (subschemas); it is not compiled", API_SCHEMA_MAX_NODES);
        return MLA_ERR;
    }
    sb_add(&c.out, "", 0);
    int r = gen(&c, node, path, 0);
    if (r >= 0 && c.out.over) r = fail(&c, "", "the schema's grammar is larger than %u bytes", GRAM_MAX_TEXT);
    for (int i = 0; i < c.n_refs; i++) free(c.refs[i].ref);
    free(c.refs);
    if (r < 0) {
        free(c.out.p);
        return MLA_ERR;
    }
    snprintf(top, top_len, "%s%d", pfx, r);
    *out = c.out.p;
    return MLA_OK;
}

static int schema_rules(const cJSON *schema, const char *pfx, char **out, char *top, size_t top_len, char *err,
                        size_t err_len) {
    return schema_rules_at(schema, schema, "", pfx, out, top, top_len, err, err_len);
}

int api_schema_to_gbnf(const cJSON *schema, char **out, char *err, size_t err_len) {
    *out = NULL;
    char *rules, top[32];
    if (schema_rules(schema, "s", &rules, top, sizeof top, err, err_len)) return MLA_ERR;
    sbuf b = {0};
    sb_printf(&b, "root ::= %s\n", top);
    sb_add(&b, rules, strlen(rules));
    sb_add(&b, json_base, strlen(json_base));
    free(rules);
    mla_err e = {{0}};
    if (b.over) {
        snprintf(err, err_len, "the schema's grammar is larger than %u bytes (at #)", GRAM_MAX_TEXT);
    } else if (gram_check(b.p, b.n, &e)) {
        /* e.g. a $ref cycle through nothing but references */
        snprintf(err, err_len, "the schema cannot be compiled to a grammar: %s (at #)", e.msg);
    } else {
        *out = b.p;
        return MLA_OK;
    }
    free(b.p);
    return MLA_ERR;
}

/* ---- tool calls ---------------------------------------------------------------------------- */

typedef struct tg {
    sbuf out;
    bool forced; /* tool_choice required or named: the arguments held to the schema where it can be */
    int loose;   /* tools held that are not strict (forced) */
    api_constrain_token_fn tok;
    void *ud;
    char *err;
    size_t err_len;
} tg;

/* "<[id]>" of a marker, into m (32 bytes); MLA_ERR when it is not one token of the vocabulary */
static int tg_mark(tg *t, const char *text, char *m) {
    const int32_t id = t->tok(t->ud, text);
    if (id < 0) {
        snprintf(t->err, t->err_len, "this model's vocabulary does not hold the tool-call marker '%s' as one token",
                 text);
        return MLA_ERR;
    }
    snprintf(m, 32, "<[%d]>", id);
    return MLA_OK;
}

static const cJSON *tool_fn(const cJSON *tl) { return cJSON_GetObjectItemCaseSensitive(tl, "function"); }
static const char *tool_name(const cJSON *tl) {
    return cJSON_GetObjectItemCaseSensitive(tool_fn(tl), "name")->valuestring;
}
static bool tool_strict(const cJSON *tl) { return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(tool_fn(tl), "strict")); }

/* Whether tool tl's arguments are held to its parameters schema: a strict tool's (its schema
 * outside the subset a 400), and, as vLLM does, any tool's where tool_choice forces a call and the
 * schema is an object schema (one outside the subset then leaves the arguments any JSON object:
 * the schema was not promised) */
static bool tool_held(const tg *t, const cJSON *tl) {
    if (tool_strict(tl)) return true;
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(tool_fn(tl), "parameters"),
                *ty = cJSON_GetObjectItemCaseSensitive(ps, "type");
    return t->forced && cJSON_IsString(ty) && !strcmp(ty->valuestring, "object");
}

/* the tool's arguments as JSON: rule name into arg (its rules added), per its schema when held */
static int tg_json_args(tg *t, const cJSON *tl, int i, char *arg, size_t arg_len) {
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(tool_fn(tl), "parameters");
    if (!tool_held(t, tl) || !cJSON_IsObject(ps)) {
        snprintf(arg, arg_len, "jobj");
        return MLA_OK;
    }
    char pfx[24], *rules = NULL, msg[400];
    snprintf(pfx, sizeof pfx, "t%ds", i);
    if (schema_rules(ps, pfx, &rules, arg, arg_len, msg, sizeof msg)) {
        if (!tool_strict(tl)) { /* forced, beyond the subset: any object */
            snprintf(arg, arg_len, "jobj");
            return MLA_OK;
        }
        snprintf(t->err, t->err_len, "tool '%.100s' (strict): its parameters: %s", tool_name(tl), msg);
        return MLA_ERR;
    }
    sb_add(&t->out, rules, strlen(rules));
    free(rules);
    if (!tool_strict(tl)) t->loose++;
    return MLA_OK;
}

/* a schema bounds a string's length (1), else its anyOf / oneOf branches are asked (-1) */
static int length_bound(const cJSON *sc) {
    return cJSON_GetObjectItemCaseSensitive(sc, "minLength") || cJSON_GetObjectItemCaseSensitive(sc, "maxLength") ? 1
                                                                                                                 : -1;
}

/* GLM: the pairs of tool i's call into rule "t<i>p": per its schema when held (tool_held: its
 * properties in their order, the required ones present; a value that may be a string is the model's
 * text (one of its enum or its const where it lists them), any other JSON per the property's
 * schema), else any pairs. The values' text never holds a control token. A forced tool that is not
 * strict and whose schema cannot be held gets any pairs (tg_glm_held's refusal dropped). */
static int tg_glm_held(tg *t, const cJSON *tl, int i, const char *ak, const char *ake, const char *av,
                       const char *ave);
static int tg_glm_pairs(tg *t, const cJSON *tl, int i, const char *ak, const char *ake, const char *av,
                        const char *ave) {
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(tool_fn(tl), "parameters");
    const size_t mark = t->out.n;
    const bool over = t->out.over;
    if (tool_held(t, tl) && cJSON_IsObject(ps)) {
        if (tg_glm_held(t, tl, i, ak, ake, av, ave) == MLA_OK) {
            if (!tool_strict(tl)) t->loose++;
            return MLA_OK;
        }
        if (tool_strict(tl)) return MLA_ERR;
        t->out.n = mark; /* the rules it added before it gave up */
        t->out.over = over;
        if (t->out.p) t->out.p[mark] = 0;
        t->err[0] = 0;
    }
    sb_printf(&t->out, "t%dp ::= gpair*\n", i);
    return MLA_OK;
}

static int tg_glm_held(tg *t, const cJSON *tl, int i, const char *ak, const char *ake, const char *av,
                       const char *ave) {
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(tool_fn(tl), "parameters");
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(ps, "properties"),
                *req = cJSON_GetObjectItemCaseSensitive(ps, "required"), *pr;
    char whole[48], *rules = NULL, msg[400], pfx[32];
    snprintf(pfx, sizeof pfx, "t%dw", i);
    if (schema_rules(ps, pfx, &rules, whole, sizeof whole, msg, sizeof msg)) { /* its keywords checked */
        snprintf(t->err, t->err_len, "tool '%.100s' (strict): its parameters: %s", tool_name(tl), msg);
        return MLA_ERR;
    }
    free(rules);
    if (props && !cJSON_IsObject(props)) {
        snprintf(t->err, t->err_len, "tool '%.100s' (strict): 'parameters.properties' is not an object", tool_name(tl));
        return MLA_ERR;
    }
    sbuf body = {0};
    sb_printf(&body, "t%dp ::=", i);
    int k = 0;
    cJSON_ArrayForEach(pr, props) {
        bool need = false;
        const cJSON *r;
        cJSON_ArrayForEach(r, req) if (cJSON_IsString(r) && !strcmp(r->valuestring, pr->string)) need = true;
        /* the property's schema compiled whichever form the value takes ($refs against the
         * parameters) */
        char val[48], path[160];
        snprintf(pfx, sizeof pfx, "t%dk%ds", i, k);
        snprintf(path, sizeof path, "/properties/%.120s", pr->string);
        if (schema_rules_at(ps, pr, path, pfx, &rules, val, sizeof val, msg, sizeof msg)) {
            snprintf(t->err, t->err_len, "tool '%.100s' (strict): parameter '%.100s': %s", tool_name(tl), pr->string,
                     msg);
            free(body.p);
            return MLA_ERR;
        }
        if (toolcall_schema_allows_string(pr)) { /* the model's text: one of the listed strings, or any */
            const cJSON *en = cJSON_GetObjectItemCaseSensitive(pr, "enum");
            const cJSON *co = cJSON_GetObjectItemCaseSensitive(pr, "const"), *x;
            snprintf(val, sizeof val, "t%dk%dv", i, k);
            /* the text's length, as JSON Schema counts it (characters) where the value is a string
             * only; beside other types the text could not say which it is */
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(pr, "type"), *t1 = cJSON_GetArrayItem(ty, 0);
            const bool only = (cJSON_IsString(ty) && !strcmp(ty->valuestring, "string")) ||
                              (cJSON_GetArraySize(ty) == 1 && cJSON_IsString(t1) && !strcmp(t1->valuestring, "string"));
            if (!only && toolcall_schema_any(pr, length_bound)) {
                snprintf(t->err, t->err_len,
                         "tool '%.100s' (strict): parameter '%.100s': 'minLength'/'maxLength' on a value that may "
                         "also be another type is not supported in this model's tool-call form",
                         tool_name(tl), pr->string);
                free(rules);
                free(body.p);
                return MLA_ERR;
            }
            const cJSON *mn = cJSON_GetObjectItemCaseSensitive(pr, "minLength"),
                        *mx = cJSON_GetObjectItemCaseSensitive(pr, "maxLength");
            sbuf alt = {0};
            if (cJSON_IsString(co)) sb_lit(&alt, co->valuestring);
            else if (cJSON_IsArray(en))
                cJSON_ArrayForEach(x, en) if (cJSON_IsString(x)) {
                    if (alt.n) sb_add(&alt, " | ", 3);
                    sb_lit(&alt, x->valuestring);
                }
            if (!alt.n && (mn || mx)) /* the counts were checked with the schema above */
                sb_rep(&alt, ".", mn ? (int64_t)mn->valuedouble : 0, mx ? (int64_t)mx->valuedouble : -1);
            sb_printf(&t->out, "%s ::= %s\n", val, alt.n ? alt.p : "gtext");
            free(alt.p);
        } else {
            sb_add(&t->out, rules, strlen(rules));
        }
        free(rules);
        sb_printf(&body, " (%s ", ak);
        sb_lit(&body, pr->string);
        sb_printf(&body, " %s ws %s %s %s ws)%s", ake, av, val, ave, need ? "" : "?");
        k++;
    }
    sb_add(&body, "\n", 1);
    sb_add(&t->out, body.p, body.n);
    free(body.p);
    return MLA_OK;
}

/* the output after any reasoning: free text up to the calls' opener (open), then the calls
 * ("tc", opt "?" where they may not come); beside a JSON format (its top rule fmt, "" for none)
 * the format's JSON or the calls */
static void tg_rest(tg *t, const char *fmt, const char *open, const char *opt) {
    if (fmt[0]) sb_printf(&t->out, "rest ::= %s | tc\n", fmt);
    else sb_printf(&t->out, "rest ::= (!%s)* tc%s\n", open, opt);
}

/* The grammar of q (api_constrain_tools), the forced tools that are not strict held to their
 * schemas where hold_loose; *loose gets how many were */
static int tools_build(const api_tool_grammar *q, bool hold_loose, api_constrain_token_fn tok, void *ud, char **out,
                       char *err, size_t err_len, int *loose) {
    *out = NULL;
    tg t = {.forced = hold_loose, .tok = tok, .ud = ud, .err = err, .err_len = err_len};
    char m[8][32], close[32], think[32];
    int rc = MLA_OK;
    /* calls after the first: as many as the parser returns (TOOLCALL_MAX_CALLS) */
    char more[32] = "";
    if (!q->one_call) snprintf(more, sizeof more, " (ws call){0,%d}", TOOLCALL_MAX_CALLS - 1);
    const char *opt = q->required ? "" : "?";
    sb_add(&t.out, "", 0);
    /* beside a JSON response_format: the answer is the calls or the format's JSON ("rest ::= fmt |
     * tc" below, the format's rules named "fs" + number) */
    char fmt[40] = "";
    if (q->format && !q->required && q->format_schema) {
        char *fr = NULL, fm[400];
        if (schema_rules(q->format_schema, "fs", &fr, fmt, sizeof fmt, fm, sizeof fm)) {
            snprintf(err, err_len, "'response_format': %s", fm);
            return MLA_ERR;
        }
        sb_add(&t.out, fr, strlen(fr));
        free(fr);
    } else if (q->format && !q->required) {
        snprintf(fmt, sizeof fmt, "jobj");
    }
    /* the prompt opened the reasoning: the output closes it before anything else (a call written
     * inside it would be reasoning); free until the format's opener, then the calls ("tc") */
    if (q->close_reasoning && tg_mark(&t, REASONING_CLOSE_TAG, close) == MLA_OK)
        sb_printf(&t.out, "root ::= (!%s)* %s%s rest%s\n", close, q->required ? "" : "(", close,
                  q->required ? "" : ")?");
    /* the model may open it: then it closes it before a call; content starts with no "<think>" */
    else if (q->free_reasoning && tg_mark(&t, REASONING_OPEN_TAG, think) == MLA_OK &&
             tg_mark(&t, REASONING_CLOSE_TAG, close) == MLA_OK)
        sb_printf(&t.out, "root ::= [ \\t\\r\\n]* (%s (!%s)* %s%s rest%s | tc | [^ \\t\\r\\n] .* rest)%s\n",
                  think, close, q->required ? "" : "(", close, q->required ? "" : ")?", q->required ? "" : "?");
    else /* (a vocabulary without "<think>" / "</think>" as one token: the reasoning is not held) */
        sb_printf(&t.out, "root ::= rest\n");
    if (rc == MLA_OK && q->kind == TOOLCALL_DEEPSEEK) {
        static const char *const mk[5] = {TOOLCALL_DS_CALLS_BEGIN, TOOLCALL_DS_CALLS_END, TOOLCALL_DS_CALL_BEGIN,
                                          TOOLCALL_DS_CALL_END, TOOLCALL_DS_SEP};
        for (int k = 0; k < 5 && rc == MLA_OK; k++) rc = tg_mark(&t, mk[k], m[k]);
        if (rc == MLA_OK) tg_rest(&t, fmt, m[0], opt);
        if (rc == MLA_OK) sb_printf(&t.out, "tc ::= %s call%s ws %s\n", m[0], more, m[1]);
    } else if (rc == MLA_OK && q->kind == TOOLCALL_KIMI_K2) {
        static const char *const mk[5] = {TOOLCALL_KIMI_SECTION_BEGIN, TOOLCALL_KIMI_SECTION_END,
                                          TOOLCALL_KIMI_CALL_BEGIN, TOOLCALL_KIMI_ARG_BEGIN, TOOLCALL_KIMI_CALL_END};
        for (int k = 0; k < 5 && rc == MLA_OK; k++) rc = tg_mark(&t, mk[k], m[k]);
        if (rc == MLA_OK) tg_rest(&t, fmt, m[0], opt);
        if (rc == MLA_OK) sb_printf(&t.out, "tc ::= %s call%s ws %s\n", m[0], more, m[1]);
    } else if (rc == MLA_OK && q->kind == TOOLCALL_GLM) {
        static const char *const mk[6] = {TOOLCALL_GLM_CALL_BEGIN, TOOLCALL_GLM_CALL_END, TOOLCALL_GLM_KEY_BEGIN,
                                          TOOLCALL_GLM_KEY_END,    TOOLCALL_GLM_VAL_BEGIN, TOOLCALL_GLM_VAL_END};
        for (int k = 0; k < 6 && rc == MLA_OK; k++) rc = tg_mark(&t, mk[k], m[k]);
        if (rc == MLA_OK) tg_rest(&t, fmt, m[0], opt);
        if (rc == MLA_OK) sb_printf(&t.out, "tc ::= call%s\n", more);
    } else if (rc == MLA_OK) {
        snprintf(err, err_len, "no tool-call format to hold the calls to");
        rc = MLA_ERR;
    }
    /* the call: its opening marker(s), one alternative a tool, its end marker ("call ::= ... ( c0 |
     * c2 ) END", built in alts); and each tool's rule: its name and arguments */
    sbuf alts = {0};
    int n_alt = 0;
    if (rc == MLA_OK && q->kind == TOOLCALL_DEEPSEEK) sb_printf(&alts, "call ::= %s (", m[2]);
    else if (rc == MLA_OK && q->kind == TOOLCALL_KIMI_K2) sb_printf(&alts, "call ::= %s \"functions.\" (", m[2]);
    else if (rc == MLA_OK) sb_printf(&alts, "call ::= %s (", m[0]);
    const cJSON *tl;
    int i = -1;
    cJSON_ArrayForEach(tl, q->tools) {
        i++;
        if (rc != MLA_OK) break;
        if (q->only && strcmp(tool_name(tl), q->only)) continue;
        if (!toolcall_name_ok(tool_name(tl))) {
            snprintf(err, err_len, "tool '%.100s': a name with whitespace, a control character or '<' cannot be "
                     "held to the call format", tool_name(tl));
            rc = MLA_ERR;
        }
        if (rc != MLA_OK) break;
        sb_printf(&alts, "%s c%d", n_alt++ ? " |" : "", i);
        char arg[48];
        sbuf nm = {0};
        sb_lit(&nm, tool_name(tl));
        if (q->kind == TOOLCALL_GLM) {
            rc = tg_glm_pairs(&t, tl, i, m[2], m[3], m[4], m[5]);
            if (rc == MLA_OK) sb_printf(&t.out, "c%d ::= %s ws t%dp\n", i, nm.p, i);
        } else {
            rc = tg_json_args(&t, tl, i, arg, sizeof arg);
            /* DeepSeek: V3 / R1's fenced form, or V3.1's (not for a tool named "function", which
             * the parser reads as the fenced form's opening) */
            if (rc == MLA_OK && q->kind == TOOLCALL_DEEPSEEK) {
                sb_printf(&t.out, "c%d ::= \"function\" %s %s \"\\n```json\\n\" %s \"\\n```\"", i, m[4], nm.p, arg);
                if (strcmp(tool_name(tl), "function")) sb_printf(&t.out, " | %s %s %s", nm.p, m[4], arg);
                sb_add(&t.out, "\n", 1);
            } else if (rc == MLA_OK && q->kind == TOOLCALL_KIMI_K2) {
                sb_printf(&t.out, "c%d ::= %s \":\" [0-9]{1,4} %s %s\n", i, nm.p, m[3], arg);
            }
        }
        free(nm.p);
    }
    if (rc == MLA_OK) {
        const char *end = q->kind == TOOLCALL_DEEPSEEK ? m[3] : q->kind == TOOLCALL_KIMI_K2 ? m[4] : m[1];
        sb_printf(&t.out, "%s ) %s\n", alts.p, end);
    }
    free(alts.p);
    if (rc == MLA_OK && q->kind == TOOLCALL_GLM)
        sb_printf(&t.out, "gtext ::= .*\ngpair ::= %s .+ %s ws %s gtext %s ws\n", m[2], m[3], m[4], m[5]);
    if (rc == MLA_OK) sb_add(&t.out, json_base, strlen(json_base));
    mla_err e = {{0}};
    if (rc == MLA_OK && t.out.over) {
        snprintf(err, err_len, "the tools' grammar is larger than %u bytes", GRAM_MAX_TEXT);
        rc = MLA_ERR;
    } else if (rc == MLA_OK && gram_check(t.out.p, t.out.n, &e)) {
        snprintf(err, err_len, "the tools cannot be compiled to a grammar: %s", e.msg);
        rc = MLA_ERR;
    }
    *loose = t.loose;
    if (rc) {
        free(t.out.p);
        return MLA_ERR;
    }
    *out = t.out.p;
    return MLA_OK;
}

int api_constrain_tools(const api_tool_grammar *q, api_constrain_token_fn tok, void *ud, char **out, char *err,
                        size_t err_len) {
    int loose = 0;
    const int rc = tools_build(q, q->required, tok, ud, out, err, err_len, &loose);
    if (rc == MLA_OK || !loose) return rc;
    /* the schemas of forced tools that are not strict made the grammar too large, or one that
     * cannot be matched: they were not promised, so the calls go without them */
    return tools_build(q, false, tok, ud, out, err, err_len, &loose);
}

/* ---- the request's parameters -------------------------------------------------------------- */

static int parse_bias(api_constrain *c, const cJSON *lb, struct api_error *e) {
    if (!lb || cJSON_IsNull(lb)) return MLA_OK;
    if (!cJSON_IsObject(lb)) return api_bad(e, "logit_bias", "'logit_bias' must be an object of token id -> bias");
    int n = cJSON_GetArraySize(lb);
    if (n > API_MAX_LOGIT_BIAS)
        return api_bad(e, "logit_bias", "'logit_bias' has %d entries; at most %d are supported", n, API_MAX_LOGIT_BIAS);
    c->bias_ids = mla_xmalloc((size_t)(n ? n : 1) * sizeof *c->bias_ids);
    c->bias_vals = mla_xmalloc((size_t)(n ? n : 1) * sizeof *c->bias_vals);
    const cJSON *it;
    cJSON_ArrayForEach(it, lb) {
        const char *k = it->string;
        char *end;
        long long id = strtoll(k, &end, 10);
        if (!k[0] || *end || k[0] == '-' || k[0] == '+' || k[0] == ' ' || id < 0 || id > INT32_MAX)
            return api_bad(e, "logit_bias", "'logit_bias' key '%.40s' is not a token id", k);
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < -100 || it->valuedouble > 100)
            return api_bad(e, "logit_bias", "'logit_bias' value for token %lld must be a number in [-100, 100]", id);
        for (int32_t j = 0; j < c->n_bias; j++)
            if (c->bias_ids[j] == (int32_t)id) return api_bad(e, "logit_bias",
                    "'logit_bias' names token %lld twice", id);
        c->bias_ids[c->n_bias] = (int32_t)id;
        c->bias_vals[c->n_bias++] = (float)it->valuedouble;
    }
    return MLA_OK;
}

/* c's grammar from the schema sc at member `where` of response_format: none (absent or null) is
 * any JSON object, as OpenAI and llama.cpp take it */
static int format_schema(api_constrain *c, const cJSON *sc, const char *where, struct api_error *e) {
    c->json_format = true;
    c->format_schema = sc && !cJSON_IsNull(sc) ? sc : NULL;
    if (!sc || cJSON_IsNull(sc)) {
        c->grammar = mla_xstrdup(api_json_object_gbnf());
        return MLA_OK;
    }
    char msg[512];
    if (api_schema_to_gbnf(sc, &c->grammar, msg, sizeof msg))
        return api_bad(e, "response_format", "'response_format.%s': %s", where, msg);
    return MLA_OK;
}

static int parse_format(api_constrain *c, const cJSON *rf, struct api_error *e) {
    if (!rf || cJSON_IsNull(rf)) return MLA_OK;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(ty))
        return api_bad(e, "response_format", "'response_format' must be an object with a string 'type'");
    const char *t = ty->valuestring;
    const bool text = !strcmp(t, "text"), obj = !strcmp(t, "json_object"), sch = !strcmp(t, "json_schema");
    if (!text && !obj && !sch)
        return api_bad(e, "response_format",
                "'response_format.type' must be 'text', 'json_object' or 'json_schema' (got '%.40s')",
                   t);
    /* the members each type takes; json_object's "schema" is llama.cpp's way to give one */
    const cJSON *k;
    cJSON_ArrayForEach(k, rf) {
        if (strcmp(k->string, "type") && !(obj && !strcmp(k->string, "schema")) &&
            !(sch && !strcmp(k->string, "json_schema")))
            return api_bad(e, "response_format", "'response_format.%.40s' does not apply to type '%s'", k->string, t);
    }
    if (text) return MLA_OK;
    if (obj) return format_schema(c, cJSON_GetObjectItemCaseSensitive(rf, "schema"), "schema", e);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js)) return api_bad(e, "response_format", "'response_format.json_schema' must be an object");
    cJSON_ArrayForEach(k, js) {
        if (strcmp(k->string, "name") && strcmp(k->string, "schema") && strcmp(k->string, "strict") &&
            strcmp(k->string, "description"))
            return api_bad(e, "response_format", "'response_format.json_schema.%.40s' is not supported", k->string);
    }
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(js, "name");
    if (!cJSON_IsString(nm) || !nm->valuestring[0] || strlen(nm->valuestring) > 64)
        return api_bad(e, "response_format",
                "'response_format.json_schema.name' must be a string of 1 to 64 characters");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (st && !cJSON_IsNull(st) && !cJSON_IsBool(st))
        return api_bad(e, "response_format", "'response_format.json_schema.strict' must be a boolean");
    return format_schema(c, cJSON_GetObjectItemCaseSensitive(js, "schema"), "json_schema.schema", e);
}

int api_constrain_parse(api_constrain *c, const cJSON *root, struct api_error *e) {
    memset(c, 0, sizeof *c);
    c->grammar_max_token = -1;
    int rc = parse_bias(c, cJSON_GetObjectItemCaseSensitive(root, "logit_bias"), e);
    if (rc == MLA_OK) rc = parse_format(c, cJSON_GetObjectItemCaseSensitive(root, "response_format"), e);
    const cJSON *gr = cJSON_GetObjectItemCaseSensitive(root, "grammar");
    if (rc == MLA_OK && gr && !cJSON_IsNull(gr)) {
        if (!cJSON_IsString(gr)) {
            rc = api_bad(e, "grammar", "'grammar' must be a string (GBNF)");
        } else if (c->grammar) {
            rc = api_bad(e, "grammar", "'grammar' and a JSON 'response_format' cannot be combined");
        } else {
            mla_err ge = {{0}};
            if (gram_check_tokens(gr->valuestring, strlen(gr->valuestring), &c->grammar_max_token, &c->grammar_taken,
                                  &c->n_grammar_taken, &ge))
                rc = api_bad(e, "grammar", "%s", ge.msg);
            else c->grammar = mla_xstrdup(gr->valuestring);
        }
    }
    if (rc) api_constrain_free(c);
    return rc;
}

int api_constrain_check_ids(const api_constrain *c, int32_t n_vocab, bool (*is_eog)(void *ctx, int32_t id),
                            void *ctx, struct api_error *e) {
    if (c->grammar && c->grammar_max_token >= n_vocab)
        return api_bad(e, "grammar", "'grammar' names token <[%lld]>, outside the vocabulary of %d tokens",
                   (long long)c->grammar_max_token, n_vocab);
    for (size_t i = 0; is_eog && i < c->n_grammar_taken; i++) /* ids below n_vocab (above) */
        if (is_eog(ctx, (int32_t)c->grammar_taken[i]))
            return api_bad(e, "grammar",
                       "'grammar' names <[%u]>, an end-of-generation token, which a token element never takes: the "
                       "output ends where the grammar is complete",
                       c->grammar_taken[i]);
    for (int32_t i = 0; i < c->n_bias; i++)
        if (c->bias_ids[i] < 0 || c->bias_ids[i] >= n_vocab)
            return api_bad(e, "logit_bias", "'logit_bias' token id %d is out of range (the vocabulary has %d tokens)",
                       c->bias_ids[i], n_vocab);
    return MLA_OK;
}

void api_constrain_free(api_constrain *c) {
    free(c->grammar);
    free(c->grammar_taken);
    free(c->bias_ids);
    free(c->bias_vals);
    memset(c, 0, sizeof *c);
}
