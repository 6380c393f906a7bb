#include "zspin.h"

#include "mla_log.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

int zspin_poll(zmq_pollitem_t *items, int n, long timeout_ms, long spin_us) {
    if (spin_us > 0) {
        const long long end = now_us() + spin_us;
        do {
            int rc = zmq_poll(items, n, 0);
            if (rc != 0) return rc;
            sched_yield(); /* a runnable thread of ours (the one that will answer) goes first */
        } while (now_us() < end);
    }
    return zmq_poll(items, n, timeout_ms);
}

long zspin_default(const char *backend, long spin_us) {
    if (spin_us >= 0) return spin_us;
    return backend && !strcmp(backend, "cuda") ? 2000 : 0;
}
