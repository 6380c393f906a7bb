/* cmd_serve: tokenizer + chat template + coordinator (workers) + scheduler + HTTP. See
 * cmd_serve.h. The scheduler's backend here turns each step plan into a wire_step_plan for
 * coord_step (the workers keep their own per-sequence cache, addressed by sequence id and
 * positions; the scheduler's block accounting bounds how much of it is in use). */
#include "coordinator/cmd_serve.h"

#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "common/gguf.h"
#include "common/mla_err.h"
#include "common/mla_log.h"
#include "coordinator/api_server.h"
#include "coordinator/chat.h"
#include "coordinator/coord.h"
#include "coordinator/http_server.h"
#include "coordinator/pbapi_server.h"
#include "coordinator/sched_batch.h"
#include "coordinator/tok.h"

typedef struct serve_ctx {
    tok_vocab *vocab;
    chat_tmpl *tmpl;
    char *prefix; /* what every plain prompt starts with (BOS, "[gMASK]<sop>") */
    coord *c;
    uint64_t step_id;
    uint64_t seed_base;
    wire_seq *wseqs;
    int cap_wseqs;
    int32_t *pos;
    size_t cap_pos;
} serve_ctx;

/* ---- tokenizer adapter ---- */

static int st_encode(void *ctx, const char *text, size_t len, bool add_special, bool parse_special,
                     const size_t *plain, size_t n_plain, int32_t **ids, int32_t *n, mla_err *err) {
    serve_ctx *s = ctx;
    tok_ids out = {0};
    int rc = MLA_OK;
    if (add_special && s->prefix && s->prefix[0])
        rc = tok_encode(s->vocab, s->prefix, strlen(s->prefix), false, true, &out, err);
    else if (add_special && !s->prefix)
        rc = MLA_OK; /* no template prefix: tok_encode's own add_special below */
    if (rc == MLA_OK)
        rc = tok_encode_spans(s->vocab, text, len, add_special && !s->prefix, parse_special, plain, n_plain, &out, err);
    if (rc != MLA_OK) {
        tok_ids_free(&out);
        return rc;
    }
    *ids = out.ids; /* ownership moves to the caller (malloc'd) */
    *n = (int32_t)out.n;
    return MLA_OK;
}

static size_t st_control_at(void *ctx, const char *text, size_t len, size_t pos) {
    serve_ctx *s = ctx;
    return tok_control_at(s->vocab, text, len, pos);
}

static const char *st_piece(void *ctx, int32_t id, size_t *len) {
    serve_ctx *s = ctx;
    return tok_token_piece(s->vocab, id, len);
}
static bool st_special(void *ctx, int32_t id) {
    serve_ctx *s = ctx;
    return tok_token_type(s->vocab, id) == TOK_TYPE_CONTROL;
}
static bool st_eog(void *ctx, int32_t id) {
    serve_ctx *s = ctx;
    return tok_is_eog(s->vocab, id);
}
static int st_chat(void *ctx, const cJSON *messages, bool add_gen, char **out, mla_err *err) {
    serve_ctx *s = ctx;
    size_t len = 0;
    const char *used = NULL;
    return chat_tmpl_apply_json(s->tmpl, messages, add_gen, NULL, out, &len, &used, err);
}

/* ---- scheduler backend over the coordinator ---- */

static int cb_run(void *ctx, const sched_plan *plan, sched_result *results, mla_err *err) {
    serve_ctx *s = ctx;
    if (plan->n_seqs > s->cap_wseqs) {
        s->cap_wseqs = plan->n_seqs * 2;
        s->wseqs = mla_xrealloc(s->wseqs, (size_t)s->cap_wseqs * sizeof(*s->wseqs));
    }
    if ((size_t)plan->n_tokens > s->cap_pos) {
        s->cap_pos = (size_t)plan->n_tokens * 2;
        s->pos = mla_xrealloc(s->pos, s->cap_pos * sizeof(int32_t));
    }
    size_t off = 0;
    for (int i = 0; i < plan->n_seqs; i++) {
        const sched_plan_seq *p = &plan->seqs[i];
        wire_seq *w = &s->wseqs[i];
        memset(w, 0, sizeof(*w));
        w->seq_id = p->seq_id;
        w->n_tokens = (uint32_t)p->n_tokens;
        w->tokens = (int32_t *)p->tokens;
        w->positions = s->pos + off;
        for (int32_t k = 0; k < p->n_tokens; k++) s->pos[off + (size_t)k] = p->start_pos + k;
        off += (size_t)p->n_tokens;
        w->cache_slot = 0;
        w->sample = p->sample;
        const sched_sampling *sp = p->sampling;
        w->sp.temperature = sp->temperature;
        w->sp.top_k = sp->top_k;
        w->sp.top_p = sp->top_p;
        w->sp.min_p = sp->min_p;
        w->sp.repetition_penalty = sp->repetition_penalty;
        w->sp.presence_penalty = sp->presence_penalty;
        w->sp.frequency_penalty = sp->frequency_penalty;
        /* no seed given: a per-request one (the stream index is the position, so preemption
         * and recomputation give the same tokens either way) */
        w->sp.seed = sp->has_seed ? sp->seed : s->seed_base ^ (p->seq_id * 0x9E3779B97F4A7C15ULL);
        w->sp.logprobs = sp->logprobs;
        w->sp.top_logprobs = (uint32_t)sp->top_logprobs;
        w->sp.logits = WIRE_LOGITS_NONE;
    }
    wire_step_plan wp = {.step_id = ++s->step_id, .n_seqs = (uint32_t)plan->n_seqs, .seqs = s->wseqs};
    wire_step_result res;
    if (coord_step(s->c, &wp, &res, err) != MLA_OK) return MLA_ERR;
    int rc = MLA_OK;
    if (!res.ok) {
        rc = mla_errf(err, "%s", res.error[0] ? res.error : "the workers failed the step");
    } else {
        for (int i = 0; i < plan->n_seqs && rc == MLA_OK; i++) {
            if (!plan->seqs[i].sample) continue;
            const wire_seq_result *r = NULL;
            for (uint32_t k = 0; k < res.n_seqs; k++)
                if (res.seqs[k].seq_id == plan->seqs[i].seq_id) r = &res.seqs[k];
            if (!r || r->token < 0) {
                rc = mla_errf(err, "the workers returned no token for sequence %llu",
                              (unsigned long long)plan->seqs[i].seq_id);
                break;
            }
            results[i].token = r->token;
            results[i].logprob = r->logprob;
            results[i].n_top = (int32_t)(r->n_top < SCHED_MAX_TOP_LOGPROBS ? r->n_top : SCHED_MAX_TOP_LOGPROBS);
            for (int32_t k = 0; k < results[i].n_top; k++) {
                results[i].top_ids[k] = r->top[k].token;
                results[i].top_logprobs[k] = r->top[k].logprob;
            }
        }
    }
    coord_result_free(&res);
    return rc;
}

static void cb_free(void *ctx, uint64_t id) {
    serve_ctx *s = ctx;
    mla_err err;
    if (coord_free_seqs(s->c, &id, 1, &err) != MLA_OK)
        MLA_WARN("serve: freeing sequence %llu: %s", (unsigned long long)id, err.msg);
}

static bool cb_health(void *ctx, char *why, size_t cap) {
    serve_ctx *s = ctx;
    mla_err err = {{0}};
    if (coord_healthy(s->c, &err)) return true;
    snprintf(why, cap, "%s", err.msg[0] ? err.msg : "the worker group failed");
    return false;
}

/* ---- the command ---- */

static uv_signal_t sig_term, sig_int;
static http_server *g_http;
static pbapi_server *g_pb;
/* graceful drain and the worker-failure policy (deploy task): a 200 ms watch timer */
static uv_timer_t g_watch;
static api_server *g_api;
static coord *g_coord;
static double g_drain_timeout = 30;
static int g_draining, g_drain_cancelled, g_exit_rc;
static uint64_t g_drain_deadline;

static void serve_close(uv_loop_t *loop) {
    http_server_close(g_http);
    if (g_pb) pbapi_server_close(g_pb);
    uv_close((uv_handle_t *)&sig_term, NULL);
    uv_close((uv_handle_t *)&sig_int, NULL);
    uv_close((uv_handle_t *)&g_watch, NULL);
    uv_stop(loop);
}

static void on_watch(uv_timer_t *t) {
    if (!g_draining) {
        /* exit (so that a supervisor restarts the server) when the group failed and the policy
         * is exit, or restarts were given up (restart, or stop after the coordinator stood still) */
        if (coord_failed_for_good(g_coord) &&
            (coord_policy(g_coord) == COORD_ON_FAILURE_EXIT || coord_gave_up(g_coord))) {
            MLA_ERROR("serve: the worker group failed%s: exiting with status 1",
                      coord_policy(g_coord) == COORD_ON_FAILURE_EXIT ? " and --on-worker-failure is exit"
                                                                     : " and restarting it was given up");
            g_exit_rc = 1;
            g_draining = 1;
            api_server_set_draining(g_api);
            g_drain_deadline = uv_now(t->loop);
        }
        return;
    }
    if (api_server_inflight(g_api) == 0) {
        MLA_INFO("serve: no request in flight; stopping");
        serve_close(t->loop);
    } else if (!g_drain_cancelled && uv_now(t->loop) >= g_drain_deadline) {
        MLA_WARN("serve: drain timeout: failing the %d request(s) still in flight", api_server_inflight(g_api));
        api_server_cancel_all(g_api, "the server shut down before the request finished (drain timeout)");
        g_drain_cancelled = 1;
    }
}

static void on_signal(uv_signal_t *h, int signum) {
    if (g_draining) {
        MLA_WARN("serve: signal %d again: failing what is in flight and stopping", signum);
        g_drain_deadline = 0;
    } else {
        MLA_INFO("serve: signal %d: draining (no new requests; %d in flight get up to %.1f s)", signum,
                 api_server_inflight(g_api), g_drain_timeout);
        g_draining = 1;
        api_server_set_draining(g_api);
        g_drain_deadline = uv_now(h->loop) + (uint64_t)(g_drain_timeout > 0 ? g_drain_timeout * 1000 : 0);
    }
    on_watch(&g_watch);
}

static int usage(void) {
    fprintf(stderr,
            "usage: mlaserve serve -m MODEL.gguf [--tp N] [--threads N] [--host H] [--port P]\n"
            "       [--api-key K] [--model-name NAME] [--max-context N] [--max-seqs N]\n"
            "       [--step-tokens N] [--kv-blocks N] [--block-size N] [--max-queue N]\n"
            "       [--max-body BYTES] [--max-conns N] [--port-file F] [--worker-exe X] [--coord EP]\n"
            "       [--proto-port P] [--proto-port-file F]   (protobuf API on P, same host and key)\n"
            "       [--drain-timeout S]   (SIGTERM: finish requests in flight for up to S s, default 30)\n"
            "       [--api-key-file F]    (the key from file F, first line; keeps it out of the process list;\n"
            "                              MLASERVE_API_KEY works too)\n"
            "       [--allow-special-in-messages]  (control-token text inside chat messages becomes control\n"
            "                              tokens, for trusted clients; default: message text is plain text)\n"
            "       [--idle-timeout-ms N] (idle connections, HTTP and protobuf, closed after N ms; default 60000;\n"
            "                              --max-conns applies to each port, idle connections make room)\n"
            "       [--request-timeout-ms N] (an HTTP request or protobuf frame not complete N ms after its\n"
            "                              first byte is refused; default 30000; HTTP headers: 10000)\n%s",
            coord_opts_usage);
    return 2;
}

/* The first line of a key file (without the line end); NULL with err set. */
static char *read_key_file(const char *path, mla_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) {
        mla_errf(err, "--api-key-file %s: %s", path, strerror(errno));
        return NULL;
    }
    char buf[1024];
    char *line = fgets(buf, sizeof buf, f);
    fclose(f);
    if (!line) {
        mla_errf(err, "--api-key-file %s: the file is empty", path);
        return NULL;
    }
    buf[strcspn(buf, "\r\n")] = 0;
    if (!buf[0]) {
        mla_errf(err, "--api-key-file %s: the first line is empty", path);
        return NULL;
    }
    return mla_xstrdup(buf);
}

static bool host_is_loopback(const char *h) {
    return !strncmp(h, "127.", 4) || !strcmp(h, "::1") || !strcmp(h, "localhost");
}

static const char *basename_of(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

int cmd_serve(int argc, char **argv) {
    const char *model = NULL, *host = "127.0.0.1", *api_key = getenv("MLASERVE_API_KEY");
    const char *model_name = NULL, *port_file = NULL, *worker_exe = NULL, *endpoint = NULL;
    int port = 8000, tp = 1, threads = 1, proto_port = -1;
    const char *proto_port_file = NULL, *api_key_file = NULL;
    bool special_in_messages = false;
    char *key_owned = NULL;
    long idle_timeout_ms = -1, request_timeout_ms = -1;
    long max_context = 0, max_seqs = 32, step_tokens = 512, kv_blocks = 0, block_size = 16, max_queue = 256;
    http_server_config hc;
    http_server_config_default(&hc);
    coord_config cc = {0};
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (!strcmp(a, "--allow-special-in-messages")) {
            special_in_messages = true;
            i--; /* no value */
            continue;
        }
        mla_err oerr;
        int co = coord_parse_opt(&cc, argc, argv, &i, &oerr); /* control-plane options */
        if (co < 0) {
            fprintf(stderr, "mlaserve serve: %s\n", oerr.msg);
            return usage();
        }
        if (co > 0) {
            i--; /* the loop steps by 2; i is at the option's last word */
            continue;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "mlaserve serve: %s needs a value\n", a);
            return usage();
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--tp")) tp = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--host")) host = v;
        else if (!strcmp(a, "--port")) port = atoi(v);
        else if (!strcmp(a, "--api-key")) {
            free(key_owned);
            api_key = key_owned = mla_xstrdup(v);
            /* out of /proc/PID/cmdline from now on (--api-key-file avoids even the start) */
            memset(argv[i + 1], 'x', strlen(argv[i + 1]));
        }
        else if (!strcmp(a, "--api-key-file")) api_key_file = v;
        else if (!strcmp(a, "--idle-timeout-ms")) idle_timeout_ms = atol(v);
        else if (!strcmp(a, "--request-timeout-ms")) request_timeout_ms = atol(v);
        else if (!strcmp(a, "--model-name")) model_name = v;
        else if (!strcmp(a, "--max-context")) max_context = atol(v);
        else if (!strcmp(a, "--max-seqs")) max_seqs = atol(v);
        else if (!strcmp(a, "--step-tokens")) step_tokens = atol(v);
        else if (!strcmp(a, "--kv-blocks")) kv_blocks = atol(v);
        else if (!strcmp(a, "--block-size")) block_size = atol(v);
        else if (!strcmp(a, "--max-queue")) max_queue = atol(v);
        else if (!strcmp(a, "--max-body")) hc.lim.max_body = (size_t)atol(v);
        else if (!strcmp(a, "--max-conns")) hc.max_conns = atoi(v);
        else if (!strcmp(a, "--port-file")) port_file = v;
        else if (!strcmp(a, "--proto-port")) proto_port = atoi(v);
        else if (!strcmp(a, "--proto-port-file")) proto_port_file = v;
        else if (!strcmp(a, "--worker-exe")) worker_exe = v;
        else if (!strcmp(a, "--coord")) endpoint = v;
        else if (!strcmp(a, "--drain-timeout")) g_drain_timeout = strtod(v, NULL);
        else {
            fprintf(stderr, "mlaserve serve: unknown option %s\n", a);
            return usage();
        }
    }
    if (!model) {
        fprintf(stderr, "mlaserve serve: -m MODEL.gguf is required\n");
        return usage();
    }
    if (tp < 1 || threads < 1 || port < 0 || port > 65535 || max_seqs < 1 || step_tokens < 1 ||
        block_size < 1 || max_queue < 1 || max_context < 0 || kv_blocks < 0 || proto_port < -1 || proto_port > 65535 ||
        (proto_port_file && proto_port < 0) || hc.max_conns < 1 || idle_timeout_ms == 0 || idle_timeout_ms < -1 ||
        request_timeout_ms == 0 || request_timeout_ms < -1) {
        fprintf(stderr, "mlaserve serve: an option value is out of range\n");
        free(key_owned);
        return usage();
    }
    pbapi_config pc;
    pbapi_config_default(&pc);
    pc.max_conns = hc.max_conns; /* --max-conns: per port */
    if (idle_timeout_ms > 0) hc.idle_timeout_ms = pc.idle_timeout_ms = (unsigned)idle_timeout_ms;
    if (request_timeout_ms > 0) {
        hc.request_timeout_ms = pc.frame_timeout_ms = (unsigned)request_timeout_ms;
        if (hc.header_timeout_ms > hc.request_timeout_ms) hc.header_timeout_ms = hc.request_timeout_ms;
    }
    if (api_key_file) {
        mla_err kerr;
        free(key_owned);
        api_key = key_owned = read_key_file(api_key_file, &kerr);
        if (!api_key) {
            fprintf(stderr, "mlaserve serve: %s\n", kerr.msg);
            return 2;
        }
    }
    if (!host_is_loopback(host) && !(api_key && api_key[0]))
        MLA_WARN("serve: listening on %s without an API key: anyone who can reach this address can use the "
                 "model (give --api-key-file F or MLASERVE_API_KEY)", host);
    {
        struct rlimit rl;
        /* each connection is a descriptor; the workers' links and files need some too */
        long need = (long)hc.max_conns * (proto_port >= 0 ? 2 : 1) + 64;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (long)rl.rlim_cur < need)
            MLA_WARN("serve: the open-file limit is %ld but --max-conns %d%s needs about %ld descriptors: past the "
                     "limit new connections fail to be accepted (raise it with ulimit -n or LimitNOFILE=)",
                     (long)rl.rlim_cur, hc.max_conns, proto_port >= 0 ? " on each of two ports" : "", need);
    }
    signal(SIGPIPE, SIG_IGN);
    mla_log_set_tag("coord");
    mla_err err = {{0}};
    serve_ctx S = {0};
    gguf_ctx *g = NULL;
    sched *s = NULL;
    api_server *api = NULL;
    http_server *http = NULL;
    pbapi_server *pb = NULL;
    uv_loop_t *loop = uv_default_loop();
    int rc = 1;
    bool loop_ran = false;

    if (gguf_open(&g, model, &err)) goto out;
    if (tok_vocab_from_gguf(&S.vocab, g, &err)) goto out;
    if (chat_tmpl_from_gguf(&S.tmpl, g, S.vocab, &err)) {
        MLA_WARN("serve: no chat template (%s); /v1/chat/completions is off", err.msg);
        S.tmpl = NULL;
    } else if (chat_tmpl_prefix(S.tmpl, &S.prefix, &err)) {
        MLA_WARN("serve: chat template prefix: %s", err.msg);
        S.prefix = NULL;
    }
    /* refuse a model or a tensor-parallel degree that cannot work before starting workers */
    mla_config mcfg;
    if (coord_check_model(g, tp, &mcfg, &err)) {
        mla_err_prefix(&err, "%s", model);
        goto out;
    }
    /* the model's context length */
    {
        const long ctx_len = (long)mcfg.ctx_train;
        if (max_context == 0) max_context = ctx_len > 0 ? (ctx_len < 8192 ? ctx_len : 8192) : 4096;
        if (ctx_len > 0 && max_context > ctx_len) {
            mla_errf(&err, "--max-context %ld is beyond the model's context length %ld", max_context, ctx_len);
            goto out;
        }
    }
    if (kv_blocks == 0) kv_blocks = (max_seqs * max_context + block_size - 1) / block_size;
    if (endpoint) cc.endpoint = endpoint;
    cc.world = tp;
    cc.model_path = model;
    cc.model_hash = gguf_index_hash(g);
    cc.worker_exe = worker_exe;
    cc.n_threads = threads;
    if (coord_start(&S.c, &cc, &err)) {
        mla_err_prefix(&err, "starting %d workers", tp);
        goto out;
    }
    S.seed_base = (uint64_t)time(NULL) * 0x2545F4914F6CDD1DULL;
    api_tokenizer tok = {.ctx = &S, .n_vocab = (int32_t)coord_n_vocab(S.c), .encode = st_encode,
                         .piece = st_piece, .is_special = st_special, .is_eog = st_eog, .control_at = st_control_at,
                         .render_chat = S.tmpl ? st_chat : NULL};
    api_config ac = {.model_name = model_name ? model_name : basename_of(model), .api_key = api_key,
                     .special_in_messages = special_in_messages,
                     .max_context = (int32_t)max_context, .health = cb_health, .health_ctx = &S};
    if (api_server_new(&api, loop, &ac, &tok, &err)) goto out;
    sched_config sc = {.block_size = (int32_t)block_size, .n_blocks = (int32_t)kv_blocks,
                       .max_seqs = (int32_t)max_seqs, .max_step_tokens = (int32_t)step_tokens,
                       .max_queue = (int32_t)max_queue, .max_context = (int32_t)max_context,
                       .is_eog = st_eog, .eog_ctx = &S, .on_event = api_server_on_event, .cb_ctx = api};
    sched_backend be = {.ctx = &S, .run_step = cb_run, .free_seq = cb_free};
    if (sched_init(&s, &sc, &be, &err)) goto out;
    api_server_set_sched(api, s);
    hc.early = api_server_early;
    if (http_server_init(&http, loop, &hc, api_server_handle, api, &err)) goto out;
    api_server_set_http(api, http);
    g_http = http;
    int bound = 0;
    if (http_server_listen(http, host, port, &bound, &err)) goto out;
    int pb_bound = -1;
    if (proto_port >= 0) {
        if (pbapi_server_init(&pb, loop, api, &pc, &err)) goto out;
        g_pb = pb;
        if (pbapi_server_listen(pb, host, proto_port, &pb_bound, &err)) goto out;
    }
    if (sched_start(s, &err)) goto out;
    const char *pfiles[2] = {proto_port_file, port_file}; /* the HTTP port file last: it means ready */
    const int pports[2] = {pb_bound, bound};
    for (int k = 0; k < 2; k++) {
        if (!pfiles[k]) continue;
        char tmp[4096];
        snprintf(tmp, sizeof(tmp), "%s.tmp", pfiles[k]);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", pports[k]) < 0 || fclose(f) != 0 || rename(tmp, pfiles[k]) != 0) {
            mla_errf(&err, "cannot write the port file %s", pfiles[k]);
            goto out;
        }
    }
    if (pb) MLA_INFO("serve: protobuf API on %s:%d", host, pb_bound);
    MLA_INFO("serve: %s on http://%s:%d (tp %d, context %ld, %ld KV blocks of %ld)", ac.model_name, host,
             bound, tp, max_context, kv_blocks, block_size);
    uv_signal_init(loop, &sig_term);
    uv_signal_init(loop, &sig_int);
    uv_signal_start(&sig_term, on_signal, SIGTERM);
    uv_signal_start(&sig_int, on_signal, SIGINT);
    g_api = api;
    g_coord = S.c;
    uv_timer_init(loop, &g_watch);
    uv_timer_start(&g_watch, on_watch, 200, 200);
    loop_ran = true;
    uv_run(loop, UV_RUN_DEFAULT);
    rc = g_exit_rc;
    if (rc) mla_errf(&err, "the worker group failed (--on-worker-failure exit)");
out:
    if (rc != 0) fprintf(stderr, "mlaserve serve: %s\n", err.msg);
    if (http && !loop_ran) http_server_close(http);
    if (pb && !loop_ran) pbapi_server_close(pb);
    if (api) api_server_drain(api);
    if (s) {
        sched_stop(s);
        sched_free(s);
    }
    if (pb) pbapi_server_free(pb);
    g_pb = NULL;
    if (api) api_server_free(api);
    if (http) http_server_free(http);
    uv_run(loop, UV_RUN_NOWAIT);
    uv_loop_close(loop);
    if (S.c) coord_stop(S.c);
    free(S.wseqs);
    free(S.pos);
    free(S.prefix);
    if (S.tmpl) chat_tmpl_free(S.tmpl);
    if (S.vocab) tok_vocab_free(S.vocab);
    if (g) gguf_close(g);
    free(key_owned);
    return rc;
}
