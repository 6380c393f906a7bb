/* grpc_conn: see grpc_conn.h. */
#include "coordinator/grpc_conn.h"

#include <nghttp2/nghttp2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "coordinator/grpc_msg.h"

typedef struct gstream {
    struct gstream *prev, *next; /* the connection's streams (nghttp2_session_del calls no callback) */
    int32_t id;
    int method;
    bool bad_method, bad_post, bad_ctype, bad_timeout, too_many_headers;
    bool not_grpc; /* bad_ctype: not application/grpc at all (HTTP 415), else another codec of it */
    bool two_auth; /* more than one authorization field */
    char bad_path[72]; /* bad_method: the :path asked for (its first bytes, printable ASCII) */
    size_t header_bytes;
    char *auth;
    int64_t timeout_ms;
    uint64_t deadline_ms; /* with the owner's clock: when the grpc-timeout passes (0: none) */
    uint8_t *in;
    size_t in_len, in_cap;
    bool replied;  /* answered by this layer (a bad request): later data is dropped */
    bool in_call;  /* handed to on_call, not finished */
    bool started;  /* response headers submitted with the data provider */
    bool finishing;
    int status;
    char *message;
    uint8_t *out;
    size_t out_off, out_len, out_cap;
} gstream;

struct grpc_conn {
    nghttp2_session *s;
    grpc_conn_limits lim;
    grpc_conn_cbs cb;
    size_t buffered; /* request bytes over the streams */
    size_t out;      /* response bytes queued over the streams */
    uint64_t sent;   /* response bytes taken into DATA frames */
    int n_calls;
    gstream *streams;
};

const char *grpc_status_name(int code) {
    static const char *const names[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                        "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                        "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                                        "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
    return code >= 0 && code < (int)(sizeof names / sizeof *names) ? names[code] : "?";
}

void grpc_conn_limits_default(grpc_conn_limits *l) {
    l->max_msg = 4u << 20;
    l->max_streams = 100;
    l->max_header_bytes = 16u << 10;
    l->max_buffered = 16u << 20;
    l->total_buffered = NULL;
    l->max_total_buffered = 256u << 20;
    l->max_out = 8u << 20;
}

/* grpc-message is percent-encoded: bytes outside 0x20..0x7E and '%'. At most 1024 bytes of m,
 * cut before a UTF-8 character that would not fit whole. */
static char *pct_encode(const char *m) {
    size_t n = strlen(m);
    if (n > 1024) {
        n = 1024;
        while (n > 0 && ((unsigned char)m[n] & 0xC0) == 0x80) n--; /* m[n] continues a character */
    }
    char *o = mla_xmalloc(n * 3 + 1), *p = o;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)m[i];
        if (ch < 0x20 || ch > 0x7E || ch == '%')
            p += sprintf(p, "%%%02X", ch);
        else
            *p++ = (char)ch;
    }
    *p = 0;
    return o;
}

#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NONE}

/* request bytes buffered: the connection's and the shared counter */
static void buf_add(grpc_conn *c, size_t n) {
    c->buffered += n;
    if (c->lim.total_buffered) *c->lim.total_buffered += n;
}
static void buf_sub(grpc_conn *c, size_t n) {
    c->buffered -= n;
    if (c->lim.total_buffered) *c->lim.total_buffered -= n;
}

static void stream_free(grpc_conn *c, gstream *st) {
    if (st->prev)
        st->prev->next = st->next;
    else
        c->streams = st->next;
    if (st->next) st->next->prev = st->prev;
    buf_sub(c, st->in_len);
    c->out -= st->out_len - st->out_off;
    free(st->in);
    free(st->out);
    free(st->auth);
    free(st->message);
    free(st);
}

/* A trailers-only response (no message): the call fails with status. */
static void reply_status(grpc_conn *c, gstream *st, int status, const char *msg) {
    if (st->replied) return;
    st->replied = true;
    buf_sub(c, st->in_len);
    st->in_len = 0;
    char code[8];
    snprintf(code, sizeof code, "%d", status);
    char *m = pct_encode(msg ? msg : "");
    nghttp2_nv nva[] = {NV(":status", "200"), NV("content-type", "application/grpc"),
                        NV("grpc-accept-encoding", "identity"), NV("grpc-status", code), NV("grpc-message", m)};
    nghttp2_submit_response(c->s, st->id, nva, msg && msg[0] ? 5 : 4, NULL);
    free(m);
}

/* A plain HTTP answer with no gRPC status (a request that is no gRPC call), the stream ended. */
static void reply_http(grpc_conn *c, gstream *st, const char *status) {
    if (st->replied) return;
    st->replied = true;
    buf_sub(c, st->in_len);
    st->in_len = 0;
    nghttp2_nv nva[] = {NV(":status", status)};
    nghttp2_submit_response(c->s, st->id, nva, 1, NULL);
}

/* ---- request side ---- */

static int on_begin_headers(nghttp2_session *s, const nghttp2_frame *f, void *ud) {
    grpc_conn *c = ud;
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    gstream *st = mla_xcalloc(1, sizeof(*st));
    st->id = f->hd.stream_id;
    st->timeout_ms = -1;
    st->bad_post = true;
    st->bad_ctype = st->not_grpc = true;
    st->next = c->streams;
    if (c->streams) c->streams->prev = st;
    c->streams = st;
    nghttp2_session_set_stream_user_data(s, f->hd.stream_id, st);
    return 0;
}

/* grpc-timeout: 1 to 8 digits and a unit (H M S m u n). */
static int parse_timeout(const uint8_t *v, size_t n, int64_t *ms) {
    if (n < 2 || n > 9) return -1;
    int64_t x = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        if (v[i] < '0' || v[i] > '9') return -1;
        x = x * 10 + (v[i] - '0');
    }
    switch (v[n - 1]) {
    case 'H': x *= 3600000; break;
    case 'M': x *= 60000; break;
    case 'S': x *= 1000; break;
    case 'm': break;
    case 'u': x = (x + 999) / 1000; break;
    case 'n': x = (x + 999999) / 1000000; break;
    default: return -1;
    }
    *ms = x;
    return 0;
}

static bool eq(const uint8_t *a, size_t n, const char *b) { return n == strlen(b) && !memcmp(a, b, n); }
/* the same, ASCII case aside (media types: RFC 9110 8.3.1) */
static bool ieq(const uint8_t *a, size_t n, const char *b) {
    return n == strlen(b) && !strncasecmp((const char *)a, b, n);
}

static int on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name, size_t nlen,
                     const uint8_t *value, size_t vlen, uint8_t flags, void *ud) {
    (void)flags;
    grpc_conn *c = ud;
    if (f->hd.type != NGHTTP2_HEADERS) return 0;
    gstream *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
    if (!st || f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0; /* client trailers: nothing to take */
    st->header_bytes += nlen + vlen + 32;
    if (st->header_bytes > c->lim.max_header_bytes) {
        st->too_many_headers = true;
        return 0;
    }
    if (eq(name, nlen, ":path")) {
        st->method = grpc_method_of_path((const char *)value, vlen);
        st->bad_method = st->method == 0;
        size_t k = 0;
        for (; st->bad_method && k < vlen && k + 1 < sizeof st->bad_path; k++)
            st->bad_path[k] = value[k] >= 0x20 && value[k] < 0x7f ? (char)value[k] : '?';
        st->bad_path[k] = 0;
    } else if (eq(name, nlen, ":method")) {
        st->bad_post = !eq(value, vlen, "POST");
    } else if (eq(name, nlen, "content-type")) {
        /* application/grpc or application/grpc+proto (the messages are protobuf: no +json), any
         * parameters after a ';', in any case */
        const uint8_t *semi = memchr(value, ';', vlen);
        const size_t base = semi ? (size_t)(semi - value) : vlen, g = sizeof "application/grpc" - 1;
        st->bad_ctype = !ieq(value, base, "application/grpc") && !ieq(value, base, "application/grpc+proto");
        st->not_grpc = base < g || !ieq(value, g, "application/grpc") || (base > g && value[g] != '+');
    } else if (eq(name, nlen, "grpc-timeout")) {
        st->bad_timeout = parse_timeout(value, vlen, &st->timeout_ms) != 0;
    } else if (eq(name, nlen, "authorization")) {
        if (st->auth) st->two_auth = true; /* which one to take would be a guess: refused */
        free(st->auth);
        st->auth = mla_xmalloc(vlen + 1);
        memcpy(st->auth, value, vlen);
        st->auth[vlen] = 0;
    }
    return 0;
}

static int on_data_chunk(nghttp2_session *s, uint8_t flags, int32_t sid, const uint8_t *data, size_t len, void *ud) {
    (void)flags;
    grpc_conn *c = ud;
    gstream *st = nghttp2_session_get_stream_user_data(s, sid);
    if (!st || st->replied || st->in_call) return 0;
    if (st->in_len + len > (size_t)c->lim.max_msg + 5) {
        char m[96];
        snprintf(m, sizeof m, "the request message is larger than %u bytes", c->lim.max_msg);
        reply_status(c, st, GRPC_RESOURCE_EXHAUSTED, m);
        return 0;
    }
    if (c->buffered + len > c->lim.max_buffered) {
        reply_status(c, st, GRPC_RESOURCE_EXHAUSTED, "too much request data in flight on this connection");
        return 0;
    }
    if (c->lim.total_buffered && *c->lim.total_buffered + len > c->lim.max_total_buffered) {
        reply_status(c, st, GRPC_RESOURCE_EXHAUSTED, "too much request data in flight on this server");
        return 0;
    }
    if (st->in_len + len > st->in_cap) {
        st->in_cap = (st->in_len + len) * 2;
        st->in = mla_xrealloc(st->in, st->in_cap);
    }
    memcpy(st->in + st->in_len, data, len);
    st->in_len += len;
    buf_add(c, len);
    return 0;
}

/* The request's headers are in: check them (the header bytes first: past them the other fields
 * were not read), then the owner's on_headers. A refusal is answered now; the stream's data is
 * then dropped, not buffered. */
static void headers_done(grpc_conn *c, gstream *st) {
    if (st->replied || st->in_call) return;
    if (st->too_many_headers) {
        char m[96];
        snprintf(m, sizeof m, "request headers are larger than %u bytes", c->lim.max_header_bytes);
        return reply_status(c, st, GRPC_RESOURCE_EXHAUSTED, m);
    }
    if (st->bad_post) return reply_status(c, st, GRPC_UNIMPLEMENTED, "gRPC calls are POST requests");
    /* not gRPC at all: 415, so that a plain HTTP/2 client does not read a 200 (the gRPC spec);
     * gRPC with a codec other than protobuf: UNIMPLEMENTED */
    if (st->bad_ctype && st->not_grpc) return reply_http(c, st, "415");
    if (st->bad_ctype)
        return reply_status(c, st, GRPC_UNIMPLEMENTED, "the messages are protobuf: content-type application/grpc or "
                                                       "application/grpc+proto");
    if (st->bad_method || !st->method) {
        char m[sizeof st->bad_path + 48];
        snprintf(m, sizeof m, "unknown method %s%s", st->bad_path[0] ? st->bad_path : "(no :path)",
                 st->bad_method && strlen(st->bad_path) + 1 == sizeof st->bad_path ? "..." : "");
        return reply_status(c, st, GRPC_UNIMPLEMENTED, m);
    }
    if (st->bad_timeout) return reply_status(c, st, GRPC_INVALID_ARGUMENT, "malformed grpc-timeout header");
    if (!c->cb.on_headers) {
        if (st->two_auth) return reply_status(c, st, GRPC_UNAUTHENTICATED, "more than one authorization header");
        return;
    }
    char m[256] = "";
    const int status = c->cb.on_headers(c->cb.ud, st->method, st->auth, st->two_auth, m, sizeof m);
    if (status != GRPC_OK) return reply_status(c, st, status, m);
    if (st->timeout_ms >= 0 && c->cb.now_ms) st->deadline_ms = (c->cb.now_ms(c->cb.ud) + (uint64_t)st->timeout_ms) | 1;
}

/* The request is complete (END_STREAM): check its message, hand it on. */
static void request_done(grpc_conn *c, gstream *st) {
    if (st->replied || st->in_call) return;
    if (st->in_len < 5) return reply_status(c, st, GRPC_INVALID_ARGUMENT, "the request has no message");
    if (st->in[0] != 0)
        return reply_status(c, st, st->in[0] == 1 ? GRPC_UNIMPLEMENTED : GRPC_INVALID_ARGUMENT,
                            st->in[0] == 1 ? "compressed messages are not supported (send grpc-encoding identity)"
                                           : "bad message flags");
    uint32_t n = (uint32_t)st->in[1] << 24 | (uint32_t)st->in[2] << 16 | (uint32_t)st->in[3] << 8 | st->in[4];
    if ((size_t)n + 5 > st->in_len)
        return reply_status(c, st, GRPC_INVALID_ARGUMENT, "the request message is cut short (its prefix says more bytes)");
    if ((size_t)n + 5 != st->in_len)
        return reply_status(c, st, GRPC_INVALID_ARGUMENT, "the request must carry exactly one message");
    st->in_call = true;
    c->n_calls++;
    int64_t left = st->timeout_ms;
    if (st->deadline_ms) {
        const uint64_t now = c->cb.now_ms(c->cb.ud);
        left = now < st->deadline_ms ? (int64_t)(st->deadline_ms - now) : 0;
    }
    grpc_call_in call = {.stream_id = st->id, .method = st->method, .msg = st->in + 5, .len = n, .timeout_ms = left};
    c->cb.on_call(c->cb.ud, &call);
    /* the message is not needed any more */
    if (nghttp2_session_get_stream_user_data(c->s, call.stream_id) == st) {
        buf_sub(c, st->in_len);
        st->in_len = 0;
        free(st->in);
        st->in = NULL;
        st->in_cap = 0;
    }
}

static int on_frame_recv(nghttp2_session *s, const nghttp2_frame *f, void *ud) {
    grpc_conn *c = ud;
    if (f->hd.type != NGHTTP2_DATA && f->hd.type != NGHTTP2_HEADERS) return 0;
    gstream *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
    if (!st) return 0;
    if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_REQUEST) headers_done(c, st);
    if (f->hd.flags & NGHTTP2_FLAG_END_STREAM) request_done(c, st);
    return 0;
}

static int on_stream_close(nghttp2_session *s, int32_t sid, uint32_t error_code, void *ud) {
    (void)error_code;
    grpc_conn *c = ud;
    gstream *st = nghttp2_session_get_stream_user_data(s, sid);
    if (!st) return 0;
    nghttp2_session_set_stream_user_data(s, sid, NULL);
    bool was_call = st->in_call;
    if (was_call) {
        st->in_call = false;
        c->n_calls--;
    }
    stream_free(c, st);
    if (was_call && c->cb.on_cancel) c->cb.on_cancel(c->cb.ud, sid);
    return 0;
}

/* ---- response side ---- */

static ssize_t read_data(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t len, uint32_t *flags,
                         nghttp2_data_source *src, void *ud) {
    (void)src;
    grpc_conn *c = ud;
    gstream *st = nghttp2_session_get_stream_user_data(s, sid);
    if (!st) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    size_t avail = st->out_len - st->out_off;
    if (avail) {
        size_t n = avail < len ? avail : len;
        memcpy(buf, st->out + st->out_off, n);
        st->out_off += n;
        c->out -= n;
        c->sent += n;
        if (st->out_off == st->out_len) st->out_off = st->out_len = 0;
        return (ssize_t)n;
    }
    if (!st->finishing) return NGHTTP2_ERR_DEFERRED;
    *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
    char code[8];
    snprintf(code, sizeof code, "%d", st->status);
    char *m = pct_encode(st->message ? st->message : "");
    nghttp2_nv nva[] = {NV("grpc-status", code), NV("grpc-message", m)};
    nghttp2_submit_trailer(s, sid, nva, m[0] ? 2 : 1);
    free(m);
    return 0;
}

static gstream *call_stream(grpc_conn *c, int32_t sid) {
    gstream *st = nghttp2_session_get_stream_user_data(c->s, sid);
    return st && st->in_call ? st : NULL;
}

int grpc_conn_send_msg(grpc_conn *c, int32_t sid, const ProtobufCMessage *m) {
    gstream *st = call_stream(c, sid);
    if (!st || st->finishing) return MLA_ERR;
    size_t n = protobuf_c_message_get_packed_size(m);
    /* a message larger than max_out alone may go out when nothing else is queued (a Tokenize
     * reply can be a few times its request): the queue stays under max_out plus one message */
    if (c->out > 0 && c->out + n + 5 > c->lim.max_out) {
        st->in_call = false;
        c->n_calls--;
        /* ENHANCE_YOUR_CALM: gRPC clients read it as RESOURCE_EXHAUSTED (CANCEL would look like
         * their own cancel) */
        nghttp2_submit_rst_stream(c->s, NGHTTP2_FLAG_NONE, sid, NGHTTP2_ENHANCE_YOUR_CALM);
        return MLA_ERR;
    }
    if (st->out_len + n + 5 > st->out_cap) {
        st->out_cap = (st->out_len + n + 5) * 2;
        st->out = mla_xrealloc(st->out, st->out_cap);
    }
    uint8_t *p = st->out + st->out_len;
    p[0] = 0;
    p[1] = (uint8_t)(n >> 24);
    p[2] = (uint8_t)(n >> 16);
    p[3] = (uint8_t)(n >> 8);
    p[4] = (uint8_t)n;
    protobuf_c_message_pack(m, p + 5);
    st->out_len += n + 5;
    c->out += n + 5;
    if (!st->started) {
        st->started = true;
        nghttp2_nv nva[] = {NV(":status", "200"), NV("content-type", "application/grpc"),
                            NV("grpc-accept-encoding", "identity")};
        nghttp2_data_provider dp = {.source = {.ptr = NULL}, .read_callback = read_data};
        nghttp2_submit_response(c->s, sid, nva, 3, &dp);
    } else {
        nghttp2_session_resume_data(c->s, sid);
    }
    return MLA_OK;
}

bool grpc_conn_expire(grpc_conn *c, uint64_t now) {
    bool any = false;
    for (gstream *st = c->streams; st; st = st->next)
        if (st->deadline_ms && now >= st->deadline_ms && !st->in_call && !st->replied && !st->started &&
            !st->finishing) {
            reply_status(c, st, GRPC_DEADLINE_EXCEEDED, "deadline exceeded before the request was complete");
            any = true;
        }
    return any;
}

void grpc_conn_finish(grpc_conn *c, int32_t sid, int status, const char *message) {
    gstream *st = call_stream(c, sid);
    if (!st || st->finishing) return;
    st->in_call = false;
    c->n_calls--;
    if (!st->started) {
        st->replied = false;
        reply_status(c, st, status, message);
        return;
    }
    st->finishing = true;
    st->status = status;
    st->message = message ? mla_xstrdup(message) : NULL;
    nghttp2_session_resume_data(c->s, sid);
}

/* ---- the connection ---- */

int grpc_conn_init(grpc_conn **out, const grpc_conn_limits *lim, const grpc_conn_cbs *cb, mla_err *err) {
    *out = NULL;
    grpc_conn *c = mla_xcalloc(1, sizeof(*c));
    if (lim)
        c->lim = *lim;
    else
        grpc_conn_limits_default(&c->lim);
    c->cb = *cb;
    nghttp2_session_callbacks *cbs;
    if (nghttp2_session_callbacks_new(&cbs)) {
        free(c);
        return mla_errf(err, "grpc: nghttp2_session_callbacks_new failed");
    }
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    nghttp2_option *opt;
    nghttp2_option_new(&opt);
    /* headers past the limit are counted by on_header; nghttp2 itself caps the block */
    nghttp2_option_set_max_send_header_block_length(opt, 64u << 10);
    int rc = nghttp2_session_server_new2(&c->s, cbs, c, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    if (rc) {
        free(c);
        return mla_errf(err, "grpc: nghttp2_session_server_new: %s", nghttp2_strerror(rc));
    }
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, c->lim.max_streams},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, c->lim.max_header_bytes},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1u << 20},
    };
    nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, iv, 3);
    *out = c;
    return MLA_OK;
}

void grpc_conn_free(grpc_conn *c) {
    if (!c) return;
    /* streams still open: freed without callbacks */
    nghttp2_session_del(c->s);
    while (c->streams) stream_free(c, c->streams);
    free(c);
}

int grpc_conn_recv(grpc_conn *c, const uint8_t *data, size_t n, mla_err *err) {
    ssize_t rc = nghttp2_session_mem_recv(c->s, data, n);
    if (rc < 0) {
        if (rc == NGHTTP2_ERR_BAD_CLIENT_MAGIC)
            return mla_errf(err, "not an HTTP/2 client (a gRPC client speaks HTTP/2: the connection preface is wrong)");
        return mla_errf(err, "HTTP/2 protocol error: %s", nghttp2_strerror((int)rc));
    }
    return MLA_OK;
}

size_t grpc_conn_take_output(grpc_conn *c, uint8_t **out) {
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        const uint8_t *d;
        ssize_t n = nghttp2_session_mem_send(c->s, &d);
        if (n <= 0) break;
        if (len + (size_t)n > cap) {
            cap = (len + (size_t)n) * 2;
            buf = mla_xrealloc(buf, cap);
        }
        memcpy(buf + len, d, (size_t)n);
        len += (size_t)n;
    }
    *out = buf;
    return len;
}

bool grpc_conn_done(const grpc_conn *c) {
    return !nghttp2_session_want_read(c->s) && !nghttp2_session_want_write(c->s);
}

int grpc_conn_n_calls(const grpc_conn *c) { return c->n_calls; }

size_t grpc_conn_out_pending(const grpc_conn *c) { return c->out; }

uint64_t grpc_conn_out_sent(const grpc_conn *c) { return c->sent; }

void grpc_conn_shutdown(grpc_conn *c) { nghttp2_submit_shutdown_notice(c->s); }

void grpc_conn_last_goaway(grpc_conn *c) {
    nghttp2_submit_goaway(c->s, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(c->s), NGHTTP2_NO_ERROR,
                          NULL, 0);
}

void grpc_conn_goaway(grpc_conn *c) { nghttp2_session_terminate_session(c->s, NGHTTP2_NO_ERROR); }
