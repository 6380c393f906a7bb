/* api_server: see api_server.h. */
#include "coordinator/api_server.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/mla_log.h"
#include "coordinator/api_body.h"
#include "coordinator/api_fprint.h"
#include "coordinator/api_messages.h"
#include "coordinator/api_metrics.h"
#include "coordinator/api_params.h"
#include "coordinator/api_responses.h"
#include "coordinator/chat_guard.h"
#include "coordinator/chat_json.h"
#include "coordinator/chat_reasoning.h"
#include "coordinator/chat_toolcall.h"

typedef api_token tok_entry; /* byte range [start, end) in the text */

struct api_resp;

typedef struct api_req {
    api_server *srv;
    struct api_req *prev, *next;
    http_conn *conn;     /* NULL once its answer is complete (or the response's) or the client left */
    struct api_resp *resp; /* the HTTP response it is a choice of; NULL for a sink's generation */
    int index;           /* its choice index in that response (0 for a sink's) */
    api_sink sink;       /* a non-HTTP front (api_server_generate) */
    bool has_sink;       /* until its final call or it detaches */
    bool cancelled;      /* finished by cancellation */
    bool shut;           /* ended by the drain timeout of a shutting-down server */
    bool down;           /* failed while the worker group was down (503 worker_down: retryable) */
    uint64_t sched_id;
    enum api_kind kind;
    bool stream, include_usage, logprobs, skip_special;
    bool continuous_usage; /* stream_options.continuous_usage_stats */
    bool include_stop;     /* include_stop_str_in_output */
    int32_t top_logprobs;
    char id[48];
    char *user;          /* the request's "user" (its log line), or NULL */
    long long created;
    char *stop[API_MAX_STOP];
    int n_stop;
    size_t max_stop_len;
    /* generated text (bytes) and its tokens */
    char *text;
    size_t text_len, text_cap;
    tok_entry *toks;
    int n_toks, cap_toks;
    size_t stop_scanned; /* text up to here holds no stop string start that fits */
    size_t stop_floor;   /* stop strings are looked for from here on (after an echoed prompt) */
    int32_t min_tokens;  /* vLLM's min_tokens: no stop string ends within the first min_tokens tokens' text */
    size_t stop_min_end; /* so a stop string must end past this (the text of the first min_tokens tokens) */
    int32_t *echo_ids;   /* echo: the prompt's tokens, put ahead of the first generated one; then NULL */
    int32_t n_echo;
    bool echo_lp;        /* echo with logprobs: a stop token is listed too (without text) */
    bool echo_only;      /* echo with max_tokens 0: the prompt alone; the one token made is dropped */
    size_t sent_len;     /* streamed bytes */
    int n_tok_sent;
    size_t off_bytes, off_chars; /* cursor for character offsets */
    bool text_done;      /* a stop string ended the text */
    int stop_hit;        /* that stop string's index in stop (-1: none) */
    bool counted;        /* its finish is in the metrics (count_finish) */
    const char *finish_reason;
    int32_t n_prompt, n_completion;
    bool responded;      /* response complete (or the client left) */
    bool taken_back;     /* a choice submitted before its request was refused: in no metric, nothing to do */
    bool preparing;      /* its prompt is on the prep thread (not submitted, not linked) */
    bool prep_cancelled, prep_detached; /* api_server_gen_cancel while preparing */
    double t_start, t_first, t_last;
    double t_admit;      /* its first scheduled step (api_server_note_scheduled), 0: not yet */
    /* chat output parsing (reasoning_content, tool_calls): NULL when off */
    struct chat_out *chat;
    /* a Responses API answer's output items (coordinator/api_responses.h): NULL for the others */
    api_rsp_out *rsp;
    int32_t n_cached; /* prompt tokens taken from the prefix cache (its scheduler events') */
} api_req;

/* An HTTP response of n choices (OpenAI's n), each an api_req of its own scheduled apart (choice
 * k > 0 after choice 0's prompt, whose blocks it then takes from the prefix cache). Streamed, each
 * choice's chunks carry its index and the stream ends when the last choice is answered; else the
 * answer goes out once every choice is. An error in any choice answers the whole response and
 * cancels the others. The choices hold it: freed with the last of them (req_free). */
typedef struct api_resp {
    http_conn *conn;  /* NULL once answered or the client left */
    int n;            /* choices: n_per for each prompt of the request, prompt p's at p * n_per + k */
    int n_per;        /* choices a prompt (OpenAI's n) */
    int64_t prompt_tokens; /* of its prompts, each once (the usage) */
    int n_live;       /* choices not yet freed */
    int n_done;       /* choices answered */
    api_req **ch;     /* choice k's request, NULL once freed */
    int32_t *ntok;    /* completion tokens of each choice so far (the usage) */
    cJSON **answers;  /* not streamed: each answered choice's object until every choice is */
    cJSON *rsp_echo;  /* a Responses API request's members its answer repeats (api_rsp_parse), else NULL */
    api_rsp_opts rsp_opts; /* and what it asks of its reasoning items */
} api_resp;

/* A chat response's parsing state: what parsers run, and what of their output was streamed. */
typedef struct chat_out {
    enum reasoning_kind rk;
    bool think_open;          /* the prompt ends in "<think>" */
    bool hide_reasoning;      /* include_reasoning: false: parsed out, not returned */
    enum toolcall_kind tk;    /* TOOLCALL_NONE: no tools in this request */
    bool one_call;            /* parallel_tool_calls: false: the first call alone */
    cJSON *tools;             /* a copy of the request's tools (GLM's argument types) */
    size_t sent_r, sent_c;    /* bytes of reasoning / content streamed */
    size_t r_scan;            /* where the search for the reasoning's end resumes (reasoning_split_text) */
    toolcall_scan tc_scan;    /* the tool-call parse's hints (toolcall_parse), for content from tc_base */
    size_t tc_base;
    int sent_calls;           /* calls whose first delta (id, name) was streamed */
    size_t sent_args[TOOLCALL_MAX_CALLS];
} chat_out;

typedef struct chat_parsed {
    reasoning_split rs;
    toolcall_result tc;
    const char *content;
    size_t content_len;
    int n_calls;
} chat_parsed;

/* A request whose prompt is tokenized on the prep thread: HTTP generation and /tokenize, sink
 * generations (api_server_generate with on_refused), api_server_tokenize_async. */
typedef struct api_tok_job prep_job;
struct api_tok_job {
    prep_job *next;
    api_server *srv;
    http_conn *conn;  /* NULL once the client left (the job is then dropped when done) */
    api_req *req;     /* a sink generation (api_server_generate): the request being prepared */
    /* api_server_tokenize_async: the callback (not called once detached) */
    void (*tok_done)(void *ud, const int32_t *ids, int32_t n, const api_error *e);
    void *tok_ud;
    bool detached;
    cJSON *root;      /* the request document (params point into it) */
    bool is_tokenize;
    bool count_only;    /* /v1/messages/count_tokens: the count as Anthropic's answer */
    api_gen_params gp;
    api_tok_params tp;
    /* results (prep thread) */
    int rc;
    api_error e;
    int32_t *ids;
    int32_t n_ids;
    int32_t **more_ids; /* the ids of gp's prompts after the first (gp.n_more) */
    int32_t *more_n;
    cJSON *rsp_echo;    /* a Responses API request's (api_rsp_parse), for its api_resp */
    api_rsp_opts rsp_opts;
    api_fp *fp;         /* a Messages request that asks for cache diagnostics: its fingerprint (prep
                         * thread), kept under its id once it is taken (generate_ready) */
};

typedef struct qev {
    sched_event ev;
    char *error;
    sched_plp *plp; /* the event's prompt logprobs, copied (ev.plp points here) */
} qev;

struct api_server {
    uv_loop_t *loop;
    api_config cfg;
    /* the cache pools (api_server_set_capacity) */
    const uint32_t *rank_blocks;
    int n_ranks;
    uint64_t block_bytes;
    char *model_name, *api_key; /* model_name: names[0] */
    char *names_buf;            /* cfg.model_aliases, its commas NULs: names[1..] point into it */
    const char **names;
    int n_names;
    api_tokenizer tok;
    int32_t *eog_ids; /* the end-of-generation tokens (tok.is_eog), n_eog of them: what min_tokens bans */
    int32_t n_eog;
    sched *s;
    http_server *http;
    uv_async_t async;
    bool async_open;
    pthread_mutex_t mu;
    qev *q;
    int nq, capq;
    /* api_server_note_scheduled (scheduler thread) -> the loop, under mu */
    struct admit { uint64_t id; double t; } *adm;
    int nadm, capadm;
    api_metrics m;
    api_req *reqs;
    int n_inflight;
    uint64_t counter;
    bool draining;             /* api_server_set_draining: no new generations */
    char *drain_why;           /* its reason, said by /health and the refusals (owned) */
    /* the prep thread: tokenizing and chat templates off the loop thread, in arrival order */
    pthread_t prep_th;
    bool prep_started, prep_quit;
    pthread_mutex_t prep_mu;
    pthread_cond_t prep_cv;
    prep_job *prep_head, *prep_tail; /* to do (FIFO) */
    prep_job *done_head, *done_tail; /* done, for the loop (FIFO) */
    uv_async_t prep_async;
    bool prep_async_open;
    int n_prep;                      /* jobs not yet back on the loop */
    struct auth_fail {         /* failed key attempts by client address (api_server_auth) */
        char addr[64];
        uint64_t since_ms;
        int n;
    } fails[API_AUTH_SLOTS];
    const char *cancel_reason; /* api_server_cancel_all: the error cancelled requests get */
    api_fp_store *fps;         /* Messages requests' fingerprints for cache diagnostics (made at first use) */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- replies ---- */

static void reply_json(http_conn *c, int status, cJSON *j) {
    char *s = chat_json_print(j);
    http_respond(c, status, "application/json", s, strlen(s), NULL);
    free(s);
}

/* e as the answer's body, in form f (http_server.h: OpenAI's, or Anthropic's with "type": "error"
 * first and its type names; param and code in both) */
static cJSON *error_json(const api_error *e, enum http_error_form f) {
    cJSON *root = cJSON_CreateObject();
    if (f == HTTP_ERRORS_ANTHROPIC) cJSON_AddStringToObject(root, "type", "error");
    cJSON *er = cJSON_AddObjectToObject(root, "error");
    size_t n;
    char *msg = api_utf8_sanitize(e->message, strlen(e->message), &n);
    cJSON_AddStringToObject(er, "message", msg);
    free(msg);
    cJSON_AddStringToObject(er, "type", http_error_type(f, e->status));
    if (e->param[0]) {
        /* a refused member's name comes from the client and may be cut inside a character */
        char *param = api_utf8_sanitize(e->param, strlen(e->param), &n);
        cJSON_AddStringToObject(er, "param", param);
        free(param);
    } else
        cJSON_AddNullToObject(er, "param");
    if (e->code[0])
        cJSON_AddStringToObject(er, "code", e->code);
    else
        cJSON_AddNullToObject(er, "code");
    return root;
}

static void reply_error(http_conn *c, const api_error *e, const char *extra) {
    /* a 429 says when to come back (RFC 9110 10.2.3): the queue frees a slot within about a step */
    if (e->status == 429 && !extra) extra = "Retry-After: 1\r\n";
    cJSON *j = error_json(e, http_conn_error_form(c));
    char *s = chat_json_print(j);
    http_respond(c, e->status, "application/json", s, strlen(s), extra);
    free(s);
    cJSON_Delete(j);
}

static void reply_errorf(http_conn *c, int status, const char *param, const char *code, const char *msg) {
    api_error e;
    api_error_set(&e, status, param, code, "%s", msg);
    reply_error(c, &e, NULL);
}

/* ---- tokens and text ---- */

static char *token_string(api_server *a, int32_t id, size_t *n) {
    size_t len = 0;
    const char *p = a->tok.piece(a->tok.ctx, id, &len);
    if (!p) {
        p = "";
        len = 0;
    }
    return api_json_text(p, len, n);
}

static cJSON *bytes_json(api_server *a, int32_t id) {
    size_t len = 0;
    const char *p = a->tok.piece(a->tok.ctx, id, &len);
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; p && i < len; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber((unsigned char)p[i]));
    return arr;
}

static double lp_value(float lp) {
    if (isnan(lp)) return -9999.0;
    if (lp < -9999.0f) return -9999.0;
    return lp;
}

/* Character offset of byte position pos of the generated text (monotonic cursor): the
 * characters of the returned (sanitized) text before it; a token that starts inside a character
 * (a byte token of a multi-byte one) gets that character's offset. */
static size_t char_offset(api_req *r, size_t pos) {
    if (pos > r->text_len) pos = r->text_len;
    pos = api_utf8_char_start(r->text, r->text_len, pos);
    if (pos < r->off_bytes) {
        r->off_bytes = 0;
        r->off_chars = 0;
    }
    r->off_chars += api_utf8_chars(r->text + r->off_bytes, pos - r->off_bytes);
    r->off_bytes = pos;
    return r->off_chars;
}

/* logprobs JSON for toks[from, to) */
static cJSON *logprobs_json(api_req *r, int from, int to) {
    api_server *a = r->srv;
    cJSON *lp = cJSON_CreateObject();
    if (r->kind == API_COMPLETIONS) {
        cJSON *tokens = cJSON_AddArrayToObject(lp, "tokens");
        cJSON *tlps = cJSON_AddArrayToObject(lp, "token_logprobs");
        cJSON *tops = cJSON_AddArrayToObject(lp, "top_logprobs");
        cJSON *offs = cJSON_AddArrayToObject(lp, "text_offset");
        for (int i = from; i < to; i++) {
            tok_entry *t = &r->toks[i];
            size_t n;
            char *s = token_string(a, t->id, &n);
            cJSON_AddItemToArray(tokens, cJSON_CreateString(s));
            free(s);
            if (t->no_lp) { /* an echoed prompt's first token, as OpenAI: null */
                cJSON_AddItemToArray(tlps, cJSON_CreateNull());
                cJSON_AddItemToArray(tops, cJSON_CreateNull());
                cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)char_offset(r, t->start)));
                continue;
            }
            cJSON_AddItemToArray(tlps, cJSON_CreateNumber(lp_value(t->logprob)));
            /* the top N and, as OpenAI's and vLLM's completions do, the sampled token (up to
             * N + 1 entries; tokens whose text another entry has already are left out) */
            cJSON *d = cJSON_CreateObject();
            for (int k = 0; k <= t->n_top; k++) {
                char *ts = token_string(a, k < t->n_top ? t->top_ids[k] : t->id, &n);
                if (!cJSON_GetObjectItemCaseSensitive(d, ts))
                    cJSON_AddNumberToObject(d, ts, lp_value(k < t->n_top ? t->top_lps[k] : t->logprob));
                free(ts);
            }
            cJSON_AddItemToArray(tops, d);
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)char_offset(r, t->start)));
        }
    } else {
        cJSON *content = cJSON_AddArrayToObject(lp, "content");
        for (int i = from; i < to; i++) {
            tok_entry *t = &r->toks[i];
            size_t n;
            cJSON *o = cJSON_CreateObject();
            char *s = token_string(a, t->id, &n);
            cJSON_AddStringToObject(o, "token", s);
            free(s);
            cJSON_AddNumberToObject(o, "logprob", lp_value(t->logprob));
            cJSON_AddItemToObject(o, "bytes", bytes_json(a, t->id));
            cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
            for (int k = 0; k < t->n_top; k++) {
                cJSON *to2 = cJSON_CreateObject();
                char *ts = token_string(a, t->top_ids[k], &n);
                cJSON_AddStringToObject(to2, "token", ts);
                free(ts);
                cJSON_AddNumberToObject(to2, "logprob", lp_value(t->top_lps[k]));
                cJSON_AddItemToObject(to2, "bytes", bytes_json(a, t->top_ids[k]));
                cJSON_AddItemToArray(tops, to2);
            }
            cJSON_AddItemToArray(content, o);
        }
        cJSON_AddNullToObject(lp, "refusal");
    }
    return lp;
}

/* The usage of r's response: each of its prompts once, the completion tokens of all its choices so far */
static cJSON *usage_json(const api_req *r) {
    int64_t prompt = r->n_prompt, done = r->n_completion;
    if (r->resp) {
        prompt = r->resp->prompt_tokens;
        done = 0;
        for (int k = 0; k < r->resp->n; k++) done += r->resp->ntok[k];
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)done);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + done));
    return u;
}

/* A stream chunk's usage member: none without include_usage; the usage so far with
 * continuous_usage_stats, else null (the last chunk carries it) */
static void chunk_usage(const api_req *r, cJSON *j) {
    if (r->continuous_usage) cJSON_AddItemToObject(j, "usage", usage_json(r));
    else if (r->include_usage) cJSON_AddNullToObject(j, "usage");
}

static cJSON *chunk_base(const api_req *r) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", r->id);
    cJSON_AddStringToObject(j, "object", r->kind == API_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(j, "created", (double)r->created);
    cJSON_AddStringToObject(j, "model", r->srv->model_name);
    return j;
}

/* One Server-Sent Event: "event: type" (type NULL: none, as chat and completions send them), then
 * "data: " and j */
static void sse_event(http_conn *c, const char *type, const cJSON *j) {
    char *s = chat_json_print(j);
    const size_t cap = sizeof "event: \ndata: \n\n" + (type ? strlen(type) : 0) + strlen(s); /* its NUL too */
    char *buf = mla_xmalloc(cap);
    const int n = type ? snprintf(buf, cap, "event: %s\ndata: %s\n\n", type, s) : snprintf(buf, cap, "data: %s\n\n", s);
    http_stream_write(c, buf, (size_t)n);
    free(buf);
    free(s);
}

static void sse_send(api_req *r, cJSON *j) { sse_event(r->conn, NULL, j); }

/* A stream chunk with text[from_b, to_b) and tokens [t0, t1); finish may be NULL. */
static void send_chunk(api_req *r, size_t from_b, size_t to_b, int t0, int t1, const char *finish) {
    cJSON *j = chunk_base(r);
    cJSON *choices = cJSON_AddArrayToObject(j, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", r->index);
    size_t n;
    char *txt = api_json_text(r->text ? r->text + from_b : "", to_b - from_b, &n); /* no text yet: NULL */
    if (r->kind == API_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (to_b > from_b || !finish) cJSON_AddStringToObject(d, "content", txt);
    } else {
        cJSON_AddStringToObject(c, "text", txt);
    }
    free(txt);
    if (r->logprobs && t1 > t0)
        cJSON_AddItemToObject(c, "logprobs", logprobs_json(r, t0, t1));
    else
        cJSON_AddNullToObject(c, "logprobs");
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    chunk_usage(r, j);
    sse_send(r, j);
    cJSON_Delete(j);
}

/* ---- chat output: reasoning_content and tool_calls ---- */

static void chat_parse(const api_req *r, size_t len, bool final, chat_parsed *o) {
    chat_out *co = r->chat; /* its r_scan moves */
    memset(o, 0, sizeof *o);
    const char *t = r->text ? r->text : "";
    if (co->rk != REASONING_NONE) {
        reasoning_split_text(co->rk, t, len, co->think_open, final, &co->r_scan, &o->rs);
    } else {
        o->rs.c_start = 0;
        o->rs.c_end = len;
    }
    if (co->tk != TOOLCALL_NONE) {
        if (o->rs.c_start != co->tc_base) { /* the content moved (whitespace after the reasoning): new hints */
            memset(&co->tc_scan, 0, sizeof co->tc_scan);
            co->tc_base = o->rs.c_start;
        }
        toolcall_parse(co->tk, t + o->rs.c_start, o->rs.c_end - o->rs.c_start, final, co->tools, &co->tc_scan, &o->tc);
        o->content = o->tc.content;
        o->content_len = o->tc.content_len;
        /* parallel_tool_calls: false: the first call; the model's later calls are not returned
         * (nor their text, as content), as vLLM filters them */
        o->n_calls = co->one_call && o->tc.n_calls > 1 ? 1 : o->tc.n_calls;
    } else {
        o->content = t + o->rs.c_start;
        o->content_len = o->rs.c_end - o->rs.c_start;
    }
}

static void chat_parsed_free(chat_parsed *o) { toolcall_result_free(&o->tc); }

static cJSON *tool_call_json(const api_req *r, int i, const toolcall *c, bool with_index, const char *args,
                             size_t args_len, bool header) {
    cJSON *o = cJSON_CreateObject();
    if (with_index) cJSON_AddNumberToObject(o, "index", i);
    if (header) {
        /* the model's own id (kimi-k2, whole whatever its length), else one of ours */
        char ours[sizeof r->id + 48];
        if (r->index) snprintf(ours, sizeof ours, "call_%s_%d_%d", r->id + 9, r->index, i); /* r->id is "chatcmpl-..." */
        else snprintf(ours, sizeof ours, "call_%s_%d", r->id + 9, i);
        const char *id = c->id ? c->id : ours;
        size_t n;
        char *s = api_json_text(id, strlen(id), &n);
        cJSON_AddStringToObject(o, "id", s);
        free(s);
        cJSON_AddStringToObject(o, "type", "function");
    }
    cJSON *fn = cJSON_AddObjectToObject(o, "function");
    if (header) {
        size_t n;
        char *s = api_json_text(c->name, strlen(c->name), &n);
        cJSON_AddStringToObject(fn, "name", s);
        free(s);
    }
    size_t n;
    char *s = api_json_text(args, args_len, &n);
    cJSON_AddStringToObject(fn, "arguments", s);
    free(s);
    return o;
}

/* The reasoning text s (NULL: none, null) into a message or a delta under both of its names:
 * reasoning_content (DeepSeek's API, llama.cpp, older vLLM) and reasoning (vLLM's since it
 * dropped the other), so that a client written for either finds it */
static void add_reasoning(cJSON *obj, const char *s) {
    const char *names[] = {"reasoning_content", "reasoning"};
    for (int i = 0; i < 2; i++) {
        if (s) cJSON_AddStringToObject(obj, names[i], s);
        else cJSON_AddNullToObject(obj, names[i]);
    }
}

/* The finish reason of a chat answer: "tool_calls" where it stopped after complete calls; a
 * call cut off (a stop string, the end of generation inside it) keeps "stop", as max_tokens
 * keeps "length": its arguments are not whole */
static const char *chat_finish(const api_req *r, const chat_parsed *ps) {
    const char *f = r->finish_reason ? r->finish_reason : "stop";
    if (!ps->n_calls || strcmp(f, "stop")) return f;
    for (int i = 0; i < ps->n_calls; i++)
        if (!ps->tc.calls[i].done) return f;
    return "tool_calls";
}

/* Streams what the parse of text[0, len) adds to what was sent: reasoning, content, then each
 * tool call's first delta (index, id, type, name, "") and argument fragments. The tokens
 * [t0, t1) go with the first chunk (logprobs); finish (may be NULL) ends the stream's choice. */
static void chat_stream(api_req *r, size_t len, bool final, int t0, int t1, bool finish) {
    chat_out *co = r->chat;
    chat_parsed ps;
    chat_parse(r, len, final, &ps);
    const char *t = r->text ? r->text : "";
    size_t rl = ps.rs.r_end > ps.rs.r_start ? ps.rs.r_end - ps.rs.r_start : 0;
    if (co->hide_reasoning) co->sent_r = rl; /* parsed out, not sent */
    cJSON *deltas[2 + 2 * TOOLCALL_MAX_CALLS];
    int nd = 0;
    if (rl > co->sent_r || ps.content_len > co->sent_c) {
        cJSON *d = cJSON_CreateObject();
        size_t n;
        if (rl > co->sent_r) {
            char *s = api_json_text(t + ps.rs.r_start + co->sent_r, rl - co->sent_r, &n);
            add_reasoning(d, s);
            free(s);
            co->sent_r = rl;
        }
        if (ps.content_len > co->sent_c) {
            char *s = api_json_text(ps.content + co->sent_c, ps.content_len - co->sent_c, &n);
            cJSON_AddStringToObject(d, "content", s);
            free(s);
            co->sent_c = ps.content_len;
        }
        deltas[nd++] = d;
    }
    for (int i = 0; i < ps.n_calls; i++) {
        const toolcall *c = &ps.tc.calls[i];
        if (!c->name) break;
        if (i >= co->sent_calls) {
            cJSON *d = cJSON_CreateObject();
            cJSON *arr = cJSON_AddArrayToObject(d, "tool_calls");
            cJSON_AddItemToArray(arr, tool_call_json(r, i, c, true, "", 0, true));
            deltas[nd++] = d;
            co->sent_calls = i + 1;
            co->sent_args[i] = 0;
        }
        if (c->args_len > co->sent_args[i]) {
            cJSON *d = cJSON_CreateObject();
            cJSON *arr = cJSON_AddArrayToObject(d, "tool_calls");
            cJSON_AddItemToArray(arr, tool_call_json(r, i, c, true, c->args + co->sent_args[i],
                                                     c->args_len - co->sent_args[i], false));
            deltas[nd++] = d;
            co->sent_args[i] = c->args_len;
        }
    }
    if (nd == 0 && ((r->logprobs && t1 > t0) || finish)) deltas[nd++] = cJSON_CreateObject();
    for (int k = 0; k < nd; k++) {
        cJSON *j = chunk_base(r);
        cJSON *choices = cJSON_AddArrayToObject(j, "choices");
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", r->index);
        cJSON_AddItemToObject(c, "delta", deltas[k]);
        if (k == 0 && r->logprobs && t1 > t0) cJSON_AddItemToObject(c, "logprobs", logprobs_json(r, t0, t1));
        else cJSON_AddNullToObject(c, "logprobs");
        if (finish && k == nd - 1) cJSON_AddStringToObject(c, "finish_reason", chat_finish(r, &ps));
        else cJSON_AddNullToObject(c, "finish_reason");
        cJSON_AddItemToArray(choices, c);
        chunk_usage(r, j);
        sse_send(r, j);
        cJSON_Delete(j);
    }
    chat_parsed_free(&ps);
}

/* ---- Responses API output (coordinator/api_responses.h) ---- */

static void req_unlink_conn(api_req *r);

static void rsp_emit(void *ud, const char *type, const cJSON *ev) { sse_event(((api_req *)ud)->conn, type, ev); }

/* The parse of text[0, len) as output items: what it adds goes out as events when streamed
 * (emit), else into the items alone. */
static void rsp_update(api_req *r, size_t len, bool final, bool emit) {
    api_rsp_view v = {0};
    chat_parsed ps = {0};
    if (r->chat) {
        chat_parse(r, len, final, &ps);
        if (ps.rs.r_end > ps.rs.r_start && !r->chat->hide_reasoning) {
            v.reasoning = r->text + ps.rs.r_start;
            v.reasoning_len = ps.rs.r_end - ps.rs.r_start;
        }
        v.content = ps.content;
        v.content_len = ps.content_len;
        v.calls = ps.tc.calls;
        v.n_calls = ps.n_calls;
    } else {
        v.content = r->text ? r->text : "";
        v.content_len = len;
    }
    api_rsp_out_update(r->rsp, &v, emit ? rsp_emit : NULL, r);
    if (r->chat) chat_parsed_free(&ps);
}

/* Where the final text's reasoning ends (tags and the whitespace about them included), 0: none */
static size_t rsp_reasoning_end(api_req *r) {
    if (!r->chat) return 0;
    chat_parsed ps;
    chat_parse(r, r->text_len, true, &ps);
    const size_t end = ps.rs.has_reasoning ? ps.rs.c_start : 0;
    chat_parsed_free(&ps);
    return end;
}

/* The response object of r (status "completed", "incomplete" or "failed" with err); n_final: the
 * final text's tokens */
static cJSON *rsp_object(api_req *r, const char *status, int n_final, const api_error *err) {
    api_rsp_usage u = {.input = r->n_prompt, .cached = r->n_cached, .output = r->n_completion};
    const size_t reasoning_end = rsp_reasoning_end(r);
    for (int i = 0; i < n_final && r->toks[i].start < reasoning_end; i++) u.reasoning++;
    const bool cut = !strcmp(status, "incomplete");
    return api_rsp_object(r->rsp, r->resp->rsp_echo, r->srv->model_name, r->created, status,
                          cut ? "max_output_tokens" : NULL, &u, err);
}

/* A Messages answer's stop_reason (and the stop sequence that ended it, where one did) */
static const char *msg_stop_reason(const api_req *r, const char **seq) {
    *seq = NULL;
    if (r->finish_reason && !strcmp(r->finish_reason, "length")) return "max_tokens";
    if (r->stop_hit >= 0) {
        *seq = r->stop[r->stop_hit];
        return "stop_sequence";
    }
    for (int k = 0; k < r->rsp->n_items; k++) /* stopped after a whole call: the tools' turn */
        if (r->rsp->items[k].kind == API_RSP_CALL && !r->rsp->items[k].incomplete) return "tool_use";
    return "end_turn";
}

/* The end of a Messages answer: the blocks done, then message_delta and message_stop, or the
 * message whole */
static void msg_complete(api_req *r) {
    http_conn *c = r->conn;
    const bool cut = r->finish_reason && !strcmp(r->finish_reason, "length");
    rsp_update(r, r->text_len, true, r->stream);
    api_rsp_out_finish(r->rsp, cut, r->stream ? rsp_emit : NULL, r);
    const char *seq;
    const char *why = msg_stop_reason(r, &seq);
    const api_rsp_usage u = {.input = r->n_prompt, .cached = r->n_cached, .output = r->n_completion};
    if (r->stream) {
        cJSON *ev = api_rsp_event(r->rsp, "message_delta");
        cJSON *d = cJSON_AddObjectToObject(ev, "delta");
        cJSON_AddStringToObject(d, "stop_reason", why);
        if (seq) cJSON_AddStringToObject(d, "stop_sequence", seq);
        else cJSON_AddNullToObject(d, "stop_sequence");
        cJSON_AddItemToObject(ev, "usage", api_msg_usage(&u));
        sse_event(c, "message_delta", ev);
        cJSON_Delete(ev);
        ev = api_rsp_event(r->rsp, "message_stop");
        sse_event(c, "message_stop", ev);
        cJSON_Delete(ev);
        http_stream_end(c);
    } else {
        cJSON *m = api_msg_object(r->rsp, r->id, r->srv->model_name, why, seq, &u, &r->rsp->opts);
        reply_json(c, 200, m);
        cJSON_Delete(m);
    }
}

/* The end of a Responses answer: the items done, and the response object, as the last event of
 * the stream or as the answer */
static void rsp_complete(api_req *r, int n_final) {
    http_conn *c = r->conn;
    api_resp *rs = r->resp;
    if (r->rsp->opts.messages) {
        msg_complete(r);
        rs->n_done++;
        rs->conn = NULL;
        req_unlink_conn(r);
        return;
    }
    const bool cut = r->finish_reason && !strcmp(r->finish_reason, "length");
    rsp_update(r, r->text_len, true, r->stream);
    api_rsp_out_finish(r->rsp, cut, r->stream ? rsp_emit : NULL, r);
    cJSON *obj = rsp_object(r, cut ? "incomplete" : "completed", n_final, NULL);
    if (r->stream) {
        cJSON *ev = api_rsp_event(r->rsp, cut ? "response.incomplete" : "response.completed");
        cJSON_AddItemToObject(ev, "response", obj);
        sse_event(c, cut ? "response.incomplete" : "response.completed", ev);
        cJSON_Delete(ev);
        http_stream_end(c);
    } else {
        reply_json(c, 200, obj);
        cJSON_Delete(obj);
    }
    rs->n_done++;
    rs->conn = NULL;
    req_unlink_conn(r);
}

/* Number of tokens that belong to the final text. */
static int final_token_count(const api_req *r) {
    int n = 0;
    while (n < r->n_toks) {
        const tok_entry *t = &r->toks[n];
        /* an echoed prompt's tokens all belong (stop strings cut the answer only) */
        if (t->prompt || t->start < r->text_len || (t->start == t->end && t->start <= r->text_len && !r->text_done)) {
            n++;
            continue;
        }
        break;
    }
    return n;
}

/* Streams what is safe to send: text that cannot become part of a stop string and ends on a
 * UTF-8 boundary, with its tokens. */
static void stream_flush(api_req *r) {
    size_t safe = r->text_len;
    for (int i = 0; i < r->n_stop; i++) {
        size_t sl = strlen(r->stop[i]);
        size_t kmax = sl - 1 < r->text_len ? sl - 1 : r->text_len;
        for (size_t k = kmax; k >= 1; k--) {
            if (!memcmp(r->text + r->text_len - k, r->stop[i], k)) {
                if (r->text_len - k < safe) safe = r->text_len - k;
                break;
            }
        }
    }
    safe = api_utf8_complete_prefix(r->text, safe);
    int t0 = r->n_tok_sent, t1 = t0;
    while (t1 < r->n_toks && r->toks[t1].end <= safe) t1++;
    if (t1 == t0) return;
    size_t to_b = r->toks[t1 - 1].end;
    if (to_b < r->sent_len) to_b = r->sent_len;
    if (r->has_sink)
        r->sink.on_delta(r->sink.ud, r->text, r->sent_len, to_b, r->toks + t0, t1 - t0);
    else if (r->rsp)
        rsp_update(r, to_b, false, true);
    else if (r->chat)
        chat_stream(r, to_b, false, t0, t1, false);
    else
        send_chunk(r, r->sent_len, to_b, t0, t1, NULL);
    r->sent_len = to_b;
    r->n_tok_sent = t1;
}

static void req_unlink_conn(api_req *r) {
    r->conn = NULL;
    r->has_sink = false;
    r->responded = true;
}

static bool has_client(const api_req *r) { return r->conn || r->has_sink; }

/* the error a generation that ended with `error` answers: 503 shutting_down where the server's
 * drain timeout cut it off, 503 worker_down where the worker group went down under it (a client
 * may retry either), else 500 */
static void gen_error(const api_req *r, const char *error, api_error *e) {
    if (r->shut) api_error_set(e, 503, NULL, "shutting_down", "%s", error);
    else if (r->down) api_error_set(e, 503, NULL, "worker_down", "%s", error);
    else api_error_set(e, 500, NULL, "generation_failed", "generation failed: %s", error);
}

static void resp_free(api_resp *rs) {
    for (int k = 0; k < rs->n; k++) cJSON_Delete(rs->answers[k]);
    free(rs->answers);
    cJSON_Delete(rs->rsp_echo);
    free(rs->ntok);
    free(rs->ch);
    free(rs);
}

/* The answer of choice r (not streamed): its text or message, logprobs and finish reason */
static cJSON *choice_json(api_req *r, int n_final) {
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", r->index);
    size_t n;
    char *txt = api_json_text(r->text, r->text_len, &n);
    const char *finish = r->finish_reason ? r->finish_reason : "stop";
    if (r->chat) {
        chat_parsed ps;
        chat_parse(r, r->text_len, true, &ps);
        cJSON *m = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        char *cs = api_json_text(ps.content, ps.content_len, &n);
        /* no content beside calls or reasoning (or a call the model opened and did not
         * write): null, as OpenAI answers */
        if (ps.content_len || !(ps.n_calls || ps.tc.opened || ps.rs.has_reasoning))
            cJSON_AddStringToObject(m, "content", cs);
        else cJSON_AddNullToObject(m, "content");
        free(cs);
        if (r->chat->rk != REASONING_NONE) {
            if (ps.rs.r_end > ps.rs.r_start && !r->chat->hide_reasoning) {
                char *rs = api_json_text(r->text + ps.rs.r_start, ps.rs.r_end - ps.rs.r_start, &n);
                add_reasoning(m, rs);
                free(rs);
            } else {
                add_reasoning(m, NULL);
            }
        }
        if (ps.n_calls) {
            cJSON *arr = cJSON_AddArrayToObject(m, "tool_calls");
            for (int i = 0; i < ps.n_calls; i++)
                if (ps.tc.calls[i].name)
                    cJSON_AddItemToArray(arr, tool_call_json(r, i, &ps.tc.calls[i], false, ps.tc.calls[i].args,
                                                             ps.tc.calls[i].args_len, true));
        }
        finish = chat_finish(r, &ps);
        chat_parsed_free(&ps);
    } else if (r->kind == API_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", txt);
    } else {
        cJSON_AddStringToObject(ch, "text", txt);
    }
    free(txt);
    if (n_final > 0 && r->toks[n_final - 1].end > r->text_len) r->toks[n_final - 1].end = r->text_len;
    if (r->logprobs)
        cJSON_AddItemToObject(ch, "logprobs", logprobs_json(r, 0, n_final));
    else
        cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddStringToObject(ch, "finish_reason", finish);
    return ch;
}

/* The response ends early (an error answered it, or its client left): no choice of it writes any
 * more, and the ones still generating (but `except`) are cancelled */
static void resp_end(api_resp *rs, api_req *except) {
    for (int k = 0; k < rs->n; k++) {
        api_req *q = rs->ch[k];
        if (!q || q->responded) continue;
        req_unlink_conn(q);
        if (q != except) sched_cancel(q->srv->s, q->sched_id);
    }
    rs->conn = NULL;
}

/* Completes the response (text final: stop string, stop token, length, or error). */
static void complete_response(api_req *r, const char *error) {
    api_server *a = r->srv;
    if (r->responded || !has_client(r)) return;
    http_conn *c = r->conn;
    int n_final = final_token_count(r);
    if (r->has_sink) {
        int t0 = r->n_tok_sent < n_final ? r->n_tok_sent : n_final;
        size_t from = r->sent_len < r->text_len ? r->sent_len : r->text_len;
        if (n_final > 0 && r->toks[n_final - 1].end > r->text_len) r->toks[n_final - 1].end = r->text_len;
        api_sink sk = r->sink;
        req_unlink_conn(r);
        const enum api_end end = !error ? API_END_OK
                                 : r->shut ? API_END_SHUTDOWN
                                 : r->down ? API_END_UNAVAILABLE
                                 : r->cancelled ? API_END_CANCELLED
                                                : API_END_FAILED;
        sk.on_final(sk.ud, r->text ? r->text : "", from, error ? from : r->text_len,
                    r->toks ? r->toks + t0 : NULL, error ? 0 : n_final - t0, error ? NULL : (r->finish_reason ? r->finish_reason : "stop"),
                    error, end, r->n_prompt, r->n_completion);
        return;
    }
    api_resp *rs = r->resp;
    MLA_ASSERT(rs && rs->conn == c);
    if (error) { /* the whole response: the other choices are not answered */
        api_error e;
        gen_error(r, error, &e);
        if (r->stream && r->rsp && r->rsp->opts.messages) { /* the stream's error event: the error's body */
            cJSON *ev = error_json(&e, HTTP_ERRORS_ANTHROPIC);
            sse_event(c, "error", ev);
            cJSON_Delete(ev);
            http_stream_end(c);
        } else if (r->stream && r->rsp) { /* the items as far as they got, the response failed */
            cJSON *ev = api_rsp_event(r->rsp, "response.failed");
            cJSON_AddItemToObject(ev, "response", rsp_object(r, "failed", n_final, &e));
            sse_event(c, "response.failed", ev);
            cJSON_Delete(ev);
            http_stream_end(c);
        } else if (r->stream) {
            cJSON *j = error_json(&e, HTTP_ERRORS_OPENAI);
            sse_send(r, j);
            cJSON_Delete(j);
            http_stream_write(c, "data: [DONE]\n\n", 14);
            http_stream_end(c);
        } else {
            reply_error(c, &e, NULL);
        }
        resp_end(rs, r);
        return;
    }
    if (r->rsp) {
        if (n_final > 0 && r->toks[n_final - 1].end > r->text_len) r->toks[n_final - 1].end = r->text_len;
        rsp_complete(r, n_final);
        return;
    }
    if (r->stream) {
        int t0 = r->n_tok_sent;
        if (t0 > n_final) t0 = n_final;
        size_t from = r->sent_len < r->text_len ? r->sent_len : r->text_len;
        /* clip the last token's range to the final text */
        if (n_final > 0 && r->toks[n_final - 1].end > r->text_len) r->toks[n_final - 1].end = r->text_len;
        if (r->chat) chat_stream(r, r->text_len, true, t0, n_final, true);
        else send_chunk(r, from, r->text_len, t0, n_final, r->finish_reason);
        if (++rs->n_done == rs->n) { /* the last choice: the usage of all, and the end */
            if (r->include_usage) {
                cJSON *j = chunk_base(r);
                cJSON_AddArrayToObject(j, "choices");
                cJSON_AddItemToObject(j, "usage", usage_json(r));
                sse_send(r, j);
                cJSON_Delete(j);
            }
            http_stream_write(c, "data: [DONE]\n\n", 14);
            http_stream_end(c);
            rs->conn = NULL;
        }
        req_unlink_conn(r);
        return;
    }
    rs->answers[r->index] = choice_json(r, n_final);
    req_unlink_conn(r);
    if (++rs->n_done < rs->n) return;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", r->id);
    cJSON_AddStringToObject(j, "object", r->kind == API_CHAT ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(j, "created", (double)r->created);
    cJSON_AddStringToObject(j, "model", a->model_name);
    cJSON *choices = cJSON_AddArrayToObject(j, "choices");
    for (int k = 0; k < rs->n; k++) {
        cJSON_AddItemToArray(choices, rs->answers[k]);
        rs->answers[k] = NULL;
    }
    cJSON_AddItemToObject(j, "usage", usage_json(r));
    reply_json(c, 200, j);
    cJSON_Delete(j);
    rs->conn = NULL;
}

static void check_stops(api_req *r) {
    if (!r->n_stop || r->text_done) return;
    size_t from = r->stop_scanned > r->max_stop_len - 1 ? r->stop_scanned - (r->max_stop_len - 1) : 0;
    if (from < r->stop_floor) from = r->stop_floor;
    size_t best = SIZE_MAX, best_len = 0;
    int best_i = -1;
    for (int i = 0; i < r->n_stop; i++) {
        const size_t len = strlen(r->stop[i]);
        size_t at = from; /* where a match would end past stop_min_end (vLLM's min_tokens) */
        if (r->stop_min_end >= len && r->stop_min_end - len + 1 > at) at = r->stop_min_end - len + 1;
        if (at > r->text_len) continue;
        const char *hit = memmem(r->text + at, r->text_len - at, r->stop[i], len);
        if (hit && (size_t)(hit - r->text) < best) {
            best = (size_t)(hit - r->text);
            best_len = len;
            best_i = i;
        }
    }
    if (best != SIZE_MAX) {
        /* of the matches whole so far, the earliest; of two there, the one listed first */
        r->text_len = best + (r->include_stop ? best_len : 0);
        r->text_done = true;
        r->stop_hit = best_i;
        r->finish_reason = "stop";
        sched_cancel(r->srv->s, r->sched_id);
    } else {
        r->stop_scanned = r->text_len;
    }
}

static void req_free(api_req *r) {
    api_server *a = r->srv;
    if (r->prev)
        r->prev->next = r->next;
    else
        a->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    a->n_inflight--;
    MLA_DEBUG("%s%s%s%s: %d prompt + %d completion tokens, %s", r->id[0] ? r->id : "a request",
              r->user ? " (user \"" : "", r->user ? r->user : "", r->user ? "\")" : "", r->n_prompt,
              r->n_completion, r->cancelled ? "cancelled" : r->finish_reason ? r->finish_reason : "no answer");
    free(r->user);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->text);
    free(r->toks);
    free(r->echo_ids);
    if (r->chat) cJSON_Delete(r->chat->tools);
    free(r->chat);
    if (r->rsp) api_rsp_out_free(r->rsp);
    free(r->rsp);
    api_resp *rs = r->resp;
    if (rs) {
        rs->ch[r->index] = NULL;
        if (--rs->n_live == 0) resp_free(rs); /* answered by now: its last choice's final event */
    }
    free(r);
}

/* A request that ended with an answer, into the metrics: its finish reason, its times and its
 * lengths. At the scheduler's last event, or, when a stop string ends the text, as its answer is
 * sent: the scheduler's cancel of it comes a step later, and a scrape after the answer must find
 * it counted. */
static void count_finish(api_server *a, api_req *r, double t) {
    if (r->counted) return;
    r->counted = true;
    if (r->finish_reason && !strcmp(r->finish_reason, "length")) a->m.finish_length++;
    else a->m.finish_stop++;
    if (r->t_first > 0) {
        api_hist_observe(&a->m.e2e, t - r->t_start);
        api_hist_observe(&a->m.decode, r->t_last - r->t_first);
    }
    api_hist_observe(&a->m.prompt_len, r->n_prompt);
    api_hist_observe(&a->m.generation_len, r->n_completion);
}

/* Whether p[0, len) is a marker one of r's parsers reads: the reasoning's tags where the server runs
 * a reasoning parser (with the thinking switch off they stay in the content, docs/chat-dialects.md),
 * the tool-call format's markers where the request has tools, and Kimi-K2's, whose call section
 * also ends its reasoning */
static bool parser_marker(const api_server *a, const api_req *r, const char *p, size_t len) {
    if (!r->chat) return false;
    if (a->cfg.reasoning_parser != REASONING_NONE &&
        ((len == sizeof REASONING_OPEN_TAG - 1 && !memcmp(p, REASONING_OPEN_TAG, len)) ||
         (len == sizeof REASONING_CLOSE_TAG - 1 && !memcmp(p, REASONING_CLOSE_TAG, len))))
        return true;
    /* Kimi-K2's reasoning also ends where its call section opens: the section's markers with no
     * tools too; the calls' own markers only with them */
    return toolcall_marker(r->chat->tk, p, len) ||
           (r->chat->rk == REASONING_KIMI_K2 && toolcall_kimi_section_marker(p, len));
}

/* Token id onto the request's tokens, and its text (with_text) onto its text; its logprob and up
 * to n_top alternatives (as many as the request asked for) */
static tok_entry *push_token(api_server *a, api_req *r, int32_t id, bool with_text, float logprob, int32_t n_top,
                             const int32_t *top_ids, const float *top_lps) {
    size_t len = 0;
    const char *p = "";
    if (with_text) {
        p = a->tok.piece(a->tok.ctx, id, &len);
        if (!p) {
            p = "";
            len = 0;
        }
        /* skip_special_tokens leaves out control tokens, but for the markers this request's
         * parsers read (control tokens in these vocabularies), which a parsed answer keeps */
        if (r->skip_special && a->tok.is_special && a->tok.is_special(a->tok.ctx, id) && !parser_marker(a, r, p, len))
            len = 0;
    }
    if (r->n_toks == r->cap_toks) {
        r->cap_toks = r->cap_toks ? 2 * r->cap_toks : 64;
        r->toks = mla_xrealloc(r->toks, (size_t)r->cap_toks * sizeof(*r->toks));
    }
    tok_entry *te = &r->toks[r->n_toks++];
    memset(te, 0, sizeof *te);
    te->id = id;
    te->logprob = logprob;
    te->n_top = r->top_logprobs < n_top ? r->top_logprobs : n_top;
    if (te->n_top < 0) te->n_top = 0;
    if (te->n_top) {
        memcpy(te->top_ids, top_ids, (size_t)te->n_top * sizeof *top_ids);
        memcpy(te->top_lps, top_lps, (size_t)te->n_top * sizeof *top_lps);
    }
    te->start = r->text_len;
    if (r->text_len + len + 1 > r->text_cap) {
        r->text_cap = (r->text_len + len + 1) * 2;
        r->text = mla_xrealloc(r->text, r->text_cap);
    }
    if (len) memcpy(r->text + r->text_len, p, len);
    r->text_len += len;
    te->end = r->text_len;
    return te;
}

/* echo: the prompt's tokens ahead of the first generated one, with the logprobs the first token
 * event brings (sched_event.plp; the prompt's first token has none). Stop strings are looked for
 * in the generated text only. */
static void add_echo(api_server *a, api_req *r, const sched_event *ev) {
    for (int32_t i = 0; i < r->n_echo; i++) {
        const sched_plp *pl = i > 0 && i - 1 < ev->n_plp && ev->plp ? &ev->plp[i - 1] : NULL;
        tok_entry *te = pl ? push_token(a, r, r->echo_ids[i], true, pl->logprob, pl->n_top, pl->top_ids,
                                        pl->top_logprobs)
                           : push_token(a, r, r->echo_ids[i], true, 0, 0, NULL, NULL);
        te->no_lp = !pl;
        te->prompt = true;
    }
    r->stop_scanned = r->stop_floor = r->text_len;
    free(r->echo_ids);
    r->echo_ids = NULL;
}

static void process_event(api_server *a, const sched_event *ev, const char *error) {
    api_req *r = ev->user;
    if (r->taken_back) { /* its request was refused: gone at its final event */
        if (ev->finish != SCHED_FINISH_NONE) req_free(r);
        return;
    }
    double t = now_s();
    r->n_cached = ev->n_cached;
    if (ev->has_token && !r->text_done) {
        if (!r->echo_only) { /* the one token of an echo with max_tokens 0 is not part of the answer */
            r->n_completion++;
            a->m.generation_tokens++;
            if (r->resp) r->resp->ntok[r->index] = r->n_completion;
        }
        if (r->t_first == 0) {
            r->t_first = t;
            api_hist_observe(&a->m.ttft, t - r->t_start);
            if (r->t_admit > 0) api_hist_observe(&a->m.prefill, t - r->t_admit);
        } else {
            api_hist_observe(&a->m.itl, t - r->t_last);
        }
        r->t_last = t;
        if (r->echo_ids) add_echo(a, r, ev);
        if (r->echo_only) { /* the prompt was what was asked for: the scheduler ends it with this event */
            r->finish_reason = "length";
        } else if (!ev->is_stop || r->include_stop) { /* a stop token's text too where the stop is kept, as vLLM */
            push_token(a, r, ev->result.token, true, ev->result.logprob, ev->result.n_top, ev->result.top_ids,
                       ev->result.top_logprobs);
            if (!ev->is_stop && r->n_completion <= r->min_tokens) /* a stop string ends after this text */
                r->stop_min_end = r->stop_scanned = r->text_len;
            else if (!ev->is_stop)
                check_stops(r);
        } else if (r->echo_lp) { /* as vLLM's echo lists it: a scorer takes the last entry as the generated token */
            push_token(a, r, ev->result.token, false, ev->result.logprob, ev->result.n_top, ev->result.top_ids,
                       ev->result.top_logprobs);
        }
        if (!r->text_done && r->stream && has_client(r) && !r->responded) stream_flush(r);
        if (r->text_done) {
            count_finish(a, r, t);
            if (has_client(r)) complete_response(r, NULL);
        }
    }
    if (ev->finish == SCHED_FINISH_NONE) return;
    /* the final event: the scheduler is done with this request */
    switch (ev->finish) {
    case SCHED_FINISH_STOP:
        if (!r->finish_reason) r->finish_reason = "stop";
        break;
    case SCHED_FINISH_LENGTH:
        if (!r->finish_reason) r->finish_reason = "length";
        break;
    case SCHED_FINISH_ERROR:
        if (!r->counted) a->m.requests_error++; /* not an answer a stop string already completed */
        MLA_WARN("api: request %s failed: %s", r->id, error ? error : "?");
        break;
    default:
        break;
    }
    if (ev->finish == SCHED_FINISH_ERROR) {
        /* the step given up at the drain timeout: the request fails with the drain's reason (it
         * was cut off, whatever step it was in; the step's own error is in the log line above) */
        r->shut = a->cancel_reason != NULL;
        char why[512];
        r->down = !r->shut && !api_server_healthy(a, why, sizeof why); /* the group failed under it */
        complete_response(r, r->shut ? a->cancel_reason : error ? error : "unknown error");
    } else if (ev->finish == SCHED_FINISH_CANCELLED && !r->text_done) {
        a->m.requests_cancelled++;
        r->cancelled = true;
        r->shut = a->cancel_reason != NULL;
        complete_response(r, a->cancel_reason ? a->cancel_reason : "the request was cancelled");
    } else { /* an answer (a stop string ends it by cancelling too) */
        count_finish(a, r, t);
        complete_response(r, NULL);
    }
    if (!r->counted && r->t_first > 0) { /* an error or a cancel: its times, not its lengths */
        api_hist_observe(&a->m.e2e, t - r->t_start);
        api_hist_observe(&a->m.decode, r->t_last - r->t_first);
    }
    req_free(r);
}

/* admissions noted by the scheduler thread: the first for each request counts */
static void take_admits(api_server *a, struct admit *adm, int n) {
    for (int i = 0; i < n; i++)
        for (api_req *r = a->reqs; r; r = r->next)
            if (r->sched_id == adm[i].id) {
                if (r->t_admit == 0 && !r->taken_back) {
                    r->t_admit = adm[i].t;
                    api_hist_observe(&a->m.queue, r->t_admit - r->t_start);
                }
                break;
            }
}

void api_server_note_scheduled(api_server *a, uint64_t sched_id) {
    double t = now_s();
    pthread_mutex_lock(&a->mu);
    if (a->nadm == a->capadm) {
        a->capadm = a->capadm ? a->capadm * 2 : 64;
        a->adm = mla_xrealloc(a->adm, (size_t)a->capadm * sizeof(*a->adm));
    }
    a->adm[a->nadm++] = (struct admit){sched_id, t};
    pthread_mutex_unlock(&a->mu); /* taken with the step's events (on_async) */
}

static void on_async(uv_async_t *h) {
    api_server *a = h->data;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        int nadm = a->nadm;
        struct admit *adm = a->adm;
        a->adm = NULL;
        a->nadm = a->capadm = 0;
        int n = a->nq;
        qev *q = a->q;
        a->q = NULL;
        a->nq = a->capq = 0;
        pthread_mutex_unlock(&a->mu);
        take_admits(a, adm, nadm);
        free(adm);
        if (n == 0 && nadm == 0) break;
        for (int i = 0; i < n; i++) {
            process_event(a, &q[i].ev, q[i].error);
            free(q[i].error);
            free(q[i].plp);
        }
        free(q);
    }
}

void api_server_on_event(void *cb_ctx, const sched_event *ev) {
    api_server *a = cb_ctx;
    /* the scheduler's arrays live only during the callback */
    sched_plp *plp = NULL;
    if (ev->plp && ev->n_plp > 0) {
        plp = mla_xmalloc((size_t)ev->n_plp * sizeof *plp);
        memcpy(plp, ev->plp, (size_t)ev->n_plp * sizeof *plp);
    }
    pthread_mutex_lock(&a->mu);
    if (a->nq == a->capq) {
        a->capq = a->capq ? a->capq * 2 : 64;
        a->q = mla_xrealloc(a->q, (size_t)a->capq * sizeof(*a->q));
    }
    qev *e = &a->q[a->nq++];
    e->ev = *ev;
    e->error = ev->error ? mla_xstrdup(ev->error) : NULL;
    e->ev.error = NULL;
    e->plp = plp;
    e->ev.plp = plp;
    e->ev.n_plp = plp ? ev->n_plp : 0;
    pthread_mutex_unlock(&a->mu);
    uv_async_send(&a->async);
}

static void on_client_abort(void *ud) {
    api_resp *rs = ud;
    MLA_DEBUG("api: client of %s went away; cancelling its %d choice(s)", rs->ch[0] ? rs->ch[0]->id : "a request",
              rs->n);
    resp_end(rs, NULL);
}

/* ---- request handlers ---- */

/* The body of a POST as JSON (api_body_parse), or NULL after a 400 invalid_json naming the problem */
static cJSON *parse_body(http_conn *c, const http_request *req) {
    mla_err err = {{0}};
    cJSON *j = api_body_parse(req->body, req->body_len, &err);
    if (!j) reply_errorf(c, 400, NULL, "invalid_json", err.msg);
    return j;
}

static void encode_error(api_error *e, const mla_err *err) {
    api_error_set(e, 400, "prompt", NULL, "cannot tokenize the prompt: %s", err->msg);
}

/* Prompt text for a chat request, or NULL with e set. */
static char *render_chat(api_server *a, const cJSON *messages, bool add_gen, const cJSON *vars, api_error *e) {
    if (!a->tok.render_chat) {
        api_error_set(e, 400, "messages", NULL, "this model has no chat template; use /v1/completions");
        return NULL;
    }
    char *out = NULL;
    mla_err err = {{0}};
    if (a->tok.render_chat(a->tok.ctx, messages, add_gen, vars, &out, &err) != MLA_OK) {
        api_error_set(e, 400, "messages", NULL, "cannot render the chat template: %s", err.msg);
        return NULL;
    }
    return out;
}

/* continue_final_message: the end of the last message's text is marked (CONT_MARK appended to it)
 * before the template renders, and the rendered prompt is cut at the mark: what the template
 * writes after the text (the end of the turn) goes. U+10FFFD twice, a private-use code point of
 * its own (the guard's placeholders are others). */
#define CONT_MARK "\xF4\x8F\xBF\xBD\xF4\x8F\xBF\xBD"

/* The last message's content with CONT_MARK after it, in msgs (a copy the caller owns) */
static void continue_mark(cJSON *msgs) {
    cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(last, "content");
    if (!cJSON_IsString(c)) return;
    size_t n = strlen(c->valuestring);
    char *m = mla_xmalloc(n + sizeof CONT_MARK);
    memcpy(m, c->valuestring, n);
    memcpy(m + n, CONT_MARK, sizeof CONT_MARK);
    cJSON_ReplaceItemInObjectCaseSensitive(last, "content", cJSON_CreateString(m));
    free(m);
}

/* full[0, *len) cut at the one CONT_MARK, which the last message's text cont must come right
 * before (the template wrote it unchanged); the guarded spans cut with it. MLA_ERR otherwise. */
static int continue_cut(char *full, size_t *len, size_t *spans, size_t *n_spans, const char *cont) {
    const size_t ml = sizeof CONT_MARK - 1, cl = strlen(cont);
    const char *m = memmem(full, *len, CONT_MARK, ml);
    if (!m || memmem(m + ml, *len - (size_t)(m - full) - ml, CONT_MARK, ml)) return MLA_ERR;
    const size_t at = (size_t)(m - full);
    if (at < cl || memcmp(full + at - cl, cont, cl)) return MLA_ERR;
    *len = at;
    full[at] = '\0';
    size_t k = 0;
    for (size_t s = 0; s < *n_spans; s++) {
        if (spans[2 * s] >= at) break;
        spans[2 * k] = spans[2 * s];
        spans[2 * k + 1] = spans[2 * s + 1] < at ? spans[2 * s + 1] : at;
        k++;
    }
    *n_spans = k;
    return MLA_OK;
}

/* the last message's content (continue_final_message: a string, api_params checked) */
static const char *final_content(const cJSON *messages) {
    const cJSON *c =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(messages, cJSON_GetArraySize(messages) - 1), "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

static size_t guard_match(void *ud, const char *s, size_t len, size_t pos) {
    api_server *a = ud;
    return a->tok.control_at(a->tok.ctx, s, len, pos);
}

/* Chat messages -> prompt ids: the template rendered, the client's text in messages and vars
 * guarded (chat_guard.h) unless special_in_messages. *opens_reasoning: whether the output starts
 * inside the reasoning. close_reasoning (an output grammar, which holds from the first output token): a prompt that
 * opens the reasoning gets it closed, empty, so that the constrained output is the answer.
 * MLA_ERR with e set. */
static int chat_ids(api_server *a, const cJSON *messages, bool add_gen, const cJSON *vars, bool close_reasoning,
                    const char *cont, enum reasoning_prompt *prompt_reasoning, int32_t **ids, int32_t *n,
                    api_error *e) {
    *ids = NULL;
    *n = 0;
    bool guard = !a->cfg.special_in_messages && a->tok.control_at;
    chat_guard g;
    chat_guard_init(&g);
    cJSON *prot = NULL, *vprot = NULL;
    mla_err err = {{0}};
    if (guard && chat_guard_protect(&g, messages, vars, guard_match, a, &prot, &vprot, &err) != MLA_OK) {
        chat_guard_free(&g);
        return api_error_set(e, 400, "messages", NULL, "%s", err.msg);
    }
    if (cont) { /* the end of the text to go on from, marked */
        if (!prot) prot = cJSON_Duplicate(messages, 1);
        continue_mark(prot);
    }
    char *text = render_chat(a, prot ? prot : messages, add_gen, guard ? vprot : vars, e);
    cJSON_Delete(prot);
    cJSON_Delete(vprot);
    if (!text) {
        chat_guard_free(&g);
        return MLA_ERR;
    }
    char *full = text;
    size_t len = strlen(text), *spans = NULL, n_spans = 0;
    if (guard) {
        chat_guard_restore(&g, text, len, &full, &len, &spans, &n_spans);
        free(text);
    }
    chat_guard_free(&g);
    if (cont && continue_cut(full, &len, spans, &n_spans, cont)) {
        free(full);
        free(spans);
        return api_error_set(e, 400, "continue_final_message", NULL,
                             "'continue_final_message': the chat template does not render the last message's content "
                             "as given (it changes it), so the answer cannot go on from it");
    }
    /* a message continued from inside its reasoning leaves it open (no "<think>" at the prompt's end) */
    enum reasoning_prompt rp =
        cont && reasoning_text_open(cont, strlen(cont)) ? REASONING_PROMPT_OPEN : reasoning_prompt_state(full, len);
    if (rp == REASONING_PROMPT_OPEN && close_reasoning) {
        static const char shut[] = "\n" REASONING_CLOSE_TAG "\n\n"; /* an empty reasoning, as R1 writes one */
        full = mla_xrealloc(full, len + sizeof shut);
        memcpy(full + len, shut, sizeof shut);
        len += sizeof shut - 1;
        rp = REASONING_PROMPT_CLOSED;
    }
    if (prompt_reasoning) *prompt_reasoning = rp;
    int rc = a->tok.encode(a->tok.ctx, full, len, false, true, spans, n_spans, ids, n, &err);
    free(full);
    free(spans);
    if (rc != MLA_OK) {
        encode_error(e, &err);
        *ids = NULL;
        *n = 0;
        return MLA_ERR;
    }
    return MLA_OK;
}

/* the index of name (len bytes) among the served model's names, or -1 */
static int model_index(const api_server *a, const char *name, size_t len) {
    for (int i = 0; i < a->n_names; i++)
        if (strlen(a->names[i]) == len && !memcmp(a->names[i], name, len)) return i;
    return -1;
}

static bool model_named(const api_server *a, const char *name, size_t len) { return model_index(a, name, len) >= 0; }

/* name as the model's next name; what is wrong with it (empty, a blank at either end, said
 * before), or NULL */
static const char *model_name_add(api_server *a, const char *name) {
    const size_t n = strlen(name);
    if (!n) return "an empty one";
    if (isspace((unsigned char)name[0]) || isspace((unsigned char)name[n - 1])) return "one with a blank at an end";
    if (model_named(a, name, n)) return "one twice";
    a->names[a->n_names++] = name;
    return NULL;
}

/* the 404 model_not_found of a name (as shown) that is none of the model's: it says them */
static int model_unknown(const api_server *a, const char *shown, api_error *e) {
    char also[512] = "";
    for (int i = 1, o = 0; i < a->n_names && o < (int)sizeof also; i++)
        o += snprintf(also + o, sizeof also - (size_t)o, "%s'%s'", i > 1 ? ", " : ", also named ", a->names[i]);
    return api_error_set(e, 404, "model", "model_not_found",
                         "The model '%s' does not exist (this server serves '%s'%s)", shown, a->model_name, also);
}

/* 404 model_not_found when a request names a model (NULL: none) other than the served one */
static int model_check(const api_server *a, const char *model, api_error *e) {
    return model && !model_named(a, model, strlen(model)) ? model_unknown(a, model, e) : MLA_OK;
}

/* Why the server drains (api_server_set_draining). */
static const char *drain_why(const api_server *a) { return a->drain_why ? a->drain_why : "no reason given"; }

/* A new generation while the server drains: 503 shutting_down, naming why. MLA_ERR. */
static int refuse_draining(const api_server *a, api_error *e) {
    return api_error_set(e, 503, NULL, "shutting_down", "the server is shutting down (%s) and accepts no new requests",
                         drain_why(a));
}

/* The answer to a sched_submit / sched_room refusal rc: the queue full 429 (retry), stopping 503,
 * any other (the request itself) 400. */
static int submit_refused(int rc, const char *msg, api_error *e) {
    const int status = rc == SCHED_E_QUEUE_FULL ? 429 : rc == SCHED_E_STOPPED ? 503 : 400;
    return api_error_set(e, status, NULL, rc == SCHED_E_QUEUE_FULL ? "too_many_requests" : NULL, "%s", msg);
}

/* The checks before a generation's prompt is tokenized (loop thread). */
static int gen_precheck(api_server *a, const api_gen_params *p, api_error *e) {
    if (a->draining) return refuse_draining(a, e);
    if (!a->s) /* not yet serving: a client retrying on the code tells this from a failure */
        return api_error_set(e, 503, NULL, "model_loading",
                             "the model is loading and not served yet (GET /health: the workers' progress)");
    char why[512];
    if (!api_server_healthy(a, why, sizeof(why)))
        return api_error_set(e, 503, NULL, "worker_down", "the worker group is not available: %s",
                             why[0] ? why : "a worker is down");
    return model_check(a, p->model, e);
}

static bool uses_var(api_server *a, const char *name) {
    return a->tok.chat_uses_var && a->tok.chat_uses_var(a->tok.ctx, name);
}

/* The template variables a chat request sets: chat_template_kwargs, reasoning_effort, tools
 * (those of tool_choice: every tool but those of defer_loading true, the named one only, none for
 * "none"). Each must be read by the model's template, else the request is refused (400 naming
 * it). */
static int chat_vars(api_server *a, const api_gen_params *p, cJSON **out, api_error *e) {
    *out = NULL;
    cJSON *v = cJSON_CreateObject();
    const cJSON *it;
    cJSON_ArrayForEach(it, p->chat_template_kwargs) {
        if (!uses_var(a, it->string)) {
            cJSON_Delete(v);
            return api_error_set(e, 400, "chat_template_kwargs", NULL,
                                 "chat_template_kwargs.%.64s is not used by this model's chat template", it->string);
        }
        cJSON_AddItemToObject(v, it->string, cJSON_Duplicate(it, 1));
    }
    if (p->reasoning_effort) {
        if (!uses_var(a, "reasoning_effort")) {
            cJSON_Delete(v);
            return api_error_set(e, 400, "reasoning_effort", NULL,
                                 "'reasoning_effort' is not supported by this model: its chat template reads no effort "
                                 "parameter");
        }
        cJSON_AddStringToObject(v, "reasoning_effort", p->reasoning_effort);
    }
    if (p->tools && p->tool_choice != API_TOOLS_NONE) {
        if (a->cfg.tool_parser == TOOLCALL_NONE || !uses_var(a, "tools")) {
            cJSON_Delete(v);
            return api_error_set(e, 400, "tools", NULL, "%s",
                                 a->cfg.tool_parser == TOOLCALL_NONE
                                     ? "'tools' is not supported: the server runs no tool-call parser for this model (--tool-parser)"
                                     : "'tools' is not supported by this model's chat template (it does not render them; "
                                       "serve it with --chat-template FILE of a template that does)");
        }
        cJSON *tl = cJSON_AddArrayToObject(v, "tools");
        cJSON_ArrayForEach(it, p->tools) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(it, "function");
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (p->tool_choice == API_TOOLS_NAMED ? strcmp(nm->valuestring, p->tool_choice_name) != 0
                                                  : cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fn, "defer_loading")))
                continue;
            cJSON *t = cJSON_Duplicate(it, 1);
            cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "defer_loading");
            cJSON_AddItemToArray(tl, t);
        }
    }
    *out = v;
    return MLA_OK;
}

/* api_constrain_token_fn over the server's tokenizer: text as one (special) token */
static int32_t one_token(void *ud, const char *text) {
    api_server *a = ud;
    int32_t *ids = NULL, n = 0;
    mla_err err = {{0}};
    int32_t id = -1;
    if (a->tok.encode(a->tok.ctx, text, strlen(text), false, true, NULL, 0, &ids, &n, &err) == MLA_OK && n == 1)
        id = ids[0];
    free(ids);
    return id;
}

/* A chat request's tool calls held to the model's format where it asks for it (a strict tool, or
 * tool_choice required or named, or auto beside a JSON response_format, whose JSON the answer is
 * where it is no call): the grammar of api_constrain_tools as the request's. A 'grammar' beside
 * calls, or a JSON response_format beside calls that must come: 400. */
static int tool_grammar(api_server *a, api_gen_params *p, api_error *e) {
    if (!p->tools || p->tool_choice == API_TOOLS_NONE || a->cfg.tool_parser == TOOLCALL_NONE) return MLA_OK;
    bool strict = false;
    const cJSON *tl;
    cJSON_ArrayForEach(tl, p->tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tl, "function");
        if (p->tool_choice == API_TOOLS_NAMED &&
            strcmp(cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring, p->tool_choice_name))
            continue;
        strict |= cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fn, "strict"));
    }
    const bool required = p->tool_choice == API_TOOLS_REQUIRED || p->tool_choice == API_TOOLS_NAMED;
    const bool format = p->constrain.grammar && p->constrain.json_format;
    if (p->constrain.grammar && !format)
        return api_error_set(e, 400, "grammar", NULL,
                             "'grammar' cannot be combined with tools the model may call (tool_choice \"none\" "
                             "leaves them out of the output)");
    if (format && required)
        return api_error_set(e, 400, "tools", NULL,
                             "tool_choice required or a named function cannot be combined with a JSON "
                             "'response_format' (the answer is a call)");
    if (!strict && !required && !format) return MLA_OK;
    api_tool_grammar q = {.kind = (enum toolcall_kind)a->cfg.tool_parser, .tools = p->tools,
                          .only = p->tool_choice == API_TOOLS_NAMED ? p->tool_choice_name : NULL,
                          .required = required, .one_call = p->one_call,
                          /* Kimi-K2's call section ends its reasoning itself */
                          .close_reasoning = p->prompt_reasoning == REASONING_PROMPT_OPEN &&
                                             a->cfg.reasoning_parser != REASONING_NONE &&
                                             a->cfg.tool_parser != TOOLCALL_KIMI_K2,
                          .free_reasoning = p->prompt_reasoning == REASONING_PROMPT_FREE &&
                                            a->cfg.reasoning_parser != REASONING_NONE &&
                                            a->cfg.tool_parser != TOOLCALL_KIMI_K2,
                          .format = format, .format_schema = p->constrain.format_schema};
    /* the format held from the first token, as it is alone (the prompt's reasoning was closed) */
    if (format) q.close_reasoning = q.free_reasoning = false;
    char msg[600], *g = NULL;
    if (api_constrain_tools(&q, one_token, a, &g, msg, sizeof msg))
        return api_error_set(e, 400, "tools", NULL, "%s", msg);
    free(p->constrain.grammar);
    p->constrain.grammar = g;
    return MLA_OK;
}

/* The prompt's token ids: the chat template and tokenizer, or the ids given (moved out of p).
 * Touches only the tokenizer and p: runs on the prep thread. */
static int gen_prompt_ids(api_server *a, api_gen_params *p, int32_t **ids_out, int32_t *n_out, api_error *e) {
    int32_t *ids = NULL, n_ids = 0;
    mla_err err = {{0}};
    *ids_out = NULL;
    *n_out = 0;
    if (p->kind == API_CHAT) {
        cJSON *vars = NULL;
        if (chat_vars(a, p, &vars, e) != MLA_OK) return MLA_ERR;
        int rc = chat_ids(a, p->messages, p->add_generation_prompt, vars, p->constrain.grammar != NULL,
                          p->continue_final ? final_content(p->messages) : NULL, &p->prompt_reasoning, &ids, &n_ids,
                          e);
        cJSON_Delete(vars);
        /* after the prompt: the calls' grammar leaves the reasoning open (free until the calls) */
        if (rc == MLA_OK) rc = tool_grammar(a, p, e);
        if (rc != MLA_OK) {
            free(ids);
            return MLA_ERR;
        }
    } else if (p->prompt_text) {
        if (a->tok.encode(a->tok.ctx, p->prompt_text, strlen(p->prompt_text), true, true, NULL, 0, &ids, &n_ids,
                          &err) != MLA_OK) {
            encode_error(e, &err);
            return MLA_ERR;
        }
    } else {
        ids = p->prompt_ids;
        n_ids = p->n_prompt_ids;
        p->prompt_ids = NULL;
        p->n_prompt_ids = 0;
    }
    *ids_out = ids;
    *n_out = n_ids;
    return MLA_OK;
}

/* The ids of p's prompts after the first (completions given a list): each text tokenized as the
 * first one is, or the ids taken from p. *ids and *n are the caller's (n_more entries; NULL when
 * none) also on failure. */
static int more_prompt_ids(api_server *a, api_gen_params *p, int32_t ***ids, int32_t **n, api_error *e) {
    *ids = NULL;
    *n = NULL;
    if (p->n_more <= 0) return MLA_OK;
    *ids = mla_xcalloc((size_t)p->n_more, sizeof **ids);
    *n = mla_xcalloc((size_t)p->n_more, sizeof **n);
    for (int32_t i = 0; i < p->n_more; i++) {
        if (p->more_ids) {
            (*ids)[i] = p->more_ids[i];
            (*n)[i] = p->more_n_ids[i];
            p->more_ids[i] = NULL;
            continue;
        }
        mla_err err = {{0}};
        if (a->tok.encode(a->tok.ctx, p->more_text[i], strlen(p->more_text[i]), true, true, NULL, 0, &(*ids)[i],
                          &(*n)[i], &err) != MLA_OK) {
            return api_error_set(e, 400, "prompt", NULL, "cannot tokenize the prompt at index %d: %s", i + 1, err.msg);
        }
    }
    return MLA_OK;
}

static api_req *submit_generation(api_server *a, api_gen_params *p, const int32_t *ids, int32_t n_ids, http_conn *c,
                                  const api_sink *sink, api_req *pre, api_resp *rs, int index, api_error *e);

/* The generation path shared by the HTTP handler and api_server_generate: prompt -> ids,
 * checks, the request record, submission. Returns the request (linked, counted) or NULL with e
 * set. Moves p's stop strings into the request. */
static api_req *start_generation(api_server *a, api_gen_params *p, http_conn *c, const api_sink *sink,
                                 api_error *e) {
    int32_t *ids = NULL, n_ids = 0;
    if (gen_precheck(a, p, e) != MLA_OK || gen_prompt_ids(a, p, &ids, &n_ids, e) != MLA_OK) return NULL;
    api_req *r = submit_generation(a, p, ids, n_ids, c, sink, NULL, NULL, 0, e);
    free(ids);
    return r;
}

/* The tokens min_tokens bans (sched_sampling.ban_ids): p's stop ids and, unless it ignores them,
 * the model's end-of-generation tokens, each once. More than SCHED_MAX_BAN: 400. */
static int min_tokens_ban(const api_server *a, const api_gen_params *p, int32_t *ban, int32_t *n, api_error *e) {
    *n = 0;
    const int32_t n_eog = p->ignore_eos ? 0 : a->n_eog;
    for (int32_t i = 0; i < p->n_stop_ids + n_eog; i++) {
        const int32_t id = i < p->n_stop_ids ? p->stop_ids[i] : a->eog_ids[i - p->n_stop_ids];
        bool seen = false;
        for (int32_t k = 0; k < *n && !seen; k++) seen = ban[k] == id;
        if (seen) continue;
        if (*n == SCHED_MAX_BAN)
            return api_error_set(e, 400, "min_tokens", NULL,
                                 "'min_tokens' holds back the request's stop tokens (stop_token_ids and the model's "
                                 "%d end-of-generation tokens): at most %d of them",
                                 n_eog, SCHED_MAX_BAN);
        ban[(*n)++] = id;
    }
    return MLA_OK;
}

/* Checks the prompt ids against the vocabulary and the context, submits (loop thread). pre: the
 * request record to use (its srv and sink set; left to the caller on failure), or NULL for a new
 * one. rs: the HTTP response whose choice `index` this is (NULL for a sink's): choice k > 0 shares
 * choice 0's id and waits for its prompt (sched_request.after), and with a seed draws from a seed
 * of its own. */
static api_req *submit_generation(api_server *a, api_gen_params *p, const int32_t *ids, int32_t n_ids, http_conn *c,
                                  const api_sink *sink, api_req *pre, api_resp *rs, int index, api_error *e) {
    enum api_kind kind = p->kind;
    mla_err err = {{0}};
    api_req *r = NULL;
    /* truncate_prompt_tokens: the prompt's last tokens (the rest is dropped, as vLLM does) */
    const int32_t keep = p->truncate_prompt < 0 ? a->cfg.max_context - 1 : p->truncate_prompt;
    if (keep > 0 && n_ids > keep) {
        ids += n_ids - keep;
        n_ids = keep;
    }
    if (a->draining) {
        refuse_draining(a, e);
        goto done;
    }
    /* ids given as such, or text whose tokenizer holds more tokens than the model has rows (some
     * Kimi-K2 files): a step with one would fail every request in it */
    for (int32_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= a->tok.n_vocab) {
            if (kind != API_CHAT && !p->prompt_text)
                api_error_set(e, 400, "prompt", NULL, "token id %d is out of range (the vocabulary has %d tokens)",
                              ids[i], a->tok.n_vocab);
            else
                api_error_set(e, 400, kind == API_CHAT ? "messages" : "prompt", NULL,
                              "the text tokenizes to token id %d, which the model has no row for (its vocabulary has "
                              "%d tokens, its tokenizer more)",
                              ids[i], a->tok.n_vocab);
            goto done;
        }
    for (int32_t i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= a->tok.n_vocab) {
            api_error_set(e, 400, "stop_token_ids", NULL, "token id %d is out of range (the vocabulary has %d tokens)",
                          p->stop_ids[i], a->tok.n_vocab);
            goto done;
        }
    if (api_constrain_check_ids(&p->constrain, a->tok.n_vocab, a->tok.is_eog, a->tok.ctx, e)) goto done;
    /* min_tokens: the stop tokens (its stop ids; the end of generation unless ignore_eos) are banned
     * until then */
    int32_t ban[SCHED_MAX_BAN], n_ban = 0;
    if (p->min_tokens > 0 && min_tokens_ban(a, p, ban, &n_ban, e)) goto done;
    /* a top_k of the vocabulary or more keeps every token: off (as vLLM and llama.cpp take it) */
    if (p->sampling.top_k >= a->tok.n_vocab) p->sampling.top_k = 0;
    if (n_ids == 0) {
        api_error_set(e, 400, "prompt", NULL, "the prompt is empty (no tokens)");
        goto done;
    }
    if (n_ids >= a->cfg.max_context) {
        api_error_set(e, 400, kind == API_CHAT ? "messages" : "prompt", "context_length_exceeded",
                      "This model's maximum context length is %d tokens. However, your prompt has %d tokens "
                      "(no room for a completion).", a->cfg.max_context, n_ids);
        e->ctx_limit = a->cfg.max_context, e->ctx_prompt = n_ids;
        goto done;
    }
    int32_t max_tokens = p->max_tokens;
    /* echo with max_tokens 0: the scheduler makes one token (the prompt's last row), dropped */
    const bool echo_only = p->echo && kind == API_COMPLETIONS && max_tokens == 0;
    if (echo_only) max_tokens = 1;
    if (max_tokens > 0 && (int64_t)n_ids + max_tokens > a->cfg.max_context) {
        api_error_set(e, 400, p->max_tokens_param ? p->max_tokens_param : "max_tokens", "context_length_exceeded",
                      "This model's maximum context length is %d tokens. However, you requested %lld tokens "
                      "(%d in the prompt, %d for the completion).", a->cfg.max_context,
                      (long long)n_ids + max_tokens, n_ids, max_tokens);
        e->ctx_limit = a->cfg.max_context, e->ctx_prompt = n_ids, e->ctx_completion = max_tokens;
        goto done;
    }
    if (max_tokens <= 0) {
        max_tokens = a->cfg.max_context - n_ids;
        if (a->cfg.default_max_tokens > 0 && max_tokens > a->cfg.default_max_tokens) max_tokens = a->cfg.default_max_tokens;
    }
    if (p->min_tokens > max_tokens) { /* max_tokens absent: what the context (or --default-max-tokens) leaves */
        api_error_set(e, 400, "min_tokens", NULL, "'min_tokens' (%d) exceeds the %d tokens the answer may take",
                      p->min_tokens, max_tokens);
        goto done;
    }

    if (pre) {
        r = pre;
        r->preparing = false;
    } else {
        r = mla_xcalloc(1, sizeof(*r));
        r->srv = a;
        r->conn = c;
        if (sink) {
            r->sink = *sink;
            r->has_sink = true;
        }
    }
    r->kind = kind;
    r->stream = p->stream || sink;
    r->include_usage = p->include_usage;
    r->continuous_usage = p->continuous_usage;
    r->include_stop = p->include_stop_str;
    r->min_tokens = p->min_tokens;
    r->logprobs = p->logprobs;
    r->top_logprobs = p->top_logprobs;
    r->skip_special = p->skip_special_tokens;
    r->user = p->user ? mla_xstrdup(p->user) : NULL;
    bool with_tools = p->tools && p->tool_choice != API_TOOLS_NONE && a->cfg.tool_parser != TOOLCALL_NONE;
    if (kind == API_CHAT && !r->has_sink && (a->cfg.reasoning_parser != REASONING_NONE || with_tools)) {
        r->chat = mla_xcalloc(1, sizeof(*r->chat));
        /* the prompt closed the reasoning (thinking off): all of the output is content */
        r->chat->rk = p->prompt_reasoning == REASONING_PROMPT_CLOSED ? REASONING_NONE
                                                                      : (enum reasoning_kind)a->cfg.reasoning_parser;
        r->chat->think_open = p->prompt_reasoning == REASONING_PROMPT_OPEN;
        r->chat->hide_reasoning = !p->include_reasoning;
        r->chat->tk = with_tools ? (enum toolcall_kind)a->cfg.tool_parser : TOOLCALL_NONE;
        if (with_tools) r->chat->tools = cJSON_Duplicate(p->tools, 1);
        r->chat->one_call = p->one_call;
    }
    /* choice k of its prompt; the prompt's choice 0, whose prompt it waits for */
    const int k = rs ? index % rs->n_per : 0;
    const api_req *first = k > 0 ? rs->ch[index - k] : NULL;
    if (rs && index > 0) { /* one response: one id */
        r->created = rs->ch[0]->created;
        memcpy(r->id, rs->ch[0]->id, sizeof r->id);
    } else {
        r->created = (long long)time(NULL);
        a->counter++;
        snprintf(r->id, sizeof(r->id), "%s%llx%08llx",
                 rs && rs->rsp_opts.messages ? "msg_" : rs && rs->rsp_echo ? "resp_"
                                                  : kind == API_CHAT ? "chatcmpl-" : "cmpl-",
                 (unsigned long long)r->created, (unsigned long long)a->counter);
    }
    if (rs && rs->rsp_echo) {
        r->rsp = mla_xmalloc(sizeof *r->rsp);
        api_rsp_out_init(r->rsp, r->id, &rs->rsp_opts);
        api_rsp_out_tools(r->rsp, cJSON_GetObjectItemCaseSensitive(rs->rsp_echo, "tools"));
    }
    r->resp = rs;
    r->index = index;
    r->max_stop_len = 1;
    r->stop_hit = -1;
    for (int i = 0; i < p->n_stop; i++) {
        r->stop[r->n_stop++] = mla_xstrdup(p->stop[i]);
        size_t l = strlen(r->stop[i]);
        if (l > r->max_stop_len) r->max_stop_len = l;
    }
    r->n_prompt = n_ids;
    r->t_start = now_s();
    if (p->echo && kind == API_COMPLETIONS) {
        r->echo_ids = mla_xmalloc((size_t)n_ids * sizeof *r->echo_ids);
        memcpy(r->echo_ids, ids, (size_t)n_ids * sizeof *ids);
        r->n_echo = n_ids;
        r->echo_lp = p->logprobs;
        r->echo_only = echo_only;
    }

    sched_request sr = {0};
    sr.prompt = ids;
    sr.n_prompt = n_ids;
    sr.max_tokens = max_tokens;
    sr.stop_ids = p->stop_ids;
    sr.n_stop_ids = p->n_stop_ids;
    sr.ignore_eos = p->ignore_eos;
    sr.sampling = p->sampling;
    sr.sampling.grammar = p->constrain.grammar; /* copied by sched_submit */
    sr.sampling.bias_ids = p->constrain.bias_ids;
    sr.sampling.bias_vals = p->constrain.bias_vals;
    sr.sampling.n_bias = p->constrain.n_bias;
    sr.sampling.min_tokens = p->min_tokens;
    sr.sampling.ban_ids = ban;
    sr.sampling.n_ban = n_ban;
    sr.user = r;
    if (first) {
        sr.after = first->sched_id;
        /* the same seed would give every choice the same tokens: each its own, from the one given */
        if (sr.sampling.has_seed) sr.sampling.seed ^= (uint64_t)k * 0x9E3779B97F4A7C15ULL;
    }
    int rc = sched_submit(a->s, &sr, &r->sched_id, &err);
    if (rc != SCHED_E_OK) {
        for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
        r->n_stop = 0;
        free(r->user);
        r->user = NULL;
        free(r->echo_ids);
        r->echo_ids = NULL;
        if (r->chat) cJSON_Delete(r->chat->tools);
        free(r->chat);
        r->chat = NULL;
        if (r->rsp) api_rsp_out_free(r->rsp);
        free(r->rsp);
        r->rsp = NULL;
        if (!pre) free(r);
        r = NULL;
        /* a request the whole cache cannot hold is the client's to shorten: 400, as a too long prompt */
        submit_refused(rc, err.msg, e);
        goto done;
    }
    r->next = a->reqs;
    if (a->reqs) a->reqs->prev = r;
    a->reqs = r;
    a->n_inflight++;
    if (k == 0) a->m.prompt_tokens += (uint64_t)n_ids; /* the prompt of n choices counts once */
    if (rs) {
        rs->ch[index] = r;
        rs->n_live++;
        if (k == 0) rs->prompt_tokens += n_ids;
    }
done:
    return r;
}

/* ---- the prep thread ---- */

static void *prep_main(void *arg) {
    api_server *a = arg;
    pthread_mutex_lock(&a->prep_mu);
    for (;;) {
        while (!a->prep_quit && !a->prep_head) pthread_cond_wait(&a->prep_cv, &a->prep_mu);
        if (a->prep_quit) break;
        prep_job *j = a->prep_head;
        a->prep_head = j->next;
        if (!a->prep_head) a->prep_tail = NULL;
        j->next = NULL;
        pthread_mutex_unlock(&a->prep_mu);
        if (j->is_tokenize)
            j->rc = api_server_tokenize(a, j->tp.prompt, j->tp.messages, j->tp.add_special, j->tp.add_gen,
                                        j->tp.continue_final, &j->tp.chat, &j->ids, &j->n_ids, &j->e);
        else
            j->rc = gen_prompt_ids(a, &j->gp, &j->ids, &j->n_ids, &j->e) ||
                    more_prompt_ids(a, &j->gp, &j->more_ids, &j->more_n, &j->e);
        if (!j->is_tokenize && j->rc == MLA_OK && j->rsp_opts.messages && j->rsp_opts.diagnostics)
            j->fp = api_fp_make(j->root, j->n_ids); /* the whole conversation printed and hashed: off the loop */
        pthread_mutex_lock(&a->prep_mu);
        if (a->done_tail) a->done_tail->next = j;
        else a->done_head = j;
        a->done_tail = j;
        uv_async_send(&a->prep_async);
    }
    pthread_mutex_unlock(&a->prep_mu);
    return NULL;
}

static void prep_free(prep_job *j) {
    for (int32_t i = 0; j->more_ids && i < j->gp.n_more; i++) free(j->more_ids[i]);
    free(j->more_ids);
    free(j->more_n);
    free(j->req); /* a sink request never submitted (nothing of it is linked anywhere) */
    if (j->is_tokenize) api_tok_params_free(&j->tp);
    else api_gen_params_free(&j->gp);
    cJSON_Delete(j->root);
    cJSON_Delete(j->rsp_echo);
    api_fp_free(j->fp);
    free(j->ids);
    free(j);
}

static void on_prep_abort(void *ud) {
    prep_job *j = ud;
    j->conn = NULL; /* dropped when it comes back */
    if (!j->is_tokenize) j->srv->m.requests_cancelled++; /* a generation its client gave up */
}

static void prep_enqueue(api_server *a, prep_job *j) {
    if (!a->prep_started) {
        if (pthread_create(&a->prep_th, NULL, prep_main, a) != 0) MLA_PANIC("pthread_create failed");
        a->prep_started = true;
    }
    a->n_prep++;
    pthread_mutex_lock(&a->prep_mu);
    if (a->prep_tail) a->prep_tail->next = j;
    else a->prep_head = j;
    a->prep_tail = j;
    pthread_cond_signal(&a->prep_cv);
    pthread_mutex_unlock(&a->prep_mu);
}

static void prep_submit(api_server *a, prep_job *j) {
    http_conn_on_abort(j->conn, on_prep_abort, j);
    prep_enqueue(a, j);
}

static void generate_ready(api_server *a, prep_job *j);
static void tokenize_ready(api_server *a, prep_job *j);

/* A sink generation's prompt is ready: submit it, or tell the sink why not. */
static void sink_ready(api_server *a, prep_job *j) {
    api_req *r = j->req;
    api_sink sk = r->sink;
    if (r->prep_detached) return; /* prep_free frees r */
    if (r->prep_cancelled) {
        a->m.requests_cancelled++;
        sk.on_final(sk.ud, "", 0, 0, NULL, 0, NULL, a->cancel_reason ? a->cancel_reason : "the request was cancelled",
                    a->cancel_reason ? API_END_SHUTDOWN : API_END_CANCELLED, 0, 0);
        return;
    }
    api_error e = j->e;
    if (j->rc == MLA_OK && submit_generation(a, &j->gp, j->ids, j->n_ids, NULL, NULL, r, NULL, 0, &e)) {
        j->req = NULL; /* submitted: the request lives on */
        return;
    }
    sk.on_refused(sk.ud, &e);
}

static void on_prep_done(uv_async_t *h) {
    api_server *a = h->data;
    for (;;) {
        pthread_mutex_lock(&a->prep_mu);
        prep_job *j = a->done_head;
        if (j) {
            a->done_head = j->next;
            if (!a->done_head) a->done_tail = NULL;
        }
        pthread_mutex_unlock(&a->prep_mu);
        if (!j) break;
        a->n_prep--;
        if (j->tok_done) {
            if (!j->detached) j->tok_done(j->tok_ud, j->ids, j->n_ids, j->rc == MLA_OK ? NULL : &j->e);
        } else if (j->req) {
            sink_ready(a, j);
        } else if (j->conn) {
            http_conn_on_abort(j->conn, NULL, NULL);
            if (j->is_tokenize) tokenize_ready(a, j);
            else generate_ready(a, j);
        }
        prep_free(j);
    }
}

/* An error of the chat parser on a Responses or Messages request's translation, named as it names
 * its members */
static void item_error_names(const api_rsp_opts *o, api_error *e) {
    if (o->messages) api_msg_error_names(e);
    else api_rsp_error_names(e);
}

/* A generation's body (root: taken) parsed and sent to the prep thread, or answered with its
 * error. rsp_echo (taken) and rsp_opts: a Responses API request's, whose root is its chat
 * translation (NULL, NULL: another request's). */
static void generate_submit(api_server *a, http_conn *c, cJSON *root, enum api_kind kind, cJSON *rsp_echo,
                            const api_rsp_opts *rsp_opts) {
    prep_job *j = mla_xcalloc(1, sizeof(*j));
    j->srv = a;
    j->conn = c;
    j->root = root;
    j->rsp_echo = rsp_echo;
    if (rsp_opts) j->rsp_opts = *rsp_opts;
    const int rc = api_gen_params_parse(&j->gp, kind, root, &j->e);
    if (rc == MLA_OK && rsp_echo) j->gp.max_tokens_param = j->rsp_opts.messages ? "max_tokens" : "max_output_tokens";
    if (rc != MLA_OK || gen_precheck(a, &j->gp, &j->e) != MLA_OK) {
        if (rsp_echo) item_error_names(&j->rsp_opts, &j->e);
        reply_error(c, &j->e, NULL);
        prep_free(j);
        return;
    }
    prep_submit(a, j); /* tokenized on the prep thread; generate_ready goes on */
}

static void handle_generate(api_server *a, http_conn *c, const http_request *hr, enum api_kind kind) {
    cJSON *root = parse_body(c, hr);
    if (root) generate_submit(a, c, root, kind, NULL, NULL);
}

/* POST /v1/responses: the chat path under the Responses API's request and answer */
static void handle_responses(api_server *a, http_conn *c, const http_request *hr) {
    cJSON *body = parse_body(c, hr);
    if (!body) return;
    cJSON *chat, *echo;
    api_rsp_opts opts;
    api_error e = {0};
    const int rc = api_rsp_parse(body, &chat, &echo, &opts, &e);
    cJSON_Delete(body);
    if (rc != MLA_OK) reply_error(c, &e, NULL);
    else generate_submit(a, c, chat, API_CHAT, echo, &opts);
}

/* A Messages request's thinking enabled / disabled as the template's own switch (enable_thinking,
 * else thinking) in chat; a template without one thinks (the server runs a reasoning parser) or
 * does not, and the other is refused. */
static int msg_thinking(api_server *a, cJSON *chat, const api_rsp_opts *o, api_error *e) {
    if (!o->thinking) return MLA_OK;
    const bool on = o->thinking > 0;
    const char *var = uses_var(a, "enable_thinking") ? "enable_thinking" : uses_var(a, "thinking") ? "thinking" : NULL;
    if (var) {
        cJSON_AddBoolToObject(cJSON_AddObjectToObject(chat, "chat_template_kwargs"), var, on);
        return MLA_OK;
    }
    if (on == (a->cfg.reasoning_parser != REASONING_NONE)) return MLA_OK;
    return api_error_set(e, 400, "thinking", NULL,
                         "thinking %s: this model %s, and its chat template has no switch for it (enable_thinking or "
                         "thinking)", on ? "enabled" : "disabled", on ? "does not think" : "always thinks");
}

/* A Messages request's chat translation with its thinking switch, or NULL with its error answered;
 * counting: max_tokens may be absent (any budget then fits), and only what makes the prompt stays */
static cJSON *msg_request(api_server *a, http_conn *c, const http_request *hr, bool counting, api_rsp_opts *opts) {
    cJSON *body = parse_body(c, hr);
    if (!body) return NULL;
    if (counting && !cJSON_GetObjectItemCaseSensitive(body, "max_tokens"))
        cJSON_AddNumberToObject(body, "max_tokens", INT32_MAX);
    cJSON *chat;
    api_error e = {0};
    int rc = api_msg_parse(body, &chat, opts, &e);
    cJSON_Delete(body);
    if (rc == MLA_OK) rc = msg_thinking(a, chat, opts, &e);
    if (rc != MLA_OK) {
        cJSON_Delete(chat);
        reply_error(c, &e, NULL);
        return NULL;
    }
    static const char *const prompt[] = {"model",       "messages",           "tools",
                                         "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
                                         "reasoning_effort", "continue_final_message", NULL};
    for (cJSON *m = chat->child, *next; counting && m; m = next) { /* the sampling and the answer's go */
        next = m->next;
        if (!api_in_list(prompt, m->string)) cJSON_DeleteItemFromObjectCaseSensitive(chat, m->string);
    }
    return chat;
}

/* POST /v1/messages: the chat path under Anthropic's Messages request and answer */
static void handle_messages(api_server *a, http_conn *c, const http_request *hr) {
    api_rsp_opts opts;
    cJSON *chat = msg_request(a, c, hr, false, &opts);
    if (chat) generate_submit(a, c, chat, API_CHAT, cJSON_CreateObject(), &opts);
}

static void generate_ready(api_server *a, prep_job *j) {
    http_conn *c = j->conn;
    api_error e = j->e;
    if (j->rc != MLA_OK) {
        if (j->rsp_echo) item_error_names(&j->rsp_opts, &e);
        reply_error(c, &e, NULL);
        return;
    }
    const int n_per = j->gp.n > 1 ? j->gp.n : 1, n_all = n_per * (1 + j->gp.n_more);
    if (n_all > sched_max_batch_submit(a->s)) { /* a 429 would be retried forever */
        api_error_set(&e, 400, j->gp.n_more ? "prompt" : "n", NULL,
                      "%d choices: the server takes at most %d requests at once (--max-seqs and --max-queue)", n_all,
                      sched_max_batch_submit(a->s));
        reply_error(c, &e, NULL);
        return;
    }
    /* all or none: the queue's room for every choice first (a choice refused after others were
     * taken would leave those in the queue until the next step, where they count against
     * --max-queue for the requests behind) */
    mla_err qerr = {{0}};
    const int qrc = n_all > 1 && a->s ? sched_room(a->s, n_all, &qerr) : SCHED_E_OK;
    if (qrc != SCHED_E_OK) {
        submit_refused(qrc, qerr.msg, &e);
        reply_error(c, &e, NULL);
        return;
    }
    /* cache diagnostics: this prompt against the one its previous_message_id names (api_fprint.h) */
    if (j->fp && j->rsp_opts.diagnostics == 2) {
        const api_fp *prev = a->fps ? api_fp_store_get(a->fps, j->rsp_opts.prev_id) : NULL;
        j->rsp_opts.miss_reason = prev ? api_fp_change_name(api_fp_compare(prev, j->fp, &j->rsp_opts.miss_tokens))
                                       : "previous_message_not_found";
    }
    api_resp *rs = mla_xcalloc(1, sizeof *rs);
    rs->conn = c;
    rs->n_per = n_per;
    rs->n = n_all;
    rs->ch = mla_xcalloc((size_t)rs->n, sizeof *rs->ch);
    rs->ntok = mla_xcalloc((size_t)rs->n, sizeof *rs->ntok);
    rs->answers = mla_xcalloc((size_t)rs->n, sizeof *rs->answers);
    rs->rsp_echo = j->rsp_echo;
    rs->rsp_opts = j->rsp_opts;
    j->rsp_echo = NULL;
    for (int k = 0; k < rs->n; k++) {
        const int p = k / rs->n_per; /* prompt p's choices in a row, as vLLM orders them */
        const int32_t *ids = p ? j->more_ids[p - 1] : j->ids, n_ids = p ? j->more_n[p - 1] : j->n_ids;
        if (!submit_generation(a, &j->gp, ids, n_ids, c, NULL, NULL, rs, k, &e)) {
            /* all or nothing: the choices submitted go (their final events find no client) */
            if (j->gp.n_more > 0 && e.status == 400) /* which of the prompts */
                snprintf(e.message + strlen(e.message), sizeof e.message - strlen(e.message),
                         " (the prompt at index %d)", p);
            if (rs->rsp_echo) item_error_names(&rs->rsp_opts, &e);
            reply_error(c, &e, NULL);
            if (!rs->n_live) {
                resp_free(rs);
                return;
            }
            /* the choices taken go again, counted nowhere: the request was refused */
            for (int q = 0; q < k; q++) {
                api_req *t = rs->ch[q];
                if (!t) continue;
                t->taken_back = true;
                if (q % rs->n_per == 0) a->m.prompt_tokens -= (uint64_t)t->n_prompt;
            }
            resp_end(rs, NULL);
            return;
        }
    }
    api_req *r = rs->ch[0];
    if (j->fp) { /* kept under its id (the job gives it up) */
        if (!a->fps) a->fps = api_fp_store_new(API_FP_KEEP);
        api_fp_store_put(a->fps, r->id, j->fp);
        j->fp = NULL;
    }
    http_conn_on_abort(c, on_client_abort, rs);
    if (r->stream && r->rsp && r->rsp->opts.messages) { /* the message begun: no content yet */
        http_stream_begin(c, 200, "text/event-stream", "Cache-Control: no-cache\r\n");
        cJSON *ev = api_rsp_event(r->rsp, "message_start");
        const api_rsp_usage u = {.input = r->n_prompt};
        cJSON_AddItemToObject(ev, "message",
                              api_msg_object(NULL, r->id, a->model_name, NULL, NULL, &u, &r->rsp->opts));
        sse_event(c, "message_start", ev);
        cJSON_Delete(ev);
    } else if (r->stream && r->rsp) { /* the response begun: created, in progress */
        http_stream_begin(c, 200, "text/event-stream", "Cache-Control: no-cache\r\n");
        static const char *const begin[] = {"response.created", "response.in_progress"};
        for (int k = 0; k < 2; k++) {
            cJSON *ev = api_rsp_event(r->rsp, begin[k]);
            cJSON_AddItemToObject(ev, "response", api_rsp_object(r->rsp, rs->rsp_echo, a->model_name, r->created,
                                                                 "in_progress", NULL, NULL, NULL));
            sse_event(c, begin[k], ev);
            cJSON_Delete(ev);
        }
    } else if (r->stream) {
        http_stream_begin(c, 200, "text/event-stream", "Cache-Control: no-cache\r\n");
        for (int k = 0; j->gp.kind == API_CHAT && k < rs->n; k++) { /* each choice's role first */
            cJSON *ch0 = chunk_base(r);
            cJSON *choices = cJSON_AddArrayToObject(ch0, "choices");
            cJSON *ch = cJSON_CreateObject();
            cJSON_AddNumberToObject(ch, "index", k);
            cJSON *d = cJSON_AddObjectToObject(ch, "delta");
            cJSON_AddStringToObject(d, "role", "assistant");
            cJSON_AddStringToObject(d, "content", "");
            cJSON_AddNullToObject(ch, "logprobs");
            cJSON_AddNullToObject(ch, "finish_reason");
            cJSON_AddItemToArray(choices, ch);
            chunk_usage(r, ch0);
            sse_send(r, ch0);
            cJSON_Delete(ch0);
        }
    }
}

int api_server_tokenize(api_server *a, const char *text, const cJSON *messages, bool add_special, bool add_gen,
                        bool cont, const api_gen_params *chat, int32_t **ids, int32_t *n, api_error *e) {
    *ids = NULL;
    *n = 0;
    if (messages) {
        cJSON *vars = NULL;
        if (chat && chat_vars(a, chat, &vars, e) != MLA_OK) return MLA_ERR;
        const int rc =
            chat_ids(a, messages, add_gen, vars, false, cont ? final_content(messages) : NULL, NULL, ids, n, e);
        cJSON_Delete(vars);
        return rc;
    }
    if (!text) return api_error_set(e, 400, "prompt", NULL, "'prompt' (a string) or 'messages' is required");
    mla_err err = {{0}};
    int rc = a->tok.encode(a->tok.ctx, text, strlen(text), add_special, true, NULL, 0, ids, n, &err);
    if (rc != MLA_OK) {
        encode_error(e, &err);
        *ids = NULL;
        *n = 0;
        return MLA_ERR;
    }
    return MLA_OK;
}

/* A /tokenize body (root: taken) sent to the prep thread, or answered with its error; count_only:
 * a Messages count_tokens request's translation (its errors named as that API names them) */
static void tokenize_submit(api_server *a, http_conn *c, cJSON *root, bool count_only) {
    prep_job *j = mla_xcalloc(1, sizeof(*j));
    j->srv = a;
    j->conn = c;
    j->root = root;
    j->is_tokenize = true;
    j->count_only = count_only;
    if (api_tokenize_params_parse(&j->tp, root, &j->e) != MLA_OK || model_check(a, j->tp.model, &j->e)) {
        if (count_only) api_msg_error_names(&j->e);
        reply_error(c, &j->e, NULL);
        prep_free(j);
        return;
    }
    prep_submit(a, j); /* tokenized on the prep thread; tokenize_ready answers */
}

static void handle_tokenize(api_server *a, http_conn *c, const http_request *hr) {
    cJSON *root = parse_body(c, hr);
    if (root) tokenize_submit(a, c, root, false);
}

/* POST /v1/messages/count_tokens: a Messages request (max_tokens optional) as /tokenize counts
 * the chat it stands for: {"input_tokens": N} */
static void handle_count_tokens(api_server *a, http_conn *c, const http_request *hr) {
    api_rsp_opts opts;
    cJSON *chat = msg_request(a, c, hr, true, &opts);
    if (chat) tokenize_submit(a, c, chat, true);
}

static void tokenize_ready(api_server *a, prep_job *j) {
    http_conn *c = j->conn;
    if (j->rc != MLA_OK) {
        if (j->count_only) api_msg_error_names(&j->e);
        reply_error(c, &j->e, NULL);
        return;
    }
    if (j->count_only) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "input_tokens", j->n_ids);
        reply_json(c, 200, o);
        cJSON_Delete(o);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "tokens");
    for (int32_t i = 0; i < j->n_ids; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(j->ids[i]));
    cJSON_AddNumberToObject(o, "count", j->n_ids);
    if (api_server_max_context(a)) cJSON_AddNumberToObject(o, "max_model_len", api_server_max_context(a));
    reply_json(c, 200, o);
    cJSON_Delete(o);
}

static void handle_detokenize(api_server *a, http_conn *c, const http_request *hr) {
    cJSON *root = parse_body(c, hr);
    if (!root) return;
    api_tok_params p;
    api_error e;
    if (api_detokenize_params_parse(&p, root, &e) != MLA_OK || model_check(a, p.model, &e)) {
        reply_error(c, &e, NULL);
    } else {
        char *buf = NULL;
        size_t len = 0, cap = 0;
        bool bad_id = false;
        for (int32_t i = 0; i < p.n_tokens; i++) {
            size_t n = 0;
            const char *s = a->tok.piece(a->tok.ctx, p.tokens[i], &n);
            if (!s || p.tokens[i] >= a->tok.n_vocab) {
                api_error_set(&e, 400, "tokens", NULL, "token id %d is out of range (the vocabulary has %d tokens)",
                              p.tokens[i], a->tok.n_vocab);
                bad_id = true;
                break;
            }
            if (len + n + 1 > cap) {
                cap = (len + n + 1) * 2;
                buf = mla_xrealloc(buf, cap);
            }
            memcpy(buf + len, s, n);
            len += n;
        }
        if (bad_id) {
            reply_error(c, &e, NULL);
        } else {
            size_t n;
            char *txt = api_json_text(buf ? buf : "", len, &n);
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "prompt", txt);
            reply_json(c, 200, j);
            cJSON_Delete(j);
            free(txt);
        }
        free(buf);
    }
    api_tok_params_free(&p);
    cJSON_Delete(root);
}

/* the served model under one of its names as a model object of OpenAI's and of Anthropic's
 * models API at once (id; object, created, owned_by; type, display_name, created_at) */
static cJSON *model_object(const api_server *a, const char *name) {
    cJSON *m = cJSON_CreateObject();
    const time_t now = time(NULL);
    char at[32];
    struct tm tm;
    strftime(at, sizeof at, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    cJSON_AddStringToObject(m, "id", name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)now);
    cJSON_AddStringToObject(m, "owned_by", "mlaserve");
    cJSON_AddStringToObject(m, "type", "model");
    cJSON_AddStringToObject(m, "display_name", name);
    cJSON_AddStringToObject(m, "created_at", at);
    /* the context served is known once the workers have taken their cache pools (the scheduler
     * runs): a client that reads it during the load would get a limit the pool may not hold */
    if (api_server_max_context(a)) cJSON_AddNumberToObject(m, "max_model_len", api_server_max_context(a));
    return m;
}

#define API_MODELS_MAX_LIMIT 1000 /* Anthropic's largest page */

/* GET /v1/models: every name of the served model, OpenAI's list and a page of Anthropic's models
 * API at once. Anthropic's paging members of the query are read: limit (1-1000; without it every
 * name), after_id or before_id (a name: the page after it or before it); others are ignored, as
 * the SDKs send their own (beta=true). */
static void handle_models(api_server *a, http_conn *c, const char *query) {
    static const char *const members[] = {"limit", "after_id", "before_id"};
    char *v[3];
    size_t len[3];
    api_error e = {0};
    for (int m = 0; m < 3; m++) {
        v[m] = api_query_value(query, members[m], &len[m]);
        if (v[m] && strlen(v[m]) != len[m] && !e.status)
            api_error_set(&e, 400, members[m], "invalid_value", "%s holds a NUL byte (%%00)", members[m]);
    }
    const char *lim = v[0], *after = v[1], *before = v[2];
    long limit = a->n_names;
    if (!e.status && lim) {
        const bool digits = *lim && strspn(lim, "0123456789") == strlen(lim);
        limit = digits && strlen(lim) <= 4 ? strtol(lim, NULL, 10) : 0;
        if (limit < 1 || limit > API_MODELS_MAX_LIMIT) {
            size_t sn;
            char *s = api_utf8_sanitize(lim, strlen(lim) > 32 ? 32 : strlen(lim), &sn);
            api_error_set(&e, 400, "limit", "invalid_value", "limit must be an integer from 1 to %d, not '%s'",
                          API_MODELS_MAX_LIMIT, s);
            free(s);
        }
    }
    if (!e.status && after && before)
        api_error_set(&e, 400, "before_id", "invalid_value", "after_id and before_id: one of them at most");
    int lo = 0, hi = a->n_names; /* the page: names [lo, hi) */
    if (!e.status && (after || before)) {
        const char *id = after ? after : before;
        const int k = model_index(a, id, strlen(id));
        if (k < 0) {
            size_t sn;
            char *s = api_utf8_sanitize(id, strlen(id) > 200 ? 200 : strlen(id), &sn);
            api_error_set(&e, 400, after ? "after_id" : "before_id", "invalid_value",
                          "%s '%s' is not one of the served model's names", after ? "after_id" : "before_id", s);
            free(s);
        } else if (after) {
            lo = k + 1;
            hi = lo + limit < a->n_names ? lo + (int)limit : a->n_names;
        } else {
            hi = k;
            lo = hi - limit > 0 ? hi - (int)limit : 0;
        }
    } else if (!e.status) {
        hi = limit < a->n_names ? (int)limit : a->n_names;
    }
    if (e.status) {
        reply_error(c, &e, NULL);
    } else {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "object", "list");
        cJSON *data = cJSON_AddArrayToObject(j, "data");
        for (int i = lo; i < hi; i++) cJSON_AddItemToArray(data, model_object(a, a->names[i]));
        /* Anthropic's page members: more in the direction paged, and the page's ends */
        cJSON_AddBoolToObject(j, "has_more", before ? lo > 0 : hi < a->n_names);
        if (lo < hi) {
            cJSON_AddStringToObject(j, "first_id", a->names[lo]);
            cJSON_AddStringToObject(j, "last_id", a->names[hi - 1]);
        } else {
            cJSON_AddNullToObject(j, "first_id");
            cJSON_AddNullToObject(j, "last_id");
        }
        reply_json(c, 200, j);
        cJSON_Delete(j);
    }
    for (int m = 0; m < 3; m++) free(v[m]);
}

/* GET /v1/models/{id} (the SDKs' models.retrieve): the model object when id (percent-decoded)
 * is one of the served model's names, else 404 model_not_found */
static void handle_model(api_server *a, http_conn *c, const char *id) {
    size_t n = strlen(id), k;
    while (n > 0 && id[n - 1] == '/') n--; /* a trailing slash, as on the other routes */
    char *d = api_pct_decode(id, n, &k);
    if (model_named(a, d, k)) {
        cJSON *m = model_object(a, d);
        reply_json(c, 200, m);
        cJSON_Delete(m);
    } else {
        api_error e;
        size_t sn;
        char *s = api_utf8_sanitize(d, k > 200 ? 200 : k, &sn);
        model_unknown(a, s, &e);
        free(s);
        reply_error(c, &e, NULL);
    }
    free(d);
}

bool api_server_healthy(api_server *a, char *why, size_t cap) {
    why[0] = 0;
    if (a->draining) {
        snprintf(why, cap, "draining: the server is shutting down (%s)", drain_why(a));
        return false;
    }
    if (!a->s) { /* no scheduler yet: the workers have not reported their cache pools */
        snprintf(why, cap, "the workers are loading");
        return false;
    }
    if (!a->cfg.health) return true;
    return a->cfg.health(a->cfg.health_ctx, why, cap);
}

static void handle_health(api_server *a, http_conn *c) {
    char why[512];
    cJSON *loading = NULL;
    /* loading: until the scheduler is made (the pools are in a little after the last rank loaded) */
    if (!a->draining && !a->s && a->cfg.loading && a->cfg.loading(a->cfg.health_ctx, &loading)) {
        reply_json(c, 503, loading); /* the workers are loading: their progress */
        cJSON_Delete(loading);
    } else if (a->draining) {
        api_error e;
        api_error_set(&e, 503, NULL, "shutting_down", "draining: the server is shutting down (%s)", drain_why(a));
        reply_error(c, &e, NULL);
    } else if (api_server_healthy(a, why, sizeof(why))) {
        http_respond(c, 200, "application/json", "{\"status\":\"ok\"}", 15, NULL);
    } else {
        api_error e;
        api_error_set(&e, 503, NULL, "worker_down", "unhealthy: %s", why[0] ? why : "a worker is down");
        reply_error(c, &e, NULL);
    }
}

static void handle_metrics(api_server *a, http_conn *c) {
    api_gauges g = {0};
    if (a->s) {
        sched_stats st;
        sched_get_stats(a->s, &st);
        g.waiting = st.waiting;
        g.running = st.running;
        g.blocks_used = st.blocks_used;
        g.blocks_total = st.blocks_total;
        g.block_size = st.block_size;
        g.preemptions = (int64_t)st.preemptions;
        g.steps = (int64_t)st.steps;
        g.blocks_cached = st.blocks_cached;
        g.prefix_queries = (int64_t)st.prefix_queries;
        g.prefix_hits = (int64_t)st.prefix_hits;
    }
    g.rank_blocks = a->rank_blocks;
    g.n_ranks = a->n_ranks;
    g.block_bytes = (int64_t)a->block_bytes;
    g.connections = a->http ? http_server_n_conns(a->http) : 0;
    if (a->http) http_server_responses(a->http, g.http_by_class);
    g.tp = a->cfg.tp;
    g.max_context = api_server_max_context(a);
    coord_worker_info workers[WIRE_MAX_WORLD];
    if (a->cfg.workers) {
        g.n_workers = a->cfg.workers(a->cfg.health_ctx, workers, WIRE_MAX_WORLD);
        g.workers = workers;
    }
    char why[256];
    g.healthy = api_server_healthy(a, why, sizeof(why)) ? 1 : 0;
    g.restarts = a->cfg.restarts ? a->cfg.restarts(a->cfg.health_ctx) : -1;
    size_t n;
    char *s = api_metrics_render(&a->m, &g, a->model_name, &n);
    http_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", s, n, NULL);
    free(s);
}

void api_server_token_counts(const api_server *a, uint64_t *prompt, uint64_t *generated) {
    *prompt = a->m.prompt_tokens;
    *generated = a->m.generation_tokens;
}

bool api_server_auth_required(const api_server *a) { return a->api_key && a->api_key[0]; }

static uint64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* "1.2.3.4:5678" / "::1:5678" -> the address without the port */
static void addr_of(const char *peer, char *out, size_t cap) {
    snprintf(out, cap, "%s", peer ? peer : "?");
    char *colon = strrchr(out, ':');
    if (colon && colon != out) *colon = 0;
}

int api_server_auth(api_server *a, const char *peer, const char *key, int *retry_after_s) {
    if (retry_after_s) *retry_after_s = 0;
    if (!api_server_auth_required(a)) return 0;
    char addr[64];
    addr_of(peer, addr, sizeof addr);
    uint64_t now = mono_ms(), win = (uint64_t)API_AUTH_WINDOW_S * 1000u;
    struct auth_fail *slot = NULL, *oldest = NULL;
    for (int i = 0; i < API_AUTH_SLOTS; i++) {
        struct auth_fail *f = &a->fails[i];
        if (f->n && now - f->since_ms >= win) f->n = 0; /* the window is over */
        if (f->n && !strcmp(f->addr, addr)) slot = f;
        /* a free slot first, else the one whose window started earliest */
        if (!oldest || (oldest->n && (!f->n || f->since_ms < oldest->since_ms))) oldest = f;
    }
    const int max_fails = a->cfg.auth_max_fails ? a->cfg.auth_max_fails : API_AUTH_MAX_FAILS; /* < 0: never */
    if (max_fails > 0 && slot && slot->n >= max_fails) {
        if (retry_after_s) *retry_after_s = (int)((slot->since_ms + win - now + 999) / 1000);
        return 429;
    }
    if (api_server_key_ok(a, key)) return 0;
    /* no key at all is a client that was not told the key (a probe, a health checker, a proxy's
     * clients), not a guess: a 401, not counted towards the address's lockout */
    if (!key) return 401;
    if (!slot) {
        slot = oldest;
        snprintf(slot->addr, sizeof slot->addr, "%s", addr);
        slot->n = 0;
        slot->since_ms = now;
    }
    if (slot->n++ == 0) slot->since_ms = now;
    return 401;
}

/* The bearer key of an Authorization header, or NULL. */
static const char *bearer_key(const char *h) {
    if (!h || strncasecmp(h, "Bearer ", 7)) return NULL;
    h += 7;
    while (*h == ' ') h++;
    return h;
}

/* Checks the request's key; false when it answered (401, or 429 after too many failures from
 * this address); either way the connection closes after the answer. */
static bool authorize(api_server *a, http_conn *c, const char *authorization) {
    int retry = 0;
    int st = api_server_auth(a, http_conn_peer(c), bearer_key(authorization), &retry);
    if (st == 0) return true;
    http_conn_close_after(c);
    api_error e;
    if (st == 429) {
        api_error_set(&e, 429, NULL, "too_many_auth_failures",
                      "too many requests with a wrong API key from this address; retry in %d s", retry);
        char extra[48];
        snprintf(extra, sizeof extra, "Retry-After: %d\r\n", retry);
        reply_error(c, &e, extra);
    } else {
        api_error_set(&e, 401, NULL, "invalid_api_key",
                      "missing or wrong API key (send 'Authorization: Bearer <key>' or 'x-api-key: <key>')");
        reply_error(c, &e, "WWW-Authenticate: Bearer\r\n");
    }
    return false;
}

bool api_server_key_ok(const api_server *a, const char *h) {
    if (!a->api_key || !a->api_key[0]) return true;
    if (!h) return false;
    /* constant-time comparison */
    size_t la = strlen(a->api_key), lh = strlen(h);
    unsigned char diff = (unsigned char)(la != lh);
    for (size_t i = 0; i < la; i++) diff |= (unsigned char)(a->api_key[i] ^ (i < lh ? h[i] : 0));
    return diff == 0;
}

typedef struct route {
    const char *path;
    int method; /* enum http_method */
    bool auth;
    bool anthropic; /* Anthropic's API: its error form (http_server.h) */
} route;

static const route routes[] = {
    {"/v1/completions", HTTP_POST, true, false},
    {"/v1/chat/completions", HTTP_POST, true, false},
    {"/v1/responses", HTTP_POST, true, false},
    {"/v1/messages", HTTP_POST, true, true},
    {"/v1/messages/count_tokens", HTTP_POST, true, true},
    {"/v1/models", HTTP_GET, true, false},
    {"/v1/models/", HTTP_GET, true, false}, /* a prefix: /v1/models/{id} */
    {"/health", HTTP_GET, false, false},
    {"/metrics", HTTP_GET, false, false},
    {"/tokenize", HTTP_POST, true, false},
    {"/detokenize", HTTP_POST, true, false},
};

static const route *find_route(const char *path, size_t plen) {
    const route *rt = NULL;
    while (plen > 1 && path[plen - 1] == '/') plen--; /* tolerate a trailing slash */
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        const size_t rl = strlen(routes[i].path);
        if (routes[i].path[rl - 1] == '/') { /* a prefix route: something after it */
            if (plen > rl && !strncmp(routes[i].path, path, rl)) rt = &routes[i];
        } else if (rl == plen && !strncmp(routes[i].path, path, plen)) {
            rt = &routes[i];
        }
    }
    return rt;
}

static bool method_ok(const route *rt, int method_id) {
    return method_id == rt->method || (rt->method == HTTP_GET && method_id == HTTP_HEAD);
}

enum http_error_form api_server_error_form(void *ud, const char *url) {
    (void)ud;
    size_t n;
    const char *p = http_url_path(url, &n);
    const route *rt = p ? find_route(p, n) : NULL;
    return rt && rt->anthropic ? HTTP_ERRORS_ANTHROPIC : HTTP_ERRORS_OPENAI;
}

bool api_server_early(void *ud, http_conn *c, const http_head *h) {
    api_server *a = ud;
    if (!api_server_auth_required(a)) return true;
    size_t plen;
    const char *u = http_url_path(h->url, &plen);
    const route *rt = u ? find_route(u, plen) : NULL;
    if (!rt || !rt->auth || !method_ok(rt, h->method_id)) return true; /* 404 / 405 / no key needed */
    return authorize(a, c, h->authorization);
}

void api_server_handle(void *ud, http_conn *c, const http_request *req) {
    api_server *a = ud;
    const route *rt = find_route(req->path, strlen(req->path));
    if (!rt) {
        api_error e;
        size_t n;
        char *p = api_utf8_sanitize(req->path, strlen(req->path) > 200 ? 200 : strlen(req->path), &n);
        api_error_set(&e, 404, NULL, "not_found", "no route %s %s", req->method, p);
        free(p);
        reply_error(c, &e, NULL);
        return;
    }
    if (!method_ok(rt, req->method_id)) {
        api_error e;
        api_error_set(&e, 405, NULL, "method_not_allowed", "%s is not allowed on %s (use %s)", req->method,
                      rt->path, rt->method == HTTP_GET ? "GET or HEAD" : "POST");
        char allow[32];
        snprintf(allow, sizeof(allow), "Allow: %s\r\n", rt->method == HTTP_GET ? "GET, HEAD" : "POST");
        reply_error(c, &e, allow);
        return;
    }
    if (rt->auth && !authorize(a, c, req->authorization)) return;
    if (!strcmp(rt->path, "/v1/completions")) handle_generate(a, c, req, API_COMPLETIONS);
    else if (!strcmp(rt->path, "/v1/chat/completions")) handle_generate(a, c, req, API_CHAT);
    else if (!strcmp(rt->path, "/v1/responses")) handle_responses(a, c, req);
    else if (!strcmp(rt->path, "/v1/messages")) handle_messages(a, c, req);
    else if (!strcmp(rt->path, "/v1/messages/count_tokens")) handle_count_tokens(a, c, req);
    else if (!strcmp(rt->path, "/v1/models")) handle_models(a, c, req->query);
    else if (!strcmp(rt->path, "/v1/models/")) handle_model(a, c, req->path + strlen(rt->path));
    else if (!strcmp(rt->path, "/health")) handle_health(a, c);
    else if (!strcmp(rt->path, "/metrics")) handle_metrics(a, c);
    else if (!strcmp(rt->path, "/tokenize")) handle_tokenize(a, c, req);
    else handle_detokenize(a, c, req);
}

/* ---- lifetime ---- */

int api_server_new(api_server **out, uv_loop_t *loop, const api_config *cfg,
                   const api_tokenizer *tok, mla_err *err) {
    *out = NULL;
    if (!tok || !tok->encode || !tok->piece) return mla_errf(err, "api: the tokenizer needs encode and piece");
    if (tok->render_chat && !tok->control_at && !cfg->special_in_messages)
        return mla_errf(err, "api: the tokenizer needs control_at to keep message text from control tokens");
    if (cfg->max_context <= 1) return mla_errf(err, "api: max_context must be > 1 (got %d)", cfg->max_context);
    api_server *a = mla_xcalloc(1, sizeof(*a));
    a->loop = loop;
    a->cfg = *cfg;
    /* the names: model_name, then the aliases (their commas NULs) */
    a->model_name = mla_xstrdup(cfg->model_name ? cfg->model_name : "model");
    const char *al = cfg->model_aliases;
    a->names_buf = al ? mla_xstrdup(al) : NULL;
    a->names = mla_xcalloc(al ? strlen(al) / 2 + 2 : 1, sizeof *a->names);
    const char *why = model_name_add(a, a->model_name);
    for (char *p = a->names_buf; !why && p;) { /* an alias a turn */
        char *q = strchr(p, ',');
        if (q) *q++ = 0;
        why = model_name_add(a, p);
        p = q;
    }
    if (why) {
        mla_errf(err, "api: the model's names '%s%s%s' hold %s", a->model_name, al ? "," : "", al ? al : "", why);
        free(a->names);
        free(a->names_buf);
        free(a->model_name);
        free(a);
        return MLA_ERR;
    }
    a->api_key = cfg->api_key && cfg->api_key[0] ? mla_xstrdup(cfg->api_key) : NULL;
    a->cfg.model_name = a->model_name;
    a->cfg.model_aliases = NULL;
    a->cfg.api_key = a->api_key;
    a->tok = *tok;
    for (int32_t id = 0, cap = 0; tok->is_eog && id < tok->n_vocab; id++)
        if (tok->is_eog(tok->ctx, id)) {
            if (a->n_eog == cap) a->eog_ids = mla_xrealloc(a->eog_ids, (size_t)(cap = 2 * cap + 4) * sizeof(int32_t));
            a->eog_ids[a->n_eog++] = id;
        }
    pthread_mutex_init(&a->mu, NULL);
    api_metrics_init(&a->m);
    int rc = uv_async_init(loop, &a->async, on_async);
    if (rc < 0) {
        free(a->eog_ids);
        free(a->model_name);
        free(a->names);
        free(a->names_buf);
        free(a->api_key);
        free(a);
        return mla_errf(err, "api: uv_async_init: %s", uv_strerror(rc));
    }
    a->async.data = a;
    a->async_open = true;
    pthread_mutex_init(&a->prep_mu, NULL);
    pthread_cond_init(&a->prep_cv, NULL);
    rc = uv_async_init(loop, &a->prep_async, on_prep_done);
    if (rc < 0) MLA_PANIC("api: uv_async_init: %s", uv_strerror(rc));
    a->prep_async.data = a;
    a->prep_async_open = true;
    *out = a;
    return MLA_OK;
}

void api_server_set_sched(api_server *a, sched *s) { a->s = s; }
void api_server_set_capacity(api_server *a, int32_t max_context, const uint32_t *rank_blocks, int n_ranks,
                             uint64_t block_bytes) {
    a->cfg.max_context = max_context;
    a->rank_blocks = rank_blocks;
    a->n_ranks = n_ranks;
    a->block_bytes = block_bytes;
}
void api_server_set_http(api_server *a, http_server *h) { a->http = h; }
int api_server_inflight(const api_server *a) { return a->n_inflight + a->n_prep; }
int api_server_preparing(const api_server *a) { return a->n_prep; }

void api_server_set_draining(api_server *a, const char *why) {
    char *w = strdup(why && why[0] ? why : "no reason given");
    if (w) { /* else (out of memory) the drain goes on, said without its reason */
        free(a->drain_why);
        a->drain_why = w;
    }
    a->draining = true;
}

void api_server_cancel_all(api_server *a, const char *reason) {
    a->cancel_reason = reason;
    for (api_req *r = a->reqs; r; r = r->next) sched_cancel(a->s, r->sched_id);
}

void api_server_drain(api_server *a) {
    while (a->n_inflight > 0 || a->n_prep > 0) {
        on_prep_done(&a->prep_async);
        on_async(&a->async);
        if (a->n_inflight > 0 || a->n_prep > 0) uv_run(a->loop, UV_RUN_ONCE);
    }
}

static void on_async_closed(uv_handle_t *h) { (void)h; }

void api_server_free(api_server *a) {
    if (!a) return;
    /* the prep thread: stopped; jobs not run or not collected are dropped */
    if (a->prep_started) {
        pthread_mutex_lock(&a->prep_mu);
        a->prep_quit = true;
        pthread_cond_signal(&a->prep_cv);
        pthread_mutex_unlock(&a->prep_mu);
        pthread_join(a->prep_th, NULL);
    }
    for (prep_job *lists[2] = {a->prep_head, a->done_head}, **l = lists; l < lists + 2; l++)
        while (*l) {
            prep_job *j = *l;
            *l = j->next;
            prep_free(j);
        }
    if (a->prep_async_open) uv_close((uv_handle_t *)&a->prep_async, on_async_closed);
    pthread_mutex_destroy(&a->prep_mu);
    pthread_cond_destroy(&a->prep_cv);
    /* the scheduler is stopped: queued events are dropped, requests freed */
    for (int i = 0; i < a->nq; i++) {
        free(a->q[i].error);
        free(a->q[i].plp);
    }
    free(a->q);
    free(a->adm);
    while (a->reqs) req_free(a->reqs);
    if (a->async_open) {
        uv_close((uv_handle_t *)&a->async, on_async_closed);
        uv_run(a->loop, UV_RUN_NOWAIT);
    }
    api_metrics_free(&a->m);
    pthread_mutex_destroy(&a->mu);
    api_fp_store_free(a->fps);
    free(a->eog_ids);
    free(a->model_name);
    free(a->names);
    free(a->names_buf);
    free(a->api_key);
    free(a->drain_why);
    free(a);
}

const char *api_server_model_name(const api_server *a) { return a->model_name; }
int api_server_model_names(const api_server *a, const char *const **names) {
    *names = a->names;
    return a->n_names;
}
int32_t api_server_max_context(const api_server *a) { return a->s ? a->cfg.max_context : 0; }

api_gen *api_server_generate(api_server *a, api_gen_params *p, const api_sink *sink, api_error *e) {
    MLA_ASSERT(sink && sink->on_delta && sink->on_final);
    MLA_ASSERT(!p->tools && !p->chat_template_kwargs && !p->reasoning_effort);
    if (!sink->on_refused) return start_generation(a, p, NULL, sink, e);
    if (gen_precheck(a, p, e) != MLA_OK) return NULL;
    /* the prompt is made on the prep thread; the job takes p's contents */
    prep_job *j = mla_xcalloc(1, sizeof(*j));
    j->srv = a;
    j->gp = *p;
    memset(p, 0, sizeof(*p));
    p->kind = j->gp.kind;
    if (j->gp.messages) {
        j->root = cJSON_Duplicate(j->gp.messages, 1); /* the caller's document goes away */
        if (!j->root) MLA_PANIC("out of memory");
        j->gp.messages = j->root;
    }
    api_req *r = mla_xcalloc(1, sizeof(*r));
    r->srv = a;
    r->sink = *sink;
    r->has_sink = true;
    r->preparing = true;
    j->req = r;
    prep_enqueue(a, j);
    return r;
}

api_tok_job *api_server_tokenize_async(api_server *a, const char *text, const cJSON *messages, bool add_special,
                                       void (*done)(void *ud, const int32_t *ids, int32_t n, const api_error *e),
                                       void *ud) {
    prep_job *j = mla_xcalloc(1, sizeof(*j));
    j->srv = a;
    j->is_tokenize = true;
    j->tp.prompt = text ? mla_xstrdup(text) : NULL;
    if (messages) {
        j->root = cJSON_Duplicate(messages, 1);
        if (!j->root) MLA_PANIC("out of memory");
        j->tp.messages = j->root;
    }
    j->tp.add_special = add_special;
    j->tp.add_gen = true;
    j->tok_done = done;
    j->tok_ud = ud;
    prep_enqueue(a, j);
    return j;
}

void api_server_tokenize_detach(api_tok_job *j) { j->detached = true; }

void api_server_gen_cancel(api_gen *g, bool detach) {
    if (!g) return;
    if (g->preparing) {
        if (detach) g->prep_detached = true;
        else g->prep_cancelled = true;
        return;
    }
    if (detach) {
        g->has_sink = false;
        g->responded = true;
    }
    sched_cancel(g->srv->s, g->sched_id);
}
