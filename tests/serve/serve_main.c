/* Test driver for coordinator/cmd_serve.c: `mlaserve serve` under its own binary (argv[0] plays
 * "serve"), set up as mlaserve_main.c sets up every command (the signal clean-up of
 * common/sig_clean.h). */
#include <stdio.h>

#include "common/sig_clean.h"
#include "coordinator/cmd_serve.h"

int main(int argc, char **argv) {
    if (sig_clean_install() != 0) perror("mlaserve serve: sigaction");
    return cmd_serve(argc, argv);
}
