/* pbapi_server: see pbapi_server.h. */
#include "coordinator/pbapi_server.h"
#include "coordinator/uvnet.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buildinfo.h"
#include "common/apiclient.h"
#include "common/mla_log.h"
#include "coordinator/pbapi_frame.h"

typedef struct pb_conn pb_conn;

typedef struct pb_req {
    pb_conn *c;
    struct pb_req *prev, *next;
    uint64_t id;
    api_gen *g;
    api_tok_job *tj; /* a Tokenize on the prep thread */
    bool logprobs;
    uint32_t index; /* tokens sent */
} pb_req;

struct pb_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_shutdown_t shut;
    pbapi_server *srv;
    pb_conn *prev, *next;
    pbapi_framer fr;
    bool authed;
    bool closing;   /* handles being closed */
    bool lingering; /* write side shut down after a fatal error, discarding input */
    pb_req *reqs;
    int n_reqs;
    size_t queued;
    int n_handles_open;
    char peer[64];
    uint64_t last_active_ms;  /* last frame received or answer sent */
    uint64_t frame_start_ms;  /* when the partial frame in the framer began */
    size_t counted;           /* partial-frame bytes counted in the server's buffered */
};

struct pbapi_server {
    uv_loop_t *loop;
    api_server *api;
    pbapi_config cfg;
    uv_tcp_t listener;
    bool listening, closed;
    pb_conn *conns;
    int n_conns, n_closing;
    uv_timer_t sweep;         /* idle and frame timeouts */
    bool sweep_open;
    size_t buffered;          /* partial-frame bytes over all connections */
};

void pbapi_config_default(pbapi_config *c) {
    c->max_frame = APICLIENT_MAX_FRAME_DEFAULT;
    c->max_conns = 1024;
    c->max_inflight = 256;
    c->max_write_queue = 8u << 20;
    c->idle_timeout_ms = 60000;
    c->frame_timeout_ms = 30000;
    c->max_preauth_frame = 64u << 10;
    c->max_buffered_total = 256u << 20;
}

static uint64_t buffered_of(const pb_conn *c) { return c->fr.len - c->fr.off; }

/* Keeps the server's count of partial-frame bytes; starts a frame's clock when a frame begins
 * (nothing was pending before, or a frame was completed since: what is left is a new one). */
static void account(pb_conn *c, bool got_frame) {
    pbapi_server *s = c->srv;
    size_t now = (size_t)buffered_of(c);
    if ((c->counted == 0 || got_frame) && now > 0) c->frame_start_ms = uv_now(s->loop);
    s->buffered = s->buffered - c->counted + now;
    c->counted = now;
}

/* ---- connection lifetime ---- */

static void on_handle_closed(uv_handle_t *h) {
    pb_conn *c = h->data;
    if (--c->n_handles_open > 0) return;
    c->srv->n_closing--;
    pbapi_framer_free(&c->fr);
    free(c);
}

static void req_unlink(pb_req *r) {
    pb_conn *c = r->c;
    if (r->prev)
        r->prev->next = r->next;
    else
        c->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    c->n_reqs--;
    free(r);
}

static void conn_close(pb_conn *c) {
    if (c->closing) return;
    c->closing = true;
    pbapi_server *s = c->srv;
    /* its requests: no more output, cancelled in the scheduler */
    while (c->reqs) {
        pb_req *r = c->reqs;
        if (r->g) api_server_gen_cancel(r->g, true);
        if (r->tj) api_server_tokenize_detach(r->tj);
        req_unlink(r);
    }
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_conns--;
    s->n_closing++;
    s->buffered -= c->counted;
    c->counted = 0;
    uv_timer_stop(&c->timer);
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->n_handles_open = 2;
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
}

/* ---- writing ---- */

typedef struct wreq {
    uv_write_t w;
    pb_conn *c;
    size_t len;
    uint8_t *data;
} wreq;

static void on_written(uv_write_t *w, int status) {
    wreq *r = (wreq *)w;
    pb_conn *c = r->c;
    c->queued -= r->len;
    free(r->data);
    free(r);
    if (c->closing) return;
    c->last_active_ms = uv_now(c->srv->loop);
    if (status < 0) {
        MLA_DEBUG("pbapi: write to %s failed: %s", c->peer, uv_strerror(status));
        conn_close(c);
    }
}

static void on_linger_timer(uv_timer_t *t);

/* Closing from inside a sink callback would free the request being served: stop output now,
 * close from the timer. */
static void close_soon(pb_conn *c) {
    if (c->closing) return;
    c->lingering = true;
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_timer_start(&c->timer, on_linger_timer, 0, 0);
}

static void send_msg(pb_conn *c, int kind, const ProtobufCMessage *m) {
    if (c->closing || c->lingering) return;
    wreq *r = mla_xcalloc(1, sizeof(*r));
    r->c = c;
    r->data = apiclient_frame_pack(kind, m, &r->len);
    uv_buf_t buf = uv_buf_init((char *)r->data, (unsigned)r->len);
    c->queued += r->len;
    int rc = uv_write(&r->w, (uv_stream_t *)&c->tcp, &buf, 1, on_written);
    if (rc < 0) {
        c->queued -= r->len;
        free(r->data);
        free(r);
        close_soon(c);
        return;
    }
    if (c->queued > c->srv->cfg.max_write_queue) {
        MLA_WARN("pbapi: client %s leaves %zu bytes unread; closing", c->peer, c->queued);
        close_soon(c);
    }
}

static void send_error(pb_conn *c, uint64_t id, int code, const char *param, const char *msg) {
    Mlaapi__Error e = MLAAPI__ERROR__INIT;
    e.has_request_id = true;
    e.request_id = id;
    e.has_code = true;
    e.code = (Mlaapi__ErrorCode)code;
    size_t n;
    char *m = api_utf8_sanitize(msg, strlen(msg), &n);
    e.message = m;
    e.param = param && param[0] ? (char *)param : NULL;
    send_msg(c, MLAAPI__FRAME_KIND__FRAME_ERROR, &e.base);
    free(m);
}

static void on_linger_timer(uv_timer_t *t) { conn_close(t->data); }

static void on_shutdown(uv_shutdown_t *r, int status) {
    pb_conn *c = r->data;
    if (status < 0 && !c->closing) conn_close(c);
}

/* A malformed frame: Error (request_id 0), cancel the requests, shut the write side down and
 * discard input until the client closes (or 2 s), so the error is not lost to a reset. */
static void fatal(pb_conn *c, int code, const char *param, const char *msg) {
    MLA_INFO("pbapi: client %s: %s (%s); closing", c->peer, msg, apiclient_code_name(code));
    send_error(c, 0, code, param, msg);
    if (c->closing || c->lingering) return;
    while (c->reqs) {
        pb_req *r = c->reqs;
        if (r->g) api_server_gen_cancel(r->g, true);
        if (r->tj) api_server_tokenize_detach(r->tj);
        req_unlink(r);
    }
    c->lingering = true;
    c->shut.data = c;
    if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown) < 0) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_linger_timer, 2000, 0);
}

/* Ends the connection after what was sent (no Error frame of its own). */
static void fatal_quiet(pb_conn *c) {
    if (c->closing || c->lingering) return;
    while (c->reqs) {
        pb_req *r = c->reqs;
        if (r->g) api_server_gen_cancel(r->g, true);
        if (r->tj) api_server_tokenize_detach(r->tj);
        req_unlink(r);
    }
    c->lingering = true;
    c->shut.data = c;
    if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown) < 0) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_linger_timer, 2000, 0);
}

/* ---- generation output ---- */

static void send_token(pb_req *r, const char *text, size_t from, size_t to, const api_token *t) {
    Mlaapi__GenerateResponse m = MLAAPI__GENERATE_RESPONSE__INIT;
    m.has_request_id = true;
    m.request_id = r->id;
    m.has_token_id = true;
    m.token_id = t->id;
    m.has_index = true;
    m.index = r->index++;
    size_t n;
    char *s = api_utf8_sanitize(text + from, to - from, &n);
    m.text = s;
    Mlaapi__TopLogprob tops[SCHED_MAX_TOP_LOGPROBS], *topp[SCHED_MAX_TOP_LOGPROBS];
    if (r->logprobs) {
        m.has_logprob = true;
        m.logprob = t->logprob;
        int nt = t->n_top < SCHED_MAX_TOP_LOGPROBS ? t->n_top : SCHED_MAX_TOP_LOGPROBS;
        for (int k = 0; k < nt; k++) {
            mlaapi__top_logprob__init(&tops[k]);
            tops[k].has_token_id = tops[k].has_logprob = true;
            tops[k].token_id = t->top_ids[k];
            tops[k].logprob = t->top_lps[k];
            topp[k] = &tops[k];
        }
        m.n_top_logprobs = (size_t)(nt > 0 ? nt : 0);
        m.top_logprobs = topp;
    }
    send_msg(r->c, MLAAPI__FRAME_KIND__FRAME_GENERATE_RESPONSE, &m.base);
    free(s);
}

/* One frame per token; the text [from, to) is shared out so that each piece ends on a UTF-8
 * boundary (the last token takes the rest). Returns where the sent text ends. */
static size_t send_tokens(pb_req *r, const char *text, size_t from, size_t to, const api_token *toks, int n) {
    size_t cur = from;
    for (int k = 0; k < n; k++) {
        size_t e = to;
        if (k < n - 1) {
            e = toks[k].end < to ? toks[k].end : to;
            e = api_utf8_complete_prefix(text, e);
            if (e < cur) e = cur;
        }
        send_token(r, text, cur, e, &toks[k]);
        cur = e;
    }
    return cur;
}

static void on_delta(void *ud, const char *text, size_t from, size_t to, const api_token *toks, int n) {
    pb_req *r = ud;
    send_tokens(r, text, from, to, toks, n);
}

static void on_final(void *ud, const char *text, size_t from, size_t to, const api_token *toks, int n,
                     const char *finish_reason, const char *error, bool cancelled, int32_t n_prompt,
                     int32_t n_completion) {
    pb_req *r = ud;
    pb_conn *c = r->c;
    r->g = NULL;
    if (error) {
        send_error(c, r->id, cancelled ? MLAAPI__ERROR_CODE__ERROR_CANCELLED : MLAAPI__ERROR_CODE__ERROR_INTERNAL,
                   NULL, error);
    } else {
        size_t cur = send_tokens(r, text, from, to, toks, n);
        Mlaapi__GenerateResponse m = MLAAPI__GENERATE_RESPONSE__INIT;
        Mlaapi__Usage u = MLAAPI__USAGE__INIT;
        m.has_request_id = true;
        m.request_id = r->id;
        size_t len;
        char *s = api_utf8_sanitize(text + cur, to > cur ? to - cur : 0, &len);
        m.text = s;
        m.finish_reason = (char *)finish_reason;
        u.has_prompt_tokens = u.has_completion_tokens = u.has_total_tokens = true;
        u.prompt_tokens = (uint32_t)n_prompt;
        u.completion_tokens = (uint32_t)n_completion;
        u.total_tokens = (uint32_t)(n_prompt + n_completion);
        m.usage = &u;
        send_msg(c, MLAAPI__FRAME_KIND__FRAME_GENERATE_RESPONSE, &m.base);
        free(s);
    }
    req_unlink(r);
}

/* ---- requests ---- */

static int status_code(int status) {
    switch (status) {
    case 400: return MLAAPI__ERROR_CODE__ERROR_INVALID_REQUEST;
    case 401: return MLAAPI__ERROR_CODE__ERROR_UNAUTHENTICATED;
    case 404: return MLAAPI__ERROR_CODE__ERROR_NOT_FOUND;
    case 429: return MLAAPI__ERROR_CODE__ERROR_RESOURCE_EXHAUSTED;
    case 503: return MLAAPI__ERROR_CODE__ERROR_UNAVAILABLE;
    default: return MLAAPI__ERROR_CODE__ERROR_INTERNAL;
    }
}

/* The prompt was refused after the prep thread made it (api_sink.on_refused). */
static void on_refused(void *ud, const api_error *e) {
    pb_req *r = ud;
    r->g = NULL;
    send_error(r->c, r->id, status_code(e->status), e->param, e->message);
    req_unlink(r);
}

static pb_req *find_req(pb_conn *c, uint64_t id) {
    for (pb_req *r = c->reqs; r; r = r->next)
        if (r->id == id) return r;
    return NULL;
}

static void handle_generate(pb_conn *c, pbapi_request *q) {
    pbapi_server *s = c->srv;
    if (find_req(c, q->request_id)) {
        char m[96];
        snprintf(m, sizeof(m), "request_id %llu is already in flight on this connection",
                 (unsigned long long)q->request_id);
        fatal(c, MLAAPI__ERROR_CODE__ERROR_DUPLICATE_ID, "request_id", m);
        return;
    }
    if (c->n_reqs >= s->cfg.max_inflight) {
        char m[96];
        snprintf(m, sizeof(m), "at most %d requests may be in flight on one connection", s->cfg.max_inflight);
        send_error(c, q->request_id, MLAAPI__ERROR_CODE__ERROR_RESOURCE_EXHAUSTED, NULL, m);
        return;
    }
    pb_req *r = mla_xcalloc(1, sizeof(*r));
    r->c = c;
    r->id = q->request_id;
    r->logprobs = q->gen.logprobs;
    /* the prompt is made off the loop thread: other clients are not held up by a big one */
    api_sink sink = {.ud = r, .on_delta = on_delta, .on_final = on_final, .on_refused = on_refused};
    api_error e;
    r->g = api_server_generate(s->api, &q->gen, &sink, &e);
    if (!r->g) {
        free(r);
        send_error(c, q->request_id, status_code(e.status), e.param, e.message);
        return;
    }
    r->next = c->reqs;
    if (c->reqs) c->reqs->prev = r;
    c->reqs = r;
    c->n_reqs++;
}

static void tokenize_done(void *ud, const int32_t *ids, int32_t n, const api_error *e) {
    pb_req *r = ud;
    pb_conn *c = r->c;
    r->tj = NULL;
    if (e) {
        send_error(c, r->id, status_code(e->status), e->param, e->message);
    } else {
        Mlaapi__TokenizeResponse m = MLAAPI__TOKENIZE_RESPONSE__INIT;
        m.has_request_id = true;
        m.request_id = r->id;
        m.n_ids = (size_t)n;
        m.ids = (int32_t *)ids;
        m.has_max_model_len = true;
        m.max_model_len = (uint32_t)api_server_max_context(c->srv->api);
        send_msg(c, MLAAPI__FRAME_KIND__FRAME_TOKENIZE_RESPONSE, &m.base);
    }
    req_unlink(r);
}

static void handle_tokenize(pb_conn *c, pbapi_request *q) {
    pbapi_server *s = c->srv;
    if (c->n_reqs >= s->cfg.max_inflight) {
        char m[96];
        snprintf(m, sizeof(m), "at most %d requests may be in flight on one connection", s->cfg.max_inflight);
        send_error(c, q->request_id, MLAAPI__ERROR_CODE__ERROR_RESOURCE_EXHAUSTED, NULL, m);
        return;
    }
    /* tokenized on the prep thread, in order with the other requests */
    pb_req *r = mla_xcalloc(1, sizeof(*r));
    r->c = c;
    r->id = q->request_id;
    r->next = c->reqs;
    if (c->reqs) c->reqs->prev = r;
    c->reqs = r;
    c->n_reqs++;
    r->tj = api_server_tokenize_async(s->api, q->text, q->messages, q->add_special, tokenize_done, r);
}

static void handle_frame(pb_conn *c, int kind, const uint8_t *payload, size_t len) {
    pbapi_server *s = c->srv;
    pbapi_request q;
    int code = 0;
    char param[48];
    mla_err err = {{0}};
    if (pbapi_request_decode(kind, payload, len, &q, &code, param, &err) != MLA_OK) {
        fatal(c, code, param, err.msg);
        pbapi_request_free(&q);
        return;
    }
    if (kind == MLAAPI__FRAME_KIND__FRAME_HELLO) {
        int retry = 0, st = q.api_key ? api_server_auth(s->api, c->peer, q.api_key, &retry) : 0;
        if (st == 429) {
            char m[128];
            snprintf(m, sizeof m, "too many wrong API keys from this address; retry in %d s", retry);
            fatal(c, MLAAPI__ERROR_CODE__ERROR_RESOURCE_EXHAUSTED, "api_key", m);
        } else if (st) {
            fatal(c, MLAAPI__ERROR_CODE__ERROR_UNAUTHENTICATED, "api_key", "wrong API key in Hello");
        } else {
            if (q.api_key) {
                c->authed = true;
                c->fr.max_payload = s->cfg.max_frame; /* the pre-authentication cap is lifted */
            }
            Mlaapi__HelloReply m = MLAAPI__HELLO_REPLY__INIT;
            m.has_version = m.has_max_frame = true;
            m.version = APICLIENT_VERSION;
            m.max_frame = s->cfg.max_frame;
            m.server = "mlaserve";
            m.model = (char *)api_server_model_name(s->api);
            char build[256];
            snprintf(build, sizeof build, "commit %s, %s, %s%s", buildinfo_commit(), buildinfo_type(),
                     buildinfo_cuda_archs()[0] ? "CUDA sm_" : "CPU only", buildinfo_cuda_archs());
            m.server_version = (char *)buildinfo_version();
            m.build = build;
            send_msg(c, MLAAPI__FRAME_KIND__FRAME_HELLO_REPLY, &m.base);
        }
        pbapi_request_free(&q);
        return;
    }
    if (kind != MLAAPI__FRAME_KIND__FRAME_HEALTH && !c->authed && api_server_auth_required(s->api)) {
        int retry = 0, st = api_server_auth(s->api, c->peer, q.api_key, &retry);
        if (st) {
            /* a wrong key ends the connection: guessing costs a connection per attempt */
            char m[128];
            if (st == 429)
                snprintf(m, sizeof m, "too many wrong API keys from this address; retry in %d s", retry);
            else
                snprintf(m, sizeof m, "missing or wrong API key (send it in Hello or in the request's api_key)");
            send_error(c, q.request_id,
                       st == 429 ? MLAAPI__ERROR_CODE__ERROR_RESOURCE_EXHAUSTED : MLAAPI__ERROR_CODE__ERROR_UNAUTHENTICATED,
                       "api_key", m);
            pbapi_request_free(&q);
            fatal_quiet(c);
            return;
        }
    }
    switch (kind) {
    case MLAAPI__FRAME_KIND__FRAME_GENERATE: handle_generate(c, &q); break;
    case MLAAPI__FRAME_KIND__FRAME_TOKENIZE: handle_tokenize(c, &q); break;
    case MLAAPI__FRAME_KIND__FRAME_HEALTH: {
        char why[512];
        Mlaapi__HealthResponse m = MLAAPI__HEALTH_RESPONSE__INIT;
        m.has_request_id = m.has_ok = true;
        m.request_id = q.request_id;
        m.ok = api_server_healthy(s->api, why, sizeof(why));
        m.status = m.ok ? "ok" : why;
        send_msg(c, MLAAPI__FRAME_KIND__FRAME_HEALTH_RESPONSE, &m.base);
        break;
    }
    case MLAAPI__FRAME_KIND__FRAME_MODELS: {
        Mlaapi__ModelsResponse m = MLAAPI__MODELS_RESPONSE__INIT;
        Mlaapi__ModelInfo mi = MLAAPI__MODEL_INFO__INIT, *mp = &mi;
        mi.id = (char *)api_server_model_name(s->api);
        mi.has_max_model_len = true;
        mi.max_model_len = (uint32_t)api_server_max_context(s->api);
        mi.owned_by = "mlaserve";
        m.has_request_id = true;
        m.request_id = q.request_id;
        m.n_models = 1;
        m.models = &mp;
        send_msg(c, MLAAPI__FRAME_KIND__FRAME_MODELS_RESPONSE, &m.base);
        break;
    }
    default: { /* FRAME_CANCEL: unknown or finished ids are ignored */
        pb_req *r = find_req(c, q.request_id);
        if (r && r->g) api_server_gen_cancel(r->g, false);
        break;
    }
    }
    pbapi_request_free(&q);
}

/* ---- reading ---- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)h;
    (void)suggested;
    buf->base = mla_xmalloc(65536);
    buf->len = 65536;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    pb_conn *c = st->data;
    if (nread < 0) {
        if (nread != UV_EOF) MLA_DEBUG("pbapi: read from %s: %s", c->peer, uv_strerror((int)nread));
        free(buf->base);
        if (!c->closing) conn_close(c); /* the client left: its requests are cancelled */
        return;
    }
    if (c->closing || c->lingering || nread == 0) {
        free(buf->base);
        return;
    }
    pbapi_framer_feed(&c->fr, buf->base, (size_t)nread);
    free(buf->base);
    pbapi_server *s = c->srv;
    bool got_frame = false;
    for (;;) {
        int kind, code;
        const uint8_t *p;
        size_t len;
        mla_err err = {{0}};
        int rc = pbapi_framer_next(&c->fr, &kind, &p, &len, &code, &err);
        if (rc == 0) break;
        if (rc < 0) {
            if (code == MLAAPI__ERROR_CODE__ERROR_FRAME_TOO_LARGE && !c->authed && api_server_auth_required(s->api))
                mla_errf(&err, "a frame before authentication may have at most %u bytes: send Hello with the API key "
                               "first", (unsigned)c->fr.max_payload);
            fatal(c, code, NULL, err.msg);
            break;
        }
        c->last_active_ms = uv_now(s->loop);
        got_frame = true;
        handle_frame(c, kind, p, len);
        if (c->closing || c->lingering) break;
    }
    if (c->closing) return;
    account(c, got_frame);
    if (!c->lingering && s->buffered > s->cfg.max_buffered_total) {
        MLA_WARN("pbapi: partial frames over all connections exceed %zu bytes; refusing %s", s->cfg.max_buffered_total,
                 c->peer);
        fatal(c, MLAAPI__ERROR_CODE__ERROR_UNAVAILABLE, NULL,
              "the server is busy: too much request data in flight; retry later");
    }
}

static void on_connection(uv_stream_t *ls, int status) {
    pbapi_server *s = ls->data;
    if (status < 0) {
        MLA_WARN("pbapi: accept: %s", uv_strerror(status));
        return;
    }
    pb_conn *c = mla_xcalloc(1, sizeof(*c));
    c->srv = s;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    /* before authentication (when a key is set) frames are small */
    pbapi_framer_init(&c->fr, api_server_auth_required(s->api) && s->cfg.max_preauth_frame < s->cfg.max_frame
                                  ? s->cfg.max_preauth_frame : s->cfg.max_frame);
    c->last_active_ms = uv_now(s->loop);
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    snprintf(c->peer, sizeof(c->peer), "?");
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) < 0) {
        conn_close(c);
        return;
    }
    uvnet_peer_name(&c->tcp, c->peer, sizeof c->peer);
    uv_tcp_nodelay(&c->tcp, 1);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (s->n_conns > s->cfg.max_conns) {
        /* make room by closing the connection idle longest (nothing in flight, no partial
         * frame, nothing queued), if any */
        pb_conn *old = NULL;
        for (pb_conn *o = s->conns; o; o = o->next)
            if (o != c && !o->closing && !o->lingering && o->n_reqs == 0 && o->queued == 0 && buffered_of(o) == 0 &&
                (!old || o->last_active_ms < old->last_active_ms))
                old = o;
        if (old) {
            MLA_DEBUG("pbapi: %d connections open (limit %d); closing idle %s for %s", s->n_conns - 1,
                      s->cfg.max_conns, old->peer, c->peer);
            conn_close(old);
        }
    }
    if (s->n_conns > s->cfg.max_conns) {
        char m[96];
        snprintf(m, sizeof(m), "too many open connections (limit %d)", s->cfg.max_conns);
        fatal(c, MLAAPI__ERROR_CODE__ERROR_UNAVAILABLE, NULL, m);
    }
}

/* Idle and frame timeouts, checked over every connection. */
static void on_sweep(uv_timer_t *t) {
    pbapi_server *s = t->data;
    uint64_t now = uv_now(s->loop);
    for (pb_conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->closing || c->lingering) continue;
        if (buffered_of(c) > 0) {
            if (s->cfg.frame_timeout_ms && now - c->frame_start_ms >= s->cfg.frame_timeout_ms) {
                char m[96];
                snprintf(m, sizeof m, "a frame was not completed within %u ms", s->cfg.frame_timeout_ms);
                fatal(c, MLAAPI__ERROR_CODE__ERROR_BAD_FRAME, NULL, m);
            }
        } else if (c->n_reqs == 0 && c->queued == 0 && s->cfg.idle_timeout_ms &&
                   now - c->last_active_ms >= s->cfg.idle_timeout_ms) {
            MLA_DEBUG("pbapi: %s idle for %u ms; closing", c->peer, s->cfg.idle_timeout_ms);
            conn_close(c);
        }
    }
}

/* ---- server ---- */

int pbapi_server_init(pbapi_server **out, uv_loop_t *loop, api_server *api, const pbapi_config *cfg, mla_err *err) {
    *out = NULL;
    pbapi_config d;
    pbapi_config_default(&d);
    if (!cfg) cfg = &d;
    if (cfg->max_frame < 64 || cfg->max_conns < 1 || cfg->max_inflight < 1 || cfg->max_write_queue < 4096 ||
        cfg->max_preauth_frame < 64 || cfg->max_buffered_total < cfg->max_frame)
        return mla_errf(err, "pbapi: a limit is out of range (max_frame and max_preauth_frame >= 64, max_conns and "
                             "max_inflight >= 1, max_write_queue >= 4096, max_buffered_total >= max_frame)");
    pbapi_server *s = mla_xcalloc(1, sizeof(*s));
    s->loop = loop;
    s->api = api;
    s->cfg = *cfg;
    int rc = uv_tcp_init(loop, &s->listener);
    if (rc < 0) {
        free(s);
        return mla_errf(err, "pbapi: uv_tcp_init: %s", uv_strerror(rc));
    }
    s->listener.data = s;
    uv_timer_init(loop, &s->sweep);
    s->sweep.data = s;
    s->sweep_open = true;
    unsigned tick = 1000;
    if (s->cfg.idle_timeout_ms && s->cfg.idle_timeout_ms / 4 < tick) tick = s->cfg.idle_timeout_ms / 4;
    if (s->cfg.frame_timeout_ms && s->cfg.frame_timeout_ms / 4 < tick) tick = s->cfg.frame_timeout_ms / 4;
    if (tick < 10) tick = 10;
    uv_timer_start(&s->sweep, on_sweep, tick, tick);
    *out = s;
    return MLA_OK;
}

int pbapi_server_listen(pbapi_server *s, const char *host, int port, int *bound_port, mla_err *err) {
    if (uvnet_listen(&s->listener, host, port, on_connection, bound_port, err))
        return mla_err_prefix(err, "pbapi");
    s->listening = true;
    return MLA_OK;
}

static void on_listener_closed(uv_handle_t *h) {
    pbapi_server *s = h->data;
    s->n_closing--;
}

void pbapi_server_close(pbapi_server *s) {
    if (!s || s->closed) return;
    s->closed = true;
    s->n_closing++;
    uv_close((uv_handle_t *)&s->listener, on_listener_closed);
    if (s->sweep_open) {
        s->sweep_open = false;
        s->n_closing++;
        uv_close((uv_handle_t *)&s->sweep, on_listener_closed);
    }
    while (s->conns) conn_close(s->conns);
}

void pbapi_server_free(pbapi_server *s) {
    if (!s) return;
    pbapi_server_close(s);
    while (s->n_closing > 0) uv_run(s->loop, UV_RUN_ONCE);
    free(s);
}

int pbapi_server_n_conns(const pbapi_server *s) { return s->n_conns; }
