/* mla_log: leveled logging to stderr with a process tag ("coord", "worker 1"). */
#ifndef MLA_LOG_H
#define MLA_LOG_H

enum mla_log_level { MLA_LOG_DEBUG = 0, MLA_LOG_INFO = 1, MLA_LOG_WARN = 2, MLA_LOG_ERROR = 3 };

void mla_log_set_level(enum mla_log_level lvl);
/* tag is copied; default "mlaserve". Level also read from MLA_LOG_LEVEL=debug|info|warn|error. */
void mla_log_set_tag(const char *tag);
void mla_log(enum mla_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define MLA_DEBUG(...) mla_log(MLA_LOG_DEBUG, __VA_ARGS__)
#define MLA_INFO(...) mla_log(MLA_LOG_INFO, __VA_ARGS__)
#define MLA_WARN(...) mla_log(MLA_LOG_WARN, __VA_ARGS__)
#define MLA_ERROR(...) mla_log(MLA_LOG_ERROR, __VA_ARGS__)

#endif
