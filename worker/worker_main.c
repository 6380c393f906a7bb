/* mlaserve-worker: one tensor-parallel rank.
 *   mlaserve-worker --coord ENDPOINT --rank R --world T -m MODEL.gguf [--threads N]
 * Registers with the coordinator, attaches the collective, loads its shard, then runs the step
 * plans it receives (worker/wk_run.h). */
#include "engine_cpu.h"
#include "wk_run.h"

int main(int argc, char **argv) { return wk_main(argc, argv, &engine_cpu_ops); }
