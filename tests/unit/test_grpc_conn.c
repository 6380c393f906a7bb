/* grpc_conn (the gRPC server's HTTP/2 layer) and grpc_request_decode, driven in memory by an
 * nghttp2 client: what content types a call may carry, the answer to a compressed
 * message, a reply larger than the output bound, the reply bytes flow control holds back, and
 * string fields with a NUL or bytes that are not UTF-8. */
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
    char accept[32];  /* its grpc-accept-encoding */
    size_t data_len;  /* DATA bytes received */
    bool reset;       /* a RST_STREAM came */
    const uint8_t *body; /* the request's DATA */
    size_t body_len, body_off;
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
    if (nlen == 11 && !memcmp(name, "grpc-status", 11) && vlen < sizeof c->status) {
        memcpy(c->status, value, vlen);
        c->status[vlen] = 0;
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
    if (code != NGHTTP2_NO_ERROR) ((cli *)ud)->reset = true;
    return 0;
}

static ssize_t cli_read(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t n, uint32_t *flags,
                        nghttp2_data_source *src, void *ud) {
    (void)s, (void)sid, (void)src;
    cli *c = ud;
    size_t k = c->body_len - c->body_off < n ? c->body_len - c->body_off : n;
    memcpy(buf, c->body + c->body_off, k);
    c->body_off += k;
    if (c->body_off == c->body_len) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)k;
}

/* ---- the server side ---- */
typedef struct srv {
    grpc_conn *c;
    int calls;
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
    if (!v->second || v->second_rc == MLA_OK) grpc_conn_finish(v->c, in->stream_id, GRPC_OK, NULL);
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

/* one call of path with content type ctype and the gRPC frame flag byte, body msg */
static void call(cli *c, srv *v, const char *path, const char *ctype, uint8_t flag, const uint8_t *msg, size_t n) {
    uint8_t *body = malloc(n + 5);
    body[0] = flag;
    body[1] = (uint8_t)(n >> 24), body[2] = (uint8_t)(n >> 16), body[3] = (uint8_t)(n >> 8), body[4] = (uint8_t)n;
    if (n) memcpy(body + 5, msg, n);
    c->body = body, c->body_len = n + 5, c->body_off = 0;
    c->status[0] = c->accept[0] = 0;
    c->data_len = 0;
    c->reset = false;
    nghttp2_nv nva[] = {NVS(":method", "POST"), NVS(":scheme", "http"), NVS(":path", path),
                        NVS(":authority", "test"), NVS("content-type", ctype), NVS("te", "trailers")};
    nghttp2_data_provider dp = {.source = {.ptr = NULL}, .read_callback = cli_read};
    REQUIRE(nghttp2_submit_request(c->s, NULL, nva, 6, &dp, NULL) > 0);
    pump(c, v);
    free(body);
}

static void conn_pair(srv *v, cli *c, const grpc_conn_limits *lim, bool ack) {
    memset(v, 0, sizeof *v);
    grpc_conn_cbs cb = {.ud = v, .on_call = on_call, .on_cancel = on_cancel};
    mla_err err = {{0}};
    REQUIRE(grpc_conn_init(&v->c, lim, &cb, &err) == MLA_OK);
    cli_init(c, ack); /* the client sends the preface itself */
}

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
    struct {
        const char *ctype;
        bool ok;
    } cases[] = {{"application/grpc", true},       {"application/grpc+proto", true},
                 {"application/grpc;x=1", true},   {"application/grpc+proto;x=1", true},
                 {"application/grpc+json", false}, {"application/grpc+protobuf", false},
                 {"application/grpcx", false},     {"application/json", false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int calls = v.calls;
        call(&c, &v, health, cases[i].ctype, 0, NULL, 0);
        CHECKF((v.calls > calls) == cases[i].ok, "%s", cases[i].ctype);
        CHECKF(!strcmp(c.status, cases[i].ok ? "0" : "3"), "%s: grpc-status %s", cases[i].ctype, c.status);
    }
    /* a compressed message: UNIMPLEMENTED, saying which encoding is taken */
    call(&c, &v, health, "application/grpc", 1, (const uint8_t *)"x", 1);
    CHECKF(!strcmp(c.status, "12") && !strcmp(c.accept, "identity"), "compressed: %s, accept %s", c.status, c.accept);
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
    /* a second one queued behind it: the call is reset */
    v.second = 1;
    call(&c, &v, "/mlaapi.MlaServe/Health", "application/grpc", 0, NULL, 0);
    CHECK(v.second_rc == MLA_ERR && c.reset);
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
    test_strings();
    return mla_test_finish();
}
