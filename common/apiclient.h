/* apiclient: a small blocking gRPC client of mlaserve's API (proto/api.proto service
 * mlaapi.MlaServe, docs/grpc.md): HTTP/2 through nghttp2, over TCP (h2c) or TLS (OpenSSL,
 * ALPN h2, the server's certificate checked against a CA file or the system's).
 *
 * One call at a time per apiclient (HTTP/2 allows many; this client waits for each answer).
 * Not thread-safe: one thread per apiclient.
 * Ownership: apiclient_connect returns a client the caller closes with apiclient_close;
 * results (apiclient_gen_result, token arrays, model lists) are the caller's to free with the
 * matching free function. Errors (network, TLS, a call's non-OK status) return MLA_ERR with err
 * set; apiclient_last_code then says the call's gRPC status (0 when the error was local). */
#ifndef APICLIENT_H
#define APICLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api.pb-c.h"
#include "common/mla_err.h"

#define APICLIENT_MAX_RECV_MSG (64u << 20) /* response message bytes this client accepts */

typedef struct apiclient apiclient;

typedef struct apiclient_opts {
    const char *api_key;  /* sent as authorization: Bearer KEY (NULL/empty: none) */
    int timeout_ms;       /* each call's deadline (grpc-timeout) and every wait (0: no limit) */
    bool tls;             /* TLS (the server runs with --tls-cert/--tls-key) */
    const char *tls_ca;   /* PEM file of the CA to trust (NULL: the system's) */
} apiclient_opts;

/* Connects (TCP, TLS, HTTP/2 preface) and calls Info: the served model and the server's build.
 * MLA_ERR names what failed (resolution, connection, TLS, not a gRPC server). */
int apiclient_connect(apiclient **out, const char *host, int port, const apiclient_opts *o, mla_err *err);
void apiclient_close(apiclient *c);
int apiclient_last_code(const apiclient *c);
/* From Info: served model, the server's version and build ("commit C, TYPE, CUDA sm_.. | CPU
 * only"), and the largest request message it takes. */
const char *apiclient_server_model(const apiclient *c);
const char *apiclient_server_version(const apiclient *c);
const char *apiclient_server_build(const apiclient *c);
uint32_t apiclient_server_max_message(const apiclient *c);

typedef struct apiclient_gen_params {
    const char *prompt;         /* plain prompt text; with chat: the user message */
    bool chat;                  /* through the chat template */
    const int32_t *prompt_ids;  /* instead of prompt: token ids */
    size_t n_prompt_ids;
    const char *model;          /* NULL: the served one */
    int32_t max_tokens;         /* 0: what the context leaves */
    bool has_temperature;
    float temperature;
    bool has_top_p;
    float top_p;
    bool has_top_k;
    int32_t top_k;
    bool has_seed;
    uint64_t seed;
    const char *const *stop;
    size_t n_stop;
    bool ignore_eos;
    bool logprobs;
    uint32_t top_logprobs;
} apiclient_gen_params;

typedef struct apiclient_token {
    uint32_t index;             /* token index in the completion */
    int32_t id;
    const char *text;           /* its share of the text (UTF-8, may be empty), NUL-terminated */
    size_t text_len;
    bool has_logprob;
    float logprob;
    size_t n_top;
    const int32_t *top_ids;
    const float *top_logprobs;
} apiclient_token;

/* Per-token callback (valid during the call). Return non-zero to cancel the call (RST_STREAM:
 * the generation then ends with MLA_ERR, apiclient_last_code GRPC status 1, CANCELLED). */
typedef int (*apiclient_token_fn)(void *ud, const apiclient_token *t);

typedef struct apiclient_gen_result {
    char *text;                 /* the whole completion, NUL-terminated */
    size_t text_len;
    int32_t *ids;
    size_t n_ids;
    char finish_reason[32];
    uint32_t prompt_tokens, completion_tokens;
} apiclient_gen_result;

/* Generates; fn (may be NULL) sees every token as it arrives. res is filled on success. */
int apiclient_generate(apiclient *c, const apiclient_gen_params *p, apiclient_token_fn fn, void *ud,
                       apiclient_gen_result *res, mla_err *err);
void apiclient_gen_result_free(apiclient_gen_result *res);

/* Token ids of text (add_special: BOS etc.); *ids malloc'd. */
int apiclient_tokenize(apiclient *c, const char *text, bool add_special, int32_t **ids, size_t *n,
                       mla_err *err);
/* Health: *ok and the status text ("ok" or why not). */
int apiclient_health(apiclient *c, bool *ok, char *status, size_t cap, mla_err *err);

typedef struct apiclient_model {
    char *id;
    uint32_t max_model_len; /* 0: not known yet (the server's workers are loading) */
    char *owned_by;
} apiclient_model;
int apiclient_models(apiclient *c, apiclient_model **models, size_t *n, mla_err *err);
void apiclient_models_free(apiclient_model *models, size_t n);

#endif
