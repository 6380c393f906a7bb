/* cmds: the subcommands of the `mlaserve` front command. Each takes argc/argv starting at its
 * own name (argv[0] = "logits") and returns the process exit status. */
#ifndef CMDS_H
#define CMDS_H

#include <stdio.h>

#include "common/mla_err.h"
#include "common/outfile.h"
#include "coordinator/coord.h"

/* mlaserve logits -m MODEL --tokens IDS.txt --out OUT.f32 [--threads N] [--tp N] [--decode-from K]
 *                 [--greedy N --ids-out IDS_OUT.txt]
 * One prompt per line of IDS.txt (space-separated token ids). Writes float32 logits of every
 * position, prompts one after another, [tokens, vocab]. --decode-from K runs the first K
 * tokens of each prompt in one pass and the rest one token at a time (same output).
 * --greedy N also continues each prompt greedily for up to N tokens (stopping after EOS) and
 * writes the generated ids, one line per prompt, to --ids-out. --tp N runs N tensor-parallel
 * ranks (threads of this process joined by the host collective); rank 0 writes the files. */
int cmd_logits(int argc, char **argv);

/* What `logits` writes: the files and the decode options above. */
typedef struct logits_opts {
    const char *tokens, *out, *ids_out;
    long decode_from, greedy;
    long chunk, prefix_reuse; /* worker processes only: coordinator/coord_cmd.c seq_mode */
} logits_opts;

/* The files `logits` writes, open: --out and --ids-out (f NULL when not asked for). A file is
 * written whole or not at all (common/outfile.h): into a temporary file beside it, renamed over it
 * when the run succeeds, removed when it fails or a signal ends it; a path that is not a regular
 * file (/dev/stdout, a pipe) is written in place. */
typedef struct logits_one {
    FILE *f;
    outfile o;
} logits_one;
typedef struct logits_files {
    logits_one out, ids;
} logits_files;

/* Opens lo->out and lo->ids_out as above. MLA_ERR with "PATH: reason" (what it opened is removed
 * again). */
int logits_files_open(logits_files *f, const logits_opts *lo, mla_err *err);
/* Closes them: renamed into place when status is 0, else removed. Returns status, or 1 when status
 * was 0 and a close or rename failed (reported on stderr; nothing of the run is left). f is
 * zeroed. */
int logits_files_close(logits_files *f, int status);

/* The same command through a coordinator and N worker processes (coordinator/coord_cmd.c):
 * cmd_logits hands over for --tp N > 1 (without --in-process), --processes, --workers-external
 * or --backend. Same output format. */
int cmd_logits_tp(const coord_group_opts *o, const logits_opts *lo);

/* mlaserve generate -m MODEL -p PROMPT [-n N] [--tp N] [sampling options]: tokenizes the prompt,
 * generates through the coordinator and the workers, prints the text (coordinator/coord_cmd.c). */
int cmd_generate(int argc, char **argv);

/* mlaserve inspect MODEL.gguf [--tp N] [--json] (coordinator/cmd_inspect.c): architecture,
 * hyperparameters and assumed defaults, tokenizer and chat template, tensors by role, and the
 * tensor-parallel plan for N ranks. Exit 0 when the plan is valid, 3 when not. */
int cmd_inspect(int argc, char **argv);

/* mlaserve keygen DIR [--client NAME] [--force] (coordinator/cmd_keygen.c): CURVE key pairs for
 * the coordinator <-> worker control plane. */
int cmd_keygen(int argc, char **argv);

#endif
