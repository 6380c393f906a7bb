/* Block tables for tests that build step plans by hand (the engines store cache rows only where a
 * plan's table says, worker/engine.h): slot s (< TT_SLOTS) owns the pool blocks [s * TT_BLOCKS,
 * (s + 1) * TT_BLOCKS), sent whole in every plan (block_start 0: the table is replaced by the
 * same one). With the CPU and test engines' blocks of 16 positions a slot covers 256 positions. */
#ifndef TEST_TABLES_H
#define TEST_TABLES_H

#include <stdint.h>

#include "wire.h"

#define TT_BLOCKS 16
#define TT_SLOTS 64

static inline void tt_table(wire_seq *s, uint32_t slot) {
    static uint32_t ids[TT_SLOTS][TT_BLOCKS];
    if (slot >= TT_SLOTS) slot = TT_SLOTS - 1;
    for (uint32_t b = 0; b < TT_BLOCKS; b++) ids[slot][b] = slot * TT_BLOCKS + b;
    s->block_start = 0;
    s->n_blocks = TT_BLOCKS;
    s->blocks = ids[slot];
}

#endif
