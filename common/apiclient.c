/* apiclient: see apiclient.h. */
#include "common/apiclient.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* the call in flight */
typedef struct acall {
    int32_t sid;
    const uint8_t *req; /* the length-prefixed request */
    size_t req_len, req_off;
    int (*on_msg)(void *ud, const uint8_t *p, size_t n, mla_err *err); /* non-zero: cancel */
    void *ud;
    uint8_t *in;
    size_t in_len, in_cap;
    bool closed, cancelled, failed, has_status;
    int status;
    char http_status[8];
    char message[512];
    mla_err *err;
} acall;

struct apiclient {
    int fd;
    SSL_CTX *ctx;
    SSL *ssl;
    nghttp2_session *s;
    char authority[300];
    char auth[600];
    int timeout_ms;
    int last_code;
    bool broken;
    acall *cur;
    char *model, *server_version, *build;
    uint32_t max_message;
};

static uint64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static const char *status_name(int code) {
    static const char *const names[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                        "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                        "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                                        "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
    return code >= 0 && code < (int)(sizeof names / sizeof *names) ? names[code] : "?";
}

/* ---- transport ---- */

static int wait_fd(apiclient *c, short ev, uint64_t deadline, mla_err *err) {
    for (;;) {
        int t = -1;
        if (deadline) {
            uint64_t n = now_ms();
            if (n >= deadline) return mla_errf(err, "timed out waiting for the server");
            t = (int)(deadline - n);
        }
        struct pollfd p = {.fd = c->fd, .events = ev};
        int r = poll(&p, 1, t);
        if (r > 0) return MLA_OK;
        if (r < 0 && errno != EINTR) return mla_errf(err, "poll: %s", strerror(errno));
    }
}

static int tls_err(mla_err *err, const char *what) {
    char m[256];
    unsigned long e = ERR_get_error();
    ERR_error_string_n(e, m, sizeof m);
    return mla_errf(err, "TLS %s: %s", what, e ? m : "the connection ended");
}

static int send_all(apiclient *c, const uint8_t *p, size_t n, uint64_t deadline, mla_err *err) {
    while (n > 0) {
        if (c->ssl) {
            int w = SSL_write(c->ssl, p, (int)n);
            if (w <= 0) return tls_err(err, "write");
            p += w;
            n -= (size_t)w;
            continue;
        }
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (wait_fd(c, POLLOUT, deadline, err)) return MLA_ERR;
                continue;
            }
            return mla_errf(err, "sending to the server: %s", strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return MLA_OK;
}

/* Sends everything the HTTP/2 session has ready. */
static int pump_out(apiclient *c, uint64_t deadline, mla_err *err) {
    for (;;) {
        const uint8_t *d;
        ssize_t n = nghttp2_session_mem_send(c->s, &d);
        if (n < 0) return mla_errf(err, "HTTP/2: %s", nghttp2_strerror((int)n));
        if (n == 0) return MLA_OK;
        if (send_all(c, d, (size_t)n, deadline, err)) return MLA_ERR;
    }
}

/* Reads what arrives (waiting up to the deadline) into the HTTP/2 session. */
static int pump_in(apiclient *c, uint64_t deadline, mla_err *err) {
    uint8_t buf[16384];
    ssize_t n;
    if (!c->ssl || !SSL_pending(c->ssl))
        if (wait_fd(c, POLLIN, deadline, err)) return MLA_ERR;
    if (c->ssl) {
        int r = SSL_read(c->ssl, buf, sizeof buf);
        if (r <= 0) {
            int e = SSL_get_error(c->ssl, r);
            if (e == SSL_ERROR_WANT_READ) return MLA_OK;
            if (e == SSL_ERROR_ZERO_RETURN) return mla_errf(err, "the server closed the connection");
            return tls_err(err, "read");
        }
        n = r;
    } else {
        n = recv(c->fd, buf, sizeof buf, 0);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN) return MLA_OK;
            return mla_errf(err, "reading from the server: %s", strerror(errno));
        }
        if (n == 0) return mla_errf(err, "the server closed the connection");
    }
    ssize_t rc = nghttp2_session_mem_recv(c->s, buf, (size_t)n);
    if (rc < 0) return mla_errf(err, "HTTP/2 from the server: %s", nghttp2_strerror((int)rc));
    return MLA_OK;
}

/* ---- HTTP/2 callbacks ---- */

static int on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name, size_t nlen,
                     const uint8_t *value, size_t vlen, uint8_t flags, void *ud) {
    (void)s;
    (void)flags;
    apiclient *c = ud;
    acall *a = c->cur;
    if (!a || f->hd.stream_id != a->sid) return 0;
    if (nlen == 7 && !memcmp(name, ":status", 7)) {
        snprintf(a->http_status, sizeof a->http_status, "%.*s", (int)(vlen < 7 ? vlen : 7), value);
    } else if (nlen == 11 && !memcmp(name, "grpc-status", 11)) {
        a->has_status = true;
        a->status = 0;
        for (size_t i = 0; i < vlen && i < 4; i++) a->status = a->status * 10 + (value[i] - '0');
    } else if (nlen == 12 && !memcmp(name, "grpc-message", 12)) {
        /* percent-decoded */
        size_t o = 0;
        for (size_t i = 0; i < vlen && o + 1 < sizeof a->message; i++) {
            unsigned hi, lo;
            if (value[i] == '%' && i + 2 < vlen && sscanf((const char *)value + i + 1, "%1x%1x", &hi, &lo) == 2) {
                a->message[o++] = (char)(hi << 4 | lo);
                i += 2;
            } else {
                a->message[o++] = (char)value[i];
            }
        }
        a->message[o] = 0;
    }
    return 0;
}

static int on_data(nghttp2_session *s, uint8_t flags, int32_t sid, const uint8_t *data, size_t len, void *ud) {
    (void)flags;
    apiclient *c = ud;
    acall *a = c->cur;
    if (!a || sid != a->sid || a->cancelled || a->failed) return 0;
    if (a->in_len + len > a->in_cap) {
        a->in_cap = (a->in_len + len) * 2;
        a->in = mla_xrealloc(a->in, a->in_cap);
    }
    memcpy(a->in + a->in_len, data, len);
    a->in_len += len;
    size_t off = 0;
    while (a->in_len - off >= 5) {
        const uint8_t *h = a->in + off;
        uint32_t n = (uint32_t)h[1] << 24 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 8 | h[4];
        if (h[0] != 0 || n > APICLIENT_MAX_RECV_MSG) {
            mla_errf(a->err, h[0] ? "the server sent a compressed message" : "the server sent a message of %u bytes", n);
            a->failed = true;
            nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, sid, NGHTTP2_CANCEL);
            return 0;
        }
        if (a->in_len - off - 5 < n) break;
        int r = a->on_msg(a->ud, h + 5, n, a->err);
        off += 5 + n;
        if (r) {
            if (r < 0)
                a->failed = true;
            else
                a->cancelled = true;
            nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, sid, NGHTTP2_CANCEL);
            return 0;
        }
    }
    memmove(a->in, a->in + off, a->in_len - off);
    a->in_len -= off;
    return 0;
}

static int on_close(nghttp2_session *s, int32_t sid, uint32_t code, void *ud) {
    (void)s;
    (void)code;
    apiclient *c = ud;
    if (c->cur && sid == c->cur->sid) c->cur->closed = true;
    return 0;
}

static ssize_t read_req(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t len, uint32_t *flags,
                        nghttp2_data_source *src, void *ud) {
    (void)s;
    (void)sid;
    (void)src;
    apiclient *c = ud;
    acall *a = c->cur;
    size_t n = a->req_len - a->req_off;
    if (n > len) n = len;
    memcpy(buf, a->req + a->req_off, n);
    a->req_off += n;
    if (a->req_off == a->req_len) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

/* ---- calls ---- */

#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), strlen(n), strlen(v), NGHTTP2_NV_FLAG_NONE}

/* One call of path with request q; on_msg sees each response message. */
static int call(apiclient *c, const char *path, const ProtobufCMessage *q,
                int (*on_msg)(void *ud, const uint8_t *p, size_t n, mla_err *err), void *ud, mla_err *err) {
    c->last_code = 0;
    if (c->broken) return mla_errf(err, "the connection to the server is broken");
    size_t n = protobuf_c_message_get_packed_size(q);
    uint8_t *req = mla_xmalloc(n + 5);
    req[0] = 0;
    req[1] = (uint8_t)(n >> 24);
    req[2] = (uint8_t)(n >> 16);
    req[3] = (uint8_t)(n >> 8);
    req[4] = (uint8_t)n;
    protobuf_c_message_pack(q, req + 5);
    acall a = {.req = req, .req_len = n + 5, .on_msg = on_msg, .ud = ud, .err = err};
    char tmo[24];
    /* grpc-timeout has at most 8 digits */
    if (c->timeout_ms <= 99999999)
        snprintf(tmo, sizeof tmo, "%dm", c->timeout_ms);
    else
        snprintf(tmo, sizeof tmo, "%dS", (c->timeout_ms + 999) / 1000);
    nghttp2_nv nva[8] = {NV(":method", "POST"), NV(":scheme", c->ssl ? "https" : "http"), NV(":path", path),
                         NV(":authority", c->authority), NV("content-type", "application/grpc"), NV("te", "trailers")};
    size_t nn = 6;
    if (c->timeout_ms > 0) nva[nn++] = (nghttp2_nv)NV("grpc-timeout", tmo);
    if (c->auth[0]) nva[nn++] = (nghttp2_nv)NV("authorization", c->auth);
    nghttp2_data_provider dp = {.source = {.ptr = NULL}, .read_callback = read_req};
    c->cur = &a;
    a.sid = nghttp2_submit_request(c->s, NULL, nva, nn, &dp, NULL);
    int rc = MLA_OK;
    /* the server's deadline ends the call; this one (a little later) covers a server that is gone */
    uint64_t deadline = c->timeout_ms > 0 ? now_ms() + (uint64_t)c->timeout_ms + 2000 : 0;
    if (a.sid < 0) {
        rc = mla_errf(err, "HTTP/2: %s", nghttp2_strerror(a.sid));
        goto out;
    }
    while (!a.closed) {
        if (pump_out(c, deadline, err) || pump_in(c, deadline, err)) {
            c->broken = true;
            rc = MLA_ERR;
            goto out;
        }
    }
    if (pump_out(c, deadline, err)) {
        c->broken = true;
        rc = MLA_ERR;
        goto out;
    }
    if (a.failed) {
        rc = MLA_ERR;
    } else if (a.cancelled) {
        c->last_code = 1;
        rc = mla_errf(err, "cancelled");
    } else if (!a.has_status) {
        c->last_code = 2;
        rc = mla_errf(err, "the call ended without a gRPC status (HTTP status %s)",
                      a.http_status[0] ? a.http_status : "none");
    } else if (a.status != 0) {
        c->last_code = a.status;
        rc = mla_errf(err, "server error %s: %s", status_name(a.status), a.message);
    }
out:
    c->cur = NULL;
    free(a.in);
    free(req);
    return rc;
}

/* Unpacks the one response message of a unary call. */
typedef struct unary {
    const ProtobufCMessageDescriptor *d;
    ProtobufCMessage *m;
} unary;

static int on_unary(void *ud, const uint8_t *p, size_t n, mla_err *err) {
    unary *u = ud;
    if (u->m) {
        mla_errf(err, "the server sent more than one %s", u->d->name);
        return -1;
    }
    u->m = protobuf_c_message_unpack(u->d, NULL, n, p);
    if (!u->m) {
        mla_errf(err, "the server sent an undecodable %s", u->d->name);
        return -1;
    }
    return 0;
}

static ProtobufCMessage *call_unary(apiclient *c, const char *path, const ProtobufCMessage *q,
                                    const ProtobufCMessageDescriptor *d, mla_err *err) {
    unary u = {d, NULL};
    int rc = call(c, path, q, on_unary, &u, err);
    if (rc == MLA_OK && u.m) return u.m;
    if (rc == MLA_OK) mla_errf(err, "the server sent no %s", d->name);
    if (u.m) protobuf_c_message_free_unpacked(u.m, NULL);
    return NULL;
}

int apiclient_connect(apiclient **out, const char *host, int port, const apiclient_opts *o, mla_err *err) {
    *out = NULL;
    apiclient_opts none = {0};
    if (!o) o = &none;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g) return mla_errf(err, "cannot resolve %s: %s", host, gai_strerror(g));
    int fd = -1, last = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            last = errno;
            continue;
        }
        if (o->timeout_ms > 0) {
            struct timeval tv = {.tv_sec = o->timeout_ms / 1000, .tv_usec = (o->timeout_ms % 1000) * 1000};
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        last = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) return mla_errf(err, "cannot connect to %s:%d: %s", host, port, strerror(last));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    apiclient *c = mla_xcalloc(1, sizeof(*c));
    c->fd = fd;
    c->timeout_ms = o->timeout_ms;
    snprintf(c->authority, sizeof c->authority, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    if (o->api_key && o->api_key[0]) snprintf(c->auth, sizeof c->auth, "Bearer %s", o->api_key);
    if (o->tls) {
        c->ctx = SSL_CTX_new(TLS_client_method());
        SSL_CTX_set_min_proto_version(c->ctx, TLS1_2_VERSION);
        SSL_CTX_set_verify(c->ctx, SSL_VERIFY_PEER, NULL);
        if ((o->tls_ca ? SSL_CTX_load_verify_locations(c->ctx, o->tls_ca, NULL)
                       : SSL_CTX_set_default_verify_paths(c->ctx)) != 1) {
            tls_err(err, o->tls_ca ? o->tls_ca : "CA paths");
            apiclient_close(c);
            return MLA_ERR;
        }
        static const unsigned char alpn[] = {2, 'h', '2'};
        SSL_CTX_set_alpn_protos(c->ctx, alpn, sizeof alpn);
        c->ssl = SSL_new(c->ctx);
        SSL_set_fd(c->ssl, fd);
        SSL_set_tlsext_host_name(c->ssl, host);
        SSL_set1_host(c->ssl, host);
        if (SSL_connect(c->ssl) != 1) {
            tls_err(err, "handshake");
            apiclient_close(c);
            return mla_err_prefix(err, "%s:%d", host, port);
        }
        const unsigned char *proto = NULL;
        unsigned plen = 0;
        SSL_get0_alpn_selected(c->ssl, &proto, &plen);
        if (plen != 2 || memcmp(proto, "h2", 2)) {
            apiclient_close(c);
            return mla_errf(err, "%s:%d: the TLS server did not agree to HTTP/2 (ALPN h2)", host, port);
        }
    }
    nghttp2_session_callbacks *cbs;
    nghttp2_session_callbacks_new(&cbs);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_close);
    int rc = nghttp2_session_client_new(&c->s, cbs, c);
    nghttp2_session_callbacks_del(cbs);
    if (rc) {
        apiclient_close(c);
        return mla_errf(err, "HTTP/2: %s", nghttp2_strerror(rc));
    }
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0}, {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1u << 20}};
    nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, iv, 2);
    Mlaapi__InfoRequest q = MLAAPI__INFO_REQUEST__INIT;
    Mlaapi__InfoResponse *r =
        (Mlaapi__InfoResponse *)call_unary(c, "/mlaapi.MlaServe/Info", &q.base, &mlaapi__info_response__descriptor, err);
    if (!r) {
        apiclient_close(c);
        return mla_err_prefix(err, "%s:%d", host, port);
    }
    c->model = mla_xstrdup(r->model ? r->model : "");
    c->server_version = mla_xstrdup(r->server_version ? r->server_version : "");
    c->build = mla_xstrdup(r->build ? r->build : "");
    c->max_message = r->has_max_message ? r->max_message : 0;
    mlaapi__info_response__free_unpacked(r, NULL);
    *out = c;
    return MLA_OK;
}

void apiclient_close(apiclient *c) {
    if (!c) return;
    if (c->s) nghttp2_session_del(c->s);
    if (c->ssl) {
        SSL_shutdown(c->ssl);
        SSL_free(c->ssl);
    }
    SSL_CTX_free(c->ctx);
    if (c->fd >= 0) close(c->fd);
    free(c->model);
    free(c->server_version);
    free(c->build);
    free(c);
}

int apiclient_last_code(const apiclient *c) { return c->last_code; }
const char *apiclient_server_model(const apiclient *c) { return c->model ? c->model : ""; }
const char *apiclient_server_version(const apiclient *c) { return c->server_version ? c->server_version : ""; }
const char *apiclient_server_build(const apiclient *c) { return c->build ? c->build : ""; }
uint32_t apiclient_server_max_message(const apiclient *c) { return c->max_message; }

static void append(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *buf = mla_xrealloc(*buf, *cap);
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
}

typedef struct gen_state {
    apiclient_gen_result *res;
    size_t cap, cap_ids;
    apiclient_token_fn fn;
    void *ud;
    bool done;
} gen_state;

static int on_gen_msg(void *ud, const uint8_t *p, size_t n, mla_err *err) {
    gen_state *g = ud;
    apiclient_gen_result *res = g->res;
    Mlaapi__GenerateResponse *r = mlaapi__generate_response__unpack(NULL, n, p);
    if (!r) {
        mla_errf(err, "the server sent an undecodable GenerateResponse");
        return -1;
    }
    const char *txt = r->text ? r->text : "";
    size_t tl = strlen(txt);
    if (tl) append(&res->text, &res->text_len, &g->cap, txt, tl);
    int stop = 0;
    if (r->has_token_id) {
        if (res->n_ids == g->cap_ids) {
            g->cap_ids = g->cap_ids ? g->cap_ids * 2 : 64;
            res->ids = mla_xrealloc(res->ids, g->cap_ids * sizeof(int32_t));
        }
        res->ids[res->n_ids++] = r->token_id;
        if (g->fn) {
            int32_t top_ids[64];
            float top_lps[64];
            size_t nt = r->n_top_logprobs < 64 ? r->n_top_logprobs : 64;
            for (size_t k = 0; k < nt; k++) {
                top_ids[k] = r->top_logprobs[k]->token_id;
                top_lps[k] = r->top_logprobs[k]->logprob;
            }
            apiclient_token t = {.index = r->index, .id = r->token_id, .text = txt, .text_len = tl,
                                 .has_logprob = r->has_logprob, .logprob = r->logprob, .n_top = nt,
                                 .top_ids = top_ids, .top_logprobs = top_lps};
            stop = g->fn(g->ud, &t);
        }
    }
    if (r->finish_reason) {
        snprintf(res->finish_reason, sizeof(res->finish_reason), "%s", r->finish_reason);
        if (r->usage) {
            res->prompt_tokens = r->usage->prompt_tokens;
            res->completion_tokens = r->usage->completion_tokens;
        }
        g->done = true;
    }
    mlaapi__generate_response__free_unpacked(r, NULL);
    return stop ? 1 : 0;
}

int apiclient_generate(apiclient *c, const apiclient_gen_params *p, apiclient_token_fn fn, void *ud,
                       apiclient_gen_result *res, mla_err *err) {
    memset(res, 0, sizeof(*res));
    Mlaapi__GenerateRequest q = MLAAPI__GENERATE_REQUEST__INIT;
    Mlaapi__ChatMessage m = MLAAPI__CHAT_MESSAGE__INIT, *mp = &m;
    q.model = (char *)p->model;
    if (p->prompt_ids) {
        q.n_prompt_ids = p->n_prompt_ids;
        q.prompt_ids = (int32_t *)p->prompt_ids;
    } else if (p->chat) {
        m.role = "user";
        m.content = (char *)(p->prompt ? p->prompt : "");
        q.n_messages = 1;
        q.messages = &mp;
    } else {
        q.prompt = (char *)(p->prompt ? p->prompt : "");
    }
    if (p->max_tokens > 0) {
        q.has_max_tokens = true;
        q.max_tokens = p->max_tokens;
    }
    q.has_temperature = p->has_temperature;
    q.temperature = p->temperature;
    q.has_top_p = p->has_top_p;
    q.top_p = p->top_p;
    q.has_top_k = p->has_top_k;
    q.top_k = p->top_k;
    q.has_seed = p->has_seed;
    q.seed = p->seed;
    q.n_stop = p->n_stop;
    q.stop = (char **)p->stop;
    q.has_ignore_eos = p->ignore_eos;
    q.ignore_eos = p->ignore_eos;
    q.has_logprobs = p->logprobs;
    q.logprobs = p->logprobs;
    q.has_top_logprobs = p->top_logprobs > 0;
    q.top_logprobs = p->top_logprobs;
    gen_state g = {.res = res, .fn = fn, .ud = ud};
    if (call(c, "/mlaapi.MlaServe/Generate", &q.base, on_gen_msg, &g, err) != MLA_OK) goto fail;
    if (!g.done) {
        mla_errf(err, "the server ended the stream without a final GenerateResponse");
        goto fail;
    }
    if (!res->text) append(&res->text, &res->text_len, &g.cap, "", 0);
    return MLA_OK;
fail:
    apiclient_gen_result_free(res);
    return MLA_ERR;
}

void apiclient_gen_result_free(apiclient_gen_result *res) {
    free(res->text);
    free(res->ids);
    memset(res, 0, sizeof(*res));
}

int apiclient_tokenize(apiclient *c, const char *text, bool add_special, int32_t **ids, size_t *n,
                       mla_err *err) {
    *ids = NULL;
    *n = 0;
    Mlaapi__TokenizeRequest q = MLAAPI__TOKENIZE_REQUEST__INIT;
    q.text = (char *)text;
    q.has_add_special_tokens = true;
    q.add_special_tokens = add_special;
    Mlaapi__TokenizeResponse *r = (Mlaapi__TokenizeResponse *)call_unary(
        c, "/mlaapi.MlaServe/Tokenize", &q.base, &mlaapi__tokenize_response__descriptor, err);
    if (!r) return MLA_ERR;
    *n = r->n_ids;
    *ids = mla_xmalloc((r->n_ids ? r->n_ids : 1) * sizeof(int32_t));
    if (r->n_ids) memcpy(*ids, r->ids, r->n_ids * sizeof(int32_t));
    mlaapi__tokenize_response__free_unpacked(r, NULL);
    return MLA_OK;
}

int apiclient_health(apiclient *c, bool *ok, char *status, size_t cap, mla_err *err) {
    Mlaapi__HealthRequest q = MLAAPI__HEALTH_REQUEST__INIT;
    Mlaapi__HealthResponse *r = (Mlaapi__HealthResponse *)call_unary(c, "/mlaapi.MlaServe/Health", &q.base,
                                                                     &mlaapi__health_response__descriptor, err);
    if (!r) return MLA_ERR;
    *ok = r->has_ok && r->ok;
    if (status && cap) snprintf(status, cap, "%s", r->status ? r->status : "");
    mlaapi__health_response__free_unpacked(r, NULL);
    return MLA_OK;
}

int apiclient_models(apiclient *c, apiclient_model **models, size_t *n, mla_err *err) {
    *models = NULL;
    *n = 0;
    Mlaapi__ModelsRequest q = MLAAPI__MODELS_REQUEST__INIT;
    Mlaapi__ModelsResponse *r = (Mlaapi__ModelsResponse *)call_unary(c, "/mlaapi.MlaServe/Models", &q.base,
                                                                     &mlaapi__models_response__descriptor, err);
    if (!r) return MLA_ERR;
    *models = mla_xcalloc(r->n_models ? r->n_models : 1, sizeof(**models));
    for (size_t i = 0; i < r->n_models; i++) {
        (*models)[i].id = mla_xstrdup(r->models[i]->id ? r->models[i]->id : "");
        (*models)[i].owned_by = mla_xstrdup(r->models[i]->owned_by ? r->models[i]->owned_by : "");
        (*models)[i].max_model_len = r->models[i]->has_max_model_len ? r->models[i]->max_model_len : 0;
    }
    *n = r->n_models;
    mlaapi__models_response__free_unpacked(r, NULL);
    return MLA_OK;
}

void apiclient_models_free(apiclient_model *models, size_t n) {
    for (size_t i = 0; models && i < n; i++) {
        free(models[i].id);
        free(models[i].owned_by);
    }
    free(models);
}
