/* mlaserve: the front command. Subcommands dispatch to their modules. */
#include <stdio.h>
#include <string.h>

static int usage(FILE *f) {
    fprintf(f,
            "usage: mlaserve <command> [options]\n"
            "commands:\n"
            "  inspect MODEL.gguf [--tp N] [--json]   describe a model and a tensor-parallel plan\n");
    return f == stderr ? 2 : 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage(stderr);
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) return usage(stdout);
    fprintf(stderr, "mlaserve: unknown command '%s'\n", argv[1]);
    return usage(stderr);
}
