/* ids_file: the token-id text format of `mlaserve logits` (one prompt per line, token ids
 * separated by spaces or tabs), shared by every command and tool that reads it.
 *
 * Ownership: an ids_line is caller-owned storage reused from line to line; ids_line_free
 * releases its array. */
#ifndef IDS_FILE_H
#define IDS_FILE_H

#include <stdint.h>
#include <stdio.h>

#include "mla_err.h"

typedef struct ids_line {
    int32_t *ids;
    size_t n, cap;
} ids_line;

/* Reads the next line of f into out (out->n may be 0 for an empty line). Returns 1, 0 at end of
 * file, or MLA_ERR with "PATH: line N: bad token id near '...'" for anything that is not a
 * non-negative 32-bit integer. */
int ids_file_next(FILE *f, const char *path, uint64_t line_no, ids_line *out, mla_err *err);
void ids_line_free(ids_line *l);

#endif
