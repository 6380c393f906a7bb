/* Writes a seed corpus for the wire fuzzer: one valid frame of every kind, Bench and BenchResult
 * included (encoded by wire_encode), plus truncated and bit-flipped copies.
 * usage: make_wire_corpus DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "wire.h"

static int n_files;
static const char *g_dir;

static void put(const char *tag, const uint8_t *b, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%02d-%s", g_dir, n_files++, tag);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n) {
        perror(path);
        exit(2);
    }
    fclose(f);
}

static void emit(const char *tag, const wire_msg *m) {
    uint8_t *b;
    size_t n;
    mla_err err;
    if (wire_encode(m, &b, &n, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(2);
    }
    put(tag, b, n);
    if (n > 4) put("trunc", b, n / 2);
    uint8_t *c = malloc(n);
    memcpy(c, b, n);
    c[n / 3] ^= 0x40;
    put("flip", c, n);
    free(c);
    free(b);
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    g_dir = argv[1];
    mkdir(g_dir, 0755);
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_REGISTER;
    m.u.reg = (wire_register){.rank = 1, .world = 4, .protocol_version = WIRE_VERSION, .model_hash = 77, .pid = 9};
    strcpy(m.u.reg.host, "h");
    strcpy(m.u.reg.device, "cpu");
    emit("register", &m);
    memset(&m, 0, sizeof m);
    m.kind = WIRE_REGISTER_REPLY;
    m.u.reply = (wire_register_reply){.ok = true, .heartbeat_ms = 100, .heartbeat_timeout_ms = 1000,
                                      .coll_timeout_ms = 30000};
    strcpy(m.u.reply.coll_shm_name, "/mla-coll-1-0-ab");
    emit("reply", &m);
    int32_t t[3] = {1, 2, 3}, p[3] = {4, 5, 6};
    wire_seq s[2] = {{.seq_id = 1, .n_tokens = 3, .tokens = t, .positions = p, .sample = true,
                      .sp = {.temperature = 0.7f, .top_k = 5, .top_p = 0.9f, .seed = 3, .logprobs = true,
                             .top_logprobs = 2, .logits = WIRE_LOGITS_ALL}},
                     {.seq_id = 2, .n_tokens = 1, .tokens = t, .positions = p}};
    memset(&m, 0, sizeof m);
    m.kind = WIRE_STEP_PLAN;
    m.u.plan = (wire_step_plan){.step_id = 5, .n_seqs = 2, .seqs = s};
    emit("plan", &m);
    s[0].sp.prompt_logprobs = true; /* an echoed prompt's chunk: the token after it travels along */
    s[0].next_token = 2;
    emit("plan_prompt_logprobs", &m);
    s[0].sp.prompt_logprobs = false;
    s[0].next_token = 0;
    s[0].last = true; /* its token ends its request */
    emit("plan_last", &m);
    s[0].last = false;
    int32_t bias_id = 3, ban[2] = {0, 7}; /* a constraint's setup: a bias, min_tokens and its stop tokens */
    float bias_val = -2.0f;
    s[1].sp = (wire_sampling){.constrained = true, .constraint_setup = true, .grammar_start = 5, .n_bias = 1,
                              .bias_ids = &bias_id, .bias_vals = &bias_val, .min_tokens = 4, .n_ban = 2,
                              .ban_ids = ban};
    emit("plan_min_tokens", &m);
    memset(&s[1].sp, 0, sizeof s[1].sp);
    float lg[6] = {1, 2, 3, 4, 5, 6};
    wire_seq_result r = {.seq_id = 1, .token = 2, .logprob = -0.1f, .n_top = 1, .n_logit_rows = 2,
                         .n_vocab = 3, .logits = lg};
    r.top[0] = (wire_top){2, -0.1f};
    memset(&m, 0, sizeof m);
    m.kind = WIRE_STEP_RESULT;
    m.u.result = (wire_step_result){.step_id = 5, .ok = true, .n_seqs = 1, .seqs = &r};
    emit("result", &m);
    r.error = "the output grammar reached a limit of the matcher after 2 generated tokens";
    emit("result_seq_error", &m);
    r.error = NULL;
    wire_plp plp[2] = {{.logprob = -0.5f, .n_top = 2, .top = {{1, -0.5f}, {2, -1.0f}}}, {.logprob = -2.0f}};
    r.n_logit_rows = 0;
    r.logits = NULL;
    r.n_plp = 2;
    r.plp = plp;
    emit("result_prompt_logprobs", &m);
    r.n_plp = 0;
    r.plp = NULL;
    uint64_t ids[2] = {1, 2};
    memset(&m, 0, sizeof m);
    m.kind = WIRE_CONTROL;
    m.u.ctl = (wire_control){.kind = WIRE_CTL_FREE_SEQ, .n_seq_ids = 2, .seq_ids = ids};
    emit("control", &m);
    m.u.ctl = (wire_control){.kind = WIRE_CTL_NCCL_ID, .nccl_id_len = WIRE_MAX_NCCL_ID};
    for (int i = 0; i < WIRE_MAX_NCCL_ID; i++) m.u.ctl.nccl_id[i] = (uint8_t)(i * 7 + 1);
    emit("nccl_id", &m);
    uint64_t bids[3] = {4, 5, 6};
    memset(&m, 0, sizeof m);
    m.kind = WIRE_BENCH;
    m.u.bench = (wire_bench){.bench_id = 1, .op = WIRE_BENCH_FILL, .n_seq_ids = 3, .seq_ids = bids, .n_past = 1024};
    emit("bench_fill", &m);
    m.u.bench = (wire_bench){.bench_id = 2, .op = WIRE_BENCH_COLL, .n_floats = 7168, .iters = 20};
    emit("bench_coll", &m);
    memset(&m, 0, sizeof m);
    m.kind = WIRE_BENCH_RESULT;
    m.u.bench_result = (wire_bench_result){.bench_id = 2, .rank = 1, .ok = true, .sec_per_op = 3.5e-5};
    emit("bench_result", &m);
    m.u.bench_result = (wire_bench_result){.bench_id = 1, .rank = 0, .ok = false};
    strcpy(m.u.bench_result.error, "the test engine has no bench_fill hook");
    emit("bench_error", &m);
    return 0;
}
