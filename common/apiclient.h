/* apiclient: a small blocking client of mlaserve's protobuf API (proto/api.proto), and the frame
 * format helpers the server (coordinator/pbapi_*) shares with it.
 *
 * Frame: uint32 big-endian LENGTH | uint8 TYPE | PAYLOAD, LENGTH = 1 + payload bytes,
 * TYPE = (APICLIENT_VERSION << 4) | kind (Mlaapi__FrameKind), PAYLOAD = the kind's message.
 *
 * One request at a time per apiclient (the protocol allows several in flight; this client
 * waits for each answer). Not thread-safe: one thread per apiclient.
 * Ownership: apiclient_connect returns a client the caller closes with apiclient_close;
 * results (apiclient_gen_result, token arrays, model lists) are the caller's to free with the
 * matching free function. Errors (network, server Error frames) return MLA_ERR with err set;
 * apiclient_last_code then says the server's ErrorCode (0 when the error was local). */
#ifndef APICLIENT_H
#define APICLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api.pb-c.h"
#include "common/mla_err.h"

#define APICLIENT_VERSION 1
#define APICLIENT_HDR 5                       /* length + type */
#define APICLIENT_MAX_FRAME_DEFAULT (1u << 20) /* payload bytes the server takes by default */
#define APICLIENT_MAX_RECV_FRAME (64u << 20)   /* payload bytes this client accepts */

/* ---- frames (shared with the server) ---- */

/* The whole frame (header + packed msg) for kind; malloc'd, *len gets its size. */
uint8_t *apiclient_frame_pack(int kind, const ProtobufCMessage *msg, size_t *len);
/* Reads a 5-byte header. On success *kind (the FrameKind, version checked) and *payload_len.
 * On failure MLA_ERR, err says why and *code is the ErrorCode (bad frame, too large, unknown
 * kind/version). */
int apiclient_frame_header(const uint8_t hdr[APICLIENT_HDR], uint32_t max_payload, int *kind,
                           uint32_t *payload_len, int *code, mla_err *err);
/* Name of a FrameKind / ErrorCode (for messages). */
const char *apiclient_kind_name(int kind);
const char *apiclient_code_name(int code);

/* ---- the client ---- */

typedef struct apiclient apiclient;

/* Connects, sends Hello (with api_key when not NULL/empty), waits for HelloReply.
 * timeout_ms bounds every blocking read/write (0: no limit). */
int apiclient_connect(apiclient **out, const char *host, int port, const char *api_key, int timeout_ms,
                      mla_err *err);
void apiclient_close(apiclient *c);
int apiclient_last_code(const apiclient *c);
/* From the HelloReply: served model and the server's max payload. */
const char *apiclient_server_model(const apiclient *c);
/* The server's version and build ("commit C, TYPE, CUDA sm_.. | CPU only"); "" from a server
 * that does not say. */
const char *apiclient_server_version(const apiclient *c);
const char *apiclient_server_build(const apiclient *c);
uint32_t apiclient_server_max_frame(const apiclient *c);

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

/* Per-token callback (valid during the call). Return non-zero to cancel the request (the
 * generation then ends with an ERROR_CANCELLED error). */
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
    uint32_t max_model_len;
    char *owned_by;
} apiclient_model;
int apiclient_models(apiclient *c, apiclient_model **models, size_t *n, mla_err *err);
void apiclient_models_free(apiclient_model *models, size_t n);

#endif
