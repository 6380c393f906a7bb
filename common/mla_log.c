#include "mla_log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static int g_level = -1;
static char g_tag[64] = "mlaserve";
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static int level_from_env(void) {
    const char *s = getenv("MLA_LOG_LEVEL");
    if (!s) return MLA_LOG_INFO;
    if (!strcasecmp(s, "debug")) return MLA_LOG_DEBUG;
    if (!strcasecmp(s, "warn")) return MLA_LOG_WARN;
    if (!strcasecmp(s, "error")) return MLA_LOG_ERROR;
    return MLA_LOG_INFO;
}

void mla_log_set_level(enum mla_log_level lvl) { g_level = (int)lvl; }

void mla_log_set_tag(const char *tag) { snprintf(g_tag, sizeof g_tag, "%s", tag); }

void mla_log(enum mla_log_level lvl, const char *fmt, ...) {
    if (g_level < 0) g_level = level_from_env();
    if ((int)lvl < g_level) return;
    static const char *names[] = {"debug", "info", "warn", "error"};
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
    fprintf(stderr, "%02d:%02d:%02d.%03ld [%s] %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, g_tag, names[lvl], msg);
    pthread_mutex_unlock(&g_mu);
}
