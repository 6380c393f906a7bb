/* mla-test-worker: the real worker runtime (worker/wk_run) with the test engine. */
#include <string.h>

#include "test_engine.h"
#include "wk_run.h"

static const engine_ops *pick(const char *backend, mla_err *err) {
    if (backend && strcmp(backend, "test")) {
        mla_errf(err, "--backend %s: this test worker has the test engine only", backend);
        return NULL;
    }
    return &test_engine_ops;
}

int main(int argc, char **argv) { return wk_main(argc, argv, pick); }
