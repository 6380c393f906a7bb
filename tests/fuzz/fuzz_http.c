/* libFuzzer target for the HTTP request side of the server: the input is a byte stream from one
 * client, fed to http_req in pieces whose sizes come from the input itself, and again whole
 * (the same requests, and a refusal or none, either way: a client's reads may split it anywhere);
 * every complete request is checked (strings present, body NUL-terminated), its body read as
 * the server reads it (api_body_parse: a refusal names its problem; what it takes, printed
 * again by cJSON, it takes again) and run through every request-body parser of the API
 * (completions, chat, tokenize, detokenize, the Responses and Messages APIs' translations to a
 * chat body and that body's parse), the URL's readers and the UTF-8 helpers. Built with -DMLA_FUZZ=ON
 * (clang); tests/fuzz/replay_main.c replays the corpus (tests/data/http) without libFuzzer. */
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/api_body.h"
#include "coordinator/api_messages.h"
#include "coordinator/api_params.h"
#include "coordinator/api_responses.h"
#include "coordinator/http_req.h"

static volatile size_t g_sink;

static void check_utf8(const char *s, size_t len) {
    size_t n = 0;
    char *o = api_utf8_sanitize(s, len, &n);
    if (strlen(o) > n) __builtin_trap();
    if (api_utf8_complete_prefix(o, n) != n) __builtin_trap(); /* sanitized text is complete */
    size_t p = api_utf8_complete_prefix(s, len);
    if (p > len || len - p > 3) __builtin_trap();
    g_sink += n;
    free(o);
}

/* the URL's readers (/v1/models' paging members, /v1/models/{id}): never longer than their source */
static void check_url(const http_request *r) {
    static const char *const keys[] = {"limit", "after_id", "before_id", "a", ""};
    const size_t qn = strlen(r->query), pn = strlen(r->path);
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        size_t n = 0;
        char *v = api_query_value(r->query, keys[i], &n);
        if (v && (n > qn || strlen(v) > n || v[n] != 0)) __builtin_trap();
        free(v);
    }
    size_t n = 0;
    char *d = api_pct_decode(r->path, pn, &n);
    if (n > pn || d[n] != 0 || strlen(d) > n) __builtin_trap();
    free(d);
}

static void handle(const http_request *r) {
    if (!r->method || !r->path || !r->query || !r->body) __builtin_trap();
    if (r->body[r->body_len] != 0) __builtin_trap();
    check_utf8(r->path, strlen(r->path));
    check_url(r);
    mla_err err = {{0}};
    cJSON *j = api_body_parse(r->body, r->body_len, &err);
    if (!j) {
        if (!err.msg[0]) __builtin_trap();
        return;
    }
    char *again = cJSON_PrintUnformatted(j);
    if (again) { /* NULL: out of memory, or a document cJSON cannot print */
        cJSON *k = api_body_parse(again, strlen(again), &err);
        if (!k) __builtin_trap();
        cJSON_Delete(k);
        free(again);
    }
    api_error e;
    api_gen_params p;
    for (int k = 0; k < 2; k++) {
        if (api_gen_params_parse(&p, k ? API_CHAT : API_COMPLETIONS, j, &e) == MLA_OK) {
            if (p.sampling.top_logprobs < 0 || p.sampling.top_logprobs > SCHED_MAX_TOP_LOGPROBS) __builtin_trap();
            if (p.n_stop < 0 || p.n_stop > API_MAX_STOP) __builtin_trap();
            for (int i = 0; i < p.n_stop; i++) check_utf8(p.stop[i], strlen(p.stop[i]));
            if (p.prompt_text) check_utf8(p.prompt_text, strlen(p.prompt_text));
        } else if (e.status != 400 || !e.message[0]) {
            __builtin_trap();
        }
        api_gen_params_free(&p);
    }
    cJSON *chat, *echo;
    api_rsp_opts opts;
    if (api_rsp_parse(j, &chat, &echo, &opts, &e) == MLA_OK) {
        if (!chat || !echo || !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(chat, "messages"))) __builtin_trap();
        if (api_gen_params_parse(&p, API_CHAT, chat, &e) != MLA_OK) {
            api_rsp_error_names(&e);
            if (e.status != 400 || !e.message[0]) __builtin_trap();
        }
        api_gen_params_free(&p);
        cJSON_Delete(chat);
        cJSON_Delete(echo);
    } else if (e.status != 400 || !e.message[0] || chat || echo) {
        __builtin_trap();
    }
    if (api_msg_parse(j, &chat, &opts, &e) == MLA_OK) {
        if (!chat || !opts.messages || !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(chat, "messages")))
            __builtin_trap();
        if (api_gen_params_parse(&p, API_CHAT, chat, &e) != MLA_OK) {
            api_msg_error_names(&e);
            if (e.status != 400 || !e.message[0]) __builtin_trap();
        }
        api_gen_params_free(&p);
        cJSON_Delete(chat);
    } else if (e.status != 400 || !e.message[0] || chat) {
        __builtin_trap();
    }
    api_tok_params t;
    if (api_tokenize_params_parse(&t, j, &e) != MLA_OK && e.status != 400) __builtin_trap();
    api_tok_params_free(&t);
    if (api_detokenize_params_parse(&t, j, &e) != MLA_OK && e.status != 400) __builtin_trap();
    api_tok_params_free(&t);
    cJSON_Delete(j);
}

/* Feeds the stream in pieces of step bytes (0: whole) and handles each complete request;
 * returns the requests completed, and the refusal's status (0: none) in *status. */
static int run(const char *s, size_t size, size_t step, int *status) {
    http_limits lim;
    http_limits_default(&lim);
    lim.max_body = 4096;
    lim.max_header_bytes = 2048;
    lim.max_headers = 16;
    lim.max_url = 512;
    http_req p;
    http_req_init(&p, &lim);
    size_t off = 0;
    int guard = 0, done = 0;
    *status = 0;
    while (off < size && guard++ < 100000) {
        size_t n = step ? (size - off < step ? size - off : step) : size - off;
        size_t used = http_req_feed(&p, s + off, n);
        if (used > n) __builtin_trap();
        off += used;
        if (p.state == HTTP_REQ_DONE) {
            handle(&p.req);
            http_req_next(&p);
            done++;
        } else if (p.state == HTTP_REQ_ERROR) {
            if (p.err_status < 400 || p.err_status > 505 || !p.err_msg[0]) __builtin_trap();
            *status = p.err_status;
            break;
        } else if (used < n) {
            __builtin_trap(); /* more wanted, yet bytes left unconsumed */
        }
    }
    http_req_free(&p);
    return done;
}

/* The piece size comes from the first byte (1..32 or whole); the stream read whole must give
 * the same requests as read in pieces (a client's reads split it anywhere), and a refusal either
 * way (which of two faults is named first may depend on where a piece ends) */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const size_t step = size ? (size_t)(data[0] % 33) : 0;
    int st_piece, st_whole;
    const int n_piece = run((const char *)data, size, step, &st_piece);
    const int n_whole = step ? run((const char *)data, size, 0, &st_whole) : n_piece;
    if (step && (n_piece != n_whole || !st_piece != !st_whole)) __builtin_trap();
    return 0;
}
