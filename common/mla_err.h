/* mla_err: error reporting shared by every module.
 *
 * Errors that come from outside (files, sockets, clients) are returned: a function that can
 * fail takes an `mla_err *` as its last argument, fills its message and returns a negative
 * status (MLA_ERR). Broken invariants (bugs) abort loudly with file:line through MLA_ASSERT.
 * The struct is plain storage owned by the caller; nothing inside needs freeing. */
#ifndef MLA_ERR_H
#define MLA_ERR_H

#include <stdarg.h>
#include <stddef.h>

#define MLA_OK 0
#define MLA_ERR (-1)

typedef struct mla_err {
    char msg[1024];
} mla_err;

/* Formats msg into e (when e is not NULL) and returns MLA_ERR. */
int mla_errf(mla_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int mla_verrf(mla_err *e, const char *fmt, va_list ap);
/* Prepends "prefix: " to an existing message and returns MLA_ERR. */
int mla_err_prefix(mla_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

_Noreturn void mla_panic(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define MLA_ASSERT(cond)                                                                   \
    do {                                                                                   \
        if (!(cond)) mla_panic(__FILE__, __LINE__, "assertion failed: %s", #cond);         \
    } while (0)
#define MLA_PANIC(...) mla_panic(__FILE__, __LINE__, __VA_ARGS__)

/* Allocation that aborts with file:line on failure (out of memory is not recoverable here). */
void *mla_xmalloc_at(size_t n, const char *file, int line);
void *mla_xcalloc_at(size_t n, size_t size, const char *file, int line);
void *mla_xrealloc_at(void *p, size_t n, const char *file, int line);
char *mla_xstrdup_at(const char *s, const char *file, int line);
#define mla_xmalloc(n) mla_xmalloc_at((n), __FILE__, __LINE__)
#define mla_xcalloc(n, s) mla_xcalloc_at((n), (s), __FILE__, __LINE__)
#define mla_xrealloc(p, n) mla_xrealloc_at((p), (n), __FILE__, __LINE__)
#define mla_xstrdup(s) mla_xstrdup_at((s), __FILE__, __LINE__)

#endif
