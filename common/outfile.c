/* outfile: see outfile.h. */
#include "outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sig_clean.h"

int outfile_open(outfile *o, const char *path, mla_err *err) {
    *o = (outfile){.path = path, .fd = -1, .clean = -1};
    struct stat st, lst;
    /* /dev/stdout and the like name an open file (a shell's redirection, maybe a regular file
     * opened to append): written as they are, as is a device, a pipe, a link to a file not made
     * yet */
    const bool special = !strncmp(path, "/dev/", 5) || !strncmp(path, "/proc/", 6);
    char *real = special ? NULL : realpath(path, NULL); /* through a link to the file it names; NULL: not there yet */
    if (special || (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) ||
        (!real && lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode))) {
        free(real); /* a device, a pipe, or a link to a file not made yet: written as it is */
        o->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        return o->fd < 0 ? mla_errf(err, "%s: %s", path, strerror(errno)) : MLA_OK;
    }
    o->target = real ? real : mla_xstrdup(path);
    const size_t n = strlen(o->target) + sizeof ".partial-XXXXXX";
    o->tmp = mla_xmalloc(n);
    snprintf(o->tmp, n, "%s.partial-XXXXXX", o->target);
    o->fd = mkostemp(o->tmp, O_CLOEXEC);
    if (o->fd < 0) {
        mla_errf(err, "%s: cannot create a file beside it: %s", path, strerror(errno));
        free(o->tmp);
        free(o->target);
        *o = (outfile){.fd = -1, .clean = -1};
        return MLA_ERR;
    }
    o->clean = sig_clean_file(o->tmp);
    const mode_t um = umask(0); /* the mode a plain create would have given it (mkstemp makes 0600) */
    umask(um);
    if (fchmod(o->fd, 0666 & ~um) != 0) {
        mla_errf(err, "%s: %s", o->tmp, strerror(errno));
        outfile_close(o, 0, NULL);
        return MLA_ERR;
    }
    return MLA_OK;
}

int outfile_write(outfile *o, const void *buf, size_t n, mla_err *err) {
    const char *p = buf;
    while (n > 0) {
        const ssize_t k = write(o->fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return mla_errf(err, "%s: write failed: %s", o->path, k < 0 ? strerror(errno) : "nothing written");
        p += k;
        n -= (size_t)k;
    }
    return MLA_OK;
}

int outfile_close(outfile *o, int ok, mla_err *err) {
    int rc = MLA_OK;
    if (o->fd >= 0 && close(o->fd) != 0 && ok) {
        rc = mla_errf(err, "%s: close failed: %s", o->path, strerror(errno));
        ok = 0;
    }
    if (o->tmp) {
        if (ok && rename(o->tmp, o->target) != 0) {
            rc = mla_errf(err, "%s: cannot move %s into place: %s", o->path, o->tmp, strerror(errno));
            ok = 0;
        }
        if (!ok) unlink(o->tmp);
        sig_clean_forget(o->clean); /* after: a signal before it finds the file renamed or gone */
    }
    free(o->tmp);
    free(o->target);
    *o = (outfile){.fd = -1, .clean = -1};
    return rc;
}
