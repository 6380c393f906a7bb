/* The bench hooks of `mlaserve bench` (worker/engine.h bench_fill / bench_coll).
 * usage: test_bench_hooks nohook TEST_WORKER_EXE
 *        test_bench_hooks fill MODEL.gguf N
 *  nohook: a coordinator with 2 mla-test-worker processes (the test engine has no bench hooks):
 *          Bench FILL and COLL come back as errors naming the missing hook (no hang: every wait is
 *          bounded by the step timeout), and the group still serves steps afterwards.
 *  fill  : the CPU engine on MODEL: a sequence filled to N positions decodes at position N, with
 *          exactly the logits of a fresh sequence filled to N even when it held a real prompt
 *          before (the fill zeroes the cache), different from that prompt's own continuation and
 *          from a fill to N/2; a fill shorter than the next position leaves a gap (refused, naming
 *          both); a fill past the context is refused; bench_coll times the collective. */
#include <math.h>
#include <stdint.h>
#include <unistd.h>

#include "coord.h"
#include "engine_cpu.h"
#include "mla_test.h"
#include "test_engine.h"

/* ---- nohook -------------------------------------------------------------------------------- */

static void test_nohook(const char *exe) {
    char model[256];
    snprintf(model, sizeof model, "/tmp/mla-bench-hooks-%d.bin", (int)getpid());
    FILE *f = fopen(model, "wb");
    REQUIRE(f);
    fputs("bench hooks test model\n", f);
    fclose(f);
    mla_err err = {{0}};
    coord_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.world = 2;
    cfg.model_path = model;
    REQUIRE(test_engine_file_hash(model, &cfg.model_hash, &err) == MLA_OK);
    cfg.worker_exe = exe;
    cfg.heartbeat_timeout_ms = 5000; /* generous: sanitizer builds on 2 cores */
    cfg.start_timeout_ms = 60000;
    cfg.step_timeout_ms = 60000; /* a request nobody answers fails instead of hanging */
    coord *c;
    int rc = coord_start(&c, &cfg, &err);
    REQUIRE(rc == MLA_OK || (fprintf(stderr, "coord_start: %s\n", err.msg), 0));

    uint64_t ids[2] = {1, 2};
    memset(&err, 0, sizeof err);
    rc = coord_bench_fill(c, ids, 2, 100, 101, &err);
    CHECKF(rc == MLA_ERR && strstr(err.msg, "worker 0") && strstr(err.msg, "test engine") &&
               strstr(err.msg, "no bench_fill hook"),
           "fill: rc %d, '%s'", rc, err.msg);
    memset(&err, 0, sizeof err);
    double sec = -1;
    rc = coord_bench_coll(c, 4096, 3, &sec, &err);
    CHECKF(rc == MLA_ERR && strstr(err.msg, "test engine") && strstr(err.msg, "no bench_coll hook"),
           "coll: rc %d, '%s'", rc, err.msg);
    CHECKF(coord_healthy(c, &err), "the group failed after a bench error: %s", err.msg);

    /* the group still runs steps: one token, greedy */
    int32_t tok = 3, pos = 0;
    uint32_t blk = 0;
    wire_seq s = {.seq_id = 1, .n_tokens = 1, .tokens = &tok, .positions = &pos, .sample = true, .n_blocks = 1,
                  .blocks = &blk};
    s.sp.top_p = 1;
    s.sp.repetition_penalty = 1;
    wire_step_plan plan = {.step_id = 1, .n_seqs = 1, .seqs = &s};
    wire_step_result res;
    rc = coord_step(c, &plan, &res, &err);
    CHECKF(rc == MLA_OK, "step after the bench errors: %s", err.msg);
    if (rc == MLA_OK) {
        CHECK(res.n_seqs == 1 && res.seqs[0].token >= 0 && res.seqs[0].token < TEST_VOCAB);
        coord_result_free(&res);
    }
    coord_stop(c);
    unlink(model);
}

/* ---- fill (CPU engine) ------------------------------------------------------------------------- */

typedef struct fx {
    engine *e;
    uint32_t V;
} fx;

#define CTX 80
#define PER 5 /* blocks of 16 positions a sequence: CTX positions */

/* sequence id's table: the pool blocks [id * PER, (id + 1) * PER) */
static const uint32_t *table_of(uint64_t id) {
    static uint32_t t[PER];
    for (int b = 0; b < PER; b++) t[b] = (uint32_t)(id * PER + (uint64_t)b);
    return t;
}

/* one step of tokens at positions pos0.., the last row's logits into out (may be NULL) */
static int step(fx *f, uint64_t id, const int32_t *tok, int n, int pos0, float *out, mla_err *err) {
    int32_t pos[64];
    REQUIRE(n <= 64);
    for (int i = 0; i < n; i++) pos[i] = pos0 + i;
    wire_seq s = {.seq_id = id, .n_tokens = (uint32_t)n, .tokens = (int32_t *)tok, .positions = pos, .n_blocks = PER,
                  .blocks = (uint32_t *)table_of(id)};
    s.sp.top_p = 1;
    s.sp.repetition_penalty = 1;
    s.sp.logits = WIRE_LOGITS_LAST;
    wire_step_plan plan = {.step_id = 1, .n_seqs = 1, .seqs = &s};
    float *row = mla_xmalloc((size_t)f->V * sizeof *row);
    int rc = engine_cpu_ops.set_tables(f->e, &plan, err);
    if (rc == MLA_OK) rc = engine_cpu_ops.step(f->e, &plan, &row, err);
    if (rc == MLA_OK && out) memcpy(out, row, (size_t)f->V * sizeof *row);
    free(row);
    return rc;
}

static double max_abs_diff(const float *a, const float *b, uint32_t n) {
    double m = 0;
    for (uint32_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

static int all_finite(const float *a, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return 0;
    return 1;
}

static void test_fill(const char *model, int n) {
    REQUIRE(n >= 2 && n <= 32);
    mla_err err = {{0}};
    fx f = {0};
    coll *c = coll_single_new();
    const engine_opts eo = {.n_threads = 1, .kv = {.kv_memory_bytes = 4u << 20, .max_context = CTX}};
    int rc = engine_cpu_ops.load(&f.e, model, 0, 1, c, NULL, &eo, &err);
    REQUIRE(rc == MLA_OK || (fprintf(stderr, "load: %s\n", err.msg), 0));
    REQUIRE(engine_cpu_ops.bench_fill && engine_cpu_ops.bench_coll);
    f.V = engine_cpu_ops.n_vocab(f.e);
    float *la = mla_xmalloc(f.V * sizeof(float)), *lb = mla_xmalloc(f.V * sizeof(float));
    float *lc = mla_xmalloc(f.V * sizeof(float)), *le = mla_xmalloc(f.V * sizeof(float));
    int32_t prompt[32], x = 42;
    for (int i = 0; i < n; i++) prompt[i] = (int32_t)((i * 97 + 5) % (int)f.V);

    /* A: a real prompt of n tokens, then filled to n: the rows are zeros, not the prompt's */
    REQUIRE(step(&f, 1, prompt, n, 0, NULL, &err) == MLA_OK);
    CHECKF(engine_cpu_ops.bench_fill(f.e, 1, (uint32_t)n, table_of(1), PER, &err) == MLA_OK, "%s", err.msg);
    CHECKF(step(&f, 1, &x, 1, n, la, &err) == MLA_OK, "decode at %d after the fill: %s", n, err.msg);
    /* B: a new sequence filled to n decodes at position n (the engine refuses a gap) */
    CHECKF(engine_cpu_ops.bench_fill(f.e, 2, (uint32_t)n, table_of(2), PER, &err) == MLA_OK, "%s", err.msg);
    CHECKF(step(&f, 2, &x, 1, n, lb, &err) == MLA_OK, "decode at %d after the fill: %s", n, err.msg);
    CHECK(all_finite(lb, f.V));
    CHECKF(!memcmp(la, lb, f.V * sizeof(float)), "filled-over prompt vs fresh fill: max |d| %g",
           max_abs_diff(la, lb, f.V));
    /* C: the prompt's own continuation differs (the fill really replaced the cache) */
    REQUIRE(step(&f, 3, prompt, n, 0, NULL, &err) == MLA_OK);
    REQUIRE(step(&f, 3, &x, 1, n, lc, &err) == MLA_OK);
    CHECKF(max_abs_diff(lb, lc, f.V) > 1e-3, "fill vs prompt: max |d| %g", max_abs_diff(lb, lc, f.V));
    /* E: a fill to n/2 decodes at n/2 with other logits: the zero rows are attended to (fewer of
     * them weigh less against the new token's own key; RoPE alone would not show: the new token
     * meets only itself at a relative distance of 0) */
    CHECKF(engine_cpu_ops.bench_fill(f.e, 5, (uint32_t)(n / 2), table_of(5), PER, &err) == MLA_OK, "%s", err.msg);
    CHECKF(step(&f, 5, &x, 1, n / 2, le, &err) == MLA_OK, "decode at %d: %s", n / 2, err.msg);
    CHECKF(max_abs_diff(lb, le, f.V) > 1e-3, "fill %d vs %d: max |d| %g", n, n / 2, max_abs_diff(lb, le, f.V));
    /* D: filled to n/2, the next step at n leaves a gap: refused, naming both */
    CHECKF(engine_cpu_ops.bench_fill(f.e, 4, (uint32_t)(n / 2), table_of(4), PER, &err) == MLA_OK, "%s", err.msg);
    memset(&err, 0, sizeof err);
    rc = step(&f, 4, &x, 1, n, NULL, &err);
    char want[64];
    snprintf(want, sizeof want, "position %d but its cache holds %d", n, n / 2);
    CHECKF(rc == MLA_ERR && strstr(err.msg, want), "gap: rc %d '%s'", rc, err.msg);
    /* past the context (80) */
    memset(&err, 0, sizeof err);
    rc = engine_cpu_ops.bench_fill(f.e, 6, 81, table_of(6), PER, &err);
    CHECKF(rc == MLA_ERR && strstr(err.msg, "81 positions") && strstr(err.msg, "context of 80"), "rc %d '%s'", rc,
           err.msg);
    engine_cpu_ops.free_seq(f.e, 6);

    /* bench_coll on the single-rank collective: a time, and bad arguments refused */
    double sec = -1;
    CHECKF(engine_cpu_ops.bench_coll(f.e, 1000, 5, &sec, &err) == MLA_OK, "%s", err.msg);
    CHECKF(isfinite(sec) && sec >= 0, "sec %g", sec);
    memset(&err, 0, sizeof err);
    CHECK(engine_cpu_ops.bench_coll(f.e, 0, 5, &sec, &err) == MLA_ERR && strstr(err.msg, "0 floats"));
    CHECK(engine_cpu_ops.bench_coll(f.e, 10, 0, &sec, &err) == MLA_ERR && strstr(err.msg, "0 times"));

    free(la);
    free(lb);
    free(lc);
    free(le);
    engine_cpu_ops.destroy(f.e);
    coll_free(c);
}

int main(int argc, char **argv) {
    alarm(240); /* a hang fails the test instead of blocking ctest (not a timing assertion) */
    if (argc == 3 && !strcmp(argv[1], "nohook")) test_nohook(argv[2]);
    else if (argc == 4 && !strcmp(argv[1], "fill")) test_fill(argv[2], atoi(argv[3]));
    else {
        fprintf(stderr, "usage: %s nohook TEST_WORKER_EXE | fill MODEL.gguf N\n", argv[0]);
        return 2;
    }
    return mla_test_finish();
}
