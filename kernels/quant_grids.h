/* quant_grids: format constants of the IQ* / IQ4_NL / MXFP4 GGUF types (generated into
 * quant_grids.c by scripts/gen_quant_grids.py from gguf-py). Read-only static data. */
#ifndef QUANT_GRIDS_H
#define QUANT_GRIDS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Grid rows: each entry is the 8 (or 4) unsigned magnitudes of one codebook point. */
extern const uint8_t quant_iq2xxs_grid[256][8];
extern const uint8_t quant_iq2xs_grid[512][8];
extern const uint8_t quant_iq2s_grid[1024][8];
extern const uint8_t quant_iq3xxs_grid[256][4];
extern const uint8_t quant_iq3s_grid[512][4];
/* IQ1_S and IQ1_M share this grid; values are -1, 0, +1. */
extern const int8_t quant_iq1s_grid[2048][8];
/* 7-bit sign index -> 8 sign bits (bit j set: element j negative; bit 7 = parity). */
extern const uint8_t quant_ksigns[128];
extern const int8_t quant_kvalues_iq4nl[16];
/* MXFP4 e2m1 values, doubled (the e8m0 scale is halved to match). */
extern const int8_t quant_kvalues_mxfp4[16];

#ifdef __cplusplus
}
#endif

#endif
