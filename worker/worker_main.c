/* mlaserve-worker: one tensor-parallel rank.
 *   mlaserve-worker --coord ENDPOINT --rank R --world T -m MODEL.gguf [--backend cpu|cuda] ...
 * (`mlaserve-worker --help` lists the options.) Registers with the coordinator, attaches the
 * collective, loads its shard, then runs the step plans it receives (worker/wk_run.h). The
 * backend comes from --backend (the coordinator passes its own to the workers it starts), else
 * cuda when this build has CUDA and a device is visible, else cpu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_cpu.h"
#include "engine_cuda.h"
#include "mla_log.h"
#include "wk_run.h"

static const engine_ops *pick(const char *backend, mla_err *err) {
    if (!backend || !*backend) {
        int n = engine_cuda_devices();
        if (n > 0) {
            MLA_INFO("backend: cuda (%d CUDA device(s) visible; --backend cpu for the CPU)", n);
            return &engine_cuda_ops;
        }
        return &engine_cpu_ops;
    }
    if (!strcmp(backend, "cuda")) return &engine_cuda_ops;
    if (!strcmp(backend, "cpu")) return &engine_cpu_ops;
    mla_errf(err, "--backend: unknown backend '%s' (cpu or cuda)", backend);
    return NULL;
}

int main(int argc, char **argv) { return wk_main(argc, argv, pick); }
