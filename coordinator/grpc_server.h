/* grpc_server: the gRPC API (proto/api.proto service mlaapi.MlaServe and the standard
 * grpc.health.v1.Health, docs/grpc.md) on TCP (h2c), or TLS with ALPN h2 when a certificate is
 * given, on the same libuv loop as the HTTP API, through the same api_server (validation,
 * tokenizer, chat template, detokenization, stop strings, scheduler, metrics).
 *
 * HTTP/2 and the gRPC framing are grpc_conn's (one per connection); this module does the I/O,
 * TLS, the calls and their deadlines. A call's deadline (grpc-timeout) or its reset by the client
 * (RST_STREAM), or the connection going away, cancels its generation in the scheduler (the path
 * the HTTP API takes when its client leaves). Authentication: when the api_server has a key,
 * every call but the health checks needs `authorization: Bearer <key>` (UNAUTHENTICATED; an
 * address with too many wrong keys gets RESOURCE_EXHAUSTED, api_server_auth).
 * Limits (grpc_config): connections (a new one beyond max_conns closes the connection idle
 * longest, or is refused when none is idle), per-connection limits of grpc_conn and the request
 * bytes buffered over all connections (conn.max_total_buffered), bytes queued to a client that
 * does not read (its connection is closed), a reply held back without progress for
 * stall_timeout_ms (the client reads nothing, or keeps its flow-control window shut: closed),
 * idle connections (no call, no traffic for idle_timeout_ms: closed), the TLS handshake
 * (handshake_timeout_ms).
 *
 * Threads: loop thread only. Ownership: grpc_server_init / grpc_server_free (after
 * grpc_server_close; free runs the loop until the close callbacks are done). The api_server
 * must outlive it. */
#ifndef GRPC_SERVER_H
#define GRPC_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/mla_err.h"
#include "coordinator/api_server.h"
#include "coordinator/grpc_conn.h"

typedef struct grpc_config {
    grpc_conn_limits conn;       /* per connection (grpc_conn_limits_default) */
    int max_conns;               /* open connections (default 1024) */
    size_t max_write_queue;      /* bytes written and not yet taken by the client (default 16 MiB) */
    unsigned idle_timeout_ms;    /* no call in flight, nothing received or sent (60 s) */
    unsigned stall_timeout_ms;   /* a reply held back, none of it taken this long (30 s; 0: never) */
    unsigned handshake_timeout_ms; /* TLS handshake and the HTTP/2 preface (10 s) */
    const char *tls_cert;        /* PEM certificate chain file; NULL: plain h2c */
    const char *tls_key;         /* PEM private key file (with tls_cert) */
} grpc_config;

void grpc_config_default(grpc_config *c);

typedef struct grpc_server grpc_server;

/* Loads the TLS certificate and key when given (MLA_ERR names the file and the reason). */
int grpc_server_init(grpc_server **out, uv_loop_t *loop, api_server *api, const grpc_config *cfg, mla_err *err);
/* Binds and listens; port 0 picks a free one, *bound_port (may be NULL) gets the real one. */
int grpc_server_listen(grpc_server *s, const char *host, int port, int *bound_port, mla_err *err);
/* Stops listening and closes every connection: calls still open are cancelled and end
 * UNAVAILABLE, then the final GOAWAY, each as far as the socket takes it at once. */
void grpc_server_close(grpc_server *s);
void grpc_server_free(grpc_server *s);
int grpc_server_n_conns(const grpc_server *s);
/* Reply bytes not yet taken by the clients (queued for the sockets, or held back by their flow
 * control): a draining server waits for them (up to its drain timeout) before it closes. */
size_t grpc_server_out_pending(const grpc_server *s);
/* The server is draining: every connection, and each one made from now on once it has answered
 * its calls (a notice before any would send a client's call on to another connection, over and
 * over), is told (GOAWAY) that it takes no new calls, so that clients start them elsewhere; a second later the GOAWAY
 * that names the last call taken, and a connection closes once its calls are done. Calls in
 * flight go on. A call a client still sends before that second GOAWAY: Generate ends
 * UNAVAILABLE (the api_server drains), Health and grpc.health.v1 answer NOT_SERVING, Info,
 * Models, Tokenize and Cancel are answered (as the HTTP API's other endpoints while it drains). */
void grpc_server_drain(grpc_server *s);

#endif
