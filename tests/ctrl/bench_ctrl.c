/* Per-step overhead of the control plane: coordinator -> T workers (ROUTER/DEALER, one frame per
 * worker) -> test engine (one all-reduce of 97 floats over the host collective) -> rank 0 samples
 * -> result back. Prints mean / p50 / p99 microseconds per step for each T.
 * usage: bench_ctrl [--spin-us N] TEST_WORKER_EXE [steps] [T...] (--spin-us: the coordinator's) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "test_tables.h"
#include "coord.h"
#include "mla_log.h"
#include "test_engine.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *spin = NULL;
    if (argc > 2 && !strcmp(argv[1], "--spin-us")) {
        spin = argv[2];
        argv += 2;
        argc -= 2;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: %s [--spin-us N] TEST_WORKER_EXE [steps] [T...]\n", argv[0]);
        return 2;
    }
    int steps = argc > 2 ? atoi(argv[2]) : 2000;
    int Ts[8] = {1, 2, 4}, nT = 3;
    if (argc > 3) {
        nT = 0;
        for (int i = 3; i < argc && nT < 8; i++) Ts[nT++] = atoi(argv[i]);
    }
    char model[64];
    snprintf(model, sizeof model, "/tmp/mla-bench-model-%d", (int)getpid());
    FILE *f = fopen(model, "w");
    fputs("bench", f);
    fclose(f);
    mla_err err;
    uint64_t hash;
    test_engine_file_hash(model, &hash, &err);
    mla_log_level_opt(NULL, "warn", &err); /* the workers follow (RegisterReply) */
    double *t = malloc((size_t)steps * sizeof *t);
    for (int k = 0; k < nT; k++) {
        coord_config cfg = {.world = Ts[k], .model_path = model, .model_hash = hash, .worker_exe = argv[1],
                            .spin_us = spin ? atoi(spin) : 0, .spin_us_given = spin != NULL};
        coord *c;
        if (coord_start(&c, &cfg, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        int32_t tok = 1, pos = 0;
        for (int s = 0; s < steps + 100; s++) {
            pos = s % 256; /* within the block table (tests/ctrl/test_tables.h) */
            tok = (tok * 7 + 3) % TEST_VOCAB;
            wire_seq q = {.seq_id = 1, .n_tokens = 1, .tokens = &tok, .positions = &pos, .sample = true};
            tt_table(&q, 0);
            q.sp.top_p = 1;
            q.sp.repetition_penalty = 1;
            wire_step_plan plan = {.step_id = (uint64_t)s + 1, .n_seqs = 1, .seqs = &q};
            wire_step_result res;
            double t0 = now_us();
            if (coord_step(c, &plan, &res, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            double dt = now_us() - t0;
            coord_result_free(&res);
            if (s >= 100) t[s - 100] = dt; /* warm-up excluded */
        }
        qsort(t, (size_t)steps, sizeof *t, cmp_d);
        double sum = 0;
        for (int s = 0; s < steps; s++) sum += t[s];
        printf("T=%d: %d steps, per step mean %.1f us, p50 %.1f us, p99 %.1f us\n", Ts[k], steps,
               sum / steps, t[steps / 2], t[steps * 99 / 100]);
        coord_stop(c);
    }
    free(t);
    unlink(model);
    return 0;
}
