/* loadprog: see loadprog.h. */
#include "loadprog.h"
#include "mla_switch.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Atomic uint64_t g_done, g_total;
static _Atomic int64_t g_t0_ns; /* 0: not begun */
static _Atomic int g_finished;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void loadprog_begin(const gguf_ctx *g) {
    uint64_t total = 0;
    for (size_t i = 0; i < gguf_n_tensors(g); i++) total += gguf_tensor_at(g, i)->nbytes;
    atomic_store(&g_finished, 0);
    atomic_store(&g_done, 0);
    atomic_store(&g_total, total);
    int64_t t = now_ns();
    atomic_store(&g_t0_ns, t > 0 ? t : 1);
}

void loadprog_layers_done(const gguf_ctx *g, int64_t n_layers) {
    const long delay = mla_sw_int(MLA_SW_LOAD_LAYER_DELAY_MS); /* fault injection (tests): a slow load */
    if (delay > 0 && n_layers > 0) usleep((useconds_t)delay * 1000);
    uint64_t done = 0;
    for (size_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (strncmp(t->name, "blk.", 4)) continue;
        char *end;
        long il = strtol(t->name + 4, &end, 10);
        if (end != t->name + 4 && *end == '.' && il >= 0 && il < n_layers) done += t->nbytes;
    }
    if (done > atomic_load(&g_done)) atomic_store(&g_done, done);
}

void loadprog_finish(void) {
    atomic_store(&g_done, atomic_load(&g_total));
    atomic_store(&g_finished, 1);
}

void loadprog_get(loadprog_state *st) {
    int64_t t0 = atomic_load(&g_t0_ns);
    st->done = atomic_load(&g_done);
    st->total = atomic_load(&g_total);
    st->finished = atomic_load(&g_finished);
    st->seconds = t0 ? (double)(now_ns() - t0) / 1e9 : 0;
}

void loadprog_describe(const loadprog_state *st, char *buf, unsigned long cap) {
    /* GiB, or MiB for a model under one GiB (a test's: "0.0 of 0.0 GiB" said nothing) */
    const bool small = st->total < ((uint64_t)1 << 30);
    const double unit = small ? 1024.0 * 1024 : 1024.0 * 1024 * 1024;
    const char *u = small ? "MiB" : "GiB";
    double pct = st->total ? 100.0 * (double)st->done / (double)st->total : 0;
    int k = snprintf(buf, cap, "%.1f of %.1f %s (%.0f%%)", (double)st->done / unit, (double)st->total / unit, u, pct);
    if (k < 0 || (unsigned long)k >= cap || st->done == 0 || st->seconds <= 0) return;
    double rate = (double)st->done / st->seconds;
    int k2 = snprintf(buf + k, cap - (unsigned long)k, ", %.2f %s/s", rate / unit, u);
    if (k2 < 0 || (unsigned long)(k + k2) >= cap || st->finished) return;
    long eta = (long)((double)(st->total - st->done) / rate + 0.5);
    snprintf(buf + k + k2, cap - (unsigned long)(k + k2), ", ETA %ldm%02lds", eta / 60, eta % 60);
}
