/* kvtab (prefix kvtab_): a sequence's block table as an engine keeps it (worker/engine.h
 * set_tables): ids of blocks in a pool, position p in block ids[p / block_size].
 *
 * kvtab_apply takes a plan row's update: the table is cut to `start` entries, then ids[0, n)
 * are appended. It refuses, naming the problem and leaving the table as it was, a start past the
 * table's end, a table longer than max_entries (0: no bound), and an id not below pool_blocks.
 *
 * Ownership: a zeroed kvtab is empty; the table owns its ids array, released by kvtab_free. */
#ifndef KVTAB_H
#define KVTAB_H

#include <stdint.h>

#include "mla_err.h"

typedef struct kvtab {
    uint32_t *ids;
    uint32_t n, cap;
} kvtab;

int kvtab_apply(kvtab *t, uint32_t start, const uint32_t *ids, uint32_t n, uint32_t pool_blocks, uint64_t max_entries,
                mla_err *err);
void kvtab_free(kvtab *t);

#endif
