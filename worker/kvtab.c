/* kvtab: see kvtab.h. */
#include "kvtab.h"

#include <stdlib.h>
#include <string.h>

int kvtab_apply(kvtab *t, uint32_t start, const uint32_t *ids, uint32_t n, uint32_t pool_blocks, uint64_t max_entries,
                mla_err *err) {
    if (start > t->n) return mla_errf(err, "a table update from entry %u, the table holds %u", start, t->n);
    const uint64_t len = (uint64_t)start + n;
    if (max_entries && len > max_entries)
        return mla_errf(err, "a table of %llu blocks exceeds the %llu the context needs", (unsigned long long)len,
                        (unsigned long long)max_entries);
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= pool_blocks) return mla_errf(err, "block %u is outside the pool of %u blocks", ids[i], pool_blocks);
    if (len > t->cap) {
        t->cap = (uint32_t)len * 2;
        t->ids = mla_xrealloc(t->ids, t->cap * sizeof *t->ids);
    }
    if (n) memcpy(t->ids + start, ids, n * sizeof *ids);
    t->n = (uint32_t)len;
    return MLA_OK;
}

void kvtab_free(kvtab *t) {
    free(t->ids);
    memset(t, 0, sizeof *t);
}
