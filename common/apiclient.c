/* apiclient: see apiclient.h. */
#include "common/apiclient.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* ---- frames ---- */

uint8_t *apiclient_frame_pack(int kind, const ProtobufCMessage *msg, size_t *len) {
    size_t n = protobuf_c_message_get_packed_size(msg);
    MLA_ASSERT(n + 1 <= UINT32_MAX);
    uint8_t *buf = mla_xmalloc(APICLIENT_HDR + n);
    uint32_t l = (uint32_t)(n + 1);
    buf[0] = (uint8_t)(l >> 24);
    buf[1] = (uint8_t)(l >> 16);
    buf[2] = (uint8_t)(l >> 8);
    buf[3] = (uint8_t)l;
    buf[4] = (uint8_t)((APICLIENT_VERSION << 4) | (kind & 0x0F));
    size_t w = protobuf_c_message_pack(msg, buf + APICLIENT_HDR);
    MLA_ASSERT(w == n);
    *len = APICLIENT_HDR + n;
    return buf;
}

static bool known_kind(int k) {
    return (k >= MLAAPI__FRAME_KIND__FRAME_HELLO && k <= MLAAPI__FRAME_KIND__FRAME_CANCEL) ||
           (k >= MLAAPI__FRAME_KIND__FRAME_HELLO_REPLY && k <= MLAAPI__FRAME_KIND__FRAME_MODELS_RESPONSE) ||
           k == MLAAPI__FRAME_KIND__FRAME_ERROR;
}

int apiclient_frame_header(const uint8_t hdr[APICLIENT_HDR], uint32_t max_payload, int *kind,
                           uint32_t *payload_len, int *code, mla_err *err) {
    uint32_t l = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    *kind = 0;
    *payload_len = 0;
    if (l == 0) {
        *code = MLAAPI__ERROR_CODE__ERROR_BAD_FRAME;
        return mla_errf(err, "frame length 0 (it counts the type byte, so it is at least 1)");
    }
    if (l - 1 > max_payload) {
        *code = MLAAPI__ERROR_CODE__ERROR_FRAME_TOO_LARGE;
        return mla_errf(err, "frame payload of %u bytes is over the limit of %u", l - 1, max_payload);
    }
    int ver = hdr[4] >> 4, k = hdr[4] & 0x0F;
    if (ver != APICLIENT_VERSION) {
        *code = MLAAPI__ERROR_CODE__ERROR_UNKNOWN_KIND;
        return mla_errf(err, "protocol version %d in frame type 0x%02x (this side speaks %d)", ver, hdr[4],
                        APICLIENT_VERSION);
    }
    if (!known_kind(k)) {
        *code = MLAAPI__ERROR_CODE__ERROR_UNKNOWN_KIND;
        return mla_errf(err, "unknown frame kind %d (type 0x%02x)", k, hdr[4]);
    }
    *kind = k;
    *payload_len = l - 1;
    *code = 0;
    return MLA_OK;
}

const char *apiclient_kind_name(int kind) {
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(&mlaapi__frame_kind__descriptor, kind);
    return v ? v->name : "?";
}

const char *apiclient_code_name(int code) {
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(&mlaapi__error_code__descriptor, code);
    return v ? v->name : "?";
}

/* ---- the client ---- */

struct apiclient {
    int fd;
    uint64_t next_id;
    int last_code;
    char *model, *server_version, *build;
    uint32_t max_frame;
};

static int send_all(apiclient *c, const uint8_t *p, size_t n, mla_err *err) {
    while (n > 0) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            return mla_errf(err, "sending to the server: %s", strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return MLA_OK;
}

static int recv_all(apiclient *c, uint8_t *p, size_t n, mla_err *err) {
    while (n > 0) {
        ssize_t r = recv(c->fd, p, n, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return mla_errf(err, "timed out waiting for the server");
            return mla_errf(err, "reading from the server: %s", strerror(errno));
        }
        if (r == 0) return mla_errf(err, "the server closed the connection");
        p += r;
        n -= (size_t)r;
    }
    return MLA_OK;
}

static int send_msg(apiclient *c, int kind, const ProtobufCMessage *m, mla_err *err) {
    size_t n;
    uint8_t *buf = apiclient_frame_pack(kind, m, &n);
    int rc = send_all(c, buf, n, err);
    free(buf);
    return rc;
}

/* Reads one frame: *kind and the payload (malloc'd). */
static int recv_frame(apiclient *c, int *kind, uint8_t **payload, size_t *len, mla_err *err) {
    uint8_t hdr[APICLIENT_HDR];
    uint32_t pl;
    int code;
    *payload = NULL;
    if (recv_all(c, hdr, sizeof(hdr), err)) return MLA_ERR;
    if (apiclient_frame_header(hdr, APICLIENT_MAX_RECV_FRAME, kind, &pl, &code, err))
        return mla_err_prefix(err, "from the server");
    *payload = mla_xmalloc(pl ? pl : 1);
    if (recv_all(c, *payload, pl, err)) {
        free(*payload);
        *payload = NULL;
        return MLA_ERR;
    }
    *len = pl;
    return MLA_OK;
}

/* An Error frame: fills err and last_code. Returns its request id. */
static uint64_t take_error(apiclient *c, const uint8_t *p, size_t n, mla_err *err) {
    Mlaapi__Error *e = mlaapi__error__unpack(NULL, n, p);
    if (!e) {
        mla_errf(err, "the server sent an undecodable error frame");
        c->last_code = MLAAPI__ERROR_CODE__ERROR_INTERNAL;
        return 0;
    }
    c->last_code = e->has_code ? (int)e->code : MLAAPI__ERROR_CODE__ERROR_INTERNAL;
    uint64_t id = e->has_request_id ? e->request_id : 0;
    mla_errf(err, "server error %s: %s%s%s%s", apiclient_code_name(c->last_code), e->message ? e->message : "",
             e->param && e->param[0] ? " (" : "", e->param && e->param[0] ? e->param : "",
             e->param && e->param[0] ? ")" : "");
    mlaapi__error__free_unpacked(e, NULL);
    return id;
}

/* Waits for the answer frame of request id with kind want (other requests' frames are
 * skipped). *payload malloc'd. */
static int wait_answer(apiclient *c, uint64_t id, int want, uint8_t **payload, size_t *len, int *kind,
                       mla_err *err) {
    for (;;) {
        if (recv_frame(c, kind, payload, len, err)) return MLA_ERR;
        if (*kind == MLAAPI__FRAME_KIND__FRAME_ERROR) {
            uint64_t eid = take_error(c, *payload, *len, err);
            free(*payload);
            *payload = NULL;
            if (eid == 0 || eid == id) return MLA_ERR;
            continue;
        }
        if (*kind == want) return MLA_OK;
        free(*payload);
        *payload = NULL;
        /* an answer to some other request: not ours (this client has one in flight) */
    }
}

/* One unary call: sends request q (whose request_id is id) and waits for its answer frame of
 * kind want. *payload malloc'd. */
static int call(apiclient *c, int kind, const ProtobufCMessage *q, uint64_t id, int want, uint8_t **payload,
                size_t *len, mla_err *err) {
    int got;
    if (send_msg(c, kind, q, err)) return MLA_ERR;
    return wait_answer(c, id, want, payload, len, &got, err);
}

int apiclient_connect(apiclient **out, const char *host, int port, const char *api_key, int timeout_ms,
                      mla_err *err) {
    *out = NULL;
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
        if (timeout_ms > 0) {
            struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
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
    c->next_id = 1;
    Mlaapi__Hello h = MLAAPI__HELLO__INIT;
    h.has_version = true;
    h.version = APICLIENT_VERSION;
    h.api_key = api_key && api_key[0] ? (char *)api_key : NULL;
    h.client_name = "mlaserve-apiclient";
    uint8_t *p = NULL;
    size_t n = 0;
    int kind;
    if (send_msg(c, MLAAPI__FRAME_KIND__FRAME_HELLO, &h.base, err) ||
        wait_answer(c, 0, MLAAPI__FRAME_KIND__FRAME_HELLO_REPLY, &p, &n, &kind, err)) {
        apiclient_close(c);
        return mla_err_prefix(err, "%s:%d", host, port);
    }
    Mlaapi__HelloReply *r = mlaapi__hello_reply__unpack(NULL, n, p);
    free(p);
    if (!r) {
        apiclient_close(c);
        return mla_errf(err, "%s:%d: undecodable HelloReply", host, port);
    }
    c->model = mla_xstrdup(r->model ? r->model : "");
    c->server_version = mla_xstrdup(r->server_version ? r->server_version : "");
    c->build = mla_xstrdup(r->build ? r->build : "");
    c->max_frame = r->has_max_frame ? r->max_frame : APICLIENT_MAX_FRAME_DEFAULT;
    mlaapi__hello_reply__free_unpacked(r, NULL);
    *out = c;
    return MLA_OK;
}

void apiclient_close(apiclient *c) {
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    free(c->model);
    free(c->server_version);
    free(c->build);
    free(c);
}

int apiclient_last_code(const apiclient *c) { return c->last_code; }
const char *apiclient_server_model(const apiclient *c) { return c->model; }
const char *apiclient_server_version(const apiclient *c) { return c->server_version; }
const char *apiclient_server_build(const apiclient *c) { return c->build; }
uint32_t apiclient_server_max_frame(const apiclient *c) { return c->max_frame; }

static void append(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *buf = mla_xrealloc(*buf, *cap);
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
}

int apiclient_generate(apiclient *c, const apiclient_gen_params *p, apiclient_token_fn fn, void *ud,
                       apiclient_gen_result *res, mla_err *err) {
    memset(res, 0, sizeof(*res));
    c->last_code = 0;
    Mlaapi__GenerateRequest q = MLAAPI__GENERATE_REQUEST__INIT;
    Mlaapi__ChatMessage m = MLAAPI__CHAT_MESSAGE__INIT, *mp = &m;
    uint64_t id = c->next_id++;
    q.has_request_id = true;
    q.request_id = id;
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
    if (send_msg(c, MLAAPI__FRAME_KIND__FRAME_GENERATE, &q.base, err)) return MLA_ERR;
    size_t cap = 0, cap_ids = 0;
    bool cancel_sent = false;
    for (;;) {
        uint8_t *buf;
        size_t n;
        int kind;
        if (wait_answer(c, id, MLAAPI__FRAME_KIND__FRAME_GENERATE_RESPONSE, &buf, &n, &kind, err)) goto fail;
        Mlaapi__GenerateResponse *r = mlaapi__generate_response__unpack(NULL, n, buf);
        free(buf);
        if (!r) {
            mla_errf(err, "the server sent an undecodable GenerateResponse");
            goto fail;
        }
        if (!r->has_request_id || r->request_id != id) {
            mlaapi__generate_response__free_unpacked(r, NULL);
            continue;
        }
        const char *txt = r->text ? r->text : "";
        size_t tl = strlen(txt);
        if (tl) append(&res->text, &res->text_len, &cap, txt, tl);
        int stop = 0;
        if (r->has_token_id) {
            if (res->n_ids == cap_ids) {
                cap_ids = cap_ids ? cap_ids * 2 : 64;
                res->ids = mla_xrealloc(res->ids, cap_ids * sizeof(int32_t));
            }
            res->ids[res->n_ids++] = r->token_id;
            if (fn) {
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
                stop = fn(ud, &t);
            }
        }
        if (r->finish_reason) {
            snprintf(res->finish_reason, sizeof(res->finish_reason), "%s", r->finish_reason);
            if (r->usage) {
                res->prompt_tokens = r->usage->prompt_tokens;
                res->completion_tokens = r->usage->completion_tokens;
            }
            mlaapi__generate_response__free_unpacked(r, NULL);
            break;
        }
        mlaapi__generate_response__free_unpacked(r, NULL);
        if (stop && !cancel_sent) {
            Mlaapi__CancelRequest cq = MLAAPI__CANCEL_REQUEST__INIT;
            cq.has_request_id = true;
            cq.request_id = id;
            if (send_msg(c, MLAAPI__FRAME_KIND__FRAME_CANCEL, &cq.base, err)) goto fail;
            cancel_sent = true;
        }
    }
    if (!res->text) append(&res->text, &res->text_len, &cap, "", 0);
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
    c->last_code = 0;
    Mlaapi__TokenizeRequest q = MLAAPI__TOKENIZE_REQUEST__INIT;
    uint64_t id = c->next_id++;
    q.has_request_id = true;
    q.request_id = id;
    q.text = (char *)text;
    q.has_add_special_tokens = true;
    q.add_special_tokens = add_special;
    uint8_t *buf;
    size_t len;
    if (call(c, MLAAPI__FRAME_KIND__FRAME_TOKENIZE, &q.base, id, MLAAPI__FRAME_KIND__FRAME_TOKENIZE_RESPONSE, &buf, &len, err))
        return MLA_ERR;
    Mlaapi__TokenizeResponse *r = mlaapi__tokenize_response__unpack(NULL, len, buf);
    free(buf);
    if (!r) return mla_errf(err, "the server sent an undecodable TokenizeResponse");
    *n = r->n_ids;
    *ids = mla_xmalloc((r->n_ids ? r->n_ids : 1) * sizeof(int32_t));
    if (r->n_ids) memcpy(*ids, r->ids, r->n_ids * sizeof(int32_t));
    mlaapi__tokenize_response__free_unpacked(r, NULL);
    return MLA_OK;
}

int apiclient_health(apiclient *c, bool *ok, char *status, size_t cap, mla_err *err) {
    c->last_code = 0;
    Mlaapi__HealthRequest q = MLAAPI__HEALTH_REQUEST__INIT;
    uint64_t id = c->next_id++;
    q.has_request_id = true;
    q.request_id = id;
    uint8_t *buf;
    size_t len;
    if (call(c, MLAAPI__FRAME_KIND__FRAME_HEALTH, &q.base, id, MLAAPI__FRAME_KIND__FRAME_HEALTH_RESPONSE, &buf, &len, err))
        return MLA_ERR;
    Mlaapi__HealthResponse *r = mlaapi__health_response__unpack(NULL, len, buf);
    free(buf);
    if (!r) return mla_errf(err, "the server sent an undecodable HealthResponse");
    *ok = r->has_ok && r->ok;
    if (status && cap) snprintf(status, cap, "%s", r->status ? r->status : "");
    mlaapi__health_response__free_unpacked(r, NULL);
    return MLA_OK;
}

int apiclient_models(apiclient *c, apiclient_model **models, size_t *n, mla_err *err) {
    *models = NULL;
    *n = 0;
    c->last_code = 0;
    Mlaapi__ModelsRequest q = MLAAPI__MODELS_REQUEST__INIT;
    uint64_t id = c->next_id++;
    q.has_request_id = true;
    q.request_id = id;
    uint8_t *buf;
    size_t len;
    if (call(c, MLAAPI__FRAME_KIND__FRAME_MODELS, &q.base, id, MLAAPI__FRAME_KIND__FRAME_MODELS_RESPONSE, &buf, &len, err))
        return MLA_ERR;
    Mlaapi__ModelsResponse *r = mlaapi__models_response__unpack(NULL, len, buf);
    free(buf);
    if (!r) return mla_errf(err, "the server sent an undecodable ModelsResponse");
    *models = mla_xcalloc(r->n_models ? r->n_models : 1, sizeof(**models));
    for (size_t i = 0; i < r->n_models; i++) {
        (*models)[i].id = mla_xstrdup(r->models[i]->id ? r->models[i]->id : "");
        (*models)[i].owned_by = mla_xstrdup(r->models[i]->owned_by ? r->models[i]->owned_by : "");
        (*models)[i].max_model_len = r->models[i]->max_model_len;
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
