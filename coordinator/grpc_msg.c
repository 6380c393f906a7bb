/* grpc_msg: see grpc_msg.h. */
#include "coordinator/grpc_msg.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- requests ---- */

static int fail(char param[48], const char *p, mla_err *err, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(char param[48], const char *p, mla_err *err, const char *fmt, ...) {
    snprintf(param, 48, "%s", p ? p : "");
    va_list ap;
    va_start(ap, fmt);
    mla_verrf(err, fmt, ap);
    va_end(ap);
    return MLA_ERR;
}

/* messages -> the cJSON array api_messages_check / the chat template take. */
static int messages_json(Mlaapi__ChatMessage **m, size_t n, cJSON **out, char param[48], mla_err *err) {
    cJSON *arr = cJSON_CreateArray();
    *out = arr;
    for (size_t i = 0; i < n; i++) {
        if (!m[i]->role) return fail(param, "messages", err, "messages[%zu].role is required", i);
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
        return fail(param, e.param, err, "%s", e.message);
    return MLA_OK;
}

static int decode_generate(grpc_request *r, const Mlaapi__GenerateRequest *q, char param[48],
                           mla_err *err) {
    api_gen_params *p = &r->gen;
    memset(p, 0, sizeof(*p));
    sched_sampling_default(&p->sampling);
    p->max_tokens = -1;
    int n_prompts = (q->prompt != NULL) + (q->n_prompt_ids > 0) + (q->n_messages > 0);
    if (n_prompts != 1)
        return fail(param, "prompt", err,
                    "exactly one of prompt, prompt_ids and messages is required (got %d)", n_prompts);
    if (q->model) p->model = mla_xstrdup(q->model);
    if (q->n_messages) {
        p->kind = API_CHAT;
        if (messages_json(q->messages, q->n_messages, &r->messages, param, err)) return MLA_ERR;
        p->messages = r->messages;
    } else {
        p->kind = API_COMPLETIONS;
        if (q->prompt) {
            p->prompt_text = mla_xstrdup(q->prompt);
        } else {
            if (q->n_prompt_ids > INT32_MAX) return fail(param, "prompt_ids", err, "too many prompt ids");
            for (size_t i = 0; i < q->n_prompt_ids; i++)
                if (q->prompt_ids[i] < 0)
                    return fail(param, "prompt_ids", err, "prompt_ids must be non-negative token ids (got %d at %zu)",
                                q->prompt_ids[i], i);
            p->prompt_ids = mla_xmalloc(q->n_prompt_ids * sizeof(int32_t));
            memcpy(p->prompt_ids, q->prompt_ids, q->n_prompt_ids * sizeof(int32_t));
            p->n_prompt_ids = (int32_t)q->n_prompt_ids;
        }
    }
    if (q->has_add_generation_prompt && p->kind != API_CHAT) /* as the HTTP API: chat only */
        return fail(param, "add_generation_prompt", err,
                    "add_generation_prompt applies to messages (the chat template), not to prompt or prompt_ids");
    p->add_generation_prompt = q->has_add_generation_prompt ? q->add_generation_prompt : true;
    p->echo = q->has_echo && q->echo;
    if (p->echo && p->kind != API_COMPLETIONS)
        return fail(param, "echo", err, "echo needs prompt or prompt_ids (not messages)");
    if (q->has_max_tokens) {
        if (q->max_tokens < (p->echo ? 0 : 1))
            return fail(param, "max_tokens", err, "max_tokens must be >= %d (got %d)", p->echo ? 0 : 1, q->max_tokens);
        p->max_tokens = q->max_tokens;
    }
    sched_sampling *s = &p->sampling;
    if (q->has_temperature) s->temperature = q->temperature;
    if (q->has_top_p) s->top_p = q->top_p;
    if (q->has_top_k) {
        if (q->top_k < -1) return fail(param, "top_k", err, "top_k must be >= -1 (got %d)", q->top_k);
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
        return fail(param, "stop", err, "at most %d stop strings are supported (got %zu)", API_MAX_STOP,
                    q->n_stop);
    for (size_t i = 0; i < q->n_stop; i++) {
        if (!q->stop[i] || !q->stop[i][0]) return fail(param, "stop", err, "stop strings must not be empty");
        p->stop[p->n_stop++] = mla_xstrdup(q->stop[i]);
    }
    if (q->n_stop_token_ids) {
        if (q->n_stop_token_ids > 4096) return fail(param, "stop_token_ids", err, "too many stop token ids");
        p->stop_ids = mla_xmalloc(q->n_stop_token_ids * sizeof(int32_t));
        memcpy(p->stop_ids, q->stop_token_ids, q->n_stop_token_ids * sizeof(int32_t));
        p->n_stop_ids = (int32_t)q->n_stop_token_ids;
    }
    p->ignore_eos = q->has_ignore_eos && q->ignore_eos;
    if (q->has_min_tokens) {
        if (q->min_tokens > INT32_MAX) return fail(param, "min_tokens", err, "min_tokens %u is too large", q->min_tokens);
        p->min_tokens = (int32_t)q->min_tokens;
    }
    p->skip_special_tokens = q->has_skip_special_tokens ? q->skip_special_tokens : true;
    if (q->has_top_logprobs && q->top_logprobs > SCHED_MAX_TOP_LOGPROBS)
        return fail(param, "top_logprobs", err, "top_logprobs must be between 0 and %d (got %u)",
                    SCHED_MAX_TOP_LOGPROBS, q->top_logprobs);
    p->top_logprobs = q->has_top_logprobs ? (int32_t)q->top_logprobs : 0;
    if (q->has_logprobs && !q->logprobs && p->top_logprobs > 0)
        return fail(param, "top_logprobs", err, "top_logprobs %d needs logprobs (true, or left out), not false",
                    p->top_logprobs);
    p->logprobs = (q->has_logprobs && q->logprobs) || p->top_logprobs > 0;
    s->logprobs = p->logprobs;
    s->top_logprobs = p->top_logprobs;
    s->prompt_logprobs = p->echo && p->logprobs;
    p->stream = true;
    api_error e;
    if (api_gen_params_check(p, &e) != MLA_OK) return fail(param, e.param, err, "%s", e.message);
    return MLA_OK;
}

const char *grpc_method_path(int method) {
    switch (method) {
    case GRPC_M_GENERATE: return "/mlaapi.MlaServe/Generate";
    case GRPC_M_TOKENIZE: return "/mlaapi.MlaServe/Tokenize";
    case GRPC_M_HEALTH: return "/mlaapi.MlaServe/Health";
    case GRPC_M_MODELS: return "/mlaapi.MlaServe/Models";
    case GRPC_M_CANCEL: return "/mlaapi.MlaServe/Cancel";
    case GRPC_M_INFO: return "/mlaapi.MlaServe/Info";
    case GRPC_M_HC_CHECK: return "/grpc.health.v1.Health/Check";
    case GRPC_M_HC_WATCH: return "/grpc.health.v1.Health/Watch";
    default: return NULL;
    }
}

int grpc_method_of_path(const char *path, size_t len) {
    for (int m = 1; m < GRPC_M_COUNT; m++) {
        const char *p = grpc_method_path(m);
        if (strlen(p) == len && !memcmp(p, path, len)) return m;
    }
    return 0;
}

static const ProtobufCMessageDescriptor *request_desc(int method) {
    switch (method) {
    case GRPC_M_GENERATE: return &mlaapi__generate_request__descriptor;
    case GRPC_M_TOKENIZE: return &mlaapi__tokenize_request__descriptor;
    case GRPC_M_HEALTH: return &mlaapi__health_request__descriptor;
    case GRPC_M_MODELS: return &mlaapi__models_request__descriptor;
    case GRPC_M_CANCEL: return &mlaapi__cancel_request__descriptor;
    case GRPC_M_INFO: return &mlaapi__info_request__descriptor;
    case GRPC_M_HC_CHECK:
    case GRPC_M_HC_WATCH: return &grpc__health__v1__health_check_request__descriptor;
    default: return NULL;
    }
}

/* a varint at *p (< end): its value, *p past it; false when it runs past end or 10 bytes */
static bool wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (int i = 0; i < 10 && *p < end; i++) {
        const uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) return true;
    }
    return false;
}

/* protobuf-c hands string fields over as C strings, which end at a NUL, and does not check
 * UTF-8: the message's bytes are walked against its descriptor and every string field (in nested
 * messages too) must be valid UTF-8 without NUL, as the HTTP API's strings must. Run on a message
 * protobuf-c has unpacked (so the framing is sound); 0, or -1 with the top field's name in param
 * and the field's path in the message ("messages[1].content": at is the path so far). */
static int wire_strings_ok(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t len, int depth,
                           const char *at, const char *top, char param[48], mla_err *err) {
    const uint8_t *end = p + len;
    unsigned seen[64] = {0}; /* occurrences so far of each field (its index in d): a repeated field's index */
    while (p < end) {
        uint64_t tag, v;
        if (!wire_varint(&p, end, &tag)) return MLA_OK; /* the unpacker judged the framing */
        switch (tag & 7) {
        case 0:
            if (!wire_varint(&p, end, &v)) return MLA_OK;
            continue;
        case 1:
        case 5: {
            const size_t w = (tag & 7) == 1 ? 8 : 4;
            if ((size_t)(end - p) < w) return MLA_OK;
            p += w;
            continue;
        }
        case 2: break;
        default: return MLA_OK; /* groups: not in this API, left to the unpacker */
        }
        if (!wire_varint(&p, end, &v) || v > (uint64_t)(end - p)) return MLA_OK;
        const ProtobufCFieldDescriptor *f =
            tag >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3)) : NULL;
        if (f && (f->type == PROTOBUF_C_TYPE_STRING || (f->type == PROTOBUF_C_TYPE_MESSAGE && depth < 8))) {
            const size_t fi = (size_t)(f - d->fields);
            const unsigned k = fi < 64 ? seen[fi]++ : 0;
            char path[160];
            if (f->label == PROTOBUF_C_LABEL_REPEATED)
                snprintf(path, sizeof path, "%s%s%s[%u]", at, *at ? "." : "", f->name, k);
            else
                snprintf(path, sizeof path, "%s%s%s", at, *at ? "." : "", f->name);
            const char *t = depth ? top : f->name;
            if (f->type == PROTOBUF_C_TYPE_STRING) {
                if (memchr(p, 0, v))
                    return fail(param, t, err, "%s holds a NUL character (not supported in strings)", path);
                const long bad = api_utf8_invalid_at((const char *)p, v);
                if (bad >= 0) return fail(param, t, err, "%s is not valid UTF-8 (byte %ld)", path, bad);
            } else if (wire_strings_ok(f->descriptor, p, v, depth + 1, path, t, param, err)) {
                return MLA_ERR;
            }
        }
        p += v;
    }
    return MLA_OK;
}

/* The number of the first field of m (nested messages too, to depth 8) that its descriptor does
 * not know, its path into at ("messages[1].#9") and the message it is in into *holder, or 0:
 * protobuf-c keeps such fields aside unread, and a request field this server does not read is
 * refused, as the HTTP API refuses unknown members. */
static uint32_t unknown_field(const ProtobufCMessage *m, int depth, char *at, size_t cap, const char **holder) {
    if (m->n_unknown_fields) {
        *holder = m->descriptor->short_name;
        snprintf(at + strlen(at), cap - strlen(at), "%s#%u", *at ? "." : "", m->unknown_fields[0].tag);
        return m->unknown_fields[0].tag;
    }
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields && depth < 8; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
        const char *base = (const char *)m;
        const size_t n = f->label == PROTOBUF_C_LABEL_REPEATED ? *(const size_t *)(base + f->quantifier_offset) : 1;
        const void *v = base + f->offset;
        for (size_t k = 0; k < n; k++) {
            const ProtobufCMessage *sub = f->label == PROTOBUF_C_LABEL_REPEATED
                                              ? (*(ProtobufCMessage *const *const *)v)[k]
                                              : *(ProtobufCMessage *const *)v;
            if (!sub) continue;
            const size_t l = strlen(at);
            if (f->label == PROTOBUF_C_LABEL_REPEATED)
                snprintf(at + l, cap - l, "%s%s[%zu]", l ? "." : "", f->name, k);
            else
                snprintf(at + l, cap - l, "%s%s", l ? "." : "", f->name);
            const uint32_t t = unknown_field(sub, depth + 1, at, cap, holder);
            if (t) return t;
            at[l] = 0;
        }
    }
    return 0;
}

int grpc_request_decode(int method, const uint8_t *payload, size_t len, grpc_request *r, char param[48],
                        mla_err *err) {
    memset(r, 0, sizeof(*r));
    r->method = method;
    param[0] = 0;
    const ProtobufCMessageDescriptor *d = request_desc(method);
    if (!d) return fail(param, NULL, err, "unknown method %d", method);
    r->msg = protobuf_c_message_unpack(d, NULL, len, payload);
    if (!r->msg)
        return fail(param, NULL, err, "the request (%zu bytes) is not a valid %s message", len, d->name);
    if (wire_strings_ok(d, payload, len, 0, "", "", param, err)) return MLA_ERR;
    char at[160] = "";
    const char *holder = "";
    const uint32_t unk =
        method == GRPC_M_HC_CHECK || method == GRPC_M_HC_WATCH ? 0 : unknown_field(r->msg, 0, at, sizeof at, &holder);
    if (unk == 2 && method == GRPC_M_GENERATE && !strchr(at, '.'))
        return fail(param, "api_key", err, "field 2 (api_key) was removed: the key goes in the authorization metadata "
                                           "(Bearer KEY)");
    if (unk)
        return fail(param, NULL, err, "%s: field %u is not a field of %s in this server's proto/api.proto", at, unk,
                    holder);
    switch (method) {
    case GRPC_M_GENERATE: {
        Mlaapi__GenerateRequest *q = (Mlaapi__GenerateRequest *)r->msg;
        r->request_id = q->has_request_id ? q->request_id : 0;
        return decode_generate(r, q, param, err);
    }
    case GRPC_M_TOKENIZE: {
        Mlaapi__TokenizeRequest *q = (Mlaapi__TokenizeRequest *)r->msg;
        if ((q->text != NULL) + (q->n_messages > 0) != 1)
            return fail(param, "text", err, "exactly one of text and messages is required");
        if (q->n_messages && q->has_add_special_tokens)
            return fail(param, "add_special_tokens", err,
                        "add_special_tokens applies to text: the special tokens of messages come from the chat template");
        if (q->n_messages && messages_json(q->messages, q->n_messages, &r->messages, param, err)) return MLA_ERR;
        r->text = q->text;
        r->add_special = q->has_add_special_tokens ? q->add_special_tokens : true;
        return MLA_OK;
    }
    case GRPC_M_CANCEL: {
        Mlaapi__CancelRequest *q = (Mlaapi__CancelRequest *)r->msg;
        if (!q->has_request_id || q->request_id == 0)
            return fail(param, "request_id", err, "Cancel needs the non-zero request_id of a Generate call");
        r->request_id = q->request_id;
        return MLA_OK;
    }
    case GRPC_M_HC_CHECK:
    case GRPC_M_HC_WATCH: {
        Grpc__Health__V1__HealthCheckRequest *q = (Grpc__Health__V1__HealthCheckRequest *)r->msg;
        r->text = q->service ? q->service : "";
        return MLA_OK;
    }
    default: return MLA_OK;
    }
}

void grpc_request_free(grpc_request *r) {
    api_gen_params_free(&r->gen);
    if (r->messages) cJSON_Delete(r->messages);
    if (r->msg) protobuf_c_message_free_unpacked(r->msg, NULL);
    memset(r, 0, sizeof(*r));
}
