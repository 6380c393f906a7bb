/* cmd_client: see cmd_client.h. */
#include "coordinator/cmd_client.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/apiclient.h"
#include "common/mla_err.h"
#include "common/mla_log.h"
#include "common/opts.h"

static const char client_usage[] =
    "usage: mlaserve client [--host H] --port P [--api-key K] [--timeout S] [--tls [--tls-ca F]] COMMAND [options]\n"
    "gRPC client (of `mlaserve serve --proto-port P`, docs/grpc.md). Commands:\n"
    "  generate -p TEXT [options]   generate (mlaserve client generate --help)\n"
    "  tokenize TEXT [--no-special] token ids of TEXT\n"
    "  health                       the server's health (exit status 1 when unhealthy)\n"
    "  models                       the model served and its context length\n"
    "  info                         the server's version and build, the model, the largest request\n";

typedef struct gen_out {
    bool stream, json;
    size_t streamed; /* text bytes printed by on_token */
} gen_out;

static int on_token(void *ud, const apiclient_token *t) {
    gen_out *o = ud;
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "index", t->index);
        cJSON_AddNumberToObject(j, "id", t->id);
        cJSON_AddStringToObject(j, "text", t->text);
        if (t->has_logprob) cJSON_AddNumberToObject(j, "logprob", t->logprob);
        if (t->n_top) {
            cJSON *a = cJSON_AddArrayToObject(j, "top_logprobs");
            for (size_t k = 0; k < t->n_top; k++) {
                cJSON *p = cJSON_CreateArray();
                cJSON_AddItemToArray(p, cJSON_CreateNumber(t->top_ids[k]));
                cJSON_AddItemToArray(p, cJSON_CreateNumber(t->top_logprobs[k]));
                cJSON_AddItemToArray(a, p);
            }
        }
        char *s = cJSON_PrintUnformatted(j);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(j);
        fflush(stdout);
    } else if (o->stream) {
        fwrite(t->text, 1, t->text_len, stdout);
        o->streamed += t->text_len;
        fflush(stdout);
    }
    return 0;
}

typedef struct stop_list {
    const char *v[16];
    size_t n;
} stop_list;

static int add_stop(void *ctx, const char *v, mla_err *err) {
    stop_list *l = ctx;
    if (l->n >= 16) return mla_errf(err, "at most 16 stop strings");
    l->v[l->n++] = v;
    return MLA_OK;
}

/* generate's options, then the call on c; with c NULL the options alone (before connecting:
 * --help and mistakes answered without a server): -1 when they are good */
static int do_generate(apiclient *c, int argc, char **argv) {
    apiclient_gen_params p = {0};
    gen_out o = {0};
    stop_list stops = {{0}, 0};
    int chat = 0, stream = 0, json = 0, ignore_eos = 0, max_tokens = 0, top_k = 0, logprobs = -1;
    int has_temp = 0, has_top_p = 0, has_top_k = 0, has_seed = 0;
    const opt_spec specs[] = {
        {.name = "--prompt", .alias = "-p", .kind = OPT_STR, .arg = "TEXT", .help = "the prompt (required)", .dest = &p.prompt, .empty_ok = true},
        {.name = "--chat", .kind = OPT_FLAG, .help = "the prompt is one user message of a chat", .dest = &chat},
        {.name = "--max-tokens", .alias = "-n", .kind = OPT_INT, .arg = "N", .def = "the server's",
         .help = "tokens to generate at most", .dest = &max_tokens, .lo = 1, .hi = 2147483647.0},
        {.name = "--temp", .kind = OPT_FLOAT, .arg = "T", .def = "the server's", .help = "temperature (0: greedy)",
         .dest = &p.temperature, .lo = 0, .hi = 100, .seen = &has_temp},
        {.name = "--top-p", .kind = OPT_FLOAT, .arg = "P", .def = "the server's", .help = "nucleus sampling",
         .dest = &p.top_p, .lo = 0, .hi = 1, .lo_open = true, .seen = &has_top_p},
        {.name = "--top-k", .kind = OPT_INT, .arg = "K", .def = "the server's", .help = "top-k sampling (0: off)",
         .dest = &top_k, .lo = 0, .hi = 1 << 24, .seen = &has_top_k},
        {.name = "--seed", .kind = OPT_U64, .arg = "S", .def = "random", .help = "sampling seed", .dest = &p.seed,
         .seen = &has_seed},
        {.name = "--stop", .kind = OPT_FN, .arg = "TEXT", .help = "stop string (repeatable, up to 16)", .fn = add_stop,
         .ctx = &stops},
        {.name = "--ignore-eos", .kind = OPT_FLAG, .help = "go on past end-of-generation tokens", .dest = &ignore_eos},
        {.name = "--logprobs", .kind = OPT_INT, .arg = "N", .def = "none", .help = "log-probabilities of N alternatives",
         .dest = &logprobs, .lo = 0, .hi = 20},
        {.name = "--stream", .kind = OPT_FLAG, .help = "print tokens as they come", .dest = &stream},
        {.name = "--json", .kind = OPT_FLAG, .help = "JSON lines: one a token, then the result", .dest = &json},
    };
    const opt_table tab = {"generate options", specs, sizeof specs / sizeof *specs};
    int st = opts_command("mlaserve client generate", "usage: mlaserve client [...] generate -p TEXT [options]\n", &tab,
                          1, argc, argv, NULL, 0, NULL);
    if (st >= 0) return st;
    p.chat = chat;
    o.stream = stream;
    o.json = json;
    p.ignore_eos = ignore_eos;
    if (max_tokens) p.max_tokens = max_tokens;
    p.has_temperature = has_temp;
    p.has_top_p = has_top_p;
    p.has_top_k = has_top_k;
    p.top_k = top_k;
    p.has_seed = has_seed;
    if (logprobs >= 0) {
        p.logprobs = true;
        p.top_logprobs = (uint32_t)logprobs;
    }
    const char **stop_v = stops.v;
    size_t n_stop = stops.n;
    if (!p.prompt) {
        fprintf(stderr, "mlaserve client generate: -p TEXT is required\n");
        return 2;
    }
    if (!c) return -1;
    p.stop = stop_v;
    p.n_stop = n_stop;
    apiclient_gen_result res;
    mla_err err = {{0}};
    if (apiclient_generate(c, &p, on_token, &o, &res, &err) != MLA_OK) {
        if (o.stream && !o.json) printf("\n");
        fprintf(stderr, "mlaserve client: %s\n", err.msg);
        return 1;
    }
    if (o.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "finish_reason", res.finish_reason);
        cJSON_AddStringToObject(j, "text", res.text);
        cJSON *u = cJSON_AddObjectToObject(j, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", res.prompt_tokens);
        cJSON_AddNumberToObject(u, "completion_tokens", res.completion_tokens);
        cJSON_AddNumberToObject(u, "total_tokens", (double)res.prompt_tokens + res.completion_tokens);
        char *s = cJSON_PrintUnformatted(j);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(j);
    } else {
        if (o.stream) {
            /* text not attributed to a token (the last frame's rest) */
            if (res.text_len > o.streamed) fwrite(res.text + o.streamed, 1, res.text_len - o.streamed, stdout);
            printf("\n");
        } else {
            printf("%s\n", res.text);
        }
        fprintf(stderr, "[finish_reason %s, prompt_tokens %u, completion_tokens %u]\n", res.finish_reason,
                res.prompt_tokens, res.completion_tokens);
    }
    apiclient_gen_result_free(&res);
    return 0;
}

int cmd_client(int argc, char **argv) {
    const char *host = "127.0.0.1", *key = getenv("MLASERVE_API_KEY");
    const char *tls_ca = NULL;
    int port = -1, timeout_s = 600, tls = 0;
    const opt_spec specs[] = {
        {.name = "--host", .kind = OPT_STR, .arg = "HOST", .def = "127.0.0.1", .help = "the server", .dest = &host},
        {.name = "--port", .kind = OPT_INT, .arg = "PORT", .help = "its gRPC port (serve --proto-port; required)",
         .dest = &port, .lo = 1, .hi = 65535},
        {.name = "--api-key", .kind = OPT_STR, .arg = "KEY", .def = "$MLASERVE_API_KEY, else none",
         .help = "the server's API key", .dest = &key},
        {.name = "--timeout", .kind = OPT_INT, .arg = "S", .def = "600",
         .help = "each call's deadline, seconds (0: none)", .dest = &timeout_s, .lo = 0, .hi = 1 << 21},
        {.name = "--tls", .kind = OPT_FLAG, .help = "TLS (serve --tls-cert/--tls-key)", .dest = &tls},
        {.name = "--tls-ca", .kind = OPT_STR, .arg = "FILE", .def = "the system's CAs",
         .help = "PEM file of the CA that signed the server's certificate (implies --tls)", .dest = &tls_ca},
        MLA_LOG_LEVEL_OPT_SOLO,
    };
    const opt_table tab = {"options", specs, sizeof specs / sizeof *specs};
    mla_err perr;
    int help = 0, i = argc;
    if (opts_parse(&tab, 1, argc, argv, 1, OPTS_STOP_AT_POSITIONAL, NULL, 0, NULL, &i, &help, &perr)) {
        fprintf(stderr, "mlaserve client: %s (mlaserve client --help lists the options)\n", perr.msg);
        return 2;
    }
    if (help) {
        opts_help(stdout, client_usage, &tab, 1);
        return 0;
    }
    if (i >= argc) {
        fprintf(stderr, "mlaserve client: a command is required (mlaserve client --help)\n");
        return 2;
    }
    const char *cmd = argv[i];
    int sargc = argc - i;
    char **sargv = argv + i;
    if (strcmp(cmd, "generate") && strcmp(cmd, "tokenize") && strcmp(cmd, "health") && strcmp(cmd, "models") &&
        strcmp(cmd, "info")) {
        fprintf(stderr, "mlaserve client: unknown command %s (mlaserve client --help)\n", cmd);
        return 2;
    }
    /* the other commands' options, checked before connecting */
    int no_special = 0, n_pos = 0;
    const char *text[1] = {NULL};
    if (strcmp(cmd, "generate")) {
        const opt_spec tspecs[] = {{.name = "--no-special", .kind = OPT_FLAG,
                                    .help = "add no BOS or other prefix tokens (add_special_tokens false); "
                                            "control tokens' text is still read as those tokens",
                                    .dest = &no_special}};
        const opt_table ttab = {"options", tspecs, strcmp(cmd, "tokenize") ? 0 : 1};
        int st = opts_command(strcmp(cmd, "tokenize") ? "mlaserve client" : "mlaserve client tokenize",
                              "usage: mlaserve client [...] tokenize TEXT [--no-special]\n", &ttab, 1, sargc, sargv,
                              text, strcmp(cmd, "tokenize") ? 0 : 1, &n_pos);
        if (st >= 0) return st;
    } else {
        const int st = do_generate(NULL, sargc, sargv);
        if (st >= 0) return st;
    }
    if (port < 0) {
        fprintf(stderr, "mlaserve client: --port P (1..65535) is required\n");
        return 2;
    }
    if (!strcmp(cmd, "tokenize") && !n_pos) {
        fprintf(stderr, "mlaserve client tokenize: TEXT is required\n");
        return 2;
    }
    mla_err err = {{0}};
    apiclient *c = NULL;
    apiclient_opts co = {.api_key = key, .timeout_ms = timeout_s * 1000, .tls = tls || tls_ca, .tls_ca = tls_ca};
    if (apiclient_connect(&c, host, port, &co, &err) != MLA_OK) {
        fprintf(stderr, "mlaserve client: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    if (!strcmp(cmd, "generate")) {
        rc = do_generate(c, sargc, sargv);
    } else if (!strcmp(cmd, "tokenize")) {
        bool special = !no_special;
        int32_t *ids = NULL;
        size_t n = 0;
        if (apiclient_tokenize(c, text[0], special, &ids, &n, &err) != MLA_OK) {
            fprintf(stderr, "mlaserve client: %s\n", err.msg);
            rc = 1;
        } else {
            for (size_t k = 0; k < n; k++) printf("%s%d", k ? " " : "", ids[k]);
            printf("\n");
        }
        free(ids);
    } else if (!strcmp(cmd, "info")) {
        printf("mlaserve %s (%s) model %s max_message %u\n", apiclient_server_version(c), apiclient_server_build(c),
               apiclient_server_model(c), apiclient_server_max_message(c));
    } else if (!strcmp(cmd, "health")) {
        bool ok = false;
        char status[512];
        if (apiclient_health(c, &ok, status, sizeof(status), &err) != MLA_OK) {
            fprintf(stderr, "mlaserve client: %s\n", err.msg);
            rc = 1;
        } else {
            printf("%s\n", status);
            rc = ok ? 0 : 1;
        }
    } else {
        apiclient_model *m = NULL;
        size_t n = 0;
        if (apiclient_models(c, &m, &n, &err) != MLA_OK) {
            fprintf(stderr, "mlaserve client: %s\n", err.msg);
            rc = 1;
        } else {
            for (size_t k = 0; k < n; k++) {
                if (m[k].max_model_len) printf("%s %u\n", m[k].id, m[k].max_model_len);
                else printf("%s loading\n", m[k].id); /* its context is known once the workers have loaded */
            }
        }
        apiclient_models_free(m, n);
    }
    apiclient_close(c);
    return rc;
}
