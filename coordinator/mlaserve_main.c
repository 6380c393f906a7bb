/* mlaserve: the front command. Subcommands dispatch to their modules. */
#include <stdio.h>
#include <string.h>

#include "cmd_bench.h"
#include "common/buildinfo.h"
#include "common/mla_switch.h"
#include "common/sig_clean.h"
#include "cmd_client.h"
#include "cmd_mkmodel.h"
#include "cmd_serve.h"
#include "cmds.h"

/* mlaserve env: the table of switches; exit 1 (and the problems on err) when the environment
 * holds a bad or unknown MLA_* variable */
static int cmd_env(FILE *out, FILE *err) {
    mla_switch_print(out);
    if (!mla_switch_dev_build())
        fprintf(out, "(developer switches: none in this build, configured with MLA_DEV_SWITCHES=OFF)\n");
    char swerr[1024];
    if (mla_switch_check(swerr, sizeof swerr)) {
        fprintf(err, "mlaserve env: %s\n", swerr);
        return 1;
    }
    return 0;
}

static int usage(FILE *f) {
    fprintf(f,
            "usage: mlaserve <command> [options]\n"
            "commands:\n"
            "  inspect MODEL.gguf [--tp N] [--json]   describe a model and a tensor-parallel plan\n"
            "  logits -m MODEL --tokens IDS.txt --out OUT.f32 [--threads N]   exact CPU logits\n"
            "         (--tp N: a coordinator + N worker processes, as serving runs; --in-process: threads)\n"
            "  generate -m MODEL -p PROMPT [-n N] [--tp N] [--temp T ...]   generate text\n"
            "  bench -m MODEL [--tp 1,2,4] [--prefill 512,4096] [--batch 1,8,32] [--ctx 1024] [--steps N] ...\n"
            "         throughput of the serving stack: prefill, decode at a batch and context, all-reduce cost\n"
            "         (bench --help lists every option)\n"
            "  serve -m MODEL [--tp N] [--host H] [--port P] [--api-key K] ...   OpenAI-compatible\n"
            "         HTTP server over N worker processes (serve --help lists every option)\n"
            "  client [--host H] --port P [--api-key K] generate -p TEXT | tokenize TEXT | health | models | info\n"
            "         gRPC API client (of serve --proto-port P)\n"
            "  keygen DIR [--client NAME]   CURVE keys for the coordinator <-> worker control plane\n"
            "  mkmodel --family v3|glm5|v2lite|glm47flash -o OUT.gguf [--layers N] [--mix q4k|iq2|iq3] ...\n"
            "         synthetic model at real shapes with random weights (mkmodel --help)\n"
            "  env       the MLA_* switches of this build: type, default, value, meaning (docs/switches.md)\n"
            "  version   this build: version, commit, build type, CUDA architectures (also --version)\n"
            "every command takes --help (each option's meaning and default) and options as `--opt value`\n"
            "or `--opt=value`; those that log (all but env and version) take --log-level LEVEL\n");
    return f == stderr ? 2 : 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage(stderr);
    /* what a command makes for the time it runs (the control socket's folder, an output being
     * written) goes when SIGINT, SIGTERM or SIGHUP ends it; serve drains on the first two instead */
    if (sig_clean_install() != 0) perror("mlaserve: sigaction");
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) return usage(stdout);
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        if (argc == 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
            printf("usage: mlaserve version\n\nThis build: version, commit, build type, CUDA architectures.\n");
            return 0;
        }
        if (argc > 2) {
            fprintf(stderr, "mlaserve version: takes no arguments (%s)\n", argv[2]);
            return 2;
        }
        buildinfo_print(stdout, "mlaserve");
        return 0;
    }
    if (!strcmp(argv[1], "env")) {
        if (argc == 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
            printf("usage: mlaserve env\n\nThe MLA_* environment switches of this build: name, type, default, value "
                   "and meaning (docs/switches.md); exit 1 when one is set to a bad or unknown value.\n");
            return 0;
        }
        if (argc > 2) {
            fprintf(stderr, "mlaserve env: takes no arguments (%s)\n", argv[2]);
            return 2;
        }
        return cmd_env(stdout, stderr);
    }
    char swerr[1024];
    if (mla_switch_check(swerr, sizeof swerr)) { /* a bad or unknown MLA_* variable fails the start */
        fprintf(stderr, "mlaserve: %s\n", swerr);
        return 2;
    }
    if (!strcmp(argv[1], "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(argv[1], "logits")) return cmd_logits(argc - 1, argv + 1);
    if (!strcmp(argv[1], "serve")) return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(argv[1], "keygen")) return cmd_keygen(argc - 1, argv + 1);
    if (!strcmp(argv[1], "client")) return cmd_client(argc - 1, argv + 1);
    if (!strcmp(argv[1], "mkmodel")) return cmd_mkmodel(argc - 1, argv + 1);
    fprintf(stderr, "mlaserve: unknown command '%s'\n", argv[1]);
    return usage(stderr);
}
