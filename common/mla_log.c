#include "mla_log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static int g_level = -1, g_given = 0;
static char g_tag[64] = "mlaserve";
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static const char *const names[] = {"debug", "info", "warn", "error"};

int mla_log_level_parse(const char *s, enum mla_log_level *out, mla_err *err) {
    for (int k = 0; k < 4; k++)
        if (!strcasecmp(s, names[k])) {
            *out = (enum mla_log_level)k;
            return MLA_OK;
        }
    return mla_errf(err, "log level '%s' is not debug, info, warn or error", s);
}

int mla_log_level_opt(void *ctx, const char *value, mla_err *err) {
    (void)ctx;
    enum mla_log_level l = MLA_LOG_INFO;
    if (mla_log_level_parse(value, &l, err)) return MLA_ERR;
    mla_log_set_level(l);
    g_given = 1;
    return MLA_OK;
}

enum mla_log_level mla_log_level(void) { return g_level < 0 ? MLA_LOG_INFO : (enum mla_log_level)g_level; }

int mla_log_level_given(void) { return g_given; }

const char *mla_log_level_name(enum mla_log_level lvl) {
    return (int)lvl >= 0 && (int)lvl < 4 ? names[lvl] : "info";
}

void mla_log_set_level(enum mla_log_level lvl) { g_level = (int)lvl; }

void mla_log_set_tag(const char *tag) { snprintf(g_tag, sizeof g_tag, "%s", tag); }

void mla_log(enum mla_log_level lvl, const char *fmt, ...) {
    if (g_level < 0) g_level = MLA_LOG_INFO;
    if ((int)lvl < g_level) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&g_mu);
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ [%s] %s: %s\n", tm.tm_year + 1900, tm.tm_mon + 1,
            tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, g_tag, names[lvl], msg);
    pthread_mutex_unlock(&g_mu);
}
