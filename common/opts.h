/* opts: the one command-line parser of every `mlaserve` command and of `mlaserve-worker`.
 *
 * A command describes its options in tables of opt_spec: the name (and an optional short alias),
 * the kind of value, the value's name and default as --help shows them, a one-line meaning, and
 * where the value goes. opts_parse accepts `--opt value`, `--opt=value` and `-x value`; a flag
 * takes no value (`--flag=1` is an error); numbers are checked whole and against their bounds;
 * an option that is not in the tables is an error naming it; "--" ends the options. Words that
 * do not start with '-' are positionals, kept in order (or, with OPTS_STOP_AT_POSITIONAL, the
 * first one ends the parse: `client [opts] SUBCOMMAND ...`). opts_help prints every option with
 * its meaning and default.
 *
 * Ownership: the tables and the destinations are the caller's; string values point into argv.
 * Nothing to free. */
#ifndef OPTS_H
#define OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mla_err.h"

typedef enum opt_kind {
    OPT_FLAG,   /* no value; dest int*, set to 1 */
    OPT_STR,    /* dest const char **; an empty value is refused unless empty_ok */
    OPT_INT,    /* dest int *, within [lo, hi] */
    OPT_LONG,   /* dest long *, within [lo, hi] */
    OPT_U64,    /* dest uint64_t * (decimal), within [lo, hi] when hi > 0 */
    OPT_DOUBLE, /* dest double *, within [lo, hi] */
    OPT_FLOAT,  /* dest float *, within [lo, hi] */
    OPT_CHOICE, /* dest int *: the index of the value in choices (NULL-terminated) */
    OPT_FN,     /* fn(ctx, value, err) handles the value (lists, repeated options, ...) */
} opt_kind;

typedef struct opt_spec {
    const char *name;  /* "--tp" */
    const char *alias; /* "-m", or NULL */
    opt_kind kind;
    const char *arg;   /* the value's name in --help ("N", "PATH"); NULL for flags */
    const char *def;   /* the default as --help shows it; NULL: none */
    const char *help;  /* what it means, one line */
    void *dest;
    double lo, hi;     /* numeric bounds (lo == hi == 0: any value of the type) */
    bool lo_open;      /* lo itself is out: (lo, hi] (a value that would read as "off" at lo) */
    bool empty_ok;     /* OPT_STR: "" is a value (a prompt); else it is refused, as an unset
                        * variable expanded in a script ("--model $M") would be */
    const char *const *choices;
    int (*fn)(void *ctx, const char *value, mla_err *err);
    void *ctx;
    int *seen;         /* when not NULL: set to 1 when the option was given */
} opt_spec;

typedef struct opt_table {
    const char *title; /* heading in --help ("serving", "control plane") */
    const opt_spec *specs;
    size_t n;
} opt_table;

enum { OPTS_STOP_AT_POSITIONAL = 1 };

/* Parses argv[first..argc). Positionals go to pos[0..max_pos) (*n_pos counts them; more than
 * max_pos is an error). *next (may be NULL) receives the index after the last word parsed
 * (argc, or the stopping positional's index). `-h`/`--help` sets *help (may be NULL: then it is
 * an unknown option). MLA_ERR with a message naming the option on any problem. */
int opts_parse(const opt_table *tabs, size_t n_tabs, int argc, char **argv, int first, int flags, const char **pos,
               int max_pos, int *n_pos, int *next, int *help, mla_err *err);

/* Writes usage (one or more lines, as given), then every option of every table: name, alias,
 * value, meaning and default. */
void opts_help(FILE *f, const char *usage, const opt_table *tabs, size_t n_tabs);

/* The usual use in a command: parses argv[1..argc); on --help prints the help on stdout; on an
 * error prints "PROG: message (PROG --help lists the options)" on stderr. Returns -1 to go on,
 * else the exit status (0 after --help, 2 after an error). */
int opts_command(const char *prog, const char *usage, const opt_table *tabs, size_t n_tabs, int argc, char **argv,
                 const char **pos, int max_pos, int *n_pos);

#endif
