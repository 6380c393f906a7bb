/* chat_reasoning: see chat_reasoning.h. */
#include "coordinator/chat_reasoning.h"

#include <string.h>

#define OPEN_TAG "<think>"
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
    if (!src || !strstr(src, CLOSE_TAG)) return REASONING_NONE;
    if (strstr(src, "<|im_assistant|>")) return REASONING_KIMI_K2;
    if (strstr(src, "[gMASK]") || strstr(src, "<|assistant|>")) return REASONING_GLM;
    if (strstr(src, "thinking")) return REASONING_DEEPSEEK_V31;
    return REASONING_DEEPSEEK_R1;
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

bool reasoning_prompt_opens(const char *p, size_t len) {
    while (len && is_ws(p[len - 1])) len--;
    size_t l = sizeof OPEN_TAG - 1;
    return len >= l && !memcmp(p + len - l, OPEN_TAG, l);
}

/* Length of the longest suffix of s[0, n) that is a proper prefix of tag. */
static size_t partial_suffix(const char *s, size_t n, const char *tag) {
    size_t tl = strlen(tag);
    for (size_t k = tl - 1 < n ? tl - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, tag, k)) return k;
    return 0;
}

void reasoning_split_text(const char *t, size_t len, bool inside, bool final, reasoning_split *o) {
    memset(o, 0, sizeof *o);
    size_t pos = 0;
    if (!inside) {
        size_t w = 0;
        while (w < len && is_ws(t[w])) w++;
        size_t ol = sizeof OPEN_TAG - 1;
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
    const char *close = NULL;
    if (pos < len) close = memmem(t + pos, len - pos, CLOSE_TAG, sizeof CLOSE_TAG - 1);
    size_t r_end = close ? (size_t)(close - t) : len;
    if (!close && !final) r_end -= partial_suffix(t + pos, len - pos, CLOSE_TAG);
    while (r_end > pos && is_ws(t[r_end - 1])) r_end--;
    o->r_end = r_end > pos ? r_end : pos;
    if (!close) {
        o->c_start = o->c_end = len;
        return;
    }
    size_t c = (size_t)(close - t) + sizeof CLOSE_TAG - 1;
    while (c < len && is_ws(t[c])) c++;
    o->c_start = c;
    o->c_end = len;
}
