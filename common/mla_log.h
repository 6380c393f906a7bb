/* mla_log: leveled logging to stderr with a process tag ("coord", "worker 1").
 * A line: "2026-12-01T22:25:08.123Z [coord] info: message" (UTC, ISO 8601 with milliseconds).
 * The level comes from mla_log_set_level (--log-level), else info. */
#ifndef MLA_LOG_H
#define MLA_LOG_H

#include "mla_err.h"

enum mla_log_level { MLA_LOG_DEBUG = 0, MLA_LOG_INFO = 1, MLA_LOG_WARN = 2, MLA_LOG_ERROR = 3 };

void mla_log_set_level(enum mla_log_level lvl);
/* tag is copied; default "mlaserve". */
void mla_log_set_tag(const char *tag);
void mla_log(enum mla_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "debug", "info", "warn" or "error" (any case) into *out; MLA_ERR naming the value otherwise. */
int mla_log_level_parse(const char *s, enum mla_log_level *out, mla_err *err);
/* An opts callback (common/opts.h, OPT_FN; ctx unused): sets the level and records that it was
 * given (the coordinator hands its level to the workers at registration). */
int mla_log_level_opt(void *ctx, const char *value, mla_err *err);
/* the level in force, and whether --log-level set it */
enum mla_log_level mla_log_level(void);
/* "debug", "info", "warn" or "error" */
const char *mla_log_level_name(enum mla_log_level lvl);
int mla_log_level_given(void);
/* The --log-level entry of an opts table (the file using it includes common/opts.h); what the
 * help adds (a command that starts workers: they follow its level). */
#define MLA_LOG_LEVEL_OPT_HELP(d, more)                                                                     \
    {.name = "--log-level", .kind = OPT_FN, .arg = "debug|info|warn|error", .def = d,                            \
     .help = "leave out log lines below this level" more, .fn = mla_log_level_opt}
#define MLA_LOG_LEVEL_OPT_DEF(d) MLA_LOG_LEVEL_OPT_HELP(d, " (workers follow the coordinator's)")
#define MLA_LOG_LEVEL_OPT MLA_LOG_LEVEL_OPT_DEF("info")
/* a command without workers (inspect, keygen, mkmodel, client) */
#define MLA_LOG_LEVEL_OPT_SOLO MLA_LOG_LEVEL_OPT_HELP("info", "")
/* the commands that print their results (generate, bench) log warnings only unless asked */
#define MLA_LOG_LEVEL_OPT_WARN MLA_LOG_LEVEL_OPT_DEF("warn")

#define MLA_DEBUG(...) mla_log(MLA_LOG_DEBUG, __VA_ARGS__)
#define MLA_INFO(...) mla_log(MLA_LOG_INFO, __VA_ARGS__)
#define MLA_WARN(...) mla_log(MLA_LOG_WARN, __VA_ARGS__)
#define MLA_ERROR(...) mla_log(MLA_LOG_ERROR, __VA_ARGS__)

#endif
