/* pbapi_server: the protobuf API (proto/api.proto, frames as in common/apiclient.h) on TCP, on
 * the same libuv loop as the HTTP API, through the same api_server (validation, tokenizer, chat
 * template, detokenization, stop strings, scheduler, metrics).
 *
 * Per connection: any number of requests in flight (up to max_inflight), told apart by their
 * request_id; Generate streams one GenerateResponse per token and a last one with the finish
 * reason and usage, or an Error frame. A malformed frame (bad length, oversized, bad protobuf,
 * unknown kind or version, invalid fields, a duplicate request_id) gets an Error frame with
 * request_id 0; then the connection is closed (write side first, the rest of the client's bytes
 * are discarded for up to 2 s) and its requests are cancelled. A client that goes away, or that
 * leaves more than max_write_queue bytes unread, has its connection closed and its requests
 * cancelled. Authentication: when the api_server has a key, Hello.api_key (once) or each
 * request's api_key; a wrong Hello key closes the connection, a request without a good key gets
 * ERROR_UNAUTHENTICATED and its connection is closed (Health needs none); an address with too
 * many wrong keys gets ERROR_RESOURCE_EXHAUSTED (api_server_auth).
 * Limits: until a Hello with the key (when a key is set) frames may carry max_preauth_frame
 * bytes; a frame not complete within frame_timeout_ms of its first byte gets BAD_FRAME and the
 * connection closes; a connection with no request in flight and no traffic for idle_timeout_ms
 * is closed; a new connection beyond max_conns closes the connection idle longest, or when none
 * is idle gets UNAVAILABLE and is closed; partial frames over all connections beyond max_buffered_total: the connection that
 * goes over gets UNAVAILABLE and is closed.
 *
 * Threads: loop thread only. Ownership: pbapi_server_init / pbapi_server_free (after
 * pbapi_server_close; free runs the loop until the close callbacks are done). The api_server
 * must outlive it. */
#ifndef PBAPI_SERVER_H
#define PBAPI_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/mla_err.h"
#include "coordinator/api_server.h"

typedef struct pbapi_config {
    uint32_t max_frame;      /* largest payload accepted (default APICLIENT_MAX_FRAME_DEFAULT) */
    int max_conns;           /* open connections (default 1024) */
    int max_inflight;        /* requests in flight per connection (default 256) */
    size_t max_write_queue;  /* bytes queued to a client before it is dropped (default 8 MiB) */
    unsigned idle_timeout_ms;    /* no request in flight, nothing received or sent: closed (60 s) */
    unsigned frame_timeout_ms;   /* a frame not complete this long after its first byte (30 s) */
    uint32_t max_preauth_frame;  /* largest payload before a Hello with the key, when a key is set (64 KiB) */
    size_t max_buffered_total;   /* partial-frame bytes over all connections (256 MiB) */
} pbapi_config;

void pbapi_config_default(pbapi_config *c);

typedef struct pbapi_server pbapi_server;

int pbapi_server_init(pbapi_server **out, uv_loop_t *loop, api_server *api, const pbapi_config *cfg, mla_err *err);
/* Binds and listens; port 0 picks a free one, *bound_port (may be NULL) gets the real one. */
int pbapi_server_listen(pbapi_server *s, const char *host, int port, int *bound_port, mla_err *err);
/* Stops listening and closes every connection (their requests are cancelled). */
void pbapi_server_close(pbapi_server *s);
void pbapi_server_free(pbapi_server *s);
int pbapi_server_n_conns(const pbapi_server *s);

#endif
