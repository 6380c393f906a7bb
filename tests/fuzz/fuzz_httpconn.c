/* libFuzzer target for the HTTP connection layer (coordinator/http_server.c) and the streaming
 * response framing: the real server on a libuv loop over a loopback TCP connection. The input
 * is one client's byte stream, sent in pieces whose sizes come from the input; between pieces
 * the client reads, or stops reading for a while (its receive buffer is small, so the server's
 * writes go partial and queue). The handler answers by path: /s streams (chunked, or plain to an
 * HTTP/1.0 client) pieces of the body, /b answers a large body, /d answers later (a timer), the
 * rest echoes the body; HEAD gets headers only. Everything the server sends must parse as a
 * sequence of HTTP responses (http-parser, response mode, HEAD-aware), at most one per request
 * sent, and the server must not crash, leak or hang. Deterministic in ctest (-runs=N -seed=1).
 * tests/fuzz/replay_main.c replays the corpus (tests/data/httpconn) without libFuzzer. */
#include <arpa/inet.h>
#include <errno.h>
#include <ctype.h>
#include <fcntl.h>
#include <http_parser.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "coordinator/http_server.h"

static uv_loop_t *loop;
static http_server *srv;
static int port;
static http_limits lim;

typedef struct later {
    uv_timer_t t;
    http_conn *c;
    int kind; /* 0: respond, 1: stream piece */
    size_t left;
    bool gone;
} later;

static later *pending[64];
static int n_pending;

static void later_abort(void *ud) { ((later *)ud)->gone = true; }

static void later_closed(uv_handle_t *h) { free(h->data); }

static void later_fire(uv_timer_t *t) {
    later *l = t->data;
    if (!l->gone) {
        if (l->kind == 0) {
            http_respond(l->c, 200, "text/plain", "later", 5, NULL);
        } else {
            size_t n = l->left > 700 ? 700 : l->left;
            char buf[700];
            memset(buf, 's', n);
            http_stream_write(l->c, buf, n);
            l->left -= n;
            if (l->left) {
                uv_timer_start(&l->t, later_fire, 0, 0);
                return;
            }
            http_stream_end(l->c);
        }
    }
    for (int i = 0; i < n_pending; i++)
        if (pending[i] == l) pending[i] = pending[--n_pending];
    uv_close((uv_handle_t *)&l->t, later_closed);
}

static void defer(http_conn *c, int kind, size_t left) {
    if (n_pending == 64) {
        http_respond(c, 503, "text/plain", "busy", 4, NULL);
        return;
    }
    later *l = calloc(1, sizeof *l);
    l->c = c;
    l->kind = kind;
    l->left = left;
    uv_timer_init(loop, &l->t);
    l->t.data = l;
    pending[n_pending++] = l;
    http_conn_on_abort(c, later_abort, l);
    uv_timer_start(&l->t, later_fire, 1, 0);
}

static void handler(void *ud, http_conn *c, const http_request *r) {
    (void)ud;
    if (!strcmp(r->path, "/s")) {
        http_stream_begin(c, 200, "text/event-stream", NULL);
        http_stream_write(c, r->body, r->body_len);
        defer(c, 1, (r->body_len * 37) % 5000);
    } else if (!strcmp(r->path, "/b")) {
        size_t n = 200000 + r->body_len * 1000;
        char *b = malloc(n);
        memset(b, 'b', n);
        http_respond(c, 200, "text/plain", b, n, NULL);
        free(b);
    } else if (!strcmp(r->path, "/d")) {
        defer(c, 0, 0);
    } else {
        http_respond(c, 200, "application/octet-stream", r->body, r->body_len, "X-Echo: 1\r\n");
    }
}

static bool early(void *ud, http_conn *c, const http_head *h) {
    (void)ud;
    if (!strncmp(h->url, "/deny", 5)) {
        http_respond(c, 401, "text/plain", "no", 2, "WWW-Authenticate: Bearer\r\n");
        return false;
    }
    return true;
}

/* paths under /a answer errors in Anthropic's form: both forms of the server's own errors are fuzzed */
static enum http_error_form error_form(void *ud, const char *url) {
    (void)ud;
    size_t n;
    const char *p = http_url_path(url, &n);
    return p && n >= 2 && !strncmp(p, "/a", 2) ? HTTP_ERRORS_ANTHROPIC : HTTP_ERRORS_OPENAI;
}

static void setup(void) {
    loop = malloc(sizeof *loop);
    uv_loop_init(loop);
    http_server_config cfg;
    http_server_config_default(&cfg);
    cfg.lim.max_body = 8192;
    cfg.lim.max_url = 512;
    cfg.lim.max_header_bytes = 2048;
    lim = cfg.lim;
    cfg.max_conns = 4;
    cfg.idle_timeout_ms = 200;
    cfg.header_timeout_ms = 150;
    cfg.request_timeout_ms = 300;
    cfg.cors_origins = "http://a.example,http://b.example"; /* Origin echoed, preflights answered here */
    cfg.max_write_queue = 16384;
    cfg.write_timeout_ms = 300;
    cfg.max_pending = 16384;
    cfg.max_body_total = 20000;
    cfg.early = early;
    cfg.error_form = error_form;
    mla_err err;
    if (http_server_init(&srv, loop, &cfg, handler, NULL, &err) ||
        http_server_listen(srv, "127.0.0.1", 0, &port, &err)) {
        fprintf(stderr, "fuzz_httpconn: %s\n", err.msg);
        abort();
    }
}

/* ---- checking what the server sent ---- */

typedef struct resp_check {
    http_parser p;
    int n_done;
    bool head_next[256]; /* which responses answer HEAD requests */
} resp_check;

static int on_complete(http_parser *p) {
    ((resp_check *)p->data)->n_done++;
    return 0;
}

static int on_headers(http_parser *p) {
    resp_check *rc = p->data;
    return rc->n_done < 256 && rc->head_next[rc->n_done] ? 1 : 0; /* 1: no body (HEAD) */
}

/* The server's loop for a moment, never blocked: UV_RUN_ONCE waits for the next event with no
 * bound, which is the whole input's time when no timer is armed (libFuzzer's timeout). 2 ms a
 * call: the server's timers (at most 300 ms here) fire within the rounds that follow. */
static void wait_loop(void) {
    uv_run(loop, UV_RUN_NOWAIT);
    usleep(2000);
    uv_run(loop, UV_RUN_NOWAIT);
}

static int run_client(const uint8_t *data, size_t size) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    connect(fd, (struct sockaddr *)&sa, sizeof sa);
    for (int i = 0; i < 50; i++) uv_run(loop, UV_RUN_NOWAIT);

    /* the requests as the server will see them (the same parser and limits), to know which
     * answers have no body (HEAD) and how many answers may come */
    resp_check rc;
    memset(&rc, 0, sizeof rc);
    int n_req = 0;
    {
        http_req q;
        http_req_init(&q, &lim);
        size_t o = size ? 1 : 0;
        while (o < size && n_req < 255) {
            o += http_req_feed(&q, (const char *)data + o, size - o);
            if (q.state == HTTP_REQ_DONE) {
                rc.head_next[n_req++] = q.req.method_id == HTTP_HEAD;
                http_req_next(&q);
            } else {
                break;
            }
        }
        n_req++; /* an error or a timeout answer */
        http_req_free(&q);
    }
    http_parser_init(&rc.p, HTTP_RESPONSE);
    rc.p.data = &rc;
    http_parser_settings st;
    http_parser_settings_init(&st);
    st.on_message_complete = on_complete;
    st.on_headers_complete = on_headers;

    size_t step = size ? (size_t)(data[0] % 64) + 1 : 1;
    size_t off = size ? 1 : 0;
    bool reading = true;
    bool closed = false, parse_err = false;
    char buf[65536];
    int idle_rounds = 0;
    for (int round = 0; round < 4000 && !closed; round++) {
        if (off < size) {
            size_t n = size - off < step ? size - off : step;
            ssize_t w = send(fd, data + off, n, MSG_NOSIGNAL);
            if (w > 0) {
                /* the byte after each piece decides whether the client reads for a while */
                reading = data[off] % 5 != 0;
                off += (size_t)w;
            } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
                off = size; /* the server closed */
            }
        } else {
            reading = true;
        }
        uv_run(loop, UV_RUN_NOWAIT);
        if (reading) {
            ssize_t r = recv(fd, buf, sizeof buf, 0);
            if (r == 0) closed = true;
            else if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) closed = true;
            else if (r > 0 && !parse_err) {
                size_t used = http_parser_execute(&rc.p, &st, buf, (size_t)r);
                if (HTTP_PARSER_ERRNO(&rc.p) != HPE_OK || used != (size_t)r) parse_err = true;
            }
            if (r > 0) idle_rounds = 0;
            if (r < 0 && off == size && ++idle_rounds > 50) {
                /* nothing arrives: let the server's timers (deferred answers, timeouts) run; after a
                 * while end the client's side (a half-close ends what is still outstanding) */
                wait_loop();
                if (idle_rounds == 60) shutdown(fd, SHUT_WR);
            }
        }
    }
    /* (the end of the stream is not checked: a response may be cut by a close for a client
     * that stopped reading, which is the server's right) */
    close(fd);
    for (int i = 0; i < 1000 && http_server_n_conns(srv) > 0; i++) wait_loop();
    if (parse_err) {
        fprintf(stderr, "fuzz_httpconn: the server's answer is not valid HTTP: %s\n",
                http_errno_description(HTTP_PARSER_ERRNO(&rc.p)));
        abort();
    }
    if (rc.n_done > n_req + 1) {
        fprintf(stderr, "fuzz_httpconn: %d responses to %d requests\n", rc.n_done, n_req);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!loop) setup();
    if (size > 20000) return 0;
    run_client(data, size);
    if (http_server_n_conns(srv) != 0) {
        fprintf(stderr, "fuzz_httpconn: a connection outlived its client\n");
        abort();
    }
    return 0;
}
