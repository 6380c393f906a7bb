/* api_fprint: fingerprints of Messages requests for cache diagnostics (api_fprint.h). */
#include "coordinator/api_fprint.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/mla_err.h"
#include "common/mla_hash.h"

/* hash and byte count of one part of the prompt */
typedef struct {
    uint64_t h;
    size_t bytes;
} fp_part;

struct api_fp {
    fp_part tools, system;
    int n_msg;
    fp_part *msg; /* message i: h the hash of messages 0 .. i (a chain), bytes message i's own */
    int32_t tokens;
};

/* j printed compactly (NULL or absent: nothing), chained onto h */
static fp_part part_of(const cJSON *j, uint64_t h) {
    fp_part p = {h, 0};
    if (!j) return p;
    char *s = cJSON_PrintUnformatted(j);
    if (!s) MLA_PANIC("out of memory");
    p.bytes = strlen(s);
    p.h = mla_fnv1a(s, p.bytes, mla_fnv1a(&p.bytes, sizeof p.bytes, h));
    free(s);
    return p;
}

static bool is_system(const cJSON *m) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
    return cJSON_IsString(r) && !strcmp(r->valuestring, "system");
}

/* the tools the prompt lists (those not of function.defer_loading true), chained one by one */
static fp_part tools_part(const cJSON *tools) {
    fp_part p = {MLA_FNV_BASIS, 0};
    const cJSON *t, *list = cJSON_IsArray(tools) ? tools : NULL;
    cJSON_ArrayForEach(t, list) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fn, "defer_loading"))) continue;
        const fp_part q = part_of(t, p.h);
        p.h = q.h;
        p.bytes += q.bytes;
    }
    return p;
}

api_fp *api_fp_make(const cJSON *chat, int32_t prompt_tokens) {
    api_fp *f = mla_xcalloc(1, sizeof *f);
    f->tokens = prompt_tokens > 0 ? prompt_tokens : 0;
    f->tools = tools_part(cJSON_GetObjectItemCaseSensitive(chat, "tools"));
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(chat, "messages");
    const cJSON *m = cJSON_IsArray(msgs) ? msgs->child : NULL;
    f->system = part_of(m && is_system(m) ? m : NULL, MLA_FNV_BASIS);
    if (m && is_system(m)) m = m->next;
    const int n = cJSON_GetArraySize(msgs);
    f->msg = mla_xcalloc(n > 0 ? (size_t)n : 1, sizeof *f->msg);
    uint64_t h = MLA_FNV_BASIS;
    for (; m; m = m->next) {
        f->msg[f->n_msg] = part_of(m, h);
        h = f->msg[f->n_msg++].h;
    }
    return f;
}

void api_fp_free(api_fp *f) {
    if (!f) return;
    free(f->msg);
    free(f);
}

/* prev's tokens from the part that starts after `before` bytes of its prompt */
static int32_t tokens_from(const api_fp *prev, size_t before) {
    size_t all = prev->tools.bytes + prev->system.bytes;
    for (int i = 0; i < prev->n_msg; i++) all += prev->msg[i].bytes;
    if (all == 0 || before >= all) return 0;
    return (int32_t)((double)prev->tokens * (double)(all - before) / (double)all + 0.5);
}

api_fp_change api_fp_compare(const api_fp *prev, const api_fp *cur, int32_t *missed) {
    *missed = 0;
    api_fp_change c = API_FP_SAME;
    size_t before = 0; /* prev's bytes before the change */
    if (prev->tools.h != cur->tools.h) c = API_FP_TOOLS;
    else if (prev->system.h != cur->system.h) c = API_FP_SYSTEM, before = prev->tools.bytes;
    else {
        before = prev->tools.bytes + prev->system.bytes;
        for (int i = 0; i < prev->n_msg; i++) {
            if (i >= cur->n_msg || prev->msg[i].h != cur->msg[i].h) {
                c = API_FP_MESSAGES;
                break;
            }
            before += prev->msg[i].bytes;
        }
    }
    if (c != API_FP_SAME) *missed = tokens_from(prev, before);
    return c;
}

const char *api_fp_change_name(api_fp_change c) {
    switch (c) {
    case API_FP_TOOLS: return "tools_changed";
    case API_FP_SYSTEM: return "system_changed";
    case API_FP_MESSAGES: return "messages_changed";
    case API_FP_SAME: break;
    }
    return NULL;
}

/* ---------------------------------------------------------------- the store: a ring of cap */
#define FP_ID_MAX 64

typedef struct {
    char id[FP_ID_MAX];
    api_fp *f;
} fp_slot;

struct api_fp_store {
    fp_slot *slot;
    int cap, next; /* next: the slot the next put takes (the oldest once full) */
};

api_fp_store *api_fp_store_new(int cap) {
    api_fp_store *s = mla_xcalloc(1, sizeof *s);
    s->cap = cap > 0 ? cap : 1;
    s->slot = mla_xcalloc((size_t)s->cap, sizeof *s->slot);
    return s;
}

void api_fp_store_free(api_fp_store *s) {
    if (!s) return;
    for (int i = 0; i < s->cap; i++) api_fp_free(s->slot[i].f);
    free(s->slot);
    free(s);
}

static int find(const api_fp_store *s, const char *id) {
    if (strlen(id) >= FP_ID_MAX) return -1;
    for (int i = 0; i < s->cap; i++)
        if (s->slot[i].f && !strcmp(s->slot[i].id, id)) return i;
    return -1;
}

void api_fp_store_put(api_fp_store *s, const char *id, api_fp *f) {
    if (strlen(id) >= FP_ID_MAX) {
        api_fp_free(f);
        return;
    }
    int i = find(s, id);
    if (i < 0) {
        i = s->next;
        s->next = (s->next + 1) % s->cap;
    }
    api_fp_free(s->slot[i].f);
    memcpy(s->slot[i].id, id, strlen(id) + 1);
    s->slot[i].f = f;
}

const api_fp *api_fp_store_get(const api_fp_store *s, const char *id) {
    const int i = find(s, id);
    return i < 0 ? NULL : s->slot[i].f;
}
