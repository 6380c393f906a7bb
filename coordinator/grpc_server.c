/* grpc_server: see grpc_server.h. */
#include "coordinator/grpc_server.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/buildinfo.h"
#include "common/mla_log.h"
#include "coordinator/grpc_msg.h"
#include "coordinator/uvnet.h"

typedef struct gs_conn gs_conn;

typedef struct gs_call {
    gs_conn *c;
    struct gs_call *prev, *next;
    int32_t sid;
    int method;
    uint64_t request_id;  /* Generate: its name for Cancel (0: none) */
    api_gen *g;
    api_tok_job *tj;      /* a Tokenize on the prep thread */
    uint64_t deadline_ms; /* loop time; 0: none */
    bool logprobs;
    bool prompt_ids;      /* Generate: the prompt came as prompt_ids (a refusal names that field) */
    uint32_t index;       /* tokens sent */
    int watch_status;     /* Health.Watch: the status last sent */
} gs_call;

struct gs_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    grpc_server *srv;
    gs_conn *prev, *next;
    grpc_conn *h2;
    SSL *ssl;
    BIO *rbio, *wbio; /* owned by ssl */
    bool closing;
    bool in_recv; /* inside grpc_conn_recv: nghttp2 must not be asked for output */
    gs_call *calls;
    int n_calls;
    size_t queued;        /* bytes handed to uv_write, not yet written */
    size_t received;      /* plaintext bytes taken (the HTTP/2 preface is 24) */
    char peer[64];
    uint64_t accepted_ms, last_active_ms;
    uint64_t stall_sent, stall_since_ms; /* the reply bytes taken at the last sweep; since when none */
    uint64_t notice_ms;                  /* draining: when the GOAWAY notice was given (0: not yet) */
    bool last_goaway;                    /* draining: the GOAWAY that names the last call was given */
    bool answered;                       /* a call of it has ended (a connection made while draining
                                          * gets its notice once its calls are answered) */
};

struct grpc_server {
    uv_loop_t *loop;
    api_server *api;
    grpc_config cfg;
    SSL_CTX *tls;
    uv_tcp_t listener;
    bool listening, closed;
    bool draining; /* grpc_server_drain: every connection is told GOAWAY (one made during the drain
                    * once it has answered its calls) */
    gs_conn *conns;
    int n_conns, n_closing;
    size_t buffered;  /* request bytes buffered over the connections (grpc_conn_limits.total_buffered) */
    uv_timer_t sweep; /* deadlines, idle and handshake timeouts, Health.Watch */
    bool sweep_open;
    uint64_t last_watch_ms;
};

void grpc_config_default(grpc_config *c) {
    memset(c, 0, sizeof(*c));
    grpc_conn_limits_default(&c->conn);
    c->max_conns = 1024;
    c->max_write_queue = 16u << 20;
    c->idle_timeout_ms = 60000;
    c->stall_timeout_ms = 30000;
    c->handshake_timeout_ms = 10000;
}

/* ---- connection lifetime ---- */

static void on_handle_closed(uv_handle_t *h) {
    gs_conn *c = h->data;
    c->srv->n_closing--;
    free(c);
}

static void on_tcp_closed(uv_handle_t *h) {
    gs_conn *c = h->data;
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

static void call_unlink(gs_call *r) {
    gs_conn *c = r->c;
    if (r->prev)
        r->prev->next = r->next;
    else
        c->calls = r->next;
    if (r->next) r->next->prev = r->prev;
    c->n_calls--;
    c->answered = true;
    free(r);
}

/* The call's work stops (no more output); the call is gone. */
static void call_drop(gs_call *r) {
    if (r->g) api_server_gen_cancel(r->g, true);
    if (r->tj) api_server_tokenize_detach(r->tj);
    call_unlink(r);
}

/* a connection whose held reply has had none of its bytes taken this long may be closed for a new
 * one beyond max_conns when none is idle (the sweep sets stall_since_ms) */
#define GS_STALL_EVICT_MS 1000

/* no call in flight and nothing of a reply left to send (queued for the socket, or held back by
 * the client's flow control): what the idle timeout and the connection limit may close */
static bool conn_idle(const gs_conn *c) {
    return c->n_calls == 0 && c->queued == 0 && (!c->h2 || grpc_conn_out_pending(c->h2) == 0);
}

static void conn_close(gs_conn *c) {
    if (c->closing) return;
    c->closing = true;
    grpc_server *s = c->srv;
    while (c->calls) call_drop(c->calls); /* cancelled in the scheduler */
    grpc_conn_free(c->h2);
    c->h2 = NULL;
    if (c->ssl) SSL_free(c->ssl);
    c->ssl = NULL;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_conns--;
    s->n_closing++;
    uv_timer_stop(&c->timer);
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_close((uv_handle_t *)&c->tcp, on_tcp_closed);
}

static void on_close_timer(uv_timer_t *t) { conn_close(t->data); }

/* Closing from inside a callback of grpc_conn or of a sink would free what is in use: close
 * from the timer. */
static void close_soon(gs_conn *c) {
    if (c->closing) return;
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_timer_start(&c->timer, on_close_timer, 0, 0);
}

/* ---- writing ---- */

typedef struct wreq {
    uv_write_t w;
    gs_conn *c;
    size_t len;
    uint8_t *data;
} wreq;

/* Neither side of the connection wants more (grpc_conn_done) and every byte it gave is
 * out: it may close. */
static bool conn_finished(const gs_conn *c) {
    return c->h2 && !c->in_recv && c->queued == 0 && grpc_conn_done(c->h2);
}

static void on_written(uv_write_t *w, int status) {
    wreq *r = (wreq *)w;
    gs_conn *c = r->c;
    c->queued -= r->len;
    free(r->data);
    free(r);
    if (c->closing) return;
    c->last_active_ms = uv_now(c->srv->loop);
    if (status < 0) {
        MLA_DEBUG("grpc: write to %s failed: %s", c->peer, uv_strerror(status));
        close_soon(c);
    } else if (conn_finished(c)) {
        close_soon(c); /* the connection's last bytes (a final GOAWAY, trailers) are out */
    }
}

static void write_raw(gs_conn *c, uint8_t *data, size_t len) {
    if (!len) {
        free(data);
        return;
    }
    wreq *r = mla_xcalloc(1, sizeof(*r));
    r->c = c;
    r->data = data;
    r->len = len;
    uv_buf_t buf = uv_buf_init((char *)data, (unsigned)len);
    c->queued += len;
    if (uv_write(&r->w, (uv_stream_t *)&c->tcp, &buf, 1, on_written) < 0) {
        c->queued -= len;
        free(data);
        free(r);
        close_soon(c);
        return;
    }
    if (c->queued > c->srv->cfg.max_write_queue) {
        MLA_WARN("grpc: client %s leaves %zu bytes unread; closing", c->peer, c->queued);
        close_soon(c);
    }
}

/* What TLS has to send. */
static void flush_tls(gs_conn *c) {
    size_t pending;
    while ((pending = BIO_ctrl_pending(c->wbio)) > 0) {
        uint8_t *b = mla_xmalloc(pending);
        int n = BIO_read(c->wbio, b, (int)pending);
        if (n <= 0) {
            free(b);
            break;
        }
        write_raw(c, b, (size_t)n);
    }
}

/* Sends what the HTTP/2 connection has ready; closes when it is done and its bytes are out
 * (else on_written does). */
static void flush(gs_conn *c) {
    if (c->closing || !c->h2 || c->in_recv) return;
    if (c->ssl && !SSL_is_init_finished(c->ssl)) {
        flush_tls(c);
        return;
    }
    uint8_t *out;
    size_t n = grpc_conn_take_output(c->h2, &out);
    if (c->ssl) {
        if (n && SSL_write(c->ssl, out, (int)n) <= 0) {
            free(out);
            close_soon(c);
            return;
        }
        free(out);
        flush_tls(c);
    } else {
        write_raw(c, out, n);
    }
    if (conn_finished(c)) close_soon(c);
}

/* the TLS handshake (where there is one) and the client's HTTP/2 preface are done */
static bool h2_up(const gs_conn *c) { return c->received >= 24 && (!c->ssl || SSL_is_init_finished(c->ssl)); }

/* conn_close of an idle connection, after a GOAWAY (no error) where HTTP/2 is up: the client
 * then opens a new connection for its next call instead of failing it on this one */
static void conn_goaway_close(gs_conn *c) {
    if (!c->closing && c->h2 && !c->in_recv && h2_up(c)) {
        grpc_conn_goaway(c->h2);
        flush(c);
    }
    conn_close(c);
}

#define GS_SWEEP_MS 20 /* how often deadlines, timeouts and Watch changes are looked at (docs/grpc.md) */

/* Draining: the notice that no new calls are taken (GOAWAY, calls in flight go on); the sweep
 * gives the GOAWAY that names the last call GS_LAST_GOAWAY_MS later (a round trip and more: calls
 * the client started before it heard the notice are still taken). */
#define GS_LAST_GOAWAY_MS 1000
static void conn_notice(gs_conn *c) {
    if (c->closing || !c->h2 || c->notice_ms) return;
    grpc_conn_shutdown(c->h2);
    c->notice_ms = uv_now(c->srv->loop) | 1; /* never 0 */
    flush(c);
}

/* ---- answers ---- */

static void send_msg(gs_call *r, const ProtobufCMessage *m) {
    gs_conn *c = r->c;
    if (grpc_conn_send_msg(c->h2, r->sid, m) != MLA_OK) {
        /* the client does not take its output: the call is reset */
        MLA_WARN("grpc: client %s does not read call %d; cancelled", c->peer, r->sid);
        call_drop(r);
        flush(c);
        return;
    }
    flush(c);
}

static void finish(gs_call *r, int status, const char *msg) {
    gs_conn *c = r->c;
    grpc_conn_finish(c->h2, r->sid, status, msg);
    call_unlink(r);
    flush(c);
}

/* The server ends a call still at work (its deadline passed, the server closes): its generation
 * is cancelled in the scheduler, its Tokenize left to the prep thread, then the status. */
static void finish_cut(gs_call *r, int status, const char *msg) {
    if (r->g) api_server_gen_cancel(r->g, true);
    if (r->tj) api_server_tokenize_detach(r->tj);
    r->g = NULL;
    r->tj = NULL;
    finish(r, status, msg);
}

/* Messages sent on a call that may have been dropped by send_msg: find it again. */
static gs_call *find_sid(gs_conn *c, int32_t sid) {
    for (gs_call *r = c->calls; r; r = r->next)
        if (r->sid == sid) return r;
    return NULL;
}

/* ---- generation output ---- */

static void send_token(gs_call *r, const char *text, size_t from, size_t to, const api_token *t) {
    Mlaapi__GenerateResponse m = MLAAPI__GENERATE_RESPONSE__INIT;
    if (r->request_id) {
        m.has_request_id = true;
        m.request_id = r->request_id;
    }
    m.has_token_id = true;
    m.token_id = t->id;
    if (t->prompt) { /* echo: a prompt token, outside the completion's indexes */
        m.has_prompt = m.prompt = true;
    } else {
        m.has_index = true;
        m.index = r->index++;
    }
    size_t n;
    char *s = api_utf8_sanitize(text + from, to - from, &n);
    m.text = s;
    Mlaapi__TopLogprob tops[SCHED_MAX_TOP_LOGPROBS], *topp[SCHED_MAX_TOP_LOGPROBS];
    if (r->logprobs && !t->no_lp) {
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
    send_msg(r, &m.base);
    free(s);
}

/* One message per token; the text [from, to) is shared out so that each piece ends on a UTF-8
 * boundary (the last token takes the rest). Returns where the sent text ends, or (size_t)-1
 * when the call was dropped. */
static size_t send_tokens(gs_call *r, const char *text, size_t from, size_t to, const api_token *toks, int n) {
    size_t cur = from;
    gs_conn *c = r->c;
    int32_t sid = r->sid;
    for (int k = 0; k < n; k++) {
        size_t e = to;
        if (k < n - 1) {
            e = toks[k].end < to ? toks[k].end : to;
            e = api_utf8_complete_prefix(text, e);
            if (e < cur) e = cur;
        }
        send_token(r, text, cur, e, &toks[k]);
        if (!find_sid(c, sid)) return (size_t)-1;
        cur = e;
    }
    return cur;
}

static void on_delta(void *ud, const char *text, size_t from, size_t to, const api_token *toks, int n) {
    send_tokens(ud, text, from, to, toks, n);
}

static void on_final(void *ud, const char *text, size_t from, size_t to, const api_token *toks, int n,
                     const char *finish_reason, const char *error, enum api_end end, int32_t n_prompt,
                     int32_t n_completion) {
    gs_call *r = ud;
    r->g = NULL;
    if (error) { /* cut off by the server's shutdown or a worker group down: UNAVAILABLE, which clients may retry */
        const bool retry = end == API_END_SHUTDOWN || end == API_END_UNAVAILABLE;
        finish(r, end == API_END_CANCELLED ? GRPC_CANCELLED : retry ? GRPC_UNAVAILABLE : GRPC_INTERNAL, error);
        return;
    }
    size_t cur = send_tokens(r, text, from, to, toks, n);
    if (cur == (size_t)-1) return;
    Mlaapi__GenerateResponse m = MLAAPI__GENERATE_RESPONSE__INIT;
    Mlaapi__Usage u = MLAAPI__USAGE__INIT;
    if (r->request_id) {
        m.has_request_id = true;
        m.request_id = r->request_id;
    }
    size_t len;
    char *s = api_utf8_sanitize(text + cur, to > cur ? to - cur : 0, &len);
    m.text = s;
    m.finish_reason = (char *)finish_reason;
    u.has_prompt_tokens = u.has_completion_tokens = u.has_total_tokens = true;
    u.prompt_tokens = (uint32_t)n_prompt;
    u.completion_tokens = (uint32_t)n_completion;
    u.total_tokens = (uint32_t)(n_prompt + n_completion);
    m.usage = &u;
    gs_conn *c = r->c;
    int32_t sid = r->sid;
    send_msg(r, &m.base);
    free(s);
    if (find_sid(c, sid)) finish(r, GRPC_OK, NULL);
}

/* ---- calls ---- */

static int status_code(int http_status) {
    switch (http_status) {
    case 400: return GRPC_INVALID_ARGUMENT;
    case 401: return GRPC_UNAUTHENTICATED;
    case 404: return GRPC_NOT_FOUND;
    case 429: return GRPC_RESOURCE_EXHAUSTED;
    case 503: return GRPC_UNAVAILABLE;
    default: return GRPC_INTERNAL;
    }
}

/* A refusal: msg led by the field it is about ("" none) where msg does not name it already */
static void finish_field(gs_call *r, int status, const char *field, const char *msg) {
    char m[sizeof ((api_error *)0)->message + 64]; /* as long as mla_err's msg, with room for the field */
    if (field[0] && !strstr(msg, field))
        snprintf(m, sizeof m, "%s: %s", field, msg);
    else
        snprintf(m, sizeof m, "%s", msg);
    finish(r, status, m);
}

/* An api_server refusal: its status, and its field as the proto names it (a prompt given as ids
 * is prompt_ids), as the decoder's refusals name theirs. */
static void finish_api(gs_call *r, const api_error *e) {
    finish_field(r, status_code(e->status), !strcmp(e->param, "prompt") && r->prompt_ids ? "prompt_ids" : e->param,
                 e->message);
}

/* The prompt was refused after the prep thread made it (api_sink.on_refused). */
static void on_refused(void *ud, const api_error *e) {
    gs_call *r = ud;
    r->g = NULL;
    finish_api(r, e);
}

static void tokenize_done(void *ud, const int32_t *ids, int32_t n, const api_error *e) {
    gs_call *r = ud;
    r->tj = NULL;
    if (e) {
        finish_api(r, e);
        return;
    }
    Mlaapi__TokenizeResponse m = MLAAPI__TOKENIZE_RESPONSE__INIT;
    m.n_ids = (size_t)n;
    m.ids = (int32_t *)ids;
    m.max_model_len = (uint32_t)api_server_max_context(r->c->srv->api);
    m.has_max_model_len = m.max_model_len > 0; /* not known while the workers load */
    gs_conn *c = r->c;
    int32_t sid = r->sid;
    send_msg(r, &m.base);
    if (find_sid(c, sid)) finish(r, GRPC_OK, NULL);
}

static int health_status(grpc_server *s) {
    char why[64];
    return api_server_healthy(s->api, why, sizeof why) ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                                                       : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

static void send_health(gs_call *r, int st) {
    Grpc__Health__V1__HealthCheckResponse m = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    m.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)st;
    r->watch_status = st;
    send_msg(r, &m.base);
}

static bool known_service(const char *name) { return !name[0] || !strcmp(name, "mlaapi.MlaServe"); }

static void handle(gs_call *r, grpc_request *q) {
    gs_conn *c = r->c;
    grpc_server *s = c->srv;
    int32_t sid = r->sid;
    switch (r->method) {
    case GRPC_M_GENERATE: {
        if (q->request_id) {
            for (gs_call *o = c->calls; o; o = o->next)
                if (o != r && o->method == GRPC_M_GENERATE && o->request_id == q->request_id) {
                    char m[96];
                    snprintf(m, sizeof m, "request_id %llu is already in flight on this connection",
                             (unsigned long long)q->request_id);
                    finish(r, GRPC_INVALID_ARGUMENT, m);
                    return;
                }
        }
        r->request_id = q->request_id;
        r->logprobs = q->gen.logprobs;
        r->prompt_ids = q->gen.prompt_ids != NULL;
        /* the prompt is made off the loop thread: other clients are not held up by a big one */
        api_sink sink = {.ud = r, .on_delta = on_delta, .on_final = on_final, .on_refused = on_refused};
        api_error e;
        r->g = api_server_generate(s->api, &q->gen, &sink, &e);
        if (!r->g) finish_api(r, &e);
        return;
    }
    case GRPC_M_TOKENIZE:
        /* tokenized on the prep thread, in order with the other requests */
        r->tj = api_server_tokenize_async(s->api, q->text, q->messages, q->add_special, tokenize_done, r);
        return;
    case GRPC_M_HEALTH: {
        char why[512];
        Mlaapi__HealthResponse m = MLAAPI__HEALTH_RESPONSE__INIT;
        m.has_ok = true;
        m.ok = api_server_healthy(s->api, why, sizeof(why));
        m.status = m.ok ? "ok" : why;
        send_msg(r, &m.base);
        break;
    }
    case GRPC_M_MODELS: {
        Mlaapi__ModelsResponse m = MLAAPI__MODELS_RESPONSE__INIT;
        const char *const *names;
        const int n = api_server_model_names(s->api, &names);
        Mlaapi__ModelInfo *mi = mla_xcalloc((size_t)n, sizeof *mi), **mp = mla_xcalloc((size_t)n, sizeof *mp);
        for (int i = 0; i < n; i++) {
            mlaapi__model_info__init(&mi[i]);
            mi[i].id = (char *)names[i];
            mi[i].max_model_len = (uint32_t)api_server_max_context(s->api);
            mi[i].has_max_model_len = mi[i].max_model_len > 0; /* not known while the workers load */
            mi[i].owned_by = "mlaserve";
            mp[i] = &mi[i];
        }
        m.n_models = (size_t)n;
        m.models = mp;
        send_msg(r, &m.base);
        free(mp);
        free(mi);
        break;
    }
    case GRPC_M_INFO: {
        Mlaapi__InfoResponse m = MLAAPI__INFO_RESPONSE__INIT;
        m.has_max_message = true;
        m.max_message = s->cfg.conn.max_msg;
        m.server = "mlaserve";
        m.model = (char *)api_server_model_name(s->api);
        char build[256];
        snprintf(build, sizeof build, "commit %s, %s, %s%s", buildinfo_commit(), buildinfo_type(),
                 buildinfo_cuda_archs()[0] ? "CUDA sm_" : "CPU only", buildinfo_cuda_archs());
        m.server_version = (char *)buildinfo_version();
        m.build = build;
        send_msg(r, &m.base);
        break;
    }
    case GRPC_M_CANCEL: {
        /* unknown or finished ids are not an error; the call named ends now (CANCELLED), as a
         * deadline ends one, its generation cancelled in the scheduler (a queued one too) */
        for (gs_call *o = c->calls, *next; o; o = next) {
            next = o->next;
            if (o != r && o->method == GRPC_M_GENERATE && o->request_id == q->request_id && o->g)
                finish_cut(o, GRPC_CANCELLED, "cancelled by Cancel(request_id)");
        }
        Mlaapi__GenerateResponse m = MLAAPI__GENERATE_RESPONSE__INIT;
        m.has_request_id = true;
        m.request_id = q->request_id;
        send_msg(r, &m.base);
        break;
    }
    case GRPC_M_HC_CHECK:
        if (!known_service(q->text)) {
            finish(r, GRPC_NOT_FOUND, "unknown service");
            return;
        }
        send_health(r, health_status(s));
        break;
    default: /* GRPC_M_HC_WATCH: the status now, then each change (checked every second) */
        send_health(r, known_service(q->text) ? health_status(s)
                                              : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN);
        if (!known_service(q->text)) r->watch_status = -1; /* never changes */
        return;
    }
    if (find_sid(c, sid)) finish(r, GRPC_OK, NULL);
}

/* "Bearer <key>" -> key (NULL when absent or another scheme). */
static const char *bearer(const char *auth) {
    if (!auth || strncasecmp(auth, "Bearer ", 7)) return NULL;
    auth += 7;
    while (*auth == ' ') auth++;
    return auth;
}

/* A request's headers are in (grpc_conn's on_headers): every call but the health checks needs the
 * key when the api_server has one, checked here, before its message is read, so that a client
 * without the key cannot make the server hold its data. Two authorization fields refuse a call
 * that needs the key (which one to take would be a guess); on one that does not, they are
 * nothing. */
static int on_headers(void *ud, int method, const char *authorization, bool two_auth, char *msg, size_t msg_size) {
    gs_conn *c = ud;
    grpc_server *s = c->srv;
    const bool open = method == GRPC_M_HEALTH || method == GRPC_M_HC_CHECK || method == GRPC_M_HC_WATCH;
    if (open || !api_server_auth_required(s->api)) return GRPC_OK;
    if (two_auth) {
        snprintf(msg, msg_size, "more than one authorization header");
        return GRPC_UNAUTHENTICATED;
    }
    int retry = 0;
    const int st = api_server_auth(s->api, c->peer, bearer(authorization), &retry);
    if (!st) return GRPC_OK;
    if (st == 429) {
        snprintf(msg, msg_size, "too many wrong API keys from this address; retry in %d s", retry);
        return GRPC_RESOURCE_EXHAUSTED;
    }
    snprintf(msg, msg_size, "missing or wrong API key (send the metadata authorization: Bearer <key>)");
    return GRPC_UNAUTHENTICATED;
}

static void on_call(void *ud, const grpc_call_in *in) {
    gs_conn *c = ud;
    grpc_server *s = c->srv;
    gs_call *r = mla_xcalloc(1, sizeof(*r));
    r->c = c;
    r->sid = in->stream_id;
    r->method = in->method;
    r->next = c->calls;
    if (c->calls) c->calls->prev = r;
    c->calls = r;
    c->n_calls++;
    if (in->timeout_ms >= 0) {
        if (in->timeout_ms == 0) {
            finish(r, GRPC_DEADLINE_EXCEEDED, "the deadline had passed when the call arrived");
            return;
        }
        r->deadline_ms = uv_now(s->loop) + (uint64_t)in->timeout_ms;
    }
    /* the key: checked with the headers (on_headers) */
    grpc_request q;
    char param[48];
    mla_err err = {{0}};
    if (grpc_request_decode(in->method, in->msg, in->len, &q, param, &err) != MLA_OK) {
        finish_field(r, GRPC_INVALID_ARGUMENT, param, err.msg);
    } else {
        handle(r, &q);
    }
    grpc_request_free(&q);
}

static uint64_t now_ms(void *ud) { return uv_now(((gs_conn *)ud)->srv->loop); }

static void on_cancel(void *ud, int32_t sid) {
    gs_conn *c = ud;
    gs_call *r = find_sid(c, sid);
    if (r) call_drop(r); /* the client reset the call: its generation is cancelled */
}

/* ---- reading ---- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)h;
    (void)suggested;
    buf->base = mla_xmalloc(65536);
    buf->len = 65536;
}

static bool feed(gs_conn *c, const uint8_t *p, size_t n) {
    mla_err err = {{0}};
    c->received += n;
    c->in_recv = true;
    int rc = grpc_conn_recv(c->h2, p, n, &err);
    c->in_recv = false;
    if (rc != MLA_OK) {
        MLA_INFO("grpc: client %s: %s; closing", c->peer, err.msg);
        flush(c); /* the GOAWAY */
        close_soon(c);
        return false;
    }
    return true;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    gs_conn *c = st->data;
    if (nread < 0) {
        if (nread != UV_EOF) MLA_DEBUG("grpc: read from %s: %s", c->peer, uv_strerror((int)nread));
        free(buf->base);
        close_soon(c); /* the client left: its calls are cancelled */
        return;
    }
    if (c->closing || nread == 0) {
        free(buf->base);
        return;
    }
    c->last_active_ms = uv_now(c->srv->loop);
    if (!c->ssl) {
        feed(c, (const uint8_t *)buf->base, (size_t)nread);
        free(buf->base);
        flush(c);
        return;
    }
    BIO_write(c->rbio, buf->base, (int)nread);
    free(buf->base);
    uint8_t plain[16384];
    for (;;) {
        int n = SSL_read(c->ssl, plain, sizeof plain);
        if (n > 0) {
            if (!feed(c, plain, (size_t)n)) return;
            continue;
        }
        int e = SSL_get_error(c->ssl, n);
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) break;
        if (e != SSL_ERROR_ZERO_RETURN) {
            char m[256];
            ERR_error_string_n(ERR_get_error(), m, sizeof m);
            MLA_INFO("grpc: client %s: TLS: %s; closing", c->peer, m);
        }
        flush_tls(c); /* an alert */
        close_soon(c);
        return;
    }
    flush(c);
}

static void on_connection(uv_stream_t *ls, int status) {
    grpc_server *s = ls->data;
    if (status < 0) {
        MLA_WARN("grpc: accept: %s", uv_strerror(status));
        return;
    }
    gs_conn *c = mla_xcalloc(1, sizeof(*c));
    c->srv = s;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->accepted_ms = c->last_active_ms = uv_now(s->loop);
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    snprintf(c->peer, sizeof(c->peer), "?");
    grpc_conn_cbs cb = {
        .ud = c, .on_headers = on_headers, .on_call = on_call, .on_cancel = on_cancel, .now_ms = now_ms};
    mla_err err = {{0}};
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) < 0 || grpc_conn_init(&c->h2, &s->cfg.conn, &cb, &err) != MLA_OK) {
        conn_close(c);
        return;
    }
    uvnet_peer_name(&c->tcp, c->peer, sizeof c->peer);
    uv_tcp_nodelay(&c->tcp, 1);
    if (s->tls) {
        c->ssl = SSL_new(s->tls);
        c->rbio = BIO_new(BIO_s_mem());
        c->wbio = BIO_new(BIO_s_mem());
        SSL_set_bio(c->ssl, c->rbio, c->wbio);
        SSL_set_accept_state(c->ssl);
    }
    if (s->n_conns > s->cfg.max_conns) {
        /* make room by closing the connection idle longest (no call, nothing queued), if any; else
         * the one whose held reply has had none of its bytes taken longest, for a second or more
         * (a client that stopped reading: the write timeout would close it later) */
        gs_conn *old = NULL, *held = NULL;
        const uint64_t now = uv_now(s->loop);
        for (gs_conn *o = s->conns; o; o = o->next) {
            if (o == c || o->closing) continue;
            if (conn_idle(o)) {
                if (!old || o->last_active_ms < old->last_active_ms) old = o;
            } else if (o->stall_since_ms && now - o->stall_since_ms >= GS_STALL_EVICT_MS &&
                       (!held || o->stall_since_ms < held->stall_since_ms)) {
                held = o;
            }
        }
        if (old) {
            MLA_DEBUG("grpc: %d connections open (limit %d); closing idle %s for %s", s->n_conns - 1,
                      s->cfg.max_conns, old->peer, c->peer);
            conn_goaway_close(old);
        } else if (held) {
            MLA_WARN("grpc: %d connections open (limit %d); closing %s, which takes none of its reply, for %s",
                     s->n_conns - 1, s->cfg.max_conns, held->peer, c->peer);
            conn_close(held);
        }
    }
    if (s->n_conns > s->cfg.max_conns) {
        MLA_WARN("grpc: too many open connections (limit %d); refusing %s", s->cfg.max_conns, c->peer);
        conn_close(c);
        return;
    }
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    /* during a drain too: its calls are answered first (a new Generate UNAVAILABLE), then the
     * sweep gives its notice. A notice before any call would make a client such as grpcio move its
     * call to yet another connection, told the same, over and over until the server is gone. */
    flush(c); /* the server's SETTINGS (plain h2c) */
}

/* Deadlines, idle and handshake timeouts, Health.Watch changes. */
static void on_sweep(uv_timer_t *t) {
    grpc_server *s = t->data;
    uint64_t now = uv_now(s->loop);
    int hs = -2;
    if (now - s->last_watch_ms >= 1000) {
        s->last_watch_ms = now;
        hs = -1;
    }
    for (gs_conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->closing) continue;
        for (gs_call *r = c->calls, *rn; r; r = rn) {
            rn = r->next;
            if (r->deadline_ms && now >= r->deadline_ms) {
                finish_cut(r, GRPC_DEADLINE_EXCEEDED, "deadline exceeded");
            } else if (r->method == GRPC_M_HC_WATCH && hs != -2 && r->watch_status >= 0) {
                if (hs < 0) hs = health_status(s);
                if (hs != r->watch_status) send_health(r, hs);
            }
        }
        if (c->closing) continue;
        if (c->h2 && !c->in_recv && grpc_conn_expire(c->h2, now)) flush(c); /* requests not complete in time */
        if (c->closing) continue;
        if (s->draining && !c->notice_ms && c->answered && !c->calls && h2_up(c) && !c->in_recv) conn_notice(c);
        if (c->notice_ms && !c->last_goaway && h2_up(c) && !c->in_recv && now - c->notice_ms >= GS_LAST_GOAWAY_MS) {
            grpc_conn_last_goaway(c->h2);
            c->last_goaway = true;
            flush(c); /* closes once no call is left and its bytes are out */
            if (c->closing) continue;
        }
        if (!h2_up(c) && s->cfg.handshake_timeout_ms && now - c->accepted_ms >= s->cfg.handshake_timeout_ms) {
            MLA_DEBUG("grpc: %s did not start HTTP/2 within %u ms; closing", c->peer, s->cfg.handshake_timeout_ms);
            conn_close(c);
        } else if (conn_idle(c) && s->cfg.idle_timeout_ms &&
                   now - c->last_active_ms >= s->cfg.idle_timeout_ms) {
            MLA_DEBUG("grpc: %s idle for %u ms; closing", c->peer, s->cfg.idle_timeout_ms);
            conn_goaway_close(c);
        } else if (c->h2) { /* a reply held back: its bytes must be taken now and then (traffic
                             * the client sends, a PING, is not progress) */
            const size_t held = c->queued + grpc_conn_out_pending(c->h2);
            const uint64_t sent = grpc_conn_out_sent(c->h2);
            if (!held || sent != c->stall_sent || !c->stall_since_ms) c->stall_since_ms = now;
            c->stall_sent = sent;
            if (held && s->cfg.stall_timeout_ms && now - c->stall_since_ms >= s->cfg.stall_timeout_ms) {
                MLA_WARN("grpc: %s took none of a reply (%zu bytes held) for %u ms; closing", c->peer, held,
                         s->cfg.stall_timeout_ms);
                conn_close(c);
            }
        }
    }
}

/* ---- server ---- */

static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
                       unsigned int inlen, void *arg) {
    (void)ssl;
    (void)arg;
    for (unsigned i = 0; i < inlen;) {
        unsigned n = in[i];
        if (i + 1 + n > inlen) break;
        if (n == 2 && !memcmp(in + i + 1, "h2", 2)) {
            *out = in + i + 1;
            *outlen = 2;
            return SSL_TLSEXT_ERR_OK;
        }
        i += 1 + n;
    }
    return SSL_TLSEXT_ERR_ALERT_FATAL; /* gRPC is HTTP/2 only */
}

static int tls_init(grpc_server *s, mla_err *err) {
    if (!s->cfg.tls_cert && !s->cfg.tls_key) return MLA_OK;
    if (!s->cfg.tls_cert || !s->cfg.tls_key) return mla_errf(err, "grpc: TLS needs both a certificate and a key");
    s->tls = SSL_CTX_new(TLS_server_method());
    if (!s->tls) return mla_errf(err, "grpc: SSL_CTX_new failed");
    SSL_CTX_set_min_proto_version(s->tls, TLS1_2_VERSION);
    char m[256];
    if (SSL_CTX_use_certificate_chain_file(s->tls, s->cfg.tls_cert) != 1) {
        ERR_error_string_n(ERR_get_error(), m, sizeof m);
        return mla_errf(err, "grpc: TLS certificate %s: %s", s->cfg.tls_cert, m);
    }
    if (SSL_CTX_use_PrivateKey_file(s->tls, s->cfg.tls_key, SSL_FILETYPE_PEM) != 1) {
        ERR_error_string_n(ERR_get_error(), m, sizeof m);
        return mla_errf(err, "grpc: TLS key %s: %s", s->cfg.tls_key, m);
    }
    if (SSL_CTX_check_private_key(s->tls) != 1)
        return mla_errf(err, "grpc: TLS key %s does not match the certificate %s", s->cfg.tls_key, s->cfg.tls_cert);
    SSL_CTX_set_alpn_select_cb(s->tls, alpn_select, NULL);
    return MLA_OK;
}

int grpc_server_init(grpc_server **out, uv_loop_t *loop, api_server *api, const grpc_config *cfg, mla_err *err) {
    *out = NULL;
    grpc_config d;
    grpc_config_default(&d);
    if (!cfg) cfg = &d;
    if (cfg->conn.max_msg < 64 || cfg->conn.max_streams < 1 || cfg->max_conns < 1 || cfg->max_write_queue < 4096 ||
        cfg->conn.max_buffered < cfg->conn.max_msg)
        return mla_errf(err, "grpc: a limit is out of range (max_msg >= 64, max_streams and max_conns >= 1, "
                             "max_write_queue >= 4096, max_buffered >= max_msg)");
    grpc_server *s = mla_xcalloc(1, sizeof(*s));
    s->loop = loop;
    s->api = api;
    s->cfg = *cfg;
    s->cfg.conn.total_buffered = &s->buffered; /* request bytes over every connection */
    if (tls_init(s, err) != MLA_OK) {
        SSL_CTX_free(s->tls);
        free(s);
        return MLA_ERR;
    }
    int rc = uv_tcp_init(loop, &s->listener);
    if (rc < 0) {
        SSL_CTX_free(s->tls);
        free(s);
        return mla_errf(err, "grpc: uv_tcp_init: %s", uv_strerror(rc));
    }
    s->listener.data = s;
    uv_timer_init(loop, &s->sweep);
    s->sweep.data = s;
    s->sweep_open = true;
    uv_timer_start(&s->sweep, on_sweep, GS_SWEEP_MS, GS_SWEEP_MS);
    *out = s;
    return MLA_OK;
}

int grpc_server_listen(grpc_server *s, const char *host, int port, int *bound_port, mla_err *err) {
    if (uvnet_listen(&s->listener, host, port, on_connection, bound_port, err)) return mla_err_prefix(err, "grpc");
    s->listening = true;
    return MLA_OK;
}

static void on_listener_closed(uv_handle_t *h) {
    grpc_server *s = h->data;
    s->n_closing--;
}

void grpc_server_close(grpc_server *s) {
    if (!s || s->closed) return;
    s->closed = true;
    s->n_closing++;
    uv_close((uv_handle_t *)&s->listener, on_listener_closed);
    if (s->sweep_open) {
        s->sweep_open = false;
        s->n_closing++;
        uv_close((uv_handle_t *)&s->sweep, on_listener_closed);
    }
    /* the calls still open (a Health.Watch, a call the drain did not wait for) end UNAVAILABLE
     * and the client hears the final GOAWAY before the socket closes: what the socket takes now
     * (a few frames) */
    while (s->conns) {
        gs_conn *c = s->conns;
        if (!c->closing && c->h2 && h2_up(c) && !c->in_recv) {
            while (c->calls) finish_cut(c->calls, GRPC_UNAVAILABLE, "the server is shutting down");
            grpc_conn_goaway(c->h2);
            flush(c);
        }
        conn_close(c);
    }
}

void grpc_server_free(grpc_server *s) {
    if (!s) return;
    grpc_server_close(s);
    while (s->n_closing > 0) uv_run(s->loop, UV_RUN_ONCE);
    SSL_CTX_free(s->tls);
    free(s);
}

int grpc_server_n_conns(const grpc_server *s) { return s->n_conns; }

size_t grpc_server_out_pending(const grpc_server *s) {
    size_t n = 0;
    for (const gs_conn *c = s->conns; c; c = c->next)
        if (!c->closing) n += c->queued + (c->h2 ? grpc_conn_out_pending(c->h2) : 0);
    return n;
}

void grpc_server_drain(grpc_server *s) {
    s->draining = true;
    for (gs_conn *c = s->conns; c; c = c->next) {
        if (c->closing || !c->h2) continue;
        /* a Health.Watch hears of the drain (NOT_SERVING: the API is draining) before the
         * GOAWAY, as grpc's own health servers tell their watchers at shutdown */
        for (gs_call *r = c->calls, *rn; r; r = rn) {
            rn = r->next; /* send_health may drop r */
            if (r->method == GRPC_M_HC_WATCH && r->watch_status >= 0) {
                const int hs = health_status(s);
                if (hs != r->watch_status) send_health(r, hs);
            }
        }
        conn_notice(c);
    }
}
