/* grpc_conn: one gRPC server connection over HTTP/2 (nghttp2), without I/O: bytes from the
 * client go in (grpc_conn_recv), bytes for the client come out (grpc_conn_take_output). It
 * checks each request (POST, content-type application/grpc, a known :path, the grpc-timeout
 * header, one length-prefixed uncompressed message no larger than max_msg) and answers the bad
 * ones itself with a trailers-only response (UNIMPLEMENTED, INVALID_ARGUMENT,
 * RESOURCE_EXHAUSTED): a bad call fails alone, the connection and its other calls go on. A good
 * request becomes a call (on_call); the owner answers it with messages (grpc_conn_send_msg) and
 * a status (grpc_conn_finish, sent as trailers). A call the client resets (RST_STREAM), or one
 * still open when the connection ends, gets on_cancel. What is not HTTP/2 (a wrong preface,
 * garbage, a protocol error) makes grpc_conn_recv fail: send the output (a GOAWAY) and close.
 *
 * A request's headers are checked as soon as they are in (POST, header bytes, content-type, a
 * known :path, grpc-timeout, then the owner's on_headers: its key): a bad one is answered at
 * once, and its data is dropped rather than buffered.
 *
 * Limits (grpc_conn_limits): request message size, concurrent streams (announced in SETTINGS;
 * more are refused with RST_STREAM REFUSED_STREAM), request header bytes per stream, request
 * bytes buffered over the connection's streams and over every connection sharing a counter (the
 * server's), response bytes queued over its streams.
 *
 * Threads: one thread per connection. Ownership: grpc_conn_init / grpc_conn_free (no callback
 * runs from free). Callbacks run inside grpc_conn_recv (on_call, on_cancel) and may call
 * grpc_conn_send_msg / grpc_conn_finish; they must not free the connection. */
#ifndef GRPC_CONN_H
#define GRPC_CONN_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/mla_err.h"

/* gRPC status codes */
enum {
    GRPC_OK = 0,
    GRPC_CANCELLED = 1,
    GRPC_UNKNOWN = 2,
    GRPC_INVALID_ARGUMENT = 3,
    GRPC_DEADLINE_EXCEEDED = 4,
    GRPC_NOT_FOUND = 5,
    GRPC_RESOURCE_EXHAUSTED = 8,
    GRPC_UNIMPLEMENTED = 12,
    GRPC_INTERNAL = 13,
    GRPC_UNAVAILABLE = 14,
    GRPC_UNAUTHENTICATED = 16,
};
/* "OK", "INVALID_ARGUMENT", ... ("?" when unknown). */
const char *grpc_status_name(int code);

typedef struct grpc_conn_limits {
    uint32_t max_msg;          /* largest request message, bytes (default 4 MiB) */
    uint32_t max_streams;      /* concurrent streams per connection (default 100) */
    uint32_t max_header_bytes; /* request header names + values per stream (default 16 KiB) */
    size_t max_buffered;       /* request bytes buffered over the connection's streams (default 16 MiB) */
    size_t *total_buffered;    /* a counter of request bytes buffered that connections share (the
                                * server's; NULL: none), and its bound (default 256 MiB) */
    size_t max_total_buffered;
    size_t max_out;            /* response bytes queued over its streams (default 8 MiB; one message
                                  * over it alone is taken while nothing else is queued) */
} grpc_conn_limits;

void grpc_conn_limits_default(grpc_conn_limits *l);

typedef struct grpc_call_in {
    int32_t stream_id;
    int method;                /* GRPC_M_* (coordinator/grpc_msg.h) */
    const uint8_t *msg;        /* the request message (valid during the call) */
    size_t len;
    int64_t timeout_ms;        /* what is left of grpc-timeout (counted from the request's headers
                                * where now_ms is given; 0: it has passed), -1 when none (the
                                * authorization metadata: on_headers) */
} grpc_call_in;

typedef struct grpc_conn_cbs {
    void *ud;
    /* A request's headers are in and well-formed: a gRPC status (GRPC_OK: the call goes on) and,
     * for a refusal, its message into msg. two_auth: more than one authorization field (which
     * one to take would be a guess). NULL: every call goes on, but one with two_auth. */
    int (*on_headers)(void *ud, int method, const char *authorization, bool two_auth, char *msg, size_t msg_size);
    void (*on_call)(void *ud, const grpc_call_in *call);
    void (*on_cancel)(void *ud, int32_t stream_id);
    /* The owner's clock in ms: a grpc-timeout counts from the request's headers, and
     * grpc_conn_expire ends a request not complete by then. NULL: from the whole request. */
    uint64_t (*now_ms)(void *ud);
} grpc_conn_cbs;

typedef struct grpc_conn grpc_conn;

int grpc_conn_init(grpc_conn **out, const grpc_conn_limits *lim, const grpc_conn_cbs *cb, mla_err *err);
void grpc_conn_free(grpc_conn *c);
/* Takes bytes from the client. MLA_ERR (err says why): the connection is broken; send what
 * grpc_conn_take_output gives, then close. */
int grpc_conn_recv(grpc_conn *c, const uint8_t *data, size_t n, mla_err *err);
/* Everything ready to be sent: *out malloc'd (caller frees), NULL and 0 when nothing is. */
size_t grpc_conn_take_output(grpc_conn *c, uint8_t **out);
/* Neither side wants more (after a GOAWAY both ways, or a fatal error): close. */
bool grpc_conn_done(const grpc_conn *c);
/* A response message on the call (the response headers go first). MLA_ERR when the call is
 * gone (reset, finished) or its queued output is over max_out (then it is reset). */
int grpc_conn_send_msg(grpc_conn *c, int32_t stream_id, const ProtobufCMessage *m);
/* Ends the call with status and message (may be NULL): trailers after the messages sent. */
void grpc_conn_finish(grpc_conn *c, int32_t stream_id, int status, const char *message);
/* Ends DEADLINE_EXCEEDED each request whose grpc-timeout passed (now: the now_ms clock) before
 * the whole request was in (a client that sends no END_STREAM). Whether any was: output to send. */
bool grpc_conn_expire(grpc_conn *c, uint64_t now);
/* Calls started and not finished or cancelled. */
int grpc_conn_n_calls(const grpc_conn *c);
/* Response bytes queued over the streams and not yet taken (flow control holds them back while
 * the client does not read), finished calls' included. */
size_t grpc_conn_out_pending(const grpc_conn *c);
/* Response message bytes taken into DATA frames so far (what the client's flow control let
 * through): the progress of a reply held back. */
uint64_t grpc_conn_out_sent(const grpc_conn *c);
/* Tells the client no new calls are taken (GOAWAY with the largest stream id, RFC 9113 6.8's
 * notice of a graceful shutdown: calls the client started meanwhile are still taken); calls in
 * flight go on. */
void grpc_conn_shutdown(grpc_conn *c);
/* The GOAWAY after that notice, at least a round trip later: it names the last call taken (later
 * ones are refused, REFUSED_STREAM: a client retries them elsewhere); calls in flight go on, and
 * once none is left grpc_conn_done says so. */
void grpc_conn_last_goaway(grpc_conn *c);
/* The connection is about to close (idle, or evicted): the final GOAWAY (no error), so that the
 * client starts its next call on a new connection rather than failing it. */
void grpc_conn_goaway(grpc_conn *c);

#endif
