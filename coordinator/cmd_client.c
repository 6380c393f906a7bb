/* cmd_client: see cmd_client.h. */
#include "coordinator/cmd_client.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/apiclient.h"
#include "common/mla_err.h"

static int usage(void) {
    fprintf(stderr,
            "usage: mlaserve client [--host H] --port P [--api-key K] [--timeout S] COMMAND\n"
            "  generate -p TEXT [--chat] [-n N] [--temp T] [--top-p P] [--top-k K] [--seed S]\n"
            "           [--stop STR]... [--ignore-eos] [--logprobs N] [--stream] [--json]\n"
            "  tokenize TEXT [--no-special]\n"
            "  health\n"
            "  models\n");
    return 2;
}

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

static bool parse_num(const char *s, double *out) {
    char *end;
    *out = strtod(s, &end);
    return end != s && *end == 0;
}

static int do_generate(apiclient *c, int argc, char **argv) {
    apiclient_gen_params p = {0};
    gen_out o = {0};
    const char *stops[16];
    size_t n_stop = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
        if (!strcmp(a, "--chat")) p.chat = true;
        else if (!strcmp(a, "--stream")) o.stream = true;
        else if (!strcmp(a, "--json")) o.json = true;
        else if (!strcmp(a, "--ignore-eos")) p.ignore_eos = true;
        else if (!v) {
            fprintf(stderr, "mlaserve client generate: %s needs a value (or is unknown)\n", a);
            return usage();
        } else {
            i++;
            if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) p.prompt = v;
            else if ((!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) && parse_num(v, &d) && d >= 1 && d <= INT32_MAX)
                p.max_tokens = (int32_t)d;
            else if (!strcmp(a, "--temp") && parse_num(v, &d)) {
                p.has_temperature = true;
                p.temperature = (float)d;
            } else if (!strcmp(a, "--top-p") && parse_num(v, &d)) {
                p.has_top_p = true;
                p.top_p = (float)d;
            } else if (!strcmp(a, "--top-k") && parse_num(v, &d)) {
                p.has_top_k = true;
                p.top_k = (int32_t)d;
            } else if (!strcmp(a, "--seed")) {
                char *end;
                p.seed = strtoull(v, &end, 10);
                if (end == v || *end) {
                    fprintf(stderr, "mlaserve client generate: bad --seed %s\n", v);
                    return usage();
                }
                p.has_seed = true;
            } else if (!strcmp(a, "--stop") && n_stop < 16) {
                stops[n_stop++] = v;
            } else if (!strcmp(a, "--logprobs") && parse_num(v, &d) && d >= 0 && d <= 20) {
                p.logprobs = true;
                p.top_logprobs = (uint32_t)d;
            } else {
                fprintf(stderr, "mlaserve client generate: bad option %s %s\n", a, v);
                return usage();
            }
        }
    }
    if (!p.prompt) {
        fprintf(stderr, "mlaserve client generate: -p TEXT is required\n");
        return usage();
    }
    p.stop = stops;
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
    int port = -1, timeout_s = 600;
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (a[0] != '-') break;
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "mlaserve client: %s needs a value\n", a);
            return usage();
        }
        i++;
        if (!strcmp(a, "--host")) host = v;
        else if (!strcmp(a, "--port")) port = atoi(v);
        else if (!strcmp(a, "--api-key")) key = v;
        else if (!strcmp(a, "--timeout")) timeout_s = atoi(v);
        else {
            fprintf(stderr, "mlaserve client: unknown option %s\n", a);
            return usage();
        }
    }
    if (i >= argc) {
        fprintf(stderr, "mlaserve client: a command is required\n");
        return usage();
    }
    if (port < 1 || port > 65535 || timeout_s < 0) {
        fprintf(stderr, "mlaserve client: --port P (1..65535) is required\n");
        return usage();
    }
    const char *cmd = argv[i];
    int sargc = argc - i;
    char **sargv = argv + i;
    if (strcmp(cmd, "generate") && strcmp(cmd, "tokenize") && strcmp(cmd, "health") && strcmp(cmd, "models")) {
        fprintf(stderr, "mlaserve client: unknown command %s\n", cmd);
        return usage();
    }
    if (!strcmp(cmd, "tokenize") && sargc < 2) {
        fprintf(stderr, "mlaserve client tokenize: TEXT is required\n");
        return usage();
    }
    mla_err err = {{0}};
    apiclient *c = NULL;
    if (apiclient_connect(&c, host, port, key, timeout_s * 1000, &err) != MLA_OK) {
        fprintf(stderr, "mlaserve client: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    if (!strcmp(cmd, "generate")) {
        rc = do_generate(c, sargc, sargv);
    } else if (!strcmp(cmd, "tokenize")) {
        bool special = !(sargc > 2 && !strcmp(sargv[2], "--no-special"));
        int32_t *ids = NULL;
        size_t n = 0;
        if (apiclient_tokenize(c, sargv[1], special, &ids, &n, &err) != MLA_OK) {
            fprintf(stderr, "mlaserve client: %s\n", err.msg);
            rc = 1;
        } else {
            for (size_t k = 0; k < n; k++) printf("%s%d", k ? " " : "", ids[k]);
            printf("\n");
        }
        free(ids);
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
            for (size_t k = 0; k < n; k++) printf("%s %u\n", m[k].id, m[k].max_model_len);
        }
        apiclient_models_free(m, n);
    }
    apiclient_close(c);
    return rc;
}
