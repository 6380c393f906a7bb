/* grpc_conn (the gRPC server's HTTP/2 layer) and grpc_request_decode, driven in memory by an
 * nghttp2 client: what content types a call may carry, the answer to a compressed
 * message, a reply larger than the output bound, the reply bytes flow control holds back, the
 * headers checked before the message is buffered (on_headers, oversized headers), the request
 * bytes shared over connections, a grpc-message cut at a character, and string fields with a
 * NUL or bytes that are not UTF-8. */
#include <nghttp2/nghttp2.h>
#include <stdint.h>

#include "coordinator/grpc_conn.h"
#include "coordinator/grpc_msg.h"
#include "mla_test.h"

/* ---- the client side ---- */
typedef struct cli {
    nghttp2_session *s;
    uint8_t *out; /* bytes the client wants sent */
    size_t out_len, out_cap;
    char status[8];   /* grpc-status of the last stream that ended */
    char http[8];     /* its :status */
    char message[4096]; /* its grpc-message, as sent (percent-encoded) */
    char accept[32];  /* its grpc-accept-encoding */
    size_t data_len;  /* DATA bytes received */
    bool reset;       /* a RST_STREAM came */
    uint32_t reset_code; /* its error code */
    const uint8_t *body; /* the request's DATA */
    size_t body_len, body_off;
    bool hold; /* the body sent, the stream is left open (no END_STREAM) */
} cli;

static ssize_t cli_send(nghttp2_session *s, const uint8_t *d, size_t n, int flags, void *ud) {
    (void)s, (void)flags;
    cli *c = ud;
    if (c->out_len + n > c->out_cap) {
        c->out_cap = (c->out_len + n) * 2;
        c->out = realloc(c->out, c->out_cap);
    }
    memcpy(c->out + c->out_len, d, n);
    c->out_len += n;
    return (ssize_t)n;
}

static int cli_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name, size_t nlen,
                      const uint8_t *value, size_t vlen, uint8_t flags, void *ud) {
    (void)s, (void)f, (void)flags;
    cli *c = ud;
    if (nlen == 7 && !memcmp(name, ":status", 7) && vlen < sizeof c->http) {
        memcpy(c->http, value, vlen);
        c->http[vlen] = 0;
    } else if (nlen == 11 && !memcmp(name, "grpc-status", 11) && vlen < sizeof c->status) {
        memcpy(c->status, value, vlen);
        c->status[vlen] = 0;
    } else if (nlen == 12 && !memcmp(name, "grpc-message", 12) && vlen < sizeof c->message) {
        memcpy(c->message, value, vlen);
        c->message[vlen] = 0;
    } else if (nlen == 20 && !memcmp(name, "grpc-accept-encoding", 20) && vlen < sizeof c->accept) {
        memcpy(c->accept, value, vlen);
        c->accept[vlen] = 0;
    }
    return 0;
}

static int cli_data(nghttp2_session *s, uint8_t flags, int32_t sid, const uint8_t *d, size_t n, void *ud) {
    (void)s, (void)flags, (void)sid, (void)d;
    ((cli *)ud)->data_len += n;
    return 0;
}

static int cli_close(nghttp2_session *s, int32_t sid, uint32_t code, void *ud) {
    (void)s, (void)sid;
    if (code != NGHTTP2_NO_ERROR) {
        ((cli *)ud)->reset = true;
        ((cli *)ud)->reset_code = code;
    }
    return 0;
}

static ssize_t cli_read(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t n, uint32_t *flags,
                        nghttp2_data_source *src, void *ud) {
    (void)s, (void)sid, (void)src;
    cli *c = ud;
    size_t k = c->body_len - c->body_off < n ? c->body_len - c->body_off : n;
    if (!k && c->hold) return NGHTTP2_ERR_DEFERRED;
    memcpy(buf, c->body + c->body_off, k);
    c->body_off += k;
    if (c->body_off == c->body_len && !c->hold) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)k;
}

/* ---- the server side ---- */
typedef struct srv {
    grpc_conn *c;
    int calls;
    int headers;       /* on_headers calls */
    int refuse;        /* on_headers' answer (GRPC_OK: the call goes on) */
    bool two_auth;     /* what on_headers was told */
    const char *fail;  /* on_call: finish with GRPC_INVALID_ARGUMENT and this message (NULL: OK) */
    size_t reply; /* bytes of the reply message each call gets (0: a status only) */
    int second;   /* also a second reply message of this many bytes right after */
    int second_rc;
} srv;

static void on_call(void *ud, const grpc_call_in *in) {
    srv *v = ud;
    v->calls++;
    if (v->reply) {
        char *t = malloc(v->reply + 1);
        memset(t, 'a', v->reply);
        t[v->reply] = 0;
        Mlaapi__GenerateResponse m = MLAAPI__GENERATE_RESPONSE__INIT;
        m.text = t;
        grpc_conn_send_msg(v->c, in->stream_id, &m.base);
        if (v->second) v->second_rc = grpc_conn_send_msg(v->c, in->stream_id, &m.base);
        free(t);
    }
    if (v->fail) grpc_conn_finish(v->c, in->stream_id, GRPC_INVALID_ARGUMENT, v->fail);
    else if (!v->second || v->second_rc == MLA_OK) grpc_conn_finish(v->c, in->stream_id, GRPC_OK, NULL);
}

static int on_headers(void *ud, int method, const char *auth, bool two_auth, char *msg, size_t n) {
    (void)method, (void)auth;
    srv *v = ud;
    v->headers++;
    v->two_auth = two_auth;
    if (v->refuse != GRPC_OK) snprintf(msg, n, "refused by the owner");
    return v->refuse;
}

static void on_cancel(void *ud, int32_t sid) { (void)ud, (void)sid; }

/* moves bytes both ways until neither side has any */
static void pump(cli *c, srv *v) {
    for (int i = 0; i < 100; i++) {
        REQUIRE(nghttp2_session_send(c->s) == 0);
        bool moved = false;
        if (c->out_len) {
            mla_err err = {{0}};
            CHECKF(grpc_conn_recv(v->c, c->out, c->out_len, &err) == MLA_OK, "%s", err.msg);
            c->out_len = 0;
            moved = true;
        }
        uint8_t *o;
        size_t n = grpc_conn_take_output(v->c, &o);
        if (n) {
            REQUIRE(nghttp2_session_mem_recv(c->s, o, n) == (ssize_t)n);
            moved = true;
        }
        free(o);
        if (!moved) return;
    }
}

static void cli_init(cli *c, bool ack) {
    memset(c, 0, sizeof *c);
    nghttp2_session_callbacks *cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_send_callback(cb, cli_send);
    nghttp2_session_callbacks_set_on_header_callback(cb, cli_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, cli_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, cli_close);
    nghttp2_option *opt = NULL;
    if (!ack) { /* the client never acknowledges DATA: the server's window stays at 65535 */
        nghttp2_option_new(&opt);
        nghttp2_option_set_no_auto_window_update(opt, 1);
    }
    REQUIRE(nghttp2_session_client_new2(&c->s, cb, c, opt) == 0);
    if (opt) nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    REQUIRE(nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, NULL, 0) == 0);
}

#define NVS(n, v) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NONE}

/* one call of path with content type ctype and the gRPC frame flag byte, body msg; extra headers
 * (pairs of name, value; NULL-ended) before the content type */
static void call_x(cli *c, srv *v, const char *path, const char *ctype, uint8_t flag, const uint8_t *msg, size_t n,
                   const char *const *extra) {
    uint8_t *body = malloc(n + 5);
    body[0] = flag;
    body[1] = (uint8_t)(n >> 24), body[2] = (uint8_t)(n >> 16), body[3] = (uint8_t)(n >> 8), body[4] = (uint8_t)n;
    if (n) memcpy(body + 5, msg, n);
    c->body = body, c->body_len = n + 5, c->body_off = 0;
    c->status[0] = c->accept[0] = c->message[0] = c->http[0] = 0;
    c->data_len = 0;
    c->reset = false;
    nghttp2_nv nva[16] = {NVS(":method", "POST"), NVS(":scheme", "http"), NVS(":path", path), NVS(":authority", "test")};
    size_t nv = 4;
    for (int i = 0; extra && extra[i] && nv < 14; i += 2)
        nva[nv++] = (nghttp2_nv){(uint8_t *)extra[i], (uint8_t *)extra[i + 1], strlen(extra[i]), strlen(extra[i + 1]),
                                 NGHTTP2_NV_FLAG_NONE};
    nva[nv++] = (nghttp2_nv)NVS("content-type", ctype);
    nva[nv++] = (nghttp2_nv)NVS("te", "trailers");
    nghttp2_data_provider dp = {.source = {.ptr = NULL}, .read_callback = cli_read};
    REQUIRE(nghttp2_submit_request(c->s, NULL, nva, nv, &dp, NULL) > 0);
    pump(c, v);
    free(body);
}

static void call(cli *c, srv *v, const char *path, const char *ctype, uint8_t flag, const uint8_t *msg, size_t n) {
    call_x(c, v, path, ctype, flag, msg, n, NULL);
}

static void conn_pair_cb(srv *v, cli *c, const grpc_conn_limits *lim, bool ack, bool with_headers) {
    memset(v, 0, sizeof *v);
    grpc_conn_cbs cb = {.ud = v, .on_headers = with_headers ? on_headers : NULL, .on_call = on_call,
                        .on_cancel = on_cancel};
    mla_err err = {{0}};
    REQUIRE(grpc_conn_init(&v->c, lim, &cb, &err) == MLA_OK);
    cli_init(c, ack); /* the client sends the preface itself */
}

static void conn_pair(srv *v, cli *c, const grpc_conn_limits *lim, bool ack) { conn_pair_cb(v, c, lim, ack, false); }

static void end(srv *v, cli *c) {
    nghttp2_session_del(c->s);
    free(c->out);
    grpc_conn_free(v->c);
}

static void test_content_types(void) {
    grpc_conn_limits lim;
    grpc_conn_limits_default(&lim);
    srv v;
    cli c;
    conn_pair(&v, &c, &lim, true);
    const char *health = "/mlaapi.MlaServe/Health";
    /* protobuf: served; gRPC with another codec: UNIMPLEMENTED; not gRPC: HTTP 415, no gRPC status */
    struct {
        const char *ctype, *http, *status;
    } cases[] = {{"application/grpc", "200", "0"},        {"application/grpc+proto", "200", "0"},
                 {"application/grpc;x=1", "200", "0"},    {"application/grpc+proto;x=1", "200", "0"},
                 {"application/grpc+json", "200", "12"},  {"application/grpc+protobuf", "200", "12"},
                 {"application/grpcx", "415", ""},        {"application/json", "415", ""},
                 {"application/grp", "415", ""},          {"text/plain;application/grpc", "415", ""},
                 {"Application/gRPC", "200", "0"},        {"APPLICATION/GRPC+PROTO", "200", "0"},
                 {"Application/gRPC+JSON", "200", "12"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int calls = v.calls;
        call(&c, &v, health, cases[i].ctype, 0, NULL, 0);
        CHECKF((v.calls > calls) == !strcmp(cases[i].status, "0"), "%s", cases[i].ctype);
        CHECKF(!strcmp(c.http, cases[i].http) && !strcmp(c.status, cases[i].status), "%s: HTTP %s, grpc-status '%s'",
               cases[i].ctype, c.http, c.status);
    }
    /* a compressed message: UNIMPLEMENTED, saying which encoding is taken */
    call(&c, &v, health, "application/grpc", 1, (const uint8_t *)"x", 1);
    CHECKF(!strcmp(c.status, "12") && !strcmp(c.accept, "identity"), "compressed: %s, accept %s", c.status, c.accept);
    /* an unknown method: UNIMPLEMENTED, naming the path asked for */
    call(&c, &v, "/nope.Svc/Do", "application/grpc", 0, (const uint8_t *)"", 0);
    CHECKF(!strcmp(c.status, "12") && !strcmp(c.message, "unknown method /nope.Svc/Do"), "unknown method: %s %s",
           c.status, c.message);
    end(&v, &c);
}

static void test_output_bound(void) {
    grpc_conn_limits lim;
    grpc_conn_limits_default(&lim);
    lim.max_out = 4096;
    srv v;
    cli c;
    conn_pair(&v, &c, &lim, true);
    /* one reply message over the bound, nothing else queued: delivered whole */
    v.reply = 10000;
    call(&c, &v, "/mlaapi.MlaServe/Health", "application/grpc", 0, NULL, 0);
    CHECKF(!strcmp(c.status, "0") && !c.reset && c.data_len > 10000, "a 10000-byte reply: status %s, %zu bytes",
           c.status, c.data_len);
    /* a second one queued behind it: the call is reset, ENHANCE_YOUR_CALM (a client's
     * RESOURCE_EXHAUSTED, not the CANCELLED of its own cancel) */
    v.second = 1;
    call(&c, &v, "/mlaapi.MlaServe/Health", "application/grpc", 0, NULL, 0);
    CHECKF(v.second_rc == MLA_ERR && c.reset && c.reset_code == NGHTTP2_ENHANCE_YOUR_CALM, "reset, code %u",
           c.reset_code);
    end(&v, &c);
}

static void test_out_pending(void) {
    grpc_conn_limits lim;
    grpc_conn_limits_default(&lim);
    srv v;
    cli c;
    conn_pair(&v, &c, &lim, false);
    /* a finished call whose reply is larger than the client's window: held back, still pending */
    v.reply = 200000;
    call(&c, &v, "/mlaapi.MlaServe/Health", "application/grpc", 0, NULL, 0);
    CHECK(v.calls == 1 && grpc_conn_n_calls(v.c) == 0);
    CHECKF(c.data_len <= 65535 && grpc_conn_out_pending(v.c) > 100000, "received %zu, pending %zu", c.data_len,
           grpc_conn_out_pending(v.c));
    /* the client reads: the rest goes out and nothing is pending */
    nghttp2_session_consume_connection(c.s, c.data_len);
    nghttp2_session_consume_stream(c.s, 1, c.data_len);
    for (int i = 0; i < 10 && grpc_conn_out_pending(v.c); i++) { /* each window's worth acknowledged */
        const size_t got = c.data_len;
        pump(&c, &v);
        nghttp2_session_consume_connection(c.s, c.data_len - got);
        nghttp2_session_consume_stream(c.s, 1, c.data_len - got);
    }
    pump(&c, &v);
    CHECKF(grpc_conn_out_pending(v.c) == 0 && c.data_len > 200000, "after reading: received %zu, pending %zu",
           c.data_len, grpc_conn_out_pending(v.c));
    end(&v, &c);
}

/* A call the owner refuses on its headers is answered before its message arrives, and its data is
 * not buffered; one it takes goes on. Two authorization fields: the owner is told, and decides. */
static void test_headers_first(void) {
    grpc_conn_limits lim;
    grpc_conn_limits_default(&lim);
    size_t total = 0;
    lim.total_buffered = &total;
    srv v;
    cli c;
    conn_pair_cb(&v, &c, &lim, true, true);
    static uint8_t big[200000];
    v.refuse = GRPC_UNAUTHENTICATED;
    c.hold = true; /* the message sent, the stream left open: only the headers can end it */
    call(&c, &v, "/mlaapi.MlaServe/Generate", "application/grpc", 0, big, sizeof big);
    CHECKF(!strcmp(c.status, "16") && v.headers == 1 && v.calls == 0, "refused on its headers: status %s",
           c.status);
    CHECKF(total == 0, "a refused call's data is not buffered (%zu bytes held)", total);
    c.hold = false;
    v.refuse = GRPC_OK;
    const char *two[] = {"authorization", "Bearer a", "authorization", "Bearer b", NULL};
    call_x(&c, &v, "/mlaapi.MlaServe/Health", "application/grpc", 0, NULL, 0, two);
    CHECKF(!strcmp(c.status, "0") && v.calls == 1 && v.two_auth, "two authorization fields, taken by the owner: %s",
           c.status);
    CHECK(total == 0);
    end(&v, &c);
    /* without on_headers two authorization fields are refused */
    conn_pair(&v, &c, &lim, true);
    call_x(&c, &v, "/mlaapi.MlaServe/Health", "application/grpc", 0, NULL, 0, two);
    CHECKF(!strcmp(c.status, "16") && v.calls == 0, "two authorization fields, no owner check: %s", c.status);
    end(&v, &c);
}

/* Headers over the limit are named as such, wherever the big field sits (the fields after it are
 * not read, the content type among them). */
static void test_header_limit(void) {
    grpc_conn_limits lim;
    grpc_conn_limits_default(&lim);
    lim.max_header_bytes = 4096;
    srv v;
    cli c;
    conn_pair(&v, &c, &lim, true);
    static char pad[6000];
    memset(pad, 'p', sizeof pad - 1);
    const char *extra[] = {"x-pad", pad, NULL};
    call_x(&c, &v, "/mlaapi.MlaServe/Health", "application/grpc", 0, NULL, 0, extra);
    CHECKF(!strcmp(c.status, "8") && strstr(c.message, "larger than 4096"), "oversized headers: %s %s", c.status,
           c.message);
    end(&v, &c);
}

/* Request bytes are bounded over the connections that share a counter: a call that would pass it
 * is refused by name, and the bytes of a finished call are given back. */
static void test_total_buffered(void) {
    grpc_conn_limits lim;
    grpc_conn_limits_default(&lim);
    size_t total = 0;
    lim.total_buffered = &total;
    lim.max_total_buffered = 3000;
    srv a, b;
    cli ca, cb;
    conn_pair(&a, &ca, &lim, true);
    conn_pair(&b, &cb, &lim, true);
    static uint8_t msg[2000];
    ca.hold = true;
    call(&ca, &a, "/mlaapi.MlaServe/Health", "application/grpc", 0, msg, sizeof msg);
    CHECKF(total == sizeof msg + 5 && !ca.status[0], "a call in flight holds its bytes (%zu)", total);
    call(&cb, &b, "/mlaapi.MlaServe/Health", "application/grpc", 0, msg, sizeof msg);
    CHECKF(!strcmp(cb.status, "8") && strstr(cb.message, "on this server"), "over the shared bound: %s %s", cb.status,
           cb.message);
    end(&a, &ca); /* the held call's bytes go back with its connection */
    CHECKF(total == 0, "given back (%zu)", total);
    call(&cb, &b, "/mlaapi.MlaServe/Health", "application/grpc", 0, NULL, 0);
    CHECK(!strcmp(cb.status, "0"));
    end(&b, &cb);
}

/* A grpc-message past its 1024 bytes is cut before a character that would not fit whole. */
static void test_message_cut(void) {
    grpc_conn_limits lim;
    grpc_conn_limits_default(&lim);
    srv v;
    cli c;
    conn_pair(&v, &c, &lim, true);
    static char m[1200];
    m[0] = 'a'; /* then two-byte characters: the 1024th byte is the first of one */
    for (size_t i = 1; i + 2 < sizeof m; i += 2) m[i] = (char)0xC3, m[i + 1] = (char)0xA9;
    v.fail = m;
    call(&c, &v, "/mlaapi.MlaServe/Health", "application/grpc", 0, NULL, 0);
    const size_t n = strlen(c.message);
    /* percent-encoded: "a" then "%C3%A9" a character; 1023 bytes after the 'a' hold 511 whole ones */
    CHECKF(!strcmp(c.status, "3") && n == 1 + 511 * 6 && !strcmp(c.message + n - 6, "%C3%A9"),
           "cut at a character: %zu bytes, ends %s", n, n >= 6 ? c.message + n - 6 : c.message);
    end(&v, &c);
}

/* request messages whose string fields hold a NUL or bytes that are not UTF-8 (written into the
 * packed bytes, which protobuf's own packers refuse to make) */
static void test_strings(void) {
    char param[48];
    mla_err err = {{0}};
    grpc_request q;
    /* GenerateRequest.prompt (a plain string field), in place */
    Mlaapi__GenerateRequest g = MLAAPI__GENERATE_REQUEST__INIT;
    g.prompt = "1 2 X 3";
    g.has_max_tokens = true;
    g.max_tokens = 4;
    uint8_t buf[256];
    size_t n = mlaapi__generate_request__pack(&g, buf);
    CHECK(grpc_request_decode(GRPC_M_GENERATE, buf, n, &q, param, &err) == MLA_OK);
    grpc_request_free(&q);
    uint8_t *x = memchr(buf, 'X', n);
    REQUIRE(x);
    *x = 0;
    CHECK(grpc_request_decode(GRPC_M_GENERATE, buf, n, &q, param, &err) == MLA_ERR && !strcmp(param, "prompt") &&
          strstr(err.msg, "NUL"));
    grpc_request_free(&q);
    *x = 0xff;
    CHECK(grpc_request_decode(GRPC_M_GENERATE, buf, n, &q, param, &err) == MLA_ERR && !strcmp(param, "prompt") &&
          strstr(err.msg, "UTF-8"));
    grpc_request_free(&q);
    /* a chat message's content (a string inside a nested message) */
    Mlaapi__ChatMessage cm = MLAAPI__CHAT_MESSAGE__INIT, *cmp = &cm;
    cm.role = "user";
    cm.content = "hi \xc3\xa9 X";
    Mlaapi__GenerateRequest g2 = MLAAPI__GENERATE_REQUEST__INIT;
    g2.n_messages = 1;
    g2.messages = &cmp;
    n = mlaapi__generate_request__pack(&g2, buf);
    CHECK(grpc_request_decode(GRPC_M_GENERATE, buf, n, &q, param, &err) == MLA_OK);
    grpc_request_free(&q);
    x = memchr(buf, 'X', n);
    REQUIRE(x);
    *x = 0xc3; /* a cut-off sequence at the end of the string */
    CHECK(grpc_request_decode(GRPC_M_GENERATE, buf, n, &q, param, &err) == MLA_ERR && !strcmp(param, "messages") &&
          strstr(err.msg, "messages[0].content is not valid UTF-8"));
    grpc_request_free(&q);
    /* Tokenize text with a NUL */
    Mlaapi__TokenizeRequest t = MLAAPI__TOKENIZE_REQUEST__INIT;
    t.text = "1X2";
    n = mlaapi__tokenize_request__pack(&t, buf);
    x = memchr(buf, 'X', n);
    REQUIRE(x);
    *x = 0;
    CHECK(grpc_request_decode(GRPC_M_TOKENIZE, buf, n, &q, param, &err) == MLA_ERR && !strcmp(param, "text"));
    grpc_request_free(&q);
}

int main(void) {
    test_content_types();
    test_output_bound();
    test_out_pending();
    test_headers_first();
    test_header_limit();
    test_total_buffered();
    test_message_cut();
    test_strings();
    return mla_test_finish();
}
