/* pbapi_frame: see pbapi_frame.h. */
#include "coordinator/pbapi_frame.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- framer ---- */

void pbapi_framer_init(pbapi_framer *f, uint32_t max_payload) {
    memset(f, 0, sizeof(*f));
    f->max_payload = max_payload;
}

void pbapi_framer_free(pbapi_framer *f) {
    free(f->buf);
    memset(f, 0, sizeof(*f));
}

void pbapi_framer_feed(pbapi_framer *f, const void *data, size_t n) {
    if (f->off > 0 && (f->off == f->len || f->off > f->cap / 2)) {
        memmove(f->buf, f->buf + f->off, f->len - f->off);
        f->len -= f->off;
        f->off = 0;
    }
    if (f->len + n > f->cap) {
        f->cap = (f->len + n) * 2;
        f->buf = mla_xrealloc(f->buf, f->cap);
    }
    if (n) memcpy(f->buf + f->len, data, n);
    f->len += n;
}

int pbapi_framer_next(pbapi_framer *f, int *kind, const uint8_t **payload, size_t *len, int *code, mla_err *err) {
    size_t avail = f->len - f->off;
    if (avail < APICLIENT_HDR) return 0;
    uint32_t pl;
    if (apiclient_frame_header(f->buf + f->off, f->max_payload, kind, &pl, code, err) != MLA_OK) return -1;
    if (avail - APICLIENT_HDR < pl) return 0;
    *payload = f->buf + f->off + APICLIENT_HDR;
    *len = pl;
    f->off += APICLIENT_HDR + pl;
    return 1;
}

/* ---- requests ---- */

static int fail(int *code, int c, char param[48], const char *p, mla_err *err, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static int fail(int *code, int c, char param[48], const char *p, mla_err *err, const char *fmt, ...) {
    *code = c;
    snprintf(param, 48, "%s", p ? p : "");
    va_list ap;
    va_start(ap, fmt);
    mla_verrf(err, fmt, ap);
    va_end(ap);
    return MLA_ERR;
}

#define INVALID MLAAPI__ERROR_CODE__ERROR_INVALID_FIELD

/* messages -> the cJSON array api_messages_check / the chat template take. */
static int messages_json(Mlaapi__ChatMessage **m, size_t n, cJSON **out, int *code, char param[48], mla_err *err) {
    cJSON *arr = cJSON_CreateArray();
    *out = arr;
    for (size_t i = 0; i < n; i++) {
        if (!m[i]->role) return fail(code, INVALID, param, "messages", err, "messages[%zu].role is required", i);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "role", m[i]->role);
        if (m[i]->content)
            cJSON_AddStringToObject(o, "content", m[i]->content);
        else
            cJSON_AddNullToObject(o, "content");
        cJSON_AddItemToArray(arr, o);
    }
    api_error e;
    if (api_messages_check(arr, &e) != MLA_OK)
        return fail(code, INVALID, param, e.param, err, "%s", e.message);
    return MLA_OK;
}

static int decode_generate(pbapi_request *r, const Mlaapi__GenerateRequest *q, int *code, char param[48],
                           mla_err *err) {
    api_gen_params *p = &r->gen;
    memset(p, 0, sizeof(*p));
    sched_sampling_default(&p->sampling);
    p->max_tokens = -1;
    int n_prompts = (q->prompt != NULL) + (q->n_prompt_ids > 0) + (q->n_messages > 0);
    if (n_prompts != 1)
        return fail(code, INVALID, param, "prompt", err,
                    "exactly one of prompt, prompt_ids and messages is required (got %d)", n_prompts);
    if (q->model) p->model = mla_xstrdup(q->model);
    if (q->n_messages) {
        p->kind = API_CHAT;
        if (messages_json(q->messages, q->n_messages, &r->messages, code, param, err)) return MLA_ERR;
        p->messages = r->messages;
    } else {
        p->kind = API_COMPLETIONS;
        if (q->prompt) {
            p->prompt_text = mla_xstrdup(q->prompt);
        } else {
            if (q->n_prompt_ids > INT32_MAX) return fail(code, INVALID, param, "prompt_ids", err, "too many prompt ids");
            p->prompt_ids = mla_xmalloc(q->n_prompt_ids * sizeof(int32_t));
            memcpy(p->prompt_ids, q->prompt_ids, q->n_prompt_ids * sizeof(int32_t));
            p->n_prompt_ids = (int32_t)q->n_prompt_ids;
        }
    }
    p->add_generation_prompt = q->has_add_generation_prompt ? q->add_generation_prompt : true;
    if (q->has_max_tokens) {
        if (q->max_tokens < 1)
            return fail(code, INVALID, param, "max_tokens", err, "max_tokens must be >= 1 (got %d)", q->max_tokens);
        p->max_tokens = q->max_tokens;
    }
    sched_sampling *s = &p->sampling;
    if (q->has_temperature) s->temperature = q->temperature;
    if (q->has_top_p) s->top_p = q->top_p;
    if (q->has_top_k) {
        if (q->top_k < -1) return fail(code, INVALID, param, "top_k", err, "top_k must be >= -1 (got %d)", q->top_k);
        s->top_k = q->top_k < 0 ? 0 : q->top_k;
    }
    if (q->has_min_p) s->min_p = q->min_p;
    if (q->has_presence_penalty) s->presence_penalty = q->presence_penalty;
    if (q->has_frequency_penalty) s->frequency_penalty = q->frequency_penalty;
    if (q->has_repetition_penalty) s->repetition_penalty = q->repetition_penalty;
    if (q->has_seed) {
        s->seed = q->seed;
        s->has_seed = true;
    }
    if (q->n_stop > API_MAX_STOP)
        return fail(code, INVALID, param, "stop", err, "at most %d stop strings are supported (got %zu)", API_MAX_STOP,
                    q->n_stop);
    for (size_t i = 0; i < q->n_stop; i++) {
        if (!q->stop[i] || !q->stop[i][0]) return fail(code, INVALID, param, "stop", err, "stop strings must not be empty");
        p->stop[p->n_stop++] = mla_xstrdup(q->stop[i]);
    }
    if (q->n_stop_token_ids) {
        if (q->n_stop_token_ids > 4096) return fail(code, INVALID, param, "stop_token_ids", err, "too many stop token ids");
        p->stop_ids = mla_xmalloc(q->n_stop_token_ids * sizeof(int32_t));
        memcpy(p->stop_ids, q->stop_token_ids, q->n_stop_token_ids * sizeof(int32_t));
        p->n_stop_ids = (int32_t)q->n_stop_token_ids;
    }
    p->ignore_eos = q->has_ignore_eos && q->ignore_eos;
    p->skip_special_tokens = q->has_skip_special_tokens ? q->skip_special_tokens : true;
    if (q->has_top_logprobs && q->top_logprobs > SCHED_MAX_TOP_LOGPROBS)
        return fail(code, INVALID, param, "top_logprobs", err, "top_logprobs must be between 0 and %d (got %u)",
                    SCHED_MAX_TOP_LOGPROBS, q->top_logprobs);
    p->top_logprobs = q->has_top_logprobs ? (int32_t)q->top_logprobs : 0;
    p->logprobs = (q->has_logprobs && q->logprobs) || p->top_logprobs > 0;
    s->logprobs = p->logprobs;
    s->top_logprobs = p->top_logprobs;
    p->stream = true;
    api_error e;
    if (api_gen_params_check(p, &e) != MLA_OK) return fail(code, INVALID, param, e.param, err, "%s", e.message);
    return MLA_OK;
}

int pbapi_request_decode(int kind, const uint8_t *payload, size_t len, pbapi_request *r, int *code,
                         char param[48], mla_err *err) {
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    param[0] = 0;
    const ProtobufCMessageDescriptor *d = NULL;
    switch (kind) {
    case MLAAPI__FRAME_KIND__FRAME_HELLO: d = &mlaapi__hello__descriptor; break;
    case MLAAPI__FRAME_KIND__FRAME_GENERATE: d = &mlaapi__generate_request__descriptor; break;
    case MLAAPI__FRAME_KIND__FRAME_TOKENIZE: d = &mlaapi__tokenize_request__descriptor; break;
    case MLAAPI__FRAME_KIND__FRAME_HEALTH: d = &mlaapi__health_request__descriptor; break;
    case MLAAPI__FRAME_KIND__FRAME_MODELS: d = &mlaapi__models_request__descriptor; break;
    case MLAAPI__FRAME_KIND__FRAME_CANCEL: d = &mlaapi__cancel_request__descriptor; break;
    default:
        return fail(code, MLAAPI__ERROR_CODE__ERROR_BAD_FRAME, param, NULL, err,
                    "frame kind %d (%s) is not one a client sends", kind, apiclient_kind_name(kind));
    }
    r->msg = protobuf_c_message_unpack(d, NULL, len, payload);
    if (!r->msg)
        return fail(code, MLAAPI__ERROR_CODE__ERROR_BAD_PROTOBUF, param, NULL, err,
                    "the payload of a %s frame (%zu bytes) is not a valid %s message", apiclient_kind_name(kind), len,
                    d->name);
    /* every request message has request_id = 1 (uint64) and most api_key = 2 */
    bool has_id = false;
    uint64_t id = 0;
    switch (kind) {
    case MLAAPI__FRAME_KIND__FRAME_HELLO: {
        Mlaapi__Hello *h = (Mlaapi__Hello *)r->msg;
        if (h->has_version && h->version != APICLIENT_VERSION)
            return fail(code, MLAAPI__ERROR_CODE__ERROR_UNKNOWN_KIND, param, "version", err,
                        "protocol version %u is not supported (this server speaks %d)", h->version, APICLIENT_VERSION);
        r->api_key = h->api_key;
        return MLA_OK;
    }
    case MLAAPI__FRAME_KIND__FRAME_GENERATE: {
        Mlaapi__GenerateRequest *q = (Mlaapi__GenerateRequest *)r->msg;
        has_id = q->has_request_id;
        id = q->request_id;
        r->api_key = q->api_key;
        if (!has_id || id == 0) break;
        r->request_id = id;
        return decode_generate(r, q, code, param, err);
    }
    case MLAAPI__FRAME_KIND__FRAME_TOKENIZE: {
        Mlaapi__TokenizeRequest *q = (Mlaapi__TokenizeRequest *)r->msg;
        has_id = q->has_request_id;
        id = q->request_id;
        r->api_key = q->api_key;
        if (!has_id || id == 0) break;
        if ((q->text != NULL) + (q->n_messages > 0) != 1)
            return fail(code, INVALID, param, "text", err, "exactly one of text and messages is required");
        if (q->n_messages && messages_json(q->messages, q->n_messages, &r->messages, code, param, err)) return MLA_ERR;
        r->text = q->text;
        r->add_special = q->has_add_special_tokens ? q->add_special_tokens : true;
        break;
    }
    case MLAAPI__FRAME_KIND__FRAME_HEALTH: {
        Mlaapi__HealthRequest *q = (Mlaapi__HealthRequest *)r->msg;
        has_id = q->has_request_id;
        id = q->request_id;
        break;
    }
    case MLAAPI__FRAME_KIND__FRAME_MODELS: {
        Mlaapi__ModelsRequest *q = (Mlaapi__ModelsRequest *)r->msg;
        has_id = q->has_request_id;
        id = q->request_id;
        r->api_key = q->api_key;
        break;
    }
    default: { /* FRAME_CANCEL */
        Mlaapi__CancelRequest *q = (Mlaapi__CancelRequest *)r->msg;
        has_id = q->has_request_id;
        id = q->request_id;
        r->api_key = q->api_key;
        break;
    }
    }
    if (!has_id || id == 0)
        return fail(code, INVALID, param, "request_id", err, "a %s frame needs a non-zero request_id",
                    apiclient_kind_name(kind));
    r->request_id = id;
    return MLA_OK;
}

void pbapi_request_free(pbapi_request *r) {
    api_gen_params_free(&r->gen);
    if (r->messages) cJSON_Delete(r->messages);
    if (r->msg) protobuf_c_message_free_unpacked(r->msg, NULL);
    memset(r, 0, sizeof(*r));
}
