/* wk_ahead: which plans are followed by a step ahead, and which rows of the next plan take its
 * tokens (the rest form the residual plan, in order). The processes around it: test_coord ahead. */
#include <stdlib.h>

#include "mla_test.h"
#include "wk_ahead.h"

static int32_t g_tok[32], g_pos[32];

static wire_seq row(int i, uint64_t id, int32_t tok, int32_t pos) {
    g_tok[i] = tok;
    g_pos[i] = pos;
    wire_seq s = {.seq_id = id, .n_tokens = 1, .tokens = &g_tok[i], .positions = &g_pos[i], .sample = true};
    s.sp.top_p = 1;
    s.sp.repetition_penalty = 1;
    return s;
}

int main(void) {
    wk_ahead a;
    wk_ahead_init(&a, false);
    wire_seq s[4] = {row(0, 7, 3, 10), row(1, 8, 4, 20), row(2, 9, 5, 30)};
    wire_step_plan p = {.step_id = 1, .n_seqs = 3, .seqs = s};
    int32_t took[3] = {40, 41, 42}, out[3] = {50, 51, 52}, hit[4];
    uint32_t idx[4];
    float *lhit[4];
    wire_step_plan rest;

    /* refused: a row with no device token, a prompt row, a sampled row, an empty plan */
    int32_t none[3] = {40, -1, 42};
    CHECK(!wk_ahead_build(&a, &p, none, false) && a.plan.n_seqs == 0);
    s[1].n_tokens = 2;
    CHECK(!wk_ahead_build(&a, &p, took, false));
    s[1].n_tokens = 1;
    s[2].sp.temperature = 0.7f;
    CHECK(!wk_ahead_build(&a, &p, took, false));
    s[2].sp.temperature = 0;
    s[2].sp.logits = WIRE_LOGITS_LAST;
    CHECK(!wk_ahead_build(&a, &p, took, false));
    s[2].sp.logits = WIRE_LOGITS_NONE;
    wire_step_plan empty = {.step_id = 1, .n_seqs = 0, .seqs = s};
    CHECK(!wk_ahead_build(&a, &empty, took, false));
    /* every row's token ends its request (last): none; one of them: the others' step is built */
    for (int i = 0; i < 3; i++) s[i].last = true;
    CHECK(!wk_ahead_build(&a, &p, took, false) && !wk_ahead_build(&a, &p, NULL, false) && a.plan.n_seqs == 0);
    s[1].sp.temperature = 0.7f; /* a host row: no tokens broadcast for a step that will not run */
    CHECK(!wk_ahead_wants_host(&p, false));
    s[0].last = s[2].last = false;
    CHECK(wk_ahead_wants_host(&p, false));
    s[1].sp.temperature = 0;
    CHECK(wk_ahead_build(&a, &p, took, false) && a.plan.n_seqs == 3);
    s[1].last = false;

    /* built: the same sequences, the tokens taken, one position further */
    REQUIRE(wk_ahead_build(&a, &p, took, false));
    CHECK(a.plan.n_seqs == 3);
    for (int i = 0; i < 3; i++)
        CHECK(a.plan.seqs[i].seq_id == s[i].seq_id && a.plan.seqs[i].n_tokens == 1 &&
              a.plan.seqs[i].tokens[0] == took[i] && a.plan.seqs[i].positions[0] == s[i].positions[0] + 1);
    wk_ahead_done(&a, out);
    CHECK(a.rows_run == 3);

    /* the next plan, reordered, one sequence gone (8), one with another token (9), one new (6) */
    wire_seq n[4] = {row(4, 9, 99, 31), row(5, 7, 40, 11), row(6, 6, 1, 0)};
    wire_step_plan q = {.step_id = 2, .n_seqs = 3, .seqs = n};
    CHECK(wk_ahead_match(&a, &q, hit, lhit, &rest, idx) == 1);
    CHECK(hit[0] == -1 && hit[1] == 50 && hit[2] == -1);
    CHECK(rest.n_seqs == 2 && rest.step_id == 2 && idx[0] == 0 && idx[1] == 2 && rest.seqs[0].seq_id == 9 &&
          rest.seqs[1].seq_id == 6);
    CHECK(a.plan.n_seqs == 0 && a.rows_used == 1);
    /* matched once: the step ahead is gone after a match */
    CHECK(wk_ahead_match(&a, &q, hit, lhit, &rest, idx) == 0 && rest.n_seqs == 3);

    /* a row asking for logits, or at another position, does not take the token */
    REQUIRE(wk_ahead_build(&a, &p, took, false));
    wk_ahead_done(&a, out);
    wire_seq m[4] = {row(8, 7, 40, 11), row(9, 8, 41, 22), row(10, 9, 42, 31)};
    m[0].sp.logits = WIRE_LOGITS_LAST;
    wire_step_plan r = {.step_id = 3, .n_seqs = 3, .seqs = m};
    CHECK(wk_ahead_match(&a, &r, hit, lhit, &rest, idx) == 1 && hit[2] == 52 && rest.n_seqs == 2);

    /* a sequence appearing twice takes the token once; a dropped sequence takes nothing */
    REQUIRE(wk_ahead_build(&a, &p, took, false));
    wk_ahead_done(&a, out);
    wk_ahead_drop(&a, 8);
    wire_seq d[4] = {row(11, 7, 40, 11), row(12, 7, 40, 11), row(13, 8, 41, 21), row(14, 9, 42, 31)};
    wire_step_plan t = {.step_id = 4, .n_seqs = 4, .seqs = d};
    CHECK(wk_ahead_match(&a, &t, hit, lhit, &rest, idx) == 2);
    CHECK(hit[0] == 50 && hit[1] == -1 && hit[2] == -1 && hit[3] == 52 && rest.n_seqs == 2);

    /* a step ahead that failed answers nothing */
    REQUIRE(wk_ahead_build(&a, &p, took, false));
    wk_ahead_done(&a, NULL);
    wire_seq f[3] = {row(0, 7, 40, 11), row(1, 8, 41, 21), row(2, 9, 42, 31)};
    wire_step_plan u = {.step_id = 5, .n_seqs = 3, .seqs = f};
    CHECK(wk_ahead_match(&a, &u, hit, lhit, &rest, idx) == 0 && rest.n_seqs == 3);
    CHECK(a.rows_run == 9 && a.rows_used == 4);

    /* built before its tokens are known (queued behind the step that takes them): a plan covers
     * it only row for row, in order, with those tokens */
    wire_seq s2[3] = {row(16, 7, 3, 10), row(17, 8, 4, 20), row(18, 9, 5, 30)};
    wire_step_plan p2 = {.step_id = 5, .n_seqs = 3, .seqs = s2};
    REQUIRE(wk_ahead_build(&a, &p2, NULL, false));
    CHECK(a.plan.seqs[0].tokens[0] == -1 && a.plan.seqs[0].positions[0] == 11);
    wk_ahead_set_tokens(&a, took);
    wire_seq c[3] = {row(19, 7, 40, 11), row(20, 8, 41, 21), row(21, 9, 42, 31)};
    wire_step_plan cp = {.step_id = 6, .n_seqs = 3, .seqs = c};
    CHECK(wk_ahead_covers(&a, &cp));
    wire_seq c2[3] = {c[1], c[0], c[2]};
    wire_step_plan cp2 = {.step_id = 6, .n_seqs = 3, .seqs = c2};
    CHECK(!wk_ahead_covers(&a, &cp2)); /* reordered */
    cp.n_seqs = 2;
    CHECK(!wk_ahead_covers(&a, &cp)); /* a row fewer */
    cp.n_seqs = 3;
    g_tok[21] = 43;
    CHECK(!wk_ahead_covers(&a, &cp)); /* another token */
    g_tok[21] = 42;
    c[1].sp.logprobs = true;
    CHECK(!wk_ahead_covers(&a, &cp)); /* not a greedy row */
    wk_ahead_clear(&a);
    CHECK(!wk_ahead_covers(&a, &cp));

    /* host rows (temperature, penalties, a grammar, logprobs): run ahead only with their tokens
     * given (host true, as rank 0 samples them), never from the device (NULL: queued behind) */
    wire_seq h[3] = {row(22, 7, 3, 10), row(23, 8, 4, 20), row(24, 9, 5, 30)};
    h[1].sp.temperature = 1.0f;
    h[1].sp.seed = 5;
    h[2].sp.constrained = true;
    wire_step_plan hp = {.step_id = 7, .n_seqs = 3, .seqs = h};
    CHECK(wk_ahead_wants_host(&hp, false) && !wk_ahead_wants_host(&p, false));
    CHECK(!wk_ahead_build(&a, &hp, took, false)); /* host rows not asked for */
    CHECK(!wk_ahead_build(&a, &hp, NULL, true));  /* tokens not known */
    CHECK(!wk_ahead_build(&a, &hp, none, true));  /* a row without its token */
    h[2].sp.logits = WIRE_LOGITS_LAST;
    CHECK(!wk_ahead_wants_host(&hp, false) && !wk_ahead_build(&a, &hp, took, true)); /* logits returned */
    h[2].sp.logits = WIRE_LOGITS_NONE;
    REQUIRE(wk_ahead_build(&a, &hp, took, true));
    CHECK(a.n_host == 2 && !a.host[0] && a.host[1] && a.host[2]);
    /* every row gets a logits row of its own; the engine takes row 0's token itself */
    float *lr[3];
    enum { NV = 5 };
    wk_ahead_logits(&a, NV, lr);
    CHECK(!a.host[0] && a.host[1] && a.host[2] && lr[0] && lr[1] == lr[0] + NV && lr[2] == lr[0] + 2 * NV);
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < NV; k++) lr[i][k] = (float)(10 * i + k);
    int32_t eng_out[3] = {60, -1, -1}; /* the engine's answer: host rows took nothing */
    wk_ahead_done(&a, eng_out);
    /* the next plan: row 7 greedy at the token run (hit: 60), row 8 sampled as it was (hit: its
     * logits), row 9 now greedy while it ran sampled (no hit: it runs again) */
    wire_seq hn[3] = {row(25, 9, 42, 31), row(26, 8, 41, 21), row(27, 7, 40, 11)};
    hn[1].sp.temperature = 1.0f;
    hn[1].sp.seed = 5;
    wire_step_plan hq = {.step_id = 8, .n_seqs = 3, .seqs = hn};
    CHECK(wk_ahead_match(&a, &hq, hit, lhit, &rest, idx) == 2);
    CHECK(hit[0] == -1 && hit[1] == WK_AHEAD_LOGITS && hit[2] == 60);
    CHECK(lhit[1] == lr[1] && lhit[1][3] == 13.0f && lhit[0] == NULL && lhit[2] == NULL);
    CHECK(rest.n_seqs == 1 && idx[0] == 0 && rest.seqs[0].seq_id == 9);
    /* a sampled row asking for another token at that position, or asking as a greedy row, takes
     * nothing; a failed step ahead keeps no logits */
    REQUIRE(wk_ahead_build(&a, &hp, took, true));
    wk_ahead_logits(&a, NV, lr);
    wk_ahead_done(&a, eng_out);
    g_tok[26] = 7;
    CHECK(wk_ahead_match(&a, &hq, hit, lhit, &rest, idx) == 1 && hit[1] == -1 && hit[2] == 60);
    g_tok[26] = 41;
    REQUIRE(wk_ahead_build(&a, &hp, took, true));
    wk_ahead_logits(&a, NV, lr);
    wk_ahead_done(&a, eng_out);
    hn[1].sp.temperature = 0;
    CHECK(wk_ahead_match(&a, &hq, hit, lhit, &rest, idx) == 1 && hit[1] == -1);
    hn[1].sp.temperature = 1.0f;
    REQUIRE(wk_ahead_build(&a, &hp, took, true));
    wk_ahead_logits(&a, NV, lr);
    wk_ahead_done(&a, NULL);
    CHECK(wk_ahead_match(&a, &hq, hit, lhit, &rest, idx) == 0 && rest.n_seqs == 3);
    /* a plan of host rows never covers a step ahead queued before its tokens */
    CHECK(!wk_ahead_covers(&a, &hp));

    /* an engine that samples on the device: sampled, masked and biased rows are device rows (run
     * ahead from the device's tokens); penalties and logprobs still go to the host */
    wk_ahead dv;
    wk_ahead_init(&dv, true);
    CHECK(!wk_ahead_wants_host(&hp, true) && wk_ahead_device_row(&h[1], true) && wk_ahead_device_row(&h[2], true));
    CHECK(!wk_ahead_device_row(&h[1], false) && !wk_ahead_device_row(&h[2], false));
    REQUIRE(wk_ahead_build(&dv, &hp, NULL, false));
    CHECK(dv.n_host == 0);
    h[1].sp.constraint_setup = true;
    REQUIRE(wk_ahead_build(&dv, &hp, took, false));
    CHECK(dv.plan.seqs[1].sp.temperature == 1.0f && !dv.plan.seqs[1].sp.constraint_setup); /* set up by hp */
    h[1].sp.constraint_setup = false;
    h[1].sp.logprobs = true;
    CHECK(wk_ahead_wants_host(&hp, true) && !wk_ahead_device_row(&h[1], true));
    CHECK(!wk_ahead_build(&dv, &hp, NULL, false));
    h[1].sp.logprobs = false;
    h[1].sp.presence_penalty = 0.5f;
    CHECK(wk_ahead_wants_host(&hp, true));
    h[1].sp.presence_penalty = 0;
    wk_ahead_free(&dv);

    /* --step-ahead queue (the default) | off | sync, as the coordinator sends it */
    CHECK(wk_ahead_mode(true, true, WIRE_AHEAD_QUEUE) == WK_AHEAD_QUEUE);
    CHECK(wk_ahead_mode(true, false, WIRE_AHEAD_QUEUE) == WK_AHEAD_SYNC);
    CHECK(wk_ahead_mode(false, true, WIRE_AHEAD_QUEUE) == WK_AHEAD_OFF);
    CHECK(wk_ahead_mode(true, true, WIRE_AHEAD_OFF) == WK_AHEAD_OFF);
    CHECK(wk_ahead_mode(true, true, WIRE_AHEAD_SYNC) == WK_AHEAD_SYNC);
    CHECK(wk_ahead_mode(false, true, WIRE_AHEAD_SYNC) == WK_AHEAD_OFF);
    wk_ahead_free(&a);
    return mla_test_finish();
}
