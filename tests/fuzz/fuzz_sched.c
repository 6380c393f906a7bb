/* libFuzzer target for the scheduler's state machine (coordinator/sched_batch.c): a small cache
 * (so that preemption happens) over the fake backend (tests/serve/fake_backend.h, which checks
 * positions and block ownership), driven by events from the input: submit (prompt, max_tokens,
 * stop ids, ignore_eos, prompt logprobs, min_tokens), cancel (a live or finished request), step, a failing
 * step. Checked: the fake backend sees no contract violation; every accepted request gets token
 * events with n_generated counting up, then exactly one final event and nothing after it; a
 * request with prompt logprobs gets them with its first token only, all of them, the fake's
 * reference values (fake_plp over its prompt); generated tokens
 * never exceed max_tokens; the cache is within bounds; after cancelling everything and stepping
 * until idle, every request is final and every block is free. Deterministic in ctest
 * (-runs=N -seed=1); tests/fuzz/replay_main.c replays the corpus (tests/data/sched). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/sched_batch.h"
#include "serve/fake_backend.h"

#define MAX_REQ 256
#define CTX 64 /* max_context */

typedef struct rec {
    uint64_t id;
    int32_t max_tokens;
    int32_t n_generated;
    bool final;
    bool plp;           /* sampling.prompt_logprobs */
    int32_t prompt[40];
    int32_t n_prompt;
} rec;

static rec recs[MAX_REQ];
static int n_recs;
static bool fail_next;
static sched_backend fake_be;

static void die(const char *what, uint64_t id) {
    fprintf(stderr, "fuzz_sched: %s (request %llu)\n", what, (unsigned long long)id);
    abort();
}

static void on_event(void *ctx, const sched_event *ev) {
    (void)ctx;
    rec *r = ev->user;
    if (!r || r->id != ev->req_id) die("event for an unknown request", ev->req_id);
    if (r->final) die("event after the final one", ev->req_id);
    if (ev->plp || ev->n_plp) {
        if (!r->plp || !ev->has_token || r->n_generated != 0) die("prompt logprobs other than with the first token", ev->req_id);
        if (ev->n_plp != r->n_prompt - 1 || (ev->n_plp && !ev->plp)) die("not one prompt logprob a position", ev->req_id);
        for (int32_t k = 0; k < ev->n_plp; k++) {
            sched_result ref;
            fake_plp(r->prompt, k + 1, 0, &ref);
            if (ev->plp[k].logprob != ref.logprob) die("a prompt logprob is not the fake's", ev->req_id);
        }
    } else if (r->plp && ev->has_token && r->n_generated == 0 && r->n_prompt > 1) {
        die("a first token without its prompt logprobs", ev->req_id);
    }
    if (ev->has_token) {
        if (ev->n_generated != r->n_generated + 1) die("n_generated does not count up", ev->req_id);
        r->n_generated = ev->n_generated;
        if (r->n_generated > r->max_tokens) die("more tokens than max_tokens", ev->req_id);
    }
    if (ev->finish != SCHED_FINISH_NONE) {
        r->final = true;
        if (ev->finish == SCHED_FINISH_ERROR && !ev->error) die("an error event without a message", ev->req_id);
    }
}

static bool is_eog(void *ctx, int32_t tok) {
    (void)ctx;
    return tok == FAKE_EOS;
}

static int run_step(void *ctx, const sched_plan *plan, sched_result *results, mla_err *err) {
    for (int i = 0; i < plan->n_seqs; i++) { /* `last`: exactly where the token ends it by its length */
        const sched_plan_seq *p = &plan->seqs[i];
        for (int k = 0; k < n_recs; k++) {
            if (recs[k].id != p->seq_id) continue;
            const bool want = p->sample && (p->n_generated + 1 >= recs[k].max_tokens ||
                                            p->start_pos + p->n_tokens + 1 >= CTX);
            if (p->last != want) die("a row's `last` is not where its length ends it", p->seq_id);
        }
    }
    if (fail_next) {
        fail_next = false;
        return mla_errf(err, "injected failure");
    }
    return fake_be.run_step(ctx, plan, results, err);
}

static void check_stats(sched *s, const sched_config *c) {
    sched_stats st;
    sched_get_stats(s, &st);
    if (st.blocks_used < 0 || st.blocks_used > st.blocks_total) die("blocks used out of range", 0);
    /* the queue limit applies to new requests; preempted ones go back to waiting on top */
    if (st.running > c->max_seqs || st.waiting + st.running > c->max_queue + c->max_seqs)
        die("running / waiting over the limits", 0);
    mla_err err;
    if (sched_check(s, &err) != MLA_OK) die(err.msg, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    sched_config c = {0};
    c.block_size = 1 + data[0] % 8;
    c.n_blocks = 8 + data[1] % 64;
    c.max_seqs = 1 + data[0] / 32;
    c.max_step_tokens = 4 + data[1] / 4;
    c.long_prefill_tokens = data[1] % 3 ? 1 + (data[0] >> 3) % 11 : 0; /* cut chunks, or none */
    c.max_queue = 8;
    c.prefix_cache = (data[0] ^ data[1]) & 1; /* siblings (below) wait for their leader's prompt only with it */
    c.max_context = CTX;
    c.is_eog = is_eog;
    c.on_event = on_event;
    fake_config fc = {.n_blocks = c.n_blocks, .block_size = c.block_size, .eos_period = 5 + data[1] % 13,
                      .step_delay_ms = 0, .fail_at_step = -1};
    fake_backend *fb = fake_backend_new(&fc);
    fake_backend_bind(fb, &fake_be);
    sched_backend be = fake_be;
    be.run_step = run_step;
    sched *s = NULL;
    mla_err err;
    if (sched_init(&s, &c, &be, &err) != MLA_OK) die("sched_init refused a valid config", 0);
    n_recs = 0;
    fail_next = false;
    size_t i = 2;
    while (i < size) {
        uint8_t op = data[i++];
        switch (op % 4) {
        case 0: { /* submit */
            if (n_recs == MAX_REQ || i + 2 > size) break;
            int32_t n_prompt = 1 + data[i] % 40, max_tokens = 1 + data[i + 1] % 40;
            i += 2;
            int32_t prompt[40], stop = op / 4 % 30;
            for (int32_t k = 0; k < n_prompt; k++) prompt[k] = i < size ? data[i++] : 'a';
            /* one in five: the previous request's sibling (its prompt, admitted after that is computed) */
            const bool sibling = n_recs > 0 && stop % 5 == 1;
            if (sibling) {
                n_prompt = recs[n_recs - 1].n_prompt;
                memcpy(prompt, recs[n_recs - 1].prompt, (size_t)n_prompt * sizeof *prompt);
            }
            rec *r = &recs[n_recs];
            memset(r, 0, sizeof *r);
            r->max_tokens = max_tokens;
            r->plp = stop % 3 == 0;
            r->n_prompt = n_prompt;
            memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
            sched_request q = {0};
            q.prompt = prompt;
            q.n_prompt = n_prompt;
            q.max_tokens = max_tokens;
            int32_t stop_id = 'a' + stop;
            if (op & 0x40) {
                q.stop_ids = &stop_id;
                q.n_stop_ids = 1;
            }
            q.ignore_eos = op & 0x80;
            sched_sampling_default(&q.sampling);
            q.sampling.temperature = 0;
            q.sampling.prompt_logprobs = r->plp;
            if (op & 0x40 && stop % 4 == 2) { /* min_tokens banning the stop id: copied with the request */
                q.sampling.min_tokens = 1 + stop % 7;
                q.sampling.ban_ids = &stop_id;
                q.sampling.n_ban = 1;
            }
            q.user = r;
            if (sibling) q.after = recs[n_recs - 1].id;
            uint64_t id = 0;
            int rc = sched_submit(s, &q, &id, &err);
            if (rc == SCHED_E_OK) {
                if (id == 0) die("submit gave id 0", 0);
                r->id = id;
                n_recs++;
            } else if (!err.msg[0]) {
                die("a refused submit without a message", 0);
            }
            break;
        }
        case 1: /* cancel a request, live or not (unknown ids are ignored) */
            if (n_recs) sched_cancel(s, recs[(op / 4) % n_recs].id);
            else sched_cancel(s, op);
            break;
        case 2: /* steps */
            for (int k = 0; k <= op / 64; k++) sched_step(s);
            break;
        default: /* the next step fails */
            fail_next = true;
            break;
        }
        check_stats(s, &c);
    }
    /* wind down: cancel everything, step until idle */
    for (int k = 0; k < n_recs; k++) sched_cancel(s, recs[k].id);
    int guard = 0;
    while (sched_step(s) && guard++ < 10000) {
    }
    if (guard >= 10000) die("the scheduler does not go idle", 0);
    for (int k = 0; k < n_recs; k++)
        if (!recs[k].final) die("a request without a final event", recs[k].id);
    sched_stats st;
    sched_get_stats(s, &st);
    if (st.blocks_used != 0 || st.running != 0 || st.waiting != 0) die("blocks or requests left after winding down", 0);
    fake_stats fs;
    fake_backend_stats(fb, &fs);
    if (fs.violations) die("the fake backend saw contract violations", 0);
    sched_free(s);
    fake_backend_free(fb);
    return 0;
}
