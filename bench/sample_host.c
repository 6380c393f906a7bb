/* sample_host: the time of one row sampled on the host (worker/sample.c sampler_sample_mod) over a
 * vocabulary of N tokens, for the settings clients send: greedy, temperature 1, temperature 0.7
 * with top_p 0.9 / 0.95 / 0.99, top_k 40, min_p 0.05, and top_p 0.95 under a JSON mask.
 *
 *   sample_host [N_VOCAB (129280)] [REPEATS (20)] [SEED (1)]
 *
 * The logits: seeded, a model-like spread (a Gaussian of sd 2.5 with a few tokens lifted by 6-10,
 * as a peaked next-token distribution is). Prints one line per setting: the CPU milliseconds of one
 * row (the median over REPEATS) and the token drawn at the last repeat's seed (a check that two
 * builds agree). No timing is asserted (the ctest run only checks it runs). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/sample.h"

static uint64_t rs;
static double urand(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) * (1.0 / 9007199254740992.0);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); /* CPU time: the machine may be shared */
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const uint32_t V = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 129280;
    const int reps = argc > 2 ? atoi(argv[2]) : 20;
    rs = argc > 3 ? strtoull(argv[3], NULL, 10) : 1;
    if (V < 64 || reps < 1 || !rs) {
        fprintf(stderr, "usage: sample_host [N_VOCAB >= 64] [REPEATS >= 1] [SEED > 0]\n");
        return 2;
    }
    for (int k = 0; k < 16; k++) urand(); /* past the generator's first, small outputs */
    float *logits = malloc(V * sizeof *logits);
    uint8_t *allow = malloc(V);
    for (uint32_t i = 0; i < V; i++) {
        double u1 = urand() + 1e-12, u2 = urand();
        logits[i] = (float)(2.5 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
        allow[i] = urand() < 0.3; /* a mask inside a JSON string: many tokens allowed */
    }
    for (int k = 0; k < 12; k++) logits[(uint32_t)(urand() * V)] += (float)(6 + 4 * urand());
    struct {
        const char *name;
        float temperature, top_p, min_p;
        int32_t top_k;
        int masked;
    } set[] = {
        {"greedy", 0, 1, 0, 0, 0},
        {"temperature 1", 1, 1, 0, 0, 0},
        {"temperature 0.7, top_p 0.9", 0.7f, 0.9f, 0, 0, 0},
        {"temperature 0.7, top_p 0.95", 0.7f, 0.95f, 0, 0, 0},
        {"temperature 1, top_p 0.99", 1, 0.99f, 0, 0, 0},
        {"temperature 0.7, top_k 40", 0.7f, 1, 0, 40, 0},
        {"temperature 1, min_p 0.05", 1, 1, 0.05f, 0, 0},
        {"temperature 0.7, top_p 0.95, JSON mask", 0.7f, 0.95f, 0, 0, 1},
    };
    sampler *s = sampler_new(V);
    double *ms = malloc((size_t)reps * sizeof *ms);
    printf("vocabulary %u, %d repeats, median CPU ms a row\n", V, reps);
    for (size_t k = 0; k < sizeof set / sizeof set[0]; k++) {
        wire_sampling sp;
        memset(&sp, 0, sizeof sp);
        sp.temperature = set[k].temperature;
        sp.top_p = set[k].top_p;
        sp.min_p = set[k].min_p;
        sp.top_k = set[k].top_k;
        sp.repetition_penalty = 1;
        sp.seed = 7;
        const sample_mod mod = {.allow = set[k].masked ? allow : NULL};
        sample_out o = {0};
        for (int r = 0; r < reps; r++) {
            const double t0 = now_ms();
            sampler_sample_mod(s, logits, &sp, &mod, NULL, 0, 0, (uint64_t)r, &o);
            ms[r] = now_ms() - t0;
        }
        qsort(ms, (size_t)reps, sizeof *ms, cmp_d);
        printf("%-40s %8.3f ms  token %d\n", set[k].name, ms[reps / 2], o.token);
    }
    sampler_free(s);
    free(ms);
    free(logits);
    free(allow);
    return 0;
}
