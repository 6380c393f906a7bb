/* Test driver for coordinator/cmd_serve.c until the lead wires `mlaserve serve` into
 * mlaserve_main.c: the same command under its own binary (argv[0] plays "serve"). */
#include "coordinator/cmd_serve.h"

int main(int argc, char **argv) { return cmd_serve(argc, argv); }
