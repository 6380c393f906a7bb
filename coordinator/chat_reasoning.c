/* chat_reasoning: see chat_reasoning.h. */
#include "coordinator/chat_reasoning.h"

#include <string.h>

#include "coordinator/chat_toolcall.h"

#define OPEN_TAG REASONING_OPEN_TAG
#define CLOSE_TAG REASONING_CLOSE_TAG

static const char *const k_names[] = {"none", "deepseek-r1", "deepseek-v3.1", "glm", "kimi-k2"};

const char *reasoning_kind_name(enum reasoning_kind k) {
    return (unsigned)k < sizeof k_names / sizeof *k_names ? k_names[k] : "?";
}

int reasoning_kind_parse(const char *name) {
    if (!name) return -2;
    if (!strcmp(name, "auto")) return REASONING_AUTO;
    for (size_t i = 0; i < sizeof k_names / sizeof *k_names; i++)
        if (!strcmp(name, k_names[i])) return (int)i;
    return -2;
}

enum reasoning_kind reasoning_auto(const char *src) {
    /* "<think>" alone counts too: a template whose generation prompt opens the reasoning without
     * ever writing "</think>" (reasoning is only taken where the prompt or the output opens it) */
    if (!src || (!strstr(src, CLOSE_TAG) && !strstr(src, OPEN_TAG))) return REASONING_NONE;
    if (strstr(src, "<|im_assistant|>")) return REASONING_KIMI_K2;
    if (strstr(src, "[gMASK]") || strstr(src, "<|assistant|>")) return REASONING_GLM;
    if (strstr(src, "thinking")) return REASONING_DEEPSEEK_V31;
    return REASONING_DEEPSEEK_R1;
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static bool ends_with(const char *p, size_t len, const char *tag) {
    const size_t l = strlen(tag);
    return len >= l && !memcmp(p + len - l, tag, l);
}

enum reasoning_prompt reasoning_prompt_state(const char *p, size_t len) {
    while (len && is_ws(p[len - 1])) len--;
    if (ends_with(p, len, OPEN_TAG)) return REASONING_PROMPT_OPEN;
    return ends_with(p, len, CLOSE_TAG) ? REASONING_PROMPT_CLOSED : REASONING_PROMPT_FREE;
}

/* the last place tag occurs in s[0, len), or NULL */
static const char *last_of(const char *s, size_t len, const char *tag) {
    const size_t tl = strlen(tag);
    for (size_t i = len >= tl ? len - tl + 1 : 0; i-- > 0;)
        if (!memcmp(s + i, tag, tl)) return s + i;
    return NULL;
}

bool reasoning_text_open(const char *s, size_t len) {
    const char *o = last_of(s, len, OPEN_TAG), *c = last_of(s, len, CLOSE_TAG);
    return o && (!c || o > c);
}

/* Length of the longest suffix of s[0, n) that is a proper prefix of tag. */
static size_t partial_suffix(const char *s, size_t n, const char *tag) {
    size_t tl = strlen(tag);
    for (size_t k = tl - 1 < n ? tl - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, tag, k)) return k;
    return 0;
}

/* where the reasoning starting at t[pos] ends (*end, NULL: not yet) and the content starts (*next):
 * "</think>", or for Kimi-K2 its tool-call section's first marker (kept for the content);
 * *hold: the longest suffix of the text that may start one of them. The search starts at
 * *scan where that is past pos (no end starts before it) and, finding none, moves *scan to
 * where a marker could still start. */
static void reasoning_end(enum reasoning_kind kind, const char *t, size_t len, size_t pos, size_t *scan,
                          const char **end, size_t *next, size_t *hold) {
    static const char *const kimi[2] = {TOOLCALL_KIMI_SECTION_BEGIN, TOOLCALL_KIMI_SECTION_BEGIN1};
    const size_t from = *scan > pos ? *scan : pos;
    *end = from < len ? memmem(t + from, len - from, CLOSE_TAG, sizeof CLOSE_TAG - 1) : NULL;
    *next = *end ? (size_t)(*end - t) + sizeof CLOSE_TAG - 1 : len;
    *hold = partial_suffix(t + pos, len - pos, CLOSE_TAG);
    for (int i = 0; i < 2 && kind == REASONING_KIMI_K2; i++) {
        const char *m = from < len ? memmem(t + from, len - from, kimi[i], strlen(kimi[i])) : NULL;
        if (m && (!*end || m < *end)) {
            *end = m;
            *next = (size_t)(m - t);
        }
        const size_t h = partial_suffix(t + pos, len - pos, kimi[i]);
        if (h > *hold) *hold = h;
    }
    if (!*end) { /* a marker begun before len - (its length - 1) would have been found */
        const size_t longest = sizeof TOOLCALL_KIMI_SECTION_BEGIN - 1, s = len >= longest ? len - (longest - 1) : 0;
        if (s > *scan) *scan = s;
    }
}

void reasoning_split_text(enum reasoning_kind kind, const char *t, size_t len, bool inside, bool final,
                          size_t *scan, reasoning_split *o) {
    memset(o, 0, sizeof *o);
    size_t own = 0;
    if (!scan) scan = &own;
    size_t pos = 0;
    const size_t ol = sizeof OPEN_TAG - 1;
    if (inside) { /* the prompt opened the reasoning: a "<think>" the model writes again is no part of it */
        while (pos < len && is_ws(t[pos])) pos++;
        if (len - pos >= ol && !memcmp(t + pos, OPEN_TAG, ol)) {
            pos += ol;
        } else if (!final && len - pos < ol && !memcmp(t + pos, OPEN_TAG, len - pos)) {
            /* only whitespace or a beginning of "<think>" so far: nothing is certain yet */
            o->has_reasoning = true;
            o->r_start = o->r_end = o->c_start = o->c_end = len;
            return;
        }
    } else {
        size_t w = 0;
        while (w < len && is_ws(t[w])) w++;
        if (len - w >= ol && !memcmp(t + w, OPEN_TAG, ol)) {
            inside = true;
            pos = w + ol;
        } else if (!final && (w == len || (len - w < ol && !memcmp(t + w, OPEN_TAG, len - w)))) {
            /* only whitespace or a beginning of "<think>" so far: nothing is certain yet */
            return;
        } else {
            o->c_start = 0;
            o->c_end = len;
            return;
        }
    }
    o->has_reasoning = true;
    while (pos < len && is_ws(t[pos])) pos++;
    o->r_start = pos;
    const char *close;
    size_t c, hold;
    reasoning_end(kind, t, len, pos, scan, &close, &c, &hold);
    size_t r_end = close ? (size_t)(close - t) : len;
    if (!close && !final) r_end -= hold;
    while (r_end > pos && is_ws(t[r_end - 1])) r_end--;
    o->r_end = r_end > pos ? r_end : pos;
    if (!close) {
        o->c_start = o->c_end = len;
        return;
    }
    while (c < len && is_ws(t[c])) c++;
    o->c_start = c;
    o->c_end = len;
}
