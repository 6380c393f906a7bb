#include "curve.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <zmq.h>

int curve_read_z85_key(const char *path, char out[41], mla_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) return mla_errf(err, "cannot read the key file %s: %s", path, strerror(errno));
    char buf[256];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = buf;
    while (*p && isspace((unsigned char)*p)) p++;
    size_t k = 0;
    while (p[k] && !isspace((unsigned char)p[k])) k++;
    uint8_t bin[32];
    if (k != 40) return mla_errf(err, "%s: not a Z85 key (expected 40 characters, found %zu)", path, k);
    memcpy(out, p, 40);
    out[40] = '\0';
    if (!zmq_z85_decode(bin, out)) return mla_errf(err, "%s: not a valid Z85 key", path);
    return MLA_OK;
}

int curve_check_mode(const char *path, unsigned bad, mla_err *err) {
    struct stat st;
    if (stat(path, &st) != 0) { /* a missing file: its reader says so (and how to make it) */
        if (errno == ENOENT) return MLA_OK;
        return mla_errf(err, "cannot read %s: %s", path, strerror(errno));
    }
    const unsigned mode = (unsigned)st.st_mode & 07777;
    if (!(mode & bad)) return MLA_OK;
    const unsigned want = mode & ~bad & 0777;
    return mla_errf(err, "%s is %s by others (mode %04o): `chmod %o %s` (keys of the control plane stay private)",
                    path, bad & 044 ? "readable" : "writable", mode, want, path);
}
