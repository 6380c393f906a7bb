/* curve: ZeroMQ CURVE key files shared by the coordinator and the workers (the control plane's
 * authentication and encryption, docs/deploy.md). Keys are 40-character Z85 text, one per file
 * (as `mlaserve keygen` writes them). No ownership: callers own the output buffers. */
#ifndef CURVE_H
#define CURVE_H

#include "common/mla_err.h"

/* Reads a Z85 key from path into out (40 characters + NUL); MLA_ERR naming the file when it is
 * missing or does not hold one valid key. */
int curve_read_z85_key(const char *path, char out[41], mla_err *err);

/* MLA_OK when path (a key file or the keys' folder) has none of the permission bits in bad
 * (077: a secret key others may read; 022: a folder or authorized_keys others may write), as ssh
 * refuses such files, or does not exist (its reader reports that); MLA_ERR naming the file, its
 * mode and the chmod that fixes it. */
int curve_check_mode(const char *path, unsigned bad, mla_err *err);

#endif
