/* outfile: a file a command writes whole or not at all.
 *
 * outfile_open writes into a temporary file beside the target (`NAME.partial-XXXXXX`, the target
 * being the file a symbolic link points to), registered with common/sig_clean.h so that a signal
 * that ends the command removes it; outfile_close renames it over the target when the run
 * succeeded and removes it when not. A file that was there before stays as it was until the
 * rename. A path under /dev/ or /proc/ (/dev/stdout: maybe a shell's redirection to a file), one
 * that is not a regular file (a pipe, a device) or a link to a file not made yet is written in
 * place, and never removed.
 *
 * Ownership: the caller owns the outfile struct; outfile_close releases what it holds (the fd, if
 * still open, and its strings) and zeroes it. `mlaserve logits` (its --out and --ids-out) and
 * the GGUF writer (common/gguf_write.h: `mlaserve mkmodel`) write their outputs so. */
#ifndef OUTFILE_H
#define OUTFILE_H

#include "mla_err.h"

typedef struct outfile {
    const char *path;   /* as given (not owned) */
    char *target, *tmp; /* where it goes and where it is written (NULL: in place) */
    int fd;             /* open for writing; -1 once the caller closed it (fclose of an fdopen) */
    int clean;          /* tmp's sig_clean entry (-1: none) */
} outfile;

/* Opens path as above: o->fd ready to write. MLA_ERR with "PATH: reason" (nothing left behind). */
int outfile_open(outfile *o, const char *path, mla_err *err);

/* Closes o->fd (unless -1), then moves the temporary file into place when ok, else removes it.
 * MLA_ERR with "PATH: reason" when ok and the close or the rename failed (the temporary file is
 * removed then too). */
int outfile_close(outfile *o, int ok, mla_err *err);

/* Writes all n bytes of buf to o->fd (again after a signal). MLA_ERR with "PATH: write failed:
 * reason" (the file stays open: outfile_close removes it). */
int outfile_write(outfile *o, const void *buf, size_t n, mla_err *err);

#endif
