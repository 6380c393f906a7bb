/* cmd_serve: tokenizer + chat template + coordinator (workers) + scheduler + HTTP. See
 * cmd_serve.h. The adapters between the servers, the scheduler and the worker group are in
 * coordinator/serve_adapt.h. */
#include "coordinator/cmd_serve.h"

#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "common/gguf.h"
#include "common/mla_err.h"
#include "common/mla_log.h"
#include "common/mla_switch.h"
#include "common/opts.h"
#include "common/sig_clean.h"
#include "coordinator/api_server.h"
#include "coordinator/chat.h"
#include "coordinator/coord.h"
#include "coordinator/http_server.h"
#include "coordinator/grpc_server.h"
#include "coordinator/chat_reasoning.h"
#include "coordinator/chat_toolcall.h"
#include "coordinator/sched_batch.h"
#include "coordinator/serve_adapt.h"
#include "coordinator/tok.h"
#include "coordinator/uvnet.h"


/* ---- the command ---- */

/* connections taken past --max-conns for /health and /metrics alone (http_server_config) */
#define SERVE_PROBE_CONNS 8

static uv_signal_t sig_term, sig_int;
static http_server *g_http;
static grpc_server *g_pb;
/* graceful drain and the worker-failure policy (deploy task): a 200 ms watch timer */
static uv_timer_t g_watch;
static api_server *g_api;
static coord *g_coord;
static double g_drain_timeout = 30;
static double g_stats_interval = 10;
static sched *g_sched;        /* made once the workers are ready (make_sched) */
static sched_config g_sc;       /* its settings, less the pool's */
static long g_long_prefill = -1; /* --long-prefill-tokens (-1: the default, set with the context) */
static sched_backend g_be;
static coord_kv_info g_kvi;     /* the pools the workers took */
static int g_ready;         /* the group became ready and the scheduler runs */
/* the port files, written once ready (the HTTP one last: it means ready) */
typedef struct serve_ports {
    const char *files[2];
    int ports[2];
    int clean[2]; /* their sig_clean entries once written (a SIGHUP removes them too) */
} serve_ports;
static serve_ports g_ports = {.clean = {-1, -1}}; /* set once the workers start */
/* the stats line: when the last was written, and the token counts then */
static uint64_t g_stats_at, g_stats_prompt, g_stats_gen;
static int g_draining, g_drain_cancelled, g_drain_flush_said, g_exit_rc;
static char g_exit_msg[1100]; /* why g_exit_rc is 1 */
static char g_start_what[64]; /* "starting 2 workers" / "waiting for 1 external worker", for messages */
static uint64_t g_drain_deadline;
static const char *g_drain_why = "drain timeout"; /* what ended the drain early, for the requests it fails */
static int g_signalled; /* a SIGTERM / SIGINT came */

/* SIGINT / SIGTERM once the drain is over: the shutdown after it is bounded (coord_stop gives the
 * workers 3 s, then kills them) and runs to its end, so that it removes the control socket's
 * folder and the collective's segment and no worker outlives the server */
static void on_late_signal(int sig) {
    (void)sig;
    const int saved = errno; /* of the thread it interrupted */
    static const char msg[] = "mlaserve serve: already shutting down (the workers get 3 s to exit, then are killed)\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    errno = saved;
}

static void serve_close(uv_loop_t *loop) {
    http_server_close(g_http);
    if (g_pb) grpc_server_close(g_pb);
    uv_close((uv_handle_t *)&sig_term, NULL);
    uv_close((uv_handle_t *)&sig_int, NULL);
    /* libuv gave those signals their default action back (the process would end half way) */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_late_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    uv_close((uv_handle_t *)&g_watch, NULL);
    uv_stop(loop);
}

/* The port files: checked before anything starts (prepare_port_files: their folder takes a file;
 * one an earlier server left is removed, so that no reader takes its port for this one's),
 * written once the server is ready (by a rename: a reader sees the whole line or nothing),
 * removed when it exits. */
static bool g_ports_written;

static int port_file_tmp(const char *path, char *tmp, size_t n, mla_err *err) {
    if ((size_t)snprintf(tmp, n, "%s.tmp", path) >= n) return mla_errf(err, "the port file path %s is too long", path);
    return MLA_OK;
}

static int prepare_port_files(const char *const files[2], mla_err *err) {
    for (int k = 0; k < 2; k++) {
        if (!files[k]) continue;
        char tmp[4096];
        if (port_file_tmp(files[k], tmp, sizeof tmp, err)) return MLA_ERR;
        FILE *f = fopen(tmp, "w");
        if (!f) return mla_errf(err, "cannot write the port file %s (%s: %s)", files[k], tmp, strerror(errno));
        fclose(f);
        unlink(tmp);
        if (unlink(files[k]) != 0 && errno != ENOENT)
            return mla_errf(err, "cannot replace the port file %s: %s", files[k], strerror(errno));
    }
    return MLA_OK;
}

static int write_port_files(mla_err *err) {
    for (int k = 0; k < 2; k++) {
        if (!g_ports.files[k]) continue;
        char tmp[4096];
        if (port_file_tmp(g_ports.files[k], tmp, sizeof tmp, err)) return MLA_ERR;
        FILE *f = fopen(tmp, "w");
        int ok = f && fprintf(f, "%d\n", g_ports.ports[k]) >= 0;
        if (f && fclose(f) != 0) ok = 0;
        if (!ok || rename(tmp, g_ports.files[k]) != 0) {
            const int e = errno;
            unlink(tmp);
            return mla_errf(err, "cannot write the port file %s: %s", g_ports.files[k], strerror(e));
        }
        g_ports_written = true;
        g_ports.clean[k] = sig_clean_file(g_ports.files[k]);
    }
    return MLA_OK;
}

static void remove_port_files(void) {
    if (!g_ports_written) return;
    for (int k = 0; k < 2; k++)
        if (g_ports.files[k]) {
            unlink(g_ports.files[k]);
            sig_clean_forget(g_ports.clean[k]); /* after: a signal in between finds it gone */
        }
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
    /* a long prompt: 4 steps' budget, but within the context served (a short one would otherwise
     * have none) */
    const long lp4 = 4L * g_sc.max_step_tokens, half = g_sc.max_context / 2;
    g_sc.long_prefill_tokens = (int32_t)(g_long_prefill >= 0 ? g_long_prefill : lp4 < half ? lp4 : half);
    if (g_long_prefill > 0 && g_long_prefill >= g_sc.max_context)
        MLA_WARN("serve: --long-prefill-tokens %ld is not below the context (%d tokens): no prompt is long",
                 g_long_prefill, g_sc.max_context);
    g_sc.block_size = (int32_t)g_kvi.block_size;
    g_sc.n_blocks = (int32_t)g_kvi.n_blocks;
    if (sched_init(&g_sched, &g_sc, &g_be, err)) return MLA_ERR;
    api_server_set_capacity(g_api, g_sc.max_context, g_kvi.rank_blocks, coord_world(g_coord), g_kvi.block_bytes);
    api_server_set_sched(g_api, g_sched);
    MLA_INFO("serve: context %d, %u cache blocks of %u, prefix cache %s, a prompt long past %d tokens left%s",
             g_sc.max_context, g_kvi.n_blocks, g_kvi.block_size, g_sc.prefix_cache ? "on" : "off",
             g_sc.long_prefill_tokens, g_sc.long_prefill_tokens ? "" : " (never)");
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
        snprintf(g_exit_msg, sizeof g_exit_msg, "%s: %s", g_start_what, err.msg);
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
            mla_err why = {{0}};
            (void)coord_healthy(g_coord, &why);
            snprintf(g_exit_msg, sizeof g_exit_msg, "the worker group failed%s: %s",
                     coord_policy(g_coord) == COORD_ON_FAILURE_EXIT ? " (--on-worker-failure exit)"
                                                                    : " and restarting it was given up",
                     why.msg[0] ? why.msg : "no reason recorded");
            MLA_ERROR("serve: %s: exiting with status 1", g_exit_msg);
            g_exit_rc = 1;
            g_draining = 1;
            g_drain_why = "the worker group failed";
            api_server_set_draining(g_api, g_exit_msg);
            if (g_pb) grpc_server_drain(g_pb);
            g_drain_deadline = uv_now(t->loop);
        }
        return;
    }
    if (api_server_inflight(g_api) == 0) {
        /* the replies of finished requests still on their way (a slow reader, a client's flow
         * control) get the rest of the drain timeout too */
        const size_t pend = http_server_out_pending(g_http) + (g_pb ? grpc_server_out_pending(g_pb) : 0);
        if (pend && uv_now(t->loop) < g_drain_deadline) {
            if (!g_drain_flush_said)
                MLA_INFO("serve: no request in flight; %zu reply bytes still to reach their clients", pend);
            g_drain_flush_said = 1;
            return;
        }
        if (pend) MLA_WARN("serve: %s: %zu reply bytes not taken by their clients", g_drain_why, pend);
        MLA_INFO("serve: no request in flight; stopping");
        serve_close(t->loop);
    } else if (!g_drain_cancelled && uv_now(t->loop) >= g_drain_deadline) {
        MLA_WARN("serve: %s: failing the %d request(s) still in flight", g_drain_why, api_server_inflight(g_api));
        static char why_req[160]; /* kept: api_server_cancel_all holds on to its reason */
        snprintf(why_req, sizeof why_req, "the server shut down before the request finished (%s)", g_drain_why);
        api_server_cancel_all(g_api, why_req);
        /* a cancel takes effect between steps: a step that hangs would hold the exit back until
         * --step-timeout-ms, so the step in flight is given up too */
        char why_step[160];
        snprintf(why_step, sizeof why_step, "the server shut down before the step finished (%s)", g_drain_why);
        if (g_coord) coord_abandon_step(g_coord, why_step);
        g_drain_cancelled = 1;
    }
}

static void on_signal(uv_signal_t *h, int signum) {
    if (g_draining) {
        MLA_WARN("serve: signal %d %s: failing what is in flight and stopping", signum,
                 g_signalled ? "again" : "during the drain");
        g_drain_why = g_signalled ? "a second signal" : "a signal during the drain";
        g_drain_deadline = 0;
    } else {
        MLA_INFO("serve: signal %d: draining (no new requests; %d in flight get up to %.1f s)", signum,
                 api_server_inflight(g_api), g_drain_timeout);
        g_draining = 1;
        char why[32];
        snprintf(why, sizeof why, "signal %d", signum);
        api_server_set_draining(g_api, why);
        if (g_pb) grpc_server_drain(g_pb);
        g_drain_deadline = uv_now(h->loop) + (uint64_t)(g_drain_timeout > 0 ? g_drain_timeout * 1000 : 0);
    }
    g_signalled = 1;
    on_watch(&g_watch);
}

static const char serve_usage[] =
    "usage: mlaserve serve -m MODEL.gguf [--tp N] [options]\n"
    "OpenAI-compatible HTTP server (and optionally the gRPC API) over N worker processes.\n"
    "SIGTERM or SIGINT drains: no new requests, those in flight get --drain-timeout seconds\n"
    "(then they fail, and a step still running is given up).\n";

/* A key as a header carries it: not empty, no blank at either end (HTTP drops those from a field
 * value, so such a key could never match), no control character, at most API_KEY_MAX bytes.
 * what: where the key came from, for the message. */
#define API_KEY_MAX 1024
static int key_check(const char *key, const char *what, mla_err *err) {
    const size_t n = strlen(key);
    if (!n) return mla_errf(err, "%s is empty: give a key, or leave it out to serve without one", what);
    if (n > API_KEY_MAX) return mla_errf(err, "%s: the key is longer than %d bytes", what, API_KEY_MAX);
    if (key[0] == ' ' || key[0] == '\t' || key[n - 1] == ' ' || key[n - 1] == '\t')
        return mla_errf(err, "%s: the key starts or ends with a blank, which no request header can carry", what);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)key[i] < 0x20 && key[i] != '\t')
            return mla_errf(err, "%s: the key holds a control character (byte %zu)", what, i);
    return MLA_OK;
}

/* The key on the first line of path (its line end dropped; NULL with err set); a file others may
 * read is refused, as ssh refuses such a private key. A line longer than the buffer is cut past
 * API_KEY_MAX, and key_check refuses it. */
static char *read_key_file(const char *path, mla_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) {
        mla_errf(err, "--api-key-file %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & S_IROTH)) {
        mla_errf(err, "--api-key-file %s is readable by others (mode %04o): `chmod o-r %s`", path,
                 (unsigned)st.st_mode & 07777, path);
        fclose(f);
        return NULL;
    }
    char buf[API_KEY_MAX + 3];
    char *line = fgets(buf, sizeof buf, f);
    const int rerr = ferror(f) ? errno : 0; /* a directory opens, then fails to read */
    fclose(f);
    if (!line) {
        if (rerr) mla_errf(err, "--api-key-file %s: %s", path, strerror(rerr));
        else mla_errf(err, "--api-key-file %s: the file is empty", path);
        return NULL;
    }
    buf[strcspn(buf, "\r\n")] = 0;
    if (!buf[0]) {
        mla_errf(err, "--api-key-file %s: the first line is empty", path);
        return NULL;
    }
    char what[600];
    snprintf(what, sizeof what, "--api-key-file %s", path);
    if (key_check(buf, what, err)) return NULL;
    return mla_xstrdup(buf);
}

static bool host_is_loopback(const char *h) {
    return !strncmp(h, "127.", 4) || !strcmp(h, "::1") || !strcmp(h, "localhost");
}

static const char *basename_of(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* A whole text file (--chat-template), at most 1 MiB, NUL-terminated (caller frees). */
static int read_text_file(const char *path, char **out, size_t *len, mla_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return mla_errf(err, "cannot open: %s", strerror(errno));
    char *b = mla_xmalloc((1u << 20) + 1);
    size_t n = fread(b, 1, (1u << 20) + 1, f);
    bool bad = ferror(f);
    fclose(f);
    if (bad || n > (1u << 20)) {
        free(b);
        return mla_errf(err, "%s", bad ? "read error" : "larger than 1 MiB");
    }
    b[n] = 0;
    *out = b;
    *len = n;
    return MLA_OK;
}

int cmd_serve(int argc, char **argv) {
    const char *host = "127.0.0.1", *api_key = getenv("MLASERVE_API_KEY");
    const char *model_name = NULL, *port_file = NULL;
    int port = 8000, proto_port = -1;
    const char *proto_port_file = NULL, *api_key_file = NULL, *tls_cert = NULL, *tls_key = NULL;
    int special_in_messages = 0, no_access_log = 0;
    const char *reasoning_parser = "auto", *tool_parser = "auto", *chat_template_file = NULL;
    char *chat_template_src = NULL;
    char *key_owned = NULL;
    long idle_timeout_ms = -1, request_timeout_ms = -1, write_timeout_ms = -1;
    long max_context = 0, max_seqs = 32, step_tokens = 2048, max_queue = 256, long_prefill = -1, default_max_tokens = 0,
         auth_max_fails = API_AUTH_MAX_FAILS;
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
        {.name = "--host", .kind = OPT_STR, .arg = "HOST", .def = "127.0.0.1", .help = "HTTP (and gRPC) bind address (an IPv4 or IPv6 address; localhost: 127.0.0.1)",
         .dest = &host},
        {.name = "--port", .kind = OPT_INT, .arg = "PORT", .def = "8000", .help = "HTTP port (0: any free port)",
         .dest = &port, .lo = 0, .hi = 65535},
        {.name = "--api-key", .kind = OPT_STR, .arg = "KEY", .def = "$MLASERVE_API_KEY, else none",
         .help = "key clients send as `Authorization: Bearer KEY` (/health and /metrics need none)", .dest = &api_key},
        {.name = "--api-key-file", .kind = OPT_STR, .arg = "FILE", .def = "none",
         .help = "the key from the file's first line (keeps it out of the process list)", .dest = &api_key_file},
        {.name = "--auth-max-failures", .kind = OPT_LONG, .arg = "N", .def = "10",
         .help = "wrong keys from one client address within 10 s before every request from it gets 429 for the "
                 "rest of them, the right key too (0: never; behind a proxy all clients share its address)",
         .dest = &auth_max_fails, .lo = 0, .hi = 1L << 20},
        {.name = "--allow-special-in-messages", .kind = OPT_FLAG,
         .help = "control-token text inside chat messages becomes control tokens (trusted clients only)",
         .dest = &special_in_messages},
        {.name = "--chat-template", .kind = OPT_STR, .arg = "FILE", .def = "the GGUF's tokenizer.chat_template",
         .help = "render chat requests with this Jinja template instead", .dest = &chat_template_file},
        {.name = "--reasoning-parser", .kind = OPT_STR, .arg = "NAME", .def = "auto",
         .help = "reasoning_content from <think> blocks: auto (by the chat template), none, deepseek-r1, "
                 "deepseek-v3.1, glm, kimi-k2 (docs/chat-dialects.md)",
         .dest = &reasoning_parser},
        {.name = "--tool-parser", .kind = OPT_STR, .arg = "NAME", .def = "auto",
         .help = "tool_calls from the model's output: auto (by the chat template), none, deepseek, kimi-k2, glm",
         .dest = &tool_parser},
        {.name = "--idle-timeout-ms", .kind = OPT_LONG, .arg = "N", .def = "60000",
         .help = "idle connections (HTTP and gRPC) are closed after N ms", .dest = &idle_timeout_ms, .lo = 1,
         .hi = 86400000},
        {.name = "--request-timeout-ms", .kind = OPT_LONG, .arg = "N", .def = "30000 (HTTP headers: 10000)",
         .help = "an HTTP request not complete N ms after its first byte is refused",
         .dest = &request_timeout_ms, .lo = 1, .hi = 86400000},
        {.name = "--write-timeout-ms", .kind = OPT_LONG, .arg = "N", .def = "30000",
         .help = "a client that takes none of a reply held for it for N ms is dropped (HTTP: past the write queue; "
                 "gRPC: any reply, its flow-control window shut included)",
         .dest = &write_timeout_ms, .lo = 1, .hi = 86400000},
        {.name = "--model-name", .kind = OPT_STR, .arg = "NAME[,ALIAS...]", .def = "the file name",
         .help = "the model's name in the API; names after a comma are aliases a request may give too (answers "
                 "carry the first; /v1/models lists each)",
         .dest = &model_name},
        {.name = "--max-context", .kind = OPT_LONG, .arg = "N", .def = "the model's, or what the cache pool holds",
         .help = "longest sequence (prompt + generated tokens; 0: the default)", .dest = &max_context, .lo = 0,
         .hi = WIRE_MAX_CTX},
        {.name = "--default-max-tokens", .kind = OPT_LONG, .arg = "N", .def = "0",
         .help = "the answer's token limit where a request sets no max_tokens (0: what the context leaves)",
         .dest = &default_max_tokens, .lo = 0, .hi = WIRE_MAX_CTX},
        {.name = "--max-seqs", .kind = OPT_LONG, .arg = "N", .def = "32", .help = "sequences in the running batch",
         .dest = &max_seqs, .lo = 1, .hi = WIRE_MAX_SEQS},
        {.name = "--max-prefill-tokens", .kind = OPT_LONG, .arg = "N", .def = "2048",
         .help = "tokens a step may carry: longer prompts are prefilled in chunks beside the running decodes",
         .dest = &step_tokens, .lo = 1, .hi = WIRE_MAX_STEP_TOKENS},
        {.name = "--long-prefill-tokens", .kind = OPT_LONG, .arg = "N",
         .def = "4 x --max-prefill-tokens, at most half the context",
         .help = "a prompt with more than N tokens left to prefill takes at most half of each step while other "
                 "requests are in line, so that it does not hold them back for its whole prefill (0: never)",
         .dest = &long_prefill, .lo = 0, .hi = WIRE_MAX_CTX},
        {.name = "--no-access-log", .kind = OPT_FLAG,
         .help = "no log line for each HTTP response (client, method, path, status, time; at --log-level debug still)",
         .dest = &no_access_log},
        {.name = "--no-prefix-cache", .kind = OPT_FLAG,
         .help = "every request prefills its whole prompt (no sharing of cached blocks)", .dest = &no_prefix_cache},
        {.name = "--max-queue", .kind = OPT_LONG, .arg = "N", .def = "256",
         .help = "requests waiting for admission past the batch's free places (--max-seqs) before new ones get 429",
         .dest = &max_queue, .lo = 1, .hi = 1L << 24},
        {.name = "--max-body", .kind = OPT_LONG, .arg = "BYTES", .def = "4194304", .help = "largest HTTP request body",
         .dest = &max_body, .lo = 1, .hi = 1L << 34},
        {.name = "--max-conns", .kind = OPT_INT, .arg = "N", .def = "1024",
         .help = "open connections at most, on each port (idle ones make room for new ones; 8 more take only "
                 "/health and /metrics)",
         .dest = &hc.max_conns, .lo = 1, .hi = 1 << 24},
        {.name = "--cors-origins", .kind = OPT_STR, .arg = "LIST", .def = "none",
         .help = "browsers from these origins may call the HTTP API (comma-separated, e.g. "
                 "https://ui.example:8443; * any): CORS headers and preflights (docs/api.md)",
         .dest = &hc.cors_origins},
        {.name = "--port-file", .kind = OPT_STR, .arg = "FILE", .def = "none",
         .help = "write the HTTP port here once the server is ready (the model loaded)", .dest = &port_file},
        {.name = "--proto-port", .kind = OPT_INT, .arg = "PORT", .def = "off",
         .help = "serve the gRPC API (docs/grpc.md) on this port (0: any free port), same host and key",
         .dest = &proto_port, .lo = 0, .hi = 65535},
        {.name = "--tls-cert", .kind = OPT_STR, .arg = "FILE", .def = "none (plain h2c)",
         .help = "the gRPC port speaks TLS with this PEM certificate chain (needs --tls-key)", .dest = &tls_cert},
        {.name = "--tls-key", .kind = OPT_STR, .arg = "FILE", .def = "none", .help = "the PEM private key of --tls-cert",
         .dest = &tls_key},
        {.name = "--proto-port-file", .kind = OPT_STR, .arg = "FILE", .def = "none",
         .help = "write the gRPC port here once ready (needs --proto-port)", .dest = &proto_port_file},
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
    if ((tls_cert || tls_key) && (proto_port < 0 || !tls_cert || !tls_key)) {
        fprintf(stderr, "mlaserve serve: --tls-cert and --tls-key go together, with --proto-port\n");
        return 2;
    }
    hc.lim.max_body = (size_t)max_body;
    const char *model = go.model;
    const int tp = go.tp;
    coord_config cc = go.cc;
    if (api_key) { /* an unset variable expanded (empty): never an open server by accident */
        mla_err kerr;
        if (key_check(api_key, api_key == getenv("MLASERVE_API_KEY") ? "MLASERVE_API_KEY" : "--api-key", &kerr)) {
            fprintf(stderr, "mlaserve serve: %s\n", kerr.msg);
            return 2;
        }
    }
    if (api_key && api_key != getenv("MLASERVE_API_KEY")) {
        /* out of /proc/PID/cmdline from now on (--api-key-file avoids even the start) */
        api_key = key_owned = mla_xstrdup(api_key);
        for (int i = 1; i < argc; i++)
            if (!strncmp(argv[i], "--api-key", 9) && argv[i][9] != '-') {
                char *v = argv[i][9] == '=' ? argv[i] + 10 : i + 1 < argc ? argv[i + 1] : NULL;
                if (v) memset(v, 'x', strlen(v));
            }
    }
    grpc_config pc;
    grpc_config_default(&pc);
    pc.max_conns = hc.max_conns; /* --max-conns: per port */
    pc.tls_cert = tls_cert;
    pc.tls_key = tls_key;
    if (idle_timeout_ms > 0) hc.idle_timeout_ms = pc.idle_timeout_ms = (unsigned)idle_timeout_ms;
    if (write_timeout_ms > 0) hc.write_timeout_ms = pc.stall_timeout_ms = (unsigned)write_timeout_ms;
    if (request_timeout_ms > 0) {
        hc.request_timeout_ms = (unsigned)request_timeout_ms;
        if (hc.header_timeout_ms > hc.request_timeout_ms) hc.header_timeout_ms = hc.request_timeout_ms;
    }
    if (!uvnet_host_ok(host)) { /* what the listeners will take: refused here, before anything starts */
        free(key_owned);
        fprintf(stderr, "mlaserve serve: --host '%s' is not an IPv4 or IPv6 address (or localhost; an IPv6 "
                        "address without brackets)\n", host);
        return 2;
    }
    mla_err cerr;
    if (hc.cors_origins && !strcmp(hc.cors_origins, "none")) hc.cors_origins = NULL; /* the default, spelled out */
    if (http_cors_origins_check(hc.cors_origins, &cerr)) { /* before the model loads */
        free(key_owned);
        fprintf(stderr, "mlaserve serve: %s\n", cerr.msg);
        return 2;
    }
    if (proto_port > 0 && proto_port == port) {
        free(key_owned);
        fprintf(stderr, "mlaserve serve: --port and --proto-port are both %d (HTTP and gRPC need a port each)\n", port);
        return 2;
    }
    if (api_key_file && key_owned) { /* the file would win silently over a key given beside it */
        free(key_owned);
        fprintf(stderr, "mlaserve serve: --api-key and --api-key-file exclude each other (give one)\n");
        return 2;
    }
    if (api_key_file) {
        mla_err kerr;
        api_key = key_owned = read_key_file(api_key_file, &kerr);
        if (!api_key) {
            fprintf(stderr, "mlaserve serve: %s\n", kerr.msg);
            return 2;
        }
    }
    {
        struct rlimit rl;
        /* each connection is a descriptor; the workers' links and files need some too */
        long need = (long)hc.max_conns * (proto_port >= 0 ? 2 : 1) + SERVE_PROBE_CONNS + 64;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (long)rl.rlim_cur < need)
            MLA_WARN("serve: the open-file limit is %ld but --max-conns %d%s needs about %ld descriptors: past the "
                     "limit new connections fail to be accepted (raise it with ulimit -n or LimitNOFILE=)",
                     (long)rl.rlim_cur, hc.max_conns, proto_port >= 0 ? " on each of two ports" : "", need);
    }
    signal(SIGPIPE, SIG_IGN);
    mla_log_set_tag("coord");
    mla_err err = {{0}};
    serve_adapt S = {0};
    gguf_ctx *g = NULL;
    api_server *api = NULL;
    http_server *http = NULL;
    grpc_server *pb = NULL;
    uv_loop_t *loop = uv_default_loop();
    int rc = 1;
    bool loop_ran = false;

    {
        const char *const pf[2] = {proto_port_file, port_file};
        if (prepare_port_files(pf, &err)) goto out;
    }
    if (gguf_open(&g, model, &err)) goto out;
    if (tok_vocab_from_gguf(&S.vocab, g, &err)) goto out;
    if (chat_template_file) {
        size_t tlen = 0;
        if (read_text_file(chat_template_file, &chat_template_src, &tlen, &err) ||
            chat_tmpl_from_gguf_src(&S.tmpl, g, S.vocab, chat_template_src, tlen, &err)) {
            mla_err_prefix(&err, "--chat-template %s", chat_template_file);
            goto out;
        }
    } else if (chat_tmpl_from_gguf(&S.tmpl, g, S.vocab, &err)) {
        MLA_WARN("serve: no chat template (%s); /v1/chat/completions is off", err.msg);
        S.tmpl = NULL;
    } else if (chat_tmpl_prefix(S.tmpl, &S.prefix, &err)) {
        MLA_WARN("serve: chat template prefix: %s", err.msg);
        S.prefix = NULL;
    }
    int rk = 0, tk = 0;
    if (chat_tmpl_parsers(S.tmpl, reasoning_parser, tool_parser, &rk, &tk, &err)) goto out;
    MLA_INFO("serve: reasoning parser %s, tool-call parser %s", reasoning_kind_name(rk), toolcall_kind_name(tk));
    /* refuse a model or a tensor-parallel degree that cannot work before starting workers */
    mla_config mcfg;
    if (coord_check_model(g, tp, &mcfg, &err)) {
        mla_err_prefix(&err, "%s", model);
        goto out;
    }
    /* a tokenizer longer than the model's vocabulary (some Kimi-K2 files: 163842 tokens, 163840 rows):
     * text holding one of the tokens past it is refused request by request */
    if ((int64_t)tok_n_tokens(S.vocab) > mcfg.n_vocab)
        MLA_WARN("serve: the tokenizer holds %zu tokens, the model %lld: a prompt that tokenizes to one of ids %lld.. "
                 "is refused",
                 tok_n_tokens(S.vocab), (long long)mcfg.n_vocab, (long long)mcfg.n_vocab);
    /* the model's context length, unless a shorter one is asked for */
    const long ctx_len = (long)mcfg.ctx_train;
    if (ctx_len > 0 && max_context > ctx_len) {
        mla_errf(&err, "--max-context %ld is beyond the model's context length %ld", max_context, ctx_len);
        goto out;
    }
    if (max_context == 1) { /* a prompt of one token and nothing to generate */
        mla_errf(&err, "--max-context 1 leaves no room to generate (0: the model's context; else at least 2)");
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
    S.seed_base = (uint64_t)time(NULL) * 0x2545F4914F6CDD1DULL;
    api_tokenizer tok = serve_adapt_tokenizer(&S, (int32_t)mcfg.n_vocab);
    /* --model-name NAME,ALIAS...: the name before the first comma, the aliases after it */
    char *name_given = model_name ? mla_xstrdup(model_name) : NULL, *aliases = NULL;
    if (name_given && (aliases = strchr(name_given, ','))) *aliases++ = 0;
    api_config ac = {.model_name = name_given ? name_given : basename_of(model), .model_aliases = aliases,
                     .api_key = api_key,
                     .special_in_messages = special_in_messages,
                     .max_context = (int32_t)max_context, .default_max_tokens = (int32_t)default_max_tokens,
                     .auth_max_fails = auth_max_fails ? (int32_t)auth_max_fails : -1, .tp = tp};
    serve_adapt_api_hooks(&S, &ac);
    ac.reasoning_parser = rk;
    ac.tool_parser = tk;
    const int api_rc = api_server_new(&api, loop, &ac, &tok, &err); /* it keeps copies of the names */
    free(name_given);
    if (api_rc) goto out;
    S.api = api;
    /* the scheduler starts once the workers report their pools (check_start) */
    g_long_prefill = long_prefill;
    g_sc = (sched_config){.prefix_cache = !no_prefix_cache, .decode_lookahead = true,
                          .max_seqs = (int32_t)max_seqs, .max_step_tokens = (int32_t)step_tokens,
                          .max_queue = (int32_t)max_queue, .max_context = (int32_t)max_context,
                          .hold_until = (int32_t)mla_sw_int(MLA_SW_SCHED_HOLD),
                          .is_eog = serve_adapt_is_eog, .eog_ctx = &S, .on_event = api_server_on_event, .cb_ctx = api};
    g_be = serve_adapt_backend(&S);
    hc.early = api_server_early;
    hc.error_form = api_server_error_form;
    hc.access_log = !no_access_log;
    /* a full server still answers its probes (a liveness probe that got a 503 would restart it) */
    static const char *const probes[] = {"/health", "/metrics", NULL};
    hc.probe_paths = probes;
    hc.probe_conns = SERVE_PROBE_CONNS;
    if (http_server_init(&http, loop, &hc, api_server_handle, api, &err)) goto out;
    api_server_set_http(api, http);
    g_http = http;
    int bound = 0;
    if (http_server_listen(http, host, port, &bound, &err)) goto out;
    /* once the address is known good (a bad one is refused above, without this warning first) */
    if (!host_is_loopback(host) && !api_key)
        MLA_WARN("serve: listening on %s without an API key: anyone who can reach this address can use the "
                 "model (give --api-key-file F or MLASERVE_API_KEY)", host);
    int pb_bound = -1;
    if (proto_port >= 0) {
        if (grpc_server_init(&pb, loop, api, &pc, &err)) goto out;
        g_pb = pb;
        if (grpc_server_listen(pb, host, proto_port, &pb_bound, &err)) goto out;
    }
    /* the workers start once the ports are ours: a port in use, a bad --host fail before any is
     * spawned (nothing is served before the loop runs) */
    coord_start_what(g_start_what, sizeof g_start_what, tp, cc.external);
    if (coord_start(&S.c, &cc, &err)) {
        mla_err_prefix(&err, "%s", g_start_what);
        goto out;
    }
    g_ports = (serve_ports){{proto_port_file, port_file}, {pb_bound, bound}, {-1, -1}};
    char at[80];
    uvnet_addr_text(at, sizeof at, host, pb_bound);
    if (pb) MLA_INFO("serve: gRPC API on %s%s", at, tls_cert ? " (TLS)" : "");
    uvnet_addr_text(at, sizeof at, host, bound);
    MLA_INFO("serve: %s on http://%s (tp %d, prefix cache %s); the workers load the model (GET /health: their "
             "progress; 503 until ready)",
             api_server_model_name(api), at, tp, no_prefix_cache ? "off" : "on");
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
    remove_port_files();
    if (http && !loop_ran) http_server_close(http);
    if (pb && !loop_ran) grpc_server_close(pb);
    if (api) api_server_drain(api);
    if (g_sched) {
        sched_stop(g_sched);
        sched_free(g_sched);
        g_sched = NULL;
    }
    if (pb) grpc_server_free(pb);
    g_pb = NULL;
    if (api) api_server_free(api);
    if (http) http_server_free(http);
    uv_run(loop, UV_RUN_NOWAIT);
    uv_loop_close(loop);
    if (S.c) coord_stop(S.c);
    serve_adapt_free(&S);
    free(chat_template_src);
    if (g) gguf_close(g);
    free(key_owned);
    return rc;
}
