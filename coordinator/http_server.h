/* http_server: an HTTP/1.1 server on a libuv loop (keep-alive, pipelining one request at a time,
 * chunked streaming responses, limits and timeouts).
 *
 * Every function here runs on the loop thread. A complete request is handed to the handler;
 * the handler answers now or later (from the loop thread) with exactly one of
 * http_respond(...) or http_stream_begin(...) + http_stream_write(...)* + http_stream_end().
 * While a request is outstanding, further bytes from the client are buffered (not parsed); an
 * end of stream or a reset from the client, a slow reader (more than max_write_queue bytes not
 * taken for write_timeout_ms) or server shutdown closes the connection, and then the abort
 * callback (http_conn_on_abort) runs once: after it the http_conn pointer is gone.
 *
 * Limits: http_limits (URL, headers, body) answer 414/431/413 and close; a request whose
 * headers are not complete within header_timeout_ms, or that is not complete within
 * request_timeout_ms, of its first byte gets 408; an idle keep-alive connection is closed after
 * idle_timeout_ms; a new connection beyond max_conns closes the connection idle longest between
 * requests, or when every connection is busy gets 503 and is closed; a request whose body would
 * take the bodies buffered over all connections past max_body_total gets 503 and is closed.
 * One response is never cut for its size: a client counts as slow only when more than
 * 4 x max_write_queue bytes of earlier writes are still queued, or when more than
 * max_write_queue bytes make no progress for write_timeout_ms.
 * HEAD is answered as GET without the body (the handler sees method HEAD and answers as for
 * GET). A streamed response to an HTTP/1.0 request is sent without chunked encoding and ends
 * with the connection.
 *
 * Ownership: http_server_init / http_server_free (after http_server_close and the loop has run
 * the close callbacks: http_server_free runs the loop itself until they are done). Connections
 * are owned by the server. */
#ifndef HTTP_SERVER_H
#define HTTP_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#include "common/mla_err.h"
#include "coordinator/http_req.h"

typedef struct http_server http_server;
typedef struct http_conn http_conn;

/* The early hook: runs once per request when its headers are complete, before the body is
 * read (a request that arrives whole in one read may have its body buffered already). Return
 * true to go on; to refuse the request now, answer it with http_respond (the connection then
 * closes: the unread body is discarded) and return false. */
typedef bool (*http_early_fn)(void *ud, http_conn *c, const http_head *h);

/* The shape of a request's error answers, the server's own (parse errors, limits) and the
 * handler's: HTTP_ERRORS_OPENAI {"error":{"message","type","param","code"}}, or
 * HTTP_ERRORS_ANTHROPIC, Anthropic's {"type":"error","error":{"type","message"}} with its type
 * names (http_error_type; param and code kept beside them). */
enum http_error_form { HTTP_ERRORS_OPENAI, HTTP_ERRORS_ANTHROPIC };
/* A request's form from its URL (origin or absolute form; as far as it was read where the request
 * fails before its headers end) */
typedef enum http_error_form (*http_error_form_fn)(void *ud, const char *url);

typedef struct http_server_config {
    http_limits lim;
    int max_conns;                /* open connections */
    unsigned idle_timeout_ms;     /* keep-alive idle */
    unsigned request_timeout_ms;  /* first byte to complete request */
    size_t max_write_queue;       /* bytes queued to a client before it counts as slow */
    unsigned write_timeout_ms;    /* a slow client making no progress this long is dropped */
    size_t max_pending;           /* bytes buffered from a client while a request is outstanding */
    unsigned header_timeout_ms;   /* first byte to the end of the headers (0: request_timeout_ms) */
    size_t max_body_total;        /* request body bytes buffered over all connections */
    http_early_fn early;          /* NULL: none (ud is the handler's) */
    http_error_form_fn error_form; /* NULL: every request's errors in OpenAI's form (ud: the handler's) */
    /* CORS: NULL or "": off (no CORS headers; OPTIONS goes to the handler); "*": any origin;
     * else origins separated by commas, spaces around them ignored ("https://ui.example:8443"),
     * matched without case. A
     * request whose Origin is allowed gets Access-Control-Allow-Origin (that origin, or "*") on its
     * response; an OPTIONS from one is answered 204 here (a preflight: methods GET, HEAD, POST, the
     * headers asked for) without reaching the early hook's key check or the handler. */
    const char *cors_origins;
    /* Probes past max_conns: up to probe_conns more connections are taken when every place is
     * held, each to answer a GET or HEAD of one of probe_paths (NULL-terminated; NULL: none), any
     * other request on them a 503 "too many open connections" (so that a liveness probe of a
     * server full of clients still gets its answer). */
    const char *const *probe_paths;
    int probe_conns;
    /* one info line a response as its status line goes out: the client's address, the method and
     * path, the status, the time since the request's first byte (a stream's: to its first byte);
     * false: none (such lines at --log-level debug still) */
    bool access_log;
} http_server_config;

#define HTTP_CORS_ORIGIN_MAX 256 /* longer Origin / Access-Control-Request-Headers values are not echoed */

/* Defaults: http_limits_default, 1024 connections, idle 60 s, headers 10 s, request 30 s,
 * write queue 1 MiB, write timeout 30 s, pending 1 MiB, bodies over all connections 256 MiB,
 * the access log on. */
void http_server_config_default(http_server_config *c);

typedef void (*http_handler_fn)(void *ud, http_conn *c, const http_request *req);

/* Whether cors_origins is "*" alone or a list of origins as browsers send them
 * (scheme://host[:port], the scheme a letter then letters, digits, '+', '-' or '.', no path, no
 * trailing '/', no user part, at most HTTP_CORS_ORIGIN_MAX bytes each): an entry that could never
 * equal an Origin header is refused naming it, rather than left to refuse every page. NULL or "" pass. */
int http_cors_origins_check(const char *cors_origins, mla_err *err);
/* cfg->cors_origins must pass http_cors_origins_check (the error names the entry). */
int http_server_init(http_server **out, uv_loop_t *loop, const http_server_config *cfg,
                     http_handler_fn handler, void *ud, mla_err *err);
/* Binds and listens; port 0 picks a free one, *bound_port (may be NULL) gets the real one. */
int http_server_listen(http_server *s, const char *host, int port, int *bound_port, mla_err *err);
/* Stops listening and closes every connection (abort callbacks run for outstanding requests). */
void http_server_close(http_server *s);
void http_server_free(http_server *s);
int http_server_n_conns(const http_server *s);
/* The responses it began (their status lines written: the handler's and its own 4xx / 5xx), by
 * class: by_class[1] 1xx .. [5] 5xx ([0] unused) */
void http_server_responses(const http_server *s, uint64_t by_class[6]);
/* Response bytes handed to the sockets and not yet taken by the clients */
size_t http_server_out_pending(const http_server *s);

/* A whole response. extra_headers: "Name: value\r\n" lines or NULL. */
void http_respond(http_conn *c, int status, const char *content_type, const char *body,
                  size_t len, const char *extra_headers);
/* A streaming (chunked) response. */
void http_stream_begin(http_conn *c, int status, const char *content_type,
                       const char *extra_headers);
void http_stream_write(http_conn *c, const char *data, size_t len);
void http_stream_end(http_conn *c);
/* fn(ud) runs once if the connection goes away before the response is complete. */
void http_conn_on_abort(http_conn *c, void (*fn)(void *ud), void *ud);
/* The connection closes after the response being prepared (e.g. after a refused key). */
void http_conn_close_after(http_conn *c);
/* The peer address as text (for logs). */
const char *http_conn_peer(const http_conn *c);
/* The form of the current request's error answers (the config's error_form of its URL), for the
 * handler's own */
enum http_error_form http_conn_error_form(const http_conn *c);
/* An error's type: OpenAI's (invalid_request_error, authentication_error, not_found_error,
 * rate_limit_error, server_error) or Anthropic's for the status (permission_error for 403,
 * request_too_large for 413, overloaded_error for 503 and 529, api_error for other 5xx) */
const char *http_error_type(enum http_error_form f, int status);

const char *http_status_text(int status);
/* The path of a URL in origin or absolute form (http://host[:port]/path), NULL where it has none;
 * *len its length without the query, the fragment or trailing slashes (a lone "/" kept) */
const char *http_url_path(const char *url, size_t *len);

#endif
