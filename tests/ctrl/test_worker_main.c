/* mla-test-worker: the real worker runtime (worker/wk_run) with the test engine. */
#include "test_engine.h"
#include "wk_run.h"

int main(int argc, char **argv) { return wk_main(argc, argv, &test_engine_ops); }
