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

/* Every non-empty line of a whole file: the prompts of `mlaserve logits` and its GPU twin.
 * Ownership: the arrays are the caller's, released with ids_prompts_free. */
typedef struct ids_prompts {
    int32_t **ids;
    int64_t *n;
    int64_t count;
} ids_prompts;

/* Reads path into out (zeroed first). MLA_ERR with "PATH: ..." when it cannot be opened or a line
 * is bad (out is then released). */
int ids_file_read_all(const char *path, ids_prompts *out, mla_err *err);
void ids_prompts_free(ids_prompts *p);

#endif
