/* chat_guard: see chat_guard.h. */
#include "coordinator/chat_guard.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CG_PUA_FIRST 0xE000u /* candidates: U+E000 .. U+E0FF, in pairs */
#define CG_PUA_COUNT 256u

void chat_guard_init(chat_guard *g) { memset(g, 0, sizeof(*g)); }

void chat_guard_free(chat_guard *g) {
    for (size_t i = 0; i < g->n; i++) free(g->texts[i]);
    free(g->texts);
    memset(g, 0, sizeof(*g));
}

static void utf8_3(unsigned cp, char out[4]) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    out[3] = 0;
}

/* Marks which candidate code points occur in s. */
static void note_pua(const char *s, uint8_t used[CG_PUA_COUNT]) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (p[0] == 0xEE && p[1] >= 0x80 && p[1] <= 0x83 && p[2] >= 0x80 && p[2] <= 0xBF) {
            unsigned cp = 0xE000u | ((unsigned)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
            if (cp - CG_PUA_FIRST < CG_PUA_COUNT) used[cp - CG_PUA_FIRST] = 1;
        }
    }
}

static void scan_strings(const cJSON *j, uint8_t used[CG_PUA_COUNT]) {
    if (cJSON_IsString(j) && j->valuestring) note_pua(j->valuestring, used);
    if (j->string) note_pua(j->string, used);
    for (const cJSON *c = j->child; c; c = c->next) scan_strings(c, used);
}

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = mla_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static bool has_control(const char *s, size_t len, chat_guard_match_fn match, void *ctx) {
    for (size_t i = 0; i < len; i++)
        if (match(ctx, s, len, i)) return true;
    return false;
}

/* s with its control-token texts replaced; NULL when it has none. */
static char *protect_str(chat_guard *g, const char *s, chat_guard_match_fn match, void *ctx) {
    size_t len = strlen(s), start = 0;
    sbuf b = {0};
    for (size_t i = 0; i < len;) {
        size_t ml = match(ctx, s, len, i);
        if (!ml) {
            i++;
            continue;
        }
        if (g->n == g->cap) {
            g->cap = g->cap ? 2 * g->cap : 16;
            g->texts = mla_xrealloc(g->texts, g->cap * sizeof *g->texts);
        }
        char *t = mla_xmalloc(ml + 1);
        memcpy(t, s + i, ml);
        t[ml] = 0;
        char ph[40];
        int pn = snprintf(ph, sizeof ph, "%s%zu%s", g->open, g->n, g->close);
        g->texts[g->n++] = t;
        sb_put(&b, s + start, i - start);
        sb_put(&b, ph, (size_t)pn);
        i += ml;
        start = i;
    }
    if (!b.p) return NULL;
    sb_put(&b, s + start, len - start);
    return b.p;
}

/* Text parts of an array content that only together spell a control token, joined as the
 * templates render them (chat_tmpl.c: one a line). */
static bool parts_combine(const cJSON *content, chat_guard_match_fn match, void *ctx) {
    sbuf b = {0};
    const cJSON *it;
    int np = 0;
    cJSON_ArrayForEach(it, content) {
        const char *t = NULL;
        if (cJSON_IsString(it)) t = it->valuestring;
        const cJSON *tx = cJSON_IsObject(it) ? cJSON_GetObjectItemCaseSensitive(it, "text") : NULL;
        if (cJSON_IsString(tx)) t = tx->valuestring;
        if (t && np++) sb_put(&b, "\n", 1);
        if (t) sb_put(&b, t, strlen(t));
    }
    bool bad = false;
    if (b.p && has_control(b.p, b.n, match, ctx)) {
        /* bad when a match starting in one part runs past its end (a match inside one part
         * is protected with that part) */
        size_t off = 0;
        cJSON_ArrayForEach(it, content) {
            const char *t = NULL;
            if (cJSON_IsString(it)) t = it->valuestring;
            const cJSON *tx = cJSON_IsObject(it) ? cJSON_GetObjectItemCaseSensitive(it, "text") : NULL;
            if (cJSON_IsString(tx)) t = tx->valuestring;
            if (!t) continue;
            size_t tl = strlen(t);
            for (size_t i = 0; i < tl && !bad; i++) {
                size_t ml = match(ctx, b.p, b.n, off + i);
                if (ml && i + ml > tl) bad = true; /* runs past this part */
            }
            off += tl + 1; /* and the line break after it */
        }
    }
    free(b.p);
    return bad;
}

/* s replaced by its protected copy (cJSON's allocator) when it holds a control-token text */
static void protect_in_place(chat_guard *g, char **s, chat_guard_match_fn match, void *ctx) {
    char *p = protect_str(g, *s, match, ctx);
    if (!p) return;
    const size_t n = strlen(p) + 1;
    cJSON_free(*s);
    *s = cJSON_malloc(n);
    if (!*s) MLA_PANIC("out of memory");
    memcpy(*s, p, n);
    free(p);
}

static int walk(chat_guard *g, cJSON *j, chat_guard_match_fn match, void *ctx, mla_err *err) {
    for (cJSON *c = j->child; c; c = c->next) {
        /* an object's keys too: a template may render them (tool-call arguments given as an object) */
        if (c->string && !(c->type & cJSON_StringIsConst)) protect_in_place(g, &c->string, match, ctx);
        if (cJSON_IsString(c) && c->valuestring) {
            protect_in_place(g, &c->valuestring, match, ctx);
        } else if (cJSON_IsArray(c) || cJSON_IsObject(c)) {
            if (c->string && !strcmp(c->string, "content") && cJSON_IsArray(c) && parts_combine(c, match, ctx))
                return mla_errf(err, "the text parts of a message's content together spell a control token");
            if (walk(g, c, match, ctx, err)) return MLA_ERR;
        }
    }
    return MLA_OK;
}

int chat_guard_protect(chat_guard *g, const cJSON *messages, const cJSON *vars, chat_guard_match_fn match, void *ctx,
                       cJSON **out, cJSON **vars_out, mla_err *err) {
    *out = NULL;
    if (vars_out) *vars_out = NULL;
    uint8_t used[CG_PUA_COUNT] = {0};
    scan_strings(messages, used);
    if (vars) scan_strings(vars, used);
    unsigned k = 0;
    while (k + 1 < CG_PUA_COUNT && (used[k] || used[k + 1])) k += 2;
    if (k + 1 >= CG_PUA_COUNT)
        return mla_errf(err, "the messages%s leave no two adjacent private-use characters of U+E000..U+E0FF free; "
                             "cannot mark their text", vars ? ", tools and chat_template_kwargs" : "");
    utf8_3(CG_PUA_FIRST + k, g->open);
    utf8_3(CG_PUA_FIRST + k + 1, g->close);
    cJSON *copy = cJSON_Duplicate(messages, 1), *vcopy = vars ? cJSON_Duplicate(vars, 1) : NULL;
    if (!copy || (vars && !vcopy)) MLA_PANIC("out of memory");
    if (walk(g, copy, match, ctx, err) || (vcopy && walk(g, vcopy, match, ctx, err))) {
        cJSON_Delete(copy);
        cJSON_Delete(vcopy);
        return MLA_ERR;
    }
    *out = copy;
    if (vars_out) *vars_out = vcopy;
    else cJSON_Delete(vcopy);
    return MLA_OK;
}

void chat_guard_restore(const chat_guard *g, const char *text, size_t len, char **out, size_t *out_len,
                        size_t **spans, size_t *n_spans) {
    sbuf b = {0};
    size_t *sp = NULL, nsp = 0, capsp = 0;
    sb_put(&b, "", 0);
    size_t i = 0, start = 0;
    while (g->n && i + 3 <= len) {
        if (memcmp(text + i, g->open, 3)) {
            i++;
            continue;
        }
        size_t j = i + 3, idx = 0;
        bool digits = false, big = false;
        while (j < len && text[j] >= '0' && text[j] <= '9') {
            if (idx > g->n) big = true;
            else idx = idx * 10 + (size_t)(text[j] - '0');
            digits = true;
            j++;
        }
        if (!digits || big || idx >= g->n || j + 3 > len || memcmp(text + j, g->close, 3)) {
            i++;
            continue;
        }
        sb_put(&b, text + start, i - start);
        if (nsp + 2 > capsp) {
            capsp = capsp ? 2 * capsp : 16;
            sp = mla_xrealloc(sp, capsp * sizeof *sp);
        }
        size_t tl = strlen(g->texts[idx]);
        sp[nsp++] = b.n;
        sb_put(&b, g->texts[idx], tl);
        sp[nsp++] = b.n;
        i = start = j + 3;
    }
    sb_put(&b, text + start, len - start);
    *out = b.p;
    *out_len = b.n;
    *spans = sp;
    *n_spans = nsp / 2;
}
