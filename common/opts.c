/* opts: see opts.h. */
#include "opts.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const opt_spec *find(const opt_table *tabs, size_t n_tabs, const char *name, size_t len) {
    for (size_t t = 0; t < n_tabs; t++)
        for (size_t i = 0; i < tabs[t].n; i++) {
            const opt_spec *s = &tabs[t].specs[i];
            if (s->name && strlen(s->name) == len && !strncmp(s->name, name, len)) return s;
            if (s->alias && strlen(s->alias) == len && !strncmp(s->alias, name, len)) return s;
        }
    return NULL;
}

static int bounded(const opt_spec *s, double v) {
    return (s->lo == 0 && s->hi == 0 && !s->lo_open) || ((s->lo_open ? v > s->lo : v >= s->lo) && v <= s->hi);
}

static int bad_value(const opt_spec *s, const char *v, mla_err *err) {
    if (s->kind == OPT_U64 && !(s->hi > 0))
        return mla_errf(err, "%s: '%s' is not a whole number from 0 to 18446744073709551615", s->name, v);
    if (s->lo == 0 && s->hi == 0) return mla_errf(err, "%s: '%s' is not a valid %s", s->name, v, s->arg ? s->arg : "value");
    return mla_errf(err, "%s: '%s' is not a number in %c%.15g, %.15g]", s->name, v, s->lo_open ? '(' : '[', s->lo,
                    s->hi);
}

/* a number as written: no blank before it (strto* would skip them, and then " -1" reads as a
 * huge unsigned), none after it (the *end checks), decimal digits (no hex: integers read base 10,
 * and a float "0x1p1" would be 2) */
static bool plain_number(const char *v) {
    if (isspace((unsigned char)v[0])) return false;
    for (const char *p = v; *p; p++)
        if (*p == 'x' || *p == 'X') return false;
    return true;
}

static int set_value(const opt_spec *s, const char *v, mla_err *err) {
    char *end = NULL;
    errno = 0;
    if ((s->kind == OPT_INT || s->kind == OPT_LONG || s->kind == OPT_U64 || s->kind == OPT_DOUBLE ||
         s->kind == OPT_FLOAT) &&
        !plain_number(v))
        return bad_value(s, v, err);
    switch (s->kind) {
    case OPT_FLAG:
        MLA_PANIC("a flag has no value");
    case OPT_STR:
        if (!v[0] && !s->empty_ok) return mla_errf(err, "%s: the value is empty", s->name);
        *(const char **)s->dest = v;
        return MLA_OK;
    case OPT_INT:
    case OPT_LONG: {
        long n = strtol(v, &end, 10);
        if (errno || end == v || *end || !bounded(s, (double)n)) return bad_value(s, v, err);
        if (s->kind == OPT_INT) {
            if (n < -2147483647L - 1 || n > 2147483647L) return bad_value(s, v, err);
            *(int *)s->dest = (int)n;
        } else {
            *(long *)s->dest = n;
        }
        return MLA_OK;
    }
    case OPT_U64: {
        if (*v == '-') return bad_value(s, v, err);
        unsigned long long n = strtoull(v, &end, 10);
        if (errno || end == v || *end || (s->hi > 0 && !bounded(s, (double)n))) return bad_value(s, v, err);
        *(uint64_t *)s->dest = (uint64_t)n;
        return MLA_OK;
    }
    case OPT_DOUBLE:
    case OPT_FLOAT: {
        double d = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(d) || !bounded(s, d)) return bad_value(s, v, err);
        if (s->kind == OPT_DOUBLE) *(double *)s->dest = d;
        else *(float *)s->dest = (float)d;
        return MLA_OK;
    }
    case OPT_CHOICE:
        for (int k = 0; s->choices[k]; k++)
            if (!strcmp(s->choices[k], v)) {
                *(int *)s->dest = k;
                return MLA_OK;
            }
        {
            char list[256] = "";
            size_t off = 0;
            for (int k = 0; s->choices[k] && off < sizeof list - 32; k++)
                off += (size_t)snprintf(list + off, sizeof list - off, "%s%s", k ? ", " : "", s->choices[k]);
            return mla_errf(err, "%s: '%s' is not one of %s", s->name, v, list);
        }
    case OPT_FN:
        if (s->fn(s->ctx, v, err)) return mla_err_prefix(err, "%s", s->name);
        return MLA_OK;
    }
    MLA_PANIC("unknown option kind %d", (int)s->kind);
}

int opts_parse(const opt_table *tabs, size_t n_tabs, int argc, char **argv, int first, int flags, const char **pos,
               int max_pos, int *n_pos, int *next, int *help, mla_err *err) {
    int np = 0, opts_done = 0, i = first;
    if (n_pos) *n_pos = 0;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!opts_done && !strcmp(a, "--")) {
            opts_done = 1;
            continue;
        }
        if (opts_done || a[0] != '-' || a[1] == '\0') { /* a positional ("-" alone is one too) */
            if (flags & OPTS_STOP_AT_POSITIONAL) break;
            if (np >= max_pos)
                return mla_errf(err, max_pos ? "unexpected argument '%s' (at most %d expected)" : "unexpected argument '%s'",
                                a, max_pos);
            pos[np++] = a;
            if (n_pos) *n_pos = np;
            continue;
        }
        if (help && (!strcmp(a, "-h") || !strcmp(a, "--help"))) {
            *help = 1;
            continue;
        }
        const char *eq = a[1] == '-' ? strchr(a, '=') : NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const opt_spec *s = find(tabs, n_tabs, a, len);
        if (!s) return mla_errf(err, "unknown option '%.*s'", (int)len, a);
        if (s->seen) *s->seen = 1;
        if (s->kind == OPT_FLAG) {
            if (eq) return mla_errf(err, "%s takes no value (got '%s')", s->name, eq + 1);
            *(int *)s->dest = 1;
            continue;
        }
        const char *v;
        if (eq) {
            v = eq + 1;
        } else {
            if (i + 1 >= argc) return mla_errf(err, "%s needs a value (%s)", s->name, s->arg ? s->arg : "VALUE");
            v = argv[++i];
        }
        if (set_value(s, v, err)) return MLA_ERR;
    }
    if (next) *next = i;
    return MLA_OK;
}

void opts_help(FILE *f, const char *usage, const opt_table *tabs, size_t n_tabs) {
    fprintf(f, "%s", usage);
    for (size_t t = 0; t < n_tabs; t++) {
        if (!tabs[t].n) continue;
        fprintf(f, "\n%s:\n", tabs[t].title ? tabs[t].title : "options");
        for (size_t i = 0; i < tabs[t].n; i++) {
            const opt_spec *s = &tabs[t].specs[i];
            char head[128];
            int k = snprintf(head, sizeof head, "  %s%s%s", s->alias ? s->alias : "", s->alias ? ", " : "", s->name);
            if (s->kind != OPT_FLAG && k > 0 && (size_t)k < sizeof head)
                snprintf(head + k, sizeof head - (size_t)k, " %s", s->arg ? s->arg : "VALUE");
            if (strlen(head) <= 30) fprintf(f, "%-31s", head);
            else fprintf(f, "%s\n%-31s", head, "");
            fprintf(f, "%s", s->help ? s->help : "");
            if (s->def) fprintf(f, " (default: %s)", s->def);
            fputc('\n', f);
        }
    }
}

int opts_command(const char *prog, const char *usage, const opt_table *tabs, size_t n_tabs, int argc, char **argv,
                 const char **pos, int max_pos, int *n_pos) {
    mla_err err;
    int help = 0;
    if (opts_parse(tabs, n_tabs, argc, argv, 1, 0, pos, max_pos, n_pos, NULL, &help, &err)) {
        fprintf(stderr, "%s: %s (%s --help lists the options)\n", prog, err.msg, prog);
        return 2;
    }
    if (help) {
        opts_help(stdout, usage, tabs, n_tabs);
        return 0;
    }
    return -1;
}
