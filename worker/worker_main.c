/* mlaserve-worker: one tensor-parallel rank.
 *   mlaserve-worker --coord ENDPOINT --rank R --world T -m MODEL.gguf [--threads N] [--backend cpu|cuda]
 * Registers with the coordinator, attaches the collective, loads its shard, then runs the step
 * plans it receives (worker/wk_run.h). The backend comes from --backend, else MLA_BACKEND in the
 * environment (inherited from the coordinator), else cpu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_cpu.h"
#include "engine_cuda.h"
#include "wk_run.h"

int main(int argc, char **argv) {
    const char *backend = getenv("MLA_BACKEND");
    int n = 0;
    for (int i = 0; i < argc; i++) { /* strip --backend X (wk_parse_args does not know it) */
        if (i > 0 && !strcmp(argv[i], "--backend") && i + 1 < argc) {
            backend = argv[++i];
            continue;
        }
        argv[n++] = argv[i];
    }
    argv[n] = NULL;
    const engine_ops *eng = &engine_cpu_ops;
    if (backend && !strcmp(backend, "cuda")) eng = &engine_cuda_ops;
    else if (backend && *backend && strcmp(backend, "cpu")) {
        fprintf(stderr, "%s: unknown backend '%s' (cpu or cuda)\n", argv[0], backend);
        return 2;
    }
    return wk_main(n, argv, eng);
}
