#include "mla_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mla_verrf(mla_err *e, const char *fmt, va_list ap) {
    if (e) vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    return MLA_ERR;
}

int mla_errf(mla_err *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mla_verrf(e, fmt, ap);
    va_end(ap);
    return MLA_ERR;
}

int mla_err_prefix(mla_err *e, const char *fmt, ...) {
    if (!e) return MLA_ERR;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[sizeof e->msg];
    memcpy(old, e->msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof e->msg - 3) n = sizeof e->msg - 3;
    memcpy(e->msg, prefix, n);
    e->msg[n] = ':';
    e->msg[n + 1] = ' ';
    size_t rest = sizeof e->msg - n - 2;
    size_t m = strnlen(old, sizeof old);
    if (m > rest - 1) m = rest - 1;
    memcpy(e->msg + n + 2, old, m);
    e->msg[n + 2 + m] = '\0';
    return MLA_ERR;
}

void mla_panic(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "mlaserve: internal error at %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    abort();
}

void *mla_xmalloc_at(size_t n, const char *file, int line) {
    void *p = malloc(n ? n : 1);
    if (!p) mla_panic(file, line, "out of memory allocating %zu bytes", n);
    return p;
}

void *mla_xcalloc_at(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) mla_panic(file, line, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *mla_xrealloc_at(void *p, size_t n, const char *file, int line) {
    void *q = realloc(p, n ? n : 1);
    if (!q) mla_panic(file, line, "out of memory reallocating %zu bytes", n);
    return q;
}

char *mla_xstrdup_at(const char *s, const char *file, int line) {
    size_t n = strlen(s) + 1;
    char *p = mla_xmalloc_at(n, file, line);
    memcpy(p, s, n);
    return p;
}
