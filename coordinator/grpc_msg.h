/* grpc_msg: the gRPC API's methods (proto/api.proto service MlaServe, proto/health.proto
 * grpc.health.v1.Health) and the decoding and validation of one request message into a request
 * the server can act on. Pure (no I/O, no tokenizer): shared by the server (grpc_server) and the
 * fuzz target (tests/fuzz/fuzz_grpc.c).
 *
 * Ownership: grpc_request_decode fills a struct the caller frees with grpc_request_free (also
 * after a failed decode). Pointers into a request (text, gen.messages) live as long as it. */
#ifndef GRPC_MSG_H
#define GRPC_MSG_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api.pb-c.h"
#include "health.pb-c.h"
#include "common/mla_err.h"
#include "coordinator/api_params.h"

enum {
    GRPC_M_NONE = 0,
    GRPC_M_GENERATE, /* server streaming */
    GRPC_M_TOKENIZE,
    GRPC_M_HEALTH,
    GRPC_M_MODELS,
    GRPC_M_CANCEL,
    GRPC_M_INFO,
    GRPC_M_HC_CHECK, /* grpc.health.v1.Health */
    GRPC_M_HC_WATCH, /* server streaming */
    GRPC_M_COUNT
};

/* "/package.Service/Method" of a method, NULL when unknown. */
const char *grpc_method_path(int method);
/* The method of a :path (not NUL-terminated), 0 when none. */
int grpc_method_of_path(const char *path, size_t len);

typedef struct grpc_request {
    int method;
    uint64_t request_id;    /* Generate (0: none given) and Cancel (the call to cancel) */
    ProtobufCMessage *msg;  /* the unpacked message */
    /* GRPC_M_GENERATE */
    api_gen_params gen;     /* checked by api_gen_params_check */
    /* GRPC_M_TOKENIZE: text (NULL with messages); GRPC_M_HC_*: the service name ("" the server) */
    const char *text;
    bool add_special;
    /* GRPC_M_GENERATE (chat) / GRPC_M_TOKENIZE (messages): the cJSON messages array */
    cJSON *messages;
} grpc_request;

/* Decodes and validates a request message of method. On failure MLA_ERR (the call's status is
 * INVALID_ARGUMENT) with param (the field, may be "") and err. */
int grpc_request_decode(int method, const uint8_t *payload, size_t len, grpc_request *out, char param[48],
                        mla_err *err);
void grpc_request_free(grpc_request *r);

#endif
