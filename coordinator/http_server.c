/* http_server: see http_server.h. */
#include "coordinator/http_server.h"
#include "coordinator/uvnet.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mla_log.h"

enum conn_state { CS_READING, CS_HANDLING, CS_STREAMING, CS_CLOSING };

struct http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_shutdown_t shut;
    bool lingering;         /* write side shut down, draining the client before closing */
    http_server *srv;
    http_conn *prev, *next;
    enum conn_state state;
    http_req parser;
    char *pending;          /* bytes received, not parsed yet */
    size_t pend_off, pend_len, pend_cap;
    bool keep_alive;        /* of the current request */
    bool close_after_write; /* close once the write queue drains */
    bool in_process;
    bool sent_continue;
    bool request_outstanding;
    bool head_only;         /* the current request is HEAD: headers only */
    bool http10;            /* the current request is HTTP/1.0: no chunked encoding */
    bool raw_stream;        /* streaming without chunked encoding (HTTP/1.0): ends with the close */
    bool early_checked;     /* the early (headers) hook ran for the current request */
    bool probe_only;        /* taken past max_conns: a probe path's GET / HEAD only (cfg.probe_paths) */
    enum http_error_form error_form; /* of the current request's error answers */
    char cors[HTTP_CORS_ORIGIN_MAX + 1]; /* Access-Control-Allow-Origin of the current request, "" none */
    size_t body_counted;    /* this request's body bytes counted in the server's body_bytes */
    uint64_t idle_since;    /* when the connection last went idle (between requests) */
    void (*abort_fn)(void *);
    void *abort_ud;
    uint64_t last_progress_ms; /* last completed write or request start */
    uint64_t req_start_ms;     /* first byte of the current request */
    size_t queued;             /* bytes handed to uv_write, not completed */
    int n_handles_open;
    char peer[64];
};

struct http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    bool listening, closed;
    http_server_config cfg;
    http_handler_fn handler;
    void *ud;
    http_conn *conns;
    int n_conns;
    int n_closing;
    size_t body_bytes;      /* request body bytes buffered over every connection */
    int n_probe;            /* of n_conns, the probe-only ones (taken past max_conns) */
    uint64_t by_class[6];   /* responses begun (status lines written), by class: [1] 1xx .. [5] 5xx */
};

void http_server_config_default(http_server_config *c) {
    http_limits_default(&c->lim);
    c->max_conns = 1024;
    c->probe_paths = NULL;
    c->probe_conns = 0;
    c->idle_timeout_ms = 60000;
    c->request_timeout_ms = 30000;
    c->max_write_queue = 1u << 20;
    c->write_timeout_ms = 30000;
    c->max_pending = 1u << 20;
    c->header_timeout_ms = 10000;
    c->max_body_total = 256u << 20;
    c->early = NULL;
    c->cors_origins = NULL;
    c->access_log = true;
}

/* The next entry of a --cors-origins list at *p, [*b, *e) without the blanks around it ("a, b": the
 * space is not part of b); *p moves past it. False at the list's end. */
static bool cors_entry(const char **p, const char **b, const char **e) {
    if (!**p) return false;
    const char *c = strchr(*p, ','), *end = c ? c : *p + strlen(*p), *s = *p;
    *p = c ? c + 1 : end;
    while (s < end && (*s == ' ' || *s == '\t')) s++;
    while (end > s && (end[-1] == ' ' || end[-1] == '\t')) end--;
    *b = s;
    *e = end;
    return true;
}

/* The CORS answer to the current request's Origin into c->cors: the origin itself where
 * cors_origins lists it (or "*" where it is "*"), else "" (no CORS headers: the browser refuses). */
static void cors_note(http_conn *c) {
    const char *allow = c->srv->cfg.cors_origins, *o = c->parser.origin; /* req.origin: only once complete */
    c->cors[0] = 0;
    if (!allow || !*allow || !o || !*o) return;
    if (!strcmp(allow, "*")) {
        strcpy(c->cors, "*");
        return;
    }
    const size_t n = strlen(o);
    if (n > HTTP_CORS_ORIGIN_MAX) return;
    for (const char *p = allow, *b, *end; cors_entry(&p, &b, &end);) {
        if ((size_t)(end - b) == n && !strncasecmp(b, o, n)) {
            /* an origin is scheme://host[:port]: no CR, LF or other control bytes reach the header */
            for (size_t i = 0; i < n; i++)
                if ((unsigned char)o[i] < 0x21 || o[i] == 0x7f) return;
            memcpy(c->cors, o, n + 1);
            return;
        }
    }
}

const char *http_status_text(int status) {
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

/* ---- connection lifetime ---- */

static void conn_process(http_conn *c);
static void linger_close(http_conn *c);

static void on_handle_closed(uv_handle_t *h) {
    http_conn *c = h->data;
    if (--c->n_handles_open > 0) return;
    http_server *s = c->srv;
    s->n_closing--;
    http_req_free(&c->parser);
    free(c->pending);
    free(c);
}

static void conn_close(http_conn *c) {
    if (c->state == CS_CLOSING) return;
    bool outstanding = c->request_outstanding;
    c->state = CS_CLOSING;
    c->request_outstanding = false;
    http_server *s = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_conns--;
    if (c->probe_only) s->n_probe--;
    s->n_closing++;
    s->body_bytes -= c->body_counted;
    c->body_counted = 0;
    uv_timer_stop(&c->timer);
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->n_handles_open = 2;
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    if (outstanding && c->abort_fn) {
        void (*fn)(void *) = c->abort_fn;
        c->abort_fn = NULL;
        fn(c->abort_ud);
    }
}

/* ---- writing ---- */

typedef struct wreq {
    uv_write_t w;
    http_conn *c;
    size_t len;
    char data[];
} wreq;

static void on_written(uv_write_t *w, int status) {
    wreq *r = (wreq *)w;
    http_conn *c = r->c;
    c->queued -= r->len;
    free(r);
    if (c->state == CS_CLOSING) return;
    if (status < 0) {
        MLA_DEBUG("http: write to %s failed: %s", c->peer, uv_strerror(status));
        conn_close(c);
        return;
    }
    c->last_progress_ms = uv_now(c->srv->loop);
    if (c->close_after_write && c->queued == 0) linger_close(c);
}

static void conn_write(http_conn *c, const char *a, size_t na, const char *b, size_t nb,
                       const char *d, size_t nd) {
    if (c->state == CS_CLOSING) return;
    size_t len = na + nb + nd;
    wreq *r = mla_xmalloc(sizeof(*r) + len);
    r->c = c;
    r->len = len;
    if (na) memcpy(r->data, a, na);
    if (nb) memcpy(r->data + na, b, nb);
    if (nd) memcpy(r->data + na + nb, d, nd);
    uv_buf_t buf = uv_buf_init(r->data, (unsigned)len);
    if (c->queued == 0) c->last_progress_ms = uv_now(c->srv->loop);
    size_t before = c->queued; /* what the client has not taken of earlier writes */
    c->queued += len;
    int rc = uv_write(&r->w, (uv_stream_t *)&c->tcp, &buf, 1, on_written);
    if (rc < 0) {
        c->queued -= len;
        free(r);
        conn_close(c);
        return;
    }
    if (before > c->srv->cfg.max_write_queue * 4) {
        /* far beyond the slow-client allowance before this write: stop buffering for it now
         * (one large response alone is not a slow client; on_timer judges its progress) */
        MLA_WARN("http: client %s does not read its response; closing", c->peer);
        conn_close(c);
    }
}

static void arm_timer(http_conn *c);
static void on_timer(uv_timer_t *t);

static void on_shutdown(uv_shutdown_t *r, int status) {
    http_conn *c = r->data;
    if (status < 0 && status != UV_ECANCELED && c->state != CS_CLOSING) conn_close(c);
}

/* Closing after a final response: shut the write side down, read and discard what the client
 * still sends until it closes (or 2 s pass), then close. Closing with unread input would reset
 * the connection and could destroy the response before the client reads it. */
static void linger_close(http_conn *c) {
    if (c->state == CS_CLOSING || c->lingering) return;
    c->lingering = true;
    c->shut.data = c;
    if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown) < 0) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_timer, 2000, 0);
}

/* The current request's body no longer counts against max_body_total. */
static void uncount_body(http_conn *c) {
    c->srv->body_bytes -= c->body_counted;
    c->body_counted = 0;
}

/* The response is complete: next request or close. */
static void response_done(http_conn *c) {
    if (c->state == CS_CLOSING) return;
    c->request_outstanding = false;
    c->abort_fn = NULL;
    c->head_only = c->http10 = c->raw_stream = c->early_checked = false;
    c->cors[0] = 0;
    uncount_body(c);
    c->idle_since = uv_now(c->srv->loop);
    if (!c->keep_alive || c->srv->closed) {
        c->close_after_write = true;
        c->state = CS_READING; /* nothing more is parsed; closes when the writes drain */
        if (c->queued == 0) linger_close(c);
        else arm_timer(c);
        return;
    }
    c->state = CS_READING;
    http_req_next(&c->parser);
    c->sent_continue = false;
    arm_timer(c);
    if (!c->in_process) conn_process(c);
}

enum body_framing { BF_LENGTH, BF_CHUNKED, BF_CLOSE };

static int header_block(char *out, size_t cap, int status, const char *ctype, const char *extra, const char *cors,
                        bool keep_alive, enum body_framing bf, size_t len) {
    char lenline[64] = "", corsline[HTTP_CORS_ORIGIN_MAX + 64] = "";
    if (cors && *cors)
        snprintf(corsline, sizeof corsline, "Access-Control-Allow-Origin: %s\r\n%s", cors,
                 strcmp(cors, "*") ? "Vary: Origin\r\n" : "");
    if (bf == BF_CHUNKED)
        snprintf(lenline, sizeof(lenline), "Transfer-Encoding: chunked\r\n");
    else if (bf == BF_LENGTH)
        snprintf(lenline, sizeof(lenline), "Content-Length: %zu\r\n", len);
    /* BF_CLOSE: the body ends when the connection closes (HTTP/1.0 streaming) */
    return snprintf(out, cap,
                    "HTTP/1.1 %d %s\r\n"
                    "Content-Type: %s\r\n"
                    "%s"
                    "Connection: %s\r\n"
                    "%s%s"
                    "\r\n",
                    status, http_status_text(status), ctype ? ctype : "text/plain", lenline,
                    keep_alive ? "keep-alive" : "close", corsline, extra ? extra : "");
}

/* at most n bytes of s for a log line, anything but printable ASCII as '?' */
static void log_clean(char *out, size_t cap, const char *s) {
    size_t j = 0;
    for (; s && *s && j + 1 < cap; s++) out[j++] = *s >= 0x20 && *s < 0x7f && *s != '"' ? *s : '?';
    out[j] = 0;
}

/* A response begins (its status line goes out): counted, and the access log's line. */
static void response_begins(http_conn *c, int status, bool stream) {
    http_server *s = c->srv;
    if (status >= 100 && status < 600) s->by_class[status / 100]++;
    const enum mla_log_level lvl = s->cfg.access_log ? MLA_LOG_INFO : MLA_LOG_DEBUG;
    if (status < 200 || mla_log_level() > lvl) return;
    const http_request *q = &c->parser.req;
    char m[16], p[256];
    log_clean(m, sizeof m, q->method ? q->method : "-");
    log_clean(p, sizeof p, q->path ? q->path : "-");
    const double ms = c->req_start_ms ? (double)(uv_now(s->loop) - c->req_start_ms) : 0;
    mla_log(lvl, "http: %s \"%s %s\" %d, %s%.0f ms", c->peer, m, p, status, stream ? "a stream after " : "", ms);
}

void http_respond(http_conn *c, int status, const char *content_type, const char *body,
                  size_t len, const char *extra_headers) {
    if (c->state == CS_CLOSING) return;
    MLA_ASSERT(c->state == CS_HANDLING);
    response_begins(c, status, false);
    if (c->srv->closed) c->keep_alive = false;
    char head[2048]; /* the base lines, a CORS line (HTTP_CORS_ORIGIN_MAX) and the caller's extra lines */
    int n = header_block(head, sizeof(head), status, content_type, extra_headers, c->cors, c->keep_alive,
                         BF_LENGTH, len);
    MLA_ASSERT(n > 0 && (size_t)n < sizeof(head));
    /* HEAD: the same headers (Content-Length of the body a GET would get), no body */
    conn_write(c, head, (size_t)n, body, c->head_only ? 0 : len, NULL, 0);
    response_done(c);
}

void http_stream_begin(http_conn *c, int status, const char *content_type,
                       const char *extra_headers) {
    if (c->state == CS_CLOSING) return;
    MLA_ASSERT(c->state == CS_HANDLING);
    response_begins(c, status, true);
    char head[2048]; /* the base lines, a CORS line (HTTP_CORS_ORIGIN_MAX) and the caller's extra lines */
    if (c->http10) {
        /* HTTP/1.0 has no chunked encoding: the body runs until the connection closes */
        c->raw_stream = true;
        c->keep_alive = false;
    }
    int n = header_block(head, sizeof(head), status, content_type, extra_headers, c->cors, c->keep_alive,
                         c->raw_stream ? BF_CLOSE : BF_CHUNKED, 0);
    MLA_ASSERT(n > 0 && (size_t)n < sizeof(head));
    c->state = CS_STREAMING;
    conn_write(c, head, (size_t)n, NULL, 0, NULL, 0);
}

void http_stream_write(http_conn *c, const char *data, size_t len) {
    if (c->state == CS_CLOSING || len == 0) return;
    MLA_ASSERT(c->state == CS_STREAMING);
    if (c->raw_stream) {
        conn_write(c, data, len, NULL, 0, NULL, 0);
        return;
    }
    char pre[32];
    int n = snprintf(pre, sizeof(pre), "%zx\r\n", len);
    conn_write(c, pre, (size_t)n, data, len, "\r\n", 2);
}

void http_stream_end(http_conn *c) {
    if (c->state == CS_CLOSING) return;
    MLA_ASSERT(c->state == CS_STREAMING);
    if (!c->raw_stream) conn_write(c, "0\r\n\r\n", 5, NULL, 0, NULL, 0);
    c->state = CS_HANDLING;
    response_done(c);
}

void http_conn_on_abort(http_conn *c, void (*fn)(void *ud), void *ud) {
    c->abort_fn = fn;
    c->abort_ud = ud;
}

const char *http_conn_peer(const http_conn *c) { return c->peer; }

enum http_error_form http_conn_error_form(const http_conn *c) { return c->error_form; }

const char *http_error_type(enum http_error_form f, int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return f == HTTP_ERRORS_ANTHROPIC ? "permission_error" : "invalid_request_error";
    case 404: return "not_found_error";
    case 413: return f == HTTP_ERRORS_ANTHROPIC ? "request_too_large" : "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return f == HTTP_ERRORS_ANTHROPIC ? "overloaded_error" : "server_error";
    default: return status < 500 ? "invalid_request_error" : f == HTTP_ERRORS_ANTHROPIC ? "api_error" : "server_error";
    }
}

void http_conn_close_after(http_conn *c) { c->keep_alive = false; }

/* The error code (a string, as the API's other errors carry) of an answer from the HTTP layer. */
static const char *layer_code(int status) {
    switch (status) {
    case 403: return "origin_not_allowed";
    case 408: return "request_timeout";
    case 411: return "length_required";
    case 413: return "body_too_large";
    case 414: return "uri_too_long";
    case 415: return "content_encoding_not_supported";
    case 431: return "headers_too_large";
    case 501: return "transfer_encoding_not_supported";
    case 503: return "server_busy";
    case 505: return "http_version_not_supported";
    default: return "bad_request";
    }
}

const char *http_url_path(const char *url, size_t *len) {
    const char *u = url;
    if (*u != '/') { /* absolute form: http://host[:port]/path */
        const char *sl = strstr(u, "://");
        u = sl ? strchr(sl + 3, '/') : NULL;
        if (!u) return NULL;
    }
    size_t n = strcspn(u, "?#");
    while (n > 1 && u[n - 1] == '/') n--;
    *len = n;
    return u;
}

/* the current request's error form from its URL as far as it was read */
static void note_error_form(http_conn *c) {
    const http_server *s = c->srv;
    if (s->cfg.error_form && c->parser.url && c->parser.url[0])
        c->error_form = s->cfg.error_form(s->ud, c->parser.url);
}

/* An error answer from the server itself (parse errors, limits), then close; with the CORS header
 * where the request's Origin (if its header came before the error) is allowed, so that a page
 * reads the message (a 413 of a pasted document, say) instead of a bare network error. */
static void respond_error_close(http_conn *c, int status, const char *msg) {
    char body[512];
    cors_note(c);
    note_error_form(c);
    /* 501 answers a request's Transfer-Encoding: the client's to change */
    const char *type = http_error_type(c->error_form, status == 501 ? 400 : status);
    /* msg is our own text (no quotes or backslashes), safe to embed */
    int n = snprintf(body, sizeof(body),
                     "{%s\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":\"%s\"}}",
                     c->error_form == HTTP_ERRORS_ANTHROPIC ? "\"type\":\"error\"," : "", msg, type,
                     layer_code(status));
    if (n < 0 || (size_t)n >= sizeof(body)) n = (int)strlen(body);
    c->keep_alive = false;
    c->state = CS_HANDLING;
    http_respond(c, status, "application/json", body, (size_t)n, NULL);
}

/* A CORS preflight (OPTIONS from an allowed origin) answered here, before any key is asked for
 * (a browser sends none with it): the methods of the API, the headers the browser asked for
 * (printable, at most HTTP_CORS_ORIGIN_MAX bytes; else the two the API reads), cached 10 minutes. */
static void cors_preflight(http_conn *c) {
    const char *want = c->parser.req.ac_request_headers;
    bool ok = want && *want && strlen(want) <= HTTP_CORS_ORIGIN_MAX;
    for (const char *p = want; ok && *p; p++) ok = (unsigned char)*p >= 0x20 && *p != 0x7f;
    char extra[HTTP_CORS_ORIGIN_MAX + 160];
    snprintf(extra, sizeof extra,
             "Access-Control-Allow-Methods: GET, HEAD, POST\r\nAccess-Control-Allow-Headers: %s\r\n"
             "Access-Control-Max-Age: 600\r\n",
             ok ? want : "Authorization, Content-Type");
    http_respond(c, 204, "text/plain", "", 0, extra);
}

/* ---- timers ---- */

static void on_timer(uv_timer_t *t) {
    http_conn *c = t->data;
    if (c->state == CS_CLOSING) return;
    http_server *s = c->srv;
    if (c->state == CS_READING) {
        if (c->close_after_write || c->lingering) {
            conn_close(c);
        } else if (c->parser.started) {
            MLA_DEBUG("http: %s: request not complete in time", c->peer);
            respond_error_close(c, 408, c->parser.headers_done ? "the request was not completed in time"
                                                               : "the request headers were not completed in time");
        } else {
            conn_close(c); /* idle keep-alive */
        }
        return;
    }
    /* handling / streaming: watch for a client that does not take its response */
    uint64_t now = uv_now(s->loop);
    if (c->queued > s->cfg.max_write_queue && now - c->last_progress_ms > s->cfg.write_timeout_ms) {
        MLA_WARN("http: client %s stopped reading (%zu bytes queued); closing", c->peer, c->queued);
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_timer, 1000, 0);
}

static void arm_timer(http_conn *c) {
    http_server *s = c->srv;
    uint64_t ms = 1000;
    if (c->state == CS_READING && !c->close_after_write && !c->lingering) {
        if (!c->parser.started) {
            ms = s->cfg.idle_timeout_ms;
        } else {
            /* headers within header_timeout_ms, the whole request within request_timeout_ms,
             * both counted from the request's first byte */
            uint64_t lim = s->cfg.request_timeout_ms;
            if (!c->parser.headers_done && s->cfg.header_timeout_ms && s->cfg.header_timeout_ms < lim)
                lim = s->cfg.header_timeout_ms;
            uint64_t now = uv_now(s->loop), end = c->req_start_ms + lim;
            ms = end > now ? end - now : 0;
        }
    } else if (c->state == CS_READING) {
        ms = s->cfg.request_timeout_ms;
    }
    if (ms == 0) ms = 1;
    uv_timer_start(&c->timer, on_timer, ms, 0);
}

/* ---- reading ---- */

/* The early hook (headers complete, body not read yet): false when it answered the request. */
static bool run_early(http_conn *c) {
    http_server *s = c->srv;
    c->early_checked = true;
    if (!s->cfg.early) return true;
    http_head h;
    http_req_head(&c->parser, &h);
    bool ka = c->keep_alive;
    c->state = CS_HANDLING;
    c->keep_alive = false; /* an answer now leaves the body unread: the connection closes */
    c->request_outstanding = true;
    c->abort_fn = NULL;
    if (s->cfg.early(s->ud, c, &h)) {
        if (c->state == CS_HANDLING) {
            c->state = CS_READING;
            c->request_outstanding = false;
            c->keep_alive = ka;
        }
        return c->state == CS_READING;
    }
    return false;
}

/* a probe connection's request (headers read): a GET or HEAD of one of cfg.probe_paths, its path
 * read as the router reads it (an absolute URL's path, no query or fragment, trailing slashes
 * left out) */
static bool probe_request(http_conn *c) {
    http_head h;
    http_req_head(&c->parser, &h);
    if (!h.url || (strcmp(h.method, "GET") && strcmp(h.method, "HEAD"))) return false;
    size_t n;
    const char *u = http_url_path(h.url, &n);
    if (!u) return false;
    for (const char *const *p = c->srv->cfg.probe_paths; *p; p++)
        if (strlen(*p) == n && !memcmp(*p, u, n)) return true;
    return false;
}

static void conn_process(http_conn *c) {
    http_server *s = c->srv;
    c->in_process = true;
    while (c->state == CS_READING && !c->close_after_write && c->pend_len > c->pend_off) {
        bool was_started = c->parser.started, had_headers = c->parser.headers_done;
        size_t n = http_req_feed(&c->parser, c->pending + c->pend_off, c->pend_len - c->pend_off);
        c->pend_off += n;
        if (!was_started && c->parser.started) {
            c->req_start_ms = uv_now(s->loop);
            c->error_form = HTTP_ERRORS_OPENAI;
            arm_timer(c); /* header / request timeout from now */
        }
        if (c->parser.state == HTTP_REQ_ERROR) {
            respond_error_close(c, c->parser.err_status, c->parser.err_msg);
            break;
        }
        if (c->parser.body_len > c->body_counted) {
            s->body_bytes += c->parser.body_len - c->body_counted;
            c->body_counted = c->parser.body_len;
            if (s->body_bytes > s->cfg.max_body_total) {
                MLA_WARN("http: request bodies buffered over all connections exceed %zu bytes; refusing %s",
                         s->cfg.max_body_total, c->peer);
                respond_error_close(c, 503, "the server is busy: too much request data in flight; retry later");
                break;
            }
        }
        if (c->parser.headers_done && !c->early_checked && c->probe_only &&
            s->n_conns - s->n_probe < s->cfg.max_conns) { /* a place is free again: an ordinary one */
            c->probe_only = false;
            s->n_probe--;
        }
        if (c->parser.headers_done && !c->early_checked && c->probe_only && !probe_request(c)) {
            MLA_WARN("http: refusing %s: a connection taken past the %d-connection limit for probes asked for "
                     "another path", c->peer, s->cfg.max_conns);
            respond_error_close(c, 503, "too many open connections");
            break;
        }
        if (c->parser.headers_done && !c->early_checked) {
            cors_note(c);
            note_error_form(c);
            /* a browser sends Origin from a page, also where CORS lets it read nothing (a simple
             * POST, no-cors): a page --cors-origins does not list must not drive the model either */
            if (c->parser.origin && c->parser.origin[0] && !c->cors[0]) {
                respond_error_close(c, 403, "a request from a web page whose origin --cors-origins does not list");
                break;
            }
            if (!run_early(c)) break;
            if (!had_headers) arm_timer(c); /* the request timeout now applies */
        }
        if (c->parser.state == HTTP_REQ_MORE) {
            if (c->parser.headers_done && c->parser.req.expect_continue && !c->sent_continue) {
                c->sent_continue = true;
                conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25, NULL, 0, NULL, 0);
            }
            break;
        }
        /* a complete request */
        c->state = CS_HANDLING;
        c->keep_alive = c->parser.req.keep_alive;
        c->head_only = c->parser.req.method_id == HTTP_HEAD;
        c->http10 = c->parser.req.http_major == 1 && c->parser.req.http_minor == 0;
        c->request_outstanding = true;
        c->abort_fn = NULL;
        c->last_progress_ms = uv_now(c->srv->loop);
        uv_timer_start(&c->timer, on_timer, 1000, 0);
        if (c->parser.req.method_id == HTTP_OPTIONS && c->cors[0]) {
            cors_preflight(c);
            continue;
        }
        c->srv->handler(c->srv->ud, c, &c->parser.req);
    }
    if (c->state != CS_CLOSING) {
        /* compact */
        if (c->pend_off == c->pend_len) {
            c->pend_off = c->pend_len = 0;
        } else if (c->pend_off > 0 && c->state == CS_READING) {
            memmove(c->pending, c->pending + c->pend_off, c->pend_len - c->pend_off);
            c->pend_len -= c->pend_off;
            c->pend_off = 0;
        }
    }
    c->in_process = false;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    http_conn *c = h->data;
    (void)suggested;
    size_t want = 65536;
    if (c->pend_cap - c->pend_len < want) {
        if (c->pend_off > 0) {
            memmove(c->pending, c->pending + c->pend_off, c->pend_len - c->pend_off);
            c->pend_len -= c->pend_off;
            c->pend_off = 0;
        }
        if (c->pend_cap - c->pend_len < want) {
            c->pend_cap = c->pend_len + want;
            c->pending = mla_xrealloc(c->pending, c->pend_cap);
        }
    }
    *buf = uv_buf_init(c->pending + c->pend_len, (unsigned)(c->pend_cap - c->pend_len));
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    http_conn *c = st->data;
    (void)buf;
    if (c->state == CS_CLOSING) return;
    if (nread < 0) {
        if (nread != UV_EOF) MLA_DEBUG("http: read from %s: %s", c->peer, uv_strerror((int)nread));
        /* the client went away (or half-closed): an outstanding request is cancelled */
        if (c->state == CS_READING && c->parser.started && nread == UV_EOF && !c->close_after_write) {
            respond_error_close(c, 400, "the connection ended inside a request");
        } else if (!(c->close_after_write && c->queued > 0) || c->lingering) {
            conn_close(c);
        }
        return;
    }
    if (nread == 0) return;
    c->pend_len += (size_t)nread;
    if (c->state != CS_READING) {
        size_t held = c->pend_len - c->pend_off;
        if (held > c->srv->cfg.max_pending) {
            MLA_WARN("http: client %s sent %zu bytes while its request was running; closing", c->peer, held);
            conn_close(c);
        }
        return;
    }
    if (c->close_after_write) {
        c->pend_off = c->pend_len = 0; /* discard */
        return;
    }
    if (!c->parser.started) arm_timer(c);
    conn_process(c);
}

static void on_connection(uv_stream_t *ls, int status) {
    http_server *s = ls->data;
    if (status < 0) {
        MLA_WARN("http: accept: %s", uv_strerror(status));
        return;
    }
    http_conn *c = mla_xcalloc(1, sizeof(*c));
    c->srv = s;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    http_req_init(&c->parser, &s->cfg.lim);
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    c->state = CS_READING;
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) < 0) {
        conn_close(c);
        return;
    }
    uvnet_peer_name(&c->tcp, c->peer, sizeof c->peer);
    uv_tcp_nodelay(&c->tcp, 1);
    c->idle_since = uv_now(s->loop);
    /* the places of max_conns hold the connections but for the probe-only ones (cfg.probe_paths) */
    if (s->n_conns - s->n_probe > s->cfg.max_conns) {
        /* make room by closing the connection idle longest between requests, if any */
        http_conn *old = NULL;
        for (http_conn *o = s->conns; o; o = o->next)
            if (o != c && !o->probe_only && o->state == CS_READING && !o->parser.started && !o->close_after_write &&
                !o->lingering && o->queued == 0 && (!old || o->idle_since < old->idle_since))
                old = o;
        if (old) {
            MLA_DEBUG("http: %d connections open (limit %d); closing idle %s for %s", s->n_conns - 1,
                      s->cfg.max_conns, old->peer, c->peer);
            conn_close(old);
        } else {
            /* else the one longest inside its request head (a client that trickles headers holds
             * a place until the header timeout: many of them would refuse everyone else) */
            for (http_conn *o = s->conns; o; o = o->next)
                if (o != c && !o->probe_only && o->state == CS_READING && o->parser.started && !o->parser.headers_done &&
                    !o->close_after_write && !o->lingering && o->queued == 0 &&
                    (!old || o->idle_since < old->idle_since))
                    old = o;
            if (old) {
                MLA_WARN("http: %d connections open (limit %d); closing %s, still sending its request head, for %s",
                         s->n_conns - 1, s->cfg.max_conns, old->peer, c->peer);
                conn_close(old);
            }
        }
    }
    if (s->n_conns - s->n_probe > s->cfg.max_conns && s->cfg.probe_paths && s->n_probe < s->cfg.probe_conns) {
        c->probe_only = true; /* a place for a probe (/health): refused below if it asks for more */
        s->n_probe++;
    } else if (s->n_conns - s->n_probe > s->cfg.max_conns) {
        MLA_WARN("http: %d connections open (limit %d); refusing %s", s->n_conns - 1, s->cfg.max_conns, c->peer);
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read); /* drained, then closed */
        respond_error_close(c, 503, "too many open connections");
        return;
    }
    arm_timer(c);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

/* one entry of a CORS list, [b, e): scheme://host[:port] */
static bool cors_origin_ok(const char *b, const char *e) {
    const char *p = b;
    if (p == e || !isalpha((unsigned char)*p)) return false;
    while (p < e && (isalnum((unsigned char)*p) || *p == '+' || *p == '-' || *p == '.')) p++;
    if (e - p < 4 || strncmp(p, "://", 3)) return false;
    p += 3;
    const char *host = p;
    if (p < e && *p == '[') { /* an IPv6 literal: hex digits, ':' and '.' */
        for (p++; p < e && *p != ']'; p++)
            if (!isxdigit((unsigned char)*p) && *p != ':' && *p != '.') return false;
        if (p == e || p == host + 1) return false;
        p++;
    }
    while (p < e && *p != ':') {
        if ((unsigned char)*p <= 0x20 || *p == 0x7f || strchr("/?#@[]\\", *p)) return false;
        p++;
    }
    if (p == host) return false;
    if (p < e) { /* :port, 1-65535 */
        long port = 0;
        if (++p == e) return false;
        for (; p < e; p++) {
            if (!isdigit((unsigned char)*p) || (port = port * 10 + (*p - '0')) > 65535) return false;
        }
        if (port == 0) return false;
    }
    return true;
}

int http_cors_origins_check(const char *list, mla_err *err) {
    if (!list || !*list || !strcmp(list, "*")) return MLA_OK;
    for (const char *p = list, *b, *end; cors_entry(&p, &b, &end);) {
        if (end - b == 1 && *b == '*')
            return mla_errf(err, "--cors-origins: '*' (any origin) stands alone, not in a list");
        if (end - b > HTTP_CORS_ORIGIN_MAX || !cors_origin_ok(b, end))
            return mla_errf(err, "--cors-origins: '%.*s' is not an origin as a browser sends it: scheme://host[:port], "
                                 "e.g. https://ui.example:8443 (no path or trailing '/'; origins separated by commas)",
                            (int)(end - b > 120 ? 120 : end - b), b);
    }
    return MLA_OK;
}

int http_server_init(http_server **out, uv_loop_t *loop, const http_server_config *cfg,
                     http_handler_fn handler, void *ud, mla_err *err) {
    *out = NULL;
    if (cfg && http_cors_origins_check(cfg->cors_origins, err)) return MLA_ERR;
    http_server *s = mla_xcalloc(1, sizeof(*s));
    s->loop = loop;
    if (cfg)
        s->cfg = *cfg;
    else
        http_server_config_default(&s->cfg);
    s->handler = handler;
    s->ud = ud;
    *out = s;
    return MLA_OK;
}

int http_server_listen(http_server *s, const char *host, int port, int *bound_port, mla_err *err) {
    if (!host) host = "127.0.0.1";
    uv_tcp_init(s->loop, &s->listener);
    s->listener.data = s;
    s->listening = true;
    int p = 0;
    if (uvnet_listen(&s->listener, host, port, on_connection, &p, err)) return MLA_ERR;
    if (bound_port) *bound_port = p;
    char at[80];
    uvnet_addr_text(at, sizeof at, host, p);
    MLA_INFO("http: listening on %s", at);
    return MLA_OK;
}

static void on_listener_closed(uv_handle_t *h) {
    http_server *s = h->data;
    s->n_closing--;
}

void http_server_close(http_server *s) {
    if (s->closed) return;
    s->closed = true;
    if (s->listening) {
        s->n_closing++;
        uv_close((uv_handle_t *)&s->listener, on_listener_closed);
        s->listening = false;
    }
    while (s->conns) conn_close(s->conns);
}

void http_server_free(http_server *s) {
    if (!s) return;
    http_server_close(s);
    while (s->n_closing > 0) uv_run(s->loop, UV_RUN_ONCE);
    free(s);
}

int http_server_n_conns(const http_server *s) { return s->n_conns; }

void http_server_responses(const http_server *s, uint64_t by_class[6]) {
    memcpy(by_class, s->by_class, sizeof s->by_class);
}

size_t http_server_out_pending(const http_server *s) {
    size_t n = 0;
    for (const http_conn *c = s->conns; c; c = c->next) n += c->queued;
    return n;
}
