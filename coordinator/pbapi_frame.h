/* pbapi_frame: the protobuf API's server-side decoding (proto/api.proto; frame format in
 * common/apiclient.h): a framer that cuts a byte stream into frames, and the decoding and
 * validation of one client frame into a request the server can act on. Pure (no I/O, no
 * tokenizer): shared by the server (pbapi_server) and the fuzz target (tests/fuzz/fuzz_pbframe.c).
 *
 * Ownership: pbapi_framer_init / pbapi_framer_free; pbapi_request_decode fills a struct the
 * caller frees with pbapi_request_free (also after a failed decode). Pointers into a request
 * (api_key, text, gen.messages) live as long as the request. */
#ifndef PBAPI_FRAME_H
#define PBAPI_FRAME_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api.pb-c.h"
#include "common/apiclient.h"
#include "common/mla_err.h"
#include "coordinator/api_params.h"

typedef struct pbapi_framer {
    uint8_t *buf;
    size_t off, len, cap; /* unconsumed bytes are buf[off, len) */
    uint32_t max_payload;
} pbapi_framer;

void pbapi_framer_init(pbapi_framer *f, uint32_t max_payload);
void pbapi_framer_free(pbapi_framer *f);
void pbapi_framer_feed(pbapi_framer *f, const void *data, size_t n);
/* The next complete frame: returns 1 with *kind and the payload (valid until the next feed or
 * next call), 0 when more bytes are needed, -1 on a malformed header (*code: the ErrorCode,
 * err: why; the stream cannot be resynchronised). */
int pbapi_framer_next(pbapi_framer *f, int *kind, const uint8_t **payload, size_t *len, int *code, mla_err *err);

typedef struct pbapi_request {
    int kind;               /* Mlaapi__FrameKind (a client kind) */
    uint64_t request_id;    /* 0 only for Hello */
    const char *api_key;    /* NULL when absent */
    ProtobufCMessage *msg;  /* the unpacked message */
    /* FRAME_GENERATE */
    api_gen_params gen;     /* checked by api_gen_params_check */
    /* FRAME_TOKENIZE */
    const char *text;
    bool add_special;
    /* FRAME_GENERATE (chat) / FRAME_TOKENIZE (messages): the cJSON messages array */
    cJSON *messages;
    /* FRAME_CANCEL: the request to cancel (= request_id) */
} pbapi_request;

/* Decodes and validates a client frame. On failure MLA_ERR with *code (ErrorCode: bad
 * protobuf, invalid field, bad frame for a server-only kind), param (the field, may be "") and
 * err. */
int pbapi_request_decode(int kind, const uint8_t *payload, size_t len, pbapi_request *out, int *code,
                         char param[48], mla_err *err);
void pbapi_request_free(pbapi_request *r);

#endif
