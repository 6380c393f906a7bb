/* fake_server: the real HTTP server, API and scheduler over the deterministic fake backend
 * (fake_backend.h) and a byte-level fake tokenizer, for the HTTP tests (tests/serve/test_http.py).
 *
 * Fake tokenizer: ids 0..255 are the bytes, 256 "<|eos|>" (end of generation), 257 "<|bos|>"
 * (added in front when add_special; both are special and parsed from text when parse_special).
 * Fake chat template: "<|bos|>" then "<|ROLE|>CONTENT\n" per message, then "<|assistant|>"
 * when add_generation_prompt (content parts are concatenated).
 *
 * Options: --port-file F (the bound port is written there), --port P (default 0: a free port),
 * --api-key K (or MLASERVE_API_KEY), --max-context N, --block-size N, --n-blocks N, --prefix-cache 0/1,
 * --max-seqs N, --step-tokens N, --max-queue N, --eos-period N, --step-delay-ms N,
 * --max-body N, --max-conns N, --probe-conns N, --request-timeout-ms N, --idle-timeout-ms N,
 * --write-timeout-ms N, --max-write-queue N, --header-timeout-ms N, --max-body-total N,
 * --tok-delay-ms N (each encode sleeps N ms), --health-file F (unhealthy while F exists),
 * --proto-port-file F (the gRPC API on a free port, written to F),
 * --fail-at-step N, --script-file F (a scripted model: fake_backend.h), --chat-template FILE (chat
 * requests rendered by coordinator/chat_tmpl with this Jinja template instead of the fake
 * format), --reasoning-parser NAME, --tool-parser NAME (as mlaserve serve's). The vocabulary has
 * bytes 0..255, EOS, BOS and, from FAKE_VOCAB on, the marker texts of MARKERS as control tokens
 * (so the chat parsers see them through the control-token path; as the real tokenizers do, encode
 * turns their texts into those tokens where it parses special tokens). SIGTERM / SIGINT shut it down cleanly. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <uv.h>

#include "common/mla_log.h"
#include "coordinator/api_server.h"
#include "coordinator/chat.h"
#include "coordinator/http_server.h"
#include "coordinator/grpc_server.h"
#include "coordinator/sched_batch.h"
#include "fake_backend.h"

static const char *SPECIAL[2] = {"<|eos|>", "<|bos|>"};

static int g_tok_delay_ms;
static chat_tmpl *g_tmpl;

/* control tokens FAKE_VOCAB + i: the markers of the chat dialects (reasoning, tool calls) */
static const char *const MARKERS[] = {
    "<think>", "</think>",
    "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "begin\xEF\xBD\x9C>",
    "<\xEF\xBD\x9Ctool\xE2\x96\x81" "calls\xE2\x96\x81" "end\xEF\xBD\x9C>",
    "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "begin\xEF\xBD\x9C>",
    "<\xEF\xBD\x9Ctool\xE2\x96\x81" "call\xE2\x96\x81" "end\xEF\xBD\x9C>",
    "<\xEF\xBD\x9Ctool\xE2\x96\x81sep\xEF\xBD\x9C>",
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>", "<|tool_call_end|>",
    "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
};
#define N_MARKERS ((int32_t)(sizeof MARKERS / sizeof *MARKERS))

/* the marker at text[pos] (its index, its length in *ml), else -1 */
static int fk_marker_at(const char *text, size_t len, size_t pos, size_t *ml) {
    for (int q = 0; q < N_MARKERS; q++) {
        const size_t l = strlen(MARKERS[q]);
        if (len - pos >= l && !memcmp(text + pos, MARKERS[q], l)) {
            *ml = l;
            return q;
        }
    }
    return -1;
}

static size_t fk_control_at(void *ctx, const char *text, size_t len, size_t pos) {
    (void)ctx;
    for (int k = 0; k < 2; k++)
        if (len - pos >= 7 && !memcmp(text + pos, SPECIAL[k], 7)) return 7;
    size_t ml = 0;
    return fk_marker_at(text, len, pos, &ml) >= 0 ? ml : 0;
}

static int fk_encode(void *ctx, const char *text, size_t len, bool add_special, bool parse_special,
                     const size_t *plain, size_t n_plain, int32_t **ids, int32_t *n, mla_err *err) {
    (void)ctx;
    (void)err;
    if (g_tok_delay_ms > 0) uv_sleep((unsigned)g_tok_delay_ms); /* a slow tokenizer (--tok-delay-ms) */
    *ids = mla_xmalloc((len + 1) * sizeof(int32_t));
    *n = 0;
    if (add_special) (*ids)[(*n)++] = FAKE_BOS;
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        int sp = -1;
        while (k < n_plain && plain[2 * k + 1] <= i) k++;
        bool near_plain = k < n_plain && plain[2 * k] < i + 7;
        for (int q = 0; parse_special && !near_plain && q < 2; q++)
            if (len - i >= 7 && !memcmp(text + i, SPECIAL[q], 7)) sp = q;
        size_t ml = 0;
        const int mk = parse_special && sp < 0 ? fk_marker_at(text, len, i, &ml) : -1;
        if (mk >= 0 && !(k < n_plain && plain[2 * k] < i + ml)) { /* a marker: its control token */
            (*ids)[(*n)++] = FAKE_VOCAB + mk;
            i += ml;
        } else if (sp >= 0) {
            (*ids)[(*n)++] = 256 + sp;
            i += 7;
        } else {
            (*ids)[(*n)++] = (unsigned char)text[i++];
        }
    }
    return MLA_OK;
}

static const char *fk_piece(void *ctx, int32_t id, size_t *len) {
    static char bytes[256];
    static int init = 0;
    (void)ctx;
    if (!init) {
        for (int i = 0; i < 256; i++) bytes[i] = (char)i;
        init = 1;
    }
    if (id >= 0 && id < 256) {
        *len = 1;
        return &bytes[id];
    }
    if (id == 256 || id == 257) {
        *len = 7;
        return SPECIAL[id - 256];
    }
    if (id >= FAKE_VOCAB && id < FAKE_VOCAB + N_MARKERS) {
        *len = strlen(MARKERS[id - FAKE_VOCAB]);
        return MARKERS[id - FAKE_VOCAB];
    }
    *len = 0;
    return NULL;
}

static bool fk_special(void *ctx, int32_t id) {
    (void)ctx;
    return id == 256 || id == 257 || (id >= FAKE_VOCAB && id < FAKE_VOCAB + N_MARKERS);
}
static bool fk_eog(void *ctx, int32_t id) {
    (void)ctx;
    return id == FAKE_EOS;
}

static void sb_add(char **s, size_t *n, size_t *cap, const char *t, size_t l) {
    if (*n + l + 1 > *cap) {
        *cap = (*n + l + 1) * 2;
        *s = mla_xrealloc(*s, *cap);
    }
    memcpy(*s + *n, t, l);
    *n += l;
    (*s)[*n] = 0;
}

static int fk_chat(void *ctx, const cJSON *messages, bool add_gen, const cJSON *vars, char **out, mla_err *err) {
    (void)ctx;
    (void)err;
    if (g_tmpl) return chat_tmpl_apply_json(g_tmpl, messages, add_gen, vars, out, NULL, NULL, err);
    char *s = NULL;
    size_t n = 0, cap = 0;
    sb_add(&s, &n, &cap, "<|bos|>", 7);
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        const char *role = cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring;
        sb_add(&s, &n, &cap, "<|", 2);
        sb_add(&s, &n, &cap, role, strlen(role));
        sb_add(&s, &n, &cap, "|>", 2);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (cJSON_IsString(c)) {
            sb_add(&s, &n, &cap, c->valuestring, strlen(c->valuestring));
        } else if (cJSON_IsArray(c)) {
            const cJSON *part;
            cJSON_ArrayForEach(part, c) {
                const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
                sb_add(&s, &n, &cap, t, strlen(t));
            }
        }
        sb_add(&s, &n, &cap, "\n", 1);
    }
    if (add_gen) sb_add(&s, &n, &cap, "<|assistant|>", 13);
    *out = s;
    return MLA_OK;
}

static bool fk_uses_var(void *ctx, const char *name) {
    (void)ctx;
    return g_tmpl && chat_tmpl_uses_var(g_tmpl, name);
}

static const char *health_file;
static bool fk_health(void *ctx, char *why, size_t cap) {
    (void)ctx;
    struct stat st;
    if (health_file && stat(health_file, &st) == 0) {
        snprintf(why, cap, "worker 1 is down (test)");
        return false;
    }
    return true;
}

static uv_signal_t sig_term, sig_int;
static http_server *g_http;
static grpc_server *g_pb;
static void on_signal(uv_signal_t *h, int signum) {
    (void)h;
    MLA_INFO("fake_server: signal %d, shutting down", signum);
    http_server_close(g_http);
    if (g_pb) grpc_server_close(g_pb);
    uv_close((uv_handle_t *)&sig_term, NULL);
    uv_close((uv_handle_t *)&sig_int, NULL);
    uv_stop(h->loop);
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    mla_log_set_tag("fake_server");
    const char *port_file = NULL, *proto_port_file = NULL, *api_key = getenv("MLASERVE_API_KEY");
    const char *model_aliases = NULL;
    int port = 0;
    sched_config sc = {.block_size = 16, .n_blocks = 512, .max_seqs = 64, .max_step_tokens = 512,
                       .max_queue = 256, .max_context = 2048};
    fake_config fc = {.eos_period = 0, .step_delay_ms = 0, .fail_at_step = -1};
    http_server_config hc;
    http_server_config_default(&hc);
    const char *tmpl_file = NULL, *rparser = "auto", *tparser = "auto";
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "fake_server: %s needs a value\n", a);
            return 2;
        }
        long long x = atoll(v);
        if (!strcmp(a, "--port-file")) port_file = v;
        else if (!strcmp(a, "--proto-port-file")) proto_port_file = v;
        else if (!strcmp(a, "--port")) port = (int)x;
        else if (!strcmp(a, "--api-key")) api_key = v;
        else if (!strcmp(a, "--model-aliases")) model_aliases = v;
        else if (!strcmp(a, "--max-context")) sc.max_context = (int32_t)x;
        else if (!strcmp(a, "--block-size")) sc.block_size = (int32_t)x;
        else if (!strcmp(a, "--n-blocks")) sc.n_blocks = (int32_t)x;
        else if (!strcmp(a, "--prefix-cache")) sc.prefix_cache = x != 0;
        else if (!strcmp(a, "--max-seqs")) sc.max_seqs = (int32_t)x;
        else if (!strcmp(a, "--step-tokens")) sc.max_step_tokens = (int32_t)x;
        else if (!strcmp(a, "--long-prefill-tokens")) sc.long_prefill_tokens = (int32_t)x;
        else if (!strcmp(a, "--max-queue")) sc.max_queue = (int32_t)x;
        else if (!strcmp(a, "--eos-period")) fc.eos_period = (uint32_t)x;
        else if (!strcmp(a, "--step-delay-ms")) fc.step_delay_ms = (int)x;
        else if (!strcmp(a, "--fail-at-step")) fc.fail_at_step = x;
        else if (!strcmp(a, "--max-body")) hc.lim.max_body = (size_t)x;
        else if (!strcmp(a, "--max-conns")) hc.max_conns = (int)x;
        else if (!strcmp(a, "--probe-conns")) { /* as serve: /health and /metrics past --max-conns */
            static const char *const probes[] = {"/health", "/metrics", NULL};
            hc.probe_paths = probes;
            hc.probe_conns = (int)x;
        }
        else if (!strcmp(a, "--request-timeout-ms")) hc.request_timeout_ms = (unsigned)x;
        else if (!strcmp(a, "--idle-timeout-ms")) hc.idle_timeout_ms = (unsigned)x;
        else if (!strcmp(a, "--write-timeout-ms")) hc.write_timeout_ms = (unsigned)x;
        else if (!strcmp(a, "--max-write-queue")) hc.max_write_queue = (size_t)x;
        else if (!strcmp(a, "--header-timeout-ms")) hc.header_timeout_ms = (unsigned)x;
        else if (!strcmp(a, "--tok-delay-ms")) g_tok_delay_ms = (int)x;
        else if (!strcmp(a, "--max-body-total")) hc.max_body_total = (size_t)x;
        else if (!strcmp(a, "--cors-origins")) hc.cors_origins = v;
        else if (!strcmp(a, "--health-file")) health_file = v;
        else if (!strcmp(a, "--script-file")) fc.script_file = v;
        else if (!strcmp(a, "--chat-template")) tmpl_file = v;
        else if (!strcmp(a, "--reasoning-parser")) rparser = v;
        else if (!strcmp(a, "--tool-parser")) tparser = v;
        else if (!strcmp(a, "--log-level")) {
            enum mla_log_level lvl;
            mla_err le;
            if (mla_log_level_parse(v, &lvl, &le)) {
                fprintf(stderr, "fake_server: %s\n", le.msg);
                return 2;
            }
            mla_log_set_level(lvl);
        }
        else {
            fprintf(stderr, "fake_server: unknown option %s\n", a);
            return 2;
        }
    }
    fc.n_blocks = sc.n_blocks;
    fc.block_size = sc.block_size;
    uv_loop_t *loop = uv_default_loop();
    mla_err err;
    int rk = 0, tk = 0;
    if (tmpl_file) {
        FILE *tf = fopen(tmpl_file, "rb");
        static char src[1 << 20];
        size_t sl = tf ? fread(src, 1, sizeof src - 1, tf) : 0;
        if (tf) fclose(tf);
        if (!sl) {
            mla_errf(&err, "cannot read %s", tmpl_file);
            goto fail;
        }
        if (chat_tmpl_new(&g_tmpl, src, sl, CHAT_FAMILY_NONE, "<|bos|>", "<|eos|>", &err)) goto fail;
    }
    if (chat_tmpl_parsers(g_tmpl, rparser, tparser, &rk, &tk, &err)) goto fail;
    fake_backend *fb = fake_backend_new(&fc);
    sched_backend be;
    fake_backend_bind(fb, &be);
    api_tokenizer tok = {.ctx = NULL, .n_vocab = FAKE_VOCAB + N_MARKERS, .encode = fk_encode, .piece = fk_piece,
                         .is_special = fk_special, .is_eog = fk_eog, .render_chat = fk_chat,
                         .control_at = fk_control_at, .chat_uses_var = fk_uses_var};
    api_config ac = {.model_name = "fake-model", .model_aliases = model_aliases, .api_key = api_key,
                     .max_context = sc.max_context,
                     .health = fk_health, .reasoning_parser = rk, .tool_parser = tk};
    api_server *api;
    sched *s;
    http_server *http;
    if (api_server_new(&api, loop, &ac, &tok, &err)) goto fail;
    sc.is_eog = fk_eog;
    sc.on_event = api_server_on_event;
    sc.cb_ctx = api;
    if (sched_init(&s, &sc, &be, &err)) goto fail;
    api_server_set_sched(api, s);
    hc.early = api_server_early;
    hc.error_form = api_server_error_form;
    if (http_server_init(&http, loop, &hc, api_server_handle, api, &err)) goto fail;
    api_server_set_http(api, http);
    g_http = http;
    int bound = 0;
    if (http_server_listen(http, "127.0.0.1", port, &bound, &err)) goto fail;
    int pb_bound = 0;
    grpc_server *pb = NULL;
    if (proto_port_file) {
        if (grpc_server_init(&pb, loop, api, NULL, &err) || grpc_server_listen(pb, "127.0.0.1", 0, &pb_bound, &err))
            goto fail;
        g_pb = pb;
    }
    if (sched_start(s, &err)) goto fail;
    uv_signal_init(loop, &sig_term);
    uv_signal_init(loop, &sig_int);
    uv_signal_start(&sig_term, on_signal, SIGTERM);
    uv_signal_start(&sig_int, on_signal, SIGINT);
    const char *pfiles[2] = {proto_port_file, port_file}; /* the HTTP port file last: it means ready */
    const int pports[2] = {pb_bound, bound};
    for (int k = 0; k < 2; k++) {
        if (!pfiles[k]) continue;
        char tmp[4096];
        snprintf(tmp, sizeof(tmp), "%s.tmp", pfiles[k]);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", pports[k]) < 0 || fclose(f) != 0 || rename(tmp, pfiles[k]) != 0) {
            mla_errf(&err, "cannot write %s", pfiles[k]);
            goto fail;
        }
    }
    printf("PORT %d\n", bound);
    fflush(stdout);
    uv_run(loop, UV_RUN_DEFAULT);
    api_server_drain(api);
    sched_stop(s);
    sched_free(s);
    grpc_server_free(pb);
    api_server_free(api);
    http_server_free(http);
    uv_run(loop, UV_RUN_NOWAIT);
    uv_loop_close(loop);
    fake_backend_free(fb);
    chat_tmpl_free(g_tmpl);
    MLA_INFO("fake_server: stopped");
    return 0;
fail:
    fprintf(stderr, "fake_server: %s\n", err.msg);
    return 1;
}
