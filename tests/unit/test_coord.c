/* Coordinator + real worker processes (mla-test-worker: the worker runtime with the test engine).
 * usage: test_coord TEST_WORKER_EXE [group|refuse|kill|orphan|load|ncclid|ahead|all]
 *  group : T = 1, 2, 4 local workers exchange steps; logits equal the independently computed
 *          sum over ranks, greedy tokens their argmax, logprobs the log-softmax; free_seq reaches
 *          every rank; no zombie after stop.
 *  refuse: wrong protocol version, wrong model hash (local); world mismatch and duplicate rank
 *          (external workers), each refused with the reason; the worker exits with it.
 *  kill  : kill -9 of a worker in the middle of a step: the step fails naming the worker and the
 *          signal; later steps fail at once; coord_restart brings a fresh group that serves steps;
 *          stop leaves no zombie. Bounded waits only.
 *  orphan: the coordinator process is SIGKILLed: external workers exit by themselves.
 *  load  : a worker whose load fails makes coord_start fail with its message.
 *  ahead : scripted greedy steps with the workers' step ahead off, run after a step (sync) and
 *          queued in the engine (on), T = 1, 2: every token equals the reference, and the engines
 *          advanced exactly the tokens the rule implies, queued as it implies; the same with a
 *          host-sampled (temperature 1) row beside a greedy one. */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_tables.h"
#include "coord.h"
#include "mla_test.h"
#include "sample.h"
#include "common/gguf_write.h"
#include "wk_constrain.h"
#include "test_engine.h"

extern char **environ;
static const char *g_exe;
static char g_model[256], g_model2[256];
static uint64_t g_hash;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    fputs(text, f);
    fclose(f);
}

static int reaped(pid_t pid) {
    int ws;
    return waitpid(pid, &ws, WNOHANG) < 0 && errno == ECHILD && (kill(pid, 0) < 0 && errno == ESRCH);
}

/* waits up to secs for pid; returns its wait status or -1 (then kills it) */
static int wait_bounded(pid_t pid, double secs) {
    double end = now_s() + secs;
    int ws;
    for (;;) {
        pid_t p = waitpid(pid, &ws, WNOHANG);
        if (p == pid) return ws;
        if (now_s() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &ws, 0);
            return -1;
        }
        usleep(10000);
    }
}

static coord_config base_cfg(int world) {
    coord_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.world = world;
    cfg.model_path = g_model;
    cfg.model_hash = g_hash;
    cfg.worker_exe = g_exe;
    cfg.heartbeat_ms = 100;
    cfg.heartbeat_timeout_ms = 3000; /* generous: sanitizer builds on 2 cores */
    cfg.coll_timeout_ms = 20000;
    cfg.start_timeout_ms = 30000;
    return cfg;
}

/* ---- group: steps through T workers ----------------------------------------------------- */

typedef struct ref_seq {
    uint64_t id;
    uint64_t h;
    int32_t pos;
} ref_seq;

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void test_group(int T) {
    coord *c;
    mla_err err;
    coord_config cfg = base_cfg(T);
    int rc = coord_start(&c, &cfg, &err);
    REQUIRE(rc == MLA_OK || (fprintf(stderr, "coord_start: %s\n", err.msg), 0));
    CHECK(coord_n_vocab(c) == TEST_VOCAB);
    pid_t pids[8];
    for (int r = 0; r < T; r++) pids[r] = coord_worker_pid(c, r);

    ref_seq ref[3] = {{11, 0, 0}, {22, 0, 0}, {33, 0, 0}};
    int32_t next[3] = {0, 0, 0};
    float row[TEST_VOCAB];
    int bad_logits = 0, bad_tok = 0, bad_lp = 0;
    for (int step = 0; step < 6; step++) {
        int32_t toks[3][8], pos[3][8];
        uint32_t nt[3];
        wire_seq seqs[3];
        memset(seqs, 0, sizeof seqs);
        for (int i = 0; i < 3; i++) {
            nt[i] = step == 0 ? (uint32_t)(5 - 2 * i) : 1; /* prompts of 5, 3, 1 tokens */
            for (uint32_t k = 0; k < nt[i]; k++) {
                toks[i][k] = step == 0 ? (int32_t)((7 * i + 3 * k + 1) % TEST_VOCAB) : next[i];
                pos[i][k] = ref[i].pos + (int32_t)k;
            }
            seqs[i] = (wire_seq){.seq_id = ref[i].id, .n_tokens = nt[i], .tokens = toks[i],
                                 .positions = pos[i], .sample = true};
            tt_table(&seqs[i], (uint32_t)i);
            seqs[i].sp.top_p = 1;
            seqs[i].sp.repetition_penalty = 1;
        }
        seqs[0].sp.logits = WIRE_LOGITS_ALL;
        seqs[1].sp = (wire_sampling){.temperature = 0.8f, .top_p = 1, .repetition_penalty = 1,
                                     .seed = 5, .logprobs = true, .top_logprobs = 3,
                                     .logits = WIRE_LOGITS_LAST};
        wire_step_plan plan = {.step_id = 1000 + (uint64_t)step, .n_seqs = 3, .seqs = seqs};
        wire_step_result res;
        rc = coord_step(c, &plan, &res, &err);
        CHECKF(rc == MLA_OK, "T=%d step %d: %s", T, step, err.msg);
        if (rc) break;
        CHECK(res.ok && res.step_id == plan.step_id && res.n_seqs == 3);
        for (int i = 0; i < 3; i++) {
            const wire_seq_result *sr = NULL;
            for (uint32_t j = 0; j < res.n_seqs; j++)
                if (res.seqs[j].seq_id == ref[i].id) sr = &res.seqs[j];
            REQUIRE(sr);
            for (uint32_t k = 0; k < nt[i]; k++) {
                ref[i].h = test_engine_advance(ref[i].h, toks[i][k], pos[i][k]);
                test_engine_expected(ref[i].h, pos[i][k], T, row);
                if (i == 0) {
                    if (sr->n_logit_rows != nt[0] || memcmp(sr->logits + (size_t)k * TEST_VOCAB, row, sizeof row))
                        bad_logits++;
                } else if (i == 1 && k + 1 == nt[i]) {
                    if (sr->n_logit_rows != 1 || memcmp(sr->logits, row, sizeof row)) bad_logits++;
                }
            }
            ref[i].pos += (int32_t)nt[i];
            if (i == 2 && sr->logits) bad_logits++;
            if (i != 1 && sr->token != argmax(row, TEST_VOCAB)) bad_tok++;
            if (sr->token < 0 || sr->token >= TEST_VOCAB) {
                bad_tok++;
                break;
            }
            if (i == 1) {
                double mx = -1e30, se = 0;
                for (int v = 0; v < TEST_VOCAB; v++) mx = mx > row[v] ? mx : row[v];
                for (int v = 0; v < TEST_VOCAB; v++) se += exp(row[v] - mx);
                double lp = row[sr->token] - mx - log(se);
                if (fabs(lp - sr->logprob) > 1e-4 || sr->n_top != 3 ||
                    sr->top[0].token != argmax(row, TEST_VOCAB))
                    bad_lp++;
            }
            next[i] = sr->token;
        }
        coord_result_free(&res);
    }
    CHECKF(bad_logits == 0, "T=%d: %d logits rows differ from the reference", T, bad_logits);
    CHECKF(bad_tok == 0, "T=%d: %d greedy tokens differ", T, bad_tok);
    CHECKF(bad_lp == 0, "T=%d: %d logprob mismatches", T, bad_lp);

    /* seq 11 continued at its next position with logits: equal to the reference */
    int32_t t1 = 5, p1 = ref[0].pos;
    wire_seq s1 = {.seq_id = 11, .n_tokens = 1, .tokens = &t1, .positions = &p1, .sample = false};
    tt_table(&s1, 0);
    s1.sp.logits = WIRE_LOGITS_LAST;
    wire_step_plan plan = {.step_id = 2000, .n_seqs = 1, .seqs = &s1};
    wire_step_result res;
    REQUIRE(coord_step(c, &plan, &res, &err) == MLA_OK);
    test_engine_expected(test_engine_advance(ref[0].h, t1, p1), p1, T, row);
    CHECK(res.n_seqs == 1 && res.seqs[0].token == -1 && res.seqs[0].logits &&
          !memcmp(res.seqs[0].logits, row, sizeof row));
    coord_result_free(&res);

    /* an invalid plan is refused before it reaches the workers */
    t1 = TEST_VOCAB;
    CHECK(coord_step(c, &plan, &res, &err) == MLA_ERR && strstr(err.msg, "vocabulary"));
    CHECK(coord_healthy(c, NULL));
    { /* and so is a step past what the workers were sized for (the defaults: 512 tokens, 32 sequences) */
        int32_t big_t[513], big_p[513];
        for (int k = 0; k < 513; k++) big_t[k] = 1, big_p[k] = k;
        wire_seq big = {.seq_id = 44, .n_tokens = 513, .tokens = big_t, .positions = big_p};
        wire_step_plan bp = {.step_id = 2100, .n_seqs = 1, .seqs = &big};
        CHECKF(coord_step(c, &bp, &res, &err) == MLA_ERR &&
                   strstr(err.msg, "a step of 1 sequences and 513 tokens; the workers were sized for 32 sequences and 512 tokens"),
               "T=%d: oversized step: %s", T, err.msg);
        wire_seq many[33];
        for (int i = 0; i < 33; i++) many[i] = (wire_seq){.seq_id = 100 + (uint64_t)i, .n_tokens = 1, .tokens = big_t, .positions = big_p};
        bp = (wire_step_plan){.step_id = 2101, .n_seqs = 33, .seqs = many};
        CHECKF(coord_step(c, &bp, &res, &err) == MLA_ERR && strstr(err.msg, "a step of 33 sequences and 33 tokens"),
               "T=%d: too many sequences: %s", T, err.msg);
        CHECK(coord_healthy(c, NULL));
    }

    /* free seq 11 on every rank: the engines forget its table, not the rows in its blocks. A plan
     * that gives the same table again and starts at the next position reads those rows (what the
     * prefix cache relies on): the logits of the sequence continued as if it had not been freed */
    uint64_t id = 11;
    CHECK(coord_free_seqs(c, &id, 1, &err) == MLA_OK);
    t1 = 5;
    p1 = ref[0].pos + 1;
    plan.step_id = 2001;
    rc = coord_step(c, &plan, &res, &err);
    CHECKF(rc == MLA_OK, "T=%d: after free: %s", T, err.msg);
    if (rc == MLA_OK) {
        test_engine_expected(test_engine_advance(test_engine_advance(ref[0].h, 5, ref[0].pos), t1, p1), p1, T, row);
        CHECK(res.n_seqs == 1 && res.seqs[0].logits && !memcmp(res.seqs[0].logits, row, sizeof row));
        coord_result_free(&res);
    }
    /* without a table covering it the step is refused, naming the table */
    s1.n_blocks = 0;
    p1 = ref[0].pos + 2;
    plan.step_id = 2002;
    CHECKF(coord_step(c, &plan, &res, &err) == MLA_ERR && strstr(err.msg, "block table covers 0 positions"),
           "T=%d: no table: %s", T, err.msg);

    coord_stop(c);
    for (int r = 0; r < T; r++) CHECKF(reaped(pids[r]), "T=%d: worker %d not reaped", T, r);
}

/* ---- ahead: the workers' step ahead (worker/wk_ahead.h) -------------------------------------- */

/* One row of a scripted step: seq (0..2), prompt tokens (0: a one-token decode), forced token
 * (-1: the sequence's last token), logits LAST instead of a greedy row on the device. */
typedef struct arow {
    int seq, prompt, forced, logits;
} arow;

/* The reference of a plan's row (test_engine.h): hist[p] := the state after the row's token at
 * position p, for each of its tokens; row := the expected logits after its last; returns that
 * last position. */
static int32_t ref_row(uint64_t hist[64], const wire_seq *s, int T, float *row) {
    for (uint32_t k = 0; k < s->n_tokens; k++) {
        const int32_t p = s->positions[k];
        REQUIRE(p < 64);
        hist[p] = test_engine_advance(p ? hist[p - 1] : 0, s->tokens[k], p);
    }
    const int32_t p = s->positions[s->n_tokens - 1];
    test_engine_expected(hist[p], p, T, row);
    return p;
}

/* The test engine's counts of rank r (MLA_TEST_ENGINE_STATS=stats): tokens advanced, steps
 * queued from the plan's tokens and from the device's; the file is removed. */
static void engine_stats(const char *stats, int r, unsigned long long *got, unsigned long long *qh,
                         unsigned long long *qd) {
    char path[200];
    snprintf(path, sizeof path, "%s.%d", stats, r);
    FILE *f = fopen(path, "r");
    *got = 0;
    *qh = *qd = 9;
    CHECKF(f && fscanf(f, "%llu %llu %llu", got, qh, qd) == 3, "no engine count from rank %d (%s)", r, path);
    if (f) fclose(f);
    unlink(path);
}

/* Nine steps of three greedy sequences through T workers, with the step ahead on or off: plans
 * that continue it, drop a sequence, take one back at the position run ahead, add a prompt,
 * force another token and ask for logits right after a step ahead, follow a free. Every token
 * (and logits row) equals the reference; the engine advanced exactly the tokens the rule of
 * wk_ahead.h implies (26 without, 31 with: 12 rows run ahead, 7 of them taken by a plan). last 2:
 * the last plan's rows end their requests (wire_seq.last): no step ahead follows it (29; queued,
 * the one step queued from the device's tokens at step 3 only), the tokens the same; last 1: one
 * of its two rows does, and the step ahead runs for both as without it. */
static void test_ahead(int T, const char *mode, int last_end) {
    const int on = strcmp(mode, "0") != 0, queued = !strcmp(mode, "1");
    static const arow script[9][3] = {
        {{0, 4, -1, 0}, {1, 2, -1, 0}, {-1, 0, 0, 0}},
        {{0, 0, -1, 0}, {1, 0, -1, 0}, {-1, 0, 0, 0}},
        {{0, 0, -1, 0}, {1, 0, -1, 0}, {-1, 0, 0, 0}},
        {{0, 0, -1, 0}, {-1, 0, 0, 0}, {-1, 0, 0, 0}},
        {{0, 0, -1, 0}, {1, 0, -1, 0}, {2, 3, -1, 0}},
        {{0, 0, -1, 0}, {1, 0, -1, 0}, {2, 0, -1, 0}},
        {{0, 0, 1, 0}, {1, 0, -1, 1}, {2, 0, -1, 0}},
        {{1, 0, -1, 0}, {2, 0, -1, 0}, {-1, 0, 0, 0}}, /* after seq 0 is freed */
        {{1, 0, -1, 0}, {2, 0, -1, 0}, {-1, 0, 0, 0}},
    };
    char stats[128];
    snprintf(stats, sizeof stats, "/tmp/mla-test-ahead-%d", (int)getpid());
    setenv("MLA_TEST_ENGINE_STATS", stats, 1);
    coord *c;
    mla_err err;
    coord_config cfg = base_cfg(T);
    /* --step-ahead, handed to the workers at registration */
    cfg.step_ahead = !on ? WIRE_AHEAD_OFF : queued ? WIRE_AHEAD_QUEUE : WIRE_AHEAD_SYNC;
    int rc = coord_start(&c, &cfg, &err);
    unsetenv("MLA_TEST_ENGINE_STATS");
    REQUIRE(rc == MLA_OK || (fprintf(stderr, "coord_start: %s\n", err.msg), 0));
    uint64_t hist[3][64];     /* reference state after each position */
    int32_t pos[3] = {0, 0, 0}, last[3] = {0, 0, 0};
    int bad = 0;
    float row[TEST_VOCAB];
    for (int st = 0; st < 9 && rc == MLA_OK; st++) {
        if (st == 7) {
            uint64_t id = 100;
            CHECK(coord_free_seqs(c, &id, 1, &err) == MLA_OK);
        }
        wire_seq seqs[3];
        int32_t toks[3][8], ps[3][8];
        uint32_t n = 0;
        for (int r = 0; r < 3 && script[st][r].seq >= 0; r++, n++) {
            const arow *a = &script[st][r];
            const int q = a->seq;
            const uint32_t nt = a->prompt ? (uint32_t)a->prompt : 1;
            for (uint32_t k = 0; k < nt; k++) {
                toks[n][k] = a->prompt ? (int32_t)((11 * q + 5 * k + 2) % TEST_VOCAB)
                                       : a->forced >= 0 ? (last[q] + a->forced) % TEST_VOCAB : last[q];
                ps[n][k] = pos[q] + (int32_t)k;
            }
            seqs[n] = (wire_seq){.seq_id = 100 + (uint64_t)q, .n_tokens = nt, .tokens = toks[n], .positions = ps[n],
                                 .sample = true};
            tt_table(&seqs[n], (uint32_t)q);
            seqs[n].sp.top_p = 1;
            seqs[n].sp.repetition_penalty = 1;
            if (a->logits) seqs[n].sp.logits = WIRE_LOGITS_LAST;
            seqs[n].last = st == 8 && (last_end == 2 || (last_end == 1 && q == 2));
        }
        wire_step_plan plan = {.step_id = 3000 + (uint64_t)st, .n_seqs = n, .seqs = seqs};
        wire_step_result res;
        rc = coord_step(c, &plan, &res, &err);
        CHECKF(rc == MLA_OK, "T=%d ahead=%s step %d: %s", T, mode, st, err.msg);
        if (rc) break;
        CHECK(res.ok && res.n_seqs == n);
        for (uint32_t i = 0; i < n && i < res.n_seqs; i++) {
            const int q = (int)(seqs[i].seq_id - 100);
            const int32_t p = ref_row(hist[q], &seqs[i], T, row);
            if (res.seqs[i].seq_id != seqs[i].seq_id || res.seqs[i].token != argmax(row, TEST_VOCAB)) bad++;
            if (seqs[i].sp.logits == WIRE_LOGITS_LAST &&
                (!res.seqs[i].logits || memcmp(res.seqs[i].logits, row, sizeof row)))
                bad++;
            last[q] = res.seqs[i].token;
            pos[q] = p + 1;
        }
        coord_result_free(&res);
    }
    CHECKF(bad == 0, "T=%d ahead=%s last=%d: %d tokens or logits rows differ from the reference", T, mode, last_end,
           bad);
    coord_stop(c);
    const unsigned want = !on ? 26u : last_end == 2 ? 29u : 31u, want_qd = !queued ? 0u : last_end == 2 ? 1u : 2u;
    for (int r = 0; r < T; r++) {
        unsigned long long got, qh, qd;
        engine_stats(stats, r, &got, &qh, &qd);
        CHECKF(got == want, "T=%d ahead=%s last=%d rank %d: the engine advanced %llu tokens (expected %u)", T, mode,
               last_end, r, got, want);
        /* queued: after steps 2, 4, 6 and 8 from the plan's tokens; in steps 3 and 9, which asked
         * for exactly the step ahead, the next one from the tokens on the device */
        CHECKF(qh == (queued ? 4u : 0u) && qd == want_qd,
               "T=%d ahead=%s last=%d rank %d: %llu queued from the plan, %llu from the device", T, mode, last_end, r,
               qh, qd);
    }
}

/* Host-sampled rows in the step ahead: seq 1 samples at temperature 1 (seeded) beside the greedy
 * seq 0, through T workers (T = 2: rank 0's tokens broadcast before each step ahead), with the
 * step ahead off, run after the step, or queued (a step ahead with a host row is run, not
 * queued). Nine steps: two prompts, five decodes of both, seq 0 alone (a greedy step ahead,
 * queued where it can be), both again (seq 1 no longer at the step ahead's position: it runs),
 * both. Every token equals the reference (the argmax of the expected row, or the sampler's draw
 * from it with the seed at that position); the engine advanced 21 tokens without the step ahead,
 * 24 with it (every decode step's rows run ahead, and taken by the next plan but seq 1 at step 7;
 * one step ahead queued, in queue mode). With host false the test engine samples seq 1 on its
 * "device" (engine_ops.dev_sample) and it is a row like the greedy one: queued from the device
 * where the plan follows the step ahead (five times, and three times from the plan); with host
 * (MLA_WORKER_HOST_SAMPLE) rank 0 samples it. The tokens are the same either way. */
static void test_ahead_host(int T, const char *mode, bool host) {
    const int on = strcmp(mode, "0") != 0, queued = !strcmp(mode, "1");
    static const int script[9][2] = {{4, 2}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, -1}, {0, 0}, {0, 0}};
    char stats[128];
    snprintf(stats, sizeof stats, "/tmp/mla-test-ahead-host-%d", (int)getpid());
    setenv("MLA_TEST_ENGINE_STATS", stats, 1);
    if (host) setenv("MLA_WORKER_HOST_SAMPLE", "1", 1);
    coord *c;
    mla_err err;
    coord_config cfg = base_cfg(T);
    cfg.step_ahead = !on ? WIRE_AHEAD_OFF : queued ? WIRE_AHEAD_QUEUE : WIRE_AHEAD_SYNC;
    int rc = coord_start(&c, &cfg, &err);
    unsetenv("MLA_TEST_ENGINE_STATS");
    unsetenv("MLA_WORKER_HOST_SAMPLE");
    REQUIRE(rc == MLA_OK || (fprintf(stderr, "coord_start: %s\n", err.msg), 0));
    sampler *ref = sampler_new(TEST_VOCAB);
    uint64_t hist[2][64];
    int32_t pos[2] = {0, 0}, last[2] = {0, 0};
    int bad = 0, drawn = 0;
    float row[TEST_VOCAB];
    for (int st = 0; st < 9 && rc == MLA_OK; st++) {
        wire_seq seqs[2];
        int32_t toks[2][8], ps[2][8];
        uint32_t n = 0;
        for (int q = 0; q < 2; q++) {
            if (script[st][q] < 0) continue;
            const uint32_t nt = script[st][q] ? (uint32_t)script[st][q] : 1;
            for (uint32_t k = 0; k < nt; k++) {
                toks[n][k] = script[st][q] ? (int32_t)((11 * q + 5 * k + 2) % TEST_VOCAB) : last[q];
                ps[n][k] = pos[q] + (int32_t)k;
            }
            seqs[n] = (wire_seq){.seq_id = 200 + (uint64_t)q, .n_tokens = nt, .tokens = toks[n], .positions = ps[n],
                                 .sample = true};
            tt_table(&seqs[n], (uint32_t)q);
            seqs[n].sp.top_p = 1;
            seqs[n].sp.repetition_penalty = 1;
            if (q == 1) {
                seqs[n].sp.temperature = 1.0f;
                seqs[n].sp.seed = 77;
            }
            n++;
        }
        wire_step_plan plan = {.step_id = 4000 + (uint64_t)st, .n_seqs = n, .seqs = seqs};
        wire_step_result res;
        rc = coord_step(c, &plan, &res, &err);
        CHECKF(rc == MLA_OK, "T=%d ahead=%s host step %d: %s", T, mode, st, err.msg);
        if (rc) break;
        CHECK(res.ok && res.n_seqs == n);
        for (uint32_t i = 0; i < n && i < res.n_seqs; i++) {
            const int q = (int)(seqs[i].seq_id - 200);
            const int32_t p = ref_row(hist[q], &seqs[i], T, row);
            int32_t want = argmax(row, TEST_VOCAB);
            if (q == 1) {
                sample_out so;
                sampler_sample(ref, row, &seqs[i].sp, NULL, 0, (uint64_t)p + 1, &so);
                drawn += so.token != want; /* the draw is not just the argmax */
                want = so.token;
            }
            if (res.seqs[i].seq_id != seqs[i].seq_id || res.seqs[i].token != want) bad++;
            last[q] = res.seqs[i].token;
            pos[q] = p + 1;
        }
        coord_result_free(&res);
    }
    sampler_free(ref);
    CHECKF(bad == 0, "T=%d ahead=%s host=%d: %d tokens differ from the reference with a sampled row", T, mode, host,
           bad);
    CHECKF(drawn > 0, "T=%d ahead=%s: the temperature-1 row only ever drew the argmax", T, mode);
    coord_stop(c);
    for (int r = 0; r < T; r++) {
        unsigned long long got, qh, qd;
        engine_stats(stats, r, &got, &qh, &qd);
        CHECKF(got == (on ? 24u : 21u), "T=%d ahead=%s rank %d: the engine advanced %llu tokens with a host row "
               "(expected %d)", T, mode, r, got, on ? 24 : 21);
        const unsigned want_qh = !queued ? 0 : host ? 1 : 3, want_qd = !queued || host ? 0 : 5;
        CHECKF(qh == want_qh && qd == want_qd,
               "T=%d ahead=%s host=%d rank %d: %llu queued from the plan, %llu from the device (expected %u, %u)", T,
               mode, host, r, qh, qd, want_qh, want_qd);
    }
}

/* A GGUF holding only a vocabulary of TEST_VOCAB tokens for the grammars (gpt2 byte-level text,
 * printable ASCII standing for itself; the last token <eos>, a control token and the model's
 * end of sequence): the test engine's model file where rows are constrained. */
static void write_vocab_gguf(const char *path) {
    static const char *alpha[] = {"[", "]", ",", "1", "2", "true", "null", "a", "b", "{", "}", "\"", ":", "12"};
    const int na = (int)(sizeof alpha / sizeof alpha[0]);
    char text[TEST_VOCAB][24];
    const char *toks[TEST_VOCAB];
    int32_t types[TEST_VOCAB];
    for (int t = 0; t < TEST_VOCAB; t++) {
        if (t == TEST_VOCAB - 1) snprintf(text[t], sizeof text[t], "<eos>");
        else if ((t / na) % 2) snprintf(text[t], sizeof text[t], "%s%s", alpha[t % na], alpha[(t * 7 + 3) % na]);
        else snprintf(text[t], sizeof text[t], "%s", alpha[t % na]);
        toks[t] = text[t];
        types[t] = t == TEST_VOCAB - 1 ? 3 : 1;
    }
    gguf_writer *w;
    mla_err err;
    REQUIRE(gguf_write_open(&w, path, &err) == MLA_OK);
    gguf_write_kv_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_write_kv_arr_str(w, "tokenizer.ggml.tokens", toks, TEST_VOCAB);
    gguf_write_kv_arr_i32(w, "tokenizer.ggml.token_type", types, TEST_VOCAB);
    gguf_write_kv_u32(w, "tokenizer.ggml.eos_token_id", TEST_VOCAB - 1);
    REQUIRE(gguf_write_begin_data(w, &err) == MLA_OK);
    REQUIRE(gguf_write_close(w, &err) == MLA_OK);
}

/* Constrained rows through the step ahead: beside a greedy row, a temperature-1 row under a JSON-like
 * grammar, a greedy row under another grammar, a temperature 0.7 / top_p 0.9 row, and a greedy row
 * with logit biases only, through T workers, with the step ahead off, run after the step, or
 * queued. Twelve steps: the prompts, decodes of all, one without the grammar's greedy row (it then
 * runs on its own beside the step ahead), and decodes again. Every token is the reference's: the
 * grammar's mask (a wk_constrain of our own over the same vocabulary and the plans' tokens) and
 * the biases on the expected row, then the host sampler with the seed at that position. With
 * host false the test engine takes every row on its "device": queued, the constrained rows'
 * masks follow the tokens of the step before (queue_mods); with host (MLA_WORKER_HOST_SAMPLE)
 * rank 0 samples them. */
static void test_ahead_grammar(int T, const char *mode, bool host) {
    const int queued = !strcmp(mode, "1"), on = strcmp(mode, "0") != 0;
    enum { NQ = 5, NSTEP = 12, PL = 3 };
    char model[160], stats[160];
    snprintf(model, sizeof model, "/tmp/mla-test-vocab-%d.gguf", (int)getpid());
    snprintf(stats, sizeof stats, "/tmp/mla-test-ahead-grammar-%d", (int)getpid());
    write_vocab_gguf(model);
    uint64_t hash;
    mla_err err;
    REQUIRE(test_engine_file_hash(model, &hash, &err) == MLA_OK);
    setenv("MLA_TEST_ENGINE_STATS", stats, 1);
    if (host) setenv("MLA_WORKER_HOST_SAMPLE", "1", 1);
    coord *c;
    coord_config cfg = base_cfg(T);
    cfg.model_path = model;
    cfg.model_hash = hash;
    cfg.step_ahead = !on ? WIRE_AHEAD_OFF : queued ? WIRE_AHEAD_QUEUE : WIRE_AHEAD_SYNC;
    int rc = coord_start(&c, &cfg, &err);
    unsetenv("MLA_TEST_ENGINE_STATS");
    unsetenv("MLA_WORKER_HOST_SAMPLE");
    REQUIRE(rc == MLA_OK || (fprintf(stderr, "coord_start: %s\n", err.msg), 0));
    static const char *const gram[NQ] = {
        NULL, "root ::= \"[\" ( item ( \",\" item )* )? \"]\"\nitem ::= \"1\" | \"2\" | \"true\" | \"null\"",
        "root ::= ( \"a\" | \"b\" | \"1\" )+", NULL, NULL};
    int32_t bias_ids[2] = {7, 8}, ban_ids[1] = {7}; /* 7, favoured by its bias, banned for min_tokens */
    float bias_vals[2] = {4.0f, -100.0f};
    int n7[2] = {0, 0}; /* row 4's 7s within its first 5 tokens, after them */
    wk_constrain *ref = wk_constrain_new(model, TEST_VOCAB);
    sampler *smp = sampler_new(TEST_VOCAB);
    uint64_t hist[NQ][64];
    int32_t pos[NQ] = {0}, last[NQ] = {0};
    int bad = 0, masked = 0;
    float row[TEST_VOCAB];
    for (int st = 0; st < NSTEP && rc == MLA_OK; st++) {
        wire_seq seqs[NQ];
        int32_t toks[NQ][PL], ps[NQ][PL];
        uint32_t n = 0;
        for (int q = 0; q < NQ; q++) {
            if (st == 6 && q == 2) continue;
            const uint32_t nt = st == 0 ? PL : 1;
            for (uint32_t k = 0; k < nt; k++) {
                toks[n][k] = st == 0 ? (int32_t)((5 * q + 3 * k + 1) % (TEST_VOCAB - 1)) : last[q];
                ps[n][k] = pos[q] + (int32_t)k;
            }
            wire_seq *s = &seqs[n];
            *s = (wire_seq){.seq_id = 300 + (uint64_t)q, .n_tokens = nt, .tokens = toks[n], .positions = ps[n],
                            .sample = true};
            tt_table(s, (uint32_t)q);
            s->sp.top_p = 1;
            s->sp.repetition_penalty = 1;
            if (q == 1) {
                s->sp.temperature = 1.0f;
                s->sp.seed = 77;
            } else if (q == 3) {
                s->sp.temperature = 0.7f;
                s->sp.top_p = 0.9f;
                s->sp.seed = 5;
            }
            s->sp.constrained = q == 1 || q == 2 || q == 4;
            if (st == 0 && s->sp.constrained) {
                s->sp.constraint_setup = true;
                s->sp.grammar = (char *)gram[q];
                s->sp.grammar_start = PL;
                if (q == 4) {
                    s->sp.n_bias = 2;
                    s->sp.bias_ids = bias_ids;
                    s->sp.bias_vals = bias_vals;
                    s->sp.min_tokens = 5;
                    s->sp.n_ban = 1;
                    s->sp.ban_ids = ban_ids;
                }
            }
            n++;
        }
        wire_step_plan plan = {.step_id = 5000 + (uint64_t)st, .n_seqs = n, .seqs = seqs};
        wire_step_result res;
        rc = coord_step(c, &plan, &res, &err);
        CHECKF(rc == MLA_OK, "T=%d ahead=%s host=%d grammar step %d: %s", T, mode, host, st, err.msg);
        if (rc) break;
        CHECKF(res.ok && res.n_seqs == n, "T=%d ahead=%s host=%d step %d: %s", T, mode, host, st, res.error);
        for (uint32_t i = 0; i < n && i < res.n_seqs; i++) {
            const int q = (int)(seqs[i].seq_id - 300);
            const int32_t p = ref_row(hist[q], &seqs[i], T, row);
            sample_mod mod = {0};
            if (seqs[i].sp.constrained) {
                mla_err e2;
                CHECKF(wk_constrain_row(ref, &seqs[i], &mod, &e2) == MLA_OK, "reference grammar: %s", e2.msg);
            }
            sample_out so;
            sampler_sample_mod(smp, row, &seqs[i].sp, &mod, NULL, 0, 0, (uint64_t)p + 1, &so);
            if (mod.allow) {
                int ok = 0;
                for (int v = 0; v < TEST_VOCAB; v++) ok += mod.allow[v];
                masked += ok < TEST_VOCAB / 2;
            }
            if (res.seqs[i].seq_id != seqs[i].seq_id || res.seqs[i].token != so.token) {
                if (bad++ < 5)
                    fprintf(stderr, "T=%d ahead=%s host=%d step %d seq %d: token %d, reference %d\n", T, mode, host,
                            st, q, res.seqs[i].token, so.token);
            }
            last[q] = res.seqs[i].token;
            pos[q] = p + 1;
            if (q == 4 && last[q] == 7) n7[p + 1 >= PL + 5]++;
        }
        coord_result_free(&res);
    }
    CHECKF(bad == 0, "T=%d ahead=%s host=%d: %d tokens differ from the reference with constrained rows", T, mode,
           host, bad);
    CHECKF(masked >= 10, "T=%d ahead=%s: the grammars masked most of the vocabulary only %d times", T, mode, masked);
    CHECKF(n7[0] == 0 && n7[1] > 0, "T=%d ahead=%s host=%d: row 4 took its banned 7 %d times within min_tokens, %d after",
           T, mode, host, n7[0], n7[1]);
    coord_stop(c);
    for (int r = 0; r < T; r++) {
        unsigned long long got, qh, qd;
        engine_stats(stats, r, &got, &qh, &qd);
        /* queued with device rows: from the device at every decode that follows the step ahead */
        CHECKF(queued && !host ? qd >= 6 : qd == 0, "T=%d ahead=%s host=%d rank %d: %llu queued from the device", T,
               mode, host, r, qd);
    }
    wk_constrain_free(ref);
    sampler_free(smp);
    unlink(model);
}

/* ---- refusals ---------------------------------------------------------------------------- */

static pid_t spawn_ext(const char *endpoint, int rank, int world, const char *errfile) {
    char rs[16], ws[16];
    snprintf(rs, sizeof rs, "%d", rank);
    snprintf(ws, sizeof ws, "%d", world);
    char *argv[] = {(char *)g_exe, "--coord", (char *)endpoint, "--rank", rs, "--world", ws, "-m",
                    g_model, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (errfile) posix_spawn_file_actions_addopen(&fa, 2, errfile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    int rc = posix_spawn(&pid, g_exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    REQUIRE(rc == 0);
    return pid;
}

static int file_has(const char *path, const char *needle) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

typedef struct start_arg {
    coord_config cfg;
    coord *c;
    int rc;
    mla_err err;
} start_arg;

static void *start_thread(void *p) {
    start_arg *a = p;
    a->rc = coord_start(&a->c, &a->cfg, &a->err);
    return NULL;
}

static void test_refusals(void) {
    mla_err err;
    coord *c = NULL;
    /* wrong protocol version (local worker) */
    coord_config cfg = base_cfg(2);
    const char *args[] = {"--protocol-version", "99", NULL};
    cfg.worker_args = args;
    CHECK(coord_start(&c, &cfg, &err) == MLA_ERR);
    CHECKF(strstr(err.msg, "refused") && strstr(err.msg, "protocol version 99"), "msg: %s", err.msg);
    /* wrong model hash */
    cfg = base_cfg(2);
    cfg.model_hash = g_hash ^ 1;
    CHECK(coord_start(&c, &cfg, &err) == MLA_ERR);
    CHECKF(strstr(err.msg, "refused") && strstr(err.msg, "model hash"), "msg: %s", err.msg);

    /* external workers: world mismatch and duplicate rank, then a good group */
    char ep[128], ef[3][128];
    snprintf(ep, sizeof ep, "ipc:///tmp/mla-test-coord-%d.sock", (int)getpid());
    for (int i = 0; i < 3; i++) snprintf(ef[i], sizeof ef[i], "/tmp/mla-test-coord-%d-%d.err", (int)getpid(), i);
    start_arg a;
    memset(&a, 0, sizeof a);
    a.cfg = base_cfg(2);
    a.cfg.external = 1;
    a.cfg.worker_exe = NULL; /* it starts none */
    a.cfg.endpoint = ep;
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, start_thread, &a) == 0);
    pid_t bad = spawn_ext(ep, 0, 3, ef[0]);
    int ws = wait_bounded(bad, 20);
    CHECKF(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 3, "world-mismatch worker status %d", ws);
    CHECKF(file_has(ef[0], "refused") && file_has(ef[0], "world size 3"), "worker stderr lacks the reason");
    pid_t w0 = spawn_ext(ep, 0, 2, NULL);
    usleep(300000); /* let rank 0 register first (if not, either one is refused: both fine) */
    pid_t dup = spawn_ext(ep, 0, 2, ef[1]);
    ws = wait_bounded(dup, 20);
    CHECKF(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 3, "duplicate worker status %d", ws);
    CHECKF(file_has(ef[1], "already registered"), "duplicate's stderr lacks the reason");
    pid_t w1 = spawn_ext(ep, 1, 2, NULL);
    pthread_join(th, NULL);
    CHECKF(a.rc == MLA_OK, "external group: %s", a.err.msg);
    if (a.rc == MLA_OK) {
        int32_t t = 3, p = 0;
        wire_seq s = {.seq_id = 1, .n_tokens = 1, .tokens = &t, .positions = &p, .sample = true};
        tt_table(&s, 0);
        s.sp.top_p = 1;
        s.sp.repetition_penalty = 1;
        wire_step_plan plan = {.step_id = 1, .n_seqs = 1, .seqs = &s};
        wire_step_result res;
        CHECK(coord_step(a.c, &plan, &res, &err) == MLA_OK);
        float row[TEST_VOCAB];
        test_engine_expected(test_engine_advance(0, 3, 0), 0, 2, row);
        CHECK(res.n_seqs == 1 && res.seqs[0].token == argmax(row, TEST_VOCAB));
        coord_result_free(&res);
        coord_stop(a.c);
    }
    /* the external workers got SHUTDOWN and exit cleanly */
    ws = wait_bounded(w0, 20);
    CHECKF(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "external worker 0 status %d", ws);
    ws = wait_bounded(w1, 20);
    CHECKF(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "external worker 1 status %d", ws);
    for (int i = 0; i < 3; i++) unlink(ef[i]);
}

/* ---- kill -9 mid-step --------------------------------------------------------------------- */

typedef struct step_arg {
    coord *c;
    int rc;
    mla_err err;
    double t_end;
} step_arg;

static void *step_thread(void *p) {
    step_arg *a = p;
    int32_t t[2] = {1, 2}, pos[2] = {0, 1};
    wire_seq s = {.seq_id = 1, .n_tokens = 2, .tokens = t, .positions = pos, .sample = true};
    tt_table(&s, 0);
    s.sp.top_p = 1;
    s.sp.repetition_penalty = 1;
    wire_step_plan plan = {.step_id = 42, .n_seqs = 1, .seqs = &s};
    wire_step_result res;
    a->rc = coord_step(a->c, &plan, &res, &a->err);
    a->t_end = now_s();
    if (a->rc == MLA_OK) coord_result_free(&res);
    return NULL;
}

static void test_kill(int T, int victim) {
    setenv("MLA_TEST_ENGINE_DELAY_MS", "1500", 1);
    coord *c;
    mla_err err;
    coord_config cfg = base_cfg(T);
    int rc = coord_start(&c, &cfg, &err);
    unsetenv("MLA_TEST_ENGINE_DELAY_MS");
    REQUIRE(rc == MLA_OK || (fprintf(stderr, "coord_start: %s\n", err.msg), 0));
    pid_t pids[8];
    for (int r = 0; r < T; r++) pids[r] = coord_worker_pid(c, r);
    step_arg a = {.c = c};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, step_thread, &a) == 0);
    usleep(400000); /* inside the step (it sleeps 1.5 s before its all-reduce) */
    double t_kill = now_s();
    kill(pids[victim], SIGKILL);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 30;
    int joined = pthread_timedjoin_np(th, NULL, &dl) == 0;
    REQUIRE(joined); /* a hang here is the failure this test exists for */
    char needle[32];
    snprintf(needle, sizeof needle, "worker %d", victim);
    CHECK(a.rc == MLA_ERR);
    CHECKF(strstr(a.err.msg, needle) && strstr(a.err.msg, "signal 9"), "msg: %s", a.err.msg);
    printf("T=%d: kill -9 of worker %d noticed after %.0f ms: %s\n", T, victim, (a.t_end - t_kill) * 1e3, a.err.msg);
    /* later calls fail at once with the reason */
    step_arg b = {.c = c};
    step_thread(&b);
    CHECKF(b.rc == MLA_ERR && strstr(b.err.msg, needle), "msg: %s", b.err.msg);
    CHECK(!coord_healthy(c, &err));
    /* restart policy: a fresh group on the same coordinator serves steps again */
    rc = coord_restart(c, &err);
    CHECKF(rc == MLA_OK, "restart: %s", err.msg);
    pid_t pids2[8];
    for (int r = 0; r < T; r++) {
        pids2[r] = coord_worker_pid(c, r);
        CHECK(pids2[r] > 0 && pids2[r] != pids[r]);
        CHECKF(reaped(pids[r]), "T=%d: old worker %d not reaped after restart", T, r);
    }
    if (rc == MLA_OK) {
        step_arg d = {.c = c};
        step_thread(&d);
        CHECKF(d.rc == MLA_OK, "step after restart: %s", d.err.msg);
        CHECK(coord_healthy(c, NULL));
    }
    coord_stop(c);
    for (int r = 0; r < T; r++) CHECKF(reaped(pids2[r]), "T=%d: worker %d not reaped", T, r);
}

/* ---- the coordinator dies: workers leave by themselves ---------------------------------- */

static void check_no_shm_left_of(pid_t pid);
static void test_orphan(void) {
    char ep[128];
    snprintf(ep, sizeof ep, "ipc:///tmp/mla-test-orphan-%d.sock", (int)getpid());
    int pfd[2];
    REQUIRE(pipe(pfd) == 0);
    pid_t cp = fork();
    REQUIRE(cp >= 0);
    if (cp == 0) {
        close(pfd[0]);
        alarm(60);
        coord *c;
        mla_err err;
        coord_config cfg = base_cfg(2);
        cfg.external = 1;
        cfg.worker_exe = NULL;
        cfg.endpoint = ep;
        cfg.heartbeat_timeout_ms = 1000;
        char ok = coord_start(&c, &cfg, &err) == MLA_OK ? 'y' : 'n';
        if (write(pfd[1], &ok, 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    close(pfd[1]);
    pid_t w0 = spawn_ext(ep, 0, 2, NULL), w1 = spawn_ext(ep, 1, 2, NULL);
    char ok = 0;
    CHECK(read(pfd[0], &ok, 1) == 1 && ok == 'y');
    close(pfd[0]);
    kill(cp, SIGKILL);
    waitpid(cp, NULL, 0);
    check_no_shm_left_of(cp); /* unlinked once every rank had attached */
    int s0 = wait_bounded(w0, 30), s1 = wait_bounded(w1, 30);
    CHECKF(s0 >= 0 && WIFEXITED(s0) && WEXITSTATUS(s0) == 1, "orphaned worker 0 status %d", s0);
    CHECKF(s1 >= 0 && WIFEXITED(s1) && WEXITSTATUS(s1) == 1, "orphaned worker 1 status %d", s1);
    char path[128];
    snprintf(path, sizeof path, "/tmp/mla-test-orphan-%d.sock", (int)getpid());
    unlink(path);
}

static void test_load_failure(void) {
    setenv("MLA_TEST_ENGINE_FAIL_LOAD", "1", 1);
    coord *c;
    mla_err err;
    coord_config cfg = base_cfg(2);
    CHECK(coord_start(&c, &cfg, &err) == MLA_ERR);
    CHECKF(strstr(err.msg, "worker 1") && strstr(err.msg, "load failure requested"), "msg: %s", err.msg);
    unsetenv("MLA_TEST_ENGINE_FAIL_LOAD");
}

/* ---- NCCL id relay: rank 0 -> coordinator -> other ranks ----------------------------------- */

/* one step through the group: the logits of every rank arrived (the all-reduce ran) */
static void step_check(coord *c, int T) {
    int32_t t = 4, p = 0;
    wire_seq s = {.seq_id = 9, .n_tokens = 1, .tokens = &t, .positions = &p, .sample = false};
    tt_table(&s, 0);
    s.sp.logits = WIRE_LOGITS_LAST;
    wire_step_plan plan = {.step_id = 1, .n_seqs = 1, .seqs = &s};
    wire_step_result res;
    mla_err err;
    int rc = coord_step(c, &plan, &res, &err);
    CHECKF(rc == MLA_OK, "T=%d step: %s", T, err.msg);
    if (rc) return;
    float row[TEST_VOCAB];
    test_engine_expected(test_engine_advance(0, t, p), p, T, row);
    CHECK(res.n_seqs == 1 && res.seqs[0].logits && !memcmp(res.seqs[0].logits, row, sizeof row));
    coord_result_free(&res);
}

static void test_nccl_id(void) {
    mla_err err;
    coord *c;
    /* every rank > 0 fails its load unless it receives exactly the 128 bytes rank 0 published */
    setenv("MLA_TEST_ENGINE_ID_SEED", "0x1234abcd", 1);
    for (int T = 2; T <= 4; T += 2) {
        coord_config cfg = base_cfg(T);
        int rc = coord_start(&c, &cfg, &err);
        CHECKF(rc == MLA_OK, "T=%d with the id relay: %s", T, err.msg);
        if (rc == MLA_OK) {
            step_check(c, T);
            coord_stop(c);
        }
    }
    /* external workers, rank 1 registering well after rank 0 published: the id follows its
     * RegisterReply */
    char ep[128];
    snprintf(ep, sizeof ep, "ipc:///tmp/mla-test-ncclid-%d.sock", (int)getpid());
    start_arg a;
    memset(&a, 0, sizeof a);
    a.cfg = base_cfg(2);
    a.cfg.external = 1;
    a.cfg.worker_exe = NULL; /* it starts none */
    a.cfg.endpoint = ep;
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, start_thread, &a) == 0);
    pid_t w0 = spawn_ext(ep, 0, 2, NULL);
    usleep(500000); /* most likely published by now; either order must work */
    pid_t w1 = spawn_ext(ep, 1, 2, NULL);
    pthread_join(th, NULL);
    CHECKF(a.rc == MLA_OK, "external group with the id relay: %s", a.err.msg);
    if (a.rc == MLA_OK) {
        step_check(a.c, 2);
        coord_stop(a.c);
    }
    int ws = wait_bounded(w0, 20);
    CHECKF(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "external worker 0 status %d", ws);
    ws = wait_bounded(w1, 20);
    CHECKF(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "external worker 1 status %d", ws);

    /* what rank 1 receives is what rank 0 sent: a byte changed on rank 0 is seen on rank 1 */
    setenv("MLA_TEST_ENGINE_ID_CORRUPT", "77", 1);
    coord_config cfg = base_cfg(2);
    CHECK(coord_start(&c, &cfg, &err) == MLA_ERR);
    CHECKF(strstr(err.msg, "worker 1") && strstr(err.msg, "differs at byte 77"), "msg: %s", err.msg);
    unsetenv("MLA_TEST_ENGINE_ID_CORRUPT");
    /* rank 0 publishes nothing: rank 1 gives up after the timeout, with the reason */
    setenv("MLA_TEST_ENGINE_ID_NOPUB", "1", 1);
    /* --nccl-id-timeout-ms reaches the workers at registration: rank 1 gives up after 1 s, not
     * the default 120 s */
    cfg.nccl_id_timeout_ms = 1000;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(coord_start(&c, &cfg, &err) == MLA_ERR);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    CHECKF(strstr(err.msg, "worker 1") && strstr(err.msg, "no NCCL id from rank 0"), "msg: %s", err.msg);
    CHECKF(strstr(err.msg, "1000 ms"), "the worker's wait names the timeout it used: %s", err.msg);
    CHECKF(waited >= 0.9 && waited < 60, "the start failed after %.1f s (the worker waits 1 s)", waited);
    cfg.nccl_id_timeout_ms = 0;
    unsetenv("MLA_TEST_ENGINE_ID_NOPUB");
    unsetenv("MLA_TEST_ENGINE_ID_SEED");
}

static void check_no_shm_left_of(pid_t pid) {
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "mla-coll-%d-", (int)pid);
    int left = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix))) left++;
    closedir(d);
    CHECKF(left == 0, "%d shared-memory segments of pid %d left behind", left, (int)pid);
}

static void check_no_shm_left(void) { check_no_shm_left_of(getpid()); }

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s TEST_WORKER_EXE [group|refuse|kill|orphan|load|ncclid|ahead|all]\n", argv[0]);
        return 2;
    }
    alarm(300);
    g_exe = argv[1];
    const char *which = argc > 2 ? argv[2] : "all";
    snprintf(g_model, sizeof g_model, "/tmp/mla-test-model-%d.bin", (int)getpid());
    snprintf(g_model2, sizeof g_model2, "/tmp/mla-test-model2-%d.bin", (int)getpid());
    write_file(g_model, "test model A\n");
    write_file(g_model2, "test model B\n");
    mla_err err;
    REQUIRE(test_engine_file_hash(g_model, &g_hash, &err) == MLA_OK);
    int all = !strcmp(which, "all");
    if (all || !strcmp(which, "orphan")) test_orphan(); /* first: it forks */
    if (all || !strcmp(which, "group")) {
        test_group(1);
        test_group(2);
        test_group(4);
    }
    if (all || !strcmp(which, "ahead")) {
        static const char *const modes[] = {"0", "sync", "1"};
        for (int k = 0; k < 3; k++) {
            for (int last = 0; last < 3; last++) {
                test_ahead(1, modes[k], last);
                test_ahead(2, modes[k], last);
            }
            for (int host = 0; host < 2; host++) {
                test_ahead_host(1, modes[k], host);
                test_ahead_host(2, modes[k], host);
            }
        }
    }
    if (all || !strcmp(which, "grammar")) {
        static const char *const modes[] = {"0", "sync", "1"};
        for (int k = 0; k < 3; k++)
            for (int host = 0; host < 2; host++) {
                test_ahead_grammar(1, modes[k], host);
                test_ahead_grammar(2, modes[k], host);
            }
    }
    if (all || !strcmp(which, "refuse")) test_refusals();
    if (all || !strcmp(which, "kill")) {
        test_kill(2, 1);
        test_kill(4, 2);
    }
    if (all || !strcmp(which, "load")) test_load_failure();
    if (all || !strcmp(which, "ncclid")) test_nccl_id();
    check_no_shm_left();
    unlink(g_model);
    unlink(g_model2);
    return mla_test_finish();
}
