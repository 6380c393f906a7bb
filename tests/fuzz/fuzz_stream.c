/* libFuzzer target for the streaming response assembly of coordinator/api_server.c: the
 * detokenized text, stop strings across token boundaries, UTF-8 sequences split over tokens,
 * EOS, max_tokens and cancellation, through api_server_generate (the path both APIs share) with
 * the real scheduler. The backend "samples" the bytes of the input: token b is the byte b, 256
 * is EOS; so the model's text is whatever the fuzzer wants, including invalid UTF-8. Input: a
 * header (request count, max_tokens, stop strings, when to cancel) then the token bytes.
 * A request's header byte also picks api_server_generate's immediate or prep-thread path.
 * Checked per request: the deltas are contiguous and each ends outside an incomplete UTF-8
 * sequence; one final call; the final text is the deltas' concatenation; it holds no stop
 * string; with finish "stop" by a stop string, text + that stop string starts the model's
 * bytes; with "length" or an EOS the text is the model's bytes. Deterministic in ctest
 * (-runs=N -seed=1); tests/fuzz/replay_main.c replays the corpus (tests/data/stream). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "coordinator/api_params.h"
#include "coordinator/api_server.h"
#include "coordinator/sched_batch.h"

#define EOS 256
#define NREQ 3

typedef struct req {
    int idx;
    char *stops[4];
    int n_stops;
    /* what the model produced (bytes; EOS ends it) */
    char raw[4096];
    size_t raw_len;
    bool eos;
    /* what the sink got */
    char got[4096];
    size_t got_len;
    size_t ends[4096]; /* where each delta ended */
    int n_ends;
    int n_final;
    const char *finish;
    bool error, cancelled;
    api_gen *g;
} req;

static const uint8_t *g_data;
static size_t g_size, g_pos;
static req reqs[NREQ];

static void die(const char *what, int idx) {
    fprintf(stderr, "fuzz_stream: request %d: %s\n", idx, what);
    abort();
}

/* ---- tokenizer: ids 0..255 are the bytes ---- */

static int t_encode(void *ctx, const char *text, size_t len, bool add_special, bool parse_special,
                    const size_t *plain, size_t n_plain, int32_t **ids, int32_t *n, mla_err *err) {
    (void)ctx, (void)add_special, (void)parse_special, (void)plain, (void)n_plain, (void)err;
    *ids = malloc((len + 1) * sizeof(int32_t));
    for (size_t i = 0; i < len; i++) (*ids)[i] = (unsigned char)text[i];
    *n = (int32_t)len;
    return MLA_OK;
}

static const char *t_piece(void *ctx, int32_t id, size_t *len) {
    static char bytes[256];
    (void)ctx;
    for (int i = 0; i < 256; i++) bytes[i] = (char)i;
    if (id < 0 || id > EOS) return NULL;
    *len = id < 256 ? 1 : 0;
    return id < 256 ? bytes + id : "";
}

static bool t_special(void *ctx, int32_t id) {
    (void)ctx;
    return id == EOS;
}

static bool t_eog(void *ctx, int32_t id) {
    (void)ctx;
    return id == EOS;
}

/* ---- backend: the input's bytes are the tokens ---- */

static int run_step(void *ctx, const sched_plan *plan, sched_result *res, mla_err *err) {
    (void)ctx, (void)err;
    for (int i = 0; i < plan->n_seqs; i++) {
        if (!plan->seqs[i].sample) continue;
        int32_t t = EOS;
        if (g_pos < g_size) {
            uint8_t b = g_data[g_pos++];
            t = b == 0xFF ? EOS : b;
        }
        memset(&res[i], 0, sizeof res[i]);
        res[i].token = t;
        res[i].logprob = -1.0f;
        /* the request: its prompt is "p" and its index digit */
        const sched_plan_seq *ps = &plan->seqs[i];
        int k = ps->n_prompt == 2 ? ps->seq_tokens[1] - '0' : -1;
        if (k >= 0 && k < NREQ) {
            req *r = &reqs[k];
            if (!r->eos && t == EOS) r->eos = true;
            else if (!r->eos && r->raw_len < sizeof r->raw) r->raw[r->raw_len++] = (char)t;
        }
    }
    return MLA_OK;
}

/* ---- the sink ---- */

static void add_text(req *r, const char *text, size_t from, size_t to) {
    if (from != r->got_len) die("a delta does not start where the last one ended", r->idx);
    if (to < from || to - from > sizeof r->got - r->got_len) die("delta range", r->idx);
    memcpy(r->got + r->got_len, text + from, to - from);
    r->got_len += to - from;
}

static void on_delta(void *ud, const char *text, size_t from, size_t to, const api_token *toks, int n) {
    req *r = ud;
    (void)toks;
    if (r->n_final) die("a delta after the final call", r->idx);
    if (n < 1) die("a delta without tokens", r->idx);
    add_text(r, text, from, to);
    if (r->n_ends < 4096) r->ends[r->n_ends++] = to;
}

/* Length of the valid UTF-8 sequence (RFC 3629: shortest form, no surrogates, <= U+10FFFF)
 * at s[0..n), 0 when there is none. */
static size_t valid_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t l = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!l || l > n) return 0;
    for (size_t i = 1; i < l; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (l == 3 && ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] >= 0xA0))) return 0;
    if (l == 4 && ((c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] >= 0x90))) return 0;
    return l;
}

static void on_final(void *ud, const char *text, size_t from, size_t to, const api_token *toks, int n,
                     const char *finish, const char *error, enum api_end end, int32_t n_prompt, int32_t n_completion) {
    req *r = ud;
    (void)toks, (void)n, (void)n_prompt, (void)n_completion;
    if (r->n_final++) die("two final calls", r->idx);
    add_text(r, text, from, to);
    r->finish = finish;
    r->error = error != NULL;
    r->cancelled = end == API_END_CANCELLED || end == API_END_SHUTDOWN;
    r->g = NULL;
}

static void on_refused(void *ud, const api_error *e) {
    req *r = ud;
    if (r->n_final++) die("refused after a final call", r->idx);
    if (!e || !e->message[0]) die("refused without a message", r->idx);
    r->error = true;
    r->g = NULL;
}

static void check(req *r) {
    if (r->n_final != 1) die("no final call", r->idx);
    if (r->error) return; /* cancelled: nothing to compare */
    for (int k = 0; k < r->n_stops; k++)
        if (memmem(r->got, r->got_len, r->stops[k], strlen(r->stops[k]))) die("the text holds a stop string", r->idx);
    if (r->got_len > r->raw_len || memcmp(r->got, r->raw, r->got_len)) die("the text is not the model's bytes", r->idx);
    /* no delta ends inside a valid multi-byte sequence of the model's text */
    for (int e = 0; e < r->n_ends; e++) {
        size_t to = r->ends[e];
        for (size_t p = to > 3 ? to - 3 : 0; p < to; p++) {
            size_t l = valid_seq((const unsigned char *)r->raw + p, r->raw_len - p);
            if (l > 1 && p + l > to) die("a delta ends inside a UTF-8 sequence", r->idx);
        }
    }
    if (r->got_len < r->raw_len) {
        /* cut: a stop string must start right there */
        bool found = false;
        for (int k = 0; k < r->n_stops && !found; k++) {
            size_t l = strlen(r->stops[k]);
            found = r->got_len + l <= r->raw_len && !memcmp(r->raw + r->got_len, r->stops[k], l);
        }
        if (!found) die("the text was cut where no stop string starts", r->idx);
        if (!r->finish || strcmp(r->finish, "stop")) die("cut by a stop string but finish is not stop", r->idx);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    uv_loop_t loop;
    uv_loop_init(&loop);
    api_tokenizer tok = {.ctx = NULL, .n_vocab = 257, .encode = t_encode, .piece = t_piece, .is_special = t_special,
                         .is_eog = t_eog};
    api_config ac = {.model_name = "m", .max_context = 2048, .special_in_messages = true};
    api_server *a = NULL;
    mla_err err;
    if (api_server_new(&a, &loop, &ac, &tok, &err)) die(err.msg, -1);
    sched_config sc = {.block_size = 16, .n_blocks = 512, .max_seqs = 4, .max_step_tokens = 256, .max_queue = 8,
                       .max_context = 2048, .is_eog = t_eog, .on_event = api_server_on_event, .cb_ctx = a};
    sched_backend be = {.ctx = NULL, .run_step = run_step};
    sched *s = NULL;
    if (sched_init(&s, &sc, &be, &err)) die(err.msg, -1);
    api_server_set_sched(a, s);

    /* header: n requests; per request max_tokens, cancel step, n stops, stop strings */
    size_t i = 0;
    int n = 1 + data[i++] % NREQ;
    int cancel_at[NREQ];
    memset(reqs, 0, sizeof reqs);
    for (int k = 0; k < n && i + 3 <= size; k++) {
        req *r = &reqs[k];
        r->idx = k;
        bool async = data[i] & 0x80; /* the prompt made on the prep thread (api_sink.on_refused) */
        int max_tokens = 1 + data[i++] % 64;
        cancel_at[k] = data[i] % 4 == 0 ? data[i] / 4 : -1;
        i++;
        r->n_stops = data[i++] % 5;
        cJSON *j = cJSON_CreateObject();
        char prompt[3] = {'p', (char)('0' + k), 0};
        cJSON_AddStringToObject(j, "prompt", prompt);
        cJSON_AddNumberToObject(j, "max_tokens", max_tokens);
        cJSON_AddBoolToObject(j, "ignore_eos", false);
        cJSON *st = cJSON_AddArrayToObject(j, "stop");
        for (int q = 0; q < r->n_stops; q++) {
            size_t l = i < size ? 1 + data[i++] % 4 : 1;
            char buf[8] = {0};
            for (size_t b = 0; b < l; b++) {
                uint8_t c = i < size ? data[i++] : 'a';
                buf[b] = c ? (char)c : 'z';
            }
            r->stops[q] = strdup(buf);
            cJSON_AddItemToArray(st, cJSON_CreateString(buf));
        }
        api_gen_params p;
        api_error e;
        if (api_gen_params_parse(&p, API_COMPLETIONS, j, &e) == MLA_OK) {
            api_sink sink = {.ud = r, .on_delta = on_delta, .on_final = on_final,
                             .on_refused = async ? on_refused : NULL};
            r->g = api_server_generate(a, &p, &sink, &e);
            if (!r->g) r->n_final = 1, r->error = true; /* refused: nothing to check */
            api_gen_params_free(&p);
        } else {
            r->n_final = 1;
            r->error = true;
        }
        cJSON_Delete(j);
    }
    g_data = data;
    g_size = size;
    g_pos = i;
    /* prompts made on the prep thread are submitted before the first step (deterministic) */
    while (api_server_preparing(a) > 0) uv_run(&loop, UV_RUN_ONCE);
    for (int step = 0; step < 400; step++) {
        for (int k = 0; k < n; k++)
            if (cancel_at[k] == step && reqs[k].g) api_server_gen_cancel(reqs[k].g, false);
        int did = sched_step(s);
        uv_run(&loop, UV_RUN_NOWAIT);
        if (!did && api_server_inflight(a) == 0) break;
    }
    /* whatever still runs is cancelled and wound down */
    for (int k = 0; k < n; k++)
        if (reqs[k].g) api_server_gen_cancel(reqs[k].g, false);
    for (int guard = 0; api_server_inflight(a) > 0 && guard < 1000; guard++) {
        sched_step(s);
        uv_run(&loop, UV_RUN_NOWAIT);
    }
    if (api_server_inflight(a) > 0) die("requests still in flight after cancelling", -1);
    sched_free(s);
    api_server_free(a);
    uv_loop_close(&loop);
    for (int k = 0; k < n; k++) {
        if (reqs[k].idx == k && (reqs[k].n_final || reqs[k].g == NULL)) check(&reqs[k]);
        for (int q = 0; q < reqs[k].n_stops; q++) free(reqs[k].stops[q]);
    }
    return 0;
}
