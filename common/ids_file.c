#include "ids_file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

int ids_file_next(FILE *f, const char *path, uint64_t line_no, ids_line *out, mla_err *err) {
    char *line = NULL;
    size_t lcap = 0;
    out->n = 0;
    errno = 0;
    if (getline(&line, &lcap, f) < 0) {
        const int e = errno;
        free(line);
        /* the end of the file, or a read that failed (a folder: EISDIR), which is not an end */
        return ferror(f) ? mla_errf(err, "%s: line %llu: %s", path, (unsigned long long)line_no,
                                    strerror(e ? e : EIO))
                         : 0;
    }
    for (char *p = line, *end;; p = end) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            size_t shown = strcspn(p, "\r\n");
            mla_errf(err, "%s: line %llu: bad token id near '%.*s'", path, (unsigned long long)line_no,
                     (int)(shown < 20 ? shown : 20), p);
            free(line);
            return MLA_ERR;
        }
        if (out->n == out->cap) {
            out->cap = out->cap ? 2 * out->cap : 256;
            out->ids = mla_xrealloc(out->ids, out->cap * sizeof *out->ids);
        }
        out->ids[out->n++] = (int32_t)v;
    }
    free(line);
    return 1;
}

void ids_line_free(ids_line *l) {
    free(l->ids);
    l->ids = NULL;
    l->n = l->cap = 0;
}

int ids_file_read_all(const char *path, ids_prompts *out, mla_err *err) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) return mla_errf(err, "%s: %s", path, strerror(errno));
    ids_line L = {0};
    int rc = MLA_OK;
    for (uint64_t line = 1;; line++) {
        int r = ids_file_next(f, path, line, &L, err);
        if (r < 0) rc = MLA_ERR;
        if (r <= 0) break;
        if (L.n == 0) continue;
        out->ids = mla_xrealloc(out->ids, (size_t)(out->count + 1) * sizeof *out->ids);
        out->n = mla_xrealloc(out->n, (size_t)(out->count + 1) * sizeof *out->n);
        out->ids[out->count] = mla_xmalloc(L.n * sizeof *L.ids);
        memcpy(out->ids[out->count], L.ids, L.n * sizeof *L.ids);
        out->n[out->count++] = (int64_t)L.n;
    }
    ids_line_free(&L);
    fclose(f);
    if (rc) ids_prompts_free(out);
    return rc;
}

void ids_prompts_free(ids_prompts *p) {
    for (int64_t i = 0; i < p->count; i++) free(p->ids[i]);
    free(p->ids);
    free(p->n);
    memset(p, 0, sizeof *p);
}
