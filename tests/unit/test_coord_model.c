/* The real model through the processes: logits at TP = 1, 2, 4 (coordinator + mlaserve-worker
 * processes over the host collective) equal the single-process forward pass (worker/model.h run
 * here, no collective) within relative L2 1e-5, for a prompt in one pass and then two decode
 * steps that use the workers' caches.
 * usage: test_coord_model MLASERVE_WORKER_EXE MODEL.gguf [TP...] */
#include <math.h>
#include <stdint.h>
#include <sys/wait.h>

#include "test_tables.h"
#include "coord.h"
#include "gguf.h"
#include "mla_test.h"
#include "model.h"

#define N_PROMPT 20
#define N_DECODE 2
#define N_TOK (N_PROMPT + N_DECODE)

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MLASERVE_WORKER_EXE MODEL.gguf [TP...]\n", argv[0]);
        return 2;
    }
    alarm(600);
    const char *exe = argv[1], *path = argv[2];
    mla_err err;
    gguf_ctx *g;
    REQUIRE(gguf_open(&g, path, &err) == MLA_OK);
    mla_model *m;
    mla_model_opts opts = {.n_threads = 1};
    REQUIRE(mla_model_load(&m, g, NULL, &opts, &err) == MLA_OK || (fprintf(stderr, "%s\n", err.msg), 0));
    const int64_t V = mla_model_config(m)->n_vocab;
    int32_t toks[N_TOK], pos[N_TOK];
    uint64_t st = 0x1234567;
    for (int i = 0; i < N_TOK; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((st >> 33) % (uint64_t)V);
        pos[i] = i;
    }
    /* reference: the whole sequence in one pass, logits of every position */
    float *ref = malloc((size_t)N_TOK * V * sizeof(float));
    mla_state *s = mla_state_new(m, 256);
    REQUIRE(mla_model_forward(m, s, toks, N_TOK, 0, MLA_LOGITS_ALL, ref, &err) == MLA_OK);
    mla_state_free(s);
    uint64_t hash = gguf_index_hash(g);
    mla_model_free(m);
    gguf_close(g);

    int tps[8] = {1, 2, 4}, ntp = 3;
    if (argc > 3) {
        ntp = 0;
        for (int i = 3; i < argc && ntp < 8; i++) tps[ntp++] = atoi(argv[i]);
    }
    for (int ti = 0; ti < ntp; ti++) {
        int T = tps[ti];
        coord_config cfg = {.world = T, .model_path = path, .model_hash = hash, .worker_exe = exe,
                            .n_threads = 1, .heartbeat_timeout_ms = 5000, .start_timeout_ms = 120000};
        coord *c;
        int rc = coord_start(&c, &cfg, &err);
        CHECKF(rc == MLA_OK, "TP=%d: %s", T, err.msg);
        if (rc) continue;
        CHECK(coord_n_vocab(c) == (uint32_t)V);
        double worst = 0;
        int off = 0;
        for (int step = 0; step <= N_DECODE; step++) {
            int n = step == 0 ? N_PROMPT : 1;
            wire_seq q = {.seq_id = 7, .n_tokens = (uint32_t)n, .tokens = toks + off,
                          .positions = pos + off, .sample = true};
            tt_table(&q, 0);
            q.sp.top_p = 1;
            q.sp.repetition_penalty = 1;
            q.sp.logits = WIRE_LOGITS_ALL;
            wire_step_plan plan = {.step_id = (uint64_t)step + 1, .n_seqs = 1, .seqs = &q};
            wire_step_result res;
            rc = coord_step(c, &plan, &res, &err);
            CHECKF(rc == MLA_OK, "TP=%d step %d: %s", T, step, err.msg);
            if (rc) break;
            REQUIRE(res.n_seqs == 1 && res.seqs[0].n_logit_rows == (uint32_t)n && res.seqs[0].logits);
            double e = rel_l2(res.seqs[0].logits, ref + (size_t)off * V, (size_t)n * V);
            if (e > worst) worst = e;
            /* greedy sample = argmax of the reference's last row */
            const float *last = ref + (size_t)(off + n - 1) * V;
            int64_t am = 0;
            for (int64_t v = 1; v < V; v++)
                if (last[v] > last[am]) am = v;
            CHECKF(res.seqs[0].token == (int32_t)am, "TP=%d step %d: sampled %d, argmax %lld", T, step,
                   res.seqs[0].token, (long long)am);
            coord_result_free(&res);
            off += n;
        }
        printf("%s TP=%d: relative L2 of logits vs single process: %.3g\n", path, T, worst);
        CHECKF(worst < 1e-5, "TP=%d: relative L2 %.3g", T, worst);
        coord_stop(c);
    }
    free(ref);
    return mla_test_finish();
}
