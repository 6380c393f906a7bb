#include "steptrace.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "mla_log.h"
#include "mla_switch.h"

#define ST_CAP (1u << 16)

typedef struct st_rec {
    uint64_t step;
    int64_t ns;
    char mark;
} st_rec;

static st_rec recs[ST_CAP];
static atomic_uint n_recs;
static atomic_int state; /* 0 unread, 1 off, 2 on, 3 being set up */
static char dir[512];

static void dump(void) {
    unsigned n = atomic_load(&n_recs);
    if (n > ST_CAP) n = ST_CAP;
    char path[600];
    snprintf(path, sizeof path, "%s/steptrace-%ld.txt", dir, (long)getpid());
    FILE *f = fopen(path, "w");
    if (!f) {
        MLA_WARN("MLA_STEP_TRACE: cannot write %s", path);
        return;
    }
    for (unsigned i = 0; i < n; i++)
        fprintf(f, "%llu %c %lld\n", (unsigned long long)recs[i].step, recs[i].mark, (long long)recs[i].ns);
    fclose(f);
}

static int enabled(void) {
    int s = atomic_load_explicit(&state, memory_order_acquire);
    if (s == 1 || s == 2) return s == 2;
    int expect = 0;
    if (atomic_compare_exchange_strong(&state, &expect, 3)) {
        const char *d = mla_sw_str(MLA_SW_STEP_TRACE);
        int on = d && *d && snprintf(dir, sizeof dir, "%s", d) < (int)sizeof dir;
        if (on && atexit(dump) != 0) on = 0;
        atomic_store_explicit(&state, on ? 2 : 1, memory_order_release);
        return on;
    }
    while ((s = atomic_load_explicit(&state, memory_order_acquire)) == 3) {
    }
    return s == 2;
}

void steptrace_mark(uint64_t step, char mark) {
    if (!enabled()) return;
    unsigned i = atomic_fetch_add(&n_recs, 1);
    if (i >= ST_CAP) return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    recs[i] = (st_rec){step, (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec, mark};
}
