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
#include "common/opts.h"
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
    api_server *api;
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
        w->block_start = (uint32_t)p->n_blocks_sent;
        w->n_blocks = (uint32_t)(p->n_blocks - p->n_blocks_sent);
        w->blocks = (uint32_t *)(p->block_table + p->n_blocks_sent); /* ids >= 0: the same bits */
        w->sample = p->sample;
        if (p->start_pos == 0 && s->api) api_server_note_scheduled(s->api, p->seq_id); /* its prompt starts */
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
        /* output constraints: the worker keeps them from the plan that starts the sequence's
         * state; the matcher follows the generated tokens from position n_prompt */
        w->sp.constrained = sp->grammar || sp->n_bias > 0;
        if (w->sp.constrained && p->n_blocks_sent == 0) {
            w->sp.constraint_setup = true;
            w->sp.grammar = (char *)sp->grammar;
            w->sp.grammar_start = (uint32_t)p->n_prompt;
            if (p->start_pos > p->n_prompt) { /* generated tokens found in the prefix cache */
                w->sp.replay = (int32_t *)p->seq_tokens + p->n_prompt;
                w->sp.n_replay = (uint32_t)(p->start_pos - p->n_prompt);
            }
            w->sp.n_bias = (uint32_t)sp->n_bias;
            w->sp.bias_ids = (int32_t *)sp->bias_ids;
            w->sp.bias_vals = (float *)sp->bias_vals;
        }
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

static int cb_workers(void *ctx, coord_worker_info *info, int cap) {
    serve_ctx *s = ctx;
    return coord_workers(s->c, info, cap);
}

/* /health while the first start is under way: 503 with each rank's progress */
static bool cb_loading(void *ctx, cJSON **body) {
    serve_ctx *s = ctx;
    if (coord_phase(s->c) != COORD_PHASE_LOADING) return false;
    coord_worker_info w[WIRE_MAX_WORLD];
    int n = coord_workers(s->c, w, WIRE_MAX_WORLD);
    cJSON *j = cJSON_CreateObject(), *ranks = cJSON_AddArrayToObject(j, "ranks");
    cJSON_AddStringToObject(j, "status", "loading");
    uint64_t done = 0, total = 0;
    for (int r = 0; r < n; r++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "rank", r);
        cJSON_AddStringToObject(o, "state", w[r].loaded ? "loaded" : !w[r].registered ? "starting"
                                            : w[r].load_total ? "loading" : "registered");
        if (w[r].device[0]) cJSON_AddStringToObject(o, "device", w[r].device);
        if (w[r].load_total) {
            cJSON_AddNumberToObject(o, "bytes_done", (double)w[r].load_done);
            cJSON_AddNumberToObject(o, "bytes_total", (double)w[r].load_total);
            if (w[r].load_seconds > 0 && w[r].load_done > 0) {
                double rate = (double)w[r].load_done / w[r].load_seconds;
                cJSON_AddNumberToObject(o, "bytes_per_second", rate);
                if (!w[r].loaded) cJSON_AddNumberToObject(o, "eta_seconds", (double)(w[r].load_total - w[r].load_done) / rate);
            }
            done += w[r].load_done;
            total += w[r].load_total;
        }
        cJSON_AddItemToArray(ranks, o);
    }
    cJSON_AddNumberToObject(j, "bytes_done", (double)done);
    cJSON_AddNumberToObject(j, "bytes_total", (double)total);
    *body = j;
    return true;
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
static double g_stats_interval = 10;
static sched *g_sched;        /* made once the workers are ready (make_sched) */
static sched_config g_sc;       /* its settings, less the pool's */
static sched_backend g_be;
static coord_kv_info g_kvi;     /* the pools the workers took */
static int g_ready;         /* the group became ready and the scheduler runs */
/* the port files, written once ready (the HTTP one last: it means ready) */
typedef struct serve_ports {
    const char *files[2];
    int ports[2];
} serve_ports;
static serve_ports g_ports;
/* the stats line: when the last was written, and the token counts then */
static uint64_t g_stats_at, g_stats_prompt, g_stats_gen;
static int g_draining, g_drain_cancelled, g_exit_rc;
static char g_exit_msg[1100]; /* why g_exit_rc is 1 */
static uint64_t g_drain_deadline;

static void serve_close(uv_loop_t *loop) {
    http_server_close(g_http);
    if (g_pb) pbapi_server_close(g_pb);
    uv_close((uv_handle_t *)&sig_term, NULL);
    uv_close((uv_handle_t *)&sig_int, NULL);
    uv_close((uv_handle_t *)&g_watch, NULL);
    uv_stop(loop);
}

static int write_port_files(mla_err *err) {
    for (int k = 0; k < 2; k++) {
        if (!g_ports.files[k]) continue;
        char tmp[4096];
        snprintf(tmp, sizeof(tmp), "%s.tmp", g_ports.files[k]);
        FILE *f = fopen(tmp, "w");
        int ok = f && fprintf(f, "%d\n", g_ports.ports[k]) >= 0;
        if (f && fclose(f) != 0) ok = 0;
        if (!ok || rename(tmp, g_ports.files[k]) != 0)
            return mla_errf(err, "cannot write the port file %s", g_ports.files[k]);
    }
    return MLA_OK;
}

/* the first start: ready (start the scheduler, write the port files) or failed (exit 1) */
/* The scheduler over the pools the workers took: the smallest rank's blocks, and the context
 * asked for (the model's by default) or what the pool holds when one sequence of it does not fit. */
static int make_sched(mla_err *err) {
    coord_kv_pool(g_coord, &g_kvi);
    const long pool_tokens = (long)g_kvi.n_blocks * (long)g_kvi.block_size;
    MLA_INFO("serve: cache pool %u blocks of %u positions = %ld positions a rank (%.2f GiB a rank)", g_kvi.n_blocks,
             g_kvi.block_size, pool_tokens, (double)g_kvi.n_blocks * (double)g_kvi.block_bytes / 1073741824.0);
    if (pool_tokens < g_sc.max_context) {
        MLA_WARN("serve: one sequence of %d positions does not fit the cache (%ld positions): serving a context of "
                 "%ld; more memory (--gpu-memory-utilization, --kv-memory, more GPUs) gives more",
                 g_sc.max_context, pool_tokens, pool_tokens);
        g_sc.max_context = (int32_t)pool_tokens;
    }
    if (g_sc.max_context < 2) return mla_errf(err, "the cache pool holds %ld positions: too few to serve a request", pool_tokens);
    g_sc.block_size = (int32_t)g_kvi.block_size;
    g_sc.n_blocks = (int32_t)g_kvi.n_blocks;
    if (sched_init(&g_sched, &g_sc, &g_be, err)) return MLA_ERR;
    api_server_set_capacity(g_api, g_sc.max_context, g_kvi.rank_blocks, coord_world(g_coord), g_kvi.block_bytes);
    api_server_set_sched(g_api, g_sched);
    MLA_INFO("serve: context %d, %u cache blocks of %u, prefix cache %s", g_sc.max_context, g_kvi.n_blocks,
             g_kvi.block_size, g_sc.prefix_cache ? "on" : "off");
    return MLA_OK;
}

static void check_start(uv_loop_t *loop) {
    int ph = coord_phase(g_coord);
    mla_err err = {{0}};
    if (ph == COORD_PHASE_READY) {
        if (make_sched(&err) || sched_start(g_sched, &err) || write_port_files(&err)) {
            snprintf(g_exit_msg, sizeof g_exit_msg, "%s", err.msg);
            g_exit_rc = 1;
            serve_close(loop);
            return;
        }
        g_ready = 1;
        MLA_INFO("serve: the workers are ready; serving");
    } else if (ph == COORD_PHASE_START_FAILED) {
        coord_healthy(g_coord, &err);
        snprintf(g_exit_msg, sizeof g_exit_msg, "starting %d workers: %s", coord_world(g_coord), err.msg);
        g_exit_rc = 1;
        serve_close(loop);
    }
}

/* every g_stats_interval seconds while there is work: the batch, the cache and the token rates */
static void stats_line(uv_loop_t *loop) {
    if (g_stats_interval <= 0 || !g_ready) return;
    uint64_t now = uv_now(loop);
    if (!g_stats_at) g_stats_at = now;
    if ((double)(now - g_stats_at) < g_stats_interval * 1000) return;
    sched_stats st;
    sched_get_stats(g_sched, &st);
    uint64_t p, gtok;
    api_server_token_counts(g_api, &p, &gtok);
    double dt = (double)(now - g_stats_at) / 1000.0;
    if (st.running || st.waiting || p != g_stats_prompt || gtok != g_stats_gen)
        MLA_INFO("stats: %d running, %d waiting, KV cache %d of %d blocks (%.1f%%), prompt %.1f tok/s, generation "
                 "%.1f tok/s",
                 st.running, st.waiting, st.blocks_used, st.blocks_total,
                 st.blocks_total ? 100.0 * st.blocks_used / st.blocks_total : 0.0, (double)(p - g_stats_prompt) / dt,
                 (double)(gtok - g_stats_gen) / dt);
    g_stats_at = now;
    g_stats_prompt = p;
    g_stats_gen = gtok;
}

static void on_watch(uv_timer_t *t) {
    if (!g_ready && !g_draining) {
        check_start(t->loop);
        return;
    }
    stats_line(t->loop);
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

static const char serve_usage[] =
    "usage: mlaserve serve -m MODEL.gguf [--tp N] [options]\n"
    "OpenAI-compatible HTTP server (and optionally the protobuf API) over N worker processes.\n"
    "SIGTERM or SIGINT drains: no new requests, those in flight get --drain-timeout seconds.\n";

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
    const char *host = "127.0.0.1", *api_key = getenv("MLASERVE_API_KEY");
    const char *model_name = NULL, *port_file = NULL;
    int port = 8000, proto_port = -1;
    const char *proto_port_file = NULL, *api_key_file = NULL;
    int special_in_messages = 0;
    char *key_owned = NULL;
    long idle_timeout_ms = -1, request_timeout_ms = -1;
    long max_context = 0, max_seqs = 32, step_tokens = 2048, max_queue = 256;
    int no_prefix_cache = 0;
    long max_body;
    http_server_config hc;
    http_server_config_default(&hc);
    max_body = (long)hc.lim.max_body;
    coord_group_opts go = {0};
    opt_spec gspecs[COORD_GROUP_N_OPTS], cspecs[COORD_N_OPTS];
    coord_group_opt_specs(&go, gspecs);
    coord_opt_specs(&go.cc, cspecs);
    const opt_spec mine[] = {
        {.name = "--host", .kind = OPT_STR, .arg = "HOST", .def = "127.0.0.1", .help = "HTTP (and protobuf) bind address",
         .dest = &host},
        {.name = "--port", .kind = OPT_INT, .arg = "PORT", .def = "8000", .help = "HTTP port (0: any free port)",
         .dest = &port, .lo = 0, .hi = 65535},
        {.name = "--api-key", .kind = OPT_STR, .arg = "KEY", .def = "$MLASERVE_API_KEY, else none",
         .help = "key clients send as `Authorization: Bearer KEY` (/health and /metrics need none)", .dest = &api_key},
        {.name = "--api-key-file", .kind = OPT_STR, .arg = "FILE", .def = "none",
         .help = "the key from the file's first line (keeps it out of the process list)", .dest = &api_key_file},
        {.name = "--allow-special-in-messages", .kind = OPT_FLAG,
         .help = "control-token text inside chat messages becomes control tokens (trusted clients only)",
         .dest = &special_in_messages},
        {.name = "--idle-timeout-ms", .kind = OPT_LONG, .arg = "N", .def = "60000",
         .help = "idle connections (HTTP and protobuf) are closed after N ms", .dest = &idle_timeout_ms, .lo = 1,
         .hi = 86400000},
        {.name = "--request-timeout-ms", .kind = OPT_LONG, .arg = "N", .def = "30000 (HTTP headers: 10000)",
         .help = "a request or protobuf frame not complete N ms after its first byte is refused",
         .dest = &request_timeout_ms, .lo = 1, .hi = 86400000},
        {.name = "--model-name", .kind = OPT_STR, .arg = "NAME", .def = "the file name",
         .help = "the model's name in the API", .dest = &model_name},
        {.name = "--max-context", .kind = OPT_LONG, .arg = "N", .def = "the model's, or what the cache pool holds",
         .help = "longest sequence (prompt + generated tokens)", .dest = &max_context, .lo = 0, .hi = WIRE_MAX_CTX},
        {.name = "--max-seqs", .kind = OPT_LONG, .arg = "N", .def = "32", .help = "sequences in the running batch",
         .dest = &max_seqs, .lo = 1, .hi = WIRE_MAX_SEQS},
        {.name = "--max-prefill-tokens", .kind = OPT_LONG, .arg = "N", .def = "2048",
         .help = "tokens a step may carry: longer prompts are prefilled in chunks beside the running decodes",
         .dest = &step_tokens, .lo = 1, .hi = WIRE_MAX_STEP_TOKENS},
        {.name = "--no-prefix-cache", .kind = OPT_FLAG,
         .help = "every request prefills its whole prompt (no sharing of cached blocks)", .dest = &no_prefix_cache},
        {.name = "--max-queue", .kind = OPT_LONG, .arg = "N", .def = "256",
         .help = "requests waiting for admission before new ones get 429", .dest = &max_queue, .lo = 1, .hi = 1L << 24},
        {.name = "--max-body", .kind = OPT_LONG, .arg = "BYTES", .def = "4194304", .help = "largest HTTP request body",
         .dest = &max_body, .lo = 1, .hi = 1L << 34},
        {.name = "--max-conns", .kind = OPT_INT, .arg = "N", .def = "1024",
         .help = "open connections at most, on each port (idle ones make room for new ones)",
         .dest = &hc.max_conns, .lo = 1, .hi = 1 << 24},
        {.name = "--port-file", .kind = OPT_STR, .arg = "FILE", .def = "none",
         .help = "write the HTTP port here once the server is ready (the model loaded)", .dest = &port_file},
        {.name = "--proto-port", .kind = OPT_INT, .arg = "PORT", .def = "off",
         .help = "serve the protobuf API on this port (0: any free port), same host and key", .dest = &proto_port,
         .lo = 0, .hi = 65535},
        {.name = "--proto-port-file", .kind = OPT_STR, .arg = "FILE", .def = "none",
         .help = "write the protobuf port here once ready (needs --proto-port)", .dest = &proto_port_file},
        {.name = "--drain-timeout", .kind = OPT_DOUBLE, .arg = "S", .def = "30",
         .help = "seconds requests in flight get after SIGTERM", .dest = &g_drain_timeout, .lo = 0, .hi = 86400},
        {.name = "--stats-interval", .kind = OPT_DOUBLE, .arg = "S", .def = "10",
         .help = "seconds between stats lines in the log while busy (0: none)", .dest = &g_stats_interval, .lo = 0,
         .hi = 86400},
        MLA_LOG_LEVEL_OPT,
    };
    const opt_table tabs[] = {{"model and workers", gspecs, COORD_GROUP_N_OPTS},
                              {"serving", mine, sizeof mine / sizeof *mine},
                              {"control plane", cspecs, COORD_N_OPTS}};
    mla_err oerr;
    int help = 0;
    if (opts_parse(tabs, 3, argc, argv, 1, 0, NULL, 0, NULL, NULL, &help, &oerr)) {
        fprintf(stderr, "mlaserve serve: %s (mlaserve serve --help lists the options)\n", oerr.msg);
        return 2;
    }
    if (help) {
        opts_help(stdout, serve_usage, tabs, 3);
        return 0;
    }
    if (!go.model) {
        fprintf(stderr, "mlaserve serve: -m MODEL.gguf is required (mlaserve serve --help lists the options)\n");
        return 2;
    }
    if (proto_port_file && proto_port < 0) {
        fprintf(stderr, "mlaserve serve: --proto-port-file needs --proto-port\n");
        return 2;
    }
    hc.lim.max_body = (size_t)max_body;
    const char *model = go.model;
    const int tp = go.tp;
    coord_config cc = go.cc;
    if (api_key && api_key[0] && api_key != getenv("MLASERVE_API_KEY")) {
        /* out of /proc/PID/cmdline from now on (--api-key-file avoids even the start) */
        api_key = key_owned = mla_xstrdup(api_key);
        for (int i = 1; i < argc; i++)
            if (!strncmp(argv[i], "--api-key", 9) && argv[i][9] != '-') {
                char *v = argv[i][9] == '=' ? argv[i] + 10 : i + 1 < argc ? argv[i + 1] : NULL;
                if (v) memset(v, 'x', strlen(v));
            }
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
    /* the model's context length, unless a shorter one is asked for */
    const long ctx_len = (long)mcfg.ctx_train;
    if (ctx_len > 0 && max_context > ctx_len) {
        mla_errf(&err, "--max-context %ld is beyond the model's context length %ld", max_context, ctx_len);
        goto out;
    }
    if (max_context == 0) max_context = ctx_len > 0 ? ctx_len : 4096;
    cc.kv.max_context = (uint32_t)max_context;
    cc.kv.max_step_tokens = (uint32_t)step_tokens;
    cc.kv.max_seqs = (uint32_t)max_seqs;
    cc.world = tp;
    cc.no_wait = 1; /* HTTP answers (/health: load progress) while the workers load */
    cc.model_path = model;
    cc.model_hash = gguf_index_hash(g);
    cc.worker_exe = go.worker_exe;
    cc.n_threads = go.threads;
    if (coord_start(&S.c, &cc, &err)) {
        mla_err_prefix(&err, "starting %d workers", tp);
        goto out;
    }
    S.seed_base = (uint64_t)time(NULL) * 0x2545F4914F6CDD1DULL;
    api_tokenizer tok = {.ctx = &S, .n_vocab = (int32_t)mcfg.n_vocab, .encode = st_encode,
                         .piece = st_piece, .is_special = st_special, .is_eog = st_eog, .control_at = st_control_at,
                         .render_chat = S.tmpl ? st_chat : NULL};
    api_config ac = {.model_name = model_name ? model_name : basename_of(model), .api_key = api_key,
                     .special_in_messages = special_in_messages,
                     .max_context = (int32_t)max_context, .health = cb_health, .health_ctx = &S,
                     .loading = cb_loading, .workers = cb_workers, .tp = tp};
    if (api_server_new(&api, loop, &ac, &tok, &err)) goto out;
    S.api = api;
    /* the scheduler starts once the workers report their pools (check_start) */
    g_sc = (sched_config){.prefix_cache = !no_prefix_cache, .decode_lookahead = true,
                          .max_seqs = (int32_t)max_seqs, .max_step_tokens = (int32_t)step_tokens,
                          .max_queue = (int32_t)max_queue, .max_context = (int32_t)max_context,
                          .is_eog = st_eog, .eog_ctx = &S, .on_event = api_server_on_event, .cb_ctx = api};
    g_be = (sched_backend){.ctx = &S, .run_step = cb_run, .free_seq = cb_free};
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
    g_ports = (serve_ports){{proto_port_file, port_file}, {pb_bound, bound}};
    if (pb) MLA_INFO("serve: protobuf API on %s:%d", host, pb_bound);
    MLA_INFO("serve: %s on http://%s:%d (tp %d, prefix cache %s); the workers load the model (GET /health: their "
             "progress; 503 until ready)",
             ac.model_name, host, bound, tp, no_prefix_cache ? "off" : "on");
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
    if (rc) mla_errf(&err, "%s", g_exit_msg);
out:
    if (rc != 0) fprintf(stderr, "mlaserve serve: %s\n", err.msg);
    if (http && !loop_ran) http_server_close(http);
    if (pb && !loop_ran) pbapi_server_close(pb);
    if (api) api_server_drain(api);
    if (g_sched) {
        sched_stop(g_sched);
        sched_free(g_sched);
        g_sched = NULL;
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
